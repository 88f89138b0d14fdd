#include "loop/defer.h"

#include <stdlib.h>

#include "util/compiler.h"
#include "util/log.h"

struct defer_entry {
	defer_fn fn;
	void *arg;
};

/* Per-thread state: nothing here is shared between threads. */
static __thread unsigned defer_depth;
static __thread struct defer_entry *defer_q;
static __thread unsigned defer_len, defer_cap;
static bool defer_on = true;

void defer_set_batching(bool on)
{
	defer_on = on;
}

bool defer_batching(void)
{
	return defer_on;
}

void defer_release(void)
{
	free(defer_q);
	defer_q = NULL;
	defer_len = defer_cap = 0;
}

void defer_begin(void)
{
	defer_depth++;
}

void defer_call(defer_fn fn, void *arg)
{
	if (defer_depth == 0 || !defer_on) {
		fn(arg);
		return;
	}
	/* Pending sets are tiny (one entry per queue touched), so a scan
	 * beats a hash. */
	for (unsigned i = 0; i < defer_len; i++)
		if (defer_q[i].fn == fn && defer_q[i].arg == arg)
			return;
	if (defer_len == defer_cap) {
		unsigned cap = defer_cap ? defer_cap * 2 : 16;
		struct defer_entry *q = realloc(defer_q, cap * sizeof(*q));

		if (unlikely(!q)) {
			/* Out of memory: never lose a notification, run it now. */
			fn(arg);
			return;
		}
		defer_q = q;
		defer_cap = cap;
	}
	defer_q[defer_len++] = (struct defer_entry){ fn, arg };
}

void defer_end(void)
{
	if (defer_depth == 0) {
		log_err("defer_end() without defer_begin()");
		return;
	}
	if (--defer_depth > 0)
		return;
	/* Detach the batch before running it: a deferred fn that opens a
	 * section of its own must not run (or coalesce with) this batch
	 * again.  Its calls land in a fresh array and run at its own end. */
	while (defer_len) {
		struct defer_entry *q = defer_q;
		unsigned n = defer_len, cap = defer_cap;

		defer_q = NULL;
		defer_len = defer_cap = 0;
		for (unsigned i = 0; i < n; i++)
			q[i].fn(q[i].arg);
		if (!defer_q) {		/* reuse the array */
			defer_q = q;
			defer_cap = cap;
		} else {
			free(q);
		}
	}
}
