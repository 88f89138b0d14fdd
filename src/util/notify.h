/*
 * notify_: tell the service manager how the daemon is doing, in the
 * sd_notify(3) protocol (systemd's Type=notify: NOTIFY_SOCKET in the
 * environment), spoken by notify.c itself.
 *
 * Outside a service manager (no NOTIFY_SOCKET) every call does nothing and
 * returns 0.  NOTIFY_SOCKET is left in the environment, so a process we
 * start (the new daemon of an upgrade in place) can notify too.
 *
 * Each returns 0 (sent, or nobody to tell) or -errno; a failure is also
 * logged as a warning, so callers may ignore the result.  Any thread.
 */
#ifndef VBLK_NOTIFY_H
#define VBLK_NOTIFY_H

#include <sys/types.h>

/* READY=1 and a STATUS= line: the sockets listen, frontends may connect. */
int notify_ready(void);

/* STOPPING=1: shutdown has begun (in-flight I/O is being finished). */
int notify_stopping(void);

/* MAINPID=pid: pid (a process of ours) is the service's main process from
 * now on: for the old process of an upgrade in place, right before it
 * exits.  Returns once the service manager has read it (at most 5 s). */
int notify_mainpid(pid_t pid);

/* STATUS=...: one line for `systemctl status`. */
int notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
