/*
 * disk_: the disk as the daemon's fronts see it (STYLE.md rule 16:
 * fronts -> the disk -> formats -> engines).  A struct disk is the disk
 * being served (the format's struct bdev, or the file itself for raw),
 * the iothreads that serve it (a loop and an engine ctx each: every I/O
 * of every front runs on one of them), and who holds it: the image lock
 * and the format's tables are taken while any front needs them
 * (disk_claim) and let go when the last one is done (disk_release).
 *
 * Fronts: the virtio-blk device on vhost-user (blk.h) and the NBD server
 * (nbds.h).  A front picks an iothread, and from then on submits each
 * request's bdev_io with disk_submit on that iothread, where its
 * completion runs.  Nothing here is taken per request: the raw path of
 * a front stays bdev_submit on the iothread's own ctx.
 *
 * QoS: the disk's budget (qos.h, its limits set at start or by vblkctl
 * set-limits) is the disk's, and every front's requests are admitted
 * through it (disk_admit): a front whose request must wait stops taking
 * work and parks it (virtio-blk: stops popping its ring; NBD: stops
 * reading its socket), then submits it when the budget says.  With no
 * limit set, disk_qos_on is false and nothing is asked.
 *
 * The error policy (pause.c, QEMU's werror=/rerror=): a front whose
 * request failed with an error the policy stops on holds it
 * (disk_hold), and the disk pauses: every front stops taking work
 * (disk_paused) until disk_resume has each front (disk_front) submit what
 * it holds again.
 *
 * Accounting: each front counts its own requests per operation (acct.h,
 * on its iothreads) and hands the sum over through its disk_front (acct):
 * the counters' per-operation families carry a front label.
 *
 * Threading: disk_new/disk_free/disk_claim/disk_release on the main
 * thread; a disk_iothread's ctx belongs to its loop's thread.
 */
#ifndef VBLK_DISK_H
#define VBLK_DISK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/bdev.h"
#include "bitmap/dbm.h"
#include "loop/loop.h"
#include "qos/qos.h"

#define DISK_MAX_IOTHREADS 64

/* The error policy (docs/architecture.md "Errors that pause"): QEMU's
 * -drive werror=/rerror=.  What a request that failed on the disk does:
 * the client gets the error (report), or the request is held and the disk
 * pauses until disk_resume (stop: on any error; enospc: on "No space
 * left on device", any other error is reported). */
enum disk_err_policy {
	DISK_ERR_REPORT,
	DISK_ERR_STOP,
	DISK_ERR_ENOSPC,
};

/* Why the disk paused (the label of vblkd_disk_pauses_total): ENOSPC,
 * EDQUOT, or any other error ("eio": a storage outage, a dead disk). */
enum disk_pause_reason {
	DISK_PAUSE_ENOSPC,
	DISK_PAUSE_EDQUOT,
	DISK_PAUSE_EIO,
	DISK_PAUSE_NR,
};

/* A front as the disk sees it: resume submits again, in order, what it
 * holds for the error policy (on its iothreads, before it looks for new
 * work again) and returns how many; acct adds its per-operation
 * accounting (acct.h) into sum, for the front="name" series (NULL: the
 * front reports its own).  Main thread. */
struct acct;
struct disk_front {
	const char *name;		/* "virtio-blk", "nbd" */
	unsigned (*resume)(void *opaque);
	void (*acct)(void *opaque, struct acct *sum);
	/* Optional: the disk's image and its iothreads' ctxs were replaced
	 * (disk_replace_image), every iothread parked: copies of d->b or
	 * of a disk_iothread's bctx the front keeps are taken again. */
	void (*rebind)(void *opaque);
	void *opaque;
	struct disk_front *next;
};

