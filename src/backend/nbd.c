/*
 * nbd engine: an NBD export through libnbd (--disk nbd://HOST[:PORT]/EXPORT,
 * nbd+unix:///EXPORT?socket=PATH, any URI nbd_connect_uri(3) takes).
 *
 * Each iothread has its own connection, driven by its loop with libnbd's
 * non-blocking API: the socket is watched for what libnbd wants
 * (nbd_aio_get_direction), and nbd_aio_notify_read/write run its state
 * machine.  Commands complete in libnbd callbacks on the iothread; since a
 * callback may not call libnbd on its handle, it only queues the request,
 * and the queue is run once libnbd has returned (and may then issue the
 * next command, e.g. a FUA write's flush).  No thread of ours, no lock.
 *
 * What the server cannot do is not offered: FUA (bdev.c then flushes after
 * such writes), flush (a server without it has no cache to flush), trim,
 * write zeroes; a read-only export is exported read-only.  Several
 * iothreads need the server's multi-conn promise (flushes on one
 * connection cover writes on the others).
 *
 * A server that goes away fails what was in flight and everything sent
 * until it is back (I/O errors to the guest, never a wait), and the
 * connection is retried in the background with a growing delay, logged.
 */
#include <errno.h>
#include <libnbd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "config.h"
#include "backend/bdev.h"
#include "backend/module.h"
#include "loop/loop.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sys.h"

/* Connecting (TCP, handshake) must finish in this time. */
#define NBD_CONNECT_TIMEOUT_MS 10000
/* Draining waits this long for a server that stopped answering. */
#define NBD_DRAIN_TIMEOUT_MS 30000
/* Replies taken in one go before the loop looks at its other fds. */
#define NBD_REPLIES_PER_WAKE 64
/* Reconnect delays: 1 s, doubling up to 30 s. */
#define NBD_RETRY_MIN_S 1
#define NBD_RETRY_MAX_S 30

struct nbd_disk {
	char *uri;
	struct nbd_handle *spare;	/* bdev_open's connection, for the first ctx */
	uint64_t size;			/* the export's, at open */
	uint64_t max_payload;		/* bytes one read or write may carry */
};

/* What one NBD read or write may carry when the server does not say: the
 * protocol's (clients SHOULD NOT send more than 32 MiB unaware of the
 * server's maximum); libnbd refuses more than 64 MiB in any case. */
#define NBD_PAYLOAD_DEFAULT (32u << 20)
#define NBD_PAYLOAD_LIBNBD (64u << 20)

enum nbd_state {
	NBD_UP,
	NBD_DOWN,		/* gone; a retry is scheduled */
	NBD_CONNECTING,		/* a retry is connecting */
};

struct bdev_ctx {
	struct bdev *b;
	struct nbd_disk *d;
	struct loop *loop;
	struct nbd_handle *h;
	struct loop_fd *fd_h;
	uint32_t events;		/* what fd_h watches */
	enum nbd_state state;
	struct loop_timer *retry;	/* next connection attempt / its deadline */
	unsigned retry_s;
	unsigned inflight;		/* commands libnbd holds */
	/* Completed in callbacks, run after libnbd returned. */
	struct bdev_io *done_head, **done_tail;
	uint64_t failed;		/* requests failed while the server was away */
	/* Writes the server acknowledged on this connection, and how many
	 * of them a completed flush covers: while they differ, the server
	 * may hold some only in a cache, and losing the connection may have
	 * lost them (a server restarted; NBD flushes cover only their own
	 * connection's writes without multi-conn).  The next flush then
	 * fails (lost_unflushed): the guest learns it, as fsync(2) reports a
	 * writeback error, instead of a flush that says all is durable. */
	uint64_t writes, durable;
	bool lost_unflushed;
};

/* ---- Connecting (blocking, with a deadline; start-up only) ---- */

static void nbd_say_err(char *err, size_t errlen, const char *uri, const char *what)
{
	const char *e = nbd_get_error();

	snprintf(err, errlen, "NBD export '%s': %s: %s", uri, what, e ? e : strerror(nbd_get_errno()));
}

/* Connect h to uri within NBD_CONNECT_TIMEOUT_MS.  Returns 0 or -errno
 * with one line in err. */
