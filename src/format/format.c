/*
 * Formats: which one a file is, backing chains, the raw guard.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/bdev.h"
#include "format/format.h"
#include "format/qcow2.h"
#ifdef HAVE_LUKS
#include "format/luks.h"
#endif
#include "util/compiler.h"
#include "util/iov.h"
#include "util/log.h"

int fmt_parse(const char *s, enum fmt_kind *out)
{
	if (!strcmp(s, "auto"))
		*out = FMT_AUTO;
	else if (!strcmp(s, "raw"))
		*out = FMT_RAW;
	else if (!strcmp(s, "qcow2"))
		*out = FMT_QCOW2;
	else if (!strcmp(s, "luks"))
		*out = FMT_LUKS;
	else
		return -EINVAL;
	return 0;
}

const char *fmt_kind_name(enum fmt_kind kind)
{
	switch (kind) {
	case FMT_RAW: return "raw";
	case FMT_QCOW2: return "qcow2";
	case FMT_LUKS: return "luks";
	case FMT_AUTO: break;
	}
	return "auto";
}

int fmt_create(const char *path, enum fmt_kind kind, uint64_t size, char *err, size_t errlen)
{
	int fd, r;

	if (kind == FMT_QCOW2)
		return qcow2_create(path, NULL, size, err, errlen);
	if (kind != FMT_RAW) {
		snprintf(err, errlen, "cannot make %s: vblkd makes raw and qcow2 images only", path);
		return -EINVAL;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot make %s: %s", path, strerror(-r));
		return r;
	}
	r = ftruncate(fd, (off_t)size) < 0 ? -errno : 0;
	close(fd);
	if (r < 0) {
		unlink(path);
		snprintf(err, errlen, "cannot size %s to %llu bytes: %s", path,
			 (unsigned long long)size, strerror(-r));
	}
	return r;
}

enum fmt_kind fmt_kind_of(const struct bdev *disk)
{
	if (disk && qcow2_io_is(disk->engine))
		return FMT_QCOW2;
#ifdef HAVE_LUKS
	if (disk && luks_is(disk->engine))
		return FMT_LUKS;
#endif
	return FMT_RAW;
}

/* A LUKS header, as QEMU's probe knows it too (block/crypto.c). */
static bool luks_magic(const void *buf, size_t len)
{
	static const uint8_t m[6] = { 'L', 'U', 'K', 'S', 0xba, 0xbe };

	return len >= sizeof(m) && !memcmp(buf, m, sizeof(m));
}

bool fmt_probe_magic(const void *buf, size_t len)
{
	return qcow2_detect(buf, len) || luks_magic(buf, len);
}

/* A write to sector 0 of a detected raw disk that would make it detect as
 * something else: refused (bdev_submit calls this, bdev.h). */
static bool raw_guard(const struct bdev_io *io)
{
	static bool said;
	uint8_t head[8] = { 0 };
	size_t n = iov_to_buf(io->iov, io->iovcnt, 0, head, sizeof(head));

	if (!fmt_probe_magic(head, n))
		return false;
	if (!said) {
		said = true;
		log_warn("disk %s: the guest wrote a qcow2 or LUKS header into the first sector "
			 "of a raw disk whose format was detected; refused, as QEMU does (a "
			 "header there could name any host file as backing file, or lock the "
			 "disk, at the next start): serve it with --format raw to allow it",
			 io->b->path);
	}
	return true;
}

/* The files of the chain being opened, to refuse a loop (main thread). */
static struct {
	dev_t dev;
	ino_t ino;
} chain[QCOW2_MAX_CHAIN + 2];
static unsigned chain_n;

static int chain_push(int fd, const char *path, char *err, size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		snprintf(err, errlen, "cannot stat %s: %s", path, strerror(errno));
		return -errno;
	}
	for (unsigned i = 0; i < chain_n; i++)
		if (chain[i].dev == st.st_dev && chain[i].ino == st.st_ino) {
			snprintf(err, errlen, "the backing chain of %s loops back on itself: fix "
				 "it with qemu-img rebase", path);
			return -ELOOP;
		}
	if (chain_n == ARRAY_SIZE(chain))
		return -ELOOP;
	chain[chain_n].dev = st.st_dev;
	chain[chain_n].ino = st.st_ino;
	chain_n++;
	return 0;
}

