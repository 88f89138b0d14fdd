/*
 * qcow2's disk: the engine ops blk drives.  Each guest request is cut
 * along clusters (qcow2.txt, "Cluster mapping") into runs, each one I/O
 * on the file (allocated clusters, contiguous ones merged), on the
 * backing disk (unallocated ones), or served here (zero clusters,
 * compressed ones).  A write to a cluster that is not ours alone
 * (unallocated, zero, compressed, or shared with a snapshot) gets a new
 * cluster: the guest's bytes, and around them what the cluster read as
 * before (copy on write), then the L2 entry once the data is written.
 *
 * One iothread owns all of it (max_ctxs 1).  Writes that would allocate a
 * cluster another request is allocating wait for it (qcow2.txt does not
 * say; QEMU does the same): a cluster is allocated once.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "format/qcow2.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "loop/loop.h"
#include "util/barrier.h"
#include "util/log.h"
#include "util/sys.h"

struct q2_alloc {
	uint64_t gcl;		/* guest cluster */
	uint64_t host;		/* its new cluster */
	uint64_t old;		/* the L2 entry it replaces */
};

struct q2_req {
	struct bdev_io *io;	/* the guest's */
	/* Where a write's bytes come from: the guest's iovecs, or a cluster
	 * of zeroes (write zeroes done as a write). */
	const struct iovec *iov;
	unsigned iovcnt;
	struct qcow2_ctx *c;
	int res;
	unsigned pending;	/* I/Os out, +1 while being cut */
	uint64_t first, last;	/* guest clusters it touches */
	bool cor;		/* a read that copies what it reads from below up */
	struct q2_alloc *allocs;
	unsigned nallocs, acap;
	struct q2_req *next;	/* free list, waiting list */
	struct q2_req *anext, **aprev;	/* allocating list */
	uint64_t seq;		/* its number (qcow2.h, io_seq) */
};

struct q2_sub {
	struct bdev_io io;
	struct q2_req *r;
	void *buf;		/* a copy-on-write cluster */
	struct iovec *iov;
	unsigned cap;
	struct iovec one;
	struct q2_sub *next;	/* free list */
};

struct qcow2_ctx {
	struct qcow2 *q;
	struct loop *loop;
	uint8_t *zeroes;	/* one cluster, for write zeroes done as writes */
	struct iovec zero_iov;
	struct bdev_ctx *fctx;	/* the file's */
	struct bdev_ctx *bctx;	/* the backing disk's, or NULL */
	struct q2_req *free_reqs;
	struct q2_sub *free_subs;
	struct q2_req *allocating;
	struct q2_req *wait_head, **wait_tail;
	uint64_t inflight;	/* guest requests not completed */
	/* Writes whose regions are written ahead in the persistent bitmaps
	 * but not yet synced: they go on at the kick, after one sync for all
	 * of them (qcow2_bitmap.c, "Crash"). */
	struct bdev_io *wal_head, **wal_tail;
};

enum kind { K_UNALLOC, K_ZERO, K_NORMAL, K_COMPRESSED };

static void req_finish(struct q2_req *r);
static void q2_start(struct q2_req *r);

static inline struct qcow2_ctx *ctx_of(struct bdev_ctx *bc)
{
	return (struct qcow2_ctx *)bc;
}

/* Whether guest offset off reads from the backing chain when unallocated
 * here. */
static inline bool below(const struct qcow2 *q, uint64_t off)
{
	return q->backing && !q->standalone && off < q->backing->size;
}

static int cor_cluster(struct q2_req *r, uint64_t gcl, uint64_t in, size_t pos, size_t n);

/* What guest cluster gcl is now; *e its L2 entry.  0 or -errno. */
static int classify(struct qcow2 *q, uint64_t gcl, enum kind *k, uint64_t *e)
{
	uint8_t *l2;
	int r;

	*e = 0;
	*k = K_UNALLOC;
	l2 = qcow2_l2_get(q, gcl, false, &r);
	if (r < 0)
		return r;
	if (!l2)
		return 0;
	if ((r = qcow2_entry(q, l2, gcl, e)) < 0)
		return r;
	if (*e & QCOW2_OFLAG_COMPRESSED)
		*k = K_COMPRESSED;
	else if (*e & QCOW2_OFLAG_ZERO)
		*k = K_ZERO;
	else if (*e & QCOW2_OFFSET_MASK)
		*k = K_NORMAL;
	return 0;
}

static void req_put(struct q2_req *r, int res)
{
	if (res < 0 && r->res == 0)
		r->res = res;
	if (--r->pending == 0)
		req_finish(r);
}

static void sub_done(struct bdev_io *io, int res)
{
	struct q2_sub *s = container_of(io, struct q2_sub, io);
	struct q2_req *r = s->r;
	struct qcow2_ctx *c = r->c;

	free(s->buf);
	s->buf = NULL;
	s->next = c->free_subs;
	c->free_subs = s;
	req_put(r, res);
}

static struct q2_sub *sub_get(struct q2_req *r, enum bdev_op op, uint64_t off)
{
	struct qcow2_ctx *c = r->c;
	struct q2_sub *s = c->free_subs;

	if (s) {
		c->free_subs = s->next;
	} else {
		s = calloc(1, sizeof(*s));
		if (!s)
			return NULL;
	}
	s->r = r;
	s->buf = NULL;
	s->io = (struct bdev_io){ .op = op, .offset = off, .cb = sub_done };
	return s;
}

