#include "metrics/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "acct/acct.h"
#include "backend/bdev.h"
#include "blk/blk.h"
#include "util/barrier.h"
#include "util/compiler.h"
#include "vhost/vu.h"

/* The families of our own (process, disk, polling knobs) take the kinds
 * and units of the counter rows (blk/counters.h). */
#define COUNTER BLK_COUNTER_COUNTER
#define GAUGE BLK_COUNTER_GAUGE
#define PLAIN BLK_COUNTER_PLAIN
#define NS_AS_SECONDS BLK_COUNTER_NS

static const char *const kind_names[] = {
	[COUNTER] = "counter",
	[GAUGE] = "gauge",
	[BLK_COUNTER_HISTOGRAM] = "histogram",
};

static void header(FILE *f, const char *name, const char *help, enum blk_counter_kind kind)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind_names[kind]);
}

/* ns as seconds, exactly: "0", "1.5", "0.000000001". */
static void put_seconds(FILE *f, uint64_t ns)
{
	uint64_t frac = ns % 1000000000;
	int digits = 9;

	fprintf(f, "%" PRIu64, ns / 1000000000);
	if (!frac)
		return;
	while (frac % 10 == 0) {
		frac /= 10;
		digits--;
	}
	fprintf(f, ".%0*" PRIu64, digits, frac);
}

static void put_value(FILE *f, enum blk_counter_unit unit, uint64_t v)
{
	if (unit == NS_AS_SECONDS)
		put_seconds(f, v);
	else
		fprintf(f, "%" PRIu64, v);
	fputc('\n', f);
}

