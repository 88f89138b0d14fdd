/*
 * The contention rule of the loop (loop.c, loop_check_contention): is our
 * polling paid for by another task's CPU time?  Judged once per sample of
 * LOOP_CONTENTION_PERIOD_NS while polling.  A pure function, so that the
 * rule is tested on its numbers (tests/unit/test_contend.c).
 */
#ifndef VBLK_LOOP_CONTEND_H
#define VBLK_LOOP_CONTEND_H

#include <stdbool.h>
#include <stdint.h>

/* One sample, in ns. */
struct contend_sample {
	uint64_t wall;		/* its length */
	uint64_t runnable;	/* the part we wanted to run: not asleep in epoll */
	uint64_t cpu;		/* our thread's CPU time */
	uint64_t wait;		/* our time on the run queue while another task ran
				 * (sys_sched_wait_ns), if have_wait */
	bool have_wait;
};

/*
 * Contention is time we wanted to run and lost to another task.  Two
 * measures, each blind to something the other sees:
 *
 * - our CPU time, short of the time we wanted by over a quarter: also
 *   short when our own disk's interrupts are taken on our CPU, or a
 *   hypervisor steals it (on a VM whose disk interrupts our CPU, a third of
 *   the time at QD1: docs/architecture.md, "Contention"), and no other
 *   task is involved;
 * - our run-queue wait, over a quarter of the time we wanted: it also
 *   counts the waits after each wake-up from epoll, which fall in the time
 *   we slept, not in the time we wanted; with a task of ours on our CPU
 *   (io_uring's worker in the page cache) and many short sleeps they add
 *   up, though nothing held us while we polled.
 *
 * So where the kernel keeps the wait, both must say it; without it, the CPU
 * time alone.  A sample mostly asleep says nothing.
 */
static inline bool contend_shared(const struct contend_sample *s)
{
	if (s->runnable <= s->wall / 2)
		return false;
	if (s->cpu >= s->runnable / 4 * 3)
		return false;
	return !s->have_wait || s->wait > s->runnable / 4;
}

#endif
