/*
 * The device side of a packed virtqueue (virtio 1.2, 2.8 "Packed
 * Virtqueues"), against a hostile driver.  vq.h's entry points (and
 * vq_init) call here when the ring is packed; the contract is vq.h's.
 * Calls down only (vq_common.c, mem/), never into vq.c or vq_split.c.
 *
 * One ring of descriptors, read in ring order: a descriptor is available
 * when its AVAIL flag matches our copy of the driver's wrap counter and
 * its USED flag does not (2.8.1).  A list is consecutive descriptors linked
 * by NEXT, its buffer id in the last one; we write one used descriptor per
 * list, at our own used position, and move on by the list's length (2.8.7).
 * Positions are < num; each side's wrap counter flips when it passes the
 * ring's end.
 */
#include "virtio/vq_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/barrier.h"
#include "util/log.h"

static inline bool desc_avail(uint16_t flags, bool wrap)
{
	return !!(flags & VRING_PACKED_DESC_F_AVAIL) == wrap &&
	       !!(flags & VRING_PACKED_DESC_F_USED) != wrap;
}

static int vqp_inflight_init(struct vq *vq, struct vq_inflight_region *r);

int vqp_init(struct vq *vq, const struct vq_config *cfg, const struct gm_table *mem)
{
	unsigned num = cfg->num;
	uint16_t avail = cfg->last_avail_idx & 0x7fff, used = cfg->used_idx & 0x7fff;

	/* 2.8.10.1 "Structure Size and Alignment": descriptor ring 16, the
	 * two event areas 4. */
	if ((cfg->desc_qva & 15) || (cfg->avail_qva & 3) || (cfg->used_qva & 3))
		return -EINVAL;
	if (avail >= num || used >= num)
		return -EINVAL;
	vq->pdesc = gm_qva_to_host(mem, cfg->desc_qva, vring_desc_bytes(num));
	vq->driver_event = gm_qva_to_host(mem, cfg->avail_qva, sizeof(*vq->driver_event));
	vq->device_event = gm_qva_to_host(mem, cfg->used_qva, sizeof(*vq->device_event));
	if (!vq->pdesc || !vq->driver_event || !vq->device_event)
		return -EINVAL;
	/* Read and written with aligned single loads and stores. */
	if (((uintptr_t)vq->pdesc & 15) || ((uintptr_t)vq->driver_event & 3) ||
	    ((uintptr_t)vq->device_event & 3))
		return -EINVAL;
	vq->chain_len = calloc(num, sizeof(*vq->chain_len));
	if (!vq->chain_len)
		return -ENOMEM;
	vq->packed = true;
	vq->num = num;
	vq->mem = mem;
	vq->event_idx = cfg->event_idx;
	vq->indirect = cfg->indirect;
	vq->last_avail_idx = avail;
	vq->avail_wrap = cfg->last_avail_idx >> 15;
	vq->used_idx = used;
	vq->used_wrap = cfg->used_idx >> 15;
	if (cfg->inflight && !cfg->inflight_packed_room)
		log_warn("queue %u: the in-flight region has no room for a packed ring "
			 "(made by an older vblkd): not tracked", vq->index);
	else if (cfg->inflight)
		return vqp_inflight_init(vq, cfg->inflight);
	if (avail != used || vq->avail_wrap != vq->used_wrap)
		log_warn("queue %u: packed ring starts with descriptors %u..%u taken and "
			 "never used (a backend died with requests in flight?), and there "
			 "is no in-flight region to resubmit them from", vq->index, used,
			 avail);
	return 0;
}

bool vqp_avail_pending(struct vq *vq)
{
	return desc_avail(READ_ONCE(vq->pdesc[vq->last_avail_idx].flags), vq->avail_wrap);
}

/*
 * An indirect table (2.8.8): the list's only descriptor, a whole number
 * of descriptors, in guest memory; its entries are read in order, WRITE
 * their only flag (the others are reserved: ignored).
 */
