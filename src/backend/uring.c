/*
 * io_uring engine: one ring per iothread, reads/writes straight from the
 * guest's iovecs, FLUSH as fdatasync, completions signalled on an eventfd
 * watched by the iothread's loop and reaped there.
 *
 * When to submit (docs/architecture.md "Submitting"): requests taken from
 * the rings in one pass are queued as SQEs and submitted with one
 * io_uring_enter at the end of the pass (kick) -- unless the disk is slow.
 * Then each SQE goes in at once: the disk starts on the first request
 * while we still parse the next, and the requests of a queue stay spread
 * over the disk's service time instead of travelling in lockstep batches
 * (measured: QD8/QD32 4k on a virtio disk, +20-50% IOPS); once the disk
 * has plenty in flight they go in small batches (uring_queue).  "Slow" is the
 * latency of one sampled I/O at a time, an EWMA, against
 * URING_EARLY_SUBMIT_NS: a syscall per request costs ~1 us, noise next to
 * tens of microseconds of disk, but not next to the page cache, whose
 * hits complete inside the submitting call, so cached and tmpfs I/O keep
 * their batches.
 *
 * Polled I/O (b->iopoll, --iopoll; disk.c says where): reads and writes go
 * to a second ring set up with IORING_SETUP_IOPOLL, on the device's poll
 * queues, which raise no interrupt and signal no eventfd.  Their
 * completions are found by asking the kernel to look (io_uring_enter with
 * GETEVENTS); while one is in flight the loop never sleeps (loop.h: busy).
 * An IOPOLL ring takes nothing but reads and writes, so flushes, FUA
 * writes (RWF_DSYNC: a file system may finish them in a worker), discards
 * and write zeroes stay on the first ring, with its eventfd.
 *
 * A file on tmpfs or ramfs (b->memory_fs) has its reads and writes done
 * here, with preadv/pwritev2 on the iothread: shmem has no FMODE_NOWAIT
 * (Linux 6.18), so io_uring never completes them inside io_uring_enter but
 * hands every one to its worker thread, and the copy that worker makes is
 * all the work there is.  The hand-off, the worker's switch and the
 * completion eventfd cost more than the copy of 4 KiB (docs/benchmarks.md
 * "Serving NBD").  They are queued as SQEs are and done at the kick, at
 * the end of the submitter's pass, not inside submit: a front sees its
 * pass's requests in flight together, as with the ring (the virtio-blk
 * queue's interrupt moderation counts them: done one by one at submit,
 * every completion looked like queue depth 1 and none was held), and
 * completes them in a batch.  A bottom half runs what a submitter left
 * without a kick.  Flushes, discards and write zeroes stay on the ring.
 * --no-sync-io: the ring for everything (ablation).
 */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>

#include "backend/bdev.h"
#include "loop/loop.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/sys.h"
#include "util/trim.h"

/* One io_uring and what is queued on it. */
struct uring_ring {
	struct io_uring ring;
	unsigned queued;	/* SQEs prepared since the last io_uring_submit */
	bool fixed_file;	/* the disk is registered file 0 */
};

