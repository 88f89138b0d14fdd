#!/usr/bin/env bash
# Description: every I/O engine (io_uring, aio, threads) on a file and on a
# loop block device, with 512 and 4096-byte logical blocks, as disks of a
# real Linux guest: fio crc32c verify on each; discard, fio trim and write
# zeroes on one (the host then finds holes in the image); a read-only export
# refusing write, discard and write zeroes; a disk with a QoS limit
# (--limit iops-total=500): fio at QD32 gets 500 IOPS within 10 % and
# verifies clean; a qcow2 overlay on a chain of three, streamed while the
# guest verifies on it (qemu-img check clean after, no backing file, the
# chain's bytes where the guest did not write) and a LUKS2 disk with
# 4096-byte sectors, fio verify on each.  Two
# boots, six to eleven disks each.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
VBLKD=${1:?usage: backends.sh PATH/TO/vblkd}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
set +e

gb="$VBLK_REPO_ROOT/build/guest"
work=$(mktemp -d /tmp/vblk-backends.XXXXXX)
logs="$VBLK_REPO_ROOT/build/test-logs/backends"
mkdir -p "$logs"
pids=() loops=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

guest_deps || { fail guest-deps; exit 1; }
guest_build_initramfs "$gb" || { fail guest-initramfs; exit 1; }
guest_initrd "$here/scenarios/multi.sh" "$work/multi.initrd" "$gb" || { fail initrd; exit 1; }

have_loop=1
if ! losetup -f >/dev/null 2>&1; then
    have_loop=0
    echo "SKIP: loop-device disks (losetup -f failed: no loop devices here)"
fi

