/*
 * rbd engine: a Ceph RBD image through librbd (--disk rbd:POOL/IMAGE[@SNAP],
 * --ceph-conf, --ceph-id).
 *
 * librbd completes I/O on its own threads.  We ask it to announce
 * completions on an eventfd instead of calling us there
 * (rbd_set_image_notification), watch that eventfd in the iothread's loop,
 * and collect the completions with rbd_poll_io_events on the iothread:
 * they then join the same deferred-call batches (one interrupt per batch)
 * and polling decisions as io_uring's, with no thread hop of ours and no
 * lock on our side.  The poll handler looks for completions without the
 * eventfd: rbd_poll_io_events is a pop from a lock-free queue.
 *
 * One image handle per disk, so one iothread: librbd's exclusive lock
 * belongs to a handle, and two handles of one process writing the same
 * image would pass it back and forth.  (Queues still spread over that
 * iothread; librbd parallelizes below it.)
 *
 * The image lock (bdev_lock) is librbd's exclusive lock, acquired
 * explicitly while rings run: another client asking for it is refused
 * (another vblkd, or QEMU's rbd driver, gets an error instead of taking
 * it over silently); we flush librbd's cache before handing it over and
 * drop it after taking it, so a migration's destination sees every write.
 */
#include <errno.h>
#include <poll.h>
#include <rados/librados.h>
#include <rbd/librbd.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "backend/bdev.h"
#include "backend/module.h"
#include "backend/efd.h"
#include "loop/loop.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/sys.h"

/* A cluster that does not answer: fail in this time, not librados' 300 s. */
#define RBD_CONNECT_TIMEOUT "10"
/* Completions taken per rbd_poll_io_events call. */
#define RBD_BATCH 32

struct rbd_disk {
	rados_t cluster;
	rados_ioctx_t ioctx;
	rbd_image_t image;
	char *pool, *name, *snap;
	bool exclusive_lock;		/* the image has the feature */
	bool ctx_taken;			/* the one ctx exists */
	/* The image's size now: librbd tells us when its header changes
	 * (rbd_update_watch), e.g. `rbd resize --allow-shrink` by someone
	 * else.  Written on librbd's thread, read on the iothread. */
	_Atomic uint64_t image_size;
	uint64_t watch;
	bool watching;
};

struct bdev_ctx {
	struct bdev *b;
	struct rbd_disk *d;
	struct loop *loop;
	struct bdev_efd efd;
	int librbd_cpu;		/* the one CPU librbd's threads may use, or -1 */
	/* Found by the poll handler, run by its run(). */
	rbd_completion_t found[RBD_BATCH];
	unsigned nfound;
	bool shrink_logged;
};

/* ---- Opening the image (main thread) ---- */

