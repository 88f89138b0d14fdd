/*
 * qcow2 inside src/format/ (not a public contract: format.h is).
 * qcow2.c: the header, the tables and their cache, refcounts, allocation
 * and the write-back order.  qcow2_io.c: the disk's engine ops, each
 * guest request mapped onto extents.  Spec: QEMU docs/interop/qcow2.txt.
 *
 * Everything here is owned by the one iothread serving the disk (or by
 * the main thread before it starts and after it stops).
 */
#ifndef VBLK_FMT_QCOW2_H
#define VBLK_FMT_QCOW2_H

#include <endian.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend/bdev.h"
#include "format/format.h"

/* The image's big-endian fields, at any alignment. */
static inline uint64_t be64_at(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return be64toh(v);
}

static inline uint32_t be32_at(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return be32toh(v);
}

static inline void be64_put(uint8_t *p, uint64_t v)
{
	v = htobe64(v);
	memcpy(p, &v, 8);
}

static inline void be32_put(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, 4);
}

static inline uint64_t div_up(uint64_t a, uint64_t b)
{
	return (a + b - 1) / b;
}

/* qcow2.txt, "Header" */
#define QCOW2_MAGIC 0x514649fbu		/* "QFI\xfb" */
#define QCOW2_INCOMPAT_DIRTY     (1ull << 0)
#define QCOW2_INCOMPAT_CORRUPT   (1ull << 1)
#define QCOW2_INCOMPAT_DATA_FILE (1ull << 2)
#define QCOW2_INCOMPAT_COMPRESS  (1ull << 3)
#define QCOW2_INCOMPAT_EXTL2     (1ull << 4)
#define QCOW2_INCOMPAT_KNOWN     0x1full
/* qcow2.txt, "Header extensions" */
#define QCOW2_EXT_BACKING_FMT    0xe2792acau
#define QCOW2_EXT_BITMAPS        0x23852875u
#define QCOW2_AUTOCLEAR_BITMAPS  (1ull << 0)
/* Ours (qcow2_bitmap.c, "Crash"): the vblkd write-ahead extension is
 * valid.  An autoclear bit: a writer that does not know it (QEMU) clears
 * it, and with it what the extension vouches for. */
#define QCOW2_AUTOCLEAR_VBLK_WAL (1ull << 63)

/* qcow2.txt, "Cluster mapping": L1 and L2 entries. */
#define QCOW2_OFLAG_COPIED     (1ull << 63)	/* refcount is exactly one */
#define QCOW2_OFLAG_COMPRESSED (1ull << 62)
#define QCOW2_OFLAG_ZERO       (1ull << 0)	/* v3: reads as zeroes */
#define QCOW2_OFFSET_MASK      0x00fffffffffffe00ull	/* bits 9-55 */
#define QCOW2_L1_RESERVED      0x7f000000000001ffull	/* bits 0-8, 56-62 */
#define QCOW2_L2_RESERVED      0x3f000000000001feull	/* bits 1-8, 56-61 */
#define QCOW2_RT_RESERVED      0x00000000000001ffull	/* bits 0-8 */

/* Limits QEMU has too (qcow2.txt notes; block/qcow2.h). */
#define QCOW2_MAX_L1_BYTES (32u << 20)
#define QCOW2_MAX_RT_BYTES (8u << 20)
#define QCOW2_MAX_CHAIN 16
#define QCOW2_MAX_SNAPSHOTS_BYTES (64u << 20)	/* QCOW_MAX_SNAPSHOTS_SIZE */
#define QCOW2_MAX_BITMAP_DIR_BYTES (64u << 20)	/* QCOW2_MAX_BITMAP_DIRECTORY_SIZE */

/* Where the image's metadata lives, by host cluster (qcow2_meta.c): the
 * kinds of cluster QEMU's overlap check knows. */
enum {
	Q2M_NONE,		/* data, or free */
	Q2M_HEADER,		/* cluster 0: header and extensions */
	Q2M_L1,			/* the active L1 table */
	Q2M_L2,			/* an L2 table (the active L1's, or one a snapshot kept) */
	Q2M_RT,			/* the refcount table */
	Q2M_RB,			/* a refcount block */
	Q2M_SNAPSHOTS,		/* the snapshot table */
	Q2M_SNAP_L1,		/* a snapshot's L1 table */
	Q2M_BITMAPS,		/* the bitmap directory */
	Q2M_BITMAP,		/* a bitmap's table or data (qcow2_bitmap.c) */
	Q2M_KINDS
};

