/*
 * vctl_: what vblkctl's commands share: one request to the daemon's
 * control socket (one JSON line each way, one connection per request), and
 * the commands that take more than one (iostat).
 */
#ifndef VBLK_VCTL_H
#define VBLK_VCTL_H

#include <stddef.h>

struct json_object;

/*
 * Send req (a JSON object) to the vblkd whose control socket is at path
 * and wait up to wait_ms for each part of its reply.  Returns 0 with the
 * reply parsed in *reply (a JSON object; the caller puts it) and its text
 * in *text (malloc'd, the caller frees; NULL: not wanted), or -errno with
 * one line in err: no daemon there (-ECONNREFUSED, -ENOENT...), no reply
 * in time (-ETIMEDOUT), the connection closed without one (-ECONNRESET),
 * a reply that is not a JSON object (-EPROTO), -EINTR if a signal came
 * while waiting.
 */
int vctl_call(const char *path, struct json_object *req, int wait_ms,
	      struct json_object **reply, char **text, char *err, size_t errlen);

/* vblkctl iostat: every interval_s seconds one line of what the disk did
 * since the last (count lines; 0: until SIGINT, then exit 0), as text or
 * one JSON object per line.  Returns the exit status; the daemon gone or
 * not answering is one line on stderr and exit 1 (cli_die). */
int vctl_iostat(const char *path, double interval_s, unsigned long count, int json);

#endif
