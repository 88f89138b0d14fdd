/*
 * The driver half of a packed virtqueue (virtio 1.2, 2.8), for vblk-bench
 * --packed: vdrv.c's queue operations call here when q->packed.
 *
 * The ring is vdrv.c's descriptor area read as packed descriptors, the
 * driver event area its avail area, the device event area its used area
 * (each at least as large and as aligned as packed needs).  A request with
 * an even id and up to VDRV_PACKED_DIRECT buffers is a list of that many
 * ring descriptors; any other is one descriptor pointing at the request's
 * indirect table: every run exercises both ways a device must read.  Buffer ids are the split
 * side's heads (< num); slots[id] is how many ring descriptors the request
 * took, which the used descriptor's position moves on by.
 */
#include "driver/vdrv_internal.h"

#include <errno.h>

#include "util/barrier.h"
#include "util/sys.h"

#define VDRV_PACKED_DIRECT 4

static inline uint16_t desc_flags(bool wrap)
{
	/* 2.8.1: AVAIL as the driver's wrap counter, USED its inverse. */
	return wrap ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED;
}

int vdrv__packed_add(struct vdrv_queue *q, const struct iovec *out, unsigned nout,
		     const struct iovec *in, unsigned nin, void *cookie)
{
	struct vring_packed_desc *ring = (struct vring_packed_desc *)q->desc;
	unsigned n = nout + nin, slots;
	uint16_t id, pos = q->avail_idx, first_flags = 0;
	bool wrap = q->avail_wrap;

	if (!q->nfree)
		return -ENOSPC;
	id = q->free_heads[q->nfree - 1];
	slots = n <= VDRV_PACKED_DIRECT && !(id & 1) ? n : 1;
	if (q->slots_free < slots)
		return -ENOSPC;
	for (unsigned i = 0; i < n; i++) {
		const struct iovec *v = i < nout ? &out[i] : &in[i - nout];

		if (!vdrv_in_mem(q->d, v->iov_base, v->iov_len))
			return -EINVAL;
	}
	q->nfree--;
	if (slots == 1 && n > 1) {
		struct vring_packed_desc *t =
			(struct vring_packed_desc *)(q->ind + (size_t)id * VDRV_MAX_SEGS);

		for (unsigned i = 0; i < n; i++) {
			const struct iovec *v = i < nout ? &out[i] : &in[i - nout];

			t[i].addr = vdrv_gpa(q->d, v->iov_base);
			t[i].len = (uint32_t)v->iov_len;
			t[i].id = 0;
			t[i].flags = i >= nout ? VRING_DESC_F_WRITE : 0;
		}
		ring[pos].addr = vdrv_gpa(q->d, t);
		ring[pos].len = n * sizeof(*t);
		ring[pos].id = id;
		first_flags = VRING_DESC_F_INDIRECT | desc_flags(wrap);
	} else {
		for (unsigned i = 0; i < n; i++) {
			const struct iovec *v = i < nout ? &out[i] : &in[i - nout];
			uint16_t f = (i >= nout ? VRING_DESC_F_WRITE : 0) |
				     (i + 1 < n ? VRING_DESC_F_NEXT : 0) |
				     desc_flags(wrap);
			uint16_t p = (uint16_t)((pos + i) % q->num);

			ring[p].addr = vdrv_gpa(q->d, v->iov_base);
			ring[p].len = (uint32_t)v->iov_len;
			ring[p].id = id;
			if (i == 0) {
				first_flags = f;
			} else {
				/* The rest of the list may be visible before
				 * its first descriptor, never after. */
				WRITE_ONCE(ring[p].flags, f);
			}
			if (p + 1 == (int)q->num)
				wrap = !wrap;
		}
	}
	/* 2.8.21.1: the list before its first descriptor's flags. */
	smp_wmb();
	WRITE_ONCE(ring[pos].flags, first_flags);
	q->avail_idx = (uint16_t)((pos + slots) % q->num);
	if (pos + slots >= q->num)
		q->avail_wrap = !q->avail_wrap;
	q->slots[id] = (uint16_t)slots;
	q->slots_free -= slots;
	q->added += slots;
	q->cookies[id] = cookie;
	return 0;
}

