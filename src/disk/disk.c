#include "disk/disk.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/format.h"
#include "job/job.h"
#include "util/log.h"

int disk_open_image(const struct bdev_opts *bo, const struct fmt_opts *fo, unsigned num_iothreads,
		    struct bdev *file, struct bdev **disk, char *err, size_t errlen)
{
	int r = bdev_open(bo, file, err, errlen);

	if (r < 0) {
		if (fo->key_handed)
			close(fo->key_fd);
		return r;
	}
	/* The format over the file: what the guest sees (format.h). */
	if (file->engine->open && fo->kind == FMT_QCOW2) {
		snprintf(err, errlen, "--format qcow2: vblkd reads qcow2 images from files and "
			 "block devices only, not from a %s disk: export the image's contents "
			 "instead (qemu-nbd -f qcow2, or qemu-img convert -O raw)",
			 file->engine->name);
		if (fo->key_handed)
			close(fo->key_fd);
		r = -EINVAL;
		goto err_file;
	}
	r = fmt_open(file, fo, disk, err, errlen);
	if (fo->key_handed)
		close(fo->key_fd);
	if (r < 0) {
		bdev_close(file);
		return r;
	}
	if (fo->copy_on_read && !fmt_has_backing(*disk)) {
		snprintf(err, errlen, "--copy-on-read: %s is not a qcow2 image with a backing "
			 "file: there is nothing below it to copy; drop the option", file->path);
		r = -EINVAL;
		goto err_fmt;
	}
	if ((*disk)->max_ctxs && num_iothreads > (*disk)->max_ctxs) {
		snprintf(err, errlen, "--iothreads %u: %s serves one disk from %u iothread%s (%s); "
			 "drop --iothreads (all queues then share that iothread)", num_iothreads,
			 *disk != file ? "qcow2" : file->engine->name, (*disk)->max_ctxs,
			 (*disk)->max_ctxs > 1 ? "s" : "",
			 *disk != file ? "its metadata belongs to one thread, as in QEMU" :
			 !strcmp(file->engine->name, "rbd") ? "one librbd image handle per disk" :
			 "the NBD server does not allow several connections (multi-conn)");
		r = -EINVAL;
		goto err_fmt;
	}
	return 0;

err_fmt:
	fmt_close(*disk, file);
err_file:
	bdev_close(file);
	return r;
}

int disk_close_image(struct bdev *disk, struct bdev *file)
{
	int r = fmt_close(disk, file) < 0 ? -EIO : 0;

	if (!file->read_only && file->fd >= 0 && fdatasync(file->fd) < 0)
		log_err("final fdatasync of %s failed: %s", file->path, strerror(errno));
	bdev_close(file);
	return r;
}

static void do_pin(void *opaque)
{
	struct disk_iothread *t = opaque;
	cpu_set_t set;
	int r;

	CPU_ZERO(&set);
	CPU_SET(t->cpu, &set);
	r = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	if (r)
		log_warn("iothread%u: cannot pin to CPU %d: %s", t->idx, t->cpu, strerror(r));
}

struct ctx_call {
	struct disk *d;
	struct disk_iothread *t;
};

static void do_ctx_new(void *opaque)
{
	struct ctx_call *c = opaque;

	/* Depth: every request of every ring this thread may own; more
	 * wait in the engine's own queue (uring.c, aio.c). */
	if (bdev_ctx_new(c->d->b, c->t->loop, 1024, &c->t->bctx) < 0)
		c->t->bctx = NULL;
}

static void do_ctx_free(void *opaque)
{
	struct ctx_call *c = opaque;

	if (c->t->bctx)
		c->d->b->engine->ctx_free(c->t->bctx);
	c->t->bctx = NULL;
}

static void iothread_stop(struct disk *d, struct disk_iothread *t)
{
	struct ctx_call c = { d, t };

	loop_call_sync(t->loop, do_ctx_free, &c);
	loop_thread_join(t->loop);
	loop_free(t->loop);
	t->loop = NULL;
}

