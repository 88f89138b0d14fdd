/*
 * slow_connect.so (LD_PRELOAD, tests only): every TCP connect() returns
 * VBLK_TEST_CONNECT_DELAY_MS milliseconds late, as if the thread had been
 * preempted right after it.  With tests/remote/eager-nbd, whose answers
 * are all sent at once, libnbd then finds the whole handshake waiting and
 * ends it inside nbd_aio_connect_uri: the race that a busy machine makes
 * now and then, made certain (test_remote: nbd-eager-reconnect).
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	static int (*real)(int, const struct sockaddr *, socklen_t);
	const char *ms = getenv("VBLK_TEST_CONNECT_DELAY_MS");
	int r;

	if (!real)
		real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT,
									       "connect");
	r = real(fd, addr, len);
	if (ms && addr && addr->sa_family == AF_INET) {
		long v = atol(ms);
		struct timespec ts = { v / 1000, (v % 1000) * 1000000 };

		nanosleep(&ts, NULL);
	}
	return r;
}
