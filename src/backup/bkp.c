/*
 * Pull-mode backup (bkp.h): the copy-before-write filter, the view, and
 * the backup's life as a job.  QEMU's block/copy-before-write.c and
 * block/snapshot-access.c are the model; the NBD side is the server's
 * (nbds.h, an export with a source).
 *
 * Chunks: st[] one byte each, under lock.  A write (the filter, on the
 * front's iothread) claims the live chunks of its range, a contiguous run
 * of up to BKP_RUN_MAX at a time (live -> copying), reads their old data
 * through the disk (the format's mapping) and writes it to the scratch at
 * the same offset (pwrite, buffered: the scratch dies with the backup, a
 * crash included), then marks them saved, and goes on; a chunk another
 * write is copying makes it wait (the iothread's waiter list, woken by an
 * eventfd when any copy ends).  The write goes to the disk once no chunk
 * of its range is live or being copied.
 *
 * A view read reads the disk, then looks at its chunks: one still live or
 * being copied has had no write submitted (a write goes only after its
 * chunks are saved), so what was read is the instant's; a saved one is
 * read from the scratch (or zeroes) over it.  No view read ever waits.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backup/bkp.h"
#include "bitmap/dbm.h"
#include "disk/disk.h"
#include "format/format.h"
#include "job/job.h"
#include "loop/loop.h"
#include "nbd/nbds.h"
#include "util/barrier.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/sys.h"

#define CHUNK		(1ull << BKP_CHUNK_BITS)
#define BKP_RUN_MAX	64u	/* chunks copied at once: 4 MiB */
/* Copy buffers an iothread keeps for its next copies (bkp_iot.pool): a
 * buffer of 128 KiB or more is glibc's mmap and munmap, and a new one
 * faults each of its pages in again (a 256 KiB guest write's copy: 64
 * faults, 1.4 K IOPS on the paravirtual machine of the benchmarks). */
#define BKP_POOL_BUFS	16u
#define BKP_POOL_BYTES	(16u << 20)

/* st[]: the state in the low two bits; a saved chunk's block status as of
 * the instant above them. */
enum { CH_LIVE, CH_COPYING, CH_SAVED, CH_SAVED_ZERO };
#define CH_STATE	3u
#define CH_HOLE		(1u << 2)
#define CH_ZERO		(1u << 3)
#define CH_DEPTH_SHIFT	4	/* 0..15 */
/* A run whose status is not known (not asked: not cheap; or the format
 * failed to say): data in the image itself, depth 1, as a raw or LUKS
 * disk's data always is.  Not depth 0, which says no layer has it and it
 * reads as zeroes (format.h), nor a hole. */
#define CH_DATA		(1u << CH_DEPTH_SHIFT)

struct bkp;

/* A write inside the filter. */
struct cbw_op {
	struct bkp *k;
	struct disk_iothread *t;
	struct bdev_io *orig;
	uint64_t next, last;	/* chunks: the next to look at, the write's last */
	uint64_t run0, run1;	/* the run being copied: [run0, run1) */
	struct fmt_extent ext;	/* the run's status, merged */
	unsigned ext_bits;
	struct bdev_io rio;
	struct iovec riov;
	uint8_t *buf;
	size_t cap;
	bool zero_run;		/* the run read as zeroes: no copy */
	bool waited;
	struct cbw_op *next_wait;
};

/* A view read. */
struct view_read {
	struct bkp *k;
	struct bdev_io *orig;
	struct bdev_io io;
	uint64_t due;			/* paced: when it may go (sys_now_ns) */
	struct view_read *next;		/* its iothread's paced list */
};

struct bkp_iot {
	struct bkp *k;
	struct disk_iothread *t;
	int efd;		/* a copy ended: look at the waiters */
	struct loop_fd *h;
	struct cbw_op *waiters;	/* under k->lock */
	/* View reads the rate holds back, in the order they go (this
	 * iothread's only), and the timer that sends them. */
	struct view_read *paced, **paced_tail;
	struct loop_timer *pace_timer;
	/* Guest writes inside the filter here, or at the disk after it,
	 * and when the last one came (sys_now_ns; view_busy); this
	 * thread's only. */
	struct disk_busy guest;
	/* Copy buffers kept (BKP_POOL_BUFS): this thread's only. */
	struct { uint8_t *p; size_t cap; } pool[BKP_POOL_BUFS];
	unsigned npool;
	size_t pool_bytes;
};

struct bkp {
	struct bkp_set *set;
	struct disk *d;
	char name[BKP_NAME_MAX + 1];
	char addr[200];
	char owner[2 * BKP_NAME_MAX + 64];	/* src.owner: nbd remove's refusal */
	struct job *job;
	char job_id[32];
	uint64_t size, nchunks;
	uint8_t *st;
	pthread_mutex_t lock;
	int scratch_fd;
	struct bkp_iot *iot;
	unsigned niot;
	struct disk_wfilter wf;
	struct nbds_source src;
	/* --bitmap: the user's bitmap (tracks on), its frozen copy (the
	 * view's), and the record of every write since the instant. */
	struct dbm *live, *frozen, *since;
	bool claimed, filtered, exported;
	/* Torn down (main): the view, filter and scratch gone; the struct
	 * stays for the job until it is dismissed. */
	bool done;
	bool by_main;		/* main concludes the job itself (finish, abort) */
	_Atomic bool ended;	/* the job concluded (its end op ran) */
	_Atomic bool completed;	/* by job complete: torn down as a finish */
	_Atomic int failed;	/* errno: the view is broken */
	_Atomic bool fail_told;
	char error[200];	/* under lock */
	_Atomic uint64_t pending;	/* writes inside the filter */
	_Atomic uint64_t read_bytes, saved, zero, waits;
	/* The view's rate (job set-rate): a virtual clock, in ns, of when
	 * the bytes read so far would have been read at the rate. */
	_Atomic uint64_t rate, vclock, paced;
	_Atomic bool yield;	/* the view yields to the guest (view_busy) */
	struct bkp *next;
};

