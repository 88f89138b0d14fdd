/*
 * Persistent dirty bitmaps in a qcow2 image (issue 46): QEMU's own
 * bitmaps extension (qcow2.txt, "Bitmaps extension", "Bitmaps"), so that
 * qemu-img info, qemu-img bitmap, qemu-nbd -B and QEMU read what vblkd
 * kept, and vblkd carries on what QEMU made.
 *
 * The directory is read and checked at open and at every claim (another
 * process may have written the image meanwhile); a directory that is not
 * well formed refuses the image, as QEMU refuses it.  A bitmap vblkd can
 * track (a dirty-tracking bitmap, consistent, of a granularity and name
 * it takes) is loaded into the disk's bitmaps (fmt_bitmaps_load); the
 * others are carried on as they are, their clusters untouched.
 *
 * While the image is ours and about to change (the first write, or a
 * change to a persistent bitmap), every bitmap we hold and every other
 * 'auto' bitmap is marked in_use in the file: until it is stored again it
 * is not to be trusted (qcow2.txt, "Dirty tracking bitmaps"), as QEMU
 * does.  At the release (the VM stops, moves away, vblkd exits, an
 * upgrade hands over) the disk's persistent bitmaps are stored: data and
 * tables into new clusters, refcounts durable, then a new directory, then
 * the header pointing at it, then the old clusters freed; a crash at any
 * point leaves the old directory or the new one, and at worst leaked
 * clusters (qemu-img check: leaks, no corruption).
 *
 * Crash: QEMU's in_use bitmaps are lost to a crash (the next backup is a
 * full one).  Ours are written ahead instead.  At the first change the
 * held bitmaps are stored with every data cluster allocated and in_use
 * set, and the header gets our extension ("vbl1": the region size and
 * the names it vouches for) and autoclear bit 63.  Then the first write
 * to each region of the disk (1/1024 of it, at least 1 MiB and 8 chunks)
 * sets the region's bits in every enabled held bitmap's data in the image
 * and syncs before the write goes on: the image's bits cover every write,
 * by whole regions, at any crash, kill -9 or power cut (at most 1024
 * syncs per store; none once a region is marked).  The next open takes
 * such an in_use bitmap as it is, if bit 63 is still set: a writer that
 * does not know it (QEMU) clears it, and the bitmaps it did not track are
 * then in_use for us too.
 *
 * Owned like the tables: q's iothread, or the main thread while none
 * runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bitmap/dbm.h"
#include "format/qcow2.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sys.h"

#define BM_EXT_TYPE QCOW2_EXT_BITMAPS
#define WAL_EXT_TYPE 0x76626c31u	/* "vbl1": ours */
#define WAL_MAX_NAMES 255u
#define WAL_REGIONS 1024u
#define BM_EXT_LEN 24u
#define BM_FLAG_IN_USE (1u << 0)
#define BM_FLAG_AUTO (1u << 1)
#define BM_FLAG_EXTRA_OK (1u << 2)
#define BM_FLAGS_KNOWN 7u
#define BM_TYPE_DIRTY 1u
/* QEMU's limits (block/qcow2-bitmap.c, BME_*; block/qcow2.h). */
#define BM_MIN_GRAN_BITS 9u
#define BM_MAX_GRAN_BITS 31u
#define BM_MAX_NAME 1023u
#define BM_MAX_TABLE 0x8000000u		/* entries */
#define BM_MAX_PHYS (512ull << 20)	/* bytes of one bitmap's data */
#define BM_MAX_PHYS_ALL (1ull << 30)	/* of all the bitmaps vblkd takes: ours */
#define BM_MAX_COUNT 65535u
#define BM_ENT_FIXED 24u
/* Table entries of all the bitmaps together: what we read and keep to
 * know their clusters.  A real image has a few hundred (1 TiB at 64 KiB
 * chunks: 32); a hostile one could ask for gigabytes. */
#define BM_MAX_TABLES_ALL (1u << 20)
/* A bitmap table entry: bits 1-8 and 56-63 reserved. */
#define BM_TE_RESERVED 0xff000000000001feull

static uint16_t be16_at(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

/* Bytes of bitmap data for a disk of size at 2^gran_bits per bit. */
static uint64_t data_bytes(uint64_t size, unsigned gran_bits)
{
	return div_up(div_up(size, 1ull << gran_bits), 8);
}

static void wal_names_free(struct qcow2 *q)
{
	for (uint32_t i = 0; i < q->wal_nnames; i++)
		free(q->wal_names[i]);
	free(q->wal_names);
	q->wal_names = NULL;
	q->wal_nnames = 0;
}

/* Our extension: u32 region bits, u32 count, then count names (u8
 * length, bytes).  One that does not parse vouches for nothing. */
static void wal_scan(struct qcow2 *q, const uint8_t *p, uint32_t len)
{
	uint32_t n, at = 8;

	wal_names_free(q);
	if (len < 8 || (n = be32_at(p + 4)) > WAL_MAX_NAMES)
		return;
	q->wal_names = calloc(n ? n : 1, sizeof(*q->wal_names));
	if (!q->wal_names)
		return;
	q->wal_ext_bits = be32_at(p);
	for (uint32_t i = 0; i < n; i++) {
		if (at >= len || p[at] == 0 || p[at] > len - at - 1 ||
		    !(q->wal_names[i] = strndup((const char *)p + at + 1, p[at]))) {
			wal_names_free(q);
			return;
		}
		q->wal_nnames = i + 1;
		at += 1 + p[at];
	}
}

static bool wal_vouches(const struct qcow2 *q, const char *name)
{
	if (!(q->autoclear & QCOW2_AUTOCLEAR_VBLK_WAL))
		return false;
	for (uint32_t i = 0; i < q->wal_nnames; i++)
		if (!strcmp(q->wal_names[i], name))
			return true;
	return false;
}

void qcow2_bm_scan(struct qcow2 *q, const uint8_t *h)
{
	uint64_t p = q->version >= 3 ? q->header_len : 72;

	q->bm_ext_pos = 0;
	q->bm_ext_bad_len = q->bm_ext_bad_reserved = false;
	q->hdr_other = p + (be64_at(h + 8) ? be32_at(h + 16) : 0);
	q->bm_count = 0;
	q->bitmaps_dir_off = q->bitmaps_dir_size = 0;
	wal_names_free(q);
	while (p + 8 <= q->cs) {
		uint32_t type = be32_at(h + p), len = be32_at(h + p + 4);

		if (type == 0 || len > q->cs - p - 8)
			return;
		if (type == BM_EXT_TYPE && len != BM_EXT_LEN)
			q->bm_ext_bad_len = true;
		if (type == BM_EXT_TYPE && len >= BM_EXT_LEN) {
			q->bm_ext_bad_reserved = be32_at(h + p + 12) != 0;
			q->bm_ext_pos = (uint32_t)p;
			q->bm_count = be32_at(h + p + 8);
			q->bitmaps_dir_size = be64_at(h + p + 8 + 8);
			q->bitmaps_dir_off = be64_at(h + p + 8 + 16);
		}
		if (type == WAL_EXT_TYPE)
			wal_scan(q, h + p + 8, len);
		else if (type != BM_EXT_TYPE)
			q->hdr_other += 8 + (((uint64_t)len + 7) & ~7ull);
		p += 8 + (((uint64_t)len + 7) & ~7ull);
	}
}

static void bm_free_list(struct qcow2_bm *bm, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		free(bm[i].name);
		free(bm[i].table);
	}
	free(bm);
}

