/*
 * null engine: completes every request at once, reads return zeroes (like
 * qemu-storage-daemon's null-co with read-zeroes=on).  Measures the
 * daemon's own overhead: rings, notifications, threads.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend/bdev.h"

struct bdev_ctx {
	int unused;
};

static int null_ctx_new(struct bdev *b, struct loop *l, unsigned depth,
			struct bdev_ctx **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

static void null_ctx_free(struct bdev_ctx *c)
{
	free(c);
}

static void null_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	if (io->op == BDEV_READ)
		for (unsigned i = 0; i < io->iovcnt; i++)
			memset(io->iov[i].iov_base, 0, io->iov[i].iov_len);
	bdev_complete(io, 0);
}

static void null_nop(struct bdev_ctx *c)
{
}

const struct bdev_engine bdev_null_engine = {
	.name = "null",
	.no_disk = true,
	.caps = BDEV_CAP_DISCARD | BDEV_CAP_WRITE_ZEROES | BDEV_CAP_FUA,
	.ctx_new = null_ctx_new,
	.ctx_free = null_ctx_free,
	.submit = null_submit,
	.kick = null_nop,
	.drain = null_nop,
};
