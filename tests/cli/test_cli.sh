#!/usr/bin/env bash
# Description: user-facing errors and lifecycle of the vblkd command line:
# one clear line and exit 1 for every mistake, nothing half-created, stale
# sockets replaced, live ones left alone, SIGTERM exits 0 and cleans up;
# log lines timestamped in ISO 8601, or for journald under systemd.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
VBLKD=${1:?usage: test_cli.sh PATH/TO/vblkd}
tmp=$(mktemp -d /tmp/vblk-cli.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

# expect_error NAME PATTERN ARGS...: exit 1, exactly one stderr line
# matching PATTERN, nothing on stdout.
expect_error() {
    local name=$1 pat=$2; shift 2
    local rc=0 out err
    out=$("$VBLKD" "$@" 2>"$tmp/err") || rc=$?
    err=$(cat "$tmp/err")
    if ((rc != 1)); then fail "$name" "exit status $rc, want 1 (stderr: $err)"; return 1; fi
    if [[ $(wc -l <"$tmp/err") -ne 1 ]]; then fail "$name" "want one stderr line, got: $err"; return 1; fi
    if ! grep -qE -- "$pat" "$tmp/err"; then fail "$name" "'$err' does not match /$pat/"; return 1; fi
    [[ -z $out ]] || { fail "$name" "unexpected stdout: $out"; return 1; }
    pass "$name"
}

# start_daemon LOG ARGS...: start vblkd in the background, wait for its
# socket (the --socket argument must be given as $tmp/*.sock).
start_daemon() {
    local log=$1 sock=""; shift
    local a prev=""
    for a in "$@"; do [[ $prev == --socket ]] && sock=$a; prev=$a; done
    "$VBLKD" "$@" >"$log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do
        grep -q "serving" "$log" 2>/dev/null && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

truncate -s 16M "$tmp/disk.img"

expect_error missing-socket-flag "missing --socket" --disk "$tmp/disk.img"
expect_error missing-disk-flag "missing --disk" --socket "$tmp/a.sock"
expect_error disk-does-not-exist "does not exist.*--disk" --socket "$tmp/a.sock" --disk "$tmp/nope.img"
[[ -e $tmp/a.sock ]] && fail no-socket-left-behind "socket created despite the error" || pass no-socket-left-behind
expect_error queues-zero "--queues '0' is not a number from 1" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --queues 0
expect_error queues-garbage "--queues 'x2'" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --queues x2
expect_error block-size-odd "--block-size must be 512 or 4096" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --block-size 1024
expect_error cache-unknown "--cache 'fast' is not one of" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --cache fast
expect_error log-level-unknown "--log-level 'loud'" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --log-level loud
expect_error unknown-flag "unknown option .--frobnicate." --socket "$tmp/a.sock" --disk "$tmp/disk.img" --frobnicate
expect_error flag-without-value "option .--queues. needs a value" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --queues
expect_error stray-argument "unexpected argument 'extra'" --socket "$tmp/a.sock" --disk "$tmp/disk.img" extra
expect_error serial-too-long "longer than 20 bytes" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --serial 012345678901234567890
expect_error backend-unknown "unknown backend 'spdk'" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --backend spdk

# Engine modules (docs/architecture.md "Engine modules"): the rbd and nbd
# engines are loaded when a disk needs them, from beside the binary here;
# one not installed ($VBLKD_MODULE_DIR pointed at an empty directory) is one
# line naming the file and the package, exit 1, nothing created.
engines=$("$VBLKD" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --backend spdk 2>&1)
mkdir "$tmp/no-modules"
for e in rbd nbd; do
    if [[ $engines != *" $e"* ]]; then
        echo "SKIP: module-$e-missing (built without the $e engine)"
        continue
    fi
    if [[ $e == rbd ]]; then
        d=rbd:pool/image; loaded="cannot read Ceph config"
        more=(--ceph-conf "$tmp/no-such-ceph.conf")
    else
        d=nbd://127.0.0.1:1/export; loaded="NBD export .* cannot connect"; more=()
    fi
    VBLKD_MODULE_DIR=$tmp/no-modules expect_error "module-$e-missing" \
        "^vblkd: --disk '$d' needs the $e engine module $tmp/no-modules/vblkd-$e.so, which is not installed: install the Debian package vblkd-$e\$" \
        --socket "$tmp/a.sock" --disk "$d" "${more[@]}"
    [[ -e $tmp/a.sock ]] && fail "module-$e-missing-no-socket" || pass "module-$e-missing-no-socket"
    # Found beside the binary: the engine itself answers.
    expect_error "module-$e-loads" "$loaded" --socket "$tmp/a.sock" --disk "$d" "${more[@]}"
done
: >"$tmp/empty.img"
expect_error disk-empty "is empty" --socket "$tmp/a.sock" --disk "$tmp/empty.img"
mkdir "$tmp/dir.img"
expect_error disk-is-directory "not a regular file or block device" --socket "$tmp/a.sock" --disk "$tmp/dir.img"
echo keep >"$tmp/notasocket"
expect_error socket-path-is-a-file "exists and is not a socket" --socket "$tmp/notasocket" --disk "$tmp/disk.img"
[[ $(cat "$tmp/notasocket") == keep ]] && pass file-at-socket-path-untouched || fail file-at-socket-path-untouched
expect_error socket-dir-missing "does its directory exist" --socket "$tmp/no/such/dir.sock" --disk "$tmp/disk.img"
expect_error socket-path-too-long "longer than 107 bytes" --socket "$tmp/$(printf 'x%.0s' {1..120}).sock" --disk "$tmp/disk.img"

# Not writable: run as nobody against a root-owned 0644 disk.
if command -v setpriv >/dev/null && [[ $(id -u) -eq 0 ]]; then
    chmod 0777 "$tmp"
    cp "$tmp/disk.img" "$tmp/ro.img"; chmod 0644 "$tmp/ro.img"
    rc=0
    setpriv --reuid=65534 --regid=65534 --clear-groups "$VBLKD" --socket "$tmp/n.sock" \
        --disk "$tmp/ro.img" 2>"$tmp/err" || rc=$?
    if ((rc == 1)) && grep -q "is not writable.*--read-only" "$tmp/err" &&
       [[ $(wc -l <"$tmp/err") -eq 1 && ! -e $tmp/n.sock ]]; then
        pass disk-not-writable
    else
        fail disk-not-writable "rc=$rc: $(cat "$tmp/err")"
    fi
    # ... and with --read-only the same user may serve it.
    if start_daemon "$tmp/ro.log" --socket "$tmp/n2.sock" --disk "$tmp/ro.img" --read-only; then
        pass read-only-serves-unwritable-disk
    else
        fail read-only-serves-unwritable-disk "$(cat "$tmp/ro.log")"
    fi
    kill "${pids[-1]}" 2>/dev/null
else
    echo "SKIP: disk-not-writable (needs root and setpriv)"
fi

# A live listener is left alone; the second daemon says so.
if start_daemon "$tmp/live.log" --socket "$tmp/live.sock" --disk "$tmp/disk.img"; then
    expect_error socket-in-use "is in use by a running process" --socket "$tmp/live.sock" --disk "$tmp/disk.img"
    if [[ -S $tmp/live.sock ]] && kill -0 "${pids[-1]}" 2>/dev/null; then
        pass live-daemon-unharmed
    else
        fail live-daemon-unharmed
    fi
    # A file disk maps no engine module and none of their libraries.
    maps=$(grep -oE '[^ /]*(vblkd-[a-z]+\.so|librbd|librados|libceph|libnbd)[^ ]*' \
        "/proc/${pids[-1]}/maps" | sort -u | xargs)
    [[ -z $maps ]] && pass file-disk-maps-no-module || fail file-disk-maps-no-module "$maps"
    # SIGTERM: exit 0, socket removed.
    kill -TERM "${pids[-1]}"
    rc=0; wait "${pids[-1]}" || rc=$?
    if ((rc == 0)) && [[ ! -e $tmp/live.sock ]] && grep -q "exited cleanly" "$tmp/live.log"; then
        pass sigterm-exits-0-and-removes-socket
    else
        fail sigterm-exits-0-and-removes-socket "rc=$rc"
    fi
else
    fail socket-in-use "daemon did not start: $(cat "$tmp/live.log")"
fi

# A stale socket (nobody listening) is replaced.
python3 - "$tmp/stale.sock" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])  # bound, never listening, then closed
PY
if [[ -S $tmp/stale.sock ]] && start_daemon "$tmp/stale.log" --socket "$tmp/stale.sock" --disk "$tmp/disk.img" &&
   grep -q "replacing stale socket" "$tmp/stale.log"; then
    pass stale-socket-replaced
