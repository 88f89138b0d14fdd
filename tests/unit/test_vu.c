/*
 * Description: the vhost-user server (vu_) against a scripted frontend on a
 * real unix socket: replies and acks, malformed messages (disconnect, fds
 * closed, next frontend served), ring start/stop and config space.
 *
 * The server runs on a loop thread; this thread is the frontend and talks
 * to it only over the socket.  The fake device's callbacks run on the loop
 * thread and record what they saw under fake.lock; a round trip (a reply
 * or an ack) orders them before the test reads the record.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#include "loop/loop.h"
#include "mem/gm.h"
#include "util/log.h"
#include "util/sock.h"
#include "vhost/vhost_user.h"
#include "vhost/vu.h"

/* Longer than the server's own 5 s receive timeout, so the stall case sees
 * the server give up before we do. */
#define CLIENT_TIMEOUT_S 10

#define FL	VHOST_USER_VERSION
#define FL_ACK	(VHOST_USER_VERSION | VHOST_USER_NEED_REPLY_MASK)
#define FL_REPLY (VHOST_USER_VERSION | VHOST_USER_REPLY_MASK)

#define GUEST_QVA	0x10000000ull
#define GUEST_SIZE	(1u << 20)
#define RING_NUM	8
#define STOP_AVAIL	42

#define DEV_FEATURES	(1ull << VIRTIO_F_VERSION_1 | 1ull << VIRTIO_RING_F_EVENT_IDX | \
			 1ull << VIRTIO_RING_F_INDIRECT_DESC | 1ull << 9 /* FLUSH */)
#define ALL_FEATURES	(DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES | \
			 1ull << VHOST_F_LOG_ALL)

/* ---- Fake device ---- */

struct fake_calls {
	unsigned nstart, nstop, nenable, nset_features, nset_config, nset_fds;
	unsigned nset_log, nclaim, nrelease;
	struct vq_log log;		/* from the last queue_set_log */
	bool claimed;
	bool refuse_claim;		/* set by the test: claim fails -EBUSY */
	bool needs_reset;		/* set by the test: a ring is broken */
	unsigned start_idx, stop_idx, enable_idx;
	struct vu_queue_setup setup;	/* from the last queue_start */
	uint64_t kick_value;		/* read from setup.kick_fd in queue_start */
	bool enabled;
	uint64_t features;		/* last set_features */
	uint64_t features_seen;		/* every set_features, ORed */
	uint32_t config_off, config_len;
	uint8_t config_byte;
};

static struct {
	pthread_mutex_t lock;
	struct fake_calls c;		/* loop thread writes, test reads */
} fake = { .lock = PTHREAD_MUTEX_INITIALIZER };

static uint8_t config_pattern(uint32_t off)
{
	return (uint8_t)(off * 7 + 0x31);
}

static uint64_t fake_features(void *dev)
{
	return DEV_FEATURES;
}

static unsigned fake_num_queues(void *dev)
{
	return 2;
}

static void fake_get_config(void *dev, uint32_t off, uint8_t *buf, uint32_t len)
{
	for (uint32_t i = 0; i < len; i++)
		buf[i] = config_pattern(off + i);
}

/* Only one writable byte, at 32 (virtio-blk's writeback). */
static int fake_set_config(void *dev, uint32_t off, const uint8_t *buf, uint32_t len)
{
	pthread_mutex_lock(&fake.lock);
	fake.c.nset_config++;
	fake.c.config_off = off;
	fake.c.config_len = len;
	fake.c.config_byte = len ? buf[0] : 0;
	pthread_mutex_unlock(&fake.lock);
	return off == 32 && len == 1 ? 0 : -EPERM;
}

static void fake_set_features(void *dev, uint64_t features)
{
	pthread_mutex_lock(&fake.lock);
	fake.c.nset_features++;
	fake.c.features = features;
	fake.c.features_seen |= features;
	pthread_mutex_unlock(&fake.lock);
}

static int fake_queue_start(void *dev, unsigned idx, const struct vu_queue_setup *s)
{
	uint64_t v = 0;

	/* The test wrote a known value into its kick eventfd: reading it back
	 * proves we were handed that very fd.  Signal call the same way. */
	if (read(s->kick_fd, &v, sizeof(v)) != sizeof(v))
		v = 0;
	if (s->call_fd >= 0)
		(void)!write(s->call_fd, &(uint64_t){ 1 }, sizeof(uint64_t));
	pthread_mutex_lock(&fake.lock);
	fake.c.nstart++;
	fake.c.start_idx = idx;
	fake.c.setup = *s;
	fake.c.kick_value = v;
	fake.c.enabled = s->enabled;
	pthread_mutex_unlock(&fake.lock);
	return 0;
}

static uint32_t fake_queue_stop(void *dev, unsigned idx)
{
	pthread_mutex_lock(&fake.lock);
	fake.c.nstop++;
	fake.c.stop_idx = idx;
	pthread_mutex_unlock(&fake.lock);
	return STOP_AVAIL;
}

static void fake_queue_set_fds(void *dev, unsigned idx, int call_fd, int err_fd)
{
	pthread_mutex_lock(&fake.lock);
	fake.c.nset_fds++;
	pthread_mutex_unlock(&fake.lock);
}

static void fake_queue_set_enable(void *dev, unsigned idx, bool enabled)
{
	pthread_mutex_lock(&fake.lock);
	fake.c.nenable++;
	fake.c.enable_idx = idx;
	fake.c.enabled = enabled;
	pthread_mutex_unlock(&fake.lock);
}

static void fake_queue_set_log(void *dev, unsigned idx, const struct vq_log *lg)
{
	pthread_mutex_lock(&fake.lock);
	fake.c.nset_log++;
	fake.c.log = *lg;
	pthread_mutex_unlock(&fake.lock);
}

static int fake_claim(void *dev)
{
	int r = 0;

	pthread_mutex_lock(&fake.lock);
	fake.c.nclaim++;
	if (fake.c.refuse_claim)
		r = -EBUSY;
	else
		fake.c.claimed = true;
	pthread_mutex_unlock(&fake.lock);
	return r;
}

static void fake_release(void *dev)
{
	pthread_mutex_lock(&fake.lock);
	fake.c.nrelease++;
	fake.c.claimed = false;
	pthread_mutex_unlock(&fake.lock);
}

static bool fake_needs_reset(void *dev)
{
	bool r;

	pthread_mutex_lock(&fake.lock);
	r = fake.c.needs_reset;
	pthread_mutex_unlock(&fake.lock);
	return r;
}

static void fake_set_needs_reset(bool v)
{
	pthread_mutex_lock(&fake.lock);
	fake.c.needs_reset = v;
	pthread_mutex_unlock(&fake.lock);
}

static const struct vu_dev_ops fake_ops = {
	.features = fake_features,
	.num_queues = fake_num_queues,
	.get_config = fake_get_config,
	.set_config = fake_set_config,
	.set_features = fake_set_features,
	.queue_start = fake_queue_start,
	.queue_stop = fake_queue_stop,
	.queue_set_fds = fake_queue_set_fds,
	.queue_set_enable = fake_queue_set_enable,
	.queue_set_log = fake_queue_set_log,
	.claim = fake_claim,
	.release = fake_release,
	.needs_reset = fake_needs_reset,
};

static struct fake_calls fake_get(void)
{
	struct fake_calls c;

	pthread_mutex_lock(&fake.lock);
	c = fake.c;
	pthread_mutex_unlock(&fake.lock);
	return c;
}

static void fake_reset(void)
{
	pthread_mutex_lock(&fake.lock);
	memset(&fake.c, 0, sizeof(fake.c));
	pthread_mutex_unlock(&fake.lock);
}

/* ---- Frontend side ---- */

static char sock_dir[] = "/tmp/test_vu.XXXXXX";
static char sock_path[108];
static struct loop *loop;
static struct vu_server *srv;

/* Send a header and len payload bytes (len may differ from h->size, to
 * lie about the size) with nfds fds, in one sendmsg. */
static void send_raw(int c, const struct vhost_user_hdr *h, const void *p, size_t len,
		     const int *fds, unsigned nfds)
{
	char cbuf[CMSG_SPACE(16 * sizeof(int))] = { 0 };
	struct iovec iov[2] = {
		{ (void *)h, sizeof(*h) },
		{ (void *)p, len },
	};
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = len ? 2 : 1 };
	ssize_t n;

	if (nfds > 16)
		T_FAIL("send_raw: %u fds is more than the helper carries", nfds);
	(void)sock_msg_set_fds(&mh, cbuf, sizeof(cbuf), fds, nfds);
	n = sendmsg(c, &mh, MSG_NOSIGNAL);
	if (n != (ssize_t)(sizeof(*h) + len))
		T_FAIL("sendmsg of request %u: %zd (%s)", h->request, n,
		       n < 0 ? strerror(errno) : "short");
}

static void send_msg(int c, uint32_t req, uint32_t flags, const void *p, uint32_t size,
		     const int *fds, unsigned nfds)
{
	struct vhost_user_hdr h = { .request = req, .flags = flags, .size = size };

	send_raw(c, &h, p, size, fds, nfds);
}

static void recv_all(int c, void *buf, size_t len, const char *what)
{
	ssize_t n = recv(c, buf, len, MSG_WAITALL);

	if (n < 0)
		T_FAIL("no %s within %d s: %s", what, CLIENT_TIMEOUT_S, strerror(errno));
	if (n != (ssize_t)len)
		T_FAIL("%s: got %zd of %zu bytes (server disconnected?)", what, n, len);
}

