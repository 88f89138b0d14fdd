#!/usr/bin/env bash
# Description: per-disk QoS (vblkd --limit, --qos-group; vblkctl limits,
# set-limits), by counters with loose bounds, vblk-bench as the driver on
# the null backend: the limit is held within 20 % over 2 s at QD32; while
# throttled the queue asks for no kick and no polling window finds work
# (kicks and poll hits a few percent of requests at most); set-limits
# changes the rate with the client connected, 0 removes the limit; two
# vblkd in one group share its budget (sum within 20 %, each a share), a
# member killed with SIGKILL does not break the group, the last member out
# removes it; a joiner with other limits is refused in one line; bad
# --limit strings are one-line errors that create nothing; the limits go
# across an upgrade in place; stats and metrics show them.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
BUILD=${1:?usage: test_qos.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench CTL=$BUILD/vblkctl
tmp=$(mktemp -d /tmp/vblk-qos.XXXXXX)
export RUNTIME_DIRECTORY=$tmp/rt
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }
check() {	# check NAME PYTHON-EXPR (j: bench JSON, a/b: stats before/after)
    local name=$1 expr=$2
    if python3 - "$expr" "${J:-{\}}" "${A:-{\}}" "${B:-{\}}" <<'EOF'
import json, sys
expr = sys.argv[1]
j, a, b = (json.loads(x) for x in sys.argv[2:5])
def q(s, k): return sum(x[k] for x in s.get('queues', []))
def d(k): return q(b, k) - q(a, k)
def disk(k): return b['disk'][k] - a['disk'][k]
sys.exit(0 if eval(expr) else 1)
EOF
    then pass "$name"; else fail "$name" "j=${J:0:200} stats-delta-queues=$(python3 -c '
import json,sys
a,b=json.loads(sys.argv[1]),json.loads(sys.argv[2])
print({k: sum(x[k] for x in b["queues"]) - sum(x[k] for x in a["queues"]) for k in ("requests","kicks","poll_hits","throttled_requests")})' "${A:-{\"queues\":[]\}}" "${B:-{\"queues\":[]\}}" 2>/dev/null)"; fi
}
start() {	# start NAME ARGS...: a null disk on $tmp/NAME.sock, control NAME.ctl
    local n=$1; shift
    "$VBLKD" --socket "$tmp/$n.sock" --control "$tmp/$n.ctl" --backend null --size 1G \
        "$@" >"$tmp/$n.log" 2>&1 &
    pids+=($!)
    eval "pid_$n=$!"
    for _ in $(seq 100); do [[ -S $tmp/$n.ctl ]] && return 0; sleep 0.05; done
    fail "start-$n" "$(tail -3 "$tmp/$n.log")"; return 1
}
stats() { "$CTL" --control "$tmp/$1.ctl" stats; }
bench() {	# bench NAME ARGS...
    local n=$1; shift
    "$BENCH" --socket "$tmp/$n.sock" --bs 4k --ramp 0 --json "$@"
}

# 1. The limit held, no kick or poll hit while throttled.
if start a --limit iops-total=1000 --queues 2; then
    A=$(stats a); J=$(bench a --rw randread --iodepth 32 --numjobs 2 --runtime 2); B=$(stats a)
    check limit-held-within-20pc "800 <= j['iops'] <= 1200 and j['errors'] == 0"
    check limit-throttled-requests-counted "disk('throttled_requests') > 100 and disk('throttled_ns') > 0 and d('throttled_requests') == disk('throttled_requests')"
    check limit-no-kicks-no-polling-while-throttled "d('kicks') + d('poll_hits') < 0.1 * d('requests')"
    check limit-both-queues-served "all(y['requests'] - x['requests'] > 600 for x, y in zip(a['queues'], b['queues']))"
    # 2. set-limits with the client connected.
    J=""; A=""; B=""
    bench a --rw randread --iodepth 32 --runtime 4 >"$tmp/j2" &
    bp=$!
    sleep 2
    "$CTL" --control "$tmp/a.ctl" set-limits iops-total=4000 >"$tmp/set.out"
    A=$(stats a); sleep 1; B=$(stats a)
    wait $bp
    J=$(cat "$tmp/j2")
    check set-limits-changes-the-rate "3200 <= d('requests') <= 4800 and j['errors'] == 0"
    L=$("$CTL" --control "$tmp/a.ctl" limits)
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["limits"] == "iops-total=4000" and d["buckets"]["iops-total"]["avg"] == 4000 else 1)' "$L" &&
        pass limits-shows-them || fail limits-shows-them "$L"
    "$CTL" --control "$tmp/a.ctl" metrics >"$tmp/m.txt"
    grep -q '^vblkd_disk_limit_iops 4000$' "$tmp/m.txt" && grep -q '^vblkd_disk_throttled_requests_total ' "$tmp/m.txt" &&
        pass metrics-show-limits || fail metrics-show-limits "$(grep limit "$tmp/m.txt" | head -3)"
    "$CTL" --control "$tmp/a.ctl" set-limits iops-total=0 >/dev/null
    A=$(stats a); J=$(bench a --rw randread --iodepth 32 --runtime 1); B=$(stats a)
    check set-limits-0-removes "j['iops'] > 20000 and disk('throttled_requests') == 0"
    out=$("$CTL" --control "$tmp/a.ctl" set-limits iops-total=10,iops-read=5 2>&1); rc=$?
    [[ $rc -ne 0 && $out == *"cannot be combined"* ]] && pass set-limits-bad-refused || fail set-limits-bad-refused "$rc $out"
    # 3. Across an upgrade in place: the limits as set, not as started.
    "$CTL" --control "$tmp/a.ctl" set-limits iops-total=2000 >/dev/null
    if "$CTL" --control "$tmp/a.ctl" upgrade >"$tmp/up.out" 2>&1; then
        np=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$tmp/up.out" 2>/dev/null)
        [[ -n $np ]] && pids+=("$np")
        L=$("$CTL" --control "$tmp/a.ctl" limits)
        [[ $L == *'"limits": "iops-total=2000"'* ]] && pass limits-kept-across-upgrade || fail limits-kept-across-upgrade "$L"
    else
        fail limits-kept-across-upgrade "$(cat "$tmp/up.out")"
    fi
