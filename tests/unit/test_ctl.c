/*
 * Description: the control-socket protocol (ctl_handle, ctl_stats_json)
 * against a real device on the null engine: the stats reply is valid JSON
 * with every counter, set-poll updates (all or some) knobs and rejects bad
 * values without changing any, resize grows and refuses the rest,
 * malformed requests (not JSON, not an object, wrong types) get an error,
 * unknown fields are ignored, the wire format is pinned, and replies stay
 * inside the caller's buffer; then the server over its socket: added
 * commands, the upgrade command, and the listening socket handed to a new
 * server.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "test.h"

#include "backend/bdev.h"
#include "blk/blk.h"
#include "ctl/ctl.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sock.h"

#define NUM_QUEUES	2
#define BIG		65536

static struct bdev bdev;
static struct blk_dev *dev;
static char out[BIG];

/* ---- A small JSON validator (RFC 8259 grammar, no semantics) ---- */

static const char *js_ws(const char *s)
{
	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	return s;
}

static const char *js_value(const char *s, int depth);

static const char *js_string(const char *s)
{
	if (*s++ != '"')
		return NULL;
	while (*s != '"') {
		if ((unsigned char)*s < 0x20)
			return NULL;		/* control char or end of input */
		if (*s == '\\') {
			s++;
			if (*s == 'u') {
				for (int i = 1; i <= 4; i++)
					if (!isxdigit((unsigned char)s[i]))
						return NULL;
				s += 4;
			} else if (!strchr("\"\\/bfnrt", *s) || !*s) {
				return NULL;
			}
		}
		s++;
	}
	return s + 1;
}

static const char *js_number(const char *s)
{
	if (*s == '-')
		s++;
	if (*s == '0')
		s++;
	else if (*s >= '1' && *s <= '9')
		while (isdigit((unsigned char)*s))
			s++;
	else
		return NULL;
	if (*s == '.') {
		if (!isdigit((unsigned char)*++s))
			return NULL;
		while (isdigit((unsigned char)*s))
			s++;
	}
	if (*s == 'e' || *s == 'E') {
		s++;
		if (*s == '+' || *s == '-')
			s++;
		if (!isdigit((unsigned char)*s))
			return NULL;
		while (isdigit((unsigned char)*s))
			s++;
	}
	return s;
}

static const char *js_seq(const char *s, char close, bool keys, int depth)
{
	s = js_ws(s + 1);
	if (*s == close)
		return s + 1;
	for (;;) {
		if (keys) {
			s = js_string(js_ws(s));
			if (!s)
				return NULL;
			s = js_ws(s);
			if (*s++ != ':')
				return NULL;
		}
		s = js_value(s, depth + 1);
		if (!s)
			return NULL;
		s = js_ws(s);
		if (*s == close)
			return s + 1;
		if (*s++ != ',')
			return NULL;
	}
}

static const char *js_value(const char *s, int depth)
{
	if (depth > 32)
		return NULL;
	s = js_ws(s);
	switch (*s) {
	case '{':
		return js_seq(s, '}', true, depth);
	case '[':
		return js_seq(s, ']', false, depth);
	case '"':
		return js_string(s);
	case 't':
		return strncmp(s, "true", 4) ? NULL : s + 4;
	case 'f':
		return strncmp(s, "false", 5) ? NULL : s + 5;
	case 'n':
		return strncmp(s, "null", 4) ? NULL : s + 4;
	default:
		return js_number(s);
	}
}

/* One JSON object and nothing after it. */
static bool json_object_valid(const char *s)
{
	const char *e;

	if (*js_ws(s) != '{')
		return false;
	e = js_value(s, 0);
	return e && *js_ws(e) == '\0';
}

static void json_self_test(void)
{
	ASSERT_TRUE(json_object_valid("{}"));
	ASSERT_TRUE(json_object_valid("{\"a\": [1, -2.5e3, \"x\\\"\", {\"b\": null}], \"c\": true}"));
	ASSERT_TRUE(!json_object_valid("{\"a\": 1,}"));
	ASSERT_TRUE(!json_object_valid("{\"a\" 1}"));
	ASSERT_TRUE(!json_object_valid("{\"a\": 01}"));
	ASSERT_TRUE(!json_object_valid("{\"a\": \"x}"));
	ASSERT_TRUE(!json_object_valid("{\"a\": 1} x"));
	ASSERT_TRUE(!json_object_valid("[1]"));
}

/* ---- Helpers ---- */

/* s as a JSON object (json-c, strict), or the test fails. */
static struct json_object *parse_object(const char *s)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *o;

	json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
	o = json_tokener_parse_ex(tok, s, (int)strlen(s));
	if (!o || json_tokener_get_error(tok) != json_tokener_success ||
	    !json_object_is_type(o, json_type_object))
		T_FAIL("not a JSON object: %s", s);
	json_tokener_free(tok);
	return o;
}

/* Member key of o, which must be there. */
static struct json_object *member(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) || !v)
		T_FAIL("no \"%s\" in %s", key, json_object_to_json_string(o));
	return v;
}

/* Member key of o as a non-negative integer. */
static uint64_t member_u64(struct json_object *o, const char *key)
{
	struct json_object *v = member(o, key);

	if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0)
		T_FAIL("\"%s\" is not a non-negative integer in %s", key,
		       json_object_to_json_string(o));
	return json_object_get_uint64(v);
}

/* The "poll" object of a reply, as params. */
static struct loop_poll_params reply_poll(const char *reply)
{
	struct json_object *o = parse_object(reply), *p = member(o, "poll");
	struct loop_poll_params pp;
	struct json_object *c;

	ASSERT_EQ(json_object_object_length(p), 5);
	ASSERT_TRUE(json_object_object_get_ex(p, "check", &c) &&
		    json_object_is_type(c, json_type_boolean));
	pp.no_check = !json_object_get_boolean(c);
	pp.max_ns = member_u64(p, "max_ns");
	pp.completion_max_ns = member_u64(p, "completion_max_ns");
	pp.grow = (unsigned)member_u64(p, "grow");
	pp.shrink = (unsigned)member_u64(p, "shrink");
	json_object_put(o);
	return pp;
}

