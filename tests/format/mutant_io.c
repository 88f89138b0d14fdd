/*
 * mutant-io: a seeded mix of writes, reads, discards, write zeroes and
 * flushes sent to a vhost-user-blk backend, each request with a deadline,
 * for tests/format/mutate.py (vblkd serving a mutated image).  With
 * --qemu-io, every request that changes the disk (and every flush) is
 * written out, in issue order, as a qemu-io command, so QEMU can be given
 * the same writes (`qemu-io -f qcow2 IMAGE < FILE`).
 *
 *   mutant-io SOCKET SEED OPS [--qd N] [--timeout-s S] [--qemu-io FILE]
 *
 * Two requests in flight never overlap where one of them changes the
 * disk, so the image's contents do not depend on the order the backend
 * completes them in and a serial replay is the same writes.
 *
 * Prints one JSON line: {"ok":N,"ioerr":N,"unsupp":N,"other":N,
 * "unanswered":N,"max_ms":X,...}.  A request with no completion within
 * --timeout-s (default 5) is unanswered: nothing more is issued, the
 * others get their own deadline, then the line.  Exit 0 when every
 * request was answered, 2 when one was not (or the handshake got no
 * answer), 1 when the backend could not be reached (one line on stderr).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver/vdrv.h"
#include "util/compiler.h"
#include "util/sys.h"

#define MAX_LEN (256u << 10)	/* the largest request, bytes */
#define MAX_QD 32

struct slot {
	uint8_t *buf;			/* MAX_LEN, in shared memory */
	struct virtio_blk_outhdr *hdr;	/* in shared memory, as the rest */
	struct virtio_blk_discard_write_zeroes *seg;
	uint8_t *status;
	bool busy, expired;
	uint32_t type;
	uint64_t off, len;
	uint64_t start_ns, deadline_ns;
};

struct op {
	uint32_t type;
	uint64_t off, len;
	uint8_t pattern;
	bool unmap;
};

static uint64_t rng;
static unsigned timeout_s = 5;
static struct {
	unsigned ok, ioerr, unsupp, other, unanswered;
	uint64_t max_ns, issued;
} st;

static uint64_t next(void)	/* xorshift64*, as fmt-io */
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 2685821657736338717ull;
}

static void report(const struct vdrv *d)
{
	printf("{\"ok\":%u,\"ioerr\":%u,\"unsupp\":%u,\"other\":%u,\"unanswered\":%u,"
	       "\"max_ms\":%.1f,\"issued\":%llu,\"size\":%llu,\"block\":%u}\n",
	       st.ok, st.ioerr, st.unsupp, st.other, st.unanswered, (double)st.max_ns / 1e6,
	       (unsigned long long)st.issued,
	       d ? (unsigned long long)vdrv_capacity(d) : 0ull, d ? vdrv_block_size(d) : 0);
	fflush(stdout);
}

/* The handshake's own deadline: vdrv's socket timeout is per message. */
static void on_alarm(int sig)
{
	static const char line[] = "mutant-io: no answer to the vhost-user handshake\n";
	static const char json[] = "{\"ok\":0,\"ioerr\":0,\"unsupp\":0,\"other\":0,"
				   "\"unanswered\":1,\"max_ms\":0,\"issued\":0}\n";

	(void)sig;
	if (write(2, line, sizeof(line) - 1) < 0 || write(1, json, sizeof(json) - 1) < 0)
		_exit(2);
	_exit(2);
}

static bool changes_disk(uint32_t type)
{
	return type == VIRTIO_BLK_T_OUT || type == VIRTIO_BLK_T_DISCARD ||
	       type == VIRTIO_BLK_T_WRITE_ZEROES;
}

/*
 * The next request of the sequence: a function of the seed, the requests
 * before it and what the device offers, never of timing.  What the device
 * does not offer is a read instead (a flush: a write).
 */