static void walk_indirect(struct vq *vq, struct vq_elem *e, uint64_t addr, uint32_t len,
			  bool alone, unsigned *niov, bool *seen_write, const char **err,
			  uint64_t *last_addr, uint32_t *last_len, bool *last_write)
{
	const struct vring_packed_desc *t;
	uint32_t n;

	if (unlikely(!vq->indirect)) {
		*err = *err ? *err : "indirect descriptor not negotiated";
		return;
	}
	/* 2.8.8.1: no INDIRECT in a list linked by NEXT. */
	if (unlikely(!alone)) {
		*err = *err ? *err : "indirect descriptor in a descriptor list";
		return;
	}
	if (unlikely(len == 0 || len % sizeof(*t))) {
		*err = *err ? *err : "indirect table size not a multiple of 16";
		return;
	}
	t = gm_gpa_to_host(vq->mem, addr, len);
	if (unlikely(!t || ((uintptr_t)t & 7))) {
		*err = *err ? *err : t ? "indirect table not 8-byte aligned" :
					 "indirect table outside guest memory";
		return;
	}
	n = len / sizeof(*t);
	if (unlikely(n > VQ_MAX_SEGS)) {
		/* Too many to take; only the last entry matters (last_byte). */
		*err = *err ? *err : "too many descriptors in one request";
		t += n - 1;
		n = 1;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint64_t a = READ_ONCE(t[i].addr);
		uint32_t l = READ_ONCE(t[i].len);
		bool w = READ_ONCE(t[i].flags) & VRING_DESC_F_WRITE;

		vq_add_buf(vq, e, a, l, w, niov, seen_write, err);
		*last_addr = a;
		*last_len = l;
		*last_write = w;
	}
}

/*
 * Walk the list whose first descriptor is at (*pos, *wrap) of ring (the
 * ring itself, or the in-flight region's copy of it) into e: 1 with *n
 * descriptors and its buffer id in *id (the request may still have failed:
 * *err), 0 if that descriptor is not available, -EIO if the ring is
 * broken.  Moves (*pos, *wrap) past the list.  With copy, each descriptor
 * read is also stored there at its position.
 */
static int walk_list(struct vq *vq, const struct vring_packed_desc *ring,
		     struct vring_packed_desc *copy, struct vq_elem *e, uint16_t *posp,
		     bool *wrapp, unsigned *np, uint16_t *idp, const char **err,
		     uint64_t *last_addr, uint32_t *last_len, bool *last_write)
{
	uint16_t pos = *posp, flags, id;
	bool wrap = *wrapp, seen_write = false;
	unsigned n = 0, niov = 0;

	/* Every caller starts from a position it checked; this keeps a
	 * future one from indexing past the ring with a value the guest or
	 * the frontend can write (below, pos wraps at num). */
	if (unlikely(pos >= vq->num)) {
		vq_set_broken(vq, "a list starts outside the ring");
		return -EIO;
	}
	flags = READ_ONCE(ring[pos].flags);
	if (!desc_avail(flags, wrap))
		return 0;
	/* Pairs with the driver's barrier before it flips the first
	 * descriptor's flags (2.8.21.1): the list is read only after. */
	smp_rmb();

	e->out_num = e->in_num = 0;
	e->out_len = e->in_len = 0;
	e->last_byte = NULL;
	for (;;) {
		const struct vring_packed_desc *s = &ring[pos];
		uint64_t addr = READ_ONCE(s->addr);
		uint32_t len = READ_ONCE(s->len);

		id = READ_ONCE(s->id);
		if (n) {
			flags = READ_ONCE(s->flags);
			/* 2.8.6: the driver makes the whole list available
			 * before its first descriptor. */
			if (unlikely(!desc_avail(flags, wrap))) {
				vq_set_broken(vq, "descriptor list runs into a descriptor "
					      "that is not available");
				return -EIO;
			}
		}
		if (unlikely(copy)) {
			WRITE_ONCE(copy[pos].addr, addr);
			WRITE_ONCE(copy[pos].len, len);
			WRITE_ONCE(copy[pos].id, id);
			WRITE_ONCE(copy[pos].flags, flags);
		}
		n++;
		if (++pos == vq->num) {
			pos = 0;
			wrap = !wrap;
		}
		if (flags & VRING_DESC_F_INDIRECT) {
			walk_indirect(vq, e, addr, len, n == 1 && !(flags & VRING_DESC_F_NEXT),
				      &niov, &seen_write, err, last_addr, last_len, last_write);
		} else {
			*last_write = flags & VRING_DESC_F_WRITE;
			vq_add_buf(vq, e, addr, len, *last_write, &niov, &seen_write, err);
			*last_addr = addr;
			*last_len = len;
		}
		if (!(flags & VRING_DESC_F_NEXT))
			break;
		/* 2.8.7.1: a list no longer than the ring. */
		if (unlikely(n == vq->num)) {
			vq_set_broken(vq, "descriptor list longer than the ring");
			return -EIO;
		}
	}
	*posp = pos;
	*wrapp = wrap;
	*np = n;
	*idp = id;
	return 1;
}

/* ---- In-flight tracking (struct vq_inflight_packed_desc in vq.h) ---- */

#define PACKED_INFLIGHT_VERSION 2

