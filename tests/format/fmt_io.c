/*
 * fmt-io: drive an image through the format layer (format.h) the way blk
 * does, with a seeded random mix of writes, reads, discards, write
 * zeroes, flushes and (optionally) a grow, and apply the same to a raw
 * file: the model.  Every read is checked against the model; a discarded
 * range must read, block by block, as before, as zeroes, or (--orig: the
 * disk as it was at the start, a v2 image's discard shows the backing
 * file again, as QEMU's does) as at the start; the model takes what it
 * reads.  At the end the whole disk is compared, and the
 * caller can hold the image against the raw file with qemu-img compare
 * (QEMU's reading of our metadata) and qemu-img check.
 *
 *   fmt-io IMAGE RAW SEED OPS [--grow BYTES] [--engine E] [--max-len BYTES]
 *          [--orig RAW0] [--key-file F] [--ceph-conf F] [--split on]
 *
 * IMAGE may be a network disk (rbd:POOL/IMAGE, nbd://...): its engine
 * then (the module, as vblkd loads it).
 *
 * RAW must be the image's contents before (qemu-img convert -O raw).
 * Prints one summary line; exit 0 when every check held, 1 otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/bdev.h"
#include "format/format.h"
#include "loop/loop.h"
#include "util/log.h"

static struct bdev file;
static struct bdev *disk;
static struct bdev_ctx *ctx;
static int rawfd, origfd = -1;
static uint64_t rng;
static unsigned bad;
static int last_res;
static unsigned done;

static uint64_t next(void)	/* xorshift64* */
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 2685821657736338717ull;
}

static void cb(struct bdev_io *io, int res)
{
	(void)io;
	last_res = res;
	done++;
}

/* One I/O, run to completion. */
static bool split;	/* --split: buffers in three parts at odd places */

static int run(enum bdev_op op, uint64_t off, uint64_t len, void *buf, bool unmap)
{
	struct iovec iov[3] = { { buf, (size_t)len } };
	struct bdev_io io = { .op = op, .offset = off, .unmap = unmap, .cb = cb };
	unsigned before = done;

	if (op == BDEV_READ || op == BDEV_WRITE) {
		io.iov = iov;
		io.iovcnt = 1;
		/* A guest's buffers need not hold whole sectors each: 700
		 * bytes, 1300, the rest (a sector across all three when
		 * sectors are 4096). */
		if (split && len > 2000) {
			iov[0].iov_len = 700;
			iov[1] = (struct iovec){ (uint8_t *)buf + 700, 1300 };
			iov[2] = (struct iovec){ (uint8_t *)buf + 2000, (size_t)len - 2000 };
			io.iovcnt = 3;
		}
	} else if (op != BDEV_FLUSH) {
		io.length = len;
	}
	bdev_submit(disk, ctx, &io);
	disk->engine->kick(ctx);
	disk->engine->drain(ctx);
	if (done != before + 1) {
		fprintf(stderr, "fmt-io: an I/O did not complete\n");
		exit(1);
	}
	return last_res;
}

static void raw_io(bool write, void *buf, uint64_t len, uint64_t off)
{
	ssize_t n = write ? pwrite(rawfd, buf, (size_t)len, (off_t)off)
			  : pread(rawfd, buf, (size_t)len, (off_t)off);

	if (n < 0) {
		perror("fmt-io: the raw model");
		exit(1);
	}
	if (!write && (uint64_t)n < len)
		memset((uint8_t *)buf + n, 0, (size_t)(len - (uint64_t)n));
}

static void check(const char *what, uint64_t off, const uint8_t *got, const uint8_t *want,
		  uint64_t len)
{
	for (uint64_t i = 0; i < len; i++)
		if (got[i] != want[i]) {
			if (bad++ < 5)
				fprintf(stderr, "fmt-io: %s: byte %llu is %#x, the model has %#x\n",
					what, (unsigned long long)(off + i), got[i], want[i]);
			return;
		}
}

