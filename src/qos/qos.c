/*
 * Per-disk QoS: the limits' syntax, QEMU's leaky buckets, and admission in
 * arrival order (qos.h).  The bucket rules follow QEMU's docs/throttle.txt
 * and util/throttle.c ("throttle_compute_wait"): a bucket leaks at avg per
 * second; it holds avg/10 (100 ms' worth) when no burst is set, else
 * max * max-length, and a second bucket leaking at max holds max/10, so a
 * burst runs at most at max.  An I/O may go while no bucket it counts in
 * is over its size; it then counts whole.
 */
#include "qos/qos.h"
#include "qos/qos_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/parse.h"

/* QEMU's THROTTLE_VALUE_MAX: larger values are refused (1e15). */
#define QOS_VALUE_MAX 1000000000000000ull
/* The longest burst QEMU takes (block/throttle-groups.c: 1 day in s). */
#define QOS_MAX_LEN_MAX 86400ull

static const char *const bkt_names[QOS_NR_BKT] = {
	[QOS_BPS_TOTAL] = "bps-total",	 [QOS_BPS_READ] = "bps-read",
	[QOS_BPS_WRITE] = "bps-write",	 [QOS_IOPS_TOTAL] = "iops-total",
	[QOS_IOPS_READ] = "iops-read",	 [QOS_IOPS_WRITE] = "iops-write",
};

const char *qos_bkt_name(enum qos_bkt i)
{
	return (unsigned)i < QOS_NR_BKT ? bkt_names[i] : "?";
}

static bool is_bps(unsigned i)
{
	return i <= QOS_BPS_WRITE;
}

bool qos_limits_any(const struct qos_limits *l)
{
	for (unsigned i = 0; i < QOS_NR_BKT; i++)
		if (l->b[i].avg)
			return true;
	return false;
}

/* QEMU's throttle_is_valid, in its words where they help an operator. */
static int limits_check(const struct qos_limits *l, char *err, size_t errlen)
{
	for (unsigned kind = 0; kind < 2; kind++) {
		unsigned t = kind ? QOS_IOPS_TOTAL : QOS_BPS_TOTAL;

		if ((l->b[t].avg && (l->b[t + 1].avg || l->b[t + 2].avg)) ||
		    (l->b[t].max && (l->b[t + 1].max || l->b[t + 2].max))) {
			snprintf(err, errlen, "%s cannot be combined with %s or %s (as in QEMU): "
				 "use a total or the read/write pair", bkt_names[t],
				 bkt_names[t + 1], bkt_names[t + 2]);
			return -EINVAL;
		}
	}
	for (unsigned i = 0; i < QOS_NR_BKT; i++) {
		const struct qos_limit *b = &l->b[i];

		if (b->max && b->max < b->avg) {
			snprintf(err, errlen, "%s-max (%" PRIu64 ") is below %s (%" PRIu64 "): "
				 "a burst must be at least the average", bkt_names[i], b->max,
				 bkt_names[i], b->avg);
			return -EINVAL;
		}
		if (b->max && !b->avg) {
			snprintf(err, errlen, "%s-max needs %s set too", bkt_names[i], bkt_names[i]);
			return -EINVAL;
		}
		if (b->max_len > 1 && !b->max) {
			snprintf(err, errlen, "%s-max-length needs %s-max set too", bkt_names[i],
				 bkt_names[i]);
			return -EINVAL;
		}
	}
	return 0;
}

