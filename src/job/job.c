/*
 * The block job framework (job.h).  Each job's state is its loop's: the
 * verbs hand it their change with loop_call_sync, and job_list reads it
 * there too.  Pacing is QEMU's ratelimit.h idea in its simplest form: the
 * next unit waits until the bytes moved since the rate was set would
 * have taken that long at the rate.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job/job.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/sys.h"

#define JOB_KEEP_CONCLUDED 8

struct job {
	/* Main thread. */
	struct job *next;		/* the daemon's list, oldest first */
	char id[32];
	const struct job_ops *ops;
	void *priv;
	struct disk *disk;
	struct loop *loop;
	struct loop_bh *bh;
	struct loop_timer *timer;

	/* The loop's. */
	enum job_state state;
	enum job_on_error on_error;
	bool busy;			/* a unit in flight */
	bool cancelling;		/* conclude once it is done */
	bool pause_wanted;		/* pause once it is done */
	bool failed, cancelled;
	char why[200];			/* why a cancel fails it (disk let go) */
	uint64_t rate, t0, passed;	/* pacing since t0 (sys_now_ns) */
	uint64_t done, total, copied, errors;
	char error[200];
	bool error_given;		/* job_set_error's, for the unit in flight */
};

static struct job *jobs;
static unsigned job_seq;

static const char *const state_names[JOB_NR_STATES] = {
	[JOB_CREATED] = "created",
	[JOB_RUNNING] = "running",
	[JOB_PAUSED] = "paused",
	[JOB_READY] = "ready",
	[JOB_CONCLUDED] = "concluded",
};

const char *job_state_name(enum job_state s)
{
	return (unsigned)s < JOB_NR_STATES ? state_names[s] : "?";
}

const char *job_id(const struct job *j)
{
	return j->id;
}

/* "3 of 8 MiB" */
static const char *progress(const struct job *j, char *buf, size_t len)
{
	snprintf(buf, len, "%llu of %llu MiB", (unsigned long long)(j->done >> 20),
		 (unsigned long long)(j->total >> 20));
	return buf;
}

/* ---- On the job's loop ----------------------------------------------- */

static void conclude(struct job *j, const char *how)
{
	char p[64];

	j->state = JOB_CONCLUDED;
	if (j->ops->end)
		j->ops->end(j, j->priv);
	if (j->failed)
		log_warn("job %s (%s): failed at %s: %s", j->id, j->ops->type,
			 progress(j, p, sizeof(p)), j->error);
	else if (j->cancelled)
		log_info("job %s (%s): cancelled at %s%s%s", j->id, j->ops->type,
			 progress(j, p, sizeof(p)), how ? ": " : "", how ? how : "");
	else
		log_info("job %s (%s): concluded: %s", j->id, j->ops->type, how ? how : "done");
}

static void fail(struct job *j, const char *why)
{
	if (why && why != j->error)
		snprintf(j->error, sizeof(j->error), "%s", why);
	j->failed = true;
	conclude(j, NULL);
}

static bool error_stops(const struct job *j, int err)
{
	return j->on_error == JOB_ERR_STOP || (j->on_error == JOB_ERR_ENOSPC && err == ENOSPC);
}

/* Not busy: the state a pending cancel or pause asked for. */
static bool settle(struct job *j)
{
	if (j->cancelling) {
		j->cancelling = false;
		if (j->why[0]) {
			fail(j, j->why);
		} else {
			j->cancelled = true;
			conclude(j, NULL);
		}
		return true;
	}
	if (j->pause_wanted) {
		char p[64];

		j->pause_wanted = false;
		j->state = JOB_PAUSED;
		log_info("job %s (%s): paused at %s", j->id, j->ops->type,
			 progress(j, p, sizeof(p)));
		return true;
	}
	return false;
}

static void run(void *opaque)
{
	struct job *j = opaque;
	char msg[200] = "";
	int r;

	if (j->busy || settle(j) || (j->state != JOB_RUNNING && j->state != JOB_READY))
		return;
	if (j->rate) {
		uint64_t due = j->t0 + j->passed * 1000000000ull / j->rate;

		/* The clock itself: loop_now is the iteration's wake-up,
		 * which a timer at due can precede. */
		if (sys_now_ns() < due) {
			loop_timer_mod(j->timer, due);
			return;
		}
	}
	/* Busy before the step: a unit may complete inside it (a format
	 * that finds nothing to do completes the I/O at submission), and
	 * job_step_done must find it busy then, not be undone after. */
	j->busy = true;
	r = j->ops->step(j, j->priv);
	if (r == JOB_STEP_IO)
		return;		/* job_step_done clears busy, maybe already has */
	j->busy = false;
	if (r == JOB_STEP_YIELD) {
		loop_bh_schedule(j->bh);
		return;
	}
	if (r < 0) {
		fail(j, j->error_given ? j->error : strerror(-r));
		return;
	}
	/* JOB_STEP_END */
	if (j->ops->complete) {
		if (j->state != JOB_READY) {
			j->state = JOB_READY;
			log_info("job %s (%s): ready: vblkctl job complete %s ends it", j->id,
				 j->ops->type, j->id);
		}
		return;
	}
	r = j->ops->finish(j, j->priv, msg, sizeof(msg));
	if (r < 0) {
		fail(j, msg[0] ? msg : strerror(-r));
		return;
	}
	conclude(j, msg[0] ? msg : NULL);
}