struct qcow2_meta {
	uint64_t *key;		/* host cluster index; all ones: empty slot */
	uint8_t *kind;		/* Q2M_* */
	size_t cap, n;		/* cap: 1 << bits */
	unsigned bits;
};

/* qcow2_meta.c's hash: a slot for cluster c (multiplicative). */
static inline size_t qcow2_meta_slot(const struct qcow2_meta *m, uint64_t c)
{
	return (size_t)((c * 0x9e3779b97f4a7c15ull) >> (64 - m->bits));
}

/* Cluster c's kind (Q2M_NONE if it is not metadata).  Inline: every
 * cluster a request maps asks (qcow2_entry); most probe one empty slot. */
static inline unsigned qcow2_meta_get(const struct qcow2_meta *m, uint64_t c)
{
	if (!m->n)
		return Q2M_NONE;
	for (size_t s = qcow2_meta_slot(m, c);; s = (s + 1) & (m->cap - 1)) {
		if (m->key[s] == c)
			return m->kind[s];
		if (m->key[s] == UINT64_MAX)
			return Q2M_NONE;
	}
}

/* No guest offset to name (qcow2_corrupt). */
#define QCOW2_NO_GUEST UINT64_MAX

/* A cached table: an L2 table or a refcount block, one cluster, kept as
 * it is on disk (big-endian). */
struct qcow2_table {
	uint64_t off;		/* host offset; 0: slot empty */
	uint8_t *buf;
	uint64_t used;		/* LRU clock */
	uint32_t index;		/* L1 or refcount-table index it is for */
	uint32_t dlo, dhi;	/* bytes [dlo, dhi) changed since written */
	bool dirty;
	bool fresh;		/* new or copied: its whole cluster is to be written,
				 * and durable before the L1 points at it */
};

struct qcow2_cache {
	struct qcow2_table *t;
	unsigned n;		/* slots */
	uint64_t clock;
	uint32_t *slot;		/* by L1 / refcount-table index: slot + 1, 0 none */
	uint64_t nindex;	/* entries of slot[] */
	unsigned ndirty;
	uint64_t hits, misses;
};

/* A bitmap of the image's directory (qcow2_bitmap.c). */
struct qcow2_bm {
	char *name;
	char shown[81];		/* its first 80 bytes, printable, for messages */
	uint64_t table_off;
	uint32_t table_size;
	uint32_t flags;
	uint8_t type, gran_bits;
	uint32_t dir_pos, ent_len;	/* its entry in the directory */
	uint64_t *table;	/* as on disk, host byte order */
	bool usable;		/* vblkd can track it (consistent, a dirty bitmap, ...) */
	bool recovered;		/* in use, but written ahead by vblkd (qcow2_bitmap.c) */
	bool stale_size;	/* ... but for a disk of another size */
	bool ours;		/* the disk holds it: stored at the release */
};

/* A held, enabled bitmap's data clusters while write-ahead is on. */
struct qcow2_wal_bm {
	uint32_t gran_bits;
	uint64_t nbits;
	uint64_t *data;		/* host offsets of its data clusters, in order */
	uint64_t ndata;
};

struct qcow2_ctx;
struct dbm;

struct qcow2 {
	struct bdev disk;	/* what blk serves; first (container_of) */
	struct bdev_engine eng;	/* our ops, under the file engine's name */
	struct bdev *file;	/* the image file, the caller's */
	char *path;
	int mfd;		/* metadata I/O: the file without O_DIRECT */
	bool meta_direct;	/* metadata written around the page cache (meta_write) */
	bool rw;

	/* The header (host byte order). */
	uint32_t version;
	uint32_t cluster_bits;
	uint64_t cs;		/* cluster size */
	uint64_t size;		/* virtual */
	uint64_t incompat, compat, autoclear;
	uint32_t refcount_order;
	uint32_t header_len;
	uint8_t compression;	/* 0 zlib, 1 zstd */
	uint32_t nb_snapshots;
	uint64_t snapshots_off;

