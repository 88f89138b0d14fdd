/*
 * bdev_efd_: completions announced on an eventfd, taken on the iothread.
 *
 * For engines whose I/O completes elsewhere (the kernel's AIO ring, worker
 * threads, librbd's threads), which then write an eventfd whatever the
 * iothread does: the eventfd is watched in the ctx's loop, each wake-up
 * drains it and reaps, and a poll handler lets a polling loop take the
 * completions without waiting for it (there is nothing to switch off while
 * polling: begin() does nothing and end() looks once more).  The engine
 * says how to find completions and how to run them (struct bdev_efd_ops)
 * and counts what is in flight (inflight).
 *
 * Threading: the ctx's iothread, except the eventfd's writes, which come
 * from wherever I/O completes.
 */
#ifndef VBLK_BDEV_EFD_H
#define VBLK_BDEV_EFD_H

#include <stdbool.h>

#include "loop/loop.h"

struct bdev_ctx;

struct bdev_efd_ops {
	/* Completions wait to be reaped: cheap, no syscall (loop.h: poll()).
	 * Called only while inflight. */
	bool (*ready)(struct bdev_ctx *c);
	/* Complete what has completed (bdev_complete each).  Returns how
	 * many. */
	unsigned (*reap)(struct bdev_ctx *c);
	/* Optional: loop.h cpu_bound(). */
	bool (*cpu_bound)(struct bdev_ctx *c);
	/* Polled for as long as I/O is in flight (loop.h: armed()); false:
	 * only within the loop's kick window. */
	bool armed;
};

struct bdev_efd {
	int fd;			/* written where I/O completes */
	unsigned inflight;	/* submitted, not yet completed: the engine counts */
	struct bdev_ctx *ctx;
	const struct bdev_efd_ops *ops;
	struct loop *loop;
	struct loop_fd *h;	/* NULL: not open */
	struct loop_poll_ops pops;	/* ops, as the loop calls them */
};

/* Make the eventfd and watch it in l, for ctx c.  Returns 0, or -errno
 * with nothing left open.  e->fd is the engine's to hand to whatever
 * completes its I/O. */
int bdev_efd_open(struct bdev_efd *e, struct loop *l, const struct bdev_efd_ops *ops,
		  struct bdev_ctx *c);
/* Stop watching and close the eventfd: whatever wrote it must have
 * stopped.  Nothing on an e that is not open (zeroed, or its open
 * failed). */
void bdev_efd_close(struct bdev_efd *e);
/* Reap until nothing is in flight, waiting for the eventfd up to 100 ms
 * between reaps. */
void bdev_efd_drain(struct bdev_efd *e);

#endif
