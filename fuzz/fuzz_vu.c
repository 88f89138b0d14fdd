/*
 * Description: libFuzzer target for the vhost-user message handler (vu_):
 * a sequence of messages, with fds, from a hostile frontend.
 *
 * Everything runs on this thread: a real vu_server on a loop that never
 * runs (loop_fd_add/del work on it all the same), one socketpair per
 * input whose server end is handed over with vu_server_adopt(), and
 * vu_server_process() to handle each message as soon as it is sent.
 * Replies (and any fd they carry) are read and dropped.  At the end of
 * the input we close our end, so the server disconnects and the next
 * input starts from a fresh connection.
 *
 * The fake device is synchronous and checks what vu promises it (see
 * struct vu_dev_ops): a ring is started only when stopped and stopped
 * only when started, its fds are open while it runs, its memory stays
 * mapped until it stops (the fake reads and writes the rings through
 * vq_init/vq_*_notify, so an early unmap faults), and after a disconnect
 * no ring runs.  The disk is claimed before the first ring starts and
 * released only once none runs; a dirty log handed to a ring is marked
 * through (vq_*_notify log used-ring stores), so one unmapped too early,
 * or marked outside its bounds, faults.  The harness checks that an input leaks no fd.
 *
 * Input: records until the input ends, each
 *   u8  ctl: bits 0-3 the number of fds (0-15, more than vhost-user's 8
 *       on purpose), bit 4: send the payload in a second sendmsg
 *   nfds x { u8 kind, u8 fill }: kind < 0x80: memfd of kind pages, its
 *       first 64 KiB filled with the 16-bit word fill; 0x80-0xbf: eventfd;
 *       0xc0-0xff: the read end of a pipe
 *   struct vhost_user_hdr (12 bytes)
 *   hdr.size payload bytes (fewer if the input ends: the message is then
 *       cut short and our end shut down for writing)
 * fuzz/make-seeds.py writes valid examples.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"

#include "loop/loop.h"
#include "util/sys.h"
#include "util/sock.h"
#include "vhost/vhost_user.h"
#include "vhost/vu.h"
#include "virtio/vq.h"

#define NQUEUES		2
#define MAX_REC_FDS	15
#define FILL_MAX	(64u << 10)
/* Fds [0, FD_CHECK) are compared before and after each input. */
#define FD_CHECK	64
/* The loop never runs, so deleted fd handlers wait for loop_free(). */
#define RECREATE_EVERY	1024

#define DEV_FEATURES	(1ull << VIRTIO_F_VERSION_1 | 1ull << VIRTIO_RING_F_EVENT_IDX | \
			 1ull << VIRTIO_RING_F_INDIRECT_DESC | 1ull << 9 /* FLUSH */)

/* ---- Fake device ---- */

static struct {
	bool started[NQUEUES];
	struct vq vq[NQUEUES];
	int kick_fd[NQUEUES], call_fd[NQUEUES], err_fd[NQUEUES];
	uint64_t features;
	bool claimed;
} fake;

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static void fake_check_fds(unsigned idx)
{
	FUZZ_CHECK(fd_open(fake.kick_fd[idx]));
	FUZZ_CHECK(fake.call_fd[idx] < 0 || fd_open(fake.call_fd[idx]));
	FUZZ_CHECK(fake.err_fd[idx] < 0 || fd_open(fake.err_fd[idx]));
}

/* Read and write every part of the ring, as a device would. */
static void fake_touch(struct vq *vq)
{
	volatile uint8_t sink;

	sink = ((volatile uint8_t *)vq->desc)[0];
	sink = ((volatile uint8_t *)vq->desc)[vring_desc_bytes(vq->num) - 1];
	(void)sink;
	vq_disable_notify(vq);
	(void)vq_enable_notify(vq);
	(void)vq_avail_pending(vq);
}

static uint64_t fake_features(void *dev)
{
	return DEV_FEATURES;
}

static unsigned fake_num_queues(void *dev)
{
	return NQUEUES;
}

