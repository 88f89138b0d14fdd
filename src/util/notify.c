/*
 * Readiness and status for the service manager: see notify.h.
 *
 * The sd_notify(3) protocol, spoken here rather than through libsystemd:
 * one datagram of newline-separated assignments to the AF_UNIX socket
 * $NOTIFY_SOCKET names (a path, or "@name" in the abstract namespace); for
 * a barrier, BARRIER=1 with the write end of a pipe, which the service
 * manager closes once it has read everything sent before.  systemd keeps
 * the protocol stable for programs that speak it without its library
 * (sd_notify(3); systemd 255's man page shows a standalone version).
 * libsystemd brought seven libraries (libgcrypt, liblzma, libzstd, ...)
 * into every vblkd for these few lines: about 230 kB of private memory and
 * 600 kB of PSS per process (bench/memory --detail).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/log.h"
#include "util/notify.h"

/* Send msg (and fd, if >= 0) to $NOTIFY_SOCKET.  > 0 sent, 0 nobody to
 * tell (no NOTIFY_SOCKET), or -errno. */
static int notify_send(const char *msg, int fd)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = strlen(msg) };
	struct msghdr mh = { .msg_name = &sa, .msg_iov = &iov, .msg_iovlen = 1 };
	size_t n;
	int s, r;

	if (!path || !*path)
		return 0;
	n = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || n >= sizeof(sa.sun_path))
		return -EAFNOSUPPORT;
	memcpy(sa.sun_path, path, n);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = '\0';	/* abstract: the name's bytes, no NUL after */
	mh.msg_namelen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	/* The kernel attaches our credentials: the manager reads our pid
	 * (SO_PASSCRED on its side). */
	r = sendmsg(s, &mh, MSG_NOSIGNAL) < 0 ? -errno : 1;
	close(s);
	return r;
}

/* > 0 sent, 0 nobody to tell (no NOTIFY_SOCKET), or -errno (logged). */
static int tell(const char *msg)
{
	int r = notify_send(msg, -1);

	if (r < 0)
		log_warn("cannot notify the service manager (%.*s): %s",
			 (int)strcspn(msg, "\n"), msg, strerror(-r));
	return r;
}

/* Wait until the service manager has read what we sent before, at most
 * timeout_ms.  0, or -errno (-ETIMEDOUT). */
static int barrier(int timeout_ms)
{
	int p[2], r;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	r = notify_send("BARRIER=1", p[1]);
	/* Ours closed, the manager's copy is the last: its close is the
	 * answer (POLLHUP). */
	close(p[1]);
	if (r > 0) {
		struct pollfd pf = { .fd = p[0] };

		do
			r = poll(&pf, 1, timeout_ms);
		while (r < 0 && errno == EINTR);
		r = r < 0 ? -errno : r == 0 ? -ETIMEDOUT : 0;
	}
	close(p[0]);
	return r < 0 ? r : 0;
}

int notify_ready(void)
{
	int r = tell("READY=1\nSTATUS=Serving");

	return r < 0 ? r : 0;
}

int notify_stopping(void)
{
	int r = tell("STOPPING=1\nSTATUS=Finishing in-flight I/O");

	return r < 0 ? r : 0;
}

int notify_mainpid(pid_t pid)
{
	char msg[32];
	int r;

	snprintf(msg, sizeof(msg), "MAINPID=%ld", (long)pid);
	r = tell(msg);
	if (r <= 0)
		return r;
	/* The caller exits next: wait until systemd has read the new pid, or
	 * the exit of its main process could reach it first and stop the
	 * service, the new process with it. */
	r = barrier(5000);
	if (r < 0)
		log_warn("the service manager did not confirm MAINPID=%ld: %s",
			 (long)pid, strerror(-r));
	return r;
}

int notify_status(const char *fmt, ...)
{
	char msg[512] = "STATUS=";
	va_list ap;
	int r;

	va_start(ap, fmt);
	vsnprintf(msg + 7, sizeof(msg) - 7, fmt, ap);
	va_end(ap);
	/* One line: the protocol is newline-separated assignments. */
	msg[strcspn(msg, "\n")] = '\0';
	r = tell(msg);
	return r < 0 ? r : 0;
}