struct disk_opts {
	unsigned num_iothreads;	/* 0 or 1: one */
	const int *cpus;	/* iothread i pinned to cpus[i % ncpus] */
	unsigned ncpus;
	const struct loop_poll_params *poll;	/* NULL: loop defaults */
	/* Fuzzing: the iothreads' loops are never run; their work (every
	 * loop_call_sync) runs on the caller's thread. */
	bool no_threads;
	/* The QoS budget, made by the caller (qos_new, qos_group_join): the
	 * disk owns it from disk_new on, and frees it with itself or on
	 * failure.  NULL: one of its own with no limit (vblkctl set-limits
	 * may set one). */
	struct qos *qos;
	/* Error policy for reads (rerror) and for writes, flushes,
	 * discards and write zeroes (werror); DISK_ERR_REPORT is 0. */
	enum disk_err_policy rerror, werror;
	/* While paused, resume by itself this often (0: only when told). */
	uint64_t error_retry_ns;
	/* A raw disk's bitmap file (bmfile.c); NULL: the default, beside a
	 * regular file. */
	const char *bitmap_file;
	/* The file under the disk's format (disk_open_image's; NULL: b
	 * itself): the disk keeps them together (disk_replace_image). */
	struct bdev *file;
};

struct disk_iothread {
	unsigned idx;
	int cpu;			/* pinned CPU, or -1 */
	struct loop *loop;
	struct bdev_ctx *bctx;		/* owned by this iothread */
	struct disk *drain_disk;	/* disk_wfilter_set's call */
};

struct disk {
	struct bdev *b;			/* what the fronts serve */
	struct bdev *file;		/* the file under it (b for raw); main */
	unsigned num_iothreads;
	struct disk_iothread *iot;
	/* Fronts that hold the disk now (disk_claim); main thread. */
	unsigned claims;
	/* Connections of fronts other than virtio-blk (the NBD server),
	 * for a start-up note and for vblkctl upgrade's refusal; main
	 * thread. */
	unsigned extra_fronts;
	unsigned next_pick;		/* disk_pick_iothread; main thread */
	/* The QoS budget, never NULL; qos_on its "any limit set" flag, read
	 * per request (disk_qos_on). */
	struct qos *qos;
	const _Atomic uint32_t *qos_on;

	/* The error policy (pause.c).  paused: set by the iothread that
	 * holds the first request, cleared by the main thread (resume); every
	 * front reads it when it looks for work. */
	enum disk_err_policy rerror, werror;
	uint64_t retry_ns;
	atomic_bool paused;
	_Atomic uint64_t held;		/* requests held, all fronts */
	pthread_mutex_t pause_lock;	/* the fields below */
	char pause_reason[200];
	uint64_t paused_since;		/* Unix time */
	uint64_t pauses[DISK_PAUSE_NR];
	int pause_efd;			/* iothread -> main: paused */
	struct loop *main_loop;		/* disk_attach's */
	struct loop_fd *pause_h;
	struct loop_timer *retry_timer;
	struct disk_front *fronts;	/* main thread */

	/* Dirty bitmaps (dirty.c): an immutable array, replaced by main
	 * (release), read by every front's writes (acquire); NULL: none. */
	_Atomic(struct disk_bitmaps *) bitmaps;
	/* A persistent bitmap changed since the last store (main thread). */
	bool bm_unsaved;
	/* A raw disk's bitmap file (bmfile.c): where its persistent bitmaps
	 * live, a qcow2 of its own; NULL until there is one.  Set by main
	 * before any persistent bitmap is published (the marks read it after
	 * the list); bm_lock serialises everything done to it (the marks'
	 * write-ahead from any iothread, main's claims and stores). */
	char *bm_path;
	struct bdev *_Atomic bm;
	struct bdev *bm_file;
	pthread_mutex_t bm_lock;

	/* The write filter (disk_wfilter_set); NULL: none, the usual case:
	 * one load and a branch per request. */
	_Atomic(const struct disk_wfilter *) wfilter;
	/* The guest's virtio-blk rings started at least once (a migration's
	 * destination: the switch-over): an incoming NBD export refuses
	 * writes from then on (nbds.h).  Set by the virtio-blk front. */
	atomic_bool rings_started;
};


/*
 * A guest's writes on one iothread as a write filter sees them: how many
 * are in flight and when the last came (loop_now).  Busy while one is in
 * flight or came within window_ns: work that shares the thread with the
 * guest gives way to it then (a backup's view, a mirror's job).  That
 * thread's only.
 */
struct disk_busy {
	unsigned out;
	uint64_t last_ns;
};

static inline void disk_busy_begin(struct disk_busy *b, const struct loop *l)
{
	b->out++;
	b->last_ns = loop_now(l);
}

static inline void disk_busy_end(struct disk_busy *b)
{
	b->out--;
}

