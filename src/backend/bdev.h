/*
 * bdev_: the block backend.  A struct bdev is the opened disk (file or
 * block device) plus the ops table of the I/O engine chosen with
 * --backend; each iothread creates its own struct bdev_ctx from it, so
 * nothing on the I/O path is shared between threads.
 *
 * Threading: bdev_open/bdev_close on the main thread before/after
 * iothreads run; a bdev_ctx and every bdev_io submitted to it belong to the
 * iothread that created the ctx.  Completion callbacks run on that thread,
 * possibly inline from bdev_submit() (errors, null backend).
 */
#ifndef VBLK_BDEV_H
#define VBLK_BDEV_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct loop;

enum bdev_cache {
	BDEV_CACHE_AUTO,	/* O_DIRECT where the file supports it */
	BDEV_CACHE_NONE,	/* O_DIRECT, or fail */
	BDEV_CACHE_WRITEBACK,	/* page cache */
};

/* Polled I/O (io_uring's IORING_SETUP_IOPOLL), --iopoll. */
enum bdev_iopoll {
	BDEV_IOPOLL_AUTO,	/* where the disk's device has poll queues */
	BDEV_IOPOLL_ON,		/* there, or fail to open */
	BDEV_IOPOLL_OFF,
};

struct bdev_opts {
	const char *path;
	const char *engine;	/* "io_uring" (default) */
	bool read_only;
	enum bdev_cache cache;
	unsigned block_size;	/* 0: the device's logical size, else 512 */
	uint64_t size;		/* engines without a disk (null): bytes */
	bool uring_sqpoll;	/* io_uring: IORING_SETUP_SQPOLL */
	bool no_early_submit;	/* io_uring: always batch submissions (ablation) */
	bool no_sync_io;	/* io_uring: tmpfs reads/writes through the ring too (ablation) */
	enum bdev_iopoll iopoll;
	const char *ceph_conf;	/* rbd: ceph.conf (NULL: librados' search) */
	const char *ceph_id;	/* rbd: client id (NULL: admin) */
	/* take_fd: serve fd, the disk the previous process had open (upgrade
	 * in place: the same open file, so the same image lock), instead of
	 * opening path.  bdev_open owns fd from then on. */
	bool take_fd;
	int fd;
};

enum bdev_op {
	BDEV_READ,
	BDEV_WRITE,
	BDEV_FLUSH,
	BDEV_DISCARD,		/* offset/len: deallocate (advisory) */
	BDEV_WRITE_ZEROES,	/* offset/len: reads return zeroes after; unmap allows
				 * deallocation */
};

/* What an engine can do beyond read/write/flush. */
#define BDEV_CAP_DISCARD      (1u << 0)
#define BDEV_CAP_WRITE_ZEROES (1u << 1)
/* Writes can be made durable on their own (io->fua); without it bdev.c
 * follows such a write with a flush. */
#define BDEV_CAP_FUA          (1u << 2)

struct bdev_io;
typedef void (*bdev_cb)(struct bdev_io *io, int res);

/* One I/O.  Owned by the submitter until cb runs; the iovec array must
 * stay valid until then, and engines never change it (the submitter may
 * still need it at completion, e.g. to log what a read stored in guest
 * memory): a short transfer continues on a private copy
 * (bdev_io_consume). */
struct bdev_io {
	enum bdev_op op;
	bool fua;		/* write: durable before completion (RWF_DSYNC) */
	bool unmap;		/* write zeroes: may deallocate */
	/* read: a format with a backing chain copies what the chain gives
	 * into the image (copy on read for this read: vblkctl stream) */
	bool copy_up;
	uint64_t offset;
	uint64_t length;	/* discard / write zeroes only */
	struct iovec *iov;
	unsigned iovcnt;
	bdev_cb cb;		/* res: 0 or -errno */
	/* A write filter's (disk.h, disk_wfilter) that wraps the completion:
	 * the submitter's cb, and the filter's own pointer, while it does. */
	bdev_cb up_cb;
	void *up_priv;

	/* Engine-private. */
	struct bdev *b;
	struct bdev_ctx *ctx;
	struct bdev_io *next;	/* engine queues */
	int res;
	bool zero_retried;	/* write zeroes: tried the other way already */
	bool fua_flush;		/* a FUA write done, its flush running */
	bool polled;		/* io_uring: on the polled ring */
	/* A flush failed because writes acknowledged earlier may be lost
	 * (cache_lost, NBD's lost_unflushed): the guest must hear it, so
	 * blk's error policy never holds it for a retry that could succeed. */
	bool lost;
	uint64_t mark;		/* nbd: a flush's count of writes it covers */
	size_t len;
	void *bounce;		/* aligned copy for misaligned O_DIRECT buffers */
	struct iovec bounce_iov;
	struct iovec *user_iov;
	unsigned user_iovcnt;
	size_t bounce_done, bounce_total;	/* bytes: parts done, whole I/O */
	uint64_t bounce_offset;			/* the whole I/O's */
	struct iovec *rest;	/* bdev_io_consume's copy (freed at completion) */
	/* What bdev_io_consume advanced, put back at completion: a request
	 * is given back as it was submitted (the error policy submits a
	 * held one again). */
	struct iovec *orig_iov;
	unsigned orig_iovcnt;
	uint64_t orig_offset;
};

