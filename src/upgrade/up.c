#include "upgrade/up.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/log.h"
#include "util/sys.h"
#include "vhost/vu.h"

extern char **environ;

#define UP_HELLO    0x76620010u	/* struct up_hello */
#define UP_WELCOME  0x76620011u	/* u64 version; fds as up_fds says which */
#define UP_PREPARED 0x76620012u
#define UP_READY    0x76620013u	/* struct up_ready */
#define UP_COMMIT   0x76620014u

/* How long each side waits for the other (ms).  Starting may connect to a
 * network disk: generous; the state is local: short. */
#define UP_START_MS 30000
#define UP_STATE_MS 10000

#define UP_ENV "VBLKD_HANDOVER_FD"
#define UP_NFDS 5	/* struct up_fds */

struct up_hello {
	uint32_t version;
	uint32_t pid;
};

/* The new process's verdict on the state: 0, or an errno and why. */
struct up_ready {
	uint32_t err;
	char why[236];
};

/* Which of up_fds a WELCOME carries, in this order. */
struct up_welcome {
	uint32_t version;
	uint32_t has;		/* bit 0 listen, 1 control, 2 metrics, 3 disk,
				 * 4 (since 2026-12) the disk's key */
};

static char **up_argv;
static char up_self[PATH_MAX];

void up_init(char **argv)
{
	ssize_t n = readlink("/proc/self/exe", up_self, sizeof(up_self) - 1);

	up_argv = argv;
	up_self[n > 0 ? n : 0] = '\0';
}

/* Options of the old image that a raw one does not take (main.c's), with
 * a value each but copy-on-read. */
static const char *const up_image_opts[] = {
	"disk", "format", "key-file", "l2-cache-size", "bitmap-file", "kdf-max-ms",
	"kdf-max-memory", "ceph-conf", "ceph-id", "copy-on-read",
};

/* --name or --name=value: the option's index in up_image_opts, or -1. */
static int up_image_opt(const char *a, bool *inline_value)
{
	if (strncmp(a, "--", 2))
		return -1;
	for (size_t i = 0; i < sizeof(up_image_opts) / sizeof(up_image_opts[0]); i++) {
		size_t n = strlen(up_image_opts[i]);

		if (!strncmp(a + 2, up_image_opts[i], n) && (a[2 + n] == '\0' || a[2 + n] == '=')) {
			*inline_value = a[2 + n] == '=';
			return (int)i;
		}
	}
	return -1;
}

int up_set_disk(const char *path, const char *format)
{
	size_t argc = 0, k = 0;
	char **nv, *p = strdup(path);

	while (up_argv[argc])
		argc++;
	nv = calloc(argc + 5, sizeof(*nv));
	if (!nv || !p) {
		free(nv);
		free(p);
		return -ENOMEM;
	}
	nv[k++] = up_argv[0];
	for (size_t i = 1; i < argc; i++) {
		bool inl = false;
		int o = up_image_opt(up_argv[i], &inl);

		if (o < 0) {
			nv[k++] = up_argv[i];
			continue;
		}
		/* Skipped, its value too (copy-on-read has none). */
		if (!inl && strcmp(up_image_opts[o], "copy-on-read") && i + 1 < argc)
			i++;
	}
	nv[k++] = "--disk";
	nv[k++] = p;
	nv[k++] = "--format";
	nv[k++] = (char *)format;
	nv[k] = NULL;
	/* The old arrays stay: argv is main's, an earlier one is in use
	 * nowhere but cheap to keep. */
	up_argv = nv;
	return 0;
}

static int *up_fd_slot(struct up_fds *f, unsigned i)
{
	int *slots[] = { &f->listen, &f->control, &f->metrics, &f->disk, &f->key };

	return slots[i];
}

