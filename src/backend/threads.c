/*
 * threads engine: a small pool per iothread doing plain preadv/pwritev2/
 * fdatasync/fallocate, for filesystems where async I/O blocks.  The
 * iothread hands a whole batch over under one lock acquisition (kick);
 * workers return completions on a list and wake the iothread through an
 * eventfd watched by its loop.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/bdev.h"
#include "backend/efd.h"
#include "util/sys.h"

#define THREADS_PER_CTX 4

struct bdev_ctx {
	struct bdev *b;
	pthread_t workers[THREADS_PER_CTX];
	unsigned nworkers;

	/* Iothread only (but workers write efd.fd). */
	struct bdev_io *batch_head, *batch_tail;	/* submitted, not yet kicked */
	struct bdev_efd efd;

	/* Shared with workers, under lock. */
	pthread_mutex_t lock;
	pthread_cond_t work;
	struct bdev_io *sq_head, *sq_tail;
	struct bdev_io *cq;
	bool stop;
};

static void *threads_worker(void *opaque)
{
	struct bdev_ctx *c = opaque;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		struct bdev_io *io;
		bool wake;

		while (!c->sq_head && !c->stop)
			pthread_cond_wait(&c->work, &c->lock);
		if (!c->sq_head)
			break;
		io = c->sq_head;
		c->sq_head = io->next;
		if (!c->sq_head)
			c->sq_tail = NULL;
		pthread_mutex_unlock(&c->lock);

		io->res = bdev_io_sync(c->b, io);

		pthread_mutex_lock(&c->lock);
		wake = !c->cq;		/* the iothread drains the whole list */
		io->next = c->cq;
		/* Atomic: the poll handler peeks at it without the lock. */
		__atomic_store_n(&c->cq, io, __ATOMIC_RELEASE);
		if (wake)
			(void)sys_eventfd_signal(c->efd.fd);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

static void threads_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	io->next = NULL;
	if (c->batch_tail)
		c->batch_tail->next = io;
	else
		c->batch_head = io;
	c->batch_tail = io;
	c->efd.inflight++;
}

static void threads_kick(struct bdev_ctx *c)
{
	if (!c->batch_head)
		return;
	pthread_mutex_lock(&c->lock);
	if (c->sq_tail)
		c->sq_tail->next = c->batch_head;
	else
		c->sq_head = c->batch_head;
	c->sq_tail = c->batch_tail;
	pthread_cond_broadcast(&c->work);
	pthread_mutex_unlock(&c->lock);
	c->batch_head = c->batch_tail = NULL;
}

static void threads_drain(struct bdev_ctx *c)
{
	threads_kick(c);
	bdev_efd_drain(&c->efd);
}

static unsigned threads_reap(struct bdev_ctx *c)
{
	struct bdev_io *io;
	unsigned n = 0;

	pthread_mutex_lock(&c->lock);
	io = c->cq;
	__atomic_store_n(&c->cq, NULL, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&c->lock);
	while (io) {
		struct bdev_io *next = io->next;

		c->efd.inflight--;
		bdev_complete(io, io->res);
		io = next;
		n++;
	}
	/* Completions may have resubmitted (fallbacks). */
	threads_kick(c);
	return n;
}

/* Completions are on the list before the eventfd is written, so a polling
 * loop finds them without waiting for it.  (Without that, a completion
 * arriving while the loop polls the kick rings would wait for the polling
 * window to end.) */
static bool threads_ready(struct bdev_ctx *c)
{
	return __atomic_load_n(&c->cq, __ATOMIC_RELAXED);
}

/* Completions are expected while I/O is in flight (loop.h: armed). */
static const struct bdev_efd_ops threads_efd_ops = {
	.ready = threads_ready,
	.reap = threads_reap,
	.armed = true,
};

static void threads_ctx_free(struct bdev_ctx *c);

static int threads_ctx_new(struct bdev *b, struct loop *l, unsigned depth,
			   struct bdev_ctx **out)
{
	struct bdev_ctx *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->b = b;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->work, NULL);
	r = bdev_efd_open(&c->efd, l, &threads_efd_ops, c);
	if (r < 0)
		goto err;
	for (; c->nworkers < THREADS_PER_CTX; c->nworkers++) {
		r = -pthread_create(&c->workers[c->nworkers], NULL, threads_worker, c);
		if (r < 0)
			goto err;
		pthread_setname_np(c->workers[c->nworkers], "vblk-worker");
	}
	*out = c;
	return 0;
err:
	threads_ctx_free(c);
	return r;
}

static void threads_ctx_free(struct bdev_ctx *c)
{
	if (!c)
		return;
	threads_drain(c);
	pthread_mutex_lock(&c->lock);
	c->stop = true;
	pthread_cond_broadcast(&c->work);
	pthread_mutex_unlock(&c->lock);
	for (unsigned i = 0; i < c->nworkers; i++)
		pthread_join(c->workers[i], NULL);
	bdev_efd_close(&c->efd);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->work);
	free(c);
}

const struct bdev_engine bdev_threads_engine = {
	.name = "threads",
	.caps = BDEV_CAP_DISCARD | BDEV_CAP_WRITE_ZEROES | BDEV_CAP_FUA,
	.ctx_new = threads_ctx_new,
	.ctx_free = threads_ctx_free,
	.submit = threads_submit,
	.kick = threads_kick,
	.drain = threads_drain,
};
