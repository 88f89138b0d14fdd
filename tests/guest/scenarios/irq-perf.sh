#!/bin/sh
# Guest scenario (busybox sh) for bench/guest-irq: 4k randread on /dev/vda,
# O_DIRECT, libaio, at QD1 and QD32, RUNTIME seconds each (from the kernel
# command line, vblk.runtime=N, default 5), over the first 64 MiB.  For each:
#   VBLK-PERF-START: qd=N            (as the job starts)
#   VBLK-PERF: qd=N iops=X lat_us=X ios=N irqs=N irqs_per_io=X
# irqs: the virtio queue interrupt lines' counts in /proc/interrupts (the
# config line excluded), all CPUs, before and after the job.
DEV=/dev/vda
RT=$(sed -n 's/.*vblk\.runtime=\([0-9]*\).*/\1/p' /proc/cmdline)
RT=${RT:-5}
if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi

irq_sum() {
    awk 'NR == 1 { n = NF; next }
         $NF ~ /^virtio[0-9]+-/ && $NF !~ /-config$/ {
             for (i = 2; i <= n + 1; i++) s += $i
         }
         END { print s + 0 }' /proc/interrupts
}

# jget FILE SECTION KEY: first KEY inside SECTION of fio's JSON output.
jget() {
    awk -v sec="$2" -v key="$3" '
        /^ *"(read|write|trim|sync)" : \{/ { s = $1; gsub(/"/, "", s) }
        s == sec && $1 == "\"" key "\"" && !done {
            v = $3; gsub(/[^0-9.]/, "", v); print v; done = 1
        }
        END { if (!done) print 0 }' "$1"
}

fail=""
for qd in 1 32; do
    b=$(irq_sum)
    echo "VBLK-PERF-START: qd=$qd"
    fio --name="qd$qd" --eta=never --filename=$DEV --direct=1 --ioengine=$ENG \
        --rw=randread --bs=4k --iodepth="$qd" --size=64M --norandommap \
        --runtime="$RT" --time_based --output-format=json --output=/tmp/p.json
    rc=$?
    a=$(irq_sum)
    [ "$rc" = 0 ] || { fail="$fail qd$qd"; continue; }
    ios=$(jget /tmp/p.json read total_ios)
    iops=$(jget /tmp/p.json read iops)
    lat=$(awk '/"lat_ns" : \{/ { f = 1 } f && $1 == "\"mean\"" { v = $3; gsub(/[^0-9.]/, "", v); print v / 1000; exit }' /tmp/p.json)
    irqs=$((a - b))
    per=$(awk -v i="$irqs" -v n="$ios" 'BEGIN { if (n > 0) printf "%.3f", i / n; else print "nan" }')
    echo "VBLK-PERF: qd=$qd iops=$iops lat_us=$lat ios=$ios irqs=$irqs irqs_per_io=$per"
done
if [ -z "$fail" ]; then
    echo "VBLK-RESULT: PASS irq-perf"
else
    echo "VBLK-RESULT: FAIL irq-perf$fail"
fi
