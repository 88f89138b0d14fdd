/*
 * vhost-user backend, written from qemu docs/interop/vhost-user.rst: the
 * server (listener, one frontend's connection, "Communication"), the
 * dispatch table every message goes through, and the messages of
 * "Front-end message types" that set features, status and rings ("Ring
 * states"), the config space and the backend channel ("Back-end
 * communication").  Guest memory, dirty logging, the in-flight region,
 * the wire and the upgrade handover are in the files beside this one
 * (vu_internal.h).  Every message is checked for size, fd count and field
 * ranges before it changes anything; a malformed one disconnects the
 * frontend (logged) and we go back to accepting the next one.
 */
#include "vhost/vu.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loop/loop.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/sys.h"
#include "vhost/vhost_user.h"
#include "vhost/vu_internal.h"

static const uint64_t vu_proto_features =
	1ull << VHOST_USER_PROTOCOL_F_MQ |
	1ull << VHOST_USER_PROTOCOL_F_LOG_SHMFD |
	1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK |
	1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ |
	1ull << VHOST_USER_PROTOCOL_F_CONFIG |
	1ull << VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS |
	1ull << VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD |
	1ull << VHOST_USER_PROTOCOL_F_RESET_DEVICE |
	1ull << VHOST_USER_PROTOCOL_F_STATUS;

/* ---- Rings ---- */

static void vu_vring_reset(struct vu_vring *vr)
{
	sys_close(&vr->kick_fd);
	sys_close(&vr->call_fd);
	sys_close(&vr->err_fd);
	memset(vr, 0, sizeof(*vr));
	vr->kick_fd = vr->call_fd = vr->err_fd = -1;
}

/* Ring parts must lie in guest memory (checked again by vq_init on the
 * iothread; checking here lets us reject the message that set them).
 * Packed: the descriptor ring and two 4-byte event areas (virtio 1.2,
 * 2.8.10.1). */
static bool vu_vring_addr_ok(const struct vu_server *s, const struct vu_vring *vr)
{
	bool packed = vu__packed(s);

	return s->mem && gm_qva_to_host(s->mem, vr->desc, vring_desc_bytes(vr->num)) &&
	       gm_qva_to_host(s->mem, vr->avail, packed ? 4 : vring_avail_bytes(vr->num)) &&
	       gm_qva_to_host(s->mem, vr->used, packed ? 4 : vring_used_bytes(vr->num));
}

int vu__vring_start(struct vu_server *s, unsigned idx)
{
	struct vu_vring *vr = &s->vr[idx];
	struct vu_queue_setup su;
	int r;

	if (vr->started || vr->kick_fd < 0)
		return 0;
	/* Replaying a handover: the previous process starts nothing. */
	if (s->held)
		return 0;
	if (!vr->num || !vr->addr_set || !s->mem) {
		log_err("frontend started ring %u before setting its size, "
			"addresses and the memory table", idx);
		return VU_MALFORMED;
	}
	memset(&su, 0, sizeof(su));
	su.cfg.index = idx;
	su.cfg.num = vr->num;
	su.cfg.desc_qva = vr->desc;
	su.cfg.avail_qva = vr->avail;
	su.cfg.used_qva = vr->used;
	su.cfg.packed = vu__packed(s);
	if (!su.cfg.packed && vr->base > 0xffff) {
		log_err("ring %u: base %u is not a split ring's avail index", idx, vr->base);
		return VU_MALFORMED;
	}
	su.cfg.last_avail_idx = (uint16_t)vr->base;
	su.cfg.used_idx = (uint16_t)(vr->base >> 16);
	su.cfg.event_idx = s->acked & (1ull << VIRTIO_RING_F_EVENT_IDX);
	su.cfg.indirect = s->acked & (1ull << VIRTIO_RING_F_INDIRECT_DESC);
	vu__inflight_ring(s, idx, &su.cfg);
	su.mem = s->mem;
	su.kick_fd = vr->kick_fd;
	su.call_fd = vr->call_fd;
	su.err_fd = vr->err_fd;
	/* Without protocol features rings are enabled from the start. */
	su.enabled = (s->acked & (1ull << VHOST_USER_F_PROTOCOL_FEATURES)) ?
		     vr->enabled : true;
	su.features = s->acked;
	vu__vring_log(s, vr, &su.cfg.log);
	if (!s->claimed) {
		r = s->ops->claim(s->dev);
		if (r < 0) {
			log_err("ring %u not started: the disk cannot be claimed (%s)", idx,
				strerror(-r));
			return VU_REFUSED;
		}
		s->claimed = true;
	}
	r = s->ops->queue_start(s->dev, idx, &su);
	if (r < 0) {
		log_err("ring %u: cannot start (%s): its addresses are not in "
			"guest memory or not aligned", idx, strerror(-r));
		return VU_MALFORMED;
	}
	vr->started = true;
	log_debug("ring %u started: num %u base %u", idx, vr->num, vr->base);
	return 0;
}

