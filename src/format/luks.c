/*
 * LUKS: the payload of a LUKS1/LUKS2 disk, encrypted with aes-xts-plain64
 * (luks.h).  Headers and keyslots are libcryptsetup's (crypt_load,
 * crypt_volume_key_get: no device-mapper); the data path is ours, one
 * cipher context per iothread, so queues on several iothreads spread the
 * crypto over cores.  Writes are encrypted into a bounce buffer (guest
 * memory is never changed by a write); reads are decrypted in place in
 * the guest's buffers once the file's engine completed them.
 *
 * The volume key lives in one locked page excluded from core dumps
 * (mlock, MADV_DONTDUMP), wiped at close; the passphrase only for the
 * time libcryptsetup needs it.  Nothing of either is logged.  OpenSSL's
 * own allocations (the cipher contexts hold the expanded key, whose first
 * round keys are the key itself) come from an arena excluded from core
 * dumps too, each block wiped when freed (secmem_*, installed before
 * main with CRYPTO_set_mem_functions).
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <libcryptsetup.h>
#include <openssl/core.h>
#include <openssl/core_dispatch.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/provider.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/bdev.h"
#include "format/format.h"
#include "format/luks.h"
#include "format/luks_kdf.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/sys.h"

#define LUKS_MAX_KEY_FILE (8u << 20)	/* cryptsetup's default limit */
#define LUKS_MAX_KEY_BYTES 512u		/* a keyslot's keys: 4096 bits at most */

/*
 * AES-XTS, called as libcrypto's EVP layer calls it: the functions of the
 * provider that EVP_CIPHER_fetch finds for the cipher (provider-cipher(7):
 * newctx, encrypt_init/decrypt_init with only an IV for each sector,
 * cipher), without EVP's per-call bookkeeping, which is more than the AES
 * of a 512-byte sector (EVP_CipherInit_ex2 + EVP_Cipher ~300 ns a sector
 * here, these ~165 ns; docs/benchmarks.md "Issue 31").  The same provider
 * and code as EVP would run: only the glue is left out.
 */
struct xts_fns {
	EVP_CIPHER *ci;		/* kept: holds the provider loaded */
	void *provctx;
	OSSL_FUNC_cipher_newctx_fn *newctx;
	OSSL_FUNC_cipher_freectx_fn *freectx;
	OSSL_FUNC_cipher_encrypt_init_fn *einit;
	OSSL_FUNC_cipher_decrypt_init_fn *dinit;
	OSSL_FUNC_cipher_cipher_fn *cipher;
};

struct luks {
	struct bdev disk;	/* first: container_of */
	struct bdev_engine eng;
	struct bdev *file;
	uint8_t *key;		/* one locked page */
	size_t key_len;		/* 32 (AES-128-XTS) or 64 (AES-256-XTS) */
	uint64_t data_off;	/* payload start, bytes */
	uint64_t iv_off;	/* added to the 512-byte sector number */
	unsigned sector;	/* encryption sector: 512..4096 */
	int version;		/* 1 or 2 */
	/* A sector no one wrote reads as zeroes, not as zeroes decrypted
	 * (librbd's encryption: RBD images, see luks_open). */
	bool holes_zero;
	struct xts_fns xts;
};

struct luks_req {
	struct bdev_io sub;
	struct bdev_io *io;
	struct luks_ctx *c;
	uint8_t *bounce;
	size_t cap;
	struct iovec one;
	struct luks_req *next;
};

struct luks_ctx {
	struct luks *l;
	struct bdev_ctx *fctx;
	void *enc, *dec;	/* the provider's cipher contexts, key set */
	struct luks_req *free;
	uint8_t scratch[4096];	/* a sector across iovecs */
};

static const uint8_t magic[6] = { 'L', 'U', 'K', 'S', 0xba, 0xbe };
static const uint8_t magic2[6] = { 'S', 'K', 'U', 'L', 0xba, 0xbe };	/* LUKS2 secondary */
/* cryptsetup's lib/luks2/luks2.h, LUKS2_HDR2_OFFSETS (libblkid's too). */
static const uint64_t hdr2_offsets[] = { 0x4000, 0x8000, 0x10000, 0x20000, 0x40000,
					 0x80000, 0x100000, 0x200000, 0x400000 };

/* A LUKS2 secondary header at off: its magic, version 2, and both its
 * hdr_size (at 8) and hdr_offset (at 256, on-disk-format-luks2.pdf) saying
 * it starts right after a primary of that size. */
static bool secondary_at(const uint8_t *b, uint64_t off)
{
	uint64_t size, at;

	memcpy(&size, b + 8, 8);
	memcpy(&at, b + 256, 8);
	return !memcmp(b, magic2, sizeof(magic2)) && b[6] == 0 && b[7] == 2 &&
	       be64toh(size) == off && be64toh(at) == off;
}

uint64_t luks_probe_secondary(struct bdev *file)
{
	uint8_t *b;
	uint64_t found = 0;

	if (posix_memalign((void **)&b, 4096, 4096))
		return 0;
	for (size_t i = 0; i < ARRAY_SIZE(hdr2_offsets) && !found; i++)
		if (hdr2_offsets[i] + 4096 <= file->size &&
		    bdev_pread(file, b, 4096, hdr2_offsets[i]) == 0 &&
		    secondary_at(b, hdr2_offsets[i]))
			found = hdr2_offsets[i];
	free(b);
	return found;
}

/* ---- OpenSSL's memory, out of core dumps --------------------------------
 * A bump arena (MADV_DONTDUMP, reserved not committed) with free lists by
 * power-of-two size: OpenSSL allocates a few hundred blocks at start and
 * per cipher context, none per request.  Blocks are wiped when freed.  Past
 * the arena, plain malloc (noted at open: such memory may be dumped). */
#define SECMEM_ARENA (64u << 20)
#define SECMEM_CLASSES 27		/* 16 B .. 1 GiB */

struct secmem_hdr {
	size_t cls;			/* SECMEM_CLASSES: a malloc block */
	size_t len;			/* asked for */
};

static struct {
	pthread_mutex_t lock;
	uint8_t *base;
	size_t used;
	void *free[SECMEM_CLASSES];
	bool on, spilled;
} secmem = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void *secmem_malloc(size_t n, const char *file, int line)
{
	struct secmem_hdr *h = NULL;
	size_t cls = 0;

	(void)file;
	(void)line;
	while (cls < SECMEM_CLASSES - 1 && (16ul << cls) < n)
		cls++;
	pthread_mutex_lock(&secmem.lock);
	if (secmem.free[cls]) {
		h = secmem.free[cls];
		secmem.free[cls] = *(void **)(h + 1);
	} else if (n <= (16ul << cls) &&
		   secmem.used + sizeof(*h) + (16ul << cls) <= SECMEM_ARENA) {
		h = (struct secmem_hdr *)(secmem.base + secmem.used);
		secmem.used += sizeof(*h) + (16ul << cls);
	}
	if (!h)
		secmem.spilled = true;
	pthread_mutex_unlock(&secmem.lock);
	if (!h) {
		h = malloc(sizeof(*h) + n);
		if (!h)
			return NULL;
		cls = SECMEM_CLASSES;
	}
	h->cls = cls;
	h->len = n;
	return h + 1;
}

