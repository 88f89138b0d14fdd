#!/usr/bin/env bash
# Persistent dirty bitmaps in qcow2 images (issue 46), judged by QEMU's own
# tools: a bitmap QEMU made (qemu-img bitmap --add) is loaded, tracks what
# vblkd's clients write and is stored back, not dropped (before: vblkd
# cleared the autoclear bit, QEMU then dropped the bitmap and its clusters
# leaked); one made with vblkctl bitmap add --persistent is listed by
# qemu-img info and exported by qemu-nbd -B with the same dirty extents
# vblkd reported; it survives a restart; QEMU carries vblkd's bitmaps on;
# after a kill -9 they still cover every write (written ahead), unless
# QEMU wrote the image meanwhile (then in use, as QEMU leaves its own); a bitmap
# directory that is not well formed refuses the image with one line and
# leaves it as it was; --persistent where it cannot be kept is refused.
# A raw disk keeps its persistent bitmaps in a bitmap file beside it (a
# qcow2 of bitmaps only, the disk its backing file): the same checks.
# Usage: test_qcow2_bitmaps.sh BUILD_DIR.  Prints PASS:/FAIL:/SKIP: lines.
set -uo pipefail
BUILD=${1:?usage: test_qcow2_bitmaps.sh BUILD_DIR}
VBLKD=$BUILD/vblkd VBLKCTL=$BUILD/vblkctl
tmp=$(mktemp -d /tmp/vblk-qbm.XXXXXX)
dpid="" hpid="" npid=""
cleanup() {
    for p in $dpid $hpid $npid; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    [[ -n ${KEEP:-} ]] || rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

for t in qemu-img qemu-io qemu-nbd nbdinfo; do
    command -v $t >/dev/null || {
        echo "SKIP: qcow2-bitmaps (no $t: scripts/deps.sh installs qemu-utils, libnbd-bin)"
        exit 0; }
done

SOCK=$tmp/n.sock CTL=$tmp/c.ctl IMG=$tmp/img.qcow2
uri() { echo "nbd+unix:///?socket=${1:-$SOCK}"; }
ctl() { "$VBLKCTL" --control "$CTL" "$@"; }
# start LOG [ARGS...]: vblkd serving $IMG over NBD only, ready.
start() {
    local log=$1; shift
    rm -f "$SOCK" "$CTL"
    "$VBLKD" --disk "$IMG" --nbd "unix:$SOCK${NBDRO:-}" --control "$CTL" "$@" >"$log" 2>&1 &
    dpid=$!
    for _ in $(seq 500); do
        [[ -S $SOCK && -S $CTL ]] && grep -q serving "$log" && return 0
        kill -0 "$dpid" 2>/dev/null || return 1
        sleep 0.01
    done
    return 1
}
stop() { kill -TERM "$dpid" 2>/dev/null; wait "$dpid"; local rc=$?; dpid=""; return $rc; }
# dirty MAP-FILE: the dirty extents of an nbdinfo --map, one "off len" per line.
dirty() { awk '$3 == 1 { print $1, $2 }' "$1"; }
# info IMAGE: "name:gran:flags" per bitmap, sorted, from qemu-img info.
info() {
    qemu-img info -U --output=json "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin).get("format-specific", {}).get("data", {})
for b in sorted(d.get("bitmaps", []), key=lambda b: b["name"]):
    print("%s:%d:%s" % (b["name"], b["granularity"], ",".join(sorted(b["flags"]))))'
}
# corruptions IMAGE: qemu-img check's count of errors (leaks not counted).
corruptions() {
    qemu-img check --output=json "$1" 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin).get("corruptions", 0))'
}

