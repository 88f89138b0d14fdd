#include "blk/blk.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blk/blk_internal.h"
#include "blk/irq.h"
#include "blk/virtio_blk.h"
#include "format/format.h"
#include "loop/defer.h"
#include "loop/loop.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/sys.h"


/* Requests taken from one queue per pass before yielding to others. */
#define BLK_BUDGET 256
/* Passes of the drain / re-enable / re-check loop before yielding. */
#define BLK_MAX_PASSES 8

/* ---- Completion and notification (iothread) ---- */

/* Publish the batch and decide on one interrupt for it (virtio 1.2, 2.7.7
 * "Used Buffer Notification Suppression"). */
static bool blk_queue_signal(struct blk_queue *q)
{
	vq_flush(&q->vq);
	if (unlikely(q->vq.log_kick))
		vq_log_kick(&q->vq);
	if (!vq_should_notify(&q->vq)) {
		stat_inc(&q->ctr.calls_suppressed);
		return false;
	}
	if (q->call_fd < 0)
		return false;
	stat_inc(&q->ctr.calls);
	if (unlikely(sys_eventfd_signal_shared(q->call_fd) == -EINTR)) {
		/* Made blocking and filled by the frontend, and interrupted
		 * (loop.h): no more interrupts through it. */
		q->call_fd = -1;
		vq_set_broken(&q->vq, "the frontend made its call eventfd block (cleared "
			      "O_NONBLOCK, filled the counter)");
	}
	return true;
}

static void blk_notify_bh(void *opaque)
{
	struct blk_queue *q = opaque;

	if (q->started)
		blk_queue_signal(q);
}

/*
 * Deferred to the end of the batch (the defer section): at most one
 * call-eventfd write per queue for everything completed since the last
 * decision (an early call, see blk_req_complete, ends a batch too).  With
 * EVENT_IDX the driver says exactly when it wants an interrupt, so we
 * decide now and never add latency.  Without it every batch would
 * interrupt: publish now, but decide in a bottom half after one more
 * non-blocking look at the fds, so completions that are already there
 * share the interrupt.
 */
static void blk_unhold(struct blk_queue *q, uint64_t now);

static void blk_queue_notify(void *opaque)
{
	struct blk_queue *q = opaque;

	q->early_sent = false;
	if (!q->started)
		return;
	if (q->irq.held) {
		uint64_t now = sys_now_ns();

		switch (blk_irq_section_end(&q->irq, now, q->inflight)) {
		case BLK_IRQ_SEND:
			blk_unhold(q, now);
			break;
		case BLK_IRQ_WENT_IDLE:
			stat_inc(&q->ctr.calls_held_idle);
			break;
		case BLK_IRQ_KEEP:
			break;
		}
		return;
	}
	if (!q->event_idx && defer_batching()) {
		vq_flush(&q->vq);
		loop_bh_schedule(q->notify_bh);
		return;
	}
	blk_queue_signal(q);
}

/*
 * Interrupt moderation (blk/irq.h; docs/architecture.md "Interrupts"):
 * the driver asked for an interrupt at this completion (it sleeps waiting
 * for it); hold the call if the policy says so, with the timer set for
 * the hold's deadline.  Returns true if the call is now held (or already
 * was).
 */
static bool blk_hold(struct blk_queue *q)
{
	struct blk_irq_hold h;
	bool idle;

	if (q->irq.held)
		return true;
	/* A queue waiting for its QoS budget has nothing coming soon to
	 * share the call with: it goes now. */
	if (!q->irq.max_ns || q->throttled ||
	    !blk_irq_want(&q->irq, loop_now(q->t->loop), q->inflight, loop_can_spin, q->t->loop,
			  &h))
		return false;
	idle = blk_irq_hold(&q->irq, &h, sys_now_ns(),
			    atomic_load_explicit(&q->ctr.requests, memory_order_relaxed),
			    q->inflight);
	loop_timer_mod(q->hold_timer, q->irq.held_until);
	stat_inc(&q->ctr.calls_held);
	if (idle)
		stat_inc(&q->ctr.calls_held_idle);
	return true;
}

/* The held call goes out now (its timer fired, nothing else is in flight,
 * or the ring stops). */
static void blk_unhold(struct blk_queue *q, uint64_t now)
{
	struct blk_irq_ended e;

	loop_timer_del(q->hold_timer);
	blk_irq_end(&q->irq, now, loop_now(q->t->loop),
		    atomic_load_explicit(&q->ctr.requests, memory_order_relaxed), &e);
	if (e.wasted)
		stat_inc(&q->ctr.calls_held_wasted);
	stat_add(&q->ctr.completions_coalesced, e.joined);
	if (e.held_ns > atomic_load_explicit(&q->ctr.hold_ns_max, memory_order_relaxed))
		atomic_store_explicit(&q->ctr.hold_ns_max, e.held_ns, memory_order_relaxed);
	stat_add(&q->ctr.hold_ns_total, e.held_ns);
	stat_add(&q->ctr.hold_late_ns_total, e.late_ns);
	if (q->started)
		blk_queue_signal(q);
}

static void blk_hold_timer_cb(void *opaque)
{
	struct blk_queue *q = opaque;

	/* A timer runs outside a defer section: the call is made here. */
	blk_unhold(q, sys_now_ns());
}

