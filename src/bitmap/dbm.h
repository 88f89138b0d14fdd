/*
 * dbm_: a dirty bitmap (issue 46): which ranges of a disk were written
 * since it was created or cleared, one bit per granularity bytes (a power
 * of two, 4 KiB to 2 GiB; QEMU's default 64 KiB).  QEMU's
 * BdrvDirtyBitmap is the model (block/dirty-bitmap.c): a write marks every
 * chunk it touches; a backup reads the dirty chunks.
 *
 * Marks come from any iothread at once (atomic OR on 64-bit words,
 * relaxed: a mark only has to be seen by a reader that comes after the
 * write it covers completed, which the request's own completion orders);
 * everything else is the caller's to serialise (the disk layer, main
 * thread).  The bitmap never shrinks; dbm_grow makes a bigger copy.
 */
#ifndef VBLK_DBM_H
#define VBLK_DBM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DBM_MIN_GRANULARITY 4096u	/* what vblkctl bitmap add takes */
#define DBM_MIN_GRANULARITY_ANY 512u	/* what an image may hold (QEMU's least) */
#define DBM_MAX_GRANULARITY (1u << 31)
#define DBM_DEFAULT_GRANULARITY 65536u
#define DBM_NAME_MAX 63		/* QEMU's BDRV_BITMAP_MAX_NAME_SIZE is 1023;
				 * ours fit a log line and an NBD context */

struct dbm {
	char name[DBM_NAME_MAX + 1];
	uint64_t size;		/* bytes of the disk it covers */
	uint32_t gran_bits;	/* log2 of the granularity */
	uint64_t nbits;
	_Atomic uint64_t *words;
	atomic_bool enabled;	/* marks are taken (else ignored) */
	bool persistent;	/* kept with the image (fmt_bitmaps_store) */
	/* NBD connections that selected it (advisory: removal is refused
	 * while any has; they look it up by name at each use), and a
	 * removal under way (dbm_use). */
	_Atomic unsigned users;
	atomic_bool removing;
};

/* A connection's use of b (an iothread), against a removal (main: sets
 * removing, then looks at users): both sides seq_cst, so either the
 * removal sees the user or the user sees the removal and backs out
 * (false: b is going, not to be selected). */
static inline bool dbm_use(struct dbm *b)
{
	atomic_fetch_add(&b->users, 1);
	if (!atomic_load(&b->removing))
		return true;
	atomic_fetch_sub(&b->users, 1);
	return false;
}

/* The use given back; never below 0 (a bitmap of the same name made
 * after the one selected was dropped with the image's). */
static inline void dbm_unuse(struct dbm *b)
{
	unsigned u = atomic_load(&b->users);

	while (u && !atomic_compare_exchange_weak(&b->users, &u, u - 1))
		;
}

/* A valid name: 1..DBM_NAME_MAX of [A-Za-z0-9_.-].  Any thread. */
bool dbm_name_ok(const char *name);

/* A clean bitmap named name over size bytes at granularity gran (a power
 * of two, DBM_MIN_GRANULARITY_ANY to DBM_MAX_GRANULARITY).  0, -EINVAL (a
 * bad name or granularity), -ENOMEM. */
int dbm_new(const char *name, uint64_t size, uint32_t gran, struct dbm **out);
void dbm_free(struct dbm *b);

static inline uint32_t dbm_granularity(const struct dbm *b)
{
	return 1u << b->gran_bits;
}

/* Set the bits of [off, off + len) (clipped to the size), enabled or
 * not.  Any thread. */
static inline void dbm_set(struct dbm *b, uint64_t off, uint64_t len)
{
	uint64_t first, last;

	if (!len || off >= b->size)
		return;
	if (len > b->size - off)
		len = b->size - off;
	first = off >> b->gran_bits;
	last = (off + len - 1) >> b->gran_bits;
	for (uint64_t w = first / 64; w <= last / 64; w++) {
		uint64_t lo = w == first / 64 ? first % 64 : 0;
		uint64_t hi = w == last / 64 ? last % 64 : 63;
		uint64_t m = (hi == 63 ? ~0ull : (2ull << hi) - 1) & ~((1ull << lo) - 1);

		/* Already set (a hot range written again): no locked op. */
		if ((atomic_load_explicit(&b->words[w], memory_order_relaxed) & m) != m)
			atomic_fetch_or_explicit(&b->words[w], m, memory_order_relaxed);
	}
}

/* A write to [off, off + len): marked if the bitmap is enabled.  Any
 * thread. */
static inline void dbm_mark(struct dbm *b, uint64_t off, uint64_t len)
{
	if (atomic_load_explicit(&b->enabled, memory_order_relaxed))
		dbm_set(b, off, len);
}

/* Clear the bits of [off, off + len) (clipped to the size; whole chunks
 * inside it only, a chunk partly covered stays as it is): a copier takes
 * them before it copies, and a write meanwhile sets them again.  Any
 * thread. */
void dbm_reset(struct dbm *b, uint64_t off, uint64_t len);

/* Bytes dirty (whole chunks, the last one clipped to the size). */
uint64_t dbm_dirty_bytes(const struct dbm *b);
/* Everything clean. */
void dbm_clear(struct dbm *b);
/* dst |= src, byte ranges as src has them dirty (granularities may
 * differ: a dst chunk is dirty if any src chunk in it is).  Sizes may
 * differ: what lies past dst's size is ignored. */
void dbm_merge(struct dbm *dst, const struct dbm *src);
/* The run from off: *len bytes, at most max, all dirty (returns true) or
 * all clean (false), ending at a chunk boundary or the size.  From the
 * size on (off >= size): max bytes, dirty. */
bool dbm_extent(const struct dbm *b, uint64_t off, uint64_t max, uint64_t *len);
/* A copy of b covering size (>= b's) bytes, same name, granularity,
 * state and bits (NULL: out of memory).  Marks on b meanwhile are the
 * caller's to carry over (dbm_merge after no writer sees b). */
struct dbm *dbm_grow(const struct dbm *b, uint64_t size);

#endif
