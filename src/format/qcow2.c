/*
 * qcow2: the header, the L1/L2 and refcount tables, allocation, and the
 * order in which metadata reaches the disk.  Spec: QEMU's
 * docs/interop/qcow2.txt (sections named where the code follows them).
 *
 * The image is hostile: every header field, table offset and entry is
 * checked before it is used, at open (header, L1, refcount table) or when
 * a request meets it (L2 entries, refcount blocks).  A bad one refuses
 * the image, or fails that request, with one line; nothing is ever read
 * or written outside the file or over its metadata.
 *
 * Write-back order (QEMU's qcow2 cache dependencies, written out): a
 * cluster's refcount is on disk before any table that points at it, a
 * table before the L1 (or refcount table) entry that points at it, and a
 * reference is gone from the disk before its cluster's refcount drops.
 * So a crash at any point leaves at worst leaked clusters (refcount above
 * the references), which qemu-img check reports as leaks, not corruption.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#ifdef HAVE_ZSTD
#include <zstd.h>
#endif

#include "format/qcow2.h"
#include "util/barrier.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sys.h"

/*
 * Every metadata write.  Through the page cache (mfd), except where a
 * cluster is smaller than a page and the data goes around the cache
 * (O_DIRECT): then a table and guest data share pages, and a direct
 * write next to a dirty cached one fails the page's invalidation, which
 * Linux reports as a write-back error (EIO at the next fdatasync).  So
 * such an image's metadata goes around the cache too, in the device's
 * blocks, read-modify-write at the edges (QEMU's cache=none does all its
 * metadata I/O on the O_DIRECT file too).
 *
 * kind: what is written (Q2M_*).  The clusters written must be that kind
 * of metadata and no other (qcow2_meta.c): a table whose offset points
 * into another table, a refcount block that is an L2 table, is refused
 * and the image marked corrupt, as QEMU's overlap check does ("Preventing
 * invalid write on metadata").  Nothing is written once it is corrupt.
 */
static void corrupt_header_bit(struct qcow2 *q);

static int write_raw(struct qcow2 *q, const void *buf, size_t len, uint64_t off)
{
	uint64_t a = MAX(512u, MAX(q->file->dio_len_align, q->file->dio_mem_align));
	uint64_t lo, hi;
	uint8_t *b;
	int r;

	if (!q->meta_direct)
		return sys_pwrite_full(q->mfd, buf, len, off);
	lo = off / a * a;
	hi = (off + len + a - 1) / a * a;
	if (posix_memalign((void **)&b, 4096, (size_t)(hi - lo)))
		return -ENOMEM;
	if ((lo < off || hi > off + len) &&
	    (r = sys_pread_full(q->file->fd, b, (size_t)(hi - lo), lo)) < 0) {
		free(b);
		return r;
	}
	memcpy(b + (off - lo), buf, len);
	r = sys_pwrite_full(q->file->fd, b, (size_t)(hi - lo), lo);
	free(b);
	return r;
}

static int meta_write(struct qcow2 *q, const void *buf, size_t len, uint64_t off, unsigned kind)
{
	int other;

	if (q->corrupt)
		return -EIO;
	other = qcow2_meta_mismatch(q, off, len, kind);
	if (unlikely(other >= 0)) {
		char what[160];

		snprintf(what, sizeof(what), "a write of %s would land on %s", qcow2_meta_name(kind),
			 other == Q2M_NONE ? "guest data or a free cluster" :
			 qcow2_meta_name((unsigned)other));
		qcow2_corrupt(q, what, QCOW2_NO_GUEST, off);
		return -EIO;
	}
	return write_raw(q, buf, len, off);
}

static int sync_file(struct qcow2 *q)
{
	return fdatasync(q->mfd) < 0 ? -errno : 0;
}

/* A metadata write or sync failed (res): no more writes to the image,
 * said once; nothing more to say when it failed because the image was
 * found corrupt (qcow2_corrupt said it). */
static void meta_failed(struct qcow2 *q, const char *doing, uint64_t off, int res)
{
	if (q->corrupt || q->broken)
		return;
	q->broken = true;
	log_err("qcow2 image %s: %s at %#llx failed: %s; no more writes to this image",
		q->path, doing, (unsigned long long)off, strerror(-res));
}

int qcow2_meta_write(struct qcow2 *q, const void *buf, size_t len, uint64_t off, unsigned kind)
{
	return meta_write(q, buf, len, off, kind);
}

int qcow2_sync(struct qcow2 *q)
{
	return sync_file(q);
}

bool qcow2_detect(const void *buf, size_t len)
{
	return len >= 4 && be32_at(buf) == QCOW2_MAGIC;
}

/* ---- Sanity of offsets ---------------------------------------------- */

static bool in_range(uint64_t off, uint64_t len, uint64_t start, uint64_t rlen)
{
	return off < start + rlen && start < off + len;
}

/* Is [off, off+len) a place a table or data cluster may be: inside what
 * the image has allocated, and clear of the header, L1 and refcount
 * table? */
static bool host_ok(const struct qcow2 *q, uint64_t off, uint64_t len)
{
	uint64_t end = MAX(q->next_free, (q->file_size + q->cs - 1) & ~(q->cs - 1));

	if (off < q->cs || off + len < off || off + len > end)
		return false;
	if (in_range(off, len, q->l1_off, (uint64_t)q->l1_size * 8))
		return false;
	if (in_range(off, len, q->rt_off, (uint64_t)q->rt_clusters * q->cs))
		return false;
	return true;
}

bool qcow2_meta_clash(const struct qcow2 *q, uint64_t off, uint64_t len)
{
	return in_range(off, len, q->l1_off, (uint64_t)q->l1_size * 8) ||
	       in_range(off, len, q->rt_off, (uint64_t)q->rt_clusters * q->cs);
}

void qcow2_corrupt(struct qcow2 *q, const char *what, uint64_t guest, uint64_t host)
{
	char at[48] = "";

	if (q->corrupt) {
		log_debug("qcow2 image %s: also %s (host offset %#llx)", q->path, what,
			  (unsigned long long)host);
		return;
	}
	q->corrupt = true;
	if (guest != QCOW2_NO_GUEST)
		snprintf(at, sizeof(at), "guest offset %#llx, ", (unsigned long long)guest);
	log_err("qcow2 image %s is corrupt: %s (%shost offset %#llx); marked corrupt, as QEMU "
		"marks it: writes fail with an I/O error from now on, reads that need no bad "
		"metadata go on: repair it with qemu-img check -r all once the VM is off",
		q->path, what, at, (unsigned long long)host);
	corrupt_header_bit(q);
}

/* qcow2.txt, "Header": incompatible feature bit 1, "Corrupt bit": the
 * image may only be opened read-only until repaired (QEMU's
 * qcow2_mark_corrupt).  Only an image that is ours (locked, claimed) and
 * writable is written; a v2 header has no feature bits. */
static void corrupt_header_bit(struct qcow2 *q)
{
	uint8_t b[8];
	int r;

	if (!q->rw || q->stale || q->broken || q->version < 3 ||
	    (q->incompat & QCOW2_INCOMPAT_CORRUPT))
		return;
	q->incompat |= QCOW2_INCOMPAT_CORRUPT;
	be64_put(b, q->incompat);
	if ((r = write_raw(q, b, 8, 72)) < 0 || (r = sync_file(q)) < 0) {
		q->broken = true;
		log_err("qcow2 image %s: setting its corrupt bit failed: %s", q->path, strerror(-r));
	}
}

/* ---- Table cache ----------------------------------------------------- */

static int cache_init(struct qcow2_cache *c, unsigned n, uint64_t nindex, uint64_t cs)
{
	c->t = calloc(n, sizeof(*c->t));
	c->slot = calloc(nindex ? nindex : 1, sizeof(*c->slot));
	if (!c->t || !c->slot)
		return -ENOMEM;
	c->n = n;
	c->nindex = nindex;
	for (unsigned i = 0; i < n; i++) {
		if (posix_memalign((void **)&c->t[i].buf, 4096, cs))
			return -ENOMEM;
	}
	return 0;
}

static void cache_free(struct qcow2_cache *c)
{
	if (c->t)
		for (unsigned i = 0; i < c->n; i++)
			free(c->t[i].buf);
	free(c->t);
	free(c->slot);
}

static int cache_grow_index(struct qcow2_cache *c, uint64_t nindex)
{
	uint32_t *s;

	if (nindex <= c->nindex)
		return 0;
	s = realloc(c->slot, nindex * sizeof(*s));
	if (!s)
		return -ENOMEM;
	memset(s + c->nindex, 0, (nindex - c->nindex) * sizeof(*s));
	c->slot = s;
	c->nindex = nindex;
	return 0;
}

/* The changed part of t, whole 512-byte sectors. */
static int write_table(struct qcow2 *q, struct qcow2_cache *c, struct qcow2_table *t)
{
	uint32_t lo = t->dlo & ~511u, hi = MIN((t->dhi + 511) & ~511u, (uint32_t)q->cs);
	int r = hi > lo ? meta_write(q, t->buf + lo, hi - lo, t->off + lo, c == &q->l2c ? Q2M_L2 : Q2M_RB) : 0;

	if (r < 0) {
		meta_failed(q, "writing a table", t->off, r);
		return r;
	}
	t->dirty = false;
	t->fresh = false;
	t->dlo = t->dhi = 0;
	c->ndirty--;
	return 0;
}

static int flush_refcounts(struct qcow2 *q);

/* The slot for table index, loaded from off (load) or zeroed (a new
 * table).  An evicted dirty table is written first; an L2 table only
 * after the refcounts it depends on are on disk. */
static struct qcow2_table *cache_get(struct qcow2 *q, struct qcow2_cache *c, uint32_t index,
				     uint64_t off, bool load, int *res)
{
	struct qcow2_table *t = NULL;
	uint32_t s = index < c->nindex ? c->slot[index] : 0;
	int r;

	*res = 0;
	if (s) {
		t = &c->t[s - 1];
		t->used = ++c->clock;
		c->hits++;
		return t;
	}
	c->misses++;
	for (unsigned i = 0; i < c->n; i++) {
		if (!c->t[i].off) {
			t = &c->t[i];
			break;
		}
		if (!t || c->t[i].used < t->used)
			t = &c->t[i];
	}
	if (t->off) {
		if (t->dirty) {
			if (c == &q->l2c && (r = flush_refcounts(q)) < 0)
				goto fail;
			if ((r = write_table(q, c, t)) < 0)
				goto fail;
		}
		c->slot[t->index] = 0;
		t->off = 0;
	}
	if (load) {
		r = sys_pread_full(q->mfd, t->buf, q->cs, off);
		if (r < 0) {
			log_err("qcow2 image %s: reading metadata at %#llx failed: %s", q->path,
				(unsigned long long)off, strerror(-r));
			goto fail;
		}
	} else {
		memset(t->buf, 0, q->cs);
		t->dirty = true;
		c->ndirty++;
	}
	t->off = off;
	t->index = index;
	t->used = ++c->clock;
	t->fresh = !load;
	t->dlo = 0;
	t->dhi = load ? 0 : (uint32_t)q->cs;
	if (load)
		t->dirty = false;
	c->slot[index] = (uint32_t)(t - c->t) + 1;
	return t;
fail:
	*res = r;
	return NULL;
}

