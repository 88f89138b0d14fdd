/*
 * vblkctl backup on the control socket (bkp.h, bkp_ctl; opaque the
 * disk's struct bkp_set).  Main thread.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "backup/bkp.h"
#include "util/jfield.h"

static int list(struct bkp_set *s, struct json_object *reply, char *err, size_t errlen)
{
	struct bkp_info info[8];
	unsigned n = bkp_list(s, info, 8);
	struct json_object *arr = json_object_new_array();

	if (!arr) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < n && i < 8; i++) {
		struct json_object *o = json_object_new_object();

		json_object_object_add(o, "name", json_object_new_string(info[i].name));
		json_object_object_add(o, "job", json_object_new_string(info[i].job));
		json_object_object_add(o, "nbd", json_object_new_string(info[i].addr));
		json_object_object_add(o, "bitmap", json_object_new_string(info[i].bitmap));
		json_object_object_add(o, "size", json_object_new_uint64(info[i].size));
		json_object_object_add(o, "read_bytes", json_object_new_uint64(info[i].read_bytes));
		json_object_object_add(o, "saved_chunks",
				       json_object_new_uint64(info[i].saved_chunks));
		json_object_object_add(o, "zero_chunks", json_object_new_uint64(info[i].zero_chunks));
		json_object_object_add(o, "scratch_bytes",
				       json_object_new_uint64(info[i].scratch_bytes));
		json_object_object_add(o, "write_waits", json_object_new_uint64(info[i].waits));
		json_object_object_add(o, "rate", json_object_new_uint64(info[i].rate));
		json_object_object_add(o, "paced_reads", json_object_new_uint64(info[i].paced));
		json_object_object_add(o, "yield", json_object_new_boolean(info[i].yield));
		json_object_object_add(o, "failed", json_object_new_boolean(info[i].failed));
		json_object_object_add(o, "error", json_object_new_string(info[i].error));
		json_object_array_add(arr, o);
	}
	json_object_object_add(reply, "backups", arr);
	return 0;
}

int bkp_ctl(void *opaque, struct json_object *req, struct json_object *reply, char *err,
	    size_t errlen)
{
	struct bkp_set *s = opaque;
	const char *cmd = jfield_str(req, "cmd"), *name = jfield_str(req, "name");
	char id[32];
	int r;

	if (!strcmp(cmd, "backup-list"))
		return list(s, reply, err, errlen);
	if (!name) {
		snprintf(err, errlen, "%s needs \"name\"", cmd);
		return -EINVAL;
	}
	if (!strcmp(cmd, "backup-start")) {
		struct bkp_start_opts o = { .name = name, .nbd = jfield_str(req, "nbd"),
					    .bitmap = jfield_str(req, "bitmap"),
					    .scratch = jfield_str(req, "scratch") };

		bool yield = true;

		if (jfield_u64(req, "rate", &o.rate) < 0) {
			snprintf(err, errlen, "\"rate\" takes a whole number of bytes per second");
			return -EINVAL;
		}
		if (jfield_bool(req, "yield", &yield) < 0) {
			snprintf(err, errlen, "\"yield\" is true or false");
			return -EINVAL;
		}
		o.no_yield = !yield;
		r = bkp_start(s, &o, id, sizeof(id), err, errlen);
		if (r == 0)
			json_object_object_add(reply, "job", json_object_new_string(id));
	} else {
		r = bkp_finish(s, name, !strcmp(cmd, "backup-abort"), err, errlen);
	}
	if (r == 0)
		json_object_object_add(reply, "ok", json_object_new_boolean(1));
	return r;
}
