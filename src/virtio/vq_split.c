/*
 * The device side of a split virtqueue (virtio 1.2, 2.7), against a
 * hostile driver: descriptor table, avail ring, used ring.  vq.h's
 * entry points call here when the ring is not packed; the contract is
 * vq.h's.  Calls down only (vq_common.c, mem/), never into vq.c.
 */
#include "virtio/vq_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/barrier.h"
#include "util/compiler.h"
#include "util/log.h"

/*
 * vhost-user.rst "Inflight I/O tracking", "When reconnecting": finish the
 * bookkeeping of a batch the previous backend published but had not
 * cleared, then queue every head still marked in flight, oldest first.
 */
static int vqs_inflight_init(struct vq *vq, struct vq_inflight_region *r)
{
	uint16_t used = vq->used_idx, n = 0;
	uint64_t max_counter = 0;

	vq->inflight = r;
	vq->batch_n = 0;
	if (READ_ONCE(r->version) == 0) {
		/* Fresh region: nothing to recover. */
		memset(r->desc, 0, sizeof(r->desc[0]) * vq->num);
		WRITE_ONCE(r->desc_num, (uint16_t)vq->num);
		WRITE_ONCE(r->used_idx, used);
		WRITE_ONCE(r->last_batch_head, 0);
		WRITE_ONCE(r->version, 1);
		return 0;
	}
	if (READ_ONCE(r->version) != 1 || READ_ONCE(r->desc_num) != vq->num) {
		log_err("queue %u: in-flight region has version %u and %u entries; "
			"expected version 1 with %u", vq->index, r->version, r->desc_num,
			vq->num);
		vq->inflight = NULL;
		return -EINVAL;
	}
	if (READ_ONCE(r->used_idx) != used) {
		/* The last batch reached the used ring but its entries were
		 * not cleared: they are done, not in flight. */
		uint16_t batch = (uint16_t)(used - READ_ONCE(r->used_idx));
		uint16_t h = READ_ONCE(r->last_batch_head);

		for (unsigned i = 0; i < batch && i < vq->num && h < vq->num; i++) {
			WRITE_ONCE(r->desc[h].inflight, 0);
			h = READ_ONCE(r->desc[h].next);
		}
		WRITE_ONCE(r->used_idx, used);
	}
	vq->resubmit = calloc(vq->num, sizeof(*vq->resubmit));
	if (!vq->resubmit)
		return -ENOMEM;
	for (unsigned i = 0; i < vq->num; i++) {
		uint64_t counter;

		if (READ_ONCE(r->desc[i].inflight) != 1)
			continue;
		counter = READ_ONCE(r->desc[i].counter);
		vq->resubmit[n++] = (struct vq_resubmit){ .counter = counter, .id = (uint16_t)i };
		max_counter = MAX(max_counter, counter);
	}
	vq_resubmit_sort(vq, n);
	vq->resubmit_n = n;
	vq->inflight_counter = max_counter + 1;
	/* Every head taken is either returned (counted in used->idx) or in
	 * flight: that is where the avail ring resumes, whatever base the
	 * frontend (which could not ask a dead backend) sent. */
	vq->last_avail_idx = vq->shadow_avail_idx = (uint16_t)(used + n);
	if (n)
		log_info("queue %u: resubmitting %u requests left in flight, avail "
			 "resumes at %u", vq->index, n, vq->last_avail_idx);
	return 0;
}

/* Mark a head taken (spec: counter, then inflight = 1). */
static inline void inflight_take(struct vq *vq, uint16_t head)
{
	struct vq_inflight_desc *d = &vq->inflight->desc[head];

	WRITE_ONCE(d->counter, vq->inflight_counter++);
	WRITE_ONCE(d->inflight, 1);
}