int qos_limits_parse(const char *s, struct qos_limits *out, char *err, size_t errlen)
{
	struct qos_limits l = *out;
	char *dup = strdup(s), *save = NULL, *tok;
	int ret = 0;

	if (!dup) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (!*dup) {
		snprintf(err, errlen, "empty limits: give KEY=VALUE[,KEY=VALUE...], e.g. "
			 "iops-total=1000");
		ret = -EINVAL;
		goto out;
	}
	for (tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '=');
		const char *key = tok, *val;
		uint64_t v;
		unsigned i;
		size_t klen;
		bool found = false;

		if (!eq) {
			snprintf(err, errlen, "'%s' is not KEY=VALUE (e.g. iops-total=1000)", tok);
			ret = -EINVAL;
			goto out;
		}
		*eq = '\0';
		val = eq + 1;
		/* Sizes take K/M/G (binary units, as QEMU's size parser); rates
		 * and lengths alike, so "bps-total=100M" reads as it should. */
		if (parse_size(val, &v) < 0 || v > QOS_VALUE_MAX) {
			snprintf(err, errlen, "%s=%s: not a number (0 to 1e15, K/M/G allowed)",
				 key, val);
			ret = -EINVAL;
			goto out;
		}
		if (!strcmp(key, "iops-size")) {
			l.iops_size = v;
			continue;
		}
		klen = strlen(key);
		for (i = 0; i < QOS_NR_BKT && !found; i++) {
			size_t n = strlen(bkt_names[i]);

			if (klen < n || memcmp(key, bkt_names[i], n))
				continue;
			if (key[n] == '\0') {
				l.b[i].avg = v;
			} else if (!strcmp(key + n, "-max")) {
				l.b[i].max = v;
			} else if (!strcmp(key + n, "-max-length")) {
				if (v > QOS_MAX_LEN_MAX) {
					snprintf(err, errlen, "%s=%s: at most %llu seconds", key, val,
						 QOS_MAX_LEN_MAX);
					ret = -EINVAL;
					goto out;
				}
				l.b[i].max_len = v;
			} else {
				continue;
			}
			found = true;
		}
		if (!found) {
			snprintf(err, errlen, "unknown limit '%s' (iops-total, iops-read, iops-write, "
				 "bps-total, bps-read, bps-write, each with -max and -max-length, "
				 "and iops-size)", key);
			ret = -EINVAL;
			goto out;
		}
	}
	ret = limits_check(&l, err, errlen);
	if (ret == 0)
		*out = l;
out:
	free(dup);
	return ret;
}

int qos_limits_format(const struct qos_limits *l, char *buf, size_t len)
{
	size_t n = 0;
	int w;

#define QOS_PUT(...)							\
	do {								\
		w = snprintf(buf + MIN_SZ(n, len), len - MIN_SZ(n, len), "%s", n ? "," : ""); \
		n += (size_t)w;						\
		w = snprintf(buf + MIN_SZ(n, len), len - MIN_SZ(n, len), __VA_ARGS__); \
		n += (size_t)w;						\
	} while (0)
#define MIN_SZ(a, b) ((a) < (b) ? (a) : (b))
	if (len)
		buf[0] = '\0';
	for (unsigned i = 0; i < QOS_NR_BKT; i++) {
		const struct qos_limit *b = &l->b[i];

		if (b->avg)
			QOS_PUT("%s=%" PRIu64, bkt_names[i], b->avg);
		if (b->max)
			QOS_PUT("%s-max=%" PRIu64, bkt_names[i], b->max);
		if (b->max_len > 1)
			QOS_PUT("%s-max-length=%" PRIu64, bkt_names[i], b->max_len);
	}
	if (l->iops_size)
		QOS_PUT("iops-size=%" PRIu64, l->iops_size);
#undef QOS_PUT
#undef MIN_SZ
	return (int)n;
}

/* ---- The buckets ---- */

static double bucket_size(const struct qos_limit *b)
{
	/* No burst: 100 ms of the average (QEMU's throttle_fix_bucket, for
	 * guests that send in bursts of their own). */
	return b->max ? (double)b->max * (double)(b->max_len ? b->max_len : 1)
		      : (double)b->avg / 10;
}

static void leak(struct qos_buckets *s, const struct qos_limits *l, uint64_t now)
{
	double dt;

	if (now <= s->prev_ns) {
		if (s->prev_ns == 0)
			s->prev_ns = now;
		return;
	}
	dt = (double)(now - s->prev_ns) / 1e9;
	s->prev_ns = now;
	for (unsigned i = 0; i < QOS_NR_BKT; i++) {
		const struct qos_limit *b = &l->b[i];
		double v;

		v = s->level[i] - (double)b->avg * dt;
		s->level[i] = v > 0 ? v : 0;
		v = s->burst[i] - (double)b->max * dt;
		s->burst[i] = v > 0 ? v : 0;
	}
}

