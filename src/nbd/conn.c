/*
 * One NBD client, on its iothread: the handshake ("Fixed newstyle
 * negotiation", "Option haggling") and the transmission phase, as a
 * state machine over a non-blocking socket.  Every length the client
 * sends is checked against a bound before it is used; a request the
 * spec lets us refuse gets the spec's error and the connection goes on;
 * what leaves no way to find the next message (a bad magic, a huge
 * EXPORT_NAME) ends this connection alone.
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "disk/disk.h"
#include "format/format.h"
#include "loop/loop.h"
#include "nbd/nbds_internal.h"
#include "util/barrier.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sys.h"

enum cstate {
	CS_CLIENT_FLAGS,	/* 32 bits of client flags */
	CS_OPT_HDR,		/* an option's 16-byte header */
	CS_OPT_DATA,		/* its data, into c->opt */
	CS_OPT_SKIP,		/* data over NBDS_OPT_MAX, thrown away */
	CS_REQ_HDR,		/* a request's 28-byte header */
	CS_REQ_DATA,		/* a write's payload, into c->cur->buf */
	CS_REQ_SKIP,		/* a refused write's payload, thrown away */
};

/* Something to send: up to three pieces, freed by done once sent (or
 * when the connection goes). */
struct out {
	struct out *next;
	struct iovec iov[3];
	unsigned cnt;
	size_t held;			/* bytes counted in c->held */
	void (*done)(struct out *o);
};

struct nbds_req {
	struct nbds_conn *c;
	struct bdev_io io;
	struct iovec iov;
	uint16_t flags, type;
	uint64_t cookie, offset;
	uint32_t length;
	void *buf;			/* read/write data, aligned */
	size_t cap;			/* buf's size (a pooled request keeps it) */
	struct nbds_req *pool_next;
	struct nbds_req *thr_next;	/* parked for the QoS budget */
	struct nbds_req *held_next;	/* held by the error policy */
	uint64_t t0;			/* submitted (loop time), for accounting */
	size_t got;			/* write payload received */
	int err;			/* NBD error to reply (0: none) */
	struct out out;
	union {
		struct nbd_simple_reply s;
		struct {
			struct nbd_chunk ch;
			uint64_t offset;
		} __attribute__((packed)) data;
		struct {
			struct nbd_chunk ch;
			uint32_t error;
			uint16_t msg_len;
		} __attribute__((packed)) error;
	} rh;
};

struct nbds_conn {
	struct nbds *srv;
	struct nbds_export *ex;
	struct disk *disk;
	struct disk_iothread *t;
	int fd;
	struct loop_fd *h;		/* NULL once broken */
	uint32_t events;
	struct loop_timer *hs_timer;
	struct loop_bh *flush_bh;
	enum cstate st;
	bool transmission;
	bool structured, no_zeroes;
	/* Metadata contexts selected (NBD_OPT_SET_META_CONTEXT); a dirty
	 * bitmap by name (looked up at each use: dirty.c's rule), counted in
	 * its users while selected. */
	bool meta_base, meta_depth, meta_dirty;
	char meta_bitmap[DBM_NAME_MAX + 1];
	/* TLS: the session once STARTTLS was accepted; the handshake runs
	 * until tls_up, waiting for tls_events. */
	struct nbds_tls_sess *tls;
	bool tls_up;
	uint32_t tls_events;
	/* TLS output staged into one record: tls_staged bytes of the queue
	 * from oq_off, copied into tls_stage, sent again as they are after
	 * -EAGAIN (GnuTLS's rule). */
	uint8_t *tls_stage;
	size_t tls_staged;
	bool closing;			/* read no more; close when all is sent */
	bool broken;			/* the socket failed: send nothing more */
	bool finished;			/* handed to the main thread */
	bool read_only;
	/* Input: bytes [in_pos, in_len) of in are received, not parsed. */
	uint8_t *in;
	size_t in_pos, in_len;
	/* The option being read. */
	uint32_t opt, opt_len;
	uint8_t *opt_data;
	size_t opt_got;
	uint64_t skip_left;
	/* QoS (disk_admit): requests the budget cannot take now, in the
	 * order they came (counted in inflight); while any waits, nothing
	 * more is read (the client's socket fills: its back-pressure). */
	struct nbds_req *thr_head, **thr_tail;
	struct qos_turn qos_turn;
	/* Yielding (a source with busy, "Yielding" below): the export's
	 * state on this iothread (NULL: no yielding); the guest was busy at
	 * the end of this connection's last pass. */
	struct nbds_yield *ys;
	bool yielding;
	struct loop_timer *qos_timer;
	/* The error policy (disk.h, disk_hold): failed requests it stops
	 * on, in order (counted in inflight), submitted again at resume;
	 * nothing more is read while any is held or the disk is paused. */
	struct nbds_req *held_head, **held_tail;
	unsigned nheld;
	/* Per-operation accounting (acct.h), as the virtio-blk queues keep
	 * it: the disk's front="nbd" series (nbds__conn_acct). */
	struct acct acct;
	/* Polling (conn_poll_ops): requests taken, for the loop's pay
	 * check; the last receive of conn_poll was short (nothing more
	 * queued, conn_read need not ask again). */
	uint64_t taken;
	bool in_drained;
	/* Coalescing (conn_moderate): the client pipelines, so the loop
	 * waits CONN_MOD_NS after a pass before taking more (mod_on); off,
	 * one pass in CONN_MOD_PROBE tries it again (mod_skip counts down);
	 * mod_waited: the pass now running came after such a wait. */
	bool mod_on, mod_waited;
	unsigned mod_skip;
	/* Transmission. */
	struct nbds_req *cur;		/* the write whose payload is coming */
	unsigned inflight;
	size_t held;
	/* Requests done with, buffers kept: no allocation per request once
	 * a connection runs (NBDS_POOL_*). */
	struct nbds_req *pool;
	unsigned npool;
	size_t pool_bytes;
	struct out *oq, **oq_tail;
	unsigned noq;			/* outs on oq (NBDS_MAX_QUEUED) */
	size_t oq_off;			/* bytes of oq's head sent */
	bool want_out;			/* EPOLLOUT: the socket was full */
	/* Main thread. */
	struct nbds_conn *next_all, *next_dead;
};

static void conn_update_events(struct nbds_conn *c);
static const struct loop_poll_ops conn_poll_ops;
static void conn_maybe_finish(struct nbds_conn *c);
static void put32(uint8_t *p, uint32_t v);
static void put64(uint8_t *p, uint64_t v);
static uint32_t get32(const uint8_t *p);

static inline void ctr_add(_Atomic uint64_t *v, uint64_t n)
{
	atomic_fetch_add_explicit(v, n, memory_order_relaxed);
}

/* ---- Output ---- */

static void out_free_plain(struct out *o)
{
	free(o);
}

static void conn_queue(struct nbds_conn *c, struct out *o)
{
	o->next = NULL;
	*c->oq_tail = o;
	c->oq_tail = &o->next;
	c->noq++;
	loop_bh_schedule(c->flush_bh);
}

/* One option reply ("Option reply types"): header and data in one piece. */
static void opt_reply(struct nbds_conn *c, uint32_t type, const void *data, uint32_t len)
{
	struct {
		struct out o;
		struct nbd_opt_reply r;
		uint8_t data[];
	} *m = malloc(sizeof(*m) + len);

	if (!m) {
		c->broken = true;
		return;
	}
	m->r.magic = htobe64(NBD_OPT_REPLY_MAGIC);
	m->r.option = htobe32(c->opt);
	m->r.type = htobe32(type);
	m->r.length = htobe32(len);
	if (len)
		memcpy(m->data, data, len);
	m->o.iov[0] = (struct iovec){ &m->r, sizeof(m->r) + len };
	m->o.cnt = 1;
	m->o.held = 0;
	m->o.done = out_free_plain;
	conn_queue(c, &m->o);
}

static void opt_error(struct nbds_conn *c, uint32_t type, const char *msg)
{
	opt_reply(c, type, msg, msg ? (uint32_t)strlen(msg) : 0);
}

/* Raw bytes (the greeting, EXPORT_NAME's answer). */
static void send_raw(struct nbds_conn *c, const void *data, size_t len)
{
	struct {
		struct out o;
		uint8_t data[];
	} *m = malloc(sizeof(*m) + len);

	if (!m) {
		c->broken = true;
		return;
	}
	memcpy(m->data, data, len);
	m->o.iov[0] = (struct iovec){ m->data, len };
	m->o.cnt = 1;
	m->o.held = 0;
	m->o.done = out_free_plain;
	conn_queue(c, &m->o);
}

static void conn_drop_output(struct nbds_conn *c)
{
	while (c->oq) {
		struct out *o = c->oq;

		c->oq = o->next;
		c->held -= o->held;
		o->done(o);
	}
	c->oq_tail = &c->oq;
	c->noq = 0;
	c->oq_off = 0;
	c->tls_staged = 0;
}

/* Retire what is sent whole from the head of the queue. */
static void conn_retire(struct nbds_conn *c)
{
	while (c->oq) {
		struct out *o = c->oq;
		size_t len = 0;

		for (unsigned i = 0; i < o->cnt; i++)
			len += o->iov[i].iov_len;
		if (c->oq_off < len)
			break;
		c->oq_off -= len;
		c->oq = o->next;
		c->noq--;
		c->held -= o->held;
		o->done(o);
	}
	if (!c->oq)
		c->oq_tail = &c->oq;
}

/* Through TLS: the queue's bytes gathered into records of up to 16 KiB
 * (GnuTLS takes no iovecs, and a record per piece would be two records
 * and two sends per reply); a record refused with -EAGAIN is sent again
 * as it was, as GnuTLS requires. */