/* rbd:POOL/IMAGE[@SNAP] -> its parts (allocated), or -EINVAL. */
static int rbd_parse_spec(const char *spec, struct rbd_disk *d, char *err, size_t errlen)
{
	const char *p = spec + 4, *slash = strchr(p, '/'), *at;

	if (!slash || slash == p || !slash[1] || strchr(slash + 1, '/')) {
		snprintf(err, errlen, "--disk '%s' is not rbd:POOL/IMAGE[@SNAP] (e.g. "
			 "rbd:rbd/vm0-disk)", spec);
		return -EINVAL;
	}
	at = strchr(slash + 1, '@');
	if (at && (at == slash + 1 || !at[1])) {
		snprintf(err, errlen, "--disk '%s': empty image or snapshot name", spec);
		return -EINVAL;
	}
	d->pool = strndup(p, (size_t)(slash - p));
	d->name = at ? strndup(slash + 1, (size_t)(at - slash - 1)) : strdup(slash + 1);
	d->snap = at ? strdup(at + 1) : NULL;
	if (!d->pool || !d->name || (at && !d->snap)) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

static void rbd_disk_free(struct rbd_disk *d)
{
	if (d->watching)
		(void)rbd_update_unwatch(d->image, d->watch);
	if (d->image)
		rbd_close(d->image);
	if (d->ioctx)
		rados_ioctx_destroy(d->ioctx);
	if (d->cluster)
		rados_shutdown(d->cluster);
	free(d->pool);
	free(d->name);
	free(d->snap);
	free(d);
}

static int rbd_cluster_connect(struct rbd_disk *d, const struct bdev_opts *o, char *err,
			   size_t errlen)
{
	const char *id = o->ceph_id;
	int r;

	/* "client.admin" or "admin": librados wants the id alone. */
	if (id && !strncmp(id, "client.", 7))
		id = id + 7;
	r = rados_create(&d->cluster, id);
	if (r < 0) {
		snprintf(err, errlen, "cannot set up a Ceph client: %s", strerror(-r));
		d->cluster = NULL;
		return r;
	}
	r = rados_conf_read_file(d->cluster, o->ceph_conf);
	if (r < 0) {
		if (o->ceph_conf)
			snprintf(err, errlen, "cannot read Ceph config '%s': %s: fix --ceph-conf",
				 o->ceph_conf, strerror(-r));
		else
			snprintf(err, errlen, "no Ceph config found ($CEPH_CONF, "
				 "/etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf): pass "
				 "--ceph-conf PATH");
		return r;
	}
	(void)rados_conf_parse_env(d->cluster, NULL);
	(void)rados_conf_set(d->cluster, "client_mount_timeout", RBD_CONNECT_TIMEOUT);
	if (o->cache == BDEV_CACHE_NONE)
		(void)rados_conf_set(d->cluster, "rbd_cache", "false");
	else if (o->cache == BDEV_CACHE_WRITEBACK)
		(void)rados_conf_set(d->cluster, "rbd_cache", "true");
	r = rados_connect(d->cluster);
	if (r < 0) {
		snprintf(err, errlen, "cannot connect to the Ceph cluster%s%s (client.%s): "
			 "%s: are its monitors (mon_host) up and reachable, and the "
			 "keyring right?", o->ceph_conf ? " of " : "",
			 o->ceph_conf ? o->ceph_conf : "", id ? id : "admin", strerror(-r));
		return r;
	}
	r = rados_ioctx_create(d->cluster, d->pool, &d->ioctx);
	if (r < 0) {
		d->ioctx = NULL;
		if (r == -ENOENT)
			snprintf(err, errlen, "Ceph pool '%s' does not exist: create it "
				 "(ceph osd pool create %s; rbd pool init %s) or fix --disk",
				 d->pool, d->pool, d->pool);
		else
			snprintf(err, errlen, "cannot open Ceph pool '%s': %s", d->pool,
				 strerror(-r));
		return r;
	}
	return 0;
}

/* librbd's thread, after it refreshed the image's header. */
static void rbd_image_updated(void *arg)
{
	struct rbd_disk *d = arg;
	uint64_t size;

	if (rbd_get_size(d->image, &size) == 0)
		atomic_store(&d->image_size, size);
}

static int rbd_disk_open(struct bdev *b, const struct bdev_opts *o, char *err,
			 size_t errlen)
{
	struct rbd_disk *d = calloc(1, sizeof(*d));
	uint64_t size, features = 0;
	int r;

	if (!d) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = rbd_parse_spec(o->path, d, err, errlen);
	if (r < 0)
		goto err;
	r = rbd_cluster_connect(d, o, err, errlen);
	if (r < 0)
		goto err;
	/* A snapshot never changes: export it read-only. */
	b->read_only = o->read_only || d->snap;
	r = b->read_only ? rbd_open_read_only(d->ioctx, d->name, &d->image, d->snap) :
			   rbd_open(d->ioctx, d->name, &d->image, NULL);
	if (r < 0) {
		d->image = NULL;
		if (r == -ENOENT)
			snprintf(err, errlen, "RBD image '%s/%s'%s%s does not exist: create "
				 "it (rbd create --size 10G %s/%s) or fix --disk", d->pool,
				 d->name, d->snap ? " or its snapshot " : "",
				 d->snap ? d->snap : "", d->pool, d->name);
		else
			snprintf(err, errlen, "cannot open RBD image '%s/%s': %s", d->pool,
				 d->name, strerror(-r));
		goto err;
	}
	r = rbd_get_size(d->image, &size);
	if (r < 0) {
		snprintf(err, errlen, "cannot read the size of RBD image '%s/%s': %s",
			 d->pool, d->name, strerror(-r));
		goto err;
	}
	(void)rbd_get_features(d->image, &features);
	d->exclusive_lock = features & RBD_FEATURE_EXCLUSIVE_LOCK;
	atomic_store(&d->image_size, size);
	d->watching = rbd_update_watch(d->image, &d->watch, rbd_image_updated, d) == 0;
	if (!d->watching)
		log_warn("RBD image %s/%s: cannot watch its header: a shrink by another "
			 "client would not be noticed", d->pool, d->name);
	b->block_size = o->block_size ? o->block_size : 512;
	b->phys_block_size = b->block_size;
	b->discard_granularity = b->block_size;
	size -= size % b->block_size;
	if (!size) {
		snprintf(err, errlen, "RBD image '%s/%s' is empty: resize it (rbd resize "
			 "--size 10G %s/%s)", d->pool, d->name, d->pool, d->name);
		r = -EINVAL;
		goto err;
	}
	b->size = size;
	if (d->snap && !o->read_only)
		log_info("disk %s is a snapshot: exported read-only", o->path);
	b->max_ctxs = 1;		/* one image handle: see the top */
	b->priv = d;
	if (!d->exclusive_lock && !b->read_only)
		log_warn("RBD image %s/%s has no exclusive-lock feature: a second writer "
			 "cannot be detected (rbd feature enable %s/%s exclusive-lock)",
			 d->pool, d->name, d->pool, d->name);
	return 0;

err:
	rbd_disk_free(d);
	return r;
}

static void rbd_disk_close(struct bdev *b)
{
	rbd_disk_free(b->priv);
}

/* bdev_pread: librbd's synchronous read (before any ctx, see the top). */
static int rbd_disk_pread(struct bdev *b, void *buf, size_t len, uint64_t off)
{
	struct rbd_disk *d = b->priv;
	ssize_t n = rbd_read(d->image, off, len, buf);

	if (n < 0)
		return (int)n;
	if ((size_t)n < len)		/* clipped at the end: reads as a hole */
		memset((uint8_t *)buf + n, 0, len - (size_t)n);
	return 0;
}

/* ---- The image lock (main thread, rings stopped) ---- */

/* bdev_resize: librbd refreshes the image header when someone else
 * resized it (its watch), so the size read here is the image's now. */
static int rbd_disk_resize(struct bdev *b, uint64_t size, char *err, size_t errlen)
{
	struct rbd_disk *d = b->priv;
	uint64_t have = 0;
	int r = rbd_get_size(d->image, &have);

	if (r < 0) {
		snprintf(err, errlen, "cannot read the size of RBD image '%s/%s': %s",
			 d->pool, d->name, strerror(-r));
		return r;
	}
	atomic_store(&d->image_size, have);
	if (have < size) {
		snprintf(err, errlen, "RBD image '%s/%s' is %llu bytes: grow it first "
			 "(rbd resize --size %lluB %s/%s)", d->pool, d->name,
			 (unsigned long long)have, (unsigned long long)size, d->pool, d->name);
		return -ENOSPC;
	}
	return 0;
}

static int rbd_disk_lock(struct bdev *b)
{
	struct rbd_disk *d = b->priv;
	int r;

	if (!d->exclusive_lock)
		return 0;
	r = rbd_lock_acquire(d->image, RBD_LOCK_MODE_EXCLUSIVE);
	if (r < 0) {
		if (r == -EROFS || r == -EBUSY || r == -EAGAIN) {
			log_err("RBD image %s/%s is in use: another client holds its "
				"exclusive lock (a vblkd, QEMU or qemu-storage-daemon serving "
				"it to a running VM); two writers would corrupt it, so neither "
				"this frontend's rings nor an NBD client start here: stop the "
				"other writer, or migrate its VM here", d->pool, d->name);
			return -EBUSY;
		}
		log_err("RBD image %s/%s: cannot take its exclusive lock: %s", d->pool,
			d->name, strerror(-r));
		return r;
	}
	/* Whatever librbd cached before another client wrote is stale. */
	(void)rbd_invalidate_cache(d->image);
	log_info("RBD image %s/%s: exclusive lock taken (rings running)", d->pool, d->name);
	return 0;
}

static void rbd_disk_unlock(struct bdev *b)
{
	struct rbd_disk *d = b->priv;
	int r;

	if (!d->exclusive_lock)
		return;
	/* The next writer (a migration's destination) reads the cluster,
	 * not our cache. */
	r = rbd_flush(d->image);
	if (r < 0)
		log_err("RBD image %s/%s: flush before handing it over failed: %s",
			d->pool, d->name, strerror(-r));
	r = rbd_lock_release(d->image);
	if (r < 0)
		log_err("RBD image %s/%s: releasing its exclusive lock failed: %s",
			d->pool, d->name, strerror(-r));
	else
		log_info("RBD image %s/%s: exclusive lock released (no ring running)",
			 d->pool, d->name);
}

/* ---- I/O (iothread) ---- */

static void rbd_io_start(struct bdev_ctx *c, struct bdev_io *io)
{
	rbd_image_t img = c->d->image;
	rbd_completion_t comp;
	int r;

	/* Shrunk under us (our size is the one the guest was told): librbd
	 * would cut a write at the image's end and report it done; a write
	 * whose end is gone fails, as one past the end does in librbd. */
	if ((io->op == BDEV_WRITE || io->op == BDEV_WRITE_ZEROES) &&
	    unlikely(io->offset + (io->op == BDEV_WRITE ? io->len : io->length) >
		     atomic_load_explicit(&c->d->image_size, memory_order_relaxed))) {
		if (!c->shrink_logged)
			log_err("RBD image %s/%s shrank to %llu bytes under us (the guest was "
				"told %llu): writes past its end fail", c->d->pool, c->d->name,
				(unsigned long long)atomic_load(&c->d->image_size),
				(unsigned long long)c->b->size);
		c->shrink_logged = true;
		bdev_complete(io, -EIO);
		return;
	}
	r = rbd_aio_create_completion(io, NULL, &comp);
	if (r < 0) {
		bdev_complete(io, r);
		return;
	}
	switch (io->op) {
	case BDEV_READ:
		r = rbd_aio_readv(img, io->iov, (int)io->iovcnt, io->offset, comp);
		break;
	case BDEV_WRITE:
		r = rbd_aio_writev(img, io->iov, (int)io->iovcnt, io->offset, comp);
		break;
	case BDEV_FLUSH:
		r = rbd_aio_flush(img, comp);
		break;
	case BDEV_DISCARD:
		r = rbd_aio_discard(img, io->offset, io->length, comp);
		break;
	case BDEV_WRITE_ZEROES:
		/* Without unmap the range must stay allocated. */
		r = rbd_aio_write_zeroes(img, io->offset, io->length, comp,
					 io->unmap ? 0 : RBD_WRITE_ZEROES_FLAG_THICK_PROVISION, 0);
		break;
	default:
		r = -EINVAL;
	}
	if (r < 0) {
		rbd_aio_release(comp);
		bdev_complete(io, r);
		return;
	}
	c->efd.inflight++;
}

static void rbd_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	rbd_io_start(c, io);
}

