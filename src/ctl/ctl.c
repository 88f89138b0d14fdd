#include "ctl/ctl.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "blk/blk.h"
#include "loop/loop.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sock.h"

#define CTL_MAX_REQ 4096
#define CTL_MAX_REPLY 65536

struct ctl_server {
	char *path;
	int fd;
	struct loop *loop;
	struct loop_fd *h;
	struct blk_dev *dev;
	ctl_upgrade_fn upgrade;
	void *upgrade_opaque;
};

/* Append to a bounded buffer; *n becomes > len on overflow. */
static void put(char *buf, size_t len, size_t *n, const char *fmt, ...)
{
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = vsnprintf(*n < len ? buf + *n : NULL, *n < len ? len - *n : 0, fmt, ap);
	va_end(ap);
	if (r > 0)
		*n += (size_t)r;
}

static void put_poll(struct blk_dev *d, char *buf, size_t len, size_t *n)
{
	struct loop_poll_params p;

	blk_get_poll_params(d, &p);
	put(buf, len, n, "\"poll\": {\"max_ns\": %" PRIu64 ", \"completion_max_ns\": %" PRIu64
	    ", \"grow\": %u, \"shrink\": %u}", p.max_ns, p.completion_max_ns, p.grow, p.shrink);
}

int ctl_stats_json(struct blk_dev *d, char *buf, size_t len)
{
	unsigned nq = blk_dev_num_queues(d), nt = blk_dev_num_iothreads(d);
	struct blk_queue_stats *qs = calloc(nq, sizeof(*qs));
	struct blk_iothread_stats *ts = calloc(nt, sizeof(*ts));
	size_t n = 0;

	if (!qs || !ts) {
		free(qs);
		free(ts);
		return -ENOMEM;
	}
	blk_get_stats(d, qs, ts);
	put(buf, len, &n, "{\"queues\": [");
	for (unsigned i = 0; i < nq; i++)
		put(buf, len, &n, "%s{\"iothread\": %u, \"requests\": %" PRIu64 ", \"kicks\": %" PRIu64
		    ", \"calls\": %" PRIu64 ", \"calls_early\": %" PRIu64
		    ", \"calls_suppressed\": %" PRIu64 ", \"calls_held\": %" PRIu64
		    ", \"completions_coalesced\": %" PRIu64 ", \"hold_ns_max\": %" PRIu64
		    ", \"hold_ns_total\": %" PRIu64
		    ", \"bad_requests\": %" PRIu64 ", \"poll_hits\": %" PRIu64
		    ", \"poll_misses\": %" PRIu64 ", \"poll_ns\": %" PRIu64 "}",
		    i ? ", " : "", qs[i].iothread, qs[i].requests, qs[i].kicks, qs[i].calls,
		    qs[i].calls_early, qs[i].calls_suppressed, qs[i].calls_held,
		    qs[i].completions_coalesced, qs[i].hold_ns_max, qs[i].hold_ns_total,
		    qs[i].bad_requests,
		    qs[i].poll_hits, qs[i].poll_misses, qs[i].poll_ns);
	put(buf, len, &n, "], \"iothreads\": [");
	for (unsigned i = 0; i < nt; i++)
		put(buf, len, &n, "%s{\"busy_ns\": %" PRIu64 ", \"cpu_ns\": %" PRIu64
		    ", \"poll_ns_total\": %" PRIu64 ", \"contended\": %" PRIu64
		    ", \"cpu\": %d}", i ? ", " : "", ts[i].busy_ns, ts[i].cpu_ns,
		    ts[i].poll_ns_total, ts[i].contended, ts[i].cpu);
	put(buf, len, &n, "], ");
	put_poll(d, buf, len, &n);
	put(buf, len, &n, "}");
	free(qs);
	free(ts);
	return n < len ? (int)n : -ENOSPC;
}

/* Minimal JSON field lookup for flat request objects: finds "key": and
 * returns a pointer just past the colon (whitespace skipped), or NULL. */
