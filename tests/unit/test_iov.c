/* Description: util/iov.h scatter-gather helpers: sizes, copies at offsets
 * across segment boundaries, and discarding from either end; and
 * sys_pread_iov, a file range into part of an iovec array. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "test.h"
#include "util/iov.h"
#include "util/sys.h"

/* Three segments of 3, 5 and 4 bytes (12 in all) over separate buffers. */
struct seg3 {
	char a[3], b[5], c[4];
	struct iovec iov[3];
};

static void seg3_init(struct seg3 *s)
{
	memcpy(s->a, "abc", 3);
	memcpy(s->b, "defgh", 5);
	memcpy(s->c, "ijkl", 4);
	s->iov[0] = (struct iovec){ s->a, sizeof(s->a) };
	s->iov[1] = (struct iovec){ s->b, sizeof(s->b) };
	s->iov[2] = (struct iovec){ s->c, sizeof(s->c) };
}

/* iov_size sums every segment, zero-length ones and an empty array too. */
static void test_size(void)
{
	struct seg3 s;
	struct iovec z[2] = { { NULL, 0 }, { NULL, 0 } };

	seg3_init(&s);
	ASSERT_EQ(iov_size(s.iov, 3), 12);
	ASSERT_EQ(iov_size(s.iov, 1), 3);
	ASSERT_EQ(iov_size(s.iov, 0), 0);
	ASSERT_EQ(iov_size(z, 2), 0);
}

/* iov_to_buf from offset 0 gathers every segment in order. */
static void test_to_buf_whole(void)
{
	struct seg3 s;
	char buf[16];

	seg3_init(&s);
	ASSERT_EQ(iov_to_buf(s.iov, 3, 0, buf, 12), 12);
	ASSERT_MEM_EQ(buf, "abcdefghijkl", 12);
}

/* iov_to_buf from an offset inside the first segment crosses two
 * boundaries. */
static void test_to_buf_offset_across_segments(void)
{
	struct seg3 s;
	char buf[16];

	seg3_init(&s);
	ASSERT_EQ(iov_to_buf(s.iov, 3, 2, buf, 8), 8);
	ASSERT_MEM_EQ(buf, "cdefghij", 8);
}

/* An offset exactly at a segment boundary starts at the next segment. */
static void test_to_buf_offset_on_boundary(void)
{
	struct seg3 s;
	char buf[16];

	seg3_init(&s);
	ASSERT_EQ(iov_to_buf(s.iov, 3, 8, buf, 4), 4);
	ASSERT_MEM_EQ(buf, "ijkl", 4);
}

/* Asking for more than is there copies only what is there. */
static void test_to_buf_short(void)
{
	struct seg3 s;
	char buf[16];

	seg3_init(&s);
	ASSERT_EQ(iov_to_buf(s.iov, 3, 10, buf, 16), 2);
	ASSERT_MEM_EQ(buf, "kl", 2);
	ASSERT_EQ(iov_to_buf(s.iov, 3, 12, buf, 16), 0);
	ASSERT_EQ(iov_to_buf(s.iov, 3, 100, buf, 16), 0);
}

/* Zero-length segments in the middle are skipped. */
static void test_to_buf_skips_empty_segments(void)
{
	char a[2] = "xy", c[2] = "zw", buf[4];
	struct iovec iov[3] = { { a, 2 }, { NULL, 0 }, { c, 2 } };

	ASSERT_EQ(iov_to_buf(iov, 3, 1, buf, 3), 3);
	ASSERT_MEM_EQ(buf, "yzw", 3);
}

/* iov_from_buf scatters at an offset across boundaries and touches no byte
 * outside [off, off+len). */
static void test_from_buf_offset_across_segments(void)
{
	struct seg3 s;

	seg3_init(&s);
	ASSERT_EQ(iov_from_buf(s.iov, 3, 1, "123456789", 9), 9);
	ASSERT_MEM_EQ(s.a, "a12", 3);
	ASSERT_MEM_EQ(s.b, "34567", 5);
	ASSERT_MEM_EQ(s.c, "89kl", 4);
}

/* iov_from_buf past the end writes only what fits. */
static void test_from_buf_short(void)
{
	struct seg3 s;

	seg3_init(&s);
	ASSERT_EQ(iov_from_buf(s.iov, 3, 10, "XYZ", 3), 2);
	ASSERT_MEM_EQ(s.c, "ijXY", 4);
	ASSERT_EQ(iov_from_buf(s.iov, 3, 12, "XYZ", 3), 0);
}

