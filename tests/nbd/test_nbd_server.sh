#!/usr/bin/env bash
# vblkd's NBD server (issue 45), judged by the ecosystem's own clients:
# libnbd's nbdinfo and nbdcopy, QEMU's qemu-img and qemu-io.  The exports
# and their flags as nbdinfo sees them; copies out equal to qemu-img's
# own reading of the same image (a qcow2 chain included); writes through
# the export equal to the same writes on a raw oracle; a read-only export
# refused writes; the guest's vhost-user front and NBD clients on one
# disk at once; dirty bitmaps as qemu:dirty-bitmap contexts, exactly what
# changed; QoS and accounting; clean start-up errors; SIGTERM with clients
# connected; and malformed clients, each answered as doc/proto.md says, a good
# client served after every one (nbd_clients.py).
# Usage: test_nbd_server.sh BUILD_DIR.  Prints PASS:/FAIL:/SKIP: lines.
set -uo pipefail
BUILD=${1:?usage: test_nbd_server.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench VBLKCTL=$BUILD/vblkctl
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/vblk-nbds.XXXXXX)
dpid="" hpid=""
cleanup() {
    for p in $dpid $hpid; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    [[ -n ${KEEP:-} ]] || rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name" "$*"; fi; }

for t in nbdinfo nbdcopy qemu-img qemu-io certtool psktool; do
    command -v $t >/dev/null || {
        echo "SKIP: nbd-server (no $t: scripts/deps.sh installs libnbd-bin, qemu-utils, gnutls-bin)"
        exit 0; }
done

# A free TCP port on 127.0.0.1.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# start LOG ARGS...: vblkd, ready once every unix socket it names exists.
start() {
    local log=$1 a s; shift
    "$VBLKD" "$@" >"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 300); do
        s=1
        for a in "$@"; do
            [[ $a == unix:* ]] || continue
            a=${a#unix:}; a=${a%%,*}
            [[ -S $a ]] || s=0
        done
        ((s)) && grep -q "serving" "$log" && return 0
        kill -0 "$dpid" 2>/dev/null || return 1
        sleep 0.02
    done
    return 1
}
# hold SOCK SECONDS: a client connected (greeting read) in the background,
# $hpid, once this returns; it exits when the server hangs up, or after
# SECONDS.
hold() {
    rm -f "$tmp/held"
    python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(18)
open(sys.argv[3], "w").close(); s.settimeout(float(sys.argv[2]))
try:
    s.recv(1)
except OSError:
    pass' "$1" "$2" "$tmp/held" &
    hpid=$!
    for _ in $(seq 500); do [[ -e $tmp/held ]] && return 0; sleep 0.01; done
    return 1
}
stop() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid"; local rc=$?; dpid=""; return $rc; }
uri() { echo "nbd+unix:///${2:-}?socket=$1"; }

# ---- A raw disk, three exports, and the guest's socket ----------------------
head -c $((64 << 20)) /dev/urandom >"$tmp/disk.raw"
cp "$tmp/disk.raw" "$tmp/oracle.raw"
A=$tmp/a.sock RO=$tmp/ro.sock
if ! start "$tmp/raw.log" --disk "$tmp/disk.raw" --socket "$tmp/vu.sock" \
        --nbd "unix:$A,max-conn=4" --nbd "127.0.0.1:$port,name=tcp" \
        --nbd "unix:$RO,name=ro,read-only"; then
    fail nbd-server-starts "$(tail -3 "$tmp/raw.log")"
    exit 0
fi
pass nbd-server-starts

out=$(nbdinfo --list "$(uri "$A")" 2>&1)
grep -q 'export=""' <<<"$out" && grep -q "export-size: 67108864" <<<"$out" &&
    pass nbdinfo-list-shows-the-export || fail nbdinfo-list-shows-the-export "$out"
out=$(nbdinfo --json "nbd://127.0.0.1:$port/tcp" 2>&1)
python3 - "$out" <<'EOF' && pass nbdinfo-tcp-flags-and-block-sizes || fail nbdinfo-tcp-flags-and-block-sizes "$out"
import json, sys
e = json.loads(sys.argv[1])["exports"][0]
want = {"export-name": "tcp", "is_read_only": False, "can_flush": True, "can_fua": True,
        "can_trim": True, "can_zero": True, "can_multi_conn": True, "can_cache": True,
        "block_size_minimum": 512, "block_size_maximum": 33554432}
bad = {k: e.get(k) for k, v in want.items() if e.get(k) != v}
if bad:
    print(bad)
    sys.exit(1)
EOF
check nbdinfo-read-only-export-is-read-only nbdinfo --is readonly "$(uri "$RO" ro)"
if nbdinfo --can trim "$(uri "$RO" ro)" 2>/dev/null; then
    fail nbdinfo-read-only-export-cannot-trim
else pass nbdinfo-read-only-export-cannot-trim; fi

# Copies out, both transports, against the file itself.
nbdcopy "$(uri "$A")" "$tmp/out1.raw" && cmp -s "$tmp/out1.raw" "$tmp/oracle.raw" &&
    pass nbdcopy-unix-equals-the-disk || fail nbdcopy-unix-equals-the-disk
nbdcopy --connections=4 "nbd://127.0.0.1:$port/tcp" "$tmp/out2.raw" &&
    cmp -s "$tmp/out2.raw" "$tmp/oracle.raw" &&
    pass nbdcopy-tcp-4-connections-equals-the-disk || fail nbdcopy-tcp-4-connections-equals-the-disk
check qemu-img-compare-over-nbd qemu-img compare -q -f raw -F raw "$tmp/oracle.raw" "$(uri "$A")"

# Writes through the export, the same writes on the oracle.
cmds=(-c 'write -P 0x5a 4096 65536' -c 'write -P 0xa5 -f 1M 128k' -c 'write -z 3M 1M'
      -c 'discard 8M 2M' -c 'write -P 0x11 63M 1M' -c flush)
qemu-io -f raw "${cmds[@]}" "$(uri "$A")" >"$tmp/qio.out" 2>&1 &&
    qemu-io -f raw "${cmds[@]}" "$tmp/oracle.raw" >/dev/null 2>&1 &&
    qemu-img compare -q -f raw -F raw "$tmp/oracle.raw" "$(uri "$A")" &&
    pass qemu-io-writes-over-nbd-equal-the-oracle ||
    fail qemu-io-writes-over-nbd-equal-the-oracle "$(tail -2 "$tmp/qio.out")"
# nbdcopy writing: the whole disk from a new source, then compared.
head -c $((64 << 20)) /dev/urandom >"$tmp/src2.raw"
nbdcopy "$tmp/src2.raw" "$(uri "$A")" && cp "$tmp/src2.raw" "$tmp/oracle.raw" &&
    qemu-img compare -q -f raw -F raw "$tmp/oracle.raw" "$(uri "$A")" &&
    cmp -s "$tmp/disk.raw" "$tmp/oracle.raw" &&
    pass nbdcopy-writes-the-disk || fail nbdcopy-writes-the-disk

out=$(qemu-io -f raw -c 'write 0 4096' "$(uri "$RO" ro)" 2>&1)
grep -qiE "not permitted|read-only|Permission" <<<"$out" && cmp -s "$tmp/disk.raw" "$tmp/oracle.raw" &&
    pass read-only-export-refuses-writes || fail read-only-export-refuses-writes "$out"

# Both fronts of one disk at once: a guest's driver (vblk-bench on the
# vhost-user socket) and an NBD copy.
"$BENCH" --socket "$tmp/vu.sock" --rw randread --iodepth 8 --runtime 2 --ramp 0 \
    >"$tmp/bench.out" 2>&1 &
hpid=$!
nbdcopy "$(uri "$A")" "$tmp/out3.raw"; rc=$?
wait "$hpid"; brc=$?; hpid=""
((rc == 0 && brc == 0)) && cmp -s "$tmp/out3.raw" "$tmp/oracle.raw" &&
    pass guest-and-nbd-client-on-one-disk ||
    fail guest-and-nbd-client-on-one-disk "nbdcopy $rc, vblk-bench $brc: $(tail -1 "$tmp/bench.out")"

# The disk is locked for writing while a client holds it, and not after.
# (The guest's ring is stopped: only the NBD client holds it.)
hold "$A" 2
if qemu-io -f raw -c 'write -P 0x3c 60M 512' "$tmp/disk.raw" >/dev/null 2>&1; then
    fail image-locked-while-an-nbd-client-is-connected
else pass image-locked-while-an-nbd-client-is-connected; fi
wait "$hpid"; hpid=""
sleep 0.3
if qemu-io -f raw -c 'write -P 0x3c 60M 512' "$tmp/disk.raw" >/dev/null 2>&1; then
    pass image-unlocked-when-the-clients-are-gone
else fail image-unlocked-when-the-clients-are-gone; fi

# ---- Malformed clients ------------------------------------------------------
timeout 240 python3 "$here/nbd_clients.py" "$A" "$tmp/disk.raw" "$dpid" ||
    fail nbd-clients-script "exited $?"
kill -0 "$dpid" 2>/dev/null && pass server-alive-after-malformed-clients ||
    fail server-alive-after-malformed-clients "$(tail -3 "$tmp/raw.log")"

# SIGTERM with a client in the middle of a session: exits 0, promptly.
hold "$A" 20 || fail sigterm-client-connects
t0=$(date +%s%N)
stop; rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
kill "$hpid" 2>/dev/null; wait "$hpid" 2>/dev/null; hpid=""
((rc == 0 && ms < 5000)) && pass sigterm-with-a-client-exits-0 ||
    fail sigterm-with-a-client-exits-0 "rc $rc after $ms ms"
[[ ! -e $A && ! -e $RO ]] && pass unix-sockets-removed-at-exit || fail unix-sockets-removed-at-exit

# ---- A qcow2 chain ----------------------------------------------------------
qemu-img create -q -f qcow2 "$tmp/base.qcow2" 32M
qemu-io -f qcow2 -c 'write -P 0x61 0 4M' -c 'write -P 0x62 16M 2M' "$tmp/base.qcow2" >/dev/null
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$tmp/top.qcow2"
qemu-io -f qcow2 -c 'write -P 0x71 1M 1M' -c 'write -z 17M 64k' -c 'write -P 0x72 30M 512k' \
    "$tmp/top.qcow2" >/dev/null
qemu-img convert -O raw "$tmp/top.qcow2" "$tmp/chain-oracle.raw"
Q=$tmp/q.sock
if start "$tmp/q.log" --disk "$tmp/top.qcow2" --nbd "unix:$Q"; then
    nbdcopy "$(uri "$Q")" "$tmp/chain-out.raw" && cmp -s "$tmp/chain-out.raw" "$tmp/chain-oracle.raw" &&
        pass nbdcopy-of-a-qcow2-chain-equals-qemu-img-convert ||
        fail nbdcopy-of-a-qcow2-chain-equals-qemu-img-convert
    cmds=(-c 'write -P 0x33 5M 192k' -c 'write -P 0x34 17M 4k' -c 'write -z 20M 1M'
          -c 'discard 16M 64k' -c flush)
    qemu-io -f raw "${cmds[@]}" "$(uri "$Q")" >/dev/null 2>&1 &&
        qemu-io -f raw "${cmds[@]}" "$tmp/chain-oracle.raw" >/dev/null 2>&1 &&
        qemu-img compare -q -f raw -F raw "$tmp/chain-oracle.raw" "$(uri "$Q")" &&
        pass qcow2-writes-over-nbd-equal-the-oracle || fail qcow2-writes-over-nbd-equal-the-oracle
    # A read of a range no layer holds: one hole chunk, no data on the wire
    # (structured replies); a read of data: a data chunk.
    python3 - "$Q" <<'EOF2' && pass qcow2-read-of-a-hole-is-a-hole-chunk ||
import socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
def rx(n):
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b)); assert d; b += d
    return b
