/*
 * vhost-user wire layout, written from qemu docs/interop/vhost-user.rst
 * ("Message Specification", "Front-end message types").  Native-endian
 * (little-endian here); sizes pinned below.
 */
#ifndef VBLK_VHOST_USER_H
#define VBLK_VHOST_USER_H

#include <stddef.h>
#include <stdint.h>

#include "util/compiler.h"

enum vhost_user_request {
	VHOST_USER_GET_FEATURES = 1,
	VHOST_USER_SET_FEATURES = 2,
	VHOST_USER_SET_OWNER = 3,
	VHOST_USER_RESET_OWNER = 4,
	VHOST_USER_SET_MEM_TABLE = 5,
	VHOST_USER_SET_LOG_BASE = 6,
	VHOST_USER_SET_LOG_FD = 7,
	VHOST_USER_SET_VRING_NUM = 8,
	VHOST_USER_SET_VRING_ADDR = 9,
	VHOST_USER_SET_VRING_BASE = 10,
	VHOST_USER_GET_VRING_BASE = 11,
	VHOST_USER_SET_VRING_KICK = 12,
	VHOST_USER_SET_VRING_CALL = 13,
	VHOST_USER_SET_VRING_ERR = 14,
	VHOST_USER_GET_PROTOCOL_FEATURES = 15,
	VHOST_USER_SET_PROTOCOL_FEATURES = 16,
	VHOST_USER_GET_QUEUE_NUM = 17,
	VHOST_USER_SET_VRING_ENABLE = 18,
	VHOST_USER_SET_BACKEND_REQ_FD = 21,	/* SET_SLAVE_REQ_FD before QEMU 8.1 */
	VHOST_USER_GET_CONFIG = 24,
	VHOST_USER_SET_CONFIG = 25,
	VHOST_USER_GET_INFLIGHT_FD = 31,
	VHOST_USER_SET_INFLIGHT_FD = 32,
	VHOST_USER_RESET_DEVICE = 34,
	VHOST_USER_GET_MAX_MEM_SLOTS = 36,
	VHOST_USER_ADD_MEM_REG = 37,
	VHOST_USER_REM_MEM_REG = 38,
	VHOST_USER_SET_STATUS = 39,
	VHOST_USER_GET_STATUS = 40,
};

/* "Header": flags bits 0-1 version (1), bit 2 reply, bit 3 need_reply. */
#define VHOST_USER_VERSION          0x1u
#define VHOST_USER_VERSION_MASK     0x3u
#define VHOST_USER_REPLY_MASK       (1u << 2)
#define VHOST_USER_NEED_REPLY_MASK  (1u << 3)

/* Virtio feature bit meaning "protocol features supported". */
#define VHOST_USER_F_PROTOCOL_FEATURES 30

/* "Protocol features" */
#define VHOST_USER_PROTOCOL_F_MQ                  0
#define VHOST_USER_PROTOCOL_F_LOG_SHMFD           1
#define VHOST_USER_PROTOCOL_F_REPLY_ACK           3
#define VHOST_USER_PROTOCOL_F_BACKEND_REQ         5	/* SLAVE_REQ before QEMU 8.1 */
#define VHOST_USER_PROTOCOL_F_CONFIG              9
#define VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD      12
#define VHOST_USER_PROTOCOL_F_RESET_DEVICE        13
#define VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS 15
#define VHOST_USER_PROTOCOL_F_STATUS              16

/* "Back-end message types": requests we send on the backend channel
 * (SET_BACKEND_REQ_FD's socket). */
#define VHOST_USER_BACKEND_CONFIG_CHANGE_MSG 2

/* SET_STATUS / GET_STATUS carry the virtio device status byte (virtio
 * 1.2, 2.1 "Device Status Field"). */
#define VIRTIO_CONFIG_S_ACKNOWLEDGE  0x01
#define VIRTIO_CONFIG_S_DRIVER       0x02
#define VIRTIO_CONFIG_S_DRIVER_OK    0x04
#define VIRTIO_CONFIG_S_FEATURES_OK  0x08
#define VIRTIO_CONFIG_S_NEEDS_RESET  0x40
#define VIRTIO_CONFIG_S_FAILED       0x80

