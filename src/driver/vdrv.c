/*
 * Driver side of vhost-user-blk: the frontend half of
 * qemu docs/interop/vhost-user.rst and the driver half of virtio 1.2,
 * 2.7 "Split Virtqueues".  Message order follows what QEMU sends, so any
 * backend that serves QEMU serves us.
 */
#include "driver/vdrv.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "driver/vdrv_internal.h"
#include "driver/vdrv_log.h"
#include "util/barrier.h"
#include "util/compiler.h"
#include "util/sock.h"
#include "util/sys.h"
#include "vhost/vhost_user.h"

#define VDRV_ALIGN(x, a) (((x) + (a) - 1) & ~((size_t)(a) - 1))

/* Features we can drive (device bits we understand + ring + transport). */
static const uint64_t vdrv_wanted =
	1ull << VIRTIO_F_VERSION_1 |
	1ull << VIRTIO_RING_F_INDIRECT_DESC |
	1ull << VIRTIO_RING_F_EVENT_IDX |
	1ull << VHOST_USER_F_PROTOCOL_FEATURES |
	1ull << VIRTIO_BLK_F_SEG_MAX |
	1ull << VIRTIO_BLK_F_BLK_SIZE |
	1ull << VIRTIO_BLK_F_FLUSH |
	1ull << VIRTIO_BLK_F_TOPOLOGY |
	1ull << VIRTIO_BLK_F_MQ |
	1ull << VIRTIO_BLK_F_RO |
	1ull << VIRTIO_BLK_F_DISCARD |
	1ull << VIRTIO_BLK_F_WRITE_ZEROES;

/* LOG_SHMFD is taken whenever offered: it changes nothing until
 * vdrv_log_start sends SET_LOG_BASE.  VHOST_F_LOG_ALL, a feature bit, is
 * not in vdrv_wanted: it is set in SET_FEATURES only while logging is on
 * (vdrv_log.c). */
static const uint64_t vdrv_wanted_proto =
	1ull << VHOST_USER_PROTOCOL_F_MQ |
	1ull << VHOST_USER_PROTOCOL_F_LOG_SHMFD |
	1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK |
	1ull << VHOST_USER_PROTOCOL_F_CONFIG |
	1ull << VHOST_USER_PROTOCOL_F_STATUS |
	1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ;

/* ---- Messages ---- */

int vdrv__send(struct vdrv *d, uint32_t req, bool need_reply, const void *payload,
	       uint32_t size, const int *fds, unsigned nfds)
{
	struct vhost_user_hdr h = { .request = req, .flags = VHOST_USER_VERSION,
				    .size = size };
	char cbuf[CMSG_SPACE(VHOST_USER_MAX_FDS * sizeof(int))];
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)payload, size } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = size ? 2 : 1 };
	ssize_t n;

	if (need_reply)
		h.flags |= VHOST_USER_NEED_REPLY_MASK;
	(void)sock_msg_set_fds(&mh, cbuf, sizeof(cbuf), fds, nfds);
	do
		n = sendmsg(d->sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n == (ssize_t)(sizeof(h) + size) ? 0 : -EIO;
}

int vdrv__recv(struct vdrv *d, uint32_t req, void *payload, uint32_t size)
{
	struct vhost_user_hdr h;
	ssize_t n = recv(d->sock, &h, sizeof(h), MSG_WAITALL);

	if (n != sizeof(h))
		return n == 0 ? -ECONNRESET : n < 0 ? -errno : -EIO;
	if (h.request != req || !(h.flags & VHOST_USER_REPLY_MASK) || h.size > size)
		return -EPROTO;
	if (h.size && recv(d->sock, payload, h.size, MSG_WAITALL) != (ssize_t)h.size)
		return -EIO;
	return (int)h.size;
}

/* Every setup step is confirmed before the next (with REPLY_ACK), so a
 * refusal names the step. */
int vdrv__call(struct vdrv *d, uint32_t req, const void *payload, uint32_t size,
	       const int *fds, unsigned nfds)
{
	bool ack = d->proto_features & (1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK);
	uint64_t v;
	int r = vdrv__send(d, req, ack, payload, size, fds, nfds);

	if (r < 0 || !ack)
		return r;
	r = vdrv__recv(d, req, &v, sizeof(v));
	if (r < 0)
		return r;
	return r == sizeof(v) && v == 0 ? 0 : -EREMOTEIO;
}