int vqs_init(struct vq *vq, const struct vq_config *cfg, const struct gm_table *mem)
{
	unsigned num = cfg->num;

	/* virtio 1.2, 2.7 table "Virtqueue Part Alignment": desc 16,
	 * avail 2, used 4. */
	if ((cfg->desc_qva & 15) || (cfg->avail_qva & 1) || (cfg->used_qva & 3))
		return -EINVAL;
	vq->desc = gm_qva_to_host(mem, cfg->desc_qva, vring_desc_bytes(num));
	vq->avail = gm_qva_to_host(mem, cfg->avail_qva, vring_avail_bytes(num));
	vq->used = gm_qva_to_host(mem, cfg->used_qva, vring_used_bytes(num));
	if (!vq->desc || !vq->avail || !vq->used)
		return -EINVAL;
	/* The frontend's addresses may be aligned while our mapping of them
	 * is not (a region whose mmap_offset and userspace address disagree
	 * modulo 16): the rings are read with aligned loads, so check the
	 * host side too. */
	if (((uintptr_t)vq->desc & 15) || ((uintptr_t)vq->avail & 1) ||
	    ((uintptr_t)vq->used & 3))
		return -EINVAL;
	vq->num = num;
	vq->mem = mem;
	vq->event_idx = cfg->event_idx;
	vq->indirect = cfg->indirect;
	vq->used_event = &vq->avail->ring[num];
	vq->avail_event = (uint16_t *)&vq->used->ring[num];
	vq->last_avail_idx = cfg->last_avail_idx;
	vq->shadow_avail_idx = cfg->last_avail_idx;
	/* Continue from where the driver saw us stop; all requests taken
	 * before a stop were completed (stop drains), so used catches up. */
	vq->used_idx = READ_ONCE(vq->used->idx);
	if (cfg->inflight)
		return vqs_inflight_init(vq, cfg->inflight);
	return 0;
}

/* Copy a descriptor out of guest memory: each field read exactly once. */
static inline void desc_read(const struct vring_desc *src, struct vring_desc *d)
{
	d->addr = READ_ONCE(src->addr);
	d->len = READ_ONCE(src->len);
	d->flags = READ_ONCE(src->flags);
	d->next = READ_ONCE(src->next);
}

bool vqs_avail_pending(struct vq *vq)
{
	if (vq->resubmit_i < vq->resubmit_n || vq->shadow_avail_idx != vq->last_avail_idx)
		return true;
	return READ_ONCE(vq->avail->idx) != vq->last_avail_idx;
}

/*
 * Walk one chain (virtio 1.2, 2.7.5 "The Virtqueue Descriptor Table" and
 * 2.7.5.3 "Indirect Descriptors").  Structural errors (loop, index out of
 * range, nested indirect) stop the walk; address errors are remembered and
 * the walk goes on so we still find the final descriptor (last_byte).
 */
static int walk_chain(struct vq *vq, struct vq_elem *e)
{
	const struct vring_desc *table = vq->desc;
	/* max_hops bounds the walk (loops); limit bounds indices.  They
	 * differ for indirect tables longer than VQ_MAX_SEGS. */
	unsigned max_hops = vq->num, limit = vq->num, hops = 0, i = e->head;
	bool in_indirect = false, seen_write = false;
	const char *err = NULL;
	unsigned niov = 0;
	struct vring_desc d;

	e->out_num = e->in_num = 0;
	e->out_len = e->in_len = 0;
	e->last_byte = NULL;

	for (;;) {
		if (unlikely(++hops > max_hops)) {
			vq_bad_chain(vq, "descriptor loop", e->head);
			return -EINVAL;
		}
		desc_read(&table[i], &d);

		if (d.flags & VRING_DESC_F_INDIRECT) {
			uint64_t n;

			if (unlikely(!vq->indirect || in_indirect)) {
				vq_bad_chain(vq, in_indirect ? "nested indirect table" :
					  "indirect descriptor not negotiated", e->head);
				return -EINVAL;
			}
			/* 2.7.5.3.1: the driver MUST NOT set NEXT with INDIRECT. */
			if (unlikely(d.flags & VRING_DESC_F_NEXT)) {
				vq_bad_chain(vq, "indirect descriptor with NEXT", e->head);
				return -EINVAL;
			}
			if (unlikely(d.len == 0 || (d.len % sizeof(struct vring_desc)))) {
				vq_bad_chain(vq, "indirect table size not a multiple of 16",
					  e->head);
				return -EINVAL;
			}
			n = d.len / sizeof(struct vring_desc);
			table = gm_gpa_to_host(vq->mem, d.addr, d.len);
			if (unlikely(!table)) {
				vq_bad_chain(vq, "indirect table outside guest memory",
					  e->head);
				return -EINVAL;
			}
			/* Descriptors are read with aligned single loads. */
			if (unlikely((uintptr_t)table & 7)) {
				vq_bad_chain(vq, "indirect table not 8-byte aligned", e->head);
				return -EINVAL;
			}
			in_indirect = true;
			/* A table has at most 65536 reachable entries (next is
			 * 16 bits); walking more than VQ_MAX_SEGS + 1 of them
			 * already means failure. */
			limit = n > 65536 ? 65536 : (unsigned)n;
			max_hops = MIN(limit, VQ_MAX_SEGS + 1);
			hops = 0;
			i = 0;
			continue;
		}

		vq_add_buf(vq, e, d.addr, d.len, d.flags & VRING_DESC_F_WRITE, &niov,
			   &seen_write, &err);
		if (!(d.flags & VRING_DESC_F_NEXT))
			break;
		if (unlikely(d.next >= limit)) {
			vq_bad_chain(vq, "next index out of range", e->head);
			return -EINVAL;
		}
		i = d.next;
	}

	return vq_walk_end(vq, e, err, d.addr, d.len, d.flags & VRING_DESC_F_WRITE);
}