static void secmem_free(void *p, const char *file, int line)
{
	struct secmem_hdr *h;

	(void)file;
	(void)line;
	if (!p)
		return;
	h = (struct secmem_hdr *)p - 1;
	explicit_bzero(p, h->len);
	if (h->cls == SECMEM_CLASSES) {
		free(h);
		return;
	}
	pthread_mutex_lock(&secmem.lock);
	*(void **)p = secmem.free[h->cls];
	secmem.free[h->cls] = h;
	pthread_mutex_unlock(&secmem.lock);
}

static void *secmem_realloc(void *p, size_t n, const char *file, int line)
{
	void *q;

	if (!p)
		return secmem_malloc(n, file, line);
	if (!n) {
		secmem_free(p, file, line);
		return NULL;
	}
	q = secmem_malloc(n, file, line);
	if (q) {
		size_t had = ((struct secmem_hdr *)p - 1)->len;

		memcpy(q, p, MIN(had, n));
		secmem_free(p, file, line);
	}
	return q;
}

__attribute__((constructor)) static void secmem_init(void)
{
	void *m = mmap(NULL, SECMEM_ARENA, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (m == MAP_FAILED)
		return;
	if (madvise(m, SECMEM_ARENA, MADV_DONTDUMP) < 0 ||
	    !CRYPTO_set_mem_functions(secmem_malloc, secmem_realloc, secmem_free)) {
		munmap(m, SECMEM_ARENA);	/* OpenSSL allocated already */
		return;
	}
	secmem.base = m;
	secmem.on = true;
}

bool luks_detect(const void *buf, size_t len)
{
	return len >= sizeof(magic) && !memcmp(buf, magic, sizeof(magic));
}

/* ---- The data path ---------------------------------------------------- */

/* A sector of ciphertext that is all zeroes: never written (real
 * ciphertext is all zeroes with probability 2^-4096 at the least).  The
 * first word almost always says no. */
static bool zero_sector(const uint8_t *p, unsigned n)
{
	uint64_t w;

	for (unsigned i = 0; i < n; i += 8) {
		memcpy(&w, p + i, 8);
		if (w)
			return false;
	}
	return true;
}

/* One sector, from in to out (the same or apart): plain64, the 512-byte
 * sector number of guest offset off, little-endian, zero-padded to 16
 * bytes. */
static int crypt_one(struct luks_ctx *c, bool enc, uint8_t *out, const uint8_t *in, uint64_t off)
{
	const struct xts_fns *f = &c->l->xts;
	uint8_t iv[16] = { 0 };
	uint64_t n = htole64((off >> 9) + c->l->iv_off);
	size_t outl;

	if (!enc && c->l->holes_zero && zero_sector(in, c->l->sector)) {
		if (out != in)
			memset(out, 0, c->l->sector);
		return 0;
	}
	memcpy(iv, &n, 8);
	if ((enc ? f->einit(c->enc, NULL, 0, iv, sizeof(iv), NULL) :
		   f->dinit(c->dec, NULL, 0, iv, sizeof(iv), NULL)) != 1 ||
	    f->cipher(enc ? c->enc : c->dec, out, &outl, c->l->sector, in, c->l->sector) != 1 ||
	    outl != c->l->sector)
		return -EIO;
	return 0;
}

/* Every sector of [off, off+len) held in iov: in place (out NULL), or
 * into out, one buffer of len bytes (a write's bounce: the guest's
 * buffers are never changed by a write). */
static int crypt_iov(struct luks_ctx *c, bool enc, const struct iovec *iov, unsigned iovcnt,
		     uint64_t off, size_t len, uint8_t *out)
{
	unsigned ss = c->l->sector, i = 0;
	size_t in = 0;		/* offset in iov[i] */

	for (size_t pos = 0; pos < len; pos += ss) {
		while (i < iovcnt && in == iov[i].iov_len) {
			i++;
			in = 0;
		}
		if (i == iovcnt)
			return -EINVAL;
		if (iov[i].iov_len - in >= ss) {
			uint8_t *p = (uint8_t *)iov[i].iov_base + in;

			if (crypt_one(c, enc, out ? out + pos : p, p, off + pos) < 0)
				return -EIO;
			in += ss;
			continue;
		}
		/* Across iovecs: through the scratch sector. */
		iov_to_buf(iov, iovcnt, pos, c->scratch, ss);
		if (crypt_one(c, enc, out ? out + pos : c->scratch, c->scratch, off + pos) < 0)
			return -EIO;
		if (!out)
			iov_from_buf(iov, iovcnt, pos, c->scratch, ss);
		/* Where the next sector starts. */
		{
			size_t left = ss;

			while (left) {
				size_t k = MIN(left, iov[i].iov_len - in);

				left -= k;
				in += k;
				if (in == iov[i].iov_len && left) {
					i++;
					in = 0;
				}
			}
		}
	}
	return 0;
}

static void req_put(struct luks_req *r)
{
	r->next = r->c->free;
	r->c->free = r;
}

static void sub_done(struct bdev_io *sub, int res)
{
	struct luks_req *r = container_of(sub, struct luks_req, sub);
	struct bdev_io *io = r->io;

	if (res == 0 && io->op == BDEV_READ)
		res = crypt_iov(r->c, false, io->iov, io->iovcnt, io->offset, io->len, NULL);
	req_put(r);
	bdev_complete(io, res);
}

static void luks_submit(struct bdev_ctx *bc, struct bdev_io *io)
{
	struct luks_ctx *c = (struct luks_ctx *)bc;
	struct luks *l = c->l;
	struct luks_req *r = c->free;
	size_t len = io->len;
	int res;

	if (io->op != BDEV_READ && io->op != BDEV_WRITE && io->op != BDEV_FLUSH) {
		bdev_complete(io, -EOPNOTSUPP);
		return;
	}
	if (io->op != BDEV_FLUSH &&
	    (len == 0 || io->offset > l->disk.size || len > l->disk.size - io->offset ||
	     (io->offset | len) % l->sector)) {
		bdev_complete(io, len ? -EINVAL : 0);
		return;
	}
	if (r) {
		c->free = r->next;
	} else if (!(r = calloc(1, sizeof(*r)))) {
		bdev_complete(io, -ENOMEM);
		return;
	}
	r->c = c;
	r->io = io;
	r->sub = (struct bdev_io){ .op = io->op, .fua = io->fua, .cb = sub_done,
				   .offset = io->op == BDEV_FLUSH ? 0 : io->offset + l->data_off,
				   .iov = io->iov, .iovcnt = io->iovcnt };
	if (io->op == BDEV_WRITE) {
		if (r->cap < len) {
			free(r->bounce);
			r->cap = 0;
			if (posix_memalign((void **)&r->bounce, 4096, len)) {
				r->bounce = NULL;
				req_put(r);
				bdev_complete(io, -ENOMEM);
				return;
			}
			r->cap = len;
		}
		r->one = (struct iovec){ r->bounce, len };
		if ((res = crypt_iov(c, true, io->iov, io->iovcnt, io->offset, len, r->bounce)) < 0) {
			req_put(r);
			bdev_complete(io, res);
			return;
		}
		r->sub.iov = &r->one;
		r->sub.iovcnt = 1;
	}
	bdev_submit(l->file, c->fctx, &r->sub);
}

static int luks_ctx_new(struct bdev *b, struct loop *lp, unsigned depth, struct bdev_ctx **out)
{
	struct luks *l = container_of(b, struct luks, disk);
	const struct xts_fns *f = &l->xts;
	struct luks_ctx *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->l = l;
	c->enc = f->newctx(f->provctx);
	c->dec = f->newctx(f->provctx);
	if (!c->enc || !c->dec || f->einit(c->enc, l->key, l->key_len, NULL, 0, NULL) != 1 ||
	    f->dinit(c->dec, l->key, l->key_len, NULL, 0, NULL) != 1) {
		r = -EIO;
		goto fail;
	}
	if ((r = bdev_ctx_new(l->file, lp, depth, &c->fctx)) < 0)
		goto fail;
	*out = (struct bdev_ctx *)c;
	return 0;
fail:
	if (c->enc)
		f->freectx(c->enc);
	if (c->dec)
		f->freectx(c->dec);
	free(c);
	return r;
}

static void luks_ctx_free(struct bdev_ctx *bc)
{
	struct luks_ctx *c = (struct luks_ctx *)bc;

	c->l->file->engine->ctx_free(c->fctx);
	while (c->free) {
		struct luks_req *r = c->free;

		c->free = r->next;
		free(r->bounce);
		free(r);
	}
	/* The provider's freectx wipes the expanded key (OPENSSL_clear_free). */
	c->l->xts.freectx(c->enc);
	c->l->xts.freectx(c->dec);
	explicit_bzero(c->scratch, sizeof(c->scratch));
	free(c);
}

static void luks_kick(struct bdev_ctx *bc)
{
	struct luks_ctx *c = (struct luks_ctx *)bc;

	c->l->file->engine->kick(c->fctx);
}

static void luks_drain(struct bdev_ctx *bc)
{
	struct luks_ctx *c = (struct luks_ctx *)bc;

	c->l->file->engine->drain(c->fctx);
}

static uint64_t luks_submits(const struct bdev_ctx *bc)
{
	const struct luks_ctx *c = (const struct luks_ctx *)bc;

	return bdev_ctx_submits(c->l->file, c->fctx);
}

static uint64_t luks_polled(const struct bdev_ctx *bc)
{
	const struct luks_ctx *c = (const struct luks_ctx *)bc;

	return bdev_ctx_polled(c->l->file, c->fctx);
}

static uint64_t luks_sync_ios(const struct bdev_ctx *bc)
{
	const struct luks_ctx *c = (const struct luks_ctx *)bc;

	return bdev_ctx_sync_ios(c->l->file, c->fctx);
}

static void luks_spin_stats(const struct bdev_ctx *bc, struct bdev_spin_stats *s)
{
	const struct luks_ctx *c = (const struct luks_ctx *)bc;

	bdev_ctx_spin_stats(c->l->file, c->fctx, s);
}

bool luks_is(const struct bdev_engine *e)
{
	return e && e->ctx_new == luks_ctx_new;
}

/* ---- Opening ------------------------------------------------------------ */

static void cs_log(int level, const char *msg, void *usr)
{
	(void)usr;
	/* libcryptsetup's own lines (never key material) at debug. */
	if (level == CRYPT_LOG_ERROR)
		log_debug("libcryptsetup: %.*s", (int)strcspn(msg, "\n"), msg);
}

/* The key file: PATH, "-" for stdin, or a systemd credential (a bare name
 * found in $CREDENTIALS_DIRECTORY, LoadCredential=).  Read whole, as
 * cryptsetup --key-file does, into locked memory. */
static int read_key_file(const char *name, char **out, size_t *outlen, char *err,
			 size_t errlen)
{
	const char *cred = getenv("CREDENTIALS_DIRECTORY");
	char path[4096];
	size_t len = 0;
	char *buf;
	int fd, r = 0;

	if (!strcmp(name, "-")) {
		fd = STDIN_FILENO;
		snprintf(path, sizeof(path), "standard input");
	} else {
		if (!strchr(name, '/') && cred &&
		    (size_t)snprintf(path, sizeof(path), "%s/%s", cred, name) < sizeof(path) &&
		    access(path, R_OK) == 0)
			;
		else
			snprintf(path, sizeof(path), "%s", name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			r = -errno;
			snprintf(err, errlen, "cannot open the key file %s: %s", path, strerror(-r));
			return r;
		}
	}
	buf = mmap(NULL, LUKS_MAX_KEY_FILE, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (buf == MAP_FAILED) {
		r = -ENOMEM;
		goto out;
	}
	(void)madvise(buf, LUKS_MAX_KEY_FILE, MADV_DONTDUMP);
	for (;;) {
		ssize_t n = read(fd, buf + len, LUKS_MAX_KEY_FILE - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			snprintf(err, errlen, "cannot read the key file %s: %s", path, strerror(-r));
			break;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len == LUKS_MAX_KEY_FILE) {
			r = -EFBIG;
			snprintf(err, errlen, "the key file %s is larger than %u MiB", path,
				 LUKS_MAX_KEY_FILE >> 20);
			break;
		}
	}
	if (r == 0 && len == 0) {
		r = -EINVAL;
		snprintf(err, errlen, "the key file %s is empty", path);
	}
	if (r < 0) {
		explicit_bzero(buf, len);
		munmap(buf, LUKS_MAX_KEY_FILE);
	} else {
		*out = buf;
		*outlen = len;
	}
out:
	if (fd != STDIN_FILENO)
		close(fd);
	return r;
}

static void key_wipe(char *pass, size_t len)
{
	explicit_bzero(pass, len);
	munmap(pass, LUKS_MAX_KEY_FILE);
}

/* Upgrade in place: the key into a memfd no one else can change (the
 * fd goes over the handover socket, never a path), read straight into
 * the new process's locked page (key_take). */
int luks_key_export(const struct bdev *disk)
{
	const struct luks *l = container_of(disk, const struct luks, disk);
	int fd = memfd_create("vblkd-volume-key", MFD_CLOEXEC | MFD_ALLOW_SEALING), r;

	if (fd < 0)
		return -errno;
	errno = 0;
	if (pwrite(fd, l->key, l->key_len, 0) != (ssize_t)l->key_len ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0) {
		r = errno ? -errno : -EIO;
		close(fd);
		return r;
	}
	return fd;
}

static int key_take(int fd, uint8_t *key, size_t len, const char *path, char *err,
		    size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st) < 0 || st.st_size != (off_t)len ||
	    pread(fd, key, len, 0) != (ssize_t)len) {
		snprintf(err, errlen, "the volume key of LUKS disk %s did not come over from the "
			 "old vblkd whole (%zu bytes expected)", path, len);
		return -EPROTO;
	}
	return 0;
}

