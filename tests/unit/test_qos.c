/* Description: qos/qos.h, per-disk QoS: the --limit syntax (QEMU's names,
 * sizes with K/M/G, merging, 0 removes, QEMU's checks with one-line
 * errors, print and parse again); the leaky buckets against simulated time
 * (a limit is held, QEMU's 100 ms allowance, a burst at max for max-length
 * seconds then the average, iops-size, reads and writes in their own
 * buckets); admission in arrival order (a waiter keeps its place, a new
 * request does not jump the line, a head that stays away is skipped and
 * may come back first; turns send a slice's worth per wake-up and busy
 * queues share them); a group shared by two objects as two processes
 * would (same limits, refused with others, the last member removes it). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qos/qos.h"
#include "test.h"
#include "util/compiler.h"
#include "util/sys.h"

#define MS 1000000ull
#define S 1000000000ull

static void test_parse(void)
{
	struct qos_limits l = { 0 };
	char err[300], buf[512];

	ASSERT_EQ(qos_limits_parse("iops-total=1000,bps-read=10M", &l, err, sizeof(err)), 0);
	ASSERT_EQ(l.b[QOS_IOPS_TOTAL].avg, 1000);
	ASSERT_EQ(l.b[QOS_BPS_READ].avg, 10u << 20);
	ASSERT_TRUE(qos_limits_any(&l));
	/* Keys not named stay; 0 removes one. */
	ASSERT_EQ(qos_limits_parse("iops-total-max=4000,iops-total-max-length=3", &l, err,
				   sizeof(err)), 0);
	ASSERT_EQ(l.b[QOS_IOPS_TOTAL].avg, 1000);
	ASSERT_EQ(l.b[QOS_IOPS_TOTAL].max, 4000);
	ASSERT_EQ(l.b[QOS_IOPS_TOTAL].max_len, 3);
	qos_limits_format(&l, buf, sizeof(buf));
	ASSERT_TRUE(!strcmp(buf, "bps-read=10485760,iops-total=1000,iops-total-max=4000,"
				 "iops-total-max-length=3"));
	{
		struct qos_limits m = { 0 };

		ASSERT_EQ(qos_limits_parse(buf, &m, err, sizeof(err)), 0);
		ASSERT_MEM_EQ(&m, &l, sizeof(m));
	}
	ASSERT_EQ(qos_limits_parse("bps-read=0", &l, err, sizeof(err)), 0);
	ASSERT_EQ(l.b[QOS_BPS_READ].avg, 0);
	ASSERT_EQ(qos_limits_parse("iops-size=4k", &l, err, sizeof(err)), 0);
	ASSERT_EQ(l.iops_size, 4096);

	/* Errors: one line, nothing changed. */
	{
		static const char *const bad[] = {
			"", "iops-total", "iops-totl=5", "iops-total=-1", "iops-total=abc",
			"iops-total=2000000000000000", "iops-read=5",	/* with iops-total */
			"iops-total-max=10",				/* below avg 1000 */
			"bps-write-max=100",				/* no bps-write */
			"bps-total-max-length=5",			/* no bps-total-max */
			"iops-total-max-length=100000",			/* over a day */
			"iops-total=1000,bogus=1",
		};
		struct qos_limits before = l;

		for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			err[0] = '\0';
			ASSERT_EQ(qos_limits_parse(bad[i], &l, err, sizeof(err)), -EINVAL);
			ASSERT_TRUE(err[0] != '\0' && !strchr(err, '\n'));
			ASSERT_MEM_EQ(&l, &before, sizeof(l));
		}
	}
}

/* One I/O a turn (qos_admit_turn with no slice), a bare ticket. */
static uint64_t admit1(struct qos *q, bool is_write, uint64_t bytes, uint64_t now,
		       uint64_t *ticket)
{
	struct qos_turn t = { .ticket = *ticket };
	uint64_t w = qos_admit_turn(q, is_write, bytes, now, &t, 0);

	*ticket = t.ticket;
	return w;
}