/* "ok": true in reply. */
static bool reply_ok(const char *reply)
{
	struct json_object *o = parse_object(reply), *v;
	bool ok = json_object_object_get_ex(o, "ok", &v) &&
		  json_object_is_type(v, json_type_boolean) && json_object_get_boolean(v);

	json_object_put(o);
	return ok;
}

static void params_eq(const struct loop_poll_params *a, const struct loop_poll_params *b)
{
	ASSERT_EQ(a->max_ns, b->max_ns);
	ASSERT_EQ(a->completion_max_ns, b->completion_max_ns);
	ASSERT_EQ(a->grow, b->grow);
	ASSERT_EQ(a->shrink, b->shrink);
	ASSERT_EQ(a->no_check, b->no_check);
}

static struct loop_poll_params dev_params(void)
{
	struct loop_poll_params p;

	blk_get_poll_params(dev, &p);
	return p;
}

static void set_params(uint64_t max_ns, unsigned grow, unsigned shrink)
{
	struct loop_poll_params p = { max_ns, grow, shrink, 262144 };

	blk_set_poll_params(dev, &p);
}

/* Send req with a big buffer: the reply is whole, NUL-terminated, valid
 * JSON, and its length is returned. */
static const char *handle(const char *req)
{
	int r;

	memset(out, 0x5a, sizeof(out));
	r = ctl_handle(dev, req, out, sizeof(out));
	ASSERT_TRUE(r > 0);
	ASSERT_TRUE(memchr(out, '\0', sizeof(out)) != NULL);
	ASSERT_EQ(r, strlen(out));
	if (!json_object_valid(out))
		T_FAIL("reply to %s is not a JSON object: %s", req, out);
	return out;
}

/* An error reply is {"error": "a line"} and nothing else. */
static void check_error_reply(const char *req, const char *rep)
{
	struct json_object *o = parse_object(rep), *e;

	if (json_object_object_length(o) != 1 || !json_object_object_get_ex(o, "error", &e) ||
	    !json_object_is_type(e, json_type_string) || !json_object_get_string_len(e) ||
	    strchr(json_object_get_string(e), '\n'))
		T_FAIL("request %.80s: want {\"error\": \"...\"}, got %s", req, rep);
	json_object_put(o);
}

static void expect_error(const char *req)
{
	check_error_reply(req, handle(req));
}

/* ---- stats ---- */

static const char *const queue_keys[] = {
	"iothread", "requests", "kicks", "calls", "calls_early", "calls_suppressed",
	"calls_held", "calls_held_idle", "calls_held_wasted",
	"completions_coalesced", "hold_ns_max", "hold_ns_total", "hold_late_ns_total",
	"bad_requests", "throttled_requests", "throttled_ns",
	"poll_hits", "poll_misses", "poll_vain", "poll_ns",
};

static const char *const iothread_keys[] = {
	"busy_ns", "cpu_ns", "poll_ns_total", "contended", "backend_submits", "backend_polled",
	"backend_sync",
	"completion_windows", "completion_poll_hits", "completion_poll_misses",
	"device_spin_checks", "device_spin_off", "poll_yields",
	"poll_checks", "poll_checks_off", "poll_checks_aborted", "poll_check_off",
	"cpu",
};

static const char *const disk_keys[] = { "in_flight", "busy_ns", "iothreads", "paused",
					 "held_requests", "throttled_requests", "throttled_ns",
					 "limit_iops_total", "limit_iops_read", "limit_iops_write",
					 "limit_bps_total", "limit_bps_read", "limit_bps_write",
					 "image_cache_bytes", "image_cache_hits",
					 "image_cache_misses", "image_clusters_allocated",
					 "image_cow_bytes", "image_cor_bytes", "image_streaming",
					 "image_stream_pos", "image_clusters_reused",
					 "image_bitmap_regions", "image_corrupt",
					 "ops", "nbd_ops", "pauses" };

static const char *const ops[] = { "read", "write", "flush", "discard", "write_zeroes",
				   "get_id" };

static const char *const op_keys[] = {
	"requests", "bytes", "errors", "total_ns", "latency_ns", "latency_buckets",
};

static const char *const latency_keys[] = { "p50", "p90", "p99", "p999" };

/* disk: in flight, busy time, iothreads, and per operation (in this order)
 * its counters, quantiles and 26 latency buckets; all 0 with no traffic. */
static void check_disk(struct json_object *disk)
{
	struct json_object *ops_o;
	unsigned i = 0;

	ASSERT_EQ(json_object_object_length(disk), ARRAY_SIZE(disk_keys));
	json_object_object_foreach(disk, dkey, dval) {
		if (strcmp(dkey, disk_keys[i++]))
			T_FAIL("disk member %u is %s, want %s", i - 1, dkey, disk_keys[i - 1]);
		(void)dval;
	}
	ASSERT_EQ(member_u64(disk, "in_flight"), 0);
	ASSERT_EQ(member_u64(disk, "busy_ns"), 0);
	ASSERT_EQ(member_u64(disk, "iothreads"), 1);
	ops_o = member(disk, "ops");
	ASSERT_EQ(json_object_object_length(ops_o), ARRAY_SIZE(ops));
	i = 0;
	json_object_object_foreach(ops_o, name, op) {
		struct json_object *lat, *b;
		unsigned k = 0;

		if (strcmp(name, ops[i++]))
			T_FAIL("op %u is %s, want %s", i - 1, name, ops[i - 1]);
		ASSERT_EQ(json_object_object_length(op), ARRAY_SIZE(op_keys));
		json_object_object_foreach(op, key, val) {
			if (strcmp(key, op_keys[k++]))
				T_FAIL("%s member %u is %s, want %s", name, k - 1, key,
				       op_keys[k - 1]);
			(void)val;
		}
		for (k = 0; k < 4; k++)
			ASSERT_EQ(member_u64(op, op_keys[k]), 0);
		lat = member(op, "latency_ns");
		ASSERT_EQ(json_object_object_length(lat), ARRAY_SIZE(latency_keys));
		for (k = 0; k < ARRAY_SIZE(latency_keys); k++)
			ASSERT_EQ(member_u64(lat, latency_keys[k]), 0);
		b = member(op, "latency_buckets");
		ASSERT_TRUE(json_object_is_type(b, json_type_array));
		ASSERT_EQ(json_object_array_length(b), 26);
		for (k = 0; k < 26; k++)
			ASSERT_EQ(json_object_get_int64(json_object_array_get_idx(b, k)), 0);
	}
}

