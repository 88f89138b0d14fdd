/*
 * aio engine: Linux native AIO through libaio.  Reads and writes go
 * straight from the guest's iovecs; completions are signalled on an
 * eventfd (io_set_eventfd) watched by the iothread's loop.  Native AIO has
 * no discard or zeroing, so this engine does not offer them; FLUSH is
 * IOCB_CMD_FDSYNC where the filesystem has it, fdatasync otherwise.
 */
#include <errno.h>
#include <libaio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/bdev.h"
#include "backend/efd.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/log.h"

#define AIO_BATCH 256

struct bdev_ctx {
	struct bdev *b;
	io_context_t ctx;
	unsigned depth;
	struct bdev_efd efd;		/* inflight: in the kernel or queued here */
	struct iocb **pending;		/* prepared, not yet io_submit'ed */
	unsigned npending;
	struct iocb *iocbs;		/* one per slot */
	struct bdev_io **slot_io;
	unsigned *free_slots, nfree;
	/* More I/O than slots (several rings on one iothread can hold more
	 * than depth): it waits here, in order, for a slot. */
	struct bdev_io *wait_head, **wait_tail;
	bool kicking;
	bool no_fdsync;			/* the filesystem refused IOCB_CMD_FDSYNC */
};

static void aio_complete_slot(struct bdev_ctx *c, unsigned slot, int res);

static void aio_kick(struct bdev_ctx *c)
{
	/* Completing a refused iocb runs its callback, which may queue new
	 * ones (after these: each holds a slot, so pending never overflows)
	 * and kick: that kick returns, this one goes round again. */
	if (c->kicking)
		return;
	c->kicking = true;
	while (c->npending) {
		unsigned done = 0, n = c->npending;

		while (done < n) {
			int r = io_submit(c->ctx, (long)(n - done), c->pending + done);

			if (r == -EAGAIN || r == -EINTR)
				continue;
			if (r <= 0) {
				/* io_submit stops at the first iocb it refuses
				 * and says why only when that one is first: fail
				 * it alone (an IOCB_CMD_FDSYNC the file system
				 * lacks falls back in aio_complete_slot), then
				 * go on with the rest. */
				aio_complete_slot(c, (unsigned)(c->pending[done] - c->iocbs),
						  r < 0 ? r : -EIO);
				done++;
				continue;
			}
			done += (unsigned)r;
		}
		c->npending -= n;
		memmove(c->pending, c->pending + n, c->npending * sizeof(*c->pending));
	}
	c->kicking = false;
}

static void aio_drain(struct bdev_ctx *c)
{
	aio_kick(c);
	bdev_efd_drain(&c->efd);
}

static void aio_start(struct bdev_ctx *c, struct bdev_io *io);

static void aio_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	if (unlikely(!c->nfree || c->wait_head)) {
		io->next = NULL;
		*c->wait_tail = io;
		c->wait_tail = &io->next;
		c->efd.inflight++;
		return;
	}
	c->efd.inflight++;
	aio_start(c, io);
}

/* Slots freed: start what waits for them. */
static void aio_start_waiting(struct bdev_ctx *c)
{
	while (c->wait_head && c->nfree) {
		struct bdev_io *io = c->wait_head;

		c->wait_head = io->next;
		if (!c->wait_head)
			c->wait_tail = &c->wait_head;
		aio_start(c, io);
	}
}

/* io counted in inflight, a slot free. */
static void aio_start(struct bdev_ctx *c, struct bdev_io *io)
{
	struct iocb *cb;
	unsigned slot;

	slot = c->free_slots[--c->nfree];
	cb = &c->iocbs[slot];
	c->slot_io[slot] = io;
	switch (io->op) {
	case BDEV_READ:
		io_prep_preadv(cb, c->b->fd, io->iov, (int)io->iovcnt, (long long)io->offset);
		break;
	case BDEV_WRITE:
		io_prep_pwritev2(cb, c->b->fd, io->iov, (int)io->iovcnt,
				 (long long)io->offset, io->fua ? RWF_DSYNC : 0);
		break;
	case BDEV_FLUSH:
		if (c->no_fdsync) {
			aio_complete_slot(c, slot, fdatasync(c->b->fd) < 0 ? -errno : 0);
			return;
		}
		io_prep_fdsync(cb, c->b->fd);
		break;
	default:
		aio_complete_slot(c, slot, -EOPNOTSUPP);
		return;
	}
	io_set_eventfd(cb, c->efd.fd);
	c->pending[c->npending++] = cb;
	if (c->npending == AIO_BATCH)
		aio_kick(c);
}

