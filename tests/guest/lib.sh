# shellcheck shell=bash
#
# tests/guest/lib.sh - helpers to boot a throw-away Linux guest under QEMU
# (TCG) with a vhost-user-blk disk and run a scenario script inside it.
#
# Source this file from bash scripts (it is set -euo pipefail clean):
#
#   . tests/guest/lib.sh
#   guest_deps
#   guest_build_initramfs "$OUTDIR"                  # -> $OUTDIR/base.cpio.gz
#   guest_scenario_cpio tests/guest/scenarios/fio-verify.sh "$OUTDIR/scn.cpio.gz"
#   cat "$OUTDIR/base.cpio.gz" "$OUTDIR/scn.cpio.gz" > "$OUTDIR/test.img"
#   guest_boot /path/to/vhost.sock 2 "$OUTDIR/test.img" "$OUTDIR/test.log" 240
#   guest_log_result "$OUTDIR/test.log" fio-verify
#
# Public functions (all return non-zero with a one-line message on stderr
# when something is missing or fails):
#
#   guest_deps
#   guest_kernel                                   prints newest /boot/vmlinuz-*
#   guest_kver                                     prints its version string
#   guest_build_initramfs [OUTDIR]                 cached OUTDIR/base.cpio.gz
#   guest_scenario_cpio SCRIPT OUT                 SCRIPT as /scenario.sh
#   guest_initrd SCRIPT OUT [OUTDIR]               base + scenario -> OUT
#   guest_boot SOCK NUMQ INITRD LOG [TIMEOUT_S]    returns QEMU's exit status
#   guest_qemu_argv SOCK NUMQ INITRD               -> array VBLK_GUEST_QEMU_ARGV
#   guest_qemu_start SOCK NUMQ INITRD LOG TMO [QEMU ARGS...]
#                                                  QEMU in the background with
#                                                  extra args (-qmp, -incoming);
#                                                  pid in VBLK_GUEST_QEMU_PID
#   guest_qmp SOCK COMMAND [JSON] | SOCK migrate URI ...   QMP (qmp.py)
#   guest_wait_log LOG PATTERN SECONDS [PID]       wait for a console line
#   guest_log_result LOG [NAME]                    0 iff PASS, DONE and no FAIL
#   guest_log_lines LOG PREFIX                     e.g. PREFIX=VBLK-IRQ:
#   guest_boot_kill                                stop a running guest_boot
#
# Guest protocol (lines on the serial console, captured in LOG):
#   VBLK-GUEST: ...          informational lines from /init
#   VBLK-RESULT: PASS|FAIL <name> [details]
#   VBLK-IRQ: qd=N ios=N irqs=N irqs_per_io=X
#   VBLK-GUEST-DONE          printed by /init just before poweroff
#
# Environment knobs (all optional):
#   VBLK_GUEST_KERNEL     kernel image to boot (default: newest /boot/vmlinuz-*)
#   VBLK_GUEST_MODDIR     module tree root (default /lib/modules)
#   VBLK_GUEST_REBUILD=1  force guest_build_initramfs to rebuild
#   VBLK_GUEST_MEM        guest RAM (default 512M)
#   VBLK_GUEST_SMP        guest vCPUs (default 2)
#   VBLK_GUEST_APPEND     extra kernel command line (e.g. "quiet")
#   VBLK_GUEST_BLK_PROPS  extra vhost-user-blk-pci properties, e.g.
#                         ",queue-size=256,config-wce=off"
#   VBLK_GUEST_QEMU       QEMU binary (default qemu-system-x86_64)
#   VBLK_GUEST_CHARDEV_OPTS  extra options of the first disk's chardev,
#                         e.g. ",reconnect=1" (QEMU reconnects to a restarted
#                         backend)
#   VBLK_GUEST_EXTRA_DISKS  more QEMU arguments, split on spaces: further
#                         -chardev/-device pairs for more vhost-user disks

VBLK_GUEST_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VBLK_REPO_ROOT="$(cd "$VBLK_GUEST_LIB_DIR/../.." && pwd)"
VBLK_GUEST_BUILD_DEFAULT="$VBLK_REPO_ROOT/build/guest"
VBLK_GUEST_BOOT_PID=""

