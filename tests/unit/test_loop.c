/*
 * Description: the event loop (loop_): fd handlers, deleting a handler
 * whose event is already fetched, bottom halves, timers, loop_call_sync,
 * loop_stop, and poll handlers (begin/end pairing, work reported by end(),
 * polling off, hit/miss counters, window shrink and reset).
 *
 * Each case runs a loop on its own thread (loop_thread_start).  Handlers
 * are set up by this thread before the loop thread starts, and read or
 * torn down after loop_thread_join; while the loop runs, this thread
 * reads loop-thread state through atomics or inside loop_call_sync(),
 * whose mutex orders what the loop thread wrote before with what we read
 * after.  Cases assert orderings and invariants, not durations: CI is a
 * small, busy VM.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#include "loop/loop.h"
#include "util/log.h"
#include "util/sys.h"

/* How long a case waits for something the loop must do before failing:
 * far beyond any scheduling delay, short of tests/run's timeout. */
#define WAIT_NS		(10 * 1000000000ull)
#define MS		1000000ull

/* ---- Helpers ---- */

static int efd_new(void)
{
	int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

	ASSERT_TRUE(fd >= 0);
	return fd;
}

static void efd_signal(int fd)
{
	ASSERT_EQ(sys_eventfd_signal(fd), 0);
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = ns / 1000000000ull, .tv_nsec = ns % 1000000000ull };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void spin_ns(uint64_t ns)
{
	uint64_t end = sys_now_ns() + ns;

	while (sys_now_ns() < end)
		;
}

/* Wait until *v >= want; false if it does not happen within WAIT_NS. */
static bool wait_for(atomic_uint *v, unsigned want)
{
	uint64_t end = sys_now_ns() + WAIT_NS;

	while (atomic_load(v) < want) {
		if (sys_now_ns() > end)
			return false;
		sleep_ns(50000);
	}
	return true;
}

/*
 * Returns once the loop has finished the iteration it was in and the next
 * one: a bh that reschedules itself once runs in phase 5 of two
 * iterations in a row (loop_run_bhs takes the list first).  A call_sync
 * alone is no barrier: calls queued while the loop drains the call list
 * run in that same drain.
 */
struct barrier {
	struct loop *l;
	struct loop_bh *bh;
	atomic_uint runs;
};

static void barrier_bh(void *opaque)
{
	struct barrier *b = opaque;

	if (atomic_fetch_add(&b->runs, 1) == 0)
		loop_bh_schedule(b->bh);
}

static void barrier_arm(void *opaque)
{
	struct barrier *b = opaque;

	ASSERT_EQ(loop_bh_new(b->l, barrier_bh, b, &b->bh), 0);
	loop_bh_schedule(b->bh);
}

static void barrier_free(void *opaque)
{
	struct barrier *b = opaque;

	loop_bh_free(b->bh);
}

static void loop_barrier(struct loop *l)
{
	struct barrier b = { .l = l };

	ASSERT_EQ(loop_call_sync(l, barrier_arm, &b), 0);
	ASSERT_TRUE(wait_for(&b.runs, 2));
	ASSERT_EQ(loop_call_sync(l, barrier_free, &b), 0);
}

static struct loop *new_loop(const char *name)
{
	struct loop *l;

	ASSERT_EQ(loop_new(name, &l), 0);
	return l;
}

/* ---- fd handlers ---- */

struct fd_case {
	struct loop *l;
	int efd;
	struct loop_fd *h;
	atomic_uint runs;
	atomic_uint total;		/* eventfd counts read */
	uint32_t events;
	void *opaque;
	bool in_thread;
};

static void fd_case_cb(void *opaque, uint32_t events)
{
	struct fd_case *c = opaque;

	c->events = events;
	c->opaque = opaque;
	c->in_thread = loop_in_thread(c->l);
	atomic_fetch_add(&c->total, (unsigned)sys_eventfd_drain(c->efd));
	atomic_fetch_add(&c->runs, 1);
}

/* A readable eventfd runs its handler on the loop thread, with EPOLLIN
 * and the handler's opaque; drained, it does not run again until the next
 * signal. */
static void test_fd_handler_fires_for_readable_eventfd(void)
{
	struct fd_case c = { 0 };

	c.l = new_loop("t-fd");
	c.efd = efd_new();
	ASSERT_EQ(loop_fd_add(c.l, c.efd, EPOLLIN, fd_case_cb, &c, &c.h), 0);
	ASSERT_EQ(loop_thread_start(c.l), 0);
	ASSERT_TRUE(!loop_in_thread(c.l));

	efd_signal(c.efd);
	ASSERT_TRUE(wait_for(&c.runs, 1));
	loop_barrier(c.l);
	ASSERT_EQ(atomic_load(&c.runs), 1);
	ASSERT_TRUE(c.events & EPOLLIN);
	ASSERT_PTR_EQ(c.opaque, &c);
	ASSERT_TRUE(c.in_thread);
	ASSERT_EQ(atomic_load(&c.total), 1);

	/* Two signals: one or two runs, never a signal lost. */
	efd_signal(c.efd);
	efd_signal(c.efd);
	ASSERT_TRUE(wait_for(&c.total, 3));
	loop_barrier(c.l);
	ASSERT_EQ(atomic_load(&c.total), 3);
	ASSERT_TRUE(atomic_load(&c.runs) == 2 || atomic_load(&c.runs) == 3);

	loop_thread_join(c.l);
	loop_fd_del(c.l, c.h);
	loop_free(c.l);
	close(c.efd);
}

/* Two handlers whose events come back from one epoll_wait: the first to
 * run deletes the other, whose fetched event must then be dropped. */
struct del_pair {
	struct loop *l;
	int efd[2];
	struct loop_fd *h[2];
	atomic_uint runs;
	int ran;			/* which one ran */
};

struct del_slot {
	struct del_pair *p;
	int i;
};

static void del_pair_cb(void *opaque, uint32_t events)
{
	struct del_slot *s = opaque;
	struct del_pair *p = s->p;
	int other = !s->i;

	(void)sys_eventfd_drain(p->efd[s->i]);
	p->ran = s->i;
	if (p->h[other]) {
		loop_fd_del(p->l, p->h[other]);
		p->h[other] = NULL;
	}
	atomic_fetch_add(&p->runs, 1);
}

static void test_fd_del_drops_event_already_fetched(void)
{
	for (int round = 0; round < 10; round++) {
		struct del_pair p = { 0 };
		struct del_slot s[2] = { { &p, 0 }, { &p, 1 } };
		int other;

		p.l = new_loop("t-fddel");
		for (int i = 0; i < 2; i++) {
			p.efd[i] = efd_new();
			ASSERT_EQ(loop_fd_add(p.l, p.efd[i], EPOLLIN, del_pair_cb, &s[i],
					      &p.h[i]), 0);
			/* Both readable before the loop's first epoll_wait,
			 * so it fetches both events at once. */
			efd_signal(p.efd[i]);
		}
		ASSERT_EQ(loop_thread_start(p.l), 0);
		ASSERT_TRUE(wait_for(&p.runs, 1));
		loop_barrier(p.l);
		loop_thread_join(p.l);

		ASSERT_EQ(atomic_load(&p.runs), 1);
		other = !p.ran;
		ASSERT_PTR_EQ(p.h[other], NULL);
		/* The deleted one never ran: its eventfd is still full. */
		ASSERT_EQ(sys_eventfd_drain(p.efd[other]), 1);
		loop_fd_del(p.l, p.h[p.ran]);
		loop_free(p.l);
		close(p.efd[0]);
		close(p.efd[1]);
	}
}

