#!/usr/bin/env bash
# The mirror job (issue 47, background mode): vblkctl mirror start copies
# the disk to a target while a client writes it, pass after pass, until
# ready; job complete then leaves the target equal to the disk.  Judged by
# byte comparison (cmp, qemu-img compare):
#  - a raw disk to an NBD target (qemu-nbd), writes racing the copy
#    throughout (4 KiB to 256 KiB, 16 in flight): after complete the target
#    equals the disk; what the disk says reads as zeroes went as write
#    zeroes, not bytes;
#  - a qcow2 disk to a local raw file the mirror makes: qemu-img compare;
#  - cancel after ready leaves the target equal to the disk (no writes);
#  - the target killed mid-copy: the job fails with one log line, the disk
#    serves on, a second mirror succeeds;
#  - bad requests refused in one line, nothing made.
# Usage: test_mirror.sh BUILD_DIR.  Prints PASS:/FAIL:/SKIP: lines.
set -uo pipefail
BUILD=${1:?usage: test_mirror.sh BUILD_DIR}
VBLKD=$BUILD/vblkd VBLKCTL=$BUILD/vblkctl
tmp=$(mktemp -d /tmp/vblk-mir.XXXXXX)
dpid="" qpid="" wpid=""
cleanup() {
    for p in $dpid $qpid $wpid; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    [[ -n ${KEEP:-} ]] || rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

for t in qemu-img qemu-io qemu-nbd nbdcopy; do
    command -v $t >/dev/null || {
        echo "SKIP: mirror (no $t: scripts/deps.sh installs qemu-utils, libnbd-bin)"; exit 0; }
done
PY=/usr/bin/python3
$PY -c 'import nbd' 2>/dev/null || { echo "SKIP: mirror (no python3-libnbd)"; exit 0; }

RW=$tmp/rw.sock CTL=$tmp/c.ctl TS=$tmp/t.sock
rw() { echo "nbd+unix:///?socket=$RW"; }
ctl() { "$VBLKCTL" --control "$CTL" "$@"; }
jget() { $PY -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }
start() {	# start IMG LOG
    rm -f "$RW" "$CTL"
    "$VBLKD" --disk "$1" --nbd "unix:$RW" --control "$CTL" >"$2" 2>&1 &
    dpid=$!
    for _ in $(seq 500); do
        [[ -S $RW && -S $CTL ]] && grep -q serving "$2" && return 0
        kill -0 "$dpid" 2>/dev/null || return 1
        sleep 0.01
    done
    return 1
}
stop() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid"; local rc=$?; dpid=""; return $rc; }
target_up() {	# target_up FILE: qemu-nbd on it (raw, writable)
    rm -f "$TS"
    qemu-nbd -f raw -t --socket "$TS" "$1" & qpid=$!
    for _ in $(seq 200); do [[ -S $TS ]] && return 0; sleep 0.02; done
    return 1
}
target_down() { kill "$qpid" 2>/dev/null; wait "$qpid" 2>/dev/null; qpid=""; }
# writer SECONDS SEED: async writes all over the disk, 16 in flight.
writer() {
    $PY - "$(rw)" "$1" "$2" <<'PY' &
import nbd, random, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1]); r = random.Random(int(sys.argv[3]))
size = h.get_size(); end = time.time() + float(sys.argv[2]); n = 0
while time.time() < end:
    ln = r.choice([4096, 65536, 262144]); off = r.randrange(0, (size - ln) // 4096) * 4096
    if r.randrange(8) == 0:
        h.aio_zero(ln, off)
    else:
        h.aio_pwrite(bytes([r.randrange(256)]) * ln, off)
    n += 1
    while h.aio_in_flight() >= 16:
        h.poll(-1)
while h.aio_in_flight():
    h.poll(-1)
print(n)
PY
    wpid=$!
}
# wait_ready SECONDS: the mirror ready with nothing left to copy.
wait_ready() {
    local i
    for ((i = 0; i < $1 * 20; i++)); do
        [[ $(ctl mirror list | jget 'd["mirrors"][0]["ready"] and d["mirrors"][0]["dirty_bytes"] == 0' 2>/dev/null) == True ]] && return 0
        sleep 0.05
    done
    return 1
}
complete() {	# complete JOB: retried while the last writes are copied
    local i
    for i in $(seq 50); do ctl job complete "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
    return 1
}

