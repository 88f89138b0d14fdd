/*
 * Description: interrupt moderation's policy (blk/irq.h) alone, driven by
 * a simulated driver and disk on a made-up clock, no thread, timer or
 * ring: never a hold at QD1, every hold within the cap (a busy hold within
 * a tenth of it) and none when completions are further apart than half
 * the cap, a short hold only when the loop can spin, stream holds that go
 * on with nothing in flight, the back-off of wasted stream holds (10 ms
 * doubling to 1 s, reset by a productive one), the end of a hold (at its
 * deadline, when the last request of a busy hold completes) and what it
 * amounted to, the disk's pace measured over busy gaps only, a long
 * pause counted as one gap of at most 1 ms.
 */
#include <stdbool.h>
#include <stdint.h>

#include "test.h"

#include "blk/irq.h"

#define US 1000ull
#define MS 1000000ull
#define CAP (500 * US)			/* the default cap */

/* The queue as blk.c drives the policy: requests taken, in flight, and
 * one clock for both the loop's time and the timer's. */
struct sim {
	struct blk_irq m;
	uint64_t now;
	unsigned inflight;
	uint64_t requests;
};

static unsigned spin_asked;

static bool spin_yes(struct loop *l)
{
	(void)l;
	spin_asked++;
	return true;
}

static bool spin_no(struct loop *l)
{
	(void)l;
	spin_asked++;
	return false;
}

static void sim_start(struct sim *s, uint64_t cap)
{
	*s = (struct sim){ .now = 1000 * MS };
	s->m.max_ns = cap;
	blk_irq_start(&s->m, s->now);
}

/* The driver's request taken from the ring (blk_handle). */
static void take(struct sim *s)
{
	s->requests++;
	if (++s->inflight > 1)
		blk_irq_note_overlap(&s->m, s->now);
}

/* One completes (blk_req_complete). */
static void complete(struct sim *s)
{
	ASSERT_TRUE(s->inflight > 0);
	s->inflight--;
	s->m.done++;
	blk_irq_note_completion(&s->m, s->now, s->inflight);
}

static bool want(struct sim *s, bool (*spin)(struct loop *), struct blk_irq_hold *h)
{
	return blk_irq_want(&s->m, s->now, s->inflight, spin, NULL, h);
}

/* A driver keeping qd requests in flight, a completion every gap ns,
 * each refilled at once: n completions. */
static void steady(struct sim *s, unsigned qd, uint64_t gap, unsigned n)
{
	while (s->inflight < qd)
		take(s);
	for (unsigned i = 0; i < n; i++) {
		s->now += gap;
		complete(s);
		take(s);
	}
}

/* Hold as h says now; the deadline must be h->ns away. */
static void hold(struct sim *s, const struct blk_irq_hold *h)
{
	bool idle = blk_irq_hold(&s->m, h, s->now, s->requests, s->inflight);

	ASSERT_TRUE(s->m.held);
	ASSERT_EQ(idle, s->inflight == 0);
	ASSERT_EQ(s->m.held_until - s->m.held_since, h->ns);
}

static struct blk_irq_ended end(struct sim *s)
{
	struct blk_irq_ended e;

	blk_irq_end(&s->m, s->now, s->now, s->requests, &e);
	ASSERT_TRUE(!s->m.held);
	return e;
}

/* A driver that sends one request at a time never gets a hold, however
 * fast the disk; nor does one back at QD1 after a burst once its last
 * overlap is BLK_IRQ_OVERLAP_NS old (the burst's fast gaps still in the
 * EWMAs). */
