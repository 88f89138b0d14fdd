/*
 * The NBD server's exports and listeners (main thread): parse an export's
 * options, listen, accept (within max-conn, the disk claimed for each
 * client), hand each connection to an iothread (conn.c), and free the
 * ones that are done.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "disk/disk.h"
#include "loop/loop.h"
#include "nbd/nbds_internal.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/sys.h"

void nbds_export_opts_free(struct nbds_export_opts *o)
{
	free(o->addr);
	free(o->name);
	free(o->tls);
	o->addr = o->name = o->tls = NULL;
}

int nbds_export_parse(const char *spec, struct nbds_export_opts *o, char *err, size_t errlen)
{
	char *copy = strdup(spec), *save = NULL, *tok;
	int r = -EINVAL;

	*o = (struct nbds_export_opts){ .max_conn = NBDS_MAX_CONN_DEFAULT };
	if (!copy)
		return -ENOMEM;
	tok = strtok_r(copy, ",", &save);
	if (!tok || (strncmp(tok, "unix:", 5) && !strchr(tok, ':')) ||
	    (!strncmp(tok, "unix:", 5) && !tok[5])) {
		snprintf(err, errlen, "'%s': give an address first: unix:PATH or HOST:PORT "
			 "(e.g. unix:/run/vblkd/disk.nbd or 127.0.0.1:10809)", spec);
		goto out;
	}
	o->addr = strdup(tok);
	while ((tok = strtok_r(NULL, ",", &save))) {
		if (!strncmp(tok, "name=", 5)) {
			if (strlen(tok + 5) > NBDS_NAME_MAX) {
				snprintf(err, errlen, "'%s': the name is longer than %u bytes", spec,
					 NBDS_NAME_MAX);
				goto out;
			}
			free(o->name);
			o->name = strdup(tok + 5);
		} else if (!strcmp(tok, "read-only")) {
			o->read_only = true;
		} else if (!strcmp(tok, "incoming")) {
			o->incoming = true;
		} else if (!strncmp(tok, "max-conn=", 9)) {
			char *end;
			unsigned long v = strtoul(tok + 9, &end, 10);

			if (tok[9] < '0' || tok[9] > '9' || *end || v < 1 || v > 1024) {
				snprintf(err, errlen, "'%s': max-conn takes a number from 1 to 1024",
					 spec);
				goto out;
			}
			o->max_conn = (unsigned)v;
		} else if (!strncmp(tok, "tls=", 4)) {
			if (strncmp(tok + 4, "x509:", 5) && strncmp(tok + 4, "psk:", 4)) {
				snprintf(err, errlen, "'%s': tls= takes x509:DIR or psk:FILE", spec);
				goto out;
			}
			free(o->tls);
			o->tls = strdup(tok + 4);
		} else {
			snprintf(err, errlen, "'%s': unknown field '%s' (fields: name=NAME, "
				 "read-only, incoming, max-conn=N, tls=x509:DIR|psk:FILE)", spec, tok);
			goto out;
		}
	}
	if (!o->name)
		o->name = strdup("");
	r = o->addr && o->name ? 0 : -ENOMEM;
out:
	free(copy);
	if (r < 0)
		nbds_export_opts_free(o);
	return r;
}

/* ---- Connections done on their iothreads ---- */

static void export_free(struct nbds_export *ex)
{
	nbds__tls_free(ex->tls);
	nbds_export_opts_free(&ex->o);
	free(ex->unix_path);
	free(ex->ys);
	free(ex);
}

/* Free the connections their iothreads are done with. */
static void reap(struct nbds *s)
{
	struct nbds_conn *dead;

	pthread_mutex_lock(&s->dead_lock);
	dead = s->dead;
	s->dead = NULL;
	pthread_mutex_unlock(&s->dead_lock);
	while (dead) {
		struct nbds_conn *c = dead, **pp;
		struct nbds_export *ex = nbds__conn_export(c);

		dead = *nbds__conn_next_dead(c);
		for (pp = &s->conns; *pp && *pp != c; pp = nbds__conn_next(*pp))
			;
		if (*pp)
			*pp = *nbds__conn_next(c);
		nbds__conn_acct(c, &s->retired);
		nbds__conn_free(c);
		s->disk->extra_fronts--;
		disk_release(s->disk);
		ex->clients--;
		log_info("nbd: a client of export '%s' disconnected (%u left)", ex->o.name,
			 ex->clients);
		if (ex->removed && !ex->clients)
			export_free(ex);
	}
}

static void dead_cb(void *opaque, uint32_t events)
{
	struct nbds *s = opaque;

	sys_eventfd_drain(s->dead_efd);
	reap(s);
}

/* ---- Accepting ---- */

