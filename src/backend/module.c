/*
 * Engine modules: rbd and nbd as shared objects, loaded when a disk needs
 * them (module.h).  Main thread: bdev_open, before iothreads run.
 */
#include "backend/module.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "util/log.h"

struct module {
	const char *engine;	/* its engine's name */
	const char *package;	/* the Debian package that installs it */
	const struct bdev_engine *loaded;
};

static struct module modules[] = {
#ifdef HAVE_RBD
	{ "rbd", "vblkd-rbd" },
#endif
#ifdef HAVE_NBD
	{ "nbd", "vblkd-nbd" },
#endif
	{ NULL },
};

static struct module *module_find(const char *name)
{
	for (struct module *m = modules; name && m->engine; m++)
		if (!strcmp(m->engine, name))
			return m;
	return NULL;
}

const char *bdev__module_name(unsigned i)
{
	return i < sizeof(modules) / sizeof(modules[0]) ? modules[i].engine : NULL;
}

bool bdev_engine_is_module(const char *name)
{
	return module_find(name) != NULL;
}

/* The directory of the running executable (malloc'd), or NULL.  Read
 * with readlink, not realpath: once the file was replaced under us (a
 * rebuild, a package upgrade) the link says "PATH (deleted)" and no
 * longer resolves, but its directory is still the one to look in. */
static char *exe_dir(void)
{
	char buf[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
	char *slash;

	if (n <= 0)
		return NULL;
	buf[n] = '\0';
	slash = strrchr(buf, '/');
	if (!slash)
		return NULL;
	*slash = '\0';
	return strdup(slash == buf ? "/" : buf);
}

/* Where m's file is: the first of the places bdev.h names that has it
 * (malloc'd), or NULL with *want set to where it should be (malloc'd). */
static char *module_path(const struct module *m, char **want)
{
	const char *env = secure_getenv("VBLKD_MODULE_DIR");
	char *dirs[2] = { NULL, NULL }, *path = NULL;

	*want = NULL;
	if (env && *env) {
		dirs[0] = strdup(env);
	} else {
		dirs[0] = exe_dir();
		dirs[1] = strdup(VBLKD_MODULE_DIR);
	}
	for (unsigned i = 0; i < 2 && !path; i++) {
		if (!dirs[i] || asprintf(&path, "%s/vblkd-%s.so", dirs[i], m->engine) < 0) {
			path = NULL;
			continue;
		}
		if (access(path, F_OK) == 0)
			break;
		free(*want);
		*want = path;	/* the last place looked in: the one to install to */
		path = NULL;
	}
	free(dirs[0]);
	free(dirs[1]);
	if (path) {
		free(*want);
		*want = NULL;
	}
	return path;
}

int bdev_engine_load(const char *name, const char *disk, const struct bdev_engine **out,
		     char *err, size_t errlen)
{
	struct module *m = module_find(name);
	char *path, *want;
	bdev_module_fn fn;
	void *h;

	if (!m)
		return -ENOENT;
	if (m->loaded) {
		*out = m->loaded;
		return 0;
	}
	path = module_path(m, &want);
	if (!path) {
		snprintf(err, errlen, "--disk '%s' needs the %s engine module %s, which is not "
			 "installed: install the Debian package %s", disk, name,
			 want ? want : "vblkd-*.so", m->package);
		free(want);
		return -ENOENT;
	}
	/* RTLD_NOW: a library or symbol missing fails here, in one line, not
	 * at the first I/O. */
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(err, errlen, "--disk '%s' needs the %s engine module %s, which cannot "
			 "be loaded (%s): reinstall the Debian package %s", disk, name, path,
			 dlerror(), m->package);
		free(path);
		return -ELIBBAD;
	}
	fn = (bdev_module_fn)dlsym(h, BDEV_MODULE_ENTRY);
	m->loaded = fn ? fn(VBLKD_MODULE_STAMP) : NULL;
	if (!m->loaded || strcmp(m->loaded->name, name)) {
		snprintf(err, errlen, "--disk '%s' needs the %s engine module %s, which was "
			 "built for another vblkd than this one (%s): reinstall the Debian "
			 "package %s", disk, name, path, VBLKD_VERSION, m->package);
		m->loaded = NULL;
		dlclose(h);
		free(path);
		return -ELIBBAD;
	}
	log_debug("engine %s: module %s", name, path);
	free(path);
	/* Never closed: the engine's code runs until the process ends. */
	*out = m->loaded;
	return 0;
}