void vu__vring_stop(struct vu_server *s, unsigned idx)
{
	struct vu_vring *vr = &s->vr[idx];

	if (!vr->started)
		return;
	vr->base = s->ops->queue_stop(s->dev, idx);
	vr->started = false;
	log_debug("ring %u stopped at %u", idx, vr->base);
}

bool vu__rings_running(const struct vu_server *s)
{
	for (unsigned i = 0; i < s->nqueues; i++)
		if (s->vr[i].started)
			return true;
	return false;
}

/* After the frontend stopped rings for good (GET_VRING_BASE, reset,
 * disconnect): with none left running, the disk is free for others, e.g.
 * the destination of a migration. */
void vu__release_if_idle(struct vu_server *s)
{
	if (s->claimed && !vu__rings_running(s)) {
		s->ops->release(s->dev);
		s->claimed = false;
	}
}

/* ---- Message handlers ---- */

/* What we offer: the device's virtio features, plus the vhost-user ones
 * that are ours (protocol features, dirty logging). */
static uint64_t vu_offered(const struct vu_server *s)
{
	return s->features | 1ull << VHOST_USER_F_PROTOCOL_FEATURES |
	       1ull << VHOST_F_LOG_ALL;
}

static int vu_get_features(struct vu_server *s, struct vu_msg *m)
{
	m->p.u64 = vu_offered(s);
	m->hdr.size = sizeof(m->p.u64);
	return VU_REPLY;
}

static int vu_set_features(struct vu_server *s, struct vu_msg *m)
{
	uint64_t f = m->p.u64, changed = f ^ s->acked;
	uint64_t offered = vu_offered(s);
	int r = 0;

	if (f & ~offered) {
		log_err("frontend acked features we did not offer: 0x%llx",
			(unsigned long long)(f & ~offered));
		return VU_MALFORMED;
	}
	/* Spec "Migration": the frontend turns logging on and off with
	 * SET_FEATURES while the rings run.  Other features take effect at
	 * the next ring start. */
	if (vu__rings_running(s) && (changed & ~(1ull << VHOST_F_LOG_ALL)))
		log_warn("features changed while rings run (0x%llx): they apply "
			 "when the rings restart", (unsigned long long)changed);
	s->acked = f;
	if (changed & (1ull << VIRTIO_F_RING_PACKED))
		log_info("virtqueues: %s", vu__packed(s) ? "packed" : "split");
	if (changed & (1ull << VHOST_F_LOG_ALL))
		r = vu__log_all_changed(s);
	s->ops->set_features(s->dev, f & s->features);
	/* Spec "Ring states": without VHOST_USER_F_PROTOCOL_FEATURES every
	 * ring is enabled. */
	if (!(f & (1ull << VHOST_USER_F_PROTOCOL_FEATURES)))
		for (unsigned i = 0; i < s->nqueues; i++) {
			s->vr[i].enabled = true;
			if (s->vr[i].started)
				s->ops->queue_set_enable(s->dev, i, true);
		}
	if (changed & ~(1ull << VHOST_F_LOG_ALL))
		log_info("features acked: 0x%llx", (unsigned long long)f);
	return r;
}

static int vu_get_protocol_features(struct vu_server *s, struct vu_msg *m)
{
	m->p.u64 = vu_proto_features;
	m->hdr.size = sizeof(m->p.u64);
	return VU_REPLY;
}

static int vu_set_protocol_features(struct vu_server *s, struct vu_msg *m)
{
	if (m->p.u64 & ~vu_proto_features) {
		log_err("frontend acked protocol features we did not offer: 0x%llx",
			(unsigned long long)(m->p.u64 & ~vu_proto_features));
		return VU_MALFORMED;
	}
	s->proto_acked = m->p.u64;
	return 0;
}

static int vu_set_owner(struct vu_server *s, struct vu_msg *m)
{
	return 0;
}

/* RESET_OWNER (deprecated, still sent by older frontends) and
 * RESET_DEVICE: every ring stopped (their in-flight requests completed
 * first), ring and feature state back to the start, logging off, status
 * 0.  The memory table, the in-flight region and the protocol features
 * stay: the connection is the same, and a frontend sets them again
 * anyway before it restarts rings. */
