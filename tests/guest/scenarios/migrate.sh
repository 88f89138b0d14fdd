#!/bin/sh
# Guest scenario (busybox sh) for tests/guest/migrate.sh: fio crc32c verify
# rounds on /dev/vda (randwrite, QD32, O_DIRECT, libaio, verify reads
# interleaved with the writes by --verify_backlog) while the host migrates
# the VM, again and again, until the host writes the stop mark into the
# disk's last 4 KiB (outside fio's region): the job spans every migration
# however long they take.  Each round first zeroes fio's region (write
# zeroes): a write lost in a handover leaves zeroes, never an older round's
# valid block (which fio's verify_only pass, at least, takes as good), and
# fails the check.  At the end every block of the last round is read back
# once more (verify_only).
#
# Prints: VBLK-GUEST: migrate fio start             (the host starts migrating)
#         VBLK-GUEST: migrate round N ... errors=E  (one line per round)
#         VBLK-RESULT: PASS migrate rounds=N verify_errors=0 ...
#       | VBLK-RESULT: FAIL migrate rounds=N verify_errors=E ...
DEV=/dev/vda
ROUND_MB=24
MAX_ROUNDS=200
STOP=VBLK-MIGRATE-STOP

if fio --enghelp 2>/dev/null | grep -qw libaio; then ENG=libaio; else ENG=psync; fi
ZERO=/usr/sbin/blkdiscard-ul
[ -x $ZERO ] || { ZERO=""; echo "VBLK-GUEST: no blkdiscard-ul: rounds not zeroed"; }
SECTORS=$(cat /sys/block/vda/size)
# fio's region: the disk less its last MiB (the stop mark lives there).
REGION_MB=$((SECTORS / 2048 - 1))
STOP_BLOCK=$((SECTORS / 8 - 1))

job() {	# job SEED [fio options...]
    seed=$1
    shift
    fio --name=migrate --eta=never --filename=$DEV --direct=1 --ioengine=$ENG \
        --rw=randwrite --bsrange=4k-64k --iodepth=32 --size=${REGION_MB}M \
        --io_size="${ROUND_MB}M" --randseed="$seed" \
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

echo "VBLK-GUEST: migrate fio start engine=$ENG region=${REGION_MB}M round=${ROUND_MB}M"
round=0 errs=0 fail="" wsum=0 rsum=0
while [ $round -lt $MAX_ROUNDS ]; do
    round=$((round + 1))
    if [ -n "$ZERO" ] && ! $ZERO -z -o 0 -l $((REGION_MB << 20)) $DEV; then
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

# Every block of the last round, read back after the last migration
# (verify_only with --verify_backlog checks only some of them); not after
# a failed round, whose result the host is waiting for.
if [ -z "$fail" ]; then
    job $round --verify_only --verify_backlog=0 --output=/tmp/final.json 2>/tmp/final.err
    rc=$?
    e=$(jget /tmp/final.json total_err)
    r=$(jget /tmp/final.json io_kbytes read)
    echo "VBLK-GUEST: migrate final verify of round $round rc=$rc verified=${r}KiB errors=$e"
    errs=$((errs + e))
    if [ "$rc" != 0 ] || [ "$e" != 0 ] || [ "$r" -eq 0 ]; then
        grep -v '^ *$' /tmp/final.err | head -20 >/tmp/details
        fail="$fail final:rc=$rc,errors=$e,verified=${r}KiB"
    fi
fi

if [ -z "$fail" ]; then
    echo "VBLK-RESULT: PASS migrate rounds=$round verify_errors=0 written=${wsum}KiB verified=${rsum}KiB"
else
    echo "VBLK-RESULT: FAIL migrate rounds=$round verify_errors=$errs$fail"
    # after the result line, which the host waits for
    cat /tmp/details 2>/dev/null
fi