/* A label value, escaped as the format wants: \ " and line feed. */
static void put_label_value(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fprintf(f, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

/* One family with one unlabelled series. */
static void single(FILE *f, const char *name, const char *help, enum blk_counter_kind kind,
		   enum blk_counter_unit unit, uint64_t v)
{
	header(f, name, help, kind);
	fputs(name, f);
	fputc(' ', f);
	put_value(f, unit, v);
}

/*
 * The upper bound of latency bucket i (acct.h: 2^i us; the last +Inf) as
 * an le label value: seconds, written as Prometheus' own clients write a
 * float (Go's strconv 'g', shortest): "1e-06", "3.2e-05", "0.000128",
 * "16.777216".  C's %g at the fewest digits that read back the same
 * double is that format; 2^i / 10^6 has an exact short decimal.
 */
static void put_le(FILE *f, unsigned i)
{
	double v;
	char buf[32];

	if (i >= ACCT_BUCKETS - 1) {
		fputs("+Inf", f);
		return;
	}
	v = (double)acct_bucket_le_ns(i) / 1e9;
	for (int p = 1; p <= 17; p++) {
		snprintf(buf, sizeof(buf), "%.*g", p, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	fputs(buf, f);
}

/* A series' name and labels, then the space before its value:
 * name{<label>="j",le="..."} for set's element j and, if le >= 0, latency
 * bucket le; no braces for a set of one element without le. */
static void series(FILE *f, const char *name, const struct blk_counter_set *set, unsigned j,
		   int le)
{
	fputs(name, f);
	if (set->label || le >= 0) {
		fputc('{', f);
		if (set->front) {
			fputs("front=", f);
			put_label_value(f, set->front);
			fputc(',', f);
		}
		if (set->label) {
			fprintf(f, "%s=", set->label);
			if (set->elem_name)
				put_label_value(f, set->elem_name(j));
			else
				fprintf(f, "\"%u\"", j);
		}
		if (le >= 0) {
			fputs(set->label ? ",le=\"" : "le=\"", f);
			put_le(f, (unsigned)le);
			fputc('"', f);
		}
		fputc('}', f);
	}
	fputc(' ', f);
}

/* The SUM row of set whose metric is hist's and "_sum" (counters.h). */
static const struct blk_counter *sum_row(const struct blk_counter_set *set,
					 const struct blk_counter *hist)
{
	size_t l = strlen(hist->metric);

	for (unsigned i = 0; i < set->nrows; i++) {
		const struct blk_counter *c = &set->rows[i];

		if (c->kind == BLK_COUNTER_SUM && !strncmp(c->metric, hist->metric, l) &&
		    !strcmp(c->metric + l, "_sum"))
			return c;
	}
	return NULL;
}

/* A histogram row's series for element j (elem): _bucket{le} cumulative,
 * _sum, _count. */
static void histogram(FILE *f, const char *name, const struct blk_counter_set *set,
		      const struct blk_counter *c, unsigned j, const void *elem)
{
	const uint64_t *hist = blk_counter_hist(c, elem);
	const struct blk_counter *sum = sum_row(set, c);
	char metric[160];
	uint64_t cum = 0;

	snprintf(metric, sizeof(metric), "%s_bucket", name);
	for (unsigned i = 0; i < ACCT_BUCKETS; i++) {
		cum += hist[i];
		series(f, metric, set, j, (int)i);
		fprintf(f, "%" PRIu64 "\n", cum);
	}
	snprintf(metric, sizeof(metric), "%s_sum", name);
	series(f, metric, set, j, -1);
	put_value(f, c->unit, sum ? blk_counter_u64(sum, elem) : 0);
	snprintf(metric, sizeof(metric), "%s_count", name);
	series(f, metric, set, j, -1);
	fprintf(f, "%" PRIu64 "\n", cum);
}

/* Row i of set id: a series per element. */
static void set_series(FILE *f, const struct blk_stats *st, enum blk_counter_set_id id,
		       unsigned i, const char *name)
{
	const struct blk_counter_set *set = &blk_counter_sets[id];
	const struct blk_counter *c = &set->rows[i];
	unsigned n;
	const char *elems = blk_stats_elems(st, id, &n);

	for (unsigned j = 0; j < n; j++) {
		const void *elem = elems + (size_t)j * set->size;

		if (c->kind == BLK_COUNTER_HISTOGRAM) {
			histogram(f, name, set, c, j, elem);
			continue;
		}
		series(f, name, set, j, -1);
		if (c->is_signed)
			fprintf(f, "%" PRId64 "\n", blk_counter_s64(c, elem));
		else
			put_value(f, c->unit, blk_counter_u64(c, elem));
	}
}

/* Each row of a counter set (blk/counters.h) with a metric as a family
 * vblkd_<prefix>_<metric>, one series per element (series()), then the
 * series of the sets that join its families (another front's); a SUM
 * row is its histogram's _sum.  A set that joins another's is rendered
 * there only. */
static void counter_set(FILE *f, const struct blk_stats *st, enum blk_counter_set_id id)
{
	const struct blk_counter_set *set = &blk_counter_sets[id];
	char name[128];

	if (set->family_of >= 0)
		return;
	for (unsigned i = 0; i < set->nrows; i++) {
		const struct blk_counter *c = &set->rows[i];

		if (!c->metric || c->kind == BLK_COUNTER_SUM)
			continue;
		snprintf(name, sizeof(name), "vblkd_%s_%s", set->prefix, c->metric);
		header(f, name, c->help, c->kind);
		set_series(f, st, id, i, name);
		for (unsigned k = 0; k < BLK_COUNTER_SETS; k++)
			if (blk_counter_sets[k].family_of == (int)id)
				set_series(f, st, (enum blk_counter_set_id)k, i, name);
	}
}

/* {id="stream-1",type="stream"} */
static void job_labels(FILE *f, const char *name, const struct job_info *i)
{
	fputs(name, f);
	fputs("{id=", f);
	put_label_value(f, i->id);
	fputs(",type=", f);
	put_label_value(f, i->type);
	fputs("} ", f);
}

static void job_families(FILE *f, const struct job_info *jobs, unsigned n)
{
	static const struct {
		const char *name, *help;
		enum blk_counter_kind kind;
		size_t off;
	} fam[] = {
		{ "vblkd_job_done_bytes", "Bytes of its work a block job has done.", GAUGE,
		  offsetof(struct job_info, done) },
		{ "vblkd_job_total_bytes", "Bytes of work a block job has in all.", GAUGE,
		  offsetof(struct job_info, total) },
		{ "vblkd_job_copied_bytes_total", "Bytes a block job's units moved (the rate "
		  "limit counts these).", COUNTER, offsetof(struct job_info, copied) },
		{ "vblkd_job_rate_limit_bytes_per_second", "A block job's rate limit (0: none).",
		  GAUGE, offsetof(struct job_info, rate) },
		{ "vblkd_job_errors_total", "I/O errors a block job met (each paused or ended it).",
		  COUNTER, offsetof(struct job_info, errors) },
	};

	header(f, "vblkd_job_info", "A block job (vblkctl job list), its state and result "
	       "(always 1).", GAUGE);
	for (unsigned i = 0; i < n; i++) {
		fputs("vblkd_job_info{id=", f);
		put_label_value(f, jobs[i].id);
		fputs(",type=", f);
		put_label_value(f, jobs[i].type);
		fputs(",state=", f);
		put_label_value(f, job_state_name(jobs[i].state));
		fputs(",result=", f);
		put_label_value(f, jobs[i].state != JOB_CONCLUDED ? "" : jobs[i].failed ? "failed" :
				jobs[i].cancelled ? "cancelled" : "ok");
		fputs("} 1\n", f);
	}
	for (unsigned k = 0; k < ARRAY_SIZE(fam); k++) {
		header(f, fam[k].name, fam[k].help, fam[k].kind);
		for (unsigned i = 0; i < n; i++) {
			job_labels(f, fam[k].name, &jobs[i]);
			put_value(f, PLAIN, *(const uint64_t *)(const void *)
					    ((const char *)&jobs[i] + fam[k].off));
		}
	}
}

/* One series of a backup's or a mirror's: FAM{name="NAME",job="JOB"} V. */
static void put_named_job(FILE *f, const char *fam, const char *name, const char *job,
			  uint64_t v)
{
	fputs(fam, f);
	fputs("{name=", f);
	put_label_value(f, name);
	fputs(",job=", f);
	put_label_value(f, job);
	fputs("} ", f);
	put_value(f, PLAIN, v);
}

static void backup_families(FILE *f, const struct bkp_info *b, unsigned n)
{
	static const struct {
		const char *name, *help;
		enum blk_counter_kind kind;
		size_t off;
	} fam[] = {
		{ "vblkd_backup_scratch_bytes", "Bytes a running backup's scratch file takes "
		  "(the old data kept before guest writes).", GAUGE,
		  offsetof(struct bkp_info, scratch_bytes) },
		{ "vblkd_backup_saved_chunks_total", "Chunks (64 KiB) a backup kept before a "
		  "write changed them (those read as zeroes included).", COUNTER,
		  offsetof(struct bkp_info, saved_chunks) },
		{ "vblkd_backup_read_bytes_total", "Bytes a backup's NBD clients read of its view.",
		  COUNTER, offsetof(struct bkp_info, read_bytes) },
		{ "vblkd_backup_write_waits_total", "Writes that waited for another write's copy "
		  "of the same chunk.", COUNTER, offsetof(struct bkp_info, waits) },
	};

	for (unsigned k = 0; k < ARRAY_SIZE(fam); k++) {
		header(f, fam[k].name, fam[k].help, fam[k].kind);
		for (unsigned i = 0; i < n; i++) {
			put_named_job(f, fam[k].name, b[i].name, b[i].job,
				      *(const uint64_t *)(const void *)((const char *)&b[i] +
									fam[k].off));
		}
	}
}

static void mirror_families(FILE *f, const struct mir_info *m, unsigned n)
{
	static const struct {
		const char *name, *help;
		enum blk_counter_kind kind;
	} fam[] = {
		{ "vblkd_mirror_dirty_bytes", "Bytes a running mirror has still to copy to its "
		  "target.", GAUGE },
		{ "vblkd_mirror_copied_bytes_total", "Bytes a mirror's job wrote to its target as "
		  "data.", COUNTER },
		{ "vblkd_mirror_zeroed_bytes_total", "Bytes a mirror's job wrote to its target as "
		  "zeroes (write zeroes, not data).", COUNTER },
		{ "vblkd_mirror_passes_total", "Passes a mirror's job made over what was dirty.",
		  COUNTER },
		{ "vblkd_mirror_written_through_total", "Guest writes a write-blocking mirror wrote "
		  "to its target before completing them.", COUNTER },
		{ "vblkd_mirror_written_through_bytes_total", "Bytes of those guest writes, on "
		  "the target.", COUNTER },
		{ "vblkd_mirror_ready", "1 once a mirror converged (its target had everything "
		  "once), else 0.", GAUGE },
		{ "vblkd_mirror_yielded_total", "Times a ready background mirror's job waited "
		  "for a busy guest (a look each millisecond at most).", COUNTER },
	};

	for (unsigned k = 0; k < ARRAY_SIZE(fam); k++) {
		header(f, fam[k].name, fam[k].help, fam[k].kind);
		for (unsigned i = 0; i < n; i++) {
			uint64_t v[] = { m[i].dirty, m[i].copied, m[i].zeroed, m[i].passes,
					 m[i].wb_writes, m[i].wb_bytes, m[i].ready, m[i].yields };

			put_named_job(f, fam[k].name, m[i].name, m[i].job, v[k]);
		}
	}
}

int metrics_format(const struct metrics_snapshot *s, char **out)
{
	const struct blk_stats *st = s->blk;
	size_t len = 0;
	char *buf = NULL;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return -ENOMEM;

	/* The disk first: what an operator reads first. */
	for (unsigned id = 0; id < BLK_COUNTERS_QUEUE; id++)
		counter_set(f, st, id);
	header(f, "vblkd_disk_info", "The disk served (always 1).", GAUGE);
	fputs("vblkd_disk_info{path=", f);
	put_label_value(f, s->disk_path ? s->disk_path : "");
	fputs(",engine=", f);
	put_label_value(f, s->engine);
	fputs("} 1\n", f);
	single(f, "vblkd_disk_size_bytes", "Size of the disk shown to the guest.",
	       GAUGE, PLAIN, s->disk_size);
	single(f, "vblkd_disk_read_only", "1 if the disk is exported read-only, else 0.",
	       GAUGE, PLAIN, s->read_only);

	header(f, "vblkd_build_info", "The vblkd build serving this disk (always 1).", GAUGE);
	fputs("vblkd_build_info{version=", f);
	put_label_value(f, s->version);
	fputs("} 1\n", f);
	single(f, "vblkd_start_time_seconds", "When vblkd started, in seconds since the epoch.",
	       GAUGE, NS_AS_SECONDS, s->start_time_ns);
	single(f, "vblkd_process_cpu_seconds_total", "CPU time of the whole process.",
	       COUNTER, NS_AS_SECONDS, s->process_cpu_ns);

	single(f, "vblkd_frontend_connected",
	       "1 while a vhost-user frontend (QEMU) is connected, else 0.",
	       GAUGE, PLAIN, s->frontend_connected);
	single(f, "vblkd_frontend_connections_total", "Frontend connections accepted.",
	       COUNTER, PLAIN, s->frontend_connections);

	/* The NBD server front (--nbd): its clients and requests. */
	single(f, "vblkd_nbd_clients", "NBD clients connected now, all exports.",
	       GAUGE, PLAIN, s->nbd.clients);
	single(f, "vblkd_nbd_connections_total", "NBD connections accepted.",
	       COUNTER, PLAIN, s->nbd.connections);
	single(f, "vblkd_nbd_refused_total",
	       "NBD connections refused (max-conn reached, the disk held elsewhere).",
	       COUNTER, PLAIN, s->nbd.refused);
	single(f, "vblkd_nbd_handshakes_failed_total",
	       "NBD clients gone or dropped before their handshake ended.",
	       COUNTER, PLAIN, s->nbd.handshake_failed);
	single(f, "vblkd_nbd_requests_total", "NBD requests received.",
	       COUNTER, PLAIN, s->nbd.requests);
	single(f, "vblkd_nbd_bad_requests_total",
	       "NBD requests answered with an error without reaching the disk.",
	       COUNTER, PLAIN, s->nbd.bad_requests);
	single(f, "vblkd_nbd_read_bytes_total", "Bytes NBD clients read.",
	       COUNTER, PLAIN, s->nbd.read_bytes);
	single(f, "vblkd_nbd_written_bytes_total", "Bytes NBD clients wrote.",
	       COUNTER, PLAIN, s->nbd.write_bytes);
	single(f, "vblkd_nbd_throttled_requests_total",
	       "NBD requests that waited for the disk's QoS budget (--limit).",
	       COUNTER, PLAIN, s->nbd.throttled);

	/* Block jobs (vblkctl job list): a series each, by id and type. */
	job_families(f, s->jobs, s->njobs);
	backup_families(f, s->backups, s->nbackups);
	mirror_families(f, s->mirrors, s->nmirrors);

	single(f, "vblkd_poll_max_seconds", "Cap of the adaptive polling window for kicks.",
	       GAUGE, NS_AS_SECONDS, st->poll.max_ns);
	single(f, "vblkd_completion_poll_max_seconds",
	       "Cap of the polling window for the disk's completions.",
	       GAUGE, NS_AS_SECONDS, st->poll.completion_max_ns);
	single(f, "vblkd_poll_grow", "Polling window multiplier on a near miss.",
	       GAUGE, PLAIN, st->poll.grow);
	single(f, "vblkd_poll_shrink", "Polling window divisor after a long sleep (0: reset).",
	       GAUGE, PLAIN, st->poll.shrink);

	for (unsigned id = BLK_COUNTERS_QUEUE; id < BLK_COUNTER_SETS; id++)
		counter_set(f, st, id);

	if (ferror(f) || fclose(f)) {
		free(buf);
		return -ENOMEM;
	}
	if (len > INT32_MAX) {
		free(buf);
		return -ENOMEM;
	}
	*out = buf;
	return (int)len;
}

static uint64_t clock_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void metrics_source_init(struct metrics_source *m, struct blk_dev *dev,
			 struct bdev *const *disk)
{
	*m = (struct metrics_source){ .dev = dev, .disk = disk,
				      .start_time_ns = clock_ns(CLOCK_REALTIME) };
}

int metrics_render(const struct metrics_source *src, char **out)
{
	struct blk_stats st;
	const struct bdev *b = *src->disk;
	struct metrics_snapshot s = {
		.blk = &st,
		.version = VBLKD_VERSION,
		.disk_path = b->path,
		.engine = b->engine->name,
		/* A resize on this thread grows it; READ_ONCE as the
		 * iothreads read it. */
		.disk_size = READ_ONCE(b->size),
		.read_only = b->read_only,
		.frontend_connected = src->srv && vu_server_connected(src->srv),
		.frontend_connections = src->srv ? vu_server_connections(src->srv) : 0,
		.start_time_ns = src->start_time_ns,
	};
	int r;

	struct job_info jobs[32];

	if (src->nbds)
		nbds_stats(src->nbds, &s.nbd);
	s.njobs = MIN(job_list(jobs, 32), 32u);
	s.jobs = jobs;

	struct bkp_info backups[4];

	if (src->bkps)
		s.nbackups = MIN(bkp_list(src->bkps, backups, 4), 4u);
	s.backups = backups;

	struct mir_info mirrors[4];

	if (src->mirs)
		s.nmirrors = MIN(mir_list(src->mirs, mirrors, 4), 4u);
	s.mirrors = mirrors;
	r = blk_stats_snapshot(src->dev, &st);
	if (r < 0)
		return r;
	s.process_cpu_ns = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
	r = metrics_format(&s, out);
	blk_stats_release(&st);
	return r;
}

int metrics_ctl_cmd(void *opaque, struct json_object *req, struct json_object *reply,
		    char *err, size_t errlen)
{
	struct json_object *text;
	char *buf;
	int n = metrics_render(opaque, &buf);

	if (n < 0) {
		snprintf(err, errlen, "cannot render the metrics: %s", strerror(-n));
		return n;
	}
	text = json_object_new_string_len(buf, n);
	free(buf);
	if (!text || json_object_object_add(reply, "metrics", text) < 0) {
		json_object_put(text);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}