static int vdrv_get_u64(struct vdrv *d, uint32_t req, uint64_t *v)
{
	int r = vdrv__send(d, req, false, NULL, 0, NULL, 0);

	if (r < 0)
		return r;
	r = vdrv__recv(d, req, v, sizeof(*v));
	return r < 0 ? r : r == sizeof(*v) ? 0 : -EPROTO;
}

int vdrv_get_status(struct vdrv *d, uint8_t *status)
{
	uint64_t v;
	int r;

	if (!(d->proto_features & (1ull << VHOST_USER_PROTOCOL_F_STATUS)))
		return -ENOTSUP;
	r = vdrv_get_u64(d, VHOST_USER_GET_STATUS, &v);
	if (r == 0)
		*status = (uint8_t)v;
	return r;
}

/* ---- Memory ---- */

void *vdrv_alloc(struct vdrv *d, size_t len, size_t align)
{
	size_t off = VDRV_ALIGN(d->mem_used, align);

	if (off > d->mem_size || len > d->mem_size - off)
		return NULL;
	d->mem_used = off + len;
	return d->mem + off;
}


uint64_t vdrv_capacity(const struct vdrv *d)
{
	return d->cfg.capacity << VIRTIO_BLK_SECTOR_SHIFT;
}

unsigned vdrv_block_size(const struct vdrv *d)
{
	if (vdrv_has(d, VIRTIO_BLK_F_BLK_SIZE) && d->cfg.blk_size >= 512)
		return d->cfg.blk_size;
	return 512;
}

enum vdrv_area vdrv_area_of(const struct vdrv *d, uint64_t gpa, unsigned *queue,
			    const char **field, uint64_t *end)
{
	uint64_t next = d->mem_size;

	*field = NULL;
	for (unsigned i = 0; i < d->num_queues; i++) {
		const struct vdrv_queue *q = &d->q[i];
		uint64_t n = q->num;
		const struct {
			const void *base;
			uint64_t len;
			enum vdrv_area area;
		} areas[] = {
			{ q->desc, vring_desc_bytes(q->num), VDRV_AREA_DESC },
			{ q->avail, vring_avail_bytes(q->num), VDRV_AREA_AVAIL },
			{ q->used, vring_used_bytes(q->num), VDRV_AREA_USED },
			{ q->ind, n * VDRV_MAX_SEGS * sizeof(struct vring_desc), VDRV_AREA_INDIRECT },
		};

		if (!q->desc)		/* setup failed before this queue */
			break;
		for (unsigned a = 0; a < ARRAY_SIZE(areas); a++) {
			uint64_t start = vdrv_gpa(d, areas[a].base), off = gpa - start;
			/* 2.7.6 / 2.7.8: flags, idx, ring[num], then the event
			 * index the other side writes. */
			uint64_t elem = areas[a].area == VDRV_AREA_USED ? 8 : 2;

			if (gpa < start) {
				next = MIN(next, start);
				continue;
			}
			if (off >= areas[a].len)
				continue;
			*queue = i;
			*end = start + areas[a].len;
			if (areas[a].area == VDRV_AREA_AVAIL || areas[a].area == VDRV_AREA_USED) {
				if (off < 2) {
					*field = "flags";
					*end = start + 2;
				} else if (off < 4) {
					*field = "idx";
					*end = start + 4;
				} else if (off < 4 + elem * n) {
					*field = "ring";
					*end = start + 4 + elem * n;
				} else {
					*field = areas[a].area == VDRV_AREA_USED ? "avail_event"
										  : "used_event";
				}
			}
			return areas[a].area;
		}
	}
	*end = next;
	return VDRV_AREA_NONE;
}

/* ---- Setup ---- */

void vdrv__vring_addr(const struct vdrv_queue *q, bool log, struct vhost_vring_addr *a)
{
	*a = (struct vhost_vring_addr){ .index = q->idx };
	/* vhost-user ring addresses are in the frontend's address space;
	 * the log address is guest-physical ("Migration"). */
	a->desc_user_addr = (uint64_t)(uintptr_t)q->desc;
	a->avail_user_addr = (uint64_t)(uintptr_t)q->avail;
	a->used_user_addr = (uint64_t)(uintptr_t)q->used;
	if (log) {
		a->flags = 1u << VHOST_VRING_F_LOG;
		a->log_guest_addr = vdrv_gpa(q->d, q->used);
	}
}