/* I/Os let through in [0, secs) by a closed loop that asks as soon as the
 * last wait ends (the worst client: always over budget). */
static uint64_t drive(struct qos *q, bool is_write, uint64_t bytes, uint64_t t0, uint64_t secs,
		      uint64_t *first_s)
{
	uint64_t now = t0, n = 0, ticket = 0;

	if (first_s)
		*first_s = 0;
	while (now < t0 + secs * S) {
		uint64_t w = admit1(q, is_write, bytes, now, &ticket);

		if (w) {
			now += w;
			continue;
		}
		n++;
		if (first_s && now < t0 + S)
			(*first_s)++;
	}
	return n;
}

static struct qos *make(const char *limits)
{
	struct qos_limits l = { 0 };
	struct qos *q;
	char err[300];

	ASSERT_EQ(qos_limits_parse(limits, &l, err, sizeof(err)), 0);
	ASSERT_EQ(qos_new(&l, &q), 0);
	ASSERT_TRUE(qos_active(q));
	return q;
}

static void test_rate_held(void)
{
	struct qos *q = make("iops-total=1000");
	/* 10 s at 1000/s, plus QEMU's 100 ms (avg/10) the bucket holds. */
	uint64_t n = drive(q, false, 4096, S, 10, NULL);

	ASSERT_TRUE(n >= 10000 && n <= 10000 + 101);
	qos_free(q);

	q = make("bps-total=1M");
	n = drive(q, true, 64 << 10, S, 10, NULL);	/* 16 of 64 KiB a second */
	ASSERT_TRUE(n >= 160 && n <= 160 + 3);
	qos_free(q);

	/* Reads and writes in buckets of their own. */
	q = make("iops-read=100,iops-write=1000");
	ASSERT_TRUE(drive(q, false, 4096, S, 5, NULL) <= 500 + 11);
	ASSERT_TRUE(drive(q, true, 4096, 10 * S, 5, NULL) >= 5000);
	qos_free(q);

	/* iops-size: a 64 KiB request counts as 16 of 4 KiB. */
	q = make("iops-total=1600,iops-size=4k");
	n = drive(q, false, 64 << 10, S, 10, NULL);
	ASSERT_TRUE(n >= 1000 && n <= 1000 + 11);
	qos_free(q);
}

static void test_burst(void)
{
	/* iops-total=2000, bursting to 8000 for 2 s: the bucket holds 16000;
	 * it fills at 8000 - 2000 = 6000/s, so ~2.7 s at ~8000, then 2000. */
	struct qos *q = make("iops-total=2000,iops-total-max=8000,iops-total-max-length=2");
	uint64_t first, n = drive(q, false, 4096, S, 10, &first);

	ASSERT_TRUE(first >= 7900 && first <= 8000 + 801);
	/* Burst capacity 16000 + 2000/s * 10 s. */
	ASSERT_TRUE(n >= 36000 - 100 && n <= 36000 + 900);
	/* Long after, the average alone. */
	{
		uint64_t late = drive(q, false, 4096, 100 * S, 1, NULL);

		/* A fresh burst was earned while idle: at most max in 1 s. */
		ASSERT_TRUE(late <= 8000 + 801);
	}
	qos_free(q);
}