static void rbd_io_done(struct bdev_ctx *c, struct bdev_io *io, ssize_t res)
{
	c->efd.inflight--;
	/* A read's result is the bytes read: librbd clips a read at the end
	 * of the image (shrunk under us: our size is the old one).  Past the
	 * end reads as zeroes, as from a hole, not as whatever the guest's
	 * buffer held (QEMU's rbd driver pads the same way).  A write that
	 * librbd says it cut short (the image shrank while it was on its
	 * way) did not happen as asked. */
	if (io->op == BDEV_READ && res >= 0 && (size_t)res < io->len)
		iov_memset(io->iov, io->iovcnt, (size_t)res, 0, io->len - (size_t)res);
	else if (io->op == BDEV_WRITE && res > 0 && (size_t)res < io->len)
		res = -EIO;
	/* librbd has no FUA: bdev.c follows a write-through write with a
	 * flush, which also gets it past librbd's cache to the OSDs. */
	bdev_complete(io, res < 0 ? (int)res : 0);
}

static void rbd_run_completions(struct bdev_ctx *c, rbd_completion_t *comps, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		struct bdev_io *io = rbd_aio_get_arg(comps[i]);
		ssize_t res = rbd_aio_get_return_value(comps[i]);

		rbd_aio_release(comps[i]);
		rbd_io_done(c, io, res);
	}
}

