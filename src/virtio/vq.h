/*
 * vq_: the device side of a virtqueue, split (virtio 1.2, 2.7) or packed
 * (2.8), against a hostile driver.
 *
 * Layered as Linux's virtio_ring.c: this header's entry points and vq.c
 * are the one face, and pick the format; below them the split half
 * (vq_split.c) and the packed half (vq_packed.c); below both what they
 * share (vq_common.c, vq_internal.h).  Calls go down only: nothing below
 * the face calls a function defined in this header or in vq.c.
 *
 * Every guest-written field is read once into a local and validated before
 * use: head < num, next < num, hop count <= table size (loops), avail index
 * never ahead by more than num, indirect tables a nonzero multiple of 16
 * bytes and never nested, every buffer inside one guest memory region,
 * readable descriptors before writable ones.  A corrupt ring marks the
 * queue broken (logged once, never processed again until restarted); a bad
 * descriptor chain fails only that request.  Packed rings add: a chain
 * never longer than the ring, every descriptor of it available, buffer
 * ids below num and never in flight twice.
 *
 * Threading: a struct vq belongs to one iothread once started; every
 * function here is called on that thread only.
 */
#ifndef VBLK_VQ_H
#define VBLK_VQ_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "util/barrier.h"
#include "util/compiler.h"

#include "mem/dirty.h"
#include "mem/gm.h"
#include "virtio/virtio_ring.h"

/* Descriptors per request, direct and indirect together.  Advertised to
 * the guest as seg_max = VQ_MAX_SEGS - 2 (header and status). */
#define VQ_MAX_SEGS 256

/*
 * In-flight tracking region of one queue, shared with the frontend so that
 * a restarted backend can resubmit what a dead one had taken: qemu
 * docs/interop/vhost-user.rst "Inflight I/O tracking", split virtqueue
 * layout.  The frontend keeps the memory across our restarts; it is
 * hostile like the rings (every index read from it is checked).
 */
struct vq_inflight_desc {
	uint8_t inflight;	/* head taken, not yet returned */
	uint8_t padding[5];
	uint16_t next;		/* last batch of used heads */
	uint64_t counter;	/* order heads were taken in */
};

struct vq_inflight_region {
	uint64_t features;
	uint16_t version;	/* 1; 0 means never initialized */
	uint16_t desc_num;
	uint16_t last_batch_head;
	uint16_t used_idx;	/* used->idx once the last batch was cleared */
	struct vq_inflight_desc desc[];
};

STATIC_ASSERT(sizeof(struct vq_inflight_desc) == 16, "inflight desc");

/*
 * The same region on a packed ring (version 2; vq_packed.c): entries by
 * buffer id, then (vq_inflight_region_size_packed) a copy of the ring's
 * descriptors as each request took them; the header's used_idx is the next
 * used position | used wrap << 15, updated after every used descriptor.
 * Not the spec's packed layout (which mirrors the driver's free list): a
 * packed ring's positions are nowhere in guest memory, and used
 * descriptors overwrite the ring slots of requests still in flight, so what
 * a restarted backend needs is each request's descriptors, their position
 * and count, and where the next used descriptor goes; the next to take
 * follows.
 */
struct vq_inflight_packed_desc {
	uint8_t inflight;	/* 1 in flight, 2 being returned, 0 free */
	uint8_t padding;
	uint16_t len;		/* ring descriptors the request took */
	uint16_t head;		/* its first descriptor: position | avail wrap << 15 */
	uint16_t used_at;	/* being returned: where its used descriptor goes */
	uint64_t counter;	/* order taken in */
};
STATIC_ASSERT(sizeof(struct vq_inflight_packed_desc) == 16, "packed inflight desc");
STATIC_ASSERT(sizeof(struct vq_inflight_region) == 16, "inflight region header");

/* Bytes of one queue's region, as we lay them out (64-byte aligned). */
static inline uint64_t vq_inflight_region_size(unsigned num)
{
	return (16 + 16ull * num + 63) & ~63ull;
}

