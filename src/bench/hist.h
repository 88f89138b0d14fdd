/*
 * Latency histogram: log-linear buckets (64 per power of two, ~1.6%
 * relative error) over nanoseconds, so percentiles come from counts, not
 * from a sorted array of every sample.  Not thread-safe: one per job,
 * merged at the end.
 */
#ifndef VBLK_HIST_H
#define VBLK_HIST_H

#include <stdint.h>
#include <string.h>

#define HIST_SUB_BITS 6
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_MAX_BITS 44		/* up to ~4.9 hours */
#define HIST_BUCKETS ((HIST_MAX_BITS - HIST_SUB_BITS + 1) * HIST_SUB)

struct hist {
	uint64_t count, sum, min, max;
	uint64_t b[HIST_BUCKETS];
};

static inline unsigned hist_index(uint64_t v)
{
	unsigned msb;

	if (v < HIST_SUB)
		return (unsigned)v;
	msb = 63u - (unsigned)__builtin_clzll(v);
	if (msb >= HIST_MAX_BITS)
		return HIST_BUCKETS - 1;
	return ((msb - HIST_SUB_BITS + 1) << HIST_SUB_BITS) +
	       (unsigned)((v >> (msb - HIST_SUB_BITS)) & (HIST_SUB - 1));
}

/* Smallest value that lands in bucket i. */
static inline uint64_t hist_lower(unsigned i)
{
	unsigned group = i >> HIST_SUB_BITS, sub = i & (HIST_SUB - 1);

	if (group == 0)
		return sub;
	return (uint64_t)(HIST_SUB + sub) << (group - 1);
}

static inline void hist_init(struct hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min = UINT64_MAX;
}

static inline void hist_add(struct hist *h, uint64_t v)
{
	h->b[hist_index(v)]++;
	h->count++;
	h->sum += v;
	if (v < h->min)
		h->min = v;
	if (v > h->max)
		h->max = v;
}

static inline void hist_merge(struct hist *dst, const struct hist *src)
{
	for (unsigned i = 0; i < HIST_BUCKETS; i++)
		dst->b[i] += src->b[i];
	dst->count += src->count;
	dst->sum += src->sum;
	if (src->min < dst->min)
		dst->min = src->min;
	if (src->max > dst->max)
		dst->max = src->max;
}

/* Value at quantile q (0..1): midpoint of the bucket holding it, clamped
 * to the observed min/max. */
static inline uint64_t hist_quantile(const struct hist *h, double q)
{
	uint64_t rank, seen = 0;

	if (!h->count)
		return 0;
	rank = (uint64_t)(q * (double)h->count);
	if (rank >= h->count)
		rank = h->count - 1;
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		seen += h->b[i];
		if (seen > rank) {
			uint64_t lo = hist_lower(i);
			uint64_t hi = i + 1 < HIST_BUCKETS ? hist_lower(i + 1) : lo + 1;
			uint64_t mid = lo + (hi - lo) / 2;

			if (mid < h->min)
				mid = h->min;
			if (mid > h->max)
				mid = h->max;
			return mid;
		}
	}
	return h->max;
}

#endif
