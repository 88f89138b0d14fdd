/*
 * vblkd: serve a disk to virtual machines over vhost-user-blk.
 * The main thread owns the socket, control messages and signals; the
 * device's iothread does all I/O (see docs/architecture.md).
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "config.h"
#include "backend/bdev.h"
#include "format/format.h"
#include "blk/blk.h"
#include "ctl/ctl.h"
#include "disk/disk.h"
#include "loop/defer.h"
#include "loop/loop.h"
#include "nbd/nbds.h"
#include "qos/qos.h"
#include "util/cli.h"
#include "util/log.h"
#include "util/notify.h"
#include "util/parse.h"
#include "util/sys.h"
#include "mem/gm.h"
#include "metrics/metrics.h"
#include "upgrade/up.h"
#include "vhost/vu.h"

struct vblkd {
	struct loop *loop;
	struct disk *disk;		/* the disk, its iothreads */
	struct blk_dev *dev;
	unsigned num_queues;
	int sfd;
	struct loop_fd *sfd_h;
	struct vu_server *srv;		/* NULL: no --socket */
	struct nbds *nbds;		/* the NBD exports (--nbd) */
	int gfd;			/* SIGBUS guard eventfd (gm.h) */
	struct loop_fd *gfd_h;
	struct ctl_server *ctl;
	struct metrics_http *mh;
	struct bdev *b;		/* the disk served (the format's) */
	struct bdev *file;	/* the file under it (b itself for raw) */
	pid_t successor;		/* upgraded in place: who serves now */
};

