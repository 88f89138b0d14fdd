#!/usr/bin/env bash
# Description: the notification engine, checked by behaviour and counters
# (never by timings): no request is ever stranded across the
# poll/sleep transitions, polling absorbs kicks, polling off means every
# request is kicked, batching keeps interrupts below one per request (and
# early notification is counted and can be switched off), interrupt
# moderation holds calls only with other requests outstanding and within
# its cap, holds on for a slow driver and backs off for a waiting one, a
# slow disk gets requests at once and in small batches when full, an
# idle daemon uses no CPU (and checks nothing), contention switches polling
# off, polling that delays the client it waits for is switched off by the
# pay check and back on when that stops, and the
# control socket reports and changes all of it.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
BUILD=${1:?usage: test_notify.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench CTL=$BUILD/vblkctl
tmp=$(mktemp -d /tmp/vblk-notify.XXXXXX)
dpid="" hog=""
cleanup() {
    [[ -n $dpid ]] && kill "$dpid" 2>/dev/null
    [[ -n $hog ]] && kill "$hog" 2>/dev/null
    wait 2>/dev/null; rm -rf "$tmp"
    if [[ -n ${shm:-} ]]; then rm -f "$shm"; fi
}
trap cleanup EXIT
ncpu=$(nproc)
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

# Daemon on the last CPU, client on the first, when there are two: polling
# results must not depend on where the scheduler puts the threads.
if ((ncpu >= 2)) && command -v taskset >/dev/null; then
    DPIN=(taskset -c $((ncpu - 1))) CPIN=(taskset -c 0)
else
    DPIN=() CPIN=()
fi

start() {	# start ARGS...: vblkd (null backend) with a control socket
    rm -f "$tmp/d.sock" "$tmp/c.sock"
    "${DPIN[@]}" "$VBLKD" --socket "$tmp/d.sock" --control "$tmp/c.sock" --backend null --size 256M "$@" \
        >"$tmp/vblkd.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && return 0; sleep 0.05; done
    fail start "$(tail -3 "$tmp/vblkd.log")"; return 1
}
stop() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; dpid=""; }
stats() { "$CTL" --control "$tmp/c.sock" stats; }
bench() { "${CPIN[@]}" "$BENCH" --socket "$tmp/d.sock" --bs 4k --ramp 0 --json "$@"; }
# check NAME PYTHON-EXPR: r = vblk-bench JSON ($R), s0/s1 = daemon stats
# before/after ($S0, $S1); q = per-queue deltas of queue 0.
check() {
    if python3 - "$R" "$S0" "$S1" "$2" <<'PY'
import json, sys
r = json.loads(sys.argv[1]) if sys.argv[1] else {}
s0, s1 = json.loads(sys.argv[2]), json.loads(sys.argv[3])
q = {k: s1["queues"][0][k] - s0["queues"][0][k] for k in s0["queues"][0] if k != "poll_ns"}
t = {k: s1["iothreads"][0][k] - s0["iothreads"][0][k] for k in s0["iothreads"][0]}
ok = eval(sys.argv[4])
if not ok:
    print("   r:", {k: r.get(k) for k in ("ios", "errors", "kicks", "calls", "requests_submitted")},
          "\n   queue delta:", q, "\n   iothread delta:", t)
sys.exit(0 if ok else 1)
PY
    then pass "$1"; else fail "$1"; fi
}

# 1. No request stranded: thousands of QD1 requests, each crossing the
#    poll -> sleep -> kick transition, with windows forced tiny, default,
#    off, and without EVENT_IDX.
for variant in "--poll-max-ns 1000" "" "--poll-max-ns 0" "--no-event-idx --poll-max-ns 1000"; do
    name="no-stranded-request${variant:+ (${variant})}"
    start $variant || continue
    S0=$(stats)
    R=$(bench --rw randread --iodepth 1 --runtime 1.5 --rate-iops 20000)
    rc=$?
    S1=$(stats)
    stop
    if ((rc != 0)); then fail "$name" "vblk-bench rc=$rc"; continue; fi
    check "$name" "r['errors'] == 0 and r['requests_submitted'] == r['requests_completed'] >= 3000 and q['requests'] == r['requests_submitted']"
done