struct bdev_ctx {
	struct bdev *b;
	struct loop *loop;
	struct uring_ring irq;	/* completions signal efd */
	/* Polled I/O (see the top), when b->iopoll and not refused. */
	struct uring_ring polled;
	bool has_polled;
	bool polled_refused;	/* the device failed a polled request (EOPNOTSUPP) */
	unsigned pinflight;	/* of inflight, on the polled ring */
	uint64_t npolled;	/* I/Os completed there */
	int efd;
	struct loop_fd *efd_h;
	unsigned inflight;	/* submitted (queued or in kernel), not completed */
	/* No SQE free and the kernel took nothing (several rings on one
	 * iothread can hold more than the SQ; an SQPOLL thread behind): the
	 * I/O waits here, in order, and goes in at the next kick.  The same
	 * retry timer pushes SQEs the kernel left in the SQ. */
	struct bdev_io *wait_head, **wait_tail;
	struct loop_timer *retry;
	bool submit_err_logged;
	uint64_t submits;	/* io_uring_submit calls that submitted */
	/* Early submission (see the top): one I/O at a time is timed. */
	bool early;		/* submit each SQE at once */
	bool early_off;		/* --no-early-submit */
	struct bdev_io *probe;	/* the I/O being timed, or NULL */
	uint64_t probe_ns;	/* loop_now() when it was queued */
	uint64_t lat_ns;	/* EWMA (1/8) of the timed latencies */
	/* Does spinning pay for the device? (uring_spin_note) */
	uint64_t probe_wall;	/* sys_now_ns() when the timed I/O was queued */
	unsigned spin_phase;	/* URING_SPIN_* */
	unsigned spin_n;	/* timed I/Os in the run phase */
	struct trim spin_trim;	/* those of a measuring phase, and their
				 * latencies (util/trim.h: all but the few
				 * slowest, which a host stall makes) */
	uint64_t spin_lat;	/* mean latency measured spinning */
	bool nospin;		/* no spinning while the device has I/O */
	unsigned spin_mult;	/* the run's length, in URING_SPIN_RUN units */
	bool nospin_last;	/* the last measurement's decision */
	uint64_t spin_checks;	/* measurements that came to a decision */
	/* Reads and writes done on this thread (b->memory_fs, see the top),
	 * queued until the kick (or sync_bh).  One submitted by a completion
	 * callback while the queue runs joins it: the stack does not grow
	 * with a chain of them (a bounced I/O's parts, a front that submits
	 * from its callback). */
	bool sync;
	bool in_sync;
	struct bdev_io *sync_head, **sync_tail;
	unsigned nsyncq;	/* queued there */
	struct loop_bh *sync_bh;
	uint64_t nsync;		/* done so */
};

/* Measuring phases: URING_SPIN_PROBES timed I/Os with spinning allowed,
 * as many without; then the faster mode runs URING_SPIN_RUN times as long
 * before the next measurement. */
enum { URING_SPIN_MEASURE, URING_SPIN_MEASURE_OFF, URING_SPIN_RUN };
#define URING_SPIN_PROBES 32
_Static_assert(TRIM_TOP < URING_SPIN_PROBES, "a measurement keeps most of its samples");
#define URING_SPIN_RUN 16
/* A decision that repeats doubles the run, up to URING_SPIN_RUN_MAX_MULT
 * times, close or not (as the loop's pay check does): half of each
 * measurement runs in the losing mode, and here a read spun for costs the
 * disk ~16 us (the interrupt finds our vCPU running instead of halted:
 * bench/qd1-path, "device: CPU idle / busy"), so a case that keeps coming
 * out the same is measured less often; a flip starts again at one. */
#define URING_SPIN_RUN_MAX_MULT 8
/* Sleeping must be this much faster (percent of the spinning latency) to
 * win: spinning is what pays on most machines. */
#define URING_SPIN_MARGIN_PCT 95

#define URING_EARLY_SUBMIT_NS 20000
/* Early submission waits for a batch of a quarter of what the disk
 * already has: see uring_queue. */
#define URING_EARLY_DIV 4

#define URING_RETRY_NS 1000000

/* A kick with more tmpfs reads and writes queued than this sends them
 * through the ring (uring_sync_run). */
#define URING_SYNC_MAX 4

static void uring_prep(struct bdev_ctx *c, struct uring_ring *q, struct bdev_io *io,
		       struct io_uring_sqe *sqe);
static bool uring_is_polled(const struct bdev_ctx *c, const struct bdev_io *io);

static void uring_kick_ring(struct bdev_ctx *c, struct uring_ring *q)
{
	int r;

	if (!q->queued)
		return;
	r = io_uring_submit(&q->ring);
	if (r < 0) {
		/* EAGAIN, ENOMEM; EBUSY while the CQ overflows: nothing
		 * went in.  Try again shortly, whether or not more I/O or a
		 * completion comes to do it. */
		if (!c->submit_err_logged)
			log_err("io_uring_submit: %s; retrying (further failures not "
				"logged)", strerror(-r));
		c->submit_err_logged = true;
		loop_timer_mod(c->retry, loop_now(c->loop) + URING_RETRY_NS);
		return;
	}
	c->submits++;
	/* The kernel stops at an SQE it cannot take (it posts that one's
	 * error as its CQE) and leaves the rest in the SQ: they are still
	 * queued.  An SQPOLL thread takes them all, later. */
	q->queued = c->b->uring_sqpoll ? 0 : io_uring_sq_ready(&q->ring);
	if (q->queued)
		loop_timer_mod(c->retry, loop_now(c->loop) + URING_RETRY_NS);
}

