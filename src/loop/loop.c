#include "loop/loop.h"

#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loop/defer.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sys.h"

#define LOOP_MAX_EVENTS 64

struct loop_fd {
	int fd;
	bool deleted;		/* set by loop_fd_del; freed after dispatch */
	loop_fd_cb cb;
	void *opaque;
	struct loop_fd *next_free;
};

struct loop_bh {
	struct loop *loop;
	loop_cb cb;
	void *opaque;
	bool scheduled;
	struct loop_bh *next;	/* on loop->bh_list while scheduled */
};

/* A pending loop_call_sync() request, owned by the calling thread's stack. */
struct loop_call {
	loop_cb fn;
	void *arg;
	bool done;
	struct loop_call *next;
};

struct loop {
	char name[16];
	int epfd;
	int wake_fd;			/* eventfd: stop and cross-thread calls */
	struct loop_fd *wake_h;
	atomic_bool stop;
	pthread_t thread;		/* set by the loop thread itself in loop_run */
	pthread_t joiner_tid;		/* loop_thread_start's handle, for join only */
	atomic_bool running;
	bool has_thread;		/* started by loop_thread_start */
	bool accepting;			/* calls are queued, under call_lock */

	/* Loop thread only. */
	struct loop_bh *bh_list;
	struct loop_fd *free_list;	/* deleted handlers, freed after dispatch */

	/* Cross-thread calls, protected by call_lock. */
	pthread_mutex_t call_lock;
	pthread_cond_t call_done;
	struct loop_call *calls;
};

static void loop_run_calls(struct loop *l)
{
	struct loop_call *c;

	pthread_mutex_lock(&l->call_lock);
	while ((c = l->calls) != NULL) {
		l->calls = c->next;
		pthread_mutex_unlock(&l->call_lock);
		c->fn(c->arg);
		pthread_mutex_lock(&l->call_lock);
		c->done = true;
		pthread_cond_broadcast(&l->call_done);
	}
	pthread_mutex_unlock(&l->call_lock);
}

static void loop_wake_cb(void *opaque, uint32_t events)
{
	struct loop *l = opaque;

	(void)sys_eventfd_drain(l->wake_fd);
	loop_run_calls(l);
}

int loop_new(const char *name, struct loop **out)
{
	struct loop *l = calloc(1, sizeof(*l));
	int r;

	if (!l)
		return -ENOMEM;
	snprintf(l->name, sizeof(l->name), "%s", name);
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		r = -errno;
		goto err_free;
	}
	l->wake_fd = sys_eventfd();
	if (l->wake_fd < 0) {
		r = l->wake_fd;
		goto err_epoll;
	}
	pthread_mutex_init(&l->call_lock, NULL);
	pthread_cond_init(&l->call_done, NULL);
	r = loop_fd_add(l, l->wake_fd, EPOLLIN, loop_wake_cb, l, &l->wake_h);
	if (r < 0)
		goto err_wake;
	*out = l;
	return 0;

err_wake:
	close(l->wake_fd);
err_epoll:
	close(l->epfd);
err_free:
	free(l);
	return r;
}

static void loop_reap_deleted(struct loop *l)
{
	struct loop_fd *h;

	while ((h = l->free_list) != NULL) {
		l->free_list = h->next_free;
		free(h);
	}
}

void loop_free(struct loop *l)
{
	if (!l)
		return;
	loop_fd_del(l, l->wake_h);
	loop_reap_deleted(l);
	close(l->wake_fd);
	close(l->epfd);
	pthread_mutex_destroy(&l->call_lock);
	pthread_cond_destroy(&l->call_done);
	free(l);
}

int loop_fd_add(struct loop *l, int fd, uint32_t events, loop_fd_cb cb,
		void *opaque, struct loop_fd **out)
{
	struct epoll_event ev = { .events = events };
	struct loop_fd *h = calloc(1, sizeof(*h));

	if (!h)
		return -ENOMEM;
	h->fd = fd;
	h->cb = cb;
	h->opaque = opaque;
	ev.data.ptr = h;
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int r = -errno;

		free(h);
		return r;
	}
	if (out)
		*out = h;
	return 0;
}

void loop_fd_del(struct loop *l, struct loop_fd *h)
{
	if (!h || h->deleted)
		return;
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, h->fd, NULL);
	/* Events for h may already sit in this iteration's array: keep the
	 * memory until dispatch is over and let the deleted flag skip them. */
	h->deleted = true;
	h->next_free = l->free_list;
	l->free_list = h;
}

int loop_bh_new(struct loop *l, loop_cb cb, void *opaque, struct loop_bh **out)
{
	struct loop_bh *bh = calloc(1, sizeof(*bh));

	if (!bh)
		return -ENOMEM;
	bh->loop = l;
	bh->cb = cb;
	bh->opaque = opaque;
	*out = bh;
	return 0;
}

