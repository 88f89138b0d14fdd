#!/usr/bin/env bash
# The mirror job (issue 47, background mode): vblkctl mirror start copies
# the disk to a target while a client writes it, pass after pass, until
# ready; job complete then leaves the target equal to the disk.  Judged by
# byte comparison (cmp, qemu-img compare):
#  - a raw disk to an NBD target (qemu-nbd), writes racing the copy
#    throughout (4 KiB to 256 KiB, 16 in flight): after complete the target
#    equals the disk; what the disk says reads as zeroes went as write
#    zeroes, not bytes;
#  - a qcow2 disk to a local qcow2 image the mirror makes (the disk's
#    format by default): qemu-img compare equal at ready, the target no
#    more allocated than the disk (zeroes are not written as data);
#    job complete pivots (the image, as the mirror's own qcow2 instance
#    left it, becomes the disk) while a virtio-blk driver (vblk-bench
#    --verify) and an NBD client write: the driver's verify clean, later
#    writes in the new image only, both images clean by qemu-img check;
#  - a raw disk to a raw file it makes: the pivot refused while a
#    persistent bitmap is kept with the old image; vblkctl upgrade
#    afterwards serves the new file; --format raw on a qcow2 disk makes a
#    raw file;
#  - cancel after ready leaves the target equal to the disk (no writes);
#  - the target killed mid-copy: the job fails with one log line, the disk
#    serves on, a second mirror succeeds;
#  - bad requests refused in one line, nothing made;
#  - write-blocking mode (the job paused, so only the write-through can
#    bring the target along): every write a client had acknowledged is on
#    the target, nothing dirty; background mode the same way leaves it
#    dirty; mirror change switches at run time;
#  - write-blocking with a target of one connection (nbdkit, multi-conn
#    off, writes held 0.3 s) and two iothreads: a write of the thread with
#    no connection, landing on the source after one written through,
#    stays dirty, and complete leaves the target equal;
#  - the hand-over (a migration's switch-over): a virtio-blk driver
#    (vblk-bench) writes through vhost-user while a slow background
#    mirror runs into another vblkd's incoming NBD export; when the driver
#    stops the rings with dirty logging on, the source's ring stop waits
#    for the target to have every write, so the target equals the disk at
#    once (a stop without dirty logging, a shutdown, does not wait); the
#    destination's rings started, its incoming export refuses writes;
#  - yielding: a ready background mirror's job waits for a driver writing
#    flat out (mirror list "yielded"), never in write-blocking mode or
#    with --no-yield, and catches up once the driver stops (cmp equal).
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

for t in qemu-img qemu-io qemu-nbd nbdcopy nbdkit; do
    command -v $t >/dev/null || {
        echo "SKIP: mirror (no $t: scripts/deps.sh format installs qemu-utils, libnbd-bin, nbdkit)"; exit 0; }
done
PY=/usr/bin/python3
$PY -c 'import nbd' 2>/dev/null || { echo "SKIP: mirror (no python3-libnbd)"; exit 0; }

