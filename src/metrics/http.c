/*
 * vblkd --metrics: GET /metrics over HTTP (libmicrohttpd), on the main
 * loop.  MHD runs in its epoll mode without a thread: the main loop
 * watches MHD's epoll fd and calls MHD_run when it is readable, and a
 * main-loop timer calls it when MHD_get_timeout asks (connection
 * timeouts, and data MHD read but has not processed yet: timeout 0).  So
 * every request, and every read of the counters, happens on the main
 * thread, as the control socket's do.
 *
 * libmicrohttpd is loaded by the first metrics_http_new (dlopen), not
 * linked: it brings GnuTLS and eight more libraries, about 300 kB of
 * private memory and 1.3 MB of PSS in every vblkd (bench/memory
 * --detail), which a vblkd without --metrics has no use for.
 */
#include "metrics/metrics.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loop/loop.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/sys.h"

#ifdef HAVE_MICROHTTPD
#include <microhttpd.h>

/* Scrapers are few; a slow or idle client is dropped after this.  One
 * address holds a few connections at most, so that one client sending
 * headers slowly on all of them (slowloris) cannot lock Prometheus out. */
#define METRICS_HTTP_MAX_CONNECTIONS 64
#define METRICS_HTTP_MAX_PER_IP 4
#define METRICS_HTTP_TIMEOUT_S 10
/* A scrape reads every iothread's counters (a loop_call_sync into each):
 * scrapes closer together than this get the same rendering, so that no
 * client, however fast it asks, wakes the iothreads more than 10 times a
 * second.  Prometheus scrapes every few seconds and never sees it. */
#define METRICS_HTTP_CACHE_NS 100000000ull

/* The library, by the name its package installs it under (Debian's
 * libmicrohttpd12; the soname has been 12 since 0.9.x), and what we call
 * in it: the names of microhttpd.h, their types from there too. */
#define MHD_LIB "libmicrohttpd.so.12"
#define MHD_FUNCTIONS(X)		\
	X(start_daemon)			\
	X(stop_daemon)			\
	X(run)				\
	X(get_timeout)			\
	X(get_daemon_info)		\
	X(create_response_from_buffer)	\
	X(add_response_header)		\
	X(queue_response)		\
	X(destroy_response)
static struct {
#define MHD_FIELD(f) __typeof__(MHD_##f) *f;
	MHD_FUNCTIONS(MHD_FIELD)
#undef MHD_FIELD
} mhd;