static const char *json_field(const char *s, const char *key)
{
	size_t kl = strlen(key);

	for (const char *p = strchr(s, '"'); p; p = strchr(p + 1, '"')) {
		const char *q = p + 1;

		if (strncmp(q, key, kl) == 0 && q[kl] == '"') {
			q += kl + 1;
			while (*q == ' ' || *q == '\t')
				q++;
			if (*q != ':')
				continue;
			q++;
			while (*q == ' ' || *q == '\t')
				q++;
			return q;
		}
	}
	return NULL;
}

/* Unsigned number field: 1 found, 0 absent, -1 malformed. */
static int json_u64(const char *s, const char *key, uint64_t *v)
{
	const char *p = json_field(s, key);
	char *end;

	if (!p)
		return 0;
	if (*p < '0' || *p > '9')
		return -1;
	errno = 0;
	*v = strtoull(p, &end, 10);
	if (errno || (*end && *end != ',' && *end != '}' && *end != ' ' && *end != '\n'))
		return -1;
	return 1;
}

/* Returns the bytes written (snprintf's would-be length clamped to what
 * fit), as ctl_handle promises. */
static int reply_error(char *out, size_t outlen, const char *msg)
{
	size_t n = 0;

	put(out, outlen, &n, "{\"error\": \"");
	/* msg may quote a user's path: escape what JSON needs escaped. */
	for (const char *p = msg; *p; p++) {
		if (*p == '"' || *p == '\\')
			put(out, outlen, &n, "\\%c", *p);
		else if ((unsigned char)*p < 0x20)
			put(out, outlen, &n, "\\u%04x", *p);
		else
			put(out, outlen, &n, "%c", *p);
	}
	put(out, outlen, &n, "\"}");
	return outlen ? (int)MIN(n, outlen - 1) : 0;
}

int ctl_handle(struct blk_dev *d, const char *req, char *out, size_t outlen)
{
	const char *cmd = json_field(req, "cmd");
	size_t n = 0;

	if (!cmd || *cmd != '"')
		return reply_error(out, outlen, "request needs a \"cmd\" string");
	cmd++;
	if (!strncmp(cmd, "stats\"", 6)) {
		int r = ctl_stats_json(d, out, outlen);

		return r < 0 ? reply_error(out, outlen, "reply too large") : r;
	}
	if (!strncmp(cmd, "set-poll\"", 9)) {
		struct loop_poll_params p;
		uint64_t v;
		int r;

		blk_get_poll_params(d, &p);
		if ((r = json_u64(req, "max_ns", &v)) < 0 || (r && v > 1000000000ull))
			return reply_error(out, outlen, "max_ns must be 0..1000000000");
		if (r)
			p.max_ns = v;
		if ((r = json_u64(req, "completion_max_ns", &v)) < 0 ||
		    (r && v > 1000000000ull))
			return reply_error(out, outlen, "completion_max_ns must be 0..1000000000");
		if (r)
			p.completion_max_ns = v;
		if ((r = json_u64(req, "grow", &v)) < 0 || (r && (v < 2 || v > 1024)))
			return reply_error(out, outlen, "grow must be 2..1024");
		if (r)
			p.grow = (unsigned)v;
		if ((r = json_u64(req, "shrink", &v)) < 0 || (r && v > 1024))
			return reply_error(out, outlen, "shrink must be 0..1024");
		if (r)
			p.shrink = (unsigned)v;
		blk_set_poll_params(d, &p);
		log_info("polling set: max %" PRIu64 " ns, completions %" PRIu64 " ns, grow %u, "
			 "shrink %u", p.max_ns, p.completion_max_ns, p.grow, p.shrink);
		put(out, outlen, &n, "{\"ok\": true, ");
		put_poll(d, out, outlen, &n);
		put(out, outlen, &n, "}");
		return outlen ? (int)MIN(n, outlen - 1) : 0;
	}
	if (!strncmp(cmd, "resize\"", 7)) {
		char err[256];
		uint64_t v;
		int r;

		if (json_u64(req, "size", &v) != 1)
			return reply_error(out, outlen, "resize needs \"size\": BYTES");
		r = blk_dev_resize(d, v, err, sizeof(err));
		if (r < 0)
			return reply_error(out, outlen, err);
		put(out, outlen, &n, "{\"ok\": true, \"size\": %" PRIu64 ", \"notified\": %s}",
		    v, r > 0 ? "true" : "false");
		return outlen ? (int)MIN(n, outlen - 1) : 0;
	}
	return reply_error(out, outlen, "unknown cmd: use stats, set-poll or resize");
}