static void wal_off(struct qcow2 *q)
{
	for (unsigned i = 0; i < q->wal_nbm; i++)
		free(q->wal_bm[i].data);
	free(q->wal_bm);
	free(q->wal_done);
	free(q->wal_pend);
	q->wal_bm = NULL;
	q->wal_done = NULL;
	q->wal_pend = NULL;
	q->wal_npend = 0;
	q->wal_nbm = 0;
	q->wal_nregions = 0;
	q->wal_on = false;
}

/* The directory as read. */
static void dir_free(struct qcow2 *q)
{
	bm_free_list(q->bm, q->nbm);
	q->bm = NULL;
	q->nbm = 0;
	free(q->bm_dir);
	q->bm_dir = NULL;
	q->bm_dir_len = 0;
}

void qcow2_bm_free(struct qcow2 *q)
{
	wal_off(q);
	wal_names_free(q);
	free(q->held);
	q->held = NULL;
	q->nheld = 0;
	dir_free(q);
}

static int name_cmp(const void *a, const void *b)
{
	const struct qcow2_bm *x = *(struct qcow2_bm *const *)a, *y = *(struct qcow2_bm *const *)b;

	return strcmp(x->name, y->name);
}

static bool names_unique(struct qcow2_bm *bm, uint32_t n)
{
	struct qcow2_bm **v;
	bool ok = true;

	if (n < 2)
		return true;
	v = malloc(n * sizeof(*v));
	if (!v)
		return true;	/* not checked: QEMU's store would find it */
	for (uint32_t i = 0; i < n; i++)
		v[i] = &bm[i];
	qsort(v, n, sizeof(*v), name_cmp);
	for (uint32_t i = 1; i < n && ok; i++)
		ok = strcmp(v[i - 1]->name, v[i]->name) != 0;
	free(v);
	return ok;
}

/* The file's end, rounded to a cluster: nothing of the image lies past it. */
static uint64_t file_end(const struct qcow2 *q)
{
	return MAX(q->next_free, (q->file_size + q->cs - 1) & ~(q->cs - 1));
}

static bool place_ok(const struct qcow2 *q, uint64_t off, uint64_t len)
{
	return off >= q->cs && off % q->cs == 0 && off + len > off && off + len <= file_end(q);
}

/* One entry of the directory at d[pos..]: parsed into e, its table read
 * (*tables: entries read so far).  0, or -EINVAL with the reason in why. */
static int parse_entry(struct qcow2 *q, const uint8_t *d, uint64_t len, uint64_t pos,
		       struct qcow2_bm *e, char *why, size_t whylen, uint64_t *tables)
{
	const uint8_t *p = d + pos;
	uint32_t extra, nlen;
	uint64_t tbytes, want;
	uint8_t *buf;
	int r;

	if (len - pos < BM_ENT_FIXED) {
		snprintf(why, whylen, "its bitmap directory ends inside an entry");
		return -EINVAL;
	}
	e->table_off = be64_at(p);
	e->table_size = be32_at(p + 8);
	e->flags = be32_at(p + 12);
	e->type = p[16];
	e->gran_bits = p[17];
	nlen = be16_at(p + 18);
	extra = be32_at(p + 20);
	e->dir_pos = (uint32_t)pos;
	e->ent_len = (uint32_t)((BM_ENT_FIXED + (uint64_t)extra + nlen + 7) & ~7ull);
	if (nlen == 0 || nlen > BM_MAX_NAME || extra > len || e->ent_len > len - pos) {
		snprintf(why, whylen, "bitmap directory entry at %llu has a name of %u bytes and "
			 "%u bytes of extra data, more than the directory holds",
			 (unsigned long long)pos, nlen, extra);
		return -EINVAL;
	}
	e->name = strndup((const char *)p + BM_ENT_FIXED + extra, nlen);
	if (!e->name)
		return -ENOMEM;
	if (strlen(e->name) != nlen) {
		snprintf(why, whylen, "a bitmap's name holds a NUL byte");
		return -EINVAL;
	}
	/* For log lines and errors: one line whatever the name holds. */
	for (uint32_t i = 0; i < sizeof(e->shown) - 1 && e->name[i]; i++)
		e->shown[i] = (e->name[i] < 0x20 || e->name[i] == 0x7f) ? '?' : e->name[i];
	if (e->flags & ~BM_FLAGS_KNOWN) {
		snprintf(why, whylen, "bitmap '%.80s' has unknown flags %#x", e->shown, e->flags);
		return -EINVAL;
	}
	tbytes = (uint64_t)e->table_size * 8;
	*tables += e->table_size;
	if (*tables > BM_MAX_TABLES_ALL) {
		snprintf(why, whylen, "its bitmaps' tables have more than %u entries in all",
			 BM_MAX_TABLES_ALL);
		return -EINVAL;
	}
	if (!e->table_size || e->table_size > BM_MAX_TABLE || !place_ok(q, e->table_off, tbytes) ||
	    qcow2_meta_clash(q, e->table_off, tbytes)) {
		snprintf(why, whylen, "bitmap '%.80s''s table (%u entries at %#llx) is empty, too "
			 "big, misaligned, outside the file or over the image's tables", e->shown,
			 e->table_size, (unsigned long long)e->table_off);
		return -EINVAL;
	}
	/* A bitmap vblkd can take: the size of its table is checked as
	 * QEMU checks it when it loads one. */
	e->recovered = (e->flags & BM_FLAG_IN_USE) && wal_vouches(q, e->name);
	e->usable = e->type == BM_TYPE_DIRTY && (!(e->flags & BM_FLAG_IN_USE) || e->recovered) &&
		    (!extra || (e->flags & BM_FLAG_EXTRA_OK)) && e->gran_bits >= BM_MIN_GRAN_BITS &&
		    e->gran_bits <= BM_MAX_GRAN_BITS && dbm_name_ok(e->name);
	if (e->usable) {
		uint64_t db = data_bytes(q->size, e->gran_bits);

		want = div_up(db, q->cs);
		/* Written ahead, then the disk grew and vblkd stopped before it
		 * stored the bitmap again: in use as QEMU sees it, kept. */
		if (e->recovered && want != e->table_size && db <= BM_MAX_PHYS) {
			e->recovered = e->usable = false;
			e->stale_size = true;
		} else if (db > BM_MAX_PHYS || want != e->table_size) {
			snprintf(why, whylen, "bitmap '%.80s' has a table of %u entries where a "
				 "%llu-byte disk at %u-byte granularity needs %llu%s", e->shown,
				 e->table_size, (unsigned long long)q->size, 1u << e->gran_bits,
				 (unsigned long long)want, db > BM_MAX_PHYS ? " (too big)" : "");
			return -EINVAL;
		}
	}
	e->table = malloc(tbytes);
	buf = malloc(tbytes);
	if (!e->table || !buf) {
		free(buf);
		return -ENOMEM;
	}
	if ((r = sys_pread_full(q->mfd, buf, tbytes, e->table_off)) < 0) {
		free(buf);
		snprintf(why, whylen, "bitmap '%.80s''s table cannot be read: %s", e->shown,
			 strerror(-r));
		return r;
	}
	for (uint32_t i = 0; i < e->table_size; i++) {
		uint64_t t = be64_at(buf + 8 * i), off = t & QCOW2_OFFSET_MASK;

		e->table[i] = t;
		/* qcow2.txt, "Bitmap table": bit 0 only without an offset. */
		if ((t & BM_TE_RESERVED) || (off && (t & 1)) ||
		    (off && (!place_ok(q, off, q->cs) || qcow2_meta_clash(q, off, q->cs)))) {
			free(buf);
			snprintf(why, whylen, "bitmap '%.80s''s table entry %u (%#llx) is not valid "
				 "or points outside the file or over the image's tables", e->shown, i,
				 (unsigned long long)t);
			return -EINVAL;
		}
	}
	free(buf);
	return 0;
}

