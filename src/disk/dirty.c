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
#include <unistd.h>

#include "disk/disk.h"
#include "format/format.h"
#include "util/barrier.h"
#include "util/log.h"

int disk__dirty_slow(struct disk *d, struct disk_bitmaps *l, uint64_t off, uint64_t len)
{
	for (unsigned i = 0; i < l->n; i++)
		dbm_mark(l->b[i], off, len);
	/* A raw disk's bitmap file: its region written ahead (bmfile.c). */
	if (atomic_load_explicit(&d->bm, memory_order_relaxed))
		return disk__bmfile_write(d, off, len);
	return 0;
}

/* fmt_bitmaps_* on where the persistent bitmaps live (bmfile.c), one at a
 * time with the marks' write-ahead. */
#define BM_CALL(d, call)                                                       \
	({                                                                     \
		struct bdev *bmt = disk__bm_target(d);                         \
		pthread_mutex_lock(&(d)->bm_lock);                             \
		__typeof__(call) bm_res_ = call;                               \
		pthread_mutex_unlock(&(d)->bm_lock);                           \
		bm_res_;                                                       \
	})

/* nb replaced ob in the list, the grace passed: the uses taken or given
 * back on ob since nb was given its count (copied, ob's then) go to nb
 * too (unsigned: a net give-back wraps to a subtraction). */
static void carry_users(struct dbm *nb, struct dbm *ob, unsigned copied)
{
	unsigned now = atomic_load(&ob->users);

	if (now != copied)
		atomic_fetch_add(&nb->users, now - copied);
}

static struct disk_bitmaps *list_of(const struct disk *d)
{
	return atomic_load_explicit(&d->bitmaps, memory_order_acquire);
}

struct dbm *disk_bitmap_find(struct disk *d, const char *name)
{
	struct disk_bitmaps *l = list_of(d);

	for (unsigned i = 0; l && i < l->n; i++)
		if (l->b[i]->name[0] && !strcmp(l->b[i]->name, name))
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
	disk_grace(d);
	free(old);
	return 0;
}

static int hold(struct disk *d, bool force, char *err, size_t errlen);

/* Where a persistent bitmap can go: the image (qcow2), or a raw disk's
 * bitmap file, made now if it is not there yet. */
static int persistent_ok(struct disk *d, const char *name, uint32_t gran, char *err,
			 size_t errlen)
{
	int r;

	if (!atomic_load(&d->bm) && d->bm_path &&
	    (r = disk__bmfile_open(d, true, false, err, errlen)) < 0)
		return r;
	if ((r = BM_CALL(d, fmt_bitmaps_can(bmt, err, errlen))) < 0)
		return r;
	/* One the image could not keep (QEMU's limits): refused now, not
	 * found at the store. */
	return BM_CALL(d, fmt_bitmaps_fit(bmt, name, gran, READ_ONCE(d->b->size), err, errlen));
}

int disk_bitmap_add(struct disk *d, const char *name, uint32_t gran, bool disabled,
		    bool persistent, char *err, size_t errlen)
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
	if (persistent && (r = persistent_ok(d, name, gran, err, errlen)) < 0)
		return r;
	r = dbm_new(name, READ_ONCE(d->b->size), gran, &b);
	if (r < 0) {
		snprintf(err, errlen, "out of memory for bitmap '%s'", name);
		return r;
	}
	atomic_store(&b->enabled, !disabled);
	b->persistent = persistent;
	r = publish(d, b, NULL);
	if (r < 0) {
		dbm_free(b);
		snprintf(err, errlen, "out of memory");
		return r;
	}
	/* In the image from now (if it is ours): a crash keeps it. */
	if (persistent && hold(d, true, NULL, 0) < 0)
		log_err("bitmap %s: not yet in the image (it will be at the release)", name);
	log_info("bitmap %s added (%u-byte granularity%s%s)", name, gran,
		 disabled ? ", disabled" : "", persistent ? ", persistent" : "");
	return 0;
}

/* The format keeps (points at) the disk's persistent bitmaps: told of
 * every change of the set before a bitmap is freed.  force: a persistent
 * bitmap was added, removed, enabled, disabled or merged into: the image
 * reflects it at once if it is ours (format.h, fmt_bitmaps_hold: a crash
 * from here on finds it as it is now, and covering every write). */
