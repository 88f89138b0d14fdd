/*
 * vblkctl stream and vblkctl job: the job framework's commands on the
 * control socket (job.h; added by vblkd with ctl_server_add_cmd).  Main
 * thread.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "job/job.h"
#include "util/jfield.h"


static struct json_object *info_json(const struct job_info *i)
{
	struct json_object *o = json_object_new_object();

	if (!o)
		return NULL;
	json_object_object_add(o, "id", json_object_new_string(i->id));
	json_object_object_add(o, "type", json_object_new_string(i->type));
	json_object_object_add(o, "state", json_object_new_string(job_state_name(i->state)));
	json_object_object_add(o, "done", json_object_new_uint64(i->done));
	json_object_object_add(o, "total", json_object_new_uint64(i->total));
	json_object_object_add(o, "rate", json_object_new_uint64(i->rate));
	json_object_object_add(o, "copied", json_object_new_uint64(i->copied));
	json_object_object_add(o, "errors", json_object_new_uint64(i->errors));
	json_object_object_add(o, "result", json_object_new_string(
		i->state != JOB_CONCLUDED ? "" : i->failed ? "failed" :
		i->cancelled ? "cancelled" : "ok"));
	json_object_object_add(o, "error", json_object_new_string(i->error));
	return o;
}

int job_ctl_stream(void *opaque, struct json_object *req, struct json_object *reply,
		   char *err, size_t errlen)
{
	struct job_ctl *c = opaque;
	uint64_t rate = 0;
	char id[32];
	int r;

	if (jfield_u64(req, "rate", &rate) < 0) {
		snprintf(err, errlen, "stream: \"rate\" must be bytes per second");
		return -EINVAL;
	}
	r = job_stream_start(c->disk, rate, c->on_error, id, sizeof(id), err, errlen);
	if (r < 0)
		return r;
	json_object_object_add(reply, "ok", json_object_new_boolean(1));
	json_object_object_add(reply, "rate", json_object_new_uint64(rate));
	json_object_object_add(reply, "job", json_object_new_string(id));
	return 0;
}

int job_ctl_list(void *opaque, struct json_object *req, struct json_object *reply,
		 char *err, size_t errlen)
{
	struct job_info info[32];
	struct json_object *arr = json_object_new_array();
	unsigned n = job_list(info, 32);

	if (!arr) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < n && i < 32; i++)
		json_object_array_add(arr, info_json(&info[i]));
	json_object_object_add(reply, "jobs", arr);
	return 0;
}

/* job-pause, job-resume, job-cancel, job-complete, job-set-rate,
 * job-dismiss: {"id": ID} (and "rate"). */
int job_ctl_verb(void *opaque, struct json_object *req, struct json_object *reply,
		 char *err, size_t errlen)
{
	struct json_object *v, *cmd;
	struct job_info info[32];
	const char *id, *name;
	uint64_t rate = 0;
	unsigned n;
	int r;

	json_object_object_get_ex(req, "cmd", &cmd);
	name = json_object_get_string(cmd);
	if (!json_object_object_get_ex(req, "id", &v) || !json_object_is_type(v, json_type_string)) {
		snprintf(err, errlen, "%s needs \"id\": the job's id (vblkctl job list shows them)",
			 name);
		return -EINVAL;
	}
	id = json_object_get_string(v);
	if (!strcmp(name, "job-pause")) {
		r = job_pause(id, err, errlen);
	} else if (!strcmp(name, "job-resume")) {
		r = job_resume(id, err, errlen);
	} else if (!strcmp(name, "job-cancel")) {
		r = job_cancel(id, err, errlen);
	} else if (!strcmp(name, "job-complete")) {
		r = job_complete(id, err, errlen);
	} else if (!strcmp(name, "job-dismiss")) {
		r = job_dismiss(id, err, errlen);
	} else if (!strcmp(name, "job-set-rate")) {
		if (jfield_u64(req, "rate", &rate) != 1) {
			snprintf(err, errlen, "job-set-rate needs \"rate\": bytes per second "
				 "(0: no limit)");
			return -EINVAL;
		}
		r = job_set_rate(id, rate, err, errlen);
	} else {
		snprintf(err, errlen, "unknown job command '%s'", name);
		return -EINVAL;
	}
	if (r < 0)
		return r;
	json_object_object_add(reply, "ok", json_object_new_boolean(1));
	n = job_list(info, 32);
	for (unsigned i = 0; i < n && i < 32; i++)
		if (!strcmp(info[i].id, id))
			json_object_object_add(reply, "job", info_json(&info[i]));
	return 0;
}
