#!/usr/bin/env bash
# Description: running vblkd in production, watched: vblkd --metrics serves
# GET /metrics that promtool accepts, with the format's content type; its
# counters move with I/O driven by vblk-bench and agree with vblkctl stats;
# the frontend gauge and the disk size follow connections and resize;
# the listener passes to the new process on vblkctl upgrade;
# other paths 404, other methods 405; vblkctl metrics prints text that
# promtool accepts; an idle daemon with a scraper connected uses no CPU;
# a busy port or a bad address is one line and exit 1 with nothing left
# behind.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
BUILD=${1:?usage: test_ops.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench CTL=$BUILD/vblkctl
tmp=$(mktemp -d /tmp/vblk-ops.XXXXXX)
dpid="" bpid="" ipid="" npid=""
cleanup() {
    for p in $dpid $bpid $ipid $npid; do kill "$p" 2>/dev/null; done
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
    if types[name] == "counter" and m1[k] < m0[k]:
        bad.append("%s went back: %s -> %s" % (k, m0[k], m1[k]))
checks = {
    "requests = submitted": d('vblkd_queue_requests_total{%s}' % q) == r["requests_submitted"] > 100,
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
exit 0
