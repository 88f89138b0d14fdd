#include "backend/bdev.h"
#include "backend/module.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/uio.h>
#include <linux/falloc.h>
#include <stdlib.h>
#include <string.h>

#include "util/compiler.h"
#include "util/iov.h"
#include "util/log.h"

static const struct bdev_engine *const engines[] = {
	&bdev_uring_engine,
	&bdev_null_engine,
	&bdev_threads_engine,
#ifdef HAVE_LIBAIO
	&bdev_aio_engine,
#endif
};

/* Engine i of all: built in, then modules; NULL past the last. */
static const char *engine_name(unsigned i)
{
	return i < ARRAY_SIZE(engines) ? engines[i]->name :
	       bdev__module_name(i - (unsigned)ARRAY_SIZE(engines));
}

const char *bdev_engine_names(void)
{
	static char names[128];

	if (!names[0]) {
		size_t n = 0;

		for (unsigned i = 0; engine_name(i); i++)
			n += (size_t)snprintf(names + n, sizeof(names) - n, "%s%s",
					      i == 0 ? "" : !engine_name(i + 1) ?
					      " or " : ", ", engine_name(i));
	}
	return names;
}

int bdev_io_sync(struct bdev *b, struct bdev_io *io)
{
	switch (io->op) {
	case BDEV_READ:
	case BDEV_WRITE:
		while (io->len) {
			ssize_t n = io->op == BDEV_READ ?
				preadv(b->fd, io->iov, (int)io->iovcnt, (off_t)io->offset) :
				pwritev2(b->fd, io->iov, (int)io->iovcnt, (off_t)io->offset,
					 io->fua ? RWF_DSYNC : 0);
			int r;

			if (n < 0) {
				if (errno == EINTR || errno == EAGAIN)
					continue;
				return -errno;
			}
			if (n == 0)
				return -EIO;
			if ((size_t)n == io->len)
				break;
			r = bdev_io_consume(io, (size_t)n);
			if (r < 0)
				return r;
		}
		return 0;
	case BDEV_FLUSH:
		return fdatasync(b->fd) < 0 ? -errno : 0;
	case BDEV_DISCARD:
	case BDEV_WRITE_ZEROES:
		return fallocate(b->fd, bdev_fallocate_mode(b, io), (off_t)io->offset,
				 (off_t)io->length) < 0 ? -errno : 0;
	}
	return -EINVAL;
}

int bdev_pread(struct bdev *b, void *buf, size_t len, uint64_t off)
{
	struct iovec iov = { buf, len };
	struct bdev_io io = { .op = BDEV_READ, .offset = off, .iov = &iov, .iovcnt = 1,
			      .len = len };

	if (off > b->size || len > b->size - off)
		return -EIO;
	if (b->engine->open)
		return b->engine->pread ? b->engine->pread(b, buf, len, off) : -EOPNOTSUPP;
	return b->fd < 0 ? -EBADF : bdev_io_sync(b, &io);
}

const struct bdev_engine *bdev_engine_find(const char *name)
{
	if (!name)
		return engines[0];
	for (unsigned i = 0; i < ARRAY_SIZE(engines); i++)
		if (strcmp(engines[i]->name, name) == 0)
			return engines[i];
	return NULL;
}

/* What O_DIRECT takes: every buffer at a multiple of mem_align, every
 * length a multiple of len_align (a device with 4-byte DMA alignment,
 * NVMe, still wants whole logical blocks per segment). */
static bool iov_aligned(const struct iovec *iov, unsigned cnt, unsigned mem_align,
			unsigned len_align)
{
	for (unsigned i = 0; i < cnt; i++)
		if (((uintptr_t)iov[i].iov_base & (mem_align - 1)) ||
		    (iov[i].iov_len & (len_align - 1)))
			return false;
	return true;
}

int bdev_fallocate_mode(const struct bdev *b, const struct bdev_io *io)
{
	if (io->op == BDEV_DISCARD)
		/* Block devices: NO_HIDE_STALE makes it a real discard
		 * (blkdev_fallocate); files: deallocate. */
		return FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE |
		       (b->is_blockdev ? FALLOC_FL_NO_HIDE_STALE : 0);
	if (io->unmap)
		return FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
	return FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE;
}