/* Load the library once.  0, or -ENOTSUP with one line in err. */
static int mhd_load(char *err, size_t errlen)
{
	static void *lib;
	const char *missing = NULL;
	void *l;

	if (lib)
		return 0;
	l = dlopen(MHD_LIB, RTLD_NOW | RTLD_LOCAL);
	if (!l) {
		snprintf(err, errlen, "needs libmicrohttpd (%s): install the Debian package "
			 "libmicrohttpd12, or use vblkctl metrics", dlerror());
		return -ENOTSUP;
	}
#define MHD_SYM(f)							\
	if (!missing && !(*(void **)&mhd.f = dlsym(l, "MHD_" #f)))	\
		missing = "MHD_" #f;
	MHD_FUNCTIONS(MHD_SYM)
#undef MHD_SYM
	if (missing) {
		snprintf(err, errlen, "needs libmicrohttpd, and %s has no %s: install the "
			 "Debian package libmicrohttpd12, or use vblkctl metrics", MHD_LIB,
			 missing);
		dlclose(l);
		return -ENOTSUP;
	}
	lib = l;	/* never closed: MHD's code runs until we exit */
	return 0;
}

struct metrics_http {
	const struct metrics_source *src;
	struct loop *loop;
	int fd;			/* our listening socket (MHD works on a dup) */
	unsigned port;
	struct MHD_Daemon *mhd;
	struct loop_fd *epoll_h;	/* MHD's epoll fd in the main loop */
	struct loop_timer *timer;	/* MHD_get_timeout's deadline */
	struct MHD_Response *last;	/* the latest rendering (MHD counts its users) */
	uint64_t last_ns;		/* when it was rendered */
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text,
			     const char *allow)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = mhd.create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	mhd.add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	if (allow)
		mhd.add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	ret = mhd.queue_response(c, status, r);
	mhd.destroy_response(r);
	return ret;
}

/* MHD's access handler: the first call for each request answers it (any
 * body a client sends is not needed). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version,
				  const char *upload_data, size_t *upload_data_size,
				  void **req_cls)
{
	struct metrics_http *h = cls;
	uint64_t now = sys_now_ns();
	struct MHD_Response *r;
	char *text;
	int n;

	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: use GET\n",
			     "GET, HEAD");
	if (strcmp(url, "/metrics"))
		return reply(c, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n",
			     NULL);
	if (h->last && now - h->last_ns < METRICS_HTTP_CACHE_NS)
		return mhd.queue_response(c, MHD_HTTP_OK, h->last);
	n = metrics_render(h->src, &text);
	if (n < 0)
		return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot render the metrics\n",
			     NULL);
	r = mhd.create_response_from_buffer((size_t)n, text, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(text);
		return MHD_NO;
	}
	/* The exposition format's own content type (text format 0.0.4). */
	mhd.add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
				"text/plain; version=0.0.4; charset=utf-8");
	/* Connections still sending the previous one hold their own
	 * reference: it is freed after the last of them. */
	if (h->last)
		mhd.destroy_response(h->last);
	h->last = r;
	h->last_ns = now;
	return mhd.queue_response(c, MHD_HTTP_OK, r);
}

/* MHD_run as often as MHD wants it: at its next timeout, or never (no
 * timer) if it has none. */
static void run(struct metrics_http *h)
{
	MHD_UNSIGNED_LONG_LONG ms;

	mhd.run(h->mhd);
	if (mhd.get_timeout(h->mhd, &ms) == MHD_YES)
		loop_timer_mod(h->timer, sys_now_ns() + (uint64_t)ms * 1000000u);
	else
		loop_timer_del(h->timer);
}

static void on_epoll(void *opaque, uint32_t events)
{
	run(opaque);
}

static void on_timer(void *opaque)
{
	run(opaque);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	char buf[256];
	size_t n;

	vsnprintf(buf, sizeof(buf), fmt, ap);
	n = strlen(buf);
	while (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	/* Mostly what clients got wrong: not worth more than debug. */
	log_debug("metrics http: %s", buf);
}

static unsigned sock_port(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
		return 0;
	if (ss.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&ss)->sin_port);
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return 0;
}

/* Serve on fd, a listening TCP socket (ours on success only). */
static int start(int fd, struct loop *l, const struct metrics_source *src,
		 struct metrics_http **out, char *err, size_t errlen)
{
	struct metrics_http *h = calloc(1, sizeof(*h));
	const union MHD_DaemonInfo *info;
	int mhd_fd, r;

	if (!h) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	h->src = src;
	h->loop = l;
	h->fd = fd;
	h->port = sock_port(fd);
	r = loop_timer_new(l, on_timer, h, &h->timer);
	if (r < 0) {
		snprintf(err, errlen, "cannot make a timer: %s", strerror(-r));
		goto err_free;
	}
	/* MHD closes the socket it is given when it stops; ours stays ours
	 * (the getter's, and open if MHD fails to start). */
	mhd_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (mhd_fd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot duplicate the listening socket: %s", strerror(-r));
		goto err_timer;
	}
	h->mhd = mhd.start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL,
				  on_request, h,
				  MHD_OPTION_LISTEN_SOCKET, mhd_fd,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_HTTP_MAX_CONNECTIONS,
				  MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)METRICS_HTTP_MAX_PER_IP,
				  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_HTTP_TIMEOUT_S,
				  MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h,
				  MHD_OPTION_END);
	if (!h->mhd) {
		/* Whether MHD closed mhd_fd on failure is not documented: it
		 * is left alone rather than risk closing an fd reused since. */
		r = -ENOMEM;
		snprintf(err, errlen, "libmicrohttpd could not start");
		goto err_timer;
	}
	info = mhd.get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
	r = info ? loop_fd_add(l, info->epoll_fd, EPOLLIN, on_epoll, h, &h->epoll_h) : -EINVAL;
	if (r < 0) {
		snprintf(err, errlen, "cannot watch libmicrohttpd's epoll fd: %s", strerror(-r));
		goto err_mhd;
	}
	run(h);
	*out = h;
	return 0;

