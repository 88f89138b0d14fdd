/*
 * Where a qcow2 image's metadata lives, cluster by cluster (issue 44):
 * what QEMU's overlap check guards (block/qcow2-refcount.c,
 * qcow2_check_metadata_overlap, its default "cached" mode), known before
 * any write.  Every host cluster that holds the header, the active L1
 * table, an L2 table the active L1 points at, the refcount table, a
 * refcount block, the snapshot table, a snapshot's L1 table or the bitmap
 * directory is in one hash set, with its kind.  A data write, a new
 * cluster and a table written back are checked against it: metadata is
 * never written over metadata, nor guest data over either.  Two kinds on
 * one cluster, found while the set is built, mean the image is corrupt.
 *
 * Cost: one lookup per cluster a request maps (open addressing, linear
 * probing, multiplicative hash: a few ns); memory: 9 bytes per slot, at
 * most half the slots used, one entry per metadata cluster.
 *
 * Owned like the tables: the iothread serving the image, or the main
 * thread while none runs.
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/qcow2.h"
#include "util/compiler.h"
#include "util/sys.h"

#define EMPTY UINT64_MAX

static const char *const kind_names[] = {
	[Q2M_NONE] = "nothing",
	[Q2M_HEADER] = "the header",
	[Q2M_L1] = "the active L1 table",
	[Q2M_L2] = "an L2 table",
	[Q2M_RT] = "the refcount table",
	[Q2M_RB] = "a refcount block",
	[Q2M_SNAPSHOTS] = "the snapshot table",
	[Q2M_SNAP_L1] = "a snapshot's L1 table",
	[Q2M_BITMAPS] = "the bitmap directory",
	[Q2M_BITMAP] = "a bitmap's table or data",
};
_Static_assert(ARRAY_SIZE(kind_names) == Q2M_KINDS, "a name for every kind");

const char *qcow2_meta_name(unsigned kind)
{
	return kind < Q2M_KINDS ? kind_names[kind] : "?";
}

void qcow2_meta_free(struct qcow2_meta *m)
{
	free(m->key);
	free(m->kind);
	*m = (struct qcow2_meta){ 0 };
}

static int resize(struct qcow2_meta *m, unsigned bits)
{
	struct qcow2_meta n = { .bits = bits, .cap = (size_t)1 << bits };

	n.key = malloc(n.cap * sizeof(*n.key));
	n.kind = malloc(n.cap);
	if (!n.key || !n.kind) {
		free(n.key);
		free(n.kind);
		return -ENOMEM;
	}
	memset(n.key, 0xff, n.cap * sizeof(*n.key));
	for (size_t i = 0; i < m->cap; i++) {
		size_t s;

		if (m->key[i] == EMPTY)
			continue;
		for (s = qcow2_meta_slot(&n, m->key[i]); n.key[s] != EMPTY; s = (s + 1) & (n.cap - 1))
			;
		n.key[s] = m->key[i];
		n.kind[s] = m->kind[i];
		n.n++;
	}
	qcow2_meta_free(m);
	*m = n;
	return 0;
}

void qcow2_meta_clear(struct qcow2_meta *m)
{
	if (m->key)
		memset(m->key, 0xff, m->cap * sizeof(*m->key));
	m->n = 0;
}

int qcow2_meta_add(struct qcow2_meta *m, uint64_t c, unsigned kind)
{
	size_t s;
	int r;

	if ((m->n + 1) * 2 > m->cap && (r = resize(m, m->bits ? m->bits + 1 : 8)) < 0)
		return r;
	for (s = qcow2_meta_slot(m, c); m->key[s] != EMPTY; s = (s + 1) & (m->cap - 1))
		if (m->key[s] == c)
			return m->kind[s];
	m->key[s] = c;
	m->kind[s] = (uint8_t)kind;
	m->n++;
	return 0;
}

void qcow2_meta_del(struct qcow2_meta *m, uint64_t c)
{
	size_t s, j;

	if (!m->n)
		return;
	for (s = qcow2_meta_slot(m, c); m->key[s] != c; s = (s + 1) & (m->cap - 1))
		if (m->key[s] == EMPTY)
			return;
	/* Backward-shift deletion: later entries of the probe run move up
	 * into the hole, so no lookup stops early at it. */
	for (j = (s + 1) & (m->cap - 1); m->key[j] != EMPTY; j = (j + 1) & (m->cap - 1)) {
		size_t home = qcow2_meta_slot(m, m->key[j]);

		/* j's entry may move to s when s lies on its probe run, i.e.
		 * cyclically in [home, j). */
		if (((j - home) & (m->cap - 1)) >= ((j - s) & (m->cap - 1))) {
			m->key[s] = m->key[j];
			m->kind[s] = m->kind[j];
			s = j;
		}
	}
	m->key[s] = EMPTY;
	m->n--;
}

