/*
 * vblk-bench: a fio-like load generator that *is* the virtio-blk driver.
 * It connects to a vhost-user-blk socket as the frontend (src/driver/), so
 * vblkd and qemu-storage-daemon are measured the same way, from the host.
 * One thread and one virtqueue per job.
 *
 * --dirty-log, --migrate-check and --log-toggle-ms play a live-migration
 * source against the backend (driver/vdrv_log.h): logging on for the run,
 * a sync every LOG_SYNC_MS on a thread of its own, logging switched off and
 * on under load, and at the end the rings stopped and the memory compared
 * with what the log let us copy.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench/hist.h"
#include "driver/vdrv.h"
#include "driver/vdrv_log.h"
#include "util/barrier.h"
#include "util/compiler.h"
#include "util/cli.h"
#include "util/parse.h"
#include "util/sys.h"

enum rw { RW_READ, RW_WRITE, RW_RANDREAD, RW_RANDWRITE, RW_RANDRW, RW_TRIM, RW_FLUSH };

struct opts {
	const char *socket;
	enum rw rw;
	unsigned rwmixread;
	uint64_t bs;
	unsigned iodepth, numjobs;
	double runtime, ramp, hold;
	uint64_t rate_iops;		/* per job, 0 = unlimited */
	uint64_t think_ns;		/* CPU spent per completion pass */
	uint64_t stall_ns;		/* --stall-s: no progress this long = stranded */
	uint64_t size, offset;
	bool verify, poll, json, no_event_idx, packed;
	unsigned queue_size;
	bool dirty_log, migrate_check;
	unsigned log_toggle_ms;		/* 0: logging stays on */
};

/* What a request shares with the device besides its data buffer. */
struct req_shm {
	struct virtio_blk_outhdr hdr;
	uint8_t status;
};

/* One request slot.  The bookkeeping stays in our own memory: the device
 * can write shared memory, and must not steer our pointers. */
struct slot {
	struct req_shm *shm;		/* shared memory */
	uint8_t *buf;			/* shared memory, bs bytes */
	uint64_t block;			/* index in the job's region */
	uint64_t t0;
	uint32_t gen;			/* generation written / expected */
	bool write, measured;
};

struct job {
	unsigned id;
	const struct opts *o;
	struct vdrv *d;
	struct vdrv_queue *q;
	pthread_t thread;
	uint64_t base, nblocks;		/* region: [base, base + nblocks*bs) */
	uint64_t seq;			/* next sequential block */
	uint64_t rng;
	struct slot *slots;
	struct slot **free_slots;
	unsigned nfree;
	uint32_t *gen;			/* verify: last generation written per block */
	uint8_t *busy;			/* verify: block has an I/O in flight */

	/* Results of the measured window. */
	struct hist lat;
	uint64_t ios, bytes, errors, verify_errors, verified;
	uint64_t submitted, completed;	/* every phase: ramp, measure, verify */
	uint64_t last_progress_ns;	/* last completion (or first submit) */
	bool stalled;
	atomic_bool asleep;		/* in vdrv_wait_read: the waker may poke */
	uint64_t kicks0, calls0;
	uint64_t kicks, calls;
};

static atomic_int phase;		/* 0 ramp, 1 measure, 2 stop */
static atomic_uint verify_reports;

const char cli_name[] = "vblk-bench";

static uint64_t size_arg(const char *opt, const char *s)
{
	uint64_t v;

	if (parse_size(s, &v) < 0)
		cli_die("%s '%s' is not a size (e.g. 4k, 1M, 2G)", opt, s);
	return v;
}

static uint64_t parse_num(const char *opt, const char *s, uint64_t lo, uint64_t hi)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		cli_die("%s '%s' is not a number from %" PRIu64 " to %" PRIu64, opt, s, lo, hi);
	return v;
}

static double parse_secs(const char *opt, const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || *end || !(v >= 0) || v > 86400)
		cli_die("%s '%s' is not a number of seconds", opt, s);
	return v;
}

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* ---- Verify pattern: every 512-byte sector carries its own header. ---- */

#define VMAGIC 0x76626c6b62656e63ull	/* "vblkbenc" */

struct vhdr {
	uint64_t magic, offset, gen, job;
};

static void pattern_fill(uint8_t *buf, uint64_t bs, uint64_t off, uint32_t gen, unsigned job)
{
	for (uint64_t s = 0; s < bs; s += 512) {
		struct vhdr h = { VMAGIC, off + s, gen, job };
		uint64_t seed = (off + s) * 0x9e3779b97f4a7c15ull ^ gen ^ 1;

		memcpy(buf + s, &h, sizeof(h));
		for (uint64_t i = sizeof(h); i + 8 <= 512; i += 8) {
			uint64_t v = xorshift(&seed);

			memcpy(buf + s + i, &v, 8);
		}
	}
}

static bool pattern_check(const uint8_t *buf, uint64_t bs, uint64_t off, uint32_t gen,
			  unsigned job)
{
	uint8_t *want = malloc(bs);
	bool ok;

	if (!want)
		return false;
	pattern_fill(want, bs, off, gen, job);
	ok = memcmp(want, buf, bs) == 0;
	/* The first few mismatches say what went wrong; the count says how
	 * much. */
	if (!ok && atomic_fetch_add(&verify_reports, 1) < 8) {
		struct vhdr h;

		memcpy(&h, buf, sizeof(h));
		fprintf(stderr, "vblk-bench: verify error at offset %" PRIu64 ": want "
			"generation %u, found magic %s offset %" PRIu64 " generation %" PRIu64 "\n",
			off, gen, h.magic == VMAGIC ? "ok" : "bad", h.offset, h.gen);
	}
	free(want);
	return ok;
}

/* ---- Job ---- */

static bool op_is_write(struct job *j)
{
	switch (j->o->rw) {
	case RW_WRITE:
	case RW_RANDWRITE:
		return true;
	case RW_RANDRW:
		return xorshift(&j->rng) % 100 >= j->o->rwmixread;
	default:
		return false;
	}
}