static int vdrv_queue_setup(struct vdrv *d, struct vdrv_queue *q, unsigned idx,
			    unsigned num, char *err, size_t errlen)
{
	struct vhost_vring_state st = { .index = idx };
	struct vhost_vring_addr addr;
	uint64_t u;
	int r;

	q->d = d;
	q->idx = idx;
	q->num = num;
	q->kick_fd = q->call_fd = -1;
	q->event_idx = vdrv_has(d, VIRTIO_RING_F_EVENT_IDX);
	/* virtio 1.2, 2.7 alignment: desc 16, avail 2, used 4. */
	q->desc = vdrv_alloc(d, vring_desc_bytes(num), 4096);
	q->avail = vdrv_alloc(d, vring_avail_bytes(num), 4096);
	q->used = vdrv_alloc(d, vring_used_bytes(num), 4096);
	/* Indirect tables start a page of their own: dirty logging tracks
	 * pages, and the used ring (the device's) must not share one with
	 * memory the driver keeps marking, or an unlogged used-ring write
	 * would be copied anyway and go unnoticed (vdrv_log.h). */
	q->ind = vdrv_alloc(d, (size_t)num * VDRV_MAX_SEGS * sizeof(struct vring_desc), 4096);
	q->free_heads = calloc(num, sizeof(*q->free_heads));
	q->cookies = calloc(num, sizeof(*q->cookies));
	if (!q->desc || !q->avail || !q->used || !q->ind || !q->free_heads || !q->cookies) {
		snprintf(err, errlen, "out of shared memory for queue %u", idx);
		return -ENOMEM;
	}
	q->used_event = &q->avail->ring[num];
	q->avail_event = (uint16_t *)&q->used->ring[num];
	/* Each request is one ring descriptor pointing at its own indirect
	 * table, so a queue of num holds num requests.  Packed: the ring
	 * starts zeroed (2.8.13), both wrap counters at 1 (2.8.1). */
	q->packed = vdrv_has(d, VIRTIO_F_RING_PACKED);
	if (q->packed) {
		q->slots = calloc(num, sizeof(*q->slots));
		if (!q->slots) {
			snprintf(err, errlen, "out of memory for queue %u", idx);
			return -ENOMEM;
		}
		q->avail_wrap = q->used_wrap = true;
		q->slots_free = num;
	}
	for (unsigned i = 0; i < num; i++) {
		if (!q->packed) {
			q->desc[i].addr = vdrv_gpa(d, q->ind + (size_t)i * VDRV_MAX_SEGS);
			q->desc[i].flags = VRING_DESC_F_INDIRECT;
		}
		q->free_heads[i] = (uint16_t)(num - 1 - i);
	}
	q->nfree = num;

	q->kick_fd = sys_eventfd();
	q->call_fd = sys_eventfd();
	if (q->kick_fd < 0 || q->call_fd < 0) {
		snprintf(err, errlen, "cannot create eventfds");
		return -EMFILE;
	}
	st.num = num;
	r = vdrv__call(d, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), NULL, 0);
	if (r < 0)
		goto fail;
	/* Packed: position 0 with wrap counter 1, for the next descriptor to
	 * take and the next to use (QEMU's encoding). */
	st.num = q->packed ? 0x80008000u : 0;
	r = vdrv__call(d, VHOST_USER_SET_VRING_BASE, &st, sizeof(st), NULL, 0);
	if (r < 0)
		goto fail;
	vdrv__vring_addr(q, false, &addr);
	r = vdrv__call(d, VHOST_USER_SET_VRING_ADDR, &addr, sizeof(addr), NULL, 0);
	if (r < 0)
		goto fail;
	u = idx;
	r = vdrv__call(d, VHOST_USER_SET_VRING_KICK, &u, sizeof(u), &q->kick_fd, 1);
	if (r < 0)
		goto fail;
	r = vdrv__call(d, VHOST_USER_SET_VRING_CALL, &u, sizeof(u), &q->call_fd, 1);
	if (r < 0)
		goto fail;
	if (vdrv_has(d, VHOST_USER_F_PROTOCOL_FEATURES)) {
		st.num = 1;
		r = vdrv__call(d, VHOST_USER_SET_VRING_ENABLE, &st, sizeof(st), NULL, 0);
		if (r < 0)
			goto fail;
	}
	return 0;