static int vu_reset_owner(struct vu_server *s, struct vu_msg *m)
{
	for (unsigned i = 0; i < s->nqueues; i++) {
		vu__vring_stop(s, i);
		vu_vring_reset(&s->vr[i]);
	}
	vu__release_if_idle(s);
	s->acked = 0;
	s->ops->set_features(s->dev, 0);
	vu__log_reset(s);
	s->status = 0;
	return 0;
}

/*
 * SET_STATUS / GET_STATUS (vhost-user.rst; the status byte is virtio 1.2,
 * 2.1 "Device Status Field").  We keep what the frontend sets and add
 * NEEDS_RESET while a running ring is broken (2.1.1: the device sets it
 * when it "has experienced an error from which it can't recover").
 *
 * Status 0 (a reset, in virtio terms) stops nothing here: rings stop on
 * GET_VRING_BASE and state resets on RESET_DEVICE.  QEMU 7.2.0 sent
 * SET_STATUS 0 at every stop, before GET_VRING_BASE, and a backend that
 * tore its rings down on it lost the ring bases (why QEMU reverted it);
 * answering GET_VRING_BASE right matters more than acting early.
 */
static int vu_set_status(struct vu_server *s, struct vu_msg *m)
{
	if (m->p.u64 > UINT8_MAX) {
		log_err("SET_STATUS: 0x%llx is not a status byte",
			(unsigned long long)m->p.u64);
		return -EINVAL;
	}
	s->status = (uint8_t)(m->p.u64 & ~VIRTIO_CONFIG_S_NEEDS_RESET);
	log_debug("device status 0x%02x", s->status);
	return 0;
}

static int vu_get_status(struct vu_server *s, struct vu_msg *m)
{
	uint8_t st = s->status;

	if (s->ops->needs_reset && s->ops->needs_reset(s->dev))
		st |= VIRTIO_CONFIG_S_NEEDS_RESET;
	m->p.u64 = st;
	m->hdr.size = sizeof(m->p.u64);
	return VU_REPLY;
}

static int vu_get_queue_num(struct vu_server *s, struct vu_msg *m)
{
	m->p.u64 = s->nqueues;
	m->hdr.size = sizeof(m->p.u64);
	return VU_REPLY;
}

/* Index of a ring named by a message, or -1 (logged). */
static int vu_ring_index(struct vu_server *s, uint32_t idx, const char *what)
{
	if (idx >= s->nqueues) {
		log_err("%s: ring %u does not exist (we have %u)", what, idx, s->nqueues);
		return -1;
	}
	return (int)idx;
}

static int vu_set_vring_num(struct vu_server *s, struct vu_msg *m)
{
	int i = vu_ring_index(s, m->p.state.index, "SET_VRING_NUM");
	uint32_t num = m->p.state.num;

	if (i < 0)
		return VU_MALFORMED;
	if (num == 0 || num > VRING_MAX_NUM || (num & (num - 1))) {
		log_err("SET_VRING_NUM: ring size %u is not a power of two <= %u",
			num, VRING_MAX_NUM);
		return VU_MALFORMED;
	}
	if (s->vr[i].started) {
		log_err("SET_VRING_NUM: ring %d is running", i);
		return VU_MALFORMED;
	}
	s->vr[i].num = num;
	return 0;
}

static int vu_set_vring_addr(struct vu_server *s, struct vu_msg *m)
{
	const struct vhost_vring_addr *a = &m->p.addr;
	int i = vu_ring_index(s, a->index, "SET_VRING_ADDR");
	bool log_used = a->flags & (1u << VHOST_VRING_F_LOG), was_started;
	struct vu_vring *vr;
	uint64_t end;

	if (i < 0)
		return VU_MALFORMED;
	vr = &s->vr[i];
	if (a->flags & ~(1u << VHOST_VRING_F_LOG)) {
		log_err("SET_VRING_ADDR: ring %d: unknown flags 0x%x", i, a->flags);
		return -ENOTSUP;
	}
	if (log_used && __builtin_add_overflow(a->log_guest_addr, vring_used_bytes(VRING_MAX_NUM),
					       &end)) {
		log_err("SET_VRING_ADDR: ring %d: log address 0x%llx wraps", i,
			(unsigned long long)a->log_guest_addr);
		return VU_MALFORMED;
	}
	if (vr->started && vr->desc == a->desc_user_addr && vr->avail == a->avail_user_addr &&
	    vr->used == a->used_user_addr) {
		/* Spec "Migration": logging of the used ring is switched
		 * with this message while the ring runs.  Same ring: only
		 * the logging changes, in place, between two batches. */
		struct vq_log lg;

		vr->log_used = log_used;
		vr->log_addr = a->log_guest_addr;
		vu__vring_log(s, vr, &lg);
		s->ops->queue_set_log(s->dev, (unsigned)i, &lg);
		return vu__log_covers(s) ? 0 : -ERANGE;
	}
	/* A ring that moves while it runs: stop it (draining what it has in
	 * flight) and start it again where it stopped, at the new place. */
	was_started = vr->started;
	vu__vring_stop(s, (unsigned)i);
	vr->desc = a->desc_user_addr;
	vr->avail = a->avail_user_addr;
	vr->used = a->used_user_addr;
	vr->log_used = log_used;
	vr->log_addr = a->log_guest_addr;
	vr->addr_set = true;
	if (vr->num && !vu_vring_addr_ok(s, vr)) {
		log_err("SET_VRING_ADDR: ring %d lies outside guest memory", i);
		vr->addr_set = false;
		return VU_MALFORMED;
	}
	if (was_started) {
		int r = vu__vring_start(s, (unsigned)i);

		if (r < 0)
			return r;
	}
	return vu__log_covers(s) ? 0 : -ERANGE;
}