static int iothread_start(struct disk *d, unsigned i, const struct disk_opts *o)
{
	struct disk_iothread *t = &d->iot[i];
	struct ctx_call c = { d, t };
	char name[16];
	int r;

	t->idx = i;
	t->cpu = o->ncpus ? o->cpus[i % o->ncpus] : -1;
	snprintf(name, sizeof(name), "iothread%u", i);
	r = loop_new(name, &t->loop);
	if (r < 0)
		return r;
	if (o->poll)
		loop_set_poll_params(t->loop, o->poll);
	r = o->no_threads ? 0 : loop_thread_start(t->loop);
	if (r < 0) {
		loop_free(t->loop);
		return r;
	}
	if (t->cpu >= 0 && !o->no_threads)
		loop_call_sync(t->loop, do_pin, t);
	loop_call_sync(t->loop, do_ctx_new, &c);
	if (!t->bctx) {
		log_err("cannot set up the %s backend on %s", d->b->engine->name, name);
		iothread_stop(d, t);
		return -EIO;
	}
	return 0;
}

int disk_new(struct bdev *b, const struct disk_opts *o, struct disk **out)
{
	unsigned nt = o->num_iothreads ? o->num_iothreads : 1;
	struct disk *d;
	int r;

	if (nt > DISK_MAX_IOTHREADS) {
		qos_free(o->qos);
		return -EINVAL;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		qos_free(o->qos);
		return -ENOMEM;
	}
	d->qos = o->qos;
	if (!d->qos && (r = qos_new(NULL, &d->qos)) < 0) {
		free(d);
		return r;
	}
	d->qos_on = qos_active_flag(d->qos);
	d->iot = calloc(nt, sizeof(*d->iot));
	r = d->iot ? disk__pause_init(d, o) : -ENOMEM;
	if (r < 0) {
		qos_free(d->qos);
		free(d->iot);
		free(d);
		return r;
	}
	d->b = b;
	d->file = o->file ? o->file : b;
	pthread_mutex_init(&d->bm_lock, NULL);
	/* A raw disk's bitmap file (bmfile.c): where --bitmap-file says, or
	 * beside a regular file. */
	if (fmt_bitmap_file_possible(b, o->bitmap_file != NULL)) {
		char path[4096];

		if (o->bitmap_file)
			d->bm_path = strdup(o->bitmap_file);
		else if (fmt_bitmap_file_path(b->path, path, sizeof(path)) == 0)
			d->bm_path = strdup(path);
	}
	for (unsigned i = 0; i < nt; i++) {
		r = iothread_start(d, i, o);
		if (r < 0) {
			while (i--)
				iothread_stop(d, &d->iot[i]);
			disk__pause_free(d);
			qos_free(d->qos);
			free(d->iot);
			free(d);
			return r;
		}
		d->num_iothreads = i + 1;
	}
	*out = d;
	return 0;
}

void disk_free(struct disk *d)
{
	if (!d)
		return;
	if (d->claims)
		log_err("disk %s freed with %u claims held", d->b->path, d->claims);
	/* Persistent bitmaps changed while nothing held the disk: stored if
	 * the image can be ours for a moment. */
	if (!d->claims && d->bm_unsaved && !d->b->read_only) {
		char err[256];

		if (disk_claim(d, 0, err, sizeof(err)) == 0)
			disk_release(d);
		else
			log_err("persistent bitmaps not stored: %s", err);
	}
	for (unsigned i = 0; i < d->num_iothreads; i++)
		iothread_stop(d, &d->iot[i]);
	disk__pause_free(d);
	disk__bitmaps_free(d);
	disk__bmfile_close(d);
	free(d->bm_path);
	pthread_mutex_destroy(&d->bm_lock);
	qos_free(d->qos);
	free(d->iot);
	free(d);
}

/* How long a throttled front sleeps at least: sixteen I/Os' worth of the
 * budget, from 1 to 25 ms (a quarter of the tenth of a second a bucket
 * holds).  The budget then goes in batches (at 5,000 IOPS sixteen requests
 * per wake-up, not one; at 500, twelve): the rate is the same, since the
 * bucket keeps what leaked meanwhile, and a wake-up (and an interrupt)
 * is paid per batch, not per request.  A QD1 client gets the batch one
 * request after another, at once. */
#define DISK_QOS_SLICE_MIN_NS 1000000ull
#define DISK_QOS_SLICE_MAX_NS 25000000ull
#define DISK_QOS_SLICE_IOS 16