/* ---- Bottom halves ---- */

struct bh_case {
	struct loop *l;
	struct loop_bh *bh;
	atomic_uint runs;

	/* Self-rescheduling case: an eventfd that stays readable marks
	 * iterations, since its handler runs once in each. */
	int efd;
	struct loop_fd *h;
	unsigned fd_runs, fd_runs_at_last_bh;
	bool ran_twice_in_one_iteration;
	unsigned want;
};

static void bh_count_cb(void *opaque)
{
	struct bh_case *c = opaque;

	atomic_fetch_add(&c->runs, 1);
}

static void bh_schedule_twice(void *opaque)
{
	struct bh_case *c = opaque;

	loop_bh_schedule(c->bh);
	loop_bh_schedule(c->bh);
}

/* Scheduling a bh that is already scheduled does not run it twice; once
 * it ran, scheduling it again runs it again. */
static void test_bh_scheduled_twice_runs_once(void)
{
	struct bh_case c = { 0 };

	c.l = new_loop("t-bh");
	ASSERT_EQ(loop_bh_new(c.l, bh_count_cb, &c, &c.bh), 0);
	ASSERT_EQ(loop_thread_start(c.l), 0);

	loop_call_sync(c.l, bh_schedule_twice, &c);
	loop_barrier(c.l);
	ASSERT_EQ(atomic_load(&c.runs), 1);
	loop_call_sync(c.l, bh_schedule_twice, &c);
	loop_barrier(c.l);
	ASSERT_EQ(atomic_load(&c.runs), 2);

	loop_thread_join(c.l);
	loop_bh_free(c.bh);
	loop_free(c.l);
}

static void bh_tick_fd_cb(void *opaque, uint32_t events)
{
	struct bh_case *c = opaque;

	/* Not drained: readable in every iteration. */
	c->fd_runs++;
}

static void bh_resched_cb(void *opaque)
{
	struct bh_case *c = opaque;
	unsigned n = atomic_load(&c->runs);

	if (n && c->fd_runs == c->fd_runs_at_last_bh)
		c->ran_twice_in_one_iteration = true;
	c->fd_runs_at_last_bh = c->fd_runs;
	if (n + 1 < c->want) {
		loop_bh_schedule(c->bh);
	} else {
		loop_fd_del(c->l, c->h);
		c->h = NULL;
	}
	atomic_fetch_add(&c->runs, 1);
}

static void bh_schedule_once(void *opaque)
{
	struct bh_case *c = opaque;

	loop_bh_schedule(c->bh);
}

/* A bh that reschedules itself runs again in the next iteration, with fd
 * handlers dispatched in between: never twice in one iteration. */
static void test_bh_rescheduled_by_itself_runs_next_iteration(void)
{
	struct bh_case c = { .want = 20 };

	c.l = new_loop("t-bhre");
	c.efd = efd_new();
	efd_signal(c.efd);
	ASSERT_EQ(loop_fd_add(c.l, c.efd, EPOLLIN, bh_tick_fd_cb, &c, &c.h), 0);
	ASSERT_EQ(loop_bh_new(c.l, bh_resched_cb, &c, &c.bh), 0);
	ASSERT_EQ(loop_thread_start(c.l), 0);

	loop_call_sync(c.l, bh_schedule_once, &c);
	ASSERT_TRUE(wait_for(&c.runs, c.want));
	loop_barrier(c.l);
	loop_thread_join(c.l);

	ASSERT_EQ(atomic_load(&c.runs), c.want);
	ASSERT_TRUE(!c.ran_twice_in_one_iteration);
	ASSERT_TRUE(c.fd_runs >= c.want - 1);
	ASSERT_PTR_EQ(c.h, NULL);
	loop_bh_free(c.bh);
	loop_free(c.l);
	close(c.efd);
}

/* Two bhs scheduled together; the first to run frees the other, which
 * must then not run (nor be touched: run under ASan). */
struct bh_pair {
	struct loop *l;
	struct loop_bh *bh[2];
	atomic_uint runs;
};

struct bh_slot {
	struct bh_pair *p;
	int i;
};

static void bh_pair_cb(void *opaque)
{
	struct bh_slot *s = opaque;
	struct bh_pair *p = s->p;

	if (p->bh[!s->i]) {
		loop_bh_free(p->bh[!s->i]);
		p->bh[!s->i] = NULL;
	}
	atomic_fetch_add(&p->runs, 1);
}

static void bh_pair_schedule(void *opaque)
{
	struct bh_pair *p = opaque;

	loop_bh_schedule(p->bh[0]);
	loop_bh_schedule(p->bh[1]);
}

static void test_bh_freed_by_other_bh_does_not_run(void)
{
	struct bh_pair p = { 0 };
	struct bh_slot s[2] = { { &p, 0 }, { &p, 1 } };

	p.l = new_loop("t-bhfree");
	ASSERT_EQ(loop_bh_new(p.l, bh_pair_cb, &s[0], &p.bh[0]), 0);
	ASSERT_EQ(loop_bh_new(p.l, bh_pair_cb, &s[1], &p.bh[1]), 0);
	ASSERT_EQ(loop_thread_start(p.l), 0);
	loop_call_sync(p.l, bh_pair_schedule, &p);
	loop_barrier(p.l);
	loop_thread_join(p.l);
	ASSERT_EQ(atomic_load(&p.runs), 1);
	loop_bh_free(p.bh[0]);
	loop_bh_free(p.bh[1]);
	loop_free(p.l);
}

/* ---- Timers ---- */

struct timer_case {
	struct loop_timer *t;
	char name;
	uint64_t deadline;
	uint64_t fired_at;
	unsigned fired;
};

static struct {
	char order[8];
	atomic_uint n;
} tlog;

static void timer_cb(void *opaque)
{
	struct timer_case *c = opaque;
	unsigned n = atomic_load(&tlog.n);

	c->fired_at = sys_now_ns();
	c->fired++;
	if (n < sizeof(tlog.order) - 1)
		tlog.order[n] = c->name;
	atomic_fetch_add(&tlog.n, 1);
}

static void timers_new(struct loop *l, struct timer_case *tc, unsigned n)
{
	memset(&tlog, 0, sizeof(tlog));
	for (unsigned i = 0; i < n; i++) {
		tc[i].name = (char)('a' + i);
		ASSERT_EQ(loop_timer_new(l, timer_cb, &tc[i], &tc[i].t), 0);
	}
}

static void timer_arm(struct timer_case *c, uint64_t deadline)
{
	c->deadline = deadline;
	loop_timer_mod(c->t, deadline);
}

static void timers_free(struct timer_case *tc, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		loop_timer_free(tc[i].t);
}

/* Several timers fire once each, never before their deadline, in deadline
 * order whatever order they were armed in. */
static void test_timers_fire_once_in_deadline_order(void)
{
	struct loop *l = new_loop("t-timer");
	struct timer_case tc[3] = { 0 };
	uint64_t base;

	timers_new(l, tc, 3);
	base = sys_now_ns();
	timer_arm(&tc[0], base + 30 * MS);
	timer_arm(&tc[1], base + 10 * MS);
	timer_arm(&tc[2], base + 20 * MS);
	ASSERT_EQ(loop_thread_start(l), 0);
	ASSERT_TRUE(wait_for(&tlog.n, 3));
	/* One-shot: nothing more however long we wait. */
	sleep_ns(30 * MS);
	loop_barrier(l);
	loop_thread_join(l);

	ASSERT_EQ(atomic_load(&tlog.n), 3);
	ASSERT_MEM_EQ(tlog.order, "bca", 3);
	for (int i = 0; i < 3; i++) {
		ASSERT_EQ(tc[i].fired, 1);
		ASSERT_TRUE(tc[i].fired_at >= tc[i].deadline);
	}
	timers_free(tc, 3);
	loop_free(l);
}

