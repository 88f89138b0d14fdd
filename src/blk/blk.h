/*
 * blk_: the virtio-blk device.  Parses requests from a virtqueue, turns
 * them into backend I/O, completes them with a status byte, and decides
 * notifications per batch.  Implements struct vu_dev_ops for vhost-user.
 *
 * Threading: a blk_dev is a front of a disk (disk.h) and runs on the
 * disk's N iothreads, each with its own loop and backend ctx; each queue
 * belongs to one of them (q mod N, or --queue-map) and
 * everything of that queue runs there: kick eventfd, ring processing,
 * backend completions, call eventfd.  Nothing on the I/O path is shared
 * between iothreads, so no lock is taken per request.  The vu_dev_ops entry points are called on
 * the main thread and hand work to the iothread with loop_call_sync().
 */
#ifndef VBLK_BLK_H
#define VBLK_BLK_H

#include <stdint.h>

#include "backend/bdev.h"
#include "blk/counters.h"
#include "disk/disk.h"
#include "loop/loop.h"
#include "vhost/vu.h"

#define BLK_MAX_QUEUES 64
/* Default caps of the adaptive polling windows (docs/architecture.md
 * "Polling"): for kicks (loop_poll_params.max_ns), and for the disk's
 * completions, polled only while I/O is in flight (completion_max_ns):
 * a few times a fast SSD's latency. */
#define BLK_POLL_DEFAULT_NS 65536u
#define BLK_COMPLETION_POLL_DEFAULT_NS 262144u
/* Default cap of interrupt moderation (blk_opts.irq_moderation_max_ns). */
#define BLK_IRQ_MODERATION_DEFAULT_NS 500000u

struct qos;

struct blk_opts {
	unsigned num_queues;		/* 1..BLK_MAX_QUEUES */
	const char *serial;		/* GET_ID, at most 20 bytes used */
	bool no_event_idx;		/* do not offer VIRTIO_RING_F_EVENT_IDX */
	bool no_early_notify;		/* calls only at the end of a section (ablation) */
	bool no_packed;			/* do not offer VIRTIO_F_RING_PACKED */
	/* Fuzzing: the iothreads' loops are never run; their work (every
	 * loop_call_sync, so blk_fuzz_process) runs on the caller's thread. */
	bool no_threads;
	/* Interrupt moderation: the longest a call may be held for more
	 * completions to share it (docs/architecture.md "Interrupts").
	 * 0: off. */
	uint64_t irq_moderation_max_ns;
	const struct loop_poll_params *poll;	/* NULL: loop defaults */
	unsigned num_iothreads;		/* 0 or 1: one iothread */
	const unsigned *queue_map;	/* queue -> iothread; NULL: q mod N */
	const int *cpus;		/* iothread i pinned to cpus[i % ncpus] */
	unsigned ncpus;
	/* blk_dev_new only (a disk of its own): the disk's QoS budget
	 * (disk_opts.qos; the disk owns it from blk_dev_new on, also on
	 * failure).  blk_dev_new_on uses the disk's. */
	struct qos *qos;
};

struct blk_dev;
struct disk;

/* Create the device as a front of disk, on the disk's iothreads
 * (blk_opts' num_iothreads, cpus, poll and no_threads are the disk's
 * business and not read).  The disk outlives the device.  Returns 0 or
 * -errno.  Main thread. */
int blk_dev_new_on(struct disk *disk, const struct blk_opts *o, struct blk_dev **out);
/* The same on a disk of its own, made from b and those fields of o, and
 * freed with the device (tests, fuzzing).  Returns 0 or -errno.  Main
 * thread. */
int blk_dev_new(struct bdev *b, const struct blk_opts *o, struct blk_dev **out);
/* Stop every queue (draining I/O), let go of the iothreads (and free the
 * disk if it was the device's own), free. */
void blk_dev_free(struct blk_dev *d);
/* The disk's QoS budget (qos.h: its limits, levels, qos_set; the disk's,
 * disk.h).  Any thread, while the device lives. */
