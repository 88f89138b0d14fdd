/*
 * ctl_: the control socket (--control PATH).  One JSON request per
 * connection, one JSON line back (json-c: parsed strictly, replies built
 * as objects and serialized with JSON_C_TO_STRING_SPACED, so a reply reads
 * { "ok": true, "size": 1024 }):
 *
 *   {"cmd": "stats"}
 *     -> {"disk": {"in_flight": N, "busy_ns": N, "iothreads": N,
 *                  "ops": {"read": {"requests": N, ..., "latency_ns":
 *                                   {"p50": N, ...}, "latency_buckets":
 *                                   [N, ...]}, "write": ...}},
 *         "queues": [{"iothread": N, "requests": N, ...}, ...],
 *         "iothreads": [{"busy_ns": N, ...}, ...],
 *         "poll": {"max_ns", "completion_max_ns", "grow", "shrink", "check"}}
 *        a member per counter set (blk/counters.h: an object for the disk,
 *        with the operations' set inside it, keyed by operation; an array
 *        of objects for the queues and the iothreads), a member per
 *        counter in the order the table lists them
 *   {"cmd": "set-poll", "max_ns": N, "completion_max_ns": N, "grow": N,
 *    "shrink": N, "check": true|false (the pay check; --no-poll-check)}
 *    (any subset)
 *     -> {"ok": true, "poll": {...}}
 *   {"cmd": "resize", "size": BYTES}   (grow the disk; blk_dev_resize)
 *     -> {"ok": true, "size": N, "notified": true|false (the frontend told)}
 *   commands added with ctl_server_add_cmd (vblkd adds "metrics") or
 *   ctl_server_set_upgrade ("upgrade")
 *   anything else -> {"error": "..."}
 *
 * A request that is not one JSON object, has no "cmd" string, names an
 * unknown command, or gives a known field of the wrong type or range gets
 * an error and changes nothing.  Fields a command does not know are
 * ignored.
 *
 * Only root and the daemon's own user are served (SO_PEERCRED): the
 * socket's file mode is typically shared with the vhost-user socket's
 * group, which QEMU's user may be in; anyone else gets {"error":
 * "permission denied: ..."} at once, nothing read.
 *
 * Threading: main thread (runs on the main loop).
 */
#ifndef VBLK_CTL_H
#define VBLK_CTL_H

#include <stddef.h>

struct blk_dev;
struct blk_stats;
struct json_object;
struct loop;
struct ctl_server;

/* Listen on path.  Returns 0 or -errno with one line for the user in err;
 * nothing is left behind on failure. */
int ctl_server_new(const char *path, struct loop *l, struct blk_dev *d,
		   struct ctl_server **out, char *err, size_t errlen);
/*
 * Serve on listen_fd, a unix stream socket already bound to path and
 * listening (one handed over by the process we replace: upgrade in
 * place); -1: bind path, as ctl_server_new.  The fd is made non-blocking
 * and close-on-exec.  On success the server owns it; on failure (-errno,
 * one line in err; -ENOTSOCK or -EINVAL for an fd that is not a listening
 * stream socket) the caller still does.  path is what ctl_server_free
 * unlinks.
 */
int ctl_server_new_fd(const char *path, int listen_fd, struct loop *l, struct blk_dev *d,
		      struct ctl_server **out, char *err, size_t errlen);
/* The listening socket (to hand over to a new process).  Any thread. */
int ctl_server_listen_fd(const struct ctl_server *s);
/* Stop serving, close the socket, unlink its path.  NULL is a no-op. */
void ctl_server_free(struct ctl_server *s);
/* The same, but leave the path alone: another process (the one that took
 * over the listening socket) serves it now. */
void ctl_server_free_keep_path(struct ctl_server *s);

/*
 * A command's handler.  req is the whole request (a JSON object whose
 * "cmd" named this command; the handler reads its own fields), reply an
 * empty object the handler fills (json_object_object_add).  Returns 0:
 * reply is sent; or -errno with one line in err: the client gets
 * {"error": err} instead, and the handler must have changed nothing.
 * Runs on the main thread, inside the main loop, which waits for it (the
 * control socket serves one client at a time): block only as long as the
 * command itself must (upgrade does, for the handover).
 */
typedef int (*ctl_cmd_fn)(void *opaque, struct json_object *req,
			  struct json_object *reply, char *err, size_t errlen);

/*
 * Serve command name with fn(opaque, ...) from now on.  name is copied.
 * Returns 0, -EEXIST if the name is taken (built-in or added before),
 * -EINVAL for an empty name, -ENOMEM.  Main thread.
 */
int ctl_server_add_cmd(struct ctl_server *s, const char *name, ctl_cmd_fn fn, void *opaque);

/*
 * {"cmd": "upgrade", "exec": PATH (optional string)}: fn upgrades in place
 * (a command added as with ctl_server_add_cmd).  fn returns the new
 * process's pid with a line for the reply in msg, or -errno with the
 * reason in msg.  -> {"ok": true, "pid": N, "message": msg}.  Main thread.
 */
typedef int (*ctl_upgrade_fn)(void *opaque, const char *exec, char *msg, size_t msglen);
void ctl_server_set_upgrade(struct ctl_server *s, ctl_upgrade_fn fn, void *opaque);

/* The "stats" answer as a JSON object in buf.  Returns its length or
 * -ENOSPC (buf cannot hold it with its NUL), -ENOMEM.  Main thread. */
int ctl_stats_json(struct blk_dev *d, char *buf, size_t len);
/* The same for a snapshot taken before (or made up).  Any thread. */
int ctl_stats_format(const struct blk_stats *st, char *buf, size_t len);

/*
 * Handle one request line with the built-in commands only (no server, so
 * none added with ctl_server_add_cmd), writing the JSON reply to out,
 * NUL-terminated inside outlen; a reply that does not fit becomes an
 * error, cut to fit.  Returns the length written.  Exposed for unit tests.
 */
int ctl_handle(struct blk_dev *d, const char *req, char *out, size_t outlen);

#endif