/* iov_memset from an offset across segments, and only what fits (an RBD
 * read clipped at the end of the image: its tail is zeroed). */
static void test_memset_offset_and_short(void)
{
	struct seg3 s;

	seg3_init(&s);
	ASSERT_EQ(iov_memset(s.iov, 3, 2, '0', 4), 4);
	ASSERT_MEM_EQ(s.a, "ab0", 3);
	ASSERT_MEM_EQ(s.b, "000gh", 5);
	ASSERT_EQ(iov_memset(s.iov, 3, 10, '9', 5), 2);
	ASSERT_MEM_EQ(s.c, "ij99", 4);
	ASSERT_EQ(iov_memset(s.iov, 3, 12, '9', 1), 0);
}

/* Discarding from the front inside the first segment advances its base. */
static void test_discard_front_partial(void)
{
	struct seg3 s;
	struct iovec *iov;
	unsigned cnt = 3;

	seg3_init(&s);
	iov = s.iov;
	ASSERT_EQ(iov_discard_front(&iov, &cnt, 2), 2);
	ASSERT_EQ(cnt, 3);
	ASSERT_PTR_EQ(iov, &s.iov[0]);
	ASSERT_PTR_EQ(iov[0].iov_base, s.a + 2);
	ASSERT_EQ(iov[0].iov_len, 1);
	ASSERT_EQ(iov_size(iov, cnt), 10);
}

/* Discarding whole segments from the front removes them. */
static void test_discard_front_whole_segments(void)
{
	struct seg3 s;
	struct iovec *iov;
	unsigned cnt = 3;

	seg3_init(&s);
	iov = s.iov;
	ASSERT_EQ(iov_discard_front(&iov, &cnt, 8), 8);
	ASSERT_EQ(cnt, 1);
	ASSERT_PTR_EQ(iov, &s.iov[2]);
	ASSERT_PTR_EQ(iov[0].iov_base, s.c);
	ASSERT_EQ(iov[0].iov_len, 4);
}

/* Discarding across a boundary removes one segment and trims the next. */
static void test_discard_front_across_boundary(void)
{
	struct seg3 s;
	struct iovec *iov;
	unsigned cnt = 3;

	seg3_init(&s);
	iov = s.iov;
	ASSERT_EQ(iov_discard_front(&iov, &cnt, 5), 5);
	ASSERT_EQ(cnt, 2);
	ASSERT_PTR_EQ(iov[0].iov_base, s.b + 2);
	ASSERT_EQ(iov[0].iov_len, 3);
}

/* Discarding more than the total empties the array and reports the
 * total. */
static void test_discard_front_more_than_total(void)
{
	struct seg3 s;
	struct iovec *iov;
	unsigned cnt = 3;

	seg3_init(&s);
	iov = s.iov;
	ASSERT_EQ(iov_discard_front(&iov, &cnt, 100), 12);
	ASSERT_EQ(cnt, 0);
	ASSERT_PTR_EQ(iov, &s.iov[3]);
}

/* Discarding from the back inside the last segment shortens it. */
static void test_discard_back_partial(void)
{
	struct seg3 s;
	unsigned cnt = 3;

	seg3_init(&s);
	ASSERT_EQ(iov_discard_back(s.iov, &cnt, 3), 3);
	ASSERT_EQ(cnt, 3);
	ASSERT_PTR_EQ(s.iov[2].iov_base, s.c);
	ASSERT_EQ(s.iov[2].iov_len, 1);
}

/* Discarding whole segments from the back drops them and trims the
 * one before. */
static void test_discard_back_whole_segments(void)
{
	struct seg3 s;
	unsigned cnt = 3;

	seg3_init(&s);
	ASSERT_EQ(iov_discard_back(s.iov, &cnt, 9), 9);
	ASSERT_EQ(cnt, 1);
	ASSERT_PTR_EQ(s.iov[0].iov_base, s.a);
	ASSERT_EQ(s.iov[0].iov_len, 3);

	seg3_init(&s);
	cnt = 3;
	ASSERT_EQ(iov_discard_back(s.iov, &cnt, 6), 6);
	ASSERT_EQ(cnt, 2);
	ASSERT_EQ(s.iov[1].iov_len, 3);
}