/* name in an OSSL_ALGORITHM's list of names ("A:B:C"), any case. */
static bool names_have(const char *names, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = names; p; p = strchr(p, ':'), p = p ? p + 1 : NULL)
		if (!strncasecmp(p, name, n) && (p[n] == ':' || p[n] == '\0'))
			return true;
	return false;
}

/* The provider functions of AES-XTS with a key of key_len bytes (struct
 * xts_fns).  0, or -errno with one line in err.  Main thread. */
static int xts_fetch(struct xts_fns *f, size_t key_len, char *err, size_t errlen)
{
	const char *name = key_len == 64 ? "AES-256-XTS" : "AES-128-XTS";
	const OSSL_ALGORITHM *algs, *a;
	const OSSL_DISPATCH *d = NULL;
	const OSSL_PROVIDER *prov;
	int no_store;

	memset(f, 0, sizeof(*f));
	f->ci = EVP_CIPHER_fetch(NULL, name, NULL);
	prov = f->ci ? EVP_CIPHER_get0_provider(f->ci) : NULL;
	algs = prov ? OSSL_PROVIDER_query_operation(prov, OSSL_OP_CIPHER, &no_store) : NULL;
	for (a = algs; a && a->algorithm_names; a++)
		if (names_have(a->algorithm_names, name)) {
			d = a->implementation;
			break;
		}
	for (; d && d->function_id; d++) {
		switch (d->function_id) {
		case OSSL_FUNC_CIPHER_NEWCTX:
			f->newctx = OSSL_FUNC_cipher_newctx(d);
			break;
		case OSSL_FUNC_CIPHER_FREECTX:
			f->freectx = OSSL_FUNC_cipher_freectx(d);
			break;
		case OSSL_FUNC_CIPHER_ENCRYPT_INIT:
			f->einit = OSSL_FUNC_cipher_encrypt_init(d);
			break;
		case OSSL_FUNC_CIPHER_DECRYPT_INIT:
			f->dinit = OSSL_FUNC_cipher_decrypt_init(d);
			break;
		case OSSL_FUNC_CIPHER_CIPHER:
			f->cipher = OSSL_FUNC_cipher_cipher(d);
			break;
		}
	}
	if (algs)
		OSSL_PROVIDER_unquery_operation(prov, OSSL_OP_CIPHER, algs);
	if (!f->newctx || !f->freectx || !f->einit || !f->dinit || !f->cipher) {
		snprintf(err, errlen, "OpenSSL offers no %s here (%s): check its configuration "
			 "(openssl list -cipher-algorithms)", name,
			 f->ci ? "its provider lacks a function" : "no provider has it");
		EVP_CIPHER_free(f->ci);
		f->ci = NULL;
		return -EOPNOTSUPP;
	}
	f->provctx = OSSL_PROVIDER_get0_provider_ctx(prov);
	return 0;
}