err_mhd:
	mhd.stop_daemon(h->mhd);
err_timer:
	loop_timer_free(h->timer);
err_free:
	free(h);
	return r;
}

int metrics_http_listen_fd(const struct metrics_http *h)
{
	return h->fd;
}

unsigned metrics_http_port(const struct metrics_http *h)
{
	return h->port;
}

void metrics_http_free(struct metrics_http *h)
{
	if (!h)
		return;
	loop_fd_del(h->loop, h->epoll_h);
	loop_timer_free(h->timer);
	/* External polling: MHD closes its dup of the listening socket and
	 * never shuts it down (shutdown would stop a copy handed to another
	 * process from listening too). */
	mhd.stop_daemon(h->mhd);
	if (h->last)
		mhd.destroy_response(h->last);
	close(h->fd);
	free(h);
}

#else /* !HAVE_MICROHTTPD */

struct metrics_http {
	int fd;
};

static int start(int fd, struct loop *l, const struct metrics_source *src,
		 struct metrics_http **out, char *err, size_t errlen)
{
	snprintf(err, errlen, "needs libmicrohttpd: this vblkd was built without it (rebuild "
		 "with libmicrohttpd-dev installed, or use vblkctl metrics)");
	return -ENOTSUP;
}

int metrics_http_listen_fd(const struct metrics_http *h)
{
	return h->fd;
}

unsigned metrics_http_port(const struct metrics_http *h)
{
	return 0;
}

void metrics_http_free(struct metrics_http *h)
{
}

#endif /* HAVE_MICROHTTPD */

/* listen_fd must be a listening TCP socket (IPv4 or IPv6). */
static int check_listen_fd(int fd, char *err, size_t errlen)
{
	int type = 0, domain = 0, listening = 0, fl;
	socklen_t len = sizeof(int);

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0) {
		int r = -errno;

		snprintf(err, errlen, "metrics socket fd %d: %s", fd, strerror(-r));
		return r == -ENOTSOCK ? -EINVAL : r;
	}
	len = sizeof(int);
	getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len);
	len = sizeof(int);
	getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len);
	if (type != SOCK_STREAM || (domain != AF_INET && domain != AF_INET6) || !listening) {
		snprintf(err, errlen, "metrics socket fd %d is not a listening TCP socket", fd);
		return -EINVAL;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		int r = -errno;

		snprintf(err, errlen, "metrics socket fd %d: %s", fd, strerror(-r));
		return r;
	}
	return 0;
}

int metrics_http_new(const char *addr, int listen_fd, struct loop *l,
		     const struct metrics_source *src, struct metrics_http **out,
		     char *err, size_t errlen)
{
	int fd, r;

#ifndef HAVE_MICROHTTPD
	/* Before looking at addr: nothing else would help. */
	return start(-1, l, src, out, err, errlen);
#else
	r = mhd_load(err, errlen);
	if (r < 0)
		return r;
#endif
	if (listen_fd >= 0) {
		r = check_listen_fd(listen_fd, err, errlen);
		return r < 0 ? r : start(listen_fd, l, src, out, err, errlen);
	}
	fd = sock_listen_tcp(addr, err, errlen);
	if (fd < 0)
		return fd;
	r = start(fd, l, src, out, err, errlen);
	if (r < 0)
		close(fd);
	return r;
}
