/*
 * Description: backend rules shared by every engine (bdev.c, lock.c):
 * discard is advisory, write zeroes is tried the other way once (unmap <->
 * zero range) when the disk cannot do the first, other errors pass
 * through; a short transfer never changes the submitter's iovecs; the
 * image lock excludes a second writer, in QEMU's lock-byte convention;
 * io_uring does a tmpfs file's reads and writes on the calling thread,
 * at the kick (or in a bottom half without one), counted, with a bounded
 * stack.
 * A fake engine answers each submission as told.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include "test.h"

#include "backend/bdev.h"
#include "util/sys.h"
#include "loop/loop.h"
#include "util/compiler.h"

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

/* ---- Short transfers ---- */

/* A fake engine that stores `short_n` bytes, consumes them, then the rest. */
static void short_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	size_t n = 100, left;

	(void)c;
	f.submits++;
	for (size_t i = 0, done = 0; done < n; i++) {
		size_t k = MIN(io->iov[i].iov_len, n - done);

		memset(io->iov[i].iov_base, 0x5a, k);
		done += k;
	}
	ASSERT_EQ(bdev_io_consume(io, n), 0);
	left = io->len;
	for (unsigned i = 0; i < io->iovcnt; i++) {
		memset(io->iov[i].iov_base, 0x5a, io->iov[i].iov_len);
		left -= io->iov[i].iov_len;
	}
	ASSERT_EQ(left, 0);
	bdev_complete(io, 0);
}

static const struct bdev_engine short_engine = {
	.name = "short",
	.submit = short_submit,
};

/* What the iovecs describe is what the submitter must find afterwards (to
 * log what a read stored, for migration): consume works on a copy. */
static void test_short_read_keeps_submitter_iovecs(void)
{
	static uint8_t a[64], b[4096];
	struct bdev bd = { .fd = -1, .block_size = 512, .size = 1 << 20,
			   .engine = &short_engine };
	struct iovec iov[2] = { { a, sizeof(a) }, { b, sizeof(b) } }, orig[2];
	struct bdev_io io = { .op = BDEV_READ, .iov = iov, .iovcnt = 2, .cb = done };

	memcpy(orig, iov, sizeof(iov));
	f.cbs = 0;
	bdev_submit(&bd, NULL, &io);
	ASSERT_EQ(f.cbs, 1);
	ASSERT_EQ(f.cb_res, 0);
	ASSERT_MEM_EQ(iov, orig, sizeof(iov));
	ASSERT_EQ(a[0], 0x5a);
	ASSERT_EQ(b[4095], 0x5a);
}

/* A bounced read (misaligned buffer, O_DIRECT) that came back short:
 * every byte is copied back, not only the last part's length. */
static void test_short_bounced_read_copies_all(void)
{
	static uint8_t buf[4096 + 1];
	struct bdev bd = { .fd = -1, .block_size = 512, .size = 1 << 20, .direct = true,
			   .dio_mem_align = 512, .engine = &short_engine };
	struct iovec iov = { buf + 1, 4096 };
	struct bdev_io io = { .op = BDEV_READ, .iov = &iov, .iovcnt = 1, .cb = done };

	memset(buf, 0, sizeof(buf));
	f.cbs = 0;
	bdev_submit(&bd, NULL, &io);
	ASSERT_EQ(f.cbs, 1);
	ASSERT_EQ(buf[1], 0x5a);
	ASSERT_EQ(buf[4096], 0x5a);
	ASSERT_PTR_EQ(io.iov, &iov);
}

/* ---- Bounced I/O in parts ---- */

static uint8_t disk[3 << 20];
static size_t part_max;

/* A fake disk in memory: stores or loads each part where it says. */
static void mem_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	(void)c;
	f.submits++;
	ASSERT_EQ(io->iovcnt, 1);
	ASSERT_TRUE(io->offset + io->len <= sizeof(disk));
	part_max = MAX(part_max, io->len);
	if (io->op == BDEV_WRITE)
		memcpy(disk + io->offset, io->iov[0].iov_base, io->len);
	else
		memcpy(io->iov[0].iov_base, disk + io->offset, io->len);
	bdev_complete(io, 0);
}

static const struct bdev_engine mem_engine = {
	.name = "mem",
	.submit = mem_submit,
};

