#!/usr/bin/env bash
# Description: pull-mode backup under a guest (issue 46).  One TCG guest
# writes two disks for ~100 s (fio verify rounds, discards, write zeroes,
# writes; scenarios/backup.sh), a raw one and a qcow2 one, each served by
# its own vblkd with a persistent bitmap B (the raw disk's in its bitmap
# file) and a writable NBD export.  At each checkpoint the VM is stopped
# for a moment (QMP stop: the rings stop, what was in flight completes),
# each disk is copied over NBD as the reference of that instant, a backup
# is started (the instant), the VM goes on, and the backup is pulled while
# the guest writes: first a full one by nbdcopy (default options: it
# trusts the view's block status), then incrementals (only the extents of
# the view's qemu:dirty-bitmap:B, applied over the previous restore).
# Each restore must equal its reference (cmp).  Then 5 times: both vblkds
# killed with SIGKILL under the writes and started again, QEMU reconnects,
# and the next incremental still restores to the disk: the persistent
# bitmap lost no change.  The guest's verify must pass throughout.
# Prints PASS:/FAIL: lines for tests/run.
set -uo pipefail
VBLKD=${1:?usage: backup.sh PATH/TO/vblkd}
CTL=$(dirname "$VBLKD")/vblkctl
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
set +e
gb="$VBLK_REPO_ROOT/build/guest"
work=$(mktemp -d /tmp/vblk-gbackup.XXXXXX)
logs="$VBLK_REPO_ROOT/build/test-logs/guest-backup"
mkdir -p "$logs"
declare -A dpid=()
gpid=""
cleanup() {
    for p in "${dpid[@]}" $gpid; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

PY=/usr/bin/python3
$PY -c 'import nbd' 2>/dev/null || { fail "backup-deps" "no python3-libnbd (scripts/deps.sh)"; exit 1; }
guest_deps || { fail guest-deps; exit 1; }
guest_build_initramfs "$gb" || { fail guest-initramfs; exit 1; }
guest_initrd "$here/scenarios/backup.sh" "$work/b.initrd" "$gb" || { fail initrd; exit 1; }

disks=(raw qcow2)
img() { echo "$work/disk.$1"; }
ctl() { local d=$1; shift; "$CTL" --control "$work/$d.ctl" "$@"; }
rw() { echo "nbd+unix:///?socket=$work/$1.rw"; }
view() { echo "nbd+unix:///$2?socket=$work/$1.view"; }
start() {	# start DISK: its vblkd on its vhost-user socket, NBD export, control
    local d=$1 log=$logs/$1.vblkd.log
    rm -f "$work/$d.ctl" "$work/$d.rw"
    "$VBLKD" --socket "$work/$d.sock" --disk "$(img "$d")" --nbd "unix:$work/$d.rw" \
        --control "$work/$d.ctl" >>"$log" 2>&1 &
    dpid[$d]=$!
    for _ in $(seq 200); do
        [[ -S $work/$d.ctl ]] && grep -q serving "$log" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}
connected() { grep -c "frontend connected" "$logs/$1.vblkd.log"; }

for d in "${disks[@]}"; do
    : >"$logs/$d.vblkd.log"
    head -c 64M /dev/urandom >"$work/seed"
    truncate -s 256M "$work/seed"
    if [[ $d == raw ]]; then cp "$work/seed" "$(img raw)"; else
        qemu-img convert -q -f raw -O qcow2 "$work/seed" "$(img qcow2)"; fi
    start "$d" || { fail "backup-$d-start" "$(tail -3 "$logs/$d.vblkd.log")"; exit 1; }
    ctl "$d" bitmap add B --persistent >/dev/null || { fail "backup-$d-bitmap-add"; exit 1; }
done
rm -f "$work/seed"

qmp=$work/qmp.sock
VBLK_GUEST_CHARDEV_OPTS=",reconnect=1" \
VBLK_GUEST_EXTRA_DISKS="-chardev socket,id=c1,path=$work/qcow2.sock,reconnect=1 -device vhost-user-blk-pci,chardev=c1,num-queues=1" \
    guest_qemu_start "$work/raw.sock" 1 "$work/b.initrd" "$logs/console.log" 600 \
    -qmp "unix:$qmp,server=on,wait=off"
gpid=$VBLK_GUEST_QEMU_PID
if ! guest_wait_log "$logs/console.log" "backup fio start" 180 "$gpid"; then
    fail "backup-guest-starts" "see $logs/console.log"; exit 1
fi

# checkpoint NAME full|inc: the VM stopped a moment, each disk's reference
# copied and its backup started; then pulled while the guest writes, and
# compared.  Returns 1 if a restore differs.
bad=""
checkpoint() {
    local name=$1 kind=$2 d
    guest_qmp "$qmp" stop >/dev/null || { bad+=" $name:stop"; return 1; }
    for d in "${disks[@]}"; do
        nbdcopy "$(rw "$d")" "$work/$d.ref" || bad+=" $name:$d:ref"
        ctl "$d" backup start "$name" --nbd "unix:$work/$d.view" --bitmap B >/dev/null ||
            bad+=" $name:$d:start"
    done
    guest_qmp "$qmp" cont >/dev/null || bad+=" $name:cont"
    sleep 1	# the guest writes into the backup's chunks
    for d in "${disks[@]}"; do
        if [[ $kind == full ]]; then
            nbdcopy "$(view "$d" "$name")" "$work/$d.restore" || bad+=" $name:$d:pull"
        else
            $PY "$VBLK_REPO_ROOT/tests/format/backup_pull.py" "$(view "$d" "$name")" \
                "$work/$d.restore" --bitmap B >"$work/$d.$name.pull" || bad+=" $name:$d:pull"
        fi
        ctl "$d" backup list >"$logs/$d.$name.list"
        ctl "$d" backup finish "$name" >/dev/null || bad+=" $name:$d:finish"
        cmp -s "$work/$d.restore" "$work/$d.ref" || bad+=" $name:$d:differs"
    done
}

checkpoint full full
saved=$(for d in "${disks[@]}"; do $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["backups"][0]["saved_chunks"])' "$logs/$d.full.list"; done | paste -sd/)
checkpoint inc1 inc
checkpoint inc2 inc
if [[ -z $bad ]]; then
    pass "backup-full-and-incrementals-under-guest-writes-restore-each-instant (raw and qcow2; chunks kept before guest writes during the full: $saved)"
else
    fail "backup-full-and-incrementals-under-guest-writes-restore-each-instant" "$bad"
fi

# kill -9 under the writes, 5 times; QEMU reconnects; the next
# incremental restores.
bad="" kills=0
for i in 1 2 3 4 5; do
    kill -0 "$gpid" 2>/dev/null || break
    declare -A before=()
    for d in "${disks[@]}"; do
        before[$d]=$(connected "$d")
        kill -9 "${dpid[$d]}"; wait "${dpid[$d]}" 2>/dev/null
    done
    kills=$((kills + 1))
    sleep 0.3
    for d in "${disks[@]}"; do start "$d" || bad+=" kill$i:$d:restart"; done
    for d in "${disks[@]}"; do
        for _ in $(seq 100); do (($(connected "$d") > before[$d])) && break; sleep 0.1; done
    done
    sleep 0.5
    checkpoint "crash$i" inc
done
read_mb=$(cat "$work"/*.crash*.pull 2>/dev/null | awk '{ s += $2 } END { printf "%.1f", s / 1048576 }')
if [[ -z $bad ]] && ((kills == 5)); then
    pass "backup-incremental-after-each-of-5-kill9-restores-the-disk (QEMU reconnected each time; the 10 incrementals read $read_mb MiB of 2560)"
else
    fail "backup-incremental-after-each-of-5-kill9-restores-the-disk" "kills $kills:$bad"
fi

wait "$gpid"; rc=$?; gpid=""
if ((rc == 0)) && guest_log_result "$logs/console.log" backup; then
    pass "backup-guest-verify-clean-throughout ($(tr -d '\r' <"$logs/console.log" | grep -ao 'rounds=[0-9]*' | tail -1))"
else
    fail "backup-guest-verify-clean-throughout" "rc=$rc, see $logs/console.log"
fi
for d in "${disks[@]}"; do
    kill -TERM "${dpid[$d]}" 2>/dev/null; wait "${dpid[$d]}"
    r=$?
    ((r == 0)) || fail "backup-$d-vblkd-exits-cleanly" "rc=$r"
done
dpid=()
c=$(qemu-img check --output=json "$(img qcow2)" 2>/dev/null |
    $PY -c 'import json,sys; print(json.load(sys.stdin).get("corruptions", 0))')
[[ $c == 0 ]] && pass "backup-qcow2-no-corruption-after-kills" ||
    fail "backup-qcow2-no-corruption-after-kills" "$c"