static int open_chain(struct bdev *file, enum fmt_kind kind, const struct fmt_opts *o,
		      unsigned depth, struct bdev **disk, char *err, size_t errlen)
{
	struct qcow2 *q;
	uint8_t *head;
	ssize_t n;
	int r;

	if (file->engine->no_disk) {	/* null: nothing to detect */
		*disk = file;
		return 0;
	}
	/* Network disks (the engine is its own disk) have no file to loop. */
	if (!file->engine->open && (r = chain_push(file->fd, file->path, err, errlen)) < 0)
		return r;
	if (kind == FMT_AUTO) {
		/* Aligned, for O_DIRECT. */
		if (posix_memalign((void **)&head, 4096, 4096))
			return -ENOMEM;
		n = MIN(file->size, 4096);
		r = bdev_pread(file, head, (size_t)n, 0);
		if (r < 0) {
			free(head);
			snprintf(err, errlen, "cannot read %s: %s", file->path, strerror(-r));
			return r;
		}
		kind = qcow2_detect(head, (size_t)n) ? FMT_QCOW2 :
		       depth == 0 && luks_magic(head, (size_t)n) ? FMT_LUKS : FMT_RAW;
		free(head);
#ifdef HAVE_LUKS
		/* A LUKS2 disk that lost its primary header: LUKS to
		 * cryptsetup, and raw it would let a guest write over the
		 * keyslots left. */
		if (kind == FMT_RAW && depth == 0 && luks_probe_secondary(file)) {
			log_warn("disk %s: no header at its start, but a LUKS2 secondary header: "
				 "served as LUKS, as cryptsetup reads it (--format raw serves its "
				 "bytes as they are)", file->path);
			kind = FMT_LUKS;
		}
#endif
		if (kind == FMT_RAW && !file->read_only)
			file->write_guard = raw_guard;
	}
	if (kind == FMT_QCOW2 && file->engine->open) {
		snprintf(err, errlen, "%s holds a qcow2 image, and vblkd reads qcow2 from files "
			 "and block devices only: export the image's contents instead (qemu-nbd "
			 "-f qcow2, or qemu-img convert -O raw), or give --format raw to serve the "
			 "qcow2 file's own bytes", file->path);
		return -EOPNOTSUPP;
	}
	if (kind == FMT_RAW) {
		if (file->size_tail)
			log_warn("disk %s: size %llu is not a multiple of %u; the last %u bytes "
				 "are not exported", file->path,
				 (unsigned long long)(file->size + file->size_tail),
				 file->block_size, file->size_tail);
		*disk = file;
		return 0;
	}
	if (kind == FMT_LUKS) {
		if (depth) {
			snprintf(err, errlen, "%s: a LUKS backing file is not supported", file->path);
			return -EOPNOTSUPP;
		}
#ifdef HAVE_LUKS
		return luks_open(file, o, disk, err, errlen);
#else
		snprintf(err, errlen, "%s is a LUKS disk, and this vblkd was built without "
			 "libcryptsetup (apt-get install libcryptsetup-dev, rebuild)", file->path);
		return -EOPNOTSUPP;
#endif
	}
	r = qcow2_open(file, o, depth, &q, err, errlen);
	if (r < 0)
		return r;
	qcow2_io_engine(&q->eng, file->engine->name);
	q->disk = (struct bdev){
		.path = q->path,
		.fd = file->fd,
		.size = q->size - q->size % file->block_size,
		.block_size = file->block_size,
		.phys_block_size = file->phys_block_size,
		/* Discard frees whole clusters (qcow2_io.c, q2_dwz). */
		.discard_granularity = (unsigned)q->cs,
		.caps = file->read_only ? 0 : BDEV_CAP_DISCARD | BDEV_CAP_WRITE_ZEROES,
		.read_only = file->read_only,
		.is_blockdev = file->is_blockdev,
		.device_completes = file->device_completes,
		.max_ctxs = 1,
		.engine = &q->eng,
		.priv = q,
	};
	if (q->disk.size == 0) {
		snprintf(err, errlen, "qcow2 image %s is smaller than one %u-byte block", q->path,
			 file->block_size);
		/* Its backing chain too (qcow2_close alone leaked it). */
		fmt_close(&q->disk, file);
		return -EINVAL;
	}
	*disk = &q->disk;
	return 0;
}


/* The backing file of q (qcow2.txt, "Header": backing_file_offset; the
 * backing format header extension), read-only, a path relative to q's
 * directory as QEMU resolves it. */