# ---- QEMU's bitmaps loaded, kept, stored; ours listed by QEMU -------------------
qemu-img create -q -f qcow2 "$IMG" 64M
qemu-io -f qcow2 -c 'write -P 1 0 1M' "$IMG" >/dev/null
qemu-img bitmap --add "$IMG" qb
qemu-img bitmap --add -g 4096 --disable "$IMG" qoff
if start "$tmp/a.log"; then
    l0=$(ctl bitmap list)
    ctl bitmap add mine --persistent --granularity 8K >/dev/null
    ctl bitmap add temp >/dev/null
    qemu-io -f raw -c 'write -P 2 8M 100k' -c 'write -P 3 30M 4k' -c 'write -z 40M 64k' \
        "$(uri)" >/dev/null
    for b in qb mine qoff; do nbdinfo --map="qemu:dirty-bitmap:$b" "$(uri)" >"$tmp/v-$b.map"; done
    l1=$(ctl bitmap list)
    stop; rc=$?
    have=$(info "$IMG")
    want=$'mine:8192:auto\nqb:65536:auto\nqoff:4096:'
    if ((rc == 0)) && [[ $l0 == *'"name": "qb"'*'"enabled": true, "persistent": true'* &&
          $l0 == *'"name": "qoff"'*'"enabled": false, "persistent": true'* &&
          $have == "$want" ]] && [[ $(corruptions "$IMG") == 0 ]] &&
       qemu-img check -q "$IMG" && [[ -n $(dirty "$tmp/v-qb.map") && -z $(dirty "$tmp/v-qoff.map") ]]; then
        pass qemu-bitmaps-kept-ours-stored-image-clean
    else
        fail qemu-bitmaps-kept-ours-stored-image-clean "rc=$rc info: $have; list: $l0; check: $(qemu-img check "$IMG" 2>&1 | head -3)"
    fi
    # qemu-nbd -B exports what vblkd stored: the same dirty extents.
    qemu-nbd -r -t -f qcow2 -B qb -B mine -k "$tmp/q.sock" "$IMG" &
    npid=$!
    for _ in $(seq 300); do [[ -S $tmp/q.sock ]] && break; sleep 0.01; done
    for b in qb mine; do nbdinfo --map="qemu:dirty-bitmap:$b" "$(uri "$tmp/q.sock")" >"$tmp/q-$b.map"; done
    kill "$npid"; wait "$npid" 2>/dev/null; npid=""
    if [[ $(dirty "$tmp/v-qb.map") == "$(dirty "$tmp/q-qb.map")" &&
          $(dirty "$tmp/v-mine.map") == "$(dirty "$tmp/q-mine.map")" &&
          $(dirty "$tmp/v-mine.map") == $'8388608 106496\n31457280 8192\n41943040 65536' ]]; then
        pass qemu-nbd-exports-the-same-dirty-extents
    else
        fail qemu-nbd-exports-the-same-dirty-extents "vblkd: $(dirty "$tmp/v-mine.map" | tr '\n' ' ') qemu-nbd: $(dirty "$tmp/q-mine.map" | tr '\n' ' ')"
    fi
else
    fail qemu-bitmaps-kept-ours-stored-image-clean "$(tail -2 "$tmp/a.log")"
fi

# ---- A restart loads them; QEMU's writes are carried into them ----------------
# QEMU (qemu-io on the image) writes with the bitmaps loaded and stores
# them; vblkd then reads QEMU's bits; a bitmap removed here goes from the
# image at the stop.
qemu-io -f qcow2 -c 'write -P 4 50M 4k' "$IMG" >/dev/null
if start "$tmp/b.log"; then
    nbdinfo --map="qemu:dirty-bitmap:mine" "$(uri)" >"$tmp/b-mine.map"
    l=$(ctl bitmap list)
    ctl bitmap remove qoff >/dev/null
    ctl bitmap clear qb >/dev/null
    stop
    if [[ $(dirty "$tmp/b-mine.map") == $'8388608 106496\n31457280 8192\n41943040 65536\n52428800 8192' &&
          $l == *'"name": "qb", "granularity": 65536, "dirty_bytes": 327680'* &&
          $(info "$IMG") == $'mine:8192:auto\nqb:65536:auto' ]] && qemu-img check -q "$IMG"; then
        pass restart-loads-bits-qemu-writes-carried-removed-goes
    else
        fail restart-loads-bits-qemu-writes-carried-removed-goes "map: $(dirty "$tmp/b-mine.map" | tr '\n' ' '); list: $l; info: $(info "$IMG")"
    fi
else
    fail restart-loads-bits-qemu-writes-carried-removed-goes "$(tail -2 "$tmp/b.log")"
fi

# ---- kill -9 with a client writing: nothing lost --------------------------------
# QEMU's own bitmaps are lost to a crash (in use: the next backup is full);
# vblkd writes its held bitmaps ahead: after kill -9 the image's bitmaps
# are in use for QEMU, but the next vblkd takes them as they are, and they
# cover the write made just before the kill (its whole region, here 1 MiB
# of the 64 MiB disk).  A clean stop after that stores them not in use.
# crash_with_write OFFSET LOG: vblkd started, an NBD client writes 4 KiB
# at OFFSET and stays connected, vblkd killed.
crash_with_write() {
    start "$2" || return 1
    /usr/bin/python3 - "$SOCK" "$tmp/held" "$1" <<'PYEOF' &
import nbd, sys, time, os
h = nbd.NBD()
h.connect_unix(sys.argv[1])
h.pwrite(b"x" * 4096, int(sys.argv[3]))
open(sys.argv[2], "w").close()
time.sleep(30)
PYEOF
    hpid=$!
    for _ in $(seq 500); do [[ -e $tmp/held ]] && break; sleep 0.01; done
    rm -f "$tmp/held"
    kill -9 "$dpid"; wait "$dpid" 2>/dev/null; dpid=""
    kill -9 "$hpid"; wait "$hpid" 2>/dev/null; hpid=""
}
if crash_with_write $((20 << 20)) "$tmp/c.log"; then
    crashed=$(info "$IMG")
    if start "$tmp/d.log"; then
        l=$(ctl bitmap list)
        nbdinfo --map="qemu:dirty-bitmap:qb" "$(uri)" >"$tmp/d-qb.map"
        qemu-io -f raw -c 'write -P 5 60M 4k' -c 'write -P 5 60M 4k' -c 'write -P 5 62M 4k' \
            "$(uri)" >/dev/null
        # One region written ahead per first write of a region: 2 here.
        ahead=$(ctl stats | grep -o '"image_bitmap_regions": [0-9]*')
        stop
        if [[ $crashed == $'mine:8192:auto,in-use\nqb:65536:auto,in-use' &&
              $l == *'"name": "qb", "granularity": 65536, "dirty_bytes": 1048576'* &&
              $(dirty "$tmp/d-qb.map") == "20971520 1048576" &&
              $(grep -c "taken as written ahead" "$tmp/d.log") == 2 &&
              $ahead == '"image_bitmap_regions": 2' &&
              $(info "$IMG") == $'mine:8192:auto\nqb:65536:auto' && $(corruptions "$IMG") == 0 ]]; then
            pass kill-9-bitmaps-written-ahead-cover-the-write-then-stored-clean
        else
            fail kill-9-bitmaps-written-ahead-cover-the-write-then-stored-clean "after crash: $crashed; list: $l; qb: $(dirty "$tmp/d-qb.map" | tr '\n' ' '); $ahead; then: $(info "$IMG")"
        fi
    else
        fail kill-9-bitmaps-written-ahead-cover-the-write-then-stored-clean "$(tail -2 "$tmp/d.log")"
    fi
