/*
 * fuzz_luks: a hostile LUKS1 or LUKS2 header (binary header, LUKS2 JSON
 * metadata, keyslots, digests, segments) opened through the format layer
 * (fmt_open, as vblkd opens --disk with --format luks or auto) with the
 * passphrase from a key file or the volume key handed over by an upgrade,
 * then a few guest requests on the disk (reads, writes read back, flushes,
 * a discard) and the close.  No input may crash, hang or leak; a refusal
 * is one line; and the image is never written but for the payload the
 * guest writes: vblkd never writes a LUKS header (libcryptsetup "repairs"
 * a damaged LUKS2 header copy from the other when it may write the
 * device).  A write reads back as written, and the key the disk holds is
 * the image's volume key.
 *
 * What gets mutated: a LUKS image is a few KiB of header among hundreds of
 * KiB of keyslot material (4000 AF stripes of the key, encrypted: random
 * bytes) and payload.  Mutating the material only makes the passphrase
 * fail, so it is not in the input: the input carries the headers, as
 * chunks written over a base image, one of fuzz/luks/NAME.img (made by
 * cryptsetup, see make-seeds.py) with its own headers zeroed.  A seed's
 * chunks are its base's headers, which open with the base's material.
 * LUKS2 headers carry a checksum over the binary header and the JSON
 * area: by default it is recomputed after the chunks are written, so that
 * mutated metadata gets past it to the JSON checks and beyond.
 *
 * The image lives in a memfd and its I/O runs inline through a
 * synchronous engine (fuzz_img.h); libcryptsetup opens the image by its
 * /proc/self/fd path.  Keyslots cost little (PBKDF2 1000 iterations,
 * Argon2id at its minimums), and fmt_opts bounds what a mutated one may
 * cost (kdf_max_ms, kdf_max_kib).
 *
 * Input:
 *   u8  base image: base[] below (modulo their number)
 *   u8  flags: bit 0: --format auto (else luks); bit 1: LUKS2 checksums
 *       left as the chunks have them; bit 2: the volume key handed over
 *       (fmt_opts.key_handed) instead of the passphrase
 *   u8  image size: 0: the base's; else cut or zero-extended to that
 *       many 8 KiB
 *   u8  number of chunks (at most 16), then per chunk: u32 offset, u16
 *       length (little-endian), that many bytes, written over the base
 *       (what lies past the image's end is dropped)
 *   then 8 bytes per request, at most 16:
 *       u8 op (low 2 bits: 0 read, 1 write then read back, 2 flush,
 *             3 discard; bit 6: offset and length as given, else whole
 *             blocks of the disk; bit 7: the data written is 0xa5
 *             bytes, else zeroes)
 *       u8 split: the buffer in three iovecs, the first (split & 15) *
 *             304 bytes, the second (split >> 4) * 304 (so sectors
 *             straddle iovecs)
 *       u24 offset in 512-byte sectors, u16 length in sectors (1..),
 *       u8 pad -- offset and length are wrapped into the disk
 *
 * VBLK_FUZZ_DUMP=1: what became of the input (refused and why, or opened
 * and each request's result), on stderr.
 */
#include <libcryptsetup.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_img.h"

#include "backend/bdev.h"
#include "format/format.h"
#include "loop/loop.h"
#include "util/compiler.h"

#define MAX_IMAGE (2u << 20)
#define MAX_CHUNKS 16
#define MAX_REQS 16
#define MAX_LEN (64u << 10)
#define PASSPHRASE "vblkd-fuzz-passphrase"	/* make-seeds.py: LUKS_PASS */

/* make-seeds.py: LUKS_IMAGES, in its order, with their volume keys' bytes. */
static struct {
	const char *name;
	unsigned key_len;
	uint8_t *img;		/* fuzz/luks/NAME.img, headers zeroed */
	size_t size;
} base[] = {
	{ "luks1-pbkdf2", 32 },
	{ "luks2-pbkdf2", 32 },
	{ "luks2-argon2id-4k", 64 },
};
#define NBASES ARRAY_SIZE(base)

static struct fuzz_img img;
static uint8_t *want;		/* what the image must hold */
static uint8_t *after;		/* ... after the guest's writes */
static char key_path[32];	/* the passphrase's file */
static int vk_fd[2];		/* the volume key handed over: 32, 64 bytes */
static uint8_t vk[64];		/* make-seeds.py: LUKS_VK */
static struct loop *lp;
static uint8_t *buf, *back;
static unsigned completed;
static int last_res;
static bool dump;		/* $VBLK_FUZZ_DUMP: print what became of the input */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Big-endian fields of the on-disk headers, at any alignment. */
static uint64_t be_at(const uint8_t *p, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes; i++)
		v = v << 8 | p[i];
	return v;
}

