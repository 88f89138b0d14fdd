#!/bin/sh
# Guest scenario (busybox sh): the disks /dev/vda (raw on the host) and
# /dev/vdb (qcow2) written for about 100 s while the host backs them up:
# rounds of fio verify (randwrite 4k-64k, QD16, crc32c) on their first
# 64 MiB, and beside them discards, write zeroes and plain writes on
# [128M, 256M).  The host takes full and incremental backups meanwhile and
# kills vblkd under the writes; every round must verify.
if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi
BD=blkdiscard
[ -x /usr/sbin/blkdiscard-ul ] && BD=/usr/sbin/blkdiscard-ul
up() { cut -d. -f1 /proc/uptime; }
END=$(( $(up) + ${VBLK_BACKUP_SECONDS:-100} ))
side() {	# side DEV: discards, write zeroes, writes beside fio's range
    i=0
    while [ "$(up)" -lt "$END" ]; do
        o=$(( (128 + (i * 7) % 120) * 1024 * 1024 ))
        $BD -o $o -l 1048576 "$1" 2>/dev/null
        $BD -z -o $(( o + 2097152 )) -l 524288 "$1" 2>/dev/null
        dd if=/dev/urandom of="$1" bs=64k count=4 seek=$(( (o + 4194304) / 65536 )) \
            oflag=direct 2>/dev/null
        i=$((i + 1))
        sleep 0.2
    done
}
side /dev/vda & s1=$!
side /dev/vdb & s2=$!
echo "VBLK-GUEST: backup fio start"
rounds=0 bad=0
while [ "$(up)" -lt "$END" ]; do
    fio --eta=never --ioengine=$ENG --direct=1 --rw=randwrite --bsrange=4k-64k --iodepth=16 \
        --size=64M --verify=crc32c --verify_fatal=1 --do_verify=1 --randseed=$rounds \
        --name=a --filename=/dev/vda --name=b --filename=/dev/vdb >/tmp/fio.log 2>&1 ||
        { bad=$((bad + 1)); tail -8 /tmp/fio.log; }
    rounds=$((rounds + 1))
done
wait $s1 $s2
echo "VBLK-GUEST: backup rounds=$rounds failed=$bad"
if [ $rounds -gt 0 ] && [ $bad = 0 ]; then
    echo "VBLK-RESULT: PASS backup"
else
    echo "VBLK-RESULT: FAIL backup rounds=$rounds failed=$bad"
fi
