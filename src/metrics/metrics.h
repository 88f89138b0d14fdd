/*
 * metrics_: vblkd's counters for Prometheus, in the text exposition format
 * 0.0.4: families named vblkd_*, each with its # HELP and # TYPE lines;
 * counters end in _total; times are in seconds (the ns counters divided,
 * printed exactly: 1500000000 ns is 1.5); per-queue series are labelled
 * queue="N", per-iothread ones iothread="N".  The families are listed in
 * README.md ("Watching it").
 *
 * Rendered on the main thread, where the control socket's "stats" reads
 * the same counters (blk_stats_snapshot: relaxed atomics, read on each
 * iothread through loop_call_sync), and served as the control command
 * "metrics" (metrics_ctl_cmd, added by vblkd with ctl_server_add_cmd):
 * {"metrics": "TEXT"}; vblkctl metrics prints TEXT.
 */
#ifndef VBLK_METRICS_H
#define VBLK_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bdev;
struct blk_dev;
struct blk_stats;
struct json_object;
struct vu_server;

/* Where a scrape's values come from.  Filled by vblkd's main; read on
 * the main thread at each scrape. */
struct metrics_source {
	struct blk_dev *dev;
	const struct bdev *disk;	/* size (grows on resize), path, engine */
	struct vu_server *srv;		/* NULL: no frontend counters (0) */
	uint64_t start_time_ns;		/* CLOCK_REALTIME at start */
};

/* Set m up for dev on disk, started now (srv still NULL).  Any thread. */
void metrics_source_init(struct metrics_source *m, struct blk_dev *dev,
			 const struct bdev *disk);

/* What one scrape shows, gathered at one moment (metrics_render) or made
 * up (tests): what metrics_format turns into text. */
struct metrics_snapshot {
	const struct blk_stats *blk;	/* counters, polling knobs */
	const char *version;
	const char *disk_path;		/* may be NULL (null backend) */
	const char *engine;
	uint64_t disk_size;		/* bytes */
	bool read_only;
	bool frontend_connected;
	uint64_t frontend_connections;	/* served so far */
	uint64_t start_time_ns;		/* CLOCK_REALTIME */
	uint64_t process_cpu_ns;	/* all threads */
};

/* s as exposition text in *out (malloc'd, NUL-terminated; the caller
 * frees).  Returns its length or -ENOMEM.  Any thread. */
int metrics_format(const struct metrics_snapshot *s, char **out);

/* Gather from src and format.  Returns the length or -ENOMEM.  Main
 * thread. */
int metrics_render(const struct metrics_source *src, char **out);

/* The control command "metrics" (a ctl_cmd_fn; opaque is the struct
 * metrics_source): reply {"metrics": TEXT}.  Main thread. */
int metrics_ctl_cmd(void *opaque, struct json_object *req, struct json_object *reply,
		    char *err, size_t errlen);

#endif
