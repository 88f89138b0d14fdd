#!/usr/bin/env bash
# The main job, end to end: install what is needed, build, start vblkd on a
# default sparse disk image, boot a small Linux guest (QEMU, software
# emulation) that runs fio against the disk, print what it saw and how to
# point a real QEMU at the socket.
#
#   scripts/demo.sh            run the demo, then stop the daemon
#   scripts/demo.sh --keep     leave vblkd serving afterwards (Ctrl-C stops it)
#
# Environment: VBLK_DEMO_DIR (default build/demo), VBLK_DEMO_SIZE (1G).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
keep=0
[[ ${1:-} == --keep ]] && keep=1

dir=${VBLK_DEMO_DIR:-$top/build/demo}
size=${VBLK_DEMO_SIZE:-1G}
disk=$dir/disk.img
sock=$dir/vblkd.sock

scripts/deps.sh all
[[ -f build/build.ninja ]] || meson setup build >/dev/null
ninja -C build >/dev/null

mkdir -p "$dir"
[[ -e $disk ]] || truncate -s "$size" "$disk"

build/vblkd --socket "$sock" --disk "$disk" --queues 2 >"$dir/vblkd.log" 2>&1 &
dpid=$!
trap '[[ -n ${dpid:-} ]] && kill "$dpid" 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 100); do grep -q serving "$dir/vblkd.log" && break; sleep 0.05; done
grep -q serving "$dir/vblkd.log" || { cat "$dir/vblkd.log"; exit 1; }
echo "vblkd is serving $disk ($size, 2 queues) on $sock"

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
  build/vblkd --socket $sock --disk $disk --queues 2
  qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=4G,share=on \\
      -numa node,memdev=mem -chardev socket,id=c0,path=$sock \\
      -device vhost-user-blk-pci,chardev=c0,num-queues=2
(vhost-user needs the guest RAM shared: memory-backend-memfd with share=on.)
EOT
if ((keep)); then
    echo "vblkd keeps serving on $sock (log: $dir/vblkd.log); Ctrl-C stops it."
    wait "$dpid"
fi
