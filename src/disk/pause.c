/*
 * The error policy (disk.h; docs/architecture.md "Errors that pause"): a
 * failed request the policy stops on is not completed; its front holds
 * it, and the disk pauses until resumed.  The rules are QEMU's -drive
 * werror=/rerror= (block/block-backend.c, blk_get_error_action: "enospc"
 * stops on ENOSPC only, "stop" on any error, "report" never), and so is
 * what a stop does to the request (hw/block/virtio-blk.c,
 * virtio_blk_handle_rw_error keeps it, virtio_blk_dma_restart_cb submits
 * it again at resume); but where QEMU stops the whole VM, vblkd pauses the
 * disk: no front takes a new request (the virtio-blk device pops no ring,
 * the NBD server reads no socket), those in flight finish (a failing one
 * is held too), and the guest and the NBD clients simply wait.
 *
 * Threads: a front holds a request and pauses the disk on its iothread;
 * the paused flag is set by whichever iothread pauses first and read by
 * every front when it looks for work; the reason and the counters are
 * under pause_lock (rare); the main thread hears of a pause through an
 * eventfd (sd_notify STATUS, the retry timer) and resumes by having each
 * front submit its held requests again (disk_front.resume).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "disk/disk.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/notify.h"
#include "util/sys.h"

static const char *const reason_names[DISK_PAUSE_NR] = {
	[DISK_PAUSE_ENOSPC] = "enospc",
	[DISK_PAUSE_EDQUOT] = "edquot",
	[DISK_PAUSE_EIO] = "eio",
};

const char *disk_pause_reason_name(enum disk_pause_reason r)
{
	return (unsigned)r < DISK_PAUSE_NR ? reason_names[r] : "?";
}

static enum disk_pause_reason reason_of(int err)
{
	return err == ENOSPC ? DISK_PAUSE_ENOSPC : err == EDQUOT ? DISK_PAUSE_EDQUOT :
	       DISK_PAUSE_EIO;
}

bool disk_error_stops(const struct disk *d, enum bdev_op op, int err)
{
	/* Reads follow rerror; writes, flushes, discards and write zeroes
	 * werror (QEMU's virtio-blk does the same). */
	enum disk_err_policy p = op == BDEV_READ ? d->rerror : d->werror;

	return p == DISK_ERR_STOP || (p == DISK_ERR_ENOSPC && err == ENOSPC);
}

const char *disk_op_name(enum bdev_op op)
{
	switch (op) {
	case BDEV_READ: return "read";
	case BDEV_WRITE: return "write";
	case BDEV_FLUSH: return "flush";
	case BDEV_DISCARD: return "discard";
	case BDEV_WRITE_ZEROES: return "write zeroes";
	}
	return "request";
}

void disk_hold(struct disk *d, int err, const char *what)
{
	enum disk_pause_reason why = reason_of(err);

	atomic_fetch_add_explicit(&d->held, 1, memory_order_relaxed);
	pthread_mutex_lock(&d->pause_lock);
	if (!atomic_load_explicit(&d->paused, memory_order_relaxed)) {
		snprintf(d->pause_reason, sizeof(d->pause_reason), "%s (%s)", strerror(err), what);
		d->paused_since = (uint64_t)time(NULL);
		d->pauses[why]++;
		/* Before the others can see it: every front stops taking
		 * requests at its next look for work. */
		atomic_store_explicit(&d->paused, true, memory_order_release);
		log_err("paused: %s: the guest's I/O waits (%s); fix the cause, then "
			"vblkctl resume%s", d->pause_reason,
			why == DISK_PAUSE_ENOSPC ? "make space on the disk's file system" :
			why == DISK_PAUSE_EDQUOT ? "raise the quota" : "bring the storage back",
			d->retry_ns ? " (or wait: it is retried by itself)" : "");
		(void)sys_eventfd_signal(d->pause_efd);
	}
	pthread_mutex_unlock(&d->pause_lock);
}

void disk_unhold(struct disk *d, uint64_t n)
{
	atomic_fetch_sub_explicit(&d->held, n, memory_order_relaxed);
}

int disk_resume(struct disk *d)
{
	unsigned n = 0;

	if (!atomic_load(&d->paused) && !atomic_load(&d->held))
		return 0;
	pthread_mutex_lock(&d->pause_lock);
	atomic_store_explicit(&d->paused, false, memory_order_release);
	pthread_mutex_unlock(&d->pause_lock);
	for (struct disk_front *f = d->fronts; f; f = f->next)
		n += f->resume(f->opaque);
	log_info("resumed: %u held request%s submitted again", n, n == 1 ? "" : "s");
	if (!atomic_load(&d->paused))
		(void)notify_status("Serving");
	return (int)n;
}