static int vu_set_vring_base(struct vu_server *s, struct vu_msg *m)
{
	int i = vu_ring_index(s, m->p.state.index, "SET_VRING_BASE");

	if (i < 0)
		return VU_MALFORMED;
	if (s->vr[i].started) {
		log_err("SET_VRING_BASE: ring %d is running", i);
		return VU_MALFORMED;
	}
	/* 32 bits for packed rings; a split ring's is checked at start,
	 * when the features are surely known. */
	s->vr[i].base = m->p.state.num;
	return 0;
}

static int vu_get_vring_base(struct vu_server *s, struct vu_msg *m)
{
	int i = vu_ring_index(s, m->p.state.index, "GET_VRING_BASE");
	bool was_started;
	uint64_t t0 = sys_now_ns();

	if (i < 0)
		return VU_MALFORMED;
	was_started = s->vr[i].started;
	/* Every request taken from the ring completes (and is logged, if
	 * logging is on) before we answer: the frontend may hand the ring to
	 * another backend, e.g. a migration's destination. */
	vu__vring_stop(s, (unsigned)i);
	/* The switch-over of a migration: the last ring stopped with dirty
	 * logging on (spec "Migration"; a reset or a shutdown has it off). */
	if (was_started && vu__logging(s) && !vu__rings_running(s) && s->ops->switchover)
		s->ops->switchover(s->dev);
	/* A stopped ring waits for a new kick fd to start again. */
	sys_close(&s->vr[i].kick_fd);
	vu__release_if_idle(s);
	/* Our share of a migration's downtime, for the operator. */
	if (was_started)
		log_info("ring %d handed back at avail index %u in %llu us%s", i,
			 s->vr[i].base, (unsigned long long)((sys_now_ns() - t0) / 1000),
			 vu__logging(s) ? " (dirty logging on)" : "");
	m->p.state.num = s->vr[i].base;
	m->hdr.size = sizeof(m->p.state);
	return VU_REPLY;
}

/* The fd of SET_VRING_KICK/CALL/ERR and SET_LOG_FD must be an eventfd
 * (vhost-user.rst: "the event file descriptor"): iothreads read and write
 * it on the data path and must never block there, or the main thread
 * waiting on that iothread blocks too.  A pipe whose reader never reads
 * would do that after 8192 interrupts; a blocking eventfd when its counter
 * is full (its sender can fill it): sys_eventfd_check makes it
 * non-blocking (QEMU's and Cloud Hypervisor's already are). */
int vu__check_eventfd(struct vu_msg *m, const char *req)
{
	int r = sys_eventfd_check(m->fds[0]);

	if (r < 0)
		log_err("%s: the fd is not an eventfd (%s)", req,
			r == -EINVAL ? "a pipe, socket or file" : strerror(-r));
	return r;
}

/* Common decoding of SET_VRING_KICK/CALL/ERR.  Returns the ring index and
 * the fd (-1 with the NOFD bit), or VU_MALFORMED. */
static int vu_vring_fd(struct vu_server *s, struct vu_msg *m, int *fd)
{
	uint64_t v = m->p.u64;
	bool nofd = v & VHOST_USER_VRING_NOFD_MASK;
	int i;

	if (v & ~(VHOST_USER_VRING_IDX_MASK | VHOST_USER_VRING_NOFD_MASK) ||
	    m->nfds != (nofd ? 0u : 1u)) {
		log_err("%s: bad payload 0x%llx with %u fds", vu__req_name(m->hdr.request),
			(unsigned long long)v, m->nfds);
		return VU_MALFORMED;
	}
	i = vu_ring_index(s, (uint32_t)(v & VHOST_USER_VRING_IDX_MASK),
			  vu__req_name(m->hdr.request));
	if (i < 0 || (!nofd && vu__check_eventfd(m, vu__req_name(m->hdr.request)) < 0))
		return VU_MALFORMED;
	*fd = nofd ? -1 : vu__take_fd(m, 0);
	return i;
}