static int hold(struct disk *d, bool force, char *err, size_t errlen)
{
	struct disk_bitmaps *l = list_of(d);
	struct dbm **p = calloc(l ? l->n + 1 : 1, sizeof(*p));
	unsigned n = 0;
	int r;

	if (force)
		d->bm_unsaved = true;
	if (!p)
		return -ENOMEM;
	for (unsigned i = 0; l && i < l->n; i++)
		if (l->b[i]->persistent)
			p[n++] = l->b[i];
	r = BM_CALL(d, fmt_bitmaps_hold(bmt, p, n, force && d->claims));
	free(p);
	if (r < 0 && err)
		snprintf(err, errlen, "cannot write the persistent bitmaps to the image: %s",
			 strerror(-r));
	return r;
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
	/* dbm_use's other side: a connection selecting it now either is
	 * counted here or backs out. */
	atomic_store(&b->removing, true);
	if (atomic_load(&b->users)) {
		unsigned u = atomic_load(&b->users);

		atomic_store(&b->removing, false);
		snprintf(err, errlen, "bitmap '%s' is in use by %u NBD client%s: it goes once "
			 "they do", name, u, u == 1 ? "" : "s");
		return -EBUSY;
	}
	r = publish(d, NULL, b);
	if (r < 0) {
		atomic_store(&b->removing, false);
		snprintf(err, errlen, "out of memory");
		return r;
	}
	/* The format lets go of it before it is freed. */
	if (b->persistent)
		(void)hold(d, true, NULL, 0);
	dbm_free(b);
	log_info("bitmap %s removed", name);
	return 0;
}

int disk_bitmap_clear(struct disk *d, const char *name, char *err, size_t errlen)
{
	struct dbm *b = get(d, name, err, errlen);

	if (!b)
		return -ENOENT;
	/* The image's copy keeps more bits than this: no harm after a crash. */
	if (b->persistent)
		d->bm_unsaved = true;
	dbm_clear(b);
	log_info("bitmap %s cleared", name);
	return 0;
}

int disk_bitmap_enable(struct disk *d, const char *name, bool on, char *err, size_t errlen)
{
	struct dbm *b = get(d, name, err, errlen);
	int r;

	if (!b)
		return -ENOENT;
	atomic_store(&b->enabled, on);
	/* A write begun before a disable may still mark it; none begun
	 * after an enable is missed once this returns. */
	disk_grace(d);
	if (b->persistent && (r = hold(d, true, err, errlen)) < 0)
		return r;
	log_info("bitmap %s %s", name, on ? "enabled" : "disabled");
	return 0;
}

int disk_bitmap_merge(struct disk *d, const char *const *srcs, unsigned n, const char *dst,
		      char *err, size_t errlen)
{
	struct dbm *t = get(d, dst, err, errlen);
	int r;

	if (!t)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++)
		if (!get(d, srcs[i], err, errlen))
			return -ENOENT;
	for (unsigned i = 0; i < n; i++)
		if (strcmp(srcs[i], dst))
			dbm_merge(t, disk_bitmap_find(d, srcs[i]));
	if (t->persistent && (r = hold(d, true, err, errlen)) < 0)
		return r;
	log_info("bitmap %s: %u bitmap%s merged in", dst, n, n == 1 ? "" : "s");
	return 0;
}

unsigned disk_bitmap_list(struct disk *d, struct disk_bitmap_info *out, unsigned max)
{
	struct disk_bitmaps *l = list_of(d);
	unsigned n = 0;

	for (unsigned j = 0; l && j < l->n; j++) {
		const struct dbm *b = l->b[j];
		unsigned i;

		if (!b->name[0])
			continue;	/* a backup's own (disk_bitmap_hidden_add) */
		if ((i = n++) >= max)
			continue;
		out[i] = (struct disk_bitmap_info){
			.granularity = dbm_granularity(b), .size = b->size,
			.dirty = dbm_dirty_bytes(b), .enabled = atomic_load(&b->enabled),
			.persistent = b->persistent, .users = atomic_load(&b->users) };
		snprintf(out[i].name, sizeof(out[i].name), "%s", b->name);
	}
	return n;
}

int disk_bitmaps_can_grow(struct disk *d, uint64_t size, char *err, size_t errlen)
{
	return BM_CALL(d, fmt_bitmaps_fit(bmt, NULL, 0, size, err, errlen));
}