static int nbd_connect_blocking(struct nbd_handle *h, const char *uri, char *err, size_t errlen)
{
	uint64_t deadline = sys_now_ns() + NBD_CONNECT_TIMEOUT_MS * 1000000ull;

	/* The URI is the operator's (--disk, vblkctl mirror --target): its
	 * tls-certificates=DIR and tls-psk-file=FILE name our own files
	 * (libnbd refuses them unless told, nbd_connect_uri(3)). */
	nbd_set_uri_allow_local_file(h, true);
	if (nbd_aio_connect_uri(h, uri) < 0) {
		int r = -(nbd_get_errno() ? nbd_get_errno() : EINVAL);

		nbd_say_err(err, errlen, uri, r == -EINVAL ? "not an NBD URI (nbd://HOST[:PORT]/"
			"EXPORT or nbd+unix:///EXPORT?socket=PATH)" : "cannot connect (is "
			"the server up?)");
		return r;
	}
	while (nbd_aio_is_connecting(h)) {
		uint64_t now = sys_now_ns();

		if (now >= deadline) {
			snprintf(err, errlen, "NBD export '%s': no answer within %d s: is "
				 "the server up and the address right?", uri,
				 NBD_CONNECT_TIMEOUT_MS / 1000);
			return -ETIMEDOUT;
		}
		if (nbd_poll(h, (int)((deadline - now) / 1000000) + 1) < 0)
			break;
	}
	if (!nbd_aio_is_ready(h)) {
		nbd_say_err(err, errlen, uri, "cannot connect (is the server up, the export "
			"name right?)");
		return -ECONNREFUSED;
	}
	return 0;
}

static int nbd_disk_open(struct bdev *b, const struct bdev_opts *o, char *err,
			 size_t errlen)
{
	struct nbd_disk *d = calloc(1, sizeof(*d));
	struct nbd_handle *h = NULL;
	int64_t size, minbs;
	int r;

	if (!d || !(d->uri = strdup(o->path)) || !(h = nbd_create())) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto err;
	}
	r = nbd_connect_blocking(h, o->path, err, errlen);
	if (r < 0)
		goto err;
	size = nbd_get_size(h);
	if (size < 0) {
		nbd_say_err(err, errlen, o->path, "cannot read its size");
		r = -EIO;
		goto err;
	}
	minbs = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
	b->block_size = o->block_size ? o->block_size : minbs > 512 ? (unsigned)minbs : 512;
	if (minbs > (int64_t)b->block_size || b->block_size > 4096) {
		snprintf(err, errlen, "NBD export '%s' needs %lld-byte blocks: use "
			 "--block-size 4096 or another export", o->path, (long long)minbs);
		r = -EINVAL;
		goto err;
	}
	b->phys_block_size = b->block_size;
	b->discard_granularity = b->block_size;
	b->size = (uint64_t)size - (uint64_t)size % b->block_size;
	if (!b->size) {
		snprintf(err, errlen, "NBD export '%s' is empty", o->path);
		r = -EINVAL;
		goto err;
	}
	b->read_only = o->read_only || nbd_is_read_only(h) == 1;
	if (b->read_only && !o->read_only)
		log_info("NBD export %s is read-only: exported read-only", o->path);
	if (nbd_can_fua(h) != 1)
		b->caps &= ~BDEV_CAP_FUA;
	if (nbd_can_trim(h) != 1)
		b->caps &= ~BDEV_CAP_DISCARD;
	if (nbd_can_zero(h) != 1)
		b->caps &= ~BDEV_CAP_WRITE_ZEROES;
	b->max_ctxs = nbd_can_multi_conn(h) == 1 ? 0 : 1;
	d->size = (uint64_t)size;
	{
		int64_t maxbs = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);

		/* Bounced parts are BDEV_BOUNCE_MAX: a server that takes
		 * less fails those (not seen: qemu-nbd takes 32 MiB). */
		d->max_payload = maxbs > 0 ? MIN((uint64_t)maxbs, NBD_PAYLOAD_LIBNBD) :
					     NBD_PAYLOAD_DEFAULT;
		d->max_payload = MAX(d->max_payload, (uint64_t)BDEV_BOUNCE_MAX);
	}
	d->spare = h;
	b->priv = d;
	log_info("NBD export %s: %llu bytes, %s%s%s%s%s", o->path, (unsigned long long)size,
		 nbd_can_flush(h) == 1 ? "flush" : "no flush",
		 b->caps & BDEV_CAP_FUA ? ", fua" : "",
		 b->caps & BDEV_CAP_DISCARD ? ", trim" : "",
		 b->caps & BDEV_CAP_WRITE_ZEROES ? ", zero" : "",
		 b->max_ctxs ? "" : ", multi-conn");
	return 0;

