/*
 * loop_: the per-thread event loop.  One loop per thread that runs it
 * (the main thread and each iothread).  An iteration is a visible list of
 * phases (see loop_run):
 *
 *   1. timers: run the expired ones
 *   2. poll or sleep, decided in one place (loop_poll_or_sleep):
 *      busy-poll the poll handlers for up to the adaptive window, with
 *      their notifications off; if nothing turned up, turn notifications
 *      back on, re-check, and only then block
 *   3. epoll_wait (0 if polling made progress or bottom halves wait)
 *   4. dispatch ready fd handlers        -- one defer section
 *   5. run scheduled bottom halves      -- same section
 *   6. defer_end(): deferred calls (one call-eventfd write per queue)
 *
 * Adaptive polling is per handler (each poll handler has its own poll_ns;
 * the loop polls for the largest): a busy queue keeps polling while an
 * idle queue on the same thread drops out and costs nothing.  See
 * docs/architecture.md "Polling".
 *
 * Threading: everything here is loop-thread-only except loop_stop(),
 * loop_call_sync(), loop_in_thread(), loop_set_poll_params() and the
 * stats readers, which any thread may call.
 */
#ifndef VBLK_LOOP_H
#define VBLK_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

struct loop;
struct loop_fd;
struct loop_bh;
struct loop_timer;

typedef void (*loop_fd_cb)(void *opaque, uint32_t events);
typedef void (*loop_cb)(void *opaque);

/* Create a loop.  Returns 0 and *out, or -errno.  Any thread. */
int loop_new(const char *name, struct loop **out);
/* Destroy a loop that is not running and has no fd handlers left. */
void loop_free(struct loop *l);

/*
 * Watch fd for events (EPOLLIN, ...).  cb runs on the loop thread.
 * Returns 0 and *out (may be NULL if not wanted), or -errno.
 */
int loop_fd_add(struct loop *l, int fd, uint32_t events, loop_fd_cb cb,
		void *opaque, struct loop_fd **out);
/* Change the events watched for h (e.g. EPOLLOUT only while a network
 * client has something to send).  Returns 0 or -errno.  Loop thread. */
int loop_fd_mod(struct loop *l, struct loop_fd *h, uint32_t events);
/*
 * Stop watching.  Safe inside any callback of this loop: an event already
 * fetched for this handler in the current iteration is dropped, never
 * delivered to a stale opaque.  Does not close the fd.
 */
void loop_fd_del(struct loop *l, struct loop_fd *h);

/*
 * Poll handler of an fd handler: lets the loop find the fd's work by
 * busy-polling memory instead of waiting for the fd.
 *   poll(): is there work?  Cheap, no syscalls, no side effects (but
 *           see busy(); and a socket, which has no memory to look at,
 *           is polled by receiving from it: one syscall a pass, what
 *           came kept for run(), never while the handler is quiet():
 *           nbd/conn.c).
 *   run():  do the work (notifications stay off while polling).
 *   begin(): polling starts: ask the other side not to notify.
 *   end():  polling stops: ask for notifications again, with a full
 *           barrier, and return true if work arrived meanwhile (the loop
 *           then calls run() instead of sleeping, so nothing is lost).
 * Every fd on the data path needs one: while the loop polls it does not
 * look at fds, so an event of a handler without one waits until the
 * polling window ends (up to poll-max-ns of added latency).
 */
