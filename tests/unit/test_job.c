/*
 * Description: the block job framework (job/job.h) with a made-up type
 * whose units complete from a bottom half on a real loop thread: a job
 * runs its units to the end and concludes with the type's summary (also
 * when each unit completes inside the step that started it); pause
 * takes effect after the unit in flight and resume goes on from there;
 * an I/O error pauses the job under the stop policy (the error kept,
 * resume retries the same unit) and fails it under report (enospc: only
 * ENOSPC stops); cancel of a busy job concludes it once the unit is done
 * and calls the type's end; a type with a complete op becomes ready
 * instead of concluding, takes new work when kicked and concludes at
 * complete; complete of a type without one, or of a job not ready, and
 * pause of a paused job are refused with one line; a second job of one
 * type on one disk is refused while the first is not concluded; a rate
 * holds the next unit back (one unit in the first 200 ms at 4 KiB/s) and
 * set-rate 0 lets the rest go; job_disk_released fails the jobs of that
 * disk only; dismiss forgets a concluded job and refuses a running one;
 * at most 8 concluded jobs are kept.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

#include "job/job.h"
#include "loop/loop.h"

#define UNIT 4096

/* A type: units units of UNIT bytes, each completed from a bh one loop
 * iteration later with fail_errno at unit fail_at (once). */
struct fake {
	struct loop_bh *bh;
	struct job *job;
	unsigned units, next;
	unsigned fail_at;
	int fail_errno;
	bool failed_once;
	unsigned steps, ends, completes;
	bool ready_type;
	bool more;		/* ready: one more unit came in */
	bool sync;		/* units complete inside step (at submission) */
};

static struct loop *l;
static struct disk *const disk_a = (struct disk *)0x1000, *const disk_b = (struct disk *)0x2000;

static void unit_done(void *opaque)
{
	struct fake *f = opaque;
	int res = 0;

	if (f->fail_errno && f->next == f->fail_at && !f->failed_once) {
		f->failed_once = true;
		res = -f->fail_errno;
	}
	if (res == 0)
		f->next++;
	job_set_progress(f->job, (uint64_t)f->next * UNIT, (uint64_t)f->units * UNIT);
	job_step_done(f->job, res, res ? 0 : UNIT);
}

static int fake_step(struct job *j, void *priv)
{
	struct fake *f = priv;

	f->steps++;
	if (f->more) {
		f->more = false;
		f->units++;
	}
	if (f->next >= f->units)
		return JOB_STEP_END;
	if (f->sync)
		unit_done(f);
	else
		loop_bh_schedule(f->bh);
	return JOB_STEP_IO;
}

static int fake_finish(struct job *j, void *priv, char *msg, size_t len)
{
	struct fake *f = priv;

	snprintf(msg, len, "fake done, %u units", f->next);
	return 0;
}

static int fake_complete(struct job *j, void *priv, char *msg, size_t len)
{
	struct fake *f = priv;

	f->completes++;
	snprintf(msg, len, "pivoted");
	return 0;
}

/* On the loop, nothing in flight: the unit's bottom half goes too. */
static void fake_end(struct job *j, void *priv)
{
	struct fake *f = priv;

	f->ends++;
	loop_bh_free(f->bh);
	f->bh = NULL;
}

static const struct job_ops fake_ops = {
	.type = "fake", .step = fake_step, .finish = fake_finish, .end = fake_end,
};
static const struct job_ops mirror_ops = {
	.type = "mirrorish", .step = fake_step, .finish = fake_finish, .end = fake_end,
	.complete = fake_complete,
};

static void kick_fn(void *opaque)
{
	job_kick(opaque);
}

static void bh_free_fn(void *opaque)
{
	loop_bh_free(opaque);
}

static void bh_fn(void *opaque)
{
	struct fake *f = opaque;

	ASSERT_EQ(loop_bh_new(l, unit_done, f, &f->bh), 0);
}

static struct job *make(struct fake *f, const struct job_ops *ops, struct disk *d, uint64_t rate,
			enum job_on_error pol, bool start)
{
	char err[256] = "";
	struct job *j;

