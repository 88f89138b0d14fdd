#!/usr/bin/env bash
# LUKS disks: made by cryptsetup (LUKS2 with 4096- and 512-byte sectors,
# LUKS1) and by qemu-img (LUKS1), read and written through vblkd's format
# layer and judged by oracles that are not vblkd: QEMU's luks driver
# (qemu-io, qemu-img convert) and an AES-XTS decryption with the volume key
# cryptsetup dumps (luks_oracle.py, python3-cryptography).  Then vblkd
# itself serving a LUKS disk to vblk-bench --verify, the key kept out of
# the command line, the logs, stats, metrics and a core dump, and each bad
# input (no key, a wrong one, another cipher, a damaged header) refused
# with one line.  Usage: test_luks.sh BUILD_DIR.  PASS:/FAIL:/SKIP: lines.
set -uo pipefail
BUILD=${1:?usage: test_luks.sh BUILD_DIR}
VBLKD=$BUILD/vblkd BENCH=$BUILD/vblk-bench CTL=$BUILD/vblkctl FMTIO=$BUILD/fmt-io
here=$(cd "$(dirname "$0")" && pwd)
ORACLE="/usr/bin/python3 $here/luks_oracle.py"
tmp=$(mktemp -d /tmp/vblk-luks.XXXXXX)
dpid=""
loopdev=""
cleanup() {
    [[ -n $dpid ]] && kill "$dpid" 2>/dev/null; wait 2>/dev/null
    [[ -n $loopdev ]] && losetup -d "$loopdev" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }

for t in cryptsetup qemu-img qemu-io gdb; do
    command -v $t >/dev/null || { echo "SKIP: luks (no $t: scripts/deps.sh installs it)"; exit 0; }
done
/usr/bin/python3 -c 'import cryptography' 2>/dev/null ||
    { echo "SKIP: luks (no python3-cryptography: scripts/deps.sh installs it)"; exit 0; }
# Built with LUKS: vblkd links libcryptsetup.  (grep -c, not -q: under
# pipefail an early exit of grep kills the writer with SIGPIPE.)
if (($(ldd "$VBLKD" 2>/dev/null | grep -c libcryptsetup) == 0)) || [[ ! -x $FMTIO ]]; then
    echo "SKIP: luks (vblkd built without libcryptsetup)"; exit 0
fi

pw="correct horse battery $RANDOM$RANDOM"
printf '%s' "$pw" >"$tmp/key"
fast=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)

# roundtrip NAME IMAGE: the oracle encrypts random data into the payload,
# the format layer reads it all back (fmt-io, 0 requests: the whole-disk
# compare), then writes and reads at random, and the oracle decrypts the
# payload to exactly what was written.
roundtrip() {
    local name=$1 img=$2 out
    head -c 24M /dev/urandom >"$tmp/$name.plain"
    if ! $ORACLE encrypt "$img" "$tmp/key" "$tmp/$name.plain" 2>"$tmp/$name.err"; then
        fail "$name" "oracle: $(tail -1 "$tmp/$name.err")"; return 1
    fi
    $ORACLE decrypt "$img" "$tmp/key" "$tmp/$name.model"
    if ! out=$("$FMTIO" "$img" "$tmp/$name.model" 1 0 --key-file "$tmp/key" 2>&1); then
        fail "$name-reads-what-the-oracle-wrote" "$out"; return 1
    fi
    pass "$name-reads-what-the-oracle-wrote"
    if ! out=$("$FMTIO" "$img" "$tmp/$name.model" 2 300 --key-file "$tmp/key" 2>&1); then
        fail "$name-writes-the-oracle-reads" "$out"; return 1
    fi
    $ORACLE decrypt "$img" "$tmp/key" "$tmp/$name.after"
    if cmp -s "$tmp/$name.after" "$tmp/$name.model"; then pass "$name-writes-the-oracle-reads"
    else fail "$name-writes-the-oracle-reads" "the oracle's decryption differs"; return 1; fi
    # Buffers that split sectors (700 + 1300 + the rest): the sectors
    # across them go through the scratch sector, both ways.
    if ! out=$("$FMTIO" "$img" "$tmp/$name.model" 5 300 --key-file "$tmp/key" --split on 2>&1)
    then
        fail "$name-split-buffers" "$out"; return 1
    fi
    $ORACLE decrypt "$img" "$tmp/key" "$tmp/$name.after"
    if cmp -s "$tmp/$name.after" "$tmp/$name.model"; then pass "$name-split-buffers"
    else fail "$name-split-buffers" "the oracle's decryption differs"; fi
}

