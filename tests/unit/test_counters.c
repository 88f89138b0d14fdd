/*
 * Description: the table of counters (blk/counters.h) is the one list
 * every output follows: each row of each set, with a value of its own per
 * element (the disk, an operation, a queue, an iothread), is in "vblkctl
 * stats" (ctl_stats_format: the key, in the table's order, with the value;
 * a histogram as its quantiles and buckets; a set inside its parent's
 * object) and, if it has a metric, in the metrics (metrics_format: its
 * family with the row's HELP and TYPE, a series per element labelled as
 * the set says, with the value in the row's unit; a histogram's buckets
 * cumulative with their le bounds, its _sum from its SUM row, its _count),
 * and neither output has a counter the table does not; names are unique,
 * counters end in _total, every histogram has its one SUM row.
 */
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "test.h"

#include "acct/acct.h"
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

/* The families metrics_format writes itself under a set's prefix. */
static const char *const fixed_families[] = {
	"vblkd_disk_info", "vblkd_disk_size_bytes", "vblkd_disk_read_only",
};

static void *elem_of(unsigned id, unsigned j)
{
	unsigned n;
	const char *e = blk_stats_elems(&st, id, &n);

	ASSERT_TRUE(j < n);
	return (void *)(e + (size_t)j * blk_counter_sets[id].size);
}

static unsigned width(const struct blk_counter *c)
{
	return c->kind == BLK_COUNTER_HISTOGRAM ? ACCT_BUCKETS : 1;
}

/* Row i of set id in element j (bucket k of a histogram): a value no
 * other has, with a fraction of a second in ns; a signed row's first
 * element is -1 (cpu: not pinned). */
static int64_t value_of(unsigned id, unsigned i, unsigned j, unsigned k)
{
	if (blk_counter_sets[id].rows[i].is_signed && j == 0)
		return -1;
	return (int64_t)(1000000007ull * (i + 1) + 1000 * j + 100 * id + 1 + 7919ull * k);
}

static void fill(void)
{
	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++) {
		const struct blk_counter_set *set = &blk_counter_sets[id];
		unsigned n;

		blk_stats_elems(&st, id, &n);
		for (unsigned j = 0; j < n; j++)
			for (unsigned i = 0; i < set->nrows; i++)
				for (unsigned k = 0; k < width(&set->rows[i]); k++) {
					int64_t v = value_of(id, i, j, k);

					memcpy((char *)elem_of(id, j) + set->rows[i].off + 8 * k,
					       &v, sizeof(v));
				}
	}
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t l = strlen(s), m = strlen(suffix);

	return l > m && !strcmp(s + l - m, suffix);
}

/* The HISTOGRAM row of set whose metric and "_sum" is sum's, or NULL. */
static const struct blk_counter *hist_of(const struct blk_counter_set *set,
					 const struct blk_counter *sum)
{
	for (unsigned i = 0; i < set->nrows; i++) {
		const struct blk_counter *c = &set->rows[i];
		size_t l;

		if (c->kind != BLK_COUNTER_HISTOGRAM)
			continue;
		l = strlen(c->metric);
		if (!strncmp(sum->metric, c->metric, l) && !strcmp(sum->metric + l, "_sum"))
			return c;
	}
	return NULL;
}

/* Row i of set: its name ends in _total if and only if it is a counter,
 * a signed row is a plain gauge, a histogram has one SUM row and a SUM
 * row its histogram, a HELP text is a sentence. */
