/*
 * The face of vq_ (vq.h) that is not per request: a ring's start and
 * stop, the base GET_VRING_BASE reports, and its dirty logging switched.
 * Which format a ring has is decided here and in vq.h's inline entry
 * points, the only places that branch on vq->packed; below them are the
 * split (vq_split.c) and packed (vq_packed.c) halves, and below both what
 * they share (vq_common.c).  Calls go down only.
 */
#include "virtio/vq_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int vq_init(struct vq *vq, const struct vq_config *cfg, const struct gm_table *mem)
{
	unsigned num = cfg->num;
	int r;

	memset(vq, 0, sizeof(*vq));
	vq->index = cfg->index;
	if (num == 0 || num > VRING_MAX_NUM || (num & (num - 1)))
		return -EINVAL;
	r = cfg->packed ? vqp_init(vq, cfg, mem) : vqs_init(vq, cfg, mem);
	if (r == 0)
		vq_set_log(vq, &cfg->log);
	return r;
}

uint32_t vq_base(const struct vq *vq)
{
	if (!vq->packed)
		return vq->last_avail_idx;
	return (uint32_t)(vq->last_avail_idx | (vq->avail_wrap ? 0x8000 : 0)) |
	       (uint32_t)(vq->used_idx | (vq->used_wrap ? 0x8000 : 0)) << 16;
}

void vq_release(struct vq *vq)
{
	free(vq->chain_len);
	vq->chain_len = NULL;
	free(vq->resubmit);
	vq->resubmit = NULL;
	vq->resubmit_n = vq->resubmit_i = 0;
}

/* ---- Dirty logging (vhost-user.rst "Migration") ---- */

void vq_set_log(struct vq *vq, const struct vq_log *lg)
{
	vq_log_kick(vq);
	vq->log = *lg;
	if (!vq->log.log)
		vq->log.used = false;
	/* Entries pushed before now were stored before logging began. */
	vq->log_used_idx = vq->used_idx;
}

void vq_log_kick(struct vq *vq)
{
	if (vq->log_kick && vq->log.log)
		gm_dirty_kick(vq->log.log);
	vq->log_kick = false;
}
