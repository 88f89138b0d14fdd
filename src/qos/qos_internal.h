/*
 * Shared between the files of src/qos only: the state behind a struct
 * qos, in the process's memory (a disk's own limits) or in a group's
 * mapped file (group.c), where every member process maps the same bytes.
 */
#ifndef VBLK_QOS_INTERNAL_H
#define VBLK_QOS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "qos/qos.h"

#define QOS_MAGIC 0x736f712d6b6c6276ull	/* "vblk-qos" */
#define QOS_VERSION 1

/* Laid out once, read by processes of one build (version, size checked at
 * join).  mu: robust and, for a group, process-shared: a member killed
 * while holding it leaves it to the next locker (EOWNERDEAD), which finds
 * the fields below whole or one update short, never torn in a way that
 * matters (levels are clamped at their next leak). */
struct qos_shared {
	_Atomic uint64_t magic;		/* QOS_MAGIC once made (release) */
	uint32_t version, size;
	pthread_mutex_t mu;
	struct qos_limits lim;
	struct qos_buckets b;
	/* The line of waiting I/O: tickets served+1 .. next_ticket. */
	uint64_t next_ticket, served;
	uint64_t head_due;		/* when the head's turn comes (came) */
	uint64_t skipped;		/* heads skipped (owner gone) */
	_Atomic uint32_t active;	/* limits set (relaxed: qos_active) */
};

struct qos {
	struct qos_shared *sh;
	bool changed;			/* qos_set since qos_new (this process) */
	struct qos_shared own;		/* when not in a group */
	/* A group (group.c): its file, mapped; -1 / NULL when none. */
	int fd;
	char *path, *name;
};

void qos__lock(struct qos_shared *sh);
void qos__unlock(struct qos_shared *sh);
int qos__shared_init(struct qos_shared *sh, const struct qos_limits *l, bool pshared);

uint64_t qos__one_io_ns(const struct qos_limits *l, bool is_write, uint64_t bytes);
uint64_t qos_shared_admit(struct qos_shared *sh, bool is_write, uint64_t bytes, uint64_t now,
			  uint64_t *ticket, uint64_t slice_ns, unsigned *credit, bool *head);
void qos_shared_cancel(struct qos_shared *sh, uint64_t ticket, uint64_t now);
void qos_shared_get(struct qos_shared *sh, struct qos_limits *l, struct qos_buckets *b,
		    uint64_t now);
void qos_shared_set(struct qos_shared *sh, const struct qos_limits *l);

#endif
