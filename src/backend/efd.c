/* Completions announced on an eventfd: see efd.h. */
#include "backend/efd.h"

#include <unistd.h>

#include "util/sys.h"

static void efd_cb(void *opaque, uint32_t events)
{
	struct bdev_efd *e = opaque;

	(void)sys_eventfd_drain(e->fd);
	e->ops->reap(e->ctx);
}

static bool efd_poll(void *opaque)
{
	struct bdev_efd *e = opaque;

	return e->inflight && e->ops->ready(e->ctx);
}

static void efd_poll_run(void *opaque)
{
	struct bdev_efd *e = opaque;

	e->ops->reap(e->ctx);
}

static void efd_poll_begin(void *opaque)
{
	/* The eventfd is written whatever we do: a stale count costs one
	 * empty wake-up. */
}

static bool efd_poll_armed(void *opaque)
{
	struct bdev_efd *e = opaque;

	return e->inflight;
}

static bool efd_poll_cpu_bound(void *opaque)
{
	struct bdev_efd *e = opaque;

	return e->ops->cpu_bound(e->ctx);
}

int bdev_efd_open(struct bdev_efd *e, struct loop *l, const struct bdev_efd_ops *ops,
		  struct bdev_ctx *c)
{
	int r;

	e->ctx = c;
	e->ops = ops;
	e->loop = l;
	e->h = NULL;
	e->inflight = 0;
	e->pops = (struct loop_poll_ops){
		.poll = efd_poll,
		.run = efd_poll_run,
		.begin = efd_poll_begin,
		.end = efd_poll,
		.armed = ops->armed ? efd_poll_armed : NULL,
		.cpu_bound = ops->cpu_bound ? efd_poll_cpu_bound : NULL,
	};
	e->fd = sys_eventfd();
	if (e->fd < 0)
		return e->fd;
	r = loop_fd_add(l, e->fd, EPOLLIN, efd_cb, e, &e->h);
	if (r < 0) {
		close(e->fd);
		e->h = NULL;
		return r;
	}
	loop_fd_set_poll(e->h, &e->pops);
	return 0;
}

void bdev_efd_close(struct bdev_efd *e)
{
	if (!e->h)
		return;
	loop_fd_del(e->loop, e->h);
	e->h = NULL;
	close(e->fd);
}

void bdev_efd_drain(struct bdev_efd *e)
{
	while (e->inflight) {
		(void)sys_eventfd_wait(e->fd, 100);
		e->ops->reap(e->ctx);
	}
}