static void usage(FILE *f)
{
	fprintf(f,
"Usage: vblkd --socket PATH --disk DISK [options]\n"
"       vblkd --nbd ADDR[,...] --disk DISK [options]\n"
"Serve DISK as a virtio-blk disk over the vhost-user protocol on the unix\n"
"socket PATH, and/or as NBD exports (both at once: one disk, one daemon).\n"
"\n"
"  --socket PATH        unix socket to listen on (a stale one is replaced)\n"
"  --nbd ADDR[,name=NAME][,read-only][,max-conn=N][,tls=x509:DIR|psk:FILE]\n"
"                       also serve the disk over NBD (nbdcopy, qemu-img,\n"
"                       nbdinfo, QEMU's nbd driver) on unix:PATH or HOST:PORT;\n"
"                       export name NAME (default: the empty name), at most\n"
"                       N clients at once (default %u); with tls=, clients\n"
"                       must use TLS (DIR: server-cert.pem, server-key.pem;\n"
"                       FILE: psktool's identity:hexkey lines); repeatable\n"
"  --disk DISK          what to serve: an image file or block device;\n"
"                       rbd:POOL/IMAGE[@SNAP], a Ceph RBD image (a snapshot\n"
"                       is read-only); or an NBD export by its URI,\n"
"                       nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH\n"
"  --ceph-conf PATH     rbd: the cluster's ceph.conf (default: $CEPH_CONF,\n"
"                       /etc/ceph/ceph.conf, ...)\n"
"  --ceph-id NAME       rbd: the Ceph client id (default: admin)\n"
"  --queues N           number of virtqueues offered, 1-%d (default 1)\n"
"  --iothreads N        I/O threads (default 1); queue q runs on q mod N\n"
"  --queue-map MAP      explicit queue -> iothread map, e.g. 0:0,1:1,2:0\n"
"  --cpu-affinity LIST  pin iothread i to CPU LIST[i mod len], e.g. 2,3\n"
"  --read-only          export read-only: the guest cannot write\n"
"  --format FMT         raw, qcow2, luks, or auto: qcow2 or LUKS by the file's\n"
"                       magic, else raw (default); qcow2 backing files are\n"
"                       opened read-only from the image's header\n"
"  --l2-cache-size N    qcow2: bytes of L2 tables in memory (K/M/G; default:\n"
"                       the whole image's, at most 32M)\n"
"  --copy-on-read       qcow2 with a backing file: what the guest reads from\n"
"                       the backing chain is copied into the image\n"
"  --key-file PATH      LUKS: the file holding the passphrase (- for standard\n"
"                       input; a bare name in $CREDENTIALS_DIRECTORY: a systemd\n"
"                       credential), read whole as cryptsetup --key-file does\n"
"  --kdf-max-ms N       LUKS: a keyslot whose key derivation would take longer\n"
"                       here is not tried (default 10000; the image is hostile\n"
"                       until it opens)\n"
"  --kdf-max-memory N   LUKS: ... or would need more memory (K/M/G; default 1G)\n"
"  --cache MODE         none (O_DIRECT), writeback (page cache), or auto:\n"
"                       O_DIRECT where the file supports it (default)\n"
"  --block-size N       logical block size shown to the guest: 512 or 4096\n"
"                       (default: the device's, 512 for files)\n"
"  --serial S           serial number (GET_ID), up to 20 bytes\n"
"                       (default derived from the disk path)\n"
"  --backend NAME       I/O engine: io_uring (default), or null: no disk,\n"
"                       completes at once, reads zeroes (for benchmarks)\n"
"  --size SIZE          null backend without --disk: disk size, e.g. 1G\n"
"  --uring-sqpoll       io_uring: a kernel thread polls submissions\n"
"  --iopoll MODE        io_uring: poll the device for reads and writes\n"
"                       (IOPOLL, no interrupts; the iothread spins while they\n"
"                       are in flight): auto (default: where the device has\n"
"                       poll queues, queue/io_poll in sysfs), on, off\n"
"  --log-level L        error, warn, info (default) or debug\n"
"  --control PATH       control socket for vblkctl (stats, polling knobs, resize,\n"
"                       metrics, upgrade)\n"
"  --metrics ADDR:PORT  serve Prometheus metrics at http://ADDR:PORT/metrics,\n"
"                       e.g. 127.0.0.1:9720, [::1]:9720, :9720 (every address)\n"
"\n"
"Notifications (see docs/architecture.md):\n"
"  --poll-max-ns N      cap of the adaptive polling window for kicks (default\n"
"                       %u; 0 turns all polling off)\n"
"  --completion-poll-max-ns N  cap of the window for the disk's completions,\n"
"                       polled only while I/O is in flight (default %u)\n"
"  --poll-grow N        window multiplier on a near miss (default 2)\n"
"  --poll-shrink N      window divisor after a long sleep; 0 resets (default 2)\n"
"  --no-batch           one interrupt decision per completion (ablation)\n"
"  --no-event-idx       do not offer VIRTIO_RING_F_EVENT_IDX (ablation)\n"
"  --no-early-notify    interrupt only at the end of a batch, never for the\n"
"                       first completion a sleeping driver waits for (ablation)\n"
"  --no-early-submit    io_uring: batch submissions even on a slow disk (ablation)\n"
"  --no-poll-check      poll as the windows say, without checking that it pays\n"
"                       end to end against not polling (ablation)\n"
"  --no-packed          do not offer packed virtqueues (VIRTIO_F_RING_PACKED)\n"
"  --werror report|stop|enospc  a write, flush, discard or write zeroes that\n"
"                       fails: the guest gets the error (report), or the\n"
"                       request is held and the disk pauses until vblkctl\n"
"                       resume (stop: on any error; enospc, the default: on\n"
"                       No space left on device only)\n"
"  --rerror report|stop a read that fails (default report)\n"
"  --error-retry-s N    while paused, retry the held requests every N\n"
"                       seconds (default 0: only on vblkctl resume)\n"
"  --limit LIMITS       QoS, QEMU's throttling names: iops-total=N,iops-read=N,\n"
"                       iops-write=N,bps-total=N,bps-read=N,bps-write=N (K/M/G),\n"
"                       each with -max=N and -max-length=S for bursts, and\n"
"                       iops-size=BYTES; vblkctl set-limits changes them\n"
"  --qos-group NAME     share one budget with every vblkd of that group\n"
"                       (shared memory in $RUNTIME_DIRECTORY/qos or\n"
"                       /run/vblkd/qos; the first member's --limit rules)\n"
"  --irq-moderation-max-ns N  hold an interrupt up to N ns while the guest\n"
"                       keeps several requests outstanding and completions\n"
"                       come close together, so one covers several\n"
"                       (default %u; 0 turns it off)\n"
"  --help               show this help\n"
"  --version            show the version\n"
"\n"
"Signals: SIGTERM/SIGINT finish in-flight I/O and exit 0; SIGUSR1 logs\n"
"the counters (the same JSON as vblkctl stats).\n", NBDS_MAX_CONN_DEFAULT, BLK_MAX_QUEUES,
		BLK_POLL_DEFAULT_NS, BLK_COMPLETION_POLL_DEFAULT_NS,
		BLK_IRQ_MODERATION_DEFAULT_NS);
}

const char cli_name[] = "vblkd";

static unsigned parse_uint(const char *opt, const char *s, unsigned lo, unsigned hi)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *s == '\0' || *end != '\0' || v < lo || v > hi)
		cli_die("%s '%s' is not a number from %u to %u", opt, s, lo, hi);
	return (unsigned)v;
}

/* Which of the three words w option opt's value s is (0-2: an enum in
 * that order), or die with a line saying what is wrong. */
static int word_arg(const char *opt, const char *s, const char *const w[3])
{
	for (int i = 0; i < 3; i++)
		if (!strcmp(s, w[i]))
			return i;
	cli_die("%s '%s' is not one of %s, %s, %s", opt, s, w[0], w[1], w[2]);
}

/* A size for option opt, or die with a line saying what is wrong. */
static uint64_t size_arg(const char *opt, const char *s)
{
	uint64_t v;

	if (parse_size(s, &v) < 0 || v == 0)
		cli_die("%s '%s' is not a size (e.g. 4096, 512M, 1G)", opt, s);
	return v;
}

