/*
 * The image lock: one writer at a time, across processes, while a
 * frontend's rings run (docs/architecture.md "Migration", "The image
 * lock").
 *
 * We speak QEMU's file locking convention (its block/file-posix.c, byte
 * 100 + i "this process uses permission i", byte 200 + i "this process
 * does not let others have permission i"; permission 1 is WRITE) so that
 * QEMU, qemu-storage-daemon and qemu-img see us and we see them.  QEMU
 * takes shared locks and tests for conflicts; we take both WRITE bytes
 * exclusively, which conflicts with any other holder of either byte and
 * makes two vblkd processes strictly exclusive.  Open file description
 * locks (F_OFD_*): they belong to our open of the disk, not to a thread,
 * and go away when the process dies.
 */
#include "backend/bdev.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"
#include "util/sys.h"

#define LOCK_PERM_READ    100	/* QEMU: BLK_PERM_CONSISTENT_READ */
#define LOCK_PERM_WRITE   101	/* QEMU: RAW_LOCK_PERM_BASE + BLK_PERM_WRITE bit */
#define LOCK_UNSHARE_WRITE 201	/* QEMU: RAW_LOCK_SHARED_BASE + that bit */

static int ofd_lock(int fd, short type, off_t byte, int cmd, struct flock *fl)
{
	*fl = (struct flock){ .l_type = type, .l_whence = SEEK_SET, .l_start = byte,
			      .l_len = 1 };
	return fcntl(fd, cmd, fl) < 0 ? -errno : 0;
}

static bool bdev_lockable(const struct bdev *b)
{
	return b->fd >= 0 && !b->read_only;
}