uint64_t disk_admit(struct disk *d, struct qos_turn *turn, bool is_write, uint64_t bytes,
		    uint64_t now)
{
	uint64_t slice = DISK_QOS_SLICE_IOS * qos_io_ns(d->qos, is_write, bytes);

	slice = slice < DISK_QOS_SLICE_MIN_NS ? DISK_QOS_SLICE_MIN_NS :
		slice > DISK_QOS_SLICE_MAX_NS ? DISK_QOS_SLICE_MAX_NS : slice;
	return qos_admit_turn(d->qos, is_write, bytes, now, turn, slice);
}

void disk_admit_cancel(struct disk *d, struct qos_turn *turn)
{
	qos_cancel(d->qos, turn->ticket);
	turn->ticket = 0;
	turn->credit = 0;
}

/* The image lock, then what the format read of the image while it was
 * not ours read again (format.h, fmt_claim): err says why not. */
int disk_claim(struct disk *d, unsigned wait_ms, char *err, size_t errlen)
{
	int r;

	if (d->claims) {
		d->claims++;
		return 0;
	}
	r = bdev_lock(d->b, wait_ms);
	if (r < 0) {
		snprintf(err, errlen, "disk %s is in use: another process writes it (a VM runs "
			 "on another vblkd, QEMU or qemu-storage-daemon)", d->b->path);
		return r;
	}
	r = fmt_claim(d->b, err, errlen);
	if (r == 0 && (r = disk__bitmaps_claimed(d, err, errlen)) < 0)
		fmt_release(d->b);
	if (r < 0) {
		bdev_unlock(d->b);
		return r;
	}
	d->claims = 1;
	return 0;
}

void disk_release(struct disk *d)
{
	if (!d->claims) {
		log_err("disk %s released without a claim", d->b->path);
		return;
	}
	if (--d->claims)
		return;
	/* Jobs write the image too: they end with the last claim, their
	 * unit in flight drained by fmt_release with the fronts' I/O. */
	job_disk_released(d, "the disk was let go (the VM stopped, moved away or was reset): "
			  "start the job again once the disk is served here");
	(void)disk_bitmaps_store(d);
	disk__bmfile_release(d);
	fmt_release(d->b);
	bdev_unlock(d->b);
}

/* ---- Fronts ---- */

void disk_front_add(struct disk *d, struct disk_front *f)
{
	f->next = d->fronts;
	d->fronts = f;
}

void disk_front_del(struct disk *d, struct disk_front *f)
{
	for (struct disk_front **p = &d->fronts; *p; p = &(*p)->next)
		if (*p == f) {
			*p = f->next;
			return;
		}
}

void disk_front_acct(struct disk *d, const char *name, struct acct *sum)
{
	for (struct disk_front *f = d->fronts; f; f = f->next)
		if (f->acct && !strcmp(f->name, name))
			f->acct(f->opaque, sum);
}

unsigned disk_pick_iothread(struct disk *d)
{
	unsigned n = d->num_iothreads;

	if (d->b->max_ctxs && d->b->max_ctxs < n)
		n = d->b->max_ctxs;
	return d->next_pick++ % n;
}

/* On an iothread, between its loop's callbacks: every submission made
 * under the old filter has been made; drain: and has completed. */
static void do_wfilter_drain(void *opaque)
{
	struct disk_iothread *t = opaque;
	struct disk *d = t->drain_disk;

	d->b->engine->kick(t->bctx);
	d->b->engine->drain(t->bctx);
}

static void do_grace(void *opaque)
{
}

void disk_grace(struct disk *d)
{
	for (unsigned i = 0; i < d->num_iothreads; i++)
		loop_call_sync(d->iot[i].loop, do_grace, NULL);
}

int disk_switchover(struct disk *d)
{
	const struct disk_wfilter *f = atomic_load_explicit(&d->wfilter, memory_order_acquire);

	return f && f->sync ? f->sync(f->opaque) : 0;
}

int disk_wfilter_set(struct disk *d, const struct disk_wfilter *f)
{
	if (f && atomic_load(&d->wfilter))
		return -EBUSY;
	atomic_store_explicit(&d->wfilter, f, memory_order_release);
	if (!f) {
		disk_grace(d);
		return 0;
	}
	for (unsigned i = 0; i < d->num_iothreads; i++) {
		d->iot[i].drain_disk = d;
		loop_call_sync(d->iot[i].loop, do_wfilter_drain, &d->iot[i]);
	}
	return 0;
}