/* A deleted timer does not fire; deleting it again, or deleting one never
 * armed, is harmless. */
static void test_timer_del_prevents_firing(void)
{
	struct loop *l = new_loop("t-tdel");
	struct timer_case tc[3] = { 0 };
	uint64_t base;

	timers_new(l, tc, 3);
	base = sys_now_ns();
	timer_arm(&tc[0], base + 10 * MS);
	timer_arm(&tc[1], base + 30 * MS);
	loop_timer_del(tc[0].t);
	loop_timer_del(tc[0].t);
	loop_timer_del(tc[2].t);
	ASSERT_EQ(loop_thread_start(l), 0);
	/* Timers fire in deadline order: once b fired, a would have. */
	ASSERT_TRUE(wait_for(&tlog.n, 1));
	loop_barrier(l);
	loop_thread_join(l);

	ASSERT_EQ(atomic_load(&tlog.n), 1);
	ASSERT_EQ(tlog.order[0], 'b');
	ASSERT_EQ(tc[0].fired, 0);
	ASSERT_EQ(tc[2].fired, 0);
	timers_free(tc, 3);
	loop_free(l);
}

/* Re-arming moves a timer: later (it fires once, after the marker armed
 * between its old and new deadlines) and earlier (it fires before a
 * marker it used to follow). */
static void test_timer_mod_moves_deadline(void)
{
	struct loop *l = new_loop("t-tmod");
	struct timer_case tc[4] = { 0 };
	uint64_t base;

	timers_new(l, tc, 4);
	base = sys_now_ns();
	timer_arm(&tc[0], base + 10 * MS);
	timer_arm(&tc[1], base + 30 * MS);	/* marker */
	timer_arm(&tc[0], base + 60 * MS);	/* a: later */
	timer_arm(&tc[2], base + 500 * MS);
	timer_arm(&tc[3], base + 40 * MS);	/* marker */
	timer_arm(&tc[2], base + 20 * MS);	/* c: earlier */
	ASSERT_EQ(loop_thread_start(l), 0);
	ASSERT_TRUE(wait_for(&tlog.n, 4));
	sleep_ns(20 * MS);
	loop_barrier(l);
	loop_thread_join(l);

	ASSERT_EQ(atomic_load(&tlog.n), 4);
	ASSERT_MEM_EQ(tlog.order, "cbda", 4);
	for (int i = 0; i < 4; i++) {
		ASSERT_EQ(tc[i].fired, 1);
		ASSERT_TRUE(tc[i].fired_at >= tc[i].deadline);
	}
	timers_free(tc, 4);
	loop_free(l);
}

/* ---- loop_call_sync and loop_stop ---- */

struct sync_case {
	struct loop *l;
	bool in_thread;
	pthread_t ran_on;
	bool finished;
	unsigned counter;		/* loop thread only */
	bool not_in_thread;
};

static void sync_fn(void *opaque)
{
	struct sync_case *c = opaque;

	c->in_thread = loop_in_thread(c->l);
	c->ran_on = pthread_self();
	/* The caller must still be waiting when we finish. */
	sleep_ns(10 * MS);
	c->finished = true;
}

/* From another thread: fn runs on the loop thread and the call returns
 * only after fn did. */
static void test_call_sync_runs_on_loop_thread(void)
{
	struct sync_case c = { 0 };

	c.l = new_loop("t-sync");
	ASSERT_EQ(loop_thread_start(c.l), 0);
	for (int i = 0; i < 3; i++) {
		c.finished = false;
		c.in_thread = false;
		ASSERT_EQ(loop_call_sync(c.l, sync_fn, &c), 0);
		ASSERT_TRUE(c.finished);
		ASSERT_TRUE(c.in_thread);
		ASSERT_TRUE(!pthread_equal(c.ran_on, pthread_self()));
		ASSERT_TRUE(!loop_in_thread(c.l));
	}
	loop_thread_join(c.l);
	loop_free(c.l);
}

/* Nobody runs the loop (never started, or stopped): fn runs right here. */
static void test_call_sync_on_idle_loop_runs_directly(void)
{
	struct sync_case c = { 0 };

	c.l = new_loop("t-idle");
	ASSERT_EQ(loop_call_sync(c.l, sync_fn, &c), 0);
	ASSERT_TRUE(c.finished);
	ASSERT_TRUE(!c.in_thread);
	ASSERT_TRUE(pthread_equal(c.ran_on, pthread_self()));

	ASSERT_EQ(loop_thread_start(c.l), 0);
	loop_barrier(c.l);
	loop_thread_join(c.l);
	c.finished = false;
	ASSERT_EQ(loop_call_sync(c.l, sync_fn, &c), 0);
	ASSERT_TRUE(c.finished);
	ASSERT_TRUE(!c.in_thread);
	ASSERT_TRUE(pthread_equal(c.ran_on, pthread_self()));
	loop_free(c.l);
}

#define SYNC_THREADS	4
#define SYNC_CALLS	300

static void sync_inc(void *opaque)
{
	struct sync_case *c = opaque;

	if (!loop_in_thread(c->l))
		c->not_in_thread = true;
	/* Plain increment: calls are serialized on the loop thread. */
	c->counter++;
}

static void *sync_caller(void *opaque)
{
	struct sync_case *c = opaque;

	for (int i = 0; i < SYNC_CALLS; i++)
		loop_call_sync(c->l, sync_inc, c);
	return NULL;
}

/* Callers on several threads at once: every call runs, one at a time, on
 * the loop thread. */
static void test_call_sync_from_many_threads_serialized(void)
{
	struct sync_case c = { 0 };
	pthread_t t[SYNC_THREADS];

	c.l = new_loop("t-many");
	ASSERT_EQ(loop_thread_start(c.l), 0);
	for (int i = 0; i < SYNC_THREADS; i++)
		ASSERT_EQ(pthread_create(&t[i], NULL, sync_caller, &c), 0);
	for (int i = 0; i < SYNC_THREADS; i++)
		ASSERT_EQ(pthread_join(t[i], NULL), 0);
	loop_thread_join(c.l);
	ASSERT_EQ(c.counter, SYNC_THREADS * SYNC_CALLS);
	ASSERT_TRUE(!c.not_in_thread);
	loop_free(c.l);
}

struct stop_case {
	struct loop *l;
	atomic_uint running;		/* set by a timer on the loop */
};

static void stop_mark_running(void *opaque)
{
	struct stop_case *c = opaque;

	atomic_store(&c->running, 1);
}

static void *stopper(void *opaque)
{
	struct stop_case *c = opaque;

	if (wait_for(&c->running, 1))
		loop_stop(c->l);
	return NULL;
}

/* loop_run() on this thread returns once another thread calls
 * loop_stop(); the stop is consumed, so the loop can run again. */
static void test_stop_from_other_thread_ends_run(void)
{
	struct stop_case c = { 0 };
	struct loop_timer *t;

	c.l = new_loop("t-stop");
	ASSERT_EQ(loop_timer_new(c.l, stop_mark_running, &c, &t), 0);
	for (int round = 0; round < 2; round++) {
		pthread_t th;

		atomic_store(&c.running, 0);
		loop_timer_mod(t, sys_now_ns());
		ASSERT_EQ(pthread_create(&th, NULL, stopper, &c), 0);
		ASSERT_EQ(loop_run(c.l), 0);
		ASSERT_EQ(pthread_join(th, NULL), 0);
		ASSERT_EQ(atomic_load(&c.running), 1);
		ASSERT_TRUE(!loop_in_thread(c.l));
	}
	loop_timer_free(t);
	loop_free(c.l);
}