int main(int argc, char **argv)
{
	const char *engine = NULL;
	uint64_t grow = 0, max_len = 256 << 10, ops, size;
	struct bdev_opts bo = { .cache = BDEV_CACHE_AUTO };
	struct fmt_opts fo = { .kind = FMT_AUTO, .bo = &bo };
	unsigned counts[6] = { 0 };
	struct fmt_stats fs;
	uint8_t *a, *b, *o0;
	struct loop *l;
	char err[512];
	int r;

	if (argc < 5) {
		fprintf(stderr, "usage: fmt-io IMAGE RAW SEED OPS [--grow BYTES] [--engine E] "
			"[--max-len BYTES]\n");
		return 2;
	}
	rng = strtoull(argv[3], NULL, 0) * 0x9e3779b97f4a7c15ull | 1;
	ops = strtoull(argv[4], NULL, 0);
	for (int i = 5; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--grow"))
			grow = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--engine"))
			engine = argv[i + 1];
		else if (!strcmp(argv[i], "--max-len"))
			max_len = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--split"))
			split = !strcmp(argv[i + 1], "on");
		else if (!strcmp(argv[i], "--ceph-conf"))
			bo.ceph_conf = argv[i + 1];
		else if (!strcmp(argv[i], "--key-file"))
			fo.key_file = argv[i + 1];
		else if (!strcmp(argv[i], "--orig") && (origfd = open(argv[i + 1], O_RDONLY)) < 0) {
			perror(argv[i + 1]);
			return 1;
		}
	}
	log_set_level(LOG_WARN);
	bo.path = argv[1];
	/* Files through the threads engine unless told; a network disk's
	 * form names its own. */
	if (!engine && strncmp(argv[1], "rbd:", 4) && !strstr(argv[1], "://"))
		engine = "threads";
	bo.engine = engine;
	if (bdev_open(&bo, &file, err, sizeof(err)) < 0 ||
	    fmt_open(&file, &fo, &disk, err, sizeof(err)) < 0) {
		fprintf(stderr, "fmt-io: %s\n", err);
		return 1;
	}
	rawfd = open(argv[2], O_RDWR);
	if (rawfd < 0) {
		perror(argv[2]);
		return 1;
	}
	if (loop_new("fmt-io", &l) < 0 || bdev_ctx_new(disk, l, 64, &ctx) < 0) {
		fprintf(stderr, "fmt-io: no context\n");
		return 1;
	}
	/* As the device does when its first ring starts (format.h). */
	if (fmt_claim(disk, err, sizeof(err)) < 0) {
		fprintf(stderr, "fmt-io: %s\n", err);
		return 1;
	}
	if (posix_memalign((void **)&a, 4096, max_len) || posix_memalign((void **)&b, 4096, max_len) ||
	    !(o0 = calloc(1, max_len)))
		return 1;
	size = disk->size;
	for (uint64_t i = 0; i < ops; i++) {
		uint64_t len = 512 * (1 + next() % (max_len / 512));
		uint64_t off, kind = next() % 100;

		if (grow && i == ops / 2) {
			/* Grow, as vblkctl resize does (main thread, no iothread). */
			if ((r = bdev_resize(disk, grow, err, sizeof(err))) < 0) {
				fprintf(stderr, "fmt-io: grow to %llu: %s\n",
					(unsigned long long)grow, err);
				return 1;
			}
			if (ftruncate(rawfd, (off_t)grow) < 0)
				return 1;
			size = grow;
		}
		len = len > size ? size : len;
		off = 512 * (next() % ((size - len) / 512 + 1));
		/* Some requests aligned to 64 KiB, so whole clusters are hit. */
		if (next() % 4 == 0) {
			off &= ~0xffffull;
			if (len >= 65536)
				len &= ~0xffffull;
		}
		/* Whole blocks of the disk (4 KiB for a LUKS disk with 4 KiB
		 * sectors), as blk sends them. */
		off -= off % disk->block_size;
		len -= len % disk->block_size;
		if (!len)
			len = disk->block_size;
		/* What the disk does not offer is a read instead. */
		if (kind >= 70 && kind < 92 &&
		    !(disk->caps & (kind < 80 ? BDEV_CAP_DISCARD : BDEV_CAP_WRITE_ZEROES)))
			kind = 50;
		if (kind < 40) {
			for (uint64_t j = 0; j < len; j += 8) {
				uint64_t v = next();

				memcpy(a + j, &v, 8);
			}
			if ((r = run(BDEV_WRITE, off, len, a, false)) < 0)
				goto io_error;
			raw_io(true, a, len, off);
			counts[0]++;
		} else if (kind < 70) {
			if ((r = run(BDEV_READ, off, len, a, false)) < 0)
				goto io_error;
			raw_io(false, b, len, off);
			check("read", off, a, b, len);
			counts[1]++;
		} else if (kind < 80) {
			/* Discard: each block reads as before or as zeroes. */
			raw_io(false, b, len, off);
			if ((r = run(BDEV_DISCARD, off, len, NULL, false)) < 0)
				goto io_error;
			if ((r = run(BDEV_READ, off, len, a, false)) < 0)
				goto io_error;
			memset(o0, 0, len);
			if (origfd >= 0 && pread(origfd, o0, (size_t)len, (off_t)off) < 0)
				return 1;
			for (uint64_t j = 0; j < len; j += 512) {
				static const uint8_t zero[512];

				if (memcmp(a + j, b + j, 512) && memcmp(a + j, zero, 512) &&
				    memcmp(a + j, o0 + j, 512) && bad++ < 5)
					fprintf(stderr, "fmt-io: block %llu reads neither as before "
						"nor as zeroes after a discard\n",
						(unsigned long long)(off + j) / 512);
			}
			raw_io(true, a, len, off);
			counts[2]++;
		} else if (kind < 92) {
			bool unmap = next() & 1;

			if ((r = run(BDEV_WRITE_ZEROES, off, len, NULL, unmap)) < 0)
				goto io_error;
			memset(b, 0, len);
			raw_io(true, b, len, off);
			counts[3]++;
		} else {
			if ((r = run(BDEV_FLUSH, 0, 0, NULL, false)) < 0)
				goto io_error;
			counts[4]++;
		}
	}
	/* The whole disk against the model. */
	for (uint64_t off = 0; off < size; off += max_len) {
		uint64_t len = size - off < max_len ? size - off : max_len;

		if ((r = run(BDEV_READ, off, len, a, false)) < 0)
			goto io_error;
		raw_io(false, b, len, off);
		check("final read", off, a, b, len);
	}
	fmt_stats(disk, &fs);
	disk->engine->ctx_free(ctx);
	loop_free(l);
	if ((r = fmt_close(disk, &file)) < 0) {
		fprintf(stderr, "fmt-io: closing: %s\n", strerror(-r));
		return 1;
	}
	bdev_close(&file);
	printf("fmt-io: %llu ops (%u writes, %u reads, %u discards, %u write-zeroes, %u flushes), "
	       "%u mismatches, %llu clusters allocated, %llu reused\n", (unsigned long long)ops,
	       counts[0], counts[1], counts[2], counts[3], counts[4], bad,
	       (unsigned long long)fs.clusters_allocated, (unsigned long long)fs.clusters_reused);
	return bad ? 1 : 0;
io_error:
	fprintf(stderr, "fmt-io: an I/O failed: %s\n", strerror(-r));
	return 1;
}