static void fake_get_config(void *dev, uint32_t off, uint8_t *buf, uint32_t len)
{
	FUZZ_CHECK((uint64_t)off + len <= VHOST_USER_MAX_CONFIG_SIZE);
	for (uint32_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(off + i);
}

static int fake_set_config(void *dev, uint32_t off, const uint8_t *buf, uint32_t len)
{
	FUZZ_CHECK((uint64_t)off + len <= VHOST_USER_MAX_CONFIG_SIZE);
	return off == 32 && len == 1 ? 0 : -EPERM;
}

static void fake_set_features(void *dev, uint64_t features)
{
	FUZZ_CHECK(!(features & ~DEV_FEATURES));
	fake.features = features;
}

static int fake_queue_start(void *dev, unsigned idx, const struct vu_queue_setup *s)
{
	const struct vq_config *c = &s->cfg;
	int r;

	FUZZ_CHECK(idx < NQUEUES);
	FUZZ_CHECK(!fake.started[idx]);
	FUZZ_CHECK(c->index == idx);
	FUZZ_CHECK(c->num && c->num <= VRING_MAX_NUM && !(c->num & (c->num - 1)));
	FUZZ_CHECK(s->mem != NULL);
	FUZZ_CHECK(fake.claimed);
	fake.kick_fd[idx] = s->kick_fd;
	fake.call_fd[idx] = s->call_fd;
	fake.err_fd[idx] = s->err_fd;
	fake_check_fds(idx);
	/* As blk does: the layout is vq_init's to judge. */
	r = vq_init(&fake.vq[idx], c, s->mem);
	if (r < 0) {
		vq_release(&fake.vq[idx]);
		return r;
	}
	fake_touch(&fake.vq[idx]);
	fake.started[idx] = true;
	return 0;
}

static uint32_t fake_queue_stop(void *dev, unsigned idx)
{
	uint16_t last;

	FUZZ_CHECK(idx < NQUEUES);
	FUZZ_CHECK(fake.started[idx]);
	fake_check_fds(idx);
	/* The memory table must still be mapped. */
	fake_touch(&fake.vq[idx]);
	last = fake.vq[idx].last_avail_idx;
	vq_release(&fake.vq[idx]);
	fake.started[idx] = false;
	return last;
}

static void fake_queue_set_fds(void *dev, unsigned idx, int call_fd, int err_fd)
{
	FUZZ_CHECK(idx < NQUEUES);
	FUZZ_CHECK(fake.started[idx]);
	fake.call_fd[idx] = call_fd;
	fake.err_fd[idx] = err_fd;
	fake_check_fds(idx);
}

static void fake_queue_set_enable(void *dev, unsigned idx, bool enabled)
{
	FUZZ_CHECK(idx < NQUEUES);
	FUZZ_CHECK(fake.started[idx]);
}

static void fake_queue_set_log(void *dev, unsigned idx, const struct vq_log *lg)
{
	FUZZ_CHECK(idx < NQUEUES);
	FUZZ_CHECK(fake.started[idx]);
	FUZZ_CHECK(!lg->used || lg->log);
	vq_set_log(&fake.vq[idx], lg);
	fake_touch(&fake.vq[idx]);
}

static int fake_claim(void *dev)
{
	FUZZ_CHECK(!fake.claimed);
	for (unsigned i = 0; i < NQUEUES; i++)
		FUZZ_CHECK(!fake.started[i]);
	fake.claimed = true;
	return 0;
}

static void fake_release(void *dev)
{
	FUZZ_CHECK(fake.claimed);
	for (unsigned i = 0; i < NQUEUES; i++)
		FUZZ_CHECK(!fake.started[i]);
	fake.claimed = false;
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
};

/* ---- Server ---- */

static struct loop *loop;
static struct vu_server *srv;
static unsigned inputs;

static void die(const char *what, int err)
{
	dprintf(fuzz_report_fd, "fuzz_vu: %s: %s\n", what, strerror(err));
	exit(1);
}

/*
 * The server listens on a path nobody connects to (we adopt our own
 * connections), so its socket file and directory go at once: nothing is
 * left in /tmp however libFuzzer exits.
 */
static void server_new(void)
{
	char dir[] = "/tmp/vblk-fuzz-vu.XXXXXX", path[64], err[256];
	int r;

	r = loop_new("main", &loop);
	if (r < 0)
		die("loop_new", -r);
	if (!mkdtemp(dir))
		die("mkdtemp", errno);
	snprintf(path, sizeof(path), "%s/sock", dir);
	r = vu_server_new(path, loop, &fake_ops, NULL, &srv, err, sizeof(err));
	unlink(path);
	rmdir(dir);
	if (r < 0) {
		dprintf(fuzz_report_fd, "fuzz_vu: vu_server_new: %s\n", err);
		exit(1);
	}
}

static void server_free(void)
{
	vu_server_free(srv);
	loop_free(loop);
	srv = NULL;
	loop = NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_log_init();
	server_new();
	return 0;
}

/* ---- Frontend side ---- */

/* One fd as kind says, or -1 if the system refused. */
static int make_fd(uint8_t kind, uint8_t fill)
{
	int fd, p[2];

	if (kind >= 0xc0) {
		if (pipe2(p, O_CLOEXEC) < 0)
			return -1;
		close(p[1]);
		return p[0];
	}
	if (kind >= 0x80)
		return sys_eventfd();
	fd = memfd_create("fuzz-vu", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)kind * 4096) < 0) {
		close(fd);
		return -1;
	}
	if (fill && kind) {
		size_t len = MIN((size_t)kind * 4096, FILL_MAX);
		uint16_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

		if (m != MAP_FAILED) {
			for (size_t i = 0; i < len / 2; i++)
				m[i] = fill;
			munmap(m, len);
		}
	}
	return fd;
}

