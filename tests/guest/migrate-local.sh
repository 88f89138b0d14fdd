#!/usr/bin/env bash
# Description: moving a VM whose disk is local (issue 47).  Two hosts, two
# network namespaces joined by a veth pair (A 10.47.0.1, B 10.47.0.2), each
# with its own directory, vblkd and QEMU (TCG).  The disk (1 GiB, 256 MiB
# of random data written at 512 MiB before boot) is local to A.  While the
# guest runs fio crc32c verify rounds (scenarios/migrate-local.sh: each
# round writes its own 16 MiB slice of the first 512 MiB, and every slice
# is read back whole at the end: a write lost by any mirror shows), B gets
# an empty disk of the same size and a vblkd serving it over NBD with TLS
# (x509) as an incoming export (writable until its rings start), A's vblkd
# mirrors the disk into it (vblkctl mirror start, write-blocking), and
# once the mirror is ready the VM is live-migrated over TCP to a QEMU on
# B; at the switch-over A's vblkd drains the mirror while the rings stop,
# so B holds every completed write before its rings start.  Then QEMU A
# quits, the mirror is completed and vblkd A stops.  The same the other
# way, B -> A, onto a fresh disk on A (the mirror started in background
# mode and switched to write-blocking with vblkctl mirror change).
# Checked, for a raw and a qcow2 disk (one boot each): both migrations
# complete, the source's ring stop waited for the mirror, the guest's
# verify stays clean with no I/O error in its kernel log, the incoming
# export takes writes until the VM runs there and then refuses them (on a
# connection opened before, and on a new one), the pre-written range reads
# in the guest as written, the final image on A holds what the guest read
# last (md5 of both ranges), each vblkd exits 0, and a qcow2 destination
# stays sparse (qemu-img check clean, data only where it was written).
# A fault on the way (issue 47's third case, one format only): on the
# A -> B hop, once the mirror is ready and before the switch-over, vblkd
# A is killed (SIGKILL) and started again with the same arguments; QEMU A
# (chardev reconnect=1) reconnects and hands it its in-flight region, the
# rings restart; the mirror died with the process (not persistent):
# mirror list is empty, and a second mirror start into the same incoming
# export (B's rings never started: it still takes writes) copies the whole
# disk again and gets ready; the hop goes on as above, and the checks
# after it (the guest's verify, the md5s) cover the data.
# Prints PASS:/FAIL: lines for tests/run, each hop's downtime and the
# mirrors' time to ready.
#
#   tests/guest/migrate-local.sh PATH/TO/vblkd    (root: network namespaces)
# Environment:
#   VBLK_MLOC_FORMATS="raw qcow2"   disk formats to run (one boot each)
#   VBLK_MIGRATE_BANDWIDTH          max-bandwidth, bytes/s (default 4 GiB/s)
#   VBLK_MLOC_KILL_SOURCE="raw"     formats whose A -> B hop kills and restarts
#                                   the source's vblkd once the mirror is
#                                   ready ("" for none)
set -uo pipefail
VBLKD=${1:?usage: migrate-local.sh PATH/TO/vblkd}
CTL=$(dirname "$VBLKD")/vblkctl
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
set +e

# Guest RAM not a multiple of 256 KiB: QEMU 7.2 under TCG loses guest
# writes in live migration otherwise (see tests/guest/migrate.sh).
export VBLK_GUEST_MEM=${VBLK_GUEST_MEM:-524296K}
formats=${VBLK_MLOC_FORMATS:-raw qcow2}
kill_source=${VBLK_MLOC_KILL_SOURCE-raw}
bw=${VBLK_MIGRATE_BANDWIDTH:-4294967296}
gb="$VBLK_REPO_ROOT/build/guest"
logs="$VBLK_REPO_ROOT/build/test-logs/migrate-local"
qemu_tmo=400 # seconds any one QEMU may live
PY=/usr/bin/python3 # Debian's, with python3-libnbd
# The disk; the range written before boot (the scenario reads it back at
# these offsets); fio's region is the first 512 MiB (the guest says how
# much of it its rounds used).
SIZE=$((1 << 30)) PRE_OFF_MB=512 PRE_MB=256
NBD_PORT=10809 MIG_PORT=4444
declare -A ip=([A]=10.47.0.1 [B]=10.47.0.2)
declare -A ns=([A]=vblkmA$$ [B]=vblkmB$$)
# How the destination's export and the mirror are started (the operator's
# flow, issue 47).
incoming=",incoming"
mode_blocking=(--mode write-blocking)
mode_background=(--mode background)
mkdir -p "$logs"
work=$(mktemp -d /tmp/vblk-mloc.XXXXXX)