struct qos *blk_dev_qos(struct blk_dev *d);

/* Every counter and the polling knobs at one moment, in arrays of their
 * own: what the control socket's "stats" and the metrics show.  The
 * counters are listed in blk/counters.h. */
struct blk_stats {
	unsigned num_queues, num_iothreads;
	struct blk_disk_stats disk;
	struct blk_op_stats ops[ACCT_NR_OPS];	/* all queues together */
	struct blk_op_stats nbd_ops[ACCT_NR_OPS];	/* the NBD front's */
	struct blk_pause_stats pauses[DISK_PAUSE_NR];
	struct blk_queue_stats *queues;		/* num_queues entries */
	struct blk_iothread_stats *iothreads;	/* num_iothreads entries */
	struct loop_poll_params poll;
};

/* The elements of counter set id in s (blk_counter_sets[id]): *n of
 * them.  Any thread. */
static inline const void *blk_stats_elems(const struct blk_stats *s, enum blk_counter_set_id id,
					  unsigned *n)
{
	switch (id) {
	case BLK_COUNTERS_OP:
		*n = ACCT_NR_OPS;
		return s->ops;
	case BLK_COUNTERS_NBD_OP:
		*n = ACCT_NR_OPS;
		return s->nbd_ops;
	case BLK_COUNTERS_DISK:
		*n = 1;
		return &s->disk;
	case BLK_COUNTERS_PAUSE:
		*n = DISK_PAUSE_NR;
		return s->pauses;
	case BLK_COUNTERS_QUEUE:
		*n = s->num_queues;
		return s->queues;
	default:
		*n = s->num_iothreads;
		return s->iothreads;
	}
}

/* Fill s: every queue's, iothread's and operation's counters, read on
 * each iothread, and the polling knobs (blk_get_poll_params).  Returns 0
 * or -ENOMEM (s then holds nothing to release).  Main thread. */
int blk_stats_snapshot(struct blk_dev *d, struct blk_stats *s);
/* Free s's arrays.  Any thread. */
void blk_stats_release(struct blk_stats *s);
unsigned blk_dev_num_queues(const struct blk_dev *d);
unsigned blk_dev_num_iothreads(const struct blk_dev *d);
/* Polling knobs, at runtime.  Any thread. */
void blk_set_poll_params(struct blk_dev *d, const struct loop_poll_params *p);

/*
 * Resize (docs/architecture.md "Device status and resize"): grow the disk
 * to size bytes (bdev_resize says how), then tell the frontend through
 * fn, set by blk_dev_set_config_notify (vhost-user: CONFIG_CHANGE_MSG on
 * the backend channel; fn returns 1 sent, 0 no channel, -errno).  Returns
 * 1 if the frontend was told, 0 if the disk grew (or already had that
 * size) but no frontend could be told, or -errno with one line in err
 * (nothing changed).  Main thread.
 */
void blk_dev_set_config_notify(struct blk_dev *d, int (*fn)(void *opaque), void *opaque);
int blk_dev_resize(struct blk_dev *d, uint64_t size, char *err, size_t errlen);

void blk_get_poll_params(struct blk_dev *d, struct loop_poll_params *p);

/* The disk the device is a front of (its pause, QoS, jobs: disk.h).
 * Any thread. */
struct disk *blk_dev_disk(struct blk_dev *d);

extern const struct vu_dev_ops blk_vu_ops;

/*
 * For fuzzing and tests only: start queue idx with s (as the vhost-user
 * queue_start op does), process its ring once, then stop it (as
 * queue_stop does: in-flight I/O drained, used->idx published), all on the
 * queue's iothread before returning.  Returns 0 or -errno (the start's, or
 * -EINVAL for a bad idx).  Main thread, queue stopped.
 */
int blk_fuzz_process(struct blk_dev *d, unsigned idx, const struct vu_queue_setup *s);

#endif
