/*
 * vblkctl: talk to a running vblkd over its control socket.
 *
 *   vblkctl --control PATH stats
 *   vblkctl --control PATH set-poll [--poll-max-ns N] [--completion-poll-max-ns N]
 *                                   [--poll-grow N] [--poll-shrink N]
 *   vblkctl --control PATH resize SIZE      (bytes, or with K/M/G/T)
 *   vblkctl --control PATH upgrade [--exec BINARY]
 *
 * Prints the daemon's JSON reply; exit 1 on an error reply or no daemon.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/parse.h"

static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...)
{
	va_list ap;

	fputs("vblkctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static const char *num(const char *opt, const char *s)
{
	char *end;

	errno = 0;
	(void)strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-')
		die("%s '%s' is not a number", opt, s);
	return s;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "control", required_argument, NULL, 'c' },
		{ "poll-max-ns", required_argument, NULL, 'm' },
		{ "completion-poll-max-ns", required_argument, NULL, 'C' },
		{ "poll-grow", required_argument, NULL, 'g' },
		{ "poll-shrink", required_argument, NULL, 's' },
		{ "exec", required_argument, NULL, 'e' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *path = NULL, *max = NULL, *cmax = NULL, *grow = NULL, *shrink = NULL, *cmd;
	const char *exec = NULL;
	char exec_abs[PATH_MAX];
	int wait_ms = 5000;
	uint64_t size;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char req[512], reply[65536];
	size_t got = 0;
	int c, fd, n;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":", lo, NULL)) != -1) {
		switch (c) {
		case 'c': path = optarg; break;
		case 'm': max = num("--poll-max-ns", optarg); break;
		case 'C': cmax = num("--completion-poll-max-ns", optarg); break;
		case 'g': grow = num("--poll-grow", optarg); break;
		case 's': shrink = num("--poll-shrink", optarg); break;
		case 'e': exec = optarg; break;
		case 'h':
			printf("Usage: vblkctl --control PATH stats\n"
			       "       vblkctl --control PATH set-poll [--poll-max-ns N] "
			       "[--completion-poll-max-ns N] [--poll-grow N] [--poll-shrink N]\n"
			       "       vblkctl --control PATH resize SIZE\n"
			       "       vblkctl --control PATH upgrade [--exec BINARY]\n"
			       "\n"
			       "resize grows the disk under the running guest to SIZE bytes (K, M, G, T:\n"
			       "binary units): a file is extended; a block device or RBD image must have\n"
			       "grown first (lvextend, rbd resize).  The guest is told at once.\n"
			       "\n"
			       "upgrade replaces the running vblkd with a new process of BINARY (default:\n"
			       "the file it was started from, e.g. after a package upgrade) with the same\n"
			       "options, handing it the guest's connection, rings and disk: the VM sees a\n"
			       "pause of milliseconds, no disconnect.  If the new one fails, the old one\n"
			       "serves on.  Prints the new process's pid.\n");
			return 0;
		case ':': die("option '%s' needs a value", argv[optind - 1]);
		default: die("unknown option '%s'; see vblkctl --help", argv[optind - 1]);
		}
	}
	if (!path)
		die("missing --control PATH: the socket given to vblkd --control");
	if (optind >= argc)
		die("give one command: stats, set-poll, resize SIZE or upgrade");
	cmd = argv[optind];
	if (optind + 1 != argc && !(optind + 2 == argc && !strcmp(cmd, "resize")))
		die("give one command: stats, set-poll, resize SIZE or upgrade");
	if (strcmp(cmd, "set-poll") && (max || cmax || grow || shrink))
		die("--poll-* options go with set-poll");
	if (strcmp(cmd, "upgrade") && exec)
		die("--exec goes with upgrade");
	if (!strcmp(cmd, "resize")) {
		if (optind + 2 != argc)
			die("resize needs a SIZE: bytes, or with K, M, G or T (e.g. 20G)");
		if (parse_size(argv[optind + 1], &size) < 0)
			die("resize: '%s' is not a size: give bytes, or with K, M, G or T "
			    "(e.g. 20G)", argv[optind + 1]);
		snprintf(req, sizeof(req), "{\"cmd\": \"resize\", \"size\": %llu}\n",
			 (unsigned long long)size);
	} else if (!strcmp(cmd, "stats")) {
		snprintf(req, sizeof(req), "{\"cmd\": \"stats\"}\n");
	} else if (!strcmp(cmd, "set-poll")) {
		n = snprintf(req, sizeof(req), "{\"cmd\": \"set-poll\"");
		if (max)
			n += snprintf(req + n, sizeof(req) - n, ", \"max_ns\": %s", max);
		if (cmax)
			n += snprintf(req + n, sizeof(req) - n, ", \"completion_max_ns\": %s", cmax);
		if (grow)
			n += snprintf(req + n, sizeof(req) - n, ", \"grow\": %s", grow);
		if (shrink)
			n += snprintf(req + n, sizeof(req) - n, ", \"shrink\": %s", shrink);
		snprintf(req + n, sizeof(req) - n, "}\n");
	} else if (!strcmp(cmd, "upgrade")) {
		if (exec) {
			if (!realpath(exec, exec_abs) || access(exec_abs, X_OK) < 0)
				die("--exec '%s' is not an executable file", exec);
			if (strpbrk(exec_abs, "\"\\") || strlen(exec_abs) > 400)
				die("--exec '%s': the path has quotes or backslashes or is too "
				    "long: use a plain path", exec);
			snprintf(req, sizeof(req), "{\"cmd\": \"upgrade\", \"exec\": \"%s\"}\n",
				 exec_abs);
		} else {
			snprintf(req, sizeof(req), "{\"cmd\": \"upgrade\"}\n");
		}
		/* The new process may connect to a network disk first. */
		wait_ms = 60000;
	} else {
		die("unknown command '%s': use stats, set-poll, resize SIZE or upgrade", cmd);
	}
	if (strlen(path) >= sizeof(sa.sun_path))
		die("control path '%s' is too long", path);
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("cannot connect to '%s': %s: is vblkd running with --control %s?", path,
		    strerror(errno), path);
	if (send(fd, req, strlen(req), MSG_NOSIGNAL) < 0)
		die("cannot send to '%s': %s", path, strerror(errno));
	while (got < sizeof(reply) - 1) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (poll(&p, 1, wait_ms) <= 0)
			die("no reply from '%s' within %d s", path, wait_ms / 1000);
		r = recv(fd, reply + got, sizeof(reply) - 1 - got, 0);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	reply[got] = '\0';
	close(fd);
	if (!got)
		die("empty reply from '%s'", path);
	fputs(reply, stdout);
	return strstr(reply, "\"error\"") ? 1 : 0;
}