	uint64_t *l1;		/* host byte order, l1_size entries */
	uint32_t l1_size;
	uint64_t l1_off;
	uint64_t l1_dirty_lo, l1_dirty_hi;	/* entries [lo, hi) to write */

	uint64_t *rt;		/* refcount table, host byte order */
	uint64_t rt_entries;
	uint64_t rt_off;
	uint32_t rt_clusters;
	bool rt_dirty;

	uint64_t l2_entries;	/* per L2 table: cs / 8, a power of two (an entry's
				 * index is gcl & (l2_entries - 1), its table's
				 * gcl >> (cluster_bits - 3): no division per request) */
	uint64_t rb_entries;	/* per refcount block */
	struct qcow2_cache l2c, rbc;

	uint64_t file_size;	/* at open, grown by what we allocate */
	uint64_t next_free;	/* where the next cluster is allocated */
	/* Clusters whose refcount 1 is already durable, handed out by
	 * qcow2_alloc: a table may point at one as soon as it has it, so the
	 * tables can go to the file at once (qcow2_write_through) without
	 * ever pointing at a cluster whose refcount a crash could lose.
	 * Unused ones are given back at close; a crash leaks them. */
	uint64_t *resv;
	size_t nresv, resv_cap;
	uint64_t resv_chunk;	/* clusters reserved at a time */
	uint64_t refills;
	/* Clusters whose last reference went away (a COW moved a cluster, a
	 * shared L2 table was copied): their refcounts drop only once the
	 * tables without the reference are on disk (qcow2_flush). */
	uint64_t *frees;
	size_t nfrees, frees_cap;
	bool no_punch;		/* the file system cannot punch holes */
	uint64_t punched;	/* freed clusters given back to the file system */
	bool broken;		/* a metadata write failed: no more writes */
	/* The tables are not ours: not read yet, read while another process
	 * could write the image (open, a migration's destination, an
	 * upgrade's new process), or let go (qcow2_io_release).  Nothing
	 * touches them until qcow2_reload reads them again (at the claim). */
	bool stale;
	/* An inconsistency was found (qcow2_corrupt): writes fail from then
	 * on, reads that need no bad metadata go on, nothing but the header's
	 * corrupt bit is written. */
	bool corrupt;
	struct qcow2_meta meta;	/* metadata clusters (qcow2_meta.c) */
	/* New clusters never go past this: what the virtual disk, its tables
	 * and the reserve can need from where the image stood when it became
	 * ours (qcow2_take).  Beyond it the refcounts cannot be right. */
	uint64_t alloc_limit;
	/* Clusters this process freed and punched (they read as zeroes):
	 * in quarantine until every request running when they were put there
	 * has completed, then taken again before the end of the file grows
	 * (qcow2.c, reuse_release).  qcow2_io.c numbers the guest's requests
	 * (io_seq) and counts those running (io_running); at the quarantine,
	 * every running one has a number up to io_seq, every later one a
	 * greater: quarantine_left counts those still to complete. */
	uint64_t *quarantine, *reuse;
	size_t nquarantine, quarantine_cap, nreuse, reuse_cap;
	uint64_t io_seq, io_running;
	uint64_t quarantine_seq, quarantine_left;
	uint64_t reused;	/* clusters taken again (stats) */
	/* The bitmaps extension (qcow2.txt, "Bitmaps extension";
	 * qcow2_bitmap.c): as the header says (qcow2_bm_scan), ... */
	uint64_t bitmaps_dir_off, bitmaps_dir_size;
	uint32_t bm_ext_pos;	/* where in cluster 0; 0: no extension */
	/* Not 24 bytes long (always refused), or its reserved field not zero
	 * (refused while autoclear bit 0 is set), as QEMU refuses them. */
	bool bm_ext_bad_len, bm_ext_bad_reserved;
	/* Bytes of cluster 0 that are not the bitmaps extension, ours or the
	 * end marker (header, other extensions, backing file name): what
	 * qcow2_header_rewrite keeps. */
	uint64_t hdr_other;
	bool wal_warned;	/* the write-ahead extension did not fit: said once */
	uint32_t bm_count;
	/* ... and the directory as read and checked (qcow2_bm_read): valid
	 * (autoclear bit 0 set, well formed), its bytes, its bitmaps. */
	bool bm_valid;
	bool bm_changed;	/* not the directory read or written last */
	uint8_t *bm_dir;
	uint64_t bm_dir_off, bm_dir_len;
	struct qcow2_bm *bm;
	uint32_t nbm;
	/* The first write since the image became ours or its bitmaps were
	 * stored has happened (qcow2_begin_write). */
	bool write_begun;
	/* The disk's persistent bitmaps (qcow2_bm_hold; the disk's, valid
	 * until the next hold). */
	struct dbm **held;
	unsigned nheld;
	/* Write-ahead (qcow2_bitmap.c, "Crash"): the extension as the header
	 * has it (names of the bitmaps it vouches for, region size), and,
	 * while on, the regions whose bits are set in the image already and
	 * where each held, enabled bitmap's data clusters are. */
	char **wal_names;
	uint32_t wal_nnames, wal_ext_bits;
	bool wal_on;
	uint32_t wal_bits;	/* log2 of the region size */
	uint64_t wal_nregions;
	uint64_t *wal_done;	/* synced */
	uint64_t *wal_pend;	/* written, to sync at the kick */
	uint64_t wal_npend;
	struct qcow2_wal_bm *wal_bm;
	unsigned wal_nbm;
	uint64_t wal_writes;	/* regions written ahead (stats, tests) */

