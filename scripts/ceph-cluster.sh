#!/usr/bin/env bash
# A throwaway single-node Ceph cluster for tests and benchmarks: one
# ceph-mon and one memstore ceph-osd on 127.0.0.1, auth none, no mgr, no
# systemd.  Everything it makes (ceph.conf, mon and osd data, run dir,
# admin sockets, logs, pid files) lives under DIR.
#
#   scripts/ceph-cluster.sh start DIR   start it, create pool "rbd" (8 PGs,
#                                       rbd pool init); prints DIR/ceph.conf
#   scripts/ceph-cluster.sh stop DIR    stop both daemons, remove DIR
#   scripts/ceph-cluster.sh kill-osd DIR    SIGKILL the OSD (a crash)
#   scripts/ceph-cluster.sh start-osd DIR   start it again, wait until up
#   scripts/ceph-cluster.sh status DIR      "up" / "down" (exit 0 / 1)
#
#   CEPH_CONF=DIR/ceph.conf rbd create --size 256 rbd/img
#
# The mon listens on a free port picked at start (or $CEPH_MON_PORT); the
# OSD binds the first free ports of its own range, so clusters started by
# parallel tests do not collide.  Needs ceph-mon, ceph-osd, ceph-common
# (scripts/deps.sh remote).  Timeouts: $CEPH_CLUSTER_TIMEOUT seconds
# (default 60) for the OSD to come up; every ceph command is bounded.
#
# The OSD keeps its objects in memory (memstore), written to DIR only when
# it unmounts the store at a clean shutdown: a SIGKILLed OSD would come
# back without the data it had acknowledged.  So kill-osd stops it with
# SIGTERM (osd_fast_shutdown off, so the store is saved; SIGKILL after 20 s
# if it hangs): to clients it is an OSD that drops their connections and
# is gone until start-osd.
set -euo pipefail

