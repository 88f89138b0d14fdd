/*
 * Description: the cost of a LUKS keyslot's key derivation, estimated from
 * its parameters before it runs (format/luks_kdf.h): PBKDF2 scales with
 * iterations and the chains its output needs, Argon2 with passes x memory
 * over the lanes the CPUs can run; a type it does not know has no
 * estimate; the rates measured here are positive.
 */
#include <errno.h>

#include "test.h"

#ifdef HAVE_LUKS
#include "format/luks_kdf.h"

static const struct luks_kdf_rates rates = {
	.pbkdf2_per_ms = 2000, .hash_len = 32, .argon2_per_ms = 200, .cpus = 2,
};

static void test_pbkdf2_scales_with_iterations_and_chains(void)
{
	struct luks_kdf k = { .type = "pbkdf2", .hash = "sha256", .iterations = 2000000,
			      .out_len = 32 };
	struct luks_kdf_cost c;

	ASSERT_EQ(luks_kdf_estimate(&k, &rates, &c), 0);
	ASSERT_EQ(c.ms, 1000);
	ASSERT_EQ(c.kib, 0);
	k.out_len = 64;			/* a 512-bit key: two chains of SHA-256 */
	ASSERT_EQ(luks_kdf_estimate(&k, &rates, &c), 0);
	ASSERT_EQ(c.ms, 2000);
	k.iterations = UINT32_MAX;	/* the hostile one: hours, not an overflow */
	ASSERT_EQ(luks_kdf_estimate(&k, &rates, &c), 0);
	ASSERT_TRUE(c.ms > 3600ull * 1000);
}

static void test_argon2_scales_with_passes_memory_and_lanes(void)
{
	struct luks_kdf k = { .type = "argon2id", .iterations = 4, .memory_kib = 1u << 20,
			      .threads = 4, .out_len = 64 };
	struct luks_kdf_cost c;

	ASSERT_EQ(luks_kdf_estimate(&k, &rates, &c), 0);
	/* 4 x 1 GiB at 200 KiB/ms, over 2 lanes (2 CPUs, not 4 threads) */
	ASSERT_EQ(c.ms, 4ull * (1u << 20) / 200 / 2 + 1);
	ASSERT_EQ(c.kib, 1u << 20);
	k.threads = 1;
	ASSERT_EQ(luks_kdf_estimate(&k, &rates, &c), 0);
	ASSERT_EQ(c.ms, 4ull * (1u << 20) / 200 + 1);
	k.type = "argon2i";
	ASSERT_EQ(luks_kdf_estimate(&k, &rates, &c), 0);
	k.threads = 0;			/* a header's 0: one lane, not a division by 0 */
	ASSERT_EQ(luks_kdf_estimate(&k, &rates, &c), 0);
	ASSERT_EQ(c.ms, 4ull * (1u << 20) / 200 + 1);
}

static void test_unknown_kdf_has_no_estimate(void)
{
	struct luks_kdf k = { .type = "scrypt", .iterations = 1 };
	struct luks_kdf_rates none = { 0 };
	struct luks_kdf_cost c;

	ASSERT_EQ(luks_kdf_estimate(&k, &rates, &c), -EINVAL);
	k.type = NULL;
	ASSERT_EQ(luks_kdf_estimate(&k, &rates, &c), -EINVAL);
	k.type = "pbkdf2";
	ASSERT_EQ(luks_kdf_estimate(&k, &none, &c), -EINVAL);
}

static void test_rates_measured_here(void)
{
	struct luks_kdf p = { .type = "pbkdf2", .hash = "sha256" };
	struct luks_kdf w = { .type = "pbkdf2", .hash = "no-such-hash" };
	struct luks_kdf a = { .type = "argon2id" };
	struct luks_kdf_rates r;

	ASSERT_EQ(luks_kdf_rates(&p, &r), 0);
	ASSERT_TRUE(r.pbkdf2_per_ms > 0 && r.hash_len == 32 && r.cpus >= 1);
	/* Unknown to OpenSSL: measured as SHA-512. */
	ASSERT_EQ(luks_kdf_rates(&w, &r), 0);
	ASSERT_TRUE(r.pbkdf2_per_ms > 0 && r.hash_len == 64);
	ASSERT_EQ(luks_kdf_rates(&a, &r), 0);
	ASSERT_TRUE(r.argon2_per_ms > 0);
}

int main(void)
{
	RUN(test_pbkdf2_scales_with_iterations_and_chains);
	RUN(test_argon2_scales_with_passes_memory_and_lanes);
	RUN(test_unknown_kdf_has_no_estimate);
	RUN(test_rates_measured_here);
	return T_EXIT_PASS;
}
#else
int main(void)
{
	return T_EXIT_SKIP;
}
#endif