	/* Backing chain: the disk below (a format's disk, or a raw file),
	 * its file, and a plain fd for synchronous reads of it. */
	char *backing_name;
	char *backing_fmt;
	struct bdev *backing;
	struct bdev *backing_file;
	int backing_rfd;	/* raw backing: a buffered fd for COW reads */

	/* A stream finished: the header names no backing file, and nothing
	 * is read from it (it stays open, and locked, until close). */
	bool standalone;
	bool copy_on_read;	/* --copy-on-read: reads fill the image */
	uint64_t cor_bytes;	/* copied up by copy on read and stream */
	bool streaming;		/* vblkctl stream running */
	uint64_t stream_pos;	/* bytes of the disk it has gone past */

	struct qcow2_ctx *ctx;	/* the one iothread's (max_ctxs 1) */
	uint8_t *zbuf;		/* decompression: one cluster */
	uint64_t allocated;	/* clusters allocated since open (stats) */
	uint64_t cow_bytes;
	uint64_t zeroed;	/* clusters discarded or zeroed by metadata */
};

/* qcow2.c */
/* Before anything is written to the image (a guest's write, discard or
 * write zeroes, a copy on read, a stream, a grow) or a persistent bitmap
 * changes: the autoclear bits cleared but the bitmaps' (qcow2.txt,
 * autoclear_features: a writer clears what it does not keep), and the
 * bitmaps marked in use (qcow2_bm_mark_in_use), synced; once until the
 * next claim or store.  Not at the claim: an image a VM only reads is not
 * changed.  0 or -errno (the write must not happen).  Iothread. */
int qcow2_begin_write(struct qcow2 *q);
/* Cluster 0 rewritten in one piece and synced (qcow2.txt, "Header
 * extensions"): the fixed header as it is, every extension but those of a
 * type in drop[0..ndrop) kept in order, then add (ready extensions,
 * addlen bytes), the end marker, then the backing file name (moved after
 * them), or none (keep_backing false: offset and size zeroed); autoclear
 * set to ac (v3).  0 or -errno (-ENOSPC: it does not fit the cluster).
 * The header's extensions scanned again (qcow2_bm_scan). */
int qcow2_header_rewrite(struct qcow2 *q, const uint32_t *drop, unsigned ndrop, const uint8_t *add,
			 size_t addlen, bool keep_backing, uint64_t ac);
/* For qcow2_bitmap.c: a metadata write (checked against the metadata
 * map), fdatasync, refcounts written and synced, n contiguous clusters at
 * the end (refcounts set, not yet durable), whether a range overlaps the
 * L1 or refcount table. */
