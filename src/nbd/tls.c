/*
 * TLS for the NBD server, through GnuTLS (doc/proto.md "TLS support":
 * NBD_OPT_STARTTLS, then a TLS handshake on the same socket).  Credentials
 * as qemu-nbd and nbdkit take them: an X.509 directory (ca-cert.pem,
 * server-cert.pem, server-key.pem) or a PSK file of "identity:hexkey"
 * lines (nbdkit --tls-psk, GnuTLS's psktool).  Sessions are non-blocking:
 * the connection's iothread drives the handshake from its events.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nbd/nbds_internal.h"
#include "util/compiler.h"
#include "util/log.h"

#ifdef HAVE_GNUTLS
#include <gnutls/gnutls.h>

struct nbds_tls {
	bool psk;
	gnutls_certificate_credentials_t x509;
	gnutls_psk_server_credentials_t pskc;
	gnutls_priority_t prio;		/* PSK: psk_priority()'s */
};

/* What one receive may take from the socket for the session: a client
 * pipelining small requests sends one record each (~50 bytes for a read
 * request), and GnuTLS reads a record's header and its body with a
 * receive each; through this buffer one recv() brings in hundreds. */
#define NBDS_TLS_RBUF	(64u << 10)
#define NBDS_TLS_EMPTY_MAX 256u

struct nbds_tls_sess {
	gnutls_session_t s;
	int fd;
	/* Bytes [rpos, rlen) of rbuf came from the socket and are not yet
	 * GnuTLS's. */
	uint8_t *rbuf;
	size_t rpos, rlen;
	bool short_read;	/* the last recv took less than asked: the socket was empty */
	uint64_t took;		/* bytes GnuTLS has taken from rbuf, ever */
};

/* GnuTLS's pull: from rbuf, refilled by one recv() when empty.  -1 with
 * the session's errno (EAGAIN: nothing now, the socket will say when),
 * 0 at the end of the stream, as recv(2). */
static ssize_t tls_pull(gnutls_transport_ptr_t p, void *data, size_t len)
{
	struct nbds_tls_sess *ss = p;
	size_t n;

	if (ss->rpos == ss->rlen) {
		ssize_t r = recv(ss->fd, ss->rbuf, NBDS_TLS_RBUF, MSG_DONTWAIT);

		if (r <= 0) {
			if (r < 0)
				gnutls_transport_set_errno(ss->s, errno == EWOULDBLOCK ? EAGAIN : errno);
			return r;
		}
		ss->rpos = 0;
		ss->rlen = (size_t)r;
		ss->short_read = (size_t)r < NBDS_TLS_RBUF;
	}
	n = MIN(len, ss->rlen - ss->rpos);
	memcpy(data, ss->rbuf + ss->rpos, n);
	ss->rpos += n;
	ss->took += n;
	return (ssize_t)n;
}

/* Asked only with a timeout set, and ours are 0 (the session is
 * non-blocking, the iothread waits in epoll): never waits here either.
 * >0 when something can be read now, 0 when not, -1 on error. */
static int tls_pull_timeout(gnutls_transport_ptr_t p, unsigned int ms)
{
	struct nbds_tls_sess *ss = p;
	struct pollfd pfd = { .fd = ss->fd, .events = POLLIN };
	int r;

	(void)ms;
	if (ss->rpos < ss->rlen)
		return 1;
	r = poll(&pfd, 1, 0);
	if (r < 0)
		gnutls_transport_set_errno(ss->s, errno);
	return r;
}

/* GnuTLS's push: records out in one sendmsg, as its own would do, with
 * MSG_NOSIGNAL (a client gone mid-reply must not raise SIGPIPE). */
static ssize_t tls_push(gnutls_transport_ptr_t p, const giovec_t *iov, int iovcnt)
{
	struct nbds_tls_sess *ss = p;
	struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
	ssize_t r = sendmsg(ss->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);

	if (r < 0)
		gnutls_transport_set_errno(ss->s, errno == EWOULDBLOCK ? EAGAIN : errno);
	return r;
}

static int file_ok(const char *path, char *err, size_t errlen, const char *spec)
{
	FILE *f = fopen(path, "r");

	if (!f) {
		snprintf(err, errlen, "tls=%s: cannot read %s: %s", spec, path, strerror(errno));
		return -errno;
	}
	fclose(f);
	return 0;
}

#define PSK_PRIORITY "NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK"