/* The buckets an I/O counts in: its kind's total and read or write. */
static unsigned buckets_of(bool is_write, unsigned out[4])
{
	out[0] = QOS_BPS_TOTAL;
	out[1] = QOS_IOPS_TOTAL;
	out[2] = is_write ? QOS_BPS_WRITE : QOS_BPS_READ;
	out[3] = is_write ? QOS_IOPS_WRITE : QOS_IOPS_READ;
	return 4;
}

static uint64_t ns_for(double extra, uint64_t rate)
{
	double w = extra * 1e9 / (double)rate;

	/* Round up: waking before the bucket has room is a wasted wake-up. */
	return w >= 1e15 ? (uint64_t)1e15 : (uint64_t)w + 1;
}

uint64_t qos_buckets_wait(struct qos_buckets *s, const struct qos_limits *l, bool is_write,
			  uint64_t now)
{
	unsigned idx[4], n = buckets_of(is_write, idx);
	uint64_t wait = 0;

	leak(s, l, now);
	for (unsigned k = 0; k < n; k++) {
		const struct qos_limit *b = &l->b[idx[k]];
		double extra;
		uint64_t w = 0;

		if (!b->avg)
			continue;
		extra = s->level[idx[k]] - bucket_size(b);
		if (extra > 0) {
			w = ns_for(extra, b->avg);
		} else if (b->max) {
			extra = s->burst[idx[k]] - (double)b->max / 10;
			if (extra > 0)
				w = ns_for(extra, b->max);
		}
		if (w > wait)
			wait = w;
	}
	return wait;
}

void qos_buckets_account(struct qos_buckets *s, const struct qos_limits *l, bool is_write,
			 uint64_t bytes)
{
	unsigned idx[4], n = buckets_of(is_write, idx);
	/* iops-size: a large request counts as several (throttle_account). */
	double units = l->iops_size && bytes > l->iops_size ?
			       (double)bytes / (double)l->iops_size : 1.0;

	for (unsigned k = 0; k < n; k++) {
		unsigned i = idx[k];
		double v = is_bps(i) ? (double)bytes : units;

		/* Only limited buckets fill: an unlimited one never leaks and
		 * would start full when a limit is set. */
		if (!l->b[i].avg)
			continue;
		s->level[i] += v;
		if (l->b[i].max)
			s->burst[i] += v;
	}
}

/* ---- Admission in arrival order ---- */

/* A ticket at the head of the line whose owner has not come back for it
 * this long after its turn came is skipped: its ring stopped without
 * qos_cancel reaching the line, or (a group) its process died. */
#define QOS_STALE_NS 20000000ull	/* 20 ms */
/* How much later than the one ahead of it a waiter behind the head wakes. */
#define QOS_BEHIND_STEP_NS 50000ull

/* Roughly how long one I/O of bytes takes at the tightest limit it
 * counts in: where in line a waiter sleeps to. */
uint64_t qos__one_io_ns(const struct qos_limits *l, bool is_write, uint64_t bytes)
{
	unsigned idx[4], n = buckets_of(is_write, idx);
	uint64_t t = 0;

	for (unsigned k = 0; k < n; k++) {
		const struct qos_limit *b = &l->b[idx[k]];
		uint64_t w;

		if (!b->avg)
			continue;
		w = ns_for(is_bps(idx[k]) ? (double)bytes : 1.0, b->avg);
		if (w > t)
			t = w;
	}
	return t;
}

