/*
 * Minimal unit-test helpers.  One executable per feature; each starts with
 * a "Description:" comment.  Exit status: 0 pass, 1 fail, 77 skip (as
 * automake and liburing's tests do).  A failed check prints both values
 * and ends the test.
 */
#ifndef VBLK_TEST_H
#define VBLK_TEST_H

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

#define T_FAIL(...)                                                     \
	do {                                                            \
		fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);    \
		fprintf(stderr, __VA_ARGS__);                           \
		fputc('\n', stderr);                                    \
		exit(T_EXIT_FAIL);                                      \
	} while (0)

#define ASSERT_EQ(a, b)                                                 \
	do {                                                            \
		long long _a = (long long)(a), _b = (long long)(b);     \
		if (_a != _b)                                           \
			T_FAIL("%s == %s: got %lld, want %lld", #a, #b, _a, _b); \
	} while (0)

#define ASSERT_NE(a, b)                                                 \
	do {                                                            \
		long long _a = (long long)(a), _b = (long long)(b);     \
		if (_a == _b)                                           \
			T_FAIL("%s != %s: both %lld", #a, #b, _a);      \
	} while (0)

#define ASSERT_TRUE(c)                                                  \
	do {                                                            \
		if (!(c))                                               \
			T_FAIL("%s is false", #c);                      \
	} while (0)

#define ASSERT_PTR_EQ(a, b)                                             \
	do {                                                            \
		const void *_a = (a), *_b = (b);                        \
		if (_a != _b)                                           \
			T_FAIL("%s == %s: got %p, want %p", #a, #b, _a, _b); \
	} while (0)

#define ASSERT_MEM_EQ(a, b, n)                                          \
	do {                                                            \
		if (memcmp((a), (b), (n)) != 0)                         \
			T_FAIL("%s and %s differ in their first %zu bytes", \
			       #a, #b, (size_t)(n));                    \
	} while (0)

/* Run one named case; cases print their name so a failure is findable. */
#define RUN(fn)                                                         \
	do {                                                            \
		fprintf(stderr, "  %s\n", #fn);                         \
		fn();                                                   \
	} while (0)

/* Open fds in this process, for leak checks. */
static inline unsigned t_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	unsigned n = 0;

	ASSERT_TRUE(d != NULL);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

#endif
