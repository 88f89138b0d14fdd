#!/usr/bin/env bash
# Description: the error policy (vblkd --werror/--rerror, vblkctl status
# and resume), with vblk-bench as the driver: a thin image on a small tmpfs
# fills up under a --verify write job; with the default (--werror enospc)
# vblkd pauses: vblkctl status says why, requests are held, the metrics
# say paused, one log line, and the client sees no error; the tmpfs grows,
# vblkctl resume submits the held requests again and the job ends with
# every request done and verified.  Again with --error-retry-s 1 and no
# command; again across an upgrade in place while paused (vblk-bench has
# no in-flight region, so the ring stop fails the held requests, as
# documented, and the new process is still paused); --werror report: the
# client gets the errors and nothing pauses; a resume with nothing held
# says so.  The NBD server is a front of the same policy: an nbdcopy into
# the export on the full file system pauses the disk ("NBD write" in the
# reason), waits without an error, and after the resume its bytes are all
# there.  Needs root (mounts tmpfs).
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
BUILD=${1:?usage: test_pause.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench CTL=$BUILD/vblkctl
tmp=$(mktemp -d /tmp/vblk-pause.XXXXXX)
dpid="" bpid=""
cleanup() {
    for p in $dpid $bpid; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    unmount
    rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: pause (needs root to mount a small tmpfs)"; exit 0
fi
mkdir -p "$tmp/fs"

# unmount: io_uring closes its files after the process has exited
# (its ring's teardown is asynchronous): the tmpfs may be busy a moment.
unmount() {
    local i
    for i in $(seq 50); do
        mountpoint -q "$tmp/fs" || return 0
        umount "$tmp/fs" 2>/dev/null && return 0
        sleep 0.1
    done
    umount "$tmp/fs"
}
# fs SIZE: a fresh tmpfs of SIZE with a 64 MiB sparse image on it.
fs() {
    unmount
    mount -t tmpfs -o size="$1" vblk-pause "$tmp/fs" || return 1
    truncate -s 64M "$tmp/fs/disk.img"
}
grow() { mount -o remount,size=128M "$tmp/fs"; }
start() {	# start ARGS...: vblkd on the image with a control socket
    rm -f "$tmp/d.sock" "$tmp/c.sock"
    "$VBLKD" --socket "$tmp/d.sock" --control "$tmp/c.sock" --disk "$tmp/fs/disk.img" \
        "$@" >"$tmp/vblkd.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && return 0; sleep 0.05; done
    fail start "$(tail -3 "$tmp/vblkd.log")"; return 1
}
stop() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; dpid=""; }
ctl() { "$CTL" --control "$tmp/c.sock" "$@"; }
# bench: a verified random-write job over 32 MiB of the image, in the
# background; it outlasts any pause (no stall limit that short).
bench() {
    "$BENCH" --socket "$tmp/d.sock" --rw randwrite --bs 64k --iodepth 8 --size 32M \
        --runtime 2 --ramp 0 --verify --stall-s 120 --json >"$tmp/bench.json" 2>"$tmp/bench.err" &
    bpid=$!
}
# field JSON KEY: a top-level field of a JSON object
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2]))" "$1" "$2"; }
# wait_state STATE SECONDS: until vblkctl status says STATE
wait_state() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [[ $(field "$(ctl status)" state) == "$1" ]] && return 0
        sleep 0.1
    done
    return 1
}
# bench_ok NAME: the job ended with every request done, verified, no error
bench_ok() {
    local rc=0
    wait "$bpid" || rc=$?
    bpid=""
    if ((rc == 0)) && python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
sys.exit(0 if r['errors'] == 0 and r['requests_submitted'] == r['requests_completed'] > 0 else 1)
" "$tmp/bench.json"; then pass "$1"; else fail "$1" "rc=$rc $(cat "$tmp/bench.err") $(head -c 400 "$tmp/bench.json")"; fi
}

# 1. The default policy: full file system -> paused, told, resumed.
fs 8M && start && {
    bench
    if wait_state paused 20; then
        st=$(ctl status)
        if [[ $(field "$st" reason) == *"No space left on device"* ]] &&
           (($(field "$st" held_requests) > 0)) && kill -0 "$bpid" 2>/dev/null; then
            pass enospc-pauses-and-holds
        else
            fail enospc-pauses-and-holds "$st"
        fi
        m=$(ctl metrics)
        if grep -qx 'vblkd_disk_paused 1' <<<"$m" &&
           grep -q '^vblkd_disk_pauses_total{reason="enospc"} 1$' <<<"$m" &&
           grep -Eq '^vblkd_disk_held_requests [1-9]' <<<"$m"; then
            pass paused-in-metrics
        else
            fail paused-in-metrics "$(grep -E 'paused|pauses|held' <<<"$m")"
        fi
        n=$(grep -c ' paused: No space left on device' "$tmp/vblkd.log")
        if ((n == 1)); then pass paused-one-log-line; else fail paused-one-log-line "$n lines"; fi
        grow
        rep=$(ctl resume)
        if [[ $(field "$rep" ok) == True ]] && (($(field "$rep" resubmitted) > 0)); then
            pass resume-resubmits
        else
            fail resume-resubmits "$rep"
        fi
        bench_ok resumed-job-verified
        [[ $(field "$(ctl status)" state) == running ]] && grep -qx 'vblkd_disk_paused 0' <<<"$(ctl metrics)" &&
            pass running-after-resume || fail running-after-resume "$(ctl status)"
        rep=$(ctl resume)
        [[ $(field "$rep" resubmitted) == 0 && $(field "$rep" state) == running ]] &&
            pass resume-with-nothing-held || fail resume-with-nothing-held "$rep"
    else
        fail enospc-pauses-and-holds "not paused within 20 s: $(ctl status) $(tail -3 "$tmp/vblkd.log")"
    fi
    stop
}

