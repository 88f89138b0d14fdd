#!/usr/bin/env bash
# Description: vblkd as an installed service: what `meson install` lays out
# (binaries, man pages that render cleanly, the unit, sysusers.d and
# tmpfiles.d, nothing of the tests), the unit as systemd-analyze verify
# reads it, its system call filter against what vblkd calls, readiness over
# NOTIFY_SOCKET, and the Debian packages: built from a copy of the tree,
# lintian without errors, installed (vblkd alone first: an RBD or NBD disk
# then names the package of its engine module; then vblkd-rbd and
# vblkd-nbd, whose modules load), run as its user, purged.
# Prints PASS:/FAIL:/SKIP: lines for tests/run.
set -uo pipefail
BUILD=$(cd "${1:?usage: test_pkg.sh PATH/TO/BUILD}" && pwd)
top=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d /tmp/vblk-pkg.XXXXXX)
chmod 0755 "$tmp"	# the user vblkd walks into it (deb-service-run)
pids=()
installed=0 made_user=0
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    if ((installed)); then
        for p in vblkd-rbd vblkd-nbd vblkd; do
            dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed &&
                dpkg -P "$p" >/dev/null 2>&1
        done
    fi
    if ((made_user)) && getent passwd vblkd >/dev/null; then
        userdel vblkd 2>/dev/null; groupdel vblkd 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; }
skip() { echo "SKIP: $1${2:+: $2}"; }

