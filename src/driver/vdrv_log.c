/*
 * Dirty logging from the frontend's side: qemu docs/interop/vhost-user.rst,
 * "Migration" and "Log description", and the pre-copy check described in
 * vdrv_log.h.
 *
 * One bitmap per connection, created with the connection (opts.dirty_log)
 * and sent again with every start.  A migration source would allocate a
 * new log per migration; we keep one because queue threads mark it without
 * a lock, and a bitmap replaced under them would need a grace period before
 * it could be unmapped.  The driver's marks go on while logging is off
 * (they are harmless there); a start drains the bitmap before its bulk copy.
 */
#include "driver/vdrv_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver/vdrv_internal.h"
#include "util/compiler.h"
#include "util/sys.h"
#include "vhost/vhost_user.h"

struct vdrv_log {
	/* Constant from vdrv__log_new to vdrv__log_free. */
	int fd;				/* the bitmap's memfd, sent with SET_LOG_BASE */
	_Atomic uint64_t *map;		/* the bitmap: bit p = page p (little-endian
					 * words: the spec's log[p / 8] bit p % 8) */
	size_t words, map_bytes, pages;
	const uint8_t *mem;		/* vdrv's shared memory (d->mem) */
	uint8_t *shadow;		/* the "destination": mem_size bytes */
	size_t mem_size;

	pthread_mutex_t lock;		/* serializes everything below, and the
					 * shadow, between sync and the
					 * connecting thread */
	bool on;			/* LOG_ALL acknowledged, shadow current */
	struct vdrv_log_stats st;
};

int vdrv__log_new(struct vdrv *d, struct vdrv_log **out)
{
	struct vdrv_log *l = calloc(1, sizeof(*l));
	void *p;
	int r;

	if (!l)
		return -ENOMEM;
	l->mem = d->mem;
	l->mem_size = d->mem_size;
	l->pages = (d->mem_size + VHOST_LOG_PAGE - 1) / VHOST_LOG_PAGE;
	l->words = (l->pages + 63) / 64;
	l->map_bytes = l->words * sizeof(uint64_t);
	l->fd = memfd_create("vdrv-log", MFD_CLOEXEC);
	if (l->fd < 0 || ftruncate(l->fd, (off_t)l->map_bytes) < 0) {
		r = -errno;
		goto err_fd;
	}
	p = mmap(NULL, l->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, l->fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		goto err_fd;
	}
	l->map = p;
	p = mmap(NULL, l->mem_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		goto err_map;
	}
	l->shadow = p;
	r = -pthread_mutex_init(&l->lock, NULL);
	if (r < 0)
		goto err_shadow;
	*out = l;
	return 0;

err_shadow:
	munmap(l->shadow, l->mem_size);
err_map:
	munmap((void *)l->map, l->map_bytes);
err_fd:
	sys_close(&l->fd);
	free(l);
	return r;
}

void vdrv__log_free(struct vdrv_log *l)
{
	if (!l)
		return;
	pthread_mutex_destroy(&l->lock);
	munmap(l->shadow, l->mem_size);
	munmap((void *)l->map, l->map_bytes);
	sys_close(&l->fd);
	free(l);
}

void vdrv__log_mark(struct vdrv_log *l, uint64_t gpa, size_t len)
{
	uint64_t page, last;

	if (!len || gpa >= l->mem_size || len > l->mem_size - gpa)
		return;
	page = gpa / VHOST_LOG_PAGE;
	last = (gpa + len - 1) / VHOST_LOG_PAGE;
	while (page <= last) {
		unsigned bit = page % 64;
		uint64_t n = MIN(64 - bit, last - page + 1);
		uint64_t mask = (n == 64 ? ~0ull : (1ull << n) - 1) << bit;

		/* Release: the caller's stores to these pages are visible
		 * before the bit is.  Pairs with the acquire exchange in
		 * sync_locked(), which copies a page only after taking its
		 * bit. */
		atomic_fetch_or_explicit(&l->map[page / 64], mask, memory_order_release);
		page += n;
	}
}

/* Take every set bit and copy its page into the shadow.  Returns the
 * pages copied.  Lock held. */
