#include "loop/loop.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "loop/contend.h"
#include "loop/defer.h"
#include "loop/pay.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sys.h"

#define LOOP_MAX_EVENTS 64

/* First window of a handler that starts polling. */
#define LOOP_POLL_START_NS 4000ull
/* Timers due this soon are waited for polling (loop_poll_or_sleep). */
#define LOOP_SPIN_TIMER_NS 100000ull
/* A handler idle this long stops polling (poll_ns back to 0): an idle
 * disk must cost no CPU within a second of the load stopping. */
#define LOOP_POLL_IDLE_NS 1000000000ull
/* Contention check: every period of polling, compare CPU time with the
 * time we wanted to run; well below it means the core is shared and our
 * polling is paid for by someone else: stop polling for a while. */
#define LOOP_CONTENTION_PERIOD_NS 5000000ull
#define LOOP_CONTENTION_BACKOFF_NS 100000000ull
/* Starvation: this many events in a row that came within LOOP_STARVE_NS of
 * the end of a fruitless polling window. */
#define LOOP_STARVE_NS 3000ull
#define LOOP_STARVE_STREAK 16
/* loop_cpu_alone() re-reads the affinity (taskset -p may change it). */
#define LOOP_AFFINITY_CHECK_NS 1000000000ull
/* While a handler is busy() (polled I/O in flight), the loop polls in
 * passes this long at most, then looks at its fds and timers (epoll_wait
 * with no timeout) and polls again: it never sleeps. */
#define LOOP_BUSY_PASS_NS 20000ull

struct loop_fd {
	int fd;
	bool deleted;		/* set by loop_fd_del; freed after dispatch */
	loop_fd_cb cb;
	void *opaque;
	struct loop *loop;
	struct loop_fd *next_free;

	/* Polling (loop thread). */
	const struct loop_poll_ops *pops;
	struct loop_fd *next_poll;
	uint64_t poll_ns;
	uint64_t last_active_ns;
	bool in_window;		/* its window was the one polled before the
				 * last sleep (loop_adjust_vain) */
	bool fired;		/* its fd fired in this wake-up */
	/* Mirrors for readers on other threads. */
	_Atomic uint64_t st_hits, st_misses, st_vain, st_poll_ns;
};

struct loop_bh {
	struct loop *loop;
	loop_cb cb;
	void *opaque;
	bool scheduled;
	struct loop_bh *next;	/* on loop->bh_list while scheduled */
};

struct loop_timer {
	struct loop *loop;
	loop_cb cb;
	void *opaque;
	uint64_t deadline;
	bool armed;
	struct loop_timer *next;	/* loop->timers, sorted by deadline */
};

/* A pending loop_call_sync() request, owned by the calling thread's stack. */
struct loop_call {
	loop_cb fn;
	void *arg;
	bool done;
	struct loop_call *next;
	uint64_t shared_ops_seen;	/* the loop's shared_ops at the last check */
};

/* loop_call_sync looks at an unanswered call this often; LOOP_SIG_POKE
 * interrupts a loop thread's blocked write to a shared eventfd. */
#define LOOP_WATCHDOG_S 1
#define LOOP_SIG_POKE SIGRTMIN

struct loop {
	struct loop_pub pub;		/* first: loop.h's inline helpers */
	char name[16];
	int epfd;
	int wake_fd;			/* eventfd: stop and cross-thread calls */
	struct loop_fd *wake_h;
	atomic_bool stop;
	pthread_t thread;		/* set by the loop thread itself in loop_run */
	pthread_t joiner_tid;		/* loop_thread_start's handle, for join only */
	atomic_bool running;
	bool has_thread;		/* started by loop_thread_start */
	bool accepting;			/* calls are queued, under call_lock */
	bool no_pwait2;			/* the kernel has no epoll_pwait2 */
	/* loop_moderate: the sleep asked for this iteration; the thread's
	 * timer slack made 1 ns at the first (an 80 us sleep is not 130). */
	uint64_t moderate_ns;
	bool slack_set;
	_Atomic uint64_t st_moderated;
	/* Shared-fd operations begun and ended by the loop thread (odd: one
	 * under way; sys_shared_fd_watch), for loop_call_sync's watchdog. */
	_Atomic uint64_t shared_ops;

	/* Loop thread only. */
	struct loop_bh *bh_list;
	struct loop_bh *bh_running;	/* the batch loop_run_bhs is running */
	struct loop_timer *timers;
	struct loop_fd *free_list;	/* deleted handlers, freed after dispatch */
	struct loop_fd *polls;		/* handlers with poll ops */
	bool poll_started;		/* begin() called, end() not yet */
	uint64_t contended_until;
	bool cpu_alone;		/* loop_cpu_alone(), as last read */
	uint64_t cpu_alone_ns;	/* when it was read (now_ns); 0: never */
	/* Counters of deleted completion handlers (loop_completion_poll_stats). */
	struct loop_poll_stats completion_base;
	uint64_t cs_wall0, cs_cpu0, cs_blocked0;	/* contention sample */
	uint64_t cs_wait0;		/* its run-queue wait at the start (sched_fd) */
	int sched_fd;			/* sys_sched_wait_open(), or -1: closed for good
					 * on the first failed read */
	bool polled_in_sample;
	unsigned starve_streak;
	bool windows_open;		/* some handler's in_window is set */
	uint64_t blocked_total;
	/* Does polling pay (pay.h)?  poll_gen counts changes of the poll
	 * handler list; a check that saw another list is dropped. */
	struct pay pay;
	unsigned poll_gen, pay_gen;

