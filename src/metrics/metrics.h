/*
 * metrics_: vblkd's counters for Prometheus, in the text exposition format
 * 0.0.4: families named vblkd_*, each with its # HELP and # TYPE lines;
 * counters end in _total; times are in seconds (the ns counters divided,
 * printed exactly: 1500000000 ns is 1.5); per-operation series are
 * labelled op="read" (the disk's, first), per-queue ones queue="N",
 * per-iothread ones iothread="N"; latency is a histogram.  The families
 * are listed in README.md ("Watching it").
 *
 * Served two ways, both rendered on the main thread, where the control
 * socket's "stats" reads the same counters (blk_stats_snapshot: relaxed
 * atomics, read on each iothread through loop_call_sync; no new thread
 * ever touches the data path):
 *   - the control command "metrics" (metrics_ctl_cmd, added by vblkd with
 *     ctl_server_add_cmd): {"metrics": "TEXT"}; vblkctl metrics prints TEXT;
 *   - vblkd --metrics ADDR:PORT: HTTP GET /metrics (metrics_http_*), by
 *     libmicrohttpd in its epoll mode with no thread of its own: its epoll
 *     fd is watched by the main loop, MHD_run runs when it is readable, and
 *     a main-loop timer runs it when MHD_get_timeout asks (idle
 *     connections are closed after 10 s); a scrape within 100 ms of the
 *     last rendering gets that rendering.
 */
#ifndef VBLK_METRICS_H
#define VBLK_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "job/job.h"
#include "backup/bkp.h"
#include "mirror/mir.h"
#include "nbd/nbds.h"

struct bdev;
struct blk_dev;
struct blk_stats;
struct json_object;
struct loop;
struct vu_server;

/* Where a scrape's values come from.  Filled by vblkd's main; read on
 * the main thread at each scrape. */
struct metrics_source {
	struct blk_dev *dev;
	/* *disk: the disk served now (a mirror's pivot replaces it): size
	 * (grows on resize), path, engine */
	struct bdev *const *disk;
	struct vu_server *srv;		/* NULL: no frontend counters (0) */
	struct nbds *nbds;		/* NULL: no NBD server counters (0) */
	struct bkp_set *bkps;		/* NULL: no backups */
	struct mir_set *mirs;		/* NULL: no mirrors */
	uint64_t start_time_ns;		/* CLOCK_REALTIME at start */
};

/* Set m up for dev on disk, started now (srv still NULL).  Any thread. */
void metrics_source_init(struct metrics_source *m, struct blk_dev *dev,
			 struct bdev *const *disk);

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
	struct nbds_stats nbd;		/* the NBD server's (nbds.h) */
	const struct job_info *jobs;	/* the block jobs (job.h), njobs */
	unsigned njobs;
	const struct bkp_info *backups;	/* running backups (bkp.h) */
	unsigned nbackups;
	const struct mir_info *mirrors;	/* running mirrors (mir.h) */
	unsigned nmirrors;
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

/* ---- HTTP: vblkd --metrics ---- */

struct metrics_http;

/*
 * Serve src's metrics at http://ADDR:PORT/metrics (GET or HEAD; other
 * paths 404, other methods 405) on loop l, the main loop.
 * addr: "127.0.0.1:9720", "[::1]:9720", or ":9720" for every address
 * (IPv6 and IPv4); numeric only; port 0 takes a free one
 * (metrics_http_port says which).  With listen_fd >= 0 that listening TCP
 * socket is served instead (handed over by the process we replace: upgrade
 * in place) and addr is not used.
 * Returns 0, or -errno with one line for the user in err: -EINVAL a bad
 * addr or listen_fd, -EADDRINUSE the port is taken, -ENOTSUP built without
 * libmicrohttpd.  Nothing is left behind on failure, and a listen_fd given
 * stays the caller's; on success the server owns it.  Main thread; src
 * must outlive the server.
 */
int metrics_http_new(const char *addr, int listen_fd, struct loop *l,
		     const struct metrics_source *src, struct metrics_http **out,
		     char *err, size_t errlen);
/* The listening socket (to hand over to a new process) and its port.
 * Any thread. */
int metrics_http_listen_fd(const struct metrics_http *h);
unsigned metrics_http_port(const struct metrics_http *h);
/* Close every connection and our copy of the listening socket (never
 * shut down: a copy handed to another process keeps listening).  NULL is
 * a no-op.  Main thread. */
void metrics_http_free(struct metrics_http *h);

#endif