static void check_row(const struct blk_counter_set *set, unsigned i)
{
	const struct blk_counter *c = &set->rows[i];

	if (c->metric && ends_with(c->metric, "_total") != (c->kind == BLK_COUNTER_COUNTER))
		T_FAIL("%s: a counter's name ends in _total, no other's", c->metric);
	if (!c->metric && (c->kind != BLK_COUNTER_GAUGE && c->kind != BLK_COUNTER_COUNTER))
		T_FAIL("%s: only a plain row may have no metric", c->name);
	if (c->is_signed && (c->kind != BLK_COUNTER_GAUGE || c->unit != BLK_COUNTER_PLAIN))
		T_FAIL("%s: a signed row is a plain gauge", c->name);
	if (c->kind == BLK_COUNTER_SUM) {
		if (!c->metric || !ends_with(c->metric, "_sum") || !hist_of(set, c))
			T_FAIL("%s: a SUM row is a histogram's <metric>_sum", c->name);
	}
	if (c->kind == BLK_COUNTER_HISTOGRAM) {
		unsigned sums = 0;

		ASSERT_TRUE(c->metric && !ends_with(c->metric, "_sum"));
		for (unsigned k = 0; k < set->nrows; k++)
			sums += set->rows[k].kind == BLK_COUNTER_SUM &&
				hist_of(set, &set->rows[k]) == c;
		if (sums != 1)
			T_FAIL("histogram %s has %u SUM rows, want 1", c->metric, sums);
		ASSERT_EQ(c->unit, BLK_COUNTER_NS);
	}
	ASSERT_TRUE(c->off + 8 * width(c) <= set->size);
	ASSERT_TRUE(*c->help && c->help[strlen(c->help) - 1] == '.');
	for (unsigned k = 0; k < i; k++)
		if (!strcmp(set->rows[k].name, c->name) || set->rows[k].off == c->off)
			T_FAIL("%s twice in set %s", c->name, set->json);
}

/* Every row well formed, every name once in its set, every family once,
 * every set of one element labelled and named as the renderers expect. */
static void test_rows_well_formed(void)
{
	static char fams[256][128];
	unsigned nfams = 0;

	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++) {
		const struct blk_counter_set *set = &blk_counter_sets[id];
		size_t size = 0;

		ASSERT_TRUE(set->nrows > 0 && set->prefix && set->json);
		ASSERT_TRUE(set->parent < (int)BLK_COUNTER_SETS && set->parent != (int)id);
		/* A set inside another is inside one of one element. */
		ASSERT_TRUE(set->parent < 0 || !blk_counter_sets[set->parent].label);
		ASSERT_TRUE(set->label || !set->elem_name);
		for (unsigned i = 0; i < set->nrows; i++) {
			check_row(set, i);
			size += 8 * width(&set->rows[i]);
			if (!set->rows[i].metric || set->rows[i].kind == BLK_COUNTER_SUM)
				continue;
			/* Another front's series in that set's families: its
			 * rows are that set's. */
			if (set->family_of >= 0) {
				ASSERT_TRUE(set->front && blk_counter_sets[set->family_of].front);
				ASSERT_TRUE(blk_counter_sets[set->family_of].rows == set->rows);
				continue;
			}
			ASSERT_TRUE(nfams < ARRAY_SIZE(fams));
			snprintf(fams[nfams], sizeof(fams[0]), "vblkd_%s_%s", set->prefix,
				 set->rows[i].metric);
			for (unsigned k = 0; k < nfams; k++)
				if (!strcmp(fams[k], fams[nfams]))
					T_FAIL("family %s twice", fams[k]);
			nfams++;
		}
		ASSERT_EQ(set->size, size);
	}
}

/* The JSON of set id: the top-level member, or its parent's member. */
static struct json_object *set_json(struct json_object *top, unsigned id)
{
	const struct blk_counter_set *set = &blk_counter_sets[id];
	struct json_object *p = top, *o;

	if (set->parent >= 0)
		p = set_json(top, (unsigned)set->parent);
	if (!json_object_object_get_ex(p, set->json, &o))
		T_FAIL("no \"%s\"", set->json);
	return o;
}

static uint64_t u64_of(struct json_object *v)
{
	ASSERT_TRUE(json_object_is_type(v, json_type_int));
	return json_object_get_uint64(v);
}

/* A hist row's members: <name>_ns with the quantiles of the buckets,
 * <name>_buckets with them as they are. */
