/*
 * The disk's dirty bitmaps (disk.h; issue 46): every write of every
 * front (the guest's writes, discards and write zeroes; NBD writes, trims
 * and write zeroes) marks each enabled bitmap (disk_dirty), so a backup
 * tool can read only what changed (NBD "qemu:dirty-bitmap:NAME").
 *
 * The list of bitmaps is an immutable array published with a release
 * store: an iothread marking reads it once (acquire) and marks what it
 * lists.  Main thread changes it: a new array, published, then a grace
 * period (a call on every iothread: every mark begun under the old array
 * has ended, as marks run inside the iothreads' loop iterations) before
 * the old array, and a removed bitmap, are freed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disk/disk.h"
#include "util/barrier.h"
#include "util/log.h"

void disk__dirty_slow(struct disk_bitmaps *l, uint64_t off, uint64_t len)
{
	for (unsigned i = 0; i < l->n; i++)
		dbm_mark(l->b[i], off, len);
}

static void noop(void *opaque)
{
}

/* Every mark begun before now has ended. */
static void grace(struct disk *d)
{
	for (unsigned i = 0; i < d->num_iothreads; i++)
		loop_call_sync(d->iot[i].loop, noop, NULL);
}

static struct disk_bitmaps *list_of(const struct disk *d)
{
	return atomic_load_explicit(&d->bitmaps, memory_order_acquire);
}

struct dbm *disk_bitmap_find(struct disk *d, const char *name)
{
	struct disk_bitmaps *l = list_of(d);

	for (unsigned i = 0; l && i < l->n; i++)
		if (!strcmp(l->b[i]->name, name))
			return l->b[i];
	return NULL;
}

/* Publish a list of n bitmaps (b, with add appended and drop left out),
 * then wait out the marks on the old one and free it.  0 or -ENOMEM. */
static int publish(struct disk *d, struct dbm *add, const struct dbm *drop)
{
	struct disk_bitmaps *old = list_of(d), *l;
	unsigned n = 0, cap = (old ? old->n : 0) + 1;

	l = malloc(sizeof(*l) + cap * sizeof(l->b[0]));
	if (!l)
		return -ENOMEM;
	for (unsigned i = 0; old && i < old->n; i++)
		if (old->b[i] != drop)
			l->b[n++] = old->b[i];
	if (add)
		l->b[n++] = add;
	l->n = n;
	/* Pairs with the acquire in disk_dirty: the array's contents are
	 * visible before the pointer. */
	atomic_store_explicit(&d->bitmaps, n ? l : NULL, memory_order_release);
	if (!n)
		free(l);
	grace(d);
	free(old);
	return 0;
}

int disk_bitmap_add(struct disk *d, const char *name, uint32_t gran, bool disabled, char *err,
		    size_t errlen)
{
	struct dbm *b;
	int r;

	if (!dbm_name_ok(name)) {
		snprintf(err, errlen, "bitmap name '%.80s': give 1 to %u of A-Z a-z 0-9 _ . -",
			 name, DBM_NAME_MAX);
		return -EINVAL;
	}
	if (!gran)
		gran = DBM_DEFAULT_GRANULARITY;
	if (gran < DBM_MIN_GRANULARITY || gran > DBM_MAX_GRANULARITY || (gran & (gran - 1))) {
		snprintf(err, errlen, "granularity %u: give a power of two from 4K to 2G", gran);
		return -EINVAL;
	}
	if (disk_bitmap_find(d, name)) {
		snprintf(err, errlen, "a bitmap named '%s' exists already", name);
		return -EEXIST;
	}
	r = dbm_new(name, READ_ONCE(d->b->size), gran, &b);
	if (r < 0) {
		snprintf(err, errlen, "out of memory for bitmap '%s'", name);
		return r;
	}
	atomic_store(&b->enabled, !disabled);
	r = publish(d, b, NULL);
	if (r < 0) {
		dbm_free(b);
		snprintf(err, errlen, "out of memory");
		return r;
	}
	log_info("bitmap %s added (%u-byte granularity%s)", name, gran,
		 disabled ? ", disabled" : "");
	return 0;
}

static struct dbm *get(struct disk *d, const char *name, char *err, size_t errlen)
{
	struct dbm *b = disk_bitmap_find(d, name);