/* ---- Poll handlers ---- */

/*
 * A fake device: eventfd efd is its notification, the counter "pending"
 * its ring.  The guest side (fdev_submit, any thread) adds a request and
 * signals efd only while notifications are on; begin() turns them off,
 * end() back on and re-checks, as vhost_enable_notify() does.  The
 * callbacks check the loop's contract as they are called and record the
 * first violation.
 */
struct fdev_counts {
	unsigned nbegin, nend, nend_true, npoll, npoll_true, nrun, nfd;
	unsigned violations;
	const char *why;
	bool polling;			/* between begin() and end() */
	bool want_run;			/* poll() or end() reported work */
};

struct fdev {
	struct loop *l;
	int efd;
	struct loop_fd *h;

	atomic_uint pending;		/* the "ring": requests not taken */
	atomic_bool notify;		/* guest signals efd */
	atomic_uint submitted, done, signals;
	atomic_uint end_work_seen;	/* run() found what end() queued */

	/* Loop thread only. */
	struct fdev_counts c;
	bool fd_budget_one;		/* the fd handler takes one request */
	bool end_makes_work;		/* one shot: end() queues a request */
	bool end_work_queued;
	bool deleted;			/* set by whoever deleted h */
	struct fdev *del_on_run;	/* run() deletes this device's handler */
};

static void fdev_violation(struct fdev *d, const char *why)
{
	if (!d->c.violations++)
		d->c.why = why;
}

static void fdev_submit(struct fdev *d)
{
	atomic_fetch_add(&d->submitted, 1);
	atomic_fetch_add(&d->pending, 1);
	/* seq_cst: the add above and this load pair with end()'s store of
	 * notify and load of pending (Dekker), so either we see notify on
	 * and signal, or end() sees our request. */
	if (atomic_load(&d->notify)) {
		atomic_fetch_add(&d->signals, 1);
		efd_signal(d->efd);
	}
}

static unsigned fdev_take_all(struct fdev *d)
{
	unsigned n = atomic_exchange(&d->pending, 0);

	atomic_fetch_add(&d->done, n);
	return n;
}

static unsigned fdev_take_one(struct fdev *d)
{
	unsigned n = atomic_load(&d->pending);

	while (n && !atomic_compare_exchange_weak(&d->pending, &n, n - 1))
		;
	if (!n)
		return 0;
	atomic_fetch_add(&d->done, 1);
	return 1;
}

static bool fdev_poll(void *opaque)
{
	struct fdev *d = opaque;
	bool r;

	if (d->deleted)
		fdev_violation(d, "poll() after loop_fd_del");
	if (!d->c.polling)
		fdev_violation(d, "poll() outside begin()/end()");
	if (d->c.want_run)
		fdev_violation(d, "poll() again before run()");
	d->c.npoll++;
	r = atomic_load(&d->pending) > 0;
	if (r) {
		d->c.npoll_true++;
		d->c.want_run = true;
	}
	return r;
}

static void fdev_run(void *opaque)
{
	struct fdev *d = opaque;

	if (d->deleted)
		fdev_violation(d, "run() after loop_fd_del");
	if (!d->c.want_run)
		fdev_violation(d, "run() without poll() or end() reporting work");
	d->c.want_run = false;
	d->c.nrun++;
	if (fdev_take_all(d) && d->end_work_queued) {
		d->end_work_queued = false;
		atomic_fetch_add(&d->end_work_seen, 1);
	}
	if (d->del_on_run && !d->del_on_run->deleted) {
		d->del_on_run->deleted = true;
		loop_fd_del(d->l, d->del_on_run->h);
		d->del_on_run->h = NULL;
	}
}

static void fdev_begin(void *opaque)
{
	struct fdev *d = opaque;

	if (d->deleted)
		fdev_violation(d, "begin() after loop_fd_del");
	if (d->c.polling)
		fdev_violation(d, "begin() twice without end()");
	if (d->c.want_run)
		fdev_violation(d, "begin() before the run() owed");
	d->c.polling = true;
	d->c.nbegin++;
	atomic_store(&d->notify, false);
}

static bool fdev_end(void *opaque)
{
	struct fdev *d = opaque;
	bool r;

	if (d->deleted)
		fdev_violation(d, "end() after loop_fd_del");
	if (!d->c.polling)
		fdev_violation(d, "end() without begin()");
	if (d->c.want_run)
		fdev_violation(d, "end() before the run() owed");
	d->c.polling = false;
	d->c.nend++;
	/* Notifications on, then re-check; seq_cst pairs with
	 * fdev_submit(). */
	atomic_store(&d->notify, true);
	if (d->end_makes_work) {
		/* Work that turns up exactly now, with no signal: only
		 * end()'s answer can get it run. */
		d->end_makes_work = false;
		d->end_work_queued = true;
		atomic_fetch_add(&d->submitted, 1);
		atomic_fetch_add(&d->pending, 1);
	}
	r = atomic_load(&d->pending) > 0;
	if (r) {
		d->c.nend_true++;
		d->c.want_run = true;
	}
	return r;
}

static const struct loop_poll_ops fdev_ops = {
	.poll = fdev_poll,
	.run = fdev_run,
	.begin = fdev_begin,
	.end = fdev_end,
};

/* The notification handler: the slow path, taking requests itself. */
static void fdev_fd_cb(void *opaque, uint32_t events)
{
	struct fdev *d = opaque;

	if (d->deleted)
		fdev_violation(d, "fd handler after loop_fd_del");
	d->c.nfd++;
	(void)sys_eventfd_drain(d->efd);
	if (d->fd_budget_one)
		fdev_take_one(d);
	else
		fdev_take_all(d);
}

/* Attach a device to l (not running yet). */
static void fdev_init(struct fdev *d, struct loop *l)
{
	d->l = l;
	d->efd = efd_new();
	atomic_store(&d->notify, true);
	ASSERT_EQ(loop_fd_add(l, d->efd, EPOLLIN, fdev_fd_cb, d, &d->h), 0);
	loop_fd_set_poll(d->h, &fdev_ops);
}

static void fdev_fini(struct fdev *d)
{
	if (d->h)
		loop_fd_del(d->l, d->h);
	d->h = NULL;
	close(d->efd);
}

static struct loop *poll_loop(uint64_t max_ns, unsigned grow, unsigned shrink)
{
	struct loop *l = new_loop("t-poll");
	struct loop_poll_params p = { max_ns, grow, shrink }, got;

	loop_set_poll_params(l, &p);
	loop_get_poll_params(l, &got);
	ASSERT_EQ(got.max_ns, max_ns);
	ASSERT_EQ(got.grow, grow);
	ASSERT_EQ(got.shrink, shrink);
	return l;
}

static void fdev_snapshot_fn(void *opaque)
{
	struct fdev **pair = opaque;

	pair[1]->c = pair[0]->c;
}

/* The loop-thread counters, copied on the loop thread. */
static struct fdev_counts fdev_snapshot(struct fdev *d)
{
	struct fdev copy;
	struct fdev *pair[2] = { d, &copy };

	loop_call_sync(d->l, fdev_snapshot_fn, pair);
	return copy.c;
}

static void fdev_check_clean(const struct fdev_counts *c)
{
	if (c->violations)
		T_FAIL("poll contract broken %u time(s), first: %s", c->violations, c->why);
	/* begin and end alternate: at most one begin is still open. */
	ASSERT_TRUE(c->nbegin == c->nend || c->nbegin == c->nend + 1);
	ASSERT_EQ(c->polling, c->nbegin == c->nend + 1);
	ASSERT_EQ(c->nrun, c->npoll_true + c->nend_true);
}