static void check_hist_members(unsigned id, unsigned i, unsigned j, struct json_object *e)
{
	static const struct {
		const char *key;
		double q;
	} qs[] = { { "p50", 0.5 }, { "p90", 0.9 }, { "p99", 0.99 }, { "p999", 0.999 } };
	const struct blk_counter *c = &blk_counter_sets[id].rows[i];
	const uint64_t *hist = blk_counter_hist(c, elem_of(id, j));
	struct json_object *q, *b;
	char key[64];

	snprintf(key, sizeof(key), "%s_ns", c->name);
	ASSERT_TRUE(json_object_object_get_ex(e, key, &q));
	ASSERT_EQ(json_object_object_length(q), ARRAY_SIZE(qs));
	for (unsigned k = 0; k < ARRAY_SIZE(qs); k++) {
		struct json_object *v;

		ASSERT_TRUE(json_object_object_get_ex(q, qs[k].key, &v));
		ASSERT_TRUE(u64_of(v) == acct_quantile_ns(hist, qs[k].q));
	}
	snprintf(key, sizeof(key), "%s_buckets", c->name);
	ASSERT_TRUE(json_object_object_get_ex(e, key, &b));
	ASSERT_EQ(json_object_array_length(b), ACCT_BUCKETS);
	for (unsigned k = 0; k < ACCT_BUCKETS; k++)
		ASSERT_TRUE(u64_of(json_object_array_get_idx(b, k)) ==
			    (uint64_t)value_of(id, i, j, k));
}

/* Element j of set id as JSON: its rows as members, in the table's
 * order (a histogram two of them), then the sets inside it. */
static void check_element(unsigned id, unsigned j, struct json_object *e)
{
	const struct blk_counter_set *set = &blk_counter_sets[id];
	unsigned want = 0, i = 0;
	const char *next_hist = NULL;

	for (unsigned r = 0; r < set->nrows; r++)
		want += set->rows[r].kind == BLK_COUNTER_HISTOGRAM ? 2 : 1;
	for (unsigned k = 0; k < BLK_COUNTER_SETS; k++)
		want += blk_counter_sets[k].parent == (int)id;
	ASSERT_EQ(json_object_object_length(e), want);
	json_object_object_foreach(e, key, val) {
		const struct blk_counter *c = i < set->nrows ? &set->rows[i] : NULL;
		char hk[64];

		if (!c)		/* past the rows: a set inside, checked as its own */
			continue;
		if (c->kind == BLK_COUNTER_HISTOGRAM) {
			snprintf(hk, sizeof(hk), next_hist ? "%s_buckets" : "%s_ns", c->name);
			if (strcmp(key, hk))
				T_FAIL("%s[%u] member is %s, want %s", set->json, j, key, hk);
			if (next_hist) {
				check_hist_members(id, i, j, e);
				next_hist = NULL;
				i++;
			} else {
				next_hist = c->name;
			}
			continue;
		}
		if (strcmp(key, c->name))
			T_FAIL("%s[%u] member is %s, want %s", set->json, j, key, c->name);
		ASSERT_TRUE(json_object_is_type(val, json_type_int));
		if (c->is_signed)
			ASSERT_EQ(json_object_get_int64(val), value_of(id, i, j, 0));
		else if (json_object_get_uint64(val) != (uint64_t)value_of(id, i, j, 0))
			T_FAIL("%s[%u].%s is %" PRIu64 ", want %" PRId64, set->json, j, key,
			       json_object_get_uint64(val), value_of(id, i, j, 0));
		i++;
	}
	ASSERT_EQ(i, set->nrows);
}

/* "vblkctl stats": per set of the top level a member, per set inside
 * another a member of its parent; one element an object, numbered ones an
 * array, named ones an object keyed by their names, in their order; each
 * with the set's rows as its members, in the table's order, each with its
 * element's value. */
