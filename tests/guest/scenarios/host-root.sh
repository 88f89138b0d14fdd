#!/bin/sh
# Guest scenario piece (busybox sh), put in front of a scenario that runs
# the host's binaries.  host_root mounts the host's root file system (QEMU
# -virtfs local,path=/,mount_tag=host,readonly=on) at /host, read-only,
# with the guest's own /dev, /proc, /sys and an empty /run inside, for
# chroot, and sets BUILD from vblk.build=DIR on the kernel command line
# (the host's build directory; anywhere but under those four) and S, a
# writable directory: /run/vblk in the chroot, /host$S outside.  (Not /tmp:
# the build may be there, and a mount would hide it.)  Returns 1 with the
# reason in HOST_ROOT_ERR if that cannot be done.
host_root() {
    BUILD=$(tr ' ' '\n' </proc/cmdline | sed -n 's/^vblk\.build=//p')
    for m in $(cat /etc/vblk-modules-9p); do
        insmod "/lib/modules/vblk/$m.ko" || echo "VBLK-GUEST: insmod $m failed"
    done
    mkdir -p /host
    if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose,ro host /host; then
        HOST_ROOT_ERR="cannot mount the host's file system (9p)"
        return 1
    fi
    mount -t devtmpfs devtmpfs /host/dev
    mount -t proc proc /host/proc
    mount -t sysfs sysfs /host/sys
    mount -t tmpfs tmpfs /host/run
    S=/run/vblk
    mkdir -p "/host$S"
    if [ ! -x "/host$BUILD/vblkd" ]; then
        HOST_ROOT_ERR="no $BUILD/vblkd on the host's file system"
        return 1
    fi
}