/* Put waiting I/Os on SQEs freed since; true if it queued any. */
static bool uring_feed(struct bdev_ctx *c)
{
	bool fed = false;

	while (c->wait_head) {
		struct bdev_io *io = c->wait_head;
		struct uring_ring *q = uring_is_polled(c, io) ? &c->polled : &c->irq;
		struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);

		if (!sqe) {
			loop_timer_mod(c->retry, loop_now(c->loop) + URING_RETRY_NS);
			break;
		}
		c->wait_head = io->next;
		if (!c->wait_head)
			c->wait_tail = &c->wait_head;
		uring_prep(c, q, io, sqe);
		fed = true;
	}
	return fed;
}

static void uring_sync_run(struct bdev_ctx *c);

static void uring_kick(struct bdev_ctx *c)
{
	uring_sync_run(c);
	uring_kick_ring(c, &c->irq);
	uring_kick_ring(c, &c->polled);
	if (unlikely(c->wait_head) && uring_feed(c)) {
		uring_kick_ring(c, &c->irq);
		uring_kick_ring(c, &c->polled);
	}
}

static uint64_t uring_submits(const struct bdev_ctx *c)
{
	return c->submits;
}

static uint64_t uring_polled(const struct bdev_ctx *c)
{
	return c->npolled;
}

static uint64_t uring_sync_ios(const struct bdev_ctx *c)
{
	return c->nsync;
}

static void uring_spin_stats(const struct bdev_ctx *c, struct bdev_spin_stats *s)
{
	s->checks = c->spin_checks;
	s->off = c->nospin && c->spin_phase == URING_SPIN_RUN;
}

/* Does io go to the polled ring?  Its reads and writes, FUA aside. */
static bool uring_is_polled(const struct bdev_ctx *c, const struct bdev_io *io)
{
	return c->has_polled && !c->polled_refused &&
	       (io->op == BDEV_READ || (io->op == BDEV_WRITE && !io->fua));
}

/* Fill sqe with io for ring q, and count it queued there (and polled). */
static void uring_prep(struct bdev_ctx *c, struct uring_ring *q, struct bdev_io *io,
		       struct io_uring_sqe *sqe)
{
	/* A registered file saves the kernel an fd lookup and refcount per
	 * request. */
	int fd = q->fixed_file ? 0 : c->b->fd;

	switch (io->op) {
	case BDEV_READ:
		io_uring_prep_readv(sqe, fd, io->iov, io->iovcnt, io->offset);
		break;
	case BDEV_WRITE:
		io_uring_prep_writev(sqe, fd, io->iov, io->iovcnt, io->offset);
		if (io->fua)
			sqe->rw_flags = RWF_DSYNC;
		break;
	case BDEV_FLUSH:
		io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
		break;
	case BDEV_DISCARD:
	case BDEV_WRITE_ZEROES:
		io_uring_prep_fallocate(sqe, fd, bdev_fallocate_mode(c->b, io), io->offset,
					io->length);
		break;
	}
	if (q->fixed_file)
		sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data(sqe, io);
	io->polled = q == &c->polled;
	c->pinflight += io->polled;
	q->queued++;
}

static void uring_queue(struct bdev_ctx *c, struct bdev_io *io)
{
	struct uring_ring *q = uring_is_polled(c, io) ? &c->polled : &c->irq;
	struct io_uring_sqe *sqe = unlikely(c->wait_head) ? NULL : io_uring_get_sqe(&q->ring);
	unsigned queued;

	if (unlikely(!sqe)) {
		/* SQ full: push what we have and take a fresh slot. */
		if (!c->wait_head) {
			uring_kick_ring(c, q);
			sqe = io_uring_get_sqe(&q->ring);
		}
		if (!sqe) {
			/* Still full (or others wait already): wait in order. */
			if (io == c->probe)
				c->probe = NULL;
			io->next = NULL;
			*c->wait_tail = io;
			c->wait_tail = &io->next;
			loop_timer_mod(c->retry, loop_now(c->loop) + URING_RETRY_NS);
			return;
		}
	}
	uring_prep(c, q, io, sqe);
	queued = c->irq.queued + c->polled.queued;
	/* A disk with little to do gets each request at once; one that
	 * already has k requests gets them in batches of k/4.  Waiting for
	 * a few more costs nothing there (the disk is busy) and saves a
	 * syscall and a device notification each (measured: randwrite QD32
	 * +12-40 % over one submission per request, the disk's queue full
	 * either way).  The end of the pass submits the rest. */
	if (c->early && queued * URING_EARLY_DIV >= c->inflight - queued)
		uring_kick(c);
}

