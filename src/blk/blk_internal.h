/*
 * Shared between the files of src/blk only: the device and its queues
 * (blk.c: requests, rings, notifications, iothreads), the config space
 * and resize (config.c), the counters' snapshot (stats.c).  Not part of
 * the blk_ contract (blk.h).
 */
#ifndef VBLK_BLK_INTERNAL_H
#define VBLK_BLK_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "acct/acct.h"
#include "blk/blk.h"
#include "blk/irq.h"
#include "blk/virtio_blk.h"
#include "loop/loop.h"
#include "virtio/vq.h"

/* Discard / write-zeroes limits we advertise (5.2.4) and enforce. */
#define BLK_MAX_DWZ_SEGS 16
#define BLK_MAX_DWZ_SECTORS (1u << 22)		/* 2 GiB per segment */

struct blk_req;

#define BLK_CACHELINE 64

struct blk_iothread {
	struct blk_dev *dev;
	unsigned idx;
	int cpu;			/* pinned CPU, or -1 */
	struct loop *loop;
	struct bdev_ctx *bctx;		/* owned by this iothread */
	/* Time with requests in flight on any of its queues (their union);
	 * iothread-owned, read on it by stats.c.  Written per request: a
	 * cache line of its own, not shared with the next iothread's fields
	 * (blk_dev.iot is allocated aligned). */
	struct acct_busy busy __attribute__((aligned(BLK_CACHELINE)));
};

/* The queue's own counters: the KEPT rows of BLK_QUEUE_COUNTERS
 * (blk/counters.h), relaxed atomics the iothread alone writes (stat_inc). */
#define BLK__IF_KEPT_KEPT(...) __VA_ARGS__
#define BLK__IF_KEPT_READ(...)
#define BLK__KEPT_MEMBER(name, type, src, ...) \
	BLK__IF_KEPT_##src(_Atomic BLK_COUNTER_CTYPE_##type name;)
struct blk_queue_counters {
	BLK_QUEUE_COUNTERS(BLK__KEPT_MEMBER)
};

struct blk_queue {
	struct blk_dev *dev;
	struct blk_iothread *t;		/* the iothread that owns this queue */
	unsigned idx;

	/* Owned by the iothread; changed only through loop_call_sync. */
	bool started, enabled;
	struct vq vq;
	int kick_fd, call_fd, err_fd;	/* borrowed from vu */
	struct loop_fd *kick_h;
	struct loop_bh *resume_bh;	/* continue after a full budget */
	struct loop_bh *notify_bh;	/* no EVENT_IDX: coalesce notifications */
	bool polling;			/* the loop polls us: kicks stay off */
	bool event_idx;
	bool early_sent;		/* an early call ended a batch in this section */
	/* Interrupt moderation: the policy, and the timer that ends a hold. */
	struct blk_irq irq;
	struct loop_timer *hold_timer;
	struct blk_req *reqs;		/* vq.num entries */
	struct iovec *iovs;
	uint16_t *free_reqs;		/* stack of free request indices */
	unsigned nfree;
	unsigned inflight;
	bool logged_no_status;

	/* Per operation (acct_done at completion); iothread-owned, plain
	 * fields, read on the iothread by stats.c. */
	struct acct acct;

	/* Written by the iothread, read by anyone. */
	struct blk_queue_counters ctr;
	/* Poll counters of kick handlers that are gone (ring restarts). */
	struct loop_poll_stats poll_base;
};

struct blk_dev {
	struct bdev *b;
	unsigned num_queues;
	char serial[VIRTIO_BLK_ID_BYTES];
	uint64_t acked;			/* main thread */
	atomic_bool writeback;		/* main writes, iothread reads */
	uint8_t wce;			/* config byte as the guest set it */
	bool no_event_idx;		/* --no-event-idx: do not offer it */
	bool no_packed;			/* --no-packed: do not offer packed rings */
	bool early_notify;		/* not --no-early-notify */
	/* Tells the frontend the config space changed (blk_dev_resize). */
	int (*config_changed)(void *opaque);
	void *config_opaque;

	unsigned num_iothreads;
	struct blk_iothread *iot;
	struct blk_queue q[];
};

/* A counter of ours, on the iothread that writes it: no atomic
 * read-modify-write, only a relaxed store readers cannot see torn. */
static inline void stat_add(_Atomic uint64_t *c, uint64_t n)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
			      memory_order_relaxed);
}

static inline void stat_inc(_Atomic uint64_t *c)
{
	stat_add(c, 1);
}

/* ---- config.c: vu_dev_ops of the config space and features (main thread) ---- */

uint64_t blk__features(void *opaque);
void blk__get_config(void *opaque, uint32_t off, uint8_t *buf, uint32_t len);
int blk__set_config(void *opaque, uint32_t off, const uint8_t *buf, uint32_t len);
void blk__set_features(void *opaque, uint64_t features);
size_t blk__save_state(void *opaque, uint8_t *buf, size_t len);
int blk__load_state(void *opaque, const uint8_t *buf, size_t len);

#endif