/* The guest's bytes [pos, pos+len) of r as s's iovecs. */
static int sub_slice(struct q2_sub *s, size_t pos, size_t len)
{
	const struct q2_req *r = s->r;
	unsigned n = iov_slice_count(r->iov, r->iovcnt, pos, len);

	if (!n)
		return -EINVAL;
	if (n == 1) {
		s->io.iov = &s->one;
	} else {
		if (n > s->cap) {
			struct iovec *v = realloc(s->iov, n * sizeof(*v));

			if (!v)
				return -ENOMEM;
			s->iov = v;
			s->cap = n;
		}
		s->io.iov = s->iov;
	}
	s->io.iovcnt = iov_slice(r->iov, r->iovcnt, pos, len, s->io.iov, n);
	return 0;
}

/* One I/O of r on disk d (the file or the backing disk). */
static int sub_submit(struct q2_req *r, struct bdev *d, struct bdev_ctx *dc, enum bdev_op op,
		      uint64_t off, size_t pos, size_t len, void *buf)
{
	struct q2_sub *s = sub_get(r, op, off);
	int res;

	if (!s)
		return -ENOMEM;
	if (buf) {
		s->buf = buf;
		s->one.iov_base = buf;
		s->one.iov_len = len;
		s->io.iov = &s->one;
		s->io.iovcnt = 1;
	} else if ((res = sub_slice(s, pos, len)) < 0) {
		s->next = r->c->free_subs;
		r->c->free_subs = s;
		return res;
	}
	r->pending++;
	bdev_submit(d, dc, &s->io);
	return 0;
}

/* A write of buf (ours) to the file, durable when it completes. */
static int sub_submit_fua(struct q2_req *r, uint64_t off, size_t len, void *buf)
{
	struct q2_sub *s = sub_get(r, BDEV_WRITE, off);

	if (!s) {
		free(buf);
		return -ENOMEM;
	}
	s->buf = buf;
	s->one.iov_base = buf;
	s->one.iov_len = len;
	s->io.iov = &s->one;
	s->io.iovcnt = 1;
	s->io.fua = true;
	r->pending++;
	bdev_submit(r->c->q->file, r->c->fctx, &s->io);
	return 0;
}

static struct q2_req *req_get(struct qcow2_ctx *c, struct bdev_io *io)
{
	struct q2_req *r = c->free_reqs;

	if (r) {
		c->free_reqs = r->next;
	} else {
		r = calloc(1, sizeof(*r));
		if (!r)
			return NULL;
	}
	r->io = io;
	r->iov = io->iov;
	r->iovcnt = io->iovcnt;
	r->c = c;
	r->res = 0;
	r->pending = 1;
	r->nallocs = 0;
	r->next = NULL;
	r->aprev = NULL;
	return r;
}

/* ---- Reads ----------------------------------------------------------- */

static void q2_read(struct q2_req *r)
{
	struct qcow2_ctx *c = r->c;
	struct qcow2 *q = c->q;
	struct bdev_io *io = r->io;
	uint64_t off = io->offset;
	size_t len = io->len, pos = 0;
	int res = 0;

	while (len && res == 0) {
		uint64_t gcl = off >> q->cluster_bits, in = off & (q->cs - 1), e, host = 0;
		size_t n = (size_t)MIN(len, q->cs - in);
		enum kind k, k2;

		if ((res = classify(q, gcl, &k, &e)) < 0)
			break;
		host = (e & QCOW2_OFFSET_MASK) + in;
		/* Runs: clusters of the same kind (allocated ones contiguous on
		 * the file) in one I/O. */
		while (n < len && (k == K_NORMAL || (k == K_UNALLOC && !r->cor) || k == K_ZERO)) {
			uint64_t e2;
			size_t more = (size_t)MIN(len - n, q->cs);

			if ((res = classify(q, gcl + 1, &k2, &e2)) < 0 || k2 != k)
				break;
			if (k == K_NORMAL &&
			    (e2 & QCOW2_OFFSET_MASK) != (e & QCOW2_OFFSET_MASK) + q->cs)
				break;
			gcl++;
			e = e2;
			n += more;
		}
		if (res < 0)
			break;
		switch (k) {
		case K_NORMAL:
			res = sub_submit(r, q->file, c->fctx, BDEV_READ, host, pos, n, NULL);
			break;
		case K_COMPRESSED:
			if ((res = qcow2_decompress(q, e)) == 0)
				iov_from_buf(io->iov, io->iovcnt, pos, q->zbuf + in, n);
			break;
		case K_UNALLOC:
			if (r->cor && below(q, off) && q->rw && !q->broken && !q->corrupt) {
				res = cor_cluster(r, gcl, in, pos, n);
				break;
			}
			if (below(q, off)) {
				size_t b = (size_t)MIN((uint64_t)n, q->backing->size - off);

				res = sub_submit(r, q->backing, c->bctx, BDEV_READ, off, pos, b, NULL);
				if (b < n)
					iov_memset(io->iov, io->iovcnt, pos + b, 0, n - b);
				break;
			}
			/* no backing data here */
			__attribute__((fallthrough));
		case K_ZERO:
			iov_memset(io->iov, io->iovcnt, pos, 0, n);
			break;
		}
		pos += n;
		off += n;
		len -= n;
	}
	req_put(r, res);
}

/* ---- Block status (format.h, fmt_block_status) ------------------------- */