static inline struct vq_inflight_packed_desc *ifd(struct vq *vq, uint16_t id)
{
	return (struct vq_inflight_packed_desc *)&vq->inflight->desc[id];
}

/* The region's copy of the ring (after the num entries). */
static inline struct vring_packed_desc *ring_copy(struct vq *vq)
{
	return (struct vring_packed_desc *)&vq->inflight->desc[vq->num];
}

static inline uint16_t pos_wrap(uint16_t pos, bool wrap)
{
	return (uint16_t)(pos | (wrap ? 0x8000 : 0));
}

/* (pos, wrap) moved on by n < num descriptors. */
static inline void ring_advance(const struct vq *vq, uint16_t *pos, bool *wrap, unsigned n)
{
	unsigned p = *pos + n;

	if (p >= vq->num) {
		p -= vq->num;
		*wrap = !*wrap;
	}
	*pos = (uint16_t)p;
}

/* Taken: everything a restart needs, then the flag (a crash before it
 * leaves the request where the next backend takes it again). */
static void inflight_take(struct vq *vq, uint16_t id, uint16_t head, unsigned n)
{
	struct vq_inflight_packed_desc *d = ifd(vq, id);

	WRITE_ONCE(d->counter, vq->inflight_counter++);
	WRITE_ONCE(d->len, (uint16_t)n);
	WRITE_ONCE(d->head, head);
	WRITE_ONCE(d->inflight, 1);
}

/*
 * A previous backend left this region: where the next used descriptor
 * goes comes from it (the frontend cannot know: a packed ring's positions
 * are nowhere in guest memory), the request it was returning when it died
 * is finished or taken back, the ones in flight are resubmitted oldest
 * first, and the next descriptor to take is past all of them.
 */
static int vqp_inflight_init(struct vq *vq, struct vq_inflight_region *r)
{
	uint16_t used = READ_ONCE(r->used_idx), pos, n = 0, apos;
	unsigned total = 0;
	uint64_t max_counter = 0;
	bool wrap, awrap;

	vq->inflight = r;
	if (READ_ONCE(r->version) == 0) {
		memset(r->desc, 0, sizeof(r->desc[0]) * vq->num * 2);	/* entries, copy */
		WRITE_ONCE(r->desc_num, (uint16_t)vq->num);
		WRITE_ONCE(r->used_idx, pos_wrap(vq->used_idx, vq->used_wrap));
		WRITE_ONCE(r->last_batch_head, 0);
		WRITE_ONCE(r->version, PACKED_INFLIGHT_VERSION);
		return 0;
	}
	if (READ_ONCE(r->version) != PACKED_INFLIGHT_VERSION ||
	    READ_ONCE(r->desc_num) != vq->num || (used & 0x7fff) >= vq->num) {
		log_err("queue %u: in-flight region has version %u and %u entries; "
			"expected a packed ring's (version %u) with %u", vq->index,
			r->version, r->desc_num, PACKED_INFLIGHT_VERSION, vq->num);
		vq->inflight = NULL;
		return -EINVAL;
	}
	vq->resubmit = calloc(vq->num, sizeof(*vq->resubmit));
	if (!vq->resubmit)
		return -ENOMEM;
	pos = used & 0x7fff;
	wrap = used >> 15;
	for (unsigned i = 0; i < vq->num; i++) {
		struct vq_inflight_packed_desc *d = ifd(vq, (uint16_t)i);
		uint8_t st = READ_ONCE(d->inflight);
		uint16_t len = READ_ONCE(d->len), head = READ_ONCE(d->head);

		if (st == 2) {
			/* Being returned: its used descriptor goes at used_at
			 * (lap w).  That slot held one of our requests' available
			 * descriptors of lap w (AVAIL w, USED !w): still so, the
			 * store did not happen, it is in flight again and the
			 * used position is used_at.  USED == w: written (used
			 * in our lap, or the driver already took it and made the
			 * slot available in its next lap, AVAIL !w, USED w); the
			 * used position is past it, wherever the header got. */
			uint16_t at = READ_ONCE(d->used_at), apos2 = at & 0x7fff;
			bool w = at >> 15;
			bool u = READ_ONCE(vq->pdesc[apos2 < vq->num ? apos2 : 0].flags) &
				 VRING_PACKED_DESC_F_USED;

			if (len == 0 || len > vq->num || apos2 >= vq->num) {
				st = 0;
			} else if (u == w) {
				pos = apos2;
				wrap = w;
				ring_advance(vq, &pos, &wrap, len);
				st = 0;
			} else {
				pos = apos2;
				wrap = w;
				st = 1;
			}
			WRITE_ONCE(d->inflight, st);
		}
		if (st != 1)
			continue;
		if (len == 0 || len > vq->num || (head & 0x7fff) >= vq->num) {
			log_err("queue %u: in-flight entry %u is corrupt; not resubmitted",
				vq->index, i);
			WRITE_ONCE(d->inflight, 0);
			continue;
		}
		vq->resubmit[n] = (struct vq_resubmit){ .counter = READ_ONCE(d->counter),
			.id = (uint16_t)i, .head = head, .len = len };
		max_counter = MAX(max_counter, vq->resubmit[n].counter);
		n++;
	}
	WRITE_ONCE(r->used_idx, pos_wrap(pos, wrap));
	vq_resubmit_sort(vq, n);
	apos = pos;
	awrap = wrap;
	for (unsigned i = 0; i < n; i++) {
		unsigned len = vq->resubmit[i].len;

		total += len;
		if (total > vq->num) {
			log_err("queue %u: requests in flight cover more than the ring; "
				"region ignored", vq->index);
			vq->resubmit_n = 0;
			vq->inflight = NULL;
			return -EINVAL;
		}
		ring_advance(vq, &apos, &awrap, len);
	}
	vq->used_idx = pos;
	vq->used_wrap = wrap;
	vq->last_avail_idx = apos;
	vq->avail_wrap = awrap;
	vq->resubmit_n = n;
	vq->inflight_counter = max_counter + 1;
	if (n)
		log_info("queue %u: resubmitting %u requests left in flight; descriptors "
			 "resume at %u, used at %u", vq->index, n, apos, pos);
	return 0;
}