/* Pick a block; with --verify skip blocks with an I/O in flight. */
static uint64_t pick_block(struct job *j)
{
	bool rnd = j->o->rw >= RW_RANDREAD && j->o->rw <= RW_RANDRW;
	uint64_t b;

	for (unsigned tries = 0;; tries++) {
		if (rnd) {
			b = xorshift(&j->rng) % j->nblocks;
		} else {
			b = j->seq++;
			if (j->seq >= j->nblocks)
				j->seq = 0;
		}
		if (!j->busy || !j->busy[b] || tries > 64)
			break;
	}
	while (j->busy && j->busy[b])		/* iodepth < nblocks: terminates */
		b = (b + 1) % j->nblocks;
	return b;
}

static int submit_one(struct job *j, struct slot *s, bool write, uint64_t b)
{
	uint64_t off = j->base + b * j->o->bs;
	struct iovec out[2], in[2];
	unsigned nout = 1, nin = 0;

	s->write = write;
	s->block = b;
	if (j->o->rw == RW_TRIM) {
		/* One discard segment (virtio 1.2, 5.2.6) per request. */
		struct virtio_blk_discard_write_zeroes seg = {
			.sector = off >> VIRTIO_BLK_SECTOR_SHIFT,
			.num_sectors = (uint32_t)(j->o->bs >> VIRTIO_BLK_SECTOR_SHIFT),
		};

		memcpy(s->buf, &seg, sizeof(seg));
		vdrv_log_mark(j->d, s->buf, sizeof(seg));
	}
	s->shm->hdr.type = j->o->rw == RW_TRIM ? VIRTIO_BLK_T_DISCARD :
			   j->o->rw == RW_FLUSH ? VIRTIO_BLK_T_FLUSH :
			   write ? VIRTIO_BLK_T_OUT : VIRTIO_BLK_T_IN;
	s->shm->hdr.reserved = 0;
	/* A flush has no data and sector 0 (virtio 1.2, 5.2.6). */
	s->shm->hdr.sector = j->o->rw == RW_FLUSH ? 0 : off >> VIRTIO_BLK_SECTOR_SHIFT;
	s->shm->status = 0xff;
	vdrv_log_mark(j->d, s->shm, sizeof(*s->shm));
	out[0] = (struct iovec){ &s->shm->hdr, sizeof(s->shm->hdr) };
	if (j->o->rw == RW_TRIM) {
		out[nout++] = (struct iovec){ s->buf, sizeof(struct virtio_blk_discard_write_zeroes) };
	} else if (j->o->rw == RW_FLUSH) {
		/* status only */
	} else if (write) {
		if (j->gen) {
			s->gen = j->gen[b] + 1;
			pattern_fill(s->buf, j->o->bs, off, s->gen, j->id);
			vdrv_log_mark(j->d, s->buf, j->o->bs);
		}
		out[nout++] = (struct iovec){ s->buf, j->o->bs };
	} else {
		if (j->gen)
			s->gen = j->gen[b];
		in[nin++] = (struct iovec){ s->buf, j->o->bs };
	}
	in[nin++] = (struct iovec){ &s->shm->status, 1 };
	if (j->busy)
		j->busy[b] = 1;
	s->measured = atomic_load_explicit(&phase, memory_order_relaxed) == 1;
	s->t0 = sys_now_ns();
	if (vdrv_add(j->q, out, nout, in, nin, s) < 0) {
		if (j->busy)
			j->busy[b] = 0;
		return -1;
	}
	j->submitted++;
	return 0;
}

static void complete_one(struct job *j, struct slot *s)
{
	uint64_t now = sys_now_ns();
	bool ok = READ_ONCE(s->shm->status) == VIRTIO_BLK_S_OK;

	if (j->busy)
		j->busy[s->block] = 0;
	if (!ok) {
		j->errors++;
	} else if (j->gen) {
		if (s->write) {
			j->gen[s->block] = s->gen;
		} else if (s->gen) {
			j->verified++;
			if (!pattern_check(s->buf, j->o->bs, j->base + s->block * j->o->bs,
					   s->gen, j->id))
				j->verify_errors++;
		}
	}
	if (s->measured && atomic_load_explicit(&phase, memory_order_relaxed) == 1) {
		hist_add(&j->lat, now - s->t0);
		j->ios++;
		j->bytes += j->o->bs;
	}
	j->completed++;
	j->free_slots[j->nfree++] = s;
}

/* Drain completions the Linux virtio_blk way: callbacks off, take all,
 * callbacks on, and go again if more raced in (2.7.7). */
static unsigned reap(struct job *j)
{
	unsigned n = 0;
	struct slot *s;

	for (;;) {
		if (!j->o->poll)
			vdrv_disable_cb(j->q);
		while ((s = vdrv_get(j->q, NULL)) != NULL) {
			complete_one(j, s);
			n++;
		}
		if (n)
			j->last_progress_ns = sys_now_ns();
		if (j->o->poll || !vdrv_enable_cb(j->q))
			break;
	}
	return n;
}

/* Wait for at least one completion (or until deadline_ns for rate). */
static void wait_completion(struct job *j, uint64_t deadline_ns)
{
	if (j->o->poll) {
		while (!vdrv_pending(j->q)) {
			if (deadline_ns && sys_now_ns() >= deadline_ns)
				return;
			__builtin_ia32_pause();
		}
		return;
	}
	/* Callbacks are enabled by reap(); sleep on the call eventfd.  In one
	 * read(2), as fio sleeps in one io_uring_enter(2) and a guest in its
	 * interrupt handler: poll(2) and then read(2) made the client's own
	 * cost part of every round trip measured (~3 us at QD1 on a VM).  The
	 * waker thread ends a wait that outlasts WAKER_MS, so the stall check
	 * and the end of the run still come.  With a deadline (--rate, the
	 * final drain) poll(2) keeps its timeout. */
	if (!deadline_ns) {
		atomic_store(&j->asleep, true);
		if (!vdrv_pending(j->q) && atomic_load_explicit(&phase, memory_order_relaxed) != 2)
			(void)vdrv_wait_read(j->q);
		atomic_store(&j->asleep, false);
		return;
	}
	for (;;) {
		int ms = 100;

		if (vdrv_pending(j->q))
			return;
		if (deadline_ns) {
			uint64_t now = sys_now_ns();

			if (now >= deadline_ns)
				return;
			ms = (int)MIN((deadline_ns - now + 999999) / 1000000, 100);
		}
		if (vdrv_wait(j->q, ms) < 0 ||
		    atomic_load_explicit(&phase, memory_order_relaxed) == 2)
			return;
	}
}