err:
	nbd_close(h);
	if (d)
		free(d->uri);
	free(d);
	return r;
}

/* bdev_pread: on bdev_open's connection, before the first ctx takes it. */
static int nbd_disk_pread(struct bdev *b, void *buf, size_t len, uint64_t off)
{
	struct nbd_disk *d = b->priv;

	if (!d->spare)
		return -EBUSY;
	if (nbd_pread(d->spare, buf, len, off, 0) < 0) {
		int e = nbd_get_errno();

		log_err("NBD export %s: %s", d->uri, nbd_get_error());
		return e > 0 ? -e : -EIO;
	}
	return 0;
}

static void nbd_disk_close(struct bdev *b)
{
	struct nbd_disk *d = b->priv;

	nbd_close(d->spare);
	free(d->uri);
	free(d);
}

/* ---- The connection in the loop (iothread) ---- */

static void nbd_conn_retry_cb(void *opaque);

/* Run what completed in callbacks.  Completion may submit again (a FUA
 * write's flush): that is fine here, libnbd has returned. */
static void nbd_run_done(struct bdev_ctx *c)
{
	while (c->done_head) {
		struct bdev_io *io = c->done_head;

		c->done_head = io->next;
		if (!c->done_head)
			c->done_tail = &c->done_head;
		c->inflight--;
		if (io->res == 0 && io->op == BDEV_WRITE &&
		    !(io->fua && (c->b->caps & BDEV_CAP_FUA)))
			c->writes++;
		else if (io->res == 0 && io->op == BDEV_FLUSH)
			c->durable = MAX(c->durable, io->mark);
		bdev_complete(io, io->res);
	}
}

/* io->res while libnbd holds the request. */
#define IO_ISSUING  2		/* inside nbd_aio_*() */
#define IO_INFLIGHT 1		/* issued, no answer yet */

static void nbd_queue_done(struct bdev_io *io, int res)
{
	struct bdev_ctx *c = io->ctx;

	io->res = res;
	io->next = NULL;
	*c->done_tail = io;
	c->done_tail = &io->next;
}

static int nbd_cmd_done(void *user_data, int *error)
{
	nbd_queue_done(user_data, *error ? -*error : 0);
	return 1;		/* retire the command */
}

/* libnbd frees every command exactly once, also those it never answers
 * (a handle closed with requests in flight): those fail here. */
static void nbd_cmd_free(void *user_data)
{
	struct bdev_io *io = user_data;

	if (io->res == IO_INFLIGHT)
		nbd_queue_done(io, -ENOTCONN);
}

/* Watch the socket for what libnbd waits for. */
static void nbd_conn_watch(struct bdev_ctx *c)
{
	unsigned dir = nbd_aio_get_direction(c->h);
	uint32_t ev = (dir & LIBNBD_AIO_DIRECTION_READ ? EPOLLIN : 0) |
		      (dir & LIBNBD_AIO_DIRECTION_WRITE ? EPOLLOUT : 0);

	if (ev != c->events && loop_fd_mod(c->loop, c->fd_h, ev) == 0)
		c->events = ev;
}

/* Close the connection; what it still had in flight fails (nbd_cmd_free)
 * and is completed by the caller's nbd_run_done. */
static void nbd_conn_drop(struct bdev_ctx *c)
{
	loop_fd_del(c->loop, c->fd_h);
	c->fd_h = NULL;
	nbd_close(c->h);
	c->h = NULL;
	c->events = 0;
}

/* The server is gone (or never came back): fail what is pending, retry
 * later. */
