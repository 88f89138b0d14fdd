/*
 * What both ring formats' halves (vq_split.c, vq_packed.c) share, below
 * them: a queue broken, a request failed, the order requests left in
 * flight come back in.  Calls nothing else in src/virtio, so the halves
 * never call up into the face (vq.c) nor into each other.
 */
#include "virtio/vq_internal.h"

#include <stdlib.h>

#include "util/barrier.h"
#include "util/log.h"

void vq_set_broken(struct vq *vq, const char *why)
{
	if (!vq->broken)
		log_err("queue %u: %s; queue stopped until the driver resets it",
			vq->index, why);
	WRITE_ONCE(vq->broken, true);
}

void vq_bad_chain(struct vq *vq, const char *why, uint16_t head)
{
	vq->bad_chains++;
	log_once(vq->logged_bad_chain, LOG_WARN,
		 "queue %u: request %u failed: %s (further bad requests on "
		 "this queue are not logged)", vq->index, head, why);
}

static int cmp_counter(const void *a, const void *b)
{
	uint64_t ca = ((const struct vq_resubmit *)a)->counter;
	uint64_t cb = ((const struct vq_resubmit *)b)->counter;

	return ca < cb ? -1 : ca > cb;
}

/* On our own copy: a comparator that read the frontend's region could
 * answer differently from one call to the next, which qsort does not
 * allow. */
void vq_resubmit_sort(struct vq *vq, unsigned n)
{
	qsort(vq->resubmit, n, sizeof(*vq->resubmit), cmp_counter);
}