else
    fail kill-9-bitmaps-written-ahead-cover-the-write-then-stored-clean "$(tail -2 "$tmp/c.log")"
fi
# The same crash, then QEMU writes the image: it clears our autoclear bit,
# so the bitmaps it did not track are in use for vblkd too (kept, one line
# each, not used); a bitmap added under the same name replaces one.
if crash_with_write $((30 << 20)) "$tmp/e.log"; then
    # (The killed vblkd's io_uring may hold the image's lock a moment.)
    for _ in $(seq 100); do
        qemu-io -f qcow2 -c 'write -P 6 2M 4k' "$IMG" >/dev/null 2>&1 && break
        sleep 0.05
    done
    if start "$tmp/f.log"; then
        l=$(ctl bitmap list)
        ctl bitmap add qb --persistent >/dev/null
        stop
        if [[ $(grep -o '"name": "[a-z]*", "granularity": [0-9]*, "enabled": true, "persistent": true, "inconsistent": true, "reason": "it is marked in use' <<<"$l" | wc -l) == 2 &&
              $l != *'"inconsistent": false'* &&
              $(grep -c "kept but not used: it is marked in use" "$tmp/f.log") == 2 &&
              $(info "$IMG") == $'mine:8192:auto,in-use\nqb:65536:auto' &&
              $(corruptions "$IMG") == 0 ]]; then
            pass kill-9-then-qemu-writes-in-use-kept-not-used-replaced-by-name
        else
            fail kill-9-then-qemu-writes-in-use-kept-not-used-replaced-by-name "list: $l; then: $(info "$IMG")"
        fi
    else
        fail kill-9-then-qemu-writes-in-use-kept-not-used-replaced-by-name "$(tail -2 "$tmp/f.log")"
    fi
else
    fail kill-9-then-qemu-writes-in-use-kept-not-used-replaced-by-name "$(tail -2 "$tmp/e.log")"
fi