/* Describe who holds a lock that conflicts with ours on byte. */
static void holder(const struct bdev *b, off_t byte, char *buf, size_t len)
{
	struct flock fl;

	if (ofd_lock(b->fd, F_WRLCK, byte, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK &&
	    fl.l_pid > 0)
		snprintf(buf, len, " (process %d)", (int)fl.l_pid);
	else
		buf[0] = '\0';
}

/*
 * A conflict is tried again every 20 ms for wait_ms.  A vblkd killed with
 * SIGKILL holds the lock after its death for as long as its io_uring
 * still holds the file (the ring is torn down by the kernel after the
 * process is gone: ~30-100 ms seen here; qemu-img check meanwhile says
 * "Failed to get shared 'write' lock"), and its successor, restarted at
 * once, must not lose that race.  A live writer still holds it after
 * that, and is refused.
 */
#define LOCK_RETRY_STEP_NS (20ull * 1000 * 1000)

/* Both WRITE bytes, or neither.  0, -EAGAIN (someone holds one; *busy
 * says which), or -errno. */
static int lock_once(struct bdev *b, off_t *busy)
{
	static const off_t bytes[] = { LOCK_PERM_WRITE, LOCK_UNSHARE_WRITE };
	struct flock fl;
	int r;

	for (unsigned i = 0; i < 2; i++) {
		r = ofd_lock(b->fd, F_WRLCK, bytes[i], F_OFD_SETLK, &fl);
		if (r == 0)
			continue;
		if (i)
			(void)ofd_lock(b->fd, F_UNLCK, bytes[0], F_OFD_SETLK, &fl);
		*busy = bytes[i];
		return r == -EACCES ? -EAGAIN : r;
	}
	return 0;
}

int bdev_lock(struct bdev *b, unsigned wait_ms)
{
	uint64_t t0 = sys_now_ns(), wait_ns = wait_ms * 1000000ull;
	off_t busy = 0;
	char who[32];
	int r;

	if (b->locked || b->read_only)
		return 0;
	if (b->engine->lock) {
		r = b->engine->lock(b);
		b->locked = r == 0;
		return r;
	}
	if (!bdev_lockable(b))
		return 0;
	while ((r = lock_once(b, &busy)) == -EAGAIN && sys_now_ns() - t0 < wait_ns) {
		struct timespec ts = { 0, (long)LOCK_RETRY_STEP_NS };

		if (sys_now_ns() - t0 < LOCK_RETRY_STEP_NS)
			log_info("disk %s: another process holds its lock; trying again for up to "
				 "%u ms (a vblkd that was just killed lets go of it once the "
				 "kernel has closed its files)", b->path, wait_ms);
		nanosleep(&ts, NULL);
	}
	if (r == -EAGAIN) {
		holder(b, busy, who, sizeof(who));
		log_err("disk %s is in use: another process%s writes it (a vblkd, "
			"QEMU or qemu-storage-daemon serving it to a running VM); "
			"two writers would corrupt it, so it is not written from here: "
			"stop the other writer, or migrate its VM here",
			b->path, who);
		return -EBUSY;
	}
	if (r < 0) {
		log_err("disk %s: cannot lock it against other writers: %s", b->path,
			strerror(-r));
		return r;
	}
	if (sys_now_ns() - t0 >= LOCK_RETRY_STEP_NS)
		log_info("disk %s: lock taken after %llu ms", b->path,
			 (unsigned long long)((sys_now_ns() - t0) / 1000000));
	b->locked = true;
	/* Through the page cache, what another host wrote since we last ran
	 * (e.g. a migration back here, on NFS) may be cached stale.  Not
	 * once a flush failed: the pages then hold the guest's writes that
	 * the disk may not (flushes fail; reads need not go back in time). */
	if (!b->direct && !atomic_load(&b->cache_lost))
		(void)posix_fadvise(b->fd, 0, 0, POSIX_FADV_DONTNEED);
	log_info("disk %s: locked for writing", b->path);
	return 0;
}

void bdev_unlock(struct bdev *b)
{
	struct flock fl;

	if (!b->locked)
		return;
	b->locked = false;
	if (b->engine->unlock) {
		b->engine->unlock(b);
		return;
	}
	/* The next writer may be on another host (a migration's destination)
	 * and see only what reached the disk. */
	if (!b->direct && fdatasync(b->fd) < 0) {
		int r = -errno;

		log_err("disk %s: flushing before handing it over failed: %s", b->path,
			strerror(-r));
		bdev_flush_failed(b, r);
	}
	(void)ofd_lock(b->fd, F_UNLCK, LOCK_UNSHARE_WRITE, F_OFD_SETLK, &fl);
	(void)ofd_lock(b->fd, F_UNLCK, LOCK_PERM_WRITE, F_OFD_SETLK, &fl);
	log_info("disk %s: unlocked", b->path);
}

bool bdev_lock_busy(const struct bdev *b)
{
	struct flock fl;

	if (!bdev_lockable(b))
		return false;
	for (off_t byte = LOCK_PERM_WRITE; byte <= LOCK_UNSHARE_WRITE; byte += 100)
		if (ofd_lock(b->fd, F_WRLCK, byte, F_OFD_GETLK, &fl) == 0 &&
		    fl.l_type != F_UNLCK)
			return true;
	return false;
}

int bdev_lock_shared(struct bdev *b)
{
	struct flock fl;
	int r;

	if (b->fd < 0 || b->engine->open)
		return 0;
	/* Someone holds WRITE (QEMU shares byte 101 among its writers; a
	 * vblkd writer holds it exclusively): the file is changing. */
	if (ofd_lock(b->fd, F_WRLCK, LOCK_PERM_WRITE, F_OFD_GETLK, &fl) == 0 &&
	    fl.l_type != F_UNLCK)
		return -EBUSY;
	r = ofd_lock(b->fd, F_RDLCK, LOCK_PERM_READ, F_OFD_SETLK, &fl);
	if (r == 0)
		r = ofd_lock(b->fd, F_RDLCK, LOCK_UNSHARE_WRITE, F_OFD_SETLK, &fl);
	if (r == -EAGAIN || r == -EACCES)
		return -EBUSY;
	return r;
}