static void test_never_at_qd1(void)
{
	struct blk_irq_hold h;
	struct sim s;

	sim_start(&s, CAP);
	for (unsigned i = 0; i < 1000; i++) {
		take(&s);
		s.now += 5 * US;
		complete(&s);
		ASSERT_TRUE(!want(&s, spin_yes, &h));
		s.now += 5 * US;
	}
	/* A burst at QD4, 10 us apart: the disk's gaps are fast now. */
	steady(&s, 4, 10 * US, 200);
	ASSERT_TRUE(s.m.gap_ns < 20 * US);
	while (s.inflight)
		complete(&s);
	s.now += BLK_IRQ_OVERLAP_NS + 1;
	for (unsigned i = 0; i < 100; i++) {
		take(&s);
		s.now += 5 * US;
		complete(&s);
		ASSERT_TRUE(!want(&s, spin_yes, &h));
	}
}

/* A stream hold is about eight gaps, never more than the cap; a busy hold
 * about four of the disk's gaps, never more than a tenth of it; and
 * completions further apart than half the cap get none. */
static void test_hold_within_cap(void)
{
	static const uint64_t gaps[] = { 1 * US, 10 * US, 40 * US, 62 * US, 100 * US, 240 * US };
	struct blk_irq_hold h;
	struct sim s;

	for (size_t i = 0; i < ARRAY_SIZE(gaps); i++) {
		sim_start(&s, CAP);
		steady(&s, 8, gaps[i], 300);
		complete(&s);
		ASSERT_TRUE(want(&s, spin_yes, &h));
		ASSERT_TRUE(h.stream);
		ASSERT_TRUE(h.ns <= CAP);
		if (8 * s.m.pace_ns >= CAP)
			ASSERT_EQ(h.ns, CAP);
		else
			ASSERT_EQ(h.ns, 8 * s.m.pace_ns);
		hold(&s, &h);
		ASSERT_TRUE(s.m.held_until - s.m.held_since <= CAP);
	}
	/* Further apart than half the cap: nothing to share a call with. */
	sim_start(&s, CAP);
	steady(&s, 8, 300 * US, 300);
	complete(&s);
	ASSERT_TRUE(s.m.pace_ns > CAP / 2);
	ASSERT_TRUE(!want(&s, spin_yes, &h));

	/* Busy holds: stream holds backed off (one wasted), the disk's gaps
	 * 20 us: four of them (80 us) is over a tenth of the cap. */
	sim_start(&s, CAP);
	steady(&s, 8, 20 * US, 300);
	complete(&s);
	ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
	hold(&s, &h);
	s.now = s.m.held_until;
	ASSERT_TRUE(end(&s).wasted);
	ASSERT_TRUE(want(&s, spin_yes, &h));
	ASSERT_TRUE(!h.stream);
	ASSERT_EQ(h.ns, CAP / BLK_IRQ_BUSY_DIV);
	/* 5 us gaps: four of them, under the limit. */
	steady(&s, 8, 5 * US, 300);
	complete(&s);
	ASSERT_TRUE(want(&s, spin_yes, &h) && !h.stream);
	ASSERT_EQ(h.ns, 4 * s.m.gap_ns);
	ASSERT_TRUE(h.ns < CAP / BLK_IRQ_BUSY_DIV);
	/* The disk's gaps over half the busy limit: no busy hold (still
	 * within the 10 ms back-off). */
	steady(&s, 8, 30 * US, 100);
	complete(&s);
	ASSERT_TRUE(!want(&s, spin_yes, &h));
	/* Moderation off (a cap of 0): never. */
	sim_start(&s, 0);
	steady(&s, 8, 1 * US, 300);
	complete(&s);
	ASSERT_TRUE(!want(&s, spin_yes, &h));
}

/* A hold under BLK_IRQ_SLEEP_NS is taken only if the loop can spin for
 * its timer; a longer one is taken without asking. */
