/* Description: loop/contend.h, the loop's contention rule, and
 * sys_sched_wait_ns, the run-queue wait it reads: a sample where our CPU
 * time is short only because our own disk's interrupts (or a hypervisor)
 * took the rest is not contention when the wait is known (it was, by CPU
 * time alone: the file rows of issue 26 backed polling off three times a
 * second for it); nor is a sample whose wait came from wake-ups out of
 * epoll while we ran as much as we wanted (io_uring's worker on our CPU,
 * the page cache: the wait alone backed off ten times a second under ASan);
 * a task sharing our CPU is, by both measures; a sample mostly asleep is
 * neither; and a thread that a busy thread on its CPU keeps waiting reads
 * that wait back. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <errno.h>
#include <unistd.h>

#include "loop/contend.h"
#include "test.h"
#include "util/sys.h"

#define MS 1000000ull

/* Measured on the 2-vCPU VM (debug log of the QD1 pinned file cell,
 * daemon on the CPU that takes the disk's interrupts): 3.15 ms run of
 * 4.75 ms runnable, 66 %: interrupts and steal, no other task. */
static void test_interrupts_are_not_contention(void)
{
	struct contend_sample s = { .wall = 5 * MS, .runnable = 4750000, .cpu = 3150000,
				    .wait = 40000, .have_wait = true };

	ASSERT_TRUE(!contend_shared(&s));
	/* Without the wait the CPU time decides, and it says "contended". */
	s.have_wait = false;
	ASSERT_TRUE(contend_shared(&s));
}

/* Buffered writes to tmpfs, io_uring's worker pinned to our CPU: we sleep
 * at once while it works (poll_yields) and, woken by its completion, wait
 * for it to leave the CPU.  Those waits are in the wait but fall in time we
 * slept; while we polled we ran all we wanted. */
static void test_wakeup_waits_are_not_contention(void)
{
	struct contend_sample s = { .wall = 5 * MS, .runnable = 3 * MS, .cpu = 2800000,
				    .wait = 1200000, .have_wait = true };

	ASSERT_TRUE(!contend_shared(&s));
	s.have_wait = false;
	ASSERT_TRUE(!contend_shared(&s));
}

/* A busy task of equal weight on our CPU: we run about half the time and
 * wait the other half.  Both rules see it. */
static void test_shared_cpu_is_contention(void)
{
	struct contend_sample s = { .wall = 5 * MS, .runnable = 4900000, .cpu = 2400000,
				    .wait = 2450000, .have_wait = true };

	ASSERT_TRUE(contend_shared(&s));
	s.have_wait = false;
	ASSERT_TRUE(contend_shared(&s));
	/* A quarter of the time waiting is still noise (a stray task). */
	s.have_wait = true;
	s.wait = s.runnable / 4;
	ASSERT_TRUE(!contend_shared(&s));
}

/* Mostly asleep in epoll: nothing to say, whatever the numbers. */
static void test_asleep_says_nothing(void)
{
	struct contend_sample s = { .wall = 5 * MS, .runnable = 2 * MS, .cpu = 0,
				    .wait = 2 * MS, .have_wait = true };

	ASSERT_TRUE(!contend_shared(&s));
	s.have_wait = false;
	ASSERT_TRUE(!contend_shared(&s));
}

static atomic_bool hog_stop;

static void *hog(void *arg)
{
	(void)arg;
	while (!atomic_load_explicit(&hog_stop, memory_order_relaxed))
		;
	return NULL;
}

static void pin(pthread_t t, int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	ASSERT_EQ(pthread_setaffinity_np(t, sizeof(set), &set), 0);
}

/* A busy thread on our CPU for 200 ms while we spin there too: the
 * scheduler shares the CPU, and our run-queue wait grows by tens of ms. */
static int test_wait_of_shared_cpu_is_read(void)
{
	cpu_set_t old;
	pthread_t h;
	uint64_t w0, w1, end;
	int fd, cpu = sched_getcpu();

	fd = sys_sched_wait_open();
	if (fd < 0) {
		fprintf(stderr, "    no /proc/thread-self/schedstat: %s\n", strerror(-fd));
		return T_EXIT_SKIP;
	}
	if (sys_sched_wait_ns(fd, &w0) == -ENODATA) {
		fprintf(stderr, "    the kernel keeps no run-queue times\n");
		close(fd);
		return T_EXIT_SKIP;
	}
	ASSERT_EQ(sys_sched_wait_ns(fd, &w0), 0);
	ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(old), &old), 0);
	pin(pthread_self(), cpu);
	ASSERT_EQ(pthread_create(&h, NULL, hog, NULL), 0);
	pin(h, cpu);
	for (end = sys_now_ns() + 200 * MS; sys_now_ns() < end;)
		;
	ASSERT_EQ(sys_sched_wait_ns(fd, &w1), 0);
	atomic_store(&hog_stop, true);
	pthread_join(h, NULL);
	ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(old), &old), 0);
	close(fd);
	fprintf(stderr, "    waited %llu us of 200 ms beside a busy thread\n",
		(unsigned long long)((w1 - w0) / 1000));
	ASSERT_TRUE(w1 - w0 > 20 * MS);
	/* And a closed fd is an error, not a number. */
	ASSERT_TRUE(sys_sched_wait_ns(fd, &w1) < 0);
	return T_EXIT_PASS;
}

int main(void)
{
	RUN(test_interrupts_are_not_contention);
	RUN(test_wakeup_waits_are_not_contention);
	RUN(test_shared_cpu_is_contention);
	RUN(test_asleep_says_nothing);
	fprintf(stderr, "  test_wait_of_shared_cpu_is_read\n");
	return test_wait_of_shared_cpu_is_read();
}