void job_step_done(struct job *j, int res, uint64_t bytes)
{
	j->busy = false;
	if (j->state == JOB_CONCLUDED)
		return;
	if (res < 0) {
		j->errors++;
		/* The type's words if it gave them (where, on what), else the
		 * errno's. */
		if (!j->error_given)
			snprintf(j->error, sizeof(j->error), "%s", strerror(-res));
		j->error_given = false;
		if (!j->cancelling && error_stops(j, -res)) {
			char p[64];

			j->state = JOB_PAUSED;
			j->pause_wanted = false;
			log_warn("job %s (%s): paused by an I/O error at %s: %s (the policy is "
				 "--werror's; vblkctl job resume %s tries again)", j->id,
				 j->ops->type, progress(j, p, sizeof(p)), j->error, j->id);
			return;
		}
		if (!j->cancelling) {
			fail(j, j->error);
			return;
		}
	}
	j->error_given = false;
	j->passed += bytes;
	j->copied += bytes;
	if (!settle(j))
		loop_bh_schedule(j->bh);
}

void job_set_progress(struct job *j, uint64_t done, uint64_t total)
{
	j->done = done;
	j->total = total;
}

void job_set_error(struct job *j, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(j->error, sizeof(j->error), fmt, ap);
	va_end(ap);
	j->error_given = true;
}

void job_kick(struct job *j)
{
	if (j->state == JOB_READY && !j->busy)
		loop_bh_schedule(j->bh);
}

/* ---- Verbs: main thread, run on the loop ------------------------------ */

enum verb { V_START, V_PAUSE, V_RESUME, V_CANCEL, V_COMPLETE, V_RATE, V_FAIL, V_INFO, V_FREE };

struct call {
	struct job *j;
	enum verb v;
	uint64_t rate;
	const char *why;
	struct job_info *info;
	char *err;
	size_t errlen;
	int res;
};

static void pace_from_now(struct job *j)
{
	j->t0 = sys_now_ns();
	j->passed = 0;
}

static int bad_state(struct call *c, const char *verb)
{
	snprintf(c->err, c->errlen, "job %s is %s: it cannot %s", c->j->id,
		 job_state_name(c->j->state), verb);
	return -EINVAL;
}

static void info_of(const struct job *j, struct job_info *i)
{
	*i = (struct job_info){
		.type = j->ops->type, .state = j->state, .done = j->done, .total = j->total,
		.rate = j->rate, .copied = j->copied, .errors = j->errors, .failed = j->failed,
		.cancelled = j->cancelled,
	};
	snprintf(i->id, sizeof(i->id), "%s", j->id);
	snprintf(i->error, sizeof(i->error), "%s", j->error);
	if (j->ops->progress)
		j->ops->progress(j->priv, &i->done, &i->total);
}

