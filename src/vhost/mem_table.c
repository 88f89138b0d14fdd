/*
 * Guest memory, written from qemu docs/interop/vhost-user.rst "Memory
 * access" and, for ADD_MEM_REG / REM_MEM_REG, the CONFIGURE_MEM_SLOTS
 * messages of "Front-end message types": the frontend's table of memory
 * regions, each mapped from the fd it sent.  Rings only ever see a whole
 * table: a change stops them, swaps the table and restarts them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mem/gm.h"
#include "util/log.h"
#include "vhost/vu_internal.h"

/* Rings that are running stop (draining their I/O), switch and restart,
 * so no request ever sees a half-changed table.  Old regions that are not
 * in the new table are unmapped afterwards. */
int vu__mem_replace(struct vu_server *s, struct gm_table *nt)
{
	struct gm_table *old = s->mem;
	bool restart[VU_MAX_QUEUES];
	int r = 0;

	for (unsigned i = 0; i < s->nqueues; i++) {
		restart[i] = s->vr[i].started;
		vu__vring_stop(s, i);
	}
	s->mem = nt;
	if (old) {
		/* Unmap regions the new table does not carry over. */
		for (unsigned i = 0; i < old->nregions; i++) {
			bool kept = false;

			for (unsigned j = 0; nt && j < nt->nregions; j++)
				kept |= nt->r[j].mmap_addr == old->r[i].mmap_addr;
			if (!kept)
				gm_region_unmap(&old->r[i]);
		}
		free(old);
	}
	for (unsigned i = 0; i < s->nqueues; i++)
		if (restart[i] && (r = vu__vring_start(s, i)) < 0)
			break;
	if (r == 0 && nt && !vu__log_covers(s))
		r = -ERANGE;
	return r;
}

int vu__get_max_mem_slots(struct vu_server *s, struct vu_msg *m)
{
	m->p.u64 = GM_MAX_REGIONS;
	m->hdr.size = sizeof(m->p.u64);
	return VU_REPLY;
}

static int map_region(const struct vhost_user_mem_region *d, int fd,
		      struct gm_region *r)
{
	int ret = gm_region_map(r, d->guest_phys_addr, d->memory_size,
				d->userspace_addr, d->mmap_offset, fd);

	if (ret < 0)
		log_err("cannot map guest memory region gpa 0x%llx size 0x%llx "
			"offset 0x%llx: %s", (unsigned long long)d->guest_phys_addr,
			(unsigned long long)d->memory_size,
			(unsigned long long)d->mmap_offset, strerror(-ret));
	return ret;
}

int vu__set_mem_table(struct vu_server *s, struct vu_msg *m)
{
	const struct vhost_user_memory *mem = &m->p.memory;
	struct gm_table *nt;
	uint32_t n;

	if (m->hdr.size < offsetof(struct vhost_user_memory, regions))
		return VU_MALFORMED;
	n = mem->nregions;
	if (n == 0 || n > VHOST_USER_MEMORY_BASELINE_NREGIONS ||
	    m->hdr.size != offsetof(struct vhost_user_memory, regions) +
			   n * sizeof(struct vhost_user_mem_region) ||
	    m->nfds != n) {
		log_err("SET_MEM_TABLE: %u regions, %u bytes, %u fds do not match",
			n, m->hdr.size, m->nfds);
		return VU_MALFORMED;
	}
	nt = calloc(1, sizeof(*nt));
	if (!nt)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		struct gm_region r;
		int ret = map_region(&mem->regions[i], m->fds[i], &r);

		if (ret == 0 && (ret = gm_table_add(nt, &r)) < 0) {
			log_err("SET_MEM_TABLE: region %u overlaps another", i);
			gm_region_unmap(&r);
		}
		if (ret < 0) {
			gm_table_clear(nt);
			free(nt);
			return VU_MALFORMED;
		}
	}
	log_info("memory table: %u regions", n);
	return vu__mem_replace(s, nt);
}

int vu__add_mem_reg(struct vu_server *s, struct vu_msg *m)
{
	struct gm_table *nt = calloc(1, sizeof(*nt));
	struct gm_region r;
	int ret;

	if (!nt)
		return -ENOMEM;
	if (s->mem)
		*nt = *s->mem;
	if (map_region(&m->p.mem_reg.region, m->fds[0], &r) < 0) {
		free(nt);
		return VU_MALFORMED;
	}
	ret = gm_table_add(nt, &r);
	if (ret < 0) {
		log_err("ADD_MEM_REG: %s", ret == -ENOSPC ? "no free memory slot" :
			"region overlaps an existing one");
		gm_region_unmap(&r);
		free(nt);
		return VU_MALFORMED;
	}
	return vu__mem_replace(s, nt);
}

int vu__rem_mem_reg(struct vu_server *s, struct vu_msg *m)
{
	const struct vhost_user_mem_region *d = &m->p.mem_reg.region;
	struct gm_table *nt;
	bool found = false;

	/* Identified by guest address, user address and size; the offset
	 * is ignored (spec, REM_MEM_REG). */
	if (!s->mem)
		return VU_MALFORMED;
	nt = calloc(1, sizeof(*nt));
	if (!nt)
		return -ENOMEM;
	for (unsigned i = 0; i < s->mem->nregions; i++) {
		const struct gm_region *o = &s->mem->r[i];

		if (!found && o->gpa == d->guest_phys_addr && o->qva == d->userspace_addr &&
		    o->size == d->memory_size)
			found = true;
		else
			nt->r[nt->nregions++] = *o;
	}
	if (!found) {
		log_err("REM_MEM_REG: no region at gpa 0x%llx",
			(unsigned long long)d->guest_phys_addr);
		free(nt);
		return VU_MALFORMED;
	}
	return vu__mem_replace(s, nt);
}
