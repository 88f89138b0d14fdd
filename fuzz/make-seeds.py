#!/usr/bin/env python3
"""Write the seed corpora fuzz/corpus/vq_blk/, fuzz/corpus/vu/,
fuzz/corpus/qcow2/ (made with qemu-img and qemu-io), fuzz/corpus/luks/
(from the LUKS images in fuzz/luks/), fuzz/corpus/nbd_opt/ and
fuzz/corpus/nbd_tx/ (NBD client bytes, fuzz/fuzz_nbd.c).

Deterministic: the same files every run (commit them).  The input formats
are described at the top of fuzz/fuzz_vq_blk.c, fuzz_vu.c, fuzz_qcow2.c
and fuzz_luks.c; the constants here must match theirs.

    fuzz/make-seeds.py [OUTDIR]     (default: fuzz/corpus next to this file)
    fuzz/make-seeds.py --nbd        only the NBD corpora (no QEMU tools needed)
    fuzz/make-seeds.py --luks-images
                                    make fuzz/luks/*.img anew with
                                    cryptsetup (random: see LUKS_IMAGES)
"""
import hashlib
import os
import struct
import sys

# ---- fuzz_vq_blk ----

GPA_BASE = 0x40000000
MEM_SIZE = 64 << 10

FZ_EVENT_IDX, FZ_INDIRECT, FZ_INFLIGHT = 1, 2, 4
FZ_CALL_FD, FZ_ERR_FD, FZ_DISABLED = 8, 16, 32
FZ_LOG, FZ_LOG_ODD = 64, 128
FZ_F_FLUSH, FZ_F_WCE, FZ_F_WT, FZ_F_PACKED = 1, 2, 4, 8
DEV_RW, DEV_RO, DEV_4K = 0, 1, 2

DESC_F_NEXT, DESC_F_WRITE, DESC_F_INDIRECT = 1, 2, 4
T_IN, T_OUT, T_FLUSH, T_GET_ID, T_DISCARD, T_WZ = 0, 1, 4, 8, 11, 13
WZ_UNMAP = 1

# Region layout of every seed (offsets from the region start).
DESC, AVAIL, USED = 0x000, 0x100, 0x200     # rings for num <= 8
HDRS = 0x300                                # request headers, 16 bytes each
TABLES = 0x400                              # indirect tables
DATA = 0x1000                               # data buffers (read as zeroes)
STATUS = 0x8000                             # status bytes


class Ring:
    """Guest memory image with a split ring of num entries."""

    def __init__(self, num=8):
        self.num = num
        self.img = bytearray(0x500)
        self.ndesc = 0
        self.heads = []
        self.nhdr = 0

    def put(self, off, data):
        end = off + len(data)
        if end > len(self.img):
            self.img.extend(bytes(end - len(self.img)))
        self.img[off:end] = data

    def desc(self, addr, length, flags, nxt=0, table=None, index=None):
        """Write a descriptor (into table at index if given); return index."""
        if table is None:
            index, self.ndesc = self.ndesc, self.ndesc + 1
            base = DESC
        else:
            base = table
        self.put(base + 16 * index, struct.pack('<QIHH', addr, length, flags, nxt))
        return index

    def header(self, rtype, sector):
        off = HDRS + 16 * self.nhdr
        self.nhdr += 1
        self.put(off, struct.pack('<IIQ', rtype, 0, sector))
        return off

    def chain(self, bufs):
        """bufs: (gpa offset, len, writable); returns the head."""
        first = self.ndesc
        for i, (off, length, w) in enumerate(bufs):
            last = i == len(bufs) - 1
            flags = (DESC_F_WRITE if w else 0) | (0 if last else DESC_F_NEXT)
            self.desc(GPA_BASE + off, length, flags, 0 if last else first + i + 1)
        return first

    def request(self, rtype, sector, data=(), status=None):
        """A request: header, data buffers (off, len, writable), status."""
        h = self.header(rtype, sector)
        st = STATUS + len(self.heads) if status is None else status
        head = self.chain([(h, 16, False)] + list(data) + [(st, 1, True)])
        self.heads.append(head)
        return head

    def publish(self, first_idx=0, used_event=0):
        """Avail ring: every head so far, from avail index first_idx."""
        for i, h in enumerate(self.heads):
            slot = (first_idx + i) % self.num
            self.put(AVAIL + 4 + 2 * slot, struct.pack('<H', h))
        self.put(AVAIL, struct.pack('<HH', 0, (first_idx + len(self.heads)) & 0xffff))
        self.put(AVAIL + 4 + 2 * self.num, struct.pack('<H', used_event))
        self.put(USED, struct.pack('<HH', 0, first_idx & 0xffff))

    def seed(self, flags=0, dev=DEV_RW, feat=0, last_avail=0, inflight=b'', pad=0):
        log2 = self.num.bit_length() - 1
        hdr = struct.pack('<BBBBHHHhiii', log2, flags, dev, feat, 0, last_avail,
                          len(self.img), pad, DESC, AVAIL, USED)
        return hdr + bytes(self.img) + inflight