# 2. A polling client at QD1: the daemon's polling catches the requests,
#    so it receives far fewer kicks than requests.
start && {
    S0=$(stats); R=$(bench --rw randread --iodepth 1 --runtime 1.5 --poll); S1=$(stats); stop
    check polling-absorbs-kicks "q['poll_hits'] > 0 and q['kicks'] * 2 < q['requests'] and r['errors'] == 0"
}

# 3. Polling off: nothing is polled, and QD1 requests arrive by kick.  The
#    only ones that may come without a kick are those the re-check before
#    sleeping finds: an early call wakes the driver while the pass is still
#    running, and it may queue its next request before we re-enable kicks.
start --poll-max-ns 0 && {
    S0=$(stats); R=$(bench --rw randread --iodepth 1 --runtime 1); S1=$(stats); stop
    check polling-off-requests-kicked "q['poll_hits'] == 0 and t['poll_ns_total'] == 0 and q['kicks'] <= q['requests'] and q['kicks'] * 10 >= q['requests'] * 9 and r['errors'] == 0"
}

# 4. Batched interrupts at QD32: well under one call per request.  The
#    client sleeps between batches, so the first completion it waits for
#    goes out early (calls_early); with --no-early-notify only batch ends
#    call.  Either way every request completes.
start && {
    S0=$(stats); R=$(bench --rw randread --iodepth 32 --runtime 1); S1=$(stats); stop
    check batching-fewer-calls-than-requests "q['calls'] * 2 < q['requests'] and 0 < q['calls_early'] <= q['calls'] and r['errors'] == 0 and r['requests_submitted'] == r['requests_completed']"
}
start --no-early-notify && {
    S0=$(stats); R=$(bench --rw randread --iodepth 32 --runtime 1); S1=$(stats); stop
    check no-early-notify-calls-at-batch-end "q['calls'] * 2 < q['requests'] and q['calls_early'] == 0 and q['calls'] > 0 and r['errors'] == 0 and r['requests_submitted'] == r['requests_completed']"
}
start --no-event-idx && {
    S0=$(stats); R=$(bench --rw randread --iodepth 32 --runtime 1); S1=$(stats); stop
    check no-event-idx-negotiated-and-batched "r['event_idx'] is False and q['calls'] * 2 < q['requests'] and r['errors'] == 0"
}

# 5. Idle costs nothing: a frontend stays connected after its load stops
#    (vblk-bench --hold); from 1 s after the load, over 5 s, the iothread
#    uses under 1% of a CPU (an idle loop sleeps in epoll_wait with no
#    timer; the polling window is dropped after 1 s idle) and the whole
#    daemon too (utime + stime from /proc, in clock ticks).  No pay check
#    starts while idle; one that began as the load ended is counted as
#    aborted when the loop next wakes (the stats call itself), so one
#    abort may fall in the window (seen in CI).
start && {
    "${CPIN[@]}" "$BENCH" --socket "$tmp/d.sock" --bs 4k --ramp 0 --rw randread --iodepth 1 \
        --runtime 1 --poll --hold 7 >"$tmp/hold.out" 2>&1 &
    bpid=$!
    sleep 2
    ticks0=$(awk '{print $14 + $15}' "/proc/$dpid/stat")
    S0=$(stats); sleep 5; S1=$(stats)
    ticks1=$(awk '{print $14 + $15}' "/proc/$dpid/stat")
    still=$(grep -c "frontend disconnected" "$tmp/vblkd.log")
    wait "$bpid"; R=""
    stop
    check connected-idle-daemon-uses-no-cpu "t['cpu_ns'] < 50_000_000 and q['requests'] == 0 and $((ticks1 - ticks0)) * 1_000_000_000 // $(getconf CLK_TCK) < 50_000_000 and $still == 0 and t['poll_checks'] == 0 and t['poll_checks_aborted'] <= 1"
}

# 6. Contention: the iothread shares its core with a CPU hog; its
#    polling must notice and back off.
if ((ncpu >= 2)) && command -v taskset >/dev/null; then
    taskset -c 0 sh -c 'while :; do :; done' &
    hog=$!
    rm -f "$tmp/d.sock" "$tmp/c.sock"
    taskset -c 0 "$VBLKD" --socket "$tmp/d.sock" --control "$tmp/c.sock" --backend null \
        --size 256M >"$tmp/vblkd.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && break; sleep 0.05; done
    S0=$(stats)
    R=$(taskset -c 1 "$BENCH" --socket "$tmp/d.sock" --rw randread --iodepth 1 --runtime 2 \
        --ramp 0 --poll --json)
    S1=$(stats); stop
    kill "$hog"; wait "$hog" 2>/dev/null; hog=""
    check contention-stops-polling "t['contended'] > 0 and r['errors'] == 0"
