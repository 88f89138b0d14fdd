#include "util/sock.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/log.h"

int sock_listen_unix(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path '%s' is longer than %zu bytes: "
			 "choose a shorter path", path, sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot create a unix socket: %s", strerror(-r));
		return r;
	}
	if (lstat(path, &st) == 0) {
		int probe;

		if (!S_ISSOCK(st.st_mode)) {
			snprintf(err, errlen, "'%s' exists and is not a socket: remove "
				 "it or choose another path", path);
			r = -EEXIST;
			goto err_close;
		}
		probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(probe);
			snprintf(err, errlen, "socket '%s' is in use by a running "
				 "process: stop it or choose another path", path);
			r = -EADDRINUSE;
			goto err_close;
		}
		if (probe >= 0)
			close(probe);
		/* Nobody listens: a stale file from a dead daemon. */
		log_info("replacing stale socket %s", path);
		unlink(path);
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot bind socket '%s': %s%s", path,
			 strerror(-r), r == -ENOENT ? " (does its directory exist?)" : "");
		goto err_close;
	}
	if (listen(fd, 4) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot listen on '%s': %s", path, strerror(-r));
		unlink(path);
		goto err_close;
	}
	return fd;

err_close:
	close(fd);
	return r;
}

int sock_msg_set_fds(struct msghdr *mh, void *cbuf, size_t cbuflen,
		     const int *fds, unsigned nfds)
{
	size_t bytes = nfds * sizeof(int);
	struct cmsghdr *cm;

	if (nfds == 0)
		return 0;
	if (cbuflen < CMSG_SPACE(bytes))
		return -EINVAL;
	memset(cbuf, 0, CMSG_SPACE(bytes));
	mh->msg_control = cbuf;
	mh->msg_controllen = CMSG_SPACE(bytes);
	cm = CMSG_FIRSTHDR(mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(bytes);
	memcpy(CMSG_DATA(cm), fds, bytes);
	return 0;
}

/*
 * "HOST:PORT", "[HOST6]:PORT" or ":PORT" into a host (NULL: every
 * address) and a port in 0..65535.  host points into buf.  Returns 0 or
 * -EINVAL with one line in err.
 */
static int parse_addr(const char *addr, char *buf, size_t buflen, const char **host,
		      unsigned *port, char *err, size_t errlen)
{
	const char *colon = strrchr(addr, ':'), *p;
	unsigned long v = 0;
	size_t hl;

	if (!colon)
		goto bad;
	for (p = colon + 1; *p; p++) {
		if (*p < '0' || *p > '9' || v > 65535)
			break;
		v = v * 10 + (unsigned long)(*p - '0');
	}
	if (p == colon + 1 || *p || v > 65535) {
		snprintf(err, errlen, "'%s': the port must be a number from 0 to 65535", addr);
		return -EINVAL;
	}
	*port = (unsigned)v;
	hl = (size_t)(colon - addr);
	if (addr[0] == '[') {
		if (hl < 3 || addr[hl - 1] != ']')
			goto bad;
		addr++;
		hl -= 2;
	} else if (memchr(addr, ':', hl)) {
		snprintf(err, errlen, "'%s': put an IPv6 address in brackets, e.g. [::1]:9720",
			 addr);
		return -EINVAL;
	}
	if (hl >= buflen)
		goto bad;
	memcpy(buf, addr, hl);
	buf[hl] = '\0';
	*host = hl ? buf : NULL;
	return 0;
bad:
	snprintf(err, errlen, "'%s' is not ADDRESS:PORT (e.g. 127.0.0.1:9720, [::1]:9720, "
		 "or :9720 for every address)", addr);
	return -EINVAL;
}

/* A listening TCP socket on ai, or -errno. */
static int listen_on(const struct addrinfo *ai)
{
	int fd, one = 1, zero = 0, r;

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    ai->ai_protocol);
	if (fd < 0)
		return -errno;
	/* A restart must not wait for TIME_WAIT; a live listener still
	 * makes bind fail (Linux). */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* Every address means IPv4 too. */
	if (ai->ai_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

int sock_listen_tcp(const char *addr, char *err, size_t errlen)
{
	static const char *const any[] = { "::", "0.0.0.0" };
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE };
	char host[128], service[8];
	const char *h;
	unsigned port;
	int r;

	r = parse_addr(addr, host, sizeof(host), &h, &port, err, errlen);
	if (r < 0)
		return r;
	snprintf(service, sizeof(service), "%u", port);
	/* Every address: IPv6's, which takes IPv4 too, or IPv4's alone on a
	 * machine without IPv6. */
	for (unsigned i = 0; i < (h ? 1u : 2u); i++) {
		struct addrinfo *ai;

		r = getaddrinfo(h ? h : any[i], service, &hints, &ai);
		if (r) {
			snprintf(err, errlen, "'%s': '%s' is not a numeric IPv4 or IPv6 address",
				 addr, h);
			return -EINVAL;
		}
		r = listen_on(ai);
		freeaddrinfo(ai);
		if (r >= 0 || (r != -EAFNOSUPPORT && r != -EADDRNOTAVAIL))
			break;
	}
	if (r == -EADDRINUSE)
		snprintf(err, errlen, "%s: the port is in use by another process: stop it or "
			 "choose another port", addr);
	else if (r == -EADDRNOTAVAIL)
		snprintf(err, errlen, "%s: no network interface of this machine has that "
			 "address", addr);
	else if (r < 0)
		snprintf(err, errlen, "cannot listen on %s: %s", addr, strerror(-r));
	return r;
}