int bdev_io_consume(struct bdev_io *io, size_t done)
{
	if (!io->rest) {
		io->rest = malloc(io->iovcnt * sizeof(*io->rest));
		if (!io->rest)
			return -ENOMEM;
		memcpy(io->rest, io->iov, io->iovcnt * sizeof(*io->rest));
		io->orig_iov = io->iov;
		io->orig_iovcnt = io->iovcnt;
		io->orig_offset = io->offset;
		io->iov = io->rest;
	}
	iov_discard_front(&io->iov, &io->iovcnt, done);
	io->offset += done;
	io->len -= done;
	return 0;
}

void bdev_flush_failed(struct bdev *b, int res)
{
	/* O_DIRECT writes do not wait in the page cache, and a network
	 * disk's client has rules of its own (nbd.c, rbd.c). */
	if (b->direct || b->fd < 0 || b->engine->open)
		return;
	if (!atomic_exchange(&b->cache_lost, true))
		log_err("disk %s: a flush failed (%s): writes the page cache held may "
			"never reach the disk, and Linux will not say so again; every "
			"flush fails from now on (the guest must not trust what it wrote "
			"since its last good flush; restart vblkd once the disk is healthy)",
			b->path ? b->path : "(disk)", strerror(-res));
}

static void bsc_lock(struct bdev *b)
{
	while (atomic_flag_test_and_set_explicit(&b->bsc_lock, memory_order_acquire))
		;
}

static void bsc_unlock(struct bdev *b)
{
	atomic_flag_clear_explicit(&b->bsc_lock, memory_order_release);
}

bool bdev_bsc_get(struct bdev *b, uint64_t off, uint64_t *end)
{
	bool hit;

	bsc_lock(b);
	hit = off >= b->bsc_start && off < b->bsc_end;
	*end = b->bsc_end;
	bsc_unlock(b);
	return hit;
}

void bdev_bsc_set(struct bdev *b, uint64_t start, uint64_t end)
{
	bsc_lock(b);
	b->bsc_start = start;
	b->bsc_end = end;
	bsc_unlock(b);
}

void bdev_bsc_drop(struct bdev *b, uint64_t off, uint64_t len)
{
	bsc_lock(b);
	if (off < b->bsc_end && off + len > b->bsc_start)
		b->bsc_start = b->bsc_end = 0;
	bsc_unlock(b);
}

void bdev_submit(struct bdev *b, struct bdev_ctx *c, struct bdev_io *io)
{
	io->b = b;
	io->ctx = c;
	io->bounce = NULL;
	io->rest = NULL;
	io->fua_flush = false;
	io->lost = false;
	if (io->op == BDEV_FLUSH && unlikely(atomic_load_explicit(&b->cache_lost,
								  memory_order_relaxed))) {
		io->lost = true;
		bdev_complete(io, -EIO);
		return;
	}
	if (io->op == BDEV_DISCARD || io->op == BDEV_WRITE_ZEROES) {
		/* It may punch a hole in the cached data extent. */
		if (b->bsc_end)
			bdev_bsc_drop(b, io->offset, io->length);
		io->len = io->length;
		io->zero_retried = false;
		b->engine->submit(c, io);
		return;
	}
	io->len = iov_size(io->iov, io->iovcnt);
	if (unlikely(io->offset == 0) && b->write_guard && io->op == BDEV_WRITE &&
	    b->write_guard(io)) {
		bdev_complete(io, -EPERM);
		return;
	}
	/* O_DIRECT wants aligned buffers; guests usually give them, a
	 * hostile or odd one need not.  Bounce those rather than fail. */
	if (b->direct && io->op != BDEV_FLUSH &&
	    unlikely(!iov_aligned(io->iov, io->iovcnt, b->dio_mem_align,
				  b->dio_len_align ? b->dio_len_align : b->dio_mem_align)) &&
	    bdev_io_bounce(io) < 0) {
		bdev_complete(io, -ENOMEM);
		return;
	}
	b->engine->submit(c, io);
}

