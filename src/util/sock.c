#include "util/sock.h"

#include <errno.h>
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
