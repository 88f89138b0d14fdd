#!/usr/bin/env bash
# Install what vblkd needs to build, test and demo, on Debian 12 as root.
# Installs only what is missing; apt-get update runs once, only if needed.
# Usage: scripts/deps.sh [build|all]   (default: all)
set -euo pipefail

build_pkgs=(gcc make meson ninja-build pkg-config liburing-dev libaio-dev)
guest_pkgs=(qemu-system-x86 qemu-utils linux-image-amd64 busybox-static fio cpio
            util-linux procps python3)

want=("${build_pkgs[@]}")
[[ "${1:-all}" == build ]] || want+=("${guest_pkgs[@]}")

missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0

if [[ $(id -u) -ne 0 ]]; then
    echo "deps: missing packages ${missing[*]}: run as root (or apt-get install them)" >&2
    exit 1
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
