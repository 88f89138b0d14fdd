/*
 * One vhost-user message on the socket, written from qemu
 * docs/interop/vhost-user.rst "Message Specification" (a header of
 * request, flags and payload size, then the payload) and "Communication"
 * (fds in the ancillary data).  What a message means is the handlers'
 * business (vu.c and the files beside it); here it is only read whole,
 * within a time limit, or sent without blocking.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/log.h"
#include "util/sock.h"
#include "util/sys.h"
#include "vhost/vu_internal.h"

/* A frontend that starts a message must finish it within this time. */
#define VU_RECV_TIMEOUT_S 5

const char *vu__req_name(uint32_t req)
{
	switch (req) {
	case VHOST_USER_GET_FEATURES: return "GET_FEATURES";
	case VHOST_USER_SET_FEATURES: return "SET_FEATURES";
	case VHOST_USER_SET_OWNER: return "SET_OWNER";
	case VHOST_USER_RESET_OWNER: return "RESET_OWNER";
	case VHOST_USER_SET_MEM_TABLE: return "SET_MEM_TABLE";
	case VHOST_USER_SET_LOG_BASE: return "SET_LOG_BASE";
	case VHOST_USER_SET_LOG_FD: return "SET_LOG_FD";
	case VHOST_USER_SET_VRING_NUM: return "SET_VRING_NUM";
	case VHOST_USER_SET_VRING_ADDR: return "SET_VRING_ADDR";
	case VHOST_USER_SET_VRING_BASE: return "SET_VRING_BASE";
	case VHOST_USER_GET_VRING_BASE: return "GET_VRING_BASE";
	case VHOST_USER_SET_VRING_KICK: return "SET_VRING_KICK";
	case VHOST_USER_SET_VRING_CALL: return "SET_VRING_CALL";
	case VHOST_USER_SET_VRING_ERR: return "SET_VRING_ERR";
	case VHOST_USER_GET_PROTOCOL_FEATURES: return "GET_PROTOCOL_FEATURES";
	case VHOST_USER_SET_PROTOCOL_FEATURES: return "SET_PROTOCOL_FEATURES";
	case VHOST_USER_GET_QUEUE_NUM: return "GET_QUEUE_NUM";
	case VHOST_USER_SET_VRING_ENABLE: return "SET_VRING_ENABLE";
	case VHOST_USER_SET_BACKEND_REQ_FD: return "SET_BACKEND_REQ_FD";
	case VHOST_USER_GET_CONFIG: return "GET_CONFIG";
	case VHOST_USER_SET_CONFIG: return "SET_CONFIG";
	case VHOST_USER_GET_MAX_MEM_SLOTS: return "GET_MAX_MEM_SLOTS";
	case VHOST_USER_GET_INFLIGHT_FD: return "GET_INFLIGHT_FD";
	case VHOST_USER_SET_INFLIGHT_FD: return "SET_INFLIGHT_FD";
	case VHOST_USER_ADD_MEM_REG: return "ADD_MEM_REG";
	case VHOST_USER_REM_MEM_REG: return "REM_MEM_REG";
	case VHOST_USER_RESET_DEVICE: return "RESET_DEVICE";
	case VHOST_USER_SET_STATUS: return "SET_STATUS";
	case VHOST_USER_GET_STATUS: return "GET_STATUS";
	default: return "unknown";
	}
}

int vu__send(int fd, struct vu_msg *m)
{
	/* Header and payload are separate in struct vu_msg (the union is
	 * 8-byte aligned), so send them as two pieces of one message. */
	struct iovec iov[2] = {
		{ &m->hdr, sizeof(m->hdr) },
		{ &m->p, m->hdr.size },
	};
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };
	size_t len = sizeof(m->hdr) + m->hdr.size;
	ssize_t n;

	if (m->reply_fd >= 0)
		(void)sock_msg_set_fds(&mh, cbuf, sizeof(cbuf), &m->reply_fd, 1);
	m->hdr.flags = VHOST_USER_VERSION | VHOST_USER_REPLY_MASK;
	/* Never block the main thread on a frontend that does not read its
	 * replies: a full socket buffer is a protocol failure. */
	do
		n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	sys_close(&m->reply_fd);
	if (n != (ssize_t)len) {
		log_err("sending %s reply failed: %s", vu__req_name(m->hdr.request),
			n < 0 ? strerror(errno) : "short write");
		return -EPIPE;
	}
	return 0;
}

/* Read exactly len bytes before deadline_ns.  Returns 0 or VU_MALFORMED
 * (timeout, close or error mid-message). */
static int recv_rest(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
	size_t got = 0;

	while (got < len) {
		uint64_t now = sys_now_ns();
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (now >= deadline_ns)
			return VU_MALFORMED;
		if (poll(&p, 1, (int)((deadline_ns - now) / 1000000 + 1)) <= 0)
			continue;
		n = recv(fd, (char *)buf + got, len - got, MSG_DONTWAIT);
		if (n == 0)
			return VU_MALFORMED;
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			return VU_MALFORMED;
		}
		got += (size_t)n;
	}
	return 0;
}

/* Within VU_RECV_TIMEOUT_S of its first byte. */
int vu__recv(int fd, struct vu_msg *m)
{
	char cbuf[CMSG_SPACE(VHOST_USER_MAX_FDS * sizeof(int))];
	struct iovec iov = { &m->hdr, sizeof(m->hdr) };
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};
	struct cmsghdr *cm;
	uint64_t deadline;
	ssize_t n;
	size_t got;

	m->nfds = 0;
	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n == 0)
		return -ECONNRESET;
	if (n < 0)
		return errno == EAGAIN ? -EAGAIN : -errno;
	deadline = sys_now_ns() + VU_RECV_TIMEOUT_S * 1000000000ull;
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		size_t nfd;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfd; i++) {
			int f;

			memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (m->nfds < VHOST_USER_MAX_FDS)
				m->fds[m->nfds++] = f;
			else
				close(f);
		}
	}
	if (mh.msg_flags & MSG_CTRUNC) {
		log_err("message carried more than %d fds", VHOST_USER_MAX_FDS);
		return VU_MALFORMED;
	}
	got = (size_t)n;
	if (got < sizeof(m->hdr) &&
	    recv_rest(fd, (char *)&m->hdr + got, sizeof(m->hdr) - got, deadline) < 0) {
		log_err("message header truncated or not finished in %d s",
			VU_RECV_TIMEOUT_S);
		return VU_MALFORMED;
	}
	if ((m->hdr.flags & VHOST_USER_VERSION_MASK) != VHOST_USER_VERSION) {
		log_err("message with protocol version %u (want %u)",
			m->hdr.flags & VHOST_USER_VERSION_MASK, VHOST_USER_VERSION);
		return VU_MALFORMED;
	}
	if (m->hdr.size > sizeof(m->p)) {
		log_err("%s: payload of %u bytes is larger than any message",
			vu__req_name(m->hdr.request), m->hdr.size);
		return VU_MALFORMED;
	}
	if (m->hdr.size && recv_rest(fd, &m->p, m->hdr.size, deadline) < 0) {
		log_err("%s: payload of %u bytes truncated or not finished in %d s",
			vu__req_name(m->hdr.request), m->hdr.size, VU_RECV_TIMEOUT_S);
		return VU_MALFORMED;
	}
	return 0;
}

void vu__close_fds(struct vu_msg *m)
{
	for (unsigned i = 0; i < m->nfds; i++)
		if (m->fds[i] >= 0)
			close(m->fds[i]);
	m->nfds = 0;
}