	/* Knobs (any thread writes) and counters (any thread reads). */
	_Atomic uint64_t p_max_ns;
	_Atomic uint64_t p_completion_max_ns;
	_Atomic unsigned p_grow, p_shrink;
	_Atomic uint64_t st_busy_ns, st_poll_ns, st_contended;
	_Atomic uint64_t st_cwindows;	/* windows spun for a backend's completions */
	_Atomic uint64_t st_yields;	/* no window: a handler was cpu_bound() */
	atomic_bool p_pay;		/* the pay check runs (--no-poll-check: off) */
	_Atomic uint64_t st_pay_checks, st_pay_checks_off, st_pay_aborted;
	_Atomic uint64_t st_pay_off, st_pay_ratio_pm;
	clockid_t cpu_clock;
	atomic_bool have_cpu_clock;

	/* Cross-thread calls, protected by call_lock. */
	pthread_mutex_t call_lock;
	pthread_cond_t call_done;
	struct loop_call *calls;
};
STATIC_ASSERT(offsetof(struct loop, pub) == 0,
	      "loop.h's inline helpers read struct loop_pub at the start of struct loop");

static inline void st_add(_Atomic uint64_t *c, uint64_t v)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
			      memory_order_relaxed);
}

static inline void st_set(_Atomic uint64_t *c, uint64_t v)
{
	atomic_store_explicit(c, v, memory_order_relaxed);
}

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	if (clock_gettime(id, &ts) < 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void loop_run_calls(struct loop *l)
{
	struct loop_call *c;

	pthread_mutex_lock(&l->call_lock);
	while ((c = l->calls) != NULL) {
		l->calls = c->next;
		pthread_mutex_unlock(&l->call_lock);
		c->fn(c->arg);
		pthread_mutex_lock(&l->call_lock);
		c->done = true;
		pthread_cond_broadcast(&l->call_done);
	}
	pthread_mutex_unlock(&l->call_lock);
}

static void loop_wake_cb(void *opaque, uint32_t events)
{
	struct loop *l = opaque;

	(void)sys_eventfd_drain(l->wake_fd);
	loop_run_calls(l);
}

int loop_new(const char *name, struct loop **out)
{
	struct loop *l = calloc(1, sizeof(*l));
	int r;

	if (!l)
		return -ENOMEM;
	snprintf(l->name, sizeof(l->name), "%s", name);
	l->p_max_ns = 32768;
	l->p_grow = 2;
	l->p_shrink = 2;
	l->p_pay = true;
	l->sched_fd = -1;
	pay_init(&l->pay, sys_now_ns());
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		r = -errno;
		goto err_free;
	}
	l->wake_fd = sys_eventfd();
	if (l->wake_fd < 0) {
		r = l->wake_fd;
		goto err_epoll;
	}
	pthread_mutex_init(&l->call_lock, NULL);
	pthread_cond_init(&l->call_done, NULL);
	r = loop_fd_add(l, l->wake_fd, EPOLLIN, loop_wake_cb, l, &l->wake_h);
	if (r < 0)
		goto err_wake;
	*out = l;
	return 0;

err_wake:
	close(l->wake_fd);
err_epoll:
	close(l->epfd);
err_free:
	free(l);
	return r;
}

static void loop_reap_deleted(struct loop *l)
{
	struct loop_fd *h;

	while ((h = l->free_list) != NULL) {
		l->free_list = h->next_free;
		free(h);
	}
}

void loop_free(struct loop *l)
{
	if (!l)
		return;
	loop_fd_del(l, l->wake_h);
	loop_reap_deleted(l);
	close(l->wake_fd);
	close(l->epfd);
	pthread_mutex_destroy(&l->call_lock);
	pthread_cond_destroy(&l->call_done);
	free(l);
}

/* ---- fd handlers ---- */

int loop_fd_add(struct loop *l, int fd, uint32_t events, loop_fd_cb cb,
		void *opaque, struct loop_fd **out)
{
	struct epoll_event ev = { .events = events };
	struct loop_fd *h = calloc(1, sizeof(*h));

	if (!h)
		return -ENOMEM;
	h->fd = fd;
	h->cb = cb;
	h->opaque = opaque;
	h->loop = l;
	ev.data.ptr = h;
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int r = -errno;

		free(h);
		return r;
	}
	if (out)
		*out = h;
	return 0;
}

int loop_fd_mod(struct loop *l, struct loop_fd *h, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = h };

	return epoll_ctl(l->epfd, EPOLL_CTL_MOD, h->fd, &ev) < 0 ? -errno : 0;
}

/* Add h's counters to *sum (poll_ns: the longest). */
static void poll_stats_add(const struct loop_fd *h, struct loop_poll_stats *sum)
{
	struct loop_poll_stats s;

	loop_fd_poll_stats(h, &s);
	sum->hits += s.hits;
	sum->misses += s.misses;
	sum->vain += s.vain;
	sum->poll_ns = MAX(sum->poll_ns, s.poll_ns);
}

void loop_fd_del(struct loop *l, struct loop_fd *h)
{
	if (!h || h->deleted)
		return;
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, h->fd, NULL);
	if (h->pops) {
		struct loop_fd **p;

		for (p = &l->polls; *p; p = &(*p)->next_poll)
			if (*p == h) {
				*p = h->next_poll;
				break;
			}
		if (h->pops->armed)
			poll_stats_add(h, &l->completion_base);
		l->poll_gen++;
	}
	/* Events for h may already sit in this iteration's array: keep the
	 * memory until dispatch is over and let the deleted flag skip them.
	 * A loop that is not running has no such array (and may never reap:
	 * a loop driven only through inline loop_call_sync, as the fuzz
	 * targets do): free at once. */
	h->deleted = true;
	if (!atomic_load(&l->running)) {
		free(h);
		return;
	}
	h->next_free = l->free_list;
	l->free_list = h;
}