static void aio_complete_slot(struct bdev_ctx *c, unsigned slot, int res)
{
	struct bdev_io *io = c->slot_io[slot];

	c->slot_io[slot] = NULL;
	c->free_slots[c->nfree++] = slot;
	c->efd.inflight--;
	if (io->op == BDEV_FLUSH && res == -EINVAL && !c->no_fdsync) {
		log_info("aio: the filesystem has no async fdatasync; flushing "
			 "synchronously");
		c->no_fdsync = true;
		res = fdatasync(c->b->fd) < 0 ? -errno : 0;
	}
	if ((io->op == BDEV_READ || io->op == BDEV_WRITE) && res >= 0) {
		if ((size_t)res < io->len) {
			/* Short transfer: finish the rest synchronously (rare:
			 * end of a file, signals). */
			res = bdev_io_consume(io, (size_t)res);
			if (res == 0)
				res = bdev_io_sync(c->b, io);
		} else {
			res = 0;
		}
	}
	bdev_complete(io, res);
}

static unsigned aio_reap(struct bdev_ctx *c)
{
	struct io_event ev[64];
	struct timespec zero = { 0, 0 };
	unsigned total = 0;
	int n;

	do {
		n = io_getevents(c->ctx, 0, 64, ev, &zero);
		for (int i = 0; i < n; i++)
			aio_complete_slot(c, (unsigned)(ev[i].obj - c->iocbs), (int)(long)ev[i].res);
		total += n > 0 ? (unsigned)n : 0;
	} while (n == 64);
	/* A refused iocb frees its slot in the kick: start waiters on it. */
	do {
		aio_start_waiting(c);
		aio_kick(c);
	} while (c->wait_head && c->nfree);
	return total;
}

/*
 * Are completions waiting?  The kernel keeps them in a ring mapped into
 * our address space at the io_context_t (the kernel's struct aio_ring,
 * fs/aio.c; the same peek QEMU's linux-aio does): head != tail means
 * events wait, and the loop can take them without waiting for the
 * eventfd.
 */
struct aio_ring {
	unsigned id, nr, head, tail, magic, compat_features, incompat_features;
	unsigned header_length;
};
#define AIO_RING_MAGIC 0xa10a10a1

static bool aio_ready(struct bdev_ctx *c)
{
	const struct aio_ring *r = (const struct aio_ring *)c->ctx;

	if (r->magic != AIO_RING_MAGIC)
		return false;
	return __atomic_load_n(&r->head, __ATOMIC_RELAXED) !=
	       __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
}

/* Completions are expected while I/O is in flight (loop.h: armed). */
static const struct bdev_efd_ops aio_efd_ops = {
	.ready = aio_ready,
	.reap = aio_reap,
	.armed = true,
};

static void aio_ctx_free(struct bdev_ctx *c)
{
	if (!c)
		return;
	aio_drain(c);
	bdev_efd_close(&c->efd);
	if (c->ctx)
		io_destroy(c->ctx);
	free(c->pending);
	free(c->iocbs);
	free(c->slot_io);
	free(c->free_slots);
	free(c);
}

static int aio_ctx_new(struct bdev *b, struct loop *l, unsigned depth,
		       struct bdev_ctx **out)
{
	struct bdev_ctx *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->b = b;
	c->depth = depth;
	c->wait_tail = &c->wait_head;
	c->pending = calloc(depth, sizeof(*c->pending));
	c->iocbs = calloc(depth, sizeof(*c->iocbs));
	c->slot_io = calloc(depth, sizeof(*c->slot_io));
	c->free_slots = calloc(depth, sizeof(*c->free_slots));
	if (!c->pending || !c->iocbs || !c->slot_io || !c->free_slots) {
		r = -ENOMEM;
		goto err;
	}
	for (unsigned i = 0; i < depth; i++)
		c->free_slots[c->nfree++] = depth - 1 - i;
	r = io_setup((int)depth, &c->ctx);
	if (r < 0) {
		c->ctx = 0;
		goto err;
	}
	r = bdev_efd_open(&c->efd, l, &aio_efd_ops, c);
	if (r < 0)
		goto err;
	*out = c;
	return 0;
err:
	aio_ctx_free(c);
	return r;
}

const struct bdev_engine bdev_aio_engine = {
	.name = "aio",
	.caps = BDEV_CAP_FUA,
	.ctx_new = aio_ctx_new,
	.ctx_free = aio_ctx_free,
	.submit = aio_submit,
	.kick = aio_kick,
	.drain = aio_drain,
};
