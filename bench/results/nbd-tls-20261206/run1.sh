#!/usr/bin/env bash
# run1.sh BIN MODE(plain|tls) -> prints "wall_s cpu_us_per_req"
set -u
BIN=$1 MODE=$2
sock=/tmp/tb/x-$$.sock
rm -f $sock
nbdarg="unix:$sock"
[[ $MODE == tls ]] && nbdarg="$nbdarg,tls=psk:/tmp/tb/keys.psk"
taskset -c 0 "$BIN" --nbd "$nbdarg" --disk /dev/shm/tb-disk.raw >/tmp/tb/srv-$$.log 2>&1 &
pid=$!
for _ in $(seq 300); do [[ -S $sock ]] && grep -q serving /tmp/tb/srv-$$.log && break; sleep 0.02; done
if [[ $MODE == tls ]]; then uri="nbds+unix://alice@/?socket=$sock&tls-psk-file=/tmp/tb/keys.psk"
else uri="nbd+unix:///?socket=$sock"; fi
tk=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' /proc/$pid/stat; }
c0=$(cpu)
t0=$(date +%s.%N)
taskset -c 1 nbdcopy --connections=1 --requests=32 --request-size=4096 "$uri" null: || echo "nbdcopy failed" >&2
t1=$(date +%s.%N)
c1=$(cpu)
kill $pid; wait $pid 2>/dev/null
rm -f $sock /tmp/tb/srv-$$.log
awk -v t0=$t0 -v t1=$t1 -v c0=$c0 -v c1=$c1 -v tk=$tk 'BEGIN{printf "%.2f %.1f\n", t1-t0, (c1-c0)/tk*1e6/262144}'