/*
 * libcryptsetup reads a private copy of the header, never the disk (issue
 * 44).  It writes a device it can write: crypt_load "repairs" a damaged
 * LUKS2 header from its other copy (LUKS2 header auto-recovery), and did
 * write some images it then refused; the image is the operator's, and
 * cryptsetup repair or a forensic copy needs it as it was.  So the header
 * and keyslots are copied into a memfd, whose /proc/self/fd path
 * crypt_init takes; a network disk (NBD, RBD), which has no path, was
 * read this way already (librbd reads its own LUKS headers the same way).
 * What to copy comes from the binary header (cryptsetup's
 * docs/on-disk-format.pdf for LUKS1: payload-offset, in 512-byte sectors,
 * at 104; docs/on-disk-format-luks2.pdf: hdr_size at 8, and the keyslots
 * area, which libcryptsetup reports, after both header copies); each size
 * is checked against the disk and LUKS_MAX_HDR.  The memfd is as large as
 * the disk up to LUKS_MAX_HDR (sparse), so the size checks libcryptsetup
 * makes at load pass.
 */
#define LUKS_MAX_HDR (136u << 20)	/* LUKS2: 2 x 4 MiB headers + 128 MiB keyslots */

/* Where the header is read from: a file's own plain read-only open (no
 * O_DIRECT alignment to meet), or a network engine's synchronous read. */
struct hdr_src {
	struct bdev *file;
	int fd;			/* -1: bdev_pread */
};

static int src_read(const struct hdr_src *s, void *buf, size_t len, uint64_t off)
{
	return s->fd >= 0 ? sys_pread_full(s->fd, buf, len, off) :
			    bdev_pread(s->file, buf, len, off);
}

static int copy_range(const struct hdr_src *s, int fd, uint64_t from, uint64_t to,
		      uint8_t *buf, size_t cap)
{
	while (from < to) {
		size_t n = (size_t)MIN((uint64_t)cap, to - from);
		int r = src_read(s, buf, n, from);

		if (r < 0)
			return r;
		if ((r = sys_pwrite_full(fd, buf, n, from)) < 0)
			return r;
		from += n;
	}
	return 0;
}

/* The copy still holds what the disk holds in [0, len)?  1 yes, 0 no
 * (libcryptsetup wrote it), or -errno. */
static int copy_same(const struct hdr_src *s, int fd, uint64_t len)
{
	const size_t cap = 1u << 20;
	uint8_t *a = NULL, *b = NULL;
	int r = 1;

	if (posix_memalign((void **)&a, 4096, cap) || posix_memalign((void **)&b, 4096, cap))
		r = -ENOMEM;
	for (uint64_t off = 0; off < len && r == 1 && b; off += cap) {
		size_t n = (size_t)MIN((uint64_t)cap, len - off);
		int e;

		if ((e = src_read(s, a, n, off)) < 0 || (e = sys_pread_full(fd, b, n, off)) < 0)
			r = e;
		else if (memcmp(a, b, n))
			r = 0;
	}
	free(a);
	free(b);
	return r;
}