static void test_line(void)
{
	struct qos *q = make("iops-total=100");
	uint64_t now = S, ta = 0, tb = 0, tc = 0, w;
	unsigned i;

	/* Empty the 10-I/O allowance. */
	for (i = 0; admit1(q, false, 512, now, &ta) == 0; i++)
		;
	ASSERT_TRUE(i >= 10 && i <= 11);
	ASSERT_TRUE(ta != 0);			/* A waits, at the head */
	ASSERT_TRUE(admit1(q, false, 512, now, &tb) > 0);
	ASSERT_TRUE(tb == ta + 1);		/* B behind it */
	/* When there is room, only the head goes; a new request (no
	 * ticket) does not jump the line. */
	now += 20 * MS;
	ASSERT_TRUE(admit1(q, false, 512, now, &tc) > 0);
	ASSERT_TRUE(tc == tb + 1);
	ASSERT_TRUE(admit1(q, false, 512, now, &tb) > 0);	/* not B's turn */
	ASSERT_EQ(admit1(q, false, 512, now, &ta), 0);	/* A goes */
	ASSERT_EQ(ta, 0);
	now += 20 * MS;
	ASSERT_EQ(admit1(q, false, 512, now, &tb), 0);	/* then B */
	/* C's owner stays away (its ring stopped, its process died): after a
	 * while the line goes on without it. */
	{
		uint64_t td = 0;

		ASSERT_TRUE(admit1(q, false, 512, now, &td) > 0);
		now += S;
		ASSERT_EQ(admit1(q, false, 512, now, &td), 0);
		/* C comes back with its skipped ticket: it goes first. */
		w = admit1(q, false, 512, now, &tc);
		ASSERT_TRUE(w == 0 || tc != 0);
	}
	/* Cancelled at the head: the next one is the head at once. */
	{
		uint64_t te = 0, tf = 0;

		while (admit1(q, false, 512, now, &te) == 0)
			;
		ASSERT_TRUE(admit1(q, false, 512, now, &tf) > 0);
		qos_cancel(q, te);
		now += 20 * MS;
		ASSERT_EQ(admit1(q, false, 512, now, &tf), 0);
	}
	qos_free(q);
}

/* Turns (qos_admit_turn): the head sleeps at least a slice and then
 * sends a slice's worth at once; two busy queues take turns and share. */
static void test_turns(void)
{
	struct qos *q = make("iops-total=1000");
	struct qos_turn a = { 0 }, b = { 0 };
	uint64_t now = S, wake_a = 0, wake_b = 0, na = 0, nb = 0, wakes = 0;
	const uint64_t slice = 16 * MS;

	/* One queue: every wake-up sends ~16 (a slice at 1,000/s). */
	while (qos_admit_turn(q, false, 512, now, &a, slice) == 0)
		;
	for (unsigned i = 0; i < 50; i++) {
		uint64_t w = qos_admit_turn(q, false, 512, now, &a, slice), n = 0;

		ASSERT_TRUE(w >= slice);
		now += w;
		while (qos_admit_turn(q, false, 512, now, &a, slice) == 0)
			n++;
		ASSERT_TRUE(i == 0 || (n >= 15 && n <= 17));
	}
	qos_free(q);

	/* Two queues, each greedy, each sleeping as told: one budget, in
	 * turns, about half each, a few wake-ups per slice. */
	q = make("iops-total=1000");
	a = b = (struct qos_turn){ 0 };
	now = S;
	while (now < 11 * S) {
		uint64_t w;

		if (now >= wake_a) {
			wakes++;
			while ((w = qos_admit_turn(q, false, 512, now, &a, slice)) == 0)
				na++;
			a.credit = 0;
			wake_a = now + w;
		}
		if (now >= wake_b) {
			wakes++;
			while ((w = qos_admit_turn(q, false, 512, now, &b, slice)) == 0)
				nb++;
			b.credit = 0;
			wake_b = now + w;
		}
		now = MIN(wake_a, wake_b);
	}
	ASSERT_TRUE(na + nb >= 10000 && na + nb <= 10000 + 150);
	ASSERT_TRUE(na * 100 >= (na + nb) * 45 && nb * 100 >= (na + nb) * 45);
	/* Batches, not a wake-up per I/O (about three I/Os a wake-up: a
	 * queue that becomes the head with the bucket just emptied wakes once
	 * for nothing). */
	ASSERT_TRUE(wakes < (na + nb) / 2);
	qos_free(q);
}

