/*
 * vblkctl bitmap: the disk's dirty bitmaps on the control socket (disk.h,
 * dirty.c; added by vblkd with ctl_server_add_cmd, opaque the disk).
 * Main thread.
 *
 *   {"cmd": "bitmap-add", "name": N, "granularity": BYTES, "disabled": B,
 *    "persistent": B}
 *   {"cmd": "bitmap-remove"|"bitmap-clear"|"bitmap-enable"|
 *    "bitmap-disable", "name": N}
 *   {"cmd": "bitmap-merge", "sources": [N, ...], "target": N}
 *   {"cmd": "bitmap-list"} -> {"bitmaps": [{"name", "granularity",
 *       "dirty_bytes", "size", "enabled", "persistent", "in_use",
 *       "inconsistent": false}, ...; the image's bitmaps kept but not
 *       used: {"name", "granularity", "enabled", "persistent": true,
 *       "inconsistent": true, "reason"}]}
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "disk/disk.h"
#include "disk/disk_ctl.h"
#include "format/format.h"
#include "util/jfield.h"

int disk_ctl_bitmap_list(void *opaque, struct json_object *req, struct json_object *reply,
			 char *err, size_t errlen)
{
	struct disk_bitmap_info info[64];
	struct json_object *arr = json_object_new_array();
	unsigned n = disk_bitmap_list(opaque, info, 64);

	if (!arr) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < n && i < 64; i++) {
		struct json_object *o = json_object_new_object();

		json_object_object_add(o, "name", json_object_new_string(info[i].name));
		json_object_object_add(o, "granularity", json_object_new_uint64(info[i].granularity));
		json_object_object_add(o, "dirty_bytes", json_object_new_uint64(info[i].dirty));
		json_object_object_add(o, "size", json_object_new_uint64(info[i].size));
		json_object_object_add(o, "enabled", json_object_new_boolean(info[i].enabled));
		json_object_object_add(o, "persistent", json_object_new_boolean(info[i].persistent));
		json_object_object_add(o, "in_use", json_object_new_boolean(info[i].users > 0));
		json_object_object_add(o, "inconsistent", json_object_new_boolean(0));
		json_object_array_add(arr, o);
	}
	/* The image's bitmaps kept but not used (format.h), as QEMU lists
	 * its inconsistent ones. */
	{
		struct fmt_bitmap_kept k[16];
		unsigned nk = fmt_bitmaps_kept(((struct disk *)opaque)->b, k, 16);

		for (unsigned i = 0; i < nk && i < 16; i++) {
			struct json_object *o = json_object_new_object();

			json_object_object_add(o, "name", json_object_new_string(k[i].name));
			json_object_object_add(o, "granularity",
					       json_object_new_uint64(k[i].granularity));
			json_object_object_add(o, "enabled", json_object_new_boolean(k[i].enabled));
			json_object_object_add(o, "persistent", json_object_new_boolean(1));
			json_object_object_add(o, "inconsistent", json_object_new_boolean(1));
			json_object_object_add(o, "reason", json_object_new_string(k[i].why));
			json_object_array_add(arr, o);
		}
	}
	json_object_object_add(reply, "bitmaps", arr);
	return 0;
}

int disk_ctl_bitmap(void *opaque, struct json_object *req, struct json_object *reply,
		    char *err, size_t errlen)
{
	struct disk *d = opaque;
	const char *cmd = jfield_str(req, "cmd"), *name;
	struct json_object *v;
	int r;

	if (!strcmp(cmd, "bitmap-merge")) {
		const char *srcs[64];
		size_t n;

		name = jfield_str(req, "target");
		if (!name || !json_object_object_get_ex(req, "sources", &v) ||
		    !json_object_is_type(v, json_type_array) ||
		    (n = json_object_array_length(v)) == 0 || n > 64) {
			snprintf(err, errlen, "bitmap-merge needs \"sources\": 1 to 64 names, and "
				 "\"target\": a name");
			return -EINVAL;
		}
		for (size_t i = 0; i < n; i++) {
			struct json_object *e = json_object_array_get_idx(v, i);

			if (!json_object_is_type(e, json_type_string)) {
				snprintf(err, errlen, "bitmap-merge: \"sources\" are names");
				return -EINVAL;
			}
			srcs[i] = json_object_get_string(e);
		}
		r = disk_bitmap_merge(d, srcs, (unsigned)n, name, err, errlen);
	} else {
		name = jfield_str(req, "name");
		if (!name) {
			snprintf(err, errlen, "%s needs \"name\": the bitmap's name", cmd);
			return -EINVAL;
		}
		if (!strcmp(cmd, "bitmap-add")) {
			uint64_t gran = 0;
			bool disabled = false, persistent = false;

			if (json_object_object_get_ex(req, "granularity", &v)) {
				if (!json_object_is_type(v, json_type_int) ||
				    json_object_get_int64(v) <= 0 ||
				    json_object_get_int64(v) > DBM_MAX_GRANULARITY) {
					snprintf(err, errlen, "bitmap-add: \"granularity\" is bytes, "
						 "a power of two from 4K to 2G");
					return -EINVAL;
				}
				gran = (uint64_t)json_object_get_int64(v);
			}
			if (jfield_bool(req, "disabled", &disabled) < 0) {
				snprintf(err, errlen, "bitmap-add: \"disabled\" is true or false");
				return -EINVAL;
			}
			if (jfield_bool(req, "persistent", &persistent) < 0) {
				snprintf(err, errlen, "bitmap-add: \"persistent\" is true or false");
				return -EINVAL;
			}
			r = disk_bitmap_add(d, name, (uint32_t)gran, disabled, persistent, err,
					    errlen);
		} else if (!strcmp(cmd, "bitmap-remove")) {
			r = disk_bitmap_remove(d, name, err, errlen);
		} else if (!strcmp(cmd, "bitmap-clear")) {
			r = disk_bitmap_clear(d, name, err, errlen);
		} else if (!strcmp(cmd, "bitmap-enable") || !strcmp(cmd, "bitmap-disable")) {
			r = disk_bitmap_enable(d, name, !strcmp(cmd, "bitmap-enable"), err, errlen);
		} else {
			snprintf(err, errlen, "unknown bitmap command '%s'", cmd);
			return -EINVAL;
		}
	}
	if (r < 0)
		return r;
	json_object_object_add(reply, "ok", json_object_new_boolean(1));
	return 0;
}