/* The next request a previous backend left in flight: walked again from
 * the region's copy of its descriptors (in the ring, used descriptors of
 * requests that completed before it may have overwritten them). */
static int resubmit_one(struct vq *vq, struct vq_elem *e)
{
	const struct vq_resubmit *s = &vq->resubmit[vq->resubmit_i++];
	struct vq_inflight_packed_desc *d = ifd(vq, s->id);
	uint16_t want = s->id, head = s->head, pos = head & 0x7fff, id;
	bool wrap = head >> 15, last_write = false;
	uint64_t last_addr = 0;
	uint32_t last_len = 0;
	const char *err = NULL;
	unsigned n = 0;
	int r = walk_list(vq, ring_copy(vq), NULL, e, &pos, &wrap, &n, &id, &err,
			  &last_addr, &last_len, &last_write);

	if (r == 0 || (r == 1 && (id != want || n != s->len))) {
		vq_set_broken(vq, "a request left in flight is no longer in the ring");
		return -EIO;
	}
	if (r < 0)
		return r;
	vq->chain_len[id] = (uint16_t)n;
	WRITE_ONCE(d->counter, vq->inflight_counter++);
	e->head = id;
	return vq_walk_end(vq, e, err, last_addr, last_len, last_write);
}

int vqp_pop(struct vq *vq, struct vq_elem *e)
{
	uint16_t pos = vq->last_avail_idx, head = pos_wrap(pos, vq->avail_wrap), id = 0;
	bool wrap = vq->avail_wrap, last_write = false;
	uint64_t last_addr = 0;
	uint32_t last_len = 0;
	const char *err = NULL;
	unsigned n = 0;
	int r;

	if (unlikely(vq->broken))
		return -EIO;
	if (unlikely(vq->resubmit_i < vq->resubmit_n))
		return resubmit_one(vq, e);
	r = walk_list(vq, vq->pdesc, vq->inflight ? ring_copy(vq) : NULL, e, &pos, &wrap,
		      &n, &id, &err, &last_addr, &last_len, &last_write);
	if (r <= 0)
		return r;
	/* The buffer id is the last descriptor's (2.8.6).  It names the
	 * request until it is used: it must be one the driver can have (we
	 * size per-id state by num, as the Linux driver numbers them) and
	 * not one already in flight, or its list length would be lost. */
	if (unlikely(id >= vq->num || vq->chain_len[id])) {
		vq_set_broken(vq, id >= vq->num ? "buffer id out of range" :
			      "buffer id already in flight");
		return -EIO;
	}
	vq->chain_len[id] = (uint16_t)n;
	vq->last_avail_idx = pos;
	vq->avail_wrap = wrap;
	if (vq->inflight)
		inflight_take(vq, id, head, n);
	e->head = id;
	return vq_walk_end(vq, e, err, last_addr, last_len, last_write);
}

/* Log a store of ours into guest memory (a used descriptor, the device
 * event area) at its own address: logging is on and the caller made the
 * store visible (smp_mb).  Request buffers are blk's (vq_log_write). */