static void nbd_conn_lost(struct bdev_ctx *c, const char *why)
{
	bool was_up = c->state == NBD_UP;
	/* A server without flush has no cache: what it acknowledged is
	 * stored (-1, not known: as if it had one). */
	bool cache = c->h && nbd_can_flush(c->h) != 0;

	nbd_conn_drop(c);
	nbd_run_done(c);
	if (cache && c->writes != c->durable) {
		log_err("NBD export %s: %llu acknowledged writes were not yet flushed when "
			"the connection was lost; the next flush fails", c->d->uri,
			(unsigned long long)(c->writes - c->durable));
		c->lost_unflushed = true;
	}
	c->durable = c->writes;
	c->state = NBD_DOWN;
	if (was_up) {
		c->retry_s = NBD_RETRY_MIN_S;
		log_err("NBD export %s: %s; requests fail until it is back, retrying "
			"the connection every %d-%d s", c->d->uri, why, NBD_RETRY_MIN_S,
			NBD_RETRY_MAX_S);
	} else {
		c->retry_s = MIN(c->retry_s * 2, NBD_RETRY_MAX_S);
	}
	loop_timer_mod(c->retry, sys_now_ns() + c->retry_s * 1000000000ull);
}

/*
 * A reconnection (NBD_CONNECTING) whose handshake may have ended: then
 * the export serves again.  Checked after every call into libnbd while
 * connecting, the first one included (nbd_conn_settle): libnbd runs the
 * handshake until it would block, so when the server's answers are
 * already waiting (a fast server, this thread preempted between its sends
 * and its reads), it ends inside nbd_aio_connect_uri, and no event ever
 * comes for it (regression: such an attempt waited out
 * NBD_CONNECT_TIMEOUT_MS and was dropped, again and again, while the disk
 * failed every request).
 */
static void nbd_conn_check_up(struct bdev_ctx *c)
{
	int64_t size;

	if (!nbd_aio_is_ready(c->h))
		return;
	size = nbd_get_size(c->h);
	loop_timer_del(c->retry);
	c->state = NBD_UP;
	log_info("NBD export %s: connected again (%llu requests failed while it was "
		 "away)", c->d->uri, (unsigned long long)c->failed);
	c->failed = 0;
	if (size >= 0 && (uint64_t)size != c->d->size)
		log_warn("NBD export %s is now %lld bytes (was %llu): the guest still sees "
			 "the old size", c->d->uri, (long long)size,
			 (unsigned long long)c->d->size);
}

/*
 * After every call into libnbd: a connection that died inside it (libnbd
 * then fails its commands, calling our callbacks, and closes the socket,
 * so no event will ever come for it again) is handled now; otherwise run
 * what completed, watch for what libnbd waits for, and see whether a
 * reconnection's handshake has ended.  Returns false if the connection is
 * gone.
 */
static bool nbd_conn_settle(struct bdev_ctx *c)
{
	if (nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h)) {
		const char *e = nbd_get_error();

		nbd_conn_lost(c, c->state == NBD_UP ? "the connection to the server was lost" :
			  e ? e : "cannot connect");
		return false;
	}
	nbd_run_done(c);
	if (!c->h)
		return false;
	nbd_conn_watch(c);
	if (unlikely(c->state == NBD_CONNECTING))
		nbd_conn_check_up(c);
	return true;
}

/* Look at the socket without reading it: one recv(MSG_PEEK) syscall.
 * > 0: data, 0: the server's end, -1 and errno: nothing yet (EAGAIN) or
 * an error. */
static ssize_t nbd_conn_peek(struct bdev_ctx *c)
{
	char b;

	return recv(nbd_aio_get_fd(c->h), &b, 1, MSG_PEEK | MSG_DONTWAIT);
}

/* A reply (or the connection's end) waits on the socket. */
static bool nbd_conn_readable(struct bdev_ctx *c)
{
	return nbd_conn_peek(c) >= 0;
}

/*
 * libnbd reads one reply per nbd_aio_notify_read(): its READY state then
 * waits for the next notification even when more replies are already on
 * the socket.  Take all of them now (up to NBD_REPLIES_PER_WAKE), so that
 * their completions are one batch, one call at most, instead of one loop
 * iteration and one batch each (regression: NBD randread QD32 ran below
 * qemu-storage-daemon with a p99 1.6x its, the requests' completions
 * queued behind a loop iteration each).
 */