RW=$tmp/rw.sock CTL=$tmp/c.ctl TS=$tmp/t.sock
rw() { echo "nbd+unix:///?socket=$RW"; }
ctl() { "$VBLKCTL" --control "$CTL" "$@"; }
jget() { $PY -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }
start() {	# start IMG LOG [VBLKD ARGS...]
    local img=$1 log=$2
    shift 2
    rm -f "$RW" "$CTL"
    "$VBLKD" --disk "$img" --nbd "unix:$RW" --control "$CTL" "$@" >"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 500); do
        [[ -S $RW && -S $CTL ]] && grep -q serving "$log" && return 0
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
# writer SECONDS SEED [distinct]: async writes all over the disk, 16 in
# flight; distinct: no two overlap (each in a 256 KiB slot of its own).
writer() {
    $PY - "$(rw)" "$1" "$2" "${3:-}" <<'PY' &
import nbd, os, random, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1]); r = random.Random(int(sys.argv[3]))
size = int(os.environ.get("WSIZE", 0)) or h.get_size(); end = time.time() + float(sys.argv[2]); n = 0
slots = list(range(size // 262144)); r.shuffle(slots)
while time.time() < end:
    ln = r.choice([4096, 65536, 262144]); off = r.randrange(0, (size - ln) // 4096) * 4096
    if sys.argv[4]:
        if not slots:
            break
        off = slots.pop() * 262144 + r.randrange(0, (262144 - ln) // 4096 + 1) * 4096
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
    # No --granularity: 4 KiB on a disk this small (mir_default_granularity).
    gran=$(ctl mirror list | jget 'd["mirrors"][0]["granularity"]')
    [[ $gran == 4096 ]] || fail "the mirror's default granularity on a 128 MiB disk" "$gran, not 4096"
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
    qemu-img create -q -u -f qcow2 -b "$img" -F raw "$tmp/backed.qcow2" 128M
    for args in "m5" "m5 --target $tmp/small.raw" "m5 --target nbd+unix:///?socket=$tmp/none.sock" \
        "m5 --target $tmp/x.raw --granularity 3000" "a/b --target $tmp/y.raw" \
        "m5 --target nbd+unix:///?socket=$TS --format qcow2" "m5 --target $tmp/backed.qcow2"; do
        # shellcheck disable=SC2086
        out=$(ctl mirror start $args 2>&1) && { ok=0; echo "  accepted: $args"; continue; }
        (($(wc -l <<<"$out") == 1)) || { ok=0; echo "  $args: $out"; }
    done
    # A local target another process writes (qemu-nbd holds QEMU's lock).
    truncate -s 128M "$tmp/held.raw"
    target_up "$tmp/held.raw"
    out=$(ctl mirror start m7 --target "$tmp/held.raw" 2>&1) && ok=0
    [[ $out == *"is in use: another process writes it"* ]] || { ok=0; echo "  a held target: $out"; }
    target_down
    ctl backup start b --nbd "unix:$tmp/v.sock" >/dev/null
    out=$(ctl mirror start m6 --target "$tmp/z.raw" 2>&1) && ok=0
    [[ $out == *"one at a time"* ]] || { ok=0; echo "  mirror during a backup: $out"; }
    ctl backup abort b >/dev/null
    if ((ok)) && [[ ! -e $tmp/x.raw && ! -e $tmp/y.raw && ! -e $tmp/z.raw ]] &&
        [[ $(ctl mirror list | jget 'len(d["mirrors"])') == 0 ]]; then
        pass "mirror start refuses no target, a target of another size, a target not there, a bad granularity or name, a format for an NBD target, a qcow2 target with a backing file, a local target another process writes, a mirror during a backup: one line each, nothing made"
    else
        fail "mirror refusals"
    fi
    # Concluded mirror jobs dismissed: off the mirror set's list before
    # they are freed (mirror list and a new start walk it; ASan saw the
    # freed ones before).
    for j in $(ctl job list | jget '" ".join(j["id"] for j in d["jobs"] if j["type"] == "mirror" and j["state"] == "concluded")'); do
        ctl job dismiss "$j" >/dev/null || fail "job dismiss $j"
    done
    if [[ $(ctl mirror list | jget 'len(d["mirrors"])') == 0 ]] &&
        [[ $(ctl job list | jget 'len([j for j in d["jobs"] if j["type"] == "mirror"])') == 0 ]] &&
        job=$(ctl mirror start m8 --target "$tmp/dst5.raw" | jget 'd["job"]') &&
        wait_ready 30 && ctl job cancel "$job" >/dev/null && sleep 0.2 &&
        ctl job dismiss "$job" >/dev/null && [[ $(ctl mirror list | jget 'len(d["mirrors"])') == 0 ]]; then
        pass "concluded mirror jobs dismissed: mirror list empty, a new mirror runs, is cancelled and dismissed"
    else
        fail "mirror jobs dismissed" "$(ctl job list) $(ctl mirror list)"
    fi
    stop || fail "vblkd exits cleanly after the mirrors" "$(tail -2 "$tmp/a.log")"
else
    fail "raw: vblkd and qemu-nbd start" "$(tail -3 "$tmp/a.log")"
fi

# ---- qcow2 disk -> a local qcow2 image the mirror makes, and the pivot -------
# job complete of a local mirror pivots: the target becomes the disk while
# a virtio-blk driver (vblk-bench --verify, through vhost-user) and an NBD
# client write on; the driver reads every block it wrote back from the
# new disk at the end.
img=$tmp/src.qcow2 PV=$tmp/p.vhost
qemu-img create -q -f qcow2 "$img" 128M
qemu-io -f qcow2 -c 'write -P 0x33 8M 24M' -c 'write -z 40M 8M' "$img" >/dev/null
if start "$img" "$tmp/q.log" --socket "$PV"; then
    WSIZE=100663296 writer 2 2
    job=$(ctl mirror start q1 --target "$tmp/made.qcow2" | jget 'd["job"]')
    wait "$wpid"; wpid=""
    if wait_ready 30; then
        # Equal before the pivot (the copy); qemu-img reads both shared.
        # The target holds no more data than the disk: what reads as
        # zeroes went as write zeroes, which leave its clusters free.
        eq=0
        data() { qemu-img map -U -f qcow2 --output=json "$1" |
            $PY -c 'import json,sys; print(sum(e["length"] for e in json.load(sys.stdin) if e["data"]))'; }
        qemu-img compare -U -q -f qcow2 -F qcow2 "$img" "$tmp/made.qcow2" && eq=1
        sd=$(data "$img") td=$(data "$tmp/made.qcow2")
        ((td <= sd)) || eq=0
        "$BUILD/vblk-bench" --socket "$PV" --rw randrw --bs 4k --iodepth 16 --runtime 3 --ramp 0 \
            --offset 64M --size 64M --verify >"$tmp/pv.log" 2>&1 &
        bpid=$!
        WSIZE=67108864 writer 3 7
        sleep 1
        complete "$job"; crc=$?
        wait "$wpid"; wpid=""
        wait "$bpid"; brc=$?
        # After the pivot: an NBD write lands in the new disk only.
        qemu-io -f raw -c 'write -P 0x5a 100M 1M' "$(rw)" >/dev/null
        res=$(ctl job list | jget '[j["state"] + ":" + j["result"] for j in d["jobs"] if j["id"]=="'"$job"'"][0]')
        # --format raw from a qcow2 disk (the new one): a raw copy.  Its
        # 128 KiB granules hold 64 KiB clusters of data and of zeroes:
        # runs follow the block status only on granule edges (a granule
        # cut in two was never cleared, and the job never got ready).
        job=$(ctl mirror start q2 --target "$tmp/as.raw" --format raw --granularity 128K | jget 'd["job"]')
        asraw=0
        wait_ready 30 && ctl job cancel "$job" >/dev/null && sleep 0.2 &&
            [[ $(qemu-img info -U --output=json "$tmp/as.raw" | jget 'd["format"]') == raw ]] &&
            qemu-img compare -U -q -f qcow2 -F raw "$tmp/made.qcow2" "$tmp/as.raw" && asraw=1
        ((asraw)) && pass "--format raw on a qcow2 disk, 128 KiB granules over 64 KiB clusters: the mirror makes a raw file, gets ready, equal to the disk at cancel" ||
            fail "mirror --format raw of a qcow2 disk" "$(ctl mirror list)"
        # A second pivot: the image the first one made (a mirror's own
        # allocation) is let go in its turn; vblkd exits clean (under
        # ASan: nothing leaked).
        job=$(ctl mirror start q3 --target "$tmp/made2.qcow2" | jget 'd["job"]')
        piv2=0
        wait_ready 30 && complete "$job" &&
            grep -q "mirror q3: the disk is $tmp/made2.qcow2 now" "$tmp/q.log" && piv2=1
        stop; src=$?
        ((piv2 && src == 0)) && qemu-img compare -q -f qcow2 -F qcow2 "$tmp/made.qcow2" "$tmp/made2.qcow2" &&
            pass "a second pivot (to an image a mirror made, from one a mirror made): equal, vblkd exits clean" ||
            fail "a second pivot" "pivot $piv2, exit $src, $(grep -E "q3|LeakSanitizer|ERROR" "$tmp/q.log" | tail -3)"
        newok=0 oldok=0
        qemu-io -f qcow2 -c 'read -P 0x5a 100M 1M' "$tmp/made.qcow2" | grep -q "read 1048576" && newok=1
        out=$(qemu-io -f qcow2 -c 'read -P 0x5a 100M 1M' "$img" 2>&1)
        [[ $out == *"Pattern verification failed"* ]] && oldok=1
        if ((eq && crc == 0 && brc == 0 && src == 0 && newok && oldok)) &&
            grep -q "mirror q1: the disk is $tmp/made.qcow2 now .* --format qcow2 from now on" "$tmp/q.log" &&
            [[ $res == concluded:ok ]] && qemu-img check -q "$img" && qemu-img check -q "$tmp/made.qcow2" &&
            grep -q " 0 mismatches" "$tmp/pv.log"; then
            pass "qcow2 -> a local qcow2 image the mirror makes: equal at ready, $td data bytes against the disk's $sd; job complete pivots while a virtio-blk driver and an NBD client write: the driver's verify is clean across it ($(grep -o '[0-9]* blocks checked' "$tmp/pv.log")), later writes land in the new image only, both images clean (qemu-img check)"
        else
            fail "qcow2 -> local qcow2, pivot" "eq $eq (data $td of $sd) complete $crc bench $brc stop $src new $newok old $oldok job $res; $(qemu-img check "$tmp/made.qcow2" 2>&1 | tail -2); $(grep -E "mirror q1|verify" "$tmp/q.log" "$tmp/pv.log" | tail -3)"
        fi
    else
        fail "qcow2 -> local qcow2: ready" "$(ctl mirror list)"; stop
    fi
else
    fail "qcow2: vblkd starts" "$(tail -3 "$tmp/q.log")"
fi

# The pivot refused (persistent bitmap), then upgrade in place after one:
# the new process serves the new file.
img=$tmp/up.raw
truncate -s 64M "$img"; rm -f "$tmp/up2.raw"
qemu-io -f raw -c 'write -P 0x61 0 8M' "$img" >/dev/null
# 64 KiB of data every 256 KiB from 8 MiB on: runs of data and zeroes.
args=()
for i in $(seq 0 31); do args+=(-c "write -P 0x62 $((8192 + i * 256))k 64k"); done
qemu-io -f raw "${args[@]}" "$img" >/dev/null
rm -f "$CTL" "$PV"
"$VBLKD" --disk "$img" --socket "$PV" --control "$CTL" >"$tmp/up.log" 2>&1 &
dpid=$!
for _ in $(seq 500); do [[ -S $CTL ]] && grep -q serving "$tmp/up.log" && break; sleep 0.01; done
ctl bitmap add keep --persistent >/dev/null
job=$(ctl mirror start u1 --target "$tmp/up2.raw" | jget 'd["job"]')
ok=0
if wait_ready 30; then
    # The runs read as data with zeroes in them went as pieces: the new
    # file holds the disk's 10 MiB of data, not the 16 MiB its runs span.
    sk=$(du -k "$img" | cut -f1) tk=$(du -k "$tmp/up2.raw" | cut -f1)
    ((tk <= sk + 256)) || echo "  the made target holds $tk KiB, the disk $sk KiB"
    out=$(ctl job complete "$job" 2>&1) && echo "  complete with a persistent bitmap accepted"
    ctl bitmap remove keep >/dev/null
    if [[ $(wc -l <<<"$out") == 1 && $out == *"persistent bitmap 'keep'"* ]] && complete "$job" &&
        ctl upgrade >/dev/null 2>&1; then
        wait "$dpid" 2>/dev/null; dpid=$(pgrep -n -f "vblkd --socket $PV" || true)
        "$BUILD/vblk-bench" --socket "$PV" --rw randwrite --bs 4k --iodepth 4 --runtime 1 --ramp 0 \
            --size 8M --verify >"$tmp/up-b.log" 2>&1 && ok=1
        [[ -n $dpid ]] && stop
        grep -q "serving $tmp/up2.raw" "$tmp/up.log" || ok=0
        # What the driver wrote is in the new file, not the old one.
        cmp -s -n 8M "$img" <(head -c 8M /dev/zero | tr '\0' 'a') || ok=0
        ((tk <= sk + 256)) || ok=0
    fi
fi
[[ -n $dpid ]] && { kill "$dpid"; wait "$dpid" 2>/dev/null; dpid=""; }
if ((ok)); then
    pass "raw -> a raw file the mirror makes: it holds what the disk holds ($tk KiB of $sk), the runs mixing data and zeroes written in pieces; the pivot refused while a persistent bitmap is kept with the old image (one line); after it, vblkctl upgrade starts the new process on the new file, which serves on"
else
    fail "pivot refusal and upgrade after a pivot" "$(grep -E "u1|upgrade|serving|error" "$tmp/up.log" | tail -4); $(tail -2 "$tmp/up-b.log" 2>/dev/null)"
fi

# ---- write-blocking, and the hand-over at a switch-over ------------------------
# The destination: another vblkd on an empty disk, its NBD export incoming.
DS=$tmp/dst.nbd DCTL=$tmp/d.ctl DV=$tmp/d.vhost SV=$tmp/s.vhost
dst_start() {	# dst_start IMG LOG
    rm -f "$DS" "$DCTL" "$DV"
    "$VBLKD" --disk "$1" --socket "$DV" --nbd "unix:$DS,incoming" --control "$DCTL" >"$2" 2>&1 &
    ddpid=$!
    for _ in $(seq 500); do
        [[ -S $DS && -S $DCTL ]] && grep -q serving "$2" && return 0
        sleep 0.01
    done
    return 1
}
ddpid=""
trap 'kill -9 $ddpid 2>/dev/null; cleanup' EXIT
both_stop() {	# both_stop WHAT LOG DEST_LOG: the source, then the destination, exit clean
    stop || fail "vblkd exits cleanly after $1" "$(tail -2 "$2")"
    kill -TERM "$ddpid"; wait "$ddpid" || fail "the destination exits cleanly" "$(tail -2 "$3")"
    ddpid=""
}
dirty() { ctl mirror list | jget 'd["mirrors"][0]["'"$1"'"]'; }
img=$tmp/wb.raw
rm -f "$img" "$tmp/wbd.raw"
truncate -s 128M "$img" "$tmp/wbd.raw"
qemu-io -f raw -c 'write -P 0x44 0 32M' "$img" >/dev/null
if start "$img" "$tmp/wb.log" --socket "$SV" && dst_start "$tmp/wbd.raw" "$tmp/wbd.log"; then
    # Overlapping writes race the first pass (the unit and each other).
    writer 2 5
    job=$(ctl mirror start w1 --target "nbd+unix:///?socket=$DS" --mode write-blocking | jget 'd["job"]')
    wait "$wpid"; wpid=""
    if wait_ready 30 && ctl job pause "$job" >/dev/null; then
        wt0=$(dirty written_through) lj0=$(dirty left_to_job)
        echo "  (racing the first pass: $wt0 written through, $lj0 left to the job)"
        writer 2 3 distinct
        wait "$wpid"; wpid=""
        wt=$(($(dirty written_through) - wt0)) lj=$(($(dirty left_to_job) - lj0)) left=$(dirty dirty_bytes)
        mode=$(dirty mode)
        # The metrics say the same as mirror list.
        met=$(ctl metrics | grep -E '^vblkd_mirror_(written_through_total|ready|dirty_bytes)\{name="w1"' | awk '{print $2}' | tr '\n' ' ')
        want="$(dirty dirty_bytes) $(dirty written_through) 1 "
        [[ $met == "$want" ]] || fail "mirror metrics" "metrics '$met', mirror list '$want'"
        if [[ $mode == write-blocking ]] && ((wt > 0 && lj == 0 && left == 0)) && cmp -s "$img" "$tmp/wbd.raw"; then
            pass "write-blocking: with the job paused, every write a client had acknowledged is on the target ($wt written through, nothing dirty, cmp equal; the metrics agree)"
        else
            fail "write-blocking write-through" "mode $mode, through $wt, left to job $lj, dirty $left, $(cmp "$img" "$tmp/wbd.raw" | head -1)"
        fi
        ctl mirror change w1 --mode background >/dev/null
        writer 1 4 distinct
        wait "$wpid"; wpid=""
        left=$(dirty dirty_bytes) mode=$(dirty mode)
        ctl mirror change w1 --mode write-blocking >/dev/null
        ctl job resume "$job" >/dev/null
        if [[ $mode == background ]] && ((left > 0)) && wait_ready 30 && complete "$job" &&
            cmp -s "$img" "$tmp/wbd.raw" && grep -q "mirror w1: now background" "$tmp/wb.log"; then
            pass "mirror change: background mode leaves the same kind of writes dirty ($left bytes) until the job copies them; back in write-blocking, complete leaves the target equal"
        else
            fail "mirror change" "mode $mode, dirty $left, $(cmp "$img" "$tmp/wbd.raw" | head -1)"
        fi
    else
        fail "write-blocking: ready and pause" "$(ctl mirror list)"
    fi
    out=$(ctl mirror change w9 --mode background 2>&1) && fail "mirror change of no mirror accepted"
    out2=$("$VBLKCTL" --control "$CTL" mirror change w1 --mode fast 2>&1) && fail "mode fast accepted"
    [[ $(wc -l <<<"$out") == 1 && $(wc -l <<<"$out2") == 1 ]] || fail "mirror change refusals: one line" "$out / $out2"

    # The hand-over: a background mirror, a driver writing through vhost-user.
    # A slow job (4 MiB/s): without the ring stop's wait the target would
    # lag the driver's writes by seconds.
    job=$(ctl mirror start h1 --target "nbd+unix:///?socket=$DS" --rate 4M | jget 'd["job"]')
    if wait_ready 30; then
        # A plain stop (a guest shutdown or reset: no dirty logging) does
        # not wait for the mirror: the target is behind at once.
        "$BUILD/vblk-bench" --socket "$SV" --rw randwrite --bs 64k --iodepth 16 --runtime 1 --ramp 0 \
            >"$tmp/bench0.log" 2>&1
        behind=$(dirty dirty_bytes)
        if ((behind > 0)) && ! grep -q "mirror h1: the guest's rings stopped" "$tmp/wb.log"; then
            pass "a ring stop with no dirty logging (a shutdown, a reset) does not wait for the mirror ($behind bytes still to copy after it)"
        else
            fail "a plain ring stop waited for the mirror" "dirty $behind, $(grep "mirror h1" "$tmp/wb.log" | tail -1)"
        fi
        ctl job set-rate "$job" 0 >/dev/null
        wait_ready 30
        ctl job set-rate "$job" 4M >/dev/null
        # The switch-over: the driver stops its rings with dirty logging
        # on, as a migration's source QEMU does.
        "$BUILD/vblk-bench" --socket "$SV" --rw randwrite --bs 64k --iodepth 16 --runtime 2 --ramp 0 \
            --dirty-log >"$tmp/bench.log" 2>&1
        brc=$?
        # At once: the ring stop waited for the target.
        if ((brc == 0)) && cmp -s "$img" "$tmp/wbd.raw" &&
            grep -q "mirror h1: the guest's rings stopped: .* has every write they completed, flushed" "$tmp/wb.log"; then
            pass "hand-over: when the driver stops the rings, the target already has every write (cmp equal at once; $(grep -o 'flushed ([0-9.]* ms)' "$tmp/wb.log" | tail -1))"
        else
            fail "hand-over at the ring stop" "bench rc $brc, $(cmp "$img" "$tmp/wbd.raw" | head -1), $(grep "mirror h1" "$tmp/wb.log" | tail -2)"
        fi
        ctl job cancel "$job" >/dev/null
        # The destination's guest starts: its incoming export takes no
        # more writes (a client connected before: EPERM; one connecting
        # after: a read-only export); reads go on.
        $PY - "nbd+unix:///?socket=$DS" "$BUILD/vblk-bench" "$DV" >"$tmp/inc.out" 2>&1 <<'PY'
import nbd, socket, struct, subprocess, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x55" * 65536, 1 << 20)          # before: taken
# A raw client's 1 MiB write at 32 MiB: its header and half its payload
# before the rings start, the rest after (EPERM, nothing written).
def recvn(s, n):
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b)); assert d; b += d
    return b
raw = socket.socket(socket.AF_UNIX); raw.connect(sys.argv[1].split("socket=")[1])
recvn(raw, 18); raw.sendall(struct.pack(">I", 1))
raw.sendall(struct.pack(">QIIIH", 0x49484156454F5054, 7, 6, 0, 0))
while True:
    _, _, typ, ln = struct.unpack(">QIII", recvn(raw, 20)); recvn(raw, ln)
    if typ == 1:
        break
raw.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, 7, 32 << 20, 1 << 20) + b"\x77" * (512 << 10))
subprocess.run([sys.argv[2], "--socket", sys.argv[3], "--rw", "randread", "--runtime", "1",
                "--ramp", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
try:
    h.pwrite(b"\x66" * 65536, 1 << 20)
    print("write taken after the rings started")
except nbd.Error as e:
    print("refused", "Operation not permitted" in e.string)
raw.sendall(b"\x77" * (512 << 10))
_, err, _ = struct.unpack(">IIQ", recvn(raw, 16))
print("split write", err, h.pread(4096, 32 << 20) != b"\x77" * 4096)
assert h.pread(65536, 1 << 20) == b"\x55" * 65536
h2 = nbd.NBD(); h2.connect_uri(sys.argv[1])
print("new read-only", h2.is_read_only() == 1)
PY
        if [[ $(cat "$tmp/inc.out") == $'refused True\nsplit write 1 True\nnew read-only True' ]] &&
            grep -q "(incoming): the guest's rings started here: writes refused" "$tmp/wbd.log"; then
            pass "the destination's rings started: its incoming export refuses writes (EPERM to a client already there, also to a write whose payload was still coming, read-only to a new one, one log line), reads go on"
        else
            fail "incoming export after the rings started" "$(cat "$tmp/inc.out"); $(grep incoming "$tmp/wbd.log" | tail -1)"
        fi
    else
        fail "hand-over: ready" "$(ctl mirror list)"
    fi
    both_stop "the write-blocking mirrors" "$tmp/wb.log" "$tmp/wbd.log"
else
    fail "write-blocking: the two vblkds start" "$(tail -3 "$tmp/wb.log" "$tmp/wbd.log")"
fi

# ---- write-blocking, a thread with no connection to the target ----------------
# A target without multi-conn takes one connection: in write-blocking
# mode the second iothread's writes go to the source alone and are left
# to the job.  nbdkit (multi-conn off, each write held 0.3 s) is such a
# target.  Two NBD clients, one per iothread (connections are dealt round
# the iothreads): the first writes 0xaa over 8 ranges (written through,
# slow), the second 0xbb over the same ranges 50 ms later (source only,
# done at once): on the source 0xbb is last.  The first's completion must
# not clear the second's marks (regression: it did, the target kept 0xaa,
# and complete said equal while cmp did not).
img=$tmp/t2.raw
rm -f "$img" "$tmp/t2d.raw"
truncate -s 64M "$img" "$tmp/t2d.raw"
T2=$tmp/t2.sock
if start "$img" "$tmp/t2.log" --queues 2 --iothreads 2 &&
    { nbdkit -f -U "$T2" --filter=multi-conn --filter=delay file "$tmp/t2d.raw" \
        multi-conn-mode=disable wdelay=300ms >"$tmp/t2k.log" 2>&1 & qpid=$!; } &&
    for _ in $(seq 200); do [[ -S $T2 ]] && break; sleep 0.02; done && [[ -S $T2 ]]; then
    job=$(ctl mirror start t2 --target "nbd+unix:///?socket=$T2" --mode write-blocking | jget 'd["job"]')
    # The job paused: its units would copy the ranges anyway.
    if [[ -n $job ]] && wait_ready 30 && ctl job pause "$job" >/dev/null; then
        $PY - "$(rw)" <<'PY'
import nbd, sys, time
h1 = nbd.NBD(); h1.connect_uri(sys.argv[1])     # iothread 0: to the target too
h2 = nbd.NBD(); h2.connect_uri(sys.argv[1])     # iothread 1: the source alone
offs = [i * 4 * 1048576 + 8192 for i in range(8)]
for o in offs:
    h1.aio_pwrite(b"\xaa" * 65536, o)
time.sleep(0.05)
for o in offs:
    h2.pwrite(b"\xbb" * 65536, o)
while h1.aio_in_flight():
    h1.poll(-1)
PY
        wt=$(ctl mirror list | jget 'd["mirrors"][0]["written_through"]')
        lj=$(ctl mirror list | jget 'd["mirrors"][0]["left_to_job"]')
        left=$(ctl mirror list | jget 'd["mirrors"][0]["dirty_bytes"]')
        ctl job resume "$job" >/dev/null
        if wait_ready 30 && complete "$job" && stop; then
            # The first client's 8 writes took the write-blocking path.
            if ((wt + lj >= 8)) && cmp -s "$img" "$tmp/t2d.raw"; then
                pass "write-blocking with one target connection for two iothreads: a write on the other thread that lands on the source after one written through stays dirty ($left bytes, $lj left to the job), complete leaves the target equal"
            else
                fail "write-blocking, two iothreads, one target connection" "$(cmp "$img" "$tmp/t2d.raw" | head -1) ($wt written through, $lj left to the job, $left bytes dirty)"
            fi
        else
            fail "write-blocking, two iothreads: complete" "$(ctl mirror list 2>&1 | tr -d '\n ')"
        fi
    else
        fail "write-blocking, two iothreads: ready" "job '$job', $(tail -2 "$tmp/t2.log")"
    fi
    [[ -n $dpid ]] && stop
    target_down
else
    fail "write-blocking, two iothreads: vblkd and nbdkit start" "$(tail -n 3 "$tmp/t2.log" "$tmp/t2k.log")"
    [[ -n $dpid ]] && stop
    target_down
fi

# ---- yielding: a ready background mirror leaves a busy guest the thread --------
# A virtio-blk driver (vblk-bench --verify, 16 in flight) writes flat out
# while a ready background mirror runs: the job waits for it (mirror list
# "yielded" counts its waits), and catches up once the driver
# stops; complete leaves the target equal.  Write-blocking mode never
# waits (it is how a mirror converges); --no-yield turns it off.
img=$tmp/y.raw
rm -f "$img" "$tmp/yd.raw"
truncate -s 128M "$img" "$tmp/yd.raw"
qemu-io -f raw -c 'write -P 0x5a 0 64M' "$img" >/dev/null
yget() { ctl mirror list | jget '[m for m in d["mirrors"] if m["name"] == "'"$1"'"][0]["'"$2"'"]'; }
if start "$img" "$tmp/y.log" --socket "$SV" && dst_start "$tmp/yd.raw" "$tmp/yd.log"; then
    job=$(ctl mirror start y1 --target "nbd+unix:///?socket=$DS" | jget 'd["job"]')
    if wait_ready 30; then
        "$BUILD/vblk-bench" --socket "$SV" --rw randwrite --bs 4k --iodepth 16 --runtime 2 --ramp 0 \
            --size 64M --verify >"$tmp/y-b1.log" 2>&1 &
        bpid=$!
        sleep 1
        y_on=$(yget y1 yielded) yopt=$(yget y1 yield)
        # Write-blocking from here: no unit waits any more.
        ctl mirror change y1 --mode write-blocking >/dev/null
        y_wb0=$(yget y1 yielded)
        sleep 0.5
        y_wb1=$(yget y1 yielded)
        wait "$bpid"; brc=$?
        ctl mirror change y1 --mode background >/dev/null
        if ((brc == 0)) && [[ $yopt == True ]] && ((y_on > 0 && y_wb1 == y_wb0)) &&
            wait_ready 30 && complete "$job" && cmp -s "$img" "$tmp/yd.raw"; then
            pass "a ready background mirror yields to a busy driver ($y_on waits in its first second; none once write-blocking), catches up when it stops, and complete leaves the target equal (cmp); the driver's verify clean"
        else
            fail "yielding" "bench rc $brc, yield $yopt, yielded $y_on then $y_wb0 -> $y_wb1, $(cmp "$img" "$tmp/yd.raw" | head -1), $(tail -1 "$tmp/y-b1.log")"
        fi
    else
        fail "yielding: ready" "$(ctl mirror list)"
    fi
    job=$(ctl mirror start y2 --target "nbd+unix:///?socket=$DS" --no-yield | jget 'd["job"]')
    if wait_ready 30; then
        "$BUILD/vblk-bench" --socket "$SV" --rw randwrite --bs 4k --iodepth 16 --runtime 1 --ramp 0 \
            --size 64M --verify >"$tmp/y-b2.log" 2>&1
        brc=$?
        yn=$(yget y2 yielded) yopt=$(yget y2 yield)
        if ((brc == 0)) && [[ $yopt == False ]] && ((yn == 0)) && wait_ready 30 &&
            complete "$job" && cmp -s "$img" "$tmp/yd.raw"; then
            pass "mirror start --no-yield: the job never waits for the driver (yielded 0), complete leaves the target equal"
        else
            fail "--no-yield" "bench rc $brc, yield $yopt, yielded $yn, $(cmp "$img" "$tmp/yd.raw" | head -1)"
        fi
    else
        fail "--no-yield: ready" "$(ctl mirror list)"
    fi
    out=$(ctl mirror change y2 --mode background --no-yield 2>&1) &&
        fail "--no-yield with mirror change accepted"
    [[ $(wc -l <<<"$out") == 1 && $out == *"--no-yield go with mirror start"* ]] ||
        fail "--no-yield with mirror change: one line" "$out"
    both_stop "the yielding mirrors" "$tmp/y.log" "$tmp/yd.log"
else
    fail "yielding: the two vblkds start" "$(tail -3 "$tmp/y.log" "$tmp/yd.log")"
fi
