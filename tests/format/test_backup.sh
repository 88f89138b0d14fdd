#!/usr/bin/env bash
# Pull-mode backup (issue 46): vblkctl backup start serves a point-in-time
# view of the disk over NBD while writes go on (copy-before-write to a
# scratch file), with the bitmap as of the instant; finish makes the
# bitmap track from the instant, abort leaves it as it was.  Judged by
# byte comparison with a copy of the disk taken at the instant:
#  - a full backup read while a client writes, discards and writes zeroes
#    all over the disk (before each slice it reads, the slice among them)
#    equals the instant, read by slices and by a default nbdcopy (which
#    trusts block status: a discard after the instant must not turn the
#    view's data into a hole, as it does with QSD 7.2's snapshot-access);
#  - an incremental reads only the bitmap's dirty extents, and full +
#    incremental applied in order equals the second instant (raw, qcow2);
#  - an aborted backup loses nothing: the next incremental still restores;
#  - a full scratch fails the backup, never the writes; kill -9 during a
#    backup leaves a persistent bitmap covering everything;
#  - bad requests are refused in one line with nothing left behind, nbd
#    remove of the view among them (reads the rate holds are the backup's);
#  - the backup's job: dismissed, it leaves backup list; job complete is
#    finish; abort gives B the frozen bits back after a bitmap clear;
#  - backup start's claim may load the image's bitmaps again: the bitmap
#    is taken after it; a raw disk's kept chunks keep their depth (1).
# Usage: test_backup.sh BUILD_DIR.  Prints PASS:/FAIL:/SKIP: lines.
set -uo pipefail
BUILD=${1:?usage: test_backup.sh BUILD_DIR}
VBLKD=$BUILD/vblkd VBLKCTL=$BUILD/vblkctl
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vblk-bkp.XXXXXX")
dpid="" mnt=""
cleanup() {
    [[ -n $dpid ]] && kill -9 "$dpid" 2>/dev/null
    wait 2>/dev/null
    [[ -n $mnt ]] && umount "$mnt" 2>/dev/null
    [[ -n ${KEEP:-} ]] || rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

for t in qemu-img qemu-io nbdinfo nbdcopy; do
    command -v $t >/dev/null || {
        echo "SKIP: backup (no $t: scripts/deps.sh installs qemu-utils, libnbd-bin)"
        exit 0; }
done
# libnbd's python binding is Debian's (python3-libnbd), for /usr/bin/python3.
PY=/usr/bin/python3
$PY -c 'import nbd' 2>/dev/null || {
    echo "SKIP: backup (no python3-libnbd: scripts/deps.sh installs it)"; exit 0; }

RW=$tmp/rw.sock VIEW=$tmp/view.sock CTL=$tmp/c.ctl
rw() { echo "nbd+unix:///?socket=$RW"; }
view() { echo "nbd+unix:///$1?socket=$VIEW"; }
ctl() { "$VBLKCTL" --control "$CTL" "$@"; }
# start IMG LOG [ARGS...]: vblkd serving IMG over NBD only (writable), ready.
start() {
    local img=$1 log=$2; shift 2
    rm -f "$RW" "$CTL"
    # shellcheck disable=SC2086  # VBLK_BACKUP_ARGS: more vblkd options, split
    "$VBLKD" --disk "$img" --nbd "unix:$RW" --control "$CTL" ${VBLK_BACKUP_ARGS:-} "$@" >"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 500); do
        [[ -S $RW && -S $CTL ]] && grep -q serving "$log" && return 0
        kill -0 "$dpid" 2>/dev/null || return 1
        sleep 0.01
    done
    return 1
}
stop() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid"; local rc=$?; dpid=""; return $rc; }
# jfield JSON KEY...: a field of vblkctl's JSON (backups[0].KEY, bitmaps by name, ...)
jget() { $PY -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }
snap() { nbdcopy "$(rw)" "$1"; }	# the disk as it is now (nothing writing)
pull() { $PY "$here/backup_pull.py" "$@"; }

# ---- full, incremental, abort, incremental: raw and qcow2 -------------------------
chain() {
    local fmt=$1; local img=$tmp/disk.$fmt log=$tmp/$fmt.log pers=""
    rm -f "$img"
    qemu-img create -q -f "$fmt" "$img" 64M
    qemu-io -f "$fmt" -c 'write -P 0x11 0 24M' -c 'write -P 0x22 32M 8M' \
        -c 'write -P 0x33 60M 64k' "$img" >/dev/null
    [[ $fmt == qcow2 ]] && pers=--persistent
    if ! start "$img" "$log"; then fail "$fmt: vblkd starts" "$(tail -3 "$log")"; return; fi
    ctl bitmap add B $pers >/dev/null
    qemu-io -f raw -c 'write -P 0x44 1M 2M' "$(rw)" >/dev/null
    snap "$tmp/ref1"
    ctl backup start full --nbd "unix:$VIEW" --bitmap B >/dev/null ||
        { fail "$fmt: backup start"; stop; return; }
    r=$(pull "$(view full)" "$tmp/full" --rw "$(rw)" --writes 4 --seed 1)
    nbdcopy "$(view full)" "$tmp/full-nbdcopy"
    saved=$(ctl backup list | jget 'd["backups"][0]["saved_chunks"]')
    scratch=$(ctl backup list | jget 'd["backups"][0]["scratch_bytes"]')
    ctl metrics >"$tmp/metrics.txt"
    m_saved=$(awk '/^vblkd_backup_saved_chunks_total\{name="full"/ { print $2 }' "$tmp/metrics.txt")
    m_scratch=$(awk '/^vblkd_backup_scratch_bytes\{name="full"/ { print $2 }' "$tmp/metrics.txt")
    if [[ $m_saved == "$saved" && $m_scratch == "$scratch" ]] && ((scratch > 0)); then
        pass "$fmt: the backup's scratch ($scratch bytes) and kept chunks in backup list and the metrics"
    else
        fail "$fmt: backup metrics" "list $saved/$scratch, metrics '$m_saved'/'$m_scratch'"
    fi
    if cmp -s "$tmp/full" "$tmp/ref1" && cmp -s "$tmp/full-nbdcopy" "$tmp/ref1" && ((saved > 0)); then
        pass "$fmt: a full backup read under 256 writes, discards and write zeroes equals the instant (by slices and by nbdcopy with block status; $saved chunks kept first)"
    else
        fail "$fmt: full backup equals the instant" \
            "$(cmp "$tmp/full" "$tmp/ref1" | head -1) / $(cmp "$tmp/full-nbdcopy" "$tmp/ref1" | head -1), saved $saved"
    fi
    ctl backup finish full >/dev/null || fail "$fmt: backup finish"
    # What the pull's writes marked, and nothing before the instant.
    b1=$(ctl bitmap list | jget '[b for b in d["bitmaps"] if b["name"]=="B"][0]["dirty_bytes"]')

    snap "$tmp/ref2"
    ctl backup start inc1 --nbd "unix:$VIEW" --bitmap B >/dev/null || fail "$fmt: backup start inc1"
    nbdinfo --map=qemu:dirty-bitmap:B "$(view inc1)" >"$tmp/inc1.map"
    cp "$tmp/full" "$tmp/restore"
    r=$(pull "$(view inc1)" "$tmp/restore" --bitmap B --rw "$(rw)" --writes 2 --seed 2)
    read -r _ nread _ ndirty <<<"$r"
    mapdirty=$(awk '$3 == 1 { s += $2 } END { print s + 0 }' "$tmp/inc1.map")
    got=$(ctl backup list | jget 'd["backups"][0]["read_bytes"]')
    if cmp -s "$tmp/restore" "$tmp/ref2" && [[ $nread == "$mapdirty" && $got == "$nread" ]] &&
        ((nread > 0 && nread < 64 << 20 && nread == b1)); then
        pass "$fmt: an incremental reads only the bitmap's $nread dirty bytes (what finish left in it), and full + incremental equals the second instant"
    else
        fail "$fmt: incremental restore" "$(cmp "$tmp/restore" "$tmp/ref2" | head -1); read $nread, map $mapdirty, served $got, bitmap after finish $b1"
    fi
    ctl backup finish inc1 >/dev/null

    # Abort: the bitmap keeps what it had; the next incremental restores.
    qemu-io -f raw -c 'write -P 0x55 10M 1M' "$(rw)" >/dev/null
    ctl backup start gone --nbd "unix:$VIEW" --bitmap B >/dev/null
    qemu-io -f raw -c 'write -P 0x66 50M 64k' "$(rw)" >/dev/null
    ctl backup abort gone >/dev/null
    snap "$tmp/ref3"
    ctl backup start inc2 --nbd "unix:$VIEW" --bitmap B >/dev/null
    pull "$(view inc2)" "$tmp/restore" --bitmap B >/dev/null
    ctl backup finish inc2 >/dev/null
    if cmp -s "$tmp/restore" "$tmp/ref3" && [[ ! -e $VIEW ]] &&
        [[ $(ctl backup list | jget 'len(d["backups"])') == 0 ]]; then
        pass "$fmt: after an aborted backup the next incremental still restores the disk (nothing lost); the view's socket gone"
    else
        fail "$fmt: abort loses nothing" "$(cmp "$tmp/restore" "$tmp/ref3" | head -1)"
    fi
    if [[ $fmt == qcow2 ]]; then
        # kill -9 during a backup: the persistent bitmap still covers
        # everything since the last finish, the pull's writes included.
        qemu-io -f raw -c 'write -P 0x77 20M 64k' "$(rw)" >/dev/null
        ctl backup start crash --nbd "unix:$VIEW" --bitmap B >/dev/null
        qemu-io -f raw -c 'write -P 0x78 44M 64k' "$(rw)" >/dev/null
        kill -9 "$dpid"; wait "$dpid" 2>/dev/null; dpid=""
        snap_img=$tmp/ref4
        qemu-img convert -U -O raw "$img" "$snap_img"
        if start "$img" "$log.2"; then
            ctl backup start inc3 --nbd "unix:$VIEW" --bitmap B >/dev/null
            pull "$(view inc3)" "$tmp/restore" --bitmap B >/dev/null
            ctl backup finish inc3 >/dev/null
            if cmp -s "$tmp/restore" "$snap_img" && [[ ! -e $VIEW ]]; then
                pass "qcow2: kill -9 during a backup: after restart the persistent bitmap still covers every write since the last finish (the restore equals the disk)"
            else
                fail "qcow2: kill -9 during a backup" "$(cmp "$tmp/restore" "$snap_img" | head -1)"
            fi
        else
            fail "qcow2: restart after kill -9" "$(tail -2 "$log.2")"
        fi
    fi
    stop || fail "$fmt: vblkd exits cleanly after backups" "$(tail -2 "$log")"
    if [[ $fmt == qcow2 ]]; then
        # Leaks are the kill -9's (as QEMU's after a crash); no corruption.
        c=$(qemu-img check --output=json "$img" 2>/dev/null |
            $PY -c 'import json,sys; print(json.load(sys.stdin).get("corruptions", 0))')
        [[ $c == 0 ]] && pass "qcow2: qemu-img check finds no corruption after the backups" ||
            fail "qcow2: qemu-img check after the backups" "$c corruptions"
    fi
}
chain raw
chain qcow2

# ---- refusals, a full scratch -------------------------------------------------------
img=$tmp/disk.raw
truncate -s 64M "$img"
qemu-io -f raw -c 'write -P 0x11 0 40M' "$img" >/dev/null
if start "$img" "$tmp/r.log"; then
    ok=1
    ctl bitmap add B >/dev/null
    check_refused() {	# WHAT EXPECTED-WORDS -- vblkctl args
        local what=$1 want=$2; shift 3
        local out; out=$(ctl "$@" 2>&1) && { ok=0; echo "  $what: accepted"; return; }
        [[ $(wc -l <<<"$out") == 1 && $out == *"$want"* ]] || { ok=0; echo "  $what: '$out'"; }
    }
    check_refused "no --nbd" "needs --nbd" -- backup start x
    check_refused "no such bitmap" "no bitmap 'nope'" -- backup start x --nbd "unix:$VIEW" --bitmap nope
    check_refused "scratch not a dir" "not a directory" -- backup start x --nbd "unix:$VIEW" --scratch "$img"
    check_refused "bad name" "backup name" -- backup start 'a b' --nbd "unix:$VIEW"
    check_refused "bad address" "" -- backup start x --nbd "nowhere"
    check_refused "no such backup" "no backup 'x'" -- backup finish x
    ctl backup start one --nbd "unix:$VIEW" >/dev/null || ok=0
    check_refused "a second backup" "runs already" -- backup start two --nbd "unix:$tmp/v2.sock"
    check_refused "resize during a backup" "backup" -- resize 128M
    # Its view's reads may be held by the backup's rate, which the NBD
    # server does not see: only the backup removes its export.
    check_refused "nbd remove of the view" \
        "NBD export 'one' is backup one's view: use vblkctl backup finish/abort one" -- nbd remove one
    ctl backup abort one >/dev/null || ok=0
    left=$(ctl nbd list | jget 'len(d["exports"])')
    if ((ok)) && [[ $left == 1 && ! -e $VIEW && ! -e $tmp/v2.sock ]] &&
        [[ -z $(ls -A "$tmp" | grep -i vblkd-backup) ]] &&
        [[ $(ctl bitmap list | jget 'd["bitmaps"][0]["in_use"]') == False ]]; then
        pass "backup start refuses no --nbd, an unknown bitmap, a scratch that is not a directory, a bad name or address, a second backup, a resize, nbd remove of the view: one line each, nothing left behind"
    else
        fail "backup refusals" "exports $left"
    fi

    # A scratch too small for what the writes displace: the backup fails,
    # the writes do not.
    mnt=$tmp/small
    mkdir -p "$mnt"
    if mount -t tmpfs -o size=1m tmpfs "$mnt" 2>/dev/null; then
        ctl backup start tiny --nbd "unix:$VIEW" --scratch "$mnt" >/dev/null
        if qemu-io -f raw -c 'write -P 0x99 0 8M' -c 'read -P 0x99 0 8M' "$(rw)" >/dev/null &&
            ! nbdcopy "$(view tiny)" "$tmp/tiny" 2>/dev/null; then
            sleep 0.3
            st=$(ctl job list | jget '[j for j in d["jobs"] if j["type"]=="backup"][-1]["state"]')
            er=$(ctl job list | jget '[j for j in d["jobs"] if j["type"]=="backup"][-1]["error"]')
            if [[ $st == concluded && $er == *scratch* && ! -e $VIEW ]] &&
                grep -q "backup tiny failed: the scratch" "$tmp/r.log"; then
                pass "a full scratch fails the backup (job concluded: '$er'), never the writes (all done, read back)"
            else
                fail "full scratch" "state $st, error '$er'"
            fi
        else
            fail "full scratch: the writes fail or the view still reads"
        fi
        umount "$mnt"; mnt=""
    else
        echo "SKIP: full scratch (cannot mount a small tmpfs here)"
    fi
    stop || fail "vblkd exits cleanly" "$(tail -2 "$tmp/r.log")"
else
    fail "vblkd starts" "$(tail -3 "$tmp/r.log")"
fi

# ---- The backup's job: dismissed, cancelled, completed ------------------------------
# A backup's struct is its job's: job dismiss (or the job list's trim of
# old concluded jobs) frees it, and it leaves backup list with it (before,
# it stayed listed, freed: a use-after-free at the next backup list or
# start).  A job cancelled and dismissed at once is torn down (view,
# bitmap use, claim) whether main reaped it first or not.
img=$tmp/life.raw
truncate -s 64M "$img"
qemu-io -f raw -c 'write -P 0x51 0 8M' "$img" >/dev/null
if start "$img" "$tmp/life.log"; then
    ok=1 why=""
    ctl bitmap add B >/dev/null
    nbackups() { ctl backup list | jget 'len(d["backups"])'; }
    job=$(ctl backup start b --nbd "unix:$VIEW" | jget 'd["job"]') &&
        ctl backup finish b >/dev/null && ctl job dismiss "$job" >/dev/null &&
        [[ $(nbackups) == 0 ]] && ctl backup start b --nbd "unix:$VIEW" >/dev/null &&
        ctl backup finish b >/dev/null || { ok=0; why="dismiss after finish"; }
    for i in $(seq 10); do
        ctl backup start "c$i" --nbd "unix:$VIEW" --bitmap B >/dev/null &&
            ctl backup finish "c$i" >/dev/null || { ok=0; why="cycle $i"; }
    done
    [[ $(nbackups) == 0 ]] || { ok=0; why="$why; listed after 10 cycles"; }
    job=$(ctl backup start d --nbd "unix:$VIEW" --bitmap B | jget 'd["job"]') &&
        ctl job cancel "$job" >/dev/null && ctl job dismiss "$job" >/dev/null &&
        [[ $(nbackups) == 0 && ! -e $VIEW ]] &&
        [[ $(ctl bitmap list | jget 'd["bitmaps"][0]["in_use"]') == False ]] &&
        ctl backup start e --nbd "unix:$VIEW" >/dev/null && ctl backup abort e >/dev/null ||
        { ok=0; why="$why; cancel and dismiss"; }
    if ((ok)) && kill -0 "$dpid" 2>/dev/null; then
        pass "a dismissed backup job leaves backup list: dismiss after finish, 10 start/finish cycles (the job list's trim), cancel and dismiss at once; backups start again"
    else
        fail "a dismissed backup job" "$why"
    fi
    # job complete is backup finish: B then holds only what was written
    # since the instant (before: torn down as an abort, B as it was).
    bdirty() { ctl bitmap list | jget '[b for b in d["bitmaps"] if b["name"]=="B"][0]["dirty_bytes"]'; }
    qemu-io -f raw -c 'write -P 0x52 0 1M' "$(rw)" >/dev/null
    job=$(ctl backup start f --nbd "unix:$VIEW" --bitmap B | jget 'd["job"]')
    qemu-io -f raw -c 'write -P 0x53 20M 64k' "$(rw)" >/dev/null
    ctl job complete "$job" >/dev/null; rc=$?
    for _ in $(seq 100); do [[ $(nbackups) == 0 ]] && break; sleep 0.01; done
    cd_=$(bdirty)
    if ((rc == 0)) && [[ $cd_ == 65536 && $(nbackups) == 0 && ! -e $VIEW ]] &&
        grep -q "backup f finished (its job completed)" "$tmp/life.log"; then
        pass "job complete of a backup is its finish: B holds the 64 KiB written after the instant alone"
    else
        fail "job complete of a backup" "rc $rc, B has $cd_ dirty bytes (want 65536)"
    fi
    # Abort loses nothing, a bitmap clear during the backup included: the
    # frozen bits (B at the instant) and the writes since go back into B
    # (before: B kept only what was written after the clear).
    qemu-io -f raw -c 'write -P 0x54 30M 1M' "$(rw)" >/dev/null
    ctl backup start g --nbd "unix:$VIEW" --bitmap B >/dev/null
    frozen=$(nbdinfo --map=qemu:dirty-bitmap:B "$(view g)" | awk '$3 == 1 { s += $2 } END { print s + 0 }')
    qemu-io -f raw -c 'write -P 0x55 40M 64k' "$(rw)" >/dev/null
    ctl bitmap clear B >/dev/null
    ctl backup abort g >/dev/null; rc=$?
    ad=$(bdirty)
    if ((rc == 0 && frozen == 65536 + 1048576 && ad == frozen + 65536)); then
        pass "backup abort after a bitmap clear during the backup: B has the $frozen frozen bytes and the 64 KiB written since back (nothing lost)"
    else
        fail "abort after a bitmap clear" "rc $rc, frozen $frozen, B has $ad dirty bytes (want $((frozen + 65536)))"
    fi
    stop || fail "vblkd exits cleanly after the dismissed jobs" "$(tail -2 "$tmp/life.log")"
else
    fail "vblkd starts (life)" "$(tail -3 "$tmp/life.log")"
fi

# ---- The bitmap looked up after the claim ----------------------------------------
# With no client, the disk is not claimed; backup start's claim is then
# the first, and another process's bitmaps stored in the image since are
# loaded again (ours of the same name replaced).  The backup takes the
# bitmap after that (before, it held the replaced one, freed: ASan's
# heap-use-after-free).
img=$tmp/reload.qcow2
qemu-img create -q -f qcow2 "$img" 64M
if start "$img" "$tmp/reload.log"; then
    ok=1
    ctl bitmap add B --persistent >/dev/null || ok=0
    # A client's write: B marked, stored at the release.
    qemu-io -f raw -c 'write -P 0x61 4M 64k' "$(rw)" >/dev/null || ok=0
    qemu-img bitmap --add "$img" C || ok=0
    ctl backup start x --nbd "unix:$VIEW" --bitmap B >/dev/null || ok=0
    dirty=$(nbdinfo --map=qemu:dirty-bitmap:B "$(view x)" 2>/dev/null |
        awk '$3 == 1 { s += $2 } END { print s + 0 }')
    ctl backup finish x >/dev/null || ok=0
    names=$(ctl bitmap list | jget '" ".join(sorted(b["name"] for b in d["bitmaps"]))')
    stop || ok=0
    if ((ok)) && [[ $dirty == 65536 && $names == "B C" ]]; then
        pass "backup start's claim loads the image's bitmaps again (another process added one): the backup takes B as loaded (its 64 KiB dirty in the view), nothing freed under it"
    else
        fail "the bitmap after the claim" "ok $ok, view's B $dirty dirty, bitmaps '$names', $(grep -m1 ERROR "$tmp/reload.log")"
    fi
else
    fail "vblkd starts (reload)" "$(tail -3 "$tmp/reload.log")"
fi

# ---- The status of chunks kept on a raw disk --------------------------------------
# A raw disk's status is not asked before a copy (not cheap: lseek); a
# chunk kept then is data of the image itself, depth 1, as it was (before,
# depth 0: "no layer has it, reads as zeroes").
img=$tmp/depth.raw
truncate -s 64M "$img"
qemu-io -f raw -c 'write -P 0x71 0 16M' "$img" >/dev/null
if start "$img" "$tmp/depth.log"; then
    ctl backup start dv --nbd "unix:$VIEW" >/dev/null
    nbdinfo --map=qemu:allocation-depth "$(view dv)" >"$tmp/depth0.map"
    nbdinfo --map "$(view dv)" >"$tmp/base0.map"
    qemu-io -f raw -c 'write -P 0x72 1M 64k' -c 'write -P 0x73 8M 64k' "$(rw)" >/dev/null
    nbdinfo --map=qemu:allocation-depth "$(view dv)" >"$tmp/depth1.map"
    nbdinfo --map "$(view dv)" >"$tmp/base1.map"
    saved=$(ctl backup list | jget 'd["backups"][0]["saved_chunks"]')
    ctl backup finish dv >/dev/null
    if ((saved == 2)) && [[ -s $tmp/depth0.map ]] && cmp -s "$tmp/depth0.map" "$tmp/depth1.map" &&
        cmp -s "$tmp/base0.map" "$tmp/base1.map"; then
        pass "raw: chunks kept by writes at 1M and 8M keep the view's qemu:allocation-depth (1) and base:allocation (data) as they were"
    else
        fail "raw: status of kept chunks" "saved $saved; depth $(diff "$tmp/depth0.map" "$tmp/depth1.map" | tr '\n' ' '); base $(diff "$tmp/base0.map" "$tmp/base1.map" | tr '\n' ' ')"
    fi
    stop || fail "vblkd exits cleanly (depth)" "$(tail -2 "$tmp/depth.log")"
else
    fail "vblkd starts (depth)" "$(tail -3 "$tmp/depth.log")"
fi

# ---- Two iothreads, writers racing for the same chunks ----------------------------
# Writes from two connections (two iothreads) land on the same 64 KiB chunks
# at once: one copies, the other waits for it (write_waits), woken from the
# other thread; the view still equals the instant, and every write lands.
img=$tmp/race.raw
truncate -s 64M "$img"
qemu-io -f raw -c 'write -P 0x21 0 8M' "$img" >/dev/null
if start "$img" "$tmp/race.log" --iothreads 2 --queues 2; then
    snap "$tmp/race-ref"
    ctl backup start race --nbd "unix:$VIEW" >/dev/null
    cat >"$tmp/racer.py" <<'PY'
import sys, random, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1]); r = random.Random(int(sys.argv[2]))
cookies = []
for i in range(2000):
    # 4 KiB writes over the first 2 MiB: 32 chunks, many writes each.
    cookies.append(h.aio_pwrite(bytes([int(sys.argv[2])]) * 4096, r.randrange(512) * 4096))
    while h.aio_in_flight() >= 16:
        h.poll(-1)
