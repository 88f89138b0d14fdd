/*
 * Description: dirty bitmaps (bitmap/dbm.h): a mark sets every chunk it
 * touches and no other (ranges inside one word, across words, clipped at
 * the size, zero length, past the end); a disabled bitmap takes no mark
 * but dbm_set and merges; dirty bytes count whole chunks with the last
 * one clipped to the size; extents alternate dirty and clean runs that
 * cover the disk exactly (start mid-chunk, capped by max); merge between
 * granularities (4K into 64K makes the whole 64K chunk dirty, 64K into 4K
 * the sixteen 4K ones) and sizes; clear; grow keeps the bits and adds
 * clean ones; reset clears whole chunks inside a range only; names and granularities refused as they should be; two
 * threads marking interleaved chunks of the same words lose no bit.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#include "test.h"

#include "bitmap/dbm.h"

#define K 1024ull
#define M (1024ull * 1024)

static struct dbm *mk(uint64_t size, uint32_t gran)
{
	struct dbm *b;

	ASSERT_EQ(dbm_new("b", size, gran, &b), 0);
	return b;
}

static bool dirty_at(const struct dbm *b, uint64_t off)
{
	uint64_t len;

	return dbm_extent(b, off, 1, &len);
}

static void test_marks(void)
{
	struct dbm *b = mk(10 * M + 5 * K, 64 * K);	/* 161 chunks, last one partial */

	dbm_mark(b, 0, 1);
	ASSERT_TRUE(dirty_at(b, 0) && dirty_at(b, 64 * K - 1) && !dirty_at(b, 64 * K));
	dbm_mark(b, 64 * K - 1, 2);				/* straddles 0|1 */
	ASSERT_TRUE(dirty_at(b, 64 * K) && !dirty_at(b, 128 * K));
	dbm_mark(b, 60 * 64 * K, 10 * 64 * K);			/* chunks 60..69: two words */
	ASSERT_TRUE(!dirty_at(b, 59 * 64 * K) && dirty_at(b, 60 * 64 * K) &&
		    dirty_at(b, 63 * 64 * K) && dirty_at(b, 64 * 64 * K) &&
		    dirty_at(b, 69 * 64 * K) && !dirty_at(b, 70 * 64 * K));
	dbm_mark(b, 5 * M, 0);
	ASSERT_TRUE(!dirty_at(b, 5 * M));
	dbm_mark(b, 20 * M, 4 * K);				/* past the end */
	dbm_mark(b, 10 * M, 1 * M);				/* clipped: the last chunk */
	ASSERT_EQ(dbm_dirty_bytes(b), (2 + 10) * 64 * K + 5 * K);
	dbm_clear(b);
	ASSERT_EQ(dbm_dirty_bytes(b), 0);
	atomic_store(&b->enabled, false);
	dbm_mark(b, 0, M);
	ASSERT_EQ(dbm_dirty_bytes(b), 0);
	dbm_set(b, 0, M);
	ASSERT_EQ(dbm_dirty_bytes(b), M);
	dbm_free(b);
}

/* dbm_reset clears whole chunks inside the range only; the last chunk,
 * clipped to the size, counts whole at the end. */
static void test_reset(void)
{
	struct dbm *b = mk(10 * M + 5 * K, 64 * K);	/* 161 chunks, last one partial */

	dbm_set(b, 0, 10 * M + 5 * K);
	dbm_reset(b, 64 * K + 1, 3 * 64 * K);		/* chunks 2, 3 whole; 1, 4 partly */
	ASSERT_TRUE(dirty_at(b, 64 * K) && !dirty_at(b, 2 * 64 * K) &&
		    !dirty_at(b, 3 * 64 * K) && dirty_at(b, 4 * 64 * K));
	dbm_reset(b, 60 * 64 * K, 10 * 64 * K);		/* 60..69, across words */
	ASSERT_TRUE(dirty_at(b, 59 * 64 * K) && !dirty_at(b, 60 * 64 * K) &&
		    !dirty_at(b, 63 * 64 * K) && !dirty_at(b, 64 * 64 * K) &&
		    !dirty_at(b, 69 * 64 * K) && dirty_at(b, 70 * 64 * K));
	dbm_reset(b, 10 * M, 1 * M);			/* the clipped last chunk */
	ASSERT_TRUE(!dirty_at(b, 10 * M) && dirty_at(b, 10 * M - 1));
	ASSERT_EQ(dbm_dirty_bytes(b), (160 - 2 - 10) * 64 * K);
	dbm_reset(b, 0, 0);
	dbm_reset(b, 20 * M, 4 * K);			/* past the end */
	ASSERT_EQ(dbm_dirty_bytes(b), (160 - 2 - 10) * 64 * K);
	dbm_free(b);
}