void loop_bh_schedule(struct loop_bh *bh)
{
	if (bh->scheduled)
		return;
	bh->scheduled = true;
	bh->next = bh->loop->bh_list;
	bh->loop->bh_list = bh;
}

void loop_bh_free(struct loop_bh *bh)
{
	struct loop_bh **p;

	if (!bh)
		return;
	for (p = &bh->loop->bh_list; *p; p = &(*p)->next)
		if (*p == bh) {
			*p = bh->next;
			break;
		}
	free(bh);
}

static void loop_run_bhs(struct loop *l)
{
	/* Bottom halves scheduled by bottom halves run in the next iteration:
	 * take the list first so a self-rescheduling bh cannot starve fds. */
	struct loop_bh *bh = l->bh_list;

	l->bh_list = NULL;
	while (bh) {
		struct loop_bh *next = bh->next;

		bh->scheduled = false;
		bh->cb(bh->opaque);
		bh = next;
	}
}

int loop_run(struct loop *l)
{
	struct epoll_event evs[LOOP_MAX_EVENTS];

	l->thread = pthread_self();
	pthread_mutex_lock(&l->call_lock);
	l->accepting = true;
	pthread_mutex_unlock(&l->call_lock);
	atomic_store(&l->running, true);
	/* Calls queued before we started would otherwise wait for a wake-up. */
	loop_run_calls(l);

	while (!atomic_load(&l->stop)) {
		/* Phase 1: block only if nothing is pending. */
		int timeout = l->bh_list ? 0 : -1;
		/* Phase 2. */
		int n = epoll_wait(l->epfd, evs, LOOP_MAX_EVENTS, timeout);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_err("loop %s: epoll_wait: %s", l->name, strerror(errno));
			atomic_store(&l->running, false);
			return -errno;
		}
		/* Phases 3 and 4 form one batch for deferred calls (phase 5). */
		defer_begin();
		for (int i = 0; i < n; i++) {
			struct loop_fd *h = evs[i].data.ptr;

			if (h->deleted)
				continue;
			h->cb(h->opaque, evs[i].events);
		}
		loop_run_bhs(l);
		defer_end();
		loop_reap_deleted(l);
	}
	atomic_store(&l->stop, false);
	/* Nobody may be left waiting on a loop that no longer runs: refuse new
	 * calls, then run the ones already queued. */
	pthread_mutex_lock(&l->call_lock);
	l->accepting = false;
	pthread_mutex_unlock(&l->call_lock);
	loop_run_calls(l);
	atomic_store(&l->running, false);
	return 0;
}

void loop_stop(struct loop *l)
{
	atomic_store(&l->stop, true);
	(void)sys_eventfd_signal(l->wake_fd);
}

bool loop_in_thread(struct loop *l)
{
	return atomic_load(&l->running) && pthread_equal(l->thread, pthread_self());
}

int loop_call_sync(struct loop *l, loop_cb fn, void *arg)
{
	struct loop_call c = { .fn = fn, .arg = arg };

	if (loop_in_thread(l)) {
		fn(arg);
		return 0;
	}
	pthread_mutex_lock(&l->call_lock);
	if (!l->accepting) {
		/* Nobody runs this loop: the caller owns its state. */
		pthread_mutex_unlock(&l->call_lock);
		fn(arg);
		return 0;
	}
	c.next = l->calls;
	l->calls = &c;
	pthread_mutex_unlock(&l->call_lock);
	(void)sys_eventfd_signal(l->wake_fd);

	pthread_mutex_lock(&l->call_lock);
	while (!c.done)
		pthread_cond_wait(&l->call_done, &l->call_lock);
	pthread_mutex_unlock(&l->call_lock);
	return 0;
}

static void *loop_thread_main(void *opaque)
{
	struct loop *l = opaque;

	log_set_thread_name(l->name);
	loop_run(l);
	return NULL;
}

int loop_thread_start(struct loop *l)
{
	int r;

	l->has_thread = true;
	/* Accept calls from now on, so none issued between here and
	 * loop_run() runs on the wrong thread. */
	pthread_mutex_lock(&l->call_lock);
	l->accepting = true;
	pthread_mutex_unlock(&l->call_lock);
	/* Into a field only the starting thread uses: the new thread sets
	 * l->thread itself, so nobody reads a half-written id. */
	r = pthread_create(&l->joiner_tid, NULL, loop_thread_main, l);
	if (r) {
		l->has_thread = false;
		pthread_mutex_lock(&l->call_lock);
		l->accepting = false;
		pthread_mutex_unlock(&l->call_lock);
		return -r;
	}
	pthread_setname_np(l->joiner_tid, l->name);
	return 0;
}

void loop_thread_join(struct loop *l)
{
	if (!l->has_thread)
		return;
	loop_stop(l);
	pthread_join(l->joiner_tid, NULL);
	l->has_thread = false;
}
