/* Opening the disk: regular file or block device, size and block sizes,
 * O_DIRECT where possible.  Errors are one line for the user. */
#include "backend/bdev.h"
#include "backend/module.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "util/barrier.h"
#include "util/log.h"

/* Buffer and offset alignment O_DIRECT needs on this file (statx
 * STATX_DIOALIGN, Linux 6.1+), falling back to 512/block size. */
/* One unsigned number from a sysfs file; false if there is none. */
static bool sysfs_u64(const char *path, uint64_t *v)
{
	FILE *f = fopen(path, "re");
	unsigned long long x;
	bool ok;

	if (!f)
		return false;
	ok = fscanf(f, "%llu", &x) == 1;
	fclose(f);
	if (ok)
		*v = x;
	return ok;
}

/* One number from the request queue of block device dev in sysfs (a
 * partition has none of its own: its disk's). */
static bool queue_attr(dev_t dev, const char *name, uint64_t *v)
{
	static const char *const dirs[] = { "queue", "../queue" };
	char path[160];

	for (unsigned i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/%s/%s", major(dev),
			 minor(dev), dirs[i], name);
		if (sysfs_u64(path, v))
			return true;
	}
	return false;
}

/*
 * Discard limits of a block device from its request queue in sysfs.  A device with
 * discard_max_bytes 0 cannot discard at all: we then do not offer
 * VIRTIO_BLK_F_DISCARD, rather than fail every discard the guest sends.
 */
static void blockdev_discard(struct bdev *b, dev_t rdev)
{
	uint64_t max = 0, gran = 0;

	if (!queue_attr(rdev, "discard_max_bytes", &max)) {
		log_info("disk %s: no discard limits in sysfs, assuming block-sized discards",
			 b->path);
		return;
	}
	(void)queue_attr(rdev, "discard_granularity", &gran);
	if (max == 0) {
		b->no_discard = true;
		log_info("disk %s: the device cannot discard; DISCARD not offered", b->path);
	}
	b->discard_max_bytes = max;
	if (gran > b->discard_granularity && gran <= (1u << 30) && !(gran & (gran - 1)))
		b->discard_granularity = (unsigned)gran;
}

/*
 * Polled I/O (--iopoll): io_uring's IORING_SETUP_IOPOLL for reads and
 * writes, on a device with poll queues (queue/io_poll 1 in sysfs: NVMe
 * with nvme.poll_queues=N, virtio-blk with virtio_blk.poll_queues=N,
 * null_blk with poll_queues=N).  Their requests raise no interrupt: the
 * iothread finds their completions by asking the kernel to look, and
 * never sleeps while one is in flight (uring.c).  Elsewhere the kernel
 * fails polled requests that reach the device (EOPNOTSUPP), so auto turns
 * it on only where the queue says it can; on insists, and fails to open
 * otherwise.  dev is
 * the block device, or for a file the device of its file system (one
 * that spans devices, btrfs, has no queue of its own: no polling).
 */
static int disk_iopoll(const struct bdev_opts *o, struct bdev *b, dev_t dev,
		       char *err, size_t errlen)
{
	uint64_t io_poll = 0;
	const char *why = NULL;

	if (o->iopoll == BDEV_IOPOLL_OFF)
		return 0;
	if (b->engine != &bdev_uring_engine)
		why = "it needs --backend io_uring";
	else if (!b->direct)
		why = "it needs O_DIRECT, and the disk is used through the page cache";
	else if (getenv("VBLKD_IOPOLL_UNCHECKED"))
		/* Test hook: poll whatever the queue says, so that a machine
		 * without poll queues exercises the polled ring and its
		 * fallback when the kernel refuses (tests/driver). */
		log_warn("disk %s: VBLKD_IOPOLL_UNCHECKED: polled I/O without asking the "
			 "device", o->path);
	else if (!queue_attr(dev, "io_poll", &io_poll))
		why = "it is on no single block device (no queue/io_poll in sysfs)";
	else if (!io_poll)
		why = "the device has no poll queues (queue/io_poll is 0 in sysfs; "
		      "NVMe: nvme.poll_queues=N)";
	if (why && o->iopoll == BDEV_IOPOLL_ON) {
		snprintf(err, errlen, "--iopoll on for disk '%s': %s; use --iopoll auto",
			 o->path, why);
		return -EINVAL;
	}
	b->iopoll = !why;
	if (b->iopoll)
		log_info("disk %s: polled I/O (the device has poll queues; --iopoll off "
			 "to use interrupts)", o->path);
	return 0;
}

static void dio_alignment(int fd, unsigned *mem_align, unsigned *off_align)
{
	struct statx stx;

	*mem_align = 512;
	*off_align = 512;
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
	    (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_mem_align) {
		*mem_align = stx.stx_dio_mem_align;
		*off_align = stx.stx_dio_offset_align;
	}
}

