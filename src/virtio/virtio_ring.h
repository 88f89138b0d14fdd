/*
 * Virtqueue wire layouts, written from virtio 1.2 sections 2.7 "Split
 * Virtqueues" and 2.8 "Packed Virtqueues".  All fields little-endian (we build only for
 * little-endian hosts, see util/compiler.h).  Sizes pinned below.
 */
#ifndef VBLK_VIRTIO_RING_H
#define VBLK_VIRTIO_RING_H

#include <stdbool.h>
#include <stdint.h>

#include "util/compiler.h"

/* Feature bits (virtio 1.2, 6 "Reserved Feature Bits"). */
#define VIRTIO_RING_F_INDIRECT_DESC 28
#define VIRTIO_RING_F_EVENT_IDX     29
#define VIRTIO_F_VERSION_1          32
#define VIRTIO_F_RING_PACKED        34

/* 2.7.5 "The Virtqueue Descriptor Table" */
#define VRING_DESC_F_NEXT     1
#define VRING_DESC_F_WRITE    2
#define VRING_DESC_F_INDIRECT 4

struct vring_desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
	uint16_t next;
};

/* 2.7.6 "The Virtqueue Available Ring"; used_event follows ring[num]. */
#define VRING_AVAIL_F_NO_INTERRUPT 1
struct vring_avail {
	uint16_t flags;
	uint16_t idx;
	uint16_t ring[];
};

/* 2.7.8 "The Virtqueue Used Ring"; avail_event follows ring[num]. */
#define VRING_USED_F_NO_NOTIFY 1
struct vring_used_elem {
	uint32_t id;
	uint32_t len;
};
struct vring_used {
	uint16_t flags;
	uint16_t idx;
	struct vring_used_elem ring[];
};

STATIC_ASSERT(sizeof(struct vring_desc) == 16, "vring_desc is 16 bytes");
STATIC_ASSERT(offsetof(struct vring_desc, next) == 14, "vring_desc.next");
STATIC_ASSERT(sizeof(struct vring_avail) == 4, "vring_avail header");
STATIC_ASSERT(sizeof(struct vring_used_elem) == 8, "vring_used_elem");
STATIC_ASSERT(sizeof(struct vring_used) == 4, "vring_used header");

/* 2.7 "Split Virtqueues": queue size is a power of 2, at most 32768. */
#define VRING_MAX_NUM 32768u

static inline uint64_t vring_desc_bytes(unsigned num)
{
	return 16ull * num;
}
static inline uint64_t vring_avail_bytes(unsigned num)
{
	return 4 + 2ull * num + 2;	/* + used_event */
}
static inline uint64_t vring_used_bytes(unsigned num)
{
	return 4 + 8ull * num + 2;	/* + avail_event */
}

/* 2.8.13 "The Virtqueue Descriptor Format" (packed): one ring of these;
 * the driver makes one available by flipping AVAIL/USED against its wrap
 * counter (2.8.1), the device marks it used the same way with its own. */
#define VRING_PACKED_DESC_F_AVAIL (1u << 7)
#define VRING_PACKED_DESC_F_USED  (1u << 15)
struct vring_packed_desc {
	uint64_t addr;
	uint32_t len;
	uint16_t id;
	uint16_t flags;
};

/* 2.8.14 "Event Suppression Structure Format": the driver area (read by
 * the device: used buffer notifications) and the device area (written by
 * the device: available buffer notifications). */
#define VRING_PACKED_EVENT_F_ENABLE  0
#define VRING_PACKED_EVENT_F_DISABLE 1
#define VRING_PACKED_EVENT_F_DESC    2	/* at off_wrap; EVENT_IDX only */
#define VRING_PACKED_EVENT_WRAP      (1u << 15)
struct vring_packed_event {
	uint16_t off_wrap;	/* bits 0-14 offset, 15 wrap counter */
	uint16_t flags;
};

STATIC_ASSERT(sizeof(struct vring_packed_desc) == 16, "packed desc is 16 bytes");
STATIC_ASSERT(sizeof(struct vring_packed_event) == 4, "packed event area");

/*
 * virtio 1.2, 2.7.7.2 / 2.7.10: "notify if the event index lies in
 * (old, new]", with 16-bit wrap-around.  Same predicate both ways
 * (used_event for interrupts, avail_event for kicks).
 */
static inline int vring_need_event(uint16_t event_idx, uint16_t new_idx,
				   uint16_t old_idx)
{
	return (uint16_t)(new_idx - event_idx - 1) < (uint16_t)(new_idx - old_idx);
}

/*
 * The same on a packed ring (2.8.10, EVENT_IDX, flags DESC): has our side,
 * now at ring position new_idx with wrap counter wrap and n < num
 * positions past the last check, passed the descriptor the other side
 * names in off_wrap?  Positions are < num: an offset whose wrap counter is
 * not ours is a lap behind.
 */
static inline int vring_packed_need_event(uint16_t off_wrap, uint16_t new_idx, bool wrap,
					  unsigned num, unsigned n)
{
	uint16_t off = off_wrap & 0x7fff;

	if (!!(off_wrap & VRING_PACKED_EVENT_WRAP) != wrap)
		off = (uint16_t)(off - num);
	return vring_need_event(off, new_idx, (uint16_t)(new_idx - n));
}

#endif
