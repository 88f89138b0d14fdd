/*
 * The error policy: a failed request the policy stops on is not completed
 * to the guest; it is held, and the disk pauses until resumed
 * (docs/architecture.md "Errors that pause").  The rules are QEMU's
 * -drive werror=/rerror= (block/block-backend.c, blk_get_error_action:
 * "enospc" stops on ENOSPC only, "stop" on any error, "report" never), and
 * so is what a stop does to the request (hw/block/virtio-blk.c,
 * virtio_blk_handle_rw_error keeps it, virtio_blk_dma_restart_cb submits
 * it again at resume); but where QEMU stops the whole VM, vblkd pauses the
 * disk: no new request is taken from any of its rings, those in flight
 * finish (a failing one is held too), and the guest simply waits.
 *
 * Threads: a request fails and is held on its queue's iothread (held
 * list: that iothread only); the device's paused flag is set by whichever
 * iothread pauses first and read by all of them when they look at their
 * rings; the reason and the counters are under pause_lock (rare); the main
 * thread hears of a pause through an eventfd (sd_notify STATUS, the retry
 * timer) and resumes by handing each iothread its part (loop_call_sync).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blk/blk_internal.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/notify.h"
#include "util/sys.h"

static const char *const reason_names[BLK_PAUSE_NR] = {
	[BLK_PAUSE_ENOSPC] = "enospc",
	[BLK_PAUSE_EDQUOT] = "edquot",
	[BLK_PAUSE_EIO] = "eio",
};

const char *blk_pause_reason_name(enum blk_pause_reason r)
{
	return (unsigned)r < BLK_PAUSE_NR ? reason_names[r] : "?";
}

static enum blk_pause_reason reason_of(int err)
{
	return err == ENOSPC ? BLK_PAUSE_ENOSPC : err == EDQUOT ? BLK_PAUSE_EDQUOT :
	       BLK_PAUSE_EIO;
}

bool blk__error_stops(const struct blk_dev *d, enum bdev_op op, int err)
{
	/* Reads follow rerror; writes, flushes, discards and write zeroes
	 * werror (QEMU's virtio-blk does the same). */
	enum blk_err_policy p = op == BDEV_READ ? d->rerror : d->werror;

	return p == BLK_ERR_STOP || (p == BLK_ERR_ENOSPC && err == ENOSPC);
}

static const char *op_name(enum bdev_op op)
{
	switch (op) {
	case BDEV_READ: return "read";
	case BDEV_WRITE: return "write";
	case BDEV_FLUSH: return "flush";
	case BDEV_DISCARD: return "discard";
	case BDEV_WRITE_ZEROES: return "write zeroes";
	}
	return "request";
}

/* Iothread: r failed with err and the policy stops on it.  Keep it, in
 * order, and pause the disk if it is not paused yet. */
void blk__hold_request(struct blk_queue *q, struct blk_req *r, int err)
{
	struct blk_dev *d = q->dev;
	enum blk_pause_reason why = reason_of(err);

	r->held_next = NULL;
	*q->held_tail = r;
	q->held_tail = &r->held_next;
	q->nheld++;
	atomic_fetch_add_explicit(&d->held, 1, memory_order_relaxed);
	pthread_mutex_lock(&d->pause_lock);
	if (!atomic_load_explicit(&d->paused, memory_order_relaxed)) {
		snprintf(d->pause_reason, sizeof(d->pause_reason),
			 "%s (%s at offset %" PRIu64 ", queue %u)", strerror(err),
			 op_name(r->io.op), r->io.op == BDEV_FLUSH ? 0 : r->io.offset, q->idx);
		d->pause_errno = err;
		d->paused_since = (uint64_t)time(NULL);
		d->pauses[why]++;
		/* Before the others can see it: every iothread stops taking
		 * requests at its next look at its rings. */
		atomic_store_explicit(&d->paused, true, memory_order_release);
		log_err("paused: %s: the guest's I/O waits (%s); fix the cause, then "
			"vblkctl resume%s", d->pause_reason,
			why == BLK_PAUSE_ENOSPC ? "make space on the disk's file system" :
			why == BLK_PAUSE_EDQUOT ? "raise the quota" : "bring the storage back",
			d->retry_ns ? " (or wait: it is retried by itself)" : "");
		(void)sys_eventfd_signal(d->pause_efd);
	}
	pthread_mutex_unlock(&d->pause_lock);
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
	atomic_fetch_sub_explicit(&q->dev->held, q->nheld, memory_order_relaxed);
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

int blk_dev_resume(struct blk_dev *d)
{
	unsigned n = 0;

	if (!atomic_load(&d->paused) && !atomic_load(&d->held))
		return 0;
	pthread_mutex_lock(&d->pause_lock);
	atomic_store_explicit(&d->paused, false, memory_order_release);
	pthread_mutex_unlock(&d->pause_lock);
	for (unsigned i = 0; i < d->num_queues; i++) {
		struct resume_call c = { .q = &d->q[i] };

		loop_call_sync(d->q[i].t->loop, do_resume, &c);
		n += c.n;
	}
	log_info("resumed: %u held request%s submitted again", n, n == 1 ? "" : "s");
	if (!atomic_load(&d->paused))
		(void)notify_status("Serving");
	return (int)n;
}

void blk_dev_pause_state(struct blk_dev *d, struct blk_pause_state *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&d->pause_lock);
	st->paused = atomic_load(&d->paused);
	if (st->paused) {
		snprintf(st->reason, sizeof(st->reason), "%s", d->pause_reason);
		st->since = d->paused_since;
	}
	memcpy(st->pauses, d->pauses, sizeof(st->pauses));
	pthread_mutex_unlock(&d->pause_lock);
	st->held = atomic_load_explicit(&d->held, memory_order_relaxed);
}

