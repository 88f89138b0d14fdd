/*
 * Shared between the files of src/nbd only: the server and its exports
 * (server.c, main thread) and a connection (conn.c, its iothread).
 */
#ifndef VBLK_NBDS_INTERNAL_H
#define VBLK_NBDS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "acct/acct.h"
#include "backend/bdev.h"
#include "disk/disk.h"
#include "nbd/nbd_proto.h"
#include "nbd/nbds.h"

/* What one connection may hold: requests in flight, bytes of their
 * buffers (requests and replies not yet sent), input buffered, option
 * data.  Past the first two it stops reading until completions free
 * some: a client that sends without reading its replies stalls itself,
 * not the server. */
#define NBDS_MAX_INFLIGHT	128u
#define NBDS_MAX_HELD		(64u << 20)
/* Replies queued and not yet taken by the socket: past this many it
 * stops reading too.  The held bound counts only the data of reads and
 * writes; this one bounds the rest (errors, block status, option
 * replies), each a few KiB at most, which a client that sends and never
 * reads would otherwise pile up without end. */
#define NBDS_MAX_QUEUED		256u
#define NBDS_INBUF		(64u << 10)
#define NBDS_OPT_MAX		(64u << 10)
/* A client that has not finished its handshake by then is dropped
 * (qemu-nbd's --handshake-limit default). */
#define NBDS_HANDSHAKE_NS	(10ull * 1000000000ull)

struct disk;
struct disk_iothread;
struct loop;
struct loop_fd;
struct loop_bh;
struct loop_timer;
struct nbds_conn;

/* ---- tls.c: GnuTLS ---- */

struct nbds_tls;		/* an export's credentials (main thread) */
struct nbds_tls_sess;		/* a connection's session (its iothread) */
/* "x509:DIR" or "psk:FILE" -> credentials; 0, or -errno with one line in
 * err (a file missing or unreadable, a key that does not load). */
int nbds__tls_new(const char *spec, struct nbds_tls **out, char *err, size_t errlen);
void nbds__tls_free(struct nbds_tls *t);
int nbds__tls_sess_new(struct nbds_tls *t, int fd, struct nbds_tls_sess **out);
void nbds__tls_sess_free(struct nbds_tls_sess *ss);
/* One step of the handshake: 1 done, 0 to be called again once the
 * socket is ready for *events (EPOLLIN or EPOLLOUT), -1 failed (logged). */
int nbds__tls_handshake(struct nbds_tls_sess *ss, uint32_t *events);
/* >0 bytes, 0 end of stream, -EAGAIN, or -EIO. */
ssize_t nbds__tls_recv(struct nbds_tls_sess *ss, void *buf, size_t len);
ssize_t nbds__tls_send(struct nbds_tls_sess *ss, const void *buf, size_t len);
/* Input waits inside the session, decrypted or received from the socket
 * but not yet decrypted: the socket will not say so. */
bool nbds__tls_pending(struct nbds_tls_sess *ss);
/* The last read of the socket emptied it and the session holds nothing
 * more: a reader may stop without a receive that only says EAGAIN (a
 * partial record's rest comes with an EPOLLIN). */
bool nbds__tls_drained(struct nbds_tls_sess *ss);
void nbds__tls_bye(struct nbds_tls_sess *ss);

struct nbds_export {
	struct nbds *srv;
	struct nbds_export_opts o;
	struct nbds_tls *tls;		/* NULL: no TLS (STARTTLS refused) */
	int lfd;
	struct loop_fd *lh;
	char *unix_path;		/* to remove at close; NULL for TCP */
	bool tcp;
	/* Main thread. */
	unsigned clients;
	uint64_t accepted, refused;
	bool removed;			/* freed when its last client is gone */
	atomic_bool incoming_closed;	/* incoming: a write refused, logged */
	/* A source with busy: per iothread (its index), shared by the
	 * export's connections there, touched by that thread only (conn.c,
	 * "Yielding"). */
	struct nbds_yield *ys;
	struct nbds_export *next;
};

struct nbds_yield {
	uint64_t until;		/* no request starts before (sys_now_ns) */
	unsigned out;		/* requests at the source */
};

struct nbds {
	struct disk *disk;
	struct loop *main_loop;
	struct nbds_export *exports;	/* main thread */
	struct nbds_conn *conns;	/* main thread: every live connection */
	/* Connections done on their iothread, for the main thread to free
	 * (dead_efd tells it). */
	pthread_mutex_t dead_lock;
	struct nbds_conn *dead;
	int dead_efd;
	struct loop_fd *dead_h;
	/* Counters: any thread adds (relaxed). */
	_Atomic uint64_t connections, refused, handshake_failed;
	_Atomic uint64_t requests, bad_requests, read_bytes, write_bytes;
	_Atomic uint64_t throttled;
	/* Coalescing (conn.c conn_moderate): waits, and the requests the
	 * passes after them took. */
	_Atomic uint64_t coalesced_waits, coalesced_requests;
	_Atomic uint64_t yielded;	/* conn.c, "Yielding" */
	/* The server as a front of the disk (its error policy, its
	 * accounting). */
	struct disk_front front;
	/* Accounting of the connections gone (main thread, reap). */
	struct acct retired;
};

/* ---- conn.c ---- */

/* A connection accepted on fd for export ex, to run on iothread t.
 * Main thread: nbds__conn_new, then nbds__conn_start (which hands it to
 * t).  NULL on -ENOMEM. */
struct nbds_conn *nbds__conn_new(struct nbds_export *ex, struct disk_iothread *t, int fd);
int nbds__conn_start(struct nbds_conn *c);
/* Main thread: close c now on its iothread (its requests drained
 * first); it then comes back through the dead list. */
void nbds__conn_shutdown(struct nbds_conn *c);
/* The disk resumed (disk_resume): the connection submits what the error
 * policy held again and reads on.  The number submitted.  Main thread. */
unsigned nbds__conn_resume(struct nbds_conn *c);
/* Add the connection's per-operation accounting into sum.  Main thread,
 * until it is freed. */
struct acct;
void nbds__conn_acct(struct nbds_conn *c, struct acct *sum);
/* Main thread, c on the dead list and off its iothread: free it. */
void nbds__conn_free(struct nbds_conn *c);
struct nbds_export *nbds__conn_export(const struct nbds_conn *c);
/* The main thread's list of live connections; the dead list. */
struct nbds_conn **nbds__conn_next(struct nbds_conn *c);
struct nbds_conn **nbds__conn_next_dead(struct nbds_conn *c);

#endif
