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
#include "disk/disk_ctl.h"
#include "backup/bkp.h"
#include "mirror/mir.h"
#include "job/job.h"
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
	struct bkp_set *bkps;		/* vblkctl backup */
	struct mir_set *mirs;		/* vblkctl mirror */
	struct job_ctl jobs;		/* vblkctl stream, vblkctl job */
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
"  --nbd ADDR[,name=NAME][,read-only][,incoming][,max-conn=N][,tls=x509:DIR|psk:FILE]\n"
"                       also serve the disk over NBD (nbdcopy, qemu-img,\n"
"                       nbdinfo, QEMU's nbd driver) on unix:PATH or HOST:PORT;\n"
"                       export name NAME (default: the empty name), at most\n"
"                       N clients at once (default %u); with tls=, clients\n"
"                       must use TLS (DIR: server-cert.pem, server-key.pem;\n"
"                       FILE: psktool's identity:hexkey lines); incoming: a\n"
"                       migration's destination, writable for the source's\n"
"                       mirror until the guest's rings start here; repeatable\n"
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
"  --bitmap-file PATH   a raw disk's persistent dirty bitmaps (vblkctl bitmap\n"
"                       add --persistent): a qcow2 file of bitmaps only, its\n"
"                       backing file the disk (default: DISK.bitmaps.qcow2)\n"
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
"  --no-sync-io         io_uring: a file on tmpfs/ramfs is read and written\n"
"                       through the ring too, not on the iothread (ablation)\n"
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
		.disk = v->disk->file->engine->open ? -1 : v->disk->file->fd,
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
	if (job_active()) {
		snprintf(msg, msglen, "a block job runs (vblkctl job list): upgrade once it has "
			 "concluded, or cancel it");
		return -EBUSY;
	}
	/* A LUKS disk's key goes over too: the new process reads no
	 * passphrase (its key file may be gone, or was standard input).
	 * A qcow2 image's tables are written back once the rings stopped
	 * and read again by the new process (fmt_quiesce, fmt_claim). */
	r = fmt_key_export(v->disk->b);
	if (r < 0 && r != -ENOENT) {
		snprintf(msg, msglen, "cannot put the disk's key where the new process can take "
			 "it: %s", strerror(-r));
		return r;
	}
	f.key = r;
	/* A mirror's pivot moved the disk to a raw or qcow2 image: the new
	 * process is told so (its fd goes over as any file's). */
	if (v->disk->file != v->file &&
	    up_set_disk(v->disk->file->path,
			fmt_kind_name(fmt_kind_of(v->disk->b))) < 0) {
		if (f.key >= 0)
			close(f.key);
		snprintf(msg, msglen, "out of memory");
		return -ENOMEM;
	}
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

/* The command line, parsed and checked (parse_args). */
struct cfg {
	struct bdev_opts bo;
	struct fmt_opts fo;
	struct loop_poll_params poll;
	struct blk_opts ko;
	/* The disk's error policy (disk_opts'). */
	enum disk_err_policy rerror, werror;
	uint64_t error_retry_ns;
	const char *sock, *ctl_path, *map_arg, *metrics_addr, *qos_group;
	const char *bitmap_file;	/* --bitmap-file */
	struct qos_limits limits;
	bool have_limits;
	unsigned qmap[BLK_MAX_QUEUES];
	int cpus[BLK_MAX_QUEUES];
	char serial[32];
	struct nbds_export_opts nbd[8];
	unsigned nnbd;
};

/* argv into *o, every value checked: a bad one ends the program with one
 * line (cli_die). */