int fmt__open_backing(struct qcow2 *q, const struct fmt_opts *o, unsigned depth, char *err,
		      size_t errlen)
{
	struct bdev_opts bo = *o->bo;
	/* Read-only images do not change under an upgrade: read whole now. */
	struct fmt_opts bfo = *o;
	enum fmt_kind kind = FMT_AUTO;
	struct bdev *bf;
	char *path, *dir;
	int r;

	if (depth + 1 >= QCOW2_MAX_CHAIN) {
		snprintf(err, errlen, "the backing chain of %s is deeper than %u images: flatten "
			 "it with qemu-img convert or commit", q->path, QCOW2_MAX_CHAIN);
		return -ELOOP;
	}
	if (!strncmp(q->backing_name, "json:", 5) || strstr(q->backing_name, "://")) {
		snprintf(err, errlen, "qcow2 image %s has a backing file that is not a local file "
			 "(%s): vblkd opens local files only; qemu-img rebase it onto one",
			 q->path, q->backing_name);
		return -EOPNOTSUPP;
	}
	if (q->backing_fmt) {
		if (!strcmp(q->backing_fmt, "raw") || !strcmp(q->backing_fmt, "file"))
			kind = FMT_RAW;
		else if (!strcmp(q->backing_fmt, "qcow2"))
			kind = FMT_QCOW2;
		else {
			snprintf(err, errlen, "qcow2 image %s has a backing file of format %s; vblkd "
				 "reads qcow2 and raw backing files", q->path, q->backing_fmt);
			return -EOPNOTSUPP;
		}
	}
	if (q->backing_name[0] == '/') {
		path = strdup(q->backing_name);
	} else {
		char *copy = strdup(q->path);

		if (!copy)
			return -ENOMEM;
		dir = dirname(copy);
		if (asprintf(&path, "%s/%s", dir, q->backing_name) < 0)
			path = NULL;
		free(copy);
	}
	bf = calloc(1, sizeof(*bf));
	if (!path || !bf) {
		free(path);
		free(bf);
		return -ENOMEM;
	}
	bo.path = path;
	bo.read_only = true;
	bo.take_fd = false;
	bo.fd = -1;
	bo.iopoll = BDEV_IOPOLL_OFF;
	r = bdev_open(&bo, bf, err, errlen);
	if (r < 0) {
		char why[256];

		snprintf(why, sizeof(why), "%s", err);
		snprintf(err, errlen, "backing file of %s: %s", q->path, why);
		goto fail;
	}
	r = bdev_lock_shared(bf);
	if (r < 0) {
		snprintf(err, errlen, "backing file %s of %s is open for writing by another "
			 "process: a backing file must not change under its overlays", path,
			 q->path);
		goto fail_close;
	}
	bfo.handover = false;
	r = open_chain(bf, kind, &bfo, depth + 1, &q->backing, err, errlen);
	if (r < 0)
		goto fail_close;
	q->backing_file = bf;
	if (q->backing == bf) {
		r = qcow2_reopen_plain(bf->fd, false);
		if (r < 0) {
			snprintf(err, errlen, "cannot reopen backing file %s: %s", path, strerror(-r));
			fmt_close(q->backing, bf);
			q->backing = NULL;
			goto fail_close;
		}
		q->backing_rfd = r;
	}
	free(path);
	return 0;
fail_close:
	bdev_close(bf);
fail:
	free(bf);
	free(path);
	q->backing_file = NULL;
	return r;
}

int fmt_open(struct bdev *file, const struct fmt_opts *o, struct bdev **disk, char *err,
	     size_t errlen)
{
	int r;

	chain_n = 0;
	r = open_chain(file, o->kind, o, 0, disk, err, errlen);
	/* The line may quote the image (a backing file's name, a cipher's):
	 * one line whatever it holds. */
	if (r < 0 && errlen)
		log_one_line(err, strnlen(err, errlen));
	return r;
}

int fmt_close(struct bdev *disk, struct bdev *file)
{
	struct qcow2 *q;
	struct bdev *b, *bf;
	int r;

	if (!disk || disk == file)
		return 0;
#ifdef HAVE_LUKS
	if (luks_is(disk->engine)) {
		luks_close(disk);
		return 0;
	}
#endif
	q = container_of(disk, struct qcow2, disk);
	b = q->backing;
	bf = q->backing_file;
	r = qcow2_close(q);
	if (bf) {
		fmt_close(b, bf);
		bdev_close(bf);
		free(bf);
	}
	return r;
}