/* disk: check_disk; queues: 2 objects with exactly the queue keys,
 * integers; iothreads: one with exactly its keys; poll: the four knobs;
 * qos: the limits. */
static void check_stats(const char *rep)
{
	struct json_object *o, *qa, *ta;

	ASSERT_TRUE(json_object_valid(rep));
	o = parse_object(rep);
	ASSERT_EQ(json_object_object_length(o), 5);
	check_disk(member(o, "disk"));
	{
		/* The QoS limits (none here) and the buckets. */
		struct json_object *qos = member(o, "qos"), *g;

		ASSERT_TRUE(json_object_is_type(member(qos, "limits"), json_type_string));
		ASSERT_TRUE(json_object_object_get_ex(qos, "group", &g) && g == NULL);
		ASSERT_TRUE(json_object_is_type(member(qos, "buckets"), json_type_object));
	}
	qa = member(o, "queues");
	ta = member(o, "iothreads");
	ASSERT_TRUE(json_object_is_type(qa, json_type_array));
	ASSERT_TRUE(json_object_is_type(ta, json_type_array));
	ASSERT_EQ(json_object_array_length(qa), NUM_QUEUES);
	ASSERT_EQ(json_object_array_length(ta), 1);
	for (size_t i = 0; i < NUM_QUEUES; i++) {
		struct json_object *q = json_object_array_get_idx(qa, i);

		ASSERT_EQ(json_object_object_length(q), ARRAY_SIZE(queue_keys));
		for (size_t k = 0; k < ARRAY_SIZE(queue_keys); k++)
			member_u64(q, queue_keys[k]);
		/* Nothing connected: no traffic. */
		ASSERT_EQ(member_u64(q, "requests"), 0);
		ASSERT_EQ(member_u64(q, "iothread"), 0);
	}
	{
		struct json_object *t = json_object_array_get_idx(ta, 0);

		ASSERT_EQ(json_object_object_length(t), ARRAY_SIZE(iothread_keys));
		for (size_t k = 0; k + 1 < ARRAY_SIZE(iothread_keys); k++)
			member_u64(t, iothread_keys[k]);
		/* Not pinned. */
		ASSERT_EQ(json_object_get_int(member(t, "cpu")), -1);
		/* The iothread ran (it took our calls): it used some CPU. */
		ASSERT_TRUE(member_u64(t, "cpu_ns") > 0);
	}
	json_object_put(o);
	reply_poll(rep);
}

/* {"cmd": "stats"} is a JSON object: 2 queues with every counter, one
 * iothread, the poll knobs; spacing in the request does not matter. */
static void test_stats_reply_has_every_counter(void)
{
	static const char *const reqs[] = {
		"{\"cmd\": \"stats\"}",
		"{\"cmd\":\"stats\"}",
		"{ \"cmd\" :\t\"stats\" }\n",
		"{\"other\": \"cmd\", \"cmd\": \"stats\"}",
	};
	struct loop_poll_params p = dev_params(), got;

	for (size_t i = 0; i < ARRAY_SIZE(reqs); i++) {
		const char *rep = handle(reqs[i]);

		check_stats(rep);
		got = reply_poll(rep);
		params_eq(&got, &p);
	}
}

/* ctl_stats_json: the length, or -ENOSPC when len cannot hold it all with
 * its NUL. */
static void test_stats_json_length_and_enospc(void)
{
	static char buf[BIG];
	int n = ctl_stats_json(dev, buf, sizeof(buf));

	ASSERT_TRUE(n > 0);
	ASSERT_EQ(n, strlen(buf));
	check_stats(buf);
	/* Counters do not move (no traffic) except the iothread's times,
	 * which may gain digits: allow some room. */
	ASSERT_TRUE(ctl_stats_json(dev, buf, (size_t)n + 40) > 0);
	ASSERT_EQ(ctl_stats_json(dev, buf, (size_t)n / 2), -ENOSPC);
	ASSERT_EQ(ctl_stats_json(dev, buf, 1), -ENOSPC);
	ASSERT_EQ(ctl_stats_json(dev, buf, 0), -ENOSPC);
}

/* ---- set-poll ---- */

/* max_ns and shrink set, grow kept; the reply and blk_get_poll_params()
 * agree, and so does the next stats reply. */
static void test_set_poll_updates_params(void)
{
	struct loop_poll_params want, got;

	set_params(32768, 2, 2);
	got = reply_poll(handle("{\"cmd\":\"set-poll\",\"max_ns\":1000,\"shrink\":0}"));
	ASSERT_TRUE(reply_ok(out));
	want = (struct loop_poll_params){ 1000, 2, 0, 262144 };
	params_eq(&got, &want);
	got = dev_params();
	params_eq(&got, &want);
	got = reply_poll(handle("{\"cmd\": \"stats\"}"));
	params_eq(&got, &want);
}

/* A request naming some knobs leaves the others alone; the bounds
 * themselves are accepted. */
static void test_set_poll_partial_update_keeps_others(void)
{
	static const struct {
		const char *req;
		struct loop_poll_params want;
	} steps[] = {
		{ "{\"cmd\": \"set-poll\", \"grow\": 4}", { 5000, 4, 3, 262144 } },
		{ "{\"cmd\": \"set-poll\", \"max_ns\": 0}", { 0, 4, 3, 262144 } },
		{ "{\"cmd\": \"set-poll\", \"shrink\": 0}", { 0, 4, 0, 262144 } },
		{ "{\"cmd\": \"set-poll\", \"max_ns\": 1000000000, \"grow\": 1024}",
		  { 1000000000, 1024, 0, 262144 } },
		{ "{\"cmd\": \"set-poll\", \"shrink\": 1024, \"grow\": 2}",
		  { 1000000000, 2, 1024, 262144 } },
		{ "{\"cmd\": \"set-poll\", \"completion_max_ns\": 1000}",
		  { 1000000000, 2, 1024, 1000 } },
		{ "{\"cmd\": \"set-poll\"}", { 1000000000, 2, 1024, 1000 } },
		{ "{\"max_ns\": 7, \"cmd\": \"set-poll\", \"completion_max_ns\": 0}",
		  { 7, 2, 1024, 0 } },
		/* Fields set-poll does not know are ignored. */
		{ "{\"cmd\": \"set-poll\", \"grow\": 8, \"speed\": \"fast\", \"x\": [1, {}]}",
		  { 7, 8, 1024, 0 } },
	};
	struct loop_poll_params got;

	set_params(5000, 2, 3);
	for (size_t i = 0; i < ARRAY_SIZE(steps); i++) {
		got = reply_poll(handle(steps[i].req));
		if (!reply_ok(out))
			T_FAIL("%s: %s", steps[i].req, out);
		params_eq(&got, &steps[i].want);
		got = dev_params();
		params_eq(&got, &steps[i].want);
	}
}

