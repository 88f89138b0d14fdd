#!/usr/bin/env bash
# wb profile: run.sh BUILD [perf]
B=${1:-/work/main/build}; PERF=${2:-}
D=/dev/shm/wbp; rm -rf $D; mkdir -p $D; cd $D
[[ -f /dev/shm/wbp-src.raw ]] || dd if=/dev/urandom of=/dev/shm/wbp-src.raw bs=1M count=1024 status=none
cp /dev/shm/wbp-src.raw src.raw; truncate -s 1G t.raw
taskset -c 1 $B/vblkd --disk t.raw --nbd unix:$D/T.nbd,incoming --cache none --control $D/t.ctl >t.log 2>&1 & TP=$!
taskset -c 0 $B/vblkd --disk src.raw --socket $D/s.vhost --cache none --control $D/s.ctl >s.log 2>&1 & SP=$!
for i in $(seq 200); do [[ -S $D/s.vhost && -S $D/T.nbd ]] && break; sleep 0.05; done
[[ -z ${NOMIR:-} ]] && $B/vblkctl --control s.ctl mirror start m --target "nbd+unix:///?socket=$D/T.nbd" --mode write-blocking >/dev/null
[[ -z ${NOMIR:-} ]] && for i in $(seq 400); do $B/vblkctl --control s.ctl mirror list | grep -q '"ready": true' && break; sleep 0.1; done
if [[ -n $PERF ]]; then (sleep 2; perf ${PERFCMD:-record -g -o $D/perf.data} -p $SP -- sleep 4 >$D/perf.out 2>&1) & fi
c0=$(awk '{print $14+$15}' /proc/$SP/stat)
taskset -c 1 $B/vblk-bench --socket $D/s.vhost --rw randwrite --bs 4k --iodepth 16 --runtime 7 --ramp 1 2>&1 | grep -iE "iops" | head -2
c1=$(awk '{print $14+$15}' /proc/$SP/stat)
[[ -z ${NOMIR:-} ]] && $B/vblkctl --control s.ctl mirror list | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin)["mirrors"][0]; print("wt", d["written_through"], "left", d["left_to_job"])'
echo "source cpu ticks: $((c1-c0))"
[[ -n $PERF ]] && sleep 1
kill $SP $TP; wait $SP $TP 2>/dev/null
