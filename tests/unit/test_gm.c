/* Description: mem/gm.h guest memory: region validation, table overlap
 * checks, and whole-range address translation including overflow. */
#include <errno.h>
#include <stdint.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mem/gm.h"
#include "test.h"

#define MIB (1024 * 1024ull)

/* A memfd of size bytes; skips the whole test where memfd is missing. */
static int make_memfd(uint64_t size)
{
	int fd = memfd_create("test_gm", MFD_CLOEXEC);

	if (fd < 0) {
		if (errno == ENOSYS) {
			fprintf(stderr, "memfd_create not supported, skipping\n");
			exit(T_EXIT_SKIP);
		}
		T_FAIL("memfd_create: %s", strerror(errno));
	}
	if (ftruncate(fd, (off_t)size) < 0)
		T_FAIL("ftruncate: %s", strerror(errno));
	return fd;
}

/* Map a fresh memfd as [gpa, gpa+size) at qva; the fd is closed since the
 * mapping keeps the memory alive. */
static void map_region(struct gm_region *r, uint64_t gpa, uint64_t size,
		       uint64_t qva)
{
	int fd = make_memfd(size);

	ASSERT_EQ(gm_region_map(r, gpa, size, qva, 0, fd), 0);
	close(fd);
}

/* A description only, never mapped: gm_table_add reads nothing else, and
 * gm_table_clear skips regions without a mapping. */
static struct gm_region fake_region(uint64_t gpa, uint64_t size, uint64_t qva)
{
	return (struct gm_region){ .gpa = gpa, .size = size, .qva = qva };
}

/* A good region maps fd from offset 0 and host points at mmap_offset. */
static void test_map_host_is_fd_offset(void)
{
	struct gm_region r;
	int fd = make_memfd(3 * 4096);
	char buf[4];

	ASSERT_EQ(gm_region_map(&r, 0x100000, 8192, 0x7f0000000000ull, 4096, fd), 0);
	ASSERT_EQ(r.gpa, 0x100000);
	ASSERT_EQ(r.size, 8192);
	ASSERT_EQ(r.qva, 0x7f0000000000ull);
	ASSERT_PTR_EQ(r.host, (uint8_t *)r.mmap_addr + 4096);
	memcpy(r.host, "gmok", 4);
	ASSERT_EQ(pread(fd, buf, 4, 4096), 4);
	ASSERT_MEM_EQ(buf, "gmok", 4);
	gm_region_unmap(&r);
	ASSERT_PTR_EQ(r.mmap_addr, NULL);
	close(fd);
}

/* A region of size 0 is malformed. */
static void test_map_rejects_size_zero(void)
{
	struct gm_region r;
	int fd = make_memfd(4096);

	ASSERT_EQ(gm_region_map(&r, 0x100000, 0, 0x1000, 0, fd), -EINVAL);
	ASSERT_PTR_EQ(r.mmap_addr, NULL);
	close(fd);
}

/* gpa + size past 2^64 is malformed. */
static void test_map_rejects_gpa_overflow(void)
{
	struct gm_region r;
	int fd = make_memfd(8192);

	ASSERT_EQ(gm_region_map(&r, UINT64_MAX - 0xfff, 8192, 0x1000, 0, fd),
		  -EINVAL);
	ASSERT_PTR_EQ(r.mmap_addr, NULL);
	close(fd);
}

/* qva + size past 2^64 is malformed. */
static void test_map_rejects_qva_overflow(void)
{
	struct gm_region r;
	int fd = make_memfd(8192);

	ASSERT_EQ(gm_region_map(&r, 0x100000, 8192, UINT64_MAX - 0xfff, 0, fd),
		  -EINVAL);
	ASSERT_PTR_EQ(r.mmap_addr, NULL);
	close(fd);
}

/* mmap_offset + size past 2^64 is malformed (and must not wrap into a
 * small mapping length). */
static void test_map_rejects_mmap_offset_overflow(void)
{
	struct gm_region r;
	int fd = make_memfd(8192);

	ASSERT_EQ(gm_region_map(&r, 0x100000, 8192, 0x1000, UINT64_MAX - 0xfff, fd),
		  -EINVAL);
	ASSERT_PTR_EQ(r.mmap_addr, NULL);
	close(fd);
}

/* An fd shorter than mmap_offset + size is refused up front, so later
 * access cannot SIGBUS; exactly long enough is fine. */