truncate -s 40M "$tmp/l2.img"
cryptsetup luksFormat -q --type luks2 "${fast[@]}" --key-file "$tmp/key" "$tmp/l2.img"
roundtrip luks2-4k-sectors "$tmp/l2.img"
truncate -s 40M "$tmp/l2s.img"
cryptsetup luksFormat -q --type luks2 --sector-size 512 --key-size 256 "${fast[@]}" \
    --key-file "$tmp/key" "$tmp/l2s.img"
roundtrip luks2-512-sectors-aes128 "$tmp/l2s.img"
truncate -s 40M "$tmp/l1.img"
cryptsetup luksFormat -q --type luks1 "${fast[@]}" --key-file "$tmp/key" "$tmp/l1.img"
roundtrip luks1-cryptsetup "$tmp/l1.img"

# LUKS1 by qemu-img, data by QEMU's luks driver: vblkd reads it; vblkd's
# writes: QEMU's luks driver reads them back.
sec=(--object "secret,id=s0,file=$tmp/key")
qopts="driver=luks,key-secret=s0,file.filename=$tmp/q.img"
# qemu-img times 32768 PBKDF2 rounds by the thread's CPU time, in whole
# milliseconds, and gives up ("Unable to get accurate CPU usage") when that
# reads 0: on a fast CPU with tick-based accounting it can, whatever
# iter-time says (crypto/pbkdf.c).  SHA-512 rounds take ~2x as long as
# SHA-256 ones (no SHA-NI for them), and that one failure is retried.
for try in 1 2 3 4 5; do
    rm -f "$tmp/q.img"
    qemu-img create -q -f luks "${sec[@]}" -o key-secret=s0,iter-time=10,hash-alg=sha512 \
        "$tmp/q.img" 24M 2>"$tmp/q.err" && break
    grep -q "accurate CPU usage" "$tmp/q.err" || break
done
[[ -s $tmp/q.err ]] && echo "    qemu-img create (try $try): $(tail -1 "$tmp/q.err")"
qemu-io "${sec[@]}" --image-opts "$qopts" -c "write -P 0xa7 0 1M" -c "write -P 0x3c 5M 3M" \
    >/dev/null
qemu-img convert "${sec[@]}" --image-opts "$qopts" -O raw "$tmp/q.model"
if out=$("$FMTIO" "$tmp/q.img" "$tmp/q.model" 3 0 --key-file "$tmp/key" 2>&1); then
    pass luks1-qemu-img-reads-what-qemu-wrote
else fail luks1-qemu-img-reads-what-qemu-wrote "$out"; fi
if out=$("$FMTIO" "$tmp/q.img" "$tmp/q.model" 4 300 --key-file "$tmp/key" 2>&1) &&
   qemu-img convert "${sec[@]}" --image-opts "$qopts" -O raw "$tmp/q.after" &&
   cmp -s "$tmp/q.after" "$tmp/q.model"; then
    pass luks1-qemu-reads-what-vblkd-wrote
else fail luks1-qemu-reads-what-vblkd-wrote "${out:-qemu-img convert differs}"; fi