static int memfd_with(const char *name, const void *p, size_t n)
{
	int fd = memfd_create(name, MFD_CLOEXEC);

	FUZZ_CHECK(fd >= 0 && pwrite(fd, p, n, 0) == (ssize_t)n);
	return fd;
}

/* The headers of a base: the LUKS1 header (on-disk-format.pdf: 592
 * bytes; its first keyslot's material at key-material-offset), both
 * LUKS2 header copies (on-disk-format-luks2.pdf: hdr_size each). */
static size_t headers_len(const uint8_t *p, size_t size)
{
	uint64_t n = be_at(p + 6, 2) == 1 ? be_at(p + 208 + 40, 4) * 512 : 2 * be_at(p + 8, 8);

	FUZZ_CHECK(n >= 4096 && n <= size);
	return n;
}

static void load_base(unsigned i)
{
	char path[512];
	FILE *f;
	long n;

	snprintf(path, sizeof(path), "%s/%s.img", FUZZ_LUKS_DIR, base[i].name);
	f = fopen(path, "rb");
	if (!f) {
		dprintf(fuzz_report_fd, "fuzz_luks: cannot open %s: run fuzz/make-seeds.py "
			"--luks-images, or build from this tree\n", path);
		abort();
	}
	FUZZ_CHECK(fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 4096 && n <= (long)MAX_IMAGE);
	rewind(f);
	base[i].img = malloc((size_t)n);
	FUZZ_CHECK(base[i].img && fread(base[i].img, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	base[i].size = (size_t)n;
	memset(base[i].img, 0, headers_len(base[i].img, base[i].size));
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	unsigned n;

	(void)argc;
	(void)argv;
	fuzz_log_init();
	for (unsigned i = 0; i < NBASES; i++)
		load_base(i);
	fuzz_img_init(&img, "fuzz-luks", MAX_IMAGE);
	want = malloc(MAX_IMAGE);
	after = malloc(MAX_IMAGE);
	FUZZ_CHECK(want && after);
	snprintf(key_path, sizeof(key_path), "/proc/self/fd/%d",
		 memfd_with("fuzz-luks-pass", PASSPHRASE, strlen(PASSPHRASE)));
	FUZZ_CHECK(EVP_Digest("vblkd fuzz volume key", 21, vk, &n, EVP_sha512(), NULL) == 1);
	vk_fd[0] = memfd_with("fuzz-luks-vk32", vk, 32);
	vk_fd[1] = memfd_with("fuzz-luks-vk64", vk, 64);
	FUZZ_CHECK(loop_new("fuzz", &lp) == 0);
	dump = getenv("VBLK_FUZZ_DUMP") != NULL;
	if (posix_memalign((void **)&buf, 4096, MAX_LEN) ||
	    posix_memalign((void **)&back, 4096, MAX_LEN))
		abort();
	return 0;
}

/*
 * A LUKS2 header copy at off (on-disk-format-luks2.pdf, 2.1): magic
 * (primary "LUKS\xba\xbe", secondary "SKUL\xba\xbe"), version 2, hdr_size
 * at 8, checksum_alg at 72, csum at 448: the hash of the hdr_size bytes
 * with csum zeroed.  Recomputed where the algorithm is one OpenSSL knows.
 */
static void luks2_csum(uint8_t *p, size_t size, uint64_t off)
{
	static const uint8_t m1[6] = { 'L', 'U', 'K', 'S', 0xba, 0xbe };
	static const uint8_t m2[6] = { 'S', 'K', 'U', 'L', 0xba, 0xbe };
	const EVP_MD *md;
	char alg[33];
	uint64_t hs;
	unsigned n;

	if (off > size || size - off < 4096 || (memcmp(p + off, m1, 6) && memcmp(p + off, m2, 6)) ||
	    be_at(p + off + 6, 2) != 2)
		return;
	hs = be_at(p + off + 8, 8);
	if (hs < 4096 || hs > size - off)
		return;
	memcpy(alg, p + off + 72, 32);
	alg[32] = '\0';
	md = EVP_get_digestbyname(alg);
	if (!md || EVP_MD_get_size(md) > 64)
		return;
	memset(p + off + 448, 0, 64);
	(void)EVP_Digest(p + off, hs, p + off + 448, &n, md, NULL);
}

/* Both copies: the secondary where the primary's hdr_size says, or at
 * the offsets libcryptsetup looks at without a primary. */
static void luks2_csums(uint8_t *p, size_t size)
{
	static const uint64_t at[] = { 0x4000, 0x8000, 0x10000, 0x20000, 0x40000, 0x80000,
				       0x100000, 0x200000, 0x400000 };
	uint64_t hs = be_at(p + 8, 8);

	luks2_csum(p, size, 0);
	for (unsigned i = 0; i < ARRAY_SIZE(at); i++)
		if (at[i] != hs)
			luks2_csum(p, size, at[i]);
	luks2_csum(p, size, hs);
}

static void done(struct bdev_io *io, int res)
{
	(void)io;
	last_res = res;
	completed++;
}

static int run(struct bdev *disk, struct bdev_ctx *ctx, struct bdev_io *io)
{
	unsigned before = completed;

	bdev_submit(disk, ctx, io);
	disk->engine->kick(ctx);
	disk->engine->drain(ctx);
	FUZZ_CHECK(completed == before + 1);
	return last_res;
}

/* The requests of the input on the opened disk. */
static void requests(struct fuzz_in *in, struct bdev *disk, struct bdev_ctx *ctx)
{
	uint64_t sectors = disk->size >> 9;

	for (unsigned i = 0; i < MAX_REQS && in->left >= 8 && sectors; i++) {
		uint8_t op, split, o[3], pad;
		uint16_t len;
		uint64_t off;
		size_t n, a, b;
		int r;
		struct iovec iov[3];
		struct bdev_io io = { .cb = done };

		fuzz_take(in, &op, 1);
		fuzz_take(in, &split, 1);
		fuzz_take(in, o, 3);
		fuzz_take(in, &len, 2);
		fuzz_take(in, &pad, 1);
		off = ((uint64_t)o[0] | (uint64_t)o[1] << 8 | (uint64_t)o[2] << 16) % sectors;
		len = (uint16_t)(1 + len % (MAX_LEN >> 9));
		if (len > sectors - off)
			len = (uint16_t)(sectors - off);
		if (!(op & 0x40)) {
			/* Whole blocks of the disk, as blk sends them. */
			off &= ~(uint64_t)((disk->block_size >> 9) - 1);
			len = (uint16_t)(len & ~((disk->block_size >> 9) - 1));
			if (!len && (op & 3) != 2)
				continue;
		}
		n = (size_t)len << 9;
		a = MIN(n, (size_t)(split & 15) * 304);
		b = MIN(n - a, (size_t)(split >> 4) * 304);
		iov[0] = (struct iovec){ buf, a };
		iov[1] = (struct iovec){ buf + a, b };
		iov[2] = (struct iovec){ buf + a + b, n - a - b };
		io.offset = off << 9;
		switch (op & 3) {
		case 0:
		case 1:
			io.op = (op & 3) ? BDEV_WRITE : BDEV_READ;
			memset(buf, (op & 0x80) ? 0xa5 : 0, n);
			io.iov = iov;
			io.iovcnt = 3;
			break;
		case 2:
			io.op = BDEV_FLUSH;
			break;
		default:
			io.op = BDEV_DISCARD;
			io.length = n;
			break;
		}
		r = run(disk, ctx, &io);
		if (dump)
			dprintf(fuzz_report_fd, "op %d at %llu, %zu bytes: %d\n", io.op,
				(unsigned long long)io.offset, n, r);
		if (r != 0 || io.op != BDEV_WRITE)
			continue;
		/* Read back, in one buffer: the data as written, the guest's
		 * buffers untouched by the write. */
		for (size_t k = 0; k < n; k++)
			FUZZ_CHECK(buf[k] == ((op & 0x80) ? 0xa5 : 0));
		iov[0] = (struct iovec){ back, n };
		io = (struct bdev_io){ .op = BDEV_READ, .offset = off << 9, .iov = iov,
				       .iovcnt = 1, .cb = done };
		FUZZ_CHECK(run(disk, ctx, &io) == 0);
		FUZZ_CHECK(!memcmp(back, buf, n));
	}
}

/* The key the disk serves with is a volume key of the images: every base
 * has LUKS_VK's first 32 or 64 bytes.  Its length is the header's that
 * opened, not necessarily the base's: the input may carry a whole header
 * of another base (a damaged primary, another image's secondary: served
 * from that one, as cryptsetup would).  false: not a LUKS disk. */
static bool check_key(struct bdev *disk, const uint8_t *image, size_t len)
{
	int fd = fmt_key_export(disk);
	uint8_t k[64];
	ssize_t n;

	if (fd == -ENOENT)
		return false;
	FUZZ_CHECK(fd >= 0);
	n = pread(fd, k, sizeof(k), 0);
	FUZZ_CHECK(n == 32 || n == 64);
	if (memcmp(k, vk, (size_t)n)) {
		/* Another key: the input put together a header and keyslot
		 * that hold one (cryptsetup luksDump --dump-volume-key gives
		 * the same).  Served only if the header's digest says it is
		 * the key, as cryptsetup checks it: never garbage. */
		struct crypt_device *cd = NULL;
		/* A copy: crypt_load repairs a damaged header copy in place. */
		int cfd = memfd_with("copy", image, len);
		char path[64];

		snprintf(path, sizeof(path), "/proc/self/fd/%d", cfd);
		FUZZ_CHECK(crypt_init(&cd, path) == 0);
		FUZZ_CHECK(crypt_load(cd, NULL, NULL) == 0);
		FUZZ_CHECK(crypt_volume_key_verify(cd, (const char *)k, (size_t)n) >= 0);
		crypt_free(cd);
		close(cfd);
	}
	close(fd);
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	struct fmt_opts fo = { .kind = FMT_LUKS, .key_file = key_path,
			       .kdf_max_ms = 50, .kdf_max_kib = 64u << 10 };
	struct bdev file, *disk;
	struct bdev_ctx *ctx = NULL;
	uint8_t b, flags, sz, nchunks;
	size_t len;
	uint64_t data_off, dsize;
	char err[512];

	fuzz_take(&in, &b, 1);
	fuzz_take(&in, &flags, 1);
	fuzz_take(&in, &sz, 1);
	fuzz_take(&in, &nchunks, 1);
	b %= NBASES;
	len = sz ? (size_t)sz << 13 : base[b].size;
	memcpy(want, base[b].img, MIN(len, base[b].size));
	if (len > base[b].size)
		memset(want + base[b].size, 0, len - base[b].size);
	for (unsigned i = 0; i < MIN(nchunks, MAX_CHUNKS); i++) {
		uint32_t off;
		uint16_t n;

		fuzz_take(&in, &off, 4);
		fuzz_take(&in, &n, 2);
		n = (uint16_t)MIN(n, in.left);
		if (off < len)
			memcpy(want + off, in.p, MIN(n, len - off));
		in.p += n;
		in.left -= n;
	}
	if (!(flags & 2))
		luks2_csums(want, len);
	fuzz_img_load(&img, want, len);

	if (fuzz_img_bdev(&img, &file) < 0)
		return 0;
	if (flags & 1)
		fo.kind = FMT_AUTO;
	if (flags & 4) {
		fo.key_handed = true;
		fo.key_fd = vk_fd[base[b].key_len == 64];
	}
	err[0] = '\0';
	if (fmt_open(&file, &fo, &disk, err, sizeof(err)) < 0) {
		/* Refused: one line, and the image as it was. */
		if (dump)
			dprintf(fuzz_report_fd, "refused: %s\n", err);
		FUZZ_CHECK(err[0] != '\0' && !strchr(err, '\n'));
		FUZZ_CHECK(fuzz_img_same(&img, want, len));
		return 0;
	}
	if (dump) {
		fmt_describe(disk, &file, err, sizeof(err));
		dprintf(fuzz_report_fd, "opened: %s\n", err);
	}
	/* Opened: nothing written either. */
	FUZZ_CHECK(fuzz_img_same(&img, want, len));
	if (disk == &file)	/* --format auto found no LUKS magic: raw */
		return 0;
	if (!check_key(disk, want, len)) {
		/* --format auto found qcow2's magic: fuzz_qcow2's. */
		FUZZ_CHECK(fo.kind == FMT_AUTO);
		(void)fmt_close(disk, &file);
		return 0;
	}
	/* The payload: the disk's sectors from a sector-aligned offset. */
	dsize = disk->size;
	FUZZ_CHECK(dsize && dsize <= file.size);
	data_off = (file.size - dsize) / disk->block_size * disk->block_size;
	if (bdev_ctx_new(disk, lp, 16, &ctx) == 0) {
		requests(&in, disk, ctx);
		disk->engine->ctx_free(ctx);
	}
	(void)fmt_close(disk, &file);
	/* The guest wrote the payload, nothing else. */
	memcpy(after, want, len);
	FUZZ_CHECK(pread(img.fd, after + data_off, dsize, (off_t)data_off) == (ssize_t)dsize);
	FUZZ_CHECK(fuzz_img_same(&img, after, len));
	return 0;
}
