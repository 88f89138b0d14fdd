#!/bin/sh
# Guest scenario (busybox sh) for tests/guest/migrate-local.sh: fio crc32c
# verify rounds on /dev/vda (randwrite, QD32, O_DIRECT, libaio, verify
# reads interleaved by --verify_backlog) while the host mirrors the local
# disk to another host and migrates the VM there and back, until the host
# writes the stop mark into the disk's last 4 KiB.  Round N writes all of
# its own 16 MiB slice of the first 512 MiB (slice N-1, zeroed first by
# write zeroes), so what a round wrote stays on the disk through every
# later mirror and hop: at the end every slice is read back whole against
# the round that wrote it last (verify_only).  A write the mirror lost,
# even one the round had already verified on the source, reads there as
# zeroes and fails the check.  The range the host wrote before boot,
# [512 MiB, 768 MiB), is never touched here: its md5 at the end says
# whether the mirrors carried it.  A kernel message of an I/O error fails
# the run.
#
# Prints: VBLK-GUEST: migrate fio start             (the host starts mirroring)
#         VBLK-GUEST: migrate round N ... errors=E  (one line per round)
#         VBLK-MD5: pre=MD5 fio=MD5 fio_mb=M        (the pre-written range;
#                                                    the first M MiB, fio's)
#         VBLK-RESULT: PASS migrate-local rounds=N verify_errors=0 ...
#       | VBLK-RESULT: FAIL migrate-local rounds=N ...
DEV=/dev/vda
SLICE_MB=16
SLICES=32
PRE_OFF_MB=512
PRE_MB=256
MAX_ROUNDS=400
STOP=VBLK-MIGRATE-STOP

if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi
ZERO=/usr/sbin/blkdiscard-ul
[ -x $ZERO ] || { ZERO=""; echo "VBLK-GUEST: no blkdiscard-ul: slices not zeroed"; }
SECTORS=$(cat /sys/block/vda/size)
STOP_BLOCK=$((SECTORS / 8 - 1))

slice() { # slice ROUND: its slice's offset in MiB
    echo $(((($1 - 1) % SLICES) * SLICE_MB))
}

job() {	# job ROUND [fio options...]
    r=$1
    shift
    fio --name=migrate --eta=never --filename=$DEV --direct=1 --ioengine=$ENG \
        --rw=randwrite --bsrange=4k-64k --iodepth=32 \
        --offset="$(slice "$r")M" --size=${SLICE_MB}M --randseed="$r" \
        --verify=crc32c --verify_backlog=64 --do_verify=1 \
        --continue_on_error=verify --output-format=json "$@"
}

# jget FILE KEY [SECTION]: first numeric value of "KEY" (inside jobs[0].SECTION
# if given) in fio's pretty-printed JSON.
jget() {
    awk -v sec="${3:-}" -v key="$2" '
        /^ *"(read|write|trim|sync)" : \{/ { s = $1; gsub(/"/, "", s) }
        (sec == "" || s == sec) && $1 == "\"" key "\"" && !done {
            v = $3; gsub(/[^0-9.]/, "", v); print v; done = 1
        }
        END { if (!done) print 0 }' "$1"
}

stopped() {
    dd if=$DEV bs=4096 skip=$STOP_BLOCK count=1 iflag=direct 2>/dev/null | grep -aq $STOP
}

md5() {	# md5 OFF_MB LEN_MB: of that range, read past the page cache
    dd if=$DEV bs=1M skip="$1" count="$2" iflag=direct 2>/dev/null | md5sum | cut -d' ' -f1
}

echo "VBLK-GUEST: migrate fio start engine=$ENG slices=${SLICES}x${SLICE_MB}M"
round=0 errs=0 fail="" wsum=0 rsum=0
while [ $round -lt $MAX_ROUNDS ]; do
    round=$((round + 1))
    if [ -n "$ZERO" ] && ! $ZERO -z -o $(($(slice $round) << 20)) -l $((SLICE_MB << 20)) $DEV; then
        fail="$fail round$round:write-zeroes"
    fi
    job $round --output=/tmp/round.json 2>/tmp/round.err
    rc=$?
    e=$(jget /tmp/round.json total_err)
    w=$(jget /tmp/round.json io_kbytes write)
    r=$(jget /tmp/round.json io_kbytes read)
    echo "VBLK-GUEST: migrate round $round rc=$rc written=${w}KiB verified=${r}KiB errors=$e"
    errs=$((errs + e))
    wsum=$((wsum + w)) rsum=$((rsum + r))
    if [ "$rc" != 0 ] || [ "$e" != 0 ]; then
        grep -v '^ *$' /tmp/round.err | head -20 >/tmp/details
        fail="$fail round$round:rc=$rc,errors=$e"
    elif [ "$w" -eq 0 ] || [ "$r" -lt "$w" ]; then
        fail="$fail round$round:verify-missing(written=${w}KiB,verified=${r}KiB)"
    fi
    # A failed round ends the job at once (the host stops migrating).
    [ -n "$fail" ] && break
    stopped && break
done
[ -n "$fail" ] || stopped || fail="$fail no-stop-mark-after-$round-rounds"

# Every slice read back whole against the round that wrote it last, after
# the last migration; not after a failed round, whose result the host is
# waiting for.
if [ -z "$fail" ]; then
    vsum=0 r=$((round > SLICES ? round - SLICES + 1 : 1))
    while [ $r -le $round ]; do
        job $r --verify_only --verify_backlog=0 --output=/tmp/final.json 2>/tmp/final.err
        rc=$?
        e=$(jget /tmp/final.json total_err)
        v=$(jget /tmp/final.json io_kbytes read)
        errs=$((errs + e)) vsum=$((vsum + v))
        if [ "$rc" != 0 ] || [ "$e" != 0 ] || [ "$v" -eq 0 ]; then
            echo "VBLK-GUEST: migrate final verify of round $r rc=$rc verified=${v}KiB errors=$e"
            grep -v '^ *$' /tmp/final.err | head -20 >/tmp/details
            fail="$fail final-round$r:rc=$rc,errors=$e,verified=${v}KiB"
        fi
        r=$((r + 1))
    done
    echo "VBLK-GUEST: migrate final verify of rounds $((round > SLICES ? round - SLICES + 1 : 1))-$round: verified=${vsum}KiB"
    used=$((round < SLICES ? round : SLICES))
    echo "VBLK-MD5: pre=$(md5 $PRE_OFF_MB $PRE_MB) fio=$(md5 0 $((used * SLICE_MB))) fio_mb=$((used * SLICE_MB))"
fi

# The kernel's word on the disk: an error the fio rounds did not see (a
# failed write zeroes, a read outside them) shows here.
dmesg | grep -E 'I/O error|blk_update_request|critical medium|print_req_error' >/tmp/ioerr
if [ -s /tmp/ioerr ]; then
    fail="$fail kernel-io-errors=$(wc -l </tmp/ioerr)"
fi

if [ -z "$fail" ]; then
    echo "VBLK-RESULT: PASS migrate-local rounds=$round verify_errors=0 written=${wsum}KiB verified=${rsum}KiB"
else
    echo "VBLK-RESULT: FAIL migrate-local rounds=$round verify_errors=$errs$fail"
    # after the result line, which the host waits for
    cat /tmp/details 2>/dev/null
    head -20 /tmp/ioerr | sed 's/^/VBLK-GUEST: dmesg: /'
fi
