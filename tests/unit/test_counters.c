/*
 * Description: the table of counters (blk/counters.h) is the one list
 * every output follows: each row of each set, with a value of its own per
 * queue or iothread, is in "vblkctl stats" (ctl_stats_format: the key, in
 * the table's order, with the value) and in the metrics (metrics_format:
 * its family with the row's HELP and TYPE, a series per element with the
 * value in the row's unit), and neither output has a counter the table
 * does not; names are unique and counters end in _total.
 */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>

#include "test.h"

#include "blk/blk.h"
#include "ctl/ctl.h"
#include "metrics/metrics.h"
#include "util/compiler.h"

#define NUM_QUEUES	3
#define NUM_IOTHREADS	2

static struct blk_queue_stats queues[NUM_QUEUES];
static struct blk_iothread_stats iothreads[NUM_IOTHREADS];
static struct blk_stats st = {
	.num_queues = NUM_QUEUES, .num_iothreads = NUM_IOTHREADS,
	.queues = queues, .iothreads = iothreads,
	.poll = { .max_ns = 65536, .grow = 2, .shrink = 0, .completion_max_ns = 262144 },
};

static void *elem_of(unsigned id, unsigned j)
{
	unsigned n;
	const char *e = blk_stats_elems(&st, id, &n);

	ASSERT_TRUE(j < n);
	return (void *)(e + (size_t)j * blk_counter_sets[id].size);
}

/* Row i of set id in element j: a value no other has, with a fraction of
 * a second in ns; a signed row's first element is -1 (cpu: not pinned). */
static int64_t value_of(unsigned id, unsigned i, unsigned j)
{
	if (blk_counter_sets[id].rows[i].is_signed && j == 0)
		return -1;
	return (int64_t)(1000000007ull * (i + 1) + 1000 * j + 100 * id + 1);
}

static void fill(void)
{
	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++) {
		const struct blk_counter_set *set = &blk_counter_sets[id];
		unsigned n;

		blk_stats_elems(&st, id, &n);
		for (unsigned j = 0; j < n; j++)
			for (unsigned i = 0; i < set->nrows; i++) {
				int64_t v = value_of(id, i, j);

				memcpy((char *)elem_of(id, j) + set->rows[i].off, &v, sizeof(v));
			}
	}
}

/* Row i of set: its name ends in _total if and only if it is a counter,
 * a signed row is a plain gauge, a HELP text is a sentence. */
static void check_row(const struct blk_counter_set *set, unsigned i)
{
	const struct blk_counter *c = &set->rows[i];
	size_t l = strlen(c->metric);
	bool total = l > 6 && !strcmp(c->metric + l - 6, "_total");

	if (total != (c->kind == BLK_COUNTER_COUNTER))
		T_FAIL("%s: a counter's name ends in _total, no other's", c->metric);
	if (c->is_signed && (c->kind == BLK_COUNTER_COUNTER || c->unit != BLK_COUNTER_PLAIN))
		T_FAIL("%s: a signed row is a plain gauge", c->name);
	ASSERT_TRUE(c->off < set->size);
	ASSERT_TRUE(*c->help && c->help[strlen(c->help) - 1] == '.');
	for (unsigned k = 0; k < i; k++)
		if (!strcmp(set->rows[k].name, c->name) || set->rows[k].off == c->off)
			T_FAIL("%s twice in set %s", c->name, set->label);
}

/* Every row well formed, every name once in its set, every family once. */
static void test_rows_well_formed(void)
{
	static char fams[256][128];
	unsigned nfams = 0;

	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++) {
		const struct blk_counter_set *set = &blk_counter_sets[id];

		ASSERT_TRUE(set->nrows > 0);
		ASSERT_EQ(set->size, set->nrows * sizeof(uint64_t));
		for (unsigned i = 0; i < set->nrows; i++) {
			check_row(set, i);
			ASSERT_TRUE(nfams < ARRAY_SIZE(fams));
			snprintf(fams[nfams], sizeof(fams[0]), "vblkd_%s_%s", set->label,
				 set->rows[i].metric);
			for (unsigned k = 0; k < nfams; k++)
				if (!strcmp(fams[k], fams[nfams]))
					T_FAIL("family %s twice", fams[k]);
			nfams++;
		}
	}
}

/* Member key: val of element j of set id must be row i with its value. */
static void check_member(unsigned id, unsigned i, unsigned j, const char *key,
			 struct json_object *val)
{
	const struct blk_counter_set *set = &blk_counter_sets[id];
	const struct blk_counter *c = &set->rows[i];
	int64_t want = value_of(id, i, j);

