/*
 * A trimmed mean: the mean of a run of samples without its TRIM_TOP
 * largest, for latencies timed on a machine that stalls now and then (a
 * VM's host): one stall of milliseconds among a few dozen samples of tens
 * of microseconds would otherwise be the whole answer.  O(TRIM_TOP) per
 * sample, no allocation.  Used by io_uring's spinning measurement
 * (backend/uring.c uring_spin_note).
 */
#ifndef VBLK_TRIM_H
#define VBLK_TRIM_H

#include <stdint.h>
#include <string.h>

#define TRIM_TOP 4

struct trim {
	uint64_t sum;			/* all but the largest TRIM_TOP */
	uint64_t top[TRIM_TOP];		/* the largest so far, descending */
	unsigned n;			/* samples added */
};

static inline void trim_add(struct trim *t, uint64_t v)
{
	/* Insert into the short descending list; what falls out of it
	 * (the smallest of the TRIM_TOP + 1) joins the sum. */
	for (unsigned i = 0; i < TRIM_TOP; i++)
		if (v > t->top[i]) {
			uint64_t x = t->top[i];

			t->top[i] = v;
			v = x;
		}
	t->sum += v;
	t->n++;
}

/* The mean without the TRIM_TOP largest (0 for TRIM_TOP samples or
 * fewer); starts a new run. */
static inline uint64_t trim_take(struct trim *t)
{
	uint64_t m = t->n > TRIM_TOP ? t->sum / (t->n - TRIM_TOP) : 0;

	memset(t, 0, sizeof(*t));
	return m;
}

#endif