static void test_map_rejects_short_fd(void)
{
	struct gm_region r;
	int fd = make_memfd(64 * 1024);

	ASSERT_EQ(gm_region_map(&r, 0x100000, 64 * 1024, 0x1000, 4096, fd),
		  -EINVAL);
	ASSERT_PTR_EQ(r.mmap_addr, NULL);
	ASSERT_EQ(gm_region_map(&r, 0x100000, 64 * 1024 + 1, 0x1000, 0, fd),
		  -EINVAL);
	ASSERT_EQ(gm_region_map(&r, 0x100000, 60 * 1024, 0x1000, 4096, fd), 0);
	r.host[60 * 1024 - 1] = 1;	/* last byte: no SIGBUS */
	gm_region_unmap(&r);
	close(fd);
}

/* Adjacent regions (touching, not overlapping) are accepted. */
static void test_table_add_adjacent(void)
{
	static struct gm_table t;
	struct gm_region a = fake_region(0x1000, 0x1000, 0x10000);
	struct gm_region b = fake_region(0x2000, 0x1000, 0x11000);

	ASSERT_EQ(gm_table_add(&t, &a), 0);
	ASSERT_EQ(gm_table_add(&t, &b), 0);
	ASSERT_EQ(t.nregions, 2);
	gm_table_clear(&t);
}

/* A region overlapping another in guest physical space is refused. */
static void test_table_add_rejects_gpa_overlap(void)
{
	static struct gm_table t;
	struct gm_region a = fake_region(0x10000, 0x10000, 0x100000);
	struct gm_region inside = fake_region(0x18000, 0x1000, 0x200000);
	struct gm_region tail = fake_region(0x1ffff, 0x10000, 0x300000);
	struct gm_region cover = fake_region(0x0, 0x100000, 0x400000);

	ASSERT_EQ(gm_table_add(&t, &a), 0);
	ASSERT_EQ(gm_table_add(&t, &inside), -EEXIST);
	ASSERT_EQ(gm_table_add(&t, &tail), -EEXIST);
	ASSERT_EQ(gm_table_add(&t, &cover), -EEXIST);
	ASSERT_EQ(t.nregions, 1);
	gm_table_clear(&t);
}

/* A region overlapping another in frontend virtual space is refused even
 * when the guest physical ranges are disjoint. */
static void test_table_add_rejects_qva_overlap(void)
{
	static struct gm_table t;
	struct gm_region a = fake_region(0x10000, 0x10000, 0x100000);
	struct gm_region b = fake_region(0x80000, 0x10000, 0x10f000);

	ASSERT_EQ(gm_table_add(&t, &a), 0);
	ASSERT_EQ(gm_table_add(&t, &b), -EEXIST);
	ASSERT_EQ(t.nregions, 1);
	gm_table_clear(&t);
}

/* GM_MAX_REGIONS regions fit; one more is refused. */
static void test_table_add_rejects_full_table(void)
{
	static struct gm_table t;
	struct gm_region r;

	for (unsigned i = 0; i < GM_MAX_REGIONS; i++) {
		r = fake_region(0x1000ull * i, 0x1000, 0x100000000ull + 0x1000ull * i);
		ASSERT_EQ(gm_table_add(&t, &r), 0);
	}
	ASSERT_EQ(t.nregions, GM_MAX_REGIONS);
	r = fake_region(0x10000000, 0x1000, 0x200000000ull);
	ASSERT_EQ(gm_table_add(&t, &r), -ENOSPC);
	ASSERT_EQ(t.nregions, GM_MAX_REGIONS);
	gm_table_clear(&t);
}

/* A range wholly inside a region translates to host + offset, up to and
 * including the last byte; len 0 counts as 1. */
static void test_gpa_inside(void)
{
	static struct gm_table t;
	struct gm_region r;

	map_region(&r, 0x100000, MIB, 0x7f0000000000ull);
	ASSERT_EQ(gm_table_add(&t, &r), 0);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x100000, MIB), r.host);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x100010, 16), r.host + 0x10);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x1fffff, 1), r.host + MIB - 1);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x1fffff, 0), r.host + MIB - 1);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x200000, 0), NULL);
	gm_table_clear(&t);
}

/* A range that starts inside a region and ends past it is refused. */
static void test_gpa_rejects_range_ending_outside(void)
{
	static struct gm_table t;
	struct gm_region r;

	map_region(&r, 0x100000, MIB, 0x7f0000000000ull);
	ASSERT_EQ(gm_table_add(&t, &r), 0);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x1fffff, 2), NULL);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x100000, MIB + 1), NULL);
	gm_table_clear(&t);
}

/* A range straddling two adjacent regions is refused: their host
 * mappings are not contiguous. */
