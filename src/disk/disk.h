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
 * Not here yet (issue 45, the next steps): the error policy's pause and
 * per-operation accounting still live in the virtio-blk front
 * (src/blk/).
 *
 * Threading: disk_new/disk_free/disk_claim/disk_release on the main
 * thread; a disk_iothread's ctx belongs to its loop's thread.
 */
#ifndef VBLK_DISK_H
#define VBLK_DISK_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/bdev.h"
#include "loop/loop.h"
#include "qos/qos.h"

#define DISK_MAX_IOTHREADS 64

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
};

struct disk_iothread {
	unsigned idx;
	int cpu;			/* pinned CPU, or -1 */
	struct loop *loop;
	struct bdev_ctx *bctx;		/* owned by this iothread */
};

struct disk {
	struct bdev *b;			/* what the fronts serve */
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

/* Submit io on iothread t (its thread only): bdev_submit on t's ctx. */
static inline void disk_submit(struct disk *d, struct disk_iothread *t, struct bdev_io *io)
{
	bdev_submit(d->b, t->bctx, io);
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

/* Push what was submitted on t to the kernel (the engine's kick). */
static inline void disk_kick(struct disk *d, struct disk_iothread *t)
{
	d->b->engine->kick(t->bctx);
}

#endif
