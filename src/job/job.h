/*
 * job_: background work on a disk (issue 45, "Block jobs"): one framework
 * for vblkctl stream now, and backup, mirror and commit next.  The states
 * and verbs are QEMU's (qapi/job.json: JobStatus, JobVerb), cut to what a
 * daemon serving one disk needs:
 *
 *   created --start--> running <--pause/resume--> paused
 *   running --the work caught up, a type with a complete step--> ready
 *   ready --complete--> concluded
 *   running --done, or failed--> concluded
 *   running --an I/O error the policy stops on--> paused (resume retries)
 *   created|running|paused|ready --cancel--> concluded
 *
 * A job is a type's ops run on one loop: the disk iothread whose engine
 * ctx its I/O goes through.  The framework owns what every type shares:
 * the state and its verbs, the pacing (a rate limit, changed at run
 * time), the error policy (the guest's: --werror), progress, one log line
 * per transition, and the list vblkctl job and the metrics read.  A type
 * owns its unit of work only: step starts one (I/O in flight, then
 * job_step_done), finish ends the job's work when nothing is left.
 *
 * A job writes the image beside the fronts, so it runs only while a
 * front holds the disk (disk_claim): when the last one lets go (the VM
 * stopped or moved away), disk_release fails the jobs of the disk first
 * (job_disk_released), their I/O drained with the fronts'.
 *
 * Threads: job_new, the verbs, job_list, job_dismiss and job_free_all on
 * the main thread; a type's step/finish/complete/end and job_step_done on
 * the job's loop.  A verb reaches the loop with loop_call_sync, so it
 * never races a step; what job_list reads is the loop's too, read there.
 */
#ifndef VBLK_JOB_H
#define VBLK_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct disk;
struct job;
struct loop;

enum job_state {
	JOB_CREATED,
	JOB_RUNNING,
	JOB_PAUSED,
	JOB_READY,
	JOB_CONCLUDED,
	JOB_NR_STATES,
};

/* What an I/O error of a job does (vblkd --werror, as the guest's writes:
 * a job writes the image).  QEMU's BlockdevOnError report/stop/enospc. */
enum job_on_error {
	JOB_ERR_REPORT,		/* the job concludes with the error */
	JOB_ERR_STOP,		/* it pauses, the error kept: resume retries */
	JOB_ERR_ENOSPC,		/* stop on ENOSPC, report anything else */
};

/* What ops->step did. */
#define JOB_STEP_END 0		/* nothing left: finish (or ready) */
#define JOB_STEP_IO 1		/* a unit in flight: job_step_done follows */
#define JOB_STEP_YIELD 2	/* moved on without I/O: call again after the
				 * loop's other work had its turn */

struct job_ops {
	const char *type;	/* "stream" */
	/* Start the next unit of work: JOB_STEP_*, or -errno after
	 * job_set_error (a failure no retry mends: the job concludes). */
	int (*step)(struct job *j, void *priv);
	/* Nothing left (JOB_STEP_END) and no complete op: make the result
	 * durable.  0 and a summary for the log in msg, or -errno and why
	 * in msg. */
	int (*finish)(struct job *j, void *priv, char *msg, size_t len);
	/* A type with a ready state (a mirror): NULL for one that ends by
	 * itself.  Ready, vblkctl job complete: 0 and a summary, or -errno
	 * and why (the job stays ready). */
	int (*complete)(struct job *j, void *priv, char *msg, size_t len);
	/* Optional: the main thread's part of a complete, before complete
	 * runs on the loop (a local mirror's pivot, which parks every
	 * iothread: disk_replace_image).  Only for a ready job; 0, or
	 * -errno and one line in err (the job stays ready). */
	int (*prepare_complete)(void *priv, char *err, size_t errlen);
	/* The job concluded (finished, failed or cancelled; no unit in
	 * flight): let go of what a run holds.  May be NULL. */
	void (*end)(struct job *j, void *priv);
	/* Main thread, the job dismissed: priv's memory. */
	void (*free)(void *priv);
	/* Optional: progress measured where the work happens, not in
	 * steps (a backup: bytes its clients read, on any iothread), read
	 * when vblkctl job list or the metrics ask (job_set_progress's
	 * place).  The job's loop; whatever the job's state. */
	void (*progress)(void *priv, uint64_t *done, uint64_t *total);
	/* Optional: a type whose work is not units of its own (a backup's
	 * view, read by its clients) paces it itself: the rate (bytes/s, 0:
	 * none) at start and at each set-rate.  The job's loop. */
	void (*rate)(void *priv, uint64_t rate);
};