static void parse_args(int argc, char **argv, struct cfg *o)
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
		{ "bitmap-file", required_argument, NULL, 0x101 },
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
		{ "no-sync-io", no_argument, NULL, 'u' },
		{ "no-poll-check", no_argument, NULL, 'H' },
		{ "no-packed", no_argument, NULL, 'J' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	char msg[512];
	int c, r;

	*o = (struct cfg){
		.bo = { .cache = BDEV_CACHE_AUTO },
		.poll = { .max_ns = BLK_POLL_DEFAULT_NS, .grow = 2, .shrink = 2,
			  .completion_max_ns = BLK_COMPLETION_POLL_DEFAULT_NS },
		.werror = DISK_ERR_ENOSPC,
		.ko = { .num_queues = 1,
			.irq_moderation_max_ns = BLK_IRQ_MODERATION_DEFAULT_NS },
		.fo = { .kind = FMT_AUTO },
	};
	o->ko.poll = &o->poll;
	o->fo.bo = &o->bo;
	opterr = 0;	/* our own one-line messages below */
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 's': o->sock = optarg; break;
		case 'n':
			if (o->nnbd == ARRAY_SIZE(o->nbd))
				cli_die("--nbd: at most %zu exports at start (vblkctl nbd add adds "
					"more)", ARRAY_SIZE(o->nbd));
			if (nbds_export_parse(optarg, &o->nbd[o->nnbd], msg, sizeof(msg)) < 0)
				cli_die("--nbd %s", msg);
			o->nnbd++;
			break;
		case 'd': o->bo.path = optarg; break;
		case 'q':
			o->ko.num_queues = parse_uint("--queues", optarg, 1, BLK_MAX_QUEUES);
			break;
		case 'r': o->bo.read_only = true; break;
		case 'j':
			if (fmt_parse(optarg, &o->fo.kind) < 0)
				cli_die("--format '%s' is not one of raw, qcow2, luks, auto", optarg);
			break;
		case 'R': o->fo.copy_on_read = true; break;
		case 'y': o->fo.key_file = optarg; break;
		case 0x101: o->bitmap_file = optarg; break;
		case 'Z':
			o->fo.kdf_max_ms = parse_uint("--kdf-max-ms", optarg, 1, 86400000);
			break;
		case 'm':
			o->fo.kdf_max_kib = size_arg("--kdf-max-memory", optarg) >> 10;
			if (o->fo.kdf_max_kib < 32 || o->fo.kdf_max_kib > (4ull << 20))
				cli_die("--kdf-max-memory %s: give 32K to 4G", optarg);
			break;
		case 'k':
			o->fo.l2_cache_bytes = size_arg("--l2-cache-size", optarg);
			if (o->fo.l2_cache_bytes < 4096)
				cli_die("--l2-cache-size %s: give at least 4K", optarg);
			break;
		case 'c':
			o->bo.cache = word_arg("--cache", optarg, (const char *const[]){
						    [BDEV_CACHE_AUTO] = "auto",
						    [BDEV_CACHE_NONE] = "none",
						    [BDEV_CACHE_WRITEBACK] = "writeback" });
			break;
		case 'b':
			o->bo.block_size = parse_uint("--block-size", optarg, 512, 4096);
			if (o->bo.block_size != 512 && o->bo.block_size != 4096)
				cli_die("--block-size must be 512 or 4096, not %s", optarg);
			break;
		case 'S':
			if (strlen(optarg) > 20)
				cli_die("--serial '%s' is longer than 20 bytes", optarg);
			o->ko.serial = optarg;
			break;
		case 'B': o->bo.engine = optarg; break;
		case 'F': o->bo.ceph_conf = optarg; break;
		case 'I': o->bo.ceph_id = optarg; break;
		case 'z': o->bo.size = size_arg("--size", optarg); break;
		case 'C': o->ctl_path = optarg; break;
		case 'X': o->metrics_addr = optarg; break;
		case 'T':
			o->ko.num_iothreads = parse_uint("--iothreads", optarg, 1, BLK_MAX_QUEUES);
			break;
		case 'M': o->map_arg = optarg; break;
		case 'Q': o->bo.uring_sqpoll = true; break;
		case 'U':
			o->bo.iopoll = word_arg("--iopoll", optarg, (const char *const[]){
						     [BDEV_IOPOLL_AUTO] = "auto",
						     [BDEV_IOPOLL_ON] = "on",
						     [BDEV_IOPOLL_OFF] = "off" });
			break;
		case 'A':
			o->ko.ncpus = parse_cpus(optarg, o->cpus, BLK_MAX_QUEUES);
			o->ko.cpus = o->cpus;
			break;
		case 'W':
			o->poll.completion_max_ns = parse_uint("--completion-poll-max-ns", optarg, 0,
							    1000000000);
			break;
		case 'O':
			o->ko.irq_moderation_max_ns = parse_uint("--irq-moderation-max-ns", optarg, 0,
							      1000000);
			break;
		case 'w':
			o->werror = (enum disk_err_policy)word_arg("--werror", optarg,
				(const char *const[]){ "report", "stop", "enospc" });
			break;
		case 'e':
			if (!strcmp(optarg, "report") || !strcmp(optarg, "stop"))
				o->rerror = optarg[0] == 's' ? DISK_ERR_STOP : DISK_ERR_REPORT;
			else
				cli_die("--rerror '%s' is not one of report, stop", optarg);
			break;
		case 'f':
			o->error_retry_ns = parse_uint("--error-retry-s", optarg, 0, 86400) *
					    1000000000ull;
			break;
		case 'o':
			if (qos_limits_parse(optarg, &o->limits, msg, sizeof(msg)) < 0)
				cli_die("--limit %s: %s", optarg, msg);
			o->have_limits = true;
			break;
		case 'g': o->qos_group = optarg; break;
		case 'P':
			o->poll.max_ns = parse_uint("--poll-max-ns", optarg, 0, 1000000000);
			break;
		case 'G': o->poll.grow = parse_uint("--poll-grow", optarg, 2, 1024); break;
		case 'K': o->poll.shrink = parse_uint("--poll-shrink", optarg, 0, 1024); break;
		case 'N': defer_set_batching(false); break;
		case 'H': o->poll.no_check = true; break;
		case 'E': o->ko.no_event_idx = true; break;
		case 'L': o->ko.no_early_notify = true; break;
		case 'Y': o->bo.no_early_submit = true; break;
		case 'u': o->bo.no_sync_io = true; break;
		case 'J': o->ko.no_packed = true; break;
		case 'l':
			r = log_parse_level(optarg);
			if (r < 0)
				cli_die("--log-level '%s' is not one of error, warn, info, debug",
					optarg);
			log_set_level((enum log_level)r);
			break;
		case 'h': usage(stdout); exit(0);
		case 'V': printf("vblkd %s\n", VBLKD_VERSION); exit(0);
		case ':':
			cli_die("option '%s' needs a value; see vblkd --help",
				argv[optind - 1]);
		default:
			cli_die("unknown option '%s'; see vblkd --help", argv[optind - 1]);
		}
	}
	if (optind < argc)
		cli_die("unexpected argument '%s'; see vblkd --help", argv[optind]);
	if (!o->sock && !o->nnbd)
		cli_die("missing --socket PATH (the unix socket QEMU connects to) or --nbd ADDR "
			"(an NBD export): give at least one");
	if (!o->bo.path && !(o->bo.engine && !strcmp(o->bo.engine, "null")))
		cli_die("missing --disk DISK: the image file, block device, rbd:POOL/IMAGE or "
			"nbd:// URI to serve");
	if (o->bo.size && o->bo.path)
		cli_die("--size is for the null backend without --disk; the disk has its own size");
	if (!o->bo.path && !o->bo.size)
		o->bo.size = 1ull << 30;
	if (!o->ko.num_iothreads)
		o->ko.num_iothreads = 1;
	if (o->ko.num_iothreads > o->ko.num_queues)
		cli_die("--iothreads %u is more than --queues %u: extra iothreads would have "
			"no queue", o->ko.num_iothreads, o->ko.num_queues);
	if (o->map_arg) {
		parse_queue_map(o->map_arg, o->qmap, o->ko.num_queues, o->ko.num_iothreads);
		o->ko.queue_map = o->qmap;
	}
	if (!o->ko.serial) {
		default_serial(o->bo.path ? o->bo.path : "null", o->serial, sizeof(o->serial));
		o->ko.serial = o->serial;
	}
}