/* A guest can make one request as long as the disk out of one misaligned
 * buffer repeated: the copy we make of it goes in parts of at most
 * BDEV_BOUNCE_MAX (it used to be one allocation of the whole length), and
 * each part lands where it belongs, both ways. */
static void test_bounce_goes_in_parts(void)
{
	static uint8_t src[(1 << 20) + 1], dst[(1 << 20) + 1];
	const size_t half = 1 << 19;
	struct bdev bd = { .fd = -1, .block_size = 512, .size = sizeof(disk), .direct = true,
			   .dio_mem_align = 512, .engine = &mem_engine };
	/* 2.5 MiB: the same misaligned MiB twice, then half of it. */
	struct iovec w[3] = { { src + 1, 1 << 20 }, { src + 1, 1 << 20 }, { src + 1, half } };
	struct iovec r[3] = { { dst + 1, half }, { dst + 1, 1 << 20 }, { dst + 1, 1 << 20 } };
	struct bdev_io io = { .op = BDEV_WRITE, .offset = 4096, .iov = w, .iovcnt = 3,
			      .cb = done };

	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (uint8_t)(i * 7 + i / 4096);
	f.cbs = f.submits = 0;
	part_max = 0;
	bdev_submit(&bd, NULL, &io);
	ASSERT_EQ(f.cbs, 1);
	ASSERT_EQ(f.cb_res, 0);
	ASSERT_EQ(f.submits, 3);
	ASSERT_EQ(part_max, BDEV_BOUNCE_MAX);
	ASSERT_MEM_EQ(disk + 4096, src + 1, 1 << 20);
	ASSERT_MEM_EQ(disk + 4096 + (1 << 20), src + 1, 1 << 20);
	ASSERT_MEM_EQ(disk + 4096 + (2 << 20), src + 1, half);
	/* The submitter finds its I/O as it gave it. */
	ASSERT_PTR_EQ(io.iov, w);
	ASSERT_EQ(io.iovcnt, 3);
	ASSERT_EQ(io.offset, 4096);
	ASSERT_TRUE(io.bounce == NULL);

	io = (struct bdev_io){ .op = BDEV_READ, .offset = 4096, .iov = r, .iovcnt = 3,
			       .cb = done };
	f.cbs = f.submits = 0;
	bdev_submit(&bd, NULL, &io);
	ASSERT_EQ(f.cbs, 1);
	ASSERT_EQ(f.submits, 3);
	/* The last iovec (the same buffer as the second) got the disk's
	 * last MiB: src's second half, then its first. */
	ASSERT_MEM_EQ(dst + 1, src + 1 + half, half);
	ASSERT_MEM_EQ(dst + 1 + half, src + 1, half);
}

/* A device that takes buffers at any 4-byte address (NVMe) still wants
 * whole logical blocks in every segment: 516 + 508 bytes is bounced
 * (mem_submit takes one segment only; the bounce was decided by buffer
 * alignment alone, and the kernel failed such a request). */
static void test_bounce_segment_lengths(void)
{
	static uint8_t a[1024] __attribute__((aligned(512))), b[1024];
	struct bdev bd = { .fd = -1, .block_size = 512, .size = sizeof(disk), .direct = true,
			   .dio_mem_align = 4, .dio_len_align = 512, .engine = &mem_engine };
	struct iovec odd[2] = { { a, 516 }, { b, 508 } };
	struct bdev_io io = { .op = BDEV_WRITE, .iov = odd, .iovcnt = 2, .cb = done };

	f.cbs = f.submits = 0;
	bdev_submit(&bd, NULL, &io);
	ASSERT_EQ(f.cbs, 1);
	ASSERT_EQ(f.submits, 1);
	ASSERT_EQ(f.cb_res, 0);
	ASSERT_PTR_EQ(io.iov, odd);
}

/* ---- More I/O than an engine's depth ---- */

static char img[] = "/tmp/test_bdev.XXXXXX";
static unsigned ndone, nfail;

static void count_done(struct bdev_io *io, int res)
{
	(void)io;
	if (res == 0)
		ndone++;
	else
		nfail++;
}

/* blk.c gives an iothread's engine one depth, and the rings that thread
 * owns can hold more: every engine takes the excess and completes it (aio
 * failed it with EBUSY), writes and then reads with the disk's own cache
 * rule (O_DIRECT where it can). */