fail:
	snprintf(err, errlen, "the backend refused to set up queue %u: %s", idx,
		 strerror(-r));
	return r;
}

/* GET_CONFIG: the virtio-blk config space (its first 60 bytes) into
 * d->cfg. */
static int vdrv_read_config(struct vdrv *d)
{
	struct vhost_user_config cfg = { .offset = 0, .size = 60 };
	int r = vdrv__send(d, VHOST_USER_GET_CONFIG, false, &cfg,
			   VHOST_USER_CONFIG_HDR_SIZE + cfg.size, NULL, 0);

	if (r >= 0)
		r = vdrv__recv(d, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg));
	if (r < 0)
		return r;
	if (r != VHOST_USER_CONFIG_HDR_SIZE + 60)
		return -EPROTO;		/* the spec's error answer: no payload */
	memcpy(&d->cfg, cfg.region, MIN(cfg.size, (uint32_t)sizeof(d->cfg)));
	return 0;
}

/* BACKEND_REQ: a socket pair, one end handed to the backend
 * (SET_BACKEND_REQ_FD) for its own requests to us. */
static int vdrv_backend_channel(struct vdrv *d)
{
	int sv[2], r;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	r = vdrv__call(d, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, &sv[1], 1);
	close(sv[1]);
	if (r < 0) {
		close(sv[0]);
		return r;
	}
	d->backend_fd = sv[0];
	return 0;
}

int vdrv_wait_config_change(struct vdrv *d, int timeout_ms)
{
	struct pollfd p = { .fd = d->backend_fd, .events = POLLIN };
	struct vhost_user_hdr h;
	uint64_t payload[32];
	ssize_t n;
	int r;

	if (d->backend_fd < 0)
		return -ENOTSUP;
	do
		r = poll(&p, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r <= 0)
		return r < 0 ? -errno : 0;
	/* vhost-user.rst "Back-end message types": a header, maybe a
	 * payload (none for CONFIG_CHANGE_MSG), an ack if asked. */
	n = recv(d->backend_fd, &h, sizeof(h), MSG_WAITALL);
	if (n != (ssize_t)sizeof(h))
		return n == 0 ? -ECONNRESET : -EIO;
	if (h.size > sizeof(payload) ||
	    (h.size && recv(d->backend_fd, payload, h.size, MSG_WAITALL) != (ssize_t)h.size))
		return -EPROTO;
	if (h.request != VHOST_USER_BACKEND_CONFIG_CHANGE_MSG)
		return -EPROTO;
	if (h.flags & VHOST_USER_NEED_REPLY_MASK) {
		struct { struct vhost_user_hdr h; uint64_t v; } __attribute__((packed)) a = {
			{ h.request, VHOST_USER_VERSION | VHOST_USER_REPLY_MASK, 8 }, 0 };

		if (send(d->backend_fd, &a, sizeof(a), MSG_NOSIGNAL) != (ssize_t)sizeof(a))
			return -EIO;
	}
	r = vdrv_read_config(d);
	return r < 0 ? r : 1;
}