static int vu_set_vring_kick(struct vu_server *s, struct vu_msg *m)
{
	int fd, i = vu_vring_fd(s, m, &fd);
	struct vu_vring *vr;

	if (i < 0)
		return i;
	if (fd < 0) {
		log_err("SET_VRING_KICK without an fd (polling frontend) is not "
			"supported");
		return -ENOTSUP;
	}
	vr = &s->vr[i];
	/* A new kick fd on a running ring: restart it on the new fd. */
	vu__vring_stop(s, (unsigned)i);
	sys_close(&vr->kick_fd);
	vr->kick_fd = fd;
	return vu__vring_start(s, (unsigned)i);
}

static int vu_set_vring_call_err(struct vu_server *s, struct vu_msg *m)
{
	int fd, i = vu_vring_fd(s, m, &fd), old;
	struct vu_vring *vr;

	if (i < 0)
		return i;
	vr = &s->vr[i];
	if (m->hdr.request == VHOST_USER_SET_VRING_CALL) {
		old = vr->call_fd;
		vr->call_fd = fd;
	} else {
		old = vr->err_fd;
		vr->err_fd = fd;
	}
	/* The iothread stops using the old fd before we close it. */
	if (vr->started)
		s->ops->queue_set_fds(s->dev, (unsigned)i, vr->call_fd, vr->err_fd);
	sys_close(&old);
	return 0;
}

static int vu_set_vring_enable(struct vu_server *s, struct vu_msg *m)
{
	int i = vu_ring_index(s, m->p.state.index, "SET_VRING_ENABLE");

	if (i < 0 || m->p.state.num > 1)
		return VU_MALFORMED;
	s->vr[i].enabled = m->p.state.num;
	if (s->vr[i].started)
		s->ops->queue_set_enable(s->dev, (unsigned)i, s->vr[i].enabled);
	return 0;
}

/* GET_CONFIG / SET_CONFIG payload: header + size bytes, within 256. */
static bool vu_config_ok(const struct vu_msg *m)
{
	const struct vhost_user_config *c = &m->p.config;

	return m->hdr.size >= VHOST_USER_CONFIG_HDR_SIZE &&
	       c->size <= VHOST_USER_MAX_CONFIG_SIZE &&
	       c->offset <= VHOST_USER_MAX_CONFIG_SIZE - c->size &&
	       m->hdr.size == VHOST_USER_CONFIG_HDR_SIZE + c->size;
}

static int vu_get_config(struct vu_server *s, struct vu_msg *m)
{
	struct vhost_user_config *c = &m->p.config;

	if (!vu_config_ok(m)) {
		log_err("GET_CONFIG: bad range offset %u size %u (%u bytes)",
			c->offset, c->size, m->hdr.size);
		return VU_MALFORMED;
	}
	s->ops->get_config(s->dev, c->offset, c->region, c->size);
	return VU_REPLY;	/* same size as the request */
}

static int vu_set_config(struct vu_server *s, struct vu_msg *m)
{
	struct vhost_user_config *c = &m->p.config;

	if (!vu_config_ok(m)) {
		log_err("SET_CONFIG: bad range offset %u size %u (%u bytes)",
			c->offset, c->size, m->hdr.size);
		return VU_MALFORMED;
	}
	return s->ops->set_config(s->dev, c->offset, c->region, c->size);
}

/* ---- The backend channel and config changes ---- */

/* SET_BACKEND_REQ_FD: the socket we send our own requests on.  A new one
 * replaces the old. */
static int vu_set_backend_req_fd(struct vu_server *s, struct vu_msg *m)
{
	sys_close(&s->backend_fd);
	s->backend_fd = vu__take_fd(m, 0);
	return 0;
}

