#!/bin/sh
# Guest scenario (busybox sh): /dev/vda is exported read-only.  Writes must
# fail, reads must work, /sys/block/vda/ro must be 1.
DEV=/dev/vda
fail=""

ro=$(cat /sys/block/vda/ro)
echo "VBLK-GUEST: /sys/block/vda/ro=$ro"
[ "$ro" = 1 ] || fail="$fail ro=$ro"

# busybox dd supports oflag=direct (1.35); fall back to fio otherwise.
if dd if=/dev/zero of=$DEV bs=4096 count=16 oflag=direct conv=fsync; then
    echo "VBLK-GUEST: dd write unexpectedly succeeded"
    fail="$fail dd-write-succeeded"
else
    echo "VBLK-GUEST: dd write failed as expected"
fi

if fio --name=rowrite --eta=never --filename=$DEV --rw=write --direct=1 --ioengine=psync \
    --bs=4k --size=64k >/tmp/fio-write.log 2>&1; then
    echo "VBLK-GUEST: fio write unexpectedly succeeded"
    cat /tmp/fio-write.log
    fail="$fail fio-write-succeeded"
else
    echo "VBLK-GUEST: fio write failed as expected: $(grep -m1 -iE 'err|fail|denied|permitted' /tmp/fio-write.log)"
fi

if dd if=$DEV of=/dev/null bs=4096 count=256 iflag=direct; then
    echo "VBLK-GUEST: read OK"
else
    fail="$fail read-failed"
fi

if [ -z "$fail" ]; then
    echo "VBLK-RESULT: PASS readonly"
else
    echo "VBLK-RESULT: FAIL readonly$fail"
fi
