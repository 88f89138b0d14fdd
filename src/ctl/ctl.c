#include "ctl/ctl.h"
#include "util/jfield.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "acct/acct.h"
#include "blk/blk.h"
#include "loop/loop.h"
#include "qos/qos.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sock.h"
#include "util/sys.h"

#define CTL_MAX_REQ 4096
/* Requests are flat objects: anything nested deeper is refused. */
#define CTL_MAX_DEPTH 8
/* The main thread waits at most this long on one client, each way. */
#define CTL_CLIENT_MS 1000
/* Key/value spacing as the hand-written replies had ("key": value), and
 * paths in error messages left as they are ("/", not "\/"). */
#define CTL_JSON_FLAGS (JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE)

struct ctl_cmd {
	char *name;
	ctl_cmd_fn fn;
	void *opaque;
};

struct ctl_server {
	char *path;
	int fd;
	struct loop *loop;
	struct loop_fd *h;
	struct blk_dev *dev;
	struct ctl_cmd *cmds;		/* ctl_server_add_cmd */
	unsigned ncmds;
	ctl_upgrade_fn upgrade;		/* ctl_server_set_upgrade */
	void *upgrade_opaque;
	bool logged_denied;		/* a client of another user was refused */
};

/* ---- Replies ---- */

/* json_object_object_add that remembers a failed allocation in *ok. */
static void add(struct json_object *o, const char *key, struct json_object *v, bool *ok)
{
	if (!v || json_object_object_add(o, key, v) < 0) {
		json_object_put(v);
		*ok = false;
	}
}

/* An object built with add(): itself, or NULL (freed) if a part failed. */
static struct json_object *done(struct json_object *o, bool ok)
{
	if (ok)
		return o;
	json_object_put(o);
	return NULL;
}

static struct json_object *poll_object(const struct loop_poll_params *p)
{
	struct json_object *o = json_object_new_object();
	bool ok = o != NULL;

	if (!o)
		return NULL;
	add(o, "max_ns", json_object_new_uint64(p->max_ns), &ok);
	add(o, "completion_max_ns", json_object_new_uint64(p->completion_max_ns), &ok);
	add(o, "grow", json_object_new_uint64(p->grow), &ok);
	add(o, "shrink", json_object_new_uint64(p->shrink), &ok);
	add(o, "check", json_object_new_boolean(!p->no_check), &ok);
	return done(o, ok);
}

/* The quantiles of a latency histogram (acct.h), in ns, as Prometheus'
 * histogram_quantile() would give them from the metrics. */
static const struct {
	const char *key;
	double q;
} quantiles[] = { { "p50", 0.5 }, { "p90", 0.9 }, { "p99", 0.99 }, { "p999", 0.999 } };

/* A hist row's members: <name>_ns, the quantiles; <name>_buckets, the
 * counts as kept (not cumulative). */
static void add_hist(struct json_object *o, const char *name, const uint64_t *hist, bool *ok)
{
	struct json_object *q = json_object_new_object(), *b = json_object_new_array();
	char key[64];

	for (unsigned i = 0; q && i < ARRAY_SIZE(quantiles); i++)
		add(q, quantiles[i].key, json_object_new_uint64(acct_quantile_ns(hist,
									 quantiles[i].q)), ok);
	for (unsigned i = 0; b && i < ACCT_BUCKETS; i++) {
		struct json_object *v = json_object_new_uint64(hist[i]);

		if (!v || json_object_array_add(b, v) < 0) {
			json_object_put(v);
			*ok = false;
		}
	}
	snprintf(key, sizeof(key), "%s_ns", name);
	add(o, key, q, ok);
	snprintf(key, sizeof(key), "%s_buckets", name);
	add(o, key, b, ok);
}

/* One element of a counter set (blk/counters.h): its rows as members. */
static struct json_object *counters_object(const struct blk_counter_set *set, const void *elem)
{
	struct json_object *o = json_object_new_object();
	bool ok = o != NULL;

