#!/bin/sh
# Guest scenario (busybox sh) for tests/guest/upgrade.sh and bench/upgrade:
# a fio crc32c verify job on /dev/vda (randwrite, QD32, O_DIRECT, verify
# reads interleaved by --verify_backlog) while the host upgrades vblkd in
# place (or kills and restarts it).  Prints fio's latency lines as
# VBLK-LAT: (the host takes the largest) and the verify result.
if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi
echo "VBLK-GUEST: upgrade fio start"
fio --name=upgrade --eta=never --filename=/dev/vda --direct=1 --ioengine=$ENG \
    --rw=randwrite --bsrange=4k-64k --iodepth=32 --size=256M \
    --verify=crc32c --verify_backlog=64 --verify_fatal=1 --do_verify=1 >/tmp/fio.log 2>&1
rc=$?
grep -E "^ +(clat|lat) \(" /tmp/fio.log | sed 's/^ */VBLK-LAT: /'
grep -E "err=|io=" /tmp/fio.log | head -6
if [ $rc = 0 ]; then
    echo "VBLK-RESULT: PASS upgrade"
else
    tail -15 /tmp/fio.log
    echo "VBLK-RESULT: FAIL upgrade rc=$rc"
fi
