/* Description: acct/acct.h, I/O accounting: latencies land in the bucket
 * whose bound is the first at or above them (1 us, 2 us, 4 us ... 16.8 s,
 * then +Inf), failed requests count as errors only, busy time is the union
 * of the periods with a request in flight, queues sum, and quantiles come
 * out as Prometheus' histogram_quantile() computes them. */
#include <stdint.h>

#include "acct/acct.h"
#include "test.h"

static void test_buckets(void)
{
	ASSERT_EQ(acct_bucket(0), 0);
	ASSERT_EQ(acct_bucket(1000), 0);		/* le 1 us */
	ASSERT_EQ(acct_bucket(1001), 1);		/* le 2 us */
	ASSERT_EQ(acct_bucket(2000), 1);
	ASSERT_EQ(acct_bucket(2001), 2);
	ASSERT_EQ(acct_bucket(4000), 2);
	ASSERT_EQ(acct_bucket(70000), 7);		/* 70 us: le 128 us */
	ASSERT_EQ(acct_bucket(16777216000ull), ACCT_BUCKETS - 2);	/* 2^24 us */
	ASSERT_EQ(acct_bucket(16777216001ull), ACCT_BUCKETS - 1);	/* +Inf */
	ASSERT_EQ(acct_bucket(UINT64_MAX - 1000), ACCT_BUCKETS - 1);
	ASSERT_EQ(acct_bucket_le_ns(0), 1000);
	ASSERT_EQ(acct_bucket_le_ns(7), 128000);
	ASSERT_TRUE(acct_bucket_le_ns(ACCT_BUCKETS - 1) == UINT64_MAX);
	/* Every latency lands in the bucket of the first bound at or above
	 * it, whatever its size. */
	for (uint64_t ns = 1; ns < (1ull << 40); ns = ns * 3 + 7) {
		unsigned b = acct_bucket(ns);

		ASSERT_TRUE(ns <= acct_bucket_le_ns(b));
		ASSERT_TRUE(b == 0 || ns > acct_bucket_le_ns(b - 1));
	}
	ASSERT_TRUE(acct_op_name(ACCT_WRITE_ZEROES)[0] == 'w');
	ASSERT_TRUE(acct_op_name(ACCT_NR_OPS)[0] == '?');
}

static void test_done(void)
{
	struct acct a = { 0 }, sum = { 0 };
	uint64_t n = 0;

	acct_done(&a, ACCT_READ, true, 4096, 70000);
	acct_done(&a, ACCT_READ, true, 8192, 30000);
	acct_done(&a, ACCT_READ, false, 4096, 90000);
	acct_done(&a, ACCT_FLUSH, true, 0, 500000);
	ASSERT_EQ(a.op[ACCT_READ].requests, 2);
	ASSERT_EQ(a.op[ACCT_READ].bytes, 12288);
	ASSERT_EQ(a.op[ACCT_READ].errors, 1);
	ASSERT_EQ(a.op[ACCT_READ].total_ns, 100000);
	ASSERT_EQ(a.op[ACCT_READ].hist[7], 1);
	ASSERT_EQ(a.op[ACCT_READ].hist[5], 1);
	ASSERT_EQ(a.op[ACCT_FLUSH].requests, 1);
	ASSERT_EQ(a.op[ACCT_WRITE].requests, 0);
	for (unsigned i = 0; i < ACCT_BUCKETS; i++)
		n += a.op[ACCT_READ].hist[i];
	ASSERT_EQ(n, a.op[ACCT_READ].requests);
	acct_add(&sum, &a);
	acct_add(&sum, &a);
	ASSERT_EQ(sum.op[ACCT_READ].requests, 4);
	ASSERT_EQ(sum.op[ACCT_READ].hist[7], 2);
	ASSERT_EQ(sum.op[ACCT_FLUSH].total_ns, 1000000);
}

/* Overlapping requests count once; gaps do not count; an open period
 * counts up to now. */
static void test_busy(void)
{
	struct acct_busy b = { 0 };

	acct_busy_start(&b, 100);
	acct_busy_start(&b, 150);
	acct_busy_end(&b, 200);
	ASSERT_EQ(acct_busy_ns(&b, 250), 150);
	acct_busy_end(&b, 300);
	ASSERT_EQ(acct_busy_ns(&b, 1000), 200);
	acct_busy_start(&b, 2000);
	ASSERT_EQ(acct_busy_ns(&b, 2500), 700);
	acct_busy_end(&b, 3000);
	ASSERT_EQ(b.inflight, 0);
	ASSERT_EQ(acct_busy_ns(&b, 9000), 1200);
}

static void test_quantiles(void)
{
	uint64_t h[ACCT_BUCKETS] = { 0 };

	ASSERT_EQ(acct_quantile_ns(h, 0.5), 0);
	/* 100 requests all in (64, 128] us: linear inside the bucket. */
	h[7] = 100;
	ASSERT_EQ(acct_quantile_ns(h, 0.5), 96000);
	ASSERT_EQ(acct_quantile_ns(h, 0.99), 127360);
	/* 90 fast (le 1 us), 10 slow (le 1024 us): p50 in the first
	 * bucket (from 0), p99 in the slow one. */
	h[7] = 0;
	h[0] = 90;
	h[10] = 10;
	ASSERT_EQ(acct_quantile_ns(h, 0.5), 555);
	ASSERT_EQ(acct_quantile_ns(h, 0.99), 512000 + 512000 * 9 / 10);
	/* In the +Inf bucket: the bound below it. */
	h[ACCT_BUCKETS - 1] = 1000;
	ASSERT_EQ(acct_quantile_ns(h, 0.999), acct_bucket_le_ns(ACCT_BUCKETS - 2));
}

int main(void)
{
	test_buckets();
	test_done();
	test_busy();
	test_quantiles();
	return T_EXIT_PASS;
}
