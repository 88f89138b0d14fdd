/*
 * vblkctl iostat: the disk as iostat -x shows a host's disks, from the
 * "disk" member of "stats" snapshots (blk/counters.h: BLK_DISK_COUNTERS,
 * BLK_OP_COUNTERS) taken every interval: each line is what moved between
 * two of them.  The first snapshot prints nothing (iostat's first report,
 * since boot, has no counterpart: the daemon's counters start with it).
 */
#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "acct/acct.h"
#include "util/cli.h"
#include "vblkctl/vctl.h"

/* As sysstat's iostat: MB is 2^20 bytes. */
#define MB 1048576.0
/* On a terminal the header comes again every so many lines. */
#define HEADER_EVERY 20

struct op_snap {
	uint64_t requests, bytes, total_ns;
	uint64_t hist[ACCT_BUCKETS];
};

struct snap {
	double t;			/* CLOCK_MONOTONIC, s: midway through the request */
	uint64_t busy_ns, iothreads;
	struct op_snap op[ACCT_NR_OPS];
};

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
	interrupted = 1;
}

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Member key of o as an unsigned integer, or false. */
static bool get_u64(struct json_object *o, const char *key, uint64_t *v)
{
	struct json_object *f;

	if (!json_object_object_get_ex(o, key, &f) || !json_object_is_type(f, json_type_int))
		return false;
	*v = json_object_get_uint64(f);
	return true;
}

/* The counters of op in ops ("disk": {"ops": {...}}). */
static bool parse_op(struct json_object *ops, enum acct_op op, struct op_snap *s)
{
	struct json_object *o, *b;

	if (!json_object_object_get_ex(ops, acct_op_name(op), &o) ||
	    !get_u64(o, "requests", &s->requests) || !get_u64(o, "bytes", &s->bytes) ||
	    !get_u64(o, "total_ns", &s->total_ns) ||
	    !json_object_object_get_ex(o, "latency_buckets", &b) ||
	    !json_object_is_type(b, json_type_array) ||
	    json_object_array_length(b) != ACCT_BUCKETS)
		return false;
	for (unsigned i = 0; i < ACCT_BUCKETS; i++)
		s->hist[i] = json_object_get_uint64(json_object_array_get_idx(b, i));
	return true;
}

/* A snapshot of the daemon at path into s.  Returns 0; -EINTR for
 * SIGINT; the daemon gone or its reply not one: one line and exit 1 (a
 * first snapshot says why it cannot connect, a later one that the
 * daemon went away). */
static int take(const char *path, struct snap *s, bool first)
{
	struct json_object *req = json_object_new_object(), *rep, *disk, *ops, *e;
	char err[512];
	double t0;
	int r;

	if (!req || json_object_object_add(req, "cmd", json_object_new_string("stats")) < 0)
		cli_die("out of memory");
	t0 = mono_s();
	r = vctl_call(path, req, 5000, &rep, NULL, err, sizeof(err));
	json_object_put(req);
	if (r == -EINTR || interrupted)
		return -EINTR;
	if (r < 0) {
		if (first)
			cli_die("%s", err);
		cli_die("iostat: vblkd went away: %s", err);
	}
	s->t = (t0 + mono_s()) / 2;
	if (json_object_object_get_ex(rep, "error", &e))
		cli_die("%s", json_object_get_string(e));
	if (!json_object_object_get_ex(rep, "disk", &disk) ||
	    !json_object_object_get_ex(disk, "ops", &ops) ||
	    !get_u64(disk, "busy_ns", &s->busy_ns) || !get_u64(disk, "iothreads", &s->iothreads))
		cli_die("iostat: the stats of '%s' have no I/O accounting (\"disk\"): a vblkd "
			"older than this vblkctl?", path);
	for (unsigned i = 0; i < ACCT_NR_OPS; i++)
		if (!parse_op(ops, (enum acct_op)i, &s->op[i]))
			cli_die("iostat: the stats of '%s' lack \"disk\": \"ops\": \"%s\"", path,
				acct_op_name((enum acct_op)i));
	json_object_put(rep);
	return 0;
}

/* b - a, or b if the counter went back (the daemon restarted: counted
 * from zero again, as Prometheus' rate() takes it). */
static uint64_t delta(uint64_t a, uint64_t b)
{
	return b >= a ? b - a : b;
}

/* One interval's figures, as iostat -x names them. */
struct line {
	double rs, ws, rmbs, wmbs, r_await, w_await, aqu, util, p99, fs, ds;
};