/* A request that never completes is the worst bug a device can have (a
 * lost kick, a lost interrupt): after --stall-s (default BENCH_STALL_S)
 * without progress the job gives up and reports what is stranded. */
#define BENCH_STALL_S 5

static bool stalled(struct job *j)
{
	if (j->stalled)
		return true;
	if (!vdrv_inflight(j->q) || sys_now_ns() - j->last_progress_ns < j->o->stall_ns)
		return false;
	fprintf(stderr, "vblk-bench: job %u: %u requests got no completion in %llu s "
		"(stranded: lost kick or lost interrupt?)\n", j->id, vdrv_inflight(j->q),
		(unsigned long long)(j->o->stall_ns / 1000000000ull));
	j->errors += vdrv_inflight(j->q);
	j->stalled = true;
	return true;
}

/* --think-us: the CPU a slow driver spends on each request before it
 * sends it (a guest under TCG: the completion's interrupt, the block
 * layer, the application), interrupts on.  What it has prepared goes out
 * first: one kick per request. */
static void think(struct job *j, unsigned added)
{
	uint64_t until;

	if (added)
		vdrv_kick(j->q);
	until = sys_now_ns() + j->o->think_ns;
	while (sys_now_ns() < until)
		__builtin_ia32_pause();
}

static void run_load(struct job *j)
{
	uint64_t interval = j->o->rate_iops ? 1000000000ull / j->o->rate_iops : 0;
	uint64_t next = sys_now_ns();

	j->last_progress_ns = next;
	if (j->o->poll)
		vdrv_disable_cb(j->q);
	while (atomic_load_explicit(&phase, memory_order_relaxed) != 2) {
		unsigned added = 0;

		if (stalled(j))
			return;
		if (!vdrv_inflight(j->q))
			j->last_progress_ns = sys_now_ns();

		while (j->nfree) {
			if (interval) {
				if (sys_now_ns() < next)
					break;
				next += interval;
			}
			if (j->o->think_ns)
				think(j, added);
			if (submit_one(j, j->free_slots[j->nfree - 1], op_is_write(j),
				       pick_block(j)) < 0) {
				j->errors++;
				break;
			}
			j->nfree--;
			added++;
		}
		if (added)
			vdrv_kick(j->q);
		if (!reap(j))
			wait_completion(j, interval && j->nfree ? next : 0);
	}
	/* Let what is in flight finish. */
	while (vdrv_inflight(j->q) && !stalled(j)) {
		wait_completion(j, sys_now_ns() + 100000000ull);
		reap(j);
	}
}

/* --verify: read back every block this job wrote and check it. */
static void verify_pass(struct job *j)
{
	uint64_t b = 0;

	if (j->o->poll)
		vdrv_disable_cb(j->q);
	j->last_progress_ns = sys_now_ns();
	while ((b < j->nblocks || vdrv_inflight(j->q)) && !stalled(j)) {
		unsigned added = 0;

		while (j->nfree && b < j->nblocks) {
			if (!j->gen[b]) {
				b++;
				continue;
			}
			if (submit_one(j, j->free_slots[j->nfree - 1], false, b++) < 0) {
				j->errors++;
				break;
			}
			j->nfree--;
			added++;
		}
		if (added)
			vdrv_kick(j->q);
		if (!reap(j) && vdrv_inflight(j->q))
			wait_completion(j, sys_now_ns() + 100000000ull);
	}
}

static void *job_main(void *opaque)
{
	struct job *j = opaque;

	run_load(j);
	if (j->gen && !j->stalled)
		verify_pass(j);
	return NULL;
}