# vblkd serving a LUKS disk: vblk-bench verifies; the key appears in no
# log line, no stats or metrics, not in /proc/PID/cmdline, not in a core
# dump (gcore); the volume key neither.
vk=$(cryptsetup luksDump --dump-volume-key -q --key-file "$tmp/key" "$tmp/l2.img" |
     sed -n '/MK dump/,$p' | grep -oE '\b[0-9a-f]{2}\b' | tr -d '\n')
rm -f "$tmp/d.sock" "$tmp/c.sock"
"$VBLKD" --socket "$tmp/d.sock" --disk "$tmp/l2.img" --key-file - --control "$tmp/c.sock" \
    --log-level debug <"$tmp/key" >"$tmp/v.log" 2>&1 &
dpid=$!
for _ in $(seq 200); do [[ -S $tmp/c.sock ]] && break; sleep 0.05; done
out=$("$BENCH" --socket "$tmp/d.sock" --verify --rw randrw --iodepth 16 --runtime 1 --ramp 0 2>&1)
if grep -q " 0 mismatches" <<<"$out" && grep -q "format: LUKS2, aes-xts-plain64 512-bit" "$tmp/v.log"
then pass luks-vblkd-serves-verify
else fail luks-vblkd-serves-verify "$(tail -1 <<<"$out"; grep -E 'error|format' "$tmp/v.log")"; fi
"$CTL" --control "$tmp/c.sock" stats >"$tmp/stats" 2>&1
"$CTL" --control "$tmp/c.sock" metrics >"$tmp/metrics" 2>&1
gcore -o "$tmp/core" "$dpid" >/dev/null 2>&1
kill -TERM "$dpid"; wait "$dpid"; dpid=""
leak=""
for f in "$tmp/v.log" "$tmp/stats" "$tmp/metrics"; do
    grep -qF -- "$pw" "$f" && leak+=" passphrase in $(basename "$f")"
    grep -qiF -- "$vk" "$f" && leak+=" volume key in $(basename "$f")"
done
if ! ls "$tmp"/core.* >/dev/null 2>&1; then
    leak+=" (gcore wrote no core)"
else
    grep -qaF -- "$pw" "$tmp"/core.* && leak+=" passphrase in the core dump"
    /usr/bin/python3 - "$vk" "$tmp"/core.* <<'PY' || leak+=" volume key in the core dump"
import sys
key = bytes.fromhex(sys.argv[1])
sys.exit(1 if any(key[:32] in open(p, 'rb').read() for p in sys.argv[2:]) else 0)
PY
fi
if [[ -z $leak ]]; then pass luks-key-in-no-log-stats-metrics-or-core
else fail luks-key-in-no-log-stats-metrics-or-core "$leak"; fi

# Refused, one line each, nothing changed on the disk.
sum=$(sha256sum "$tmp/l2.img" | cut -d' ' -f1)
refuse() {	# refuse NAME PATTERN IMAGE ARGS...
    local name=$1 pat=$2 img=$3 out rc; shift 3
    out=$(timeout 30 "$VBLKD" --socket "$tmp/r.sock" --disk "$img" "$@" 2>&1 </dev/null); rc=$?
    if ((rc != 0)) && [[ $(wc -l <<<"$out") -le 2 ]] && grep -q -- "$pat" <<<"$out"; then
        pass "luks-refuses-$name"
    else
        fail "luks-refuses-$name" "rc=$rc: $out"
    fi
}
printf 'wrong' >"$tmp/wrong"
refuse no-key "give its passphrase with --key-file" "$tmp/l2.img"
refuse wrong-key "opens with that passphrase" "$tmp/l2.img" --key-file "$tmp/wrong"
refuse missing-key-file "cannot open the key file" "$tmp/l2.img" --key-file "$tmp/nokey"
if [[ $(sha256sum "$tmp/l2.img" | cut -d' ' -f1) == "$sum" ]]; then pass luks-refusals-change-nothing
else fail luks-refusals-change-nothing "the image changed"; fi
truncate -s 24M "$tmp/cbc.img"
cryptsetup luksFormat -q --type luks2 --cipher aes-cbc-essiv:sha256 --key-size 256 "${fast[@]}" \
    --key-file "$tmp/key" "$tmp/cbc.img"