static inline bool disk_busy_now(const struct disk_busy *b, const struct loop *l,
				 uint64_t window_ns)
{
	return b->out || loop_now(l) - b->last_ns < window_ns;
}
/*
 * A write filter (a backup's copy-before-write, backup/bkp.h): while one
 * is set, every write, discard and write zeroes a front submits through
 * disk_submit goes to it instead of the engine, on the front's iothread;
 * it hands the I/O on (bdev_submit on t's ctx) once what it must keep of
 * the old data is kept, and kicks t then.  Reads and flushes go straight.
 */
struct disk_iothread;
struct disk_wfilter {
	void (*submit)(void *opaque, struct disk_iothread *t, struct bdev_io *io);
	/* Optional.  drain: on iothread t, every write of t's that the
	 * filter holds is completed (disk_drain).  sync: on the main thread,
	 * at a migration's switch-over (disk_switchover), whatever
	 * the filter owes elsewhere for the writes completed so far is done
	 * (a mirror: its target has them, flushed) before the caller goes
	 * on; 0 or -errno (it could not: logged). */
	void (*drain)(void *opaque, struct disk_iothread *t);
	int (*sync)(void *opaque);
	void *opaque;
};

struct disk_bitmaps {
	unsigned n;
	struct dbm *b[];
};

/*
 * The format stack of an image (the "open/close of the format
 * stack"): the file or network disk (bdev_open) and the format over it
 * (fmt_open), checked against what the daemon was asked to do with it
 * (copy on read needs a backing chain; a disk served from max_ctxs
 * iothreads cannot take more).  *disk is what the fronts serve (file
 * itself for raw).  0, or -errno with one line for the user in err and
 * nothing left open.  fo->key_fd (a handed-over key) is closed either
 * way.  Main thread.
 */
struct fmt_opts;
int disk_open_image(const struct bdev_opts *bo, const struct fmt_opts *fo, unsigned num_iothreads,
		    struct bdev *file, struct bdev **disk, char *err, size_t errlen);
/* Close what disk_open_image opened: the format's tables written back,
 * the file synced (a failure logged) and closed.  0, or -EIO if the
 * format could not write its tables back.  Main thread, every front and
 * iothread gone. */
int disk_close_image(struct bdev *disk, struct bdev *file);

/*
 * Serve ni->b (over ni->file; b itself for raw) instead of the disk's
 * image from now on: a mirror's pivot (mir.h).  b is checked (the disk's
 * size, as many iothreads, writable if the disk is) and, unless the
 * caller holds it already (ni->held: locked and claimed), taken as a
 * claim takes an image if a front holds the disk; an engine ctx of b is
 * made on every iothread that ni->ctx does not give one for (a qcow2
 * takes one ctx: the mirror's own, which wrote it, so that one instance
 * of its tables is ever in use); then every iothread is parked at once,
 * each after draining what it has in flight (disk_drain) and
 * q->quiesce's own I/O of that thread.  With all parked, q->ready says
 * whether the switch is right now: 0 yes, -EAGAIN not yet (the caller
 * tries again), another -errno no (why in err).  On yes: d->b, d->file
 * and every ctx replaced (the given ctxs and the hold are the disk's
 * now), the write filter cleared (it served the old image), each front's
 * rebind, and the iothreads go on.  The old image's ctxs are freed and
 * its claim let go; *oldb and *oldfile are the caller's to close
 * (disk_close_image).  On failure what ni gave stays the caller's.
 * Refused (-EBUSY, one line): a paused disk, or persistent bitmaps kept
 * with the old image.  Main thread.
 */
struct disk_quiesce {
	void (*quiesce)(void *opaque, struct disk_iothread *t);
	int (*ready)(void *opaque, char *err, size_t errlen);
	void *opaque;
};
struct disk_image {
	struct bdev *b, *file;
	struct bdev_ctx *const *ctx;	/* NULL, or per iothread: b's ctx made there, or NULL */
	bool held;			/* b locked (bdev_lock) and claimed (fmt_claim) */
};
int disk_replace_image(struct disk *d, const struct disk_image *ni,
		       const struct disk_quiesce *q, struct bdev **oldb, struct bdev **oldfile,
		       char *err, size_t errlen);

/* Start the iothreads that serve b, each with its engine ctx.  0 and
 * *out, or -errno (one line logged).  Main thread. */
int disk_new(struct bdev *b, const struct disk_opts *o, struct disk **out);
/* Stop the iothreads and free their ctxs: every front is gone and has
 * drained.  Main thread. */
