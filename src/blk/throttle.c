/*
 * QoS on the queues (docs/architecture.md "QoS"): a request the disk's
 * budget (qos.h) cannot take now waits on its queue, and the queue stops:
 * no further request is taken from its ring (FIFO per queue), no kick is
 * asked for, its kick handler opens no polling window (blk_poll_quiet), and
 * the iothread sleeps on one timer until the budget has room.  Then the
 * request goes, and the queue looks at its ring again the race-free way
 * (kicks on, barrier, re-check).  Across queues (and a group's processes)
 * the waiting requests go in the order they came (qos.c's tickets), so no
 * queue starves and a multi-queue guest gets one budget, not one per queue.
 *
 * Threads: everything here runs on the queue's iothread.
 */
#include <stdbool.h>

#include "blk/blk_internal.h"
#include "qos/qos.h"
#include "util/compiler.h"
#include "util/sys.h"

/* How long a throttled queue sleeps at least: sixteen I/Os' worth of the
 * budget, from 1 to 25 ms (a quarter of the tenth of a second a bucket
 * holds).  The budget then goes in batches (at 5,000 IOPS sixteen requests
 * per wake-up, not one; at 500, twelve): the rate is the same, since the
 * bucket keeps what leaked meanwhile, and a wake-up (and an interrupt)
 * is paid per batch, not per request.  A QD1 client gets the batch one
 * request after another, at once. */
#define BLK_QOS_SLICE_MIN_NS 1000000ull
#define BLK_QOS_SLICE_MAX_NS 25000000ull
#define BLK_QOS_SLICE_IOS 16
/* A queue wakes when qos.c says its turn comes, but never sooner than
 * this (a timer nearer than 100 us would be spun for). */
#define BLK_QOS_BEHIND_MIN_NS 150000ull

/* The slice for r: how long the queue sleeps at least at the head of
 * the line (qos_admit_turn). */
static uint64_t slice_of(struct blk_queue *q, const struct blk_req *r)
{
	uint64_t slice = BLK_QOS_SLICE_IOS * qos_io_ns(q->dev->qos, r->io.op != BDEV_READ, r->bytes);

	return slice < BLK_QOS_SLICE_MIN_NS ? BLK_QOS_SLICE_MIN_NS :
	       slice > BLK_QOS_SLICE_MAX_NS ? BLK_QOS_SLICE_MAX_NS : slice;
}

/* Sleep as qos.c says: on a timer, never spun for (the loop spins for
 * timers due within 100 us), counted from now, not from the loop's
 * wake-up. */
static void sleep_for(struct blk_queue *q, uint64_t w)
{
	loop_timer_mod(q->qos_timer, sys_now_ns() + MAX(w, BLK_QOS_BEHIND_MIN_NS));
}

static uint64_t admit(struct blk_queue *q, const struct blk_req *r, uint64_t now)
{
	return qos_admit_turn(q->dev->qos, r->io.op != BDEV_READ, r->bytes, now, &q->qos_turn,
			      slice_of(q, r));
}

/* The request goes to the disk, as blk_handle would have sent it. */
static void go(struct blk_queue *q, struct blk_req *r)
{
	if (r->io.op == BDEV_DISCARD || r->io.op == BDEV_WRITE_ZEROES)
		blk__dwz_next(r);
	else
		bdev_submit(q->dev->b, q->t->bctx, &r->io);
}

static void wait_end(struct blk_queue *q, uint64_t now)
{
	q->throttled_ns_done += now - q->throttled_since;
	q->throttled = NULL;
}

bool blk__throttle_slow(struct blk_queue *q, struct blk_req *r)
{
	uint64_t now = loop_now(q->t->loop);
	uint64_t w;

	if (unlikely(q->qos_bypass))
		return false;
	w = admit(q, r, now);
	if (likely(w == 0))
		return false;
	q->throttled = r;
	q->throttled_since = now;
	stat_inc(&q->ctr.throttled_requests);
	/* No kick until it has gone: the drain loop sees blk__queue_waits. */
	vq_disable_notify(&q->vq);
	sleep_for(q, w);
	return true;
}

void blk__throttle_timer_cb(void *opaque)
{
	struct blk_queue *q = opaque;
	struct blk_req *r = q->throttled;
	uint64_t now = sys_now_ns(), w;

	if (!r || !q->started)
		return;
	w = admit(q, r, now);
	if (w) {
		sleep_for(q, w);
		return;
	}
	wait_end(q, now);
	defer_begin();
	go(q, r);
	/* Take what the ring has now (up to the next request over budget),
	 * kicks back on before the queue sleeps. */
	blk__queue_process(q);
	q->qos_turn.credit = 0;		/* the turn ends with this pass */
	q->dev->b->engine->kick(q->t->bctx);
	defer_end();
}

void blk__throttle_at_stop(struct blk_queue *q)
{
	struct blk_req *r = q->throttled;

	if (!r)
		return;
	/* The ring stops (VM stop, migration, upgrade): the request goes
	 * now, over budget, so that the drain completes it; a request taken
	 * from the ring is never left behind. */
	loop_timer_del(q->qos_timer);
	qos_cancel(q->dev->qos, q->qos_turn.ticket);
	q->qos_turn.ticket = 0;
	q->qos_turn.credit = 0;
	wait_end(q, sys_now_ns());
	go(q, r);
	q->dev->b->engine->kick(q->t->bctx);
}