	if (!o)
		return NULL;
	for (unsigned i = 0; i < set->nrows; i++) {
		const struct blk_counter *c = &set->rows[i];

		if (c->kind == BLK_COUNTER_HISTOGRAM)
			add_hist(o, c->name, blk_counter_hist(c, elem), &ok);
		else if (c->is_signed)
			add(o, c->name, json_object_new_int64(blk_counter_s64(c, elem)), &ok);
		else
			add(o, c->name, json_object_new_uint64(blk_counter_u64(c, elem)), &ok);
	}
	return done(o, ok);
}

/* Counter set id of st as JSON: one element an object, with the sets
 * whose parent it is as members after its rows; numbered elements an
 * array of objects; named ones an object of objects. */
static struct json_object *set_json(const struct blk_stats *st, unsigned id)
{
	const struct blk_counter_set *set = &blk_counter_sets[id];
	unsigned n;
	const char *elems = blk_stats_elems(st, id, &n);
	struct json_object *o;
	bool ok = true;

	if (!set->label) {
		o = counters_object(set, elems);
		for (unsigned k = 0; o && k < BLK_COUNTER_SETS; k++)
			if (blk_counter_sets[k].parent == (int)id)
				add(o, blk_counter_sets[k].json, set_json(st, k), &ok);
		return done(o, ok);
	}
	o = set->elem_name ? json_object_new_object() : json_object_new_array();
	for (unsigned i = 0; o && i < n; i++) {
		struct json_object *e = counters_object(set, elems + (size_t)i * set->size);

		if (set->elem_name) {
			add(o, set->elem_name(i), e, &ok);
		} else if (!e || json_object_array_add(o, e) < 0) {
			json_object_put(e);
			ok = false;
		}
	}
	return o ? done(o, ok) : NULL;
}

/* The "stats" members of snapshot st, added to reply: a member per
 * counter set of the top level (the others are inside their parent's),
 * the polling knobs. */
static int stats_add(const struct blk_stats *st, struct json_object *reply)
{
	bool ok = true;

	for (unsigned id = 0; id < BLK_COUNTER_SETS; id++)
		if (blk_counter_sets[id].parent < 0)
			add(reply, blk_counter_sets[id].json, set_json(st, id), &ok);
	add(reply, "poll", poll_object(&st->poll), &ok);
	return ok ? 0 : -ENOMEM;
}

/* The "stats" reply's members, added to reply. */
/* The QoS limits and the buckets' levels: "limits" (the --limit
 * syntax), "group", "buckets" (the limited ones). */
static struct json_object *qos_object(struct blk_dev *d)
{
	struct json_object *o = json_object_new_object(), *bk;
	struct qos *q = blk_dev_qos(d);
	const char *group = qos_group_name(q);
	struct qos_limits l;
	struct qos_buckets b;
	char buf[1024];
	bool ok = true;

	if (!o)
		return NULL;
	qos_get(q, &l, &b, sys_now_ns());
	qos_limits_format(&l, buf, sizeof(buf));
	add(o, "limits", json_object_new_string(buf), &ok);
	if (group)
		add(o, "group", json_object_new_string(group), &ok);
	else
		json_object_object_add(o, "group", NULL);	/* JSON null */
	add(o, "iops_size", json_object_new_uint64(l.iops_size), &ok);
	bk = json_object_new_object();
	for (unsigned i = 0; bk && i < QOS_NR_BKT; i++) {
		struct json_object *e;
		bool eok = true;

		if (!l.b[i].avg)
			continue;
		e = json_object_new_object();
		if (!e) {
			ok = false;
			break;
		}
		add(e, "avg", json_object_new_uint64(l.b[i].avg), &eok);
		add(e, "max", json_object_new_uint64(l.b[i].max), &eok);
		add(e, "max_length", json_object_new_uint64(l.b[i].max_len ? l.b[i].max_len : 1),
		    &eok);
		add(e, "level", json_object_new_double(b.level[i]), &eok);
		add(e, "burst_level", json_object_new_double(b.burst[i]), &eok);
		add(bk, qos_bkt_name(i), done(e, eok), &ok);
	}
	add(o, "buckets", bk, &ok);	/* NULL bk: not ok */
	return done(o, ok);
}

