#!/bin/sh
# Guest scenario (busybox sh) for bench/guest-irq and bench/guest-paired:
# 4k randread on /dev/vda, O_DIRECT, libaio, over the first 64 MiB, as jobs
# of RUNTIME seconds.  From the kernel command line: vblk.runtime=S
# (default 5), vblk.jobs=N (default 2), vblk.qds=A:B (the queue depths, in
# turn per block of vblk.block jobs: default 1:32, block 1: bench/guest-irq's
# one QD1 and one QD32 job), vblk.settle=S (default 0): after announcing a
# job the guest waits that long before it measures, for bench/guest-paired
# to switch the daemon under it.  Per job:
#   VBLK-PERF-START: job=J qd=N        (then settle, then measure)
#   VBLK-PERF: job=J qd=N iops=X lat_us=X ios=N irqs=N irqs_per_io=X
# irqs: the virtio queue interrupt lines' counts in /proc/interrupts (the
# config line excluded), all CPUs, before and after the job.
DEV=/dev/vda
arg() { sed -n "s/.*vblk\.$1=\([0-9:]*\).*/\1/p" /proc/cmdline; }
RT=$(arg runtime); RT=${RT:-5}
JOBS=$(arg jobs); JOBS=${JOBS:-2}
QDS=$(arg qds); QDS=${QDS:-1:32}
BLOCK=$(arg block); BLOCK=${BLOCK:-1}
SETTLE=$(arg settle); SETTLE=${SETTLE:-0}
if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi
set -- $(echo "$QDS" | tr ':' ' ')
NQD=$#

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
j=0
while [ "$j" -lt "$JOBS" ]; do
    # Job j's queue depth: the (j / BLOCK)-th of the list, in turn.
    i=$(( (j / BLOCK) % NQD + 1 ))
    eval qd=\${$i}
    echo "VBLK-PERF-START: job=$j qd=$qd"
    sleep "$SETTLE"
    b=$(irq_sum)
    fio --name="j$j" --eta=never --filename=$DEV --direct=1 --ioengine=$ENG \
        --rw=randread --bs=4k --iodepth="$qd" --size=64M --norandommap \
        --runtime="$RT" --time_based --output-format=json --output=/tmp/p.json
    rc=$?
    a=$(irq_sum)
    if [ "$rc" != 0 ]; then
        fail="$fail j$j"
        echo "VBLK-PERF: job=$j qd=$qd failed"
        j=$((j + 1))
        continue
    fi
    ios=$(jget /tmp/p.json read total_ios)
    iops=$(jget /tmp/p.json read iops)
    lat=$(awk '/"lat_ns" : \{/ { f = 1 } f && $1 == "\"mean\"" { v = $3; gsub(/[^0-9.]/, "", v); print v / 1000; exit }' /tmp/p.json)
    irqs=$((a - b))
    per=$(awk -v i="$irqs" -v n="$ios" 'BEGIN { if (n > 0) printf "%.3f", i / n; else print "nan" }')
    echo "VBLK-PERF: job=$j qd=$qd iops=$iops lat_us=$lat ios=$ios irqs=$irqs irqs_per_io=$per"
    j=$((j + 1))
done
if [ -z "$fail" ]; then
    echo "VBLK-RESULT: PASS irq-perf"
else
    echo "VBLK-RESULT: FAIL irq-perf$fail"
fi
