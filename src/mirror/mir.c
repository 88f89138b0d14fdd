/*
 * The mirror job (mir.h).  Its units run on the disk's iothread 0: a
 * read through the disk's engine ctx there (disk_submit: the format's
 * mapping), then a write to the target through a ctx of the target's own
 * engine on the same loop.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/bdev.h"
#include "bitmap/dbm.h"
#include "disk/disk.h"
#include "format/format.h"
#include "job/job.h"
#include "loop/loop.h"
#include "mirror/mir.h"
#include "util/barrier.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/jfield.h"
#include "util/log.h"
#include "util/sys.h"

/* While ready, how often the job looks for what the guest wrote. */
#define MIR_READY_POLL_NS (10ull * 1000000)
/* The switch-over's wait gives up after this long without progress. */
#define MIR_SYNC_STALL_NS (30ull * 1000000000)
/* Runs a unit copies at once. */
#define MIR_PAR 8
/*
 * Yielding (background mode, once ready; mirror start --no-yield turns it
 * off).  The job's units run on the thread that serves the guest's queue
 * there, and a background mirror's job never rests while the guest writes
 * flat out: it took half of that thread, and the guest's writes fell to
 * 0.47x of no mirror (docs/benchmarks.md "Mirror").  While the guest is
 * busy on the job's thread (a write in flight there, or one in the last
 * MIR_BUSY_NS), each stretch of the job's own work there (a unit's
 * submission, a read's or write's completion) that took T makes its next
 * unit wait until MIR_YIELD_K * T later: the job keeps about 1 / (1 + K)
 * of the thread while the guest writes, and all of it when the guest is
 * quiet.
 * What the guest writes meanwhile stays dirty and is copied later, in
 * longer runs; write-blocking mode, a pivot and a switch-over's sync never
 * wait (they are how a mirror converges).  The backup's view yields the
 * same way (nbd/conn.c, "Yielding").
 */
#define MIR_YIELD_K 15u
#define MIR_BUSY_NS 1000000ull
/* A run read as data is written in pieces of data and of zeroes at this
 * grain (QEMU's default qcow2 cluster): a target stays as sparse as what
 * the disk holds, not filled around the data a run has.  MIR_SEGS: the
 * pieces of a run at most (one more for an unaligned start). */
#define MIR_ZERO_GRAIN (64u * 1024)
#define MIR_SEGS (MIR_UNIT_MAX / MIR_ZERO_GRAIN + 1)

struct mir {
	struct mir_set *set;
	struct disk *d;
	struct disk_iothread *t;
	char name[64], target[256], job_id[32];
	/* The target: tfile, the file or NBD connection (bdev_open), and
	 * tgt, what is written: tfile itself, or a qcow2 over it (fmt_open).
	 * A local one is locked and claimed (held) as a disk is, so that
	 * the pivot hands it to the disk as it is: one instance of a
	 * qcow2's tables, ever. */
	struct bdev *tgt, *tfile;
	enum fmt_kind tkind;
	bool tgt_open, held;
	bool made;		/* the file is ours (removed if start fails) */
	/* The pivot: the target's flush on iothread 0 once parked (a
	 * qcow2's tables belong to that thread). */
	struct bdev_io pfio;
	int pfio_res;
	bool pfio_done;
	struct bdev_ctx *tctx;	/* the job's: tctxs[0] */
	/* A ctx of the target per iothread of the disk (write-blocking
	 * writes go out on their own thread); NULL past the target's
	 * max_ctxs (a target without multi-conn takes one connection). */
	struct bdev_ctx **tctxs;
	unsigned ntctx;
	/* Write-blocking writes a thread has out to the target (its
	 * thread's only: the filter's drain). */
	unsigned *tpending;
	struct dbm *dirty;
	struct job *job;
	struct loop_timer *poll;
	uint64_t size, cursor;
	uint8_t *buf;		/* MIR_PAR runs of MIR_UNIT_MAX */
	/* A unit: up to MIR_PAR runs copied at once (QEMU's mirror keeps
	 * several in flight too), done when the last one is. */
	struct mir_op {
		struct mir *m;
		uint64_t off, len;
		struct bdev_io rio;
		/* The writes: one, or the pieces of a run read as data
		 * with zeroes in it (op_split); wleft not done yet. */
		struct mir_w {
			struct bdev_io io;
			struct iovec iov;
			struct mir_op *op;
		} w[MIR_SEGS];
		unsigned nw, wleft;
		int wres;
		uint64_t zbytes;	/* written as zeroes */
		struct iovec iov;
		bool zero;	/* the disk's block status: it reads as zeroes */
	} ops[MIR_PAR];
	unsigned nops, left;
	int unit_res;
	uint64_t unit_bytes;
	struct bdev_io fio;	/* the target's flush */
	bool fio_busy;
	bool flushed, ready, claimed, done, by_main;
	/* A pivot (mir_pivot): hold: the job starts no unit (main sets it,
	 * the job's loop reads it); pivoted: the target is the disk now. */
	_Atomic bool hold;
	bool pivoted;
	bool gone;		/* torn down: progress says final (the job's loop) */
	uint64_t final_dirty;
	_Atomic bool ended;
	_Atomic unsigned passes;
	_Atomic uint64_t copied, zeroed;
	uint64_t t0;
	_Atomic uint64_t ready_ns;
	/* The write filter: every write marked again as it completes. */
	struct disk_wfilter wf;
	bool filtered;
	_Atomic uint64_t writes;	/* wrapped, not yet completed */
	_Atomic int mode;		/* enum mir_mode */
	/* lk: who has a range of the disk in flight that the target may
	 * get (the unit, write-blocking writes from their submission to
	 * their target write's completion); a write-blocking write writes
	 * the target only if nobody else has its range (wb_source_done). */
	pthread_mutex_t lk;
	bool lk_init;
	bool u_busy;
	unsigned u_n;			/* the unit's runs, copied from ops[] */
	struct { uint64_t off, len; } u_run[MIR_PAR];
	struct wbw *wbws;
	_Atomic uint64_t wb_writes, wb_conflicts, wb_errors;
	_Atomic uint64_t wb_bytes;	/* of the writes written through, on the target */
	_Atomic uint64_t wb_inflight;	/* write-blocking writes not completed */
	/* Writes not listed (wdone: a background one, or in write-blocking
	 * mode one on a thread with no target connection) completed so far:
	 * a listed write they may overlap, out meanwhile, leaves its range to
	 * the job (wb_done). */
	_Atomic uint64_t bg_done;
	/* mir_sync: a flush asked for (req) and the last one that found
	 * nothing dirty (done); flush_gen: the request the job's flush in
	 * flight answers (the job's loop). */
	_Atomic uint64_t sync_req, sync_done;
	uint64_t flush_gen;
	/* Yielding: on (start's), the guest's background writes on the
	 * job's thread (disk_busy), when the next unit may start (the
	 * job's thread's, both), the times the job waited (a look every
	 * MIR_BUSY_NS at most). */
	_Atomic bool yield;
	bool completing;	/* job complete was asked: no more yielding */
	struct disk_busy here;
	uint64_t owed;
	_Atomic uint64_t yields;
	struct mir *next;
};

/* A write-blocking write: the guest's I/O and its copy to the target. */
struct wbw {
	struct mir *m;
	struct bdev_io *gio;	/* the front's */
	struct bdev_io tio;	/* to the target */
	uint64_t off, len;
	unsigned tidx;
	int res, tres;		/* the source's, the target's */
	unsigned left;		/* halves not done (its thread's) */
	bool through;		/* to the target too (wsubmit) */
	bool raced;		/* a unit started on its range (under lk) */
	uint64_t bg_done;	/* mir.bg_done when it was listed */
	struct wbw *prev, *next;
};

struct mir_set {
	struct disk *d;
	struct loop *main_loop;
	struct mir *list;
	int efd;		/* a job ended without main: tear it down */
	struct loop_fd *h;
};

/* ---- The write filter (the fronts' iothreads) ------------------------------- */

