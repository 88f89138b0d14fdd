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
/* The same on listen_fd, a listener inherited from the process this one
 * takes over from (upgrade in place); -1: bind path. */
int ctl_server_new_fd(const char *path, int listen_fd, struct loop *l, struct blk_dev *d,
		      struct ctl_server **out, char *err, size_t errlen);
int ctl_server_listen_fd(const struct ctl_server *s);

/* {"cmd": "upgrade", "exec": PATH (optional)}: fn upgrades in place; it
 * returns the new process's pid with a line for the reply in msg, or
 * -errno with the reason in msg.  -> {"ok": true, "pid": N, "message"}. */
typedef int (*ctl_upgrade_fn)(void *opaque, const char *exec, char *msg, size_t msglen);
void ctl_server_set_upgrade(struct ctl_server *s, ctl_upgrade_fn fn, void *opaque);

/* The "stats" answer as a JSON object in buf.  Returns its length or
 * -ENOSPC. */
int ctl_stats_json(struct blk_dev *d, char *buf, size_t len);

/*
 * Handle one request line, writing the JSON reply to out.  Exposed for
 * unit tests.  Returns the reply length.
 */
int ctl_handle(struct blk_dev *d, const char *req, char *out, size_t outlen);

#endif