/* ":<op><name>" onto a priority string; once it does not fit, *len
 * stays at or past size. */
static void prio_append(char *buf, size_t size, size_t *len, char op, const char *name)
{
	if (*len < size)
		*len += (size_t)snprintf(buf + *len, size - *len, ":%c%s", op, name);
}

/* Whether GnuTLS found AES accelerated here: it then orders PERFORMANCE
 * with AES-128-GCM ahead of ChaCha20, else ChaCha20 first (its
 * _gnutls_priority_update_non_aesni; NORMAL's order never changes). */
static bool aes_is_fast(void)
{
	gnutls_priority_t p;
	const unsigned int *l;
	bool fast = false;
	int n;

	if (gnutls_priority_init(&p, "PERFORMANCE", NULL) < 0)
		return false;
	n = gnutls_priority_cipher_list(p, &l);
	for (int i = 0; i < n; i++) {
		if (l[i] == GNUTLS_CIPHER_AES_128_GCM) {
			fast = true;
			break;
		}
		if (l[i] == GNUTLS_CIPHER_CHACHA20_POLY1305)
			break;
	}
	gnutls_priority_deinit(p);
	return fast;
}

/* PSK sessions: NORMAL's ciphers, but where AES is accelerated, with
 * AES-128-GCM moved up behind AES-256-GCM and the server's order
 * deciding.  A PSK from a file is bound to SHA-256 (RFC 8446 4.2.11),
 * which rules out TLS_AES_256_GCM_SHA384, and clients (libnbd, QEMU:
 * NORMAL) list TLS_CHACHA20_POLY1305_SHA256 next: with AES-NI, ChaCha20
 * in software was half the server's CPU for 4 KiB reads.  The set is
 * NORMAL's, as GnuTLS lists it; only the order changes. */
static int psk_priority(gnutls_priority_t *out)
{
	const unsigned int *l;
	char prio[1024];
	size_t len;
	int n, aes256 = -1, aes128 = -1, r;

	r = gnutls_priority_init(out, PSK_PRIORITY, NULL);
	if (r < 0 || !aes_is_fast())
		return r;
	n = gnutls_priority_cipher_list(*out, &l);
	for (int i = 0; i < n; i++) {
		if (l[i] == GNUTLS_CIPHER_AES_256_GCM)
			aes256 = i;
		else if (l[i] == GNUTLS_CIPHER_AES_128_GCM)
			aes128 = i;
	}
	if (aes256 < 0 || aes128 < aes256)
		return 0;
	/* "+" appends: take away what follows AES-256-GCM, then put it
	 * back with AES-128-GCM first. */
	len = (size_t)snprintf(prio, sizeof(prio), "%s", PSK_PRIORITY);
	for (int i = aes256 + 1; i < n; i++)
		prio_append(prio, sizeof(prio), &len, '-', gnutls_cipher_get_name(l[i]));
	prio_append(prio, sizeof(prio), &len, '+', gnutls_cipher_get_name(l[aes128]));
	for (int i = aes256 + 1; i < n; i++)
		if (i != aes128)
			prio_append(prio, sizeof(prio), &len, '+', gnutls_cipher_get_name(l[i]));
	prio_append(prio, sizeof(prio), &len, '%', "SERVER_PRECEDENCE");
	if (len >= sizeof(prio))
		return 0;	/* not with GnuTLS's names: NORMAL's order, then */
	gnutls_priority_deinit(*out);
	return gnutls_priority_init(out, prio, NULL);
}