int vdrv_connect(const struct vdrv_opts *o, struct vdrv **out, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = 10 };
	unsigned num = o->queue_size ? o->queue_size : 256;
	struct vhost_user_memory mem = { .nregions = 1 };
	struct vdrv *d;
	size_t ring_bytes;
	uint64_t u;
	int r;

	if (num > VRING_MAX_NUM || (num & (num - 1))) {
		snprintf(err, errlen, "queue size %u is not a power of two <= %u", num,
			 VRING_MAX_NUM);
		return -EINVAL;
	}
	if (strlen(o->socket) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path '%s' is too long", o->socket);
		return -ENAMETOOLONG;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->memfd = -1;
	d->backend_fd = -1;
	d->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	strcpy(sa.sun_path, o->socket);
	if (d->sock < 0 || connect(d->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot connect to '%s': %s: is a vhost-user-blk "
			 "backend (vblkd --socket %s ...) running?", o->socket,
			 strerror(-r), o->socket);
		goto err_free;
	}
	setsockopt(d->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

	r = vdrv_get_u64(d, VHOST_USER_GET_FEATURES, &d->dev_features);
	if (r < 0)
		goto proto_err;
	d->features = d->dev_features & vdrv_wanted;
	if (o->no_event_idx)
		d->features &= ~(1ull << VIRTIO_RING_F_EVENT_IDX);
	if (o->packed) {
		if (!(d->dev_features & (1ull << VIRTIO_F_RING_PACKED))) {
			snprintf(err, errlen, "the backend at '%s' does not offer packed "
				 "rings (VIRTIO_F_RING_PACKED): drop --packed", o->socket);
			r = -ENOTSUP;
			goto err_close;
		}
		if (o->dirty_log) {
			snprintf(err, errlen, "dirty logging is not implemented for packed "
				 "rings in vblk-bench: drop --packed");
			r = -ENOTSUP;
			goto err_close;
		}
		d->features |= 1ull << VIRTIO_F_RING_PACKED;
	}
	if (!vdrv_has(d, VIRTIO_F_VERSION_1) || !vdrv_has(d, VIRTIO_RING_F_INDIRECT_DESC)) {
		snprintf(err, errlen, "the backend at '%s' lacks VERSION_1 or "
			 "INDIRECT_DESC (features 0x%llx)", o->socket,
			 (unsigned long long)d->dev_features);
		r = -ENOTSUP;
		goto err_close;
	}
	if (vdrv_has(d, VHOST_USER_F_PROTOCOL_FEATURES)) {
		r = vdrv_get_u64(d, VHOST_USER_GET_PROTOCOL_FEATURES, &u);
		if (r < 0)
			goto proto_err;
		u &= vdrv_wanted_proto;
		r = vdrv__send(d, VHOST_USER_SET_PROTOCOL_FEATURES, false, &u, sizeof(u),
			       NULL, 0);
		if (r < 0)
			goto proto_err;
		d->proto_features = u;
	}
	d->max_queues = 1;
	if (d->proto_features & (1ull << VHOST_USER_PROTOCOL_F_MQ)) {
		r = vdrv_get_u64(d, VHOST_USER_GET_QUEUE_NUM, &u);
		if (r < 0)
			goto proto_err;
		d->max_queues = (unsigned)u;
	}
	d->num_queues = o->num_queues ? o->num_queues : 1;
	if (d->num_queues > d->max_queues) {
		snprintf(err, errlen, "the backend offers %u queue%s, %u asked: start it "
			 "with more queues or use fewer jobs", d->max_queues,
			 d->max_queues == 1 ? "" : "s", d->num_queues);
		r = -EINVAL;
		goto err_close;
	}
	r = vdrv__call(d, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0);
	if (r < 0)
		goto proto_err;
	if (d->proto_features & (1ull << VHOST_USER_PROTOCOL_F_CONFIG)) {
		r = vdrv_read_config(d);
		if (r < 0)
			goto proto_err;
	}
	if (d->proto_features & (1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ)) {
		r = vdrv_backend_channel(d);
		if (r < 0)
			goto proto_err;
	}
	if (!d->cfg.capacity) {
		snprintf(err, errlen, "the backend reports an empty disk");
		r = -EINVAL;
		goto err_close;
	}
	r = vdrv__call(d, VHOST_USER_SET_FEATURES, &d->features, sizeof(d->features),
		       NULL, 0);
	if (r < 0)
		goto proto_err;

	/* Shared memory: rings and indirect tables first, then buffers. */
	ring_bytes = d->num_queues * (VDRV_ALIGN(vring_desc_bytes(num), 4096) +
				      VDRV_ALIGN(vring_avail_bytes(num), 4096) +
				      VDRV_ALIGN(vring_used_bytes(num), 4096) +
				      VDRV_ALIGN((size_t)num * VDRV_MAX_SEGS *
						 sizeof(struct vring_desc), 4096));
	d->mem_size = VDRV_ALIGN(ring_bytes + o->mem_bytes + 4096, 2 << 20);
	d->memfd = memfd_create("vdrv-mem", MFD_CLOEXEC);
	if (d->memfd < 0 || ftruncate(d->memfd, (off_t)d->mem_size) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot create %zu bytes of shared memory: %s",
			 d->mem_size, strerror(-r));
		goto err_close;
	}
	d->mem = mmap(NULL, d->mem_size, PROT_READ | PROT_WRITE, MAP_SHARED, d->memfd, 0);
	if (d->mem == MAP_FAILED) {
		r = -errno;
		d->mem = NULL;
		snprintf(err, errlen, "cannot map shared memory: %s", strerror(-r));
		goto err_close;
	}
	mem.regions[0].guest_phys_addr = 0;
	mem.regions[0].memory_size = d->mem_size;
	mem.regions[0].userspace_addr = (uint64_t)(uintptr_t)d->mem;
	mem.regions[0].mmap_offset = 0;
	r = vdrv__call(d, VHOST_USER_SET_MEM_TABLE, &mem,
		       offsetof(struct vhost_user_memory, regions) +
		       sizeof(mem.regions[0]), &d->memfd, 1);
	if (r < 0)
		goto proto_err;
	/* Before any queue thread exists: they read d->log without a barrier
	 * (thread creation orders it). */
	if (o->dirty_log) {
		r = vdrv__log_new(d, &d->log);
		if (r < 0) {
			snprintf(err, errlen, "cannot create the dirty log: %s", strerror(-r));
			goto err_close;
		}
	}

	d->q = calloc(d->num_queues, sizeof(*d->q));
	if (!d->q) {
		r = -ENOMEM;
		goto err_close;
	}
	for (unsigned i = 0; i < d->num_queues; i++) {
		r = vdrv_queue_setup(d, &d->q[i], i, num, err, errlen);
		if (r < 0)
			goto err_close;
	}
	*out = d;
	return 0;

proto_err:
	snprintf(err, errlen, "vhost-user setup with '%s' failed: %s", o->socket,
		 strerror(-r));
err_close:
	vdrv_close(d);
	return r;
err_free:
	if (d->sock >= 0)
		close(d->sock);
	free(d);
	return r;
}