/*
 * A guest that keeps the device busy: submit, wait until the request is
 * done, wait delay_ns, again.  Samples the handler's window after every
 * request.
 */
struct guest {
	struct fdev *d;
	unsigned rounds;
	uint64_t delay_ns;
	bool sleep;			/* nanosleep the delay, else spin */
	uint64_t max_ns;		/* the cap in force */
	uint64_t poll_ns_max;		/* largest window seen */
	uint64_t poll_ns_last;
	bool over_cap, lost;
};

static void *guest_main(void *opaque)
{
	struct guest *g = opaque;
	struct fdev *d = g->d;

	for (unsigned i = 0; i < g->rounds; i++) {
		unsigned want = atomic_load(&d->submitted) + 1;
		uint64_t end = sys_now_ns() + WAIT_NS;
		struct loop_poll_stats ps;

		fdev_submit(d);
		while (atomic_load(&d->done) < want) {
			if (sys_now_ns() > end) {
				g->lost = true;
				return NULL;
			}
			sched_yield();
		}
		loop_fd_poll_stats(d->h, &ps);
		g->poll_ns_last = ps.poll_ns;
		if (ps.poll_ns > g->poll_ns_max)
			g->poll_ns_max = ps.poll_ns;
		if (ps.poll_ns > g->max_ns)
			g->over_cap = true;
		if (g->sleep)
			sleep_ns(g->delay_ns);
		else
			spin_ns(g->delay_ns);
	}
	return NULL;
}

static void guest_run(struct guest *g)
{
	pthread_t t;

	ASSERT_EQ(pthread_create(&t, NULL, guest_main, g), 0);
	ASSERT_EQ(pthread_join(t, NULL), 0);
	ASSERT_TRUE(!g->lost);
	ASSERT_EQ(atomic_load(&g->d->done), atomic_load(&g->d->submitted));
}

/*
 * (a) Polling on, the guest answering each completion a few tens of µs
 * later, so fd events come soon after the loop blocks (near misses) and
 * the window grows.  Whatever the timing: begin/end alternate and never
 * nest, poll() only between them, run() exactly when poll() or end()
 * reported work, nothing lost, the window never above the cap, hits ==
 * run() calls, misses <= fd events.
 */
static void test_poll_begin_end_alternate(void)
{
	const uint64_t max_ns = 200000;
	bool polled = false;

	/* Growing the window takes a near miss: timing.  Retry a few
	 * times, the invariants are checked on every attempt. */
	for (int attempt = 0; attempt < 5 && !polled; attempt++) {
		struct loop *l = poll_loop(max_ns, 2, 2);
		struct fdev d = { 0 };
		struct guest g = { &d, 1000, 30000, false, max_ns };
		struct loop_poll_stats ps;
		struct loop_stats ls;

		fdev_init(&d, l);
		ASSERT_EQ(loop_thread_start(l), 0);
		guest_run(&g);
		loop_thread_join(l);

		fdev_check_clean(&d.c);
		ASSERT_TRUE(!g.over_cap);
		loop_fd_poll_stats(d.h, &ps);
		loop_get_stats(l, &ls);
		ASSERT_TRUE(ps.poll_ns <= max_ns);
		ASSERT_EQ(ps.hits, d.c.nrun);
		ASSERT_TRUE(ps.misses <= d.c.nfd);
		/* Polling time only where there was polling. */
		if (ls.poll_ns_total > 0)
			ASSERT_TRUE(d.c.nbegin > 0 && d.c.npoll > 0);
		polled = d.c.nbegin > 0 && g.poll_ns_max > 0;
		fprintf(stderr, "    attempt %d: begin %u end %u poll %u run %u (end %u) fd %u, "
			"hits %llu misses %llu, window max %llu ns, polled %llu ns\n",
			attempt, d.c.nbegin, d.c.nend, d.c.npoll, d.c.nrun, d.c.nend_true,
			d.c.nfd, (unsigned long long)ps.hits,
			(unsigned long long)ps.misses,
			(unsigned long long)g.poll_ns_max,
			(unsigned long long)ls.poll_ns_total);
		fdev_fini(&d);
		loop_free(l);
	}
	ASSERT_TRUE(polled);
}

/*
 * (b) end() reports work (it turns up exactly when notifications go back
 * on, with no signal): the loop must run() it before sleeping, not leave
 * it for an fd event that will never come.
 */
static void test_poll_end_work_runs_before_sleep(void)
{
	struct loop *l = poll_loop(1000000000ull, 2, 2);
	struct fdev d = { 0 };
	struct fdev_counts c;

	fdev_init(&d, l);
	d.end_makes_work = true;
	ASSERT_EQ(loop_thread_start(l), 0);
	/* One request by the fd after the loop blocked: a miss well below
	 * the cap, so the window opens and the next iteration polls. */
	fdev_submit(&d);
	ASSERT_TRUE(wait_for(&d.end_work_seen, 1));
	c = fdev_snapshot(&d);
	fdev_check_clean(&c);
	ASSERT_EQ(atomic_load(&d.signals), 1);
	ASSERT_EQ(c.nfd, 1);
	ASSERT_TRUE(c.nend_true >= 1);
	ASSERT_EQ(atomic_load(&d.done), 2);
	ASSERT_EQ(atomic_load(&d.submitted), 2);
	loop_thread_join(l);
	fdev_fini(&d);
	loop_free(l);
}

/* (c) max_ns 0: polling is off, begin() and poll() are never called,
 * every request comes by the fd, and nothing counts as polling. */
static void test_poll_off_never_begins(void)
{
	struct loop *l = poll_loop(0, 2, 2);
	struct fdev d = { 0 };
	struct guest g = { &d, 300, 30000, false, 0 };
	struct loop_poll_stats ps;
	struct loop_stats ls;

	fdev_init(&d, l);
	ASSERT_EQ(loop_thread_start(l), 0);
	guest_run(&g);
	loop_thread_join(l);

	fdev_check_clean(&d.c);
	ASSERT_EQ(d.c.nbegin, 0);
	ASSERT_EQ(d.c.npoll, 0);
	ASSERT_EQ(d.c.nend, 0);
	ASSERT_EQ(d.c.nrun, 0);
	ASSERT_EQ(g.poll_ns_max, 0);
	loop_fd_poll_stats(d.h, &ps);
	loop_get_stats(l, &ls);
	ASSERT_EQ(ps.hits, 0);
	ASSERT_EQ(ps.poll_ns, 0);
	ASSERT_EQ(ps.misses, d.c.nfd);
	ASSERT_EQ(atomic_load(&d.signals), g.rounds);
	ASSERT_EQ(ls.poll_ns_total, 0);
	fdev_fini(&d);
	loop_free(l);
}

/*
 * (d) and (e), step by step so that no timing matters:
 *  - 3 requests queued and signalled before the loop starts; the fd
 *    handler takes one: one miss, and the window opens;
 *  - the next iteration polls and finds the other two: one hit, one run();
 *  - shrink 2, a long block (> max_ns), one request: the window halves;
 *  - shrink 0, a long block: the window resets to 0, and the loop stops
 *    polling (no begin(), no polling time) from then on.
 */
