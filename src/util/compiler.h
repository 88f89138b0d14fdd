/* Small compiler helpers shared by every subsystem. */
#ifndef VBLK_COMPILER_H
#define VBLK_COMPILER_H

#include <stddef.h>

#define likely(x)   __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* Out of the hot path: a rare branch's code (dirty logging, fallbacks)
 * must not cost the common path a register spill or an I-cache line. */
#define __cold __attribute__((noinline, cold))

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

#define STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "vblkd assumes a little-endian host (virtio 1.x rings are little-endian)"
#endif

#endif
