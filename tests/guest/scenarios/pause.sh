#!/bin/sh
# Guest scenario (busybox sh): two fio crc32c verify jobs (randwrite, QD32)
# on /dev/vda, each on a region of its own; the host lets the disk's file
# system fill up under each (vblkd pauses, then resumes: the first time by
# vblkctl resume after an upgrade in place, the second by itself,
# --error-retry-s, in a vblkd started anew meanwhile).  Both must finish
# with zero verify errors, and the kernel must never have seen an I/O
# error on vda.
if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi
job() {	# job N OFFSET
    echo "VBLK-GUEST: pause phase$1 fio start"
    fio --name=verify$1 --eta=never --filename=/dev/vda --direct=1 --ioengine=$ENG \
        --rw=randwrite --bsrange=4k-64k --iodepth=32 --offset="$2" --size=40M \
        --verify=crc32c --verify_fatal=1 --do_verify=1 >/tmp/fio$1.log 2>&1
    rc=$?
    grep -E "err=|verify|io=" /tmp/fio$1.log | head -6
    if [ $rc = 0 ]; then
        echo "VBLK-RESULT: PASS pause-phase$1-fio-verify"
    else
        tail -15 /tmp/fio$1.log
        echo "VBLK-RESULT: FAIL pause-phase$1-fio-verify rc=$rc"
    fi
    echo "VBLK-GUEST: pause phase$1 done"
}
job 1 0
# The host restarts vblkd now (QEMU reconnects); phase 2's requests wait
# for it.
sleep 2
job 2 64M
if dmesg | grep -i "vda" | grep -iq "error"; then
    dmesg | grep -i "vda" | tail -5
    echo "VBLK-RESULT: FAIL pause-no-io-error-in-guest"
else
    echo "VBLK-RESULT: PASS pause-no-io-error-in-guest"
fi
