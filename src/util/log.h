/*
 * Logging: one line per event on stderr, "vblkd[thread] level: message".
 * Thread-safe (each line is one write).  Callable from any thread.
 */
#ifndef VBLK_LOG_H
#define VBLK_LOG_H

#include <stddef.h>
#include <stdbool.h>

enum log_level { LOG_ERR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

/* Set the global threshold; messages above it are dropped. */
void log_set_level(enum log_level level);
/* Parse "error|warn|info|debug"; returns the level or -EINVAL. */
int log_parse_level(const char *s);
/* Name this thread in log lines (max 15 chars). */
void log_set_thread_name(const char *name);

/* Control characters (below 0x20, 0x7f: a newline, a terminal escape) in
 * s[0, n) made '?': every log line, and every one-line error a program
 * prints (cli_die), is one line whatever a hostile image or client put
 * into it.  Any thread. */
void log_one_line(char *s, size_t n);
void log_msg(enum log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define log_err(...)   log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/*
 * Log at most once per flag: for conditions a hostile guest can trigger at
 * will (a corrupt ring, a bad chain), so it cannot flood our log.
 * The flag lives with the object it describes (e.g. one per queue).
 */
#define log_once(flag, level, ...)             \
	do {                                   \
		if (!(flag)) {                 \
			(flag) = true;         \
			log_msg(level, __VA_ARGS__); \
		}                              \
	} while (0)

#endif