usage() {
    echo "usage: scripts/ceph-cluster.sh start|stop|kill-osd|start-osd|status DIR" >&2
    exit 1
}
(($# == 2)) || usage
cmd=$1 dir=$2
tmo=${CEPH_CLUSTER_TIMEOUT:-60}

die() { echo "ceph-cluster: $*" >&2; exit 1; }

conf=$dir/ceph.conf
# c ARGS...: the ceph CLI on this cluster, bounded in time.
c() { timeout 30 ceph -c "$conf" --connect-timeout 15 "$@"; }

free_port() {
    python3 -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pid_of() {	# pid_of NAME (mon.a, osd.0): pid if that daemon runs, else fails
    local p
    p=$(cat "$dir/run/$1.pid" 2>/dev/null) || return 1
    [[ -n $p ]] && kill -0 "$p" 2>/dev/null && echo "$p"
}

osd_up() {	# the running OSD says it is active, and the mon has it up
    local a
    a=$(timeout 10 ceph --admin-daemon "$dir/run/ceph-osd.0.asok" status 2>/dev/null) || return 1
    [[ $a == *'"state": "active"'* ]] || return 1
    c osd dump -f json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
sys.exit(0 if any(o["osd"] == 0 and o["up"] == 1 for o in d["osds"]) else 1)'
}

wait_osd_up() {
    local t0=$SECONDS
    while ! osd_up; do
        pid_of osd.0 >/dev/null ||
            die "ceph-osd exited before it came up: see $dir/log/ceph-osd.0.log"
        ((SECONDS - t0 < tmo)) ||
            die "osd.0 not up after ${tmo} s: see $dir/log/ceph-osd.0.log"
        sleep 0.2
    done
}

start_osd() {
    pid_of osd.0 >/dev/null && die "osd.0 already runs (pid $(pid_of osd.0))"
    timeout 30 ceph-osd -c "$conf" -i 0 >>"$dir/log/ceph-osd.0.out" 2>&1 ||
        die "ceph-osd -i 0 failed: see $dir/log/ceph-osd.0.log"
    wait_osd_up
}

start() {
    for t in ceph-mon ceph-osd ceph monmaptool rbd python3; do
        command -v "$t" >/dev/null ||
            die "$t not found: run scripts/deps.sh remote (ceph-mon ceph-osd ceph-common)"
    done
    [[ -e $conf ]] && die "$dir already holds a cluster: scripts/ceph-cluster.sh stop $dir first"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd) conf=$dir/ceph.conf
    mkdir -p "$dir"/{mon,osd/0,run,log}
    # A start that fails leaves no daemon behind, only DIR with its logs.
    trap '(($? == 0)) || kill_daemons' EXIT
    local port=${CEPH_MON_PORT:-$(free_port)} fsid osd_uuid
    fsid=$(python3 -c "import uuid; print(uuid.uuid4())")
    osd_uuid=$(python3 -c "import uuid; print(uuid.uuid4())")
    cat >"$conf" <<EOF
# Written by scripts/ceph-cluster.sh: a throwaway test cluster.
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
public addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = false
keyring = /dev/null
run dir = $dir/run
admin socket = $dir/run/\$cluster-\$name.\$pid.asok
log file = $dir/log/\$cluster-\$name.log
pid file = $dir/run/\$name.pid
crash dir = $dir/crash
mon data = $dir/mon/\$name
osd data = $dir/osd/\$id
osd objectstore = memstore
memstore device bytes = 2147483648
memstore page set = true
osd fast shutdown = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd max object name len = 256
osd max object namespace len = 64
[mon]
admin socket = $dir/run/\$cluster-\$name.asok
[osd]
admin socket = $dir/run/\$cluster-\$name.asok
[client]
# A client notices a restarted OSD (and resends what it holds) within 1 s
# of its return, not on librados' default 5 s tick.
objecter tick interval = 1
EOF
    timeout 30 monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" \
        "$dir/monmap" >/dev/null || die "monmaptool failed"
    timeout 60 ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" \
        >"$dir/log/ceph-mon.a.out" 2>&1 || die "ceph-mon --mkfs failed: $(tail -2 "$dir/log/ceph-mon.a.out")"
    timeout 30 ceph-mon -c "$conf" -i a >>"$dir/log/ceph-mon.a.out" 2>&1 ||
        die "ceph-mon -i a failed: see $dir/log/ceph-mon.a.log"
    local t0=$SECONDS
    until c mon stat >/dev/null 2>&1; do
        pid_of mon.a >/dev/null || die "ceph-mon exited: see $dir/log/ceph-mon.a.log"
        ((SECONDS - t0 < tmo)) || die "ceph-mon not answering on 127.0.0.1:$port after ${tmo} s"
        sleep 0.2
    done
    [[ $(c osd create "$osd_uuid" 2>/dev/null) == 0 ]] || die "ceph osd create did not give osd.0"
    timeout 60 ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" \
        >"$dir/log/ceph-osd.0.out" 2>&1 || die "ceph-osd --mkfs failed: $(tail -2 "$dir/log/ceph-osd.0.out")"
    start_osd
    c osd pool create rbd 8 8 >/dev/null 2>&1 || die "ceph osd pool create rbd failed"
    timeout "$tmo" rbd -c "$conf" pool init rbd ||
        die "rbd pool init rbd failed or took more than ${tmo} s (PGs not active?)"
    echo "$conf"
}

kill_daemons() {
    local n p pids=()
    for n in osd.0 mon.a; do
        p=$(pid_of "$n") && { kill -TERM "$p" 2>/dev/null; pids+=("$p"); }
    done
    for p in "${pids[@]}"; do
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
}

stop() {
    [[ -d $dir ]] || return 0
    kill_daemons
    # Only what this script made: refuse to remove a directory that is
    # not a cluster of ours.
    if [[ -f $conf ]] && grep -q '^# Written by scripts/ceph-cluster.sh' "$conf"; then
        rm -rf "$dir"
    fi
}

kill_osd() {
    local p
    p=$(pid_of osd.0) || die "osd.0 is not running"
    kill -TERM "$p"
    for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
}

case $cmd in
start) start ;;
stop) stop ;;
kill-osd) kill_osd ;;
start-osd) [[ -f $conf ]] || die "no cluster in $dir"; start_osd ;;
status) if [[ -f $conf ]] && osd_up; then echo up; else echo down; exit 1; fi ;;
*) usage ;;
esac
