/*
 * Helpers shared by the libFuzzer targets in fuzz/.  A target's own
 * invariants (what no input may make the code do) fail with FUZZ_CHECK,
 * which prints the condition and aborts, so libFuzzer saves the input as
 * a crash like any sanitizer report.
 */
#ifndef VBLK_FUZZ_H
#define VBLK_FUZZ_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* stderr as it was at start-up: -close_fd_mask=2 later points fd 2 at
 * /dev/null (to silence the daemon's log), not our reports. */
static int fuzz_report_fd = 2;

#define FUZZ_CHECK(cond)                                                  \
	do {                                                              \
		if (!(cond)) {                                            \
			dprintf(fuzz_report_fd,                           \
				"%s:%d: invariant failed: %s\n",          \
				__FILE__, __LINE__, #cond);               \
			abort();                                          \
		}                                                         \
	} while (0)

/* Log level for a fuzz run: $VBLK_FUZZ_LOG (error|warn|info|debug), else
 * debug, so every log format string is exercised with fuzzed arguments.
 * fuzz/run.sh passes -close_fd_mask=2, which sends them to /dev/null. */
static inline void fuzz_log_init(void)
{
	const char *s = getenv("VBLK_FUZZ_LOG");
	int l = s ? log_parse_level(s) : LOG_DEBUG;

	log_set_level(l < 0 ? LOG_DEBUG : (enum log_level)l);
	/* Called from LLVMFuzzerInitialize, before libFuzzer closes fd 2. */
	l = fcntl(2, F_DUPFD_CLOEXEC, 3);
	if (l >= 0)
		fuzz_report_fd = l;
}

/* Bytes read from the front of the fuzz input; past its end, zeroes. */
struct fuzz_in {
	const uint8_t *p;
	size_t left;
};

static inline void fuzz_take(struct fuzz_in *in, void *out, size_t n)
{
	size_t k = n < in->left ? n : in->left;

	memcpy(out, in->p, k);
	memset((uint8_t *)out + k, 0, n - k);
	in->p += k;
	in->left -= k;
}

#endif