int qcow2_bm_read(struct qcow2 *q, char *err, size_t errlen)
{
	struct qcow2_bm *bm = NULL, *old = q->bm;
	uint32_t n = 0, nold = q->nbm;
	uint64_t size = q->bitmaps_dir_size, off = q->bitmaps_dir_off, pos = 0, tables = 0;
	uint8_t *d = NULL;
	char why[256] = "";
	int r = 0;

	/* QEMU's qcow2_read_extensions: the length always, the reserved
	 * field while the extension is valid. */
	if (q->bm_ext_bad_len || ((q->autoclear & 1) && q->bm_ext_bad_reserved)) {
		snprintf(why, sizeof(why), "its bitmaps extension %s", q->bm_ext_bad_len ?
			 "is not 24 bytes long" : "has a reserved field that is not zero");
		r = -EINVAL;
		goto fail;
	}
	/* qcow2.txt, "autoclear_features" bit 0: the extension is valid only
	 * while it is set (a writer that did not know it cleared it). */
	if (!(q->autoclear & 1) || !q->bm_ext_pos) {
		q->bm_changed = q->bm_dir_len != 0;
		q->bm_valid = false;
		dir_free(q);
		return 0;
	}
	if (!size || size > QCOW2_MAX_BITMAP_DIR_BYTES || !q->bm_count ||
	    q->bm_count > BM_MAX_COUNT || !place_ok(q, off, size) || qcow2_meta_clash(q, off, size)) {
		snprintf(why, sizeof(why), "its bitmap directory (%u bitmaps, %llu bytes at %#llx) "
			 "is empty, too big, misaligned or outside the file", q->bm_count,
			 (unsigned long long)size, (unsigned long long)off);
		r = -EINVAL;
		goto fail;
	}
	d = malloc(size);
	bm = calloc(q->bm_count, sizeof(*bm));
	if (!d || !bm) {
		r = -ENOMEM;
		goto fail;
	}
	if ((r = sys_pread_full(q->mfd, d, size, off)) < 0) {
		snprintf(why, sizeof(why), "its bitmap directory cannot be read: %s", strerror(-r));
		goto fail;
	}
	while (pos < size) {
		if (n == q->bm_count) {
			snprintf(why, sizeof(why), "its bitmap directory holds more than the %u "
				 "bitmaps the header counts", q->bm_count);
			r = -EINVAL;
			goto fail;
		}
		if ((r = parse_entry(q, d, size, pos, &bm[n++], why, sizeof(why), &tables)) < 0)
			goto fail;
		pos += bm[n - 1].ent_len;
	}
	{
		uint64_t all = 0;

		for (uint32_t i = 0; i < n; i++)
			if (bm[i].usable)
				all += data_bytes(q->size, bm[i].gran_bits);
		if (all > BM_MAX_PHYS_ALL) {
			snprintf(why, sizeof(why), "its bitmaps would take %llu MiB of memory, more "
				 "than the %llu MiB vblkd gives them", (unsigned long long)(all >> 20),
				 (unsigned long long)(BM_MAX_PHYS_ALL >> 20));
			r = -EINVAL;
			goto fail;
		}
	}
	if (n != q->bm_count || !names_unique(bm, n)) {
		snprintf(why, sizeof(why), n != q->bm_count ?
			 "its bitmap directory holds fewer bitmaps than its header counts" :
			 "two of its bitmaps have the same name");
		r = -EINVAL;
		goto fail;
	}
	/* The same directory where it was: nobody stored bitmaps since we
	 * read or wrote it, and what we hold is still theirs to be. */
	q->bm_changed = !(q->bm_dir && q->bm_dir_off == off && q->bm_dir_len == size &&
			  !memcmp(q->bm_dir, d, size));
	for (uint32_t i = 0; !q->bm_changed && i < n; i++)
		for (uint32_t j = 0; j < nold; j++)
			if (old[j].ours && !strcmp(old[j].name, bm[i].name))
				bm[i].ours = true;
	dir_free(q);
	q->bm = bm;
	q->nbm = n;
	q->bm_dir = d;
	q->bm_dir_len = size;
	q->bm_dir_off = off;
	q->bm_valid = true;
	return 0;
fail:
	if (r == -ENOMEM)
		snprintf(err, errlen, "out of memory for the bitmaps of qcow2 image %s", q->path);
	else
		snprintf(err, errlen, "qcow2 image %s is corrupt: %s: check it with qemu-img check "
			 "(qemu-img bitmap --remove drops a bitmap)", q->path, why);
	if (bm)
		bm_free_list(bm, q->bm_count);
	free(d);
	return r < 0 ? r : -EINVAL;
}

int qcow2_bm_meta(struct qcow2 *q, int (*add)(struct qcow2 *q, uint64_t off, uint64_t len))
{
	int r;

	for (uint32_t i = 0; i < q->nbm; i++) {
		const struct qcow2_bm *e = &q->bm[i];

		if ((r = add(q, e->table_off, (uint64_t)e->table_size * 8)) < 0)
			return r;
		for (uint32_t j = 0; j < e->table_size; j++)
			if ((e->table[j] & QCOW2_OFFSET_MASK) &&
			    (r = add(q, e->table[j] & QCOW2_OFFSET_MASK, q->cs)) < 0)
				return r;
	}
	return 0;
}

