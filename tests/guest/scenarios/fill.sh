#!/bin/sh
# Guest scenario (busybox sh): write the 4-byte pattern 5a 5b 5c 5d ("Z[\]")
# over the first 1 MiB of /dev/vda so the host can check the image.
# The host side check: the first 1048576 bytes of the image are that pattern.
DEV=/dev/vda
if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi

fio --name=fill --eta=never --filename=$DEV --rw=write --size=1M --bs=64k --iodepth=4 \
    --direct=1 --ioengine=$ENG --buffer_pattern=0x5a5b5c5d \
    --scramble_buffers=0 --end_fsync=1 --output-format=terse >/tmp/fill.terse
rc=$?
if [ "$rc" != 0 ]; then
    cat /tmp/fill.terse
    echo "VBLK-RESULT: FAIL fill rc=$rc"
    exit 0
fi

# Read it back (O_DIRECT, bypassing the guest page cache) and compare.
printf '\132\133\134\135' >/tmp/exp
i=0
while [ "$i" -lt 18 ]; do
    cat /tmp/exp /tmp/exp >/tmp/exp2 && mv /tmp/exp2 /tmp/exp
    i=$((i + 1))
done
dd if=$DEV of=/tmp/got bs=65536 count=16 iflag=direct 2>/dev/null
exp=$(md5sum </tmp/exp | cut -d' ' -f1)
got=$(md5sum </tmp/got | cut -d' ' -f1)
echo "VBLK-GUEST: fill md5 expected=$exp readback=$got"
if [ "$exp" = "$got" ]; then
    echo "VBLK-RESULT: PASS fill"
else
    echo "VBLK-RESULT: FAIL fill readback-mismatch"
fi
