/*
 * Upgrade in place (docs/architecture.md "Upgrade in place"): the
 * frontend, with everything it set, handed from this process to a new
 * one over a unix socket, as the vhost-user messages that would set it
 * again (qemu docs/interop/vhost-user.rst "Front-end message types") and
 * their fds, framed as in "Message Specification" between VU_HO_BEGIN and
 * VU_HO_END (vu.h).  The sequencing of the two processes is
 * src/upgrade/up.c's; here is the vhost-user state.
 *
 * The old process stops its rings (draining them, as for GET_VRING_BASE)
 * and sends the state; the new process replays it through the same
 * handlers and checks (vu__dispatch), so a state it would not have
 * accepted from a frontend it does not accept from a predecessor either.
 * Replies go nowhere and rings do not start until
 * vu_server_handover_commit: until then the old process may still take
 * everything back (vu_server_handover_resume).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "loop/loop.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/sys.h"
#include "vhost/vu_internal.h"

int vu_handover_send(int sock, uint32_t req, const void *p, uint32_t size, const int *fds,
		     unsigned nfds)
{
	struct vhost_user_hdr h = { .request = req, .flags = VHOST_USER_VERSION, .size = size };
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)p, size } };
	char cbuf[CMSG_SPACE(VHOST_USER_MAX_FDS * sizeof(int))];
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = size ? 2 : 1 };
	ssize_t n;

	if (nfds > VHOST_USER_MAX_FDS || size > sizeof(union vhost_user_payload) ||
	    sock_msg_set_fds(&mh, cbuf, sizeof(cbuf), fds, nfds) < 0)
		return -EINVAL;
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n == (ssize_t)(sizeof(h) + size) ? 0 : -EIO;
}

/* One message within timeout_ms: 0, -ETIMEDOUT, -ECONNRESET (the peer
 * went away), VU_MALFORMED. */
static int recv_msg(int sock, struct vu_msg *m, int timeout_ms)
{
	uint64_t deadline = sys_now_ns() + (uint64_t)timeout_ms * 1000000ull;

	m->reply_fd = -1;
	m->nfds = 0;
	for (;;) {
		struct pollfd pf = { .fd = sock, .events = POLLIN };
		uint64_t now = sys_now_ns();
		int r;

		if (now >= deadline)
			return -ETIMEDOUT;
		r = poll(&pf, 1, (int)((deadline - now) / 1000000 + 1));
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r <= 0)
			continue;
		r = vu__recv(sock, m);
		if (r != -EAGAIN)
			return r;
	}
}

int vu_handover_recv(int sock, int timeout_ms, uint32_t *req, void *p, uint32_t *size,
		     int *fds, unsigned *nfds)
{
	struct vu_msg m;
	int r = recv_msg(sock, &m, timeout_ms);

	if (r < 0) {
		vu__close_fds(&m);
		return r == VU_MALFORMED ? -EPROTO : r;
	}
	if (m.hdr.size > *size || m.nfds > *nfds) {
		vu__close_fds(&m);
		return -EPROTO;
	}
	*req = m.hdr.request;
	memcpy(p, &m.p, m.hdr.size);
	*size = m.hdr.size;
	memcpy(fds, m.fds, m.nfds * sizeof(int));
	*nfds = m.nfds;
	return 0;
}

/* The messages put_state sends: all that a replay may contain. */
static bool replayable(uint32_t req)
{
	switch (req) {
	case VHOST_USER_SET_OWNER:
	case VHOST_USER_SET_FEATURES:
	case VHOST_USER_SET_PROTOCOL_FEATURES:
	case VHOST_USER_ADD_MEM_REG:
	case VHOST_USER_SET_INFLIGHT_FD:
	case VHOST_USER_SET_BACKEND_REQ_FD:
	case VHOST_USER_SET_VRING_NUM:
	case VHOST_USER_SET_VRING_ADDR:
	case VHOST_USER_SET_VRING_BASE:
	case VHOST_USER_SET_VRING_CALL:
	case VHOST_USER_SET_VRING_ERR:
	case VHOST_USER_SET_VRING_ENABLE:
	case VHOST_USER_SET_VRING_KICK:
	case VHOST_USER_SET_STATUS:
		return true;
	default:
		return false;
	}
}

