/*
 * The counters' snapshot (blk_stats_snapshot) and their descriptor table,
 * both generated from blk/counters.h; the polling knobs.  Main thread,
 * handing off to each iothread.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blk/blk_internal.h"
#include "format/format.h"
#include "util/compiler.h"
#include "util/sys.h"

#define BLK_COUNTER_SIGNED_u64 false
#define BLK_COUNTER_SIGNED_s64 true
#define BLK_COUNTER_SIGNED_hist false
#define ROW(set, name, type, src, kind, unit, metric, help)				\
	{ #name, metric, help, BLK_COUNTER_##kind, BLK_COUNTER_##unit,			\
	  BLK_COUNTER_SIGNED_##type, offsetof(struct set, name) },
#define DISK_ROW(...) ROW(blk_disk_stats, __VA_ARGS__)
#define OP_ROW(...) ROW(blk_op_stats, __VA_ARGS__)
#define PAUSE_ROW(...) ROW(blk_pause_stats, __VA_ARGS__)
#define QUEUE_ROW(...) ROW(blk_queue_stats, __VA_ARGS__)
#define IOTHREAD_ROW(...) ROW(blk_iothread_stats, __VA_ARGS__)

static const struct blk_counter disk_rows[] = { BLK_DISK_COUNTERS(DISK_ROW) };
static const struct blk_counter op_rows[] = { BLK_OP_COUNTERS(OP_ROW) };
static const struct blk_counter pause_rows[] = { BLK_PAUSE_COUNTERS(PAUSE_ROW) };
static const struct blk_counter queue_rows[] = { BLK_QUEUE_COUNTERS(QUEUE_ROW) };
static const struct blk_counter iothread_rows[] = { BLK_IOTHREAD_COUNTERS(IOTHREAD_ROW) };

static const char *op_name(unsigned i)
{
	return acct_op_name((enum acct_op)i);
}

static const char *pause_name(unsigned i)
{
	return disk_pause_reason_name((enum disk_pause_reason)i);
}

const struct blk_counter_set blk_counter_sets[BLK_COUNTER_SETS] = {
	[BLK_COUNTERS_OP] = { "disk", "op", "ops", BLK_COUNTERS_DISK, op_name, op_rows,
			      ARRAY_SIZE(op_rows), sizeof(struct blk_op_stats), "virtio-blk", -1 },
	[BLK_COUNTERS_NBD_OP] = { "disk", "op", "nbd_ops", BLK_COUNTERS_DISK, op_name, op_rows,
				  ARRAY_SIZE(op_rows), sizeof(struct blk_op_stats), "nbd",
				  BLK_COUNTERS_OP },
	[BLK_COUNTERS_DISK] = { "disk", NULL, "disk", -1, NULL, disk_rows, ARRAY_SIZE(disk_rows),
				sizeof(struct blk_disk_stats), NULL, -1 },
	[BLK_COUNTERS_PAUSE] = { "disk", "reason", "pauses", BLK_COUNTERS_DISK, pause_name,
				 pause_rows, ARRAY_SIZE(pause_rows), sizeof(struct blk_pause_stats),
				 NULL, -1 },
	[BLK_COUNTERS_QUEUE] = { "queue", "queue", "queues", -1, NULL, queue_rows,
				 ARRAY_SIZE(queue_rows), sizeof(struct blk_queue_stats), NULL, -1 },
	[BLK_COUNTERS_IOTHREAD] = { "iothread", "iothread", "iothreads", -1, NULL, iothread_rows,
				    ARRAY_SIZE(iothread_rows), sizeof(struct blk_iothread_stats),
				    NULL, -1 },
};

/* Every member a row, every row 8 bytes (a hist row ACCT_BUCKETS times
 * 8): the renderers read them so. */
#define BLK_COUNTER_SIZE_u64 8
#define BLK_COUNTER_SIZE_s64 8
#define BLK_COUNTER_SIZE_hist (8 * ACCT_BUCKETS)
#define ROW_SIZE(name, type, ...) + BLK_COUNTER_SIZE_##type
STATIC_ASSERT(sizeof(struct blk_disk_stats) == 0 BLK_DISK_COUNTERS(ROW_SIZE),
	      "struct blk_disk_stats has a member that is not a row of BLK_DISK_COUNTERS");
STATIC_ASSERT(sizeof(struct blk_pause_stats) == 0 BLK_PAUSE_COUNTERS(ROW_SIZE),
	      "struct blk_pause_stats has a member that is not a row of BLK_PAUSE_COUNTERS");
STATIC_ASSERT(sizeof(struct blk_op_stats) == 0 BLK_OP_COUNTERS(ROW_SIZE),
	      "struct blk_op_stats has a member that is not a row of BLK_OP_COUNTERS");
STATIC_ASSERT(sizeof(struct blk_queue_stats) == 0 BLK_QUEUE_COUNTERS(ROW_SIZE),
	      "struct blk_queue_stats has a member that is not a row of BLK_QUEUE_COUNTERS");
STATIC_ASSERT(sizeof(struct blk_iothread_stats) == 0 BLK_IOTHREAD_COUNTERS(ROW_SIZE),
	      "struct blk_iothread_stats has a member that is not a row of BLK_IOTHREAD_COUNTERS");

#define COPY_KEPT(name, type, src, ...)							\
	BLK__IF_KEPT_##src(o->name = atomic_load_explicit(&q->ctr.name, memory_order_relaxed);)

