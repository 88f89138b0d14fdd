/*
 * Fields of a control request (json-c), read the one way every command
 * reads them: present or absent, and of the right type.  Header only.
 */
#ifndef VBLK_JFIELD_H
#define VBLK_JFIELD_H

#include <errno.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>

/* Field key of req as an unsigned integer: 1 found, 0 absent, -EINVAL
 * present but not a non-negative JSON integer (a string, 1.5, null...). */
static inline int jfield_u64(struct json_object *req, const char *key, uint64_t *v)
{
	struct json_object *f;

	if (!json_object_object_get_ex(req, key, &f))
		return 0;
	if (!json_object_is_type(f, json_type_int) || json_object_get_int64(f) < 0)
		return -EINVAL;
	*v = json_object_get_uint64(f);
	return 1;
}

/* Field key of req as a boolean: 1 found, 0 absent, -EINVAL present but
 * not true or false. */
static inline int jfield_bool(struct json_object *req, const char *key, bool *v)
{
	struct json_object *f;

	if (!json_object_object_get_ex(req, key, &f))
		return 0;
	if (!json_object_is_type(f, json_type_boolean))
		return -EINVAL;
	*v = json_object_get_boolean(f);
	return 1;
}

/* Field key of req as a string; NULL if absent or not a string. */
static inline const char *jfield_str(struct json_object *req, const char *key)
{
	struct json_object *f;

	if (!json_object_object_get_ex(req, key, &f) || !json_object_is_type(f, json_type_string))
		return NULL;
	return json_object_get_string(f);
}

#endif
