/*
 * What a LUKS key derivation costs, known before it runs (issue 44).
 * Internal to src/format/ (luks.c is its one user).
 *
 * A keyslot's KDF runs for every passphrase tried, and its parameters
 * come from the image: anyone who can hand a VM an image can ask for
 * 2^32 PBKDF2 iterations (hours here) or 4 GiB of Argon2 memory.  So
 * each cost is estimated from the parameters and this machine's measured
 * rates, and what is over the bound is not run.  The estimate is a pure
 * function (luks_kdf_estimate, unit-tested alone); the rates are measured
 * once per process (luks_kdf_rates).
 *
 * Costs (cryptsetup's lib/crypto_backend/pbkdf_check.c measures the same
 * quantities to choose them):
 *   PBKDF2 (RFC 8018): iterations x ceil(out_len / hash length) HMAC
 *     chains; a rate in iterations of one chain per ms, per hash.
 *   Argon2i/id (RFC 9106): time cost x memory (KiB) block passes, spread
 *     over min(threads, CPUs) lanes; a rate in KiB-passes per ms on one
 *     CPU.
 */
#ifndef VBLK_FMT_LUKS_KDF_H
#define VBLK_FMT_LUKS_KDF_H

#include <stddef.h>
#include <stdint.h>

struct luks_kdf {
	const char *type;	/* "pbkdf2", "argon2i", "argon2id" */
	const char *hash;	/* pbkdf2: "sha256", ... */
	uint32_t iterations;	/* pbkdf2: iterations; argon2: time cost */
	uint32_t memory_kib;	/* argon2 */
	uint32_t threads;	/* argon2: parallel cost */
	size_t out_len;		/* bytes derived */
};

struct luks_kdf_rates {
	double pbkdf2_per_ms;	/* iterations of one chain per ms, k's hash */
	unsigned hash_len;	/* that hash's output, bytes */
	double argon2_per_ms;	/* KiB-passes per ms per CPU */
	unsigned cpus;		/* online CPUs */
};

struct luks_kdf_cost {
	uint64_t ms;		/* CPU time, wall clock at full parallelism */
	uint64_t kib;		/* memory */
};

/* k's cost at rates r.  0, or -EINVAL for a type it does not know (or a
 * rate of zero).  Any thread, no side effect. */
int luks_kdf_estimate(const struct luks_kdf *k, const struct luks_kdf_rates *r,
		      struct luks_kdf_cost *out);

/* This machine's rates for k (PBKDF2: k->hash's, measured the first time a
 * hash is asked for, ~10 ms; Argon2: measured once, ~20 ms).  A hash
 * OpenSSL does not offer is measured as SHA-512 (the slowest of the
 * common ones per byte here): 0 and *r, or -errno.  Main thread. */
int luks_kdf_rates(const struct luks_kdf *k, struct luks_kdf_rates *r);

/* "3.2 s", "41 min", "2.1 h": a cost for a log line. */
void luks_kdf_ms_str(uint64_t ms, char *buf, size_t len);

#endif
