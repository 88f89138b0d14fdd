/*
 * fuzz_qcow2: a hostile qcow2 image (header, extensions, L1, refcount
 * table and blocks, L2 tables, compressed clusters) opened through the
 * format layer (fmt_open, as vblkd opens --disk), then a few guest
 * requests on it (reads, writes, discards, write zeroes, flushes, a grow),
 * its persistent bitmaps loaded and stored back (qcow2_bitmap.c) and the
 * close that writes the metadata back.  No input may crash,
 * hang, leak or write outside the image file's memory; what the image
 * says is only believed after it is checked; an image refused (at open,
 * or at the claim before the first request) is left as it was, byte for
 * byte.
 *
 * The image lives in a memfd and its I/O runs inline through a
 * synchronous engine (fuzz_img.h): no file, open or thread per input.
 *
 * Input:
 *   u16  image length N (little-endian), then N bytes: the image file
 *        (seeds: small images made by qemu-img, 512-byte clusters)
 *   then 8 bytes per request, at most 32:
 *        u8 op (low 3 bits: 0 read, 1 write, 2 discard, 3 write zeroes,
 *              4 write zeroes with unmap, 5 flush, 6 grow; bit 7: the
 *              data written is 0xa5 bytes, else zeroes)
 *        u8 pad
 *        u24 offset in 512-byte sectors, u16 length in sectors (1..)
 *        -- offset and length are wrapped into the disk
 */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz.h"
#include "fuzz_img.h"

#include "backend/bdev.h"
#include "bitmap/dbm.h"
#include "format/format.h"
#include "loop/loop.h"

#define MAX_IMAGE (64u << 10)	/* what the u16 length says */
#define MAX_REQS 32
#define MAX_LEN (64u << 10)

static struct fuzz_img img;
/* The disk's ctx is made on it; never run, so the calls made on "its
 * iothread" (a grow) run inline (loop_call_sync). */
static struct loop *lp;
static uint8_t *buf;
static unsigned completed;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_log_init();
	fuzz_img_init(&img, "fuzz-qcow2", MAX_IMAGE);
	FUZZ_CHECK(loop_new("fuzz", &lp) == 0);
	if (posix_memalign((void **)&buf, 4096, MAX_LEN))
		abort();
	return 0;
}