static void nbd_conn_read_replies(struct bdev_ctx *c)
{
	for (unsigned n = 1; nbd_aio_notify_read(c->h) == 0; n++) {
		if (n >= NBD_REPLIES_PER_WAKE || nbd_aio_in_flight(c->h) <= 0 ||
		    !nbd_aio_is_ready(c->h) || !nbd_conn_readable(c))
			break;
	}
}

/*
 * Nothing to read on the socket now (and no end or error to find there).
 * libnbd takes nbd_aio_notify_read() in its READY state for a promise:
 * REPLY.START reads, and on EAGAIN it stays in REPLY.START waiting for a
 * reply, sending nothing it is given meanwhile (states-reply.c: "This
 * should never happen").  With every command it sent answered, no reply
 * comes and the connection is wedged.  An epoll event can be stale by the
 * time it is dispatched: a ring's stop, run earlier in the same batch of
 * events on this iothread, drains the engine and reads the socket dry
 * (regression: an upgrade's drain waited 30 s for the other queue's 8
 * requests, never sent; tests/remote/nbd_stale.c).  So the socket is asked
 * first, as the polling path does.
 */
static bool nbd_conn_nothing_to_read(struct bdev_ctx *c)
{
	return nbd_conn_peek(c) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

static void nbd_conn_fd_cb(void *opaque, uint32_t events)
{
	struct bdev_ctx *c = opaque;

	if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !nbd_conn_nothing_to_read(c))
		nbd_conn_read_replies(c);
	if ((events & EPOLLOUT) && !nbd_aio_is_dead(c->h))
		(void)nbd_aio_notify_write(c->h);
	(void)nbd_conn_settle(c);
}

/* Poll handler: a reply waiting on the socket (or its end), found by a
 * polling loop without waiting for epoll: one recv(MSG_PEEK) syscall per
 * look, only while requests are in flight. */
static bool nbd_conn_poll(void *opaque)
{
	struct bdev_ctx *c = opaque;

	return c->state == NBD_UP && c->inflight && nbd_conn_readable(c);
}

static void nbd_conn_poll_run(void *opaque)
{
	struct bdev_ctx *c = opaque;

	nbd_conn_read_replies(c);
	(void)nbd_conn_settle(c);
}

static void nbd_conn_poll_begin(void *opaque)
{
	/* The socket stays in epoll; nothing to switch off. */
}

/* Completions are expected while I/O is in flight (loop.h: armed). */
static bool nbd_conn_poll_armed(void *opaque)
{
	struct bdev_ctx *c = opaque;

	return c->state == NBD_UP && c->inflight;
}

static const struct loop_poll_ops nbd_conn_poll_ops = {
	.poll = nbd_conn_poll,
	.run = nbd_conn_poll_run,
	.begin = nbd_conn_poll_begin,
	.end = nbd_conn_poll,
	.armed = nbd_conn_poll_armed,
};

/* Take h (connected, or connecting) into the loop. */
static int nbd_conn_attach(struct bdev_ctx *c, struct nbd_handle *h)
{
	int fd = nbd_aio_get_fd(h), r;

	if (fd < 0)
		return -EIO;
	c->h = h;
	c->events = 0;
	r = loop_fd_add(c->loop, fd, 0, nbd_conn_fd_cb, c, &c->fd_h);
	if (r < 0) {
		c->h = NULL;
		return r;
	}
	loop_fd_set_poll(c->fd_h, &nbd_conn_poll_ops);
	nbd_conn_watch(c);
	return 0;
}

/* The retry timer: a new attempt, or the end of one that took too long. */
static void nbd_conn_retry_cb(void *opaque)
{
	struct bdev_ctx *c = opaque;
	struct nbd_handle *h;

	if (c->state == NBD_CONNECTING) {
		nbd_conn_lost(c, "no answer");
		return;
	}
	h = nbd_create();
	if (h)
		nbd_set_uri_allow_local_file(h, true);	/* as nbd_connect_blocking */
	if (!h || nbd_aio_connect_uri(h, c->d->uri) < 0 || nbd_conn_attach(c, h) < 0) {
		nbd_close(h);
		c->retry_s = MIN(c->retry_s * 2, NBD_RETRY_MAX_S);
		loop_timer_mod(c->retry, sys_now_ns() + c->retry_s * 1000000000ull);
		return;
	}
	c->state = NBD_CONNECTING;
	log_info("NBD export %s: reconnecting", c->d->uri);
	loop_timer_mod(c->retry, sys_now_ns() + NBD_CONNECT_TIMEOUT_MS * 1000000ull);
	(void)nbd_conn_settle(c);
}