/* The header and (LUKS1) keyslots in a new memfd; *hdr_bytes: how much of
 * it is the header proper (LUKS2: both copies, the keyslots come after,
 * keyslots_copy).  The fd, or -errno with one line in err. */
static int header_copy(const struct hdr_src *s, uint64_t *hdr_bytes, char *err, size_t errlen)
{
	struct bdev *file = s->file;
	uint64_t msize = MIN(file->size, (uint64_t)LUKS_MAX_HDR), need;
	const size_t cap = 1u << 20;
	uint8_t *buf = NULL;
	int fd, r;

	fd = memfd_create("vblkd-luks-header", MFD_CLOEXEC);
	r = fd < 0 || ftruncate(fd, (off_t)msize) < 0 ? -errno : 0;
	if (r == 0 && posix_memalign((void **)&buf, 4096, cap))
		r = -ENOMEM;
	if (r < 0) {
		snprintf(err, errlen, "cannot make room for the LUKS header of %s: %s", file->path,
			 strerror(-r));
		goto fail;
	}
	if ((r = src_read(s, buf, MIN(msize, 4096), 0)) < 0) {
		snprintf(err, errlen, "cannot read the LUKS header of %s: %s", file->path,
			 strerror(-r));
		goto fail;
	}
	if (msize >= 4096 && memcmp(buf, magic, sizeof(magic))) {
		/* No primary: a LUKS2 secondary header to recover it from?
		 * libcryptsetup does, in the copy (luks_probe_secondary). */
		for (size_t i = 0; i < ARRAY_SIZE(hdr2_offsets); i++) {
			uint64_t at = hdr2_offsets[i];

			if (at + 4096 > msize || src_read(s, buf, 4096, at) < 0 ||
			    !secondary_at(buf, at))
				continue;
			log_warn("LUKS disk %s: its primary LUKS2 header is gone (no magic); read "
				 "from the secondary at %llu, the disk left as it is: repair it with "
				 "cryptsetup repair %s", file->path, (unsigned long long)at,
				 file->path);
			need = 2 * at;
			if (need > msize)
				break;
			goto copy;
		}
	}
	if (msize < 4096 || memcmp(buf, magic, sizeof(magic))) {
		snprintf(err, errlen, "%s is not a LUKS disk (no LUKS magic): serve it with "
			 "--format raw, or check --disk", file->path);
		r = -EINVAL;
		goto fail;
	}
	switch (be16toh(*(uint16_t *)(buf + 6))) {
	case 1:
		/* The keyslots' material lies before the payload. */
		need = (uint64_t)be32toh(*(uint32_t *)(buf + 104)) * 512;
		break;
	case 2:
		/* Both header copies now; the keyslots area once
		 * libcryptsetup has said where it ends (luks_open). */
		need = 2 * be64toh(*(uint64_t *)(buf + 8));
		break;
	default:
		need = 0;
	}
	if (need < 4096 || need > msize) {
		snprintf(err, errlen, "the LUKS header of %s is damaged: it claims %llu bytes of "
			 "metadata on a %llu-byte disk (vblkd reads at most %u MiB of it)",
			 file->path, (unsigned long long)need, (unsigned long long)file->size,
			 LUKS_MAX_HDR >> 20);
		r = -EINVAL;
		goto fail;
	}
copy:
	if ((r = copy_range(s, fd, 0, need, buf, cap)) < 0) {
		snprintf(err, errlen, "cannot read the LUKS header of %s: %s", file->path,
			 strerror(-r));
		goto fail;
	}
	free(buf);
	*hdr_bytes = need;
	return fd;
fail:
	free(buf);
	if (fd >= 0)
		close(fd);
	return r;
}

/* LUKS2: the keyslots area too (crypt_get_metadata_size: it follows the
 * two header copies). */
static int keyslots_copy(struct crypt_device *cd, const struct hdr_src *s, int fd, char *err,
			 size_t errlen)
{
	struct bdev *file = s->file;
	uint64_t msize = MIN(file->size, (uint64_t)LUKS_MAX_HDR), meta = 0, slots = 0;
	const size_t cap = 1u << 20;
	uint8_t *buf;
	int r;

	if (crypt_get_metadata_size(cd, &meta, &slots) < 0 || meta == 0 ||
	    2 * meta > msize || slots > msize - 2 * meta) {
		snprintf(err, errlen, "the LUKS2 header of %s is damaged: its keyslots area "
			 "(%llu bytes after two %llu-byte headers) does not fit the disk's first "
			 "%llu bytes", file->path, (unsigned long long)slots,
			 (unsigned long long)meta, (unsigned long long)msize);
		return -EINVAL;
	}
	if (posix_memalign((void **)&buf, 4096, cap))
		return -ENOMEM;
	r = copy_range(s, fd, 2 * meta, 2 * meta + slots, buf, cap);
	free(buf);
	if (r < 0)
		snprintf(err, errlen, "cannot read the LUKS keyslots of %s: %s", file->path,
			 strerror(-r));
	return r;
}

/* ---- Key derivation, bounded (luks_kdf.h) ------------------------------ */

struct bounds {
	uint64_t ms, kib;	/* one keyslot (or digest) at most */
	uint64_t total_ms;	/* every keyslot tried, together */
	uint64_t digest_ms;	/* the digest's check, part of every try */
};

/* k's cost, or UINT64_MAX ms when it cannot be known (an unknown KDF:
 * libcryptsetup refuses those itself). */
static struct luks_kdf_cost kdf_cost(const struct luks_kdf *k)
{
	struct luks_kdf_rates rt;
	struct luks_kdf_cost c = { UINT64_MAX, 0 };

	if (luks_kdf_rates(k, &rt) < 0 || luks_kdf_estimate(k, &rt, &c) < 0)
		c = (struct luks_kdf_cost){ UINT64_MAX, 0 };
	return c;
}

/* The volume key digest's PBKDF2, which libcryptsetup runs after a
 * keyslot opened (and for an upgrade's handed-over key): its cost at most
 * (LUKS2 may have several digests).  LUKS1: hash-spec at 72, mk-digest-iter
 * at 164, a 20-byte digest (on-disk-format.pdf); LUKS2: the "digests"
 * objects of the JSON area (on-disk-format-luks2.pdf, "Digests"). */
/* Whether libcryptsetup's crypto backend has hash (its own benchmark
 * call, which refuses a name it cannot run): a digest under a hash it
 * lacks cannot say no to a wrong key (cryptsetup 2.6 then opens the disk
 * with whatever the keyslot gave: garbage served, garbage written). */