void disk_pause_state(struct disk *d, struct disk_pause_state *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&d->pause_lock);
	st->paused = atomic_load(&d->paused);
	if (st->paused) {
		snprintf(st->reason, sizeof(st->reason), "%s", d->pause_reason);
		st->since = d->paused_since;
	}
	memcpy(st->pauses, d->pauses, sizeof(st->pauses));
	pthread_mutex_unlock(&d->pause_lock);
	st->held = atomic_load_explicit(&d->held, memory_order_relaxed);
}

/* Main thread: a front paused the disk. */
static void pause_event_cb(void *opaque, uint32_t events)
{
	struct disk *d = opaque;
	char reason[sizeof(d->pause_reason)];
	bool paused;

	(void)sys_eventfd_drain(d->pause_efd);
	pthread_mutex_lock(&d->pause_lock);
	paused = atomic_load(&d->paused);
	snprintf(reason, sizeof(reason), "%s", d->pause_reason);
	pthread_mutex_unlock(&d->pause_lock);
	if (!paused)
		return;
	(void)notify_status("Paused: %s; vblkctl resume once fixed", reason);
	if (d->retry_ns && d->retry_timer)
		loop_timer_mod(d->retry_timer, sys_now_ns() + d->retry_ns);
}

static void retry_cb(void *opaque)
{
	struct disk *d = opaque;

	if (!atomic_load(&d->paused))
		return;
	log_info("retrying the held requests (--error-retry-s)");
	(void)disk_resume(d);
}

int disk_attach(struct disk *d, struct loop *main_loop)
{
	int r = loop_fd_add(main_loop, d->pause_efd, EPOLLIN, pause_event_cb, d, &d->pause_h);

	if (r < 0)
		return r;
	d->main_loop = main_loop;
	r = loop_timer_new(main_loop, retry_cb, d, &d->retry_timer);
	if (r < 0) {
		loop_fd_del(main_loop, d->pause_h);
		d->pause_h = NULL;
		return r;
	}
	/* Paused before we were attached (a state handed over by an upgrade
	 * in place): say so now. */
	if (atomic_load(&d->paused))
		(void)sys_eventfd_signal(d->pause_efd);
	return 0;
}

void disk_detach(struct disk *d)
{
	if (!d->main_loop)
		return;
	loop_timer_free(d->retry_timer);
	d->retry_timer = NULL;
	loop_fd_del(d->main_loop, d->pause_h);
	d->pause_h = NULL;
	d->main_loop = NULL;
}

/* Upgrade in place: the pause goes to the new process, reason and all.
 * The held requests themselves go as what they are to the frontend: in
 * flight (the in-flight region the new process is handed). */
size_t disk_pause_save(struct disk *d, uint8_t *buf, size_t len)
{
	size_t n;

	pthread_mutex_lock(&d->pause_lock);
	/* The reason is cut to what fits (the pause itself always goes). */
	n = MIN(strnlen(d->pause_reason, sizeof(d->pause_reason) - 1), MIN(len, 256) - 1);
	if (!atomic_load(&d->paused) || len < 1) {
		pthread_mutex_unlock(&d->pause_lock);
		return 0;
	}
	buf[0] = (uint8_t)n;
	memcpy(buf + 1, d->pause_reason, n);
	pthread_mutex_unlock(&d->pause_lock);
	return 1 + n;
}

void disk_pause_load(struct disk *d, const uint8_t *buf, size_t len)
{
	/* len >= 1; the text is at most what came, and what we keep. */
	size_t n = MIN(MIN((size_t)buf[0], len - 1), sizeof(d->pause_reason) - 1);

	pthread_mutex_lock(&d->pause_lock);
	memcpy(d->pause_reason, buf + 1, n);
	d->pause_reason[n] = '\0';
	d->paused_since = (uint64_t)time(NULL);
	atomic_store(&d->paused, true);
	pthread_mutex_unlock(&d->pause_lock);
	log_err("paused before the upgrade: %s: the guest's I/O waits; vblkctl resume once "
		"fixed", d->pause_reason);
}

int disk__pause_init(struct disk *d, const struct disk_opts *o)
{
	d->rerror = o->rerror;
	d->werror = o->werror;
	d->retry_ns = o->error_retry_ns;
	d->pause_efd = sys_eventfd();
	if (d->pause_efd < 0)
		return d->pause_efd;
	pthread_mutex_init(&d->pause_lock, NULL);
	return 0;
}

void disk__pause_free(struct disk *d)
{
	disk_detach(d);
	close(d->pause_efd);
	pthread_mutex_destroy(&d->pause_lock);
}