declare -A dpid=() # host (A/B) -> its vblkd
declare -A dopts=() # host -> its vblkd's options (daemon_start's), quoted
declare -A qpid=() # QEMU (A1, B, A2) -> pid (timeout(1) wrapping it)
probe_pid=""
cleanup() {
    local p
    for p in "${qpid[@]}" "${dpid[@]}" $probe_pid; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    ip netns del "${ns[A]}" 2>/dev/null
    ip netns del "${ns[B]}" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }
ctl() { local h=$1; shift; "$CTL" --control "$work/$h/ctl.sock" "$@"; }
jget() { $PY -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }
in_ns() { local h=$1; shift; ip netns exec "${ns[$h]}" "$@"; }

[[ $(id -u) == 0 ]] || { fail migrate-local-deps "needs root (network namespaces)"; exit 1; }
for t in ip ss certtool qemu-img; do
    command -v $t >/dev/null || { fail migrate-local-deps "no $t (iproute2, gnutls-bin, qemu-utils)"; exit 1; }
done
$PY -c 'import nbd' 2>/dev/null || { fail migrate-local-deps "no python3-libnbd (scripts/deps.sh)"; exit 1; }
[[ -x $VBLKD && -x $CTL ]] || { fail migrate-local-deps "$VBLKD or $CTL missing (build first)"; exit 1; }
guest_deps || { fail migrate-local-deps "cannot install the guest packages"; exit 1; }
guest_build_initramfs "$gb" || { fail migrate-local-initramfs; exit 1; }
guest_initrd "$here/scenarios/migrate-local.sh" "$work/m.initrd" "$gb" || { fail migrate-local-initrd; exit 1; }

# ---- two hosts: namespaces, a veth pair, a QEMU launcher in each ------------
net_up() {
    local h
    for h in A B; do ip netns add "${ns[$h]}" || return 1; done
    ip link add veth0 netns "${ns[A]}" type veth peer name veth0 netns "${ns[B]}" || return 1
    for h in A B; do
        ip -n "${ns[$h]}" addr add "${ip[$h]}/24" dev veth0 &&
            ip -n "${ns[$h]}" link set veth0 up && ip -n "${ns[$h]}" link set lo up || return 1
        # guest_qemu_start runs $VBLK_GUEST_QEMU: QEMU inside the host's namespace.
        printf '#!/bin/sh\nexec ip netns exec %s qemu-system-x86_64 "$@"\n' "${ns[$h]}" >"$work/qemu-$h"
        chmod 755 "$work/qemu-$h"
    done
}
net_up || { fail migrate-local-network "cannot set up the namespaces and veth pair"; exit 1; }

# One CA; one server certificate for both hosts' vblkd (both addresses);
# clients (the mirrors) hold the CA only.
. "$here/../nbd/x509.sh"
if ! x509_make "$work/pki" "$work/cli" "vblkd migrate-local" --ip "${ip[A]}" --ip "${ip[B]}"; then
    fail migrate-local-certs "certtool failed"; exit 1
fi

# ---- one host's pieces ---------------------------------------------------------
# new_disk H: an empty disk of the source's size on host H, in place of
# the one it had.
new_disk() {
    local f=$work/$1/disk.$fmt
    rm -f "$f"
    if [[ $fmt == raw ]]; then truncate -s "$SIZE" "$f"; else qemu-img create -q -f qcow2 "$f" "$SIZE"; fi
}

