#!/usr/bin/env bash
# Description: live migration of a guest whose disk is served by vhost-user
# daemons on shared storage.  One raw image, two disk daemons on it (A and
# B, default options).  QEMU A boots the guest on daemon A; the guest runs
# fio crc32c verify rounds (randwrite QD32, verify reads interleaved) on
# /dev/vda.  While they run, the VM is migrated over QMP to QEMU B on
# daemon B (started with -incoming), QEMU A quits (daemon A is free again),
# then to a fresh QEMU C on daemon A, and so on (2 hops by default).  Each
# migration must say "completed" and leave the destination running; the
# guest finishes on the last QEMU with zero verify errors.  1 and 2 queues.
# With 2 queues the first destination's daemon is also killed (SIGKILL)
# after the hop and started again, QEMU reconnecting (chardev reconnect=1):
# in-flight tracking (INFLIGHT_SHMFD) must keep working on a migrated VM.
# Prints PASS:/FAIL: lines for tests/run and the downtime / total time of
# each hop.
#
#   tests/guest/migrate.sh PATH/TO/vblkd        vblkd as the disk daemon
#   tests/guest/migrate.sh qsd                  qemu-storage-daemon instead
#                                               (or a path to it)
# Environment:
#   VBLK_MIGRATE_QUEUES="1 2"   queue counts to run
#   VBLK_MIGRATE_HOPS=2         migrations per boot (A->B->C->...)
#   VBLK_MIGRATE_BANDWIDTH      max-bandwidth, bytes/s (default 4 GiB/s)
#   VBLK_MIGRATE_RESULTS=FILE   append one JSON line per hop and per boot
#                               (bench/migration reads it)
#   VBLK_MIGRATE_TAG=NAME       prefix of test names and logs (default migrate)
#   VBLK_MIGRATE_LOGS=DIR       logs (default build/test-logs/migrate)
#   VBLK_MIGRATE_SCENARIO=FILE  guest scenario (default scenarios/migrate.sh;
#                               must print the same marker lines)
#   VBLK_MIGRATE_RESTART="2"    queue counts whose run restarts the first
#                               destination's daemon (vblkd only; "" for none)
set -uo pipefail
DAEMON=${1:?usage: migrate.sh PATH/TO/vblkd | qsd}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
set +e

case $DAEMON in
qsd | *qemu-storage-daemon*)
    kind=qsd
    [[ $DAEMON == qsd ]] && DAEMON=qemu-storage-daemon
    ;;
*) kind=vblkd ;;
esac
queues=${VBLK_MIGRATE_QUEUES:-1 2}
# Guest RAM: 512 MiB + 8 KiB, deliberately not a multiple of 256 KiB.
# QEMU 7.2 under TCG loses guest writes in live migration when a RAM block
# is a multiple of 64 pages: the fast path of its dirty-bitmap sync
# (cpu_physical_memory_sync_dirty_bitmap) clears the bits without resetting
# the vCPUs' TLB dirty state, so later stores through those TLB entries are
# never marked dirty nor sent again.  The guest kernel then crashes on the
# destination now and then (1 hop in 5 to 10 here, with a plain virtio-blk
# disk and no vhost-user as well).  Any other size takes the page-by-page
# path, which resets the TLBs (later QEMUs reset them on the fast path too:
# cpu_physical_memory_dirty_bits_cleared).
export VBLK_GUEST_MEM=${VBLK_GUEST_MEM:-524296K}
hops=${VBLK_MIGRATE_HOPS:-2}
bw=${VBLK_MIGRATE_BANDWIDTH:-4294967296}
results=${VBLK_MIGRATE_RESULTS:-}
tag=${VBLK_MIGRATE_TAG:-migrate}
gb="$VBLK_REPO_ROOT/build/guest"
logs=${VBLK_MIGRATE_LOGS:-$VBLK_REPO_ROOT/build/test-logs/migrate}
qemu_tmo=400 # seconds any one QEMU may live
mkdir -p "$logs"
work=$(mktemp -d /tmp/vblk-migrate.XXXXXX)