static uint64_t sync_locked(struct vdrv_log *l)
{
	uint64_t copied = 0;

	for (size_t w = 0; w < l->words; w++) {
		uint64_t bits;

		/* Most words are clean: look before exchanging, so a sync
		 * does not write every line of the bitmap. */
		if (!atomic_load_explicit(&l->map[w], memory_order_relaxed))
			continue;
		/* Acquire: pairs with the release or in vdrv__log_mark and
		 * with the backend's atomic or ("Use atomic operations, as
		 * the log may be concurrently manipulated"): the copy below
		 * sees every store made before the bit was set.  A store
		 * after the exchange sets the bit again, for the next sync. */
		bits = atomic_exchange_explicit(&l->map[w], 0, memory_order_acquire);
		while (bits) {
			uint64_t page = w * 64 + (unsigned)__builtin_ctzll(bits);

			bits &= bits - 1;
			if (page >= l->pages)	/* beyond the memory: nothing to copy */
				continue;
			memcpy(l->shadow + page * VHOST_LOG_PAGE, l->mem + page * VHOST_LOG_PAGE,
			       MIN(VHOST_LOG_PAGE, l->mem_size - page * VHOST_LOG_PAGE));
			copied++;
		}
	}
	return copied;
}

/* SET_FEATURES and SET_VRING_ADDR on every running ring, with or without
 * logging ("Migration": "To start/stop logging of data/used ring writes,
 * the front-end may send messages VHOST_USER_SET_FEATURES with
 * VHOST_F_LOG_ALL and VHOST_USER_SET_VRING_ADDR with VHOST_VRING_F_LOG in
 * ring's flags set to 1/0, respectively"). */
