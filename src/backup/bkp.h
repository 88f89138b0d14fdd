/*
 * bkp_: pull-mode backup (issue 46), a point-in-time view of the disk
 * exported read-only over NBD while the guest writes on.  QEMU's
 * fleecing is the model (block/copy-before-write.c with
 * block/snapshot-access.c and an NBD export; libvirt's pull-mode
 * backup-begin): the view is the disk as it was at the backup's instant;
 * before a write changes a chunk the view still needs, the chunk's old
 * data goes to a scratch file on local storage (copy-before-write), so
 * the guest waits for a local copy, never for the backup client.
 *
 * The instant: the write filter is set (disk_wfilter_set), and every write
 * submitted before it has completed; every write after goes through the
 * filter.  A chunk (64 KiB) is live (the view reads the disk), being
 * copied (the write that claimed it waits, and so does any other write to
 * it), or saved (the view reads the scratch, or zeroes: a chunk that
 * reads as zeroes is not written to the scratch).  Its block status as of
 * the instant is kept with it when it is saved, so the view's
 * base:allocation and qemu:allocation-depth are the instant's too (a
 * discard after the instant does not turn the view's data into a hole).
 *
 * With --bitmap B: the view's qemu:dirty-bitmap:B is B as of the instant
 * (a frozen copy, covering at least every write up to it); B itself goes
 * on tracking every write.  A hidden bitmap tracks every write from the
 * instant on.  backup finish: B becomes that one (exactly what was
 * written since the instant, the writes made during the pull included:
 * the next incremental's); backup abort: B keeps what it has and gets
 * the frozen copy and the hidden one merged back (it covers everything
 * since its last finish, a bitmap clear during the backup or not:
 * nothing lost).  A crash
 * during a backup leaves B's persistent copy covering everything too.
 *
 * A backup is a job of the framework (job.h: type "backup", ready as
 * soon as the view is; job complete = finish, job cancel = abort;
 * progress = bytes its clients read).  One at a time per disk.  A full
 * scratch, or a failed read of old data, fails the backup (its view reads
 * fail from then on, one log line), never the guest's write.
 *
 * Threads: everything in this header on the main thread; the filter and
 * the view run on the disk's iothreads (bkp.c).
 */
#ifndef VBLK_BKP_H
#define VBLK_BKP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct disk;
struct loop;
struct nbds;
struct json_object;

#define BKP_CHUNK_BITS 16	/* 64 KiB: QEMU's copy-before-write cluster */
#define BKP_NAME_MAX 63

struct bkp_start_opts {
	const char *name;	/* the backup, and its NBD export's name */
	const char *nbd;	/* "ADDR[,tls=...][,max-conn=N]" (nbds_export_parse) */
	const char *bitmap;	/* NULL: a full backup with no checkpoint */
	const char *scratch;	/* a directory; NULL: the disk's own */
	uint64_t rate;		/* the view's reads, bytes/s; 0: none */
	bool no_yield;		/* the view does not yield to the guest (view_busy) */
};

/* The backups of one disk (vblkd has one). */
struct bkp_set;
int bkp_set_new(struct disk *d, struct nbds *srv, struct loop *main_loop, struct bkp_set **out);
/* Every backup aborted (vblkd exits), the set freed. */
void bkp_set_free(struct bkp_set *s);

/*
 * Start a backup: the disk claimed, the scratch made (an unnamed file in
 * the directory: nothing is left behind by a crash), the instant taken,
 * the view exported.  0 and its job's id in id, or -errno with one line
 * in err (nothing left: a bad name or address, a name in use, no such
 * bitmap, a scratch directory that cannot take a file, a backup running).
 */
int bkp_start(struct bkp_set *s, const struct bkp_start_opts *o, char *id, size_t idlen,
	      char *err, size_t errlen);
/* finish (the client has it all: the bitmap now tracks from the instant)
 * or abort (nothing lost: the bitmap gets the instant's bits and the
 * writes since back).  0, or -errno with one line. */
int bkp_finish(struct bkp_set *s, const char *name, bool abort, char *err, size_t errlen);

/* What vblkctl backup list shows of one backup. */
struct bkp_info {
	char name[BKP_NAME_MAX + 1];
	char job[32];
	char bitmap[64];
	char addr[200];
	uint64_t size;
	uint64_t read_bytes;		/* the clients' reads of the view */
	uint64_t saved_chunks;		/* copied before a write */
	uint64_t zero_chunks;		/* of them, zeroes (no scratch) */
	uint64_t scratch_bytes;		/* the scratch file's allocation */
	uint64_t waits;			/* writes that waited for a copy */
	uint64_t rate;			/* the view's reads, bytes/s; 0: none */
	uint64_t paced;			/* reads that waited for the rate */
	bool yield;			/* the view yields to the guest */
	bool failed;
	char error[200];
};
unsigned bkp_list(struct bkp_set *s, struct bkp_info *out, unsigned max);

/* The control socket's commands (ctl.h's ctl_cmd_fn; opaque the set):
 *   {"cmd": "backup-start", "name", "nbd", "bitmap"?, "scratch"?, "rate"?, "yield"?}
 *	-> {"ok", "job"}
 *   {"cmd": "backup-finish"|"backup-abort", "name"}               -> {"ok"}
 *   {"cmd": "backup-list"} -> {"backups": [{...bkp_info}]} */
int bkp_ctl(void *opaque, struct json_object *req, struct json_object *reply, char *err,
	    size_t errlen);

#endif