static int stats_fill(struct blk_dev *d, struct json_object *reply)
{
	struct blk_stats st;
	bool ok = true;
	int r = blk_stats_snapshot(d, &st);

	if (r < 0)
		return r;
	r = stats_add(&st, reply);
	blk_stats_release(&st);
	if (r == 0) {
		add(reply, "qos", qos_object(d), &ok);
		if (!ok)
			r = -ENOMEM;
	}
	return r;
}

/* o (built, or r < 0) as text into buf; frees o.  Returns the length,
 * -ENOSPC if it does not fit with its NUL, or r. */
static int json_to_buf(struct json_object *o, int r, char *buf, size_t len)
{
	const char *s;
	size_t n;

	if (r >= 0) {
		s = json_object_to_json_string_length(o, CTL_JSON_FLAGS, &n);
		if (!s) {
			r = -ENOMEM;
		} else if (n >= len) {
			r = -ENOSPC;
		} else {
			memcpy(buf, s, n + 1);
			r = (int)n;
		}
	}
	json_object_put(o);
	return r;
}

int ctl_stats_format(const struct blk_stats *st, char *buf, size_t len)
{
	struct json_object *o = json_object_new_object();

	if (!o)
		return -ENOMEM;
	return json_to_buf(o, stats_add(st, o), buf, len);
}

int ctl_stats_json(struct blk_dev *d, char *buf, size_t len)
{
	struct json_object *o = json_object_new_object();

	/* The same object as the "stats" reply, the QoS limits included. */
	if (!o)
		return -ENOMEM;
	return json_to_buf(o, stats_fill(d, o), buf, len);
}

/* ---- Requests ---- */


static int cmd_stats(void *opaque, struct json_object *req, struct json_object *reply,
		     char *err, size_t errlen)
{
	int r = stats_fill(opaque, reply);

	if (r < 0)
		snprintf(err, errlen, "out of memory");
	return r;
}

/* One knob of set-poll: absent leaves *v, present must be in lo..hi. */
static int poll_knob(struct json_object *req, const char *key, uint64_t lo, uint64_t hi,
		     uint64_t *v, char *err, size_t errlen)
{
	uint64_t x;
	int r = jfield_u64(req, key, &x);

	if (r < 0 || (r && (x < lo || x > hi))) {
		snprintf(err, errlen, "%s must be %" PRIu64 "..%" PRIu64, key, lo, hi);
		return -EINVAL;
	}
	if (r)
		*v = x;
	return 0;
}

static int cmd_set_poll(void *opaque, struct json_object *req, struct json_object *reply,
			char *err, size_t errlen)
{
	struct blk_dev *d = opaque;
	struct loop_poll_params p;
	uint64_t grow, shrink;
	bool ok = true, check;

	/* Every knob checked before any changes. */
	blk_get_poll_params(d, &p);
	grow = p.grow;
	shrink = p.shrink;
	if (poll_knob(req, "max_ns", 0, 1000000000, &p.max_ns, err, errlen) < 0 ||
	    poll_knob(req, "completion_max_ns", 0, 1000000000, &p.completion_max_ns, err,
		      errlen) < 0 ||
	    poll_knob(req, "grow", 2, 1024, &grow, err, errlen) < 0 ||
	    poll_knob(req, "shrink", 0, 1024, &shrink, err, errlen) < 0)
		return -EINVAL;
	check = !p.no_check;
	if (jfield_bool(req, "check", &check) < 0) {
		snprintf(err, errlen, "check must be true or false");
		return -EINVAL;
	}
	p.grow = (unsigned)grow;
	p.shrink = (unsigned)shrink;
	p.no_check = !check;
	blk_set_poll_params(d, &p);
	log_info("polling set: max %" PRIu64 " ns, completions %" PRIu64 " ns, grow %u, "
		 "shrink %u, pay check %s", p.max_ns, p.completion_max_ns, p.grow, p.shrink,
		 check ? "on" : "off");
	blk_get_poll_params(d, &p);
	add(reply, "ok", json_object_new_boolean(1), &ok);
	add(reply, "poll", poll_object(&p), &ok);
	if (!ok) {
		/* The knobs are set; only the reply could not be built. */
		snprintf(err, errlen, "polling set, but out of memory for the reply");
		return -ENOMEM;
	}
	return 0;
}