static void test_unlimited(void)
{
	struct qos_limits none = { 0 };
	struct qos *q = make("iops-total=10");
	uint64_t t = 0, t2 = 0, now = S;

	while (admit1(q, false, 512, now, &t) == 0)
		;
	ASSERT_TRUE(admit1(q, false, 512, now, &t2) > 0);
	/* set-limits to none: the waiting ones go, and the object says
	 * inactive (the data path then skips it). */
	qos_set(q, &none);
	ASSERT_TRUE(!qos_active(q));
	ASSERT_EQ(admit1(q, false, 512, now, &t), 0);
	ASSERT_EQ(admit1(q, false, 512, now, &t2), 0);
	qos_free(q);
}

static void test_group(void)
{
	char dir[] = "/tmp/vblk-qos-test.XXXXXX", err[400], path[600];
	struct qos_limits l = { 0 }, other = { 0 }, got;
	struct qos *a, *b, *c;
	struct stat st;
	uint64_t ta = 0, tb = 0, na = 0, nb = 0, now, end;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	ASSERT_EQ(qos_limits_parse("iops-total=1000", &l, err, sizeof(err)), 0);
	ASSERT_EQ(qos_limits_parse("iops-total=500", &other, err, sizeof(err)), 0);
	ASSERT_EQ(qos_group_join("tenant1", dir, &l, &a, err, sizeof(err)), 0);
	ASSERT_TRUE(!strcmp(qos_group_name(a), "tenant1"));
	/* A second member with the same limits, or none, joins. */
	ASSERT_EQ(qos_group_join("tenant1", dir, &l, &b, err, sizeof(err)), 0);
	ASSERT_EQ(qos_group_join("tenant1", dir, NULL, &c, err, sizeof(err)), 0);
	/* The group's clock is the machine's (joining reads it). */
	now = sys_now_ns();
	end = now + 10 * S;
	qos_get(c, &got, NULL, now);
	ASSERT_EQ(got.b[QOS_IOPS_TOTAL].avg, 1000);
	qos_free(c);
	/* Other limits: refused, one line. */
	err[0] = '\0';
	ASSERT_EQ(qos_group_join("tenant1", dir, &other, &c, err, sizeof(err)), -EINVAL);
	ASSERT_TRUE(strstr(err, "set-limits --group") && !strchr(err, '\n'));
	ASSERT_EQ(qos_group_join("../x", dir, &l, &c, err, sizeof(err)), -EINVAL);
	/* One budget for both, shared fairly between two greedy members. */
	now = sys_now_ns();
	end = now + 10 * S;
	while (now < end) {
		uint64_t wa = admit1(a, false, 512, now, &ta);
		uint64_t wb = admit1(b, false, 512, now, &tb);

		na += wa == 0;
		nb += wb == 0;
		now += 100000;	/* each asks every 100 us */
	}
	ASSERT_TRUE(na + nb >= 10000 && na + nb <= 10000 + 101);
	ASSERT_TRUE(na * 100 >= (na + nb) * 45 && nb * 100 >= (na + nb) * 45);
	/* A change through one member is every member's. */
	qos_set(a, &other);
	qos_get(b, &got, NULL, now);
	ASSERT_EQ(got.b[QOS_IOPS_TOTAL].avg, 500);
	/* The last one out removes the group. */
	snprintf(path, sizeof(path), "%s/tenant1", dir);
	qos_free(a);
	ASSERT_EQ(stat(path, &st), 0);
	qos_free(b);
	ASSERT_TRUE(stat(path, &st) < 0 && errno == ENOENT);
	rmdir(dir);
}

int main(void)
{
	RUN(test_parse);
	RUN(test_rate_held);
	RUN(test_burst);
	RUN(test_line);
	RUN(test_turns);
	RUN(test_unlimited);
	RUN(test_group);
	return T_EXIT_PASS;
}