static void log_store(struct vq *vq, const void *p, uint64_t len)
{
	gm_dirty_mark_host(vq->log.log, vq->mem, p, len);
	vq->log_kick = true;
}

void vqp_push(struct vq *vq, uint16_t id, uint32_t len)
{
	struct vring_packed_desc *u = &vq->pdesc[vq->used_idx];
	uint16_t flags = vq->used_wrap ? VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED : 0;
	unsigned n = id < vq->num ? vq->chain_len[id] : 0;

	if (unlikely(!n))	/* not an id vq_pop handed out: nothing to use */
		return;
	/* 2.8.4: WRITE in a used descriptor says the device wrote len bytes. */
	if (len)
		flags |= VRING_DESC_F_WRITE;
	/* In-flight tracking: "being returned" before the used descriptor,
	 * the header moved on and the entry cleared after it; a restart in
	 * between tells which side of the flags store we died on
	 * (vqp_inflight_init). */
	if (vq->inflight) {
		WRITE_ONCE(ifd(vq, id)->used_at, pos_wrap(vq->used_idx, vq->used_wrap));
		WRITE_ONCE(ifd(vq, id)->inflight, 2);
	}
	WRITE_ONCE(u->id, id);
	WRITE_ONCE(u->len, len);
	/* The driver reads id and len after it sees the flags. */
	smp_wmb();
	WRITE_ONCE(u->flags, flags);
	vq->chain_len[id] = 0;
	if (unlikely(vq->log.log)) {
		smp_mb();	/* the store visible before the bit test (dirty.h) */
		log_store(vq, u, sizeof(*u));
	}
	vq->used_idx += n;
	if (vq->used_idx >= vq->num) {
		vq->used_idx -= vq->num;
		vq->used_wrap = !vq->used_wrap;
	}
	vq->since_signal += n;
	if (vq->inflight) {
		WRITE_ONCE(vq->inflight->used_idx, pos_wrap(vq->used_idx, vq->used_wrap));
		WRITE_ONCE(ifd(vq, id)->inflight, 0);
	}
}

/*
 * 2.8.10 "Driver and Device Event Suppression", used buffer side: the
 * driver's area says ENABLE, DISABLE, or (EVENT_IDX) DESC: notify once the
 * descriptor at off_wrap is used (vring_packed_need_event).
 */
bool vqp_should_notify(struct vq *vq)
{
	unsigned n = vq->since_signal;
	uint16_t flags;

	/* Pairs with the driver's barrier between writing its event area
	 * and re-reading the ring. */
	smp_mb();
	vq->since_signal = 0;
	flags = READ_ONCE(vq->driver_event->flags) & 3;
	if (flags != VRING_PACKED_EVENT_F_DESC || !vq->event_idx)
		return flags != VRING_PACKED_EVENT_F_DISABLE;
	if (unlikely(!vq->signalled_used_valid)) {
		vq->signalled_used_valid = true;
		return true;
	}
	if (n == 0)
		return false;
	if (n >= vq->num)	/* a whole lap: the event is in it */
		return true;
	return vring_packed_need_event(READ_ONCE(vq->driver_event->off_wrap), vq->used_idx,
				       vq->used_wrap, vq->num, n);
}

static __cold void log_device_event(struct vq *vq)
{
	log_store(vq, vq->device_event, sizeof(*vq->device_event));
}

/* 2.8.10, available buffer side: our area. */
void vqp_disable_notify(struct vq *vq)
{
	if (vq->notify_disabled)
		return;
	vq->notify_disabled = true;
	WRITE_ONCE(vq->device_event->flags, VRING_PACKED_EVENT_F_DISABLE);
	if (unlikely(vq->log.log)) {
		smp_mb();
		log_device_event(vq);
	}
}

bool vqp_enable_notify(struct vq *vq)
{
	vq->notify_disabled = false;
	if (vq->event_idx) {
		/* Kick when the next descriptor we would take is made
		 * available: its position and the wrap counter it will carry. */
		WRITE_ONCE(vq->device_event->off_wrap,
			   (uint16_t)(vq->last_avail_idx |
				      (vq->avail_wrap ? VRING_PACKED_EVENT_WRAP : 0)));
		smp_wmb();
		WRITE_ONCE(vq->device_event->flags, VRING_PACKED_EVENT_F_DESC);
	} else {
		WRITE_ONCE(vq->device_event->flags, VRING_PACKED_EVENT_F_ENABLE);
	}
	/* Pairs with the driver's barrier between making descriptors
	 * available and reading our area: either it sees kicks on, or we see
	 * its descriptor here. */
	smp_mb();
	if (unlikely(vq->log.log))
		log_device_event(vq);
	return vqp_avail_pending(vq);
}