/* GET_VRING_BASE: the backend stops the ring and answers with its base. */
static int queue_stop(struct vdrv *d, struct vdrv_queue *q, uint16_t *base)
{
	struct vhost_vring_state st = { .index = q->idx };
	int r = vdrv__send(d, VHOST_USER_GET_VRING_BASE, false, &st, sizeof(st), NULL, 0);

	if (r < 0)
		return r;
	r = vdrv__recv(d, VHOST_USER_GET_VRING_BASE, &st, sizeof(st));
	if (r < 0)
		return r;
	if (r != sizeof(st) || st.index != q->idx)
		return -EPROTO;
	q->stopped = true;
	if (base)
		*base = (uint16_t)st.num;
	return 0;
}

int vdrv_stop_rings(struct vdrv *d, uint16_t *bases)
{
	for (unsigned i = 0; i < d->num_queues; i++) {
		int r;

		if (d->q[i].stopped)
			return -EINVAL;
		r = queue_stop(d, &d->q[i], bases ? &bases[i] : NULL);
		if (r < 0)
			return r;
	}
	return 0;
}

void vdrv_close(struct vdrv *d)
{
	if (!d)
		return;
	for (unsigned i = 0; d->q && i < d->num_queues; i++) {
		struct vdrv_queue *q = &d->q[i];

		/* Stop the ring so the backend drains it before we unmap. */
		if (q->kick_fd >= 0 && !q->stopped)
			(void)queue_stop(d, q, NULL);
		sys_close(&q->kick_fd);
		sys_close(&q->call_fd);
		free(q->free_heads);
		free(q->cookies);
		free(q->slots);
	}
	free(d->q);
	if (d->backend_fd >= 0)
		close(d->backend_fd);
	if (d->sock >= 0)
		close(d->sock);
	vdrv__log_free(d->log);
	if (d->mem)
		munmap(d->mem, d->mem_size);
	if (d->memfd >= 0)
		close(d->memfd);
	free(d);
}

/* ---- Queue operations (queue's thread) ---- */

/*
 * Dirty logging (vdrv_log.h): the queue operations mark what they stored,
 * after storing it.  The marks live here, cold and out of line, each
 * called once from a branch on d->log and, where it can be, as the
 * operation's last act (a tail call): without logging an operation then
 * pays that branch and nothing else, no frame to keep q alive across a
 * call it never makes.
 */