/* Point io at the next part of a bounced I/O (bounce_done bytes in). */
static void bounce_part(struct bdev_io *io)
{
	size_t n = MIN(io->bounce_total - io->bounce_done, (size_t)BDEV_BOUNCE_MAX);

	if (io->op == BDEV_WRITE)
		iov_to_buf(io->user_iov, io->user_iovcnt, io->bounce_done, io->bounce, n);
	io->bounce_iov.iov_base = io->bounce;
	io->bounce_iov.iov_len = n;
	io->iov = &io->bounce_iov;
	io->iovcnt = 1;
	io->offset = io->bounce_offset + io->bounce_done;
	io->len = n;
}

int bdev_io_bounce(struct bdev_io *io)
{
	size_t n = MIN(io->len, (size_t)BDEV_BOUNCE_MAX);

	if (posix_memalign(&io->bounce, 4096, n ? n : 1)) {
		io->bounce = NULL;
		return -ENOMEM;
	}
	io->user_iov = io->iov;
	io->user_iovcnt = io->iovcnt;
	io->bounce_total = io->len;
	io->bounce_done = 0;
	io->bounce_offset = io->offset;
	bounce_part(io);
	return 0;
}

void bdev_complete(struct bdev_io *io, int res)
{
	if (res == -EOPNOTSUPP || res == -EINVAL) {
		/*
		 * Discard is advisory (virtio 1.2, 5.2.6.2 "MAY
		 * deallocate"): a filesystem that cannot punch holes has
		 * done all it must.  Write zeroes must leave zeroes, by
		 * either means, so try the other one once: without unmap on
		 * a file system that cannot zero a range (tmpfs), punching a
		 * hole reads back as zeroes too; with unmap on a block device
		 * that cannot zero by deallocating (its PUNCH_HOLE is
		 * "no fallback"), plain zeroing is what the request needs,
		 * unmap being only a permission.
		 */
		if (io->op == BDEV_DISCARD) {
			res = 0;
		} else if (io->op == BDEV_WRITE_ZEROES && !io->zero_retried) {
			io->zero_retried = true;
			io->unmap = !io->unmap;
			io->b->engine->submit(io->ctx, io);
			return;
		}
	}
	if (unlikely(io->rest)) {
		/* iov pointed into the copy: back to what was submitted. */
		free(io->rest);
		io->rest = NULL;
		io->iov = io->orig_iov;
		io->iovcnt = io->orig_iovcnt;
		io->offset = io->orig_offset;
	}
	if (unlikely(io->bounce)) {
		/* bounce_iov still describes the whole part (consume advanced
		 * a copy). */
		size_t n = io->bounce_iov.iov_len;

		if (io->op == BDEV_READ && res == 0)
			iov_from_buf(io->user_iov, io->user_iovcnt, io->bounce_done,
				     io->bounce, n);
		if (res == 0 && io->bounce_done + n < io->bounce_total) {
			io->bounce_done += n;
			bounce_part(io);
			io->b->engine->submit(io->ctx, io);
			return;
		}
		free(io->bounce);
		io->bounce = NULL;
		io->iov = io->user_iov;
		io->iovcnt = io->user_iovcnt;
		io->offset = io->bounce_offset;
		io->len = io->bounce_total;
	}
	/* An engine or disk without FUA (rbd, an NBD server without it): a
	 * write-through write is the write, then a flush. */
	if (unlikely(io->fua) && io->op == BDEV_WRITE && res == 0 &&
	    !(io->b->caps & BDEV_CAP_FUA)) {
		io->op = BDEV_FLUSH;
		io->fua_flush = true;
		io->b->engine->submit(io->ctx, io);
		return;
	}
	if (unlikely(io->fua_flush)) {
		io->op = BDEV_WRITE;
		io->fua_flush = false;
	}
	/* A write-through write (RWF_DSYNC) syncs as a flush does, and
	 * takes the same error away from the next fdatasync. */
	if (unlikely(res < 0) && (io->op == BDEV_FLUSH || (io->op == BDEV_WRITE && io->fua)))
		bdev_flush_failed(io->b, res);
	io->cb(io, res);
}
