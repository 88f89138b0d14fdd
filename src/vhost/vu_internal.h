/*
 * Shared between the files of src/vhost only; nothing outside it includes
 * this header (vu.h keeps struct vu_server opaque).  The server's state,
 * the message being handled and the vu__ functions one file of the
 * vhost-user backend calls in another.  Main thread only, like all of vu.
 *
 *   vu.c         the server: listener and connection, the dispatch table,
 *                feature, status, ring and config messages, the backend
 *                channel
 *   msg.c        one message on the socket: framing, fds, names
 *   mem_table.c  guest memory: SET_MEM_TABLE, ADD/REM_MEM_REG
 *   dirty_log.c  dirty logging for migration: LOG_ALL, SET_LOG_BASE/FD
 *   inflight.c   the in-flight region: GET/SET_INFLIGHT_FD
 *   handover.c   upgrade in place: the state to and from another process
 */
#ifndef VBLK_VU_INTERNAL_H
#define VBLK_VU_INTERNAL_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vhost/vhost_user.h"
#include "vhost/vu.h"

struct gm_dirty_log;

/* Handler results besides 0 (done, ack if asked) and -errno (failed,
 * nack if asked): */
#define VU_REPLY 1		/* m->p holds a reply of m->hdr.size bytes */
#define VU_MALFORMED (-EBADMSG)	/* protocol violation: disconnect */
#define VU_REFUSED (-EBUSY)	/* refused (nack if asked), then disconnect */

struct vu_msg {
	struct vhost_user_hdr hdr;
	union vhost_user_payload p;
	int fds[VHOST_USER_MAX_FDS];
	unsigned nfds;
	int reply_fd;		/* sent with the reply, then closed (-1: none) */
};

/* Control-plane view of one ring (main thread only). */
struct vu_vring {
	unsigned num;
	uint64_t desc, avail, used;
	bool addr_set;
	bool log_used;		/* VHOST_VRING_F_LOG */
	uint64_t log_addr;	/* log_guest_addr */
	/* SET_VRING_BASE / GET_VRING_BASE: split, the avail index; packed,
	 * QEMU's encoding of both positions and wrap counters (vq_base). */
	uint32_t base;
	int kick_fd, call_fd, err_fd;
	bool started;
	bool enabled;
};

struct vu_server {
	char *path;
	int listen_fd;
	struct loop *loop;
	struct loop_fd *listen_h;
	const struct vu_dev_ops *ops;
	void *dev;

	int conn_fd;
	struct loop_fd *conn_h;
	unsigned nconn;

	uint64_t features;		/* offered virtio features */
	uint64_t acked;
	uint64_t proto_acked;
	struct gm_table *mem;		/* published to iothreads via ring start */
	/* INFLIGHT_SHMFD (inflight.c): the frontend's region, mapped (NULL
	 * if none). */
	uint8_t *inflight;
	size_t inflight_size;
	int inflight_fd;		/* our copy of its fd (upgrade in place) */
	uint64_t inflight_offset;
	unsigned inflight_queues, inflight_qsize;
	uint64_t inflight_stride;	/* bytes per queue: with packed room or not */
	unsigned nqueues;
	struct vu_vring *vr;
	/* The disk is ours while rings run (ops->claim). */
	bool claimed;
	/* Dirty logging ("Migration", dirty_log.c): SET_LOG_BASE's log,
	 * SET_LOG_FD's eventfd.  Rings log while LOG_ALL is acked and a log
	 * is set. */
	struct gm_dirty_log *log;
	int log_call_fd;
	/* The backend channel (SET_BACKEND_REQ_FD): our requests to the
	 * frontend, CONFIG_CHANGE_MSG.  -1: none. */
	int backend_fd;
	/* The device status the frontend set (SET_STATUS; STATUS protocol
	 * feature), without NEEDS_RESET, which is ours to report. */
	uint8_t status;
	/* Upgrade in place (handover.c).  held: the state is being replayed
	 * from the previous process: no replies, rings wait for the commit;
	 * ho_nack: a replayed message was refused.  ho_conn_fd: the
	 * frontend's connection, adopted at commit.  ho_restart: rings the
	 * old process stopped for the handover.  keep_path: the socket file
	 * is not ours to remove (yet). */
	bool held, ho_nack, keep_path;
	int ho_conn_fd;
	bool ho_restart[VU_MAX_QUEUES];
};

static inline bool vu__has_proto(const struct vu_server *s, unsigned bit)
{
	return s->proto_acked & (1ull << bit);
}

static inline bool vu__packed(const struct vu_server *s)
{
	return s->acked & (1ull << VIRTIO_F_RING_PACKED);
}