/* The engine a --disk of this form belongs to (rbd:POOL/IMAGE, an NBD
 * URI), or NULL for a path. */
static const char *disk_form(const char *path)
{
	static const char *const nbd[] = { "nbd://", "nbds://", "nbd+unix://", "nbds+unix://",
					    "nbd+vsock://", "nbds+vsock://" };

	if (!path)
		return NULL;
	if (!strncmp(path, "rbd:", 4))
		return "rbd";
	for (unsigned i = 0; i < sizeof(nbd) / sizeof(nbd[0]); i++)
		if (!strncmp(path, nbd[i], strlen(nbd[i])))
			return "nbd";
	return NULL;
}

/* A disk that is a network client's (rbd, nbd): the engine opens it. */
static int open_engine_disk(const struct bdev_opts *o, struct bdev *b, const char *form,
			    char *err, size_t errlen)
{
	int r;

	if (o->engine && strcmp(o->engine, form)) {
		snprintf(err, errlen, "--disk '%s' is served by the %s backend, not %s: drop "
			 "--backend %s", o->path, form, o->engine, o->engine);
		return -EINVAL;
	}
	if (!bdev_engine_is_module(form)) {
		snprintf(err, errlen, "--disk '%s' needs the %s backend, and this vblkd was "
			 "built without it: install %s and rebuild", o->path, form,
			 !strcmp(form, "rbd") ? "librbd-dev" : "libnbd-dev");
		return -ENOTSUP;
	}
	if (o->uring_sqpoll || o->iopoll == BDEV_IOPOLL_ON) {
		snprintf(err, errlen, "%s needs --backend io_uring",
			 o->uring_sqpoll ? "--uring-sqpoll" : "--iopoll on");
		return -EINVAL;
	}
	r = bdev_engine_load(form, o->path, &b->engine, err, errlen);
	if (r < 0)
		return r;
	b->caps = b->engine->caps;
	b->dio_mem_align = 1;
	b->path = strdup(o->path);
	if (!b->path) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = b->engine->open(b, o, err, errlen);
	if (r < 0) {
		free(b->path);
		b->path = NULL;
	}
	return r;
}

/* A file on tmpfs or ramfs: O_DIRECT there is a copy made on the CPU
 * (by io_uring's worker when it cannot be done without blocking), no
 * device is involved.  (A block device node would report the /dev file
 * system: ask only for files.) */
static bool on_memory_fs(int fd)
{
	struct statfs sf;

	return fstatfs(fd, &sf) == 0 &&
	       (sf.f_type == TMPFS_MAGIC || sf.f_type == RAMFS_MAGIC);
}