rx(18); s.sendall(struct.pack(">I", 3))
def opt(o, d=b""):
    s.sendall(struct.pack(">QII", 0x49484156454F5054, o, len(d)) + d)
    while True:
        _, _, t, n = struct.unpack(">QIII", rx(20)); rx(n)
        if t == 1: return
opt(8); opt(7, struct.pack(">IH", 0, 0))
def read(off, n):
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, 7, off, n))
    _, fl, t, c, ln = struct.unpack(">IHHQI", rx(20)); p = rx(ln)
    return t, p
t1, p1 = read(24 << 20, 1 << 20)
t2, p2 = read(0, 4096)
ok = t1 == 2 and struct.unpack(">QI", p1) == (24 << 20, 1 << 20) and t2 == 1 and len(p2) == 8 + 4096
sys.exit(0 if ok else 1)
EOF2
        fail qcow2-read-of-a-hole-is-a-hole-chunk
    stop || fail qcow2-sigterm-exits-0
    check qcow2-check-clean-after-nbd-writes qemu-img check -q "$tmp/top.qcow2"
    check qcow2-after-nbd-writes-equals-the-oracle \
        qemu-img compare -q -F raw "$tmp/top.qcow2" "$tmp/chain-oracle.raw"
else
    fail qcow2-nbd-starts "$(tail -2 "$tmp/q.log")"