/* Read one reply to req; checks the header and returns the payload size. */
static uint32_t recv_reply(int c, uint32_t req, void *p, size_t max)
{
	struct vhost_user_hdr h;

	recv_all(c, &h, sizeof(h), "reply header");
	ASSERT_EQ(h.request, req);
	ASSERT_EQ(h.flags, FL_REPLY);
	if (h.size > max)
		T_FAIL("reply to %u has %u bytes, expected at most %zu", req, h.size, max);
	recv_all(c, p, h.size, "reply payload");
	return h.size;
}

static uint64_t get_u64(int c, uint32_t req)
{
	uint64_t v = 0;

	send_msg(c, req, FL, NULL, 0, NULL, 0);
	ASSERT_EQ(recv_reply(c, req, &v, sizeof(v)), sizeof(v));
	return v;
}

/* Send with need_reply; returns the ack (0 success). */
static uint64_t send_acked(int c, uint32_t req, const void *p, uint32_t size,
			   const int *fds, unsigned nfds)
{
	uint64_t ack = 0xdead;

	send_msg(c, req, FL_ACK, p, size, fds, nfds);
	ASSERT_EQ(recv_reply(c, req, &ack, sizeof(ack)), sizeof(ack));
	return ack;
}

static void send_u64(int c, uint32_t req, uint64_t v, const int *fds, unsigned nfds)
{
	send_msg(c, req, FL, &v, sizeof(v), fds, nfds);
}

static void send_state(int c, uint32_t req, uint32_t index, uint32_t num)
{
	struct vhost_vring_state st = { index, num };

	send_msg(c, req, FL, &st, sizeof(st), NULL, 0);
}

/* A GET_FEATURES round trip: everything sent before has been handled. */
static void barrier(int c)
{
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_FEATURES), ALL_FEATURES);
}

/* Connect and wait until we are the frontend being served: the previous
 * one is then fully disconnected and its device calls are over. */
static int conn_open_at(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = CLIENT_TIMEOUT_S };
	int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_TRUE(c >= 0);
	strcpy(sa.sun_path, path);
	if (connect(c, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		T_FAIL("connect %s: %s", path, strerror(errno));
	ASSERT_EQ(setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	ASSERT_EQ(setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
	barrier(c);
	return c;
}

static int conn_open(void)
{
	return conn_open_at(sock_path);
}

/* The server dropped us: EOF, not a reply and not a timeout. */
static void expect_disconnect(int c)
{
	char b;
	ssize_t n = recv(c, &b, 1, 0);

	if (n < 0)
		T_FAIL("expected EOF from the server, recv failed: %s", strerror(errno));
	ASSERT_EQ(n, 0);
	close(c);
}

/* The daemon keeps serving: a new frontend gets GET_FEATURES answered. */
static void expect_next_served(void)
{
	close(conn_open());
}

static void negotiate_reply_ack(int c)
{
	send_u64(c, VHOST_USER_SET_PROTOCOL_FEATURES,
		 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK, NULL, 0);
}

static int guest_memfd(size_t size)
{
	int fd = memfd_create("guest", MFD_CLOEXEC);

	ASSERT_TRUE(fd >= 0);
	ASSERT_EQ(ftruncate(fd, (off_t)size), 0);
	return fd;
}

static int test_eventfd(uint64_t initial)
{
	int fd = eventfd((unsigned)initial, EFD_CLOEXEC | EFD_NONBLOCK);

	ASSERT_TRUE(fd >= 0);
	return fd;
}

/* SET_MEM_TABLE with one region: gpa 0, GUEST_SIZE bytes at GUEST_QVA. */
static void send_mem_table(int c, int memfd, uint64_t mmap_offset, uint32_t flags)
{
	struct vhost_user_memory m = {
		.nregions = 1,
		.regions[0] = {
			.guest_phys_addr = 0,
			.memory_size = GUEST_SIZE,
			.userspace_addr = GUEST_QVA,
			.mmap_offset = mmap_offset,
		},
	};

	send_msg(c, VHOST_USER_SET_MEM_TABLE, flags, &m,
		 offsetof(struct vhost_user_memory, regions) + sizeof(m.regions[0]),
		 &memfd, 1);
}

static struct vhost_vring_addr ring_addr(unsigned idx, uint64_t base)
{
	struct vhost_vring_addr a = {
		.index = idx,
		.desc_user_addr = base,
		.avail_user_addr = base + 0x1000,
		.used_user_addr = base + 0x2000,
	};

	return a;
}

/* Open fds in this process (the server runs in it too).  Counted while
 * connected, since only then do we know the server's state: once the
 * server drops us, our socket and its end are gone, nothing else. */
#define CONN_FDS 2

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- Replies ---- */

/* GET_FEATURES: device bits plus PROTOCOL_FEATURES and LOG_ALL, reply
 * flags, size 8. */
static void test_get_features_reply(void)
{
	int c = conn_open();
	uint64_t v = 0;

	send_msg(c, VHOST_USER_GET_FEATURES, FL, NULL, 0, NULL, 0);
	ASSERT_EQ(recv_reply(c, VHOST_USER_GET_FEATURES, &v, sizeof(v)), 8);
	ASSERT_EQ(v, ALL_FEATURES);
	close(c);
}

/* GET_PROTOCOL_FEATURES, GET_QUEUE_NUM and GET_MAX_MEM_SLOTS values. */
static void test_get_protocol_features_queue_num_mem_slots(void)
{
	int c = conn_open();

	ASSERT_EQ(get_u64(c, VHOST_USER_GET_PROTOCOL_FEATURES),
		  1ull << VHOST_USER_PROTOCOL_F_MQ |
		  1ull << VHOST_USER_PROTOCOL_F_LOG_SHMFD |
		  1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK |
		  1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ |
		  1ull << VHOST_USER_PROTOCOL_F_CONFIG |
		  1ull << VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS |
		  1ull << VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD |
		  1ull << VHOST_USER_PROTOCOL_F_RESET_DEVICE |
		  1ull << VHOST_USER_PROTOCOL_F_STATUS);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_QUEUE_NUM), 2);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_MAX_MEM_SLOTS), GM_MAX_REGIONS);
	close(c);
}

/* ---- REPLY_ACK ---- */

/* With REPLY_ACK, need_reply on a good message gets ack 0. */
static void test_reply_ack_success_is_zero(void)
{
	int c = conn_open();
	uint64_t f = DEV_FEATURES;

	negotiate_reply_ack(c);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0), 0);
	close(c);
}

/* Unknown request with need_reply: nonzero ack, connection stays up. */
static void test_unknown_request_nacked_connection_stays(void)
{
	int c = conn_open();

	negotiate_reply_ack(c);
	ASSERT_NE(send_acked(c, 200, NULL, 0, NULL, 0), 0);
	barrier(c);
	close(c);
}

/* Unknown request without need_reply: no reply at all, connection stays
 * up (the next reply we read is GET_FEATURES'). */
static void test_unknown_request_ignored_without_need_reply(void)
{
	int c = conn_open();
	uint64_t junk = 0x1234;

	negotiate_reply_ack(c);
	send_msg(c, 200, FL, &junk, sizeof(junk), NULL, 0);
	barrier(c);
	close(c);
}

/*
 * NEED_REPLY on every message, in one whole session (virtio-user.rst
 * "REPLY_ACK"; the reference backends: libvhost-user and DPDK answer
 * whenever the flag is set, rust-vmm once REPLY_ACK is acked, which it is
 * by the SET_PROTOCOL_FEATURES that carries it).  A frontend written from
 * the spec sets the flag on SET_PROTOCOL_FEATURES itself and waits for
 * the answer.  Every message type we handle plus an unknown one, in an
 * order a frontend may use: with the flag each gets exactly one reply (its
 * own, for those that have one, else an ack: 0, nonzero for the unknown
 * one), whether or not REPLY_ACK is among the protocol features; without
 * it only those with their own reply answer.  recv_reply checks the
 * request of each reply, so a missing or extra reply fails the next one,
 * and nothing may be left unread at the end.
 */
struct reply_case {
	uint32_t req;
	const void *p;
	uint32_t size;
	int fd;			/* -1: none */
	bool own;		/* answers with its own payload, asked or not */
	uint64_t ack;		/* the ack expected with NEED_REPLY */
};