/* The pay check (--no-poll-check) switched off and on again at run time:
 * the reply, the device's params and the next stats agree, and requests
 * that do not name it leave it as it is. */
static void test_set_poll_check_toggles(void)
{
	struct loop_poll_params want = { 32768, 2, 2, 262144 }, got;

	set_params(32768, 2, 2);
	got = reply_poll(handle("{\"cmd\": \"stats\"}"));
	params_eq(&got, &want);
	want.no_check = true;
	got = reply_poll(handle("{\"cmd\": \"set-poll\", \"check\": false}"));
	ASSERT_TRUE(reply_ok(out));
	params_eq(&got, &want);
	got = dev_params();
	params_eq(&got, &want);
	want.grow = 4;
	got = reply_poll(handle("{\"cmd\": \"set-poll\", \"grow\": 4}"));
	params_eq(&got, &want);
	got = reply_poll(handle("{\"cmd\": \"stats\"}"));
	params_eq(&got, &want);
	want.no_check = false;
	got = reply_poll(handle("{\"cmd\": \"set-poll\", \"check\": true}"));
	params_eq(&got, &want);
	got = dev_params();
	params_eq(&got, &want);
}

/* Out of range, negative, not a number: an error naming the knob, and no
 * knob changes, not even those the request got right. */
static void test_set_poll_bad_values_change_nothing(void)
{
	static const char *const reqs[] = {
		"{\"cmd\": \"set-poll\", \"grow\": 1}",
		"{\"cmd\": \"set-poll\", \"grow\": 0}",
		"{\"cmd\": \"set-poll\", \"grow\": 1025}",
		"{\"cmd\": \"set-poll\", \"max_ns\": 2000000000}",
		"{\"cmd\": \"set-poll\", \"max_ns\": 1000000001}",
		"{\"cmd\": \"set-poll\", \"max_ns\": 99999999999999999999999}",
		"{\"cmd\": \"set-poll\", \"shrink\": \"x\"}",
		"{\"cmd\": \"set-poll\", \"shrink\": 1025}",
		"{\"cmd\": \"set-poll\", \"max_ns\": -1}",
		"{\"cmd\": \"set-poll\", \"grow\": -2}",
		"{\"cmd\": \"set-poll\", \"max_ns\": 1.5}",
		"{\"cmd\": \"set-poll\", \"max_ns\": 1e3}",
		"{\"cmd\": \"set-poll\", \"max_ns\": null}",
		"{\"cmd\": \"set-poll\", \"max_ns\": true}",
		"{\"cmd\": \"set-poll\", \"max_ns\": \"100\"}",
		"{\"cmd\": \"set-poll\", \"max_ns\": 5000, \"grow\": 1}",
		"{\"cmd\": \"set-poll\", \"max_ns\": 5000, \"shrink\": -1}",
		"{\"cmd\": \"set-poll\", \"completion_max_ns\": 1000000001}",
		"{\"cmd\": \"set-poll\", \"completion_max_ns\": [1]}",
		"{\"cmd\": \"set-poll\", \"grow\": {\"value\": 4}}",
		"{\"cmd\": \"set-poll\", \"grow\": 4, \"shrink\": false}",
		"{\"cmd\": \"set-poll\", \"check\": 0}",
		"{\"cmd\": \"set-poll\", \"check\": \"off\"}",
		"{\"cmd\": \"set-poll\", \"grow\": 4, \"check\": null}",
	};
	struct loop_poll_params before, got;

	set_params(32768, 2, 2);
	before = dev_params();
	for (size_t i = 0; i < ARRAY_SIZE(reqs); i++) {
		expect_error(reqs[i]);
		if (!strstr(out, "max_ns") && !strstr(out, "grow") && !strstr(out, "shrink") &&
		    !strstr(out, "check"))
			T_FAIL("%s: the error names no knob: %s", reqs[i], out);
		got = dev_params();
		params_eq(&got, &before);
	}
}

/* ---- Malformed requests ---- */

static void test_bad_requests_get_error(void)
{
	static const char *const reqs[] = {
		"",
		"   ",
		"\n",
		"{}",
		"{\"max_ns\": 5}",
		"{\"cmd\": \"reboot\"}",
		"{\"cmd\": \"stat\"}",
		"{\"cmd\": \"statsx\"}",
		"{\"cmd\": \"STATS\"}",
		"{\"cmd\": \"set-pollx\"}",
		"{\"cmd\": \"stats",
		"{\"cmd\": 5}",
		"{\"cmd\": null}",
		"{\"cmd\": [\"stats\"]}",
		"{\"cmd\": {\"x\": \"stats\"}}",
		"{\"cmd\"}",
		"{\"cmd\":",
		"{\"cmd\": \"",
		"\"cmd\"",
		"{\"cmdx\": \"stats\"}",
		"{\"xcmd\": \"stats\"}",
		"{\"c\\\"cmd\\\": \\\"stats\": 1}",
		"not json at all",
		"\"\"\"\"\"\"",
		/* Not an object. */
		"[{\"cmd\": \"stats\"}]",
		"\"stats\"",
		"5",
		"null",
		"true",
		/* More after the object. */
		"{\"cmd\": \"stats\"} x",
		"{\"cmd\": \"stats\"}{\"cmd\": \"stats\"}",
		"{\"cmd\": \"stats\"},",
		"{\"cmd\": \"stats\"}\n{\"cmd\": \"stats\"}",
		/* Not strict JSON. */
		"{\"cmd\": \"stats\",}",
		"{cmd: \"stats\"}",
		/* A NUL inside the name: not "stats". */
		"{\"cmd\": \"stats\\u0000x\"}",
		/* Not UTF-8. */
		"{\"cmd\": \"stats\", \"x\": \"\xff\xfe\"}",
		/* Nested deeper than any request needs. */
		"{\"cmd\": \"stats\", \"x\": [[[[[[[[[[[[1]]]]]]]]]]]]}",
		/* Broken JSON never gets as far as set-poll. */
		"{\"cmd\": \"set-poll\", \"max_ns\": }",
		"{\"cmd\": \"set-poll\", \"max_ns\":",
	};

	for (size_t i = 0; i < ARRAY_SIZE(reqs); i++)
		expect_error(reqs[i]);
}

