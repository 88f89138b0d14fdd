/*
 * fmt_: image formats, the layer between the virtio-blk device (blk_) and
 * the I/O engines (bdev_).  STYLE.md rule 16: device -> formats -> engines.
 *
 * A format takes the opened image file (a struct bdev with its engine)
 * and gives back the disk the guest sees, as a struct bdev too: blk
 * serves that one and knows no format.  raw gives the file back as it is
 * (nothing between blk and the engine: raw over io_uring keeps its hot
 * path).  qcow2 gives a disk of its own whose engine ops map each request
 * onto extents of the file (cluster mapping), of its backing chain, or of
 * zeroes, allocate clusters for writes, and keep the image's metadata
 * (L1/L2 tables, refcounts) on the file, written back in an order that
 * leaves a consistent image at any crash (docs/architecture.md "Image
 * formats").  The engines below never learn that a format exists.
 *
 * Threading: fmt_open/fmt_close on the main thread, before/after iothreads
 * run.  A qcow2 disk is served by one iothread (max_ctxs = 1, as QEMU's
 * block layer runs one image in one AioContext): its metadata is that
 * thread's, with no lock.
 */
#ifndef VBLK_FMT_H
#define VBLK_FMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bdev;
struct bdev_opts;

enum fmt_kind {
	FMT_AUTO,	/* qcow2 if the file starts with its magic, else raw */
	FMT_RAW,
	FMT_QCOW2,
	FMT_LUKS,	/* LUKS1/LUKS2 (luks.h); detected at the top only */
};

struct fmt_opts {
	enum fmt_kind kind;
	/* qcow2: bytes of L2 tables kept in memory; 0: enough for the whole
	 * image, at most 32 MiB (QEMU's default on Linux). */
	uint64_t l2_cache_bytes;
	/* How backing files are opened: engine, cache mode, block size (the
	 * top image's; path and read_only are set per file). */
	const struct bdev_opts *bo;
	/* qcow2 with a backing file: reads of clusters the chain provides
	 * copy them into the image (QEMU's copy-on-read). */
	bool copy_on_read;
	/* LUKS: the passphrase's file ("-": standard input; a bare name in
	 * $CREDENTIALS_DIRECTORY: a systemd credential), read whole. */
	const char *key_file;
	/* LUKS, upgrade in place: the volume key the old process handed
	 * over (fmt_key_export's memfd), taken instead of key_file's
	 * passphrase once the header's digest accepts it. */
	bool key_handed;
	int key_fd;
	/* LUKS: what one keyslot's key derivation may cost before it is
	 * tried (--kdf-max-ms, --kdf-max-memory): a keyslot estimated above
	 * either is skipped, with one line.  0: the defaults (luks.h). */
	uint32_t kdf_max_ms;
	uint64_t kdf_max_kib;
	/* Upgrade in place: the old process still writes the image, so a
	 * format reads its header now and its tables at fmt_claim, and
	 * writes nothing before. */
	bool handover;
	/* qcow2: a bitmap file (fmt_bitmap_file_open): its backing file is
	 * not opened, no data is served through it. */
	bool bitmaps_only;
};

/* "raw", "qcow2", "luks", "auto" -> *out.  0 or -EINVAL. */
int fmt_parse(const char *s, enum fmt_kind *out);
/* The name fmt_parse takes for kind ("raw", "qcow2", "luks", "auto"). */
const char *fmt_kind_name(enum fmt_kind kind);

/* A new image at path, size bytes, nothing in it: raw (a sparse file) or
 * qcow2 (v3, 64 KiB clusters, no backing file: qcow2_create); O_EXCL, so
 * never over a file that is there (-EEXIST).  0, or -errno with one line
 * in err (nothing left behind).  Any thread. */
int fmt_create(const char *path, enum fmt_kind kind, uint64_t size, char *err, size_t errlen);
/* The format of a disk fmt_open gave: FMT_QCOW2, FMT_LUKS or FMT_RAW. */
enum fmt_kind fmt_kind_of(const struct bdev *disk);