declare -A dpid=()  # daemon slot (A/B) -> pid
declare -A qpid=()  # QEMU index -> pid (timeout(1) wrapping it)
cleanup() {
    local p
    for p in "${qpid[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${dpid[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }
letter() { local l=ABCDEFGHIJKLMNOPQRSTUVWXYZ; echo "${l:$1:1}"; }

command -v python3 >/dev/null || { fail "$tag-deps" "python3 missing"; exit 1; }
guest_deps || { fail "$tag-deps" "cannot install the guest packages"; exit 1; }
if [[ $kind == vblkd && ! -x $DAEMON ]]; then
    fail "$tag-deps" "$DAEMON is not executable (run make)"
    exit 1
fi
guest_build_initramfs "$gb" || { fail "$tag-initramfs"; exit 1; }
guest_initrd "${VBLK_MIGRATE_SCENARIO:-$here/scenarios/migrate.sh}" "$work/m.initrd" "$gb" || { fail "$tag-initrd"; exit 1; }

# daemon_start SLOT Q NAME: daemon SLOT (A or B) on $work/SLOT.sock and the
# shared image, Q queues, default options.
daemon_start() {
    local slot=$1 q=$2 name=$3 sock="$work/$1.sock" log="$logs/$3.daemon-$1.log"
    rm -f "$sock"
    if [[ $kind == vblkd ]]; then
        "$DAEMON" --socket "$sock" --disk "$work/disk.img" --queues "$q" >"$log" 2>&1 &
    else
        "$DAEMON" --blockdev "driver=file,node-name=disk,filename=$work/disk.img,cache.direct=on,locking=off" \
            --export "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path=$sock,writable=on,num-queues=$q" \
            >"$log" 2>&1 &
    fi
    dpid[$slot]=$!
    for _ in $(seq 200); do
        if [[ -S $sock ]] && { [[ $kind == qsd ]] || grep -q serving "$log"; }; then
            return 0
        fi
        kill -0 "${dpid[$slot]}" 2>/dev/null || break
        sleep 0.05
    done
    fail "$name-daemon-$slot-start" "$(tail -3 "$log")"
    return 1
}

# daemon_stop SLOT: SIGTERM; its exit status in $rc.
daemon_stop() {
    rc=0
    kill -TERM "${dpid[$1]}" 2>/dev/null
    wait "${dpid[$1]}" || rc=$?
    unset "dpid[$1]"
}

# qemu_start I SLOT Q NAME [QEMU ARGS...]: QEMU number I (A, B, C...) on
# daemon SLOT, QMP on $work/qI.qmp, console in $logs/NAME.qemu-L.log.
qemu_start() {
    local i=$1 slot=$2 q=$3 name=$4 l
    shift 4
    l=$(letter "$i")
    guest_qemu_start "$work/$slot.sock" "$q" "$work/m.initrd" "$logs/$name.qemu-$l.log" \
        "$qemu_tmo" -qmp "unix:$work/q$i.qmp,server=on,wait=off" "$@" || return 1
    qpid[$i]=$VBLK_GUEST_QEMU_PID
    if ! guest_qmp "$work/q$i.qmp" wait-socket --timeout 30; then
        fail "$name-qemu-$l-start" "no QMP socket (see $logs/$name.qemu-$l.log)"
        return 1
    fi
}

# qemu_end I: wait for QEMU I (after quit or poweroff); its status in $rc.
qemu_end() {
    rc=0
    wait "${qpid[$1]}" || rc=$?
    unset "qpid[$1]"
}

# restart_daemon SLOT Q NAME L: SIGKILL the daemon that serves QEMU L (it
# got the VM by migration) and start it again; QEMU L reconnects and the
# new daemon resumes from the in-flight region QEMU hands it.  Up to 4
# kills, until one finds requests in flight (under TCG the guest often has
# none at a given instant).
restart_daemon() {
    local slot=$1 q=$2 name=$3 l=$4 log="$logs/$3.daemon-$1.log" k
    for k in 1 2 3 4; do
        kill -9 "${dpid[$slot]}"
        wait "${dpid[$slot]}" 2>/dev/null
        unset "dpid[$slot]"
        mv "$log" "$log.killed$k"
        daemon_start "$slot" "$q" "$name" || return 1
        for _ in $(seq 100); do
            grep -q "locked for writing" "$log" && break
            sleep 0.1
        done
        if ! grep -q "locked for writing" "$log" || ! grep -q "in-flight region from the frontend" "$log"; then
            fail "$name-$l-daemon-restarted-after-migration-reconnected" \
                "QEMU $l did not hand the new daemon its in-flight region and restart its rings (see $log)"
            return 1
        fi
        grep -q "resubmitting" "$log" && break
        sleep 0.7
    done
    pass "$name-$l-daemon-restarted-after-migration-reconnected"
    echo "  ($name: daemon $slot killed $k times after the hop;" \
        "$(grep -ho "resubmitting [0-9]* requests" "$log" || echo "none in flight at the kills"))"
}

# record JSON: one line of results (the run's identity added).
record() {
    [[ -n $results ]] || return 0
    python3 -c '
import json, sys
r = json.loads(sys.argv[1])
r.update(daemon=sys.argv[2], queues=int(sys.argv[3]), tag=sys.argv[4])
print(json.dumps(r))' "$1" "$kind" "$q" "$tag" >>"$results"
}

# run Q: one boot, $hops migrations; 0 iff all went well.  Sets run_boot
# (seconds to the guest's fio start) and run_wall.
run() {
    local q=$1 t0=$SECONDS i src dst sl dl out st
    local name="$tag-${q}q"
    local ok=1 slots=(A B) last=$hops restart=0
    [[ $kind == vblkd && " ${VBLK_MIGRATE_RESTART-2} " == *" $q "* ]] && restart=1
    # QEMU reconnects to a restarted daemon (and the restart is a real one:
    # the daemon that got the VM by migration is the one killed).
    if ((restart)); then export VBLK_GUEST_CHARDEV_OPTS=",reconnect=1"; else unset VBLK_GUEST_CHARDEV_OPTS; fi
    rm -f "$logs/$name".*
    rm -f "$work/disk.img"
    truncate -s 256M "$work/disk.img"
    daemon_start A "$q" "$name" && daemon_start B "$q" "$name" || return 1

    qemu_start 0 A "$q" "$name" || return 1
    # The first destination waits (-incoming) while the guest boots.
    qemu_start 1 B "$q" "$name" -incoming "unix:$work/m1.sock" || return 1
    guest_wait_log "$logs/$name.qemu-A.log" "migrate fio start" 120 "${qpid[0]}"
    case $? in
    0) ;;
    2) fail "$name-guest-boot" "QEMU A exited (see $logs/$name.qemu-A.log)"; return 1 ;;
    *) fail "$name-guest-boot" "no fio start in 120 s (see $logs/$name.qemu-A.log)"; return 1 ;;
    esac
    run_boot=$((SECONDS - t0))
    sleep 1 # fio's first requests in flight

    for ((i = 1; i <= hops; i++)); do
        src=$((i - 1)) dst=$i
        sl=$(letter $src) dl=$(letter $dst)
        if ((i > 1)); then
            # Daemon ${slots[dst % 2]} was freed when QEMU $dst-2 quit.
            qemu_start "$dst" "${slots[dst % 2]}" "$q" "$name" -incoming "unix:$work/m$dst.sock" ||
                return 1
        fi
        for _ in $(seq 100); do [[ -S $work/m$dst.sock ]] && break; sleep 0.1; done
        out=$(guest_qmp "$work/q$src.qmp" migrate "unix:$work/m$dst.sock" \
            --max-bandwidth "$bw" --timeout 120 2>&1)
        rc=$?
        if ((rc == 0)); then
            pass "$name-$sl-to-$dl-completed"
        else
            st=$(guest_log_lines "$logs/$name.qemu-$sl.log" 'VBLK-RESULT:')
            kill -0 "${qpid[$src]}" 2>/dev/null || out="QEMU $sl exited (${st:-no result line}): $out"
            fail "$name-$sl-to-$dl-completed" "$out"
            ok=0
        fi
        python3 - "$out" "$name" "$sl" "$dl" <<'PY'