else
    fail stale-socket-replaced "$(cat "$tmp/stale.log" 2>/dev/null)"
fi
kill "${pids[-1]}" 2>/dev/null

# Odd-sized image: rounded down with a warning, still served.
truncate -s $((16 * 1024 * 1024 + 100)) "$tmp/odd.img"
if start_daemon "$tmp/odd.log" --socket "$tmp/odd.sock" --disk "$tmp/odd.img" &&
   grep -q "not a multiple of 512" "$tmp/odd.log" && grep -q "16777216 bytes" "$tmp/odd.log"; then
    pass odd-size-rounded-down
else
    fail odd-size-rounded-down "$(cat "$tmp/odd.log")"
fi
kill "${pids[-1]}" 2>/dev/null

out=$("$VBLKD" --help) && grep -q -- "--socket PATH" <<<"$out" && pass help || fail help
out=$("$VBLKD" --version) && grep -qE "^vblkd [0-9]" <<<"$out" && pass version || fail version

expect_error size-with-disk "--size is for the null backend" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --size 1G
expect_error size-garbage "--size .1Q. is not a size" --socket "$tmp/a.sock" --backend null --size 1Q
if start_daemon "$tmp/null.log" --socket "$tmp/null.sock" --backend null --size 2G &&
   grep -q "2147483648 bytes.*null" "$tmp/null.log"; then
    pass null-backend-without-disk