static void gen(const struct vdrv *d, struct op *o)
{
	uint64_t bs = vdrv_block_size(d), cap = vdrv_capacity(d) / bs * bs;
	uint64_t kind = next() % 100, g = bs, max = MAX_LEN;

	o->len = 4096 * (1 + next() % (MAX_LEN / 4096));
	o->pattern = (uint8_t)(next() >> 32);
	o->unmap = next() & 1;
	if (kind < 40) {
		o->type = VIRTIO_BLK_T_OUT;
	} else if (kind < 70) {
		o->type = VIRTIO_BLK_T_IN;
	} else if (kind < 80) {
		o->type = vdrv_has(d, VIRTIO_BLK_F_DISCARD) ? VIRTIO_BLK_T_DISCARD
							    : VIRTIO_BLK_T_IN;
	} else if (kind < 90) {
		o->type = vdrv_has(d, VIRTIO_BLK_F_WRITE_ZEROES) ? VIRTIO_BLK_T_WRITE_ZEROES
								 : VIRTIO_BLK_T_IN;
	} else {
		o->type = vdrv_has(d, VIRTIO_BLK_F_FLUSH) ? VIRTIO_BLK_T_FLUSH
							  : VIRTIO_BLK_T_OUT;
	}
	if (o->type == VIRTIO_BLK_T_DISCARD && d->cfg.max_discard_sectors)
		max = MIN(max, (uint64_t)d->cfg.max_discard_sectors << VIRTIO_BLK_SECTOR_SHIFT);
	if (o->type == VIRTIO_BLK_T_WRITE_ZEROES && d->cfg.max_write_zeroes_sectors)
		max = MIN(max, (uint64_t)d->cfg.max_write_zeroes_sectors
				       << VIRTIO_BLK_SECTOR_SHIFT);
	/* Half the discards and write zeroes on the device's unit (whole
	 * clusters of a qcow2 image), where they free space. */
	if ((o->type == VIRTIO_BLK_T_DISCARD || o->type == VIRTIO_BLK_T_WRITE_ZEROES) &&
	    (next() & 1) && d->cfg.discard_sector_alignment)
		g = MAX(bs, (uint64_t)d->cfg.discard_sector_alignment << VIRTIO_BLK_SECTOR_SHIFT);
	o->len = MIN(o->len, MIN(max, cap));
	o->off = bs * (next() % ((cap - o->len) / bs + 1));
	o->off -= o->off % g;
	if (o->len >= g)
		o->len -= o->len % g;
	o->len -= o->len % bs;
	if (!o->len)
		o->len = bs;
	if (o->type == VIRTIO_BLK_T_FLUSH)
		o->off = o->len = 0;
}

/* Would o, issued now, overlap a request in flight where one of the two
 * changes the disk? */
static bool conflicts(const struct slot *s, unsigned qd, const struct op *o)
{
	for (unsigned i = 0; i < qd; i++) {
		if (!s[i].busy || s[i].type == VIRTIO_BLK_T_FLUSH || o->type == VIRTIO_BLK_T_FLUSH)
			continue;
		if (!changes_disk(o->type) && !changes_disk(s[i].type))
			continue;
		if (o->off < s[i].off + s[i].len && s[i].off < o->off + o->len)
			return true;
	}
	return false;
}

/* The same request for qemu-io, one command a line. */
static void log_qemu_io(FILE *f, const struct op *o)
{
	unsigned long long off = o->off, len = o->len;

	if (!f)
		return;
	if (o->type == VIRTIO_BLK_T_OUT)
		fprintf(f, "write -P 0x%02x %llu %llu\n", o->pattern, off, len);
	else if (o->type == VIRTIO_BLK_T_DISCARD)
		fprintf(f, "discard %llu %llu\n", off, len);
	else if (o->type == VIRTIO_BLK_T_WRITE_ZEROES)
		fprintf(f, "write -z%s %llu %llu\n", o->unmap ? " -u" : "", off, len);
	else if (o->type == VIRTIO_BLK_T_FLUSH)
		fprintf(f, "flush\n");
}

/* Queue o in slot s.  0 or -errno (vdrv_add's). */
static int submit(struct vdrv_queue *q, struct slot *s, const struct op *o)
{
	struct iovec out[2] = { { s->hdr, sizeof(*s->hdr) } }, in[2];
	unsigned nout = 1, nin = 0;
	int r;

	*s->hdr = (struct virtio_blk_outhdr){ .type = o->type,
					      .sector = o->off >> VIRTIO_BLK_SECTOR_SHIFT };
	*s->status = 0xff;
	switch (o->type) {
	case VIRTIO_BLK_T_OUT:
		memset(s->buf, o->pattern, o->len);
		out[nout++] = (struct iovec){ s->buf, o->len };
		break;
	case VIRTIO_BLK_T_IN:
		in[nin++] = (struct iovec){ s->buf, o->len };
		break;
	case VIRTIO_BLK_T_DISCARD:
	case VIRTIO_BLK_T_WRITE_ZEROES:
		*s->seg = (struct virtio_blk_discard_write_zeroes){
			.sector = o->off >> VIRTIO_BLK_SECTOR_SHIFT,
			.num_sectors = (uint32_t)(o->len >> VIRTIO_BLK_SECTOR_SHIFT),
			.flags = o->type == VIRTIO_BLK_T_WRITE_ZEROES && o->unmap ?
				 VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP : 0,
		};
		s->hdr->sector = 0;
		out[nout++] = (struct iovec){ s->seg, sizeof(*s->seg) };
		break;
	default:
		break;
	}
	in[nin++] = (struct iovec){ s->status, 1 };
	r = vdrv_add(q, out, nout, in, nin, s);
	if (r < 0)
		return r;
	s->busy = true;
	s->expired = false;
	s->type = o->type;
	s->off = o->off;
	s->len = o->len;
	s->start_ns = sys_now_ns();
	s->deadline_ns = s->start_ns + (uint64_t)timeout_s * 1000000000ull;
	st.issued++;
	return 0;
}