else
    echo "SKIP: contention-stops-polling (needs 2 CPUs and taskset)"
fi

# 6b. Interrupt moderation, on a file (io_uring: completions come while
# other requests are in flight), by counters.  QD1 never holds a call (the
# request a sleeping driver waits for is the only one); QD32 holds, the
# held calls go out within the cap (80 us: short enough that the loop
# waits for it polling, see loop.c) and none is stranded: every request
# submitted completes, and the time holds were meant to last is the cap
# at most on average.  What the loop ran past a hold's deadline (a thread
# preempted mid-hold: 313 us seen under ASan in CI; io_uring's worker on
# our CPU) is wall time, not behaviour, and counted apart
# (hold_late_ns_total); so is the longest single hold.  Off (0), nothing
# is held.
head -c $((16 << 20)) /dev/urandom >"$tmp/mod.img"
# On disk before O_DIRECT reads it: ext4 allocates a new file's blocks at
# writeback, and until then io_uring hands each O_DIRECT read of a
# dirty range to its worker thread, which shares the daemon's CPU.
sync "$tmp/mod.img"
start_disk() {	# start_disk DISK ARGS...: vblkd on DISK with a control socket,
		# pinned as DPIN says (UNPINNED=1: not pinned)
    local disk=$1 pin=("${DPIN[@]}")
    shift
    [[ -n ${UNPINNED:-} ]] && pin=()
    rm -f "$tmp/d.sock" "$tmp/c.sock"
    "${pin[@]}" "$VBLKD" --socket "$tmp/d.sock" --control "$tmp/c.sock" --disk "$disk" "$@" \
        >"$tmp/vblkd.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && return 0; sleep 0.05; done
    fail start-disk "$(tail -3 "$tmp/vblkd.log")"; return 1
}
start_file() { start_disk "$tmp/mod.img" "$@"; }	# start_file ARGS...
start_file --irq-moderation-max-ns 80000 && {
    S0=$(stats); R=$(bench --rw randread --iodepth 1 --runtime 1 --size 16M); S1=$(stats)
    check irq-moderation-never-at-qd1 \
        "q['calls_held'] == 0 and r['requests_submitted'] == r['requests_completed'] > 100"
    S0=$(stats); R=$(bench --rw randread --iodepth 32 --runtime 1 --size 16M); S1=$(stats)
    check irq-moderation-holds-at-qd32-within-cap \
        "(q['calls_held'] > 0 and q['completions_coalesced'] > 0 and
          (q['hold_ns_total'] - q['hold_late_ns_total']) / q['calls_held'] <= 80000 and
          s1['queues'][0]['hold_ns_max'] > 0 and
          r['requests_submitted'] == r['requests_completed'] and r['errors'] == 0)"
    stop
}
# 6c. Holds that outlast the requests in flight (the default cap, 500 us).
# A driver slower than the disk (vblk-bench --think-us: 50 us of CPU
# before each request, sent one by one, interrupts on, as a TCG guest does)
# keeps several outstanding, but each completion may find nothing else in
# flight: calls are held on for the requests it has yet to send, and
# those join (few such holds are wasted: the driver sent nothing during
# them).  A driver that sends nothing until it is woken (QD32, no think
# time) wastes each stream hold, and they back off: a handful in a
# second, not one per batch (its busy holds go on).  QD1 with
# think time never holds.  Nothing stranded, holds within the cap on
# average, less their lateness (6b).
start_file && {
    S0=$(stats); R=$(bench --rw randread --iodepth 32 --think-us 50 --runtime 1 --size 16M); S1=$(stats)
    check irq-moderation-slow-driver-holds-on \
        "(q['calls_held_idle'] > 0 and q['calls_held_wasted'] * 2 < q['calls_held_idle'] and
          q['completions_coalesced'] > q['calls_held'] and
          (q['hold_ns_total'] - q['hold_late_ns_total']) / q['calls_held'] <= 500000 and
          r['requests_submitted'] == r['requests_completed'] and r['errors'] == 0)"
    S0=$(stats); R=$(bench --rw randread --iodepth 32 --runtime 1 --size 16M); S1=$(stats)
    check irq-moderation-waiting-driver-backs-off \
        "(q['calls_held'] > 0 and q['calls_held_idle'] <= 20 and q['calls_held_wasted'] <= 20 and
          r['requests_submitted'] == r['requests_completed'] > 1000 and r['errors'] == 0)"
    S0=$(stats); R=$(bench --rw randread --iodepth 1 --think-us 50 --runtime 1 --size 16M); S1=$(stats)
    check irq-moderation-never-at-qd1-slow-driver \
        "q['calls_held'] == 0 and r['requests_submitted'] == r['requests_completed'] > 100"
    stop
}
# The cap binds: the same slow driver's completions ~60 us apart ask for
# holds of ~8 gaps, longer than a 200 us cap; the holds meant are the cap
# at most (on average, less their lateness: 6b).
start_file --irq-moderation-max-ns 200000 && {
    S0=$(stats); R=$(bench --rw randread --iodepth 32 --think-us 50 --runtime 1 --size 16M); S1=$(stats)
    check irq-moderation-slow-driver-within-cap \
        "(q['calls_held'] > 0 and (q['hold_ns_total'] - q['hold_late_ns_total']) / q['calls_held'] <= 200000 and
          0 <= q['hold_late_ns_total'] <= q['hold_ns_total'] and
          r['requests_submitted'] == r['requests_completed'] and r['errors'] == 0)"
    stop
}
# 6d. Submitting to a slow disk (the file is on the root disk, O_DIRECT):
# requests go to io_uring as they come while the disk has few, in small
# batches once it has many (backend_submits counts io_uring_enter calls):
# at QD32 fewer submissions than requests, but more than one per batch of
# 32.  QD1 submits each request (nothing to wait for).
start_file && {
    S0=$(stats); R=$(bench --rw randwrite --iodepth 1 --runtime 0.5 --size 16M); S1=$(stats)
    check submits-at-once-at-qd1 \
        "t['backend_submits'] >= 0.9 * q['requests'] > 100 and r['errors'] == 0"
    S0=$(stats); R=$(bench --rw randwrite --iodepth 32 --runtime 1 --size 16M); S1=$(stats)
    check submits-in-small-batches-at-qd32 \
        "(q['requests'] / 16 < t['backend_submits'] < q['requests'] / 2 and
          r['requests_submitted'] == r['requests_completed'] > 1000 and r['errors'] == 0)"
    stop
}
start_file --irq-moderation-max-ns 0 && {
    S0=$(stats); R=$(bench --rw randread --iodepth 32 --runtime 1 --size 16M); S1=$(stats)
    check irq-moderation-off-holds-nothing \
        "q['calls_held'] == 0 and r['requests_submitted'] == r['requests_completed']"
    stop
}

