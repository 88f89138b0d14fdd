/*
 * Shared between the files of src/driver only: the message helpers of
 * vdrv.c and the dirty-log state's life cycle in vdrv_log.c.  Connecting
 * thread only, like the socket they use.
 */
#ifndef VBLK_VDRV_INTERNAL_H
#define VBLK_VDRV_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

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

/* The SET_VRING_ADDR payload of q, with VHOST_VRING_F_LOG when log. */
void vdrv__vring_addr(const struct vdrv_queue *q, bool log, struct vhost_vring_addr *a);

/* Dirty-log state for d (d->mem mapped): the bitmap memfd and the shadow,
 * in *out.  Returns 0 or -errno. */
int vdrv__log_new(struct vdrv *d, struct vdrv_log **out);
void vdrv__log_free(struct vdrv_log *l);

#endif
