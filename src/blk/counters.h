/*
 * The counters of a blk_dev, declared once (STYLE.md 17; what each means:
 * docs/architecture.md "Counters" and "I/O accounting").  Each list below
 * is one set, one row per counter; everything else is generated from it:
 * the set's stats struct (blk.h), the atomics the queue keeps
 * (blk_internal.h) and their copy into a snapshot (stats.c), the
 * descriptor table that "vblkctl stats" (ctl.c) and the Prometheus
 * families (metrics.c) are rendered from.  Adding a counter is one row,
 * plus the line that counts it (KEPT) or fills it at a snapshot (READ).
 * tests/unit/test_counters.c checks that every row reaches every output.
 *
 * X(name, type, src, kind, unit, metric, help):
 *   name    the stats struct's member and the counter's key in "vblkctl
 *           stats"
 *   type    u64, s64 (a value that may be -1), or hist (ACCT_BUCKETS
 *           counts, acct.h's latency buckets)
 *   src     KEPT: a relaxed atomic the owner keeps (struct blk_queue's
 *           ctr, written on its iothread), copied at a snapshot; READ: read
 *           at a snapshot from where it lives (the loop, the engine, the
 *           thread's configuration, the queues' accounting) by stats.c
 *   kind    COUNTER (never goes back; metric ends in _total), GAUGE,
 *           HISTOGRAM (a hist row: in "vblkctl stats" the members
 *           <name>_ns, its quantiles p50/p90/p99/p999, and <name>_buckets,
 *           the counts as kept; in the metrics a histogram family <metric>,
 *           _bucket{le} cumulative, _count, and _sum from its SUM row), or
 *           SUM (the total a HISTOGRAM row's _sum shows: its metric is that
 *           row's and "_sum"; a member of "vblkctl stats", no family of
 *           its own)
 *   unit    PLAIN, or NS: nanoseconds, shown to Prometheus as seconds (a
 *           histogram's le bounds too)
 *   metric  the Prometheus name after "vblkd_<set>_"; NULL: "vblkctl
 *           stats" only
 *   help    its HELP text
 *
 * The rows' order is the order of both outputs.
 */
#ifndef VBLK_BLK_COUNTERS_H
#define VBLK_BLK_COUNTERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "acct/acct.h"

/*
 * The disk as a whole: the JSON object "disk", families vblkd_disk_<metric>
 * without labels.  Busy time is each iothread's (the union of its queues'
 * busy periods: acct_busy), summed over iothreads; %util divides it by
 * the time and the iothreads.
 */
