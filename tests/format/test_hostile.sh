#!/usr/bin/env bash
# Hostile and damaged images (issue 44), one behaviour each, judged by
# QEMU's own tools: a corrupt qcow2 image is marked corrupt as QEMU marks
# it, the failed request completes with an error, and the image comes
# back no more corrupt than it was (qemu-img check counts); metadata is
# never written over metadata; a corrupt image cannot make vblkd allocate
# without bound; and a vblkd restarted at once after kill -9 wins its
# image's lock from its dying predecessor.
# Usage: test_hostile.sh BUILD_DIR.  Prints PASS:/FAIL:/SKIP: lines.
set -uo pipefail
BUILD=${1:?usage: test_hostile.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench
tmp=$(mktemp -d /tmp/vblk-hostile.XXXXXX)
dpid="" bpid=""
cleanup() {
    for p in $dpid $bpid; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    [[ -n ${KEEP:-} ]] || rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

if ! command -v qemu-img >/dev/null || ! command -v qemu-io >/dev/null; then
    echo "SKIP: hostile (no qemu-img/qemu-io: scripts/deps.sh installs qemu-utils)"
    exit 0
fi

# start LOG SOCK ARGS...: vblkd, its socket there
start() {
    local log=$1 sock=$2; shift 2
    rm -f "$sock"
    "$VBLKD" --socket "$sock" "$@" >"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 3000); do [[ -S $sock ]] && return 0; sleep 0.001; done
    return 1
}
stop() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid"; local rc=$?; dpid=""; return $rc; }

# qemu-img check's count of corruptions (not leaks) in IMAGE.
corruptions() {
    qemu-img check --output=json "$1" 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin).get("corruptions", 0))'
}

# serve NAME IMAGE BENCH-ARGS...: vblkd serves IMAGE to vblk-bench; the
# bench's last lines in $tmp/NAME.bench, the daemon's log in $tmp/NAME.log;
# fails NAME-requests-complete if one was stranded (no completion in 5 s)
# and NAME-sigterm-exits unless vblkd then exits 0 on SIGTERM.
serve() {
    local name=$1 img=$2; shift 2
    start "$tmp/$name.log" "$tmp/$name.sock" --disk "$img" ||
        { fail "$name" "vblkd did not start: $(tail -1 "$tmp/$name.log")"; return 1; }
    "$BENCH" --socket "$tmp/$name.sock" --ramp 0 "$@" >"$tmp/$name.bench" 2>&1
    if grep -q stranded "$tmp/$name.bench"; then
        fail "$name-requests-complete" "$(grep stranded "$tmp/$name.bench")"
    fi
    stop || fail "$name-sigterm-exits" "$(grep -v stats "$tmp/$name.log" | tail -2)"
    rm -f "$tmp/$name.sock"
}

# corrupt_after NAME IMAGE BEFORE: QEMU's reading after vblkd served the
# image: no more corruptions than BEFORE, the header's corrupt bit set
# (qemu-img info), the log naming what was wrong once.
corrupt_after() {
    local name=$1 img=$2 before=$3 after
    after=$(corruptions "$img")
    if ((after <= before)) && qemu-img info "$img" | grep -q "corrupt: true" &&
       (($(grep -c "is corrupt: .*marked corrupt" "$tmp/$name.log") == 1)); then
        pass "$name-marked-corrupt-not-made-worse"
    else
        fail "$name-marked-corrupt-not-made-worse" "corruptions $before -> $after;" \
            "$(qemu-img info "$img" | grep corrupt) $(grep -c 'is corrupt' "$tmp/$name.log") lines"
    fi
}

# ---- Corrupt qcow2 images ----------------------------------------------------
# qcow2img NAME SIZE OPTS: an image with data written by QEMU.
qcow2img() {
    qemu-img create -q -f qcow2 -o "$3" "$tmp/$1.qcow2" "$2"
    qemu-io -f qcow2 -c "write -P 0x11 0 8M" -c "write -P 0x22 16M 4M" "$tmp/$1.qcow2" >/dev/null
}
# A field of an image: poke64 IMAGE OFFSET VALUE (big-endian u64; bash's
# negative numbers as their two's complement), peek64 IMAGE OFFSET.
poke64() {
    python3 -c 'import struct, sys
with open(sys.argv[1], "r+b") as f: f.seek(int(sys.argv[2], 0)); f.write(struct.pack(">Q", int(sys.argv[3], 0) & (2**64 - 1)))' "$@"
}
peek64() {
    python3 -c 'import struct, sys
with open(sys.argv[1], "rb") as f: f.seek(int(sys.argv[2], 0)); print(struct.unpack(">Q", f.read(8))[0])' "$@"
}