# daemon_start H TAG [vblkd options...]: host H's vblkd in its namespace on
# its disk, vhost-user and control sockets in its directory; log
# $logs/$name.vblkd-TAG.log.
daemon_start() {
    local h=$1 log=$logs/$name.vblkd-$2.log
    shift 2
    dopts[$h]=${*@Q}
    rm -f "$work/$h/vhost.sock" "$work/$h/ctl.sock"
    # ip execs vblkd: $! is vblkd (in_ns would leave a shell in between).
    ip netns exec "${ns[$h]}" "$VBLKD" --socket "$work/$h/vhost.sock" --disk "$work/$h/disk.$fmt" --format "$fmt" \
        --control "$work/$h/ctl.sock" "$@" >"$log" 2>&1 &
    dpid[$h]=$!
    for _ in $(seq 200); do
        [[ -S $work/$h/vhost.sock && -S $work/$h/ctl.sock ]] && grep -q serving "$log" && return 0
        kill -0 "${dpid[$h]}" 2>/dev/null || break
        sleep 0.05
    done
    fail "$name-vblkd-$h-start" "$(tail -3 "$log")"
    return 1
}

# daemon_stop H TAG: SIGTERM; exit status 0 expected.
daemon_stop() {
    local rc=0
    kill -TERM "${dpid[$1]}" 2>/dev/null
    wait "${dpid[$1]}" || rc=$?
    unset "dpid[$1]"
    if ((rc == 0)); then pass "$name-vblkd-$2-exit-0"; else
        fail "$name-vblkd-$2-exit-0" "status $rc (see $logs/$name.vblkd-$2.log)"; fi
    ((rc == 0))
}

# qemu_start TAG [QEMU ARGS...]: QEMU TAG (A1, B, A2: host, then the how
# manieth there) in its host's namespace on that host's vblkd; QMP on
# $work/TAG.qmp, console in $logs/$name.qemu-TAG.log.
qemu_start() {
    local t=$1 h=${1:0:1}
    shift
    VBLK_GUEST_QEMU=$work/qemu-$h guest_qemu_start "$work/$h/vhost.sock" 1 "$work/m.initrd" \
        "$logs/$name.qemu-$t.log" "$qemu_tmo" -qmp "unix:$work/$t.qmp,server=on,wait=off" "$@" || return 1
    qpid[$t]=$VBLK_GUEST_QEMU_PID
    guest_qmp "$work/$t.qmp" wait-socket --timeout 30 && return 0
    fail "$name-qemu-$t-start" "no QMP socket (see $logs/$name.qemu-$t.log)"
    return 1
}

qemu_end() { # qemu_end TAG: wait for it; its status in $rc
    rc=0
    wait "${qpid[$1]}" || rc=$?
    unset "qpid[$1]"
}

# mirror_ready H SECONDS: host H's mirror m ready; its list entry in
# $minfo.  1 at once if it is gone (the job failed).
mirror_ready() {
    local i
    for ((i = 0; i < $2 * 5; i++)); do
        minfo=$(ctl "$1" mirror list | jget 'json.dumps(d["mirrors"][0])' 2>/dev/null)
        [[ -n $minfo ]] || return 1
        [[ $(jget 'd["ready"]' <<<"$minfo" 2>/dev/null) == True ]] && return 0
        sleep 0.2
    done
    return 1
}

# probe_start SRC DST: an NBD client on host SRC of host DST's incoming
# export, connected before the switch-over as the mirror is; it writes a
# block at once (taken: the VM is not there yet), and once $work/go
# exists (the VM runs on DST) writes it again on that connection and on a
# new one: both must be refused.  The block (zeroes, the disk's last)
# holds only the stop mark.  Its line in $work/probe.out; pid in probe_pid.
probe_start() {
    rm -f "$work/go" "$work/probe.out"
    ip netns exec "${ns[$1]}" $PY - "nbds://${ip[$2]}:$NBD_PORT/disk?tls-certificates=$work/cli" \
        "$work/go" >"$work/probe.out" 2>&1 <<'PY' &
import nbd, os, sys, time
def connect():
    h = nbd.NBD()
    h.set_uri_allow_local_file(True)  # tls-certificates=
    h.connect_uri(sys.argv[1])
    return h
def write(h, what):
    try:
        h.pwrite(bytes(4096), h.get_size() - 4096)
        print(what + ":taken", end=" ", flush=True)
    except nbd.Error as e:
        print(f"{what}:refused({e.string})", end=" ", flush=True)
h = connect()
write(h, "before")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
write(h, "after")
write(connect(), "new")
print()
PY
    probe_pid=$!
    for _ in $(seq 100); do grep -q "before:" "$work/probe.out" && return 0; sleep 0.1; done
    return 1
}