static void blk_req_put(struct blk_queue *q, struct blk_req *r)
{
	q->free_reqs[q->nfree++] = (uint16_t)(r - q->reqs);
}

/* Dirty logging is on (migration): every byte this request may have
 * stored in guest memory, after the stores (vq.h vq_log_write). */
static __cold void blk_req_log(struct blk_queue *q, struct blk_req *r)
{
	/* The status byte and the data (stored by the backend, which
	 * completed before we got here) visible before the bit tests. */
	smp_mb();
	for (unsigned i = 0; i < r->in_n; i++)
		vq_log_write(&q->vq, r->iov[r->in_off + i].iov_base,
			     r->iov[r->in_off + i].iov_len);
	vq_log_write(&q->vq, r->status, 1);
}

/* A request with an operation completes: its counters, the iothread's
 * busy time.  Loop time, not a clock read per request. */
static inline void blk_req_acct(struct blk_queue *q, struct blk_req *r, uint8_t status)
{
	uint64_t now;

	if (unlikely(!r->acct))
		return;
	now = loop_now(q->t->loop);
	acct_op_done(r->acct, status == VIRTIO_BLK_S_OK, r->bytes, now - r->t0);
	acct_busy_end(&q->t->busy, now);
}

static void blk_req_complete(struct blk_req *r, uint8_t status)
{
	struct blk_queue *q = r->q;

	/* The status byte is guest memory validated at pop time. */
	*r->status = status;
	if (unlikely(q->vq.log.log))
		blk_req_log(q, r);
	vq_push(&q->vq, r->head, status == VIRTIO_BLK_S_OK ? r->used_len : 1);
	q->inflight--;
	q->irq.done++;
	blk_req_acct(q, r, status);
	blk_req_put(q, r);
	if (q->dev->early_notify && defer_batching()) {
		/*
		 * Early notification (see docs/architecture.md).  Publish each
		 * completion at once: a store, no interrupt, and a driver that
		 * is awake (draining, or re-checking before it sleeps) takes
		 * it without waiting for the rest of the batch.  If the driver
		 * is asleep waiting for exactly this entry (EVENT_IDX: its
		 * used_event falls here), waking it must not wait for the rest
		 * of the batch either: notify now, which ends this batch; what
		 * completes after it is the next batch and shares one call at
		 * the end.  So with EVENT_IDX no completion waits for a later
		 * one, and the driver is woken while we still work instead of
		 * after.
		 */
		vq_flush(&q->vq);
		if (q->irq.max_ns)
			blk_irq_note_completion(&q->irq, loop_now(q->t->loop), q->inflight);
		if (!q->early_sent && vq_notify_wanted(&q->vq) && !blk_hold(q)) {
			q->early_sent = true;
			if (blk_queue_signal(q))
				stat_inc(&q->ctr.calls_early);
		}
	}
	defer_call(blk_queue_notify, q);
}

void blk__req_complete(struct blk_req *r, uint8_t status)
{
	blk_req_complete(r, status);
}

void blk__req_drop(struct blk_req *r)
{
	struct blk_queue *q = r->q;

	/* Not completed, not counted as done: out of the busy time and of
	 * what is in flight here. */
	if (r->acct)
		acct_busy_end(&q->t->busy, loop_now(q->t->loop));
	q->inflight--;
	blk_req_put(q, r);
}

static void blk_io_done(struct bdev_io *io, int res)
{
	struct blk_req *r = container_of(io, struct blk_req, io);

	if (unlikely(res < 0)) {
		/* The error policy may keep it (pause.c), but not a flush
		 * that says acknowledged writes may be lost: the guest's
		 * fsync must fail, not succeed on a retry. */
		if (!io->lost && blk__error_stops(r->q->dev, io->op, -res)) {
			blk__hold_request(r->q, r, -res);
			return;
		}
		log_debug("queue %u: I/O error on request %u: %s", r->q->idx,
			  r->head, strerror(-res));
	}
	blk_req_complete(r, res < 0 ? VIRTIO_BLK_S_IOERR : VIRTIO_BLK_S_OK);
}

/* ---- Request parsing (iothread) ---- */

/* A request of bytes is taken, to count in s (&q->acct.op[its
 * operation]) from here: blk_req_acct when it completes. */
static inline void blk_req_start(struct blk_queue *q, struct blk_req *r,
				 struct acct_op_stats *s, uint64_t bytes)
{
	r->acct = s;
	r->bytes = bytes;
	acct_busy_start(&q->t->busy, r->t0);
}

static void blk_dwz_next(struct blk_req *r);

static void blk_dwz_done(struct bdev_io *io, int res)
{
	struct blk_req *r = container_of(io, struct blk_req, io);

	if (res < 0) {
		if (blk__error_stops(r->q->dev, io->op, -res)) {
			/* blk__resubmit runs this segment again. */
			blk__hold_request(r->q, r, -res);
			return;
		}
		log_debug("queue %u: discard/write-zeroes error on request %u: %s",
			  r->q->idx, r->head, strerror(-res));
		blk_req_complete(r, VIRTIO_BLK_S_IOERR);
		return;
	}
	blk_dwz_next(r);
}

/* A write sent later than it was taken (parked by QoS, held by the
 * error policy) is marked again as it goes: a backup that started and
 * finished meanwhile cleared its bitmap and kept only the marks made
 * since its instant (backup/bkp.h), and this write reaches the disk
 * after that instant.  A discard or write zeroes is marked segment by
 * segment as it goes (blk_dwz_next).  False: it was failed (the marks
 * could not be written ahead). */
