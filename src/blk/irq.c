#include "blk/irq.h"

void blk_irq_start(struct blk_irq *m, uint64_t now)
{
	m->held = false;
	m->gap_ns = m->pace_ns = BLK_IRQ_GAP_MAX_NS;	/* no holding until gaps are measured */
	m->overlap_ns = m->stream_off_until = 0;
	m->stream_backoff_ns = BLK_IRQ_BACKOFF_NS;
	m->busy_before = false;
	m->last_done = now;
}

void blk_irq_end(struct blk_irq *m, uint64_t now, uint64_t loop_ns, uint64_t requests,
		 struct blk_irq_ended *e)
{
	e->held_ns = now - m->held_since;
	e->joined = (uint16_t)(m->done - m->held_done);
	/* Time past the deadline is the loop's lateness, not the policy's:
	 * counted apart (the cap bounds what we chose to wait). */
	e->late_ns = now > m->held_until ? now - m->held_until : 0;
	e->wasted = false;
	m->held = false;
	if (!m->held_stream)
		return;
	/* Did the driver send more while we held?  If not, it was waiting
	 * for us after all: back off. */
	if (requests != m->held_requests) {
		m->stream_backoff_ns = BLK_IRQ_BACKOFF_NS;
	} else {
		e->wasted = true;
		m->stream_off_until = loop_ns + m->stream_backoff_ns;
		m->stream_backoff_ns = MIN(2 * m->stream_backoff_ns, BLK_IRQ_BACKOFF_MAX_NS);
	}
}
