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
	/* A running ring is broken (a request or index the driver got wrong
	 * stopped it; see vq.h): the driver must reset the device.  Reported
	 * as NEEDS_RESET in GET_STATUS.  Optional. */
	bool (*needs_reset)(void *dev);
};

struct vu_server;

/*
 * Bind and listen on path.  A live listener already there is an error; a
 * stale socket file (nobody accepts) is replaced.  On failure returns
 * -errno, writes one line for the user into err, and leaves nothing
 * behind.  Main thread.
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

/* The device's config space changed (a resize): tell the frontend with
 * CONFIG_CHANGE_MSG on the backend channel, never waiting for it.
 * Returns 1 sent, 0 no channel (no frontend, or it did not negotiate
 * BACKEND_REQ and CONFIG), -errno.  Main thread. */
int vu_server_config_changed(struct vu_server *s);

#endif
