/*
 * The object behind struct qos: a disk's own buckets, or a group's, which
 * every vblkd naming the group maps from one file (--qos-group NAME), so
 * a budget is shared across processes with no coordinator.
 *
 * A group's file lives in DIR/NAME (DIR: $RUNTIME_DIRECTORY/qos under
 * systemd, else /run/vblkd/qos).  Its life:
 *   - the first member makes it (O_EXCL), sets the limits, and publishes
 *     it (magic, release); later members wait for the magic and compare
 *     limits;
 *   - every member holds a shared flock on it while it is a member; the
 *     last to leave (an exclusive flock it can take) removes it, so a group
 *     whose members are all gone is gone, and a joiner that opened the
 *     file just before it was removed sees another inode at the path and
 *     tries again;
 *   - a member killed while holding the mutex: robust mutex (EOWNERDEAD,
 *     made consistent by the next locker); killed while in line: its
 *     ticket is skipped (qos.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "qos/qos.h"
#include "qos/qos_internal.h"
#include "util/log.h"
#include "util/sys.h"

void qos__lock(struct qos_shared *sh)
{
	int r = pthread_mutex_lock(&sh->mu);

	if (r == EOWNERDEAD) {
		/* A member died holding it: what it wrote is whole fields
		 * (doubles and counters); make the line sane and go on. */
		if (sh->served > sh->next_ticket)
			sh->served = sh->next_ticket;
		for (unsigned i = 0; i < QOS_NR_BKT; i++) {
			if (!(sh->b.level[i] >= 0))	/* NaN too */
				sh->b.level[i] = 0;
			if (!(sh->b.burst[i] >= 0))
				sh->b.burst[i] = 0;
		}
		pthread_mutex_consistent(&sh->mu);
	}
}

void qos__unlock(struct qos_shared *sh)
{
	pthread_mutex_unlock(&sh->mu);
}

int qos__shared_init(struct qos_shared *sh, const struct qos_limits *l, bool pshared)
{
	pthread_mutexattr_t a;
	int r;

	memset(sh, 0, sizeof(*sh));
	sh->version = QOS_VERSION;
	sh->size = sizeof(*sh);
	if (l)
		sh->lim = *l;
	atomic_store_explicit(&sh->active, l && qos_limits_any(l), memory_order_relaxed);
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	if (pshared)
		pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	r = pthread_mutex_init(&sh->mu, &a);
	pthread_mutexattr_destroy(&a);
	return -r;
}

int qos_new(const struct qos_limits *l, struct qos **out)
{
	struct qos *q = calloc(1, sizeof(*q));
	int r;

	if (!q)
		return -ENOMEM;
	q->fd = -1;
	r = qos__shared_init(&q->own, l, false);
	if (r < 0) {
		free(q);
		return r;
	}
	q->sh = &q->own;
	*out = q;
	return 0;
}