/*
 * A write is marked before it is submitted (disk_dirty) and again here, as
 * it completes: a unit that took the bits and read the disk while the write
 * was in flight may have read the old data, and this mark has the next
 * pass copy it again (QEMU marks at completion: bdrv_co_write_req_finish).
 */
static void wdone(struct bdev_io *io, int res)
{
	struct mir *m = io->up_priv;
	uint64_t len = io->op == BDEV_WRITE ? iov_size(io->iov, io->iovcnt) : io->length;

	/* A listed write out now clears the granules it covers when it is
	 * done (wb_done), and may have reached the source before this one:
	 * counted first, and marked under lk, it sees this one and leaves
	 * them dirty.  None out (a background mirror): no lock; a write
	 * listed later counts this one as done before it. */
	atomic_fetch_add(&m->bg_done, 1);
	if (atomic_load(&m->wb_inflight)) {
		pthread_mutex_lock(&m->lk);
		dbm_set(m->dirty, io->offset, len);
		pthread_mutex_unlock(&m->lk);
	} else {
		dbm_set(m->dirty, io->offset, len);
	}
	io->cb = io->up_cb;
	io->up_cb = NULL;
	io->up_priv = NULL;
	atomic_fetch_sub_explicit(&m->writes, 1, memory_order_release);
	io->cb(io, res);
}

/* A background write on the job's thread (counted for yielding). */
static void wdone_here(struct bdev_io *io, int res)
{
	struct mir *m = io->up_priv;

	disk_busy_end(&m->here);
	wdone(io, res);
}

static bool overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	return a < b + blen && b < a + alen;
}

/* A range and the unit out now (under lk): its runs, not their span, which
 * crosses every clean gap between them (a pass over a sparse bitmap spans
 * most of the disk, and every write-blocking write in it was left to the
 * job: the job never caught up with a busy guest). */
static bool in_unit(const struct mir *m, uint64_t off, uint64_t len)
{
	if (!m->u_busy)
		return false;
	for (unsigned i = 0; i < m->u_n; i++)
		if (overlaps(m->u_run[i].off, m->u_run[i].len, off, len))
			return true;
	return false;
}

static void wb_unlist(struct mir *m, struct wbw *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else
		m->wbws = w->next;
	if (w->next)
		w->next->prev = w->prev;
}

/* The guest's write completes: the source's result (the target's never
 * fails it: what the target missed stays dirty for the job). */
static void wb_finish(struct wbw *w)
{
	struct mir *m = w->m;
	struct bdev_io *io = w->gio;
	int res = w->res;

	free(w);
	io->cb = io->up_cb;
	io->up_cb = NULL;
	io->up_priv = NULL;
	atomic_fetch_sub_explicit(&m->wb_inflight, 1, memory_order_release);
	atomic_fetch_sub_explicit(&m->writes, 1, memory_order_release);
	io->cb(io, res);
}

/*
 * Both halves of a write-blocking write done (or the source's alone, for
 * one not written through): the granules it covers whole are clean if
 * it went to the target too, both landed, and no unit of the job started
 * on its range meanwhile (raced: the unit may have read the old data and
 * written it after ours); otherwise it is marked dirty and the job copies
 * it (QEMU's do_sync_target_write, mirror_wait_on_conflicts).
 */
static void wb_done(struct wbw *w)
{
	struct mir *m = w->m;
	uint32_t g = dbm_granularity(m->dirty);
	bool clean = w->through && w->res >= 0 && w->tres >= 0 && !w->raced;

	pthread_mutex_lock(&m->lk);
	/* A write not listed completed while this one was out (wdone): their
	 * order on the source is unknown. */
	if (atomic_load(&m->bg_done) != w->bg_done)
		clean = false;
	wb_unlist(m, w);
	if (clean) {
		uint64_t a = (w->off + g - 1) & ~(uint64_t)(g - 1);
		uint64_t e = (w->off + w->len) & ~(uint64_t)(g - 1);

		if (e > a)
			dbm_reset(m->dirty, a, e - a);
	} else {
		dbm_set(m->dirty, w->off, w->len);
	}
	pthread_mutex_unlock(&m->lk);
	if (clean) {
		atomic_fetch_add_explicit(&m->wb_writes, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&m->wb_bytes, w->len, memory_order_relaxed);
	} else if (w->res >= 0 && w->tres >= 0) {
		atomic_fetch_add_explicit(&m->wb_conflicts, 1, memory_order_relaxed);
	}
	if (w->tres < 0 && atomic_fetch_add(&m->wb_errors, 1) == 0)
		log_warn("mirror %s: a guest write to %s failed (%s): it stays dirty, the job "
			 "copies it again", m->name, m->target, strerror(-w->tres));
	wb_finish(w);
}

static void wb_target_done(struct bdev_io *tio, int res)
{
	struct wbw *w = container_of(tio, struct wbw, tio);

	w->tres = res;
	w->m->tpending[w->tidx]--;
	if (!--w->left)
		wb_done(w);
}

static void wb_source_done(struct bdev_io *io, int res)
{
	struct wbw *w = io->up_priv;

	w->res = res;
	if (!--w->left)
		wb_done(w);
}

/*
 * A write-blocking write goes to the source and to the target at once
 * (the guest waits for the slower, not for both in turn), if nobody else
 * has a range of it in flight: not the job's unit (it may have read the
 * old data and write it after ours), nor another write (their order on
 * the source is unknown).  A unit that starts on its range while it is
 * out, or another write of its range, makes it raced (mir_step, here):
 * it then leaves the range dirty too.  Otherwise, or for a discard (what the
 * disk reads after it is the format's), it goes to the source alone and
 * is marked dirty as it completes: the job copies it.
 */
static void wsubmit(void *opaque, struct disk_iothread *t, struct bdev_io *io)
{
	struct mir *m = opaque;
	struct wbw *w = NULL;

	atomic_fetch_add_explicit(&m->writes, 1, memory_order_relaxed);
	io->up_cb = io->cb;
	if (atomic_load_explicit(&m->mode, memory_order_acquire) == MIR_WRITE_BLOCKING &&
	    t->idx < m->ntctx && m->tctxs[t->idx] && (w = calloc(1, sizeof(*w)))) {
		w->m = m;
		w->gio = io;
		w->off = io->offset;
		w->len = io->op == BDEV_WRITE ? iov_size(io->iov, io->iovcnt) : io->length;
		w->tidx = t->idx;
		w->through = io->op == BDEV_WRITE ||
			     (io->op == BDEV_WRITE_ZEROES && (m->tgt->caps & BDEV_CAP_WRITE_ZEROES));
		/* Counted before bg_done is read (wdone). */
		atomic_fetch_add(&m->wb_inflight, 1);
		pthread_mutex_lock(&m->lk);
		w->bg_done = atomic_load(&m->bg_done);
		if (w->through && in_unit(m, w->off, w->len))
			w->through = false;
		/* Two writes of one range out at once: their order on the
		 * source is unknown, so neither leaves it clean. */
		for (struct wbw *o = m->wbws; o; o = o->next)
			if (overlaps(o->off, o->len, w->off, w->len)) {
				w->through = false;
				o->raced = true;
			}
		w->next = m->wbws;
		if (w->next)
			w->next->prev = w;
		m->wbws = w;
		pthread_mutex_unlock(&m->lk);
		io->up_priv = w;
		io->cb = wb_source_done;
		w->left = w->through ? 2 : 1;
		if (w->through) {
			if (io->op == BDEV_WRITE)
				w->tio = (struct bdev_io){ .op = BDEV_WRITE, .offset = w->off,
							   .iov = io->iov, .iovcnt = io->iovcnt,
							   .cb = wb_target_done };
			else
				w->tio = (struct bdev_io){ .op = BDEV_WRITE_ZEROES,
							   .offset = w->off, .length = w->len,
							   .unmap = io->unmap,
							   .cb = wb_target_done };
			m->tpending[w->tidx]++;
			bdev_submit(m->tgt, m->tctxs[w->tidx], &w->tio);
			m->tgt->engine->kick(m->tctxs[w->tidx]);
		}
	} else {
		/* Background mode (or a thread with no target connection):
		 * marked as it completes. */
		io->up_priv = m;
		io->cb = wdone;
		if (t == m->t) {
			disk_busy_begin(&m->here, t->loop);
			io->cb = wdone_here;
		}
	}
	bdev_submit(m->d->b, t->bctx, io);
}