int qcow2_meta_write(struct qcow2 *q, const void *buf, size_t len, uint64_t off, unsigned kind);
int qcow2_sync(struct qcow2 *q);
int qcow2_flush_refcounts(struct qcow2 *q);
uint64_t qcow2_alloc_run(struct qcow2 *q, uint64_t n, int *res);
bool qcow2_meta_clash(const struct qcow2 *q, uint64_t off, uint64_t len);

/* qcow2_bitmap.c (persistent bitmaps; the top of the file says how).
 * scan: the extension's place and fields from cluster 0 (h).  read: the
 * directory and tables read and checked (0, or -EINVAL with one line in
 * err: the image is refused); bm_changed says whether it is the one read
 * or written last.  meta: every table and data cluster to add.  load: the
 * bitmaps vblkd can track as new dbm (persistent; enabled = 'auto'), the
 * caller's; taken: the disk holds that one (stored at the release).
 * mark_in_use: ours and other auto bitmaps in_use in the file.  store:
 * b[0..n) are the disk's persistent bitmaps, the image's others carried
 * on, if the image was written since the claim or changed says a bitmap
 * was; 0 or -errno with one line in err. */
void qcow2_bm_scan(struct qcow2 *q, const uint8_t *h);
int qcow2_bm_read(struct qcow2 *q, char *err, size_t errlen);
void qcow2_bm_free(struct qcow2 *q);
int qcow2_bm_meta(struct qcow2 *q, int (*add)(struct qcow2 *q, uint64_t off, uint64_t len));
int qcow2_bm_load(struct qcow2 *q, struct dbm ***out, unsigned *n, char *err, size_t errlen);
void qcow2_bm_taken(struct qcow2 *q, const char *name);
int qcow2_bm_mark_in_use(struct qcow2 *q);
int qcow2_bm_store(struct qcow2 *q, struct dbm *const *b, unsigned n, bool changed, bool wal,
		   char *err, size_t errlen);
/* fit: the held bitmaps (and one more, name at gran bytes, when name is
 * not NULL) for a disk of size bytes stay inside QEMU's limits and ours;
 * with no name and another size (a resize), every bitmap of the image is
 * one vblkd holds.  0 or -errno with one line in err.  Iothread. */
int qcow2_bm_fit(struct qcow2 *q, const char *name, uint32_t gran, uint64_t size, char *err,
		 size_t errlen);
/* hold: the disk's persistent bitmaps are b[0..n) (copied); force: the
 * image is to reflect them now if it is ours (write-ahead started again).
 * wal_cover: before a write to [off, off + len) while write-ahead is on:
 * the regions it touches written ahead if they were not: 0 (covered), 1
 * (covered once wal_sync has run: the write waits for it) or -errno (the
 * write must not happen).  wal_sync: the regions written since synced
 * (0 or -errno).  Iothread. */
int qcow2_bm_hold(struct qcow2 *q, struct dbm *const *b, unsigned n, bool force);
int qcow2_bm_wal_cover_slow(struct qcow2 *q, uint64_t off, uint64_t len);
int qcow2_bm_wal_sync(struct qcow2 *q);
static inline int qcow2_bm_wal_cover(struct qcow2 *q, uint64_t off, uint64_t len)
{
	uint64_t r0 = off >> q->wal_bits, r1 = (off + len - 1) >> q->wal_bits;

	if (r1 >= q->wal_nregions)
		r1 = q->wal_nregions - 1;
	for (uint64_t r = r0; r <= r1; r++)
		if (!(q->wal_done[r / 64] & (1ull << (r % 64))))
			return qcow2_bm_wal_cover_slow(q, off, len);
	return 0;
}

/* An inconsistency in q's metadata: logged once (what, and where: the
 * guest offset unless QCOW2_NO_GUEST, the host offset), q->corrupt set,
 * and the header's corrupt bit written when the image is ours and
 * writable (qcow2.txt, incompatible bit 1; a v2 header has no such bit:
 * kept in memory, as QEMU does).  From then on writes fail.  Iothread, or
 * main while none runs. */
void qcow2_corrupt(struct qcow2 *q, const char *what, uint64_t guest, uint64_t host);

