#!/usr/bin/env python3
"""Malformed NBD clients against vblkd's NBD server, one scenario each.

Each scenario speaks raw bytes on its own connection and checks the
answer doc/proto.md asks for (an option error, a request error with the
stream still in step, or a disconnect of that client alone); after every
one a well-behaved client (handshake with NBD_OPT_GO, structured
replies, a read checked against the disk's file) must still be served.

Usage: nbd_clients.py [--tls] SOCKET_PATH DISK_FILE VBLKD_PID
--tls: the export requires TLS; only what a client without it can try.
Prints PASS:/FAIL: lines; exit 0.
"""
import os
import socket
import struct
import sys
import time

TLS = sys.argv[1] == "--tls"
if TLS:
    del sys.argv[1]
SOCK, DISK, PID = sys.argv[1], sys.argv[2], int(sys.argv[3])
SIZE = os.path.getsize(DISK)

NBDMAGIC, IHAVEOPT, REPLY_MAGIC = 0x4E42444D41474943, 0x49484156454F5054, 0x3E889045565A9
REQ_MAGIC, SIMPLE_MAGIC, CHUNK_MAGIC = 0x25609513, 0x67446698, 0x668E33EF
OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS = 1, 2, 3, 5
OPT_INFO, OPT_GO, OPT_STRUCTURED, OPT_LIST_META, OPT_SET_META = 6, 7, 8, 9, 10
REP_ACK, REP_SERVER, REP_INFO = 1, 2, 3
ERR = 1 << 31
REP_ERR_UNSUP, REP_ERR_POLICY, REP_ERR_INVALID = ERR + 1, ERR + 2, ERR + 3
REP_ERR_UNKNOWN, REP_ERR_TOO_BIG = ERR + 6, ERR + 9
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM = 0, 1, 2, 3, 4
CMD_WRITE_ZEROES, CMD_BLOCK_STATUS = 6, 7
EPERM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP = 1, 22, 28, 75, 95

results = []


def ok(name, cond, why=""):
    results.append(cond)
    print(("PASS: " if cond else "FAIL: ") + name + ("" if cond else ": " + why), flush=True)


class Closed(Exception):
    pass


def recvn(s, n):
    buf = b""
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            raise Closed()
        buf += d
    return buf


def connect(flags=3):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(15)
    s.connect(SOCK)
    magic, opt, hflags = struct.unpack(">QQH", recvn(s, 18))
    assert magic == NBDMAGIC and opt == IHAVEOPT, "bad greeting"
    s.sendall(struct.pack(">I", flags))
    return s


def option(s, opt, data=b""):
    s.sendall(struct.pack(">QII", IHAVEOPT, opt, len(data)) + data)


def opt_reply(s):
    magic, opt, typ, length = struct.unpack(">QIII", recvn(s, 20))
    assert magic == REPLY_MAGIC, "bad option reply magic"
    return opt, typ, recvn(s, length)


def closed(s, within=5):
    """True if the server closed s (EOF or reset) within a few seconds."""
    s.settimeout(within)
    try:
        while True:
            if not s.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def go(s, name=b"", structured=True):
    if structured:
        option(s, OPT_STRUCTURED)
        assert opt_reply(s)[1] == REP_ACK
    option(s, OPT_GO, struct.pack(">I", len(name)) + name + struct.pack(">HH", 1, 3))
    info = {}
    while True:
        _, typ, data = opt_reply(s)
        if typ == REP_INFO:
            info[struct.unpack(">H", data[:2])[0]] = data
        elif typ == REP_ACK:
            return info
        else:
            raise AssertionError("GO refused: %x" % typ)


def request(s, cmd, off, length, flags=0, payload=b"", cookie=0x1234):
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, cookie, off, length) + payload)


def reply(s, structured=True):
    """(error, data) of one reply; data of a read's chunks joined."""
    magic = struct.unpack(">I", recvn(s, 4))[0]
    if magic == SIMPLE_MAGIC:
        err, cookie = struct.unpack(">IQ", recvn(s, 12))
        return err, cookie, None
    assert magic == CHUNK_MAGIC, "bad reply magic %x" % magic
    data, err = b"", 0
    while True:
        flags, typ, cookie, length = struct.unpack(">HHQI", recvn(s, 16))
        payload = recvn(s, length)
        if typ == 1:
            data += payload[8:]
        elif typ & 0x8000:
            err = struct.unpack(">I", payload[:4])[0]
        if flags & 1:
            return err, cookie, data
        assert struct.unpack(">I", recvn(s, 4))[0] == CHUNK_MAGIC


