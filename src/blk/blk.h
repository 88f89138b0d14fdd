/*
 * blk_: the virtio-blk device.  Parses requests from a virtqueue, turns
 * them into backend I/O, completes them with a status byte, and decides
 * notifications per batch.  Implements struct vu_dev_ops for vhost-user.
 *
 * Threading: a blk_dev has one iothread (its own loop and backend ctx);
 * every queue runs there: kick eventfds, ring processing, backend
 * completions, call eventfds.  The vu_dev_ops entry points are called on
 * the main thread and hand work to the iothread with loop_call_sync().
 */
#ifndef VBLK_BLK_H
#define VBLK_BLK_H

#include <stdint.h>

#include "backend/bdev.h"
#include "vhost/vu.h"

#define BLK_MAX_QUEUES 64

struct blk_opts {
	unsigned num_queues;		/* 1..BLK_MAX_QUEUES */
	const char *serial;		/* GET_ID, at most 20 bytes used */
};

struct blk_dev;

/* Per-queue counters, read by anyone (relaxed; may lag). */
struct blk_queue_stats {
	uint64_t requests;
	uint64_t kicks;
	uint64_t calls;
	uint64_t calls_suppressed;
	uint64_t bad_requests;
};

/* Create the device and start its iothread.  Returns 0 or -errno.
 * Main thread. */
int blk_dev_new(struct bdev *b, const struct blk_opts *o, struct blk_dev **out);
/* Stop every queue (draining I/O), stop the iothread, free. */
void blk_dev_free(struct blk_dev *d);

void blk_queue_stats(struct blk_dev *d, unsigned idx, struct blk_queue_stats *out);

extern const struct vu_dev_ops blk_vu_ops;

#endif