/* Take ownership of the message's i-th fd. */
static inline int vu__take_fd(struct vu_msg *m, unsigned i)
{
	int fd = m->fds[i];

	m->fds[i] = -1;
	return fd;
}

/* ---- vu.c: the server ---- */

/* Start ring idx if it has everything it needs (spec "Ring states": a
 * ring starts on SET_VRING_KICK; not while a handover replays).  Returns
 * 0, VU_MALFORMED or VU_REFUSED (the disk cannot be claimed). */
int vu__vring_start(struct vu_server *s, unsigned idx);
/* Stop ring idx if it runs (its in-flight requests complete first),
 * keeping where it stopped as its base. */
void vu__vring_stop(struct vu_server *s, unsigned idx);
bool vu__rings_running(const struct vu_server *s);
/* With no ring running, give up the disk's claim (ops->release). */
void vu__release_if_idle(struct vu_server *s);
/* The message's first fd is an eventfd, made non-blocking: 0, or -errno
 * (logged, naming req). */
int vu__check_eventfd(struct vu_msg *m, const char *req);
/* Handle one message, replying as it asks.  Returns 0, or < 0 to
 * disconnect (VU_MALFORMED, VU_REFUSED, -errno). */
int vu__dispatch(struct vu_server *s, struct vu_msg *m);
/* Everything a frontend set, gone (rings stopped and drained, memory
 * unmapped); the connection stays. */
void vu__state_clear(struct vu_server *s);
/* vu__state_clear, close the connection, listen again. */
void vu__disconnect(struct vu_server *s);
/* Watch fd, the frontend's connection (s->conn_h), or the listener
 * (s->listen_h) on the loop.  0 or -errno. */
int vu__watch_conn(struct vu_server *s, int fd);
int vu__watch_listener(struct vu_server *s);

/* ---- msg.c: one message on the socket ---- */

const char *vu__req_name(uint32_t req);
/* Send m as the reply to its request, with m->reply_fd if set (closed
 * either way), never blocking.  0 or -EPIPE (logged). */
int vu__send(int fd, struct vu_msg *m);
/* Read one message, if one is waiting: header with any fds, then the
 * payload, all within a few seconds of its first byte.  Returns 0,
 * -EAGAIN (nothing waiting), -ECONNRESET on orderly close, VU_MALFORMED,
 * or -errno.  The fds received are m's (vu__close_fds) even on error. */
int vu__recv(int fd, struct vu_msg *m);
/* Close the message's fds that no handler took. */
void vu__close_fds(struct vu_msg *m);

/* ---- mem_table.c: guest memory ---- */

/* Publish table nt (NULL: none), stopping and restarting running rings
 * around the switch; regions not carried over are unmapped.  0, a ring
 * start's error, or -ERANGE (the dirty log does not cover it). */
int vu__mem_replace(struct vu_server *s, struct gm_table *nt);
int vu__set_mem_table(struct vu_server *s, struct vu_msg *m);
int vu__add_mem_reg(struct vu_server *s, struct vu_msg *m);
int vu__rem_mem_reg(struct vu_server *s, struct vu_msg *m);
int vu__get_max_mem_slots(struct vu_server *s, struct vu_msg *m);

/* ---- dirty_log.c: dirty logging ("Migration") ---- */

/* Rings log now: LOG_ALL acked and a log set. */
bool vu__logging(const struct vu_server *s);
/* What ring vr logs now, into lg. */
void vu__vring_log(const struct vu_server *s, const struct vu_vring *vr,
		   struct vq_log *lg);
/* The log covers all guest memory and every logged used ring (logs what
 * does not); true when not logging. */
bool vu__log_covers(struct vu_server *s);
/* SET_FEATURES changed LOG_ALL: every running ring switches.  0, -EINVAL
 * (on without a log) or -ERANGE (the log is too small). */
int vu__log_all_changed(struct vu_server *s);
/* The log unmapped, SET_LOG_FD's eventfd closed. */
void vu__log_reset(struct vu_server *s);
int vu__set_log_base(struct vu_server *s, struct vu_msg *m);
int vu__set_log_fd(struct vu_server *s, struct vu_msg *m);

/* ---- inflight.c: in-flight tracking ("Inflight I/O tracking") ---- */

/* Point ring idx's cfg at its part of the in-flight region, if there is
 * one made for rings of its size. */
void vu__inflight_ring(const struct vu_server *s, unsigned idx, struct vq_config *cfg);
/* Our mapping of the region and our copy of its fd, gone. */
void vu__inflight_unmap(struct vu_server *s);
int vu__get_inflight_fd(struct vu_server *s, struct vu_msg *m);
int vu__set_inflight_fd(struct vu_server *s, struct vu_msg *m);

#endif