/* qcow2_meta.c: the set of metadata clusters (qcow2_meta_get above).
 * add: 0, or the kind the cluster has already
 * (not changed), or -ENOMEM; del: forget it.  build: the whole set from
 * the tables just read (header, L1, refcount table and blocks, L2 tables,
 * snapshots, bitmap directory), two kinds on one cluster marking q
 * corrupt; 0 or -errno.  mismatch: -1 when every cluster [off, off+len)
 * touches is of kind want (Q2M_NONE: data or free), else the first other
 * kind found. */
int qcow2_meta_add(struct qcow2_meta *m, uint64_t cluster, unsigned kind);
void qcow2_meta_del(struct qcow2_meta *m, uint64_t cluster);
void qcow2_meta_clear(struct qcow2_meta *m);
void qcow2_meta_free(struct qcow2_meta *m);
int qcow2_meta_build(struct qcow2 *q);
int qcow2_meta_mismatch(const struct qcow2 *q, uint64_t off, uint64_t len, unsigned want);
const char *qcow2_meta_name(unsigned kind);

int qcow2_open(struct bdev *file, const struct fmt_opts *o, unsigned depth,
	       struct qcow2 **out, char *err, size_t errlen);
int qcow2_close(struct qcow2 *q);
bool qcow2_detect(const void *buf, size_t len);
void qcow2_describe(const struct qcow2 *q, char *buf, size_t len);

/* The L2 table for guest cluster gcl (its L1 index): a pointer to its
 * cluster-sized buffer (big-endian entries), loaded on a miss; NULL with
 * *res = 0 when there is none (L1 entry 0), or -errno.  For a write
 * (alloc), a missing table is allocated and a shared one (refcount > 1,
 * a snapshot's) copied first, so the pointer is a table we may change;
 * the table is marked dirty.  Iothread. */
uint8_t *qcow2_l2_get(struct qcow2 *q, uint64_t gcl, bool alloc, int *res);
/* Mark gcl's entry in its L2 table changed (after changing it). */
void qcow2_l2_dirty(struct qcow2 *q, uint64_t gcl);

/* Every table changed since is handed to the file (pwrite, no sync):
 * L2 tables (a fresh one made durable first), then the L1.  Called
 * before a request that changed them completes, so what the guest was
 * told is done survives the death of this process (kill -9: QEMU
 * reconnects and the guest goes on); durability against power loss is
 * the guest's flush.  Safe against power loss in any order the kernel
 * writes pages: every cluster a table points at has a durable refcount
 * (qcow2_alloc), and data copied on write is durable before its entry
 * (qcow2_io.c).  0 or -errno (the image is then broken for writes). */
int qcow2_write_through(struct qcow2 *q);

/* A new cluster, refcount 1 and durable (reserved ahead, a chunk at a
 * time: refcount blocks allocated or the table grown as needed, written
 * and synced): its host offset, or 0 with *res = -errno.  The cluster
 * lies past every byte the image had, so it reads as zeroes. */
uint64_t qcow2_alloc(struct qcow2 *q, int *res);
/* Give back a cluster qcow2_alloc returned and nothing references yet. */
void qcow2_unalloc(struct qcow2 *q, uint64_t off);
/* Drop one reference to what the L2 entry e pointed at (a normal or
 * compressed cluster), once the tables without it are on disk. */
void qcow2_free_later(struct qcow2 *q, uint64_t e);

/* The refcount of the host cluster at off (0 for one past the table), or
 * -errno.  Iothread. */
int64_t qcow2_refcount(struct qcow2 *q, uint64_t off);

/* A checked L2 entry: 0 and *e, or -EIO (logged once: the image is
 * corrupt there) when it points outside the file or into the header or
 * the L1/refcount tables, or has reserved bits set. */
int qcow2_entry(struct qcow2 *q, const uint8_t *l2, uint64_t gcl, uint64_t *e);

/* Read a compressed cluster (L2 entry e) into q->zbuf.  0 or -errno. */
int qcow2_decompress(struct qcow2 *q, uint64_t e);

/* Synchronous read of q's virtual disk, down its chain: for copy on
 * write of a part cluster.  Past the end reads zeroes.  0 or -errno. */
int qcow2_read_sync(struct qcow2 *q, uint64_t off, void *buf, size_t len);