bool blk__remark(struct blk_queue *q, struct blk_req *r)
{
	if (r->io.op != BDEV_WRITE ||
	    likely(disk_dirty(q->dev->disk, r->io.offset, r->bytes) == 0))
		return true;
	r->io.cb(&r->io, -EIO);
	return false;
}

void blk__resubmit(struct blk_queue *q, struct blk_req *r)
{
	if (r->io.op == BDEV_DISCARD || r->io.op == BDEV_WRITE_ZEROES) {
		r->seg--;		/* the segment that failed */
		blk_dwz_next(r);
		return;
	}
	/* bdev_complete left io as it was submitted (offset, iovecs, op). */
	if (blk__remark(q, r))
		disk_submit(q->dev->disk, q->t->dt, &r->io);
}

static void blk_dwz_next(struct blk_req *r)
{
	const struct virtio_blk_discard_write_zeroes *g;

	/* Zero-length segments are valid and do nothing. */
	while (r->seg < r->nsegs && r->segs[r->seg].num_sectors == 0)
		r->seg++;
	if (r->seg == r->nsegs) {
		blk_req_complete(r, VIRTIO_BLK_S_OK);
		return;
	}
	g = &r->segs[r->seg++];
	r->io.offset = g->sector << VIRTIO_BLK_SECTOR_SHIFT;
	r->io.length = (uint64_t)g->num_sectors << VIRTIO_BLK_SECTOR_SHIFT;
	r->io.unmap = g->flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;
	r->io.iov = NULL;
	r->io.iovcnt = 0;
	r->io.fua = false;
	r->io.cb = blk_dwz_done;
	/* Its bitmaps could not be written ahead: the segment fails. */
	if (unlikely(disk_dirty(r->q->dev->disk, r->io.offset, r->io.length) < 0)) {
		r->io.cb(&r->io, -EIO);
		return;
	}
	disk_submit(r->q->dev->disk, r->q->t->dt, &r->io);
}

/*
 * DISCARD and WRITE_ZEROES (virtio 1.2, 5.2.6.2): every segment is checked
 * before any of them runs.  Unknown flags, or unmap on a discard: UNSUPP.
 * A payload that is not whole segments, too many segments, a segment past
 * the end of the disk, over the advertised size or not block-aligned:
 * IOERR.
 */
static void blk_handle_dwz(struct blk_queue *q, struct blk_req *r, uint32_t type,
			   struct iovec *out, unsigned out_num)
{
	struct blk_dev *d = q->dev;
	uint64_t len = iov_size(out, out_num);
	uint64_t cap = READ_ONCE(d->b->size) >> VIRTIO_BLK_SECTOR_SHIFT;	/* grows: bdev_resize */
	uint32_t align = d->b->block_size >> VIRTIO_BLK_SECTOR_SHIFT;
	bool discard = type == VIRTIO_BLK_T_DISCARD;
	unsigned cap_bit = discard ? BDEV_CAP_DISCARD : BDEV_CAP_WRITE_ZEROES;
	uint64_t bytes = 0;

	blk_req_start(q, r, &q->acct.op[discard ? ACCT_DISCARD : ACCT_WRITE_ZEROES], 0);
	if (!(d->b->caps & cap_bit)) {
		blk_req_complete(r, VIRTIO_BLK_S_UNSUPP);
		return;
	}
	if (d->b->read_only) {
		blk_req_complete(r, VIRTIO_BLK_S_IOERR);
		return;
	}
	if (len == 0 || len % sizeof(r->segs[0]) || len > sizeof(r->segs)) {
		stat_inc(&q->ctr.bad_requests);
		blk_req_complete(r, VIRTIO_BLK_S_IOERR);
		return;
	}
	r->nsegs = (unsigned)(len / sizeof(r->segs[0]));
	r->seg = 0;
	/* One copy out of guest memory; only the copy is used after this. */
	iov_to_buf(out, out_num, 0, r->segs, len);
	for (unsigned i = 0; i < r->nsegs; i++) {
		const struct virtio_blk_discard_write_zeroes *g = &r->segs[i];

		if ((g->flags & ~VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP) ||
		    (discard && (g->flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP))) {
			blk_req_complete(r, VIRTIO_BLK_S_UNSUPP);
			return;
		}
		if (g->sector > cap || g->num_sectors > cap - g->sector ||
		    g->num_sectors > BLK_MAX_DWZ_SECTORS ||
		    (g->sector | g->num_sectors) % align) {
			stat_inc(&q->ctr.bad_requests);
			blk_req_complete(r, VIRTIO_BLK_S_IOERR);
			return;
		}
		bytes += (uint64_t)g->num_sectors << VIRTIO_BLK_SECTOR_SHIFT;
	}
	r->bytes = bytes;
	r->io.op = discard ? BDEV_DISCARD : BDEV_WRITE_ZEROES;
	/* Counted as a write of its bytes (qos.h, as QEMU's throttle filter). */
	if (blk__throttle(q, r))
		return;
	blk_dwz_next(r);
}

void blk__dwz_next(struct blk_req *r)
{
	blk_dwz_next(r);
}

/* virtio 1.2, 5.2.6.2 "Device Requirements: Device Operation": a request
 * is [header][data][status]; header device-readable, status the last
 * device-writable byte. */
