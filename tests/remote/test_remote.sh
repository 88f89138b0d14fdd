#!/usr/bin/env bash
# Description: vblkd on network disks, driven by vblk-bench: a Ceph RBD
# image (a throwaway single-node cluster, scripts/ceph-cluster.sh) and NBD
# exports (nbdkit's memory plugin on 127.0.0.1, qemu-nbd on a file over a
# unix socket).  Verified I/O on 1 and 2 queues; an OSD stopped and
# restarted under load, an NBD server killed under load (vblkd survives
# both and serves the next frontend; it reconnects to a server whose
# handshake ends inside libnbd's first call); every user mistake (bad URI or spec,
# missing pool or image, no cluster, no server) one line and exit 1 in
# bounded time, no socket left; upgrade in place under verified I/O on
# each.  Every step runs under timeout.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
BUILD=${1:?usage: test_remote.sh BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench CTL=$BUILD/vblkctl
top=$(cd "$(dirname "$0")/../.." && pwd)
CLUSTER=$top/scripts/ceph-cluster.sh
# A user mistake must be reported within this many seconds (vblkd gives a
# cluster or server that does not answer 10 s).
ERR_BOUND=20

pass() { echo "PASS: $1${2:+: $2}"; }
fail() { echo "FAIL: $1${2:+: $2}"; }
skip() { echo "SKIP: $1${2:+: $2}"; }

"$top/scripts/deps.sh" remote || { fail remote-deps "cannot install Ceph, nbdkit, qemu-nbd"; exit 1; }

tmp=$(mktemp -d /tmp/vblk-remote.XXXXXX)
ceph_dir=$tmp/ceph
dpid="" nbdkit_pid="" qnbd_pid="" eager_pid=""
cleanup() {
    local p
    for p in $dpid $nbdkit_pid $qnbd_pid $eager_pid; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    timeout 60 "$CLUSTER" stop "$ceph_dir" 2>/dev/null
    if [[ -n ${VBLK_KEEP_TMP:-} ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

free_port() {
    python3 -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start NAME ARGS...: vblkd on $tmp/d.sock in the background, log
# $tmp/NAME.log; waits until it serves (a network disk is opened first).
start() {
    local name=$1; shift
    rm -f "$tmp/d.sock"
    "$VBLKD" --socket "$tmp/d.sock" "$@" >"$tmp/$name.log" 2>&1 &
    dpid=$!
    for _ in $(seq 300); do
        grep -q serving "$tmp/$name.log" 2>/dev/null && [[ -S $tmp/d.sock ]] && return 0
        kill -0 "$dpid" 2>/dev/null || break
        sleep 0.1
    done
    fail "$name" "vblkd did not start: $(tail -2 "$tmp/$name.log" | tr '\n' ' ')"
    kill -9 "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; dpid=""
    return 1
}
# stop NAME: SIGTERM (SIGKILL after 30 s); FAIL NAME-daemon-exit-0 unless 0.
stop() {
    local name=$1 rc=0
    kill -TERM "$dpid" 2>/dev/null
    for _ in $(seq 300); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$dpid" 2>/dev/null && { kill -9 "$dpid"; fail "$name-daemon-exit-0" "hung on SIGTERM"; }
    wait "$dpid" || rc=$?
    dpid=""
    if ((rc == 0)); then pass "$name-daemon-exit-0"; else fail "$name-daemon-exit-0" "rc=$rc $(tail -2 "$tmp/$name.log" | tr '\n' ' ')"; fi
}
# bench NAME ARGS...: vblk-bench --json on $tmp/d.sock, bounded; sets
# OUT and RC, stderr in $tmp/NAME.err.
bench() {
    local name=$1; shift
    OUT=$(timeout -k 5 60 "$BENCH" --socket "$tmp/d.sock" --json "$@" 2>"$tmp/$name.err")
    RC=$?
}
# check NAME JSON PYTHON-EXPR [DAEMON-JSON]: a condition over vblk-bench's
# JSON (r) and the daemon's counters (daemon).
check() {
    local name=$1 json=$2 expr=$3
    if [[ -z $json ]]; then fail "$name" "no output from vblk-bench"; return; fi
    if python3 -c "
import json, sys
r = json.loads(sys.argv[1]); daemon = json.loads(sys.argv[2])
ok = $expr
if not ok:
    print({k: r.get(k) for k in ('ios','errors','verify_errors','verified',
          'requests_submitted','requests_completed','bad_used')}, daemon)
sys.exit(0 if ok else 1)" "$json" "${4:-{\}}" >"$tmp/check.out"; then
        pass "$name"
    else
        fail "$name" "$(cat "$tmp/check.out")"
    fi
}
# daemon_requests LOG: {"requests": [per queue], "calls": [per queue]}
# from the counters vblkd logs when it exits.
daemon_requests() {
    python3 -c "
import json, sys
stats = [l.split('stats ', 1)[1] for l in open(sys.argv[1]) if ' stats {' in l]
q = json.loads(stats[-1])['queues'] if stats else []
print(json.dumps({k: [x[k] for x in q] for k in ('requests', 'calls')}))" "$1"
}

# verify_case NAME JOBS VBLKD-ARGS...: vblkd --queues 2 on a disk,
# vblk-bench --verify with JOBS jobs (queues), data and counters checked.
verify_case() {
    local name=$1 jobs=$2; shift 2
    start "$name" "$@" --queues 2 || return
    bench "$name" --rw randrw --bs 4k --iodepth 8 --numjobs "$jobs" --runtime 1 --ramp 0 \
        --size 8M --verify
    local out=$OUT rc=$RC d
    stop "$name"
    d=$(daemon_requests "$tmp/$name.log")
    if ((rc == 0)); then pass "$name-exit-0"; else fail "$name-exit-0" "rc=$rc $(head -2 "$tmp/$name.err")"; fi
    check "$name-data" "$out" "r['errors'] == 0 and r['verify_errors'] == 0 and r['verified'] >= 500"
    check "$name-each-request-seen-once" "$out" \
        "r['requests_submitted'] == r['requests_completed'] and r['bad_used'] == 0"
    check "$name-daemon-agrees" "$out" "sum(daemon['requests']) == r['requests_submitted']" "$d"
    if ((jobs == 2)); then
        check "$name-both-queues-used" "$out" "len(daemon['requests']) == 2 and min(daemon['requests']) > 0" "$d"
    fi
}

# ---- The servers ----

t0=$SECONDS
have_ceph=0
if conf=$(timeout -k 5 120 "$CLUSTER" start "$ceph_dir" 2>"$tmp/ceph-start.err"); then
    have_ceph=1
    pass ceph-cluster-start "$((SECONDS - t0)) s"
else
    fail ceph-cluster-start "$(tail -2 "$tmp/ceph-start.err" | tr '\n' ' ')"
fi
rbd_() { timeout 60 rbd -c "$conf" "$@"; }
if ((have_ceph)); then
    for img in v1 v2 fault; do
        rbd_ create --size 256 "rbd/$img" || { fail "rbd-create-$img"; have_ceph=0; }
    done
fi

nbd_port=$(free_port)
nbdkit_start() {	# nbdkit's memory plugin on 127.0.0.1:$nbd_port
    nbdkit -f -i 127.0.0.1 -p "$nbd_port" memory 256M >>"$tmp/nbdkit.log" 2>&1 &
    nbdkit_pid=$!
    for _ in $(seq 100); do
        timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$nbd_port" 2>/dev/null && return 0
        kill -0 "$nbdkit_pid" 2>/dev/null || break
        sleep 0.1
    done
    fail nbdkit-start "$(tail -2 "$tmp/nbdkit.log")"
    return 1
}
have_nbdkit=0
nbdkit_start && have_nbdkit=1

truncate -s 256M "$tmp/nbd.img"
qemu-nbd -f raw -x exp --persistent -e 8 --discard=unmap -k "$tmp/qnbd.sock" "$tmp/nbd.img" \
    >"$tmp/qemu-nbd.log" 2>&1 &
qnbd_pid=$!
have_qnbd=0
for _ in $(seq 100); do [[ -S $tmp/qnbd.sock ]] && { have_qnbd=1; break; }; sleep 0.05; done
((have_qnbd)) || fail qemu-nbd-start "$(tail -2 "$tmp/qemu-nbd.log")"

nbd_tcp="nbd://127.0.0.1:$nbd_port/exp"
nbd_unix="nbd+unix:///exp?socket=$tmp/qnbd.sock"

# ---- Verified I/O, 1 and 2 queues ----

if ((have_ceph)); then
    # The config found through $CEPH_CONF (librbd's own search) for one job,
    # --ceph-conf and --ceph-id for two.
    CEPH_CONF=$conf verify_case rbd-verify-1job 1 --disk rbd:rbd/v1
    verify_case rbd-verify-2jobs 2 --disk rbd:rbd/v1 --ceph-conf "$conf" --ceph-id client.admin
fi
if ((have_nbdkit)); then
    verify_case nbd-tcp-verify-1job 1 --disk "$nbd_tcp"
    verify_case nbd-tcp-verify-2jobs 2 --disk "$nbd_tcp"
fi
if ((have_qnbd)); then
    verify_case nbd-unix-verify-1job 1 --disk "$nbd_unix"
    verify_case nbd-unix-verify-2jobs 2 --disk "$nbd_unix"
fi

# ---- An NBD socket's stale readiness ----
# Regression: a socket that epoll reported readable, read dry by a drain
# earlier in the same batch of events (a ring's stop during an upgrade),
# was handed to libnbd as readable; libnbd then waited in REPLY.START and
# sent nothing more, and an upgrade's drain waited 30 s for the other
# queue's requests (tests/remote/nbd_stale.c says how it is staged).
stale_case() {	# NAME URI
    local out
    if out=$(timeout 60 "$BUILD/nbd-stale" "$2" 2>&1); then pass "$1" "$out"; else fail "$1" "$out"; fi
}
((have_nbdkit)) && stale_case nbd-tcp-stale-readiness "$nbd_tcp"
((have_qnbd)) && stale_case nbd-unix-stale-readiness "$nbd_unix"

# ---- NBD replies taken in batches ----
# Regression: libnbd reads one reply per notification, and vblkd took one
# per wake-up, so at QD32 each completion was a batch of its own: 0.28-0.73
# calls per request with moderation off, against 0.04-0.06 once every
# reply already on the socket is taken in the same wake-up.  Moderation
# off, so that only batching keeps the calls down.
if ((have_nbdkit)) && start nbd-batch --disk "$nbd_tcp" --queues 1 --irq-moderation-max-ns 0; then
    bench nbd-batch --rw randread --bs 4k --iodepth 32 --runtime 1 --ramp 0 --size 64M
    out=$OUT
    stop nbd-batch
    check nbd-replies-one-batch-per-wake "$out" "(r['errors'] == 0 and
        sum(daemon['requests']) >= 2000 and sum(daemon['calls']) <= 0.15 * sum(daemon['requests']))" \
        "$(daemon_requests "$tmp/nbd-batch.log")"
fi

# ---- Upgrade in place ----
# The new process opens the disk anew (its own librbd handle, its own NBD
# connection) while the old one serves; once the old one has drained its
# rings it flushes and gives up its claim (RBD: the exclusive lock), and
# the new one takes it when its rings start.  Verified I/O runs across.
gone() { [[ ! -e /proc/$1/stat ]] || [[ $(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) == Z ]]; }
upgrade_case() {	# NAME VBLKD-ARGS...
    local name=$1 old new rc; shift
    start "$name" "$@" --queues 2 --control "$tmp/c.sock" || return
    old=$dpid
    timeout -k 5 60 "$BENCH" --socket "$tmp/d.sock" --json --rw randrw --bs 4k --iodepth 8 \
        --numjobs 2 --runtime 4 --ramp 0 --size 8M --rate-iops 1000 --verify \
        >"$tmp/$name.json" 2>"$tmp/$name.err" &
    local b=$!
    sleep 1.5
    if timeout 70 "$CTL" --control "$tmp/c.sock" upgrade >"$tmp/$name.up" 2>&1; then
        new=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$tmp/$name.up")
        pass "$name-upgraded" "$(grep -o 'paused for [0-9]* us' "$tmp/$name.up")"
    else
        # What the daemons said (the old one's stages, the new one's
        # refusal), so that a failure in CI says where the time went.
        fail "$name-upgraded" "$(cat "$tmp/$name.up") $(grep -E ' (warn|error): ' \
            "$tmp/$name.log" | tail -4 | tr '\n' ' ')"
    fi
    wait "$b"; rc=$?
    if ((rc == 0)); then pass "$name-bench-exit-0"; else fail "$name-bench-exit-0" "rc=$rc $(head -2 "$tmp/$name.err")"; fi
    check "$name-data" "$(cat "$tmp/$name.json")" \
        "r['errors'] == 0 and r['verify_errors'] == 0 and r['verified'] >= 500"
    if [[ -n ${new:-} ]]; then
        wait "$old"; rc=$?
        ((rc == 0)) && gone "$old" && pass "$name-old-exit-0" || fail "$name-old-exit-0" "rc=$rc"
        kill -TERM "$new"
        for _ in $(seq 300); do gone "$new" && break; sleep 0.1; done
        gone "$new" && pass "$name-new-stops" || { kill -9 "$new"; fail "$name-new-stops"; }
        dpid=""
    else
        stop "$name"
    fi
}
# Under load, an NBD disk's drain in an upgrade once waited its whole 30 s
# for one queue's requests (2026-12-03..05, ~1 run of this file in 3):
# libnbd had been handed a stale readiness event and sat in REPLY.START
# with those requests unsent.  Found and fixed (nbd.c,
# nbd_conn_nothing_to_read; staged alone by nbd-stale above): these cases
# run once and must not stall.
((have_ceph)) && upgrade_case rbd-upgrade --disk rbd:rbd/v1 --ceph-conf "$conf"
((have_nbdkit)) && upgrade_case nbd-tcp-upgrade --disk "$nbd_tcp"
((have_qnbd)) && upgrade_case nbd-unix-upgrade --disk "$nbd_unix"

# ---- An image shrunk under vblkd ----
# librbd cuts a write at the image's (new) end and reports it done: one
# whose end is gone fails instead (IOERR, logged once); writes before the
# end still succeed.  `rbd resize` here, by another client: librbd's
# header watch tells vblkd.
if ((have_ceph)) && rbd_ create --size 16 rbd/shrink &&
    start rbd-shrink --disk rbd:rbd/shrink --ceph-conf "$conf" --cache none; then
    if rbd_ resize --allow-shrink --size 8200K rbd/shrink >/dev/null 2>&1; then
        sleep 1
        bench rbd-shrink-inside --rw write --bs 8k --offset 8M --size 8k --runtime 0.2 --ramp 0
        inside=$OUT
        bench rbd-shrink-straddling --rw write --bs 16k --offset 8M --size 16k --runtime 0.2 --ramp 0
        check rbd-shrunk-image-write-before-end-ok "$inside" "r['errors'] == 0 and r['ios'] > 0"
        check rbd-shrunk-image-write-past-end-fails "$OUT" "r['errors'] > 0"
        if grep -q "shrank to 8396800 bytes under us" "$tmp/rbd-shrink.log"; then
            pass rbd-shrunk-image-logged
        else
            fail rbd-shrunk-image-logged "$(tail -2 "$tmp/rbd-shrink.log" | tr '\n' ' ')"
        fi
    else
        fail rbd-shrink "rbd resize --allow-shrink failed"
    fi
    stop rbd-shrink
fi

# ---- Discard reaches the backend ----
# vblk-bench --rw trim; tests/guest/remote.sh checks the same from a
# guest's blkdiscard.
if [[ $("$BENCH" --help 2>&1 | grep -cw trim) != 0 ]]; then
    if ((have_ceph)) && start rbd-discard --disk rbd:rbd/v2 --ceph-conf "$conf"; then
        # Whole 4 MiB objects: librbd skips discards of part of an object
        # (rbd_skip_partial_discard), which free nothing.
        bench rbd-discard-write --rw write --bs 4M --size 8M --runtime 0.5 --ramp 0
        before=$(rbd_ du --format json rbd/v2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["images"][0]["used_size"])')
        bench rbd-discard --rw trim --bs 4M --size 8M --runtime 0.3 --ramp 0
        stop rbd-discard
        after=$(rbd_ du --format json rbd/v2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["images"][0]["used_size"])')
        if ((${before:-0} >= 8 << 20 && ${after:-1} < before)); then
            pass rbd-discard-frees-space "rbd du: $before -> $after bytes"
        else
            fail rbd-discard-frees-space "rbd du: ${before:-?} -> ${after:-?} bytes"
        fi
    fi
    if ((have_qnbd)) && start nbd-discard --disk "$nbd_unix"; then
        bench nbd-discard-write --rw write --bs 1M --size 8M --runtime 0.5 --ramp 0
        bench nbd-discard --rw trim --bs 1M --size 8M --runtime 0.3 --ramp 0
        stop nbd-discard
        if python3 - "$tmp/nbd.img" <<'PY'; then pass nbd-discard-makes-holes; else fail nbd-discard-makes-holes "no hole in the file behind qemu-nbd"; fi
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
sys.exit(0 if os.lseek(fd, 0, os.SEEK_HOLE) == 0 else 1)
PY
    fi
else
    skip rbd-discard-frees-space "vblk-bench has no discard workload (see tests/guest/remote.sh)"
    skip nbd-discard-makes-holes "vblk-bench has no discard workload (see tests/guest/remote.sh)"
fi

# ---- Faults ----

# The OSD stopped (connections dropped, memstore saved: see
# ceph-cluster.sh) and restarted while vblk-bench writes and verifies:
# librbd holds the requests and resends them; they must complete once it
# is back, or fail with an error status - never hang.  vblk-bench waits up
# to 60 s for a completion (--stall-s; its default 5 s was shorter than
# the OSD's restart in some CI runs, which then had no verdict) before it
# reports requests stranded.  vblkd keeps serving.
if ((have_ceph)) && start rbd-osd-restart --disk rbd:rbd/fault --ceph-conf "$conf" --queues 2; then
    timeout -k 5 90 "$BENCH" --socket "$tmp/d.sock" --json --rw randrw --bs 4k --iodepth 8 \
        --numjobs 2 --runtime 6 --ramp 0 --size 8M --verify --stall-s 60 \
        >"$tmp/osd.out" 2>"$tmp/osd.err" &
    bpid=$!
    sleep 1.5
    t1=$SECONDS
    timeout 60 "$CLUSTER" kill-osd "$ceph_dir" &&
        timeout 90 "$CLUSTER" start-osd "$ceph_dir" >/dev/null 2>"$tmp/osd-restart.err" ||
        fail rbd-osd-restart "$(cat "$tmp/osd-restart.err")"
    down=$((SECONDS - t1))
    wait "$bpid"; rc=$?
    out=$(cat "$tmp/osd.out")
    if ((rc == 124 || rc == 137)); then
        fail rbd-osd-restart-no-hang "vblk-bench still running after 90 s"
    else
        pass rbd-osd-restart-no-hang "OSD away ~$down s, vblk-bench rc=$rc"
    fi
    if grep -q "got no completion" "$tmp/osd.err"; then
        # vblk-bench's own limit, not a verdict on vblkd: it abandons
        # requests after 60 s without progress (vblkd then drains them when
        # the OSD is back, checked below by the next frontend).
        why="vblk-bench gave up after 60 s without a completion (OSD away ~$down s): $(head -1 "$tmp/osd.err")"
        skip rbd-osd-restart-requests-complete-or-fail-cleanly "$why"
        skip rbd-osd-restart-requests-complete "$why"
    else
        check rbd-osd-restart-requests-complete-or-fail-cleanly "$out" \
            "r['requests_submitted'] == r['requests_completed'] and r['bad_used'] == 0 and r['verify_errors'] == 0"
        check rbd-osd-restart-requests-complete "$out" "r['errors'] == 0 and r['verified'] > 0"
    fi
    if kill -0 "$dpid" 2>/dev/null; then pass rbd-osd-restart-daemon-survives; else fail rbd-osd-restart-daemon-survives "$(tail -2 "$tmp/rbd-osd-restart.log")"; fi
    bench rbd-osd-next --rw randrw --bs 4k --iodepth 8 --numjobs 2 --runtime 1 --ramp 0 --size 8M --verify
    check rbd-osd-restart-next-frontend-served "$OUT" "r['errors'] == 0 and r['verified'] > 0"
    stop rbd-osd-restart
fi

# The NBD server killed (SIGKILL) while vblk-bench writes: what was in
# flight and what follows fail with an error status at once (no hang);
# vblkd survives, reconnects in the background, and serves the next
# frontend once the server is back.
if ((have_nbdkit)) && start nbd-kill --disk "$nbd_tcp" --queues 2; then
    timeout -k 5 60 "$BENCH" --socket "$tmp/d.sock" --json --rw randrw --bs 4k --iodepth 8 \
        --numjobs 2 --runtime 3 --ramp 0 --size 8M --verify >"$tmp/nbdkill.out" 2>"$tmp/nbdkill.err" &
    bpid=$!
    sleep 1
    kill -9 "$nbdkit_pid"; wait "$nbdkit_pid" 2>/dev/null; nbdkit_pid=""
    wait "$bpid"; rc=$?
    out=$(cat "$tmp/nbdkill.out")
    if ((rc == 124 || rc == 137)); then
        fail nbd-server-killed-no-hang "vblk-bench still running after 60 s"
    else
        pass nbd-server-killed-no-hang "vblk-bench rc=$rc"
    fi
    check nbd-server-killed-io-errors "$out" \
        "r['errors'] > 0 and r['requests_submitted'] == r['requests_completed'] and r['bad_used'] == 0"
    grep -q "got no completion" "$tmp/nbdkill.err" &&
        echo "  (vblk-bench: $(head -2 "$tmp/nbdkill.err" | tr '\n' ' '))"
    if kill -0 "$dpid" 2>/dev/null; then pass nbd-server-killed-daemon-survives; else fail nbd-server-killed-daemon-survives "$(tail -2 "$tmp/nbd-kill.log")"; fi
    if nbdkit_start; then
        # vblkd retries the connection with a growing delay (1 s, 2 s, ...).
        t1=$SECONDS ok=0
        while ((SECONDS - t1 < 40)); do
            bench nbd-back --rw randrw --bs 4k --iodepth 8 --runtime 0.5 --ramp 0 --size 8M --verify
            python3 -c "import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if r['errors']==0 and r['verified']>0 else 1)" "$OUT" 2>/dev/null &&
                { ok=1; break; }
            sleep 1
        done
        if ((ok)); then
            pass nbd-server-back-next-frontend-served "after $((SECONDS - t1)) s"
        else
            fail nbd-server-back-next-frontend-served "still failing 40 s after the server came back: $(grep -m2 NBD "$tmp/nbd-kill.log" | tr '\n' ' ')"
        fi
    fi
    stop nbd-kill
fi

# Writes the server acknowledged and no flush covered, then the server
# killed and started again (nbdkit's memory: they are gone): the guest's
# next flush fails, once (it must not say they are stored), and the
# flushes after it succeed.  The frontend stays connected across the kill:
# a ring that stops flushes first (next test).
if ((have_nbdkit)) && start nbd-unflushed --disk "$nbd_tcp" --queues 1; then
    timeout -k 5 60 "$BENCH" --socket "$tmp/d.sock" --json --rw randwrite --bs 4k \
        --iodepth 4 --runtime 0.5 --ramp 0 --size 8M --hold 3 >"$tmp/unfl.out" 2>&1 &
    bpid=$!
    sleep 1.5
    kill -9 "$nbdkit_pid"; wait "$nbdkit_pid" 2>/dev/null; nbdkit_pid=""
    nbdkit_start
    wait "$bpid"
    for _ in $(seq 400); do
        grep -q "connected again" "$tmp/nbd-unflushed.log" && break
        sleep 0.1
    done
    bench nbd-unflushed-flush --rw flush --iodepth 1 --runtime 0.3 --ramp 0
    check nbd-lost-unflushed-writes-fail-one-flush "$OUT" "r['errors'] == 1 and r['ios'] >= 2"
    if grep -q "acknowledged writes were not yet flushed when the connection was lost" \
        "$tmp/nbd-unflushed.log"; then
        pass nbd-lost-unflushed-writes-logged
    else
        fail nbd-lost-unflushed-writes-logged "$(grep -m3 NBD "$tmp/nbd-unflushed.log" | tr '\n' ' ')"
    fi
    stop nbd-unflushed
fi

# A reconnection whose handshake ends inside libnbd's first call: a
# server that sends all its answers at once (tests/remote/eager-nbd) and
# a connect() made late (slow-connect.so: this thread preempted right
# after it, as on a busy machine).  No event ever comes for such a
# handshake; vblkd must see it ended (regression: it waited 10 s for an
# answer it already had, dropped the connection, and did it again every
# retry while the disk failed every request).
eager_port=$(free_port)
"$top/tests/remote/eager-nbd" "tcp:$eager_port" 67108864 >"$tmp/eager.log" 2>&1 &
eager_pid=$!
for _ in $(seq 100); do grep -q serving "$tmp/eager.log" && break; sleep 0.1; done
if LD_PRELOAD=$BUILD/slow-connect.so VBLK_TEST_CONNECT_DELAY_MS=200 \
    start nbd-eager --disk "nbd://127.0.0.1:$eager_port/exp" --queues 1; then
    bench nbd-eager-before --rw randrw --bs 4k --iodepth 8 --runtime 0.3 --ramp 0 --size 8M --verify
    check nbd-eager-served "$OUT" "r['errors'] == 0 and r['verified'] > 0"
    kill -USR1 "$eager_pid"	# every connection dropped, as by a restart
    for _ in $(seq 80); do
        grep -q "connected again" "$tmp/nbd-eager.log" && break
        sleep 0.1
    done
    if grep -q "connected again" "$tmp/nbd-eager.log"; then
        pass nbd-eager-reconnected
    else
        fail nbd-eager-reconnected "not within 8 s: $(grep -E 'NBD export' "$tmp/nbd-eager.log" | \
            tail -3 | tr '\n' ' ') $(tail -2 "$tmp/eager.log" | tr '\n' ' ')"
    fi
    bench nbd-eager-after --rw randrw --bs 4k --iodepth 8 --runtime 0.3 --ramp 0 --size 8M --verify
    check nbd-eager-reconnected-served "$OUT" "r['errors'] == 0 and r['verified'] > 0"
    grep -c "handshake answered before it was asked" "$tmp/eager.log" | grep -qx 2 &&
        pass nbd-eager-server-answered-early ||
        fail nbd-eager-server-answered-early "$(cat "$tmp/eager.log" | tr '\n' ' ')"
    stop nbd-eager
fi
kill "$eager_pid" 2>/dev/null; wait "$eager_pid" 2>/dev/null

# A ring that stops (the frontend goes: VM stopped, migrated, vblkd
# upgraded) flushes the writes no flush covered, so that whoever writes
# next, on another connection, finds them stored: nbdkit's log filter
# shows the flush after the writes, with no flush from the frontend.
nbdlog_port=$(free_port)
nbdkit -f -i 127.0.0.1 -p "$nbdlog_port" --filter=log memory 64M logfile="$tmp/nbdlog.txt" \
    >>"$tmp/nbdkit.log" 2>&1 &
nbdlog_pid=$!
for _ in $(seq 100); do
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$nbdlog_port" 2>/dev/null && break
    sleep 0.1
done
if start nbd-drain-flush --disk "nbd://127.0.0.1:$nbdlog_port/exp" --queues 1; then
    bench nbd-drain-flush --rw randwrite --bs 4k --iodepth 4 --runtime 0.3 --ramp 0 --size 8M
    # The ring stops when the frontend disconnects; give the drain a moment.
    for _ in $(seq 50); do grep -q "Flush" "$tmp/nbdlog.txt" 2>/dev/null && break; sleep 0.1; done
    w=$(grep -c " Write id=" "$tmp/nbdlog.txt" 2>/dev/null)
    fl=$(grep -c " Flush id=" "$tmp/nbdlog.txt" 2>/dev/null)
    last=$(grep -E " (Write|Flush) id=" "$tmp/nbdlog.txt" | tail -1 | grep -o "Write\|Flush")
    if ((${w:-0} > 0 && ${fl:-0} >= 1)) && [[ $last == Flush ]]; then
        pass nbd-ring-stop-flushes-unflushed-writes "$w writes, then $fl flush"
    else
        fail nbd-ring-stop-flushes-unflushed-writes "writes ${w:-?}, flushes ${fl:-?}, last ${last:-none}"
    fi
    stop nbd-drain-flush
fi
kill "$nbdlog_pid" 2>/dev/null; wait "$nbdlog_pid" 2>/dev/null

# ---- User mistakes: one line, exit 1, bounded time, no socket left ----

# expect_error NAME PATTERN VBLKD-ARGS...
expect_error() {
    local name=$1 pat=$2 rc=0 t; shift 2
    rm -f "$tmp/e.sock"
    t=$(date +%s%N)
    timeout -k 5 60 "$VBLKD" --socket "$tmp/e.sock" "$@" >"$tmp/e.out" 2>"$tmp/e.err" || rc=$?
    t=$((($(date +%s%N) - t) / 1000000))
    local err; err=$(head -c 400 "$tmp/e.err")
    if ((rc != 1)); then fail "$name" "exit status $rc, want 1 after $t ms: $err"
    elif ((t > ERR_BOUND * 1000)); then fail "$name" "took $t ms (bound ${ERR_BOUND} s): $err"
    elif [[ $(wc -l <"$tmp/e.err") -ne 1 ]]; then fail "$name" "want one stderr line, got: $err"
    elif ! grep -qE -- "$pat" "$tmp/e.err"; then fail "$name" "'$err' does not match /$pat/"
    elif [[ -e $tmp/e.sock ]]; then fail "$name" "socket left behind"
    elif [[ -s $tmp/e.out ]]; then fail "$name" "unexpected stdout: $(head -c 200 "$tmp/e.out")"
    else pass "$name" "$t ms: $err"
    fi
}
dead_port=$(free_port)
expect_error bad-uri-nbd-empty "nbd://" --disk "nbd://"
expect_error bad-uri-nbd-port "notaport" --disk "nbd://127.0.0.1:notaport/x"
expect_error bad-spec-rbd-empty "rbd:" --disk "rbd:"
expect_error bad-spec-rbd-no-image "rbd:pool" --disk "rbd:pool"
expect_error bad-spec-rbd-empty-image "rbd:pool/" --disk "rbd:pool/"
expect_error nbd-server-not-listening "127.0.0.1:$dead_port" --disk "nbd://127.0.0.1:$dead_port/x"
expect_error nbd-unix-socket-missing "nosuch.sock" --disk "nbd+unix:///x?socket=$tmp/nosuch.sock"
if ((have_ceph)); then
    expect_error rbd-missing-pool "nosuchpool" --disk rbd:nosuchpool/img --ceph-conf "$conf"
    expect_error rbd-missing-image "nosuchimage" --disk rbd:rbd/nosuchimage --ceph-conf "$conf"
    expect_error rbd-missing-snapshot "nosnap" --disk rbd:rbd/v1@nosnap --ceph-conf "$conf"
fi
# A cluster that is not there: a ceph.conf whose monitor port is dead.
cat >"$tmp/dead.conf" <<EOF
[global]
mon host = v2:127.0.0.1:$dead_port
auth cluster required = none
auth service required = none
auth client required = none
keyring = /dev/null
admin socket = $tmp/dead.\$pid.asok
log file = $tmp/dead.log
EOF
expect_error rbd-cluster-not-there "Ceph|cluster" --disk rbd:rbd/v1 --ceph-conf "$tmp/dead.conf"
expect_error rbd-ceph-conf-missing "nosuch.conf" --disk rbd:rbd/v1 --ceph-conf "$tmp/nosuch.conf"
if ((have_nbdkit)); then
    # qemu-nbd serves one export name; nbdkit takes any, so ask qemu-nbd.
    ((have_qnbd)) && expect_error nbd-missing-export "nosuchexport" \
        --disk "nbd+unix:///nosuchexport?socket=$tmp/qnbd.sock"
fi
# ---- LUKS on network disks ----
# The format layer reads a network disk's LUKS header through its engine
# (a copy libcryptsetup opens); the data path is the same as on files.
# NBD: a LUKS2 disk made by cryptsetup behind qemu-nbd, judged by the
# independent AES-XTS oracle (tests/format/luks_oracle.py).  RBD: an image
# made LUKS2 by librbd itself (rbd encryption format), judged by librbd's
# own encryption through QEMU's rbd driver (encrypt.format=luks2): a fresh
# image reads as zeroes both ways (nothing written: no objects), what
# librbd wrote over the whole payload vblkd reads, what vblkd writes
# librbd reads.  Then vblkd serving each to vblk-bench --verify; the NBD
# one upgraded in place with its key file gone (the volume key crosses
# the handover socket), and a damaged header refused in one line.
FMTIO=$BUILD/fmt-io ORACLE="/usr/bin/python3 $top/tests/format/luks_oracle.py"
have_luks=0
if command -v cryptsetup >/dev/null && (($(ldd "$VBLKD" | grep -c libcryptsetup) > 0)) &&
   /usr/bin/python3 -c 'import cryptography' 2>/dev/null; then
    have_luks=1
else
    skip luks-on-network-disks "no cryptsetup or python3-cryptography, or vblkd built without LUKS"
fi
printf 'network luks %s' "$RANDOM$RANDOM" >"$tmp/lk.key"
if ((have_luks && have_qnbd)); then
    truncate -s 40M "$tmp/lk.img"
    cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
        --key-file "$tmp/lk.key" "$tmp/lk.img"
    head -c 24M /dev/urandom >"$tmp/lk.plain"
    $ORACLE encrypt "$tmp/lk.img" "$tmp/lk.key" "$tmp/lk.plain"
    $ORACLE decrypt "$tmp/lk.img" "$tmp/lk.key" "$tmp/lk.model"
    qemu-nbd -f raw -x lk --persistent -e 4 -k "$tmp/lk.sock" "$tmp/lk.img" \
        >"$tmp/qemu-nbd-lk.log" 2>&1 &
    lk_pid=$!
    for _ in $(seq 100); do [[ -S $tmp/lk.sock ]] && break; sleep 0.05; done
    nbd_luks="nbd+unix:///lk?socket=$tmp/lk.sock"
    if out=$(timeout 60 "$FMTIO" "$nbd_luks" "$tmp/lk.model" 1 0 --key-file "$tmp/lk.key" 2>&1)
    then pass nbd-luks2-reads-what-the-oracle-wrote
    else fail nbd-luks2-reads-what-the-oracle-wrote "$out"; fi
    if out=$(timeout 60 "$FMTIO" "$nbd_luks" "$tmp/lk.model" 2 300 --key-file "$tmp/lk.key" 2>&1) &&
       $ORACLE decrypt "$tmp/lk.img" "$tmp/lk.key" "$tmp/lk.after" &&
       cmp -s "$tmp/lk.after" "$tmp/lk.model"; then
        pass nbd-luks2-writes-the-oracle-reads
    else
        fail nbd-luks2-writes-the-oracle-reads "${out:-the decryption by the oracle differs}"
    fi
    verify_case nbd-luks2-verify-2jobs 2 --disk "$nbd_luks" --key-file "$tmp/lk.key"
    grep -q "format: LUKS2, aes-xts-plain64 512-bit" "$tmp/nbd-luks2-verify-2jobs.log" &&
        pass nbd-luks2-format-logged ||
        fail nbd-luks2-format-logged "$(grep format: "$tmp/nbd-luks2-verify-2jobs.log")"
    cp "$tmp/lk.key" "$tmp/lk-once.key"
    (sleep 1; rm -f "$tmp/lk-once.key") &
    upgrade_case nbd-luks2-upgrade-key-file-gone --disk "$nbd_luks" --key-file "$tmp/lk-once.key"
    # A damaged header (both LUKS2 binary headers' checksums broken):
    # refused with one line, the disk left as it was.
    cp "$tmp/lk.img" "$tmp/lkbad.img"
    printf '\xff\xff\xff\xff' | dd of="$tmp/lkbad.img" bs=1 seek=448 conv=notrunc status=none
    printf '\xff\xff\xff\xff' | dd of="$tmp/lkbad.img" bs=1 seek=$((16384 + 448)) conv=notrunc status=none
    sum_before=$(md5sum <"$tmp/lkbad.img")
    qemu-nbd -f raw -x bad --persistent -k "$tmp/lkbad.sock" "$tmp/lkbad.img" \
        >"$tmp/qemu-nbd-lkbad.log" 2>&1 &
    lkbad_pid=$!
    for _ in $(seq 100); do [[ -S $tmp/lkbad.sock ]] && break; sleep 0.05; done
    # (The NBD engine's info line about the export comes first.)
    timeout 60 "$VBLKD" --socket "$tmp/e.sock" --disk "nbd+unix:///bad?socket=$tmp/lkbad.sock" \
        --key-file "$tmp/lk.key" >"$tmp/e.out" 2>"$tmp/e.err"; rc=$?
    if ((rc == 1)) && (($(grep -vc ' info: ' "$tmp/e.err") == 1)) && grep -q damaged "$tmp/e.err" &&
       [[ ! -e $tmp/e.sock ]]; then
        pass nbd-luks2-damaged-header "$(grep -v ' info: ' "$tmp/e.err")"
    else
        fail nbd-luks2-damaged-header "rc=$rc $(head -c 400 "$tmp/e.err")"
    fi
    [[ $(md5sum <"$tmp/lkbad.img") == "$sum_before" ]] && pass nbd-luks2-damaged-header-untouched ||
        fail nbd-luks2-damaged-header-untouched "the image changed"
    kill "$lk_pid" "$lkbad_pid" 2>/dev/null; wait "$lk_pid" "$lkbad_pid" 2>/dev/null
fi
if ((have_luks && have_ceph)); then
    qsec=(--object "secret,id=s0,file=$tmp/lk.key")
    qrbd="driver=rbd,pool=rbd,image=enc,conf=$conf,encrypt.format=luks2,encrypt.key-secret=s0"
    t0=$SECONDS
    if rbd_ create --size 64 rbd/enc && rbd_ encryption format rbd/enc luks2 "$tmp/lk.key" \
           >"$tmp/rbd-enc.log" 2>&1; then
        pass rbd-encryption-format "$((SECONDS - t0)) s (librbd's argon2id)"
        # Fresh: no object written, librbd reads zeroes; so must we.
        qemu-img convert "${qsec[@]}" --image-opts "$qrbd" -O raw "$tmp/enc.fresh" 2>"$tmp/enc.err"
        if [[ $(tr -d '\0' <"$tmp/enc.fresh" | head -c 1 | wc -c) == 0 ]] &&
           out=$(timeout 120 "$FMTIO" rbd:rbd/enc "$tmp/enc.fresh" 1 0 --key-file "$tmp/lk.key" \
                 --ceph-conf "$conf" 2>&1); then
            pass rbd-luks2-fresh-reads-zeroes-as-librbd
        else
            fail rbd-luks2-fresh-reads-zeroes-as-librbd "${out:-librbd read more than zeroes: $(head -2 "$tmp/enc.err")}"
        fi
        # librbd writes the whole payload; vblkd reads it.
        size=$(stat -c %s "$tmp/enc.fresh")
        head -c "$size" /dev/urandom >"$tmp/enc.model"
        if qemu-img convert -n "${qsec[@]}" -f raw "$tmp/enc.model" --target-image-opts "$qrbd" \
               2>"$tmp/enc.err" &&
           out=$(timeout 120 "$FMTIO" rbd:rbd/enc "$tmp/enc.model" 3 0 --key-file "$tmp/lk.key" \
                 --ceph-conf "$conf" 2>&1); then
            pass rbd-luks2-reads-what-librbd-wrote
        else
            fail rbd-luks2-reads-what-librbd-wrote "${out:-$(head -2 "$tmp/enc.err")}"
        fi
        # vblkd writes at random; librbd reads exactly that.
        if out=$(timeout 120 "$FMTIO" rbd:rbd/enc "$tmp/enc.model" 4 300 --key-file "$tmp/lk.key" \
                 --ceph-conf "$conf" 2>&1) &&
           qemu-img convert "${qsec[@]}" --image-opts "$qrbd" -O raw "$tmp/enc.after" \
               2>"$tmp/enc.err" && cmp -s "$tmp/enc.after" "$tmp/enc.model"; then
            pass rbd-luks2-writes-librbd-reads
        else
            fail rbd-luks2-writes-librbd-reads "${out:-librbd reads other bytes $(head -2 "$tmp/enc.err")}"
        fi
        verify_case rbd-luks2-verify-1job 1 --disk rbd:rbd/enc --ceph-conf "$conf" \
            --key-file "$tmp/lk.key"
    else
        fail rbd-encryption-format "$(tail -2 "$tmp/rbd-enc.log")"
    fi
fi

exit 0
