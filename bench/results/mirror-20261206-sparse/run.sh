#!/usr/bin/env bash
# Time to ready and target allocation of a mirror from a half-allocated
# qcow2 disk (1 GiB, every other 64 KiB cluster at random, 513 MiB of
# data) to a new local raw file, before (cb02bf9~1) and after (cb02bf9:
# runs cut where the qcow2's block status turns between data and zeroes).
# Usage: run.sh BEFORE_BUILD AFTER_BUILD (vblkd pinned to CPU 0; tmpfs).
set -u
cd "$(mktemp -d /tmp/mir-sparse.XXXXXX)"
qemu-img create -q -f qcow2 s.qcow2 1G
/usr/bin/python3 - <<'PY'
import random, subprocess
r = random.Random(1); cmds = []
for i in range(16384):
    if r.random() < 0.5:
        cmds += ['-c', 'write -P %d %d 65536' % (i % 250 + 1, i * 65536)]
subprocess.run(['qemu-io', '-f', 'qcow2'] + cmds + ['s.qcow2'], stdout=subprocess.DEVNULL, check=True)
PY
run() {
    local B=$1 P o
    rm -f t.raw c.ctl
    taskset -c 0 "$B/vblkd" --disk s.qcow2 --nbd unix:$PWD/rw.sock --control $PWD/c.ctl >d.log 2>&1 & P=$!
    sleep 0.3
    "$B/vblkctl" --control c.ctl mirror start m --target "$PWD/t.raw" >/dev/null
    for _ in $(seq 200); do
        o=$("$B/vblkctl" --control c.ctl mirror list | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin)["mirrors"][0]; print(d["ready_seconds"], d["copied_bytes"]>>20, d["zeroed_bytes"]>>20) if d["ready"] else print("")')
        [[ -n $o ]] && break; sleep 0.05
    done
    kill $P; wait $P
    echo "$2 ready_s=${o% * *} copied_MiB,zeroed_MiB=${o#* } target_alloc=$(du -m t.raw | cut -f1)MiB"
}
for rep in 1 2 3; do run "$1" before; run "$2" after; done