def disk_at(off, length):
    with open(DISK, "rb") as f:
        f.seek(off)
        return f.read(length)


def good_client(tag):
    if TLS:
        # The good client of a TLS export is libnbd's (the shell script).
        return
    try:
        s = connect()
        go(s)
        request(s, CMD_READ, 4096, 8192)
        err, _, data = reply(s)
        request(s, CMD_DISC, 0, 0)
        s.close()
        good = err == 0 and data == disk_at(4096, 8192)
    except Exception as e:   # noqa: BLE001 - any failure is the verdict
        good, err = False, repr(e)
    ok(tag + "-then-a-good-client-is-served", good, "err=%s" % (err,))


def alive():
    try:
        os.kill(PID, 0)
        return True
    except OSError:
        return False


def scenario(name, fn):
    try:
        cond, why = fn()
    except Exception as e:   # noqa: BLE001
        cond, why = False, repr(e)
    ok(name, cond, why)
    if not alive():
        ok(name + "-server-alive", False, "vblkd died")
        sys.exit(0)
    good_client(name)


# ---- Handshake ----

def bad_client_flags():
    s = connect(flags=0x80000003)
    return closed(s), "not disconnected"


def bad_option_magic():
    s = connect()
    s.sendall(struct.pack(">QII", 0x1122334455667788, OPT_GO, 0))
    return closed(s), "not disconnected"


def option_over_bound():
    s = connect()
    option(s, 0x77, b"x" * (1 << 20))
    _, typ, _ = opt_reply(s)
    option(s, OPT_ABORT)
    _, typ2, _ = opt_reply(s)
    return typ == REP_ERR_TOO_BIG and typ2 == REP_ACK, "replies %x %x" % (typ, typ2)


def export_name_unknown():
    s = connect()
    option(s, OPT_EXPORT_NAME, b"no-such-export")
    return closed(s), "not disconnected"


def export_name_over_bound():
    s = connect()
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_EXPORT_NAME, 1 << 30))
    return closed(s), "not disconnected"


def go_malformed():
    s = connect()
    option(s, OPT_GO, struct.pack(">I", 1000) + b"ab" + struct.pack(">H", 0))
    _, typ, _ = opt_reply(s)
    go(s)   # still in step: a GO that is right works
    return typ == REP_ERR_INVALID, "reply %x" % typ


def go_info_count_lies():
    s = connect()
    option(s, OPT_INFO, struct.pack(">I", 0) + struct.pack(">HH", 500, 3))
    _, typ, _ = opt_reply(s)
    return typ == REP_ERR_INVALID, "reply %x" % typ


