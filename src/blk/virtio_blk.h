/*
 * virtio-blk wire layout, written from virtio 1.2 section 5.2 "Block
 * Device".  Little-endian; sizes and offsets pinned below.
 */
#ifndef VBLK_VIRTIO_BLK_H
#define VBLK_VIRTIO_BLK_H

#include <stddef.h>
#include <stdint.h>

#include "util/compiler.h"

/* 5.2.3 "Feature bits" */
#define VIRTIO_BLK_F_SIZE_MAX     1
#define VIRTIO_BLK_F_SEG_MAX      2
#define VIRTIO_BLK_F_GEOMETRY     4
#define VIRTIO_BLK_F_RO           5
#define VIRTIO_BLK_F_BLK_SIZE     6
#define VIRTIO_BLK_F_FLUSH        9
#define VIRTIO_BLK_F_TOPOLOGY     10
#define VIRTIO_BLK_F_CONFIG_WCE   11
#define VIRTIO_BLK_F_MQ           12
#define VIRTIO_BLK_F_DISCARD      13
#define VIRTIO_BLK_F_WRITE_ZEROES 14

/* 5.2.4 "Device configuration layout" */
struct virtio_blk_config {
	uint64_t capacity;		/* in 512-byte sectors, always */
	uint32_t size_max;
	uint32_t seg_max;
	struct {
		uint16_t cylinders;
		uint8_t heads;
		uint8_t sectors;
	} geometry;
	uint32_t blk_size;
	struct {
		uint8_t physical_block_exp;
		uint8_t alignment_offset;
		uint16_t min_io_size;
		uint32_t opt_io_size;
	} topology;
	uint8_t writeback;
	uint8_t unused0;
	uint16_t num_queues;
	uint32_t max_discard_sectors;
	uint32_t max_discard_seg;
	uint32_t discard_sector_alignment;
	uint32_t max_write_zeroes_sectors;
	uint32_t max_write_zeroes_seg;
	uint8_t write_zeroes_may_unmap;
	uint8_t unused1[3];
	uint32_t max_secure_erase_sectors;
	uint32_t max_secure_erase_seg;
	uint32_t secure_erase_sector_alignment;
} __attribute__((packed));

STATIC_ASSERT(offsetof(struct virtio_blk_config, blk_size) == 20, "blk_size");
STATIC_ASSERT(offsetof(struct virtio_blk_config, topology) == 24, "topology");
STATIC_ASSERT(offsetof(struct virtio_blk_config, writeback) == 32, "writeback");
STATIC_ASSERT(offsetof(struct virtio_blk_config, num_queues) == 34, "num_queues");
STATIC_ASSERT(offsetof(struct virtio_blk_config, max_discard_sectors) == 36, "discard");
STATIC_ASSERT(offsetof(struct virtio_blk_config, write_zeroes_may_unmap) == 56, "wz unmap");
STATIC_ASSERT(sizeof(struct virtio_blk_config) == 72, "virtio_blk_config size");

/* 5.2.6 "Device Operation" */
#define VIRTIO_BLK_T_IN           0
#define VIRTIO_BLK_T_OUT          1
#define VIRTIO_BLK_T_FLUSH        4
#define VIRTIO_BLK_T_GET_ID       8
#define VIRTIO_BLK_T_DISCARD      11
#define VIRTIO_BLK_T_WRITE_ZEROES 13

#define VIRTIO_BLK_S_OK     0
#define VIRTIO_BLK_S_IOERR  1
#define VIRTIO_BLK_S_UNSUPP 2

#define VIRTIO_BLK_ID_BYTES 20
#define VIRTIO_BLK_SECTOR_SHIFT 9

struct virtio_blk_outhdr {
	uint32_t type;
	uint32_t reserved;	/* "ioprio" in legacy */
	uint64_t sector;
};
STATIC_ASSERT(sizeof(struct virtio_blk_outhdr) == 16, "virtio_blk_outhdr");

/* 5.2.6 "Device Operation": payload of DISCARD and WRITE_ZEROES, one per
 * segment. */
#define VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP 1u
struct virtio_blk_discard_write_zeroes {
	uint64_t sector;
	uint32_t num_sectors;
	uint32_t flags;
};
STATIC_ASSERT(sizeof(struct virtio_blk_discard_write_zeroes) == 16, "dwz segment");

#endif
