/*
 * vu_: the vhost-user backend (server side).  Listens on a unix socket,
 * serves one frontend at a time, validates every message, owns the
 * control-plane state (features, memory table, per-ring configuration and
 * fds) and tells the device, through struct vu_dev_ops, when a ring
 * starts, stops or changes.
 *
 * Threading: all of vu runs on the main thread (the loop given to
 * vu_server_new).  Device ops are called on the main thread; a device
 * hands ring changes to the iothread that owns the ring (loop_call_sync),
 * so the data path never races the control plane.
 */
#ifndef VBLK_VU_H
#define VBLK_VU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mem/gm.h"
#include "virtio/vq.h"

/* Rings one server can track. */
#define VU_MAX_QUEUES 64

struct loop;

/* Everything a device needs to run one ring.  The fds stay owned by vu
 * and valid until queue_stop() or until replaced by queue_set_fds(). */
struct vu_queue_setup {
	struct vq_config cfg;
	const struct gm_table *mem;
	int kick_fd, call_fd, err_fd;	/* call/err may be -1 */
	bool enabled;
	uint64_t features;		/* acked virtio features */
};

struct vu_dev_ops {
	/* Virtio features the device offers (VERSION_1, ring, device bits). */
	uint64_t (*features)(void *dev);
	unsigned (*num_queues)(void *dev);
	/* Copy config space bytes [off, off+len) into buf; bytes past the
	 * device's config read as zero.  off+len <= 256 is checked by vu. */
	void (*get_config)(void *dev, uint32_t off, uint8_t *buf, uint32_t len);
	/* Guest config write.  Returns 0 or -errno (read-only field). */
	int (*set_config)(void *dev, uint32_t off, const uint8_t *buf, uint32_t len);
	/* Features acked by the driver (SET_FEATURES). */
	void (*set_features)(void *dev, uint64_t features);
	/* Start processing ring idx.  Returns 0 or -errno. */
	int (*queue_start)(void *dev, unsigned idx, const struct vu_queue_setup *s);
	/* Stop ring idx: no new requests; wait for in-flight ones to complete
	 * (and be returned to the driver).  Returns the ring's base for
	 * GET_VRING_BASE (vq_base: the next avail index, or packed's 32-bit
	 * encoding). */
	uint32_t (*queue_stop)(void *dev, unsigned idx);
	/* Replace the call/err fds of a started ring. */
	void (*queue_set_fds)(void *dev, unsigned idx, int call_fd, int err_fd);
	void (*queue_set_enable)(void *dev, unsigned idx, bool enabled);
	/* Dirty logging of started ring idx changed (LOG_ALL, the log, the
	 * ring's log flag or address): from its next batch on the ring logs
	 * as lg says; once this returns it no longer touches the log it had
	 * before (which vu may then unmap). */
	void (*queue_set_log)(void *dev, unsigned idx, const struct vq_log *lg);
	/* A ring is about to start and none runs: the frontend starts using
	 * the disk.  Claim it against other processes (the image lock, see
	 * docs/architecture.md "Migration").  Returns 0, or -EBUSY (someone
	 * else writes the disk; one line logged) or another -errno. */
	int (*claim)(void *dev);
	/* No ring runs any more (all stopped by GET_VRING_BASE, a reset or
	 * a disconnect): give up what claim took.  Not called when rings
	 * only restart (memory table or kick fd changes). */
	void (*release)(void *dev);
	/* Optional.  The last running ring stopped by GET_VRING_BASE while
	 * dirty logging is on: a migration's switch-over.  What must reach
	 * the destination before the frontend hears the base (a mirror's
	 * target, mir.h) goes there now; the reply waits for it. */
	void (*switchover)(void *dev);
	/* A running ring is broken (a request or index the driver got wrong
	 * stopped it; see vq.h): the driver must reset the device.  Reported
	 * as NEEDS_RESET in GET_STATUS.  Optional. */
	bool (*needs_reset)(void *dev);
	/* Upgrade in place: the device's own state that the frontend set and
	 * vhost-user messages do not carry (virtio-blk: the write cache
	 * mode), at most VU_HO_DEVICE_MAX bytes into buf, returning the
	 * length; load_state takes it in the next process (0 or -errno).
	 * Optional. */
	size_t (*save_state)(void *dev, uint8_t *buf, size_t len);
	int (*load_state)(void *dev, const uint8_t *buf, size_t len);
	/* Upgrade in place, old process: every ring stopped, before the
	 * state goes; the device writes back what it keeps of the disk in
	 * memory (an image format's tables) so that the next process reads
	 * the disk whole.  If the upgrade fails the rings start again here.
	 * New process: the state taken, before it says READY; the device
	 * reads again what it read of the disk at start-up, when the old
	 * process still changed it.  0, or -errno with one line in err (the
	 * old process serves on).  Optional. */
	int (*handover_quiesce)(void *dev, char *err, size_t errlen);
	int (*handover_reload)(void *dev, char *err, size_t errlen);
};

struct vu_server;

/*
 * Bind and listen on path.  A live listener already there is an error; a
 * stale socket file (nobody accepts) is replaced.  On failure returns
 * -errno, writes one line for the user into err, and leaves nothing
 * behind.  Main thread.  (vu_server_new_fd below: on a listener inherited
 * from the process it takes over from.)
 */
