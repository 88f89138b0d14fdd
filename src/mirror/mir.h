/*
 * mir_: the mirror job (issue 47): the disk copied to a target while the
 * guest writes on, pass after pass, until the target has it all.  QEMU's
 * block/mirror.c (blockdev-mirror, sync=full, background mode) is the
 * model: a dirty bitmap (hidden, disk_bitmap_hidden_add) is set over the
 * whole disk at the start and marked by every write; a unit takes its
 * chunks' bits, then copies them (data read through the disk and written
 * to the target; a range the disk says reads as zeroes is written as
 * zeroes, not bytes); a write meanwhile sets the bits again and a later
 * pass copies it once more.  When a pass finds nothing dirty, the target
 * is flushed and the job is ready (one log line: passes, time); it stays
 * so, copying what the guest writes as it comes, until job complete (the
 * target then has everything written before the complete, flushed; a
 * local target becomes the disk: the pivot below) or job cancel (the
 * target as the last unit left it).
 *
 * The target: an NBD URI (nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?
 * socket=PATH; libnbd, the nbd engine, TLS as its URI says) of the disk's
 * size, or a local path: an image made at the disk's size if it is not
 * there (qcow2 for a qcow2 disk, else raw, or as asked: QEMU's
 * drive-mirror), or an existing raw file, block device or qcow2 image of
 * that size.  A local target is locked and claimed as a disk is, and a
 * qcow2 one is the mirror's own instance of the format (its tables on
 * iothread 0), which the pivot hands to the disk as it is.
 *
 * Write-blocking mode (QEMU's copy-mode=write-blocking, "active
 * mirror"): a guest write completes only once it is on the target too,
 * unless another I/O has its range in flight (then it is marked and the
 * job copies it), so the job stays converged under any write rate;
 * switchable at run time (mir_change).
 *
 * Yielding (mir.c): a ready background mirror's job waits while the guest
 * is busy on its thread, taking about 1/16 of it (all of it when the
 * guest is quiet); the target falls behind under a guest writing flat
 * out.  Never in write-blocking mode, at a switch-over or a pivot, or once
 * job complete was asked; mirror start --no-yield turns it off.
 *
 * The hand-over at a migration's switch-over: the mirror is the disk's
 * write filter, and when the last ring stops by GET_VRING_BASE with dirty
 * logging on (disk_switchover) its sync waits until the target has every write
 * the guest saw complete, flushed, before the frontend hears where the
 * rings stopped; the destination's rings start after that.
 *
 * The pivot (vblkctl job complete of a mirror to a local path, QEMU's
 * block-job-complete): write-blocking from then on, the target brought up
 * to date, then every iothread parked and the target made the disk in
 * the old image's place (disk_replace_image): the fronts go on with it,
 * the old image is let go and closed.  Refused while a persistent bitmap
 * is kept with the old image, or another job runs on the disk.
 *
 * Threads: this header on the main thread; the job on the disk's iothread
 * 0 (a qcow2 disk's tables are that thread's).
 */
#ifndef VBLK_MIR_H
#define VBLK_MIR_H

#include <stddef.h>
#include <stdint.h>

#include "format/format.h"

struct disk;
struct loop;
struct json_object;

#define MIR_UNIT_MAX (1u << 20)	/* bytes one run copies at most (a unit: 8 runs) */

enum mir_mode {
	MIR_BACKGROUND,		/* writes marked, copied by the job */
	MIR_WRITE_BLOCKING,	/* writes written through to the target */
};
/* "background", "write-blocking"; parse: 0 or -EINVAL. */
const char *mir_mode_name(enum mir_mode mode);
int mir_mode_parse(const char *s, enum mir_mode *out);

struct mir_start_opts {
	const char *name;
	const char *target;	/* NBD URI or local path */
	uint64_t rate;		/* bytes/s, 0: none */
	uint32_t granularity;	/* 0: mir_default_granularity */
	enum mir_mode mode;
	/* A local target's format: FMT_AUTO (a new one: the disk's, qcow2
	 * or raw; one there: as it is), FMT_RAW or FMT_QCOW2. */
	enum fmt_kind format;
	/* The job does not yield to a busy guest in background mode once
	 * ready (mir.c, "Yielding"). */
	bool no_yield;
};

/* The bitmap's granularity when none is given: 4 KiB, so a guest's 4 KiB
 * write costs the job 4 KiB (at 64 KiB, QEMU's, the job copied 16 times
 * what was written and the guest's writes during a background mirror
 * halved: docs/benchmarks.md "Mirror"), up to a disk of 64 GiB; above,
 * the power of two that keeps the bitmap at 2 MiB (64 KiB at 1 TiB). */
uint32_t mir_default_granularity(uint64_t size);

struct mir_set;
int mir_set_new(struct disk *d, struct loop *main_loop, struct mir_set **out);
/* Every mirror cancelled (vblkd exits), the set freed. */
void mir_set_free(struct mir_set *s);

/* Start: the target opened (made), the disk claimed, the bitmap set, the
 * job started.  0 and its id in id, or -errno with one line in err
 * (nothing left behind: a target made here is removed). */
int mir_start(struct mir_set *s, const struct mir_start_opts *o, char *id, size_t idlen,
	      char *err, size_t errlen);

/* Switch a running mirror's mode.  0, or -errno with one line in err. */
int mir_change(struct mir_set *s, const char *name, enum mir_mode mode, char *err,
	       size_t errlen);

/* What vblkctl mirror list shows. */
struct mir_info {
	char name[64], job[32], target[256];
	enum mir_mode mode;
	enum fmt_kind format;		/* the target's: FMT_RAW or FMT_QCOW2 */
	/* write-blocking: guest writes written through, left to the job
	 * (their range busy), failed on the target (copied again) */
	uint64_t wb_writes, wb_conflicts, wb_errors;
	uint64_t wb_bytes;		/* the bytes of those written through */
	uint64_t size, dirty;		/* bytes still to copy */
	uint32_t granularity;		/* the bitmap's, bytes */
	uint64_t copied, zeroed;	/* bytes written to the target, as data, as zeroes */
	unsigned passes;
	double ready_s;			/* seconds from start to ready; -1 not yet */
	bool ready;
	bool yield;			/* yields to a busy guest (background, ready) */
	uint64_t yields;		/* times the job waited for the guest */
};
unsigned mir_list(struct mir_set *s, struct mir_info *out, unsigned max);

/* {"cmd": "mirror-start", "name", "target", "rate"?, "granularity"?, "mode"?, "format"?,
 *  "yield"?}
 *   -> {"ok", "job"}
 * {"cmd": "mirror-change", "name", "mode"} -> {"ok"}
 * {"cmd": "mirror-list"} -> {"mirrors": [...]} */
int mir_ctl(void *opaque, struct json_object *req, struct json_object *reply, char *err,
	    size_t errlen);

#endif
