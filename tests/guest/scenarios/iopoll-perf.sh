#!/bin/sh
# Guest scenario for bench/guest-iopoll (busybox sh), after host-root.sh.
# /dev/vda has a poll queue (virtio_blk.poll_queues=1, two virtqueues).
# Each repetition runs every cell once, in an order that rotates by one
# each repetition, 4k randread over the first 64 MiB, O_DIRECT, at each QD:
#   fio         fio io_uring straight on /dev/vda (interrupts)
#   fio-hipri   the same with --hipri (IOPOLL: the poll queue)
#   vblkd       this build of vblkd, --iopoll off, vblk-bench sleeping on
#               interrupts
#   vblkd-iopoll  the same with --iopoll on
#   qsd         qemu-storage-daemon (aio=io_uring, cache.direct=on)
# Daemons on CPU 1, fio and vblk-bench on CPU 0.  The host's binaries, run
# from the host's root file system (host_root).  Prints one
#   VBLK-PERF: rep=R cell=C qd=Q iops=N p50_us=N [polled=N]
# line per run.  Kernel command line: vblk.reps=N vblk.runtime=S vblk.qds=1,32.
arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^vblk\.$1=//p"; }
reps=$(arg reps) runtime=$(arg runtime) qds=$(arg qds | tr ',' ' ')
reps=${reps:-3} runtime=${runtime:-3} qds=${qds:-1 32}
if ! host_root; then
    echo "VBLK-RESULT: FAIL iopoll-perf $HOST_ROOT_ERR"
    exit 1
fi
echo "VBLK-GUEST: io_poll=$(cat /sys/block/vda/queue/io_poll), reps=$reps, runtime=$runtime s, qds=$qds"
T=/host$S
DEV=/dev/vda
run() { chroot /host taskset -c "$@"; }

fio_cell() {	# fio_cell HIPRI QD: prints "iops=N p50_us=N"
    run 0 fio --name=x --filename=$DEV --direct=1 --ioengine=io_uring --hipri="$1" \
        --rw=randread --bs=4k --iodepth="$2" --size=64M --time_based --runtime="$runtime" \
        --ramp_time=1 --randrepeat=0 --norandommap --lat_percentiles=1 \
        --output-format=terse --terse-version=3 >$T/fio.out 2>&1
    echo "iops=$(cut -d';' -f8 $T/fio.out) p50_us=$(tr ';' '\n' <$T/fio.out | grep -m1 '^50.000000%=' | cut -d= -f2)"
}

# A daemon on CPU 1; dpid is its pid (chroot and taskset exec it).
daemon() { chroot /host taskset -c 1 "$@" >$T/d.log 2>&1 & dpid=$!; }

daemon_cell() {	# daemon_cell NAME QD
    rm -f $T/d.sock
    case $1 in
    vblkd) daemon "$BUILD/vblkd" --socket $S/d.sock --disk $DEV --iopoll off ;;
    vblkd-iopoll) daemon "$BUILD/vblkd" --socket $S/d.sock --disk $DEV --iopoll on ;;
    qsd) daemon qemu-storage-daemon \
            --blockdev driver=host_device,node-name=d0,filename=$DEV,aio=io_uring,cache.direct=on \
            --export type=vhost-user-blk,id=e0,node-name=d0,addr.type=unix,addr.path=$S/d.sock,writable=on ;;
    esac
    i=0
    while [ ! -S $T/d.sock ] && [ "$i" -lt 600 ] && kill -0 $dpid 2>/dev/null; do
        sleep 0.1
        i=$((i + 1))
    done
    run 0 "$BUILD/vblk-bench" --socket $S/d.sock --rw randread --iodepth "$2" --size 64M \
        --runtime "$runtime" --ramp 1 --json >$T/b.out 2>&1
    kill -TERM $dpid
    wait $dpid
    polled=$(sed -n 's/.*"backend_polled": *\([0-9]*\).*/\1/p' $T/d.log | tail -n 1)
    echo "iops=$(sed -n 's/.*"iops": *\([0-9.]*\).*/\1/p' $T/b.out)" \
         "p50_us=$(sed -n 's/.*"p50": *\([0-9]*\).*/\1/p' $T/b.out | awk '{ printf "%.1f", $1 / 1000 }')" \
         "${polled:+polled=$polled}"
}

cells="fio fio-hipri vblkd vblkd-iopoll qsd"
ncells=5
rep=0
while [ $rep -lt "$reps" ]; do
    k=0
    while [ $k -lt $ncells ]; do
        cell=$(echo $cells | cut -d' ' -f$(( (rep + k) % ncells + 1 )))
        for qd in $qds; do
            case $cell in
            fio) r=$(fio_cell 0 "$qd") ;;
            fio-hipri) r=$(fio_cell 1 "$qd") ;;
            *) r=$(daemon_cell "$cell" "$qd") ;;
            esac
            echo "VBLK-PERF: rep=$rep cell=$cell qd=$qd $r"
        done
        k=$((k + 1))
    done
    rep=$((rep + 1))
done
echo "VBLK-RESULT: PASS iopoll-perf"
