/*
 * acct_: I/O accounting, what an operator asks first: per operation
 * (read, write, flush, discard, write zeroes, get id) the requests
 * completed, their bytes, the requests failed and the time they took,
 * with a log-scale latency histogram; requests in flight now and busy time
 * (time with at least one in flight, what iostat's %util is made of).
 * QEMU keeps the same per operation (qapi/block-core.json BlockDeviceStats,
 * BlockLatencyHistogramInfo); node_exporter names them node_disk_*.
 *
 * Counted on the iothread that owns the queue, in plain fields (no shared
 * cache line on the hot path); readers take a snapshot on that thread
 * (loop_call_sync) and sum queues when they read.  The functions that run
 * per request are inline here.
 */
#ifndef VBLK_ACCT_H
#define VBLK_ACCT_H

#include <stdbool.h>
#include <stdint.h>

enum acct_op {
	ACCT_READ,
	ACCT_WRITE,
	ACCT_FLUSH,
	ACCT_DISCARD,
	ACCT_WRITE_ZEROES,
	ACCT_GET_ID,
	ACCT_NR_OPS,
};

/*
 * Latency buckets: bucket i counts requests that took at most 2^i µs
 * (1 µs ... 2^24 µs, about 16.8 s), the last one everything slower
 * (Prometheus' le="+Inf").  Powers of two, as QEMU's and most block
 * latency histograms: a constant relative error at every scale.
 */
#define ACCT_BUCKETS 26

struct acct_op_stats {
	uint64_t requests;	/* completed successfully */
	uint64_t bytes;		/* of those: data moved (read/write), or
				 * covered (discard, write zeroes) */
	uint64_t errors;	/* completed with an error status */
	uint64_t total_ns;	/* time of the successful ones, off the ring
				 * to the used element */
	uint64_t hist[ACCT_BUCKETS];	/* not cumulative */
};

struct acct {
	struct acct_op_stats op[ACCT_NR_OPS];
};

/* Time with requests in flight, of one iothread's queues together (their
 * union: one iothread is the whole disk by default). */
struct acct_busy {
	unsigned inflight;
	uint64_t since;		/* when inflight last became non-zero */
	uint64_t busy_ns;	/* closed busy periods */
};

/* The label of an operation ("read", "write", "flush", "discard",
 * "write_zeroes", "get_id"). */
const char *acct_op_name(enum acct_op op);

/* Upper bound of bucket i in ns (UINT64_MAX for the last). */
uint64_t acct_bucket_le_ns(unsigned i);

static inline unsigned acct_bucket(uint64_t ns)
{
	uint64_t us = (ns + 999) / 1000;	/* a bucket holds what is <= its bound */
	unsigned b;

	if (us <= 1)
		return 0;
	b = 64 - (unsigned)__builtin_clzll(us - 1);	/* smallest b: 2^b >= us */
	return b < ACCT_BUCKETS - 1 ? b : ACCT_BUCKETS - 1;
}

/* A request of the operation s counts completed: ok or failed, its bytes
 * and how long it took.  s is &a->op[op], which a hot path can find when
 * it takes the request (the operation known then) rather than index with
 * at completion. */
static inline void acct_op_done(struct acct_op_stats *s, bool ok, uint64_t bytes, uint64_t ns)
{
	if (!ok) {
		s->errors++;
		return;
	}
	s->requests++;
	s->bytes += bytes;
	s->total_ns += ns;
	s->hist[acct_bucket(ns)]++;
}

/* A request completed: ok or failed, its bytes and how long it took. */
static inline void acct_done(struct acct *a, enum acct_op op, bool ok, uint64_t bytes,
			     uint64_t ns)
{
	acct_op_done(&a->op[op], ok, bytes, ns);
}

static inline void acct_busy_start(struct acct_busy *b, uint64_t now)
{
	if (b->inflight++ == 0)
		b->since = now;
}

static inline void acct_busy_end(struct acct_busy *b, uint64_t now)
{
	if (--b->inflight == 0)
		b->busy_ns += now - b->since;
}

/* Busy time so far, the open period included. */
static inline uint64_t acct_busy_ns(const struct acct_busy *b, uint64_t now)
{
	return b->busy_ns + (b->inflight && now > b->since ? now - b->since : 0);
}

/* Add src into dst (summing queues). */
void acct_add(struct acct *dst, const struct acct *src);

/*
 * The q-quantile (0 < q < 1) of a histogram in ns, as Prometheus'
 * histogram_quantile() computes it: the bucket where the rank falls,
 * interpolated linearly inside it (from 0 for the first); a rank in the
 * last, open bucket gives the bound below it.  0 for an empty histogram.
 */
uint64_t acct_quantile_ns(const uint64_t hist[ACCT_BUCKETS], double q);

#endif