struct bdev;
struct bdev_ctx;

/* Does spinning pay while the device works?  An engine's measurement. */
struct bdev_spin_stats {
	uint64_t checks;	/* measurements that came to a decision */
	uint64_t off;		/* 1 while the last one said: do not spin */
};

struct bdev_engine {
	const char *name;
	bool no_disk;		/* needs no file: size comes from bdev_opts */
	unsigned caps;		/* BDEV_CAP_* */
	/* Per-iothread instance; depth bounds I/Os in flight.  -errno. */
	int (*ctx_new)(struct bdev *b, struct loop *l, unsigned depth,
		       struct bdev_ctx **out);
	void (*ctx_free)(struct bdev_ctx *c);
	/* Queue an I/O; it may complete inline. */
	void (*submit)(struct bdev_ctx *c, struct bdev_io *io);
	/* Push queued I/Os to the kernel: one syscall per batch. */
	void (*kick)(struct bdev_ctx *c);
	/* Block until every submitted I/O has completed and called back. */
	void (*drain)(struct bdev_ctx *c);
	/* Optional: how many times kick (or early submission) handed
	 * queued I/Os to the kernel, one syscall each.  The ctx's thread. */
	uint64_t (*submits)(const struct bdev_ctx *c);
	/* Optional: I/Os completed by polling the device (IOPOLL). */
	uint64_t (*polled)(const struct bdev_ctx *c);
	/* Optional: reads and writes done with a plain syscall on the ctx's
	 * thread instead of the engine's queue (io_uring on tmpfs). */
	uint64_t (*sync_ios)(const struct bdev_ctx *c);
	/* Optional: the engine's measurement of whether spinning pays while
	 * the device works (io_uring: uring_spin_note). */
	void (*spin_stats)(const struct bdev_ctx *c, struct bdev_spin_stats *s);

	/* Engines that are their own disk (network clients: rbd, nbd): open
	 * the disk --disk names, filling struct bdev (size, block sizes,
	 * read_only, caps, priv); one line for the user in err on failure,
	 * nothing left open.  close undoes it.  Main thread. */
	int (*open)(struct bdev *b, const struct bdev_opts *o, char *err, size_t errlen);
	void (*close)(struct bdev *b);
	/* Such an engine's synchronous read of [off, off+len), for what a
	 * format reads at open (bdev_pread).  0 or -errno.  Main thread,
	 * before any ctx exists. */
	int (*pread)(struct bdev *b, void *buf, size_t len, uint64_t off);
	/* The image lock, for engines with their own (see bdev_lock); NULL:
	 * the file lock of lock.c.  Main thread. */
	int (*lock)(struct bdev *b);
	void (*unlock)(struct bdev *b);
	/* Engines that are their own disk: the disk is to be size bytes (a
	 * multiple of the block size, more than now); check that it has
	 * grown that far (the engine never grows it itself).  0, or -errno
	 * with one line in err.  NULL: the size cannot change.  A format's
	 * disk (format.h) has one too: the file's size is not the disk's.
	 * Main thread. */
	int (*resize)(struct bdev *b, uint64_t size, char *err, size_t errlen);
};

