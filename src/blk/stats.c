/*
 * The counters' snapshot (blk_get_stats, blk_stats_snapshot) and the
 * polling knobs.  Main thread, handing off to each iothread.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "blk/blk_internal.h"
#include "util/compiler.h"

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
		o->iothread = c->t->idx;
		o->requests = atomic_load_explicit(&q->requests, memory_order_relaxed);
		o->kicks = atomic_load_explicit(&q->kicks, memory_order_relaxed);
		o->calls = atomic_load_explicit(&q->calls, memory_order_relaxed);
		o->calls_early = atomic_load_explicit(&q->calls_early, memory_order_relaxed);
		o->calls_suppressed = atomic_load_explicit(&q->calls_suppressed,
							   memory_order_relaxed);
		o->calls_held = atomic_load_explicit(&q->calls_held, memory_order_relaxed);
		o->calls_held_idle = atomic_load_explicit(&q->calls_held_idle,
							  memory_order_relaxed);
		o->calls_held_wasted = atomic_load_explicit(&q->calls_held_wasted,
							    memory_order_relaxed);
		o->completions_coalesced = atomic_load_explicit(&q->completions_coalesced,
								memory_order_relaxed);
		o->hold_ns_max = atomic_load_explicit(&q->hold_ns_max, memory_order_relaxed);
		o->hold_ns_total = atomic_load_explicit(&q->hold_ns_total, memory_order_relaxed);
		o->hold_late_ns_total = atomic_load_explicit(&q->hold_late_ns_total,
							     memory_order_relaxed);
		o->bad_requests = atomic_load_explicit(&q->bad_requests,
						       memory_order_relaxed);
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