static void test_more_io_than_depth(void)
{
	static const char *const engines[] = { "aio", "io_uring", "threads" };
	enum { DEPTH = 8, N = 200 };	/* io_uring: an SQ of 64 */

	for (unsigned e = 0; e < ARRAY_SIZE(engines); e++) {
		struct bdev_opts o = { .path = img, .engine = engines[e],
				       .cache = BDEV_CACHE_AUTO };
		static struct bdev_io ios[N];
		static struct iovec iov[N];
		struct bdev b;
		struct loop *l;
		struct bdev_ctx *c;
		char err[256];

		if (bdev_open(&o, &b, err, sizeof(err)) < 0)
			T_FAIL("bdev_open %s: %s", engines[e], err);
		ASSERT_EQ(loop_new("t", &l), 0);
		ASSERT_EQ(bdev_ctx_new(&b, l, DEPTH, &c), 0);
		for (int op = 0; op < 2; op++) {
			ndone = nfail = 0;
			for (unsigned i = 0; i < N; i++) {
				if (!iov[i].iov_base)
					ASSERT_EQ(posix_memalign(&iov[i].iov_base, 4096, 4096), 0);
				iov[i].iov_len = 4096;
				memset(iov[i].iov_base, op ? 0 : (int)(i + e + 1), 4096);
				ios[i] = (struct bdev_io){ .op = op ? BDEV_READ : BDEV_WRITE,
							   .offset = (uint64_t)i * 4096,
							   .iov = &iov[i], .iovcnt = 1,
							   .cb = count_done };
				bdev_submit(&b, c, &ios[i]);
			}
			b.engine->kick(c);
			b.engine->drain(c);
			ASSERT_EQ(nfail, 0);
			ASSERT_EQ(ndone, N);
		}
		for (unsigned i = 0; i < N; i++)
			ASSERT_EQ(((uint8_t *)iov[i].iov_base)[4095], (uint8_t)(i + e + 1));
		b.engine->ctx_free(c);
		loop_free(l);
		bdev_close(&b);
	}
}

/* ---- io_uring on tmpfs: reads and writes on the calling thread ---- */

static char shm_img[] = "/dev/shm/test_bdev.XXXXXX";

enum { SYNC_N = 64, CHAIN_N = 100000 };

static struct {
	struct bdev *b;
	struct bdev_ctx *c;
	struct bdev_io io;
	struct iovec iov;
	unsigned left;
	uintptr_t sp0, sp_min, sp_max;
} chain;

/* Each completion submits the next read from inside its callback, as a
 * front that takes its next request there would. */
static void chain_done(struct bdev_io *io, int res)
{
	uintptr_t sp = (uintptr_t)&res;

	ASSERT_EQ(res, 0);
	if (!chain.sp0)
		chain.sp0 = chain.sp_min = chain.sp_max = sp;
	chain.sp_min = MIN(chain.sp_min, sp);
	chain.sp_max = MAX(chain.sp_max, sp);
	if (--chain.left)
		bdev_submit(chain.b, chain.c, io);
}

static void open_shm(struct bdev *b, bool no_sync)
{
	struct bdev_opts o = { .path = shm_img, .engine = "io_uring",
			       .cache = BDEV_CACHE_AUTO, .no_sync_io = no_sync };
	char err[256];

	if (bdev_open(&o, b, err, sizeof(err)) < 0)
		T_FAIL("bdev_open: %s", err);
	ASSERT_TRUE(b->memory_fs);
}

/* Writes then reads, two per kick: queued by bdev_submit, done at the
 * kick, none on the ring (submits 0), the counter says so, the data is
 * what was written; a flush still goes through the ring.  Then a kick
 * with more queued than a few: one batch on the ring, none done here. */
