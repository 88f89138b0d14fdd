/*
 * The image the disk serves, replaced under the fronts (disk.h,
 * disk_replace_image): a mirror's pivot.  Every iothread is parked at
 * once, each in a callback of its own loop after draining what it has in
 * flight, so no front submits and nothing is in flight while the image,
 * the iothreads' engine ctxs and the fronts' copies of them change; then
 * they go on with the new image, the guest none the wiser (QEMU's
 * mirror_exit_common replaces the node with the source drained, the same
 * way).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disk/disk.h"
#include "format/format.h"
#include "util/log.h"
#include "util/sys.h"

struct park {
	struct disk *d;
	const struct disk_quiesce *q;
	pthread_mutex_t lk;
	pthread_cond_t cv;
	unsigned parked;
	bool release;
};

struct park_arg {
	struct park *p;
	struct disk_iothread *t;
	pthread_t th;
	bool started;
};

/* On iothread t: its I/O done, then parked until main lets go. */
static void do_park(void *opaque)
{
	struct park_arg *a = opaque;
	struct park *p = a->p;

	disk_kick(p->d, a->t);
	disk_drain(p->d, a->t);
	if (p->q && p->q->quiesce)
		p->q->quiesce(p->q->opaque, a->t);
	pthread_mutex_lock(&p->lk);
	p->parked++;
	pthread_cond_broadcast(&p->cv);
	while (!p->release)
		pthread_cond_wait(&p->cv, &p->lk);
	pthread_mutex_unlock(&p->lk);
}

/* A helper thread per iothread: loop_call_sync waits for the callback,
 * which waits for main. */
static void *park_thread(void *opaque)
{
	struct park_arg *a = opaque;

	loop_call_sync(a->t->loop, do_park, a);
	return NULL;
}

struct nctx_call {
	struct bdev *b;
	struct disk_iothread *t;
	struct bdev_ctx *ctx;
};

static void do_nctx_new(void *opaque)
{
	struct nctx_call *c = opaque;

	/* The depth of the disk's own ctxs (disk.c do_ctx_new). */
	if (bdev_ctx_new(c->b, c->t->loop, 1024, &c->ctx) < 0)
		c->ctx = NULL;
}

static void do_nctx_free(void *opaque)
{
	struct nctx_call *c = opaque;

	if (c->ctx) {
		c->b->engine->drain(c->ctx);
		c->b->engine->ctx_free(c->ctx);
	}
}

/* keep: ctxs not to free (the caller's: disk_image.ctx), or NULL. */
static void ctxs_free(struct disk *d, struct bdev *b, struct bdev_ctx **ctx,
		      struct bdev_ctx *const *keep)
{
	for (unsigned i = 0; i < d->num_iothreads; i++)
		if (!keep || keep[i] != ctx[i])
			loop_call_sync(d->iot[i].loop, do_nctx_free,
				       &(struct nctx_call){ .b = b, .t = &d->iot[i],
							    .ctx = ctx[i] });
}

/* Anything on the disk that belongs to the image now served, not to what
 * the guest sees: refused rather than lost. */
static int replace_refused(struct disk *d, char *err, size_t errlen)
{
	struct disk_bitmaps *l = atomic_load(&d->bitmaps);
	struct disk_pause_state ps;

	disk_pause_state(d, &ps);
	if (ps.paused || ps.held) {
		snprintf(err, errlen, "the disk is paused (%s): vblkctl resume first", ps.reason);
		return -EBUSY;
	}
	for (unsigned i = 0; l && i < l->n; i++)
		if (l->b[i]->persistent) {
			snprintf(err, errlen, "the disk has persistent bitmap '%s', kept with %s: "
				 "remove it first (vblkctl bitmap remove), or cancel the job to "
				 "keep the disk where it is", l->b[i]->name, d->b->path);
			return -EBUSY;
		}
	return 0;
}