void loop_fd_set_poll(struct loop_fd *h, const struct loop_poll_ops *ops)
{
	struct loop *l = h->loop;

	h->pops = ops;
	h->poll_ns = 0;
	h->last_active_ns = sys_now_ns();
	h->next_poll = l->polls;
	l->polls = h;
	l->poll_gen++;
	/* Join a polling session in progress so begin/end stay paired. */
	if (l->poll_started)
		ops->begin(h->opaque);
}

void loop_fd_poll_stats(const struct loop_fd *h, struct loop_poll_stats *out)
{
	out->hits = atomic_load_explicit(&h->st_hits, memory_order_relaxed);
	out->misses = atomic_load_explicit(&h->st_misses, memory_order_relaxed);
	out->vain = atomic_load_explicit(&h->st_vain, memory_order_relaxed);
	out->poll_ns = atomic_load_explicit(&h->st_poll_ns, memory_order_relaxed);
}

void loop_completion_poll_stats(struct loop *l, struct loop_poll_stats *out)
{
	/* Handlers deleted so far (a reconnected NBD server) live on in the
	 * base, so the counters never go back. */
	*out = l->completion_base;
	out->poll_ns = 0;
	for (const struct loop_fd *h = l->polls; h; h = h->next_poll)
		if (h->pops->armed)
			poll_stats_add(h, out);
}

void loop_set_poll_params(struct loop *l, const struct loop_poll_params *p)
{
	atomic_store(&l->p_pay, !p->no_check);
	atomic_store(&l->p_max_ns, p->max_ns);
	atomic_store(&l->p_completion_max_ns, p->completion_max_ns);
	atomic_store(&l->p_grow, p->grow < 2 ? 2 : p->grow);
	atomic_store(&l->p_shrink, p->shrink);
}

void loop_get_poll_params(struct loop *l, struct loop_poll_params *p)
{
	p->max_ns = atomic_load(&l->p_max_ns);
	p->completion_max_ns = atomic_load(&l->p_completion_max_ns);
	p->grow = atomic_load(&l->p_grow);
	p->shrink = atomic_load(&l->p_shrink);
	p->no_check = !atomic_load(&l->p_pay);
}

void loop_get_stats(struct loop *l, struct loop_stats *out)
{
	out->busy_ns = atomic_load_explicit(&l->st_busy_ns, memory_order_relaxed);
	out->poll_ns_total = atomic_load_explicit(&l->st_poll_ns, memory_order_relaxed);
	out->contended = atomic_load_explicit(&l->st_contended, memory_order_relaxed);
	out->completion_windows = atomic_load_explicit(&l->st_cwindows, memory_order_relaxed);
	out->yields = atomic_load_explicit(&l->st_yields, memory_order_relaxed);
	out->pay_checks = atomic_load_explicit(&l->st_pay_checks, memory_order_relaxed);
	out->pay_checks_off = atomic_load_explicit(&l->st_pay_checks_off, memory_order_relaxed);
	out->pay_aborted = atomic_load_explicit(&l->st_pay_aborted, memory_order_relaxed);
	out->pay_off = atomic_load_explicit(&l->st_pay_off, memory_order_relaxed);
	out->pay_ratio_pm = atomic_load_explicit(&l->st_pay_ratio_pm, memory_order_relaxed);
	out->moderated = atomic_load_explicit(&l->st_moderated, memory_order_relaxed);
	out->cpu_ns = atomic_load(&l->have_cpu_clock) && atomic_load(&l->running) ?
		      clock_ns(l->cpu_clock) : 0;
}

/* ---- Bottom halves and timers ---- */

int loop_bh_new(struct loop *l, loop_cb cb, void *opaque, struct loop_bh **out)
{
	struct loop_bh *bh = calloc(1, sizeof(*bh));

	if (!bh)
		return -ENOMEM;
	bh->loop = l;
	bh->cb = cb;
	bh->opaque = opaque;
	*out = bh;
	return 0;
}

void loop_bh_schedule(struct loop_bh *bh)
{
	if (bh->scheduled)
		return;
	bh->scheduled = true;
	bh->next = bh->loop->bh_list;
	bh->loop->bh_list = bh;
}

static void bh_unlink(struct loop_bh **list, struct loop_bh *bh)
{
	for (struct loop_bh **p = list; *p; p = &(*p)->next)
		if (*p == bh) {
			*p = bh->next;
			return;
		}
}

void loop_bh_free(struct loop_bh *bh)
{
	if (!bh)
		return;
	/* It may sit in the batch being run right now (freed by another
	 * bh of the same batch): unlink it from there too. */
	bh_unlink(&bh->loop->bh_list, bh);
	bh_unlink(&bh->loop->bh_running, bh);
	free(bh);
}

static void loop_run_bhs(struct loop *l)
{
	struct loop_bh *bh;

	/* Bottom halves scheduled by bottom halves (or by the deferred calls
	 * after this phase) run in the next iteration: take the list first so
	 * a self-rescheduling bh cannot starve fds.  The batch is popped from
	 * the loop, not walked by a saved pointer, so a bh may free another. */
	l->bh_running = l->bh_list;
	l->bh_list = NULL;
	while ((bh = l->bh_running) != NULL) {
		l->bh_running = bh->next;
		bh->scheduled = false;
		bh->cb(bh->opaque);
	}
}