static bool hash_known(struct crypt_device *cd, const char *hash)
{
	struct crypt_pbkdf_type p = { .type = CRYPT_KDF_PBKDF2, .hash = hash, .time_ms = 1 };

	/* OpenSSL's own names first (every common hash, no cost); the
	 * benchmark, ~1 s for a hash it runs, only for the rare others
	 * (whirlpool, stribog: libcryptsetup's backend may have them). */
	if (EVP_get_digestbyname(hash))
		return true;
	return crypt_benchmark_pbkdf(cd, &p, "x", 1, "0123456789abcdef", 16, 32, NULL,
				     NULL) == 0;
}

static struct luks_kdf_cost digest_cost(struct crypt_device *cd, int hfd, int version,
					char *bad_hash, size_t bad_len)
{
	struct luks_kdf_cost worst = { 0, 0 };
	char hash[33] = { 0 };

	if (version == 1) {
		uint8_t h[168];
		struct luks_kdf k = { .type = "pbkdf2", .hash = hash, .out_len = 20 };

		if (sys_pread_full(hfd, h, sizeof(h), 0) < 0)
			return (struct luks_kdf_cost){ UINT64_MAX, 0 };
		memcpy(hash, h + 72, 32);
		k.iterations = be32toh(*(uint32_t *)(h + 164));
		if (!hash_known(cd, hash)) {
			snprintf(bad_hash, bad_len, "%s", hash);
			return (struct luks_kdf_cost){ UINT64_MAX, 0 };
		}
		return kdf_cost(&k);
	}
	{
		const char *js = NULL;
		struct json_object *root, *digests;

		if (crypt_dump_json(cd, &js, 0) < 0 || !js || !(root = json_tokener_parse(js)))
			return (struct luks_kdf_cost){ UINT64_MAX, 0 };
		if (json_object_object_get_ex(root, "digests", &digests) &&
		    json_object_is_type(digests, json_type_object)) {
			json_object_object_foreach(digests, name, d) {
				struct json_object *t, *hs, *it, *dg;
				struct luks_kdf k = { .type = "pbkdf2", .out_len = 32 };
				struct luks_kdf_cost c;

				(void)name;
				if (!json_object_object_get_ex(d, "type", &t) ||
				    strcmp(json_object_get_string(t) ?: "", "pbkdf2") ||
				    !json_object_object_get_ex(d, "hash", &hs) ||
				    !json_object_object_get_ex(d, "iterations", &it))
					continue;
				snprintf(hash, sizeof(hash), "%s", json_object_get_string(hs) ?: "");
				if (!hash_known(cd, hash)) {
					snprintf(bad_hash, bad_len, "%s", hash);
					worst = (struct luks_kdf_cost){ UINT64_MAX, 0 };
					break;
				}
				k.hash = hash;
				k.iterations = (uint32_t)MIN(json_object_get_int64(it),
							     (int64_t)UINT32_MAX);
				/* The digest's length is what PBKDF2 makes
				 * (base64: 4 characters for 3 bytes). */
				if (json_object_object_get_ex(d, "digest", &dg))
					k.out_len = MAX((size_t)1,
							(size_t)json_object_get_string_len(dg) * 3 / 4);
				c = kdf_cost(&k);
				if (c.ms > worst.ms)
					worst = c;
			}
		}
		json_object_put(root);
	}
	return worst;
}

static void kdf_describe(const struct luks_kdf *k, const struct luks_kdf_cost *c, char *buf,
			 size_t len)
{
	char t[32];

	luks_kdf_ms_str(c->ms, t, sizeof(t));
	if (!strcmp(k->type, "pbkdf2"))
		snprintf(buf, len, "PBKDF2-%s, %u iterations: about %s here", k->hash, k->iterations,
			 c->ms == UINT64_MAX ? "an unknown time" : t);
	else
		snprintf(buf, len, "%s, %u passes over %u MiB, %u threads: about %s here", k->type,
			 k->iterations, k->memory_kib >> 10, k->threads, t);
}

/*
 * The volume key from the passphrase: each active keyslot in
 * libcryptsetup's order (CRYPT_ANY_SLOT's: "prefer" ones first, "ignore"
 * ones never), but only those whose KDF is within the bounds; one line
 * for each skipped.  0 and the key in key (*vk_len), or -errno with one
 * line in err.
 */
