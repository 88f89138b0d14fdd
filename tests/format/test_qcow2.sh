#!/usr/bin/env bash
# qcow2 images made by qemu-img, served by vblkd to vblk-bench, judged by
# QEMU's own tools: writes verified as they are read back, qemu-img check
# clean afterwards, copy-on-write keeps the backing file's bytes around
# what the guest wrote, and corrupt or unsupported images refused with one
# line.  Usage: test_qcow2.sh BUILD_DIR.  Prints PASS:/FAIL:/SKIP: lines.
set -uo pipefail
BUILD=${1:?usage: test_qcow2.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench
tmp=$(mktemp -d /tmp/vblk-qcow2.XXXXXX)
dpid=""
cleanup() { [[ -n $dpid ]] && kill "$dpid" 2>/dev/null; wait 2>/dev/null; [[ -n ${KEEP:-} ]] || rm -rf "$tmp"; }
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

if ! command -v qemu-img >/dev/null || ! command -v qemu-io >/dev/null; then
    echo "SKIP: qcow2 (no qemu-img/qemu-io: scripts/deps.sh installs qemu-utils)"
    exit 0
fi

start() {	# start LOG ARGS...: vblkd on $tmp/d.sock
    local log=$1; shift
    rm -f "$tmp/d.sock"
    "$VBLKD" --socket "$tmp/d.sock" "$@" >"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [[ -S $tmp/d.sock ]] && return 0; sleep 0.05; done
    return 1
}
stop() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid"; local rc=$?; dpid=""; return $rc; }

# bench NAME IMAGE ARGS...: vblk-bench --verify against vblkd serving
# IMAGE, then qemu-img check of IMAGE.
bench() {
    local name=$1 img=$2 out rc; shift 2
    if ! start "$tmp/$name.log" --disk "$img"; then
        fail "$name" "vblkd did not start: $(tail -2 "$tmp/$name.log")"; return 1
    fi
    out=$("$BENCH" --socket "$tmp/d.sock" --verify --runtime 1 --ramp 0 "$@" 2>&1); rc=$?
    stop || { fail "$name" "vblkd exited with an error: $(tail -2 "$tmp/$name.log")"; return 1; }
    if ((rc != 0)) || ! grep -q " 0 mismatches" <<<"$out"; then
        fail "$name" "vblk-bench: rc=$rc $(tail -2 <<<"$out")"; return 1
    fi
    if qemu-img check -q "$img" >"$tmp/$name.check" 2>&1; then
        pass "$name"
    else
        fail "$name" "qemu-img check: $(head -3 "$tmp/$name.check")"
        return 1
    fi
}

# Fresh images, every cluster allocated by vblkd: v3 and v2, 64 KiB,
# 512-byte and 2 MiB clusters, 1- and 64-bit refcounts (512-byte clusters
# also grow the refcount table), random writes at QD16 and 1 MiB ones.
qemu-img create -q -f qcow2 "$tmp/a.qcow2" 64M
bench qcow2-v3-64k-randwrite-verify-check "$tmp/a.qcow2" --rw randwrite --iodepth 16
bench qcow2-v3-64k-rewrite-verify-check "$tmp/a.qcow2" --rw randrw --iodepth 16 --bs 16k
qemu-img create -q -f qcow2 -o compat=0.10 "$tmp/v2.qcow2" 64M
bench qcow2-v2-randwrite-verify-check "$tmp/v2.qcow2" --rw randwrite --iodepth 8
qemu-img create -q -f qcow2 -o cluster_size=512,refcount_bits=1 "$tmp/c512.qcow2" 32M
bench qcow2-512b-clusters-1bit-refcounts "$tmp/c512.qcow2" --rw randwrite --iodepth 8 --bs 4k
qemu-img create -q -f qcow2 -o cluster_size=2M,refcount_bits=64 "$tmp/c2m.qcow2" 64M
bench qcow2-2m-clusters-64bit-refcounts "$tmp/c2m.qcow2" --rw write --iodepth 4 --bs 1M

# A chain of three: raw base <- qcow2 mid (with writes of its own) <- top;
# vblkd writes 64 KiB across a cluster boundary of top, again and again;
# every other byte must still read what the chain below says.
python3 -c "
import os
with open('$tmp/base.raw', 'wb') as f: f.write(os.urandom(8 << 20))"
qemu-img create -q -f qcow2 -b "$tmp/base.raw" -F raw "$tmp/mid.qcow2" 8M
qemu-io -f qcow2 -c "write -P 0x5a 1M 256k" "$tmp/mid.qcow2" >/dev/null
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 "$tmp/top.qcow2" 8M
qemu-img convert -O raw "$tmp/top.qcow2" "$tmp/before.raw"
if bench qcow2-chain-of-3-cow-verify-check "$tmp/top.qcow2" --rw write --offset 96k --size 64k \
        --iodepth 4; then
    qemu-img convert -O raw "$tmp/top.qcow2" "$tmp/after.raw"
    if python3 - "$tmp/before.raw" "$tmp/after.raw" <<'PY'
import sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read()
lo, hi = 96 << 10, 160 << 10
sys.exit(0 if len(a) == len(b) and a[:lo] == b[:lo] and a[hi:] == b[hi:] and a[lo:hi] != b[lo:hi] else 1)
PY
    then pass qcow2-cow-keeps-the-chain-around-the-write
    else fail qcow2-cow-keeps-the-chain-around-the-write "bytes outside [96K,160K) changed"; fi
    if grep -q "backing mid.qcow2 (qcow2) <- qcow2 .*backing .*base.raw (raw)" "$tmp/qcow2-chain-of-3-cow-verify-check.log"; then
        pass qcow2-chain-logged
    else
        fail qcow2-chain-logged "$(grep format: "$tmp/qcow2-chain-of-3-cow-verify-check.log")"
    fi
fi
# An internal snapshot: vblkd writes the active layer (copy on write of
# the clusters the snapshot shares), the snapshot reads as before, and
# the refcounts come out exact (no leak either).
qemu-img create -q -f qcow2 "$tmp/s.qcow2" 16M
qemu-io -f qcow2 -c "write -P 0x33 0 8M" "$tmp/s.qcow2" >/dev/null
qemu-img snapshot -c s1 "$tmp/s.qcow2"
qemu-img convert -O raw "$tmp/s.qcow2" "$tmp/s-pre.raw"
if bench qcow2-snapshot-cow-verify-check "$tmp/s.qcow2" --rw randwrite --iodepth 8; then
    qemu-img convert -l s1 -O raw "$tmp/s.qcow2" "$tmp/s-snap.raw"
    if cmp -s "$tmp/s-pre.raw" "$tmp/s-snap.raw"; then pass qcow2-snapshot-still-reads-as-before
    else fail qcow2-snapshot-still-reads-as-before "qemu-img convert -l s1 differs"; fi
fi
# The format layer driven directly (fmt-io): random writes, reads,
# discards, write zeroes (with and without unmap), flushes and a grow on
# the image and on a raw copy of it; then QEMU reads the image: qemu-img
# compare against the raw copy, qemu-img check clean.  v3 with a backing
# file (the zero flag keeps the base hidden), v2 over a backing file
# (zeroes written as data), 512-byte clusters, a snapshot kept.
# fmtio NAME IMAGE SEED ARGS...
fmtio() {
    local name=$1 img=$2 seed=$3 out; shift 3
    qemu-img convert -O raw "$img" "$tmp/$name.raw"
    cp "$tmp/$name.raw" "$tmp/$name.orig"
    if ! out=$("$BUILD/fmt-io" "$img" "$tmp/$name.raw" "$seed" 400 --orig "$tmp/$name.orig" "$@" \
            2>&1); then
        fail "$name" "$out"; return 1
    fi
    if ! qemu-img compare -q -f qcow2 -F raw "$img" "$tmp/$name.raw" >"$tmp/$name.cmp" 2>&1; then
        fail "$name" "qemu-img compare: $(head -2 "$tmp/$name.cmp")"; return 1
    fi
    if ! qemu-img check -q "$img" >"$tmp/$name.check" 2>&1; then
        fail "$name" "qemu-img check: $(head -3 "$tmp/$name.check")"; return 1
    fi
    pass "$name"
}
qemu-img create -q -f qcow2 -b base.raw -F raw "$tmp/f3.qcow2" 8M
fmtio qcow2-v3-backing-discard-zeroes-grow-compare "$tmp/f3.qcow2" 1 --grow $((24 << 20))
if [[ $(qemu-img info --output=json "$tmp/f3.qcow2" | python3 -c         'import json,sys; print(json.load(sys.stdin)["virtual-size"])') == $((24 << 20)) ]]; then
    pass qcow2-grown-size-in-header
else
    fail qcow2-grown-size-in-header "$(qemu-img info "$tmp/f3.qcow2" | grep 'virtual size')"
fi
qemu-img create -q -f qcow2 -o compat=0.10 -b base.raw -F raw "$tmp/f2.qcow2" 8M
fmtio qcow2-v2-backing-discard-zeroes-compare "$tmp/f2.qcow2" 2
qemu-img create -q -f qcow2 -o cluster_size=512 "$tmp/f512.qcow2" 4M
fmtio qcow2-512b-discard-zeroes-grow-l1-compare "$tmp/f512.qcow2" 3 --grow $((64 << 20)) \
    --max-len $((64 << 10))
cp "$tmp/s.qcow2" "$tmp/fs.qcow2"
qemu-img convert -l s1 -O raw "$tmp/fs.qcow2" "$tmp/fs-snap.raw"
if fmtio qcow2-snapshot-discard-zeroes-compare "$tmp/fs.qcow2" 4; then
    qemu-img convert -l s1 -O raw "$tmp/fs.qcow2" "$tmp/fs-snap2.raw"
    if cmp -s "$tmp/fs-snap.raw" "$tmp/fs-snap2.raw"; then pass qcow2-snapshot-survives-discard
    else fail qcow2-snapshot-survives-discard "qemu-img convert -l s1 differs"; fi
fi
# Compressed images (qemu-img convert -c: deflate, and zstd), 64 KiB and
# 2 MiB clusters, read whole through the format layer (fmt-io with no
# requests: the whole-disk compare) against qemu-img convert -O raw; then
# rewritten at random (compressed clusters become normal ones) and judged
# by qemu-img compare and check.
python3 -c "
import os
with open('$tmp/cz.raw', 'wb') as f:
    for i in range(64):
        f.write((bytes([i]) * 4096 + os.urandom(64)) * 15 + bytes(4096 - 64 * 15))
        f.write(os.urandom(65536) if i % 8 == 0 else bytes(65536))"
for ct in zlib zstd; do
    for cl in 64k 2M; do
        img=$tmp/cz-$ct-$cl.qcow2 name=qcow2-compressed-$ct-$cl
        if ! qemu-img convert -q -c -O qcow2 -o compression_type=$ct,cluster_size=$cl \
                "$tmp/cz.raw" "$img" 2>/dev/null; then
            echo "SKIP: $name (qemu-img cannot write $ct)"; continue
        fi
        qemu-img convert -O raw "$img" "$tmp/$name.want"
        if out=$("$BUILD/fmt-io" "$img" "$tmp/$name.want" 1 0 2>&1); then
            pass "$name-reads-as-qemu-img-convert"
            fmtio "$name-rewritten-compare" "$img" 9
        else
            fail "$name-reads-as-qemu-img-convert" "$out"
        fi
    done
done

# Discard gives the space back: a fully written image, discarded, is
# mostly holes in the file.
qemu-img create -q -f qcow2 "$tmp/p.qcow2" 32M
qemu-io -f qcow2 -c "write -P 0x11 0 32M" "$tmp/p.qcow2" >/dev/null
before=$(du -k "$tmp/p.qcow2" | cut -f1)
if start "$tmp/punch.log" --disk "$tmp/p.qcow2" &&
   "$BENCH" --socket "$tmp/d.sock" --rw trim --bs 1M --iodepth 4 --runtime 1 --ramp 0 \
       >"$tmp/punch.out" 2>&1 && stop; then
    after=$(du -k "$tmp/p.qcow2" | cut -f1)
    if ((after < before / 4)) && qemu-img check -q "$tmp/p.qcow2" >/dev/null 2>&1; then
        pass qcow2-discard-punches-holes
    else
        fail qcow2-discard-punches-holes "file used ${before} KiB before, ${after} KiB after"
    fi
else
    fail qcow2-discard-punches-holes "$(tail -2 "$tmp/punch.out" "$tmp/punch.log")"
fi

# Live: vblkctl stats shows the format's counters, vblkctl resize grows a
# served overlay (the guest side sees the new size at once: vblk-bench
# verifies writes past the old end), and the header says so afterwards.
CTL=$BUILD/vblkctl
qemu-img create -q -f qcow2 -b base.raw -F raw "$tmp/live.qcow2" 8M
rm -f "$tmp/c.sock"
if start "$tmp/live.log" --disk "$tmp/live.qcow2" --control "$tmp/c.sock" &&
   "$BENCH" --socket "$tmp/d.sock" --rw randwrite --iodepth 8 --runtime 1 --ramp 0 \
       >"$tmp/live1.out" 2>&1; then
    "$CTL" --control "$tmp/c.sock" stats >"$tmp/live.stats" 2>&1
    if python3 - "$tmp/live.stats" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["disk"]
sys.exit(0 if d["image_cache_bytes"] > 0 and d["image_clusters_allocated"] > 0 and
         d["image_cow_bytes"] > 0 and d["image_cache_hits"] > 0 else 1)
PY
    then pass qcow2-stats-show-cache-and-allocation
    else fail qcow2-stats-show-cache-and-allocation "$(grep -o '"image[^,]*' "$tmp/live.stats")"; fi
    if "$CTL" --control "$tmp/c.sock" resize 40M >"$tmp/live.resize" 2>&1 &&
       "$BENCH" --socket "$tmp/d.sock" --verify --rw randwrite --offset 8M --size 32M \
           --iodepth 8 --runtime 1 --ramp 0 >"$tmp/live2.out" 2>&1 &&
       grep -q " 0 mismatches" "$tmp/live2.out" && stop &&
       qemu-img check -q "$tmp/live.qcow2" &&
       [[ $(qemu-img info "$tmp/live.qcow2") == *"virtual size: 40 MiB"* ]]; then
        pass qcow2-live-resize-grows-the-image
    else
        fail qcow2-live-resize-grows-the-image "$(cat "$tmp/live.resize"; tail -2 "$tmp/live2.out")"
    fi
else
    fail qcow2-stats-show-cache-and-allocation "$(tail -2 "$tmp/live.log" "$tmp/live1.out")"
fi
[[ -n $dpid ]] && stop

# A migration's hand-over, as two vblkd on one image see it (source and
# destination, docs/architecture.md "Migration"): A and B both open a
# fresh overlay; A's frontend allocates clusters and goes (A lets the
# image go), then B's allocates more, then A's again.  Each process must
# read the tables again when the image becomes its own, or it hands out
# clusters the other one allocated and overwrites what was written there.
# vblkctl resize on A while B serves is refused (the image is B's); once
# nobody serves it, A takes it for the resize and lets it go again.
qemu-img create -q -f qcow2 -b base.raw -F raw "$tmp/mig.qcow2" 8M
rm -f "$tmp/a.sock" "$tmp/b.sock" "$tmp/c.sock"
"$VBLKD" --socket "$tmp/a.sock" --disk "$tmp/mig.qcow2" --control "$tmp/c.sock" \
    >"$tmp/mig-a.log" 2>&1 &
apid=$!
"$VBLKD" --socket "$tmp/b.sock" --disk "$tmp/mig.qcow2" >"$tmp/mig-b.log" 2>&1 &
bpid=$!
for _ in $(seq 100); do [[ -S $tmp/a.sock && -S $tmp/b.sock ]] && break; sleep 0.05; done
hop() {	# hop SOCK OFFSET SIZE [SECONDS]: verified random writes there, then the frontend goes
    "$BENCH" --socket "$1" --verify --rw randwrite --offset "$2" --size "$3" --iodepth 8 \
        --runtime "${4:-1}" --ramp 0 >"$tmp/mig-bench-$2.out" 2>&1 &&
        grep -q " 0 mismatches" "$tmp/mig-bench-$2.out"
}
hop "$tmp/b.sock" 4M 4M 2 & hpid=$!
sleep 1
busy=$("$CTL" --control "$tmp/c.sock" resize 12M 2>&1); busy_rc=$?
if wait "$hpid" && hop "$tmp/a.sock" 0 2M && qemu-img convert -U -O raw "$tmp/mig.qcow2" "$tmp/mig1.raw" &&
   "$CTL" --control "$tmp/c.sock" resize 12M >"$tmp/mig-resize.out" 2>&1 &&
   hop "$tmp/b.sock" 2M 2M && qemu-img convert -U -O raw "$tmp/mig.qcow2" "$tmp/mig2.raw" &&
   hop "$tmp/a.sock" 8M 4M; then
    kill -TERM "$apid" "$bpid"; wait "$apid" "$bpid"
    qemu-img convert -O raw "$tmp/mig.qcow2" "$tmp/mig3.raw"
    if cmp -s <(head -c 2M "$tmp/mig1.raw") <(head -c 2M "$tmp/mig3.raw") &&
       cmp -s <(head -c 8M "$tmp/mig2.raw") <(head -c 8M "$tmp/mig3.raw") &&
       cmp -s <(tail -c 4M "$tmp/mig1.raw") <(head -c 8M "$tmp/mig2.raw" | tail -c 4M) &&
       qemu-img check -q "$tmp/mig.qcow2" >"$tmp/mig.check" 2>&1 &&
       (( $(grep -c "tables read again" "$tmp/mig-a.log") >= 2 )); then
        pass qcow2-migration-handover-each-side-reads-the-tables-again
    else
        fail qcow2-migration-handover-each-side-reads-the-tables-again \
            "$(head -3 "$tmp/mig.check"); $(grep -c 'tables read again' "$tmp/mig-a.log") reloads in A"
    fi
    if ((busy_rc != 0)) && grep -q "in use" <<<"$busy" &&
       [[ $(qemu-img info "$tmp/mig.qcow2") == *"virtual size: 12 MiB"* ]]; then
        pass qcow2-resize-refused-while-another-serves-done-once-free
    else
        fail qcow2-resize-refused-while-another-serves-done-once-free \
            "rc=$busy_rc $busy; $(cat "$tmp/mig-resize.out")"
    fi
else
    kill -TERM "$apid" "$bpid"; wait "$apid" "$bpid"
    fail qcow2-migration-handover-each-side-reads-the-tables-again \
        "$(tail -qn 2 "$tmp"/mig-bench-*.out "$tmp/mig-resize.out" 2>/dev/null)"
fi

# --copy-on-read: reading the whole overlay copies the base up: the top
# holds every cluster itself afterwards, with the same contents.
qemu-img create -q -f qcow2 -b base.raw -F raw "$tmp/cor.qcow2" 8M
if start "$tmp/cor.log" --disk "$tmp/cor.qcow2" --copy-on-read &&
   "$BENCH" --socket "$tmp/d.sock" --rw read --bs 64k --iodepth 4 --runtime 1 --ramp 0 \
       >"$tmp/cor.out" 2>&1 && stop; then
    # Mapped at depth 0 (the top itself) for all 8 MiB.
    top=$(qemu-img map --output=json "$tmp/cor.qcow2" | python3 -c '
import json, sys
print(sum(e["length"] for e in json.load(sys.stdin) if e["depth"] == 0 and e["data"]))')
    if ((top == 8 << 20)) && qemu-img compare -q -f qcow2 -F raw "$tmp/cor.qcow2" "$tmp/base.raw" &&
       qemu-img check -q "$tmp/cor.qcow2"; then
        pass qcow2-copy-on-read-fills-the-top
    else
        fail qcow2-copy-on-read-fills-the-top "$top bytes of 8 MiB in the top"
    fi
else
    fail qcow2-copy-on-read-fills-the-top "$(tail -2 "$tmp/cor.out" "$tmp/cor.log")"
fi
[[ -n $dpid ]] && stop
out=$(timeout 10 "$VBLKD" --socket "$tmp/r.sock" --disk "$tmp/a.qcow2" --copy-on-read 2>&1); rc=$?
if ((rc != 0)) && [[ $(wc -l <<<"$out") -le 2 ]] && grep -q "not a qcow2 image with a backing" <<<"$out"
then pass qcow2-copy-on-read-without-backing-refused
else fail qcow2-copy-on-read-without-backing-refused "rc=$rc: $out"; fi

# vblkctl stream on a chain of three (raw base <- mid <- top) while
# vblk-bench verifies random writes on the first half: the writes verify,
# the image stands alone afterwards (no backing file), the second half
# reads what the chain said, qemu-img check is clean.
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 "$tmp/st.qcow2" 8M
qemu-img convert -O raw "$tmp/st.qcow2" "$tmp/st-before.raw"
rm -f "$tmp/c.sock"
if start "$tmp/st.log" --disk "$tmp/st.qcow2" --control "$tmp/c.sock"; then
    "$BENCH" --socket "$tmp/d.sock" --verify --rw randwrite --size 4M --iodepth 8 --runtime 3 \
        --ramp 0 >"$tmp/st-bench.out" 2>&1 &
    bpid=$!
    sleep 0.3
    "$CTL" --control "$tmp/c.sock" stream --rate 3M >"$tmp/st-ctl.out" 2>&1
    wait "$bpid"; brc=$?
    for _ in $(seq 100); do
        "$CTL" --control "$tmp/c.sock" stats >"$tmp/st.stats" 2>&1
        python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["disk"]["image_streaming"])' \
            "$tmp/st.stats" 2>/dev/null && break
        sleep 0.2
    done
    stop
    qemu-img convert -O raw "$tmp/st.qcow2" "$tmp/st-after.raw"
    if ((brc == 0)) && grep -q " 0 mismatches" "$tmp/st-bench.out" &&
       grep -q "stream done" "$tmp/st.log" &&
       [[ $(qemu-img info "$tmp/st.qcow2") != *"backing file"* ]] &&
       cmp -s <(tail -c 4M "$tmp/st-before.raw") <(tail -c 4M "$tmp/st-after.raw") &&
       qemu-img check -q "$tmp/st.qcow2"; then
        pass qcow2-stream-under-writes-image-stands-alone
    else
        fail qcow2-stream-under-writes-image-stands-alone \
            "bench rc=$brc $(tail -1 "$tmp/st-bench.out"); $(cat "$tmp/st-ctl.out"); $(grep -E 'stream|error' "$tmp/st.log" | tail -2); $(qemu-img info "$tmp/st.qcow2" | grep backing)"
    fi
else
    fail qcow2-stream-under-writes-image-stands-alone "vblkd did not start"
fi

# The stream as a block job (vblkctl job): paused, it copies nothing; a
# second pause, a complete (a stream ends by itself) and a second stream
# are refused with one line; the metrics show it; resumed with no rate
# limit it concludes ok and the image stands alone; dismissed, the list
# is empty.  Then a stream whose disk is let go (the ring stops) fails
# with one line and leaves a clean image.
jobq() {	# jobq ID FIELD: the field of job ID in vblkctl job list
    "$CTL" --control "$tmp/c.sock" job list 2>/dev/null | python3 -c '
import json, sys
for j in json.load(sys.stdin)["jobs"]:
    if j["id"] == sys.argv[1]: print(j[sys.argv[2]])' "$1" "$2"
}
# stream_under NAME BENCH-ARGS...: a fresh overlay NAME.qcow2 on mid served
# with a control socket, vblk-bench running on it in the background
# ($bpid), a stream at 1 MiB/s started: its id in $id.  1: vblkd did not
# start.
stream_under() {
    local name=$1; shift
    qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 "$tmp/$name.qcow2" 8M
    rm -f "$tmp/c.sock"
    start "$tmp/$name.log" --disk "$tmp/$name.qcow2" --control "$tmp/c.sock" || return 1
    "$BENCH" --socket "$tmp/d.sock" --size 4M --ramp 0 "$@" >"$tmp/$name-bench.out" 2>&1 &
    bpid=$!
    sleep 0.3
    id=$("$CTL" --control "$tmp/c.sock" stream --rate 1M |
         python3 -c 'import json,sys; print(json.load(sys.stdin)["job"])')
}
if stream_under jv --rw randread --iodepth 1 --runtime 8; then
    sleep 0.3
    "$CTL" --control "$tmp/c.sock" job pause "$id" >/dev/null
    st1=$(jobq "$id" state); d1=$(jobq "$id" done)
    sleep 0.5
    d2=$(jobq "$id" done)
    again=$("$CTL" --control "$tmp/c.sock" job pause "$id"); arc=$?
    comp=$("$CTL" --control "$tmp/c.sock" job complete "$id"); crc=$?
    second=$("$CTL" --control "$tmp/c.sock" stream); src=$?
    "$CTL" --control "$tmp/c.sock" metrics >"$tmp/jv.metrics"
    "$CTL" --control "$tmp/c.sock" job resume "$id" >/dev/null
    "$CTL" --control "$tmp/c.sock" job set-rate "$id" 0 >/dev/null
    for _ in $(seq 100); do [[ $(jobq "$id" state) == concluded ]] && break; sleep 0.1; done
    res=$(jobq "$id" result)
    "$CTL" --control "$tmp/c.sock" job dismiss "$id" >/dev/null
    left=$("$CTL" --control "$tmp/c.sock" job list)
    wait "$bpid"
    stop
    if [[ $st1 == paused && $d1 == "$d2" && $d1 -gt 0 && $arc == 1 && $again == *"is paused: it cannot pause"* &&
          $crc == 1 && $comp == *"ends by itself"* && $src == 1 && $second == *"a stream job is paused already"* &&
          $res == ok ]] &&
       grep -q "^vblkd_job_info{id=\"$id\",type=\"stream\",state=\"paused\",result=\"\"} 1" "$tmp/jv.metrics" &&
       grep -q "job $id (stream): paused at" "$tmp/jv.log" &&
       grep -q "job $id (stream): concluded: stream done" "$tmp/jv.log" &&
       [[ $left == *'"jobs": [ ]'* ]] &&
       [[ $(qemu-img info "$tmp/jv.qcow2") != *"backing file"* ]] && qemu-img check -q "$tmp/jv.qcow2"; then
        pass qcow2-stream-job-pause-resume-set-rate-dismiss
    else
        fail qcow2-stream-job-pause-resume-set-rate-dismiss \
            "st=$st1 done $d1/$d2 pause=$arc:$again complete=$crc:$comp second=$src:$second result=$res left=$left; $(grep job "$tmp/jv.log" | tail -3)"
    fi
else
    fail qcow2-stream-job-pause-resume-set-rate-dismiss "vblkd did not start"
fi
if stream_under jg --rw randwrite --iodepth 4 --runtime 1; then
    wait "$bpid"
    for _ in $(seq 50); do [[ $(jobq "$id" state) == concluded ]] && break; sleep 0.1; done
    res=$(jobq "$id" result); why=$(jobq "$id" error)
    stop
    if [[ $res == failed && $why == *"the disk was let go"* ]] &&
       [[ $(grep -c "job $id (stream): failed at" "$tmp/jg.log") == 1 ]] &&
       qemu-img check -q "$tmp/jg.qcow2"; then
        pass qcow2-stream-job-fails-when-the-disk-is-let-go
    else
        fail qcow2-stream-job-fails-when-the-disk-is-let-go "$res: $why; $(grep job "$tmp/jg.log" | tail -2)"
    fi
else
    fail qcow2-stream-job-fails-when-the-disk-is-let-go "vblkd did not start"
fi

# The base is opened read-only and locked against writers while served.
start "$tmp/lock.log" --disk "$tmp/top.qcow2"
if qemu-io -f raw -c "write 0 4k" "$tmp/base.raw" >"$tmp/qio.log" 2>&1; then
    fail qcow2-backing-locked-against-writers "qemu-io wrote the base while it was a backing file"
else
    pass qcow2-backing-locked-against-writers
fi
stop

# Images vblkd must refuse, each with one line naming the problem.
# refuse NAME PATTERN: $tmp/bad.qcow2 as it is now.
refuse() {
    local out rc
    out=$(timeout 10 "$VBLKD" --socket "$tmp/r.sock" --disk "$tmp/bad.qcow2" 2>&1); rc=$?
    if ((rc != 0)) && [[ $(wc -l <<<"$out") -le 2 ]] && grep -q -- "$2" <<<"$out"; then
        pass "qcow2-refuses-$1"
    else
        fail "qcow2-refuses-$1" "rc=$rc: $out"
    fi
}
# poke OFFSET FORMAT VALUE: a big-endian field of a fresh image.
poke() {
    qemu-img create -q -f qcow2 "$tmp/bad.qcow2" 16M
    python3 - "$tmp/bad.qcow2" "$@" <<'PY'
import struct, sys
p, off, fmt, val = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4], 0)
with open(p, 'r+b') as f:
    f.seek(off); f.write(struct.pack('>' + fmt, val))