void disk_free(struct disk *d);

/*
 * A front starts to need the disk (a ring starts, an NBD client
 * connects): the first one takes the image lock (bdev_lock, waiting up
 * to wait_ms for another holder) and has the format read its tables
 * again (fmt_claim); later ones only count.  0, or -errno with one line
 * in err (nothing taken).  disk_release: one front is done, its I/O
 * drained; the last one writes the format's tables back (fmt_release)
 * and drops the lock.  Main thread.
 */
int disk_claim(struct disk *d, unsigned wait_ms, char *err, size_t errlen);
void disk_release(struct disk *d);

/* The iothread a front's new connection should use: round robin (a
 * disk served from one iothread: always 0).  Main thread. */
unsigned disk_pick_iothread(struct disk *d);

/* Submit io on iothread t (its thread only): bdev_submit on t's ctx, or
 * a write through the write filter if one is set. */
static inline void disk_submit(struct disk *d, struct disk_iothread *t, struct bdev_io *io)
{
	const struct disk_wfilter *f = atomic_load_explicit(&d->wfilter, memory_order_acquire);

	if (__builtin_expect(f != NULL, 0) && io->op != BDEV_READ && io->op != BDEV_FLUSH) {
		f->submit(f->opaque, t, io);
		return;
	}
	bdev_submit(d->b, t->bctx, io);
}

/*
 * Set the write filter f (NULL: none).  Setting one returns once every
 * write submitted before it has completed (each iothread's engine
 * drained): from then on every write on the disk went through f or was
 * done before.  Clearing one returns once no front is still inside f's
 * submit (it may still hold I/O it has not handed on: f's to finish).
 * -EBUSY: a filter is set already (one at a time).  Main thread.
 */
int disk_wfilter_set(struct disk *d, const struct disk_wfilter *f);
/* A grace period: a no-op call on every iothread of the disk, so that
 * every callback begun there before this call (a request's submit, a
 * bitmap mark: each runs inside one loop iteration) has ended when it
 * returns.  Main thread. */
void disk_grace(struct disk *d);
/* On iothread t: every write t submitted has completed, the write
 * filter's held ones too (a front's drain before its ring stops). */
static inline void disk_drain(struct disk *d, struct disk_iothread *t)
{
	const struct disk_wfilter *f = atomic_load_explicit(&d->wfilter, memory_order_acquire);

	d->b->engine->drain(t->bctx);
	if (__builtin_expect(f != NULL, 0) && f->drain)
		f->drain(f->opaque, t);
}
/* A migration's switch-over: the virtio-blk front's last ring stopped by
 * GET_VRING_BASE with dirty logging on (vu.h switchover; a shutdown or a
 * reset does not come here): the write filter's sync (a mirror's target
 * brought up to date) before the stop is answered.  Main thread. */
int disk_switchover(struct disk *d);
static inline bool disk_wfilter_on(const struct disk *d)
{
	return atomic_load_explicit(&d->wfilter, memory_order_relaxed) != NULL;
}

/* True if any QoS limit is set: only then does a front ask disk_admit.
 * Any thread. */
static inline bool disk_qos_on(const struct disk *d)
{
	return atomic_load_explicit(d->qos_on, memory_order_relaxed);
}

/*
 * QoS admission of one request of a front's queue (or connection), whose
 * place in the disk's line is turn: 0, it goes now (counted); or the ns
 * to wait before asking again with the same turn, the front keeping the
 * request and taking no other meanwhile (qos_admit_turn: over-budget
 * requests go in the order they came, across fronts and queues).  A front
 * waits in slices (disk.c: about sixteen requests' worth of the budget,
 * 1 to 25 ms), so the budget goes in batches, a wake-up paid per batch.
 * disk_admit_cancel: the request will not ask again (its queue stops).
 * On the front's iothread.
 */
uint64_t disk_admit(struct disk *d, struct qos_turn *turn, bool is_write, uint64_t bytes,
		    uint64_t now);
void disk_admit_cancel(struct disk *d, struct qos_turn *turn);

/* ---- The error policy (pause.c) ---- */

/* Does the policy stop on err (positive errno) for an I/O of op?  Any
 * thread. */