class PackedRing(Ring):
    """Guest memory image with a packed ring of num entries: descriptors at
    DESC in ring order, the driver event area at AVAIL, the device's at
    USED; the base (seed's last_avail and pad) position 0, wrap counters 1."""

    AVAIL_F, USED_F = 1 << 7, 1 << 15

    def __init__(self, num=8):
        super().__init__(num)
        self.pos = 0

    def packed_request(self, rtype, sector, data=(), bid=0, indirect=False):
        """Header, data (off, len, writable), status: a list of ring
        descriptors, or one descriptor to an indirect table; id bid."""
        h = self.header(rtype, sector)
        bufs = [(h, 16, False)] + list(data) + [(STATUS + bid, 1, True)]
        if indirect:
            table = TABLES + 64 * bid
            for i, (off, length, w) in enumerate(bufs):
                self.put(table + 16 * i, struct.pack('<QIHH', GPA_BASE + off, length, 0,
                                                     DESC_F_WRITE if w else 0))
            bufs = [(table, 16 * len(bufs), None)]
        for i, (off, length, w) in enumerate(bufs):
            last = i == len(bufs) - 1
            flags = self.AVAIL_F | (0 if last else DESC_F_NEXT)
            flags |= DESC_F_INDIRECT if w is None else (DESC_F_WRITE if w else 0)
            self.put(DESC + 16 * self.pos, struct.pack('<QIHH', GPA_BASE + off, length,
                                                       bid, flags))
            self.pos += 1

    def events(self, drv_flags=0, drv_off_wrap=0):
        self.put(AVAIL, struct.pack('<HH', drv_off_wrap, drv_flags))
        self.put(USED, struct.pack('<HH', 0, 0))

    def packed_seed(self, flags=0, feat=0, dev=DEV_RW):
        return self.seed(flags, dev=dev, feat=feat | FZ_F_PACKED, last_avail=0x8000,
                         pad=-0x8000)


def packed_seeds():
    s = {}
    r = PackedRing()
    r.packed_request(T_IN, 0, [(DATA, 512, True)], bid=3)
    r.packed_request(T_OUT, 8, [(DATA, 1024, False)], bid=1)
    r.events()
    s['packed-read-write'] = r.packed_seed(FZ_CALL_FD)

    r = PackedRing()
    r.packed_request(T_IN, 16, [(DATA, 1024, True)], bid=0, indirect=True)
    r.packed_request(T_FLUSH, 0, bid=5)
    r.events(drv_flags=2, drv_off_wrap=0x8000 | 1)      # DESC: at position 1
    s['packed-indirect-event-idx'] = r.packed_seed(FZ_INDIRECT | FZ_EVENT_IDX | FZ_CALL_FD,
                                                   feat=FZ_F_FLUSH)

    r = PackedRing()
    r.packed_request(T_IN, 0, [(DATA, 512, True)], bid=2)
    r.events()
    s['packed-logged'] = r.packed_seed(FZ_LOG | FZ_CALL_FD)
    return s