static void accept_one(struct nbds_export *ex, int fd)
{
	struct nbds *s = ex->srv;
	struct nbds_conn *c;
	char err[300];
	int one = 1, r;

	if (ex->clients >= ex->o.max_conn) {
		ex->refused++;
		atomic_fetch_add_explicit(&s->refused, 1, memory_order_relaxed);
		log_warn("nbd: export '%s' has %u clients, its max-conn: a new one refused",
			 ex->o.name, ex->clients);
		close(fd);
		return;
	}
	/* A writer needs the image lock; a format reads its tables again if
	 * no front held the disk (disk.h). */
	if ((r = disk_claim(s->disk, 0, err, sizeof(err))) < 0) {
		ex->refused++;
		/* -EBUSY: bdev_lock said who holds the disk, in one line. */
		if (r != -EBUSY)
			log_warn("nbd: a client of export '%s' refused: %s", ex->o.name, err);
		close(fd);
		return;
	}
	if (ex->tcp)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c = nbds__conn_new(ex, &s->disk->iot[disk_pick_iothread(s->disk)], fd);
	if (!c || nbds__conn_start(c) < 0) {
		log_warn("nbd: cannot take a client of export '%s': out of memory", ex->o.name);
		if (c)
			nbds__conn_free(c);
		close(fd);
		disk_release(s->disk);
		return;
	}
	*nbds__conn_next(c) = s->conns;
	s->conns = c;
	s->disk->extra_fronts++;
	ex->clients++;
	ex->accepted++;
	atomic_fetch_add_explicit(&s->connections, 1, memory_order_relaxed);
	log_info("nbd: a client connected to export '%s' on %s", ex->o.name, ex->o.addr);
}

static void listen_cb(void *opaque, uint32_t events)
{
	struct nbds_export *ex = opaque;

	/* Some at a time: the main loop has other work. */
	for (unsigned i = 0; i < 16; i++) {
		int fd = accept4(ex->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
			    errno != ECONNABORTED)
				log_warn("nbd: accept on %s: %s", ex->o.addr, strerror(errno));
			return;
		}
		accept_one(ex, fd);
	}
}

/* ---- Exports ---- */

/* disk_front.resume: every connection's held requests.  Main thread. */
static unsigned front_resume(void *opaque)
{
	struct nbds *s = opaque;
	unsigned n = 0;

	for (struct nbds_conn *c = s->conns; c; c = *nbds__conn_next(c))
		n += nbds__conn_resume(c);
	return n;
}

/* disk_front.acct: the connections gone, and each live one.  Main
 * thread. */
static void front_acct(void *opaque, struct acct *sum)
{
	struct nbds *s = opaque;

	acct_add(sum, &s->retired);
	for (struct nbds_conn *c = s->conns; c; c = *nbds__conn_next(c))
		nbds__conn_acct(c, sum);
}

int nbds_new(struct disk *d, struct loop *main_loop, struct nbds **out)
{
	struct nbds *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->disk = d;
	s->main_loop = main_loop;
	pthread_mutex_init(&s->dead_lock, NULL);
	s->dead_efd = sys_eventfd();
	if (s->dead_efd < 0) {
		r = s->dead_efd;
		goto err;
	}
	r = loop_fd_add(main_loop, s->dead_efd, EPOLLIN, dead_cb, s, &s->dead_h);
	if (r < 0) {
		close(s->dead_efd);
		goto err;
	}
	s->front = (struct disk_front){ .name = "nbd", .resume = front_resume,
					.acct = front_acct, .opaque = s };
	disk_front_add(d, &s->front);
	*out = s;
	return 0;
err:
	pthread_mutex_destroy(&s->dead_lock);
	free(s);
	return r;
}

static void export_close_listener(struct nbds_export *ex)
{
	if (ex->lh)
		loop_fd_del(ex->srv->main_loop, ex->lh);
	ex->lh = NULL;
	sys_close(&ex->lfd);
	if (ex->unix_path)
		unlink(ex->unix_path);
}

/* Disconnect ex's clients (all of them: ex NULL), their requests
 * completed first. */
static void disconnect(struct nbds *s, struct nbds_export *ex)
{
	reap(s);
	for (struct nbds_conn *c = s->conns; c; c = *nbds__conn_next(c))
		if (!ex || nbds__conn_export(c) == ex)
			nbds__conn_shutdown(c);
	reap(s);
}

void nbds_free(struct nbds *s)
{
	if (!s)
		return;
	for (struct nbds_export *ex = s->exports; ex; ex = ex->next) {
		export_close_listener(ex);
		ex->removed = true;
	}
	/* Each export is freed with its last client; those with none now. */
	while (s->exports) {
		struct nbds_export *ex = s->exports;

		s->exports = ex->next;
		if (!ex->clients)
			export_free(ex);
	}
	disconnect(s, NULL);
	disk_front_del(s->disk, &s->front);
	loop_fd_del(s->main_loop, s->dead_h);
	close(s->dead_efd);
	pthread_mutex_destroy(&s->dead_lock);
	free(s);
}

