#!/usr/bin/python3
"""An independent LUKS data-path oracle for tests/format/test_luks.sh:
aes-xts-plain64 as dm-crypt computes it (IV: the payload's 512-byte sector
number, little-endian, for every encryption sector size), with Debian's
python3-cryptography, on the volume key cryptsetup dumps.

  luks_oracle.py encrypt IMAGE KEYFILE PLAIN   PLAIN's bytes into the payload
  luks_oracle.py decrypt IMAGE KEYFILE OUT     the payload's plaintext to OUT

The volume key, payload offset and sector size come from `cryptsetup
luksDump` (--dump-volume-key with the key file), never from vblkd.
"""
import re
import subprocess
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def layout(image, keyfile):
    dump = subprocess.run(["cryptsetup", "luksDump", image], check=True,
                          capture_output=True, text=True).stdout
    vk = subprocess.run(["cryptsetup", "luksDump", "--dump-volume-key", "-q",
                         "--key-file", keyfile, image], check=True,
                        capture_output=True, text=True).stdout
    hexkey = "".join(re.findall(r"\b[0-9a-f]{2}\b", vk.split("MK dump:", 1)[1]))
    if "Version:       \t1" in dump or re.search(r"Version:\s+1\b", dump):
        offset = int(re.search(r"Payload offset:\s+(\d+)", dump).group(1)) * 512
        sector = 512
    else:
        seg = dump.split("Data segments:", 1)[1]
        offset = int(re.search(r"offset:\s+(\d+) \[bytes\]", seg).group(1))
        sector = int(re.search(r"sector:\s+(\d+) \[bytes\]", seg).group(1))
    return bytes.fromhex(hexkey), offset, sector


def xts(key, sector_no, data, enc):
    c = Cipher(algorithms.AES(key), modes.XTS(sector_no.to_bytes(16, "little")))
    x = c.encryptor() if enc else c.decryptor()
    return x.update(data) + x.finalize()


def main():
    op, image, keyfile, other = sys.argv[1:5]
    key, offset, sector = layout(image, keyfile)
    with open(image, "r+b") as f:
        f.seek(0, 2)
        size = (f.tell() - offset) // sector * sector
        if op == "encrypt":
            plain = open(other, "rb").read()[:size]
            for pos in range(0, len(plain) - len(plain) % sector, sector):
                f.seek(offset + pos)
                f.write(xts(key, pos // 512, plain[pos:pos + sector], True))
        else:
            with open(other, "wb") as out:
                for pos in range(0, size, sector):
                    f.seek(offset + pos)
                    out.write(xts(key, pos // 512, f.read(sector), False))


if __name__ == "__main__":
    main()