# The first refcount-table entry pointed at a data cluster (the issue's
# case: 0x20000 -> 0x220000): the "refcount block" there is guest data, its
# counts far past the end of the file.  Before: served 2 s of random
# writes, qemu-img check counted 390 corruptions where there were 194 and
# the file's end went to 2.2 GB; QEMU refuses the first write.
qcow2img rt-into-data 32M cluster_size=64k
rt=$(peek64 "$tmp/rt-into-data.qcow2" 48)
poke64 "$tmp/rt-into-data.qcow2" "$rt" 0x220000
before=$(corruptions "$tmp/rt-into-data.qcow2")
size0=$(stat -c %s "$tmp/rt-into-data.qcow2")
serve rt-into-data "$tmp/rt-into-data.qcow2" --rw randwrite --runtime 2 --iodepth 8
corrupt_after rt-into-data "$tmp/rt-into-data.qcow2" "$before"
size1=$(stat -c %s "$tmp/rt-into-data.qcow2")
((size1 <= size0 + (64 << 20))) && pass rt-into-data-file-end-bounded ||
    fail rt-into-data-file-end-bounded "$size0 -> $size1 bytes"

# An L2 entry pointed at a refcount block: a write to that guest cluster
# would overwrite the refcounts (QEMU: "Preventing invalid write on
# metadata (overlaps with refcount block)").  The write fails, the image is
# marked corrupt, reads of clusters with good entries go on.
qcow2img l2-into-rb 32M cluster_size=64k
img=$tmp/l2-into-rb.qcow2
l1=$(peek64 "$img" 40); l2=$(($(peek64 "$img" "$l1") & 0x00fffffffffffe00))
rb=$(peek64 "$img" "$(peek64 "$img" 48)")
poke64 "$img" "$l2" $(((1 << 63) | rb))
before=$(corruptions "$img")
serve l2-into-rb "$img" --rw write --size 64k --bs 4k --runtime 0.5
grep -q "errors 0" "$tmp/l2-into-rb.bench" &&
    fail l2-into-rb-write-fails "the write to the bad cluster succeeded" || pass l2-into-rb-write-fails
corrupt_after l2-into-rb "$img" "$before"
# --read-only: the image, marked corrupt now, is served for reads; a
# cluster with a good entry reads what QEMU wrote there.
start "$tmp/l2-into-rb-ro.log" "$tmp/ro.sock" --disk "$img" --read-only
out=$("$BENCH" --socket "$tmp/ro.sock" --rw randread --offset 1M --size 1M --runtime 0.3 --ramp 0 2>&1)
stop
if grep -q "errors 0" <<<"$out" && qemu-io -r -f qcow2 -c "read -P 0x11 1M 1M" "$img" | grep -q "read 1048576"; then
    pass l2-into-rb-good-clusters-still-read
else
    fail l2-into-rb-good-clusters-still-read "$(tail -1 <<<"$out")"
fi

# Two L1 entries pointed at one L2 table (512-byte clusters: an L2 table
# maps 32 KiB): a write through one would change what the other maps.
# Found when the image becomes vblkd's, before any write.
qcow2img l1-share 32M cluster_size=512
img=$tmp/l1-share.qcow2
l1=$(peek64 "$img" 40)
poke64 "$img" $((l1 + 8)) "$(peek64 "$img" "$l1")"
before=$(corruptions "$img")
serve l1-share "$img" --rw randwrite --runtime 0.5 --iodepth 4
grep -q "share a cluster" "$tmp/l1-share.log" && pass l1-share-found-at-claim ||
    fail l1-share-found-at-claim "$(grep -v stats "$tmp/l1-share.log" | grep -E 'error|warn' | head -2)"
corrupt_after l1-share "$img" "$before"

# Names an image holds reach messages: a backing file named with a
# newline and a terminal escape is refused in one line (log.h,
# log_one_line), the name's control characters shown as '?'.
qemu-img create -q -f qcow2 "$tmp/nl.qcow2" 16M
python3 - "$tmp/nl.qcow2" <<'PY'
import struct, sys
name = b"no\nsuch\x1b[31mbase"
with open(sys.argv[1], "r+b") as f:
    f.seek(8); f.write(struct.pack(">QI", 1024, len(name)))
    f.seek(1024); f.write(name)
PY
out=$(timeout 10 "$VBLKD" --socket "$tmp/nl.sock" --disk "$tmp/nl.qcow2" 2>&1); rc=$?
if ((rc != 0)) && (($(wc -l <<<"$out") == 1)) && [[ $out == *"no?such?[31mbase"* ]]; then
    pass name-from-image-in-one-line
else
    fail name-from-image-in-one-line "rc=$rc: $(cat -A <<<"$out" | head -3)"
fi