/* {"cmd": "upgrade", "exec": "PATH"} ("exec" optional; no escapes). */
static int ctl_upgrade(struct ctl_server *s, const char *req, char *out, size_t outlen)
{
	const char *e = json_field(req, "exec");
	char exec[4096], err[600];
	size_t n = 0;
	int pid;

	if (e) {
		const char *q = *e == '"' ? strchr(e + 1, '"') : NULL;

		if (!q || (size_t)(q - e - 1) >= sizeof(exec) || memchr(e + 1, '\\', (size_t)(q - e - 1)))
			return reply_error(out, outlen, "\"exec\" must be a path string");
		memcpy(exec, e + 1, (size_t)(q - e - 1));
		exec[q - e - 1] = '\0';
	}
	pid = s->upgrade(s->upgrade_opaque, e ? exec : NULL, err, sizeof(err));
	if (pid < 0)
		return reply_error(out, outlen, err);
	put(out, outlen, &n, "{\"ok\": true, \"pid\": %d, \"message\": \"%s\"}", pid, err);
	return outlen ? (int)MIN(n, outlen - 1) : 0;
}

static void ctl_accept_cb(void *opaque, uint32_t events)
{
	struct ctl_server *s = opaque;
	char req[CTL_MAX_REQ], *reply;
	size_t got = 0;
	int fd, n;

	fd = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return;
	/* A control client gets one second to send its line: the main
	 * thread must not wait on it for longer. */
	while (got < sizeof(req) - 1 && !memchr(req, '\n', got)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (poll(&p, 1, 1000) <= 0)
			break;
		r = recv(fd, req + got, sizeof(req) - 1 - got, MSG_DONTWAIT);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	req[got] = '\0';
	reply = malloc(CTL_MAX_REPLY);
	if (reply) {
		const char *cmd = json_field(req, "cmd");

		if (s->upgrade && cmd && !strncmp(cmd, "\"upgrade\"", 9))
			n = ctl_upgrade(s, req, reply, CTL_MAX_REPLY - 1);
		else
			n = ctl_handle(s->dev, req, reply, CTL_MAX_REPLY - 1);
		if (n >= 0) {
			reply[n++] = '\n';
			(void)!send(fd, reply, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
		}
		free(reply);
	}
	close(fd);
}

void ctl_server_set_upgrade(struct ctl_server *s, ctl_upgrade_fn fn, void *opaque)
{
	s->upgrade = fn;
	s->upgrade_opaque = opaque;
}

int ctl_server_listen_fd(const struct ctl_server *s)
{
	return s->fd;
}

int ctl_server_new(const char *path, struct loop *l, struct blk_dev *d,
		   struct ctl_server **out, char *err, size_t errlen)
{
	return ctl_server_new_fd(path, -1, l, d, out, err, errlen);
}

int ctl_server_new_fd(const char *path, int listen_fd, struct loop *l, struct blk_dev *d,
		      struct ctl_server **out, char *err, size_t errlen)
{
	struct ctl_server *s = calloc(1, sizeof(*s));
	int r;

	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->path = strdup(path);
	s->loop = l;
	s->dev = d;
	r = listen_fd >= 0 ? listen_fd : sock_listen_unix(path, err, errlen);
	if (r < 0)
		goto err_free;
	s->fd = r;
	r = loop_fd_add(l, s->fd, EPOLLIN, ctl_accept_cb, s, &s->h);
	if (r < 0) {
		snprintf(err, errlen, "cannot watch '%s': %s", path, strerror(-r));
		close(s->fd);
		unlink(path);
		goto err_free;
	}
	*out = s;
	return 0;
err_free:
	free(s->path);
	free(s);
	return r;
}

void ctl_server_free(struct ctl_server *s)
{
	if (!s)
		return;
	loop_fd_del(s->loop, s->h);
	close(s->fd);
	unlink(s->path);
	free(s->path);
	free(s);
}