# mirror_start SRC DST MODE...: host SRC's mirror m into host DST's
# incoming export over TLS, the CA directory in the target URI (what an
# operator writes); its job id in $job, vblkctl's answer in $out.
mirror_start() {
    local src=$1 dst=$2
    shift 2
    out=$(ctl "$src" mirror start m \
        --target "nbds://${ip[$dst]}:$NBD_PORT/disk?tls-certificates=$work/cli" "$@" 2>&1)
    job=$(jget 'd["job"]' <<<"$out" 2>/dev/null)
}

# kill_source SRC DST QSRC HN MODE...: issue 47's third fault, between
# the mirror's ready and the switch-over: host SRC's vblkd killed
# (SIGKILL) and started again with the same arguments, its log kept as
# .killedK; QEMU QSRC (chardev reconnect=1) reconnects to it, hands it its
# in-flight region and its rings start again (the disk locked for
# writing).  The mirror died with the process (not persistent): mirror
# list is empty.  A second mirror (MODE) into host DST's incoming export,
# which still takes writes (its rings never started), copies the whole
# disk again (its bitmap starts full: what the first one copied counts for
# nothing; checked: copied, zeroed and written-through bytes add up to the
# disk's size at least) and gets ready; its job id in $job, its list entry
# in $minfo.
# Up to 3 rounds of all that, until a kill finds guest requests in flight
# (the new vblkd resubmits them; the kill is aimed at them, see below).
kill_source() {
    local src=$1 dst=$2 qs=$3 hn=$4 log=$logs/$name.vblkd-$3.log t0 trec i k st
    local what1="$hn-source-killed-after-ready-qemu-reconnected-to-the-restarted-vblkd"
    local what2="$hn-source-killed-after-ready-mirror-gone-second-mirror-ready"
    shift 4
    for k in 1 2 3; do
        # Aimed at guest requests in flight: under TCG the guest leaves
        # vblkd idle most of the time, so a QoS limit holds its requests
        # there for a moment (the restarted vblkd has none); the kill once
        # vblkd counts some in flight (its stats: the disk's counter comes
        # first), or after 3 s.
        ctl "$src" set-limits iops-total=50 >/dev/null
        for ((i = 0; i < 40; i++)); do
            [[ $(ctl "$src" stats 2>/dev/null | grep -o '"in_flight": [0-9]*' | head -1) == *[1-9]* ]] && break
            sleep 0.05
        done
        t0=$SECONDS
        kill -9 "${dpid[$src]}"
        wait "${dpid[$src]}" 2>/dev/null
        unset "dpid[$src]"
        mv "$log" "$log.killed$k"
        eval "daemon_start $src $qs ${dopts[$src]}" || return 1
        for ((i = 0; i < 150; i++)); do
            grep -q "in-flight region from the frontend" "$log" && grep -q "locked for writing" "$log" && break
            kill -0 "${qpid[$qs]}" 2>/dev/null || break
            sleep 0.1
        done
        if ((i == 150)) || ! kill -0 "${qpid[$qs]}" 2>/dev/null; then
            st="no in-flight region from QEMU $qs or no ring start in 15 s"
            kill -0 "${qpid[$qs]}" 2>/dev/null || st="QEMU $qs exited"
            fail "$what1" "kill $k: $st (see $log, $log.killed$k, $logs/$name.qemu-$qs.log)"
            return 1
        fi
        trec=$((SECONDS - t0))
        out=$(ctl "$src" mirror list 2>&1)
        st=$(jget 'len(d["mirrors"])' <<<"$out" 2>/dev/null)
        if [[ $st != 0 ]]; then
            fail "$what2" "kill $k: mirror list after the restart: $out"
            return 1
        fi
        mirror_start "$src" "$dst" "$@"
        if [[ -z $job ]]; then
            fail "$what2" "kill $k: mirror start after the restart: $out"
            return 1
        fi
        if ! mirror_ready "$src" 180; then
            fail "$what2" "kill $k: ${minfo:-$(ctl "$src" mirror list 2>&1)}; $(ctl "$src" job list 2>&1 | tr -d '\n')"
            return 1
        fi
        # B got part of the disk from the mirror killed: only a copy of all
        # of it again (data or zeroes, or a guest write written through
        # that covered a granule before the job got there) makes B whole.
        if (($(jget 'd["copied_bytes"] + d["zeroed_bytes"] + d["written_through_bytes"]' <<<"$minfo") < SIZE)); then
            fail "$what2" "kill $k: the new mirror got ready without copying the whole disk again: $minfo"
            return 1
        fi
        # (vblkd logs the resubmission as the ring starts: long done now)
        st=$(grep -ho "resubmitting [0-9]* requests" "$log")
        echo "  ($hn: kill $k of vblkd $src after the mirror's ready: QEMU $qs back on the restarted one in" \
            "$trec s, ${st:-none in flight}; mirror $* again ready in $(jget 'd["ready_seconds"]' <<<"$minfo") s," \
            "$(jget 'd["passes"]' <<<"$minfo") passes, $(jget 'd["copied_bytes"] >> 20' <<<"$minfo") MiB" \
            "copied, $(jget 'd["zeroed_bytes"] >> 20' <<<"$minfo") MiB as zeroes," \
            "$(jget 'd["written_through_bytes"] >> 10' <<<"$minfo") KiB written through)"
        [[ -n $st ]] && break
    done
    pass "$what1 (its rings restarted; kills: $k, ${st:-none found requests in flight})"
    pass "$what2 (mirror list empty after each restart; each new mirror copied the whole disk)"
}

