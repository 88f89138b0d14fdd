#!/bin/sh
# Guest scenario (busybox sh): a short, friendly demo of the disk.
DEV=/dev/vda
sectors=$(cat /sys/block/vda/size)
echo "=================================================================="
echo " vblkd demo: guest sees $DEV, $sectors sectors = $((sectors / 2048)) MiB"
echo "   read-only: $(cat /sys/block/vda/ro)   hw queues: $(find /sys/block/vda/mq -mindepth 1 -maxdepth 1 | wc -l)"
echo "   logical block size: $(cat /sys/block/vda/queue/logical_block_size)"
echo "=================================================================="

if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi
if [ "$(cat /sys/block/vda/ro)" = 1 ]; then RW=randread; else RW=randrw; fi

echo "Running fio: 5 s of 4k $RW at queue depth 16 ($ENG) ..."
fio --name=demo --eta=never --filename=$DEV --direct=1 --ioengine=$ENG --rw=$RW \
    --bs=4k --iodepth=16 --runtime=5 --time_based --size=64M \
    --group_reporting
rc=$?
if [ "$rc" = 0 ]; then
    echo "VBLK-RESULT: PASS demo"
else
    echo "VBLK-RESULT: FAIL demo rc=$rc"
fi