int disk_replace_image(struct disk *d, const struct disk_image *ni,
		       const struct disk_quiesce *q, struct bdev **oldb, struct bdev **oldfile,
		       char *err, size_t errlen)
{
	struct bdev *b = ni->b, *file = ni->file;
	unsigned n = d->num_iothreads;
	struct bdev_ctx **nctx = calloc(n, sizeof(*nctx)), **octx = calloc(n, sizeof(*octx));
	struct park_arg *pa = calloc(n, sizeof(*pa));
	struct park p = { .d = d, .q = q };
	struct bdev *ob = d->b, *of = d->file;
	bool locked = false, claimed = false;
	uint64_t t0;
	int r;

	if (!nctx || !octx || !pa) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto out;
	}
	if (b->size != ob->size || (b->max_ctxs && b->max_ctxs < n) ||
	    (b->read_only && !ob->read_only)) {
		snprintf(err, errlen, "%s cannot take the disk's place: %s", b->path,
			 b->size != ob->size ? "not the disk's size" :
			 b->read_only ? "read-only" : "it takes fewer iothreads than the disk has");
		r = -EINVAL;
		goto out;
	}
	if ((r = replace_refused(d, err, errlen)) < 0)
		goto out;
	/* Held by a front now: the new image is taken as a claim takes it
	 * (disk_claim), before anything moves. */
	if (d->claims && !ni->held) {
		r = bdev_lock(b, 0);
		if (r < 0) {
			snprintf(err, errlen, "%s is in use: another process holds its lock", b->path);
			goto out;
		}
		locked = true;
		if ((r = fmt_claim(b, err, errlen)) < 0)
			goto out;
		claimed = true;
	}
	for (unsigned i = 0; i < n; i++) {
		struct nctx_call c = { .b = b, .t = &d->iot[i] };

		if (ni->ctx && ni->ctx[i]) {
			nctx[i] = ni->ctx[i];
			continue;
		}
		loop_call_sync(d->iot[i].loop, do_nctx_new, &c);
		if (!(nctx[i] = c.ctx)) {
			snprintf(err, errlen, "cannot set up the %s engine for %s on iothread%u",
				 b->engine->name, b->path, i);
			r = -EIO;
			goto out_ctx;
		}
	}

	pthread_mutex_init(&p.lk, NULL);
	pthread_cond_init(&p.cv, NULL);
	for (unsigned i = 0; i < n; i++) {
		pa[i] = (struct park_arg){ .p = &p, .t = &d->iot[i] };
		if (pthread_create(&pa[i].th, NULL, park_thread, &pa[i]) != 0) {
			snprintf(err, errlen, "cannot start a thread to park iothread%u", i);
			r = -EAGAIN;
			break;
		}
		pa[i].started = true;
	}
	t0 = sys_now_ns();
	pthread_mutex_lock(&p.lk);
	while (r == 0 && p.parked < n)
		pthread_cond_wait(&p.cv, &p.lk);
	pthread_mutex_unlock(&p.lk);
	if (r == 0 && q && q->ready)
		r = q->ready(q->opaque, err, errlen);
	if (r == 0) {
		/* Nothing in flight, no front inside a submission: every
		 * iothread reads the new pointers after it is let go (the
		 * lock below orders them). */
		d->b = b;
		d->file = file;
		for (unsigned i = 0; i < n; i++) {
			octx[i] = d->iot[i].bctx;
			d->iot[i].bctx = nctx[i];
			nctx[i] = NULL;
		}
		/* The write filter served the old image (a mirror's copy to
		 * what is now the disk itself): its work is done. */
		atomic_store(&d->wfilter, NULL);
		for (struct disk_front *f = d->fronts; f; f = f->next)
			if (f->rebind)
				f->rebind(f->opaque);
	}
	pthread_mutex_lock(&p.lk);
	p.release = true;
	pthread_cond_broadcast(&p.cv);
	pthread_mutex_unlock(&p.lk);
	for (unsigned i = 0; i < n; i++)
		if (pa[i].started)
			pthread_join(pa[i].th, NULL);
	pthread_cond_destroy(&p.cv);
	pthread_mutex_destroy(&p.lk);
	if (r < 0)
		goto out_ctx;
	log_info("disk: %s serves in place of %s (every iothread parked for %.2f ms)", b->path,
		 ob->path, (double)(sys_now_ns() - t0) / 1e6);

	/* The old image: its ctxs (drained) freed on their threads, its
	 * claim let go as disk_release lets go of the last one. */
	ctxs_free(d, ob, octx, NULL);
	/* A raw disk's bitmap file, with no persistent bitmap left in it
	 * (replace_refused), stays with the old image: stored as it is now
	 * (empty of them), let go and closed. */
	if (atomic_load(&d->bm)) {
		(void)disk_bitmaps_store(d);
		if (d->claims)
			disk__bmfile_release(d);
		disk__bmfile_close(d);
	}
	if (d->claims) {
		fmt_release(ob);
		bdev_unlock(ob);
	}
	/* A raw disk's bitmap file goes beside the new image from now on. */
	free(d->bm_path);
	d->bm_path = NULL;
	if (fmt_bitmap_file_possible(b, false)) {
		char path[4096];

		if (fmt_bitmap_file_path(b->path, path, sizeof(path)) == 0)
			d->bm_path = strdup(path);
	}
	*oldb = ob;
	*oldfile = of;
	goto out;

out_ctx:
	ctxs_free(d, b, nctx, ni->ctx);
	if (claimed)
		fmt_release(b);
out:
	if (r < 0 && locked)
		bdev_unlock(b);
	free(nctx);
	free(octx);
	free(pa);
	return r;
}