/* With room for a packed ring too: after the num entries, a copy of each
 * ring descriptor a request in flight took (vq_packed.c), since on a packed
 * ring the used descriptors of other requests overwrite them.  What vblkd
 * creates (GET_INFLIGHT_FD); a region of the smaller size (from an older
 * vblkd) still tracks split rings. */
static inline uint64_t vq_inflight_region_size_packed(unsigned num)
{
	return (16 + 32ull * num + 63) & ~63ull;
}

/*
 * Dirty logging of one ring (vhost-user.rst "Migration").  With log set,
 * every store the device makes into guest memory through this queue is
 * marked in it after the store: request buffers (blk, through
 * vq_log_write) and, with used set, every used-ring store (elements, idx,
 * flags, avail_event), logged at used_gpa + its offset in the used ring,
 * as VHOST_VRING_F_LOG and log_guest_addr of SET_VRING_ADDR ask.
 */
struct vq_log {
	struct gm_dirty_log *log;	/* NULL: logging off */
	bool used;			/* VHOST_VRING_F_LOG */
	uint64_t used_gpa;		/* log_guest_addr */
};

/* Ring placement and start state, as given by SET_VRING_NUM/ADDR/BASE. */
struct vq_config {
	unsigned index;		/* for log lines */
	unsigned num;
	/* Frontend virtual addresses: split desc/avail/used; packed: the
	 * descriptor ring, the driver event area, the device event area. */
	uint64_t desc_qva, avail_qva, used_qva;
	/* Split: the next avail index.  Packed: the next descriptor's ring
	 * position | avail wrap counter << 15 (QEMU's encoding of the low
	 * half of SET_VRING_BASE). */
	uint16_t last_avail_idx;
	bool packed;		/* VIRTIO_F_RING_PACKED negotiated */
	uint16_t used_idx;	/* packed: position | used wrap << 15 (the high half) */
	bool event_idx;		/* VIRTIO_RING_F_EVENT_IDX negotiated */
	bool indirect;		/* VIRTIO_RING_F_INDIRECT_DESC negotiated */
	/* INFLIGHT_SHMFD: this queue's region (vq_inflight_region_size(num)
	 * bytes), or NULL. */
	struct vq_inflight_region *inflight;
	bool inflight_packed_room;	/* it is vq_inflight_region_size_packed(num) */
	struct vq_log log;
};

/* One request popped from the ring.  iov[0..out_num) are device-readable,
 * iov[out_num..out_num+in_num) device-writable. */
struct vq_elem {
	uint16_t head;
	unsigned out_num, in_num;
	uint64_t out_len, in_len;
	struct iovec *iov;	/* caller-provided, VQ_MAX_SEGS entries */
	/* Bad chains only: last byte of the chain's final descriptor if that
	 * descriptor is device-writable and inside guest memory, so a device
	 * can still report an error status there; else NULL. */
	uint8_t *last_byte;
};

struct vq {
	/* Fixed while started. */
	unsigned index;
	unsigned num;
	struct vring_desc *desc;
	struct vring_avail *avail;
	struct vring_used *used;
	uint16_t *used_event;	/* &avail->ring[num] */
	uint16_t *avail_event;	/* (uint16_t *)&used->ring[num] */
	const struct gm_table *mem;
	bool event_idx, indirect;

	/* Shadow state, never re-read from the guest. */
	uint16_t last_avail_idx;	/* next avail slot we take */
	uint16_t shadow_avail_idx;	/* last avail->idx we validated */
	uint16_t used_idx;		/* next used slot we fill */
	uint16_t signalled_used;	/* used_idx at our last notification */
	bool signalled_used_valid;
	bool notify_disabled;

	bool broken;			/* READ_ONCE from other threads (vq_is_broken) */
	bool logged_bad_chain;
	uint64_t bad_chains;

