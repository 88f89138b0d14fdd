/*
 * The in-flight region, written from qemu docs/interop/vhost-user.rst
 * "Inflight I/O tracking" (INFLIGHT_SHMFD): shared memory, one part per
 * ring, in which the rings mark the requests they took until they are
 * returned, so that after a crash or restart the next backend resubmits
 * them (vq.h).  We make it (GET_INFLIGHT_FD) or take back what a previous
 * backend left (SET_INFLIGHT_FD); the frontend keeps it across our
 * restarts.  The marking is the rings'; here is the region's life.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mem/gm.h"
#include "util/log.h"
#include "util/sys.h"
#include "vhost/vu_internal.h"

void vu__inflight_unmap(struct vu_server *s)
{
	if (s->inflight) {
		gm_guard_del(s->inflight);
		munmap(s->inflight, s->inflight_size);
	}
	s->inflight = NULL;
	s->inflight_size = 0;
	s->inflight_offset = 0;
	sys_close(&s->inflight_fd);
}

static bool desc_ok(struct vu_server *s, const struct vhost_user_inflight *in)
{
	unsigned qs = in->queue_size;

	if (in->num_queues == 0 || in->num_queues > s->nqueues || qs == 0 ||
	    qs > VRING_MAX_NUM || (qs & (qs - 1))) {
		log_err("%s: %u queues of %u entries (we have %u queues; sizes are "
			"powers of two <= %u)", "in-flight region", in->num_queues, qs,
			s->nqueues, VRING_MAX_NUM);
		return false;
	}
	return true;
}

/* A ring whose size is not the region's runs untracked (logged). */
void vu__inflight_ring(const struct vu_server *s, unsigned idx, struct vq_config *cfg)
{
	const struct vu_vring *vr = &s->vr[idx];

	if (!s->inflight)
		return;
	if (idx < s->inflight_queues && vr->num == s->inflight_qsize) {
		cfg->inflight = (struct vq_inflight_region *)(s->inflight +
			idx * s->inflight_stride);
		cfg->inflight_packed_room = s->inflight_stride >=
			vq_inflight_region_size_packed(vr->num);
	} else
		log_warn("ring %u: size %u does not match the in-flight region "
			 "(%u queues of %u); not tracked", idx, vr->num,
			 s->inflight_queues, s->inflight_qsize);
}

/* The frontend asks us for a fresh region; we create and share it. */
int vu__get_inflight_fd(struct vu_server *s, struct vu_msg *m)
{
	struct vhost_user_inflight *in = &m->p.inflight;
	uint64_t size;
	void *p;
	int fd;

	if (!desc_ok(s, in) || vu__rings_running(s))
		return VU_MALFORMED;
	size = in->num_queues * vq_inflight_region_size_packed(in->queue_size);
	fd = memfd_create("vblkd-inflight", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0 ||
	    (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		int r = -errno;

		close(fd);
		return r;
	}
	/* The region's size is ours to keep: no one may shrink it.  (Guarded
	 * all the same: a failed seal would leave it shrinkable.) */
	(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
	(void)gm_guard_add(p, size);
	vu__inflight_unmap(s);
	s->inflight = p;
	s->inflight_size = size;
	s->inflight_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	s->inflight_queues = in->num_queues;
	s->inflight_qsize = in->queue_size;
	s->inflight_stride = vq_inflight_region_size_packed(in->queue_size);
	in->mmap_size = size;
	in->mmap_offset = 0;
	m->hdr.size = sizeof(*in);
	m->reply_fd = fd;
	log_info("in-flight region: %u queues of %u entries (%llu bytes)",
		 in->num_queues, in->queue_size, (unsigned long long)size);
	return VU_REPLY;
}

/* The frontend hands us the region (after a reconnect: what the previous
 * backend left in it). */
int vu__set_inflight_fd(struct vu_server *s, struct vu_msg *m)
{
	const struct vhost_user_inflight *in = &m->p.inflight;
	uint64_t need, end;
	struct stat st;
	void *p;

	if (!desc_ok(s, in) || vu__rings_running(s))
		return VU_MALFORMED;
	need = in->num_queues * vq_inflight_region_size(in->queue_size);
	if (in->mmap_size < need || __builtin_add_overflow(in->mmap_offset, in->mmap_size, &end) ||
	    (in->mmap_offset & 4095) || fstat(m->fds[0], &st) < 0 ||
	    (S_ISREG(st.st_mode) && (uint64_t)st.st_size < end)) {
		log_err("SET_INFLIGHT_FD: region of %llu bytes at %llu does not fit "
			"(need %llu)", (unsigned long long)in->mmap_size,
			(unsigned long long)in->mmap_offset, (unsigned long long)need);
		return VU_MALFORMED;
	}
	p = mmap(NULL, in->mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fds[0],
		 (off_t)in->mmap_offset);
	if (p == MAP_FAILED)
		return -errno;
	/* The frontend owns this fd and may shrink it later. */
	if (gm_guard_add(p, in->mmap_size) < 0) {
		munmap(p, in->mmap_size);
		return -ENOSPC;
	}
	vu__inflight_unmap(s);
	s->inflight = p;
	s->inflight_size = in->mmap_size;
	s->inflight_fd = vu__take_fd(m, 0);
	s->inflight_offset = in->mmap_offset;
	s->inflight_queues = in->num_queues;
	s->inflight_qsize = in->queue_size;
	/* Ours (GET_INFLIGHT_FD) has packed room; an older vblkd's region
	 * is the split size per queue. */
	s->inflight_stride = in->mmap_size >= in->num_queues *
			     vq_inflight_region_size_packed(in->queue_size) ?
			     vq_inflight_region_size_packed(in->queue_size) :
			     vq_inflight_region_size(in->queue_size);
	log_info("in-flight region from the frontend: %u queues of %u entries",
		 in->num_queues, in->queue_size);
	return 0;
}
