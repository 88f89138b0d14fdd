/*
 * For the format targets (fuzz_qcow2, fuzz_luks): the image file in
 * memory and an engine that does its I/O at once, so an input costs no
 * file creation, no open and no worker threads.
 *
 * The image is one memfd made at start-up, refilled per input (pwrite,
 * then ftruncate to the input's length: its pages are reused).  The
 * struct bdev a target hands fmt_open is filled here as bdev_open fills
 * it for a regular file opened with --cache writeback (disk.c,
 * open_disk), on that fd; its path is /proc/self/fd/N, which qcow2
 * (qcow2_reopen_plain) and libcryptsetup open again as they would the
 * file.  bdev_close is never called on it: the fd is kept.
 *
 * The engine ("sync"): submit runs the I/O with bdev_io_sync and
 * completes it inline (bdev.h allows any engine to), kick and drain have
 * nothing to do.
 */
#ifndef VBLK_FUZZ_IMG_H
#define VBLK_FUZZ_IMG_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

#include "backend/bdev.h"

static char fuzz_sync_ctx;	/* every ctx: the engine keeps no state */

static int fuzz_sync_ctx_new(struct bdev *b, struct loop *l, unsigned depth,
			     struct bdev_ctx **out)
{
	(void)b;
	(void)l;
	(void)depth;
	*out = (struct bdev_ctx *)&fuzz_sync_ctx;
	return 0;
}

static void fuzz_sync_ctx_free(struct bdev_ctx *c)
{
	(void)c;
}

static void fuzz_sync_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	(void)c;
	bdev_complete(io, bdev_io_sync(io->b, io));
}

static void fuzz_sync_nothing(struct bdev_ctx *c)
{
	(void)c;
}

/* What the threads engine does, in the caller's thread. */
static const struct bdev_engine fuzz_sync_engine = {
	.name = "sync",
	.caps = BDEV_CAP_DISCARD | BDEV_CAP_WRITE_ZEROES | BDEV_CAP_FUA,
	.ctx_new = fuzz_sync_ctx_new,
	.ctx_free = fuzz_sync_ctx_free,
	.submit = fuzz_sync_submit,
	.kick = fuzz_sync_nothing,
	.drain = fuzz_sync_nothing,
};

struct fuzz_img {
	int fd;			/* memfd */
	char path[32];		/* /proc/self/fd/<fd> */
	uint8_t *back;		/* fuzz_img_same's copy, cap bytes */
	size_t cap;
};

/* At start-up (LLVMFuzzerInitialize): an image of at most cap bytes. */
static inline void fuzz_img_init(struct fuzz_img *m, const char *name, size_t cap)
{
	m->fd = memfd_create(name, MFD_CLOEXEC);
	FUZZ_CHECK(m->fd >= 0);
	snprintf(m->path, sizeof(m->path), "/proc/self/fd/%d", m->fd);
	m->back = malloc(cap);
	FUZZ_CHECK(m->back);
	m->cap = cap;
}

/* The image is now data[0, n). */
static inline void fuzz_img_load(struct fuzz_img *m, const void *data, size_t n)
{
	FUZZ_CHECK(n <= m->cap);
	FUZZ_CHECK(pwrite(m->fd, data, n, 0) == (ssize_t)n);
	FUZZ_CHECK(ftruncate(m->fd, (off_t)n) == 0);
}

/* Whether the image is still data[0, n): same length, same bytes. */
static inline bool fuzz_img_same(struct fuzz_img *m, const void *data, size_t n)
{
	struct stat st;

	FUZZ_CHECK(fstat(m->fd, &st) == 0);
	if ((uint64_t)st.st_size != n)
		return false;
	FUZZ_CHECK(pread(m->fd, m->back, n, 0) == (ssize_t)n);
	return !memcmp(m->back, data, n);
}

/* *b as bdev_open(path, engine sync, --cache writeback, rw) leaves it for
 * the image as loaded: 0, or -EINVAL where bdev_open refuses (the image
 * is smaller than one 512-byte block). */
static inline int fuzz_img_bdev(struct fuzz_img *m, struct bdev *b)
{
	struct stat st;

	FUZZ_CHECK(fstat(m->fd, &st) == 0);
	if (st.st_size < 512)
		return -EINVAL;
	*b = (struct bdev){
		.path = m->path,
		.fd = m->fd,
		.size = (uint64_t)st.st_size & ~511ull,
		.block_size = 512,
		.size_tail = (unsigned)(st.st_size & 511),
		.phys_block_size = 512,
		/* A file's st_blksize, when larger than a block (open_disk). */
		.discard_granularity = st.st_blksize > 512 && st.st_blksize <= (1 << 20) &&
				       !(st.st_blksize & (st.st_blksize - 1)) ?
				       (unsigned)st.st_blksize : 512,
		.dio_mem_align = 512,
		.dio_len_align = 512,
		.caps = fuzz_sync_engine.caps,
		.engine = &fuzz_sync_engine,
	};
	return 0;
}

#endif