#define BLK_DISK_COUNTERS(X)									\
	X(in_flight, u64, READ, GAUGE, PLAIN, "requests_in_flight",				\
	  "Requests taken from the rings and not completed yet.")				\
	X(busy_ns, u64, READ, COUNTER, NS, "busy_seconds_total",				\
	  "Time with at least one request in flight, per iothread, summed over iothreads.")	\
	X(iothreads, u64, READ, GAUGE, PLAIN, NULL,						\
	  "The iothreads busy time is summed over (%util divides by them).")			\
	X(paused, u64, READ, GAUGE, PLAIN, "paused",					\
	  "1 while the disk is paused: a failed request is held (--werror, --rerror).")	\
	X(held_requests, u64, READ, GAUGE, PLAIN, "held_requests",			\
	  "Failed requests held for a retry while the disk is paused.")				\
	X(throttled_requests, u64, READ, COUNTER, PLAIN, "throttled_requests_total",		\
	  "Requests that waited for the QoS budget (--limit), all queues.")			\
	X(throttled_ns, u64, READ, COUNTER, NS, "throttled_seconds_total",			\
	  "Time queues waited for the QoS budget, all queues together.")			\
	X(limit_iops_total, u64, READ, GAUGE, PLAIN, "limit_iops",				\
	  "QoS limit iops-total (0: none).")							\
	X(limit_iops_read, u64, READ, GAUGE, PLAIN, "limit_read_iops",			\
	  "QoS limit iops-read (0: none).")							\
	X(limit_iops_write, u64, READ, GAUGE, PLAIN, "limit_write_iops",			\
	  "QoS limit iops-write (0: none).")							\
	X(limit_bps_total, u64, READ, GAUGE, PLAIN, "limit_bytes_per_second",		\
	  "QoS limit bps-total in bytes per second (0: none).")				\
	X(limit_bps_read, u64, READ, GAUGE, PLAIN, "limit_read_bytes_per_second",		\
	  "QoS limit bps-read in bytes per second (0: none).")					\
	X(limit_bps_write, u64, READ, GAUGE, PLAIN, "limit_write_bytes_per_second",		\
	  "QoS limit bps-write in bytes per second (0: none).")				\
	X(image_cache_bytes, u64, READ, GAUGE, PLAIN, "image_cache_bytes",			\
	  "Memory of the image format's metadata caches (qcow2: L2 tables and refcount "	\
	  "blocks; 0 for raw).")								\
	X(image_cache_hits, u64, READ, COUNTER, PLAIN, "image_cache_hits_total",		\
	  "Image metadata lookups the cache answered (qcow2).")				\
	X(image_cache_misses, u64, READ, COUNTER, PLAIN, "image_cache_misses_total",		\
	  "Image metadata lookups that read the image file (qcow2).")			\
	X(image_clusters_allocated, u64, READ, COUNTER, PLAIN,				\
	  "image_clusters_allocated_total", "Image clusters allocated since start (qcow2).")	\
	X(image_cow_bytes, u64, READ, COUNTER, PLAIN, "image_copy_on_write_bytes_total",	\
	  "Bytes copied into new clusters around partial writes (qcow2 copy on write).")	\
	X(image_cor_bytes, u64, READ, COUNTER, PLAIN, "image_copy_on_read_bytes_total",	\
	  "Bytes copied up from the backing chain by --copy-on-read and vblkctl stream.")	\
	X(image_streaming, u64, READ, GAUGE, PLAIN, "image_streaming",			\
	  "1 while vblkctl stream copies the backing chain into the image.")			\
	X(image_stream_pos, u64, READ, GAUGE, PLAIN, "image_stream_position_bytes",		\
	  "Bytes of the disk the last stream has gone past (its progress).")		\
	X(image_clusters_reused, u64, READ, COUNTER, PLAIN, "image_clusters_reused_total",	\
	  "Image clusters freed (discard, copy on write) and allocated again (qcow2).")	\
	X(image_bitmap_regions, u64, READ, COUNTER, PLAIN,					\
	  "image_bitmap_regions_written_ahead_total",						\
	  "Regions of the disk whose bits were set in the image's persistent bitmaps "	\
	  "before their first write (qcow2; one sync each: what keeps them across a crash).")	\
	X(image_corrupt, u64, READ, GAUGE, PLAIN, "image_corrupt",				\
	  "1 once the image was found corrupt (qcow2: marked so in its header; writes "	\
	  "fail until qemu-img check -r all repairs it).")

/* Pauses by reason (enum disk_pause_reason, disk_pause_reason_name): "disk":
 * {"pauses": {"enospc": {"count": N}, ...}}, series labelled
 * reason="enospc". */
#define BLK_PAUSE_COUNTERS(X)									\
	X(count, u64, READ, COUNTER, PLAIN, "pauses_total",					\
	  "Times the disk paused (the error policy), by the error that paused it.")

/*
 * Per operation (enum acct_op, acct_op_name), per front: the virtio-blk
 * device's in "disk": {"ops": {"read": {...}, ...}}, the NBD server's in
 * "disk": {"nbd_ops": {...}}; series labelled front="virtio-blk" or
 * front="nbd", and op="read".  For NBD: from reading a request's header
 * (its payload received) to queueing its reply.  Kept per queue by acct_done,
 * summed over queues at a snapshot.  A request counts once it completes,
 * in requests or errors; the time and the histogram are of the successful
 * ones (requests is the histogram's _count), from taking the request off
 * the ring to pushing its used element.
 */