def vq_seeds():
    s = packed_seeds()

    r = Ring()
    r.request(T_IN, 0, [(DATA, 512, True)])
    r.publish()
    s['read'] = r.seed(FZ_EVENT_IDX | FZ_CALL_FD)

    r = Ring()
    r.request(T_OUT, 8, [(DATA, 4096, False)])
    r.publish()
    s['write'] = r.seed(FZ_CALL_FD, feat=FZ_F_FLUSH | FZ_F_WCE | FZ_F_WT)

    r = Ring()
    r.request(T_FLUSH, 0)
    r.publish()
    s['flush'] = r.seed(FZ_CALL_FD, feat=FZ_F_FLUSH)

    r = Ring()
    r.request(T_GET_ID, 0, [(DATA, 20, True)])
    r.publish()
    s['get-id'] = r.seed(FZ_CALL_FD | FZ_EVENT_IDX)

    # Indirect: one ring descriptor pointing at a 3-entry table.
    r = Ring()
    h = r.header(T_IN, 16)
    for i, (off, length, flags) in enumerate([
            (h, 16, DESC_F_NEXT), (DATA, 1024, DESC_F_WRITE | DESC_F_NEXT),
            (STATUS, 1, DESC_F_WRITE)]):
        r.desc(GPA_BASE + off, length, flags, i + 1 if flags & DESC_F_NEXT else 0,
               table=TABLES, index=i)
    r.heads.append(r.desc(GPA_BASE + TABLES, 48, DESC_F_INDIRECT))
    r.publish()
    s['indirect-read'] = r.seed(FZ_INDIRECT | FZ_EVENT_IDX | FZ_CALL_FD)

    # Discard and write zeroes, segment payloads in the image.
    r = Ring()
    seg = TABLES + 0x80
    r.put(seg, struct.pack('<QII', 0, 8, 0))
    r.put(seg + 16, struct.pack('<QII', 64, 16, WZ_UNMAP) + struct.pack('<QII', 128, 8, 0))
    r.request(T_DISCARD, 0, [(seg, 16, False)])
    r.request(T_WZ, 0, [(seg + 16, 32, False)])
    r.publish()
    s['discard-write-zeroes'] = r.seed(FZ_CALL_FD)

    # A batch across the 16-bit avail index wrap, with EVENT_IDX.
    r = Ring(16)
    r.request(T_IN, 0, [(DATA, 512, True), (DATA + 512, 512, True)])
    r.request(T_OUT, 2, [(DATA + 1024, 512, False)])
    r.request(T_FLUSH, 0)
    r.publish(first_idx=0xfffe, used_event=0xffff)
    s['batch-wrap'] = r.seed(FZ_EVENT_IDX | FZ_CALL_FD, feat=FZ_F_FLUSH,
                             last_avail=0xfffe)

    # Bad chains: a descriptor loop, and a buffer outside guest memory
    # whose chain still ends in a writable status byte (IOERR there).
    r = Ring()
    h = r.header(T_IN, 0)
    r.desc(GPA_BASE + h, 16, DESC_F_NEXT, 1)
    r.desc(GPA_BASE + DATA, 512, DESC_F_WRITE | DESC_F_NEXT, 0)
    r.heads.append(0)
    r.request(T_IN, 0, [(MEM_SIZE + 0x1000, 512, True)])
    r.publish()
    s['bad-chains'] = r.seed(FZ_CALL_FD | FZ_ERR_FD)

    # Read-only device: a write fails, a read works.
    r = Ring()
    r.request(T_OUT, 0, [(DATA, 512, False)])
    r.request(T_IN, 0, [(DATA, 512, True)])
    r.publish()
    s['read-only'] = r.seed(FZ_CALL_FD, dev=DEV_RO)

    # 4 KiB logical blocks: an aligned read and a misaligned write.
    r = Ring()
    r.request(T_IN, 8, [(DATA, 4096, True)])
    r.request(T_OUT, 1, [(DATA, 4096, False)])
    r.publish()
    s['4k-blocks'] = r.seed(FZ_CALL_FD | FZ_EVENT_IDX, dev=DEV_4K)

    # In-flight region left by a previous backend: it took the first
    # request (counter 7) and never returned it, so that one is
    # resubmitted, then the ring goes on with the second.
    r = Ring()
    r.request(T_IN, 0, [(DATA, 512, True)])
    r.request(T_IN, 1, [(DATA + 512, 512, True)])
    r.publish()
    region = bytearray(struct.pack('<QHHHH', 0, 1, r.num, 0, 0))
    assert r.num == 8
    for i in range(8):
        taken = 1 if i == r.heads[0] else 0
        region += struct.pack('<B5xHQ', taken, 0, 7 if taken else 0)
    region += bytes((-len(region)) % 64)
    s['inflight-resubmit'] = r.seed(FZ_INFLIGHT | FZ_CALL_FD, inflight=bytes(region))

    # Dirty logging (migration): a read, GET_ID and a bad chain, with and
    # without EVENT_IDX (avail_event vs used->flags); and the used ring
    # logged at an address past the end of the log.
    r = Ring()
    r.request(T_IN, 0, [(DATA, 4096, True)])
    r.request(T_GET_ID, 0, [(DATA + 0x2000, 20, True)])
    r.request(T_IN, 0, [(MEM_SIZE + 0x1000, 512, True)])
    r.publish()
    s['logged-event-idx'] = r.seed(FZ_LOG | FZ_EVENT_IDX | FZ_CALL_FD)
    s['logged-flags'] = r.seed(FZ_LOG | FZ_CALL_FD)
    s['logged-used-outside-log'] = r.seed(FZ_LOG_ODD | FZ_EVENT_IDX, pad=0x7fff)
    return s


