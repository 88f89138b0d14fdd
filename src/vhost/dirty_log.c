/*
 * Dirty logging, written from qemu docs/interop/vhost-user.rst
 * "Migration": while LOG_ALL is acked the rings mark every page of guest
 * memory they write, and each used ring with VHOST_VRING_F_LOG, in the
 * frontend's log (SET_LOG_BASE, LOG_SHMFD), and signal SET_LOG_FD's
 * eventfd.  The marking itself is the rings' (vq_log, mem/dirty.h); here
 * is which log each ring has, switched between two of its batches.
 */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "mem/dirty.h"
#include "util/log.h"
#include "util/sys.h"
#include "vhost/vu_internal.h"

bool vu__logging(const struct vu_server *s)
{
	return s->log && (s->acked & (1ull << VHOST_F_LOG_ALL));
}

void vu__vring_log(const struct vu_server *s, const struct vu_vring *vr,
		   struct vq_log *lg)
{
	memset(lg, 0, sizeof(*lg));
	if (!vu__logging(s))
		return;
	lg->log = s->log;
	lg->used = vr->log_used;
	lg->used_gpa = vr->log_addr;
}

/* Hand every running ring its logging state (after any change). */
static void publish(struct vu_server *s)
{
	for (unsigned i = 0; i < s->nqueues; i++) {
		struct vq_log lg;

		if (!s->vr[i].started)
			continue;
		vu__vring_log(s, &s->vr[i], &lg);
		s->ops->queue_set_log(s->dev, i, &lg);
	}
}

/*
 * With logging on, the log must cover every address we may store to: all
 * guest memory, and each logged used ring at its log address ("the bit
 * offset of the last byte of the ring must fall within the size supplied
 * by VhostUserLog").  Logs what does not fit; returns false then.  Marks
 * outside the log are still never made (dirty.h), only counted.
 */
bool vu__log_covers(struct vu_server *s)
{
	bool ok = true;

	if (!vu__logging(s))
		return true;
	for (unsigned i = 0; s->mem && i < s->mem->nregions; i++) {
		const struct gm_region *r = &s->mem->r[i];

		if (!gm_dirty_covers(s->log, r->gpa, r->size)) {
			log_err("dirty log of %llu bytes does not cover guest memory at "
				"0x%llx-0x%llx: writes there cannot be logged",
				(unsigned long long)s->log->size, (unsigned long long)r->gpa,
				(unsigned long long)(r->gpa + r->size - 1));
			ok = false;
		}
	}
	for (unsigned i = 0; i < s->nqueues; i++) {
		const struct vu_vring *vr = &s->vr[i];

		/* Packed rings log their stores at their own addresses
		 * (vq_packed.c), inside guest memory, checked above. */
		if (vr->log_used && vr->num && !vu__packed(s) &&
		    !gm_dirty_covers(s->log, vr->log_addr, vring_used_bytes(vr->num))) {
			log_err("dirty log of %llu bytes does not cover ring %u's used ring "
				"log address 0x%llx", (unsigned long long)s->log->size, i,
				(unsigned long long)vr->log_addr);
			ok = false;
		}
	}
	return ok;
}

/* Spec "Migration": the frontend turns logging on and off with
 * SET_FEATURES while the rings run. */
int vu__log_all_changed(struct vu_server *s)
{
	int r = 0;

	if ((s->acked & (1ull << VHOST_F_LOG_ALL)) && !s->log) {
		log_err("frontend turned dirty logging on without a log "
			"(SET_LOG_BASE): device writes cannot be logged");
		r = -EINVAL;
	} else if (!vu__log_covers(s)) {
		r = -ERANGE;
	}
	publish(s);
	log_info("dirty logging %s", vu__logging(s) ? "on" : "off");
	return r;
}

void vu__log_reset(struct vu_server *s)
{
	gm_dirty_unmap(s->log);
	s->log = NULL;
	sys_close(&s->log_call_fd);
}

/* SET_LOG_BASE with LOG_SHMFD: the log arrives as an fd with its size
 * and offset.  A new log replaces the old one: every ring switches over
 * before we unmap the old one and answer, so once the frontend has our
 * reply nothing is marked in the old log any more (it may then read it a
 * last time and free it).  Spec "Communication": this message has a
 * reply with LOG_SHMFD; u64 0 is success. */
int vu__set_log_base(struct vu_server *s, struct vu_msg *m)
{
	struct gm_dirty_log *old = s->log, *nl;
	int r;

	if (!vu__has_proto(s, VHOST_USER_PROTOCOL_F_LOG_SHMFD)) {
		log_err("SET_LOG_BASE without LOG_SHMFD (a log in the frontend's own "
			"address space) is not supported");
		return -ENOTSUP;
	}
	if (m->hdr.size != sizeof(m->p.log) || m->nfds != 1) {
		log_err("SET_LOG_BASE: %u bytes, %u fds (want %zu bytes, 1 fd)",
			m->hdr.size, m->nfds, sizeof(m->p.log));
		return VU_MALFORMED;
	}
	r = gm_dirty_map(m->fds[0], m->p.log.mmap_size, m->p.log.mmap_offset, &nl);
	if (r == 0) {
		atomic_store(&nl->call_fd, s->log_call_fd);
		s->log = nl;
		publish(s);
		gm_dirty_unmap(old);
		log_info("dirty log: %llu bytes (guest memory below %llu MiB)",
			 (unsigned long long)nl->size,
			 (unsigned long long)(nl->size * 8 * VHOST_LOG_PAGE >> 20));
		if (!vu__log_covers(s))
			r = -ERANGE;
	}
	m->p.u64 = r < 0;
	m->hdr.size = sizeof(m->p.u64);
	return VU_REPLY;
}

/* SET_LOG_FD: an eventfd we signal after marking the log (at the end of
 * a batch).  No fd (the NOFD convention of SET_VRING_CALL) stops it. */
int vu__set_log_fd(struct vu_server *s, struct vu_msg *m)
{
	int old = s->log_call_fd;

	if (m->nfds > 1 || (m->nfds && vu__check_eventfd(m, "SET_LOG_FD") < 0))
		return VU_MALFORMED;
	s->log_call_fd = m->nfds ? vu__take_fd(m, 0) : -1;
	if (s->log) {
		/* Rings read the fd at each kick: republishing waits for every
		 * ring to be between batches, after which none uses old. */
		atomic_store(&s->log->call_fd, s->log_call_fd);
		publish(s);
	}
	sys_close(&old);
	return 0;
}
