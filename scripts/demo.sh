#!/usr/bin/env bash
# The main job, end to end: install what is needed, build, start vblkd on a
# default sparse disk image, boot a small Linux guest (QEMU, software
# emulation) that runs fio against the disk, print what it saw and how to
# point a real QEMU at the socket.
#
#   scripts/demo.sh            run the demo, then stop the daemon
#   scripts/demo.sh --keep     leave vblkd serving afterwards (Ctrl-C stops it)
#   scripts/demo.sh --nbd      the same disk image behind an NBD server
#                              (nbdkit), served with --disk nbd+unix://...
#   scripts/demo.sh --rbd      an RBD image on a throwaway single-node Ceph
#                              cluster started here, --disk rbd:rbd/demo
#
# Environment: VBLK_DEMO_DIR (default build/demo), VBLK_DEMO_SIZE (1G).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
keep=0 kind=file
for a in "$@"; do
    case $a in
    --keep) keep=1 ;;
    --nbd) kind=nbd ;;
    --rbd) kind=rbd ;;
    *) echo "scripts/demo.sh: unknown option '$a' (--keep, --nbd, --rbd)" >&2; exit 1 ;;
    esac
done

dir=${VBLK_DEMO_DIR:-$top/build/demo}
size=${VBLK_DEMO_SIZE:-1G}
disk=$dir/disk.img
sock=$dir/vblkd.sock
ctl=$dir/ctl.sock

scripts/deps.sh all
[[ -f build/build.ninja ]] || meson setup build >/dev/null
ninja -C build >/dev/null

mkdir -p "$dir"
[[ -e $disk ]] || truncate -s "$size" "$disk"

spid="" extra=()
cleanup() {
    if [[ -n ${dpid:-} ]]; then kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null; fi
    [[ -n $spid ]] && kill "$spid" 2>/dev/null
    [[ $kind == rbd ]] && scripts/ceph-cluster.sh stop "$dir/ceph" >/dev/null 2>&1
    wait 2>/dev/null
}
trap cleanup EXIT

# summary GUEST-LOG STATS-JSON: a few lines for a person: what fio in the
# guest measured (its normal output, tests/guest/scenarios/demo.sh), what
# vblkd counted (vblkctl stats), where the full numbers are.
summary() {
    python3 - "$1" "$2" <<'PY'
import json, os, re, sys

log, stats = sys.argv[1:3]
SCALE = {"nsec": 1, "usec": 1e3, "msec": 1e6}


def dur(ns):
    if ns is None:
        return "?"
    if ns >= 1e6:
        return "%.1f ms" % (ns / 1e6)
    if ns >= 1e3:
        return "%.0f µs" % (ns / 1e3)
    return "%.0f ns" % ns


def fio_dir(text, rw):
    """IOPS and clat p50/p99 (ns) of fio's "read:"/"write:" section."""
    m = re.search(r"^\s*%s: IOPS=([\d.]+)([kM]?)" % rw, text, re.M)
    if not m:
        return None
    iops = float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6}[m.group(2)]
    sec = text[m.end():]
    other = re.search(r"^\s*(read|write): IOPS=|^Run status", sec, re.M)
    sec = sec[:other.start()] if other else sec
    pct = {}
    h = re.search(r"clat percentiles \((\w+)\):", sec)
    if h:
        for line in sec[h.end():].splitlines()[1:]:
            if not line.strip().startswith("|"):
                break
            for q, v in re.findall(r"([\d.]+)th=\[\s*(\d+)\]", line):
                pct[q] = int(v) * SCALE.get(h.group(1), 1)
    return iops, pct.get("50.00"), pct.get("99.00")


text = "\n".join(l for l in open(log, errors="replace").read().replace("\r", "").splitlines()
                 if not re.match(r"\[\s*\d", l))
job = re.search(r"Running fio: (.*?) \(", text)
print("The guest's fio (%s):" % (job.group(1) if job else "?"))
res = [(rw, fio_dir(text, rw)) for rw in ("read", "write")]
for rw, r in res:
    if r:
        print("  %-5s %6.0f IOPS, latency p50 %s, p99 %s" % (rw, r[0], dur(r[1]), dur(r[2])))
if not any(r for _, r in res):
    print("  no results in the guest log")