#define NBDS_TLS_RECORD (16u << 10)
static void conn_flush_tls(struct nbds_conn *c)
{
	c->want_out = false;
	if (!c->tls_stage && !(c->tls_stage = malloc(NBDS_TLS_RECORD))) {
		c->broken = true;
		conn_drop_output(c);
		return;
	}
	while ((c->oq || c->tls_staged) && !c->broken) {
		ssize_t w;

		if (!c->tls_staged) {
			size_t skip = c->oq_off;

			for (struct out *o = c->oq; o && c->tls_staged < NBDS_TLS_RECORD;
			     o = o->next)
				for (unsigned i = 0; i < o->cnt && c->tls_staged < NBDS_TLS_RECORD;
				     i++) {
					size_t n;

					if (skip >= o->iov[i].iov_len) {
						skip -= o->iov[i].iov_len;
						continue;
					}
					n = MIN(o->iov[i].iov_len - skip,
						NBDS_TLS_RECORD - c->tls_staged);
					memcpy(c->tls_stage + c->tls_staged,
					       (uint8_t *)o->iov[i].iov_base + skip, n);
					c->tls_staged += n;
					skip = 0;
				}
		}
		w = nbds__tls_send(c->tls, c->tls_stage, c->tls_staged);
		if (w == -EAGAIN) {
			c->want_out = true;
			return;
		}
		if (w < 0) {
			c->broken = true;
			break;
		}
		/* A record is sent whole; a shorter count (a record size
		 * below 16 KiB negotiated) leaves the rest staged. */
		c->oq_off += (size_t)w;
		if ((size_t)w < c->tls_staged)
			memmove(c->tls_stage, c->tls_stage + w, c->tls_staged - (size_t)w);
		c->tls_staged -= (size_t)w;
		conn_retire(c);
	}
	if (c->broken)
		conn_drop_output(c);
}

/* Send what is queued, as far as the socket takes it. */
static void conn_flush(struct nbds_conn *c)
{
	if (c->tls_up) {
		conn_flush_tls(c);
		return;
	}
	/* Set again below only if the socket is full: a stale want_out
	 * would keep EPOLLOUT on an idle socket (a spin). */
	c->want_out = false;
	while (c->oq && !c->broken) {
		struct iovec iov[64];
		unsigned n = 0;
		size_t skip = c->oq_off, total = 0;
		ssize_t w;

		for (struct out *o = c->oq; o && n < ARRAY_SIZE(iov) - 3; o = o->next)
			for (unsigned i = 0; i < o->cnt; i++) {
				if (skip >= o->iov[i].iov_len) {
					skip -= o->iov[i].iov_len;
					continue;
				}
				iov[n].iov_base = (uint8_t *)o->iov[i].iov_base + skip;
				iov[n].iov_len = o->iov[i].iov_len - skip;
				total += iov[n++].iov_len;
				skip = 0;
			}
		w = writev(c->fd, iov, (int)n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				c->want_out = true;
				break;
			}
			log_debug("nbd: a client's connection failed: %s", strerror(errno));
			c->broken = true;
			break;
		}
		c->oq_off += (size_t)w;
		conn_retire(c);
		if ((size_t)w < total) {
			c->want_out = true;	/* short write: the socket is full */
			break;
		}
	}
	if (c->broken)
		conn_drop_output(c);
}

/* ---- Requests ---- */

/* At most this many requests and bytes of their buffers kept per
 * connection, buffers up to this size. */
#define NBDS_POOL_MAX		64u
#define NBDS_POOL_BYTES		(16u << 20)
#define NBDS_POOL_BUF_MAX	(2u << 20)

static struct nbds_req *req_get(struct nbds_conn *c)
{
	struct nbds_req *r = c->pool;

	if (r) {
		void *buf = r->buf;
		size_t cap = r->cap;

		c->pool = r->pool_next;
		c->npool--;
		c->pool_bytes -= cap;
		memset(r, 0, sizeof(*r));
		r->buf = buf;
		r->cap = cap;
	} else if (!(r = calloc(1, sizeof(*r)))) {
		return NULL;
	}
	r->c = c;
	return r;
}

/* r's buffer, at least len bytes, 4 KiB-aligned (O_DIRECT). */
static int req_buf(struct nbds_req *r, size_t len)
{
	size_t cap = (len + 4095) & ~(size_t)4095;

	if (r->cap >= len)
		return 0;
	free(r->buf);
	r->buf = NULL;
	r->cap = 0;
	if (posix_memalign(&r->buf, 4096, cap)) {
		r->buf = NULL;
		return -ENOMEM;
	}
	r->cap = cap;
	return 0;
}

static void req_release(struct nbds_conn *c, struct nbds_req *r)
{
	if (!c->finished && c->npool < NBDS_POOL_MAX && r->cap <= NBDS_POOL_BUF_MAX &&
	    c->pool_bytes + r->cap <= NBDS_POOL_BYTES) {
		r->pool_next = c->pool;
		c->pool = r;
		c->npool++;
		c->pool_bytes += r->cap;
		return;
	}
	free(r->buf);
	free(r);
}

static void req_free(struct out *o)
{
	struct nbds_req *r = container_of(o, struct nbds_req, out);

	req_release(r->c, r);
}

static uint32_t nbd_errno(int err)
{
	switch (err) {
	case EPERM:
	case EROFS:
		return NBD_EPERM;
	case ENOMEM:
		return NBD_ENOMEM;
	case EINVAL:
		return NBD_EINVAL;
	case ENOSPC:
	case EDQUOT:
	case EFBIG:
		return NBD_ENOSPC;
	case EOVERFLOW:
		return NBD_EOVERFLOW;
	case ENOTSUP:
		return NBD_ENOTSUP;
	case ESHUTDOWN:
		return NBD_ESHUTDOWN;
	default:
		return NBD_EIO;
	}
}

/* Queue r's reply ("Simple reply message", "Structured reply chunk
 * message"): a read's data follows its header; an error of a read with
 * structured replies is an error chunk (a simple reply would be wrong). */
static void req_reply(struct nbds_conn *c, struct nbds_req *r)
{
	bool read = r->type == NBD_CMD_READ;

	r->out.cnt = 1;
	r->out.done = req_free;
	if (c->structured && read) {
		if (r->err) {
			r->rh.error.ch = (struct nbd_chunk){
				.magic = htobe32(NBD_STRUCTURED_REPLY_MAGIC),
				.flags = htobe16(NBD_REPLY_FLAG_DONE),
				.type = htobe16(NBD_REPLY_TYPE_ERROR),
				.cookie = r->cookie, .length = htobe32(6) };
			r->rh.error.error = htobe32(r->err);
			r->rh.error.msg_len = 0;
			r->out.iov[0] = (struct iovec){ &r->rh.error, sizeof(r->rh.error) };
		} else {
			r->rh.data.ch = (struct nbd_chunk){
				.magic = htobe32(NBD_STRUCTURED_REPLY_MAGIC),
				.flags = htobe16(NBD_REPLY_FLAG_DONE),
				.type = htobe16(r->length ? NBD_REPLY_TYPE_OFFSET_DATA :
						NBD_REPLY_TYPE_NONE),
				.cookie = r->cookie,
				.length = htobe32(r->length ? 8 + r->length : 0) };
			r->rh.data.offset = htobe64(r->offset);
			r->out.iov[0] = (struct iovec){ &r->rh.data,
							r->length ? sizeof(r->rh.data) :
								    sizeof(r->rh.data.ch) };
			if (r->length) {
				r->out.iov[1] = (struct iovec){ r->buf, r->length };
				r->out.cnt = 2;
			}
		}
	} else {
		r->rh.s = (struct nbd_simple_reply){ .magic = htobe32(NBD_SIMPLE_REPLY_MAGIC),
						     .error = htobe32(r->err),
						     .cookie = r->cookie };
		r->out.iov[0] = (struct iovec){ &r->rh.s, sizeof(r->rh.s) };
		if (read && !r->err && r->length) {
			r->out.iov[1] = (struct iovec){ r->buf, r->length };
			r->out.cnt = 2;
		}
	}
	if (c->broken) {
		c->held -= r->out.held;
		req_free(&r->out);
		return;
	}
	conn_queue(c, &r->out);
}

/* A bdev_op is its acct_op (req_done counts with it). */
_Static_assert(ACCT_READ == (int)BDEV_READ && ACCT_WRITE == (int)BDEV_WRITE &&
	       ACCT_FLUSH == (int)BDEV_FLUSH && ACCT_DISCARD == (int)BDEV_DISCARD &&
	       ACCT_WRITE_ZEROES == (int)BDEV_WRITE_ZEROES, "acct_op and bdev_op differ");

/* r failed with err and the disk's policy stops on it: held (still in
 * flight for the connection), the disk paused. */
static void req_hold(struct nbds_conn *c, struct nbds_req *r, int err)
{
	char what[96];

	r->held_next = NULL;
	*c->held_tail = r;
	c->held_tail = &r->held_next;
	c->nheld++;
	snprintf(what, sizeof(what), "NBD %s at offset %llu", disk_op_name(r->io.op),
		 (unsigned long long)(r->io.op == BDEV_FLUSH ? 0 : r->offset));
	disk_hold(c->disk, err, what);
}

static void req_done(struct bdev_io *io, int res)
{
	struct nbds_req *r = container_of(io, struct nbds_req, io);
	struct nbds_conn *c = r->c;

	if (c->ys)
		c->ys->out--;
	/* Not a flush that says acknowledged writes may be lost: the
	 * client must hear that, not a success after a retry. */
	if (unlikely(res < 0) && !io->lost && !c->broken &&
	    disk_error_stops(c->disk, io->op, -res)) {
		req_hold(c, r, -res);
		return;
	}
	c->inflight--;
	acct_done(&c->acct, (enum acct_op)io->op, res == 0,
		  io->op == BDEV_FLUSH ? 0 : r->length, loop_now(c->t->loop) - r->t0);
	if (res < 0) {
		r->err = nbd_errno(-res);
		log_debug("nbd: request at %llu failed: %s", (unsigned long long)r->offset,
			  strerror(-res));
	} else if (r->type == NBD_CMD_READ) {
		ctr_add(&c->srv->read_bytes, r->length);
	} else if (r->type == NBD_CMD_WRITE) {
		ctr_add(&c->srv->write_bytes, r->length);
	}
	req_reply(c, r);
	/* The flush bottom half sends it, reads on if reading had stopped,
	 * and closes a connection that is done. */
	loop_bh_schedule(c->flush_bh);
}

