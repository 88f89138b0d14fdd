/*
 * LUKS inside src/format/ (the public contract is format.h).  A LUKS1 or
 * LUKS2 disk: the header and keyslots through libcryptsetup (the volume
 * key taken with the key file's passphrase; vblkd never writes a header),
 * the payload served as the disk, aes-xts-plain64 through OpenSSL's EVP
 * on each queue's iothread.  Spec: cryptsetup's LUKS1 and LUKS2 on-disk
 * format documents; the IV is dm-crypt's plain64 (the payload's 512-byte
 * sector number, little-endian, also for 4096-byte encryption sectors:
 * cryptsetup sets iv_large_sectors for plain and BitLocker only).
 */
#ifndef VBLK_FMT_LUKS_H
#define VBLK_FMT_LUKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bdev;
struct bdev_engine;
struct fmt_opts;

/* Default bounds on one keyslot's key derivation (fmt_opts.kdf_max_ms,
 * kdf_max_kib; --kdf-max-ms, --kdf-max-memory): five times the 2 s that
 * cryptsetup aims a new keyslot at (its default Argon2id keyslot takes
 * ~4 s on the 2-CPU machines here), so an image made on a machine more
 * than twice as fast opens; and cryptsetup's own Argon2 memory cap.  The
 * keyslots tried for one passphrase: four times that in all. */
#define LUKS_KDF_MAX_MS 10000u
#define LUKS_KDF_MAX_KIB (1024u * 1024u)

/* "LUKS\xba\xbe" at offset 0 (LUKS1 and LUKS2). */
bool luks_detect(const void *buf, size_t len);

/* A LUKS2 disk whose primary header lost its magic, found by its
 * secondary header at one of the offsets cryptsetup and libblkid scan for
 * it (LUKS2_HDR2_OFFSETS: 16 KiB to 4 MiB), whose hdr_size and hdr_offset
 * both name that offset: the offset, or 0.  cryptsetup opens such a disk
 * (it recovers the primary); served raw, a guest's writes would go over
 * the keyslots.  bdev_pread; main thread. */
uint64_t luks_probe_secondary(struct bdev *file);

/* Open file (a LUKS disk) with o->key_file, or the key handed over
 * (o->key_handed, checked by the header's digest): *disk is the payload.  One
 * line in err on failure (no key, wrong passphrase, a cipher other than
 * aes-xts-plain64, a damaged header), nothing changed.  Main thread. */
int luks_open(struct bdev *file, const struct fmt_opts *o, struct bdev **disk, char *err,
	      size_t errlen);
/* The key wiped, everything freed; file stays open.  Main thread. */
void luks_close(struct bdev *disk);
bool luks_is(const struct bdev_engine *e);
/* fmt_key_export for a LUKS disk: a sealed memfd holding its key. */
int luks_key_export(const struct bdev *disk);
void luks_describe(const struct bdev *disk, char *buf, size_t len);

#endif