# 6e. No completion windows for completions made on our own core: with a
# tiny kick cap and a long completion cap, an O_DIRECT disk's completions
# get windows of their own (they come from the device); in the page cache,
# with the daemon on one CPU (DPIN, or a one-CPU machine), they never do
# (they are made inside io_uring_enter or by io_uring's worker thread, which
# has our affinity: spinning would only delay them).  All requests complete
# either way.
cwin_opts=(--poll-max-ns 2000 --completion-poll-max-ns 1000000)
if [[ $(stat -f -c %T "$tmp") == tmpfs ]]; then
    echo "SKIP: completion-windows-for-the-device ($tmp is on tmpfs: no device)"
    echo "SKIP: device-spinning-measured-both-ways ($tmp is on tmpfs: no device)"
else
    start_file --cache none "${cwin_opts[@]}" && {
        S0=$(stats); R=$(bench --rw randread --iodepth 1 --runtime 1 --size 16M); S1=$(stats)
        check completion-windows-for-the-device \
            "(t['completion_windows'] > 0 and t['completion_poll_hits'] > 0 and
              r['requests_submitted'] == r['requests_completed'] > 100 and r['errors'] == 0)"
        # Whether spinning pays while the device works is measured at most
        # once per 576 timed requests (32 + 32 measured, a run of 512), and
        # less often while the decision repeats (uring.c: uring_spin_note).
        # At QD1 every request is timed.  Fewer may be counted (the loop's
        # pay check or contention keeps the "spinning" half from sampling).
        check device-spinning-measured-at-most-every-576 \
            "(t['device_spin_checks'] <= r['requests_completed'] // 576 + 1 and
              s1['iothreads'][0]['device_spin_off'] in (0, 1) and r['requests_completed'] > 100)"
        stop
    }
    # Whether spinning pays while the device works is measured, not
    # assumed (uring.c: uring_spin_note): the first 32 timed requests with
    # spinning allowed, the next 32 with none while one is on the device,
    # whatever the machine.  About 60 requests at QD1 (one timed each) end
    # inside the second half, before any decision.  The first half finds
    # its completions polling (completion_poll_hits), the second by the
    # eventfd (completion_poll_misses); without the second half all but
    # one or two are hits (checked by turning the second half off).  Not
    # poll_yields: cpu_bound() holds only while the request's CQE is not
    # posted yet, so a yield is counted only if the device has not
    # completed by the time the loop would spin; in one CI run 9 of the
    # second half's 29 requests got one (27-29 in runs here), their
    # completions found by the eventfd all the same.
    start_file --cache none && {
        S0=$(stats); R=$(bench --rw randread --iodepth 1 --rate-iops 100 --runtime 0.6 --size 16M); S1=$(stats)
        check device-spinning-measured-both-ways \
            "(t['completion_poll_hits'] >= 16 and t['completion_poll_misses'] >= 16 and
              40 < r['requests_submitted'] == r['requests_completed'] <= 64 and r['errors'] == 0)"
        stop
    }
