/*
 * Description: the Prometheus renderer and its HTTP server: every line of
 * the text format 0.0.4 well formed (HELP and TYPE once per family before
 * its samples, vblkd_ names, _total on counters, labels quoted), the
 * family names pinned, label values escaped, ns printed as exact seconds,
 * counters never going backwards between scrapes of a real device, the
 * "metrics" control command; then GET /metrics over HTTP on a main loop
 * (200 with the format's content type, HEAD, 404, 405, a stalled client
 * not blocking others), addresses refused with one line and no fd left
 * open, a busy port, and the listening socket adopted and handed over.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "test.h"

#include "acct/acct.h"
#include "backend/bdev.h"
#include "blk/blk.h"
#include "loop/loop.h"
#include "metrics/metrics.h"
#include "util/compiler.h"
#include "util/log.h"

#define NUM_QUEUES	3
#define NUM_IOTHREADS	2

static struct bdev bdev;
static struct blk_dev *dev;
static struct metrics_source src;

/* Every family, in the order rendered: the names are a contract with
 * whoever writes dashboards and alerts (README "Watching it"). */
static const char *const families[] = {
	"vblkd_disk_requests_total",
	"vblkd_disk_bytes_total",
	"vblkd_disk_errors_total",
	"vblkd_disk_request_duration_seconds",
	"vblkd_disk_requests_in_flight",
	"vblkd_disk_busy_seconds_total",
	"vblkd_disk_paused",
	"vblkd_disk_held_requests",
	"vblkd_disk_throttled_requests_total",
	"vblkd_disk_throttled_seconds_total",
	"vblkd_disk_limit_iops",
	"vblkd_disk_limit_read_iops",
	"vblkd_disk_limit_write_iops",
	"vblkd_disk_limit_bytes_per_second",
	"vblkd_disk_limit_read_bytes_per_second",
	"vblkd_disk_limit_write_bytes_per_second",
	"vblkd_disk_image_cache_bytes",
	"vblkd_disk_image_cache_hits_total",
	"vblkd_disk_image_cache_misses_total",
	"vblkd_disk_image_clusters_allocated_total",
	"vblkd_disk_image_copy_on_write_bytes_total",
	"vblkd_disk_image_copy_on_read_bytes_total",
	"vblkd_disk_image_streaming",
	"vblkd_disk_image_stream_position_bytes",
	"vblkd_disk_image_clusters_reused_total",
	"vblkd_disk_image_bitmap_regions_written_ahead_total",
	"vblkd_disk_image_corrupt",
	"vblkd_disk_pauses_total",
	"vblkd_disk_info",
	"vblkd_disk_size_bytes",
	"vblkd_disk_read_only",
	"vblkd_build_info",
	"vblkd_start_time_seconds",
	"vblkd_process_cpu_seconds_total",
	"vblkd_frontend_connected",
	"vblkd_frontend_connections_total",
	"vblkd_nbd_clients",
	"vblkd_nbd_connections_total",
	"vblkd_nbd_refused_total",
	"vblkd_nbd_handshakes_failed_total",
	"vblkd_nbd_requests_total",
	"vblkd_nbd_bad_requests_total",
	"vblkd_nbd_read_bytes_total",
	"vblkd_nbd_written_bytes_total",
	"vblkd_nbd_throttled_requests_total",
	"vblkd_job_info",
	"vblkd_job_done_bytes",
	"vblkd_job_total_bytes",
	"vblkd_job_copied_bytes_total",
	"vblkd_job_rate_limit_bytes_per_second",
	"vblkd_job_errors_total",
	"vblkd_backup_scratch_bytes",
	"vblkd_backup_saved_chunks_total",
	"vblkd_backup_read_bytes_total",
	"vblkd_backup_write_waits_total",
	"vblkd_mirror_dirty_bytes",
	"vblkd_mirror_copied_bytes_total",
	"vblkd_mirror_zeroed_bytes_total",
	"vblkd_mirror_passes_total",
	"vblkd_mirror_written_through_total",
	"vblkd_mirror_written_through_bytes_total",
	"vblkd_mirror_ready",
	"vblkd_mirror_yielded_total",
	"vblkd_poll_max_seconds",
	"vblkd_completion_poll_max_seconds",
	"vblkd_poll_grow",
	"vblkd_poll_shrink",
	"vblkd_queue_iothread",
	"vblkd_queue_requests_total",
	"vblkd_queue_bad_requests_total",
	"vblkd_queue_kicks_total",
	"vblkd_queue_calls_total",
	"vblkd_queue_calls_early_total",
	"vblkd_queue_calls_suppressed_total",
	"vblkd_queue_calls_held_total",
	"vblkd_queue_calls_held_idle_total",
	"vblkd_queue_calls_held_wasted_total",
	"vblkd_queue_completions_coalesced_total",
	"vblkd_queue_hold_seconds_total",
	"vblkd_queue_hold_late_seconds_total",
	"vblkd_queue_hold_max_seconds",
	"vblkd_queue_throttled_requests_total",
	"vblkd_queue_throttled_seconds_total",
	"vblkd_queue_poll_hits_total",
	"vblkd_queue_poll_misses_total",
	"vblkd_queue_poll_vain_total",
	"vblkd_queue_poll_window_seconds",
	"vblkd_iothread_busy_seconds_total",
	"vblkd_iothread_cpu_seconds_total",
	"vblkd_iothread_poll_seconds_total",
	"vblkd_iothread_contended_total",
	"vblkd_iothread_backend_submits_total",
	"vblkd_iothread_backend_polled_total",
	"vblkd_iothread_backend_sync_total",
	"vblkd_iothread_completion_windows_total",
	"vblkd_iothread_completion_poll_hits_total",
	"vblkd_iothread_completion_poll_misses_total",
	"vblkd_iothread_device_spin_checks_total",
	"vblkd_iothread_device_spin_off",
	"vblkd_iothread_poll_yields_total",
	"vblkd_iothread_poll_checks_total",
	"vblkd_iothread_poll_checks_off_total",
	"vblkd_iothread_poll_checks_aborted_total",
	"vblkd_iothread_poll_check_off",
	"vblkd_iothread_pinned_cpu",
};