/* A request to the disk, or a read to the export's view (nbds_source). */
static void req_answer(struct nbds_conn *c, struct nbds_req *r, uint32_t err);
static bool conn_refuses_writes(struct nbds_conn *c);

/* Every request reaches the disk here: at once, or later (parked by
 * QoS or yielding, held by the error policy).  An incoming export's
 * writes are refused again here: one whose header came before the
 * guest's rings started may reach this after (its payload still
 * coming, or parked), and the disk is the guest's then. */
static void conn_submit(struct nbds_conn *c, struct nbds_req *r)
{
	const struct nbds_source *src = c->ex->o.src;

	if (unlikely(c->ex->o.incoming) && r->io.op != BDEV_READ && r->io.op != BDEV_FLUSH &&
	    conn_refuses_writes(c)) {
		c->inflight--;
		req_answer(c, r, NBD_EPERM);
		return;
	}
	if (c->ys)
		c->ys->out++;
	if (unlikely(src != NULL) && r->io.op == BDEV_READ)
		src->read(src->opaque, c->t, &r->io);
	else
		disk_submit(c->disk, c->t, &r->io);
}

/* The range's status: the disk's, or the export's view's. */
static int conn_block_status(struct nbds_conn *c, uint64_t off, uint64_t len,
			     struct fmt_extent *e)
{
	const struct nbds_source *src = c->ex->o.src;

	if (unlikely(src != NULL))
		return src->block_status(src->opaque, off, len, e);
	return fmt_block_status(c->disk->b, off, len, e);
}

/* The dirty bitmap named name the connection may select: the disk's, or
 * the view's one. */
static struct dbm *conn_bitmap(struct nbds_conn *c, const char *name)
{
	const struct nbds_source *src = c->ex->o.src;

	if (src)
		return src->bitmap && !strcmp(src->bitmap->name, name) ? src->bitmap : NULL;
	return disk_bitmap_find(c->disk, name);
}

/*
 * Yielding.  A source with busy (a backup's view: backup/bkp.h) serves
 * a client that reads as fast as it can (nbdcopy) on the iothread of the
 * guest whose disk it copies; unchecked, the pull took about half of that
 * thread and the guest's writes fell to 0.3-0.45x of no backup
 * (docs/benchmarks.md "Backup").  While the source says the guest is busy
 * there, each pass of the connection (its events, its replies) that took
 * T makes its next request wait until NBDS_YIELD_K * T later: the view
 * keeps about 1 / (1 + NBDS_YIELD_K) of the thread while the guest works,
 * and all of it when the guest is idle.  The waiting request is parked as
 * QoS parks one (it stops the reading too), and counted in "yielded".
 */
#define NBDS_YIELD_K 15u
/* A request parked behind one out looks again this late at the latest
 * (the completion of the one out lets it go sooner). */
#define NBDS_YIELD_RECHECK_NS 1000000ull

/* ---- QoS: the disk's budget (disk.h, disk_admit) ---- */

/* A connection waits for its turn at least this long (a timer nearer
 * than 100 us would be spun for). */
#define NBDS_QOS_MIN_WAIT_NS 150000ull

static uint64_t req_admit(struct nbds_conn *c, struct nbds_req *r, uint64_t now)
{
	if (unlikely(c->yielding)) {
		if (c->ys->until > now)
			return c->ys->until - now;
		/* Its completion lets the next one go (conn_flush_bh). */
		if (c->ys->out)
			return NBDS_YIELD_RECHECK_NS;
	}
	/* Flushes are not throttled (qos.h); trim and write zeroes count
	 * as writes of their bytes, as QEMU's throttle filter has it. */
	if (r->io.op == BDEV_FLUSH || !disk_qos_on(c->disk))
		return 0;
	return disk_admit(c->disk, &c->qos_turn, r->io.op != BDEV_READ, r->length, now);
}

/* True if r must wait (parked: it goes from qos_timer_cb), behind what
 * waits already. */
static bool req_throttled(struct nbds_conn *c, struct nbds_req *r)
{
	uint64_t w = 0;

	if (!c->thr_head && !(w = req_admit(c, r, sys_now_ns())))
		return false;
	r->thr_next = NULL;
	*c->thr_tail = r;
	c->thr_tail = &r->thr_next;
	ctr_add(c->yielding ? &c->srv->yielded : &c->srv->throttled, 1);
	if (w)
		loop_timer_mod(c->qos_timer, sys_now_ns() + MAX(w, NBDS_QOS_MIN_WAIT_NS));
	return true;
}

/* What waits goes while the budget lets it; the rest waits on.  over:
 * all of it now (the connection is shut down: a request taken is never
 * left behind). */
static void conn_unthrottle(struct nbds_conn *c, bool over)
{
	uint64_t now = sys_now_ns(), w = 0;

	while (c->thr_head && (over || !(w = req_admit(c, c->thr_head, now)))) {
		struct nbds_req *r = c->thr_head;

		c->thr_head = r->thr_next;
		if (!c->thr_head)
			c->thr_tail = &c->thr_head;
		/* Marked again as it goes, as blk__remark says why (a held
		 * request is, by req_submit). */
		if (r->io.op != BDEV_READ && r->io.op != BDEV_FLUSH &&
		    unlikely(disk_dirty(c->disk, r->offset, r->length) < 0)) {
			if (c->ys)
				c->ys->out++;	/* req_done counts it back */
			r->io.cb(&r->io, -EIO);
			continue;
		}
		conn_submit(c, r);
	}
	if (over) {
		disk_admit_cancel(c->disk, &c->qos_turn);
		loop_timer_del(c->qos_timer);
	} else if (c->thr_head) {
		loop_timer_mod(c->qos_timer, now + MAX(w, NBDS_QOS_MIN_WAIT_NS));
	}
	disk_kick(c->disk, c->t);
}

static inline uint64_t conn_yield_t0(const struct nbds_conn *c)
{
	return unlikely(c->ys != NULL) ? sys_now_ns() : 0;
}

static void conn_yield(struct nbds_conn *c, uint64_t t0)
{
	const struct nbds_source *src = c->ex->o.src;
	uint64_t now;

	if (likely(!t0) || !c->transmission)
		return;
	now = sys_now_ns();
	if (!src->busy(src->opaque, c->t)) {
		/* The guest went quiet: what waits goes. */
		if (c->yielding && c->thr_head)
			loop_timer_mod(c->qos_timer, now);
		c->yielding = false;
		return;
	}
	c->yielding = true;
	/* Each pass's time adds its wait after what is owed already. */
	c->ys->until = MAX(c->ys->until, now) + (now - t0) * NBDS_YIELD_K;
}

static void qos_timer_cb(void *opaque)
{
	struct nbds_conn *c = opaque;
	uint64_t t0 = conn_yield_t0(c);

	if (c->finished)
		return;
	conn_unthrottle(c, false);
	if (!c->thr_head) {
		/* The turn ends with this pass; reading goes on. */
		c->qos_turn.credit = 0;
		loop_bh_schedule(c->flush_bh);
	}
	conn_yield(c, t0);
}

static void req_submit(struct nbds_conn *c, struct nbds_req *r, enum bdev_op op)
{
	r->io = (struct bdev_io){ .op = op, .offset = r->offset, .cb = req_done };
	if (op == BDEV_READ || op == BDEV_WRITE) {
		r->iov = (struct iovec){ r->buf, r->length };
		r->io.iov = &r->iov;
		r->io.iovcnt = 1;
		r->io.fua = op == BDEV_WRITE && (r->flags & NBD_CMD_FLAG_FUA);
	} else if (op != BDEV_FLUSH) {
		r->io.length = r->length;
		r->io.unmap = op == BDEV_WRITE_ZEROES && !(r->flags & NBD_CMD_FLAG_NO_HOLE);
		r->io.fua = r->flags & NBD_CMD_FLAG_FUA;
	}
	c->inflight++;
	r->t0 = loop_now(c->t->loop);
	if ((op == BDEV_WRITE || op == BDEV_DISCARD || op == BDEV_WRITE_ZEROES) &&
	    unlikely(disk_dirty(c->disk, r->offset, r->length) < 0)) {
		if (c->ys)
			c->ys->out++;	/* req_done counts it back */
		r->io.cb(&r->io, -EIO);
		return;
	}
	if (unlikely(disk_qos_on(c->disk) || c->thr_head || c->yielding) &&
	    req_throttled(c, r))
		return;
	conn_submit(c, r);
}

/* A request answered at once: refused, or nothing to do. */
static void req_answer(struct nbds_conn *c, struct nbds_req *r, uint32_t err)
{
	r->err = err;
	if (err)
		ctr_add(&c->srv->bad_requests, 1);
	req_reply(c, r);
}

/* A read of a range that reads as zeroes throughout, on a disk whose
 * extents cost nothing to ask (fmt_block_status_cheap: qcow2), needs no
 * I/O and no data on the wire: one NBD_REPLY_TYPE_OFFSET_HOLE chunk
 * ("Structured reply types"; not with NBD_CMD_FLAG_DF, whose reply is
 * one data chunk). */
static bool read_is_hole(struct nbds_conn *c, struct nbds_req *r)
{
	uint64_t off = r->offset, left = r->length;

	if (!fmt_block_status_cheap(c->disk->b))
		return false;
	while (left) {
		struct fmt_extent e;

		if (conn_block_status(c, off, left, &e) < 0 || !(e.flags & FMT_EXT_ZERO))
			return false;
		off += e.length;
		left -= e.length;
	}
	return true;
}