static int send_u64(int sock, uint32_t req, uint64_t v, int fd)
{
	return vu_handover_send(sock, req, &v, sizeof(v), &fd, fd >= 0);
}

static int send_vring_state(int sock, uint32_t req, uint32_t index, uint32_t num)
{
	struct vhost_vring_state st = { index, num };

	return vu_handover_send(sock, req, &st, sizeof(st), NULL, 0);
}

/* What the frontend set on ring i, as it would set it. */
static int put_ring(struct vu_server *s, int sock, unsigned i)
{
	const struct vu_vring *vr = &s->vr[i];
	int r = 0;

	if (vr->num)
		r = send_vring_state(sock, VHOST_USER_SET_VRING_NUM, i, vr->num);
	if (!r && vr->addr_set) {
		struct vhost_vring_addr a = {
			.index = i,
			.flags = vr->log_used ? 1u << VHOST_VRING_F_LOG : 0,
			.desc_user_addr = vr->desc,
			.used_user_addr = vr->used,
			.avail_user_addr = vr->avail,
			.log_guest_addr = vr->log_addr,
		};

		r = vu_handover_send(sock, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
	}
	if (!r)
		r = send_vring_state(sock, VHOST_USER_SET_VRING_BASE, i, vr->base);
	if (!r)
		r = send_u64(sock, VHOST_USER_SET_VRING_CALL, i |
			     (vr->call_fd < 0 ? VHOST_USER_VRING_NOFD_MASK : 0), vr->call_fd);
	if (!r)
		r = send_u64(sock, VHOST_USER_SET_VRING_ERR, i |
			     (vr->err_fd < 0 ? VHOST_USER_VRING_NOFD_MASK : 0), vr->err_fd);
	if (!r)
		r = send_vring_state(sock, VHOST_USER_SET_VRING_ENABLE, i, vr->enabled);
	if (!r && vr->kick_fd >= 0)
		r = send_u64(sock, VHOST_USER_SET_VRING_KICK, i, vr->kick_fd);
	return r;
}

static int put_state(struct vu_server *s, int sock)
{
	struct vu_ho_begin b = { .version = VU_HO_VERSION, .nqueues = s->nqueues,
				 .nconn = s->nconn };
	uint8_t dev[VU_HO_DEVICE_MAX];
	int r;

	r = vu_handover_send(sock, VU_HO_BEGIN, &b, sizeof(b), &s->conn_fd, s->conn_fd >= 0);
	if (r < 0 || s->conn_fd < 0)
		goto end;
	r = vu_handover_send(sock, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0);
	if (!r)
		r = send_u64(sock, VHOST_USER_SET_FEATURES, s->acked, -1);
	if (!r && (s->acked & (1ull << VHOST_USER_F_PROTOCOL_FEATURES)))
		r = send_u64(sock, VHOST_USER_SET_PROTOCOL_FEATURES, s->proto_acked, -1);
	for (unsigned i = 0; !r && s->mem && i < s->mem->nregions; i++) {
		const struct gm_region *g = &s->mem->r[i];
		struct vhost_user_mem_reg mr = {
			.region = { g->gpa, g->size, g->qva, g->mmap_offset },
		};

		r = vu_handover_send(sock, VHOST_USER_ADD_MEM_REG, &mr, sizeof(mr), &g->fd, 1);
	}
	if (!r && s->inflight) {
		struct vhost_user_inflight in = {
			.mmap_size = s->inflight_size,
			.mmap_offset = s->inflight_offset,
			.num_queues = (uint16_t)s->inflight_queues,
			.queue_size = (uint16_t)s->inflight_qsize,
		};

		r = vu_handover_send(sock, VHOST_USER_SET_INFLIGHT_FD, &in, sizeof(in),
				     &s->inflight_fd, 1);
	}
	if (!r && s->backend_fd >= 0)
		r = vu_handover_send(sock, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0,
				     &s->backend_fd, 1);
	for (unsigned i = 0; !r && i < s->nqueues; i++)
		r = put_ring(s, sock, i);
	if (!r && s->status)
		r = send_u64(sock, VHOST_USER_SET_STATUS, s->status, -1);
end:
	/* The device's state goes with or without a frontend connected: a
	 * disk paused, a failed page-cache flush, QoS limits set at runtime
	 * are the disk's, not the connection's. */
	if (!r && s->ops->save_state) {
		size_t n = s->ops->save_state(s->dev, dev, sizeof(dev));

		r = vu_handover_send(sock, VU_HO_DEVICE, dev, (uint32_t)n, NULL, 0);
	}
	if (!r)
		r = vu_handover_send(sock, VU_HO_END, NULL, 0, NULL, 0);
	return r;
}

/* A hand-over's stop taking this long is logged, stage by stage. */
#define VU_HO_SLOW_NS 1000000000ull

int vu_server_handover_save(struct vu_server *s, int sock, bool release, char *err,
			    size_t errlen)
{
	uint64_t t0, t1;
	int r;

	if (vu__logging(s)) {
		snprintf(err, errlen, "a migration is in progress (dirty logging is on): "
			 "upgrade once it has ended");
		return -EBUSY;
	}
	if (s->inflight_fd < 0 && s->inflight) {
		snprintf(err, errlen, "the in-flight region cannot be handed on");
		return -EIO;
	}
	/* From here on the frontend's messages wait in the socket for
	 * whoever serves it next. */
	loop_fd_del(s->loop, s->listen_h);
	s->listen_h = NULL;
	loop_fd_del(s->loop, s->conn_h);
	s->conn_h = NULL;
	t0 = sys_now_ns();
	for (unsigned i = 0; i < s->nqueues; i++) {
		s->ho_restart[i] = s->vr[i].started;
		vu__vring_stop(s, i);
	}
	t1 = sys_now_ns();
	if (s->ops->handover_quiesce && (r = s->ops->handover_quiesce(s->dev, err, errlen)) < 0) {
		vu_server_handover_resume(s);
		return r;
	}
	/* The guest waits through all of it, and the new process gives up
	 * after its own timeout: say where a long pause went. */
	if (sys_now_ns() - t0 >= VU_HO_SLOW_NS)
		log_warn("upgrade: the rings took %" PRIu64 " ms to stop (requests in flight "
			 "completed, the disk flushed), the image %" PRIu64 " ms to hand over",
			 (t1 - t0) / 1000000, (sys_now_ns() - t1) / 1000000);
	/* The next claim is the new process's (a resume claims again). */
	if (release)
		vu__release_if_idle(s);
	r = put_state(s, sock);
	if (r < 0) {
		snprintf(err, errlen, "cannot send the state to the new process: %s",
			 strerror(-r));
		vu_server_handover_resume(s);
	}
	return r;
}

void vu_server_handover_resume(struct vu_server *s)
{
	int r = 0;

	for (unsigned i = 0; i < s->nqueues; i++) {
		if (s->ho_restart[i] && r == 0)
			r = vu__vring_start(s, i);
		s->ho_restart[i] = false;
	}
	if (s->conn_fd >= 0) {
		if (r == 0)
			r = vu__watch_conn(s, s->conn_fd);
		if (r < 0) {
			log_err("cannot resume serving the frontend after the upgrade "
				"failed: dropping it (it may reconnect)");
			vu__disconnect(s);
		}
	} else if (vu__watch_listener(s) < 0) {
		log_err("cannot watch the listening socket again");
	}
}

int vu_server_handover_load(struct vu_server *s, int sock, int timeout_ms, char *err,
			    size_t errlen)
{
	struct vu_ho_begin b;
	struct vu_msg m;
	int r;

	r = recv_msg(sock, &m, timeout_ms);
	if (r == 0 && (m.hdr.request != VU_HO_BEGIN || m.hdr.size != sizeof(b) ||
		       m.nfds > 1))
		r = VU_MALFORMED;
	if (r < 0) {
		vu__close_fds(&m);
		snprintf(err, errlen, "no state from the old process: %s",
			 r == VU_MALFORMED ? "malformed" : strerror(-r));
		return r == VU_MALFORMED ? -EPROTO : r;
	}
	memcpy(&b, &m.p, sizeof(b));
	if (b.version != VU_HO_VERSION || b.nqueues != s->nqueues) {
		vu__close_fds(&m);
		snprintf(err, errlen, b.version != VU_HO_VERSION ?
			 "state format %u, this vblkd reads %u" :
			 "the old process has %u queues, this one %u: give it the same --queues",
			 b.version != VU_HO_VERSION ? b.version : b.nqueues,
			 b.version != VU_HO_VERSION ? VU_HO_VERSION : s->nqueues);
		return -EPROTO;
	}
	s->ho_conn_fd = m.nfds ? vu__take_fd(&m, 0) : -1;
	s->nconn = b.nconn;
	s->held = true;
	s->ho_nack = false;
	for (;;) {
		uint32_t req;

		r = recv_msg(sock, &m, timeout_ms);
		if (r < 0) {
			vu__close_fds(&m);
			snprintf(err, errlen, "the state stopped short: %s",
				 r == VU_MALFORMED ? "malformed" : strerror(-r));
			break;
		}
		req = m.hdr.request;
		if (req == VU_HO_END) {
			vu__close_fds(&m);
			break;
		}
		if (req == VU_HO_DEVICE) {
			vu__close_fds(&m);
			r = s->ops->load_state ? s->ops->load_state(s->dev, (uint8_t *)&m.p,
								    m.hdr.size) : -ENOTSUP;
			if (r < 0) {
				snprintf(err, errlen, "the device state was refused: %s",
					 strerror(-r));
				break;
			}
			continue;
		}
		if (!replayable(req)) {
			vu__close_fds(&m);
			snprintf(err, errlen, "%s (%u) has no place in a handover",
				 vu__req_name(req), req);
			r = -EPROTO;
			break;
		}
		/* Acked, so a refusal shows (the reply records it in ho_nack). */
		m.hdr.flags |= VHOST_USER_NEED_REPLY_MASK;
		r = vu__dispatch(s, &m);
		if (r == 0 && s->ho_nack)
			r = -EINVAL;
		if (r < 0) {
			snprintf(err, errlen, "%s from the old process was refused",
				 vu__req_name(req));
			break;
		}
	}
	/* The old process stopped writing the disk before it sent this. */
	if (r == 0 && s->ops->handover_reload)
		r = s->ops->handover_reload(s->dev, err, errlen);
	if (r < 0) {
		vu__state_clear(s);
		sys_close(&s->ho_conn_fd);
		s->held = false;
		return r == VU_MALFORMED ? -EPROTO : r;
	}
	return 0;
}

int vu_server_handover_commit(struct vu_server *s)
{
	int r = 0;

	s->held = false;
	s->keep_path = false;
	if (s->ho_conn_fd >= 0) {
		r = vu__watch_conn(s, s->ho_conn_fd);
		if (r < 0) {
			log_err("cannot watch the frontend's connection: %s", strerror(-r));
			vu__state_clear(s);
			sys_close(&s->ho_conn_fd);
			return r;
		}
		s->conn_fd = s->ho_conn_fd;
		s->ho_conn_fd = -1;
		loop_fd_del(s->loop, s->listen_h);
		s->listen_h = NULL;
	}
	for (unsigned i = 0; i < s->nqueues && r == 0; i++)
		r = vu__vring_start(s, i);
	if (r < 0) {
		vu_server_drop(s, "a ring it had running cannot start here");
		return -EIO;
	}
	return 0;
}

int vu_server_listen_fd(const struct vu_server *s)
{
	return s->listen_fd;
}
