#include <errno.h>
#include <json-c/json.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "vblkctl/vctl.h"

/* Replies larger than this are refused (64 queues' counters are ~100 KiB). */
#define VCTL_MAX_REPLY (64u << 20)

/* The whole reply (up to EOF, each read within wait_ms) into *out,
 * NUL-terminated, malloc'd.  Returns 0 or -errno with one line in err. */
static int read_reply(int fd, const char *path, int wait_ms, char **out, char *err,
		      size_t errlen)
{
	size_t got = 0, cap = 65536;
	char *buf = malloc(cap);
	int r = 0;

	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (got + 1 == cap) {
			char *nb = cap < VCTL_MAX_REPLY ? realloc(buf, cap * 2) : NULL;

			if (!nb) {
				snprintf(err, errlen, "reply from '%s' is too large", path);
				r = -EFBIG;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		n = poll(&p, 1, wait_ms);
		if (n < 0 && errno == EINTR) {
			snprintf(err, errlen, "interrupted");
			r = -EINTR;
			break;
		}
		if (n <= 0) {
			snprintf(err, errlen, "no reply from '%s' within %d s", path,
				 wait_ms / 1000);
			r = -ETIMEDOUT;
			break;
		}
		n = recv(fd, buf + got, cap - 1 - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (!r && !got) {
		snprintf(err, errlen, "empty reply from '%s'", path);
		r = -ECONNRESET;
	}
	if (r) {
		free(buf);
		return r;
	}
	buf[got] = '\0';
	*out = buf;
	return 0;
}

int vctl_call(const char *path, struct json_object *req, int wait_ms,
	      struct json_object **reply, char **text, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *line = json_object_to_json_string_ext(req, JSON_C_TO_STRING_SPACED |
							  JSON_C_TO_STRING_NOSLASHESCAPE);
	char *buf = NULL;
	int fd, r, sr = 0;

	if (!line) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "control path '%s' is too long", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot connect to '%s': %s: is vblkd running with "
			 "--control %s?", path, strerror(-r), path);
		if (fd >= 0)
			close(fd);
		return r;
	}
	if (send(fd, line, strlen(line), MSG_NOSIGNAL) < 0 ||
	    send(fd, "\n", 1, MSG_NOSIGNAL) < 0)
		sr = -errno;
	/* A daemon that refuses us answers and closes without reading
	 * (ctl.c, ctl_accept_cb): if it was quicker than our send, the send
	 * fails but its answer is there to read, and says more. */
	r = sr == 0 || sr == -EPIPE || sr == -ECONNRESET ?
		read_reply(fd, path, wait_ms, &buf, err, errlen) : sr;
	close(fd);
	if (r < 0 && sr < 0) {
		snprintf(err, errlen, "cannot send to '%s': %s", path, strerror(-sr));
		return sr;
	}
	if (r < 0)
		return r;
	*reply = json_tokener_parse(buf);
	if (!json_object_is_type(*reply, json_type_object)) {
		snprintf(err, errlen, "reply from '%s' is not a JSON object: %.200s", path, buf);
		json_object_put(*reply);
		free(buf);
		return -EPROTO;
	}
	if (text)
		*text = buf;
	else
		free(buf);
	return 0;
}