/* ---- Loading ------------------------------------------------------- */

/* Bytes [boff, boff + n) of a bitmap's data into its words (the data is
 * bit i of byte i / 8 for chunk i, least significant first: qcow2.txt,
 * "Bitmap data"), the tail past nbits dropped. */
static void bytes_to_words(struct dbm *b, const uint8_t *src, uint64_t boff, uint64_t n)
{
	for (uint64_t k = 0; k < n; k++) {
		uint64_t byte = boff + k, w = byte / 8;
		uint64_t v = (uint64_t)src[k] << (8 * (byte % 8));

		if (byte * 8 >= b->nbits)
			break;
		if (byte * 8 + 8 > b->nbits)
			v &= ((1ull << (b->nbits % 8)) - 1) << (8 * (byte % 8));
		if (v)
			atomic_fetch_or_explicit(&b->words[w], v, memory_order_relaxed);
	}
}

/* Why vblkd keeps e in the image but does not use it. */
static const char *why_kept(const struct qcow2_bm *e)
{
	if (e->stale_size)
		return "it is marked in use, and was written ahead for a disk of another size "
		       "(vblkd stopped right after a resize): remove it with qemu-img bitmap --remove";
	if (e->flags & BM_FLAG_IN_USE)
		return "it is marked in use (whoever wrote the image last did not store it: it "
		       "may miss writes); remove it with qemu-img bitmap --remove, or add one of "
		       "that name to replace it";
	if (e->type != BM_TYPE_DIRTY)
		return "it is not a dirty-tracking bitmap";
	if (e->gran_bits < BM_MIN_GRAN_BITS || e->gran_bits > BM_MAX_GRAN_BITS)
		return "its granularity is outside 512 bytes to 2 GiB";
	if (!dbm_name_ok(e->name))
		return "vblkd takes names of up to 63 of A-Z a-z 0-9 _ . - only";
	if (!e->usable)
		return "it has extra data vblkd does not know";
	return "a bitmap of that name that is not persistent exists here";
}

unsigned qcow2_bm_kept(struct qcow2 *q, struct fmt_bitmap_kept *out, unsigned max)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < q->nbm; i++) {
		const struct qcow2_bm *e = &q->bm[i];

		if (e->ours)
			continue;
		if (n < max) {
			snprintf(out[n].name, sizeof(out[n].name), "%s", e->name);
			out[n].granularity = e->gran_bits < 32 ? 1u << e->gran_bits : 0;
			out[n].enabled = (e->flags & BM_FLAG_AUTO) != 0;
			out[n].why = why_kept(e);
		}
		n++;
	}
	return n;
}

int qcow2_bm_load(struct qcow2 *q, struct dbm ***out, unsigned *nout, char *err, size_t errlen)
{
	struct dbm **v = calloc(q->nbm ? q->nbm : 1, sizeof(*v));
	uint8_t *buf = malloc(q->cs);
	unsigned n = 0;
	int r = 0;

	if (!v || !buf) {
		r = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < q->nbm; i++) {
		struct qcow2_bm *e = &q->bm[i];
		uint64_t db;
		struct dbm *b;

		e->ours = false;
		if (!e->usable) {
			log_warn("qcow2 image %s: bitmap '%.80s' is kept but not used: %s", q->path,
				 e->shown, why_kept(e));
			continue;
		}
		if ((r = dbm_new(e->name, q->size, 1u << e->gran_bits, &b)) < 0)
			goto fail;
		v[n++] = b;
		b->persistent = true;
		atomic_store(&b->enabled, (e->flags & BM_FLAG_AUTO) != 0);
		db = data_bytes(q->size, e->gran_bits);
		if (e->recovered)
			log_warn("qcow2 image %s: bitmap '%s' was not stored when vblkd last stopped "
				 "(a crash?): taken as written ahead, it covers every write since, by "
				 "whole regions of %llu KiB", q->path, e->shown,
				 q->wal_ext_bits < 63 ? (1ull << q->wal_ext_bits) >> 10 : 0ull);
		for (uint32_t c = 0; c < e->table_size; c++) {
			uint64_t t = e->table[c], off = t & QCOW2_OFFSET_MASK;
			uint64_t len = MIN(q->cs, db - (uint64_t)c * q->cs);

			if (off) {
				if ((r = sys_pread_full(q->mfd, buf, len, off)) < 0) {
					snprintf(err, errlen, "cannot read bitmap '%s' of qcow2 image "
						 "%s: %s", e->shown, q->path, strerror(-r));
					goto out;
				}
			} else {
				memset(buf, (t & 1) ? 0xff : 0, len);
			}
			bytes_to_words(b, buf, (uint64_t)c * q->cs, len);
		}
	}
	free(buf);
	*out = v;
	*nout = n;
	/* The caller has what the image has: the next claim compares with
	 * this. */
	q->bm_changed = false;
	return 0;
fail:
	snprintf(err, errlen, "out of memory for the bitmaps of qcow2 image %s", q->path);
out:
	for (unsigned i = 0; i < n; i++)
		dbm_free(v[i]);
	free(v);
	free(buf);
	return r;
}

void qcow2_bm_taken(struct qcow2 *q, const char *name)
{
	for (uint32_t i = 0; i < q->nbm; i++)
		if (!strcmp(q->bm[i].name, name))
			q->bm[i].ours = true;
}

/* ---- In use --------------------------------------------------------- */

int qcow2_bm_mark_in_use(struct qcow2 *q)
{
	bool any = false;
	uint8_t *d;
	int r;

	if (!q->bm_valid || !q->nbm)
		return 0;
	d = malloc(q->bm_dir_len);
	if (!d)
		return -ENOMEM;
	memcpy(d, q->bm_dir, q->bm_dir_len);
	for (uint32_t i = 0; i < q->nbm; i++) {
		struct qcow2_bm *e = &q->bm[i];

		/* Ours change in memory from here; another auto bitmap would
		 * miss our writes: both untrusted in the file until stored. */
		if ((e->flags & BM_FLAG_IN_USE) || !(e->ours || (e->flags & BM_FLAG_AUTO)))
			continue;
		if (!e->ours)
			log_warn("qcow2 image %s: bitmap '%s' is not tracked by vblkd (%s): marked "
				 "in use, as it will miss the writes from now on", q->path, e->shown,
				 e->type != BM_TYPE_DIRTY ? "not a dirty bitmap" :
				 !dbm_name_ok(e->name) ? "a name vblkd does not take" :
				 "a bitmap of this name exists already");
		e->flags |= BM_FLAG_IN_USE;
		be32_put(d + e->dir_pos + 12, e->flags);
		any = true;
	}
	if (!any) {
		free(d);
		return 0;
	}
	r = qcow2_meta_write(q, d, q->bm_dir_len, q->bm_dir_off, Q2M_BITMAPS);
	if (r == 0)
		r = qcow2_sync(q);
	free(q->bm_dir);
	q->bm_dir = d;
	return r;
}