/* ---- I/O (iothread) ---- */

static void nbd_submit(struct bdev_ctx *c, struct bdev_io *io)
{
	nbd_completion_callback cb = { .callback = nbd_cmd_done, .user_data = io,
				       .free = nbd_cmd_free };
	int64_t cookie;

	if (c->state != NBD_UP) {
		c->failed++;
		bdev_complete(io, -ENOTCONN);
		return;
	}
	/* libnbd reads and writes one buffer per command, of at most
	 * max_payload bytes: a guest's request may have many segments, and
	 * one segment may be up to 4 GiB (bounced I/O goes in 1 MiB parts). */
	if ((io->op == BDEV_READ || io->op == BDEV_WRITE) && !io->bounce &&
	    (io->iovcnt > 1 || io->len > c->d->max_payload) && bdev_io_bounce(io) < 0) {
		bdev_complete(io, -ENOMEM);
		return;
	}
	io->res = IO_ISSUING;
	switch (io->op) {
	case BDEV_READ:
		cookie = nbd_aio_pread(c->h, io->iov[0].iov_base, io->len, io->offset, cb, 0);
		break;
	case BDEV_WRITE:
		cookie = nbd_aio_pwrite(c->h, io->iov[0].iov_base, io->len, io->offset, cb,
					io->fua && (c->b->caps & BDEV_CAP_FUA) ?
					LIBNBD_CMD_FLAG_FUA : 0);
		break;
	case BDEV_FLUSH:
		if (unlikely(c->lost_unflushed)) {
			c->lost_unflushed = false;
			io->lost = true;
			bdev_complete(io, -EIO);
			return;
		}
		if (nbd_can_flush(c->h) != 1) {
			bdev_complete(io, 0);	/* nothing cached to flush */
			return;
		}
		io->mark = c->writes;
		cookie = nbd_aio_flush(c->h, cb, 0);
		break;
	case BDEV_DISCARD:
		cookie = nbd_aio_trim(c->h, io->length, io->offset, cb, 0);
		break;
	case BDEV_WRITE_ZEROES:
		cookie = nbd_aio_zero(c->h, io->length, io->offset, cb,
				      io->unmap ? 0 : LIBNBD_CMD_FLAG_NO_HOLE);
		break;
	default:
		cookie = -1;
	}
	if (cookie < 0) {
		int e = nbd_get_errno();

		bdev_complete(io, -(e ? e : EIO));
		if (c->h)
			(void)nbd_conn_settle(c);
		return;
	}
	if (io->res == IO_ISSUING)
		io->res = IO_INFLIGHT;
	c->inflight++;
	/* Sending may have found the server gone (regression: the requests
	 * libnbd failed then were never completed). */
	(void)nbd_conn_settle(c);
}

static void nbd_kick(struct bdev_ctx *c)
{
	/* libnbd sends each command as it is issued. */
}

static int nbd_drain_flush_done(void *user_data, int *error)
{
	*(int *)user_data = *error ? -*error : 0;
	return 1;
}

/* Until everything in flight completed, or the server stopped answering
 * for NBD_DRAIN_TIMEOUT_MS: then the connection is dropped, which fails
 * the rest (never a stuck iothread). */