static void replies_session(bool flag, bool reply_ack)
{
	/* Everything we offer, REPLY_ACK only if asked. */
	const uint64_t proto = (1ull << VHOST_USER_PROTOCOL_F_MQ |
				1ull << VHOST_USER_PROTOCOL_F_LOG_SHMFD |
				1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ |
				1ull << VHOST_USER_PROTOCOL_F_CONFIG |
				1ull << VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS |
				1ull << VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD |
				1ull << VHOST_USER_PROTOCOL_F_RESET_DEVICE |
				1ull << VHOST_USER_PROTOCOL_F_STATUS) |
			       (uint64_t)reply_ack << VHOST_USER_PROTOCOL_F_REPLY_ACK;
	const uint64_t feat = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES;
	const uint64_t idx0 = 0, status = 0x0b;
	const struct vhost_user_memory mem_table = {
		.nregions = 1,
		.regions[0] = { 0, GUEST_SIZE, GUEST_QVA, 0 },
	};
	/* A second region just above the first, added then removed. */
	const struct vhost_user_mem_reg reg = {
		.region = { GUEST_SIZE, GUEST_SIZE, GUEST_QVA + GUEST_SIZE, 0 },
	};
	const struct vhost_user_config get_cfg = { .offset = 0, .size = 8 };
	const struct vhost_user_config set_cfg = { .offset = 32, .size = 1, .region = { 1 } };
	const struct vhost_user_inflight inflight = { 1 << 20, 0, 1, RING_NUM, 0 };
	const struct vhost_user_log logd = { 4096, 0 };
	const struct vhost_vring_state num = { 0, RING_NUM }, base = { 0, 3 }, on = { 0, 1 };
	const struct vhost_vring_addr addr = ring_addr(0, GUEST_QVA);
	int mem = guest_memfd(GUEST_SIZE), mem2 = guest_memfd(GUEST_SIZE);
	int infl = guest_memfd(1 << 20), logm = guest_memfd(4096);
	int logfd = test_eventfd(0), call = test_eventfd(0), err = test_eventfd(0);
	int kick = test_eventfd(0), chan[2];
	const int made = socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan);
	const int fds[] = { mem, mem2, infl, logm, logfd, call, err, kick, chan[0], chan[1] };
	const struct reply_case cases[] = {
		{ VHOST_USER_GET_FEATURES, NULL, 0, -1, true, 0 },
		{ VHOST_USER_GET_PROTOCOL_FEATURES, NULL, 0, -1, true, 0 },
		{ VHOST_USER_SET_PROTOCOL_FEATURES, &proto, 8, -1, false, 0 },
		{ VHOST_USER_SET_OWNER, NULL, 0, -1, false, 0 },
		{ VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, chan[1], false, 0 },
		{ VHOST_USER_GET_QUEUE_NUM, NULL, 0, -1, true, 0 },
		{ VHOST_USER_GET_MAX_MEM_SLOTS, NULL, 0, -1, true, 0 },
		{ VHOST_USER_SET_FEATURES, &feat, 8, -1, false, 0 },
		{ VHOST_USER_SET_STATUS, &status, 8, -1, false, 0 },
		{ VHOST_USER_GET_STATUS, NULL, 0, -1, true, 0 },
		{ VHOST_USER_SET_MEM_TABLE, &mem_table,
		  offsetof(struct vhost_user_memory, regions) + sizeof(mem_table.regions[0]),
		  mem, false, 0 },
		{ VHOST_USER_ADD_MEM_REG, &reg, sizeof(reg), mem2, false, 0 },
		{ VHOST_USER_REM_MEM_REG, &reg, sizeof(reg), -1, false, 0 },
		{ VHOST_USER_GET_CONFIG, &get_cfg, VHOST_USER_CONFIG_HDR_SIZE + 8, -1, true, 0 },
		{ VHOST_USER_SET_CONFIG, &set_cfg, VHOST_USER_CONFIG_HDR_SIZE + 1, -1, false, 0 },
		{ VHOST_USER_GET_INFLIGHT_FD, &inflight, sizeof(inflight), -1, true, 0 },
		{ VHOST_USER_SET_INFLIGHT_FD, &inflight, sizeof(inflight), infl, false, 0 },
		{ VHOST_USER_SET_LOG_BASE, &logd, sizeof(logd), logm, true, 0 },
		{ VHOST_USER_SET_LOG_FD, NULL, 0, logfd, false, 0 },
		{ VHOST_USER_SET_VRING_NUM, &num, sizeof(num), -1, false, 0 },
		{ VHOST_USER_SET_VRING_ADDR, &addr, sizeof(addr), -1, false, 0 },
		{ VHOST_USER_SET_VRING_BASE, &base, sizeof(base), -1, false, 0 },
		{ VHOST_USER_SET_VRING_CALL, &idx0, 8, call, false, 0 },
		{ VHOST_USER_SET_VRING_ERR, &idx0, 8, err, false, 0 },
		{ VHOST_USER_SET_VRING_KICK, &idx0, 8, kick, false, 0 },
		{ VHOST_USER_SET_VRING_ENABLE, &on, sizeof(on), -1, false, 0 },
		{ VHOST_USER_GET_VRING_BASE, &base, sizeof(base), -1, true, 0 },
		{ VHOST_USER_RESET_OWNER, NULL, 0, -1, false, 0 },
		{ VHOST_USER_RESET_DEVICE, NULL, 0, -1, false, 0 },
		{ 200, NULL, 0, -1, false, 1 },
	};
	int c = conn_open();
	char buf[256], b;

	ASSERT_EQ(made, 0);
	fake_reset();
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		const struct reply_case *k = &cases[i];
		uint64_t ack = 0xdead;

		send_msg(c, k->req, flag ? FL_ACK : FL, k->p, k->size, &k->fd, k->fd >= 0);
		if (k->own) {
			(void)recv_reply(c, k->req, buf, sizeof(buf));
		} else if (flag) {
			ASSERT_EQ(recv_reply(c, k->req, &ack, sizeof(ack)), sizeof(ack));
			if (k->ack ? ack == 0 : ack != 0)
				T_FAIL("request %u: ack %llu, expected %s", k->req,
				       (unsigned long long)ack, k->ack ? "nonzero" : "0");
		}
	}
	/* Everything reached the device (the ring ran), and no reply is left. */
	ASSERT_EQ(fake_get().nstart, 1);
	ASSERT_EQ(fake_get().nstop, 1);
	barrier(c);
	ASSERT_EQ(recv(c, &b, 1, MSG_DONTWAIT), -1);
	ASSERT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK);
	close(c);
	for (size_t i = 0; i < ARRAY_SIZE(fds); i++)
		close(fds[i]);
}

static void test_need_reply_on_every_message(void)
{
	replies_session(true, true);
}

static void test_need_reply_answered_without_reply_ack(void)
{
	replies_session(true, false);
}

static void test_no_reply_unasked_on_every_message(void)
{
	replies_session(false, true);
}

/* ---- Device status and reset ---- */

static void ring_start(int c, unsigned idx, int kick);

#define PROTO_STATUS	(1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK | \
			 1ull << VHOST_USER_PROTOCOL_F_STATUS | \
			 1ull << VHOST_USER_PROTOCOL_F_RESET_DEVICE)

/* GET_STATUS answers what SET_STATUS set, plus NEEDS_RESET while the
 * device has a broken ring (never stored from the frontend); a value
 * wider than a byte is refused and the connection stays. */
static void test_status_set_get_needs_reset(void)
{
	uint64_t v = 0;
	int c = conn_open();

	fake_reset();
	send_u64(c, VHOST_USER_SET_PROTOCOL_FEATURES, PROTO_STATUS, NULL, 0);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_STATUS), 0);
	v = 0x0f;
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_STATUS, &v, 8, NULL, 0), 0);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_STATUS), 0x0f);
	fake_set_needs_reset(true);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_STATUS), 0x4f);
	v = 0x4b;			/* the frontend echoes NEEDS_RESET back */
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_STATUS, &v, 8, NULL, 0), 0);
	fake_set_needs_reset(false);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_STATUS), 0x0b);
	v = 0x10f;
	ASSERT_NE(send_acked(c, VHOST_USER_SET_STATUS, &v, 8, NULL, 0), 0);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_STATUS), 0x0b);
	/* Status 0 stops no ring: that is GET_VRING_BASE's job. */
	v = 0;
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_STATUS, &v, 8, NULL, 0), 0);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_STATUS), 0);
	close(c);
}

/* RESET_DEVICE with a ring running: the ring is stopped through the
 * device (its requests drained), features and status are back to 0, the
 * disk released, and the same connection can start the ring again. */
static void test_reset_device_stops_rings_and_restarts(void)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES, v = 0x0f;
	int c = conn_open(), mem = guest_memfd(GUEST_SIZE), kick = test_eventfd(1);
	struct fake_calls r;

	fake_reset();
	send_u64(c, VHOST_USER_SET_PROTOCOL_FEATURES, PROTO_STATUS, NULL, 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	send_mem_table(c, mem, 0, FL_ACK);
	ASSERT_EQ(recv_reply(c, VHOST_USER_SET_MEM_TABLE, &v, sizeof(v)), 8);
	v = 0x0f;
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_STATUS, &v, 8, NULL, 0), 0);
	ring_start(c, 0, kick);
	r = fake_get();
	ASSERT_EQ(r.nstart, 1);
	ASSERT_TRUE(r.claimed);

	ASSERT_EQ(send_acked(c, VHOST_USER_RESET_DEVICE, NULL, 0, NULL, 0), 0);
	r = fake_get();
	ASSERT_EQ(r.nstop, 1);
	ASSERT_EQ(r.features, 0);
	ASSERT_TRUE(!r.claimed);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_STATUS), 0);

	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	ring_start(c, 0, kick);
	ASSERT_EQ(fake_get().nstart, 2);
	close(c);
	close(mem);
	close(kick);
}

/* ---- The backend channel ---- */

struct cc_call {
	int ret;
};

static void do_config_changed(void *arg)
{
	((struct cc_call *)arg)->ret = vu_server_config_changed(srv);
}

static int config_changed(void)
{
	struct cc_call cc = { -1 };

	loop_call_sync(loop, do_config_changed, &cc);
	return cc.ret;
}