/* The operations, the values of label op of the vblkd_disk_ families. */
static const char *const ops[] = { "read", "write", "flush", "discard", "write_zeroes", "get_id" };

/* The latency buckets' le: 2^i us in seconds, as Prometheus' clients
 * write a float; then +Inf. */
static const char *const les[] = {
	"1e-06", "2e-06", "4e-06", "8e-06", "1.6e-05", "3.2e-05", "6.4e-05", "0.000128",
	"0.000256", "0.000512", "0.001024", "0.002048", "0.004096", "0.008192", "0.016384",
	"0.032768", "0.065536", "0.131072", "0.262144", "0.524288", "1.048576", "2.097152",
	"4.194304", "8.388608", "16.777216", "+Inf",
};

/* ---- A checker for the text format ---- */

struct sample {
	char name[96];		/* with _bucket, _sum, _count in a histogram */
	char labels[256];	/* as written between the braces */
	double value;
};

#define MAX_SAMPLES 1024

struct parsed {
#define MAX_FAMILIES 128
	char fam[MAX_FAMILIES][96];	/* in order */
	char type[MAX_FAMILIES][16];	/* the same index */
	unsigned nfam;
	struct sample s[MAX_SAMPLES];
	unsigned ns;
};

static bool name_ok(const char *s, size_t n)
{
	if (!n || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
		return false;
	for (size_t i = 1; i < n; i++)
		if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
			return false;
	return true;
}

/* {k="v",...}: names valid, values quoted with only \\ \" \n escapes.
 * Returns the length up to and with the closing brace, or 0. */
static size_t labels_len(const char *s)
{
	const char *p = s + 1;

	if (*s != '{')
		return 0;
	while (*p != '}') {
		const char *k = p;

		while (isalnum((unsigned char)*p) || *p == '_')
			p++;
		if (!name_ok(k, (size_t)(p - k)) || *p++ != '=' || *p++ != '"')
			return 0;
		while (*p != '"') {
			if (*p == '\n' || !*p)
				return 0;
			if (*p == '\\') {
				p++;
				if (*p != '\\' && *p != '"' && *p != 'n')
					return 0;
			}
			p++;
		}
		p++;
		if (*p == ',')
			p++;
		else if (*p != '}')
			return 0;
	}
	return (size_t)(p - s) + 1;
}

/* A histogram's sample name after the family's: _bucket (with labels,
 * le among them), _sum or _count. */
static bool hist_suffix(const char *s, size_t n, char next)
{
	return (n == 7 && !strncmp(s, "_bucket", 7) && next == '{') ||
	       (n == 4 && !strncmp(s, "_sum", 4)) || (n == 6 && !strncmp(s, "_count", 6));
}

/* Parse text, failing the test on anything the format (or our own rules)
 * does not allow. */
static void parse(const char *text, struct parsed *out)
{
	const char *line = text;
	bool help_seen = false;

	memset(out, 0, sizeof(*out));
	if (!*text || text[strlen(text) - 1] != '\n')
		T_FAIL("the text does not end with a line feed");
	while (*line) {
		const char *nl = strchr(line, '\n');
		size_t len = (size_t)(nl - line);
		char buf[512];

		if (len >= sizeof(buf))
			T_FAIL("line too long: %.80s", line);
		memcpy(buf, line, len);
		buf[len] = '\0';
		line = nl + 1;
		if (!strncmp(buf, "# HELP ", 7)) {
			char *name = buf + 7, *sp = strchr(name, ' ');

			if (!sp || !sp[1] || !name_ok(name, (size_t)(sp - name)))
				T_FAIL("bad HELP line: %s", buf);
			*sp = '\0';
			for (unsigned i = 0; i < out->nfam; i++)
				if (!strcmp(out->fam[i], name))
					T_FAIL("family %s twice", name);
			if (out->nfam == ARRAY_SIZE(out->fam))
				T_FAIL("too many families");
			snprintf(out->fam[out->nfam], sizeof(out->fam[0]), "%.95s", name);
			help_seen = true;
			continue;
		}
		if (!strncmp(buf, "# TYPE ", 7)) {
			char *name = buf + 7, *sp = strchr(name, ' ');

			if (!help_seen || !sp)
				T_FAIL("TYPE without HELP first: %s", buf);
			*sp = '\0';
			if (strcmp(name, out->fam[out->nfam]))
				T_FAIL("TYPE %s after HELP %s", name, out->fam[out->nfam]);
			if (strcmp(sp + 1, "counter") && strcmp(sp + 1, "gauge") &&
			    strcmp(sp + 1, "histogram"))
				T_FAIL("type %s of %s", sp + 1, name);
			snprintf(out->type[out->nfam], sizeof(out->type[0]), "%.15s", sp + 1);
			out->nfam++;
			help_seen = false;
			continue;
		}
		if (buf[0] == '#' || !out->nfam || help_seen)
			T_FAIL("sample outside a family: %s", buf);
		{
			struct sample *s = &out->s[out->ns];
			const char *fam = out->fam[out->nfam - 1];
			size_t nl2 = strcspn(buf, "{ "), ll = 0, fl = strlen(fam);
			bool hist = !strcmp(out->type[out->nfam - 1], "histogram");
			char *end;

			if (out->ns == MAX_SAMPLES)
				T_FAIL("too many samples");
			if (nl2 < fl || strncmp(buf, fam, fl) ||
			    (hist ? !hist_suffix(buf + fl, nl2 - fl, buf[nl2]) : nl2 != fl))
				T_FAIL("sample %s in family %s", buf, fam);
			if (buf[nl2] == '{') {
				ll = labels_len(buf + nl2);
				if (!ll)
					T_FAIL("bad labels: %s", buf);
				snprintf(s->labels, sizeof(s->labels), "%.*s", (int)ll - 2,
					 buf + nl2 + 1);
			}
			if (buf[nl2 + ll] != ' ' || !buf[nl2 + ll + 1])
				T_FAIL("no value: %s", buf);
			s->value = strtod(buf + nl2 + ll + 1, &end);
			if (*end)
				T_FAIL("value is not a number: %s", buf);
			if (nl2 >= sizeof(s->name))
				T_FAIL("sample name too long: %s", buf);
			memcpy(s->name, buf, nl2);
			s->name[nl2] = '\0';
			out->ns++;
		}
	}
	if (help_seen)
		T_FAIL("HELP without TYPE at the end");
}

/* The sample of name with exactly these labels ("" for none). */
static const struct sample *sample(const struct parsed *p, const char *name, const char *labels)
{
	for (unsigned i = 0; i < p->ns; i++)
		if (!strcmp(p->s[i].name, name) && !strcmp(p->s[i].labels, labels))
			return &p->s[i];
	T_FAIL("no sample %s{%s}", name, labels);
}

/* The line of text that starts with prefix. */
static const char *line_of(const char *text, const char *prefix)
{
	const char *p = text;

	while (p && *p) {
		if (!strncmp(p, prefix, strlen(prefix)))
			return p;
		p = strchr(p, '\n');
		p = p ? p + 1 : NULL;
	}
	T_FAIL("no line %s in:\n%s", prefix, text);
}

static void expect_line(const char *text, const char *want)
{
	const char *l = line_of(text, want);

	if (l[strlen(want)] != '\n')
		T_FAIL("want line \"%s\", got \"%.*s\"", want, (int)strcspn(l, "\n"), l);
}

/* ---- Synthetic snapshots ---- */

static struct blk_queue_stats fake_q[2];
static struct blk_iothread_stats fake_t[1];
static struct blk_stats fake_blk = {
	.num_queues = 2, .num_iothreads = 1, .queues = fake_q, .iothreads = fake_t,
	.poll = { .max_ns = 65536, .grow = 2, .shrink = 0, .completion_max_ns = 262144 },
};

static const struct job_info fake_jobs[1] = {
	{ .id = "stream-1", .type = "stream", .state = JOB_PAUSED, .done = 4096, .total = 65536,
	  .rate = 1048576, .copied = 8192, .errors = 1 },
};

static const struct bkp_info fake_backups[1] = {
	{ .name = "full", .job = "backup-2", .scratch_bytes = 1 << 20, .saved_chunks = 16,
	  .read_bytes = 8192, .waits = 3 },
};

static const struct mir_info fake_mirrors[1] = {
	{ .name = "m1", .job = "mirror-3", .dirty = 65536, .copied = 1 << 20, .zeroed = 4096,
	  .passes = 2, .wb_writes = 7, .wb_bytes = 28672, .ready = true },
};

static struct metrics_snapshot fake(void)
{
	return (struct metrics_snapshot){
		.blk = &fake_blk, .version = "1.2.3", .disk_path = "/dev/vg/disk1",
		.engine = "io_uring", .disk_size = 1ull << 30, .frontend_connected = true,
		.frontend_connections = 3, .start_time_ns = 1700000000123000000ull,
		.process_cpu_ns = 2500000000ull, .jobs = fake_jobs, .njobs = 1,
		.backups = fake_backups, .nbackups = 1, .mirrors = fake_mirrors, .nmirrors = 1,
	};
}

static char *format(const struct metrics_snapshot *s)
{
	char *text;
	int n = metrics_format(s, &text);

	ASSERT_TRUE(n > 0);
	ASSERT_EQ(n, strlen(text));
	return text;
}

/* Every line well formed; the families are exactly the list, counters end
 * in _total and nothing else does; a series per queue, per iothread, per
 * operation (a histogram's counted by its _count). */
static void test_format_lines_and_families(void)
{
	static struct parsed p;
	struct metrics_snapshot s = fake();
	char *text = format(&s);

	parse(text, &p);
	ASSERT_EQ(p.nfam, ARRAY_SIZE(families));
	for (unsigned i = 0; i < p.nfam; i++) {
		size_t l = strlen(p.fam[i]);
		bool total = l > 6 && !strcmp(p.fam[i] + l - 6, "_total");
		unsigned n = 0;

		if (strcmp(p.fam[i], families[i]))
			T_FAIL("family %u is %s, want %s", i, p.fam[i], families[i]);
		char name[128];

		if (total != !strcmp(p.type[i], "counter"))
			T_FAIL("%s is a %s", p.fam[i], p.type[i]);
		snprintf(name, sizeof(name), "%s%s", p.fam[i],
			 strcmp(p.type[i], "histogram") ? "" : "_count");
		for (unsigned j = 0; j < p.ns; j++)
			n += !strcmp(p.s[j].name, name);
		if (!strncmp(p.fam[i], "vblkd_queue_", 12))
			ASSERT_EQ(n, 2);
		else if (i < 4)	/* the families per operation, of both fronts */
			ASSERT_EQ(n, 2 * ARRAY_SIZE(ops));
		else if (!strcmp(p.fam[i], "vblkd_disk_pauses_total"))	/* per reason */
			ASSERT_EQ(n, DISK_PAUSE_NR);
		else
			ASSERT_EQ(n, 1);
	}
	ASSERT_TRUE(strstr(text, "\n\n") == NULL);
	expect_line(text, "vblkd_build_info{version=\"1.2.3\"} 1");
	expect_line(text, "vblkd_disk_info{path=\"/dev/vg/disk1\",engine=\"io_uring\"} 1");
	expect_line(text, "vblkd_disk_size_bytes 1073741824");
	expect_line(text, "vblkd_frontend_connected 1");
	expect_line(text, "vblkd_frontend_connections_total 3");
	expect_line(text, "vblkd_queue_requests_total{queue=\"1\"} 0");
	expect_line(text, "vblkd_iothread_pinned_cpu{iothread=\"0\"} 0");
	expect_line(text, "# TYPE vblkd_queue_requests_total counter");
	expect_line(text, "vblkd_job_info{id=\"stream-1\",type=\"stream\",state=\"paused\","
		    "result=\"\"} 1");
	expect_line(text, "vblkd_job_done_bytes{id=\"stream-1\",type=\"stream\"} 4096");
	expect_line(text, "vblkd_job_rate_limit_bytes_per_second{id=\"stream-1\",type=\"stream\"} "
		    "1048576");
	expect_line(text, "vblkd_job_errors_total{id=\"stream-1\",type=\"stream\"} 1");
	expect_line(text, "vblkd_backup_scratch_bytes{name=\"full\",job=\"backup-2\"} 1048576");
	expect_line(text, "vblkd_backup_saved_chunks_total{name=\"full\",job=\"backup-2\"} 16");
	expect_line(text, "vblkd_backup_write_waits_total{name=\"full\",job=\"backup-2\"} 3");
	free(text);
}

/* Each counter lands in its own family, for the right queue. */
static void test_fields_map_to_families(void)
{
	static struct parsed p;
	struct metrics_snapshot s = fake();
	char *text;

	memset(fake_q, 0, sizeof(fake_q));
	fake_q[1] = (struct blk_queue_stats){
		.iothread = 0, .requests = 101, .kicks = 102, .calls = 103, .calls_early = 104,
		.calls_suppressed = 105, .calls_held = 106, .completions_coalesced = 107,
		.hold_ns_max = 108, .hold_ns_total = 109, .bad_requests = 110, .poll_hits = 111,
		.poll_misses = 112, .poll_ns = 113, .calls_held_idle = 114,
		.calls_held_wasted = 115, .poll_vain = 116, .hold_late_ns_total = 117,
	};
	fake_t[0] = (struct blk_iothread_stats){ .busy_ns = 1, .cpu_ns = 2, .poll_ns_total = 3,
						 .contended = 4, .backend_submits = 5,
						 .completion_windows = 6,
						 .completion_poll_hits = 7,
						 .completion_poll_misses = 8,
						 .poll_yields = 9, .backend_polled = 10,
						 .backend_sync = 11,
						 .cpu = -1 };
	text = format(&s);
	parse(text, &p);
	ASSERT_EQ(sample(&p, "vblkd_queue_requests_total", "queue=\"1\"")->value, 101);
	ASSERT_EQ(sample(&p, "vblkd_queue_kicks_total", "queue=\"1\"")->value, 102);
	ASSERT_EQ(sample(&p, "vblkd_queue_calls_total", "queue=\"1\"")->value, 103);
	ASSERT_EQ(sample(&p, "vblkd_queue_calls_early_total", "queue=\"1\"")->value, 104);
	ASSERT_EQ(sample(&p, "vblkd_queue_calls_suppressed_total", "queue=\"1\"")->value, 105);
	ASSERT_EQ(sample(&p, "vblkd_queue_calls_held_total", "queue=\"1\"")->value, 106);
	ASSERT_EQ(sample(&p, "vblkd_queue_calls_held_idle_total", "queue=\"1\"")->value, 114);
	ASSERT_EQ(sample(&p, "vblkd_queue_calls_held_wasted_total", "queue=\"1\"")->value, 115);
	ASSERT_EQ(sample(&p, "vblkd_queue_completions_coalesced_total", "queue=\"1\"")->value,
		  107);
	expect_line(text, "vblkd_queue_hold_max_seconds{queue=\"1\"} 0.000000108");
	expect_line(text, "vblkd_queue_hold_seconds_total{queue=\"1\"} 0.000000109");
	expect_line(text, "vblkd_queue_hold_late_seconds_total{queue=\"1\"} 0.000000117");
	ASSERT_EQ(sample(&p, "vblkd_queue_bad_requests_total", "queue=\"1\"")->value, 110);
	ASSERT_EQ(sample(&p, "vblkd_queue_poll_hits_total", "queue=\"1\"")->value, 111);
	ASSERT_EQ(sample(&p, "vblkd_queue_poll_misses_total", "queue=\"1\"")->value, 112);
	ASSERT_EQ(sample(&p, "vblkd_queue_poll_vain_total", "queue=\"1\"")->value, 116);
	expect_line(text, "vblkd_queue_poll_window_seconds{queue=\"1\"} 0.000000113");
	ASSERT_EQ(sample(&p, "vblkd_queue_requests_total", "queue=\"0\"")->value, 0);
	expect_line(text, "vblkd_iothread_busy_seconds_total{iothread=\"0\"} 0.000000001");
	expect_line(text, "vblkd_iothread_cpu_seconds_total{iothread=\"0\"} 0.000000002");
	expect_line(text, "vblkd_iothread_poll_seconds_total{iothread=\"0\"} 0.000000003");
	expect_line(text, "vblkd_iothread_contended_total{iothread=\"0\"} 4");
	expect_line(text, "vblkd_iothread_backend_submits_total{iothread=\"0\"} 5");
	expect_line(text, "vblkd_iothread_backend_polled_total{iothread=\"0\"} 10");
	expect_line(text, "vblkd_iothread_backend_sync_total{iothread=\"0\"} 11");
	expect_line(text, "vblkd_iothread_completion_windows_total{iothread=\"0\"} 6");
	expect_line(text, "vblkd_iothread_completion_poll_hits_total{iothread=\"0\"} 7");
	expect_line(text, "vblkd_iothread_completion_poll_misses_total{iothread=\"0\"} 8");
	expect_line(text, "vblkd_iothread_poll_yields_total{iothread=\"0\"} 9");
	expect_line(text, "vblkd_iothread_pinned_cpu{iothread=\"0\"} -1");
	free(text);
}

/* The disk's families, pinned: first in the text, a series per operation
 * (front="virtio-blk",op="read", ...) of requests, bytes and errors; the latency histogram
 * with the buckets cumulative at le 1e-06 ... 16.777216 and +Inf, _sum in
 * seconds, _count; in flight and busy time without labels. */
static void test_disk_families_pinned(void)
{
	static struct parsed p;
	struct metrics_snapshot s = fake();
	char *text, want[256];
	uint64_t cum = 0;

	memset(fake_blk.ops, 0, sizeof(fake_blk.ops));
	fake_blk.ops[ACCT_READ] = (struct blk_op_stats){ .requests = 5, .bytes = 20480,
							 .errors = 2, .total_ns = 12345 };
	fake_blk.ops[ACCT_READ].latency[0] = 2;
	fake_blk.ops[ACCT_READ].latency[3] = 3;
	fake_blk.ops[ACCT_WRITE_ZEROES] = (struct blk_op_stats){ .requests = 1, .bytes = 1 << 20,
								 .total_ns = 1500000000 };
	fake_blk.ops[ACCT_WRITE_ZEROES].latency[ACCT_BUCKETS - 1] = 1;
	fake_blk.ops[ACCT_GET_ID].errors = 7;
	fake_blk.disk = (struct blk_disk_stats){ .in_flight = 3, .busy_ns = 2500000000,
						 .iothreads = 1 };
	text = format(&s);
	parse(text, &p);
	if (strncmp(text, "# HELP vblkd_disk_requests_total ", 33))
		T_FAIL("the text starts with %.60s", text);
	expect_line(text, "# TYPE vblkd_disk_request_duration_seconds histogram");
	expect_line(text, "vblkd_disk_requests_total{front=\"virtio-blk\",op=\"read\"} 5");
	expect_line(text, "vblkd_disk_bytes_total{front=\"virtio-blk\",op=\"read\"} 20480");
	expect_line(text, "vblkd_disk_errors_total{front=\"virtio-blk\",op=\"read\"} 2");
	expect_line(text, "vblkd_disk_requests_total{front=\"virtio-blk\",op=\"write_zeroes\"} 1");
	expect_line(text, "vblkd_disk_bytes_total{front=\"virtio-blk\",op=\"write_zeroes\"} 1048576");
	expect_line(text, "vblkd_disk_errors_total{front=\"virtio-blk\",op=\"get_id\"} 7");
	for (unsigned i = 0; i < ARRAY_SIZE(ops); i++) {
		char lab[64];

		snprintf(lab, sizeof(lab), "front=\"virtio-blk\",op=\"%s\"", ops[i]);
		sample(&p, "vblkd_disk_requests_total", lab);
		sample(&p, "vblkd_disk_request_duration_seconds_count", lab);
	}
	ASSERT_EQ(ARRAY_SIZE(les), ACCT_BUCKETS);
	for (unsigned i = 0; i < ACCT_BUCKETS; i++) {
		cum += fake_blk.ops[ACCT_READ].latency[i];
		snprintf(want, sizeof(want), "vblkd_disk_request_duration_seconds_bucket"
			 "{front=\"virtio-blk\",op=\"read\",le=\"%s\"} %" PRIu64, les[i], cum);
		expect_line(text, want);
		snprintf(want, sizeof(want), "vblkd_disk_request_duration_seconds_bucket"
			 "{front=\"virtio-blk\",op=\"write_zeroes\",le=\"%s\"} %u", les[i], i == ACCT_BUCKETS - 1);
		expect_line(text, want);
	}
	expect_line(text, "vblkd_disk_request_duration_seconds_sum{front=\"virtio-blk\",op=\"read\"} 0.000012345");
	expect_line(text, "vblkd_disk_request_duration_seconds_count{front=\"virtio-blk\",op=\"read\"} 5");
	expect_line(text, "vblkd_disk_request_duration_seconds_sum{front=\"virtio-blk\",op=\"write_zeroes\"} 1.5");
	expect_line(text, "vblkd_disk_request_duration_seconds_count{front=\"virtio-blk\",op=\"write_zeroes\"} 1");
	expect_line(text, "vblkd_disk_request_duration_seconds_count{front=\"virtio-blk\",op=\"get_id\"} 0");
	/* The NBD front's series in the same families, after the device's. */
	expect_line(text, "vblkd_disk_requests_total{front=\"nbd\",op=\"read\"} 0");
	expect_line(text, "vblkd_disk_request_duration_seconds_count{front=\"nbd\",op=\"flush\"} 0");
	expect_line(text, "vblkd_disk_requests_in_flight 3");
	expect_line(text, "vblkd_disk_busy_seconds_total 2.5");
	free(text);
	memset(fake_blk.ops, 0, sizeof(fake_blk.ops));
	memset(&fake_blk.disk, 0, sizeof(fake_blk.disk));
}

/* ns become seconds exactly: no rounding, no exponent, no trailing
 * zeros, the largest counter whole. */
static void test_seconds_conversion_exact(void)
{
	static const struct {
		uint64_t ns;
		const char *s;
	} cases[] = {
		{ 0, "0" },
		{ 1, "0.000000001" },
		{ 10, "0.00000001" },
		{ 65536, "0.000065536" },
		{ 999999999, "0.999999999" },
		{ 1000000000, "1" },
		{ 1500000000, "1.5" },
		{ 12345678901, "12.345678901" },
		{ 86400000000000, "86400" },
		{ UINT64_MAX, "18446744073.709551615" },
	};
	struct metrics_snapshot s = fake();
	char want[128];

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		char *text;

		fake_q[0].hold_ns_total = cases[i].ns;
		fake_t[0].cpu_ns = cases[i].ns;
		s.process_cpu_ns = cases[i].ns;
		text = format(&s);
		snprintf(want, sizeof(want), "vblkd_queue_hold_seconds_total{queue=\"0\"} %s",
			 cases[i].s);
		expect_line(text, want);
		snprintf(want, sizeof(want), "vblkd_iothread_cpu_seconds_total{iothread=\"0\"} %s",
			 cases[i].s);
		expect_line(text, want);
		snprintf(want, sizeof(want), "vblkd_process_cpu_seconds_total %s", cases[i].s);
		expect_line(text, want);
		free(text);
	}
	s = fake();
	{
		char *text = format(&s);

		expect_line(text, "vblkd_start_time_seconds 1700000000.123");
		expect_line(text, "vblkd_poll_max_seconds 0.000065536");
		expect_line(text, "vblkd_completion_poll_max_seconds 0.000262144");
		free(text);
	}
}