/* ---- Storing -------------------------------------------------------- */

/* The header's extensions: the bitmaps extension as bm (24 bytes) or
 * none, ours as wal (wlen bytes) or none, autoclear bits 0 and 63 set or
 * cleared with them (qcow2_header_rewrite). */
static int header_set_ext(struct qcow2 *q, const uint8_t *bm, const uint8_t *wal, uint32_t wlen)
{
	static const uint32_t drop[] = { BM_EXT_TYPE, WAL_EXT_TYPE };
	size_t len = (bm ? 8 + BM_EXT_LEN : 0) + (wal ? 8 + ((wlen + 7ull) & ~7ull) : 0), w = 0;
	uint8_t *x = calloc(1, len ? len : 1);
	uint64_t ac = (q->autoclear & ~(QCOW2_AUTOCLEAR_BITMAPS | QCOW2_AUTOCLEAR_VBLK_WAL)) |
		      (bm ? QCOW2_AUTOCLEAR_BITMAPS : 0) | (wal ? QCOW2_AUTOCLEAR_VBLK_WAL : 0);
	int r;

	if (q->version < 3)
		return -EOPNOTSUPP;
	if (!x)
		return -ENOMEM;
	if (bm) {
		be32_put(x, BM_EXT_TYPE);
		be32_put(x + 4, BM_EXT_LEN);
		memcpy(x + 8, bm, BM_EXT_LEN);
		w = 8 + BM_EXT_LEN;
	}
	if (wal) {
		be32_put(x + w, WAL_EXT_TYPE);
		be32_put(x + w + 4, wlen);
		memcpy(x + w + 8, wal, wlen);
	}
	r = qcow2_header_rewrite(q, drop, 2, x, len, true, ac);
	free(x);
	return r;
}

/* Words of b as bitmap data bytes [boff, boff + n) (see bytes_to_words). */
static bool words_to_bytes(const struct dbm *b, uint8_t *dst, uint64_t boff, uint64_t n)
{
	bool any = false;

	for (uint64_t k = 0; k < n; k++) {
		uint64_t byte = boff + k;
		uint64_t w = atomic_load_explicit(&b->words[byte / 8], memory_order_relaxed);

		dst[k] = (uint8_t)(w >> (8 * (byte % 8)));
		any |= dst[k] != 0;
	}
	return any;
}

/* One bitmap's data and table into new clusters: the table's offset in
 * *toff, its entries in *tsize, its data clusters' offsets in data[]
 * (when not NULL: then every cluster is allocated, clean ones too, for
 * the write-ahead to set bits in).  Refcounts not yet durable. */
static int store_one(struct qcow2 *q, const struct dbm *b, uint8_t *buf, uint64_t *toff,
		     uint32_t *tsize, uint64_t *data)
{
	uint64_t db = data_bytes(b->size, b->gran_bits), nt = div_up(db, q->cs);
	uint64_t tbytes = nt * 8, tc = div_up(tbytes, q->cs);
	uint8_t *t;
	int r = 0;

	if (!nt)
		return -EINVAL;
	t = calloc(1, tc * q->cs);
	if (!t)
		return -ENOMEM;
	for (uint64_t c = 0; c < nt; c++) {
		uint64_t len = MIN(q->cs, db - c * q->cs), off;

		memset(buf, 0, q->cs);
		if (!words_to_bytes(b, buf, c * q->cs, len) && !data)
			continue;	/* all clean: no cluster, reads as zeroes */
		off = qcow2_alloc(q, &r);
		if (!off)
			goto out;
		if ((r = qcow2_meta_add(&q->meta, off >> q->cluster_bits, Q2M_BITMAP)) < 0 ||
		    (r = qcow2_meta_write(q, buf, q->cs, off, Q2M_BITMAP)) < 0)
			goto out;
		be64_put(t + 8 * c, off);
		if (data)
			data[c] = off;
	}
	*toff = qcow2_alloc_run(q, tc, &r);
	if (!*toff)
		goto out;
	for (uint64_t c = 0; c < tc; c++)
		if ((r = qcow2_meta_add(&q->meta, (*toff >> q->cluster_bits) + c, Q2M_BITMAP)) < 0)
			goto out;
	r = qcow2_meta_write(q, t, tc * q->cs, *toff, Q2M_BITMAP);
	*tsize = (uint32_t)nt;
out:
	free(t);
	return r;
}

static void free_clusters(struct qcow2 *q, uint64_t off, uint64_t len)
{
	for (uint64_t c = off >> q->cluster_bits; len && c <= (off + len - 1) >> q->cluster_bits;
	     c++) {
		qcow2_meta_del(&q->meta, c);
		qcow2_free_later(q, c << q->cluster_bits);
	}
}

static bool in_list(struct dbm *const *b, unsigned n, const char *name)
{
	for (unsigned i = 0; i < n; i++)
		if (!strcmp(b[i]->name, name))
			return true;
	return false;
}

/* The write-ahead's region size for the held bitmaps: 1/WAL_REGIONS of
 * the disk, at least 1 MiB and 8 chunks of the coarsest bitmap (a region
 * is then whole bytes of every bitmap's data), a power of two. */
static uint32_t wal_region_bits(const struct qcow2 *q, struct dbm *const *b, unsigned n)
{
	uint32_t bits = 20;

	while (bits < 62 && (1ull << bits) * WAL_REGIONS < q->size)
		bits++;
	for (unsigned i = 0; i < n; i++)
		bits = MAX(bits, b[i]->gran_bits + 3);
	return bits;
}

/* Whether cluster 0 has room for the bitmaps extension and, with wal,
 * ours naming b[0..n) (wal_ext), as qcow2_header_rewrite lays them out. */
static bool header_room(const struct qcow2 *q, struct dbm *const *b, unsigned n, bool wal)
{
	uint64_t wlen = 8, need = q->hdr_other + 8 + BM_EXT_LEN + 8;

	for (unsigned i = 0; wal && i < n; i++)
		wlen += 1 + strlen(b[i]->name);
	if (wal)
		need += 8 + ((wlen + 7) & ~7ull);
	return need <= q->cs;
}

/* Our extension's body for the held bitmaps (wal_scan reads it). */
static uint8_t *wal_ext(struct dbm *const *b, unsigned n, uint32_t bits, uint32_t *len)
{
	uint32_t at = 8;
	uint8_t *p = malloc(8 + (size_t)n * (1 + DBM_NAME_MAX));

	if (!p)
		return NULL;
	be32_put(p, bits);
	be32_put(p + 4, n);
	for (unsigned i = 0; i < n; i++) {
		size_t l = strlen(b[i]->name);

		p[at] = (uint8_t)l;
		memcpy(p + at + 1, b[i]->name, l);
		at += 1 + (uint32_t)l;
	}
	*len = at;
	return p;
}