/* A config change goes out as CONFIG_CHANGE_MSG on the channel the
 * frontend gave us (no payload, no NEED_REPLY: we never wait for the
 * frontend); without CONFIG negotiated, or without a channel, nothing is
 * sent and the caller hears 0. */
static void test_config_change_on_backend_channel(void)
{
	int c = conn_open(), chan[2];
	struct vhost_user_hdr h;
	uint64_t proto = 1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ;
	char b;

	ASSERT_EQ(config_changed(), 0);			/* no channel yet */
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan), 0);
	send_u64(c, VHOST_USER_SET_PROTOCOL_FEATURES, proto, NULL, 0);
	send_msg(c, VHOST_USER_SET_BACKEND_REQ_FD, FL, NULL, 0, &chan[1], 1);
	close(chan[1]);
	barrier(c);
	ASSERT_EQ(config_changed(), 0);			/* CONFIG not negotiated */
	ASSERT_EQ(recv(chan[0], &b, 1, MSG_DONTWAIT), -1);
	proto |= 1ull << VHOST_USER_PROTOCOL_F_CONFIG;
	send_u64(c, VHOST_USER_SET_PROTOCOL_FEATURES, proto, NULL, 0);
	barrier(c);
	ASSERT_EQ(config_changed(), 1);
	ASSERT_EQ(recv(chan[0], &h, sizeof(h), MSG_WAITALL), (ssize_t)sizeof(h));
	ASSERT_EQ(h.request, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG);
	ASSERT_EQ(h.flags, FL);
	ASSERT_EQ(h.size, 0);
	close(c);
	/* The channel goes with the connection. */
	expect_next_served();
	ASSERT_EQ(config_changed(), 0);
	ASSERT_EQ(recv(chan[0], &b, 1, 0), 0);		/* closed by the server */
	close(chan[0]);
}

/* ---- Malformed messages: disconnect, then serve the next frontend ---- */

/* SET_FEATURES with a 4-byte payload. */
static void test_set_features_short_payload_disconnects(void)
{
	int c = conn_open();
	uint32_t v = 1;

	send_msg(c, VHOST_USER_SET_FEATURES, FL, &v, sizeof(v), NULL, 0);
	expect_disconnect(c);
	expect_next_served();
}

/* A header announcing 4096 payload bytes (more than any message) is
 * refused before the payload is read, so we send none. */
static void test_oversized_payload_disconnects(void)
{
	struct vhost_user_hdr h = { VHOST_USER_SET_FEATURES, FL, 4096 };
	int c = conn_open();

	send_raw(c, &h, NULL, 0, NULL, 0);
	expect_disconnect(c);
	expect_next_served();
}

/* Version bits other than 1 in flags. */
static void test_bad_version_disconnects(void)
{
	static const uint32_t flags[] = { 0, 2, 3, VHOST_USER_REPLY_MASK };

	for (unsigned i = 0; i < ARRAY_SIZE(flags); i++) {
		int c = conn_open();

		send_msg(c, VHOST_USER_GET_FEATURES, flags[i], NULL, 0, NULL, 0);
		expect_disconnect(c);
	}
	expect_next_served();
}

/* SET_VRING_NUM with 0, a non-power of two, and more than 32768. */
static void test_vring_num_out_of_range_disconnects(void)
{
	static const uint32_t nums[] = { 0, 3, 65536 };

	for (unsigned i = 0; i < ARRAY_SIZE(nums); i++) {
		int c = conn_open();

		send_state(c, VHOST_USER_SET_VRING_NUM, 0, nums[i]);
		expect_disconnect(c);
	}
	expect_next_served();
}

/* SET_VRING_NUM on ring 2 of a 2-ring device (and a huge index). */
static void test_vring_index_out_of_range_disconnects(void)
{
	static const uint32_t idx[] = { 2, 0xffffffff };

	for (unsigned i = 0; i < ARRAY_SIZE(idx); i++) {
		int c = conn_open();

		send_state(c, VHOST_USER_SET_VRING_NUM, idx[i], RING_NUM);
		expect_disconnect(c);
	}
	expect_next_served();
}

/* SET_VRING_KICK with an fd and the NOFD bit. */
static void test_vring_kick_fd_with_nofd_disconnects(void)
{
	int c = conn_open();
	int kick = test_eventfd(0);

	send_u64(c, VHOST_USER_SET_VRING_KICK, VHOST_USER_VRING_NOFD_MASK, &kick, 1);
	close(kick);
	expect_disconnect(c);
	expect_next_served();
}

/* SET_VRING_KICK with neither an fd nor the NOFD bit. */
static void test_vring_kick_no_fd_without_nofd_disconnects(void)
{
	int c = conn_open();

	send_u64(c, VHOST_USER_SET_VRING_KICK, 0, NULL, 0);
	expect_disconnect(c);
	expect_next_served();
}

/* The ring and log fds are read and written by iothreads that must never
 * block: a pipe (whose reader would stop reading) is not taken, for any of
 * the four messages; a blocking eventfd is taken and made non-blocking
 * (the flag belongs to the file both ends share, so we see it here). */