/* Started by vblkctl upgrade: the old process hands us its sockets and
 * disk now, its rings once we are set up (up.h).  Returns whether this is
 * such a start. */
static bool begin_upgrade(struct cfg *o, struct up_child *uc)
{
	char err[600];
	int r = up_child_begin(uc, err, sizeof(err));

	if (r < 0)
		cli_die("%s", err);
	if (r != 1)
		return false;
	if (uc->fds.disk >= 0) {
		o->bo.take_fd = true;
		o->bo.fd = uc->fds.disk;
	}
	o->fo.handover = true;
	if (uc->fds.key >= 0) {
		o->fo.key_handed = true;
		o->fo.key_fd = uc->fds.key;
	}
	if (uc->fds.listen < 0 || !o->sock)
		cli_die("upgrade: the old vblkd handed over no vhost-user socket");
	return true;
}

/* The image, its QoS budget, the iothreads, the virtio-blk device: v's
 * file, b, disk and dev.  A failure ends the program with one line,
 * nothing left behind. */
static void start_disk(struct cfg *o, bool handover, struct vblkd *v)
{
	char err[600];
	int r;

	r = disk_open_image(&o->bo, &o->fo, o->ko.num_iothreads, v->file, &v->b, err,
			    sizeof(err));
	if (r < 0)
		cli_die("%s", err);
	/* QoS: a group's budget (joined after the disk opened, so a bad
	 * disk leaves no group behind), or the disk's own.  Upgraded in
	 * place, a member takes the group's limits as they are now. */
	if (o->qos_group) {
		r = qos_group_join(o->qos_group, NULL,
				   handover || !o->have_limits ? NULL : &o->limits, &o->ko.qos, err,
				   sizeof(err));
	} else if (o->have_limits && (r = qos_new(&o->limits, &o->ko.qos)) < 0) {
		snprintf(err, sizeof(err), "cannot set up the QoS limits: %s", strerror(-r));
	}
	if (r < 0)
		goto err_image;
	/* The disk owns the budget from here, also on failure. */
	r = disk_new(v->b, &(struct disk_opts){ .num_iothreads = o->ko.num_iothreads,
						  .cpus = o->ko.cpus, .ncpus = o->ko.ncpus,
						  .poll = o->ko.poll, .qos = o->ko.qos,
						  .rerror = o->rerror, .werror = o->werror,
						  .error_retry_ns = o->error_retry_ns,
						  .bitmap_file = o->bitmap_file,
						  .file = v->file }, &v->disk);
	o->ko.qos = NULL;
	if (r < 0) {
		snprintf(err, sizeof(err), "cannot start the iothreads: %s", strerror(-r));
		goto err_image;
	}
	/* Persistent bitmaps the image holds (an upgrade's new process reads
	 * them at its claim). */
	if ((r = disk_bitmaps_open(v->disk, handover, err, sizeof(err))) < 0) {
		disk_free(v->disk);
		goto err_image;
	}
	r = blk_dev_new_on(v->disk, &o->ko, &v->dev);
	if (r < 0) {
		disk_free(v->disk);
		snprintf(err, sizeof(err), "cannot start the device: %s", strerror(-r));
		goto err_image;
	}
	if (o->have_limits || o->qos_group) {
		struct qos_limits l;

		qos_get(blk_dev_qos(v->dev), &l, NULL, sys_now_ns());
		qos_limits_format(&l, err, sizeof(err));
		log_info("QoS limits%s%s: %s", o->qos_group ? " of group " : "",
			 o->qos_group ? o->qos_group : "", err[0] ? err : "none");
	}
	v->num_queues = o->ko.num_queues;
	return;

err_image:
	disk_close_image(v->b, v->file);
	cli_die("%s", err);
}