struct bkp_set {
	struct disk *d;
	struct nbds *srv;
	struct loop *main_loop;
	struct bkp *list;	/* running, or torn down and not yet dismissed */
	int efd;		/* a job ended without main: tear it down */
	struct loop_fd *h;
};

static void op_step(struct cbw_op *op);

static void bkp_fail(struct bkp *k, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The view is broken from now on: its reads fail; writes go straight
 * on; the job fails (told on its loop, iothread 0). */
static void bkp_fail(struct bkp *k, int err, const char *fmt, ...)
{
	int zero = 0;
	va_list ap;

	pthread_mutex_lock(&k->lock);
	if (!atomic_compare_exchange_strong(&k->failed, &zero, err)) {
		pthread_mutex_unlock(&k->lock);
		return;
	}
	va_start(ap, fmt);
	vsnprintf(k->error, sizeof(k->error), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&k->lock);
	log_err("backup %s failed: %s; the guest goes on, the view's reads fail (vblkctl "
		"backup abort %s)", k->name, k->error, k->name);
	sys_eventfd_signal(k->iot[0].efd);
}

/* ---- The filter (the front's iothread) ---------------------------------- */

/* A copy buffer of at least len bytes from w's pool (the smallest that
 * fits), or a new one; its size in *cap. */
static uint8_t *buf_get(struct bkp_iot *w, size_t len, size_t *cap)
{
	unsigned best = w->npool;
	uint8_t *p;

	for (unsigned i = 0; i < w->npool; i++)
		if (w->pool[i].cap >= len && (best == w->npool || w->pool[i].cap < w->pool[best].cap))
			best = i;
	if (best < w->npool) {
		p = w->pool[best].p;
		*cap = w->pool[best].cap;
		w->pool_bytes -= *cap;
		w->pool[best] = w->pool[--w->npool];
		return p;
	}
	*cap = (len + 4095) & ~(size_t)4095;
	if (posix_memalign((void **)&p, 4096, *cap))
		return NULL;
	return p;
}

/* p back to w's pool.  A full pool gives up its smallest buffers for a
 * bigger one (a guest that goes from small writes to large ones would
 * otherwise find none big enough, pass after pass); else p is freed. */
static void buf_put(struct bkp_iot *w, uint8_t *p, size_t cap)
{
	if (!p)
		return;
	while (w->npool && (w->npool == BKP_POOL_BUFS || w->pool_bytes + cap > BKP_POOL_BYTES)) {
		unsigned s = 0;

		for (unsigned i = 1; i < w->npool; i++)
			if (w->pool[i].cap < w->pool[s].cap)
				s = i;
		if (w->pool[s].cap >= cap)
			break;
		free(w->pool[s].p);
		w->pool_bytes -= w->pool[s].cap;
		w->pool[s] = w->pool[--w->npool];
	}
	if (w->npool < BKP_POOL_BUFS && w->pool_bytes + cap <= BKP_POOL_BYTES) {
		w->pool[w->npool].p = p;
		w->pool[w->npool++].cap = cap;
		w->pool_bytes += cap;
		return;
	}
	free(p);
}

static void op_end(struct cbw_op *op)
{
	struct bkp *k = op->k;
	struct disk_iothread *t = op->t;
	struct bdev_io *io = op->orig;

	buf_put(&k->iot[t->idx], op->buf, op->cap);
	free(op);
	bdev_submit(k->d->b, t->bctx, io);
	k->d->b->engine->kick(t->bctx);
	atomic_fetch_sub(&k->pending, 1);
}

/* Wake every iothread that has a write waiting (lock held). */
static void wake_waiters(struct bkp *k)
{
	for (unsigned i = 0; i < k->niot; i++)
		if (k->iot[i].waiters)
			sys_eventfd_signal(k->iot[i].efd);
}

/* The status of [run0, run1) as of now (no write can change it: the run is
 * ours), summed up per chunk into bits: hole and zero if all of it is,
 * the depth the least one that has data. */
static unsigned run_status(struct bkp *k, uint64_t off, uint64_t len)
{
	unsigned hole = CH_HOLE, zero = CH_ZERO, depth = 0;

	while (len) {
		struct fmt_extent e;

		if (fmt_block_status(k->d->b, off, len, &e) < 0)
			return CH_DATA;	/* unknown: data, what loses nothing */
		if (!(e.flags & FMT_EXT_HOLE))
			hole = 0;
		if (!(e.flags & FMT_EXT_ZERO))
			zero = 0;
		if (e.depth && (!depth || e.depth < depth))
			depth = e.depth;
		off += e.length;
		len -= e.length;
	}
	return hole | zero | (MIN(depth, 15u) << CH_DEPTH_SHIFT);
}

/* The run is kept (or the backup failed): mark it, go on with the write. */
static void run_saved(struct cbw_op *op, bool read_ok)
{
	struct bkp *k = op->k;
	uint64_t base = op->run0 * CHUNK;

	for (uint64_t c = op->run0; c < op->run1 && read_ok && !atomic_load(&k->failed); c++) {
		uint64_t off = c * CHUNK, len = MIN(CHUNK, k->size - off);
		uint8_t *p = op->zero_run ? NULL : op->buf + (off - base);
		unsigned state = CH_SAVED_ZERO;

		if (p && !buf_is_zero(p, len)) {
			ssize_t w = pwrite(k->scratch_fd, p, len, (off_t)off);

			if (w != (ssize_t)len) {
				int e = w < 0 ? errno : ENOSPC;

				bkp_fail(k, e, "the scratch could not take %llu bytes at %llu: %s",
					 (unsigned long long)len, (unsigned long long)off,
					 strerror(e));
				break;
			}
			state = CH_SAVED;
		}
		pthread_mutex_lock(&k->lock);
		/* Zeroes read: the view says so, whatever the status said. */
		k->st[c] = (uint8_t)(state | op->ext_bits | (state == CH_SAVED_ZERO ? CH_ZERO : 0));
		pthread_mutex_unlock(&k->lock);
		atomic_fetch_add_explicit(&k->saved, 1, memory_order_relaxed);
		if (state == CH_SAVED_ZERO)
			atomic_fetch_add_explicit(&k->zero, 1, memory_order_relaxed);
	}
	pthread_mutex_lock(&k->lock);
	/* Failed: what is still marked copying is live again (the view is
	 * broken anyway: nothing reads it). */
	for (uint64_t c = op->run0; c < op->run1; c++)
		if ((k->st[c] & CH_STATE) == CH_COPYING)
			k->st[c] = CH_LIVE;
	wake_waiters(k);
	pthread_mutex_unlock(&k->lock);
	op->next = op->run1;
	op_step(op);
}

static void run_read_done(struct bdev_io *io, int res)
{
	struct cbw_op *op = container_of(io, struct cbw_op, rio);

	if (res < 0)
		bkp_fail(op->k, -res, "reading the old data at %llu failed: %s",
			 (unsigned long long)io->offset, strerror(-res));
	run_saved(op, res == 0);
}

/* Copy the run [run0, run1) claimed by op. */
static void run_copy(struct cbw_op *op)
{
	struct bkp *k = op->k;
	uint64_t off = op->run0 * CHUNK, len = MIN(op->run1 * CHUNK, k->size) - off;

	/* A raw file's status is lseek SEEK_DATA/SEEK_HOLE, which on tmpfs
	 * walks the page cache to the next hole (the file's end when it is
	 * all data: 7 ms for 1 GiB, per copy).  Only where it costs nothing
	 * (qcow2); else the data is read, and a run of zeroes is still
	 * kept as zeroes (run_saved). */
	op->ext_bits = fmt_block_status_cheap(k->d->b) ? run_status(k, off, len) : CH_DATA;
	if (op->ext_bits & CH_ZERO) {
		/* Zeroes at the instant: nothing to keep but that. */
		op->zero_run = true;
		run_saved(op, true);
		return;
	}
	if (op->cap < len) {
		struct bkp_iot *w = &k->iot[op->t->idx];

		buf_put(w, op->buf, op->cap);
		op->buf = buf_get(w, len, &op->cap);
		if (!op->buf)
			op->cap = 0;
	}
	if (!op->buf) {
		bkp_fail(k, ENOMEM, "out of memory for a copy");
		run_saved(op, false);
		return;
	}
	op->zero_run = false;
	op->riov = (struct iovec){ op->buf, len };
	op->rio = (struct bdev_io){ .op = BDEV_READ, .offset = off, .iov = &op->riov,
				    .iovcnt = 1, .cb = run_read_done };
	bdev_submit(k->d->b, op->t->bctx, &op->rio);
	k->d->b->engine->kick(op->t->bctx);
}

/* Look at the write's chunks from op->next: claim the next live run and
 * copy it, wait for one another write copies, or send the write on. */
static void op_step(struct cbw_op *op)
{
	struct bkp *k = op->k;
	uint64_t c;

	pthread_mutex_lock(&k->lock);
	if (atomic_load(&k->failed))
		op->next = op->last + 1;
	for (c = op->next; c <= op->last; c++) {
		unsigned s = k->st[c] & CH_STATE;

		if (s == CH_LIVE)
			break;
		if (s == CH_COPYING) {
			struct bkp_iot *w = &k->iot[op->t->idx];

			op->next = c;
			op->next_wait = w->waiters;
			w->waiters = op;
			if (!op->waited)
				atomic_fetch_add_explicit(&k->waits, 1, memory_order_relaxed);
			op->waited = true;
			pthread_mutex_unlock(&k->lock);
			return;
		}
	}
	if (c > op->last) {
		pthread_mutex_unlock(&k->lock);
		op_end(op);
		return;
	}
	op->run0 = c;
	for (; c <= op->last && c - op->run0 < BKP_RUN_MAX && (k->st[c] & CH_STATE) == CH_LIVE; c++)
		k->st[c] = CH_COPYING;
	op->run1 = c;
	pthread_mutex_unlock(&k->lock);
	run_copy(op);
}

static void guest_done(struct bdev_io *io, int res)
{
	struct bkp_iot *w = io->up_priv;

	disk_busy_end(&w->guest);
	io->cb = io->up_cb;
	io->cb(io, res);
}

/* The filter's submit (disk.h, disk_wfilter): a write, discard or write
 * zeroes of a front, on t. */
static void cbw_submit(void *opaque, struct disk_iothread *t, struct bdev_io *io)
{
	struct bkp *k = opaque;
	uint64_t len = io->op == BDEV_WRITE ? iov_size(io->iov, io->iovcnt) : io->length;
	struct cbw_op *op;

	/* Counted until it completes (guest_done). */
	if (t->idx < k->niot) {
		disk_busy_begin(&k->iot[t->idx].guest, t->loop);
		io->up_cb = io->cb;
		io->up_priv = &k->iot[t->idx];
		io->cb = guest_done;
	}
	/* Every write from the instant on is in the record, whatever the
	 * bitmap list it saw (a write parked for QoS before the instant). */
	if (k->since && len)
		dbm_set(k->since, io->offset, len);
	if (len && io->offset < k->size && !atomic_load(&k->failed)) {
		uint64_t c = io->offset >> BKP_CHUNK_BITS;
		uint64_t last = (MIN(io->offset + len, k->size) - 1) >> BKP_CHUNK_BITS;

		/* Every chunk kept already (most writes once the hot ones
		 * are): straight on, nothing allocated. */
		pthread_mutex_lock(&k->lock);
		while (c <= last && (k->st[c] & CH_STATE) >= CH_SAVED)
			c++;
		pthread_mutex_unlock(&k->lock);
		if (c > last) {
			bdev_submit(k->d->b, t->bctx, io);
			return;
		}
	}
	if (!len || io->offset >= k->size || atomic_load(&k->failed) ||
	    !(op = calloc(1, sizeof(*op)))) {
		if (len && io->offset < k->size && !atomic_load(&k->failed))
			bkp_fail(k, ENOMEM, "out of memory for a write's copy");
		bdev_submit(k->d->b, t->bctx, io);
		return;
	}
	atomic_fetch_add(&k->pending, 1);
	*op = (struct cbw_op){ .k = k, .t = t, .orig = io, .next = io->offset >> BKP_CHUNK_BITS,
			       .last = (MIN(io->offset + len, k->size) - 1) >> BKP_CHUNK_BITS };
	op_step(op);
}

/* A copy ended somewhere: the writes waiting here look again. */
static void iot_wake(void *opaque, uint32_t events)
{
	struct bkp_iot *w = opaque;
	struct bkp *k = w->k;
	struct cbw_op *list, *rev = NULL;

	sys_eventfd_drain(w->efd);
	pthread_mutex_lock(&k->lock);
	list = w->waiters;
	w->waiters = NULL;
	pthread_mutex_unlock(&k->lock);
	/* In the order they came. */
	while (list) {
		struct cbw_op *n = list->next_wait;

		list->next_wait = rev;
		rev = list;
		list = n;
	}
	while (rev) {
		struct cbw_op *n = rev->next_wait;

		op_step(rev);
		rev = n;
	}
	/* The job hears of a failure on its loop (iothread 0). */
	if (w == &k->iot[0] && atomic_load(&k->failed) && !atomic_exchange(&k->fail_told, true) &&
	    k->job)
		job_kick(k->job);
}

/* ---- The view (the NBD connection's iothread) --------------------------- */

/* Bytes [s, e) of the view from the scratch into orig's buffer at s - off
 * (one pread per piece of it: an NBD read's is one).  The scratch holds
 * every saved byte at the disk's offset. */
static int scratch_read(struct bkp *k, struct bdev_io *orig, uint64_t off, uint64_t s,
			uint64_t e)
{
	return sys_pread_iov(k->scratch_fd, orig->iov, orig->iovcnt, s - off, e - s, s) < 0 ?
		-EIO : 0;
}

static void view_read_done(struct bdev_io *io, int res)
{
	struct view_read *vr = container_of(io, struct view_read, io);
	struct bkp *k = vr->k;
	struct bdev_io *orig = vr->orig;
	uint64_t off = orig->offset, len = iov_size(orig->iov, orig->iovcnt);
	uint64_t last = (off + len - 1) >> BKP_CHUNK_BITS;

	free(vr);
	if (res == 0 && atomic_load(&k->failed))
		res = -EIO;
	for (uint64_t c = off >> BKP_CHUNK_BITS; res == 0 && c <= last;) {
		uint64_t s = MAX(c * CHUNK, off), n = c + 1, e;
		unsigned st;

		/* A run of chunks in the same state. */
		pthread_mutex_lock(&k->lock);
		st = k->st[c] & CH_STATE;
		while (n <= last && (k->st[n] & CH_STATE) == st)
			n++;
		pthread_mutex_unlock(&k->lock);
		e = MIN(n * CHUNK, off + len);
		/* Live or being copied: no write reached it; what was read is
		 * the instant's. */
		if (st == CH_SAVED_ZERO)
			iov_memset(orig->iov, orig->iovcnt, s - off, 0, e - s);
		else if (st == CH_SAVED)
			res = scratch_read(k, orig, off, s, e);
		c = n;
	}
	if (res == 0)
		atomic_fetch_add_explicit(&k->read_bytes, len, memory_order_relaxed);
	orig->cb(orig, res);
}

/* Every chunk of [off, off + len) saved: the disk has nothing of the
 * view's there (a saved chunk stays saved). */
static bool all_saved(struct bkp *k, uint64_t off, uint64_t len)
{
	bool yes = true;

	pthread_mutex_lock(&k->lock);
	for (uint64_t c = off >> BKP_CHUNK_BITS; yes && c <= (off + len - 1) >> BKP_CHUNK_BITS; c++)
		yes = (k->st[c] & CH_STATE) >= CH_SAVED;
	pthread_mutex_unlock(&k->lock);
	return yes;
}

static void view_go(struct bkp *k, struct disk_iothread *t, struct view_read *vr, bool kick)
{
	/* All of it kept already (the guest wrote there): from the scratch
	 * alone, no read of the disk to throw away. */
	if (all_saved(k, vr->io.offset, iov_size(vr->io.iov, vr->io.iovcnt))) {
		view_read_done(&vr->io, 0);
		return;
	}
	bdev_submit(k->d->b, t->bctx, &vr->io);
	/* The connection kicks after a batch; a paced read goes alone. */
	if (kick)
		k->d->b->engine->kick(t->bctx);
}

/* The paced reads whose time has come go (t's loop). */
static void pace_cb(void *opaque)
{
	struct bkp_iot *w = opaque;
	uint64_t now = sys_now_ns();

	while (w->paced && (w->paced->due <= now || !atomic_load(&w->k->rate))) {
		struct view_read *vr = w->paced;

		w->paced = vr->next;
		if (!w->paced)
			w->paced_tail = &w->paced;
		view_go(w->k, w->t, vr, true);
	}
	if (w->paced)
		loop_timer_mod(w->pace_timer, w->paced->due);
}

/*
 * With a rate, a read goes when the bytes read before it would have been
 * read at that rate (QEMU's backup speed, the job framework's pacing);
 * reads of every client and iothread share it.  Up to 1 ms early goes at
 * once.
 */
static bool view_pace(struct bkp *k, struct disk_iothread *t, struct view_read *vr, uint64_t len)
{
	uint64_t rate = atomic_load_explicit(&k->rate, memory_order_relaxed), now, v, start;
	struct bkp_iot *w;

	if (likely(!rate))
		return false;
	now = sys_now_ns();
	v = atomic_load(&k->vclock);
	do
		start = MAX(v, now);
	while (!atomic_compare_exchange_weak(&k->vclock, &v,
					     start + (uint64_t)((double)len * 1e9 / (double)rate)));
	if (start <= now + 1000000 || t->idx >= k->niot || !k->iot[t->idx].pace_timer)
		return false;
	w = &k->iot[t->idx];
	vr->due = start;
	vr->next = NULL;
	*w->paced_tail = vr;
	w->paced_tail = &vr->next;
	if (w->paced == vr)
		loop_timer_mod(w->pace_timer, start);
	atomic_fetch_add_explicit(&k->paced, 1, memory_order_relaxed);
	return true;
}

static void view_read(void *opaque, struct disk_iothread *t, struct bdev_io *io)
{
	struct bkp *k = opaque;
	struct view_read *vr;

	if (atomic_load(&k->failed) || !(vr = calloc(1, sizeof(*vr)))) {
		io->cb(io, -EIO);
		return;
	}
	vr->k = k;
	vr->orig = io;
	vr->io = (struct bdev_io){ .op = BDEV_READ, .offset = io->offset, .iov = io->iov,
				   .iovcnt = io->iovcnt, .cb = view_read_done };
	if (view_pace(k, t, vr, iov_size(io->iov, io->iovcnt)))
		return;
	view_go(k, t, vr, false);
}

static void view_served(void *opaque, uint64_t len)
{
	struct bkp *k = opaque;

	atomic_fetch_add_explicit(&k->read_bytes, len, memory_order_relaxed);
}

/*
 * The guest is busy on t: it has writes in flight there, or sent one in
 * the last BKP_BUSY_NS (a guest between two batches is still at work:
 * with in-flight writes alone the pull ran whenever the guest's driver
 * lost its CPU, to the pull's client among others, and took more).  The
 * view's connections on t then yield to it (nbds.h, nbds_source.busy,
 * conn.c "Yielding"): a pull takes a small share of the thread while the
 * guest writes, not half of it, and all of it when the guest is quiet.
 * Off: backup start --no-yield.  t's thread.
 */
#define BKP_BUSY_NS 1000000ull

static bool view_busy(void *opaque, struct disk_iothread *t)
{
	struct bkp *k = opaque;
	struct bkp_iot *w;

	if (!atomic_load_explicit(&k->yield, memory_order_relaxed) || t->idx >= k->niot)
		return false;
	w = &k->iot[t->idx];
	return disk_busy_now(&w->guest, t->loop, BKP_BUSY_NS);
}

/* fmt_block_status of the view: a saved chunk's status as kept; a run of
 * unsaved ones as the disk says now, checked again after (no write went
 * to a chunk still unsaved).  A failed view: -EIO, as its reads (writes
 * pass straight then: the disk's status is no longer the instant's). */
static int view_status(void *opaque, uint64_t off, uint64_t len, struct fmt_extent *e)
{
	struct bkp *k = opaque;
	uint64_t c = off >> BKP_CHUNK_BITS, end;
	unsigned st;

	if (atomic_load(&k->failed))
		return -EIO;
	for (;;) {
		pthread_mutex_lock(&k->lock);
		st = k->st[c];
		if ((st & CH_STATE) >= CH_SAVED) {
			uint64_t n = c + 1;

			while (n * CHUNK < off + len && k->st[n] == st)
				n++;
			pthread_mutex_unlock(&k->lock);
			*e = (struct fmt_extent){
				.length = MIN(n * CHUNK, off + len) - off,
				.flags = ((st & CH_HOLE) ? FMT_EXT_HOLE : 0) |
					 ((st & CH_ZERO) ? FMT_EXT_ZERO : 0),
				.depth = st >> CH_DEPTH_SHIFT };
			return 0;
		}
		end = c + 1;
		while (end * CHUNK < off + len && (k->st[end] & CH_STATE) < CH_SAVED)
			end++;
		pthread_mutex_unlock(&k->lock);
		int r = fmt_block_status(k->d->b, off, MIN(end * CHUNK, off + len) - off, e);

		if (r < 0)
			return r;
		pthread_mutex_lock(&k->lock);
		end = (off + e->length - 1) >> BKP_CHUNK_BITS;
		for (st = 0; c <= end && !st; c++)
			st = (k->st[c] & CH_STATE) >= CH_SAVED;
		pthread_mutex_unlock(&k->lock);
		if (!st)
			return 0;
		c = off >> BKP_CHUNK_BITS;	/* a copy ended meanwhile: again */
	}
}

/* ---- The job ------------------------------------------------------------ */

static int job_step(struct job *j, void *priv)
{
	struct bkp *k = priv;

	if (atomic_load(&k->failed)) {
		pthread_mutex_lock(&k->lock);
		job_set_error(j, "%s", k->error);
		pthread_mutex_unlock(&k->lock);
		return -atomic_load(&k->failed);
	}
	return JOB_STEP_END;	/* the view is there: ready */
}

static int job_complete_op(struct job *j, void *priv, char *msg, size_t len)
{
	struct bkp *k = priv;

	if (atomic_load(&k->failed)) {
		snprintf(msg, len, "the backup failed: abort it");
		return -EIO;
	}
	snprintf(msg, len, "%" PRIu64 " bytes read by its clients, %" PRIu64
		 " chunks kept before writes", atomic_load(&k->read_bytes), atomic_load(&k->saved));
	/* Before the end op tells main (job complete = backup finish). */
	atomic_store(&k->completed, true);
	return 0;
}

static void job_end_op(struct job *j, void *priv)
{
	struct bkp *k = priv;

	atomic_store(&k->ended, true);
	/* Completed, cancelled or failed, not by backup finish/abort: main
	 * tears the view down. */
	if (!k->by_main)
		sys_eventfd_signal(k->set->efd);
}

static void job_rate_op(void *priv, uint64_t rate)
{
	struct bkp *k = priv;

	/* Paced from now (reads already held keep their time). */
	atomic_store(&k->vclock, 0);
	atomic_store(&k->rate, rate);
}

static void job_progress(void *priv, uint64_t *done, uint64_t *total)
{
	struct bkp *k = priv;

	*done = atomic_load(&k->read_bytes);
	*total = k->size;
}

static void teardown(struct bkp *k, bool finish);

/* k's job concluded without backup finish/abort: job complete is a
 * finish; job cancel or a failure an abort.  Main thread. */
static void reap_one(struct bkp *k)
{
	bool finish = atomic_load(&k->completed);

	teardown(k, finish);
	if (finish)
		log_info("backup %s finished (its job completed); its bitmap tracks from its "
			 "instant on", k->name);
	else
		log_info("backup %s ended (its job concluded): aborted, its bitmap as it was",
			 k->name);
}

/* The job's free op (job dismiss, the job list's trim, vblkd's exit):
 * main thread.  A backup whose job concluded without main (job complete
 * or cancel, a failure) and was dismissed before set_reap saw it is torn
 * down first;
 * then it leaves its set's list, which find, set_reap, bkp_list and
 * bkp_set_free walk (k->set NULL: the set is gone, vblkd exits). */
static void bkp_free(void *priv)
{
	struct bkp *k = priv;

	if (!k->done)
		reap_one(k);
	for (struct bkp **p = k->set ? &k->set->list : NULL; p && *p; p = &(*p)->next)
		if (*p == k) {
			*p = k->next;
			break;
		}
	pthread_mutex_destroy(&k->lock);
	free(k);
}

static const struct job_ops bkp_job_ops = {
	.type = "backup",
	.step = job_step,
	.complete = job_complete_op,
	.end = job_end_op,
	.free = bkp_free,
	.progress = job_progress,
	.rate = job_rate_op,
};

/* ---- Main thread ---------------------------------------------------------- */

struct iot_call {
	struct bkp_iot *w;
	int res;
};

static void do_iot_add(void *opaque)
{
	struct iot_call *c = opaque;

	c->w->paced_tail = &c->w->paced;
	c->res = loop_timer_new(c->w->t->loop, pace_cb, c->w, &c->w->pace_timer);
	if (c->res < 0) {
		c->w->pace_timer = NULL;
		return;
	}
	c->res = loop_fd_add(c->w->t->loop, c->w->efd, EPOLLIN, iot_wake, c->w, &c->w->h);
}

/* The reads the rate holds go now (the rate is off). */
static void do_iot_unpace(void *opaque)
{
	struct bkp_iot *w = opaque;

	if (w->pace_timer)
		pace_cb(w);
}

/* The guest's writes that went through the filter here completed. */
static void do_iot_drain(void *opaque)
{
	struct bkp_iot *w = opaque;

	while (w->guest.out)
		w->k->d->b->engine->drain(w->t->bctx);
}

static void do_iot_del(void *opaque)
{
	struct iot_call *c = opaque;

	if (c->w->h)
		loop_fd_del(c->w->t->loop, c->w->h);
	c->w->h = NULL;
	loop_timer_free(c->w->pace_timer);
	c->w->pace_timer = NULL;
}

static struct bkp *find(struct bkp_set *s, const char *name)
{
	for (struct bkp *k = s->list; k; k = k->next)
		if (!k->done && !strcmp(k->name, name))
			return k;
	return NULL;
}

/* Undo what start did, in reverse: no client reads the view, no write is
 * inside the filter, the bitmaps as finish or abort leave them. */
static void teardown(struct bkp *k, bool finish)
{
	struct disk *d = k->d;

	/* Reads held by the rate go first: the export's removal waits for
	 * its clients' requests. */
	atomic_store(&k->rate, 0);
	for (unsigned i = 0; k->iot && i < k->niot; i++)
		loop_call_sync(k->iot[i].t->loop, do_iot_unpace, &k->iot[i]);
	if (k->exported)
		(void)nbds_remove(k->set->srv, k->name);
	k->exported = false;
	if (k->filtered) {
		(void)disk_wfilter_set(d, NULL);
		/* What is inside it gets out as its copies end. */
		while (atomic_load(&k->pending))
			usleep(100);
		/* And the writes it counts (guest_done) complete. */
		for (unsigned i = 0; k->iot && i < k->niot; i++)
			loop_call_sync(k->iot[i].t->loop, do_iot_drain, &k->iot[i]);
	}
	k->filtered = false;
	if (k->live) {
		if (finish && k->since) {
			/* From now on the bitmap says what was written since
			 * the instant (every such write marked both).  A write
			 * marks the bitmaps in list order, since last (added
			 * last): one may have marked B before the clear and
			 * not since yet.  The grace lets every mark begun
			 * before the clear end, so since has it when merged;
			 * a write after the clear marks B itself. */
			dbm_clear(k->live);
			disk_grace(d);
			dbm_merge(k->live, k->since);
			if (k->live->persistent)
				d->bm_unsaved = true;
		} else if (!finish && k->frozen) {
			/* Abort loses nothing: B gets back the bits the
			 * backup did not deliver, B as of the instant (the
			 * frozen copy) and every write since (since), which a
			 * bitmap clear during the backup took from it.  The
			 * grace first, as above: a write that marked B before
			 * that clear may not have marked since yet. */
			disk_grace(d);
			dbm_merge(k->live, k->frozen);
			if (k->since)
				dbm_merge(k->live, k->since);
			if (k->live->persistent)
				d->bm_unsaved = true;
		}
		atomic_fetch_sub(&k->live->users, 1);
	}
	if (k->since)
		disk_bitmap_hidden_remove(d, k->since);
	k->since = NULL;
	k->src.bitmap = NULL;
	dbm_free(k->frozen);
	k->frozen = NULL;
	k->live = NULL;
	for (unsigned i = 0; k->iot && i < k->niot; i++) {
		struct iot_call c = { &k->iot[i], 0 };

		if (k->iot[i].h || k->iot[i].pace_timer)
			loop_call_sync(k->iot[i].t->loop, do_iot_del, &c);
		if (k->iot[i].efd >= 0)
			close(k->iot[i].efd);
		/* Every copy ended (the filter is gone): the pool is ours. */
		for (unsigned j = 0; j < k->iot[i].npool; j++)
			free(k->iot[i].pool[j].p);
		k->iot[i].npool = 0;
	}
	free(k->iot);
	k->iot = NULL;
	if (k->scratch_fd >= 0)
		close(k->scratch_fd);
	k->scratch_fd = -1;
	free(k->st);
	k->st = NULL;
	if (k->claimed)
		disk_release(d);
	k->claimed = false;
	k->done = true;
}

/* A scratch file in dir: unnamed (O_TMPFILE) where the file system can,
 * else named and unlinked at once.  fd or -errno, one line in err. */
static int scratch_open(const char *dir, uint64_t size, char *err, size_t errlen)
{
	char path[PATH_MAX + 32];
	struct stat sb;
	int fd;

	if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
		snprintf(err, errlen, "scratch '%s': not a directory (give --scratch DIR on local "
			 "storage)", dir);
		return -ENOTDIR;
	}
	fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0) {
		snprintf(path, sizeof(path), "%s/.vblkd-backup-XXXXXX", dir);
		fd = mkostemp(path, O_CLOEXEC);
		if (fd >= 0)
			unlink(path);
	}
	if (fd < 0) {
		int e = errno;

		snprintf(err, errlen, "scratch '%s': cannot make a file there: %s", dir,
			 strerror(e));
		return -e;
	}
	if (ftruncate(fd, (off_t)size) < 0) {
		int e = errno;

		close(fd);
		snprintf(err, errlen, "scratch '%s': cannot size a file there: %s", dir,
			 strerror(e));
		return -e;
	}
	return fd;
}