# ---- fuzz_vu ----

GET_FEATURES, SET_FEATURES, SET_OWNER, RESET_OWNER, SET_MEM_TABLE = 1, 2, 3, 4, 5
SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, GET_VRING_BASE = 8, 9, 10, 11
SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR = 12, 13, 14
GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES, GET_QUEUE_NUM = 15, 16, 17
SET_VRING_ENABLE, GET_CONFIG, SET_CONFIG = 18, 24, 25
GET_INFLIGHT_FD, SET_INFLIGHT_FD = 31, 32
GET_MAX_MEM_SLOTS, ADD_MEM_REG, REM_MEM_REG = 36, 37, 38
SET_LOG_BASE, SET_LOG_FD = 6, 7
LOG_SHMFD, LOG_ALL, VRING_F_LOG = 1 << 1, 1 << 26, 1

VERSION, NEED_REPLY = 1, 8
PROTO = (1 << 0) | (1 << 3) | (1 << 9) | (1 << 12) | (1 << 15)
FEATURES = (1 << 32) | (1 << 29) | (1 << 28) | (1 << 9) | (1 << 30)

QVA = 0x7f0000000000
MEMFD_64K = (16, 0)         # fd spec: memfd of 16 pages, zero-filled
EVENTFD = (0x80, 0)


def msg(req, payload=b'', fds=(), flags=VERSION, split=False):
    ctl = len(fds) | (0x10 if split else 0)
    out = bytes([ctl]) + b''.join(bytes(f) for f in fds)
    return out + struct.pack('<III', req, flags, len(payload)) + payload


def u64(v):
    return struct.pack('<Q', v)


def state(i, n):
    return struct.pack('<II', i, n)


def region(gpa, size, qva, off):
    return struct.pack('<QQQQ', gpa, size, qva, off)


def handshake():
    return (msg(GET_FEATURES) + msg(GET_PROTOCOL_FEATURES) +
            msg(SET_PROTOCOL_FEATURES, u64(PROTO)) + msg(GET_QUEUE_NUM) +
            msg(GET_MAX_MEM_SLOTS) + msg(SET_OWNER) +
            msg(GET_CONFIG, struct.pack('<III', 0, 60, 0) + bytes(60)))


def ring(i, num=8, base=0, kick=True, enable=True, ack=False):
    fl = VERSION | (NEED_REPLY if ack else 0)
    off = 0x4000 * i
    out = (msg(SET_VRING_NUM, state(i, num), flags=fl) +
           msg(SET_VRING_BASE, state(i, base), flags=fl) +
           msg(SET_VRING_ADDR, struct.pack('<IIQQQQ', i, 0, QVA + off,
                                           QVA + off + 0x2000, QVA + off + 0x1000, 0),
               flags=fl) +
           msg(SET_VRING_CALL, u64(i), fds=[EVENTFD], flags=fl))
    if kick:
        out += msg(SET_VRING_KICK, u64(i), fds=[EVENTFD], flags=fl)
    if enable:
        out += msg(SET_VRING_ENABLE, state(i, 1), flags=fl)
    return out


def mem_table(fl=VERSION):
    return msg(SET_MEM_TABLE, struct.pack('<II', 1, 0) + region(0, 0x10000, QVA, 0),
               fds=[MEMFD_64K], flags=fl)