static void test_notify_fd_must_be_eventfd(void)
{
	static const uint32_t reqs[] = { VHOST_USER_SET_VRING_KICK, VHOST_USER_SET_VRING_CALL,
					 VHOST_USER_SET_VRING_ERR, VHOST_USER_SET_LOG_FD };

	for (unsigned i = 0; i < ARRAY_SIZE(reqs); i++) {
		int c = conn_open(), p[2];

		ASSERT_EQ(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
		if (reqs[i] == VHOST_USER_SET_LOG_FD)	/* no payload */
			send_msg(c, reqs[i], FL, NULL, 0, &p[1], 1);
		else
			send_u64(c, reqs[i], 0, &p[1], 1);
		expect_disconnect(c);
		close(p[0]);
		close(p[1]);
	}
	for (unsigned i = 1; i < ARRAY_SIZE(reqs); i++) {
		int c = conn_open(), ev = eventfd(0, EFD_CLOEXEC);
		uint64_t ring0 = 0;

		ASSERT_TRUE(ev >= 0);
		ASSERT_EQ(fcntl(ev, F_GETFL) & O_NONBLOCK, 0);
		negotiate_reply_ack(c);
		ASSERT_EQ(send_acked(c, reqs[i], &ring0,
				     reqs[i] == VHOST_USER_SET_LOG_FD ? 0 : 8, &ev, 1), 0);
		ASSERT_EQ(fcntl(ev, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
		close(ev);
		close(c);
	}
	expect_next_served();
}

/* SET_MEM_TABLE with 2 regions but 1 fd. */
static void test_mem_table_fd_count_mismatch_disconnects(void)
{
	struct vhost_user_memory m = {
		.nregions = 2,
		.regions = {
			{ 0, GUEST_SIZE, GUEST_QVA, 0 },
			{ GUEST_SIZE, GUEST_SIZE, GUEST_QVA + GUEST_SIZE, GUEST_SIZE },
		},
	};
	int c = conn_open();
	int fd = guest_memfd(2 * GUEST_SIZE);

	send_msg(c, VHOST_USER_SET_MEM_TABLE, FL, &m,
		 offsetof(struct vhost_user_memory, regions) + 2 * sizeof(m.regions[0]),
		 &fd, 1);
	close(fd);
	expect_disconnect(c);
	expect_next_served();
}

/* SET_MEM_TABLE claiming 9 regions (the limit is 8), with a full 8-region
 * payload and 8 fds so only the count is wrong. */
static void test_mem_table_nine_regions_disconnects(void)
{
	struct vhost_user_memory m = { .nregions = 9 };
	int fds[8];
	int c = conn_open();

	for (unsigned i = 0; i < 8; i++) {
		m.regions[i] = (struct vhost_user_mem_region){
			i * GUEST_SIZE, GUEST_SIZE, GUEST_QVA + i * GUEST_SIZE, 0 };
		fds[i] = guest_memfd(GUEST_SIZE);
	}
	send_msg(c, VHOST_USER_SET_MEM_TABLE, FL, &m, sizeof(m), fds, 8);
	for (unsigned i = 0; i < 8; i++)
		close(fds[i]);
	expect_disconnect(c);
	expect_next_served();
}

/* A region whose memfd is shorter than mmap_offset + memory_size (a
 * mapping that would SIGBUS). */
static void test_mem_table_region_beyond_memfd_disconnects(void)
{
	int c = conn_open();
	int fd = guest_memfd(GUEST_SIZE);

	send_mem_table(c, fd, 4096, FL);
	close(fd);
	expect_disconnect(c);
	expect_next_served();
}

/* SET_FEATURES acking a bit that was not offered (ACCESS_PLATFORM). */
static void test_set_features_unoffered_bit_disconnects(void)
{
	int c = conn_open();

	fake_reset();
	send_u64(c, VHOST_USER_SET_FEATURES, DEV_FEATURES | 1ull << 33, NULL, 0);
	expect_disconnect(c);
	expect_next_served();
	/* The bad ack never reached the device. */
	ASSERT_EQ(fake_get().features_seen, 0);
}

/* GET_CONFIG with offset + size past 256 (and one that would wrap). */
static void test_get_config_past_end_disconnects(void)
{
	static const uint32_t off[] = { 250, 0xfffffff8 };

	for (unsigned i = 0; i < ARRAY_SIZE(off); i++) {
		struct vhost_user_config cfg = { .offset = off[i], .size = 10 };
		int c = conn_open();

		send_msg(c, VHOST_USER_GET_CONFIG, FL, &cfg,
			 VHOST_USER_CONFIG_HDR_SIZE + cfg.size, NULL, 0);
		expect_disconnect(c);
	}
	expect_next_served();
}

/* GET_CONFIG whose hdr.size is not 12 + size. */
static void test_get_config_size_mismatch_disconnects(void)
{
	struct vhost_user_config cfg = { .offset = 0, .size = 60 };
	int c = conn_open();

	send_msg(c, VHOST_USER_GET_CONFIG, FL, &cfg, VHOST_USER_CONFIG_HDR_SIZE + 8,
		 NULL, 0);
	expect_disconnect(c);
	expect_next_served();
}

/* Valid memory table and ring size, then ring addresses outside it. */
static void test_vring_addr_outside_memory_disconnects(void)
{
	int c = conn_open();
	int fd = guest_memfd(GUEST_SIZE);
	struct vhost_vring_addr a = ring_addr(0, GUEST_QVA + 2 * GUEST_SIZE);

	send_mem_table(c, fd, 0, FL);
	close(fd);
	send_state(c, VHOST_USER_SET_VRING_NUM, 0, RING_NUM);
	barrier(c);	/* both accepted: the address is what gets us dropped */
	send_msg(c, VHOST_USER_SET_VRING_ADDR, FL, &a, sizeof(a), NULL, 0);
	expect_disconnect(c);
	expect_next_served();
}

/* Same, with the descriptor table straddling the end of the region: the
 * whole range is checked, not just its start. */
static void test_vring_addr_straddling_region_end_disconnects(void)
{
	int c = conn_open();
	int fd = guest_memfd(GUEST_SIZE);
	struct vhost_vring_addr a = ring_addr(0, GUEST_QVA);

	a.desc_user_addr = GUEST_QVA + GUEST_SIZE - 64;	/* table is 128 bytes */
	send_mem_table(c, fd, 0, FL);
	close(fd);
	send_state(c, VHOST_USER_SET_VRING_NUM, 0, RING_NUM);
	barrier(c);	/* both accepted */
	send_msg(c, VHOST_USER_SET_VRING_ADDR, FL, &a, sizeof(a), NULL, 0);
	expect_disconnect(c);
	expect_next_served();
}

/* ---- Fds on malformed messages are closed by the server ---- */

/* GET_FEATURES carrying an fd: malformed, and the fd does not leak. */
static void test_extra_fd_closed_on_disconnect(void)
{
	int c = conn_open();
	unsigned before = t_count_fds();
	int fd = test_eventfd(0);

	send_msg(c, VHOST_USER_GET_FEATURES, FL, NULL, 0, &fd, 1);
	close(fd);
	expect_disconnect(c);
	ASSERT_EQ(t_count_fds(), before - CONN_FDS);
	expect_next_served();
}

/* An fd on a message refused while reading it (bad version) and more fds
 * than a message may carry (9 > 8): none leak. */
static void test_fds_closed_on_recv_errors(void)
{
	struct vhost_user_hdr h = { VHOST_USER_GET_FEATURES, 2, 0 };
	int fds[9];
	int c = conn_open();
	unsigned before = t_count_fds();

	fds[0] = test_eventfd(0);
	send_raw(c, &h, NULL, 0, fds, 1);
	close(fds[0]);
	expect_disconnect(c);
	ASSERT_EQ(t_count_fds(), before - CONN_FDS);

	c = conn_open();
	before = t_count_fds();
	for (unsigned i = 0; i < 9; i++)
		fds[i] = test_eventfd(0);
	send_msg(c, VHOST_USER_GET_FEATURES, FL, NULL, 0, fds, 9);
	for (unsigned i = 0; i < 9; i++)
		close(fds[i]);
	expect_disconnect(c);
	ASSERT_EQ(t_count_fds(), before - CONN_FDS);
	expect_next_served();
}

/* ---- Ring start and stop ---- */

/* Full setup starts the ring once with what was sent; ENABLE and
 * GET_VRING_BASE reach the device; the base comes from queue_stop. */
static void test_ring_start_enable_stop(void)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES;
	struct vhost_vring_addr a = ring_addr(0, GUEST_QVA);
	struct vhost_vring_state st = { 0, 0 };
	int c = conn_open();
	int mem = guest_memfd(GUEST_SIZE);
	int call = test_eventfd(0), kick = test_eventfd(7);
	uint64_t v = 0, ring0 = 0;
	struct fake_calls r;

	fake_reset();
	negotiate_reply_ack(c);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	r = fake_get();
	ASSERT_EQ(r.nset_features, 1);
	ASSERT_EQ(r.features, DEV_FEATURES);

	send_mem_table(c, mem, 0, FL_ACK);
	ASSERT_EQ(recv_reply(c, VHOST_USER_SET_MEM_TABLE, &v, sizeof(v)), 8);
	ASSERT_EQ(v, 0);
	st = (struct vhost_vring_state){ 0, RING_NUM };
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), NULL, 0), 0);
	st = (struct vhost_vring_state){ 0, 5 };
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_BASE, &st, sizeof(st), NULL, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_CALL, &ring0, 8, &call, 1), 0);
	ASSERT_EQ(fake_get().nstart, 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_KICK, &ring0, 8, &kick, 1), 0);

	r = fake_get();
	ASSERT_EQ(r.nstart, 1);
	ASSERT_EQ(r.start_idx, 0);
	ASSERT_EQ(r.setup.cfg.index, 0);
	ASSERT_EQ(r.setup.cfg.num, RING_NUM);
	ASSERT_EQ(r.setup.cfg.last_avail_idx, 5);
	ASSERT_EQ(r.setup.cfg.desc_qva, a.desc_user_addr);
	ASSERT_EQ(r.setup.cfg.avail_qva, a.avail_user_addr);
	ASSERT_EQ(r.setup.cfg.used_qva, a.used_user_addr);
	ASSERT_TRUE(r.setup.cfg.event_idx);
	ASSERT_TRUE(r.setup.cfg.indirect);
	ASSERT_TRUE(r.setup.mem != NULL);
	ASSERT_TRUE(r.setup.kick_fd >= 0);
	ASSERT_TRUE(r.setup.call_fd >= 0);
	ASSERT_EQ(r.setup.err_fd, -1);
	ASSERT_EQ(r.kick_value, 7);		/* our kick eventfd */
	ASSERT_EQ(r.setup.enabled, false);	/* no SET_VRING_ENABLE yet */
	ASSERT_EQ(r.setup.features, f);
	ASSERT_EQ(read(call, &v, sizeof(v)), sizeof(v));	/* our call eventfd */
	ASSERT_EQ(v, 1);

	st = (struct vhost_vring_state){ 0, 1 };
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_ENABLE, &st, sizeof(st), NULL, 0), 0);
	r = fake_get();
	ASSERT_EQ(r.nenable, 1);
	ASSERT_EQ(r.enable_idx, 0);
	ASSERT_TRUE(r.enabled);
	ASSERT_EQ(r.nstop, 0);

	st = (struct vhost_vring_state){ 0, 0 };
	send_msg(c, VHOST_USER_GET_VRING_BASE, FL, &st, sizeof(st), NULL, 0);
	ASSERT_EQ(recv_reply(c, VHOST_USER_GET_VRING_BASE, &st, sizeof(st)), sizeof(st));
	ASSERT_EQ(st.index, 0);
	ASSERT_EQ(st.num, STOP_AVAIL);
	r = fake_get();
	ASSERT_EQ(r.nstop, 1);
	ASSERT_EQ(r.stop_idx, 0);
	ASSERT_EQ(r.nstart, 1);

	close(c);
	close(mem);
	close(call);
	close(kick);
}

/* ---- Dirty logging and the disk claim ("Migration") ---- */

#define PROTO_LOG	(1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK | \
			 1ull << VHOST_USER_PROTOCOL_F_LOG_SHMFD)
#define F_LOG_ALL	(1ull << VHOST_F_LOG_ALL)

/* Features, protocol features (REPLY_ACK + LOG_SHMFD), memory table. */
static void log_session(int c, int mem, uint64_t f)
{
	uint64_t v = 0;

	send_u64(c, VHOST_USER_SET_PROTOCOL_FEATURES, PROTO_LOG, NULL, 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	send_mem_table(c, mem, 0, FL_ACK);
	ASSERT_EQ(recv_reply(c, VHOST_USER_SET_MEM_TABLE, &v, sizeof(v)), 8);
	ASSERT_EQ(v, 0);
}

/* Ring idx at its own 16 KiB of guest memory, started with kick. */
static void ring_start(int c, unsigned idx, int kick)
{
	struct vhost_vring_addr a = ring_addr(idx, GUEST_QVA + idx * 0x4000);
	struct vhost_vring_state st = { idx, RING_NUM };
	uint64_t u = idx;

	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), NULL, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_KICK, &u, 8, &kick, 1), 0);
}

static uint16_t ring_stop(int c, unsigned idx)
{
	struct vhost_vring_state st = { idx, 0 };

	send_msg(c, VHOST_USER_GET_VRING_BASE, FL, &st, sizeof(st), NULL, 0);
	ASSERT_EQ(recv_reply(c, VHOST_USER_GET_VRING_BASE, &st, sizeof(st)), sizeof(st));
	return (uint16_t)st.num;
}