int qcow2_meta_mismatch(const struct qcow2 *q, uint64_t off, uint64_t len, unsigned want)
{
	uint64_t first = off >> q->cluster_bits, last;

	if (!len)
		return -1;
	last = (off + len - 1) >> q->cluster_bits;
	for (uint64_t c = first; c <= last; c++) {
		unsigned k = qcow2_meta_get(&q->meta, c);

		if (k != want)
			return (int)k;
	}
	return -1;
}

/* ---- Built from the tables ------------------------------------------- */

/* [off, off+len) as kind; a cluster that is metadata of another kind
 * already (or of the same kind twice, for one-per-cluster tables) makes
 * the image corrupt.  0 or -ENOMEM. */
static int add_range(struct qcow2 *q, uint64_t off, uint64_t len, unsigned kind, bool once)
{
	for (uint64_t c = off >> q->cluster_bits; len && c <= (off + len - 1) >> q->cluster_bits;
	     c++) {
		int r = qcow2_meta_add(&q->meta, c, kind);
		char what[160];

		if (r < 0)
			return r;
		if (r == 0 || (r == (int)kind && !once) || q->corrupt)
			continue;
		snprintf(what, sizeof(what), "%s and %s share a cluster", qcow2_meta_name(kind),
			 qcow2_meta_name((unsigned)r));
		qcow2_corrupt(q, what, QCOW2_NO_GUEST, c << q->cluster_bits);
	}
	return 0;
}

/* qcow2.txt, "Snapshot table": each entry 40 bytes, then extra data, the
 * id and the name, padded to 8; each snapshot's own L1 table.  Checked as
 * QEMU's qcow2_read_snapshots checks them (it refuses such an image; we
 * find it when the tables become ours, and mark the image corrupt). */
static int add_snapshots(struct qcow2 *q)
{
	uint64_t off = q->snapshots_off, end = MAX(q->file_size, q->next_free);
	uint8_t h[40];
	int r;

	for (uint32_t i = 0; i < q->nb_snapshots; i++) {
		uint64_t l1, len;
		uint32_t l1_size;

		if (off - q->snapshots_off > QCOW2_MAX_SNAPSHOTS_BYTES || off + sizeof(h) > end) {
			qcow2_corrupt(q, "the snapshot table runs past the end of the file or its "
				      "64 MiB", QCOW2_NO_GUEST, q->snapshots_off);
			return 0;
		}
		if ((r = sys_pread_full(q->mfd, h, sizeof(h), off)) < 0)
			return r;
		l1 = be64_at(h);
		l1_size = be32_at(h + 8);
		len = 40 + (uint64_t)be32_at(h + 36) + ((uint64_t)h[12] << 8 | h[13]) +
		      ((uint64_t)h[14] << 8 | h[15]);
		off += (len + 7) & ~7ull;
		if (l1 % q->cs || (uint64_t)l1_size * 8 > QCOW2_MAX_L1_BYTES || l1 < q->cs ||
		    l1 + (uint64_t)l1_size * 8 > end) {
			qcow2_corrupt(q, "a snapshot's L1 table lies outside the file or is too big",
				      QCOW2_NO_GUEST, l1);
			/* What follows a bad entry is no table either. */
			return 0;
		}
		if ((r = add_range(q, l1, (uint64_t)l1_size * 8, Q2M_SNAP_L1, true)) < 0)
			return r;
	}
	return add_range(q, q->snapshots_off, off - q->snapshots_off, Q2M_SNAPSHOTS, true);
}

static int add_bitmap(struct qcow2 *q, uint64_t off, uint64_t len)
{
	return add_range(q, off, len, Q2M_BITMAP, true);
}

int qcow2_meta_build(struct qcow2 *q)
{
	int r;

	qcow2_meta_clear(&q->meta);
	if ((r = add_range(q, 0, q->cs, Q2M_HEADER, true)) < 0 ||
	    (r = add_range(q, q->l1_off, (uint64_t)q->l1_size * 8, Q2M_L1, true)) < 0 ||
	    (r = add_range(q, q->rt_off, (uint64_t)q->rt_clusters * q->cs, Q2M_RT, true)) < 0)
		return r;
	for (uint64_t i = 0; i < q->rt_entries; i++)
		if (q->rt[i] && (r = add_range(q, q->rt[i], q->cs, Q2M_RB, true)) < 0)
			return r;
	for (uint32_t i = 0; i < q->l1_size; i++) {
		uint64_t o = q->l1[i] & QCOW2_OFFSET_MASK;

		if (o && (r = add_range(q, o, q->cs, Q2M_L2, true)) < 0)
			return r;
	}
	if (q->nb_snapshots && (r = add_snapshots(q)) < 0)
		return r;
	/* qcow2.txt, "Bitmaps extension": the directory, each bitmap's table
	 * and data clusters, as qcow2_bm_read checked and read them (none
	 * when autoclear bit 0 is clear: the extension is not valid then). */
	if (q->bm_valid && q->bm_dir_len &&
	    (r = add_range(q, q->bm_dir_off, q->bm_dir_len, Q2M_BITMAPS, true)) < 0)
		return r;
	return qcow2_bm_meta(q, add_bitmap);
}