try:
    s = json.load(open(stats))
    ops, queues = s["disk"]["ops"], s["queues"]
except (OSError, ValueError, KeyError):
    sys.exit("vblkd's counters: none (see %s)" % stats)
print("What vblkd saw (latency: from taking a request off the ring to completing it):")
for rw in ("read", "write"):
    o = ops[rw]
    print("  %-5s %6d requests, %.1f MiB, %d errors, latency p50 %s, p99 %s"
          % (rw, o["requests"], o["bytes"] / 2**20, o["errors"],
             dur(o["latency_ns"]["p50"]), dur(o["latency_ns"]["p99"])))
req = sum(q["requests"] for q in queues)
calls, kicks = sum(q["calls"] for q in queues), sum(q["kicks"] for q in queues)
print("  %.2f interrupts (calls) and %.2f kicks per request (%d requests, %d queues)"
      % (calls / max(req, 1), kicks / max(req, 1), req, len(queues)))
print("All the numbers, in %s: stats.json (vblkctl stats), vblkd.log, guest.log"
      % os.path.dirname(os.path.abspath(stats)))
PY
}
case $kind in
nbd)
    # nbdkit serves the image file on a unix socket; vblkd is its client.
    rm -f "$dir/nbd.sock"
    nbdkit -f -U "$dir/nbd.sock" file "$disk" >"$dir/nbdkit.log" 2>&1 &
    spid=$!
    for _ in $(seq 100); do [[ -S $dir/nbd.sock ]] && break; sleep 0.05; done
    served="nbd+unix:///?socket=$dir/nbd.sock"
    ;;
rbd)
    echo "starting a single-node Ceph cluster (about 10 s) ..."
    rm -rf "$dir/ceph"
    conf=$(scripts/ceph-cluster.sh start "$dir/ceph")
    CEPH_CONF=$conf rbd create --size "$size" rbd/demo
    served=rbd:rbd/demo
    extra=(--ceph-conf "$conf")
    ;;
*) served=$disk ;;
esac

build/vblkd --socket "$sock" --control "$ctl" --disk "$served" "${extra[@]}" --queues 2 \
    >"$dir/vblkd.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do grep -q serving "$dir/vblkd.log" && break; sleep 0.05; done
grep -q serving "$dir/vblkd.log" || { cat "$dir/vblkd.log"; exit 1; }
echo "vblkd is serving $served ($size, 2 queues) on $sock"

. tests/guest/lib.sh
guest_build_initramfs build/guest
guest_initrd tests/guest/scenarios/demo.sh "$dir/demo.initrd" build/guest
echo "booting a demo guest (QEMU TCG; takes about 20 s) ..."
rc=0
guest_boot "$sock" 2 "$dir/demo.initrd" "$dir/guest.log" 300 || rc=$?
echo "---- what the guest saw ----"
tr -d '\r' <"$dir/guest.log" | awk '/^=+$/ && !p {p=1} p && !/^\[ *[0-9]/' |
    grep -av 'VBLK-GUEST' || true
echo "----------------------------"
# The daemon's counters, all of them, kept in a file; the summary below
# reads them and the guest's fio output.
build/vblkctl --control "$ctl" stats >"$dir/stats.json" 2>&1 || true
summary "$dir/guest.log" "$dir/stats.json" || true
if ((rc != 0)) || ! guest_log_result "$dir/guest.log" demo; then
    echo "demo FAILED (guest log: $dir/guest.log, daemon log: $dir/vblkd.log)"
    exit 1
fi
cat <<EOT

Demo passed.  To give a real VM this disk, run vblkd and point QEMU at the socket:
  build/vblkd --socket $sock --disk $served ${extra[*]} --queues 2
  qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=4G,share=on \\
      -numa node,memdev=mem -chardev socket,id=c0,path=$sock \\
      -device vhost-user-blk-pci,chardev=c0,num-queues=2
(vhost-user needs the guest RAM shared: memory-backend-memfd with share=on.)
EOT
if ((keep)); then
    echo "vblkd keeps serving on $sock (log: $dir/vblkd.log); Ctrl-C stops it."
    echo "Its counters now: build/vblkctl --control $ctl stats"
    wait "$dpid"
fi