# ---- raw disk -> NBD target, writes racing the copy ----------------------------
img=$tmp/src.raw
truncate -s 128M "$img"
qemu-io -f raw -c 'write -P 0x11 0 48M' -c 'write -P 0x22 80M 16M' "$img" >/dev/null
truncate -s 128M "$tmp/dst.raw"
if start "$img" "$tmp/a.log" && target_up "$tmp/dst.raw"; then
    writer 2 1
    job=$(ctl mirror start m1 --target "nbd+unix:///?socket=$TS" --granularity 64K | jget 'd["job"]')
    wait "$wpid"; nw=$(wait "$wpid" 2>/dev/null; echo); wpid=""
    if wait_ready 30 && complete "$job"; then
        info=$(ctl job list | jget '[j for j in d["jobs"] if j["id"]=="'"$job"'"][0]')
        target_down
        nbdcopy "$(rw)" "$tmp/now.raw"
        zeroed=$(grep -o "[0-9]* written as zeroes" "$tmp/a.log" | tail -1 | cut -d' ' -f1)
        passes=$(grep -o "ready after [0-9]* passes" "$tmp/a.log" | tail -1)
        if cmp -s "$tmp/now.raw" "$tmp/dst.raw" && ((zeroed > 0)); then
            pass "raw -> NBD target with writes racing the copy: after complete the target equals the disk ($passes; $zeroed bytes went as write zeroes)"
        else
            fail "raw -> NBD target" "$(cmp "$tmp/now.raw" "$tmp/dst.raw" | head -1); zeroed $zeroed; $info"
        fi
    else
        fail "raw -> NBD target: ready and complete" "$(ctl mirror list)"
        target_down
    fi
    # Cancel after ready, no writes: the target is the disk.
    rm -f "$tmp/dst2.raw"; truncate -s 128M "$tmp/dst2.raw"
    target_up "$tmp/dst2.raw"
    job=$(ctl mirror start m2 --target "nbd+unix:///?socket=$TS" | jget 'd["job"]')
    if wait_ready 30 && ctl job cancel "$job" >/dev/null; then
        sleep 0.2; target_down
        nbdcopy "$(rw)" "$tmp/now.raw"
        cmp -s "$tmp/now.raw" "$tmp/dst2.raw" && pass "cancel after ready leaves the target equal to the disk" ||
            fail "cancel after ready" "$(cmp "$tmp/now.raw" "$tmp/dst2.raw" | head -1)"
    else
        fail "cancel after ready" "$(ctl mirror list)"; target_down
    fi
    # The target killed mid-copy: the job fails, the disk serves on.
    rm -f "$tmp/dst3.raw"; truncate -s 128M "$tmp/dst3.raw"
    target_up "$tmp/dst3.raw"
    job=$(ctl mirror start m3 --target "nbd+unix:///?socket=$TS" --rate 8M | jget 'd["job"]')
    sleep 0.5
    kill -9 "$qpid"; wait "$qpid" 2>/dev/null; qpid=""
    st=""
    for _ in $(seq 200); do
        st=$(ctl job list | jget '[j["state"] + ":" + j["result"] for j in d["jobs"] if j["id"]=="'"$job"'"][0]')
        [[ $st == concluded:* ]] && break; sleep 0.1
    done
    io_ok=0
    qemu-io -f raw -c 'write -P 0x77 4M 64k' -c 'read -P 0x77 4M 64k' "$(rw)" >/dev/null && io_ok=1
    target_up "$tmp/dst3.raw"
    job2=$(ctl mirror start m4 --target "nbd+unix:///?socket=$TS" | jget 'd["job"]')
    if [[ $st == concluded:failed ]] && ((io_ok)) && grep -q "job $job (mirror): failed" "$tmp/a.log" &&
        wait_ready 30 && complete "$job2"; then
        pass "the target killed mid-copy: the job fails (one log line), the disk serves on, a second mirror completes"
    else
        fail "target killed mid-copy" "state $st, io $io_ok, $(grep "job $job" "$tmp/a.log" | tail -1)"
    fi
    target_down
    # Refusals.
    ok=1
    truncate -s 64M "$tmp/small.raw"
    for args in "m5" "m5 --target $tmp/small.raw" "m5 --target nbd+unix:///?socket=$tmp/none.sock" \
        "m5 --target $tmp/x.raw --granularity 3000" "a/b --target $tmp/y.raw"; do
        # shellcheck disable=SC2086
        out=$(ctl mirror start $args 2>&1) && { ok=0; echo "  accepted: $args"; continue; }
        (($(wc -l <<<"$out") == 1)) || { ok=0; echo "  $args: $out"; }
    done
    ctl backup start b --nbd "unix:$tmp/v.sock" >/dev/null
    out=$(ctl mirror start m6 --target "$tmp/z.raw" 2>&1) && ok=0
    [[ $out == *"one at a time"* ]] || { ok=0; echo "  mirror during a backup: $out"; }
    ctl backup abort b >/dev/null
    if ((ok)) && [[ ! -e $tmp/x.raw && ! -e $tmp/y.raw && ! -e $tmp/z.raw ]] &&
        [[ $(ctl mirror list | jget 'len(d["mirrors"])') == 0 ]]; then
        pass "mirror start refuses no target, a target of another size, a target not there, a bad granularity or name, a mirror during a backup: one line each, nothing made"
    else
        fail "mirror refusals"
    fi
    stop || fail "vblkd exits cleanly after the mirrors" "$(tail -2 "$tmp/a.log")"
else
    fail "raw: vblkd and qemu-nbd start" "$(tail -3 "$tmp/a.log")"
fi

# ---- qcow2 disk -> a local raw file the mirror makes --------------------------
img=$tmp/src.qcow2
qemu-img create -q -f qcow2 "$img" 128M
qemu-io -f qcow2 -c 'write -P 0x33 8M 24M' -c 'write -z 40M 8M' "$img" >/dev/null
if start "$img" "$tmp/q.log"; then
    writer 2 2
    job=$(ctl mirror start q1 --target "$tmp/made.raw" | jget 'd["job"]')
    wait "$wpid"; wpid=""
    if wait_ready 30 && complete "$job"; then
        stop
        if qemu-img compare -q -f qcow2 -F raw "$img" "$tmp/made.raw"; then
            pass "qcow2 -> a local raw file made at the disk's size: qemu-img compare equal after complete (writes raced the copy)"
        else
            fail "qcow2 -> local raw" "$(qemu-img compare -f qcow2 -F raw "$img" "$tmp/made.raw" 2>&1 | head -2)"
        fi
    else
        fail "qcow2 -> local raw: ready and complete" "$(ctl mirror list)"; stop
    fi
else
    fail "qcow2: vblkd starts" "$(tail -3 "$tmp/q.log")"
fi