fi
start_file --cache writeback "${cwin_opts[@]}" && {
    S0=$(stats)
    R=$(bench --rw randwrite --iodepth 1 --runtime 0.5 --size 16M) &&
        R=$(bench --rw randread --iodepth 4 --runtime 0.5 --size 16M)
    S1=$(stats)
    check no-completion-windows-in-the-page-cache \
        "(t['completion_windows'] == 0 and t['completion_poll_hits'] + t['completion_poll_misses'] > 100 and
          r['requests_submitted'] == r['requests_completed'] > 100 and r['errors'] == 0)"
    stop
}
# On tmpfs io_uring hands every read and write to its worker thread, so
# a pass's few are done on the iothread instead, at its kick: at QD1 none
# goes through the ring (backend_submits), every one is counted
# (backend_sync), O_DIRECT or not; at QD32 the passes' large batches go to
# the ring, and everything completes.
# With --no-sync-io they go to the worker, on our CPU: while one is out
# the loop sleeps at once instead of polling (poll_yields), and every
# request completes.
shm=$(mktemp -p /dev/shm vblk-notify.XXXXXX 2>/dev/null) && [[ $(stat -f -c %T "$shm") == tmpfs ]] &&
    head -c $((16 << 20)) /dev/zero >"$shm" || shm=""
if [[ -z $shm ]]; then
    echo "SKIP: tmpfs-io-on-the-iothread (no tmpfs at /dev/shm)"
    echo "SKIP: page-cache-worker-gets-the-cpu (no tmpfs at /dev/shm)"
else
    for cache in auto writeback; do
        start_disk "$shm" --cache $cache && {
            S0=$(stats); R=$(bench --rw randwrite --iodepth 1 --runtime 0.5); S1=$(stats)
            check tmpfs-io-on-the-iothread-cache-$cache \
                "(t['backend_submits'] == 0 and t['backend_sync'] >= q['requests'] > 200 and
                  r['requests_submitted'] == r['requests_completed'] > 100 and r['errors'] == 0)"
            S0=$(stats); R=$(bench --rw randread --iodepth 32 --runtime 0.5); S1=$(stats)
            check tmpfs-large-batches-through-the-ring-cache-$cache \
                "(t['backend_submits'] > 0 and t['backend_sync'] < q['requests'] and
                  r['requests_submitted'] == r['requests_completed'] > 100 and r['errors'] == 0)"
            stop
        }
    done
    start_disk "$shm" --cache writeback --no-sync-io && {
        S0=$(stats); R=$(bench --rw randwrite --iodepth 1 --runtime 1); S1=$(stats)
        check page-cache-worker-gets-the-cpu \
            "(t['poll_yields'] > 100 and t['completion_windows'] == 0 and t['backend_sync'] == 0 and
              r['requests_submitted'] == r['requests_completed'] > 100 and r['errors'] == 0)"
        stop
    }
    # Allowed every CPU, the worker can run beside us: the completion
    # window is kept (as for a device) and nothing yields.
    if ((ncpu < 2)); then
        echo "SKIP: page-cache-unpinned-keeps-its-window (one CPU)"
    else
        UNPINNED=1 start_disk "$shm" --cache writeback --no-sync-io "${cwin_opts[@]}" && {
            S0=$(stats); R=$(bench --rw randwrite --iodepth 1 --runtime 1); S1=$(stats)
            check page-cache-unpinned-keeps-its-window \
                "(t['poll_yields'] == 0 and t['completion_windows'] > 0 and
                  r['requests_submitted'] == r['requests_completed'] > 100 and r['errors'] == 0)"
            stop
        }
    fi
    rm -f "$shm"