PY
}
poke 4 I 4;                    refuse version-4 "version 4"
poke 20 I 30;                  refuse huge-clusters "clusters of 2^30"
poke 40 Q 0x40000000;          refuse l1-past-eof "L1 table"
poke 36 I 0;                   refuse l1-too-small "L1 table has 0 entries"
poke 72 Q 0x100;               refuse unknown-feature "features vblkd does not know"
poke 72 Q 1;                   refuse dirty "qemu-img check -r all"
poke 32 I 1;                   refuse encrypted "encrypted"
poke 96 I 7;                   refuse refcount-order "refcount order 7"
poke 16 I 2000; python3 -c "
import struct
with open('$tmp/bad.qcow2', 'r+b') as f: f.seek(8); f.write(struct.pack('>Q', 512))"
                               refuse backing-name-too-long "backing file name"
# An L1 entry pointing into the header.
qemu-img create -q -f qcow2 "$tmp/bad.qcow2" 16M
python3 - "$tmp/bad.qcow2" <<'PY'
import struct, sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(40); l1 = struct.unpack('>Q', f.read(8))[0]
    f.seek(l1); f.write(struct.pack('>Q', (1 << 63) | 0))
    f.seek(l1); f.write(struct.pack('>Q', (1 << 63) | 512))
PY
refuse l1-entry-into-header "L1 entry 0"
# A backing chain that loops: a <- b <- a.
qemu-img create -q -f qcow2 "$tmp/la.qcow2" 16M
qemu-img create -q -f qcow2 -b la.qcow2 -F qcow2 "$tmp/lb.qcow2" 16M
qemu-img rebase -u -f qcow2 -b lb.qcow2 -F qcow2 "$tmp/la.qcow2"
cp "$tmp/lb.qcow2" "$tmp/bad.qcow2.tmp"; ln -sf lb.qcow2 "$tmp/bad.qcow2"; rm -f "$tmp/bad.qcow2.tmp"
refuse backing-loop "loops back on itself"
rm -f "$tmp/bad.qcow2"
exit 0