/* Write back in crash-safe order (refcount blocks, sync, refcount table,
 * L2 tables, sync, L1, sync), then let the deferred frees go, then sync
 * the data: after it, everything completed before is durable.  0 or
 * -errno (the image is then broken for writes).  Iothread, or main
 * thread at close. */
int qcow2_flush(struct qcow2 *q);

/* Grow the virtual disk to size bytes (more than now): the header's
 * size, and a bigger L1 table where it needs one (written in new
 * clusters, then the header switched to it).  0, or -errno with one line
 * in err.  Iothread (or the main thread when none runs). */
int qcow2_grow(struct qcow2 *q, uint64_t size, char *err, size_t errlen);

/* The header rewritten without its backing file, synced (after a
 * stream).  0 or -errno (the image is then broken for writes). */
int qcow2_drop_backing(struct qcow2 *q);

/* A new image at path (qcow2.c, qcow2_create): 0, or -errno with one line
 * in err (-EEXIST: a file is there; nothing written).  Any thread. */
int qcow2_create(const char *path, const char *backing, uint64_t size, char *err,
		 size_t errlen);

/* The image handed on (format.h: fmt_quiesce, fmt_release): tables
 * written back and synced, the reserve given back; -EBUSY while a stream
 * runs.  And taken (fmt_claim): header and tables read again
 * and checked as at open; q->stale until it
 * succeeds.  0 or -errno with one line in err.  Iothread, or the main
 * thread while none serves q (the qcow2_io_ forms run them on q's
 * iothread; release stops a stream and drains first). */
int qcow2_quiesce(struct qcow2 *q, char *err, size_t errlen);
int qcow2_reload(struct qcow2 *q, char *err, size_t errlen);
int qcow2_io_quiesce(struct qcow2 *q, char *err, size_t errlen);
int qcow2_io_claim(struct qcow2 *q, char *err, size_t errlen);
void qcow2_io_release(struct qcow2 *q);
/* fmt_bitmaps_* on q's iothread (format.h). */
int qcow2_io_bitmaps_load(struct qcow2 *q, struct dbm ***out, unsigned *n, char *err,
			  size_t errlen);
int qcow2_io_bitmaps_hold(struct qcow2 *q, struct dbm *const *b, unsigned n, bool force);
int qcow2_io_bitmaps_fit(struct qcow2 *q, const char *name, uint32_t gran, uint64_t size,
			 char *err, size_t errlen);
struct fmt_bitmap_kept;
unsigned qcow2_io_bitmaps_kept(struct qcow2 *q, struct fmt_bitmap_kept *out, unsigned max);
unsigned qcow2_bm_kept(struct qcow2 *q, struct fmt_bitmap_kept *out, unsigned max);
int qcow2_io_bitmaps_store(struct qcow2 *q, struct dbm *const *b, unsigned n, bool changed,
			   char *err, size_t errlen);

/* qcow2_io.c: vblkctl stream's units, for format.h's fmt_stream_*
 * (there: what each does, which thread). */
int qcow2_stream_check(struct qcow2 *q, char *err, size_t errlen);
void qcow2_stream_active(struct qcow2 *q, bool on);
int qcow2_stream_next(struct qcow2 *q, uint64_t *pos, uint64_t *len, char *err, size_t errlen);
int qcow2_stream_finish(struct qcow2 *q, char *msg, size_t len);

/* A second open of fd without O_DIRECT (metadata, compressed clusters
 * and copy-on-write reads have no alignment).  The new fd, or -errno. */
int qcow2_reopen_plain(int fd, bool rw);

/* format.c: open q's backing chain (q->backing, q->backing_file). */
int fmt__open_backing(struct qcow2 *q, const struct fmt_opts *o, unsigned depth, char *err,
		      size_t errlen);

/* fmt_block_status of a qcow2 disk (format.h): clusters of one kind in
 * a run, an unallocated run resolved through the backing chain.  Its
 * iothread. */
struct fmt_extent;
int qcow2_block_status(struct qcow2 *q, uint64_t off, uint64_t len, struct fmt_extent *e);

/* qcow2_io.c: the disk's engine ops; whether e is such a table. */
void qcow2_io_engine(struct bdev_engine *e, const char *name);
bool qcow2_io_is(const struct bdev_engine *e);

#endif