	if (!b)
		snprintf(err, errlen, "no bitmap '%.80s' (vblkctl bitmap list shows them)", name);
	return b;
}

int disk_bitmap_remove(struct disk *d, const char *name, char *err, size_t errlen)
{
	struct dbm *b = get(d, name, err, errlen);
	int r;

	if (!b)
		return -ENOENT;
	if (atomic_load(&b->users)) {
		snprintf(err, errlen, "bitmap '%s' is in use by %u NBD client%s: it goes once "
			 "they do", name, atomic_load(&b->users), atomic_load(&b->users) == 1 ? "" : "s");
		return -EBUSY;
	}
	r = publish(d, NULL, b);
	if (r < 0) {
		snprintf(err, errlen, "out of memory");
		return r;
	}
	dbm_free(b);
	log_info("bitmap %s removed", name);
	return 0;
}

int disk_bitmap_clear(struct disk *d, const char *name, char *err, size_t errlen)
{
	struct dbm *b = get(d, name, err, errlen);

	if (!b)
		return -ENOENT;
	dbm_clear(b);
	log_info("bitmap %s cleared", name);
	return 0;
}

int disk_bitmap_enable(struct disk *d, const char *name, bool on, char *err, size_t errlen)
{
	struct dbm *b = get(d, name, err, errlen);

	if (!b)
		return -ENOENT;
	atomic_store(&b->enabled, on);
	/* A write begun before a disable may still mark it; none begun
	 * after an enable is missed once this returns. */
	grace(d);
	log_info("bitmap %s %s", name, on ? "enabled" : "disabled");
	return 0;
}

int disk_bitmap_merge(struct disk *d, const char *const *srcs, unsigned n, const char *dst,
		      char *err, size_t errlen)
{
	struct dbm *t = get(d, dst, err, errlen);

	if (!t)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++)
		if (!get(d, srcs[i], err, errlen))
			return -ENOENT;
	for (unsigned i = 0; i < n; i++)
		if (strcmp(srcs[i], dst))
			dbm_merge(t, disk_bitmap_find(d, srcs[i]));
	log_info("bitmap %s: %u bitmap%s merged in", dst, n, n == 1 ? "" : "s");
	return 0;
}

unsigned disk_bitmap_list(struct disk *d, struct disk_bitmap_info *out, unsigned max)
{
	struct disk_bitmaps *l = list_of(d);
	unsigned n = l ? l->n : 0;

	for (unsigned i = 0; i < n && i < max; i++) {
		const struct dbm *b = l->b[i];

		out[i] = (struct disk_bitmap_info){
			.granularity = dbm_granularity(b), .size = b->size,
			.dirty = dbm_dirty_bytes(b), .enabled = atomic_load(&b->enabled),
			.persistent = b->persistent, .users = atomic_load(&b->users) };
		snprintf(out[i].name, sizeof(out[i].name), "%s", b->name);
	}
	return n;
}

int disk_bitmaps_grow(struct disk *d, uint64_t size)
{
	struct disk_bitmaps *old = list_of(d), *l;
	unsigned n = old ? old->n : 0;

	if (!n)
		return 0;
	l = malloc(sizeof(*l) + n * sizeof(l->b[0]));
	if (!l)
		return -ENOMEM;
	for (unsigned i = 0; i < n; i++) {
		l->b[i] = old->b[i]->size >= size ? old->b[i] : dbm_grow(old->b[i], size);
		if (!l->b[i]) {
			while (i--)
				if (l->b[i] != old->b[i])
					dbm_free(l->b[i]);
			free(l);
			return -ENOMEM;
		}
		atomic_store(&l->b[i]->users, atomic_load(&old->b[i]->users));
	}
	l->n = n;
	atomic_store_explicit(&d->bitmaps, l, memory_order_release);
	grace(d);
	/* What was marked on the old ones before the grace, carried over. */
	for (unsigned i = 0; i < n; i++)
		if (l->b[i] != old->b[i]) {
			dbm_merge(l->b[i], old->b[i]);
			dbm_free(old->b[i]);
		}
	free(old);
	return 0;
}

void disk__bitmaps_free(struct disk *d)
{
	struct disk_bitmaps *l = list_of(d);

	for (unsigned i = 0; l && i < l->n; i++)
		dbm_free(l->b[i]);
	free(l);
	atomic_store(&d->bitmaps, NULL);
}