static int cmd_resize(void *opaque, struct json_object *req, struct json_object *reply,
		      char *err, size_t errlen)
{
	uint64_t size;
	bool ok = true;
	int r;

	if (jfield_u64(req, "size", &size) != 1) {
		snprintf(err, errlen, "resize needs \"size\": BYTES");
		return -EINVAL;
	}
	r = blk_dev_resize(opaque, size, err, errlen);
	if (r < 0)
		return r;
	add(reply, "ok", json_object_new_boolean(1), &ok);
	add(reply, "size", json_object_new_uint64(size), &ok);
	add(reply, "notified", json_object_new_boolean(r > 0), &ok);
	if (!ok) {
		snprintf(err, errlen, "resized, but out of memory for the reply");
		return -ENOMEM;
	}
	return 0;
}

/* The pause of the error policy, as "status" and "resume" tell it. */
static void add_pause_state(struct blk_dev *d, struct json_object *reply, bool *ok)
{
	struct disk_pause_state st;
	struct json_object *p = json_object_new_object();

	disk_pause_state(blk_dev_disk(d), &st);
	add(reply, "state", json_object_new_string(st.paused ? "paused" : "running"), ok);
	if (st.paused) {
		add(reply, "reason", json_object_new_string(st.reason), ok);
		add(reply, "since", json_object_new_uint64(st.since), ok);
	}
	add(reply, "held_requests", json_object_new_uint64(st.held), ok);
	for (unsigned i = 0; p && i < DISK_PAUSE_NR; i++)
		add(p, disk_pause_reason_name(i), json_object_new_uint64(st.pauses[i]), ok);
	add(reply, "pauses", p, ok);
}

