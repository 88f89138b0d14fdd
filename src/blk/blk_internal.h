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

#include "blk/blk.h"
#include "blk/virtio_blk.h"
#include "loop/loop.h"
#include "virtio/vq.h"

/* Discard / write-zeroes limits we advertise (5.2.4) and enforce. */
#define BLK_MAX_DWZ_SEGS 16
#define BLK_MAX_DWZ_SECTORS (1u << 22)		/* 2 GiB per segment */

struct blk_req;

struct blk_iothread {
	struct blk_dev *dev;
	unsigned idx;
	int cpu;			/* pinned CPU, or -1 */
	struct loop *loop;
	struct bdev_ctx *bctx;		/* owned by this iothread */
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
	/* Interrupt moderation (blk_hold). */
	struct loop_timer *hold_timer;
	bool held;			/* a call is held until hold_timer fires */
	uint64_t held_since;		/* when it was held (sys_now_ns) */
	uint64_t held_until;		/* when it goes out at the latest */
	uint16_t done;			/* completions so far (wraps) */
	uint16_t held_done;		/* done when the call was held */
	bool held_stream;		/* may wait for requests yet to come */
	bool held_idle;			/* ... and did: nothing was left in flight */
	uint64_t held_requests;		/* requests (taken) when the call was held */
	uint64_t last_done;		/* loop_now() of the last completion */
	bool busy_before;		/* it left requests in flight */
	uint64_t gap_ns;		/* EWMA of the gaps the disk was busy across */
	uint64_t pace_ns;		/* EWMA of all gaps between completions */
	uint64_t overlap_ns;		/* loop_now() when >= 2 were last in flight */
	uint64_t stream_off_until;	/* no idle holds before this (loop_now()) */
	uint64_t stream_backoff_ns;	/* the next wasted idle hold's back-off */
	struct blk_req *reqs;		/* vq.num entries */
	struct iovec *iovs;
	uint16_t *free_reqs;		/* stack of free request indices */
	unsigned nfree;
	unsigned inflight;
	bool logged_no_status;

	/* Counters: written by the iothread, read by anyone. */
	_Atomic uint64_t requests, kicks, calls, calls_early, calls_suppressed;
	_Atomic uint64_t calls_held, calls_held_idle, calls_held_wasted, completions_coalesced;
	_Atomic uint64_t hold_ns_max, hold_ns_total, hold_late_ns_total;
	_Atomic uint64_t bad_requests;
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
	uint64_t irq_mod_max_ns;	/* --irq-moderation-max-ns; 0: off */
	/* Tells the frontend the config space changed (blk_dev_resize). */
	int (*config_changed)(void *opaque);
	void *config_opaque;

	unsigned num_iothreads;
	struct blk_iothread *iot;
	struct blk_queue q[];
};

static inline void stat_inc(_Atomic uint64_t *c)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
			      memory_order_relaxed);
}

/* ---- config.c: vu_dev_ops of the config space and features (main thread) ---- */

uint64_t blk__features(void *opaque);
void blk__get_config(void *opaque, uint32_t off, uint8_t *buf, uint32_t len);
int blk__set_config(void *opaque, uint32_t off, const uint8_t *buf, uint32_t len);
void blk__set_features(void *opaque, uint64_t features);
size_t blk__save_state(void *opaque, uint8_t *buf, size_t len);
int blk__load_state(void *opaque, const uint8_t *buf, size_t len);

#endif