# Load order matters (dependencies first).  Modules that are built into the
# kernel (listed in modules.builtin) are skipped.
VBLK_GUEST_MODULES=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk)
# Copied too, loaded by the scenarios that want them (in this order, from
# /etc/vblk-modules-9p): 9p over virtio, to mount the host's file system
# (QEMU -virtfs) and run the host's binaries in the guest.
VBLK_GUEST_MODULES_9P=(netfs fscache 9pnet 9pnet_virtio 9p)

_guest_err() {
    echo "guest: $*" >&2
}

# True if $1 is a statically linked executable (ldd fails on those).
_guest_is_static() {
    ! ldd "$1" >/dev/null 2>&1
}

# Path of a static busybox, or empty.
_guest_busybox() {
    local b
    for b in /bin/busybox /usr/bin/busybox /usr/lib/initramfs-tools/bin/busybox; do
        if [[ -x "$b" ]] && _guest_is_static "$b"; then
            echo "$b"
            return 0
        fi
    done
    return 1
}

# guest_kernel: print the newest /boot/vmlinuz-* (or $VBLK_GUEST_KERNEL).
guest_kernel() {
    if [[ -n "${VBLK_GUEST_KERNEL:-}" ]]; then
        if [[ ! -r "$VBLK_GUEST_KERNEL" ]]; then
            _guest_err "kernel $VBLK_GUEST_KERNEL not readable"
            return 1
        fi
        echo "$VBLK_GUEST_KERNEL"
        return 0
    fi
    local k
    k="$(find /boot -maxdepth 1 -name 'vmlinuz-*' 2>/dev/null | sort -V | tail -n 1)"
    if [[ -z "$k" ]]; then
        _guest_err "no /boot/vmlinuz-* found (install linux-image-amd64)"
        return 1
    fi
    if [[ ! -r "$k" ]]; then
        _guest_err "kernel $k is not readable (run as root?)"
        return 1
    fi
    echo "$k"
}

# guest_kver: kernel version taken from the vmlinuz file name (NOT uname -r:
# the host may run a different kernel than the one installed in /boot).
guest_kver() {
    local k
    k="$(guest_kernel)" || return 1
    k="$(basename "$k")"
    echo "${k#vmlinuz-}"
}