/* What vblkctl job list and the metrics show of one job. */
struct job_info {
	char id[32];
	const char *type;
	enum job_state state;
	uint64_t done, total;	/* bytes (the type's measure of progress) */
	uint64_t rate;		/* bytes/s, 0: no limit */
	uint64_t copied;	/* bytes the rate counts (what units moved) */
	uint64_t errors;	/* I/O errors met (each stopped or ended it) */
	bool failed, cancelled;	/* concluded so */
	char error[200];	/* the last error, "" if none */
};

const char *job_state_name(enum job_state s);

/*
 * A job of type ops on loop l (the iothread it submits through), for
 * disk d, not started: id "TYPE-N" (N counts jobs of the daemon), rate
 * bytes/s (0: none), priv the type's (ops->free frees it at dismiss).
 * 0 and *out, or -errno (-EBUSY with one line in err: a job of this type
 * is not concluded yet on d; the caller frees priv then).  Main thread.
 */
int job_new(const struct job_ops *ops, struct disk *d, struct loop *l, uint64_t rate,
	    enum job_on_error on_error, void *priv, struct job **out, char *err, size_t errlen);
/* created -> running; logs "job ID (TYPE): running ...".  Main thread. */
void job_start(struct job *j);

/*
 * The verbs of vblkctl job, on the job named id.  0, or -errno with one
 * line in err: -ENOENT no such job, -EINVAL not in a state the verb
 * applies to (pause of a paused job, complete of a running one or of a
 * type with no ready state), -EIO a complete that failed.  Main thread.
 * cancel takes effect once the unit in flight is done (at once for the
 * state vblkctl sees: concluded); set-rate at once, paced from now.
 */
int job_pause(const char *id, char *err, size_t errlen);
int job_resume(const char *id, char *err, size_t errlen);
int job_cancel(const char *id, char *err, size_t errlen);
int job_complete(const char *id, char *err, size_t errlen);
int job_set_rate(const char *id, uint64_t rate, char *err, size_t errlen);
/* Forget a concluded job (the list keeps the last 8 concluded anyway). */
int job_dismiss(const char *id, char *err, size_t errlen);

/* Up to n jobs' info, oldest first; returns how many there are.  Main
 * thread. */
unsigned job_list(struct job_info *out, unsigned n);
/* Jobs not concluded (vblkctl upgrade waits for none).  Main thread. */
unsigned job_active(void);

/* disk_release, before the format lets go of the image: every job of d
 * fails with why ("the disk was let go ..."); each concludes once its
 * unit in flight completes (the fronts' drain completes it).  Main
 * thread. */
void job_disk_released(struct disk *d, const char *why);
/* At exit, d's iothreads still running: cancel and free d's jobs. */
void job_free_all(struct disk *d);

/* ---- For types, on the job's loop ----------------------------------- */

/* The unit started by step is done: res 0 or -errno (the error policy
 * applies), bytes what it moved (paced against the rate). */
void job_step_done(struct job *j, int res, uint64_t bytes);
/* Progress: done of total bytes (any measure the type likes). */
void job_set_progress(struct job *j, uint64_t done, uint64_t total);
/* Why the step about to return -errno failed (one line, logged once). */
void job_set_error(struct job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A type with a ready state: work came in while ready (a guest write a
 * mirror must copy): step again. */
void job_kick(struct job *j);
const char *job_id(const struct job *j);

/* ---- The types, and vblkctl's commands ------------------------------- */

/*
 * vblkctl stream (stream.c): a stream job on d (a qcow2 disk with a
 * backing file, held by a front), started, its id in id.  0, or -errno
 * with one line in err (fmt_stream_check's, or a stream not concluded
 * yet).  Main thread.
 */
int job_stream_start(struct disk *d, uint64_t rate, enum job_on_error on_error, char *id,
		     size_t idlen, char *err, size_t errlen);

/*
 * The control socket's commands (ctl.h's ctl_cmd_fn; opaque a struct
 * job_ctl, main thread):
 *   {"cmd": "stream", "rate": N}          -> {"ok": true, "rate": N, "job": ID}
 *   {"cmd": "job-list"}                   -> {"jobs": [{"id", "type", "state",
 *       "done", "total", "rate", "copied", "errors", "error"}, ...]}
 *   {"cmd": "job-pause"|"job-resume"|"job-cancel"|"job-complete"|
 *    "job-dismiss", "id": ID}             -> {"ok": true, "job": {...}}
 *   {"cmd": "job-set-rate", "id": ID, "rate": N} -> {"ok": true, "job": {...}}
 */
struct job_ctl {
	struct disk *disk;
	enum job_on_error on_error;
};
struct json_object;
int job_ctl_stream(void *opaque, struct json_object *req, struct json_object *reply,
		   char *err, size_t errlen);
int job_ctl_list(void *opaque, struct json_object *req, struct json_object *reply,
		 char *err, size_t errlen);
int job_ctl_verb(void *opaque, struct json_object *req, struct json_object *reply,
		 char *err, size_t errlen);

#endif