# ---- Hostile bitmap directories: refused in one line, image unchanged ---------
# Each damage on a fresh image with two bitmaps (QEMU refuses all of them
# too): a table offset out of the file, a table of the wrong size, a
# name length past the directory, unknown flags, two bitmaps of one name,
# a data cluster over the L1 table, a bitmaps extension not 24 bytes long
# or with a reserved field not zero (both served before).
qemu-img create -q -f qcow2 "$tmp/h0.qcow2" 16M
qemu-img bitmap --add "$tmp/h0.qcow2" b1
qemu-img bitmap --add "$tmp/h0.qcow2" b2
qemu-io -f qcow2 -c 'write 0 64k' "$tmp/h0.qcow2" >/dev/null
damage() {	# damage KIND FILE
    /usr/bin/python3 - "$1" "$2" <<'PYEOF'
import struct, sys
kind, path = sys.argv[1], sys.argv[2]
f = open(path, "r+b"); h = f.read(65536)
cs = 1 << struct.unpack(">I", h[20:24])[0]
l1 = struct.unpack(">Q", h[40:48])[0]
p = struct.unpack(">I", h[100:104])[0]
while True:
    t, n = struct.unpack(">II", h[p:p + 8])
    if t == 0x23852875: break
    p += 8 + (n + 7) // 8 * 8
nb, _, dsz, doff = struct.unpack(">IIQQ", h[p + 8:p + 32])
f.seek(doff); d = bytearray(f.read(dsz))
e1 = 0; e2 = (24 + struct.unpack(">H", d[18:20])[0] + 7) // 8 * 8
if kind == "table-outside": d[0:8] = struct.pack(">Q", 1 << 40)
if kind == "table-size": d[8:12] = struct.pack(">I", 7)
if kind == "name-past-end": d[e2 + 18:e2 + 20] = struct.pack(">H", 1000)
if kind == "unknown-flags": d[12:16] = struct.pack(">I", 0x80 | 2)
if kind == "same-names": d[e2 + 24:e2 + 26] = d[24:26]
if kind == "name-newline": d[e2 + 25] = 0x0a
if kind == "dir-refcount-0":
    order = struct.unpack(">I", h[96:100])[0]
    rt = struct.unpack(">Q", h[48:56])[0]
    per = cs * 8 >> order
    idx = doff // cs
    f.seek(rt + 8 * (idx // per)); blk = struct.unpack(">Q", f.read(8))[0]
    f.seek(blk + (idx % per) * (1 << order) // 8); f.write(bytes((1 << order) // 8))
if kind == "ext-length":
    f.seek(p + 4); f.write(struct.pack(">I", 32))
if kind == "ext-reserved":
    f.seek(p + 12); f.write(struct.pack(">I", 1))
if kind == "data-over-l1":
    # b1's table entry 0 points at the L1 table's cluster.
    toff = struct.unpack(">Q", d[0:8])[0]
    f.seek(toff); f.write(struct.pack(">Q", l1 // cs * cs))
f.seek(doff); f.write(d); f.close()
PYEOF
}
hbad=()
for k in table-outside table-size name-past-end unknown-flags same-names data-over-l1 \
         ext-length ext-reserved; do
    cp "$tmp/h0.qcow2" "$tmp/h.qcow2"
    damage "$k" "$tmp/h.qcow2"
    s0=$(sha256sum "$tmp/h.qcow2" | cut -d' ' -f1)
    qemu-img info "$tmp/h.qcow2" >/dev/null 2>&1 && qok=1 || qok=0
    out=$(timeout 10 "$VBLKD" --disk "$tmp/h.qcow2" --nbd "unix:$tmp/h.sock" 2>&1); rc=$?
    if ((rc == 0 || rc == 124)) || (($(wc -l <<<"$out") != 1)) || [[ $out != *"is corrupt"*bitmap* ]] ||
       [[ $(sha256sum "$tmp/h.qcow2" | cut -d' ' -f1) != "$s0" ]]; then
        hbad+=("$k: rc=$rc qemu-img info ok=$qok: $out")
    fi
done
((${#hbad[@]} == 0)) && pass hostile-bitmap-directories-refused-one-line-unchanged ||
    fail hostile-bitmap-directories-refused-one-line-unchanged "${hbad[*]}"
# The bitmap directory's cluster with refcount 0: marked corrupt when the
# image becomes ours, naming it, before any write (before: found by the
# first write's store, "a refcount would drop below zero").
cp "$tmp/h0.qcow2" "$tmp/h.qcow2"
damage dir-refcount-0 "$tmp/h.qcow2"
IMG=$tmp/h.qcow2
if start "$tmp/rc0.log"; then
    qemu-io -f raw -c 'write 1M 4k' "$(uri)" >/dev/null 2>&1; wrc=$?
    stop
    if ((wrc != 0)) && grep -q "is corrupt: the bitmap directory has refcount 0, not 1" "$tmp/rc0.log"; then
        pass bitmap-directory-refcount-0-marked-corrupt-before-writes
    else
        fail bitmap-directory-refcount-0-marked-corrupt-before-writes "rc=$wrc $(grep -i corrupt "$tmp/rc0.log" | head -2)"
    fi
else
    fail bitmap-directory-refcount-0-marked-corrupt-before-writes "$(tail -2 "$tmp/rc0.log")"
fi
# A name QEMU allows and vblkd does not take (a newline in it): served,
# that bitmap kept but not used, every log line one line.
cp "$tmp/h0.qcow2" "$tmp/h.qcow2"
damage name-newline "$tmp/h.qcow2"
IMG=$tmp/h.qcow2
if start "$tmp/nl.log"; then
    l=$(ctl bitmap list)
    stop
    if [[ $l == *'"name": "b1", "granularity": 65536, "dirty_bytes": 65536'* &&
          $l == *'"inconsistent": true, "reason": "vblkd takes names'* ]] &&
       grep -q "bitmap 'b?' is kept but not used" "$tmp/nl.log" &&
       ! grep -q "^[^v]" "$tmp/nl.log"; then
        pass bitmap-name-with-newline-kept-not-used-one-line-logs
    else
        fail bitmap-name-with-newline-kept-not-used-one-line-logs "$l; $(grep -v '^vblkd' "$tmp/nl.log" | head -2)"
    fi
else
    fail bitmap-name-with-newline-kept-not-used-one-line-logs "$(tail -2 "$tmp/nl.log")"
fi

# ---- --persistent where it cannot be kept ------------------------------------
qemu-img create -q -f qcow2 -o compat=0.10 "$tmp/v2.qcow2" 16M
truncate -s 16M "$tmp/r.raw"
rbad=()
for d in "$tmp/v2.qcow2:version 2:" "$tmp/r.raw:this disk has neither:--read-only"; do
    IMG=${d%%:*}
    ro=${d##*:}
    d=${d%:*}
    NBDRO=${ro:+,read-only}
    if start "$tmp/p.log" $ro; then
        out=$(ctl bitmap add p --persistent 2>&1); rc=$?
        l=$(ctl bitmap list)
        stop
        { ((rc != 0)) && (($(wc -l <<<"$out") == 1)) && [[ $out == *"${d#*:}"* && $l == '{ "bitmaps": [ ] }' ]]; } ||
            rbad+=("$IMG: rc=$rc $out $l")
    else
        rbad+=("$IMG: $(tail -1 "$tmp/p.log")")
    fi
done
NBDRO=
((${#rbad[@]} == 0)) && pass persistent-refused-where-it-cannot-be-kept ||
    fail persistent-refused-where-it-cannot-be-kept "${rbad[*]}"

# ---- QEMU's limits: refused at the command, not found at the store -------------
# A 17 TiB disk at 4 KiB granularity is 544 MiB of bitmap data, QEMU allows
# 512 MiB (BME_MAX_PHYS_SIZE): bitmap add --persistent is refused with one
# line, and so is a resize that would take a held bitmap past it.  Before,
# both were taken; the store wrote a directory that neither QEMU nor vblkd
# opened again.
IMG=$tmp/big.qcow2
qemu-img create -q -f qcow2 "$IMG" 17T
if start "$tmp/big.log"; then
    out=$(ctl bitmap add big --persistent --granularity 4096 2>&1); rc=$?
    ctl bitmap add ok --persistent --granularity 1M >/dev/null
    qemu-io -f raw -c 'write 0 4k' "$(uri)" >/dev/null
    stop
    if ((rc != 0)) && (($(wc -l <<<"$out") == 1)) && [[ $out == *"larger granularity"* &&
          $(info "$IMG") == "ok:1048576:auto" ]] && qemu-img check -q "$IMG" &&
       start "$tmp/big2.log"; then
        stop
        pass persistent-bitmap-past-qemu-limits-refused-at-add
    else
        fail persistent-bitmap-past-qemu-limits-refused-at-add "rc=$rc $out; info: $(info "$IMG"); $(qemu-img check "$IMG" 2>&1 | head -2)"
    fi
else
    fail persistent-bitmap-past-qemu-limits-refused-at-add "$(tail -2 "$tmp/big.log")"
fi
qemu-img create -q -f qcow2 "$IMG" 64M
if start "$tmp/big3.log"; then
    ctl bitmap add small --persistent --granularity 4096 >/dev/null
    out=$(ctl resize 17T 2>&1); rc=$?
    qemu-io -f raw -c 'write 0 4k' "$(uri)" >/dev/null
    stop
    if ((rc != 0)) && (($(wc -l <<<"$out") == 1)) && [[ $out == *"larger granularity"* &&
          $(info "$IMG") == "small:4096:auto" ]] && qemu-img check -q "$IMG" &&
       [[ $(qemu-img info --output=json "$IMG" | grep -o '"virtual-size": [0-9]*') == '"virtual-size": 67108864' ]]; then
        pass resize-past-qemu-bitmap-limits-refused
    else
        fail resize-past-qemu-bitmap-limits-refused "rc=$rc $out; info: $(info "$IMG")"
    fi
else
    fail resize-past-qemu-bitmap-limits-refused "$(tail -2 "$tmp/big3.log")"
fi
# A bitmap vblkd keeps but does not track (a name it does not take): a
# resize would leave its table sized for the old disk, and QEMU then
# refuses the image; refused with one line, as QEMU refuses a resize with
# bitmaps it did not load (qcow2_truncate_bitmaps_check).
qemu-img create -q -f qcow2 "$IMG" 64M
qemu-img bitmap --add --disable -g 512 "$IMG" "nightly backup"
if start "$tmp/big4.log"; then
    out=$(ctl resize 128M 2>&1); rc=$?
    stop
    if ((rc != 0)) && (($(wc -l <<<"$out") == 1)) && [[ $out == *"nightly backup"*"not tracked"* ]] &&
       qemu-img check -q "$IMG" && [[ $(info "$IMG") == "nightly backup:512:" ]] &&
       [[ $(qemu-img info --output=json "$IMG" | grep -o '"virtual-size": [0-9]*') == '"virtual-size": 67108864' ]]; then
        pass resize-with-an-untracked-bitmap-refused
    else
        fail resize-with-an-untracked-bitmap-refused "rc=$rc $out; info: $(info "$IMG"); $(qemu-img check "$IMG" 2>&1 | head -2)"
    fi
else
    fail resize-with-an-untracked-bitmap-refused "$(tail -2 "$tmp/big4.log")"
fi
# vblkd's write-ahead extension names the held bitmaps in cluster 0: 71
# names of 61 bytes do not fit a 4 KiB cluster.  Writes go on, the
# bitmaps kept in use as QEMU keeps its own (one warning), no cluster
# leaked.  Before, every write failed with ENOSPC, leaking clusters.
qemu-img create -q -f qcow2 -o cluster_size=4096 "$IMG" 64M
if start "$tmp/wx.log"; then
    for i in $(seq -w 1 71); do
        ctl bitmap add "b$i$(printf 'x%.0s' $(seq 58))" --persistent >/dev/null
    done
    qemu-io -f raw -c 'write 0 4k' -c 'write 8M 4k' "$(uri)" >"$tmp/wx.out" 2>&1; wrc=$?
    stop
    if ((wrc == 0)) && ! grep -qi error "$tmp/wx.out" && [[ $(info "$IMG" | wc -l) == 71 ]] &&
       qemu-img check -q "$IMG" && (($(grep -c "do not fit" "$tmp/wx.log") == 1)); then
        pass write-ahead-extension-too-big-writes-go-on-bitmaps-in-use
    else
        fail write-ahead-extension-too-big-writes-go-on-bitmaps-in-use "rc=$wrc $(head -c 200 "$tmp/wx.out"); $(info "$IMG" | wc -l) bitmaps; $(qemu-img check "$IMG" 2>&1 | tail -2)"
    fi
else
    fail write-ahead-extension-too-big-writes-go-on-bitmaps-in-use "$(tail -2 "$tmp/wx.log")"
fi

# ---- Differential: QSD's bitmap of the same writes ---------------------------
# The same writes (the guest's path: vblk-bench sequential 4 KiB writes of
# 1 MiB at 5 MiB; an NBD client: an unaligned write, a discard, write
# zeroes, a write across a chunk boundary) into vblkd with a bitmap and
# into qemu-storage-daemon with one (QMP block-dirty-bitmap-add, exported
# with the NBD export's bitmaps; discard=unmap, as vblkd discards, where
# QEMU's default ignores them and marks nothing): nbdinfo --map of both
# bitmaps is the same.
if command -v qemu-storage-daemon >/dev/null; then
    truncate -s 64M "$tmp/d1.raw" "$tmp/d2.raw"
    nbdw() {	# nbdw URI: the NBD client's writes
        qemu-io -f raw -c 'write 20971520 100' -c 'discard 10M 1M' -c 'write -z 12M 64k' \
            -c 'write 33554000 1000' "$1" >/dev/null
    }
    BENCH=$BUILD/vblk-bench
    IMG=$tmp/d1.raw
    if start "$tmp/g.log" --socket "$tmp/g-vu.sock"; then
        ctl bitmap add b >/dev/null
        "$BENCH" --socket "$tmp/g-vu.sock" --rw write --bs 4k --size 1M --offset 5M \
            --runtime 0.3 --ramp 0 >/dev/null 2>&1
        nbdw "$(uri)"
        nbdinfo --map=qemu:dirty-bitmap:b "$(uri)" >"$tmp/g-vblkd.map"
        stop
    fi
    rm -f "$tmp/qsd-vu.sock" "$tmp/qsd-qmp.sock" "$tmp/qsd-nbd.sock"
    qemu-storage-daemon --blockdev "driver=file,node-name=d0,filename=$tmp/d2.raw,discard=unmap" \
        --chardev "socket,path=$tmp/qsd-qmp.sock,server=on,wait=off,id=m0" --monitor chardev=m0 \
        --export "type=vhost-user-blk,id=e0,node-name=d0,addr.type=unix,addr.path=$tmp/qsd-vu.sock,writable=on" \
        >"$tmp/qsd.log" 2>&1 &
    qpid=$!
    for _ in $(seq 300); do [[ -S $tmp/qsd-qmp.sock && -S $tmp/qsd-vu.sock ]] && break; sleep 0.02; done
    qmp=$(dirname "$0")/../guest/qmp.py
    python3 "$qmp" "$tmp/qsd-qmp.sock" block-dirty-bitmap-add '{"node": "d0", "name": "b"}' >/dev/null &&
    python3 "$qmp" "$tmp/qsd-qmp.sock" nbd-server-start \
        "{\"addr\": {\"type\": \"unix\", \"data\": {\"path\": \"$tmp/qsd-nbd.sock\"}}}" >/dev/null &&
    python3 "$qmp" "$tmp/qsd-qmp.sock" block-export-add \
        '{"type": "nbd", "id": "n0", "node-name": "d0", "name": "", "writable": true, "bitmaps": ["b"]}' >/dev/null
    "$BENCH" --socket "$tmp/qsd-vu.sock" --rw write --bs 4k --size 1M --offset 5M \
        --runtime 0.3 --ramp 0 >/dev/null 2>&1
    nbdw "$(uri "$tmp/qsd-nbd.sock")"
    nbdinfo --map=qemu:dirty-bitmap:b "$(uri "$tmp/qsd-nbd.sock")" >"$tmp/g-qsd.map" 2>&1
    kill "$qpid"; wait "$qpid" 2>/dev/null
    if [[ -s $tmp/g-vblkd.map && -n $(dirty "$tmp/g-qsd.map") &&
          $(dirty "$tmp/g-vblkd.map") == "$(dirty "$tmp/g-qsd.map")" ]]; then
        pass bitmap-same-as-qsd-for-the-same-writes
    else
        fail bitmap-same-as-qsd-for-the-same-writes "vblkd: $(dirty "$tmp/g-vblkd.map" | tr '\n' ' ') qsd: $(dirty "$tmp/g-qsd.map" | tr '\n' ' ') $(tail -2 "$tmp/qsd.log")"
    fi
else
    echo "SKIP: bitmap-same-as-qsd-for-the-same-writes (no qemu-storage-daemon)"
fi

# ---- A raw disk's bitmap file ----------------------------------------------
# --persistent on a raw disk makes DISK.bitmaps.qcow2 (qcow2, the disk its
# backing file, no data): the guest's and an NBD client's writes tracked,
# stored; qemu-img info lists it, qemu-img check finds it clean, qemu-nbd
# -r -B on the bitmap file exports the same dirty extents and the disk's
# own bytes (through the backing file); a restart loads it; a kill -9
# after a write leaves it covering the write (written ahead).
IMG=$tmp/rd.raw BMF=$tmp/rd.raw.bitmaps.qcow2
truncate -s 64M "$IMG"
if start "$tmp/r1.log" --socket "$tmp/r-vu.sock"; then
    ctl bitmap add rb --persistent >/dev/null
    made=$([[ -f $BMF ]] && echo yes)
    "$BUILD/vblk-bench" --socket "$tmp/r-vu.sock" --rw write --bs 4k --size 1M --offset 5M \
        --runtime 0.3 --ramp 0 >/dev/null 2>&1
    qemu-io -f raw -c 'write -P 9 8M 100k' "$(uri)" >/dev/null
    nbdinfo --map="qemu:dirty-bitmap:rb" "$(uri)" >"$tmp/r-v.map"
    stop
    qemu-nbd -r -t -B rb -k "$tmp/rq.sock" "$BMF" >/dev/null 2>&1 &
    npid=$!
    for _ in $(seq 300); do [[ -S $tmp/rq.sock ]] && break; sleep 0.01; done
    nbdinfo --map="qemu:dirty-bitmap:rb" "$(uri "$tmp/rq.sock")" >"$tmp/r-q.map"
    nbdcopy "$(uri "$tmp/rq.sock")" "$tmp/rd.copy"
    kill "$npid"; wait "$npid" 2>/dev/null; npid=""
    if [[ $made == yes && $(info "$BMF") == "rb:65536:auto" && $(corruptions "$BMF") == 0 &&
          $(dirty "$tmp/r-v.map") == $'5242880 1048576\n8388608 131072' &&
          $(dirty "$tmp/r-q.map") == "$(dirty "$tmp/r-v.map")" ]] && cmp -s "$tmp/rd.copy" "$IMG"; then
        pass raw-bitmap-file-made-stored-read-by-qemu-nbd
    else
        fail raw-bitmap-file-made-stored-read-by-qemu-nbd "made=$made info: $(info "$BMF"); vblkd: $(dirty "$tmp/r-v.map" | tr '\n' ' '); qemu-nbd: $(dirty "$tmp/r-q.map" | tr '\n' ' ')"
    fi
else
    fail raw-bitmap-file-made-stored-read-by-qemu-nbd "$(tail -2 "$tmp/r1.log")"
fi
if crash_with_write $((20 << 20)) "$tmp/r2.log"; then
    if start "$tmp/r3.log"; then
        l=$(ctl bitmap list)
        nbdinfo --map="qemu:dirty-bitmap:rb" "$(uri)" >"$tmp/r3.map"
        stop
        if [[ $(dirty "$tmp/r3.map") == $'5242880 1048576\n8388608 131072\n20971520 1048576' &&
              $l == *'"inconsistent": false'* ]] && grep -q "taken as written ahead" "$tmp/r3.log"; then
            pass raw-bitmap-file-kill-9-covers-the-write
        else
            fail raw-bitmap-file-kill-9-covers-the-write "$(dirty "$tmp/r3.map" | tr '\n' ' '); $l"
        fi
    else
        fail raw-bitmap-file-kill-9-covers-the-write "$(tail -2 "$tmp/r3.log")"
    fi
else
    fail raw-bitmap-file-kill-9-covers-the-write "$(tail -2 "$tmp/r2.log")"
fi
# Another disk's bitmap file where this one's should be: refused, one line.
truncate -s 64M "$tmp/other.raw"
cp "$BMF" "$tmp/other.raw.bitmaps.qcow2"
IMG=$tmp/other.raw
out=$(timeout 10 "$VBLKD" --disk "$IMG" --nbd "unix:$tmp/o.sock" 2>&1); rc=$?
if ((rc != 0 && rc != 124)) && (($(wc -l <<<"$out") == 1)) && [[ $out == *"is not the bitmap file of"* ]]; then
    pass raw-bitmap-file-of-another-disk-refused-one-line
else
    fail raw-bitmap-file-of-another-disk-refused-one-line "rc=$rc: $out"
fi

# ---- A resize with no client: the bitmaps grown before the release -------------
# The release stores the bitmaps: grown first, they are stored at the new
# size.  Before, the release stored without the not yet grown bitmap and
# dropped its entry: a kill -9 then lost it.
IMG=$tmp/rs.qcow2
qemu-img create -q -f qcow2 "$IMG" 64M
if start "$tmp/rs.log"; then
    ctl bitmap add rs --persistent >/dev/null
    ctl resize 128M >/dev/null
    kill -9 "$dpid"; wait "$dpid" 2>/dev/null; dpid=""
    if [[ $(info "$IMG") == "rs:65536:auto" ]] && qemu-img check -q "$IMG"; then
        pass resize-without-a-client-stores-the-grown-bitmaps
    else
        fail resize-without-a-client-stores-the-grown-bitmaps "info: $(info "$IMG")"
    fi
else
    fail resize-without-a-client-stores-the-grown-bitmaps "$(tail -2 "$tmp/rs.log")"
fi

# ---- A raw disk's bitmap file grows with the disk -------------------------------
# vblkctl resize grows the bitmap file's qcow2 too, and a disk grown while
# vblkd was down (truncate) grows it at the next claim: the bitmap keeps
# every write and qemu-img finds the file clean.  Before, the store left
# the bitmap out, and the next start refused the disk ("it is for a disk
# of another size").
IMG=$tmp/gr.raw BMF=$tmp/gr.raw.bitmaps.qcow2
truncate -s 64M "$IMG"
if start "$tmp/gr1.log"; then
    ctl bitmap add rb --persistent >/dev/null
    qemu-io -f raw -c 'write 1M 64k' "$(uri)" >/dev/null
    ctl resize 128M >/dev/null
    qemu-io -f raw -c 'write 100M 64k' "$(uri)" >/dev/null
    stop
fi
truncate -s 192M "$IMG"
if start "$tmp/gr2.log"; then
    qemu-io -f raw -c 'write 150M 64k' "$(uri)" >/dev/null
    nbdinfo --map="qemu:dirty-bitmap:rb" "$(uri)" >"$tmp/gr.map"
    stop
    vs=$(qemu-img info --output=json "$BMF" | grep -o '"virtual-size": [0-9]*')
    if [[ $(dirty "$tmp/gr.map") == $'1048576 65536
104857600 65536
157286400 65536' &&
          $(info "$BMF") == "rb:65536:auto" && $vs == '"virtual-size": 201326592' ]] &&
       qemu-img check -q "$BMF"; then
        pass raw-bitmap-file-grows-with-the-disk
    else
        fail raw-bitmap-file-grows-with-the-disk "map: $(dirty "$tmp/gr.map" | tr '\n' ' '); info: $(info "$BMF"); $vs"
    fi
else
    fail raw-bitmap-file-grows-with-the-disk "$(tail -2 "$tmp/gr2.log")"
fi

# ---- A raw disk's bitmap through a hand-over A -> B -> A ----------------------
# Two vblkds on one raw disk, as the two hosts of a migration on shared
# storage: the disk goes where a client (a guest's rings, here an NBD
# client) holds it.  The bitmap is added on A after B started (B has no
# bitmap file yet); B takes it at its claim and tracks B's writes; A takes
# them back at its next claim.  Before, B ignored a bitmap file made after
# it started, and B's writes were lost from the bitmap.
IMG=$tmp/ho.raw
truncate -s 64M "$IMG"
SA=$tmp/ha.sock SB=$tmp/hb.sock CA=$tmp/ha.ctl CB=$tmp/hb.ctl
"$VBLKD" --disk "$IMG" --nbd "unix:$SA" --control "$CA" >"$tmp/ha.log" 2>&1 & hpid=$!
"$VBLKD" --disk "$IMG" --nbd "unix:$SB" --control "$CB" >"$tmp/hb.log" 2>&1 & npid=$!
for _ in $(seq 500); do [[ -S $SA && -S $SB && -S $CA && -S $CB ]] && break; sleep 0.01; done
"$VBLKCTL" --control "$CA" bitmap add hop --persistent >/dev/null
qemu-io -f raw -c 'write -P 1 1M 64k' "$(uri "$SA")" >/dev/null
qemu-io -f raw -c 'write -P 2 9M 64k' "$(uri "$SB")" >/dev/null
nbdinfo --map=qemu:dirty-bitmap:hop "$(uri "$SB")" >"$tmp/hb.map" 2>&1
qemu-io -f raw -c 'write -P 3 17M 64k' "$(uri "$SA")" >/dev/null
nbdinfo --map=qemu:dirty-bitmap:hop "$(uri "$SA")" >"$tmp/ha.map" 2>&1
want=$'1048576 65536\n9437184 65536\n17825792 65536'
if [[ $(dirty "$tmp/ha.map") == "$want" ]] && [[ $(dirty "$tmp/hb.map") == $'1048576 65536\n9437184 65536' ]]; then
    pass raw-bitmap-file-follows-the-disk-A-to-B-to-A
else
    fail raw-bitmap-file-follows-the-disk-A-to-B-to-A "B: $(dirty "$tmp/hb.map" | tr '\n' ' ') A: $(dirty "$tmp/ha.map" | tr '\n' ' ') ($(head -c 200 "$tmp/hb.map"))"
fi
kill -TERM "$hpid" "$npid"; wait "$hpid" "$npid"; hpid="" npid=""
