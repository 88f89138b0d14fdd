#!/bin/sh
# Guest scenario (busybox sh): every /dev/vd* disk is tested according to
# its serial (set by the host with vblkd --serial):
#   v-*       fio crc32c verify (the rest of the serial names the backend)
#   discard*  discard, fio trim and write zeroes, reads back as zeroes
#   ro        read-only: write, discard and write zeroes all refused
#   qos*      8 s of 4k randread at QD32 (the host set a QoS limit: it
#             checks the IOPS printed, VBLK-QOS: iops=N), then fio verify
# Prints one VBLK-RESULT line per disk.
if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi
zeroes() {	# zeroes DEV OFFSET_MIB LEN_MIB: 0 if the range reads as zeroes
    dd if="$1" of=/tmp/z bs=1M skip="$2" count="$3" iflag=direct 2>/dev/null
    dd if=/dev/zero of=/tmp/z0 bs=1M count="$3" 2>/dev/null
    [ "$(md5sum </tmp/z | cut -d' ' -f1)" = "$(md5sum </tmp/z0 | cut -d' ' -f1)" ]
}
verify() {	# verify SIZE: fio crc32c write+verify of $dev, one VBLK-RESULT line
    fio --name=verify --eta=never --filename="$dev" --direct=1 --ioengine=$ENG \
        --rw=randwrite --bsrange="$lbs"-128k --iodepth=32 --size="$1" \
        --verify=crc32c --verify_fatal=1 --do_verify=1 >/tmp/fio.log 2>&1
    rc=$?
    if [ $rc = 0 ]; then echo "VBLK-RESULT: PASS $serial"
    else tail -5 /tmp/fio.log; echo "VBLK-RESULT: FAIL $serial rc=$rc"; fi
}
for sys in /sys/block/vd*; do
    dev=/dev/${sys##*/}
    serial=$(cat "$sys/serial" 2>/dev/null)
    lbs=$(cat "$sys/queue/logical_block_size")
    echo "VBLK-GUEST: $dev serial=$serial lbs=$lbs discard_max=$(cat "$sys/queue/discard_max_bytes") wz_max=$(cat "$sys/queue/write_zeroes_max_bytes") ro=$(cat "$sys/ro")"
    case "$serial" in
    v-*)
        verify 16M
        ;;
    discard*)
        fail=""
        # 8 MiB of data, then discard [1M, 5M): zeroes there, data around.
        dd if=/dev/urandom of=/tmp/pat bs=1M count=8 2>/dev/null
        dd if=/tmp/pat of="$dev" bs=1M oflag=direct conv=fsync 2>/dev/null || fail="$fail write"
        blkdiscard -o 1048576 -l 4194304 "$dev" || fail="$fail blkdiscard"
        zeroes "$dev" 1 4 || fail="$fail discarded-range-not-zero"
        dd if="$dev" of=/tmp/after bs=1M skip=5 count=3 iflag=direct 2>/dev/null
        dd if=/tmp/pat of=/tmp/before bs=1M skip=5 count=3 2>/dev/null
        cmp -s /tmp/after /tmp/before || fail="$fail data-after-range-changed"
        # fio trim over [6M, 7M)
        fio --name=trim --eta=never --filename="$dev" --rw=trim --bs=64k --offset=6M \
            --size=1M --ioengine=psync >/tmp/trim.log 2>&1 || fail="$fail fio-trim"
        # write zeroes (util-linux: BLKZEROOUT -> WRITE_ZEROES) over [7M, 8M)
        /usr/sbin/blkdiscard-ul -z -o 7340032 -l 1048576 "$dev" || fail="$fail blkdiscard-z"
        zeroes "$dev" 7 1 || fail="$fail zeroed-range-not-zero"
        echo "VBLK-GUEST: discard done (host checks the holes)"
        if [ -z "$fail" ]; then echo "VBLK-RESULT: PASS $serial"
        else echo "VBLK-RESULT: FAIL $serial$fail"; fi
        ;;
    qos*)
        fio --name=qos --eta=never --filename="$dev" --direct=1 --ioengine=$ENG \
            --rw=randread --bs=4k --iodepth=32 --runtime=8 --time_based=1 --size=64M \
            --output-format=terse --terse-version=3 >/tmp/qos.log 2>&1
        echo "VBLK-QOS: iops=$(awk -F';' 'NF > 8 { print $8; exit }' /tmp/qos.log)"
        verify 8M
        ;;
    ro)
        fail=""
        [ "$(cat "$sys/ro")" = 1 ] || fail="$fail not-ro"
        dd if=/dev/zero of="$dev" bs=4096 count=1 oflag=direct conv=fsync 2>/dev/null &&
            fail="$fail write-succeeded"
        blkdiscard -o 0 -l 1048576 "$dev" 2>/dev/null && fail="$fail discard-succeeded"
        /usr/sbin/blkdiscard-ul -z -o 0 -l 1048576 "$dev" 2>/dev/null &&
            fail="$fail write-zeroes-succeeded"
        dd if="$dev" of=/dev/null bs=1M count=1 iflag=direct 2>/dev/null || fail="$fail read"
        if [ -z "$fail" ]; then echo "VBLK-RESULT: PASS ro"
        else echo "VBLK-RESULT: FAIL ro$fail"; fi
        ;;
    esac
done
