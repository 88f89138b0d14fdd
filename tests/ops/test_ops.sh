#!/usr/bin/env bash
# Description: running vblkd in production, watched: vblkd --metrics serves
# GET /metrics that promtool accepts, with the format's content type; its
# counters move with I/O driven by vblk-bench and agree with vblkctl stats;
# the frontend gauge and the disk size follow connections and resize;
# the listener passes to the new process on vblkctl upgrade;
# other paths 404, other methods 405; vblkctl metrics prints text that
# promtool accepts; an idle daemon with a scraper connected uses no CPU;
# a busy port or a bad address is one line and exit 1 with nothing left
# behind; the example alert rules pass promtool check rules and promtool
# test rules; I/O accounting: per operation, requests, bytes and the
# latency histogram's _count are exactly what vblk-bench did, _sum is
# vblkctl stats' total_ns; vblkctl iostat prints a line per interval, and
# one line and exit 1 for bad values or a daemon that goes away.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
BUILD=${1:?usage: test_ops.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench CTL=$BUILD/vblkctl
top=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d /tmp/vblk-ops.XXXXXX)
dpid="" bpid="" ipid="" npid="" spid=""
cleanup() {
    for p in $dpid $bpid $ipid $npid $spid; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null; rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

for tool in curl promtool python3; do
    command -v $tool >/dev/null || { echo "SKIP: ops ($tool not installed: scripts/deps.sh ops)"; exit 0; }
done
# A bad address fails either way; without libmicrohttpd it says so first.
if [[ $("$VBLKD" --socket "$tmp/x.sock" --backend null --metrics x 2>&1) == *"--metrics needs libmicrohttpd"* ]]; then
    echo "SKIP: ops (vblkd built without libmicrohttpd)"; exit 0
fi

head -c $((16 << 20)) /dev/urandom >"$tmp/disk.img"

start() {	# start ARGS...: vblkd on the image, control socket, metrics on a free port
    rm -f "$tmp/d.sock" "$tmp/c.sock"
    "$VBLKD" --socket "$tmp/d.sock" --control "$tmp/c.sock" --disk "$tmp/disk.img" \
        --metrics 127.0.0.1:0 "$@" >"$tmp/vblkd.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && break; sleep 0.05; done
    port=$(grep -o 'metrics at .* (port [0-9]*)' "$tmp/vblkd.log" | grep -o '[0-9]*)$' | tr -d ')')
    [[ -S $tmp/d.sock && -n $port ]] && return 0
    fail start "$(tail -3 "$tmp/vblkd.log")"; return 1
}
stop() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; dpid=""; }
scrape() { curl -sf "http://127.0.0.1:$port${1:-/metrics}"; }
# promcheck NAME: stdin passes promtool check metrics with nothing to say
promcheck() {
    local out rc=0
    out=$(promtool check metrics 2>&1) || rc=$?
    if ((rc == 0)) && [[ -z $out ]]; then pass "$1"; else fail "$1" "promtool rc=$rc: $out"; fi
}
# value TEXT NAME{LABELS}: the sample's value
value() { awk -v k="$2" '$1 == k { print $2 }' <<<"$1"; }

start || exit 0

# 1. The endpoint: promtool accepts it; the format's content type.
scrape | promcheck metrics-http-passes-promtool
ctype=$(curl -s -o /dev/null -w '%{content_type}' "http://127.0.0.1:$port/metrics")
[[ $ctype == "text/plain; version=0.0.4; charset=utf-8" ]] &&
    pass metrics-http-content-type || fail metrics-http-content-type "$ctype"

# 2. Wrong paths and methods (HEAD is GET without the body).
bad=""
for t in "GET / 404" "GET /metricsx 404" "GET /other/metrics 404" "POST /metrics 405" \
         "PUT /metrics 405" "DELETE /metrics 405" "GET /metrics?x=1 200"; do
    read -r m path want <<<"$t"
    got=$(curl -s -o /dev/null -w '%{http_code}' -X "$m" "http://127.0.0.1:$port$path")
    [[ $got == "$want" ]] || bad+="$m $path: $got, want $want; "