static void blk_handle(struct blk_queue *q, struct blk_req *r, struct vq_elem *e)
{
	struct blk_dev *d = q->dev;
	struct virtio_blk_outhdr hdr;
	struct iovec *out = e->iov, *in = e->iov + e->out_num;
	unsigned out_num = e->out_num, in_num = e->in_num;
	struct iovec *last = &in[in_num - 1];
	uint64_t sector, len;
	uint32_t type;

	r->head = e->head;
	r->status = (uint8_t *)last->iov_base + last->iov_len - 1;
	iov_discard_back(in, &in_num, 1);
	r->in_off = out_num;
	r->in_n = in_num;
	r->used_len = 1;
	r->t0 = loop_now(q->t->loop);	/* taken off the ring (loop time) */
	if (++q->inflight > 1)
		blk_irq_note_overlap(&q->irq, r->t0);
	stat_inc(&q->ctr.requests);

	if (iov_to_buf(out, out_num, 0, &hdr, sizeof(hdr)) < sizeof(hdr)) {
		r->acct = NULL;
		stat_inc(&q->ctr.bad_requests);
		blk_req_complete(r, VIRTIO_BLK_S_IOERR);
		return;
	}
	iov_discard_front(&out, &out_num, sizeof(hdr));
	type = hdr.type;
	sector = hdr.sector;

	switch (type) {
	case VIRTIO_BLK_T_IN:
	case VIRTIO_BLK_T_OUT: {
		bool is_write = type == VIRTIO_BLK_T_OUT;
		struct iovec *data = is_write ? out : in;
		unsigned cnt = is_write ? out_num : in_num;
		uint64_t off, size = READ_ONCE(d->b->size);	/* grows: bdev_resize */

		len = iov_size(data, cnt);
		/* Two addresses to choose from, not an index to scale. */
		blk_req_start(q, r, is_write ? &q->acct.op[ACCT_WRITE] : &q->acct.op[ACCT_READ],
			      len);
		if (is_write && d->b->read_only) {
			blk_req_complete(r, VIRTIO_BLK_S_IOERR);
			return;
		}
		/* Whole blocks, inside the disk: sector is in 512-byte units
		 * whatever the block size (5.2.6). */
		if (sector > (size >> VIRTIO_BLK_SECTOR_SHIFT)) {
			stat_inc(&q->ctr.bad_requests);
			blk_req_complete(r, VIRTIO_BLK_S_IOERR);
			return;
		}
		off = sector << VIRTIO_BLK_SECTOR_SHIFT;
		if ((off | len) % d->b->block_size || len > size - off) {
			stat_inc(&q->ctr.bad_requests);
			blk_req_complete(r, VIRTIO_BLK_S_IOERR);
			return;
		}
		if (len == 0) {
			blk_req_complete(r, VIRTIO_BLK_S_OK);
			return;
		}
		if (!is_write)
			r->used_len = (uint32_t)len + 1;
		r->io.op = is_write ? BDEV_WRITE : BDEV_READ;
		r->io.fua = is_write && !atomic_load_explicit(&d->writeback,
							      memory_order_relaxed);
		r->io.offset = off;
		r->io.iov = data;
		r->io.iovcnt = cnt;
		r->io.cb = blk_io_done;
		if (is_write && unlikely(disk_dirty(d->disk, off, len) < 0)) {
			r->io.cb(&r->io, -EIO);
			return;
		}
		if (unlikely(blk__throttle(q, r)))
			return;		/* throttle.c sends it when the budget has room */
		disk_submit(d->disk, q->t->dt, &r->io);
		return;
	}
	case VIRTIO_BLK_T_FLUSH:
		blk_req_start(q, r, &q->acct.op[ACCT_FLUSH], 0);
		if (d->b->read_only) {
			blk_req_complete(r, VIRTIO_BLK_S_OK);
			return;
		}
		r->io.op = BDEV_FLUSH;
		r->io.iov = NULL;
		r->io.iovcnt = 0;
		r->io.offset = 0;
		r->io.fua = false;
		r->io.cb = blk_io_done;
		bdev_submit(d->b, q->t->bctx, &r->io);
		return;
	case VIRTIO_BLK_T_GET_ID: {
		size_t n;

		blk_req_start(q, r, &q->acct.op[ACCT_GET_ID], 0);
		n = iov_from_buf(in, in_num, 0, d->serial,
				 MIN(sizeof(d->serial), iov_size(in, in_num)));
		r->used_len = (uint32_t)n + 1;
		blk_req_complete(r, VIRTIO_BLK_S_OK);
		return;
	}
	case VIRTIO_BLK_T_DISCARD:
	case VIRTIO_BLK_T_WRITE_ZEROES:
		blk_handle_dwz(q, r, type, out, out_num);
		return;
	default:
		r->acct = NULL;
		blk_req_complete(r, VIRTIO_BLK_S_UNSUPP);
		return;
	}
}

/*
 * Take up to budget requests.  Returns the number taken, or -1 if the
 * queue cannot go on (empty handled by returning < budget).
 */