/* bdev_open without the handed-over fd's cleanup: never closes o->fd. */
static int open_disk(const struct bdev_opts *o, struct bdev *b, char *err, size_t errlen)
{
	int flags = (o->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
	unsigned mem_align = 512, off_align = 512;
	bool want_direct = o->cache != BDEV_CACHE_WRITEBACK;
	struct stat st;
	uint64_t size;
	int fd, r;

	memset(b, 0, sizeof(*b));
	b->fd = -1;
	if (disk_form(o->path))
		return open_engine_disk(o, b, disk_form(o->path), err, errlen);
	if (o->ceph_conf || o->ceph_id) {
		snprintf(err, errlen, "--ceph-conf and --ceph-id are for --disk rbd:POOL/IMAGE");
		return -EINVAL;
	}
	b->engine = bdev_engine_find(o->engine);
	if (!b->engine) {
		/* Engines that are their own disk (modules) take it from --disk. */
		bool own = bdev_engine_is_module(o->engine);

		snprintf(err, errlen, own ? "--backend %s needs --disk %s" :
			 "unknown backend '%s': use --backend %s", o->engine,
			 own ? (!strcmp(o->engine, "rbd") ? "rbd:POOL/IMAGE" :
				"nbd://HOST[:PORT]/EXPORT") : bdev_engine_names());
		return -EINVAL;
	}
	b->caps = b->engine->caps;
	b->uring_sqpoll = o->uring_sqpoll;
	b->no_early_submit = o->no_early_submit;
	b->no_sync_io = o->no_sync_io;
	if ((o->uring_sqpoll || o->iopoll == BDEV_IOPOLL_ON) && b->engine != &bdev_uring_engine) {
		snprintf(err, errlen, "%s needs --backend io_uring",
			 o->uring_sqpoll ? "--uring-sqpoll" : "--iopoll on");
		return -EINVAL;
	}
	if (b->engine->no_disk && !o->path) {
		/* No file at all: the size is all there is. */
		b->block_size = o->block_size ? o->block_size : 512;
		b->phys_block_size = b->block_size;
		b->size = o->size - o->size % b->block_size;
		b->read_only = o->read_only;
		b->dio_mem_align = 1;
		b->path = strdup("(null)");
		if (!b->size || !b->path) {
			free(b->path);
			snprintf(err, errlen, "--size must be at least one block");
			return -EINVAL;
		}
		return 0;
	}
	if ((o->take_fd ? fstat(o->fd, &st) : stat(o->path, &st)) < 0) {
		r = -errno;
		if (r == -ENOENT)
			snprintf(err, errlen, "disk '%s' does not exist: create it "
				 "(e.g. qemu-img create -f raw %s 1G) or fix --disk",
				 o->path, o->path);
		else
			snprintf(err, errlen, "cannot access disk '%s': %s", o->path,
				 strerror(-r));
		return r;
	}
	if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
		snprintf(err, errlen, "disk '%s' is not a regular file or block "
			 "device: pass an image file or a /dev/ block device", o->path);
		return -EINVAL;
	}

	fd = -1;
	if (o->take_fd) {
		int fl = fcntl(o->fd, F_GETFL);

		fd = o->fd;
		if (fl < 0 || (!o->read_only && (fl & O_ACCMODE) == O_RDONLY)) {
			snprintf(err, errlen, "the disk handed over is not open for writing: "
				 "give the new vblkd the old one's options");
			r = -EINVAL;
			goto err_close;
		}
		b->direct = fl & O_DIRECT;
	} else if (want_direct) {
		fd = open(o->path, flags | O_DIRECT);
		if (fd < 0 && errno == EINVAL && o->cache == BDEV_CACHE_NONE) {
			snprintf(err, errlen, "disk '%s' does not support O_DIRECT "
				 "(--cache=none): use --cache=writeback", o->path);
			return -EINVAL;
		}
		if (fd < 0 && errno != EINVAL)
			goto open_err;
	}
	if (o->take_fd) {
		/* b->direct as the previous process opened it */
	} else if (fd >= 0) {
		b->direct = true;
	} else {
		fd = open(o->path, flags);
		if (fd < 0)
			goto open_err;
	}

	b->is_blockdev = S_ISBLK(st.st_mode);
	if (S_ISBLK(st.st_mode)) {
		int lbs = 512, pbs = 512;

		if (ioctl(fd, BLKGETSIZE64, &size) < 0) {
			r = -errno;
			snprintf(err, errlen, "cannot read the size of '%s': %s",
				 o->path, strerror(-r));
			goto err_close;
		}
		(void)ioctl(fd, BLKSSZGET, &lbs);
		(void)ioctl(fd, BLKPBSZGET, &pbs);
		b->block_size = o->block_size ? o->block_size : (unsigned)lbs;
		b->phys_block_size = (unsigned)pbs;
		mem_align = off_align = (unsigned)lbs;
		if (b->block_size < (unsigned)lbs) {
			snprintf(err, errlen, "--block-size %u is smaller than the "
				 "device's logical block size %d: use --block-size %d",
				 b->block_size, lbs, lbs);
			r = -EINVAL;
			goto err_close;
		}
	} else {
		size = (uint64_t)st.st_size;
		b->block_size = o->block_size ? o->block_size : 512;
		b->phys_block_size = b->block_size;
		if (b->direct)
			dio_alignment(fd, &mem_align, &off_align);
	}

	if (b->direct && off_align > b->block_size) {
		if (o->cache == BDEV_CACHE_NONE) {
			snprintf(err, errlen, "disk '%s' needs %u-byte aligned O_DIRECT "
				 "I/O but the block size is %u: use --block-size %u or "
				 "--cache=writeback", o->path, off_align, b->block_size,
				 off_align);
			r = -EINVAL;
			goto err_close;
		}
		if (o->take_fd) {
			snprintf(err, errlen, "disk '%s' handed over with O_DIRECT needs "
				 "%u-byte aligned I/O, more than the block size %u",
				 o->path, off_align, b->block_size);
			r = -EINVAL;
			goto err_close;
		}
		/* Auto mode: page cache instead of unaligned O_DIRECT. */
		close(fd);
		b->direct = false;
		fd = open(o->path, flags);
		if (fd < 0)
			goto open_err;
	}
	if (want_direct && !b->direct)
		log_info("disk %s: O_DIRECT not usable here, using the page cache "
			 "(--cache=writeback)", o->path);
	b->memory_fs = !b->is_blockdev && on_memory_fs(fd);
	b->device_completes = b->direct && !b->memory_fs;
	r = disk_iopoll(o, b, S_ISBLK(st.st_mode) ? st.st_rdev : st.st_dev, err, errlen);
	if (r < 0)
		goto err_close;

	/* Said by the format layer if it serves the file raw (a qcow2
	 * file's length means nothing to the guest). */
	b->size_tail = (unsigned)(size % b->block_size);
	size -= size % b->block_size;
	if (size == 0) {
		snprintf(err, errlen, "disk '%s' is empty (size < %u bytes): "
			 "resize it (e.g. truncate -s 1G %s)", o->path,
			 b->block_size, o->path);
		r = -EINVAL;
		goto err_close;
	}
	b->path = strdup(o->path);
	if (!b->path) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto err_close;
	}
	b->fd = fd;
	b->size = size;
	b->read_only = o->read_only;
	b->discard_granularity = b->block_size;
	if (S_ISBLK(st.st_mode))
		blockdev_discard(b, st.st_rdev);
	else if (st.st_blksize > (blksize_t)b->block_size && st.st_blksize <= (1 << 20) &&
		 !(st.st_blksize & (st.st_blksize - 1)))
		b->discard_granularity = (unsigned)st.st_blksize;
	b->dio_mem_align = mem_align < 1 ? 1 : mem_align;
	b->dio_len_align = off_align < 1 ? 1 : off_align;
	return 0;

