/*
 * nbds_: the NBD server, a front of the disk (disk.h) beside the
 * virtio-blk device: what backup, copy and migration tools (nbdcopy,
 * qemu-img, nbdinfo, QEMU's NBD client) use to reach the disk vblkd
 * serves.  The protocol is NetworkBlockDevice/nbd doc/proto.md, fixed
 * newstyle, as nbdkit and QEMU implement it.
 *
 * An export is one listening socket (unix or TCP) with a name; its
 * listener runs on the main loop, each connection on one of the disk's
 * iothreads (disk_pick_iothread), handshake and transmission alike, its
 * I/O submitted there on the iothread's engine ctx.  A connected client
 * holds a claim on the disk (disk_claim: the image lock, the format's
 * tables) until it is gone.
 *
 * Threading: everything in this header on the main thread.
 */
#ifndef VBLK_NBDS_H
#define VBLK_NBDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct disk;
struct loop;
struct nbds;

/* Bounds a client cannot move (docs/architecture.md "NBD server"). */
#define NBDS_MAX_PAYLOAD	(32u << 20)	/* NBD_INFO_BLOCK_SIZE maximum */
#define NBDS_MAX_CONN_DEFAULT	16u
#define NBDS_NAME_MAX		4096u		/* proto.md: strings */

/*
 * What an export serves instead of the disk: a backup's point-in-time
 * view (backup/bkp.h).  Such an export is read-only; reads and block
 * status go through it, and its one dirty bitmap (qemu:dirty-bitmap:
 * NAME) is bitmap, which nothing changes while the export lives.
 */
struct bdev_io;
struct dbm;
struct disk_iothread;
struct fmt_extent;
struct nbds_source {
	/* Read io on iothread t (its cb runs there, maybe inline). */
	void (*read)(void *opaque, struct disk_iothread *t, struct bdev_io *io);
	/* fmt_block_status of the view (format.h's contract). */
	int (*block_status)(void *opaque, uint64_t off, uint64_t len, struct fmt_extent *e);
	/* A read answered from block status alone (a hole): len bytes
	 * served without read.  Any iothread. */
	void (*served)(void *opaque, uint64_t len);
	struct dbm *bitmap;	/* NULL: none */
	/* Optional, on iothread t: the guest is busy there.  While it says
	 * so, the source's connections on t yield: each takes at most a
	 * quarter of t's time (conn.c, "Yielding"). */
	bool (*busy)(void *opaque, struct disk_iothread *t);
	/* What made the export, and how it goes: vblkctl nbd remove refuses
	 * it with this ("backup X's view: use vblkctl backup finish/abort
	 * X").  Only its maker removes it: a source may hold reads the
	 * server does not see (a backup's rate), which must go before the
	 * connections are freed.  Lives as long as the source. */
	const char *owner;
	void *opaque;
};

struct nbds_export_opts {
	char *addr;		/* "unix:PATH" or "HOST:PORT" (owned) */
	char *name;		/* export name (owned; "" the default) */
	char *tls;		/* "x509:DIR" or "psk:FILE" (owned); NULL: none.
				 * With it, TLS is required (FORCEDTLS). */
	bool read_only;
	/* A migration's destination (mirror.h): writable until the guest's
	 * rings start on this disk (disk.rings_started: the switch-over),
	 * read-only from then on; the mirror's writes stop there. */
	bool incoming;
	unsigned max_conn;	/* clients at once; more are refused */
	/* Serve this instead of the disk (not owned: it outlives the
	 * export's clients, which nbds_remove disconnects); NULL: the disk. */
	const struct nbds_source *src;
};

/*
 * Parse "ADDR[,name=NAME][,read-only][,incoming][,max-conn=N][,tls=x509:DIR|psk:FILE]" (--nbd, vblkctl nbd
 * add) into *o (which then owns copies: nbds_export_opts_free).  0, or
 * -EINVAL with one line in err.
 */
int nbds_export_parse(const char *spec, struct nbds_export_opts *o, char *err, size_t errlen);
void nbds_export_opts_free(struct nbds_export_opts *o);

/* The server of disk d, with no export yet; its listeners on main_loop.
 * 0 or -errno. */
int nbds_new(struct disk *d, struct loop *main_loop, struct nbds **out);
/* Every client disconnected (their requests completed first), every
 * listener closed (unix socket files removed), freed. */
void nbds_free(struct nbds *s);

/*
 * Start serving an export: listen on o->addr (a unix socket file is
 * created; a live one there is an error).  The server copies o.  0, or
 * -errno with one line in err (a bad or busy address, a name in use, a
 * writable export of a read-only disk).
 */
int nbds_add(struct nbds *s, const struct nbds_export_opts *o, char *err, size_t errlen);
/* Stop the export named name: its listener closes, its clients are
 * disconnected after their requests complete.  0, or -ENOENT. */
int nbds_remove(struct nbds *s, const char *name);
/* The owner of the export named name's source (nbds_source.owner), or
 * NULL: no such export, or one anyone may remove. */
const char *nbds_export_owner(struct nbds *s, const char *name);

struct nbds_export_info {
	const char *name, *addr;
	bool read_only, tls, incoming;
	unsigned max_conn, clients;
	uint64_t accepted, refused;
};
/* The exports: up to max of them into out; returns how many there are. */
unsigned nbds_list(struct nbds *s, struct nbds_export_info *out, unsigned max);

/* Counters of every connection so far (relaxed reads). */
struct nbds_stats {
	uint64_t connections, clients, refused, handshake_failed;
	uint64_t requests, bad_requests, read_bytes, write_bytes;
	uint64_t throttled;	/* requests that waited for the QoS budget */
	/* A pipelining client's requests gathered (conn.c, loop_moderate):
	 * the short waits taken, and the requests the passes after them
	 * took. */
	uint64_t coalesced_waits, coalesced_requests;
	/* Requests of a yielding source's connections that waited for the
	 * guest (nbds_source.busy). */
	uint64_t yielded;
};
void nbds_stats(struct nbds *s, struct nbds_stats *st);

/* The control socket's commands (ctl.h ctl_cmd_fn; opaque: the server):
 * "nbd-add" {"spec"}, "nbd-remove" {"name"}, "nbd-list" -> {"exports",
 * "stats"}.  ctl.c. */
struct json_object;
int nbds_ctl_add(void *opaque, struct json_object *req, struct json_object *reply, char *err,
		 size_t errlen);
int nbds_ctl_remove(void *opaque, struct json_object *req, struct json_object *reply, char *err,
		    size_t errlen);
int nbds_ctl_list(void *opaque, struct json_object *req, struct json_object *reply, char *err,
		  size_t errlen);

#endif
