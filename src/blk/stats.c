/*
 * The counters' snapshot (blk_get_stats, blk_stats_snapshot) and their
 * descriptor table, both generated from blk/counters.h; the polling knobs.
 * Main thread, handing off to each iothread.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "blk/blk_internal.h"
#include "util/compiler.h"

#define BLK_COUNTER_SIGNED_u64 false
#define BLK_COUNTER_SIGNED_s64 true
#define ROW(set, name, type, src, kind, unit, metric, help)				\
	{ #name, metric, help, BLK_COUNTER_##kind, BLK_COUNTER_##unit,			\
	  BLK_COUNTER_SIGNED_##type, offsetof(struct set, name) },
#define QUEUE_ROW(...) ROW(blk_queue_stats, __VA_ARGS__)
#define IOTHREAD_ROW(...) ROW(blk_iothread_stats, __VA_ARGS__)

static const struct blk_counter queue_rows[] = { BLK_QUEUE_COUNTERS(QUEUE_ROW) };
static const struct blk_counter iothread_rows[] = { BLK_IOTHREAD_COUNTERS(IOTHREAD_ROW) };

const struct blk_counter_set blk_counter_sets[BLK_COUNTER_SETS] = {
	[BLK_COUNTERS_QUEUE] = { "queue", "queues", queue_rows, ARRAY_SIZE(queue_rows),
				 sizeof(struct blk_queue_stats) },
	[BLK_COUNTERS_IOTHREAD] = { "iothread", "iothreads", iothread_rows,
				    ARRAY_SIZE(iothread_rows), sizeof(struct blk_iothread_stats) },
};

/* Every member a row, every row 8 bytes: the renderers read them so. */
STATIC_ASSERT(sizeof(struct blk_queue_stats) == ARRAY_SIZE(queue_rows) * 8,
	      "struct blk_queue_stats has a member that is not a row of BLK_QUEUE_COUNTERS");
STATIC_ASSERT(sizeof(struct blk_iothread_stats) == ARRAY_SIZE(iothread_rows) * 8,
	      "struct blk_iothread_stats has a member that is not a row of BLK_IOTHREAD_COUNTERS");

#define COPY_KEPT(name, type, src, ...)							\
	BLK__IF_KEPT_##src(o->name = atomic_load_explicit(&q->ctr.name, memory_order_relaxed);)

struct stats_call {
	struct blk_iothread *t;
	struct blk_queue_stats *qs;
	struct blk_iothread_stats *ts;	/* the iothread's */
};

/* On the iothread: kick handlers come and go with ring restarts, so their
 * poll counters are read where they live. */
static void do_stats(void *opaque)
{
	struct stats_call *c = opaque;
	struct blk_dev *d = c->t->dev;
	struct loop_poll_stats cs;

	c->ts->backend_submits = bdev_ctx_submits(d->b, c->t->bctx);
	c->ts->backend_polled = bdev_ctx_polled(d->b, c->t->bctx);
	loop_completion_poll_stats(c->t->loop, &cs);
	c->ts->completion_poll_hits = cs.hits;
	c->ts->completion_poll_misses = cs.misses;
	for (unsigned i = 0; i < d->num_queues; i++) {
		struct blk_queue *q = &d->q[i];
		struct blk_queue_stats *o = &c->qs[i];
		struct loop_poll_stats ps = { 0 };

		if (q->t != c->t)
			continue;
		if (q->kick_h)
			loop_fd_poll_stats(q->kick_h, &ps);
		BLK_QUEUE_COUNTERS(COPY_KEPT)
		o->iothread = c->t->idx;
		o->poll_hits = q->poll_base.hits + ps.hits;
		o->poll_misses = q->poll_base.misses + ps.misses;
		o->poll_vain = q->poll_base.vain + ps.vain;
		o->poll_ns = ps.poll_ns;
	}
}

void blk_get_stats(struct blk_dev *d, struct blk_queue_stats *qs,
		   struct blk_iothread_stats *ts)
{
	for (unsigned i = 0; i < d->num_iothreads; i++) {
		struct stats_call c = { &d->iot[i], qs, &ts[i] };
		struct loop_stats ls;

		loop_call_sync(d->iot[i].loop, do_stats, &c);
		loop_get_stats(d->iot[i].loop, &ls);
		ts[i].busy_ns = ls.busy_ns;
		ts[i].cpu_ns = ls.cpu_ns;
		ts[i].poll_ns_total = ls.poll_ns_total;
		ts[i].contended = ls.contended;
		ts[i].completion_windows = ls.completion_windows;
		ts[i].poll_yields = ls.yields;
		ts[i].poll_checks = ls.pay_checks;
		ts[i].poll_checks_off = ls.pay_checks_off;
		ts[i].poll_checks_aborted = ls.pay_aborted;
		ts[i].poll_check_off = ls.pay_off;
		ts[i].cpu = d->iot[i].cpu;
	}
}

int blk_stats_snapshot(struct blk_dev *d, struct blk_stats *s)
{
	*s = (struct blk_stats){ .num_queues = d->num_queues,
				 .num_iothreads = d->num_iothreads };
	s->queues = calloc(s->num_queues, sizeof(*s->queues));
	s->iothreads = calloc(s->num_iothreads, sizeof(*s->iothreads));
	if (!s->queues || !s->iothreads) {
		blk_stats_release(s);
		return -ENOMEM;
	}
	blk_get_stats(d, s->queues, s->iothreads);
	blk_get_poll_params(d, &s->poll);
	return 0;
}

void blk_stats_release(struct blk_stats *s)
{
	free(s->queues);
	free(s->iothreads);
	s->queues = NULL;
	s->iothreads = NULL;
}

unsigned blk_dev_num_queues(const struct blk_dev *d)
{
	return d->num_queues;
}

unsigned blk_dev_num_iothreads(const struct blk_dev *d)
{
	return d->num_iothreads;
}

void blk_set_poll_params(struct blk_dev *d, const struct loop_poll_params *p)
{
	for (unsigned i = 0; i < d->num_iothreads; i++)
		loop_set_poll_params(d->iot[i].loop, p);
}

void blk_get_poll_params(struct blk_dev *d, struct loop_poll_params *p)
{
	loop_get_poll_params(d->iot[0].loop, p);
}