refuse other-cipher "aes-xts-plain64 only" "$tmp/cbc.img" --key-file "$tmp/key"
cp "$tmp/l2.img" "$tmp/bad.img"
# LUKS2: both binary headers' checksums broken (the primary's and the
# secondary's JSON areas overwritten).
printf 'x%.0s' $(seq 64) | dd of="$tmp/bad.img" bs=1 seek=4096 conv=notrunc status=none
printf 'x%.0s' $(seq 64) | dd of="$tmp/bad.img" bs=1 seek=$((16384 + 4096)) conv=notrunc \
    status=none
bad_sum=$(sha256sum "$tmp/bad.img" | cut -d' ' -f1)
refuse damaged-header "damaged" "$tmp/bad.img" --key-file "$tmp/key"
[[ $(sha256sum "$tmp/bad.img" | cut -d' ' -f1) == "$bad_sum" ]] &&
    pass luks-refused-damaged-header-unchanged ||
    fail luks-refused-damaged-header-unchanged "vblkd wrote the image it refused"

# Hostile headers (issue 44).  libcryptsetup reads a private copy, never
# the disk: a LUKS2 image whose primary header is damaged is served from
# the secondary with one warning, and not "repaired" behind the operator's
# back (cryptsetup repair, or a forensic copy, needs it as it was).
cp "$tmp/l2.img" "$tmp/prim.img"
printf 'x' | dd of="$tmp/prim.img" bs=1 seek=$((4096 + 100)) conv=notrunc status=none
cp "$tmp/prim.img" "$tmp/prim.orig"
rm -f "$tmp/p.sock"
"$VBLKD" --socket "$tmp/p.sock" --disk "$tmp/prim.img" --key-file "$tmp/key" >"$tmp/prim.log" 2>&1 &
dpid=$!
for _ in $(seq 200); do [[ -S $tmp/p.sock ]] && break; sleep 0.05; done
out=$("$BENCH" --socket "$tmp/p.sock" --verify --rw randrw --runtime 0.5 --ramp 0 2>&1)
kill -TERM "$dpid"; wait "$dpid"; dpid=""
if grep -q " 0 mismatches" <<<"$out" &&
   (($(grep -c "header copies is damaged.*cryptsetup repair" "$tmp/prim.log") == 1)); then
    pass luks2-damaged-primary-served-from-secondary
else
    fail luks2-damaged-primary-served-from-secondary "$(tail -1 <<<"$out") $(grep -E 'warn|error' "$tmp/prim.log")"
fi
# The guest's writes went to the payload (at 16 MiB), never to the headers.
if cmp -s -n $((16 << 20)) "$tmp/prim.img" "$tmp/prim.orig"; then
    pass luks2-damaged-primary-not-rewritten
else
    fail luks2-damaged-primary-not-rewritten "the header area of the image changed"
fi
# The primary's magic gone, the secondary intact: LUKS to cryptsetup (it
# recovers the primary), so LUKS to vblkd too (--format auto), not raw:
# served raw, the guest's writes would go over the keyslots.
cp "$tmp/l2.img" "$tmp/nomagic.img"
printf '\0\0\0\0\0\0' | dd of="$tmp/nomagic.img" bs=1 conv=notrunc status=none
cp "$tmp/nomagic.img" "$tmp/nomagic.orig"
if out=$("$FMTIO" "$tmp/nomagic.img" /dev/null 8 0 --key-file "$tmp/key" 2>&1) ||
   grep -q "mismatches" <<<"$out"; then
    if grep -q "LUKS2 secondary header: served as LUKS" <<<"$out" &&
       cmp -s -n $((16 << 20)) "$tmp/nomagic.img" "$tmp/nomagic.orig"; then
        pass luks2-primary-magic-gone-served-from-secondary
    else
        fail luks2-primary-magic-gone-served-from-secondary "$(grep -E 'warn|error' <<<"$out")"
    fi