struct bdev {
	char *path;
	int fd;
	uint64_t size;		/* bytes, a multiple of block_size; grows only
				 * (bdev_resize), so other threads READ_ONCE it */
	unsigned block_size;	/* logical block exported to the guest */
	unsigned size_tail;	/* bytes of the file past the last whole block */
	unsigned phys_block_size;
	/* What the disk deallocates in (bytes, a power of two >= block_size):
	 * a block device's queue/discard_granularity, a file's st_blksize. */
	unsigned discard_granularity;
	uint64_t discard_max_bytes;	/* 0: no limit from the disk */
	bool no_discard;	/* a block device that cannot discard */
	bool read_only;
	bool is_blockdev;
	bool direct;		/* opened O_DIRECT */
	/* A device completes its I/O, not our CPU: O_DIRECT, and not on a
	 * memory file system (tmpfs).  Otherwise io_uring's worker does, and
	 * when it shares the iothread's one CPU nothing is spun for it
	 * (uring.c). */
	bool device_completes;
	/* A file on tmpfs or ramfs: a read or write is a copy made by the
	 * CPU that never waits for a device (swap aside), so io_uring would
	 * only hand it to its worker (uring.c: done on the iothread). */
	bool memory_fs;
	unsigned dio_mem_align;	/* buffer alignment O_DIRECT needs */
	/* ... and each segment's length (the device's logical block: the
	 * kernel checks every iovec, not only the total; 0: as mem_align) */
	unsigned dio_len_align;
	/* This struct was allocated by its opener (a mirror's local
	 * target): whoever closes it last frees it too, the disk after a
	 * pivot included (set after bdev_open, which clears the struct). */
	bool heap;
	bool uring_sqpoll;
	bool no_early_submit;
	bool no_sync_io;
	/* Reads and writes are polled for (io_uring IOPOLL): the device has
	 * poll queues, which raise no interrupt (uring.c). */
	bool iopoll;
	bool locked;		/* bdev_lock holds the image lock */
	/* Through the page cache (!direct), a flush failed: Linux marks the
	 * pages it could not write clean, the next fdatasync succeeds, and
	 * what they held is gone.  From then on every flush fails (-EIO),
	 * as QEMU's file driver does (page_cache_inconsistent).  Any
	 * thread (bdev_flush_failed). */
	_Atomic bool cache_lost;
	/* The last data extent lseek SEEK_HOLE found (format.c,
	 * raw_block_status), as QEMU's BdrvBlockStatusCache: on tmpfs a
	 * SEEK_HOLE walks the page cache to the next hole, the file's end
	 * for one all data (~7 ms per GiB), so a query inside it is answered
	 * from here.  Only data is kept, which a write cannot make wrong; a
	 * discard or write zeroes in it drops it (bdev_submit).  Any thread:
	 * under bsc_lock. */
	atomic_flag bsc_lock;
	uint64_t bsc_start, bsc_end;
	unsigned caps;		/* BDEV_CAP_*: the engine's, less what this disk lacks */
	unsigned max_ctxs;	/* iothreads that may serve this disk; 0: any */
	/* A write at offset 0 for which this says true fails (-EPERM): a
	 * detected raw image keeps the guest from writing a format's magic
	 * there (format.h, fmt_probe_magic).  NULL: none.  Set before
	 * iothreads run. */
	bool (*write_guard)(const struct bdev_io *io);
	const struct bdev_engine *engine;
	void *priv;		/* the engine's state for this disk (open/close) */
};

/*
 * Open the disk.  On failure returns -errno and writes one line for the
 * user into err (what is wrong and what to do); nothing is left open.
 * Main thread.
 */
int bdev_open(const struct bdev_opts *o, struct bdev *b, char *err, size_t errlen);
void bdev_close(struct bdev *b);

/*
 * Grow the disk to size bytes, under a running guest: a file is extended
 * (sparse); a block device or an RBD image must already have grown that
 * far (lvextend, rbd resize) and is only re-read.  size must be a multiple
 * of the block size and not below the current size: shrinking would cut
 * off data the guest has.  Returns 0 (also when size is the current size)
 * or -errno with one line for the user in err; the size is unchanged on
 * failure.  The new size is published with WRITE_ONCE: iothreads check
 * requests against READ_ONCE(b->size).  Main thread.
 */
int bdev_resize(struct bdev *b, uint64_t size, char *err, size_t errlen);

/*
 * The image lock (lock.c): while a frontend's rings run, a writable disk
 * is locked exclusively against other writers, in QEMU's file locking
 * convention, so another vblkd, QEMU or qemu-storage-daemon writing the
 * same image conflicts (docs/architecture.md "Migration", "The image
 * lock").  bdev_lock returns 0 (also for read-only and diskless exports,
 * which take no lock), -EBUSY with one line logged when another process
 * holds it still after wait_ms of trying again, or -errno.  A vblkd
 * killed a moment ago lets go of it only once the kernel has torn down
 * its io_uring (~30-100 ms seen here): BDEV_LOCK_WAIT_MS covers that.  bdev_lock_busy tells whether someone else holds
 * it now (for a note at start-up).  Main thread.
 */
#define BDEV_LOCK_WAIT_MS 2000u
int bdev_lock(struct bdev *b, unsigned wait_ms);
void bdev_unlock(struct bdev *b);
bool bdev_lock_busy(const struct bdev *b);

/*
 * A reader's lock for the life of the open file: a backing file, which
 * must not change under its overlays.  QEMU's convention (lock.c): we use
 * consistent reads, and let nobody else write.  0, -EBUSY when someone
 * writes it now (or holds our "no writers" byte exclusively), or -errno.
 * Closing the file drops it.  Main thread.
 */
int bdev_lock_shared(struct bdev *b);