int vqs_pop(struct vq *vq, struct vq_elem *e)
{
	uint16_t avail_idx, head;

	if (unlikely(vq->resubmit_i < vq->resubmit_n)) {
		/* Left in flight by a previous backend: these come first. */
		head = vq->resubmit[vq->resubmit_i++].id;
		inflight_take(vq, head);
		e->head = head;
		return walk_chain(vq, e);
	}

	if (vq->last_avail_idx == vq->shadow_avail_idx) {
		avail_idx = READ_ONCE(vq->avail->idx);
		/* 2.7.13.3: the driver adds at most num entries beyond what
		 * the device took; more means a corrupt (or hostile) index. */
		if (unlikely((uint16_t)(avail_idx - vq->last_avail_idx) > vq->num)) {
			vq_set_broken(vq, "avail index moved by more than the ring size");
			return -EIO;
		}
		vq->shadow_avail_idx = avail_idx;
		if (avail_idx == vq->last_avail_idx)
			return 0;
		/* Pairs with the driver's write barrier between filling
		 * ring[] and bumping avail->idx: read ring entries only after
		 * seeing the index. */
		smp_rmb();
	}

	head = READ_ONCE(vq->avail->ring[vq->last_avail_idx & (vq->num - 1)]);
	if (unlikely(head >= vq->num)) {
		vq_set_broken(vq, "avail ring entry out of range");
		return -EIO;
	}
	vq->last_avail_idx++;
	if (vq->inflight)
		inflight_take(vq, head);
	e->head = head;
	return walk_chain(vq, e);
}

/* ---- Dirty logging of the used ring (vhost-user.rst "Migration") ---- */

/* Log a store into the used ring: the spec logs these at log_guest_addr
 * plus the offset in the ring, not at the ring's own address.  The caller
 * has made the store visible (smp_mb). */
static void log_used(struct vq *vq, uint64_t off, uint64_t len)
{
	uint64_t gpa;

	if (unlikely(__builtin_add_overflow(vq->log.used_gpa, off, &gpa))) {
		__gm_dirty_miss(vq->log.log, UINT64_MAX, len);
		return;
	}
	gm_dirty_mark(vq->log.log, gpa, len);
	vq->log_kick = true;
}

#define USED_ELEM_OFF(i) (offsetof(struct vring_used, ring) + \
			  (uint64_t)(i) * sizeof(struct vring_used_elem))

/* After used->idx is published: the entries since the last time, and the
 * index. */
static __cold void log_used_flush(struct vq *vq)
{
	unsigned first = vq->log_used_idx & (vq->num - 1);
	uint16_t n = (uint16_t)(vq->used_idx - vq->log_used_idx);

	/* The entries and the index must be visible before we test bits
	 * (pairs with the frontend's exchange-then-copy, see dirty.h). */
	smp_mb();
	if (n > vq->num)	/* cannot happen: we push at most num */
		n = (uint16_t)vq->num;
	if (first + n > vq->num) {	/* wraps: two runs */
		log_used(vq, USED_ELEM_OFF(first), (uint64_t)(vq->num - first) * 8);
		log_used(vq, USED_ELEM_OFF(0), (uint64_t)(first + n - vq->num) * 8);
	} else if (n) {
		log_used(vq, USED_ELEM_OFF(first), (uint64_t)n * 8);
	}
	log_used(vq, offsetof(struct vring_used, idx), sizeof(uint16_t));
	vq->log_used_idx = vq->used_idx;
}

/* head is vq_push's uint16_t, widened: declared uint16_t, GCC 12 spends
 * two register moves on it in every push. */
void vqs_push(struct vq *vq, unsigned head, uint32_t len)
{
	struct vring_used_elem *u = &vq->used->ring[vq->used_idx & (vq->num - 1)];

	WRITE_ONCE(u->id, head);
	WRITE_ONCE(u->len, len);
	vq->used_idx++;
	if (vq->inflight) {
		WRITE_ONCE(vq->inflight->desc[head].next, vq->inflight->last_batch_head);
		WRITE_ONCE(vq->inflight->last_batch_head, (uint16_t)head);
		vq->batch_n++;
	}
}

