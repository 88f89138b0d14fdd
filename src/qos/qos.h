/*
 * Per-disk QoS (qos_): IOPS and bandwidth limits with bursts, with QEMU's
 * names and semantics (docs/throttle.txt and util/throttle.c in qemu/qemu:
 * leaky buckets, *-max over *-max-length seconds, iops-size), so that an
 * operator's -drive throttling.* / throttle-group settings carry over.
 *
 * Two parts:
 *   - struct qos_limits: the six limits and their bursts, parsed from and
 *     printed as "iops-total=1000,bps-read=10M,..." (pure, any thread);
 *   - struct qos: the buckets of one disk, shared by all its queues
 *     (iothreads), behind a mutex.  qos_admit_turn is the data path's one call.
 *
 * What is counted (QEMU's throttle filter driver, block/throttle.c): reads
 * count as reads; writes, write zeroes and discards as writes with their
 * byte count; flushes and GET_ID are not throttled.
 */
#ifndef VBLK_QOS_H
#define VBLK_QOS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum qos_bkt {
	QOS_BPS_TOTAL,
	QOS_BPS_READ,
	QOS_BPS_WRITE,
	QOS_IOPS_TOTAL,
	QOS_IOPS_READ,
	QOS_IOPS_WRITE,
	QOS_NR_BKT
};

/* One bucket's limit: avg per second (0: unlimited), the burst rate max
 * (0: none; the bucket then holds avg/10, QEMU's 100 ms) sustained for
 * max_len seconds (1 when max is set and max_len is not). */
struct qos_limit {
	uint64_t avg, max, max_len;
};

struct qos_limits {
	struct qos_limit b[QOS_NR_BKT];
	uint64_t iops_size;	/* a request of n * iops_size bytes counts n I/Os */
};

/* The name of bucket i in the option syntax ("iops-total").  Any thread. */
const char *qos_bkt_name(enum qos_bkt i);

/* Apply "key=value,key=value" to *l (keys not named keep their value; a
 * value of 0 removes that limit), then check the result as QEMU does
 * (total with read/write of the same kind, a max below its avg, a length
 * without a max).  Returns 0, or -EINVAL with one line in err (nothing in
 * *l changed).  Any thread. */
int qos_limits_parse(const char *s, struct qos_limits *l, char *err, size_t errlen);
/* Print the limits set, in the syntax qos_limits_parse takes ("" when
 * none).  Returns the length, as snprintf.  Any thread. */
int qos_limits_format(const struct qos_limits *l, char *buf, size_t len);
/* True if any limit is set.  Any thread. */
bool qos_limits_any(const struct qos_limits *l);

/* ---- The buckets (QEMU's leaky buckets), without locking ---- */

struct qos_buckets {
	double level[QOS_NR_BKT];	/* units in the bucket now */
	double burst[QOS_NR_BKT];	/* the burst bucket (leaks at max) */
	uint64_t prev_ns;		/* last leak */
};

/* Leak the buckets to now, then: 0 if an I/O may go now, else how long
 * to wait (ns) before asking again.  The wait does not depend on the I/O's
 * size (QEMU's rule: a bucket that is not full takes the next I/O whole).
 * Caller serialises. */
uint64_t qos_buckets_wait(struct qos_buckets *s, const struct qos_limits *l, bool is_write,
			  uint64_t now);
/* Count an I/O of bytes that was let through.  Caller serialises. */
void qos_buckets_account(struct qos_buckets *s, const struct qos_limits *l, bool is_write,
			 uint64_t bytes);

/* ---- A disk's QoS, shared by its queues ---- */

struct qos;

/* Create with the limits l (may be none: qos_admit_turn then always lets
 * through, but the limits can be set later).  Returns 0 or -errno.  Main
 * thread. */
int qos_new(const struct qos_limits *l, struct qos **out);
void qos_free(struct qos *q);

/* A queue's place in line and its turn (qos_admit_turn). */
struct qos_turn {
	uint64_t ticket;	/* 0: not waiting */
	unsigned credit;	/* I/Os of this turn still to go without waiting in line */
	bool head;		/* waiting at the head of the line (else behind others) */
};
/* Is this I/O let through now?  Returns 0 (it is, and it is counted), or
 * the ns to wait before asking again with the same turn (the caller keeps
 * the I/O).  An I/O that must wait gets a ticket in t, and while tickets
 * are out only the oldest may go: over-budget I/O goes in the order it
 * arrived, whatever queue, iothread or process it is on.  slice_ns 0: one
 * I/O a turn, no least wait.  For a queue that sends in batches, slice_ns
 * > 0: it waits at least slice_ns
 * at the head of the line, and when its turn comes, up to a slice's worth
 * of I/Os (divided among the queues waiting, when others wait too) go at
 * once while the bucket has room, without queuing behind the others
 * again; then the queue waits its next turn.  A waiter behind the head is
 * told to sleep until just after the head's turn.  So a queue woken once
 * sends a batch, and busy queues share the budget in turns.  Any
 * iothread. */
uint64_t qos_admit_turn(struct qos *q, bool is_write, uint64_t bytes, uint64_t now,
			struct qos_turn *t, uint64_t slice_ns);
/* Give up a ticket (the I/O will not ask again: its ring stopped).  Any
 * iothread. */
void qos_cancel(struct qos *q, uint64_t ticket);

/* Join (or make) the group name in dir (NULL: qos_group_dir()): every
 * vblkd in it shares one set of buckets.  l: this disk's --limit, or NULL
 * / none to take the group's; a group made with other limits refuses it.
 * Returns 0, or -errno with one line in err.  Main thread. */
int qos_group_join(const char *name, const char *dir, const struct qos_limits *l,
		   struct qos **out, char *err, size_t errlen);
/* $RUNTIME_DIRECTORY/qos, else /run/vblkd/qos.  Main thread. */
const char *qos_group_dir(void);
/* The group's name, or NULL for a disk's own limits.  Any thread. */
const char *qos_group_name(const struct qos *q);

/* Roughly how long one I/O of bytes takes at the tightest limit it
 * counts in (0: none): how often a throttled queue need wake up.  Reads
 * the limits unlocked (a change races harmlessly).  Any thread. */
uint64_t qos_io_ns(const struct qos *q, bool is_write, uint64_t bytes);

/* True if any limit is set (a relaxed read).  Any thread. */
bool qos_active(const struct qos *q);
/* The flag qos_active reads, for a data path that tests it inline (its
 * only cost when no limit is set: a load and a branch).  Lives as long as
 * q.  Any thread. */
const _Atomic uint32_t *qos_active_flag(const struct qos *q);

/* The limits and the buckets' levels now (leaked to now).  Any thread. */
void qos_get(struct qos *q, struct qos_limits *l, struct qos_buckets *b, uint64_t now);
/* Replace the limits; the buckets start empty, as QEMU's
 * block_set_io_throttle leaves them (throttle_config).  Waiting I/O keeps
 * its place in line and asks again at its timer.  Any thread. */
void qos_set(struct qos *q, const struct qos_limits *l);
/* Were the limits set with qos_set since qos_new (in this process)?
 * Main thread. */
bool qos_changed(const struct qos *q);

#endif
