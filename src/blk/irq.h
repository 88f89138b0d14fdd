/*
 * blk_irq_: interrupt moderation (docs/architecture.md "Interrupts"), the
 * policy of one queue.  When the driver asks for an interrupt at a
 * completion (it sleeps waiting for it), the call may be held, at most the
 * cap, so that one interrupt covers the completions that follow (a driver
 * drains all it finds).  Every completion is published at once regardless;
 * only the call waits.  Two kinds of hold:
 *
 * - a stream hold, when the driver has kept several requests outstanding
 *   lately (two in flight at once within BLK_IRQ_OVERLAP_NS: more are
 *   coming) and completions have been coming close together at its pace:
 *   about eight of those gaps (pace_ns: the EWMA per completion leans
 *   towards the short gaps inside a burst).  It lasts its time even when
 *   nothing is left in flight: a driver slower than the disk (a TCG guest,
 *   an overcommitted host) sends its requests one or two at a time, each
 *   finds the disk idle, and without this each completion would cost an
 *   interrupt.  Whether it pays is measured: a driver slower than the disk
 *   goes on sending while we hold; one that sent nothing meanwhile was
 *   waiting for us after all, and that backs stream holds off
 *   (BLK_IRQ_BACKOFF_NS, doubling), so such a driver loses a hold rarely;
 * - otherwise (backed off), a busy hold, when other requests are in flight
 *   and the disk has been completing them close together: about four of
 *   the disk's gaps (gap_ns), at most a tenth of the cap: the driver is
 *   waiting for us (its refills wait too, and with them the disk); it ends
 *   when the last request in flight completes.
 *
 * Never at QD1 (never two in flight at once), never when completions are
 * further apart than half the cap (holding would add latency and cover
 * nothing), never a short hold when the loop cannot wait for its timer
 * spinning.
 *
 * Only the policy lives here: functions of struct blk_irq and of what the
 * caller passes (the time, the requests in flight, the requests taken so
 * far), no timer, eventfd, counter or thread of their own, so that
 * tests/unit/test_irq.c drives them alone.  blk.c keeps the glue: the timer
 * that ends a hold at its deadline, the call eventfd, the counters.
 *
 * Two clocks: loop time (loop_now: when the loop's iteration began) for
 * the gaps, the overlap and the back-off; the timer's clock (sys_now_ns,
 * what loop_timer_mod takes) for a hold's start and deadline.
 *
 * Threading: the queue's iothread (struct blk_irq is part of its
 * blk_queue).  Internal to src/blk/.
 */
#ifndef VBLK_BLK_IRQ_H
#define VBLK_BLK_IRQ_H

#include <stdbool.h>
#include <stdint.h>

#include "util/compiler.h"

struct loop;

/* A driver that had two requests in flight within this long still has
 * more than one outstanding: more are coming. */
#define BLK_IRQ_OVERLAP_NS 2000000ull
/* The driver sent nothing during a stream hold (it was waiting for us
 * after all): no stream holds for this long, doubled per wasted hold in a
 * row up to the max. */
#define BLK_IRQ_BACKOFF_NS 10000000ull
#define BLK_IRQ_BACKOFF_MAX_NS 1000000000ull
/* A busy hold keeps a driver that is waiting for us waiting: at most this
 * fraction of the cap. */
#define BLK_IRQ_BUSY_DIV 10
/* A hold at least this long may be slept: a wake-up's overshoot (tens of
 * microseconds on a VM) is small beside it.  Shorter holds need the loop
 * to wait for their timer spinning. */
#define BLK_IRQ_SLEEP_NS 100000ull
/* Gaps between completions count at most this much; it is also where the
 * EWMAs start, so that nothing is held until gaps are measured. */
#define BLK_IRQ_GAP_MAX_NS 1000000ull

struct blk_irq {
	uint64_t max_ns;		/* the cap (blk_opts); 0: off.  Set once */
	uint16_t done;			/* completions so far (wraps) */
	/* How completions come (blk_irq_note_*), loop time: */
	bool busy_before;		/* the last completion left requests in flight */
	uint64_t last_done;		/* when the last one came */
	uint64_t gap_ns;		/* EWMA of the gaps the disk was busy across */
	uint64_t pace_ns;		/* EWMA of all gaps between completions */
	uint64_t overlap_ns;		/* when >= 2 were last in flight */
	/* The back-off of stream holds, loop time: */
	uint64_t stream_off_until;	/* no stream holds before this */
	uint64_t stream_backoff_ns;	/* the next wasted stream hold's back-off */
	/* The hold, while held (timer clock): */
	bool held;			/* a call is held until held_until */
	bool held_stream;		/* may wait for requests yet to come */
	bool held_idle;			/* ... and did: nothing was left in flight */
	uint16_t held_done;		/* done when the call was held */
	uint64_t held_since;		/* when it was held */
	uint64_t held_until;		/* when it goes out at the latest */
	uint64_t held_requests;		/* requests taken when the call was held */
};

/* What blk_irq_want decided. */
struct blk_irq_hold {
	uint64_t ns;			/* how long, at most the cap */
	bool stream;			/* a stream hold (else a busy hold) */
};

