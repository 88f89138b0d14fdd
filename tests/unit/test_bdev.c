/*
 * Description: backend completion rules shared by every engine (bdev.c):
 * discard is advisory, write zeroes is tried the other way once (unmap <->
 * zero range) when the disk cannot do the first, other errors pass
 * through.  A fake engine answers each submission as told.
 */
#include <errno.h>
#include <stdbool.h>

#include "test.h"

#include "backend/bdev.h"

static struct {
	int res_unmap, res_zero, res_other;	/* what the fake engine answers */
	unsigned submits;
	bool unmap_seen[4];
	int cb_res;
	unsigned cbs;
} f;

static void fake_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	(void)c;
	if (f.submits < 4)
		f.unmap_seen[f.submits] = io->unmap;
	f.submits++;
	if (io->op == BDEV_WRITE_ZEROES)
		bdev_complete(io, io->unmap ? f.res_unmap : f.res_zero);
	else
		bdev_complete(io, f.res_other);
}

static const struct bdev_engine fake_engine = {
	.name = "fake",
	.caps = BDEV_CAP_DISCARD | BDEV_CAP_WRITE_ZEROES,
	.submit = fake_submit,
};

static void done(struct bdev_io *io, int res)
{
	(void)io;
	f.cb_res = res;
	f.cbs++;
}

static void run(enum bdev_op op, bool unmap)
{
	struct bdev b = { .fd = -1, .block_size = 512, .size = 1 << 20,
			  .engine = &fake_engine };
	struct bdev_io io = { .op = op, .unmap = unmap, .offset = 0, .length = 4096,
			      .cb = done };

	f.submits = 0;
	f.cbs = 0;
	f.cb_res = 1;
	bdev_submit(&b, NULL, &io);
	ASSERT_EQ(f.cbs, 1);
}

/* A block device that cannot zero by deallocating: zero it plainly. */
static void test_write_zeroes_unmap_falls_back_to_zeroing(void)
{
	f.res_unmap = -EOPNOTSUPP;
	f.res_zero = 0;
	run(BDEV_WRITE_ZEROES, true);
	ASSERT_EQ(f.submits, 2);
	ASSERT_TRUE(f.unmap_seen[0] && !f.unmap_seen[1]);
	ASSERT_EQ(f.cb_res, 0);
}

/* A file system that cannot zero a range (tmpfs): punch a hole. */
static void test_write_zeroes_falls_back_to_punching(void)
{
	f.res_unmap = 0;
	f.res_zero = -EOPNOTSUPP;
	run(BDEV_WRITE_ZEROES, false);
	ASSERT_EQ(f.submits, 2);
	ASSERT_TRUE(!f.unmap_seen[0] && f.unmap_seen[1]);
	ASSERT_EQ(f.cb_res, 0);
}

/* Neither works: one retry only, and the error reaches the caller. */
static void test_write_zeroes_retries_once(void)
{
	f.res_unmap = -EOPNOTSUPP;
	f.res_zero = -EINVAL;
	run(BDEV_WRITE_ZEROES, true);
	ASSERT_EQ(f.submits, 2);
	ASSERT_EQ(f.cb_res, -EINVAL);
	run(BDEV_WRITE_ZEROES, false);
	ASSERT_EQ(f.submits, 2);
	ASSERT_EQ(f.cb_res, -EOPNOTSUPP);
}

/* A real I/O error is not "unsupported": no retry. */
static void test_write_zeroes_io_error_not_retried(void)
{
	f.res_unmap = -EIO;
	f.res_zero = 0;
	run(BDEV_WRITE_ZEROES, true);
	ASSERT_EQ(f.submits, 1);
	ASSERT_EQ(f.cb_res, -EIO);
}

/* Discard is advisory: "cannot" is success, a real error is not. */
static void test_discard_unsupported_is_success(void)
{
	f.res_other = -EOPNOTSUPP;
	run(BDEV_DISCARD, false);
	ASSERT_EQ(f.submits, 1);
	ASSERT_EQ(f.cb_res, 0);
	f.res_other = -EIO;
	run(BDEV_DISCARD, false);
	ASSERT_EQ(f.cb_res, -EIO);
}

int main(void)
{
	RUN(test_write_zeroes_unmap_falls_back_to_zeroing);
	RUN(test_write_zeroes_falls_back_to_punching);
	RUN(test_write_zeroes_retries_once);
	RUN(test_write_zeroes_io_error_not_retried);
	RUN(test_discard_unsupported_is_success);
	return T_EXIT_PASS;
}