def go_unknown_name():
    s = connect()
    name = b"nope"
    option(s, OPT_GO, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
    _, typ, _ = opt_reply(s)
    return typ == REP_ERR_UNKNOWN, "reply %x" % typ


def unknown_option():
    s = connect()
    option(s, 0x1234, b"abc")
    _, typ, _ = opt_reply(s)
    return typ == REP_ERR_UNSUP, "reply %x" % typ


def starttls_unconfigured():
    s = connect()
    option(s, OPT_STARTTLS, b"x")
    _, t1, _ = opt_reply(s)
    option(s, OPT_STARTTLS)
    _, t2, _ = opt_reply(s)
    return t1 == REP_ERR_INVALID and t2 == REP_ERR_POLICY, "replies %x %x" % (t1, t2)


def list_with_data():
    s = connect()
    option(s, OPT_LIST, b"junk")
    _, t1, _ = opt_reply(s)
    option(s, OPT_LIST)
    _, t2, data = opt_reply(s)
    _, t3, _ = opt_reply(s)
    return (t1 == REP_ERR_INVALID and t2 == REP_SERVER and t3 == REP_ACK,
            "replies %x %x %x" % (t1, t2, t3))


def meta_before_structured():
    s = connect()
    option(s, OPT_SET_META, struct.pack(">II", 0, 1) + struct.pack(">I", 15) +
           b"base:allocation")
    _, t1, _ = opt_reply(s)
    option(s, OPT_STRUCTURED)
    opt_reply(s)
    # A query whose length runs past the option's end.
    option(s, OPT_LIST_META, struct.pack(">II", 0, 1) + struct.pack(">I", 99) + b"base:")
    _, t2, _ = opt_reply(s)
    return t1 == REP_ERR_INVALID and t2 == REP_ERR_INVALID, "replies %x %x" % (t1, t2)


def handshake_stall_started():
    s = connect()
    return s


# ---- Transmission ----

def in_step(s):
    """The connection still answers a read right."""
    request(s, CMD_READ, 0, 4096, cookie=0x77)
    err, cookie, data = reply(s)
    return err == 0 and cookie == 0x77 and data == disk_at(0, 4096)


def tx(fn, structured=True):
    def run():
        s = connect()
        go(s, structured=structured)
        return fn(s)
    return run


def bad_request_magic(s):
    s.sendall(struct.pack(">IHHQQI", 0xDEADBEEF, 0, CMD_READ, 1, 0, 4096))
    return closed(s), "not disconnected"


def read_past_end(s):
    request(s, CMD_READ, SIZE - 4096, 8192)
    err, _, _ = reply(s)
    return err == EINVAL and in_step(s), "err %d" % err


def read_offset_wraps(s):
    request(s, CMD_READ, (1 << 64) - 4096, 8192)
    err, _, _ = reply(s)
    return err == EINVAL and in_step(s), "err %d" % err


def read_over_max(s):
    request(s, CMD_READ, 0, 64 << 20)
    err, _, _ = reply(s)
    return err == EOVERFLOW and in_step(s), "err %d" % err


def read_misaligned(s):
    request(s, CMD_READ, 1, 4096)
    err, _, _ = reply(s)
    return err == EINVAL and in_step(s), "err %d" % err


def read_simple_error(s):
    # Without structured replies, an error is a simple reply, no data.
    request(s, CMD_READ, SIZE, 512)
    err, _, data = reply(s, structured=False)
    return err == EINVAL and data is None and in_step_simple(s), "err %d" % err


def in_step_simple(s):
    request(s, CMD_READ, 0, 512, cookie=0x78)
    magic, err, cookie = struct.unpack(">IIQ", recvn(s, 16))
    data = recvn(s, 512)
    return magic == SIMPLE_MAGIC and err == 0 and cookie == 0x78 and data == disk_at(0, 512)


def write_past_end(s):
    request(s, CMD_WRITE, SIZE - 512, 4096, payload=b"\xee" * 4096)
    err, _, _ = reply(s)
    return err == ENOSPC and in_step(s) and disk_at(SIZE - 512, 512) != b"\xee" * 512, \
        "err %d" % err


def write_bad_flag(s):
    request(s, CMD_WRITE, 0, 4096, flags=0x40, payload=b"\xdd" * 4096)
    err, _, _ = reply(s)
    return err == EINVAL and in_step(s) and disk_at(0, 4096) != b"\xdd" * 4096, "err %d" % err


def write_over_max(s):
    n = (32 << 20) + 4096
    request(s, CMD_WRITE, 0, n, payload=b"\xcc" * n)
    err, _, _ = reply(s)
    return err == EINVAL and in_step(s), "err %d" % err


def unknown_command(s):
    request(s, 42, 0, 4096)
    err, _, _ = reply(s)
    return err == EINVAL and in_step(s), "err %d" % err


def block_status_without_context(s):
    request(s, CMD_BLOCK_STATUS, 0, 4096)
    err, _, _ = reply(s)
    return err == EINVAL and in_step(s), "err %d" % err


def set_meta(s, *names):
    q = b"".join(struct.pack(">I", len(n)) + n for n in names)
    option(s, OPT_SET_META, struct.pack(">II", 0, len(names)) + q)
    ids = {}
    while True:
        _, typ, data = opt_reply(s)
        if typ == 4:
            ids[data[4:]] = struct.unpack(">I", data[:4])[0]
        elif typ == REP_ACK:
            return ids
        else:
            raise AssertionError("SET_META_CONTEXT refused: %x" % typ)


def tx_meta(fn, *names):
    def run():
        s = connect()
        option(s, OPT_STRUCTURED)
        assert opt_reply(s)[1] == REP_ACK
        ids = set_meta(s, *names)
        option(s, OPT_GO, struct.pack(">I", 0) + struct.pack(">H", 0))
        while opt_reply(s)[1] != REP_ACK:
            pass
        return fn(s, ids)
    return run


def block_status_chunks(s):
    """[(context id, [(length, flags)...])...], error of one BLOCK_STATUS reply."""
    out, err = [], 0
    while True:
        magic, flags, typ, cookie, length = struct.unpack(">IHHQI", recvn(s, 20))
        payload = recvn(s, length)
        if typ == 5:
            cid = struct.unpack(">I", payload[:4])[0]
            out.append((cid, [struct.unpack(">II", payload[4 + 8 * i:12 + 8 * i])
                              for i in range((length - 4) // 8)]))
        elif typ & 0x8000:
            err = struct.unpack(">I", payload[:4])[0]
        if flags & 1:
            return out, err


def block_status_req_one(s, ids):
    request(s, CMD_BLOCK_STATUS, 0, 1 << 20, flags=1 << 3)
    chunks, err = block_status_chunks(s)
    good = (err == 0 and len(chunks) == 2 and
            all(len(d) == 1 and 0 < d[0][0] <= 1 << 20 for _, d in chunks) and
            {c for c, _ in chunks} == set(ids.values()))
    return good and in_step(s), "err %d, chunks %r" % (err, chunks)


def block_status_covers(s, ids):
    request(s, CMD_BLOCK_STATUS, 4096, 8 << 20)
    chunks, err = block_status_chunks(s)
    sums = [sum(l for l, _ in d) for _, d in chunks]
    return err == 0 and len(chunks) == 1 and sums[0] >= 8 << 20 and in_step(s), \
        "err %d, sums %r" % (err, sums)


def block_status_past_end(s, ids):
    request(s, CMD_BLOCK_STATUS, SIZE - 4096, 8192)
    err, _, _ = reply(s)
    request(s, CMD_BLOCK_STATUS, 0, 0)
    err2, _, _ = reply(s)
    return err == EINVAL and err2 == EINVAL and in_step(s), "errs %d %d" % (err, err2)


def meta_unknown_namespace(s, ids):
    # Nothing selected: BLOCK_STATUS is refused.
    request(s, CMD_BLOCK_STATUS, 0, 4096)
    err, _, _ = reply(s)
    return ids == {} and err == EINVAL and in_step(s), "ids %r err %d" % (ids, err)


def trim_past_end(s):
    request(s, CMD_TRIM, SIZE - 4096, 1 << 20)
    err, _, _ = reply(s)
    return err == EINVAL and in_step(s), "err %d" % err


def fast_zero(s):
    request(s, CMD_WRITE_ZEROES, 0, 4096, flags=1 << 4)
    err, _, _ = reply(s)
    return err == ENOTSUP and in_step(s) and disk_at(0, 4096) != b"\0" * 4096, "err %d" % err


def zero_length(s):
    request(s, CMD_READ, 0, 0, cookie=5)
    e1, c1, _ = reply(s)
    request(s, CMD_WRITE, 0, 0, cookie=6)
    e2, c2, _ = reply(s)
    return e1 == 0 and e2 == 0 and c1 == 5 and c2 == 6 and in_step(s), "errs %d %d" % (e1, e2)


def half_close(s):
    # The client says all it will say, then shuts its side: what it
    # asked for is still answered.
    request(s, CMD_READ, 8192, 4096, cookie=9)
    s.shutdown(socket.SHUT_WR)
    err, cookie, data = reply(s)
    return err == 0 and cookie == 9 and data == disk_at(8192, 4096) and closed(s), "err %d" % err


def rss_kib():
    with open("/proc/%d/status" % PID) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def never_reads_replies():
    # 40,000 reads of 1 MiB asked for, no reply read: the server must stop
    # taking requests, not buffer 4 GiB of replies.
    s = connect()
    go(s)
    before = rss_kib()
    s.setblocking(False)
    sent = 0
    req = b"".join(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_READ, i, (i % 60) << 20, 1 << 20)
                   for i in range(40000))
    deadline = time.time() + 5
    while sent < len(req) and time.time() < deadline:
        try:
            sent += s.send(req[sent:])
        except BlockingIOError:
            time.sleep(0.05)
    time.sleep(0.5)
    grown = rss_kib() - before
    s.close()
    return grown < 400 * 1024 and sent < len(req), \
        "RSS grew %d KiB, %d of %d request bytes taken" % (grown, sent, len(req))


def send_for(s, data, seconds, nap):
    """As much of data as s takes in seconds, reading nothing: bytes sent."""
    s.setblocking(False)
    sent, deadline = 0, time.time() + seconds
    while sent < len(data) and time.time() < deadline:
        try:
            sent += s.send(data[sent:])
        except BlockingIOError:
            time.sleep(nap)
    return sent


def flood_unread(s, req, seconds=3):
    """Send req's bytes for a few seconds without reading a reply: (RSS
    growth in KiB, bytes the server took)."""
    before = rss_kib()
    sent = send_for(s, req, seconds, 0.05)
    time.sleep(0.3)
    return rss_kib() - before, sent


def never_reads_small_replies():
    # Replies with no data (errors, block status) and option replies,
    # never read: the server stops taking requests, not piles them up.
    out = []
    s = connect()
    go(s)
    bad = b"".join(struct.pack(">IHHQQI", REQ_MAGIC, 0, 42, i, 0, 4096) for i in range(400000))
    out.append(("unknown command",) + flood_unread(s, bad) + (len(bad),))
    s.close()
    s = connect()
    option(s, OPT_STRUCTURED)
    assert opt_reply(s)[1] == REP_ACK
    set_meta(s, b"base:allocation", b"qemu:allocation-depth")
    option(s, OPT_GO, struct.pack(">I", 0) + struct.pack(">H", 0))
    while opt_reply(s)[1] != REP_ACK:
        pass
    bs = b"".join(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_BLOCK_STATUS, i, 0, 1 << 20)
                  for i in range(200000))
    out.append(("block status",) + flood_unread(s, bs) + (len(bs),))
    s.close()
    s = connect()
    lst = struct.pack(">QII", IHAVEOPT, OPT_LIST, 0) * 400000
    out.append(("NBD_OPT_LIST",) + flood_unread(s, lst) + (len(lst),))
    s.close()
    good = all(g < 64 * 1024 and sent < n for _, g, sent, n in out)
    return good, "; ".join("%s: RSS grew %d KiB, %d of %d bytes taken" % x for x in out)


def hang_up_while_replies_go():
    # A client that closes while its replies are being written: the
    # server's send fails (EPIPE); the connection must still end (this
    # export allows 4: eight such, then the good client is served).
    # Reads complete from the disk (their replies go out from the
    # completion's pass, not from a socket event) and unknown commands
    # are answered at once: the close meets both kinds of send.
    mix = b"".join(struct.pack(">IHHQQI", REQ_MAGIC, 0, CMD_READ if i % 2 else 42, i,
                               (i % 60) << 16, 65536) for i in range(20000))
    for k in range(8):
        s = connect()
        go(s)
        send_for(s, mix, 0.05 * (1 + k % 4), 0.005)
        s.close()
    time.sleep(0.5)
    return True, ""


def meta_query_with_nul():
    s = connect()
    option(s, OPT_STRUCTURED)
    assert opt_reply(s)[1] == REP_ACK
    q = b"base:allocation\0junk"
    option(s, OPT_SET_META, struct.pack(">II", 0, 1) + struct.pack(">I", len(q)) + q)
    _, typ, _ = opt_reply(s)
    return typ == REP_ERR_INVALID, "reply %x" % typ


def max_conn_refused():
    held = [connect() for _ in range(3)]
    for h in held:
        go(h)
    # This export allows 4: the fourth is served, the fifth refused.
    fourth = connect()
    go(fourth)
    try:
        fifth = connect()
        refused = closed(fifth)
    except (Closed, ConnectionResetError, BrokenPipeError, AssertionError):
        refused = True
    for h in held + [fourth]:
        h.close()
    time.sleep(0.3)
    return refused, "a fifth client was served"


def tls_required_go():
    s = connect()
    option(s, OPT_STRUCTURED)
    _, t1, _ = opt_reply(s)
    option(s, OPT_GO, struct.pack(">I", 0) + struct.pack(">H", 0))
    _, t2, _ = opt_reply(s)
    option(s, OPT_LIST)
    _, t3, _ = opt_reply(s)
    return (t1 == t2 == t3 == ERR + 5), "replies %x %x %x" % (t1, t2, t3)


def tls_required_export_name():
    s = connect()
    option(s, OPT_EXPORT_NAME, b"")
    return closed(s), "not disconnected"


def tls_data_before_handshake():
    # STARTTLS and, without waiting for its ACK, more bytes.
    s = connect()
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_STARTTLS, 0) + b"\x16\x03\x01garbage")
    return closed(s), "not disconnected"


def tls_garbage_handshake():
    s = connect()
    option(s, OPT_STARTTLS)
    _, t, _ = opt_reply(s)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")    # not a TLS record
    return t == REP_ACK and closed(s), "reply %x" % t


if TLS:
    scenario("nbd-tls-required-options-tls-reqd", tls_required_go)
    scenario("nbd-tls-required-export-name-disconnected", tls_required_export_name)
    scenario("nbd-tls-data-before-handshake-disconnected", tls_data_before_handshake)
    scenario("nbd-tls-garbage-handshake-disconnected", tls_garbage_handshake)
    scenario("nbd-tls-bad-option-magic-disconnected", bad_option_magic)
    sys.exit(0)

stall = handshake_stall_started()
t_stall = time.time()

scenario("nbd-bad-client-flags-disconnected", bad_client_flags)
scenario("nbd-bad-option-magic-disconnected", bad_option_magic)
scenario("nbd-option-over-bound-too-big-in-step", option_over_bound)
scenario("nbd-export-name-unknown-disconnected", export_name_unknown)
scenario("nbd-export-name-over-bound-disconnected", export_name_over_bound)
scenario("nbd-go-name-length-past-end-invalid", go_malformed)
scenario("nbd-info-request-count-lies-invalid", go_info_count_lies)
scenario("nbd-go-unknown-export", go_unknown_name)
scenario("nbd-unknown-option-unsup", unknown_option)
scenario("nbd-starttls-without-tls-policy", starttls_unconfigured)
scenario("nbd-list-with-data-invalid", list_with_data)
scenario("nbd-meta-context-malformed-invalid", meta_before_structured)
scenario("nbd-bad-request-magic-disconnected", tx(bad_request_magic))
scenario("nbd-read-past-end-einval", tx(read_past_end))
scenario("nbd-read-offset-wraps-einval", tx(read_offset_wraps))
scenario("nbd-read-over-max-eoverflow", tx(read_over_max))
scenario("nbd-read-misaligned-einval", tx(read_misaligned))
scenario("nbd-read-error-simple-reply-no-data", tx(read_simple_error, structured=False))
scenario("nbd-write-past-end-enospc-payload-skipped", tx(write_past_end))
scenario("nbd-write-unknown-flag-einval-payload-skipped", tx(write_bad_flag))
scenario("nbd-write-over-max-einval-payload-skipped", tx(write_over_max))
scenario("nbd-unknown-command-einval", tx(unknown_command))
scenario("nbd-block-status-without-context-einval", tx(block_status_without_context))
scenario("nbd-trim-past-end-einval", tx(trim_past_end))
scenario("nbd-block-status-req-one-one-descriptor-per-context",
         tx_meta(block_status_req_one, b"base:allocation", b"qemu:allocation-depth"))
scenario("nbd-block-status-covers-the-range", tx_meta(block_status_covers, b"base:allocation"))
scenario("nbd-block-status-past-end-or-empty-einval",
         tx_meta(block_status_past_end, b"base:allocation"))
scenario("nbd-meta-unknown-namespace-selects-nothing",
         tx_meta(meta_unknown_namespace, b"x-nope:thing", b"base:"))
scenario("nbd-fast-zero-enotsup-nothing-written", tx(fast_zero))
scenario("nbd-zero-length-read-write-ok", tx(zero_length))
scenario("nbd-half-close-answered-then-closed", tx(half_close))
scenario("nbd-client-never-reads-memory-bounded", never_reads_replies)
scenario("nbd-client-never-reads-small-replies-memory-bounded", never_reads_small_replies)
scenario("nbd-client-hangs-up-while-replies-go-connection-ends", hang_up_while_replies_go)
scenario("nbd-meta-query-with-nul-invalid", meta_query_with_nul)

time.sleep(max(0, 11 - (time.time() - t_stall)))
ok("nbd-handshake-stall-dropped-after-10s", closed(stall, within=3), "still connected")
good_client("nbd-handshake-stall")
time.sleep(0.5)   # the closed clients reaped
scenario("nbd-max-conn-refuses-the-extra-client", max_conn_refused)