fi

# 6f. Does polling pay (loop/pay.h)?  The client shares the daemon's CPU
# at a lower weight (nice 19, as a VM whose vCPU thread weighs less than
# its disk daemon): while the iothread spins for the next kick, the woken
# client waits for the CPU, so polling delays the very request it waits
# for, and the contention rule cannot see it (the iothread gets all the
# CPU it wants).  The pay check decides "off", and the iothread then spends
# a fraction of the time spinning it spends unchecked (--no-poll-check,
# the same run otherwise).  Then the client moves to the other CPU
# (taskset -p): polling pays again, and a later check turns it back on,
# and kicks are absorbed again.  By counters, never by time.
if ((ncpu >= 2)) && command -v taskset >/dev/null; then
    last=$((ncpu - 1))
    paycheck_start() {	# paycheck_start EXTRA...: vblkd on the last CPU
        rm -f "$tmp/d.sock" "$tmp/c.sock"
        taskset -c $last "$VBLKD" --socket "$tmp/d.sock" --control "$tmp/c.sock" \
            --backend null --size 256M "$@" >"$tmp/vblkd.log" 2>&1 &
        dpid=$!
        for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && break; sleep 0.05; done
    }
    niced_bench() {	# niced_bench SECONDS: QD1 on the daemon's CPU, nice 19
        taskset -c $last nice -n 19 "$BENCH" --socket "$tmp/d.sock" --bs 4k --ramp 0 \
            --rw randread --iodepth 1 --runtime "$1" --json
    }
    iot() {	# iot STATS KEY: iothread 0's counter
        python3 -c "import json,sys; print(json.loads(sys.argv[1])['iothreads'][0][sys.argv[2]])" "$1" "$2"
    }
    paycheck_start --no-poll-check
    S0=$(stats); R=$(niced_bench 3); S1=$(stats); stop
    unchecked_poll_ns=$(( $(iot "$S1" poll_ns_total) - $(iot "$S0" poll_ns_total) ))
    check poll-check-off-runs-unchecked \
        "t['poll_checks'] == 0 and s1['iothreads'][0]['poll_check_off'] == 0 and r['errors'] == 0"
    paycheck_start
    S0=$(stats); R=$(niced_bench 3); S1=$(stats); stop
    # Unchecked, the iothread spins most of the 3 s; a machine so loaded
    # that it did not has not made the case this tests.
    if ((unchecked_poll_ns < 1500000000)); then
        echo "SKIP: poll-check-stops-spinning-that-delays-the-client (unchecked, the" \
             "iothread spun only $((unchecked_poll_ns / 1000000)) ms of 3 s: a loaded machine)"
    else
        check poll-check-stops-spinning-that-delays-the-client \
            "(t['poll_checks_off'] >= 1 and s1['iothreads'][0]['poll_check_off'] == 1 and
              t['poll_ns_total'] * 3 < $unchecked_poll_ns and r['errors'] == 0 and
              r['requests_submitted'] == r['requests_completed'])"
    fi
    # The client moves to the other CPU after 3 s of 8.
    paycheck_start
    # Not through niced_bench: $! must be vblk-bench itself (taskset and
    # nice exec it), not a subshell, for taskset -p to move it.
    taskset -c $last nice -n 19 "$BENCH" --socket "$tmp/d.sock" --bs 4k --ramp 0 \
        --rw randread --iodepth 1 --runtime 8 --json >"$tmp/pay.json" &
    bpid=$!
    sleep 3
    S0=$(stats)
    off_before=$(iot "$S0" poll_check_off)
    taskset -a -p -c 0 "$bpid" >/dev/null
    sleep 4.5
    S1=$(stats)
    wait "$bpid"
    R=$(cat "$tmp/pay.json")
    stop
    check poll-check-returns-to-polling \
        "($off_before == 1 and t['poll_checks'] > t['poll_checks_off'] and
          s1['iothreads'][0]['poll_check_off'] == 0 and q['poll_hits'] > 0 and
          r['errors'] == 0 and r['requests_submitted'] == r['requests_completed'])"
