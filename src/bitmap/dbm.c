/*
 * Dirty bitmaps (dbm.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bitmap/dbm.h"

bool dbm_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n > DBM_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-' || c == '.'))
			return false;
	}
	return true;
}

int dbm_new(const char *name, uint64_t size, uint32_t gran, struct dbm **out)
{
	struct dbm *b;
	uint64_t nwords;

	if (!dbm_name_ok(name) || gran < DBM_MIN_GRANULARITY_ANY || gran > DBM_MAX_GRANULARITY ||
	    (gran & (gran - 1)))
		return -EINVAL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	strcpy(b->name, name);
	b->size = size;
	b->gran_bits = (uint32_t)__builtin_ctz(gran);
	b->nbits = (size + gran - 1) >> b->gran_bits;
	nwords = (b->nbits + 63) / 64;
	b->words = calloc(nwords ? nwords : 1, sizeof(*b->words));
	if (!b->words) {
		free(b);
		return -ENOMEM;
	}
	atomic_init(&b->enabled, true);
	*out = b;
	return 0;
}

void dbm_free(struct dbm *b)
{
	if (!b)
		return;
	free((void *)b->words);
	free(b);
}

static bool bit(const struct dbm *b, uint64_t i)
{
	return atomic_load_explicit(&b->words[i / 64], memory_order_relaxed) >> (i % 64) & 1;
}

uint64_t dbm_dirty_bytes(const struct dbm *b)
{
	uint64_t n = 0, nwords = (b->nbits + 63) / 64;

	for (uint64_t w = 0; w < nwords; w++)
		n += (uint64_t)__builtin_popcountll(atomic_load_explicit(&b->words[w],
									 memory_order_relaxed));
	n <<= b->gran_bits;
	/* The last chunk covers only up to the size. */
	if (b->nbits && bit(b, b->nbits - 1))
		n -= ((uint64_t)b->nbits << b->gran_bits) - b->size;
	return n;
}

void dbm_clear(struct dbm *b)
{
	uint64_t nwords = (b->nbits + 63) / 64;

	for (uint64_t w = 0; w < nwords; w++)
		atomic_store_explicit(&b->words[w], 0, memory_order_relaxed);
}

void dbm_reset(struct dbm *b, uint64_t off, uint64_t len)
{
	uint64_t g = 1ull << b->gran_bits, first, end;

	if (!len || off >= b->size)
		return;
	if (len > b->size - off)
		len = b->size - off;
	first = (off + g - 1) >> b->gran_bits;
	/* The last chunk, clipped to the size, counts whole at the end. */
	end = off + len == b->size ? b->nbits : (off + len) >> b->gran_bits;
	for (uint64_t i = first; i < end; i++)
		atomic_fetch_and_explicit(&b->words[i / 64], ~(1ull << (i % 64)),
					  memory_order_relaxed);
}

bool dbm_extent(const struct dbm *b, uint64_t off, uint64_t max, uint64_t *len)
{
	uint64_t i = off >> b->gran_bits, end = off + max;
	bool dirty;

	/* Past the size (a disk grown before its bitmaps were, or whose
	 * bitmaps could not grow): dirty, what a backup must copy. */
	if (off >= b->size) {
		*len = max;
		return true;
	}
	dirty = bit(b, i);
	if (end > b->size || end < off)
		end = b->size;
	/* Whole words of the same state go at once. */
	for (i++; (i << b->gran_bits) < end; i++) {
		if (i % 64 == 0) {
			uint64_t w = atomic_load_explicit(&b->words[i / 64], memory_order_relaxed);

			if (w == (dirty ? ~0ull : 0) && ((i + 64) << b->gran_bits) <= end) {
				i += 63;
				continue;
			}
		}
		if (bit(b, i) != dirty)
			break;
	}
	*len = (i << b->gran_bits < end ? i << b->gran_bits : end) - off;
	return dirty;
}

void dbm_merge(struct dbm *dst, const struct dbm *src)
{
	for (uint64_t off = 0; off < src->size && off < dst->size;) {
		uint64_t len;

		/* A merge is not a write: a disabled dst takes it too. */
		if (dbm_extent(src, off, UINT64_MAX - off, &len))
			dbm_set(dst, off, len);
		off += len;
	}
}

struct dbm *dbm_grow(const struct dbm *b, uint64_t size)
{
	struct dbm *n;

	if (dbm_new(b->name, size, dbm_granularity(b), &n) < 0)
		return NULL;
	/* Same granularity, so the same bits; the grown part is clean. */
	memcpy((void *)n->words, (const void *)b->words, (b->nbits + 63) / 64 * 8);
	atomic_store(&n->enabled, atomic_load(&b->enabled));
	n->persistent = b->persistent;
	return n;
}
