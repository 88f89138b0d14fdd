/*
 * The stream job (vblkctl stream): everything a qcow2 disk's backing chain
 * still provides copied into the image, one cluster a unit (a read with
 * copy_up through the disk's iothread, so it waits for, and never races,
 * a guest write allocating the same cluster), then the header without
 * the backing file (QEMU's block-stream with no base).  The format says
 * which ranges (fmt_stream_next); the job framework paces and reports.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disk/disk.h"
#include "format/format.h"
#include "job/job.h"
#include "util/compiler.h"

struct stream {
	struct job *job;
	struct disk *disk;
	struct disk_iothread *t;
	struct bdev_io io;
	struct iovec iov;
	uint8_t *buf;
	size_t cap;
	uint64_t pos, len;	/* bytes: where the next look starts; the unit's */
	bool active;
};

static void unit_done(struct bdev_io *io, int res)
{
	struct stream *s = container_of(io, struct stream, io);

	if (res == 0)
		s->pos += s->len;
	job_set_progress(s->job, s->pos, s->disk->b->size);
	job_step_done(s->job, res, res == 0 ? s->len : 0);
}

static int step(struct job *j, void *priv)
{
	struct stream *s = priv;
	char err[160];
	int r;

	if (!s->active) {
		fmt_stream_active(s->disk->b, true);
		s->active = true;
	}
	r = fmt_stream_next(s->disk->b, &s->pos, &s->len, err, sizeof(err));
	job_set_progress(j, s->pos, s->disk->b->size);
	if (r < 0) {
		job_set_error(j, "%s", err);
		return r;
	}
	if (r == 0)
		return JOB_STEP_END;
	if (r == 2)
		return JOB_STEP_YIELD;
	if (s->len > s->cap) {
		free(s->buf);
		s->buf = NULL;
		s->cap = 0;
		if (posix_memalign((void **)&s->buf, 4096, s->len)) {
			job_set_error(j, "out of memory for a %llu-byte cluster",
				      (unsigned long long)s->len);
			return -ENOMEM;
		}
		s->cap = s->len;
	}
	s->iov = (struct iovec){ s->buf, s->len };
	s->io = (struct bdev_io){ .op = BDEV_READ, .offset = s->pos, .iov = &s->iov,
				  .iovcnt = 1, .cb = unit_done, .copy_up = true };
	disk_submit(s->disk, s->t, &s->io);
	disk_kick(s->disk, s->t);
	return JOB_STEP_IO;
}

static int finish(struct job *j, void *priv, char *msg, size_t len)
{
	struct stream *s = priv;

	return fmt_stream_finish(s->disk->b, msg, len);
}

static void end(struct job *j, void *priv)
{
	struct stream *s = priv;

	if (s->active)
		fmt_stream_active(s->disk->b, false);
	s->active = false;
}

static void stream_free(void *priv)
{
	struct stream *s = priv;

	free(s->buf);
	free(s);
}

static const struct job_ops stream_ops = {
	.type = "stream",
	.step = step,
	.finish = finish,
	.end = end,
	.free = stream_free,
};

int job_stream_start(struct disk *d, uint64_t rate, enum job_on_error on_error, char *id,
		      size_t idlen, char *err, size_t errlen)
{
	struct stream *s;
	struct job *j;
	int r;

	r = fmt_stream_check(d->b, err, errlen);
	if (r < 0)
		return r;
	s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->disk = d;
	/* A qcow2 disk is served from one iothread (max_ctxs 1): its
	 * tables are that thread's, and so is the job. */
	s->t = &d->iot[0];
	r = job_new(&stream_ops, d, s->t->loop, rate, on_error, s, &j, err, errlen);
	if (r < 0) {
		free(s);
		return r;
	}
	s->job = j;
	snprintf(id, idlen, "%s", job_id(j));
	job_start(j);
	return 0;
}