/* What a hold that ended (blk_irq_end) amounted to, for the counters. */
struct blk_irq_ended {
	uint64_t held_ns;		/* from the hold to the end */
	uint64_t late_ns;		/* of which past the deadline: the loop ran late */
	uint16_t joined;		/* completions that shared the call */
	bool wasted;			/* a stream hold the driver sent nothing in */
};

/* Where blk_irq_section_end leaves a held call. */
enum blk_irq_section {
	BLK_IRQ_KEEP,			/* still held */
	BLK_IRQ_WENT_IDLE,		/* still held, now for requests yet to come */
	BLK_IRQ_SEND,			/* send it now (blk_irq_end) */
};

/* A ring starts at now (loop time): nothing held, nothing measured, no
 * back-off.  max_ns and done are kept. */
void blk_irq_start(struct blk_irq *m, uint64_t now);

/* A request was taken while another was in flight (now: loop time). */
static inline void blk_irq_note_overlap(struct blk_irq *m, uint64_t now)
{
	m->overlap_ns = now;
}

/*
 * A completion at now (loop time), inflight left after it: how fast
 * completions come, as EWMAs (1/8) of the time between them, each gap at
 * most BLK_IRQ_GAP_MAX_NS.  gap_ns, the disk's pace, counts only gaps the
 * disk was busy across (the previous completion left requests in flight):
 * a gap after the queue ran dry measures the driver's pace, not the
 * disk's, and the first completion of each batch, exactly the one a
 * sleeping driver waits for, would otherwise always look slow.  pace_ns
 * counts every gap: the pace of a driver that sends one or two at a time.
 */
static inline void blk_irq_note_completion(struct blk_irq *m, uint64_t now, unsigned inflight)
{
	uint64_t gap = now - m->last_done;

	if (gap > BLK_IRQ_GAP_MAX_NS)
		gap = BLK_IRQ_GAP_MAX_NS;
	if (m->busy_before)
		m->gap_ns = m->gap_ns - m->gap_ns / 8 + gap / 8;
	m->pace_ns = m->pace_ns - m->pace_ns / 8 + gap / 8;
	m->last_done = now;
	m->busy_before = inflight > 0;
}

/*
 * The hold decision, for a call the driver wants now (loop time) with
 * inflight requests still in flight, nothing held yet.  Returns true and
 * the hold in *h, or false: send the call.  can_spin(l) says whether the
 * loop can wait for a short hold's timer spinning (loop_can_spin); it is
 * asked only about a hold shorter than BLK_IRQ_SLEEP_NS, so the common
 * answer (no hold) costs no call.
 */
static inline bool blk_irq_want(const struct blk_irq *m, uint64_t now, unsigned inflight,
				bool (*can_spin)(struct loop *), struct loop *l,
				struct blk_irq_hold *h)
{
	uint64_t max = m->max_ns, busy_max = max / BLK_IRQ_BUSY_DIV;

	if (!max)
		return false;
	h->stream = now - m->overlap_ns <= BLK_IRQ_OVERLAP_NS && now >= m->stream_off_until &&
		    m->pace_ns <= max / 2;
	if (h->stream)
		h->ns = MIN(8 * m->pace_ns, max);
	else if (inflight && m->gap_ns <= busy_max / 2)
		h->ns = MIN(4 * m->gap_ns, busy_max);
	else
		return false;
	/* A short hold's timer must be kept to the microsecond: the loop
	 * waits for it spinning, which it does not while our CPU is
	 * contended (or with polling off). */
	return h->ns >= BLK_IRQ_SLEEP_NS || can_spin(l);
}

/*
 * Hold the call as h says from now (timer clock), requests taken so far,
 * inflight in flight; the deadline is m->held_until.  Returns true if
 * nothing is in flight: the hold waits for requests yet to come from the
 * start (held_idle).
 */
static inline bool blk_irq_hold(struct blk_irq *m, const struct blk_irq_hold *h, uint64_t now,
				uint64_t requests, unsigned inflight)
{
	m->held = true;
	m->held_stream = h->stream;
	m->held_since = now;
	m->held_until = now + h->ns;
	m->held_done = m->done;	/* counts from the completion the driver waits for */
	m->held_requests = requests;
	m->held_idle = !inflight;
	return m->held_idle;
}

/*
 * At the end of a defer section, a call held (m->held) with inflight left,
 * now on the timer clock.  Its time is up (the section ran long), or
 * nothing is left in flight that could share it and it is not a stream
 * hold, which waits for requests yet to come: BLK_IRQ_SEND.  A stream hold
 * left with nothing in flight for the first time: BLK_IRQ_WENT_IDLE.
 */
static inline enum blk_irq_section blk_irq_section_end(struct blk_irq *m, uint64_t now,
							unsigned inflight)
{
	if (now >= m->held_until || (!inflight && !m->held_stream))
		return BLK_IRQ_SEND;
	if (!inflight && !m->held_idle) {
		m->held_idle = true;
		return BLK_IRQ_WENT_IDLE;
	}
	return BLK_IRQ_KEEP;
}

/*
 * The held call goes out at now (timer clock; loop_ns: loop time), with
 * requests taken so far: what the hold amounted to in *e.  A stream hold
 * the driver sent nothing in backs stream holds off (doubling per wasted
 * hold in a row); one it sent in resets the back-off.
 */
void blk_irq_end(struct blk_irq *m, uint64_t now, uint64_t loop_ns, uint64_t requests,
		 struct blk_irq_ended *e);

#endif
