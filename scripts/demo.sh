#!/usr/bin/env bash
# The main job, end to end: install what is needed, build, start vblkd on a
# default sparse disk image, boot a small Linux guest (QEMU, software
# emulation) that runs fio against the disk, print what it saw and how to
# point a real QEMU at the socket.
#
#   scripts/demo.sh            run the demo, then stop the daemon
#   scripts/demo.sh --keep     leave vblkd serving afterwards (Ctrl-C stops it)
#   scripts/demo.sh --nbd      the same disk image behind an NBD server
#                              (nbdkit), served with --disk nbd+unix://...
#   scripts/demo.sh --rbd      an RBD image on a throwaway single-node Ceph
#                              cluster started here, --disk rbd:rbd/demo
#
# Environment: VBLK_DEMO_DIR (default build/demo), VBLK_DEMO_SIZE (1G).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
keep=0 kind=file
for a in "$@"; do
    case $a in
    --keep) keep=1 ;;
    --nbd) kind=nbd ;;
    --rbd) kind=rbd ;;
    *) echo "scripts/demo.sh: unknown option '$a' (--keep, --nbd, --rbd)" >&2; exit 1 ;;
    esac
done

dir=${VBLK_DEMO_DIR:-$top/build/demo}
size=${VBLK_DEMO_SIZE:-1G}
disk=$dir/disk.img
sock=$dir/vblkd.sock

scripts/deps.sh all
[[ -f build/build.ninja ]] || meson setup build >/dev/null
ninja -C build >/dev/null

mkdir -p "$dir"
[[ -e $disk ]] || truncate -s "$size" "$disk"

spid="" extra=()
cleanup() {
    if [[ -n ${dpid:-} ]]; then kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; fi
    [[ -n $spid ]] && kill "$spid" 2>/dev/null
    [[ $kind == rbd ]] && scripts/ceph-cluster.sh stop "$dir/ceph" >/dev/null 2>&1
    wait 2>/dev/null
}
trap cleanup EXIT
case $kind in
nbd)
    # nbdkit serves the image file on a unix socket; vblkd is its client.
    rm -f "$dir/nbd.sock"
    nbdkit -f -U "$dir/nbd.sock" file "$disk" >"$dir/nbdkit.log" 2>&1 &
    spid=$!
    for _ in $(seq 100); do [[ -S $dir/nbd.sock ]] && break; sleep 0.05; done
    served="nbd+unix:///?socket=$dir/nbd.sock"
    ;;
rbd)
    echo "starting a single-node Ceph cluster (about 10 s) ..."
    rm -rf "$dir/ceph"
    conf=$(scripts/ceph-cluster.sh start "$dir/ceph")
    CEPH_CONF=$conf rbd create --size "$size" rbd/demo
    served=rbd:rbd/demo
    extra=(--ceph-conf "$conf")
    ;;
*) served=$disk ;;
esac

build/vblkd --socket "$sock" --disk "$served" "${extra[@]}" --queues 2 >"$dir/vblkd.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do grep -q serving "$dir/vblkd.log" && break; sleep 0.05; done
grep -q serving "$dir/vblkd.log" || { cat "$dir/vblkd.log"; exit 1; }
echo "vblkd is serving $served ($size, 2 queues) on $sock"

. tests/guest/lib.sh
guest_build_initramfs build/guest
guest_initrd tests/guest/scenarios/demo.sh "$dir/demo.initrd" build/guest
echo "booting a demo guest (QEMU TCG; takes about 20 s) ..."
rc=0
guest_boot "$sock" 2 "$dir/demo.initrd" "$dir/guest.log" 300 || rc=$?
echo "---- what the guest saw ----"
tr -d '\r' <"$dir/guest.log" | awk '/^=+$/ && !p {p=1} p && !/^\[ *[0-9]/' |
    grep -av 'VBLK-GUEST' || true
echo "----------------------------"
kill -USR1 "$dpid"; sleep 0.2
grep -E " stats \{" "$dir/vblkd.log" | tail -1 | sed 's/^.*info: stats /vblkd counters: /'
if ((rc != 0)) || ! guest_log_result "$dir/guest.log" demo; then
    echo "demo FAILED (guest log: $dir/guest.log, daemon log: $dir/vblkd.log)"
    exit 1
fi
cat <<EOT

Demo passed.  To give a real VM this disk, run vblkd and point QEMU at the socket:
  build/vblkd --socket $sock --disk $served ${extra[*]} --queues 2
  qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=4G,share=on \\
      -numa node,memdev=mem -chardev socket,id=c0,path=$sock \\
      -device vhost-user-blk-pci,chardev=c0,num-queues=2
(vhost-user needs the guest RAM shared: memory-backend-memfd with share=on.)
EOT
if ((keep)); then
    echo "vblkd keeps serving on $sock (log: $dir/vblkd.log); Ctrl-C stops it."
    wait "$dpid"
fi