static void test_gpa_rejects_straddling_adjacent_regions(void)
{
	static struct gm_table t;
	struct gm_region a, b;

	map_region(&a, 0x100000, 0x10000, 0x7f0000000000ull);
	map_region(&b, 0x110000, 0x10000, 0x7f0000010000ull);
	ASSERT_EQ(gm_table_add(&t, &a), 0);
	ASSERT_EQ(gm_table_add(&t, &b), 0);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x10fff0, 0x10), a.host + 0xfff0);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x110000, 0x10), b.host);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x10fff0, 0x20), NULL);
	ASSERT_PTR_EQ(gm_qva_to_host(&t, 0x7f000000fff0ull, 0x20), NULL);
	gm_table_clear(&t);
}

/* addr + len wrapping past 2^64 is refused, even when the wrapped end
 * lands inside another region. */
static void test_gpa_rejects_wrapping_len(void)
{
	static struct gm_table t;
	struct gm_region low, high;
	uint64_t top = 0xffffffffffff0000ull;

	map_region(&low, 0, 0x10000, 0x7f0000000000ull);
	map_region(&high, top, 0x8000, 0x7f0000100000ull);
	ASSERT_EQ(gm_table_add(&t, &low), 0);
	ASSERT_EQ(gm_table_add(&t, &high), 0);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, top + 0x10, 0x10), high.host + 0x10);
	/* top + 0x10 + len wraps to 0x10: inside "low" if computed naively. */
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, top + 0x10, 0x10000ull), NULL);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, top + 0x10, UINT64_MAX), NULL);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, UINT64_MAX, 2), NULL);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x10, UINT64_MAX), NULL);
	gm_table_clear(&t);
}

/* Addresses outside every region translate to NULL, as does any address
 * in an empty table. */
static void test_gpa_outside_every_region(void)
{
	static struct gm_table t;
	struct gm_region r;

	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x100000, 1), NULL);
	map_region(&r, 0x100000, MIB, 0x7f0000000000ull);
	ASSERT_EQ(gm_table_add(&t, &r), 0);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0, 1), NULL);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0xfffff, 1), NULL);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0xfffff, 2), NULL);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x200000, 1), NULL);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, UINT64_MAX, 1), NULL);
	gm_table_clear(&t);
}

/* qva translation uses the frontend's addresses, never gpa, with the same
 * whole-range and overflow checks. */
static void test_qva_translation(void)
{
	static struct gm_table t;
	struct gm_region r;
	uint64_t qva = 0x7f0000000000ull;

	map_region(&r, 0x100000, MIB, qva);
	ASSERT_EQ(gm_table_add(&t, &r), 0);
	ASSERT_PTR_EQ(gm_qva_to_host(&t, qva, MIB), r.host);
	ASSERT_PTR_EQ(gm_qva_to_host(&t, qva + 0x1234, 4), r.host + 0x1234);
	ASSERT_PTR_EQ(gm_qva_to_host(&t, qva + MIB - 1, 2), NULL);
	ASSERT_PTR_EQ(gm_qva_to_host(&t, qva + MIB, 1), NULL);
	ASSERT_PTR_EQ(gm_qva_to_host(&t, qva - 1, 1), NULL);
	ASSERT_PTR_EQ(gm_qva_to_host(&t, qva + 1, UINT64_MAX), NULL);
	ASSERT_PTR_EQ(gm_qva_to_host(&t, 0x100000, 1), NULL);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, qva, 1), NULL);
	gm_table_clear(&t);
}

/* gm_table_clear unmaps every region and empties the table. */
static void test_table_clear_unmaps(void)
{
	static struct gm_table t;
	struct gm_region a, b;
	void *pa, *pb;
	size_t la, lb;

	map_region(&a, 0x100000, 0x10000, 0x7f0000000000ull);
	map_region(&b, 0x200000, 0x20000, 0x7f0000100000ull);
	pa = a.mmap_addr;
	la = a.mmap_size;
	pb = b.mmap_addr;
	lb = b.mmap_size;
	ASSERT_EQ(gm_table_add(&t, &a), 0);
	ASSERT_EQ(gm_table_add(&t, &b), 0);
	ASSERT_EQ(msync(pa, la, MS_ASYNC), 0);
	gm_table_clear(&t);
	ASSERT_EQ(t.nregions, 0);
	ASSERT_PTR_EQ(gm_gpa_to_host(&t, 0x100000, 1), NULL);
	/* msync fails with ENOMEM on a range that is not mapped. */
	ASSERT_EQ(msync(pa, la, MS_ASYNC), -1);
	ASSERT_EQ(errno, ENOMEM);
	ASSERT_EQ(msync(pb, lb, MS_ASYNC), -1);
	ASSERT_EQ(errno, ENOMEM);
}