static void nbd_drain(struct bdev_ctx *c)
{
	uint64_t deadline = sys_now_ns() + NBD_DRAIN_TIMEOUT_MS * 1000000ull;
	int flushed = 1;

	/* Once nothing is in flight, writes not covered by a flush are
	 * flushed: a drain stops the rings (the VM stops, migrates, or
	 * vblkd hands over to its upgrade), and whoever writes next, on
	 * another connection, must find them stored. */
again:
	while (c->inflight && c->h) {
		if (sys_now_ns() >= deadline) {
			log_err("NBD export %s: %u requests unanswered after %d s (libnbd: %lld "
				"in flight, state %s)", c->d->uri, c->inflight,
				NBD_DRAIN_TIMEOUT_MS / 1000, (long long)nbd_aio_in_flight(c->h),
				nbd_connection_state(c->h) ?: "?");
			nbd_conn_lost(c, "it stopped answering");
			break;
		}
		if (nbd_poll(c->h, 100) < 0 || nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h)) {
			nbd_conn_lost(c, "the connection to the server was lost");
			break;
		}
		nbd_run_done(c);
	}
	nbd_run_done(c);
	if (flushed == 1 && c->h && c->state == NBD_UP && c->writes != c->durable &&
	    nbd_can_flush(c->h) == 1) {
		uint64_t mark = c->writes;
		nbd_completion_callback cb = { .callback = nbd_drain_flush_done,
					       .user_data = &flushed };

		flushed = 2;	/* in flight */
		if (nbd_aio_flush(c->h, cb, 0) < 0) {
			flushed = -EIO;
		} else {
			while (flushed == 2 && c->h) {
				if (sys_now_ns() >= deadline) {
					nbd_conn_lost(c, "it stopped answering");
					break;
				}
				if (nbd_poll(c->h, 100) < 0 || nbd_aio_is_dead(c->h) ||
				    nbd_aio_is_closed(c->h)) {
					nbd_conn_lost(c, "the connection to the server was lost");
					break;
				}
			}
		}
		if (flushed == 0) {
			c->durable = MAX(c->durable, mark);
		} else if (flushed != 2 && c->h) {
			log_err("NBD export %s: flush at drain: %s; the next flush fails",
				c->d->uri, strerror(-flushed));
			c->lost_unflushed = true;
		}
		goto again;
	}
	if (c->h)
		nbd_conn_watch(c);
}

static int nbd_ctx_new(struct bdev *b, struct loop *l, unsigned depth,
		       struct bdev_ctx **out)
{
	struct nbd_disk *d = b->priv;
	struct bdev_ctx *c = calloc(1, sizeof(*c));
	struct nbd_handle *h;
	char err[256];
	int r;

	if (!c)
		return -ENOMEM;
	c->b = b;
	c->d = d;
	c->loop = l;
	c->done_tail = &c->done_head;
	r = loop_timer_new(l, nbd_conn_retry_cb, c, &c->retry);
	if (r < 0)
		goto err_free;
	/* The first iothread takes bdev_open's connection, others make
	 * their own (only with multi-conn, see bdev.max_ctxs). */
	h = d->spare;
	d->spare = NULL;
	if (!h) {
		h = nbd_create();
		if (!h) {
			r = -ENOMEM;
			goto err_timer;
		}
		r = nbd_connect_blocking(h, d->uri, err, sizeof(err));
		if (r < 0) {
			log_err("%s", err);
			nbd_close(h);
			goto err_timer;
		}
	}
	r = nbd_conn_attach(c, h);
	if (r < 0) {
		nbd_close(h);
		goto err_timer;
	}
	c->state = NBD_UP;
	*out = c;
	return 0;

err_timer:
	loop_timer_free(c->retry);
err_free:
	free(c);
	return r;
}

static void nbd_ctx_free(struct bdev_ctx *c)
{
	if (!c)
		return;
	nbd_drain(c);
	loop_timer_free(c->retry);
	if (c->h) {
		(void)nbd_shutdown(c->h, 0);
		nbd_conn_drop(c);
	}
	free(c);
}

static const struct bdev_engine bdev_nbd_engine = {
	.name = "nbd",
	.caps = BDEV_CAP_DISCARD | BDEV_CAP_WRITE_ZEROES | BDEV_CAP_FUA,
	.ctx_new = nbd_ctx_new,
	.ctx_free = nbd_ctx_free,
	.submit = nbd_submit,
	.kick = nbd_kick,
	.drain = nbd_drain,
	.open = nbd_disk_open,
	.close = nbd_disk_close,
	.pread = nbd_disk_pread,
};

/* A module (bdev.h): vblkd-nbd.so. */
BDEV_MODULE_DEFINE(bdev_nbd_engine)