fi

# ---- vblkctl nbd add|remove|list ---------------------------------------------
C=$tmp/ctl.sock
if start "$tmp/ctl.log" --disk "$tmp/disk.raw" --control "$C" --nbd "unix:$tmp/c0.sock"; then
    ctl() { "$VBLKCTL" --control "$C" "$@"; }
    out=$(ctl nbd add "unix:$tmp/c1.sock,name=late,read-only,max-conn=2" 2>&1) &&
        nbdinfo --is readonly "$(uri "$tmp/c1.sock" late)" &&
        pass vblkctl-nbd-add-serves-at-once || fail vblkctl-nbd-add-serves-at-once "$out"
    out=$(ctl nbd list 2>&1)
    python3 - "$out" <<'EOF2' && pass vblkctl-nbd-list || fail vblkctl-nbd-list "$out"
import json, sys
r = json.loads(sys.argv[1])
ex = {e["name"]: e for e in r["exports"]}
assert set(ex) == {"", "late"}, ex
assert ex["late"]["read_only"] and ex["late"]["max_conn"] == 2 and ex["late"]["accepted"] >= 1
assert not ex[""]["read_only"] and r["stats"]["connections"] >= 1
EOF2
    # Coalescing (conn.c conn_moderate): a client with 32 reads in flight
    # (nbdcopy, 4 KiB requests over the 64 MiB disk) has its requests
    # gathered after a short wait, several per pass; a QD1 client's next
    # request waits for our reply, so the wait is only tried now and then
    # (one pass in 256) and turned off again.
    /usr/bin/python3 -c 'import nbd' 2>/dev/null || echo "SKIP: nbd-coalescing (no python3-libnbd: scripts/deps.sh format)"
    coal() { ctl nbd list | python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["coalesced_waits"], s["coalesced_requests"], s["requests"])'; }
    read -r w0 r0 q0 < <(coal)
    nbdcopy --connections=1 --requests=32 --request-size=4096 --no-extents "$(uri "$tmp/c0.sock")" null:
    read -r w1 r1 q1 < <(coal)
    /usr/bin/python3 -c 'import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for i in range(2000):
    h.pread(4096, i * 4096)' "$(uri "$tmp/c0.sock")"
    read -r w2 r2 q2 < <(coal)
    out="QD32: $((w1 - w0)) waits for $((q1 - q0)) requests, $(((r1 - r0) / (w1 - w0 > 0 ? w1 - w0 : 1))) taken after each; QD1: $((w2 - w1)) waits for $((q2 - q1)) requests"
    if ! /usr/bin/python3 -c 'import nbd' 2>/dev/null; then
        :
    elif ((w1 > w0 && r1 - r0 >= 3 * (w1 - w0) && q2 - q1 >= 2000 && w2 - w1 <= (q2 - q1) / 256 + 4)); then
        pass "nbd-coalescing: $out"
    else
        fail nbd-coalescing "$out"
    fi
    hold "$tmp/c1.sock" 20
    ctl nbd remove late >/dev/null && ! [[ -e $tmp/c1.sock ]] &&
        ! nbdinfo "$(uri "$tmp/c1.sock" late)" >/dev/null 2>&1 &&
        pass vblkctl-nbd-remove-stops-the-export || fail vblkctl-nbd-remove-stops-the-export
    for _ in $(seq 300); do kill -0 "$hpid" 2>/dev/null || break; sleep 0.01; done
    kill -0 "$hpid" 2>/dev/null && fail vblkctl-nbd-remove-disconnects-its-clients ||
        pass vblkctl-nbd-remove-disconnects-its-clients
    kill "$hpid" 2>/dev/null; wait "$hpid" 2>/dev/null; hpid=""
    out=$(ctl metrics 2>&1)
    grep -qE '^vblkd_nbd_connections_total [1-9]' <<<"$out" &&
        grep -qE '^vblkd_nbd_requests_total [1-9]' <<<"$out" &&
        { ! command -v promtool >/dev/null || promtool check metrics <<<"$out" >/dev/null 2>&1; } &&
        pass nbd-metrics || fail nbd-metrics "$(grep vblkd_nbd <<<"$out" | tr '\n' ' ')"
    out=$(ctl nbd remove nosuch 2>&1); rc=$?
    ((rc == 1)) && grep -q "no NBD export named 'nosuch'" <<<"$out" &&
        pass vblkctl-nbd-remove-unknown-one-line || fail vblkctl-nbd-remove-unknown-one-line "$out"
    out=$(ctl nbd add "unix:$tmp/c0.sock,name=x" 2>&1); rc=$?
    ((rc == 1)) && grep -q "in use" <<<"$out" && nbdinfo "$(uri "$tmp/c0.sock")" >/dev/null &&
        pass vblkctl-nbd-add-busy-socket-refused || fail vblkctl-nbd-add-busy-socket-refused "$out"
    out=$("$VBLKCTL" --control "$C" upgrade 2>&1); rc=$?
    ((rc == 1)) && grep -q "NBD exports" <<<"$out" && nbdinfo "$(uri "$tmp/c0.sock")" >/dev/null &&
        pass upgrade-with-nbd-exports-refused-one-line ||
        fail upgrade-with-nbd-exports-refused-one-line "$out"
    stop || fail vblkctl-nbd-sigterm-exits-0
