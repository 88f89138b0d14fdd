/*
 * nbd-stale URI: an NBD disk's socket that epoll reported readable, whose
 * replies something else on the iothread read before the event was
 * dispatched, must not wedge the connection.
 *
 * How it happens in vblkd: an upgrade stops the rings one by one, each
 * stop a call run on the iothread (its wake eventfd), and the stop drains
 * the engine, which reads the socket dry with nbd_poll.  When the same
 * epoll_wait returned the socket as readable after the wake eventfd, its
 * handler then runs on a socket with nothing to read.  libnbd, told that
 * the socket is readable (nbd_aio_notify_read) in its READY state, goes to
 * REPLY.START, finds nothing (EAGAIN) and stays there: the commands it is
 * given next wait in its queue to be sent until a reply comes, and none
 * will (the server has answered everything it was sent).  The other
 * queue's requests then sat unsent until the stop's drain gave up after
 * 30 s (tests/remote/test_remote.sh, upgrade_case_again, 2026-12-03..05).
 *
 * Here, on a loop thread with polling off: an eventfd is made ready, then
 * a read goes out and its reply arrives, both while the thread is busy;
 * the next epoll_wait returns the eventfd first, whose handler drains the
 * engine (reading the reply), then the socket.  A second read must still
 * complete.  Exit 0 if it does, 1 otherwise, with one line.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "backend/bdev.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/sys.h"

static struct bdev disk;
static struct bdev_ctx *ctx;
static struct loop *l;
static struct loop_fd *efd_h;
static int efd;
static uint8_t buf[2][4096];
static struct iovec iov[2] = { { buf[0], 4096 }, { buf[1], 4096 } };
static struct bdev_io io[2];
static atomic_int done[2], res[2];

static void io_cb(struct bdev_io *x, int r)
{
	int i = x == &io[1];

	atomic_store(&res[i], r);
	atomic_store(&done[i], 1);
}

static void submit(int i)
{
	io[i] = (struct bdev_io){ .op = BDEV_READ, .offset = (uint64_t)i * 4096,
				  .iov = &iov[i], .iovcnt = 1, .cb = io_cb };
	bdev_submit(&disk, ctx, &io[i]);
	disk.engine->kick(ctx);
}

/* What a ring's stop does on the iothread: drain the engine. */
static void efd_cb(void *opaque, uint32_t events)
{
	(void)opaque;
	(void)events;
	(void)sys_eventfd_drain(efd);
	disk.engine->drain(ctx);
}

static int setup_r;

static void setup(void *arg)
{
	(void)arg;
	setup_r = bdev_ctx_new(&disk, l, 8, &ctx);
	if (setup_r == 0)
		setup_r = loop_fd_add(l, efd, EPOLLIN, efd_cb, NULL, &efd_h);
}

/* The eventfd ready first, then the socket (the reply), both while this
 * call holds the loop thread. */
static void stage(void *arg)
{
	struct timespec t = { 0, 300 * 1000000l };

	(void)arg;
	(void)sys_eventfd_signal(efd);
	submit(0);
	nanosleep(&t, NULL);
}

static void submit_second(void *arg)
{
	(void)arg;
	submit(1);
}

static void teardown(void *arg)
{
	(void)arg;
	loop_fd_del(l, efd_h);
	disk.engine->drain(ctx);
	disk.engine->ctx_free(ctx);
}

static bool wait_done(int i, int seconds)
{
	for (int n = 0; n < seconds * 100 && !atomic_load(&done[i]); n++)
		usleep(10000);
	return atomic_load(&done[i]);
}

int main(int argc, char **argv)
{
	struct bdev_opts bo = { 0 };
	struct loop_poll_params p = { .max_ns = 0, .grow = 2, .shrink = 2 };
	char err[512];

	if (argc != 2) {
		fprintf(stderr, "usage: nbd-stale nbd://HOST:PORT/EXPORT\n");
		return 2;
	}
	log_set_level(LOG_WARN);
	bo.path = argv[1];
	if (bdev_open(&bo, &disk, err, sizeof(err)) < 0) {
		fprintf(stderr, "nbd-stale: %s\n", err);
		return 1;
	}
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (efd < 0 || loop_new("nbd-stale", &l) < 0) {
		fprintf(stderr, "nbd-stale: no eventfd or loop\n");
		return 1;
	}
	/* No polling: the socket's event is what finds the reply. */
	loop_set_poll_params(l, &p);
	if (loop_thread_start(l) < 0) {
		fprintf(stderr, "nbd-stale: no loop thread\n");
		return 1;
	}
	loop_call_sync(l, setup, NULL);
	if (setup_r < 0) {
		fprintf(stderr, "nbd-stale: no context (%s)\n", strerror(-setup_r));
		return 1;
	}
	loop_call_sync(l, stage, NULL);
	if (!wait_done(0, 10) || atomic_load(&res[0])) {
		fprintf(stderr, "nbd-stale: the first read did not complete (%d)\n",
			atomic_load(&res[0]));
		return 1;
	}
	loop_call_sync(l, submit_second, NULL);
	if (!wait_done(1, 10)) {
		fprintf(stderr, "nbd-stale: a read submitted after the socket's stale event "
			"was never answered in 10 s\n");
		return 1;
	}
	if (atomic_load(&res[1])) {
		fprintf(stderr, "nbd-stale: the second read failed (%d)\n", atomic_load(&res[1]));
		return 1;
	}
	loop_call_sync(l, teardown, NULL);
	loop_thread_join(l);
	loop_free(l);
	bdev_close(&disk);
	printf("nbd-stale: both reads answered\n");
	return 0;
}