/* A file's data and holes (lseek SEEK_DATA / SEEK_HOLE, as QEMU's
 * file-posix block status); anything else is data. */
static int raw_block_status(struct bdev *b, uint64_t off, uint64_t len, struct fmt_extent *e)
{
	uint64_t end;
	off_t d, h;

	*e = (struct fmt_extent){ .length = len, .flags = 0, .depth = 1 };
	if (b->fd < 0 || b->is_blockdev || b->engine->open)
		return 0;
	/* Inside the last data extent found: no lseek (bdev.h, bsc). */
	if (bdev_bsc_get(b, off, &end)) {
		e->length = MIN(len, end - off);
		return 0;
	}
	d = lseek(b->fd, (off_t)off, SEEK_DATA);
	if (d < 0) {
		/* ENXIO: no data from off to the file's end; anything else
		 * (a file system without SEEK_DATA): call it data. */
		if (errno == ENXIO)
			e->flags = FMT_EXT_HOLE | FMT_EXT_ZERO;
		return 0;
	}
	if ((uint64_t)d > off) {
		e->flags = FMT_EXT_HOLE | FMT_EXT_ZERO;
		e->length = MIN(len, (uint64_t)d - off);
		return 0;
	}
	h = lseek(b->fd, (off_t)off, SEEK_HOLE);
	if (h > (off_t)off) {
		e->length = MIN(len, (uint64_t)h - off);
		bdev_bsc_set(b, (uint64_t)off, (uint64_t)h);
	}
	return 0;
}

int fmt_block_status(struct bdev *disk, uint64_t off, uint64_t len, struct fmt_extent *e)
{
	if (!len)
		return -EINVAL;
	if (qcow2_io_is(disk->engine))
		return qcow2_block_status(container_of(disk, struct qcow2, disk), off, len, e);
	if (luks_is(disk->engine)) {
		/* Every sector is ciphertext on the file: data. */
		*e = (struct fmt_extent){ .length = len, .flags = 0, .depth = 1 };
		return 0;
	}
	return raw_block_status(disk, off, len, e);
}

bool fmt_block_status_cheap(const struct bdev *disk)
{
	return qcow2_io_is(disk->engine);
}

void fmt_stats(const struct bdev *disk, struct fmt_stats *out)
{
	const struct qcow2 *q;

	*out = (struct fmt_stats){ 0 };
	if (!disk || !qcow2_io_is(disk->engine))
		return;
	q = container_of(disk, struct qcow2, disk);
	out->cache_bytes = (uint64_t)(q->l2c.n + q->rbc.n) * q->cs;
	out->cache_hits = q->l2c.hits + q->rbc.hits;
	out->cache_misses = q->l2c.misses + q->rbc.misses;
	out->clusters_allocated = q->allocated;
	out->cow_bytes = q->cow_bytes;
	out->cor_bytes = q->cor_bytes;
	out->streaming = q->streaming;
	out->stream_pos = q->stream_pos;
	out->clusters_reused = q->reused;
	out->bitmap_regions = q->wal_writes;
	out->corrupt = q->corrupt;
}

int fmt_quiesce(struct bdev *disk, char *err, size_t errlen)
{
	if (!disk || !qcow2_io_is(disk->engine))
		return 0;
	return qcow2_io_quiesce(container_of(disk, struct qcow2, disk), err, errlen);
}

int fmt_claim(struct bdev *disk, char *err, size_t errlen)
{
	if (!disk || !qcow2_io_is(disk->engine))
		return 0;
	return qcow2_io_claim(container_of(disk, struct qcow2, disk), err, errlen);
}

void fmt_release(struct bdev *disk)
{
	if (disk && qcow2_io_is(disk->engine))
		qcow2_io_release(container_of(disk, struct qcow2, disk));
}

static struct qcow2 *qcow2_of(struct bdev *disk)
{
	return disk && qcow2_io_is(disk->engine) ? container_of(disk, struct qcow2, disk) : NULL;
}