	loop_call_sync(l, bh_fn, f);
	ASSERT_EQ(job_new(ops, d, l, rate, pol, f, &j, err, sizeof(err)), 0);
	f->job = j;
	if (start)
		job_start(j);
	return j;
}

static bool info(const char *id, struct job_info *out)
{
	struct job_info all[32];
	unsigned n = job_list(all, 32);

	for (unsigned i = 0; i < n && i < 32; i++)
		if (!strcmp(all[i].id, id)) {
			*out = all[i];
			return true;
		}
	return false;
}

/* Wait up to 5 s for job id to reach state s. */
static struct job_info wait_state(const char *id, enum job_state s)
{
	struct job_info i = { 0 };

	for (int k = 0; k < 5000; k++) {
		ASSERT_TRUE(info(id, &i));
		if (i.state == s)
			return i;
		usleep(1000);
	}
	T_FAIL("job %s is %s, not %s", id, job_state_name(i.state), job_state_name(s));
}

static void test_runs_to_the_end(void)
{
	struct fake f = { .units = 50 };
	struct job *j = make(&f, &fake_ops, disk_a, 0, JOB_ERR_REPORT, true);
	struct job_info i = wait_state(job_id(j), JOB_CONCLUDED);

	ASSERT_TRUE(!i.failed && !i.cancelled);
	ASSERT_EQ(i.done, 50 * UNIT);
	ASSERT_EQ(i.total, 50 * UNIT);
	ASSERT_EQ(i.copied, 50 * UNIT);
	ASSERT_EQ(f.next, 50);
	ASSERT_EQ(f.ends, 1);
	ASSERT_TRUE(!strcmp(i.type, "fake"));
}

/* The stream job stalled when a qcow2 cluster that reads as zeroes below
 * completed its copy-up read at submission: the unit's completion ran
 * inside step, and the framework marked the job busy after it, forever
 * (found by the guest test's stream under fio verify). */
static void test_unit_completing_inside_step(void)
{
	struct fake f = { .units = 300, .sync = true };
	struct job *j = make(&f, &fake_ops, disk_a, 0, JOB_ERR_REPORT, true);
	struct job_info i = wait_state(job_id(j), JOB_CONCLUDED);

	ASSERT_TRUE(!i.failed && !i.cancelled);
	ASSERT_EQ(f.next, 300);
	ASSERT_EQ(i.copied, 300 * UNIT);
	/* With a rate: paced, and the pause lands between units. */
	f = (struct fake){ .units = 1000, .sync = true };
	j = make(&f, &fake_ops, disk_a, 40 * UNIT, JOB_ERR_REPORT, true);
	usleep(100000);
	ASSERT_EQ(job_pause(job_id(j), (char[128]){ 0 }, 128), 0);
	i = wait_state(job_id(j), JOB_PAUSED);
	ASSERT_TRUE(f.next >= 1 && f.next < 20);
	ASSERT_EQ(job_cancel(job_id(j), (char[128]){ 0 }, 128), 0);
	ASSERT_TRUE(wait_state(job_id(j), JOB_CONCLUDED).cancelled);
}

static void test_pause_resume(void)
{
	struct fake f = { .units = 1000000 };
	struct job *j = make(&f, &fake_ops, disk_a, 0, JOB_ERR_REPORT, true);
	char err[256];
	struct job_info i;
	unsigned at;

	usleep(20000);
	ASSERT_EQ(job_pause(job_id(j), err, sizeof(err)), 0);
	i = wait_state(job_id(j), JOB_PAUSED);
	at = f.next;
	ASSERT_TRUE(at > 0);
	usleep(20000);
	ASSERT_EQ(f.next, at);		/* no unit while paused */
	ASSERT_EQ(i.done, (uint64_t)at * UNIT);
	ASSERT_EQ(job_pause(job_id(j), err, sizeof(err)), -EINVAL);
	ASSERT_TRUE(strstr(err, "is paused: it cannot pause") != NULL);
	ASSERT_EQ(job_resume(job_id(j), err, sizeof(err)), 0);
	wait_state(job_id(j), JOB_RUNNING);
	usleep(20000);
	ASSERT_TRUE(f.next > at);
	ASSERT_EQ(job_cancel(job_id(j), err, sizeof(err)), 0);
	i = wait_state(job_id(j), JOB_CONCLUDED);
	ASSERT_TRUE(i.cancelled && !i.failed);
	ASSERT_EQ(f.ends, 1);
	ASSERT_EQ(job_resume(job_id(j), err, sizeof(err)), -EINVAL);
	ASSERT_EQ(job_cancel(job_id(j), err, sizeof(err)), -EINVAL);
}