static void uring_ring_submit(struct bdev_ctx *c, struct bdev_io *io);

/* Do the queued reads and writes with plain syscalls and complete them,
 * with what their callbacks queue meanwhile (see the top) -- unless the
 * pass queued more than URING_SYNC_MAX: then they go to the ring as one
 * batch, whose one io_uring_enter and worker hand-off cost less than a
 * syscall each (vhost-user randread QD32 on tmpfs: 713 K IOPS through
 * the ring, 465 K done here; QD1: 59 K and 75 K). */
static void uring_sync_run(struct bdev_ctx *c)
{
	struct bdev_io *io;

	if (!c->sync_head || c->in_sync)
		return;
	c->in_sync = true;
	if (c->nsyncq > URING_SYNC_MAX) {
		io = c->sync_head;
		c->sync_head = NULL;
		c->sync_tail = &c->sync_head;
		c->nsyncq = 0;
		while (io) {
			struct bdev_io *next = io->next;

			uring_ring_submit(c, io);
			io = next;
		}
	}
	while ((io = c->sync_head)) {
		c->sync_head = io->next;
		if (!c->sync_head)
			c->sync_tail = &c->sync_head;
		c->nsyncq--;
		c->nsync++;
		bdev_complete(io, bdev_io_sync(c->b, io));
	}
	c->in_sync = false;
}

/* A submitter that did not kick: as if it had (the ring too, where
 * uring_sync_run sent a large batch). */
static void uring_sync_bh(void *opaque)
{
	uring_kick(opaque);
}

static void uring_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	if (c->sync && (io->op == BDEV_READ || io->op == BDEV_WRITE)) {
		if (!c->sync_head && !c->in_sync)
			loop_bh_schedule(c->sync_bh);
		io->next = NULL;
		*c->sync_tail = io;
		c->sync_tail = &io->next;
		c->nsyncq++;
		return;
	}
	uring_ring_submit(c, io);
}

static void uring_ring_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	c->inflight++;
	if (!c->probe) {
		c->probe = io;
		c->probe_ns = loop_now(c->loop);
		if (c->b->device_completes)
			c->probe_wall = sys_now_ns();
	}
	uring_queue(c, io);
}

/*
 * Does spinning pay for the device?  Spinning while a request is on the
 * device saves a wake-up when it completes, but on a virtual machine the
 * disk is emulated by the host's threads, and a vCPU that spins takes a
 * host CPU from them: measured on this project's 2-vCPU VM, 4k randread
 * O_DIRECT pinned, polling off was faster at every depth (QD1 9.3 K
 * against 7.4 K IOPS, p50 92 against 116 us; docs/benchmarks.md "Issue 12
 * a sixth time").  Nothing on our side shows it (every window hits), so it
 * is measured: URING_SPIN_PROBES timed I/Os (one at a time, submission to
 * reaping, wall clock) with spinning allowed, as many with none while the
 * device has I/O (cpu_bound, below), each the mean of all but its
 * TRIM_TOP slowest (util/trim.h); the faster runs for URING_SPIN_RUN times as
 * long, then again.  Only for a device: in the page cache the
 * latency is our own CPU's.
 */