static void test_poll_counters_shrink_and_reset(void)
{
	struct loop *l = poll_loop(1000000000ull, 2, 2);
	struct fdev d = { 0 };
	struct fdev_counts c;
	struct loop_poll_stats ps;
	struct loop_stats ls, ls2;
	struct loop_poll_params p;
	uint64_t w;

	fdev_init(&d, l);
	d.fd_budget_one = true;
	for (int i = 0; i < 3; i++)
		fdev_submit(&d);
	ASSERT_EQ(atomic_load(&d.signals), 3);
	ASSERT_EQ(loop_thread_start(l), 0);
	ASSERT_TRUE(wait_for(&d.done, 3));

	c = fdev_snapshot(&d);
	fdev_check_clean(&c);
	loop_fd_poll_stats(d.h, &ps);
	loop_get_stats(l, &ls);
	ASSERT_EQ(c.nfd, 1);
	ASSERT_EQ(ps.misses, 1);
	ASSERT_EQ(c.nrun, 1);
	ASSERT_EQ(c.npoll_true, 1);
	ASSERT_EQ(ps.hits, 1);
	ASSERT_TRUE(c.nbegin >= 1);
	ASSERT_TRUE(ps.poll_ns > 0);
	w = ps.poll_ns;

	/* Shrink by 2 after a block beyond the cap. */
	p = (struct loop_poll_params){ 1 * MS, 2, 2 };
	loop_set_poll_params(l, &p);
	sleep_ns(20 * MS);
	fdev_submit(&d);
	ASSERT_TRUE(wait_for(&d.done, 4));
	loop_barrier(l);
	loop_fd_poll_stats(d.h, &ps);
	loop_get_stats(l, &ls);
	ASSERT_EQ(ps.misses, 2);
	ASSERT_EQ(ps.poll_ns, w / 2);
	/* Windows ran out with nothing found: that was polling time. */
	ASSERT_TRUE(ls.poll_ns_total > 0);

	/* Shrink 0: reset. */
	p.shrink = 0;
	loop_set_poll_params(l, &p);
	sleep_ns(20 * MS);
	fdev_submit(&d);
	ASSERT_TRUE(wait_for(&d.done, 5));
	c = fdev_snapshot(&d);
	loop_fd_poll_stats(d.h, &ps);
	loop_get_stats(l, &ls);
	ASSERT_EQ(ps.misses, 3);
	ASSERT_EQ(ps.poll_ns, 0);

	/* No window, no polling: begin() and the polling time stay put
	 * (the block is again beyond the cap, so nothing grows). */
	sleep_ns(20 * MS);
	fdev_submit(&d);
	ASSERT_TRUE(wait_for(&d.done, 6));
	loop_barrier(l);
	loop_thread_join(l);
	loop_fd_poll_stats(d.h, &ps);
	loop_get_stats(l, &ls2);
	fdev_check_clean(&d.c);
	ASSERT_EQ(d.c.nbegin, c.nbegin);
	ASSERT_EQ(d.c.npoll, c.npoll);
	ASSERT_EQ(ls2.poll_ns_total, ls.poll_ns_total);
	ASSERT_EQ(ps.poll_ns, 0);
	ASSERT_EQ(ps.misses, d.c.nfd);
	ASSERT_EQ(ps.hits, 1);
	ASSERT_EQ(atomic_load(&d.done), 6);
	fdev_fini(&d);
	loop_free(l);
}

/*
 * A window polled in vain: A's fd opens A's window; then the loop polls
 * it, finds nothing and sleeps, and B's fd ends the sleep long after A's
 * cap.  A shrinks as if it had missed (counter vain), though its own fd
 * never fired again: before, only the handler that fired adapted, and A
 * kept its window for ever, spinning through it before every sleep.
 * Step by step, as above: only "long after the cap" is timing.
 */
static void test_poll_vain_window_shrinks(void)
{
	struct loop *l = poll_loop(1000000000ull, 2, 2);
	struct fdev a = { 0 }, b = { 0 };
	struct loop_poll_stats pa, pb;
	struct loop_poll_params p;
	struct fdev_counts c;
	uint64_t w;

	fdev_init(&a, l);
	fdev_init(&b, l);
	a.fd_budget_one = true;
	for (int i = 0; i < 3; i++)
		fdev_submit(&a);
	ASSERT_EQ(loop_thread_start(l), 0);
	ASSERT_TRUE(wait_for(&a.done, 3));
	loop_barrier(l);
	loop_fd_poll_stats(a.h, &pa);
	ASSERT_EQ(pa.misses, 1);
	ASSERT_EQ(pa.vain, 0);
	ASSERT_TRUE(pa.poll_ns > 0);
	w = pa.poll_ns;

	/* Cap 1 ms; B's request 20 ms later ends the sleep. */
	p = (struct loop_poll_params){ 1 * MS, 2, 2 };
	loop_set_poll_params(l, &p);
	sleep_ns(20 * MS);
	fdev_submit(&b);
	ASSERT_TRUE(wait_for(&b.done, 1));
	loop_barrier(l);
	loop_fd_poll_stats(a.h, &pa);
	loop_fd_poll_stats(b.h, &pb);
	ASSERT_EQ(pa.misses, 1);	/* A's fd did not fire */
	ASSERT_TRUE(pa.vain >= 1);
	ASSERT_TRUE(pa.poll_ns <= w / 2);
	ASSERT_EQ(pb.misses, 1);
	ASSERT_EQ(pb.vain, 0);		/* B fired: it adapts as a miss */

	/* Shrink 0: A's window resets, and with no window left nothing
	 * polls any more (A's begin() count stays put). */
	p.shrink = 0;
	loop_set_poll_params(l, &p);
	sleep_ns(20 * MS);
	fdev_submit(&b);
	ASSERT_TRUE(wait_for(&b.done, 2));
	c = fdev_snapshot(&a);
	loop_fd_poll_stats(a.h, &pa);
	ASSERT_EQ(pa.poll_ns, 0);
	sleep_ns(20 * MS);
	fdev_submit(&b);
	ASSERT_TRUE(wait_for(&b.done, 3));
	loop_barrier(l);
	loop_thread_join(l);
	fdev_check_clean(&a.c);
	fdev_check_clean(&b.c);
	ASSERT_EQ(a.c.nbegin, c.nbegin);
	ASSERT_EQ(a.c.npoll, c.npoll);
	loop_fd_poll_stats(a.h, &pa);
	ASSERT_EQ(pa.poll_ns, 0);
	ASSERT_EQ(pa.misses, 1);
	ASSERT_EQ(atomic_load(&a.done), 3);
	ASSERT_EQ(atomic_load(&b.done), 3);
	fdev_fini(&a);
	fdev_fini(&b);
	loop_free(l);
}

/*
 * Two poll handlers; A's fd opens the window, then polling finds B's
 * work and B's run() deletes A.  "Safe inside any callback": A's poll(),
 * run(), begin() or end() must not be called once it is deleted.
 */
static void test_poll_run_deleting_other_handler_skips_it(void)
{
	struct loop *l = poll_loop(1000000000ull, 2, 2);
	struct fdev a = { 0 }, b = { 0 };

	/* loop_fd_set_poll() adds at the head: B is polled first. */
	fdev_init(&a, l);
	fdev_init(&b, l);
	b.del_on_run = &a;
	fdev_submit(&a);
	/* B's request comes without a signal: only polling finds it. */
	atomic_store(&b.notify, false);
	fdev_submit(&b);
	ASSERT_EQ(loop_thread_start(l), 0);
	ASSERT_TRUE(wait_for(&b.done, 1));
	loop_barrier(l);
	loop_thread_join(l);
	ASSERT_TRUE(a.deleted);
	ASSERT_EQ(b.c.nrun, 1);
	if (a.c.violations)
		T_FAIL("deleted handler called back %u time(s), first: %s",
		       a.c.violations, a.c.why);
	fdev_check_clean(&b.c);
	fdev_fini(&b);
	fdev_fini(&a);
	loop_free(l);
}