static void verb_fn(void *opaque)
{
	struct call *c = opaque;
	struct job *j = c->j;
	char msg[200], p[64];

	c->res = 0;
	switch (c->v) {
	case V_START:
		j->state = JOB_RUNNING;
		pace_from_now(j);
		if (j->rate)
			log_info("job %s (%s): running, at most %llu bytes/s", j->id,
				 j->ops->type, (unsigned long long)j->rate);
		else
			log_info("job %s (%s): running, no rate limit", j->id, j->ops->type);
		loop_bh_schedule(j->bh);
		break;
	case V_PAUSE:
		if (j->state != JOB_RUNNING && j->state != JOB_READY) {
			c->res = bad_state(c, "pause");
		} else if (j->busy) {
			j->pause_wanted = true;	/* paused once the unit is done */
		} else {
			j->pause_wanted = true;
			settle(j);
		}
		break;
	case V_RESUME:
		if (j->state != JOB_PAUSED && !j->pause_wanted) {
			c->res = bad_state(c, "resume");
			break;
		}
		j->pause_wanted = false;
		if (j->state == JOB_PAUSED) {
			j->state = JOB_RUNNING;
			j->error[0] = 0;
			log_info("job %s (%s): running again at %s", j->id, j->ops->type,
				 progress(j, p, sizeof(p)));
		}
		pace_from_now(j);
		loop_bh_schedule(j->bh);
		break;
	case V_CANCEL:
	case V_FAIL:
		if (j->state == JOB_CONCLUDED) {
			c->res = c->v == V_CANCEL ? bad_state(c, "be cancelled") : 0;
			break;
		}
		if (c->v == V_FAIL)
			snprintf(j->why, sizeof(j->why), "%s", c->why);
		j->cancelling = true;
		if (!j->busy)
			settle(j);
		break;
	case V_COMPLETE:
		if (!j->ops->complete) {
			snprintf(c->err, c->errlen, "job %s (%s) ends by itself: it has no ready "
				 "state to complete", j->id, j->ops->type);
			c->res = -EINVAL;
			break;
		}
		if (j->state != JOB_READY || j->busy) {
			c->res = bad_state(c, "be completed before it is ready");
			break;
		}
		msg[0] = 0;
		c->res = j->ops->complete(j, j->priv, msg, sizeof(msg));
		if (c->res < 0) {
			snprintf(c->err, c->errlen, "job %s: %s", j->id,
				 msg[0] ? msg : strerror(-c->res));
			break;
		}
		conclude(j, msg[0] ? msg : "completed");
		break;
	case V_RATE:
		if (j->state == JOB_CONCLUDED) {
			c->res = bad_state(c, "take a rate");
			break;
		}
		j->rate = c->rate;
		pace_from_now(j);
		if (j->ops->rate)
			j->ops->rate(j->priv, j->rate);
		if (j->rate)
			log_info("job %s (%s): at most %llu bytes/s from now", j->id, j->ops->type,
				 (unsigned long long)j->rate);
		else
			log_info("job %s (%s): no rate limit from now", j->id, j->ops->type);
		if (j->state == JOB_RUNNING || j->state == JOB_READY)
			loop_bh_schedule(j->bh);
		break;
	case V_INFO:
		info_of(j, c->info);
		break;
	case V_FREE:
		loop_bh_free(j->bh);
		loop_timer_free(j->timer);
		j->bh = NULL;
		j->timer = NULL;
		break;
	}
}

static int call(struct job *j, enum verb v, struct call *c)
{
	c->j = j;
	c->v = v;
	loop_call_sync(j->loop, verb_fn, c);
	return c->res;
}

static struct job *find(const char *id, char *err, size_t errlen)
{
	for (struct job *j = jobs; j; j = j->next)
		if (!strcmp(j->id, id))
			return j;
	snprintf(err, errlen, "no job '%s' (vblkctl job list shows them)", id);
	return NULL;
}

static void job_free(struct job *j)
{
	struct call c = { 0 };

	call(j, V_FREE, &c);
	if (j->ops->free)
		j->ops->free(j->priv);
	free(j);
}

static void unlink_job(struct job *j)
{
	for (struct job **p = &jobs; *p; p = &(*p)->next)
		if (*p == j) {
			*p = j->next;
			return;
		}
}

/* Keep at most JOB_KEEP_CONCLUDED concluded jobs: the oldest go. */
static void trim(void)
{
	unsigned n = 0;
	struct job_info i;

	for (struct job *j = jobs; j; j = j->next) {
		call(j, V_INFO, &(struct call){ .info = &i });
		n += i.state == JOB_CONCLUDED;
	}
	for (struct job *j = jobs, *next; j && n > JOB_KEEP_CONCLUDED; j = next) {
		next = j->next;
		call(j, V_INFO, &(struct call){ .info = &i });
		if (i.state == JOB_CONCLUDED) {
			unlink_job(j);
			job_free(j);
			n--;
		}
	}
}

struct setup {
	struct job *j;
	int res;
};

static void setup_fn(void *opaque)
{
	struct setup *s = opaque;
	struct job *j = s->j;

	s->res = loop_bh_new(j->loop, run, j, &j->bh);
	if (s->res == 0 && (s->res = loop_timer_new(j->loop, run, j, &j->timer)) < 0) {
		loop_bh_free(j->bh);
		j->bh = NULL;
	}
}

int job_new(const struct job_ops *ops, struct disk *d, struct loop *l, uint64_t rate,
	    enum job_on_error on_error, void *priv, struct job **out, char *err, size_t errlen)
{
	struct job_info i;
	struct setup s;
	struct job *j, **tail;