import json, sys
try:
    r = json.loads(sys.argv[1])
    print(f"  ({sys.argv[2]} {sys.argv[3]}->{sys.argv[4]}: downtime {r['downtime']} ms, "
          f"total {r['total-time']} ms; setup {r['setup-time']} ms, "
          f"{(r['ram-transferred'] or 0) >> 20} MiB sent, {r['status']})")
except ValueError:
    pass
PY
        [[ $out == "{"* ]] && record "$(python3 -c '
import json, sys
r = json.loads(sys.argv[1]); r.update(event="hop", hop=int(sys.argv[2]), src=sys.argv[3], dst=sys.argv[4])
print(json.dumps(r))' "$out" "$i" "$sl" "$dl")"
        ((ok)) || return 1
        st=$(guest_qmp "$work/q$dst.qmp" wait-status running --timeout 30 2>&1)
        if [[ $st == *'"running"'* ]]; then
            pass "$name-$dl-running"
        else
            fail "$name-$dl-running" "query-status: $st"
            return 1
        fi
        guest_qmp "$work/q$src.qmp" quit >/dev/null
        qemu_end "$src"
        ((rc == 0)) || echo "  (QEMU $sl exited with status $rc after quit)"
        if ((restart && i == 1)); then
            restart_daemon "${slots[dst % 2]}" "$q" "$name" "$dl" || return 1
        fi
        if ((i < hops)); then
            # The guest must get on with its I/O on the new QEMU (and its
            # daemon) before the next hop: a round finishes there.  A
            # failed round ends the guest's job: no more hops then.
            guest_wait_log "$logs/$name.qemu-$dl.log" "migrate round [0-9]+ |VBLK-RESULT:" 90 "${qpid[$dst]}" || {
                fail "$name-$dl-guest-progress" "no fio round finished on QEMU $dl in 90 s"
                return 1
            }
            sleep 0.5 # a failed round's result line follows it at once
            if guest_log_lines "$logs/$name.qemu-$dl.log" "VBLK-RESULT:" | grep -q .; then
                last=$i
                break
            fi
        fi
    done

    # Tell the guest to finish: the stop mark in the disk's last 4 KiB.
    python3 - "$work/disk.img" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, b"VBLK-MIGRATE-STOP".ljust(4096, b"\0"), os.fstat(fd).st_size - 4096)