# hop SRC DST QSRC QDST HOW: the VM on QEMU QSRC (host SRC) moves to a
# new QEMU QDST on host DST, its disk mirrored first into a fresh one
# there.  HOW: blocking (the mirror started write-blocking) or switch
# (started in background, changed to write-blocking once ready).
hop() {
    local src=$1 dst=$2 qs=$3 qd=$4 how=$5 hn="$name-$1-to-$2" st t0=$SECONDS
    new_disk "$dst"
    daemon_start "$dst" "$qd" --nbd "${ip[$dst]}:$NBD_PORT,name=disk,tls=x509:$work/pki$incoming" ||
        return 1
    probe_start "$src" "$dst" || { fail "$hn-nbd-probe" "$(cat "$work/probe.out")"; return 1; }
    local mode=("${mode_blocking[@]}")
    [[ $how == switch ]] && mode=("${mode_background[@]}")
    mirror_start "$src" "$dst" "${mode[@]}"
    if [[ -z $job ]]; then
        fail "$hn-mirror-start" "$out"
        return 1
    fi
    if mirror_ready "$src" 180; then
        pass "$hn-mirror-ready"
        echo "  ($hn: mirror ${mode[*]} ready in $(jget 'd["ready_seconds"]' <<<"$minfo") s," \
            "$(jget 'd["passes"]' <<<"$minfo") passes, $(jget 'd["copied_bytes"] >> 20' <<<"$minfo") MiB" \
            "copied, $(jget 'd["zeroed_bytes"] >> 20' <<<"$minfo") MiB as zeroes)"
    else
        fail "$hn-mirror-ready" "${minfo:-$(ctl "$src" mirror list 2>&1)}; $(ctl "$src" job list 2>&1 | tr -d '\n')"
        return 1
    fi
    # The fault, on the first hop of the formats chosen (QEMU A1 was
    # started with reconnect=1 for it).
    if [[ $qs == A1 && " $kill_source " == *" $fmt "* ]]; then
        kill_source "$src" "$dst" "$qs" "$hn" "${mode[@]}" || return 1
    fi
    if [[ $how == switch ]]; then
        if out=$(ctl "$src" mirror change m "${mode_blocking[@]}" 2>&1) &&
            [[ $(ctl "$src" mirror list | jget 'd["mirrors"][0]["mode"]') == write-blocking ]]; then
            pass "$hn-mirror-changed-to-write-blocking"
        else
            fail "$hn-mirror-changed-to-write-blocking" "$out"
            return 1
        fi
    fi

    qemu_start "$qd" -incoming "tcp:${ip[$dst]}:$MIG_PORT" || return 1
    for _ in $(seq 100); do
        in_ns "$dst" ss -Hltn "sport = :$MIG_PORT" | grep -q . && break
        sleep 0.1
    done
    out=$(guest_qmp "$work/$qs.qmp" migrate "tcp:${ip[$dst]}:$MIG_PORT" \
        --max-bandwidth "$bw" --timeout 180 2>&1)
    rc=$?
    if ((rc == 0)); then
        pass "$hn-completed"
    else
        st=$(guest_log_lines "$logs/$name.qemu-$qs.log" 'VBLK-RESULT:')
        kill -0 "${qpid[$qs]}" 2>/dev/null || out="QEMU $qs exited (${st:-no result line}): $out"
        fail "$hn-completed" "$out"
        return 1
    fi
    $PY - "$out" "$hn" "$((SECONDS - t0))" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"  ({sys.argv[2]}: downtime {r['downtime']} ms, migration {r['total-time']} ms, "
      f"{(r['ram-transferred'] or 0) >> 20} MiB of RAM; {sys.argv[3]} s from the empty disk to completed)")
