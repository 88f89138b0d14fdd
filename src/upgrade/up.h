/*
 * up_: upgrade in place.  `vblkctl upgrade [--exec BINARY]` makes the
 * running vblkd (the old process) start a new one with its own options
 * and hand it everything it serves with, so that the frontend never sees
 * a disconnect (docs/architecture.md "Upgrade in place").
 *
 * The two processes talk over a unix socket pair, the new one's end
 * inherited as VBLKD_HANDOVER_FD; messages are framed as vhost-user ones
 * (vu_handover_send/recv) and carry fds with SCM_RIGHTS:
 *
 *   new -> old  HELLO {version, pid}       versions must match
 *   old -> new  WELCOME {version}, fds     the listeners, the disk, its key
 *   new -> old  PREPARED                   opened and set up, waiting
 *        (until here the guest's I/O runs on in the old process)
 *   old -> new  the frontend's state       vu_server_handover_save: rings
 *                                          stopped and drained first
 *   new -> old  READY {0 or errno}         replayed and checked
 *   old -> new  COMMIT                     the new one starts the rings;
 *                                          the old one exits
 *
 * Until COMMIT the old process may take everything back: any failure,
 * timeout or early exit of the new one and it kills it and serves on.
 * The new one never starts a ring without COMMIT.
 *
 * Threading: main thread, blocking (the main loop pauses for the
 * handover; iothreads run the guest's I/O until the state is sent).
 */
#ifndef VBLK_UP_H
#define VBLK_UP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct vu_server;

#define UP_VERSION 1

/* Listening sockets, the disk and its key, -1 where there is none. */
struct up_fds {
	int listen;	/* vhost-user */
	int control;	/* --control */
	int metrics;	/* --metrics */
	int disk;	/* a file or block device: the same open file, so the
			 * image lock carries over.  -1: the new process opens the
			 * disk itself (network disks) and claims it anew. */
	int key;	/* a LUKS disk's volume key (fmt_key_export's memfd):
			 * the new process opens the disk with it, no
			 * passphrase read again */
};

/* Remember how we were started (argv is kept, not copied): the binary's
 * path now, before a package upgrade replaces the file. */
void up_init(char **argv);
/* The disk is served from path now, a raw or qcow2 image (a mirror's
 * pivot): a new process is started with --disk path --format format
 * (static), without the old image's format options.  0 or -ENOMEM (the
 * arguments unchanged). */
int up_set_disk(const char *path, const char *format);

struct up_result {
	pid_t pid;		/* the new process */
	uint64_t pause_ns;	/* rings stopped until the new one had them */
};

/*
 * Old process: start exec (NULL: the binary we were started as) with our
 * arguments and hand over srv and fds.  0: the new process serves now and
 * this one must exit without touching anything shared (see vu.h).
 * -errno with one line in err: this process still serves.
 */
int up_start(struct vu_server *srv, const struct up_fds *fds, const char *exec,
	     struct up_result *res, char *err, size_t errlen);

/* New process side. */
struct up_child {
	int sock;
	pid_t old_pid;
	struct up_fds fds;
};

/*
 * At start-up: 0 if we were not started by an upgrade; 1 if we were, the
 * old process greeted and c->fds filled (ours now); -errno with one line
 * in err.  VBLKD_TEST_HANDOVER_VERSION, for tests only, makes us claim
 * another version.
 */
int up_child_begin(struct up_child *c, char *err, size_t errlen);

/*
 * Once set up (srv on c->fds.listen): take the state, replay it, and on
 * COMMIT start serving.  0, or -errno with one line in err (then exit:
 * the old process serves on).
 */
int up_child_finish(struct up_child *c, struct vu_server *srv, char *err, size_t errlen);

#endif
