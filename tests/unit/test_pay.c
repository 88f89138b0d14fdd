/* Description: loop/pay.h, the check of whether polling pays end to end:
 * driven by a simulated closed-loop client whose time per request depends
 * on whether the loop spins, it switches polling off when not spinning is
 * faster beyond the margin, keeps it when the gain is within the margin or
 * absent, comes back to polling when the cost goes away, alternates the
 * order of its sub-phases, and decides nothing for an idle disk, a load
 * that stopped or a load too light to time. */
#include <stdint.h>

#include "loop/pay.h"
#include "test.h"

/* A simulated machine: one loop iteration per request, each taking on_ns
 * while spinning is allowed and off_ns while it is off. */
struct sim {
	struct pay p;
	uint64_t now, work;
	uint64_t on_ns, off_ns;
	unsigned ticks_off;	/* iterations run with spinning off */
};

static void sim_init(struct sim *s, uint64_t on_ns, uint64_t off_ns)
{
	*s = (struct sim){ .now = 1000000, .on_ns = on_ns, .off_ns = off_ns };
	pay_init(&s->p, s->now);
}

/* Run the loop for ns of simulated time. */
static void sim_run(struct sim *s, uint64_t ns)
{
	uint64_t end = s->now + ns;

	while (s->now < end) {
		bool off = pay_due(&s->p, s->now) ? pay_tick(&s->p, s->now, s->work) : s->p.off;

		s->ticks_off += off;
		s->now += off ? s->off_ns : s->on_ns;
		s->work++;
	}
}

/* Spinning delays the client by a third (the unpinned QD1 cell of issue
 * 26: 7.7 K against 10.8 K IOPS): the first check switches it off, and the
 * decision holds for the run that follows. */
static void test_off_when_spinning_delays(void)
{
	struct sim s;

	sim_init(&s, 130000, 93000);
	sim_run(&s, 2 * PAY_RUN_MIN_NS);
	ASSERT_EQ(s.p.checks, 1);
	ASSERT_EQ(s.p.checks_off, 1);
	ASSERT_TRUE(s.p.off);
	ASSERT_EQ(s.p.phase, PAY_RUN);
	ASSERT_TRUE(s.p.last_ratio_pm > 700 && s.p.last_ratio_pm < 730);
	/* Most of the time was spent not spinning. */
	ASSERT_TRUE(s.ticks_off > 0);
}

/* Spinning pays (pinned apart: the kick found by a memory read): polling
 * stays on, and only the check's OFF sub-phases ran without it. */
static void test_on_when_spinning_pays(void)
{
	struct sim s;

	sim_init(&s, 80000, 100000);
	sim_run(&s, 2 * PAY_RUN_MIN_NS);
	ASSERT_EQ(s.p.checks, 1);
	ASSERT_EQ(s.p.checks_off, 0);
	ASSERT_TRUE(!s.p.off);
	ASSERT_TRUE(s.p.last_ratio_pm > 1240 && s.p.last_ratio_pm < 1260);
}

/* Not spinning 3 % faster is within the margin: polling wins ties. */
static void test_margin_favours_polling(void)
{
	struct sim s;

	sim_init(&s, 100000, 97000);
	sim_run(&s, 2 * PAY_RUN_MIN_NS);
	ASSERT_EQ(s.p.checks, 1);
	ASSERT_EQ(s.p.checks_off, 0);
	ASSERT_TRUE(!s.p.off);
	/* 6 % faster is beyond it. */
	sim_init(&s, 100000, 94000);
	sim_run(&s, 2 * PAY_RUN_MIN_NS);
	ASSERT_EQ(s.p.checks_off, 1);
}

/* The cost goes away (the client moved to the other CPU): the next check
 * turns polling back on. */
static void test_back_on_when_cost_goes(void)
{
	struct sim s;
	uint64_t checks;

	sim_init(&s, 130000, 93000);
	sim_run(&s, 2 * PAY_RUN_MIN_NS);
	ASSERT_TRUE(s.p.off);
	checks = s.p.checks;
	s.on_ns = 60000;	/* now spinning finds each kick at once */
	sim_run(&s, 3 * PAY_RUN_MAX_NS);
	ASSERT_TRUE(s.p.checks > checks);
	ASSERT_TRUE(!s.p.off);
	ASSERT_TRUE(!s.p.decided_off);
}

/* Sub-phases alternate ON, OFF in even rounds and OFF, ON in odd ones:
 * record the mode of every sub-phase of one check. */