/* ---- SIGBUS guard ---- */

/* The frontend shrinks a file we mapped: touching the lost pages must not
 * kill us.  The page reads zeroes, takes writes privately, the fault is
 * counted and signalled on the eventfd; the part still backed by the file
 * is untouched. */
static void test_guard_absorbs_shrunk_region(void)
{
	struct gm_region r;
	int fd = make_memfd(MIB), gfd = gm_guard_init();
	uint64_t before = gm_guard_faults(), n = 0;
	volatile uint8_t *p;

	ASSERT_TRUE(gfd >= 0);
	ASSERT_EQ(gm_guard_init(), gfd);		/* once per process */
	ASSERT_EQ(gm_region_map(&r, 0, MIB, 0x10000000, 0, fd), 0);
	p = r.host;
	p[0] = 0xa5;
	p[MIB / 2] = 0x5a;
	ASSERT_EQ(ftruncate(fd, (off_t)(MIB / 4)), 0);
	ASSERT_EQ(p[MIB / 2], 0);			/* was 0x5a: the file lost it */
	ASSERT_EQ(gm_guard_faults(), before + 1);
	p[MIB / 2 + 8] = 7;				/* same page: no new fault */
	ASSERT_EQ(p[MIB / 2 + 8], 7);
	ASSERT_EQ(gm_guard_faults(), before + 1);
	memset((void *)(p + MIB - 8192), 1, 8192);	/* two more pages */
	ASSERT_EQ(gm_guard_faults(), before + 3);
	ASSERT_EQ(read(gfd, &n, sizeof(n)), (ssize_t)sizeof(n));
	ASSERT_EQ(n, 3);
	ASSERT_EQ(p[0], 0xa5);				/* still the file's */
	gm_region_unmap(&r);
	close(fd);
}

/* A SIGBUS outside guest memory is a bug of ours and still kills the
 * process (with the default action, so a core). */
static void test_guard_unguarded_sigbus_still_kills(void)
{
	int status = 0;
	pid_t pid;

	ASSERT_TRUE(gm_guard_init() >= 0);
	pid = fork();
	ASSERT_TRUE(pid >= 0);
	if (pid == 0) {
		int fd = memfd_create("unguarded", MFD_CLOEXEC);
		volatile uint8_t *p;
		struct rlimit no_core = { 0, 0 };

		setrlimit(RLIMIT_CORE, &no_core);
		if (fd < 0 || ftruncate(fd, 65536) < 0)
			_exit(2);
		p = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED || ftruncate(fd, 0) < 0)
			_exit(3);
		p[0] = 1;
		_exit(0);
	}
	ASSERT_EQ(waitpid(pid, &status, 0), pid);
	ASSERT_TRUE(WIFSIGNALED(status));
	ASSERT_EQ(WTERMSIG(status), SIGBUS);
}

/* Unmapping gives the guard's slot back: far more map/unmap cycles than
 * there are slots all succeed. */
static void test_guard_slots_recycled(void)
{
	int fd = make_memfd(65536);

	for (unsigned i = 0; i < 3000; i++) {
		struct gm_region r;

		ASSERT_EQ(gm_region_map(&r, 0, 65536, 0, 0, fd), 0);
		gm_region_unmap(&r);
	}
	close(fd);
}

int main(void)
{
	RUN(test_map_host_is_fd_offset);
	RUN(test_map_rejects_size_zero);
	RUN(test_map_rejects_gpa_overflow);
	RUN(test_map_rejects_qva_overflow);
	RUN(test_map_rejects_mmap_offset_overflow);
	RUN(test_map_rejects_short_fd);
	RUN(test_table_add_adjacent);
	RUN(test_table_add_rejects_gpa_overlap);
	RUN(test_table_add_rejects_qva_overlap);
	RUN(test_table_add_rejects_full_table);
	RUN(test_gpa_inside);
	RUN(test_gpa_rejects_range_ending_outside);
	RUN(test_gpa_rejects_straddling_adjacent_regions);
	RUN(test_gpa_rejects_wrapping_len);
	RUN(test_gpa_outside_every_region);
	RUN(test_qva_translation);
	RUN(test_table_clear_unmaps);
	RUN(test_guard_absorbs_shrunk_region);
	RUN(test_guard_unguarded_sigbus_still_kills);
	RUN(test_guard_slots_recycled);
	return T_EXIT_PASS;
}