uint64_t qos_shared_admit(struct qos_shared *sh, bool is_write, uint64_t bytes, uint64_t now,
			  uint64_t *ticket, uint64_t slice_ns, unsigned *credit, bool *head)
{
	uint64_t wait, t = *ticket, io_ns, batch;

	qos__lock(sh);
	if (!qos_limits_any(&sh->lim)) {
		/* Unlimited now (set-limits 0): everyone goes, the line too. */
		sh->served = sh->next_ticket;
		*ticket = 0;
		*credit = 0;
		qos__unlock(sh);
		return 0;
	}
	/* The rest of a turn at the head (below): no line, the bucket only. */
	if (*credit && !t) {
		wait = qos_buckets_wait(&sh->b, &sh->lim, is_write, now);
		if (wait == 0) {
			qos_buckets_account(&sh->b, &sh->lim, is_write, bytes);
			(*credit)--;
			qos__unlock(sh);
			return 0;
		}
		*credit = 0;
	}
	io_ns = qos__one_io_ns(&sh->lim, is_write, bytes);
	/* A turn's batch: what a slice is worth at the tightest limit. */
	batch = slice_ns && io_ns ? slice_ns / io_ns : 1;
	batch = batch < 1 ? 1 : batch > 1024 ? 1024 : batch;
	/* Tickets served+1 .. next_ticket wait, the oldest at the head.  A
	 * head whose owner stays away past its turn is skipped (its ring
	 * stopped, its process died); an owner that comes back with a skipped
	 * ticket goes first when there is room, so a skip costs nobody their
	 * place for good. */
	while (sh->served < sh->next_ticket && t != sh->served + 1 &&
	       now > sh->head_due + QOS_STALE_NS + 2 * io_ns) {
		sh->served++;
		sh->head_due = now;
		sh->skipped++;
	}
	wait = qos_buckets_wait(&sh->b, &sh->lim, is_write, now);
	if (wait == 0 && (sh->served == sh->next_ticket || (t && t <= sh->served + 1))) {
		/* Room, and nobody older waiting (or we are the oldest). */
		qos_buckets_account(&sh->b, &sh->lim, is_write, bytes);
		*credit = 0;
		if (t && t <= sh->served + 1) {
			/* A turn: up to batch I/Os (its share of them when others
			 * wait too) go one after another while the bucket has
			 * room, so a queue woken once sends a batch, not one
			 * request, and waiting queues still take turns. */
			uint64_t waiting = sh->next_ticket - sh->served;	/* us included */
			uint64_t share = batch / (waiting ? waiting : 1);

			*credit = share > 1 ? (unsigned)(share - 1) : 0;
		}
		if (t == sh->served + 1) {
			sh->served++;
			sh->head_due = now;	/* the next head's turn: now */
		}
		*ticket = 0;
		qos__unlock(sh);
		return 0;
	}
	if (!t) {
		t = ++sh->next_ticket;	/* from 1; 0 is "none" */
		if (t == sh->served + 1)
			sh->head_due = now;	/* first in an empty line */
		*ticket = t;
	}
	*head = t <= sh->served + 1;
	if (*head) {
		/* A slice at least, so that the turn is a batch. */
		if (wait < slice_ns)
			wait = slice_ns;
		sh->head_due = now + wait;
	} else {
		/* Behind others: until just after the head's turn (the
		 * bucket's room is the head's first), later the further back;
		 * then it is our turn, or one of the few ahead of us. */
		uint64_t ahead = t - sh->served - 1;

		wait = (sh->head_due > now ? sh->head_due - now : 0) + ahead * QOS_BEHIND_STEP_NS;
	}
	qos__unlock(sh);
	return wait ? wait : 1;
}

void qos_shared_cancel(struct qos_shared *sh, uint64_t ticket, uint64_t now)
{
	if (!ticket)
		return;
	qos__lock(sh);
	/* The head goes at once; one further back is skipped when it comes
	 * to the head and stays away. */
	if (ticket == sh->served + 1 && sh->served < sh->next_ticket) {
		sh->served++;
		sh->head_due = now;
	}
	qos__unlock(sh);
}

void qos_shared_get(struct qos_shared *sh, struct qos_limits *l, struct qos_buckets *b,
		    uint64_t now)
{
	qos__lock(sh);
	leak(&sh->b, &sh->lim, now);
	if (l)
		*l = sh->lim;
	if (b)
		*b = sh->b;
	qos__unlock(sh);
}

void qos_shared_set(struct qos_shared *sh, const struct qos_limits *l)
{
	qos__lock(sh);
	sh->lim = *l;
	memset(&sh->b, 0, sizeof(sh->b));
	atomic_store_explicit(&sh->active, qos_limits_any(l), memory_order_relaxed);
	qos__unlock(sh);
}