# guest_deps: install missing host tools (Debian/Ubuntu).  Only touches apt
# if something required is actually missing.
guest_deps() {
    local pkgs=() need_kernel=0
    command -v qemu-system-x86_64 >/dev/null 2>&1 || pkgs+=(qemu-system-x86)
    command -v qemu-storage-daemon >/dev/null 2>&1 || pkgs+=(qemu-system-common)
    command -v qemu-img >/dev/null 2>&1 || pkgs+=(qemu-utils)
    _guest_busybox >/dev/null || pkgs+=(busybox-static)
    command -v fio >/dev/null 2>&1 || pkgs+=(fio)
    command -v cpio >/dev/null 2>&1 || pkgs+=(cpio)
    command -v gzip >/dev/null 2>&1 || pkgs+=(gzip)
    command -v timeout >/dev/null 2>&1 || pkgs+=(coreutils)
    command -v ldd >/dev/null 2>&1 || pkgs+=(libc-bin)
    command -v cmp >/dev/null 2>&1 || pkgs+=(diffutils)
    if ! compgen -G '/boot/vmlinuz-*' >/dev/null; then
        need_kernel=1
    fi
    if ((need_kernel)); then
        case "$(uname -m)" in
        x86_64) pkgs+=(linux-image-amd64) ;;
        *)
            _guest_err "no /boot/vmlinuz-* and unsupported arch $(uname -m)"
            return 1
            ;;
        esac
    fi
    if ((${#pkgs[@]} == 0)); then
        return 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        _guest_err "missing packages (${pkgs[*]}) and no apt-get to install them"
        return 1
    fi
    local sudo=()
    if [[ "$(id -u)" != 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            _guest_err "missing packages (${pkgs[*]}); need root or sudo to install"
            return 1
        fi
    fi
    echo "guest: installing ${pkgs[*]}" >&2
    if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq; then
        _guest_err "apt-get update failed"
        return 1
    fi
    if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; then
        _guest_err "apt-get install ${pkgs[*]} failed"
        return 1
    fi
}

# Copy executable $1 and every library ldd reports for it into root $2,
# keeping the absolute paths (so the dynamic loader finds them as on the host).
_guest_copy_with_libs() {
    local bin="$1" root="$2" dst="$2${3:-$1}" lib
    # Never write through a symlink already there (a busybox applet link
    # points at /bin/busybox, which outside the chroot is the host's).
    rm -f "$dst"
    mkdir -p "$(dirname "$dst")" && cp -L "$bin" "$dst" || return 1
    _guest_is_static "$bin" && return 0
    local libs
    libs="$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')" || return 1
    if grep -q 'not found' < <(ldd "$bin"); then
        _guest_err "ldd $bin: some libraries not found"
        return 1
    fi
    while IFS= read -r lib; do
        [[ -n "$lib" ]] || continue
        [[ -e "$root$lib" ]] && continue
        mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib" || return 1
    done <<<"$libs"
}

# Find module $1 for kernel $2 and write it, decompressed, to $3.
# Returns 2 if the module is built into the kernel (nothing to do).
_guest_copy_module() {
    local name="$1" kver="$2" dst="$3" moddir="${VBLK_GUEST_MODDIR:-/lib/modules}/$2" f=""
    local alt="${name//_/-}" cand
    for cand in "$moddir"/kernel/drivers/virtio "$moddir"/kernel/drivers/block; do
        for f in "$cand/$name".ko{,.xz,.zst,.gz} "$cand/$alt".ko{,.xz,.zst,.gz}; do
            [[ -f "$f" ]] && break 2
            f=""
        done
    done
    if [[ -z "$f" ]]; then
        f="$(find "$moddir/kernel" \( -name "$name.ko*" -o -name "$alt.ko*" \) -print -quit 2>/dev/null)"
    fi
    if [[ -z "$f" ]]; then
        if grep -qE "/($name|$alt)\.ko\$" "$moddir/modules.builtin" 2>/dev/null; then
            return 2
        fi
        _guest_err "module $name not found under $moddir (and not built in)"
        return 1
    fi
    case "$f" in
    *.ko) cp "$f" "$dst" ;;
    *.ko.xz)
        command -v xz >/dev/null 2>&1 || { _guest_err "need xz (xz-utils) to unpack $f"; return 1; }
        xz -dc "$f" >"$dst"
        ;;
    *.ko.zst)
        command -v zstd >/dev/null 2>&1 || { _guest_err "need zstd to unpack $f"; return 1; }
        zstd -q -dc "$f" >"$dst"
        ;;
    *.ko.gz) gzip -dc "$f" >"$dst" ;;
    esac
}

# _guest_copy_modules KVER ROOT LIST MODULE...: copy each module into
# ROOT/lib/modules/vblk and name it in ROOT/LIST, in load order (built-in
# ones are skipped).
_guest_copy_modules() {
    local kver=$1 r=$2 list=$3 m rc
    shift 3
    : >"$r$list"
    for m in "$@"; do
        rc=0
        _guest_copy_module "$m" "$kver" "$r/lib/modules/vblk/$m.ko" || rc=$?
        case "$rc" in
        0) echo "$m" >>"$r$list" ;;
        2) ;; # built in
        *) return 1 ;;
        esac
    done
}

