#!/usr/bin/python3
"""A backup client for tests/format/test_backup.sh, with libnbd (python3-libnbd).

backup_pull.py VIEW_URI OUT [--bitmap B] [--rw RW_URI --writes N --seed S]

Reads a backup's view in 1 MiB slices into OUT: all of it (a full backup:
OUT made at the view's size), or with --bitmap only the extents its
qemu:dirty-bitmap:B marks dirty, written over OUT in place (an incremental
applied to the previous backup: a restore).  With --rw, before each slice
it writes, discards and writes zeroes at random places of the live disk
(RW_URI, the same disk's writable export), the slice being read among
them: the view must not change.  Prints "read BYTES dirty BYTES".
"""
import argparse
import os
import random

import nbd

SLICE = 1 << 20

ap = argparse.ArgumentParser()
ap.add_argument("view")
ap.add_argument("out")
ap.add_argument("--bitmap")
ap.add_argument("--rw")
ap.add_argument("--writes", type=int, default=0)
ap.add_argument("--seed", type=int, default=1)
a = ap.parse_args()

v = nbd.NBD()
ctx = "qemu:dirty-bitmap:" + a.bitmap if a.bitmap else None
if ctx:
    v.add_meta_context(ctx)
v.connect_uri(a.view)
size = v.get_size()
w = None
if a.rw:
    w = nbd.NBD()
    w.connect_uri(a.rw)
rnd = random.Random(a.seed)


def scribble(around):
    """Writes, discards and write zeroes on the live disk, one in the slice
    about to be read."""
    for i in range(a.writes):
        off = around if i == 0 else rnd.randrange(0, size // 4096) * 4096
        n = min(rnd.choice([4096, 65536, 200704]), size - off)
        k = rnd.randrange(4)
        if k == 0 and w.can_trim():
            w.trim(n, off)
        elif k == 1 and w.can_zero():
            w.zero(n, off)
        else:
            w.pwrite(bytes([rnd.randrange(1, 256)]) * n, off)


# The dirty extents (incremental), as the view lists them.
dirty = []
if ctx:
    off = 0
    while off < size:
        got = []

        def cb(meta, offset, entries, err):
            if meta == ctx:
                got.extend(entries)
        v.block_status(min(size - off, 1 << 30), off, cb)
        for i in range(0, len(got), 2):
            if got[i + 1] & 1:
                dirty.append((off, got[i]))
            off += got[i]
else:
    dirty = [(0, size)]

mode = "r+b" if ctx else "wb"
read = 0
with open(a.out, mode) as f:
    if not ctx:
        f.truncate(size)
    for off, length in dirty:
        end = off + length
        while off < end:
            n = min(SLICE - off % SLICE, end - off)
            if w:
                scribble(off)
            f.seek(off)
            f.write(v.pread(n, off))
            read += n
            off += n
print("read %d dirty %d" % (read, sum(n for _, n in dirty)))