int loop_timer_new(struct loop *l, loop_cb cb, void *opaque, struct loop_timer **out)
{
	struct loop_timer *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->loop = l;
	t->cb = cb;
	t->opaque = opaque;
	*out = t;
	return 0;
}

void loop_timer_del(struct loop_timer *t)
{
	struct loop_timer **p;

	if (!t || !t->armed)
		return;
	for (p = &t->loop->timers; *p; p = &(*p)->next)
		if (*p == t) {
			*p = t->next;
			break;
		}
	t->armed = false;
}

void loop_timer_mod(struct loop_timer *t, uint64_t deadline_ns)
{
	struct loop_timer **p;

	loop_timer_del(t);
	t->deadline = deadline_ns;
	for (p = &t->loop->timers; *p && (*p)->deadline <= deadline_ns; p = &(*p)->next)
		;
	t->next = *p;
	*p = t;
	t->armed = true;
}

void loop_timer_free(struct loop_timer *t)
{
	loop_timer_del(t);
	free(t);
}

static void loop_run_timers(struct loop *l, uint64_t now)
{
	struct loop_timer *t;

	while ((t = l->timers) != NULL && t->deadline <= now) {
		l->timers = t->next;
		t->armed = false;
		t->cb(t->opaque);
	}
}

/* ---- Polling ---- */

/* Polling found work for h: run it and count the hit. */
static void loop_poll_hit(struct loop_fd *h, uint64_t now)
{
	h->pops->run(h->opaque);
	h->last_active_ns = now;
	st_add(&h->st_hits, 1);
}

/* Nothing polled in vain: the window found work. */
static void loop_clear_windows(struct loop *l)
{
	for (struct loop_fd *h = l->polls; h; h = h->next_poll)
		h->in_window = false;
	l->windows_open = false;
}

/* The cap of handler h's window: completion handlers (with armed()) have
 * their own; 0 everywhere when polling is off. */
static uint64_t poll_cap(const struct loop_poll_params *p, const struct loop_fd *h)
{
	if (!p->max_ns)
		return 0;
	return h->pops->armed && p->completion_max_ns ? p->completion_max_ns : p->max_ns;
}

/* One pass over the poll handlers; true if any found work. */
static bool loop_poll_once(struct loop *l, uint64_t now)
{
	bool progress = false;

	defer_begin();
	for (struct loop_fd *h = l->polls, *next; h; h = next) {
		next = h->next_poll;
		/* A run() may delete a later handler: its memory lives until
		 * the end of the iteration, its opaque may not. */
		if (h->deleted)
			continue;
		if (h->pops->poll(h->opaque)) {
			l->pub.now_ns = now;
			loop_poll_hit(h, now);
			progress = true;
		}
	}
	/* Completions found while polling are notified now, never later. */
	defer_end();
	return progress;
}

/* Is our polling paid for by another thread's CPU?  Sampled every
 * LOOP_CONTENTION_PERIOD_NS while polling. */
static void loop_check_contention(struct loop *l, uint64_t now)
{
	uint64_t wall = now - l->cs_wall0, cpu, wait = 0;
	bool have_wait = false;

	if (wall < LOOP_CONTENTION_PERIOD_NS)
		return;
	cpu = clock_ns(l->cpu_clock);
	if (l->sched_fd >= 0) {
		have_wait = sys_sched_wait_ns(l->sched_fd, &wait) == 0;
		if (!have_wait)
			sys_close(&l->sched_fd);	/* not kept: the CPU time then */
	}
	if (l->polled_in_sample && l->cs_wall0) {
		struct contend_sample s = {
			.wall = wall,
			.runnable = wall - MIN(wall, l->blocked_total - l->cs_blocked0),
			.cpu = cpu - l->cs_cpu0,
			.wait = wait - l->cs_wait0,
			.have_wait = have_wait,
		};

		if (contend_shared(&s)) {
			l->contended_until = now + LOOP_CONTENTION_BACKOFF_NS;
			st_add(&l->st_contended, 1);
			log_debug("loop %s: CPU contended (ran %llu, waited %llu of %llu ns "
				  "runnable), polling off for %llu ms", l->name,
				  (unsigned long long)s.cpu,
				  (unsigned long long)(s.have_wait ? s.wait : 0),
				  (unsigned long long)s.runnable,
				  LOOP_CONTENTION_BACKOFF_NS / 1000000);
		}
	}
	l->cs_wall0 = now;
	l->cs_cpu0 = cpu;
	l->cs_blocked0 = l->blocked_total;
	l->cs_wait0 = wait;
	l->polled_in_sample = false;
}

bool loop_cpu_alone(struct loop *l)
{
	if (!l->cpu_alone_ns || l->pub.now_ns - l->cpu_alone_ns >= LOOP_AFFINITY_CHECK_NS) {
		cpu_set_t set;

		l->cpu_alone = sched_getaffinity(0, sizeof(set), &set) == 0 &&
			       CPU_COUNT(&set) == 1;
		l->cpu_alone_ns = l->pub.now_ns ? l->pub.now_ns : 1;
	}
	return l->cpu_alone;
}

/* Is an event we wait for being made on our CPU (loop.h: cpu_bound)? */
static bool loop_cpu_bound(const struct loop *l)
{
	for (const struct loop_fd *h = l->polls; h; h = h->next_poll)
		if (h->pops->cpu_bound && h->pops->cpu_bound(h->opaque))
			return true;
	return false;
}

/* Is an event expected that nothing will signal (loop.h: busy)? */
static bool loop_busy(const struct loop *l)
{
	for (const struct loop_fd *h = l->polls; h; h = h->next_poll)
		if (h->pops->busy && h->pops->busy(h->opaque))
			return true;
	return false;
}