/* Label values are escaped as the format says: backslash, double quote
 * and line feed; nothing else (a tab, UTF-8) is touched. */
static void test_label_values_escaped(void)
{
	static struct parsed p;
	struct metrics_snapshot s = fake();
	char *text;

	s.disk_path = "/img/a\"b\\c\nd\te-\xc3\xa9";
	s.version = "0.1\"x";
	text = format(&s);
	expect_line(text, "vblkd_disk_info{path=\"/img/a\\\"b\\\\c\\nd\te-\xc3\xa9\","
		    "engine=\"io_uring\"} 1");
	expect_line(text, "vblkd_build_info{version=\"0.1\\\"x\"} 1");
	parse(text, &p);
	free(text);
	/* No path (a disk without one): an empty label value. */
	s.disk_path = NULL;
	text = format(&s);
	expect_line(text, "vblkd_disk_info{path=\"\",engine=\"io_uring\"} 1");
	free(text);
}

/* ---- A real device ---- */

/* Two scrapes of a running device: same series, no counter goes back,
 * the iothreads' CPU time is there and grows; queues labelled 0..2 on
 * iothreads q mod 2. */
static void test_real_device_counters_monotone(void)
{
	static struct parsed a, b;
	char *t1, *t2;
	double cpu_a = 0, cpu_b = 0;

	ASSERT_TRUE(metrics_render(&src, &t1) > 0);
	parse(t1, &a);
	for (int i = 0; i < 200; i++) {
		struct blk_stats st;

		ASSERT_EQ(blk_stats_snapshot(dev, &st), 0);	/* work for the iothreads */
		blk_stats_release(&st);
	}
	ASSERT_TRUE(metrics_render(&src, &t2) > 0);
	parse(t2, &b);
	ASSERT_EQ(a.nfam, ARRAY_SIZE(families));
	ASSERT_EQ(a.ns, b.ns);
	for (unsigned i = 0; i < a.ns; i++) {
		size_t l = strlen(a.s[i].name);

		ASSERT_TRUE(!strcmp(a.s[i].name, b.s[i].name));
		ASSERT_TRUE(!strcmp(a.s[i].labels, b.s[i].labels));
		if (l > 6 && !strcmp(a.s[i].name + l - 6, "_total") && b.s[i].value < a.s[i].value)
			T_FAIL("%s{%s} went from %.9f to %.9f", a.s[i].name, a.s[i].labels,
			       a.s[i].value, b.s[i].value);
	}
	for (unsigned t = 0; t < NUM_IOTHREADS; t++) {
		char lab[32];

		snprintf(lab, sizeof(lab), "iothread=\"%u\"", t);
		cpu_a += sample(&a, "vblkd_iothread_cpu_seconds_total", lab)->value;
		cpu_b += sample(&b, "vblkd_iothread_cpu_seconds_total", lab)->value;
	}
	ASSERT_TRUE(cpu_a > 0);
	ASSERT_TRUE(cpu_b > cpu_a);
	ASSERT_TRUE(sample(&b, "vblkd_process_cpu_seconds_total", "")->value >=
		    sample(&a, "vblkd_process_cpu_seconds_total", "")->value);
	ASSERT_EQ(sample(&a, "vblkd_queue_iothread", "queue=\"2\"")->value, 0);
	ASSERT_EQ(sample(&a, "vblkd_queue_iothread", "queue=\"1\"")->value, 1);
	ASSERT_EQ(sample(&a, "vblkd_disk_size_bytes", "")->value, 1 << 20);
	/* Nothing connected: no request, none in flight, never busy. */
	ASSERT_EQ(sample(&a, "vblkd_disk_requests_in_flight", "")->value, 0);
	ASSERT_EQ(sample(&a, "vblkd_disk_busy_seconds_total", "")->value, 0);
	ASSERT_EQ(sample(&b, "vblkd_disk_requests_total", "front=\"virtio-blk\",op=\"read\"")->value, 0);
	ASSERT_EQ(sample(&b, "vblkd_disk_request_duration_seconds_bucket",
			 "front=\"virtio-blk\",op=\"write\",le=\"+Inf\"")->value, 0);
	ASSERT_EQ(sample(&a, "vblkd_frontend_connected", "")->value, 0);
	expect_line(t1, "vblkd_disk_info{path=\"(null)\",engine=\"null\"} 1");
	free(t1);
	free(t2);
}