struct loop_poll_ops {
	bool (*poll)(void *opaque);
	void (*run)(void *opaque);
	void (*begin)(void *opaque);
	bool (*end)(void *opaque);
	/* Optional, for a backend's completions: true while an event is
	 * expected (I/O in flight).  A handler with armed() is polled only
	 * while armed, with its own cap (completion_max_ns): a request in
	 * flight is worth waiting for as long as the device takes, an idle
	 * backend not at all. */
	bool (*armed)(void *opaque);
	/* Optional: true while an event is expected that a thread sharing
	 * our CPUs has to make (io_uring's worker, for page-cache I/O), or
	 * one that our spinning was measured to delay (a virtual disk whose
	 * host threads need the CPU our vCPU holds).  The loop then spins
	 * for nothing, not even a timer: every cycle spun is taken from
	 * that thread.  It sleeps, and counts it (yields). */
	bool (*cpu_bound)(void *opaque);
	/* Optional: true while an event is expected that nothing will
	 * signal (io_uring's polled I/O, IORING_SETUP_IOPOLL: the device
	 * raises no interrupt, a completion is found only by asking the
	 * kernel to look).  The loop then never sleeps: it polls in short
	 * passes, with an epoll_wait that does not block between them, until
	 * busy() is false; poll() may make a syscall while it is true. */
	bool (*busy)(void *opaque);
	/* Optional: true while no event can come however long the loop
	 * polls (a queue that waits for its QoS timer takes no request):
	 * the handler's window is not opened. */
	bool (*quiet)(void *opaque);
	/* Optional: the work the handler has done so far, a count that only
	 * grows (a queue's requests taken from its ring).  What the pay check
	 * weighs polling by (pay.h: wall time per unit of work, with and
	 * without spinning); a loop with no handler that has it never
	 * switches polling off by that check. */
	uint64_t (*work)(void *opaque);
};
void loop_fd_set_poll(struct loop_fd *h, const struct loop_poll_ops *ops);
/* Is the loop's thread allowed a single CPU?  The threads it starts, and
 * io_uring's workers, take its affinity: they then share its core (what
 * a cpu_bound() decides by).  Re-read at most once a second.  Loop thread. */
bool loop_cpu_alone(struct loop *l);

/* Per poll handler counters, readable from any thread (relaxed). */
struct loop_poll_stats {
	uint64_t hits;		/* polling found work */
	uint64_t misses;	/* work came by the fd after the loop blocked */
	uint64_t vain;		/* its window found nothing, and what came next
				 * came later than any window would reach */
	uint64_t poll_ns;	/* current window */
};
void loop_fd_poll_stats(const struct loop_fd *h, struct loop_poll_stats *out);
/* The sum of hits, misses and vain of the handlers with armed() (a
 * backend's completions; a hit is theirs in any window, not only in one
 * spun for them); poll_ns: the longest current window.  Loop thread (the
 * handler list is its own). */
void loop_completion_poll_stats(struct loop *l, struct loop_poll_stats *out);

/* Polling knobs; any thread, take effect at the next window. */
struct loop_poll_params {
	uint64_t max_ns;	/* cap; 0 disables polling */
	unsigned grow;		/* window multiplier on a near miss (>= 2) */
	unsigned shrink;	/* divisor when blocking exceeds the cap; 0 resets */
	/* Cap of handlers with armed() (backend completions); 0: max_ns. */
	uint64_t completion_max_ns;
	/* No pay check (pay.h): polling as the windows say, whatever it
	 * costs the client or the disk (ablation, --no-poll-check). */
	bool no_check;
};
void loop_set_poll_params(struct loop *l, const struct loop_poll_params *p);
void loop_get_poll_params(struct loop *l, struct loop_poll_params *p);

/* Per loop counters, readable from any thread (relaxed). */
struct loop_stats {
	uint64_t busy_ns;	/* wall time not blocked in epoll_wait */
	uint64_t cpu_ns;	/* the thread's CPU time */
	uint64_t poll_ns_total;	/* wall time spent busy-polling */
	uint64_t contended;	/* polling backed off: another task held our CPU
				 * (contend.h), or events came only once we slept */
	uint64_t completion_windows; /* windows whose length was an armed
				      * handler's: spun for the disk */
	uint64_t yields;	/* sleeps without a window: cpu_bound() */
	/* The pay check (pay.h): */
	uint64_t pay_checks;	/* checks that came to a decision */
	uint64_t pay_checks_off; /* of which: no spinning pays better */
	uint64_t pay_aborted;	/* checks ended without one (idle, contention) */
	uint64_t pay_off;	/* 1 while the last decision has spinning off */
	uint64_t pay_ratio_pm;	/* the last decision's median time per unit of
				 * work without spinning / with, per mille */
	uint64_t moderated;	/* sleeps a handler asked for (loop_moderate) */
};
void loop_get_stats(struct loop *l, struct loop_stats *out);

