#!/usr/bin/env bash
# The mutation campaign, short (issue 44): COUNT mutants (default 300,
# seeds from 1: the same ones every run) of qcow2 and LUKS images made by
# qemu-img and cryptsetup, each served by BUILD_DIR's vblkd and driven by
# mutant-io (tests/format/mutate.py says what is checked).  One PASS/FAIL
# line per kind of failure, with the failing seeds; the campaign's own
# output (a line per mutant, the tables) above them.
# Usage: test_mutate.sh BUILD_DIR [COUNT].  PASS:/FAIL:/SKIP: lines.
set -uo pipefail
BUILD=${1:?usage: test_mutate.sh BUILD_DIR [COUNT]}
COUNT=${2:-300}
here=$(cd "$(dirname "$0")" && pwd)

for t in qemu-img qemu-io cryptsetup python3; do
    command -v $t >/dev/null ||
        { echo "SKIP: mutate (no $t: scripts/deps.sh format installs it)"; exit 0; }
done
[[ -x $BUILD/vblkd && -x $BUILD/mutant-io ]] ||
    { echo "SKIP: mutate (no $BUILD/vblkd or $BUILD/mutant-io: ninja -C $BUILD)"; exit 0; }
tmp=$(mktemp -d /tmp/vblk-mutate-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# KEEP=DIR keeps each failing mutant's directory there.  A SIGTERM (the
# runner's timeout) goes on to the campaign, which stops its vblkd.
python3 "$here/mutate.py" --vblkd "$BUILD/vblkd" --mutant-io "$BUILD/mutant-io" \
    --count "$COUNT" --first-seed 1 --json "$tmp/summary.json" ${KEEP:+--keep "$KEEP"} &
pid=$!
trap 'kill -TERM $pid 2>/dev/null' TERM INT
wait $pid; rc=$?
# A trapped signal ends the wait early: wait for the campaign's own end.
if ((rc > 128)) && kill -0 $pid 2>/dev/null; then wait $pid; rc=$?; fi
if [[ ! -s $tmp/summary.json ]]; then
    echo "FAIL: mutate: the campaign did not finish (rc=$rc)"
    exit 1
fi
python3 - "$tmp/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
names = [("crash", "mutate-no-crash-or-sanitizer-report"),
         ("hang", "mutate-no-hang-at-start"),
         ("unanswered", "mutate-every-request-answered"),
         ("sigterm", "mutate-sigterm-exits"),
         ("growth", "mutate-no-growth-past-the-bound"),
         ("refused-modified", "mutate-refused-images-unchanged"),
         ("refusal-lines", "mutate-refusal-is-one-line"),
         ("header-modified", "mutate-luks-header-never-written"),
         ("luks-served-raw", "mutate-luks-never-served-raw"),
         ("other-files", "mutate-no-other-file-touched"),
         ("worse-than-qemu", "mutate-no-worse-than-qemu"),
         ("tool-error", "mutate-tool-ran-clean")]
for kind, name in names:
    bad = s["failures"].get(kind, [])
    if bad:
        seeds = " ".join(f"{b}:{n}" for b, n in bad[:20])
        more = f" (+{len(bad) - 20} more)" if len(bad) > 20 else ""
        print(f"FAIL: {name}: {len(bad)} of {s['count']} mutants: {seeds}{more}")
    else:
        print(f"PASS: {name}")
PY