/* Bytes [lo, hi) of t changed. */
static void cache_dirty_range(struct qcow2_cache *c, struct qcow2_table *t, uint32_t lo,
			      uint32_t hi)
{
	if (!t->dirty) {
		t->dirty = true;
		c->ndirty++;
		t->dlo = lo;
		t->dhi = hi;
		return;
	}
	t->dlo = MIN(t->dlo, lo);
	t->dhi = MAX(t->dhi, hi);
}

static void cache_dirty(struct qcow2 *q, struct qcow2_cache *c, struct qcow2_table *t)
{
	cache_dirty_range(c, t, 0, (uint32_t)q->cs);
}

static int cache_write_dirty(struct qcow2 *q, struct qcow2_cache *c)
{
	int r;

	for (unsigned i = 0; i < c->n && c->ndirty; i++)
		if (c->t[i].off && c->t[i].dirty && (r = write_table(q, c, &c->t[i])) < 0)
			return r;
	return 0;
}

/* ---- Refcounts (qcow2.txt, "Host cluster management") --------------- */

static uint64_t rb_get(const struct qcow2 *q, const uint8_t *rb, uint64_t i)
{
	switch (q->refcount_order) {
	case 3:
		return rb[i];
	case 4:
		return (uint64_t)rb[2 * i] << 8 | rb[2 * i + 1];
	case 5:
		return be32_at(rb + 4 * i);
	case 6:
		return be64_at(rb + 8 * i);
	default: {	/* 1, 2 or 4 bits; bit 0 is the least significant */
		unsigned bits = 1u << q->refcount_order;
		uint64_t bit = i * bits;

		return (rb[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
	}
	}
}

static void rb_set(const struct qcow2 *q, uint8_t *rb, uint64_t i, uint64_t v)
{
	switch (q->refcount_order) {
	case 3:
		rb[i] = (uint8_t)v;
		break;
	case 4:
		rb[2 * i] = (uint8_t)(v >> 8);
		rb[2 * i + 1] = (uint8_t)v;
		break;
	case 5: {
		uint32_t x = htobe32((uint32_t)v);

		memcpy(rb + 4 * i, &x, 4);
		break;
	}
	case 6:
		be64_put(rb + 8 * i, v);
		break;
	default: {
		unsigned bits = 1u << q->refcount_order;
		uint64_t bit = i * bits;
		uint8_t mask = (uint8_t)(((1u << bits) - 1) << (bit % 8));

		rb[bit / 8] = (uint8_t)((rb[bit / 8] & ~mask) | ((v << (bit % 8)) & mask));
		break;
	}
	}
}

static uint64_t refcount_max(const struct qcow2 *q)
{
	return q->refcount_order == 6 ? UINT64_MAX : (1ull << (1u << q->refcount_order)) - 1;
}

static int refcount_add(struct qcow2 *q, uint64_t off, int delta);

/* A refcount block for refcount-table index ti, at the next free
 * cluster; it counts itself (or the next block does). */
static uint64_t take_end(struct qcow2 *q, uint64_t n, int *res);

static int rb_new(struct qcow2 *q, uint64_t ti)
{
	uint64_t off = take_end(q, 1, &(int){ 0 });
	int r;

	if (!off)
		return -EIO;
	if ((r = qcow2_meta_add(&q->meta, off >> q->cluster_bits, Q2M_RB)) != 0)
		return r < 0 ? r : -EIO;
	q->rt[ti] = off;
	q->rt_dirty = true;
	if (!cache_get(q, &q->rbc, (uint32_t)ti, off, false, &r))
		return r;
	return refcount_add(q, off, 1);
}

static int rt_write(struct qcow2 *q);

/*
 * The refcount table is full: a bigger one at the end of the file, made
 * durable at once (blocks, sync, table, sync, header, sync), then the old
 * one's clusters given back.  qcow2.txt: the table is contiguous.
 */
static int rt_grow(struct qcow2 *q, uint64_t need)
{
	uint64_t entries = MAX(need + 1, q->rt_entries) * 2;
	uint64_t bytes = (entries * 8 + q->cs - 1) & ~(q->cs - 1);
	uint64_t old_off = q->rt_off, old_clusters = q->rt_clusters, off;
	uint64_t *rt;
	uint8_t hdr[12];
	int r;

	if (bytes > QCOW2_MAX_RT_BYTES) {
		log_err("qcow2 image %s: its refcount table would pass %u MiB (QEMU's limit): "
			"no more clusters can be allocated", q->path, QCOW2_MAX_RT_BYTES >> 20);
		return -EFBIG;
	}
	rt = realloc(q->rt, bytes);
	if (!rt)
		return -ENOMEM;
	memset(rt + q->rt_entries, 0, bytes - q->rt_entries * 8);
	q->rt = rt;
	r = cache_grow_index(&q->rbc, bytes / 8);
	if (r < 0)
		return r;
	off = take_end(q, bytes / q->cs, &r);
	if (!off)
		return r;
	for (uint64_t i = 0; i < bytes; i += q->cs)
		if ((r = qcow2_meta_add(&q->meta, (off + i) >> q->cluster_bits, Q2M_RT)) != 0)
			return r < 0 ? r : -EIO;
	q->rt_entries = bytes / 8;
	q->rt_off = off;
	q->rt_clusters = (uint32_t)(bytes / q->cs);
	for (uint64_t i = 0; i < bytes; i += q->cs)
		if ((r = refcount_add(q, off + i, 1)) < 0)
			return r;
	if ((r = cache_write_dirty(q, &q->rbc)) < 0 || (r = sync_file(q)) < 0 ||
	    (r = rt_write(q)) < 0 || (r = sync_file(q)) < 0)
		goto fail;
	/* qcow2.txt, "Header": refcount_table_offset, _clusters (48-59). */
	be64_put(hdr, off);
	{
		uint32_t c = htobe32(q->rt_clusters);

		memcpy(hdr + 8, &c, 4);
	}
	if ((r = meta_write(q, hdr, sizeof(hdr), 48, Q2M_HEADER)) < 0 || (r = sync_file(q)) < 0)
		goto fail;
	for (uint64_t i = 0; i < old_clusters; i++) {
		qcow2_meta_del(&q->meta, (old_off >> q->cluster_bits) + i);
		if ((r = refcount_add(q, old_off + i * q->cs, -1)) < 0)
			return r;
	}
	return 0;
fail:
	meta_failed(q, "growing the refcount table", old_off, r);
	return r;
}

static int refcount_add(struct qcow2 *q, uint64_t off, int delta)
{
	uint64_t idx = off >> q->cluster_bits;
	uint64_t ti = idx / q->rb_entries, bi = idx % q->rb_entries, v;
	struct qcow2_table *t;
	int r;

	if (ti >= q->rt_entries) {
		if (delta < 0)
			return -EIO;
		if ((r = rt_grow(q, ti)) < 0)
			return r;
	}
	if (!q->rt[ti]) {
		if (delta < 0) {
			qcow2_corrupt(q, "a cluster in use has no refcount block", QCOW2_NO_GUEST,
				      off);
			return -EIO;
		}
		if ((r = rb_new(q, ti)) < 0)
			return r;
	}
	t = cache_get(q, &q->rbc, (uint32_t)ti, q->rt[ti], true, &r);
	if (!t)
		return r;
	v = rb_get(q, t->buf, bi);
	if ((delta < 0 && v == 0) || (delta > 0 && v == refcount_max(q))) {
		qcow2_corrupt(q, delta < 0 ? "a refcount would drop below zero" :
			"a refcount would overflow", QCOW2_NO_GUEST, off);
		return -EIO;
	}
	rb_set(q, t->buf, bi, delta < 0 ? v - 1 : v + 1);
	cache_dirty(q, &q->rbc, t);
	return 0;
}

int64_t qcow2_refcount(struct qcow2 *q, uint64_t off)
{
	uint64_t idx = off >> q->cluster_bits;
	uint64_t ti = idx / q->rb_entries;
	struct qcow2_table *t;
	int r;

	if (ti >= q->rt_entries || !q->rt[ti])
		return 0;
	t = cache_get(q, &q->rbc, (uint32_t)ti, q->rt[ti], true, &r);
	if (!t)
		return r;
	return (int64_t)rb_get(q, t->buf, idx % q->rb_entries);
}

/* The file covers [0, end): a read of a new cluster's part nobody wrote
 * yet must find zeroes, not the end of the file (an O_DIRECT read there
 * comes back short).  Grown a MiB at a time, not a syscall a cluster. */
static int cover(struct qcow2 *q, uint64_t end)
{
	uint64_t step = MAX(q->cs, 1ull << 20);

	if (end <= q->file_size)
		return 0;
	if (q->file->is_blockdev)
		return -ENOSPC;
	end = (end + step - 1) / step * step;
	if (ftruncate(q->mfd, (off_t)end) < 0)
		return -errno;
	q->file_size = end;
	return 0;
}

/*
 * n clusters at the end of the image, past every cluster with a refcount
 * (refcounts not set): the first one's offset, or 0 with *res = -errno.
 * Bounded (issue 44): never past alloc_limit, what the virtual disk, its
 * tables and the reserve can need from where the image stood when it
 * became ours (qcow2_take), plus the clusters freed meanwhile, which come
 * back (quarantine, reuse).  Past it the refcounts cannot be right: a
 * corrupt image must not make us fill the file system every VM shares.
 */
static uint64_t take_end(struct qcow2 *q, uint64_t n, int *res)
{
	uint64_t off = q->next_free, end = off + n * q->cs;
	uint64_t limit = q->alloc_limit + (q->nfrees + q->nquarantine) * q->cs;
	int k;

	*res = 0;
	if (unlikely(end > limit || end < off)) {
		char what[192];

		snprintf(what, sizeof(what), "new clusters would take the file past %llu MiB, more "
			 "than a %llu MiB disk with its tables can need: its refcounts cannot be "
			 "right", (unsigned long long)(limit >> 20),
			 (unsigned long long)(q->size >> 20));
		qcow2_corrupt(q, what, QCOW2_NO_GUEST, off);
		*res = -EIO;
		return 0;
	}
	if (unlikely((k = qcow2_meta_mismatch(q, off, n * q->cs, Q2M_NONE)) >= 0)) {
		char what[128];

		snprintf(what, sizeof(what), "a cluster past every refcount is %s",
			 qcow2_meta_name((unsigned)k));
		qcow2_corrupt(q, what, QCOW2_NO_GUEST, off);
		*res = -EIO;
		return 0;
	}
	if ((*res = cover(q, end)) < 0)
		return 0;
	q->next_free = end;
	return off;
}

/* The next n clusters at the end, refcount 1 each (not yet durable):
 * the first one's offset, or 0 with *res = -errno. */
static uint64_t alloc_end(struct qcow2 *q, uint64_t n, int *res)
{
	uint64_t off = take_end(q, n, res);

	if (!off)
		return 0;
	for (uint64_t i = 0; i < n; i++)
		if ((*res = refcount_add(q, off + i * q->cs, 1)) < 0)
			return 0;
	return off;
}

uint64_t qcow2_alloc_run(struct qcow2 *q, uint64_t n, int *res)
{
	if (q->corrupt || q->broken) {
		*res = -EIO;
		return 0;
	}
	return alloc_end(q, n, res);
}

/* Append x to the growing array *v (*n used of *cap). */
static int u64_push(uint64_t **v, size_t *n, size_t *cap, uint64_t x)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 64;
		uint64_t *p = realloc(*v, c * sizeof(*p));

		if (!p)
			return -ENOMEM;
		*v = p;
		*cap = c;
	}
	(*v)[(*n)++] = x;
	return 0;
}