void vqs_flush(struct vq *vq)
{
	/* Pairs with the driver's read barrier after it reads used->idx:
	 * the entries must be visible before the index that covers them. */
	smp_wmb();
	WRITE_ONCE(vq->used->idx, vq->used_idx);
	if (vq->inflight && vq->batch_n) {
		/* Published: the batch is no longer in flight.  A crash
		 * between the index and here is repaired by the next backend
		 * (vqs_inflight_init sees used_idx behind used->idx). */
		struct vq_inflight_region *r = vq->inflight;
		uint16_t h = READ_ONCE(r->last_batch_head);

		for (unsigned i = 0; i < vq->batch_n && h < vq->num; i++) {
			WRITE_ONCE(r->desc[h].inflight, 0);
			h = READ_ONCE(r->desc[h].next);
		}
		WRITE_ONCE(r->used_idx, vq->used_idx);
		vq->batch_n = 0;
	}
	/* Last, so it is a tail call: the common path builds no frame. */
	if (unlikely(vq->log.used))
		log_used_flush(vq);
}

/* virtio 1.2, 2.7.7 "Used Buffer Notification Suppression". */
bool vqs_should_notify(struct vq *vq)
{
	uint16_t old, new;

	/* Pairs with the driver's full barrier between writing used_event
	 * (or clearing NO_INTERRUPT) and re-reading used->idx: either we see
	 * its new event index, or it sees our new used index. */
	smp_mb();
	if (!vq->event_idx)
		return !(READ_ONCE(vq->avail->flags) & VRING_AVAIL_F_NO_INTERRUPT);

	old = vq->signalled_used;
	new = vq->used_idx;
	vq->signalled_used = new;
	if (unlikely(!vq->signalled_used_valid)) {
		vq->signalled_used_valid = true;
		return true;
	}
	return vring_need_event(READ_ONCE(*vq->used_event), new, old);
}

/* Log the field the two functions below store: avail_event (EVENT_IDX)
 * or used->flags. */
static __cold void log_notify_field(struct vq *vq)
{
	if (vq->event_idx)
		log_used(vq, USED_ELEM_OFF(vq->num), sizeof(uint16_t));
	else
		log_used(vq, offsetof(struct vring_used, flags), sizeof(uint16_t));
}

/* virtio 1.2, 2.7.10 "Available Buffer Notification Suppression". */
void vqs_disable_notify(struct vq *vq)
{
	if (vq->notify_disabled)
		return;
	vq->notify_disabled = true;
	/* With EVENT_IDX the driver kicks when its new avail index passes
	 * avail_event; an event index behind everything we have taken is
	 * never passed again, so this is a real "off".  Otherwise NO_NOTIFY. */
	if (vq->event_idx)
		WRITE_ONCE(*vq->avail_event, (uint16_t)(vq->last_avail_idx - 1));
	else
		WRITE_ONCE(vq->used->flags, VRING_USED_F_NO_NOTIFY);
	if (unlikely(vq->log.used)) {
		/* The store visible before the bit test (dirty.h). */
		smp_mb();
		log_notify_field(vq);
	}
}

bool vqs_enable_notify(struct vq *vq)
{
	uint16_t avail_idx;

	vq->notify_disabled = false;
	if (vq->event_idx)
		WRITE_ONCE(*vq->avail_event, vq->last_avail_idx);
	else
		WRITE_ONCE(vq->used->flags, 0);
	/* Pairs with the driver's full barrier between publishing avail->idx
	 * and reading avail_event/flags: either it sees notifications on and
	 * kicks, or we see its new index here. */
	smp_mb();
	avail_idx = READ_ONCE(vq->avail->idx);
	/* After the barrier above, which also orders the store before the
	 * bit test. */
	if (unlikely(vq->log.used))
		log_notify_field(vq);
	/* Same check as vq_pop: an index behind us or more than num ahead is
	 * corrupt.  Reporting it as "work" would have the caller spin (found
	 * by fuzz_vq_blk: a used ring overlapping avail->idx, so our own flag
	 * write moved the index). */
	if (unlikely((uint16_t)(avail_idx - vq->last_avail_idx) > vq->num)) {
		vq_set_broken(vq, "avail index moved by more than the ring size");
		return false;
	}
	return avail_idx != vq->last_avail_idx || vq->resubmit_i < vq->resubmit_n;
}