static void __attribute__((noinline, cold)) log_u16(struct vdrv_queue *q, const uint16_t *p)
{
	vdrv__log_mark(q->d->log, vdrv_gpa(q->d, p), sizeof(*p));
}

/* vdrv_add's stores: the indirect table of head (n entries), its length in
 * the ring descriptor, the avail slot just filled.  Returns 0: vdrv_add's
 * result. */
static int __attribute__((noinline, cold)) log_add(struct vdrv_queue *q, uint16_t head,
						   unsigned n)
{
	struct vdrv *d = q->d;
	uint16_t slot = (uint16_t)(q->avail_idx - 1) & (q->num - 1);

	vdrv__log_mark(d->log, vdrv_gpa(d, q->ind + (size_t)head * VDRV_MAX_SEGS),
		       n * sizeof(struct vring_desc));
	vdrv__log_mark(d->log, vdrv_gpa(d, &q->desc[head].len), sizeof(q->desc[head].len));
	log_u16(q, &q->avail->ring[slot]);
	return 0;
}

/* Tell the device, or count that it asked us not to. */
static inline void kick_decided(struct vdrv_queue *q, bool kick)
{
	if (kick) {
		q->kicks++;
		(void)sys_eventfd_signal(q->kick_fd);
	} else {
		q->kicks_suppressed++;
	}
}

/* vdrv_kick's store of avail->idx, then the kick. */
static void __attribute__((noinline, cold)) log_kick(struct vdrv_queue *q, bool kick)
{
	log_u16(q, &q->avail->idx);
	kick_decided(q, kick);
}

/* vdrv_enable_cb's store; returns more, vdrv_enable_cb's result. */
static bool __attribute__((noinline, cold)) log_enable_cb(struct vdrv_queue *q, bool more)
{
	log_u16(q, q->event_idx ? q->used_event : &q->avail->flags);
	return more;
}

int vdrv_add(struct vdrv_queue *q, const struct iovec *out, unsigned nout,
	     const struct iovec *in, unsigned nin, void *cookie)
{
	struct vring_desc *t;
	unsigned n = 0;
	uint16_t head;

	if (nout + nin == 0 || nout + nin > VDRV_MAX_SEGS)
		return -EINVAL;
	if (q->packed)
		return vdrv__packed_add(q, out, nout, in, nin, cookie);
	if (!q->nfree)
		return -ENOSPC;
	head = q->free_heads[q->nfree - 1];
	t = q->ind + (size_t)head * VDRV_MAX_SEGS;
	for (unsigned i = 0; i < nout + nin; i++) {
		const struct iovec *v = i < nout ? &out[i] : &in[i - nout];

		if (!vdrv_in_mem(q->d, v->iov_base, v->iov_len))
			return -EINVAL;
		t[n].addr = vdrv_gpa(q->d, v->iov_base);
		t[n].len = (uint32_t)v->iov_len;
		t[n].flags = (i >= nout ? VRING_DESC_F_WRITE : 0) |
			     (i + 1 < nout + nin ? VRING_DESC_F_NEXT : 0);
		t[n].next = (uint16_t)(n + 1);
		n++;
	}
	q->nfree--;
	q->desc[head].len = n * sizeof(struct vring_desc);
	q->cookies[head] = cookie;
	q->avail->ring[q->avail_idx & (q->num - 1)] = head;
	q->avail_idx++;
	if (q->d->log)
		return log_add(q, head, n);
	return 0;
}

void vdrv_kick(struct vdrv_queue *q)
{
	uint16_t old = q->kicked_idx, new = q->avail_idx;
	bool kick;

	if (q->packed) {
		vdrv__packed_kick(q);
		return;
	}
	if (old == new)
		return;
	/* Pairs with the device's read barrier after reading avail->idx:
	 * descriptors and ring entries are visible before the index. */
	smp_wmb();
	WRITE_ONCE(q->avail->idx, new);
	q->kicked_idx = new;
	/* Pairs with the device's full barrier in its enable-notify path
	 * (vq_enable_notify): either it sees our index, or we see its
	 * request for a kick. */
	smp_mb();
	if (q->event_idx)
		kick = vring_need_event(READ_ONCE(*q->avail_event), new, old);
	else
		kick = !(READ_ONCE(q->used->flags) & VRING_USED_F_NO_NOTIFY);
	if (q->d->log)
		log_kick(q, kick);
	else
		kick_decided(q, kick);
}