	/* In-flight tracking (NULL without INFLIGHT_SHMFD). */
	struct vq_inflight_region *inflight;
	uint64_t inflight_counter;
	unsigned batch_n;		/* heads pushed since the last flush */
	/* What a previous backend left in flight, as read once from the
	 * region when the queue started (the frontend can rewrite the region
	 * at any time: nothing is read from it again), oldest first. */
	struct vq_resubmit {
		uint64_t counter;
		uint16_t id;		/* split: the head; packed: the buffer id */
		uint16_t head;		/* packed: first descriptor (pos | wrap << 15) */
		uint16_t len;		/* packed: descriptors in the list */
	} *resubmit;
	unsigned resubmit_n, resubmit_i;

	/* Packed rings (vq_packed.c): last_avail_idx, used_idx and
	 * signalled_used are ring positions (< num), with wrap counters. */
	bool packed;
	bool avail_wrap, used_wrap;
	struct vring_packed_desc *pdesc;
	const struct vring_packed_event *driver_event;	/* guest-written */
	struct vring_packed_event *device_event;	/* ours */
	uint16_t *chain_len;		/* by buffer id: descriptors taken, 0 = free */
	unsigned since_signal;		/* descriptors used since the last notify check */

	/* Dirty logging (log.log NULL: off). */
	struct vq_log log;
	uint16_t log_used_idx;		/* used entries below this are logged */
	bool log_kick;			/* marked since the last vq_log_kick */
};

/*
 * Translate the ring addresses through mem and reset shadow state.
 * num must be a power of two <= VRING_MAX_NUM; each ring part must lie in
 * one region and be aligned as 2.7 requires.  With an in-flight region
 * that a previous backend filled, the requests it left in flight are
 * queued for resubmission (vq_pop returns them first, in the order they
 * were taken) and last_avail_idx becomes used->idx + their number.
 * Returns 0, -EINVAL or -ENOMEM.  vq_release() frees what init allocated.
 */
int vq_init(struct vq *vq, const struct vq_config *cfg, const struct gm_table *mem);
void vq_release(struct vq *vq);

/* Where the ring stands, for GET_VRING_BASE: split, the next avail index;
 * packed, QEMU's 32-bit encoding (position | wrap << 15 of the next
 * descriptor to take, and the same of the next to use << 16). */
uint32_t vq_base(const struct vq *vq);

/*
 * The per-request work of each format, below the vq_ functions that follow
 * (which pick one): the split half (vq_split.c, virtio 1.2, 2.7) and the
 * packed half (vq_packed.c, 2.8).  Declared here only so that the choice
 * is inlined into the caller: each vq_ call below is one call, straight
 * into its half.  Call the vq_ functions, not these.
 */
int vqs_pop(struct vq *vq, struct vq_elem *e);
int vqp_pop(struct vq *vq, struct vq_elem *e);
void vqs_push(struct vq *vq, unsigned head, uint32_t len);	/* head < num */
void vqp_push(struct vq *vq, uint16_t id, uint32_t len);
void vqs_flush(struct vq *vq);
bool vqs_should_notify(struct vq *vq);
bool vqp_should_notify(struct vq *vq);
void vqs_disable_notify(struct vq *vq);
void vqp_disable_notify(struct vq *vq);
bool vqs_enable_notify(struct vq *vq);
bool vqp_enable_notify(struct vq *vq);
bool vqs_avail_pending(struct vq *vq);
bool vqp_avail_pending(struct vq *vq);

/*
 * Take the next available request.
 * Returns 1 with *e filled; 0 if the ring is empty; -EIO if the ring is
 * corrupt (queue now broken); -EINVAL if this chain is bad: e->head and
 * e->last_byte are valid and the caller must still complete e->head
 * (vq_push) so the driver gets it back.
 */
static inline int vq_pop(struct vq *vq, struct vq_elem *e)
{
	if (unlikely(vq->broken))
		return -EIO;
	if (vq->packed)
		return vqp_pop(vq, e);
	return vqs_pop(vq, e);
}

/* Return a request to the driver with len bytes written.  Becomes visible
 * at the next vq_flush(). */
static inline void vq_push(struct vq *vq, uint16_t head, uint32_t len)
{
	if (vq->packed)
		vqp_push(vq, head, len);
	else
		vqs_push(vq, head, len);
}

