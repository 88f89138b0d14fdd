#!/usr/bin/env python3
"""tests/format/mutate.py: the mutation campaign (issue 44, item 6).

Valid images made by the ecosystem's own tools (the bases: qcow2 by
qemu-img and qemu-io, v2 and v3, 512-byte to 2 MiB clusters, 1- to 64-bit
refcounts, compressed with zlib and zstd, internal snapshots, raw and
qcow2 backing files, lazy refcounts; LUKS1 and LUKS2 by cryptsetup, PBKDF2
and Argon2id, one and two keyslots) are mutated deterministically by seed
(bit flips in headers and tables, fields set to 0, 1, max or off by one,
tables pointed at each other, the header, data or past the end, refcounts
set to their extremes, keyslot costs at their maximum, a LUKS2 primary
header damaged), and each mutant is served by vblkd and driven by
mutant-io.  Per mutant:

  refused       vblkd exits non-zero within --start-timeout with exactly
                one error line, and the file is byte for byte what it was
                (else: hang, refusal-lines, refused-modified);
  served        every request answered within --request-timeout
                (mutant-io; unanswered), SIGTERM exits within --term-timeout
                (sigterm), the file's allocated growth <= virtual size +
                64 MiB and its apparent size <= max(before, 2 x virtual size
                + 64 MiB) (growth), a LUKS header (everything before the
                payload) unchanged (header-modified), and for qcow2 no more
                corruptions (qemu-img check) than before or than QEMU leaves
                when the same writes go through qemu-io (worse-than-qemu);
  served-raw    the magic is gone and vblkd probed the file as raw, as QEMU
                does; but not an image cryptsetup isLuks still takes for
                LUKS from its secondary header (luks-served-raw): the
                guest's writes go over its headers and keyslots;
  always        no sanitizer report, no death by a signal (crash), no other
                file in the image's directory (backing files, key files)
                changed (other-files).

Prints one line per mutant (what was mutated, what happened), a table of
outcomes per class and per base, every failure with a command that
reproduces it; --json FILE writes all of it.  Exit 1 when anything failed.

  tests/format/mutate.py --vblkd build-asan/vblkd --mutant-io build-asan/mutant-io \\
      --count 300 --first-seed 1
  tests/format/mutate.py --vblkd ... --base qcow2-v3-64k --seed 17 --keep /tmp/m
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20
SAN_PATTERNS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                "SUMMARY: ", "AddressSanitizer:DEADLYSIGNAL")
KINDS = ("crash", "hang", "unanswered", "sigterm", "growth", "refused-modified",
         "refusal-lines", "header-modified", "luks-served-raw", "other-files",
         "worse-than-qemu")
LOG_LINE = re.compile(r"^vblkd\[[^\]]*\] \S+ (error|warn|info|debug): ")
DIE_LINE = re.compile(r"^vblkd: ")
FORMAT_LINE = re.compile(r" info: format: (.*)")


def run(cmd, cwd=None, timeout=60, stdin=None, check=True):
    p = subprocess.run(cmd, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: rc={p.returncode}: {p.stdout.decode()[-400:]}")
    return p


# ---------------------------------------------------------------- bases
#
# Each base is a directory: the image ("disk.qcow2" or "disk.luks") and
# the files that belong to it (backing files, key files), copied whole
# for every mutant.  Contents are deterministic where the tools allow
# (cryptsetup's salts and qemu-img snapshot's dates are not).

def pattern_data(seed, size, fill=0.25):
    """size bytes: compressible runs, some random blocks, the rest zero."""
    r = random.Random(seed)
    out = bytearray(size)
    for off in range(0, int(size * fill), 64 << 10):
        if r.random() < 0.3:
            out[off:off + (64 << 10)] = r.randbytes(64 << 10)
        else:
            out[off:off + (64 << 10)] = bytes([r.randrange(256)]) * (48 << 10) + \
                r.randbytes(16 << 10)
    return bytes(out)


def qemu_io(img, cmds, fmt="qcow2"):
    args = ["qemu-io", "-f", fmt]
    for c in cmds:
        args += ["-c", c]
    run(args + [img])


# Writes that leave tables, refcount blocks and data all over a 64 MiB disk.
WRITES = ["write -P 0x11 0 1M", "write -P 0x22 5M 192k", "write -P 0x33 17M 64k",
          "write -P 0x44 40M 2M", "write -P 0x55 63M 1M", "write -z 5M 64k",
          "write -P 0x66 9M 4k", "discard 40M 128k"]


def small(writes, size):
    """The writes that fit a disk of size bytes."""
    def end(c):
        off, ln = c.split()[-2:]
        return parse_size(off) + parse_size(ln)
    return [c for c in writes if end(c) <= size]


def parse_size(s):
    mult = {"k": 1 << 10, "M": MiB, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def make_qcow2(d, opts, size, writes):
    img = os.path.join(d, "disk.qcow2")
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", opts, img, str(size)])
    if writes:
        qemu_io(img, small(writes, size))


def base_compressed(d, ct):
    raw = os.path.join(d, "src.raw")
    with open(raw, "wb") as f:
        f.write(pattern_data(7, 32 * MiB))
    run(["qemu-img", "convert", "-q", "-c", "-O", "qcow2", "-o",
         f"compression_type={ct}", raw, os.path.join(d, "disk.qcow2")])
    os.unlink(raw)
    qemu_io(os.path.join(d, "disk.qcow2"), ["write -P 0x77 1M 64k", "write -P 0x78 20M 128k"])


def base_snap(d):
    img = os.path.join(d, "disk.qcow2")
    run(["qemu-img", "create", "-q", "-f", "qcow2", img, "32M"])
    qemu_io(img, ["write -P 0x11 0 2M", "write -P 0x12 8M 1M"])
    run(["qemu-img", "snapshot", "-c", "s1", img])
    qemu_io(img, ["write -P 0x21 1M 2M", "write -P 0x22 20M 64k"])
    run(["qemu-img", "snapshot", "-c", "s2", img])
    qemu_io(img, ["write -P 0x31 0 128k", "write -P 0x32 30M 1M"])


def base_backing(d, kind):
    if kind == "raw":
        with open(os.path.join(d, "base.raw"), "wb") as f:
            f.write(pattern_data(11, 16 * MiB, fill=0.5))
        back, fmt = "base.raw", "raw"
    else:
        run(["qemu-img", "create", "-q", "-f", "qcow2", os.path.join(d, "base.qcow2"), "16M"])
        qemu_io(os.path.join(d, "base.qcow2"), ["write -P 0xb1 0 3M", "write -P 0xb2 8M 1M"])
        back, fmt = "base.qcow2", "qcow2"
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", back, "-F", fmt, "disk.qcow2", "16M"],
        cwd=d)
    qemu_io(os.path.join(d, "disk.qcow2"), ["write -P 0x71 1M 64k", "write -P 0x72 2M 1M",
                                            "write -P 0x73 12M 32k"])


def make_luks(d, ltype, extra=(), slots=1):
    img = os.path.join(d, "disk.luks")
    key = os.path.join(d, "key")
    with open(key, "wb") as f:
        f.write(b"mutate campaign passphrase 0")
    with open(img, "wb") as f:
        f.truncate((16 if ltype == "luks2" else 2) * MiB + 16 * MiB)
    fast = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]
    run(["cryptsetup", "luksFormat", "--batch-mode", "--type", ltype] +
        (list(extra) or fast) + ["--key-file", key, img])
    if slots == 2:
        # vblkd gets the second slot's key: the first slot's KDF runs too.
        key2 = os.path.join(d, "key2")
        with open(key2, "wb") as f:
            f.write(b"mutate campaign passphrase 1")
        run(["cryptsetup", "luksAddKey", "--batch-mode"] + fast +
            ["--key-file", key, img, key2])


BASES = {
    "qcow2-v3-64k": lambda d: make_qcow2(d, "cluster_size=64k,refcount_bits=16", 64 * MiB,
                                         WRITES),
    "qcow2-v2": lambda d: make_qcow2(d, "compat=0.10", 32 * MiB, WRITES),
    "qcow2-512-r1": lambda d: make_qcow2(d, "cluster_size=512,refcount_bits=1", 16 * MiB,
                                         WRITES),
    "qcow2-512-r16": lambda d: make_qcow2(d, "cluster_size=512,refcount_bits=16", 16 * MiB,
                                          WRITES),
    "qcow2-4k": lambda d: make_qcow2(d, "cluster_size=4k", 32 * MiB, WRITES),
    "qcow2-2m-r64": lambda d: make_qcow2(d, "cluster_size=2M,refcount_bits=64", 64 * MiB,
                                         WRITES),
    "qcow2-zlib": lambda d: base_compressed(d, "zlib"),
    "qcow2-zstd": lambda d: base_compressed(d, "zstd"),
    "qcow2-snapshots": base_snap,
    "qcow2-backing-raw": lambda d: base_backing(d, "raw"),
    "qcow2-backing-qcow2": lambda d: base_backing(d, "qcow2"),
    "qcow2-lazy": lambda d: make_qcow2(d, "lazy_refcounts=on", 32 * MiB, WRITES),
    "luks1": lambda d: make_luks(d, "luks1"),
    "luks2": lambda d: make_luks(d, "luks2"),
    "luks2-argon2id": lambda d: make_luks(d, "luks2", ["--pbkdf", "argon2id", "--pbkdf-memory",
                                                       "32", "--pbkdf-force-iterations", "4"]),
    "luks2-2slots": lambda d: make_luks(d, "luks2", slots=2),
}


class Base:
    def __init__(self, name, d):
        self.name, self.dir = name, d
        self.kind = "luks" if name.startswith("luks") else "qcow2"
        self.image = "disk.luks" if self.kind == "luks" else "disk.qcow2"
        self.key = None
        if self.kind == "luks":
            self.key = "key2" if os.path.exists(os.path.join(d, "key2")) else "key"
        with open(os.path.join(d, self.image), "rb") as f:
            self.data = f.read()
        if self.kind == "qcow2":
            self.st = Q2(self.data)
            self.vsize = self.st.size
            self.classes = ["header-bitflip", "table-bitflip", "field-extreme",
                            "table-pointer", "refcount"]
            if self.st.compressed:
                self.classes.append("compressed")
        elif self.data[6:8] == b"\0\1":
            self.st = L1(self.data)
            self.vsize = len(self.data) - self.st.payload
            self.classes = ["header-bitflip", "field-extreme", "kdf-max"]
        else:
            self.st = L2(self.data)
            self.vsize = len(self.data) - self.st.payload
            self.classes = ["header-bitflip", "json-bitflip", "field-extreme", "kdf-max",
                            "primary-damaged"]


def make_bases(top, names, jobs):
    def one(n):
        d = os.path.join(top, n)
        os.makedirs(d)
        BASES[n](d)
        return Base(n, d)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        return dict(zip(names, ex.map(one, names)))


# ---------------------------------------------------------------- the image

class Img:
    """The mutant's bytes: the base's (shared, never copied), with the
    mutations' writes over them in 4 KiB pages of its own."""

    PAGE = 4096

    def __init__(self, data):
        self.base = data
        self.pages = {}

    def _page(self, i):
        p = self.pages.get(i)
        if p is None:
            p = bytearray(self.base[i * self.PAGE:(i + 1) * self.PAGE].ljust(self.PAGE, b"\0"))
            self.pages[i] = p
        return p

    def get(self, off, n):
        out = bytearray()
        while n > 0:
            i, o = divmod(off, self.PAGE)
            k = min(n, self.PAGE - o)
            p = self.pages.get(i)
            out += p[o:o + k] if p is not None else \
                self.base[off:off + k].ljust(k, b"\0")
            off, n = off + k, n - k
        return bytes(out)

    def put(self, off, data):
        data = bytes(data)
        while data:
            i, o = divmod(off, self.PAGE)
            k = min(len(data), self.PAGE - o)
            self._page(i)[o:o + k] = data[:k]
            off, data = off + k, data[k:]

    def full(self, limit=None):
        """The whole mutant (its first limit bytes)."""
        n = len(self.base) if limit is None else limit
        return self.get(0, n)

    def u(self, off, size):
        return int.from_bytes(self.get(off, size), "big")

    def set_u(self, off, size, v):
        self.put(off, (v & ((1 << (8 * size)) - 1)).to_bytes(size, "big"))

    def flip(self, off, bit):
        self.put(off, bytes([self.get(off, 1)[0] ^ (1 << bit)]))

    def write(self, base_path, path):
        """The base's file (holes kept) with the mutated ranges over it."""
        subprocess.run(["cp", "--sparse=always", base_path, path], check=True)
        fd = os.open(path, os.O_WRONLY)
        try:
            for i, p in sorted(self.pages.items()):
                os.pwrite(fd, bytes(p), i * self.PAGE)
        finally:
            os.close(fd)


