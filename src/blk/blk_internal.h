/*
 * Shared between the files of src/blk only: the device and its queues
 * (blk.c: requests, rings, notifications, iothreads), the config space
 * and resize (config.c), the counters' snapshot (stats.c).  Not part of
 * the blk_ contract (blk.h).
 */
#ifndef VBLK_BLK_INTERNAL_H
#define VBLK_BLK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "acct/acct.h"
#include "blk/blk.h"
#include "blk/irq.h"
#include "blk/virtio_blk.h"
#include "disk/disk.h"
#include "loop/defer.h"
#include "loop/loop.h"
#include "qos/qos.h"
#include "virtio/vq.h"

/* Discard / write-zeroes limits we advertise (5.2.4) and enforce. */
#define BLK_MAX_DWZ_SEGS 16
#define BLK_MAX_DWZ_SECTORS (1u << 22)		/* 2 GiB per segment */

struct blk_queue;

struct blk_req {
	struct blk_queue *q;
	struct bdev_io io;
	uint16_t head;
	/* Accounting (acct.h): its operation's counters in the queue's
	 * struct acct, or NULL for none (a header that could not be read, an
	 * unknown type); its bytes; when it was taken off the ring (loop
	 * time). */
	struct acct_op_stats *acct;
	uint64_t bytes;
	uint64_t t0;
	uint8_t *status;	/* last byte of the last writable buffer */
	uint32_t used_len;	/* bytes written on success */
	struct iovec *iov;	/* VQ_MAX_SEGS entries */
	/* Device-writable buffers but the status byte: iov[in_off..+in_n),
	 * never changed after blk_handle (bdev.h), for dirty logging. */
	unsigned in_off, in_n;
	struct blk_req *held_next;	/* the queue's held list (pause.c) */
	/* Discard / write zeroes: segments run one after another. */
	struct virtio_blk_discard_write_zeroes segs[BLK_MAX_DWZ_SEGS];
	unsigned nsegs, seg;
};

#define BLK_CACHELINE 64

/* The device's part of one of the disk's iothreads (disk.h): its loop
 * and engine ctx are the disk's, copied here for the data path. */
struct blk_iothread {
	struct blk_dev *dev;
	unsigned idx;
	int cpu;			/* pinned CPU, or -1 */
	struct loop *loop;		/* the disk's iothread's */
	struct bdev_ctx *bctx;		/* the disk's iothread's */
	struct disk_iothread *dt;	/* the disk's iothread (disk_submit) */
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
	/* Failed requests the error policy holds, in order (pause.c):
	 * not completed, counted in inflight. */
	struct blk_req *held_head, **held_tail;
	unsigned nheld;
	/* QoS (throttle.c): the request the budget cannot take yet, taken
	 * from the ring and waiting for qos_timer; its place in the disk's
	 * line (qos_admit_turn); since when. */
	struct blk_req *throttled;
	bool qos_bypass;		/* the ring is stopping: nothing waits */
	struct qos_turn qos_turn;
	uint64_t throttled_since;
	uint64_t throttled_ns_done;	/* waits that ended (stats.c adds the current) */
	struct loop_timer *qos_timer;

	/* Per operation (acct_done at completion); iothread-owned, plain
	 * fields, read on the iothread by stats.c. */
	struct acct acct;

	/* Written by the iothread, read by anyone. */
	struct blk_queue_counters ctr;
	/* Poll counters of kick handlers that are gone (ring restarts). */
	struct loop_poll_stats poll_base;
};

struct blk_dev {
	struct bdev *b;			/* disk->b */
	/* The disk this device is a front of; own_disk: made by blk_dev_new
	 * for this device alone (tests, fuzzing), freed with it. */
	struct disk *disk;
	bool own_disk;
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

	/* The error policy's front (held.c): resumed by disk_resume. */
	struct disk_front front;

	/* QoS: the disk's budget, its own or a group's (qos.h); set by
	 * blk_dev_new, never NULL; the limits change under it (qos_set).
	 * qos_on: its "any limit set" flag, read inline per request. */
	struct qos *qos;
	const _Atomic uint32_t *qos_on;

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

/* A queue that must not take new requests: it holds failed ones, waits
 * for the QoS budget, or the disk is paused (disk.h).  Iothread. */
static inline bool blk__queue_waits(const struct blk_queue *q)
{
	return q->nheld || q->throttled || disk_paused(q->dev->disk);
}

/* ---- throttle.c: QoS on the queues (iothread) ---- */

bool blk__throttle_slow(struct blk_queue *q, struct blk_req *r);
/* Must r wait for the disk's budget?  true: it waits (the queue stops
 * taking requests until the timer lets it go); false: it goes now, and
 * is counted.  With no limit set, a relaxed load and a branch. */
static inline bool blk__throttle(struct blk_queue *q, struct blk_req *r)
{
	return atomic_load_explicit(q->dev->qos_on, memory_order_relaxed) &&
	       blk__throttle_slow(q, r);
}
void blk__throttle_timer_cb(void *opaque);
/* A ring stops: a waiting request goes now (over budget) for the drain. */
void blk__throttle_at_stop(struct blk_queue *q);
/* blk.c, for throttle.c: send a discard / write zeroes' next segment. */
void blk__dwz_next(struct blk_req *r);

/* ---- poll.c: the kick fd's poll handler (iothread) ---- */

extern const struct loop_poll_ops blk__poll_ops;

/* ---- blk.c, for pause.c (iothread) ---- */

/* Look at the ring again (the drain / re-enable / re-check loop). */
void blk__queue_process(struct blk_queue *q);
/* Submit a held request again, as it was first submitted. */
void blk__resubmit(struct blk_queue *q, struct blk_req *r);
bool blk__remark(struct blk_queue *q, struct blk_req *r);
/* Complete a request with a status byte (and account for it). */
void blk__req_complete(struct blk_req *r, uint8_t status);
/* Let a request go without completing it (it stays in flight in the
 * in-flight region, for whoever starts the ring next). */
void blk__req_drop(struct blk_req *r);

/* ---- held.c: the error policy's held requests (disk.h: disk_hold) ---- */

/* Does the disk's policy stop on err for an I/O of op?  Any thread. */
bool blk__error_stops(const struct blk_dev *d, enum bdev_op op, int err);
/* Hold r (failed with err), pause the disk.  Iothread of r's queue. */
void blk__hold_request(struct blk_queue *q, struct blk_req *r, int err);
/* A ring stops with requests held (do_queue_stop, after the drain): with
 * an in-flight region and no migration under way they stay in flight
 * there (the next start, in this process or the next, submits them
 * again); else they fail with IOERR, logged.  Iothread. */
void blk__held_at_stop(struct blk_queue *q);
/* The device as a front of the disk's error policy.  Main thread. */
void blk__held_init(struct blk_dev *d);
void blk__held_free(struct blk_dev *d);

/* ---- config.c: vu_dev_ops of the config space and features (main thread) ---- */

uint64_t blk__features(void *opaque);
void blk__get_config(void *opaque, uint32_t off, uint8_t *buf, uint32_t len);
int blk__set_config(void *opaque, uint32_t off, const uint8_t *buf, uint32_t len);
void blk__set_features(void *opaque, uint64_t features);
size_t blk__save_state(void *opaque, uint8_t *buf, size_t len);
int blk__load_state(void *opaque, const uint8_t *buf, size_t len);
int blk__handover_quiesce(void *opaque, char *err, size_t errlen);
int blk__handover_reload(void *opaque, char *err, size_t errlen);

#endif