#define BLK_OP_COUNTERS(X)									\
	X(requests, u64, READ, COUNTER, PLAIN, "requests_total",				\
	  "Requests completed successfully.")							\
	X(bytes, u64, READ, COUNTER, PLAIN, "bytes_total",					\
	  "Bytes of the requests completed successfully: read, written, discarded or zeroed.") \
	X(errors, u64, READ, COUNTER, PLAIN, "errors_total",					\
	  "Requests completed with an error status.")						\
	X(total_ns, u64, READ, SUM, NS, "request_duration_seconds_sum",			\
	  "Time the requests completed successfully took, all together.")			\
	X(latency, hist, READ, HISTOGRAM, NS, "request_duration_seconds",			\
	  "Time from taking a request off the ring to completing it successfully.")

/* Per queue: the JSON array "queues", series labelled queue="N". */
#define BLK_QUEUE_COUNTERS(X)									\
	X(iothread, u64, READ, GAUGE, PLAIN, "iothread", "The iothread a queue runs on.")	\
	X(requests, u64, KEPT, COUNTER, PLAIN, "requests_total",				\
	  "Requests taken from the queue's ring.")						\
	X(bad_requests, u64, KEPT, COUNTER, PLAIN, "bad_requests_total",			\
	  "Requests failed for a malformed descriptor chain or header.")			\
	X(kicks, u64, KEPT, COUNTER, PLAIN, "kicks_total",					\
	  "Kicks (guest notifications) received.")						\
	X(calls, u64, KEPT, COUNTER, PLAIN, "calls_total",					\
	  "Calls (interrupts) sent to the guest.")						\
	X(calls_early, u64, KEPT, COUNTER, PLAIN, "calls_early_total",				\
	  "Calls sent early: the first completion a sleeping driver waits for.")		\
	X(calls_suppressed, u64, KEPT, COUNTER, PLAIN, "calls_suppressed_total",		\
	  "Completed batches the driver did not want a call for.")				\
	X(calls_held, u64, KEPT, COUNTER, PLAIN, "calls_held_total",				\
	  "Calls held back by interrupt moderation for more completions to share.")		\
	X(calls_held_idle, u64, KEPT, COUNTER, PLAIN, "calls_held_idle_total",			\
	  "Held calls that waited on with nothing in flight, for requests yet to come.")	\
	X(calls_held_wasted, u64, KEPT, COUNTER, PLAIN, "calls_held_wasted_total",		\
	  "Stream holds during which the driver sent nothing (each backs such holds off).")	\
	X(completions_coalesced, u64, KEPT, COUNTER, PLAIN, "completions_coalesced_total",	\
	  "Completions that shared a held call.")						\
	X(hold_ns_total, u64, KEPT, COUNTER, NS, "hold_seconds_total",				\
	  "Time calls were held, all holds together.")						\
	X(hold_late_ns_total, u64, KEPT, COUNTER, NS, "hold_late_seconds_total",		\
	  "Of the time calls were held, the time past their deadlines (the iothread ran late).") \
	X(hold_ns_max, u64, KEPT, GAUGE, NS, "hold_max_seconds",				\
	  "Longest time one call was held.")							\
	X(throttled_requests, u64, KEPT, COUNTER, PLAIN, "throttled_requests_total",		\
	  "Requests that waited for the QoS budget (--limit) before going to the disk.")	\
	X(throttled_ns, u64, READ, COUNTER, NS, "throttled_seconds_total",			\
	  "Time the queue waited for the QoS budget (a wait under way included).")		\
	X(poll_hits, u64, READ, COUNTER, PLAIN, "poll_hits_total",				\
	  "Times busy-polling found requests.")							\
	X(poll_misses, u64, READ, COUNTER, PLAIN, "poll_misses_total",				\
	  "Times requests came by kick after the iothread slept.")				\
	X(poll_vain, u64, READ, COUNTER, PLAIN, "poll_vain_total",				\
	  "Polling windows that found nothing before a sleep longer than the cap.")		\
	X(poll_ns, u64, READ, GAUGE, NS, "poll_window_seconds",					\
	  "The queue's current adaptive polling window.")