static int job_setup(struct job *j)
{
	const struct opts *o = j->o;

	j->slots = calloc(o->iodepth, sizeof(*j->slots));
	j->free_slots = calloc(o->iodepth, sizeof(*j->free_slots));
	if (!j->slots || !j->free_slots)
		return -ENOMEM;
	for (unsigned i = 0; i < o->iodepth; i++) {
		struct slot *s = &j->slots[i];

		s->shm = vdrv_alloc(j->d, sizeof(*s->shm), 64);
		s->buf = vdrv_alloc(j->d, o->bs, 4096);
		if (!s->shm || !s->buf)
			return -ENOMEM;
		j->free_slots[j->nfree++] = s;
	}
	if (o->verify) {
		j->gen = calloc(j->nblocks, sizeof(*j->gen));
		j->busy = calloc(j->nblocks, 1);
		if (!j->gen || !j->busy)
			return -ENOMEM;
	}
	hist_init(&j->lat);
	j->rng = 0x853c49e6748fea9bull ^ ((uint64_t)j->id << 32 | 1);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
"Usage: vblk-bench --socket PATH --rw MODE [options]\n"
"Drive a vhost-user-blk backend (vblkd, qemu-storage-daemon, ...) as its\n"
"virtio-blk driver and measure it.\n"
"\n"
"  --socket PATH        backend's vhost-user socket\n"
"  --rw MODE            read, write, randread, randwrite, randrw, trim:\n"
"                       sequential discards of --bs each (needs DISCARD), or\n"
"                       flush: cache flushes (needs FLUSH; --bs unused)\n"
"  --rwmixread P        randrw: percentage of reads (default 50)\n"
"  --bs SIZE            block size (default 4k)\n"
"  --iodepth N          requests in flight per job (default 1)\n"
"  --numjobs N          jobs: one thread and one virtqueue each (default 1)\n"
"  --runtime S          measured seconds (default 5)\n"
"  --ramp S             unmeasured warm-up seconds (default 1)\n"
"  --rate-iops N        cap each job at N I/Os per second\n"
"  --think-us N         spend N us of CPU after each pass that took completions,\n"
"                       before sending more, interrupts on: a driver slower\n"
"                       than the disk (a guest under TCG or on a busy host)\n"
"  --stall-s S          give up on requests with no completion for S seconds\n"
"                       and report them stranded (default 5; longer for a\n"
"                       backend that is meant to stall, e.g. a restarting OSD)\n"
"  --size SIZE          bytes of the disk to use (default: all, from --offset)\n"
"  --offset SIZE        start of the region (default 0)\n"
"  --verify             writes carry a header (offset, generation); reads of\n"
"                       written blocks are checked, and every written block is\n"
"                       read back and checked at the end; mismatches count as\n"
"                       errors and make the exit status 1\n"
"  --poll               spin on the used ring instead of sleeping on interrupts\n"
"  --queue-size N       virtqueue size (default 256)\n"
"  --no-event-idx       do not negotiate VIRTIO_RING_F_EVENT_IDX\n"
"  --packed             packed virtqueues (VIRTIO_F_RING_PACKED) instead of split\n"
"  --json               print one JSON object\n"
"  --hold S             after the results, stay connected and idle for S seconds\n"
"                       (to measure what an idle, connected disk costs)\n"
"\n"
"Live migration, as a migration source drives it (vhost-user dirty logging):\n"
"  --dirty-log          dirty logging on for the whole run (before the jobs\n"
"                       start), the log synced every 50 ms: what logging costs\n"
"  --migrate-check      --dirty-log, and at the end stop the rings and compare\n"
"                       memory with the copy the log let us keep: a byte that\n"
"                       differs was written but not logged (an error, printed\n"
"                       with its address and area), as is a ring base that\n"
"                       is not where the driver stopped\n"
"  --log-toggle-ms N    --dirty-log, switched off and on again every N ms while\n"
"                       the jobs run (each on starts with a fresh bulk copy);\n"
"                       the run ends with logging on\n"
"  --help\n");
}

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "rw", required_argument, NULL, 'w' },
		{ "rwmixread", required_argument, NULL, 'm' },
		{ "bs", required_argument, NULL, 'b' },
		{ "iodepth", required_argument, NULL, 'q' },
		{ "numjobs", required_argument, NULL, 'j' },
		{ "runtime", required_argument, NULL, 't' },
		{ "ramp", required_argument, NULL, 'r' },
		{ "rate-iops", required_argument, NULL, 'R' },
		{ "think-us", required_argument, NULL, 'k' },
		{ "stall-s", required_argument, NULL, 'S' },
		{ "size", required_argument, NULL, 'z' },
		{ "offset", required_argument, NULL, 'o' },
		{ "verify", no_argument, NULL, 'v' },
		{ "poll", no_argument, NULL, 'p' },
		{ "json", no_argument, NULL, 'J' },
		{ "queue-size", required_argument, NULL, 'Q' },
		{ "hold", required_argument, NULL, 'H' },
		{ "no-event-idx", no_argument, NULL, 'E' },
		{ "packed", no_argument, NULL, 'K' },
		{ "dirty-log", no_argument, NULL, 'L' },
		{ "migrate-check", no_argument, NULL, 'M' },
		{ "log-toggle-ms", required_argument, NULL, 'T' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static const char *const modes[] = { "read", "write", "randread", "randwrite",
					     "randrw", "trim", "flush" };
	bool have_rw = false;
	int c;

	*o = (struct opts){ .rwmixread = 50, .bs = 4096, .iodepth = 1, .numjobs = 1,
			    .runtime = 5, .ramp = 1, .queue_size = 256,
			    .stall_ns = BENCH_STALL_S * 1000000000ull };
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
		switch (c) {
		case 's': o->socket = optarg; break;
		case 'w':
			for (unsigned i = 0; i < ARRAY_SIZE(modes); i++)
				if (!strcmp(optarg, modes[i])) {
					o->rw = (enum rw)i;
					have_rw = true;
				}
			if (!have_rw)
				cli_die("--rw '%s' is not one of read, write, randread, randwrite, "
					"randrw, trim, flush", optarg);
			break;
		case 'm': o->rwmixread = (unsigned)parse_num("--rwmixread", optarg, 0, 100); break;
		case 'b': o->bs = size_arg("--bs", optarg); break;
		case 'q': o->iodepth = (unsigned)parse_num("--iodepth", optarg, 1, 32768); break;
		case 'j': o->numjobs = (unsigned)parse_num("--numjobs", optarg, 1, 64); break;
		case 't': o->runtime = parse_secs("--runtime", optarg); break;
		case 'r': o->ramp = parse_secs("--ramp", optarg); break;
		case 'H': o->hold = parse_secs("--hold", optarg); break;
		case 'R': o->rate_iops = parse_num("--rate-iops", optarg, 1, 100000000); break;
		case 'k': o->think_ns = parse_num("--think-us", optarg, 0, 1000000) * 1000; break;
		case 'S': o->stall_ns = parse_num("--stall-s", optarg, 1, 3600) * 1000000000ull; break;
		case 'z': o->size = size_arg("--size", optarg); break;
		case 'o': o->offset = size_arg("--offset", optarg); break;
		case 'v': o->verify = true; break;
		case 'p': o->poll = true; break;
		case 'J': o->json = true; break;
		case 'Q': o->queue_size = (unsigned)parse_num("--queue-size", optarg, 1, 32768); break;
		case 'E': o->no_event_idx = true; break;
		case 'K': o->packed = true; break;
		case 'L': o->dirty_log = true; break;
		case 'M': o->migrate_check = o->dirty_log = true; break;
		case 'T':
			o->log_toggle_ms = (unsigned)parse_num("--log-toggle-ms", optarg, 1, 3600000);
			o->dirty_log = true;
			break;
		case 'h': usage(stdout); exit(0);
		case ':':
			cli_die("option '%s' needs a value; see vblk-bench --help", argv[optind - 1]);
		default: cli_die("unknown option '%s'; see vblk-bench --help", argv[optind - 1]);
		}
	}
	if (optind < argc)
		cli_die("unexpected argument '%s'; see vblk-bench --help", argv[optind]);
	if (!o->socket)
		cli_die("missing --socket PATH: the backend's vhost-user socket");
	if (!have_rw)
		cli_die("missing --rw MODE: read, write, randread, randwrite, randrw, trim or "
			"flush");
	if (o->bs < 512 || o->bs % 512 || o->bs > (VDRV_MAX_SEGS - 2) * 1048576ull)
		cli_die("--bs %" PRIu64 " must be a multiple of 512 (and at most 62M)", o->bs);
	if (o->bs > 4u << 20)
		cli_die("--bs %" PRIu64 " is larger than 4M, the largest buffer we hand out",
			o->bs);
	if (o->verify && o->rw == RW_TRIM)
		cli_die("--verify checks data a discard does not leave: drop it with --rw trim");
	if (o->verify && o->rw == RW_FLUSH)
		cli_die("--verify checks data a flush does not carry: drop it with --rw flush");
	if (o->rw == RW_TRIM && o->bs > (4ull << 30) - 512)
		cli_die("--bs %" PRIu64 " is larger than one discard segment can be", o->bs);
	if (o->verify && (o->rw == RW_READ || o->rw == RW_RANDREAD))
		cli_die("--verify needs a workload that writes (write, randwrite, randrw)");
	if (o->iodepth > o->queue_size)
		cli_die("--iodepth %u is larger than the queue size %u: raise --queue-size",
			o->iodepth, o->queue_size);
	if (o->runtime <= 0)
		cli_die("--runtime must be more than 0 seconds");
	if (o->log_toggle_ms && o->runtime * 1000 <= 2.0 * o->log_toggle_ms)
		cli_die("--log-toggle-ms %u needs a --runtime longer than %u ms (logging off for "
			"%u ms, then on again)", o->log_toggle_ms, 2 * o->log_toggle_ms,
			o->log_toggle_ms);
}

