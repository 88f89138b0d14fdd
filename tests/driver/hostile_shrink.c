/*
 * A hostile frontend for tests/driver: connects to vblkd, proves the disk
 * works with one read, then shrinks the memory file it shares with the
 * daemon to nothing and kicks.  The daemon must survive (its SIGBUS guard,
 * mem/gm.h), drop this frontend, and serve the next one: we connect again
 * and read again.  Exit 0 when all of that happened, 1 with a line saying
 * what did not.
 *
 *   hostile-shrink SOCKET
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "driver/vdrv.h"

struct req {
	uint8_t buf[4096];		/* first: 4 KiB aligned */
	struct virtio_blk_outhdr hdr;
	uint8_t status;
};

static int fail(const char *what)
{
	fprintf(stderr, "hostile-shrink: %s\n", what);
	return 1;
}

/* One 4 KiB read of sector 0, waited for. */
static int read_once(struct vdrv *d, struct req *r)
{
	struct vdrv_queue *q = &d->q[0];
	struct iovec out = { &r->hdr, sizeof(r->hdr) };
	struct iovec in[2] = { { r->buf, sizeof(r->buf) }, { &r->status, 1 } };

	r->hdr = (struct virtio_blk_outhdr){ .type = VIRTIO_BLK_T_IN };
	r->status = 0xff;
	if (vdrv_add(q, &out, 1, in, 2, r) < 0)
		return -1;
	vdrv_kick(q);
	for (int i = 0; i < 50; i++) {
		if (vdrv_get(q, NULL) == r)
			return r->status == VIRTIO_BLK_S_OK ? 0 : -1;
		if (vdrv_enable_cb(q))
			continue;	/* one raced in */
		(void)vdrv_wait(q, 100);
	}
	return -1;
}

static int connect_and_read(const char *sock, struct vdrv **out)
{
	struct vdrv_opts o = { .socket = sock, .num_queues = 1, .queue_size = 64,
			       .mem_bytes = 1 << 20 };
	char err[256];
	struct req *r;

	if (vdrv_connect(&o, out, err, sizeof(err)) < 0) {
		fprintf(stderr, "hostile-shrink: connect: %s\n", err);
		return -1;
	}
	r = vdrv_alloc(*out, sizeof(*r), 4096);
	if (!r || read_once(*out, r) < 0) {
		fprintf(stderr, "hostile-shrink: a read failed\n");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct vdrv *d = NULL;
	struct pollfd p;
	uint64_t one = 1;
	char c;

	if (argc != 2)
		return fail("usage: hostile-shrink SOCKET");
	signal(SIGPIPE, SIG_IGN);
	if (connect_and_read(argv[1], &d) < 0)
		return 1;
	/* Let the daemon stop polling and sleep with kicks on. */
	usleep(1200 * 1000);
	/* From here on our own mapping is gone too: touch nothing in it. */
	if (ftruncate(d->memfd, 0) < 0)
		return fail("ftruncate of our memory file failed");
	if (write(d->q[0].kick_fd, &one, sizeof(one)) != sizeof(one))
		return fail("kick failed");
	p = (struct pollfd){ .fd = d->sock, .events = POLLIN };
	if (poll(&p, 1, 5000) != 1 || recv(d->sock, &c, 1, MSG_DONTWAIT) != 0)
		return fail("the daemon did not drop us within 5 s");
	d->q[0].kick_fd = -1;	/* vdrv_close must not ask for ring bases */
	vdrv_close(d);
	d = NULL;
	if (connect_and_read(argv[1], &d) < 0)
		return fail("the daemon does not serve the next frontend");
	vdrv_close(d);
	return 0;
}