def vu_seeds():
    s = {}
    s['qemu-one-ring'] = (handshake() + msg(SET_FEATURES, u64(FEATURES)) + mem_table() +
                          ring(0) + msg(GET_VRING_BASE, state(0, 0)))
    s['qemu-two-rings-ack'] = (handshake() +
                               msg(SET_FEATURES, u64(FEATURES), flags=VERSION | NEED_REPLY) +
                               mem_table(VERSION | NEED_REPLY) +
                               ring(0, ack=True) + ring(1, num=16, ack=True) +
                               msg(SET_VRING_ENABLE, state(1, 0)) +
                               msg(SET_VRING_ERR, u64(0), fds=[EVENTFD]) +
                               msg(GET_VRING_BASE, state(1, 0)) +
                               msg(GET_VRING_BASE, state(0, 0)))
    # No protocol features: rings are enabled from the start.
    s['legacy-no-protocol'] = (msg(GET_FEATURES) + msg(SET_OWNER) +
                               msg(SET_FEATURES, u64(FEATURES & ~(1 << 30))) +
                               mem_table() + ring(0, enable=False) + msg(RESET_OWNER))
    # In-flight region we create, then ring 0 tracked in it.
    s['inflight-get'] = (handshake() + msg(SET_FEATURES, u64(FEATURES)) +
                         msg(GET_INFLIGHT_FD, struct.pack('<QQHHI', 0, 0, 2, 8, 0)) +
                         mem_table() + ring(0) + msg(GET_VRING_BASE, state(0, 0)))
    # In-flight region the frontend hands us (one page, zeroed).
    s['inflight-set'] = (handshake() + msg(SET_FEATURES, u64(FEATURES)) +
                         msg(SET_INFLIGHT_FD, struct.pack('<QQHHI', 4096, 0, 2, 8, 0),
                             fds=[(1, 0)]) +
                         mem_table() + ring(0) + ring(1))
    # CONFIGURE_MEM_SLOTS: regions one at a time, one removed under a running
    # ring (it restarts), the other after the ring stopped.
    s['mem-slots'] = (handshake() + msg(SET_FEATURES, u64(FEATURES)) +
                      msg(ADD_MEM_REG, u64(0) + region(0, 0x10000, QVA, 0), fds=[MEMFD_64K]) +
                      msg(ADD_MEM_REG, u64(0) + region(0x100000, 0x4000, QVA + 0x100000, 0x1000),
                          fds=[(5, 0)]) +
                      ring(0) +
                      msg(REM_MEM_REG, u64(0) + region(0x100000, 0x4000, QVA + 0x100000, 0x1000)) +
                      msg(GET_VRING_BASE, state(0, 0)) +
                      msg(REM_MEM_REG, u64(0) + region(0, 0x10000, QVA, 0)))
    # Config space: read all of it, write the writeback byte, a bad write.
    s['config'] = (handshake() +
                   msg(GET_CONFIG, struct.pack('<III', 0, 256, 0) + bytes(256)) +
                   msg(SET_CONFIG, struct.pack('<III', 32, 1, 0) + b'\x01', flags=VERSION | NEED_REPLY) +
                   msg(SET_CONFIG, struct.pack('<III', 0, 8, 0) + bytes(8), flags=VERSION | NEED_REPLY))
    # Header and payload in separate writes; a ring restarted on a new kick fd.
    s['split-restart'] = (handshake() + msg(SET_FEATURES, u64(FEATURES), split=True) +
                          mem_table() + ring(0) +
                          msg(SET_VRING_KICK, u64(0), fds=[EVENTFD], split=True) +
                          mem_table())
    # Migration as QEMU drives it on the source, while the ring runs: a log,
    # LOG_ALL, the ring's log flag, a bigger log, a log eventfd, logging
    # off, the ring stopped; then a log too small and one past its fd.
    log = lambda size, off=0, pages=1: msg(SET_LOG_BASE, struct.pack('<QQ', size, off),
                                           fds=[(pages, 0)])
    addr = lambda fl, la: msg(SET_VRING_ADDR, struct.pack('<IIQQQQ', 0, fl, QVA, QVA + 0x2000,
                                                          QVA + 0x1000, la),
                              flags=VERSION | NEED_REPLY)
    s['migration-source'] = (handshake() +
                             msg(SET_PROTOCOL_FEATURES, u64(PROTO | LOG_SHMFD)) +
                             msg(SET_FEATURES, u64(FEATURES)) + mem_table() + ring(0) +
                             log(8) +
                             msg(SET_FEATURES, u64(FEATURES | LOG_ALL),
                                 flags=VERSION | NEED_REPLY) +
                             addr(VRING_F_LOG, 0x2000) +
                             log(4096, 0, 2) + msg(SET_LOG_FD, fds=[EVENTFD]) +
                             msg(SET_FEATURES, u64(FEATURES)) + addr(0, 0) +
                             msg(GET_VRING_BASE, state(0, 0)))
    s['migration-bad-logs'] = (handshake() +
                               msg(SET_PROTOCOL_FEATURES, u64(PROTO | LOG_SHMFD)) +
                               msg(SET_FEATURES, u64(FEATURES)) + mem_table() + log(1) +
                               msg(SET_FEATURES, u64(FEATURES | LOG_ALL),
                                   flags=VERSION | NEED_REPLY) +
                               ring(0) + addr(VRING_F_LOG, 0xffffffff0000) +
                               log(4096, 4096) + msg(GET_VRING_BASE, state(0, 0)))
    # Malformed: more fds than vhost-user allows.
    s['too-many-fds'] = handshake() + msg(SET_MEM_TABLE, struct.pack('<II', 1, 0) +
                                          region(0, 0x10000, QVA, 0),
                                          fds=[MEMFD_64K] + [EVENTFD] * 9)
    return s


