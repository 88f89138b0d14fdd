/*
 * gm_: guest memory.  An immutable table of regions shared by the frontend
 * (SET_MEM_TABLE / ADD_MEM_REG), each mmap'ed once.  Every guest address we
 * touch goes through gm_gpa_to_host()/gm_qva_to_host(), which check the
 * whole range [addr, addr+len) against one region, overflow included.
 *
 * Threading: a table is built and unmapped by the main thread and never
 * changed while published; iothreads get a pointer to it through a
 * loop_call_sync() handoff and only read it.
 */
#ifndef VBLK_GM_H
#define VBLK_GM_H

#include <stddef.h>
#include <stdint.h>

/* As many as QEMU may ask for (its VHOST_USER_MAX_RAM_SLOTS is 512 and it
 * refuses a backend whose limit is below the slots in use). */
#define GM_MAX_REGIONS 509

struct gm_region {
	uint64_t gpa;		/* guest physical start */
	uint64_t size;
	uint64_t qva;		/* frontend's virtual address of gpa */
	uint64_t mmap_offset;	/* offset of gpa's page in the fd */
	void *mmap_addr;	/* our mapping, from fd offset 0 */
	size_t mmap_size;
	uint8_t *host;		/* mmap_addr + mmap_offset */
	/* Our own copy of the frontend's fd (close-on-exec), valid while
	 * mapped: an upgrade in place hands it to the next process. */
	int fd;
};

struct gm_table {
	unsigned nregions;
	struct gm_region r[GM_MAX_REGIONS];
};

/*
 * Map a region described by the frontend.  Validates sizes and offsets
 * (no overflow, fd large enough so access can never SIGBUS on a short file)
 * and mmaps fd shared read/write.  Does not take ownership of fd: keeps a
 * duplicate in r->fd, closed by gm_region_unmap.
 * Returns 0 or -errno (-EINVAL for a malformed description).
 */
int gm_region_map(struct gm_region *r, uint64_t gpa, uint64_t size,
		  uint64_t qva, uint64_t mmap_offset, int fd);
void gm_region_unmap(struct gm_region *r);

/* Add a mapped region to a table, rejecting overlaps in guest physical or
 * frontend virtual space and a full table.  Returns 0 or -errno. */
int gm_table_add(struct gm_table *t, const struct gm_region *r);
/* Unmap every region and empty the table. */
void gm_table_clear(struct gm_table *t);

/* Host pointer for guest-physical [gpa, gpa+len) if it lies wholly inside
 * one region, else NULL.  len 0 is treated as 1.  Any thread. */
void *gm_gpa_to_host(const struct gm_table *t, uint64_t gpa, uint64_t len);
/* Same for a frontend virtual address (vring addresses are given so). */
void *gm_qva_to_host(const struct gm_table *t, uint64_t qva, uint64_t len);
/* The reverse, for dirty logging: the guest-physical address of host
 * [p, p+len) if it lies wholly inside one region's mapping, else
 * UINT64_MAX.  Any thread. */
uint64_t gm_host_to_gpa(const struct gm_table *t, const void *p, uint64_t len);

/*
 * SIGBUS guard (guard.c).  The frontend keeps the fds of the memory it
 * shares with us and may shrink them after we mapped them; touching a page
 * past the new end raises SIGBUS.  gm_guard_init() installs a handler
 * (once per process) and returns an eventfd that becomes readable after
 * such a fault: the page was replaced by a private zero page (the access
 * completes, reads zeroes, writes go nowhere) and the caller should drop
 * the frontend.  A SIGBUS outside guarded ranges still kills the process.
 * Returns the eventfd or -errno.  Main thread, before iothreads touch
 * guest memory.
 *
 * gm_region_map/unmap guard their mappings themselves; other mappings of
 * frontend fds (the in-flight region) use gm_guard_add/del.  Any thread;
 * add returns -ENOSPC when the table of ranges is full.
 */
int gm_guard_init(void);
int gm_guard_add(void *addr, size_t len);
void gm_guard_del(void *addr);
/* Faults the guard has absorbed since start. */
uint64_t gm_guard_faults(void);

#endif