/* 4 KiB (the server's request limit) of junk, of quotes, and of repeated
 * keys without values: an error, no crash, no runaway scan. */
static void test_long_junk_requests_get_error(void)
{
	static char req[4097];
	uint32_t x = 12345;

	for (size_t i = 0; i < sizeof(req) - 1; i++) {
		x = x * 1103515245u + 12345u;
		req[i] = (char)(1 + (x >> 16) % 255);
	}
	req[sizeof(req) - 1] = '\0';
	expect_error(req);

	memset(req, '"', sizeof(req) - 1);
	expect_error(req);

	for (size_t i = 0; i + 6 <= sizeof(req) - 1; i += 6)
		memcpy(req + i, "\"cmd\" ", 6);
	expect_error(req);

	/* A valid command at the end of 4 KiB of padding still works. */
	memset(req, ' ', sizeof(req) - 1);
	memcpy(req + sizeof(req) - 1 - 16, "{\"cmd\": \"stats\"}", 16);
	check_stats(handle(req));
}

/* Each way of not being one JSON object says so in its error. */
static void test_not_one_object_says_why(void)
{
	static const struct {
		const char *req, *why;
	} cases[] = {
		{ "[1]", "must be a JSON object, not array" },
		{ "\"stats\"", "must be a JSON object, not string" },
		{ "{\"cmd\": \"stats\"} x", "not JSON: unexpected character at byte 17" },
		{ "{\"cmd\": \"stats\"", "not a whole JSON object" },
		{ "", "not a whole JSON object" },
		{ "{\"cmd\": 01}", "not JSON" },
		{ "{\"cmd\": 5}", "needs a \\\"cmd\\\" string" },
		{ "{\"cmd\": \"stat\"}", "unknown cmd 'stat': use stats, set-poll, resize" },
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		expect_error(cases[i].req);
		if (!strstr(out, cases[i].why))
			T_FAIL("%s: want \"%s\" in %s", cases[i].req, cases[i].why, out);
	}
}

/* Fields stats does not know are ignored, whatever their type. */
static void test_unknown_fields_ignored(void)
{
	check_stats(handle("{\"cmd\": \"stats\", \"verbose\": true, \"x\": {\"y\": [1, 2.5, null]}}"));
	check_stats(handle("{\"cmd\": \"stats\", \"size\": \"big\"}"));
}

/* The wire format, pinned: json-c's spaced style, "key": value as the
 * replies always had; paths keep their slashes. */
static void test_reply_format_pinned(void)
{
	const char *rep = handle("{\"cmd\": \"set-poll\", \"max_ns\": 1000, \"grow\": 2, "
				 "\"shrink\": 0, \"completion_max_ns\": 5000}");

	if (strcmp(rep, "{ \"ok\": true, \"poll\": { \"max_ns\": 1000, \"completion_max_ns\": "
		   "5000, \"grow\": 2, \"shrink\": 0, \"check\": true } }"))
		T_FAIL("set-poll reply: %s", rep);
	rep = handle("{\"cmd\": \"set-poll\", \"grow\": 1}");
	if (strcmp(rep, "{ \"error\": \"grow must be 2..1024\" }"))
		T_FAIL("error reply: %s", rep);
	rep = handle("{\"cmd\": \"a/b\\\"c\"}");
	if (!strstr(rep, "unknown cmd 'a/b\\\"c'"))
		T_FAIL("error with a slash and a quote: %s", rep);
	rep = handle("{\"cmd\": \"stats\"}");
	static const char head[] = "{ \"disk\": { \"in_flight\": 0, \"busy_ns\": 0, \"iothreads\": 1, "
		    "\"paused\": 0, \"held_requests\": 0, \"throttled_requests\": 0, "
		    "\"throttled_ns\": 0, \"limit_iops_total\": 0, \"limit_iops_read\": 0, "
		    "\"limit_iops_write\": 0, \"limit_bps_total\": 0, \"limit_bps_read\": 0, "
		    "\"limit_bps_write\": 0, \"image_cache_bytes\": 0, \"image_cache_hits\": 0, "
		    "\"image_cache_misses\": 0, \"image_clusters_allocated\": 0, "
		    "\"image_cow_bytes\": 0, \"image_cor_bytes\": 0, \"image_streaming\": 0, "
		    "\"image_stream_pos\": 0, \"image_clusters_reused\": 0, "
		    "\"image_bitmap_regions\": 0, \"image_corrupt\": 0, "
		    "\"ops\": { \"read\": { \"requests\": 0, \"bytes\": 0, \"errors\": 0, "
		    "\"total_ns\": 0, \"latency_ns\": { \"p50\": 0, \"p90\": 0, \"p99\": 0, "
		    "\"p999\": 0 }, \"latency_buckets\": [ 0, 0, ";

	if (strncmp(rep, head, strlen(head)) ||
	    !strstr(rep, ", \"qos\": { \"limits\": \"\", \"group\": null, \"iops_size\": 0, "
		    "\"buckets\": { } } }") ||
	    !strstr(rep, "\"pauses\": { \"enospc\": { \"count\": 0 }, \"edquot\": { \"count\": 0 }, "
		    "\"eio\": { \"count\": 0 } } }, \"queues\"") ||
	    !strstr(rep, " }, \"queues\": [ { \"iothread\": 0, \"requests\": 0, "))
		T_FAIL("stats reply: %s", rep);
}

/* ---- resize ---- */

/* Grows (no frontend to tell: notified false), the same size again is
 * fine, shrinking and sizes that are not whole blocks are refused, and a
 * size of the wrong type is refused before anything happens. */