/*
 * Open the format of file (opened by bdev_open).  On success *disk is the
 * disk to serve: file itself for raw, else the format's own.  On failure
 * -errno with one line for the user in err (what is wrong with the image
 * and what to do); file is left as it was, open.  Main thread.
 */
int fmt_open(struct bdev *file, const struct fmt_opts *o, struct bdev **disk, char *err,
	     size_t errlen);

/*
 * Close what fmt_open made: a format writes its metadata back and syncs
 * (0, or -errno logged), closes its backing chain; the file itself stays
 * open for the caller's bdev_close.  disk == file (raw): nothing.  Main
 * thread, after every ctx of disk is freed.
 */
int fmt_close(struct bdev *disk, struct bdev *file);

/* One line on what is served, for the start-up log: "raw", or "qcow2 v3,
 * 64 KiB clusters, backing base.qcow2 (qcow2) <- ...".  Main thread. */
void fmt_describe(const struct bdev *disk, const struct bdev *file, char *buf, size_t len);

/*
 * A raw image whose format was detected (--format auto) must stay raw:
 * a guest writing a format's magic into its first sector would have the
 * next start open its disk as that format, with a backing file of the
 * guest's choosing (QEMU's rule for probed raw images).  True when buf
 * (the first len bytes a write puts at offset 0) would be detected as a
 * format.  Any thread.
 */
bool fmt_probe_magic(const void *buf, size_t len);

/* Whether disk is a format's disk that reads from a backing chain. */
bool fmt_has_backing(const struct bdev *disk);

/*
 * vblkctl stream, in units for the stream job (job/stream.c): everything
 * disk's backing chain still provides is read with copy_up (bdev.h), which
 * copies it into the image, then the header drops the backing file.
 * fmt_stream_check (main thread): 0, or -errno with one line in err (not
 * a qcow2 image with a backing file, not writable, not held here: no
 * front has claimed it).  On the disk's iothread: fmt_stream_active marks
 * a stream running or not (stats' streaming; fmt_quiesce refuses while
 * one runs); fmt_stream_next looks from *pos (bytes, a cluster's start)
 * for the next range the chain provides and the image does not: 1 and
 * [*pos, *pos + *len) to read; 2: looked a few thousand clusters, none yet
 * (*pos moved on: call again after the loop's turn); 0: none left (*pos is
 * the size); -errno with one line in err (tables unreadable, corrupt).
 * fmt_stream_finish: all of it copied: the image durable, then its header
 * without the backing file; 0 with a summary in msg, or -errno and why.
 */
int fmt_stream_check(struct bdev *disk, char *err, size_t errlen);
void fmt_stream_active(struct bdev *disk, bool on);
int fmt_stream_next(struct bdev *disk, uint64_t *pos, uint64_t *len, char *err, size_t errlen);
int fmt_stream_finish(struct bdev *disk, char *msg, size_t len);

/*
 * Upgrade in place (docs/architecture.md "Upgrade in place").  The new
 * process opens the image while the old one still serves it, so what it
 * read may be stale until the old one stops.  Old process, every ring
 * stopped: fmt_quiesce writes the format's tables back, syncs, and gives
 * back the clusters it held in reserve; it may serve on afterwards (the
 * upgrade failed).  -EBUSY while a stream runs (fmt_stream_active).  0 for raw and
 * LUKS (nothing kept), or -errno with one line in err.  The new process,
 * the old one quiesced, reads the tables with fmt_claim (below) before
 * any request.  Main thread.
 */
int fmt_quiesce(struct bdev *disk, char *err, size_t errlen);

/*
 * The image's write lock, as the device takes and lets go of it
 * (docs/architecture.md "Migration"): while we did not hold it another
 * process may have written the image (a migration's source, the process
 * an upgrade replaced, a vblkd before a restart), so what a format read
 * of it may be old.  fmt_claim, the lock just taken and no ring running
 * yet: a format reads its tables again (qcow2: header and tables checked
 * as at open; the first claim after open does it too).  0, or -errno
 * with one line in err (the ring does not start).  fmt_release, every
 * ring stopped and drained, before the lock goes: a format stops what it
 * writes by itself (vblkctl stream), writes its tables back and syncs;
 * until the next claim it writes nothing, and vblkctl resize and stream
 * are refused.  Both nothing for raw and LUKS.  Main thread.
 */