def extremes(old, size):
    """0, 1, max, and off by one, for an unsigned field of size bytes
    (those that change it)."""
    top = (1 << (8 * size)) - 1
    return [v for v in (0, 1, top, (old + 1) & top, (old - 1) & top) if v != old]


# ---------------------------------------------------------------- qcow2

L1_MASK = 0x00fffffffffffe00
L2_MASK = 0x00fffffffffffe00
Q2_FIELDS = [("version", 4, 4), ("backing_file_offset", 8, 8), ("backing_file_size", 16, 4),
             ("cluster_bits", 20, 4), ("size", 24, 8), ("crypt_method", 32, 4),
             ("l1_size", 36, 4), ("l1_table_offset", 40, 8), ("refcount_table_offset", 48, 8),
             ("refcount_table_clusters", 56, 4), ("nb_snapshots", 60, 4),
             ("snapshots_offset", 64, 8)]
Q2_V3_FIELDS = [("incompatible_features", 72, 8), ("compatible_features", 80, 8),
                ("autoclear_features", 88, 8), ("refcount_order", 96, 4),
                ("header_length", 100, 4)]
# Snapshot table entry: (name, offset in the entry, size).
SNAP_FIELDS = [("l1_table_offset", 0, 8), ("l1_size", 8, 4), ("id_str_size", 12, 2),
               ("name_size", 14, 2), ("vm_state_size", 32, 4), ("extra_data_size", 36, 4)]