# ---- fuzz_qcow2 ----
# Images made by qemu-img (qemu-utils), small clusters so they are a few
# KiB; each followed by requests: 8 bytes, op, pad, u24 sector, u16
# sectors, pad (fuzz_qcow2.c).

Q_READ, Q_WRITE, Q_DISCARD, Q_WZ, Q_WZ_UNMAP, Q_FLUSH, Q_GROW = range(7)
Q_PATTERN = 0x80


def req(op, sector, sectors):
    return struct.pack('<BB', op, 0) + struct.pack('<I', sector)[:3] + \
        struct.pack('<HB', sectors, 0)


def qcow2_seeds():
    import subprocess
    import tempfile
    s = {}
    mix = (req(Q_WRITE | Q_PATTERN, 0, 8) + req(Q_READ, 0, 16) + req(Q_WRITE, 3, 1) +
           req(Q_WZ, 8, 16) + req(Q_DISCARD, 0, 2) + req(Q_WZ_UNMAP, 1, 3) +
           req(Q_FLUSH, 0, 0) + req(Q_GROW, 0, 2) + req(Q_WRITE | Q_PATTERN, 4000, 9) +
           req(Q_READ, 4000, 9))
    with tempfile.TemporaryDirectory() as d:
        def make(name, opts, size='1M', io=None):
            p = os.path.join(d, name)
            subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-o', opts, p, size],
                           check=True)
            if io:
                subprocess.run(['qemu-io', '-f', 'qcow2'] + sum((['-c', c] for c in io), []) +
                               [p], check=True, stdout=subprocess.DEVNULL)
            img = open(p, 'rb').read()
            s[name] = struct.pack('<H', len(img)) + img + mix
        make('v3-512', 'cluster_size=512')
        make('v2-512', 'cluster_size=512,compat=0.10')
        make('v3-512-1bit', 'cluster_size=512,refcount_bits=1')
        make('v3-512-64bit', 'cluster_size=512,refcount_bits=64')
        make('v3-512-written', 'cluster_size=512',
             io=['write -P 0x11 0 4k', 'write -z 8k 2k', 'discard 1k 512'])
        make('v3-512-snapshot', 'cluster_size=512', io=['write -P 0x22 0 2k'])
        subprocess.run(['qemu-img', 'snapshot', '-c', 's1', os.path.join(d, 'v3-512-snapshot')],
                       check=True)
        img = open(os.path.join(d, 'v3-512-snapshot'), 'rb').read()
        s['v3-512-snapshot'] = struct.pack('<H', len(img)) + img + mix
        # Persistent bitmaps (qcow2.txt, "Bitmaps extension"): one QEMU
        # tracks (auto), one disabled at 512-byte granularity, written to.
        make('v3-512-bitmaps', 'cluster_size=512', io=['write -P 0x33 0 2k'])
        bp = os.path.join(d, 'v3-512-bitmaps')
        subprocess.run(['qemu-img', 'bitmap', '--add', bp, 'b0'], check=True)
        subprocess.run(['qemu-img', 'bitmap', '--add', '-g', '512', '--disable', bp, 'b1'],
                       check=True)
        subprocess.run(['qemu-io', '-f', 'qcow2', '-c', 'write -P 0x44 64k 4k', bp], check=True,
                       stdout=subprocess.DEVNULL)
        img = open(bp, 'rb').read()
        s['v3-512-bitmaps'] = struct.pack('<H', len(img)) + img + mix
        # A compressed cluster (deflate): convert -c of a written image.
        raw = os.path.join(d, 'c.raw')
        with open(raw, 'wb') as f:
            f.write(bytes(range(256)) * 16 + bytes(4096 * 3))
        cz = os.path.join(d, 'v3-compressed')
        subprocess.run(['qemu-img', 'convert', '-q', '-c', '-O', 'qcow2', '-o',
                        'cluster_size=4096', raw, cz], check=True)
        img = open(cz, 'rb').read()
        s['v3-4k-compressed'] = struct.pack('<H', len(img)) + img + mix
    return s


# ---- fuzz_luks ----
# The images under fuzz/luks/ are cryptsetup's (luksFormat), whose output
# is random (salts, AF stripes, UUIDs): they were made once with
# `make-seeds.py --luks-images` and are checked in, and the seeds come from
# them deterministically.  fuzz_luks.c reads the same files (its base[],
# in this order): a seed's header chunks only open with its own image's
# keyslot material.  Each image: keyslots that cost next to nothing to
# derive (PBKDF2 1000 iterations; Argon2id at cryptsetup's minimums), a
# volume key we know (LUKS_VK, for the handed-over key), and 64 KiB of
# payload.