int nbds__tls_new(const char *spec, struct nbds_tls **out, char *err, size_t errlen)
{
	struct nbds_tls *t = calloc(1, sizeof(*t));
	char ca[4096], cert[4096], key[4096];
	int r;

	if (!t)
		return -ENOMEM;
	if (!strncmp(spec, "psk:", 4) && spec[4]) {
		t->psk = true;
		if ((r = file_ok(spec + 4, err, errlen, spec)) < 0)
			goto err;
		if (gnutls_psk_allocate_server_credentials(&t->pskc) < 0) {
			r = -ENOMEM;
			snprintf(err, errlen, "tls=%s: out of memory", spec);
			goto err;
		}
		r = gnutls_psk_set_server_credentials_file(t->pskc, spec + 4);
		if (r < 0) {
			snprintf(err, errlen, "tls=%s: %s", spec, gnutls_strerror(r));
			r = -EINVAL;
			goto err;
		}
		r = psk_priority(&t->prio);
		if (r < 0) {
			snprintf(err, errlen, "tls=%s: %s", spec, gnutls_strerror(r));
			t->prio = NULL;
			r = -EINVAL;
			goto err;
		}
	} else if (!strncmp(spec, "x509:", 5) && spec[5]) {
		const char *dir = spec + 5;

		snprintf(ca, sizeof(ca), "%s/ca-cert.pem", dir);
		snprintf(cert, sizeof(cert), "%s/server-cert.pem", dir);
		snprintf(key, sizeof(key), "%s/server-key.pem", dir);
		if ((r = file_ok(cert, err, errlen, spec)) < 0 ||
		    (r = file_ok(key, err, errlen, spec)) < 0)
			goto err;
		if (gnutls_certificate_allocate_credentials(&t->x509) < 0) {
			r = -ENOMEM;
			snprintf(err, errlen, "tls=%s: out of memory", spec);
			goto err;
		}
		/* The CA is for clients' certificates, which we do not ask
		 * for (as nbdkit without --tls-verify-peer): optional. */
		if (access(ca, R_OK) == 0 &&
		    (r = gnutls_certificate_set_x509_trust_file(t->x509, ca, GNUTLS_X509_FMT_PEM)) < 0) {
			snprintf(err, errlen, "tls=%s: %s: %s", spec, ca, gnutls_strerror(r));
			r = -EINVAL;
			goto err;
		}
		r = gnutls_certificate_set_x509_key_file(t->x509, cert, key, GNUTLS_X509_FMT_PEM);
		if (r < 0) {
			snprintf(err, errlen, "tls=%s: %s with %s: %s", spec, cert, key,
				 gnutls_strerror(r));
			r = -EINVAL;
			goto err;
		}
	} else {
		snprintf(err, errlen, "tls=%s: give x509:DIR (ca-cert.pem, server-cert.pem, "
			 "server-key.pem) or psk:FILE (identity:hexkey lines, as psktool writes)",
			 spec);
		r = -EINVAL;
		goto err;
	}
	*out = t;
	return 0;
err:
	nbds__tls_free(t);
	return r;
}

void nbds__tls_free(struct nbds_tls *t)
{
	if (!t)
		return;
	if (t->x509)
		gnutls_certificate_free_credentials(t->x509);
	if (t->pskc)
		gnutls_psk_free_server_credentials(t->pskc);
	if (t->prio)
		gnutls_priority_deinit(t->prio);
	free(t);
}

int nbds__tls_sess_new(struct nbds_tls *t, int fd, struct nbds_tls_sess **out)
{
	struct nbds_tls_sess *ss = calloc(1, sizeof(*ss));
	int r;

	if (!ss)
		return -ENOMEM;
	ss->fd = fd;
	ss->rbuf = malloc(NBDS_TLS_RBUF);
	if (!ss->rbuf) {
		free(ss);
		return -ENOMEM;
	}
	r = gnutls_init(&ss->s, GNUTLS_SERVER | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL);
	if (r < 0) {
		free(ss->rbuf);
		free(ss);
		return -ENOMEM;
	}
	if (t->psk)
		r = gnutls_priority_set(ss->s, t->prio);
	else
		r = gnutls_set_default_priority(ss->s);
	if (r >= 0)
		r = t->psk ? gnutls_credentials_set(ss->s, GNUTLS_CRD_PSK, t->pskc) :
			     gnutls_credentials_set(ss->s, GNUTLS_CRD_CERTIFICATE, t->x509);
	if (r < 0) {
		log_warn("nbd: cannot set up a TLS session: %s", gnutls_strerror(r));
		gnutls_deinit(ss->s);
		free(ss->rbuf);
		free(ss);
		return -EIO;
	}
	/* The handshake's bytes come through these too. */
	gnutls_transport_set_ptr(ss->s, ss);
	gnutls_transport_set_pull_function(ss->s, tls_pull);
	gnutls_transport_set_pull_timeout_function(ss->s, tls_pull_timeout);
	gnutls_transport_set_vec_push_function(ss->s, tls_push);
	gnutls_handshake_set_timeout(ss->s, 0);
	*out = ss;
	return 0;
}

void nbds__tls_sess_free(struct nbds_tls_sess *ss)
{
	if (!ss)
		return;
	gnutls_deinit(ss->s);
	free(ss->rbuf);
	free(ss);
}