/* SET_LOG_BASE: the spec's mandatory reply with LOG_SHMFD (no
 * need_reply); returns its u64 (0 success). */
static uint64_t set_log_base(int c, int fd, uint64_t size, uint64_t offset)
{
	struct vhost_user_log l = { size, offset };
	uint64_t v = 0xdead;

	send_msg(c, VHOST_USER_SET_LOG_BASE, FL, &l, sizeof(l), &fd, 1);
	ASSERT_EQ(recv_reply(c, VHOST_USER_SET_LOG_BASE, &v, sizeof(v)), sizeof(v));
	return v;
}

/*
 * QEMU's order for a migration: SET_LOG_BASE, SET_FEATURES with LOG_ALL,
 * SET_VRING_ADDR with VHOST_VRING_F_LOG, all while the ring runs; then
 * off again.  Each change reaches the running ring in place (never a
 * stop/start: that would drain it), and the ring's log address is
 * log_guest_addr.
 */
static void test_logging_switches_on_a_running_ring(void)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES;
	int c = conn_open(), mem = guest_memfd(GUEST_SIZE), kick = test_eventfd(0);
	int logfd = guest_memfd(4096);
	struct vhost_vring_addr a = ring_addr(0, GUEST_QVA);
	struct fake_calls r;

	fake_reset();
	log_session(c, mem, f);
	ring_start(c, 0, kick);
	r = fake_get();
	ASSERT_EQ(r.nstart, 1);
	ASSERT_PTR_EQ(r.setup.cfg.log.log, NULL);

	ASSERT_EQ(set_log_base(c, logfd, 4096, 0), 0);
	r = fake_get();
	ASSERT_PTR_EQ(r.log.log, NULL);		/* mapped, not yet on */

	f |= F_LOG_ALL;
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	r = fake_get();
	ASSERT_TRUE(r.log.log != NULL);
	ASSERT_EQ(r.log.log->size, 4096);
	ASSERT_TRUE(!r.log.used);
	ASSERT_EQ(r.features, DEV_FEATURES);	/* LOG_ALL is vu's, not the device's */

	a.flags = 1u << VHOST_VRING_F_LOG;
	a.log_guest_addr = 0x123000;
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0), 0);
	r = fake_get();
	ASSERT_TRUE(r.log.used);
	ASSERT_EQ(r.log.used_gpa, 0x123000);

	f &= ~F_LOG_ALL;
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	ASSERT_PTR_EQ(fake_get().log.log, NULL);
	a.flags = 0;
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0), 0);
	r = fake_get();
	ASSERT_EQ(r.nstart, 1);
	ASSERT_EQ(r.nstop, 0);
	ASSERT_EQ(ring_stop(c, 0), STOP_AVAIL);
	close(c);
	close(mem);
	close(kick);
	close(logfd);
}

/* A new log replaces the old one on the running ring before the reply;
 * a ring started while logging is on starts logging. */
static void test_log_replaced_and_given_to_new_rings(void)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES;
	int c = conn_open(), mem = guest_memfd(GUEST_SIZE);
	int kick0 = test_eventfd(0), kick1 = test_eventfd(0);
	int log1 = guest_memfd(4096), log2 = guest_memfd(8192);
	struct fake_calls r;

	fake_reset();
	log_session(c, mem, f);
	ASSERT_EQ(set_log_base(c, log1, 4096, 0), 0);
	f |= F_LOG_ALL;
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	ring_start(c, 0, kick0);
	r = fake_get();
	ASSERT_TRUE(r.setup.cfg.log.log != NULL);
	ASSERT_EQ(r.setup.cfg.log.log->size, 4096);
	ASSERT_EQ(set_log_base(c, log2, 8192, 0), 0);
	r = fake_get();
	ASSERT_EQ(r.log.log->size, 8192);
	ring_start(c, 1, kick1);
	ASSERT_EQ(fake_get().setup.cfg.log.log->size, 8192);
	ring_stop(c, 0);
	ring_stop(c, 1);
	close(c);
	close(mem);
	close(kick0);
	close(kick1);
	close(log1);
	close(log2);
}

/* A log that cannot cover guest memory is refused where the frontend
 * asks for an answer: turning logging on is nacked (the connection
 * stays); a log the fd cannot hold is answered 1 and not installed. */
static void test_log_too_small_or_bad_refused(void)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES;
	int c = conn_open(), mem = guest_memfd(GUEST_SIZE), logfd = guest_memfd(4096);

	fake_reset();
	log_session(c, mem, f);
	/* 1 byte: 8 pages, 32 KiB of the 1 MiB of guest memory. */
	ASSERT_EQ(set_log_base(c, logfd, 1, 0), 0);
	f |= F_LOG_ALL;
	ASSERT_NE(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	/* Beyond the end of its file. */
	ASSERT_EQ(set_log_base(c, logfd, 4096, 4096), 1);
	ASSERT_EQ(set_log_base(c, logfd, 0, 0), 1);
	/* The 1-byte log is still the one in use; a good one fixes it. */
	ASSERT_EQ(set_log_base(c, logfd, 4096, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	close(c);
	close(mem);
	close(logfd);
	expect_next_served();
}

/* Without LOG_SHMFD there is no log we could map: nacked, not fatal.
 * LOG_ALL without any log is nacked too. */
static void test_log_base_without_shmfd_nacked(void)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES | F_LOG_ALL;
	int c = conn_open(), logfd = guest_memfd(4096);
	struct vhost_user_log l = { 4096, 0 };

	negotiate_reply_ack(c);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_LOG_BASE, &l, sizeof(l), &logfd, 1), 1);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 1);
	barrier(c);
	close(c);
	close(logfd);
}

/*
 * The disk is claimed before the first ring starts and released when the
 * last one stops for good (GET_VRING_BASE); a ring restarted on a new
 * kick fd or moved keeps the claim.
 */
static void test_claim_held_while_rings_run(void)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES;
	int c = conn_open(), mem = guest_memfd(GUEST_SIZE);
	int kick0 = test_eventfd(0), kick1 = test_eventfd(0), kick2 = test_eventfd(0);
	struct vhost_vring_addr moved = ring_addr(1, GUEST_QVA + 0x10000);
	struct fake_calls r;
	uint64_t u = 1;

	fake_reset();
	log_session(c, mem, f);
	ring_start(c, 0, kick0);
	ASSERT_EQ(fake_get().nclaim, 1);
	ASSERT_TRUE(fake_get().claimed);
	ring_start(c, 1, kick1);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_KICK, &u, 8, &kick2, 1), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_ADDR, &moved, sizeof(moved), NULL, 0), 0);
	r = fake_get();
	ASSERT_EQ(r.nstart, 4);
	ASSERT_EQ(r.nstop, 2);
	ASSERT_EQ(r.setup.cfg.desc_qva, moved.desc_user_addr);
	ring_stop(c, 0);
	ASSERT_EQ(fake_get().nrelease, 0);
	ring_stop(c, 1);
	r = fake_get();
	ASSERT_EQ(r.nrelease, 1);
	ASSERT_TRUE(!r.claimed);
	ASSERT_EQ(r.nclaim, 1);
	/* Started again (a migration that failed and resumed): claimed again. */
	ring_start(c, 0, kick0);
	ASSERT_EQ(fake_get().nclaim, 2);
	close(c);
	expect_next_served();		/* the disconnect released it */
	ASSERT_EQ(fake_get().nrelease, 2);
	close(mem);
	close(kick0);
	close(kick1);
	close(kick2);
}

/* Someone else writes the disk: the ring is not started, the frontend is
 * told (nack) and dropped; the next one is served. */
static void test_claim_refused_drops_frontend(void)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES;
	int c = conn_open(), mem = guest_memfd(GUEST_SIZE), kick = test_eventfd(0);
	struct vhost_vring_addr a = ring_addr(0, GUEST_QVA);
	struct vhost_vring_state st = { 0, RING_NUM };
	uint64_t u = 0;

	fake_reset();
	pthread_mutex_lock(&fake.lock);
	fake.c.refuse_claim = true;
	pthread_mutex_unlock(&fake.lock);
	log_session(c, mem, f);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), NULL, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_KICK, &u, 8, &kick, 1), 1);
	expect_disconnect(c);
	ASSERT_EQ(fake_get().nstart, 0);
	ASSERT_EQ(fake_get().nrelease, 0);
	fake_reset();
	expect_next_served();
	close(mem);
	close(kick);
}

/* ---- Config space ---- */

/* GET_CONFIG returns the device's bytes; SET_CONFIG is acked 0 for the
 * one writable byte and nacked otherwise, keeping the connection. */
