/*
 * vblkctl: talk to a running vblkd over its control socket.
 *
 *   vblkctl --control PATH stats
 *   vblkctl --control PATH status | resume    (the error policy's pause)
 *   vblkctl --control PATH set-poll [--poll-max-ns N] [--completion-poll-max-ns N]
 *                                   [--poll-grow N] [--poll-shrink N] [--poll-check on|off]
 *   vblkctl --control PATH resize SIZE      (bytes, or with K/M/G/T)
 *   vblkctl --control PATH metrics          (Prometheus text format)
 *   vblkctl --control PATH upgrade [--exec BINARY]
 *   vblkctl --control PATH iostat [--interval S] [--count N] [--json]
 *
 * Prints the daemon's JSON reply (metrics: the text it carries; iostat: a
 * line per interval, iostat.c); exit 1 on an error reply or no daemon.
 */
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/cli.h"
#include "util/parse.h"
#include "vblkctl/vctl.h"

const char cli_name[] = "vblkctl";

static const char *num(const char *opt, const char *s)
{
	char *end;

	errno = 0;
	(void)strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-')
		cli_die("%s '%s' is not a number", opt, s);
	return s;
}

/* --interval: seconds, fractions allowed, > 0 (at most a day). */
static double seconds(const char *opt, const char *s)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v <= 0 || v > 86400)
		cli_die("%s '%s' is not a number of seconds > 0 (at most 86400; e.g. 1 or 0.5)",
			opt, s);
	return v;
}