os.fsync(fd)
os.close(fd)
PY
    dl=$(letter "$last")
    local tstop=$SECONDS
    # The guest ends its round, verifies it again and powers off.
    for _ in $(seq 1200); do kill -0 "${qpid[$last]}" 2>/dev/null || break; sleep 0.1; done
    kill "${qpid[$last]}" 2>/dev/null
    qemu_end "$last"
    local dlog="$logs/$name.qemu-$dl.log"
    if ((rc == 0)) && guest_log_result "$dlog" migrate; then
        pass "$name-fio-verify-clean"
    else
        out=$(guest_log_lines "$dlog" 'VBLK-RESULT:')
        fail "$name-fio-verify-clean" "QEMU $dl status $rc: ${out:-no result line from the guest} (see $dlog)"
        ok=0
    fi
    guest_log_lines "$dlog" "VBLK-RESULT:" | sed 's/^/  /'
    # The console moved with the VM: the start was on A, the end is here only.
    if guest_log_lines "$logs/$name.qemu-A.log" "VBLK-GUEST: migrate fio start" | grep -q . &&
       ! guest_log_lines "$logs/$name.qemu-A.log" "VBLK-RESULT:" | grep -q .; then
        pass "$name-console-moved"
    else
        fail "$name-console-moved" "see $logs/$name.qemu-A.log"
    fi
    run_wall=$((SECONDS - t0))
    echo "  ($name: guest booted to fio in ${run_boot} s, finished $((SECONDS - tstop)) s after the stop mark, ${run_wall} s in all)"
    for sl in A B; do
        daemon_stop $sl
        if ((rc == 0)); then
            pass "$name-daemon-$sl-exit-0"
        else
            fail "$name-daemon-$sl-exit-0" "exit status $rc (see $logs/$name.daemon-$sl.log)"
        fi
    done
    if [[ $kind == vblkd ]]; then
        # vblkd logs its counters when it exits: the guest's requests went
        # through every queue (counted over both daemons).
        out=$(python3 - "$q" "$logs/$name".daemon-{A,B}.log <<'PY'
import json, sys
q = int(sys.argv[1])
reqs = [0] * q
for log in sys.argv[2:]:
    st = [l.split("stats ", 1)[1] for l in open(log) if " stats {" in l]
    if not st:
        print("no stats in", log)
        sys.exit()
    for i in range(q):
        reqs[i] += json.loads(st[-1])["queues"][i]["requests"]
print(reqs)
PY
)
        if ! grep -qE '(no stats|[[ ,]0[],])' <<<"$out"; then
            pass "$name-every-queue-served"
        else
            fail "$name-every-queue-served" "requests per queue: $(tr '\n' ' ' <<<"$out")"
        fi
    fi
    ((ok))
}

# Stop whatever a failed run left running before the next one.
reset_run() {
    local p
    for p in "${qpid[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    for p in "${dpid[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    qpid=() dpid=()
    rm -f "$work"/*.sock "$work"/*.qmp
}

echo "  ($tag: $kind $DAEMON, queues: $queues, $hops hops, max-bandwidth $bw B/s)"
for q in $queues; do
    run_boot=null run_wall=null rc=0
    t0=$SECONDS
    if run "$q"; then ok=true; else ok=false; fi
    [[ $run_wall == null ]] && run_wall=$((SECONDS - t0))
    record "{\"event\": \"run\", \"pass\": $ok, \"boot_s\": $run_boot, \"wall_s\": $run_wall}"
    reset_run
done
exit 0
