/*
 * nbd-tls-keyupdate HOST PORT EXPORT IDENTITY HEXKEY: a TLS 1.3 client of
 * vblkd's NBD server (PSK) that sends a KeyUpdate and a READ in one
 * segment, then waits 3 s for the READ's reply.  GnuTLS clients (libnbd,
 * QEMU) send a KeyUpdate by themselves after 2^24 records; GnuTLS on the
 * server takes it as a record with no data (GNUTLS_E_AGAIN), and a server
 * that took that for "the socket is empty" left the READ, already
 * received, unread with no event to come (tls.c nbds__tls_recv).  Exit 0:
 * both READs before and after the KeyUpdate answered; 1: the one after
 * it was not; 2: the set-up failed.
 *
 * The protocol: NBD's doc/proto.md, "Fixed newstyle negotiation",
 * NBD_OPT_STARTTLS, NBD_OPT_GO, "Simple reply message".
 */
#include <arpa/inet.h>
#include <endian.h>
#include <gnutls/gnutls.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define OPT_MAGIC	0x49484156454F5054ull	/* "IHAVEOPT" */
#define REP_MAGIC	0x0003e889045565a9ull
#define REQ_MAGIC	0x25609513u
#define SIMPLE_MAGIC	0x67446698u
#define OPT_STARTTLS	5u
#define OPT_GO		7u
#define REP_ACK		1u
#define CMD_READ	0u
#define READ_LEN	512u

static int fd = -1;
/* While held, what GnuTLS sends is gathered here and sent in one go. */
static bool hold;
static uint8_t held[64 << 10];
static size_t nheld;

static void die(const char *what)
{
	fprintf(stderr, "nbd-tls-keyupdate: %s\n", what);
	exit(2);
}

static ssize_t push(gnutls_transport_ptr_t p, const giovec_t *iov, int cnt)
{
	struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)cnt };
	size_t total = 0;

	(void)p;
	if (!hold)
		return sendmsg(fd, &m, MSG_NOSIGNAL);
	for (int i = 0; i < cnt; i++) {
		if (nheld + iov[i].iov_len > sizeof(held))
			die("too much to hold");
		memcpy(held + nheld, iov[i].iov_base, iov[i].iov_len);
		nheld += iov[i].iov_len;
		total += iov[i].iov_len;
	}
	return (ssize_t)total;
}

static ssize_t pull(gnutls_transport_ptr_t p, void *buf, size_t len)
{
	(void)p;
	return recv(fd, buf, len, 0);
}

static void read_all(void *buf, size_t len)
{
	for (size_t got = 0; got < len;) {
		ssize_t r = recv(fd, (uint8_t *)buf + got, len - got, 0);

		if (r <= 0)
			die("the server hung up in the negotiation");
		got += (size_t)r;
	}
}

static void send_all(const void *buf, size_t len)
{
	if (send(fd, buf, len, MSG_NOSIGNAL) != (ssize_t)len)
		die("cannot send");
}

static void tls_read_all(gnutls_session_t s, void *buf, size_t len)
{
	for (size_t got = 0; got < len;) {
		ssize_t r = gnutls_record_recv(s, (uint8_t *)buf + got, len - got);

		if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED)
			continue;
		if (r <= 0)
			die("the server hung up in transmission");
		got += (size_t)r;
	}
}

static void tls_send_all(gnutls_session_t s, const void *buf, size_t len)
{
	if (gnutls_record_send(s, buf, len) != (ssize_t)len)
		die("cannot send through TLS");
}

/* An option's header and data, in the clear or through s. */
static void put_opt(gnutls_session_t s, uint32_t opt, const void *data, uint32_t len)
{
	uint8_t b[16 + 64];
	uint64_t magic = htobe64(OPT_MAGIC);
	uint32_t o = htobe32(opt), l = htobe32(len);

	memcpy(b, &magic, 8);
	memcpy(b + 8, &o, 4);
	memcpy(b + 12, &l, 4);
	if (len)
		memcpy(b + 16, data, len);
	if (s)
		tls_send_all(s, b, 16 + len);
	else
		send_all(b, 16 + len);
}

static void put_read(gnutls_session_t s, uint64_t cookie)
{
	uint8_t q[28] = { 0 };
	uint32_t magic = htobe32(REQ_MAGIC), len = htobe32(READ_LEN);
	uint64_t c = htobe64(cookie);

	memcpy(q, &magic, 4);	/* flags, type (READ) and offset stay 0 */
	memcpy(q + 8, &c, 8);
	memcpy(q + 24, &len, 4);
	tls_send_all(s, q, sizeof(q));
}