static void complete(struct slot *s)
{
	uint64_t ns = sys_now_ns() - s->start_ns;

	s->busy = false;
	if (s->expired)
		return;		/* counted as unanswered already */
	st.max_ns = MAX(st.max_ns, ns);
	switch (*s->status) {
	case VIRTIO_BLK_S_OK: st.ok++; break;
	case VIRTIO_BLK_S_IOERR: st.ioerr++; break;
	case VIRTIO_BLK_S_UNSUPP: st.unsupp++; break;
	default: st.other++; break;
	}
}

/*
 * Issue ops requests at up to qd in flight, each waited for until its
 * deadline; st counts the outcomes.  Returns how many are still in flight
 * (expired, never answered).
 */
static unsigned drive(struct vdrv *d, struct slot *slots, unsigned qd, uint64_t ops, FILE *log)
{
	struct vdrv_queue *q = &d->q[0];
	unsigned inflight = 0, expired = 0;
	bool have = false, stopping = false;
	uint64_t i = 0;
	struct op o;

	for (;;) {
		bool added = false;
		uint64_t now, first = UINT64_MAX;
		struct slot *s;
		int wait_ms;

		while (!stopping && i < ops && inflight < qd) {
			unsigned k = 0;

			if (!have) {
				gen(d, &o);
				have = true;
			}
			if (conflicts(slots, qd, &o))
				break;
			while (slots[k].busy)
				k++;
			if (submit(q, &slots[k], &o) < 0) {
				fprintf(stderr, "mutant-io: the ring took no request\n");
				exit(1);
			}
			log_qemu_io(log, &o);
			inflight++;
			added = true;
			have = false;
			i++;
		}
		if (added)
			vdrv_kick(q);
		if (inflight == expired && (stopping || i >= ops))
			return expired;
		while ((s = vdrv_get(q, NULL))) {
			if (s->expired)
				expired--;
			complete(s);
			inflight--;
			added = true;
		}
		if (added || vdrv_enable_cb(q))
			continue;
		now = sys_now_ns();
		for (unsigned k = 0; k < qd; k++) {
			if (!slots[k].busy || slots[k].expired)
				continue;
			if (slots[k].deadline_ns <= now) {
				slots[k].expired = true;
				expired++;
				st.unanswered++;
				stopping = true;
			} else {
				first = MIN(first, slots[k].deadline_ns);
			}
		}
		if (first == UINT64_MAX)
			continue;	/* all expired (returns above) or none busy */
		wait_ms = (int)((first - now + 999999) / 1000000);
		(void)vdrv_wait(q, wait_ms);
	}
}

int main(int argc, char **argv)
{
	struct vdrv_opts o = { .num_queues = 1, .queue_size = 64 };
	struct slot slots[MAX_QD] = { 0 };
	unsigned qd = 8;
	const char *log_path = NULL;
	struct vdrv *d;
	FILE *log = NULL;
	uint64_t seed, ops;
	char err[512];

	if (argc < 4) {
		fprintf(stderr, "usage: mutant-io SOCKET SEED OPS [--qd N] [--timeout-s S] "
			"[--qemu-io FILE]\n");
		return 1;
	}
	o.socket = argv[1];
	seed = strtoull(argv[2], NULL, 0);
	ops = strtoull(argv[3], NULL, 0);
	for (int i = 4; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--qd"))
			qd = (unsigned)strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--timeout-s"))
			timeout_s = (unsigned)strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--qemu-io"))
			log_path = argv[i + 1];
		else {
			fprintf(stderr, "mutant-io: unknown option '%s'\n", argv[i]);
			return 1;
		}
	}
	qd = MAX(1u, MIN(qd, MAX_QD));
	timeout_s = MAX(timeout_s, 1u);
	rng = seed * 0x9e3779b97f4a7c15ull | 1;
	if (log_path && !(log = fopen(log_path, "w"))) {
		fprintf(stderr, "mutant-io: %s: %s\n", log_path, strerror(errno));
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGALRM, on_alarm);
	alarm(timeout_s * 2);
	o.mem_bytes = qd * (MAX_LEN + 4096);
	if (vdrv_connect(&o, &d, err, sizeof(err)) < 0) {
		fprintf(stderr, "mutant-io: %s\n", err);
		return 1;
	}
	alarm(0);
	for (unsigned i = 0; i < qd; i++) {
		uint8_t *small;

		slots[i].buf = vdrv_alloc(d, MAX_LEN, 4096);
		small = vdrv_alloc(d, 64, 64);
		if (!slots[i].buf || !small) {
			fprintf(stderr, "mutant-io: out of shared memory\n");
			return 1;
		}
		slots[i].hdr = (void *)small;
		slots[i].seg = (void *)(small + 16);
		slots[i].status = small + 32;
	}
	(void)drive(d, slots, qd, ops, log);
	if (log && fclose(log) != 0) {
		fprintf(stderr, "mutant-io: %s: %s\n", log_path, strerror(errno));
		return 1;
	}
	report(d);
	/* A request the backend held past its deadline: the rings are not
	 * stopped (GET_VRING_BASE could wait for one still held); just go. */
	if (st.unanswered)
		return 2;
	vdrv_close(d);
	return 0;
}
