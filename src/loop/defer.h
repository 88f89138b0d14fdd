/*
 * defer_: deferred calls, the batching primitive for notifications.
 *
 *   defer_begin();
 *   ... complete many requests; each calls defer_call(vq_notify_fn, vq) ...
 *   defer_end();   -> vq_notify_fn(vq) runs once per distinct (fn, arg)
 *
 * Sections nest; calls run when the outermost section ends.  Outside any
 * section defer_call() runs fn at once.  State is per thread, so each
 * iothread batches its own queues and nothing is shared.
 */
#ifndef VBLK_DEFER_H
#define VBLK_DEFER_H

#include <stdbool.h>

typedef void (*defer_fn)(void *arg);

void defer_begin(void);
void defer_end(void);
/* Queue fn(arg) for the end of the outermost section; duplicates of a
 * pending (fn, arg) pair are coalesced into one call. */
void defer_call(defer_fn fn, void *arg);

/* Free this thread's queue (a thread that ran a loop calls it on exit). */
void defer_release(void);

/* Ablation (--no-batch): when off, defer_call() always runs fn at once.
 * Process-wide; set before any thread starts. */
void defer_set_batching(bool on);
bool defer_batching(void);

#endif