done
got=$(curl -s -I -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/metrics")
[[ $got == 200 ]] || bad+="HEAD /metrics: $got; "
[[ -z $bad ]] && pass metrics-http-404-405 || fail metrics-http-404-405 "$bad"
allow=$(curl -s -D - -o /dev/null -X POST "http://127.0.0.1:$port/metrics" | tr -d '\r' |
        awk -F': ' 'tolower($1) == "allow" { print $2 }')
[[ $allow == "GET, HEAD" ]] && pass metrics-http-405-allow || fail metrics-http-405-allow "$allow"

# 2b. Slow clients (slowloris: headers a line at a time, never ending)
#     from one address hold a few connections at most: a scraper from
#     another address still gets its answer (16 such clients once took
#     every connection vblkd would accept).
python3 - "$port" >"$tmp/slow.out" 2>&1 <<'PY' &
import socket, sys, time
conns = []
for i in range(24):
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    try:
        s.connect(("127.0.0.1", int(sys.argv[1])))
        s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        conns.append(s)
    except OSError:
        pass
for _ in range(8):
    time.sleep(0.5)
    for s in conns:
        try:
            s.send(b"X-Slow: 1\r\n")
        except OSError:
            pass
PY
slow=$!
sleep 1
if got=$(curl -s -m 3 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/metrics") &&
   [[ $got == 200 ]]; then
    pass metrics-http-slow-clients-do-not-lock-out
else
    fail metrics-http-slow-clients-do-not-lock-out "scrape got ${got:-nothing} with 24 slow clients on 127.0.0.2"
fi
kill "$slow" 2>/dev/null; wait "$slow" 2>/dev/null

# 2c. Scrapes as fast as one connection can ask get the same rendering
#     for 100 ms (each rendering reads every iothread's counters): at most
#     ~10 different ones a second, where each of 200 differed before (the
#     process CPU time moves with every rendering).
t0=$(date +%s%N)
curl -s $(printf "http://127.0.0.1:$port/metrics %.0s" $(seq 200)) >"$tmp/flood.txt"
t1=$(date +%s%N)
n=$(grep -c '^vblkd_process_cpu_seconds_total ' "$tmp/flood.txt")
distinct=$(grep '^vblkd_process_cpu_seconds_total ' "$tmp/flood.txt" | sort -u | wc -l)
most=$(( (t1 - t0) / 100000000 + 2 ))
if ((n == 200 && distinct >= 1 && distinct <= most)); then
    pass metrics-http-renders-at-most-10-per-second
else
    fail metrics-http-renders-at-most-10-per-second "$n scrapes in $(( (t1 - t0) / 1000000 )) ms, $distinct renderings (at most $most)"
fi

# 3. I/O moves the counters: requests by exactly what vblk-bench
#    submitted, kicks, calls, the iothread's CPU; no counter goes back.
#    While the frontend is connected the gauge says 1; after it, 0, and
#    one more connection counted.
M0=$(scrape)
"$BENCH" --socket "$tmp/d.sock" --bs 4k --ramp 0 --json --rw randrw --iodepth 8 \
    --runtime 1 --size 16M --hold 2 >"$tmp/bench.json" 2>"$tmp/bench.err" &
bpid=$!
for _ in $(seq 60); do sleep 0.05; grep -q requests_submitted "$tmp/bench.json" && break; done
MC=$(scrape)
wait "$bpid"; brc=$?; bpid=""
M1=$(scrape)
S1=$("$CTL" --control "$tmp/c.sock" stats)
if ((brc == 0)) && python3 - "$M0" "$M1" "$MC" "$(cat "$tmp/bench.json")" "$S1" <<'PY'
import json, sys

def parse(text):
    out, types = {}, {}
    for l in text.splitlines():
        if l.startswith("# TYPE "):
            _, _, name, t = l.split(" ")
            types[name] = t
        elif l and not l.startswith("#"):
            k, v = l.rsplit(" ", 1)
            out[k] = float(v)
    return out, types

m0, types = parse(sys.argv[1])
m1, _ = parse(sys.argv[2])
mc, _ = parse(sys.argv[3])
r = json.loads(sys.argv[4])
s = json.loads(sys.argv[5])
q = 'queue="0"'
d = lambda k: m1[k] - m0[k]
bad = []
for k in m0:
    name = k.split("{")[0]
    fam = name if name in types else name.rsplit("_", 1)[0]	# a histogram's _bucket...
    if types[fam] in ("counter", "histogram") and m1[k] < m0[k]:
        bad.append("%s went back: %s -> %s" % (k, m0[k], m1[k]))
checks = {
    "requests = submitted": d('vblkd_queue_requests_total{%s}' % q) == r["requests_submitted"] > 100,
    "reads + writes = submitted": d('vblkd_disk_requests_total{front="virtio-blk",op="read"}') +
        d('vblkd_disk_requests_total{front="virtio-blk",op="write"}') == r["requests_submitted"],
    "disk busy moved": d("vblkd_disk_busy_seconds_total") > 0,
    "kicks moved": d('vblkd_queue_kicks_total{%s}' % q) > 0,
    "calls moved": d('vblkd_queue_calls_total{%s}' % q) > 0,
    "iothread cpu moved": d('vblkd_iothread_cpu_seconds_total{iothread="0"}') > 0,
    "iothread busy moved": d('vblkd_iothread_busy_seconds_total{iothread="0"}') > 0,
    "process cpu moved": d("vblkd_process_cpu_seconds_total") > 0,
    "no bad requests": d('vblkd_queue_bad_requests_total{%s}' % q) == 0,
    "connected while held": mc["vblkd_frontend_connected"] == 1 and m0["vblkd_frontend_connected"] == 0,
    "disconnected after": m1["vblkd_frontend_connected"] == 0,
    "one connection more": d("vblkd_frontend_connections_total") == 1,
    # Idle now: the same numbers as the control socket's stats.
    "requests = stats": m1['vblkd_queue_requests_total{%s}' % q] == s["queues"][0]["requests"],
    "kicks = stats": m1['vblkd_queue_kicks_total{%s}' % q] == s["queues"][0]["kicks"],
    "calls = stats": m1['vblkd_queue_calls_total{%s}' % q] == s["queues"][0]["calls"],
    "hold seconds = stats ns": m1['vblkd_queue_hold_seconds_total{%s}' % q] * 1e9 - s["queues"][0]["hold_ns_total"] < 1000,
    "poll max = stats": m1["vblkd_poll_max_seconds"] * 1e9 == s["poll"]["max_ns"],
}
bad += [k for k, ok in checks.items() if not ok]
if bad:
    print("  ", bad, {k: (m0.get(k), m1.get(k)) for k in m1 if 'queue="0"' in k or "frontend" in k})
sys.exit(1 if bad else 0)
PY
then pass metrics-counters-move-with-io; else fail metrics-counters-move-with-io "bench rc=$brc $(tail -2 "$tmp/bench.err")"; fi

# 4. vblkctl metrics: the same text (not JSON), which promtool accepts;
#    the same families as the endpoint.
"$CTL" --control "$tmp/c.sock" metrics >"$tmp/ctl.txt"; rc=$?
((rc == 0)) && promcheck vblkctl-metrics-passes-promtool <"$tmp/ctl.txt" ||
    fail vblkctl-metrics-passes-promtool "rc=$rc"
[[ $(grep '^# TYPE' "$tmp/ctl.txt") == "$(scrape | grep '^# TYPE')" ]] && ! grep -q '^{' "$tmp/ctl.txt" &&
    pass vblkctl-metrics-same-families || fail vblkctl-metrics-same-families

# 5. Resize shows in the disk size (once the last rendering, 100 ms at
#    most, has made way).
"$CTL" --control "$tmp/c.sock" resize 32M >/dev/null
sleep 0.15
[[ $(value "$(scrape)" vblkd_disk_size_bytes) == 33554432 ]] &&
    pass metrics-disk-size-after-resize || fail metrics-disk-size-after-resize "$(scrape | grep disk_size)"

# 6. Idle with a scraper's connection open and silent: MHD's timeouts are
#    timers in the main loop, not a spin.  Under 5% of a CPU over 2 s.
python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', $port)); time.sleep(4)" &
ipid=$!
sleep 0.5
t0=$(awk '{print $14 + $15}' "/proc/$dpid/stat")
sleep 2
t1=$(awk '{print $14 + $15}' "/proc/$dpid/stat")
kill "$ipid" 2>/dev/null; wait "$ipid" 2>/dev/null; ipid=""
ms=$(( (t1 - t0) * 1000 / $(getconf CLK_TCK) ))
((ms < 100)) && pass metrics-idle-uses-no-cpu || fail metrics-idle-uses-no-cpu "${ms} ms of CPU in 2 s"
scrape >/dev/null && pass metrics-after-idle-client || fail metrics-after-idle-client

# 7. A busy port: one line, exit 1, no socket or control socket created.
rc=0
"$VBLKD" --socket "$tmp/d2.sock" --control "$tmp/c2.sock" --backend null \
    --metrics "127.0.0.1:$port" >"$tmp/out" 2>"$tmp/err" || rc=$?
if ((rc == 1)) && [[ $(wc -l <"$tmp/err") == 1 && ! -s $tmp/out ]] &&
    grep -q "^vblkd: --metrics 127.0.0.1:$port: the port is in use by another process" "$tmp/err" &&
    [[ ! -e $tmp/d2.sock && ! -e $tmp/c2.sock ]]; then
    pass metrics-busy-port-one-line
else
    fail metrics-busy-port-one-line "rc=$rc $(cat "$tmp/err") $(ls "$tmp")"
fi
stop

# 8. Bad addresses: one line each, exit 1, nothing left behind.
for a in "9720" "127.0.0.1:65536" "127.0.0.1:x" "::1:9720" "localhost:9720" "[::1" ""; do
    rc=0
    "$VBLKD" --socket "$tmp/d3.sock" --control "$tmp/c3.sock" --backend null \
        --metrics "$a" >/dev/null 2>"$tmp/err" || rc=$?
    if ! ((rc == 1)) || [[ $(wc -l <"$tmp/err") != 1 || -e $tmp/d3.sock || -e $tmp/c3.sock ]] ||
        ! grep -q "^vblkd: --metrics " "$tmp/err"; then
        fail metrics-bad-address-one-line "'$a': rc=$rc $(cat "$tmp/err")"; break
    fi
done
((rc == 1)) && pass metrics-bad-address-one-line

# 9. Upgrade in place: the new process takes the metrics listener too, so
#    the same port answers throughout, now with the new process's start.
start && {
    before=$(value "$(scrape)" vblkd_start_time_seconds)
    sleep 0.1
    if "$CTL" --control "$tmp/c.sock" upgrade >"$tmp/up.out" 2>&1; then
        npid=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$tmp/up.out")
        wait "$dpid" 2>/dev/null; dpid=""
        after=$(value "$(scrape)" vblkd_start_time_seconds)
        if [[ -n $after && $after != "$before" ]] && kill -0 "$npid" 2>/dev/null &&
            [[ $(readlink "/proc/$npid/exe") == "$(readlink -f "$VBLKD")" ]] &&
            scrape | promtool check metrics >/dev/null 2>&1; then
            pass metrics-survive-upgrade-in-place
        else
            fail metrics-survive-upgrade-in-place "start time $before -> ${after:-no answer}"
        fi
        kill -TERM "$npid" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$npid" 2>/dev/null || break; sleep 0.05; done
        npid=""
    else
        fail metrics-survive-upgrade-in-place "$(cat "$tmp/up.out")"
        stop
    fi
}

# 10. Every address (:0) takes IPv4 and, where there is IPv6, IPv6 too.
rm -f "$tmp/d.sock"
"$VBLKD" --socket "$tmp/d.sock" --backend null --metrics :0 >"$tmp/vblkd.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && break; sleep 0.05; done
port=$(grep -o '(port [0-9]*)' "$tmp/vblkd.log" | tr -dc 0-9)
# (curl's output whole before grep -q: a grep that stops reading early
# would fail curl's write, and pipefail the test.)
if [[ $(curl -sf "http://127.0.0.1:$port/metrics") == *$'\nvblkd_build_info'* ]]; then
    if python3 -c "import socket; socket.create_connection(('::1', $port)).close()" 2>/dev/null; then
        [[ $(curl -sf "http://[::1]:$port/metrics") == *$'\nvblkd_build_info'* ]] &&
            pass metrics-every-address-v4-and-v6 || fail metrics-every-address-v4-and-v6 "no answer on [::1]"
    else
        pass "metrics-every-address-v4-and-v6 (no IPv6 here: IPv4 only)"
    fi
else
    fail metrics-every-address-v4-and-v6 "$(tail -2 "$tmp/vblkd.log")"
fi
stop

# 11. The example alerting rules (contrib/prometheus): valid, and their
#     unit tests pass.
out=$(promtool check rules "$top/contrib/prometheus/vblkd-alerts.yml" 2>&1) &&
    pass alert-rules-check || fail alert-rules-check "$out"
out=$(cd "$top/contrib/prometheus" && promtool test rules vblkd-alerts.test.yml 2>&1) &&
    pass alert-rules-unit-tests || fail alert-rules-unit-tests "$out"

# 12. I/O accounting: vblk-bench runs of known sizes (randread 4k,
#     randwrite 16k, flush, trim 8k): each operation's requests, bytes and
#     histogram _count (and +Inf bucket) are exactly what the client
#     completed, no errors, nothing in flight; the histogram's _sum is the
#     operation's total_ns of vblkctl stats as exact seconds; promtool
#     accepts the text.  On the null engine (completions at once) and on
#     an image through io_uring (completions later: time that is not 0).
start_plain() {	# start_plain ARGS...: vblkd with a control socket, no metrics
    rm -f "$tmp/d.sock" "$tmp/c.sock"
    "$VBLKD" --socket "$tmp/d.sock" --control "$tmp/c.sock" "$@" >"$tmp/vblkd.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $tmp/c.sock ]] && break; sleep 0.05; done
    [[ -S $tmp/c.sock ]] || { fail start "$(tail -3 "$tmp/vblkd.log")"; return 1; }
}
acct_check() {	# acct_check NAME VBLKD_ARGS...
    local name=$1 job ok=1; shift
    start_plain "$@" || return
    for job in "randread 4096" "randwrite 16384" "flush 4096" "trim 8192"; do
        set -- $job
        "$BENCH" --socket "$tmp/d.sock" --rw "$1" --bs "$2" --iodepth 4 --runtime 0.3 \
            --ramp 0 --size 8M --json >"$tmp/acct-$1.json" 2>"$tmp/bench.err" || {
            fail "$name" "vblk-bench --rw $1: $(tail -2 "$tmp/bench.err")"; ok=0; }
    done
    "$CTL" --control "$tmp/c.sock" metrics >"$tmp/acct.txt"
    "$CTL" --control "$tmp/c.sock" stats >"$tmp/acct-stats.json"
    stop
    ((ok)) || return
    promcheck "$name-passes-promtool" <"$tmp/acct.txt"
    if python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
m = {}
for l in open(tmp + "/acct.txt"):
    if l.strip() and not l.startswith("#"):
        k, v = l.rstrip("\n").rsplit(" ", 1)
        m[k] = v
disk = json.load(open(tmp + "/acct-stats.json"))["disk"]
runs = {op: json.load(open("%s/acct-%s.json" % (tmp, rw)))
        for op, rw in (("read", "randread"), ("write", "randwrite"), ("flush", "flush"),
                       ("discard", "trim"))}
def seconds(ns):	# as the metrics render ns: exact, no trailing zeros
    s = str(ns // 10**9)
    return s + ("." + ("%09d" % (ns % 10**9)).rstrip("0") if ns % 10**9 else "")
bad = []
for op in ("read", "write", "flush", "discard", "write_zeroes", "get_id"):
    r = runs.get(op)
    n = r["requests_completed"] if r else 0
    size = r["bs"] if r and op in ("read", "write", "discard") else 0
    if r and (r["errors"] or r["bad_used"] or n < 10):
        bad.append("%s: vblk-bench says errors %d, bad used %d, %d completed"
                   % (op, r["errors"], r["bad_used"], n))
    lab = '{front="virtio-blk",op="%s"}' % op
    st = disk["ops"][op]
    want = {
        "vblkd_disk_requests_total" + lab: str(n),
        "vblkd_disk_bytes_total" + lab: str(n * size),
        "vblkd_disk_errors_total" + lab: "0",
        "vblkd_disk_request_duration_seconds_count" + lab: str(n),
        'vblkd_disk_request_duration_seconds_bucket{front="virtio-blk",op="%s",le="+Inf"}' % op: str(n),
        "vblkd_disk_request_duration_seconds_sum" + lab: seconds(st["total_ns"]),
    }
    for k, v in want.items():
        if m.get(k) != v:
            bad.append("%s is %s, want %s" % (k, m.get(k), v))
    if (st["requests"], st["bytes"], sum(st["latency_buckets"])) != (n, n * size, n):
        bad.append("stats %s: %s" % (op, {k: st[k] for k in ("requests", "bytes", "errors")}))
if m.get("vblkd_disk_requests_in_flight") != "0" or disk["in_flight"] != 0:
    bad.append("in flight: %s" % m.get("vblkd_disk_requests_in_flight"))
if bad:
    print("  ", bad)
sys.exit(1 if bad else 0)
PY
    then pass "$name"; else fail "$name"; fi
}
acct_check acct-null-exact --backend null --size 64M
acct_check acct-io-uring-exact --disk "$tmp/disk.img"
if python3 -c '
import json, sys; d = json.load(open(sys.argv[1]))["disk"]
assert d["ops"]["read"]["total_ns"] > 0 and d["busy_ns"] > 0 and d["iothreads"] == 1' \
    "$tmp/acct-stats.json"; then
    pass acct-io-uring-time-counted
else
    fail acct-io-uring-time-counted "$(head -c 300 "$tmp/acct-stats.json")"
fi

# 13. vblkctl iostat during a vblk-bench run: --json, two lines of
#     numbers, reads moving, %util within 0..100; as text, a header then
#     a line; SIGINT ends it with 0; the daemon going away mid-way, one
#     line and exit 1.
start_plain --backend null --size 64M && {
    "$BENCH" --socket "$tmp/d.sock" --rw randread --iodepth 4 --runtime 4 --ramp 0 \
        --size 8M --json >/dev/null 2>&1 &
    bpid=$!
    sleep 0.3
    rc=0
    "$CTL" --control "$tmp/c.sock" iostat --count 2 --interval 0.5 --json >"$tmp/io.json" \
        2>"$tmp/io.err" || rc=$?
    if ((rc == 0)) && [[ ! -s $tmp/io.err ]] && python3 - "$tmp/io.json" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 2, lines
keys = ["r/s", "w/s", "rMB/s", "wMB/s", "r_await", "w_await", "aqu-sz", "%util", "p99",
        "f/s", "d/s"]
for l in lines:
    o = json.loads(l)
    assert list(o) == keys, o
    assert all(type(o[k]) in (int, float) for k in keys), o
    assert o["r/s"] > 0 and 0 <= o["%util"] <= 100 and o["w/s"] == 0, o
    assert abs(o["rMB/s"] - o["r/s"] * 4096 / 1048576) <= 0.01 + o["rMB/s"] * 0.001, o
PY
    then
        pass iostat-json-two-lines
    else
        fail iostat-json-two-lines "rc=$rc $(head -c 400 "$tmp/io.json") $(cat "$tmp/io.err")"
    fi
    rc=0
    "$CTL" --control "$tmp/c.sock" iostat --count 1 --interval 0.3 >"$tmp/io.txt" 2>&1 || rc=$?
    if ((rc == 0)) && [[ $(wc -l <"$tmp/io.txt") == 2 ]] &&
        [[ $(head -1 "$tmp/io.txt" | xargs) == "r/s w/s rMB/s wMB/s r_await w_await aqu-sz %util p99 f/s d/s" ]] &&
        [[ $(tail -1 "$tmp/io.txt" | wc -w) == 11 ]]; then
        pass iostat-text-header-and-line
    else
        fail iostat-text-header-and-line "rc=$rc $(cat "$tmp/io.txt")"
    fi
    "$CTL" --control "$tmp/c.sock" iostat --interval 0.2 >"$tmp/io.txt" 2>&1 &
    spid=$!
    sleep 0.7
    kill -INT "$spid"; rc=0; wait "$spid" || rc=$?; spid=""
    if ((rc == 0)) && (($(wc -l <"$tmp/io.txt") >= 2)) && ! grep -q "vblkctl:" "$tmp/io.txt"; then
        pass iostat-sigint-exits-0
    else
        fail iostat-sigint-exits-0 "rc=$rc $(cat "$tmp/io.txt")"
    fi
    wait "$bpid" 2>/dev/null; bpid=""

    "$CTL" --control "$tmp/c.sock" iostat --interval 0.2 --json >"$tmp/io.out" 2>"$tmp/io.err" &
    spid=$!
    sleep 0.5
    stop
    rc=0; wait "$spid" || rc=$?; spid=""
    if ((rc == 1)) && [[ $(wc -l <"$tmp/io.err") == 1 ]] &&
        grep -q "^vblkctl: iostat: vblkd went away" "$tmp/io.err"; then
        pass iostat-daemon-gone-one-line
    else
        fail iostat-daemon-gone-one-line "rc=$rc $(cat "$tmp/io.err")"
    fi
}

# 14. vblkctl iostat's bad values, and no daemon: one line, exit 1,
#     nothing on stdout.
start_plain --backend null --size 64M && {
    bad=""
    while IFS='|' read -r sock args want; do
        rc=0
        "$CTL" --control "$tmp/$sock" $args >"$tmp/out" 2>"$tmp/err" || rc=$?
        if ((rc != 1)) || [[ -s $tmp/out || $(wc -l <"$tmp/err") != 1 ]] ||
            ! grep -qF -- "$want" "$tmp/err" || ! grep -q "^vblkctl: " "$tmp/err"; then
            bad+="[$args] rc=$rc $(cat "$tmp/err" "$tmp/out"); "
        fi
    done <<'CASES'
c.sock|iostat --interval 0|--interval '0' is not a number of seconds > 0
c.sock|iostat --interval -1|--interval '-1' is not a number of seconds > 0
c.sock|iostat --interval abc|--interval 'abc' is not a number of seconds
c.sock|iostat --interval nan|--interval 'nan' is not a number of seconds
c.sock|iostat --interval 1e9|--interval '1e9' is not a number of seconds
c.sock|iostat --count 0|--count '0' must be 1
c.sock|iostat --count x|--count 'x' is not a number
c.sock|iostat --count -2|--count '-2' is not a number
c.sock|iostat --interval|option '--interval' needs a value
c.sock|stats --json|--interval, --count and --json go with iostat
c.sock|iostat extra|give one command
none.sock|iostat --count 1|cannot connect to
CASES
    [[ -z $bad ]] && pass iostat-bad-values-one-line || fail iostat-bad-values-one-line "$bad"
    stop
}
exit 0