static void uring_spin_note(struct bdev_ctx *c, uint64_t lat)
{
	uint64_t mean;

	if (c->spin_phase == URING_SPIN_RUN) {
		if (++c->spin_n < URING_SPIN_PROBES * URING_SPIN_RUN * c->spin_mult)
			return;
		c->spin_n = 0;
		c->nospin = false;
		c->spin_phase = URING_SPIN_MEASURE;
		return;
	}
	/* A sample "spinning allowed" taken while the loop spun nothing
	 * (backed off for contention, or off by its own pay check) would be
	 * one more sample of not spinning. */
	if (c->spin_phase == URING_SPIN_MEASURE && !loop_polling(c->loop))
		return;
	trim_add(&c->spin_trim, lat);
	if (c->spin_trim.n < URING_SPIN_PROBES)
		return;
	mean = trim_take(&c->spin_trim);
	if (c->spin_phase == URING_SPIN_MEASURE) {
		c->spin_lat = mean;
		c->nospin = true;
		c->spin_phase = URING_SPIN_MEASURE_OFF;
		return;
	}
	{
		bool nospin = mean * 100 < c->spin_lat * URING_SPIN_MARGIN_PCT;

		c->spin_mult = nospin == c->nospin_last ?
			       MIN(c->spin_mult * 2, URING_SPIN_RUN_MAX_MULT) : 1;
		c->nospin_last = nospin;
		c->nospin = nospin;
		c->spin_checks++;
	}
	c->spin_phase = URING_SPIN_RUN;
	log_debug("io_uring: device latency %llu ns spinning, %llu ns not: %s",
		  (unsigned long long)c->spin_lat, (unsigned long long)mean,
		  c->nospin ? "no spinning while it works" : "spinning");
}

/* The timed I/O completed: update the latency and the policy (spinning
 * is a choice only for what the device signals). */
static void uring_probe_done(struct bdev_ctx *c, bool polled)
{
	uint64_t lat = loop_now(c->loop) - c->probe_ns;

	c->probe = NULL;
	c->lat_ns = c->lat_ns - c->lat_ns / 8 + lat / 8;
	c->early = !c->early_off && c->lat_ns >= URING_EARLY_SUBMIT_NS;
	if (c->b->device_completes && !polled)
		uring_spin_note(c, sys_now_ns() - c->probe_wall);
}

/* One CQE: finish the I/O, or resubmit the rest of a short transfer. */
static void uring_cqe(struct bdev_ctx *c, struct bdev_io *io, int res)
{
	bool polled = io->polled;

	c->pinflight -= polled;
	if (polled && res == -EOPNOTSUPP) {
		/* The queue said it could poll (disk.c) and the kernel
		 * disagrees: interrupts from now on, this I/O included. */
		if (!c->polled_refused)
			log_warn("disk %s: the device refused polled I/O; reads and "
				 "writes use interrupts from now on (--iopoll off: no "
				 "attempt)", c->b->path);
		c->polled_refused = true;
		uring_queue(c, io);
		return;
	}
	if (res == -EAGAIN || res == -EINTR) {
		uring_queue(c, io);
		return;
	}
	if ((io->op == BDEV_READ || io->op == BDEV_WRITE) && res >= 0) {
		size_t done = (size_t)res;

		if (done < io->len) {
			if (done == 0) {	/* EOF: cannot happen below size */
				res = -EIO;
				goto complete;
			}
			/* Short transfer: go on from where it stopped. */
			if (bdev_io_consume(io, done) < 0) {
				res = -ENOMEM;
				goto complete;
			}
			uring_queue(c, io);
			return;
		}
		res = 0;
	}
complete:
	c->inflight--;
	c->npolled += polled;
	if (io == c->probe)
		uring_probe_done(c, polled);
	bdev_complete(io, res < 0 ? res : 0);
}

/* The CQEs posted on q.  No syscall (io_uring_peek_cqe would make one on
 * an IOPOLL ring). */
static void uring_reap_ring(struct bdev_ctx *c, struct uring_ring *q)
{
	struct io_uring_cqe *cqe;

	while (io_uring_peek_batch_cqe(&q->ring, &cqe, 1) == 1) {
		struct bdev_io *io = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&q->ring, cqe);
		uring_cqe(c, io, res);
	}
}

static void uring_reap(struct bdev_ctx *c)
{
	uring_reap_ring(c, &c->irq);
	if (c->has_polled)
		uring_reap_ring(c, &c->polled);
	/* Resubmissions from short transfers. */
	uring_kick(c);
}

/* Ask the kernel to look at the poll queues (one pass, no waiting): it
 * posts the CQEs of what completed.  True if there are any. */
static bool uring_poll_device(struct bdev_ctx *c)
{
	if (io_uring_cq_ready(&c->polled.ring))
		return true;
	(void)io_uring_get_events(&c->polled.ring);
	return io_uring_cq_ready(&c->polled.ring) > 0;
}

/* A submission the kernel did not take, or I/O waiting for an SQE. */
static void uring_retry_cb(void *opaque)
{
	uring_reap(opaque);
}

static void uring_efd_cb(void *opaque, uint32_t events)
{
	struct bdev_ctx *c = opaque;

	(void)sys_eventfd_drain(c->efd);
	uring_reap(c);
}