while h.aio_in_flight():
    h.poll(-1)
for c in cookies:
    h.aio_command_completed(c)
PY
    $PY "$tmp/racer.py" "$(rw)" 7 & r1=$!
    $PY "$tmp/racer.py" "$(rw)" 9 & r2=$!
    wait $r1; e1=$?; wait $r2; e2=$?
    nbdcopy "$(view race)" "$tmp/race-view"
    waits=$(ctl backup list | jget 'd["backups"][0]["write_waits"]')
    ctl backup finish race >/dev/null
    # Every 4 KiB of the first 2 MiB now holds one writer's byte or the old one.
    bad=$($PY -c '
import sys
d = open(sys.argv[1], "rb").read(2 << 20)
print(sum(1 for i in range(0, len(d), 4096) if d[i:i + 4096] not in (b"\x07" * 4096, b"\x09" * 4096, b"\x21" * 4096)))' "$img")
    if ((e1 == 0 && e2 == 0)) && cmp -s "$tmp/race-view" "$tmp/race-ref" && [[ $bad == 0 ]] &&
        grep -q "iothread1" "$tmp/race.log"; then
        pass "two iothreads' writers racing for the same chunks ($waits writes waited for another's copy): the view equals the instant, every write whole"
    else
        fail "racing writers" "rc $e1/$e2, $(cmp "$tmp/race-view" "$tmp/race-ref" | head -1), $bad torn blocks, waits $waits"
    fi
    stop || fail "vblkd exits cleanly after the race" "$(tail -2 "$tmp/race.log")"
else
    fail "vblkd starts (2 iothreads)" "$(tail -3 "$tmp/race.log")"
fi

# ---- The view's rate --------------------------------------------------------------
# backup start --rate paces the clients' reads of the view (shared by every
# connection and iothread): nbdcopy's 4 connections over 2 iothreads take
# at least about size / rate, reads were held (paced_reads), the view is
# still the instant; job set-rate changes it; finish with reads held.
img=$tmp/rate.raw
truncate -s 64M "$img"
qemu-io -f raw -c 'write -P 0x31 0 40M' "$img" >/dev/null
if start "$img" "$tmp/rate.log" --iothreads 2 --queues 2; then
    snap "$tmp/rate-ref"
    job=$(ctl backup start paced --nbd "unix:$VIEW" --rate 32M | jget 'd["job"]')
    qemu-io -f raw -c 'write -P 0x32 1M 8M' "$(rw)" >/dev/null
    t0=$(date +%s.%N)
    nbdcopy "$(view paced)" "$tmp/rate-view"; rc=$?
    el=$($PY -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$(date +%s.%N)")
    paced=$(ctl backup list | jget 'd["backups"][0]["paced_reads"]')
    jrate=$(ctl job list | jget '[j["rate"] for j in d["jobs"] if j["id"]=="'"$job"'"][0]')
    ctl job set-rate "$job" 1M >/dev/null
    nrate=$(ctl backup list | jget 'd["backups"][0]["rate"]')
    # A client reading at 1M/s while the backup finishes: its held reads
    # go, the export closes, nothing hangs.
    ( nbdcopy "$(view paced)" "$tmp/rate-view2" 2>/dev/null ) & cp=$!
    sleep 0.5
    # nbd remove of the view while reads are held: refused (it freed the
    # connections under the held reads before).
    rmo=$(ctl nbd remove paced 2>&1) && rmo="accepted"
    t1=$SECONDS
    ctl backup finish paced >/dev/null; frc=$?
    wait $cp
    if ((rc == 0 && frc == 0 && paced > 0 && jrate == 33554432 && nrate == 1048576)) &&
        [[ $rmo == *"is backup paced's view: use vblkctl backup finish/abort paced"* ]] &&
        $PY -c "import sys; sys.exit(float(sys.argv[1]) < 1.0)" "$el" && ((SECONDS - t1 < 10)) &&
        cmp -s "$tmp/rate-view" "$tmp/rate-ref"; then
        pass "backup --rate 32M: the 64 MiB view pulled in ${el} s by nbdcopy's connections ($paced reads held), still the instant; job set-rate changes it; nbd remove of the view refused, finish with reads held returns"
    else
        fail "the view's rate" "rc $rc/$frc, ${el} s, paced $paced, job rate $jrate, new rate $nrate, nbd remove '$rmo', $(cmp "$tmp/rate-view" "$tmp/rate-ref" | head -1)"
    fi
    stop || fail "vblkd exits cleanly after the paced backup" "$(tail -2 "$tmp/rate.log")"
else
    fail "vblkd starts (rate)" "$(tail -3 "$tmp/rate.log")"
fi

# ---- The view yields to the guest's writes ----------------------------------------
# While writes run on the disk's iothread, the view's connections take a
# small share of it (conn.c "Yielding"): requests of theirs wait (nbd
# list's yielded), the pull still ends, the view is still the instant.
# --no-yield: none waits.
img=$tmp/yield.raw
truncate -s 256M "$img"
qemu-io -f raw -c 'write -P 0x41 0 192M' "$img" >/dev/null
# The writer: nbdcopy of 16 MiB of random data over the disk's first
# 16 MiB in 4 KiB requests, again and again (a guest that keeps the
# iothread busy: a python writer did not).
head -c 16M /dev/urandom >"$tmp/yield-src"
writer_loop() {
    local end=$((SECONDS + 20))
    while ((SECONDS < end)); do
        nbdcopy --request-size=4096 --requests=32 --connections=1 "$tmp/yield-src" "$(rw)" ||
            break
    done
}
yield_round() {	# NAME START-OPTS...: yielded requests of one pull under writes in $yd
    local name=$1 y0 rc
    shift
    snap "$tmp/$name-ref"
    ctl backup start "$name" --nbd "unix:$VIEW" "$@" >/dev/null || return 1
    y0=$(ctl nbd list | jget 'd["stats"]["yielded"]')
    writer_loop & wp=$!
    sleep 0.3
    t0=$(date +%s%N)
    nbdcopy "$(view "$name")" "$tmp/$name-view"; rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    pkill -P $wp nbdcopy 2>/dev/null; kill $wp 2>/dev/null; wait $wp 2>/dev/null
    yd=$(($(ctl nbd list | jget 'd["stats"]["yielded"]') - y0))
    yf=$(ctl backup list | jget 'd["backups"][0]["yield"]')
    ctl backup finish "$name" >/dev/null && ((rc == 0)) && cmp -s "$tmp/$name-view" "$tmp/$name-ref"
}
if start "$img" "$tmp/yield.log"; then
    r=1
    if yield_round yielding && ((yd > 0)) && [[ $yf == True ]] && r=2 && y1=$yd && ms1=$ms &&
        yield_round greedy --no-yield && ((yd == 0)) && [[ $yf == False ]]; then
        pass "the view yields to the guest's writes: its requests waited ($y1 of them; the pull under writes took $ms1 ms), the pull ended and equals the instant; with --no-yield none waited ($ms ms)"
    else
        fail "the view's yielding" "round $r: yielded $yd, yield $yf"
    fi
    stop || fail "vblkd exits cleanly after yielding" "$(tail -2 "$tmp/yield.log")"
else
    fail "vblkd starts (yield)" "$(tail -3 "$tmp/yield.log")"
fi

# ---- A write parked by QoS across a whole backup ---------------------------------
# Marked when taken, parked (iops-write=1), sent after the backup's
# instant and even after its finish: the bitmap must still cover it
# (finish keeps only the marks made since the instant; the write is
# marked again as it goes, blk__remark / conn_unthrottle).
late_marks() {
    local img=$tmp/late.raw log=$tmp/late.log
    rm -f "$img"
    truncate -s 64M "$img"
    if ! start "$img" "$log"; then fail "late marks: vblkd starts" "$(tail -3 "$log")"; return; fi
    ctl bitmap add B >/dev/null
    ctl set-limits iops-write=1 >/dev/null
    $PY - "$(rw)" "$VBLKCTL" "$CTL" "$(view x)" >"$tmp/late.out" 2>&1 <<'PY'
import nbd, subprocess, sys, time
uri, vblkctl, ctlsock, view = sys.argv[1:5]
h = nbd.NBD(); h.connect_uri(uri)
bufs = [nbd.Buffer.from_bytearray(bytearray(b"\x5a" * 65536)) for _ in range(4)]
cookies = [h.aio_pwrite(bufs[i], (8 + 8 * i) << 20) for i in range(4)]
# The first goes at once; the second is taken and parked for ~1 s.
t0 = time.time()
while not h.aio_command_completed(cookies[0]):
    h.poll(1)
time.sleep(0.2)
ctl = lambda *a: subprocess.run([vblkctl, "--control", ctlsock] + list(a), check=True,
                                capture_output=True, text=True).stdout
ctl("backup", "start", "x", "--nbd", "unix:" + view.split("socket=")[1], "--bitmap", "B")
ctl("backup", "finish", "x")
early = time.time() - t0 < 0.9
for c in cookies[1:]:
    while not h.aio_command_completed(c):
        h.poll(1)
print("finished-while-parked", early)
PY
    local dirty
    dirty=$(ctl bitmap list | jget '[b for b in d["bitmaps"] if b["name"] == "B"][0]["dirty_bytes"]')
    if grep -q "finished-while-parked True" "$tmp/late.out" && [[ $dirty == $((3 * 65536)) ]]; then
        pass "late marks: a write parked by QoS across a backup's start and finish is in the bitmap afterwards (3 of 3 writes after the instant, $dirty bytes dirty)"
    else
        fail "late marks: parked write across a backup" "dirty $dirty (want $((3 * 65536))); $(cat "$tmp/late.out")"
    fi
    ctl set-limits iops-write=0 >/dev/null
    stop || fail "late marks: vblkd exits 0"
}
late_marks
