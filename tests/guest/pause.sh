#!/usr/bin/env bash
# Description: the error policy under a real guest (QEMU TCG, the guest's
# virtio_blk, fio crc32c verify jobs; scenarios/pause.sh).
#  1. A thin image on a small tmpfs fills up: vblkd (default --werror
#     enospc) pauses: metric 1, one log line, requests held, and the guest
#     sees no error; vblkd is upgraded in place while paused (the new
#     process is paused too; QEMU's in-flight region carries the held
#     requests); the tmpfs grows; vblkctl resume: the job finishes, verify
#     clean.  Then vblkd is stopped and started again with
#     --error-retry-s 1 (QEMU reconnects) with the tmpfs nearly full: the
#     second job fills it, vblkd pauses, room is made, and vblkd resumes by
#     itself; verify clean.  No I/O error in the guest's kernel log.
#  2. An NBD disk (qemu-nbd) with --rerror stop --werror stop: the server
#     is killed under the verify job and started again 20 s later; vblkd
#     pauses, reconnects, is resumed: no I/O error in the guest, verify
#     clean.
# Needs root (mounts a tmpfs).  Prints PASS:/FAIL:/SKIP: lines.
set -uo pipefail
VBLKD=${1:?usage: pause.sh PATH/TO/vblkd}
CTL=$(dirname "$VBLKD")/vblkctl
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
set +e
gb="$VBLK_REPO_ROOT/build/guest"
work=$(mktemp -d /tmp/vblk-gpause.XXXXXX)
logs="$VBLK_REPO_ROOT/build/test-logs/guest-pause"
mkdir -p "$logs" "$work/fs"
dpid="" gpid="" npid=""
cleanup() {
    for p in $dpid $gpid $npid; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    for _ in $(seq 50); do
        mountpoint -q "$work/fs" || break
        umount "$work/fs" 2>/dev/null || sleep 0.1
    done
    rm -rf "$work"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: guest-pause (needs root to mount a small tmpfs)"; exit 0
fi
guest_deps || { fail guest-deps; exit 1; }
guest_build_initramfs "$gb" || { fail guest-initramfs; exit 1; }
guest_initrd "$here/scenarios/pause.sh" "$work/p.initrd" "$gb" || { fail initrd; exit 1; }

ctl() { "$CTL" --control "$work/c.sock" "$@"; }
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2]))" "$1" "$2"; }
wait_state() {	# wait_state STATE SECONDS
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [[ $(field "$(ctl status 2>/dev/null || echo '{}')" state) == "$1" ]] && return 0
        sleep 0.1
    done
    return 1
}
wait_for() {	# wait_for FILE PATTERN SECONDS
    for _ in $(seq $(($3 * 10))); do
        guest_log_has "$1" "$2" && return 0
        sleep 0.1
    done
    return 1
}
start() {	# start LOG DISK ARGS...: vblkd on the shared socket
    local log=$1 disk=$2
    shift 2
    rm -f "$work/c.sock"
    "$VBLKD" --socket "$work/s.sock" --disk "$disk" --control "$work/c.sock" "$@" \
        >>"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 200); do
        [[ -S $work/c.sock ]] && grep -q serving "$log" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}
results() {	# results PREFIX CONSOLE RC: the scenario's verdicts
    local t
    for t in pause-phase1-fio-verify pause-phase2-fio-verify pause-no-io-error-in-guest; do
        if (($3 == 0)) && guest_log_has "$2" "VBLK-RESULT: PASS $t"; then
            pass "$1-$t"
        else
            fail "$1-$t" "rc=$3, see $2"
        fi
    done
}
stop_vblkd() {	# an upgraded vblkd is not our child: wait by its pid
    kill -TERM "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null
    for _ in $(seq 200); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.05; done
    dpid=""
}

# ---- 1. A file system that fills up ----
log="$logs/enospc.vblkd.log" con="$logs/enospc.console.log"
: >"$log"
rm -f "$con"
mount -t tmpfs -o size=24M vblk-gpause "$work/fs" && truncate -s 128M "$work/fs/disk.img" &&
start "$log" "$work/fs/disk.img" || { fail enospc-setup "$(tail -3 "$log")"; exit 1; }
VBLK_GUEST_CHARDEV_OPTS=",reconnect=1" \
    guest_boot "$work/s.sock" 1 "$work/p.initrd" "$con" 600 &
gpid=$!
if ! wait_for "$con" "pause phase1 fio start" 120; then
    fail guest-enospc "guest never started fio (see $con)"