static void test_every_row_in_stats_json(void)
{
	static char buf[65536];
	struct json_object *o;
	unsigned top = 1;	/* "poll" */
	int n = ctl_stats_format(&st, buf, sizeof(buf));

	ASSERT_TRUE(n > 0);
	o = json_tokener_parse(buf);
	ASSERT_TRUE(o && json_object_is_type(o, json_type_object));
	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++) {
		const struct blk_counter_set *set = &blk_counter_sets[id];
		struct json_object *s = set_json(o, id);
		unsigned ne, j = 0;

		top += set->parent < 0;
		blk_stats_elems(&st, id, &ne);
		if (!set->label) {
			ASSERT_EQ(ne, 1);
			ASSERT_TRUE(json_object_is_type(s, json_type_object));
			check_element(id, 0, s);
		} else if (!set->elem_name) {
			ASSERT_TRUE(json_object_is_type(s, json_type_array));
			ASSERT_EQ(json_object_array_length(s), ne);
			for (j = 0; j < ne; j++)
				check_element(id, j, json_object_array_get_idx(s, j));
		} else {
			ASSERT_TRUE(json_object_is_type(s, json_type_object));
			ASSERT_EQ(json_object_object_length(s), ne);
			json_object_object_foreach(s, key, val) {
				if (strcmp(key, set->elem_name(j)))
					T_FAIL("%s: element %u is %s, want %s", set->json, j, key,
					       set->elem_name(j));
				check_element(id, j++, val);
			}
		}
	}
	ASSERT_EQ(json_object_object_length(o), top);
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

static void expect_line(const char *text, const char *line)
{
	if (!has_line(text, line))
		T_FAIL("no line \"%s\"", line);
}

/* Element j's labels as the set writes them: "" (one element), or
 * <label>="j" / <label>="<name>". */
static void labels_of(const struct blk_counter_set *set, unsigned j, char *out, size_t len)
{
	char front[64] = "";

	if (set->front)
		snprintf(front, sizeof(front), "front=\"%s\",", set->front);
	if (!set->label)
		snprintf(out, len, "%s", "");
	else if (set->elem_name)
		snprintf(out, len, "%s%s=\"%s\"", front, set->label, set->elem_name(j));
	else
		snprintf(out, len, "%s%s=\"%u\"", front, set->label, j);
}

/* A histogram's series for element j: every bucket cumulative with the
 * bound (2^k us as seconds, as a float reads) as le, the last +Inf, the
 * _sum its SUM row's, the _count every bucket's. */
static void check_hist_series(const char *text, const char *fam, unsigned id, unsigned i,
			      unsigned j)
{
	const struct blk_counter_set *set = &blk_counter_sets[id];
	const struct blk_counter *sum = NULL;
	char lab[128], line[512], prefix[384], v[64];
	uint64_t cum = 0;

	labels_of(set, j, lab, sizeof(lab));
	for (unsigned k = 0; k < ACCT_BUCKETS; k++) {
		const char *p, *le;
		double bound;

		cum += (uint64_t)value_of(id, i, j, k);
		snprintf(prefix, sizeof(prefix), "\n%s_bucket{%s%sle=\"", fam, lab,
			 *lab ? "," : "");
		/* The k-th such line. */
		p = text;
		for (unsigned x = 0; x <= k; x++) {
			p = strstr(p + 1, prefix);
			if (!p)
				T_FAIL("no bucket %u of %s{%s}", k, fam, lab);
		}
		le = p + strlen(prefix);
		snprintf(line, sizeof(line), "\"} %" PRIu64 "\n", cum);
		if (k == ACCT_BUCKETS - 1) {
			if (strncmp(le, "+Inf", 4) || strncmp(le + 4, line, strlen(line)))
				T_FAIL("last bucket of %s{%s}: %.60s", fam, lab, le);
			continue;
		}
		bound = strtod(le, (char **)&p);
		if (fabs(bound - 1e-6 * (double)(1ull << k)) > 1e-15 * bound ||
		    strncmp(p, line, strlen(line)))
			T_FAIL("bucket %u of %s{%s}: %.60s, want le 2^%u us and %" PRIu64, k, fam,
			       lab, le, k, cum);
	}
	for (unsigned r = 0; r < set->nrows; r++)
		if (set->rows[r].kind == BLK_COUNTER_SUM && hist_of(set, &set->rows[r]) ==
		    &set->rows[i])
			sum = &set->rows[r];
	ASSERT_TRUE(sum != NULL);
	expected(sum, value_of(id, (unsigned)(sum - set->rows), j, 0), v, sizeof(v));
	snprintf(line, sizeof(line), "%s_sum%s%s%s %s", fam, *lab ? "{" : "", lab, *lab ? "}" : "",
		 v);
	expect_line(text, line);
	snprintf(line, sizeof(line), "%s_count%s%s%s %" PRIu64, fam, *lab ? "{" : "", lab,
		 *lab ? "}" : "", cum);
	expect_line(text, line);
}

