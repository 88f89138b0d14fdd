/* Description: util/trim.h, the trimmed mean of io_uring's spinning
 * measurement: the few largest samples are left out (a host stall among
 * them does not decide it), the rest are averaged, and a run restarts after
 * trim_take. */
#include <stdint.h>

#include "test.h"
#include "util/trim.h"

/* 31 requests of 60 us and one stalled for 3 ms: the mean is the 60 us,
 * where a plain mean would read 153 us. */
static void test_stall_left_out(void)
{
	struct trim t = { 0 };

	for (int i = 0; i < 32; i++)
		trim_add(&t, i == 17 ? 3000000 : 60000);
	ASSERT_EQ(t.n, 32);
	ASSERT_EQ(trim_take(&t), 60000);
}

/* Exactly the TRIM_TOP largest go, wherever they come in the run: 1..32 us
 * in any of three orders average 14.5 us without 29..32. */
static void test_largest_wherever(void)
{
	static const int order[3][32] = {
		{ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
		  17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32 },
		{ 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
		  16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1 },
		{ 17, 32, 3, 29, 8, 31, 1, 12, 30, 5, 22, 9, 14, 27, 2, 19,
		  6, 25, 11, 16, 4, 28, 21, 7, 13, 26, 10, 24, 15, 20, 18, 23 },
	};

	for (int k = 0; k < 3; k++) {
		struct trim t = { 0 };
		uint64_t sum = 0;

		for (int i = 0; i < 32; i++)
			trim_add(&t, (uint64_t)order[k][i] * 1000);
		ASSERT_EQ(t.top[0], 32000);
		ASSERT_EQ(t.top[TRIM_TOP - 1], (33 - TRIM_TOP) * 1000);
		for (int v = 1; v <= 32 - TRIM_TOP; v++)
			sum += (uint64_t)v * 1000;
		ASSERT_EQ(t.sum, sum);
		ASSERT_EQ(trim_take(&t), sum / (32 - TRIM_TOP));
	}
}

/* Equal samples (several as large as the largest) average to themselves;
 * trim_take starts a new run; too few samples give 0, not a division by
 * zero. */
static void test_ties_and_restart(void)
{
	struct trim t = { 0 };

	for (int i = 0; i < 10; i++)
		trim_add(&t, 500);
	ASSERT_EQ(trim_take(&t), 500);
	ASSERT_EQ(t.n, 0);
	ASSERT_EQ(t.sum, 0);
	ASSERT_EQ(t.top[0], 0);
	for (int i = 0; i < 8; i++)
		trim_add(&t, i < 4 ? 100 : 9000);
	ASSERT_EQ(trim_take(&t), 100);
	for (int i = 0; i < TRIM_TOP; i++)
		trim_add(&t, 7);
	ASSERT_EQ(trim_take(&t), 0);
	ASSERT_EQ(trim_take(&t), 0);
}

int main(void)
{
	RUN(test_stall_left_out);
	RUN(test_largest_wherever);
	RUN(test_ties_and_restart);
	return T_EXIT_PASS;
}