int nbds_add(struct nbds *s, const struct nbds_export_opts *o, char *err, size_t errlen)
{
	struct nbds_export *ex;
	int r;

	for (ex = s->exports; ex; ex = ex->next)
		if (!strcmp(ex->o.name, o->name)) {
			snprintf(err, errlen, "an NBD export named '%s' exists already: give "
				 "another name=", o->name);
			return -EEXIST;
		}
	if (o->incoming && (o->read_only || o->src ||
			    atomic_load(&s->disk->rings_started))) {
		snprintf(err, errlen, "%s: incoming takes a writable export of a disk whose "
			 "guest has not started here yet", o->addr);
		return -EINVAL;
	}
	if (!o->read_only && s->disk->b->read_only) {
		snprintf(err, errlen, "%s: the disk is read-only: add read-only to the export",
			 o->addr);
		return -EROFS;
	}
	ex = calloc(1, sizeof(*ex));
	if (!ex)
		return -ENOMEM;
	ex->srv = s;
	ex->lfd = -1;
	ex->o = (struct nbds_export_opts){ .addr = strdup(o->addr), .name = strdup(o->name),
					   .tls = o->tls ? strdup(o->tls) : NULL,
					   .read_only = o->read_only || o->src, .max_conn = o->max_conn,
					   .incoming = o->incoming,
					   .src = o->src };
	if (o->src && o->src->busy)
		ex->ys = calloc(s->disk->num_iothreads, sizeof(*ex->ys));
	if (!ex->o.addr || !ex->o.name || (o->tls && !ex->o.tls) ||
	    (o->src && o->src->busy && !ex->ys)) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto err;
	}
	/* Credentials first: a bad key leaves no socket behind. */
	if (o->tls && (r = nbds__tls_new(o->tls, &ex->tls, err, errlen)) < 0)
		goto err;
	if (!strncmp(o->addr, "unix:", 5)) {
		ex->unix_path = strdup(o->addr + 5);
		r = ex->unix_path ? sock_listen_unix(ex->unix_path, err, errlen) : -ENOMEM;
		if (r < 0) {
			/* Not ours to remove: whatever is there stays. */
			free(ex->unix_path);
			ex->unix_path = NULL;
		}
	} else {
		ex->tcp = true;
		r = sock_listen_tcp(o->addr, err, errlen);
	}
	if (r < 0)
		goto err;
	ex->lfd = r;
	r = loop_fd_add(s->main_loop, ex->lfd, EPOLLIN, listen_cb, ex, &ex->lh);
	if (r < 0) {
		snprintf(err, errlen, "cannot watch %s: %s", o->addr, strerror(-r));
		export_close_listener(ex);
		goto err;
	}
	ex->next = s->exports;
	s->exports = ex;
	log_info("nbd: export '%s' on %s%s%s%s%s, at most %u clients", ex->o.name, ex->o.addr,
		 ex->o.read_only ? ", read-only" : "",
		 ex->o.incoming ? ", incoming (writable until the guest's rings start)" : "",
		 ex->tls ? ", TLS required: " : "",
		 ex->tls ? ex->o.tls : "", ex->o.max_conn);
	return 0;
err:
	export_free(ex);
	return r;
}

int nbds_remove(struct nbds *s, const char *name)
{
	struct nbds_export **pp, *ex;

	for (pp = &s->exports; *pp && strcmp((*pp)->o.name, name); pp = &(*pp)->next)
		;
	ex = *pp;
	if (!ex)
		return -ENOENT;
	*pp = ex->next;
	export_close_listener(ex);
	ex->removed = true;
	if (!ex->clients) {
		log_info("nbd: export '%s' removed", name);
		export_free(ex);
		return 0;
	}
	log_info("nbd: export '%s' removed; disconnecting its %u clients", name, ex->clients);
	/* The last client's reap frees ex. */
	disconnect(s, ex);
	return 0;
}

const char *nbds_export_owner(struct nbds *s, const char *name)
{
	for (struct nbds_export *ex = s->exports; ex; ex = ex->next)
		if (!strcmp(ex->o.name, name))
			return ex->o.src ? ex->o.src->owner : NULL;
	return NULL;
}

unsigned nbds_list(struct nbds *s, struct nbds_export_info *out, unsigned max)
{
	unsigned n = 0;

	reap(s);
	for (struct nbds_export *ex = s->exports; ex; ex = ex->next, n++)
		if (n < max)
			out[n] = (struct nbds_export_info){ .name = ex->o.name, .addr = ex->o.addr,
						    .read_only = ex->o.read_only,
						    .incoming = ex->o.incoming,
						    .tls = ex->tls != NULL,
						    .max_conn = ex->o.max_conn,
						    .clients = ex->clients,
						    .accepted = ex->accepted,
						    .refused = ex->refused };
	return n;
}

void nbds_stats(struct nbds *s, struct nbds_stats *st)
{
#define LD(f) atomic_load_explicit(&s->f, memory_order_relaxed)
	unsigned clients = 0;

	for (struct nbds_export *ex = s->exports; ex; ex = ex->next)
		clients += ex->clients;
	*st = (struct nbds_stats){ .connections = LD(connections), .clients = clients,
				   .refused = LD(refused),
				   .handshake_failed = LD(handshake_failed),
				   .requests = LD(requests), .bad_requests = LD(bad_requests),
				   .read_bytes = LD(read_bytes), .write_bytes = LD(write_bytes),
				   .throttled = LD(throttled),
				   .coalesced_waits = LD(coalesced_waits),
				   .coalesced_requests = LD(coalesced_requests),
				   .yielded = LD(yielded) };
#undef LD
}
