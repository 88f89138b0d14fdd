#include "mem/gm.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"

/* [a, a+alen) and [b, b+blen) intersect; lengths are nonzero and the
 * ranges were checked not to wrap. */
static int ranges_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	return a < b + blen && b < a + alen;
}

int gm_region_map(struct gm_region *r, uint64_t gpa, uint64_t size,
		  uint64_t qva, uint64_t mmap_offset, int fd)
{
	struct stat st;
	uint64_t end;
	void *p;

	memset(r, 0, sizeof(*r));
	r->fd = -1;
	if (size == 0 || gpa + size < gpa || qva + size < qva ||
	    __builtin_add_overflow(mmap_offset, size, &end) || end > SIZE_MAX)
		return -EINVAL;
	if (fstat(fd, &st) < 0)
		return -errno;
	/* A mapping past the end of a regular file faults with SIGBUS on
	 * access: refuse it up front.  (Block/char devices report 0.) */
	if (S_ISREG(st.st_mode) && (uint64_t)st.st_size < end)
		return -EINVAL;
	p = mmap(NULL, (size_t)end, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	/* The size is checked, but the frontend may shrink the file later. */
	if (gm_guard_add(p, (size_t)end) < 0) {
		munmap(p, (size_t)end);
		return -ENOSPC;
	}
	r->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (r->fd < 0) {
		int e = -errno;

		gm_guard_del(p);
		munmap(p, (size_t)end);
		return e;
	}
	r->gpa = gpa;
	r->size = size;
	r->qva = qva;
	r->mmap_offset = mmap_offset;
	r->mmap_addr = p;
	r->mmap_size = (size_t)end;
	r->host = (uint8_t *)p + mmap_offset;
	return 0;
}

void gm_region_unmap(struct gm_region *r)
{
	if (r->mmap_addr) {
		gm_guard_del(r->mmap_addr);
		munmap(r->mmap_addr, r->mmap_size);
		if (r->fd >= 0)
			close(r->fd);
	}
	memset(r, 0, sizeof(*r));
	r->fd = -1;
}

int gm_table_add(struct gm_table *t, const struct gm_region *r)
{
	if (t->nregions >= GM_MAX_REGIONS)
		return -ENOSPC;
	for (unsigned i = 0; i < t->nregions; i++) {
		const struct gm_region *o = &t->r[i];

		if (ranges_overlap(o->gpa, o->size, r->gpa, r->size) ||
		    ranges_overlap(o->qva, o->size, r->qva, r->size))
			return -EEXIST;
	}
	t->r[t->nregions++] = *r;
	return 0;
}

void gm_table_clear(struct gm_table *t)
{
	for (unsigned i = 0; i < t->nregions; i++)
		gm_region_unmap(&t->r[i]);
	t->nregions = 0;
}

/* The region holding [addr, addr+len) in the address space whose start
 * field is at byte offset `field` of struct gm_region (gpa or qva). */
static void *gm_lookup(const struct gm_table *t, uint64_t addr, uint64_t len, size_t field)
{
	if (len == 0)
		len = 1;
	for (unsigned i = 0; i < t->nregions; i++) {
		const struct gm_region *r = &t->r[i];
		uint64_t start, off;

		memcpy(&start, (const char *)r + field, sizeof(start));
		if (addr < start)
			continue;
		off = addr - start;
		if (off >= r->size)
			continue;
		/* Written as a subtraction so addr + len cannot overflow. */
		if (len > r->size - off)
			return NULL;
		return r->host + off;
	}
	return NULL;
}

void *gm_gpa_to_host(const struct gm_table *t, uint64_t gpa, uint64_t len)
{
	return gm_lookup(t, gpa, len, offsetof(struct gm_region, gpa));
}

void *gm_qva_to_host(const struct gm_table *t, uint64_t qva, uint64_t len)
{
	return gm_lookup(t, qva, len, offsetof(struct gm_region, qva));
}

uint64_t gm_host_to_gpa(const struct gm_table *t, const void *p, uint64_t len)
{
	uintptr_t a = (uintptr_t)p;

	if (len == 0)
		len = 1;
	for (unsigned i = 0; i < t->nregions; i++) {
		const struct gm_region *r = &t->r[i];
		uintptr_t start = (uintptr_t)r->host, off;

		if (a < start)
			continue;
		off = a - start;
		if (off >= r->size)
			continue;
		if (len > r->size - off)
			return UINT64_MAX;
		return r->gpa + off;
	}
	return UINT64_MAX;
}
