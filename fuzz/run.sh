#!/usr/bin/env bash
# Build the libFuzzer targets (clang 14, ASan + UBSan) in build-fuzz/ and
# run each for SECONDS (default 60) on a copy of its seed corpus kept in
# build-fuzz/fuzz-corpus/<target> (what a run finds is kept for the next).
#
#   fuzz/run.sh [SECONDS]
#   FUZZ_JOBS=2 fuzz/run.sh 300    all targets at once
#   VBLK_FUZZ_LOG=warn ...         the daemon's log level (default debug;
#                                  the log goes to /dev/null in these runs)
#
# Per target: executions, coverage, and for a crash, timeout or OOM the
# file libFuzzer saved (build-fuzz/fuzz-artifacts/<target>/).  Exits
# non-zero if any target failed; the last line is "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
jobs=${FUZZ_JOBS:-1}
build=build-fuzz
# split and packed: the fast ring targets (fuzz_vq_blk.c, synchronous), on
# fuzz_vq_blk's seeds.  luks needs the LUKS build (libcryptsetup-dev,
# libssl-dev: scripts/deps.sh build installs them).
targets=(vq_blk vu split packed qcow2 luks nbd_opt nbd_tx)

[[ $secs =~ ^[0-9]+$ && $secs -gt 0 ]] || { echo "usage: fuzz/run.sh [SECONDS]" >&2; exit 2; }

fail_setup() {
    echo "fuzz/run.sh: $*"
    echo "0 passed, ${#targets[@]} failed"
    exit 1
}

# clang 14 with its libFuzzer runtime: try to link an empty fuzzer.
have_clang() {
    command -v clang-14 >/dev/null &&
        echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
        clang-14 -fsanitize=fuzzer,address,undefined -x c - -o /tmp/vblk-fuzz-probe.$$ \
            >/dev/null 2>&1
    local r=$?
    rm -f /tmp/vblk-fuzz-probe.$$
    return $r
}

scripts/deps.sh build || fail_setup "cannot install the build dependencies"
if ! have_clang; then
    [[ $(id -u) -eq 0 ]] || fail_setup "clang-14 with libFuzzer missing: apt-get install clang-14 libclang-rt-14-dev"
    echo "fuzz/run.sh: installing clang-14 libclang-rt-14-dev" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        clang-14 libclang-rt-14-dev; } >/dev/null || fail_setup "apt-get install clang-14 failed"
    have_clang || fail_setup "clang-14 cannot link a libFuzzer target"
fi

if [[ ! -f $build/build.ninja ]]; then
    CC=clang-14 meson setup "$build" -Dfuzz=true -Db_sanitize=address,undefined \
        -Db_lundef=false >"/tmp/vblk-fuzz-setup.$$.log" 2>&1 || {
        tail -20 "/tmp/vblk-fuzz-setup.$$.log"; rm -f "/tmp/vblk-fuzz-setup.$$.log"
        fail_setup "meson setup $build failed"; }
    rm -f "/tmp/vblk-fuzz-setup.$$.log"
fi
mkdir -p "$build/fuzz-logs"
ninja -C "$build" "${targets[@]/#/fuzz/fuzz_}" >"$build/fuzz-logs/ninja.log" 2>&1 || {
    tail -30 "$build/fuzz-logs/ninja.log"; fail_setup "build failed"; }

run_one() {
    local t=$1 corpus=$build/fuzz-corpus/$1 art=$build/fuzz-artifacts/$1/
    local log=$build/fuzz-logs/$1.log crashes
    mkdir -p "$corpus" "$art"
    local seeds=$t
    [[ $t == split || $t == packed ]] && seeds=vq_blk
    cp -n fuzz/corpus/"$seeds"/* "$corpus"/ 2>/dev/null
    : >"$log"
    # Inputs that once crashed (fixed since) must not crash again.
    crashes=(fuzz/crashes/"$t"-*)
    if [[ -e ${crashes[0]} ]] &&
       ! "$build/fuzz/fuzz_$t" -timeout=10 -close_fd_mask=2 "${crashes[@]}" >>"$log" 2>&1; then
        echo "Replayed crash input failed: $(sed -n 's/^Running: //p' "$log" | tail -1)" >>"$log"
        return 1
    fi
    # -close_fd_mask=2: the daemon's log lines go to /dev/null; libFuzzer's
    # own output and sanitizer reports do not.
    "$build/fuzz/fuzz_$t" "$corpus" -max_total_time="$secs" -timeout=10 \
        -rss_limit_mb=2048 -close_fd_mask=2 -print_final_stats=1 \
        -artifact_prefix="$art" >>"$log" 2>&1
}

report() {
    local t=$1 rc=$2 log=$build/fuzz-logs/$1.log runs cov art
    runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    [[ -n $art ]] || art=$(sed -n 's/^Replayed crash input failed: \(.*\)$/\1 (replayed)/p' "$log")
    if ((rc == 0)) && [[ -n $runs ]]; then
        pass=$((pass + 1))
        echo "PASS: fuzz_$t: $runs executions in ${secs}s, ${cov:-cov: ?}"
    else
        fail=$((fail + 1))
        echo "FAIL: fuzz_$t (exit $rc, ${cov:-cov: ?}): ${art:-no input saved} (log: $log)"
        grep -E '^(==[0-9]+==ERROR|SUMMARY|.*invariant failed|.*runtime error|ALARM|.*leaked during)' \
            "$log" | head -5 | sed 's/^/    /'
    fi
}

pass=0 fail=0
declare -A rcs
if ((jobs > 1)); then
    declare -A pids
    for t in "${targets[@]}"; do run_one "$t" & pids[$t]=$!; done
    for t in "${targets[@]}"; do wait "${pids[$t]}"; rcs[$t]=$?; done
else
    for t in "${targets[@]}"; do run_one "$t"; rcs[$t]=$?; done
fi
for t in "${targets[@]}"; do report "$t" "${rcs[$t]}"; done
echo "$pass passed, $fail failed"
((fail == 0))