/* The work the poll handlers have done so far (loop.h: work). */
static uint64_t loop_work(const struct loop *l)
{
	uint64_t w = 0;

	for (const struct loop_fd *h = l->polls; h; h = h->next_poll)
		if (h->pops->work && !h->deleted)
			w += h->pops->work(h->opaque);
	return w;
}

/*
 * Does polling pay, end to end (pay.h)?  Fed at every iteration while a
 * check runs, at the end of each run otherwise.  Returns true while
 * spinning is off by its decision or for its OFF sub-phase.
 */
static bool loop_pay(struct loop *l, uint64_t now, const struct loop_poll_params *p)
{
	struct pay *pay = &l->pay;
	uint64_t checks;
	bool off;

	if (!p->max_ns || !atomic_load_explicit(&l->p_pay, memory_order_relaxed)) {
		/* Switched off (set-poll, --no-poll-check): nothing of it
		 * stays in force; switched on again, it starts afresh. */
		if (pay->off || pay->phase == PAY_MEASURE) {
			pay_init(pay, now);
			st_set(&l->st_pay_off, 0);
		}
		return false;
	}
	/* Backed off for contention, the ON side would not spin either:
	 * nothing to compare. */
	if (now < l->contended_until) {
		pay_abort(pay, now);
		return false;
	}
	if (!pay_due(pay, now))
		return pay->off;
	if (l->pay_gen != l->poll_gen) {
		l->pay_gen = l->poll_gen;
		pay_abort(pay, now);
	}
	checks = pay->checks;
	off = pay_tick(pay, now, loop_work(l));
	if (pay->checks != checks)
		log_debug("loop %s: polling %s (time per request without spinning: "
			  "%u.%u%% of with)", l->name, off ? "off" : "on",
			  pay->last_ratio_pm / 10, pay->last_ratio_pm % 10);
	st_set(&l->st_pay_checks, pay->checks);
	st_set(&l->st_pay_checks_off, pay->checks_off);
	st_set(&l->st_pay_aborted, pay->aborted);
	st_set(&l->st_pay_off, pay->decided_off);
	st_set(&l->st_pay_ratio_pm, pay->last_ratio_pm);
	return off;
}

/* Notifications off (begin(), once per polling session), then poll until
 * something is found or window_ns is over.  True if something was. */
static bool loop_spin(struct loop *l, uint64_t window_ns)
{
	uint64_t start = sys_now_ns(), now = start;
	bool progress;

	if (!l->poll_started) {
		for (struct loop_fd *h = l->polls; h; h = h->next_poll)
			h->pops->begin(h->opaque);
		l->poll_started = true;
	}
	do {
		progress = loop_poll_once(l, now);
		now = sys_now_ns();
	} while (!progress && now - start < window_ns);
	st_add(&l->st_poll_ns, now - start);
	return progress;
}

/*
 * Phase 2, the one place that decides between polling and sleeping.
 * Returns true if work was found (the caller must not block).
 * timeout_ns is the block time the other phases allow (-1: forever).
 */
/* About to sleep: every poll handler's notifications on, then one last
 * look.  True if it found work. */
static bool loop_poll_end(struct loop *l, uint64_t now)
{
	bool progress = false;

	l->poll_started = false;
	defer_begin();
	for (struct loop_fd *h = l->polls, *next; h; h = next) {
		next = h->next_poll;
		if (h->deleted)
			continue;
		if (h->pops->end(h->opaque)) {
			loop_poll_hit(h, now);
			progress = true;
		}
	}
	defer_end();
	return progress;
}

static bool loop_poll_or_sleep(struct loop *l, int64_t timeout_ns)
{
	struct loop_poll_params p;
	uint64_t now, window = 0;
	bool progress = false, cwindow = false, spin;

	if (!l->polls)
		return false;
	/* Events nobody signals (polled I/O): never sleep, whatever the
	 * windows, the contention or a cpu_bound() say; looking is the only
	 * way they are ever found. */
	if (timeout_ns != 0 && loop_busy(l)) {
		/* A pass of LOOP_BUSY_PASS_NS at most, then fds and timers. */
		if (loop_spin(l, timeout_ns < 0 ? LOOP_BUSY_PASS_NS :
				 MIN(LOOP_BUSY_PASS_NS, (uint64_t)timeout_ns)))
			loop_clear_windows(l);
		return true;
	}
	loop_get_poll_params(l, &p);
	now = sys_now_ns();
	spin = !loop_pay(l, now, &p) && timeout_ns != 0 && p.max_ns &&
	       now >= l->contended_until;
	/* What we wait for is made on our CPU: leave it the CPU. */
	if (spin && loop_cpu_bound(l)) {
		spin = false;
		st_add(&l->st_yields, 1);
	}
	/* The contention sample is taken before a window, not after it: after
	 * one that found a request, that request goes to the disk and the loop
	 * sleeps, and the sample's syscalls (~10 us here) kept the CPU busy
	 * while the disk worked; on a VM a completion's interrupt that finds
	 * the vCPU running instead of halted took ~16 us longer
	 * (bench/qd1-path, "device: CPU idle / busy").  Before a kick window
	 * the driver is still being woken.  A sample that finds contention
	 * spins nothing now. */
	if (spin) {
		loop_check_contention(l, now);
		spin = now >= l->contended_until;
	}
	if (spin) {
		l->windows_open = false;
		for (struct loop_fd *h = l->polls; h; h = h->next_poll) {
			h->in_window = false;
			if (h->poll_ns && now - h->last_active_ns > LOOP_POLL_IDLE_NS) {
				h->poll_ns = 0;
				st_set(&h->st_poll_ns, 0);
			}
			/* A backend with nothing in flight expects nothing,
			 * and neither does a handler that says so. */
			if ((h->pops->armed && !h->pops->armed(h->opaque)) ||
			    (h->pops->quiet && h->pops->quiet(h->opaque)))
				continue;
			window = MAX(window, MIN(h->poll_ns, poll_cap(&p, h)));
		}
		/* The handlers whose window is the one spun, the longest: a
		 * shorter one ran inside it and cost nothing of its own (a
		 * queue's kick window inside io_uring's completion window). */
		for (struct loop_fd *h = l->polls; window && h; h = h->next_poll) {
			h->in_window = (!h->pops->armed || h->pops->armed(h->opaque)) &&
				       !(h->pops->quiet && h->pops->quiet(h->opaque)) &&
				       MIN(h->poll_ns, poll_cap(&p, h)) == window;
			l->windows_open |= h->in_window;
			cwindow |= h->in_window && h->pops->armed;
		}
		if (cwindow)
			st_add(&l->st_cwindows, 1);
		if (timeout_ns > 0)
			window = MIN(window, (uint64_t)timeout_ns);
	}
	/* A timer due within LOOP_SPIN_TIMER_NS (an interrupt held for a few
	 * microseconds): wait for it polling, not asleep.  Waking from a sleep
	 * costs more than that on some machines (a halted vCPU: tens of
	 * microseconds), and the timer's point is its precision. */
	if (timeout_ns > 0 && (uint64_t)timeout_ns <= LOOP_SPIN_TIMER_NS && spin)
		window = MAX(window, (uint64_t)timeout_ns);
	if (window) {
		progress = loop_spin(l, window);
		now = sys_now_ns();
		l->polled_in_sample = true;
		if (progress) {
			loop_clear_windows(l);
			return true;	/* stay in polling mode, kicks stay off */
		}
	}
	if (l->poll_started && timeout_ns != 0)
		progress |= loop_poll_end(l, now);
	return progress;
}

