/*
 * vblkctl nbd add|remove|list: the NBD server's commands on the control
 * socket (ctl.h, added by vblkd with ctl_server_add_cmd).  Main thread.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "nbd/nbds.h"

/* {"cmd": "nbd-add", "spec": "ADDR[,name=...]"} */
int nbds_ctl_add(void *opaque, struct json_object *req, struct json_object *reply, char *err,
		 size_t errlen)
{
	struct nbds_export_opts o;
	struct json_object *v;
	char msg[512];
	int r;

	if (!json_object_object_get_ex(req, "spec", &v) || !json_object_is_type(v, json_type_string)) {
		snprintf(err, errlen, "nbd-add needs \"spec\": ADDR[,name=NAME][,read-only]"
			 "[,max-conn=N][,tls=x509:DIR|psk:FILE]");
		return -EINVAL;
	}
	r = nbds_export_parse(json_object_get_string(v), &o, msg, sizeof(msg));
	if (r == 0) {
		r = nbds_add(opaque, &o, msg, sizeof(msg));
		nbds_export_opts_free(&o);
	}
	if (r < 0) {
		snprintf(err, errlen, "%s", msg);
		return r;
	}
	return 0;
}

/* {"cmd": "nbd-remove", "name": NAME}; an export with an owner (a
 * backup's view) is refused: its owner removes it. */
int nbds_ctl_remove(void *opaque, struct json_object *req, struct json_object *reply, char *err,
		    size_t errlen)
{
	struct json_object *v;
	const char *owner;

	if (!json_object_object_get_ex(req, "name", &v) || !json_object_is_type(v, json_type_string)) {
		snprintf(err, errlen, "nbd-remove needs \"name\": the export's name (\"\" for the "
			 "default one)");
		return -EINVAL;
	}
	owner = nbds_export_owner(opaque, json_object_get_string(v));
	if (owner) {
		snprintf(err, errlen, "NBD export '%s' is %s", json_object_get_string(v), owner);
		return -EBUSY;
	}
	if (nbds_remove(opaque, json_object_get_string(v)) < 0) {
		snprintf(err, errlen, "no NBD export named '%s' (vblkctl nbd list shows them)",
			 json_object_get_string(v));
		return -ENOENT;
	}
	return 0;
}

/* {"cmd": "nbd-list"} -> {"exports": [...], "stats": {...}} */
int nbds_ctl_list(void *opaque, struct json_object *req, struct json_object *reply, char *err,
		  size_t errlen)
{
	struct nbds_export_info info[64];
	struct json_object *arr = json_object_new_array(), *st = json_object_new_object();
	struct nbds_stats s;
	unsigned n = nbds_list(opaque, info, 64);

	if (!arr || !st) {
		json_object_put(arr);
		json_object_put(st);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < n && i < 64; i++) {
		struct json_object *e = json_object_new_object();

		json_object_object_add(e, "name", json_object_new_string(info[i].name));
		json_object_object_add(e, "addr", json_object_new_string(info[i].addr));
		json_object_object_add(e, "read_only", json_object_new_boolean(info[i].read_only));
		json_object_object_add(e, "incoming", json_object_new_boolean(info[i].incoming));
		json_object_object_add(e, "tls", json_object_new_boolean(info[i].tls));
		json_object_object_add(e, "max_conn", json_object_new_uint64(info[i].max_conn));
		json_object_object_add(e, "clients", json_object_new_uint64(info[i].clients));
		json_object_object_add(e, "accepted", json_object_new_uint64(info[i].accepted));
		json_object_object_add(e, "refused", json_object_new_uint64(info[i].refused));
		json_object_array_add(arr, e);
	}
	nbds_stats(opaque, &s);
#define ADD(f) json_object_object_add(st, #f, json_object_new_uint64(s.f))
	ADD(connections);
	ADD(clients);
	ADD(refused);
	ADD(handshake_failed);
	ADD(requests);
	ADD(bad_requests);
	ADD(read_bytes);
	ADD(write_bytes);
	ADD(throttled);
	ADD(coalesced_waits);
	ADD(coalesced_requests);
	ADD(yielded);
#undef ADD
	json_object_object_add(reply, "exports", arr);
	json_object_object_add(reply, "stats", st);
	return 0;
}
