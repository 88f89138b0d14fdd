/*
 * Scatter-gather helpers over struct iovec arrays.  Pure functions, no
 * guest-memory knowledge: callers pass iovecs that already point into
 * validated host mappings.  Callable from any thread.
 */
#ifndef VBLK_IOV_H
#define VBLK_IOV_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>

/* Whether buf[0..len) is all zero bytes (len > 0): the first byte, then
 * memcmp of the buffer against itself one byte on. */
bool buf_is_zero(const void *buf, size_t len);

/* Total bytes described by iov[0..cnt). */
size_t iov_size(const struct iovec *iov, unsigned cnt);

/* Copy up to len bytes starting at byte offset off of the iovecs into buf.
 * Returns the number of bytes copied. */
size_t iov_to_buf(const struct iovec *iov, unsigned cnt, size_t off,
		  void *buf, size_t len);

/* Copy up to len bytes from buf into the iovecs starting at byte offset off.
 * Returns the number of bytes copied. */
size_t iov_from_buf(const struct iovec *iov, unsigned cnt, size_t off,
		    const void *buf, size_t len);

/* Set up to len bytes of the iovecs from byte offset off to c.  Returns
 * the number of bytes set. */
size_t iov_memset(const struct iovec *iov, unsigned cnt, size_t off, int c, size_t len);

/* Drop len bytes from the front of the array, in place (entries that become
 * empty are removed).  Returns the bytes actually dropped. */
size_t iov_discard_front(struct iovec **iov, unsigned *cnt, size_t len);

/* Drop len bytes from the back of the array, in place.  Returns the bytes
 * actually dropped. */
size_t iov_discard_back(struct iovec *iov, unsigned *cnt, size_t len);

/* Describe bytes [off, off+len) of iov[0..cnt) in dst (at most max
 * entries; dst NULL: only count them).  Returns the entries used, or 0
 * when they do not fit or the range passes the end. */
unsigned iov_slice(const struct iovec *iov, unsigned cnt, size_t off, size_t len,
		   struct iovec *dst, unsigned max);

/* Entries iov_slice needs for that range (0: the range passes the end). */
unsigned iov_slice_count(const struct iovec *iov, unsigned cnt, size_t off, size_t len);

#endif
