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
#include "disk/disk.h"
#include "util/compiler.h"
#include "util/sys.h"

/* A queue wakes when qos.c says its turn comes, but never sooner than
 * this (a timer nearer than 100 us would be spun for). */
#define BLK_QOS_BEHIND_MIN_NS 150000ull

/* Sleep as qos.c says: on a timer, never spun for (the loop spins for
 * timers due within 100 us), counted from now, not from the loop's
 * wake-up. */
static void sleep_for(struct blk_queue *q, uint64_t w)
{
	loop_timer_mod(q->qos_timer, sys_now_ns() + MAX(w, BLK_QOS_BEHIND_MIN_NS));
}

static uint64_t admit(struct blk_queue *q, const struct blk_req *r, uint64_t now)
{
	return disk_admit(q->dev->disk, &q->qos_turn, r->io.op != BDEV_READ, r->bytes, now);
}

/* The request goes to the disk, as blk_handle would have sent it. */
static void go(struct blk_queue *q, struct blk_req *r)
{
	if (r->io.op == BDEV_DISCARD || r->io.op == BDEV_WRITE_ZEROES)
		blk__dwz_next(r);
	else if (blk__remark(q, r))
		disk_submit(q->dev->disk, q->t->dt, &r->io);
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
	disk_admit_cancel(q->dev->disk, &q->qos_turn);
	wait_end(q, sys_now_ns());
	go(q, r);
	q->dev->b->engine->kick(q->t->bctx);
}