elif ! wait_state paused 180; then
    fail guest-enospc-pauses "not paused: $(ctl status) (see $log)"
else
    st=$(ctl status)
    m=$(ctl metrics)
    if [[ $(field "$st" reason) == *"No space left on device"* ]] &&
       (($(field "$st" held_requests) > 0)) && grep -qx 'vblkd_disk_paused 1' <<<"$m" &&
       (($(grep -c ' paused: No space left on device' "$log") == 1)); then
        pass guest-enospc-pauses
    else
        fail guest-enospc-pauses "$st $(grep -c ' paused:' "$log") log lines"
    fi
    rep=$(ctl upgrade)
    if [[ $(field "$rep" ok) == True ]]; then
        dpid=$(field "$rep" pid)
        if wait_state paused 10 && grep -q 'left in flight in the in-flight region' "$log"; then
            pass guest-paused-across-upgrade
        else
            fail guest-paused-across-upgrade "$(ctl status)"
        fi
    else
        fail guest-paused-across-upgrade "upgrade refused: $rep"
    fi
    mount -o remount,size=200M "$work/fs"
    rep=$(ctl resume)
    [[ $(field "$rep" ok) == True ]] && pass guest-resume || fail guest-resume "$rep"
    if wait_for "$con" "pause phase1 done" 300; then
        # Phase 2: a vblkd started anew, retrying by itself; the tmpfs
        # nearly full again.
        stop_vblkd
        avail=$(df --output=avail -B1 "$work/fs" | tail -1)
        fallocate -l $((avail - (6 << 20))) "$work/fs/filler"
        if start "$log" "$work/fs/disk.img" --error-retry-s 1 && wait_state paused 180; then
            sleep 2
            rm -f "$work/fs/filler"
            if wait_state running 10 && grep -q 'retrying the held requests' "$log"; then
                pass guest-retry-resumes-by-itself
            else
                fail guest-retry-resumes-by-itself "$(ctl status)"
            fi
        else
            fail guest-retry-resumes-by-itself "the restarted vblkd did not pause: $(ctl status)"
            rm -f "$work/fs/filler"
        fi
    else
        fail guest-resume "phase 1 never ended (see $con)"
    fi
fi
wait "$gpid"; rc=$?; gpid=""
stop_vblkd
results guest "$con" "$rc"
for _ in $(seq 50); do	# io_uring lets go of its files a moment after exit
    umount "$work/fs" 2>/dev/null && break
    sleep 0.1
done

# ---- 2. An NBD server that goes away for 20 s ----
log="$logs/nbd.vblkd.log" con="$logs/nbd.console.log"
: >"$log"
rm -f "$con"
truncate -s 128M "$work/nbd.img"
nbd() {
    rm -f "$work/qnbd.sock"
    qemu-nbd -f raw -x exp --persistent -k "$work/qnbd.sock" "$work/nbd.img" \
        >>"$logs/qemu-nbd.log" 2>&1 &
    npid=$!
    for _ in $(seq 100); do [[ -S $work/qnbd.sock ]] && return 0; sleep 0.05; done
    return 1
}
nbd && start "$log" "nbd+unix:///exp?socket=$work/qnbd.sock" --rerror stop --werror stop ||
    { fail nbd-setup "$(tail -3 "$log")"; exit 1; }
VBLK_GUEST_CHARDEV_OPTS=",reconnect=1" \
    guest_boot "$work/s.sock" 1 "$work/p.initrd" "$con" 600 &
gpid=$!
if wait_for "$con" "pause phase1 fio start" 120; then
    sleep 2
    kill -9 "$npid"; wait "$npid" 2>/dev/null; npid=""
    if wait_state paused 30; then pass guest-nbd-outage-pauses; else
        fail guest-nbd-outage-pauses "$(ctl status)"; fi
    sleep 20
    nbd || fail guest-nbd-restart
    # vblkd reconnects in the background; resume once it has.
    for _ in $(seq 100); do grep -q 'connected again' "$log" && break; sleep 0.2; done
    rep=$(ctl resume)
    sleep 1
    if wait_state running 10; then pass guest-nbd-resumed; else
        fail guest-nbd-resumed "$rep $(ctl status)"; fi
else
    fail guest-nbd "guest never started fio (see $con)"
fi
wait "$gpid"; rc=$?; gpid=""
stop_vblkd
results guest-nbd "$con" "$rc"
