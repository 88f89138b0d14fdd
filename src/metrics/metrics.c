#include "metrics/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
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

static const char *const kind_names[] = { [COUNTER] = "counter", [GAUGE] = "gauge" };

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

/* Each row of a counter set (blk/counters.h) as a family
 * vblkd_<label>_<metric>, one series per element, labelled <label>="i". */
static void counter_set(FILE *f, const struct blk_stats *st, enum blk_counter_set_id id)
{
	const struct blk_counter_set *set = &blk_counter_sets[id];
	unsigned n;
	const char *elems = blk_stats_elems(st, id, &n);
	char name[128];

	for (unsigned i = 0; i < set->nrows; i++) {
		const struct blk_counter *c = &set->rows[i];

		snprintf(name, sizeof(name), "vblkd_%s_%s", set->label, c->metric);
		header(f, name, c->help, c->kind);
		for (unsigned j = 0; j < n; j++) {
			const void *elem = elems + (size_t)j * set->size;

			fprintf(f, "%s{%s=\"%u\"} ", name, set->label, j);
			if (c->is_signed)
				fprintf(f, "%" PRId64 "\n", blk_counter_s64(c, elem));
			else
				put_value(f, c->unit, blk_counter_u64(c, elem));
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

	single(f, "vblkd_poll_max_seconds", "Cap of the adaptive polling window for kicks.",
	       GAUGE, NS_AS_SECONDS, st->poll.max_ns);
	single(f, "vblkd_completion_poll_max_seconds",
	       "Cap of the polling window for the disk's completions.",
	       GAUGE, NS_AS_SECONDS, st->poll.completion_max_ns);
	single(f, "vblkd_poll_grow", "Polling window multiplier on a near miss.",
	       GAUGE, PLAIN, st->poll.grow);
	single(f, "vblkd_poll_shrink", "Polling window divisor after a long sleep (0: reset).",
	       GAUGE, PLAIN, st->poll.shrink);

	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++)
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
			 const struct bdev *disk)
{
	*m = (struct metrics_source){ .dev = dev, .disk = disk,
				      .start_time_ns = clock_ns(CLOCK_REALTIME) };
}

int metrics_render(const struct metrics_source *src, char **out)
{
	struct blk_stats st;
	struct metrics_snapshot s = {
		.blk = &st,
		.version = VBLKD_VERSION,
		.disk_path = src->disk->path,
		.engine = src->disk->engine->name,
		/* A resize on this thread grows it; READ_ONCE as the
		 * iothreads read it. */
		.disk_size = READ_ONCE(src->disk->size),
		.read_only = src->disk->read_only,
		.frontend_connected = src->srv && vu_server_connected(src->srv),
		.frontend_connections = src->srv ? vu_server_connections(src->srv) : 0,
		.start_time_ns = src->start_time_ns,
	};
	int r;

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