open_err:
	r = -errno;
	if (o->read_only && (r == -EACCES || r == -EPERM))
		snprintf(err, errlen, "disk '%s' is not readable (%s): fix its "
			 "permissions", o->path, strerror(-r));
	else if (r == -EACCES || r == -EROFS || r == -EPERM)
		snprintf(err, errlen, "disk '%s' is not writable (%s): fix its "
			 "permissions or pass --read-only", o->path, strerror(-r));
	else
		snprintf(err, errlen, "cannot open disk '%s': %s", o->path,
			 strerror(-r));
	return r;
err_close:
	if (!o->take_fd)
		close(fd);
	return r;
}

int bdev_open(const struct bdev_opts *o, struct bdev *b, char *err, size_t errlen)
{
	int r = open_disk(o, b, err, errlen);

	/* A disk handed over is ours from the call on (bdev.h): closed on
	 * every error, whichever check failed. */
	if (r < 0 && o->take_fd)
		close(o->fd);
	return r;
}

int bdev_resize(struct bdev *b, uint64_t size, char *err, size_t errlen)
{
	uint64_t have = 0;
	struct stat st;
	int r;

	if (size % b->block_size) {
		snprintf(err, errlen, "%llu bytes is not a whole number of the disk's "
			 "%u-byte blocks", (unsigned long long)size, b->block_size);
		return -EINVAL;
	}
	if (size < b->size) {
		snprintf(err, errlen, "the disk is %llu bytes; shrinking it under a "
			 "running guest would cut off its data: give a size of at least "
			 "that", (unsigned long long)b->size);
		return -EINVAL;
	}
	if (size == b->size)
		return 0;
	/* An engine (or a format's disk) with a resize of its own decides;
	 * one that is its own disk without one cannot change. */
	if (b->engine->open || b->engine->resize) {
		if (!b->engine->resize) {
			snprintf(err, errlen, "a %s disk's size is fixed by its server",
				 b->engine->name);
			return -EOPNOTSUPP;
		}
		r = b->engine->resize(b, size, err, errlen);
		if (r < 0)
			return r;
	} else if (b->fd < 0) {
		/* A diskless export (null): the size is all there is. */
	} else if (b->is_blockdev) {
		if (ioctl(b->fd, BLKGETSIZE64, &have) < 0) {
			r = -errno;
			snprintf(err, errlen, "cannot read the size of '%s': %s", b->path,
				 strerror(-r));
			return r;
		}
		if (have < size) {
			snprintf(err, errlen, "block device '%s' is %llu bytes: grow it first "
				 "(e.g. lvextend), then resize to at most that", b->path,
				 (unsigned long long)have);
			return -ENOSPC;
		}
	} else {
		if (fstat(b->fd, &st) < 0) {
			r = -errno;
			snprintf(err, errlen, "cannot stat '%s': %s", b->path, strerror(-r));
			return r;
		}
		if ((uint64_t)st.st_size < size) {
			if (b->read_only) {
				snprintf(err, errlen, "'%s' is exported read-only and is %llu "
					 "bytes: grow the file first", b->path,
					 (unsigned long long)st.st_size);
				return -EROFS;
			}
			if (ftruncate(b->fd, (off_t)size) < 0) {
				r = -errno;
				snprintf(err, errlen, "cannot grow '%s' to %llu bytes: %s",
					 b->path, (unsigned long long)size, strerror(-r));
				return r;
			}
		}
	}
	log_info("disk %s: %llu -> %llu bytes", b->path, (unsigned long long)b->size,
		 (unsigned long long)size);
	WRITE_ONCE(b->size, size);
	return 0;
}

void bdev_close(struct bdev *b)
{
	if (b->engine && b->engine->close && b->priv)
		b->engine->close(b);
	b->priv = NULL;
	if (b->fd >= 0)
		close(b->fd);
	b->fd = -1;
	free(b->path);
	b->path = NULL;
}
