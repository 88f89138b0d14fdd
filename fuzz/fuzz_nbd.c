/*
 * Description: libFuzzer targets for the NBD server (src/nbd/): the
 * handshake (fuzz_nbd_opt: the input is everything a client sends after
 * the server's greeting) and the transmission phase (fuzz_nbd_tx,
 * -DFUZZ_NBD_TX: a valid handshake first, client flags, structured
 * replies, both metadata contexts and NBD_OPT_GO, then the input as the
 * request stream).
 *
 * The server runs as in vblkd: an export on a unix socket, its listener
 * on a main loop and each connection on the disk's iothread (both loops on
 * threads of their own), over the null engine (64 MiB, reads zeroes).
 * Per input: connect, send the input while reading every reply, shut our
 * side down, and read until the server closes.  Invariants: the server
 * answers the greeting and closes a connection whose client has hung up
 * (within 10 s: a request it never completes, or a connection it forgets,
 * fails), and never crashes or trips a sanitizer.
 */
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fuzz.h"

#include "backend/bdev.h"
#include "disk/disk.h"
#include "loop/loop.h"
#include "nbd/nbd_proto.h"
#include "nbd/nbds.h"
#include "util/compiler.h"
#include "util/sys.h"

static char path[108];
static struct bdev bd;
static struct disk *dk;
static struct loop *ml;
static struct nbds *srv;

static void cleanup(void)
{
	unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct bdev_opts bo = { .engine = "null", .size = 64ull << 20 };
	struct nbds_export_opts eo = { .max_conn = 1024 };
	char err[512];

	fuzz_log_init();
	snprintf(path, sizeof(path), "/tmp/vblk-fuzz-nbd.%d.sock", (int)getpid());
	FUZZ_CHECK(bdev_open(&bo, &bd, err, sizeof(err)) == 0);
	FUZZ_CHECK(disk_new(&bd, &(struct disk_opts){ .num_iothreads = 1 }, &dk) == 0);
	FUZZ_CHECK(loop_new("main", &ml) == 0);
	FUZZ_CHECK(nbds_new(dk, ml, &srv) == 0);
	eo.addr = malloc(strlen(path) + 6);
	sprintf(eo.addr, "unix:%s", path);
	eo.name = strdup("");
	FUZZ_CHECK(nbds_add(srv, &eo, err, sizeof(err)) == 0);
	nbds_export_opts_free(&eo);
	FUZZ_CHECK(loop_thread_start(ml) == 0);
	atexit(cleanup);
	return 0;
}

/* Wait for fd to be ready for ev; false after 10 s.  libFuzzer's
 * -timeout alarm (SIGALRM) interrupts poll: that is not the server. */
static bool wait_fd(int fd, short ev)
{
	uint64_t end = sys_now_ns() + 10ull * 1000000000ull;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = ev };
		uint64_t now = sys_now_ns();
		int r;

		if (now >= end)
			return false;
		r = poll(&p, 1, (int)((end - now) / 1000000) + 1);
		if (r > 0)
			return true;
		if (r < 0 && errno != EINTR)
			return false;
	}
}

#ifdef FUZZ_NBD_TX
/* All of buf, a blocking socket, across interruptions. */
static void write_all(int fd, const void *buf, size_t n)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = write(fd, (const uint8_t *)buf + done, n - done);

		if (r < 0 && errno == EINTR)
			continue;
		FUZZ_CHECK(r > 0);
		done += (size_t)r;
	}
}
#endif

static void read_exact(int fd, void *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r;

		FUZZ_CHECK(wait_fd(fd, POLLIN));
		r = read(fd, (uint8_t *)buf + got, n - got);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		FUZZ_CHECK(r > 0);
		got += (size_t)r;
	}
}

#ifdef FUZZ_NBD_TX
/* One option, then its replies up to the final one (ACK or error). */
static void opt(int fd, uint32_t o, const void *data, uint32_t len)
{
	struct nbd_opt_hdr h = { htobe64(NBD_IHAVEOPT), htobe32(o), htobe32(len) };
	struct nbd_opt_reply r;
	uint8_t skip[256];

	write_all(fd, &h, sizeof(h));
	write_all(fd, data, len);
	for (;;) {
		uint32_t n;

		read_exact(fd, &r, sizeof(r));
		for (n = be32toh(r.length); n; n -= MIN(n, sizeof(skip)))
			read_exact(fd, skip, MIN(n, sizeof(skip)));
		if (be32toh(r.type) == NBD_REP_ACK)
			return;
		FUZZ_CHECK(be32toh(r.type) == NBD_REP_META_CONTEXT ||
			   be32toh(r.type) == NBD_REP_INFO);
	}
}

static void handshake(int fd)
{
	static const uint8_t meta[] = {
		0, 0, 0, 0, 0, 0, 0, 2,
		0, 0, 0, 15, 'b', 'a', 's', 'e', ':', 'a', 'l', 'l', 'o', 'c', 'a', 't', 'i', 'o', 'n',
		0, 0, 0, 21, 'q', 'e', 'm', 'u', ':', 'a', 'l', 'l', 'o', 'c', 'a', 't', 'i', 'o',
		'n', '-', 'd', 'e', 'p', 't', 'h' };
	static const uint8_t go[] = { 0, 0, 0, 0, 0, 1, 0, 3 };
	uint32_t flags = htobe32(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);

	write_all(fd, &flags, 4);
	opt(fd, NBD_OPT_STRUCTURED_REPLY, NULL, 0);
	opt(fd, NBD_OPT_SET_META_CONTEXT, meta, sizeof(meta));
	opt(fd, NBD_OPT_GO, go, sizeof(go));
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	uint8_t greet[18], sink[65536];
	size_t sent = 0;
	bool shut = false;
	int fd;

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	FUZZ_CHECK(fd >= 0);
	strcpy(sa.sun_path, path);
	/* Interrupted, a unix socket's connect completes on its own. */
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		FUZZ_CHECK(errno == EINTR && wait_fd(fd, POLLOUT));
	read_exact(fd, greet, sizeof(greet));
#ifdef FUZZ_NBD_TX
	handshake(fd);
#endif
	/* Send the input while taking every reply: a server that stops
	 * reading until its replies are read must not deadlock us. */
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN | (shut ? 0 : POLLOUT) };
		ssize_t r;

		FUZZ_CHECK(wait_fd(fd, p.events));
		while (poll(&p, 1, 0) < 0 && errno == EINTR)
			;
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			r = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
				break;	/* the server closed: done */
		}
		if (!shut && (p.revents & POLLOUT)) {
			r = send(fd, data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (r > 0)
				sent += (size_t)r;
			else if (r < 0 && errno != EAGAIN && errno != EINTR)
				sent = size;	/* closed on us: stop sending */
			if (sent == size) {
				shutdown(fd, SHUT_WR);
				shut = true;
			}
		}
	}
	close(fd);
	return 0;
}
