#!/usr/bin/env bash
# run4.sh [--no-yield]: a light guest (QD1, 1000 writes/s) and one nbdcopy pull of the view: pull seconds
B=/work/main/build
img=/dev/shm/mybk-cbw.raw
cp /dev/shm/mybk-cbw.pristine $img
rm -rf /dev/shm/mybk-cbw.scratch; mkdir -p /dev/shm/mybk-cbw.scratch
rm -f s.sock c.sock v.sock
taskset -c 1 $B/vblkd --socket s.sock --disk $img --cache none --control c.sock --log-level warn > d.log 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S c.sock && -S s.sock ]] && break; sleep 0.05; done
$B/vblkctl --control c.sock backup start b1 --nbd unix:$PWD/v.sock --scratch /dev/shm/mybk-cbw.scratch "$@" >/dev/null
taskset -c 0 $B/vblk-bench --socket s.sock --rw randwrite --bs 4k --iodepth 1 --rate-iops 1000 --runtime 8 --ramp 0 --json > lb.json &
bp=$!
sleep 0.5
t0=$(date +%s%N)
taskset -c 0 nbdcopy "nbd+unix:///b1?socket=$PWD/v.sock" null:
t1=$(date +%s%N)
wait $bp
echo "pull_ms $(((t1-t0)/1000000)) yielded $($B/vblkctl --control c.sock nbd list | python3 -c 'import json,sys; print(json.load(sys.stdin)["stats"]["yielded"])') guest_iops $(python3 -c 'import json; print(int(json.load(open("lb.json"))["iops"]))')"
kill $pid; wait $pid