/* Grow a window by misses spaced gap_ns apart; returns the window. */
static uint64_t fdev_grow(struct fdev *d, unsigned rounds, uint64_t gap_ns,
			  uint64_t max_ns)
{
	struct guest g = { d, rounds, gap_ns, true, max_ns };

	guest_run(&g);
	return g.poll_ns_last;
}

/*
 * The cap is a cap for the window too: after max_ns is lowered below a
 * grown window, the next misses must bring the window (as reported) to
 * max_ns or below, whatever their block time.
 */
static void test_poll_window_within_lowered_cap(void)
{
	struct loop *l = poll_loop(1000000000ull, 2, 2);
	struct fdev d = { 0 };
	struct loop_poll_params p = { 100000, 2, 2 };
	struct loop_poll_stats ps;
	uint64_t w = 0;

	fdev_init(&d, l);
	ASSERT_EQ(loop_thread_start(l), 0);
	for (int attempt = 0; attempt < 5 && w < 4 * p.max_ns; attempt++)
		w = fdev_grow(&d, 12, 2 * MS, 1000000000ull);
	ASSERT_TRUE(w >= 4 * p.max_ns);

	loop_set_poll_params(l, &p);
	/* Misses that block longer than the new cap, shorter than w. */
	fdev_grow(&d, 5, 400000, UINT64_MAX);
	loop_barrier(l);
	loop_fd_poll_stats(d.h, &ps);
	if (ps.poll_ns > p.max_ns)
		T_FAIL("window %llu ns above max_ns %llu ns (was %llu ns)",
		       (unsigned long long)ps.poll_ns, (unsigned long long)p.max_ns,
		       (unsigned long long)w);
	loop_thread_join(l);
	fdev_fini(&d);
	loop_free(l);
}

/*
 * A device whose requests turn up gap_ns after the previous one was
 * taken, driven by the clock alone: poll() compares the time with the due
 * time, and a timerfd armed for it is the notification.  No second thread,
 * so nothing but the loop's own decisions (and wake-up latency, which only
 * lengthens blocks) shapes the outcome.
 */
struct tdev {
	struct loop *l;
	int tfd;
	struct loop_fd *h;
	uint64_t gap_ns, due;
	unsigned rounds, taken, by_poll, by_fd;
	bool armed;			/* tdev_completion_ops: expects events */
	atomic_uint finished;
};

static void tdev_arm(struct tdev *t, uint64_t at)
{
	struct itimerspec its = {
		.it_value = { .tv_sec = at / 1000000000ull, .tv_nsec = at % 1000000000ull },
	};

	/* Re-arming also clears an expiry not read yet. */
	ASSERT_EQ(timerfd_settime(t->tfd, TFD_TIMER_ABSTIME, &its, NULL), 0);
}

static bool tdev_due(struct tdev *t)
{
	return t->taken < t->rounds && sys_now_ns() >= t->due;
}

static void tdev_take(struct tdev *t)
{
	if (++t->taken < t->rounds) {
		t->due = sys_now_ns() + t->gap_ns;
		tdev_arm(t, t->due);
	} else {
		tdev_arm(t, 0);
		atomic_store(&t->finished, 1);
	}
}

static bool tdev_poll(void *opaque)
{
	return tdev_due(opaque);
}

static void tdev_run(void *opaque)
{
	struct tdev *t = opaque;

	t->by_poll++;
	tdev_take(t);
}

static void tdev_begin(void *opaque)
{
}

static bool tdev_end(void *opaque)
{
	return tdev_due(opaque);
}

static const struct loop_poll_ops tdev_ops = {
	.poll = tdev_poll,
	.run = tdev_run,
	.begin = tdev_begin,
	.end = tdev_end,
};

static void tdev_fd_cb(void *opaque, uint32_t events)
{
	struct tdev *t = opaque;
	uint64_t v;

	(void)!read(t->tfd, &v, sizeof(v));
	if (tdev_due(t)) {
		t->by_fd++;
		tdev_take(t);
	}
}

/* Run t (its loop t->l set up, not started) as a poll handler with ops
 * until its rounds are done; the loop is joined but not freed.  Returns
 * the handler's poll counters (every hit is one the device saw polled). */
static struct loop_poll_stats tdev_run_on(struct tdev *t, const struct loop_poll_ops *ops)
{
	struct loop_poll_stats ps;

	t->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	ASSERT_TRUE(t->tfd >= 0);
	ASSERT_EQ(loop_fd_add(t->l, t->tfd, EPOLLIN, tdev_fd_cb, t, &t->h), 0);
	loop_fd_set_poll(t->h, ops);
	t->due = sys_now_ns() + t->gap_ns;
	tdev_arm(t, t->due);
	ASSERT_EQ(loop_thread_start(t->l), 0);
	ASSERT_TRUE(wait_for(&t->finished, 1));
	loop_thread_join(t->l);
	loop_fd_poll_stats(t->h, &ps);
	ASSERT_EQ(ps.hits, t->by_poll);
	loop_fd_del(t->l, t->h);
	close(t->tfd);
	return ps;
}

/*
 * Requests come steadily gap_ns apart, gap_ns well below max_ns: the
 * window must grow until polling catches them (hits).  1.1 ms is just
 * above a window of 4000 << 8 ns, the worst case for growth by 2.
 */
static void test_poll_window_grows_to_catch_steady_gap(void)
{
	const uint64_t gap = 1100000, max_ns = 20 * MS;
	struct loop_poll_stats ps = { 0 };

	for (int attempt = 0; attempt < 3 && !ps.hits; attempt++) {
		struct loop *l = poll_loop(max_ns, 2, 2);
		struct tdev t = { .l = l, .gap_ns = gap, .rounds = 40 };
		struct loop_stats ls;

		ps = tdev_run_on(&t, &tdev_ops);
		loop_get_stats(l, &ls);
		fprintf(stderr, "    attempt %d: window %llu ns, hits %llu, misses %llu, "
			"contended %llu\n", attempt, (unsigned long long)ps.poll_ns,
			(unsigned long long)ps.hits, (unsigned long long)ps.misses,
			(unsigned long long)ls.contended);
		loop_free(l);
	}
	if (!ps.hits)
		T_FAIL("window stuck at %llu ns, below the %llu ns gap: no hits",
		       (unsigned long long)ps.poll_ns, (unsigned long long)gap);
}

/* A backend's completions: armed while the device has work (loop.h). */
static bool tdev_armed(void *opaque)
{
	struct tdev *t = opaque;

	return t->armed;
}

static const struct loop_poll_ops tdev_completion_ops = {
	.poll = tdev_poll,
	.run = tdev_run,
	.begin = tdev_begin,
	.end = tdev_end,
	.armed = tdev_armed,
};

/* Run a tdev of `rounds` events gap_ns apart on a loop with the kick cap
 * max_ns and the completion cap cmax_ns, as a completion handler armed or
 * not; returns its poll counters. */