bool vdrv_pending(struct vdrv_queue *q)
{
	if (q->packed)
		return vdrv__packed_pending(q);
	return READ_ONCE(q->used->idx) != q->last_used;
}

void *vdrv_get(struct vdrv_queue *q, uint32_t *len)
{
	struct vring_used_elem *u;
	uint32_t id;
	void *cookie;

	if (q->packed)
		return vdrv__packed_get(q, len);
	if (READ_ONCE(q->used->idx) == q->last_used)
		return NULL;
	/* Pairs with the device's write barrier before it publishes
	 * used->idx (vq_flush): read the entry only after the index. */
	smp_rmb();
	u = &q->used->ring[q->last_used & (q->num - 1)];
	id = READ_ONCE(u->id);
	if (len)
		*len = READ_ONCE(u->len);
	q->last_used++;
	/* The device is not trusted either: an id we did not hand out is
	 * counted and skipped. */
	if (id >= q->num || !q->cookies[id]) {
		q->bad_used++;
		return vdrv_get(q, len);
	}
	cookie = q->cookies[id];
	q->cookies[id] = NULL;
	q->free_heads[q->nfree++] = (uint16_t)id;
	return cookie;
}

void vdrv_disable_cb(struct vdrv_queue *q)
{
	if (q->packed) {
		vdrv__packed_disable_cb(q);
		return;
	}
	/* Without EVENT_IDX the flag is the only way; with it the device
	 * interrupts at most once when it passes used_event, which we stop
	 * advancing. */
	if (!q->event_idx) {
		WRITE_ONCE(q->avail->flags, VRING_AVAIL_F_NO_INTERRUPT);
		if (q->d->log)
			log_u16(q, &q->avail->flags);
	}
}

bool vdrv_enable_cb(struct vdrv_queue *q)
{
	bool more;

	if (q->packed)
		return vdrv__packed_enable_cb(q);
	if (q->event_idx)
		WRITE_ONCE(*q->used_event, q->last_used);
	else
		WRITE_ONCE(q->avail->flags, 0);
	/* Pairs with the device's full barrier between publishing used->idx
	 * and reading used_event (vq_should_notify). */
	smp_mb();
	more = READ_ONCE(q->used->idx) != q->last_used;
	if (q->d->log)
		return log_enable_cb(q, more);
	return more;
}

/* What vdrv_poke() adds to the call eventfd: far above any count of the
 * device's calls between two reads, so a count read tells both apart. */
#define VDRV_POKE (1ull << 40)

/* A count read from the call eventfd: did the device call? */
static bool count_call(struct vdrv_queue *q, uint64_t v)
{
	if (!(v % VDRV_POKE))
		return false;
	q->calls++;
	return true;
}

int vdrv_wait(struct vdrv_queue *q, int timeout_ms)
{
	struct pollfd p = { .fd = q->call_fd, .events = POLLIN };
	int r = poll(&p, 1, timeout_ms);
	int64_t v;

	if (r < 0)
		return errno == EINTR ? 0 : -errno;
	if (r == 0)
		return 0;
	v = sys_eventfd_drain(q->call_fd);
	if (v > 0)
		count_call(q, (uint64_t)v);
	return 1;
}

int vdrv_wait_read(struct vdrv_queue *q)
{
	uint64_t v;
	ssize_t r;

	if (!q->call_blocking) {
		int fl = fcntl(q->call_fd, F_GETFL);

		if (fl < 0 || fcntl(q->call_fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
			return -errno;
		q->call_blocking = true;
	}
	r = sys_read(q->call_fd, &v, sizeof(v));
	if (r < 0)
		return (int)r;
	if (r != sizeof(v))
		return -EIO;
	return count_call(q, v) ? 1 : 0;
}

int vdrv_poke(struct vdrv_queue *q)
{
	uint64_t v = VDRV_POKE;
	ssize_t r = sys_write(q->call_fd, &v, sizeof(v));

	return r < 0 ? (int)r : 0;
}