static bool send_part(int c, const void *buf, size_t len, const int *fds, unsigned nfds)
{
	char cbuf[CMSG_SPACE(MAX_REC_FDS * sizeof(int))];
	struct iovec iov = { (void *)buf, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	(void)sock_msg_set_fds(&mh, cbuf, sizeof(cbuf), fds, nfds);
	do
		n = sendmsg(c, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	return n == (ssize_t)len;
}

/* Read and drop whatever the server sent, closing the fds it carried. */
static void drain_replies(int c)
{
	char buf[4096], cbuf[CMSG_SPACE(16 * sizeof(int))];

	for (;;) {
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr mh = {
			.msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
		};
		struct cmsghdr *cm;
		ssize_t n = recvmsg(c, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

		if (n <= 0)
			return;
		for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
			size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			for (size_t i = 0; i < nfd; i++) {
				int f;

				memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
				close(f);
			}
		}
	}
}

static void fds_snapshot(bool open[FD_CHECK])
{
	for (int fd = 0; fd < FD_CHECK; fd++)
		open[fd] = fd_open(fd);
}

/* Send one record; false once the connection is gone or the input ran
 * out. */
static bool run_record(struct fuzz_in *in, int c)
{
	int fds[MAX_REC_FDS];
	unsigned nfds, nok = 0;
	struct vhost_user_hdr h;
	uint8_t ctl, payload[512];
	size_t plen;
	bool cut, ok;

	if (!in->left)
		return false;
	fuzz_take(in, &ctl, 1);
	nfds = ctl & 15;
	for (unsigned i = 0; i < nfds; i++) {
		uint8_t spec[2];
		int fd;

		fuzz_take(in, spec, 2);
		fd = make_fd(spec[0], spec[1]);
		if (fd >= 0)
			fds[nok++] = fd;
	}
	if (in->left < sizeof(h)) {
		/* A header cut short: send what there is and hang up. */
		uint8_t part[sizeof(h)];
		size_t k = in->left;

		fuzz_take(in, part, k);
		if (k)
			(void)send_part(c, part, k, fds, nok);
		for (unsigned i = 0; i < nok; i++)
			close(fds[i]);
		shutdown(c, SHUT_WR);
		(void)vu_server_process(srv);
		drain_replies(c);
		return false;
	}
	fuzz_take(in, &h, sizeof(h));
	/* Larger than any message: the server refuses it on the header, so
	 * send no more than a real payload would be. */
	plen = MIN((size_t)h.size, sizeof(payload));
	cut = plen > in->left;
	plen = MIN(plen, in->left);
	fuzz_take(in, payload, plen);

	if ((ctl & 0x10) && plen) {
		ok = send_part(c, &h, sizeof(h), fds, nok) &&
		     send_part(c, payload, plen, NULL, 0);
	} else {
		uint8_t msg[sizeof(h) + sizeof(payload)];

		memcpy(msg, &h, sizeof(h));
		memcpy(msg + sizeof(h), payload, plen);
		ok = send_part(c, msg, sizeof(h) + plen, fds, nok);
	}
	for (unsigned i = 0; i < nok; i++)
		close(fds[i]);
	if (cut)
		shutdown(c, SHUT_WR);
	ok = vu_server_process(srv) > 0 && ok && !cut;
	drain_replies(c);
	return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	bool before[FD_CHECK], after[FD_CHECK];
	int sv[2], r;

	if (++inputs % RECREATE_EVERY == 0) {
		server_free();
		server_new();
	}
	fds_snapshot(before);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair", errno);
	r = vu_server_adopt(srv, sv[0]);
	FUZZ_CHECK(r == 0);

	while (run_record(&in, sv[1]))
		;

	/* Hang up; the server reads what is left, then sees the close. */
	close(sv[1]);
	for (unsigned i = 0; i < 64 && vu_server_connected(srv); i++)
		(void)vu_server_process(srv);
	FUZZ_CHECK(!vu_server_connected(srv));
	for (unsigned i = 0; i < NQUEUES; i++)
		FUZZ_CHECK(!fake.started[i]);
	FUZZ_CHECK(fake.features == 0);
	FUZZ_CHECK(!fake.claimed);

	fds_snapshot(after);
	for (int fd = 0; fd < FD_CHECK; fd++)
		if (before[fd] != after[fd]) {
			dprintf(fuzz_report_fd, "fuzz_vu: fd %d %s during the input\n",
				fd, after[fd] ? "leaked" : "closed");
			abort();
		}
	return 0;
}
