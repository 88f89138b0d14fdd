/*
 * Description: the control-socket protocol (ctl_handle, ctl_stats_json)
 * against a real device on the null engine, no socket: the stats reply is
 * valid JSON with every counter, set-poll updates (all or some) knobs and
 * rejects bad values without changing any, malformed requests get an
 * error, and replies stay inside the caller's buffer.
 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#include "test.h"

#include "backend/bdev.h"
#include "blk/blk.h"
#include "ctl/ctl.h"
#include "util/compiler.h"
#include "util/log.h"

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

static unsigned count_str(const char *s, const char *needle)
{
	unsigned n = 0;

	for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

/* The number after the first "key": at or after from. */
static uint64_t json_get_u64(const char *from, const char *key)
{
	char pat[64];
	const char *p;
	char *end;
	uint64_t v;

	snprintf(pat, sizeof(pat), "\"%s\": ", key);
	p = strstr(from, pat);
	if (!p)
		T_FAIL("no %s in %s", pat, from);
	errno = 0;
	v = strtoull(p + strlen(pat), &end, 10);
	if (errno || end == p + strlen(pat))
		T_FAIL("%s is not a number in %s", pat, from);
	return v;
}

/* The "poll" object of a reply, as params. */
static struct loop_poll_params reply_poll(const char *reply)
{
	const char *p = strstr(reply, "\"poll\": {");
	struct loop_poll_params pp;

	if (!p)
		T_FAIL("no \"poll\" object in %s", reply);
	pp.max_ns = json_get_u64(p, "max_ns");
	pp.grow = (unsigned)json_get_u64(p, "grow");
	pp.shrink = (unsigned)json_get_u64(p, "shrink");
	return pp;
}

static void params_eq(const struct loop_poll_params *a, const struct loop_poll_params *b)
{
	ASSERT_EQ(a->max_ns, b->max_ns);
	ASSERT_EQ(a->grow, b->grow);
	ASSERT_EQ(a->shrink, b->shrink);
}

static struct loop_poll_params dev_params(void)
{
	struct loop_poll_params p;

	blk_get_poll_params(dev, &p);
	return p;
}

static void set_params(uint64_t max_ns, unsigned grow, unsigned shrink)
{
	struct loop_poll_params p = { max_ns, grow, shrink };

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

static void expect_error(const char *req)
{
	const char *rep = handle(req);

	if (strncmp(rep, "{\"error\": \"", 11) != 0)
		T_FAIL("request %.80s: want an error, got %s", req, rep);
	ASSERT_EQ(count_str(rep, "\"ok\""), 0);
}

/* ---- stats ---- */

static const char *const queue_keys[] = {
	"iothread", "requests", "kicks", "calls", "calls_early", "calls_suppressed", "bad_requests",
	"poll_hits", "poll_misses", "poll_ns",
};

static const char *const iothread_keys[] = {
	"busy_ns", "cpu_ns", "poll_ns_total", "contended", "cpu",
};

static void check_stats(const char *rep)
{
	char pat[64];
	const char *q, *t;

	ASSERT_TRUE(json_object_valid(rep));
	q = strstr(rep, "\"queues\": [");
	t = strstr(rep, "\"iothreads\": [");
	ASSERT_TRUE(q != NULL);
	ASSERT_TRUE(t != NULL);
	ASSERT_EQ(count_str(rep, "\"queues\": ["), 1);
	/* Two queue objects, each with every key once. */
	ASSERT_EQ(count_str(rep, "{\"iothread\": "), NUM_QUEUES);
	for (size_t i = 0; i < ARRAY_SIZE(queue_keys); i++) {
		snprintf(pat, sizeof(pat), "\"%s\": ", queue_keys[i]);
		if (count_str(q, pat) != NUM_QUEUES)
			T_FAIL("%s appears %u times in %s", pat, count_str(q, pat), rep);
	}
	/* One iothread. */
	for (size_t i = 0; i < ARRAY_SIZE(iothread_keys); i++) {
		snprintf(pat, sizeof(pat), "\"%s\": ", iothread_keys[i]);
		if (count_str(t, pat) != 1)
			T_FAIL("%s appears %u times in iothreads of %s", pat,
			       count_str(t, pat), rep);
	}
	/* The iothread ran (it took our calls): it used some CPU. */
	ASSERT_TRUE(json_get_u64(t, "cpu_ns") > 0);
	/* Nothing connected: no traffic. */
	ASSERT_EQ(json_get_u64(q, "requests"), 0);
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
	ASSERT_EQ(count_str(out, "\"ok\": true"), 1);
	want = (struct loop_poll_params){ 1000, 2, 0 };
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
		{ "{\"cmd\": \"set-poll\", \"grow\": 4}", { 5000, 4, 3 } },
		{ "{\"cmd\": \"set-poll\", \"max_ns\": 0}", { 0, 4, 3 } },
		{ "{\"cmd\": \"set-poll\", \"shrink\": 0}", { 0, 4, 0 } },
		{ "{\"cmd\": \"set-poll\", \"max_ns\": 1000000000, \"grow\": 1024}",
		  { 1000000000, 1024, 0 } },
		{ "{\"cmd\": \"set-poll\", \"shrink\": 1024, \"grow\": 2}",
		  { 1000000000, 2, 1024 } },
		{ "{\"cmd\": \"set-poll\"}", { 1000000000, 2, 1024 } },
		{ "{\"max_ns\": 7, \"cmd\": \"set-poll\"}", { 7, 2, 1024 } },
	};
	struct loop_poll_params got;

	set_params(5000, 2, 3);
	for (size_t i = 0; i < ARRAY_SIZE(steps); i++) {
		got = reply_poll(handle(steps[i].req));
		if (count_str(out, "\"ok\": true") != 1)
			T_FAIL("%s: %s", steps[i].req, out);
		params_eq(&got, &steps[i].want);
		got = dev_params();
		params_eq(&got, &steps[i].want);
	}
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
		"{\"cmd\": \"set-poll\", \"max_ns\": }",
		"{\"cmd\": \"set-poll\", \"max_ns\":",
		"{\"cmd\": \"set-poll\", \"max_ns\": 5000, \"grow\": 1}",
		"{\"cmd\": \"set-poll\", \"max_ns\": 5000, \"shrink\": -1}",
	};
	struct loop_poll_params before, got;

	set_params(32768, 2, 2);
	before = dev_params();
	for (size_t i = 0; i < ARRAY_SIZE(reqs); i++) {
		expect_error(reqs[i]);
		if (!strstr(out, "max_ns") && !strstr(out, "grow") && !strstr(out, "shrink"))
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
	RUN(test_set_poll_bad_values_change_nothing);
	RUN(test_bad_requests_get_error);
	RUN(test_long_junk_requests_get_error);
	RUN(test_reply_never_overflows_small_buffer);

	blk_dev_free(dev);
	bdev_close(&bdev);
	return T_EXIT_PASS;
}