static double ts_sec(struct timeval tv)
{
	return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static void sleep_s(double s)
{
	struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void sleep_until(uint64_t ns)
{
	uint64_t now = sys_now_ns();

	if (ns > now)
		sleep_s((double)(ns - now) / 1e9);
}

/* The waker: every WAKER_MS it pokes the call eventfd of each job asleep
 * in vdrv_wait_read, whose read has no timeout of its own.  A job woken
 * this way finds nothing, checks for a stall and for the end of the run,
 * and sleeps again: ten wake-ups a second against thousands of calls. */
#define WAKER_MS 100

struct waker {
	struct job *jobs;
	unsigned njobs;
	atomic_bool stop;
};

static void poke_sleepers(struct waker *w, bool all)
{
	for (unsigned i = 0; i < w->njobs; i++)
		if (all || atomic_load(&w->jobs[i].asleep))
			(void)vdrv_poke(w->jobs[i].q);
}

static void *waker_main(void *opaque)
{
	struct waker *w = opaque;

	while (!atomic_load(&w->stop)) {
		sleep_s(WAKER_MS / 1000.0);
		poke_sleepers(w, false);
	}
	return NULL;
}

/* ---- Migration: log syncs, switches under load, the final check ---- */

#define LOG_SYNC_MS 50

static atomic_bool sync_stop;

/* What a migration's iterations do, every LOG_SYNC_MS while the jobs run. */
static void *sync_main(void *opaque)
{
	struct vdrv *d = opaque;
	struct timespec next;

	clock_gettime(CLOCK_MONOTONIC, &next);
	while (!atomic_load(&sync_stop)) {
		next.tv_nsec += LOG_SYNC_MS * 1000000L;
		if (next.tv_nsec >= 1000000000L) {
			next.tv_sec++;
			next.tv_nsec -= 1000000000L;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
			;
		(void)vdrv_log_sync(d);
	}
	return NULL;
}

/*
 * The measured window under --log-toggle-ms: logging off at N ms, on again
 * at 2N ms (a new migration attempt: a fresh bulk copy), and so on, always
 * in pairs whose "on" lies before the end, so the run ends with logging on.
 * The job threads keep doing I/O throughout.  Returns the switches made.
 */
static unsigned toggle_window(struct vdrv *d, const struct opts *o, uint64_t t0)
{
	uint64_t step = o->log_toggle_ms * 1000000ull;
	uint64_t end = t0 + (uint64_t)(o->runtime * 1e9);
	unsigned n = 0;
	char err[512];

	for (uint64_t k = 1; t0 + (k + 1) * step < end; k += 2) {
		sleep_until(t0 + k * step);
		if (vdrv_log_stop(d, err, sizeof(err)) < 0)
			cli_die("switching dirty logging off under load: %s", err);
		sleep_until(t0 + (k + 1) * step);
		if (vdrv_log_start(d, err, sizeof(err)) < 0)
			cli_die("switching dirty logging on again under load: %s", err);
		n += 2;
	}
	sleep_until(end);
	return n;
}

/* --migrate-check: where the bytes that differ are. */
#define CHECK_AREAS (4 * 64 + 4)
#define CHECK_REPORTS 8

struct check_area {
	char name[32];			/* "used ring q0", "data buffers", ... */
	const char *fields[6];		/* ring or request fields seen */
	unsigned nfields;
	uint64_t bytes, pages, last_page;
};

struct check {
	struct vdrv *d;
	const struct job *jobs;
	unsigned njobs;
	uint64_t bs;
	bool ran;			/* false: skipped (requests stranded) */
	uint64_t bytes, pages, last_page;
	struct check_area areas[CHECK_AREAS];
	unsigned nareas;
	uint16_t bases[64];		/* GET_VRING_BASE per queue (--numjobs <= 64) */
	bool bases_ok;
	unsigned reported;		/* runs printed */
};

/* Name the area holding gpa into name; *end: where that area (or field)
 * ends, or for "other" where the next known area starts. */
static void check_classify(const struct check *c, uint64_t gpa, char *name, size_t len,
			   const char **field, uint64_t *end)
{
	static const char *const rings[] = {
		[VDRV_AREA_DESC] = "descriptors", [VDRV_AREA_AVAIL] = "avail ring",
		[VDRV_AREA_USED] = "used ring", [VDRV_AREA_INDIRECT] = "indirect tables",
	};
	unsigned q;
	enum vdrv_area a = vdrv_area_of(c->d, gpa, &q, field, end);
	uint64_t next = *end;

	if (a != VDRV_AREA_NONE) {
		snprintf(name, len, "%s q%u", rings[a], q);
		return;
	}
	for (unsigned i = 0; i < c->njobs; i++) {
		const struct job *j = &c->jobs[i];

		for (unsigned k = 0; k < j->o->iodepth; k++) {
			const struct slot *s = &j->slots[k];
			uint64_t h = vdrv_gpa(c->d, s->shm), b = vdrv_gpa(c->d, s->buf);

			if (gpa >= h && gpa < h + sizeof(*s->shm)) {
				snprintf(name, len, "request header/status");
				if (gpa < h + offsetof(struct req_shm, status)) {
					*field = "header";
					*end = h + offsetof(struct req_shm, status);
				} else {
					*field = "status";
					*end = h + offsetof(struct req_shm, status) + 1;
				}
				return;
			}
			if (gpa >= b && gpa < b + c->bs) {
				snprintf(name, len, "data buffers");
				*end = b + c->bs;
				return;
			}
			if (h > gpa)
				next = MIN(next, h);
			if (b > gpa)
				next = MIN(next, b);
		}
	}
	snprintf(name, len, "other");
	*end = next;
}

/* Pages of [gpa, end) not counted yet, given the last page counted
 * (ranges arrive in address order). */
static uint64_t new_pages(uint64_t gpa, uint64_t end, uint64_t counted, uint64_t *last)
{
	uint64_t first = gpa / 4096, final = (end - 1) / 4096;

	if (counted && first <= *last)
		first = *last + 1;
	if (first > final)
		return 0;
	*last = final;
	return final - first + 1;
}

static void check_count(struct check *c, const char *name, const char *field,
			uint64_t gpa, uint64_t end)
{
	struct check_area *a = NULL;

	for (unsigned i = 0; i < c->nareas && !a; i++)
		if (!strcmp(c->areas[i].name, name))
			a = &c->areas[i];
	if (!a) {
		if (c->nareas == CHECK_AREAS)
			a = &c->areas[CHECK_AREAS - 1];	/* cannot happen: areas are bounded */
		else
			a = &c->areas[c->nareas++];
		snprintf(a->name, sizeof(a->name), "%s", name);
	}
	if (field) {
		unsigned f = 0;

		while (f < a->nfields && strcmp(a->fields[f], field))
			f++;
		if (f == a->nfields && f < ARRAY_SIZE(a->fields))
			a->fields[a->nfields++] = field;
	}
	a->pages += new_pages(gpa, end, a->pages, &a->last_page);
	a->bytes += end - gpa;
	c->pages += new_pages(gpa, end, c->pages, &c->last_page);
	c->bytes += end - gpa;
}

static void check_diff(void *opaque, uint64_t gpa, uint64_t len)
{
	struct check *c = opaque;
	uint64_t stop = gpa + len;

	while (gpa < stop) {
		char name[32];
		const char *field;
		uint64_t end;

		check_classify(c, gpa, name, sizeof(name), &field, &end);
		if (end <= gpa || end > stop)
			end = stop;
		/* The first few say where; the counts say how much. */
		if (c->reported++ < CHECK_REPORTS)
			fprintf(stderr, "vblk-bench: migrate check: %" PRIu64 " byte%s at 0x%"
				PRIx64 " (%s%s%s) differ from the migrated copy: written but "
				"not logged\n", end - gpa, end - gpa == 1 ? "" : "s", gpa, name,
				field ? ", " : "", field ? field : "");
		check_count(c, name, field, gpa, end);
		gpa = end;
	}
}

/*
 * The end of a migration: every ring stopped (its base must be where the
 * driver stopped: each request it was given, completed), a last sync, and
 * the memory compared with the copy.  Connecting thread, jobs joined.
 */
static void migrate_check(struct check *c)
{
	int64_t r;

	c->bases_ok = true;
	r = vdrv_stop_rings(c->d, c->bases);
	if (r < 0)
		cli_die("migrate check: stopping the rings (GET_VRING_BASE) failed: %s",
			strerror((int)-r));
	for (unsigned i = 0; i < c->d->num_queues; i++) {
		if (c->bases[i] == c->d->q[i].avail_idx)
			continue;
		fprintf(stderr, "vblk-bench: migrate check: queue %u stopped at base %u, the "
			"driver made %u requests available: a destination would resume "
			"elsewhere\n", i, c->bases[i], c->d->q[i].avail_idx);
		c->bases_ok = false;
	}
	r = vdrv_log_compare(c->d, check_diff, c);
	if (r < 0)
		cli_die("migrate check: comparing memory failed: %s", strerror((int)-r));
	c->ran = true;
}

static bool check_failed(const struct check *c)
{
	return c->ran && (c->bytes || !c->bases_ok);
}

/* The check as one JSON value. */
static void check_json(FILE *f, const struct check *c)
{
	fprintf(f, "{\"checked\": %s", c->ran ? "true" : "false");
	if (c->ran) {
		fprintf(f, ", \"mismatch_bytes\": %" PRIu64 ", \"mismatch_pages\": %" PRIu64
			", \"ring_bases_ok\": %s, \"ring_bases\": [", c->bytes, c->pages,
			c->bases_ok ? "true" : "false");
		for (unsigned i = 0; i < c->d->num_queues; i++)
			fprintf(f, "%s%u", i ? ", " : "", c->bases[i]);
		fprintf(f, "], \"areas\": {");
		for (unsigned i = 0; i < c->nareas; i++) {
			const struct check_area *a = &c->areas[i];

			fprintf(f, "%s\"%s\": {\"bytes\": %" PRIu64 ", \"pages\": %" PRIu64
				", \"fields\": [", i ? ", " : "", a->name, a->bytes, a->pages);
			for (unsigned k = 0; k < a->nfields; k++)
				fprintf(f, "%s\"%s\"", k ? ", " : "", a->fields[k]);
			fprintf(f, "]}");
		}
		fprintf(f, "}");
	}
	fprintf(f, "}");
}

static void check_text(FILE *f, const struct check *c)
{
	if (!c->ran) {
		fprintf(f, "  migrate check: not done (requests stranded)\n");
		return;
	}
	fprintf(f, "  migrate check: ring bases %s, ", c->bases_ok ? "ok" : "WRONG");
	if (!c->bytes) {
		fprintf(f, "memory matches the migrated copy\n");
		return;
	}
	fprintf(f, "%" PRIu64 " bytes in %" PRIu64 " pages written but not logged:\n",
		c->bytes, c->pages);
	for (unsigned i = 0; i < c->nareas; i++) {
		const struct check_area *a = &c->areas[i];

		fprintf(f, "    %-24s %8" PRIu64 " bytes %6" PRIu64 " pages", a->name, a->bytes,
			a->pages);
		for (unsigned k = 0; k < a->nfields; k++)
			fprintf(f, "%s%s", k ? ", " : "  (", a->fields[k]);
		fprintf(f, "%s\n", a->nfields ? ")" : "");
	}
}

int main(int argc, char **argv)
{
	static const char *const modes[] = { "read", "write", "randread", "randwrite",
					     "randrw", "trim", "flush" };
	struct opts o;
	struct vdrv_opts vo = { 0 };
	struct vdrv *d;
	struct job *jobs;
	struct hist all;
	struct rusage ru0, ru1;
	struct check check = { 0 };
	struct vdrv_log_stats ls;
	pthread_t syncer, waker_thread;
	struct waker waker = { .stop = false };
	unsigned toggles = 0;
	bool stranded = false;
	char err[512];
	uint64_t cap, span, ios = 0, bytes = 0, errors = 0, verify_errors = 0, verified = 0;
	uint64_t kicks = 0, calls = 0, t0, t1, submitted = 0, completed = 0, bad_used = 0;
	double secs, user, sys;
	int r;

	parse(argc, argv, &o);
	vo.socket = o.socket;
	vo.num_queues = o.numjobs;
	vo.queue_size = o.queue_size;
	vo.no_event_idx = o.no_event_idx;
	vo.packed = o.packed;
	vo.dirty_log = o.dirty_log;
	vo.mem_bytes = (size_t)o.numjobs * o.iodepth * (o.bs + 4096 + 64) + (1 << 20);
	r = vdrv_connect(&vo, &d, err, sizeof(err));
	if (r < 0)
		cli_die("%s", err);

	cap = vdrv_capacity(d);
	if (o.rw == RW_TRIM && !vdrv_has(d, VIRTIO_BLK_F_DISCARD))
		cli_die("--rw trim: the backend at '%s' does not offer discard "
			"(VIRTIO_BLK_F_DISCARD)", o.socket);
	if (o.rw == RW_FLUSH && !vdrv_has(d, VIRTIO_BLK_F_FLUSH))
		cli_die("--rw flush: the backend at '%s' does not offer flush "
			"(VIRTIO_BLK_F_FLUSH)", o.socket);
	if (o.bs % vdrv_block_size(d))
		cli_die("--bs %" PRIu64 " is not a multiple of the disk's block size %u", o.bs,
			vdrv_block_size(d));
	if (o.offset % o.bs || o.offset >= cap)
		cli_die("--offset %" PRIu64 " must be a multiple of --bs inside the disk (%" PRIu64
			" bytes)", o.offset, cap);
	if (!o.size)
		o.size = cap - o.offset;
	if (o.size > cap - o.offset)
		cli_die("--size %" PRIu64 " from --offset %" PRIu64 " runs past the end of the "
			"disk (%" PRIu64 " bytes)", o.size, o.offset, cap);
	span = o.size / o.numjobs / o.bs;
	if (span < (o.verify ? o.iodepth + 1ull : 1ull))
		cli_die("--size %" PRIu64 " is too small for %u jobs of --bs %" PRIu64
			" at --iodepth %u", o.size, o.numjobs, o.bs, o.iodepth);

	jobs = calloc(o.numjobs, sizeof(*jobs));
	if (!jobs)
		cli_die("out of memory");
	for (unsigned i = 0; i < o.numjobs; i++) {
		struct job *j = &jobs[i];

		j->id = i;
		j->o = &o;
		j->d = d;
		j->q = &d->q[i];
		j->nblocks = span;
		j->base = o.offset + (uint64_t)i * span * o.bs;
		if (job_setup(j) < 0)
			cli_die("out of memory (shared buffers for %u x %" PRIu64 " bytes)",
				o.iodepth, o.bs);
	}

	/* A migration that starts before the guest does anything: the whole
	 * run is logged. */
	if (o.dirty_log) {
		if (vdrv_log_start(d, err, sizeof(err)) < 0)
			cli_die("--dirty-log: %s", err);
		if (pthread_create(&syncer, NULL, sync_main, d))
			cli_die("cannot start the log sync thread");
	}

	atomic_store(&phase, o.ramp > 0 ? 0 : 1);
	waker.jobs = jobs;
	waker.njobs = o.numjobs;
	if (!o.poll && pthread_create(&waker_thread, NULL, waker_main, &waker))
		cli_die("cannot start the waker thread");
	for (unsigned i = 0; i < o.numjobs; i++)
		if (pthread_create(&jobs[i].thread, NULL, job_main, &jobs[i]))
			cli_die("cannot start job threads");
	if (o.ramp > 0)
		sleep_s(o.ramp);
	for (unsigned i = 0; i < o.numjobs; i++) {
		jobs[i].kicks0 = jobs[i].q->kicks;
		jobs[i].calls0 = jobs[i].q->calls;
	}
	getrusage(RUSAGE_SELF, &ru0);
	t0 = sys_now_ns();
	atomic_store(&phase, 1);
	if (o.log_toggle_ms)
		toggles = toggle_window(d, &o, t0);
	else
		sleep_s(o.runtime);
	atomic_store(&phase, 2);
	t1 = sys_now_ns();
	if (!o.poll)
		poke_sleepers(&waker, true);	/* the end of the run, at once */
	getrusage(RUSAGE_SELF, &ru1);
	/* Counters are read racily at the window's edges; the error is a
	 * handful of events against millions. */
	for (unsigned i = 0; i < o.numjobs; i++) {
		jobs[i].kicks = jobs[i].q->kicks - jobs[i].kicks0;
		jobs[i].calls = jobs[i].q->calls - jobs[i].calls0;
	}
	for (unsigned i = 0; i < o.numjobs; i++) {
		pthread_join(jobs[i].thread, NULL);
		stranded |= jobs[i].stalled;
	}
	if (!o.poll) {
		atomic_store(&waker.stop, true);
		pthread_join(waker_thread, NULL);
	}
	if (o.dirty_log) {
		atomic_store(&sync_stop, true);
		pthread_join(syncer, NULL);
	}
	/* With requests stranded in the backend nobody can say when it is
	 * done writing: the comparison would be noise. */
	check = (struct check){ .d = d, .jobs = jobs, .njobs = o.numjobs, .bs = o.bs };
	if (o.migrate_check && !stranded)
		migrate_check(&check);
	vdrv_log_get_stats(d, &ls);

	hist_init(&all);
	for (unsigned i = 0; i < o.numjobs; i++) {
		struct job *j = &jobs[i];

		hist_merge(&all, &j->lat);
		ios += j->ios;
		bytes += j->bytes;
		errors += j->errors + j->verify_errors + j->q->bad_used;
		verify_errors += j->verify_errors;
		verified += j->verified;
		kicks += j->kicks;
		calls += j->calls;
		submitted += j->submitted;
		completed += j->completed;
		bad_used += j->q->bad_used;
	}
	secs = (double)(t1 - t0) / 1e9;
	user = ts_sec(ru1.ru_utime) - ts_sec(ru0.ru_utime);
	sys = ts_sec(ru1.ru_stime) - ts_sec(ru0.ru_stime);

	if (o.json) {
		printf("{\"rw\": \"%s\", \"bs\": %" PRIu64 ", \"iodepth\": %u, \"numjobs\": %u, "
		       "\"poll\": %s, \"event_idx\": %s, \"runtime_s\": %.3f, "
		       "\"iops\": %.1f, \"bw_bytes\": %.1f, \"ios\": %" PRIu64 ", "
		       "\"errors\": %" PRIu64 ", \"verify_errors\": %" PRIu64 ", "
		       "\"verified\": %" PRIu64 ", "
		       "\"lat_ns\": {\"mean\": %.1f, \"min\": %" PRIu64 ", \"p50\": %" PRIu64
		       ", \"p99\": %" PRIu64 ", \"p999\": %" PRIu64 ", \"max\": %" PRIu64 "}, "
		       "\"kicks\": %" PRIu64 ", \"calls\": %" PRIu64 ", "
		       "\"kicks_per_io\": %.4f, \"calls_per_io\": %.4f, "
		       "\"cpu_user_s\": %.3f, \"cpu_sys_s\": %.3f, "
		       "\"requests_submitted\": %" PRIu64 ", \"requests_completed\": %" PRIu64
		       ", \"bad_used\": %" PRIu64 ", \"discard\": %s, "
		       "\"discard_sector_alignment\": %u, \"max_discard_sectors\": %u",
		       modes[o.rw], o.bs, o.iodepth, o.numjobs, o.poll ? "true" : "false",
		       vdrv_has(d, VIRTIO_RING_F_EVENT_IDX) ? "true" : "false", secs,
		       ios / secs, bytes / secs, ios, errors, verify_errors, verified,
		       all.count ? (double)all.sum / all.count : 0.0,
		       all.count ? all.min : 0, hist_quantile(&all, 0.5),
		       hist_quantile(&all, 0.99), hist_quantile(&all, 0.999), all.max,
		       kicks, calls, ios ? (double)kicks / ios : 0, ios ? (double)calls / ios : 0,
		       user, sys, submitted, completed, bad_used,
		       vdrv_has(d, VIRTIO_BLK_F_DISCARD) ? "true" : "false",
		       d->cfg.discard_sector_alignment, d->cfg.max_discard_sectors);
		printf(", \"dirty_log\": %s, \"log_syncs\": %" PRIu64 ", \"log_dirty_pages\": %"
		       PRIu64 ", \"log_bulk_copies\": %" PRIu64 ", \"log_toggle_ms\": %u, "
		       "\"log_toggles\": %u, \"log_switch_max_us\": %.1f, \"migrate_check\": ",
		       o.dirty_log ? "true" : "false", ls.syncs, ls.dirty_pages, ls.starts,
		       o.log_toggle_ms, toggles, ls.switch_max_ns / 1e3);
		if (o.migrate_check)
			check_json(stdout, &check);
		else
			printf("null");
		printf("}\n");
	} else {
		printf("vblk-bench: %s bs=%" PRIu64 " iodepth=%u numjobs=%u %s%s, %.1f s\n",
		       modes[o.rw], o.bs, o.iodepth, o.numjobs, o.poll ? "polling" : "interrupts",
		       vdrv_has(d, VIRTIO_RING_F_EVENT_IDX) ? ", event_idx" : "", secs);
		printf("  iops %.0f  bw %.1f MiB/s  ios %" PRIu64 "  errors %" PRIu64 "\n",
		       ios / secs, bytes / secs / 1048576.0, ios, errors);
		printf("  lat (us): mean %.1f  p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n",
		       all.count ? (double)all.sum / all.count / 1e3 : 0.0,
		       hist_quantile(&all, 0.5) / 1e3, hist_quantile(&all, 0.99) / 1e3,
		       hist_quantile(&all, 0.999) / 1e3, all.max / 1e3);
		printf("  kicks/io %.3f  calls/io %.3f  cpu user %.2f s sys %.2f s\n",
		       ios ? (double)kicks / ios : 0, ios ? (double)calls / ios : 0, user, sys);
		if (o.verify)
			printf("  verify: %" PRIu64 " blocks checked, %" PRIu64 " mismatches\n",
			       verified, verify_errors);
		if (o.dirty_log)
			printf("  dirty log: %" PRIu64 " syncs, %" PRIu64 " dirty pages copied, "
			       "%" PRIu64 " bulk cop%s, %u switches under load, slowest switch "
			       "%.1f us\n", ls.syncs, ls.dirty_pages, ls.starts,
			       ls.starts == 1 ? "y" : "ies", toggles, ls.switch_max_ns / 1e3);
		if (o.migrate_check)
			check_text(stdout, &check);
	}
	if (o.hold > 0) {
		fflush(stdout);
		sleep_s(o.hold);
	}
	vdrv_close(d);
	for (unsigned i = 0; i < o.numjobs; i++) {
		free(jobs[i].slots);
		free(jobs[i].free_slots);
		free(jobs[i].gen);
		free(jobs[i].busy);
	}
	free(jobs);
	return errors || check_failed(&check) ? 1 : 0;
}