int fmt_bitmaps_can(struct bdev *disk, char *err, size_t errlen)
{
	struct qcow2 *q = qcow2_of(disk);

	if (!q) {
		snprintf(err, errlen, "persistent bitmaps are kept in a qcow2 image, or for a "
			 "writable raw disk in a bitmap file (beside a file, or where --bitmap-file "
			 "says): this disk has neither (read-only, LUKS, or a block device or "
			 "network disk without --bitmap-file)");
		return -EOPNOTSUPP;
	}
	if (!q->rw || q->version < 3) {
		snprintf(err, errlen, "qcow2 image %s %s: it cannot keep a persistent bitmap%s",
			 q->path, !q->rw ? "is served read-only" : "is version 2",
			 q->rw ? " (qemu-img amend -o compat=1.1 upgrades it)" : "");
		return -EOPNOTSUPP;
	}
	return 0;
}

int fmt_bitmaps_fit(struct bdev *disk, const char *name, uint32_t gran, uint64_t size,
		    char *err, size_t errlen)
{
	struct qcow2 *q = qcow2_of(disk);

	return q ? qcow2_io_bitmaps_fit(q, name, gran, size, err, errlen) : 0;
}

int fmt_bitmaps_load(struct bdev *disk, struct dbm ***out, unsigned *n, char *err,
		     size_t errlen)
{
	struct qcow2 *q = qcow2_of(disk);

	*out = NULL;
	*n = 0;
	return q ? qcow2_io_bitmaps_load(q, out, n, err, errlen) : 0;
}

bool fmt_bitmaps_changed(struct bdev *disk)
{
	struct qcow2 *q = qcow2_of(disk);

	return q && q->bm_changed;
}

void fmt_bitmaps_taken(struct bdev *disk, const char *name)
{
	struct qcow2 *q = qcow2_of(disk);

	if (q)
		qcow2_bm_taken(q, name);
}

int fmt_bitmaps_hold(struct bdev *disk, struct dbm *const *b, unsigned n, bool force)
{
	struct qcow2 *q = qcow2_of(disk);

	return q ? qcow2_io_bitmaps_hold(q, b, n, force) : 0;
}

int fmt_bitmaps_store(struct bdev *disk, struct dbm *const *b, unsigned n, bool changed,
		      char *err, size_t errlen)
{
	struct qcow2 *q = qcow2_of(disk);

	return q ? qcow2_io_bitmaps_store(q, b, n, changed, err, errlen) : 0;
}

unsigned fmt_bitmaps_kept(struct bdev *disk, struct fmt_bitmap_kept *out, unsigned max)
{
	struct qcow2 *q = qcow2_of(disk);

	return q ? qcow2_io_bitmaps_kept(q, out, max) : 0;
}

bool fmt_bitmap_file_possible(const struct bdev *file, bool named)
{
#ifdef HAVE_LUKS
	if (file && luks_is(file->engine))
		return false;
#endif
	if (!file || qcow2_io_is(file->engine) || file->read_only || !file->path)
		return false;
	return named || (file->fd >= 0 && !file->is_blockdev && !file->engine->open);
}