/* A ring stops (disk_drain): the writes t has out to the target done. */
static void wdrain(void *opaque, struct disk_iothread *t)
{
	struct mir *m = opaque;

	if (t->idx >= m->ntctx || !m->tctxs[t->idx])
		return;
	while (m->tpending[t->idx]) {
		m->tgt->engine->drain(m->tctxs[t->idx]);
		m->d->b->engine->drain(t->bctx);
	}
}

/* ---- The job's loop ------------------------------------------------------ */

/* The job waits for the guest now ("Yielding" above): the job's thread. */
static bool yielding(struct mir *m)
{
	return atomic_load_explicit(&m->yield, memory_order_relaxed) && m->ready && !m->completing &&
	       atomic_load_explicit(&m->mode, memory_order_relaxed) == MIR_BACKGROUND &&
	       atomic_load(&m->sync_done) >= atomic_load(&m->sync_req) &&
	       disk_busy_now(&m->here, m->t->loop, MIR_BUSY_NS);
}

/* The job's work since t0 is owed to the guest while it is busy. */
static void charge(struct mir *m, uint64_t t0)
{
	uint64_t now = sys_now_ns();

	if (yielding(m))
		m->owed = MAX(m->owed, now) + (now - t0) * MIR_YIELD_K;
}

/* One run of the unit done (written, or failed): the last one ends the
 * unit, its range no longer in flight. */
static void op_end(struct mir_op *op, int res)
{
	struct mir *m = op->m;

	if (res < 0) {
		/* Copied again by a later pass (the error policy may pause
		 * the job first). */
		dbm_set(m->dirty, op->off, op->len);
		if (!m->unit_res)
			m->unit_res = res;
	} else {
		atomic_fetch_add_explicit(&m->zeroed, op->zbytes, memory_order_relaxed);
		atomic_fetch_add_explicit(&m->copied, op->len - op->zbytes, memory_order_relaxed);
		m->unit_bytes += op->len;
	}
	if (--m->left)
		return;
	pthread_mutex_lock(&m->lk);
	m->u_busy = false;
	pthread_mutex_unlock(&m->lk);
	job_step_done(m->job, m->unit_res, m->unit_bytes);
}

static void op_written_1(struct bdev_io *io, int res);

/* A write's completion is the job's work too. */
static void op_written(struct bdev_io *io, int res)
{
	struct mir *m = container_of(io, struct mir_w, io)->op->m;
	uint64_t t0 = sys_now_ns();

	op_written_1(io, res);
	charge(m, t0);
}

static void op_written_1(struct bdev_io *io, int res)
{
	struct mir_op *op = container_of(io, struct mir_w, io)->op;

	if (res < 0 && !op->wres) {
		op->wres = res;
		if (!op->m->unit_res)
			job_set_error(op->m->job, "writing %llu bytes at %llu to %s failed: %s",
				      (unsigned long long)op->len, (unsigned long long)op->off,
				      op->m->target, strerror(-res));
	}
	if (--op->wleft)
		return;
	op_end(op, op->wres);
}

static void op_add_write(struct mir_op *op, uint64_t off, uint64_t len, bool zero)
{
	struct mir_w *w = &op->w[op->nw++];

	w->op = op;
	if (zero) {
		w->io = (struct bdev_io){ .op = BDEV_WRITE_ZEROES, .offset = off, .length = len,
					  .unmap = true, .cb = op_written };
		op->zbytes += len;
	} else {
		w->iov = (struct iovec){ (uint8_t *)op->iov.iov_base + (off - op->off), len };
		w->io = (struct bdev_io){ .op = BDEV_WRITE, .offset = off, .iov = &w->iov,
					  .iovcnt = 1, .cb = op_written };
	}
}

/*
 * A run read: its pieces, each MIR_ZERO_GRAIN-aligned stretch of zeroes
 * or of data a write of its own (zeroes as write zeroes: unmapped where
 * the target can), or the whole as one write of data where the target
 * writes no zeroes.
 */
static void op_split(struct mir_op *op)
{
	const uint8_t *p = op->iov.iov_base;
	bool can = op->m->tgt->caps & BDEV_CAP_WRITE_ZEROES;
	uint64_t start = op->off, end = op->off + op->len, at = start;
	bool zero = false;

	op->nw = 0;
	op->zbytes = 0;
	if (!can) {
		op_add_write(op, start, op->len, false);
		return;
	}
	while (at < end) {
		uint64_t next = MIN(end, (at / MIR_ZERO_GRAIN + 1) * MIR_ZERO_GRAIN);
		bool z = buf_is_zero(p + (at - op->off), next - at);

		if (at == start) {
			zero = z;
		} else if (z != zero) {
			op_add_write(op, start, at - start, zero);
			start = at;
			zero = z;
		}
		at = next;
	}
	op_add_write(op, start, end - start, zero);
}

static void op_write(struct mir_op *op)
{
	struct mir *m = op->m;

	op->wleft = op->nw;
	op->wres = 0;
	for (unsigned i = 0; i < op->nw; i++)
		bdev_submit(m->tgt, m->tctx, &op->w[i].io);
}

static void op_read_1(struct bdev_io *io, int res);

/* A read's completion (the run's writes go out from here) is the job's
 * work too. */
static void op_read(struct bdev_io *io, int res)
{
	struct mir *m = container_of(io, struct mir_op, rio)->m;
	uint64_t t0 = sys_now_ns();

	op_read_1(io, res);
	charge(m, t0);
}

static void op_read_1(struct bdev_io *io, int res)
{
	struct mir_op *op = container_of(io, struct mir_op, rio);
	struct mir *m = op->m;

	if (res < 0) {
		if (!m->unit_res)
			job_set_error(m->job, "reading %llu bytes at %llu failed: %s",
				      (unsigned long long)op->len, (unsigned long long)op->off,
				      strerror(-res));
		op_end(op, res);
		return;
	}
	op_split(op);
	op_write(op);
	m->tgt->engine->kick(m->tctx);
}

static void flush_done(struct bdev_io *io, int res)
{
	struct mir *m = container_of(io, struct mir, fio);

	m->fio_busy = false;
	if (res < 0) {
		job_set_error(m->job, "flushing %s failed: %s", m->target, strerror(-res));
	} else {
		m->flushed = true;
		if (!dbm_dirty_bytes(m->dirty))
			atomic_store(&m->sync_done, m->flush_gen);
	}
	job_step_done(m->job, res, 0);
}