int fmt_claim(struct bdev *disk, char *err, size_t errlen);
void fmt_release(struct bdev *disk);

/*
 * Persistent dirty bitmaps (issue 46; qcow2: qcow2_bitmap.c, QEMU's
 * bitmaps extension).  fmt_bitmaps_can: 0 if disk can keep persistent
 * bitmaps, else -EOPNOTSUPP with one line in err (a raw disk: not yet; a
 * read-only or version 2 qcow2 image).  fmt_bitmaps_load: the image's
 * bitmaps vblkd can track, as new dbm (persistent, enabled as the image
 * says), the caller's; 0 or -errno with one line in err.
 * fmt_bitmaps_changed: another process stored bitmaps in the image since
 * we read or stored them last (the caller loads them again); after a
 * claim.  fmt_bitmaps_taken: the caller holds the image's bitmap name (a
 * loaded one it kept).  fmt_bitmaps_hold: the disk's persistent bitmaps
 * are b[0..n) from now on (the format keeps the pointers until the next
 * hold: call it again before one is freed); force: they changed (added,
 * removed, enabled, merged into): the image reflects them now if it is
 * ours (stored in use and written ahead from here: a crash finds them
 * covering every write).  fmt_bitmaps_store: b[0..n) are the
 * disk's persistent bitmaps (changed: one changed in memory since the
 * last store; else they are stored only if the image was written since
 * it became ours): written to the image (not in use), the
 * image's bitmaps vblkd did not take carried on, those it held and no
 * longer has removed; before fmt_release or fmt_quiesce, every ring
 * stopped; 0 or -errno with one line in err.  Main thread.
 */
struct dbm;
int fmt_bitmaps_can(struct bdev *disk, char *err, size_t errlen);
/* fmt_bitmaps_fit: the disk's persistent bitmaps, with one more (name at
 * gran bytes) when name is not NULL, fit the image's limits (QEMU's) at a
 * disk of size bytes, and with no name a resize to size keeps the image's
 * bitmaps valid: 0, or -errno with one line in err.  Main thread. */
int fmt_bitmaps_fit(struct bdev *disk, const char *name, uint32_t gran, uint64_t size,
		    char *err, size_t errlen);
int fmt_bitmaps_load(struct bdev *disk, struct dbm ***out, unsigned *n, char *err,
		     size_t errlen);
bool fmt_bitmaps_changed(struct bdev *disk);
void fmt_bitmaps_taken(struct bdev *disk, const char *name);
int fmt_bitmaps_hold(struct bdev *disk, struct dbm *const *b, unsigned n, bool force);
int fmt_bitmaps_store(struct bdev *disk, struct dbm *const *b, unsigned n, bool changed,
		      char *err, size_t errlen);
/* The image's bitmaps vblkd keeps but does not use (in use after a crash,
 * a name or granularity it does not take, ...): up to max, their name,
 * granularity and why; returns how many there are.  Main thread. */
struct fmt_bitmap_kept {
	char name[64];
	uint32_t granularity;
	bool enabled;		/* its auto flag */
	const char *why;	/* static */
};
unsigned fmt_bitmaps_kept(struct bdev *disk, struct fmt_bitmap_kept *out, unsigned max);

/*
 * The bitmap file of a raw disk (issue 46: persistent bitmaps beside a disk
 * that has no place for them): a qcow2 image of the disk's size whose
 * backing file is the disk (raw) and which holds no data, only bitmaps,
 * in QEMU's bitmaps extension.  qemu-img info lists them; qemu-nbd -r -B
 * NAME on it exports the disk's data (through the backing file) with the
 * bitmap.  fmt_bitmap_file_open opens path (create: made first if it is
 * not there, for disk_path, disk_size bytes) as a qcow2 of its own whose
 * fmt_bitmaps_* and fmt_claim/release/quiesce work as an image's; a file
 * of another size, or another disk's, is refused with one line in err.
 * *bm is the format's disk, *file the file (both for
 * fmt_bitmap_file_close).  Main thread.
 */