/* Per iothread: the JSON array "iothreads", series labelled iothread="N". */
#define BLK_IOTHREAD_COUNTERS(X)								\
	X(busy_ns, u64, READ, COUNTER, NS, "busy_seconds_total",				\
	  "Wall time the iothread was not asleep.")						\
	X(cpu_ns, u64, READ, COUNTER, NS, "cpu_seconds_total", "CPU time of the iothread.")	\
	X(poll_ns_total, u64, READ, COUNTER, NS, "poll_seconds_total",				\
	  "Wall time the iothread spent busy-polling.")						\
	X(contended, u64, READ, COUNTER, PLAIN, "contended_total",				\
	  "Times polling stopped because another thread wanted the CPU.")			\
	X(backend_submits, u64, READ, COUNTER, PLAIN, "backend_submits_total",			\
	  "Syscalls that handed queued I/O to the disk (io_uring_enter; io_uring only).")	\
	X(backend_polled, u64, READ, COUNTER, PLAIN, "backend_polled_total",			\
	  "I/Os whose completion was found by polling the device (io_uring IOPOLL, --iopoll).")	\
	X(backend_sync, u64, READ, COUNTER, PLAIN, "backend_sync_total",			\
	  "Reads and writes done with a plain system call on the iothread, not through "	\
	  "the ring (io_uring on tmpfs or ramfs).")						\
	X(completion_windows, u64, READ, COUNTER, PLAIN, "completion_windows_total",		\
	  "Polling windows spun for the disk's completions.")					\
	X(completion_poll_hits, u64, READ, COUNTER, PLAIN, "completion_poll_hits_total",	\
	  "Disk completions found by polling (backends with a completion window).")		\
	X(completion_poll_misses, u64, READ, COUNTER, PLAIN, "completion_poll_misses_total",	\
	  "Disk completions that came by their fd after the iothread slept.")			\
	X(device_spin_checks, u64, READ, COUNTER, PLAIN, "device_spin_checks_total",		\
	  "Measurements of whether spinning pays while the disk works (io_uring: "		\
	  "timed requests spinning and not) that came to a decision.")				\
	X(device_spin_off, u64, READ, GAUGE, PLAIN, "device_spin_off",				\
	  "1 while the last such measurement has the iothread sleep while the disk works.")	\
	X(poll_yields, u64, READ, COUNTER, PLAIN, "poll_yields_total",				\
	  "Sleeps without polling: the completion waited for was being made on the "		\
	  "iothread's CPU (io_uring's worker, page cache).")					\
	X(poll_checks, u64, READ, COUNTER, PLAIN, "poll_checks_total",			\
	  "Checks of whether polling pays end to end (time per request with and "	\
	  "without spinning) that came to a decision.")					\
	X(poll_checks_off, u64, READ, COUNTER, PLAIN, "poll_checks_off_total",		\
	  "Of those, checks that switched spinning off (not polling was faster).")	\
	X(poll_checks_aborted, u64, READ, COUNTER, PLAIN, "poll_checks_aborted_total",	\
	  "Checks ended without a decision (the load stopped, contention, a ring "	\
	  "restarted).")								\
	X(poll_check_off, u64, READ, GAUGE, PLAIN, "poll_check_off",			\
	  "1 while the last check has spinning off.")					\
	X(cpu, s64, READ, GAUGE, PLAIN, "pinned_cpu",						\
	  "The CPU an iothread is pinned to, -1 if none.")

#define BLK_COUNTER_CTYPE_u64 uint64_t
#define BLK_COUNTER_CTYPE_s64 int64_t
#define BLK_COUNTER_CTYPE_hist uint64_t
#define BLK_COUNTER_DIM_u64
#define BLK_COUNTER_DIM_s64
#define BLK_COUNTER_DIM_hist [ACCT_BUCKETS]
#define BLK_COUNTER_MEMBER(name, type, ...) \
	BLK_COUNTER_CTYPE_##type name BLK_COUNTER_DIM_##type;

/* A snapshot of the disk's own counters. */
struct blk_disk_stats {
	BLK_DISK_COUNTERS(BLK_COUNTER_MEMBER)
};

/* A snapshot of the pauses of one reason. */
struct blk_pause_stats {
	BLK_PAUSE_COUNTERS(BLK_COUNTER_MEMBER)
};

/* A snapshot of one operation's counters, all queues together. */
struct blk_op_stats {
	BLK_OP_COUNTERS(BLK_COUNTER_MEMBER)
};