/* "0,2,3": CPU numbers, each one this machine has. */
static unsigned parse_cpus(const char *s, int *cpus, unsigned max)
{
	long ncpu = sysconf(_SC_NPROCESSORS_CONF);
	unsigned n = 0;
	const char *p = s;

	while (*p) {
		char *end;
		long v;

		errno = 0;
		v = strtol(p, &end, 10);
		if (errno || end == p || v < 0 || (ncpu > 0 && v >= ncpu) || n == max ||
		    (*end && *end != ','))
			cli_die("--cpu-affinity '%s' is not a list of CPUs 0-%ld (e.g. 0,1)", s,
				ncpu - 1);
		cpus[n++] = (int)v;
		p = *end ? end + 1 : end;
	}
	if (!n)
		cli_die("--cpu-affinity '%s' names no CPU", s);
	return n;
}

/* "0:0,1:1": every queue exactly once, each to an existing iothread. */
static void parse_queue_map(const char *s, unsigned *map, unsigned nq, unsigned nt)
{
	bool seen[BLK_MAX_QUEUES] = { false };
	const char *p = s;
	unsigned n = 0;

	while (*p) {
		char *end;
		unsigned long q, t;

		errno = 0;
		q = strtoul(p, &end, 10);
		if (errno || end == p || *end != ':')
			goto bad;
		p = end + 1;
		t = strtoul(p, &end, 10);
		if (errno || end == p || (*end && *end != ','))
			goto bad;
		if (q >= nq)
			cli_die("--queue-map '%s': queue %lu does not exist (--queues %u)", s, q,
				nq);
		if (t >= nt)
			cli_die("--queue-map '%s': iothread %lu does not exist (--iothreads %u)",
				s, t, nt);
		if (seen[q])
			cli_die("--queue-map '%s': queue %lu is mapped twice", s, q);
		seen[q] = true;
		map[q] = (unsigned)t;
		n++;
		p = *end ? end + 1 : end;
	}
	if (n != nq)
		cli_die("--queue-map '%s' must map each of the %u queues", s, nq);
	return;
bad:
	cli_die("--queue-map '%s' is not a list of QUEUE:IOTHREAD pairs (e.g. 0:0,1:1)", s);
}

/* Default serial: stable for a given disk path, distinct across paths. */
static void default_serial(const char *path, char *out, size_t len)
{
	char abs[PATH_MAX];
	uint32_t h = 2166136261u;	/* FNV-1a */

	if (!realpath(path, abs))
		snprintf(abs, sizeof(abs), "%s", path);
	for (const char *p = abs; *p; p++)
		h = (h ^ (uint8_t)*p) * 16777619u;
	snprintf(out, len, "vblk-%08x", h);
}

static void log_stats(struct vblkd *v)
{
	/* As large as a control-socket reply: 64 queues fit. */
	static char buf[65536];

	if (ctl_stats_json(v->dev, buf, sizeof(buf)) > 0)
		log_info("stats %s", buf);
}

static int config_changed_cb(void *opaque)
{
	return vu_server_config_changed(opaque);
}

/* Started by an upgrade, the control socket's path is the old process's
 * still (it serves on if we fail): leave it. */
static void ctl_free_on_error(struct ctl_server *ctl, bool handover)
{
	if (handover)
		ctl_server_free_keep_path(ctl);
	else
		ctl_server_free(ctl);
}

/* vblkctl upgrade: hand everything to a new process (up.h). */
static int upgrade_cb(void *opaque, const char *exec, char *msg, size_t msglen)
{
	struct vblkd *v = opaque;
	struct up_fds f = {
		.listen = v->srv ? vu_server_listen_fd(v->srv) : -1,
		.control = v->ctl ? ctl_server_listen_fd(v->ctl) : -1,
		.metrics = v->mh ? metrics_http_listen_fd(v->mh) : -1,
		/* Files and block devices go over as they are (the image
		 * file under a format); network disks are opened again by the
		 * new process. */
		.disk = v->file->engine->open ? -1 : v->file->fd,
		.key = -1,
	};
	struct up_result res;
	int r;

	if (v->successor) {
		snprintf(msg, msglen, "already handed over to pid %d", (int)v->successor);
		return -EALREADY;
	}
	if (!v->srv || nbds_list(v->nbds, NULL, 0) || v->disk->extra_fronts) {
		snprintf(msg, msglen, "this vblkd serves NBD exports, which cannot be handed "
			 "over yet: restart it instead");
		return -EOPNOTSUPP;
	}
	/* A LUKS disk's key goes over too: the new process reads no
	 * passphrase (its key file may be gone, or was standard input).
	 * A qcow2 image's tables are written back once the rings stopped
	 * and read again by the new process (fmt_quiesce, fmt_claim). */
	r = fmt_key_export(v->b);
	if (r < 0 && r != -ENOENT) {
		snprintf(msg, msglen, "cannot put the disk's key where the new process can take "
			 "it: %s", strerror(-r));
		return r;
	}
	f.key = r;
	r = up_start(v->srv, &f, exec, &res, msg, msglen);
	if (f.key >= 0)
		close(f.key);
	if (r < 0) {
		log_err("upgrade failed: %s", msg);
		return r;
	}
	v->successor = res.pid;
	snprintf(msg, msglen, "pid %d serves now; the rings paused for %llu us",
		 (int)res.pid, (unsigned long long)(res.pause_ns / 1000));
	log_info("upgrade: %s; exiting", msg);
	loop_stop(v->loop);
	return (int)res.pid;
}