	if (strcmp(key, c->name))
		T_FAIL("%s[%u] member %u is %s, want %s", set->json, j, i, key, c->name);
	ASSERT_TRUE(json_object_is_type(val, json_type_int));
	if (c->is_signed)
		ASSERT_EQ(json_object_get_int64(val), want);
	else if (json_object_get_uint64(val) != (uint64_t)want)
		T_FAIL("%s[%u].%s is %" PRIu64 ", want %" PRId64, set->json, j, key,
		       json_object_get_uint64(val), want);
}

/* "vblkctl stats": per set an array of one object per element; each
 * object has the set's rows as its members, in the table's order, each
 * with its element's value. */
static void test_every_row_in_stats_json(void)
{
	static char buf[65536];
	struct json_object *o;
	int n = ctl_stats_format(&st, buf, sizeof(buf));

	ASSERT_TRUE(n > 0);
	o = json_tokener_parse(buf);
	ASSERT_TRUE(o && json_object_is_type(o, json_type_object));
	ASSERT_EQ(json_object_object_length(o), BLK_COUNTER_SETS + 1);	/* and "poll" */
	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++) {
		const struct blk_counter_set *set = &blk_counter_sets[id];
		struct json_object *a;
		unsigned ne;

		blk_stats_elems(&st, id, &ne);
		if (!json_object_object_get_ex(o, set->json, &a) ||
		    !json_object_is_type(a, json_type_array))
			T_FAIL("no array \"%s\" in %s", set->json, buf);
		ASSERT_EQ(json_object_array_length(a), ne);
		for (unsigned j = 0; j < ne; j++) {
			struct json_object *e = json_object_array_get_idx(a, j);
			unsigned i = 0;

			ASSERT_EQ(json_object_object_length(e), set->nrows);
			json_object_object_foreach(e, key, val)
				check_member(id, i++, j, key, val);
		}
	}
	json_object_put(o);
}

/* v as the metrics print it: ns as exact seconds, else the integer. */
static void expected(const struct blk_counter *c, int64_t v, char *out, size_t len)
{
	if (c->unit == BLK_COUNTER_NS) {
		int l = snprintf(out, len, "%" PRIu64 ".%09" PRIu64, (uint64_t)v / 1000000000,
				 (uint64_t)v % 1000000000);

		while (out[l - 1] == '0')
			out[--l] = '\0';
		if (out[l - 1] == '.')
			out[--l] = '\0';
	} else if (c->is_signed) {
		snprintf(out, len, "%" PRId64, v);
	} else {
		snprintf(out, len, "%" PRIu64, (uint64_t)v);
	}
}

static bool has_line(const char *text, const char *line)
{
	size_t l = strlen(line);

	for (const char *p = text; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (!strncmp(p, line, l) && p[l] == '\n')
			return true;
	return false;
}

/* The metrics: per row its family, HELP and TYPE as the row says, a
 * series per element with its value; and no family of a set's prefix
 * that is not a row. */
static void test_every_row_in_metrics(void)
{
	struct metrics_snapshot s = {
		.blk = &st, .version = "1", .engine = "null", .start_time_ns = 1,
	};
	char *text, line[512], prefix[64], v[64];
	int n = metrics_format(&s, &text);

	ASSERT_TRUE(n > 0);
	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++) {
		const struct blk_counter_set *set = &blk_counter_sets[id];
		unsigned ne, families = 0;

		blk_stats_elems(&st, id, &ne);
		for (unsigned i = 0; i < set->nrows; i++) {
			const struct blk_counter *c = &set->rows[i];

			snprintf(line, sizeof(line), "# HELP vblkd_%s_%s %s", set->label, c->metric,
				 c->help);
			if (!has_line(text, line))
				T_FAIL("no line \"%s\"", line);
			snprintf(line, sizeof(line), "# TYPE vblkd_%s_%s %s", set->label, c->metric,
				 c->kind == BLK_COUNTER_COUNTER ? "counter" : "gauge");
			if (!has_line(text, line))
				T_FAIL("no line \"%s\"", line);
			for (unsigned j = 0; j < ne; j++) {
				expected(c, value_of(id, i, j), v, sizeof(v));
				snprintf(line, sizeof(line), "vblkd_%s_%s{%s=\"%u\"} %s",
					 set->label, c->metric, set->label, j, v);
				if (!has_line(text, line))
					T_FAIL("no line \"%s\"", line);
			}
		}
		snprintf(prefix, sizeof(prefix), "# HELP vblkd_%s_", set->label);
		for (const char *p = strstr(text, prefix); p; p = strstr(p + 1, prefix))
			families++;
		ASSERT_EQ(families, set->nrows);
	}
	free(text);
}

int main(void)
{
	fill();
	RUN(test_rows_well_formed);
	RUN(test_every_row_in_stats_json);
	RUN(test_every_row_in_metrics);
	return T_EXIT_PASS;
}
