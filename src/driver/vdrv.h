/*
 * vdrv_: a userspace virtio-blk *driver* over vhost-user: the frontend half
 * of the protocol plus the driver half of the virtqueue, split (virtio 1.2,
 * 2.7) or, with opts.packed, packed (2.8, vdrv_packed.c).  Used by
 * vblk-bench to drive any vhost-user-blk backend (vblkd, qemu-storage-daemon)
 * the same way, from the host, without a guest in the way, and by tests
 * (tests/unit/test_blk, tests/driver's hostile-shrink).  Not part of vblkd.
 *
 * Not implemented: dirty logging on packed rings (vdrv_connect refuses
 * both), in-flight tracking (INFLIGHT_SHMFD is never negotiated).
 *
 * Memory: one memfd shared with the backend holds the rings, indirect
 * tables and every buffer handed out by vdrv_alloc(); guest-physical
 * address = offset in that memfd.
 *
 * Threading: vdrv_connect/vdrv_close on one thread (the "connecting
 * thread": it alone uses the socket); afterwards each queue may be driven
 * by its own thread (queues share nothing but the memfd).  vdrv_alloc is
 * not thread-safe: allocate before starting threads.
 *
 * Dirty logging (live migration, seen from the frontend) is its own room:
 * driver/vdrv_log.h.
 */
#ifndef VBLK_VDRV_H
#define VBLK_VDRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "blk/virtio_blk.h"
#include "virtio/virtio_ring.h"

/* Descriptors in one request's indirect table. */
#define VDRV_MAX_SEGS 64

struct vdrv_opts {
	const char *socket;
	unsigned num_queues;	/* 1.. backend's GET_QUEUE_NUM */
	unsigned queue_size;	/* power of two, default 256 */
	size_t mem_bytes;	/* shared memory for vdrv_alloc, beyond rings */
	bool no_event_idx;	/* do not negotiate VIRTIO_RING_F_EVENT_IDX */
	bool packed;		/* packed rings (VIRTIO_F_RING_PACKED; vdrv_packed.c) */
	bool dirty_log;		/* prepare dirty logging (vdrv_log.h) */
};

struct vdrv_log;

struct vdrv_queue {
	struct vdrv *d;
	unsigned idx, num;
	struct vring_desc *desc;
	struct vring_avail *avail;
	struct vring_used *used;
	uint16_t *used_event;		/* &avail->ring[num] */
	uint16_t *avail_event;		/* &used->ring[num] */
	bool event_idx;

	uint16_t avail_idx;		/* next avail slot (shadow); packed: ring position */
	uint16_t kicked_idx;		/* avail_idx at our last kick decision */
	uint16_t last_used;		/* next used slot to read; packed: ring position */
	/* Packed rings only. */
	bool packed;
	bool avail_wrap, used_wrap;	/* our wrap counter, our copy of the device's */
	uint16_t *slots;		/* by id: ring descriptors the request took */
	unsigned slots_free;
	uint16_t added;			/* descriptors made available since the last kick */
	uint16_t *free_heads;		/* stack */
	unsigned nfree;
	void **cookies;			/* per head, NULL when free */
	struct vring_desc *ind;		/* num * VDRV_MAX_SEGS, in shared memory */
	int kick_fd, call_fd;
	bool stopped;			/* GET_VRING_BASE sent (connecting thread) */
	bool call_blocking;		/* vdrv_wait_read cleared O_NONBLOCK */

	/* Counters. */
	uint64_t kicks;			/* kick eventfd writes */
	uint64_t kicks_suppressed;	/* kick skipped: device asked not to */
	uint64_t calls;			/* call eventfd wake-ups we consumed */
	uint64_t bad_used;		/* device returned an id we did not give */
};

struct vdrv {
	int sock;
	uint64_t dev_features, features;
	uint64_t proto_features;
	struct virtio_blk_config cfg;	/* re-read by vdrv_wait_config_change */
	int backend_fd;			/* BACKEND_REQ channel, -1: none */
	unsigned max_queues;
	int memfd;
	uint8_t *mem;
	size_t mem_size, mem_used;
	unsigned num_queues;
	struct vdrv_queue *q;
	/* Dirty-log state (vdrv_log.h): set by vdrv_connect with
	 * opts.dirty_log, before any queue thread exists, and constant until
	 * vdrv_close; NULL otherwise.  Queue threads read it on every store
	 * they make to shared memory. */
	struct vdrv_log *log;
};

/*
 * Connect and set everything up (features, memory table, rings, eventfds).
 * Returns 0, or -errno with one line for the user in err.
 */
int vdrv_connect(const struct vdrv_opts *o, struct vdrv **out, char *err, size_t errlen);
/* Stop the rings still running (GET_VRING_BASE) and disconnect.
 * Connecting thread, after every queue thread has stopped. */
void vdrv_close(struct vdrv *d);

