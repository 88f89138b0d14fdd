#!/bin/sh
# Guest scenario (busybox sh): a long fio verify job (randwrite, QD32,
# crc32c) on /dev/vda.  The host kills vblkd with SIGKILL while it runs and
# starts it again; the job must finish with zero verify errors.
if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi
echo "VBLK-GUEST: reconnect fio start"
fio --name=verify --eta=never --filename=/dev/vda --direct=1 --ioengine=$ENG \
    --rw=randwrite --bsrange=4k-64k --iodepth=32 --size=192M \
    --verify=crc32c --verify_fatal=1 --do_verify=1 >/tmp/fio.log 2>&1
rc=$?
grep -E "err=|verify|io=" /tmp/fio.log | head -8
if [ $rc = 0 ]; then
    echo "VBLK-RESULT: PASS reconnect"
else
    tail -15 /tmp/fio.log
    echo "VBLK-RESULT: FAIL reconnect rc=$rc"
fi
