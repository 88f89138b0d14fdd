/*
 * vdrv_log_: dirty logging seen from the frontend, the way a migration
 * source drives it (qemu docs/interop/vhost-user.rst, "Migration", "Log
 * description", VHOST_USER_SET_LOG_BASE), and a check that the backend
 * logged every write it made to shared memory.
 *
 * The log is a bitmap in a memfd shared with the backend: bit p covers
 * guest-physical page p (VHOST_LOG_PAGE bytes; GPA = offset in vdrv's
 * memfd, so the bitmap covers all of it).  While VHOST_F_LOG_ALL is on the
 * backend sets the bit of every page it writes (data buffers, status
 * bytes), and of its used-ring writes on rings with VHOST_VRING_F_LOG.
 * The driver's own stores to shared memory are marked in the same bitmap
 * (vdrv_log_mark), as KVM or TCG mark a guest's: a page is dirty whoever
 * wrote it.
 *
 * The check is QEMU's pre-copy replayed in one process, a shadow copy of
 * the shared memory standing for the destination: vdrv_log_start copies
 * every page (the bulk stage); vdrv_log_sync takes each bitmap word with
 * an atomic exchange against 0 and copies the pages whose bits were set;
 * after vdrv_stop_rings, vdrv_log_compare syncs once more and compares the
 * shadow with the memory.  A differing byte was written and never logged:
 * a destination would resume with a stale copy of it.
 *
 * Threads: start, stop and compare on the connecting thread (they use the
 * socket, see vdrv.h); sync on any thread, serialized with those three by
 * a lock; vdrv_log_mark on queue threads, lock-free.
 */
#ifndef VBLK_VDRV_LOG_H
#define VBLK_VDRV_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "driver/vdrv.h"

/* Counters over the connection's life. */
struct vdrv_log_stats {
	uint64_t starts;	/* logging switched on: one bulk copy each */
	uint64_t stops;		/* logging switched off */
	uint64_t syncs;		/* sync passes while on (compare's included) */
	uint64_t dirty_pages;	/* pages those passes copied */
	uint64_t bulk_pages;	/* pages the bulk copies copied */
	uint64_t switch_max_ns;	/* slowest start or stop, messages included */
};

/*
 * Switch logging on, as a migration starts: SET_LOG_BASE with the
 * bitmap's fd and {size, offset 0} (the backend replies, "Communication"),
 * SET_FEATURES with VHOST_F_LOG_ALL, SET_VRING_ADDR with VHOST_VRING_F_LOG
 * and log_guest_addr = the used ring's GPA on every running ring (those
 * two acknowledged when REPLY_ACK is negotiated), then a fresh bulk copy.
 * Queue threads may keep doing I/O throughout.
 *
 * Returns 0; -EINVAL when connected without opts.dirty_log or already on;
 * -ENOTSUP when the backend offers no LOG_SHMFD or no VHOST_F_LOG_ALL;
 * -errno from the exchange (logging is then in an unknown state at the
 * backend: disconnect).  One line for the user in err on failure.
 * Connecting thread.
 */
int vdrv_log_start(struct vdrv *d, char *err, size_t errlen);

/*
 * Switch logging off, as a cancelled migration does: SET_FEATURES without
 * VHOST_F_LOG_ALL, SET_VRING_ADDR without VHOST_VRING_F_LOG on every
 * running ring.  The shadow is stale until the next start.  Queue threads
 * may keep doing I/O.  Returns as vdrv_log_start.  Connecting thread.
 */
int vdrv_log_stop(struct vdrv *d, char *err, size_t errlen);

/*
 * One sync pass: every nonzero bitmap word is exchanged with 0 and the
 * pages whose bits were set are copied from the shared memory into the
 * shadow.  Returns the pages copied, 0 while logging is off, -EINVAL when
 * connected without opts.dirty_log.  Any thread.
 */
int64_t vdrv_log_sync(struct vdrv *d);

/* Called for each run of differing bytes, in address order; a run does
 * not cross a VHOST_LOG_PAGE boundary. */
typedef void vdrv_log_diff_fn(void *opaque, uint64_t gpa, uint64_t len);

/*
 * The migration check's last step: a final sync, then the shadow compared
 * with the shared memory, fn (may be NULL) called for every run of bytes
 * that differ.  Only meaningful with nobody left writing, so every ring
 * must have been stopped (vdrv_stop_rings) while logging was on.  Returns
 * the number of differing bytes, -EINVAL (no dirty logging, or off) or
 * -EBUSY (a ring still runs).  Connecting thread.
 */
int64_t vdrv_log_compare(struct vdrv *d, vdrv_log_diff_fn *fn, void *opaque);

/* A snapshot of the counters (zeroes without opts.dirty_log).  Any thread. */
void vdrv_log_get_stats(struct vdrv *d, struct vdrv_log_stats *st);

/* Out of line part of vdrv_log_mark; not for callers.  Cold: without
 * dirty logging the data path must pay no more than the branch around it,
 * and a call the compiler thought likely would cost every caller a frame
 * (register saves) even when it is never made. */
void vdrv__log_mark(struct vdrv_log *l, uint64_t gpa, size_t len) __attribute__((cold));

/*
 * Mark [p, p + len) dirty after storing to it: call it after the store,
 * never before (a sync between the two would take the bit and copy the
 * old bytes).  Memory outside the shared region is ignored (it is not
 * guest memory).  Without opts.dirty_log this is one predictable branch.
 * Any thread.
 */
static inline void vdrv_log_mark(struct vdrv *d, const void *p, size_t len)
{
	if (d->log)
		vdrv__log_mark(d->log, vdrv_gpa(d, p), len);
}

#endif