static int step(struct job *j, void *priv)
{
	struct mir *m = priv;
	uint64_t len = 0;

	if (!m->t0)
		m->t0 = sys_now_ns();
	/* A pivot under way or done: no unit (nothing to copy once done:
	 * the target is the disk). */
	if (atomic_load_explicit(&m->hold, memory_order_acquire)) {
		if (!m->pivoted)
			loop_timer_mod(m->poll, sys_now_ns() + MIR_READY_POLL_NS);
		return JOB_STEP_END;
	}
	/* The next dirty runs from the cursor (this pass).  Where the
	 * disk's block status costs nothing (qcow2), a run ends where it
	 * changes between data and zeroes (QEMU's mirror_iteration asks
	 * it too): zeroes go as write zeroes, and a sparse target stays
	 * so, not filled by a run's data around them. */
	bool cheap = fmt_block_status_cheap(m->d->b);
	uint32_t g = dbm_granularity(m->dirty);
	uint64_t t0 = sys_now_ns();

	if (m->owed > t0 && yielding(m)) {
		/* Looked at again within MIR_BUSY_NS: a guest gone quiet
		 * gets the job going at once, not after all it owes. */
		loop_timer_mod(m->poll, MIN(m->owed, t0 + MIR_BUSY_NS));
		atomic_fetch_add_explicit(&m->yields, 1, memory_order_relaxed);
		return JOB_STEP_END;
	}

	m->nops = 0;
	while (m->nops < MIR_PAR && m->cursor < m->size) {
		struct fmt_extent e = { 0 };
		bool zero = false;

		if (!dbm_extent(m->dirty, m->cursor, MIR_UNIT_MAX, &len)) {
			m->cursor += len;
			continue;
		}
		/* Cut on a granule's edge only: dbm_reset clears whole
		 * granules, and a granule split between two runs would stay
		 * dirty pass after pass.  A status that changes inside the
		 * first granule is not followed (op_split keeps the target
		 * sparse then). */
		if (cheap && fmt_block_status(m->d->b, m->cursor, len, &e) == 0) {
			uint64_t cut = e.length >= len ? len :
				       ((m->cursor + e.length) & ~(uint64_t)(g - 1)) - m->cursor;

			if (cut) {
				len = cut;
				zero = e.flags & FMT_EXT_ZERO;
			}
		}
		/* Field by field: the op's pieces (w[]) are set as used. */
		struct mir_op *op = &m->ops[m->nops++];

		op->m = m;
		op->off = m->cursor;
		op->len = len;
		op->zero = zero;
		m->cursor += len;
	}
	if (!m->nops) {
		m->cursor = 0;
		if (dbm_dirty_bytes(m->dirty)) {
			atomic_fetch_add(&m->passes, 1);
			return JOB_STEP_YIELD;	/* the next pass */
		}
		uint64_t want = atomic_load(&m->sync_req);

		if (!m->flushed || want != m->flush_gen) {
			/* A flush asked for by mir_sync covers every write
			 * done before it asked. */
			m->flush_gen = want;
			m->fio = (struct bdev_io){ .op = BDEV_FLUSH, .cb = flush_done };
			m->fio_busy = true;
			bdev_submit(m->tgt, m->tctx, &m->fio);
			m->tgt->engine->kick(m->tctx);
			return JOB_STEP_IO;
		}
		if (!m->ready) {
			m->ready = true;
			atomic_fetch_add(&m->passes, 1);
			atomic_store(&m->ready_ns, sys_now_ns() - m->t0);
			log_info("mirror %s: ready after %u passes in %.1f s: the target has the "
				 "disk; what the guest writes goes on being copied", m->name,
				 atomic_load(&m->passes), (double)atomic_load(&m->ready_ns) / 1e9);
		}
		loop_timer_mod(m->poll, sys_now_ns() + MIR_READY_POLL_NS);
		return JOB_STEP_END;
	}
	m->flushed = false;
	m->left = m->nops;
	m->unit_res = 0;
	m->unit_bytes = 0;
	/* Taken before the copy: a write from now on marks it again (and a
	 * write-blocking one submitted while the unit is out leaves the
	 * target to it: wsubmit, wb_done).  The unit's ranges are its runs
	 * (in_unit). */
	pthread_mutex_lock(&m->lk);
	m->u_busy = true;
	m->u_n = m->nops;
	for (unsigned i = 0; i < m->nops; i++) {
		m->u_run[i].off = m->ops[i].off;
		m->u_run[i].len = m->ops[i].len;
		dbm_reset(m->dirty, m->ops[i].off, m->ops[i].len);
	}
	/* A write-blocking write out there now may land on the target
	 * before what the unit read (the old data): it leaves the range
	 * dirty (wb_done). */
	for (struct wbw *o = m->wbws; o; o = o->next)
		if (in_unit(m, o->off, o->len))
			o->raced = true;
	pthread_mutex_unlock(&m->lk);
	job_set_progress(j, m->size - dbm_dirty_bytes(m->dirty), m->size);
	for (unsigned i = 0; i < m->nops; i++) {
		struct mir_op *op = &m->ops[i];

		op->iov = (struct iovec){ m->buf + (size_t)i * MIR_UNIT_MAX, op->len };
		/* The status where it costs nothing (above); a raw file's
		 * lseek walks tmpfs's page cache to the next hole: read, and
		 * look (op_read). */
		op->nw = 0;
		op->zbytes = 0;
		if (op->zero && (m->tgt->caps & BDEV_CAP_WRITE_ZEROES)) {
			op_add_write(op, op->off, op->len, true);
			op_write(op);
			continue;
		}
		op->rio = (struct bdev_io){ .op = BDEV_READ, .offset = op->off, .iov = &op->iov,
					    .iovcnt = 1, .cb = op_read };
		disk_submit(m->d, m->t, &op->rio);
	}
	/* Completions may run inside these (a read answered at once): the
	 * unit's state is set up before. */
	m->tgt->engine->kick(m->tctx);
	disk_kick(m->d, m->t);
	charge(m, t0);
	return JOB_STEP_IO;
}

static void poll_cb(void *opaque)
{
	struct mir *m = opaque;

	if (!atomic_load(&m->ended))
		job_kick(m->job);
}

static int complete(struct job *j, void *priv, char *msg, size_t len)
{
	struct mir *m = priv;
	uint64_t left = dbm_dirty_bytes(m->dirty);

	if (m->pivoted) {
		snprintf(msg, len, "the disk is %s now (%u passes, %" PRIu64 " bytes copied, %"
			 PRIu64 " written as zeroes)", m->target, atomic_load(&m->passes),
			 atomic_load(&m->copied), atomic_load(&m->zeroed));
		return 0;
	}
	if (left || !m->flushed) {
		/* Asked to end: the job stops yielding to the guest, so that
		 * it converges unless the guest outwrites the whole thread. */
		m->completing = true;
		snprintf(msg, len, "%" PRIu64 " bytes written since are still to be copied: "
			 "complete it again in a moment (or stop the writes, or mirror change "
			 "--mode write-blocking)", left);
		return -EAGAIN;
	}
	snprintf(msg, len, "the target %s has the disk (%u passes, %" PRIu64 " bytes copied, %"
		 PRIu64 " written as zeroes)", m->target, atomic_load(&m->passes),
		 atomic_load(&m->copied), atomic_load(&m->zeroed));
	return 0;
}

static void end(struct job *j, void *priv)
{
	struct mir *m = priv;

	loop_timer_del(m->poll);
	atomic_store(&m->ended, true);
	if (!m->by_main)
		sys_eventfd_signal(m->set->efd);
}

static void progress(void *priv, uint64_t *done, uint64_t *total)
{
	struct mir *m = priv;

	*total = m->size;
	*done = m->size - MIN(m->size, m->gone ? m->final_dirty : dbm_dirty_bytes(m->dirty));
}

static void teardown(struct mir *m, bool remove_target);

/* The job is dismissed (vblkctl job dismiss, or the job list's trim of
 * old ones; main thread): off the set's list before it is freed (the
 * list is walked by mirror list, set_reap and mir_set_free), torn down
 * first if set_reap has not seen its end yet.  At exit the set goes
 * first (m->set NULL). */
static void mir_free(void *priv)
{
	struct mir *m = priv;

	if (!m->done && m->set)
		teardown(m, false);
	for (struct mir **p = m->set ? &m->set->list : NULL; p && *p; p = &(*p)->next)
		if (*p == m) {
			*p = m->next;
			break;
		}
	if (m->lk_init)
		pthread_mutex_destroy(&m->lk);
	free(m);
}

static int mir_pivot(void *priv, char *err, size_t errlen);
static bool is_uri(const char *t);

static const struct job_ops mir_ops = {
	.type = "mirror",
	.step = step,
	.complete = complete,
	.prepare_complete = mir_pivot,
	.end = end,
	.free = mir_free,
	.progress = progress,
};

/* ---- Main thread ---------------------------------------------------------- */

const char *mir_mode_name(enum mir_mode mode)
{
	return mode == MIR_WRITE_BLOCKING ? "write-blocking" : "background";
}

int mir_mode_parse(const char *s, enum mir_mode *out)
{
	if (!strcmp(s, "background"))
		*out = MIR_BACKGROUND;
	else if (!strcmp(s, "write-blocking"))
		*out = MIR_WRITE_BLOCKING;
	else
		return -EINVAL;
	return 0;
}