else
    fail vblkctl-nbd-starts "$(tail -2 "$tmp/ctl.log")"
fi

# ---- Block status: nbdinfo --map against qemu-nbd's (QEMU's block layer) -------
# A three-layer chain: a raw base with holes, a qcow2 over it with data and
# zero clusters, a qcow2 on top; both contexts, QEMU's answer the oracle.
qemu-img create -q -f raw "$tmp/m-base.raw" 32M
qemu-io -f raw -c 'write -P 0x61 0 4M' -c 'write -P 0x62 16M 2M' "$tmp/m-base.raw" >/dev/null
qemu-img create -q -f qcow2 -b m-base.raw -F raw "$tmp/m-mid.qcow2"
qemu-io -f qcow2 -c 'write -P 0x71 1M 1M' -c 'write -z 17M 64k' -c 'write -P 0x72 30M 512k' \
    "$tmp/m-mid.qcow2" >/dev/null
qemu-img create -q -f qcow2 -b m-mid.qcow2 -F qcow2 "$tmp/m-top.qcow2"
qemu-io -f qcow2 -c 'write -P 0x11 8M 128k' -c 'write -z 0 64k' "$tmp/m-top.qcow2" >/dev/null
maps() {	# maps SOCK PREFIX: both contexts' maps into $tmp/PREFIX.{alloc,depth}
    nbdinfo --map "$(uri "$1")" >"$tmp/$2.alloc" 2>&1
    nbdinfo --map=qemu:allocation-depth "$(uri "$1")" >"$tmp/$2.depth" 2>&1
}
for img in m-top.qcow2 m-base.raw; do
    fmt=qcow2; [[ $img == *.raw ]] && fmt=raw
    qemu-nbd -A -f $fmt -r --persistent --socket="$tmp/qn.sock" "$tmp/$img" 2>/dev/null &
    hpid=$!
    for _ in $(seq 300); do [[ -S $tmp/qn.sock ]] && break; sleep 0.01; done
    maps "$tmp/qn.sock" qemu
    kill "$hpid"; wait "$hpid" 2>/dev/null; hpid=""; rm -f "$tmp/qn.sock"
    if start "$tmp/m.log" --disk "$tmp/$img" --nbd "unix:$tmp/m.sock"; then
        maps "$tmp/m.sock" vblkd
        stop
        for ctx in alloc depth; do
            name=block-status-${img%%.*}-$fmt-$ctx-equals-qemu-nbd
            [[ $ctx == depth ]] && name=block-status-${img%%.*}-$fmt-allocation-depth-equals-qemu-nbd
            [[ $ctx == alloc ]] && name=block-status-${img%%.*}-$fmt-base-allocation-equals-qemu-nbd
            if [[ -s $tmp/vblkd.$ctx ]] && diff -q "$tmp/vblkd.$ctx" "$tmp/qemu.$ctx" >/dev/null; then
                pass "$name"
            else
                fail "$name" "$(diff "$tmp/vblkd.$ctx" "$tmp/qemu.$ctx" | head -6 | tr '\n' ' ')"
            fi
        done
    else
        fail "block-status-$img-starts" "$(tail -2 "$tmp/m.log")"
    fi