LUKS_PASS = b'vblkd-fuzz-passphrase'            # fuzz_luks.c: PASSPHRASE
LUKS_VK = hashlib.sha512(b'vblkd fuzz volume key').digest()     # fuzz_luks.c: vk[]
LUKS_PAYLOAD = 64 << 10
# name, data offset (bytes), volume key bytes, luksFormat options
LUKS_IMAGES = [
    ('luks1-pbkdf2', 2056 * 512, 32,
     ['--type', 'luks1', '--pbkdf', 'pbkdf2', '--pbkdf-force-iterations', '1000',
      '--hash', 'sha256', '--align-payload', '8']),
    ('luks2-pbkdf2', 320 * 512, 32,
     ['--type', 'luks2', '--pbkdf', 'pbkdf2', '--pbkdf-force-iterations', '1000',
      '--hash', 'sha256', '--luks2-metadata-size', '16k', '--luks2-keyslots-size', '128k',
      '--offset', '320']),
    ('luks2-argon2id-4k', 576 * 512, 64,
     ['--type', 'luks2', '--pbkdf', 'argon2id', '--pbkdf-memory', '32',
      '--pbkdf-force-iterations', '4', '--pbkdf-parallel', '1', '--sector-size', '4096',
      '--luks2-metadata-size', '16k', '--luks2-keyslots-size', '256k', '--offset', '576']),
]
LK_AUTO, LK_RAW_CSUM, LK_HANDED = 1, 2, 4
LK_READ, LK_WRITE, LK_FLUSH, LK_DISCARD = range(4)
LK_UNALIGNED, LK_PATTERN = 0x40, 0x80