fi

# 4. A group of two: one budget, each a share; a killed member leaves it
#    working; the last out removes it.
A=""; B=""
if start g1 --qos-group t1 --limit iops-total=2000 && start g2 --qos-group t1; then
    bench g1 --rw randread --iodepth 32 --runtime 3 >"$tmp/jg1" &
    b1=$!
    bench g2 --rw randread --iodepth 32 --runtime 3 >"$tmp/jg2" &
    b2=$!
    wait $b1 $b2
    python3 - "$(cat "$tmp/jg1")" "$(cat "$tmp/jg2")" <<'EOF' && pass group-shares-one-budget || fail group-shares-one-budget "$(head -c 100 "$tmp/jg1") / $(head -c 100 "$tmp/jg2")"
import json, sys
x, y = (json.loads(s)["iops"] for s in sys.argv[1:3])
sys.exit(0 if 1600 <= x + y <= 2400 and min(x, y) >= 0.3 * (x + y) else 1)
EOF
    out=$("$VBLKD" --socket "$tmp/g3.sock" --backend null --qos-group t1 --limit iops-total=5 2>&1); rc=$?
    [[ $rc -ne 0 && $(wc -l <<<"$out") -eq 1 && $out == *"set-limits --group"* && ! -e $tmp/g3.sock ]] &&
        pass group-other-limits-refused || fail group-other-limits-refused "$rc $out"
    # A member killed while its client is throttled.
    bench g1 --rw randread --iodepth 32 --runtime 3 >/dev/null 2>&1 &
    b1=$!
    sleep 0.5
    kill -9 "$pid_g1"; wait "$pid_g1" 2>/dev/null; wait $b1 2>/dev/null
    J=$(bench g2 --rw randread --iodepth 32 --runtime 2)
    check group-survives-a-killed-member "1600 <= j['iops'] <= 2400 and j['errors'] == 0"
    out=$("$CTL" --control "$tmp/g2.ctl" set-limits iops-total=100 2>&1)
    [[ $out == *"set-limits --group"* ]] && pass group-set-limits-needs-group || fail group-set-limits-needs-group "$out"
    "$CTL" --control "$tmp/g2.ctl" set-limits --group iops-total=3000 >/dev/null &&
        [[ $("$CTL" --control "$tmp/g2.ctl" limits) == *'"group": "t1"'* ]] &&
        pass group-set-limits || fail group-set-limits
    kill "$pid_g2"; wait "$pid_g2" 2>/dev/null
    [[ ! -e $RUNTIME_DIRECTORY/qos/t1 ]] && pass group-removed-by-last-member ||
        fail group-removed-by-last-member "$(ls -l "$RUNTIME_DIRECTORY/qos")"
fi

# 5. Bad --limit strings: one line, exit 1, no socket.
for bad in "iops-total" "iops-total=x" "iops-tota=5" "iops-total=10,iops-write=5" \
           "iops-total-max=5" "bps-read=1M,bps-read-max=1K"; do
    out=$("$VBLKD" --socket "$tmp/bad.sock" --backend null --limit "$bad" 2>&1); rc=$?
    if [[ $rc -eq 1 && $(wc -l <<<"$out") -eq 1 && $out == vblkd:*"--limit"* && ! -e $tmp/bad.sock ]]; then
        pass "bad-limit-one-line ($bad)"
    else
        fail "bad-limit-one-line ($bad)" "rc=$rc $out"
    fi
done
exit 0
