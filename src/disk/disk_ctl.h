/*
 * The disk's commands on the control socket (ctl.h's ctl_cmd_fn; opaque
 * the struct disk): vblkctl bitmap (ctl.c says what each takes).  Main
 * thread.
 */
#ifndef VBLK_DISK_CTL_H
#define VBLK_DISK_CTL_H

#include <stddef.h>

struct json_object;

/* bitmap-add, bitmap-remove, bitmap-clear, bitmap-enable, bitmap-disable,
 * bitmap-merge */
int disk_ctl_bitmap(void *opaque, struct json_object *req, struct json_object *reply,
		    char *err, size_t errlen);
int disk_ctl_bitmap_list(void *opaque, struct json_object *req, struct json_object *reply,
			 char *err, size_t errlen);

#endif