static void req_reply_hole(struct nbds_conn *c, struct nbds_req *r)
{
	struct {
		struct out o;
		uint8_t data[sizeof(struct nbd_chunk) + 12];
	} *m = malloc(sizeof(*m));
	struct nbd_chunk ch = { .magic = htobe32(NBD_STRUCTURED_REPLY_MAGIC),
				.flags = htobe16(NBD_REPLY_FLAG_DONE),
				.type = htobe16(NBD_REPLY_TYPE_OFFSET_HOLE),
				.cookie = r->cookie, .length = htobe32(12) };

	c->held -= r->out.held;
	r->out.held = 0;
	if (!m) {
		req_answer(c, r, NBD_ENOMEM);
		return;
	}
	memcpy(m->data, &ch, sizeof(ch));
	put64(m->data + sizeof(ch), r->offset);
	put32(m->data + sizeof(ch) + 8, r->length);
	m->o.iov[0] = (struct iovec){ m->data, sizeof(m->data) };
	m->o.cnt = 1;
	m->o.held = 0;
	m->o.done = out_free_plain;
	ctr_add(&c->srv->read_bytes, r->length);
	if (c->ex->o.src)
		c->ex->o.src->served(c->ex->o.src->opaque, r->length);
	/* A read served from the image's tables: done at once. */
	acct_done(&c->acct, ACCT_READ, true, r->length, 0);
	req_release(c, r);
	conn_queue(c, &m->o);
}

#define NBDS_META_BASE_ID	1	/* base:allocation */
#define NBDS_META_DEPTH_ID	2	/* qemu:allocation-depth */
#define NBDS_META_DIRTY_ID	3	/* qemu:dirty-bitmap:NAME */
#define NBDS_MAX_EXTENTS	512u	/* per reply chunk (spec: <= 2^20) */

/* One context's descriptors from the disk's extents: neighbours with the
 * same status merged.  Returns the count, written at d (pairs). */
static unsigned extents_to_descs(const struct fmt_extent *x, unsigned n, bool depth, uint8_t *d)
{
	unsigned out = 0;
	uint32_t prev = 0;

	for (unsigned i = 0; i < n; i++) {
		uint32_t v = depth ? x[i].depth :
			     ((x[i].flags & FMT_EXT_HOLE) ? NBD_STATE_HOLE : 0) |
			     ((x[i].flags & FMT_EXT_ZERO) ? NBD_STATE_ZERO : 0);

		if (out && v == prev) {
			uint32_t len = get32(d + 8 * (out - 1));

			put32(d + 8 * (out - 1), len + (uint32_t)x[i].length);
			continue;
		}
		put32(d + 8 * out, (uint32_t)x[i].length);
		put32(d + 8 * out + 4, v);
		prev = v;
		out++;
	}
	return out;
}

/* NBD_CMD_BLOCK_STATUS ("Structured reply types": NBD_REPLY_TYPE_BLOCK_STATUS):
 * one chunk per selected context, the last one DONE.  The extents come
 * from the format (fmt_block_status), synchronously: a qcow2 table not in
 * the cache is read as the guest's requests read it.  0 (r answered and
 * freed) or an NBD error for r. */
