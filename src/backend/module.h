/*
 * Engine modules (module.c): the rbd engine (librbd) and the nbd engine
 * (libnbd) are shared objects, vblkd-rbd.so and vblkd-nbd.so, loaded when
 * a disk needs them, as QEMU's block modules are: a process serving any
 * other disk maps none of their libraries (Ceph's are many, and touch
 * about 1 MB of the main thread's stack before main).
 *
 * Looked for beside the running executable (a build tree), then in
 * VBLKD_MODULE_DIR (config.h: PREFIX/LIBDIR/vblkd); $VBLKD_MODULE_DIR in
 * the environment, if set, is the only place looked in.  A module exports
 * one function, bdev_module_engine (BDEV_MODULE_DEFINE), and calls the
 * core's functions in the executable (linked with --export-dynamic).  It
 * is loaded once and never unloaded.
 *
 * Main thread (bdev_open).
 */
#ifndef VBLK_BDEV_MODULE_H
#define VBLK_BDEV_MODULE_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "backend/bdev.h"

/* Is name the engine of a module this vblkd was built with? */
bool bdev_engine_is_module(const char *name);

/* The engine of the module for name, loaded on first use, for the disk
 * at path (for the message).  0 and *out, or -errno with one line for the
 * user in err: the module is not installed (-ENOENT), cannot be loaded or
 * was built for another vblkd (-ELIBBAD). */
int bdev_engine_load(const char *name, const char *path, const struct bdev_engine **out,
		     char *err, size_t errlen);

/* The name of module engine i, or NULL past the last (bdev_engine_names). */
const char *bdev__module_name(unsigned i);

/* A module's one symbol: its engine, if stamp is the one it was built
 * with (VBLKD_MODULE_STAMP in config.h: this vblkd's version and the core
 * headers it was compiled against), else NULL.  A module defines it with
 * BDEV_MODULE_DEFINE(its engine) after including config.h; everything
 * else in it is hidden (-fvisibility=hidden). */
#define BDEV_MODULE_ENTRY "bdev_module_engine"
typedef const struct bdev_engine *(*bdev_module_fn)(const char *stamp);
#define BDEV_MODULE_DEFINE(engine)							\
	__attribute__((visibility("default")))						\
	const struct bdev_engine *bdev_module_engine(const char *stamp);		\
	const struct bdev_engine *bdev_module_engine(const char *stamp)		\
	{										\
		return strcmp(stamp, VBLKD_MODULE_STAMP) ? NULL : &(engine);		\
	}

#endif
