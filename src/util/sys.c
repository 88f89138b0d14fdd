#include "util/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

ssize_t sys_read(int fd, void *buf, size_t len)
{
	ssize_t r;

	do
		r = read(fd, buf, len);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : r;
}

ssize_t sys_write(int fd, const void *buf, size_t len)
{
	ssize_t r;

	do
		r = write(fd, buf, len);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : r;
}

int sys_eventfd(void)
{
	int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

int sys_eventfd_signal(int fd)
{
	uint64_t one = 1;
	ssize_t r = sys_write(fd, &one, sizeof(one));

	/* EAGAIN means the counter is saturated: the reader will wake anyway. */
	if (r == -EAGAIN)
		return 0;
	return r < 0 ? (int)r : 0;
}

/* This thread's count of shared-fd operations begun and ended (odd: one
 * is under way), for loop_call_sync's watchdog; NULL outside a loop. */
static _Thread_local _Atomic uint64_t *shared_ops;

void sys_shared_fd_watch(_Atomic uint64_t *ops)
{
	shared_ops = ops;
}

/* One read or write of an eventfd that may block (its O_NONBLOCK cleared
 * by the process we share it with), counted for the watchdog and never
 * retried on EINTR: that is the watchdog interrupting it. */
static void shared_ops_inc(void)
{
	/* One writer (this thread): a plain add, no locked instruction. */
	if (shared_ops)
		atomic_store_explicit(shared_ops, atomic_load_explicit(shared_ops,
				      memory_order_relaxed) + 1, memory_order_relaxed);
}

static ssize_t shared_rw(int fd, uint64_t *v, bool is_write)
{
	ssize_t r;

	shared_ops_inc();
	r = is_write ? write(fd, v, sizeof(*v)) : read(fd, v, sizeof(*v));
	if (r < 0)
		r = -errno;
	shared_ops_inc();
	return r;
}

int sys_eventfd_signal_shared(int fd)
{
	uint64_t one = 1;
	ssize_t r = shared_rw(fd, &one, true);

	if (r == -EAGAIN)
		return 0;	/* saturated: the reader will wake anyway */
	return r < 0 ? (int)r : 0;
}

int64_t sys_eventfd_drain(int fd)
{
	uint64_t v;
	struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };
	ssize_t r;

	/* Whatever the file's flags say now (a frontend can clear the
	 * O_NONBLOCK it shares with us): never wait (Linux 5.12). */
	do
		r = preadv2(fd, &iov, 1, -1, RWF_NOWAIT);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		r = errno == EOPNOTSUPP || errno == EINVAL ? shared_rw(fd, &v, false) : -errno;

	if (r == -EAGAIN)
		return 0;
	if (r < 0)
		return r;
	/* An eventfd reads 8 bytes or fails; anything else read nothing. */
	return r == sizeof(v) ? (int64_t)(v & INT64_MAX) : 0;
}

int sys_eventfd_check(int fd)
{
	char path[40], target[64];
	ssize_t n;
	int fl;

	/* The kernel names an eventfd's anonymous inode this way (fs/eventfd.c);
	 * there is no other way to ask what an fd is. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n >= 0) {
		target[n] = '\0';
		if (strcmp(target, "anon_inode:[eventfd]") != 0)
			return -EINVAL;
	}
	/* Without /proc (a bare chroot) it cannot be asked; non-blocking, it
	 * can at worst be useless, never block. */
	fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	/* Full at the counter's maximum, a blocking eventfd blocks its writer
	 * until somebody reads, and the sender can fill it on purpose. */
	if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int64_t sys_eventfd_wait(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	if (poll(&p, 1, timeout_ms) < 0 && errno != EINTR)
		return -errno;
	return sys_eventfd_drain(fd);
}

int sys_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0) {
			memset(p, 0, len);
			return 0;
		}
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

int sys_pread_iov(int fd, const struct iovec *iov, unsigned cnt, size_t off, size_t len,
		  uint64_t pos)
{
	size_t total = 0;

	for (unsigned i = 0; i < cnt; i++)
		total += iov[i].iov_len;
	if (off > total || len > total - off)
		return -EINVAL;
	for (unsigned i = 0; i < cnt && len; i++) {
		size_t l = iov[i].iov_len, take;
		int r;

		if (off >= l) {
			off -= l;
			continue;
		}
		take = l - off < len ? l - off : len;
		r = sys_pread_full(fd, (uint8_t *)iov[i].iov_base + off, take, pos);
		if (r < 0)
			return r;
		/* The next piece goes on where this one ended, in the file
		 * as in the buffer. */
		pos += take;
		len -= take;
		off = 0;
	}
	return 0;
}

int sys_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

void sys_close(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

uint64_t sys_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int sys_sched_wait_open(void)
{
	int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

int sys_sched_wait_ns(int fd, uint64_t *ns)
{
	unsigned long long run, wait, slices;
	char buf[96];
	ssize_t n;

	do {
		n = pread(fd, buf, sizeof(buf) - 1, 0);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	if (sscanf(buf, "%llu %llu %llu", &run, &wait, &slices) != 3)
		return -EINVAL;
	/* A thread that reads this has been switched in at least once:
	 * "0 0 0" means nothing is kept (fs/proc/base.c, sched_info_on()).
	 * The run time alone may still read 0 early in a thread's life. */
	if (slices == 0)
		return -ENODATA;
	*ns = wait;
	return 0;
}
