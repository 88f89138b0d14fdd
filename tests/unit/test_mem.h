/*
 * One region of fake guest memory for the ring tests (test_vq,
 * test_vq_packed): a memfd of size bytes at guest-physical gpa, seen by
 * the frontend at qva, added to mem as SET_MEM_TABLE would.  Skips the test
 * where memfd_create is missing.  Returns our mapping of it.
 */
#ifndef VBLK_TEST_MEM_H
#define VBLK_TEST_MEM_H

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mem/gm.h"
#include "test.h"

static inline uint8_t *test_guest_mem(struct gm_table *mem, uint64_t gpa, uint64_t qva,
				      uint64_t size)
{
	struct gm_region reg;
	int fd = memfd_create("test-guest", MFD_CLOEXEC);

	if (fd < 0 && errno == ENOSYS) {
		fprintf(stderr, "memfd_create not supported, skipping\n");
		exit(T_EXIT_SKIP);
	}
	ASSERT_TRUE(fd >= 0);
	ASSERT_EQ(ftruncate(fd, (off_t)size), 0);
	ASSERT_EQ(gm_region_map(&reg, gpa, size, qva, 0, fd), 0);
	close(fd);
	ASSERT_EQ(gm_table_add(mem, &reg), 0);
	return reg.host;
}

#endif