static int blk_queue_drain_avail(struct blk_queue *q, unsigned budget)
{
	unsigned n = 0;

	while (n < budget) {
		struct vq_elem e;
		struct blk_req *r;
		int ret;

		if (unlikely(q->nfree == 0)) {
			/* A driver cannot have more than num requests out;
			 * one that does is not following 2.7.13. */
			vq_set_broken(&q->vq, "more requests in flight than the ring size");
			return -1;
		}
		r = &q->reqs[q->free_reqs[q->nfree - 1]];
		e.iov = r->iov;
		ret = vq_pop(&q->vq, &e);
		if (ret == 0)
			break;
		if (ret == -EIO)
			return -1;
		q->nfree--;
		n++;
		if (ret == -EINVAL || e.in_num == 0) {
			/* Bad chain, or no room for a status byte: fail it
			 * where we can say so, else hand it back empty. */
			uint8_t *status = NULL;

			if (ret == -EINVAL)
				status = e.last_byte;
			else
				log_once(q->logged_no_status, LOG_WARN,
					 "queue %u: request without a writable status "
					 "byte (not logged again)", q->idx);
			stat_inc(&q->ctr.bad_requests);
			if (status) {
				*status = VIRTIO_BLK_S_IOERR;
				if (unlikely(q->vq.log.log)) {
					smp_mb();	/* as in blk_req_log */
					vq_log_write(&q->vq, status, 1);
				}
			}
			vq_push(&q->vq, e.head, status ? 1 : 0);
			blk_req_put(q, r);
			defer_call(blk_queue_notify, q);
			continue;
		}
		blk_handle(q, r, &e);
		/* Over the QoS budget: it waits, and so does the rest of
		 * the ring (FIFO), until throttle.c's timer. */
		if (unlikely(q->throttled))
			break;
	}
	return (int)n;
}

/*
 * The race-free drain loop: kicks off while we work, back on before we
 * stop, and re-check, since the driver may have added requests after our
 * last look but before it saw kicks enabled.
 */
static void blk_queue_process(struct blk_queue *q)
{
	unsigned total = 0, passes = 0;

	if (!q->started || !q->enabled || q->vq.broken)
		return;
	if (unlikely(blk__queue_waits(q))) {
		/* Paused: no kick needed until resumed (disk_resume looks
		 * at the ring again), so none is asked for. */
		vq_disable_notify(&q->vq);
		return;
	}
	if (q->polling) {
		/* The loop polls this queue: kicks stay off until it stops
		 * polling (blk_poll_end re-enables and re-checks). */
		if (blk_queue_drain_avail(q, BLK_BUDGET) == BLK_BUDGET)
			loop_bh_schedule(q->resume_bh);
		q->dev->b->engine->kick(q->t->bctx);
		goto out;
	}
	for (;;) {
		int n;

		vq_disable_notify(&q->vq);
		n = blk_queue_drain_avail(q, BLK_BUDGET);
		/* One io_uring_enter for everything this pass queued. */
		q->dev->b->engine->kick(q->t->bctx);
		if (n < 0)
			break;
		/* A request waits for the QoS budget: kicks stay off, the
		 * timer comes back (throttle.c). */
		if (unlikely(q->throttled))
			break;
		total += (unsigned)n;
		if (total >= BLK_BUDGET && n == BLK_BUDGET) {
			/* Let other queues and completions run; keep kicks
			 * off, we come back at the end of this iteration. */
			loop_bh_schedule(q->resume_bh);
			return;
		}
		if (n == BLK_BUDGET)
			continue;
		if (!vq_enable_notify(&q->vq))
			break;
		/* Work raced in; go again, but a driver that keeps the ring
		 * "busy" without giving us requests must not hold the thread:
		 * after a few passes yield and come back in a bottom half. */
		if (++passes >= BLK_MAX_PASSES) {
			loop_bh_schedule(q->resume_bh);
			return;
		}
	}
out:
	if (q->vq.broken && q->err_fd >= 0 &&
	    sys_eventfd_signal_shared(q->err_fd) == -EINTR)
		q->err_fd = -1;		/* as the call fd above */
}

void blk__queue_process(struct blk_queue *q)
{
	blk_queue_process(q);
}

static void blk_resume_bh(void *opaque)
{
	blk_queue_process(opaque);
}

static void blk_kick_cb(void *opaque, uint32_t events)
{
	struct blk_queue *q = opaque;
	int64_t n = sys_eventfd_drain(q->kick_fd);

	/* The eventfd counter is the number of kicks since the last read. */
	if (n > 0)
		stat_add(&q->ctr.kicks, (uint64_t)n);
	blk_queue_process(q);
}

/* ---- Ring lifecycle, run on the iothread via loop_call_sync ---- */

struct blk_call {
	struct blk_queue *q;
	const struct vu_queue_setup *setup;
	const struct vq_log *log;
	int ret;
	uint32_t base;			/* queue_stop: vq_base */
	int call_fd, err_fd;
	bool enabled;
};

static void blk_queue_free_pool(struct blk_queue *q)
{
	free(q->reqs);
	free(q->iovs);
	free(q->free_reqs);
	q->reqs = NULL;
	q->iovs = NULL;
	q->free_reqs = NULL;
}