/* The control socket's commands of the subsystems beside ctl's own: the
 * NBD exports, block jobs, dirty bitmaps.  0 or -errno. */
static int add_commands(struct vblkd *v)
{
	const struct {
		const char *name;
		ctl_cmd_fn fn;
		void *opaque;
	} cmds[] = {
		{ "nbd-add", nbds_ctl_add, v->nbds },
		{ "nbd-remove", nbds_ctl_remove, v->nbds },
		{ "nbd-list", nbds_ctl_list, v->nbds },
		{ "stream", job_ctl_stream, &v->jobs },
		{ "job-list", job_ctl_list, &v->jobs },
		{ "job-pause", job_ctl_verb, &v->jobs },
		{ "job-resume", job_ctl_verb, &v->jobs },
		{ "job-cancel", job_ctl_verb, &v->jobs },
		{ "job-complete", job_ctl_verb, &v->jobs },
		{ "job-set-rate", job_ctl_verb, &v->jobs },
		{ "job-dismiss", job_ctl_verb, &v->jobs },
		{ "bitmap-add", disk_ctl_bitmap, v->disk },
		{ "bitmap-remove", disk_ctl_bitmap, v->disk },
		{ "bitmap-clear", disk_ctl_bitmap, v->disk },
		{ "bitmap-enable", disk_ctl_bitmap, v->disk },
		{ "bitmap-disable", disk_ctl_bitmap, v->disk },
		{ "bitmap-merge", disk_ctl_bitmap, v->disk },
		{ "bitmap-list", disk_ctl_bitmap_list, v->disk },
		{ "backup-start", bkp_ctl, v->bkps },
		{ "backup-finish", bkp_ctl, v->bkps },
		{ "backup-abort", bkp_ctl, v->bkps },
		{ "backup-list", bkp_ctl, v->bkps },
		{ "mirror-start", mir_ctl, v->mirs },
		{ "mirror-list", mir_ctl, v->mirs },
		{ "mirror-change", mir_ctl, v->mirs },
	};
	int r = 0;

	for (unsigned i = 0; r == 0 && i < ARRAY_SIZE(cmds); i++)
		r = ctl_server_add_cmd(v->ctl, cmds[i].name, cmds[i].fn, cmds[i].opaque);
	return r;
}