static void test_resize_command(void)
{
	static const char *const bad_types[] = {
		"{\"cmd\": \"resize\"}",
		"{\"cmd\": \"resize\", \"size\": \"4M\"}",
		"{\"cmd\": \"resize\", \"size\": -4096}",
		"{\"cmd\": \"resize\", \"size\": 4194304.0}",
		"{\"cmd\": \"resize\", \"size\": 4e6}",
		"{\"cmd\": \"resize\", \"size\": null}",
		"{\"cmd\": \"resize\", \"size\": [4194304]}",
		"{\"cmd\": \"resize\", \"Size\": 4194304}",
	};
	const char *rep;

	ASSERT_EQ(bdev.size, 1 << 20);
	rep = handle("{\"cmd\": \"resize\", \"size\": 2097152}");
	if (strcmp(rep, "{ \"ok\": true, \"size\": 2097152, \"notified\": false }"))
		T_FAIL("resize reply: %s", rep);
	ASSERT_EQ(bdev.size, 2 << 20);
	ASSERT_TRUE(reply_ok(handle("{\"cmd\": \"resize\", \"size\": 2097152}")));
	expect_error("{\"cmd\": \"resize\", \"size\": 1048576}");
	if (!strstr(out, "shrinking"))
		T_FAIL("shrink: %s", out);
	expect_error("{\"cmd\": \"resize\", \"size\": 3000001}");
	for (size_t i = 0; i < ARRAY_SIZE(bad_types); i++) {
		expect_error(bad_types[i]);
		if (!strstr(out, "resize needs \\\"size\\\": BYTES"))
			T_FAIL("%s: %s", bad_types[i], out);
	}
	ASSERT_EQ(bdev.size, 2 << 20);
}

/* ---- status and resume (the error policy's pause) ---- */

/* A device that never paused: status says running with nothing held and
 * no pause so far, by reason; resume has nothing to do and says so; both
 * replies pinned, since scripts read them. */
static void test_status_and_resume_commands(void)
{
	const char *rep = handle("{\"cmd\": \"status\"}");

	if (strcmp(rep, "{ \"state\": \"running\", \"held_requests\": 0, \"pauses\": "
			"{ \"enospc\": 0, \"edquot\": 0, \"eio\": 0 } }"))
		T_FAIL("status reply: %s", rep);
	rep = handle("{\"cmd\": \"resume\"}");
	if (strcmp(rep, "{ \"ok\": true, \"resubmitted\": 0, \"state\": \"running\", "
			"\"held_requests\": 0, \"pauses\": { \"enospc\": 0, \"edquot\": 0, "
			"\"eio\": 0 } }"))
		T_FAIL("resume reply: %s", rep);
}

/* ---- The server: a socket, added commands, handing the socket over ---- */

struct asker {
	struct loop *l;
	const char *path, *req;
	char reply[BIG];
};

static void *asker_thread(void *arg)
{
	struct asker *a = arg;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t got = 0;
	int fd;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", a->path);
	a->reply[0] = '\0';
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    send(fd, a->req, strlen(a->req), MSG_NOSIGNAL) >= 0) {
		ssize_t r;

		while (got < sizeof(a->reply) - 1 &&
		       (r = recv(fd, a->reply + got, sizeof(a->reply) - 1 - got, 0)) > 0)
			got += (size_t)r;
		a->reply[got] = '\0';
	}
	if (fd >= 0)
		close(fd);
	loop_stop(a->l);
	return NULL;
}

/* req over the socket at path while this thread runs the main loop, as
 * vblkd's main thread does; returns the reply line. */
static const char *ask(struct loop *l, const char *path, const char *req)
{
	static struct asker a;
	pthread_t t;

	a = (struct asker){ .l = l, .path = path, .req = req };
	ASSERT_EQ(pthread_create(&t, NULL, asker_thread, &a), 0);
	ASSERT_EQ(loop_run(l), 0);
	ASSERT_EQ(pthread_join(t, NULL), 0);
	return a.reply;
}

static struct loop *main_loop;
static char sock_dir[] = "/tmp/vblk-test-ctl.XXXXXX";
static char sock_path[96];	/* fits sun_path */

/* A command added by whoever runs the server (vblkd adds "metrics"). */
static int cmd_count(void *opaque, struct json_object *req, struct json_object *reply,
		     char *err, size_t errlen)
{
	unsigned *calls = opaque;
	struct json_object *f;

	(*calls)++;
	/* What a handler put in before failing never reaches the client. */
	json_object_object_add(reply, "partial", json_object_new_int(1));
	if (json_object_object_get_ex(req, "fail", &f)) {
		snprintf(err, errlen, "asked to fail");
		return -EINVAL;
	}
	json_object_object_add(reply, "calls", json_object_new_int((int)*calls));
	return 0;
}

static int cmd_other(void *opaque, struct json_object *req, struct json_object *reply,
		     char *err, size_t errlen)
{
	return 0;
}

/* Over the socket: built-ins answer, an added command answers with its
 * opaque, its error replaces whatever it added, the unknown-command error
 * lists it; taken or empty names are refused; free unlinks the path. */