static int resv_push(struct qcow2 *q, uint64_t off)
{
	return u64_push(&q->resv, &q->nresv, &q->resv_cap, off);
}

/*
 * Freed clusters come back (issue 44: without it the file's end only
 * grows, a discard and a write at a time).  A cluster whose refcount
 * dropped to zero at a flush, and whose blocks were punched (so it reads
 * as zeroes, like one at the end), waits in quarantine until every
 * request that was running then has completed (one may still read or
 * write it: the guest raced its own discard), then is reused before the
 * end of the file grows.
 */
static void reuse_release(struct qcow2 *q)
{
	if (!q->nquarantine || q->quarantine_left)
		return;
	for (size_t i = 0; i < q->nquarantine; i++)
		if (u64_push(&q->reuse, &q->nreuse, &q->reuse_cap, q->quarantine[i]) < 0)
			break;	/* not reused: only the file's end grows */
	q->nquarantine = 0;
}

/* A chunk of clusters reserved: refcounts set, written and synced;
 * reused ones first. */
static int resv_refill(struct qcow2 *q)
{
	uint64_t n = q->resv_chunk, off;
	int r;

	reuse_release(q);
	if (q->nreuse) {
		for (uint64_t i = 0; i < n && q->nreuse; i++) {
			off = q->reuse[--q->nreuse];
			/* Still free, and nothing the tables have become since. */
			if (qcow2_refcount(q, off) != 0 ||
			    qcow2_meta_get(&q->meta, off >> q->cluster_bits) != Q2M_NONE)
				continue;
			if ((r = refcount_add(q, off, 1)) < 0 || (r = resv_push(q, off)) < 0)
				return r;
			q->reused++;
		}
		if (q->nresv) {
			q->refills++;
			return flush_refcounts(q);
		}
	}
	off = alloc_end(q, n, &r);
	if (!off)
		return r;
	for (uint64_t i = n; i-- > 0;)
		if ((r = resv_push(q, off + i * q->cs)) < 0)
			return r;
	q->refills++;
	return flush_refcounts(q);
}

uint64_t qcow2_alloc(struct qcow2 *q, int *res)
{
	*res = 0;
	if (q->corrupt || q->broken) {
		*res = -EIO;
		return 0;
	}
	if (!q->nresv && (*res = resv_refill(q)) < 0)
		return 0;
	if (!q->nresv) {
		*res = -EIO;
		return 0;
	}
	q->allocated++;
	return q->resv[--q->nresv];
}

void qcow2_unalloc(struct qcow2 *q, uint64_t off)
{
	/* Nothing points at it: back to the reserve, refcount as it is. */
	q->allocated--;
	if (resv_push(q, off) < 0 && refcount_add(q, off, -1) < 0)
		log_warn("qcow2 image %s: cluster %#llx leaked", q->path, (unsigned long long)off);
}

/* At close: the reserve's refcounts back to zero. */
static void resv_release(struct qcow2 *q)
{
	for (size_t i = 0; i < q->nresv; i++)
		if (refcount_add(q, q->resv[i], -1) < 0)
			log_warn("qcow2 image %s: cluster %#llx leaked", q->path,
				 (unsigned long long)q->resv[i]);
	q->nresv = 0;
}

static int frees_push(struct qcow2 *q, uint64_t off)
{
	return u64_push(&q->frees, &q->nfrees, &q->frees_cap, off);
}

void qcow2_free_later(struct qcow2 *q, uint64_t e)
{
	if (e & QCOW2_OFLAG_COMPRESSED) {
		/* Compressed: one reference on each host cluster its bytes
		 * touch (qcow2.txt, "Compressed Clusters Descriptor"). */
		unsigned x = 62 - (q->cluster_bits - 8);
		uint64_t host = e & ((1ull << x) - 1);
		uint64_t nsec = (e >> x) & ((1ull << (q->cluster_bits - 8)) - 1);
		uint64_t last = (host & ~511ull) + (nsec + 1) * 512 - 1;

		/* Compressed data is shorter than a cluster (else it is
		 * written plain: QEMU's qcow2_co_compress), so its bytes end
		 * within a cluster of its start, whatever a hostile sector
		 * count says: never a reference dropped that it did not hold. */
		last = MIN(last, host + q->cs - 1);
		for (uint64_t c = host & ~(q->cs - 1); c <= last; c += q->cs)
			if (frees_push(q, c) < 0)
				log_warn("qcow2 image %s: cluster %#llx leaked", q->path,
					 (unsigned long long)c);
		return;
	}
	if ((e & QCOW2_OFFSET_MASK) && frees_push(q, e & QCOW2_OFFSET_MASK) < 0)
		log_warn("qcow2 image %s: cluster %#llx leaked", q->path,
			 (unsigned long long)(e & QCOW2_OFFSET_MASK));
}

/* ---- Tables written back --------------------------------------------- */

static int rt_write(struct qcow2 *q)
{
	size_t bytes = (size_t)q->rt_clusters * q->cs;
	uint8_t *buf = malloc(bytes);
	int r;

	if (!buf)
		return -ENOMEM;
	for (uint64_t i = 0; i < bytes / 8; i++)
		be64_put(buf + 8 * i, i < q->rt_entries ? q->rt[i] : 0);
	r = meta_write(q, buf, bytes, q->rt_off, Q2M_RT);
	free(buf);
	if (r == 0)
		q->rt_dirty = false;
	return r;
}

/* Refcount blocks, sync, and the refcount table if a block is new. */
static int flush_refcounts(struct qcow2 *q)
{
	int r;

	if (!q->rbc.ndirty && !q->rt_dirty)
		return 0;
	if ((r = cache_write_dirty(q, &q->rbc)) < 0 || (r = sync_file(q)) < 0)
		goto fail;
	if (q->rt_dirty && ((r = rt_write(q)) < 0 || (r = sync_file(q)) < 0))
		goto fail;
	return 0;
fail:
	meta_failed(q, "writing refcounts", q->rt_off, r);
	return r;
}

int qcow2_flush_refcounts(struct qcow2 *q)
{
	return flush_refcounts(q);
}

static int l1_write(struct qcow2 *q)
{
	/* Whole 512-byte sectors around the changed entries. */
	uint64_t lo = q->l1_dirty_lo & ~63ull, hi = MIN((q->l1_dirty_hi + 63) & ~63ull,
							 (uint64_t)q->l1_size);
	size_t bytes = (size_t)(hi - lo) * 8;
	uint8_t *buf = malloc(bytes);
	int r;

	if (!buf)
		return -ENOMEM;
	for (uint64_t i = lo; i < hi; i++)
		be64_put(buf + 8 * (i - lo), q->l1[i]);
	r = meta_write(q, buf, bytes, q->l1_off + lo * 8, Q2M_L1);
	free(buf);
	if (r == 0)
		q->l1_dirty_lo = q->l1_dirty_hi = 0;
	return r;
}

/* Clusters whose refcount reached zero give their space back to the
 * file system (a hole; the file keeps its size), and wait in quarantine
 * to be reused (reuse_release): a punched cluster reads as zeroes, as
 * one at the end does.  A cluster not punched (a block device, a file
 * system without holes) keeps its bytes and is not reused. */
static void punch_freed(struct qcow2 *q)
{
	bool any = false;

	if (q->file->is_blockdev || q->no_punch)
		return;
	for (size_t i = 0; i < q->nfrees; i++) {
		uint64_t off = q->frees[i];

		if (qcow2_refcount(q, off) != 0 ||
		    qcow2_meta_get(&q->meta, off >> q->cluster_bits) != Q2M_NONE)
			continue;
		if (fallocate(q->mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
			      (off_t)q->cs) < 0) {
			if (errno == EOPNOTSUPP || errno == ENOSYS)
				q->no_punch = true;
			break;
		}
		q->punched++;
		if (u64_push(&q->quarantine, &q->nquarantine, &q->quarantine_cap, off) == 0)
			any = true;
	}
	/* Requests running now may still touch them. */
	if (any) {
		q->quarantine_seq = q->io_seq;
		q->quarantine_left = q->io_running;
	}
}

int qcow2_flush(struct qcow2 *q)
{
	int r;

	if (!q->rw)
		return 0;
	if (q->broken)
		return -EIO;
	/* Corrupt: what completed is made durable, no metadata is written
	 * (the clusters waiting to be freed leak, at worst). */
	if (q->corrupt)
		return sync_file(q);
	if ((r = flush_refcounts(q)) < 0)
		return r;
	/* Tables (mostly written through already), then everything durable:
	 * the data the guest wrote and the tables pointing at it. */
	if ((r = qcow2_write_through(q)) < 0)
		return r;
	if ((r = sync_file(q)) < 0)
		goto fail;
	if (!q->nfrees)
		return 0;
	/* No table on disk points at these any more: their refcounts may
	 * drop, and be written now (a crash before only leaks them). */
	for (size_t i = 0; i < q->nfrees; i++)
		if (refcount_add(q, q->frees[i], -1) < 0)
			log_warn("qcow2 image %s: cluster %#llx leaked", q->path,
				 (unsigned long long)q->frees[i]);
	if (q->nfrees && (r = cache_write_dirty(q, &q->rbc)) < 0)
		goto fail;
	punch_freed(q);
	q->nfrees = 0;
	if ((r = sync_file(q)) < 0)
		goto fail;
	return 0;
fail:
	meta_failed(q, "writing metadata back", 0, r);
	return r;
}