/* The metrics: per row with a metric its family, HELP and TYPE as the row
 * says, a series per element with its value; and no family of a set's
 * prefix that is not a row (or one metrics_format writes itself). */
static void test_every_row_in_metrics(void)
{
	struct metrics_snapshot s = {
		.blk = &st, .version = "1", .engine = "null", .start_time_ns = 1,
	};
	static const char *const types[] = {
		[BLK_COUNTER_COUNTER] = "counter", [BLK_COUNTER_GAUGE] = "gauge",
		[BLK_COUNTER_HISTOGRAM] = "histogram",
	};
	char *text, line[512], prefix[64], fam[128], lab[128], v[64];
	int n = metrics_format(&s, &text);

	ASSERT_TRUE(n > 0);
	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++) {
		const struct blk_counter_set *set = &blk_counter_sets[id];
		unsigned ne;

		blk_stats_elems(&st, id, &ne);
		for (unsigned i = 0; i < set->nrows; i++) {
			const struct blk_counter *c = &set->rows[i];

			if (!c->metric || c->kind == BLK_COUNTER_SUM)
				continue;
			snprintf(fam, sizeof(fam), "vblkd_%s_%s", set->prefix, c->metric);
			snprintf(line, sizeof(line), "# HELP %s %s", fam, c->help);
			expect_line(text, line);
			snprintf(line, sizeof(line), "# TYPE %s %s", fam, types[c->kind]);
			expect_line(text, line);
			for (unsigned j = 0; j < ne; j++) {
				if (c->kind == BLK_COUNTER_HISTOGRAM) {
					check_hist_series(text, fam, id, i, j);
					continue;
				}
				expected(c, value_of(id, i, j, 0), v, sizeof(v));
				labels_of(set, j, lab, sizeof(lab));
				snprintf(line, sizeof(line), "%s%s%s%s %s", fam, *lab ? "{" : "",
					 lab, *lab ? "}" : "", v);
				expect_line(text, line);
			}
		}
		/* Every family of the prefix is a row's or a fixed one. */
		snprintf(prefix, sizeof(prefix), "# HELP vblkd_%s_", set->prefix);
		for (const char *p = strstr(text, prefix); p; p = strstr(p + 1, prefix)) {
			const char *name = p + 7;
			size_t l = strcspn(name, " ");
			bool known = false;

			for (unsigned k = 0; k < ARRAY_SIZE(fixed_families); k++)
				known |= strlen(fixed_families[k]) == l &&
					 !strncmp(fixed_families[k], name, l);
			for (unsigned k = 0; k < BLK_COUNTER_SETS && !known; k++)
				for (unsigned r = 0; r < blk_counter_sets[k].nrows; r++) {
					const struct blk_counter *c = &blk_counter_sets[k].rows[r];

					if (!c->metric || c->kind == BLK_COUNTER_SUM)
						continue;
					snprintf(fam, sizeof(fam), "vblkd_%s_%s",
						 blk_counter_sets[k].prefix, c->metric);
					known |= strlen(fam) == l && !strncmp(fam, name, l);
				}
			if (!known)
				T_FAIL("family %.*s is no row's", (int)l, name);
		}
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