static void do_queue_start(void *opaque)
{
	struct blk_call *c = opaque;
	struct blk_queue *q = c->q;
	const struct vu_queue_setup *s = c->setup;
	unsigned num = s->cfg.num;
	int r;

	r = vq_init(&q->vq, &s->cfg, s->mem);
	if (r < 0) {
		vq_release(&q->vq);
		goto out;
	}
	r = -ENOMEM;
	q->reqs = calloc(num, sizeof(*q->reqs));
	/* Not zeroed: a request's iovecs are written (vq_pop) before they
	 * are read, and zeroing num * VQ_MAX_SEGS of them (4 MiB for a ring
	 * of 1024) at every ring start is page faults for nothing. */
	q->iovs = malloc((size_t)num * VQ_MAX_SEGS * sizeof(*q->iovs));
	q->free_reqs = calloc(num, sizeof(*q->free_reqs));
	if (!q->reqs || !q->iovs || !q->free_reqs)
		goto err_pool;
	for (unsigned i = 0; i < num; i++) {
		q->reqs[i].q = q;
		q->reqs[i].iov = q->iovs + (size_t)i * VQ_MAX_SEGS;
		q->free_reqs[i] = (uint16_t)(num - 1 - i);
	}
	q->nfree = num;
	q->inflight = 0;
	q->kick_fd = s->kick_fd;
	q->call_fd = s->call_fd;
	q->err_fd = s->err_fd;
	q->enabled = s->enabled;
	q->event_idx = s->cfg.event_idx;
	q->polling = false;
	q->qos_bypass = false;
	blk_irq_start(&q->irq, loop_now(q->t->loop));
	r = loop_fd_add(q->t->loop, q->kick_fd, EPOLLIN, blk_kick_cb, q, &q->kick_h);
	if (r < 0)
		goto err_pool;
	q->started = true;
	atomic_store(&q->dev->disk->rings_started, true);
	loop_fd_set_poll(q->kick_h, &blk__poll_ops);
	/* The driver may have queued requests before we watched the kick
	 * fd (e.g. after a restart): look at the ring once. */
	blk_queue_process(q);
	c->ret = 0;
	return;

err_pool:
	blk_queue_free_pool(q);
	vq_release(&q->vq);
out:
	c->ret = r;
}

static void do_queue_stop(void *opaque)
{
	struct blk_call *c = opaque;
	struct blk_queue *q = c->q;

	c->base = vq_base(&q->vq);
	if (!q->started)
		return;
	{
		struct loop_poll_stats ps;

		loop_fd_poll_stats(q->kick_h, &ps);
		q->poll_base.hits += ps.hits;
		q->poll_base.misses += ps.misses;
		q->poll_base.vain += ps.vain;
	}
	loop_fd_del(q->t->loop, q->kick_h);
	q->kick_h = NULL;
	/* From here the ring stops: nothing waits for the QoS budget (a
	 * parked request goes now, and so does every request the drain of
	 * stranded resubmissions below takes), or it would never run. */
	q->qos_bypass = true;
	if (unlikely(q->throttled))
		blk__throttle_at_stop(q);
	/* Requests a previous backend left in flight that no pass took yet
	 * (the ring stops before it was enabled, or before its resume bottom
	 * half ran): the base reported counts them as taken, so they run now,
	 * or nobody would ever complete them (a migration's destination
	 * starts at that base, without the region).  The disk is claimed
	 * while a ring is started (vu.c). */
	if (unlikely(vq_resubmit_left(&q->vq)) && !q->vq.broken) {
		log_info("queue %u: running the %u requests a previous backend left in "
			 "flight before stopping", q->idx, vq_resubmit_left(&q->vq));
		(void)blk_queue_drain_avail(q, vq_resubmit_left(&q->vq));
		q->dev->b->engine->kick(q->t->bctx);
	}
	/* In-flight requests complete into the ring before we report where
	 * it stopped: the frontend may hand the ring to someone else (a
	 * write-blocking mirror's writes reach its target first). */
	disk_drain(q->dev->disk, q->t->dt);
	/* What the error policy holds (the drain may have added to it). */
	if (unlikely(q->nheld))
		blk__held_at_stop(q);
	if (q->irq.held)
		blk_unhold(q, sys_now_ns());
	blk_queue_signal(q);
	q->started = false;
	q->polling = false;
	q->kick_fd = q->call_fd = q->err_fd = -1;
	if (unlikely(q->inflight)) {
		/* Only a backend that failed to drain gets here.  Their
		 * requests and iovecs stay allocated (leaked): a late
		 * completion must not land in freed memory. */
		log_err("queue %u: %u requests still in flight after drain; their "
			"memory is kept", q->idx, q->inflight);
		q->reqs = NULL;
		q->iovs = NULL;
	}
	blk_queue_free_pool(q);
	vq_release(&q->vq);
	/* A stopped ring needs no reset (blk_needs_reset); a restart
	 * validates it afresh. */
	WRITE_ONCE(q->vq.broken, false);
	c->base = vq_base(&q->vq);
}

static void do_queue_set_fds(void *opaque)
{
	struct blk_call *c = opaque;

	c->q->call_fd = c->call_fd;
	c->q->err_fd = c->err_fd;
}

static void do_queue_set_log(void *opaque)
{
	struct blk_call *c = opaque;

	if (c->q->started)
		vq_set_log(&c->q->vq, c->log);
}

static void do_queue_set_enable(void *opaque)
{
	struct blk_call *c = opaque;

	c->q->enabled = c->enabled;
	if (c->enabled)
		blk_queue_process(c->q);
}

/* ---- vu_dev_ops (main thread) ---- */

static unsigned blk_num_queues(void *opaque)
{
	return ((struct blk_dev *)opaque)->num_queues;
}