static void test_short_hold_needs_spin(void)
{
	struct blk_irq_hold h;
	struct sim s;

	sim_start(&s, CAP);
	steady(&s, 8, 5 * US, 300);	/* 8 gaps of ~5 us: ~40 us */
	complete(&s);
	spin_asked = 0;
	ASSERT_TRUE(!want(&s, spin_no, &h));
	ASSERT_EQ(spin_asked, 1);
	ASSERT_TRUE(want(&s, spin_yes, &h));
	ASSERT_TRUE(h.ns < BLK_IRQ_SLEEP_NS);

	sim_start(&s, CAP);
	steady(&s, 8, 40 * US, 300);	/* ~320 us */
	complete(&s);
	spin_asked = 0;
	ASSERT_TRUE(want(&s, spin_no, &h));
	ASSERT_TRUE(h.ns >= BLK_IRQ_SLEEP_NS);
	ASSERT_EQ(spin_asked, 0);
}

/* A stream hold lasts its time with nothing in flight (held_idle), for
 * requests the driver has yet to send; one the driver sends in is
 * productive.  One that ran dry after it began goes idle once. */
static void test_stream_hold_goes_on_idle(void)
{
	struct blk_irq_hold h;
	struct blk_irq_ended e;
	struct sim s;

	/* A slow driver: two in flight, 50 us apart; both complete. */
	sim_start(&s, CAP);
	steady(&s, 2, 50 * US, 300);
	s.now += 50 * US;
	complete(&s);
	s.now += 50 * US;
	complete(&s);
	ASSERT_EQ(s.inflight, 0);
	ASSERT_TRUE(want(&s, spin_yes, &h));
	ASSERT_TRUE(h.stream);
	hold(&s, &h);
	ASSERT_TRUE(s.m.held_idle);
	/* Sections end with nothing in flight: it stays held. */
	s.now += 10 * US;
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_KEEP);
	/* The driver sends one; it completes and joins the call. */
	s.now += 10 * US;
	take(&s);
	s.now += 50 * US;
	complete(&s);
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_KEEP);
	s.now = s.m.held_until;
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_SEND);
	e = end(&s);
	ASSERT_TRUE(!e.wasted);
	ASSERT_EQ(e.joined, 1);
	ASSERT_EQ(e.held_ns, h.ns);

	/* Held with one still in flight, which completes: went idle, once. */
	steady(&s, 2, 50 * US, 300);
	complete(&s);
	ASSERT_EQ(s.inflight, 1);
	ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
	hold(&s, &h);
	ASSERT_TRUE(!s.m.held_idle);
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_KEEP);
	s.now += 20 * US;
	complete(&s);
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_WENT_IDLE);
	ASSERT_TRUE(s.m.held_idle);
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_KEEP);
}

/* Stream holds the driver sent nothing in back stream holds off: 10 ms,
 * doubling per wasted hold in a row, at most 1 s; a productive hold
 * resets it to 10 ms. */
static void test_wasted_holds_back_off(void)
{
	struct blk_irq_hold h;
	struct sim s;
	uint64_t backoff = BLK_IRQ_BACKOFF_NS;

	sim_start(&s, CAP);
	steady(&s, 2, 40 * US, 300);
	complete(&s);
	for (unsigned k = 0; k < 10; k++) {
		uint64_t ended;

		ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
		hold(&s, &h);
		s.now = s.m.held_until;
		ASSERT_TRUE(end(&s).wasted);
		ended = s.now;
		/* Backed off until ended + backoff; the driver goes on
		 * keeping two in flight, so only the back-off says no. */
		s.now = ended + backoff - 1;
		blk_irq_note_overlap(&s.m, s.now);
		ASSERT_TRUE(!want(&s, spin_yes, &h));
		s.now = ended + backoff;
		blk_irq_note_overlap(&s.m, s.now);
		backoff = MIN(2 * backoff, BLK_IRQ_BACKOFF_MAX_NS);
	}
	ASSERT_EQ(backoff, BLK_IRQ_BACKOFF_MAX_NS);
	ASSERT_EQ(s.m.stream_backoff_ns, BLK_IRQ_BACKOFF_MAX_NS);
	/* A productive hold: the driver sent one while we held. */
	ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
	hold(&s, &h);
	take(&s);
	s.now = s.m.held_until;
	ASSERT_TRUE(!end(&s).wasted);
	ASSERT_EQ(s.m.stream_backoff_ns, BLK_IRQ_BACKOFF_NS);
	ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
	/* The next wasted one backs off 10 ms again. */
	hold(&s, &h);
	s.now = s.m.held_until;
	ASSERT_TRUE(end(&s).wasted);
	ASSERT_EQ(s.m.stream_off_until, s.now + BLK_IRQ_BACKOFF_NS);
	/* A busy hold, wasted or not, never backs anything off. */
	steady(&s, 8, 5 * US, 300);
	complete(&s);
	ASSERT_TRUE(want(&s, spin_yes, &h) && !h.stream);
	hold(&s, &h);
	s.now += 1 * US;
	ASSERT_TRUE(!end(&s).wasted);
	ASSERT_EQ(s.m.stream_backoff_ns, 2 * BLK_IRQ_BACKOFF_NS);
}