done

# ---- TLS: X.509 (qemu-nbd's and nbdkit's directory layout) and PSK ------------
. "$here/x509.sh"
x509_make "$tmp/pki" "$tmp/cli" localhost --dns localhost --ip 127.0.0.1
psktool -u alice -p "$tmp/keys.psk" >/dev/null 2>&1
psktool -u alice -p "$tmp/wrong.psk" >/dev/null 2>&1
tport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
X=$tmp/x.sock P=$tmp/p.sock
xuri="nbds+unix:///?socket=$X&tls-certificates=$tmp/cli"
puri="nbds://alice@127.0.0.1:$tport/p?tls-psk-file=$tmp/keys.psk"
head -c $((64 << 20)) /dev/urandom >"$tmp/tls-src.raw"
truncate -s 64M "$tmp/tls.raw"
if start "$tmp/tls.log" --disk "$tmp/tls.raw" --nbd "unix:$X,tls=x509:$tmp/pki" \
        --nbd "127.0.0.1:$tport,name=p,tls=psk:$tmp/keys.psk" --control "$tmp/tls.ctl"; then
    out=$(nbdinfo "$xuri" 2>&1)
    grep -q "with TLS" <<<"$out" && pass tls-x509-nbdinfo || fail tls-x509-nbdinfo "$out"
    # 4 KiB writes, 32 in flight: libnbd sends each one's header and
    # payload as two records, and a server that read them as they came
    # took one receive per record for as long as the client wrote.  A
    # pass now ends when the socket is empty, and the next one waits for
    # several (conn.c conn_drained, conn_moderate).
    tcoal() { "$VBLKCTL" --control "$tmp/tls.ctl" nbd list | python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print(s["coalesced_waits"], s["coalesced_requests"], s["requests"])'; }
    read -r w0 r0 q0 < <(tcoal)
    nbdcopy --connections=1 --requests=32 --request-size=4096 "$tmp/tls-src.raw" "$puri" &&
        read -r w1 r1 q1 < <(tcoal) &&
        nbdcopy "$xuri" "$tmp/tls-out.raw" &&
        cmp -s "$tmp/tls-src.raw" "$tmp/tls-out.raw" &&
        pass tls-psk-tcp-write-x509-unix-read-round-trip ||
        fail tls-psk-tcp-write-x509-unix-read-round-trip
    # Where the server is the slower side (one CPU, a sanitizer build)
    # its passes fill up by themselves and hardly any wait is tried:
    # nothing to judge then.
    out="$((w1 - w0)) waits for $((q1 - q0)) requests, $(((r1 - r0) / (w1 - w0 > 0 ? w1 - w0 : 1))) taken after each"
    if ((q1 - q0 < 16384)); then
        fail tls-write-coalesced "$out"
    elif ((w1 - w0 < 20)); then
        echo "SKIP: tls-write-coalesced (the server was the slower side: $out)"
    elif ((r1 - r0 >= 2 * (w1 - w0))); then
        pass "tls-write-coalesced: $out"
    else
        fail tls-write-coalesced "$out"
    fi
    check tls-x509-qemu-img-compare qemu-img compare -q \
        --object "tls-creds-x509,id=t0,dir=$tmp/cli,endpoint=client" \
        --image-opts "driver=nbd,server.type=unix,server.path=$X,tls-creds=t0,tls-hostname=localhost" \
        --image-opts "driver=file,filename=$tmp/tls-src.raw"
    # Refused: no TLS (no data, no size: TLS_REQD), a wrong key.
    out=$(nbdinfo "nbd+unix:///?socket=$X" 2>&1) && fail tls-less-client-refused "$out" ||
        { grep -q "export-size" <<<"$out" && fail tls-less-client-refused "$out" ||
          pass tls-less-client-refused; }
    if nbdinfo "nbds://alice@127.0.0.1:$tport/p?tls-psk-file=$tmp/wrong.psk" >/dev/null 2>&1; then
        fail tls-wrong-psk-refused
    else pass tls-wrong-psk-refused; fi
    # A TLS 1.3 KeyUpdate (GnuTLS clients send one after 2^24 records) and
    # a READ behind it in one segment: the READ is answered, though
    # GnuTLS reports the KeyUpdate as "nothing yet" (tls.c nbds__tls_recv).
    if [[ -x $BUILD/nbd-tls-keyupdate ]]; then
        out=$(timeout 30 "$BUILD/nbd-tls-keyupdate" 127.0.0.1 "$tport" p alice \
              "$(cut -d: -f2 "$tmp/keys.psk")" 2>&1) &&
            pass "tls-keyupdate-then-read-answered: $out" ||
            fail tls-keyupdate-then-read-answered "$out"
    else
        echo "SKIP: tls-keyupdate-then-read-answered (built without GnuTLS)"
    fi
    timeout 120 python3 "$here/nbd_clients.py" --tls "$X" "$tmp/tls.raw" "$dpid" ||
        fail nbd-tls-clients-script "exited $?"
    grep -q "TLS handshake failed" "$tmp/tls.log" && pass tls-failed-handshake-logged ||
        fail tls-failed-handshake-logged
    stop || fail tls-sigterm-exits-0
else
    fail tls-starts "$(tail -2 "$tmp/tls.log")"
fi

# ---- Start-up errors: one line, non-zero, nothing left behind ----------------
# ---- Dirty bitmaps: what the guest and NBD clients wrote ---------------------
# b4 (4 KiB), b64 (64 KiB) and a disabled one; the guest (vblk-bench,
# verified random writes) and an NBD client (qemu-io) write: b4 over NBD
# (nbdinfo --map=qemu:dirty-bitmap:b4) is exactly the 4 KiB blocks whose
# bytes changed, b64 those blocks at its granularity, the disabled one
# clean; QEMU reads the same (qemu-img map with x-dirty-bitmap); a bitmap
# a client has selected is not removed; cleared, it is clean.
head -c $((32 << 20)) /dev/urandom >"$tmp/bm.raw"
cp "$tmp/bm.raw" "$tmp/bm-before.raw"
BM=$tmp/bm.sock
if start "$tmp/bm.log" --disk "$tmp/bm.raw" --socket "$tmp/bm-vu.sock" --nbd "unix:$BM" \
        --control "$tmp/bm.ctl"; then
    bctl() { "$VBLKCTL" --control "$tmp/bm.ctl" "$@"; }
    bctl bitmap add b4 --granularity 4K >/dev/null && bctl bitmap add b64 >/dev/null &&
        bctl bitmap add off --disabled >/dev/null
    "$BENCH" --socket "$tmp/bm-vu.sock" --rw randwrite --size 8M --iodepth 4 --runtime 1 \
        --ramp 0 --verify >"$tmp/bm-bench.out" 2>&1
    qemu-io -f raw -c 'write -P 0x11 20M 8k' -c 'write -P 0x12 24M 100k' "$(uri "$BM")" >/dev/null
    for b in b4 b64 off; do nbdinfo --json --map="qemu:dirty-bitmap:$b" "$(uri "$BM")" >"$tmp/bm-$b.map"; done
    qemu-img map --output=json --image-opts \
        "driver=nbd,server.type=unix,server.path=$BM,x-dirty-bitmap=qemu:dirty-bitmap:b4" \
        >"$tmp/bm-qemu.map" 2>&1
    # A client that selected b4 (python3-libnbd) keeps it from removal.
    /usr/bin/python3 - "$BM" "$tmp/bm-held" <<'PYEOF' &
import nbd, sys, time, os
h = nbd.NBD()
h.add_meta_context("qemu:dirty-bitmap:b4")
h.connect_unix(sys.argv[1])
assert h.can_meta_context("qemu:dirty-bitmap:b4")
open(sys.argv[2], "w").close()
while os.path.exists(sys.argv[2]):
    time.sleep(0.02)
h.shutdown()
PYEOF
    ppid=$!
    for _ in $(seq 250); do [[ -e $tmp/bm-held ]] && break; sleep 0.02; done
    busy=$(bctl bitmap remove b4); brc=$?
    rm -f "$tmp/bm-held"; wait "$ppid"; prc=$?
    for _ in $(seq 100); do bctl bitmap list | grep -q '"in_use": true' || break; sleep 0.05; done
    gone=$(bctl bitmap remove b4); grc=$?
    bctl bitmap clear b64 >/dev/null
    left=$(bctl bitmap list)
    stop
    if ! cmp -s "$tmp/bm-before.raw" "$tmp/bm.raw" &&
       /usr/bin/python3 - "$tmp" <<'PYEOF'
import json, sys
t = sys.argv[1]
a = open(t + "/bm-before.raw", "rb").read(); b = open(t + "/bm.raw", "rb").read()
changed = [i for i in range(len(a) // 4096) if a[i*4096:(i+1)*4096] != b[i*4096:(i+1)*4096]]
def dirty(name, gran):
    s = set()
    for e in json.load(open("%s/bm-%s.map" % (t, name))):
        if e["type"] & 1:
            s.update(range(e["offset"] // gran, (e["offset"] + e["length"]) // gran))
    return s
want4, want64 = set(changed), {i * 4096 // 65536 for i in changed}
q = {i for e in json.load(open(t + "/bm-qemu.map")) if not e["data"]
     for i in range(e["start"] // 4096, (e["start"] + e["length"]) // 4096)}
bad = []
if dirty("b4", 4096) != want4: bad.append("b4 %d vs %d blocks" % (len(dirty("b4", 4096)), len(want4)))
if dirty("b64", 65536) != want64: bad.append("b64")
if dirty("off", 65536): bad.append("disabled bitmap marked")
if q != want4: bad.append("qemu-img map differs")
if len(changed) < 100: bad.append("only %d blocks changed" % len(changed))
if bad:
    print(bad); sys.exit(1)
PYEOF
    then pass nbd-dirty-bitmaps-are-what-changed
    else fail nbd-dirty-bitmaps-are-what-changed "$(tail -1 "$tmp/bm-bench.out")"
    fi
    if ((brc == 1 && prc == 0 && grc == 0)) && [[ $busy == *"in use by 1 NBD client"* ]] &&
       [[ $left == *'"name": "b64", "granularity": 65536, "dirty_bytes": 0,'* && $left != *'"b4"'* ]]; then
        pass nbd-dirty-bitmap-in-use-not-removed-then-removed-cleared
    else
        fail nbd-dirty-bitmap-in-use-not-removed-then-removed-cleared "$brc:$busy / $prc / $grc:$gone / $left"
    fi
else
    fail nbd-dirty-bitmaps-are-what-changed "$(tail -2 "$tmp/bm.log")"
fi

# ---- QoS: NBD clients take from the disk's budget ----------------------------
# --limit bps-total=16M: nbdcopy of 16 MiB in (writes), then out (reads),
# waits for the budget (the throttled counter and metric move), the bytes
# are right; the limit removed at run time (vblkctl set-limits) and the
# counter stays where it was for a copy that needs no budget.
head -c $((16 << 20)) /dev/urandom >"$tmp/q.src"
truncate -s 16M "$tmp/q.raw"
Q=$tmp/q.sock
throttled() { "$VBLKCTL" --control "$tmp/q.ctl" nbd list | python3 -c \
    'import json,sys; print(json.load(sys.stdin)["stats"]["throttled"])'; }
if start "$tmp/q.log" --disk "$tmp/q.raw" --nbd "unix:$Q" --control "$tmp/q.ctl" \
        --limit bps-total=16M; then
    nbdcopy "$tmp/q.src" "$(uri "$Q")" && nbdcopy "$(uri "$Q")" "$tmp/q.out"; crc=$?
    t1=$(throttled)
    m=$("$VBLKCTL" --control "$tmp/q.ctl" metrics | grep '^vblkd_nbd_throttled_requests_total ')
    "$VBLKCTL" --control "$tmp/q.ctl" set-limits bps-total=0 >/dev/null
    nbdcopy "$(uri "$Q")" "$tmp/q.out2"
    t2=$(throttled)
    acct=$("$VBLKCTL" --control "$tmp/q.ctl" stats | python3 -c '
import json, sys
o = json.load(sys.stdin)["disk"]["nbd_ops"]
print(o["write"]["bytes"], o["read"]["bytes"], o["write"]["errors"])')
    am=$("$VBLKCTL" --control "$tmp/q.ctl" metrics | grep -c '^vblkd_disk_requests_total{front="nbd",op="write"} [1-9]')
    stop
    if ((crc == 0)) && cmp -s "$tmp/q.src" "$tmp/q.out" && cmp -s "$tmp/q.src" "$tmp/q.out2" &&
       ((t1 > 0)) && [[ $m == "vblkd_nbd_throttled_requests_total $t1" && $t2 == "$t1" ]]; then
        pass nbd-qos-budget-throttles-clients
    else
        fail nbd-qos-budget-throttles-clients "rc=$crc throttled=$t1/$t2 metric='$m'"
    fi
    # Accounting: the NBD front's bytes per operation, in stats and metrics.
    if [[ $acct == "$((16 << 20)) $((32 << 20)) 0" && $am == 1 ]]; then
        pass nbd-requests-accounted-as-front-nbd
    else
        fail nbd-requests-accounted-as-front-nbd "nbd_ops write/read bytes, errors: $acct; metric lines $am"
    fi
else
    fail nbd-qos-budget-throttles-clients "$(tail -2 "$tmp/q.log")"
fi

# ---- Reads and writes of a tmpfs disk on the iothread -------------------------
# io_uring hands every tmpfs read and write to its worker thread (shmem
# has no FMODE_NOWAIT), so the engine does a pass's few on the iothread
# with preadv/pwritev2: at QD1 (qemu-io) every NBD read and write is
# counted in backend_sync (the iothread's stats); the bytes nbdcopy (many
# requests in flight: some passes go to the ring) writes and reads back
# are the source's.  --no-sync-io: none is (the ring does them); and a
# disk on a file system that is not tmpfs (the test's directory, when it
# is not) goes through the ring as before, with the same bytes.
sync_counts() {	# sync_counts CTL: backend_sync, NBD reads + writes
    "$VBLKCTL" --control "$1" stats | python3 -c '
import json, sys
s = json.load(sys.stdin)
o = s["disk"]["nbd_ops"]
print(sum(t["backend_sync"] for t in s["iothreads"]), o["read"]["requests"] + o["write"]["requests"])'
}
head -c $((16 << 20)) /dev/urandom >"$tmp/io.src"
shm=$(mktemp -p /dev/shm vblk-nbds.XXXXXX 2>/dev/null)
[[ -n $shm && $(stat -f -c %T "$shm") == tmpfs ]] || { rm -f "$shm"; shm=""; }
for mode in tmpfs tmpfs-no-sync-io other-fs; do
    extra=() disk=$shm
    [[ $mode == tmpfs-no-sync-io ]] && extra=(--no-sync-io)
    if [[ $mode == other-fs ]]; then
        disk=$tmp/io.raw
        [[ $(stat -f -c %T "$tmp") != tmpfs ]] || disk=""
    fi
    if [[ -z $disk ]]; then
        echo "SKIP: nbd-io-$mode (no such file system here)"
        continue
    fi
    truncate -s 0 "$disk" && truncate -s 16M "$disk"
    S=$tmp/io-$mode.sock
    if start "$tmp/io-$mode.log" --disk "$disk" --nbd "unix:$S" --control "$tmp/io-$mode.ctl" \
            "${extra[@]}"; then
        qemu-io -f raw -c 'write -P 0x5a 0 64k' -c 'read -P 0x5a 0 64k' -c 'write -P 0x11 1M 4k' \
            -c 'read -P 0x11 1M 4k' "$(uri "$S")" >"$tmp/io-$mode.qio" 2>&1 &&
            ! grep -q "Pattern verification failed" "$tmp/io-$mode.qio"; qrc=$?
        read -r nsync1 nrw1 < <(sync_counts "$tmp/io-$mode.ctl")
        nbdcopy "$tmp/io.src" "$(uri "$S")" && nbdcopy "$(uri "$S")" "$tmp/io.out" &&
            qemu-img compare -q -f raw -F raw "$tmp/io.src" "$(uri "$S")"; crc=$?
        read -r nsync nrw < <(sync_counts "$tmp/io-$mode.ctl")
        stop
        if [[ $mode == tmpfs ]]; then ok=$((nsync1 == nrw1 && nrw1 >= 4 && nsync > nsync1 && nrw >= 128))
        else ok=$((nsync == 0 && nrw >= 128)); fi
        ((qrc == 0)) || ok=0
        if ((crc == 0 && ok)) && cmp -s "$tmp/io.src" "$tmp/io.out" && cmp -s "$tmp/io.src" "$disk"; then
            pass nbd-io-$mode
        else
            fail nbd-io-$mode "rc=$qrc/$crc backend_sync=$nsync1/$nsync nbd reads+writes=$nrw1/$nrw"
        fi
    else
        fail nbd-io-$mode "$(tail -2 "$tmp/io-$mode.log")"
    fi
done
[[ -n $shm ]] && rm -f "$shm"

bad() {	# bad NAME EXPECTED-REGEX ARGS...
    local name=$1 re=$2 out rc; shift 2
    out=$(timeout 10 "$VBLKD" "$@" 2>&1); rc=$?
    if ((rc != 0)) && [[ $(grep -vc "^vblkd\[main\].*info" <<<"$out") == 1 ]] &&
       grep -qE "$re" <<<"$out"; then
        pass "$name"
    else
        fail "$name" "rc=$rc: $out"
    fi
}
bad cli-neither-socket-nor-nbd "missing --socket .* or --nbd" --disk "$tmp/disk.raw"
bad cli-nbd-without-address "give an address first" --disk "$tmp/disk.raw" --nbd name=x
bad cli-nbd-unknown-field "unknown field 'bogus'" --disk "$tmp/disk.raw" --nbd "unix:$tmp/x.sock,bogus"
bad cli-nbd-max-conn-zero "max-conn takes" --disk "$tmp/disk.raw" --nbd "unix:$tmp/x.sock,max-conn=0"
bad cli-nbd-tls-dir-without-keys "cannot read .*server-cert.pem" --disk "$tmp/disk.raw" \
    --nbd "unix:$tmp/x.sock,tls=x509:$tmp/cli"
bad cli-nbd-tls-psk-file-missing "cannot read $tmp/none.psk" --disk "$tmp/disk.raw" \
    --nbd "unix:$tmp/x.sock,tls=psk:$tmp/none.psk"
bad cli-nbd-tls-bad-kind "tls= takes x509:DIR or psk:FILE" --disk "$tmp/disk.raw" \
    --nbd "unix:$tmp/x.sock,tls=pem:/x"
bad cli-nbd-two-exports-one-name "named 'x' exists already" --disk "$tmp/disk.raw" \
    --nbd "unix:$tmp/x1.sock,name=x" --nbd "unix:$tmp/x2.sock,name=x"
bad cli-nbd-writable-export-of-read-only-disk "add read-only" --disk "$tmp/disk.raw" \
    --read-only --nbd "unix:$tmp/x.sock"
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
open(sys.argv[1], "w").write(str(s.getsockname()[1])); time.sleep(10)' "$tmp/busy" &
hpid=$!
for _ in $(seq 500); do [[ -s $tmp/busy ]] && break; sleep 0.01; done
bad cli-nbd-port-in-use "port is in use" --disk "$tmp/disk.raw" --nbd "127.0.0.1:$(cat "$tmp/busy")"
kill "$hpid" 2>/dev/null; wait "$hpid" 2>/dev/null; hpid=""
[[ ! -e $tmp/x.sock && ! -e $tmp/x1.sock && ! -e $tmp/x2.sock ]] &&
    pass cli-errors-leave-no-socket || fail cli-errors-leave-no-socket "$(ls "$tmp"/x*.sock)"
exit 0