/* Publish pushed entries (used->idx). */
static inline void vq_flush(struct vq *vq)
{
	/* Packed: each used descriptor was published as it was written. */
	if (!vq->packed)
		vqs_flush(vq);
}

/*
 * After vq_flush(): does the driver want an interrupt for what was
 * published since the last one?  EVENT_IDX: vring_need_event over the whole
 * batch; otherwise the driver's NO_INTERRUPT flag.
 */
static inline bool vq_should_notify(struct vq *vq)
{
	if (vq->packed)
		return vqp_should_notify(vq);
	return vqs_should_notify(vq);
}

/* EVENT_IDX only, no barrier, changes nothing: does the driver's used_event
 * already lie among the entries pushed since the last notification?  A
 * cheap hint for notifying early; vq_should_notify stays the decision. */
static inline bool vq_notify_wanted(const struct vq *vq)
{
	if (unlikely(vq->packed))
		return vq->event_idx && vq->signalled_used_valid &&
		       vq->since_signal && vq->since_signal < vq->num &&
		       (READ_ONCE(vq->driver_event->flags) & 3) == VRING_PACKED_EVENT_F_DESC &&
		       vring_packed_need_event(READ_ONCE(vq->driver_event->off_wrap),
					       vq->used_idx, vq->used_wrap, vq->num,
					       vq->since_signal);
	return vq->event_idx && vq->signalled_used_valid &&
	       vring_need_event(READ_ONCE(*vq->used_event), vq->used_idx,
				vq->signalled_used);
}

/* Ask the driver not to kick (best effort; EVENT_IDX has no "off"). */
static inline void vq_disable_notify(struct vq *vq)
{
	if (vq->packed)
		vqp_disable_notify(vq);
	else
		vqs_disable_notify(vq);
}

/*
 * Ask for kicks again, then re-check the ring.  Returns true if buffers
 * arrived that we have not taken: the caller must process them, since
 * the driver may have skipped the kick for them.
 */
static inline bool vq_enable_notify(struct vq *vq)
{
	if (vq->packed)
		return vqp_enable_notify(vq);
	return vqs_enable_notify(vq);
}

/* True if the driver published buffers we have not taken (no barrier;
 * for polling). */
static inline bool vq_avail_pending(struct vq *vq)
{
	if (vq->packed)
		return vqp_avail_pending(vq);
	return vqs_avail_pending(vq);
}

/* Requests the in-flight region handed back that vq_pop has not returned
 * yet (it returns them before anything new).  vq_base already counts
 * them as taken. */
static inline unsigned vq_resubmit_left(const struct vq *vq)
{
	return vq->resubmit_n - vq->resubmit_i;
}

/* Switch dirty logging (see struct vq_log) on, off or to another log,
 * between two batches.  Stores made before this call are not logged: the
 * frontend copies every page after it turns logging on. */
void vq_set_log(struct vq *vq, const struct vq_log *lg);

/*
 * Log a device store into a request buffer (host [p, p+len), inside
 * guest memory as every popped buffer is).  No-op with logging off.  The
 * caller makes its stores visible first: one smp_mb() after the last
 * store, before a group of vq_log_write calls.
 */
static inline void vq_log_write(struct vq *vq, const void *p, uint64_t len)
{
	if (vq->log.log) {
		gm_dirty_mark_host(vq->log.log, vq->mem, p, len);
		vq->log_kick = true;
	}
}

/* End of a batch: tell the frontend the log changed, if it asked to be
 * told (SET_LOG_FD) and we marked something since the last kick. */
void vq_log_kick(struct vq *vq);

/* Mark the queue broken and log why, once. */
void vq_set_broken(struct vq *vq, const char *why);

/* Whether the queue is broken, from any thread (the control plane asks,
 * for the device status's NEEDS_RESET). */
static inline bool vq_is_broken(const struct vq *vq)
{
	return READ_ONCE(vq->broken);
}

#endif
