#include "util/iov.h"

#include <string.h>

size_t iov_size(const struct iovec *iov, unsigned cnt)
{
	size_t n = 0;

	for (unsigned i = 0; i < cnt; i++)
		n += iov[i].iov_len;
	return n;
}

/* What the walk below does to each piece: the public functions pass a
 * constant, so each gets its own copy of the loop with one operation. */
enum iov_op { IOV_TO_BUF, IOV_FROM_BUF, IOV_SET };

static inline size_t iov_walk(const struct iovec *iov, unsigned cnt, size_t off, char *buf,
			      int c, size_t len, enum iov_op op)
{
	size_t done = 0;

	for (unsigned i = 0; i < cnt && done < len; i++) {
		size_t l = iov[i].iov_len;
		char *p;

		if (off >= l) {
			off -= l;
			continue;
		}
		l -= off;
		if (l > len - done)
			l = len - done;
		p = (char *)iov[i].iov_base + off;
		if (op == IOV_TO_BUF)
			memcpy(buf + done, p, l);
		else if (op == IOV_FROM_BUF)
			memcpy(p, buf + done, l);
		else
			memset(p, c, l);
		done += l;
		off = 0;
	}
	return done;
}

size_t iov_to_buf(const struct iovec *iov, unsigned cnt, size_t off,
		  void *buf, size_t len)
{
	return iov_walk(iov, cnt, off, buf, 0, len, IOV_TO_BUF);
}

size_t iov_memset(const struct iovec *iov, unsigned cnt, size_t off, int c, size_t len)
{
	return iov_walk(iov, cnt, off, NULL, c, len, IOV_SET);
}

size_t iov_from_buf(const struct iovec *iov, unsigned cnt, size_t off,
		    const void *buf, size_t len)
{
	/* Only read through (IOV_FROM_BUF). */
	return iov_walk(iov, cnt, off, (char *)buf, 0, len, IOV_FROM_BUF);
}

size_t iov_discard_front(struct iovec **iovp, unsigned *cnt, size_t len)
{
	struct iovec *iov = *iovp;
	size_t done = 0;

	while (*cnt > 0 && done < len) {
		size_t want = len - done;

		if (iov->iov_len > want) {
			iov->iov_base = (char *)iov->iov_base + want;
			iov->iov_len -= want;
			done += want;
			break;
		}
		done += iov->iov_len;
		iov++;
		(*cnt)--;
	}
	*iovp = iov;
	return done;
}

size_t iov_discard_back(struct iovec *iov, unsigned *cnt, size_t len)
{
	size_t done = 0;

	while (*cnt > 0 && done < len) {
		struct iovec *last = &iov[*cnt - 1];
		size_t want = len - done;

		if (last->iov_len > want) {
			last->iov_len -= want;
			done += want;
			break;
		}
		done += last->iov_len;
		(*cnt)--;
	}
	return done;
}

unsigned iov_slice(const struct iovec *iov, unsigned cnt, size_t off, size_t len,
		   struct iovec *dst, unsigned max)
{
	unsigned n = 0;

	for (unsigned i = 0; i < cnt && len; i++) {
		size_t l = iov[i].iov_len, take;

		if (off >= l) {
			off -= l;
			continue;
		}
		if (n == max)
			return 0;
		take = l - off < len ? l - off : len;
		if (dst) {
			dst[n].iov_base = (char *)iov[i].iov_base + off;
			dst[n].iov_len = take;
		}
		n++;
		len -= take;
		off = 0;
	}
	return len ? 0 : n;
}

unsigned iov_slice_count(const struct iovec *iov, unsigned cnt, size_t off, size_t len)
{
	return iov_slice(iov, cnt, off, len, NULL, cnt);
}

bool buf_is_zero(const void *buf, size_t len)
{
	const unsigned char *p = buf;

	return !p[0] && !memcmp(p, p + 1, len - 1);
}