struct stats_call {
	struct blk_iothread *t;
	struct blk_queue_stats *qs;
	struct blk_iothread_stats *ts;	/* the iothread's */
	struct blk_disk_stats *disk;	/* added to */
	struct acct *acct;		/* added to */
};

/* On the iothread: kick handlers come and go with ring restarts, so their
 * poll counters are read where they live; the accounting is plain fields
 * of the iothread's. */
static void do_stats(void *opaque)
{
	struct stats_call *c = opaque;
	struct blk_dev *d = c->t->dev;
	struct loop_poll_stats cs;

	/* Loop time, as the busy periods are stamped: a period that ends
	 * later in this iteration cannot end before what is read now. */
	c->disk->busy_ns += acct_busy_ns(&c->t->busy, loop_now(c->t->loop));
	c->ts->backend_submits = bdev_ctx_submits(d->b, c->t->bctx);
	c->ts->backend_polled = bdev_ctx_polled(d->b, c->t->bctx);
	c->ts->backend_sync = bdev_ctx_sync_ios(d->b, c->t->bctx);
	{
		struct bdev_spin_stats ss;

		bdev_ctx_spin_stats(d->b, c->t->bctx, &ss);
		c->ts->device_spin_checks = ss.checks;
		c->ts->device_spin_off = ss.off;
	}
	loop_completion_poll_stats(c->t->loop, &cs);
	c->ts->completion_poll_hits = cs.hits;
	c->ts->completion_poll_misses = cs.misses;
	if (c->t->idx == 0) {
		/* A format's disk is served by one iothread, the first. */
		struct fmt_stats fs;

		fmt_stats(d->b, &fs);
		c->disk->image_cache_bytes = fs.cache_bytes;
		c->disk->image_cache_hits = fs.cache_hits;
		c->disk->image_cache_misses = fs.cache_misses;
		c->disk->image_clusters_allocated = fs.clusters_allocated;
		c->disk->image_cow_bytes = fs.cow_bytes;
		c->disk->image_cor_bytes = fs.cor_bytes;
		c->disk->image_streaming = fs.streaming;
		c->disk->image_stream_pos = fs.stream_pos;
		c->disk->image_clusters_reused = fs.clusters_reused;
		c->disk->image_bitmap_regions = fs.bitmap_regions;
		c->disk->image_corrupt = fs.corrupt;
	}
	for (unsigned i = 0; i < d->num_queues; i++) {
		struct blk_queue *q = &d->q[i];
		struct blk_queue_stats *o = &c->qs[i];
		struct loop_poll_stats ps = { 0 };

		if (q->t != c->t)
			continue;
		if (q->kick_h)
			loop_fd_poll_stats(q->kick_h, &ps);
		BLK_QUEUE_COUNTERS(COPY_KEPT)
		acct_add(c->acct, &q->acct);
		c->disk->in_flight += q->inflight;
		o->iothread = c->t->idx;
		o->poll_hits = q->poll_base.hits + ps.hits;
		o->poll_misses = q->poll_base.misses + ps.misses;
		o->poll_vain = q->poll_base.vain + ps.vain;
		o->poll_ns = ps.poll_ns;
		o->throttled_ns = q->throttled_ns_done +
				  (q->throttled ? loop_now(c->t->loop) - q->throttled_since : 0);
		c->disk->throttled_requests += o->throttled_requests;
		c->disk->throttled_ns += o->throttled_ns;
	}
}

/* The operations' counters from the queues' sum. */
static void ops_from(struct blk_op_stats *ops, const struct acct *a)
{
	for (unsigned i = 0; i < ACCT_NR_OPS; i++) {
		const struct acct_op_stats *o = &a->op[i];

		ops[i].requests = o->requests;
		ops[i].bytes = o->bytes;
		ops[i].errors = o->errors;
		ops[i].total_ns = o->total_ns;
		memcpy(ops[i].latency, o->hist, sizeof(ops[i].latency));
	}
}

static void get_stats(struct blk_dev *d, struct blk_stats *s)
{
	struct blk_iothread_stats *ts = s->iothreads;
	struct acct sum = { 0 };

	s->disk.iothreads = d->num_iothreads;
	for (unsigned i = 0; i < d->num_iothreads; i++) {
		struct stats_call c = { &d->iot[i], s->queues, &ts[i], &s->disk, &sum };
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
	ops_from(s->ops, &sum);
	{
		struct acct nbd = { 0 };

		disk_front_acct(d->disk, "nbd", &nbd);
		ops_from(s->nbd_ops, &nbd);
	}
	{
		struct disk_pause_state ps;

		disk_pause_state(d->disk, &ps);
		s->disk.paused = ps.paused;
		s->disk.held_requests = ps.held;
		for (unsigned i = 0; i < DISK_PAUSE_NR; i++)
			s->pauses[i].count = ps.pauses[i];
	}
	{
		struct qos_limits l;

		qos_get(d->qos, &l, NULL, sys_now_ns());
		s->disk.limit_iops_total = l.b[QOS_IOPS_TOTAL].avg;
		s->disk.limit_iops_read = l.b[QOS_IOPS_READ].avg;
		s->disk.limit_iops_write = l.b[QOS_IOPS_WRITE].avg;
		s->disk.limit_bps_total = l.b[QOS_BPS_TOTAL].avg;
		s->disk.limit_bps_read = l.b[QOS_BPS_READ].avg;
		s->disk.limit_bps_write = l.b[QOS_BPS_WRITE].avg;
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
	get_stats(d, s);
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