int nbds__tls_handshake(struct nbds_tls_sess *ss, uint32_t *events)
{
	for (;;) {
		int r = gnutls_handshake(ss->s);

		if (r == 0)
			return 1;
		if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED) {
			*events = gnutls_record_get_direction(ss->s) ? EPOLLOUT : EPOLLIN;
			return 0;
		}
		if (!gnutls_error_is_fatal(r))
			continue;
		log_warn("nbd: a client's TLS handshake failed: %s", gnutls_strerror(r));
		return -1;
	}
}

ssize_t nbds__tls_recv(struct nbds_tls_sess *ss, void *buf, size_t len)
{
	ssize_t r;

	/* A record with nothing for us (a TLS 1.3 KeyUpdate, which GnuTLS
	 * clients send by themselves after 2^24 records, or an empty one)
	 * also ends in GNUTLS_E_AGAIN, with whole records behind it still in
	 * rbuf where epoll cannot see them: read on while it took some of
	 * rbuf and some is left (found in review: a QD1 client's request
	 * sent behind a KeyUpdate was never answered).  Only tls_pull's own
	 * EAGAIN means the socket is empty, and it comes with rbuf empty.
	 * A client that sends nothing but such records is cut off after
	 * NBDS_TLS_EMPTY_MAX in a row (GnuTLS bounds them too). */
	for (unsigned i = 0;; i++) {
		uint64_t took = ss->took;

		r = gnutls_record_recv(ss->s, buf, len);
		if (r >= 0)
			return r;
		if (r != GNUTLS_E_AGAIN && r != GNUTLS_E_INTERRUPTED)
			break;
		if (ss->rpos == ss->rlen || ss->took == took)
			return -EAGAIN;
		if (i == NBDS_TLS_EMPTY_MAX) {
			log_warn("nbd: a TLS client sent %u records without data in a row; "
				 "disconnected", NBDS_TLS_EMPTY_MAX);
			return -EIO;
		}
	}
	if (r == GNUTLS_E_PREMATURE_TERMINATION)
		return 0;
	log_debug("nbd: TLS receive: %s", gnutls_strerror((int)r));
	return -EIO;
}

ssize_t nbds__tls_send(struct nbds_tls_sess *ss, const void *buf, size_t len)
{
	ssize_t r = gnutls_record_send(ss->s, buf, len);

	if (r >= 0)
		return r;
	if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED)
		return -EAGAIN;
	log_debug("nbd: TLS send: %s", gnutls_strerror((int)r));
	return -EIO;
}

bool nbds__tls_pending(struct nbds_tls_sess *ss)
{
	/* Also records received into rbuf: the socket has nothing more to
	 * say about them. */
	return ss->rpos < ss->rlen || gnutls_record_check_pending(ss->s) > 0;
}

bool nbds__tls_drained(struct nbds_tls_sess *ss)
{
	return ss->short_read && !nbds__tls_pending(ss);
}

void nbds__tls_bye(struct nbds_tls_sess *ss)
{
	/* Best effort, never waits: the socket closes next. */
	(void)gnutls_bye(ss->s, GNUTLS_SHUT_WR);
}

#else /* !HAVE_GNUTLS */

int nbds__tls_new(const char *spec, struct nbds_tls **out, char *err, size_t errlen)
{
	snprintf(err, errlen, "tls=%s: this vblkd was built without GnuTLS (apt-get install "
		 "libgnutls28-dev, then rebuild)", spec);
	return -ENOTSUP;
}

void nbds__tls_free(struct nbds_tls *t)
{
}

int nbds__tls_sess_new(struct nbds_tls *t, int fd, struct nbds_tls_sess **out)
{
	return -ENOTSUP;
}

void nbds__tls_sess_free(struct nbds_tls_sess *ss)
{
}

int nbds__tls_handshake(struct nbds_tls_sess *ss, uint32_t *events)
{
	return -1;
}

ssize_t nbds__tls_recv(struct nbds_tls_sess *ss, void *buf, size_t len)
{
	return -EIO;
}

ssize_t nbds__tls_send(struct nbds_tls_sess *ss, const void *buf, size_t len)
{
	return -EIO;
}

bool nbds__tls_pending(struct nbds_tls_sess *ss)
{
	return false;
}

bool nbds__tls_drained(struct nbds_tls_sess *ss)
{
	return false;
}

void nbds__tls_bye(struct nbds_tls_sess *ss)
{
}

#endif