static int unlock(struct crypt_device *cd, const struct bounds *b, const char *path, int version,
		  const char *pass, size_t passlen, uint8_t *key, size_t *vk_len, char *err,
		  size_t errlen)
{
	int max = crypt_keyslot_max(version == 2 ? CRYPT_LUKS2 : CRYPT_LUKS1);
	unsigned tried = 0, skipped = 0, seen = 0;
	uint64_t spent = 0;
	int r = -ENOENT;

	for (int pass_no = 0; pass_no < 2; pass_no++) {
		for (int slot = 0; slot < max; slot++) {
			crypt_keyslot_info st = crypt_keyslot_status(cd, slot);
			crypt_keyslot_priority pr = version == 2 ?
				crypt_keyslot_get_priority(cd, slot) : CRYPT_SLOT_PRIORITY_NORMAL;
			struct crypt_pbkdf_type p;
			struct luks_kdf k;
			struct luks_kdf_cost c;
			size_t ks = 0;
			char what[160];

			if (st != CRYPT_SLOT_ACTIVE && st != CRYPT_SLOT_ACTIVE_LAST)
				continue;
			if (pr == CRYPT_SLOT_PRIORITY_IGNORE ||
			    (pr == CRYPT_SLOT_PRIORITY_PREFER) != (pass_no == 0))
				continue;
			seen++;
			if (crypt_keyslot_get_pbkdf(cd, slot, &p) < 0) {
				log_warn("LUKS disk %s: keyslot %d skipped: its key derivation cannot "
					 "be read", path, slot);
				skipped++;
				continue;
			}
			/* What the KDF makes: the key of the keyslot's area
			 * (LUKS2), the volume key's size (LUKS1). */
			if (version != 2 || !crypt_keyslot_get_encryption(cd, slot, &ks) || !ks)
				ks = (size_t)MAX(crypt_get_volume_key_size(cd), 1);
			/* libcryptsetup allocates what the keyslot says (a
			 * key_size of 2^31 asked for terabytes, and spent 10 s
			 * before it failed): no cipher takes over 512 bytes. */
			if (ks > LUKS_MAX_KEY_BYTES ||
			    crypt_keyslot_get_key_size(cd, slot) <= 0 ||
			    crypt_keyslot_get_key_size(cd, slot) > (int)LUKS_MAX_KEY_BYTES) {
				log_warn("LUKS disk %s: keyslot %d skipped: its key sizes (%zu, %d "
					 "bytes) are not ones a cipher takes", path, slot, ks,
					 crypt_keyslot_get_key_size(cd, slot));
				skipped++;
				continue;
			}
			k = (struct luks_kdf){ .type = p.type ? p.type : "?", .hash = p.hash ? p.hash : "?",
					       .iterations = p.iterations,
					       .memory_kib = p.max_memory_kb,
					       .threads = p.parallel_threads, .out_len = ks };
			/* Each try checks the key it got against the digest. */
			c = kdf_cost(&k);
			c.ms = c.ms > UINT64_MAX - b->digest_ms ? UINT64_MAX : c.ms + b->digest_ms;
			kdf_describe(&k, &c, what, sizeof(what));
			if (c.ms > b->ms || c.kib > b->kib) {
				log_warn("LUKS disk %s: keyslot %d skipped: its key derivation (%s) is "
					 "over the bound (--kdf-max-ms %llu, --kdf-max-memory %llu MiB)",
					 path, slot, what, (unsigned long long)b->ms,
					 (unsigned long long)(b->kib >> 10));
				skipped++;
				continue;
			}
			if (spent + c.ms > b->total_ms) {
				log_warn("LUKS disk %s: keyslot %d skipped: the keyslots tried before it "
					 "took about %llu ms already (at most %llu in all)", path, slot,
					 (unsigned long long)spent, (unsigned long long)b->total_ms);
				skipped++;
				continue;
			}
			spent += c.ms;
			tried++;
			log_debug("LUKS disk %s: trying keyslot %d (%s)", path, slot, what);
			r = crypt_volume_key_get(cd, slot, (char *)key, vk_len, pass, passlen);
			if (r >= 0)
				return 0;
			if (r != -EPERM)
				log_warn("LUKS disk %s: keyslot %d cannot be opened: %s", path, slot,
					 strerror(-r));
		}
	}
	if (!seen)
		snprintf(err, errlen, "LUKS disk %s has no active keyslot: add one with cryptsetup "
			 "luksAddKey", path);
	else if (!tried)
		snprintf(err, errlen, "no keyslot of LUKS disk %s can be tried: each one's key "
			 "derivation is over the bound (see above): raise --kdf-max-ms or "
			 "--kdf-max-memory if you trust the image (cryptsetup luksConvertKey "
			 "--pbkdf-force-iterations lowers a keyslot's cost)", path);
	else if (r == -EPERM)
		snprintf(err, errlen, "no keyslot of LUKS disk %s opens with that passphrase%s: "
			 "check the key file (cryptsetup open --test-passphrase tells)", path,
			 skipped ? " (some were skipped, see above)" : "");
	else
		snprintf(err, errlen, "cannot take the volume key of LUKS disk %s: %s", path,
			 strerror(-r));
	return r < 0 ? r : -EPERM;
}