static void test_uring_tmpfs_sync_io(void)
{
	static struct bdev_io ios[SYNC_N];
	static struct iovec iov[SYNC_N];
	struct bdev b;
	struct loop *l;
	struct bdev_ctx *c;

	open_shm(&b, false);
	ASSERT_EQ(loop_new("t", &l), 0);
	ASSERT_EQ(bdev_ctx_new(&b, l, 8, &c), 0);
	for (int op = 0; op < 2; op++) {
		ndone = nfail = 0;
		for (unsigned i = 0; i < SYNC_N; i++) {
			if (!iov[i].iov_base)
				ASSERT_EQ(posix_memalign(&iov[i].iov_base, 4096, 4096), 0);
			iov[i].iov_len = 4096;
			memset(iov[i].iov_base, op ? 0 : (int)(i + 7), 4096);
			ios[i] = (struct bdev_io){ .op = op ? BDEV_READ : BDEV_WRITE,
						   .offset = (uint64_t)i * 4096,
						   .iov = &iov[i], .iovcnt = 1, .cb = count_done };
			bdev_submit(&b, c, &ios[i]);
			if (i % 2) {
				ASSERT_EQ(ndone, i - 1);
				b.engine->kick(c);
				ASSERT_EQ(ndone, i + 1);
			}
		}
	}
	ASSERT_EQ(nfail, 0);
	for (unsigned i = 0; i < SYNC_N; i++)
		ASSERT_EQ(((uint8_t *)iov[i].iov_base)[4095], (uint8_t)(i + 7));
	ASSERT_EQ(bdev_ctx_sync_ios(&b, c), 2 * SYNC_N);
	ASSERT_EQ(bdev_ctx_submits(&b, c), 0);

	ndone = 0;
	ios[0] = (struct bdev_io){ .op = BDEV_FLUSH, .cb = count_done };
	bdev_submit(&b, c, &ios[0]);
	b.engine->kick(c);
	b.engine->drain(c);
	ASSERT_EQ(ndone, 1);
	ASSERT_EQ(bdev_ctx_submits(&b, c), 1);
	ASSERT_EQ(bdev_ctx_sync_ios(&b, c), 2 * SYNC_N);

	ndone = 0;
	for (unsigned i = 0; i < SYNC_N; i++) {
		memset(iov[i].iov_base, 0, 4096);
		ios[i] = (struct bdev_io){ .op = BDEV_READ, .offset = (uint64_t)i * 4096,
					   .iov = &iov[i], .iovcnt = 1, .cb = count_done };
		bdev_submit(&b, c, &ios[i]);
	}
	b.engine->kick(c);
	b.engine->drain(c);
	ASSERT_EQ(ndone, SYNC_N);
	ASSERT_EQ(nfail, 0);
	ASSERT_EQ(bdev_ctx_sync_ios(&b, c), 2 * SYNC_N);
	ASSERT_EQ(bdev_ctx_submits(&b, c), 2);
	for (unsigned i = 0; i < SYNC_N; i++) {
		ASSERT_EQ(((uint8_t *)iov[i].iov_base)[4095], (uint8_t)(i + 7));
		free(iov[i].iov_base);
	}
	b.engine->ctx_free(c);
	loop_free(l);
	bdev_close(&b);
}

/* CHAIN_N reads, each submitted by the last one's callback: all done
 * in the one kick, and the stack did not grow with the chain (a call per
 * read would need megabytes of it). */
static void test_uring_tmpfs_chain_keeps_stack(void)
{
	struct bdev b;
	struct loop *l;
	static char buf[512];

	open_shm(&b, false);
	ASSERT_EQ(loop_new("t", &l), 0);
	ASSERT_EQ(bdev_ctx_new(&b, l, 8, &chain.c), 0);
	chain.b = &b;
	chain.left = CHAIN_N;
	chain.iov = (struct iovec){ buf, sizeof(buf) };
	chain.io = (struct bdev_io){ .op = BDEV_READ, .offset = 4096, .iov = &chain.iov,
				     .iovcnt = 1, .cb = chain_done };
	bdev_submit(&b, chain.c, &chain.io);
	b.engine->kick(chain.c);
	ASSERT_EQ(chain.left, 0);
	ASSERT_EQ(bdev_ctx_sync_ios(&b, chain.c), CHAIN_N);
	ASSERT_TRUE(chain.sp_max - chain.sp_min < 16384);
	b.engine->ctx_free(chain.c);
	loop_free(l);
	bdev_close(&b);
}

static void stop_loop(void *opaque)
{
	loop_stop(opaque);
}

/* A submitter that never kicks: the bottom half does them, in the
 * loop's next pass. */