static int set_logging(struct vdrv *d, bool on, char *err, size_t errlen)
{
	uint64_t features = d->features | (on ? 1ull << VHOST_F_LOG_ALL : 0);
	int r = vdrv__call(d, VHOST_USER_SET_FEATURES, &features, sizeof(features), NULL, 0);

	if (r < 0) {
		snprintf(err, errlen, "the backend refused SET_FEATURES %s VHOST_F_LOG_ALL: %s",
			 on ? "with" : "without", strerror(-r));
		return r;
	}
	for (unsigned i = 0; i < d->num_queues; i++) {
		struct vhost_vring_addr a;

		if (d->q[i].stopped)
			continue;
		vdrv__vring_addr(&d->q[i], on, &a);
		r = vdrv__call(d, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
		if (r < 0) {
			snprintf(err, errlen, "the backend refused SET_VRING_ADDR %s "
				 "VHOST_VRING_F_LOG on queue %u: %s", on ? "with" : "without",
				 i, strerror(-r));
			return r;
		}
	}
	return 0;
}

/* The checks start and stop share.  Returns 0 or -errno with err set. */
static int can_switch(struct vdrv *d, char *err, size_t errlen)
{
	if (!d->log) {
		snprintf(err, errlen, "connected without dirty logging (opts.dirty_log)");
		return -EINVAL;
	}
	if (!(d->proto_features & (1ull << VHOST_USER_PROTOCOL_F_LOG_SHMFD))) {
		snprintf(err, errlen, "the backend does not offer LOG_SHMFD (vhost-user "
			 "protocol feature %d): it cannot log dirty pages into shared "
			 "memory, so a VM using it cannot migrate", VHOST_USER_PROTOCOL_F_LOG_SHMFD);
		return -ENOTSUP;
	}
	if (!(d->dev_features & (1ull << VHOST_F_LOG_ALL))) {
		snprintf(err, errlen, "the backend does not offer VHOST_F_LOG_ALL (feature "
			 "bit %d): it cannot log dirty pages", VHOST_F_LOG_ALL);
		return -ENOTSUP;
	}
	return 0;
}

static void note_switch(struct vdrv_log *l, uint64_t t0)
{
	uint64_t ns = sys_now_ns() - t0;

	if (ns > l->st.switch_max_ns)
		l->st.switch_max_ns = ns;
}

int vdrv_log_start(struct vdrv *d, char *err, size_t errlen)
{
	struct vhost_user_log desc;
	struct vdrv_log *l = d->log;
	uint8_t reply[sizeof(desc)];
	uint64_t t0 = sys_now_ns();
	int r = can_switch(d, err, errlen);

	if (r < 0)
		return r;
	pthread_mutex_lock(&l->lock);
	if (l->on) {
		snprintf(err, errlen, "dirty logging is already on");
		r = -EINVAL;
		goto out;
	}
	/* "Log description": the log starts at mmap_offset in the fd and
	 * covers guest address 0 up to the end of our one region. */
	desc = (struct vhost_user_log){ .mmap_size = l->map_bytes, .mmap_offset = 0 };
	r = vdrv__send(d, VHOST_USER_SET_LOG_BASE, false, &desc, sizeof(desc), &l->fd, 1);
	/* "Communication": with LOG_SHMFD, SET_LOG_BASE gets a reply.  Its
	 * payload has no meaning in the spec ("reply payload: N/A"): it is
	 * the point after which the backend has the log mapped, nothing
	 * more, so its content is not read as a status. */
	if (r >= 0)
		r = vdrv__recv(d, VHOST_USER_SET_LOG_BASE, reply, sizeof(reply));
	if (r < 0) {
		snprintf(err, errlen, "SET_LOG_BASE failed: %s", strerror(-r));
		goto out;
	}
	r = set_logging(d, true, err, errlen);
	if (r < 0)
		goto out;
	/* The bulk stage.  Every write the backend makes from here on is
	 * logged (it acknowledged LOG_ALL and the ring flags); the driver
	 * has been marking all along.  Bits set so far are taken first, so
	 * the copy sees the stores they stand for (sync_locked), and any
	 * store the copy misses sets a bit again after it. */
	(void)sync_locked(l);
	memcpy(l->shadow, l->mem, l->mem_size);
	l->st.bulk_pages += l->pages;
	l->st.starts++;
	l->on = true;
	note_switch(l, t0);
out:
	pthread_mutex_unlock(&l->lock);
	return r < 0 ? r : 0;
}

int vdrv_log_stop(struct vdrv *d, char *err, size_t errlen)
{
	struct vdrv_log *l = d->log;
	uint64_t t0 = sys_now_ns();
	int r = can_switch(d, err, errlen);

	if (r < 0)
		return r;
	pthread_mutex_lock(&l->lock);
	if (!l->on) {
		snprintf(err, errlen, "dirty logging is already off");
		r = -EINVAL;
		goto out;
	}
	r = set_logging(d, false, err, errlen);
	if (r < 0)
		goto out;
	l->on = false;
	l->st.stops++;
	note_switch(l, t0);
out:
	pthread_mutex_unlock(&l->lock);
	return r;
}

int64_t vdrv_log_sync(struct vdrv *d)
{
	struct vdrv_log *l = d->log;
	uint64_t n = 0;

	if (!l)
		return -EINVAL;
	pthread_mutex_lock(&l->lock);
	if (l->on) {
		n = sync_locked(l);
		l->st.syncs++;
		l->st.dirty_pages += n;
	}
	pthread_mutex_unlock(&l->lock);
	return (int64_t)n;
}

int64_t vdrv_log_compare(struct vdrv *d, vdrv_log_diff_fn *fn, void *opaque)
{
	struct vdrv_log *l = d->log;
	int64_t diff = 0;
	uint64_t n;

	if (!l)
		return -EINVAL;
	for (unsigned i = 0; i < d->num_queues; i++)
		if (!d->q[i].stopped)
			return -EBUSY;
	pthread_mutex_lock(&l->lock);
	if (!l->on) {
		diff = -EINVAL;
		goto out;
	}
	n = sync_locked(l);
	l->st.syncs++;
	l->st.dirty_pages += n;
	for (size_t off = 0; off < l->mem_size; off += VHOST_LOG_PAGE) {
		size_t end = MIN(off + VHOST_LOG_PAGE, l->mem_size);

		if (!memcmp(l->shadow + off, l->mem + off, end - off))
			continue;
		for (size_t b = off; b < end;) {
			size_t e = b;

			while (e < end && l->shadow[e] != l->mem[e])
				e++;
			if (e > b) {
				if (fn)
					fn(opaque, b, e - b);
				diff += (int64_t)(e - b);
				b = e;
			} else {
				b++;
			}
		}
	}
out:
	pthread_mutex_unlock(&l->lock);
	return diff;
}

void vdrv_log_get_stats(struct vdrv *d, struct vdrv_log_stats *st)
{
	if (!d->log) {
		*st = (struct vdrv_log_stats){ 0 };
		return;
	}
	pthread_mutex_lock(&d->log->lock);
	*st = d->log->st;
	pthread_mutex_unlock(&d->log->lock);
}
