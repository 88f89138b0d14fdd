#!/bin/sh
# Guest scenario (busybox sh): polled I/O, both ways.  The guest boots with
# virtio_blk.poll_queues=1 and two virtqueues, so /dev/vda has a poll queue
# (queue/io_poll 1): requests sent there raise no interrupt, the guest
# kernel finds their completions in the used ring by polling.
#  1. hipri: fio with IOPOLL (--hipri) and crc32c verify straight on the
#     poll queue: the host's vblkd serves a driver that never wants a call.
#  2. iopoll: vblkd itself, the host's build run in the guest (the host's
#     root file system over 9p, read-only, chrooted), serves /dev/vda with
#     its defaults (--iopoll auto: it must find the poll queue itself) to
#     vblk-bench --verify: its reads and writes go on an
#     IOPOLL ring to the poll queue and are found by polling
#     (backend_polled in the stats it logs at exit).
# Runs after host-root.sh (host_root: the host's root at /host, the build
# at $BUILD).
DEV=/dev/vda

io_poll=$(cat /sys/block/vda/queue/io_poll 2>/dev/null)
echo "VBLK-GUEST: /sys/block/vda/queue/io_poll=$io_poll"
if [ "$io_poll" != 1 ]; then
    echo "VBLK-RESULT: FAIL hipri no poll queue (io_poll=$io_poll)"
    echo "VBLK-RESULT: FAIL iopoll no poll queue (io_poll=$io_poll)"
    exit 1
fi

# 1.  The second half of the disk.
if fio --name=hipri --eta=never --filename=$DEV --direct=1 --ioengine=io_uring --hipri=1 \
    --rw=randwrite --bs=4k --iodepth=4 --offset=32M --size=8M --verify=crc32c \
    --do_verify=1 --verify_fatal=1 >/tmp/fio-hipri.log 2>&1; then
    echo "VBLK-RESULT: PASS hipri"
else
    echo "VBLK-RESULT: FAIL hipri fio: $(grep -m1 -iE 'err|fail|bad' /tmp/fio-hipri.log)"
    tail -n 20 /tmp/fio-hipri.log
fi

# 2.
if ! host_root; then
    echo "VBLK-RESULT: FAIL iopoll $HOST_ROOT_ERR"
    exit 1
fi
chroot /host "$BUILD/vblkd" --socket $S/ip.sock --disk $DEV >/host$S/vblkd.log 2>&1 &
vpid=$!
i=0
while [ ! -S /host$S/ip.sock ] && [ "$i" -lt 600 ] && kill -0 $vpid 2>/dev/null; do
    sleep 0.1
    i=$((i + 1))
done
echo "VBLK-GUEST: vblkd up after ${i}x0.1s: $(grep -m1 serving /host$S/vblkd.log)"
# The first half of the disk: writes, reads of what was written, and every
# written block read back at the end; then 3 s connected and idle, when
# the iothread must sleep (nothing in flight: nothing to poll for).
chroot /host "$BUILD/vblk-bench" --socket $S/ip.sock --rw randrw --verify --iodepth 4 \
    --runtime 4 --ramp 0 --size 16M --hold 3 >/host$S/bench.log 2>&1 &
bpid=$!
i=0
while ! grep -q iops /host$S/bench.log && [ "$i" -lt 600 ] && kill -0 $bpid 2>/dev/null; do
    sleep 0.1
    i=$((i + 1))
done
sleep 0.5
ticks() { awk '{ print $14 + $15 }' /proc/$vpid/stat; }
t0=$(ticks)
sleep 2
t1=$(ticks)
idle=$((t1 - t0))
wait $bpid
brc=$?
kill -TERM $vpid
wait $vpid
vrc=$?
polled=$(sed -n 's/.*"backend_polled": *\([0-9]*\).*/\1/p' /host$S/vblkd.log | tail -n 1)
echo "VBLK-GUEST: vblk-bench exit $brc: $(grep -m1 -E 'IOPS|iops' /host$S/bench.log)"
echo "VBLK-GUEST: vblkd exit $vrc, backend_polled=${polled:-none}, CPU ticks in 2 s idle: $idle"
# Idle: at most 2 ticks (of 100 a second) in 2 s, 1 % of a CPU.
if [ "$brc" = 0 ] && [ "$vrc" = 0 ] && [ "${polled:-0}" -gt 0 ] && [ "$idle" -le 2 ]; then
    echo "VBLK-RESULT: PASS iopoll"
else
    echo "VBLK-RESULT: FAIL iopoll bench exit $brc, vblkd exit $vrc, polled ${polled:-none}, idle ticks $idle"
    tail -n 20 /host$S/bench.log /host$S/vblkd.log
fi