static void test_uring_tmpfs_without_kick(void)
{
	static char buf[4096];
	struct iovec iov = { buf, sizeof(buf) };
	struct bdev_io io = { .op = BDEV_READ, .iov = &iov, .iovcnt = 1, .cb = count_done };
	struct loop_timer *t;
	struct bdev b;
	struct loop *l;
	struct bdev_ctx *c;

	open_shm(&b, false);
	ASSERT_EQ(loop_new("t", &l), 0);
	ASSERT_EQ(bdev_ctx_new(&b, l, 8, &c), 0);
	ASSERT_EQ(loop_timer_new(l, stop_loop, l, &t), 0);
	ndone = nfail = 0;
	bdev_submit(&b, c, &io);
	ASSERT_EQ(ndone, 0);
	loop_timer_mod(t, loop_now(l) + 20000000);
	ASSERT_EQ(loop_run(l), 0);
	ASSERT_EQ(ndone, 1);
	ASSERT_EQ(bdev_ctx_sync_ios(&b, c), 1);
	loop_timer_free(t);
	b.engine->ctx_free(c);
	loop_free(l);
	bdev_close(&b);
}

/* --no-sync-io: the ring, as for any file. */
static void test_uring_tmpfs_no_sync_io(void)
{
	static char buf[4096];
	struct iovec iov = { buf, sizeof(buf) };
	struct bdev_io io = { .op = BDEV_READ, .iov = &iov, .iovcnt = 1, .cb = count_done };
	struct bdev b;
	struct loop *l;
	struct bdev_ctx *c;

	open_shm(&b, true);
	ASSERT_EQ(loop_new("t", &l), 0);
	ASSERT_EQ(bdev_ctx_new(&b, l, 8, &c), 0);
	ndone = nfail = 0;
	bdev_submit(&b, c, &io);
	b.engine->kick(c);
	b.engine->drain(c);
	ASSERT_EQ(ndone, 1);
	ASSERT_EQ(bdev_ctx_sync_ios(&b, c), 0);
	ASSERT_EQ(bdev_ctx_submits(&b, c), 1);
	b.engine->ctx_free(c);
	loop_free(l);
	bdev_close(&b);
}

/* A disk handed over by the process we replace (upgrade) is bdev_open's
 * from the call on: closed whichever check refuses it (a wrong backend,
 * not a file, opened read-only for a writable disk), kept on success. */
static void test_taken_fd_closed_on_every_error(void)
{
	static const struct {
		const char *path, *engine;
	} cases[] = {
		{ "(img)", "nosuch" },		/* unknown backend */
		{ "/dev/null", "threads" },	/* a character device */
		{ "(img)", "threads" },		/* O_RDONLY, served writable */
	};

	for (unsigned i = 0; i < ARRAY_SIZE(cases); i++) {
		bool is_img = !strcmp(cases[i].path, "(img)");
		int fd = open(is_img ? img : cases[i].path, O_RDONLY | O_CLOEXEC);
		struct bdev_opts o = { .path = is_img ? img : cases[i].path,
				       .engine = cases[i].engine,
				       .cache = BDEV_CACHE_WRITEBACK, .take_fd = true, .fd = fd };
		struct bdev b;
		char err[256];

		ASSERT_TRUE(fd >= 0);
		ASSERT_TRUE(bdev_open(&o, &b, err, sizeof(err)) < 0);
		ASSERT_EQ(fcntl(fd, F_GETFD), -1);
		ASSERT_EQ(errno, EBADF);
	}
	{
		int fd = open(img, O_RDWR | O_CLOEXEC);
		struct bdev_opts o = { .path = img, .engine = "threads",
				       .cache = BDEV_CACHE_WRITEBACK, .take_fd = true, .fd = fd };
		struct bdev b;
		char err[256];

		ASSERT_TRUE(fd >= 0);
		if (bdev_open(&o, &b, err, sizeof(err)) < 0)
			T_FAIL("bdev_open: %s", err);
		ASSERT_EQ(b.fd, fd);
		bdev_close(&b);
	}
}

/* Never called: its presence makes a network engine. */
static int fake_open(struct bdev *b, const struct bdev_opts *o, char *err, size_t errlen)
{
	return -ENOSYS;
}

