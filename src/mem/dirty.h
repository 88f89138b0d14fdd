/*
 * gm_dirty_: the frontend's dirty log, for live migration (qemu
 * docs/interop/vhost-user.rst "Migration", VHOST_USER_SET_LOG_BASE with
 * VHOST_USER_PROTOCOL_F_LOG_SHMFD).  A bitmap the frontend shares with us:
 * bit (page % 8) of byte (page / 8), page = guest-physical address / 4096,
 * set by us after every store we make into guest memory while logging is
 * on, and read-and-cleared by the frontend as it copies pages to the
 * destination.  A page whose bit we set after our store is copied again;
 * a store we forget to log is lost on the destination.
 *
 * Threading: a log is mapped and unmapped by the main thread; it is never
 * unmapped while an iothread may mark it (the main thread first hands every
 * ring a new log or none, through loop_call_sync).  Marking is lock-free
 * (atomic bit sets) from any number of iothreads, concurrently with the
 * frontend clearing words.
 */
#ifndef VBLK_DIRTY_H
#define VBLK_DIRTY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/compiler.h"
#include "mem/gm.h"

#define GM_DIRTY_PAGE_SHIFT 12	/* VHOST_LOG_PAGE */

struct gm_dirty_log {
	_Atomic uint8_t *bits;		/* the frontend's bitmap */
	uint64_t size;			/* bytes of bitmap: covers size * 8 pages */
	void *map;			/* our mapping (page-aligned, holds bits) */
	size_t map_len;
	/* SET_LOG_FD: the frontend's "log changed" eventfd, or -1.  Written
	 * by the main thread only while no ring uses this log, or followed
	 * by a loop_call_sync to each user before the old fd is closed. */
	_Atomic int call_fd;
	/* Marks that fell outside the bitmap: a frontend bug (the log must
	 * cover all guest memory and every used ring's log address). */
	_Atomic uint64_t misses;
	atomic_flag miss_logged;
};

/*
 * Map a log the frontend shares: size bytes at offset in fd (any offset;
 * we map from the page below it).  Refuses a region the fd does not hold
 * (a later access past the end would SIGBUS) and guards the mapping
 * against the frontend shrinking it afterwards (gm_guard_add).  Does not
 * take ownership of fd.  Returns 0 with *out set, or -errno (-EINVAL for
 * a malformed description, with one line logged).  Main thread.
 */
int gm_dirty_map(int fd, uint64_t size, uint64_t offset, struct gm_dirty_log **out);
/* Unmap and free (NULL is fine).  No iothread may still use it.  Main
 * thread. */
void gm_dirty_unmap(struct gm_dirty_log *l);

/* True if [gpa, gpa + len) lies within the pages the log covers. */
static inline bool gm_dirty_covers(const struct gm_dirty_log *l, uint64_t gpa, uint64_t len)
{
	uint64_t last;

	if (len == 0)
		len = 1;
	if (__builtin_add_overflow(gpa, len - 1, &last))
		return false;
	return (last >> GM_DIRTY_PAGE_SHIFT) / 8 < l->size;
}

/* Out of line: count and log (once per log) a mark outside the bitmap. */
void __gm_dirty_miss(struct gm_dirty_log *l, uint64_t gpa, uint64_t len);

/*
 * Mark the pages of guest-physical [gpa, gpa + len) dirty.  The stores
 * being logged must be visible first: callers issue one smp_mb() after
 * their last store and before a group of marks (the bit test below is a
 * load that must not pass those stores; it pairs with the frontend's
 * atomic exchange that clears a word before it copies the pages).  A range
 * outside the bitmap is counted, never written.  Any thread.
 */
static inline void gm_dirty_mark(struct gm_dirty_log *l, uint64_t gpa, uint64_t len)
{
	uint64_t page, last;

	if (len == 0)
		return;
	if (unlikely(!gm_dirty_covers(l, gpa, len))) {
		__gm_dirty_miss(l, gpa, len);
		return;
	}
	last = (gpa + len - 1) >> GM_DIRTY_PAGE_SHIFT;
	for (page = gpa >> GM_DIRTY_PAGE_SHIFT; page <= last; page++) {
		_Atomic uint8_t *b = &l->bits[page / 8];
		uint8_t m = (uint8_t)(1u << (page % 8));

		/* Set bits are common (the used ring's page, every batch):
		 * skip the locked operation for them. */
		if (!(atomic_load_explicit(b, memory_order_relaxed) & m))
			atomic_fetch_or_explicit(b, m, memory_order_relaxed);
	}
}

/* Mark host memory [p, p + len) that lies inside one region of t (as
 * every buffer the rings hand us does).  A pointer outside t is counted
 * as a miss.  Same barrier rule as gm_dirty_mark.  Any thread. */
void gm_dirty_mark_host(struct gm_dirty_log *l, const struct gm_table *t, const void *p,
			uint64_t len);

/* Tell the frontend the log changed, if it gave us an eventfd
 * (SET_LOG_FD).  Any thread. */
void gm_dirty_kick(struct gm_dirty_log *l);

#endif
