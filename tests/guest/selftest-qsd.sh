#!/usr/bin/env bash
#
# tests/guest/selftest-qsd.sh [OUTDIR]
#
# Validates the guest harness with qemu-storage-daemon as the vhost-user-blk
# backend (instead of vblkd).  Cases:
#   fio-verify-q1   fio write+verify, num-queues=1, VBLK-IRQ lines
#   fio-verify-q2   same with num-queues=2
#   fill            guest writes pattern to the first 1 MiB; host checks IMG
#   readonly        export with writable=off; guest writes must fail
#   demo            the friendly demo scenario
# Prints "PASS: <case> ..." / "FAIL: <case> ..." per case (tests/run style).
# Logs are kept in OUTDIR/logs/selftest-<case>.log (OUTDIR defaults to
# build/guest under the repo root).  Exit status 0 iff all cases pass.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$HERE/lib.sh"

OUTDIR="${1:-$VBLK_GUEST_BUILD_DEFAULT}"
TIMEOUT_S="${VBLK_GUEST_TIMEOUT:-240}"
SCN="$HERE/scenarios"

guest_deps
guest_build_initramfs "$OUTDIR"
mkdir -p "$OUTDIR/logs"

WORK="$(mktemp -d "$OUTDIR/selftest.XXXXXX")"
IMG="$WORK/disk.img"
SOCK="$WORK/vhost.sock"
QSD_PID=""

stop_qsd() {
    if [[ -n "$QSD_PID" ]]; then
        kill "$QSD_PID" 2>/dev/null || true
        wait "$QSD_PID" 2>/dev/null || true
        QSD_PID=""
    fi
    rm -f "$SOCK"
}

cleanup() {
    guest_boot_kill
    stop_qsd
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_qsd on|off NUMQ
start_qsd() {
    local writable="$1" numq="$2" i
    stop_qsd
    qemu-storage-daemon \
        --blockdev "driver=file,node-name=file0,filename=$IMG" \
        --blockdev "driver=raw,node-name=disk0,file=file0" \
        --export "type=vhost-user-blk,id=exp0,node-name=disk0,addr.type=unix,addr.path=$SOCK,writable=$writable,num-queues=$numq" \
        >"$WORK/qsd.log" 2>&1 &
    QSD_PID=$!
    for ((i = 0; i < 100; i++)); do
        [[ -S "$SOCK" ]] && return 0
        if ! kill -0 "$QSD_PID" 2>/dev/null; then
            echo "qemu-storage-daemon died: $(cat "$WORK/qsd.log")" >&2
            QSD_PID=""
            return 1
        fi
        sleep 0.1
    done
    echo "qemu-storage-daemon did not create $SOCK" >&2
    return 1
}

declare -a SUMMARY=()
FAILED=0

# run_case NAME SCENARIO NUMQ [extra-check-function]
run_case() {
    local name="$1" scenario="$2" numq="$3" check="${4:-}"
    local initrd="$WORK/$name.img" log="$OUTDIR/logs/selftest-$name.log"
    local rc=0 t0 t1 secs verdict=PASS why=""
    local sname
    sname="$(basename "$scenario" .sh)"

    guest_initrd "$scenario" "$initrd" "$OUTDIR"
    t0="$(date +%s%N)"
    guest_boot "$SOCK" "$numq" "$initrd" "$log" "$TIMEOUT_S" || rc=$?
    t1="$(date +%s%N)"
    secs="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')"

    if ((rc != 0)); then
        verdict=FAIL why="qemu-rc=$rc"
    elif ! guest_log_result "$log" "$sname"; then
        why="$(guest_log_lines "$log" 'VBLK-RESULT:' | sed -n 1p)"
        verdict=FAIL why="guest: ${why:-no VBLK-RESULT line}"
    fi
    # The guest must see as many hardware queues as we asked for.
    local hwq
    hwq="$(guest_log_lines "$log" 'hw_queues=' | sed -n '1s/^hw_queues=\([0-9]*\).*/\1/p')"
    if [[ "$verdict" == PASS && "$hwq" != "$numq" ]]; then
        verdict=FAIL why="guest saw hw_queues=${hwq:-?}, expected $numq"
    fi
    if [[ "$verdict" == PASS && -n "$check" ]]; then
        if ! why="$("$check" 2>&1)"; then
            verdict=FAIL
        fi
    fi

    guest_log_lines "$log" 'VBLK-IRQ:' | sed "s/^/  [$name] /"
    printf '%s: %-14s num-queues=%s boot+run=%ss%s\n' "$verdict" "$name" "$numq" "$secs" "${why:+  ($why)}"
    SUMMARY+=("$verdict $name ${secs}s")
    if [[ "$verdict" != PASS ]]; then
        FAILED=1
        echo "---- last lines of $log ----"
        tr -d '\r' <"$log" | tail -n 25
        echo "----"
    fi
}

check_fill() {
    local exp="$WORK/expected.bin" i
    printf '\x5a\x5b\x5c\x5d' >"$exp"
    for ((i = 0; i < 18; i++)); do
        cat "$exp" "$exp" >"$exp.2" && mv "$exp.2" "$exp"
    done
    if ! head -c 1048576 "$IMG" | cmp -s - "$exp"; then
        echo "host: first 1 MiB of image does not match the 5a5b5c5d pattern"
        return 1
    fi
    # ... and the fill must not have spilled past 1 MiB (image was zeroed).
    if [[ "$(dd if="$IMG" bs=4096 skip=256 count=1 2>/dev/null | tr -d '\0' | wc -c)" != 0 ]]; then
        echo "host: data found right after the first 1 MiB"
        return 1
    fi
    echo "host: image pattern OK"
}

echo "== vblkd guest harness self-test with qemu-storage-daemon ($(qemu-storage-daemon --version | head -n 1))"
echo "== kernel $(guest_kernel), logs in $OUTDIR/logs"

qemu-img create -q -f raw "$IMG" 256M
start_qsd on 2
run_case fio-verify-q1 "$SCN/fio-verify.sh" 1
start_qsd on 2
run_case fio-verify-q2 "$SCN/fio-verify.sh" 2

# Fresh (zeroed) image so the host check is meaningful.
stop_qsd
rm -f "$IMG"
qemu-img create -q -f raw "$IMG" 256M
start_qsd on 2
run_case fill "$SCN/fill.sh" 2 check_fill

start_qsd off 1
run_case readonly "$SCN/readonly.sh" 1

start_qsd on 2
run_case demo "$SCN/demo.sh" 2
stop_qsd

echo "== summary: ${SUMMARY[*]/%/;}"
if ((FAILED)); then
    echo "== SELFTEST FAILED"
    exit 1
fi
echo "== SELFTEST PASSED"