/* The mode, and the bitmap's marks before submission with it: a
 * write-blocking write marks what it leaves to the job itself (else its
 * own mark would outlive its copy).  Enabled before background mode
 * takes writes, disabled after write-blocking does. */
static void set_mode(struct mir *m, enum mir_mode mode)
{
	if (mode == MIR_BACKGROUND)
		atomic_store(&m->dirty->enabled, true);
	atomic_store_explicit(&m->mode, mode, memory_order_release);
	if (mode == MIR_WRITE_BLOCKING)
		atomic_store(&m->dirty->enabled, false);
}

static void do_kick(void *opaque)
{
	poll_cb(opaque);
}

/*
 * A migration's switch-over (disk_switchover: the last ring stopped):
 * the job copies what is dirty and flushes the target; wait for a flush
 * asked after now that found nothing dirty.  No front of the guest
 * writes meanwhile (an NBD client's write may: it is copied too).
 */
static int sync_target(struct mir *m, bool pivot)
{
	const char *when = pivot ? "for the pivot" : "at the switch-over";
	uint64_t g = atomic_fetch_add(&m->sync_req, 1) + 1, t0 = sys_now_ns(), next = t0;
	uint64_t rate = 0, seen = UINT64_MAX, moved = t0;
	struct job_info ji[16];
	unsigned nj = job_list(ji, ARRAY_SIZE(ji));
	char e[200];
	int r = 0;

	/* The guest waits now: the job's rate limit does not apply. */
	for (unsigned i = 0; i < nj && i < ARRAY_SIZE(ji); i++)
		if (!strcmp(ji[i].id, m->job_id))
			rate = ji[i].rate;
	if (rate)
		(void)job_set_rate(m->job_id, 0, e, sizeof(e));

	while (atomic_load(&m->sync_done) < g) {
		uint64_t now = sys_now_ns();

		if (atomic_load(&m->ended)) {
			log_err("mirror %s: ended before %s had every write the guest saw complete "
				"%s: %s", m->name, m->target, when,
				pivot ? "the disk stays where it is" :
				"do not start the guest from the target");
			r = -EIO;
			break;
		}
		/* Stalled (the target unreachable): the destination is behind,
		 * and waiting longer freezes this daemon's main thread. */
		uint64_t sig = dbm_dirty_bytes(m->dirty) + atomic_load(&m->copied) +
			       atomic_load(&m->zeroed) + atomic_load(&m->sync_done);

		if (sig != seen) {
			seen = sig;
			moved = now;
		} else if (now - moved > MIR_SYNC_STALL_NS) {
			log_err("mirror %s: nothing reached %s for %llu s %s: it lacks %" PRIu64
				" bytes the guest wrote: %s", m->name, m->target,
				MIR_SYNC_STALL_NS / 1000000000ull, when, dbm_dirty_bytes(m->dirty),
				pivot ? "the disk stays where it is" :
				"do not run the guest there (cancel the migration)");
			r = -ETIMEDOUT;
			break;
		}
		if (now >= next) {
			if (next != t0)
				log_info("mirror %s: %s: %" PRIu64 " bytes still to copy to %s",
					 m->name, pivot ? "pivoting" : "the guest's rings stopped",
					 dbm_dirty_bytes(m->dirty), m->target);
			next = now + 5000000000ull;
		}
		loop_call_sync(m->t->loop, do_kick, m);
		usleep(500);
	}
	if (!r && !pivot)
		log_info("mirror %s: the guest's rings stopped: %s has every write they "
			 "completed, flushed (%.1f ms)", m->name, m->target,
			 (double)(sys_now_ns() - t0) / 1e6);
	if (rate && !atomic_load(&m->ended))
		(void)job_set_rate(m->job_id, rate, e, sizeof(e));
	return r;
}

static int wsync(void *opaque)
{
	return sync_target(opaque, false);
}

/* ---- The pivot (main thread, every iothread parked around it) ------------ */

static void pivot_flushed(struct bdev_io *io, int res)
{
	struct mir *m = container_of(io, struct mir, pfio);

	m->pfio_res = res;
	m->pfio_done = true;
}

/* Parked iothread t: the job's unit and flush, and the write-blocking
 * writes t has out to the target, completed (hold keeps the job from
 * starting another). */
static void pivot_quiesce(void *opaque, struct disk_iothread *t)
{
	struct mir *m = opaque;
	struct bdev_ctx *x = t->idx < m->ntctx ? m->tctxs[t->idx] : NULL;

	if (!x)
		return;
	for (;;) {
		m->tgt->engine->kick(x);
		m->tgt->engine->drain(x);
		disk_kick(m->d, t);
		m->d->b->engine->drain(t->bctx);
		if (m->tpending[t->idx])
			continue;
		if (t->idx == 0 && (m->u_busy || m->fio_busy))
			continue;
		break;
	}
	/* A qcow2 target (one iothread: replace refuses more): what its
	 * writes allocated made durable, tables and all, here where they
	 * are this thread's; a raw one is synced in pivot_ready, every
	 * thread parked. */
	if (t->idx == 0 && m->tgt != m->tfile) {
		m->pfio_done = false;
		m->pfio = (struct bdev_io){ .op = BDEV_FLUSH, .cb = pivot_flushed };
		bdev_submit(m->tgt, x, &m->pfio);
		while (!m->pfio_done) {
			m->tgt->engine->kick(x);
			m->tgt->engine->drain(x);
		}
	}
}

/* Every iothread parked: the switch is right if the target has every
 * write completed so far (nothing dirty, none in flight), on stable
 * storage. */
static int pivot_ready(void *opaque, char *err, size_t errlen)
{
	struct mir *m = opaque;

	if (atomic_load(&m->ended)) {
		snprintf(err, errlen, "the mirror's job ended meanwhile");
		return -EIO;
	}
	if (dbm_dirty_bytes(m->dirty) || m->u_busy || atomic_load(&m->writes) ||
	    atomic_load(&m->wb_inflight))
		return -EAGAIN;
	if (m->tgt != m->tfile) {
		if (m->pfio_res < 0)
			snprintf(err, errlen, "flushing %s failed: %s", m->target,
				 strerror(-m->pfio_res));
		return m->pfio_res;
	}
	if (fdatasync(m->tfile->fd) < 0) {
		int e = errno;

		snprintf(err, errlen, "flushing %s failed: %s", m->target, strerror(e));
		return -e;
	}
	return 0;
}

/* Tries before a pivot gives up: each syncs the target, then parks the
 * iothreads and finds nothing new dirty (write-blocking mode from the
 * first: only a write racing the last unit can spoil one). */
#define MIR_PIVOT_TRIES 20

/*
 * vblkctl job complete of a mirror to a local path (QEMU's
 * block-job-complete of a mirror): the target, as the mirror opened it
 * (raw, or qcow2 with its tables as its writes left them), becomes the
 * disk, every front going on with it; the old image is let go and
 * closed.  An NBD target: nothing here (the job concludes, the target
 * has the disk).
 */