/* The timer path: a held call goes out at its deadline (the timer blk.c
 * arms for held_until, or a section's end past it), a busy hold as soon
 * as the last request in flight completes; what it amounted to: how long,
 * how late, how many completions joined. */
static void test_hold_ends(void)
{
	struct blk_irq_hold h;
	struct blk_irq_ended e;
	struct sim s;
	uint64_t since;

	sim_start(&s, CAP);
	steady(&s, 8, 40 * US, 300);
	complete(&s);
	ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
	hold(&s, &h);
	since = s.now;
	ASSERT_EQ(s.m.held_until, since + h.ns);
	s.now += 40 * US;
	complete(&s);
	s.now += 40 * US;
	complete(&s);
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_KEEP);
	s.now = s.m.held_until - 1;
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_KEEP);
	s.now = s.m.held_until;
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_SEND);
	/* The timer ran 30 us late. */
	s.now = s.m.held_until + 30 * US;
	e = end(&s);
	ASSERT_EQ(e.held_ns, h.ns + 30 * US);
	ASSERT_EQ(e.late_ns, 30 * US);
	ASSERT_EQ(e.joined, 2);
	/* On time: not late. */
	sim_start(&s, CAP);
	steady(&s, 8, 40 * US, 300);
	complete(&s);
	ASSERT_TRUE(want(&s, spin_yes, &h));
	hold(&s, &h);
	s.now = s.m.held_until;
	e = end(&s);
	ASSERT_EQ(e.late_ns, 0);
	ASSERT_EQ(e.joined, 0);

	/* A busy hold goes out when the last request completes. */
	sim_start(&s, CAP);
	s.m.stream_off_until = UINT64_MAX;
	steady(&s, 3, 5 * US, 300);
	complete(&s);
	ASSERT_TRUE(want(&s, spin_yes, &h) && !h.stream);
	hold(&s, &h);
	s.now += 1 * US;
	complete(&s);
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_KEEP);
	s.now += 1 * US;
	complete(&s);
	ASSERT_EQ(s.inflight, 0);
	ASSERT_TRUE(s.now < s.m.held_until);
	ASSERT_EQ(blk_irq_section_end(&s.m, s.now, s.inflight), BLK_IRQ_SEND);
	e = end(&s);
	ASSERT_EQ(e.held_ns, 2 * US);
	ASSERT_EQ(e.late_ns, 0);
	ASSERT_EQ(e.joined, 2);
}

/* The disk's pace (gap_ns) counts only the gaps it was busy across: a
 * driver sending batches of 8 every millisecond to a disk that completes
 * them 5 us apart gets a busy hold at the first completion of a batch
 * (the one a sleeping driver waits for), though the gaps between
 * completions average far more. */