static void test_error_stop_then_retry(void)
{
	struct fake f = { .units = 20, .fail_at = 7, .fail_errno = EIO };
	struct job *j = make(&f, &fake_ops, disk_a, 0, JOB_ERR_STOP, true);
	struct job_info i = wait_state(job_id(j), JOB_PAUSED);
	char err[256];

	ASSERT_EQ(f.next, 7);
	ASSERT_EQ(i.errors, 1);
	ASSERT_TRUE(strstr(i.error, "Input/output error") != NULL);
	ASSERT_EQ(job_resume(job_id(j), err, sizeof(err)), 0);
	i = wait_state(job_id(j), JOB_CONCLUDED);
	ASSERT_TRUE(!i.failed);
	ASSERT_EQ(f.next, 20);		/* unit 7 retried, not skipped */
	ASSERT_EQ(i.error[0], 0);
}

static void test_error_report_and_enospc(void)
{
	struct fake f = { .units = 20, .fail_at = 3, .fail_errno = EIO };
	struct fake g = { .units = 20, .fail_at = 3, .fail_errno = ENOSPC };
	struct job *j = make(&f, &fake_ops, disk_a, 0, JOB_ERR_REPORT, true);
	struct job_info i = wait_state(job_id(j), JOB_CONCLUDED);

	ASSERT_TRUE(i.failed);
	ASSERT_EQ(f.next, 3);
	ASSERT_EQ(f.ends, 1);
	/* enospc: EIO reports... */
	f = (struct fake){ .units = 20, .fail_at = 3, .fail_errno = EIO };
	j = make(&f, &fake_ops, disk_a, 0, JOB_ERR_ENOSPC, true);
	ASSERT_TRUE(wait_state(job_id(j), JOB_CONCLUDED).failed);
	/* ...and ENOSPC stops. */
	j = make(&g, &fake_ops, disk_a, 0, JOB_ERR_ENOSPC, true);
	i = wait_state(job_id(j), JOB_PAUSED);
	ASSERT_TRUE(strstr(i.error, "No space left") != NULL);
	ASSERT_EQ(job_cancel(job_id(j), (char[128]){ 0 }, 128), 0);
	ASSERT_TRUE(wait_state(job_id(j), JOB_CONCLUDED).cancelled);
}

static void test_ready_complete(void)
{
	struct fake f = { .units = 10 };
	struct fake g = { .units = 10 };
	struct job *j = make(&f, &mirror_ops, disk_a, 0, JOB_ERR_REPORT, true);
	struct job *k;
	char err[256], id[32];
	struct job_info i = wait_state(job_id(j), JOB_READY);

	ASSERT_EQ(f.next, 10);
	ASSERT_EQ(f.ends, 0);
	/* New work while ready: kicked, copied, ready again. */
	f.more = true;
	loop_call_sync(l, kick_fn, j);
	for (int n = 0; n < 5000 && f.next < 11; n++)
		usleep(1000);
	ASSERT_EQ(f.next, 11);
	wait_state(job_id(j), JOB_READY);
	/* A second job of the type on the disk: refused. */
	loop_call_sync(l, bh_fn, &g);
	ASSERT_EQ(job_new(&mirror_ops, disk_a, l, 0, JOB_ERR_REPORT, &g, &k, err, sizeof(err)),
		  -EBUSY);
	ASSERT_TRUE(strstr(err, "is ready already") != NULL);
	ASSERT_EQ(job_complete(job_id(j), err, sizeof(err)), 0);
	i = wait_state(job_id(j), JOB_CONCLUDED);
	ASSERT_TRUE(!i.failed && !i.cancelled);
	ASSERT_EQ(f.completes, 1);
	ASSERT_EQ(f.ends, 1);
	ASSERT_EQ(job_complete(job_id(j), err, sizeof(err)), -EINVAL);
	/* A type that ends by itself has nothing to complete. */
	f = (struct fake){ .units = 1000000 };
	j = make(&f, &fake_ops, disk_a, 0, JOB_ERR_REPORT, true);
	ASSERT_EQ(job_complete(job_id(j), err, sizeof(err)), -EINVAL);
	ASSERT_TRUE(strstr(err, "ends by itself") != NULL);
	ASSERT_EQ(job_dismiss(job_id(j), err, sizeof(err)), -EINVAL);
	ASSERT_EQ(job_cancel(job_id(j), err, sizeof(err)), 0);
	wait_state(job_id(j), JOB_CONCLUDED);
	snprintf(id, sizeof(id), "%s", job_id(j));	/* j is freed next */
	ASSERT_EQ(job_dismiss(id, err, sizeof(err)), 0);
	ASSERT_EQ(job_pause(id, err, sizeof(err)), -ENOENT);
	ASSERT_TRUE(strstr(err, "no job") != NULL);
	loop_call_sync(l, bh_free_fn, g.bh);
}

