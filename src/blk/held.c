/*
 * The virtio-blk front's part of the error policy (disk.h, disk/pause.c):
 * a failed request the policy stops on is held on its queue, in order,
 * and the queue takes no new request (blk__queue_waits) while it holds
 * any or the disk is paused; at resume each queue submits what it holds
 * again on its iothread, then looks at its ring.  A ring that stops with
 * requests held leaves them in its in-flight region or fails them.
 *
 * Threads: the held list is its queue's iothread's; the resume is the
 * main thread's, handing each iothread its part (loop_call_sync).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "blk/blk_internal.h"
#include "disk/disk.h"
#include "util/compiler.h"
#include "util/log.h"

bool blk__error_stops(const struct blk_dev *d, enum bdev_op op, int err)
{
	return disk_error_stops(d->disk, op, err);
}

/* Iothread: r failed with err and the policy stops on it.  Keep it, in
 * order, and pause the disk if it is not paused yet. */
void blk__hold_request(struct blk_queue *q, struct blk_req *r, int err)
{
	char what[96];

	r->held_next = NULL;
	*q->held_tail = r;
	q->held_tail = &r->held_next;
	q->nheld++;
	snprintf(what, sizeof(what), "%s at offset %" PRIu64 ", queue %u",
		 disk_op_name(r->io.op), r->io.op == BDEV_FLUSH ? 0 : r->io.offset, q->idx);
	disk_hold(q->dev->disk, err, what);
}

/* Iothread: submit the queue's held requests again, in the order they
 * were held, then look at the ring.  A request that fails again is held
 * again (and pauses again). */
struct resume_call {
	struct blk_queue *q;
	unsigned n;
};

static void do_resume(void *opaque)
{
	struct resume_call *c = opaque;
	struct blk_queue *q = c->q;
	struct blk_req *r = q->held_head;

	q->held_head = NULL;
	q->held_tail = &q->held_head;
	disk_unhold(q->dev->disk, q->nheld);
	q->nheld = 0;
	while (r) {
		struct blk_req *next = r->held_next;

		c->n++;
		blk__resubmit(q, r);
		r = next;
	}
	q->dev->b->engine->kick(q->t->bctx);
	blk__queue_process(q);
}

/* disk_front.resume: every queue, on its iothread.  Main thread. */
static unsigned front_resume(void *opaque)
{
	struct blk_dev *d = opaque;
	unsigned n = 0;

	for (unsigned i = 0; i < d->num_queues; i++) {
		struct resume_call c = { .q = &d->q[i] };

		loop_call_sync(d->q[i].t->loop, do_resume, &c);
		n += c.n;
	}
	return n;
}

/* disk_front.rebind: the disk's image replaced, every iothread parked
 * (no loop_call_sync here): the device's copies taken again. */
static void front_rebind(void *opaque)
{
	struct blk_dev *d = opaque;

	d->b = d->disk->b;
	for (unsigned i = 0; i < d->num_iothreads; i++)
		d->iot[i].bctx = d->iot[i].dt->bctx;
}

void blk__held_at_stop(struct blk_queue *q)
{
	struct blk_req *r = q->held_head;
	/* A migration's destination starts from the base we report, with
	 * an in-flight region of its own: what stays in ours would never be
	 * completed.  Dirty logging on is a migration under way. */
	bool keep = q->vq.inflight && !q->vq.log.log;
	unsigned n = q->nheld;

	q->held_head = NULL;
	q->held_tail = &q->held_head;
	q->nheld = 0;
	disk_unhold(q->dev->disk, n);
	while (r) {
		struct blk_req *next = r->held_next;

		if (keep) {
			/* In flight in the region, not in our hands: the slot
			 * goes back to the pool, the ring entry stays taken. */
			blk__req_drop(r);
		} else {
			blk__req_complete(r, VIRTIO_BLK_S_IOERR);
		}
		r = next;
	}
	if (keep)
		log_info("queue %u: %u held request%s left in flight in the in-flight region: "
			 "submitted again when the ring starts and the disk is resumed",
			 q->idx, n, n == 1 ? "" : "s");
	else
		log_err("queue %u: %u held request%s failed with an I/O error as the ring "
			"stopped (%s)", q->idx, n, n == 1 ? "" : "s",
			q->vq.inflight ? "a migration: its destination could not submit "
			"them again" : "no in-flight region to leave them in");
}

void blk__held_init(struct blk_dev *d)
{
	d->front = (struct disk_front){ .name = "virtio-blk", .resume = front_resume,
				      .rebind = front_rebind, .opaque = d };
	disk_front_add(d->disk, &d->front);
}

void blk__held_free(struct blk_dev *d)
{
	disk_front_del(d->disk, &d->front);
}