else
    fail luks2-primary-magic-gone-served-from-secondary "$out"
fi
# Key derivation bounded: a keyslot whose cost is far over the bound is
# skipped at once with one line naming it and its cost, not run for an
# hour; a refusal when no keyslot is left.  (Before: start-up stalled.)
slow() {	# slow NAME PATTERN IMAGE ARGS...: refused within 10 s, unchanged
    local name=$1 pat=$2 img=$3 s0 t0 out rc; shift 3
    s0=$(sha256sum "$img" | cut -d' ' -f1); t0=$SECONDS
    out=$(timeout -k 5 60 "$VBLKD" --socket "$tmp/r.sock" --disk "$img" "$@" 2>&1 </dev/null); rc=$?
    if ((rc != 0 && rc != 124 && SECONDS - t0 <= 10)) && grep -q -- "$pat" <<<"$out" &&
       [[ $(sha256sum "$img" | cut -d' ' -f1) == "$s0" ]]; then
        pass "luks-$name"
    else
        fail "luks-$name" "rc=$rc after $((SECONDS - t0)) s: $out"
    fi
}
truncate -s 24M "$tmp/k1.img"
cryptsetup luksFormat -q --type luks1 "${fast[@]}" --key-file "$tmp/key" "$tmp/k1.img"
cp "$tmp/k1.img" "$tmp/k1-bomb.img"
# LUKS1 keyslot 0's iterations (u32 at 208 + 4), then its digest's (164).
printf '\xff\xff\xff\xff' | dd of="$tmp/k1-bomb.img" bs=1 seek=212 conv=notrunc status=none
slow pbkdf2-iterations-bomb-skipped "keyslot 0 skipped: its key derivation (PBKDF2-sha256, 4294967295 iterations: about" \
    "$tmp/k1-bomb.img" --key-file "$tmp/key"
cp "$tmp/k1.img" "$tmp/k1-digest.img"
printf '\x7f\xff\xff\xff' | dd of="$tmp/k1-digest.img" bs=1 seek=164 conv=notrunc status=none
slow digest-iterations-bomb-refused "checking a key against its header's digest would take" \
    "$tmp/k1-digest.img" --key-file "$tmp/key"
truncate -s 24M "$tmp/a2.img"
cryptsetup luksFormat -q --type luks2 --pbkdf argon2id --pbkdf-memory 32 --pbkdf-force-iterations 4 \
    --key-file "$tmp/key" "$tmp/a2.img"
cp "$tmp/a2.img" "$tmp/a2-bomb.img"
/usr/bin/python3 "$here/luks2_edit.py" "$tmp/a2-bomb.img" keyslots.0.kdf.memory=4194304
slow argon2-memory-bomb-skipped "keyslot 0 skipped: its key derivation (argon2id, 4 passes over 4096 MiB" \
    "$tmp/a2-bomb.img" --key-file "$tmp/key"
# A digest under a hash cryptsetup cannot compute checks no key (cryptsetup
# 2.6 opens such a header with whatever key a keyslot gives: garbage
# served, garbage written): refused, the file unchanged (fuzz_luks found it).
cp "$tmp/a2.img" "$tmp/dg.img"
/usr/bin/python3 "$here/luks2_edit.py" "$tmp/dg.img" 'digests.0.hash="sha128"'
slow digest-unknown-hash-refused "its header's digest uses the hash 'sha128'" "$tmp/dg.img" \
    --key-file "$tmp/key"