int disk_bitmaps_grow(struct disk *d, uint64_t size)
{
	struct disk_bitmaps *old = list_of(d), *l;
	unsigned n = old ? old->n : 0, *copied;
	int r;

	/* A raw disk's bitmap file is a qcow2 of the disk's size (its
	 * bitmaps' tables are sized by it): it grows first, the held
	 * bitmaps stored at the old size by its grow (qcow2_grow), then
	 * at the new one by the hold below.  Not grown, the next start
	 * refused the disk. */
	if ((r = disk__bmfile_grow(d, size)) < 0)
		return r;
	if (!n)
		return 0;
	l = malloc(sizeof(*l) + n * sizeof(l->b[0]));
	copied = calloc(n, sizeof(*copied));
	if (!l || !copied) {
		free(l);
		free(copied);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < n; i++) {
		l->b[i] = old->b[i]->size >= size ? old->b[i] : dbm_grow(old->b[i], size);
		if (!l->b[i]) {
			while (i--)
				if (l->b[i] != old->b[i])
					dbm_free(l->b[i]);
			free(l);
			free(copied);
			return -ENOMEM;
		}
		if (l->b[i] != old->b[i]) {
			copied[i] = atomic_load(&old->b[i]->users);
			atomic_store(&l->b[i]->users, copied[i]);
		}
	}
	l->n = n;
	atomic_store_explicit(&d->bitmaps, l, memory_order_release);
	disk_grace(d);
	/* What was marked on the old ones before the grace, carried over;
	 * so are the uses taken or given back on them meanwhile (none
	 * after the grace: every lookup finds the new ones). */
	for (unsigned i = 0; i < n; i++)
		if (l->b[i] != old->b[i]) {
			dbm_merge(l->b[i], old->b[i]);
			carry_users(l->b[i], old->b[i], copied[i]);
		}
	(void)hold(d, true, NULL, 0);
	for (unsigned i = 0; i < n; i++)
		if (l->b[i] != old->b[i])
			dbm_free(old->b[i]);
	free(old);
	free(copied);
	return 0;
}

int disk_bitmap_hidden_add(struct disk *d, uint32_t gran, struct dbm **out)
{
	struct dbm *b;
	int r = dbm_new("hidden", READ_ONCE(d->b->size), gran, &b);

	if (r < 0)
		return r;
	b->name[0] = '\0';
	atomic_store(&b->enabled, true);
	r = publish(d, b, NULL);
	if (r < 0) {
		dbm_free(b);
		return r;
	}
	*out = b;
	return 0;
}

void disk_bitmap_hidden_remove(struct disk *d, struct dbm *b)
{
	/* Out of memory for the new list: the old one with it stays, and
	 * so does b (marked on, harmless). */
	if (publish(d, NULL, b) < 0) {
		log_err("out of memory: a backup's bitmap stays (%llu bytes)",
			(unsigned long long)(b->nbits / 8));
		return;
	}
	dbm_free(b);
}

/* ---- Persistent bitmaps (format.h, fmt_bitmaps_*) ---- */

/* The image's bitmaps, as loaded, into the list: one of ours of the same
 * name is replaced (the image is the truth once another process stored
 * bitmaps in it), a non-persistent one of that name stays (the image's is
 * left alone, and marked in use at the first write). */
static int adopt(struct disk *d, struct dbm **v, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		struct dbm *old = disk_bitmap_find(d, v[i]->name);
		unsigned copied = 0;
		int r;

		if (old && !old->persistent) {
			log_warn("bitmap %s of the image is not taken: a bitmap of that name that "
				 "is not persistent exists here", v[i]->name);
			dbm_free(v[i]);
			continue;
		}
		if (old) {
			copied = atomic_load(&old->users);
			atomic_store(&v[i]->users, copied);
		}
		if ((r = publish(d, v[i], old)) < 0) {
			while (i < n)
				dbm_free(v[i++]);
			return r;
		}
		if (old)
			carry_users(v[i], old, copied);	/* after publish's grace */
		(void)hold(d, false, NULL, 0);
		dbm_free(old);
		BM_CALL(d, (fmt_bitmaps_taken(bmt, v[i]->name), 0));
		log_info("bitmap %s loaded from the image (%u-byte granularity, %llu bytes "
			 "dirty%s)", v[i]->name, dbm_granularity(v[i]),
			 (unsigned long long)dbm_dirty_bytes(v[i]),
			 atomic_load(&v[i]->enabled) ? "" : ", disabled");
	}
	return 0;
}

int disk_bitmaps_open(struct disk *d, bool handover, char *err, size_t errlen)
{
	struct dbm **v;
	unsigned n;
	int r;

	/* A raw disk's bitmap file, if it is there. */
	if (d->bm_path && access(d->bm_path, F_OK) == 0 &&
	    (r = disk__bmfile_open(d, false, handover, err, errlen)) < 0)
		return r;
	if (handover)
		return 0;	/* read at the claim */
	r = BM_CALL(d, fmt_bitmaps_load(bmt, &v, &n, err, errlen));
	if (r < 0)
		return r;
	r = adopt(d, v, n);
	free(v);
	if (r == 0)
		r = hold(d, false, NULL, 0);
	if (r < 0)
		snprintf(err, errlen, "out of memory for the image's bitmaps");
	return r;
}