int qcow2_block_status(struct qcow2 *q, uint64_t off, uint64_t len, struct fmt_extent *e)
{
	uint64_t gcl = off >> q->cluster_bits, n, ent;
	enum kind k, k2;
	int r;

	if ((r = classify(q, gcl, &k, &ent)) < 0)
		return r;
	n = MIN(len, q->cs - (off & (q->cs - 1)));
	/* A run of clusters of one kind (the whole request at most). */
	while (n < len) {
		if ((r = classify(q, gcl + 1, &k2, &ent)) < 0)
			return r;
		if (k2 != k)
			break;
		gcl++;
		n += MIN(len - n, q->cs);
	}
	*e = (struct fmt_extent){ .length = n, .flags = 0, .depth = 1 };
	switch (k) {
	case K_NORMAL:
	case K_COMPRESSED:
		return 0;
	case K_ZERO:
		e->flags = FMT_EXT_HOLE | FMT_EXT_ZERO;
		return 0;
	case K_UNALLOC:
		break;
	}
	if (below(q, off)) {
		struct fmt_extent b;

		r = fmt_block_status(q->backing, off, MIN(n, q->backing->size - off), &b);
		if (r < 0)
			return r;
		*e = (struct fmt_extent){ .length = b.length, .flags = b.flags,
					  .depth = b.depth ? b.depth + 1 : 0 };
		return 0;
	}
	/* Past the backing file's end, or no backing file: zeroes. */
	e->flags = FMT_EXT_HOLE | FMT_EXT_ZERO;
	e->depth = 0;
	return 0;
}

/* ---- Writes ---------------------------------------------------------- */

static bool overlaps_allocating(struct qcow2_ctx *c, const struct q2_req *r)
{
	for (struct q2_req *a = c->allocating; a; a = a->anext)
		if (a != r && a->first <= r->last && r->first <= a->last)
			return true;
	return false;
}