static void test_disk_pace_counts_busy_gaps_only(void)
{
	struct blk_irq_hold h;
	struct sim s;

	sim_start(&s, CAP);
	s.m.stream_off_until = UINT64_MAX;
	for (unsigned b = 0; b < 50; b++) {
		s.now += 1 * MS;
		for (unsigned i = 0; i < 8; i++)
			take(&s);
		s.now += 5 * US;
		complete(&s);
		if (b >= 40) {
			ASSERT_TRUE(s.m.pace_ns > 100 * US);
			ASSERT_TRUE(want(&s, spin_yes, &h) && !h.stream);
			ASSERT_TRUE(h.ns <= 4 * 5 * US + 28);
		}
		while (s.inflight) {
			s.now += 5 * US;
			complete(&s);
		}
	}
}

/* A gap counts at most BLK_IRQ_GAP_MAX_NS: after a pause of a minute
 * the first completions of a new burst get holds again within a few
 * completions, not after hundreds. */
static void test_long_pause_counts_as_gap_max(void)
{
	struct blk_irq_hold h;
	struct sim s;
	uint64_t pace;

	sim_start(&s, CAP);
	steady(&s, 8, 40 * US, 300);
	while (s.inflight)
		complete(&s);
	pace = s.m.pace_ns;
	s.now += 60000 * MS;
	steady(&s, 8, 40 * US, 0);
	complete(&s);
	ASSERT_EQ(s.m.pace_ns, pace - pace / 8 + BLK_IRQ_GAP_MAX_NS / 8);
	steady(&s, 8, 40 * US, 4);
	complete(&s);
	ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
}

/* A ring starts afresh (blk_irq_start): nothing held, nothing measured
 * (no hold at its first completions), no back-off and no overlap left
 * from before; the overlap counts up to BLK_IRQ_OVERLAP_NS inclusive. */
static void test_ring_start_resets(void)
{
	struct blk_irq_hold h;
	struct sim s;

	/* Nothing measured yet: two in flight, one completes fast. */
	sim_start(&s, CAP);
	take(&s);
	take(&s);
	s.now += 5 * US;
	complete(&s);
	ASSERT_TRUE(!want(&s, spin_yes, &h));
	/* The overlap counts while at most BLK_IRQ_OVERLAP_NS old. */
	steady(&s, 2, 40 * US, 300);
	complete(&s);
	blk_irq_note_overlap(&s.m, s.now - BLK_IRQ_OVERLAP_NS);
	ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
	blk_irq_note_overlap(&s.m, s.now - BLK_IRQ_OVERLAP_NS - 1);
	ASSERT_TRUE(!want(&s, spin_yes, &h));
	/* Held and backed off (a wasted hold); the ring restarts. */
	blk_irq_note_overlap(&s.m, s.now);
	ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
	hold(&s, &h);
	s.now = s.m.held_until;
	ASSERT_TRUE(end(&s).wasted);
	hold(&s, &h);
	while (s.inflight)
		complete(&s);
	blk_irq_start(&s.m, s.now);
	ASSERT_TRUE(!s.m.held);
	/* No back-off: a stream hold as soon as the gaps are measured. */
	steady(&s, 2, 40 * US, 30);
	complete(&s);
	ASSERT_TRUE(want(&s, spin_yes, &h) && h.stream);
	/* No overlap from before: at QD1 right after a restart, none. */
	while (s.inflight)
		complete(&s);
	blk_irq_start(&s.m, s.now);
	for (unsigned i = 0; i < 100; i++) {
		take(&s);
		s.now += 5 * US;
		complete(&s);
		ASSERT_TRUE(!want(&s, spin_yes, &h));
		s.now += 5 * US;
	}
}

int main(void)
{
	RUN(test_never_at_qd1);
	RUN(test_hold_within_cap);
	RUN(test_short_hold_needs_spin);
	RUN(test_stream_hold_goes_on_idle);
	RUN(test_wasted_holds_back_off);
	RUN(test_hold_ends);
	RUN(test_disk_pace_counts_busy_gaps_only);
	RUN(test_long_pause_counts_as_gap_max);
	RUN(test_ring_start_resets);
	return T_EXIT_PASS;
}