static void test_server_added_command(void)
{
	struct ctl_server *s;
	unsigned calls = 0;
	char err[256];
	const char *rep;

	ASSERT_EQ(ctl_server_new(sock_path, main_loop, dev, &s, err, sizeof(err)), 0);
	ASSERT_EQ(ctl_server_add_cmd(s, "count", cmd_count, &calls), 0);
	ASSERT_EQ(ctl_server_add_cmd(s, "count", cmd_other, NULL), -EEXIST);
	ASSERT_EQ(ctl_server_add_cmd(s, "stats", cmd_other, NULL), -EEXIST);
	ASSERT_EQ(ctl_server_add_cmd(s, "", cmd_other, NULL), -EINVAL);
	ASSERT_EQ(ctl_server_add_cmd(s, "other", cmd_other, NULL), 0);

	rep = ask(main_loop, sock_path, "{\"cmd\": \"stats\"}\n");
	ASSERT_TRUE(strlen(rep) > 0 && rep[strlen(rep) - 1] == '\n');
	check_stats(rep);
	rep = ask(main_loop, sock_path, "{\"cmd\": \"count\"}\n");
	if (strcmp(rep, "{ \"partial\": 1, \"calls\": 1 }\n"))
		T_FAIL("count: %s", rep);
	rep = ask(main_loop, sock_path, "{\"cmd\": \"count\", \"fail\": true}\n");
	if (strcmp(rep, "{ \"error\": \"asked to fail\" }\n"))
		T_FAIL("count failing: %s", rep);
	ASSERT_EQ(calls, 2);
	rep = ask(main_loop, sock_path, "{\"cmd\": \"nope\"}\n");
	if (!strstr(rep, "use stats, set-poll, resize, status, resume, limits, set-limits, count, "
			 "other\""))
		T_FAIL("unknown: %s", rep);
	rep = ask(main_loop, sock_path, "[\"count\"]\n");
	check_error_reply("[\"count\"]", rep);
	ASSERT_EQ(calls, 2);
	/* Added commands belong to a server: ctl_handle has none. */
	expect_error("{\"cmd\": \"count\"}");
	ASSERT_EQ(calls, 2);

	ASSERT_EQ(ctl_server_listen_fd(s) >= 0, 1);
	ctl_server_free(s);
	ASSERT_EQ(access(sock_path, F_OK), -1);
}

/* What vblkd's upgrade_cb would do, recorded. */
static char upgrade_exec[256];
static int upgrade_calls;

static int fake_upgrade(void *opaque, const char *exec, char *msg, size_t msglen)
{
	upgrade_calls++;
	snprintf(upgrade_exec, sizeof(upgrade_exec), "%s", exec ? exec : "(none)");
	if (exec && !strcmp(exec, "/bad")) {
		snprintf(msg, msglen, "the new vblkd said: no");
		return -EPROTO;
	}
	snprintf(msg, msglen, "pid %d serves now", *(int *)opaque);
	return *(int *)opaque;
}

/* ctl_server_set_upgrade: "upgrade" with or without "exec" (any path, its
 * quotes and backslashes too), the pid and message in the reply; an
 * "exec" that is not a non-empty string is refused before fn runs; fn's
 * refusal is the error.  ctl_server_new_fd with -1 binds the path. */
static void test_server_upgrade_command(void)
{
	struct ctl_server *s;
	char err[256];
	const char *rep;
	int pid = 4242;

	ASSERT_EQ(ctl_server_new_fd(sock_path, -1, main_loop, dev, &s, err, sizeof(err)), 0);
	rep = ask(main_loop, sock_path, "{\"cmd\": \"upgrade\"}\n");
	if (!strstr(rep, "unknown cmd 'upgrade'"))
		T_FAIL("before set_upgrade: %s", rep);
	ctl_server_set_upgrade(s, fake_upgrade, &pid);
	ctl_server_set_upgrade(s, fake_upgrade, &pid);	/* again: still one command */

	rep = ask(main_loop, sock_path, "{\"cmd\": \"upgrade\"}\n");
	if (strcmp(rep, "{ \"ok\": true, \"pid\": 4242, \"message\": \"pid 4242 serves now\" }\n"))
		T_FAIL("upgrade: %s", rep);
	ASSERT_TRUE(!strcmp(upgrade_exec, "(none)"));
	rep = ask(main_loop, sock_path,
		  "{\"cmd\": \"upgrade\", \"exec\": \"/opt/v \\\"1\\\"\\\\vblkd\"}\n");
	ASSERT_TRUE(strstr(rep, "\"pid\": 4242") != NULL);
	if (strcmp(upgrade_exec, "/opt/v \"1\"\\vblkd"))
		T_FAIL("exec passed as %s", upgrade_exec);
	ASSERT_EQ(upgrade_calls, 2);
	static const char *const bad[] = {
		"{\"cmd\": \"upgrade\", \"exec\": 5}\n",
		"{\"cmd\": \"upgrade\", \"exec\": null}\n",
		"{\"cmd\": \"upgrade\", \"exec\": \"\"}\n",
		"{\"cmd\": \"upgrade\", \"exec\": \"/a\\u0000b\"}\n",
		"{\"cmd\": \"upgrade\", \"exec\": [\"/a\"]}\n",
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		rep = ask(main_loop, sock_path, bad[i]);
		if (strcmp(rep, "{ \"error\": \"\\\"exec\\\" must be a path string\" }\n"))
			T_FAIL("%s: %s", bad[i], rep);
	}
	ASSERT_EQ(upgrade_calls, 2);
	rep = ask(main_loop, sock_path, "{\"cmd\": \"upgrade\", \"exec\": \"/bad\"}\n");
	if (strcmp(rep, "{ \"error\": \"the new vblkd said: no\" }\n"))
		T_FAIL("refused: %s", rep);
	rep = ask(main_loop, sock_path, "{\"cmd\": \"nope\"}\n");
	ASSERT_TRUE(strstr(rep, "use stats, set-poll, resize, status, resume, limits, set-limits, "
			   "upgrade\"") != NULL);
	ctl_server_free(s);
	ASSERT_EQ(access(sock_path, F_OK), -1);
}

/* Upgrade in place: the listening socket, handed to a new server (here a
 * dup, as a new process would get it), serves the same path; the server
 * that let go keeps the path on free, the last one unlinks it. */
static void test_server_listen_fd_handed_over(void)
{
	struct ctl_server *a, *b;
	char err[256];
	int fd, dupfd;

	fd = sock_listen_unix(sock_path, err, sizeof(err));
	ASSERT_TRUE(fd >= 0);
	dupfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	ASSERT_TRUE(dupfd >= 0);
	ASSERT_EQ(ctl_server_new_fd(sock_path, fd, main_loop, dev, &a, err, sizeof(err)), 0);
	ASSERT_EQ(ctl_server_listen_fd(a), fd);
	ASSERT_TRUE(fcntl(fd, F_GETFL) & O_NONBLOCK);
	ASSERT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	check_stats(ask(main_loop, sock_path, "{\"cmd\": \"stats\"}\n"));
	ctl_server_free_keep_path(a);
	ASSERT_EQ(access(sock_path, F_OK), 0);
	ASSERT_EQ(fcntl(fd, F_GETFD), -1);	/* its copy is closed */

	ASSERT_EQ(ctl_server_new_fd(sock_path, dupfd, main_loop, dev, &b, err, sizeof(err)), 0);
	ASSERT_EQ(ctl_server_listen_fd(b), dupfd);
	check_stats(ask(main_loop, sock_path, "{\"cmd\": \"stats\"}\n"));
	ctl_server_free(b);
	ASSERT_EQ(access(sock_path, F_OK), -1);

	/* ctl_server_new's own socket, freed keeping its path. */
	ASSERT_EQ(ctl_server_new(sock_path, main_loop, dev, &a, err, sizeof(err)), 0);
	ctl_server_free_keep_path(a);
	ASSERT_EQ(access(sock_path, F_OK), 0);
	unlink(sock_path);
}