else
    echo "SKIP: poll-check-off-runs-unchecked (needs 2 CPUs and taskset)"
    echo "SKIP: poll-check-stops-spinning-that-delays-the-client (needs 2 CPUs and taskset)"
    echo "SKIP: poll-check-returns-to-polling (needs 2 CPUs and taskset)"
fi

# 7. Control socket: stats keys, runtime knobs, clear errors.
start && {
    out=$(stats)
    if python3 -c "
import json, sys
s = json.loads(sys.argv[1])
keys = {'requests', 'kicks', 'calls', 'calls_early', 'calls_suppressed', 'calls_held', 'calls_held_idle', 'calls_held_wasted',
        'completions_coalesced', 'hold_ns_max', 'hold_ns_total', 'hold_late_ns_total', 'poll_hits', 'poll_misses', 'poll_vain',
        'poll_ns'}
assert keys <= set(s['queues'][0]) and {'busy_ns', 'cpu_ns'} <= set(s['iothreads'][0])
assert s['poll'] == {'max_ns': 65536, 'completion_max_ns': 262144, 'grow': 2, 'shrink': 2, 'check': True}" "$out"; then
        pass ctl-stats-keys
    else
        fail ctl-stats-keys "$out"
    fi
    out=$("$CTL" --control "$tmp/c.sock" set-poll --poll-max-ns 1000 --poll-shrink 0 \
          --completion-poll-max-ns 5000) &&
        python3 -c 'import json, sys; assert json.loads(sys.argv[1])["poll"] == {"max_ns": 1000,
"completion_max_ns": 5000, "grow": 2, "shrink": 0, "check": True}' "$(stats)" &&
        pass ctl-set-poll-at-runtime || fail ctl-set-poll-at-runtime "$out"
    out=$("$CTL" --control "$tmp/c.sock" set-poll --poll-check off) &&
        python3 -c 'import json, sys; assert json.loads(sys.argv[1])["poll"]["check"] is False' \
            "$(stats)" &&
        "$CTL" --control "$tmp/c.sock" set-poll --poll-check on >/dev/null &&
        python3 -c 'import json, sys; assert json.loads(sys.argv[1])["poll"]["check"] is True' \
            "$(stats)" &&
        pass ctl-set-poll-check-at-runtime || fail ctl-set-poll-check-at-runtime "$out"
    rc=0; out=$("$CTL" --control "$tmp/c.sock" set-poll --poll-grow 1) || rc=$?
    ((rc == 1)) && [[ $out == *'"error": "grow must be 2..1024"'* ]] &&
        pass ctl-bad-value-refused || fail ctl-bad-value-refused "rc=$rc $out"
    rc=0; out=$("$CTL" --control "$tmp/c.sock" set-poll --poll-check maybe 2>&1) || rc=$?
    ((rc == 1)) && [[ $out == "vblkctl: --poll-check 'maybe' must be on or off" ]] &&
        pass ctl-bad-poll-check-refused || fail ctl-bad-poll-check-refused "rc=$rc $out"
    # Resize: grows (no frontend to tell), refuses to shrink; bad sizes
    # are the tool's own one-line errors.
    out=$("$CTL" --control "$tmp/c.sock" resize 512M) &&
        [[ $out == *'"ok": true, "size": 536870912, "notified": false'* ]] &&
        pass ctl-resize-grows || fail ctl-resize-grows "$out"
    rc=0; out=$("$CTL" --control "$tmp/c.sock" resize 256M) || rc=$?
    ((rc == 1)) && [[ $out == *'"error": "the disk is 536870912 bytes; shrinking'* ]] &&
        pass ctl-resize-shrink-refused || fail ctl-resize-shrink-refused "rc=$rc $out"
    rc=0; "$CTL" --control "$tmp/c.sock" resize 12x 2>"$tmp/err" || rc=$?
    ((rc == 1)) && [[ $(wc -l <"$tmp/err") == 1 ]] && grep -q "'12x' is not a size" "$tmp/err" &&
        pass ctl-resize-bad-size || fail ctl-resize-bad-size "rc=$rc $(cat "$tmp/err")"
    # Another user who can reach the socket (its group is often the
    # vhost-user socket's, QEMU's user in it) is refused at once: upgrade
    # would exec a program of theirs as us.
    chmod 711 "$tmp"; chmod 777 "$tmp/c.sock"
    out=$(setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
try:
    s.sendall(b"{\"cmd\": \"stats\"}\n")
except OSError:
    pass    # refused at once: the answer may already be there, and the socket closed
print(s.recv(4096).decode().strip())' "$tmp/c.sock" 2>&1)
    [[ $out == *'"error": "permission denied: the control socket serves root and uid 0 only, not uid 65534"'* ]] &&
        grep -q "control socket: refused a client of uid 65534" "$tmp/vblkd.log" &&
        pass ctl-other-user-refused || fail ctl-other-user-refused "$out"
    # vblkctl says why too, also when the refusal came before it sent its
    # request (its send fails then, and the answer is still there to read).
    rc=0
    out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$CTL" --control "$tmp/c.sock" stats 2>&1) ||
        rc=$?
    chmod 700 "$tmp"
    ((rc == 1)) && [[ $out == *'"error": "permission denied: the control socket serves root'* ]] &&
        pass ctl-other-user-refused-vblkctl-says-why ||
        fail ctl-other-user-refused-vblkctl-says-why "rc=$rc $out"
    # A request over 4096 bytes gets an error that says so, whole, although
    # the daemon answers and closes while the client is still sending.  1 MB
    # is more than a unix socket holds (by default) plus what the daemon
    # drains before closing, so the send ends in EPIPE, or ECONNRESET when
    # the close found bytes unread: neither may cost the reply.  (200 KB
    # with a plain sendall raced it: now and then the test died of EPIPE.)
    out=$(python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
try:
    s.sendall(b"{\"cmd\": \"stats\", \"x\": \"" + b"a" * 1000000 + b"\"}\n")
except (BrokenPipeError, ConnectionResetError):
    pass
reply = b""
try:
    while not reply.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
except ConnectionResetError:
    reply += b" (then reset)"
print(reply.decode().strip())' "$tmp/c.sock" 2>&1)
    [[ $out == '{ "error": "request longer than 4096 bytes" }' ]] &&
        pass ctl-request-too-long || fail ctl-request-too-long "$out"
    # A client that trickles its request a byte at a time has one second
    # in all, not one per byte (the main thread serves it meanwhile).
    out=$(python3 -c '
import select, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); t0 = time.time()
while time.time() - t0 < 5:
    try:
        s.send(b" ")
    except (BrokenPipeError, ConnectionResetError):
        break   # cut between a wait and this byte: the answer was the close
    if select.select([s], [], [], 0.3)[0]:
        break
print("%.1f" % (time.time() - t0))' "$tmp/c.sock")
    python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < 2.5 else 1)' "$out" &&
        pass ctl-trickling-client-cut "answered after $out s" ||
        fail ctl-trickling-client-cut "still reading after $out s"
    kill -USR1 "$dpid"; sleep 0.3
    grep -q ' stats { "disk": { "in_flight": .*, "queues": \[' "$tmp/vblkd.log" && pass sigusr1-logs-stats || fail sigusr1-logs-stats
    stop
}
# The counters logged on SIGUSR1 are one whole JSON line however many
# queues there are (a 1 KiB log line once cut them off at four).
start --queues 16 && {
    kill -USR1 "$dpid"; sleep 0.3
    stop
    if python3 -c '
import json, sys
line = [l for l in open(sys.argv[1]) if " stats {" in l][-1]
assert len(json.loads(line.split(" stats ", 1)[1])["queues"]) == 16' "$tmp/vblkd.log"; then
        pass stats-log-line-whole-with-16-queues
    else
        fail stats-log-line-whole-with-16-queues "$(grep -c '' "$tmp/vblkd.log") lines"
    fi
}
rc=0; "$CTL" --control "$tmp/none.sock" stats 2>"$tmp/err" || rc=$?
((rc == 1)) && grep -q "is vblkd running with --control" "$tmp/err" &&
    pass ctl-no-daemon-clear-error || fail ctl-no-daemon-clear-error "$(cat "$tmp/err")"
exit 0
