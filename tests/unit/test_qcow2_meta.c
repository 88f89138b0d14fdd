/*
 * Description: the set of a qcow2 image's metadata clusters
 * (format/qcow2_meta.c), the overlap check's memory: every cluster added is
 * found with its kind, a second add of a cluster reports the kind it has
 * and changes nothing, a deletion (backward shift) loses no other entry,
 * and mismatch names the first cluster of a range that is not of a kind.
 * Checked against a plain array through 200,000 random operations on a
 * small universe, so probe runs wrap around the table and collide.
 */
#include <errno.h>
#include <stdlib.h>

#include "test.h"

#include "format/qcow2.h"

#define UNIVERSE 4096

static void test_random_against_array(void)
{
	static uint8_t ref[UNIVERSE];
	struct qcow2_meta m = { 0 };
	uint64_t x = 88172645463325252ull;
	size_t n = 0;

	for (unsigned i = 0; i < 200000; i++) {
		uint64_t c;
		unsigned op, kind;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		c = x % UNIVERSE;
		op = (unsigned)(x >> 32) % 3;
		kind = 1 + (unsigned)(x >> 40) % (Q2M_KINDS - 1);
		if (op == 0) {
			int r = qcow2_meta_add(&m, c * 977, kind);

			ASSERT_EQ(r, ref[c]);
			if (!ref[c]) {
				ref[c] = (uint8_t)kind;
				n++;
			}
		} else if (op == 1) {
			qcow2_meta_del(&m, c * 977);
			if (ref[c]) {
				ref[c] = 0;
				n--;
			}
		}
		ASSERT_EQ(qcow2_meta_get(&m, c * 977), ref[c]);
		ASSERT_EQ(m.n, n);
		if (i % 10000 == 0)
			for (uint64_t k = 0; k < UNIVERSE; k++)
				ASSERT_EQ(qcow2_meta_get(&m, k * 977), ref[k]);
	}
	qcow2_meta_free(&m);
}

static void test_mismatch_names_the_first_other_kind(void)
{
	struct qcow2 q = { .cluster_bits = 16, .cs = 65536 };

	ASSERT_EQ(qcow2_meta_add(&q.meta, 0, Q2M_HEADER), 0);
	ASSERT_EQ(qcow2_meta_add(&q.meta, 3, Q2M_L1), 0);
	ASSERT_EQ(qcow2_meta_add(&q.meta, 4, Q2M_L1), 0);
	ASSERT_EQ(qcow2_meta_add(&q.meta, 6, Q2M_RB), 0);
	ASSERT_EQ(qcow2_meta_add(&q.meta, 6, Q2M_L2), Q2M_RB);	/* unchanged */
	ASSERT_EQ(qcow2_meta_get(&q.meta, 6), Q2M_RB);
	/* The L1 table's two clusters are L1; a third is not. */
	ASSERT_EQ(qcow2_meta_mismatch(&q, 3 << 16, 2 << 16, Q2M_L1), -1);
	ASSERT_EQ(qcow2_meta_mismatch(&q, 3 << 16, 3 << 16, Q2M_L1), Q2M_NONE);
	/* Data across clusters 5-6 lands on the refcount block. */
	ASSERT_EQ(qcow2_meta_mismatch(&q, (5 << 16) + 512, 65536, Q2M_NONE), Q2M_RB);
	ASSERT_EQ(qcow2_meta_mismatch(&q, 5 << 16, 65536, Q2M_NONE), -1);
	ASSERT_EQ(qcow2_meta_mismatch(&q, 100, 8, Q2M_HEADER), -1);
	ASSERT_EQ(qcow2_meta_mismatch(&q, 0, 0, Q2M_L2), -1);
	qcow2_meta_free(&q.meta);
}

int main(void)
{
	RUN(test_random_against_array);
	RUN(test_mismatch_names_the_first_other_kind);
	return T_EXIT_PASS;
}