int fmt_bitmap_file_path(const char *disk_path, char *out, size_t len)
{
	int n = snprintf(out, len, "%s.bitmaps.qcow2", disk_path);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int fmt_bitmap_file_open(const char *path, const char *disk_path, uint64_t disk_size,
			 bool create, bool handover, struct bdev **bm, struct bdev **file,
			 char *err, size_t errlen)
{
	struct fmt_opts fo = { .kind = FMT_QCOW2, .bitmaps_only = true, .handover = handover };
	struct bdev_opts bo = { .path = path, .engine = "threads", .cache = BDEV_CACHE_WRITEBACK };
	char real[PATH_MAX], other[PATH_MAX];
	struct bdev *f = calloc(1, sizeof(*f)), *d;
	struct qcow2 *q;
	int r;

	if (!f)
		return -ENOMEM;
	/* A network disk's name is not a path: taken as it is. */
	if (!realpath(disk_path, real))
		snprintf(real, sizeof(real), "%s", disk_path);
	if (create && access(path, F_OK) < 0 && errno == ENOENT &&
	    (r = qcow2_create(path, real, disk_size, err, errlen)) < 0)
		goto fail;
	if ((r = bdev_open(&bo, f, err, errlen)) < 0)
		goto fail;
	r = fmt_open(f, &fo, &d, err, errlen);
	if (r < 0) {
		bdev_close(f);
		goto fail;
	}
	if (!(q = qcow2_of(d))) {
		snprintf(err, errlen, "%s is not a qcow2 image: it cannot be a bitmap file", path);
		fmt_close(d, f);
		bdev_close(f);
		r = -EINVAL;
		goto fail;
	}
	/* Its backing file is this disk (a relative name is the file's
	 * directory's, as QEMU reads it), and it is the disk's size. */
	other[0] = '\0';
	if (q->backing_name) {
		char rel[PATH_MAX * 2], *dup = strdup(path);

		if (dup && q->backing_name[0] != '/')
			snprintf(rel, sizeof(rel), "%s/%s", dirname(dup), q->backing_name);
		else
			snprintf(rel, sizeof(rel), "%s", q->backing_name);
		free(dup);
		if (!realpath(rel, other))
			snprintf(other, sizeof(other), "%s", q->backing_name);
	}
	/* Smaller: the disk grew while no vblkd served it (a truncate); the
	 * file grows with it at the claim (disk__bitmaps_claimed). */
	if (strcmp(other, real) || q->size > disk_size) {
		snprintf(err, errlen, "%s is not the bitmap file of %s (%s): move it away, or "
			 "give --bitmap-file another path", path, disk_path,
			 strcmp(other, real) ? "its backing file is another" :
			 "it is for a disk of another size");
		fmt_close(d, f);
		bdev_close(f);
		r = -EINVAL;
		goto fail;
	}
	*bm = d;
	*file = f;
	return 0;
fail:
	free(f);
	return r;
}

void fmt_bitmap_file_close(struct bdev *bm, struct bdev *file)
{
	if (!bm)
		return;
	fmt_close(bm, file);
	bdev_close(file);
	free(file);
}

int fmt_bitmaps_write(struct bdev *bm, uint64_t off, uint64_t len)
{
	struct qcow2 *q = qcow2_of(bm);
	int r;

	if (!q || !q->rw || q->stale)
		return 0;
	if (!q->write_begun && (r = qcow2_begin_write(q)) < 0)
		return r;
	if (!q->wal_on)
		return 0;
	r = qcow2_bm_wal_cover(q, off, len);
	return r > 0 ? qcow2_bm_wal_sync(q) : r;
}

int fmt_key_export(const struct bdev *disk)
{
#ifdef HAVE_LUKS
	if (disk && luks_is(disk->engine))
		return luks_key_export(disk);
#endif
	(void)disk;
	return -ENOENT;
}

bool fmt_has_backing(const struct bdev *disk)
{
	const struct qcow2 *q;

	if (!disk || !qcow2_io_is(disk->engine))
		return false;
	q = container_of(disk, struct qcow2, disk);
	return q->backing && !q->standalone;
}

static struct qcow2 *q2_of(struct bdev *disk)
{
	return container_of(disk, struct qcow2, disk);
}

int fmt_stream_check(struct bdev *disk, char *err, size_t errlen)
{
	if (!disk || !qcow2_io_is(disk->engine)) {
		snprintf(err, errlen, "the disk is not a qcow2 image: there is no backing chain "
			 "to stream");
		return -EINVAL;
	}
	return qcow2_stream_check(q2_of(disk), err, errlen);
}

void fmt_stream_active(struct bdev *disk, bool on)
{
	qcow2_stream_active(q2_of(disk), on);
}

int fmt_stream_next(struct bdev *disk, uint64_t *pos, uint64_t *len, char *err, size_t errlen)
{
	return qcow2_stream_next(q2_of(disk), pos, len, err, errlen);
}

int fmt_stream_finish(struct bdev *disk, char *msg, size_t len)
{
	return qcow2_stream_finish(q2_of(disk), msg, len);
}

void fmt_describe(const struct bdev *disk, const struct bdev *file, char *buf, size_t len)
{
	const struct qcow2 *q;
	size_t n;

	if (disk == file) {
		snprintf(buf, len, "raw%s", file->write_guard ? " (detected)" : "");
		return;
	}
#ifdef HAVE_LUKS
	if (luks_is(disk->engine)) {
		luks_describe(disk, buf, len);
		return;
	}
#endif
	q = container_of(disk, struct qcow2, disk);
	qcow2_describe(q, buf, len);
	n = strlen(buf);
	if (q->backing && q->backing != q->backing_file && n + 8 < len) {
		snprintf(buf + n, len - n, " <- ");
		fmt_describe(q->backing, q->backing_file, buf + n + 4, len - n - 4);
	}
}