def luks_images(d):
    import subprocess
    import tempfile
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as t:
        pf, kf = os.path.join(t, 'pass'), os.path.join(t, 'vk')
        with open(pf, 'wb') as f:
            f.write(LUKS_PASS)
        for name, off, klen, opts in LUKS_IMAGES:
            with open(kf, 'wb') as f:
                f.write(LUKS_VK[:klen])
            p = os.path.join(d, name + '.img')
            with open(p, 'wb') as f:
                f.truncate(off + LUKS_PAYLOAD)
            subprocess.run(['cryptsetup', 'luksFormat', '-q', '--batch-mode',
                            '--cipher', 'aes-xts-plain64', '--key-size', str(klen * 8),
                            '--volume-key-file', kf, '--key-file', pf] + opts + [p],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert os.path.getsize(p) == off + LUKS_PAYLOAD, name
            luks1_zero_unused(p)
            print(f'{p}: made')


def luks1_zero_unused(p):
    """LUKS1: cryptsetup fills the areas of all 8 keyslots with random
    bytes; those of the disabled ones only make the file incompressible
    (on-disk-format.pdf: keyslots of 48 bytes from 208, active 0x00ac71f3,
    key-material-offset at 40 in sectors, key-bytes at 108, 4000 stripes)."""
    with open(p, 'r+b') as f:
        img = f.read(592)
        if struct.unpack('>H', img[6:8])[0] != 1:
            return
        key_bytes = struct.unpack('>I', img[108:112])[0]
        for k in range(8):
            active, _ = struct.unpack('>II', img[208 + 48 * k:216 + 48 * k])
            off, stripes = struct.unpack('>II', img[248 + 48 * k:256 + 48 * k])
            if active != 0x00ac71f3:
                f.seek(off * 512)
                f.write(bytes(key_bytes * stripes))


def luks_chunks(img):
    """The image's headers as fuzz_luks chunks (offset, bytes): what is not
    zero of the LUKS1 header, or of each LUKS2 binary header and JSON area."""
    if struct.unpack('>H', img[6:8])[0] == 1:
        return [(0, img[:592])]
    hs = struct.unpack('>Q', img[8:16])[0]
    out = []
    for base in (0, hs):
        out.append((base, img[base:base + 512]))
        json = img[base + 4096:base + hs].rstrip(b'\0')
        out.append((base + 4096, json))
    return out


def lk_req(op, split, sector, sectors):
    return struct.pack('<BB', op, split) + struct.pack('<I', sector)[:3] + \
        struct.pack('<HB', sectors, 0)


def luks_seeds(d):
    s = {}
    mix = (lk_req(LK_WRITE | LK_PATTERN, 0, 0, 8) + lk_req(LK_READ, 0x21, 0, 16) +
           lk_req(LK_WRITE | LK_PATTERN, 0x13, 8, 9) + lk_req(LK_FLUSH, 0, 0, 0) +
           lk_req(LK_DISCARD, 0, 0, 8) + lk_req(LK_WRITE | LK_UNALIGNED, 0, 3, 1) +
           lk_req(LK_READ | LK_UNALIGNED, 0x50, 1, 9) + lk_req(LK_WRITE, 0, 120, 8) +
           lk_req(LK_READ, 0x7f, 112, 16))
    for i, (name, _, _, _) in enumerate(LUKS_IMAGES):
        with open(os.path.join(d, name + '.img'), 'rb') as f:
            img = f.read()
        chunks = luks_chunks(img)
        body = struct.pack('<B', len(chunks)) + b''.join(
            struct.pack('<IH', off, len(b)) + b for off, b in chunks)
        for suffix, flags in (('', 0), ('-auto-handed', LK_AUTO | LK_HANDED),
                              ('-raw-csum', LK_RAW_CSUM)):
            if suffix == '-raw-csum' and name.startswith('luks1'):
                continue
            s[name + suffix] = struct.pack('<BBB', i, flags, 0) + body + mix
    return s


# ---- fuzz_nbd_opt, fuzz_nbd_tx ----
# nbd_opt: what a client sends after the greeting (client flags, options);
# nbd_tx: the request stream after a handshake the harness does itself.

IHAVEOPT = 0x49484156454F5054


def nbd_opt(o, data=b''):
    return struct.pack('>QII', IHAVEOPT, o, len(data)) + data


def nbd_req(cmd, off, length, flags=0, payload=b'', cookie=1):
    return struct.pack('>IHHQQI', 0x25609513, flags, cmd, cookie, off, length) + payload


def nbd_opt_seeds():
    flags = struct.pack('>I', 3)
    go = struct.pack('>I', 0) + struct.pack('>HH', 1, 3)
    meta = struct.pack('>II', 0, 2) + struct.pack('>I', 15) + b'base:allocation' + \
        struct.pack('>I', 21) + b'qemu:allocation-depth'
    s = {
        'go': flags + nbd_opt(8) + nbd_opt(7, go),
        'export-name': flags + nbd_opt(1, b''),
        'info-list-abort': flags + nbd_opt(6, go) + nbd_opt(3) + nbd_opt(2),
        'meta': flags + nbd_opt(8) + nbd_opt(9, struct.pack('>II', 0, 0)) + nbd_opt(10, meta) +
        nbd_opt(7, go),
        'starttls': flags + nbd_opt(5) + nbd_opt(7, go),
        'go-then-read': flags + nbd_opt(8) + nbd_opt(7, go) + nbd_req(0, 0, 4096),
        'unknown': flags + nbd_opt(0x1234, b'xyz') + nbd_opt(7, go),
    }
    return s


def nbd_tx_seeds():
    s = {
        'read': nbd_req(0, 0, 4096) + nbd_req(0, 65536, 512, cookie=2),
        'write-flush': nbd_req(1, 4096, 512, flags=1, payload=b'\xab' * 512) + nbd_req(3, 0, 0),
        'trim-zero': nbd_req(4, 0, 1 << 20) + nbd_req(6, 1 << 20, 65536, flags=2),
        'block-status': nbd_req(7, 0, 1 << 20) + nbd_req(7, 4096, 8192, flags=8),
        'cache-disc': nbd_req(5, 0, 4096) + nbd_req(2, 0, 0),
        'read-df': nbd_req(0, 8192, 4096, flags=4),
        'mixed': nbd_req(1, 0, 1024, payload=bytes(range(256)) * 4) + nbd_req(0, 0, 1024) +
        nbd_req(7, 0, 4096),
    }
    return s


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.argv[1:] == ['--nbd']:
        seed_sets = (('nbd_opt', nbd_opt_seeds()), ('nbd_tx', nbd_tx_seeds()))
        write_seeds(os.path.join(here, 'corpus'), seed_sets)
        return
    if sys.argv[1:] == ['--luks-images']:
        luks_images(os.path.join(here, 'luks'))
        return
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, 'corpus')
    write_seeds(out, (('vq_blk', vq_seeds()), ('vu', vu_seeds()), ('qcow2', qcow2_seeds()),
                      ('luks', luks_seeds(os.path.join(here, 'luks'))),
                      ('nbd_opt', nbd_opt_seeds()), ('nbd_tx', nbd_tx_seeds())))


def write_seeds(out, seed_sets):
    for name, seeds in seed_sets:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        for k, v in sorted(seeds.items()):
            assert len(v) < (65536 if name in ('qcow2', 'luks') else 4096), (name, k, len(v))
            with open(os.path.join(d, k), 'wb') as f:
                f.write(v)
        print(f'{d}: {len(seeds)} seeds')


if __name__ == '__main__':
    main()