int vu_server_config_changed(struct vu_server *s)
{
	/* vhost-user.rst "Back-end message types", CONFIG_CHANGE_MSG: no
	 * payload.  Sent without NEED_REPLY: QEMU re-reads the config with
	 * GET_CONFIG on the main channel before it would answer, and this
	 * thread is the one that serves that channel. */
	struct vhost_user_hdr h = { .request = VHOST_USER_BACKEND_CONFIG_CHANGE_MSG,
				    .flags = VHOST_USER_VERSION };
	ssize_t n;

	if (s->conn_fd < 0 || s->backend_fd < 0 ||
	    !vu__has_proto(s, VHOST_USER_PROTOCOL_F_CONFIG))
		return 0;
	do
		n = send(s->backend_fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(h))
		return n < 0 ? -errno : -EIO;
	log_info("config change sent to the frontend");
	return 1;
}

/* ---- Dispatch ---- */

#define VU_SIZE_ANY UINT32_MAX
#define VU_FDS_ANY  (-1)

struct vu_handler {
	int (*fn)(struct vu_server *s, struct vu_msg *m);
	uint32_t size;		/* exact payload size, or VU_SIZE_ANY */
	int nfds;		/* exact fd count, or VU_FDS_ANY (handler checks) */
};

static const struct vu_handler vu_handlers[] = {
	[VHOST_USER_GET_FEATURES] = { vu_get_features, 0, 0 },
	[VHOST_USER_SET_FEATURES] = { vu_set_features, 8, 0 },
	[VHOST_USER_SET_OWNER] = { vu_set_owner, 0, 0 },
	[VHOST_USER_RESET_OWNER] = { vu_reset_owner, 0, 0 },
	[VHOST_USER_SET_MEM_TABLE] = { vu__set_mem_table, VU_SIZE_ANY, VU_FDS_ANY },
	[VHOST_USER_SET_LOG_BASE] = { vu__set_log_base, VU_SIZE_ANY, VU_FDS_ANY },
	[VHOST_USER_SET_LOG_FD] = { vu__set_log_fd, 0, VU_FDS_ANY },
	[VHOST_USER_SET_VRING_NUM] = { vu_set_vring_num, 8, 0 },
	[VHOST_USER_SET_VRING_ADDR] = { vu_set_vring_addr, 40, 0 },
	[VHOST_USER_SET_VRING_BASE] = { vu_set_vring_base, 8, 0 },
	[VHOST_USER_GET_VRING_BASE] = { vu_get_vring_base, 8, 0 },
	[VHOST_USER_SET_VRING_KICK] = { vu_set_vring_kick, 8, VU_FDS_ANY },
	[VHOST_USER_SET_VRING_CALL] = { vu_set_vring_call_err, 8, VU_FDS_ANY },
	[VHOST_USER_SET_VRING_ERR] = { vu_set_vring_call_err, 8, VU_FDS_ANY },
	[VHOST_USER_GET_PROTOCOL_FEATURES] = { vu_get_protocol_features, 0, 0 },
	[VHOST_USER_SET_PROTOCOL_FEATURES] = { vu_set_protocol_features, 8, 0 },
	[VHOST_USER_GET_QUEUE_NUM] = { vu_get_queue_num, 0, 0 },
	[VHOST_USER_SET_VRING_ENABLE] = { vu_set_vring_enable, 8, 0 },
	[VHOST_USER_SET_BACKEND_REQ_FD] = { vu_set_backend_req_fd, 0, 1 },
	[VHOST_USER_GET_CONFIG] = { vu_get_config, VU_SIZE_ANY, 0 },
	[VHOST_USER_SET_CONFIG] = { vu_set_config, VU_SIZE_ANY, 0 },
	[VHOST_USER_GET_MAX_MEM_SLOTS] = { vu__get_max_mem_slots, 0, 0 },
	[VHOST_USER_GET_INFLIGHT_FD] = { vu__get_inflight_fd, 24, 0 },
	[VHOST_USER_SET_INFLIGHT_FD] = { vu__set_inflight_fd, 24, 1 },
	[VHOST_USER_ADD_MEM_REG] = { vu__add_mem_reg, 40, 1 },
	[VHOST_USER_REM_MEM_REG] = { vu__rem_mem_reg, 40, VU_FDS_ANY },
	[VHOST_USER_RESET_DEVICE] = { vu_reset_owner, 0, 0 },
	[VHOST_USER_SET_STATUS] = { vu_set_status, 8, 0 },
	[VHOST_USER_GET_STATUS] = { vu_get_status, 0, 0 },
};

/* Send m's reply to the frontend.  While a handover replays the state
 * (s->held) there is none: an ack goes nowhere, a nack is kept in
 * ho_nack, which fails the handover (vu_server_handover_load). */
static int send_reply(struct vu_server *s, struct vu_msg *m)
{
	if (s->held) {
		if (m->hdr.size == sizeof(m->p.u64) && m->p.u64)
			s->ho_nack = true;
		sys_close(&m->reply_fd);
		return 0;
	}
	return vu__send(s->conn_fd, m);
}

