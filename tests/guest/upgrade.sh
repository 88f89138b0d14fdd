#!/usr/bin/env bash
# Description: vblkd upgraded in place (vblkctl upgrade) three times in a
# row, and once more with a binary that fails, while a TCG Linux guest
# runs a fio crc32c verify job (randwrite, QD32) on it; 1 and 2 queues on
# a raw disk, and 1 queue on a LUKS2 disk (4096-byte sectors) whose key
# file is gone once vblkd has started: each new process takes the volume
# key over the handover socket, the passphrase is read once.
# QEMU runs without reconnect=1: a disconnect would fail the disk.  Checks
# zero verify errors, one vhost-user connection in all, no vhost-user error
# from QEMU, and reports the guest's largest I/O latency.
# Prints PASS:/FAIL: lines for tests/run.
#
# bench/upgrade drives it with these (defaults: the test's):
#   VBLK_UPGRADE_MODE     upgrade (in place), restart (SIGTERM and start a
#                         new vblkd; QEMU reconnect=1: the old way) or none
#   VBLK_UPGRADE_CASES    "raw:1 raw:2 luks:1" (disk:queues)
#   VBLK_UPGRADE_BROKEN   1: also an upgrade with a failing binary
#   VBLK_UPGRADE_RESULTS  append one JSON line per boot to this file
#   VBLK_UPGRADE_TAG      log name prefix
set -uo pipefail
VBLKD=${1:?usage: upgrade.sh PATH/TO/vblkd}
CTL=$(dirname "$VBLKD")/vblkctl
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
set +e
gb="$VBLK_REPO_ROOT/build/guest"
work=$(mktemp -d /tmp/vblk-upgrade.XXXXXX)
logs="$VBLK_REPO_ROOT/build/test-logs/upgrade"
mkdir -p "$logs"
pids=() gpid=""
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    [[ -n $gpid ]] && kill "$gpid" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }
gone() { [[ ! -e /proc/$1/stat ]] || [[ $(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) == Z ]]; }

guest_deps || { fail guest-deps; exit 1; }
guest_build_initramfs "$gb" || { fail guest-initramfs; exit 1; }
guest_initrd "$here/scenarios/upgrade.sh" "$work/u.initrd" "$gb" || { fail initrd; exit 1; }

mode=${VBLK_UPGRADE_MODE:-upgrade}
broken=${VBLK_UPGRADE_BROKEN:-1}
[[ $mode == upgrade ]] || broken=0
key=()
start() {	# start Q LOG: a vblkd, appending to LOG; waits for its sockets
    rm -f "$work/s.sock" "$work/c.sock"
    "$VBLKD" --socket "$work/s.sock" --disk "$work/disk.img" --queues "$1" \
        --control "$work/c.sock" "${key[@]}" >>"$2" 2>&1 &
    pids+=($!)
    cur=$!
    for _ in $(seq 100); do [[ -S $work/c.sock ]] && return 0; sleep 0.05; done
    return 1
}