/* Main thread: an iothread paused the disk. */
static void pause_event_cb(void *opaque, uint32_t events)
{
	struct blk_dev *d = opaque;
	char reason[sizeof(d->pause_reason)];
	bool paused;

	(void)sys_eventfd_drain(d->pause_efd);
	pthread_mutex_lock(&d->pause_lock);
	paused = atomic_load(&d->paused);
	snprintf(reason, sizeof(reason), "%s", d->pause_reason);
	pthread_mutex_unlock(&d->pause_lock);
	if (!paused)
		return;
	(void)notify_status("Paused: %s; vblkctl resume once fixed", reason);
	if (d->retry_ns && d->retry_timer)
		loop_timer_mod(d->retry_timer, sys_now_ns() + d->retry_ns);
}

static void retry_cb(void *opaque)
{
	struct blk_dev *d = opaque;

	if (!atomic_load(&d->paused))
		return;
	log_info("retrying the held requests (--error-retry-s)");
	(void)blk_dev_resume(d);
}

int blk_dev_attach(struct blk_dev *d, struct loop *main_loop)
{
	int r = loop_fd_add(main_loop, d->pause_efd, EPOLLIN, pause_event_cb, d, &d->pause_h);

	if (r < 0)
		return r;
	d->main_loop = main_loop;
	r = loop_timer_new(main_loop, retry_cb, d, &d->retry_timer);
	if (r < 0) {
		loop_fd_del(main_loop, d->pause_h);
		d->pause_h = NULL;
		return r;
	}
	/* Paused before we were attached (a state handed over by an upgrade
	 * in place): say so now. */
	if (atomic_load(&d->paused))
		(void)sys_eventfd_signal(d->pause_efd);
	return 0;
}

/* Upgrade in place: the pause goes to the new process, reason and all.
 * The held requests themselves go as what they are to the frontend: in
 * flight (the in-flight region the new process is handed). */
size_t blk__pause_save(struct blk_dev *d, uint8_t *buf, size_t len)
{
	size_t n;

	pthread_mutex_lock(&d->pause_lock);
	/* The reason is cut to what fits (the pause itself always goes). */
	n = MIN(strnlen(d->pause_reason, sizeof(d->pause_reason) - 1), MIN(len, 256) - 1);
	if (!atomic_load(&d->paused) || len < 1) {
		pthread_mutex_unlock(&d->pause_lock);
		return 0;
	}
	buf[0] = (uint8_t)n;
	memcpy(buf + 1, d->pause_reason, n);
	pthread_mutex_unlock(&d->pause_lock);
	return 1 + n;
}

void blk__pause_load(struct blk_dev *d, const uint8_t *buf, size_t len)
{
	/* len >= 1 (blk__load_state); the text is at most what came, and
	 * what we keep. */
	size_t n = MIN(MIN((size_t)buf[0], len - 1), sizeof(d->pause_reason) - 1);

	pthread_mutex_lock(&d->pause_lock);
	memcpy(d->pause_reason, buf + 1, n);
	d->pause_reason[n] = '\0';
	d->paused_since = (uint64_t)time(NULL);
	atomic_store(&d->paused, true);
	pthread_mutex_unlock(&d->pause_lock);
	log_err("paused before the upgrade: %s: the guest's I/O waits; vblkctl resume once "
		"fixed", d->pause_reason);
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
	atomic_fetch_sub_explicit(&q->dev->held, n, memory_order_relaxed);
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

int blk__pause_init(struct blk_dev *d, const struct blk_opts *o)
{
	d->rerror = o->rerror;
	d->werror = o->werror;
	d->retry_ns = o->error_retry_ns;
	d->pause_efd = sys_eventfd();
	if (d->pause_efd < 0)
		return d->pause_efd;
	pthread_mutex_init(&d->pause_lock, NULL);
	return 0;
}

void blk_dev_detach(struct blk_dev *d)
{
	if (!d->main_loop)
		return;
	loop_timer_free(d->retry_timer);
	d->retry_timer = NULL;
	loop_fd_del(d->main_loop, d->pause_h);
	d->pause_h = NULL;
	d->main_loop = NULL;
}

void blk__pause_free(struct blk_dev *d)
{
	blk_dev_detach(d);
	close(d->pause_efd);
	pthread_mutex_destroy(&d->pause_lock);
}