static int blk_queue_start(void *opaque, unsigned idx, const struct vu_queue_setup *s)
{
	struct blk_dev *d = opaque;
	struct blk_call c = { .q = &d->q[idx], .setup = s };

	loop_call_sync(d->q[idx].t->loop, do_queue_start, &c);
	return c.ret;
}

static uint32_t blk_queue_stop(void *opaque, unsigned idx)
{
	struct blk_dev *d = opaque;
	struct blk_call c = { .q = &d->q[idx] };

	loop_call_sync(d->q[idx].t->loop, do_queue_stop, &c);
	return c.base;
}

/* A migration's switch-over (vu.h): a mirror's target gets every write
 * the guest saw complete before the frontend hears the base (the
 * destination starts its rings after). */
static void blk_switchover(void *opaque)
{
	struct blk_dev *d = opaque;

	(void)disk_switchover(d->disk);
}

static void blk_queue_set_fds(void *opaque, unsigned idx, int call_fd, int err_fd)
{
	struct blk_dev *d = opaque;
	struct blk_call c = { .q = &d->q[idx], .call_fd = call_fd, .err_fd = err_fd };

	loop_call_sync(d->q[idx].t->loop, do_queue_set_fds, &c);
}

static void blk_queue_set_enable(void *opaque, unsigned idx, bool enabled)
{
	struct blk_dev *d = opaque;
	struct blk_call c = { .q = &d->q[idx], .enabled = enabled };

	loop_call_sync(d->q[idx].t->loop, do_queue_set_enable, &c);
}

static void blk_queue_set_log(void *opaque, unsigned idx, const struct vq_log *lg)
{
	struct blk_dev *d = opaque;
	struct blk_call c = { .q = &d->q[idx], .log = lg };

	loop_call_sync(d->q[idx].t->loop, do_queue_set_log, &c);
}

static int blk_claim(void *opaque)
{
	char err[256];
	/* A ring starting: the frontend came back to a vblkd restarted at
	 * once, and a predecessor killed a moment ago may still hold the
	 * lock (bdev_lock). */
	int r = disk_claim(((struct blk_dev *)opaque)->disk, BDEV_LOCK_WAIT_MS, err,
			   sizeof(err));

	/* bdev_lock has said who holds the lock. */
	if (r < 0 && r != -EBUSY)
		log_err("%s", err);
	return r;
}

static void blk_release(void *opaque)
{
	disk_release(((struct blk_dev *)opaque)->disk);
}

/* A running ring is broken: the device status says NEEDS_RESET (the
 * ring's err fd was signalled when it broke). */
static bool blk_needs_reset(void *opaque)
{
	struct blk_dev *d = opaque;

	for (unsigned i = 0; i < d->num_queues; i++)
		if (vq_is_broken(&d->q[i].vq))
			return true;
	return false;
}

const struct vu_dev_ops blk_vu_ops = {
	.features = blk__features,
	.num_queues = blk_num_queues,
	.get_config = blk__get_config,
	.set_config = blk__set_config,
	.set_features = blk__set_features,
	.queue_start = blk_queue_start,
	.queue_stop = blk_queue_stop,
	.queue_set_fds = blk_queue_set_fds,
	.queue_set_enable = blk_queue_set_enable,
	.queue_set_log = blk_queue_set_log,
	.claim = blk_claim,
	.release = blk_release,
	.switchover = blk_switchover,
	.needs_reset = blk_needs_reset,
	.save_state = blk__save_state,
	.load_state = blk__load_state,
	.handover_quiesce = blk__handover_quiesce,
	.handover_reload = blk__handover_reload,
};

/* ---- Device lifecycle (main thread) ---- */

/* Each queue's bottom halves and timers, on its iothread's loop (the
 * disk's, running already). */
static void queue_timers_free(struct blk_queue *q)
{
	loop_bh_free(q->resume_bh);
	loop_bh_free(q->notify_bh);
	loop_timer_free(q->hold_timer);
	loop_timer_free(q->qos_timer);
	q->resume_bh = q->notify_bh = NULL;
	q->hold_timer = q->qos_timer = NULL;
}

struct iot_call {
	struct blk_iothread *t;
	int ret;
};

static void do_iothread_attach(void *opaque)
{
	struct iot_call *c = opaque;
	struct blk_iothread *t = c->t;
	struct blk_dev *d = t->dev;
	int r = 0;

	for (unsigned qi = 0; qi < d->num_queues && r == 0; qi++) {
		struct blk_queue *q = &d->q[qi];

		if (q->t != t)
			continue;
		r = loop_bh_new(t->loop, blk_resume_bh, q, &q->resume_bh);
		if (r == 0)
			r = loop_bh_new(t->loop, blk_notify_bh, q, &q->notify_bh);
		if (r == 0)
			r = loop_timer_new(t->loop, blk_hold_timer_cb, q, &q->hold_timer);
		if (r == 0)
			r = loop_timer_new(t->loop, blk__throttle_timer_cb, q, &q->qos_timer);
	}
	c->ret = r;
}

static void do_iothread_detach(void *opaque)
{
	struct iot_call *c = opaque;
	struct blk_dev *d = c->t->dev;

	for (unsigned i = 0; i < d->num_queues; i++)
		if (d->q[i].t == c->t)
			queue_timers_free(&d->q[i]);
}

