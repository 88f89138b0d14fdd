/*
 * The device side of a packed virtqueue (virtio 1.2, 2.8 "Packed
 * Virtqueues"), against a hostile driver.  vq.c's entry points call here
 * when the ring is packed; the contract is vq.h's.
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

#include "util/barrier.h"
#include "util/log.h"

static inline bool desc_avail(uint16_t flags, bool wrap)
{
	return !!(flags & VRING_PACKED_DESC_F_AVAIL) == wrap &&
	       !!(flags & VRING_PACKED_DESC_F_USED) != wrap;
}

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
	if (avail != used || vq->avail_wrap != vq->used_wrap)
		log_warn("queue %u: packed ring starts with descriptors %u..%u taken and "
			 "never used (a backend died with requests in flight?); they are "
			 "not resubmitted", vq->index, used, avail);
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

int vqp_pop(struct vq *vq, struct vq_elem *e)
{
	uint16_t pos = vq->last_avail_idx, flags, id;
	bool wrap = vq->avail_wrap, seen_write = false, last_write = false;
	uint64_t last_addr = 0;
	uint32_t last_len = 0;
	const char *err = NULL;
	unsigned n = 0, niov = 0;

	if (unlikely(vq->broken))
		return -EIO;
	flags = READ_ONCE(vq->pdesc[pos].flags);
	if (!desc_avail(flags, wrap))
		return 0;
	/* Pairs with the driver's barrier before it flips the first
	 * descriptor's flags (2.8.21.1): the list is read only after. */
	smp_rmb();

	e->out_num = e->in_num = 0;
	e->out_len = e->in_len = 0;
	e->last_byte = NULL;
	for (;;) {
		const struct vring_packed_desc *s = &vq->pdesc[pos];
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
		n++;
		if (++pos == vq->num) {
			pos = 0;
			wrap = !wrap;
		}
		if (flags & VRING_DESC_F_INDIRECT) {
			walk_indirect(vq, e, addr, len, n == 1 && !(flags & VRING_DESC_F_NEXT),
				      &niov, &seen_write, &err, &last_addr, &last_len,
				      &last_write);
		} else {
			last_write = flags & VRING_DESC_F_WRITE;
			vq_add_buf(vq, e, addr, len, last_write, &niov, &seen_write, &err);
			last_addr = addr;
			last_len = len;
		}
		if (!(flags & VRING_DESC_F_NEXT))
			break;
		/* 2.8.7.1: a list no longer than the ring. */
		if (unlikely(n == vq->num)) {
			vq_set_broken(vq, "descriptor list longer than the ring");
			return -EIO;
		}
	}
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
	e->head = id;
	return vq_walk_end(vq, e, err, last_addr, last_len, last_write);
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
	WRITE_ONCE(u->id, id);
	WRITE_ONCE(u->len, len);
	/* The driver reads id and len after it sees the flags. */
	smp_wmb();
	WRITE_ONCE(u->flags, flags);
	vq->chain_len[id] = 0;
	if (unlikely(vq->log.log)) {
		smp_mb();	/* the store visible before the bit test (dirty.h) */
		vq_log_write(vq, u, sizeof(*u));
	}
	vq->used_idx += n;
	if (vq->used_idx >= vq->num) {
		vq->used_idx -= vq->num;
		vq->used_wrap = !vq->used_wrap;
	}
	vq->since_signal += n;
}

/*
 * 2.8.10 "Driver and Device Event Suppression", used buffer side: the
 * driver's area says ENABLE, DISABLE, or (EVENT_IDX) DESC: notify once the
 * descriptor at off_wrap is used (vqp_event_in).
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
	return vqp_event_in(vq, n);
}

static __cold void log_device_event(struct vq *vq)
{
	vq_log_write(vq, vq->device_event, sizeof(*vq->device_event));
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
