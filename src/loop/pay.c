#include "loop/pay.h"

#include <string.h>

static uint64_t clamp_u64(uint64_t v, uint64_t lo, uint64_t hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* Which mode the current sub-phase runs: ON first in even rounds, OFF
 * first in odd ones, so a drift over the check weighs on both. */
static bool sub_off(const struct pay *p)
{
	return (p->round & 1) != p->second;
}

static void sub_start(struct pay *p, uint64_t now)
{
	p->sub_start = now;
	p->timing = false;
	p->off = sub_off(p);
}

static void run(struct pay *p, uint64_t now, uint64_t len, uint64_t work)
{
	p->phase = PAY_RUN;
	p->probing = false;
	p->off = p->decided_off;
	p->run_until = now + len;
	p->run_work = work;
}

void pay_init(struct pay *p, uint64_t now)
{
	memset(p, 0, sizeof(*p));
	p->run_mult = 1;
	run(p, now, PAY_RUN_MIN_NS, 0);
}

void pay_abort(struct pay *p, uint64_t now)
{
	if (p->phase != PAY_MEASURE)
		return;
	p->aborted++;
	/* run_work that no count equals: the next run's end starts a check
	 * whatever the count then. */
	run(p, now, PAY_RUN_MIN_NS, UINT64_MAX);
}

/* Median of the rounds' OFF/ON ratios, per mille; *off_wins: the rounds
 * in which not spinning was faster. */
static uint32_t median_ratio_pm(const struct pay *p, unsigned *off_wins)
{
	uint32_t r[PAY_ROUNDS];

	*off_wins = 0;

	for (unsigned i = 0; i < PAY_ROUNDS; i++) {
		uint64_t on = p->per_on[i] ? p->per_on[i] : 1;
		uint64_t pm = p->per_off[i] * 1000 / on;

		r[i] = pm > UINT32_MAX ? UINT32_MAX : (uint32_t)pm;
		*off_wins += r[i] < 1000;
	}
	/* Insertion sort: eight values. */
	for (unsigned i = 1; i < PAY_ROUNDS; i++)
		for (unsigned j = i; j > 0 && r[j - 1] > r[j]; j--) {
			uint32_t x = r[j];

			r[j] = r[j - 1];
			r[j - 1] = x;
		}
	return (uint32_t)(((uint64_t)r[(PAY_ROUNDS - 1) / 2] + r[PAY_ROUNDS / 2]) / 2);
}

static void decide(struct pay *p, uint64_t now, uint64_t work)
{
	unsigned off_wins;
	uint32_t pm = median_ratio_pm(p, &off_wins);
	bool off = pm < PAY_MARGIN_PCT * 10 && off_wins >= PAY_MIN_OFF_ROUNDS;

	if (p->checks && off == p->decided_off) {
		if (p->run_mult < PAY_RUN_MULT_MAX)
			p->run_mult *= 2;
	} else {
		p->run_mult = 1;
	}
	p->last_ratio_pm = pm;
	p->decided_off = off;
	p->checks++;
	p->checks_off += off;
	run(p, now, clamp_u64((now - p->check_start) * PAY_RUN_FACTOR, PAY_RUN_MIN_NS,
			      PAY_RUN_MAX_NS) * p->run_mult, work);
}

bool pay_tick(struct pay *p, uint64_t now, uint64_t work)
{
	if (p->phase == PAY_RUN) {
		if (now < p->run_until)
			return p->off;
		/* Nothing done in the whole run, or in the probe at its end:
		 * an idle disk, nothing to measure (and nothing spun: its
		 * windows have gone to 0). */
		if (work == p->run_work) {
			run(p, now, PAY_RUN_MIN_NS, work);
			return p->off;
		}
		if (!p->probing) {
			p->probing = true;
			p->run_until = now + PAY_SUB_MAX_NS;
			p->run_work = work;
			return p->off;
		}
		p->probing = false;
		p->phase = PAY_MEASURE;
		p->check_start = now;
		p->round = 0;
		p->second = false;
		sub_start(p, now);
		p->w0 = work;
		return p->off;
	}
	if (now - p->sub_start > PAY_SUB_MAX_NS) {
		p->aborted++;
		run(p, now, PAY_RUN_MIN_NS, work);
		return p->off;
	}
	if (!p->timing) {
		/* The sub-phase is timed from the first work done in it: the
		 * request that straddles the switch belongs to neither. */
		if (work != p->w0) {
			p->timing = true;
			p->t0 = now;
			p->w0 = work;
		}
		return p->off;
	}
	if (work - p->w0 < PAY_SUB_WORK || now - p->t0 < PAY_SUB_NS)
		return p->off;
	(p->off ? p->per_off : p->per_on)[p->round] = (now - p->t0) / (work - p->w0);
	if (!p->second) {
		p->second = true;
	} else {
		p->second = false;
		if (++p->round == PAY_ROUNDS) {
			decide(p, now, work);
			return p->off;
		}
	}
	sub_start(p, now);
	p->w0 = work;
	return p->off;
}
