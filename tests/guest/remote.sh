#!/usr/bin/env bash
# Description: network disks as disks of a real Linux guest (QEMU TCG,
# one boot, four vblkd disks): fio crc32c verify on an RBD image (2 queues)
# and on an nbdkit export; discard, fio trim and write zeroes on an RBD
# image and on a qemu-nbd export of a file, after which the host finds the
# space freed in the backend (rbd du; holes in the file).  And vblkd as an
# NBD server (--nbd, no vhost-user socket) under QEMU's own NBD client
# (-blockdev driver=nbd, a virtio-blk disk of the same guest): fio verify
# on one, discard and write zeroes on another, holes found in its file.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
VBLKD=${1:?usage: remote.sh PATH/TO/vblkd}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
set +e

gb="$VBLK_REPO_ROOT/build/guest"
work=$(mktemp -d /tmp/vblk-guest-remote.XXXXXX)
logs="$VBLK_REPO_ROOT/build/test-logs/guest-remote"
mkdir -p "$logs"
CLUSTER=$VBLK_REPO_ROOT/scripts/ceph-cluster.sh
pids=() servers=()
cleanup() {
    local p
    for p in "${pids[@]}" "${servers[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    timeout 60 "$CLUSTER" stop "$work/ceph" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
pass() { echo "PASS: $1${2:+: $2}"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

"$VBLK_REPO_ROOT/scripts/deps.sh" remote || { fail remote-deps; exit 1; }
guest_deps || { fail guest-deps; exit 1; }
guest_build_initramfs "$gb" || { fail guest-initramfs; exit 1; }
guest_initrd "$here/scenarios/multi.sh" "$work/multi.initrd" "$gb" || { fail initrd; exit 1; }

conf=$(timeout -k 5 120 "$CLUSTER" start "$work/ceph" 2>"$work/ceph.err") ||
    { fail ceph-cluster-start "$(tail -2 "$work/ceph.err" | tr '\n' ' ')"; exit 1; }
rbd_() { timeout 60 rbd -c "$conf" "$@"; }
# 64 KiB objects: the guest's discards ([1M,5M), [6M,7M)) then cover whole
# objects, which librbd removes (a partial one it only zeroes).
rbd_ create --size 128 rbd/verify && rbd_ create --size 128 --object-size 64K rbd/discard ||
    { fail rbd-create; exit 1; }

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
nbdkit -f -i 127.0.0.1 -p "$port" memory 128M >"$logs/nbdkit.log" 2>&1 &
servers+=($!)
truncate -s 128M "$work/nbd.img"
qemu-nbd -f raw -x exp --persistent -e 4 --discard=unmap -k "$work/qnbd.sock" "$work/nbd.img" \
    >"$logs/qemu-nbd.log" 2>&1 &
servers+=($!)
for _ in $(seq 100); do
    [[ -S $work/qnbd.sock ]] && timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null && break
    sleep 0.1
done

# disk NAME QUEUES --disk SPEC [vblkd args...]: a vblkd with serial NAME.
qemu_args=() names=()
disk() {
    local name=$1 nq=$2 sock=$work/$1.sock idx=${#pids[@]}; shift 2
    "$VBLKD" --socket "$sock" --serial "$name" --queues "$nq" "$@" >"$logs/$name.vblkd.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 200); do grep -qs serving "$logs/$name.vblkd.log" && break; sleep 0.05; done
    grep -qs serving "$logs/$name.vblkd.log" ||
        { fail "$name" "vblkd did not start: $(tail -2 "$logs/$name.vblkd.log" | tr '\n' ' ')"; return 1; }
    qemu_args+=(-chardev "socket,id=x$idx,path=$sock" -device "vhost-user-blk-pci,chardev=x$idx,num-queues=$nq")
    names+=("$name")
}
disk v-rbd 2 --disk rbd:rbd/verify --ceph-conf "$conf"
disk discard-rbd 1 --disk rbd:rbd/discard --ceph-conf "$conf"
disk v-nbd 1 --disk "nbd://127.0.0.1:$port/exp"
disk discard-nbd 1 --disk "nbd+unix:///exp?socket=$work/qnbd.sock"
# nbdsrv NAME: a vblkd serving $work/NAME.img over NBD only, attached by
# QEMU's NBD client as a virtio-blk disk with serial NAME.
nbdsrv() {
    local name=$1 sock=$work/$1.nbd
    truncate -s 128M "$work/$name.img"
    "$VBLKD" --disk "$work/$name.img" --nbd "unix:$sock" >"$logs/$name.vblkd.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 200); do [[ -S $sock ]] && break; sleep 0.05; done
    [[ -S $sock ]] ||
        { fail "$name" "vblkd did not start: $(tail -2 "$logs/$name.vblkd.log" | tr '\n' ' ')"; return 1; }
    qemu_args+=(-blockdev "driver=nbd,node-name=$name,server.type=unix,server.path=$sock,discard=unmap"
                -device "virtio-blk-pci,drive=$name,serial=$name")
    names+=("$name")
}
nbdsrv v-vblkd-nbd-server
nbdsrv discard-vblkd-nbd
((${#names[@]})) || exit 0

# guest_boot takes the first disk itself; the rest go in EXTRA_DISKS.
t0=$SECONDS
first_sock=$(sed -n 's/^socket,id=x[0-9]*,path=//p' <<<"${qemu_args[1]}")
first_nq=$(sed -n 's/.*num-queues=//p' <<<"${qemu_args[3]}")
VBLK_GUEST_EXTRA_DISKS="${qemu_args[*]:4}" \
    guest_boot "$first_sock" "$first_nq" "$work/multi.initrd" "$logs/console.log" 400
echo "  (guest ran $((SECONDS - t0)) s with ${#names[@]} disks)"
for n in "${names[@]}"; do
    guest_log_verdict "$logs/console.log" "$n"
done
for p in "${pids[@]}"; do
    kill -TERM "$p" 2>/dev/null; rc=0; wait "$p" || rc=$?
    ((rc == 0)) || fail daemon-exit "a vblkd exited with status $rc"
done
pids=()

# The guest wrote 8 MiB, discarded [1M,5M) and [6M,7M), zeroed [7M,8M):
# at most 4 MiB (64 KiB objects) may remain allocated, at least the 2 MiB
# of data around the holes.
if [[ " ${names[*]} " == *" discard-rbd "* ]]; then
    used=$(rbd_ du --format json rbd/discard |
           python3 -c 'import json, sys; print(json.load(sys.stdin)["images"][0]["used_size"])')
    if ((${used:-0} >= 2 << 20 && ${used:-0} <= 4 << 20)); then
        pass rbd-discard-frees-objects "rbd du: $used bytes used after 8 MiB written"
    else
        fail rbd-discard-frees-objects "rbd du: ${used:-?} bytes used after 8 MiB written, want 2-4 MiB"
    fi
fi
holes() {	# holes FILE: the guest's discards left holes, its data around them
    python3 - "$1" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
def hole_at(off):
    try:
        return os.lseek(fd, off, os.SEEK_HOLE) == off
    except OSError:
        return False
ok = hole_at(1 << 20) and hole_at(3 << 20) and hole_at(6 << 20) and not hole_at(0)
data = os.pread(fd, 4 << 20, 1 << 20)
sys.exit(0 if ok and data == bytes(len(data)) else 1)
PY
}
if [[ " ${names[*]} " == *" discard-vblkd-nbd "* ]]; then
    holes "$work/discard-vblkd-nbd.img" && pass vblkd-nbd-server-discard-made-holes ||
        fail vblkd-nbd-server-discard-made-holes "no hole where the guest discarded"
fi
if [[ " ${names[*]} " == *" discard-nbd "* ]]; then
    holes "$work/nbd.img" && pass nbd-discard-made-holes ||
        fail nbd-discard-made-holes "no hole where the guest discarded"
fi
exit 0
