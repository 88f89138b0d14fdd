#!/bin/sh
# Guest scenario (busybox sh): write+verify /dev/vda with fio, then measure
# virtio interrupts per I/O at QD1 and QD32.
# Prints: VBLK-IRQ: qd=N ios=N irqs=N irqs_per_io=X
#         VBLK-RESULT: PASS fio-verify | VBLK-RESULT: FAIL fio-verify ...
DEV=/dev/vda
# Smallest block = the disk's logical block size (512 normally; O_DIRECT
# I/O smaller than that fails with EINVAL on a 4k-sector disk).
LBS=$(cat /sys/block/vda/queue/logical_block_size 2>/dev/null || echo 512)
VBS="$LBS-128k"

if fio --enghelp 2>/dev/null | grep -qw libaio; then
    ENG=libaio
else
    ENG=psync
fi
echo "VBLK-GUEST: fio $(fio --version 2>&1) engine=$ENG verify-bsrange=$VBS"

# Sum of all CPUs' counts over the virtio queue interrupt lines
# (virtioN-req.M with MSI-X per vq, virtioN-virtqueues with a shared
# vector; the virtioN-config line is excluded).
irq_sum() {
    awk 'NR == 1 { n = NF; next }
         $NF ~ /^virtio[0-9]+-/ && $NF !~ /-config$/ {
             for (i = 2; i <= n + 1; i++) s += $i
         }
         END { print s + 0 }' /proc/interrupts
}

irq_lines() {
    grep virtio /proc/interrupts | sed "s/^/VBLK-GUEST: $1 /"
}

# json_get FILE SECTION KEY: first KEY inside jobs[0].SECTION of fio's
# (pretty printed, one key per line) JSON output.
json_get() {
    awk -v sec="$2" -v key="$3" '
        /^ *"(read|write|trim|sync)" : \{/ { s = $1; gsub(/"/, "", s) }
        s == sec && $1 == "\"" key "\"" && !done {
            v = $3; gsub(/[^0-9.]/, "", v); print v; done = 1
        }
        END { if (!done) print 0 }' "$1"
}

irq_job() {
    qd=$1
    b=$(irq_sum)
    fio --name="irq-qd$qd" --eta=never --filename=$DEV --direct=1 --ioengine=$ENG \
        --rw=randread --bs=4k --iodepth="$qd" --size=32M \
        --runtime=3 --time_based --output-format=json \
        --output="/tmp/irq-qd$qd.json"
    rc=$?
    a=$(irq_sum)
    if [ "$rc" != 0 ]; then
        echo "VBLK-GUEST: irq job qd=$qd failed rc=$rc"
        cat "/tmp/irq-qd$qd.json"
        return 1
    fi
    ios=$(json_get "/tmp/irq-qd$qd.json" read total_ios)
    irqs=$((a - b))
    per=$(awk -v i="$irqs" -v n="$ios" 'BEGIN { if (n > 0) printf "%.3f", i / n; else print "nan" }')
    echo "VBLK-IRQ: qd=$qd ios=$ios irqs=$irqs irqs_per_io=$per"
}

irq_lines before:
fail=""

fio --name=verify --eta=never --filename=$DEV --direct=1 --ioengine=$ENG \
    --rw=randwrite --bsrange="$VBS" --iodepth=32 --size=32M \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --output-format=json --output=/tmp/verify.json
rc=$?
wkb=$(json_get /tmp/verify.json write io_kbytes)
rkb=$(json_get /tmp/verify.json read io_kbytes)
wios=$(json_get /tmp/verify.json write total_ios)
rios=$(json_get /tmp/verify.json read total_ios)
echo "VBLK-GUEST: verify job rc=$rc written=${wkb}KiB/${wios}ios verified=${rkb}KiB/${rios}ios"
if [ "$rc" != 0 ]; then
    cat /tmp/verify.json
    fail="rc=$rc"
elif [ "$wkb" -eq 0 ] || [ "$rkb" -lt "$wkb" ]; then
    # fio exited 0 but did not read everything back: verify did not run.
    fail="rc=0 verify-phase-missing written=${wkb}KiB verified=${rkb}KiB"
fi

irq_job 1 || fail="${fail:+$fail }irq-qd1"
irq_job 32 || fail="${fail:+$fail }irq-qd32"
[ "$ENG" = libaio ] || echo "VBLK-GUEST: note: engine $ENG has no queue depth; qd=32 ran at QD1"

irq_lines after:

if [ -z "$fail" ]; then
    echo "VBLK-RESULT: PASS fio-verify"
else
    echo "VBLK-RESULT: FAIL fio-verify $fail"
fi