/* 2.8.10, available buffer side: the device's area says ENABLE, DISABLE,
 * or (EVENT_IDX) DESC at its off_wrap, tested over what we made available
 * since the last kick, as Linux's virtqueue_kick_prepare_packed does. */
void vdrv__packed_kick(struct vdrv_queue *q)
{
	const struct vring_packed_event *ev = (const struct vring_packed_event *)q->used;
	uint16_t added = q->added, flags;
	bool kick;

	if (!added)
		return;
	q->added = 0;
	/* Pairs with the device's full barrier in vqp_enable_notify. */
	smp_mb();
	flags = READ_ONCE(ev->flags) & 3;
	if (flags == VRING_PACKED_EVENT_F_DESC && q->event_idx)
		kick = vring_packed_need_event(READ_ONCE(ev->off_wrap), q->avail_idx,
					       q->avail_wrap, q->num, added);
	else
		kick = flags != VRING_PACKED_EVENT_F_DISABLE;
	if (kick) {
		q->kicks++;
		(void)sys_eventfd_signal(q->kick_fd);
	} else {
		q->kicks_suppressed++;
	}
}

/* A used descriptor at our next position: both flags equal our copy of
 * the device's wrap counter (2.8.1). */
bool vdrv__packed_pending(struct vdrv_queue *q)
{
	const struct vring_packed_desc *d = &((const struct vring_packed_desc *)q->desc)[q->last_used];
	uint16_t f = READ_ONCE(d->flags);

	return !!(f & VRING_PACKED_DESC_F_USED) == q->used_wrap &&
	       !!(f & VRING_PACKED_DESC_F_AVAIL) == q->used_wrap;
}

void *vdrv__packed_get(struct vdrv_queue *q, uint32_t *len)
{
	const struct vring_packed_desc *d = &((const struct vring_packed_desc *)q->desc)[q->last_used];
	uint16_t id, n;
	void *cookie;

	if (!vdrv__packed_pending(q))
		return NULL;
	/* Pairs with the device's write barrier before the flags. */
	smp_rmb();
	id = READ_ONCE(d->id);
	if (len)
		*len = READ_ONCE(d->len);
	/* The device is not trusted either: an id we did not hand out is
	 * counted and stepped over (one slot: where the next is, we cannot
	 * know). */
	n = id < q->num && q->cookies[id] ? q->slots[id] : 1;
	q->last_used = (uint16_t)(q->last_used + n);
	if (q->last_used >= q->num) {
		q->last_used = (uint16_t)(q->last_used - q->num);
		q->used_wrap = !q->used_wrap;
	}
	if (id >= q->num || !q->cookies[id]) {
		q->bad_used++;
		return vdrv__packed_get(q, len);
	}
	cookie = q->cookies[id];
	q->cookies[id] = NULL;
	q->slots_free += n;
	q->free_heads[q->nfree++] = id;
	return cookie;
}

void vdrv__packed_disable_cb(struct vdrv_queue *q)
{
	struct vring_packed_event *ev = (struct vring_packed_event *)q->avail;

	WRITE_ONCE(ev->flags, VRING_PACKED_EVENT_F_DISABLE);
}

bool vdrv__packed_enable_cb(struct vdrv_queue *q)
{
	struct vring_packed_event *ev = (struct vring_packed_event *)q->avail;

	if (q->event_idx) {
		/* Interrupt when the device uses the descriptor at our next
		 * position, in the lap our wrap counter says. */
		WRITE_ONCE(ev->off_wrap, (uint16_t)(q->last_used |
						     (q->used_wrap ? VRING_PACKED_EVENT_WRAP : 0)));
		smp_wmb();
		WRITE_ONCE(ev->flags, VRING_PACKED_EVENT_F_DESC);
	} else {
		WRITE_ONCE(ev->flags, VRING_PACKED_EVENT_F_ENABLE);
	}
	/* Pairs with the device's full barrier in vqp_should_notify. */
	smp_mb();
	return vdrv__packed_pending(q);
}