static void test_extents(void)
{
	struct dbm *b = mk(8 * M, 4 * K);
	uint64_t off = 0, len, covered = 0;
	bool want = false;
	unsigned runs = 0;

	dbm_mark(b, 4 * K, 4 * K);
	dbm_mark(b, 1 * M, 3 * M);		/* whole words dirty */
	dbm_mark(b, 8 * M - 1, 1);
	while (off < 8 * M) {
		bool d = dbm_extent(b, off, UINT64_MAX, &len);

		ASSERT_EQ(d, want);		/* runs alternate */
		ASSERT_TRUE(len > 0);
		want = !want;
		off += len;
		covered += len;
		runs++;
	}
	ASSERT_EQ(covered, 8 * M);
	ASSERT_EQ(runs, 6);
	ASSERT_TRUE(dbm_extent(b, 1 * M + 100, 64 * K, &len));
	ASSERT_EQ(len, 64 * K);			/* capped by max */
	ASSERT_TRUE(!dbm_extent(b, 10 * K, UINT64_MAX, &len));
	ASSERT_EQ(len, 1 * M - 10 * K);	/* from mid-chunk to the next run */
	/* Past the size (a disk grown before its bitmaps): dirty, never a
	 * read past the words or a run of 0 bytes. */
	ASSERT_TRUE(dbm_extent(b, 8 * M, 64 * K, &len));
	ASSERT_EQ(len, 64 * K);
	ASSERT_TRUE(dbm_extent(b, 1ull << 50, 4 * K, &len));
	ASSERT_EQ(len, 4 * K);
	dbm_free(b);
}

static void test_merge_and_grow(void)
{
	struct dbm *small = mk(4 * M, 4 * K), *big = mk(4 * M, 64 * K), *g;

	dbm_mark(small, 68 * K, 1);
	dbm_merge(big, small);
	ASSERT_TRUE(dirty_at(big, 64 * K) && !dirty_at(big, 0));
	ASSERT_EQ(dbm_dirty_bytes(big), 64 * K);
	dbm_clear(small);
	dbm_merge(small, big);
	ASSERT_EQ(dbm_dirty_bytes(small), 64 * K);
	ASSERT_TRUE(dirty_at(small, 64 * K) && dirty_at(small, 127 * K) && !dirty_at(small, 128 * K));
	g = dbm_grow(big, 16 * M);
	ASSERT_TRUE(g != NULL);
	ASSERT_EQ(g->size, 16 * M);
	ASSERT_EQ(dbm_dirty_bytes(g), 64 * K);
	dbm_mark(g, 15 * M, 1);
	ASSERT_EQ(dbm_dirty_bytes(g), 128 * K);
	dbm_merge(big, g);			/* past big's size: ignored */
	ASSERT_EQ(dbm_dirty_bytes(big), 64 * K);
	dbm_free(g);
	dbm_free(small);
	dbm_free(big);
}

static void test_refusals(void)
{
	struct dbm *b;

	ASSERT_EQ(dbm_new("", M, 64 * K, &b), -EINVAL);
	ASSERT_EQ(dbm_new("a/b", M, 64 * K, &b), -EINVAL);
	/* 512 bytes is the least an image may hold (QEMU's); vblkctl's 4K
	 * is the disk layer's rule. */
	ASSERT_EQ(dbm_new("b", M, 256, &b), -EINVAL);
	ASSERT_EQ(dbm_new("b", M, 512, &b), 0);
	ASSERT_EQ(b->nbits, M / 512);
	dbm_free(b);
	ASSERT_EQ(dbm_new("b", M, 96 * K, &b), -EINVAL);
	ASSERT_EQ(dbm_new("0123456789012345678901234567890123456789012345678901234567890123",
			  M, 64 * K, &b), -EINVAL);
	ASSERT_EQ(dbm_new("ok.name_1-2", 0, 64 * K, &b), 0);
	ASSERT_EQ(dbm_dirty_bytes(b), 0);
	dbm_free(b);
}

struct marker {
	struct dbm *b;
	unsigned first;
};

static void *mark_every_other(void *opaque)
{
	struct marker *m = opaque;

	for (unsigned r = 0; r < 200; r++)
		for (uint64_t i = m->first; i < 4096; i += 2)
			dbm_mark(m->b, i * 4 * K, 1);
	return NULL;
}

static void test_concurrent_marks(void)
{
	struct dbm *b = mk(4096 * 4 * K, 4 * K);
	struct marker a = { b, 0 }, c = { b, 1 };
	pthread_t t1, t2;

	ASSERT_EQ(pthread_create(&t1, NULL, mark_every_other, &a), 0);
	ASSERT_EQ(pthread_create(&t2, NULL, mark_every_other, &c), 0);
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	ASSERT_EQ(dbm_dirty_bytes(b), 4096 * 4 * K);
	dbm_free(b);
}

int main(void)
{
	RUN(test_marks);
	RUN(test_reset);
	RUN(test_extents);
	RUN(test_merge_and_grow);
	RUN(test_refusals);
	RUN(test_concurrent_marks);
	return T_EXIT_PASS;
}
