/*
 * Thin syscall wrappers: each returns 0 / a count, or -errno, and retries
 * EINTR where that is always right.  Callable from any thread.
 */
#ifndef VBLK_SYS_H
#define VBLK_SYS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

ssize_t sys_read(int fd, void *buf, size_t len);
ssize_t sys_write(int fd, const void *buf, size_t len);
/* New non-blocking, close-on-exec eventfd, or -errno. */
int sys_eventfd(void);
/* Signal an eventfd (add 1).  Returns 0 or -errno. */
int sys_eventfd_signal(int fd);
/* Drain an eventfd; returns the counter value read, 0 if none, or -errno.
 * Never blocks, even on an eventfd another process made blocking (before
 * Linux 5.12: as sys_eventfd_signal_shared). */
int64_t sys_eventfd_drain(int fd);
/* Signal an eventfd another process holds too (a frontend's call, err or
 * log fd).  The file's flags are shared with it: it can clear the
 * O_NONBLOCK we set and fill the counter, and this write then blocks.  On
 * a loop thread such a write is interrupted by loop_call_sync's watchdog
 * (loop.h) and returns -EINTR: stop using that fd.  0, or -errno. */
int sys_eventfd_signal_shared(int fd);
/* The loop thread's counter of shared-fd operations (loop.c), NULL to
 * stop counting.  The calling thread. */
void sys_shared_fd_watch(_Atomic uint64_t *ops);
/* Take an fd another process sent as an eventfd: 0 if it is one (made
 * non-blocking if it was not), -EINVAL if it is something else (a pipe, a
 * socket, a file: a read or write could block the thread that uses it),
 * -errno if fcntl fails.  Without /proc, any fd is taken, non-blocking. */
int sys_eventfd_check(int fd);
/* Wait up to timeout_ms for an eventfd to be signalled, then drain it.
 * Returns the counter read (0 on timeout) or -errno. */
int64_t sys_eventfd_wait(int fd, int timeout_ms);
/* pread(2) until len bytes are in buf; what lies past the end of the
 * file reads as zeroes.  0 or -errno. */
int sys_pread_full(int fd, void *buf, size_t len, uint64_t off);
/* Bytes [pos, pos + len) of the file into bytes [off, off + len) of
 * iov[0..cnt), each piece from its own place in the file
 * (sys_pread_full).  0, or -errno: -EINVAL if the range passes the
 * iovecs' end (nothing read then). */
struct iovec;
int sys_pread_iov(int fd, const struct iovec *iov, unsigned cnt, size_t off, size_t len,
		  uint64_t pos);
/* pwrite(2) until all of buf is written.  0 or -errno. */
int sys_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
/* close() that ignores fd < 0 and sets *fd to -1. */
void sys_close(int *fd);
/* CLOCK_MONOTONIC in ns. */
uint64_t sys_now_ns(void);
/* The calling thread's wait for a CPU: /proc/thread-self/schedstat, whose
 * second field is the time it has spent runnable on a run queue while
 * another task ran ("run_delay"; Documentation/scheduler/sched-stats.rst,
 * "/proc/<pid>/schedstat").  Time taken by interrupts, or by a hypervisor
 * running another vCPU (steal), is not in it.  sys_sched_wait_open is called
 * by the thread itself: an fd, or -errno (no /proc, no CONFIG_SCHED_INFO).
 * sys_sched_wait_ns reads it: 0, or -errno; -ENODATA when the kernel keeps no
 * such times (it then prints zeros). */
int sys_sched_wait_open(void);
int sys_sched_wait_ns(int fd, uint64_t *ns);

#endif