/* ---- Growing the disk (what qemu-img resize does for a bigger size) --- */

int qcow2_grow(struct qcow2 *q, uint64_t size, char *err, size_t errlen)
{
	uint64_t clusters = (size + q->cs - 1) >> q->cluster_bits;
	uint64_t need = (clusters + q->l2_entries - 1) / q->l2_entries;
	uint8_t b[12];
	int r;

	if (!q->rw || q->broken || q->corrupt) {
		snprintf(err, errlen, "qcow2 image %s is %s: it cannot grow", q->path,
			 !q->rw ? "read-only" : q->corrupt ? "corrupt" :
			 "broken (a metadata write failed)");
		return q->rw ? -EIO : -EROFS;
	}
	/* The bitmaps fit the new size, or nothing changes (QEMU's
	 * qcow2_truncate_bitmaps_check). */
	if (q->version >= 3 && (r = qcow2_bm_fit(q, NULL, 0, size, err, errlen)) < 0)
		return r;
	if (need * 8 > QCOW2_MAX_L1_BYTES) {
		snprintf(err, errlen, "%llu bytes needs an L1 table over %u MiB (the limit QEMU "
			 "has too): give a smaller size", (unsigned long long)size,
			 QCOW2_MAX_L1_BYTES >> 20);
		return -EFBIG;
	}
	/* The allocation bound grows with the disk: its new clusters, their
	 * L2 tables, a new L1 table (set_alloc_limit). */
	q->alloc_limit += (clusters - MIN(clusters, (q->size + q->cs - 1) >> q->cluster_bits) +
			   need + ((need * 8 + q->cs - 1) >> q->cluster_bits)) * q->cs;
	/* Everything the L1 points at is on disk before a new L1 is. */
	if ((r = qcow2_begin_write(q)) < 0 || (r = qcow2_flush(q)) < 0)
		goto io;
	if (need > q->l1_size) {
		/* qcow2.txt, "Header": l1_size and l1_table_offset.  The new
		 * table in new clusters (contiguous: allocation is at the end),
		 * then both header fields in one write, then the old table's
		 * clusters go. */
		uint64_t nclusters = (need * 8 + q->cs - 1) >> q->cluster_bits;
		uint64_t off = 0, *l1;
		size_t bytes = (size_t)(nclusters * q->cs);
		uint8_t *buf;

		if ((r = cache_grow_index(&q->l2c, need)) < 0)
			goto io;
		l1 = realloc(q->l1, need * sizeof(*l1));
		if (!l1) {
			r = -ENOMEM;
			goto io;
		}
		memset(l1 + q->l1_size, 0, (need - q->l1_size) * sizeof(*l1));
		q->l1 = l1;
		buf = calloc(1, bytes);
		if (!buf) {
			r = -ENOMEM;
			goto io;
		}
		off = alloc_end(q, nclusters, &r);
		if (!off) {
			free(buf);
			goto io;
		}
		for (uint64_t c = 0; c < nclusters && r == 0; c++)
			if ((r = qcow2_meta_add(&q->meta, (off >> q->cluster_bits) + c, Q2M_L1)) > 0)
				r = -EIO;
		if (r < 0) {
			free(buf);
			goto io;
		}
		for (uint64_t i = 0; i < q->l1_size; i++)
			be64_put(buf + 8 * i, q->l1[i]);
		r = flush_refcounts(q);
		if (r == 0)
			r = meta_write(q, buf, bytes, off, Q2M_L1);
		free(buf);
		if (r < 0 || (r = sync_file(q)) < 0)
			goto io;
		b[0] = (uint8_t)(need >> 24);
		b[1] = (uint8_t)(need >> 16);
		b[2] = (uint8_t)(need >> 8);
		b[3] = (uint8_t)need;
		be64_put(b + 4, off);
		if ((r = meta_write(q, b, 12, 36, Q2M_HEADER)) < 0 || (r = sync_file(q)) < 0)
			goto io;
		for (uint64_t c = 0; c < ((uint64_t)q->l1_size * 8 + q->cs - 1) >> q->cluster_bits; c++) {
			qcow2_meta_del(&q->meta, (q->l1_off >> q->cluster_bits) + c);
			qcow2_free_later(q, q->l1_off + c * q->cs);
		}
		q->l1_off = off;
		q->l1_size = (uint32_t)need;
	}
	be64_put(b, size);
	if ((r = meta_write(q, b, 8, 24, Q2M_HEADER)) < 0 || (r = sync_file(q)) < 0)
		goto io;
	q->size = size;
	/* The old L1's clusters, now that the header points elsewhere. */
	return qcow2_flush(q);
io:
	snprintf(err, errlen, "growing qcow2 image %s failed: %s", q->path, strerror(-r));
	return r;
}

/* ---- L2 tables (qcow2.txt, "Cluster mapping") ------------------------ */

/* A new L2 table's cluster becomes metadata before anything is written
 * to it.  0, or -EIO (it was metadata already: the image is corrupt). */
static int meta_add_table(struct qcow2 *q, uint64_t off)
{
	int r = qcow2_meta_add(&q->meta, off >> q->cluster_bits, Q2M_L2);

	if (r > 0) {
		char what[128];

		snprintf(what, sizeof(what), "a new L2 table would go where %s is",
			 qcow2_meta_name((unsigned)r));
		qcow2_corrupt(q, what, QCOW2_NO_GUEST, off);
		return -EIO;
	}
	return r;
}

uint8_t *qcow2_l2_get(struct qcow2 *q, uint64_t gcl, bool alloc, int *res)
{
	uint64_t l1i = gcl >> (q->cluster_bits - 3);
	uint64_t e = q->l1[l1i], off = e & QCOW2_OFFSET_MASK, noff;
	struct qcow2_table *t;
	int64_t rc;

	*res = 0;
	if (!off) {
		if (!alloc)
			return NULL;
		noff = qcow2_alloc(q, res);
		if (!noff)
			return NULL;
		if ((*res = meta_add_table(q, noff)) < 0) {
			qcow2_unalloc(q, noff);
			return NULL;
		}
		t = cache_get(q, &q->l2c, (uint32_t)l1i, noff, false, res);
		if (!t) {
			qcow2_meta_del(&q->meta, noff >> q->cluster_bits);
			qcow2_unalloc(q, noff);
			return NULL;
		}
		goto set_l1;
	}
	t = cache_get(q, &q->l2c, (uint32_t)l1i, off, true, res);
	if (!t || !alloc || (e & QCOW2_OFLAG_COPIED))
		return t ? t->buf : NULL;
	/* A table a snapshot shares (qcow2.txt, "Snapshots": refcount > 1
	 * means copy on write): ours becomes a copy.  The clusters it
	 * points at keep their refcounts, now one from each table. */
	rc = qcow2_refcount(q, off);
	if (rc < 0) {
		*res = (int)rc;
		return NULL;
	}
	if (rc == 1) {
		noff = off;
	} else {
		noff = qcow2_alloc(q, res);
		if (!noff)
			return NULL;
		if ((*res = meta_add_table(q, noff)) < 0) {
			qcow2_unalloc(q, noff);
			return NULL;
		}
		/* The old table stays a snapshot's: still metadata. */
		qcow2_free_later(q, off);
		t->off = noff;
		t->fresh = true;
		cache_dirty(q, &q->l2c, t);
	}
set_l1:
	q->l1[l1i] = noff | QCOW2_OFLAG_COPIED;
	if (q->l1_dirty_hi <= q->l1_dirty_lo) {
		q->l1_dirty_lo = l1i;
		q->l1_dirty_hi = l1i + 1;
	} else {
		q->l1_dirty_lo = MIN(q->l1_dirty_lo, l1i);
		q->l1_dirty_hi = MAX(q->l1_dirty_hi, l1i + 1);
	}
	return t->buf;
}

void qcow2_l2_dirty(struct qcow2 *q, uint64_t gcl)
{
	uint32_t s = q->l2c.slot[gcl >> (q->cluster_bits - 3)];
	uint32_t at = (uint32_t)(gcl & (q->l2_entries - 1)) * 8;

	if (s)
		cache_dirty_range(&q->l2c, &q->l2c.t[s - 1], at, at + 8);
}

int qcow2_write_through(struct qcow2 *q)
{
	bool fresh = false;
	int r;

	if (q->broken || q->corrupt)
		return -EIO;
	for (unsigned i = 0; i < q->l2c.n && q->l2c.ndirty; i++) {
		struct qcow2_table *t = &q->l2c.t[i];

		if (!t->off || !t->dirty)
			continue;
		fresh |= t->fresh;
		if ((r = write_table(q, &q->l2c, t)) < 0)
			return r;
	}
	if (q->l1_dirty_hi > q->l1_dirty_lo) {
		/* A new table durable before the entry pointing at it: the
		 * cluster might hold old bytes, and a copied one must not come
		 * back empty. */
		if (fresh && (r = sync_file(q)) < 0)
			goto fail;
		if ((r = l1_write(q)) < 0)
			goto fail;
	}
	return 0;
fail:
	meta_failed(q, "writing the L1 table", q->l1_off, r);
	return r;
}

/* Out of qcow2_entry's way (it runs for every cluster a request maps, and
 * a buffer here would cost it a stack guard): an entry on metadata. */
static __attribute__((noinline, cold)) int entry_on_meta(struct qcow2 *q, uint64_t guest,
							 uint64_t host)
{
	char what[128];

	snprintf(what, sizeof(what), "an L2 entry points at %s",
		 qcow2_meta_name(qcow2_meta_get(&q->meta, host >> q->cluster_bits)));
	qcow2_corrupt(q, what, guest, host);
	return -EIO;
}