/* A poll handler's fd fired block_ns after the loop went idle (polling
 * included): grow its window if a slightly longer one would have caught
 * this, shrink it if the wait was beyond any window we would pay for. */
static void loop_adjust_poll(struct loop *l, struct loop_fd *h, uint64_t block_ns,
			     uint64_t slept_ns, uint64_t now)
{
	struct loop_poll_params p;
	uint64_t cap;

	loop_get_poll_params(l, &p);
	cap = poll_cap(&p, h);
	st_add(&h->st_misses, 1);
	h->last_active_ns = now;
	/* Spinning off by the pay check: no window was spun, and what a
	 * window would have caught is for the ON side to learn.  The windows
	 * stay as the ON side left them. */
	if (l->pay.off)
		return;
	/*
	 * The other kind of contention: the producer waits for *our* CPU.
	 * A whole window at the cap polled in vain, then the event arrives
	 * the moment we sleep, again and again: our spinning is what delays
	 * it (or the window cannot reach it).  Back off as when our own CPU
	 * is stolen.
	 */
	if (h->poll_ns >= cap && block_ns > slept_ns + 1000 &&
	    slept_ns < LOOP_STARVE_NS) {
		if (++l->starve_streak >= LOOP_STARVE_STREAK) {
			l->starve_streak = 0;
			l->contended_until = now + LOOP_CONTENTION_BACKOFF_NS;
			st_add(&l->st_contended, 1);
			log_debug("loop %s: events arrive only when we stop polling; "
				  "polling off for %llu ms", l->name,
				  LOOP_CONTENTION_BACKOFF_NS / 1000000);
		}
	} else {
		l->starve_streak = 0;
	}
	/* The cap may have been lowered at runtime. */
	if (h->poll_ns > cap)
		h->poll_ns = cap;
	if (block_ns <= h->poll_ns) {
		/* The window was long enough; it was cut short (timer,
		 * contention).  Nothing to learn. */
	} else if (block_ns > cap) {
		h->poll_ns = p.shrink ? h->poll_ns / p.shrink : 0;
	} else if (h->poll_ns < cap && now >= l->contended_until) {
		h->poll_ns = h->poll_ns ? h->poll_ns * p.grow : LOOP_POLL_START_NS;
		if (h->poll_ns > cap)
			h->poll_ns = cap;
	}
	st_set(&h->st_poll_ns, h->poll_ns);
}

/*
 * The loop slept block_ns after polling, and another fd ended the sleep:
 * the handlers whose window that was (the longest) and that did not fire
 * spent it in vain.  If the wait was beyond their cap, no window of theirs would have
 * paid: shrink them as if they had missed (the fd that fired adapts in
 * loop_adjust_poll).  Without this a handler that is hit at one point of
 * a cycle (a kick just after our call) keeps its window at every other
 * point (after a submission at QD1, where the next event is the disk's,
 * hundreds of microseconds later) and spins through it each time: on RBD,
 * whose completions are made by librbd's threads on our CPU, that spin
 * delays the very completion we wait for.  QEMU 7.2's single window per
 * AioContext (Debian 12's qemu-storage-daemon) shrinks after any long
 * wait, whichever fd ends it (aio_poll, util/aio-posix.c).
 */
