/*
 * The NBD protocol's wire format, server side: our own copy of what
 * NetworkBlockDevice/nbd doc/proto.md defines (section names in the
 * comments), pinned with static asserts.  Every field is big-endian on
 * the wire; the structs hold the wire bytes as they are.
 */
#ifndef VBLK_NBD_PROTO_H
#define VBLK_NBD_PROTO_H

#include <stdint.h>

/* "Newstyle negotiation" */
#define NBD_MAGIC		0x4e42444d41474943ull	/* "NBDMAGIC" */
#define NBD_IHAVEOPT		0x49484156454F5054ull	/* "IHAVEOPT" */
#define NBD_OPT_REPLY_MAGIC	0x0003e889045565a9ull

#define NBD_FLAG_FIXED_NEWSTYLE	(1u << 0)	/* handshake flags */
#define NBD_FLAG_NO_ZEROES	(1u << 1)
#define NBD_FLAG_C_FIXED_NEWSTYLE (1u << 0)	/* client flags */
#define NBD_FLAG_C_NO_ZEROES	(1u << 1)

/* "Option types" */
#define NBD_OPT_EXPORT_NAME	1
#define NBD_OPT_ABORT		2
#define NBD_OPT_LIST		3
#define NBD_OPT_STARTTLS	5
#define NBD_OPT_INFO		6
#define NBD_OPT_GO		7
#define NBD_OPT_STRUCTURED_REPLY 8
#define NBD_OPT_LIST_META_CONTEXT 9
#define NBD_OPT_SET_META_CONTEXT 10

/* "Option reply types" */
#define NBD_REP_ACK		1
#define NBD_REP_SERVER		2
#define NBD_REP_INFO		3
#define NBD_REP_META_CONTEXT	4
#define NBD_REP_ERR(n)		((1u << 31) + (n))
#define NBD_REP_ERR_UNSUP	NBD_REP_ERR(1)
#define NBD_REP_ERR_POLICY	NBD_REP_ERR(2)
#define NBD_REP_ERR_INVALID	NBD_REP_ERR(3)
#define NBD_REP_ERR_PLATFORM	NBD_REP_ERR(4)
#define NBD_REP_ERR_TLS_REQD	NBD_REP_ERR(5)
#define NBD_REP_ERR_UNKNOWN	NBD_REP_ERR(6)
#define NBD_REP_ERR_SHUTDOWN	NBD_REP_ERR(7)
#define NBD_REP_ERR_TOO_BIG	NBD_REP_ERR(9)

/* "Information types" (NBD_OPT_INFO / NBD_OPT_GO) */
#define NBD_INFO_EXPORT		0
#define NBD_INFO_NAME		1
#define NBD_INFO_DESCRIPTION	2
#define NBD_INFO_BLOCK_SIZE	3

/* "Transmission flags" */
#define NBD_FLAG_HAS_FLAGS	(1u << 0)
#define NBD_FLAG_READ_ONLY	(1u << 1)
#define NBD_FLAG_SEND_FLUSH	(1u << 2)
#define NBD_FLAG_SEND_FUA	(1u << 3)
#define NBD_FLAG_ROTATIONAL	(1u << 4)
#define NBD_FLAG_SEND_TRIM	(1u << 5)
#define NBD_FLAG_SEND_WRITE_ZEROES (1u << 6)
#define NBD_FLAG_SEND_DF	(1u << 7)
#define NBD_FLAG_CAN_MULTI_CONN	(1u << 8)
#define NBD_FLAG_SEND_CACHE	(1u << 10)
#define NBD_FLAG_SEND_FAST_ZERO	(1u << 11)

/* "Request types" */
#define NBD_CMD_READ		0
#define NBD_CMD_WRITE		1
#define NBD_CMD_DISC		2
#define NBD_CMD_FLUSH		3
#define NBD_CMD_TRIM		4
#define NBD_CMD_CACHE		5
#define NBD_CMD_WRITE_ZEROES	6
#define NBD_CMD_BLOCK_STATUS	7

/* "Command flags" */
#define NBD_CMD_FLAG_FUA	(1u << 0)
#define NBD_CMD_FLAG_NO_HOLE	(1u << 1)
#define NBD_CMD_FLAG_DF		(1u << 2)
#define NBD_CMD_FLAG_REQ_ONE	(1u << 3)
#define NBD_CMD_FLAG_FAST_ZERO	(1u << 4)

/* "Error values" */
#define NBD_EPERM		1
#define NBD_EIO			5
#define NBD_ENOMEM		12
#define NBD_EINVAL		22
#define NBD_ENOSPC		28
#define NBD_EOVERFLOW		75
#define NBD_ENOTSUP		95
#define NBD_ESHUTDOWN		108

/* "Transmission phase" */
#define NBD_REQUEST_MAGIC	0x25609513u
#define NBD_SIMPLE_REPLY_MAGIC	0x67446698u
#define NBD_STRUCTURED_REPLY_MAGIC 0x668e33efu

/* "Structured reply types" */
#define NBD_REPLY_FLAG_DONE	(1u << 0)
#define NBD_REPLY_TYPE_NONE	0
#define NBD_REPLY_TYPE_OFFSET_DATA 1
#define NBD_REPLY_TYPE_OFFSET_HOLE 2
#define NBD_REPLY_TYPE_BLOCK_STATUS 5
#define NBD_REPLY_TYPE_ERROR	((1u << 15) + 1)

/* "base:allocation metadata context" */
#define NBD_STATE_HOLE		(1u << 0)
#define NBD_STATE_ZERO		(1u << 1)
/* QEMU's docs/interop/nbd.rst, "qemu:dirty-bitmap:<name>": bit 0 set
 * for a dirty range. */
#define NBD_STATE_DIRTY		(1u << 0)

/* Client's option request header. */
struct nbd_opt_hdr {
	uint64_t magic;		/* NBD_IHAVEOPT */
	uint32_t option;
	uint32_t length;
} __attribute__((packed));

/* Server's option reply header. */
struct nbd_opt_reply {
	uint64_t magic;		/* NBD_OPT_REPLY_MAGIC */
	uint32_t option;
	uint32_t type;
	uint32_t length;
} __attribute__((packed));

struct nbd_request {
	uint32_t magic;		/* NBD_REQUEST_MAGIC */
	uint16_t flags;
	uint16_t type;
	uint64_t cookie;
	uint64_t offset;
	uint32_t length;
} __attribute__((packed));

struct nbd_simple_reply {
	uint32_t magic;		/* NBD_SIMPLE_REPLY_MAGIC */
	uint32_t error;
	uint64_t cookie;
} __attribute__((packed));

struct nbd_chunk {
	uint32_t magic;		/* NBD_STRUCTURED_REPLY_MAGIC */
	uint16_t flags;
	uint16_t type;
	uint64_t cookie;
	uint32_t length;
} __attribute__((packed));

_Static_assert(sizeof(struct nbd_opt_hdr) == 16, "option request header");
_Static_assert(sizeof(struct nbd_opt_reply) == 20, "option reply header");
_Static_assert(sizeof(struct nbd_request) == 28, "request header");
_Static_assert(sizeof(struct nbd_simple_reply) == 16, "simple reply");
_Static_assert(sizeof(struct nbd_chunk) == 20, "structured reply chunk header");

#endif