int luks_open(struct bdev *file, const struct fmt_opts *o, struct bdev **disk, char *err,
	      size_t errlen)
{
	struct hdr_src src = { .file = file, .fd = -1 };
	struct bounds bd = {
		.ms = o->kdf_max_ms ? o->kdf_max_ms : LUKS_KDF_MAX_MS,
		.kib = o->kdf_max_kib ? o->kdf_max_kib : LUKS_KDF_MAX_KIB,
	};
	char fdpath[64];
	int hfd = -1;
	uint64_t hdr_bytes = 0;
	struct crypt_device *cd = NULL;
	struct luks_kdf_cost dc;
	char bad_hash[33] = "";
	struct luks *l = NULL;
	char *pass = NULL;
	size_t passlen = 0, vk_len;
	const char *type, *cipher, *mode;
	int version, r;

	bd.total_ms = 4 * bd.ms;
	if (!o->key_file && !o->key_handed) {
		snprintf(err, errlen, "%s is a LUKS disk: give its passphrase with --key-file PATH "
			 "(or - for standard input), or --format raw if the guest encrypted it "
			 "itself", file->path);
		return -ENOKEY;
	}
	if (!file->path) {
		snprintf(err, errlen, "a LUKS disk must be a file, block device or network disk");
		return -EINVAL;
	}
	/* A file or block device: read through a plain read-only open of
	 * the same file (the disk's own fd may be O_DIRECT). */
	if (!file->engine->open) {
		snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", file->fd);
		src.fd = open(fdpath, O_RDONLY | O_CLOEXEC);
		if (src.fd < 0) {
			r = -errno;
			snprintf(err, errlen, "cannot open %s for its LUKS header: %s", file->path,
				 strerror(-r));
			return r;
		}
	}
	if ((hfd = header_copy(&src, &hdr_bytes, err, errlen)) < 0) {
		r = hfd;
		goto fail;
	}
	snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", hfd);
	crypt_set_log_callback(NULL, cs_log, NULL);
	if ((r = crypt_init(&cd, fdpath)) < 0) {
		snprintf(err, errlen, "cannot open %s for its LUKS header: %s", file->path,
			 strerror(-r));
		goto fail;
	}
	crypt_set_log_callback(cd, cs_log, NULL);
	if ((r = crypt_load(cd, CRYPT_LUKS, NULL)) < 0) {
		snprintf(err, errlen, "the LUKS header of %s is damaged or not one libcryptsetup "
			 "reads (%s): check it with cryptsetup luksDump", file->path, strerror(-r));
		goto fail;
	}
	type = crypt_get_type(cd);
	version = type && !strcmp(type, CRYPT_LUKS2) ? 2 : 1;
	/* LUKS2 header auto-recovery wrote the copy: one header copy is
	 * damaged (or older than the other), and we serve from the good one. */
	if (version == 2 && copy_same(&src, hfd, hdr_bytes) == 0)
		log_warn("LUKS disk %s: one of its two LUKS2 header copies is damaged; served from "
			 "the other one, the disk left as it is: repair it with cryptsetup repair %s",
			 file->path, file->path);
	if (version == 2 && (r = keyslots_copy(cd, &src, hfd, err, errlen)) < 0)
		goto fail;
	/* A LUKS2 header with no usable data segment loads, and has no
	 * cipher: NULL (found by fuzz_luks). */
	cipher = crypt_get_cipher(cd);
	mode = crypt_get_cipher_mode(cd);
	if (!cipher || !mode) {
		snprintf(err, errlen, "the LUKS header of %s names no cipher for the data (no "
			 "usable segment): it is damaged or hostile; check it with cryptsetup "
			 "luksDump", file->path);
		r = -EINVAL;
		goto fail;
	}
	if (strcmp(cipher, "aes") || strcmp(mode, "xts-plain64")) {
		snprintf(err, errlen, "LUKS disk %s uses %s-%s; vblkd serves aes-xts-plain64 only: "
			 "re-encrypt it with cryptsetup reencrypt --cipher aes-xts-plain64",
			 file->path, cipher, mode);
		r = -EOPNOTSUPP;
		goto fail;
	}
	vk_len = (size_t)crypt_get_volume_key_size(cd);
	if (vk_len != 32 && vk_len != 64) {
		snprintf(err, errlen, "LUKS disk %s has a %zu-bit key; aes-xts takes 256 or 512",
			 file->path, vk_len * 8);
		r = -EOPNOTSUPP;
		goto fail;
	}
	/* Every key, a keyslot's or a handed-over one, is checked against
	 * the digest: its PBKDF2 is bounded like a keyslot's. */
	dc = digest_cost(cd, hfd, version, bad_hash, sizeof(bad_hash));
	if (bad_hash[0]) {
		log_one_line(bad_hash, strlen(bad_hash));
		snprintf(err, errlen, "LUKS disk %s: its header's digest uses the hash '%s', which "
			 "cryptsetup here cannot compute, so no key could be checked: the header is "
			 "damaged or hostile; check it with cryptsetup luksDump", file->path, bad_hash);
		r = -EINVAL;
		goto fail;
	}
	if (dc.ms > bd.ms) {
		char t[32];

		luks_kdf_ms_str(dc.ms, t, sizeof(t));
		snprintf(err, errlen, "LUKS disk %s: checking a key against its header's digest "
			 "would take %s here (PBKDF2), over --kdf-max-ms %llu: the header is damaged "
			 "or hostile; check it with cryptsetup luksDump", file->path,
			 dc.ms == UINT64_MAX ? "an unknown time" : t, (unsigned long long)bd.ms);
		r = -EINVAL;
		goto fail;
	}
	bd.digest_ms = dc.ms;
	l = calloc(1, sizeof(*l));
	if (!l) {
		r = -ENOMEM;
		goto fail;
	}
	l->key = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (l->key == MAP_FAILED) {
		l->key = NULL;
		r = -ENOMEM;
		goto fail;
	}
	(void)madvise(l->key, 4096, MADV_DONTDUMP);
	if (mlock(l->key, 4096) < 0)
		log_warn("LUKS disk %s: cannot lock the key's page in memory (%s): it could be "
			 "swapped out", file->path, strerror(errno));
	if (o->key_handed) {
		if ((r = key_take(o->key_fd, l->key, vk_len, file->path, err, errlen)) < 0)
			goto fail;
		/* The header's digest says whether it is this disk's key. */
		r = crypt_volume_key_verify(cd, (const char *)l->key, vk_len);
		if (r < 0) {
			snprintf(err, errlen, "the volume key handed over by the old vblkd does not "
				 "open LUKS disk %s (%s)", file->path, strerror(-r));
			goto fail;
		}
	} else {
		if ((r = read_key_file(o->key_file, &pass, &passlen, err, errlen)) < 0)
			goto fail;
		r = unlock(cd, &bd, file->path, version, pass, passlen, l->key, &vk_len, err,
			   errlen);
		key_wipe(pass, passlen);
		if (r < 0)
			goto fail;
	}
	if (!secmem.on || secmem.spilled)
		log_warn("LUKS disk %s: OpenSSL's memory is not all excluded from core dumps "
			 "(%s): a core dump of vblkd could hold the key", file->path,
			 secmem.on ? "its arena is full" : "it allocated before vblkd started");
	l->key_len = vk_len;
	if ((r = xts_fetch(&l->xts, vk_len, err, errlen)) < 0)
		goto fail;
	l->data_off = crypt_get_data_offset(cd) * 512;
	l->iv_off = crypt_get_iv_offset(cd);
	l->sector = (unsigned)crypt_get_sector_size(cd);
	l->version = version;
	l->file = file;
	/* An RBD image is read as librbd reads its encrypted images (rbd
	 * encryption format; QEMU's rbd driver with encrypt.format): what
	 * RADOS holds no data for reads as zeroes, not decrypted (librbd
	 * crypto/CryptoInterface.h, decrypt_aligned_extent decrypts the
	 * data extents of a sparse read only).  Same keys, IVs (plain64,
	 * payload-relative) and sectors as dm-crypt otherwise. */
	l->holes_zero = !strcmp(file->engine->name, "rbd");
	crypt_free(cd);
	cd = NULL;
	sys_close(&hfd);
	sys_close(&src.fd);
	if (l->sector < 512 || l->sector > 4096 || (l->sector & (l->sector - 1)) ||
	    l->sector < file->block_size || l->data_off >= file->size ||
	    (file->size - l->data_off) < l->sector || l->data_off % l->sector) {
		snprintf(err, errlen, "LUKS disk %s: its payload (at %llu, %u-byte sectors) does "
			 "not fit the %llu-byte disk or its %u-byte blocks", file->path,
			 (unsigned long long)l->data_off, l->sector,
			 (unsigned long long)file->size, file->block_size);
		r = -EINVAL;
		goto fail;
	}
	l->eng = (struct bdev_engine){
		.name = file->engine->name,
		.ctx_new = luks_ctx_new,
		.ctx_free = luks_ctx_free,
		.submit = luks_submit,
		.kick = luks_kick,
		.drain = luks_drain,
		.submits = luks_submits,
		.polled = luks_polled,
		.sync_ios = luks_sync_ios,
		.spin_stats = luks_spin_stats,
	};
	l->disk = (struct bdev){
		.path = file->path,
		.fd = file->fd,
		.size = (file->size - l->data_off) / l->sector * l->sector,
		.block_size = l->sector,
		.phys_block_size = MAX(file->phys_block_size, l->sector),
		.discard_granularity = l->sector,
		.read_only = file->read_only,
		.is_blockdev = file->is_blockdev,
		.device_completes = file->device_completes,
		.max_ctxs = file->max_ctxs,
		.engine = &l->eng,
		.priv = l,
	};
	*disk = &l->disk;
	return 0;
fail:
	if (cd)
		crypt_free(cd);
	sys_close(&hfd);
	sys_close(&src.fd);
	if (l) {
		if (l->key) {
			explicit_bzero(l->key, 4096);
			munmap(l->key, 4096);
		}
		EVP_CIPHER_free(l->xts.ci);
		free(l);
	}
	return r;
}

void luks_close(struct bdev *disk)
{
	struct luks *l = container_of(disk, struct luks, disk);

	explicit_bzero(l->key, 4096);
	munmap(l->key, 4096);
	EVP_CIPHER_free(l->xts.ci);
	free(l);
}

void luks_describe(const struct bdev *disk, char *buf, size_t len)
{
	const struct luks *l = container_of(disk, const struct luks, disk);

	snprintf(buf, len, "LUKS%d, aes-xts-plain64 %zu-bit, %u-byte sectors, payload at %llu",
		 l->version, l->key_len * 8, l->sector, (unsigned long long)l->data_off);
}
