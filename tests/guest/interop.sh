#!/usr/bin/env bash
# Description: a real Linux guest (QEMU TCG, Debian kernel, virtio_blk)
# uses vblkd as its disk: fio with crc32c verification on 1 and 2 queues,
# the disk grown under the running guest (vblkctl resize: the guest sees
# the new size at once and writes past the old end), data persisting past
# the daemon's exit, a read-only export that
# refuses writes and leaves the image untouched, and polled I/O both ways
# (a guest driver polling vblkd's poll queue; vblkd itself, run in the
# guest, polling the guest's poll queue with --iopoll).  Passes only on what the
# guest printed and what the host finds in the image afterwards.
# Prints PASS:/FAIL: lines for tests/run.
set -uo pipefail
VBLKD=${1:?usage: interop.sh PATH/TO/vblkd}
VBLKCTL=$(dirname "$VBLKD")/vblkctl
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
set +e

gb="$VBLK_REPO_ROOT/build/guest"
work=$(mktemp -d /tmp/vblk-guest.XXXXXX)
logs="$VBLK_REPO_ROOT/build/test-logs/guest"
mkdir -p "$logs"
dpid="" qpid=""
cleanup() {
    [[ -n $qpid ]] && kill "$qpid" 2>/dev/null
    [[ -n $dpid ]] && kill "$dpid" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

guest_deps || { fail guest-deps "cannot install the guest packages"; exit 1; }
guest_build_initramfs "$gb" || { fail guest-initramfs "cannot build the initramfs"; exit 1; }

# daemon_start NAME ARGS...: vblkd on $work/NAME.sock, log in $logs/NAME.vblkd.log
daemon_start() {
    local name=$1; shift
    local log="$logs/$name.vblkd.log"
    "$VBLKD" --socket "$work/$name.sock" "$@" >"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do
        grep -q serving "$log" 2>/dev/null && return 0
        kill -0 "$dpid" 2>/dev/null || break
        sleep 0.05
    done
    fail "$name" "vblkd did not start: $(tail -3 "$log")"
    return 1
}

# daemon_stop NAME: SIGTERM, expect exit status 0.
daemon_stop() {
    local name=$1 rc=0
    kill -TERM "$dpid" 2>/dev/null
    wait "$dpid" || rc=$?
    dpid=""
    if ((rc != 0)); then
        fail "$name-daemon-exit" "vblkd exited with status $rc"
        return 1
    fi
}

# queue_requests NAME Q: requests served by queue Q (the daemon logs its
# counters as JSON when it exits).
queue_requests() {
    python3 - "$logs/$1.vblkd.log" "$2" <<'PY'
import json, sys
stats = [l.split("stats ", 1)[1] for l in open(sys.argv[1]) if " stats {" in l]
print(json.loads(stats[-1])["queues"][int(sys.argv[2])]["requests"] if stats else "")
PY
}

# boot NAME NUMQ SCENARIO: boot the guest against NAME's socket.
boot() {
    local name=$1 numq=$2 scn=$3 t0=$SECONDS
    guest_initrd "$scn" "$work/$name.initrd" "$gb" || return 1
    guest_boot "$work/$name.sock" "$numq" "$work/$name.initrd" "$logs/$name.console.log" 300
    local rc=$?
    echo "  ($name: guest ran $((SECONDS - t0)) s)"
    guest_log_lines "$logs/$name.console.log" "VBLK-IRQ:" | sed 's/^/  /'
    return $rc
}

# The pattern fill.sh writes: 5a 5b 5c 5d over the first MiB.
pattern_ok() {
    python3 - "$1" <<'PY'
import sys
with open(sys.argv[1], 'rb') as f:
    data = f.read(1 << 20)
sys.exit(0 if data == bytes([0x5a, 0x5b, 0x5c, 0x5d]) * (1 << 18) else 1)
PY
}

# 1. One queue, packed rings: fio verify; then the disk grows from 256 to 320 MiB under
#    the running guest (vblkctl resize when the guest says it is ready): the
#    guest must see the new size without a reboot (CONFIG_CHANGE_MSG on the
#    backend channel, QEMU re-reads the config and interrupts the guest)
#    and write and verify 1 MiB past the old end, which the host then finds
#    in the grown image.
truncate -s 256M "$work/q1.img"
{
    echo '#!/bin/sh'
    echo '('; cat "$here/scenarios/fio-verify.sh"; echo ')'
    echo '('; cat "$here/scenarios/resize.sh"; echo ')'
} >"$work/verify-resize.sh"
if daemon_start q1 --disk "$work/q1.img" --queues 1 --control "$work/q1.ctl" &&
   guest_initrd "$work/verify-resize.sh" "$work/q1.initrd" "$gb" &&
   VBLK_GUEST_BLK_PROPS=",packed=on" \
       guest_qemu_start "$work/q1.sock" 1 "$work/q1.initrd" "$logs/q1.console.log" 300; then
    qpid=$VBLK_GUEST_QEMU_PID t0=$SECONDS resized=""
    if guest_wait_log "$logs/q1.console.log" "VBLK-RESIZE: ready" 280 "$qpid"; then
        resized=$("$VBLKCTL" --control "$work/q1.ctl" resize 320M 2>&1)
        echo "  vblkctl resize 320M: $resized"
    fi
    wait "$qpid"; qpid=""
    echo "  (q1: guest ran $((SECONDS - t0)) s)"
    guest_log_lines "$logs/q1.console.log" "VBLK-RESIZE:" | sed 's/^/  /'
    if guest_log_result "$logs/q1.console.log" fio-verify; then
        pass guest-fio-verify-1-queue
    else
        fail guest-fio-verify-1-queue "see $logs/q1.console.log"
    fi
    if [[ $resized == *'"notified": true'* ]] &&
       guest_log_result "$logs/q1.console.log" resize; then
        pass guest-sees-resize-and-writes-past-old-end
    else
        fail guest-sees-resize-and-writes-past-old-end "vblkctl: ${resized:-not run}; see $logs/q1.console.log"
    fi
    daemon_stop q1 && pass q1-daemon-exit-0
    if python3 - "$work/q1.img" <<'PY'
import os, sys
f = sys.argv[1]
assert os.path.getsize(f) == 320 << 20
with open(f, "rb") as fh:
    fh.seek(256 << 20)
    assert fh.read(1 << 20).count(0) < (1 << 19)   # fio's data, not a hole
PY
    then
        pass resized-image-has-the-guests-data
    else
        fail resized-image-has-the-guests-data "$(stat -c %s "$work/q1.img") bytes"
    fi
fi

# 2. Two queues: fio verify, then a known pattern written by the guest
#    must be in the image after the daemon has exited.
truncate -s 256M "$work/q2.img"
{
    echo '#!/bin/sh'
    echo '('; cat "$here/scenarios/fio-verify.sh"; echo ')'
    echo '('; cat "$here/scenarios/fill.sh"; echo ')'
} >"$work/verify-fill.sh"
if daemon_start q2 --disk "$work/q2.img" --queues 2; then
    if boot q2 2 "$work/verify-fill.sh" &&
       guest_log_result "$logs/q2.console.log" fio-verify &&
       guest_log_result "$logs/q2.console.log" fill; then
        pass guest-fio-verify-2-queues
    else
        fail guest-fio-verify-2-queues "see $logs/q2.console.log"
    fi
    if daemon_stop q2; then
        pass q2-daemon-exit-0
        r0=$(queue_requests q2 0) r1=$(queue_requests q2 1)
        if ((${r0:-0} > 0 && ${r1:-0} > 0)); then
            pass both-queues-served "queue 0: $r0 requests, queue 1: $r1"
        else
            fail both-queues-served "queue 0: ${r0:-?} requests, queue 1: ${r1:-?}"
        fi
    fi
    if pattern_ok "$work/q2.img"; then
        pass data-persisted-after-daemon-exit
    else
        fail data-persisted-after-daemon-exit "first MiB of the image lacks the guest's pattern"
    fi
fi

# 2b. Packed virtqueues (QEMU packed=on), 4 queues, 4096-byte blocks:
#     fio verify; the guest's 2 vCPUs use queues 0 and 1 (Linux takes
#     min(queues, CPUs)), both served.
truncate -s 256M "$work/pk.img"
if daemon_start pk --disk "$work/pk.img" --queues 4 --block-size 4096; then
    if VBLK_GUEST_BLK_PROPS=",packed=on" boot pk 4 "$here/scenarios/fio-verify.sh" &&
       guest_log_result "$logs/pk.console.log" fio-verify; then
        pass guest-packed-4-queues-4k-fio-verify
    else
        fail guest-packed-4-queues-4k-fio-verify "see $logs/pk.console.log"
    fi
    if daemon_stop pk; then
        pass pk-daemon-exit-0
        r0=$(queue_requests pk 0) r1=$(queue_requests pk 1)
        if ((${r0:-0} > 0 && ${r1:-0} > 0)); then
            pass packed-both-guest-queues-served "queue 0: $r0 requests, queue 1: $r1"
        else
            fail packed-both-guest-queues-served "queue 0: ${r0:-?} requests, queue 1: ${r1:-?}"
        fi
    fi
    grep -q "virtqueues: packed" "$logs/pk.vblkd.log" && pass packed-rings-negotiated ||
        fail packed-rings-negotiated "vblkd never saw VIRTIO_F_RING_PACKED acked"
fi

# 3. Read-only export (on packed rings): writes fail in the guest, the
#    image is untouched.
python3 -c "
import os
with open('$work/ro.img', 'wb') as f:
    f.write(os.urandom(1 << 20)); f.truncate(64 << 20)"
before=$(md5sum <"$work/ro.img")
if daemon_start ro --disk "$work/ro.img" --read-only; then
    if VBLK_GUEST_BLK_PROPS=",packed=on" boot ro 1 "$here/scenarios/readonly.sh" &&
       guest_log_result "$logs/ro.console.log" readonly; then
        pass guest-read-only-refuses-writes
    else
        fail guest-read-only-refuses-writes "see $logs/ro.console.log"
    fi
    daemon_stop ro && pass ro-daemon-exit-0
    if [[ $(md5sum <"$work/ro.img") == "$before" ]]; then
        pass read-only-image-untouched
    else
        fail read-only-image-untouched "image changed"
    fi
fi

# 4. Polled I/O (scenarios/iopoll.sh): the guest's virtio_blk with a poll
#    queue (two virtqueues, poll_queues=1), served by vblkd; and vblkd's
#    --iopoll, which needs a device with poll queues (none on the host):
#    the guest's /dev/vda is one, and this build of vblkd runs in the guest
#    from the host's file system (9p, read-only).
truncate -s 64M "$work/ip.img"
cat "$here/scenarios/host-root.sh" "$here/scenarios/iopoll.sh" >"$work/iopoll.sh"
if daemon_start ip --disk "$work/ip.img" --queues 2; then
    VBLK_GUEST_APPEND="virtio_blk.poll_queues=1 vblk.build=$(cd "$(dirname "$VBLKD")" && pwd)" \
    VBLK_GUEST_MEM=1G \
    VBLK_GUEST_EXTRA_DISKS="-virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap" \
        boot ip 2 "$work/iopoll.sh"
    guest_log_lines "$logs/ip.console.log" "VBLK-GUEST: \\(/sys\\|vblk\\)" | sed 's/^/  /'
    if guest_log_result "$logs/ip.console.log" hipri; then
        pass guest-polled-queue-fio-hipri-verify
    else
        fail guest-polled-queue-fio-hipri-verify "see $logs/ip.console.log"
    fi
    if guest_log_result "$logs/ip.console.log" iopoll; then
        pass iopoll-vblkd-in-guest-verify-completions-polled
    else
        fail iopoll-vblkd-in-guest-verify-completions-polled "see $logs/ip.console.log"
    fi
    if daemon_stop ip; then
        r1=$(queue_requests ip 1)
        if ((${r1:-0} > 0)); then
            pass guest-poll-queue-served "queue 1 (the guest's poll queue): $r1 requests"
        else
            fail guest-poll-queue-served "queue 1: ${r1:-?} requests"
        fi
    fi
fi
exit 0