int qcow2_entry(struct qcow2 *q, const uint8_t *l2, uint64_t gcl, uint64_t *out)
{
	uint64_t e = be64_at(l2 + (gcl & (q->l2_entries - 1)) * 8);
	uint64_t guest = gcl << q->cluster_bits;

	*out = e;
	if (e & QCOW2_OFLAG_COMPRESSED) {
		/* qcow2.txt, "Compressed Clusters Descriptor" */
		unsigned x = 62 - (q->cluster_bits - 8);
		uint64_t host = e & ((1ull << x) - 1);
		uint64_t nsec = (e >> x) & ((1ull << (q->cluster_bits - 8)) - 1);
		uint64_t len = (nsec + 1) * 512 - (host & 511);

		if ((e & QCOW2_OFLAG_COPIED) || host > (1ull << 56) || !host_ok(q, host, len) ||
		    qcow2_meta_mismatch(q, host, len, Q2M_NONE) >= 0) {
			qcow2_corrupt(q, "a compressed cluster lies outside the image or over its "
				      "metadata", guest, host);
			return -EIO;
		}
		return 0;
	}
	if (e & QCOW2_L2_RESERVED || (q->version < 3 && (e & QCOW2_OFLAG_ZERO))) {
		qcow2_corrupt(q, "an L2 entry has reserved bits set", guest, e);
		return -EIO;
	}
	if ((e & QCOW2_OFFSET_MASK) && !host_ok(q, e & QCOW2_OFFSET_MASK, q->cs)) {
		qcow2_corrupt(q, "a data cluster lies outside the image or over its tables", guest,
			e & QCOW2_OFFSET_MASK);
		return -EIO;
	}
	/* Guest data in a metadata cluster: a write there would overwrite
	 * the table (QEMU: "Preventing invalid write on metadata"), a read
	 * would hand the guest the image's own tables. */
	if (unlikely((e & QCOW2_OFFSET_MASK) &&
		     qcow2_meta_get(&q->meta, (e & QCOW2_OFFSET_MASK) >> q->cluster_bits)))
		return entry_on_meta(q, guest, e & QCOW2_OFFSET_MASK);
	if ((e & QCOW2_OFLAG_COPIED) && !(e & QCOW2_OFFSET_MASK)) {
		qcow2_corrupt(q, "an L2 entry claims host cluster 0 (the header)", guest, 0);
		return -EIO;
	}
	return 0;
}

/* ---- Compressed clusters -------------------------------------------- */

int qcow2_decompress(struct qcow2 *q, uint64_t e)
{
	unsigned x = 62 - (q->cluster_bits - 8);
	uint64_t host = e & ((1ull << x) - 1);
	uint64_t nsec = (e >> x) & ((1ull << (q->cluster_bits - 8)) - 1);
	size_t len = (size_t)((nsec + 1) * 512 - (host & 511));
	uint8_t *in = malloc(len);
	int r;

	if (!in)
		return -ENOMEM;
	r = sys_pread_full(q->mfd, in, len, host);
	if (r < 0)
		goto out;
	r = -EIO;
	if (q->compression == 0) {
		/* Raw deflate (QEMU compresses with windowBits -12; a larger
		 * window reads it too); done once it has made a whole cluster. */
		z_stream s = { .next_in = in, .avail_in = (uInt)len, .next_out = q->zbuf,
			       .avail_out = (uInt)q->cs };
		int z;

		if (inflateInit2(&s, -15) != Z_OK)
			goto out;
		z = inflate(&s, Z_FINISH);
		if ((z == Z_STREAM_END || z == Z_BUF_ERROR) && s.avail_out == 0)
			r = 0;
		inflateEnd(&s);
	} else {
#ifdef HAVE_ZSTD
		ZSTD_DStream *z = ZSTD_createDStream();
		ZSTD_inBuffer ib = { in, len, 0 };
		ZSTD_outBuffer ob = { q->zbuf, q->cs, 0 };

		if (!z)
			goto out;
		while (ob.pos < ob.size && ib.pos < ib.size) {
			size_t n = ZSTD_decompressStream(z, &ob, &ib);

			if (ZSTD_isError(n))
				break;
			if (n == 0)
				break;
		}
		if (ob.pos == ob.size)
			r = 0;
		ZSTD_freeDStream(z);
#endif
	}
	if (r < 0)
		qcow2_corrupt(q, "a compressed cluster does not decompress to a whole cluster", 0, host);
out:
	free(in);
	return r;
}

/* ---- Synchronous reads of a chain (copy on write) -------------------- */

static int read_backing_sync(struct qcow2 *q, uint64_t off, uint8_t *buf, size_t len);

int qcow2_read_sync(struct qcow2 *q, uint64_t off, void *buf, size_t len)
{
	uint8_t *p = buf;

	if (off >= q->size) {
		memset(p, 0, len);
		return 0;
	}
	if (off + len > q->size) {
		memset(p + (q->size - off), 0, len - (size_t)(q->size - off));
		len = (size_t)(q->size - off);
	}
	while (len) {
		uint64_t gcl = off >> q->cluster_bits, in = off & (q->cs - 1), e = 0;
		size_t n = (size_t)MIN(len, q->cs - in);
		uint8_t *l2;
		int r;

		l2 = qcow2_l2_get(q, gcl, false, &r);
		if (r < 0)
			return r;
		if (l2 && (r = qcow2_entry(q, l2, gcl, &e)) < 0)
			return r;
		if (e & QCOW2_OFLAG_COMPRESSED) {
			if ((r = qcow2_decompress(q, e)) < 0)
				return r;
			memcpy(p, q->zbuf + in, n);
		} else if (e & QCOW2_OFFSET_MASK && !(e & QCOW2_OFLAG_ZERO)) {
			if ((r = sys_pread_full(q->mfd, p, n, (e & QCOW2_OFFSET_MASK) + in)) < 0)
				return r;
		} else if (!(e & QCOW2_OFLAG_ZERO) && q->backing && !q->standalone) {
			r = read_backing_sync(q, off, p, n);
			if (r < 0)
				return r;
		} else {
			memset(p, 0, n);
		}
		p += n;
		off += n;
		len -= n;
	}
	return 0;
}

/* q's backing disk: a qcow2 one through its tables, a raw file plainly. */
static int read_backing_sync(struct qcow2 *q, uint64_t off, uint8_t *buf, size_t len)
{
	struct bdev *d = q->backing;

	if (d != q->backing_file)
		return qcow2_read_sync(container_of(d, struct qcow2, disk), off, buf, len);
	if (off >= d->size) {
		memset(buf, 0, len);
		return 0;
	}
	if (off + len > d->size) {
		size_t in = (size_t)(d->size - off);

		memset(buf + in, 0, len - in);
		len = in;
	}
	return sys_pread_full(q->backing_rfd, buf, len, off);
}

/* ---- Open ------------------------------------------------------------ */

/* A plain (buffered) second open of fd, for metadata: O_DIRECT wants
 * aligned buffers and lengths that tables and compressed clusters do not
 * have.  Same file, so one fdatasync covers both. */