pw="upgrade passphrase $RANDOM$RANDOM"
for case in ${VBLK_UPGRADE_CASES:-raw:1 raw:2 luks:1}; do
    disk=${case%%:*} q=${case#*:}
    name="${VBLK_UPGRADE_TAG:-upgrade}-${q}q"
    [[ $disk == raw ]] || name+="-$disk"
    log="$logs/$name.vblkd.log"
    : >"$log"
    rm -f "$work/disk.img"
    truncate -s 320M "$work/disk.img"
    key=()
    if [[ $disk == luks ]]; then
        if ! command -v cryptsetup >/dev/null ||
           (($(ldd "$VBLKD" | grep -c libcryptsetup) == 0)); then
            echo "SKIP: $name (no cryptsetup, or vblkd built without LUKS)"; continue
        fi
        printf '%s' "$pw" >"$work/key"
        cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
            --key-file "$work/key" "$work/disk.img"
        key=(--key-file "$work/key")
    fi
    start "$q" "$log" || { fail "$name" "vblkd did not start"; continue; }
    # Whatever needs the passphrase after this point has lost.
    rm -f "$work/key"
    first=$cur
    [[ $mode == restart ]] && chardev=",reconnect=1" || chardev=""
    VBLK_GUEST_CHARDEV_OPTS=$chardev \
        guest_boot "$work/s.sock" "$q" "$work/u.initrd" "$logs/$name.console.log" 500 &
    gpid=$!
    if ! guest_wait_log "$logs/$name.console.log" "upgrade fio start" 120 "$gpid"; then
        fail "$name" "guest never started fio (see $logs/$name.console.log)"
        kill "$gpid" 2>/dev/null; wait "$gpid"; gpid=""; continue
    fi
    sleep 1
    ups=0 pauses=""
    events=("" "" "")
    ((broken)) && events=("" "" /bin/false "")
    for exe in "${events[@]}"; do
        if [[ $mode == none ]]; then
            sleep 1.2; continue
        elif [[ $mode == restart ]]; then
            old=$cur
            kill -TERM "$old"
            for _ in $(seq 200); do gone "$old" && break; sleep 0.01; done
            start "$q" "$log" && ups=$((ups + 1))
            sleep 1.2; continue
        fi
        if "$CTL" --control "$work/c.sock" upgrade ${exe:+--exec "$exe"} >"$work/up.out" 2>&1; then
            p=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$work/up.out")
            pids+=("$p")
            pauses+=" $(grep -o 'paused for [0-9]* us' "$work/up.out" | grep -o '[0-9]*')"
            # The old process exits at once; on a loaded machine that
            # can take longer than a moment.
            for _ in $(seq 200); do gone "$cur" && break; sleep 0.01; done
            gone "$cur" && [[ -z $exe ]] && ups=$((ups + 1))
            cur=$p
        elif [[ -n $exe ]] && ! gone "$cur"; then
            pass "$name-broken-binary-old-serves-on"
        else
            fail "$name-upgrade" "$(cat "$work/up.out")"
        fi
        sleep 1.2
    done
    echo "  ($name: rings paused (us):$pauses)"
    wait "$gpid"; rc=$?; gpid=""
    if [[ $mode != none ]]; then
        ((ups == 3)) && pass "$name-three-${mode}s" || fail "$name-three-${mode}s" "$ups of 3"
    fi
    if ((rc == 0)) && guest_log_result "$logs/$name.console.log" upgrade; then
        pass "$name-fio-verify-clean"
        clean=true
    else
        fail "$name-fio-verify-clean" "rc=$rc, see $logs/$name.console.log"
        clean=false
    fi
    if [[ $disk == luks ]]; then
        if (($(grep -c "format: LUKS2" "$log") >= 1)) && ! grep -qF -- "$pw" "$log" &&
           ! grep -q "key file\|passphrase" "$log"; then
            pass "$name-key-read-once-never-logged"
        else
            fail "$name-key-read-once-never-logged" "$(grep -i 'key\|format' "$log" | head -3)"
        fi
    fi
    if [[ $mode == upgrade ]]; then
        n=$(grep -c "frontend connected" "$log")
        ((n == 1)) && pass "$name-no-reconnect" || fail "$name-no-reconnect" "$n connections"
        # QEMU's own messages (e.g. "Unexpected end-of-file" when a
        # backend goes away) start with its name; the guest's never do.
        if tr -d '\r' <"$logs/$name.console.log" | grep -a '^qemu-system' >"$work/qerr"; then
            fail "$name-qemu-saw-nothing" "$(head -2 "$work/qerr")"
        else
            pass "$name-qemu-saw-nothing"
        fi
    fi
    max=$(grep -a "VBLK-LAT: lat" "$logs/$name.console.log" | tr -d '\r' | python3 -c "
import re, sys
m = 0
for l in sys.stdin:
    g = re.search(r'lat \((\w+)\): min=\s*[\d.]+[kM]?, max=\s*([\d.]+)([kM]?)', l)
    if g:
        v = float(g.group(2)) * {'': 1, 'k': 1e3, 'M': 1e6}[g.group(3)]
        m = max(m, v * {'nsec': 1e-6, 'usec': 1e-3, 'msec': 1}[g.group(1)])
print('%.1f' % m)")
    echo "  ($name: the guest's largest I/O latency across the ${mode}s: $max ms)"
    if [[ -n ${VBLK_UPGRADE_RESULTS:-} ]]; then
        echo "{\"mode\": \"$mode\", \"queues\": $q, \"events\": $ups, \"max_lat_ms\": $max, \"clean\": $clean, \"pauses_us\": [$(echo $pauses | tr ' ' ',')]}" \
            >>"$VBLK_UPGRADE_RESULTS"
    fi
    kill -TERM "$cur" 2>/dev/null
    for _ in $(seq 100); do gone "$cur" && break; sleep 0.05; done
done
exit 0