/* The READ's reply within ms, or false. */
static bool got_reply(gnutls_session_t s, uint64_t cookie, int ms)
{
	uint8_t r[16 + READ_LEN];
	uint32_t magic, err;
	uint64_t c;

	if (gnutls_record_check_pending(s) == 0) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, ms) <= 0)
			return false;
	}
	tls_read_all(s, r, sizeof(r));
	memcpy(&magic, r, 4);
	memcpy(&err, r + 4, 4);
	memcpy(&c, r + 8, 8);
	if (be32toh(magic) != SIMPLE_MAGIC || err || be64toh(c) != cookie)
		die("a reply that is not the READ's");
	return true;
}

int main(int argc, char **argv)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai;
	gnutls_psk_client_credentials_t cred;
	gnutls_session_t s;
	gnutls_datum_t key;
	uint8_t greet[18], rep[20], go[4 + 255 + 2];
	uint32_t flags = htobe32(3), nlen;	/* FIXED_NEWSTYLE | NO_ZEROES */
	size_t name_len;
	int one = 1, r;
	bool after;

	if (argc != 6)
		die("usage: nbd-tls-keyupdate HOST PORT EXPORT IDENTITY HEXKEY");
	if (getaddrinfo(argv[1], argv[2], &hints, &ai) != 0)
		die("bad address");
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0)
		die("cannot connect");
	freeaddrinfo(ai);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

	read_all(greet, sizeof(greet));
	send_all(&flags, 4);
	put_opt(NULL, OPT_STARTTLS, NULL, 0);
	read_all(rep, sizeof(rep));

	if (gnutls_global_init() < 0 || gnutls_psk_allocate_client_credentials(&cred) < 0)
		die("GnuTLS");
	key = (gnutls_datum_t){ (unsigned char *)argv[5], (unsigned)strlen(argv[5]) };
	if (gnutls_psk_set_client_credentials(cred, argv[4], &key, GNUTLS_PSK_KEY_HEX) < 0 ||
	    gnutls_init(&s, GNUTLS_CLIENT) < 0 ||
	    gnutls_priority_set_direct(s, "NORMAL:-VERS-ALL:+VERS-TLS1.3:+PSK:+ECDHE-PSK:+DHE-PSK",
				       NULL) < 0 ||
	    gnutls_credentials_set(s, GNUTLS_CRD_PSK, cred) < 0)
		die("GnuTLS session");
	gnutls_transport_set_vec_push_function(s, push);
	gnutls_transport_set_pull_function(s, pull);
	do
		r = gnutls_handshake(s);
	while (r < 0 && !gnutls_error_is_fatal(r));
	if (r < 0)
		die(gnutls_strerror(r));
	if (gnutls_protocol_get_version(s) != GNUTLS_TLS1_3)
		die("not TLS 1.3: no KeyUpdate to send");

	name_len = strlen(argv[3]);
	if (name_len > 255)
		die("export name too long");
	nlen = htobe32((uint32_t)name_len);
	memcpy(go, &nlen, 4);
	memcpy(go + 4, argv[3], name_len);
	memset(go + 4 + name_len, 0, 2);	/* no information requests */
	put_opt(s, OPT_GO, go, (uint32_t)(4 + name_len + 2));
	for (;;) {
		uint8_t data[4096];
		uint32_t type, len;

		tls_read_all(s, rep, sizeof(rep));
		memcpy(&type, rep + 12, 4);
		memcpy(&len, rep + 16, 4);
		type = be32toh(type);
		len = be32toh(len);
		if (len > sizeof(data))
			die("an option reply too long");
		tls_read_all(s, data, len);
		if (type == REP_ACK)
			break;
		if (type & 0x80000000u)
			die("NBD_OPT_GO refused");
	}

	put_read(s, 1);
	if (!got_reply(s, 1, 3000))
		die("no reply to a READ before any KeyUpdate");
	hold = true;
	r = gnutls_session_key_update(s, 0);
	if (r < 0)
		die(gnutls_strerror(r));
	put_read(s, 2);
	hold = false;
	send_all(held, nheld);
	after = got_reply(s, 2, 3000);
	printf("a READ sent behind a KeyUpdate in one segment (%zu bytes): %s\n", nheld,
	       after ? "answered" : "no reply in 3 s");
	gnutls_deinit(s);
	gnutls_psk_free_client_credentials(cred);
	close(fd);
	return after ? 0 : 1;
}
