#include "backend/bdev.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/compiler.h"
#include "util/iov.h"
#include "util/log.h"

static const struct bdev_engine *const engines[] = {
	&bdev_uring_engine,
	&bdev_null_engine,
};

const struct bdev_engine *bdev_engine_find(const char *name)
{
	if (!name)
		return engines[0];
	for (unsigned i = 0; i < ARRAY_SIZE(engines); i++)
		if (strcmp(engines[i]->name, name) == 0)
			return engines[i];
	return NULL;
}

static bool iov_aligned(const struct iovec *iov, unsigned cnt, unsigned align)
{
	for (unsigned i = 0; i < cnt; i++)
		if (((uintptr_t)iov[i].iov_base | iov[i].iov_len) & (align - 1))
			return false;
	return true;
}

void bdev_submit(struct bdev *b, struct bdev_ctx *c, struct bdev_io *io)
{
	io->bounce = NULL;
	io->len = iov_size(io->iov, io->iovcnt);
	/* O_DIRECT wants aligned buffers; guests usually give them, a
	 * hostile or odd one need not.  Bounce those rather than fail. */
	if (b->direct && io->op != BDEV_FLUSH &&
	    unlikely(!iov_aligned(io->iov, io->iovcnt, b->dio_mem_align))) {
		if (posix_memalign(&io->bounce, 4096, io->len ? io->len : 1)) {
			bdev_complete(io, -ENOMEM);
			return;
		}
		if (io->op == BDEV_WRITE)
			iov_to_buf(io->iov, io->iovcnt, 0, io->bounce, io->len);
		io->user_iov = io->iov;
		io->user_iovcnt = io->iovcnt;
		io->bounce_iov.iov_base = io->bounce;
		io->bounce_iov.iov_len = io->len;
		io->iov = &io->bounce_iov;
		io->iovcnt = 1;
	}
	b->engine->submit(c, io);
}

void bdev_complete(struct bdev_io *io, int res)
{
	if (io->bounce) {
		if (io->op == BDEV_READ && res == 0)
			iov_from_buf(io->user_iov, io->user_iovcnt, 0,
				     io->bounce, io->len);
		free(io->bounce);
		io->bounce = NULL;
		io->iov = io->user_iov;
		io->iovcnt = io->user_iovcnt;
	}
	io->cb(io, res);
}