static int mir_pivot(void *priv, char *err, size_t errlen)
{
	struct mir *m = priv;
	struct disk *d = m->d;
	enum mir_mode mode = atomic_load(&m->mode);
	struct disk_quiesce q = { .quiesce = pivot_quiesce, .ready = pivot_ready, .opaque = m };
	struct disk_image ni = { .b = m->tgt, .file = m->tfile, .ctx = m->tctxs, .held = true };
	struct bdev *ob = NULL, *of = NULL;
	char old[sizeof(m->target)];
	struct job_info ji[16];
	unsigned nj = job_list(ji, ARRAY_SIZE(ji));
	int r = 0;

	if (is_uri(m->target))
		return 0;
	for (unsigned i = 0; i < nj && i < ARRAY_SIZE(ji); i++)
		if (strcmp(ji[i].id, m->job_id) && ji[i].state != JOB_CONCLUDED) {
			snprintf(err, errlen, "job %s (%s) runs on the disk: the disk cannot move "
				 "under it; let it end or cancel it first", ji[i].id, ji[i].type);
			return -EBUSY;
		}
	if (m->ntctx < d->num_iothreads) {
		snprintf(err, errlen, "%s is a qcow2 image, served from one iothread, and the disk "
			 "has %u: cancel the job (the target keeps the copy) and serve it with "
			 "--iothreads 1, or mirror to a raw target", m->target, d->num_iothreads);
		return -EINVAL;
	}
	/* From here every write the guest sees complete is on the target
	 * too, or marked for the job: each try converges at once. */
	set_mode(m, MIR_WRITE_BLOCKING);
	for (unsigned tries = 1;; tries++) {
		atomic_store(&m->hold, false);
		r = sync_target(m, true);
		if (r < 0) {
			snprintf(err, errlen, "the target %s could not be brought up to date: the "
				 "disk stays where it is", m->target);
			break;
		}
		atomic_store_explicit(&m->hold, true, memory_order_release);
		r = disk_replace_image(d, &ni, &q, &ob, &of, err, errlen);
		if (r == 0)
			m->pivoted = true;
		if (r != -EAGAIN)
			break;
		if (tries == MIR_PIVOT_TRIES) {
			snprintf(err, errlen, "the guest's writes kept %s behind in %u tries: try "
				 "again", m->target, tries);
			break;
		}
	}
	if (r < 0) {
		atomic_store(&m->hold, false);
		set_mode(m, mode);
		loop_call_sync(m->t->loop, do_kick, m);
		return r;
	}
	/* The target, its ctxs and its claim are the disk's now, and the
	 * disk's filter is gone with the old image (disk_replace_image):
	 * teardown leaves them be.  The job starts nothing more (hold). */
	for (unsigned i = 0; i < m->ntctx; i++)
		m->tctxs[i] = NULL;
	m->tctx = NULL;
	m->tgt = m->tfile = NULL;
	m->tgt_open = m->held = false;
	m->filtered = false;
	snprintf(old, sizeof(old), "%s", ob->path);
	bool heap = of->heap;

	if (disk_close_image(ob, of) < 0)
		log_err("mirror %s: the old image %s did not close cleanly (its tables could not "
			"be written back): nothing the guest wrote since the pivot is in it",
			m->name, old);
	/* The old image was an earlier mirror's target (a second pivot):
	 * its struct is freed with it (vblkd's own is static). */
	if (heap)
		free(of);
	log_info("mirror %s: the disk is %s now (was %s, closed): restart vblkd with --disk %s "
		 "--format %s from now on", m->name, m->target, old, m->target,
		 fmt_kind_name(m->tkind));
	return 0;
}

struct tcall {
	struct mir *m;
	unsigned i;
};

/* On iothread i: its ctx of the target (and the job's timer on 0). */
static void do_tctx_new(void *opaque)
{
	struct tcall *c = opaque;
	struct mir *m = c->m;

	/* A local target's ctxs become the disk's at the pivot: the depth
	 * of the disk's own (disk.c do_ctx_new). */
	if (bdev_ctx_new(m->tgt, m->d->iot[c->i].loop, is_uri(m->target) ? 64 : 1024,
			 &m->tctxs[c->i]) < 0)
		m->tctxs[c->i] = NULL;
	if (c->i == 0 && loop_timer_new(m->t->loop, poll_cb, m, &m->poll) < 0)
		m->poll = NULL;
}

static void do_tctx_free(void *opaque)
{
	struct tcall *c = opaque;
	struct mir *m = c->m;
	struct bdev_ctx *x = m->tctxs[c->i];

	if (x) {
		m->tgt->engine->drain(x);
		m->tgt->engine->ctx_free(x);
	}
	m->tctxs[c->i] = NULL;
	if (c->i)
		return;
	m->tctx = NULL;
	loop_timer_free(m->poll);
	m->poll = NULL;
	/* The bitmap goes next: progress (the job's list, on this loop)
	 * keeps what it said last. */
	m->final_dirty = m->dirty ? dbm_dirty_bytes(m->dirty) : 0;
	m->gone = true;
}

static void tctxs_free(struct mir *m)
{
	for (unsigned i = m->ntctx; i-- > 0;)
		loop_call_sync(m->d->iot[i].loop, do_tctx_free, &(struct tcall){ m, i });
	free(m->tctxs);
	free(m->tpending);
	m->tctxs = NULL;
	m->tpending = NULL;
	m->ntctx = 0;
}

/* A ctx of the target on each iothread the target can take (one
 * connection for an NBD server without multi-conn): 0 or -EIO. */
static int tctxs_new(struct mir *m)
{
	unsigned n = m->d->num_iothreads;

	if (m->tgt->max_ctxs && m->tgt->max_ctxs < n)
		n = m->tgt->max_ctxs;
	m->tctxs = calloc(m->d->num_iothreads, sizeof(*m->tctxs));
	m->tpending = calloc(m->d->num_iothreads, sizeof(*m->tpending));
	if (!m->tctxs || !m->tpending)
		return -ENOMEM;
	m->ntctx = n;
	for (unsigned i = 0; i < n; i++) {
		loop_call_sync(m->d->iot[i].loop, do_tctx_new, &(struct tcall){ m, i });
		if (!m->tctxs[i] || (i == 0 && !m->poll))
			return -EIO;
	}
	m->tctx = m->tctxs[0];
	return 0;
}

/* Everything start took, let go (the struct stays for the job). */
static void teardown(struct mir *m, bool remove_target)
{
	if (m->filtered) {
		/* Write-blocking writes done first, the filter still set: a
		 * front that drains meanwhile (an NBD connection closing on
		 * its iothread) waits for them through wdrain, which it could
		 * not once the filter is gone. */
		set_mode(m, MIR_BACKGROUND);
		/* No iothread still inside wsubmit under the old mode. */
		disk_grace(m->d);
		while (atomic_load_explicit(&m->wb_inflight, memory_order_acquire))
			usleep(100);
		(void)disk_wfilter_set(m->d, NULL);
		/* A write in flight completes through wdone, which uses m. */
		while (atomic_load_explicit(&m->writes, memory_order_acquire))
			usleep(100);
	}
	m->filtered = false;
	/* A local target let go as a disk lets go of its image: a qcow2's
	 * tables written back on its thread, before its ctx goes. */
	if (m->held) {
		fmt_release(m->tgt);
		bdev_unlock(m->tgt);
	}
	m->held = false;
	if (m->tctxs)
		tctxs_free(m);
	if (m->dirty)
		disk_bitmap_hidden_remove(m->d, m->dirty);
	m->dirty = NULL;
	if (m->tgt_open && disk_close_image(m->tgt, m->tfile) < 0)
		log_err("mirror %s: the target %s did not close cleanly (its tables could not be "
			"written back)", m->name, m->target);
	m->tgt_open = false;
	free(m->tfile);
	m->tfile = m->tgt = NULL;
	if (remove_target && m->made)
		unlink(m->target);
	if (m->claimed)
		disk_release(m->d);
	m->claimed = false;
	free(m->buf);
	m->buf = NULL;
	m->done = true;
}

static bool is_uri(const char *t)
{
	return !strncmp(t, "nbd://", 6) || !strncmp(t, "nbds://", 7) || !strncmp(t, "nbd+", 4);
}

/*
 * A local target: made at the disk's size if it is not there, as the
 * caller asked (QEMU's drive-mirror: the disk's own format by default,
 * raw for a raw or LUKS one), else opened as what it is.  0, or -errno
 * with one line in err.
 */