static void test_config_get_and_set(void)
{
	struct vhost_user_config cfg = { .offset = 0, .size = 60 };
	uint8_t want[60];
	int c = conn_open();
	struct fake_calls r;

	send_msg(c, VHOST_USER_GET_CONFIG, FL, &cfg, VHOST_USER_CONFIG_HDR_SIZE + 60, NULL, 0);
	memset(&cfg, 0, sizeof(cfg));
	ASSERT_EQ(recv_reply(c, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg)),
		  VHOST_USER_CONFIG_HDR_SIZE + 60);
	ASSERT_EQ(cfg.offset, 0);
	ASSERT_EQ(cfg.size, 60);
	for (uint32_t i = 0; i < 60; i++)
		want[i] = config_pattern(i);
	ASSERT_MEM_EQ(cfg.region, want, 60);

	fake_reset();
	negotiate_reply_ack(c);
	cfg = (struct vhost_user_config){ .offset = 32, .size = 1, .region = { 1 } };
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_CONFIG, &cfg, VHOST_USER_CONFIG_HDR_SIZE + 1,
			     NULL, 0), 0);
	r = fake_get();
	ASSERT_EQ(r.nset_config, 1);
	ASSERT_EQ(r.config_off, 32);
	ASSERT_EQ(r.config_len, 1);
	ASSERT_EQ(r.config_byte, 1);

	cfg = (struct vhost_user_config){ .offset = 0, .size = 8 };
	ASSERT_NE(send_acked(c, VHOST_USER_SET_CONFIG, &cfg, VHOST_USER_CONFIG_HDR_SIZE + 8,
			     NULL, 0), 0);
	ASSERT_EQ(fake_get().nset_config, 2);
	barrier(c);
	close(c);
}

/* ---- Stalled frontend ---- */

/* A header promising 8 payload bytes that never come: the server gives up
 * after its 5 s receive timeout and serves the next frontend. */
static void test_stalled_payload_times_out(void)
{
	struct vhost_user_hdr h = { VHOST_USER_SET_FEATURES, FL, 8 };
	int c = conn_open();
	double t0 = now_s(), dt;

	send_raw(c, &h, NULL, 0, NULL, 0);
	expect_disconnect(c);
	dt = now_s() - t0;
	if (dt < 4.0 || dt > 8.0)
		T_FAIL("server dropped the stalled frontend after %.1f s, want ~5 s", dt);
	expect_next_served();
}

/* Regression: the 5 s limit covers the whole message; a header trickled
 * in over 4 s followed by a stall once bought another 5 s for the payload. */
static void test_message_deadline_covers_header_and_payload(void)
{
	struct vhost_user_hdr h = { VHOST_USER_SET_FEATURES, FL, 8 };
	int c = conn_open();
	double t0 = now_s(), dt;

	ASSERT_EQ(send(c, &h, 1, MSG_NOSIGNAL), 1);
	sleep(4);
	ASSERT_EQ(send(c, (char *)&h + 1, sizeof(h) - 1, MSG_NOSIGNAL), sizeof(h) - 1);
	expect_disconnect(c);
	dt = now_s() - t0;
	if (dt > 7.0)
		T_FAIL("server waited %.1f s for one message, want ~5 s", dt);
	expect_next_served();
}

/*
 * Regression: a frontend that sends requests but never reads the replies
 * must not wedge the loop thread (vu__send() once blocked in sendmsg with no
 * timeout, so the main loop, and with it SIGTERM handling, stopped until
 * the frontend went away).
 */
struct probe {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
};

static void probe_noop(void *arg)
{
}

static void *probe_main(void *arg)
{
	struct probe *p = arg;

	loop_call_sync(loop, probe_noop, NULL);
	pthread_mutex_lock(&p->lock);
	p->done = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void test_unread_replies_do_not_block_loop(void)
{
	struct probe p = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false };
	struct vhost_user_hdr h = { VHOST_USER_GET_FEATURES, FL, 0 };
	struct timeval tv = { .tv_sec = 1 };
	struct timespec until;
	pthread_t th;
	int c = conn_open();
	bool responsive;

	ASSERT_EQ(setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
	for (unsigned i = 0; i < 100000; i++)
		if (sendmsg(c, &(struct msghdr){ .msg_iov = &(struct iovec){ &h, sizeof(h) },
						 .msg_iovlen = 1 }, MSG_NOSIGNAL) < 0)
			break;	/* both directions full: the server is stuck */
	ASSERT_EQ(pthread_create(&th, NULL, probe_main, &p), 0);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 8;
	pthread_mutex_lock(&p.lock);
	while (!p.done && pthread_cond_timedwait(&p.cond, &p.lock, &until) == 0)
		;
	responsive = p.done;
	pthread_mutex_unlock(&p.lock);
	close(c);	/* unblocks the server either way (EPIPE) */
	pthread_join(th, NULL);
	ASSERT_TRUE(responsive);
	expect_next_served();
}

/* A failed check exits at once: leave no socket directory behind. */
static void remove_socket_dir(void)
{
	unlink(sock_path);
	rmdir(sock_dir);
}

/* ---- Upgrade in place (vu_server_handover_*) ---- */

static const struct vu_dev_ops *ho_ops_b = &fake_ops;

static unsigned one_queue(void *dev)
{
	return 1;
}

/* What the loop thread does for a handover from a to b (created here on
 * the listener a had, as the new process does), in one go. */
struct ho_run {
	struct vu_server *a, *b;
	bool commit, resume, create_b, free_a;
	int r_save, r_load, r_commit;
	char err[256];
};

static void ho_run_cb(void *opaque)
{
	struct ho_run *h = opaque;
	int sv[2];

	h->r_save = h->r_load = h->r_commit = -1;
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	if (h->create_b) {
		char path[128];

		snprintf(path, sizeof(path), "%s/ho.sock", sock_dir);
		ASSERT_EQ(vu_server_new_fd(path, fcntl(vu_server_listen_fd(h->a), F_DUPFD_CLOEXEC, 3),
					   loop, ho_ops_b, NULL, &h->b, h->err, sizeof(h->err)), 0);
	}
	h->r_save = vu_server_handover_save(h->a, sv[0], false, h->err, sizeof(h->err));
	if (h->r_save == 0)
		h->r_load = vu_server_handover_load(h->b, sv[1], 2000, h->err, sizeof(h->err));
	if (h->r_load == 0 && h->commit)
		h->r_commit = vu_server_handover_commit(h->b);
	if (h->resume)
		vu_server_handover_resume(h->a);
	if (h->free_a)
		vu_server_free(h->a);
	close(sv[0]);
	close(sv[1]);
}

static void ho_new_server(void *opaque)
{
	struct ho_run *h = opaque;
	char path[128];

	snprintf(path, sizeof(path), "%s/ho.sock", sock_dir);
	ASSERT_EQ(vu_server_new(path, loop, &fake_ops, NULL, &h->a, h->err, sizeof(h->err)), 0);
}

static void ho_commit_cb(void *opaque)
{
	struct ho_run *h = opaque;

	h->r_commit = vu_server_handover_commit(h->b);
}

static void ho_free_a_cb(void *opaque)
{
	vu_server_free(((struct ho_run *)opaque)->a);
}

static void ho_free_b(void *opaque)
{
	vu_server_free(((struct ho_run *)opaque)->b);
}

/* A frontend of server h->a with ring 0 running: status, an in-flight
 * region and a call fd set.  Returns the connection. */
static int ho_session(struct ho_run *h, int mem, int kick, int call, int *inflight)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES, v, ring0 = 0;
	struct vhost_user_inflight in = { .num_queues = 1, .queue_size = RING_NUM };
	struct vhost_vring_state st = { 0, 5 };
	char path[128];
	int c;

	snprintf(path, sizeof(path), "%s/ho.sock", sock_dir);
	loop_call_sync(loop, ho_new_server, h);
	c = conn_open_at(path);
	send_u64(c, VHOST_USER_SET_PROTOCOL_FEATURES, PROTO_STATUS |
		 1ull << VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD, NULL, 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_FEATURES, &f, sizeof(f), NULL, 0), 0);
	send_mem_table(c, mem, 0, FL_ACK);
	ASSERT_EQ(recv_reply(c, VHOST_USER_SET_MEM_TABLE, &v, sizeof(v)), 8);
	send_msg(c, VHOST_USER_GET_INFLIGHT_FD, FL, &in, sizeof(in), NULL, 0);
	{
		struct vhost_user_hdr hdr;
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct iovec iov[2] = { { &hdr, sizeof(hdr) }, { &in, sizeof(in) } };
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2, .msg_control = cbuf,
				     .msg_controllen = sizeof(cbuf) };

		ASSERT_EQ(recvmsg(c, &mh, MSG_WAITALL), (ssize_t)(sizeof(hdr) + sizeof(in)));
		ASSERT_TRUE(CMSG_FIRSTHDR(&mh) != NULL);
		memcpy(inflight, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof(int));
	}
	v = 0x0f;
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_STATUS, &v, 8, NULL, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_BASE, &st, sizeof(st), NULL, 0), 0);
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_CALL, &ring0, 8, &call, 1), 0);
	st = (struct vhost_vring_state){ 0, 1 };
	ASSERT_EQ(send_acked(c, VHOST_USER_SET_VRING_ENABLE, &st, sizeof(st), NULL, 0), 0);
	ring_start(c, 0, kick);
	ASSERT_EQ(fake_get().nstart, 1);
	return c;
}

/* The frontend, its memory, ring, fds, in-flight region and status move
 * to the new server; the ring starts there only at commit, where it
 * stopped, on the same fds and memory; the connection stays open. */