bool disk_error_stops(const struct disk *d, enum bdev_op op, int err);
/* "read", "write", "flush", "discard", "write zeroes". */
const char *disk_op_name(enum bdev_op op);
/* A front holds a request that failed with err (what: "write at offset
 * 4096, queue 0", for the reason): counted, and the disk pauses if it
 * runs.  disk_unhold: n held requests went (submitted again at resume,
 * or failed as their queue stopped).  The front's iothread. */
void disk_hold(struct disk *d, int err, const char *what);
void disk_unhold(struct disk *d, uint64_t n);
/* True while paused: a front takes no new request.  Any thread. */
static inline bool disk_paused(const struct disk *d)
{
	return atomic_load_explicit(&d->paused, memory_order_relaxed);
}
/* The disk's fronts (resumed by disk_resume; their accounting summed by
 * disk_front_acct).  Main thread. */
void disk_front_add(struct disk *d, struct disk_front *f);
void disk_front_del(struct disk *d, struct disk_front *f);
/* Add the accounting of every front named name into sum.  Main thread. */
void disk_front_acct(struct disk *d, const char *name, struct acct *sum);
/* Resume a paused disk: every front submits what it holds again, in the
 * order it was held, before it looks for work again; one that fails again
 * pauses again.  Returns the number submitted again (0: nothing was
 * held).  Main thread. */
int disk_resume(struct disk *d);
/* The pause as it is now.  Main thread. */
struct disk_pause_state {
	bool paused;
	char reason[200];		/* e.g. "No space left on device (write at
					 * offset 4096, queue 0)"; "" if running */
	uint64_t since;			/* Unix time the pause began (paused) */
	uint64_t held;			/* requests held, all fronts */
	uint64_t pauses[DISK_PAUSE_NR];	/* pauses so far, by reason */
};
void disk_pause_state(struct disk *d, struct disk_pause_state *st);
/* The label of a reason: "enospc", "edquot", "eio".  Any thread. */
const char *disk_pause_reason_name(enum disk_pause_reason r);
/* Hear of pauses on the main loop (sd_notify STATUS, the retry timer of
 * disk_opts.error_retry_ns).  Returns 0 or -errno.  Main thread, once.
 * disk_detach undoes it (before that loop is freed; disk_free does it
 * too). */
int disk_attach(struct disk *d, struct loop *main_loop);
void disk_detach(struct disk *d);
/* Upgrade in place: the pause's blob in the device state.  save: bytes
 * written (0: not paused or no room); load: main thread, before any
 * front starts. */
size_t disk_pause_save(struct disk *d, uint8_t *buf, size_t len);
void disk_pause_load(struct disk *d, const uint8_t *buf, size_t len);
/* disk.c's: set up and tear down the policy's state. */
int disk__pause_init(struct disk *d, const struct disk_opts *o);
void disk__pause_free(struct disk *d);

/* ---- Dirty bitmaps (dirty.c) ---- */

int disk__dirty_slow(struct disk *d, struct disk_bitmaps *l, uint64_t off, uint64_t len);
/* A front writes [off, off + len) (a write, discard or write zeroes):
 * every enabled bitmap marks it, before the I/O is submitted, and a raw
 * disk's bitmap file has the region written ahead (bmfile.c).  With no
 * bitmap, one load and a branch.  0, or -errno: the write must fail (its
 * region could not be written ahead).  The front's iothread. */
static inline int disk_dirty(struct disk *d, uint64_t off, uint64_t len)
{
	struct disk_bitmaps *l = atomic_load_explicit(&d->bitmaps, memory_order_acquire);

	if (__builtin_expect(l != NULL, 0))
		return disk__dirty_slow(d, l, off, len);
	return 0;
}
/*
 * vblkctl bitmap: add one (granularity 0: 64 KiB; disabled: marks
 * nothing until enabled), remove (refused while an NBD client reads it),
 * clear, enable or disable, merge sources into dst.  0, or -errno with one
 * line in err (nothing changed).  Main thread.
 */
int disk_bitmap_add(struct disk *d, const char *name, uint32_t gran, bool disabled,
		    bool persistent, char *err, size_t errlen);
int disk_bitmap_remove(struct disk *d, const char *name, char *err, size_t errlen);
int disk_bitmap_clear(struct disk *d, const char *name, char *err, size_t errlen);
int disk_bitmap_enable(struct disk *d, const char *name, bool on, char *err, size_t errlen);
int disk_bitmap_merge(struct disk *d, const char *const *srcs, unsigned n, const char *dst,
		      char *err, size_t errlen);