PY
    # The hand-over: the source's ring stop waited for the target to have
    # every completed write (vblkd says so in one line).
    st=$(grep -o "the guest's rings stopped: .* has every write they completed, flushed ([^)]*)" \
        "$logs/$name.vblkd-$qs.log" | tail -1)
    if [[ -n $st ]]; then pass "$hn-source-ring-stop-waited-for-the-mirror ${st##*flushed }"; else
        fail "$hn-source-ring-stop-waited-for-the-mirror" "no such line in $logs/$name.vblkd-$qs.log"
    fi
    st=$(guest_qmp "$work/$qd.qmp" wait-status running --timeout 30 2>&1)
    if [[ $st == *'"running"'* ]]; then pass "$hn-$qd-running"; else
        fail "$hn-$qd-running" "query-status: $st"
        return 1
    fi
    # The destination owns the disk now: its export takes no more writes,
    # on a connection of before the switch-over or a new one.
    touch "$work/go"
    wait "$probe_pid"
    probe_pid=""
    out=$(cat "$work/probe.out")
    if [[ $out == "before:taken after:refused"*" new:refused"* ]]; then
        pass "$hn-incoming-export-writable-until-the-vm-runs-there ($out)"
    else
        fail "$hn-incoming-export-writable-until-the-vm-runs-there" "$out"
    fi

    guest_qmp "$work/$qs.qmp" quit >/dev/null
    qemu_end "$qs"
    ((rc == 0)) || echo "  (QEMU $qs exited with status $rc after quit)"
    for _ in $(seq 50); do ctl "$src" job complete "$job" >/dev/null 2>&1 && break; sleep 0.1; done
    for _ in $(seq 100); do
        st=$(ctl "$src" job list | jget '[j["state"] + ":" + j.get("result", "") for j in d["jobs"] if j["id"] == "'"$job"'"][0]' 2>/dev/null)
        [[ $st == concluded* ]] && break
        sleep 0.1
    done
    if [[ $st == concluded:ok ]]; then
        pass "$hn-mirror-job-completed"
    else
        fail "$hn-mirror-job-completed" "job $job: $st; $(ctl "$src" job list 2>&1 | tr -d '\n')"
    fi
    daemon_stop "$src" "$qs"

    # The guest gets on with its I/O on the destination: a round ends there
    # (or its result: a failed round ends its job).
    guest_wait_log "$logs/$name.qemu-$qd.log" "migrate round [0-9]+ |VBLK-RESULT:" 120 "${qpid[$qd]}" || {
        fail "$hn-guest-progress" "no fio round finished on QEMU $qd in 120 s"
        return 1
    }
}