# wait_for FILE PATTERN: up to 10 s for a line matching PATTERN in FILE.
wait_for() {
    for _ in $(seq 200); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

# man_clean PAGE: groff reads it without a warning and man renders a NAME.
man_clean() {
    local w
    w=$(groff -man -Tutf8 -ww -z "$1" 2>&1) || return 1
    [[ -z $w ]] || { echo "$w"; return 1; }
    # grep -c, not -q: -q leaves at the first line, man dies of SIGPIPE
    # and under pipefail the check fails (tests/guest/lib.sh, guest_log_has).
    [[ $(MANWIDTH=80 man -P cat -l "$1" 2>/dev/null | grep -c '^NAME') != 0 ]]
}

# verify_unit UNIT MANPATH: systemd-analyze verify on an instance of the
# template UNIT says nothing (it exits 0 even on unknown keys).
verify_unit() {
    local dir out
    dir=$(dirname "$1")
    out=$(cd "$dir" && MANPATH=$2 systemd-analyze verify "$dir/vblkd@disk0.service" 2>&1) ||
        { echo "$out"; return 1; }
    [[ -z $out ]] || { echo "$out"; return 1; }
}

# ---- meson install into a DESTDIR
dest=$tmp/dest
eval "$(meson introspect "$BUILD" --buildoptions | python3 -c '
import json, sys, os
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
p = o["prefix"]
for k in ("bindir", "libdir", "mandir", "datadir", "sysconfdir"):
    print("%s=%s" % (k, os.path.join(p, o[k])))
print("unitdir=%s" % o["systemdsystemunitdir"])')"
if [[ -z $unitdir ]]; then
    unitdir=$(pkg-config --variable=systemdsystemunitdir systemd 2>/dev/null) ||
        unitdir=$(dirname "$bindir")/lib/systemd/system
fi
if meson install -C "$BUILD" --destdir "$dest" --no-rebuild >"$tmp/install.log" 2>&1; then
    pass meson-install
else
    fail meson-install "$(tail -5 "$tmp/install.log")"
fi
bad=""
for b in vblkd vblkctl vblk-bench; do
    [[ -f $dest$bindir/$b && -x $dest$bindir/$b ]] || bad+=" $bindir/$b"
done
[[ -z $bad ]] && pass install-binaries || fail install-binaries "missing or not executable:$bad"
# The engine modules this build has, where vblkd looks for them.
bad="" mods=""
for m in "$BUILD"/vblkd-*.so; do
    [[ -f $m ]] || continue
    mods+=" $(basename "$m")"
    [[ -f $dest$libdir/vblkd/$(basename "$m") ]] || bad+=" $libdir/vblkd/$(basename "$m")"
done
if [[ -z $mods ]]; then
    skip install-modules "built without the rbd and nbd engines"
else
    [[ -z $bad ]] && pass "install-modules ($mods )" || fail install-modules "missing:$bad"
fi
bad=""
for m in man8/vblkd.8 man8/vblkctl.8 man1/vblk-bench.1; do
    [[ -f $dest$mandir/$m ]] || bad+=" $mandir/$m"
done
[[ -z $bad ]] && pass install-man-pages || fail install-man-pages "missing:$bad (scdoc installed? scripts/deps.sh build)"
bad=""
for f in "$unitdir/vblkd@.service" "$datadir/doc/vblkd/examples/disk0.conf"; do
    [[ -f $dest$f ]] || bad+=" $f"
done
# systemd.pc's sysusersdir and tmpfilesdir, else PREFIX/lib/...
for d in sysusers.d tmpfiles.d; do
    [[ -n $(find "$dest" -path "*/lib/$d/vblkd.conf") ]] || bad+=" $d/vblkd.conf"
done
[[ -d $dest$sysconfdir/vblkd ]] || bad+=" $sysconfdir/vblkd/"
[[ -z $bad ]] && pass install-service-files || fail install-service-files "missing:$bad"
extra=$(find "$dest" -name 'test_*' -o -name 'hostile-shrink' -o -name 'fuzz_*' -o -name '*.a')
[[ -z $extra ]] && pass install-no-tests || fail install-no-tests "installed: $extra"
bad=""
for m in "$dest$mandir"/man*/*; do
    [[ -f $m ]] || { bad+=" (no man pages)"; break; }
    out=$(man_clean "$m") || bad+=" $(basename "$m")${out:+ ($out)}"
done
[[ -z $bad ]] && pass man-pages-render || fail man-pages-render "$bad"

# ---- the unit, its ExecStart pointed at the DESTDIR binary
mkdir -p "$tmp/unit"
sed "s|$bindir/vblkd |$dest$bindir/vblkd |; s|$bindir/vblkctl |$dest$bindir/vblkctl |" \
    "$dest$unitdir/vblkd@.service" >"$tmp/unit/vblkd@.service"
if out=$(verify_unit "$tmp/unit/vblkd@.service" "$dest$mandir"); then
    pass unit-verify
else
    fail unit-verify "$out"
fi
grep -q "^EnvironmentFile=$sysconfdir/vblkd/%i.conf$" "$tmp/unit/vblkd@.service" &&
    grep -q "^ExecStart=$dest$bindir/vblkd --socket /run/vblkd/%i.sock --control /run/vblkd/%i.ctl " \
        "$tmp/unit/vblkd@.service" &&
    pass unit-paths || fail unit-paths "EnvironmentFile= or ExecStart= not the installed paths"

# ---- what vblkd calls serving a disk, against the unit's SystemCallFilter=
truncate -s 64M "$tmp/disk.img"
: >"$tmp/trace"
# With --metrics (where this vblkd has it) the HTTP server is traced too.
metrics=()
if [[ $("$BUILD/vblkd" --help | grep -c -- --metrics) != 0 ]]; then
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    metrics=(--metrics "127.0.0.1:$port")
fi
for engine in io_uring aio threads; do
    strace -f -qq -o "$tmp/trace.$engine" "$BUILD/vblkd" --socket "$tmp/s.sock" \
        --control "$tmp/s.ctl" --disk "$tmp/disk.img" --backend "$engine" --queues 2 \
        --iothreads 2 --cpu-affinity 0 "${metrics[@]}" >"$tmp/strace-$engine.log" 2>&1 &
    sp=$!
    if ! wait_for "$tmp/strace-$engine.log" serving; then
        fail unit-syscall-filter "$engine: vblkd did not start: $(tail -3 "$tmp/strace-$engine.log")"
        kill "$sp"; wait "$sp"
        continue
    fi
    vp=$(pgrep -P "$sp")
    "$BUILD/vblk-bench" --socket "$tmp/s.sock" --rw randrw --verify --numjobs 2 --iodepth 8 \
        --runtime 0.5 --ramp 0 >/dev/null 2>&1
    "$BUILD/vblk-bench" --socket "$tmp/s.sock" --rw trim --packed --runtime 0.3 --ramp 0 >/dev/null 2>&1
    "$BUILD/vblkctl" --control "$tmp/s.ctl" stats >/dev/null
    "$BUILD/vblkctl" --control "$tmp/s.ctl" resize 128M >/dev/null
    if ((${#metrics[@]})); then
        python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5).read()' \
            "http://127.0.0.1:$port/metrics" || fail unit-syscall-filter "$engine: GET /metrics failed"
        "$BUILD/vblkctl" --control "$tmp/s.ctl" metrics >/dev/null
    fi
    if [[ $engine == io_uring ]]; then
        # Upgrade in place, a frontend connected (strace follows the new
        # process, which serves on).
        "$BUILD/vblk-bench" --socket "$tmp/s.sock" --rw randread --runtime 0.3 --ramp 0 \
            --hold 2 >/dev/null 2>&1 &
        bp=$!
        sleep 0.5
        np=$("$BUILD/vblkctl" --control "$tmp/s.ctl" upgrade 2>&1 |
             sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')
        wait "$bp"
        [[ -n $np ]] && vp=$np || fail unit-syscall-filter "io_uring: vblkctl upgrade failed"
    fi
    kill -USR1 "$vp"; sleep 0.1; kill "$vp"; wait "$sp"
    cat "$tmp/trace.$engine" >>"$tmp/trace"
done
out=$(python3 - "$tmp/trace" "$dest$unitdir/vblkd@.service" <<'EOF'
# The allow list (SystemCallFilter=) minus the deny lists (=~), expanded by
# systemd-analyze; print every system call the trace shows outside it.
import re, subprocess, sys
def expand(name):
    if not name.startswith("@"):
        return {name}
    out = set()
    text = subprocess.run(["systemd-analyze", "syscall-filter", name],
                          capture_output=True, text=True, check=True).stdout
    for line in text.splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith("#"):
            out |= expand(line)
    return out
allow, deny = None, set()
for line in open(sys.argv[2]):
    m = re.match(r"SystemCallFilter=(~?)(.*)", line.strip())
    if not m:
        continue
    names = set().union(*(expand(n) for n in m.group(2).split()))
    if m.group(1):
        deny |= names
    else:
        allow = names if allow is None else allow | names
used = set(re.findall(r"^\d+ +([a-z0-9_]+)\(", open(sys.argv[1]).read(), re.M))
if not used or allow is None:
    print("no trace, or no SystemCallFilter= allow list")
print(" ".join(sorted(used - (allow - deny))))
EOF
)
out=$(echo "$out" | xargs)
[[ -z $out ]] && pass unit-syscall-filter || fail unit-syscall-filter "vblkd calls, the unit forbids: $out"

# ---- readiness over NOTIFY_SOCKET: READY=1 once both sockets accept; on
# an upgrade in place MAINPID= of the new process (waited for with a
# barrier) and its own READY=1, no STOPPING=1 from the old; STOPPING=1 on
# SIGTERM.  The listener writes "PID MESSAGE" lines, as systemd sees them.
python3 - "$tmp/notify.sock" "$tmp/r.sock" "$tmp/r.ctl" "$tmp/notify.out" <<'EOF' &
import array, os, socket, struct, sys
path, vsock, csock, out = sys.argv[1:5]
def accepts(p):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        c.connect(p)
        return "yes"
    except OSError as e:
        return "no (%s)" % e.strerror
    finally:
        c.close()
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
s.bind(path)
s.settimeout(20)
with open(out, "w") as f:
    f.write("0 bound\n")
    f.flush()
    while True:
        try:
            data, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(64))
        except socket.timeout:
            f.write("0 timeout\n")
            break
        pid = 0
        for level, kind, cdata in anc:
            if kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", cdata[:12])[0]
            elif kind == socket.SCM_RIGHTS:
                # BARRIER=1: closing its fd is the answer.
                fds = array.array("i")
                fds.frombytes(cdata[:len(cdata) - len(cdata) % fds.itemsize])
                for fd in fds:
                    os.close(fd)
        for line in filter(None, data.decode().split("\n")):
            if line == "READY=1":
                line += " socket=%s control=%s" % (accepts(vsock), accepts(csock))
            f.write("%d %s\n" % (pid, line))
            f.flush()
        if "STOPPING=1" in data.decode().split("\n"):
            break
EOF
pids+=($!)
lp=$!
wait_for "$tmp/notify.out" bound
NOTIFY_SOCKET=$tmp/notify.sock "$BUILD/vblkd" --socket "$tmp/r.sock" --control "$tmp/r.ctl" \
    --disk "$tmp/disk.img" >"$tmp/r.log" 2>&1 &
vp=$!
pids+=($vp)
if wait_for "$tmp/notify.out" "^$vp READY=1"; then
    if grep -q "^$vp READY=1 socket=yes control=yes$" "$tmp/notify.out"; then
        pass notify-ready-after-listen
    else
        fail notify-ready-after-listen "$(grep READY "$tmp/notify.out")"
    fi
    grep -q "^$vp STATUS=" "$tmp/notify.out" && pass notify-status ||
        fail notify-status "no STATUS= with READY=1"
else
    fail notify-ready-after-listen "no READY=1 from pid $vp in 10 s: $(cat "$tmp/notify.out")"
fi
# The old process's exit waits for the barrier: well under its 5 s.
np=$("$BUILD/vblkctl" --control "$tmp/r.ctl" upgrade 2>&1 | sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')
t0=$(date +%s%N)
rc=0; wait "$vp" || rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
if [[ -z $np ]]; then
    fail notify-mainpid-on-upgrade "vblkctl upgrade gave no pid: $(tail -3 "$tmp/r.log")"
    np=$vp
elif grep -q "^$vp MAINPID=$np$" "$tmp/notify.out" && wait_for "$tmp/notify.out" "^$np READY=1" &&
     ! grep -q "^$vp STOPPING=1" "$tmp/notify.out" && ((rc == 0 && ms < 3000)); then
    pass notify-mainpid-on-upgrade
else
    fail notify-mainpid-on-upgrade "old pid $vp exit $rc after $ms ms, new pid $np; got: $(tr '\n' ' ' <"$tmp/notify.out")"
fi
kill -TERM "$np"
for _ in $(seq 200); do kill -0 "$np" 2>/dev/null || break; sleep 0.05; done
wait "$lp"
if grep -q "^$np STOPPING=1" "$tmp/notify.out" && ! kill -0 "$np" 2>/dev/null; then
    pass notify-stopping-on-sigterm
else
    kill -KILL "$np" 2>/dev/null
    fail notify-stopping-on-sigterm "got: $(tr '\n' ' ' <"$tmp/notify.out")"
fi

# ---- the Debian package, built in a copy of the tree (it writes ../*.deb)
mkdir -p "$tmp/deb/src"
if git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$top" ls-files -z -co --exclude-standard | (cd "$top" && tar --null -T - -c) |
        tar -x -C "$tmp/deb/src"
else
    tar -C "$top" --exclude=./build --exclude='./build-*' --exclude=./.git -c . | tar -x -C "$tmp/deb/src"
fi
# The source package first, from the pristine copy, for lintian.
(cd "$tmp/deb/src" && dpkg-buildpackage -S -us -uc) >"$tmp/deb-source.log" 2>&1 ||
    fail deb-source-builds "$(tail -15 "$tmp/deb-source.log")"
t0=$(date +%s)
if (cd "$tmp/deb/src" && DEB_BUILD_OPTIONS="parallel=$(nproc) noddebs" \
        dpkg-buildpackage -b -us -uc) >"$tmp/deb-build.log" 2>&1; then
    pass "deb-builds ($(($(date +%s) - t0)) s)"
else
    fail deb-builds "$(tail -15 "$tmp/deb-build.log")"
fi
deb=$(ls "$tmp"/deb/vblkd_*.deb 2>/dev/null | head -1)
mod_debs=$(ls "$tmp"/deb/vblkd-rbd_*.deb "$tmp"/deb/vblkd-nbd_*.deb 2>/dev/null)
if [[ -z $deb ]]; then
    skip deb-lintian "no .deb"
else
    lintian -I --pedantic "$deb" $mod_debs "$tmp"/deb/vblkd_*.dsc >"$tmp/lintian.log" 2>/dev/null
    sed 's/^/    lintian: /' "$tmp/lintian.log"
    if grep -q '^E: ' "$tmp/lintian.log"; then
        fail deb-lintian "$(grep '^E: ' "$tmp/lintian.log" | tr '\n' ' ')"
    else
        pass "deb-lintian ($(grep -c '^W: ' "$tmp/lintian.log") warnings)"
    fi
fi

if [[ -z $deb ]]; then
    skip deb-installs "no .deb"
elif dpkg-query -W -f='${Status}' vblkd vblkd-rbd vblkd-nbd 2>/dev/null | grep -q 'install ok installed'; then
    skip deb-installs "a vblkd package is installed on this machine; not replacing it"
else
    getent passwd vblkd >/dev/null || made_user=1
    installed=1
    if dpkg -i "$deb" >"$tmp/dpkg-i.log" 2>&1; then
        pass deb-installs
    else
        fail deb-installs "$(tail -10 "$tmp/dpkg-i.log")"
    fi
    dpkg -L vblkd >"$tmp/files" 2>/dev/null
    # vblkd alone: an RBD or NBD disk names the package of its module.
    moddir=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/vblkd
    rc=0; /usr/bin/vblkd --socket "$tmp/m.sock" --disk rbd:pool/image >"$tmp/m.out" 2>&1 || rc=$?
    if ((rc == 1)) && [[ $(cat "$tmp/m.out") == "vblkd: --disk 'rbd:pool/image' needs the rbd engine module $moddir/vblkd-rbd.so, which is not installed: install the Debian package vblkd-rbd" ]]; then
        pass deb-module-missing-names-package
    else
        fail deb-module-missing-names-package "rc=$rc: $(cat "$tmp/m.out")"
    fi
    if [[ -z $mod_debs ]]; then
        skip deb-modules-install "no vblkd-rbd or vblkd-nbd package built"
    elif dpkg -i $mod_debs >"$tmp/dpkg-i-mod.log" 2>&1; then
        pass deb-modules-install
        dpkg -L vblkd-rbd vblkd-nbd >>"$tmp/files" 2>/dev/null
        # Installed, each loads: the engine itself answers (no server).
        bad=""
        for m in $mod_debs; do
            case $(basename "$m") in
            vblkd-rbd_*) d=rbd:pool/image more=(--ceph-conf "$tmp/no-such-ceph.conf")
                         want="cannot read Ceph config" ;;
            *) d=nbd://127.0.0.1:1/export more=() want="NBD export .* cannot connect" ;;
            esac
            /usr/bin/vblkd --socket "$tmp/m.sock" --disk "$d" "${more[@]}" >"$tmp/m.out" 2>&1
            grep -q "$want" "$tmp/m.out" || bad+=" $d: $(cat "$tmp/m.out")"
        done
        [[ -z $bad ]] && pass deb-modules-load || fail deb-modules-load "$bad"
    else
        fail deb-modules-install "$(tail -10 "$tmp/dpkg-i-mod.log")"
    fi
    v=$(/usr/bin/vblkd --version 2>&1)
    [[ $v == "vblkd $(dpkg-query -W -f='${Version}' vblkd)" ]] && pass deb-vblkd-version ||
        fail deb-vblkd-version "/usr/bin/vblkd --version: $v"
    if [[ -f /lib/systemd/system/vblkd@.service ]] &&
       out=$(verify_unit /lib/systemd/system/vblkd@.service ""); then
        pass deb-unit-verify
    else
        fail deb-unit-verify "/lib/systemd/system/vblkd@.service: ${out:-missing}"
    fi
    bad=""
    for m in vblkd.8 vblkctl.8 vblk-bench.1; do
        f=$(man -w "${m##*.}" "${m%.*}" 2>/dev/null)
        [[ $f == /usr/share/man/man${m##*.}/$m.gz ]] || bad+=" $m (${f:-not found})"
    done
    [[ -f /usr/share/doc/vblkd/examples/disk0.conf ]] || bad+=" examples/disk0.conf"
    [[ -z $bad ]] && pass deb-man-pages || fail deb-man-pages "$bad"
    if getent passwd vblkd | grep -q ':/usr/sbin/nologin$' &&
       [[ $(stat -c %U:%G:%a /var/lib/vblkd 2>/dev/null) == vblkd:vblkd:750 ]]; then
        pass deb-user
    else
        fail deb-user "$(getent passwd vblkd); /var/lib/vblkd: $(stat -c %U:%G:%a /var/lib/vblkd 2>&1)"
    fi

    # As the unit runs it (User=vblkd, UMask=0007, a 0750 runtime directory):
    # the sockets are the group's, a member of group vblkd connects (as QEMU
    # would), anybody else is refused.
    run=$tmp/run
    install -d -o vblkd -g vblkd -m 0750 "$run"
    truncate -s 16M /var/lib/vblkd/test-pkg.img
    chown vblkd:vblkd /var/lib/vblkd/test-pkg.img
    (umask 0007; exec setpriv --reuid vblkd --regid vblkd --init-groups /usr/bin/vblkd \
        --socket "$run/t.sock" --control "$run/t.ctl" --disk /var/lib/vblkd/test-pkg.img) \
        >"$tmp/svc.log" 2>&1 &
    vp=$!
    pids+=($vp)
    if ! wait_for "$tmp/svc.log" serving; then
        fail deb-service-run "vblkd as user vblkd: $(cat "$tmp/svc.log")"
    else
        modes=$(stat -c '%A %U:%G' "$run/t.sock" "$run/t.ctl" | sort -u)
        setpriv --reuid nobody --regid nogroup --clear-groups /usr/bin/vblkctl \
            --control "$run/t.ctl" stats >/dev/null 2>&1 && outsider=yes || outsider=no
        setpriv --reuid nobody --regid nogroup --groups vblkd /usr/bin/vblk-bench \
            --socket "$run/t.sock" --rw randrw --verify --runtime 0.5 --ramp 0 \
            >"$tmp/member.log" 2>&1 && member=yes || member=no
        if [[ $modes == "srwxrwx--- vblkd:vblkd" && $outsider == no && $member == yes ]]; then
            pass deb-service-run
        else
            fail deb-service-run "sockets: $modes; outsider connects: $outsider; group member verifies: $member ($(tail -2 "$tmp/member.log"))"
        fi
        # systemctl reload: the unit's ExecReload, as the unit's user,
        # upgrades in place; the new process serves as that user too.
        reload=$(sed -n 's/^ExecReload=//p' /lib/systemd/system/vblkd@.service)
        reload=${reload//\/run\/vblkd\/%i.ctl/$run/t.ctl}
        np=""
        if setpriv --reuid vblkd --regid vblkd --init-groups $reload >"$tmp/reload.out" 2>&1; then
            np=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$tmp/reload.out")
            pids+=($np)
        fi
        wait "$vp" 2>/dev/null
        if [[ -n $np ]] && [[ $(stat -c %U "/proc/$np" 2>/dev/null) == vblkd ]] &&
           setpriv --reuid nobody --regid nogroup --groups vblkd /usr/bin/vblk-bench \
               --socket "$run/t.sock" --rw randrw --verify --runtime 0.3 --ramp 0 >/dev/null 2>&1; then
            pass deb-service-reload-upgrades-in-place
        else
            fail deb-service-reload-upgrades-in-place "$reload: $(cat "$tmp/reload.out")"
        fi
        [[ -n $np ]] && kill "$np" 2>/dev/null
        for _ in $(seq 100); do [[ -z $np || ! -e /proc/$np ]] && break; sleep 0.05; done
    fi
    kill "$vp" 2>/dev/null; wait "$vp" 2>/dev/null
    rm -f /var/lib/vblkd/test-pkg.img

    purge=(vblkd)
    for p in vblkd-rbd vblkd-nbd; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed && purge=("$p" "${purge[@]}")
    done
    if dpkg -P "${purge[@]}" >"$tmp/dpkg-p.log" 2>&1; then
        left=""
        while read -r f; do
            [[ -e $f && ! -d $f ]] && left+=" $f"
        done <"$tmp/files"
        for d in /etc/vblkd /var/lib/vblkd; do [[ -e $d ]] && left+=" $d"; done
        dpkg-query -W -f='${Status}' "${purge[@]}" 2>/dev/null | grep -q 'installed' &&
            left+=" (still installed)"
        [[ -z $left ]] && pass deb-purges || fail deb-purges "left behind:$left"
    else
        fail deb-purges "$(tail -10 "$tmp/dpkg-p.log")"
    fi
fi
