/*
 * pay_: does polling pay, end to end?  An A/B check a loop runs on its own
 * work (docs/architecture.md "Polling", "Does polling pay?").
 *
 * Every other polling rule judges one window by what that window saw (a
 * hit, a miss, a window polled in vain, the CPU stolen).  None of them sees
 * what the spinning costs *others*: a client woken onto the CPU we spin on
 * waits for our window to end; a virtual disk emulated by the host's
 * threads is slower while our vCPU does not halt.  Both make the very event
 * we wait for come later, and both depend on placement, which nothing
 * tells us.  So we measure what the user gets: the wall time per unit of
 * work (requests taken from the rings), with polling as the other rules
 * run it against no spinning at all, in alternating short sub-phases
 * (ON, OFF; then OFF, ON; ... PAY_ROUNDS rounds: slow drifts of the
 * machine fall on both sides), and run the winner for a while before
 * checking again.  Polling wins ties: it must be at least PAY_MARGIN_PCT
 * slower, in the median of the rounds' paired ratios, and slower in
 * PAY_MIN_OFF_ROUNDS of them, to be switched off.
 *
 * With a client that waits for each answer (a closed loop, which any
 * queue-depth-limited guest is) time per request is what it gets; with a
 * client that sends at its own pace both sides measure the same and
 * polling stays.  A check starts only when work came in the run and in a
 * short probe at its end (a disk that went idle during the run is not
 * checked); a sub-phase that takes too long (the disk went idle since)
 * ends the check without a decision.
 *
 * Pure logic: no clock, no threads; the loop feeds it time and its
 * cumulative work count (tests/unit/test_pay.c drives it by hand).  One
 * per loop, loop thread only.
 */
#ifndef VBLK_PAY_H
#define VBLK_PAY_H

#include <stdbool.h>
#include <stdint.h>

/* Rounds of a check (each an ON and an OFF sub-phase). */
#define PAY_ROUNDS 8
/* A sub-phase lasts until it has seen this much work and this long... */
#define PAY_SUB_WORK 16u
#define PAY_SUB_NS 2000000ull
/* ...but no longer than this: a disk this slow or this idle has nothing to
 * decide by (and its windows shrink on their own, "Polling"). */
#define PAY_SUB_MAX_NS 50000000ull
/* The winner runs this many times as long as the check took, within
 * [PAY_RUN_MIN_NS, PAY_RUN_MAX_NS]: a few per cent of the time is spent
 * checking, half of that in the losing mode (and less once the decision
 * repeats: PAY_RUN_MULT_MAX). */
#define PAY_RUN_FACTOR 16u
#define PAY_RUN_MIN_NS 250000000ull
#define PAY_RUN_MAX_NS 2000000000ull
/* A decision the same as the last one doubles the next run, up to
 * PAY_RUN_MULT_MAX times: a case that does not change is checked less
 * often (each check spends some time in the losing mode, and its OFF
 * sub-phases leave the windows to learn again); a decision that flips
 * starts again at once. */
#define PAY_RUN_MULT_MAX 4u
/* Polling off must be this much faster (per cent of polling's time per
 * unit of work) to win: polling is what pays on most machines. */
#define PAY_MARGIN_PCT 95u
/* ...and faster in this many of the PAY_ROUNDS rounds: a slow, bursty
 * client (a guest under TCG, 2,000 requests a second in batches) moves a
 * median of eight by chance now and then; a client our spinning starves
 * loses in every round. */
#define PAY_MIN_OFF_ROUNDS 6u

enum pay_phase {
	PAY_RUN,		/* running the last decision until run_until */
	PAY_MEASURE,		/* alternating sub-phases */
};

struct pay {
	enum pay_phase phase;
	bool off;		/* spinning off now (a sub-phase or the decision) */
	bool decided_off;	/* the last check's decision */
	uint64_t run_until;	/* PAY_RUN: check again from here */
	uint64_t run_work;	/* work count when the run began (idle test) */
	bool probing;		/* the run's last PAY_SUB_MAX_NS: work must come
				 * in it too for a check to start */
	unsigned run_mult;	/* 1 .. PAY_RUN_MULT_MAX */
	/* PAY_MEASURE */
	uint64_t check_start;	/* when the check began */
	unsigned round;		/* 0 .. PAY_ROUNDS - 1 */
	bool second;		/* in the round's second sub-phase */
	uint64_t sub_start;	/* when the sub-phase began */
	bool timing;		/* t0/w0 hold the sub-phase's first work */
	uint64_t t0, w0;
	uint64_t per_on[PAY_ROUNDS], per_off[PAY_ROUNDS];	/* ns per unit */
	/* Counters (loop thread writes; the loop mirrors them for readers). */
	uint64_t checks;	/* checks that came to a decision */
	uint64_t checks_off;	/* of which: polling off */
	uint64_t aborted;	/* checks ended without one */
	uint32_t last_ratio_pm;	/* last decision's median OFF/ON, per mille */
};

/* Start in PAY_RUN with polling on, the first check due at now +
 * PAY_RUN_MIN_NS.  Loop thread. */
void pay_init(struct pay *p, uint64_t now);

/* Does the loop have to feed pay_tick at now?  (Reading the work count
 * walks the loop's handlers; while a decision runs, only its end is
 * watched.) */
static inline bool pay_due(const struct pay *p, uint64_t now)
{
	return p->phase == PAY_MEASURE || now >= p->run_until;
}

/*
 * Advance the check: now, and the cumulative work count (never going
 * back while a check runs; pay_abort when it may have).  Call at each loop
 * iteration for which pay_due() is true.  Returns whether spinning is off
 * (also in p->off).  Loop thread.
 */
bool pay_tick(struct pay *p, uint64_t now, uint64_t work);

/* The check in progress cannot be trusted (polling backed off for
 * contention, a ring stopped or started): drop it, keep the last decision,
 * try again after PAY_RUN_MIN_NS.  Nothing to do outside a check. */
void pay_abort(struct pay *p, uint64_t now);

#endif