# A VM that only reads changes nothing: the image is the same file after
# (the autoclear bits, which a persistent bitmap sets, are cleared at the
# first write, not when the rings start).
qcow2img readonly 32M cluster_size=64k
qemu-img bitmap --add "$tmp/readonly.qcow2" b0
sum0=$(sha256sum "$tmp/readonly.qcow2" | cut -d' ' -f1)
serve reads-only "$tmp/readonly.qcow2" --rw randread --runtime 0.5 --iodepth 4
[[ $(sha256sum "$tmp/readonly.qcow2" | cut -d' ' -f1) == "$sum0" ]] &&
    grep -q "errors 0" "$tmp/reads-only.bench" && pass qcow2-read-only-use-writes-nothing ||
    fail qcow2-read-only-use-writes-nothing "the image changed, or: $(tail -1 "$tmp/reads-only.bench")"

# ---- Growth: freed clusters come back ---------------------------------------
# Discards and writes without end (fmt-io: 20000 random requests on a
# 32 MiB disk, a fifth of them discards or write zeroes): the clusters the
# discards free are allocated again, so the file's end stays near the disk's
# size (before: 1.4 GB, every new cluster at the end).
qemu-img create -q -f qcow2 "$tmp/churn.qcow2" 32M
qemu-img convert -O raw "$tmp/churn.qcow2" "$tmp/churn.raw"
out=$("$BUILD/fmt-io" "$tmp/churn.qcow2" "$tmp/churn.raw" 7 20000 --max-len 1048576 2>&1)
end=$(stat -c %s "$tmp/churn.qcow2")
if grep -q " 0 mismatches" <<<"$out" && ! grep -q " 0 reused" <<<"$out" &&
   ((end <= (32 << 20) + (40 << 20))) && qemu-img check -q "$tmp/churn.qcow2" &&
   qemu-img compare -q "$tmp/churn.qcow2" "$tmp/churn.raw"; then
    pass qcow2-freed-clusters-reused-file-end-bounded
else
    fail qcow2-freed-clusters-reused-file-end-bounded "end $end: $out"
fi

# ---- The lock after kill -9 ------------------------------------------------
# vblkd killed under writes at queue depth 128, a new one started at once
# on the same image (a fresh socket: no wait for the stale one), its
# frontend connecting the moment it listens: the dead one's io_uring may
# still hold the file, and so the lock, for tens of ms.  20 times each on
# raw and qcow2; every restart must serve, and qcow2 come out with no
# corruption (leaked clusters are what a crash may leave).
restarts() {	# restarts NAME IMAGE
    local name=$1 img=$2 bad=0 waited=0 out i
    for i in $(seq 20); do
        start "$tmp/$name-a$i.log" "$tmp/$name-a$i.sock" --disk "$img" ||
            { bad=$((bad + 1)); continue; }
        "$BENCH" --socket "$tmp/$name-a$i.sock" --rw randwrite --iodepth 128 --bs 64k \
            --runtime 5 --ramp 0 >/dev/null 2>&1 &
        bpid=$!
        sleep 0.3
        kill -9 "$dpid"; wait "$dpid" 2>/dev/null; dpid=""
        if ! start "$tmp/$name-b$i.log" "$tmp/$name-b$i.sock" --disk "$img"; then
            bad=$((bad + 1)); kill -9 "$bpid"; wait "$bpid" 2>/dev/null; bpid=""; continue
        fi
        out=$("$BENCH" --socket "$tmp/$name-b$i.sock" --rw randwrite --iodepth 4 --runtime 0.2 \
              --ramp 0 2>&1) || { bad=$((bad + 1)); echo "  run $i: $(tail -1 <<<"$out")"; }
        kill -9 "$bpid" 2>/dev/null; wait "$bpid" 2>/dev/null; bpid=""
        stop || bad=$((bad + 1))
        grep -q "lock taken after" "$tmp/$name-b$i.log" && waited=$((waited + 1))
        rm -f "$tmp/$name-a$i.sock" "$tmp/$name-b$i.sock"
    done
    if ((bad == 0)); then
        pass "$name-restart-at-once-after-kill-9-x20"
        echo "NOTE: $name: the new vblkd waited for the lock in $waited of 20 restarts"
    else
        fail "$name-restart-at-once-after-kill-9-x20" "$bad of 20 restarts did not serve"
        grep -h "error" "$tmp/$name"-b*.log | grep -v stats | head -3
    fi
}
truncate -s 256M "$tmp/k.raw"
restarts raw "$tmp/k.raw"
qemu-img create -q -f qcow2 "$tmp/k.qcow2" 256M
restarts qcow2 "$tmp/k.qcow2"
c=$(corruptions "$tmp/k.qcow2")
[[ $c == 0 ]] && pass qcow2-no-corruption-after-20-kills || fail qcow2-no-corruption-after-20-kills "$c"

exit 0