static uint32_t req_block_status(struct nbds_conn *c, struct nbds_req *r)
{
	unsigned max = (r->flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : NBDS_MAX_EXTENTS, n = 0;
	unsigned nctx = c->meta_base + c->meta_depth + c->meta_dirty, ndesc[2] = { 0 };
	struct dbm *bm = c->meta_dirty ? conn_bitmap(c, c->meta_bitmap) : NULL;
	struct fmt_extent *x = malloc(max * sizeof(*x));
	uint64_t off = r->offset, left = r->length;
	struct {
		struct out o;
		uint8_t data[];
	} *m;
	uint8_t *p;
	size_t size;

	if (!x)
		return NBD_ENOMEM;
	if (c->meta_dirty && !bm) {
		free(x);
		return NBD_EINVAL;	/* removed: refused while selected, so rare */
	}
	while ((c->meta_base || c->meta_depth) && left && n < max) {
		int res = conn_block_status(c, off, left, &x[n]);

		if (res < 0) {
			free(x);
			return nbd_errno(-res);
		}
		off += x[n].length;
		left -= x[n].length;
		n++;
	}
	/* Room for every descriptor unmerged, per context. */
	size = nctx * (sizeof(struct nbd_chunk) + 4 + 8 * (size_t)MAX(n, max));
	m = malloc(sizeof(*m) + size);
	if (!m) {
		free(x);
		return NBD_ENOMEM;
	}
	p = m->data;
	for (unsigned i = 0; i < 2; i++) {
		bool depth = i == 1;
		struct nbd_chunk ch;

		if (depth ? !c->meta_depth : !c->meta_base)
			continue;
		ndesc[i] = extents_to_descs(x, n, depth, p + sizeof(ch) + 4);
		ch = (struct nbd_chunk){
			.magic = htobe32(NBD_STRUCTURED_REPLY_MAGIC),
			.flags = htobe16(--nctx ? 0 : NBD_REPLY_FLAG_DONE),
			.type = htobe16(NBD_REPLY_TYPE_BLOCK_STATUS),
			.cookie = r->cookie,
			.length = htobe32(4 + 8 * ndesc[i]) };
		memcpy(p, &ch, sizeof(ch));
		put32(p + sizeof(ch), depth ? NBDS_META_DEPTH_ID : NBDS_META_BASE_ID);
		p += sizeof(ch) + 4 + 8 * ndesc[i];
	}
	if (bm) {
		/* The bitmap's own runs, dirty or clean, from the request's
		 * offset (its extents need not match the others'). */
		struct nbd_chunk ch;
		uint64_t o = r->offset, rest = r->length, len;
		unsigned k = 0;

		while (rest && k < max) {
			bool dirty = dbm_extent(bm, o, MIN(rest, (uint64_t)UINT32_MAX & ~4095ull),
						&len);

			put32(p + sizeof(ch) + 4 + 8 * k, (uint32_t)len);
			put32(p + sizeof(ch) + 4 + 8 * k + 4, dirty ? NBD_STATE_DIRTY : 0);
			k++;
			o += len;
			rest -= len;
		}
		ch = (struct nbd_chunk){
			.magic = htobe32(NBD_STRUCTURED_REPLY_MAGIC),
			.flags = htobe16(NBD_REPLY_FLAG_DONE),
			.type = htobe16(NBD_REPLY_TYPE_BLOCK_STATUS),
			.cookie = r->cookie,
			.length = htobe32(4 + 8 * k) };
		memcpy(p, &ch, sizeof(ch));
		put32(p + sizeof(ch), NBDS_META_DIRTY_ID);
		p += sizeof(ch) + 4 + 8 * k;
	}
	free(x);
	m->o.iov[0] = (struct iovec){ m->data, (size_t)(p - m->data) };
	m->o.cnt = 1;
	m->o.held = 0;
	m->o.done = out_free_plain;
	req_release(c, r);
	conn_queue(c, &m->o);
	return 0;
}

/* "Request types": check the header, then run it (a write once its
 * payload is in).  Returns the request whose payload comes next, or
 * NULL. */

/* Writes refused: a read-only export, or an incoming one whose guest
 * started here (the migration's switch-over: the destination owns the
 * disk; nbds.h). */
static bool conn_refuses_writes(struct nbds_conn *c)
{
	if (c->read_only)
		return true;
	if (likely(!c->ex->o.incoming) || !atomic_load(&c->disk->rings_started))
		return false;
	if (!atomic_exchange(&c->ex->incoming_closed, true))
		log_info("nbd: export '%s' (incoming): the guest's rings started here: writes "
			 "refused from now on", c->ex->o.name);
	return true;
}

static struct nbds_req *req_start(struct nbds_conn *c, const struct nbd_request *w)
{
	const struct bdev *b = c->disk->b;
	uint64_t size = READ_ONCE(b->size), end;
	unsigned bs = b->block_size;
	uint16_t valid = NBD_CMD_FLAG_FUA;
	struct nbds_req *r;
	uint32_t err = 0;

	r = req_get(c);
	if (!r) {
		c->broken = true;
		return NULL;
	}
	r->flags = be16toh(w->flags);
	r->type = be16toh(w->type);
	r->cookie = w->cookie;		/* opaque: sent back as it came */
	r->offset = be64toh(w->offset);
	r->length = be32toh(w->length);
	ctr_add(&c->srv->requests, 1);
	end = r->offset + r->length;	/* no overflow: 2^64 - 1 + 2^32 wraps, checked */

	/* "Command flags": what each command may carry (as QEMU's server). */
	if (r->type == NBD_CMD_READ && c->structured)
		valid |= NBD_CMD_FLAG_DF;
	if (r->type == NBD_CMD_WRITE_ZEROES)
		valid |= NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO;
	if (r->type == NBD_CMD_BLOCK_STATUS)
		valid |= NBD_CMD_FLAG_REQ_ONE;
	if (r->flags & ~valid)
		err = NBD_EINVAL;
	else if (end < r->offset)
		err = NBD_EINVAL;

	switch (r->type) {
	case NBD_CMD_READ:
	case NBD_CMD_WRITE: {
		bool write = r->type == NBD_CMD_WRITE;

		if (!err && r->length > NBDS_MAX_PAYLOAD)
			err = write ? NBD_EINVAL : NBD_EOVERFLOW;
		else if (!err && write && conn_refuses_writes(c))
			err = NBD_EPERM;
		else if (!err && end > size)
			err = write ? NBD_ENOSPC : NBD_EINVAL;
		else if (!err && (r->offset | r->length) % bs)
			err = NBD_EINVAL;
		if (!err && r->length) {
			c->held += r->length;
			r->out.held = r->length;
			if (req_buf(r, r->length) < 0)
				err = NBD_ENOMEM;
		}
		if (write) {
			r->err = err;
			if (r->length == 0) {
				req_answer(c, r, err);
				return NULL;
			}
			if (err) {
				/* The payload comes whatever we think of it. */
				c->skip_left = r->length;
				c->st = CS_REQ_SKIP;
				req_answer(c, r, err);
				return NULL;
			}
			c->st = CS_REQ_DATA;
			return r;
		}
		if (err || r->length == 0) {
			req_answer(c, r, err);
			return NULL;
		}
		if (c->structured && !(r->flags & NBD_CMD_FLAG_DF) && read_is_hole(c, r)) {
			req_reply_hole(c, r);
			return NULL;
		}
		req_submit(c, r, BDEV_READ);
		return NULL;
	}
	case NBD_CMD_DISC:
		/* "Terminating the transmission phase": what is in flight is
		 * answered, then the connection closes. */
		req_release(c, r);
		c->closing = true;
		return NULL;
	case NBD_CMD_FLUSH:
		if (err || c->read_only) {
			req_answer(c, r, err);
			return NULL;
		}
		req_submit(c, r, BDEV_FLUSH);
		return NULL;
	case NBD_CMD_TRIM:
	case NBD_CMD_WRITE_ZEROES: {
		bool trim = r->type == NBD_CMD_TRIM;

		if (!err && conn_refuses_writes(c))
			err = NBD_EPERM;
		else if (!err && !(b->caps & (trim ? BDEV_CAP_DISCARD : BDEV_CAP_WRITE_ZEROES)))
			err = NBD_EINVAL;	/* not advertised */
		else if (!err && end > size)
			err = trim ? NBD_EINVAL : NBD_ENOSPC;
		else if (!err && (r->offset | r->length) % bs)
			err = NBD_EINVAL;
		else if (!err && (r->flags & NBD_CMD_FLAG_FAST_ZERO))
			/* We cannot tell in advance whether zeroing beats a
			 * write here: the spec's answer for that. */
			err = NBD_ENOTSUP;
		if (err || r->length == 0) {
			req_answer(c, r, err);
			return NULL;
		}
		req_submit(c, r, trim ? BDEV_DISCARD : BDEV_WRITE_ZEROES);
		return NULL;
	}
	case NBD_CMD_CACHE:
		/* Advisory; the disk is O_DIRECT or the page cache has it. */
		if (!err && end > size)
			err = NBD_EINVAL;
		req_answer(c, r, err);
		return NULL;
	case NBD_CMD_BLOCK_STATUS:
		if (!err && (!(c->meta_base || c->meta_depth || c->meta_dirty) || r->length == 0 ||
			     end > size))
			err = NBD_EINVAL;
		if (err || (err = req_block_status(c, r)) != 0) {
			req_answer(c, r, err);
			return NULL;
		}
		return NULL;
	default:
		/* Unknown: nothing says it has a payload, so the stream stays
		 * in step. */
		req_answer(c, r, NBD_EINVAL);
		return NULL;
	}
}

/* ---- The handshake ---- */

static uint16_t conn_tx_flags(const struct nbds_conn *c)
{
	const struct bdev *b = c->disk->b;
	uint16_t f = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA |
		     NBD_FLAG_SEND_CACHE;

	/* A flush through any connection covers the writes every other one
	 * had answered: they share the disk's file (one fdatasync) or, for
	 * a format or network disk, its single iothread and handle. */
	f |= NBD_FLAG_CAN_MULTI_CONN;
	if (c->structured)
		f |= NBD_FLAG_SEND_DF;
	if (c->read_only)
		return f | NBD_FLAG_READ_ONLY;
	if (b->caps & BDEV_CAP_DISCARD)
		f |= NBD_FLAG_SEND_TRIM;
	if (b->caps & BDEV_CAP_WRITE_ZEROES)
		f |= NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO;
	return f;
}

static void conn_enter_transmission(struct nbds_conn *c)
{
	c->transmission = true;
	c->st = CS_REQ_HDR;
	loop_timer_del(c->hs_timer);
	/* Plain: its client's next request may be polled for. */
	if (!c->tls && c->h)
		loop_fd_set_poll(c->h, &conn_poll_ops);
	log_info("nbd: a client started using export '%s' (%s replies)", c->ex->o.name,
		 c->structured ? "structured" : "simple");
}

static bool name_is(const struct nbds_conn *c, const uint8_t *name, uint32_t len)
{
	return len == strlen(c->ex->o.name) && !memcmp(name, c->ex->o.name, len);
}

/* Wire fields at any offset (big-endian, no alignment). */
static void put16(uint8_t *p, uint16_t v)
{
	v = htobe16(v);
	memcpy(p, &v, 2);
}

static void put32(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
	v = htobe64(v);
	memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return be32toh(v);
}

static uint16_t get16(const uint8_t *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return be16toh(v);
}

/* NBD_OPT_INFO and NBD_OPT_GO: name, then information requests. */
static void opt_info(struct nbds_conn *c, const uint8_t *d, uint32_t len)
{
	const struct bdev *b = c->disk->b;
	uint32_t nlen;
	uint16_t nreq;
	bool want_name = false;
	uint8_t buf[14];

	if (len < 6 || (nlen = get32(d)) > len - 6 ||
	    len != 4 + nlen + 2 + 2 * (uint32_t)(nreq = get16(d + 4 + nlen))) {
		opt_error(c, NBD_REP_ERR_INVALID, "malformed NBD_OPT_INFO/NBD_OPT_GO");
		return;
	}
	if (!name_is(c, d + 4, nlen)) {
		opt_error(c, NBD_REP_ERR_UNKNOWN, "no export of that name here");
		return;
	}
	for (unsigned i = 0; i < nreq; i++)
		if (get16(d + 4 + nlen + 2 + 2 * i) == NBD_INFO_NAME)
			want_name = true;
	/* "Information types": NBD_INFO_EXPORT always, the block sizes
	 * always (the disk's logical block is the least we take), the name
	 * when asked. */
	put16(buf, NBD_INFO_EXPORT);
	put64(buf + 2, READ_ONCE(b->size));
	put16(buf + 10, conn_tx_flags(c));
	opt_reply(c, NBD_REP_INFO, buf, 12);
	put16(buf, NBD_INFO_BLOCK_SIZE);
	put32(buf + 2, b->block_size);
	put32(buf + 6, MAX(b->block_size, 4096u));
	put32(buf + 10, NBDS_MAX_PAYLOAD);
	opt_reply(c, NBD_REP_INFO, buf, 14);
	if (want_name) {
		size_t n = strlen(c->ex->o.name);
		uint8_t *m = malloc(2 + n);

		if (m) {
			put16(m, NBD_INFO_NAME);
			memcpy(m + 2, c->ex->o.name, n);
			opt_reply(c, NBD_REP_INFO, m, (uint32_t)(2 + n));
			free(m);
		}
	}
	opt_reply(c, NBD_REP_ACK, NULL, 0);
	if (c->opt == NBD_OPT_GO)
		conn_enter_transmission(c);
}

static void conn_fail(struct nbds_conn *c, const char *why);

/* One step of the TLS handshake (after NBD_OPT_STARTTLS's ACK). */
/* No metadata context selected; a bitmap's use count given back. */
static void meta_reset(struct nbds_conn *c)
{
	if (c->meta_dirty) {
		struct dbm *b = conn_bitmap(c, c->meta_bitmap);

		if (b)
			dbm_unuse(b);
	}
	c->meta_base = c->meta_depth = c->meta_dirty = false;
}

static void conn_tls_step(struct nbds_conn *c)
{
	int r = nbds__tls_handshake(c->tls, &c->tls_events);

	if (r < 0) {
		conn_fail(c, "failed its TLS handshake");
		return;
	}
	if (r == 0)
		return;
	/* "the server MUST NOT preserve any negotiation state" */
	c->tls_up = true;
	c->structured = false;
	meta_reset(c);
}

/* "TLS support": ACK in the clear, every byte of it out, then the
 * handshake.  A client that sent anything after its STARTTLS did not
 * wait for the ACK: it is not speaking the protocol. */
static void conn_starttls(struct nbds_conn *c)
{
	opt_reply(c, NBD_REP_ACK, NULL, 0);
	conn_flush(c);
	if (c->oq || c->broken) {
		conn_fail(c, "did not take the STARTTLS reply");
		return;
	}
	if (c->in_pos != c->in_len) {
		conn_fail(c, "sent data before its TLS handshake");
		return;
	}
	if (nbds__tls_sess_new(c->ex->tls, c->fd, &c->tls) < 0) {
		conn_fail(c, "could not be given a TLS session");
		return;
	}
	conn_tls_step(c);
}

#define QEMU_DIRTY "qemu:dirty-bitmap:"

/* Which of our contexts a query names ("Metadata querying"; QEMU's
 * docs/interop/nbd.rst for the qemu: namespace): for LIST a bare
 * namespace, and "qemu:dirty-bitmap:" with no name, select every context
 * there; an unknown one nothing.  A bitmap is named whole; SET takes the
 * first one named (one per connection, as qemu-nbd -B exports one). */
static void meta_match(struct nbds_conn *c, const uint8_t *q, uint32_t len, bool list,
		       bool *base, bool *depth, bool *all_bitmaps, char *bitmap)
{
	static const char b[] = "base:allocation", d[] = "qemu:allocation-depth";
	const size_t dl = sizeof(QEMU_DIRTY) - 1;

	if ((len == sizeof(b) - 1 && !memcmp(q, b, len)) ||
	    (list && len == 5 && !memcmp(q, "base:", 5)))
		*base = true;
	if ((len == sizeof(d) - 1 && !memcmp(q, d, len)) ||
	    (list && len == 5 && !memcmp(q, "qemu:", 5)))
		*depth = true;
	if (list && ((len == 5 && !memcmp(q, "qemu:", 5)) ||
		     (len == dl && !memcmp(q, QEMU_DIRTY, dl))))
		*all_bitmaps = true;
	if (len > dl && len - dl <= DBM_NAME_MAX && !memcmp(q, QEMU_DIRTY, dl) && !bitmap[0]) {
		char name[DBM_NAME_MAX + 1];

		memcpy(name, q + dl, len - dl);
		name[len - dl] = 0;
		if (conn_bitmap(c, name))
			memcpy(bitmap, name, len - dl + 1);
	}
}

/* One NBD_REP_META_CONTEXT: id, then the name (prefix and rest). */
static void meta_reply(struct nbds_conn *c, uint32_t id, const char *prefix, const char *name)
{
	uint8_t buf[4 + sizeof(QEMU_DIRTY) + DBM_NAME_MAX];
	size_t pl = strlen(prefix), n = strlen(name);

	put32(buf, id);
	memcpy(buf + 4, prefix, pl);
	memcpy(buf + 4 + pl, name, n);
	opt_reply(c, NBD_REP_META_CONTEXT, buf, (uint32_t)(4 + pl + n));
}

/* NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT: base:allocation,
 * qemu:allocation-depth (as qemu-nbd -A) and the disk's dirty bitmaps as
 * qemu:dirty-bitmap:NAME (as qemu-nbd -B). */
static void opt_meta(struct nbds_conn *c, const uint8_t *d, uint32_t len)
{
	bool set = c->opt == NBD_OPT_SET_META_CONTEXT, base = false, depth = false;
	bool all_bitmaps = false;
	char bitmap[DBM_NAME_MAX + 1] = "";
	uint32_t nlen, nq, pos;

	/* "replaces all previously-set metadata contexts (including when
	 * this command fails)" */
	if (set)
		meta_reset(c);
	if (!c->structured) {
		opt_error(c, NBD_REP_ERR_INVALID, "negotiate structured replies first");
		return;
	}
	if (len < 8 || (nlen = get32(d)) > len - 8) {
		opt_error(c, NBD_REP_ERR_INVALID, "malformed meta context option");
		return;
	}
	nq = get32(d + 4 + nlen);
	pos = 8 + nlen;
	for (uint32_t i = 0; i < nq; i++) {
		uint32_t ql;

		if (len - pos < 4 || (ql = get32(d + pos)) > len - pos - 4) {
			opt_error(c, NBD_REP_ERR_INVALID, "malformed meta context query");
			return;
		}
		/* "Strings" in the spec's conventions: no NUL inside. */
		if (memchr(d + pos + 4, 0, ql)) {
			opt_error(c, NBD_REP_ERR_INVALID, "a meta context query holds a NUL byte");
			return;
		}
		meta_match(c, d + pos + 4, ql, !set, &base, &depth, &all_bitmaps, bitmap);
		pos += 4 + ql;
	}
	if (pos != len) {
		opt_error(c, NBD_REP_ERR_INVALID, "malformed meta context option");
		return;
	}
	if (!name_is(c, d + 4, nlen)) {
		opt_error(c, NBD_REP_ERR_UNKNOWN, "no export of that name here");
		return;
	}
	if (!set && nq == 0)
		base = depth = all_bitmaps = true;
	/* The bitmap selected is taken now, once: a removal meanwhile
	 * (main thread) leaves it unselected, never a stale pointer. */
	if (set && bitmap[0]) {
		struct dbm *b = conn_bitmap(c, bitmap);

		if (!b || !dbm_use(b))
			bitmap[0] = 0;
	}
	/* IDs: 0 in a list (the spec's SHOULD), ours in a selection. */
	if (base)
		meta_reply(c, set ? NBDS_META_BASE_ID : 0, "base:allocation", "");
	if (depth)
		meta_reply(c, set ? NBDS_META_DEPTH_ID : 0, "qemu:allocation-depth", "");
	if (all_bitmaps) {
		struct disk_bitmaps *l = atomic_load_explicit(&c->disk->bitmaps,
							      memory_order_acquire);

		if (c->ex->o.src && c->ex->o.src->bitmap)
			meta_reply(c, 0, QEMU_DIRTY, c->ex->o.src->bitmap->name);
		for (unsigned i = 0; !c->ex->o.src && l && i < l->n; i++)
			if (l->b[i]->name[0])	/* not a backup's own */
				meta_reply(c, 0, QEMU_DIRTY, l->b[i]->name);
	} else if (bitmap[0]) {
		meta_reply(c, set ? NBDS_META_DIRTY_ID : 0, QEMU_DIRTY, bitmap);
	}
	if (set) {
		c->meta_base = base;
		c->meta_depth = depth;
		if (bitmap[0]) {
			strcpy(c->meta_bitmap, bitmap);
			c->meta_dirty = true;
		}
	}
	opt_reply(c, NBD_REP_ACK, NULL, 0);
}

/* "Option types" */
static void conn_option(struct nbds_conn *c, const uint8_t *d, uint32_t len)
{
	/* "FORCEDTLS": before TLS, only STARTTLS and ABORT; EXPORT_NAME
	 * cannot be refused but by hanging up. */
	if (c->ex->tls && !c->tls_up && c->opt != NBD_OPT_STARTTLS && c->opt != NBD_OPT_ABORT) {
		if (c->opt == NBD_OPT_EXPORT_NAME) {
			conn_fail(c, "asked for a TLS export without TLS");
			return;
		}
		opt_error(c, NBD_REP_ERR_TLS_REQD, "this export requires TLS (NBD_OPT_STARTTLS)");
		return;
	}
	switch (c->opt) {
	case NBD_OPT_EXPORT_NAME: {
		uint8_t buf[10 + 124] = { 0 };

		/* No way to say no but to hang up. */
		if (!name_is(c, d, len)) {
			log_info("nbd: a client asked for an export that is not here; "
				 "disconnected");
			c->closing = true;
			return;
		}
		put64(buf, READ_ONCE(c->disk->b->size));
		put16(buf + 8, conn_tx_flags(c));
		send_raw(c, buf, c->no_zeroes ? 10 : sizeof(buf));
		conn_enter_transmission(c);
		return;
	}
	case NBD_OPT_ABORT:
		opt_reply(c, NBD_REP_ACK, NULL, 0);
		c->closing = true;
		return;
	case NBD_OPT_LIST: {
		size_t n = strlen(c->ex->o.name);
		uint8_t *m;

		if (len) {
			opt_error(c, NBD_REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
			return;
		}
		m = malloc(4 + n);
		if (!m) {
			opt_error(c, NBD_REP_ERR_SHUTDOWN, NULL);
			return;
		}
		put32(m, (uint32_t)n);
		memcpy(m + 4, c->ex->o.name, n);
		opt_reply(c, NBD_REP_SERVER, m, (uint32_t)(4 + n));
		free(m);
		opt_reply(c, NBD_REP_ACK, NULL, 0);
		return;
	}
	case NBD_OPT_STARTTLS:
		if (len)
			opt_error(c, NBD_REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data");
		else if (!c->ex->tls)
			opt_error(c, NBD_REP_ERR_POLICY, "TLS is not configured on this export");
		else if (c->tls)
			opt_error(c, NBD_REP_ERR_INVALID, "TLS is already on");
		else
			conn_starttls(c);
		return;
	case NBD_OPT_INFO:
	case NBD_OPT_GO:
		opt_info(c, d, len);
		return;
	case NBD_OPT_STRUCTURED_REPLY:
		if (len)
			opt_error(c, NBD_REP_ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data");
		else if (c->structured)
			opt_error(c, NBD_REP_ERR_INVALID, "structured replies already negotiated");
		else {
			c->structured = true;
			opt_reply(c, NBD_REP_ACK, NULL, 0);
		}
		return;
	case NBD_OPT_LIST_META_CONTEXT:
	case NBD_OPT_SET_META_CONTEXT:
		opt_meta(c, d, len);
		return;
	default:
		opt_error(c, NBD_REP_ERR_UNSUP, "option not supported");
		return;
	}
}

/* ---- Input ---- */

static bool conn_can_read(const struct nbds_conn *c)
{
	return (!c->tls || c->tls_up) && !c->closing && !c->broken && c->inflight < NBDS_MAX_INFLIGHT &&
	       c->held < NBDS_MAX_HELD && c->noq < NBDS_MAX_QUEUED && !c->thr_head &&
	       !c->held_head && !disk_paused(c->disk);
}

static void conn_fail(struct nbds_conn *c, const char *why)
{
	log_warn("nbd: a client of export '%s' %s; disconnected", c->ex->o.name, why);
	if (!c->transmission)
		ctr_add(&c->srv->handshake_failed, 1);
	c->closing = true;
	c->broken = true;
	conn_drop_output(c);
}

/* Parse what is buffered, as far as it goes.  The caller reads more. */
static void conn_parse(struct nbds_conn *c)
{
	while (conn_can_read(c)) {
		size_t avail = c->in_len - c->in_pos;
		const uint8_t *p = c->in + c->in_pos;

		switch (c->st) {
		case CS_CLIENT_FLAGS: {
			uint32_t f;

			if (avail < 4)
				return;
			f = get32(p);
			c->in_pos += 4;
			/* "Client flags": unknown ones end the session. */
			if (f & ~(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)) {
				conn_fail(c, "sent unknown client flags");
				return;
			}
			c->no_zeroes = f & NBD_FLAG_C_NO_ZEROES;
			c->st = CS_OPT_HDR;
			break;
		}
		case CS_OPT_HDR: {
			struct nbd_opt_hdr h;

			if (avail < sizeof(h))
				return;
			memcpy(&h, p, sizeof(h));
			c->in_pos += sizeof(h);
			if (be64toh(h.magic) != NBD_IHAVEOPT) {
				conn_fail(c, "sent a bad option magic");
				return;
			}
			c->opt = be32toh(h.option);
			c->opt_len = be32toh(h.length);
			if (c->opt_len > NBDS_OPT_MAX) {
				if (c->opt == NBD_OPT_EXPORT_NAME) {
					conn_fail(c, "sent an export name over the bound");
					return;
				}
				c->skip_left = c->opt_len;
				c->st = CS_OPT_SKIP;
				break;
			}
			c->opt_data = malloc(c->opt_len ? c->opt_len : 1);
			if (!c->opt_data) {
				conn_fail(c, "could not be given memory for an option");
				return;
			}
			c->opt_got = 0;
			c->st = CS_OPT_DATA;
			break;
		}
		case CS_OPT_DATA: {
			size_t n = MIN(avail, c->opt_len - c->opt_got);

			memcpy(c->opt_data + c->opt_got, p, n);
			c->opt_got += n;
			c->in_pos += n;
			if (c->opt_got < c->opt_len)
				return;
			c->st = CS_OPT_HDR;
			conn_option(c, c->opt_data, c->opt_len);
			free(c->opt_data);
			c->opt_data = NULL;
			break;
		}
		case CS_OPT_SKIP:
		case CS_REQ_SKIP: {
			size_t n = (size_t)MIN((uint64_t)avail, c->skip_left);

			c->skip_left -= n;
			c->in_pos += n;
			if (c->skip_left)
				return;
			if (c->st == CS_OPT_SKIP) {
				c->st = CS_OPT_HDR;
				opt_error(c, NBD_REP_ERR_TOO_BIG, "option data over the bound");
			} else {
				c->st = CS_REQ_HDR;
			}
			break;
		}
		case CS_REQ_HDR: {
			struct nbd_request w;

			if (avail < sizeof(w))
				return;
			memcpy(&w, p, sizeof(w));
			c->in_pos += sizeof(w);
			if (be32toh(w.magic) != NBD_REQUEST_MAGIC) {
				conn_fail(c, "sent a bad request magic");
				return;
			}
			c->taken++;
			c->cur = req_start(c, &w);
			break;
		}
		case CS_REQ_DATA: {
			struct nbds_req *r = c->cur;
			size_t n = MIN(avail, r->length - r->got);

			memcpy((uint8_t *)r->buf + r->got, p, n);
			r->got += n;
			c->in_pos += n;
			if (r->got < r->length)
				return;
			c->cur = NULL;
			c->st = CS_REQ_HDR;
			req_submit(c, r, BDEV_WRITE);
			break;
		}
		}
	}
}

/* recv(2) or, once TLS is up, the session's: n > 0, 0 at the end,
 * -1 with errno. */
static ssize_t conn_recv(struct nbds_conn *c, void *buf, size_t len)
{
	ssize_t n;

	if (!c->tls_up)
		return recv(c->fd, buf, len, MSG_DONTWAIT);
	n = nbds__tls_recv(c->tls, buf, len);
	if (n >= 0)
		return n;
	errno = (int)-n;
	return -1;
}

/* A receive of n bytes of the want asked for emptied the socket: parse
 * what came and stop, without the receive that would only say -EAGAIN
 * (one syscall per request of a QD1 client).  Safe because the fd is
 * level-triggered: what comes meanwhile is an EPOLLIN at the next
 * epoll_wait.  Through TLS, when the session's own last read of the
 * socket was short and it holds nothing more, decrypted or not: a
 * client that writes record by record (libnbd, a 4 KiB write's header
 * and payload apart) is otherwise chased one record per receive, in a
 * pass that lasts as long as it keeps writing (conn_moderate then
 * gathers its records). */
static bool conn_drained(struct nbds_conn *c, size_t n, size_t want)
{
	return c->tls_up ? nbds__tls_drained(c->tls) : n < want;
}

static void conn_read(struct nbds_conn *c)
{
	bool drained = c->in_drained;

	c->in_drained = false;
	for (;;) {
		size_t want;
		ssize_t n;

		conn_parse(c);
		if (drained || !conn_can_read(c))
			break;
		if (c->in_pos == c->in_len)
			c->in_pos = c->in_len = 0;
		/* A write's payload beyond what is buffered goes straight
		 * into its buffer. */
		if (c->st == CS_REQ_DATA && c->in_pos == c->in_len &&
		    c->cur->length - c->cur->got >= NBDS_INBUF / 2) {
			want = c->cur->length - c->cur->got;
			n = conn_recv(c, (uint8_t *)c->cur->buf + c->cur->got, want);
			if (n > 0) {
				c->cur->got += (size_t)n;
				drained = conn_drained(c, (size_t)n, want);
				continue;
			}
		} else {
			if (c->in_len == NBDS_INBUF) {
				memmove(c->in, c->in + c->in_pos, c->in_len - c->in_pos);
				c->in_len -= c->in_pos;
				c->in_pos = 0;
			}
			want = NBDS_INBUF - c->in_len;
			n = conn_recv(c, c->in + c->in_len, want);
			if (n > 0) {
				c->in_len += (size_t)n;
				drained = conn_drained(c, (size_t)n, want);
				continue;
			}
		}
		if (n == 0) {
			/* The client hung up: what it asked for still completes
			 * (its writes are on the disk), then we close. */
			if (!c->transmission)
				ctr_add(&c->srv->handshake_failed, 1);
			c->closing = true;
			break;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			log_debug("nbd: a client's connection failed: %s", strerror(errno));
			c->closing = c->broken = true;
		}
		break;
	}
	disk_kick(c->disk, c->t);
}

/* ---- Events ---- */

/* Input we hold that no epoll event will announce: bytes in our buffer,
 * or in the TLS session's (decrypted, or received and not yet handed to
 * GnuTLS). */
static bool conn_input_waits(const struct nbds_conn *c)
{
	return c->in_pos < c->in_len || (c->tls_up && nbds__tls_pending(c->tls));
}

/*
 * Coalescing a pipelining client's requests (loop_moderate).  A client
 * that keeps many requests in flight (fio's nbd engine at QD32, nbdcopy)
 * sends the next one as each reply comes back, so a server as fast as it
 * finds one or two requests per wake-up, and pays a wake-up, a receive
 * and a send for each: at 4k QD32 on tmpfs, 4.8-4.9 syscalls and 17 us of
 * CPU per request.  Waiting CONN_MOD_NS after a pass lets the next ones
 * gather: one wake-up, one receive and one send for several (1.0-1.6
 * syscalls, 8-13 us per request at 40 us; 80 us took 0.70-0.91x of that
 * CPU per request in a paired run, p50 within 0-11 %: docs/benchmarks.md
 * "Serving NBD").  Only while it pays: a pass after the
 * wait that takes fewer than CONN_MOD_MIN requests (a QD1 client: its
 * next request waits for our reply) turns it off, and it is tried again
 * one pass in CONN_MOD_PROBE (a QD1 client's p50 does not see it).
 * Connections in transmission only, and not on a disk whose guest's
 * rings ever started: the wait holds the whole iothread, the guest's
 * queues on it too.  Through TLS only after a pass of fewer than
 * CONN_MOD_TLS_MAX requests: a client reading 4 KiB at QD32 through TLS
 * keeps the server's core busy, its passes take many requests, and a wait
 * cost 10 % of the wall time for no CPU saved (2026-12-06); a writing
 * client's records came one receive each (conn_drained) and are worth
 * gathering (1.93x plain's CPU per 4 KiB write before, 1.27x
 * after: docs/benchmarks.md "Serving NBD").
 */
#define CONN_MOD_NS 80000ull
#define CONN_MOD_MIN 3
#define CONN_MOD_PROBE 256u
#define CONN_MOD_TLS_MAX 8u

static void conn_moderate(struct nbds_conn *c, uint64_t taken)
{
	if (c->mod_waited) {
		c->mod_waited = false;
		ctr_add(&c->srv->coalesced_requests, taken);
		c->mod_on = taken >= CONN_MOD_MIN;
		if (!c->mod_on)
			c->mod_skip = CONN_MOD_PROBE;
	}
	if (!taken || !c->transmission || c->closing || c->broken ||
	    atomic_load_explicit(&c->disk->rings_started, memory_order_relaxed))
		return;
	if (c->tls && taken >= CONN_MOD_TLS_MAX)
		return;
	if (!c->mod_on && c->mod_skip) {
		c->mod_skip--;
		return;
	}
	c->mod_waited = true;
	ctr_add(&c->srv->coalesced_waits, 1);
	loop_moderate(c->t->loop, CONN_MOD_NS);
}

static void conn_cb(void *opaque, uint32_t events)
{
	struct nbds_conn *c = opaque;
	uint64_t taken = c->taken, t0 = conn_yield_t0(c);

	if (c->tls && !c->tls_up && !c->broken) {
		if (events & (EPOLLERR | EPOLLHUP))
			conn_fail(c, "hung up in its TLS handshake");
		else
			conn_tls_step(c);
		/* Up: what the client sent right behind its Finished may be
		 * decrypted already, where epoll cannot see it. */
		if (c->tls_up) {
			conn_read(c);
			conn_flush(c);
		}
		conn_update_events(c);
		conn_maybe_finish(c);
		return;
	}
	if (events & (EPOLLERR | EPOLLHUP)) {
		/* Nothing more can be sent; a hang-up may still leave input
		 * to read (a DISC and the requests before it). */
		if (events & EPOLLERR)
			c->broken = c->closing = true;
	}
	if (events & EPOLLOUT)
		conn_flush(c);
	/* Also when replies just went out: requests may wait in our buffer
	 * (or decrypted in the TLS session) with nothing more to come from
	 * the socket, so no EPOLLIN would ever say so. */
	if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ||
	    (conn_can_read(c) && conn_input_waits(c)))
		conn_read(c);
	if (events & EPOLLHUP)
		c->closing = true;
	conn_flush(c);
	conn_moderate(c, c->taken - taken);
	conn_update_events(c);
	conn_yield(c, t0);
	conn_maybe_finish(c);
}

static void conn_flush_bh(void *opaque)
{
	struct nbds_conn *c = opaque;
	bool could_read = conn_can_read(c);
	uint64_t t0 = conn_yield_t0(c);

	/* Yielding: a completion lets the next parked request go. */
	if (unlikely(c->yielding) && c->thr_head)
		conn_unthrottle(c, false);
	conn_flush(c);
	/* Completions may have made room: take what waits in the socket. */
	if (!could_read || conn_input_waits(c))
		conn_read(c);
	conn_flush(c);
	conn_update_events(c);
	conn_yield(c, t0);
	conn_maybe_finish(c);
}

/*
 * The poll handler of a plain connection in transmission (loop.h "Poll
 * handler"): with nothing in flight, the client's next request is what
 * comes next, a few microseconds after our reply reaches it (a QD1
 * client); the loop finds it by receiving within its adaptive window
 * instead of sleeping in epoll_wait and being woken by it (on a VM, a
 * wake-up from a halted vCPU costs tens of microseconds).  A socket has
 * no memory to peek at: poll() is a recv(MSG_DONTWAIT) into our buffer,
 * one syscall a pass, and keeps what it got.  Not while requests are in
 * flight (their completions are what comes next, and a window spun for
 * them, for a device, must not be slowed by a syscall a pass), nor
 * through TLS (GnuTLS reads through its own pull function).  begin() and
 * end() have nothing to switch: the fd stays level-triggered in epoll,
 * so what came while the loop polled is an event as it sleeps.
 */
static bool conn_poll_quiet(void *opaque)
{
	const struct nbds_conn *c = opaque;

	return c->inflight || c->finished || !conn_can_read(c);
}

static bool conn_poll(void *opaque)
{
	struct nbds_conn *c = opaque;
	size_t want;
	ssize_t n;

	if (conn_poll_quiet(c) || conn_input_waits(c))
		return false;
	c->in_pos = c->in_len = 0;
	want = NBDS_INBUF;
	n = recv(c->fd, c->in, want, MSG_DONTWAIT);
	if (n > 0) {
		c->in_len = (size_t)n;
		c->in_drained = (size_t)n < want;
		return true;
	}
	/* The end of input or an error: conn_read's receive meets it again
	 * (a socket's EOF stays; an error ends in EOF) and acts on it. */
	return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void conn_poll_run(void *opaque)
{
	/* As an EPOLLIN: conn_read parses what conn_poll received, or
	 * meets the end of input or the error conn_poll found. */
	conn_cb(opaque, EPOLLIN);
}

static void conn_poll_begin(void *opaque)
{
}

static bool conn_poll_end(void *opaque)
{
	return false;
}

static uint64_t conn_poll_work(void *opaque)
{
	const struct nbds_conn *c = opaque;

	return c->taken;
}

static const struct loop_poll_ops conn_poll_ops = {
	.poll = conn_poll,
	.run = conn_poll_run,
	.begin = conn_poll_begin,
	.end = conn_poll_end,
	.quiet = conn_poll_quiet,
	.work = conn_poll_work,
};

static void conn_update_events(struct nbds_conn *c)
{
	uint32_t ev = 0;

	if (c->broken || c->finished) {
		if (c->h) {
			loop_fd_del(c->t->loop, c->h);
			c->h = NULL;
		}
		return;
	}
	if (c->tls && !c->tls_up)
		ev = c->tls_events;
	if (conn_can_read(c))
		ev |= EPOLLIN;
	if (c->want_out)
		ev |= EPOLLOUT;
	if (ev != c->events && c->h && loop_fd_mod(c->t->loop, c->h, ev) == 0)
		c->events = ev;
}

static void hs_timer_cb(void *opaque)
{
	struct nbds_conn *c = opaque;

	if (c->transmission || c->finished)
		return;
	conn_fail(c, "did not finish its handshake in 10 s");
	conn_update_events(c);
	conn_maybe_finish(c);
}

/* Done when closing, nothing in flight and nothing left to send (or
 * nothing can be sent): hand the connection to the main thread. */
static void conn_finish(struct nbds_conn *c)
{
	struct nbds *s = c->srv;

	c->finished = true;
	meta_reset(c);
	if (c->h)
		loop_fd_del(c->t->loop, c->h);
	c->h = NULL;
	conn_drop_output(c);
	loop_timer_free(c->hs_timer);
	loop_timer_free(c->qos_timer);
	loop_bh_free(c->flush_bh);
	c->hs_timer = NULL;
	c->qos_timer = NULL;
	c->flush_bh = NULL;
	if (c->tls_up && !c->broken)
		nbds__tls_bye(c->tls);
	nbds__tls_sess_free(c->tls);
	c->tls = NULL;
	c->tls_up = false;
	free(c->tls_stage);
	c->tls_stage = NULL;
	shutdown(c->fd, SHUT_RDWR);
	sys_close(&c->fd);
	if (c->cur) {
		free(c->cur->buf);
		free(c->cur);
		c->cur = NULL;
	}
	while (c->pool) {
		struct nbds_req *r = c->pool;

		c->pool = r->pool_next;
		free(r->buf);
		free(r);
	}
	c->npool = 0;
	pthread_mutex_lock(&s->dead_lock);
	c->next_dead = s->dead;
	s->dead = c;
	pthread_mutex_unlock(&s->dead_lock);
	sys_eventfd_signal(s->dead_efd);
}

static void conn_maybe_finish(struct nbds_conn *c)
{
	/* A broken socket ends the connection as a close does: its
	 * epoll handle is gone (conn_update_events), so nothing but this
	 * would ever finish it (its fd, its max-conn slot, its claim). */
	if (c->broken)
		c->closing = true;
	if (c->finished || !c->closing || c->inflight)
		return;
	if (c->oq && !c->broken)
		return;		/* the replies go first */
	conn_finish(c);
}

/* ---- Main thread ---- */

struct nbds_conn *nbds__conn_new(struct nbds_export *ex, struct disk_iothread *t, int fd)
{
	struct nbds_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->in = malloc(NBDS_INBUF);
	if (!c->in) {
		free(c);
		return NULL;
	}
	c->srv = ex->srv;
	c->ex = ex;
	c->disk = ex->srv->disk;
	c->t = t;
	c->ys = ex->ys ? &ex->ys[t->idx] : NULL;
	c->fd = fd;
	c->oq_tail = &c->oq;
	c->read_only = ex->o.read_only || c->disk->b->read_only ||
		       (ex->o.incoming && atomic_load(&c->disk->rings_started));
	return c;
}

struct start_call {
	struct nbds_conn *c;
	int ret;
};

static void do_start(void *opaque)
{
	struct start_call *sc = opaque;
	struct nbds_conn *c = sc->c;
	struct loop *l = c->t->loop;
	struct {
		uint64_t magic, opt;
		uint16_t flags;
	} __attribute__((packed)) greet = {
		htobe64(NBD_MAGIC), htobe64(NBD_IHAVEOPT),
		htobe16(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES) };
	int r;

	c->thr_tail = &c->thr_head;
	c->held_tail = &c->held_head;
	r = loop_bh_new(l, conn_flush_bh, c, &c->flush_bh);
	if (r == 0)
		r = loop_timer_new(l, hs_timer_cb, c, &c->hs_timer);
	if (r == 0)
		r = loop_timer_new(l, qos_timer_cb, c, &c->qos_timer);
	if (r == 0)
		r = loop_fd_add(l, c->fd, EPOLLIN, conn_cb, c, &c->h);
	if (r < 0) {
		loop_bh_free(c->flush_bh);
		loop_timer_free(c->hs_timer);
		loop_timer_free(c->qos_timer);
		c->flush_bh = NULL;
		c->hs_timer = NULL;
		c->qos_timer = NULL;
		sc->ret = r;
		return;
	}
	c->events = EPOLLIN;
	c->st = CS_CLIENT_FLAGS;
	/* "Fixed newstyle negotiation": the server speaks first. */
	send_raw(c, &greet, sizeof(greet));
	loop_timer_mod(c->hs_timer, sys_now_ns() + NBDS_HANDSHAKE_NS);
	sc->ret = 0;
}

int nbds__conn_start(struct nbds_conn *c)
{
	struct start_call sc = { c, 0 };

	loop_call_sync(c->t->loop, do_start, &sc);
	return sc.ret;
}

/* Held requests fail (EIO to a client that may still read it). */
static void conn_fail_held(struct nbds_conn *c)
{
	struct nbds_req *r = c->held_head;

	if (!r)
		return;
	log_warn("nbd: %u request%s held by the error policy failed: the connection "
		 "closes", c->nheld, c->nheld == 1 ? "" : "s");
	disk_unhold(c->disk, c->nheld);
	c->held_head = NULL;
	c->held_tail = &c->held_head;
	c->nheld = 0;
	while (r) {
		struct nbds_req *next = r->held_next;

		c->inflight--;
		r->err = NBD_EIO;
		req_reply(c, r);
		r = next;
	}
}

static void do_shutdown(void *opaque)
{
	struct nbds_conn *c = opaque;

	if (c->finished)
		return;
	c->closing = true;
	c->broken = true;
	/* What waits for the QoS budget goes now, over it; what the error
	 * policy holds fails (its client is gone or being sent away). */
	if (c->thr_head)
		conn_unthrottle(c, true);
	conn_fail_held(c);
	/* What it has in flight completes first: its buffers are the
	 * engine's until then.  This drains every I/O of the iothread, the
	 * other fronts' too, which only takes as long as they last. */
	disk_kick(c->disk, c->t);
	disk_drain(c->disk, c->t);
	conn_finish(c);
}

struct resume_call {
	struct nbds_conn *c;
	unsigned n;
	struct acct *sum;	/* nbds__conn_acct */
};

/* The disk resumed: what is held goes again, in order; then the
 * connection looks for work again (flush_bh: reads if it can). */
static void do_resume(void *opaque)
{
	struct resume_call *rc = opaque;
	struct nbds_conn *c = rc->c;
	struct nbds_req *r = c->held_head;

	if (c->finished)
		return;
	c->held_head = NULL;
	c->held_tail = &c->held_head;
	disk_unhold(c->disk, c->nheld);
	c->nheld = 0;
	while (r) {
		struct nbds_req *next = r->held_next;

		c->inflight--;
		req_submit(c, r, r->io.op);
		rc->n++;
		r = next;
	}
	disk_kick(c->disk, c->t);
	loop_bh_schedule(c->flush_bh);
}

static void do_acct(void *opaque)
{
	struct resume_call *rc = opaque;

	acct_add(rc->sum, &rc->c->acct);
}

void nbds__conn_acct(struct nbds_conn *c, struct acct *sum)
{
	struct resume_call rc = { .c = c, .sum = sum };

	/* Its iothread's, also once finished (the disk's loops outlive it). */
	loop_call_sync(c->t->loop, do_acct, &rc);
}

unsigned nbds__conn_resume(struct nbds_conn *c)
{
	struct resume_call rc = { c, 0 };

	loop_call_sync(c->t->loop, do_resume, &rc);
	return rc.n;
}

void nbds__conn_shutdown(struct nbds_conn *c)
{
	loop_call_sync(c->t->loop, do_shutdown, c);
}

void nbds__conn_free(struct nbds_conn *c)
{
	free(c->opt_data);
	free(c->in);
	free(c);
}

struct nbds_export *nbds__conn_export(const struct nbds_conn *c)
{
	return c->ex;
}

struct nbds_conn **nbds__conn_next(struct nbds_conn *c)
{
	return &c->next_all;
}

struct nbds_conn **nbds__conn_next_dead(struct nbds_conn *c)
{
	return &c->next_dead;
}