static bool name_ok(const char *n)
{
	size_t len = strlen(n);

	if (len == 0 || len > 64 || n[0] == '.')
		return false;
	for (const char *p = n; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
			return false;
	return true;
}

static int mkdir_p(const char *dir)
{
	char buf[512];
	size_t n = strlen(dir);

	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, dir, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0750) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

const char *qos_group_dir(void)
{
	static char buf[512];
	const char *rt = getenv("RUNTIME_DIRECTORY");

	if (rt && *rt) {
		/* systemd may list several, separated by ':'; the first. */
		size_t n = strcspn(rt, ":");

		snprintf(buf, sizeof(buf), "%.*s/qos", (int)n, rt);
		return buf;
	}
	return "/run/vblkd/qos";
}

static bool limits_equal(const struct qos_limits *a, const struct qos_limits *b)
{
	/* Plain integers, no padding: the same limits are the same bytes. */
	return !memcmp(a, b, sizeof(*a));
}

int qos_group_join(const char *name, const char *dir, const struct qos_limits *l,
		   struct qos **out, char *err, size_t errlen)
{
	struct qos *q;
	char path[600];
	int r, fd = -1;
	void *map = MAP_FAILED;

	if (!name_ok(name)) {
		snprintf(err, errlen, "--qos-group %s: a name of letters, digits, '-', '_' and '.' "
			 "(at most 64, not starting with '.')", name);
		return -EINVAL;
	}
	if (!dir)
		dir = qos_group_dir();
	r = mkdir_p(dir);
	if (r < 0) {
		snprintf(err, errlen, "--qos-group: cannot make %s: %s (run as root, or set "
			 "RUNTIME_DIRECTORY)", dir, strerror(-r));
		return r;
	}
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	for (int attempt = 0;; attempt++) {
		struct stat st, st2;
		bool made = false;
		struct qos_shared *sh;

		if (attempt == 10) {
			snprintf(err, errlen, "--qos-group %s: %s keeps changing under us", name, path);
			r = -EAGAIN;
			goto fail;
		}
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0660);
		if (fd >= 0) {
			made = true;
		} else if (errno == EEXIST) {
			fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
			if (fd < 0 && errno == ENOENT)
				continue;	/* removed by its last member */
		}
		if (fd < 0) {
			r = -errno;
			snprintf(err, errlen, "--qos-group %s: cannot open %s: %s", name, path,
				 strerror(errno));
			goto fail;
		}
		if (flock(fd, LOCK_SH) < 0) {
			r = -errno;
			snprintf(err, errlen, "--qos-group %s: flock %s: %s", name, path,
				 strerror(errno));
			goto fail;
		}
		/* Still the file at the path (not removed by a last member
		 * between our open and our lock)? */
		if (fstat(fd, &st) < 0 || lstat(path, &st2) < 0 || st.st_ino != st2.st_ino ||
		    st.st_dev != st2.st_dev) {
			close(fd);
			fd = -1;
			continue;
		}
		if (!S_ISREG(st.st_mode)) {
			snprintf(err, errlen, "--qos-group %s: %s is not a regular file", name, path);
			r = -EINVAL;
			goto fail;
		}
		if (made && ftruncate(fd, sizeof(struct qos_shared)) < 0) {
			r = -errno;
			snprintf(err, errlen, "--qos-group %s: %s: %s", name, path, strerror(errno));
			unlink(path);
			goto fail;
		}
		if (!made) {
			/* Made by another member: give it a second to publish. */
			for (int i = 0; i < 1000 && fstat(fd, &st) == 0 &&
					(size_t)st.st_size < sizeof(struct qos_shared); i++)
				usleep(1000);
			if ((size_t)st.st_size != sizeof(struct qos_shared)) {
				snprintf(err, errlen, "--qos-group %s: %s is not a group file of this "
					 "vblkd (size %lld); remove it if no vblkd uses it", name,
					 path, (long long)st.st_size);
				r = -EINVAL;
				goto fail;
			}
		}
		map = mmap(NULL, sizeof(struct qos_shared), PROT_READ | PROT_WRITE, MAP_SHARED,
			   fd, 0);
		if (map == MAP_FAILED) {
			r = -errno;
			snprintf(err, errlen, "--qos-group %s: mmap %s: %s", name, path,
				 strerror(errno));
			goto fail;
		}
		sh = map;
		if (made) {
			r = qos__shared_init(sh, l, true);
			if (r < 0) {
				snprintf(err, errlen, "--qos-group %s: %s", name, strerror(-r));
				unlink(path);
				goto fail;
			}
			/* Pairs with the acquire below: a joiner that sees the
			 * magic sees the mutex and limits made. */
			atomic_store_explicit(&sh->magic, QOS_MAGIC, memory_order_release);
		} else {
			int i;

			for (i = 0; i < 1000 && atomic_load_explicit(&sh->magic, memory_order_acquire) !=
							QOS_MAGIC; i++)
				usleep(1000);
			if (i == 1000 || sh->version != QOS_VERSION ||
			    sh->size != sizeof(struct qos_shared)) {
				snprintf(err, errlen, "--qos-group %s: %s was not made by this vblkd "
					 "version (or its maker died making it); remove it if no "
					 "vblkd uses it", name, path);
				r = -EINVAL;
				goto fail;
			}
			if (l && qos_limits_any(l)) {
				struct qos_limits have;
				char a[1024], b[1024];

				qos_shared_get(sh, &have, NULL, sys_now_ns());
				if (!limits_equal(&have, l)) {
					qos_limits_format(&have, a, sizeof(a));
					qos_limits_format(l, b, sizeof(b));
					snprintf(err, errlen, "--qos-group %s has the limits '%s', not "
						 "'%s': give the same --limit or none (to take the "
						 "group's), or change the group's with vblkctl "
						 "set-limits --group", name, a[0] ? a : "none", b);
					r = -EINVAL;
					goto fail;
				}
			}
		}
		q->sh = sh;
		break;
	}
	q->fd = fd;
	q->path = strdup(path);
	q->name = strdup(name);
	if (!q->path || !q->name) {
		qos_free(q);
		return -ENOMEM;
	}
	*out = q;
	return 0;
fail:
	if (map != MAP_FAILED)
		munmap(map, sizeof(struct qos_shared));
	if (fd >= 0)
		close(fd);
	free(q);
	return r;
}

void qos_free(struct qos *q)
{
	if (!q)
		return;
	if (q->fd >= 0) {
		/* The last member out removes the group. */
		if (q->path && flock(q->fd, LOCK_EX | LOCK_NB) == 0)
			unlink(q->path);
		munmap(q->sh, sizeof(struct qos_shared));
		close(q->fd);
	} else {
		pthread_mutex_destroy(&q->own.mu);
	}
	free(q->path);
	free(q->name);
	free(q);
}

const char *qos_group_name(const struct qos *q)
{
	return q->name;
}

bool qos_active(const struct qos *q)
{
	return atomic_load_explicit(&q->sh->active, memory_order_relaxed);
}

const _Atomic uint32_t *qos_active_flag(const struct qos *q)
{
	return &q->sh->active;
}

uint64_t qos_admit_turn(struct qos *q, bool is_write, uint64_t bytes, uint64_t now,
			struct qos_turn *t, uint64_t slice_ns)
{
	return qos_shared_admit(q->sh, is_write, bytes, now, &t->ticket, slice_ns, &t->credit,
				&t->head);
}

void qos_cancel(struct qos *q, uint64_t ticket)
{
	qos_shared_cancel(q->sh, ticket, sys_now_ns());
}

void qos_get(struct qos *q, struct qos_limits *l, struct qos_buckets *b, uint64_t now)
{
	qos_shared_get(q->sh, l, b, now);
}

void qos_set(struct qos *q, const struct qos_limits *l)
{
	qos_shared_set(q->sh, l);
	q->changed = true;
}

bool qos_changed(const struct qos *q)
{
	return q->changed;
}

uint64_t qos_io_ns(const struct qos *q, bool is_write, uint64_t bytes)
{
	return qos__one_io_ns(&q->sh->lim, is_write, bytes);
}