/* Let go of iothreads [0, n): their queues are stopped already. */
static void blk_iothreads_detach(struct blk_dev *d, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		struct iot_call c = { &d->iot[i], 0 };

		loop_call_sync(d->iot[i].loop, do_iothread_detach, &c);
	}
}

/* The device's part of the disk's iothread i. */
static int blk_iothread_attach(struct blk_dev *d, unsigned i)
{
	struct blk_iothread *t = &d->iot[i];
	struct disk_iothread *dt = &d->disk->iot[i];
	struct iot_call c = { t, 0 };

	t->dev = d;
	t->idx = i;
	t->cpu = dt->cpu;
	t->loop = dt->loop;
	t->bctx = dt->bctx;
	t->dt = dt;
	loop_call_sync(t->loop, do_iothread_attach, &c);
	if (c.ret < 0)
		loop_call_sync(t->loop, do_iothread_detach, &c);
	return c.ret;
}

int blk_dev_new_on(struct disk *disk, const struct blk_opts *o, struct blk_dev **out)
{
	unsigned nt = disk->num_iothreads;
	struct blk_dev *d;
	unsigned i;
	int r;

	if (o->num_queues < 1 || o->num_queues > BLK_MAX_QUEUES || nt > BLK_MAX_QUEUES)
		return -EINVAL;
	d = calloc(1, sizeof(*d) + o->num_queues * sizeof(d->q[0]));
	if (!d)
		return -ENOMEM;
	/* The disk's budget, read inline per request. */
	d->qos = disk->qos;
	d->qos_on = disk->qos_on;
	/* Aligned: each iothread's busy time on a line of its own. */
	d->iot = aligned_alloc(BLK_CACHELINE, nt * sizeof(*d->iot));
	if (!d->iot) {
		free(d);
		return -ENOMEM;
	}
	memset(d->iot, 0, nt * sizeof(*d->iot));
	d->disk = disk;
	d->b = disk->b;
	d->num_queues = o->num_queues;
	d->num_iothreads = nt;
	d->no_event_idx = o->no_event_idx;
	d->no_packed = o->no_packed;
	d->early_notify = !o->no_early_notify;
	d->wce = 1;
	/* Serial: up to 20 bytes, not NUL-terminated when full (5.2.6). */
	strncpy(d->serial, o->serial ? o->serial : "", sizeof(d->serial));
	for (i = 0; i < d->num_queues; i++) {
		struct blk_queue *q = &d->q[i];
		unsigned ti = o->queue_map ? o->queue_map[i] : i % nt;

		if (ti >= nt) {
			r = -EINVAL;
			goto err_free;
		}
		q->dev = d;
		q->idx = i;
		q->t = &d->iot[ti];
		q->kick_fd = q->call_fd = q->err_fd = -1;
		q->irq.max_ns = o->irq_moderation_max_ns;
		q->held_tail = &q->held_head;
	}
	blk__held_init(d);
	for (i = 0; i < nt; i++) {
		r = blk_iothread_attach(d, i);
		if (r < 0) {
			blk_iothreads_detach(d, i);
			goto err_pause;
		}
	}
	*out = d;
	return 0;

err_pause:
	blk__held_free(d);
err_free:
	free(d->iot);
	free(d);
	return r;
}

int blk_dev_new(struct bdev *b, const struct blk_opts *o, struct blk_dev **out)
{
	struct disk_opts dopt = { .num_iothreads = o->num_iothreads, .cpus = o->cpus,
				  .ncpus = o->ncpus, .poll = o->poll,
				  .no_threads = o->no_threads, .qos = o->qos };
	struct disk *disk;
	int r;

	r = disk_new(b, &dopt, &disk);		/* owns o->qos from here */
	if (r < 0)
		return r;
	r = blk_dev_new_on(disk, o, out);
	if (r < 0) {
		disk_free(disk);
		return r;
	}
	(*out)->own_disk = true;
	return 0;
}

struct qos *blk_dev_qos(struct blk_dev *d)
{
	return d->qos;
}

struct disk *blk_dev_disk(struct blk_dev *d)
{
	return d->disk;
}

void blk_dev_free(struct blk_dev *d)
{
	if (!d)
		return;
	for (unsigned i = 0; i < d->num_queues; i++)
		blk_queue_stop(d, i);
	blk_iothreads_detach(d, d->num_iothreads);
	blk__held_free(d);
	if (d->own_disk)
		disk_free(d->disk);
	free(d->iot);
	free(d);
}
/* ---- For fuzzing and tests only ---- */

static void do_fuzz_process(void *opaque)
{
	struct blk_call *c = opaque;

	do_queue_start(c);
	if (c->ret < 0)
		return;
	blk_queue_process(c->q);
	do_queue_stop(c);
}

/*
 * For fuzzing and tests: start queue idx with s exactly as blk_queue_start
 * does (which already looks at the ring once), process the ring once more,
 * then stop it as blk_queue_stop does (draining, publishing used->idx).
 * All three run in one loop_call_sync on the queue's iothread.  Returns 0
 * or the -errno of the start.  Main thread; the queue must be stopped.
 */
int blk_fuzz_process(struct blk_dev *d, unsigned idx, const struct vu_queue_setup *s)
{
	struct blk_call c = { .setup = s };

	if (idx >= d->num_queues)
		return -EINVAL;
	c.q = &d->q[idx];
	loop_call_sync(c.q->t->loop, do_fuzz_process, &c);
	return c.ret;
}