int fmt_bitmap_file_open(const char *path, const char *disk_path, uint64_t disk_size,
			 bool create, bool handover, struct bdev **bm, struct bdev **file,
			 char *err, size_t errlen);
void fmt_bitmap_file_close(struct bdev *bm, struct bdev *file);
/* Whether this disk can have a bitmap file: raw and writable; beside it
 * by default (named false) only if it is a regular file. */
bool fmt_bitmap_file_possible(const struct bdev *file, bool named);
/* disk_path + ".bitmaps.qcow2": where a raw disk's bitmap file is by
 * default; 0 or -ENAMETOOLONG. */
int fmt_bitmap_file_path(const char *disk_path, char *out, size_t len);
/* fmt_bitmaps_write: before a write to [off, off + len) of a raw disk
 * with a bitmap file bm: its first change begun (the bitmaps stored in
 * use, written ahead), the regions the write touches written ahead and
 * synced.  0 or -errno (the write must fail).  Any iothread, one at a
 * time (the caller's lock). */
int fmt_bitmaps_write(struct bdev *bm, uint64_t off, uint64_t len);

/*
 * Upgrade in place: a LUKS disk's volume key in a sealed memfd for the
 * old process to hand to the new one (fmt_opts.key_handed), which then
 * needs no passphrase.  The fd (the caller closes it), -ENOENT for a
 * disk without a key, or -errno.  Main thread.
 */
int fmt_key_export(const struct bdev *disk);

/*
 * What the range at off is, as the NBD server reports it (doc/proto.md
 * "base:allocation metadata context", and QEMU's qemu:allocation-depth):
 * flags FMT_EXT_HOLE (no data stored for it anywhere in the chain) and
 * FMT_EXT_ZERO (it reads as zeroes: a qcow2 zero cluster, a file's hole,
 * a range no layer has); depth: the layer of the chain that has it
 * (1: the image itself, 2: its backing file, ...; 0: none, it reads as
 * zeroes).  *e covers [off, off + e->length), 0 < length <= len; the
 * next call goes on from there.  QEMU's block-status rules: data in any
 * layer is data; a file's SEEK_HOLE regions are holes; a disk whose
 * engine cannot tell (network disks) is data throughout.  0, or -errno
 * (a corrupt table: -EIO).  On the thread serving disk (its iothread).
 */
#define FMT_EXT_HOLE (1u << 0)
#define FMT_EXT_ZERO (1u << 1)
struct fmt_extent {
	uint64_t length;
	unsigned flags;
	unsigned depth;
};
int fmt_block_status(struct bdev *disk, uint64_t off, uint64_t len, struct fmt_extent *e);
/* Whether fmt_block_status of disk costs no system call (a qcow2 image:
 * its tables are in memory), so a front may ask it before every read.
 * Any thread. */
bool fmt_block_status_cheap(const struct bdev *disk);

/* What a format keeps count of (all zero for raw). */
struct fmt_stats {
	uint64_t cache_bytes;		/* memory of the metadata caches */
	uint64_t cache_hits, cache_misses;
	uint64_t clusters_allocated;	/* since open */
	uint64_t cow_bytes;		/* copied around partial writes */
	uint64_t cor_bytes;		/* copied up by copy on read, stream */
	uint64_t streaming;		/* 1 while vblkctl stream runs */
	uint64_t stream_pos;		/* bytes of the disk it has gone past */
	uint64_t clusters_reused;	/* freed, then allocated again */
	uint64_t bitmap_regions;	/* written ahead in persistent bitmaps */
	uint64_t corrupt;		/* 1: found corrupt, writes refused */
};

/* disk's counters.  On the thread serving disk (its iothread: the
 * counters are its own), or any thread while none runs. */
void fmt_stats(const struct bdev *disk, struct fmt_stats *out);

#endif
