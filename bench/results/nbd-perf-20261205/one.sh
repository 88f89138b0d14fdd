#!/bin/bash
# one.sh BIN QD [perf|strace|none] -> fio line + server stats
BIN=$1; QD=$2; MODE=${3:-none}; RT=${RT:-3}
S=/tmp/np/s.$$.sock; rm -f $S
taskset -c 1 $BIN --disk /dev/shm/np-disk.raw --cache ${CACHE:-auto} --log-level warn --nbd unix:$S 2>/tmp/np/srv.log &
P=$!
for i in $(seq 100); do [ -S $S ] && break; python3 -c 'import time;time.sleep(0.02)'; done
c0=$(awk '{print $14+$15}' /proc/$P/stat)
case $MODE in
perf) perf stat -e context-switches,raw_syscalls:sys_enter,cpu-migrations -p $P -o /tmp/np/perf.$$ 2>/dev/null & PP=$!;;
strace) strace -c -f -p $P -o /tmp/np/strace.$$ 2>/dev/null & PP=$!;;
esac
taskset -c 0 fio --name=j --ioengine=nbd --uri="nbd+unix:///?socket=$S" --rw=randread --bs=4k --iodepth=$QD --time_based --runtime=$RT --ramp_time=0.5 --size=1g --output-format=json > /tmp/np/fio.$$ 2>&1
c1=$(awk '{print $14+$15}' /proc/$P/stat)
[ -n "$PP" ] && { kill -INT $PP; wait $PP; }
for t in /proc/$P/task/*; do echo "$(cat $t/comm) $(grep ctxt $t/status | awk '{printf "%s ", $2}') cpu $(awk '{print $14+$15}' $t/stat)"; done > /tmp/np/tasks.$$
kill $P; wait $P 2>/dev/null
python3 - /tmp/np/fio.$$ $c0 $c1 <<'PY'
import json,sys,os
t=open(sys.argv[1]).read(); j=json.loads(t[t.index('{'):])['jobs'][0]['read']
ios=j['total_ios']; cpu=(int(sys.argv[3])-int(sys.argv[2]))/os.sysconf('SC_CLK_TCK')
print("iops %.0f ios %d cpu/req %.2f us p50 %.1f us" % (j['iops'], ios, cpu*1e6/ios, j['clat_ns']['percentile']['50.000000']/1000))
PY
cat /tmp/np/tasks.$$
[ $MODE = perf ] && grep -E 'context|sys_enter|migr|elapsed' /tmp/np/perf.$$
[ $MODE = strace ] && head -20 /tmp/np/strace.$$
rm -f /tmp/np/*.$$ $S