# sparse_check F WHAT FIO_MB: a qcow2 destination: qemu-img check clean;
# data only where the guest or the host wrote (fio's first FIO_MB MiB, the
# pre-written range, the disk's last MiB: the stop mark and the probe's
# block), none elsewhere; the file no larger than those and 64 MiB of
# metadata: far below the virtual size.
sparse_check() {
    local f=$1 what=$2 fio_mb=$3 chk data stray act room
    chk=$(qemu-img check --output=json "$f" 2>&1 |
        jget '"%s corruptions, %s leaks, %s check errors" % (d.get("corruptions", 0), d.get("leaks", 0), d.get("check-errors", 0))')
    read -r data stray < <(qemu-img map --output=json "$f" | $PY -c '
import json, sys
fio, pre, pre_len, size = (int(a) for a in sys.argv[1:])
ok = [(0, fio), (pre, pre + pre_len), (size - (1 << 20), size)]
data = stray = 0
for e in json.load(sys.stdin):
    if not e["data"]:
        continue
    s, n = e["start"], e["length"]
    data += n
    stray += n - sum(max(0, min(s + n, b) - max(s, a)) for a, b in ok)
print(data, stray)' $((fio_mb << 20)) $((PRE_OFF_MB << 20)) $((PRE_MB << 20)) "$SIZE")
    act=$(qemu-img info --output=json "$f" | jget 'd["actual-size"]')
    room=$(((fio_mb + PRE_MB + 1 + 64) << 20))
    local info="$((data >> 20)) MiB of data, $((act >> 20)) MiB on disk, of $((SIZE >> 20)) MiB"
    if [[ $chk == "0 corruptions, 0 leaks, 0 check errors" ]] && ((stray == 0 && act <= room)); then
        pass "$name-$what-qcow2-sparse-and-clean ($info)"
    else
        fail "$name-$what-qcow2-sparse-and-clean" "check: $chk; $info; $stray bytes of data outside what was written; at most $((room >> 20)) MiB on disk expected"
    fi
}

# stop_mark: tell the guest to finish: the stop mark in the disk's last
# 4 KiB, through one more export of host A's vblkd (its incoming one takes
# no writes now).
stop_mark() {
    ctl A nbd add "unix:$work/A/stop.sock,name=stop" >/dev/null &&
        $PY - "nbd+unix:///stop?socket=$work/A/stop.sock" <<'PY'
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"VBLK-MIGRATE-STOP".ljust(4096, b"\0"), h.get_size() - 4096)
h.flush()
h.shutdown()
PY
}

# range_md5 F OFF_MB LEN_MB: md5 of that range of raw file F.
range_md5() {
    dd if="$1" bs=1M skip="$2" count="$3" 2>/dev/null | md5sum | cut -d' ' -f1
}