int vu_server_new(const char *path, struct loop *l, const struct vu_dev_ops *ops,
		  void *dev, struct vu_server **out, char *err, size_t errlen);
/* Disconnect the frontend (draining in-flight I/O), close the listener
 * and remove the socket file. */
void vu_server_free(struct vu_server *s);

/*
 * Serve fd, a connected stream socket, as if the listener had just
 * accepted it (the server takes ownership and closes it on disconnect).
 * Returns 0, -EBUSY if a frontend is connected already, or -errno.
 * Main thread.  Used by the listener, and directly by fuzzing and tests.
 */
int vu_server_adopt(struct vu_server *s, int fd);

/*
 * For fuzzing and tests: if the connection has something to read, handle
 * one message (or the peer's close) synchronously, as the loop would on
 * EPOLLIN, without the loop running.  Returns 1 if a message was handled
 * and the frontend is still connected, 0 if nothing was waiting,
 * -ECONNRESET if the connection was dropped (peer closed, or a malformed
 * or failed message: the server is back to listening), -ENOTCONN if no
 * frontend is connected.  Main thread.
 */
int vu_server_process(struct vu_server *s);

/* Drop the connected frontend, if any, as after a malformed message
 * (rings stopped with in-flight I/O drained, memory unmapped, back to
 * listening), logging why.  Loop thread. */
void vu_server_drop(struct vu_server *s, const char *why);

/* Number of frontends served so far and whether one is connected. */
unsigned vu_server_connections(const struct vu_server *s);
bool vu_server_connected(const struct vu_server *s);

/*
 * Upgrade in place (docs/architecture.md "Upgrade in place"): hand the
 * frontend, with everything it set, to a new process over sock (a unix
 * stream socket), as vhost-user messages and their fds framed by
 * VU_HO_BEGIN (the connection's fd, if one) and VU_HO_END.  Main thread.
 *
 * Old process: vu_server_handover_save refuses (-EBUSY, reason in err)
 * while dirty logging is on; otherwise it stops watching the frontend
 * and the listener, stops every ring (in-flight I/O completes first),
 * gives up the disk's claim if release (a disk the new process opens
 * anew: it claims it), and sends the state.  Then either the new process takes over and this one
 * exits without touching anything shared (no vu_server_free: it would
 * remove the socket file), or vu_server_handover_resume restarts the
 * rings that ran and serves on.  (On a send failure save resumes
 * itself.)  Between the rings' stop and the send the device writes back
 * what it holds of the disk (ops->handover_quiesce; its failure resumes
 * and refuses the upgrade).
 *
 * New process (vu_server_new_fd on the inherited listener):
 * vu_server_handover_load replays the state through the message
 * handlers, ring starts held, replies nowhere, then has the device read
 * the disk again (ops->handover_reload); 0, or -errno with the reason in
 * err and nothing kept.  vu_server_handover_commit, once the
 * old process has let go, adopts the connection and starts the rings.
 */
#define VU_HO_VERSION 1
#define VU_HO_BEGIN  0x76620001u	/* struct vu_ho_begin, the connection's fd */
#define VU_HO_DEVICE 0x76620002u	/* save_state's bytes */
#define VU_HO_END    0x76620003u
/* The device's state blob: a few bytes, the reason a paused disk paused
 * (blk pause.c) and its QoS limits (blk config.c); within any vhost-user
 * payload (264 bytes: SET_MEM_TABLE's). */
#define VU_HO_DEVICE_MAX 256

struct vu_ho_begin {
	uint32_t version;	/* VU_HO_VERSION */
	uint32_t nqueues;
	uint32_t nconn;		/* frontends served so far */
	uint32_t padding;
};

int vu_server_new_fd(const char *path, int listen_fd, struct loop *l,
		     const struct vu_dev_ops *ops, void *dev, struct vu_server **out,
		     char *err, size_t errlen);
int vu_server_listen_fd(const struct vu_server *s);
int vu_server_handover_save(struct vu_server *s, int sock, bool release, char *err,
			    size_t errlen);
void vu_server_handover_resume(struct vu_server *s);
int vu_server_handover_load(struct vu_server *s, int sock, int timeout_ms, char *err,
			    size_t errlen);
int vu_server_handover_commit(struct vu_server *s);

/* The handover's framing, also for the upgrade's own messages (up.h):
 * a vhost-user header (request req), size payload bytes, nfds fds.
 * recv waits up to timeout_ms for the message to start; *size and *nfds
 * give the room on entry and what came on return.  0, -ETIMEDOUT,
 * -ECONNRESET (peer gone), -EPROTO, -errno. */
int vu_handover_send(int sock, uint32_t req, const void *p, uint32_t size, const int *fds,
		     unsigned nfds);
int vu_handover_recv(int sock, int timeout_ms, uint32_t *req, void *p, uint32_t *size,
		     int *fds, unsigned *nfds);

/* The device's config space changed (a resize): tell the frontend with
 * CONFIG_CHANGE_MSG on the backend channel, never waiting for it.
 * Returns 1 sent, 0 no channel (no frontend, or it did not negotiate
 * BACKEND_REQ and CONFIG), -errno.  Main thread. */
int vu_server_config_changed(struct vu_server *s);

#endif