/*
 * Handle one message.  Returns 0, or < 0 to disconnect.
 *
 * NEED_REPLY is answered whenever it is set (vhost-user.rst "REPLY_ACK"),
 * REPLY_ACK negotiated or not, as libvhost-user and DPDK do: a frontend
 * may set it on the very SET_PROTOCOL_FEATURES that negotiates REPLY_ACK
 * and wait for the answer.  A message with its own reply answers with
 * that alone.
 */
int vu__dispatch(struct vu_server *s, struct vu_msg *m)
{
	uint32_t req = m->hdr.request;
	bool need_reply = m->hdr.flags & VHOST_USER_NEED_REPLY_MASK;
	const struct vu_handler *h = NULL;
	int r;

	if (req < ARRAY_SIZE(vu_handlers) && vu_handlers[req].fn)
		h = &vu_handlers[req];
	log_debug("message %s (%u), %u bytes, %u fds", vu__req_name(req), req,
		  m->hdr.size, m->nfds);

	if (!h) {
		log_warn("unsupported request %u ignored%s", req,
			 need_reply ? " (error reply sent)" : "");
		r = -ENOTSUP;
	} else if ((h->size != VU_SIZE_ANY && m->hdr.size != h->size) ||
		   (h->nfds != VU_FDS_ANY && m->nfds != (unsigned)h->nfds)) {
		log_err("%s: malformed (%u bytes, %u fds)", vu__req_name(req),
			m->hdr.size, m->nfds);
		r = VU_MALFORMED;
	} else {
		r = h->fn(s, m);
	}
	vu__close_fds(m);

	if (r == VU_MALFORMED) {
		sys_close(&m->reply_fd);
		return r;
	}
	if (r == VU_REFUSED) {
		if (need_reply) {
			m->hdr.size = sizeof(m->p.u64);
			m->p.u64 = 1;
			(void)send_reply(s, m);
		}
		return r;
	}
	if (r == VU_REPLY)
		return send_reply(s, m);
	if (r < 0 && h)
		log_warn("%s failed: %s", vu__req_name(req), strerror(-r));
	if (need_reply) {
		m->hdr.size = sizeof(m->p.u64);
		m->p.u64 = r < 0 ? 1 : 0;
		return send_reply(s, m);
	}
	return 0;
}

/* ---- Connections ---- */

static void vu_conn_cb(void *opaque, uint32_t events);
static void vu_listen_cb(void *opaque, uint32_t events);

int vu__watch_conn(struct vu_server *s, int fd)
{
	return loop_fd_add(s->loop, fd, EPOLLIN, vu_conn_cb, s, &s->conn_h);
}

int vu__watch_listener(struct vu_server *s)
{
	return loop_fd_add(s->loop, s->listen_fd, EPOLLIN, vu_listen_cb, s, &s->listen_h);
}

/* Everything a frontend set, gone: rings stopped (drained), memory and
 * regions unmapped, features cleared. */
void vu__state_clear(struct vu_server *s)
{
	for (unsigned i = 0; i < s->nqueues; i++) {
		vu__vring_stop(s, i);
		vu_vring_reset(&s->vr[i]);
	}
	vu__release_if_idle(s);
	vu__log_reset(s);
	vu__mem_replace(s, NULL);
	/* The frontend keeps its own mapping of the region across our
	 * restarts; ours goes with the connection. */
	vu__inflight_unmap(s);
	s->acked = 0;
	s->proto_acked = 0;
	s->status = 0;
	sys_close(&s->backend_fd);
	s->ops->set_features(s->dev, 0);
}

void vu__disconnect(struct vu_server *s)
{
	if (s->conn_fd < 0)
		return;
	vu__state_clear(s);
	loop_fd_del(s->loop, s->conn_h);
	s->conn_h = NULL;
	sys_close(&s->conn_fd);
	log_info("frontend disconnected");
	if (s->listen_fd >= 0 && vu__watch_listener(s) < 0)
		log_err("cannot watch the listening socket again");
}

static void vu_conn_cb(void *opaque, uint32_t events)
{
	struct vu_server *s = opaque;
	struct vu_msg m;
	int r;

	m.reply_fd = -1;
	r = vu__recv(s->conn_fd, &m);
	if (r == -EAGAIN)
		return;
	if (r == 0)
		r = vu__dispatch(s, &m);
	else
		vu__close_fds(&m);
	if (r == -ECONNRESET) {
		vu__disconnect(s);
	} else if (r < 0) {
		log_err("dropping the frontend after a %s message%s",
			r == VU_MALFORMED ? "malformed" : "failed",
			r == VU_MALFORMED ? "" : " exchange");
		vu__disconnect(s);
	}
}

