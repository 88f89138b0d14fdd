#!/usr/bin/env bash
# Description: vblk-bench (our userspace virtio-blk driver) against vblkd
# and qemu-storage-daemon: verified I/O with 1 and 2 jobs, counters that
# agree between driver and daemon, verification that really catches bad
# data, dirty logging switched under load with a migration check, clear
# errors for bad arguments, block-device discard limits, and frontends that
# die or shrink shared memory under us.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
BUILD=${1:?usage: test_driver.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench
tmp=$(mktemp -d /tmp/vblk-drv.XXXXXX)
dpid=""
cleanup() {
    [[ -n $dpid ]] && kill "$dpid" 2>/dev/null; wait 2>/dev/null
    [[ -n ${loopdev:-} ]] && losetup -d "$loopdev" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

start() {	# start LOG CMD...: background daemon, wait for its socket
    local log=$1 sock=$tmp/d.sock; shift
    rm -f "$sock"
    "$@" >"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $sock ]] && return 0; sleep 0.05; done
    fail "daemon-start" "$(tail -3 "$log")"; return 1
}
stop() {	# SIGTERM; the daemon logs its final counters
    kill -TERM "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; dpid=""
}
# check NAME JSON PYTHON-EXPR [env]: evaluate a condition over the JSON result
check() {
    local name=$1 json=$2 expr=$3
    if python3 -c "
import json, sys
r = json.loads(sys.argv[1]); daemon = json.loads(sys.argv[2])
ok = $expr
if not ok:
    print({k: r.get(k) for k in ('ios','errors','verify_errors','verified','kicks','calls',
          'requests_submitted','requests_completed','bad_used')}, daemon)
sys.exit(0 if ok else 1)" "$json" "${4:-{\}}"; then
        pass "$name"
    else
        fail "$name"
    fi
}
# daemon_requests LOG: {"requests": [per queue]} from the counters the
# daemon logs as JSON when it exits
daemon_requests() {
    python3 -c "
import json, sys
stats = [l.split('stats ', 1)[1] for l in open(sys.argv[1]) if ' stats {' in l]
q = json.loads(stats[-1])['queues'] if stats else []
print(json.dumps({'requests': [x['requests'] for x in q]}))" "$1"
}

truncate -s 64M "$tmp/disk.img"

# Split rings, then packed (--packed: lists and indirect tables, both ways
# a packed driver may hand over a request), 1 and 2 queues.
for variant in "1" "2" "1 --packed" "2 --packed"; do
    set -- $variant
    jobs=$1 ring=${2:-}
    name="vblkd-verify-${jobs}job${ring:+-packed}"
    start "$tmp/$name.log" "$VBLKD" --socket "$tmp/d.sock" --disk "$tmp/disk.img" --queues 2 || continue
    out=$("$BENCH" --socket "$tmp/d.sock" --rw randrw --bs 4k --iodepth 8 --numjobs "$jobs" \
          --runtime 1 --ramp 0 --size 8M --rate-iops 4000 --verify --json $ring 2>"$tmp/$name.err")
    rc=$?
    stop
    d=$(daemon_requests "$tmp/$name.log")
    if ((rc == 0)); then pass "$name-exit-0"; else fail "$name-exit-0" "rc=$rc $(head -3 "$tmp/$name.err")"; fi
    [[ -n $out ]] || { fail "$name-json" "no output"; continue; }
    check "$name-data" "$out" "r['errors'] == 0 and r['verify_errors'] == 0 and r['verified'] >= 1000"
    check "$name-each-request-seen-once" "$out" \
        "r['requests_submitted'] == r['requests_completed'] and r['bad_used'] == 0"
    check "$name-daemon-agrees" "$out" "sum(daemon['requests']) == r['requests_submitted']" "$d"
    check "$name-kicks-at-most-requests" "$out" "r['kicks'] <= r['ios'] and r['calls'] <= r['ios']"
    if ((jobs == 2)); then
        check "$name-both-queues-used" "$out" "len(daemon['requests']) == 2 and min(daemon['requests']) > 0" "$d"
    fi
done

# The polled ring's fallback (--iopoll): told to poll where the device
# cannot (a test hook skips the queue check; this machine's disks have no
# poll queues), the kernel refuses the polled requests that reach the
# device (EOPNOTSUPP); vblkd says so once and serves them all with
# interrupts, the driver seeing nothing.  (A few polled reads may still
# complete -- 0 to 10 of them per run here, even on an image written
# through -- so their number is printed, not checked.)
name=iopoll-refused-falls-back
if start "$tmp/$name.log" env VBLKD_IOPOLL_UNCHECKED=1 "$VBLKD" --socket "$tmp/d.sock" \
        --disk "$tmp/disk.img" --iopoll on --cache none; then
    out=$("$BENCH" --socket "$tmp/d.sock" --rw randrw --bs 4k --iodepth 8 --runtime 1 --ramp 0 \
          --size 8M --rate-iops 4000 --verify --json 2>"$tmp/$name.err")
    rc=$?
    stop
    check "$name-verify" "$out" "r['errors'] == 0 and r['verify_errors'] == 0 and r['verified'] >= 1000"
    polled=$(python3 -c "
import json, sys
s = [l.split('stats ', 1)[1] for l in open(sys.argv[1]) if ' stats {' in l]
print(sum(t['backend_polled'] for t in json.loads(s[-1])['iothreads']) if s else '')" "$tmp/$name.log")
    refused=$(grep -c "refused polled I/O" "$tmp/$name.log")
    echo "  ($name: $polled I/Os completed on the polled ring)"
    if ((rc == 0)) && grep -q "O_DIRECT, polled" "$tmp/$name.log" && [[ $refused == 1 && -n $polled ]]; then
        pass "$name-logged-once"
    else
        fail "$name-logged-once" "rc=$rc, refusals logged $refused, polled ${polled:-?}"
    fi
fi

# Verification must catch bad data: the null backend drops writes.
if start "$tmp/null.log" "$VBLKD" --socket "$tmp/d.sock" --backend null --size 64M; then
    out=$("$BENCH" --socket "$tmp/d.sock" --rw randwrite --iodepth 4 --runtime 0.3 --ramp 0 \
          --size 1M --verify --json 2>/dev/null)
    rc=$?
    stop
    if ((rc == 1)); then pass verify-catches-lost-writes-exit-1; else fail verify-catches-lost-writes-exit-1 "rc=$rc"; fi
    check verify-catches-lost-writes "$out" "r['verify_errors'] > 0 and r['errors'] >= r['verify_errors']"
fi

# The same driver against the peer, on the same kind of image.
if command -v qemu-storage-daemon >/dev/null; then
    if start "$tmp/qsd.log" qemu-storage-daemon \
        --blockdev "driver=file,node-name=f0,filename=$tmp/disk.img,aio=io_uring" \
        --export "type=vhost-user-blk,id=e0,node-name=f0,addr.type=unix,addr.path=$tmp/d.sock,writable=on,num-queues=2"; then
        out=$("$BENCH" --socket "$tmp/d.sock" --rw randrw --bs 8k --iodepth 8 --numjobs 2 \
              --runtime 1 --ramp 0 --size 8M --rate-iops 4000 --verify --json 2>"$tmp/qsd.err")
        rc=$?
        stop
        if ((rc == 0)); then pass qsd-verify-2jobs-exit-0; else fail qsd-verify-2jobs-exit-0 "rc=$rc $(head -3 "$tmp/qsd.err")"; fi
        check qsd-verify-2jobs-data "$out" "r['errors'] == 0 and r['verified'] >= 1000 and r['requests_submitted'] == r['requests_completed']"
    fi
    # QSD (libvhost-user) has no packed rings: a clear refusal.
    if start "$tmp/qsd.log" qemu-storage-daemon \
        --blockdev "driver=file,node-name=f0,filename=$tmp/disk.img,aio=io_uring" \
        --export "type=vhost-user-blk,id=e0,node-name=f0,addr.type=unix,addr.path=$tmp/d.sock,writable=on"; then
        rc=0
        "$BENCH" --socket "$tmp/d.sock" --rw randread --runtime 0.2 --packed 2>"$tmp/qsd.err" >/dev/null || rc=$?
        stop
        if ((rc != 0)) && grep -q "does not offer packed rings" "$tmp/qsd.err"; then
            pass bench-packed-refused-by-qsd-clearly
        else
            fail bench-packed-refused-by-qsd-clearly "rc=$rc $(head -2 "$tmp/qsd.err")"
        fi
    fi
else
    echo "SKIP: qsd-verify (qemu-storage-daemon not installed)"
fi

# Live migration from the source's side (vblk-bench --migrate-check,
# src/driver/vdrv_log.h): dirty logging on before the jobs start, off and
# on again every 100 ms under verified randrw (each "on" a new bulk copy,
# the run ending "on"), the log synced every 50 ms; then the rings are
# stopped (GET_VRING_BASE: each base must be where the driver stopped) and
# memory is compared with the copy the log let us keep.  A differing byte
# was written by the backend and never logged: a destination would resume
# with a stale copy of it.
#
# vblkd must be exact: no request lost or stalled while VHOST_F_LOG_ALL and
# VHOST_VRING_F_LOG flip under load, data verified, zero bytes unlogged.
# A backend that offers no LOG_SHMFD fails each case at once, saying so.
#
# qemu-storage-daemon (libvhost-user) is the peer we measure the protocol
# exchange against, not a backend whose logging we own: which of its writes
# it logs depends on its version (QEMU 7.2 logged all of them when this was
# written).  So its cases pass on "no request lost, ring bases right, data
# verified, logging really switched", and what it left unlogged, if
# anything, is reported on the PASS line (and as an INFO line in the log).
migrate_case() {	# NAME JOBS STRICT(0|1): vblk-bench against $tmp/d.sock
    local name=$1 jobs=$2 strict=$3 out rc why
    out=$(timeout 30 "$BENCH" --socket "$tmp/d.sock" --rw randrw --bs 4k --iodepth 8 \
          --numjobs "$jobs" --runtime 1 --ramp 0 --size 8M --verify \
          --migrate-check --log-toggle-ms 100 --json 2>"$tmp/$name.err")
    rc=$?
    if [[ -z $out ]]; then
        why=$(head -1 "$tmp/$name.err")
        grep -q "does not offer LOG_SHMFD" "$tmp/$name.err" &&
            why="backend does not offer LOG_SHMFD"
        fail "$name" "rc=$rc ${why:-no output}"
        return
    fi
    python3 - "$name" "$strict" "$rc" "$out" <<'PY'
import json, sys
name, strict, rc, r = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), json.loads(sys.argv[4])
m = r["migrate_check"] or {}
areas = ", ".join(f"{k} {v['bytes']} B/{v['pages']} pages"
                  + (f" ({'/'.join(v['fields'])})" if v["fields"] else "")
                  for k, v in (m.get("areas") or {}).items())
unlogged = f"{m.get('mismatch_bytes')} bytes unlogged" + (f": {areas}" if areas else "")
def result(case, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'}: {name}-{case}" + (f": {detail}" if detail else ""))
lost = not (r["requests_submitted"] == r["requests_completed"] and r["errors"] == 0
            and r["bad_used"] == 0 and m.get("checked") is True
            and m.get("ring_bases_ok") is True)
result("no-request-lost", not lost,
       f"submitted {r['requests_submitted']} completed {r['requests_completed']} "
       f"errors {r['errors']} bad_used {r['bad_used']} check {m}" if lost else
       "" if strict else f"(info: {unlogged})")
result("verify-clean", r["verify_errors"] == 0 and r["verified"] >= 1000,
       "" if r["verify_errors"] == 0 else f"verified {r['verified']}, {r['verify_errors']} mismatches")
result("logging-switched-under-load",
       r["log_toggles"] >= 2 and r["log_bulk_copies"] == r["log_toggles"] // 2 + 1
       and r["log_syncs"] > 0 and r["log_dirty_pages"] > 0,
       f"toggles {r['log_toggles']} bulk copies {r['log_bulk_copies']} syncs "
       f"{r['log_syncs']} dirty pages {r['log_dirty_pages']}")
if strict:
    result("nothing-unlogged", m.get("mismatch_bytes") == 0 and rc == 0,
           "" if m.get("mismatch_bytes") == 0 else unlogged)
else:
    print(f"INFO: {name}: {unlogged}, slowest log switch {r['log_switch_max_us']:.0f} us")
PY
}

for jobs in 1 2; do
    if command -v qemu-storage-daemon >/dev/null; then
        if start "$tmp/qsd-mig.log" qemu-storage-daemon \
            --blockdev "driver=file,node-name=f0,filename=$tmp/disk.img,aio=io_uring" \
            --export "type=vhost-user-blk,id=e0,node-name=f0,addr.type=unix,addr.path=$tmp/d.sock,writable=on,num-queues=2"; then
            migrate_case "qsd-migrate-check-${jobs}job" "$jobs" 0
            stop
        fi
    else
        echo "SKIP: qsd-migrate-check-${jobs}job (qemu-storage-daemon not installed)"
    fi
    name="vblkd-migrate-check-${jobs}job"
    if start "$tmp/$name.log" "$VBLKD" --socket "$tmp/d.sock" --disk "$tmp/disk.img" --queues 2; then
        migrate_case "$name" "$jobs" 1
        stop
    fi
done

# Clear errors.
expect_error() {	# NAME PATTERN ARGS...
    local name=$1 pat=$2 rc=0; shift 2
    "$BENCH" "$@" >/dev/null 2>"$tmp/err" || rc=$?
    if ((rc == 1)) && [[ $(wc -l <"$tmp/err") -eq 1 ]] && grep -qE -- "$pat" "$tmp/err"; then
        pass "$name"
    else
        fail "$name" "rc=$rc: $(cat "$tmp/err")"
    fi
}
expect_error bench-nobody-listening "cannot connect to .*is a vhost-user-blk backend" --socket "$tmp/none.sock" --rw read
expect_error bench-bad-rw "--rw 'sideways' is not one of" --socket "$tmp/d.sock" --rw sideways
expect_error bench-bad-bs "--bs 1000 must be a multiple of 512" --socket "$tmp/d.sock" --rw read --bs 1000
expect_error bench-verify-needs-writes "--verify needs a workload that writes" --socket "$tmp/d.sock" --rw read --verify
expect_error bench-unknown-flag "unknown option '--fast'" --socket "$tmp/d.sock" --rw read --fast
expect_error bench-log-toggle-needs-runtime "--log-toggle-ms 600 needs a --runtime longer than 1200 ms" \
    --socket "$tmp/d.sock" --rw randrw --runtime 1 --log-toggle-ms 600
expect_error bench-bad-log-toggle "--log-toggle-ms 'often' is not a number" \
    --socket "$tmp/d.sock" --rw randrw --log-toggle-ms often
if start "$tmp/q1.log" "$VBLKD" --socket "$tmp/d.sock" --backend null --size 64M; then
    expect_error bench-too-many-jobs "offers 1 queue, 2 asked" --socket "$tmp/d.sock" --rw read --numjobs 2
    stop
fi

# Regression: started with stdin closed, the daemon opened its disk as fd 0
# and vu_server_new() closed it (calloc'ed ring fds read as 0).
rm -f "$tmp/d.sock"
"$VBLKD" --socket "$tmp/d.sock" --disk "$tmp/disk.img" <&- >"$tmp/fd0.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && break; sleep 0.05; done
out=$("$BENCH" --socket "$tmp/d.sock" --rw randrw --iodepth 4 --runtime 0.5 --ramp 0 --size 4M \
      --verify --json 2>/dev/null)
rc=$?
stop
if ((rc == 0)) && ! grep -q "Bad file descriptor" "$tmp/fd0.log"; then
    pass stdin-closed-daemon-keeps-its-disk
else
    fail stdin-closed-daemon-keeps-its-disk "rc=$rc $(grep -m1 error "$tmp/fd0.log")"
fi

# A frontend that dies mid-I/O: the daemon finishes (or fails) what was in
# flight before unmapping that frontend's memory, and serves the next one.
# (Under tests/run asan this runs on the ASan build: a late write into
# unmapped memory would be a report, not luck.)
rm -f "$tmp/d.sock"
"$VBLKD" --socket "$tmp/d.sock" --disk "$tmp/disk.img" --queues 2 >"$tmp/die.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && break; sleep 0.05; done
for k in 1 2 3; do
    "$BENCH" --socket "$tmp/d.sock" --rw randwrite --bs 64k --iodepth 32 --numjobs 2 \
        --runtime 5 --ramp 0 --size 32M >/dev/null 2>&1 &
    bpid=$!
    sleep 0.4
    kill -9 "$bpid"; wait "$bpid" 2>/dev/null
done
out=$("$BENCH" --socket "$tmp/d.sock" --rw randrw --iodepth 8 --runtime 0.5 --ramp 0 --size 4M \
      --verify --json 2>/dev/null)
rc=$?
if ((rc == 0)) && kill -0 "$dpid" 2>/dev/null; then
    pass frontend-killed-mid-io-next-one-served
else
    fail frontend-killed-mid-io-next-one-served "rc=$rc $(tail -3 "$tmp/die.log")"
fi
stop
# Error lines ("... error: ..."), not the counters logged at exit ("errors": 0).
if grep -qE " error: |ERROR|Sanitizer" "$tmp/die.log"; then
    fail frontend-killed-mid-io-clean "$(grep -m2 -E " error: |Sanitizer" "$tmp/die.log")"
else
    pass frontend-killed-mid-io-clean
fi

# The driver sleeps in one read(2) of the call eventfd, with no timeout of
# its own: its waker thread pokes a job asleep past 100 ms, and a poke is
# not a call.  A daemon stopped for 1.5 s (SIGSTOP, under the 5 s stall
# limit) must cost nothing but time: the run ends without errors, and
# without a call counted for each of the ~15 pokes (calls <= requests
# completed: not ios, which leaves out the last completion when the run's
# end falls between a request's call and its count, 15828 against 15827
# once under ASan).  Stopped past --stall-s, the stall is still reported
# (exit 1, "stranded").
for variant in paused stalled; do
    name="driver-sleeps-through-a-${variant}-daemon"
    start "$tmp/$name.log" "$VBLKD" --socket "$tmp/d.sock" --disk "$tmp/disk.img" || continue
    if [[ $variant == paused ]]; then hold=1.5 stall=(); else hold=3 stall=(--stall-s 1); fi
    ( sleep 0.5; kill -STOP "$dpid"; sleep "$hold"; kill -CONT "$dpid" ) &
    out=$("$BENCH" --socket "$tmp/d.sock" --rw randread --iodepth 1 --runtime 2.5 --ramp 0 \
          --size 8M "${stall[@]}" --json 2>"$tmp/$name.err")
    rc=$?
    wait $!
    stop
    if [[ $variant == paused ]]; then
        if ((rc == 0)); then pass "$name-exit-0"; else fail "$name-exit-0" "rc=$rc $(head -3 "$tmp/$name.err")"; fi
        check "$name-pokes-are-not-calls" "$out" \
            "r['errors'] == 0 and r['ios'] > 0 and r['calls'] <= r['requests_completed']"
    elif ((rc == 1)) && grep -q "stranded" "$tmp/$name.err"; then
        pass "$name-reported"
    else
        fail "$name-reported" "rc=$rc $(head -3 "$tmp/$name.err")"
    fi
done

# A block device exports its own discard limits: the unit it deallocates
# in becomes discard_sector_alignment, and a device that cannot discard
# (discard_max_bytes 0) is not offered DISCARD at all, instead of failing
# every discard the guest sends.  Needs root and loop devices.
loopdev=""
if ((EUID == 0)) && command -v losetup >/dev/null && truncate -s 64M "$tmp/loop.img" &&
   loopdev=$(losetup -f --show "$tmp/loop.img" 2>/dev/null); then
    q=/sys/block/${loopdev#/dev/}/queue
    for variant in native no-discard; do
        name="blockdev-discard-limits ($variant)"
        if [[ $variant == no-discard ]] && ! echo 0 >"$q/discard_max_bytes" 2>/dev/null; then
            echo "SKIP: $name (cannot lower discard_max_bytes)"; continue
        fi
        gran=$(cat "$q/discard_granularity") max=$(cat "$q/discard_max_bytes")
        start "$tmp/loop.log" "$VBLKD" --socket "$tmp/d.sock" --disk "$loopdev" || continue
        out=$("$BENCH" --socket "$tmp/d.sock" --rw randrw --iodepth 4 --runtime 0.3 --ramp 0 \
              --size 4M --verify --json 2>&1)
        stop
        if [[ $variant == native ]]; then
            check "$name" "$out" "r['errors'] == 0 and r['verified'] > 0 and (r['discard'] == ($max > 0)) and r['discard_sector_alignment'] == max($gran, 512) // 512"
        else
            check "$name" "$out" "r['errors'] == 0 and r['verified'] > 0 and r['discard'] is False and 'cannot discard' in open('$tmp/loop.log').read()"
        fi
    done
    losetup -d "$loopdev"; loopdev=""
else
    echo "SKIP: blockdev-discard-limits (needs root and a loop device)"
fi

# A frontend that shrinks the memory file it shares with us after we
# mapped it: touching the lost pages raises SIGBUS.  The daemon must
# survive it (the guard in mem/guard.c), drop that frontend with a line
# saying why, and serve the next one (hostile-shrink checks both ends).
if [[ -x $BUILD/hostile-shrink ]]; then
    rm -f "$tmp/d.sock"
    "$VBLKD" --socket "$tmp/d.sock" --disk "$tmp/disk.img" >"$tmp/shrink.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && break; sleep 0.05; done
    "$BUILD/hostile-shrink" "$tmp/d.sock" 2>"$tmp/shrink.err"
    rc=$?
    if ((rc == 0)) && kill -0 "$dpid" 2>/dev/null &&
       grep -q "dropping the frontend: it shrank memory it shares with us" "$tmp/shrink.log"; then
        pass frontend-shrinks-memory-daemon-survives
    else
        fail frontend-shrinks-memory-daemon-survives \
            "rc=$rc $(cat "$tmp/shrink.err") $(tail -3 "$tmp/shrink.log")"
    fi
    stop
else
    fail frontend-shrinks-memory-daemon-survives "$BUILD/hostile-shrink not built"
fi
exit 0