/* Bottom halves: callbacks scheduled to run once at the end of the
 * current iteration (phase 5). */
int loop_bh_new(struct loop *l, loop_cb cb, void *opaque, struct loop_bh **out);
void loop_bh_schedule(struct loop_bh *bh);
void loop_bh_free(struct loop_bh *bh);

/* One-shot timers on CLOCK_MONOTONIC (phase 1). */
int loop_timer_new(struct loop *l, loop_cb cb, void *opaque, struct loop_timer **out);
/* (Re)arm to fire at deadline_ns (sys_now_ns() clock). */
void loop_timer_mod(struct loop_timer *t, uint64_t deadline_ns);
void loop_timer_del(struct loop_timer *t);
void loop_timer_free(struct loop_timer *t);

/* Run iterations until loop_stop().  Returns 0 or -errno.  Loop thread. */
int loop_run(struct loop *l);
/* Make loop_run() return after the current iteration.  Any thread. */
void loop_stop(struct loop *l);

/*
 * Run fn(arg) on the loop's thread and wait for it to return.  This is how
 * the control plane (vhost-user messages, main thread) hands state changes
 * to the iothread that owns the state: never raced, always serialized with
 * the data path.  Called on the loop thread itself, runs fn directly.
 * A watchdog: a loop thread (loop_thread_start) found twice running, a
 * second apart, in the same write to an eventfd a frontend shares with us
 * (sys_eventfd_signal_shared: the frontend cleared O_NONBLOCK and filled
 * the counter) is interrupted (a signal, SIGRTMIN, which loop threads take
 * with an empty handler): the write returns -EINTR and the call gets run.
 * Returns 0.
 */
int loop_call_sync(struct loop *l, loop_cb fn, void *arg);

/* What the inline helpers here read of a loop: the first member of
 * struct loop (loop.c checks it); the rest is loop.c's. */
struct loop_pub {
	uint64_t now_ns;	/* loop_now; written by the loop thread */
};

/* When the current iteration woke up (sys_now_ns() clock), moved on by
 * each polling pass that finds work: a time stamp for events of this
 * iteration without a clock read each.  Inline: the data path stamps
 * every request with it (I/O accounting).  Loop thread. */
static inline uint64_t loop_now(const struct loop *l)
{
	return ((const struct loop_pub *)(const void *)l)->now_ns;
}

/* True if polling is on now: not off by the knobs, by a contention
 * back-off or by the pay check.  A measurement that compares spinning with
 * not spinning (io_uring's, uring.c) keeps its spinning samples to these
 * times.  Loop thread. */
bool loop_polling(const struct loop *l);

/* True if the loop may spin for a short timer now (polling is on and not
 * backed off for contention): only then is a timer of a few microseconds
 * kept to the microsecond (loop.c, LOOP_SPIN_TIMER_NS).  Loop thread. */
bool loop_can_spin(struct loop *l);

/*
 * Moderation: a handler that would rather take its next events in a batch
 * than one wake-up each (an NBD connection whose client pipelines:
 * nbd/conn.c) asks the loop to look for new events no sooner than ns from
 * the end of this iteration.  The loop then sleeps that long (less if a
 * timer or bottom half is due sooner), without its polling window, before
 * it waits for events as usual: what came meanwhile is one batch.  Every
 * fd of the loop waits as long, by at most ns.  The largest request of an
 * iteration holds; it lasts one iteration.  Loop thread.
 */
void loop_moderate(struct loop *l, uint64_t ns);

/* True when called on the thread currently running l. */
bool loop_in_thread(struct loop *l);

/* Start a pthread that names itself after the loop and runs loop_run(l).
 * Returns 0 or -errno.  loop_thread_join() stops it and waits. */
int loop_thread_start(struct loop *l);
void loop_thread_join(struct loop *l);

#endif