int qcow2_reopen_plain(int fd, bool rw)
{
	char p[64];

	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	fd = open(p, (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static void qcow2_free(struct qcow2 *q)
{
	if (!q)
		return;
	cache_free(&q->l2c);
	cache_free(&q->rbc);
	free(q->l1);
	free(q->rt);
	free(q->frees);
	free(q->resv);
	free(q->quarantine);
	free(q->reuse);
	qcow2_meta_free(&q->meta);
	qcow2_bm_free(q);
	free(q->zbuf);
	free(q->path);
	free(q->backing_name);
	free(q->backing_fmt);
	if (q->mfd >= 0)
		close(q->mfd);
	if (q->backing_rfd >= 0)
		close(q->backing_rfd);
	free(q);
}

/* Header extensions (qcow2.txt, "Header extensions"): the backing
 * format; an encryption header is refused; the bitmaps extension is
 * qcow2_bm_scan's. */
static int parse_extensions(struct qcow2 *q, const uint8_t *h, char *err, size_t errlen)
{
	uint64_t p = q->version >= 3 ? q->header_len : 72;

	while (p + 8 <= q->cs) {
		uint32_t type = be32_at(h + p), len = be32_at(h + p + 4);

		if (type == 0)
			return 0;
		if (len > q->cs - p - 8) {
			snprintf(err, errlen, "qcow2 image %s is corrupt: header extension %#x "
				 "runs past the first cluster: check it with qemu-img check", q->path,
				 type);
			return -EINVAL;
		}
		if (type == QCOW2_EXT_BACKING_FMT) {
			q->backing_fmt = strndup((const char *)h + p + 8, len);
			if (!q->backing_fmt)
				return -ENOMEM;
		} else if (type == 0x0537be77u) {	/* full disk encryption header */
			snprintf(err, errlen, "qcow2 image %s is encrypted (LUKS inside qcow2), which "
				 "vblkd cannot serve yet: convert it with qemu-img convert", q->path);
			return -EOPNOTSUPP;
		}
		p += 8 + (((uint64_t)len + 7) & ~7ull);
	}
	return 0;
}

int qcow2_header_rewrite(struct qcow2 *q, const uint32_t *drop, unsigned ndrop, const uint8_t *add,
			 size_t addlen, bool keep_backing, uint64_t ac)
{
	uint64_t p = q->version >= 3 ? q->header_len : 72, w = p, boff, blen;
	uint8_t *h = malloc(q->cs), *n = calloc(1, q->cs);
	int r;

	if (!h || !n) {
		r = -ENOMEM;
		goto out;
	}
	if ((r = sys_pread_full(q->mfd, h, q->cs, 0)) < 0)
		goto out;
	memcpy(n, h, p);
	boff = be64_at(h + 8);
	blen = be32_at(h + 16);
	while (p + 8 <= q->cs) {
		uint32_t type = be32_at(h + p), len = be32_at(h + p + 4);
		uint64_t sz = 8 + (((uint64_t)len + 7) & ~7ull);
		bool keep = type != 0;

		if (type == 0 || sz > q->cs - p)
			break;
		for (unsigned i = 0; i < ndrop; i++)
			keep &= type != drop[i];
		if (keep) {
			memcpy(n + w, h + p, sz);
			w += sz;
		}
		p += sz;
	}
	if (w + addlen + 8 > q->cs) {
		r = -ENOSPC;
		goto out;
	}
	if (addlen)
		memcpy(n + w, add, addlen);
	w += addlen + 8;	/* the end marker: zeroes */
	if (!keep_backing || !boff || !blen) {
		memset(n + 8, 0, 12);
	} else {
		if (boff + blen > q->cs || w + blen > q->cs) {
			r = -ENOSPC;
			goto out;
		}
		memcpy(n + w, h + boff, blen);
		be64_put(n + 8, w);
	}
	if (q->version >= 3)
		be64_put(n + 88, ac);
	if ((r = meta_write(q, n, q->cs, 0, Q2M_HEADER)) < 0 || (r = sync_file(q)) < 0)
		goto out;
	if (q->version >= 3)
		q->autoclear = ac;
	qcow2_bm_scan(q, n);
out:
	free(h);
	free(n);
	return r;
}

/* After a stream: the header without the backing file (qcow2.txt,
 * "Header": backing_file_offset and _size zero; the backing format
 * extension dropped, the other extensions kept in their order), the
 * first cluster written in one piece and synced.  From then on q reads
 * as a standalone image; what is below is only kept open until close. */
int qcow2_drop_backing(struct qcow2 *q)
{
	static const uint32_t drop[] = { QCOW2_EXT_BACKING_FMT };
	int r = qcow2_header_rewrite(q, drop, 1, NULL, 0, false, q->autoclear);

	if (r < 0) {
		meta_failed(q, "rewriting the header without its backing file", 0, r);
		return r;
	}
	free(q->backing_name);
	free(q->backing_fmt);
	q->backing_name = q->backing_fmt = NULL;
	return 0;
}

/* *h holds the header's first 4 KiB: the whole first cluster (its
 * extensions) from here. */
static int read_first_cluster(struct qcow2 *q, uint8_t **h, char *err, size_t errlen)
{
	uint8_t *big;
	int r;

	if (q->cs <= 4096)
		return 0;
	if (!(big = realloc(*h, q->cs)))
		return -ENOMEM;
	*h = big;
	if ((r = sys_pread_full(q->mfd, big, q->cs, 0)) < 0)
		snprintf(err, errlen, "cannot read %s: %s", q->path, strerror(-r));
	return r;
}

static int check_header(struct qcow2 *q, const uint8_t *h, uint64_t fsize, char *err,
			size_t errlen)
{
	uint64_t need, l1_bytes;
	uint64_t bad;

	q->version = be32_at(h + 4);
	if (q->version != 2 && q->version != 3) {
		snprintf(err, errlen, "qcow2 image %s has version %u; vblkd serves versions 2 "
			 "and 3 (qemu-img amend -o compat=1.1 upgrades an image)", q->path,
			 q->version);
		return -EINVAL;
	}
	q->cluster_bits = be32_at(h + 20);
	if (q->cluster_bits < 9 || q->cluster_bits > 21) {
		snprintf(err, errlen, "qcow2 image %s has clusters of 2^%u bytes; 512 bytes to "
			 "2 MiB are valid (the image is corrupt: check it with qemu-img check)",
			 q->path, q->cluster_bits);
		return -EINVAL;
	}
	q->cs = 1ull << q->cluster_bits;
	q->size = be64_at(h + 24);
	q->l1_size = be32_at(h + 36);
	q->l1_off = be64_at(h + 40);
	q->rt_off = be64_at(h + 48);
	q->rt_clusters = be32_at(h + 56);
	q->nb_snapshots = be32_at(h + 60);
	q->snapshots_off = be64_at(h + 64);
	q->refcount_order = 4;
	q->header_len = 72;
	if (q->version >= 3) {
		q->incompat = be64_at(h + 72);
		q->compat = be64_at(h + 80);
		q->autoclear = be64_at(h + 88);
		q->refcount_order = be32_at(h + 96);
		q->header_len = be32_at(h + 100);
		if (q->header_len < 104 || q->header_len % 8 || q->header_len > q->cs) {
			snprintf(err, errlen, "qcow2 image %s is corrupt: header length %u: check "
				 "it with qemu-img check", q->path, q->header_len);
			return -EINVAL;
		}
		if (q->header_len > 104)
			q->compression = h[104];
	}
	if (be32_at(h + 32) != 0) {
		snprintf(err, errlen, "qcow2 image %s is encrypted (method %u), which vblkd cannot "
			 "serve yet: convert it with qemu-img convert", q->path, be32_at(h + 32));
		return -EOPNOTSUPP;
	}
	bad = q->incompat & ~QCOW2_INCOMPAT_KNOWN;
	if (bad) {
		snprintf(err, errlen, "qcow2 image %s uses features vblkd does not know "
			 "(incompatible bits %#llx): it cannot be served", q->path,
			 (unsigned long long)bad);
		return -EOPNOTSUPP;
	}
	if (q->incompat & QCOW2_INCOMPAT_DATA_FILE) {
		snprintf(err, errlen, "qcow2 image %s keeps its data in an external file, which "
			 "vblkd does not serve: convert it with qemu-img convert", q->path);
		return -EOPNOTSUPP;
	}
	if (q->incompat & QCOW2_INCOMPAT_EXTL2) {
		snprintf(err, errlen, "qcow2 image %s has extended L2 entries (subclusters), "
			 "which vblkd does not serve yet: convert it with qemu-img convert -O qcow2",
			 q->path);
		return -EOPNOTSUPP;
	}
	if ((q->incompat & QCOW2_INCOMPAT_COMPRESS) ? q->compression != 1 : q->compression) {
		snprintf(err, errlen, "qcow2 image %s names compression type %u; vblkd reads zlib "
			 "(0) and zstd (1)", q->path, q->compression);
		return -EOPNOTSUPP;
	}
#ifndef HAVE_ZSTD
	if (q->compression == 1) {
		snprintf(err, errlen, "qcow2 image %s uses zstd compression and this vblkd was "
			 "built without libzstd", q->path);
		return -EOPNOTSUPP;
	}
#endif
	if (q->rw && (q->incompat & (QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_CORRUPT))) {
		snprintf(err, errlen, "qcow2 image %s is marked %s: its refcounts may be wrong; "
			 "repair it with qemu-img check -r all %s (or serve it --read-only)",
			 q->path, q->incompat & QCOW2_INCOMPAT_CORRUPT ? "corrupt" : "dirty",
			 q->path);
		return -EINVAL;
	}
	if (q->refcount_order > 6) {
		snprintf(err, errlen, "qcow2 image %s is corrupt: refcount order %u (at most 6): "
			 "check it with qemu-img check", q->path, q->refcount_order);
		return -EINVAL;
	}
	q->l2_entries = q->cs / 8;
	q->rb_entries = (q->cs * 8) >> q->refcount_order;
	/* Enough L1 entries for the whole disk (QEMU refuses less too). */
	if (q->size > (1ull << 62) || q->size == 0) {
		snprintf(err, errlen, "qcow2 image %s is corrupt: virtual size %llu: check it "
			 "with qemu-img check", q->path, (unsigned long long)q->size);
		return -EINVAL;
	}
	need = ((q->size + q->cs - 1) >> q->cluster_bits);
	need = (need + q->l2_entries - 1) / q->l2_entries;
	l1_bytes = (uint64_t)q->l1_size * 8;
	if (q->l1_size < need || l1_bytes > QCOW2_MAX_L1_BYTES) {
		snprintf(err, errlen, "qcow2 image %s is corrupt: its L1 table has %u entries, "
			 "the disk needs %llu (and at most %u fit QEMU's limit): check it with "
			 "qemu-img check", q->path, q->l1_size, (unsigned long long)need,
			 QCOW2_MAX_L1_BYTES / 8);
		return -EINVAL;
	}
	if (q->l1_off % q->cs || q->l1_off < q->cs || q->l1_off + l1_bytes > fsize ||
	    q->rt_off % q->cs || q->rt_off < q->cs || q->rt_clusters == 0 ||
	    (uint64_t)q->rt_clusters * q->cs > QCOW2_MAX_RT_BYTES ||
	    q->rt_off + (uint64_t)q->rt_clusters * q->cs > fsize ||
	    in_range(q->l1_off, l1_bytes, q->rt_off, (uint64_t)q->rt_clusters * q->cs) ||
	    (q->nb_snapshots && (q->snapshots_off % q->cs || q->snapshots_off >= fsize))) {
		snprintf(err, errlen, "qcow2 image %s is corrupt: its L1 table, refcount table "
			 "or snapshot table lies outside the file, unaligned or overlapping: "
			 "check it with qemu-img check", q->path);
		return -EINVAL;
	}
	return 0;
}

static int load_tables(struct qcow2 *q, char *err, size_t errlen)
{
	uint64_t l1_bytes = (uint64_t)q->l1_size * 8, rt_bytes = (uint64_t)q->rt_clusters * q->cs;
	uint8_t *buf = malloc(MAX(l1_bytes, rt_bytes) ? MAX(l1_bytes, rt_bytes) : 8);
	int r;

	q->l1 = calloc(q->l1_size ? q->l1_size : 1, 8);
	q->rt_entries = rt_bytes / 8;
	q->rt = calloc(q->rt_entries, 8);
	if (!buf || !q->l1 || !q->rt) {
		free(buf);
		return -ENOMEM;
	}
	r = sys_pread_full(q->mfd, buf, l1_bytes, q->l1_off);
	if (r < 0)
		goto io;
	for (uint32_t i = 0; i < q->l1_size; i++) {
		uint64_t e = be64_at(buf + 8 * i), off = e & QCOW2_OFFSET_MASK;

		q->l1[i] = e;
		if ((e & QCOW2_L1_RESERVED) || (off && !host_ok(q, off, q->cs))) {
			snprintf(err, errlen, "qcow2 image %s is corrupt: L1 entry %u (%#llx) points "
				 "outside the file or over its tables: check it with qemu-img check",
				 q->path, i, (unsigned long long)e);
			free(buf);
			return -EINVAL;
		}
	}
	r = sys_pread_full(q->mfd, buf, rt_bytes, q->rt_off);
	if (r < 0)
		goto io;
	for (uint64_t i = 0; i < q->rt_entries; i++) {
		uint64_t e = be64_at(buf + 8 * i);

		q->rt[i] = e;
		if ((e & QCOW2_RT_RESERVED) || (e && !host_ok(q, e, q->cs))) {
			snprintf(err, errlen, "qcow2 image %s is corrupt: refcount table entry %llu "
				 "(%#llx) points outside the file or over its tables: check it with "
				 "qemu-img check", q->path, (unsigned long long)i, (unsigned long long)e);
			free(buf);
			return -EINVAL;
		}
	}
	free(buf);
	return 0;
io:
	free(buf);
	snprintf(err, errlen, "cannot read qcow2 image %s: %s", q->path, strerror(-r));
	return r;
}

/* Where new clusters go: past the file and past every cluster with a
 * refcount, so a new cluster has never held anything.  A refcount far
 * past the end of the file cannot be true (qemu-img check calls it a
 * leak; a crash of QEMU or of vblkd leaves them at most a few MiB past
 * it: vblkd makes the file cover its reserve before it sets refcounts):
 * a refcount block read from guest data, say.  Such an image is corrupt,
 * and new clusters would go gigabytes out: they go after the file. */
#define QCOW2_REFCOUNT_SLACK (64ull << 20)

static int find_next_free(struct qcow2 *q)
{
	uint64_t end = (q->file_size + q->cs - 1) & ~(q->cs - 1);

	q->next_free = end;
	for (uint64_t ti = q->rt_entries; ti-- > 0;) {
		struct qcow2_table *t;
		int r;

		if (!q->rt[ti])
			continue;
		t = cache_get(q, &q->rbc, (uint32_t)ti, q->rt[ti], true, &r);
		if (!t)
			return r;
		for (uint64_t bi = q->rb_entries; bi-- > 0;)
			if (rb_get(q, t->buf, bi)) {
				uint64_t last = (ti * q->rb_entries + bi + 1) << q->cluster_bits;

				if (last > end + QCOW2_REFCOUNT_SLACK) {
					qcow2_corrupt(q, "a refcount block counts clusters far past the "
						      "end of the file", QCOW2_NO_GUEST, q->rt[ti]);
					return 0;
				}
				q->next_free = MAX(q->next_free, last);
				return 0;
			}
	}
	return 0;
}

/*
 * The allocation bound (take_end): from where the image ends now, room
 * for every guest cluster once more (a copy on write of each: snapshots,
 * compressed clusters, backing files), an L2 table for each L1 entry,
 * the refcount blocks for all of it, a refcount table at QEMU's limit,
 * two reserve chunks and the file's 1 MiB steps.  A valid image never
 * needs more: freed clusters are reused (resv_refill).
 */
static void set_alloc_limit(struct qcow2 *q)
{
	uint64_t clusters = (q->size + q->cs - 1) >> q->cluster_bits;
	uint64_t base = MAX(q->next_free, (q->file_size + q->cs - 1) & ~(q->cs - 1));
	uint64_t grow = (clusters + q->l1_size + 2 * q->resv_chunk) * q->cs + QCOW2_MAX_RT_BYTES +
			(1ull << 20);
	uint64_t blocks = ((base + grow) >> q->cluster_bits) / q->rb_entries + 1;

	q->alloc_limit = base + grow + blocks * q->cs;
}

/* The tables just read are ours to use (at the claim; at open for a
 * read-only image): where the metadata lives, where new clusters go and
 * how far.  What is inconsistent marks the image corrupt.  0 or -errno. */
/*
 * The refcounts of the tables themselves, as qemu-img check holds them:
 * the header, the L1 table, the refcount table and each refcount block
 * are referenced once; an L2 table whose L1 entry says COPIED once, any
 * other at least once.  A refcount block that is really another table
 * (its "refcounts" an L2 table's entries, say) fails this for itself, and
 * would otherwise take our refcount updates over that table.  The first
 * mismatch marks the image corrupt.  0 or -errno (a read failed).
 */
/* One table cluster's refcount: 1 when exact, else at least 1.  0 (and
 * the image marked corrupt when it is not so), or -errno. */
static int table_refcount_ok(struct qcow2 *q, uint64_t off, bool exact, const char *what)
{
	int64_t rc = qcow2_refcount(q, off);
	char msg[160];

	if (rc < 0)
		return (int)rc;
	if (rc == 1 || (!exact && rc > 1))
		return 0;
	snprintf(msg, sizeof(msg), "%s has refcount %lld, not %s1", what, (long long)rc,
		 exact ? "" : "at least ");
	qcow2_corrupt(q, msg, QCOW2_NO_GUEST, off);
	return 0;
}

/* A bitmap's table or data clusters (qcow2_bm_meta): each referenced
 * once, as qemu-img check wants them. */
static int bitmap_refcounts_ok(struct qcow2 *q, uint64_t off, uint64_t len)
{
	int r = 0;

	for (uint64_t c = off; c < off + len && !r && !q->corrupt; c += q->cs)
		r = table_refcount_ok(q, c, true, "a bitmap's table or data cluster");
	return r;
}

static int check_table_refcounts(struct qcow2 *q)
{
	uint64_t l1_clusters = ((uint64_t)q->l1_size * 8 + q->cs - 1) >> q->cluster_bits;
	int r = table_refcount_ok(q, 0, true, "the header");

	for (uint64_t c = 0; c < l1_clusters && !r && !q->corrupt; c++)
		r = table_refcount_ok(q, q->l1_off + c * q->cs, true, "the L1 table");
	for (uint64_t c = 0; c < q->rt_clusters && !r && !q->corrupt; c++)
		r = table_refcount_ok(q, q->rt_off + c * q->cs, true, "the refcount table");
	for (uint64_t i = 0; i < q->rt_entries && !r && !q->corrupt; i++)
		if (q->rt[i])
			r = table_refcount_ok(q, q->rt[i], true,
					      "a refcount block (is it another table?)");
	for (uint32_t i = 0; i < q->l1_size && !r && !q->corrupt; i++)
		if (q->l1[i] & QCOW2_OFFSET_MASK)
			r = table_refcount_ok(q, q->l1[i] & QCOW2_OFFSET_MASK,
					      q->l1[i] & QCOW2_OFLAG_COPIED, "an L2 table");
	/* The bitmaps' clusters too: one with refcount 0 would be allocated
	 * again, or its free at the next store drive a refcount below zero
	 * (found at the first write, before). */
	if (q->bm_valid && q->bm_dir_len)
		for (uint64_t c = 0; c < q->bm_dir_len && !r && !q->corrupt; c += q->cs)
			r = table_refcount_ok(q, q->bm_dir_off + c, true,
					      "the bitmap directory");
	if (!r && !q->corrupt && q->bm_valid)
		r = qcow2_bm_meta(q, bitmap_refcounts_ok);
	return r;
}

static int qcow2_take(struct qcow2 *q)
{
	int r;

	q->corrupt = (q->incompat & QCOW2_INCOMPAT_CORRUPT) != 0;
	if ((r = qcow2_meta_build(q)) < 0 ||
	    (!q->corrupt && (r = check_table_refcounts(q)) < 0) || (r = find_next_free(q)) < 0)
		return r;
	set_alloc_limit(q);
	q->nquarantine = q->nreuse = 0;
	q->quarantine_left = 0;
	return 0;
}

int qcow2_open(struct bdev *file, const struct fmt_opts *o, unsigned depth,
	       struct qcow2 **out, char *err, size_t errlen)
{
	struct qcow2 *q = calloc(1, sizeof(*q));
	uint8_t *h = NULL;
	struct stat st;
	uint64_t l2_bytes, tables;
	unsigned n;
	int r;

	if (!q)
		return -ENOMEM;
	q->mfd = q->backing_rfd = -1;
	q->file = file;
	q->rw = !file->read_only;
	q->copy_on_read = o->copy_on_read && q->rw;
	q->path = strdup(file->path ? file->path : "(disk)");
	if (!q->path) {
		r = -ENOMEM;
		goto fail;
	}
	r = qcow2_reopen_plain(file->fd, q->rw);
	if (r < 0) {
		snprintf(err, errlen, "cannot open qcow2 image %s for its metadata: %s", q->path,
			 strerror(-r));
		goto fail;
	}
	q->mfd = r;
	if (fstat(q->mfd, &st) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot stat %s: %s", q->path, strerror(-r));
		goto fail;
	}
	q->file_size = file->is_blockdev ? file->size : (uint64_t)st.st_size;
	/* The header's first 4 KiB, then the first cluster (up to 2 MiB)
	 * once the header has said how big it is. */
	h = calloc(1, 4096);
	if (!h) {
		r = -ENOMEM;
		goto fail;
	}
	r = sys_pread_full(q->mfd, h, 4096, 0);
	if (r < 0) {
		snprintf(err, errlen, "cannot read %s: %s", q->path, strerror(-r));
		goto fail;
	}
	if (!qcow2_detect(h, 4096)) {
		snprintf(err, errlen, "%s is not a qcow2 image (no QFI\\xfb magic): serve it with "
			 "--format raw, or check the path", q->path);
		r = -EINVAL;
		goto fail;
	}
	if ((r = check_header(q, h, q->file_size, err, errlen)) < 0)
		goto fail;
	if ((r = read_first_cluster(q, &h, err, errlen)) < 0)
		goto fail;
	if ((r = parse_extensions(q, h, err, errlen)) < 0)
		goto fail;
	qcow2_bm_scan(q, h);
	q->meta_direct = file->direct && q->cs < (uint64_t)sysconf(_SC_PAGESIZE);
	{
		uint64_t boff = be64_at(h + 8);
		uint32_t blen = be32_at(h + 16);

		if (boff) {
			if (blen == 0 || blen > 1023 || boff > q->cs || boff + blen > q->cs) {
				snprintf(err, errlen, "qcow2 image %s is corrupt: its backing file name "
					 "(%u bytes at %llu) is not inside the first cluster or longer "
					 "than 1023 bytes", q->path, blen, (unsigned long long)boff);
				r = -EINVAL;
				goto fail;
			}
			q->backing_name = strndup((const char *)h + boff, blen);
			if (!q->backing_name || strlen(q->backing_name) != blen) {
				snprintf(err, errlen, "qcow2 image %s: its backing file name holds a "
					 "NUL byte", q->path);
				r = -EINVAL;
				goto fail;
			}
		}
	}
	/* Handed over: the tables are read at qcow2_reload, when the old
	 * process has stopped changing them. */
	if (!o->handover && (r = load_tables(q, err, errlen)) < 0)
		goto fail;
	/* The bitmaps (read again at the claim, if another process may have
	 * stored them meanwhile). */
	if (!o->handover && (r = qcow2_bm_read(q, err, errlen)) < 0)
		goto fail;
	if (o->handover)
		q->rt_entries = (uint64_t)q->rt_clusters * q->cs / 8;

	/* Caches: all L2 tables of the disk, at most 32 MiB (QEMU's default
	 * l2-cache-size on Linux), or what --l2-cache-size says; refcount
	 * blocks a quarter of that (QEMU's ratio), at least 4. */
	tables = ((q->size + q->cs - 1) >> q->cluster_bits);
	tables = (tables + q->l2_entries - 1) / q->l2_entries;
	l2_bytes = o->l2_cache_bytes ? o->l2_cache_bytes : MIN(tables * q->cs, 32ull << 20);
	n = (unsigned)MAX(2, MIN(l2_bytes / q->cs, (uint64_t)q->l1_size));
	if ((r = cache_init(&q->l2c, n, q->l1_size, q->cs)) < 0 ||
	    (r = cache_init(&q->rbc, MAX(4u, n / 4), q->rt_entries, q->cs)) < 0)
		goto nomem;
	if (posix_memalign((void **)&q->zbuf, 4096, q->cs))
		goto nomem;
	/* Reserved a chunk at a time: 16 MiB, 8 to 4096 clusters (a crash
	 * leaks at most that). */
	q->resv_chunk = MIN(4096ull, MAX(8ull, (16ull << 20) >> q->cluster_bits));
	/* Nothing is written before the image is ours (qcow2_reload at the
	 * first claim): another process may still serve it.  A read-only
	 * image's tables are used as read now. */
	q->stale = q->rw || o->handover;	/* handed over: not read yet */
	if (!q->stale && (r = qcow2_take(q)) < 0) {
		snprintf(err, errlen, "cannot read the refcounts of qcow2 image %s: %s", q->path,
			 strerror(-r));
		goto fail;
	}
	if (q->backing_name && !o->bitmaps_only &&
	    (r = fmt__open_backing(q, o, depth, err, errlen)) < 0)
		goto fail;
	free(h);
	*out = q;
	return 0;
nomem:
	r = -ENOMEM;
	snprintf(err, errlen, "out of memory for the caches of qcow2 image %s", q->path);
fail:
	free(h);
	qcow2_free(q);
	return r;
}

/* ---- Handed on and taken (format.h, fmt_quiesce / fmt_claim) -------- */

int qcow2_quiesce(struct qcow2 *q, char *err, size_t errlen)
{
	int r;

	if (q->streaming) {
		snprintf(err, errlen, "vblkctl stream is copying the backing chain of %s: "
			 "upgrade once it has finished", q->path);
		return -EBUSY;
	}
	if (!q->rw || q->stale)
		return 0;
	if (q->broken || q->corrupt) {
		snprintf(err, errlen, "qcow2 image %s is %s: restart vblkd instead, and repair "
			 "the image with qemu-img check -r all", q->path,
			 q->corrupt ? "corrupt" : "broken (a metadata write failed)");
		return -EIO;
	}
	/* The new process finds the reserve's clusters free, as after a
	 * clean close; we take a new reserve if we serve on. */
	resv_release(q);
	r = qcow2_flush(q);
	if (r < 0)
		snprintf(err, errlen, "cannot write the tables of qcow2 image %s back: %s",
			 q->path, strerror(-r));
	return r;
}

int qcow2_reload(struct qcow2 *q, char *err, size_t errlen)
{
	uint64_t size = q->size, cs = q->cs;
	unsigned nl2 = q->l2c.n, nrb = q->rbc.n;
	uint8_t *h = malloc(4096);
	struct stat st;
	int r;

	if (!h)
		return -ENOMEM;
	if (fstat(q->mfd, &st) < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot stat %s: %s", q->path, strerror(-r));
		goto out;
	}
	q->file_size = q->file->is_blockdev ? q->file->size : (uint64_t)st.st_size;
	if ((r = sys_pread_full(q->mfd, h, 4096, 0)) < 0) {
		snprintf(err, errlen, "cannot read %s: %s", q->path, strerror(-r));
		goto out;
	}
	/* Checked as at open: the old process wrote it, but it is a file. */
	if (!qcow2_detect(h, 4096)) {
		snprintf(err, errlen, "%s is no longer a qcow2 image", q->path);
		r = -EINVAL;
		goto out;
	}
	if ((r = check_header(q, h, q->file_size, err, errlen)) < 0)
		goto out;
	/* Grown meanwhile (vblkctl resize where it ran before): the guest
	 * may use the new end; shrunk, or another cluster size: not the
	 * image the guest was given. */
	if (q->size < size || q->cs != cs) {
		snprintf(err, errlen, "qcow2 image %s was %s by another process while it was "
			 "not served here: restart vblkd on it", q->path,
			 q->cs != cs ? "rewritten" : "shrunk");
		r = -ESTALE;
		goto out;
	}
	if (q->size > size) {
		log_info("qcow2 image %s: grown to %llu bytes where it was served before", q->path,
			 (unsigned long long)q->size);
		WRITE_ONCE(q->disk.size, q->size);
	}
	/* A stream that finished before the old process stopped. */
	if (q->backing_name && !be64_at(h + 8))
		q->standalone = true;
	free(q->l1);
	free(q->rt);
	q->l1 = q->rt = NULL;
	if ((r = load_tables(q, err, errlen)) < 0)
		goto out;
	/* The bitmaps extension may lie past the first 4 KiB. */
	if ((r = read_first_cluster(q, &h, err, errlen)) < 0)
		goto out;
	qcow2_bm_scan(q, h);
	if ((r = qcow2_bm_read(q, err, errlen)) < 0)
		goto out;
	q->write_begun = false;
	/* Whatever we cached at open may be old. */
	cache_free(&q->l2c);
	cache_free(&q->rbc);
	if ((r = cache_init(&q->l2c, nl2, q->l1_size, q->cs)) < 0 ||
	    (r = cache_init(&q->rbc, nrb, q->rt_entries, q->cs)) < 0) {
		snprintf(err, errlen, "out of memory for the caches of qcow2 image %s", q->path);
		goto out;
	}
	q->l1_dirty_lo = q->l1_dirty_hi = 0;
	q->rt_dirty = false;
	q->nresv = q->nfrees = 0;
	/* Ours from here (the lock is held): an inconsistency found now is
	 * marked in the header. */
	q->stale = false;
	if ((r = qcow2_take(q)) < 0) {
		snprintf(err, errlen, "cannot read the refcounts of qcow2 image %s: %s", q->path,
			 strerror(-r));
		goto out;
	}
	q->stale = false;
out:
	free(h);
	/* Half read: nothing may use the tables until a reload succeeds. */
	if (r < 0)
		q->stale = true;
	return r;
}

int qcow2_begin_write(struct qcow2 *q)
{
	/* Bit 0 stays: we keep the bitmaps extension (qcow2_bitmap.c); bit
	 * 63 is ours (the write-ahead below sets it again). */
	uint64_t keep = q->bm_valid ? QCOW2_AUTOCLEAR_BITMAPS : 0;
	uint8_t v[8];
	char err[256];
	int r;

	if (q->write_begun)
		return 0;
	if (q->corrupt || q->broken)
		return -EIO;
	if (q->autoclear & ~keep) {
		be64_put(v, q->autoclear & keep);
		if ((r = meta_write(q, v, 8, 88, Q2M_HEADER)) < 0 || (r = sync_file(q)) < 0) {
			meta_failed(q, "clearing the autoclear bits", 88, r);
			return r;
		}
		q->autoclear &= keep;
	}
	/* The disk's persistent bitmaps stored as they are, in use and
	 * written ahead from here; without any, the image's other bitmaps in
	 * use (they would miss these writes). */
	if (q->nheld && q->version >= 3) {
		if ((r = qcow2_bm_store(q, q->held, q->nheld, true, true, err, sizeof(err))) < 0) {
			log_err("%s", err);
			return r;
		}
	} else if ((r = qcow2_bm_mark_in_use(q)) < 0) {
		meta_failed(q, "marking the bitmaps in use", q->bm_dir_off, r);
		return r;
	}
	q->write_begun = true;
	return 0;
}

int qcow2_close(struct qcow2 *q)
{
	int r;

	/* Stale: not ours (let go, or never taken), nothing of ours to write. */
	if (q->stale) {
		qcow2_free(q);
		return 0;
	}
	if (q->rw && !q->broken && !q->corrupt)
		resv_release(q);
	r = qcow2_flush(q);
	if (r < 0)
		log_err("qcow2 image %s: metadata not written back at exit: %s", q->path,
			strerror(-r));
	qcow2_free(q);
	return r;
}

void qcow2_describe(const struct qcow2 *q, char *buf, size_t len)
{
	int n = snprintf(buf, len, "qcow2 v%u, %llu %s clusters, %u-bit refcounts%s",
			 q->version, (unsigned long long)(q->cs < 1024 ? q->cs : q->cs >> 10),
			 q->cs < 1024 ? "byte" : "KiB", 1u << q->refcount_order,
			 q->nb_snapshots ? ", snapshots kept" : "");

	if (q->backing_name && !q->standalone && n > 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, ", backing %s (%s)", q->backing_name,
			 q->backing != q->backing_file ? "qcow2" : "raw");
}

/* ---- New images ------------------------------------------------------- */

/*
 * A new qcow2 image at path (qcow2.txt, "Header"; 64 KiB clusters, v3,
 * 16-bit refcounts, QEMU's defaults): size bytes, no data; backing (raw,
 * never probed) or none.  Cluster 0 the header, 1 the refcount table, 2
 * its one block, then the L1 table (all unallocated); the refcount
 * table's one cluster covers 2^28 clusters, the allocator adds blocks as
 * the image grows.  Written whole, then synced with its directory;
 * O_EXCL: never over a file that is there (-EEXIST, nothing written).
 */
int qcow2_create(const char *path, const char *backing, uint64_t size, char *err,
		 size_t errlen)
{
	const uint64_t cs = 65536;
	uint64_t l1_size = div_up(size, cs * (cs / 8)), l1c = div_up(l1_size * 8, cs);
	uint64_t nclusters = 3 + MAX(l1c, 1), blen = backing ? strlen(backing) : 0, at;
	uint8_t *img;
	int fd, r = 0;

	if ((backing && (blen == 0 || blen > 1023 || 112 + 8 + 8 + 8 + blen > cs)) ||
	    nclusters > cs / 2 || size == 0 || size > (1ull << 50)) {
		snprintf(err, errlen, "cannot make qcow2 image %s: %s", path,
			 backing && (blen == 0 || blen > 1023) ? "its backing file's path is too long" :
			 "give a size from 1 byte to 1 PiB");
		return -EINVAL;
	}
	img = calloc(nclusters, cs);
	if (!img)
		return -ENOMEM;
	be32_put(img, QCOW2_MAGIC);
	be32_put(img + 4, 3);
	be32_put(img + 20, 16);			/* cluster_bits */
	be64_put(img + 24, size);
	be32_put(img + 36, (uint32_t)l1_size);
	be64_put(img + 40, 3 * cs);		/* l1_table_offset */
	be64_put(img + 48, cs);			/* refcount_table_offset */
	be32_put(img + 56, 1);			/* refcount_table_clusters */
	be32_put(img + 96, 4);			/* refcount_order */
	be32_put(img + 100, 112);		/* header_length */
	if (backing) {
		/* The backing file's format: raw (never probed). */
		at = 112;
		be32_put(img + at, QCOW2_EXT_BACKING_FMT);
		be32_put(img + at + 4, 3);
		memcpy(img + at + 8, "raw", 3);
		at += 16 + 8;			/* and the end marker */
		memcpy(img + at, backing, blen);
		be64_put(img + 8, at);
		be32_put(img + 16, (uint32_t)blen);
	}
	be64_put(img + cs, 2 * cs);		/* refcount table -> block */
	for (uint64_t c = 0; c < nclusters; c++) {
		img[2 * cs + 2 * c] = 0;
		img[2 * cs + 2 * c + 1] = 1;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot make qcow2 image %s: %s", path, strerror(-r));
		free(img);
		return r;
	}
	if ((r = sys_pwrite_full(fd, img, nclusters * cs, 0)) < 0 || (fsync(fd) < 0 && (r = -errno))) {
		snprintf(err, errlen, "cannot write qcow2 image %s: %s", path, strerror(-r));
		unlink(path);
	}
	close(fd);
	free(img);
	if (r == 0) {
		/* The new name durable too. */
		char *dup = strdup(path);
		int dfd = dup ? open(dirname(dup), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;

		if (dfd >= 0) {
			(void)fsync(dfd);
			close(dfd);
		}
		free(dup);
	}
	return r;
}