static void loop_adjust_vain(struct loop *l, const struct epoll_event *evs, int n,
			     uint64_t block_ns)
{
	struct loop_poll_params p;

	/* Nothing was polled (polling off, no window open): nothing to learn,
	 * and no walk of the handlers on every wake-up. */
	if (!l->windows_open)
		return;
	l->windows_open = false;
	for (int i = 0; i < n; i++)
		((struct loop_fd *)evs[i].data.ptr)->fired = true;
	loop_get_poll_params(l, &p);
	for (struct loop_fd *h = l->polls; h; h = h->next_poll) {
		/* n == 0: our own timer ended it; nothing to learn. */
		if (n && h->in_window && !h->fired && !h->deleted &&
		    block_ns > poll_cap(&p, h)) {
			h->poll_ns = p.shrink ? h->poll_ns / p.shrink : 0;
			st_set(&h->st_poll_ns, h->poll_ns);
			st_add(&h->st_vain, 1);
		}
		h->in_window = false;
	}
	for (int i = 0; i < n; i++)
		((struct loop_fd *)evs[i].data.ptr)->fired = false;
}

/* ---- The loop ---- */

/* How long phase 3 may block: 0 with bottom halves pending, until the
 * next timer (to the nanosecond: timers of a few microseconds, such as
 * interrupt moderation's, are meant), or -1: until an fd fires. */
static int64_t loop_timeout_ns(struct loop *l, uint64_t now)
{
	uint64_t d;

	if (l->bh_list)
		return 0;
	if (!l->timers)
		return -1;
	if (l->timers->deadline <= now)
		return 0;
	d = l->timers->deadline - now;
	return d > 60000000000ull ? 60000000000ll : (int64_t)d;
}

/* epoll_wait with a timeout in ns: epoll_pwait2 (Linux 5.11), else
 * epoll_wait rounded up to the millisecond. */
static int loop_epoll_wait(struct loop *l, struct epoll_event *evs, int max, int64_t timeout_ns)
{
	struct timespec ts = { .tv_sec = timeout_ns / 1000000000ll,
			       .tv_nsec = timeout_ns % 1000000000ll };
	int n;

	if (!l->no_pwait2) {
		n = epoll_pwait2(l->epfd, evs, max, timeout_ns < 0 ? NULL : &ts, NULL);
		if (n >= 0 || errno != ENOSYS)
			return n;
		l->no_pwait2 = true;
	}
	return epoll_wait(l->epfd, evs, max, timeout_ns < 0 ? -1 :
			  (int)((timeout_ns + 999999) / 1000000));
}

void loop_moderate(struct loop *l, uint64_t ns)
{
	if (ns > l->moderate_ns)
		l->moderate_ns = ns;
}

/* Before phase 2: the sleep a handler asked for (loop_moderate), cut to
 * what is due sooner.  True if it slept (no polling window then). */
static bool loop_moderation_sleep(struct loop *l, uint64_t now)
{
	int64_t due = loop_timeout_ns(l, now);
	uint64_t ns = l->moderate_ns;
	struct timespec ts;

	l->moderate_ns = 0;
	if (due >= 0 && (uint64_t)due < ns)
		ns = (uint64_t)due;
	if (!ns)
		return false;
	if (!l->slack_set) {
		(void)prctl(PR_SET_TIMERSLACK, 1UL);
		l->slack_set = true;
	}
	ts = (struct timespec){ .tv_sec = 0, .tv_nsec = (long)MIN(ns, 999999999ull) };
	st_add(&l->st_moderated, 1);
	while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
		;
	return true;
}

int loop_run(struct loop *l)
{
	struct epoll_event evs[LOOP_MAX_EVENTS];
	uint64_t now, woke;

	l->thread = pthread_self();
	sys_shared_fd_watch(&l->shared_ops);
	if (pthread_getcpuclockid(l->thread, &l->cpu_clock) == 0)
		atomic_store(&l->have_cpu_clock, true);
	/* Opened by this thread: /proc/thread-self is whoever opens it. */
	l->sched_fd = sys_sched_wait_open();
	if (l->sched_fd < 0)
		l->sched_fd = -1;
	l->cs_wall0 = 0;	/* the first sample, from this thread's start, is not judged */
	pthread_mutex_lock(&l->call_lock);
	l->accepting = true;
	pthread_mutex_unlock(&l->call_lock);
	atomic_store(&l->running, true);
	/* Calls queued before we started would otherwise wait for a wake-up. */
	loop_run_calls(l);
	now = sys_now_ns();
	woke = now;

	while (!atomic_load(&l->stop)) {
		uint64_t t0, t1, idle_start;
		int64_t timeout;
		int n;

		/* Phase 1. */
		loop_run_timers(l, now);
		/* Phase 2.  Idle time for adaptation counts from here: a window
		 * that just missed must see the whole wait, polling included. */
		idle_start = sys_now_ns();
		timeout = loop_timeout_ns(l, now);
		if (l->moderate_ns && loop_moderation_sleep(l, idle_start)) {
			/* A handler's notifications off from an earlier
			 * window: on before epoll_wait may sleep. */
			timeout = l->poll_started && loop_poll_end(l, sys_now_ns()) ? 0 :
				  loop_timeout_ns(l, sys_now_ns());
		} else if (loop_poll_or_sleep(l, timeout))
			timeout = 0;
		else if (timeout > 0)
			/* Less what polling used up: a timer is not late by a
			 * polling window. */
			timeout = loop_timeout_ns(l, sys_now_ns());
		/* Phase 3. */
		t0 = sys_now_ns();
		/* Busy: everything since we last woke up, polling included. */
		st_add(&l->st_busy_ns, t0 - woke);
		n = loop_epoll_wait(l, evs, LOOP_MAX_EVENTS, timeout);
		t1 = sys_now_ns();
		l->blocked_total += t1 - t0;
		now = woke = l->pub.now_ns = t1;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_err("loop %s: epoll_wait: %s", l->name, strerror(errno));
			break;
		}
		if (n >= 0 && timeout != 0)
			loop_adjust_vain(l, evs, n, t1 - idle_start);
		/* Phases 4 and 5 form one batch for deferred calls (phase 6). */
		defer_begin();
		for (int i = 0; i < n; i++) {
			struct loop_fd *h = evs[i].data.ptr;

			if (h->deleted)
				continue;
			if (h->pops && timeout != 0)
				loop_adjust_poll(l, h, t1 - idle_start, t1 - t0, now);
			h->cb(h->opaque, evs[i].events);
		}
		loop_run_bhs(l);
		defer_end();
		loop_reap_deleted(l);
		now = sys_now_ns();
	}
	atomic_store(&l->stop, false);
	/* Nobody may be left waiting on a loop that no longer runs: refuse new
	 * calls, then run the ones already queued. */
	pthread_mutex_lock(&l->call_lock);
	l->accepting = false;
	pthread_mutex_unlock(&l->call_lock);
	loop_run_calls(l);
	sys_shared_fd_watch(NULL);
	sys_close(&l->sched_fd);
	atomic_store(&l->running, false);
	return 0;
}

