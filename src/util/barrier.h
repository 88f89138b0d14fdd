/*
 * Memory barriers and single-access helpers for memory shared with the
 * guest (rings) and between our own threads.  All barriers are C11 fences;
 * every call site says what it orders and which barrier it pairs with.
 */
#ifndef VBLK_BARRIER_H
#define VBLK_BARRIER_H

#include <stdatomic.h>

/* Full barrier: orders earlier loads/stores against later loads/stores. */
#define smp_mb()  atomic_thread_fence(memory_order_seq_cst)
/* Read barrier: earlier loads complete before later loads. */
#define smp_rmb() atomic_thread_fence(memory_order_acquire)
/* Write barrier: earlier stores visible before later stores. */
#define smp_wmb() atomic_thread_fence(memory_order_release)

/*
 * One access, exactly once, not merged or re-read by the compiler.
 * Used for every field the guest can change under us (read it once into a
 * local, validate, use the local) and for every field we publish to it.
 */
#define READ_ONCE(x)     (*(const volatile __typeof__(x) *)&(x))
#define WRITE_ONCE(x, v) (*(volatile __typeof__(x) *)&(x) = (v))

#endif