	for (j = jobs; j; j = j->next) {
		if (j->disk != d || strcmp(j->ops->type, ops->type))
			continue;
		call(j, V_INFO, &(struct call){ .info = &i });
		if (i.state != JOB_CONCLUDED) {
			snprintf(err, errlen, "a %s job is %s already (%s, %llu of %llu MiB): "
				 "vblkctl job cancel %s stops it", ops->type,
				 job_state_name(i.state), i.id, (unsigned long long)(i.done >> 20),
				 (unsigned long long)(i.total >> 20), i.id);
			return -EBUSY;
		}
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	snprintf(j->id, sizeof(j->id), "%s-%u", ops->type, ++job_seq);
	j->ops = ops;
	j->priv = priv;
	j->disk = d;
	j->loop = l;
	j->rate = rate;
	j->on_error = on_error;
	j->state = JOB_CREATED;
	s.j = j;
	loop_call_sync(l, setup_fn, &s);
	if (s.res < 0) {
		snprintf(err, errlen, "cannot set up the job: %s", strerror(-s.res));
		free(j);
		return s.res;
	}
	for (tail = &jobs; *tail; tail = &(*tail)->next)
		;
	*tail = j;
	trim();
	*out = j;
	return 0;
}

void job_start(struct job *j)
{
	call(j, V_START, &(struct call){ 0 });
}

static int verb(const char *id, enum verb v, uint64_t rate, char *err, size_t errlen)
{
	struct job *j = find(id, err, errlen);

	if (!j)
		return -ENOENT;
	return call(j, v, &(struct call){ .rate = rate, .err = err, .errlen = errlen });
}

int job_pause(const char *id, char *err, size_t errlen)
{
	return verb(id, V_PAUSE, 0, err, errlen);
}

int job_resume(const char *id, char *err, size_t errlen)
{
	return verb(id, V_RESUME, 0, err, errlen);
}

int job_cancel(const char *id, char *err, size_t errlen)
{
	return verb(id, V_CANCEL, 0, err, errlen);
}

int job_complete(const char *id, char *err, size_t errlen)
{
	struct job *j = find(id, err, errlen);
	struct job_info i;
	int r;

	if (!j)
		return -ENOENT;
	if (j->ops->prepare_complete) {
		call(j, V_INFO, &(struct call){ .info = &i });
		if (i.state != JOB_READY) {
			snprintf(err, errlen, "job %s is %s: it cannot be completed before it is "
				 "ready", id, job_state_name(i.state));
			return -EINVAL;
		}
		r = j->ops->prepare_complete(j->priv, err, errlen);
		if (r < 0)
			return r;
	}
	return verb(id, V_COMPLETE, 0, err, errlen);
}

int job_set_rate(const char *id, uint64_t rate, char *err, size_t errlen)
{
	return verb(id, V_RATE, rate, err, errlen);
}

int job_dismiss(const char *id, char *err, size_t errlen)
{
	struct job *j = find(id, err, errlen);
	struct job_info i;

	if (!j)
		return -ENOENT;
	call(j, V_INFO, &(struct call){ .info = &i });
	if (i.state != JOB_CONCLUDED) {
		snprintf(err, errlen, "job %s is %s: cancel it first", id, job_state_name(i.state));
		return -EINVAL;
	}
	unlink_job(j);
	job_free(j);
	return 0;
}

unsigned job_list(struct job_info *out, unsigned n)
{
	unsigned k = 0;

	for (struct job *j = jobs; j; j = j->next, k++)
		if (k < n)
			call(j, V_INFO, &(struct call){ .info = &out[k] });
	return k;
}

unsigned job_active(void)
{
	unsigned k = 0;
	struct job_info i;

	for (struct job *j = jobs; j; j = j->next) {
		call(j, V_INFO, &(struct call){ .info = &i });
		k += i.state != JOB_CONCLUDED;
	}
	return k;
}

void job_disk_released(struct disk *d, const char *why)
{
	for (struct job *j = jobs; j; j = j->next)
		if (j->disk == d)
			call(j, V_FAIL, &(struct call){ .why = why });
}

static void busy_fn(void *opaque)
{
	struct call *c = opaque;

	c->res = c->j->busy;
}

void job_free_all(struct disk *d)
{
	char err[160];

	for (struct job **p = &jobs, *j; (j = *p);) {
		struct call c = { .j = j };

		if (j->disk != d) {
			p = &j->next;
			continue;
		}
		*p = j->next;
		(void)call(j, V_CANCEL, &(struct call){ .err = err, .errlen = sizeof(err) });
		/* The fronts' drain completed every unit (disk_release failed
		 * the jobs before it); one still in flight would complete into
		 * freed memory: leak it rather. */
		loop_call_sync(j->loop, busy_fn, &c);
		if (c.res) {
			log_err("job %s: still has I/O in flight at exit; not freed", j->id);
			continue;
		}
		job_free(j);
	}
}