/* Through the page cache a failed flush is the last word Linux says about
 * the pages it could not write (they are marked clean; the next fdatasync
 * succeeds): every later flush fails without asking the disk, writes go on;
 * a failed write-through write counts as a failed flush.  O_DIRECT and
 * network disks keep their own rules. */
static void test_failed_flush_fails_every_later_flush(void)
{
	static const struct bdev_engine net_engine = {
		.name = "fake-net", .submit = fake_submit, .open = fake_open,
	};
	int fd = open("/dev/null", O_RDWR | O_CLOEXEC);

	ASSERT_TRUE(fd >= 0);
	for (int kind = 0; kind < 4; kind++) {
		/* 0: page cache, flush fails; 1: page cache, FUA write fails;
		 * 2: O_DIRECT; 3: a network disk. */
		struct bdev b = { .fd = fd, .block_size = 512, .size = 1 << 20,
				  .direct = kind == 2, .dio_mem_align = 1,
				  .engine = kind == 3 ? &net_engine : &fake_engine };
		struct iovec iov = { .iov_base = (char[512]){ 0 }, .iov_len = 512 };
		struct bdev_io io = { .op = kind == 1 ? BDEV_WRITE : BDEV_FLUSH, .fua = kind == 1,
				      .iov = &iov, .iovcnt = 1, .cb = done };
		bool sticky = kind < 2;

		f.res_other = -EIO;
		f.submits = f.cbs = 0;
		bdev_submit(&b, NULL, &io);
		ASSERT_EQ(f.cb_res, -EIO);
		/* The disk is fine again: only the page cache's loss remains. */
		f.res_other = 0;
		for (int i = 0; i < 2; i++) {
			io = (struct bdev_io){ .op = BDEV_FLUSH, .cb = done };
			bdev_submit(&b, NULL, &io);
			ASSERT_EQ(f.cb_res, sticky ? -EIO : 0);
		}
		ASSERT_EQ(f.submits, sticky ? 1 : 3);	/* not asked again */
		io = (struct bdev_io){ .op = BDEV_WRITE, .iov = &iov, .iovcnt = 1, .cb = done };
		bdev_submit(&b, NULL, &io);
		ASSERT_EQ(f.cb_res, 0);
		ASSERT_EQ(atomic_load(&b.cache_lost), sticky);
	}
	close(fd);
}

/* ---- The image lock ---- */

static void open_disk(struct bdev *b, bool read_only)
{
	struct bdev_opts o = { .path = img, .engine = "threads", .read_only = read_only,
			       .cache = BDEV_CACHE_WRITEBACK };
	char err[256];

	if (bdev_open(&o, b, err, sizeof(err)) < 0)
		T_FAIL("bdev_open: %s", err);
}

/* A lock on one byte of img through a third open, as QEMU takes it. */
static int qemu_lock(off_t byte, short type)
{
	int fd = open(img, O_RDWR | O_CLOEXEC);
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = byte,
			    .l_len = 1 };

	ASSERT_TRUE(fd >= 0);
	ASSERT_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
	return fd;
}

/* Two writers exclude each other; the lock is free again once released. */
static void test_lock_excludes_second_writer(void)
{
	struct bdev a, b;

	open_disk(&a, false);
	open_disk(&b, false);
	ASSERT_TRUE(!bdev_lock_busy(&b));
	ASSERT_EQ(bdev_lock(&a, 0), 0);
	ASSERT_EQ(bdev_lock(&a, 0), 0);		/* held: nothing to do */
	ASSERT_TRUE(bdev_lock_busy(&b));
	ASSERT_EQ(bdev_lock(&b, 0), -EBUSY);
	ASSERT_TRUE(!b.locked);
	bdev_unlock(&a);
	ASSERT_EQ(bdev_lock(&b, 0), 0);
	ASSERT_EQ(bdev_lock(&a, 0), -EBUSY);
	bdev_close(&b);				/* closing the disk drops it */
	ASSERT_EQ(bdev_lock(&a, 0), 0);
	bdev_unlock(&a);
	bdev_close(&a);
}

struct late_release {
	struct bdev *holder;
	unsigned after_ms;
};

static void *release_later(void *arg)
{
	struct late_release *lr = arg;

	usleep(lr->after_ms * 1000);
	bdev_close(lr->holder);
	return NULL;
}