# run FMT: one boot, A -> B -> A; 0 iff all went well.
run() {
    fmt=$1 name=migrate-local-$1
    local t0=$SECONDS pre_md5 g final
    rm -f "$logs/$name".*
    rm -rf "$work/A" "$work/B"
    mkdir -p "$work/A" "$work/B"
    # Host A's disk: random data in [512 MiB, 768 MiB), the rest unwritten.
    head -c $((PRE_MB << 20)) /dev/urandom >"$work/pre"
    pre_md5=$(md5sum <"$work/pre" | cut -d' ' -f1)
    truncate -s "$SIZE" "$work/seed"
    dd if="$work/pre" of="$work/seed" bs=1M seek="$PRE_OFF_MB" conv=notrunc status=none
    if [[ $fmt == raw ]]; then mv "$work/seed" "$work/A/disk.raw"; else
        qemu-img convert -q -f raw -O qcow2 "$work/seed" "$work/A/disk.qcow2"; fi
    rm -f "$work/seed" "$work/pre"

    daemon_start A A1 || return 1
    # QEMU A1 reconnects to a restarted vblkd A (kill_source).
    unset VBLK_GUEST_CHARDEV_OPTS
    if [[ " $kill_source " == *" $fmt "* ]]; then export VBLK_GUEST_CHARDEV_OPTS=",reconnect=1"; fi
    qemu_start A1 || return 1
    unset VBLK_GUEST_CHARDEV_OPTS # not on B nor A2
    guest_wait_log "$logs/$name.qemu-A1.log" "migrate fio start" 120 "${qpid[A1]}"
    case $? in
    0) ;;
    2) fail "$name-guest-boot" "QEMU A1 exited (see $logs/$name.qemu-A1.log)"; return 1 ;;
    *) fail "$name-guest-boot" "no fio start in 120 s (see $logs/$name.qemu-A1.log)"; return 1 ;;
    esac
    echo "  ($name: guest booted to fio in $((SECONDS - t0)) s)"
    sleep 1 # fio's first requests in flight

    hop A B A1 B blocking || return 1
    hop B A B A2 switch || return 1

    stop_mark || { fail "$name-stop-mark" "cannot write it through host A's vblkd"; return 1; }
    local tstop=$SECONDS
    for _ in $(seq 1800); do kill -0 "${qpid[A2]}" 2>/dev/null || break; sleep 0.1; done
    kill "${qpid[A2]}" 2>/dev/null
    qemu_end A2
    local glog=$logs/$name.qemu-A2.log
    if ((rc == 0)) && guest_log_result "$glog" migrate-local; then
        pass "$name-fio-verify-clean-no-io-errors"
    else
        fail "$name-fio-verify-clean-no-io-errors" \
            "QEMU A2 status $rc: $(guest_log_lines "$glog" 'VBLK-RESULT:') (see $glog)"
    fi
    guest_log_lines "$glog" "VBLK-RESULT:" | sed 's/^/  /'
    guest_log_lines "$glog" "VBLK-GUEST: dmesg:" | sed 's/^/  /'
    echo "  ($name: the guest finished $((SECONDS - tstop)) s after the stop mark)"
    daemon_stop A A2

    # What the guest read last is what host A's image holds.
    g=$(guest_log_lines "$glog" "VBLK-MD5:" | tail -1)
    local gpre gfio gmb
    gpre=$(sed -n 's/.*pre=\([0-9a-f]*\).*/\1/p' <<<"$g")
    gfio=$(sed -n 's/.*fio=\([0-9a-f]*\).*/\1/p' <<<"$g")
    gmb=$(sed -n 's/.*fio_mb=\([0-9]*\).*/\1/p' <<<"$g")
    if [[ -n $gpre && $gpre == "$pre_md5" ]]; then
        pass "$name-pre-written-${PRE_MB}M-reads-as-written-after-two-mirrors"
    else
        fail "$name-pre-written-${PRE_MB}M-reads-as-written-after-two-mirrors" "guest md5 '${gpre}', written $pre_md5"
    fi
    final=$work/A/disk.raw
    if [[ $fmt == qcow2 ]]; then
        final=$work/final.raw
        qemu-img convert -q -f qcow2 -O raw "$work/A/disk.qcow2" "$final"
    fi
    local hpre hfio
    hpre=$(range_md5 "$final" "$PRE_OFF_MB" "$PRE_MB")
    hfio=$(range_md5 "$final" 0 "${gmb:-0}")
    if [[ -n $gfio && $hpre == "$gpre" && $hfio == "$gfio" ]]; then
        pass "$name-final-image-on-A-equals-the-guests-last-view"
    else
        fail "$name-final-image-on-A-equals-the-guests-last-view" \
            "pre: image $hpre guest ${gpre:-none}; fio: image $hfio guest ${gfio:-none}"
    fi
    [[ $fmt == qcow2 ]] && rm -f "$final"

    if [[ $fmt == qcow2 ]]; then
        sparse_check "$work/B/disk.qcow2" B "${gmb:-0}"
        sparse_check "$work/A/disk.qcow2" A-final "${gmb:-0}"
    fi
    echo "  ($name: $((SECONDS - t0)) s in all)"
}

# Stop whatever a failed run left running before the next one.
reset_run() {
    local p
    for p in "${qpid[@]}" "${dpid[@]}" $probe_pid; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    qpid=() dpid=() probe_pid=""
}

for f in $formats; do
    run "$f"
    reset_run
done
exit 0
