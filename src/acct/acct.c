#include "acct/acct.h"

static const char *const op_names[ACCT_NR_OPS] = {
	[ACCT_READ] = "read",
	[ACCT_WRITE] = "write",
	[ACCT_FLUSH] = "flush",
	[ACCT_DISCARD] = "discard",
	[ACCT_WRITE_ZEROES] = "write_zeroes",
	[ACCT_GET_ID] = "get_id",
};

const char *acct_op_name(enum acct_op op)
{
	return (unsigned)op < ACCT_NR_OPS ? op_names[op] : "?";
}

uint64_t acct_bucket_le_ns(unsigned i)
{
	return i < ACCT_BUCKETS - 1 ? (1ull << i) * 1000 : UINT64_MAX;
}

void acct_add(struct acct *dst, const struct acct *src)
{
	for (unsigned o = 0; o < ACCT_NR_OPS; o++) {
		struct acct_op_stats *d = &dst->op[o];
		const struct acct_op_stats *s = &src->op[o];

		d->requests += s->requests;
		d->bytes += s->bytes;
		d->errors += s->errors;
		d->total_ns += s->total_ns;
		for (unsigned i = 0; i < ACCT_BUCKETS; i++)
			d->hist[i] += s->hist[i];
	}
}

uint64_t acct_quantile_ns(const uint64_t hist[ACCT_BUCKETS], double q)
{
	uint64_t total = 0, cum = 0;
	double rank;

	for (unsigned i = 0; i < ACCT_BUCKETS; i++)
		total += hist[i];
	if (!total)
		return 0;
	rank = q * (double)total;
	for (unsigned i = 0; i < ACCT_BUCKETS; i++) {
		double lo, hi;

		if ((double)(cum + hist[i]) < rank || !hist[i]) {
			cum += hist[i];
			continue;
		}
		if (i == ACCT_BUCKETS - 1)
			return acct_bucket_le_ns(i - 1);
		lo = i ? (double)acct_bucket_le_ns(i - 1) : 0;
		hi = (double)acct_bucket_le_ns(i);
		return (uint64_t)(lo + (hi - lo) * (rank - (double)cum) / (double)hist[i]);
	}
	return acct_bucket_le_ns(ACCT_BUCKETS - 2);
}