static int open_local(struct mir *m, enum fmt_kind want, char *err, size_t errlen)
{
	struct bdev_opts bo = { .path = m->target, .cache = BDEV_CACHE_AUTO };
	struct fmt_opts fo = { .kind = want, .bo = &bo };
	int r;

	if (access(m->target, F_OK) < 0 && errno == ENOENT) {
		if (want == FMT_AUTO)
			want = fmt_kind_of(m->d->b) == FMT_QCOW2 ? FMT_QCOW2 : FMT_RAW;
		if ((r = fmt_create(m->target, want, m->size, err, errlen)) < 0)
			return r;
		m->made = true;
		fo.kind = want;
	}
	r = disk_open_image(&bo, &fo, 1, m->tfile, &m->tgt, err, errlen);
	if (r < 0)
		return r;
	m->tfile->heap = true;	/* calloc'd in mir_start: a later pivot frees it */
	m->tgt_open = true;
	m->tkind = fmt_kind_of(m->tgt);
	/* A mirror is a whole copy: a backing file under the target has no
	 * place, and one found by probing a file that was raw (a guest's
	 * own data that starts like a qcow2 header) is a path of the
	 * guest's choosing (QEMU's rule for probed images). */
	if (m->tkind == FMT_QCOW2 && fmt_has_backing(m->tgt)) {
		snprintf(err, errlen, "target %s is a qcow2 image with a backing file: give a "
			 "new path, or an image of its own (qemu-img create -f qcow2)%s", m->target,
			 want == FMT_AUTO ? ", or --format raw if it holds a raw disk" : "");
		return -EINVAL;
	}
	if (m->tkind == FMT_LUKS) {
		snprintf(err, errlen, "target %s is a LUKS volume: vblkd mirrors to a raw or qcow2 "
			 "image", m->target);
		return -EINVAL;
	}
	return 0;
}

/* A local target held as a disk holds its image (disk_claim): locked
 * against other writers, a qcow2's tables read.  0, or -errno with one
 * line in err. */
static int hold_local(struct mir *m, char *err, size_t errlen)
{
	int r = bdev_lock(m->tgt, 0);

	if (r < 0) {
		snprintf(err, errlen, "target %s is in use: another process writes it", m->target);
		return r;
	}
	if ((r = fmt_claim(m->tgt, err, errlen)) < 0) {
		bdev_unlock(m->tgt);
		return r;
	}
	m->held = true;
	return 0;
}

static struct mir *find(struct mir_set *s, const char *name)
{
	for (struct mir *m = s->list; m; m = m->next)
		if (!m->done && !strcmp(m->name, name))
			return m;
	return NULL;
}

/* Bits of the default bitmap at most: 2 MiB of it. */
#define MIR_DEFAULT_BITS (1ull << 24)

uint32_t mir_default_granularity(uint64_t size)
{
	uint32_t g = DBM_MIN_GRANULARITY;

	while (g < MIR_UNIT_MAX && size / g > MIR_DEFAULT_BITS)
		g <<= 1;
	return g;
}