static void signal_cb(void *opaque, uint32_t events)
{
	struct vblkd *v = opaque;
	struct signalfd_siginfo si;

	while (read(v->sfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGUSR1) {
			log_stats(v);
			continue;
		}
		log_info("%s: finishing in-flight I/O and exiting",
			 strsignal((int)si.ssi_signo));
		loop_stop(v->loop);
	}
}

/* A page of guest memory vanished under us (the frontend shrank a file it
 * shares with us): the guard absorbed the fault; drop that frontend. */
static void guard_cb(void *opaque, uint32_t events)
{
	struct vblkd *v = opaque;
	uint64_t n;
	char why[128];

	if (read(v->gfd, &n, sizeof(n)) != sizeof(n))
		return;
	if (!v->srv)
		return;
	snprintf(why, sizeof(why), "it shrank memory it shares with us "
		 "(%llu bus errors absorbed in all)",
		 (unsigned long long)gm_guard_faults());
	vu_server_drop(v->srv, why);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "nbd", required_argument, NULL, 'n' },
		{ "disk", required_argument, NULL, 'd' },
		{ "queues", required_argument, NULL, 'q' },
		{ "read-only", no_argument, NULL, 'r' },
		{ "format", required_argument, NULL, 'j' },
		{ "l2-cache-size", required_argument, NULL, 'k' },
		{ "copy-on-read", no_argument, NULL, 'R' },
		{ "key-file", required_argument, NULL, 'y' },
		{ "kdf-max-ms", required_argument, NULL, 'Z' },
		{ "kdf-max-memory", required_argument, NULL, 'm' },
		{ "cache", required_argument, NULL, 'c' },
		{ "block-size", required_argument, NULL, 'b' },
		{ "serial", required_argument, NULL, 'S' },
		{ "backend", required_argument, NULL, 'B' },
		{ "ceph-conf", required_argument, NULL, 'F' },
		{ "ceph-id", required_argument, NULL, 'I' },
		{ "size", required_argument, NULL, 'z' },
		{ "control", required_argument, NULL, 'C' },
		{ "metrics", required_argument, NULL, 'X' },
		{ "iothreads", required_argument, NULL, 'T' },
		{ "uring-sqpoll", no_argument, NULL, 'Q' },
		{ "iopoll", required_argument, NULL, 'U' },
		{ "queue-map", required_argument, NULL, 'M' },
		{ "cpu-affinity", required_argument, NULL, 'A' },
		{ "poll-max-ns", required_argument, NULL, 'P' },
		{ "irq-moderation-max-ns", required_argument, NULL, 'O' },
		{ "werror", required_argument, NULL, 'w' },
		{ "rerror", required_argument, NULL, 'e' },
		{ "error-retry-s", required_argument, NULL, 'f' },
		{ "limit", required_argument, NULL, 'o' },
		{ "qos-group", required_argument, NULL, 'g' },
		{ "completion-poll-max-ns", required_argument, NULL, 'W' },
		{ "poll-grow", required_argument, NULL, 'G' },
		{ "poll-shrink", required_argument, NULL, 'K' },
		{ "no-batch", no_argument, NULL, 'N' },
		{ "no-event-idx", no_argument, NULL, 'E' },
		{ "no-early-notify", no_argument, NULL, 'L' },
		{ "no-early-submit", no_argument, NULL, 'Y' },
		{ "no-poll-check", no_argument, NULL, 'H' },
		{ "no-packed", no_argument, NULL, 'J' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct bdev_opts bo = { .cache = BDEV_CACHE_AUTO };
	struct loop_poll_params poll = { .max_ns = BLK_POLL_DEFAULT_NS, .grow = 2, .shrink = 2,
					 .completion_max_ns = BLK_COMPLETION_POLL_DEFAULT_NS };
	struct blk_opts ko = { .num_queues = 1, .poll = &poll, .werror = BLK_ERR_ENOSPC,
			       .irq_moderation_max_ns = BLK_IRQ_MODERATION_DEFAULT_NS };
	const char *sock = NULL, *ctl_path = NULL, *map_arg = NULL, *metrics_addr = NULL;
	const char *qos_group = NULL;
	struct qos_limits limits = { 0 };
	bool have_limits = false;
	struct metrics_source ms;
	struct metrics_http *mh = NULL;
	unsigned qmap[BLK_MAX_QUEUES];
	int cpus[BLK_MAX_QUEUES];
	struct ctl_server *ctl = NULL;
	char serial[32], err[600], msg[512];
	struct vblkd v = { .sfd = -1, .gfd = -1 };
	struct vu_server *srv = NULL;
	struct nbds_export_opts nbd[8];
	unsigned nnbd = 0;
	struct up_child uc;
	bool handover;
	struct bdev b, *disk = NULL;
	struct fmt_opts fo = { .kind = FMT_AUTO, .bo = &bo };
	sigset_t mask;
	int c, r;

	up_init(argv);
	opterr = 0;	/* our own one-line messages below */
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 's': sock = optarg; break;
		case 'n':
			if (nnbd == ARRAY_SIZE(nbd))
				cli_die("--nbd: at most %zu exports at start (vblkctl nbd add adds "
					"more)", ARRAY_SIZE(nbd));
			if (nbds_export_parse(optarg, &nbd[nnbd], msg, sizeof(msg)) < 0)
				cli_die("--nbd %s", msg);
			nnbd++;
			break;
		case 'd': bo.path = optarg; break;
		case 'q':
			ko.num_queues = parse_uint("--queues", optarg, 1, BLK_MAX_QUEUES);
			break;
		case 'r': bo.read_only = true; break;
		case 'j':
			if (fmt_parse(optarg, &fo.kind) < 0)
				cli_die("--format '%s' is not one of raw, qcow2, luks, auto", optarg);
			break;
		case 'R': fo.copy_on_read = true; break;
		case 'y': fo.key_file = optarg; break;
		case 'Z':
			fo.kdf_max_ms = parse_uint("--kdf-max-ms", optarg, 1, 86400000);
			break;
		case 'm':
			fo.kdf_max_kib = size_arg("--kdf-max-memory", optarg) >> 10;
			if (fo.kdf_max_kib < 32 || fo.kdf_max_kib > (4ull << 20))
				cli_die("--kdf-max-memory %s: give 32K to 4G", optarg);
			break;
		case 'k':
			fo.l2_cache_bytes = size_arg("--l2-cache-size", optarg);
			if (fo.l2_cache_bytes < 4096)
				cli_die("--l2-cache-size %s: give at least 4K", optarg);
			break;
		case 'c':
			bo.cache = word_arg("--cache", optarg, (const char *const[]){
						    [BDEV_CACHE_AUTO] = "auto",
						    [BDEV_CACHE_NONE] = "none",
						    [BDEV_CACHE_WRITEBACK] = "writeback" });
			break;
		case 'b':
			bo.block_size = parse_uint("--block-size", optarg, 512, 4096);
			if (bo.block_size != 512 && bo.block_size != 4096)
				cli_die("--block-size must be 512 or 4096, not %s", optarg);
			break;
		case 'S':
			if (strlen(optarg) > 20)
				cli_die("--serial '%s' is longer than 20 bytes", optarg);
			ko.serial = optarg;
			break;
		case 'B': bo.engine = optarg; break;
		case 'F': bo.ceph_conf = optarg; break;
		case 'I': bo.ceph_id = optarg; break;
		case 'z': bo.size = size_arg("--size", optarg); break;
		case 'C': ctl_path = optarg; break;
		case 'X': metrics_addr = optarg; break;
		case 'T':
			ko.num_iothreads = parse_uint("--iothreads", optarg, 1, BLK_MAX_QUEUES);
			break;
		case 'M': map_arg = optarg; break;
		case 'Q': bo.uring_sqpoll = true; break;
		case 'U':
			bo.iopoll = word_arg("--iopoll", optarg, (const char *const[]){
						     [BDEV_IOPOLL_AUTO] = "auto",
						     [BDEV_IOPOLL_ON] = "on",
						     [BDEV_IOPOLL_OFF] = "off" });
			break;
		case 'A':
			ko.ncpus = parse_cpus(optarg, cpus, BLK_MAX_QUEUES);
			ko.cpus = cpus;
			break;
		case 'W':
			poll.completion_max_ns = parse_uint("--completion-poll-max-ns", optarg, 0,
							    1000000000);
			break;
		case 'O':
			ko.irq_moderation_max_ns = parse_uint("--irq-moderation-max-ns", optarg, 0,
							      1000000);
			break;
		case 'w':
			ko.werror = (enum blk_err_policy)word_arg("--werror", optarg,
				(const char *const[]){ "report", "stop", "enospc" });
			break;
		case 'e':
			if (!strcmp(optarg, "report") || !strcmp(optarg, "stop"))
				ko.rerror = optarg[0] == 's' ? BLK_ERR_STOP : BLK_ERR_REPORT;
			else
				cli_die("--rerror '%s' is not one of report, stop", optarg);
			break;
		case 'f':
			ko.error_retry_ns = parse_uint("--error-retry-s", optarg, 0, 86400) *
					    1000000000ull;
			break;
		case 'o':
			if (qos_limits_parse(optarg, &limits, msg, sizeof(msg)) < 0)
				cli_die("--limit %s: %s", optarg, msg);
			have_limits = true;
			break;
		case 'g': qos_group = optarg; break;
		case 'P':
			poll.max_ns = parse_uint("--poll-max-ns", optarg, 0, 1000000000);
			break;
		case 'G': poll.grow = parse_uint("--poll-grow", optarg, 2, 1024); break;
		case 'K': poll.shrink = parse_uint("--poll-shrink", optarg, 0, 1024); break;
		case 'N': defer_set_batching(false); break;
		case 'H': poll.no_check = true; break;
		case 'E': ko.no_event_idx = true; break;
		case 'L': ko.no_early_notify = true; break;
		case 'Y': bo.no_early_submit = true; break;
		case 'J': ko.no_packed = true; break;
		case 'l':
			r = log_parse_level(optarg);
			if (r < 0)
				cli_die("--log-level '%s' is not one of error, warn, info, debug",
					optarg);
			log_set_level((enum log_level)r);
			break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("vblkd %s\n", VBLKD_VERSION); return 0;
		case ':':
			cli_die("option '%s' needs a value; see vblkd --help",
				argv[optind - 1]);
		default:
			cli_die("unknown option '%s'; see vblkd --help", argv[optind - 1]);
		}
	}
	if (optind < argc)
		cli_die("unexpected argument '%s'; see vblkd --help", argv[optind]);
	if (!sock && !nnbd)
		cli_die("missing --socket PATH (the unix socket QEMU connects to) or --nbd ADDR "
			"(an NBD export): give at least one");
	if (!bo.path && !(bo.engine && !strcmp(bo.engine, "null")))
		cli_die("missing --disk DISK: the image file, block device, rbd:POOL/IMAGE or "
			"nbd:// URI to serve");
	if (bo.size && bo.path)
		cli_die("--size is for the null backend without --disk; the disk has its own size");
	if (!bo.path && !bo.size)
		bo.size = 1ull << 30;
	if (!ko.num_iothreads)
		ko.num_iothreads = 1;
	if (ko.num_iothreads > ko.num_queues)
		cli_die("--iothreads %u is more than --queues %u: extra iothreads would have "
			"no queue", ko.num_iothreads, ko.num_queues);
	if (map_arg) {
		parse_queue_map(map_arg, qmap, ko.num_queues, ko.num_iothreads);
		ko.queue_map = qmap;
	}
	if (!ko.serial) {
		default_serial(bo.path ? bo.path : "null", serial, sizeof(serial));
		ko.serial = serial;
	}

	/* Signals go to the main loop only: block them before any thread
	 * starts so iothreads inherit the mask. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);

	/* Started by vblkctl upgrade: the old process hands us its sockets
	 * and disk now, its rings once we are set up (up.h). */
	r = up_child_begin(&uc, err, sizeof(err));
	if (r < 0)
		cli_die("%s", err);
	handover = r == 1;
	if (handover && uc.fds.disk >= 0) {
		bo.take_fd = true;
		bo.fd = uc.fds.disk;
	}
	fo.handover = handover;
	if (handover && uc.fds.key >= 0) {
		fo.key_handed = true;
		fo.key_fd = uc.fds.key;
	}
	if (handover && (uc.fds.listen < 0 || !sock))
		cli_die("upgrade: the old vblkd handed over no vhost-user socket");

	r = bdev_open(&bo, &b, err, sizeof(err));
	if (r < 0)
		cli_die("%s", err);
	/* The format over the file: what the guest sees (format.h). */
	if (b.engine->open && fo.kind == FMT_QCOW2) {
		bdev_close(&b);
		cli_die("--format qcow2: vblkd reads qcow2 images from files and block devices "
			"only, not from a %s disk: export the image's contents instead (qemu-nbd "
			"-f qcow2, or qemu-img convert -O raw)", b.engine->name);
	}
	r = fmt_open(&b, &fo, &disk, err, sizeof(err));
	if (fo.key_handed)
		close(fo.key_fd);
	if (r < 0) {
		bdev_close(&b);
		cli_die("%s", err);
	}
	if (fo.copy_on_read && !fmt_has_backing(disk)) {
		fmt_close(disk, &b);
		bdev_close(&b);
		cli_die("--copy-on-read: %s is not a qcow2 image with a backing file: there is "
			"nothing below it to copy; drop the option", b.path);
	}
	if (disk->max_ctxs && ko.num_iothreads > disk->max_ctxs) {
		fmt_close(disk, &b);
		bdev_close(&b);
		cli_die("--iothreads %u: %s serves one disk from %u iothread%s (%s); drop "
			"--iothreads (all queues then share that iothread)",
			ko.num_iothreads, disk != &b ? "qcow2" : b.engine->name, disk->max_ctxs,
			disk->max_ctxs > 1 ? "s" : "",
			disk != &b ? "its metadata belongs to one thread, as in QEMU" :
			!strcmp(b.engine->name, "rbd") ? "one librbd image handle per disk" :
			"the NBD server does not allow several connections (multi-conn)");
	}
	/* QoS: a group's budget (joined after the disk opened, so a bad
	 * disk leaves no group behind), or the disk's own.  Upgraded in
	 * place, a member takes the group's limits as they are now. */
	if (qos_group) {
		r = qos_group_join(qos_group, NULL, handover || !have_limits ? NULL : &limits,
				   &ko.qos, msg, sizeof(msg));
		if (r < 0) {
			fmt_close(disk, &b);
			bdev_close(&b);
			cli_die("%s", msg);
		}
	} else if (have_limits) {
		r = qos_new(&limits, &ko.qos);
		if (r < 0) {
			fmt_close(disk, &b);
			bdev_close(&b);
			cli_die("cannot set up the QoS limits: %s", strerror(-r));
		}
	}
	r = disk_new(disk, &(struct disk_opts){ .num_iothreads = ko.num_iothreads,
						  .cpus = ko.cpus, .ncpus = ko.ncpus,
						  .poll = ko.poll }, &v.disk);
	if (r < 0) {
		qos_free(ko.qos);
		fmt_close(disk, &b);
		bdev_close(&b);
		cli_die("cannot start the iothreads: %s", strerror(-r));
	}
	r = blk_dev_new_on(v.disk, &ko, &v.dev);
	if (r < 0) {
		disk_free(v.disk);
		fmt_close(disk, &b);
		bdev_close(&b);
		cli_die("cannot start the device: %s", strerror(-r));
	}
	if (have_limits || qos_group) {
		struct qos_limits l;

		qos_get(blk_dev_qos(v.dev), &l, NULL, sys_now_ns());
		qos_limits_format(&l, msg, sizeof(msg));
		log_info("QoS limits%s%s: %s", qos_group ? " of group " : "",
			 qos_group ? qos_group : "", msg[0] ? msg : "none");
	}
	v.num_queues = ko.num_queues;
	r = loop_new("main", &v.loop);
	if (r < 0)
		goto err_dev;
	r = blk_dev_attach(v.dev, v.loop);
	if (r < 0) {
		snprintf(err, sizeof(err), "cannot watch the device's pauses: %s", strerror(-r));
		goto err_loop;
	}
	v.sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (v.sfd < 0 || loop_fd_add(v.loop, v.sfd, EPOLLIN, signal_cb, &v, &v.sfd_h) < 0) {
		snprintf(err, sizeof(err), "cannot set up signal handling: %s",
			 strerror(errno));
		goto err_loop;
	}
	/* Metrics (vblkctl metrics, --metrics) read what ctl's stats read,
	 * on this thread; the frontend counters once srv exists. */
	metrics_source_init(&ms, v.dev, disk);
	if (ctl_path) {
		r = ctl_server_new_fd(ctl_path, uc.fds.control, v.loop, v.dev, &ctl, msg,
				      sizeof(msg));
		if (r < 0) {
			snprintf(err, sizeof(err), "--control: %s", msg);
			goto err_loop;
		}
		uc.fds.control = -1;
		r = ctl_server_add_cmd(ctl, "metrics", metrics_ctl_cmd, &ms);
		if (r < 0) {
			snprintf(err, sizeof(err), "--control: %s", strerror(-r));
			ctl_free_on_error(ctl, handover);
			goto err_loop;
		}
	}
	if (metrics_addr) {
		/* Upgraded in place: the old process's listener, no gap. */
		r = metrics_http_new(metrics_addr, uc.fds.metrics, v.loop, &ms, &mh, msg,
				     sizeof(msg));
		if (r < 0) {
			snprintf(err, sizeof(err), "--metrics %s", msg);
			ctl_free_on_error(ctl, handover);
			goto err_loop;
		}
		uc.fds.metrics = -1;
		log_info("metrics at http://%s/metrics (port %u)", metrics_addr,
			 metrics_http_port(mh));
	}
	sys_close(&uc.fds.control);
	sys_close(&uc.fds.metrics);
	r = sock ? vu_server_new_fd(sock, uc.fds.listen, v.loop, &blk_vu_ops, v.dev, &srv,
				    msg, sizeof(msg)) : 0;
	if (r < 0) {
		snprintf(err, sizeof(err), "--socket: %s", msg);
		metrics_http_free(mh);
		ctl_free_on_error(ctl, handover);
		goto err_loop;
	}
	r = nbds_new(v.disk, v.loop, &v.nbds);
	for (unsigned i = 0; r == 0 && i < nnbd; i++)
		if ((r = nbds_add(v.nbds, &nbd[i], msg, sizeof(msg))) < 0)
			snprintf(err, sizeof(err), "--nbd %s", msg);
	for (unsigned i = 0; i < nnbd; i++)
		nbds_export_opts_free(&nbd[i]);
	if (r == 0 && ctl &&
	    ((r = ctl_server_add_cmd(ctl, "nbd-add", nbds_ctl_add, v.nbds)) < 0 ||
	     (r = ctl_server_add_cmd(ctl, "nbd-remove", nbds_ctl_remove, v.nbds)) < 0 ||
	     (r = ctl_server_add_cmd(ctl, "nbd-list", nbds_ctl_list, v.nbds)) < 0))
		snprintf(err, sizeof(err), "--control: %s", strerror(-r));
	if (r < 0) {
		if (!v.nbds)
			snprintf(err, sizeof(err), "cannot start the NBD server: %s", strerror(-r));
		nbds_free(v.nbds);
		vu_server_free(srv);
		metrics_http_free(mh);
		ctl_free_on_error(ctl, handover);
		goto err_loop;
	}
	v.srv = srv;
	ms.srv = srv;
	v.ctl = ctl;
	v.mh = mh;
	v.b = disk;
	v.file = &b;
	if (ctl)
		ctl_server_set_upgrade(ctl, upgrade_cb, &v);
	/* A resize (vblkctl resize) reaches the frontend as CONFIG_CHANGE_MSG. */
	if (srv)
		blk_dev_set_config_notify(v.dev, config_changed_cb, srv);
	v.gfd = gm_guard_init();
	if (v.gfd < 0 || loop_fd_add(v.loop, v.gfd, EPOLLIN, guard_cb, &v, &v.gfd_h) < 0) {
		snprintf(err, sizeof(err), "cannot set up the SIGBUS guard: %s",
			 strerror(v.gfd < 0 ? -v.gfd : errno));
		nbds_free(v.nbds);
		vu_server_free(srv);
		metrics_http_free(mh);
		ctl_free_on_error(ctl, handover);
		goto err_loop;
	}

	log_info("serving %s (%llu bytes, %u-byte blocks, %s, %s%s, %u queue%s, "
		 "%u iothread%s) on %s",
		 b.path, (unsigned long long)disk->size, b.block_size, b.engine->name,
		 b.engine->open ? "network" : b.fd < 0 ? "no file" : b.iopoll ? "O_DIRECT, polled" : b.direct ? "O_DIRECT" : "page cache", b.read_only ? ", read-only" : "",
		 ko.num_queues, ko.num_queues > 1 ? "s" : "", ko.num_iothreads,
		 ko.num_iothreads > 1 ? "s" : "", sock ? sock : "NBD only");
	/* Not an error: this may be a migration's destination, started
	 * while the source still writes (docs/architecture.md "Migration"). */
	fmt_describe(disk, &b, msg, sizeof(msg));
	log_info("format: %s", msg);
	if (bdev_lock_busy(disk))
		log_info("disk %s is being written by another process now: rings "
			 "start here once it stops (as at the end of a migration)", b.path);

	if (handover && up_child_finish(&uc, srv, err, sizeof(err)) < 0)
		cli_die("%s", err);

	notify_ready();
	r = loop_run(v.loop);

	if (v.successor) {
		/* Everything is the new process's now, the socket files and
		 * the image lock included: leave without touching any of it. */
		notify_mainpid(v.successor);
		log_info("exited: handed over to pid %d", (int)v.successor);
		fflush(NULL);
		_exit(0);
	}
	notify_stopping();
	metrics_http_free(mh);
	loop_fd_del(v.loop, v.gfd_h);
	nbds_free(v.nbds);
	vu_server_free(srv);
	log_stats(&v);
	ctl_server_free(ctl);
	blk_dev_free(v.dev);
	disk_free(v.disk);
	if (fmt_close(disk, &b) < 0)
		r = -EIO;
	if (!b.read_only && b.fd >= 0 && fdatasync(b.fd) < 0)
		log_err("final fdatasync of %s failed: %s", b.path, strerror(errno));
	bdev_close(&b);
	loop_fd_del(v.loop, v.sfd_h);
	loop_free(v.loop);
	close(v.sfd);
	log_info("exited cleanly");
	return r < 0 ? 1 : 0;

err_loop:
	blk_dev_detach(v.dev);
	if (v.sfd_h)
		loop_fd_del(v.loop, v.sfd_h);
	if (v.sfd >= 0)
		close(v.sfd);
	loop_free(v.loop);
err_dev:
	blk_dev_free(v.dev);
	disk_free(v.disk);
	fmt_close(disk, &b);
	bdev_close(&b);
	cli_die("%s", err);
}
