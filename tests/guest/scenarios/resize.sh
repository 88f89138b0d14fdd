#!/bin/sh
# Guest scenario (busybox sh): the host grows the disk under us (vblkctl
# resize, once we say we are ready); we must see the new size without a
# reboot, then write 1 MiB past the old end and verify it (fio crc32c).
# Prints: VBLK-RESIZE: ready sectors=N   (the host resizes on this line)
#         VBLK-RESIZE: sectors OLD -> NEW
#         VBLK-RESULT: PASS resize | VBLK-RESULT: FAIL resize ...
old=$(cat /sys/block/vda/size)
echo "VBLK-RESIZE: ready sectors=$old"
new=$old i=0
while [ "$new" = "$old" ] && [ "$i" -lt 120 ]; do
    sleep 1
    new=$(cat /sys/block/vda/size)
    i=$((i + 1))
done
echo "VBLK-RESIZE: sectors $old -> $new"
if [ "$new" = "$old" ]; then
    echo "VBLK-RESULT: FAIL resize (the size did not change within 120 s)"
elif fio --name=past-old-end --eta=never --filename=/dev/vda --direct=1 \
        --offset=$((old * 512)) --size=1M --rw=write --bs=64k \
        --verify=crc32c --do_verify=1 --output=/tmp/resize.out; then
    echo "VBLK-RESULT: PASS resize"
else
    cat /tmp/resize.out
    echo "VBLK-RESULT: FAIL resize (fio past the old end)"
fi