static void test_sub_phase_order(void)
{
	struct sim s;
	bool seen[2 * PAY_ROUNDS];
	unsigned n = 0;
	bool last;

	sim_init(&s, 100000, 100000);
	/* Up to the check. */
	while (s.p.phase == PAY_RUN) {
		if (pay_due(&s.p, s.now))
			pay_tick(&s.p, s.now, s.work);
		s.now += 100000;
		s.work++;
	}
	last = s.p.off;
	seen[n++] = last;
	while (s.p.phase == PAY_MEASURE) {
		unsigned round = s.p.round;
		bool second = s.p.second;

		pay_tick(&s.p, s.now, s.work);
		s.now += 100000;
		s.work++;
		if (s.p.phase == PAY_MEASURE && (s.p.round != round || s.p.second != second)) {
			ASSERT_TRUE(n < 2 * PAY_ROUNDS);
			seen[n++] = s.p.off;
		}
	}
	ASSERT_EQ(n, 2 * PAY_ROUNDS);
	for (unsigned i = 0; i < 2 * PAY_ROUNDS; i++)
		ASSERT_EQ(seen[i], (i / 2) % 2 == 0 ? i % 2 == 1 : i % 2 == 0);
}

/* An idle disk: no work in a run, no check (nothing spun, nothing to
 * weigh), however long it lasts. */
static void test_idle_no_check(void)
{
	struct sim s;

	sim_init(&s, 100000, 50000);
	for (unsigned i = 0; i < 1000; i++) {
		s.now += 10000000;	/* 10 s of nothing */
		if (pay_due(&s.p, s.now))
			ASSERT_TRUE(!pay_tick(&s.p, s.now, s.work));
	}
	ASSERT_EQ(s.p.checks, 0);
	ASSERT_EQ(s.p.aborted, 0);
	ASSERT_EQ(s.p.phase, PAY_RUN);
}

/* A load too light to time (a request every 60 ms): the check ends
 * without a decision, polling stays as it was. */
static void test_light_load_aborts(void)
{
	struct sim s;

	sim_init(&s, 60000000, 60000000);
	sim_run(&s, 4 * PAY_RUN_MIN_NS);
	ASSERT_EQ(s.p.checks, 0);
	ASSERT_TRUE(s.p.aborted > 0);
	ASSERT_TRUE(!s.p.off);
}

/* pay_abort (contention, a ring restarted) in the middle of a check keeps
 * the last decision and tries again later. */
static void test_abort_keeps_decision(void)
{
	struct sim s;

	sim_init(&s, 130000, 93000);
	sim_run(&s, 2 * PAY_RUN_MIN_NS);
	ASSERT_TRUE(s.p.decided_off);
	/* Into the next check's first sub-phase (ON first in round 0). */
	while (s.p.phase == PAY_RUN)
		sim_run(&s, 1000000);
	ASSERT_TRUE(!s.p.off);
	pay_abort(&s.p, s.now);
	ASSERT_EQ(s.p.aborted, 1);
	ASSERT_EQ(s.p.phase, PAY_RUN);
	ASSERT_TRUE(s.p.off);
	ASSERT_EQ(s.p.run_until, s.now + PAY_RUN_MIN_NS);
	/* Outside a check it does nothing. */
	pay_abort(&s.p, s.now);
	ASSERT_EQ(s.p.aborted, 1);
}

/* The decision runs PAY_RUN_FACTOR times as long as its check took,
 * within [PAY_RUN_MIN_NS, PAY_RUN_MAX_NS]. */
static void test_run_length(void)
{
	static const uint64_t per[] = { 100000, 500000, 2000000 };

	for (unsigned i = 0; i < 3; i++) {
		struct sim s;
		uint64_t took, want;

		sim_init(&s, per[i], per[i]);
		while (s.p.phase == PAY_RUN)
			sim_run(&s, 1);
		while (s.p.phase == PAY_MEASURE)
			sim_run(&s, 1);
		ASSERT_EQ(s.p.checks, 1);
		/* sim_run stepped once past the tick that decided. */
		took = s.now - per[i] - s.p.check_start;
		ASSERT_TRUE(took >= 2 * PAY_ROUNDS * PAY_SUB_NS);
		want = took * PAY_RUN_FACTOR;
		want = want < PAY_RUN_MIN_NS ? PAY_RUN_MIN_NS :
		       want > PAY_RUN_MAX_NS ? PAY_RUN_MAX_NS : want;
		ASSERT_EQ(s.p.run_until - (s.now - per[i]), want);
	}
}

/* A case that does not change (polling twice as fast) is checked less and
 * less often, up to PAY_RUN_MULT_MAX times the run; a decision that flips
 * starts again at one run. */