static int add_alloc(struct q2_req *r, uint64_t gcl, uint64_t host, uint64_t old)
{
	if (r->nallocs == r->acap) {
		unsigned cap = r->acap ? r->acap * 2 : 4;
		struct q2_alloc *a = realloc(r->allocs, cap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		r->allocs = a;
		r->acap = cap;
	}
	r->allocs[r->nallocs++] = (struct q2_alloc){ gcl, host, old };
	if (!r->aprev) {
		struct qcow2_ctx *c = r->c;

		r->anext = c->allocating;
		if (c->allocating)
			c->allocating->aprev = &r->anext;
		r->aprev = &c->allocating;
		c->allocating = r;
	}
	return 0;
}

/* A new cluster for gcl, written with the guest's [pos, pos+n) at in and
 * what the cluster read as before around it. */
static int write_new(struct q2_req *r, uint64_t gcl, enum kind k, uint64_t e, uint64_t in,
		     size_t pos, size_t n)
{
	struct qcow2_ctx *c = r->c;
	struct qcow2 *q = c->q;
	uint64_t host;
	uint8_t *buf;
	int res;

	/* The table must be ours to change before anything is written. */
	if (!qcow2_l2_get(q, gcl, true, &res))
		return res ? res : -EIO;
	host = qcow2_alloc(q, &res);
	if (!host)
		return res;
	if ((res = add_alloc(r, gcl, host, e)) < 0) {
		qcow2_unalloc(q, host);
		return res;
	}
	/* A new cluster reads as zeroes: when the old one did too, only the
	 * guest's bytes need writing. */
	if (n == q->cs || k == K_ZERO ||
	    (k == K_UNALLOC && !below(q, gcl << q->cluster_bits)))
		return sub_submit(r, q->file, c->fctx, BDEV_WRITE, host + in, pos, n, NULL);
	if (posix_memalign((void **)&buf, 4096, q->cs))
		return -ENOMEM;
	res = qcow2_read_sync(q, gcl << q->cluster_bits, buf, q->cs);
	if (res < 0) {
		free(buf);
		return res;
	}
	iov_to_buf(r->iov, r->iovcnt, pos, buf + in, n);
	q->cow_bytes += q->cs - n;
	/* Bytes the guest did not write, copied from below: durable before
	 * the L2 entry can reach the disk (the entry goes to the file when
	 * the request completes), or a power cut could leave the entry
	 * pointing at a cluster without them. */
	return sub_submit_fua(r, host, q->cs, buf);
}

/* Copy on read (--copy-on-read, and vblkctl stream): an unallocated
 * cluster read from below, whole, synchronously; the guest's part given
 * to it; the cluster written into a new cluster of ours (with FUA: the
 * entry must never point at a cluster whose bytes a power cut could
 * lose) and the entry set when that is done, as a write would.  A cluster
 * that reads as zeroes below is left alone: unallocated, it reads zeroes
 * without the backing file too. */
static int cor_cluster(struct q2_req *r, uint64_t gcl, uint64_t in, size_t pos, size_t n)
{
	struct qcow2 *q = r->c->q;
	uint64_t host;
	uint8_t *buf;
	int res;

	if (posix_memalign((void **)&buf, 4096, q->cs))
		return -ENOMEM;
	if ((res = qcow2_read_sync(q, gcl << q->cluster_bits, buf, q->cs)) < 0) {
		free(buf);
		return res;
	}
	iov_from_buf(r->io->iov, r->io->iovcnt, pos, buf + in, n);
	if (buf[0] == 0 && !memcmp(buf, buf + 1, q->cs - 1)) {
		free(buf);
		return 0;
	}
	if (!qcow2_l2_get(q, gcl, true, &res)) {
		free(buf);
		return res ? res : -EIO;
	}
	host = qcow2_alloc(q, &res);
	if (!host) {
		free(buf);
		return res;
	}
	if ((res = add_alloc(r, gcl, host, 0)) < 0) {
		qcow2_unalloc(q, host);
		free(buf);
		return res;
	}
	q->cor_bytes += q->cs;
	return sub_submit_fua(r, host, q->cs, buf);
}

/* Write [off, off+len) of the disk with r's bytes from pos on. */
static int write_span(struct q2_req *r, uint64_t off, size_t len, size_t pos)
{
	struct qcow2 *q = r->c->q;
	int res = 0;

	while (len && res == 0) {
		uint64_t gcl = off >> q->cluster_bits, in = off & (q->cs - 1), e;
		size_t n = (size_t)MIN(len, q->cs - in);
		enum kind k;

		if ((res = classify(q, gcl, &k, &e)) < 0)
			break;
		if (k == K_NORMAL && (e & QCOW2_OFLAG_COPIED)) {
			/* Ours alone: write in place; neighbours on the file in
			 * one I/O. */
			uint64_t host = (e & QCOW2_OFFSET_MASK) + in, e2;
			enum kind k2;

			while (n < len) {
				if ((res = classify(q, gcl + 1, &k2, &e2)) < 0)
					break;
				if (k2 != K_NORMAL || !(e2 & QCOW2_OFLAG_COPIED) ||
				    (e2 & QCOW2_OFFSET_MASK) != (e & QCOW2_OFFSET_MASK) + q->cs)
					break;
				gcl++;
				e = e2;
				n += (size_t)MIN(len - n, q->cs);
			}
			if (res == 0)
				res = sub_submit(r, q->file, r->c->fctx, BDEV_WRITE, host, pos, n, NULL);
		} else {
			res = write_new(r, gcl, k, e, in, pos, n);
		}
		pos += n;
		off += n;
		len -= n;
	}
	return res;
}

/* ---- Discard and write zeroes ---------------------------------------- */

/* Whole guest cluster gcl after a discard or a write of zeroes, as
 * QEMU's qcow2 driver does it (discard_in_l2_slice, zero_in_l2_slice):
 * v3 has the zero flag (qcow2.txt, "Standard Cluster Descriptor", bit 0);
 * v2 only "unallocated", which reads zeroes where no backing file shows
 * through.  A cluster dropped is freed at the next flush.  1 when the
 * cluster must be written with zeroes instead (v2 over a backing file),
 * else 0 or -errno. */
static int zero_cluster(struct q2_req *r, uint64_t gcl, bool discard)
{
	struct qcow2 *q = r->c->q;
	bool under = below(q, gcl << q->cluster_bits);
	uint64_t e, ne, be;
	enum kind k;
	uint8_t *l2;
	bool drop;
	int res;

	if ((res = classify(q, gcl, &k, &e)) < 0)
		return res;
	if (k == K_UNALLOC && !under)
		return 0;			/* reads zeroes already */
	if (q->version < 3) {
		if (under && !discard)
			return 1;
		ne = 0;				/* discard may show the backing file */
		drop = true;
	} else if (discard || r->io->unmap || k == K_COMPRESSED || k == K_UNALLOC ||
		   (k == K_NORMAL && !(e & QCOW2_OFLAG_COPIED))) {
		ne = QCOW2_OFLAG_ZERO;
		drop = true;
	} else {
		/* Zeroes without unmap: the cluster stays allocated, flagged. */
		ne = e | QCOW2_OFLAG_ZERO;
		drop = false;
	}
	if (k == K_ZERO && !drop && e == ne)
		return 0;
	if (!(l2 = qcow2_l2_get(q, gcl, true, &res)))
		return res ? res : -EIO;
	be = htobe64(ne);
	memcpy(l2 + (gcl & (q->l2_entries - 1)) * 8, &be, 8);
	qcow2_l2_dirty(q, gcl);
	if (drop && (e & (QCOW2_OFFSET_MASK | QCOW2_OFLAG_COMPRESSED)))
		qcow2_free_later(q, e);
	q->zeroed++;
	return 0;
}

/* Write zeroes on part of a cluster: nothing to do where it reads
 * zeroes already. */
static int zero_part(struct q2_req *r, uint64_t off, uint64_t len)
{
	struct qcow2 *q = r->c->q;
	uint64_t gcl = off >> q->cluster_bits, e;
	enum kind k;
	int res;

	if ((res = classify(q, gcl, &k, &e)) < 0)
		return res;
	if (k == K_ZERO ||
	    (k == K_UNALLOC && !below(q, gcl << q->cluster_bits)))
		return 0;
	return write_span(r, off, (size_t)len, 0);
}

/* Discard (whole clusters only: the rest is advisory, as in QEMU) or
 * write zeroes (the parts of clusters written as zeroes). */
static int q2_dwz(struct q2_req *r)
{
	struct qcow2_ctx *c = r->c;
	struct qcow2 *q = c->q;
	bool discard = r->io->op == BDEV_DISCARD;
	uint64_t off = r->io->offset, end = off + r->io->length;
	uint64_t a = (off + q->cs - 1) & ~(q->cs - 1), b = end & ~(q->cs - 1);
	int res = 0;

	r->iov = &c->zero_iov;
	r->iovcnt = 1;
	if (a >= b)			/* inside one cluster, or two partly */
		a = b = MIN(end, a);
	if (!discard && off < a && (res = zero_part(r, off, a - off)) < 0)
		return res;
	for (uint64_t x = a; x < b && res >= 0; x += q->cs) {
		res = zero_cluster(r, x >> q->cluster_bits, discard);
		if (res == 1)
			res = write_span(r, x, (size_t)q->cs, 0);
	}
	if (res < 0)
		return res;
	if (!discard && b < end)
		res = zero_part(r, b, end - b);
	return res;
}

static void q2_start(struct q2_req *r)
{
	struct qcow2_ctx *c = r->c;
	int res;

	if (overlaps_allocating(c, r)) {
		/* Another request is allocating one of our clusters: after it. */
		r->next = NULL;
		*c->wait_tail = r;
		c->wait_tail = &r->next;
		return;
	}
	if (r->io->op == BDEV_READ) {
		q2_read(r);
		return;
	}
	/* Found corrupt while this one waited: no more writes. */
	if (c->q->corrupt || c->q->broken) {
		req_put(r, -EIO);
		return;
	}
	if (r->io->op == BDEV_WRITE)
		res = write_span(r, r->io->offset, r->io->len, 0);
	else
		res = q2_dwz(r);
	req_put(r, res);
}

/* The data is written (or not): point the L2 entries at the new
 * clusters, or give the clusters back. */
static void commit_allocs(struct q2_req *r)
{
	struct qcow2 *q = r->c->q;

	for (unsigned i = 0; i < r->nallocs; i++) {
		struct q2_alloc *a = &r->allocs[i];
		uint8_t *l2;
		int res = 0;

		if (r->res == 0) {
			l2 = qcow2_l2_get(q, a->gcl, true, &res);
			if (l2) {
				uint64_t e = htobe64(a->host | QCOW2_OFLAG_COPIED);

				memcpy(l2 + (a->gcl & (q->l2_entries - 1)) * 8, &e, 8);
				qcow2_l2_dirty(q, a->gcl);
				if (a->old & (QCOW2_OFFSET_MASK | QCOW2_OFLAG_COMPRESSED))
					qcow2_free_later(q, a->old);
				continue;
			}
			r->res = res ? res : -EIO;
		}
		qcow2_unalloc(q, a->host);
	}
	r->nallocs = 0;
}

static void req_finish(struct q2_req *r)
{
	struct qcow2_ctx *c = r->c;
	struct bdev_io *io = r->io;
	int res = r->res;

	if (r->aprev) {
		commit_allocs(r);
		res = r->res;
		*r->aprev = r->anext;
		if (r->anext)
			r->anext->aprev = r->aprev;
		r->aprev = NULL;
	}
	/* What this request changed in the tables reaches the file before
	 * the guest hears it is done (qcow2.h, qcow2_write_through). */
	if (c->q->l2c.ndirty || c->q->l1_dirty_hi > c->q->l1_dirty_lo) {
		int w = qcow2_write_through(c->q);

		if (w < 0 && res == 0)
			res = w;
	}
	/* What waits in quarantine for the requests running when it was
	 * freed may be reused once they are all done (qcow2.h). */
	c->q->io_running--;
	if (unlikely(r->seq <= c->q->quarantine_seq) && c->q->quarantine_left)
		c->q->quarantine_left--;
	r->next = c->free_reqs;
	c->free_reqs = r;
	c->inflight--;
	/* The ones that waited for an allocation try again (in order). */
	if (c->wait_head && !c->allocating) {
		struct q2_req *w = c->wait_head;

		c->wait_head = NULL;
		c->wait_tail = &c->wait_head;
		while (w) {
			struct q2_req *n = w->next;

			q2_start(w);
			w = n;
		}
	} else if (c->wait_head) {
		struct q2_req **p = &c->wait_head, *w;

		/* Only those clear of every allocation still running. */
		while ((w = *p)) {
			if (overlaps_allocating(c, w)) {
				p = &w->next;
				continue;
			}
			*p = w->next;
			if (c->wait_tail == &w->next)
				c->wait_tail = p;
			q2_start(w);
		}
	}
	bdev_complete(io, res);
}

/* ---- vblkctl stream's units (format.h, fmt_stream_*) ---------------- */

int qcow2_stream_check(struct qcow2 *q, char *err, size_t errlen)
{
	if (!q->backing || q->standalone) {
		snprintf(err, errlen, "qcow2 image %s has no backing file: nothing to stream",
			 q->path);
		return -EINVAL;
	}
	if (!q->rw || q->broken || q->corrupt) {
		snprintf(err, errlen, "qcow2 image %s is %s: it cannot be written", q->path,
			 !q->rw ? "read-only" : q->corrupt ? "corrupt (qemu-img check -r all repairs it)" :
			 "broken (a metadata write failed)");
		return q->rw ? -EIO : -EROFS;
	}
	if (!q->ctx || q->stale) {
		snprintf(err, errlen, "no VM runs on %s here (no ring has started): start the "
			 "stream while the VM runs", q->path);
		return -EAGAIN;
	}
	return 0;
}

void qcow2_stream_active(struct qcow2 *q, bool on)
{
	q->streaming = on;
	if (on)
		q->stream_pos = 0;
}

/* Allocated clusters cost only a look: a few thousand at a time, then
 * the loop gets a turn. */
#define STREAM_LOOKS 4096

int qcow2_stream_next(struct qcow2 *q, uint64_t *pos, uint64_t *len, char *err, size_t errlen)
{
	uint64_t next = *pos >> q->cluster_bits;
	uint64_t end = (q->disk.size + q->cs - 1) >> q->cluster_bits, e;
	unsigned looked = 0;
	enum kind k;

	if (q->corrupt || q->broken) {
		snprintf(err, errlen, "%s", q->corrupt ? "the image is corrupt" :
			 "a metadata write failed");
		return -EIO;
	}
	for (; next < end; next++) {
		uint64_t off = next << q->cluster_bits;

		if (++looked > STREAM_LOOKS) {
			*pos = q->stream_pos = off;
			return 2;
		}
		if (classify(q, next, &k, &e) < 0) {
			snprintf(err, errlen, "the image's tables could not be read");
			return -EIO;
		}
		if (k == K_UNALLOC && below(q, off)) {
			*pos = q->stream_pos = off;
			*len = MIN(q->cs, q->disk.size - off);
			return 1;
		}
	}
	*pos = q->stream_pos = q->disk.size;
	return 0;
}

/* Every cluster is ours: durable, then the header without the backing
 * file. */
int qcow2_stream_finish(struct qcow2 *q, char *msg, size_t len)
{
	char *name = q->backing_name ? strdup(q->backing_name) : NULL;

	if (qcow2_flush(q) < 0 || qcow2_drop_backing(q) < 0) {
		free(name);
		snprintf(msg, len, "writing qcow2 image %s back failed", q->path);
		return -EIO;
	}
	q->standalone = true;
	snprintf(msg, len, "stream done, %llu MiB copied up; qcow2 image %s no longer needs "
		 "its backing file %s", (unsigned long long)(q->cor_bytes >> 20), q->path,
		 name ? name : "");
	free(name);
	return 0;
}

/* ---- Engine ops ------------------------------------------------------ */

static int q2_ctx_new(struct bdev *b, struct loop *l, unsigned depth, struct bdev_ctx **out)
{
	struct qcow2 *q = container_of(b, struct qcow2, disk);
	struct qcow2_ctx *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->q = q;
	c->loop = l;
	c->wait_tail = &c->wait_head;
	c->wal_tail = &c->wal_head;
	if (posix_memalign((void **)&c->zeroes, 4096, q->cs)) {
		free(c);
		return -ENOMEM;
	}
	memset(c->zeroes, 0, q->cs);
	c->zero_iov = (struct iovec){ c->zeroes, q->cs };
	r = bdev_ctx_new(q->file, l, depth, &c->fctx);
	if (r < 0)
		goto fail;
	if (q->backing && (r = bdev_ctx_new(q->backing, l, depth, &c->bctx)) < 0) {
		q->file->engine->ctx_free(c->fctx);
		goto fail;
	}
	q->ctx = c;
	*out = (struct bdev_ctx *)c;
	return 0;
fail:
	free(c->zeroes);
	free(c);
	return r;
}

static void q2_ctx_free(struct bdev_ctx *bc)
{
	struct qcow2_ctx *c = ctx_of(bc);

	if (c->bctx)
		c->q->backing->engine->ctx_free(c->bctx);
	c->q->file->engine->ctx_free(c->fctx);
	while (c->free_reqs) {
		struct q2_req *r = c->free_reqs;

		c->free_reqs = r->next;
		free(r->allocs);
		free(r);
	}
	while (c->free_subs) {
		struct q2_sub *s = c->free_subs;

		c->free_subs = s->next;
		free(s->iov);
		free(s);
	}
	if (c->q->ctx == c)
		c->q->ctx = NULL;
	free(c->zeroes);
	free(c);
}

static void q2_submit(struct bdev_ctx *bc, struct bdev_io *io)
{
	struct qcow2_ctx *c = ctx_of(bc);
	struct qcow2 *q = c->q;
	uint64_t len, size;
	struct q2_req *r;

	switch (io->op) {
	case BDEV_FLUSH:
		/* Every write completed so far, and its metadata, durable. */
		bdev_complete(io, qcow2_flush(q));
		return;
	case BDEV_READ:
		len = io->len;
		break;
	case BDEV_WRITE:
		len = io->len;
		goto writes;
	case BDEV_DISCARD:
	case BDEV_WRITE_ZEROES:
		len = io->length;
writes:
		/* A corrupt image takes no more writes (qcow2_corrupt). */
		if (!q->rw || q->broken || q->corrupt) {
			bdev_complete(io, q->rw ? -EIO : -EROFS);
			return;
		}
		break;
	default:
		bdev_complete(io, -EOPNOTSUPP);
		return;
	}
	size = READ_ONCE(q->disk.size);	/* grows: q2_resize */
	if (len == 0 || io->offset > size || len > size - io->offset) {
		bdev_complete(io, len ? -EINVAL : 0);
		return;
	}
	/* The first write to the image (a copy on read writes too). */
	if (unlikely(!q->write_begun) &&
	    (io->op != BDEV_READ || ((q->copy_on_read || io->copy_up) && q->backing &&
				     !q->standalone && q->rw && !q->corrupt && !q->broken))) {
		int res = qcow2_begin_write(q);

		if (res < 0) {
			bdev_complete(io, res);
			return;
		}
	}
	/* Persistent bitmaps: the regions a write touches set in the image
	 * first (qcow2_bitmap.c, "Crash"); written ahead but not synced yet:
	 * it waits for the kick, which syncs once for every such write of
	 * the pass (group commit). */
	if (unlikely(q->wal_on) && io->op != BDEV_READ) {
		int res = qcow2_bm_wal_cover(q, io->offset, len);

		if (res < 0) {
			bdev_complete(io, res);
			return;
		}
		if (res > 0) {
			io->next = NULL;
			*c->wal_tail = io;
			c->wal_tail = &io->next;
			return;
		}
	}
	r = req_get(c, io);
	if (!r) {
		bdev_complete(io, -ENOMEM);
		return;
	}
	c->inflight++;
	r->seq = ++q->io_seq;
	q->io_running++;
	r->first = io->offset >> q->cluster_bits;
	r->last = (io->offset + len - 1) >> q->cluster_bits;
	r->cor = io->op == BDEV_READ && (q->copy_on_read || io->copy_up) &&
		 q->backing && !q->standalone && q->rw;
	if (io->op == BDEV_READ && !r->cor)
		q2_read(r);
	else
		q2_start(r);		/* may allocate: after overlapping allocations */
}

static void q2_kick(struct bdev_ctx *bc)
{
	struct qcow2_ctx *c = ctx_of(bc);

	/* The writes that waited for their bitmap regions: one sync, then
	 * they go on (again if a store in between made them wait anew). */
	while (unlikely(c->wal_head != NULL)) {
		struct bdev_io *io = c->wal_head, *next;
		int res = qcow2_bm_wal_sync(c->q);

		c->wal_head = NULL;
		c->wal_tail = &c->wal_head;
		for (; io; io = next) {
			next = io->next;
			if (res < 0)
				bdev_complete(io, res);
			else
				q2_submit(bc, io);
		}
	}
	c->q->file->engine->kick(c->fctx);
	if (c->bctx)
		c->q->backing->engine->kick(c->bctx);
}

static void q2_drain(struct bdev_ctx *bc)
{
	struct qcow2_ctx *c = ctx_of(bc);

	/* Completions may start more I/O (a waiting write): until none. */
	while (c->inflight || c->wal_head) {
		q2_kick(bc);
		c->q->file->engine->drain(c->fctx);
		if (c->bctx)
			c->q->backing->engine->drain(c->bctx);
	}
}

static uint64_t q2_submits(const struct bdev_ctx *bc)
{
	const struct qcow2_ctx *c = (const struct qcow2_ctx *)bc;

	return bdev_ctx_submits(c->q->file, c->fctx);
}

static uint64_t q2_polled(const struct bdev_ctx *bc)
{
	const struct qcow2_ctx *c = (const struct qcow2_ctx *)bc;

	return bdev_ctx_polled(c->q->file, c->fctx);
}

static uint64_t q2_sync_ios(const struct bdev_ctx *bc)
{
	const struct qcow2_ctx *c = (const struct qcow2_ctx *)bc;

	return bdev_ctx_sync_ios(c->q->file, c->fctx);
}

static void q2_spin_stats(const struct bdev_ctx *bc, struct bdev_spin_stats *s)
{
	const struct qcow2_ctx *c = (const struct qcow2_ctx *)bc;

	bdev_ctx_spin_stats(c->q->file, c->fctx, s);
}

/* ---- From the main thread: on the iothread that owns the tables ------ */

struct q2_call {
	struct qcow2 *q;
	uint64_t size;		/* grow */
	struct dbm *const *b;	/* bitmaps: store */
	struct dbm ***out;	/* bitmaps: load */
	unsigned n, *nout;
	bool changed;
	char *err;
	size_t errlen;
	int res;
};

/* fn(c) on q's iothread (between requests; a stream's bh may run there),
 * or here while no iothread serves q. */
static int on_iothread(struct q2_call *c, loop_cb fn)
{
	if (c->q->ctx)
		loop_call_sync(c->q->ctx->loop, fn, c);
	else
		fn(c);
	return c->res;
}

static void grow_fn(void *opaque)
{
	struct q2_call *g = opaque;

	g->res = qcow2_grow(g->q, g->size, g->err, g->errlen);
}

/* bdev_resize publishes the new size after. */
static int q2_resize(struct bdev *b, uint64_t size, char *err, size_t errlen)
{
	struct qcow2 *q = container_of(b, struct qcow2, disk);

	/* The tables may be another process's now (a migration's source, the
	 * VM not started here yet). */
	if (q->stale) {
		snprintf(err, errlen, "qcow2 image %s is not served here yet (no ring has "
			 "started since vblkd started or the VM stopped): resize it while the VM "
			 "runs on this vblkd", q->path);
		return -EAGAIN;
	}
	return on_iothread(&(struct q2_call){ .q = q, .size = size, .err = err,
					      .errlen = errlen }, grow_fn);
}

static void quiesce_fn(void *opaque)
{
	struct q2_call *c = opaque;

	c->res = qcow2_quiesce(c->q, c->err, c->errlen);
}

/* The rings stopped. */
int qcow2_io_quiesce(struct qcow2 *q, char *err, size_t errlen)
{
	return on_iothread(&(struct q2_call){ .q = q, .err = err, .errlen = errlen }, quiesce_fn);
}

static void claim_fn(void *opaque)
{
	struct q2_call *c = opaque;

	c->res = qcow2_reload(c->q, c->err, c->errlen);
}

/* No ring running. */
int qcow2_io_claim(struct qcow2 *q, char *err, size_t errlen)
{
	int r;

	if (!q->stale)
		return 0;
	r = on_iothread(&(struct q2_call){ .q = q, .err = err, .errlen = errlen }, claim_fn);
	if (r == 0)
		log_info("qcow2 image %s: tables read again, as the disk is ours now", q->path);
	return r;
}

static void release_fn(void *opaque)
{
	struct q2_call *c = opaque;
	struct qcow2 *q = c->q;
	struct qcow2_ctx *x = q->ctx;

	/* A job's units too (job_disk_released failed the jobs first). */
	if (x)
		q2_drain((struct bdev_ctx *)x);
	/* Drained, a failed stream has concluded (its unit completed in the
	 * drain).  One still marked running is stuck: it submits nothing
	 * more, and the tables must be written back whatever it says
	 * (qcow2_quiesce refuses while a stream runs, for upgrades). */
	if (q->streaming) {
		log_err("qcow2 image %s: a stream job was still marked running when the disk was "
			"let go; the tables are written back regardless", q->path);
		q->streaming = false;
	}
	if (!q->rw || q->stale)
		return;
	/* Corrupt: what completed made durable, nothing else written (the
	 * reserve leaks); said already. */
	if (q->corrupt)
		(void)qcow2_flush(q);
	else if (qcow2_quiesce(q, c->err, c->errlen) < 0)
		log_err("%s", c->err);
	q->stale = true;
}

void qcow2_io_release(struct qcow2 *q)
{
	char err[256];

	on_iothread(&(struct q2_call){ .q = q, .err = err, .errlen = sizeof(err) }, release_fn);
}

static void bm_load_fn(void *opaque)
{
	struct q2_call *c = opaque;

	c->res = qcow2_bm_load(c->q, c->out, c->nout, c->err, c->errlen);
}

int qcow2_io_bitmaps_load(struct qcow2 *q, struct dbm ***out, unsigned *n, char *err,
			  size_t errlen)
{
	return on_iothread(&(struct q2_call){ .q = q, .out = out, .nout = n, .err = err,
					      .errlen = errlen }, bm_load_fn);
}

static void bm_hold_fn(void *opaque)
{
	struct q2_call *c = opaque;

	c->res = qcow2_bm_hold(c->q, c->b, c->n, c->changed);
}

int qcow2_io_bitmaps_hold(struct qcow2 *q, struct dbm *const *b, unsigned n, bool force)
{
	return on_iothread(&(struct q2_call){ .q = q, .b = b, .n = n, .changed = force },
			   bm_hold_fn);
}

struct bm_fit_call {
	struct q2_call c;
	const char *name;
	uint32_t gran;
};

static void bm_fit_fn(void *opaque)
{
	struct bm_fit_call *f = opaque;

	f->c.res = qcow2_bm_fit(f->c.q, f->name, f->gran, f->c.size, f->c.err, f->c.errlen);
}

int qcow2_io_bitmaps_fit(struct qcow2 *q, const char *name, uint32_t gran, uint64_t size,
			 char *err, size_t errlen)
{
	struct bm_fit_call f = { .c = { .q = q, .size = size, .err = err, .errlen = errlen },
				 .name = name, .gran = gran };

	return on_iothread(&f.c, bm_fit_fn);
}

static void bm_store_fn(void *opaque)
{
	struct q2_call *c = opaque;

	/* What was written goes first (the data the bitmaps describe). */
	if (c->q->ctx)
		q2_drain((struct bdev_ctx *)c->q->ctx);
	c->res = qcow2_bm_store(c->q, c->b, c->n, c->changed, false, c->err, c->errlen);
}

int qcow2_io_bitmaps_store(struct qcow2 *q, struct dbm *const *b, unsigned n, bool changed,
			   char *err, size_t errlen)
{
	return on_iothread(&(struct q2_call){ .q = q, .b = b, .n = n, .changed = changed,
					      .err = err, .errlen = errlen }, bm_store_fn);
}

struct bm_kept_call {
	struct qcow2 *q;
	struct fmt_bitmap_kept *out;
	unsigned max, n;
};

static void bm_kept_fn(void *opaque)
{
	struct bm_kept_call *c = opaque;

	c->n = qcow2_bm_kept(c->q, c->out, c->max);
}

unsigned qcow2_io_bitmaps_kept(struct qcow2 *q, struct fmt_bitmap_kept *out, unsigned max)
{
	struct bm_kept_call c = { .q = q, .out = out, .max = max };

	if (q->ctx)
		loop_call_sync(q->ctx->loop, bm_kept_fn, &c);
	else
		bm_kept_fn(&c);
	return c.n;
}

bool qcow2_io_is(const struct bdev_engine *e)
{
	return e && e->ctx_new == q2_ctx_new;
}

void qcow2_io_engine(struct bdev_engine *e, const char *name)
{
	*e = (struct bdev_engine){
		.name = name,
		.ctx_new = q2_ctx_new,
		.ctx_free = q2_ctx_free,
		.submit = q2_submit,
		.kick = q2_kick,
		.drain = q2_drain,
		.submits = q2_submits,
		.polled = q2_polled,
		.sync_ios = q2_sync_ios,
		.spin_stats = q2_spin_stats,
		.resize = q2_resize,
	};
}