static void test_handover_moves_frontend_and_rings(void)
{
	int mem = guest_memfd(GUEST_SIZE), kick = test_eventfd(0), call = test_eventfd(0);
	struct ho_run h = { .commit = true, .create_b = true };
	struct vhost_vring_state st = { 0, 0 };
	struct fake_calls r;
	uint8_t *g, *inf;
	uint64_t v;
	int c, infd = -1;

	fake_reset();
	c = ho_session(&h, mem, kick, call, &infd);
	ASSERT_EQ(read(call, &v, sizeof(v)), sizeof(v));	/* the first start's */
	g = mmap(NULL, GUEST_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, mem, 0);
	inf = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, infd, 0);
	ASSERT_TRUE(g != MAP_FAILED && inf != MAP_FAILED);
	g[0x100] = 0xa5;
	inf[8] = 0x5a;
	v = 9;
	ASSERT_EQ(write(kick, &v, sizeof(v)), sizeof(v));

	/* Held: replayed, nothing started until commit. */
	h.commit = false;
	loop_call_sync(loop, ho_run_cb, &h);
	if (h.r_load)
		T_FAIL("handover: %s", h.err);
	r = fake_get();
	ASSERT_EQ(r.nstop, 1);
	ASSERT_EQ(r.nstart, 1);
	ASSERT_EQ(r.nrelease, 0);		/* the claim carries over */
	loop_call_sync(loop, ho_commit_cb, &h);
	ASSERT_EQ(h.r_commit, 0);

	r = fake_get();
	ASSERT_EQ(r.nstart, 2);
	ASSERT_EQ(r.setup.cfg.num, RING_NUM);
	ASSERT_EQ(r.setup.cfg.last_avail_idx, STOP_AVAIL);	/* where a stopped it */
	ASSERT_EQ(r.setup.cfg.desc_qva, GUEST_QVA);
	ASSERT_EQ(r.kick_value, 9);				/* our kick eventfd */
	ASSERT_EQ(read(call, &v, sizeof(v)), sizeof(v));	/* our call eventfd */
	ASSERT_TRUE(r.setup.enabled);
	ASSERT_EQ(r.setup.features, DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES);
	g = gm_qva_to_host(r.setup.mem, GUEST_QVA + 0x100, 1);
	ASSERT_TRUE(g != NULL);
	ASSERT_EQ(*g, 0xa5);					/* our memory */
	ASSERT_TRUE(r.setup.cfg.inflight != NULL);
	ASSERT_EQ(((uint8_t *)r.setup.cfg.inflight)[8], 0x5a);	/* our region */

	/* The old server lets go without a word to the frontend... */
	loop_call_sync(loop, ho_free_a_cb, &h);
	/* ...which the new one serves, with what the old one was told. */
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_STATUS), 0x0f);
	send_msg(c, VHOST_USER_GET_VRING_BASE, FL, &st, sizeof(st), NULL, 0);
	ASSERT_EQ(recv_reply(c, VHOST_USER_GET_VRING_BASE, &st, sizeof(st)), sizeof(st));
	ASSERT_EQ(st.num, STOP_AVAIL);
	ASSERT_EQ(vu_server_connections(h.b), 1);
	close(c);
	loop_call_sync(loop, ho_free_b, &h);
	munmap(inf, 4096);
	close(infd);
	close(mem);
	close(kick);
	close(call);
}

/* A new server that cannot take the state (another queue count; a
 * feature it does not offer) keeps nothing; the old one resumes: its
 * ring restarts where it stopped and it serves the same connection. */
static void test_handover_refused_old_resumes(void)
{
	static const struct vu_dev_ops one_q = {
		.features = fake_features, .num_queues = one_queue, .get_config = fake_get_config,
		.set_config = fake_set_config, .set_features = fake_set_features,
		.queue_start = fake_queue_start, .queue_stop = fake_queue_stop,
		.queue_set_fds = fake_queue_set_fds, .queue_set_enable = fake_queue_set_enable,
		.queue_set_log = fake_queue_set_log, .claim = fake_claim, .release = fake_release,
	};
	int mem = guest_memfd(GUEST_SIZE), kick = test_eventfd(0), call = test_eventfd(0);
	struct ho_run h = { .resume = true, .create_b = true };
	struct fake_calls r;
	unsigned fds;
	int c, infd = -1;

	fake_reset();
	c = ho_session(&h, mem, kick, call, &infd);
	ho_ops_b = &one_q;
	fds = t_count_fds();
	loop_call_sync(loop, ho_run_cb, &h);
	ho_ops_b = &fake_ops;
	ASSERT_EQ(h.r_save, 0);
	ASSERT_EQ(h.r_load, -EPROTO);
	if (!strstr(h.err, "queues"))
		T_FAIL("refusal says '%s', not the queue counts", h.err);
	loop_call_sync(loop, ho_free_b, &h);
	/* Nothing of the state stayed with b (the listener dup went with it). */
	ASSERT_EQ(t_count_fds(), fds);
	r = fake_get();
	ASSERT_EQ(r.nstop, 1);
	ASSERT_EQ(r.nstart, 2);			/* resumed */
	ASSERT_EQ(r.setup.cfg.last_avail_idx, STOP_AVAIL);
	ASSERT_EQ(r.nrelease, 0);
	ASSERT_EQ(get_u64(c, VHOST_USER_GET_STATUS), 0x0f);	/* a serves on */
	close(c);
	loop_call_sync(loop, ho_free_a_cb, &h);
	close(infd);
	close(mem);
	close(kick);
	close(call);
}

/* Dirty logging on (a migration): no handover, nothing stopped. */
static void test_handover_refused_while_logging(void)
{
	uint64_t f = DEV_FEATURES | 1ull << VHOST_USER_F_PROTOCOL_FEATURES | F_LOG_ALL;
	int mem = guest_memfd(GUEST_SIZE), kick = test_eventfd(0), lfd = guest_memfd(4096);
	struct ho_run h = { 0 };
	int c;

	fake_reset();
	c = conn_open();
	send_u64(c, VHOST_USER_SET_PROTOCOL_FEATURES, PROTO_LOG, NULL, 0);
	ASSERT_EQ(set_log_base(c, lfd, 4096, 0), 0);
	log_session(c, mem, f);
	ring_start(c, 0, kick);
	h.a = srv;
	h.create_b = false;
	loop_call_sync(loop, ho_run_cb, &h);
	ASSERT_EQ(h.r_save, -EBUSY);
	if (!strstr(h.err, "migration"))
		T_FAIL("refusal says '%s'", h.err);
	ASSERT_EQ(fake_get().nstop, 0);
	barrier(c);
	close(c);
	close(mem);
	close(kick);
	close(lfd);
}

int main(void)
{
	char err[256];
	int r;

	log_set_level(LOG_ERR);
	if (!mkdtemp(sock_dir)) {
		fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
		return T_EXIT_SKIP;
	}
	snprintf(sock_path, sizeof(sock_path), "%s/vu.sock", sock_dir);
	atexit(remove_socket_dir);
	ASSERT_EQ(loop_new("vu-test", &loop), 0);
	/* Created before the loop thread runs, so this thread owns it until
	 * loop_thread_start and again after loop_thread_join. */
	r = vu_server_new(sock_path, loop, &fake_ops, NULL, &srv, err, sizeof(err));
	if (r < 0)
		T_FAIL("vu_server_new: %s", err);
	ASSERT_EQ(loop_thread_start(loop), 0);

	RUN(test_get_features_reply);
	RUN(test_get_protocol_features_queue_num_mem_slots);
	RUN(test_reply_ack_success_is_zero);
	RUN(test_unknown_request_nacked_connection_stays);
	RUN(test_unknown_request_ignored_without_need_reply);
	RUN(test_need_reply_on_every_message);
	RUN(test_need_reply_answered_without_reply_ack);
	RUN(test_no_reply_unasked_on_every_message);
	RUN(test_status_set_get_needs_reset);
	RUN(test_reset_device_stops_rings_and_restarts);
	RUN(test_config_change_on_backend_channel);
	RUN(test_set_features_short_payload_disconnects);
	RUN(test_oversized_payload_disconnects);
	RUN(test_bad_version_disconnects);
	RUN(test_vring_num_out_of_range_disconnects);
	RUN(test_vring_index_out_of_range_disconnects);
	RUN(test_vring_kick_fd_with_nofd_disconnects);
	RUN(test_vring_kick_no_fd_without_nofd_disconnects);
	RUN(test_notify_fd_must_be_eventfd);
	RUN(test_mem_table_fd_count_mismatch_disconnects);
	RUN(test_mem_table_nine_regions_disconnects);
	RUN(test_mem_table_region_beyond_memfd_disconnects);
	RUN(test_set_features_unoffered_bit_disconnects);
	RUN(test_get_config_past_end_disconnects);
	RUN(test_get_config_size_mismatch_disconnects);
	RUN(test_vring_addr_outside_memory_disconnects);
	RUN(test_vring_addr_straddling_region_end_disconnects);
	RUN(test_extra_fd_closed_on_disconnect);
	RUN(test_fds_closed_on_recv_errors);
	RUN(test_ring_start_enable_stop);
	RUN(test_config_get_and_set);
	RUN(test_logging_switches_on_a_running_ring);
	RUN(test_log_replaced_and_given_to_new_rings);
	RUN(test_log_too_small_or_bad_refused);
	RUN(test_log_base_without_shmfd_nacked);
	RUN(test_claim_held_while_rings_run);
	RUN(test_claim_refused_drops_frontend);
	RUN(test_stalled_payload_times_out);
	RUN(test_message_deadline_covers_header_and_payload);
	RUN(test_unread_replies_do_not_block_loop);
	RUN(test_handover_moves_frontend_and_rings);
	RUN(test_handover_refused_old_resumes);
	RUN(test_handover_refused_while_logging);

	loop_thread_join(loop);
	vu_server_free(srv);
	loop_free(loop);
	return T_EXIT_PASS;
}
