/*
 * Thin syscall wrappers: each returns 0 / a count, or -errno, and retries
 * EINTR where that is always right.  Callable from any thread.
 */
#ifndef VBLK_SYS_H
#define VBLK_SYS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

ssize_t sys_read(int fd, void *buf, size_t len);
ssize_t sys_write(int fd, const void *buf, size_t len);
/* New non-blocking, close-on-exec eventfd, or -errno. */
int sys_eventfd(void);
/* Signal an eventfd (add 1).  Returns 0 or -errno. */
int sys_eventfd_signal(int fd);
/* Drain an eventfd; returns the counter value read, 0 if none, or -errno. */
int64_t sys_eventfd_drain(int fd);
/* Take an fd another process sent as an eventfd: 0 if it is one (made
 * non-blocking if it was not), -EINVAL if it is something else (a pipe, a
 * socket, a file: a read or write could block the thread that uses it),
 * -errno if fcntl fails.  Without /proc, any fd is taken, non-blocking. */
int sys_eventfd_check(int fd);
/* Wait up to timeout_ms for an eventfd to be signalled, then drain it.
 * Returns the counter read (0 on timeout) or -errno. */
int64_t sys_eventfd_wait(int fd, int timeout_ms);
/* close() that ignores fd < 0 and sets *fd to -1. */
void sys_close(int *fd);
/* CLOCK_MONOTONIC in ns. */
uint64_t sys_now_ns(void);

#endif