static void test_rate(void)
{
	struct fake f = { .units = 100 };
	struct job *j = make(&f, &fake_ops, disk_a, UNIT, JOB_ERR_REPORT, true);
	char err[256];

	/* 4 KiB/s: the second unit is due a second after the first. */
	usleep(200000);
	ASSERT_EQ(f.next, 1);
	ASSERT_EQ(job_set_rate(job_id(j), 0, err, sizeof(err)), 0);
	ASSERT_TRUE(!wait_state(job_id(j), JOB_CONCLUDED).failed);
	ASSERT_EQ(f.next, 100);
}

static void test_disk_released(void)
{
	struct fake f = { .units = 1000000 }, g = { .units = 1000000 };
	struct job *a = make(&f, &fake_ops, disk_a, 0, JOB_ERR_REPORT, true);
	struct job *b = make(&g, &fake_ops, disk_b, 0, JOB_ERR_REPORT, true);
	struct job_info i;
	char err[256];

	usleep(10000);
	job_disk_released(disk_a, "the disk was let go");
	i = wait_state(job_id(a), JOB_CONCLUDED);
	ASSERT_TRUE(i.failed);
	ASSERT_TRUE(!strcmp(i.error, "the disk was let go"));
	ASSERT_TRUE(info(job_id(b), &i) && i.state == JOB_RUNNING);
	ASSERT_EQ(job_cancel(job_id(b), err, sizeof(err)), 0);
	wait_state(job_id(b), JOB_CONCLUDED);
}

static void test_keeps_eight_concluded(void)
{
	struct job_info all[64];
	struct fake f[12];
	unsigned n, concluded = 0;

	for (unsigned k = 0; k < 12; k++) {
		f[k] = (struct fake){ .units = 1 };
		wait_state(job_id(make(&f[k], &fake_ops, disk_b, 0, JOB_ERR_REPORT, true)),
			   JOB_CONCLUDED);
	}
	n = job_list(all, 64);
	for (unsigned k = 0; k < n; k++)
		concluded += all[k].state == JOB_CONCLUDED;
	ASSERT_TRUE(concluded <= 9);	/* 8, and the newest until the next job_new */
	ASSERT_EQ(job_active(), 0);
}

int main(void)
{
	ASSERT_EQ(loop_new("jobs", &l), 0);
	ASSERT_EQ(loop_thread_start(l), 0);
	RUN(test_runs_to_the_end);
	RUN(test_unit_completing_inside_step);
	RUN(test_pause_resume);
	RUN(test_error_stop_then_retry);
	RUN(test_error_report_and_enospc);
	RUN(test_ready_complete);
	RUN(test_rate);
	RUN(test_disk_released);
	RUN(test_keeps_eight_concluded);
	job_free_all(disk_a);
	job_free_all(disk_b);
	ASSERT_EQ(job_list(NULL, 0), 0);
	loop_thread_join(l);
	loop_free(l);
	return T_EXIT_PASS;
}