static void done(struct bdev_io *io, int res)
{
	(void)io;
	(void)res;
	completed++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	/* Backing files (opened by path, rare here): the threads engine. */
	struct bdev_opts bo = { .engine = "threads", .cache = BDEV_CACHE_WRITEBACK };
	struct fmt_opts fo = { .kind = FMT_QCOW2, .l2_cache_bytes = 4096, .bo = &bo };
	struct bdev file, *disk;
	struct bdev_ctx *ctx = NULL;
	const uint8_t *image;
	bool refused = false;
	struct dbm **bm = NULL;
	unsigned nbm = 0;
	uint16_t n;
	char err[512];

	fuzz_take(&in, &n, sizeof(n));
	if (n > in.left)
		n = (uint16_t)in.left;
	image = in.p;
	fuzz_img_load(&img, image, n);
	in.p += n;
	in.left -= n;

	if (fuzz_img_bdev(&img, &file) < 0)
		return 0;
	err[0] = '\0';
	if (fmt_open(&file, &fo, &disk, err, sizeof(err)) < 0) {
		/* Refused: one line, and the file left as it was given. */
		FUZZ_CHECK(err[0] != '\0' && !strchr(err, '\n'));
		FUZZ_CHECK(fuzz_img_same(&img, image, n));
		return 0;
	}
	if (bdev_ctx_new(disk, lp, 16, &ctx) < 0)
		goto close;
	/* As the device does when its first ring starts: the tables read
	 * again, checked again. */
	err[0] = '\0';
	if (fmt_claim(disk, err, sizeof(err)) < 0) {
		FUZZ_CHECK(err[0] != '\0' && !strchr(err, '\n'));
		refused = true;
		goto free_ctx;
	}
	/* The bitmaps the image holds, as the disk takes them. */
	if (fmt_bitmaps_load(disk, &bm, &nbm, err, sizeof(err)) < 0)
		FUZZ_CHECK(err[0] != '\0' && !strchr(err, '\n'));
	for (unsigned i = 0; i < nbm; i++)
		fmt_bitmaps_taken(disk, bm[i]->name);
	/* Held: the first write stores them in use and writes ahead. */
	(void)fmt_bitmaps_hold(disk, bm, nbm, false);
	for (unsigned i = 0; i < MAX_REQS && in.left >= 8; i++) {
		uint8_t op, pad, o[3];
		uint16_t len;
		uint64_t sectors = disk->size >> 9, off;
		struct iovec iov;
		struct bdev_io io = { .cb = done };
		unsigned before = completed;

		fuzz_take(&in, &op, 1);
		fuzz_take(&in, &pad, 1);
		fuzz_take(&in, o, 3);
		fuzz_take(&in, &len, 2);
		fuzz_take(&in, &pad, 1);
		if (!sectors)
			break;
		off = ((uint64_t)o[0] | (uint64_t)o[1] << 8 | (uint64_t)o[2] << 16) % sectors;
		len = (uint16_t)(1 + len % (MAX_LEN >> 9));
		if (len > sectors - off)
			len = (uint16_t)(sectors - off);
		/* Whole blocks of the disk, as blk sends them. */
		off &= ~(uint64_t)((disk->block_size >> 9) - 1);
		len = (uint16_t)(len & ~((disk->block_size >> 9) - 1));
		if (!len)
			continue;
		iov = (struct iovec){ buf, (size_t)len << 9 };
		io.offset = off << 9;
		switch (op & 7) {
		case 0:
		case 1:
			io.op = (op & 7) ? BDEV_WRITE : BDEV_READ;
			memset(buf, (op & 0x80) ? 0xa5 : 0, iov.iov_len);
			io.iov = &iov;
			io.iovcnt = 1;
			break;
		case 2:
		case 3:
		case 4:
			io.op = (op & 7) == 2 ? BDEV_DISCARD : BDEV_WRITE_ZEROES;
			io.unmap = (op & 7) == 4;
			io.length = iov.iov_len;
			break;
		case 5:
			io.op = BDEV_FLUSH;
			break;
		default: {
			/* Grow by up to 64 MiB, as vblkctl resize would. */
			uint64_t to = disk->size + (uint64_t)len * (512u << 10);

			(void)bdev_resize(disk, to, err, sizeof(err));
			continue;
		}
		}
		/* As the disk marks its bitmaps (disk_dirty). */
		if (io.op != BDEV_READ && io.op != BDEV_FLUSH)
			for (unsigned b = 0; b < nbm; b++)
				dbm_mark(bm[b], io.offset, iov.iov_len);
		bdev_submit(disk, ctx, &io);
		disk->engine->kick(ctx);
		disk->engine->drain(ctx);
		FUZZ_CHECK(completed == before + 1);
	}
	/* As the release stores them (one that grew past them is not). */
	{
		struct dbm **drop = calloc(nbm ? nbm : 1, sizeof(*drop));
		unsigned k = 0, nd = 0;

		FUZZ_CHECK(drop != NULL);
		for (unsigned i = 0; i < nbm; i++)
			if (bm[i]->size == disk->size)
				bm[k++] = bm[i];
			else
				drop[nd++] = bm[i];
		nbm = k;
		/* The format lets go of them before they are freed. */
		(void)fmt_bitmaps_hold(disk, bm, nbm, false);
		for (unsigned i = 0; i < nd; i++)
			dbm_free(drop[i]);
		free(drop);
		err[0] = '\0';
		if (fmt_bitmaps_store(disk, bm, nbm, true, err, sizeof(err)) < 0)
			FUZZ_CHECK(err[0] != '\0' && !strchr(err, '\n'));
	}
free_ctx:
	disk->engine->ctx_free(ctx);
close:
	(void)fmt_close(disk, &file);
	for (unsigned i = 0; i < nbm; i++)
		dbm_free(bm[i]);
	free(bm);
	/* Nothing is written before the claim (qcow2.c, qcow2_open): one
	 * refused leaves the image as it was. */
	if (refused)
		FUZZ_CHECK(fuzz_img_same(&img, image, n));
	return 0;
}