/* A raw disk grown while no vblkd served it (a truncate): its bitmap
 * file, and the bitmaps loaded from it at its size, grow to the disk's
 * now that both are ours.  Not grown (a bitmap of the file we do not
 * track: QEMU would not resize it either), the disk is served, its
 * bitmaps kept as they are in the file (logged). */
static int grow_to_disk(struct disk *d)
{
	struct bdev *bm = atomic_load(&d->bm);
	uint64_t size = READ_ONCE(d->b->size);
	char err[256];

	if (!bm || bm->size >= size)
		return 0;
	if (disk_bitmaps_can_grow(d, size, err, sizeof(err)) < 0) {
		log_err("bitmap file %s is not grown with its disk: %s", d->bm_path, err);
		return 0;
	}
	if (disk_bitmaps_grow(d, size) == 0)
		log_info("bitmap file %s grown with its disk to %llu bytes", d->bm_path,
			 (unsigned long long)size);
	return 0;
}

/* The image just became ours (disk_claim): if another process stored
 * bitmaps in it since we read or stored them, those are the truth: ours
 * of other names missed its writes and go. */
int disk__bitmaps_claimed(struct disk *d, char *err, size_t errlen)
{
	struct disk_bitmaps *l;
	struct dbm **v;
	unsigned n;
	int r;

	if ((r = disk__bmfile_claim(d, err, errlen)) < 0)
		return r;
	/* r == 1: a bitmap file opened just now, its bitmaps not loaded. */
	if (r == 0 && !BM_CALL(d, fmt_bitmaps_changed(bmt))) {
		l = list_of(d);
		for (unsigned i = 0; l && i < l->n; i++)
			if (l->b[i]->persistent)
				BM_CALL(d, (fmt_bitmaps_taken(bmt, l->b[i]->name), 0));
		if ((r = hold(d, false, err, errlen)) < 0)
			return r;
		return grow_to_disk(d);
	}
	if ((r = BM_CALL(d, fmt_bitmaps_load(bmt, &v, &n, err, errlen))) < 0)
		return r;
	for (struct dbm *b;;) {
		l = list_of(d);
		b = NULL;
		for (unsigned i = 0; l && i < l->n && !b; i++) {
			bool found = false;

			for (unsigned j = 0; j < n && !found; j++)
				found = !strcmp(v[j]->name, l->b[i]->name);
			if (l->b[i]->persistent && !found)
				b = l->b[i];
		}
		if (!b)
			break;
		log_warn("bitmap %s dropped: the image was written and its bitmaps stored by "
			 "another process since, without it", b->name);
		if ((r = publish(d, NULL, b)) < 0)
			break;
		(void)hold(d, false, NULL, 0);
		dbm_free(b);
	}
	if (r == 0 && (r = adopt(d, v, n)) == 0)
		r = hold(d, false, NULL, 0);
	else if (r < 0)
		for (unsigned j = 0; j < n; j++)
			dbm_free(v[j]);
	free(v);
	if (r < 0)
		snprintf(err, errlen, "out of memory for the image's bitmaps");
	d->bm_unsaved = false;
	return r < 0 ? r : grow_to_disk(d);
}

int disk_bitmaps_store(struct disk *d)
{
	struct disk_bitmaps *l = list_of(d);
	struct dbm **v = calloc(l ? l->n : 1, sizeof(*v));
	unsigned n = 0;
	char err[256];
	int r;

	if (!v)
		return -ENOMEM;
	for (unsigned i = 0; l && i < l->n; i++)
		if (l->b[i]->persistent && l->b[i]->size == READ_ONCE(d->b->size))
			v[n++] = l->b[i];
		else if (l->b[i]->persistent)
			log_err("bitmap %s is not stored: it does not cover the disk's new size",
				l->b[i]->name);
	r = BM_CALL(d, fmt_bitmaps_store(bmt, v, n, d->bm_unsaved, err, sizeof(err)));
	free(v);
	if (r < 0)
		log_err("%s", err);
	else
		d->bm_unsaved = false;
	return r;
}

int disk_bitmaps_handover(struct disk *d, char *err, size_t errlen)
{
	if (disk_bitmaps_store(d) < 0) {
		snprintf(err, errlen, "the disk's persistent bitmaps could not be stored");
		return -EIO;
	}
	return disk__bmfile_quiesce(d, err, errlen);
}

void disk__bitmaps_free(struct disk *d)
{
	struct disk_bitmaps *l = list_of(d);

	(void)BM_CALL(d, fmt_bitmaps_hold(bmt, NULL, 0, false));
	for (unsigned i = 0; l && i < l->n; i++)
		dbm_free(l->b[i]);
	free(l);
	atomic_store(&d->bitmaps, NULL);
}