/*
 * Stop every ring with GET_VRING_BASE, staying connected (what a migration
 * source does before its last log sync: vhost-user "Migration", "Ring
 * states").  bases[i] (num_queues entries, may be NULL) receives queue i's
 * base: the backend's next avail index, equal to the queue's avail_idx
 * once it has completed everything it was given.  No queue operation may
 * follow.  Connecting thread, after every queue thread has stopped.
 * Returns 0, -EINVAL when a ring was already stopped, or -errno (the rings
 * answered so far stay stopped).
 */
int vdrv_stop_rings(struct vdrv *d, uint16_t *bases);

/* The device status byte (GET_STATUS; virtio 1.2, 2.1), e.g. to see
 * NEEDS_RESET.  -ENOTSUP when the backend has no STATUS protocol feature.
 * Connecting thread. */
int vdrv_get_status(struct vdrv *d, uint8_t *status);

/* Wait up to timeout_ms for the backend's CONFIG_CHANGE_MSG on the
 * backend channel (BACKEND_REQ; a resize), ack it if asked, and re-read
 * d->cfg.  Returns 1 (changed, d->cfg fresh), 0 (timeout), -ENOTSUP (no
 * backend channel) or -errno.  Connecting thread. */
int vdrv_wait_config_change(struct vdrv *d, int timeout_ms);

/* Shared memory the backend can access, aligned to align (power of 2).
 * NULL when exhausted. */
void *vdrv_alloc(struct vdrv *d, size_t len, size_t align);

/* Guest-physical address of p (inside the shared memory): its offset in
 * the memfd.  Any thread. */
static inline uint64_t vdrv_gpa(const struct vdrv *d, const void *p)
{
	return (uint64_t)((const uint8_t *)p - d->mem);
}

/* What part of vdrv's own ring memory holds gpa.  Split ring names: its
 * one user is dirty logging's check, which packed rings do not have. */
enum vdrv_area {
	VDRV_AREA_NONE,		/* not a ring: vdrv_alloc'ed buffers or unused */
	VDRV_AREA_DESC,		/* descriptor table */
	VDRV_AREA_AVAIL,	/* available ring (with used_event) */
	VDRV_AREA_USED,		/* used ring (with avail_event) */
	VDRV_AREA_INDIRECT,	/* indirect descriptor tables */
};

/*
 * Classify gpa: the area, its queue (*queue) and, inside the rings, the
 * field ("flags", "idx", "ring", "used_event", "avail_event"; NULL
 * elsewhere).  *end receives the first gpa past that area or field (for
 * NONE: the next area's start), so callers can walk a range in pieces.
 * Any thread.
 */
enum vdrv_area vdrv_area_of(const struct vdrv *d, uint64_t gpa, unsigned *queue,
			    const char **field, uint64_t *end);

static inline bool vdrv_has(const struct vdrv *d, unsigned bit)
{
	return d->features & (1ull << bit);
}

/* Device capacity in bytes and logical block size. */
uint64_t vdrv_capacity(const struct vdrv *d);
unsigned vdrv_block_size(const struct vdrv *d);

/*
 * Queue a request: out[] device-readable, then in[] device-writable, all
 * inside vdrv_alloc'ed memory.  Visible to the device at vdrv_kick().
 * Returns 0, -ENOSPC (ring full) or -EINVAL (too many segments / bad
 * buffer).  Queue's thread only.
 */
int vdrv_add(struct vdrv_queue *q, const struct iovec *out, unsigned nout,
	     const struct iovec *in, unsigned nin, void *cookie);

/* Publish added requests and kick unless the device suppressed it
 * (virtio 1.2, 2.7.10: avail_event with EVENT_IDX, else NO_NOTIFY; packed,
 * 2.8.10: the device event area). */
void vdrv_kick(struct vdrv_queue *q);

/* Next completed request's cookie (and bytes written), or NULL. */
void *vdrv_get(struct vdrv_queue *q, uint32_t *len);

/* Interrupt suppression, as Linux virtio_ring does it (2.7.7; packed:
 * the driver event area, 2.8.10). */
void vdrv_disable_cb(struct vdrv_queue *q);
/* Re-enable; returns true if completions arrived meanwhile (drain again). */
bool vdrv_enable_cb(struct vdrv_queue *q);
/* Completions pending (for polling; no barrier beyond the index read). */
bool vdrv_pending(struct vdrv_queue *q);

/* Sleep until the device signals the call eventfd or timeout_ms passes.
 * Returns 1 on a call, 0 on timeout, -errno on error. */
int vdrv_wait(struct vdrv_queue *q, int timeout_ms);

/* Sleep in a single read(2) of the call eventfd, as a driver's interrupt
 * handler wakes its waiter, without poll(2) first: one system call per
 * wait instead of two.  There is no timeout: another thread ends a wait
 * with vdrv_poke().  Returns 1 if the device called, 0 if only a poke
 * ended the wait, -errno on error.  The first call makes the call eventfd
 * blocking (the device's writes never wait on it: eventfd(2)). */
int vdrv_wait_read(struct vdrv_queue *q);
/* End a vdrv_wait_read() from another thread without counting a call. */
int vdrv_poke(struct vdrv_queue *q);

/* Requests in flight on a queue. */
static inline unsigned vdrv_inflight(const struct vdrv_queue *q)
{
	return q->num - q->nfree;
}

#endif
