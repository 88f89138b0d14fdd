/*
 * vq_: the device side of a split virtqueue, against a hostile driver.
 *
 * Every guest-written field is read once into a local and validated before
 * use: head < num, next < num, hop count <= table size (loops), avail index
 * never ahead by more than num, indirect tables a nonzero multiple of 16
 * bytes and never nested, every buffer inside one guest memory region,
 * readable descriptors before writable ones.  A corrupt ring marks the
 * queue broken (logged once, never processed again until restarted); a bad
 * descriptor chain fails only that request.
 *
 * Threading: a struct vq belongs to one iothread once started; every
 * function here is called on that thread only.
 */
#ifndef VBLK_VQ_H
#define VBLK_VQ_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "mem/gm.h"
#include "virtio/virtio_ring.h"

/* Descriptors per request, direct and indirect together.  Advertised to
 * the guest as seg_max = VQ_MAX_SEGS - 2 (header and status). */
#define VQ_MAX_SEGS 256

/* Ring placement and start state, as given by SET_VRING_NUM/ADDR/BASE. */
struct vq_config {
	unsigned index;		/* for log lines */
	unsigned num;
	uint64_t desc_qva, avail_qva, used_qva;	/* frontend virtual addresses */
	uint16_t last_avail_idx;
	bool event_idx;		/* VIRTIO_RING_F_EVENT_IDX negotiated */
	bool indirect;		/* VIRTIO_RING_F_INDIRECT_DESC negotiated */
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

	bool broken;
	bool logged_bad_chain;
	uint64_t bad_chains;
};

/*
 * Translate the ring addresses through mem and reset shadow state.
 * num must be a power of two <= VRING_MAX_NUM; each ring part must lie in
 * one region and be aligned as 2.7 requires.  Returns 0 or -EINVAL.
 */
int vq_init(struct vq *vq, const struct vq_config *cfg, const struct gm_table *mem);

/*
 * Take the next available request.
 * Returns 1 with *e filled; 0 if the ring is empty; -EIO if the ring is
 * corrupt (queue now broken); -EINVAL if this chain is bad: e->head and
 * e->last_byte are valid and the caller must still complete e->head
 * (vq_push) so the driver gets it back.
 */
int vq_pop(struct vq *vq, struct vq_elem *e);

/* Return a request to the driver with len bytes written.  Becomes visible
 * at the next vq_flush(). */
void vq_push(struct vq *vq, uint16_t head, uint32_t len);

/* Publish pushed entries (used->idx). */
void vq_flush(struct vq *vq);

/*
 * After vq_flush(): does the driver want an interrupt for what was
 * published since the last one?  EVENT_IDX: vring_need_event over the whole
 * batch; otherwise the driver's NO_INTERRUPT flag.
 */
bool vq_should_notify(struct vq *vq);

/* Ask the driver not to kick (best effort; EVENT_IDX has no "off"). */
void vq_disable_notify(struct vq *vq);

/*
 * Ask for kicks again, then re-check the ring.  Returns true if buffers
 * arrived that we have not taken: the caller must process them, since
 * the driver may have skipped the kick for them.
 */
bool vq_enable_notify(struct vq *vq);

/* True if the driver published buffers we have not taken (no barrier;
 * for polling). */
bool vq_avail_pending(struct vq *vq);

/* Mark the queue broken and log why, once. */
void vq_set_broken(struct vq *vq, const char *why);

#endif