static unsigned rbd_reap(struct bdev_ctx *c)
{
	rbd_completion_t comps[RBD_BATCH];
	unsigned total = 0;
	int n;

	if (c->nfound) {
		unsigned k = c->nfound;

		c->nfound = 0;
		rbd_run_completions(c, c->found, k);
		total += k;
	}
	while ((n = rbd_poll_io_events(c->d->image, comps, RBD_BATCH)) > 0) {
		rbd_run_completions(c, comps, (unsigned)n);
		total += (unsigned)n;
		if (n < RBD_BATCH)
			break;
	}
	return total;
}

/* librbd queues completions before it writes the eventfd, so they can be
 * taken without waiting for it. */
static bool rbd_ready(struct bdev_ctx *c)
{
	int n;

	if (c->nfound)
		return true;
	n = rbd_poll_io_events(c->d->image, c->found, RBD_BATCH);
	if (n > 0)
		c->nfound = (unsigned)n;
	return n > 0;
}

/*
 * librbd's threads (messenger, finisher) were started on the main thread
 * (rados_connect) and have its affinity.  When they and the iothread are
 * each allowed one CPU (the daemon under taskset -c N), they share it, and
 * while the one request in flight is with them, the only event coming is
 * its completion, which they make on our CPU: any spinning takes the CPU
 * that the reply's decoding and completion need (loop.h: cpu_bound; as
 * io_uring's worker in the page cache, uring.c).  With more in flight the
 * driver is still sending, from another CPU, and a kick window pays
 * (measured both ways: docs/benchmarks.md, issue 11 a sixth time).  "Share
 * it": both allowed one CPU, the same one (an iothread alone on one CPU
 * runs on it: sched_getcpu, from the vDSO, tells which).
 */