/* What a store of b[0..n) (with one more, name at 2^gran_bits, when name
 * is not NULL) for a disk of size bytes would write, against the limits
 * QEMU checks when it adds or loads a bitmap (check_constraints_on_bitmap,
 * qcow2_co_can_store_new_dirty_bitmap) and parse_entry and qcow2_bm_read
 * check when we read it back: a directory past them is refused by both.
 * Nothing allocated.  0, or -EINVAL / -EFBIG with one line in err. */
static int check_limits(const struct qcow2 *q, struct dbm *const *b, unsigned n,
			const char *name, unsigned gran_bits, uint64_t size, char *err,
			size_t errlen)
{
	uint64_t count = 0, dlen = 0, tables = 0, all = 0;

	for (uint32_t i = 0; i < q->nbm; i++) {
		const struct qcow2_bm *e = &q->bm[i];
		/* Held but not stored now (not grown yet): carried on too. */
		bool unstored = e->ours && in_list(q->held, q->nheld, e->name);

		if ((e->ours && !unstored) || in_list(b, n, e->name) ||
		    (name && !strcmp(name, e->name)))
			continue;	/* not carried on */
		count++;
		dlen += e->ent_len;
		tables += e->table_size;
		if (e->usable)
			all += data_bytes(q->size, e->gran_bits);
	}
	for (unsigned i = 0; i < n + (name != NULL); i++) {
		const char *nm = i < n ? b[i]->name : name;
		unsigned gb = i < n ? b[i]->gran_bits : gran_bits;
		uint64_t db = data_bytes(size, gb), nt = div_up(db, q->cs);

		if (db > BM_MAX_PHYS || nt > BM_MAX_TABLE) {
			snprintf(err, errlen, "bitmap '%s' at %u-byte granularity would take %llu MiB "
				 "for a %llu-byte disk, more than the %llu MiB QEMU allows one "
				 "persistent bitmap: use a larger granularity", nm, 1u << gb,
				 (unsigned long long)(db >> 20), (unsigned long long)size,
				 BM_MAX_PHYS >> 20);
			return -EFBIG;
		}
		count++;
		dlen += (BM_ENT_FIXED + strlen(nm) + 7) & ~7ull;
		tables += nt;
		all += db;
	}
	if (count > BM_MAX_COUNT || dlen > QCOW2_MAX_BITMAP_DIR_BYTES) {
		snprintf(err, errlen, "qcow2 image %s: %s (%u bitmaps, %u MiB of directory at "
			 "most, as QEMU allows)", q->path, count > BM_MAX_COUNT ?
			 "the maximum number of persistent bitmaps is reached" :
			 "not enough space in the bitmap directory", BM_MAX_COUNT,
			 QCOW2_MAX_BITMAP_DIR_BYTES >> 20);
		return -EINVAL;
	}
	if (tables > BM_MAX_TABLES_ALL || all > BM_MAX_PHYS_ALL) {
		snprintf(err, errlen, "qcow2 image %s: its persistent bitmaps would take %s in "
			 "all, more than vblkd reads back (%u, %llu MiB): use a larger granularity",
			 q->path, tables > BM_MAX_TABLES_ALL ? "too many table entries" :
			 "too much memory", BM_MAX_TABLES_ALL, BM_MAX_PHYS_ALL >> 20);
		return -EFBIG;
	}
	return 0;
}

int qcow2_bm_fit(struct qcow2 *q, const char *name, uint32_t gran, uint64_t size, char *err,
		 size_t errlen)
{
	/* A resize: a bitmap we do not hold keeps a table sized for the old
	 * disk, and QEMU then refuses the image.  QEMU refuses such a resize
	 * too (qcow2_truncate_bitmaps_check: "Cannot resize qcow2 with
	 * persistent bitmaps that were not loaded into memory"). */
	for (uint32_t i = 0; !name && size != q->size && i < q->nbm; i++) {
		const struct qcow2_bm *e = &q->bm[i];

		if (e->ours || in_list(q->held, q->nheld, e->name))
			continue;
		snprintf(err, errlen, "qcow2 image %s cannot be resized: its bitmap '%.80s' is "
			 "kept but not tracked by vblkd (vblkctl bitmap list says why), and would "
			 "not fit the new size, as QEMU refuses too: remove it with qemu-img "
			 "bitmap --remove first", q->path, e->shown);
		return -EOPNOTSUPP;
	}
	return check_limits(q, q->held, q->nheld, name, name ? (unsigned)__builtin_ctz(gran) : 0,
			    size, err, errlen);
}