int vu_server_adopt(struct vu_server *s, int fd)
{
	int r;

	if (s->conn_fd >= 0)
		return -EBUSY;
	r = vu__watch_conn(s, fd);
	if (r < 0)
		return r;
	s->conn_fd = fd;
	s->nconn++;
	/* One frontend at a time: the next waits in the backlog. */
	loop_fd_del(s->loop, s->listen_h);
	s->listen_h = NULL;
	log_info("frontend connected");
	return 0;
}

/* For fuzzing and tests (see vu.h): what the loop would do on EPOLLIN. */
int vu_server_process(struct vu_server *s)
{
	struct pollfd p = { .fd = s->conn_fd, .events = POLLIN };
	int n;

	if (s->conn_fd < 0)
		return -ENOTCONN;
	do
		n = poll(&p, 1, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if (n == 0)
		return 0;
	vu_conn_cb(s, EPOLLIN);
	return s->conn_fd >= 0 ? 1 : -ECONNRESET;
}

static void vu_listen_cb(void *opaque, uint32_t events)
{
	struct vu_server *s = opaque;
	int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR)
			log_err("accept: %s", strerror(errno));
		return;
	}
	if (vu_server_adopt(s, fd) < 0)
		close(fd);
}

int vu_server_new(const char *path, struct loop *l, const struct vu_dev_ops *ops,
		  void *dev, struct vu_server **out, char *err, size_t errlen)
{
	return vu_server_new_fd(path, -1, l, ops, dev, out, err, errlen);
}

int vu_server_new_fd(const char *path, int listen_fd, struct loop *l,
		     const struct vu_dev_ops *ops, void *dev, struct vu_server **out,
		     char *err, size_t errlen)
{
	struct vu_server *s = calloc(1, sizeof(*s));
	int r;

	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->loop = l;
	s->ops = ops;
	s->dev = dev;
	s->conn_fd = -1;
	s->backend_fd = -1;
	s->listen_fd = -1;
	s->log_call_fd = -1;
	s->inflight_fd = -1;
	s->ho_conn_fd = -1;
	s->features = ops->features(dev);
	s->nqueues = ops->num_queues(dev);
	if (s->nqueues > VU_MAX_QUEUES) {
		snprintf(err, errlen, "too many queues (%u, at most %d)", s->nqueues,
			 VU_MAX_QUEUES);
		r = -EINVAL;
		goto err_free;
	}
	s->vr = calloc(s->nqueues, sizeof(*s->vr));
	s->path = strdup(path);
	if (!s->vr || !s->path) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto err_free;
	}
	/* calloc'ed fds read 0 (stdin): mark them closed, never close them. */
	for (unsigned i = 0; i < s->nqueues; i++)
		s->vr[i].kick_fd = s->vr[i].call_fd = s->vr[i].err_fd = -1;
	/* An inherited listener (upgrade in place) stays the previous
	 * process's until the handover commits. */
	s->keep_path = listen_fd >= 0;
	r = listen_fd >= 0 ? listen_fd : sock_listen_unix(path, err, errlen);
	if (r < 0)
		goto err_free;
	s->listen_fd = r;
	r = vu__watch_listener(s);
	if (r < 0) {
		snprintf(err, errlen, "cannot watch socket '%s': %s", path, strerror(-r));
		goto err_unbind;
	}
	*out = s;
	return 0;

err_unbind:
	if (!s->keep_path)
		unlink(path);
	close(s->listen_fd);
err_free:
	free(s->vr);
	free(s->path);
	free(s);
	return r;
}

void vu_server_free(struct vu_server *s)
{
	if (!s)
		return;
	/* Stop accepting first, so the disconnect below does not re-arm. */
	loop_fd_del(s->loop, s->listen_h);
	s->listen_h = NULL;
	if (s->listen_fd >= 0) {
		close(s->listen_fd);
		s->listen_fd = -1;
		if (!s->keep_path)
			unlink(s->path);
	}
	vu__disconnect(s);
	sys_close(&s->ho_conn_fd);
	free(s->vr);
	free(s->path);
	free(s);
}

void vu_server_drop(struct vu_server *s, const char *why)
{
	if (s->conn_fd < 0)
		return;
	log_err("dropping the frontend: %s", why);
	vu__disconnect(s);
}

unsigned vu_server_connections(const struct vu_server *s)
{
	return s->nconn;
}

bool vu_server_connected(const struct vu_server *s)
{
	return s->conn_fd >= 0;
}