/* An fd that is not a listening stream socket is refused with one line,
 * and stays the caller's (open). */
static void test_server_new_fd_refuses_non_listener(void)
{
	struct ctl_server *s = NULL;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char err[256];
	int p[2], fd;

	ASSERT_EQ(pipe(p), 0);
	ASSERT_EQ(ctl_server_new_fd(sock_path, p[0], main_loop, dev, &s, err, sizeof(err)),
		  -ENOTSOCK);
	ASSERT_TRUE(strstr(err, "control socket fd") != NULL);
	ASSERT_TRUE(fcntl(p[0], F_GETFD) >= 0);
	close(p[0]);
	close(p[1]);

	/* Bound, not listening. */
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ASSERT_EQ(ctl_server_new_fd(sock_path, fd, main_loop, dev, &s, err, sizeof(err)),
		  -EINVAL);
	ASSERT_TRUE(strstr(err, "is not a listening stream socket") != NULL);
	ASSERT_TRUE(fcntl(fd, F_GETFD) >= 0);
	close(fd);
	/* A datagram socket. */
	fd = socket(AF_UNIX, SOCK_DGRAM, 0);
	ASSERT_EQ(ctl_server_new_fd(sock_path, fd, main_loop, dev, &s, err, sizeof(err)),
		  -EINVAL);
	close(fd);
	ASSERT_TRUE(s == NULL);
	unlink(sock_path);
}

/* ---- Bounded output ---- */

#define CANARY		0xa5
#define CANARY_LEN	64

/*
 * Every request, with every small buffer size: nothing written at or past
 * outlen, the reply NUL-terminated inside it, and the length returned is
 * the length of what is in the buffer.
 */
static void check_bounded(const char *req, size_t outlen)
{
	static unsigned char buf[BIG + CANARY_LEN];
	int r;

	memset(buf, CANARY, outlen + CANARY_LEN);
	r = ctl_handle(dev, req, (char *)buf, outlen);
	for (size_t i = outlen; i < outlen + CANARY_LEN; i++)
		if (buf[i] != CANARY)
			T_FAIL("%s, outlen %zu: byte %zu written (0x%02x)", req, outlen, i,
			       buf[i]);
	ASSERT_TRUE(r >= 0);
	if (!outlen)
		return;
	if (!memchr(buf, '\0', outlen))
		T_FAIL("%s, outlen %zu: no NUL inside the buffer", req, outlen);
	if ((size_t)r != strlen((char *)buf))
		T_FAIL("%s, outlen %zu: returned %d for a %zu-byte reply \"%s\"", req,
		       outlen, r, strlen((char *)buf), buf);
}

static void test_reply_never_overflows_small_buffer(void)
{
	static const char *const reqs[] = {
		"{\"cmd\": \"stats\"}",
		"{\"cmd\": \"set-poll\"}",
		"{\"cmd\": \"set-poll\", \"grow\": 1}",
		"{\"cmd\": \"nope\"}",
		"",
	};
	struct loop_poll_params before = dev_params(), got;
	size_t full;

	full = (size_t)ctl_handle(dev, reqs[0], out, sizeof(out));
	for (size_t i = 0; i < ARRAY_SIZE(reqs); i++) {
		for (size_t len = 0; len <= 128; len++)
			check_bounded(reqs[i], len);
		check_bounded(reqs[i], full - 1);
		check_bounded(reqs[i], full);
		check_bounded(reqs[i], full + 1);
		check_bounded(reqs[i], sizeof(out));
	}
	/* set-poll without knobs changed nothing, however small the buffer. */
	got = dev_params();
	params_eq(&got, &before);
}

int main(void)
{
	struct bdev_opts bo = { .engine = "null", .size = 1 << 20 };
	char err[256];
	int r;

	log_set_level(LOG_WARN);
	alarm(120);
	r = bdev_open(&bo, &bdev, err, sizeof(err));
	if (r < 0)
		T_FAIL("bdev_open: %s", err);
	ASSERT_EQ(blk_dev_new(&bdev, &(struct blk_opts){ .num_queues = NUM_QUEUES }, &dev), 0);
	ASSERT_EQ(blk_dev_num_queues(dev), NUM_QUEUES);
	ASSERT_EQ(blk_dev_num_iothreads(dev), 1);

	RUN(json_self_test);
	RUN(test_stats_reply_has_every_counter);
	RUN(test_stats_json_length_and_enospc);
	RUN(test_set_poll_updates_params);
	RUN(test_set_poll_partial_update_keeps_others);
	RUN(test_set_poll_check_toggles);
	RUN(test_set_poll_bad_values_change_nothing);
	RUN(test_bad_requests_get_error);
	RUN(test_not_one_object_says_why);
	RUN(test_unknown_fields_ignored);
	RUN(test_reply_format_pinned);
	RUN(test_long_junk_requests_get_error);
	RUN(test_reply_never_overflows_small_buffer);
	RUN(test_resize_command);
	RUN(test_status_and_resume_commands);

	ASSERT_TRUE(mkdtemp(sock_dir) != NULL);
	snprintf(sock_path, sizeof(sock_path), "%s/c.sock", sock_dir);
	ASSERT_EQ(loop_new("main", &main_loop), 0);
	RUN(test_server_added_command);
	RUN(test_server_upgrade_command);
	RUN(test_server_listen_fd_handed_over);
	RUN(test_server_new_fd_refuses_non_listener);
	loop_free(main_loop);
	rmdir(sock_dir);

	blk_dev_free(dev);
	bdev_close(&bdev);
	return T_EXIT_PASS;
}