/* Discarding more than the total from the back empties the array. */
static void test_discard_back_more_than_total(void)
{
	struct seg3 s;
	unsigned cnt = 3;

	seg3_init(&s);
	ASSERT_EQ(iov_discard_back(s.iov, &cnt, SIZE_MAX), 12);
	ASSERT_EQ(cnt, 0);
}

/* Discarding zero bytes changes nothing at either end. */
static void test_discard_zero(void)
{
	struct seg3 s;
	struct iovec *iov;
	unsigned cnt = 3;

	seg3_init(&s);
	iov = s.iov;
	ASSERT_EQ(iov_discard_front(&iov, &cnt, 0), 0);
	ASSERT_EQ(iov_discard_back(iov, &cnt, 0), 0);
	ASSERT_EQ(cnt, 3);
	ASSERT_PTR_EQ(iov, s.iov);
	ASSERT_EQ(iov_size(iov, cnt), 12);
}

/* A file of 64 bytes, byte i = 0x40 + i. */
static int pattern_file(void)
{
	FILE *f = tmpfile();
	uint8_t b[64];
	int fd;

	ASSERT_TRUE(f != NULL);
	fd = dup(fileno(f));
	fclose(f);
	for (unsigned i = 0; i < sizeof(b); i++)
		b[i] = (uint8_t)(0x40 + i);
	ASSERT_EQ(pwrite(fd, b, sizeof(b), 0), sizeof(b));
	return fd;
}

/* The backup view's scratch read (bkp.c scratch_read) read every piece
 * after the first from the first's place in the file: each piece comes
 * from where the one before it ended. */
static void test_pread_iov_each_piece_from_its_own_offset(void)
{
	struct seg3 s;
	int fd = pattern_file();

	seg3_init(&s);
	/* Iovec bytes [1, 11) from file bytes [20, 30): "bc" "defgh" "ijk". */
	ASSERT_EQ(sys_pread_iov(fd, s.iov, 3, 1, 10, 20), 0);
	ASSERT_EQ(s.a[0], 'a');
	ASSERT_EQ(s.a[1], 0x40 + 20);
	ASSERT_EQ(s.a[2], 0x40 + 21);
	for (unsigned i = 0; i < 5; i++)
		ASSERT_EQ(s.b[i], 0x40 + 22 + i);
	ASSERT_EQ(s.c[0], 0x40 + 27);
	ASSERT_EQ(s.c[2], 0x40 + 29);
	ASSERT_EQ(s.c[3], 'l');
	close(fd);
}

/* Many one-byte pieces (more than the 8 bkp.c took before going through
 * a bounce buffer), and a range past the iovecs' end: -EINVAL, nothing
 * read. */
static void test_pread_iov_many_pieces_and_bounds(void)
{
	uint8_t one[12];
	struct iovec iov[12];
	int fd = pattern_file();

	for (unsigned i = 0; i < 12; i++) {
		one[i] = 0;
		iov[i] = (struct iovec){ &one[i], 1 };
	}
	ASSERT_EQ(sys_pread_iov(fd, iov, 12, 0, 12, 40), 0);
	for (unsigned i = 0; i < 12; i++)
		ASSERT_EQ(one[i], 0x40 + 40 + i);
	memset(one, 0, sizeof(one));
	ASSERT_EQ(sys_pread_iov(fd, iov, 12, 4, 9, 0), -EINVAL);
	ASSERT_EQ(one[4], 0);
	close(fd);
}

int main(void)
{
	RUN(test_size);
	RUN(test_memset_offset_and_short);
	RUN(test_to_buf_whole);
	RUN(test_to_buf_offset_across_segments);
	RUN(test_to_buf_offset_on_boundary);
	RUN(test_to_buf_short);
	RUN(test_to_buf_skips_empty_segments);
	RUN(test_from_buf_offset_across_segments);
	RUN(test_from_buf_short);
	RUN(test_discard_front_partial);
	RUN(test_discard_front_whole_segments);
	RUN(test_discard_front_across_boundary);
	RUN(test_discard_front_more_than_total);
	RUN(test_discard_back_partial);
	RUN(test_discard_back_whole_segments);
	RUN(test_discard_back_more_than_total);
	RUN(test_discard_zero);
	RUN(test_pread_iov_each_piece_from_its_own_offset);
	RUN(test_pread_iov_many_pieces_and_bounds);
	return T_EXIT_PASS;
}