# 2. --error-retry-s 1: it resumes by itself once there is room.
fs 8M && start --error-retry-s 1 && {
    bench
    if wait_state paused 20; then
        grow
        if wait_state running 10; then pass retry-resumes-by-itself; else
            fail retry-resumes-by-itself "$(ctl status)"; fi
        bench_ok retried-job-verified
        grep -q 'retrying the held requests' "$tmp/vblkd.log" && pass retry-logged || fail retry-logged
    else
        fail retry-resumes-by-itself "not paused within 20 s"
    fi
    stop
}

# 3. An upgrade in place while paused: the new process is paused too, for
#    the same reason.  vblk-bench negotiates no in-flight region: the held
#    requests fail as the rings stop for the handover, and the log says so.
fs 8M && start && {
    bench
    if wait_state paused 20; then
        old=$dpid
        rep=$(ctl upgrade)
        newpid=$(field "$rep" pid)
        wait "$old" 2>/dev/null
        if [[ $(field "$rep" ok) == True ]] && wait_state paused 5 &&
           [[ $(field "$(ctl status)" reason) == *"No space left on device"* ]]; then
            pass paused-across-upgrade
        else
            fail paused-across-upgrade "$rep $(ctl status)"
        fi
        grep -q 'held request.* failed with an I/O error as the ring stopped (no in-flight region' \
            "$tmp/vblkd.log" && pass held-fail-at-stop-without-region ||
            fail held-fail-at-stop-without-region "$(grep -i held "$tmp/vblkd.log")"
        # The new process holds what the client sent after the upgrade:
        # resume before waiting for the client (waiting first sat out the
        # client's 120 s stall limit).
        grow
        ctl resume >/dev/null
        wait_state running 5 && pass resumed-after-upgrade || fail resumed-after-upgrade "$(ctl status)"
        for _ in $(seq 200); do kill -0 "$bpid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$bpid" 2>/dev/null; then
            fail held-after-upgrade-done-at-resume "the client still waits 20 s after the resume"
        else
            pass held-after-upgrade-done-at-resume
        fi
        wait "$bpid" 2>/dev/null; bpid=""
        dpid=$newpid
    else
        fail paused-across-upgrade "not paused within 20 s"
    fi
    stop
}

# 4. --werror report: the errors go to the client, nothing pauses.
fs 8M && start --werror report && {
    bench
    wait "$bpid"; bpid=""
    errors=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['errors'])" "$tmp/bench.json" 2>/dev/null)
    if [[ -n $errors ]] && ((errors > 0)) && [[ $(field "$(ctl status)" state) == running ]] &&
       ! grep -q ' paused:' "$tmp/vblkd.log"; then
        pass werror-report-reports
    else
        fail werror-report-reports "errors=$errors $(ctl status)"
    fi
    stop
}

# 5. The NBD server under the same policy: nbdcopy into the export fills
#    the file system, the disk pauses with the NBD write as the reason,
#    the copy waits (no error), resumes, and reads back equal.
if command -v nbdcopy >/dev/null; then
    head -c $((32 << 20)) /dev/urandom >"$tmp/nbd.src"
    if fs 8M && start --nbd "unix:$tmp/n.sock"; then
        nbdcopy "$tmp/nbd.src" "nbd+unix:///?socket=$tmp/n.sock" 2>"$tmp/nbdcopy.err" &
        bpid=$!
        if wait_state paused 20; then
            st=$(ctl status)
            if [[ $(field "$st" reason) == *"No space left on device (NBD write at offset"* ]] &&
               (($(field "$st" held_requests) > 0)) && kill -0 "$bpid" 2>/dev/null; then
                pass nbd-write-pauses-and-holds
            else
                fail nbd-write-pauses-and-holds "$st"
            fi
            grow
            rep=$(ctl resume)
            rc=0; wait "$bpid" || rc=$?; bpid=""
            if (($(field "$rep" resubmitted) > 0)) && ((rc == 0)) &&
               nbdcopy "nbd+unix:///?socket=$tmp/n.sock" "$tmp/nbd.out" &&
               cmp -s "$tmp/nbd.src" <(head -c $((32 << 20)) "$tmp/nbd.out"); then
                pass nbd-resumed-copy-complete
            else
                fail nbd-resumed-copy-complete "rc=$rc $rep $(cat "$tmp/nbdcopy.err")"
            fi
        else
            fail nbd-write-pauses-and-holds "not paused within 20 s: $(ctl status) $(tail -3 "$tmp/vblkd.log")"
        fi
        stop
    fi
fi