static struct loop_poll_stats tdev_completion_run(uint64_t gap, uint64_t max_ns,
						  uint64_t cmax_ns, bool armed)
{
	struct loop *l = new_loop("t-cpoll");
	struct loop_poll_params p = { max_ns, 2, 2, cmax_ns };
	struct tdev t = { .l = l, .gap_ns = gap, .rounds = 40, .armed = armed };
	struct loop_poll_stats ps, cs;
	struct loop_stats ls;

	loop_set_poll_params(l, &p);
	ps = tdev_run_on(&t, &tdev_completion_ops);
	/* Windows are spun for it only while it is armed (and it is the only
	 * handler here: its hits were found in windows of its own). */
	loop_get_stats(l, &ls);
	if (!armed)
		ASSERT_EQ(ls.completion_windows, 0);
	if (ps.hits)
		ASSERT_TRUE(ls.completion_windows > 0);
	/* The handler is deleted by now: the loop's completion counters
	 * (the iothread's stats) keep what it counted. */
	loop_completion_poll_stats(l, &cs);
	ASSERT_EQ(cs.hits, ps.hits);
	ASSERT_EQ(cs.misses, ps.misses);
	ASSERT_EQ(cs.vain, ps.vain);
	ASSERT_TRUE(cs.hits + cs.misses > 0);
	loop_free(l);
	return ps;
}

/*
 * Completions 1.1 ms apart, far above the kick cap (100 us) but below the
 * completion cap (20 ms): an armed completion handler's window grows to
 * catch them under its own cap; unarmed (nothing in flight), it is never
 * polled at all, whatever its window.
 */
static void test_completion_handler_own_cap_and_armed(void)
{
	const uint64_t gap = 1100000;
	struct loop_poll_stats ps = { 0 };

	for (int attempt = 0; attempt < 3 && !ps.hits; attempt++)
		ps = tdev_completion_run(gap, 100000, 20 * MS, true);
	if (!ps.hits)
		T_FAIL("armed completion handler: window %llu ns, no hits",
		       (unsigned long long)ps.poll_ns);
	ps = tdev_completion_run(gap, 100000, 20 * MS, false);
	ASSERT_EQ(ps.hits, 0);
	/* Without a completion cap, the kick cap applies: too short. */
	ps = tdev_completion_run(gap, 100000, 0, true);
	ASSERT_EQ(ps.hits, 0);
}

static bool tdev_cpu_bound(void *opaque)
{
	return true;
}

static const struct loop_poll_ops tdev_cpu_bound_ops = {
	.poll = tdev_poll,
	.run = tdev_run,
	.begin = tdev_begin,
	.end = tdev_end,
	.cpu_bound = tdev_cpu_bound,
};

/*
 * An event being made on our CPU (cpu_bound, io_uring's worker): the loop
 * never spins, not even for the steady gap that
 * test_poll_window_grows_to_catch_steady_gap's window learns to catch; it
 * sleeps, counting yields, and every event still arrives (by its fd).
 */
static void test_cpu_bound_never_spins(void)
{
	struct loop *l = poll_loop(20 * MS, 2, 2);
	struct tdev t = { .l = l, .gap_ns = 1100000, .rounds = 40 };
	struct loop_poll_stats ps = tdev_run_on(&t, &tdev_cpu_bound_ops);
	struct loop_stats ls;

	loop_get_stats(l, &ls);
	ASSERT_EQ(ps.hits, 0);
	ASSERT_EQ(t.by_fd, 40);
	ASSERT_EQ(ls.poll_ns_total, 0);
	ASSERT_TRUE(ls.yields >= 20);
	loop_free(l);
}

/*
 * A device whose completions nothing signals (io_uring IOPOLL): its fd
 * never fires, poll() finds a completion once it is due, busy() holds while
 * any is outstanding.  The loop must find every one by polling, even with
 * polling off (--poll-max-ns 0) and cpu_bound() saying not to spin; and
 * with nothing outstanding it must sleep, polling nothing.
 */
struct pdev {
	struct loop *l;
	int efd;
	struct loop_fd *h;
	uint64_t due;
	unsigned left, found, by_fd;
	bool timed_out;
};

static bool pdev_poll(void *opaque)
{
	struct pdev *d = opaque;

	return d->left && sys_now_ns() >= d->due;
}

static void pdev_run(void *opaque)
{
	struct pdev *d = opaque;

	d->found++;
	if (--d->left)
		d->due = sys_now_ns() + 200000;
	else
		loop_stop(d->l);
}

static void pdev_begin(void *opaque)
{
}

static bool pdev_end(void *opaque)
{
	return pdev_poll(opaque);
}

static bool pdev_busy(void *opaque)
{
	return ((struct pdev *)opaque)->left > 0;
}

static void pdev_fd(void *opaque, uint32_t events)
{
	struct pdev *d = opaque;

	(void)sys_eventfd_drain(d->efd);
	d->by_fd++;
}

static void pdev_timeout(void *opaque)
{
	struct pdev *d = opaque;

	d->timed_out = true;
	loop_stop(d->l);
}

static const struct loop_poll_ops pdev_ops = {
	.poll = pdev_poll,
	.run = pdev_run,
	.begin = pdev_begin,
	.end = pdev_end,
	.cpu_bound = tdev_cpu_bound,
	.busy = pdev_busy,
};

static void test_busy_handler_polled_never_sleeps(void)
{
	struct pdev d = { .l = poll_loop(0, 2, 2), .left = 20 };
	struct loop_timer *t;
	struct loop_stats s0, s1;

	d.efd = efd_new();
	d.due = sys_now_ns() + 200000;
	ASSERT_EQ(loop_fd_add(d.l, d.efd, EPOLLIN, pdev_fd, &d, &d.h), 0);
	loop_fd_set_poll(d.h, &pdev_ops);
	ASSERT_EQ(loop_timer_new(d.l, pdev_timeout, &d, &t), 0);
	loop_timer_mod(t, sys_now_ns() + 5000000000ull);
	ASSERT_EQ(loop_run(d.l), 0);
	ASSERT_TRUE(!d.timed_out);
	ASSERT_EQ(d.found, 20);
	ASSERT_EQ(d.by_fd, 0);

	/* Nothing outstanding: asleep until the timer, no polling. */
	loop_get_stats(d.l, &s0);
	loop_timer_mod(t, sys_now_ns() + 50000000);
	ASSERT_EQ(loop_run(d.l), 0);
	ASSERT_TRUE(d.timed_out);
	loop_get_stats(d.l, &s1);
	ASSERT_EQ(s1.poll_ns_total, s0.poll_ns_total);
	loop_timer_free(t);
	loop_fd_del(d.l, d.h);
	close(d.efd);
	loop_free(d.l);
}

int main(void)
{
	log_set_level(LOG_ERR);
	/* A hung loop fails the test instead of hanging the suite. */
	alarm(240);

	RUN(test_fd_handler_fires_for_readable_eventfd);
	RUN(test_fd_del_drops_event_already_fetched);
	RUN(test_bh_scheduled_twice_runs_once);
	RUN(test_bh_rescheduled_by_itself_runs_next_iteration);
	RUN(test_bh_freed_by_other_bh_does_not_run);
	RUN(test_timers_fire_once_in_deadline_order);
	RUN(test_timer_del_prevents_firing);
	RUN(test_timer_mod_moves_deadline);
	RUN(test_call_sync_runs_on_loop_thread);
	RUN(test_call_sync_on_idle_loop_runs_directly);
	RUN(test_call_sync_from_many_threads_serialized);
	RUN(test_stop_from_other_thread_ends_run);
	RUN(test_poll_begin_end_alternate);
	RUN(test_poll_end_work_runs_before_sleep);
	RUN(test_poll_off_never_begins);
	RUN(test_poll_counters_shrink_and_reset);
	RUN(test_poll_vain_window_shrinks);
	RUN(test_poll_run_deleting_other_handler_skips_it);
	RUN(test_poll_window_within_lowered_cap);
	RUN(test_poll_window_grows_to_catch_steady_gap);
	RUN(test_completion_handler_own_cap_and_armed);
	RUN(test_cpu_bound_never_spins);
	RUN(test_busy_handler_polled_never_sleeps);
	return T_EXIT_PASS;
}