int mir_start(struct mir_set *s, const struct mir_start_opts *o, char *id, size_t idlen,
	      char *err, size_t errlen)
{
	struct disk *d = s->d;
	uint32_t gran = o->granularity ? o->granularity :
			mir_default_granularity(READ_ONCE(d->b->size));
	struct bdev_opts bo = { .cache = BDEV_CACHE_AUTO };
	struct mir *m;
	int r;

	if (!o->name || !dbm_name_ok(o->name)) {
		snprintf(err, errlen, "mirror name '%.80s': give 1 to %u of A-Z a-z 0-9 _ . -",
			 o->name ? o->name : "", DBM_NAME_MAX);
		return -EINVAL;
	}
	if (find(s, o->name)) {
		snprintf(err, errlen, "a mirror named '%s' runs already", o->name);
		return -EEXIST;
	}
	if (!o->target || !o->target[0] || strlen(o->target) >= sizeof(m->target)) {
		snprintf(err, errlen, "give --target: an NBD URI or a local path");
		return -EINVAL;
	}
	if (gran < DBM_MIN_GRANULARITY || gran > MIR_UNIT_MAX || (gran & (gran - 1))) {
		snprintf(err, errlen, "granularity %u: give a power of two from 4K to 1M", gran);
		return -EINVAL;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (pthread_mutex_init(&m->lk, NULL)) {
		free(m);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	m->lk_init = true;
	m->set = s;
	m->d = d;
	m->t = &d->iot[0];
	m->size = READ_ONCE(d->b->size);
	snprintf(m->name, sizeof(m->name), "%s", o->name);
	snprintf(m->target, sizeof(m->target), "%s", o->target);
	if (posix_memalign((void **)&m->buf, 4096, (size_t)MIR_PAR * MIR_UNIT_MAX)) {
		m->buf = NULL;
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	m->tfile = calloc(1, sizeof(*m->tfile));
	if (!m->tfile) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	if (is_uri(m->target)) {
		if (o->format != FMT_AUTO && o->format != FMT_RAW) {
			snprintf(err, errlen, "target %s: an NBD export is written as the server "
				 "exports it: drop --format", m->target);
			r = -EINVAL;
			goto fail;
		}
		bo.path = m->target;
		r = bdev_open(&bo, m->tfile, err, errlen);
		if (r < 0)
			goto fail;
		m->tgt = m->tfile;
		m->tgt_open = true;
		m->tkind = FMT_RAW;
	} else if ((r = open_local(m, o->format, err, errlen)) < 0) {
		goto fail;
	}
	if (m->tgt->read_only || m->tgt->size != m->size) {
		snprintf(err, errlen, "target %s: %s", m->target,
			 m->tgt->read_only ? "read-only" : "not the disk's size");
		if (!m->tgt->read_only)
			snprintf(err, errlen, "target %s is %" PRIu64 " bytes, the disk %" PRIu64
				 ": give one of the disk's size", m->target, m->tgt->size, m->size);
		r = -EINVAL;
		goto fail;
	}
	if (!is_uri(m->target) && (r = hold_local(m, err, errlen)) < 0)
		goto fail;
	if ((r = tctxs_new(m)) < 0) {
		snprintf(err, errlen, "target %s: cannot set up its %s engine", m->target,
			 m->tgt->engine->name);
		goto fail;
	}
	r = disk_claim(d, BDEV_LOCK_WAIT_MS, err, errlen);
	if (r < 0)
		goto fail;
	m->claimed = true;
	/* Everything dirty, then tracked: no write is missed. */
	r = disk_bitmap_hidden_add(d, gran, &m->dirty);
	if (r < 0) {
		m->dirty = NULL;
		snprintf(err, errlen, "out of memory for the mirror's bitmap");
		goto fail;
	}
	dbm_set(m->dirty, 0, m->size);
	set_mode(m, o->mode);
	atomic_store(&m->yield, !o->no_yield);
	m->wf = (struct disk_wfilter){ .submit = wsubmit, .drain = wdrain, .sync = wsync,
				       .opaque = m };
	if ((r = disk_wfilter_set(d, &m->wf)) < 0) {
		snprintf(err, errlen, "a backup or another mirror of this disk runs: one at a time");
		goto fail;
	}
	m->filtered = true;
	r = job_new(&mir_ops, d, m->t->loop, o->rate, JOB_ERR_REPORT, m, &m->job, err, errlen);
	if (r < 0)
		goto fail;
	snprintf(m->job_id, sizeof(m->job_id), "%s", job_id(m->job));
	m->next = s->list;
	s->list = m;
	job_start(m->job);
	snprintf(id, idlen, "%s", m->job_id);
	log_info("mirror %s: copying the disk to %s%s (job %s, %s, %u-byte granularity)", m->name,
		 m->target, m->made ? " (made)" : "", m->job_id, mir_mode_name(o->mode), gran);
	if (!is_uri(m->target) && m->ntctx < d->num_iothreads)
		log_warn("mirror %s: %s is a qcow2 image, served from one iothread: the disk has "
			 "%u, so job complete cannot make it the disk (cancel keeps the copy)",
			 m->name, m->target, d->num_iothreads);
	if (fmt_kind_of(d->b) == FMT_LUKS)
		log_warn("mirror %s: the disk is a LUKS volume and %s gets what the guest sees: "
			 "its plaintext", m->name, m->target);
	if (o->mode == MIR_WRITE_BLOCKING && m->ntctx < d->num_iothreads)
		log_warn("mirror %s: %s takes %u connection(s): writes on iothreads past that "
			 "are copied by the job, not written through", m->name, m->target,
			 m->ntctx);
	return 0;
fail:
	teardown(m, true);
	mir_free(m);
	return r;
}

int mir_change(struct mir_set *s, const char *name, enum mir_mode mode, char *err,
	       size_t errlen)
{
	struct mir *m = find(s, name ? name : "");

	if (!m) {
		snprintf(err, errlen, "no mirror named '%s' runs (vblkctl mirror list)",
			 name ? name : "");
		return -ENOENT;
	}
	if (atomic_load(&m->mode) != (int)mode) {
		set_mode(m, mode);
		log_info("mirror %s: now %s", m->name, mir_mode_name(mode));
	}
	return 0;
}

/* A mirror's job concluded (complete, cancel, failure): let go. */
static void set_reap(void *opaque, uint32_t events)
{
	struct mir_set *s = opaque;

	sys_eventfd_drain(s->efd);
	for (struct mir *m = s->list; m; m = m->next)
		if (!m->done && atomic_load(&m->ended)) {
			teardown(m, false);
			log_info("mirror %s ended (job %s): the target let go", m->name, m->job_id);
		}
}

unsigned mir_list(struct mir_set *s, struct mir_info *out, unsigned max)
{
	unsigned n = 0;

	for (struct mir *m = s->list; m; m = m->next) {
		if (m->done)
			continue;
		if (n < max) {
			struct mir_info *i = &out[n];
			uint64_t rn = atomic_load(&m->ready_ns);

			*i = (struct mir_info){ .size = m->size, .dirty = dbm_dirty_bytes(m->dirty),
						.granularity = dbm_granularity(m->dirty),
						.copied = atomic_load(&m->copied),
						.zeroed = atomic_load(&m->zeroed),
						.passes = atomic_load(&m->passes),
						.ready_s = rn ? (double)rn / 1e9 : -1, .ready = rn != 0,
						.yield = atomic_load(&m->yield),
						.yields = atomic_load(&m->yields),
						.mode = atomic_load(&m->mode),
						.format = m->tkind,
						.wb_writes = atomic_load(&m->wb_writes),
						.wb_bytes = atomic_load(&m->wb_bytes),
						.wb_conflicts = atomic_load(&m->wb_conflicts),
						.wb_errors = atomic_load(&m->wb_errors) };
			snprintf(i->name, sizeof(i->name), "%s", m->name);
			snprintf(i->job, sizeof(i->job), "%s", m->job_id);
			snprintf(i->target, sizeof(i->target), "%s", m->target);
		}
		n++;
	}
	return n;
}

int mir_set_new(struct disk *d, struct loop *main_loop, struct mir_set **out)
{
	struct mir_set *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->d = d;
	s->main_loop = main_loop;
	s->efd = sys_eventfd();
	if (s->efd < 0 ||
	    (r = loop_fd_add(main_loop, s->efd, EPOLLIN, set_reap, s, &s->h)) < 0) {
		r = s->efd < 0 ? s->efd : r;
		if (s->efd >= 0)
			close(s->efd);
		free(s);
		return r;
	}
	*out = s;
	return 0;
}

void mir_set_free(struct mir_set *s)
{
	if (!s)
		return;
	for (struct mir *m = s->list; m; m = m->next)
		if (!m->done) {
			m->by_main = true;
			(void)job_cancel(m->job_id, NULL, 0);
			/* Its unit in flight ends first (the target's ctx is
			 * freed after). */
			for (int i = 0; i < 30000 && !atomic_load(&m->ended); i++)
				usleep(1000);
			teardown(m, false);
		}
	for (struct mir *m = s->list; m; m = m->next)
		m->set = NULL;
	loop_fd_del(s->main_loop, s->h);
	close(s->efd);
	free(s);
}

/* ---- vblkctl mirror -------------------------------------------------------- */

int mir_ctl(void *opaque, struct json_object *req, struct json_object *reply, char *err,
	    size_t errlen)
{
	struct mir_set *s = opaque;
	const char *cmd = jfield_str(req, "cmd");

	if (!strcmp(cmd, "mirror-list")) {
		struct mir_info info[8];
		unsigned n = mir_list(s, info, 8);
		struct json_object *arr = json_object_new_array();

		for (unsigned i = 0; arr && i < n && i < 8; i++) {
			struct json_object *o = json_object_new_object();

			json_object_object_add(o, "name", json_object_new_string(info[i].name));
			json_object_object_add(o, "job", json_object_new_string(info[i].job));
			json_object_object_add(o, "target", json_object_new_string(info[i].target));
			json_object_object_add(o, "format", json_object_new_string(
					       fmt_kind_name(info[i].format)));
			json_object_object_add(o, "size", json_object_new_uint64(info[i].size));
			json_object_object_add(o, "granularity",
					       json_object_new_uint64(info[i].granularity));
			json_object_object_add(o, "dirty_bytes", json_object_new_uint64(info[i].dirty));
			json_object_object_add(o, "copied_bytes",
					       json_object_new_uint64(info[i].copied));
			json_object_object_add(o, "zeroed_bytes",
					       json_object_new_uint64(info[i].zeroed));
			json_object_object_add(o, "mode",
					       json_object_new_string(mir_mode_name(info[i].mode)));
			json_object_object_add(o, "written_through",
					       json_object_new_uint64(info[i].wb_writes));
			json_object_object_add(o, "written_through_bytes",
					       json_object_new_uint64(info[i].wb_bytes));
			json_object_object_add(o, "left_to_job",
					       json_object_new_uint64(info[i].wb_conflicts));
			json_object_object_add(o, "target_errors",
					       json_object_new_uint64(info[i].wb_errors));
			json_object_object_add(o, "passes", json_object_new_int(info[i].passes));
			json_object_object_add(o, "ready", json_object_new_boolean(info[i].ready));
			json_object_object_add(o, "ready_seconds",
					       json_object_new_double(info[i].ready_s));
			json_object_object_add(o, "yield", json_object_new_boolean(info[i].yield));
			json_object_object_add(o, "yielded", json_object_new_uint64(info[i].yields));
			json_object_array_add(arr, o);
		}
		json_object_object_add(reply, "mirrors", arr);
		return 0;
	}
	const char *mode = jfield_str(req, "mode");
	enum mir_mode md = MIR_BACKGROUND;

	if (mode && mir_mode_parse(mode, &md) < 0) {
		snprintf(err, errlen, "mode '%.40s': give background or write-blocking", mode);
		return -EINVAL;
	}
	if (!strcmp(cmd, "mirror-change")) {
		if (!mode) {
			snprintf(err, errlen, "mirror change needs a mode: background or "
				 "write-blocking");
			return -EINVAL;
		}
		int r = mir_change(s, jfield_str(req, "name"), md, err, errlen);

		if (r == 0)
			json_object_object_add(reply, "ok", json_object_new_boolean(1));
		return r;
	}
	struct mir_start_opts o = { .name = jfield_str(req, "name"),
				    .target = jfield_str(req, "target"), .mode = md };
	uint64_t gran = 0;
	char id[32];
	int r;

	if (jfield_u64(req, "rate", &o.rate) < 0 || jfield_u64(req, "granularity", &gran) < 0 ||
	    gran > UINT32_MAX) {
		snprintf(err, errlen, "\"rate\" and \"granularity\" take whole numbers of bytes");
		return -EINVAL;
	}
	o.granularity = (uint32_t)gran;
	bool yield = true;

	if (jfield_bool(req, "yield", &yield) < 0) {
		snprintf(err, errlen, "\"yield\" is true or false");
		return -EINVAL;
	}
	o.no_yield = !yield;
	const char *fmt = jfield_str(req, "format");

	if (fmt && (fmt_parse(fmt, &o.format) < 0 || o.format == FMT_LUKS)) {
		snprintf(err, errlen, "format '%.40s': give raw or qcow2", fmt);
		return -EINVAL;
	}
	r = mir_start(s, &o, id, sizeof(id), err, errlen);

	if (r == 0) {
		json_object_object_add(reply, "ok", json_object_new_boolean(1));
		json_object_object_add(reply, "job", json_object_new_string(id));
	}
	return r;
}