/* Wait for one message of type want with an empty or u64/hello payload. */
static int up_expect(int sock, int timeout_ms, uint32_t want, void *p, uint32_t size,
		     int *fds, unsigned *nfds)
{
	uint8_t buf[512];
	uint32_t req, got = sizeof(buf);
	unsigned room = nfds ? *nfds : 0;
	int tmp[8], r;

	r = vu_handover_recv(sock, timeout_ms, &req, buf, &got, fds ? fds : tmp, &room);
	if (r < 0)
		return r;
	if (req != want || got != size) {
		for (unsigned i = 0; i < room; i++)
			close((fds ? fds : tmp)[i]);
		return -EPROTO;
	}
	if (size)
		memcpy(p, buf, size);
	if (nfds)
		*nfds = room;
	else
		for (unsigned i = 0; i < room; i++)
			close(tmp[i]);
	return 0;
}

/* ---- Old process ---- */

/* Start exec with our arguments and child_fd as VBLKD_HANDOVER_FD. */
static int up_spawn(const char *exec, int child_fd, pid_t *pid, char *err, size_t errlen)
{
	size_t argc = 0, envc = 0;
	char **argv, **envp, fdvar[32];
	posix_spawnattr_t attr;
	sigset_t none;
	int r;

	while (up_argv[argc])
		argc++;
	while (environ[envc])
		envc++;
	argv = calloc(argc + 1, sizeof(*argv));
	envp = calloc(envc + 2, sizeof(*envp));
	if (!argv || !envp) {
		free(argv);
		free(envp);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	argv[0] = (char *)exec;
	for (size_t i = 1; i < argc; i++)
		argv[i] = up_argv[i];
	envc = 0;
	for (char **e = environ; *e; e++)
		if (strncmp(*e, UP_ENV "=", sizeof(UP_ENV)))
			envp[envc++] = *e;
	snprintf(fdvar, sizeof(fdvar), UP_ENV "=%d", child_fd);
	envp[envc] = fdvar;

	/* Signals we block for signalfd would stay blocked across exec. */
	sigemptyset(&none);
	posix_spawnattr_init(&attr);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
	/* Only the handover socket crosses exec: ours are close-on-exec. */
	r = fcntl(child_fd, F_SETFD, 0) < 0 ? errno :
	    posix_spawn(pid, exec, NULL, &attr, argv, envp);
	posix_spawnattr_destroy(&attr);
	free(argv);
	free(envp);
	if (r) {
		snprintf(err, errlen, "cannot start %s: %s", exec, strerror(r));
		return -r;
	}
	return 0;
}

/* Why the new process stopped answering, for the user.  Returns true if
 * it has exited and been reaped (its pid is no longer ours to signal). */
static bool up_child_gone(pid_t pid, int r, const char *stage, char *err, size_t errlen)
{
	bool exited = false;
	int st;

	/* The handover socket's end is the child's exit, or the child
	 * closing it and running on: wait a moment, not for ever (the
	 * caller kills one that has not exited). */
	if (r == -ECONNRESET)
		for (int i = 0; i < 100 && !exited; i++) {
			exited = waitpid(pid, &st, WNOHANG) == pid;
			if (!exited)
				usleep(10000);
		}
	if (exited) {
		if (WIFEXITED(st))
			snprintf(err, errlen, "the new vblkd (pid %d) exited with status %d "
				 "%s (its log says why); still serving here", (int)pid,
				 WEXITSTATUS(st), stage);
		else
			snprintf(err, errlen, "the new vblkd (pid %d) was killed by signal "
				 "%d %s; still serving here", (int)pid,
				 WIFSIGNALED(st) ? WTERMSIG(st) : 0, stage);
		return true;
	}
	snprintf(err, errlen, "the new vblkd (pid %d) %s %s: %s; stopped it, still "
		 "serving here", (int)pid, r == -ETIMEDOUT ? "did not answer" : "failed",
		 stage, r == -ETIMEDOUT ? "timed out" : r == -EPROTO ?
		 "it speaks another handover format" : strerror(-r));
	return false;
}

int up_start(struct vu_server *srv, const struct up_fds *fds, const char *exec,
	     struct up_result *res, char *err, size_t errlen)
{
	struct up_welcome w = { .version = UP_VERSION };
	struct up_fds f = *fds;
	struct up_hello h;
	int sv[2], send_fds[UP_NFDS];
	unsigned nsend = 0;
	bool reaped = false;
	struct up_ready ready = { 0 };
	uint64_t t0;
	pid_t pid;
	int r;

	if (!exec)
		exec = up_self;
	if (!*exec || access(exec, X_OK) < 0) {
		snprintf(err, errlen, "'%s' is not an executable: pass --exec BINARY",
			 exec);
		return -ENOEXEC;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		snprintf(err, errlen, "socketpair: %s", strerror(errno));
		return -errno;
	}
	r = up_spawn(exec, sv[1], &pid, err, errlen);
	close(sv[1]);
	if (r < 0) {
		close(sv[0]);
		return r;
	}
	log_info("upgrade: started %s as pid %d", exec, (int)pid);

	r = up_expect(sv[0], UP_START_MS, UP_HELLO, &h, sizeof(h), NULL, NULL);
	if (r == 0 && h.version != UP_VERSION) {
		snprintf(err, errlen, "the new vblkd speaks handover version %u, this one "
			 "%u: upgrade through a release that speaks both; still serving here",
			 h.version, UP_VERSION);
		r = -EPROTONOSUPPORT;
		goto fail;
	}
	if (r < 0) {
		reaped = up_child_gone(pid, r, "before greeting", err, errlen);
		goto fail;
	}
	for (unsigned i = 0; i < UP_NFDS; i++) {
		int fd = *up_fd_slot(&f, i);

		if (fd >= 0) {
			w.has |= 1u << i;
			send_fds[nsend++] = fd;
		}
	}
	r = vu_handover_send(sv[0], UP_WELCOME, &w, sizeof(w), send_fds, nsend);
	if (r == 0)
		r = up_expect(sv[0], UP_START_MS, UP_PREPARED, NULL, 0, NULL, NULL);
	if (r < 0) {
		reaped = up_child_gone(pid, r, "while starting", err, errlen);
		goto fail;
	}

	/* The guest's pause starts here. */
	t0 = sys_now_ns();
	r = vu_server_handover_save(srv, sv[0], fds->disk < 0, err, errlen);
	if (r < 0) {
		/* It may have stopped reading because it refused the state:
		 * then it said why. */
		if (up_expect(sv[0], 1000, UP_READY, &ready, sizeof(ready), NULL, NULL) == 0 &&
		    ready.err) {
			ready.why[sizeof(ready.why) - 1] = '\0';
			snprintf(err, errlen, "the new vblkd (pid %d) refused the state: %s; "
				 "still serving here", (int)pid, ready.why);
		}
		goto fail;
	}
	r = up_expect(sv[0], UP_STATE_MS, UP_READY, &ready, sizeof(ready), NULL, NULL);
	if (r == 0 && ready.err)
		r = -(int)ready.err;
	if (r == 0)
		r = vu_handover_send(sv[0], UP_COMMIT, NULL, 0, NULL, 0);
	if (r < 0) {
		vu_server_handover_resume(srv);
		ready.why[sizeof(ready.why) - 1] = '\0';
		if (ready.err && r == -(int)ready.err)
			snprintf(err, errlen, "the new vblkd (pid %d) refused the state: %s; "
				 "still serving here", (int)pid, ready.why);
		else
			reaped = up_child_gone(pid, r, "taking over", err, errlen);
		goto fail;
	}
	close(sv[0]);
	res->pid = pid;
	res->pause_ns = sys_now_ns() - t0;
	return 0;

fail:
	/* Whatever it is doing, it must not serve: it never got COMMIT. */
	close(sv[0]);
	if (!reaped) {
		kill(pid, SIGKILL);
		(void)waitpid(pid, NULL, 0);
	}
	return r;
}

/* ---- New process ---- */

int up_child_begin(struct up_child *c, char *err, size_t errlen)
{
	const char *v = getenv(UP_ENV), *tv = getenv("VBLKD_TEST_HANDOVER_VERSION");
	struct up_hello h = { .version = UP_VERSION, .pid = (uint32_t)getpid() };
	struct up_welcome w;
	int fds[UP_NFDS];
	unsigned nfds = UP_NFDS, k = 0;
	char *end;
	long fd;
	int r;

	c->sock = -1;
	c->fds = (struct up_fds){ -1, -1, -1, -1, -1 };
	if (!v)
		return 0;
	unsetenv(UP_ENV);
	errno = 0;
	fd = strtol(v, &end, 10);
	if (errno || *end || fd < 3 || fd > INT_MAX || fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0) {
		snprintf(err, errlen, UP_ENV "='%s' is not an inherited socket: it is "
			 "set by vblkctl upgrade, not by hand", v);
		return -EINVAL;
	}
	c->sock = (int)fd;
	c->old_pid = getppid();
	if (tv)
		h.version = (uint32_t)strtoul(tv, NULL, 10);
	r = vu_handover_send(c->sock, UP_HELLO, &h, sizeof(h), NULL, 0);
	if (r == 0)
		r = up_expect(c->sock, UP_START_MS, UP_WELCOME, &w, sizeof(w), fds, &nfds);
	if (r == 0 && (w.version != UP_VERSION || w.has >= 1u << UP_NFDS)) {
		for (unsigned i = 0; i < nfds; i++)
			close(fds[i]);
		r = -EPROTO;
	}
	if (r < 0) {
		snprintf(err, errlen, "upgrade: no welcome from the old vblkd (pid %d): %s",
			 (int)c->old_pid, r == -EPROTO ? "another handover version" :
			 r == -ECONNRESET ? "it refused us" : strerror(-r));
		close(c->sock);
		c->sock = -1;
		return r;
	}
	for (unsigned i = 0; i < UP_NFDS; i++)
		if (w.has & (1u << i))
			*up_fd_slot(&c->fds, i) = k < nfds ? fds[k++] : -1;
	log_info("upgrade: taking over from pid %d", (int)c->old_pid);
	return 1;
}

int up_child_finish(struct up_child *c, struct vu_server *srv, char *err, size_t errlen)
{
	struct up_ready ready = { 0 };
	int r;

	r = vu_handover_send(c->sock, UP_PREPARED, NULL, 0, NULL, 0);
	if (r < 0) {
		snprintf(err, errlen, "upgrade: the old vblkd went away: %s", strerror(-r));
		goto out;
	}
	r = vu_server_handover_load(srv, c->sock, UP_STATE_MS, err, errlen);
	if (r < 0) {
		ready.err = (uint32_t)-r;
		snprintf(ready.why, sizeof(ready.why), "%s", err);
	}
	if (vu_handover_send(c->sock, UP_READY, &ready, sizeof(ready), NULL, 0) < 0 && !r) {
		snprintf(err, errlen, "upgrade: the old vblkd went away before we were ready");
		r = -ECONNRESET;
	}
	if (r < 0)
		goto out;
	/* Without COMMIT the old process serves on: never start. */
	r = up_expect(c->sock, UP_STATE_MS, UP_COMMIT, NULL, 0, NULL, NULL);
	if (r < 0) {
		snprintf(err, errlen, "upgrade: the old vblkd did not let go (%s); it "
			 "serves on", strerror(-r));
		goto out;
	}
	r = vu_server_handover_commit(srv);
	if (r < 0)
		snprintf(err, errlen, "upgrade: cannot start the rings handed over: %s",
			 strerror(-r));
	else
		log_info("upgrade: serving now in place of pid %d", (int)c->old_pid);
out:
	close(c->sock);
	c->sock = -1;
	return r;
}