/* "Migration": dirty logging.  VHOST_F_LOG_ALL is a vhost feature bit in
 * the GET/SET_FEATURES mask (turns logging of every device write to guest
 * memory on); VHOST_VRING_F_LOG is bit 0 of vhost_vring_addr.flags (log
 * writes to that ring's used ring at log_guest_addr).  One bit of the log
 * covers VHOST_LOG_PAGE bytes of guest-physical memory:
 * log[page / 8] |= 1 << (page % 8). */
#define VHOST_F_LOG_ALL   26
#define VHOST_VRING_F_LOG 0
#define VHOST_LOG_PAGE    0x1000ull

/* u64 payload of SET_VRING_KICK/CALL/ERR: index in bits 0-7, bit 8 set
 * when no fd is passed. */
#define VHOST_USER_VRING_IDX_MASK  0xffull
#define VHOST_USER_VRING_NOFD_MASK (1ull << 8)

/* At most this many regions (and fds) in SET_MEM_TABLE. */
#define VHOST_USER_MEMORY_BASELINE_NREGIONS 8
/* Fds one message can carry. */
#define VHOST_USER_MAX_FDS 8

#define VHOST_USER_CONFIG_HDR_SIZE 12
#define VHOST_USER_MAX_CONFIG_SIZE 256

struct vhost_user_hdr {
	uint32_t request;
	uint32_t flags;
	uint32_t size;		/* payload bytes following */
} __attribute__((packed));

struct vhost_vring_state {
	uint32_t index;
	uint32_t num;
};

struct vhost_vring_addr {
	uint32_t index;
	uint32_t flags;
	uint64_t desc_user_addr;
	uint64_t used_user_addr;
	uint64_t avail_user_addr;
	uint64_t log_guest_addr;
};

struct vhost_user_mem_region {
	uint64_t guest_phys_addr;
	uint64_t memory_size;
	uint64_t userspace_addr;
	uint64_t mmap_offset;
};

struct vhost_user_memory {
	uint32_t nregions;
	uint32_t padding;
	struct vhost_user_mem_region regions[VHOST_USER_MEMORY_BASELINE_NREGIONS];
};

struct vhost_user_mem_reg {
	uint64_t padding;
	struct vhost_user_mem_region region;
};

struct vhost_user_config {
	uint32_t offset;
	uint32_t size;
	uint32_t flags;
	uint8_t region[VHOST_USER_MAX_CONFIG_SIZE];
};

/* SET_LOG_BASE with LOG_SHMFD ("Log description"): the log starts at
 * mmap_offset in the fd that comes with the message. */
struct vhost_user_log {
	uint64_t mmap_size;
	uint64_t mmap_offset;
};

/* GET/SET_INFLIGHT_FD ("inflight description"). */
struct vhost_user_inflight {
	uint64_t mmap_size;
	uint64_t mmap_offset;
	uint16_t num_queues;
	uint16_t queue_size;
	uint32_t padding;	/* the C layout the frontend sends: 24 bytes */
};

union vhost_user_payload {
	uint64_t u64;
	struct vhost_vring_state state;
	struct vhost_vring_addr addr;
	struct vhost_user_memory memory;
	struct vhost_user_mem_reg mem_reg;
	struct vhost_user_config config;
	struct vhost_user_inflight inflight;
	struct vhost_user_log log;
};

STATIC_ASSERT(sizeof(struct vhost_user_hdr) == 12, "vhost-user header");
STATIC_ASSERT(sizeof(union vhost_user_payload) >= 256, "a handed-over device state fits");
STATIC_ASSERT(sizeof(struct vhost_vring_state) == 8, "vring state");
STATIC_ASSERT(sizeof(struct vhost_vring_addr) == 40, "vring addr");
STATIC_ASSERT(sizeof(struct vhost_user_mem_region) == 32, "mem region");
STATIC_ASSERT(offsetof(struct vhost_user_memory, regions) == 8, "mem table");
STATIC_ASSERT(sizeof(struct vhost_user_mem_reg) == 40, "mem reg");
STATIC_ASSERT(offsetof(struct vhost_user_config, region) == VHOST_USER_CONFIG_HDR_SIZE,
	      "config header");
STATIC_ASSERT(sizeof(struct vhost_user_inflight) == 24, "inflight description");
STATIC_ASSERT(sizeof(struct vhost_user_log) == 16, "log description");

#endif