static void compute(const struct snap *a, const struct snap *b, struct line *l)
{
	double dt = b->t - a->t, ns = dt * 1e9;
	uint64_t req[ACCT_NR_OPS], by[ACCT_NR_OPS], tot[ACCT_NR_OPS], hist[ACCT_BUCKETS];
	uint64_t all_ns = 0, busy = delta(a->busy_ns, b->busy_ns);

	for (unsigned i = 0; i < ACCT_NR_OPS; i++) {
		req[i] = delta(a->op[i].requests, b->op[i].requests);
		by[i] = delta(a->op[i].bytes, b->op[i].bytes);
		tot[i] = delta(a->op[i].total_ns, b->op[i].total_ns);
		all_ns += tot[i];
	}
	for (unsigned i = 0; i < ACCT_BUCKETS; i++)
		hist[i] = delta(a->op[ACCT_READ].hist[i], b->op[ACCT_READ].hist[i]) +
			  delta(a->op[ACCT_WRITE].hist[i], b->op[ACCT_WRITE].hist[i]);
	l->rs = (double)req[ACCT_READ] / dt;
	l->ws = (double)req[ACCT_WRITE] / dt;
	l->rmbs = (double)by[ACCT_READ] / dt / MB;
	l->wmbs = (double)by[ACCT_WRITE] / dt / MB;
	l->r_await = req[ACCT_READ] ? (double)tot[ACCT_READ] / (double)req[ACCT_READ] / 1e6 : 0;
	l->w_await = req[ACCT_WRITE] ? (double)tot[ACCT_WRITE] / (double)req[ACCT_WRITE] / 1e6 : 0;
	/* Requests in flight on average: the time of those completed. */
	l->aqu = (double)all_ns / ns;
	/* Busy time is per iothread (the union of its queues'), summed:
	 * normalised by the iothreads, 100 is all of them busy all the time.
	 * Our clock's interval is not exactly the daemon's: no more than 100. */
	l->util = b->iothreads ? (double)busy / (ns * (double)b->iothreads) * 100 : 0;
	if (l->util > 100)
		l->util = 100;
	l->p99 = (double)acct_quantile_ns(hist, 0.99) / 1e6;
	l->fs = (double)req[ACCT_FLUSH] / dt;
	l->ds = (double)req[ACCT_DISCARD] / dt;
}

static void header(void)
{
	printf("%9s %9s %8s %8s %8s %8s %7s %6s %8s %8s %8s\n", "r/s", "w/s", "rMB/s", "wMB/s",
	       "r_await", "w_await", "aqu-sz", "%util", "p99", "f/s", "d/s");
}

static void print(const struct line *l, bool json)
{
	if (json)
		printf("{\"r/s\": %.1f, \"w/s\": %.1f, \"rMB/s\": %.2f, \"wMB/s\": %.2f, "
		       "\"r_await\": %.3f, \"w_await\": %.3f, \"aqu-sz\": %.2f, \"%%util\": %.1f, "
		       "\"p99\": %.3f, \"f/s\": %.1f, \"d/s\": %.1f}\n", l->rs, l->ws, l->rmbs,
		       l->wmbs, l->r_await, l->w_await, l->aqu, l->util, l->p99, l->fs, l->ds);
	else
		printf("%9.1f %9.1f %8.2f %8.2f %8.3f %8.3f %7.2f %6.1f %8.3f %8.1f %8.1f\n",
		       l->rs, l->ws, l->rmbs, l->wmbs, l->r_await, l->w_await, l->aqu, l->util,
		       l->p99, l->fs, l->ds);
	fflush(stdout);
}

int vctl_iostat(const char *path, double interval_s, unsigned long count, int json)
{
	struct sigaction sa = { .sa_handler = on_sigint };	/* no SA_RESTART */
	struct snap s[2];
	struct timespec next;
	bool tty = !json && isatty(STDOUT_FILENO);
	unsigned long n = 0;
	uint64_t step = (uint64_t)(interval_s * 1e9);

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	if (take(path, &s[0], true) < 0)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &next);
	while (!count || n < count) {
		struct snap *a = &s[n % 2], *b = &s[(n + 1) % 2];
		struct line l;
		uint64_t nsec = (uint64_t)next.tv_nsec + step;

		/* Absolute deadlines: the lines do not drift by the requests' time. */
		next.tv_sec += (time_t)(nsec / 1000000000u);
		next.tv_nsec = (long)(nsec % 1000000000u);
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
			if (interrupted)
				return 0;
		if (interrupted || take(path, b, false) < 0)
			return 0;
		compute(a, b, &l);
		if (!json && (n == 0 || (tty && n % HEADER_EVERY == 0)))
			header();
		print(&l, json);
		n++;
	}
	return 0;
}
