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

enum kind { COUNTER, GAUGE };
enum unit { PLAIN, NS_AS_SECONDS };

/* A family with one series per queue or per iothread, read from a
 * uint64_t field of the stats struct at off. */
struct family {
	const char *name, *help;
	enum kind kind;
	enum unit unit;
	size_t off;
};

#define Q(field) offsetof(struct blk_queue_stats, field)
static const struct family queue_families[] = {
	{ "vblkd_queue_requests_total", "Requests taken from the queue's ring.",
	  COUNTER, PLAIN, Q(requests) },
	{ "vblkd_queue_bad_requests_total",
	  "Requests failed for a malformed descriptor chain or header.",
	  COUNTER, PLAIN, Q(bad_requests) },
	{ "vblkd_queue_kicks_total", "Kicks (guest notifications) received.",
	  COUNTER, PLAIN, Q(kicks) },
	{ "vblkd_queue_calls_total", "Calls (interrupts) sent to the guest.",
	  COUNTER, PLAIN, Q(calls) },
	{ "vblkd_queue_calls_early_total",
	  "Calls sent early: the first completion a sleeping driver waits for.",
	  COUNTER, PLAIN, Q(calls_early) },
	{ "vblkd_queue_calls_suppressed_total",
	  "Completed batches the driver did not want a call for.",
	  COUNTER, PLAIN, Q(calls_suppressed) },
	{ "vblkd_queue_calls_held_total",
	  "Calls held back by interrupt moderation for more completions to share.",
	  COUNTER, PLAIN, Q(calls_held) },
	{ "vblkd_queue_calls_held_idle_total",
	  "Held calls that waited on with nothing in flight, for requests yet to come.",
	  COUNTER, PLAIN, Q(calls_held_idle) },
	{ "vblkd_queue_calls_held_wasted_total",
	  "Stream holds during which the driver sent nothing (each backs such holds off).",
	  COUNTER, PLAIN, Q(calls_held_wasted) },
	{ "vblkd_queue_completions_coalesced_total",
	  "Completions that shared a held call.",
	  COUNTER, PLAIN, Q(completions_coalesced) },
	{ "vblkd_queue_hold_seconds_total", "Time calls were held, all holds together.",
	  COUNTER, NS_AS_SECONDS, Q(hold_ns_total) },
	{ "vblkd_queue_hold_late_seconds_total",
	  "Of the time calls were held, the time past their deadlines (the iothread ran late).",
	  COUNTER, NS_AS_SECONDS, Q(hold_late_ns_total) },
	{ "vblkd_queue_hold_max_seconds", "Longest time one call was held.",
	  GAUGE, NS_AS_SECONDS, Q(hold_ns_max) },
	{ "vblkd_queue_poll_hits_total", "Times busy-polling found requests.",
	  COUNTER, PLAIN, Q(poll_hits) },
	{ "vblkd_queue_poll_misses_total",
	  "Times requests came by kick after the iothread slept.",
	  COUNTER, PLAIN, Q(poll_misses) },
	{ "vblkd_queue_poll_vain_total",
	  "Polling windows that found nothing before a sleep longer than the cap.",
	  COUNTER, PLAIN, Q(poll_vain) },
	{ "vblkd_queue_poll_window_seconds", "The queue's current adaptive polling window.",
	  GAUGE, NS_AS_SECONDS, Q(poll_ns) },
};
#undef Q

#define T(field) offsetof(struct blk_iothread_stats, field)
static const struct family iothread_families[] = {
	{ "vblkd_iothread_busy_seconds_total", "Wall time the iothread was not asleep.",
	  COUNTER, NS_AS_SECONDS, T(busy_ns) },
	{ "vblkd_iothread_cpu_seconds_total", "CPU time of the iothread.",
	  COUNTER, NS_AS_SECONDS, T(cpu_ns) },
	{ "vblkd_iothread_poll_seconds_total", "Wall time the iothread spent busy-polling.",
	  COUNTER, NS_AS_SECONDS, T(poll_ns_total) },
	{ "vblkd_iothread_contended_total",
	  "Times polling stopped because another thread wanted the CPU.",
	  COUNTER, PLAIN, T(contended) },
	{ "vblkd_iothread_backend_submits_total",
	  "Syscalls that handed queued I/O to the disk (io_uring_enter; io_uring only).",
	  COUNTER, PLAIN, T(backend_submits) },
	{ "vblkd_iothread_backend_polled_total",
	  "I/Os whose completion was found by polling the device (io_uring IOPOLL, --iopoll).",
	  COUNTER, PLAIN, T(backend_polled) },
	{ "vblkd_iothread_completion_windows_total",
	  "Polling windows spun for the disk's completions.",
	  COUNTER, PLAIN, T(completion_windows) },
	{ "vblkd_iothread_completion_poll_hits_total",
	  "Disk completions found by polling (backends with a completion window).",
	  COUNTER, PLAIN, T(completion_poll_hits) },
	{ "vblkd_iothread_completion_poll_misses_total",
	  "Disk completions that came by their fd after the iothread slept.",
	  COUNTER, PLAIN, T(completion_poll_misses) },
	{ "vblkd_iothread_poll_yields_total",
	  "Sleeps without polling: the completion waited for was being made on the "
	  "iothread's CPU (io_uring's worker, page cache).",
	  COUNTER, PLAIN, T(poll_yields) },
};
#undef T

static const char *const kind_names[] = { [COUNTER] = "counter", [GAUGE] = "gauge" };

static void header(FILE *f, const char *name, const char *help, enum kind kind)
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

static void put_value(FILE *f, enum unit unit, uint64_t v)
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
static void single(FILE *f, const char *name, const char *help, enum kind kind,
		   enum unit unit, uint64_t v)
{
	header(f, name, help, kind);
	fputs(name, f);
	fputc(' ', f);
	put_value(f, unit, v);
}

/* Each family of fams, one series per element of the n structs of size
 * sz at base, labelled label="i". */
static void per_element(FILE *f, const struct family *fams, size_t nfams, const char *label,
			const void *base, size_t sz, unsigned n)
{
	for (size_t i = 0; i < nfams; i++) {
		header(f, fams[i].name, fams[i].help, fams[i].kind);
		for (unsigned j = 0; j < n; j++) {
			const char *elem = (const char *)base + j * sz;
			uint64_t v;

			memcpy(&v, elem + fams[i].off, sizeof(v));
			fprintf(f, "%s{%s=\"%u\"} ", fams[i].name, label, j);
			put_value(f, fams[i].unit, v);
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

	header(f, "vblkd_queue_iothread", "The iothread a queue runs on.", GAUGE);
	for (unsigned i = 0; i < st->num_queues; i++)
		fprintf(f, "vblkd_queue_iothread{queue=\"%u\"} %u\n", i, st->queues[i].iothread);
	per_element(f, queue_families, ARRAY_SIZE(queue_families), "queue", st->queues,
		    sizeof(*st->queues), st->num_queues);

	per_element(f, iothread_families, ARRAY_SIZE(iothread_families), "iothread",
		    st->iothreads, sizeof(*st->iothreads), st->num_iothreads);
	header(f, "vblkd_iothread_pinned_cpu", "The CPU an iothread is pinned to, -1 if none.",
	       GAUGE);
	for (unsigned i = 0; i < st->num_iothreads; i++)
		fprintf(f, "vblkd_iothread_pinned_cpu{iothread=\"%u\"} %d\n", i,
			st->iothreads[i].cpu);

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