void loop_stop(struct loop *l)
{
	atomic_store(&l->stop, true);
	(void)sys_eventfd_signal(l->wake_fd);
}

bool loop_polling(const struct loop *l)
{
	return atomic_load_explicit(&l->p_max_ns, memory_order_relaxed) &&
	       l->pub.now_ns >= l->contended_until && !l->pay.off;
}

bool loop_can_spin(struct loop *l)
{
	return loop_polling(l) && !loop_cpu_bound(l);
}

bool loop_in_thread(struct loop *l)
{
	return atomic_load(&l->running) && pthread_equal(l->thread, pthread_self());
}

int loop_call_sync(struct loop *l, loop_cb fn, void *arg)
{
	struct loop_call c = { .fn = fn, .arg = arg };

	if (loop_in_thread(l)) {
		fn(arg);
		return 0;
	}
	pthread_mutex_lock(&l->call_lock);
	if (!l->accepting) {
		/* Nobody runs this loop: the caller owns its state. */
		pthread_mutex_unlock(&l->call_lock);
		fn(arg);
		return 0;
	}
	c.next = l->calls;
	l->calls = &c;
	pthread_mutex_unlock(&l->call_lock);
	(void)sys_eventfd_signal(l->wake_fd);

	pthread_mutex_lock(&l->call_lock);
	while (!c.done) {
		struct timespec ts;
		uint64_t ops;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += LOOP_WATCHDOG_S;
		if (pthread_cond_timedwait(&l->call_done, &l->call_lock, &ts) != ETIMEDOUT ||
		    c.done || !l->has_thread)
			continue;
		/*
		 * No answer for a while.  A loop thread can be slow to get
		 * here (draining a disk that does not answer); what must not
		 * hold it is a notification fd the frontend made blocking and
		 * filled (sys_eventfd_signal_shared): the same operation under
		 * way at two checks running is that, and is interrupted.
		 */
		ops = atomic_load_explicit(&l->shared_ops, memory_order_relaxed);
		if ((ops & 1) && ops == c.shared_ops_seen) {
			log_err("loop %s: stuck for %d s in a write to a frontend's eventfd "
				"(made blocking and filled by the frontend): interrupting it",
				l->name, LOOP_WATCHDOG_S);
			(void)pthread_kill(l->joiner_tid, LOOP_SIG_POKE);
		}
		c.shared_ops_seen = ops;
	}
	pthread_mutex_unlock(&l->call_lock);
	return 0;
}

static void loop_poke_handler(int sig)
{
	/* Nothing: being delivered is what interrupts the system call. */
}

static void loop_poke_install(void)
{
	struct sigaction sa = { .sa_handler = loop_poke_handler };

	/* No SA_RESTART: a write blocked on an eventfd returns EINTR. */
	sigemptyset(&sa.sa_mask);
	(void)sigaction(LOOP_SIG_POKE, &sa, NULL);
}

static void *loop_thread_main(void *opaque)
{
	struct loop *l = opaque;
	sigset_t poke;

	/* The one signal a loop thread takes (the process's others are
	 * blocked in every thread and read from a signalfd by main). */
	sigemptyset(&poke);
	sigaddset(&poke, LOOP_SIG_POKE);
	pthread_sigmask(SIG_UNBLOCK, &poke, NULL);
	log_set_thread_name(l->name);
	loop_run(l);
	defer_release();
	return NULL;
}

int loop_thread_start(struct loop *l)
{
	static pthread_once_t poke_once = PTHREAD_ONCE_INIT;
	int r;

	pthread_once(&poke_once, loop_poke_install);
	l->has_thread = true;
	/* Accept calls from now on, so none issued between here and
	 * loop_run() runs on the wrong thread. */
	pthread_mutex_lock(&l->call_lock);
	l->accepting = true;
	pthread_mutex_unlock(&l->call_lock);
	/* Into a field only the starting thread uses: the new thread sets
	 * l->thread itself, so nobody reads a half-written id. */
	r = pthread_create(&l->joiner_tid, NULL, loop_thread_main, l);
	if (r) {
		l->has_thread = false;
		pthread_mutex_lock(&l->call_lock);
		l->accepting = false;
		pthread_mutex_unlock(&l->call_lock);
		return -r;
	}
	pthread_setname_np(l->joiner_tid, l->name);
	return 0;
}

void loop_thread_join(struct loop *l)
{
	if (!l->has_thread)
		return;
	loop_stop(l);
	pthread_join(l->joiner_tid, NULL);
	l->has_thread = false;
}
