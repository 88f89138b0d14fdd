#!/usr/bin/python3
"""Edit the JSON metadata of a LUKS2 image in place, in both header copies,
with each copy's checksum made right again (so libcryptsetup takes the
edit instead of refusing a damaged header): the hostile-but-valid images of
tests/format/test_luks.sh.  Layout from cryptsetup's LUKS2 on-disk format
document: binary header (4096 bytes; hdr_size at 8, checksum_algorithm at
72, checksum at 448), JSON area after it up to hdr_size, NUL-padded; the
checksum covers the whole hdr_size with the checksum field zeroed; the
secondary copy starts at hdr_size.

    luks2_edit.py IMAGE PATH=VALUE...

PATH is dot-separated into the JSON ("keyslots.0.kdf.memory"), VALUE JSON
("4194304", "\\"argon2id\\"")."""
import hashlib
import json
import struct
import sys


def edit_copy(f, off, edits):
    f.seek(off)
    hdr = bytearray(f.read(4096))
    if hdr[:6] not in (b"LUKS\xba\xbe", b"SKUL\xba\xbe"):
        sys.exit("luks2_edit: no LUKS2 header at %d" % off)
    size = struct.unpack(">Q", hdr[8:16])[0]
    alg = hdr[72:104].rstrip(b"\0").decode()
    area = f.read(size - 4096)
    meta = json.loads(area.rstrip(b"\0").decode())
    for path, value in edits:
        node = meta
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    text = json.dumps(meta, separators=(",", ":")).encode()
    if len(text) >= len(area):
        sys.exit("luks2_edit: the JSON no longer fits its area")
    area = text + b"\0" * (len(area) - len(text))
    hdr[448:512] = b"\0" * 64
    digest = hashlib.new(alg, bytes(hdr) + area).digest()
    hdr[448:448 + len(digest)] = digest
    f.seek(off)
    f.write(bytes(hdr) + area)
    return size


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    edits = []
    for arg in sys.argv[2:]:
        path, _, value = arg.partition("=")
        edits.append((path, json.loads(value)))
    with open(sys.argv[1], "r+b") as f:
        size = edit_copy(f, 0, edits)
        edit_copy(f, size, edits)


main()