class Q2:
    """A valid qcow2 image's structure (qcow2.txt), read from its bytes."""

    def __init__(self, b):
        img = Img(b)
        self.fields = []
        for name, off, size in Q2_FIELDS:
            self.fields.append((name, off, size, img.u(off, size)))
        v = {f[0]: f[3] for f in self.fields}
        self.version = v["version"]
        if self.version >= 3:
            for name, off, size in Q2_V3_FIELDS:
                self.fields.append((name, off, size, img.u(off, size)))
            v.update({f[0]: f[3] for f in self.fields})
            self.hdr_len = v["header_length"]
            if self.hdr_len > 104:
                self.fields.append(("compression_type", 104, 1, img.u(104, 1)))
            self.rbits = 1 << v["refcount_order"]
        else:
            self.hdr_len = 72
            self.rbits = 16
        self.cbits = v["cluster_bits"]
        self.cs = cs = 1 << self.cbits
        self.size = v["size"]
        self.file_size = len(b)
        # Header extensions, and the backing file name.
        self.ext = []
        off = self.hdr_len
        while off + 8 <= cs:
            t, n = img.u(off, 4), img.u(off + 4, 4)
            self.ext.append((off, t, n))
            if t == 0:
                break
            off += 8 + (n + 7) // 8 * 8
        self.hdr_end = off + 8
        self.backing = (v["backing_file_offset"], v["backing_file_size"])
        # The active L1, the L2 tables, data and compressed clusters.
        self.l1_off, self.l1_size = v["l1_table_offset"], v["l1_size"]
        self.l1 = [(self.l1_off + 8 * i, img.u(self.l1_off + 8 * i, 8))
                   for i in range(self.l1_size)]
        self.l2s, self.l2_entries, self.data, self.compressed = [], [], [], []
        # Snapshots: their L1 tables, and the L2 tables those name.
        self.snaps, self.snap_l1s = [], []
        self.snap_off, off = v["snapshots_offset"], v["snapshots_offset"]
        for _ in range(v["nb_snapshots"]):
            e = {"off": off}
            for name, o, size in SNAP_FIELDS:
                e[name] = img.u(off + o, size)
            n = 40 + e["extra_data_size"] + e["id_str_size"] + e["name_size"]
            off += (n + 7) // 8 * 8
            self.snaps.append(e)
            self.snap_l1s.append((e["l1_table_offset"], e["l1_size"]))
        self.snap_len = off - self.snap_off
        l1_entries = list(self.l1)
        for o, n in self.snap_l1s:
            l1_entries += [(o + 8 * i, img.u(o + 8 * i, 8)) for i in range(n)]
        seen = set()
        csize = self.cbits - 8
        cshift = 62 - csize
        for _, e in l1_entries:
            l2 = e & L1_MASK
            if not l2 or l2 in seen:
                continue
            seen.add(l2)
            self.l2s.append(l2)
            for i in range(cs // 8):
                x = img.u(l2 + 8 * i, 8)
                if not x:
                    continue
                self.l2_entries.append((l2 + 8 * i, x))
                if x & (1 << 62):
                    self.compressed.append((l2 + 8 * i, x))
                elif x & L2_MASK:
                    self.data.append(x & L2_MASK)
        self.cshift, self.csize = cshift, csize
        # Refcounts.
        self.rt_off = v["refcount_table_offset"]
        self.rt_clusters = v["refcount_table_clusters"]
        self.epb = cs * 8 // self.rbits	# entries per refcount block
        nclusters = (self.file_size + cs - 1) // cs
        self.rt_used = max(1, (nclusters + self.epb - 1) // self.epb)
        self.rt = [(self.rt_off + 8 * i, img.u(self.rt_off + 8 * i, 8))
                   for i in range(self.rt_clusters * cs // 8)]
        self.rbs = [e for _, e in self.rt if e]

    def tables(self):
        """(name, offset, length) of every table's used bytes."""
        t = [("L1", self.l1_off, 8 * self.l1_size),
             ("refcount table", self.rt_off, 8 * self.rt_used)]
        used_rb = max(1, min(self.cs, (self.file_size // self.cs) * self.rbits // 8 + 1))
        t += [("refcount block", o, used_rb if i == 0 else self.cs)
              for i, o in enumerate(self.rbs)]
        entries = min(self.cs // 8, max(1, self.size >> self.cbits))
        t += [("L2", o, 8 * entries) for o in self.l2s]
        if self.snaps:
            t.append(("snapshot table", self.snap_off, self.snap_len))
            t += [("snapshot L1", o, 8 * n) for o, n in self.snap_l1s if n]
        return [x for x in t if x[2] > 0]

    def targets(self, rng, exclude=None):
        """Where a pointer may be sent: (name, offset)."""
        cs = self.cs
        end = (self.file_size + cs - 1) // cs * cs
        t = [("header", 0), ("L1", self.l1_off), ("refcount table", self.rt_off),
             ("past the end", end + cs * rng.randrange(4)), ("far past the end", 1 << 40)]
        if self.rbs:
            t.append(("a refcount block", rng.choice(self.rbs)))
        l2s = [o for o in self.l2s if o != exclude]
        if l2s:
            t.append(("another L2 table", rng.choice(l2s)))
        if exclude:
            t.append(("its own table", exclude))
        if self.data:
            t.append(("a data cluster", rng.choice(self.data)))
        if self.snaps:
            t.append(("the snapshot table", self.snap_off))
        return t

    def refcount_loc(self, img, cluster):
        """(byte offset, bit shift, width) of cluster's refcount entry, or None."""
        i, j = divmod(cluster, self.epb)
        if i >= len(self.rt) or not self.rt[i][1]:
            return None
        rb = self.rt[i][1]
        if self.rbits >= 8:
            return (rb + j * self.rbits // 8, 0, self.rbits)
        # Below a byte, entries fill each byte from its least significant bit.
        per = 8 // self.rbits
        return (rb + j // per, (j % per) * self.rbits, self.rbits)


def q2_header_bitflip(rng, st, img):
    r = rng.random()
    if r < 0.7:
        off = rng.randrange(st.hdr_len)
        where = next((f[0] for f in [("magic", 0, 4)] + st.fields if f[1] <= off < f[1] + f[2]),
                     "padding")
    elif st.backing[1] and r < 0.85:
        off = st.backing[0] + rng.randrange(st.backing[1])
        where = "backing file name"
    else:
        off = rng.randrange(st.hdr_len, st.hdr_end)
        where = "header extensions"
    bit = rng.randrange(8)
    img.flip(off, bit)
    return f"bit {bit} of byte {off} ({where})"


def q2_table_bitflip(rng, st, img):
    name, o, n = rng.choice(st.tables())
    if n >= 8 and rng.random() < 0.7:
        # A bit of an entry in use, where there is one.
        used = [i for i in range(0, n - 7, 8) if img.u(o + i, 8)]
        i = rng.choice(used) if used else rng.randrange(0, n - 7, 8)
        off = o + i + rng.randrange(8)
    else:
        off = o + rng.randrange(n)
    bit = rng.randrange(8)
    img.flip(off, bit)
    return f"bit {bit} of byte {off:#x} ({name} at {o:#x})"


def q2_field_extreme(rng, st, img):
    r = rng.random()
    if r < 0.6:
        name, off, size, _ = rng.choice(st.fields)
        old = img.u(off, size)
        vals = extremes(old, size)
        if name.endswith("features"):
            vals += [old | 1 << rng.randrange(5)]
    elif r < 0.7 and st.snaps:
        e = rng.choice(st.snaps)
        fname, o, size = rng.choice(SNAP_FIELDS)
        name, off = f"snapshot@{e['off']:#x}.{fname}", e["off"] + o
        old = img.u(off, size)
        vals = extremes(old, size)
    elif r < 0.8 and len(st.ext) > 1:
        eoff, t, _ = rng.choice(st.ext[:-1])
        name, off, size = f"extension {t:#x} length", eoff + 4, 4
        old = img.u(off, size)
        vals = extremes(old, size)
    else:
        tname, o, n = rng.choice([t for t in st.tables() if t[0] in ("L1", "L2",
                                                                       "refcount table")])
        off = o + 8 * rng.randrange(max(1, n // 8))
        old, size = img.u(off, 8), 8
        name = f"{tname} entry at {off:#x}"
        vals = extremes(old, size) + [(old + st.cs) & (2**64 - 1), (old - st.cs) & (2**64 - 1)]
    new = rng.choice(vals) & ((1 << (8 * size)) - 1)
    img.set_u(off, size, new)
    return f"{name} {old:#x} -> {new:#x}"


def q2_table_pointer(rng, st, img):
    sites = [("header.l1_table_offset", 40, (1 << 64) - 1, None),
             ("header.refcount_table_offset", 48, (1 << 64) - 1, None)]
    if st.snaps:
        sites.append(("header.snapshots_offset", 64, (1 << 64) - 1, None))
        sites += [(f"snapshot@{e['off']:#x}.l1_table_offset", e["off"], (1 << 64) - 1, None)
                  for e in st.snaps]
    if st.backing[1]:
        sites.append(("header.backing_file_offset", 8, (1 << 64) - 1, None))
    groups = [sites,
              [(f"L1[{(o - st.l1_off) // 8}]", o, L1_MASK, e & L1_MASK) for o, e in st.l1 if e],
              [(f"refcount table[{(o - st.rt_off) // 8}]", o, (1 << 64) - 512, None)
               for o, e in st.rt if e],
              [(f"L2 entry at {o:#x}", o, L2_MASK, None) for o, e in st.l2_entries
               if not e & (1 << 62) and e & L2_MASK]]
    groups = [g for g in groups if g]
    name, off, mask, own = rng.choice(rng.choice(groups))
    if own is None and name.startswith("L2 entry"):
        own = off // st.cs * st.cs
    old = img.u(off, 8)
    tname, target = rng.choice([t for t in st.targets(rng, exclude=own)
                                if t[1] & mask != old & mask])
    new = (old & ~mask) | (target & mask)
    img.set_u(off, 8, new)
    return f"{name} {old:#x} -> {new:#x} ({tname})"


def q2_refcount(rng, st, img):
    kinds = [("the header", 0), ("the L1 table", st.l1_off),
             ("the refcount table", st.rt_off)]
    kinds += [("a refcount block", o) for o in st.rbs[:4]]
    kinds += [("an L2 table", o) for o in rng.sample(st.l2s, min(4, len(st.l2s)))]
    if st.data:
        kinds += [("a data cluster", o) for o in rng.sample(st.data, min(4, len(st.data)))]
    end = (st.file_size + st.cs - 1) // st.cs
    kinds.append(("a free cluster", (end + rng.randrange(8)) * st.cs))
    for _ in range(20):
        what, off = rng.choice(kinds)
        loc = st.refcount_loc(img, off // st.cs)
        if loc:
            break
    else:
        return q2_table_bitflip(rng, st, img)
    top = (1 << st.rbits) - 1
    boff, shift, width = loc
    if width >= 8:
        old = img.u(boff, width // 8)
    else:
        m = ((1 << width) - 1) << shift
        old = (img.u(boff, 1) & m) >> shift
    new = rng.choice(sorted({0, 1, top - 1, top} - {old}))
    if width >= 8:
        img.set_u(boff, width // 8, new)
    else:
        img.set_u(boff, 1, (img.u(boff, 1) & ~m) | (new << shift))
    return f"refcount of {what} (cluster {off // st.cs}) {old} -> {new}"


def q2_compressed(rng, st, img):
    off, e = rng.choice(st.compressed)
    omask = (1 << st.cshift) - 1
    smask = ((1 << st.csize) - 1) << st.cshift
    how = rng.choice(["offset", "offset", "sectors 0", "sectors max", "bitflip", "uncompressed",
                      "offset+1"])
    if how == "offset":
        tname, target = rng.choice([t for t in st.targets(rng) +
                                    [("another compressed cluster",
                                      rng.choice(st.compressed)[1] & omask)]
                                    if t[1] & omask != e & omask])
        new = (e & ~omask) | (target & omask)
        how = f"offset to {tname}"
    elif how == "sectors 0":
        new = e & ~smask
    elif how == "sectors max":
        new = e | smask
    elif how == "bitflip":
        new = e ^ (1 << rng.randrange(62))
    elif how == "uncompressed":
        new = e & ~(1 << 62)
    else:
        new = (e & ~omask) | (((e & omask) + 1) & omask)
    img.set_u(off, 8, new)
    return f"compressed descriptor at {off:#x} {e:#x} -> {new:#x} ({how})"


Q2_CLASSES = {"header-bitflip": q2_header_bitflip, "table-bitflip": q2_table_bitflip,
              "field-extreme": q2_field_extreme, "table-pointer": q2_table_pointer,
              "refcount": q2_refcount, "compressed": q2_compressed}


# ---------------------------------------------------------------- LUKS1

L1_HDR = [("version", 6, 2), ("payload_offset", 104, 4), ("key_bytes", 108, 4),
          ("mk_digest_iter", 164, 4)]
L1_SLOT = [("active", 0, 4), ("iterations", 4, 4), ("key_material_offset", 40, 4),
           ("stripes", 44, 4)]


class L1:
    """A LUKS1 header (LUKS1 On-Disk Format, 1.2.3)."""

    def __init__(self, b):
        img = Img(b[:592])
        self.payload = img.u(104, 4) * 512
        self.slots = [208 + 48 * i for i in range(8)]
        self.active = [o for o in self.slots if img.u(o, 4) == 0x00AC71F3]


def l1_header_bitflip(rng, st, img):
    off, bit = rng.randrange(592), rng.randrange(8)
    img.flip(off, bit)
    return f"bit {bit} of byte {off} (phdr)"


def l1_field_extreme(rng, st, img):
    if rng.random() < 0.4:
        name, off, size = rng.choice(L1_HDR)
    else:
        so = rng.choice(st.active if rng.random() < 0.8 else st.slots)
        fname, o, size = rng.choice(L1_SLOT)
        name, off = f"keyslot {(so - 208) // 48}.{fname}", so + o
    old = img.u(off, size)
    new = rng.choice(extremes(old, size))
    img.set_u(off, size, new)
    return f"{name} {old:#x} -> {new:#x}"


def l1_kdf_max(rng, st, img):
    if rng.random() < 0.25:
        name, off = "mk_digest_iter", 164
    else:
        so = rng.choice(st.active)
        name, off = f"keyslot {(so - 208) // 48}.iterations", so + 4
    old = img.u(off, 4)
    img.set_u(off, 4, 0xffffffff)
    return f"{name} {old} -> {0xffffffff}"


L1_CLASSES = {"header-bitflip": l1_header_bitflip, "field-extreme": l1_field_extreme,
              "kdf-max": l1_kdf_max}


# ---------------------------------------------------------------- LUKS2

L2_BIN = [("version", 6, 2), ("hdr_size", 8, 8), ("seqid", 16, 8), ("hdr_offset", 256, 8)]


class L2:
    """A LUKS2 header pair (LUKS2 On-Disk Format): two copies, each a 4 KiB
    binary header and a JSON area, hdr_size bytes in all, checksummed
    (sha256 over the copy with its csum field zeroed)."""

    def __init__(self, b):
        self.hdr_size = int.from_bytes(b[8:16], "big")
        self.copies = (0, self.hdr_size)
        text = b[4096:self.hdr_size].split(b"\0")[0]
        self.json, self.json_len = json.loads(text), len(text)
        self.payload = int(self.json["segments"]["0"]["offset"])

    def fix_csum(self, img, hoff):
        area = bytearray(img.get(hoff, self.hdr_size))
        area[448:512] = bytes(64)
        img.put(hoff + 448, hashlib.sha256(area).digest().ljust(64, b"\0"))

    def put_json(self, img, hoff, obj):
        text = json.dumps(obj, separators=(",", ":")).encode()
        area = self.hdr_size - 4096
        if len(text) >= area:
            raise ValueError("JSON too long")
        img.put(hoff + 4096, text.ljust(area, b"\0"))
        self.fix_csum(img, hoff)


def json_leaves(obj, path=()):
    """Paths to every number, and every string of digits, in obj."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from json_leaves(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from json_leaves(v, path + (i,))
    elif isinstance(obj, bool):
        return
    elif isinstance(obj, int) or (isinstance(obj, str) and obj.isdigit()):
        yield path


def json_set(obj, path, v):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = v


def json_get(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def l2_header_bitflip(rng, st, img):
    which = rng.choice(["primary", "secondary", "both"])
    off, bit = rng.randrange(512), rng.randrange(8)
    name = next((f[0] for f in L2_BIN if f[1] <= off < f[1] + f[2]), "binary header")
    for c, hoff in zip(("primary", "secondary"), st.copies):
        if which in (c, "both"):
            img.flip(hoff + off, bit)
    return f"bit {bit} of byte {off} ({name}) of " + \
        ("both headers" if which == "both" else f"the {which}")


def l2_json_bitflip(rng, st, img):
    which = rng.choice(["primary", "secondary", "both"])
    off, bit = 4096 + rng.randrange(st.json_len), rng.randrange(7)
    ch = chr(img.get(off, 1)[0])
    for c, hoff in zip(("primary", "secondary"), st.copies):
        if which in (c, "both"):
            img.flip(hoff + off, bit)
    return f"bit {bit} of JSON byte {off - 4096} ({ch!r}) of " + \
        ("both headers" if which == "both" else f"the {which}")


def l2_field_extreme(rng, st, img):
    if rng.random() < 0.3:
        # A binary header field, that copy's checksum made right again.
        name, off, size = rng.choice(L2_BIN)
        which = rng.choice(["primary", "secondary", "both"])
        old = img.u(off, size)
        new = rng.choice(extremes(old, size))
        for c, hoff in zip(("primary", "secondary"), st.copies):
            if which in (c, "both"):
                img.set_u(hoff + off, size, new)
                st.fix_csum(img, hoff)
        return f"{which} {name} {old:#x} -> {new:#x} (checksum fixed)"
    # A number in the JSON, both copies alike, checksums fixed.
    obj = json.loads(json.dumps(st.json))
    path = rng.choice(list(json_leaves(obj)))
    old = json_get(obj, path)
    if isinstance(old, int):
        new = rng.choice([v for v in (0, 1, 2**31 - 1, 2**32 - 1, -1, old + 1, old - 1)
                          if v != old])
    else:
        o = int(old)
        new = str(rng.choice([v for v in (0, 1, 2**63 - 1, 2**64 - 1, o + 1, o - 1)
                              if v != o and v >= 0]))
    json_set(obj, path, new)
    for hoff in st.copies:
        st.put_json(img, hoff, obj)
    return f"JSON {'.'.join(map(str, path))} {old!r} -> {new!r} (both copies, checksums fixed)"


def l2_kdf_max(rng, st, img):
    obj = json.loads(json.dumps(st.json))
    choices = []
    for k, ks in obj["keyslots"].items():
        kdf = ks["kdf"]
        if kdf["type"] == "pbkdf2":
            choices.append((("keyslots", k, "kdf", "iterations"), 2**31 - 1))
        else:
            choices.append((("keyslots", k, "kdf", "memory"), 4194304))
            choices.append((("keyslots", k, "kdf", "time"), 2**31 - 1))
    for k in obj["digests"]:
        choices.append((("digests", k, "iterations"), 2**31 - 1))
    path, new = rng.choice(choices)
    old = json_get(obj, path)
    json_set(obj, path, new)
    for hoff in st.copies:
        st.put_json(img, hoff, obj)
    return f"JSON {'.'.join(path)} {old} -> {new} (both copies, checksums fixed)"


def l2_primary_damaged(rng, st, img):
    how = rng.choice(["binary bitflip", "json bitflip", "magic", "json zeroed",
                      "older seqid"])
    if how == "binary bitflip":
        off, bit = rng.randrange(512), rng.randrange(8)
        img.flip(off, bit)
        return f"primary only: bit {bit} of binary byte {off}"
    if how == "json bitflip":
        off, bit = 4096 + rng.randrange(st.json_len), rng.randrange(7)
        img.flip(off, bit)
        return f"primary only: bit {bit} of JSON byte {off - 4096}"
    if how == "magic":
        img.put(0, b"\0" * 6)
        return "primary only: magic zeroed"
    if how == "json zeroed":
        img.put(4096, bytes(st.json_len))
        return "primary only: JSON area zeroed"
    # Valid by its checksum, but older than the secondary.
    seq = img.u(16, 8)
    img.set_u(16, 8, max(0, seq - 1))
    st.fix_csum(img, 0)
    return f"primary only: seqid {seq} -> {max(0, seq - 1)} (checksum fixed)"


L2_CLASSES = {"header-bitflip": l2_header_bitflip, "json-bitflip": l2_json_bitflip,
              "field-extreme": l2_field_extreme, "kdf-max": l2_kdf_max,
              "primary-damaged": l2_primary_damaged}


def mutate(base, seed):
    """(class, description, Img) for base's mutant number seed."""
    rng = random.Random(f"{base.name}:{seed}")
    cls = rng.choice(base.classes)
    table = Q2_CLASSES if base.kind == "qcow2" else \
        L1_CLASSES if isinstance(base.st, L1) else L2_CLASSES
    img = Img(base.data)
    n = 1 if cls in ("kdf-max", "primary-damaged") else rng.choice([1, 1, 2, 3])
    descs = [table[cls](rng, base.st, img) for _ in range(n)]
    return cls, "; ".join(descs), img


# ---------------------------------------------------------------- serving

def sha256(path, limit=None):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = limit
        while True:
            n = 1 << 20 if left is None else min(1 << 20, left)
            if n == 0:
                break
            chunk = f.read(n)
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def file_state(path):
    st = os.stat(path)
    return (sha256(path), st.st_mtime_ns, st.st_size)


def dir_state(d, skip):
    return {n: file_state(os.path.join(d, n)) for n in sorted(os.listdir(d)) if n != skip}


def corrupt_bit(img, value=None):
    """The header's corrupt bit (qcow2 v3, incompatible bit 1): read, or set to value."""
    with open(img, "r+b" if value is not None else "rb") as f:
        h = f.read(80)
        if len(h) < 80 or h[:4] != b"QFI\xfb" or struct.unpack(">I", h[4:8])[0] < 3:
            return None
        inc = struct.unpack(">Q", h[72:80])[0]
        if value is not None:
            f.seek(72)
            f.write(struct.pack(">Q", inc | 2 if value else inc & ~2))
        return bool(inc & 2)


def qemu_check(img, cwd, neutral=False):
    """qemu-img check's findings, or None when it could not read the image.
    neutral: counted with the header's corrupt bit cleared (and set back
    after): both vblkd and QEMU set it when they find corruption, and
    qemu-img check counts some images (a snapshot table it cannot read)
    differently with it set, so the count would tell the bit, not damage."""
    was = corrupt_bit(img) if neutral else None
    try:
        if was:
            corrupt_bit(img, False)
        p = subprocess.run(["qemu-img", "check", "--output=json", "-f", "qcow2", img], cwd=cwd,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if was:
            corrupt_bit(img, True)
    try:
        j = json.loads(p.stdout)
    except ValueError:
        return None
    return {"rc": p.returncode, "corruptions": j.get("corruptions", 0),
            "leaks": j.get("leaks", 0), "check_errors": j.get("check-errors", 0)}


class Campaign:
    def __init__(self, args, bases, work):
        self.a, self.bases, self.work = args, bases, work
        self.env = dict(os.environ)
        self.env.setdefault("ASAN_OPTIONS", "abort_on_error=1:detect_leaks=1")
        self.env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
        self.print_lock = threading.Lock()

    def one(self, base, seed, control=False):
        """Serve base's mutant number seed (control: the base itself).
        Returns its record."""
        a = self.a
        t0 = time.monotonic()
        if control:
            cls, desc, img = "control", "(the base itself)", None
        else:
            cls, desc, img = mutate(base, seed)
        rec = {"base": base.name, "seed": seed, "class": cls, "mutation": desc,
               "outcome": None, "failures": [], "notes": []}
        m = os.path.join(self.work, f"{base.name}-{seed}")
        shutil.rmtree(m, ignore_errors=True)
        serve, qdir = os.path.join(m, "serve"), os.path.join(m, "qemu")
        for d in (serve, qdir) if base.kind == "qcow2" else (serve,):
            shutil.copytree(base.dir, d)
            os.unlink(os.path.join(d, base.image))
            if img is None:
                subprocess.run(["cp", "--sparse=always", os.path.join(base.dir, base.image),
                                os.path.join(d, base.image)], check=True)
            else:
                img.write(os.path.join(base.dir, base.image), os.path.join(d, base.image))
        disk = os.path.join(serve, base.image)
        others = dir_state(serve, base.image)
        before = file_state(disk)
        st0 = os.stat(disk)
        hdr_len = min(base.st.payload, st0.st_size) if base.kind == "luks" else 0
        hdr_before = sha256(disk, hdr_len) if hdr_len else None
        orig = Img(base.data) if img is None else img
        try:
            self.serve(base, seed, rec, m, disk, orig, before, st0, qdir)
        except Exception as e:	# a bug of this tool: say so, do not hide it
            rec["failures"].append(("tool-error", f"{type(e).__name__}: {e}"))
        # Served or stuck, a LUKS header is never written (refused: the
        # whole file was compared; served as raw: the guest wrote there).
        if hdr_len and rec["outcome"] in ("served", "hang") and \
           sha256(disk, hdr_len) != hdr_before:
            rec["failures"].append(("header-modified", "the LUKS header area changed: " +
                                    changed_ranges(orig, disk, hdr_len)))
        after_others = dir_state(serve, base.image)
        if after_others != others:
            changed = sorted(n for n in set(others) | set(after_others)
                             if others.get(n) != after_others.get(n))
            rec["failures"].append(("other-files", "changed: " + ", ".join(changed)))
        rec["seconds"] = round(time.monotonic() - t0, 2)
        if rec["failures"] and a.keep:
            dst = os.path.join(a.keep, f"{base.name}-{seed}")
            shutil.rmtree(dst, ignore_errors=True)
            os.makedirs(dst)
            subprocess.run(["cp", "-a", "--sparse=always"] +
                           [os.path.join(m, n) for n in os.listdir(m) if n != "s.sock"] +
                           [dst], check=True)
            rec["kept"] = dst
        if not a.keep_all:
            shutil.rmtree(m, ignore_errors=True)
        self.say(rec)
        return rec

    def serve(self, base, seed, rec, m, disk, orig, before, st0, qdir):
        a = self.a
        sock, logp = os.path.join(m, "s.sock"), os.path.join(m, "vblkd.log")
        cmd = [a.vblkd, "--socket", sock, "--disk", disk, "--log-level", "info"]
        if base.key:
            cmd += ["--key-file", os.path.join(m, "serve", base.key)]
        with open(logp, "wb") as log:
            p = subprocess.Popen(cmd, cwd=m, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=self.env)
        try:
            t0 = time.monotonic()
            while p.poll() is None and not os.path.exists(sock):
                if time.monotonic() - t0 > a.start_timeout:
                    break
                time.sleep(0.01)
            rec["start_s"] = round(time.monotonic() - t0, 2)

            def logtext():
                with open(logp, "rb") as f:
                    return f.read().decode(errors="replace")

            def crashed(rc, text, when):
                san = [l for l in text.splitlines() if any(s in l for s in SAN_PATTERNS)]
                if san:
                    rec["failures"].append(("crash", f"{when}: {san[0].strip()[:200]}"))
                elif rc is not None and rc < 0 and rc != -signal.SIGKILL:
                    rec["failures"].append(("crash", f"{when}: killed by signal {-rc}"))
                else:
                    return False
                return True

            if p.poll() is not None:		# exited: a refusal
                text = logtext()
                rec["outcome"] = "refused"
                rec["rc"] = p.returncode
                rec["log"] = text.strip()[-300:]
                if crashed(p.returncode, text, "at start"):
                    return
                lines = text.splitlines()
                errs = [l for l in lines if DIE_LINE.match(l) or
                        (LOG_LINE.match(l) and LOG_LINE.match(l).group(1) == "error")]
                foreign = [l for l in lines if not DIE_LINE.match(l) and not LOG_LINE.match(l)]
                if p.returncode == 0:
                    rec["failures"].append(("refusal-lines", "exit 0 before listening"))
                elif len(errs) != 1 or foreign:
                    rec["failures"].append(("refusal-lines", f"{len(errs)} error lines, "
                                            f"{len(foreign)} others: {(errs + foreign)[:3]}"))
                if file_state(disk) != before:
                    rec["failures"].append(("refused-modified", "the refused image changed: " +
                                            changed_ranges(orig, disk)))
                return
            if not os.path.exists(sock):		# neither listening nor gone
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
                rec["outcome"] = "hang"
                rec["failures"].append(("hang", f"not listening after {a.start_timeout} s: " +
                                        logtext().strip()[-200:]))
                return
            rec["outcome"] = "served"
            ops = 48 + seed % 17
            opsf = os.path.join(m, "ops.txt")
            io = [a.mutant_io, sock, str(seed), str(ops), "--qd", str(a.qd),
                  "--timeout-s", str(a.request_timeout), "--qemu-io", opsf]
            try:
                r = subprocess.run(io, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   timeout=a.request_timeout * (ops + 4))
                res = r.stdout.decode().strip().splitlines()
                rec["io"] = json.loads(res[-1]) if res else None
                io_rc, io_err = r.returncode, r.stderr.decode().strip()
            except subprocess.TimeoutExpired:
                rec["io"], io_rc, io_err = None, 2, "mutant-io did not finish"
            if io_rc == 2:
                rec["failures"].append(("unanswered", f"{rec['io'] or io_err}"))
            elif io_rc not in (0, 1):
                rec["failures"].append(("tool-error", f"mutant-io rc {io_rc}: {io_err[:200]}"))
            elif io_rc != 0:
                rec["notes"].append(f"mutant-io: {io_err[:200]}")
            # SIGTERM: out within --term-timeout.
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(a.term_timeout)
                except subprocess.TimeoutExpired:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
                    rec["failures"].append(("sigterm", f"still running {a.term_timeout} s after "
                                            "SIGTERM"))
            else:
                rec["notes"].append(f"vblkd exited while serving (rc {p.returncode})")
            rec["rc"] = p.returncode
            text = logtext()
            crashed(p.returncode, text, "serving")
            fmt = FORMAT_LINE.search(text)
            rec["format"] = fmt.group(1)[:80] if fmt else None
            if fmt and fmt.group(1).startswith("raw"):
                # The magic is gone: served as raw, as QEMU probes it too.
                # But an image cryptsetup still knows as LUKS (its other
                # header copy) has just had the guest write over it.
                rec["outcome"] = "served-raw"
                if base.kind == "luks" and is_luks(orig, base, m):
                    rec["failures"].append(("luks-served-raw", "cryptsetup isLuks says LUKS "
                                            "(the secondary header), vblkd served it raw"))
            rec["log"] = "\n".join(l for l in text.splitlines() if " error: " in l or
                                   " warn: " in l or not LOG_LINE.match(l))[-300:]
            # Growth: allocated and apparent, against the disk the guest saw.
            st1 = os.stat(disk)
            vsize = (rec["io"] or {}).get("size") or base.vsize
            grown = (st1.st_blocks - st0.st_blocks) * 512
            rec["growth"] = {"allocated": grown, "apparent": st1.st_size, "vsize": vsize}
            if grown > vsize + 64 * MiB:
                rec["failures"].append(("growth", f"allocated +{grown >> 20} MiB for a "
                                        f"{vsize >> 20} MiB disk"))
            if st1.st_size > max(st0.st_size, 2 * vsize + 64 * MiB):
                rec["failures"].append(("growth", f"apparent size {st0.st_size >> 20} -> "
                                        f"{st1.st_size >> 20} MiB for a {vsize >> 20} MiB disk"))
            if base.kind == "qcow2" and rec["outcome"] == "served" and rec["io"] and \
           os.path.exists(opsf):
                self.against_qemu(base, rec, disk, qdir, opsf)
        finally:	# whatever went wrong here, leave no vblkd behind
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()

    def against_qemu(self, base, rec, disk, qdir, opsf):
        q = os.path.join(qdir, base.image)
        pre = qemu_check(q, qdir)
        if pre is None:
            rec["notes"].append("check unreadable")
            rec["check"] = None
            return
        try:
            with open(opsf, "rb") as f:
                p = subprocess.run(["qemu-io", "-f", "qcow2", q], stdin=f, cwd=qdir,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=120)
            qmsg = [l for l in p.stdout.decode(errors="replace").splitlines()
                    if "corrupt" in l.lower()][:1]
        except subprocess.TimeoutExpired:
            qmsg = ["qemu-io timed out"]
        qa = qemu_check(q, qdir, neutral=True)
        after = qemu_check(disk, os.path.dirname(disk), neutral=True)
        rec["check"] = {"before": pre, "after": after, "qemu_after": qa,
                        "qemu_says": qmsg[0][:160] if qmsg else None,
                        "qemu_apparent": os.stat(q).st_size}
        worst_ok = max(pre["corruptions"], qa["corruptions"] if qa else pre["corruptions"])
        if after is None:
            if qa is not None:
                rec["failures"].append(("worse-than-qemu", "qemu-img check cannot read the "
                                        "image after serving (it could before, and after "
                                        "qemu-io)"))
        elif after["corruptions"] > worst_ok:
            rec["failures"].append(("worse-than-qemu", f"corruptions {pre['corruptions']} -> "
                                    f"{after['corruptions']} (qemu-io: "
                                    f"{qa['corruptions'] if qa else 'unreadable'})"))

    def say(self, rec):
        kinds = ",".join(sorted({k for k, _ in rec["failures"]}))
        extra = ""
        if rec.get("check"):
            c = rec["check"]
            extra = f" check {c['before']['corruptions']}->" + \
                (f"{c['after']['corruptions']}" if c["after"] else "?") + \
                f" (qemu {c['qemu_after']['corruptions'] if c['qemu_after'] else '?'})"
        line = (f"{rec['base']} {rec['seed']} {rec['class']}: {rec['mutation']} => "
                f"{rec['outcome']}{extra}{' FAIL ' + kinds if kinds else ''} "
                f"[{rec['seconds']} s]")
        with self.print_lock:
            print(line, flush=True)


def is_luks(orig, base, m):
    """Does cryptsetup take the mutant as written for a LUKS disk?"""
    path = os.path.join(m, "isluks.img")
    orig.write(os.path.join(base.dir, base.image), path)
    try:
        return subprocess.run(["cryptsetup", "isLuks", path], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=60).returncode == 0
    finally:
        os.unlink(path)


def changed_ranges(orig, path, limit=None):
    """Where the file differs from the mutant as written (first few ranges)."""
    with open(path, "rb") as f:
        new = f.read(limit) if limit else f.read()
    old = orig.full(limit)
    n = min(len(old), len(new))
    out, i = [], 0
    step = 512
    while i < n and len(out) < 3:
        if old[i:i + step] != new[i:i + step]:
            j = i
            while j < n and old[j:j + step] != new[j:j + step]:
                j += step
            out.append(f"[{i:#x},{j:#x})")
            i = j
        else:
            i += step
    if len(old) != len(new):
        out.append(f"size {len(old)} -> {len(new)}")
    return " ".join(out) or "(mtime only)"


# ---------------------------------------------------------------- report

def table(records, key, keys_order):
    rows = {}
    for r in records:
        k = r[key]
        row = rows.setdefault(k, {"n": 0, "refused": 0, "served": 0, "served-raw": 0})
        row["n"] += 1
        if r["outcome"] in ("refused", "served", "served-raw"):
            row[r["outcome"]] += 1
        for kind in {f[0] for f in r["failures"]}:
            row[kind] = row.get(kind, 0) + 1
    kinds = [k for k in KINDS + ("tool-error",) if any(k in row for row in rows.values())]
    cols = ["n", "refused", "served", "served-raw"] + kinds
    w = max([len(str(k)) for k in rows] + [len(key)])
    out = [f"{key:<{w}} " + " ".join(f"{c:>{max(len(c), 5)}}" for c in cols)]
    rows = {k: rows[k] for k in sorted(rows, key=lambda x: (keys_order.index(x)
                                                            if x in keys_order else 99, x))}
    for k, row in rows.items():
        out.append(f"{k:<{w}} " + " ".join(f"{row.get(c, 0):>{max(len(c), 5)}}" for c in cols))
    return "\n".join(out), rows


def slim(r):
    """A record for --json: the vblkd log only where something failed."""
    return r if r["failures"] else {k: v for k, v in r.items() if k != "log"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap.add_argument("--vblkd", default=os.path.join(root, "build-asan", "vblkd"))
    ap.add_argument("--mutant-io", default=None,
                    help="default: mutant-io beside --vblkd")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--bases", default=",".join(BASES),
                    help="comma-separated, of: " + ", ".join(BASES))
    ap.add_argument("--base", help="one base (with --seed: one mutant again)")
    ap.add_argument("--seed", type=int, help="one seed: --first-seed N --count 1")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", help="copy each failing mutant's directory here")
    ap.add_argument("--keep-all", action="store_true", help="keep every mutant's directory "
                    "in the work directory")
    ap.add_argument("--workdir", help="default: a new directory in /tmp, removed at the end")
    ap.add_argument("--json", help="write every record and the tables here")
    ap.add_argument("--no-controls", action="store_true",
                    help="do not serve each unmutated base first")
    ap.add_argument("--start-timeout", type=float, default=20)
    ap.add_argument("--request-timeout", type=int, default=5)
    ap.add_argument("--term-timeout", type=float, default=10)
    ap.add_argument("--qd", type=int, default=8)
    a = ap.parse_args()
    a.vblkd = os.path.abspath(a.vblkd)
    a.mutant_io = os.path.abspath(a.mutant_io or os.path.join(os.path.dirname(a.vblkd),
                                                              "mutant-io"))
    for exe in (a.vblkd, a.mutant_io):
        if not os.access(exe, os.X_OK):
            sys.exit(f"mutate.py: {exe} is not an executable (build it: ninja -C BUILD)")
    for tool in ("qemu-img", "qemu-io", "cryptsetup"):
        if not shutil.which(tool):
            sys.exit(f"mutate.py: no {tool} (scripts/deps.sh installs it)")
    names = [a.base] if a.base else [n for n in a.bases.split(",") if n]
    for n in names:
        if n not in BASES:
            sys.exit(f"mutate.py: no base '{n}'; the bases: {', '.join(BASES)}")
    if a.seed is not None:
        a.first_seed, a.count, a.no_controls = a.seed, 1, True
    if a.keep:
        a.keep = os.path.abspath(a.keep)
        os.makedirs(a.keep, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    work = a.workdir or tempfile.mkdtemp(prefix="vblk-mutate.")
    os.makedirs(work, exist_ok=True)
    try:
        return campaign(a, names, work)
    finally:	# also when interrupted, or stdout went away
        if not a.workdir and not a.keep_all:
            shutil.rmtree(work, ignore_errors=True)


def campaign(a, names, work):
    """Make the bases, serve every mutant, report.  1 when anything failed."""
    t0 = time.monotonic()
    try:
        bases = make_bases(os.path.join(work, "bases"), names, a.jobs)
    except (RuntimeError, subprocess.SubprocessError) as e:
        sys.exit(f"mutate.py: making the bases: {e}")
    t_bases = time.monotonic() - t0
    print(f"mutate.py: {len(bases)} bases in {t_bases:.1f} s; seeds {a.first_seed}.."
          f"{a.first_seed + a.count - 1}; {a.jobs} jobs; {a.vblkd}", flush=True)
    c = Campaign(a, bases, work)
    jobs = []
    if not a.no_controls:
        jobs += [(bases[n], 0, True) for n in names]
    for s in range(a.first_seed, a.first_seed + a.count):
        jobs.append((bases[names[s % len(names)]], s, False))
    records = []
    ex = concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs)
    try:
        futs = [ex.submit(c.one, b, s, control) for b, s, control in jobs]
        for f in futs:
            records.append(f.result())
    finally:	# interrupted: the mutants being served finish, no others start
        ex.shutdown(wait=True, cancel_futures=True)
    wall = time.monotonic() - t0
    mutants = [r for r in records if r["class"] != "control"]
    t_class, rows_class = table(records, "class", ["control"] + list(Q2_CLASSES) +
                                list(L2_CLASSES))
    t_base, rows_base = table(records, "base", list(BASES))
    print()
    print(t_class)
    print()
    print(t_base)
    fails = [r for r in records if r["failures"]]
    by_kind = {k: [] for k in KINDS + ("tool-error",)}
    for r in fails:
        for k in sorted({f[0] for f in r["failures"]}):
            by_kind.setdefault(k, []).append(r)
    me = os.path.relpath(os.path.abspath(__file__), os.getcwd())
    if fails:
        print("\nfailures:")
        for r in fails:
            for k, detail in r["failures"]:
                print(f"  {k}: {r['base']} seed {r['seed']} ({r['class']}: {r['mutation']}): "
                      f"{detail}")
            print(f"    again: {me} --vblkd {a.vblkd} --base {r['base']} --seed {r['seed']} "
                  f"--keep /tmp/mutants")
    served = sum(r["outcome"] == "served" for r in mutants)
    raw = sum(r["outcome"] == "served-raw" for r in mutants)
    refused = sum(r["outcome"] == "refused" for r in mutants)
    cost = sum(r["seconds"] for r in records) / max(1, len(records))
    print(f"\n{len(mutants)} mutants ({refused} refused, {served} served, {raw} served as raw) and "
          f"{len(records) - len(mutants)} controls in {wall:.0f} s wall ({t_bases:.1f} s making "
          f"bases), {cost:.2f} s per mutant per job; "
          + ", ".join(f"{k} {len(by_kind[k])}" for k in KINDS) +
          (f", tool errors {len(by_kind['tool-error'])}" if by_kind["tool-error"] else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"vblkd": a.vblkd, "first_seed": a.first_seed, "count": a.count,
                       "bases": names, "jobs": a.jobs, "wall_s": round(wall, 1),
                       "bases_s": round(t_bases, 1), "per_mutant_s": round(cost, 2),
                       "failures": {k: [[r["base"], r["seed"]] for r in v]
                                    for k, v in by_kind.items()},
                       "by_class": rows_class, "by_base": rows_base,
                       "records": [slim(r) for r in records]}, f, default=str)
            f.write("\n")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
