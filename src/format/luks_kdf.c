/*
 * LUKS key derivation costs: estimated from a keyslot's parameters and
 * rates measured here (luks_kdf.h).
 */
#include <argon2.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "format/luks_kdf.h"
#include "util/compiler.h"
#include "util/sys.h"

/* One pass over 4 MiB: ~20 ms.  A single pass is the slowest per KiB
 * (the memory is first touched in it): measured here, 200 KiB/ms for one
 * pass over 4 MiB, 178 over 1 GiB, 514 for four passes over 426 MiB; so
 * the estimate leans high for the keyslots cryptsetup makes (4.4 s
 * estimated, 4.1 s taken for its default Argon2id on these 2 CPUs). */
#define ARGON2_PROBE_KIB 4096u

static bool is_argon2(const char *type)
{
	return !strcmp(type, "argon2i") || !strcmp(type, "argon2id");
}

int luks_kdf_estimate(const struct luks_kdf *k, const struct luks_kdf_rates *r,
		      struct luks_kdf_cost *out)
{
	double ms;

	if (!k->type)
		return -EINVAL;
	if (!strcmp(k->type, "pbkdf2")) {
		unsigned chains;

		if (r->pbkdf2_per_ms <= 0 || !r->hash_len)
			return -EINVAL;
		chains = (unsigned)((MAX(k->out_len, (size_t)1) + r->hash_len - 1) / r->hash_len);
		ms = (double)k->iterations * chains / r->pbkdf2_per_ms;
		out->kib = 0;
	} else if (is_argon2(k->type)) {
		unsigned lanes = MAX(1u, MIN(k->threads, MAX(r->cpus, 1u)));

		if (r->argon2_per_ms <= 0)
			return -EINVAL;
		ms = (double)k->iterations * k->memory_kib / r->argon2_per_ms / lanes;
		out->kib = k->memory_kib;
	} else {
		return -EINVAL;
	}
	out->ms = ms >= (double)UINT64_MAX ? UINT64_MAX : (uint64_t)ceil(ms);
	return 0;
}

/* ---- Measured here ------------------------------------------------------ */

static double ms_since(uint64_t t0)
{
	return (double)(sys_now_ns() - t0) / 1e6;
}

/* Iterations of one PBKDF2 chain per ms with md: doubled until a run
 * takes 5 ms.  0 when OpenSSL cannot run it. */
static double pbkdf2_measure(const EVP_MD *md)
{
	static const char pass[] = "vblkd kdf probe";
	unsigned char salt[32] = { 0 }, out[64];
	int len = EVP_MD_get_size(md);

	if (len <= 0 || len > (int)sizeof(out))
		return 0;
	for (int iter = 1024; iter <= (1 << 24); iter *= 2) {
		uint64_t t0 = sys_now_ns();
		double ms;

		if (PKCS5_PBKDF2_HMAC(pass, sizeof(pass) - 1, salt, sizeof(salt), iter, md, len,
				      out) != 1)
			return 0;
		ms = ms_since(t0);
		if (ms >= 5.0)
			return iter / ms;
	}
	return 0;
}

static struct {
	char hash[32];
	double rate;
	unsigned len;
} pbkdf2_seen[8];
static unsigned pbkdf2_nseen;
static double argon2_rate;

/* Rate and output length for hash, measured once. */
static int pbkdf2_rate(const char *hash, double *rate, unsigned *len)
{
	const EVP_MD *md = EVP_get_digestbyname(hash);

	for (unsigned i = 0; i < pbkdf2_nseen; i++)
		if (!strcasecmp(pbkdf2_seen[i].hash, hash)) {
			*rate = pbkdf2_seen[i].rate;
			*len = pbkdf2_seen[i].len;
			return 0;
		}
	*rate = md ? pbkdf2_measure(md) : 0;
	if (*rate <= 0) {
		/* Not one OpenSSL runs (whirlpool, stribog without the
		 * legacy provider): counted as SHA-512, as slow a common hash
		 * as any per byte here, 64-byte chains. */
		md = EVP_get_digestbyname("sha512");
		*rate = md ? pbkdf2_measure(md) : 0;
		if (*rate <= 0)
			return -ENOTSUP;
	}
	*len = (unsigned)EVP_MD_get_size(md);
	if (pbkdf2_nseen < ARRAY_SIZE(pbkdf2_seen)) {
		snprintf(pbkdf2_seen[pbkdf2_nseen].hash, sizeof(pbkdf2_seen[0].hash), "%s", hash);
		pbkdf2_seen[pbkdf2_nseen].rate = *rate;
		pbkdf2_seen[pbkdf2_nseen].len = *len;
		pbkdf2_nseen++;
	}
	return 0;
}

/* KiB-passes per ms on one CPU: one pass over ARGON2_PROBE_KIB (~20 ms). */
static double argon2_measure(void)
{
	static const char pass[] = "vblkd kdf probe";
	unsigned char salt[16] = { 0 }, out[32];
	uint64_t t0 = sys_now_ns();
	double ms;

	if (argon2id_hash_raw(1, ARGON2_PROBE_KIB, 1, pass, sizeof(pass) - 1, salt, sizeof(salt),
			      out, sizeof(out)) != ARGON2_OK)
		return 0;
	ms = ms_since(t0);
	return ms > 0 ? ARGON2_PROBE_KIB / ms : 0;
}

int luks_kdf_rates(const struct luks_kdf *k, struct luks_kdf_rates *r)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	*r = (struct luks_kdf_rates){ .cpus = cpus > 0 ? (unsigned)cpus : 1 };
	if (k->type && !strcmp(k->type, "pbkdf2"))
		return pbkdf2_rate(k->hash ? k->hash : "sha256", &r->pbkdf2_per_ms, &r->hash_len);
	if (k->type && is_argon2(k->type)) {
		if (argon2_rate <= 0)
			argon2_rate = argon2_measure();
		r->argon2_per_ms = argon2_rate;
		return argon2_rate > 0 ? 0 : -ENOTSUP;
	}
	return -EINVAL;
}

void luks_kdf_ms_str(uint64_t ms, char *buf, size_t len)
{
	if (ms < 60000)
		snprintf(buf, len, "%.1f s", ms / 1000.0);
	else if (ms < 3600000)
		snprintf(buf, len, "%.0f min", ms / 60000.0);
	else if (ms < 86400000ull * 2)
		snprintf(buf, len, "%.1f h", ms / 3600000.0);
	else
		snprintf(buf, len, "%.0f days", ms / 86400000.0);
}
