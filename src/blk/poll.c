/*
 * The poll handler of a queue's kick fd (loop.h "Poll handler"): while the
 * iothread's loop polls, it finds the queue's requests by reading the ring
 * instead of waiting for a kick; kicks stay off meanwhile, and back on,
 * barrier and re-check before it sleeps.  A queue that waits (paused, a
 * request held, over its QoS budget) is never polled for.
 *
 * Threads: the queue's iothread.
 */
#include <stdatomic.h>

#include "blk/blk_internal.h"

static bool blk_poll(void *opaque)
{
	struct blk_queue *q = opaque;

	return q->started && q->enabled && !q->vq.broken && !blk__queue_waits(q) &&
	       vq_avail_pending(&q->vq);
}

static void blk_poll_run(void *opaque)
{
	blk__queue_process(opaque);
}

static void blk_poll_begin(void *opaque)
{
	struct blk_queue *q = opaque;

	q->polling = true;
	if (q->started)
		vq_disable_notify(&q->vq);
}

static bool blk_poll_end(void *opaque)
{
	struct blk_queue *q = opaque;

	q->polling = false;
	/* Paused: kicks stay off, nothing to find (blk_queue_process). */
	if (!q->started || !q->enabled || q->vq.broken || blk__queue_waits(q))
		return false;
	/* Kicks on, full barrier, re-check: the race-free way to sleep. */
	return vq_enable_notify(&q->vq);
}

/* Waiting for the QoS budget's timer (throttle.c): no kick comes, no
 * request is taken, so no window is worth opening for this queue. */
static bool blk_poll_quiet(void *opaque)
{
	const struct blk_queue *q = opaque;

	return q->throttled != NULL;
}

/* The queue's work, for the pay check: requests taken from its ring. */
static uint64_t blk_poll_work(void *opaque)
{
	struct blk_queue *q = opaque;

	return atomic_load_explicit(&q->ctr.requests, memory_order_relaxed);
}

const struct loop_poll_ops blk__poll_ops = {
	.poll = blk_poll,
	.run = blk_poll_run,
	.begin = blk_poll_begin,
	.end = blk_poll_end,
	.quiet = blk_poll_quiet,
	.work = blk_poll_work,
};