/* Engines built in. */
extern const struct bdev_engine bdev_uring_engine;
extern const struct bdev_engine bdev_null_engine;
extern const struct bdev_engine bdev_threads_engine;
extern const struct bdev_engine bdev_aio_engine;	/* only with libaio */

/* Engines in modules, loaded when a disk needs them: rbd and nbd (see
 * module.h). */

/* Read [off, off+len) of b outside the data path (a format's header at
 * open): a file with pread (buf and len aligned as b->direct needs), an
 * engine that is its own disk with its synchronous read (engine->pread).
 * 0 or -errno (-EIO past the end).  Main thread, before iothreads take
 * ctxs of b. */
int bdev_pread(struct bdev *b, void *buf, size_t len, uint64_t off);

/* Run one I/O synchronously with plain syscalls (preadv/pwritev2/
 * fdatasync/fallocate), finishing short transfers.  Returns 0 or -errno.
 * For engines that do the work in their own threads.  Any thread. */
int bdev_io_sync(struct bdev *b, struct bdev_io *io);

/* Names of the engines this vblkd has, built in or as modules, for
 * messages ("io_uring, null, ..."). */
const char *bdev_engine_names(void);
/* An engine built in by name (NULL: the default), or NULL. */
const struct bdev_engine *bdev_engine_find(const char *name);

static inline int bdev_ctx_new(struct bdev *b, struct loop *l, unsigned depth,
			       struct bdev_ctx **out)
{
	return b->engine->ctx_new(b, l, depth, out);
}

/* The engine's submits counter, 0 for engines without one. */
static inline uint64_t bdev_ctx_submits(const struct bdev *b, const struct bdev_ctx *c)
{
	return b->engine->submits && c ? b->engine->submits(c) : 0;
}

/* The engine's spinning measurement, zeros for engines without one. */
static inline void bdev_ctx_spin_stats(const struct bdev *b, const struct bdev_ctx *c,
				       struct bdev_spin_stats *s)
{
	*s = (struct bdev_spin_stats){ 0 };
	if (b->engine->spin_stats && c)
		b->engine->spin_stats(c, s);
}

/* The engine's polled counter, 0 for engines without one. */
static inline uint64_t bdev_ctx_polled(const struct bdev *b, const struct bdev_ctx *c)
{
	return b->engine->polled && c ? b->engine->polled(c) : 0;
}

/* The engine's sync_ios counter, 0 for engines without one. */
static inline uint64_t bdev_ctx_sync_ios(const struct bdev *b, const struct bdev_ctx *c)
{
	return b->engine->sync_ios && c ? b->engine->sync_ios(c) : 0;
}

/* Submit, bouncing through an aligned buffer when O_DIRECT needs it. */
void bdev_submit(struct bdev *b, struct bdev_ctx *c, struct bdev_io *io);

/* The block-status cache (bsc_* above): get answers whether off lies in
 * the cached data extent (and its end then in *end); set keeps one; drop
 * forgets it if it meets [off, off + len).  Any thread. */
bool bdev_bsc_get(struct bdev *b, uint64_t off, uint64_t *end);
void bdev_bsc_set(struct bdev *b, uint64_t start, uint64_t end);
void bdev_bsc_drop(struct bdev *b, uint64_t off, uint64_t len);

/* One buffer for the I/O (for O_DIRECT alignment, or an engine whose
 * client takes no iovecs, like libnbd's): io->iov becomes one aligned
 * copy, filled now for a write and copied back to the submitter's iovecs
 * at completion for a read.  An I/O longer than BDEV_BOUNCE_MAX goes in
 * parts of that size, one after the other, through one buffer: what a
 * request costs us in memory does not grow with its length (the guest can
 * point every descriptor of a 4 GiB request at one misaligned page).
 * Returns 0 or -ENOMEM.  The I/O's thread. */
#define BDEV_BOUNCE_MAX (1u << 20)
int bdev_io_bounce(struct bdev_io *io);

/* Engines, after a short read/write of done bytes: advance io (iov,
 * iovcnt, offset, len) past them, on a private copy of the iovecs made
 * the first time.  Returns 0 or -ENOMEM.  The I/O's thread. */
int bdev_io_consume(struct bdev_io *io, size_t done);

/* Called by engines when an I/O finished: undoes the bounce, applies the
 * generic fallbacks (see bdev.c), then cb. */
void bdev_complete(struct bdev_io *io, int res);

/* A flush of b failed with res (an fdatasync, a flush request, a
 * write-through write): through the page cache, b->cache_lost from now
 * on, logged once.  Any thread. */
void bdev_flush_failed(struct bdev *b, int res);

/* fallocate(2) mode for a discard / write-zeroes on this disk: files and
 * block devices take different flag sets for the same meaning. */
int bdev_fallocate_mode(const struct bdev *b, const struct bdev_io *io);

#endif
