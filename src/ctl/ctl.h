/*
 * ctl_: the control socket (--control PATH).  One JSON request per
 * connection, one JSON line back:
 *
 *   {"cmd": "stats"}
 *     -> {"queues": [{"iothread", "requests", "kicks", "calls",
 *         "calls_early", "calls_suppressed", "calls_held", "completions_coalesced",
 *         "hold_ns_max", "hold_ns_total", "bad_requests", "poll_hits", "poll_misses",
 *         "poll_ns"}, ...],
 *         "iothreads": [{"busy_ns", "cpu_ns", "poll_ns_total", "contended",
 *         "cpu"}, ...],
 *         "poll": {"max_ns", "grow", "shrink"}}
 *   {"cmd": "set-poll", "max_ns": N, "grow": N, "shrink": N}   (any subset)
 *     -> {"ok": true, "poll": {...}}
 *   {"cmd": "resize", "size": BYTES}   (grow the disk; blk_dev_resize)
 *     -> {"ok": true, "size": N, "notified": true|false (the frontend told)}
 *   anything else -> {"error": "..."}
 *
 * Threading: main thread (runs on the main loop).
 */
#ifndef VBLK_CTL_H
#define VBLK_CTL_H

#include <stddef.h>

struct blk_dev;
struct loop;
struct ctl_server;

/* Listen on path.  Returns 0 or -errno with one line for the user in err;
 * nothing is left behind on failure. */
int ctl_server_new(const char *path, struct loop *l, struct blk_dev *d,
		   struct ctl_server **out, char *err, size_t errlen);
void ctl_server_free(struct ctl_server *s);

/* The "stats" answer as a JSON object in buf.  Returns its length or
 * -ENOSPC. */
int ctl_stats_json(struct blk_dev *d, char *buf, size_t len);

/*
 * Handle one request line, writing the JSON reply to out.  Exposed for
 * unit tests.  Returns the reply length.
 */
int ctl_handle(struct blk_dev *d, const char *req, char *out, size_t outlen);

#endif