# disk NAME KIND(file|loop) ENGINE BS [vblkd args...]: start a daemon for a
# 128 MiB disk ($DISK_IMG instead, if set: an image made beforehand); sets
# DISK_ARGS for QEMU.
declare -a qemu_args
disk() {
    local name=$1 kind=$2 engine=$3 bs=$4; shift 4
    local img="$work/$name.img" path sock="$work/$name.sock" idx=${#pids[@]}
    if [[ -n ${DISK_IMG:-} ]]; then img=$DISK_IMG; else truncate -s 128M "$img"; fi
    path=$img
    if [[ $kind == loop ]]; then
        ((have_loop)) || return 1
        path=$(losetup -f --show --direct-io=on -b "$bs" "$img" 2>/dev/null ||
               losetup -f --show -b "$bs" "$img") || { fail "$name" "losetup"; return 1; }
        loops+=("$path")
    fi
    "$VBLKD" --socket "$sock" --disk "$path" --backend "$engine" --block-size "$bs" \
        --serial "$name" "$@" >"$logs/$name.vblkd.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.05; done
    [[ -S $sock ]] || { fail "$name" "vblkd did not start: $(tail -2 "$logs/$name.vblkd.log")"; return 1; }
    qemu_args+=(-chardev "socket,id=x$idx,path=$sock" -device "vhost-user-blk-pci,chardev=x$idx,num-queues=1")
    names+=("$name")
}

# boot NAME: boot with every disk in qemu_args, check each name's result.
boot() {
    local boot=$1 first_sock first_args t0=$SECONDS
    # guest_boot takes the first disk itself; the rest go in EXTRA_DISKS.
    first_sock=$(sed -n 's/^socket,id=x[0-9]*,path=//p' <<<"${qemu_args[1]}")
    VBLK_GUEST_EXTRA_DISKS="${qemu_args[*]:4}" \
        guest_boot "$first_sock" 1 "$work/multi.initrd" "$logs/$boot.console.log" 400
    echo "  ($boot: guest ran $((SECONDS - t0)) s with ${#names[@]} disks)"
    for n in "${names[@]}"; do
        guest_log_verdict "$logs/$boot.console.log" "$n"
    done
}

stop_all() {
    local p rc
    for p in "${pids[@]}"; do
        kill -TERM "$p" 2>/dev/null; rc=0; wait "$p" || rc=$?
        ((rc == 0)) || fail daemon-exit "a vblkd exited with status $rc"
    done
    pids=()
    for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null; done
    loops=()
}

# Boot 1: the file disks, plus discard and read-only.
qemu_args=() names=()
disk v-uring-file-512 file io_uring 512
disk v-aio-file-512 file aio 512
disk v-threads-file-512 file threads 512
disk v-uring-file-4096 file io_uring 4096
disk v-aio-file-4096 file aio 4096
disk v-threads-file-4096 file threads 4096
disk discard file io_uring 512
python3 -c "
import os
with open('$work/ro-src.img', 'wb') as f: f.write(os.urandom(1 << 20)); f.truncate(128 << 20)"
cp "$work/ro-src.img" "$work/ro.img.keep"
disk ro file io_uring 512 --read-only
# disk() truncated ro.img to an empty 128M file; put the data back.
cp "$work/ro.img.keep" "$work/ro.img"
disk qos500 file io_uring 512 --limit iops-total=500
# A qcow2 overlay on a chain of three (raw base <- qcow2 with data of its
# own <- the overlay: every write allocates, part-cluster writes copy what
# the chain has), streamed while the guest verifies on it (vblkctl stream,
# no rate limit, started once the guest reaches the disk: done in about a
# second, before the guest's verify is; test_qcow2 tests --rate), with a
# persistent bitmap QEMU made (qemu-img bitmap --add, 1 MiB chunks) that
# vblkd tracks through the guest's writes and the stream and stores; and
# a LUKS2 disk (4096-byte sectors, AES-256-XTS).
head -c 8M /dev/urandom >"$work/qbase.raw"; truncate -s 128M "$work/qbase.raw"
have_qcow2=0 have_luks=0
CTL=$(dirname "$VBLKD")/vblkctl
if qemu-img create -q -f qcow2 -b qbase.raw -F raw "$work/mid.qcow2" 128M 2>/dev/null &&
   qemu-io -f qcow2 -c "write -P 0x6d 20M 4M" "$work/mid.qcow2" >/dev/null &&
   qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 "$work/ov.qcow2" 128M 2>/dev/null &&
   qemu-img bitmap --add -g 1M "$work/ov.qcow2" gb &&
   qemu-img convert -O raw "$work/ov.qcow2" "$work/ov.before"; then
    DISK_IMG=$work/ov.qcow2 disk v-qcow2-overlay file io_uring 512 --control "$work/ov.ctl" &&
        have_qcow2=1
fi
if command -v cryptsetup >/dev/null &&
   (($(ldd "$VBLKD" 2>/dev/null | grep -c libcryptsetup) > 0)); then
    printf 'guest test %s' "$RANDOM" >"$work/lk.key"
    truncate -s 160M "$work/lk.img"
    if cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
            --key-file "$work/lk.key" "$work/lk.img"; then
        DISK_IMG=$work/lk.img disk v-luks2-4k file io_uring 512 --key-file "$work/lk.key" &&
            have_luks=1
    fi
else
    echo "SKIP: guest-v-luks2-4k (no cryptsetup, or vblkd without LUKS)"
fi
if ((have_qcow2)); then
    rm -f "$logs/boot-files.console.log"	# an earlier run's says the same
    (
        for _ in $(seq 1200); do
            guest_log_has "$logs/boot-files.console.log" "serial=v-qcow2-overlay" && break
            sleep 0.25
        done
        "$CTL" --control "$work/ov.ctl" stream >"$logs/ov.stream" 2>&1
    ) &
    spid=$!
fi
boot boot-files
stop_all
[[ -n ${spid:-} ]] && wait "$spid"
# QoS: 8 s at QD32 under iops-total=500 (plus the bucket's first tenth of
# a second, 50 I/Os): 500 within 10 %.
qiops=$(tr -d '\r' <"$logs/boot-files.console.log" | sed -n 's/.*VBLK-QOS: iops=\([0-9]*\).*/\1/p' | head -1)
if [[ -n $qiops ]] && ((qiops >= 450 && qiops <= 550)); then
    pass "qos-guest-iops-within-10pc ($qiops)"
else
    fail qos-guest-iops-within-10pc "guest fio got '${qiops}' IOPS under iops-total=500"
fi
# The daemon's counters at exit: requests waited for the budget.
qthr=$(grep -o '"throttled_requests": [0-9]*' "$logs/qos500.vblkd.log" | head -1 | sed 's/.*: //')
if [[ -n $qthr ]] && ((qthr > 0)); then pass "qos-guest-throttled-counted ($qthr)"
else fail qos-guest-throttled-counted "no throttled_requests in $logs/qos500.vblkd.log"; fi
# Discard: [1M,5M) and [6M,7M) deallocated, [7M,8M) zeroed, rest is data.
python3 - "$work/discard.img" <<'PY' && pass discard-made-holes || fail discard-made-holes "no hole where the guest discarded"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
def hole_at(off):
    try:
        return os.lseek(fd, off, os.SEEK_HOLE) == off
    except OSError:
        return False
ok = hole_at(1 << 20) and hole_at(3 << 20) and hole_at(6 << 20) and not hole_at(0)
data = os.pread(fd, 4 << 20, 1 << 20) + os.pread(fd, 1 << 20, 7 << 20)
sys.exit(0 if ok and data == bytes(len(data)) else 1)
PY
cmp -s "$work/ro.img" "$work/ro.img.keep" && pass read-only-image-untouched ||
    fail read-only-image-untouched
if ((have_qcow2)); then
    if qemu-img check -q "$work/ov.qcow2" >"$logs/ov.check" 2>&1; then
        pass qcow2-overlay-check-clean-after-guest-fio
    else fail qcow2-overlay-check-clean-after-guest-fio "$(head -3 "$logs/ov.check")"; fi
    # The stream ran under the guest's verify (which passed above) and
    # finished: the image stands alone, and past what the guest wrote
    # ([0, 16M)) it holds what the chain held.
    qemu-img convert -O raw "$work/ov.qcow2" "$work/ov.after"
    if grep -q "stream done" "$logs/v-qcow2-overlay.vblkd.log" &&
       [[ $(qemu-img info "$work/ov.qcow2") != *"backing file"* ]] &&
       cmp -s <(tail -c +$((16 * 1048576 + 1)) "$work/ov.before") \
              <(tail -c +$((16 * 1048576 + 1)) "$work/ov.after"); then
        pass qcow2-stream-under-guest-verify-image-stands-alone
    else
        fail qcow2-stream-under-guest-verify-image-stands-alone \
            "$(cat "$logs/ov.stream"); $(grep -E 'stream' "$logs/v-qcow2-overlay.vblkd.log" | tail -2); $(qemu-img info "$work/ov.qcow2" | grep backing)"
    fi
    # The bitmap came back stored (not in use) and, as qemu-nbd -B reads
    # it, dirty exactly where the guest wrote ([0, 16M): fio's verify
    # region); the stream's copies changed nothing the guest sees and
    # marked nothing.
    qemu-nbd -r -t -f qcow2 -B gb -k "$work/gb.sock" "$work/ov.qcow2" >"$logs/gb.qemu-nbd" 2>&1 &
    gbpid=$!
    for _ in $(seq 300); do [[ -S $work/gb.sock ]] && break; sleep 0.02; done
    gbmap=$(nbdinfo --map=qemu:dirty-bitmap:gb "nbd+unix:///?socket=$work/gb.sock" 2>&1 |
            awk '$3 == 1 { print $1, $2 }')
    kill "$gbpid"; wait "$gbpid" 2>/dev/null
    if [[ $gbmap == "0 16777216" ]] && ! qemu-img info "$work/ov.qcow2" | grep -q in-use; then
        pass qcow2-persistent-bitmap-what-the-guest-wrote
    else
        fail qcow2-persistent-bitmap-what-the-guest-wrote "dirty: $gbmap; $(qemu-img info "$work/ov.qcow2" | grep -A3 bitmaps | tr '\n' ' ')"
    fi
fi
if ((have_luks)); then
    if grep -q "format: LUKS2" "$logs/v-luks2-4k.vblkd.log" &&
       ! grep -qF -- "$(cat "$work/lk.key")" "$logs/v-luks2-4k.vblkd.log"; then
        pass luks-guest-disk-served-key-not-logged
    else fail luks-guest-disk-served-key-not-logged "see $logs/v-luks2-4k.vblkd.log"; fi
fi

# Boot 2: loop block devices.
if ((have_loop)); then
    qemu_args=() names=()
    disk v-uring-loop-512 loop io_uring 512
    disk v-aio-loop-512 loop aio 512
    disk v-threads-loop-512 loop threads 512
    disk v-uring-loop-4096 loop io_uring 4096
    disk v-aio-loop-4096 loop aio 4096
    disk v-threads-loop-4096 loop threads 4096
    boot boot-loopdevs
    stop_all
fi
exit 0