/* A snapshot of one queue's counters (blk_stats_snapshot). */
struct blk_queue_stats {
	BLK_QUEUE_COUNTERS(BLK_COUNTER_MEMBER)
};

/* A snapshot of one iothread's counters. */
struct blk_iothread_stats {
	BLK_IOTHREAD_COUNTERS(BLK_COUNTER_MEMBER)
};

/* ---- The descriptor table, for whoever renders the counters ---- */

enum blk_counter_kind {
	BLK_COUNTER_COUNTER,
	BLK_COUNTER_GAUGE,
	BLK_COUNTER_HISTOGRAM,
	BLK_COUNTER_SUM,
};
enum blk_counter_unit { BLK_COUNTER_PLAIN, BLK_COUNTER_NS };

/* One row, as the list above gives it. */
struct blk_counter {
	const char *name;		/* member and JSON key */
	const char *metric;		/* after "vblkd_<set>_"; NULL: JSON only */
	const char *help;
	enum blk_counter_kind kind;
	enum blk_counter_unit unit;
	bool is_signed;			/* int64_t, else uint64_t */
	size_t off;			/* in the set's stats struct */
};

/*
 * One set: a stats struct per element, and per row one Prometheus family
 * vblkd_<prefix>_<metric> with a series per element.  The elements are
 * one of:
 *   - numbered (elem_name NULL: a queue, an iothread): series labelled
 *     <label>="N", a JSON array of one object per element, keyed by the
 *     rows' names;
 *   - named (elem_name: an operation): series labelled <label>="<name>",
 *     a JSON object of one such object per element, keyed by its name;
 *   - one (label NULL: the disk): series without labels, one JSON object.
 * The JSON is the member json of "vblkctl stats", or of the object of set
 * parent (which then has it after its own rows).  A set of its own is one
 * more list here, its stats struct, an enum value, a row of
 * blk_counter_sets (stats.c), its elements in struct blk_stats and its
 * case in blk_stats_elems (blk.h); the renderers walk every set as they
 * are.
 */
enum blk_counter_set_id {
	/* The disk's first: an operator reads them first (the metrics show
	 * them before anything else, the stats JSON as its first member). */
	BLK_COUNTERS_OP,
	BLK_COUNTERS_NBD_OP,
	BLK_COUNTERS_DISK,
	BLK_COUNTERS_PAUSE,
	BLK_COUNTERS_QUEUE,
	BLK_COUNTERS_IOTHREAD,
	BLK_COUNTER_SETS
};

struct blk_counter_set {
	const char *prefix;		/* "queue": vblkd_queue_<metric> */
	const char *label;		/* "queue": the series' label; NULL: one element */
	const char *json;		/* "queues": its member in "vblkctl stats" */
	int parent;			/* -1, or the set whose JSON object has json */
	/* The name of element i (label value, JSON key); NULL: numbered. */
	const char *(*elem_name)(unsigned i);
	const struct blk_counter *rows;
	unsigned nrows;
	size_t size;			/* of one element's stats struct */
	/* The front whose requests these are: every series gets the label
	 * front="<front>" (NULL: none). */
	const char *front;
	/* -1, or the set whose families this one's series join (the same
	 * rows, another front): rendered there, after that set's own. */
	int family_of;
};

/* In the order "vblkctl stats" and the metrics show them.  Read-only. */
extern const struct blk_counter_set blk_counter_sets[BLK_COUNTER_SETS];

/* The value of row c in the element at elem (a set's stats struct), as
 * its type has it (an s64 row's -1 stays -1). */
static inline uint64_t blk_counter_u64(const struct blk_counter *c, const void *elem)
{
	return *(const uint64_t *)((const char *)elem + c->off);
}

static inline int64_t blk_counter_s64(const struct blk_counter *c, const void *elem)
{
	return *(const int64_t *)((const char *)elem + c->off);
}

/* A hist row's ACCT_BUCKETS counts (not cumulative). */
static inline const uint64_t *blk_counter_hist(const struct blk_counter *c, const void *elem)
{
	return (const uint64_t *)((const char *)elem + c->off);
}

#endif