# The bounds are the operator's: 2 M iterations (~1 s here) over 100 ms,
# 64 MiB of Argon2 over 32 MiB.
cp "$tmp/l2.img" "$tmp/slow.img"
/usr/bin/python3 "$here/luks2_edit.py" "$tmp/slow.img" keyslots.0.kdf.iterations=2000000
slow kdf-max-ms-honoured "keyslot 0 skipped.*over the bound (--kdf-max-ms 100," "$tmp/slow.img" \
    --key-file "$tmp/key" --kdf-max-ms 100
cp "$tmp/a2.img" "$tmp/mem.img"
/usr/bin/python3 "$here/luks2_edit.py" "$tmp/mem.img" keyslots.0.kdf.memory=65536
slow kdf-max-memory-honoured "keyslot 0 skipped.*--kdf-max-memory 32 MiB" "$tmp/mem.img" \
    --key-file "$tmp/key" --kdf-max-memory 32M
# A bomb in keyslot 0 and a good keyslot 1: served from keyslot 1.
cryptsetup luksAddKey -q "${fast[@]}" --key-file "$tmp/key" "$tmp/k1.img" "$tmp/key"
printf '\xff\xff\xff\xff' | dd of="$tmp/k1.img" bs=1 seek=212 conv=notrunc status=none
if out=$("$FMTIO" "$tmp/k1.img" /dev/null 7 0 --key-file "$tmp/key" 2>&1) ||
   grep -q "mismatches" <<<"$out"; then
    grep -q "keyslot 0 skipped" <<<"$out" && pass luks-bomb-skipped-next-keyslot-opens ||
        fail luks-bomb-skipped-next-keyslot-opens "no line about keyslot 0: $out"
else
    fail luks-bomb-skipped-next-keyslot-opens "$out"
fi
# A systemd credential: a bare name found in $CREDENTIALS_DIRECTORY (the
# model /dev/null reads zeroes: the compare fails, but only once opened).
mkdir -p "$tmp/creds"; cp "$tmp/key" "$tmp/creds/disk-key"
if out=$(CREDENTIALS_DIRECTORY=$tmp/creds "$FMTIO" "$tmp/l2.img" /dev/null 5 0 \
         --key-file disk-key 2>&1) || grep -q "mismatches" <<<"$out"; then
    pass luks-key-from-systemd-credential
else fail luks-key-from-systemd-credential "$out"; fi
# A block device (a loop device over a LUKS2 file): libcryptsetup reads
# the header from the device, vblkd serves the payload through io_uring;
# the oracle decrypts what vblk-bench wrote and fmt-io agrees with it.
if ((EUID == 0)) && command -v losetup >/dev/null &&
   loopdev=$(losetup -f --show "$tmp/l2.img" 2>/dev/null); then
    rm -f "$tmp/d.sock"
    "$VBLKD" --socket "$tmp/d.sock" --disk "$loopdev" --key-file "$tmp/key" >"$tmp/b.log" 2>&1 &
    dpid=$!
    for _ in $(seq 200); do [[ -S $tmp/d.sock ]] && break; sleep 0.05; done
    out=$("$BENCH" --socket "$tmp/d.sock" --verify --rw randrw --iodepth 16 --runtime 1 --ramp 0 2>&1)
    kill -TERM "$dpid"; wait "$dpid"; dpid=""
    $ORACLE decrypt "$tmp/l2.img" "$tmp/key" "$tmp/blk.model"
    if grep -q " 0 mismatches" <<<"$out" && grep -q "format: LUKS2" "$tmp/b.log" &&
       fo=$("$FMTIO" "$loopdev" "$tmp/blk.model" 6 100 --key-file "$tmp/key" 2>&1); then
        pass luks-on-a-block-device
    else
        fail luks-on-a-block-device "$(tail -1 <<<"$out") ${fo:-} $(grep -E 'error|format' "$tmp/b.log")"
    fi
    losetup -d "$loopdev"; loopdev=""
else
    echo "SKIP: luks-on-a-block-device (not root, or no loop device)"
fi
exit 0