static int cmd_status(void *opaque, struct json_object *req, struct json_object *reply,
		      char *err, size_t errlen)
{
	bool ok = true;

	add_pause_state(opaque, reply, &ok);
	if (!ok) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

static int cmd_resume(void *opaque, struct json_object *req, struct json_object *reply,
		      char *err, size_t errlen)
{
	int n = disk_resume(blk_dev_disk(opaque));
	bool ok = true;

	add(reply, "ok", json_object_new_boolean(1), &ok);
	add(reply, "resubmitted", json_object_new_uint64((uint64_t)n), &ok);
	/* A request that failed again at once has paused the disk again. */
	add_pause_state(opaque, reply, &ok);
	if (!ok) {
		snprintf(err, errlen, "resumed, but out of memory for the reply");
		return -ENOMEM;
	}
	return 0;
}

static int cmd_limits(void *opaque, struct json_object *req, struct json_object *reply,
		      char *err, size_t errlen)
{
	struct json_object *o = qos_object(opaque);

	if (!o) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	json_object_object_foreach(o, k, v)
		json_object_object_add(reply, k, json_object_get(v));
	json_object_put(o);
	return 0;
}

/* {"cmd": "set-limits", "limits": "iops-total=1000", "group": true}: the
 * keys named change, the others stay (0 removes one).  A disk in a group
 * has the group's limits: changing them is said with "group", for every
 * member at once. */
static int cmd_set_limits(void *opaque, struct json_object *req, struct json_object *reply,
			  char *err, size_t errlen)
{
	struct qos *q = blk_dev_qos(opaque);
	const char *group = qos_group_name(q);
	struct json_object *f, *g;
	struct qos_limits l;
	bool want_group = false, ok = true;
	char buf[1024];
	int r;

	if (!json_object_object_get_ex(req, "limits", &f) ||
	    !json_object_is_type(f, json_type_string)) {
		snprintf(err, errlen, "set-limits needs \"limits\": \"KEY=VALUE,...\"");
		return -EINVAL;
	}
	if (json_object_object_get_ex(req, "group", &g))
		want_group = json_object_get_boolean(g);
	if (group && !want_group) {
		snprintf(err, errlen, "this disk's limits are those of its QoS group '%s': "
			 "change them for every member with set-limits --group", group);
		return -EINVAL;
	}
	if (!group && want_group) {
		snprintf(err, errlen, "this disk is in no QoS group (--qos-group): "
			 "set-limits without --group");
		return -EINVAL;
	}
	qos_get(q, &l, NULL, sys_now_ns());
	r = qos_limits_parse(json_object_get_string(f), &l, err, errlen);
	if (r < 0)
		return r;
	qos_set(q, &l);
	qos_limits_format(&l, buf, sizeof(buf));
	log_info("QoS limits%s%s set: %s", group ? " of group " : "", group ? group : "",
		 buf[0] ? buf : "none");
	add(reply, "ok", json_object_new_boolean(1), &ok);
	add(reply, "limits", json_object_new_string(buf), &ok);
	if (!ok) {
		snprintf(err, errlen, "limits set, but out of memory for the reply");
		return -ENOMEM;
	}
	return 0;
}

/* Built-in commands: their opaque is the device. */
static const struct ctl_cmd builtin_cmds[] = {
	{ "stats", cmd_stats, NULL },
	{ "set-poll", cmd_set_poll, NULL },
	{ "resize", cmd_resize, NULL },
	{ "status", cmd_status, NULL },
	{ "resume", cmd_resume, NULL },
	{ "limits", cmd_limits, NULL },
	{ "set-limits", cmd_set_limits, NULL },
};

static const struct ctl_cmd *find_cmd(const struct ctl_cmd *cmds, unsigned n, const char *name,
				      size_t len)
{
	for (unsigned i = 0; i < n; i++)
		if (strlen(cmds[i].name) == len && !memcmp(cmds[i].name, name, len))
			return &cmds[i];
	return NULL;
}

/* "unknown cmd 'x': use stats, set-poll, resize, ..." */
static void unknown_cmd(const struct ctl_cmd *extra, unsigned nextra, const char *name,
			char *err, size_t errlen)
{
	size_t n = (size_t)snprintf(err, errlen, "unknown cmd '%.64s': use", name);

	for (unsigned i = 0; i < ARRAY_SIZE(builtin_cmds) + nextra && n < errlen; i++) {
		const struct ctl_cmd *c = i < ARRAY_SIZE(builtin_cmds) ? &builtin_cmds[i] :
					  &extra[i - ARRAY_SIZE(builtin_cmds)];

		n += (size_t)snprintf(err + n, errlen - n, "%s %s", i ? "," : "", c->name);
	}
}

/* Run req: 0 and reply filled, or -errno with one line in err. */
static int run(struct blk_dev *d, const struct ctl_cmd *extra, unsigned nextra,
	       const char *req, struct json_object *reply, char *err, size_t errlen)
{
	struct json_tokener *tok = json_tokener_new_ex(CTL_MAX_DEPTH);
	size_t len = strlen(req), end;
	const struct ctl_cmd *c;
	struct json_object *o = NULL, *cmd;
	enum json_tokener_error e;
	const char *name;
	int r = -EINVAL;

	if (!tok) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
	o = json_tokener_parse_ex(tok, req, (int)MIN(len, (size_t)INT32_MAX));
	e = json_tokener_get_error(tok);
	end = json_tokener_get_parse_end(tok);
	if (e == json_tokener_continue) {
		snprintf(err, errlen, "request is not a whole JSON object");
		goto out;
	}
	if (e != json_tokener_success) {
		snprintf(err, errlen, "request is not JSON: %s at byte %zu",
			 json_tokener_error_desc(e), end);
		goto out;
	}
	/* One object, then nothing but white space (the line's end). */
	if (strspn(req + end, " \t\r\n") != len - end) {
		snprintf(err, errlen, "request has more after its JSON object (byte %zu)", end);
		goto out;
	}
	if (!json_object_is_type(o, json_type_object)) {
		snprintf(err, errlen, "request must be a JSON object, not %s",
			 json_type_to_name(json_object_get_type(o)));
		goto out;
	}
	if (!json_object_object_get_ex(o, "cmd", &cmd) ||
	    !json_object_is_type(cmd, json_type_string)) {
		snprintf(err, errlen, "request needs a \"cmd\" string");
		goto out;
	}
	/* The length, not strlen: "stats\u0000x" is not "stats". */
	name = json_object_get_string(cmd);
	len = (size_t)json_object_get_string_len(cmd);
	c = find_cmd(builtin_cmds, ARRAY_SIZE(builtin_cmds), name, len);
	if (c) {
		r = c->fn(d, o, reply, err, errlen);
	} else if ((c = find_cmd(extra, nextra, name, len))) {
		r = c->fn(c->opaque, o, reply, err, errlen);
	} else {
		unknown_cmd(extra, nextra, name, err, errlen);
		r = -EINVAL;
	}
out:
	json_object_put(o);
	json_tokener_free(tok);
	return r;
}

/* The reply to req, serialized (malloc'd, the caller frees), or NULL when
 * out of memory. */
static char *handle(struct blk_dev *d, const struct ctl_cmd *extra, unsigned nextra,
		    const char *req)
{
	struct json_object *reply = json_object_new_object();
	char err[512] = "";
	const char *text;
	char *s = NULL;
	int r;

	if (!reply)
		return NULL;
	r = run(d, extra, nextra, req, reply, err, sizeof(err));
	if (r < 0) {
		/* Whatever the handler added goes: an error reply is only that. */
		json_object_put(reply);
		reply = json_object_new_object();
		if (!reply)
			return NULL;
		if (!err[0])
			snprintf(err, sizeof(err), "%s", strerror(-r));
		if (json_object_object_add(reply, "error", json_object_new_string(err)) < 0)
			goto out;
	}
	text = json_object_to_json_string_ext(reply, CTL_JSON_FLAGS);
	if (text)
		s = strdup(text);
out:
	json_object_put(reply);
	return s;
}

/* Copy s into out, NUL-terminated within outlen; returns what was written. */
static int copy_out(const char *s, char *out, size_t outlen)
{
	size_t n;

	if (!outlen)
		return 0;
	n = MIN(strlen(s), outlen - 1);
	memcpy(out, s, n);
	out[n] = '\0';
	return (int)n;
}

int ctl_handle(struct blk_dev *d, const char *req, char *out, size_t outlen)
{
	static const char too_large[] = "{ \"error\": \"reply too large\" }";
	static const char no_memory[] = "{ \"error\": \"out of memory\" }";
	char *s = handle(d, NULL, 0, req);
	int n;

	if (!s)
		return copy_out(no_memory, out, outlen);
	n = strlen(s) < outlen ? copy_out(s, out, outlen) : copy_out(too_large, out, outlen);
	free(s);
	return n;
}

/* ---- The socket ---- */

/* Send all of buf within CTL_CLIENT_MS (a client that stops reading a
 * large reply does not hold the main thread longer). */
static void send_all(int fd, const char *buf, size_t len)
{
	uint64_t deadline = sys_now_ns() + CTL_CLIENT_MS * 1000000ull;

	while (len) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		uint64_t now = sys_now_ns();
		ssize_t r;

		if (now >= deadline || poll(&p, 1, (int)((deadline - now) / 1000000) + 1) <= 0)
			return;
		r = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (r <= 0)
			return;
		buf += r;
		len -= (size_t)r;
	}
}

