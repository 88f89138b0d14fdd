/*
 * Shared between the files of src/driver only: the message helpers of
 * vdrv.c and the dirty-log state's life cycle in vdrv_log.c.  Connecting
 * thread only, like the socket they use.
 */
#ifndef VBLK_VDRV_INTERNAL_H
#define VBLK_VDRV_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "driver/vdrv.h"
#include "vhost/vhost_user.h"

/* Send one message (need_reply sets NEED_REPLY) with nfds fds.
 * Returns 0 or -errno. */
int vdrv__send(struct vdrv *d, uint32_t req, bool need_reply, const void *payload,
	       uint32_t size, const int *fds, unsigned nfds);
/* Read the reply to req, at most size payload bytes.  Returns the payload
 * bytes or -errno (-EPROTO: not a reply to req, or too long). */
int vdrv__recv(struct vdrv *d, uint32_t req, void *payload, uint32_t size);
/* Send, and with REPLY_ACK wait for the ack.  Returns 0, -EREMOTEIO when
 * the backend refused, or -errno. */
int vdrv__call(struct vdrv *d, uint32_t req, const void *payload, uint32_t size,
	       const int *fds, unsigned nfds);

/* [p, p+len) lies in the shared memory. */
static inline bool vdrv_in_mem(const struct vdrv *d, const void *p, size_t len)
{
	const uint8_t *b = p;

	return b >= d->mem && len <= d->mem_size && (size_t)(b - d->mem) <= d->mem_size - len;
}

/* Packed rings (vdrv_packed.c): the queue operations of vdrv.h when
 * q->packed.  Queue's thread. */
int vdrv__packed_add(struct vdrv_queue *q, const struct iovec *out, unsigned nout,
		     const struct iovec *in, unsigned nin, void *cookie);
void vdrv__packed_kick(struct vdrv_queue *q);
bool vdrv__packed_pending(struct vdrv_queue *q);
void *vdrv__packed_get(struct vdrv_queue *q, uint32_t *len);
void vdrv__packed_disable_cb(struct vdrv_queue *q);
bool vdrv__packed_enable_cb(struct vdrv_queue *q);

/* The SET_VRING_ADDR payload of q, with VHOST_VRING_F_LOG when log. */
void vdrv__vring_addr(const struct vdrv_queue *q, bool log, struct vhost_vring_addr *a);

/* Dirty-log state for d (d->mem mapped): the bitmap memfd and the shadow,
 * in *out.  Returns 0 or -errno. */
int vdrv__log_new(struct vdrv *d, struct vdrv_log **out);
void vdrv__log_free(struct vdrv_log *l);

#endif
