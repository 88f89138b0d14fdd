/*
 * The contention rule of the loop (loop.c, loop_check_contention): is our
 * polling paid for by another task's CPU time?  Judged once per sample of
 * LOOP_CONTENTION_PERIOD_NS while polling.  A pure function, so that the
 * rule is tested on its numbers (tests/unit/test_loop.c).
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
 * Where the kernel keeps it, the run-queue wait says it: over a quarter of
 * the time we wanted spent waiting for another task.  Our CPU time is not
 * the measure then: the interrupts of our own disk, taken on our CPU, and a
 * hypervisor's steal are missing from it too, and on a VM whose disk
 * interrupts our CPU they are a third of it at QD1 (docs/architecture.md,
 * "Contention").  Without that file, the CPU time: under three quarters of
 * the time we wanted.  A sample mostly asleep says nothing.
 */
static inline bool contend_shared(const struct contend_sample *s)
{
	if (s->runnable <= s->wall / 2)
		return false;
	if (s->have_wait)
		return s->wait > s->runnable / 4;
	return s->cpu < s->runnable / 4 * 3;
}

#endif