/* Who may use the control socket: root and the daemon's own user.  The
 * socket file's group is typically the vhost-user socket's (QEMU's user is
 * in it); its commands (upgrade: exec a program as us; resize) are not
 * for that user.  Checked before anything is read, so nobody else can
 * hold the main thread either. */
static bool ctl_peer_allowed(int fd, uid_t *uid)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return false;
	*uid = cr.uid;
	return cr.uid == 0 || cr.uid == geteuid();
}

static void ctl_accept_cb(void *opaque, uint32_t events)
{
	struct ctl_server *s = opaque;
	char req[CTL_MAX_REQ + 1], *reply;
	uint64_t deadline;
	size_t got = 0;
	uid_t uid = (uid_t)-1;
	int fd;

	fd = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return;
	if (!ctl_peer_allowed(fd, &uid)) {
		char msg[160];
		int n = snprintf(msg, sizeof(msg), "{ \"error\": \"permission denied: the "
				 "control socket serves root and uid %u only, not uid %d\" }\n",
				 (unsigned)geteuid(), (int)uid);

		if (!s->logged_denied)
			log_warn("control socket: refused a client of uid %d (root and uid %u "
				 "only; further refusals not logged)", (int)uid,
				 (unsigned)geteuid());
		s->logged_denied = true;
		(void)send(fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
		close(fd);
		return;
	}
	/* A control client gets one second to send its line, in all: the
	 * main thread must not wait on it for longer. */
	deadline = sys_now_ns() + CTL_CLIENT_MS * 1000000ull;
	while (got < sizeof(req) - 1 && !memchr(req, '\n', got)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		uint64_t now = sys_now_ns();
		ssize_t r;

		if (now >= deadline ||
		    poll(&p, 1, (int)((deadline - now) / 1000000) + 1) <= 0)
			break;
		r = recv(fd, req + got, sizeof(req) - 1 - got, MSG_DONTWAIT);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	req[got] = '\0';
	if (got == sizeof(req) - 1 && !memchr(req, '\n', got)) {
		char msg[64];

		snprintf(msg, sizeof(msg), "{ \"error\": \"request longer than %d bytes\" }",
			 CTL_MAX_REQ);
		reply = strdup(msg);
	} else {
		reply = handle(s->dev, s->cmds, s->ncmds, req);
	}
	if (reply) {
		size_t n = strlen(reply);

		reply[n] = '\n';	/* over the NUL: the line's end */
		send_all(fd, reply, n + 1);
		free(reply);
	}
	/* Closing with unread bytes would reset the connection, and the
	 * client would lose the reply: read (a bounded amount of) what is
	 * left first. */
	for (int i = 0; i < 64 && recv(fd, req, sizeof(req), MSG_DONTWAIT) > 0; i++)
		;
	close(fd);
}

/* The server around fd, a listening socket at path (owned on success). */
static int server_start(const char *path, int fd, struct loop *l, struct blk_dev *d,
			struct ctl_server **out, char *err, size_t errlen)
{
	struct ctl_server *s = calloc(1, sizeof(*s));
	int r;

	if (!s || !(s->path = strdup(path))) {
		free(s);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->fd = fd;
	s->loop = l;
	s->dev = d;
	r = loop_fd_add(l, s->fd, EPOLLIN, ctl_accept_cb, s, &s->h);
	if (r < 0) {
		snprintf(err, errlen, "cannot watch '%s': %s", path, strerror(-r));
		free(s->path);
		free(s);
		return r;
	}
	*out = s;
	return 0;
}

int ctl_server_new(const char *path, struct loop *l, struct blk_dev *d,
		   struct ctl_server **out, char *err, size_t errlen)
{
	int fd = sock_listen_unix(path, err, errlen), r;

	if (fd < 0)
		return fd;
	r = server_start(path, fd, l, d, out, err, errlen);
	if (r < 0) {
		close(fd);
		unlink(path);
	}
	return r;
}

int ctl_server_new_fd(const char *path, int listen_fd, struct loop *l, struct blk_dev *d,
		      struct ctl_server **out, char *err, size_t errlen)
{
	int type = 0, listening = 0, fl;
	socklen_t tl = sizeof(type), ll = sizeof(listening);

	if (listen_fd < 0)
		return ctl_server_new(path, l, d, out, err, errlen);
	if (getsockopt(listen_fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0) {
		int r = -errno;

		snprintf(err, errlen, "control socket fd %d: %s", listen_fd, strerror(-r));
		return r;
	}
	if (type != SOCK_STREAM ||
	    getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) < 0 || !listening) {
		snprintf(err, errlen, "control socket fd %d is not a listening stream socket",
			 listen_fd);
		return -EINVAL;
	}
	fl = fcntl(listen_fd, F_GETFL);
	if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
	    fcntl(listen_fd, F_SETFD, FD_CLOEXEC) < 0) {
		int r = -errno;

		snprintf(err, errlen, "control socket fd %d: %s", listen_fd, strerror(-r));
		return r;
	}
	return server_start(path, listen_fd, l, d, out, err, errlen);
}

int ctl_server_listen_fd(const struct ctl_server *s)
{
	return s->fd;
}

int ctl_server_add_cmd(struct ctl_server *s, const char *name, ctl_cmd_fn fn, void *opaque)
{
	struct ctl_cmd *c;

	if (!*name)
		return -EINVAL;
	if (find_cmd(builtin_cmds, ARRAY_SIZE(builtin_cmds), name, strlen(name)) ||
	    find_cmd(s->cmds, s->ncmds, name, strlen(name)))
		return -EEXIST;
	c = realloc(s->cmds, (s->ncmds + 1) * sizeof(*c));
	if (!c)
		return -ENOMEM;
	s->cmds = c;
	c = &s->cmds[s->ncmds];
	c->name = strdup(name);
	if (!c->name)
		return -ENOMEM;
	c->fn = fn;
	c->opaque = opaque;
	s->ncmds++;
	return 0;
}

/* {"cmd": "upgrade", "exec": PATH}: the pid and message fn gives. */
static int cmd_upgrade(void *opaque, struct json_object *req, struct json_object *reply,
		       char *err, size_t errlen)
{
	struct ctl_server *s = opaque;
	struct json_object *e = NULL;
	bool ok = true;
	int pid;

	if (json_object_object_get_ex(req, "exec", &e) &&
	    (!json_object_is_type(e, json_type_string) || !json_object_get_string_len(e) ||
	     strlen(json_object_get_string(e)) != (size_t)json_object_get_string_len(e))) {
		snprintf(err, errlen, "\"exec\" must be a path string");
		return -EINVAL;
	}
	pid = s->upgrade(s->upgrade_opaque, e ? json_object_get_string(e) : NULL, err, errlen);
	if (pid < 0)
		return pid;
	add(reply, "ok", json_object_new_boolean(1), &ok);
	add(reply, "pid", json_object_new_int(pid), &ok);
	add(reply, "message", json_object_new_string(err), &ok);
	if (!ok) {
		/* Too late to take it back: the reply is all that failed. */
		snprintf(err, errlen, "upgraded to pid %d, but out of memory for the reply", pid);
		return -ENOMEM;
	}
	return 0;
}

void ctl_server_set_upgrade(struct ctl_server *s, ctl_upgrade_fn fn, void *opaque)
{
	s->upgrade = fn;
	s->upgrade_opaque = opaque;
	if (!find_cmd(s->cmds, s->ncmds, "upgrade", 7) &&
	    ctl_server_add_cmd(s, "upgrade", cmd_upgrade, s) < 0)
		log_err("control socket: cannot add the upgrade command: out of memory");
}

static void server_free(struct ctl_server *s, bool unlink_path)
{
	if (!s)
		return;
	loop_fd_del(s->loop, s->h);
	close(s->fd);
	if (unlink_path)
		unlink(s->path);
	for (unsigned i = 0; i < s->ncmds; i++)
		free(s->cmds[i].name);
	free(s->cmds);
	free(s->path);
	free(s);
}

void ctl_server_free(struct ctl_server *s)
{
	server_free(s, true);
}

void ctl_server_free_keep_path(struct ctl_server *s)
{
	server_free(s, false);
}
