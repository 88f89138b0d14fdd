/*
 * The SIGBUS guard for memory a frontend shares with us (see gm.h).
 *
 * A MAP_SHARED mapping of a file faults with SIGBUS on a page beyond the
 * file's end.  We check the size when we map, but the frontend keeps the
 * fd and may shrink the file afterwards (a buggy or hostile frontend, or a
 * memory backend file someone truncated).  Without a guard the first
 * touch of such a page, by an iothread reading a ring or the null engine
 * zeroing a buffer, would kill the daemon and every other disk it serves.
 *
 * The handler looks the faulting address up in a fixed table of guarded
 * ranges (lock-free: slots are published with release stores and read
 * with acquire loads, so the handler may run on any thread at any time),
 * puts a private zero page over the faulting page (MAP_FIXED: the access
 * is retried and succeeds, reading zeroes; writes land nowhere) and tells
 * the main loop through an eventfd, which drops the frontend.  A SIGBUS
 * anywhere else is a real bug: the default action is restored and the
 * fault repeats, killing the process with a core as usual.
 */
#include "mem/gm.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

/* Two memory tables may coexist while one replaces the other, plus the
 * in-flight regions. */
#define GM_GUARD_SLOTS (2 * GM_MAX_REGIONS + 8)

struct guard_slot {
	_Atomic uintptr_t start;	/* 0: free */
	_Atomic uintptr_t len;
};

static struct guard_slot slots[GM_GUARD_SLOTS];
static _Atomic int guard_fd = -1;
static _Atomic uint64_t guard_faults;
static atomic_flag guard_installed = ATOMIC_FLAG_INIT;

static void guard_handler(int sig, siginfo_t *si, void *uctx)
{
	uintptr_t a = (uintptr_t)si->si_addr;
	int saved = errno;

	(void)uctx;
	for (unsigned i = 0; i < GM_GUARD_SLOTS; i++) {
		uintptr_t s = atomic_load_explicit(&slots[i].start, memory_order_acquire);
		uintptr_t page;
		long psz;
		int fd;

		if (!s || a < s || a - s >= atomic_load_explicit(&slots[i].len,
								 memory_order_relaxed))
			continue;
		psz = sysconf(_SC_PAGESIZE);
		page = a & ~((uintptr_t)psz - 1);
		if (mmap((void *)page, (size_t)psz, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
			break;
		atomic_fetch_add_explicit(&guard_faults, 1, memory_order_relaxed);
		fd = atomic_load_explicit(&guard_fd, memory_order_relaxed);
		if (fd >= 0) {
			uint64_t one = 1;

			(void)!write(fd, &one, sizeof(one));
		}
		errno = saved;
		return;
	}
	/* Not guest memory: a bug of ours.  Die of it, with a core. */
	signal(sig, SIG_DFL);
	errno = saved;
}

int gm_guard_init(void)
{
	struct sigaction sa;
	int fd;

	if (atomic_flag_test_and_set(&guard_installed))
		return atomic_load(&guard_fd);
	fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (fd < 0)
		goto err;
	atomic_store(&guard_fd, fd);
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = guard_handler;
	sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, NULL) == 0)
		return fd;
	close(fd);
	atomic_store(&guard_fd, -1);
err:
	fd = -errno;
	atomic_flag_clear(&guard_installed);
	return fd;
}

int gm_guard_add(void *addr, size_t len)
{
	for (unsigned i = 0; i < GM_GUARD_SLOTS; i++) {
		uintptr_t zero = 0;

		if (atomic_load_explicit(&slots[i].start, memory_order_relaxed))
			continue;
		/* Claim the slot with a placeholder no address can match (an
		 * empty range), set the length, then publish the start. */
		atomic_store_explicit(&slots[i].len, 0, memory_order_relaxed);
		if (!atomic_compare_exchange_strong(&slots[i].start, &zero, (uintptr_t)1))
			continue;
		atomic_store_explicit(&slots[i].len, len, memory_order_relaxed);
		atomic_store_explicit(&slots[i].start, (uintptr_t)addr, memory_order_release);
		return 0;
	}
	return -ENOSPC;
}

void gm_guard_del(void *addr)
{
	for (unsigned i = 0; i < GM_GUARD_SLOTS; i++)
		if (atomic_load_explicit(&slots[i].start, memory_order_relaxed) ==
		    (uintptr_t)addr) {
			atomic_store_explicit(&slots[i].start, 0, memory_order_release);
			return;
		}
}

uint64_t gm_guard_faults(void)
{
	return atomic_load_explicit(&guard_faults, memory_order_relaxed);
}