else
    fail null-backend-without-disk "$(cat "$tmp/null.log")"
fi
kill -TERM "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null
# Error lines, not the counters logged at exit ("errors": 0).
grep -q " error: " "$tmp/null.log" && fail null-backend-clean-exit "$(grep " error: " "$tmp/null.log")" ||
    pass null-backend-clean-exit
expect_error sqpoll-needs-io-uring "--uring-sqpoll needs --backend io_uring" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --backend threads --uring-sqpoll
expect_error iopoll-needs-io-uring "--iopoll on needs --backend io_uring" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --backend threads --iopoll on
expect_error werror-bad-mode "--werror 'pause' is not one of report, stop, enospc" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --werror pause
expect_error rerror-bad-mode "--rerror 'enospc' is not one of report, stop" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --rerror enospc
expect_error error-retry-not-a-number "--error-retry-s '-1' is not a number from 0 to 86400" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --error-retry-s -1
expect_error iopoll-bad-mode "--iopoll 'sometimes' is not one of auto, on, off" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --iopoll sometimes
expect_error iopoll-needs-o-direct "--iopoll on for disk .*: it needs O_DIRECT" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --cache writeback --iopoll on
# Where the disk's device has no poll queues (every virtual disk without
# poll_queues, this CI's included): on refuses, auto stays on interrupts.
dev=$(stat -c '%Hd:%Ld' "$tmp/disk.img")
io_poll=$(cat "/sys/dev/block/$dev/queue/io_poll" 2>/dev/null || cat "/sys/dev/block/$dev/../queue/io_poll" 2>/dev/null)
if [[ ${io_poll:-0} == 0 ]]; then
    expect_error iopoll-on-without-poll-queues "--iopoll on for disk .*: (the device has no poll queues|it is on no single block device)" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --iopoll on
    if start_daemon "$tmp/iopoll.log" --socket "$tmp/iopoll.sock" --disk "$tmp/disk.img" &&
       grep -q "serving" "$tmp/iopoll.log" && ! grep -q "polled" "$tmp/iopoll.log"; then
        pass iopoll-auto-stays-off-without-poll-queues
    else
        fail iopoll-auto-stays-off-without-poll-queues "$(grep serving "$tmp/iopoll.log")"
    fi
    kill -TERM "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null
else
    echo "SKIP: iopoll-on-without-poll-queues (the device of $tmp has poll queues)"
fi
expect_error iothreads-more-than-queues "--iothreads 3 is more than --queues 2" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --queues 2 --iothreads 3
expect_error queue-map-unknown-iothread "iothread 2 does not exist" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --queues 2 --iothreads 2 --queue-map 0:0,1:2
expect_error queue-map-incomplete "must map each of the 2 queues" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --queues 2 --iothreads 2 --queue-map 0:1
expect_error queue-map-twice "queue 0 is mapped twice" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --queues 2 --iothreads 2 --queue-map 0:0,0:1
expect_error queue-map-garbage "not a list of QUEUE:IOTHREAD pairs" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --queues 2 --queue-map zero
expect_error cpu-affinity-bad "--cpu-affinity '999' is not a list of CPUs" --socket "$tmp/a.sock" --disk "$tmp/disk.img" --cpu-affinity 999
if start_daemon "$tmp/iot.log" --socket "$tmp/iot.sock" --disk "$tmp/disk.img" --queues 4 --iothreads 2 --queue-map 0:1,1:0,2:1,3:0 --cpu-affinity 0 &&
   grep -q "4 queues, 2 iothreads" "$tmp/iot.log"; then
    pass iothreads-and-queue-map-start
else
    fail iothreads-and-queue-map-start "$(cat "$tmp/iot.log")"
fi
kill "${pids[-1]}" 2>/dev/null

# Log lines: an ISO 8601 UTC time of their own; under systemd (stderr is
# the journal, JOURNAL_STREAM set) none, and a syslog priority prefix.
if start_daemon "$tmp/iso.log" --socket "$tmp/iso.sock" --backend null --size 1M &&
   grep -qE '^vblkd\[main\] [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z info: serving' "$tmp/iso.log"; then
    pass log-lines-iso-8601
else
    fail log-lines-iso-8601 "$(head -2 "$tmp/iso.log")"
fi
kill "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null
if JOURNAL_STREAM=8:1234 start_daemon "$tmp/jrn.log" --socket "$tmp/jrn.sock" --backend null --size 1M &&
   grep -qE '^<6>vblkd\[main\] info: serving' "$tmp/jrn.log"; then
    pass log-lines-journald
else
    fail log-lines-journald "$(head -2 "$tmp/jrn.log")"
fi
kill "${pids[-1]}" 2>/dev/null
exit 0
