#include "util/iov.h"

#include <string.h>

size_t iov_size(const struct iovec *iov, unsigned cnt)
{
	size_t n = 0;

	for (unsigned i = 0; i < cnt; i++)
		n += iov[i].iov_len;
	return n;
}

size_t iov_to_buf(const struct iovec *iov, unsigned cnt, size_t off,
		  void *buf, size_t len)
{
	size_t done = 0;

	for (unsigned i = 0; i < cnt && done < len; i++) {
		size_t l = iov[i].iov_len;

		if (off >= l) {
			off -= l;
			continue;
		}
		l -= off;
		if (l > len - done)
			l = len - done;
		memcpy((char *)buf + done, (char *)iov[i].iov_base + off, l);
		done += l;
		off = 0;
	}
	return done;
}

size_t iov_memset(const struct iovec *iov, unsigned cnt, size_t off, int c, size_t len)
{
	size_t done = 0;

	for (unsigned i = 0; i < cnt && done < len; i++) {
		size_t l = iov[i].iov_len;

		if (off >= l) {
			off -= l;
			continue;
		}
		l -= off;
		if (l > len - done)
			l = len - done;
		memset((char *)iov[i].iov_base + off, c, l);
		done += l;
		off = 0;
	}
	return done;
}

size_t iov_from_buf(const struct iovec *iov, unsigned cnt, size_t off,
		    const void *buf, size_t len)
{
	size_t done = 0;

	for (unsigned i = 0; i < cnt && done < len; i++) {
		size_t l = iov[i].iov_len;

		if (off >= l) {
			off -= l;
			continue;
		}
		l -= off;
		if (l > len - done)
			l = len - done;
		memcpy((char *)iov[i].iov_base + off, (const char *)buf + done, l);
		done += l;
		off = 0;
	}
	return done;
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