_guest_write_init() {
    cat >"$1" <<'EOF'
#!/bin/sh
# vblkd guest test /init (busybox sh)
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The kernel may not have had a /dev/console to give us: (re)attach.
[ -c /dev/console ] && exec </dev/console >/dev/console 2>&1
mkdir -p /dev/shm /dev/pts /tmp
mount -t tmpfs tmpfs /dev/shm
echo "VBLK-GUEST: init started, kernel $(uname -r), built for $(cat /etc/vblk-kver)"

# Parameters MODULE.PARAM=VALUE on the kernel command line go to the
# module, as modprobe would pass them (virtio_blk.poll_queues=1).
for m in $(cat /etc/vblk-modules); do
    # shellcheck disable=SC2046
    if ! insmod "/lib/modules/vblk/$m.ko" $(tr ' ' '\n' </proc/cmdline | sed -n "s/^$m\.//p"); then
        echo "VBLK-GUEST: insmod $m failed"
    fi
done

i=0
while [ ! -b /dev/vda ] && [ "$i" -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done

if [ ! -b /dev/vda ]; then
    echo "VBLK-RESULT: FAIL no /dev/vda"
    echo "VBLK-GUEST: --- virtio related kernel messages ---"
    dmesg | grep -iE 'virtio|vhost|vda|blk' | tail -n 30
    echo "VBLK-GUEST: --- PCI devices (vendor:device) ---"
    for d in /sys/bus/pci/devices/*; do
        echo "VBLK-GUEST: $(basename "$d") $(cat "$d/vendor"):$(cat "$d/device") driver=$(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)"
    done
    echo "VBLK-GUEST: loaded modules: $(lsmod | awk 'NR>1 {print $1}' | tr '\n' ' ')"
else
    nq=$(ls /sys/block/vda/mq 2>/dev/null | wc -l)
    echo "VBLK-GUEST: /dev/vda sectors=$(cat /sys/block/vda/size) ro=$(cat /sys/block/vda/ro) hw_queues=$nq lbs=$(cat /sys/block/vda/queue/logical_block_size) after ${i}x0.1s"
    if [ -f /scenario.sh ]; then
        cd /tmp
        sh /scenario.sh
        echo "VBLK-GUEST: scenario exited with status $?"
        cd /
    else
        echo "VBLK-GUEST: no /scenario.sh, nothing to do"
    fi
fi

echo "VBLK-GUEST-DONE"
sync
poweroff -f
# poweroff failed?  Exiting init panics the kernel; panic=-1 + -no-reboot
# makes QEMU exit anyway.
sleep 2
exit 1
EOF
    chmod 755 "$1"
}

# guest_build_initramfs [OUTDIR]: build OUTDIR/base.cpio.gz.  Cached: only
# rebuilt if missing, if it was built for another kernel version (recorded
# in OUTDIR/base.kver), if this lib.sh is newer, or if VBLK_GUEST_REBUILD=1.
guest_build_initramfs() (
    set -euo pipefail
    out="${1:-$VBLK_GUEST_BUILD_DEFAULT}"
    img="$out/base.cpio.gz"
    kver="$(guest_kver)" || exit 1
    if [[ -s "$img" && "${VBLK_GUEST_REBUILD:-0}" != 1 &&
        "$(cat "$out/base.kver" 2>/dev/null)" == "$kver" &&
        ! "$VBLK_GUEST_LIB_DIR/lib.sh" -nt "$img" ]]; then
        exit 0
    fi
    for t in cpio gzip ldd fio; do
        command -v "$t" >/dev/null 2>&1 || { _guest_err "missing tool: $t (run guest_deps)"; exit 1; }
    done
    bb="$(_guest_busybox)" || { _guest_err "no static busybox found (install busybox-static)"; exit 1; }
    moddir="${VBLK_GUEST_MODDIR:-/lib/modules}/$kver"
    [[ -d "$moddir" ]] || { _guest_err "no $moddir for kernel $(guest_kernel)"; exit 1; }
    mkdir -p "$out" || { _guest_err "cannot create $out"; exit 1; }
    # Keep the (large) artefacts out of git when building inside the repo.
    case "$(cd "$out" && pwd)/" in
    "$VBLK_REPO_ROOT"/*) [[ -e "$out/.gitignore" ]] || echo '*' >"$out/.gitignore" ;;
    esac

    staging="$(mktemp -d "$out/.initramfs.XXXXXX")"
    trap 'rm -rf "$staging" "$img.tmp"' EXIT
    r="$staging"
    mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,etc,lib/modules/vblk,lib64}

    # busybox + applet symlinks
    cp "$bb" "$r/bin/busybox"
    while IFS= read -r applet; do
        [[ -n "$applet" && ! -e "$r/$applet" ]] || continue
        mkdir -p "$r/$(dirname "$applet")"
        ln -s /bin/busybox "$r/$applet"
    done < <("$bb" --list-full)
    [[ -e "$r/bin/sh" ]] || ln -s busybox "$r/bin/sh"
    # Best effort (needs CAP_MKNOD); /init re-attaches to devtmpfs' console.
    mknod -m 600 "$r/dev/console" c 5 1 2>/dev/null || true

    # virtio (and 9p) modules, decompressed, plus the load order
    _guest_copy_modules "$kver" "$r" /etc/vblk-modules "${VBLK_GUEST_MODULES[@]}" || exit 1
    _guest_copy_modules "$kver" "$r" /etc/vblk-modules-9p "${VBLK_GUEST_MODULES_9P[@]}" || exit 1
    echo "$kver" >"$r/etc/vblk-kver"

    # fio and its shared libraries (+ dynamic loader)
    _guest_copy_with_libs "$(command -v fio)" "$r" || { _guest_err "copying fio failed"; exit 1; }
    if [[ "$(command -v fio)" != /usr/bin/fio ]]; then
        ln -sf "$(command -v fio)" "$r/usr/bin/fio" 2>/dev/null || true
    fi
    # util-linux blkdiscard (busybox's has no -z for write zeroes), under
    # its own name so busybox's applet stays as it is.
    if [[ -x /usr/sbin/blkdiscard ]]; then
        _guest_copy_with_libs /usr/sbin/blkdiscard "$r" /usr/sbin/blkdiscard-ul ||
            { _guest_err "copying blkdiscard failed"; exit 1; }
    fi

    _guest_write_init "$r/init"

    (cd "$r" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -6 >"$img.tmp"
    mv "$img.tmp" "$img"
    echo "$kver" >"$out/base.kver"
    echo "guest: built $img ($(du -h "$img" | cut -f1), kernel $kver)" >&2
)

# guest_scenario_cpio SCRIPT OUT: gzip'd newc cpio with SCRIPT as /scenario.sh
guest_scenario_cpio() (
    set -euo pipefail
    script="${1:-}" out="${2:-}"
    if [[ -z "$script" || -z "$out" ]]; then
        _guest_err "usage: guest_scenario_cpio SCRIPT OUT"
        exit 1
    fi
    [[ -r "$script" ]] || { _guest_err "scenario $script not readable"; exit 1; }
    command -v cpio >/dev/null 2>&1 || { _guest_err "missing tool: cpio"; exit 1; }
    mkdir -p "$(dirname "$out")"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    cp "$script" "$tmp/scenario.sh"
    chmod 755 "$tmp/scenario.sh"
    (cd "$tmp" && echo scenario.sh | cpio -o -H newc -R 0:0 --quiet) | gzip -9 >"$tmp/out.gz"
    mv "$tmp/out.gz" "$out"
)

# guest_initrd SCRIPT OUT [OUTDIR]: convenience: base (cached) + scenario.
guest_initrd() (
    set -euo pipefail
    script="${1:-}" out="${2:-}" dir="${3:-$VBLK_GUEST_BUILD_DEFAULT}"
    if [[ -z "$script" || -z "$out" ]]; then
        _guest_err "usage: guest_initrd SCRIPT OUT [OUTDIR]"
        exit 1
    fi
    guest_build_initramfs "$dir"
    guest_scenario_cpio "$script" "$out.scn"
    trap 'rm -f "$out.scn"' EXIT
    cat "$dir/base.cpio.gz" "$out.scn" >"$out"
)

# guest_qemu_argv SOCK NUMQ INITRD: set the array VBLK_GUEST_QEMU_ARGV to
# the QEMU command line of a guest booting INITRD with a vhost-user-blk disk
# on SOCK (NUMQ queues), serial console on stdio.  guest_boot and
# guest_qemu_start both use it, so a migration source and its destination
# get the same machine.
guest_qemu_argv() {
    local sock="${1:-}" numq="${2:-}" initrd="${3:-}"
    local qemu="${VBLK_GUEST_QEMU:-qemu-system-x86_64}"
    local mem="${VBLK_GUEST_MEM:-512M}" smp="${VBLK_GUEST_SMP:-2}"
    if [[ -z "$sock" || -z "$numq" || -z "$initrd" ]]; then
        _guest_err "usage: guest_qemu_argv SOCK NUMQ INITRD"
        return 1
    fi
    [[ -S "$sock" ]] || { _guest_err "vhost-user socket $sock does not exist (backend not running?)"; return 1; }
    [[ -r "$initrd" ]] || { _guest_err "initrd $initrd not readable"; return 1; }
    command -v "$qemu" >/dev/null 2>&1 || { _guest_err "missing $qemu (run guest_deps)"; return 1; }
    local kernel
    kernel="$(guest_kernel)" || return 1
    # VBLK_GUEST_EXTRA_DISKS is split on spaces (and glob-expanded), as the
    # unquoted expansion in guest_boot always did.
    local extra
    # shellcheck disable=SC2206
    extra=(${VBLK_GUEST_EXTRA_DISKS:-})
    # -nographic puts the serial console on stdio; -nic none / -vga none drop
    # q35's default e1000e (+ its iPXE ROM, ~1.5 s under TCG) and VGA.
    # shellcheck disable=SC2054  # commas belong to QEMU's options
    VBLK_GUEST_QEMU_ARGV=(
        "$qemu"
        -machine q35,accel=tcg -cpu max -smp "$smp" -m "$mem"
        -object "memory-backend-memfd,id=mem,size=$mem,share=on"
        -numa node,memdev=mem
        -kernel "$kernel" -initrd "$initrd"
        -append "console=ttyS0 panic=-1${VBLK_GUEST_APPEND:+ $VBLK_GUEST_APPEND}"
        -nographic -no-reboot -nic none -vga none
        -chardev "socket,id=c0,path=$sock${VBLK_GUEST_CHARDEV_OPTS:-}"
        -device "vhost-user-blk-pci,chardev=c0,num-queues=$numq${VBLK_GUEST_BLK_PROPS:-}"
        "${extra[@]}"
    )
}

# guest_boot SOCK NUMQ INITRD LOG [TIMEOUT_S]
# Boot the guest against the vhost-user socket SOCK (the backend must be
# listening already), serial console + QEMU's own messages go to LOG.
# Returns QEMU's exit status (124 on timeout).
guest_boot() {
    local sock="${1:-}" numq="${2:-}" initrd="${3:-}" log="${4:-}" tmo="${5:-240}"
    if [[ -z "$sock" || -z "$numq" || -z "$initrd" || -z "$log" ]]; then
        _guest_err "usage: guest_boot SOCK NUMQ INITRD LOG [TIMEOUT_S]"
        return 1
    fi
    command -v timeout >/dev/null 2>&1 || { _guest_err "missing timeout (coreutils)"; return 1; }
    guest_qemu_argv "$sock" "$numq" "$initrd" || return 1
    mkdir -p "$(dirname "$log")" || return 1

    local rc=0
    # stdin from /dev/null so QEMU never touches the caller's terminal.
    timeout -k 10 "$tmo" "${VBLK_GUEST_QEMU_ARGV[@]}" </dev/null >"$log" 2>&1 &
    # Waiting on a background job (rather than running QEMU in the
    # foreground) lets the caller's INT/TERM traps run immediately; they can
    # then call guest_boot_kill.
    VBLK_GUEST_BOOT_PID=$!
    wait "$VBLK_GUEST_BOOT_PID" || rc=$?
    VBLK_GUEST_BOOT_PID=""
    if ((rc == 124)); then
        _guest_err "QEMU timed out after ${tmo}s (log: $log)"
    elif ((rc != 0)); then
        _guest_err "QEMU exited with status $rc (log: $log)"
    fi
    return "$rc"
}

# guest_qemu_start SOCK NUMQ INITRD LOG TIMEOUT_S [QEMU ARGS...]
# Like guest_boot, but in the background and with extra QEMU arguments (a
# QMP socket, -incoming ...).  Sets VBLK_GUEST_QEMU_PID to the pid to wait
# for: QEMU under timeout(1), so its exit status is QEMU's (124 on timeout)
# and a SIGTERM to it reaches QEMU.  LOG is truncated; a migration
# destination's LOG holds the guest's console from when it runs there.
guest_qemu_start() {
    local sock="${1:-}" numq="${2:-}" initrd="${3:-}" log="${4:-}" tmo="${5:-}"
    VBLK_GUEST_QEMU_PID=""
    if [[ -z "$sock" || -z "$numq" || -z "$initrd" || -z "$log" || -z "$tmo" ]]; then
        _guest_err "usage: guest_qemu_start SOCK NUMQ INITRD LOG TIMEOUT_S [QEMU ARGS...]"
        return 1
    fi
    shift 5
    command -v timeout >/dev/null 2>&1 || { _guest_err "missing timeout (coreutils)"; return 1; }
    guest_qemu_argv "$sock" "$numq" "$initrd" || return 1
    mkdir -p "$(dirname "$log")" || return 1
    timeout -k 10 "$tmo" "${VBLK_GUEST_QEMU_ARGV[@]}" "$@" </dev/null >"$log" 2>&1 &
    # shellcheck disable=SC2034  # for the caller
    VBLK_GUEST_QEMU_PID=$!
}

# guest_qmp SOCK ARGS...: tests/guest/qmp.py SOCK ARGS..., the QMP client
# ("COMMAND [JSON-ARGS]", "migrate URI ...", "wait-status STATUS",
# "wait-socket"; see qmp.py).
guest_qmp() {
    command -v python3 >/dev/null 2>&1 || { _guest_err "missing python3"; return 1; }
    python3 "$VBLK_GUEST_LIB_DIR/qmp.py" "$@"
}

# guest_wait_log LOG PATTERN SECONDS [PID]: wait until a line of LOG (CRs
# stripped) matches the extended regex PATTERN.  1 on timeout; 2 if PID
# (when given) exits first.
guest_wait_log() {
    local log="${1:-}" pat="${2:-}" secs="${3:-}" pid="${4:-}" i
    if [[ -z "$log" || -z "$pat" || -z "$secs" ]]; then
        _guest_err "usage: guest_wait_log LOG PATTERN SECONDS [PID]"
        return 1
    fi
    for ((i = 0; i < secs * 10; i++)); do
        if [[ -f "$log" ]] && tr -d '\r' <"$log" | grep -aE -- "$pat" >/dev/null; then
            return 0
        fi
        if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
            return 2
        fi
        sleep 0.1
    done
    return 1
}

# guest_boot_kill: stop a guest_boot still running (for the caller's traps).
guest_boot_kill() {
    local pid="${VBLK_GUEST_BOOT_PID:-}"
    [[ -n "$pid" ]] || return 0
    # timeout(1) forwards the signal to QEMU; -k 10 escalates to SIGKILL.
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    VBLK_GUEST_BOOT_PID=""
}

# guest_log_has LOG ERE: 0 iff a line of LOG (CRs stripped) matches ERE.
# Every check of a log goes through here.  Not "tr <LOG | grep -q": grep -q
# leaves at the first match, tr's next write then dies of SIGPIPE, and
# under pipefail the pipe fails although the line is there (how a CI run
# lost the results of the first disks of a boot, the ones early in the
# log).  grep -c reads to the end.
guest_log_has() {
    local n
    [[ -r "${1:-}" ]] || return 1
    n=$(tr -d '\r' <"$1" | grep -acE -- "${2:-}")
    ((n > 0))
}

# guest_log_result LOG [NAME]: 0 iff LOG has "VBLK-RESULT: PASS [NAME]",
# no "VBLK-RESULT: FAIL [NAME]" (with NAME: another scenario of the same
# boot may fail on its own) and the VBLK-GUEST-DONE marker.  Markers are
# matched anywhere in a line: kernel messages can be interleaved with guest
# output.
guest_log_result() {
    local log="${1:-}" name="${2:-}"
    [[ -r "$log" ]] || { _guest_err "log $log not readable"; return 1; }
    guest_log_has "$log" "VBLK-RESULT: FAIL${name:+ $name}( |\$)" && return 1
    guest_log_has "$log" "VBLK-RESULT: PASS${name:+ $name}( |\$)" || return 1
    guest_log_has "$log" 'VBLK-GUEST-DONE' || return 1
}

# guest_log_verdict LOG NAME: a PASS:/FAIL: line for the disk NAME of a
# multi-disk boot (scenarios/multi.sh), saying what the log holds when it
# has no verdict for NAME.
guest_log_verdict() {
    local log=$1 name=$2 why
    if guest_log_result "$log" "$name"; then
        echo "PASS: guest-$name"
        return 0
    fi
    why=$(tr -d '\r' <"$log" | grep -ao "VBLK-RESULT: FAIL $name\( .*\)\?\$" | head -1)
    if [[ -z $why ]]; then
        if ! guest_log_has "$log" "serial=$name( |\$)"; then why="the guest did not see this disk"
        elif ! guest_log_has "$log" 'VBLK-GUEST-DONE'; then why="the guest did not finish"
        else why="no VBLK-RESULT line for it"; fi
    fi
    echo "FAIL: guest-$name: $why (see $log)"
    return 1
}

# guest_log_lines LOG PREFIX: print the "PREFIX..." parts of LOG's lines
# (e.g. PREFIX=VBLK-IRQ:), CRs stripped.  Prints nothing if none.
guest_log_lines() {
    local log="${1:-}" prefix="${2:-}"
    if [[ -z "$log" || -z "$prefix" ]]; then
        _guest_err "usage: guest_log_lines LOG PREFIX"
        return 1
    fi
    [[ -r "$log" ]] || { _guest_err "log $log not readable"; return 1; }
    tr -d '\r' <"$log" | grep -ao -- "$prefix.*" || true
}
