#!/usr/bin/env bash
# Install what vblkd needs to build, test and demo, on Debian 12 as root.
# Installs only what is missing; apt-get update runs once, only if needed.
# Usage: scripts/deps.sh [build|ops|remote|pkg|format|all]   (default: all)
#   build    compilers, meson, the libraries vblkd links (liburing, json-c,
#            libaio, librbd, libnbd, libmicrohttpd for --metrics) and scdoc
#            for the man pages
#   ops      build, plus what tests/ops scrapes and checks metrics with
#            (curl, promtool from the prometheus package)
#   remote   build, plus the remote-storage test rig: a Ceph mon + OSD
#            (scripts/ceph-cluster.sh), NBD servers (nbdkit, qemu-nbd),
#            qemu-storage-daemon with its rbd driver (qemu-block-extra), and
#            the LUKS oracles (cryptsetup, python3-cryptography)
#   pkg      build, plus what the Debian package and its test need:
#            debhelper, lintian, the package's other Build-Depends, groff
#            (man page checks), systemd (systemd-analyze verify), strace
#            (the unit's system call filter against what vblkd calls), python3
#   format   build, plus tests/format's oracles (qemu-utils, cryptsetup,
#            python3-cryptography, gdb): the mutation campaign in tests/run asan
#   all      everything: build, ops, remote, pkg, the guest tests' QEMU,
#            kernel, busybox, fio and iproute2 (migrate-local's two hosts are
#            network namespaces), and tests/format's oracles (qemu-utils,
#            cryptsetup, python3-cryptography, gdb)
set -euo pipefail

build_pkgs=(gcc make meson ninja-build pkg-config liburing-dev libjson-c-dev libaio-dev
            librbd-dev libnbd-dev libmicrohttpd-dev scdoc zlib1g-dev libzstd-dev
            libcryptsetup-dev libssl-dev libargon2-dev libgnutls28-dev)
# tests/format: QEMU's tools and cryptsetup as oracles, python3-cryptography
# (Debian's /usr/bin/python3) for the LUKS data oracle, gdb's gcore;
# tests/nbd: libnbd's nbdinfo and nbdcopy (libnbd-bin) as the NBD server's,
# python3-libnbd for a client that holds a dirty bitmap's context, certtool
# and psktool (gnutls-bin) for its TLS keys; test_mirror: nbdkit as a slow
# target of one connection.
format_pkgs=(qemu-utils cryptsetup-bin python3-cryptography gdb libnbd-bin python3 python3-libnbd
             gnutls-bin nbdkit)
ops_pkgs=(curl prometheus python3)
guest_pkgs=(qemu-system-x86 qemu-utils linux-image-amd64 busybox-static fio cpio
            util-linux procps python3 libnbd-bin iproute2)
# (cryptsetup and python3-cryptography: test_remote's LUKS disks on NBD and RBD)
remote_pkgs=(ceph-mon ceph-osd ceph-common nbdkit qemu-utils qemu-system-common
             qemu-block-extra procps python3 cryptsetup-bin python3-cryptography)
# debian/control's Build-Depends must all be here: dpkg-buildpackage checks them.
pkg_pkgs=(build-essential debhelper dpkg-dev fakeroot lintian libjson-c-dev
          libmicrohttpd-dev groff man-db systemd strace python3)

want=("${build_pkgs[@]}")
case "${1:-all}" in
build) ;;
ops) want+=("${ops_pkgs[@]}") ;;
remote) want+=("${remote_pkgs[@]}") ;;
pkg) want+=("${pkg_pkgs[@]}") ;;
format) want+=("${format_pkgs[@]}") ;;
all) want+=("${ops_pkgs[@]}" "${guest_pkgs[@]}" "${remote_pkgs[@]}" "${pkg_pkgs[@]}"
            "${format_pkgs[@]}") ;;
*) echo "usage: scripts/deps.sh [build|ops|remote|pkg|format|all]" >&2; exit 1 ;;
esac

missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

if [[ $(id -u) -ne 0 ]]; then
    echo "deps: missing packages ${missing[*]}: run as root (or apt-get install them)" >&2
    exit 1
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# We want promtool, not a Prometheus server: packages with a service
# (prometheus) must not start it.  Without a policy-rc.d (a container
# without systemd as PID 1, where invoke-rc.d would run the init script, or
# a host with systemd) one that refuses every start stands in while apt runs.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# scripts/deps.sh: no service starts while it installs\nexit 101\n' \
        >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