/* Poll handler: completions can be found in the CQ ring without waiting
 * for the eventfd, which is switched off while the loop polls. */
static bool uring_poll(void *opaque)
{
	struct bdev_ctx *c = opaque;

	return io_uring_cq_ready(&c->irq.ring) > 0 || (c->pinflight && uring_poll_device(c));
}

static void uring_poll_run(void *opaque)
{
	uring_reap(opaque);
}

static void uring_poll_begin(void *opaque)
{
	struct bdev_ctx *c = opaque;

	(void)io_uring_cq_eventfd_toggle(&c->irq.ring, false);
}

static bool uring_poll_end(void *opaque)
{
	struct bdev_ctx *c = opaque;

	(void)io_uring_cq_eventfd_toggle(&c->irq.ring, true);
	/* The toggle is a store to the shared CQ flags; a CQE posted before
	 * the kernel saw it did not signal: look once more.  Full barrier
	 * pairs with the kernel's ordering of CQ tail update and flag read. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return io_uring_cq_ready(&c->irq.ring) > 0 ||
	       (c->has_polled && io_uring_cq_ready(&c->polled.ring) > 0);
}

/*
 * Are our completions made on our own CPU?  Without a device (the page
 * cache; tmpfs, whose O_DIRECT is a copy on the CPU: !device_completes) a
 * request either completes inside io_uring_enter or is handed to
 * io_uring's worker thread (io-wq: buffered writes to tmpfs, anything that
 * would block).  The worker takes the iothread's CPU affinity: pinned to
 * one CPU, it shares ours, and every cycle we spin waiting for it is taken
 * from it; the scheduler does not always preempt a spinner, so the
 * completion came when the window ended (measured pinned, 4k QD1 in the
 * page cache: p99 ~300 us with the window, 44-54 us without;
 * docs/benchmarks.md "Issue 12 a fifth time").  Allowed other CPUs, the
 * worker finds one, and spinning spares us a wake-up, as with a device.
 */
static bool uring_worker_shares_cpu(struct bdev_ctx *c)
{
	return !c->b->device_completes && loop_cpu_alone(c->loop);
}

/* Completions are expected while I/O the device signals is in flight
 * (loop.h: armed), worth a window of their own unless the worker sharing
 * our CPU makes them or spinning was measured to slow the device
 * (uring_spin_note). */
static bool uring_poll_armed(void *opaque)
{
	struct bdev_ctx *c = opaque;

	return c->inflight > c->pinflight && !uring_worker_shares_cpu(c) && !c->nospin;
}

/* ... and then, while a request is with that worker or that device (in
 * flight, its CQE not posted yet), nothing is spun at all, for kicks or
 * timers either (loop.h: cpu_bound). */
static bool uring_poll_cpu_bound(void *opaque)
{
	struct bdev_ctx *c = opaque;

	return c->inflight - c->pinflight > io_uring_cq_ready(&c->irq.ring) &&
	       (uring_worker_shares_cpu(c) || c->nospin);
}

/* Polled I/O in flight: only looking finds its completions. */
static bool uring_poll_busy(void *opaque)
{
	struct bdev_ctx *c = opaque;

	return c->pinflight > 0;
}

static const struct loop_poll_ops uring_poll_ops = {
	.poll = uring_poll,
	.run = uring_poll_run,
	.begin = uring_poll_begin,
	.end = uring_poll_end,
	.armed = uring_poll_armed,
	.cpu_bound = uring_poll_cpu_bound,
	.busy = uring_poll_busy,
};

static void uring_drain(struct bdev_ctx *c)
{
	uring_kick(c);
	while (c->inflight || c->sync_head) {
		/* Queued for the iothread by a completion meanwhile. */
		if (!c->inflight) {
			uring_kick(c);
			continue;
		}
		struct io_uring_cqe *cqe;
		/* On the polled ring the wait polls the device.  Some may
		 * still wait for an SQE (uring_queue): then nothing may be in
		 * the kernel to wait for, and the kick below is what helps. */
		struct __kernel_timespec ts = { .tv_nsec = URING_RETRY_NS };
		int r = io_uring_wait_cqe_timeout(c->pinflight ? &c->polled.ring : &c->irq.ring,
						  &cqe, &ts);

		if (r < 0 && r != -EINTR && r != -ETIME && r != -EAGAIN && r != -EBUSY) {
			/* The requests left are the kernel's still: freeing
			 * them now would let it complete into freed memory.
			 * Nothing but a broken kernel gets here. */
			log_err("io_uring_wait_cqe: %s; %u requests still in flight", strerror(-r),
				c->inflight);
			break;
		}
		uring_reap(c);
	}
}

static int uring_ctx_new(struct bdev *b, struct loop *l, unsigned depth,
			 struct bdev_ctx **out)
{
	struct bdev_ctx *c = calloc(1, sizeof(*c));
	unsigned entries = 64;
	int r;

	if (!c)
		return -ENOMEM;
	while (entries < depth && entries < 4096)
		entries *= 2;
	c->b = b;
	c->loop = l;
	c->early_off = b->no_early_submit;
	c->wait_tail = &c->wait_head;
	/* Polled I/O on tmpfs is only ever asked for by the test hook
	 * (disk.c: no device, no poll queue): it gets the ring it wants. */
	c->sync = b->memory_fs && !b->no_sync_io && !b->iopoll;
	c->sync_tail = &c->sync_head;
	c->spin_mult = 1;
	r = loop_timer_new(l, uring_retry_cb, c, &c->retry);
	if (r < 0)
		goto err_timer;
	r = loop_bh_new(l, uring_sync_bh, c, &c->sync_bh);
	if (r < 0)
		goto err_bh;
	{
		struct io_uring_params p = { 0 };

		if (b->uring_sqpoll) {
			/* A kernel thread polls the SQ: submissions cost no
			 * syscall while it is awake (it sleeps after 100 ms
			 * idle). */
			p.flags |= IORING_SETUP_SQPOLL;
			p.sq_thread_idle = 100;
		}
		r = io_uring_queue_init_params(entries, &c->irq.ring, &p);
	}
	if (r < 0)
		goto err_free;
	c->irq.fixed_file = io_uring_register_files(&c->irq.ring, &b->fd, 1) == 0;
	if (b->iopoll) {
		r = io_uring_queue_init(entries, &c->polled.ring, IORING_SETUP_IOPOLL);
		if (r < 0) {
			log_warn("disk %s: no polled ring (%s); using interrupts", b->path,
				 strerror(-r));
		} else {
			c->has_polled = true;
			c->polled.fixed_file =
				io_uring_register_files(&c->polled.ring, &b->fd, 1) == 0;
		}
	}
	c->efd = sys_eventfd();
	if (c->efd < 0) {
		r = c->efd;
		goto err_ring;
	}
	r = io_uring_register_eventfd(&c->irq.ring, c->efd);
	if (r < 0)
		goto err_efd;
	r = loop_fd_add(l, c->efd, EPOLLIN, uring_efd_cb, c, &c->efd_h);
	if (r < 0)
		goto err_efd;
	loop_fd_set_poll(c->efd_h, &uring_poll_ops);
	*out = c;
	return 0;

err_efd:
	close(c->efd);
err_ring:
	if (c->has_polled)
		io_uring_queue_exit(&c->polled.ring);
	io_uring_queue_exit(&c->irq.ring);
err_free:
	loop_bh_free(c->sync_bh);
err_bh:
	loop_timer_free(c->retry);
err_timer:
	free(c);
	return r;
}

static void uring_ctx_free(struct bdev_ctx *c)
{
	if (!c)
		return;
	uring_drain(c);
	loop_bh_free(c->sync_bh);
	loop_timer_free(c->retry);
	loop_fd_del(c->loop, c->efd_h);
	close(c->efd);
	if (c->has_polled)
		io_uring_queue_exit(&c->polled.ring);
	io_uring_queue_exit(&c->irq.ring);
	free(c);
}

const struct bdev_engine bdev_uring_engine = {
	.name = "io_uring",
	.caps = BDEV_CAP_DISCARD | BDEV_CAP_WRITE_ZEROES | BDEV_CAP_FUA,
	.ctx_new = uring_ctx_new,
	.ctx_free = uring_ctx_free,
	.submit = uring_submit,
	.kick = uring_kick,
	.drain = uring_drain,
	.submits = uring_submits,
	.polled = uring_polled,
	.sync_ios = uring_sync_ios,
	.spin_stats = uring_spin_stats,
};
