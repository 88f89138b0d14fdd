#include "util/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static enum log_level log_threshold = LOG_INFO;
static __thread char log_thread[16] = "main";

/* syslog priorities (sd-daemon's "<N>" line prefix) for journald. */
static const char *const level_prio[] = {
	[LOG_ERR] = "<3>", [LOG_WARN] = "<4>", [LOG_INFO] = "<6>", [LOG_DEBUG] = "<7>",
};

/* Under systemd (JOURNAL_STREAM: stderr is the journal) journald stamps
 * each line and reads its priority from a "<N>" prefix, so we write no
 * time of our own; elsewhere an ISO 8601 UTC time to the millisecond. */
static int log_journal = -1;	/* -1: not looked at yet */

static const char *const level_names[] = {
	[LOG_ERR] = "error", [LOG_WARN] = "warn",
	[LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

void log_set_level(enum log_level level)
{
	log_threshold = level;
}

int log_parse_level(const char *s)
{
	for (unsigned i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++)
		if (strcasecmp(s, level_names[i]) == 0)
			return (int)i;
	return -EINVAL;
}

void log_set_thread_name(const char *name)
{
	snprintf(log_thread, sizeof(log_thread), "%s", name);
}

void log_one_line(char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			s[i] = '?';
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	char line[1024], *p = line;
	struct timespec ts;
	va_list ap;
	int n, m;

	if (level > log_threshold)
		return;
	if (log_journal < 0)
		log_journal = getenv("JOURNAL_STREAM") != NULL;
	if (log_journal) {
		n = snprintf(line, sizeof(line), "%svblkd[%s] %s: ", level_prio[level],
			     log_thread, level_names[level]);
	} else {
		struct tm tm;
		char when[32];

		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
		n = snprintf(line, sizeof(line), "vblkd[%s] %s.%03ldZ %s: ", log_thread, when,
			     ts.tv_nsec / 1000000, level_names[level]);
	}
	va_start(ap, fmt);
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	if ((size_t)(n + m) > sizeof(line) - 2) {
		/* A long line (the counters of many queues): whole, from the
		 * heap; cut as before only if there is no memory. */
		char *big = malloc((size_t)n + (size_t)m + 2);

		if (big) {
			memcpy(big, line, (size_t)n);
			va_start(ap, fmt);
			m = vsnprintf(big + n, (size_t)m + 1, fmt, ap);
			va_end(ap);
			if (m < 0) {
				free(big);
				return;
			}
			p = big;
		} else {
			m = (int)sizeof(line) - 2 - n;
		}
	}
	/* What a line says may come from a hostile image (a backing file's
	 * name, a cipher's): one line, whatever it holds. */
	log_one_line(p + n, (size_t)m);
	n += m;
	p[n++] = '\n';
	/* One write per line so lines from different threads never interleave. */
	(void)!write(STDERR_FILENO, p, (size_t)n);
	if (p != line)
		free(p);
}
