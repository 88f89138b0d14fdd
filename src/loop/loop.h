/*
 * loop_: the per-thread event loop.  One loop per thread that runs it
 * (the main thread and each iothread).  An iteration is a visible list of
 * phases (see loop_run):
 *
 *   1. decide how long to block (0 if bottom halves are pending)
 *   2. epoll_wait
 *   3. dispatch ready fd handlers       -- inside one defer section
 *   4. run scheduled bottom halves      -- inside the same defer section
 *   5. defer_end(): run deferred calls (one call-eventfd write per queue)
 *
 * Threading: everything here is loop-thread-only except loop_stop(),
 * loop_call_sync() and loop_in_thread(), which any thread may call.
 */
#ifndef VBLK_LOOP_H
#define VBLK_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

struct loop;
struct loop_fd;
struct loop_bh;

typedef void (*loop_fd_cb)(void *opaque, uint32_t events);
typedef void (*loop_cb)(void *opaque);

/* Create a loop.  Returns 0 and *out, or -errno.  Any thread. */
int loop_new(const char *name, struct loop **out);
/* Destroy a loop that is not running and has no fd handlers left. */
void loop_free(struct loop *l);

/*
 * Watch fd for events (EPOLLIN, ...).  cb runs on the loop thread.
 * Returns 0 and *out (may be NULL if not wanted), or -errno.
 */
int loop_fd_add(struct loop *l, int fd, uint32_t events, loop_fd_cb cb,
		void *opaque, struct loop_fd **out);
/*
 * Stop watching.  Safe inside any callback of this loop: an event already
 * fetched for this handler in the current iteration is dropped, never
 * delivered to a stale opaque.  Does not close the fd.
 */
void loop_fd_del(struct loop *l, struct loop_fd *h);

/* Bottom halves: callbacks scheduled to run once at the end of the
 * current iteration (phase 4). */
int loop_bh_new(struct loop *l, loop_cb cb, void *opaque, struct loop_bh **out);
void loop_bh_schedule(struct loop_bh *bh);
void loop_bh_free(struct loop_bh *bh);

/* Run iterations until loop_stop().  Returns 0 or -errno.  Loop thread. */
int loop_run(struct loop *l);
/* Make loop_run() return after the current iteration.  Any thread. */
void loop_stop(struct loop *l);

/*
 * Run fn(arg) on the loop's thread and wait for it to return.  This is how
 * the control plane (vhost-user messages, main thread) hands state changes
 * to the iothread that owns the state: never raced, always serialized with
 * the data path.  Called on the loop thread itself, runs fn directly.
 * Returns 0, or -errno if the loop is not running.
 */
int loop_call_sync(struct loop *l, loop_cb fn, void *arg);

/* True when called on the thread currently running l. */
bool loop_in_thread(struct loop *l);

/* Start a pthread that names itself `name` and runs loop_run(l).
 * Returns 0 or -errno.  loop_thread_join() stops it and waits. */
int loop_thread_start(struct loop *l);
void loop_thread_join(struct loop *l);

#endif