int bkp_start(struct bkp_set *s, const struct bkp_start_opts *o, char *id, size_t idlen,
	      char *err, size_t errlen)
{
	struct disk *d = s->d;
	struct nbds_export_opts eo = { 0 };
	char dir[PATH_MAX], spec[600];
	struct bkp *k;
	int r;

	if (!o->name || !dbm_name_ok(o->name)) {
		snprintf(err, errlen, "backup name '%.80s': give 1 to %u of A-Z a-z 0-9 _ . -",
			 o->name ? o->name : "", BKP_NAME_MAX);
		return -EINVAL;
	}
	if (find(s, o->name)) {
		snprintf(err, errlen, "a backup named '%s' runs already", o->name);
		return -EEXIST;
	}
	if (disk_wfilter_on(d)) {
		snprintf(err, errlen, "a backup or a mirror of this disk runs already: one at a "
			 "time (vblkctl backup list, mirror list)");
		return -EBUSY;
	}
	if (!o->nbd) {
		snprintf(err, errlen, "give --nbd ADDR: where the backup's view is served");
		return -EINVAL;
	}
	/* The export's name is the backup's; the rest as --nbd. */
	snprintf(spec, sizeof(spec), "%s,name=%s", o->nbd, o->name);
	if ((r = nbds_export_parse(spec, &eo, err, errlen)) < 0)
		return r;
	if (o->scratch) {
		snprintf(dir, sizeof(dir), "%s", o->scratch);
	} else if (d->b->path && !d->b->engine->open && realpath(d->b->path, dir)) {
		char *slash = strrchr(dir, '/');

		slash[slash == dir] = '\0';
	} else {
		nbds_export_opts_free(&eo);
		snprintf(err, errlen, "a network disk has no directory of its own: give --scratch "
			 "DIR on local storage");
		return -EINVAL;
	}

	k = calloc(1, sizeof(*k));
	if (!k) {
		nbds_export_opts_free(&eo);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	pthread_mutex_init(&k->lock, NULL);
	k->set = s;
	k->d = d;
	k->scratch_fd = -1;
	snprintf(k->name, sizeof(k->name), "%s", o->name);
	snprintf(k->addr, sizeof(k->addr), "%s", eo.addr);
	k->size = READ_ONCE(d->b->size);
	k->nchunks = (k->size + CHUNK - 1) >> BKP_CHUNK_BITS;
	k->niot = d->num_iothreads;
	k->st = calloc(k->nchunks ? k->nchunks : 1, 1);
	k->iot = calloc(k->niot, sizeof(*k->iot));
	if (!k->st || !k->iot) {
		snprintf(err, errlen, "out of memory for %" PRIu64 " chunks", k->nchunks);
		r = -ENOMEM;
		goto fail;
	}
	for (unsigned i = 0; i < k->niot; i++)
		k->iot[i] = (struct bkp_iot){ .k = k, .t = &d->iot[i], .efd = -1 };
	/* The view reads the disk: it is held for the backup's life.  Before
	 * the bitmap is looked up: the disk's first claim may load the
	 * image's bitmaps again (disk__bitmaps_claimed: another process
	 * stored some since), which replaces or drops ours of the same name. */
	r = disk_claim(d, BDEV_LOCK_WAIT_MS, err, errlen);
	if (r < 0)
		goto fail;
	k->claimed = true;
	if (o->bitmap && !(k->live = disk_bitmap_find(d, o->bitmap))) {
		snprintf(err, errlen, "no bitmap '%.80s' (vblkctl bitmap list shows them)",
			 o->bitmap);
		r = -ENOENT;
		goto fail;
	}
	if (k->live)
		atomic_fetch_add(&k->live->users, 1);
	r = scratch_open(dir, k->size, err, errlen);
	if (r < 0)
		goto fail;
	k->scratch_fd = r;
	for (unsigned i = 0; i < k->niot; i++) {
		struct iot_call c = { &k->iot[i], 0 };

		r = k->iot[i].efd = sys_eventfd();
		if (r >= 0) {
			loop_call_sync(d->iot[i].loop, do_iot_add, &c);
			r = c.res;
		}
		if (r < 0) {
			snprintf(err, errlen, "cannot make an eventfd: %s", strerror(-r));
			goto fail;
		}
	}
	atomic_store(&k->rate, o->rate);
	atomic_store(&k->yield, !o->no_yield);
	r = job_new(&bkp_job_ops, d, d->iot[0].loop, o->rate, JOB_ERR_REPORT, k, &k->job, err,
		    errlen);
	if (r < 0) {
		k->job = NULL;
		goto fail;
	}
	snprintf(k->job_id, sizeof(k->job_id), "%s", job_id(k->job));

	/* The instant.  Every write from the record's publication on marks
	 * it; the filter's, then the drain of what was in flight, make the
	 * instant; the bitmap copied after covers every write up to it. */
	if (k->live && (r = disk_bitmap_hidden_add(d, dbm_granularity(k->live), &k->since)) < 0) {
		snprintf(err, errlen, "out of memory for the backup's bitmap");
		k->since = NULL;
		goto fail_job;
	}
	k->wf = (struct disk_wfilter){ .submit = cbw_submit, .opaque = k };
	r = disk_wfilter_set(d, &k->wf);
	if (r < 0) {
		snprintf(err, errlen, "a backup or a mirror of this disk runs already: one at a "
			 "time");
		goto fail_job;
	}
	k->filtered = true;
	if (k->live && !(k->frozen = dbm_grow(k->live, k->live->size))) {
		snprintf(err, errlen, "out of memory for the view's bitmap");
		r = -ENOMEM;
		goto fail_job;
	}

	k->src = (struct nbds_source){ .read = view_read, .block_status = view_status,
				       .served = view_served, .busy = view_busy,
				       .bitmap = k->frozen, .owner = k->owner, .opaque = k };
	snprintf(k->owner, sizeof(k->owner), "backup %s's view: use vblkctl backup finish/abort %s",
		 k->name, k->name);
	eo.src = &k->src;
	eo.read_only = true;
	r = nbds_add(s->srv, &eo, err, errlen);
	if (r < 0)
		goto fail_job;
	k->exported = true;
	nbds_export_opts_free(&eo);
	k->next = s->list;
	s->list = k;
	job_start(k->job);
	snprintf(id, idlen, "%s", k->job_id);
	log_info("backup %s: the view of the disk as of now on %s%s%s%s (job %s)", k->name,
		 k->addr, k->live ? ", bitmap " : "", k->live ? k->live->name : "",
		 k->live ? " frozen" : "", k->job_id);
	return 0;

fail_job:
	nbds_export_opts_free(&eo);
	teardown(k, false);
	k->by_main = true;
	/* A job never started: cancelled, then dismissed (frees k). */
	(void)job_cancel(k->job_id, NULL, 0);
	(void)job_dismiss(k->job_id, NULL, 0);
	return r;
fail:
	nbds_export_opts_free(&eo);
	teardown(k, false);
	bkp_free(k);
	return r;
}

int bkp_finish(struct bkp_set *s, const char *name, bool abort, char *err, size_t errlen)
{
	struct bkp *k = find(s, name);
	int r = 0;

	if (!k) {
		snprintf(err, errlen, "no backup '%.80s' (vblkctl backup list shows them)", name);
		return -ENOENT;
	}
	if (!abort && atomic_load(&k->failed)) {
		snprintf(err, errlen, "backup %s failed (%s): abort it, and take a new one", name,
			 k->error);
		return -EIO;
	}
	k->by_main = true;
	if (!atomic_load(&k->ended)) {
		r = abort ? job_cancel(k->job_id, err, errlen) :
			    job_complete(k->job_id, err, errlen);
		if (r < 0 && !abort) {
			k->by_main = false;
			return r;
		}
	}
	teardown(k, !abort);
	log_info("backup %s %s%s%s", name, abort ? "aborted" : "finished",
		 abort ? "" : "; ", abort ? "" : "its bitmap tracks from its instant on");
	return 0;
}

/* A job concluded without backup finish/abort (job complete: a finish;
 * job cancel, a failure: an abort). */
static void set_reap(void *opaque, uint32_t events)
{
	struct bkp_set *s = opaque;

	sys_eventfd_drain(s->efd);
	for (struct bkp *k = s->list; k; k = k->next)
		if (!k->done && atomic_load(&k->ended) && !k->by_main)
			reap_one(k);
}

unsigned bkp_list(struct bkp_set *s, struct bkp_info *out, unsigned max)
{
	unsigned n = 0;

	for (struct bkp *k = s->list; k; k = k->next) {
		struct stat sb;

		if (k->done)
			continue;
		if (n < max) {
			struct bkp_info *i = &out[n];

			*i = (struct bkp_info){
				.size = k->size, .read_bytes = atomic_load(&k->read_bytes),
				.saved_chunks = atomic_load(&k->saved),
				.zero_chunks = atomic_load(&k->zero),
				.waits = atomic_load(&k->waits),
				.rate = atomic_load(&k->rate),
				.paced = atomic_load(&k->paced),
				.yield = atomic_load(&k->yield),
				.failed = atomic_load(&k->failed) != 0 };
			snprintf(i->name, sizeof(i->name), "%s", k->name);
			snprintf(i->job, sizeof(i->job), "%s", k->job_id);
			snprintf(i->bitmap, sizeof(i->bitmap), "%s", k->frozen ? k->frozen->name : "");
			snprintf(i->addr, sizeof(i->addr), "%s", k->addr);
			if (fstat(k->scratch_fd, &sb) == 0)
				i->scratch_bytes = (uint64_t)sb.st_blocks * 512;
			pthread_mutex_lock(&k->lock);
			snprintf(i->error, sizeof(i->error), "%s", k->error);
			pthread_mutex_unlock(&k->lock);
		}
		n++;
	}
	return n;
}

int bkp_set_new(struct disk *d, struct nbds *srv, struct loop *main_loop, struct bkp_set **out)
{
	struct bkp_set *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->d = d;
	s->srv = srv;
	s->main_loop = main_loop;
	s->efd = sys_eventfd();
	if (s->efd < 0) {
		r = s->efd;
		free(s);
		return r;
	}
	r = loop_fd_add(main_loop, s->efd, EPOLLIN, set_reap, s, &s->h);
	if (r < 0) {
		close(s->efd);
		free(s);
		return r;
	}
	*out = s;
	return 0;
}

void bkp_set_free(struct bkp_set *s)
{
	if (!s)
		return;
	for (struct bkp *k = s->list; k; k = k->next)
		if (!k->done) {
			char err[200];

			(void)bkp_finish(s, k->name, true, err, sizeof(err));
		}
	/* The structs are the jobs' (freed with them, job_free_all): they
	 * outlive the set. */
	for (struct bkp *k = s->list; k; k = k->next)
		k->set = NULL;
	loop_fd_del(s->main_loop, s->h);
	close(s->efd);
	free(s);
}