struct disk_bitmap_info {
	char name[DBM_NAME_MAX + 1];
	uint32_t granularity;
	uint64_t size, dirty;		/* bytes */
	bool enabled, persistent;
	unsigned users;
};
/* Up to max bitmaps' info; returns how many there are.  Main thread. */
unsigned disk_bitmap_list(struct disk *d, struct disk_bitmap_info *out, unsigned max);
/* The bitmap named name, valid until the end of the calling loop
 * callback (an iothread's) or until the next bitmap command (main).
 * NULL: none. */
struct dbm *disk_bitmap_find(struct disk *d, const char *name);
/* The disk grew to size: every bitmap covers it (the grown part clean).
 * 0 or -ENOMEM (the bitmaps keep the old size: writes past it are not
 * marked, logged).  Main thread. */
int disk_bitmaps_grow(struct disk *d, uint64_t size);
/* Whether the persistent bitmaps can follow the disk to size (QEMU's
 * limits; no bitmap of the image left unresized): 0, or -errno with one
 * line in err, the resize then refused.  Main thread. */
int disk_bitmaps_can_grow(struct disk *d, uint64_t size, char *err, size_t errlen);
/* A bitmap no command sees or finds (its name is ""), marked by every
 * write as the named ones are: a backup's record of what was written
 * since its instant (backup/bkp.h).  hidden_add: 0 and *out, or -ENOMEM;
 * hidden_remove: no write marks it once this returns, and it is freed.
 * Main thread. */
int disk_bitmap_hidden_add(struct disk *d, uint32_t gran, struct dbm **out);
void disk_bitmap_hidden_remove(struct disk *d, struct dbm *b);
/*
 * Persistent bitmaps (issue 46: kept with the image, format.h): a
 * persistent bitmap lives in memory while vblkd has the disk and is
 * stored in the image whenever the disk is let go (disk_release: the VM
 * stopped or moved away, vblkd exits; an upgrade's hand-over).
 * disk_bitmaps_open: the image's bitmaps loaded (a raw disk's from its
 * bitmap file, opened if it is there), after disk_new; handover: an
 * upgrade's new process (read at the claim).  0, or -errno with one line
 * in err.  disk_bitmaps_store: the persistent ones
 * written to the image now (every ring stopped); 0 or -errno, logged.
 * At a claim (disk__bitmaps_claimed) the image's bitmaps are loaded again
 * if another process stored some since.  Main thread.
 */
int disk_bitmaps_open(struct disk *d, bool handover, char *err, size_t errlen);
int disk_bitmaps_store(struct disk *d);
/* An upgrade's hand-over (the rings stopped): stored, and a raw disk's
 * bitmap file quiesced for the new process.  0 or -errno with one line. */
int disk_bitmaps_handover(struct disk *d, char *err, size_t errlen);
int disk__bitmaps_claimed(struct disk *d, char *err, size_t errlen);
/* bmfile.c: where persistent bitmaps go (the bitmap file, or the image);
 * the bitmap file opened (create: made if missing; claimed if the disk
 * is), closed; claim/release/quiesce of it with the disk's. */
struct bdev *disk__bm_target(struct disk *d);
int disk__bmfile_open(struct disk *d, bool create, bool handover, char *err, size_t errlen);
void disk__bmfile_close(struct disk *d);
int disk__bmfile_write(struct disk *d, uint64_t off, uint64_t len);
/* 0, 1 if the bitmap file was opened just now (made by another process
 * since this one started: its bitmaps to be loaded), or -errno. */
int disk__bmfile_claim(struct disk *d, char *err, size_t errlen);
void disk__bmfile_release(struct disk *d);
int disk__bmfile_quiesce(struct disk *d, char *err, size_t errlen);
/* The bitmap file grown to the disk's new size (disk_bitmaps_grow): 0 or
 * -errno (logged). */
int disk__bmfile_grow(struct disk *d, uint64_t size);
void disk__bitmaps_free(struct disk *d);

/* Push what was submitted on t to the kernel (the engine's kick). */
static inline void disk_kick(struct disk *d, struct disk_iothread *t)
{
	d->b->engine->kick(t->bctx);
}

#endif