int qcow2_bm_store(struct qcow2 *q, struct dbm *const *b, unsigned n, bool changed, bool wal,
		   char *err, size_t errlen)
{
	uint64_t dlen = 0, doff = 0, dc = 0;
	uint32_t count = 0, wlen = 0, wbits = 0;
	uint8_t *d = NULL, *buf = NULL, *wext = NULL, ext[BM_EXT_LEN] = { 0 };
	bool *keep = NULL, said = false, wal_fits = true;
	struct qcow2_wal_bm *wbm = NULL;
	unsigned nwbm = 0;
	const char *doing = "storing its bitmaps";
	int r = 0;

	/* Nothing written, no bitmap changed: the image's copies are right
	 * (an image a VM only reads is not changed). */
	if (!q->rw || q->stale || (!changed && !q->write_begun))
		return 0;
	if (q->corrupt || q->broken) {
		snprintf(err, errlen, "qcow2 image %s: its persistent bitmaps were not stored (the "
			 "image is corrupt or a metadata write failed)", q->path);
		return -EIO;
	}
	/* Nothing of ours, nothing of ours in the file: nothing to write. */
	if (!n && !q->bm_changed && !q->wal_on) {
		bool ours = false;

		for (uint32_t i = 0; i < q->nbm; i++)
			ours |= q->bm[i].ours;
		if (!ours)
			return 0;
	}
	if (n && q->version < 3) {
		snprintf(err, errlen, "qcow2 image %s is version 2, which has no bitmaps: its "
			 "persistent bitmaps were not stored", q->path);
		return -EOPNOTSUPP;
	}
	/* A bitmap not (yet) grown with the disk is not stored: its table
	 * would not fit the image's size (disk_bitmaps_grow failed, or runs
	 * next and holds the grown ones: stored then). */
	for (unsigned i = 0; i < n; i++)
		if (b[i]->size != q->size) {
			struct dbm **v = malloc(n * sizeof(*v));
			unsigned k = 0;

			if (!v)
				return -ENOMEM;
			for (unsigned j = 0; j < n; j++)
				if (b[j]->size == q->size)
					v[k++] = b[j];
			r = qcow2_bm_store(q, v, k, changed, wal, err, errlen);
			free(v);
			return r;
		}
	/* Past QEMU's limits (or ours at read-back) the new directory would
	 * refuse the image: found here, before anything is allocated, the
	 * image as it was (bitmap add and resize refuse it first). */
	if ((r = check_limits(q, b, n, NULL, 0, q->size, err, errlen)) < 0)
		return r;
	/* Cluster 0 full: found before anything is allocated (a store
	 * failing after its allocations leaked them at every retry). */
	if (!header_room(q, b, n, false)) {
		snprintf(err, errlen, "qcow2 image %s: its first cluster has no room for the "
			 "bitmaps extension: its persistent bitmaps were not stored", q->path);
		return -ENOSPC;
	}
	/* Ours does not fit (many long names in a small cluster; or more
	 * than wal_scan takes): the held bitmaps are stored in use without
	 * it, as QEMU keeps its own (a crash loses them: the next backup is
	 * a full one), rather than every write failing on a header that
	 * cannot be written. */
	if (wal && n && (n > WAL_MAX_NAMES || !header_room(q, b, n, true))) {
		if (!q->wal_warned)
			log_warn("qcow2 image %s: the names of its %u persistent bitmaps do not fit "
				 "its first cluster for vblkd's write-ahead: they are kept in use, "
				 "and a crash loses them, as QEMU's (fewer or shorter names, or "
				 "larger clusters, keep them across a crash)", q->path, n);
		q->wal_warned = true;
		wal_fits = false;
	}
	keep = calloc(q->nbm ? q->nbm : 1, sizeof(*keep));
	buf = malloc(q->cs);
	wbm = calloc(n ? n : 1, sizeof(*wbm));
	if (!keep || !buf || !wbm) {
		r = -ENOMEM;
		goto out;
	}
	/* Carried on as they are: what is not ours, unless one of ours took
	 * its name (made again here); and one we hold but do not store now
	 * (not yet grown with the disk): its entry stays, in use, never
	 * dropped in silence. */
	for (uint32_t i = 0; i < q->nbm; i++) {
		bool unstored = q->bm[i].ours && in_list(q->held, q->nheld, q->bm[i].name);

		keep[i] = (!q->bm[i].ours || unstored) && !in_list(b, n, q->bm[i].name);
		if (keep[i] && unstored)
			log_warn("qcow2 image %s: bitmap '%s' is not stored (it does not cover the "
				 "disk's size): kept in the image, marked in use", q->path,
				 q->bm[i].shown);
		if (!q->bm[i].ours && !keep[i])
			log_warn("qcow2 image %s: bitmap '%s' of the image is replaced by vblkd's "
				 "bitmap of that name", q->path, q->bm[i].name);
		if (keep[i]) {
			dlen += q->bm[i].ent_len;
			count++;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		dlen += (BM_ENT_FIXED + strlen(b[i]->name) + 7) & ~7ull;
		count++;
	}
	d = calloc(1, dlen ? dlen : 1);
	if (!d) {
		r = -ENOMEM;
		goto out;
	}
	/* The directory: kept entries as they were (an auto one in use from
	 * here if we are about to write: it would miss our writes), then
	 * ours, each with its data and table written first. */
	{
		uint64_t w = 0;

		for (uint32_t i = 0; i < q->nbm; i++)
			if (keep[i]) {
				memcpy(d + w, q->bm_dir + q->bm[i].dir_pos, q->bm[i].ent_len);
				if ((q->bm[i].ours || (wal && (q->bm[i].flags & BM_FLAG_AUTO))) &&
				    !(q->bm[i].flags & BM_FLAG_IN_USE))
					be32_put(d + w + 12, q->bm[i].flags | BM_FLAG_IN_USE);
				w += q->bm[i].ent_len;
			}
		for (unsigned i = 0; i < n; i++) {
			uint64_t toff = 0, *data = NULL;
			uint32_t tsize = 0, flags = atomic_load(&b[i]->enabled) ? BM_FLAG_AUTO : 0;
			size_t nl = strlen(b[i]->name);

			if (wal) {
				wbm[nwbm].ndata = div_up(data_bytes(b[i]->size, b[i]->gran_bits), q->cs);
				data = calloc(wbm[nwbm].ndata ? wbm[nwbm].ndata : 1, sizeof(*data));
				if (!data) {
					r = -ENOMEM;
					goto out;
				}
				wbm[nwbm].data = data;
				wbm[nwbm].gran_bits = b[i]->gran_bits;
				wbm[nwbm].nbits = b[i]->nbits;
				/* Only an enabled one gains bits by writes. */
				if (flags & BM_FLAG_AUTO)
					nwbm++;
				else
					wbm[nwbm].data = NULL;
				flags |= BM_FLAG_IN_USE;
			}
			r = store_one(q, b[i], buf, &toff, &tsize, data);
			if (!(flags & BM_FLAG_AUTO))
				free(data);
			if (r < 0) {
				doing = "writing a bitmap's data";
				goto out;
			}
			be64_put(d + w, toff);
			be32_put(d + w + 8, tsize);
			be32_put(d + w + 12, flags);
			d[w + 16] = BM_TYPE_DIRTY;
			d[w + 17] = (uint8_t)b[i]->gran_bits;
			d[w + 18] = (uint8_t)(nl >> 8);
			d[w + 19] = (uint8_t)nl;
			memcpy(d + w + BM_ENT_FIXED, b[i]->name, nl);
			w += (BM_ENT_FIXED + nl + 7) & ~7ull;
		}
	}
	/* Data, tables and their refcounts durable before anything points
	 * at them. */
	if ((r = qcow2_flush_refcounts(q)) < 0 || (r = qcow2_sync(q)) < 0) {
		doing = "writing a bitmap's refcounts";
		goto out;
	}
	if (count) {
		dc = div_up(dlen, q->cs);
		doff = qcow2_alloc_run(q, dc, &r);
		if (!doff)
			goto out;
		for (uint64_t c = 0; c < dc; c++)
			if ((r = qcow2_meta_add(&q->meta, (doff >> q->cluster_bits) + c,
						Q2M_BITMAPS)) < 0)
				goto out;
		if ((r = qcow2_meta_write(q, d, dlen, doff, Q2M_BITMAPS)) < 0 ||
		    (r = qcow2_flush_refcounts(q)) < 0 || (r = qcow2_sync(q)) < 0) {
			doing = "writing the bitmap directory";
			goto out;
		}
		be32_put(ext, count);
		be64_put(ext + 8, dlen);
		be64_put(ext + 16, doff);
	}
	if (wal && n && wal_fits) {
		wbits = wal_region_bits(q, b, n);
		if (!(wext = wal_ext(b, n, wbits, &wlen))) {
			r = -ENOMEM;
			goto out;
		}
	}
	/* The switch: the header names the new directory (or none). */
	if ((r = header_set_ext(q, count ? ext : NULL, wext, wlen)) < 0) {
		doing = r == -ENOSPC ? "adding the bitmaps extension (the first cluster is full)" :
			"writing the header's bitmaps extension";
		goto out;
	}
	/* The old directory, and the tables and data of what was replaced or
	 * dropped, go once the tables are durable (qcow2_flush). */
	if (q->bm_dir_len)
		free_clusters(q, q->bm_dir_off, q->bm_dir_len);
	for (uint32_t i = 0; i < q->nbm; i++) {
		const struct qcow2_bm *e = &q->bm[i];

		if (keep[i])
			continue;
		free_clusters(q, e->table_off, (uint64_t)e->table_size * 8);
		for (uint32_t j = 0; j < e->table_size; j++)
			if (e->table[j] & QCOW2_OFFSET_MASK)
				free_clusters(q, e->table[j] & QCOW2_OFFSET_MASK, q->cs);
	}
	/* What the file says now; ours are what was just stored.  The old
	 * directory stays in q->bm until the new one is read (qcow2_bm_read
	 * replaces it): a failure from here leaves the image broken (a failed
	 * flush makes it so), never a store retried against a directory the
	 * header no longer names (it would free the old clusters again and
	 * drop the bitmaps carried on). */
	wal_off(q);
	if ((r = qcow2_flush(q)) < 0) {
		doing = "freeing the old bitmaps";
		q->broken = true;
		goto out;
	}
	if ((r = qcow2_bm_read(q, err, errlen)) < 0) {
		said = true;
		q->broken = true;
		log_err("qcow2 image %s: its new bitmap directory could not be read back: no "
			"more writes to this image", q->path);
		goto out;
	}
	for (unsigned i = 0; i < n; i++)
		qcow2_bm_taken(q, b[i]->name);
	q->bm_changed = false;
	if (wext) {
		/* From here each region's first write sets its bits ahead. */
		q->wal_bits = wbits;
		q->wal_nregions = div_up(q->size, 1ull << wbits);
		q->wal_done = calloc(div_up(q->wal_nregions, 64), 8);
		q->wal_pend = calloc(div_up(q->wal_nregions, 64), 8);
		if (!q->wal_done || !q->wal_pend) {
			r = -ENOMEM;
			goto out;
		}
		q->wal_bm = wbm;
		q->wal_nbm = nwbm;
		wbm = NULL;
		nwbm = 0;
		q->wal_on = true;
	}
	/* Clean: the next change starts over (in use, written ahead). */
	q->write_begun = wal;
	if (n && !wal)
		log_info("qcow2 image %s: %u persistent bitmap%s stored", q->path, n,
			 n == 1 ? "" : "s");
out:
	if (r < 0 && !said)
		snprintf(err, errlen, "qcow2 image %s: %s failed: %s; the bitmaps stay marked in "
			 "use in the image", q->path, doing, strerror(-r));
	for (unsigned i = 0; wbm && i < n; i++)
		free(wbm[i].data);
	free(wbm);
	free(wext);
	free(d);
	free(buf);
	free(keep);
	return r;
}

int qcow2_bm_hold(struct qcow2 *q, struct dbm *const *b, unsigned n, bool force)
{
	struct dbm **v = NULL;
	char err[256];
	int r;

	if (n && !(v = malloc(n * sizeof(*v))))
		return -ENOMEM;
	if (n)
		memcpy(v, b, n * sizeof(*v));
	free(q->held);
	q->held = v;
	q->nheld = n;
	if (!force || !q->rw || q->stale || q->corrupt || q->broken)
		return 0;
	/* Not yet written: the first change now.  Written ahead already:
	 * again, for the held set as it is now. */
	if (!q->write_begun)
		return qcow2_begin_write(q);
	if (!n && !q->wal_on)
		return 0;
	r = qcow2_bm_store(q, q->held, q->nheld, true, true, err, sizeof(err));
	if (r < 0)
		log_err("%s", err);
	return r;
}

int qcow2_bm_wal_cover_slow(struct qcow2 *q, uint64_t off, uint64_t len)
{
	uint64_t r0 = off >> q->wal_bits, r1 = (off + len - 1) >> q->wal_bits;
	uint8_t *ones = NULL;
	int r = 0;

	if (q->corrupt || q->broken)
		return -EIO;
	r1 = MIN(r1, q->wal_nregions - 1);
	for (uint64_t g = r0; g <= r1; g++) {
		if (q->wal_pend[g / 64] & (1ull << (g % 64)))
			continue;	/* written, its sync is at the kick */
		if (q->wal_done[g / 64] & (1ull << (g % 64)))
			continue;
		for (unsigned i = 0; i < q->wal_nbm; i++) {
			const struct qcow2_wal_bm *w = &q->wal_bm[i];
			/* The region's bits: whole bytes (wal_region_bits), the
			 * last one clipped to the bitmap's end. */
			uint64_t b0 = (g << q->wal_bits) >> w->gran_bits;
			uint64_t b1 = MIN(((g + 1) << q->wal_bits) >> w->gran_bits, w->nbits);
			uint64_t y0 = b0 / 8, y1 = div_up(b1, 8);

			if (b0 >= b1)
				continue;
			if (!ones && !(ones = malloc(q->cs))) {
				r = -ENOMEM;
				goto out;
			}
			while (y0 < y1) {
				uint64_t c = y0 / q->cs, in = y0 % q->cs;
				uint64_t n = MIN(y1 - y0, q->cs - in);

				memset(ones, 0xff, n);
				if (y0 + n == y1 && b1 % 8)
					ones[n - 1] = (uint8_t)((1u << (b1 % 8)) - 1);
				if (c >= w->ndata) {
					r = -EIO;
					goto out;
				}
				if ((r = qcow2_meta_write(q, ones, n, w->data[c] + in, Q2M_BITMAP)) < 0)
					goto out;
				y0 += n;
			}
		}
		q->wal_pend[g / 64] |= 1ull << (g % 64);
		q->wal_npend++;
	}
	/* Covered once the sync of the pending regions is done. */
	for (uint64_t g = r0; g <= r1; g++)
		if (!(q->wal_done[g / 64] & (1ull << (g % 64)))) {
			r = 1;
			break;
		}
out:
	free(ones);
	return r;
}

int qcow2_bm_wal_sync(struct qcow2 *q)
{
	int r;

	if (!q->wal_npend)
		return 0;
	/* Durable before the writes they cover go to the disk. */
	if ((r = qcow2_sync(q)) < 0)
		return r;
	for (uint64_t w = 0; w < div_up(q->wal_nregions, 64); w++) {
		q->wal_writes += (uint64_t)__builtin_popcountll(q->wal_pend[w]);
		q->wal_done[w] |= q->wal_pend[w];
		q->wal_pend[w] = 0;
	}
	q->wal_npend = 0;
	return 0;
}