static void test_same_case_checked_less(void)
{
	struct sim s;
	unsigned mult[6];

	sim_init(&s, 50000, 100000);
	for (unsigned i = 0; i < 6; i++) {
		uint64_t checks = s.p.checks;

		while (s.p.checks == checks)
			sim_run(&s, 1);
		mult[i] = s.p.run_mult;
	}
	ASSERT_EQ(mult[0], 1);
	ASSERT_EQ(mult[1], 2);
	ASSERT_EQ(mult[2], 4);
	ASSERT_EQ(mult[3], PAY_RUN_MULT_MAX);
	ASSERT_EQ(mult[5], PAY_RUN_MULT_MAX);
	ASSERT_TRUE(s.p.run_until - s.now >= PAY_RUN_MULT_MAX * PAY_RUN_MIN_NS - 100000);
	/* Now spinning costs a lot: the next check switches it off, back at
	 * one run. */
	s.on_ns = 400000;
	while (!s.p.decided_off)
		sim_run(&s, 1);
	ASSERT_EQ(s.p.run_mult, 1);
	/* A close case that repeats (ON 3 % slower: polling stays, each time)
	 * is checked less often too: each check costs little, but a TCG
	 * guest's QD1 jobs, always this case, were checked every 2 s. */
	sim_init(&s, 100000, 97000);
	for (unsigned i = 0; i < 4; i++) {
		uint64_t checks = s.p.checks;

		while (s.p.checks == checks)
			sim_run(&s, 1);
		ASSERT_TRUE(!s.p.decided_off);
		ASSERT_EQ(s.p.run_mult, (1u << i) < PAY_RUN_MULT_MAX ? 1u << i : PAY_RUN_MULT_MAX);
	}
	/* ...and back at one run as soon as the decision flips, whichever
	 * way: a client our spinning now starves (OFF twice as fast). */
	s.on_ns = 200000;
	s.off_ns = 100000;
	while (!s.p.decided_off)
		sim_run(&s, 1);
	ASSERT_EQ(s.p.run_mult, 1);
}

/* A load that stops during a run (work in the run, none since): no check
 * starts, none is aborted; when work comes back, checks do too. */
static void test_stopped_load_not_checked(void)
{
	struct sim s;

	sim_init(&s, 100000, 100000);
	sim_run(&s, PAY_RUN_MIN_NS / 2);	/* work in the first run... */
	for (unsigned i = 0; i < 100; i++) {	/* ...then 10 s of nothing */
		s.now += 100000000;
		if (pay_due(&s.p, s.now))
			ASSERT_TRUE(!pay_tick(&s.p, s.now, s.work));
	}
	ASSERT_EQ(s.p.checks, 0);
	ASSERT_EQ(s.p.aborted, 0);
	ASSERT_EQ(s.p.phase, PAY_RUN);
	sim_run(&s, 2 * PAY_RUN_MIN_NS);
	ASSERT_EQ(s.p.checks, 1);
}

/* Run p to its next decision, each request taking on_ns[round] with
 * spinning and off_ns[round] without while a check runs (100 us outside). */
static void run_check(struct pay *p, uint64_t *now, uint64_t *work,
		      const uint64_t on_ns[PAY_ROUNDS], const uint64_t off_ns[PAY_ROUNDS])
{
	uint64_t checks = p->checks;

	while (p->checks == checks) {
		bool m = p->phase == PAY_MEASURE;

		*now += !m ? 100000 : p->off ? off_ns[p->round] : on_ns[p->round];
		(*work)++;
		if (pay_due(p, *now))
			pay_tick(p, *now, *work);
	}
}

/* Not spinning twice as fast in six rounds of eight, twice as slow in the
 * other two: off.  Twice as fast in five, a little slower in three: the
 * median says off (0.5), but five rounds are not six: polling stays.  (The
 * simulator above has every round agree; these are driven by hand.) */
static void test_off_needs_most_rounds(void)
{
	static const uint64_t on6[PAY_ROUNDS] = { 200000, 200000, 200000, 200000,
						  100000, 100000, 200000, 200000 };
	static const uint64_t off6[PAY_ROUNDS] = { 100000, 100000, 100000, 100000,
						   200000, 200000, 100000, 100000 };
	static const uint64_t on5[PAY_ROUNDS] = { 200000, 200000, 200000, 200000, 200000,
						  100000, 100000, 100000 };
	static const uint64_t off5[PAY_ROUNDS] = { 100000, 100000, 100000, 100000, 100000,
						   101000, 101000, 101000 };
	uint64_t now = 1000000, work = 0;
	struct pay p;

	pay_init(&p, now);
	run_check(&p, &now, &work, on6, off6);
	ASSERT_TRUE(p.decided_off);
	pay_init(&p, now);
	run_check(&p, &now, &work, on5, off5);
	ASSERT_TRUE(p.last_ratio_pm < PAY_MARGIN_PCT * 10);
	ASSERT_TRUE(!p.decided_off);
}

int main(void)
{
	test_off_when_spinning_delays();
	test_on_when_spinning_pays();
	test_margin_favours_polling();
	test_back_on_when_cost_goes();
	test_sub_phase_order();
	test_idle_no_check();
	test_stopped_load_not_checked();
	test_light_load_aborts();
	test_abort_keeps_decision();
	test_run_length();
	test_same_case_checked_less();
	test_off_needs_most_rounds();
	return T_EXIT_PASS;
}