/* Add key: the number in s (checked by num()) to req. */
static void add_num(struct json_object *req, const char *key, const char *s)
{
	json_object_object_add(req, key, json_object_new_uint64(strtoull(s, NULL, 10)));
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "control", required_argument, NULL, 'c' },
		{ "poll-max-ns", required_argument, NULL, 'm' },
		{ "completion-poll-max-ns", required_argument, NULL, 'C' },
		{ "poll-grow", required_argument, NULL, 'g' },
		{ "poll-shrink", required_argument, NULL, 's' },
		{ "poll-check", required_argument, NULL, 'P' },
		{ "exec", required_argument, NULL, 'e' },
		{ "interval", required_argument, NULL, 'i' },
		{ "count", required_argument, NULL, 'n' },
		{ "json", no_argument, NULL, 'j' },
		{ "group", no_argument, NULL, 'G' },
		{ "rate", required_argument, NULL, 'r' },
		{ "granularity", required_argument, NULL, 'R' },
		{ "disabled", no_argument, NULL, 'D' },
		{ "persistent", no_argument, NULL, 'T' },
		{ "nbd", required_argument, NULL, 'N' },
		{ "bitmap", required_argument, NULL, 'B' },
		{ "scratch", required_argument, NULL, 'S' },
		{ "target", required_argument, NULL, 'X' },
		{ "mode", required_argument, NULL, 'M' },
		{ "format", required_argument, NULL, 'F' },
		{ "no-yield", no_argument, NULL, 'Y' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static const char commands[] =
		"stats, status, resume, set-poll, resize SIZE, limits, set-limits LIMITS, metrics, "
		"stream, job list|pause|resume|cancel|complete|set-rate|dismiss, "
		"bitmap add|remove|clear|enable|disable|merge|list, backup start|finish|abort|list, "
		"mirror start|change|list, "
		"nbd add|remove|list, upgrade or iostat";
	const char *path = NULL, *max = NULL, *cmax = NULL, *grow = NULL, *shrink = NULL, *cmd;
	const char *exec = NULL, *count = NULL, *rate = NULL, *check = NULL, *gran = NULL;
	bool disabled = false, persistent = false, no_yield = false;
	const char *bk_nbd = NULL, *bk_bitmap = NULL, *bk_scratch = NULL, *target = NULL;
	const char *mode = NULL, *format = NULL;
	char exec_abs[PATH_MAX], err[512];
	int wait_ms = 5000;
	struct json_object *req, *rep, *v;
	double interval = 0;
	bool json = false, group = false;
	char *reply;
	uint64_t size;
	int c, rc;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
		switch (c) {
		case 'c': path = optarg; break;
		case 'm': max = num("--poll-max-ns", optarg); break;
		case 'C': cmax = num("--completion-poll-max-ns", optarg); break;
		case 'g': grow = num("--poll-grow", optarg); break;
		case 's': shrink = num("--poll-shrink", optarg); break;
		case 'P':
			if (strcmp(optarg, "on") && strcmp(optarg, "off"))
				cli_die("--poll-check '%s' must be on or off", optarg);
			check = optarg;
			break;
		case 'e': exec = optarg; break;
		case 'i': interval = seconds("--interval", optarg); break;
		case 'n': count = num("--count", optarg); break;
		case 'j': json = true; break;
		case 'G': group = true; break;
		case 'r': rate = optarg; break;
		case 'R': gran = optarg; break;
		case 'D': disabled = true; break;
		case 'T': persistent = true; break;
		case 'Y': no_yield = true; break;
		case 'F':
			if (strcmp(optarg, "raw") && strcmp(optarg, "qcow2"))
				cli_die("--format '%s': give raw or qcow2", optarg);
			format = optarg;
			break;
		case 'N': bk_nbd = optarg; break;
		case 'B': bk_bitmap = optarg; break;
		case 'S': bk_scratch = optarg; break;
		case 'X': target = optarg; break;
		case 'M':
			if (strcmp(optarg, "background") && strcmp(optarg, "write-blocking"))
				cli_die("--mode '%s': give background or write-blocking", optarg);
			mode = optarg;
			break;
		case 'h':
			printf("Usage: vblkctl --control PATH stats\n"
			       "       vblkctl --control PATH set-poll [--poll-max-ns N] "
			       "[--completion-poll-max-ns N] [--poll-grow N] [--poll-shrink N]\n"
			       "                [--poll-check on|off]\n"
			       "       vblkctl --control PATH status\n"
			       "       vblkctl --control PATH resume\n"
			       "       vblkctl --control PATH resize SIZE\n"
			       "       vblkctl --control PATH limits\n"
			       "       vblkctl --control PATH set-limits LIMITS [--group]\n"
			       "       vblkctl --control PATH metrics\n"
			       "       vblkctl --control PATH stream [--rate BYTES]\n"
			       "       vblkctl --control PATH job list\n"
			       "       vblkctl --control PATH job pause|resume|cancel|complete|dismiss ID\n"
			       "       vblkctl --control PATH job set-rate ID BYTES\n"
			       "       vblkctl --control PATH bitmap add NAME [--granularity BYTES] "
			       "[--disabled] [--persistent]\n"
			       "       vblkctl --control PATH bitmap remove|clear|enable|disable NAME\n"
			       "       vblkctl --control PATH bitmap merge SOURCE... TARGET\n"
			       "       vblkctl --control PATH bitmap list\n"
			       "       vblkctl --control PATH backup start NAME --nbd ADDR[,tls=...] "
			       "[--bitmap B] [--scratch DIR] [--rate BYTES] [--no-yield]\n"
			       "       vblkctl --control PATH backup finish|abort NAME\n"
			       "       vblkctl --control PATH backup list\n"
			       "       vblkctl --control PATH mirror start NAME --target URI|PATH "
			       "[--format raw|qcow2] [--mode background|write-blocking] [--rate BYTES] "
			       "[--granularity BYTES] [--no-yield]\n"
			       "       vblkctl --control PATH mirror change NAME --mode background|write-blocking\n"
			       "       vblkctl --control PATH mirror list\n"
			       "       vblkctl --control PATH nbd add ADDR[,name=NAME][,read-only]"
			       "[,max-conn=N][,tls=x509:DIR|psk:FILE]\n"
			       "       vblkctl --control PATH nbd remove NAME\n"
			       "       vblkctl --control PATH nbd list\n"
			       "       vblkctl --control PATH upgrade [--exec BINARY]\n"
			       "       vblkctl --control PATH iostat [--interval S] [--count N] "
			       "[--json]\n"
			       "\n"
			       "set-poll changes polling at once, as vblkd's options of the same names\n"
			       "do at start (--poll-check off: --no-poll-check).\n"
			       "status says whether the disk runs or is paused (the error policy,\n"
			       "vblkd --werror/--rerror: a failed request held), why and since when;\n"
			       "resume submits the held requests again and takes new ones (one that\n"
			       "fails again pauses the disk again).\n"
			       "resize grows the disk under the running guest to SIZE bytes (K, M, G, T:\n"
			       "binary units): a file is extended; a block device or RBD image must have\n"
			       "grown first (lvextend, rbd resize).  The guest is told at once.\n"
			       "limits shows the QoS limits (vblkd --limit) and how full each bucket is;\n"
			       "set-limits changes them at once, no pause (the --limit syntax, e.g.\n"
			       "iops-total=1000,bps-total=100M; keys not named stay, 0 removes one;\n"
			       "--group: for every vblkd of the disk's --qos-group).\n"
			       "metrics prints the counters in the Prometheus text format (what vblkd\n"
			       "--metrics serves over HTTP), e.g. for promtool or a textfile collector.\n"
			       "stream copies everything a qcow2 disk's backing chain still provides into\n"
			       "the image, in the background while the guest runs (at most --rate bytes\n"
			       "per second, K/M/G: e.g. 50M), then rewrites its header without the backing\n"
			       "file: the image stands alone.  It runs as a block job (stream-N).\n"
			       "job list shows the block jobs (id, type, state: created, running, paused,\n"
			       "ready, concluded; bytes done of total, rate, errors); pause and resume\n"
			       "one, cancel it, complete a ready one (a mirror), change its rate at once\n"
			       "(set-rate, K/M/G; 0: no limit), dismiss a concluded one from the list.\n"
			       "bitmap add starts a dirty bitmap: every write, discard or write zeroes\n"
			       "of the guest or an NBD client from then on marks the chunks it touches\n"
			       "(--granularity, a power of two from 4K to 2G, default 64K); an NBD client\n"
			       "reads it as the meta context qemu:dirty-bitmap:NAME.  clear empties it,\n"
			       "disable stops marking (enable again), merge ORs sources into TARGET,\n"
			       "list shows each with its dirty bytes.  --persistent keeps it in the\n"
			       "image (a qcow2 image's own bitmaps, as QEMU's): stored whenever the\n"
			       "disk is let go, loaded at the next start, kept across a crash;\n"
			       "others live in memory.\n"
			       "backup start serves the disk as it is now (a point-in-time view) read-only\n"
			       "over NBD on --nbd ADDR, export name NAME, while the guest writes on: the\n"
			       "old data of what the guest changes is kept first in a scratch file in\n"
			       "--scratch DIR (default: the disk's directory).  With --bitmap B the view\n"
			       "has qemu:dirty-bitmap:B, B as of now: an incremental backup reads only\n"
			       "what it marks.  finish: the client has it all; B from then on holds what\n"
			       "was written since the start (the next incremental's).  abort: B as it\n"
			       "was.  list shows each with its scratch use.  A backup is a job (job list).\n"
			       "--rate 200M caps how fast its clients read the view (job set-rate changes\n"
			       "it), leaving the guest's writes the daemon's time.  While the guest\n"
			       "writes, the view's clients get a small share of the iothread (all of it\n"
			       "when the guest is quiet); --no-yield serves them as any NBD client.\n"
			       "mirror start copies the disk to --target (an NBD URI, or a local path:\n"
			       "an image made at the disk's size, --format raw or qcow2, by default the\n"
			       "disk's own; one already there is used as it is) while the guest\n"
			       "writes, pass after pass, until it is ready (job list); job complete then\n"
			       "ends it with the target holding the disk (a local target becomes the\n"
			       "disk served: the pivot), job cancel leaves the target as it is.  --mode\n"
			       "write-blocking: a guest write completes once it is on the target too (the\n"
			       "mirror stays converged whatever the write rate); mirror change switches\n"
			       "a running mirror's mode.  A ready background mirror gives a busy guest\n"
			       "most of the iothread (what it writes is copied later, in longer runs;\n"
			       "dirty_bytes in mirror list is how far behind the target is);\n"
			       "--no-yield copies as fast as it can.\n"
			       "nbd add serves the disk over NBD on one more address (the fields of\n"
			       "vblkd --nbd); nbd remove stops the export NAME ('' for the default name),\n"
			       "its clients disconnected once their requests are done; nbd list shows\n"
			       "the exports, their clients and the server's counters.\n"
			       "\n"
			       "upgrade replaces the running vblkd with a new process of BINARY (default:\n"
			       "the file it was started from, e.g. after a package upgrade) with the same\n"
			       "options, handing it the guest's connection, rings and disk: the VM sees a\n"
			       "pause of milliseconds, no disconnect.  If the new one fails, the old one\n"
			       "serves on.  Prints the new process's pid.\n"
			       "\n"
			       "iostat prints what the disk did every S seconds (default 1; fractions\n"
			       "allowed), like iostat -x: r/s w/s rMB/s wMB/s r_await w_await (ms) aqu-sz\n"
			       "%%util p99 (ms, reads and writes) f/s d/s (flushes, discards); N lines\n"
			       "(default: until interrupted), or one JSON object per line with --json.\n");
			return 0;
		case ':': cli_die("option '%s' needs a value", argv[optind - 1]);
		default: cli_die("unknown option '%s'; see vblkctl --help", argv[optind - 1]);
		}
	}
	if (!path)
		cli_die("missing --control PATH: the socket given to vblkd --control");
	if (optind >= argc)
		cli_die("give one command: %s", commands);
	cmd = argv[optind];
	if (!strcmp(cmd, "job")) {
		const char *sub = optind + 1 < argc ? argv[optind + 1] : "";
		int n = argc - optind;

		if (!((!strcmp(sub, "list") && n == 2) ||
		      ((!strcmp(sub, "pause") || !strcmp(sub, "resume") || !strcmp(sub, "cancel") ||
			!strcmp(sub, "complete") || !strcmp(sub, "dismiss")) && n == 3) ||
		      (!strcmp(sub, "set-rate") && n == 4)))
			cli_die("job takes: list, pause ID, resume ID, cancel ID, complete ID, "
				"dismiss ID, or set-rate ID BYTES");
	} else if (!strcmp(cmd, "bitmap")) {
		const char *sub = optind + 1 < argc ? argv[optind + 1] : "";
		int n = argc - optind;

		if (!((!strcmp(sub, "list") && n == 2) ||
		      ((!strcmp(sub, "add") || !strcmp(sub, "remove") || !strcmp(sub, "clear") ||
			!strcmp(sub, "enable") || !strcmp(sub, "disable")) && n == 3) ||
		      (!strcmp(sub, "merge") && n >= 4)))
			cli_die("bitmap takes: add NAME, remove NAME, clear NAME, enable NAME, "
				"disable NAME, merge SOURCE... TARGET, or list");
		if (strcmp(sub, "add") && (gran || disabled || persistent))
			cli_die("--granularity, --disabled and --persistent go with bitmap add");
	} else if (gran && strcmp(cmd, "mirror")) {
		cli_die("--granularity goes with bitmap add and mirror start");
	} else if (!strcmp(cmd, "backup")) {
		const char *sub = optind + 1 < argc ? argv[optind + 1] : "";
		int n = argc - optind;

		if (!((!strcmp(sub, "list") && n == 2) ||
		      ((!strcmp(sub, "start") || !strcmp(sub, "finish") || !strcmp(sub, "abort")) &&
		       n == 3)))
			cli_die("backup takes: start NAME --nbd ADDR [--bitmap B] [--scratch DIR], "
				"finish NAME, abort NAME, or list");
		if (!strcmp(sub, "start") && !bk_nbd)
			cli_die("backup start needs --nbd ADDR (unix:PATH or HOST:PORT): where its "
				"view is served");
		if (strcmp(sub, "start") && (bk_nbd || bk_bitmap || bk_scratch || rate || no_yield))
			cli_die("--nbd, --bitmap, --scratch, --rate and --no-yield go with backup "
				"start");
	} else if (!strcmp(cmd, "mirror")) {
		const char *sub = optind + 1 < argc ? argv[optind + 1] : "";
		int n = argc - optind;

		if (!((!strcmp(sub, "list") && n == 2) ||
		      ((!strcmp(sub, "start") || !strcmp(sub, "change")) && n == 3)))
			cli_die("mirror takes: start NAME --target URI|PATH [--mode MODE] [--rate "
				"BYTES] [--granularity BYTES] [--no-yield], change NAME --mode MODE, "
				"or list");
		if (!strcmp(sub, "start") && !target)
			cli_die("mirror start needs --target: an NBD URI (nbd://HOST/EXPORT, "
				"nbd+unix:///EXPORT?socket=PATH) or a local path");
		if (!strcmp(sub, "change") && !mode)
			cli_die("mirror change needs --mode background|write-blocking");
		if (strcmp(sub, "start") && (target || rate || gran || format || no_yield))
			cli_die("--target, --format, --rate, --granularity and --no-yield go with "
				"mirror start");
		if (!strcmp(sub, "list") && mode)
			cli_die("--mode goes with mirror start and mirror change");
	} else if (!strcmp(cmd, "nbd")) {
		const char *sub = optind + 1 < argc ? argv[optind + 1] : "";

		if (!((!strcmp(sub, "list") && optind + 2 == argc) ||
		      ((!strcmp(sub, "add") || !strcmp(sub, "remove")) && optind + 3 == argc)))
			cli_die("nbd takes: add ADDR[,name=NAME][,...], remove NAME, or list");
	} else if (optind + 1 != argc &&
		   !(optind + 2 == argc && (!strcmp(cmd, "resize") || !strcmp(cmd, "set-limits")))) {
		cli_die("give one command: %s", commands);
	}
	if (strcmp(cmd, "backup") && (bk_nbd || bk_bitmap || bk_scratch))
		cli_die("--nbd, --bitmap and --scratch go with backup start");
	if (strcmp(cmd, "backup") && strcmp(cmd, "mirror") && no_yield)
		cli_die("--no-yield goes with backup start and mirror start");
	if (strcmp(cmd, "set-limits") && group)
		cli_die("--group goes with set-limits");
	if (strcmp(cmd, "set-poll") && (max || cmax || grow || shrink || check))
		cli_die("--poll-* options go with set-poll");
	if (strcmp(cmd, "upgrade") && exec)
		cli_die("--exec goes with upgrade");
	if (strcmp(cmd, "stream") && strcmp(cmd, "mirror") && strcmp(cmd, "backup") && rate)
		cli_die("--rate goes with stream, mirror start and backup start");
	if (strcmp(cmd, "mirror") && target)
		cli_die("--target goes with mirror start");
	if (strcmp(cmd, "mirror") && mode)
		cli_die("--mode goes with mirror start and mirror change");
	if (strcmp(cmd, "iostat") && (interval || count || json))
		cli_die("--interval, --count and --json go with iostat");
	if (!strcmp(cmd, "iostat")) {
		unsigned long n = count ? strtoul(count, NULL, 10) : 0;

		if (count && (n == 0 || n > UINT32_MAX))
			cli_die("--count '%s' must be 1..%u", count, UINT32_MAX);
		return vctl_iostat(path, interval ? interval : 1.0, n, json);
	}
	req = json_object_new_object();
	if (!req)
		cli_die("out of memory");
	if (!strcmp(cmd, "resize")) {
		if (optind + 2 != argc)
			cli_die("resize needs a SIZE: bytes, or with K, M, G or T (e.g. 20G)");
		if (parse_size(argv[optind + 1], &size) < 0)
			cli_die("resize: '%s' is not a size: give bytes, or with K, M, G or T "
				"(e.g. 20G)", argv[optind + 1]);
		json_object_object_add(req, "cmd", json_object_new_string("resize"));
		json_object_object_add(req, "size", json_object_new_uint64(size));
	} else if (!strcmp(cmd, "stream")) {
		json_object_object_add(req, "cmd", json_object_new_string("stream"));
		if (rate) {
			if (parse_size(rate, &size) < 0 || size == 0)
				cli_die("--rate '%s' is not a rate: bytes per second, or with K, M or "
					"G (e.g. 50M)", rate);
			json_object_object_add(req, "rate", json_object_new_uint64(size));
		}
	} else if (!strcmp(cmd, "set-limits")) {
		if (optind + 2 != argc)
			cli_die("set-limits needs LIMITS, e.g. iops-total=1000 (0 removes a limit)");
		json_object_object_add(req, "cmd", json_object_new_string("set-limits"));
		json_object_object_add(req, "limits", json_object_new_string(argv[optind + 1]));
		if (group)
			json_object_object_add(req, "group", json_object_new_boolean(1));
	} else if (!strcmp(cmd, "stats") || !strcmp(cmd, "metrics") || !strcmp(cmd, "status") ||
		   !strcmp(cmd, "resume") || !strcmp(cmd, "limits")) {
		json_object_object_add(req, "cmd", json_object_new_string(cmd));
	} else if (!strcmp(cmd, "set-poll")) {
		json_object_object_add(req, "cmd", json_object_new_string("set-poll"));
		if (max)
			add_num(req, "max_ns", max);
		if (cmax)
			add_num(req, "completion_max_ns", cmax);
		if (grow)
			add_num(req, "grow", grow);
		if (shrink)
			add_num(req, "shrink", shrink);
		if (check)
			json_object_object_add(req, "check",
					       json_object_new_boolean(!strcmp(check, "on")));
	} else if (!strcmp(cmd, "job")) {
		const char *sub = argv[optind + 1];
		char name[32];

		snprintf(name, sizeof(name), "job-%s", sub);
		json_object_object_add(req, "cmd", json_object_new_string(name));
		if (strcmp(sub, "list"))
			json_object_object_add(req, "id", json_object_new_string(argv[optind + 2]));
		if (!strcmp(sub, "set-rate")) {
			if (parse_size(argv[optind + 3], &size) < 0)
				cli_die("set-rate: '%s' is not a rate: bytes per second, or with K, M "
					"or G (e.g. 50M; 0: no limit)", argv[optind + 3]);
			json_object_object_add(req, "rate", json_object_new_uint64(size));
		}
	} else if (!strcmp(cmd, "bitmap")) {
		const char *sub = argv[optind + 1];
		char name[32];

		snprintf(name, sizeof(name), "bitmap-%s", sub);
		json_object_object_add(req, "cmd", json_object_new_string(name));
		if (!strcmp(sub, "merge")) {
			struct json_object *arr = json_object_new_array();

			for (int i = optind + 2; i < argc - 1; i++)
				json_object_array_add(arr, json_object_new_string(argv[i]));
			json_object_object_add(req, "sources", arr);
			json_object_object_add(req, "target", json_object_new_string(argv[argc - 1]));
		} else if (strcmp(sub, "list")) {
			json_object_object_add(req, "name", json_object_new_string(argv[optind + 2]));
		}
		if (gran) {
			if (parse_size(gran, &size) < 0 || size == 0 || size > UINT32_MAX)
				cli_die("--granularity '%s' is not a size: bytes, or with K, M or G "
					"(e.g. 64K)", gran);
			json_object_object_add(req, "granularity", json_object_new_uint64(size));
		}
		if (disabled)
			json_object_object_add(req, "disabled", json_object_new_boolean(1));
		if (persistent)
			json_object_object_add(req, "persistent", json_object_new_boolean(1));
	} else if (!strcmp(cmd, "backup")) {
		const char *sub = argv[optind + 1];
		char name[32];

		snprintf(name, sizeof(name), "backup-%s", sub);
		json_object_object_add(req, "cmd", json_object_new_string(name));
		if (strcmp(sub, "list"))
			json_object_object_add(req, "name", json_object_new_string(argv[optind + 2]));
		if (bk_nbd)
			json_object_object_add(req, "nbd", json_object_new_string(bk_nbd));
		if (bk_bitmap)
			json_object_object_add(req, "bitmap", json_object_new_string(bk_bitmap));
		if (bk_scratch) {
			char abs[PATH_MAX];

			/* The daemon's directory is not ours. */
			if (!realpath(bk_scratch, abs))
				cli_die("--scratch '%s': %s (give a directory on local storage)",
					bk_scratch, strerror(errno));
			json_object_object_add(req, "scratch", json_object_new_string(abs));
		}
		if (rate) {
			if (parse_size(rate, &size) < 0)
				cli_die("--rate '%s' is not a rate: bytes per second, or with K, M "
					"or G (e.g. 200M)", rate);
			json_object_object_add(req, "rate", json_object_new_uint64(size));
		}
		if (no_yield)
			json_object_object_add(req, "yield", json_object_new_boolean(0));
	} else if (!strcmp(cmd, "mirror")) {
		const char *sub = argv[optind + 1];

		json_object_object_add(req, "cmd", json_object_new_string(!strcmp(sub, "list") ?
						   "mirror-list" : !strcmp(sub, "change") ?
						   "mirror-change" : "mirror-start"));
		if (mode)
			json_object_object_add(req, "mode", json_object_new_string(mode));
		if (!strcmp(sub, "change"))
			json_object_object_add(req, "name", json_object_new_string(argv[optind + 2]));
		if (!strcmp(sub, "start")) {
			char abs[PATH_MAX];
			const char *t = target;

			json_object_object_add(req, "name", json_object_new_string(argv[optind + 2]));
			/* A local path, as the daemon sees it (its directory is
			 * not ours); a file not there yet: its directory's. */
			if (strncmp(t, "nbd", 3) && t[0] != '/') {
				if (!getcwd(abs, sizeof(abs) - strlen(t) - 2))
					cli_die("--target '%s': cannot tell the directory", t);
				strcat(abs, "/");
				strcat(abs, t);
				t = abs;
			}
			json_object_object_add(req, "target", json_object_new_string(t));
			if (format)
				json_object_object_add(req, "format", json_object_new_string(format));
			if (no_yield)
				json_object_object_add(req, "yield", json_object_new_boolean(0));
			if (rate) {
				if (parse_size(rate, &size) < 0)
					cli_die("--rate '%s' is not a rate: bytes per second, or with "
						"K, M or G (e.g. 50M)", rate);
				json_object_object_add(req, "rate", json_object_new_uint64(size));
			}
			if (gran) {
				if (parse_size(gran, &size) < 0 || size == 0 || size > UINT32_MAX)
					cli_die("--granularity '%s' is not a size: bytes, or with K, "
						"M or G (e.g. 64K)", gran);
				json_object_object_add(req, "granularity",
						       json_object_new_uint64(size));
			}
		}
	} else if (!strcmp(cmd, "nbd")) {
		const char *sub = argv[optind + 1];

		if (!strcmp(sub, "list")) {
			json_object_object_add(req, "cmd", json_object_new_string("nbd-list"));
		} else if (!strcmp(sub, "add")) {
			json_object_object_add(req, "cmd", json_object_new_string("nbd-add"));
			json_object_object_add(req, "spec", json_object_new_string(argv[optind + 2]));
		} else {
			json_object_object_add(req, "cmd", json_object_new_string("nbd-remove"));
			json_object_object_add(req, "name", json_object_new_string(argv[optind + 2]));
		}
	} else if (!strcmp(cmd, "upgrade")) {
		json_object_object_add(req, "cmd", json_object_new_string("upgrade"));
		if (exec) {
			if (!realpath(exec, exec_abs) || access(exec_abs, X_OK) < 0)
				cli_die("--exec '%s' is not an executable file", exec);
			json_object_object_add(req, "exec", json_object_new_string(exec_abs));
		}
		/* The new process may connect to a network disk first. */
		wait_ms = 60000;
	} else {
		cli_die("unknown command '%s': use %s", cmd, commands);
	}
	if (vctl_call(path, req, wait_ms, &rep, &reply, err, sizeof(err)) < 0)
		cli_die("%s", err);
	json_object_put(req);
	rc = json_object_object_get_ex(rep, "error", NULL) ? 1 : 0;
	if (!rc && !strcmp(cmd, "metrics")) {
		/* The text itself, as an HTTP scrape would get it. */
		if (!json_object_object_get_ex(rep, "metrics", &v) ||
		    !json_object_is_type(v, json_type_string))
			cli_die("reply from '%s' has no \"metrics\" text: %.200s", path, reply);
		fwrite(json_object_get_string(v), 1, (size_t)json_object_get_string_len(v),
		       stdout);
	} else {
		fputs(reply, stdout);
	}
	json_object_put(rep);
	free(reply);
	return rc;
}
