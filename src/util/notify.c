/* Readiness and status for the service manager: see notify.h. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#ifdef HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "util/log.h"
#include "util/notify.h"

#ifdef HAVE_LIBSYSTEMD
/* > 0 sent, 0 nobody to tell (no NOTIFY_SOCKET), or -errno (logged). */
static int tell(const char *msg)
{
	int r = sd_notify(0, msg);

	if (r < 0)
		log_warn("cannot notify the service manager (%.*s): %s",
			 (int)strcspn(msg, "\n"), msg, strerror(-r));
	return r;
}
#endif

int notify_ready(void)
{
#ifdef HAVE_LIBSYSTEMD
	int r = tell("READY=1\nSTATUS=Serving");

	return r < 0 ? r : 0;
#else
	return 0;
#endif
}

int notify_stopping(void)
{
#ifdef HAVE_LIBSYSTEMD
	int r = tell("STOPPING=1\nSTATUS=Finishing in-flight I/O");

	return r < 0 ? r : 0;
#else
	return 0;
#endif
}

int notify_mainpid(pid_t pid)
{
#ifdef HAVE_LIBSYSTEMD
	char msg[32];
	int r;

	snprintf(msg, sizeof(msg), "MAINPID=%ld", (long)pid);
	r = tell(msg);
	if (r <= 0)
		return r;
	/* The caller exits next: wait until systemd has read the new pid, or
	 * the exit of its main process could reach it first and stop the
	 * service, the new process with it. */
	r = sd_notify_barrier(0, 5 * 1000000ull);
	if (r < 0)
		log_warn("the service manager did not confirm MAINPID=%ld: %s",
			 (long)pid, strerror(-r));
	return r < 0 ? r : 0;
#else
	(void)pid;
	return 0;
#endif
}

int notify_status(const char *fmt, ...)
{
#ifdef HAVE_LIBSYSTEMD
	char msg[512] = "STATUS=";
	va_list ap;
	int r;

	va_start(ap, fmt);
	vsnprintf(msg + 7, sizeof(msg) - 7, fmt, ap);
	va_end(ap);
	/* One line: the protocol is newline-separated assignments. */
	msg[strcspn(msg, "\n")] = '\0';
	r = tell(msg);
	return r < 0 ? r : 0;
#else
	(void)fmt;
	return 0;
#endif
}