static bool rbd_cpu_bound(struct bdev_ctx *c)
{
	return c->efd.inflight == 1 && c->librbd_cpu >= 0 && loop_cpu_alone(c->loop) &&
	       sched_getcpu() == c->librbd_cpu;
}

/*
 * Not armed: librbd's completions are polled within the kick window
 * (--poll-max-ns), not for as long as a request is in flight under the
 * completion cap.  What completes an RBD request is librbd's own threads
 * (messenger, finisher) in this process, on the CPUs we run on; spinning
 * for the whole of a 200 us round trip takes the CPU those threads need
 * to finish it.  Measured with the daemon on one core: randread QD1 with
 * the client polling 4.2 K -> 5.2 K IOPS, randwrite QD1/QD32 with it
 * sleeping +13 % / +9 %, the rest unchanged (docs/benchmarks.md).
 */
static const struct bdev_efd_ops rbd_efd_ops = {
	.ready = rbd_ready,
	.reap = rbd_reap,
	.cpu_bound = rbd_cpu_bound,
};

static void rbd_kick(struct bdev_ctx *c)
{
	/* librbd sends each request as it is queued. */
}

/* Ceph does not fail I/O while the cluster recovers: with OSDs down this
 * waits until they are back, saying so every 10 s. */
static void rbd_drain(struct bdev_ctx *c)
{
	uint64_t start = sys_now_ns(), said = start;

	while (c->efd.inflight) {
		struct pollfd p = { .fd = c->efd.fd, .events = POLLIN };

		if (!rbd_reap(c))
			(void)poll(&p, 1, 1000);
		(void)sys_eventfd_drain(c->efd.fd);
		if (c->efd.inflight && sys_now_ns() - said > 10000000000ull) {
			said = sys_now_ns();
			log_warn("RBD image %s/%s: still waiting for %u requests after %llu s "
				 "(is the cluster healthy?)", c->d->pool, c->d->name,
				 c->efd.inflight, (unsigned long long)((said - start) / 1000000000ull));
		}
	}
}

static int rbd_ctx_new(struct bdev *b, struct loop *l, unsigned depth,
		       struct bdev_ctx **out)
{
	struct rbd_disk *d = b->priv;
	struct bdev_ctx *c;
	int r;

	if (d->ctx_taken)
		return -EBUSY;		/* one iothread per image (see above) */
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->b = b;
	c->d = d;
	c->loop = l;
	c->librbd_cpu = -1;
	{
		cpu_set_t set;

		/* getpid(): the main thread's mask, which librbd's threads took. */
		if (sched_getaffinity(getpid(), sizeof(set), &set) == 0 && CPU_COUNT(&set) == 1)
			for (int i = 0; i < CPU_SETSIZE; i++)
				if (CPU_ISSET(i, &set))
					c->librbd_cpu = i;
	}
	r = bdev_efd_open(&c->efd, l, &rbd_efd_ops, c);
	if (r < 0)
		goto err_free;
	r = rbd_set_image_notification(d->image, c->efd.fd, EVENT_TYPE_EVENTFD);
	if (r < 0)
		goto err_efd;
	d->ctx_taken = true;
	*out = c;
	return 0;

err_efd:
	bdev_efd_close(&c->efd);
err_free:
	free(c);
	return r;
}

static void rbd_ctx_free(struct bdev_ctx *c)
{
	if (!c)
		return;
	rbd_drain(c);
	/* librbd keeps writing the fd it was given: hand it one that stays
	 * valid (a closed, reused number would get its writes). */
	(void)rbd_set_image_notification(c->d->image, -1, EVENT_TYPE_EVENTFD);
	bdev_efd_close(&c->efd);
	c->d->ctx_taken = false;
	free(c);
}

static const struct bdev_engine bdev_rbd_engine = {
	.name = "rbd",
	.caps = BDEV_CAP_DISCARD | BDEV_CAP_WRITE_ZEROES,
	.ctx_new = rbd_ctx_new,
	.ctx_free = rbd_ctx_free,
	.submit = rbd_submit,
	.kick = rbd_kick,
	.drain = rbd_drain,
	.open = rbd_disk_open,
	.close = rbd_disk_close,
	.pread = rbd_disk_pread,
	.lock = rbd_disk_lock,
	.unlock = rbd_disk_unlock,
	.resize = rbd_disk_resize,
};

/* A module (bdev.h): vblkd-rbd.so. */
BDEV_MODULE_DEFINE(bdev_rbd_engine)
