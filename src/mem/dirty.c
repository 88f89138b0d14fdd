/* The frontend's dirty log (see dirty.h). */
#include "mem/dirty.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"
#include "util/sys.h"

/* A log covers 32768 pages (128 MiB of guest memory) per KiB: 1 GiB of
 * log describes 4 PiB.  Anything larger is not a log. */
#define GM_DIRTY_MAX_BYTES (1ull << 30)

int gm_dirty_map(int fd, uint64_t size, uint64_t offset, struct gm_dirty_log **out)
{
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), start, end, len;
	struct gm_dirty_log *l;
	struct stat st;
	void *p;

	if (size == 0 || size > GM_DIRTY_MAX_BYTES ||
	    __builtin_add_overflow(offset, size, &end) || end > (uint64_t)INT64_MAX) {
		log_err("dirty log of %llu bytes at offset %llu: not a log (1 byte to "
			"%llu bytes, inside the file)", (unsigned long long)size,
			(unsigned long long)offset, GM_DIRTY_MAX_BYTES);
		return -EINVAL;
	}
	if (fstat(fd, &st) < 0)
		return -errno;
	/* Past the end of the file a mapping faults with SIGBUS: refuse it
	 * now, guard against a later shrink below. */
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < end) {
		log_err("dirty log of %llu bytes at offset %llu: the file the frontend "
			"sent holds %llu bytes", (unsigned long long)size,
			(unsigned long long)offset,
			S_ISREG(st.st_mode) ? (unsigned long long)st.st_size : 0ull);
		return -EINVAL;
	}
	start = offset & ~(pg - 1);
	len = end - start;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
	if (p == MAP_FAILED) {
		int r = -errno;

		free(l);
		return r;
	}
	if (gm_guard_add(p, (size_t)len) < 0) {
		munmap(p, (size_t)len);
		free(l);
		return -ENOSPC;
	}
	l->map = p;
	l->map_len = (size_t)len;
	l->bits = (_Atomic uint8_t *)((uint8_t *)p + (offset - start));
	l->size = size;
	atomic_init(&l->call_fd, -1);
	atomic_init(&l->misses, 0);
	atomic_flag_clear(&l->miss_logged);
	*out = l;
	return 0;
}

void gm_dirty_unmap(struct gm_dirty_log *l)
{
	uint64_t misses;

	if (!l)
		return;
	misses = atomic_load(&l->misses);
	if (misses)
		log_err("dirty log: %llu writes fell outside it and were not logged",
			(unsigned long long)misses);
	gm_guard_del(l->map);
	munmap(l->map, l->map_len);
	free(l);
}

void __gm_dirty_miss(struct gm_dirty_log *l, uint64_t gpa, uint64_t len)
{
	atomic_fetch_add_explicit(&l->misses, 1, memory_order_relaxed);
	if (!atomic_flag_test_and_set(&l->miss_logged))
		log_err("dirty log of %llu bytes covers guest addresses below 0x%llx, "
			"but we wrote %llu bytes at 0x%llx: that write cannot be logged "
			"and migration may lose it (the frontend must size the log for "
			"all guest memory; not logged again)", (unsigned long long)l->size,
			(unsigned long long)(l->size * 8) << GM_DIRTY_PAGE_SHIFT,
			(unsigned long long)len, (unsigned long long)gpa);
}

void gm_dirty_mark_host(struct gm_dirty_log *l, const struct gm_table *t, const void *p,
			uint64_t len)
{
	uint64_t gpa;

	if (len == 0)
		return;
	gpa = gm_host_to_gpa(t, p, len);
	if (unlikely(gpa == UINT64_MAX)) {
		/* Never happens for buffers the rings gave us; count it
		 * rather than lose it silently. */
		__gm_dirty_miss(l, UINT64_MAX, len);
		return;
	}
	gm_dirty_mark(l, gpa, len);
}

void gm_dirty_kick(struct gm_dirty_log *l)
{
	int fd = atomic_load_explicit(&l->call_fd, memory_order_relaxed);

	/* Made blocking and filled by the frontend, and interrupted (loop.h):
	 * it gets no more. */
	if (fd >= 0 && sys_eventfd_signal_shared(fd) == -EINTR &&
	    atomic_compare_exchange_strong(&l->call_fd, &fd, -1))
		log_err("dirty log: the frontend made its log eventfd block (cleared "
			"O_NONBLOCK, filled the counter): no more log kicks");
}