/* The main loop and what runs on it: signals, the pause watch, the
 * control socket, metrics, the vhost-user server, the NBD exports, the
 * SIGBUS guard.  0, or -1 with one line in err and all of it undone. */
static int start_services(struct cfg *o, struct vblkd *v, struct up_child *uc, bool handover,
			  const sigset_t *mask, char *err, size_t errlen)
{
	static struct metrics_source ms;
	char msg[512];
	int r;

	r = loop_new("main", &v->loop);
	if (r < 0) {
		snprintf(err, errlen, "cannot start the main loop: %s", strerror(-r));
		return -1;
	}
	r = disk_attach(v->disk, v->loop);
	if (r < 0) {
		snprintf(err, errlen, "cannot watch the device's pauses: %s", strerror(-r));
		goto err_loop;
	}
	v->sfd = signalfd(-1, mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (v->sfd < 0 || loop_fd_add(v->loop, v->sfd, EPOLLIN, signal_cb, v, &v->sfd_h) < 0) {
		snprintf(err, errlen, "cannot set up signal handling: %s", strerror(errno));
		goto err_loop;
	}
	/* Metrics (vblkctl metrics, --metrics) read what ctl's stats read,
	 * on this thread; the frontend counters once srv exists. */
	metrics_source_init(&ms, v->dev, &v->disk->b);
	if (o->ctl_path) {
		r = ctl_server_new_fd(o->ctl_path, uc->fds.control, v->loop, v->dev, &v->ctl, msg,
				      sizeof(msg));
		if (r < 0) {
			snprintf(err, errlen, "--control: %s", msg);
			goto err_loop;
		}
		uc->fds.control = -1;
		r = ctl_server_add_cmd(v->ctl, "metrics", metrics_ctl_cmd, &ms);
		if (r < 0) {
			snprintf(err, errlen, "--control: %s", strerror(-r));
			goto err_ctl;
		}
	}
	if (o->metrics_addr) {
		/* Upgraded in place: the old process's listener, no gap. */
		r = metrics_http_new(o->metrics_addr, uc->fds.metrics, v->loop, &ms, &v->mh, msg,
				     sizeof(msg));
		if (r < 0) {
			snprintf(err, errlen, "--metrics %s", msg);
			goto err_ctl;
		}
		uc->fds.metrics = -1;
		log_info("metrics at http://%s/metrics (port %u)", o->metrics_addr,
			 metrics_http_port(v->mh));
	}
	sys_close(&uc->fds.control);
	sys_close(&uc->fds.metrics);
	r = o->sock ? vu_server_new_fd(o->sock, uc->fds.listen, v->loop, &blk_vu_ops, v->dev,
				       &v->srv, msg, sizeof(msg)) : 0;
	if (r < 0) {
		snprintf(err, errlen, "--socket: %s", msg);
		goto err_metrics;
	}
	ms.srv = v->srv;
	r = nbds_new(v->disk, v->loop, &v->nbds);
	if (r < 0)
		snprintf(err, errlen, "cannot start the NBD server: %s", strerror(-r));
	for (unsigned i = 0; r == 0 && i < o->nnbd; i++)
		if ((r = nbds_add(v->nbds, &o->nbd[i], msg, sizeof(msg))) < 0)
			snprintf(err, errlen, "--nbd %s", msg);
	if (r == 0 && (r = bkp_set_new(v->disk, v->nbds, v->loop, &v->bkps)) < 0)
		snprintf(err, errlen, "cannot set up backups: %s", strerror(-r));
	if (r == 0 && (r = mir_set_new(v->disk, v->loop, &v->mirs)) < 0)
		snprintf(err, errlen, "cannot set up mirrors: %s", strerror(-r));
	/* Jobs stop or report on an I/O error as the guest's writes do. */
	v->jobs = (struct job_ctl){ .disk = v->disk,
				    .on_error = o->werror == DISK_ERR_STOP ? JOB_ERR_STOP :
						o->werror == DISK_ERR_ENOSPC ? JOB_ERR_ENOSPC :
						JOB_ERR_REPORT };
	if (r == 0 && v->ctl && (r = add_commands(v)) < 0)
		snprintf(err, errlen, "--control: %s", strerror(-r));
	if (r < 0)
		goto err_nbd;
	ms.nbds = v->nbds;
	ms.bkps = v->bkps;
	ms.mirs = v->mirs;
	if (v->ctl)
		ctl_server_set_upgrade(v->ctl, upgrade_cb, v);
	/* A resize (vblkctl resize) reaches the frontend as CONFIG_CHANGE_MSG. */
	if (v->srv)
		blk_dev_set_config_notify(v->dev, config_changed_cb, v->srv);
	v->gfd = gm_guard_init();
	if (v->gfd < 0 || loop_fd_add(v->loop, v->gfd, EPOLLIN, guard_cb, v, &v->gfd_h) < 0) {
		snprintf(err, errlen, "cannot set up the SIGBUS guard: %s",
			 strerror(v->gfd < 0 ? -v->gfd : errno));
		goto err_nbd;
	}
	return 0;

err_nbd:
	mir_set_free(v->mirs);
	v->mirs = NULL;
	bkp_set_free(v->bkps);
	v->bkps = NULL;
	nbds_free(v->nbds);
	v->nbds = NULL;
	vu_server_free(v->srv);
	v->srv = NULL;
err_metrics:
	metrics_http_free(v->mh);
	v->mh = NULL;
err_ctl:
	if (v->ctl)
		ctl_free_on_error(v->ctl, handover);
	v->ctl = NULL;
err_loop:
	disk_detach(v->disk);
	if (v->sfd_h)
		loop_fd_del(v->loop, v->sfd_h);
	if (v->sfd >= 0)
		close(v->sfd);
	loop_free(v->loop);
	return -1;
}

/* One line for the start-up log: what is served, how, where. */
static void log_serving(const struct cfg *o, const struct vblkd *v)
{
	const struct bdev *b = v->file;
	char msg[512];

	log_info("serving %s (%llu bytes, %u-byte blocks, %s, %s%s, %u queue%s, "
		 "%u iothread%s) on %s",
		 b->path, (unsigned long long)v->b->size, b->block_size, b->engine->name,
		 b->engine->open ? "network" : b->fd < 0 ? "no file" : b->iopoll ?
		 "O_DIRECT, polled" : b->direct ? "O_DIRECT" : "page cache",
		 b->read_only ? ", read-only" : "", o->ko.num_queues,
		 o->ko.num_queues > 1 ? "s" : "", o->ko.num_iothreads,
		 o->ko.num_iothreads > 1 ? "s" : "", o->sock ? o->sock : "NBD only");
	fmt_describe(v->b, v->file, msg, sizeof(msg));
	log_info("format: %s", msg);
	/* Not an error: this may be a migration's destination, started
	 * while the source still writes (docs/architecture.md "Migration"). */
	if (bdev_lock_busy(v->b))
		log_info("disk %s is being written by another process now: rings "
			 "start here once it stops (as at the end of a migration)", b->path);
}

/* After the main loop: everything down in the reverse order of start,
 * in-flight I/O finished, the image's tables written back.  0, or -EIO
 * if they could not be. */
static int stop_all(struct vblkd *v)
{
	int r;

	notify_stopping();
	metrics_http_free(v->mh);
	loop_fd_del(v->loop, v->gfd_h);
	/* A backup's view goes before the server; its bitmap as it was. */
	bkp_set_free(v->bkps);
	mir_set_free(v->mirs);
	nbds_free(v->nbds);
	vu_server_free(v->srv);
	log_stats(v);
	ctl_server_free(v->ctl);
	blk_dev_free(v->dev);
	job_free_all(v->disk);
	/* A mirror's pivot may have replaced the image (disk.h); its file's
	 * struct is the mirror's allocation, ours to free. */
	struct bdev *b = v->disk->b, *file = v->disk->file;
	bool heap = file->heap;

	disk_free(v->disk);
	r = disk_close_image(b, file);
	if (heap)
		free(file);
	loop_fd_del(v->loop, v->sfd_h);
	loop_free(v->loop);
	close(v->sfd);
	log_info("exited cleanly");
	return r;
}

int main(int argc, char **argv)
{
	static struct cfg o;
	static struct bdev file;
	struct vblkd v = { .sfd = -1, .gfd = -1, .file = &file };
	struct up_child uc;
	char err[600];
	bool handover;
	sigset_t mask;
	int r;

	up_init(argv);
	parse_args(argc, argv, &o);
	/* Signals go to the main loop only: block them before any thread
	 * starts so iothreads inherit the mask. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);

	handover = begin_upgrade(&o, &uc);
	start_disk(&o, handover, &v);
	if (start_services(&o, &v, &uc, handover, &mask, err, sizeof(err)) < 0) {
		blk_dev_free(v.dev);
		disk_free(v.disk);
		disk_close_image(v.b, v.file);
		cli_die("%s", err);
	}
	for (unsigned i = 0; i < o.nnbd; i++)
		nbds_export_opts_free(&o.nbd[i]);
	log_serving(&o, &v);
	if (handover && up_child_finish(&uc, v.srv, err, sizeof(err)) < 0)
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
	return stop_all(&v) < 0 || r < 0 ? 1 : 0;
}
