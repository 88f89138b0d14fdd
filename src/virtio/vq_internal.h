/*
 * Inside vq_, not part of its contract (vq.h): what the split
 * (vq_split.c) and packed (vq_packed.c) halves share (vq_common.c and the
 * inlines below), and the halves' start functions the face (vq.c) calls.
 */
#ifndef VBLK_VQ_INTERNAL_H
#define VBLK_VQ_INTERNAL_H

#include <errno.h>

#include "util/compiler.h"
#include "virtio/vq.h"

/* vq_common.c, below both halves (and vq_set_broken, vq.h). */
/* A request fails (logged once per queue). */
void vq_bad_chain(struct vq *vq, const char *why, uint16_t head);
/* Sort vq->resubmit[0..n) oldest first. */
void vq_resubmit_sort(struct vq *vq, unsigned n);

/*
 * One buffer of a request: translated into guest memory and appended to
 * e->iov.  The first reason the request must fail is kept in *err (outside
 * guest memory, readable after writable, too many buffers); after it the
 * walk goes on, so the caller still finds the chain's end, but nothing
 * more is added.
 */
static inline void vq_add_buf(struct vq *vq, struct vq_elem *e, uint64_t addr, uint32_t len,
			      bool write, unsigned *niov, bool *seen_write, const char **err)
{
	void *host = NULL;

	if (len) {
		host = gm_gpa_to_host(vq->mem, addr, len);
		if (unlikely(!host) && !*err)
			*err = "buffer outside guest memory";
	}
	if (write) {
		*seen_write = true;
		e->in_len += len;
	} else {
		if (unlikely(*seen_write) && !*err)
			*err = "device-readable buffer after a writable one";
		e->out_len += len;
	}
	if (host && !*err) {
		if (unlikely(*niov == VQ_MAX_SEGS)) {
			*err = "too many descriptors in one request";
		} else {
			e->iov[*niov].iov_base = host;
			e->iov[*niov].iov_len = len;
			(*niov)++;
			if (write)
				e->in_num++;
			else
				e->out_num++;
		}
	}
}

/*
 * The end of a walk.  The used ring reports bytes written in 32 bits, so
 * a larger request fails too.  A failed request gets last_byte (its final
 * buffer, if writable and in guest memory: where a device can still put
 * an error status) and is logged.  Returns 1 or -EINVAL.
 */
static inline int vq_walk_end(struct vq *vq, struct vq_elem *e, const char *err,
			      uint64_t last_addr, uint32_t last_len, bool last_write)
{
	if (!err && unlikely(e->in_len > UINT32_MAX))
		err = "request larger than 4 GiB";
	if (unlikely(err)) {
		if (last_write && last_len) {
			uint8_t *p = gm_gpa_to_host(vq->mem, last_addr, last_len);

			if (p)
				e->last_byte = p + last_len - 1;
		}
		vq_bad_chain(vq, err, e->head);
		return -EINVAL;
	}
	return 1;
}

/* vq_init's second half, per format (vq_split.c, vq_packed.c): translate
 * and check the ring's parts, set the format's state, take over an
 * in-flight region.  vq is zeroed, its index set, num checked.  Returns
 * 0, -EINVAL or -ENOMEM.  The per-request halves are declared in vq.h,
 * whose inline entry points call them. */
int vqs_init(struct vq *vq, const struct vq_config *cfg, const struct gm_table *mem);
int vqp_init(struct vq *vq, const struct vq_config *cfg, const struct gm_table *mem);

#endif