/* The control command: {"metrics": TEXT}, TEXT the rendered metrics. */
static void test_ctl_command_carries_text(void)
{
	struct json_object *req = json_tokener_parse("{\"cmd\": \"metrics\"}");
	struct json_object *reply = json_object_new_object(), *m;
	static struct parsed p;
	char err[128] = "";

	ASSERT_EQ(metrics_ctl_cmd(&src, req, reply, err, sizeof(err)), 0);
	ASSERT_EQ(json_object_object_length(reply), 1);
	ASSERT_TRUE(json_object_object_get_ex(reply, "metrics", &m));
	ASSERT_TRUE(json_object_is_type(m, json_type_string));
	parse(json_object_get_string(m), &p);
	ASSERT_EQ(p.nfam, ARRAY_SIZE(families));
	json_object_put(req);
	json_object_put(reply);
}

/* ---- HTTP ---- */

static struct loop *main_loop;

/* A listening TCP socket on 127.0.0.1, any port. */
static int tcp_listener(unsigned *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_TRUE(fd >= 0);
	ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ASSERT_EQ(listen(fd, 8), 0);
	ASSERT_EQ(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	*port = ntohs(sa.sin_port);
	return fd;
}

struct client {
	unsigned port;
	const char *req;
	bool stall;		/* a second client first leaves a request half sent */
	char reply[65536];
};

static int connect_port(unsigned port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static void *client_thread(void *arg)
{
	struct client *c = arg;
	int stalled = -1, fd;
	size_t got = 0;
	ssize_t r;

	c->reply[0] = '\0';
	if (c->stall) {
		stalled = connect_port(c->port);
		if (stalled >= 0)
			(void)!send(stalled, "GET /metr", 9, MSG_NOSIGNAL);
		usleep(100000);
	}
	fd = connect_port(c->port);
	if (fd >= 0 && send(fd, c->req, strlen(c->req), MSG_NOSIGNAL) >= 0) {
		while (got < sizeof(c->reply) - 1 &&
		       (r = recv(fd, c->reply + got, sizeof(c->reply) - 1 - got, 0)) > 0)
			got += (size_t)r;
		c->reply[got] = '\0';
	}
	if (fd >= 0)
		close(fd);
	if (stalled >= 0)
		close(stalled);
	loop_stop(main_loop);
	return NULL;
}

/* One HTTP exchange while this thread runs the main loop. */
static const char *http(unsigned port, const char *req, bool stall)
{
	static struct client c;
	pthread_t t;

	c = (struct client){ .port = port, .req = req, .stall = stall };
	ASSERT_EQ(pthread_create(&t, NULL, client_thread, &c), 0);
	ASSERT_EQ(loop_run(main_loop), 0);
	ASSERT_EQ(pthread_join(t, NULL), 0);
	return c.reply;
}

static const char *body_of(const char *reply)
{
	const char *b = strstr(reply, "\r\n\r\n");

	if (!b)
		T_FAIL("no HTTP header end in: %.200s", reply);
	return b + 4;
}

static void test_http_get_head_404_405(void)
{
	static struct parsed p;
	struct metrics_http *h;
	char err[256];
	const char *rep;
	unsigned port;

	ASSERT_EQ(metrics_http_new("127.0.0.1:0", -1, main_loop, &src, &h, err, sizeof(err)), 0);
	port = metrics_http_port(h);
	ASSERT_TRUE(port > 0);

	rep = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", false);
	if (strncmp(rep, "HTTP/1.1 200 ", 13) ||
	    !strstr(rep, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"))
		T_FAIL("GET /metrics: %.300s", rep);
	parse(body_of(rep), &p);
	ASSERT_EQ(p.nfam, ARRAY_SIZE(families));

	rep = http(port, "HEAD /metrics HTTP/1.0\r\n\r\n", false);
	ASSERT_TRUE(!strncmp(rep, "HTTP/1.1 200 ", 13));
	ASSERT_EQ(strlen(body_of(rep)), 0);

	rep = http(port, "GET /metrics?name[]=x HTTP/1.0\r\n\r\n", false);
	ASSERT_TRUE(!strncmp(rep, "HTTP/1.1 200 ", 13));

	rep = http(port, "GET / HTTP/1.0\r\n\r\n", false);
	if (strncmp(rep, "HTTP/1.1 404 ", 13))
		T_FAIL("GET /: %.200s", rep);
	rep = http(port, "GET /metricsx HTTP/1.0\r\n\r\n", false);
	ASSERT_TRUE(!strncmp(rep, "HTTP/1.1 404 ", 13));

	rep = http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc", false);
	if (strncmp(rep, "HTTP/1.1 405 ", 13) || !strstr(rep, "\r\nAllow: GET, HEAD\r\n"))
		T_FAIL("POST: %.200s", rep);
	rep = http(port, "DELETE /metrics HTTP/1.0\r\n\r\n", false);
	ASSERT_TRUE(!strncmp(rep, "HTTP/1.1 405 ", 13));
	rep = http(port, "PUT /other HTTP/1.0\r\nContent-Length: 0\r\n\r\n", false);
	ASSERT_TRUE(!strncmp(rep, "HTTP/1.1 405 ", 13));

	/* A client that stops mid-request does not hold up the next one:
	 * nothing in the main loop waits on a client. */
	rep = http(port, "GET /metrics HTTP/1.0\r\n\r\n", true);
	ASSERT_TRUE(!strncmp(rep, "HTTP/1.1 200 ", 13));
	metrics_http_free(h);
	ASSERT_EQ(connect_port(port), -1);
}

/* Bad addresses: -EINVAL and one line naming the problem; a busy port:
 * -EADDRINUSE; either way no fd is left open. */
static void test_http_bad_addresses_refused(void)
{
	static const struct {
		const char *addr, *why;
	} cases[] = {
		{ "", "is not ADDRESS:PORT" },
		{ "9720", "is not ADDRESS:PORT" },
		{ "127.0.0.1", "is not ADDRESS:PORT" },
		{ "127.0.0.1:", "port must be a number from 0 to 65535" },
		{ "127.0.0.1:65536", "port must be a number from 0 to 65535" },
		{ "127.0.0.1:99999999999999999999", "port must be a number" },
		{ "127.0.0.1:-1", "port must be a number" },
		{ "127.0.0.1:97x", "port must be a number" },
		{ "127.0.0.1: 9720", "port must be a number" },
		{ "::1:9720", "put an IPv6 address in brackets" },
		{ "[::1:9720", "is not ADDRESS:PORT" },
		{ "[]:9720", "is not ADDRESS:PORT" },
		{ "localhost:9720", "'localhost' is not a numeric IPv4 or IPv6 address" },
		{ "1.2.3.4.5:9720", "is not a numeric" },
		{ "[127.0.0.1]x:9720", "is not ADDRESS:PORT" },
		{ "192.0.2.1:9720", "no network interface of this machine has that address" },
	};
	struct metrics_http *h = NULL;
	unsigned fds = t_count_fds(), port;
	char err[256], addr[64];
	int fd;

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		err[0] = '\0';
		ASSERT_TRUE(metrics_http_new(cases[i].addr, -1, main_loop, &src, &h, err,
					     sizeof(err)) < 0);
		if (!strstr(err, cases[i].why) || strchr(err, '\n'))
			T_FAIL("%s: want \"%s\" in one line, got \"%s\"", cases[i].addr,
			       cases[i].why, err);
		ASSERT_EQ(t_count_fds(), fds);
	}
	fd = tcp_listener(&port);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	ASSERT_EQ(metrics_http_new(addr, -1, main_loop, &src, &h, err, sizeof(err)),
		  -EADDRINUSE);
	if (!strstr(err, "the port is in use by another process"))
		T_FAIL("busy port: %s", err);
	ASSERT_EQ(t_count_fds(), fds + 1);
	close(fd);
	ASSERT_TRUE(h == NULL);
}

/* Upgrade in place: a listening socket given to metrics_http_new is
 * served (the getter returns it); after free, a copy of it (what a new
 * process would hold) still listens and serves through a second server. */
static void test_http_listen_fd_adopted_and_handed_over(void)
{
	struct metrics_http *a, *b;
	unsigned port, fds = t_count_fds();
	char err[256];
	int fd, copy;

	fd = tcp_listener(&port);
	copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	ASSERT_EQ(metrics_http_new(NULL, fd, main_loop, &src, &a, err, sizeof(err)), 0);
	ASSERT_EQ(metrics_http_listen_fd(a), fd);
	ASSERT_EQ(metrics_http_port(a), port);
	ASSERT_TRUE(fcntl(fd, F_GETFL) & O_NONBLOCK);
	ASSERT_TRUE(!strncmp(http(port, "GET /metrics HTTP/1.0\r\n\r\n", false),
			     "HTTP/1.1 200 ", 13));
	metrics_http_free(a);
	ASSERT_EQ(fcntl(fd, F_GETFD), -1);

	ASSERT_EQ(metrics_http_new(NULL, copy, main_loop, &src, &b, err, sizeof(err)), 0);
	ASSERT_TRUE(!strncmp(http(port, "GET /metrics HTTP/1.0\r\n\r\n", false),
			     "HTTP/1.1 200 ", 13));
	metrics_http_free(b);
	ASSERT_EQ(t_count_fds(), fds);
}

/* What is not a listening TCP socket is refused, and stays open. */
static void test_http_listen_fd_refused(void)
{
	struct metrics_http *h = NULL;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	char err[256];
	int fds[4], p[2];

	ASSERT_EQ(pipe(p), 0);
	fds[0] = p[0];
	fds[1] = socket(AF_UNIX, SOCK_STREAM, 0);
	fds[2] = socket(AF_INET, SOCK_STREAM, 0);	/* bound, not listening */
	ASSERT_EQ(bind(fds[2], (struct sockaddr *)&sa, sizeof(sa)), 0);
	fds[3] = socket(AF_INET, SOCK_DGRAM, 0);
	for (int i = 0; i < 4; i++) {
		ASSERT_EQ(metrics_http_new(NULL, fds[i], main_loop, &src, &h, err, sizeof(err)),
			  -EINVAL);
		ASSERT_TRUE(strstr(err, "metrics socket fd") != NULL);
		ASSERT_TRUE(fcntl(fds[i], F_GETFD) >= 0);
		close(fds[i]);
	}
	close(p[1]);
	ASSERT_TRUE(h == NULL);
}

int main(void)
{
	struct bdev_opts bo = { .engine = "null", .size = 1 << 20 };
	struct metrics_http *h;
	static struct bdev *bdevp = &bdev;
	char err[256];
	int r;

	log_set_level(LOG_WARN);
	alarm(120);
	r = bdev_open(&bo, &bdev, err, sizeof(err));
	if (r < 0)
		T_FAIL("bdev_open: %s", err);
	ASSERT_EQ(blk_dev_new(&bdev, &(struct blk_opts){ .num_queues = NUM_QUEUES,
							 .num_iothreads = NUM_IOTHREADS }, &dev), 0);
	metrics_source_init(&src, dev, &bdevp);

	RUN(test_format_lines_and_families);
	RUN(test_fields_map_to_families);
	RUN(test_disk_families_pinned);
	RUN(test_seconds_conversion_exact);
	RUN(test_label_values_escaped);
	RUN(test_real_device_counters_monotone);
	RUN(test_ctl_command_carries_text);

	ASSERT_EQ(loop_new("main", &main_loop), 0);
	r = metrics_http_new("127.0.0.1:0", -1, main_loop, &src, &h, err, sizeof(err));
	if (r == -ENOTSUP) {
		fprintf(stderr, "  (no HTTP tests: %s)\n", err);
	} else {
		ASSERT_EQ(r, 0);
		metrics_http_free(h);
		RUN(test_http_get_head_404_405);
		RUN(test_http_bad_addresses_refused);
		RUN(test_http_listen_fd_adopted_and_handed_over);
		RUN(test_http_listen_fd_refused);
	}
	loop_free(main_loop);

	blk_dev_free(dev);
	bdev_close(&bdev);
	return T_EXIT_PASS;
}