/* A holder that lets go within the wait (a vblkd killed a moment ago
 * whose io_uring still holds the file): the lock is taken once it is
 * free; one that does not: refused after the wait, not before. */
static void test_lock_waits_for_a_holder_going(void)
{
	struct bdev a, b;
	struct late_release lr = { &a, 100 };
	pthread_t t;
	uint64_t t0;

	open_disk(&a, false);
	open_disk(&b, false);
	ASSERT_EQ(bdev_lock(&a, 0), 0);
	t0 = sys_now_ns();
	ASSERT_EQ(bdev_lock(&b, 50), -EBUSY);
	ASSERT_TRUE(sys_now_ns() - t0 >= 50000000ull);
	ASSERT_EQ(pthread_create(&t, NULL, release_later, &lr), 0);
	ASSERT_EQ(bdev_lock(&b, BDEV_LOCK_WAIT_MS), 0);
	ASSERT_TRUE(b.locked);
	pthread_join(t, NULL);
	bdev_unlock(&b);
	bdev_close(&b);
}

/* QEMU/qemu-storage-daemon with the image open for writing (a shared lock
 * on byte 101) or refusing writers (byte 201) conflict; a reader that
 * lets others write (byte 100 only) does not; a read-only export takes
 * no lock at all. */
static void test_lock_follows_qemu_lock_bytes(void)
{
	struct bdev a, ro;
	int q;

	open_disk(&a, false);
	q = qemu_lock(101, F_RDLCK);
	ASSERT_EQ(bdev_lock(&a, 0), -EBUSY);
	close(q);
	q = qemu_lock(201, F_RDLCK);
	ASSERT_EQ(bdev_lock(&a, 0), -EBUSY);
	close(q);
	q = qemu_lock(100, F_RDLCK);
	ASSERT_EQ(bdev_lock(&a, 0), 0);
	close(q);
	/* And QEMU, coming second, finds our bytes taken. */
	{
		int fd = open(img, O_RDWR | O_CLOEXEC);
		struct flock fl = { .l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 101,
				    .l_len = 1 };

		ASSERT_TRUE(fd >= 0);
		ASSERT_TRUE(fcntl(fd, F_OFD_SETLK, &fl) < 0);
		close(fd);
	}
	open_disk(&ro, true);
	ASSERT_EQ(bdev_lock(&ro, 0), 0);
	ASSERT_TRUE(!ro.locked);
	bdev_close(&ro);
	bdev_unlock(&a);
	bdev_close(&a);
}

int main(void)
{
	RUN(test_write_zeroes_unmap_falls_back_to_zeroing);
	RUN(test_write_zeroes_falls_back_to_punching);
	RUN(test_write_zeroes_retries_once);
	RUN(test_write_zeroes_io_error_not_retried);
	RUN(test_discard_unsupported_is_success);
	RUN(test_short_read_keeps_submitter_iovecs);
	RUN(test_short_bounced_read_copies_all);
	RUN(test_bounce_goes_in_parts);
	RUN(test_bounce_segment_lengths);
	RUN(test_failed_flush_fails_every_later_flush);
	{
		int fd = mkstemp(img);

		ASSERT_TRUE(fd >= 0);
		ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
		close(fd);
		RUN(test_more_io_than_depth);
		RUN(test_taken_fd_closed_on_every_error);
		RUN(test_lock_excludes_second_writer);
		RUN(test_lock_waits_for_a_holder_going);
		RUN(test_lock_follows_qemu_lock_bytes);
		unlink(img);
	}
	{
		int fd = mkstemp(shm_img);
		struct statfs sf;

		if (fd < 0 || fstatfs(fd, &sf) < 0 || sf.f_type != TMPFS_MAGIC) {
			fprintf(stderr, "  (no tmpfs at /dev/shm: the io_uring tmpfs cases skipped)\n");
		} else {
			ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
			RUN(test_uring_tmpfs_sync_io);
			RUN(test_uring_tmpfs_chain_keeps_stack);
			RUN(test_uring_tmpfs_without_kick);
			RUN(test_uring_tmpfs_no_sync_io);
		}
		if (fd >= 0) {
			close(fd);
			unlink(shm_img);
		}
	}
	return T_EXIT_PASS;
}
