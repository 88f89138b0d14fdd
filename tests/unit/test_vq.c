/* Description: virtio/vq.h device-side split virtqueue against hand-built
 * hostile rings: every validation vq.h promises, plus used ring,
 * notification suppression and 16-bit index wrap-around. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mem/gm.h"
#include "test.h"
#include "test_mem.h"
#include "virtio/virtio_ring.h"
#include "virtio/vq.h"

/*
 * Fake guest memory: one 1 MiB memfd region at gpa 0x100000, which the
 * frontend sees at qva 0x7f0000000000.  Rings are placed by qva (as
 * SET_VRING_ADDR gives them), buffers and indirect tables by gpa (as
 * descriptors give them).  Offsets into the region:
 */
#define MEM_GPA    0x100000ull
#define MEM_QVA    0x7f0000000000ull
#define MEM_SIZE   0x100000ull
#define DESC_OFF   0x0000ull
#define AVAIL_OFF  0x1000ull
#define USED_OFF   0x2000ull
#define INDIR_OFF  0x8000ull	/* indirect tables, up to 2048 entries */
#define BUF_OFF    0x10000ull	/* data buffers, 4 KiB apart */

struct ring {
	struct gm_table mem;
	struct vq_config cfg;
	struct vq vq;
	uint8_t *host;			/* start of the region */
	/* The driver's view, written through host pointers. */
	struct vring_desc *desc;
	struct vring_avail *avail;
	struct vring_used *used;
	uint16_t avail_idx;		/* driver's next avail->idx */
	/* Device side output. */
	struct vq_elem e;
	struct iovec iov[VQ_MAX_SEGS];
};

/* Guest memory and a default config for num entries starting at index
 * base (avail->idx and used->idx both at base, as after a
 * SET_VRING_BASE); vq_init is not called yet. */
static struct ring *ring_new(unsigned num, uint16_t base)
{
	struct ring *r = calloc(1, sizeof(*r));

	ASSERT_TRUE(r != NULL);
	r->host = test_guest_mem(&r->mem, MEM_GPA, MEM_QVA, MEM_SIZE);
	r->desc = (struct vring_desc *)(r->host + DESC_OFF);
	r->avail = (struct vring_avail *)(r->host + AVAIL_OFF);
	r->used = (struct vring_used *)(r->host + USED_OFF);
	r->avail->idx = base;
	r->used->idx = base;
	r->avail_idx = base;

	r->cfg.index = 0;
	r->cfg.num = num;
	r->cfg.desc_qva = MEM_QVA + DESC_OFF;
	r->cfg.avail_qva = MEM_QVA + AVAIL_OFF;
	r->cfg.used_qva = MEM_QVA + USED_OFF;
	r->cfg.last_avail_idx = base;
	r->e.iov = r->iov;
	return r;
}

static void ring_start(struct ring *r)
{
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
}

/* A started ring of num entries from index 0. */
static struct ring *ring_up(unsigned num, bool indirect, bool event_idx)
{
	struct ring *r = ring_new(num, 0);

	r->cfg.indirect = indirect;
	r->cfg.event_idx = event_idx;
	ring_start(r);
	return r;
}

static void ring_free(struct ring *r)
{
	gm_table_clear(&r->mem);
	free(r);
}

static uint64_t buf_gpa(unsigned n)
{
	return MEM_GPA + BUF_OFF + 0x1000ull * n;
}

static uint8_t *buf_host(struct ring *r, unsigned n)
{
	return r->host + BUF_OFF + 0x1000ull * n;
}

static uint64_t indir_gpa(void)
{
	return MEM_GPA + INDIR_OFF;
}

static struct vring_desc *indir_host(struct ring *r)
{
	return (struct vring_desc *)(r->host + INDIR_OFF);
}

static void desc_set(struct vring_desc *d, uint64_t addr, uint32_t len,
		     uint16_t flags, uint16_t next)
{
	d->addr = addr;
	d->len = len;
	d->flags = flags;
	d->next = next;
}

/* Publish head as the driver does: entry, write barrier, index. */
static void avail_add(struct ring *r, uint16_t head)
{
	r->avail->ring[r->avail_idx & (r->cfg.num - 1)] = head;
	atomic_thread_fence(memory_order_release);
	r->avail->idx = ++r->avail_idx;
}

static int pop(struct ring *r)
{
	return vq_pop(&r->vq, &r->e);
}

/*
 * A virtio-blk shaped chain in t[d], t[d+1], t[d+2] over buffers b, b+1,
 * b+2: 16-byte readable header, 512-byte writable data, 1-byte writable
 * status.
 */
static void chain3(struct vring_desc *t, unsigned d, unsigned b)
{
	desc_set(&t[d], buf_gpa(b), 16, VRING_DESC_F_NEXT, d + 1);
	desc_set(&t[d + 1], buf_gpa(b + 1), 512,
		 VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, d + 2);
	desc_set(&t[d + 2], buf_gpa(b + 2), 1, VRING_DESC_F_WRITE, 0);
}

/* r->e holds the chain3() request over buffers b.. . */
static void check_chain3(struct ring *r, unsigned b)
{
	ASSERT_EQ(r->e.out_num, 1);
	ASSERT_EQ(r->e.in_num, 2);
	ASSERT_EQ(r->e.out_len, 16);
	ASSERT_EQ(r->e.in_len, 513);
	ASSERT_PTR_EQ(r->e.iov[0].iov_base, buf_host(r, b));
	ASSERT_EQ(r->e.iov[0].iov_len, 16);
	ASSERT_PTR_EQ(r->e.iov[1].iov_base, buf_host(r, b + 1));
	ASSERT_EQ(r->e.iov[1].iov_len, 512);
	ASSERT_PTR_EQ(r->e.iov[2].iov_base, buf_host(r, b + 2));
	ASSERT_EQ(r->e.iov[2].iov_len, 1);
}

/* A bad chain at head fails that request only; the queue goes on. */
static void expect_bad_chain(struct ring *r, uint16_t head)
{
	uint64_t before = r->vq.bad_chains;

	r->vq.logged_bad_chain = false;	/* log every reason, for diagnosis */
	ASSERT_EQ(pop(r), -EINVAL);
	ASSERT_EQ(r->e.head, head);
	ASSERT_TRUE(!r->vq.broken);
	ASSERT_EQ(r->vq.bad_chains, before + 1);
}

/* ---- vq_init ---- */

/* num 0 is refused. */
static void test_init_rejects_num_zero(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.num = 0;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	ring_free(r);
}

/* num must be a power of two (2.7). */
static void test_init_rejects_num_not_power_of_two(void)
{
	static const unsigned bad[] = { 3, 6, 12, 100, 32767 };
	struct ring *r = ring_new(8, 0);

	for (unsigned i = 0; i < ARRAY_SIZE(bad); i++) {
		r->cfg.num = bad[i];
		ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	}
	ring_free(r);
}

/* num above 32768 is refused, even as a power of two. */
static void test_init_rejects_num_above_max(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.num = 65536;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.num = 1u << 31;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	ring_free(r);
}

/* num 32768 and num 1 are accepted when the rings fit. */
static void test_init_accepts_num_limits(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.num = VRING_MAX_NUM;
	r->cfg.desc_qva = MEM_QVA;				/* 512 KiB */
	r->cfg.avail_qva = MEM_QVA + 0x80000;			/* 64 KiB + 6 */
	r->cfg.used_qva = MEM_QVA + 0x90004;			/* 256 KiB + 6 */
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	ASSERT_EQ(r->vq.num, VRING_MAX_NUM);
	r->cfg.num = 1;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	ring_free(r);
}

/* The descriptor table must be 16-byte aligned. */
static void test_init_rejects_misaligned_desc(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.desc_qva = MEM_QVA + DESC_OFF + 8;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.desc_qva = MEM_QVA + DESC_OFF + 1;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	ring_free(r);
}

/* The avail ring must be 2-byte aligned. */
static void test_init_rejects_misaligned_avail(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.avail_qva = MEM_QVA + AVAIL_OFF + 1;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	ring_free(r);
}

/* The used ring must be 4-byte aligned. */
static void test_init_rejects_misaligned_used(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.used_qva = MEM_QVA + USED_OFF + 2;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.used_qva = MEM_QVA + USED_OFF + 1;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	ring_free(r);
}

/* Exactly the required alignments (16, 2, 4) are enough. */
static void test_init_accepts_minimal_alignment(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.desc_qva = MEM_QVA + DESC_OFF + 16;
	r->cfg.avail_qva = MEM_QVA + AVAIL_OFF + 2;
	r->cfg.used_qva = MEM_QVA + USED_OFF + 4;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	ASSERT_PTR_EQ(r->vq.avail, r->host + AVAIL_OFF + 2);
	ASSERT_PTR_EQ(r->vq.used, r->host + USED_OFF + 4);
	ring_free(r);
}

/* Each ring part placed wholly outside guest memory is refused. */
static void test_init_rejects_rings_outside_memory(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.desc_qva = MEM_QVA - 0x1000;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.desc_qva = MEM_QVA + DESC_OFF;

	r->cfg.avail_qva = MEM_QVA + MEM_SIZE;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.avail_qva = MEM_QVA + AVAIL_OFF;

	/* A gpa is not a qva: rings are placed by frontend address. */
	r->cfg.used_qva = MEM_GPA + USED_OFF;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	ring_free(r);
}

/* A descriptor table that starts inside memory and ends past it. */
static void test_init_rejects_desc_straddling_end(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.desc_qva = MEM_QVA + MEM_SIZE - vring_desc_bytes(8) + 16;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.desc_qva = MEM_QVA + MEM_SIZE - vring_desc_bytes(8);
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	ring_free(r);
}

/* An avail ring whose ring[] fits but whose trailing used_event does
 * not. */
static void test_init_rejects_avail_used_event_past_end(void)
{
	struct ring *r = ring_new(8, 0);

	r->cfg.avail_qva = MEM_QVA + MEM_SIZE - vring_avail_bytes(8) + 2;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.avail_qva = MEM_QVA + MEM_SIZE - vring_avail_bytes(8);
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	ring_free(r);
}

/* A used ring that starts inside memory and ends past it (avail_event
 * included). */
static void test_init_rejects_used_straddling_end(void)
{
	struct ring *r = ring_new(8, 0);
	uint64_t fit = (MEM_SIZE - vring_used_bytes(8)) & ~3ull;

	r->cfg.used_qva = MEM_QVA + MEM_SIZE - 4 - 8 * 8;	/* no avail_event */
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.used_qva = MEM_QVA + MEM_SIZE - 4;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.used_qva = MEM_QVA + fit;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	ring_free(r);
}

/* ---- vq_pop: good requests ---- */

/* A fresh ring is empty: 0, not an error. */
static void test_empty_ring_returns_zero(void)
{
	struct ring *r = ring_up(8, false, false);

	ASSERT_EQ(pop(r), 0);
	ASSERT_EQ(pop(r), 0);
	ASSERT_TRUE(!r->vq.broken);
	ring_free(r);
}

/* A header/data/status chain pops with its iovecs pointing at the host
 * copies of the buffers; then the ring is empty. */
static void test_good_chain_pops(void)
{
	struct ring *r = ring_up(8, false, false);

	chain3(r->desc, 2, 0);
	avail_add(r, 2);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 2);
	check_chain3(r, 0);
	ASSERT_PTR_EQ(r->e.last_byte, NULL);
	ASSERT_EQ(r->vq.last_avail_idx, 1);
	ASSERT_EQ(pop(r), 0);
	ASSERT_EQ(r->vq.bad_chains, 0);
	ring_free(r);
}

/* A chain using every descriptor of the table is not a loop (hop limit
 * is num, inclusive). */
static void test_chain_of_num_descriptors_pops(void)
{
	struct ring *r = ring_up(8, false, false);

	for (unsigned i = 0; i < 8; i++)
		desc_set(&r->desc[i], buf_gpa(i), 8,
			 i < 7 ? VRING_DESC_F_NEXT : 0, (i + 1) % 8);
	avail_add(r, 0);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.out_num, 8);
	ASSERT_EQ(r->e.out_len, 64);
	ASSERT_PTR_EQ(r->e.iov[7].iov_base, buf_host(r, 7));
	ring_free(r);
}

/* avail->idx exactly num ahead (a full ring) is legal. */
static void test_avail_idx_full_ring_is_not_corrupt(void)
{
	struct ring *r = ring_up(8, false, false);

	for (unsigned i = 0; i < 8; i++) {
		desc_set(&r->desc[i], buf_gpa(i), 4, 0, 0);
		avail_add(r, 7 - i);
	}
	for (unsigned i = 0; i < 8; i++) {
		ASSERT_EQ(pop(r), 1);
		ASSERT_EQ(r->e.head, 7 - i);
		ASSERT_PTR_EQ(r->e.iov[0].iov_base, buf_host(r, 7 - i));
	}
	ASSERT_EQ(pop(r), 0);
	ring_free(r);
}

/* ---- vq_pop: corrupt rings break the queue ---- */

/* A head >= num in the avail ring breaks the queue for good, even once
 * good requests follow. */
static void test_head_out_of_range_breaks_queue(void)
{
	struct ring *r = ring_up(8, false, false);

	chain3(r->desc, 0, 0);
	avail_add(r, 8);
	avail_add(r, 0);
	ASSERT_EQ(pop(r), -EIO);
	ASSERT_TRUE(r->vq.broken);
	ASSERT_EQ(pop(r), -EIO);
	avail_add(r, 0);
	ASSERT_EQ(pop(r), -EIO);
	ring_free(r);
}

/* avail->idx moving more than num past last_avail_idx breaks the
 * queue. */
static void test_avail_idx_jump_breaks_queue(void)
{
	struct ring *r = ring_up(8, false, false);

	chain3(r->desc, 0, 0);
	r->avail->idx = 9;
	ASSERT_EQ(pop(r), -EIO);
	ASSERT_TRUE(r->vq.broken);
	r->avail->idx = 1;
	ASSERT_EQ(pop(r), -EIO);
	ring_free(r);
}

/* A jump seen as a huge 16-bit distance (the index moved backwards) is
 * corruption too. */
static void test_avail_idx_backwards_breaks_queue(void)
{
	struct ring *r = ring_new(8, 100);

	ring_start(r);
	r->avail->idx = 99;
	ASSERT_EQ(pop(r), -EIO);
	ASSERT_TRUE(r->vq.broken);
	ring_free(r);
}

/* ---- vq_pop: bad chains fail one request ---- */

/* next >= num fails that chain only; the next request pops. */
static void test_next_out_of_range_fails_only_that_chain(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[0], buf_gpa(0), 16, VRING_DESC_F_NEXT, 8);
	avail_add(r, 0);
	chain3(r->desc, 3, 3);
	avail_add(r, 3);
	expect_bad_chain(r, 0);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 3);
	check_chain3(r, 3);
	ASSERT_EQ(r->vq.bad_chains, 1);
	ring_free(r);
}

/* A two-descriptor loop a->b->a ends with -EINVAL, not a hang. */
static void test_descriptor_loop_is_bad_chain(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[1], buf_gpa(0), 16, VRING_DESC_F_NEXT, 5);
	desc_set(&r->desc[5], buf_gpa(1), 16, VRING_DESC_F_NEXT, 1);
	avail_add(r, 1);
	expect_bad_chain(r, 1);
	ASSERT_EQ(pop(r), 0);
	ring_free(r);
}

/* A descriptor whose next is itself ends with -EINVAL, not a hang. */
static void test_self_loop_is_bad_chain(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[4], buf_gpa(0), 16,
		 VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 4);
	avail_add(r, 4);
	expect_bad_chain(r, 4);
	ring_free(r);
}

/* A buffer wholly outside guest memory. */
static void test_buffer_outside_memory_is_bad_chain(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[0], MEM_GPA + MEM_SIZE, 16, 0, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	desc_set(&r->desc[1], MEM_QVA + BUF_OFF, 16, 0, 0);	/* qva, not gpa */
	avail_add(r, 1);
	expect_bad_chain(r, 1);
	ring_free(r);
}

/* A buffer that starts inside guest memory and ends past it. */
static void test_buffer_ending_outside_memory_is_bad_chain(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[0], MEM_GPA + MEM_SIZE - 16, 17, VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	desc_set(&r->desc[1], MEM_GPA + MEM_SIZE - 16, 16, VRING_DESC_F_WRITE, 0);
	avail_add(r, 1);
	ASSERT_EQ(pop(r), 1);
	ring_free(r);
}

/* addr + len wrapping past 2^64 (and landing inside memory if computed
 * naively). */
static void test_buffer_addr_len_overflow_is_bad_chain(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[0], UINT64_MAX - 0xf, 0x100000 + 0x20, 0, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	desc_set(&r->desc[1], UINT64_MAX, 2, VRING_DESC_F_WRITE, 0);
	avail_add(r, 1);
	expect_bad_chain(r, 1);
	ring_free(r);
}

/* A device-readable descriptor after a writable one (2.7.4.2). */
static void test_readable_after_writable_is_bad_chain(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[0], buf_gpa(0), 16,
		 VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 1);
	desc_set(&r->desc[1], buf_gpa(1), 16, VRING_DESC_F_NEXT, 2);
	desc_set(&r->desc[2], buf_gpa(2), 1, VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ring_free(r);
}

/* A bad chain whose final descriptor is writable and in memory reports
 * that descriptor's last byte, so a status can still be written. */
static void test_bad_chain_last_byte_is_final_writable_byte(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[0], MEM_GPA + MEM_SIZE, 16, VRING_DESC_F_NEXT, 1);
	desc_set(&r->desc[1], buf_gpa(1), 512,
		 VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 2);
	desc_set(&r->desc[2], buf_gpa(2), 4, VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ASSERT_PTR_EQ(r->e.last_byte, buf_host(r, 2) + 3);
	ring_free(r);
}

/* last_byte is NULL when the final descriptor is device-readable. */
static void test_bad_chain_last_byte_null_when_final_readable(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[0], buf_gpa(0), 16,
		 VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 1);
	desc_set(&r->desc[1], buf_gpa(1), 16, 0, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ASSERT_PTR_EQ(r->e.last_byte, NULL);
	ring_free(r);
}

/* last_byte is NULL when the final writable descriptor is itself
 * outside guest memory. */
static void test_bad_chain_last_byte_null_when_final_outside(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[0], buf_gpa(0), 16, VRING_DESC_F_NEXT, 1);
	desc_set(&r->desc[1], MEM_GPA + MEM_SIZE - 1, 2, VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ASSERT_PTR_EQ(r->e.last_byte, NULL);
	ring_free(r);
}

/* Writable buffers adding up to more than 4 GiB cannot be reported in
 * the 32-bit used length: refused.  Needs a sparse 4 GiB region. */
static void test_request_over_4gib_is_bad_chain(void)
{
	struct ring *r = ring_up(8, false, false);
	uint64_t big_gpa = 0x100000000ull, big_size = 0x100000000ull;
	struct gm_region big;
	int fd, ret;

	fd = memfd_create("test_vq_big", MFD_CLOEXEC);
	ASSERT_TRUE(fd >= 0);
	ASSERT_EQ(ftruncate(fd, (off_t)big_size), 0);
	ret = gm_region_map(&big, big_gpa, big_size, 0x7f1000000000ull, 0, fd);
	close(fd);
	if (ret == -ENOMEM) {
		fprintf(stderr, "    no address space for 4 GiB, case skipped\n");
		ring_free(r);
		return;
	}
	ASSERT_EQ(ret, 0);
	ASSERT_EQ(gm_table_add(&r->mem, &big), 0);

	desc_set(&r->desc[0], buf_gpa(0), 16, VRING_DESC_F_NEXT, 1);
	desc_set(&r->desc[1], big_gpa, UINT32_MAX,
		 VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 2);
	desc_set(&r->desc[2], big_gpa, 2, VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ASSERT_PTR_EQ(r->e.last_byte, big.host + 1);
	vq_push(&r->vq, 0, 0);

	/* Exactly UINT32_MAX bytes is still reportable. */
	desc_set(&r->desc[2], big_gpa, 0, VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.in_len, UINT32_MAX);
	ring_free(r);
}

/* ---- indirect descriptors (2.7.5.3) ---- */

/* A good indirect table pops like the same chain in the ring. */
static void test_indirect_good_table(void)
{
	struct ring *r = ring_up(8, true, false);

	chain3(indir_host(r), 0, 0);
	desc_set(&r->desc[5], indir_gpa(), 3 * 16, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 5);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 5);
	check_chain3(r, 0);
	ring_free(r);
}

/* Direct descriptors followed by an indirect one are one request
 * (2.7.5.3.2: the device MUST handle this). */
static void test_direct_then_indirect(void)
{
	struct ring *r = ring_up(8, true, false);
	struct vring_desc *t = indir_host(r);

	desc_set(&r->desc[0], buf_gpa(0), 16, VRING_DESC_F_NEXT, 1);
	desc_set(&r->desc[1], indir_gpa(), 2 * 16, VRING_DESC_F_INDIRECT, 0);
	desc_set(&t[0], buf_gpa(1), 512, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 1);
	desc_set(&t[1], buf_gpa(2), 1, VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	ASSERT_EQ(pop(r), 1);
	check_chain3(r, 0);
	ring_free(r);
}

/* The WRITE flag on the descriptor naming an indirect table is ignored
 * (2.7.5.3.2), so it does not make later readable buffers misordered. */
static void test_indirect_descriptor_write_flag_ignored(void)
{
	struct ring *r = ring_up(8, true, false);

	chain3(indir_host(r), 0, 0);
	desc_set(&r->desc[0], indir_gpa(), 3 * 16,
		 VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	ASSERT_EQ(pop(r), 1);
	check_chain3(r, 0);
	ring_free(r);
}

/* INDIRECT without VIRTIO_RING_F_INDIRECT_DESC negotiated. */
static void test_indirect_not_negotiated_is_bad_chain(void)
{
	struct ring *r = ring_up(8, false, false);

	chain3(indir_host(r), 0, 0);
	desc_set(&r->desc[0], indir_gpa(), 3 * 16, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ring_free(r);
}

/* An indirect table whose length is not a multiple of 16. */
static void test_indirect_len_not_multiple_of_16_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);

	chain3(indir_host(r), 0, 0);
	desc_set(&r->desc[0], indir_gpa(), 3 * 16 + 8, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	desc_set(&r->desc[1], indir_gpa(), 15, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 1);
	expect_bad_chain(r, 1);
	ring_free(r);
}

/* An indirect table of length 0. */
static void test_indirect_len_zero_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);

	chain3(indir_host(r), 0, 0);
	desc_set(&r->desc[0], indir_gpa(), 0, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ring_free(r);
}

/* An indirect descriptor inside an indirect table. */
static void test_nested_indirect_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);
	struct vring_desc *t = indir_host(r);

	desc_set(&t[0], buf_gpa(0), 16, VRING_DESC_F_NEXT, 1);
	desc_set(&t[1], indir_gpa() + 0x1000, 16, VRING_DESC_F_INDIRECT, 0);
	desc_set(&t[256], buf_gpa(1), 1, VRING_DESC_F_WRITE, 0);
	desc_set(&r->desc[0], indir_gpa(), 2 * 16, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ring_free(r);
}

/* INDIRECT together with NEXT (2.7.5.3.1). */
static void test_indirect_with_next_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);

	chain3(indir_host(r), 0, 0);
	desc_set(&r->desc[0], indir_gpa(), 3 * 16,
		 VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT, 1);
	desc_set(&r->desc[1], buf_gpa(5), 1, VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ring_free(r);
}

/* An indirect table outside guest memory, or ending past it. */
static void test_indirect_table_outside_memory_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);

	desc_set(&r->desc[0], MEM_GPA + MEM_SIZE, 3 * 16, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	desc_set(&r->desc[1], MEM_GPA + MEM_SIZE - 32, 3 * 16,
		 VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 1);
	expect_bad_chain(r, 1);
	desc_set(&r->desc[2], UINT64_MAX - 15, 32, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 2);
	expect_bad_chain(r, 2);
	ring_free(r);
}

/* An indirect table at an address that is not 8-byte aligned is refused
 * (descriptors are read with aligned loads), the queue keeps working. */
static void test_misaligned_indirect_table_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);

	desc_set(&r->desc[0], indir_gpa() + 4, 3 * 16, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ASSERT_TRUE(!r->vq.broken);
	ring_free(r);
}

/*
 * Regression (found by fuzz_vq_blk): vq_enable_notify() reported "work" for
 * an avail index that went backwards, and the caller's drain loop spun
 * forever.  It must break the queue instead.
 */
static void test_enable_notify_index_backwards_breaks_queue(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[0], buf_gpa(0), 16, VRING_DESC_F_WRITE, 0);
	avail_add(r, 0);
	ASSERT_EQ(pop(r), 1);
	r->avail->idx = 0;		/* the driver (or an overlapping ring) rewinds it */
	ASSERT_TRUE(!vq_enable_notify(&r->vq));
	ASSERT_TRUE(r->vq.broken);
	ring_free(r);
}

/* A loop inside an indirect table ends with -EINVAL, not a hang. */
static void test_indirect_loop_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);
	struct vring_desc *t = indir_host(r);

	desc_set(&t[0], buf_gpa(0), 16, VRING_DESC_F_NEXT, 1);
	desc_set(&t[1], buf_gpa(1), 16, VRING_DESC_F_NEXT, 2);
	desc_set(&t[2], buf_gpa(2), 16, VRING_DESC_F_NEXT, 1);
	desc_set(&r->desc[0], indir_gpa(), 3 * 16, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ring_free(r);
}

/* next beyond the indirect table's own size, though below num. */
static void test_indirect_next_out_of_range_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);
	struct vring_desc *t = indir_host(r);

	desc_set(&t[0], buf_gpa(0), 16, VRING_DESC_F_NEXT, 1);
	desc_set(&t[1], buf_gpa(1), 16, VRING_DESC_F_NEXT, 2);
	desc_set(&t[2], buf_gpa(2), 1, VRING_DESC_F_WRITE, 0);	/* not in table */
	desc_set(&r->desc[0], indir_gpa(), 2 * 16, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ring_free(r);
}

/* A table of n readable 1-byte descriptors chained in order. */
static void linear_table(struct vring_desc *t, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		desc_set(&t[i], buf_gpa(0) + i, 1,
			 i + 1 < n ? VRING_DESC_F_NEXT : 0, i + 1);
}

/* Exactly VQ_MAX_SEGS descriptors in one request is the limit, and
 * fits. */
static void test_max_segs_in_indirect_pops(void)
{
	struct ring *r = ring_up(8, true, false);

	linear_table(indir_host(r), VQ_MAX_SEGS);
	desc_set(&r->desc[0], indir_gpa(), VQ_MAX_SEGS * 16,
		 VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.out_num, VQ_MAX_SEGS);
	ASSERT_EQ(r->e.out_len, VQ_MAX_SEGS);
	ASSERT_PTR_EQ(r->e.iov[VQ_MAX_SEGS - 1].iov_base,
		      buf_host(r, 0) + VQ_MAX_SEGS - 1);
	ring_free(r);
}

/* VQ_MAX_SEGS + 1 descriptors in one request overflow e->iov: refused. */
static void test_too_many_segs_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);

	linear_table(indir_host(r), VQ_MAX_SEGS + 1);
	desc_set(&r->desc[0], indir_gpa(), (VQ_MAX_SEGS + 1) * 16,
		 VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ring_free(r);
}

/* Direct and indirect descriptors count together toward VQ_MAX_SEGS. */
static void test_too_many_segs_direct_plus_indirect_is_bad_chain(void)
{
	struct ring *r = ring_up(8, true, false);

	desc_set(&r->desc[0], buf_gpa(1), 16, VRING_DESC_F_NEXT, 1);
	desc_set(&r->desc[1], indir_gpa(), VQ_MAX_SEGS * 16,
		 VRING_DESC_F_INDIRECT, 0);
	linear_table(indir_host(r), VQ_MAX_SEGS);
	avail_add(r, 0);
	expect_bad_chain(r, 0);
	ring_free(r);
}

/*
 * Regression: an indirect table larger than VQ_MAX_SEGS whose short chain
 * uses an entry past index VQ_MAX_SEGS is legal (2.7.5.3 bounds next by the
 * table size only); walk_chain() once checked next against the hop cap.
 */
static void test_large_indirect_table_next_past_seg_limit(void)
{
	struct ring *r = ring_up(8, true, false);
	struct vring_desc *t = indir_host(r);

	desc_set(&t[0], buf_gpa(0), 16, VRING_DESC_F_NEXT, 300);
	desc_set(&t[300], buf_gpa(1), 1, VRING_DESC_F_WRITE, 0);
	desc_set(&r->desc[0], indir_gpa(), 512 * 16, VRING_DESC_F_INDIRECT, 0);
	avail_add(r, 0);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.out_num, 1);
	ASSERT_EQ(r->e.in_num, 1);
	ring_free(r);
}

/* ---- used ring and notifications ---- */

/* vq_push fills used entries in order; vq_flush alone publishes
 * used->idx. */
static void test_push_flush_writes_used_ring(void)
{
	struct ring *r = ring_up(8, false, false);

	chain3(r->desc, 0, 0);
	chain3(r->desc, 3, 3);
	avail_add(r, 0);
	avail_add(r, 3);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(pop(r), 1);
	vq_push(&r->vq, 3, 513);
	vq_push(&r->vq, 0, 1);
	ASSERT_EQ(r->used->idx, 0);
	vq_flush(&r->vq);
	ASSERT_EQ(r->used->idx, 2);
	ASSERT_EQ(r->used->ring[0].id, 3);
	ASSERT_EQ(r->used->ring[0].len, 513);
	ASSERT_EQ(r->used->ring[1].id, 0);
	ASSERT_EQ(r->used->ring[1].len, 1);
	ring_free(r);
}

/* A bad chain's head can still be completed through the used ring. */
static void test_bad_chain_head_is_pushed_back(void)
{
	struct ring *r = ring_up(8, false, false);

	desc_set(&r->desc[6], buf_gpa(0), 16, VRING_DESC_F_NEXT, 6);
	avail_add(r, 6);
	expect_bad_chain(r, 6);
	vq_push(&r->vq, r->e.head, 0);
	vq_flush(&r->vq);
	ASSERT_EQ(r->used->idx, 1);
	ASSERT_EQ(r->used->ring[0].id, 6);
	ring_free(r);
}

/* Without EVENT_IDX, notification follows VRING_AVAIL_F_NO_INTERRUPT
 * on every call. */
static void test_should_notify_follows_no_interrupt(void)
{
	struct ring *r = ring_up(8, false, false);

	vq_push(&r->vq, 0, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(vq_should_notify(&r->vq));
	r->avail->flags = VRING_AVAIL_F_NO_INTERRUPT;
	vq_push(&r->vq, 1, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(!vq_should_notify(&r->vq));
	r->avail->flags = 0;
	ASSERT_TRUE(vq_should_notify(&r->vq));
	ring_free(r);
}

/* With EVENT_IDX the first call after vq_init always notifies, whatever
 * used_event says (we have no previous notification to compare with). */
static void test_should_notify_first_call_always_notifies(void)
{
	struct ring *r = ring_up(8, false, true);

	r->avail->ring[8] = 0x8000;	/* used_event */
	r->avail->flags = VRING_AVAIL_F_NO_INTERRUPT;	/* ignored */
	vq_push(&r->vq, 0, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(vq_should_notify(&r->vq));
	ring_free(r);
}

/* With EVENT_IDX, notify only when used_event lies in the batch
 * published since the last call (2.7.7.2). */
static void test_should_notify_uses_used_event(void)
{
	struct ring *r = ring_up(8, false, true);
	uint16_t *used_event = &r->avail->ring[8];

	*used_event = 1;
	for (unsigned i = 0; i < 3; i++)
		vq_push(&r->vq, i, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(vq_should_notify(&r->vq));		/* 0..3, event 1 */
	vq_push(&r->vq, 3, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(!vq_should_notify(&r->vq));	/* 3..4, event 1 */
	*used_event = 4;
	r->avail->flags = VRING_AVAIL_F_NO_INTERRUPT;	/* ignored (2.7.7.2) */
	vq_push(&r->vq, 4, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(vq_should_notify(&r->vq));		/* 4..5, event 4 */
	*used_event = 4;
	vq_push(&r->vq, 5, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(!vq_should_notify(&r->vq));	/* 5..6, event 4 */
	ring_free(r);
}

/* vq_notify_wanted, the hint for early notification: true exactly when
 * used_event lies among the entries pushed since the last decision, and it
 * changes nothing (the decision that follows still sees the same range). */
static void test_notify_wanted_is_a_pure_hint(void)
{
	struct ring *r = ring_up(8, false, true);
	uint16_t *used_event = &r->avail->ring[8];

	vq_push(&r->vq, 0, 0);
	ASSERT_TRUE(!vq_notify_wanted(&r->vq));	/* no decision yet: leave it to the end */
	vq_flush(&r->vq);
	ASSERT_TRUE(vq_should_notify(&r->vq));		/* the first always notifies; range now 1.. */
	*used_event = 2;
	vq_push(&r->vq, 1, 0);				/* 1..2: entry 1, driver waits for 2 */
	ASSERT_TRUE(!vq_notify_wanted(&r->vq));
	vq_push(&r->vq, 2, 0);				/* 1..3: holds 2 */
	ASSERT_TRUE(vq_notify_wanted(&r->vq));
	ASSERT_TRUE(vq_notify_wanted(&r->vq));		/* unchanged by asking */
	vq_flush(&r->vq);
	ASSERT_TRUE(vq_should_notify(&r->vq));
	ASSERT_TRUE(!vq_notify_wanted(&r->vq));	/* decided: range empty */
	vq_push(&r->vq, 3, 0);
	ASSERT_TRUE(!vq_notify_wanted(&r->vq));	/* event 2 is behind */
	ring_free(r);

	r = ring_up(8, false, false);			/* no EVENT_IDX: never a hint */
	vq_push(&r->vq, 0, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(vq_should_notify(&r->vq));
	vq_push(&r->vq, 1, 0);
	ASSERT_TRUE(!vq_notify_wanted(&r->vq));
	ring_free(r);
}

/* With EVENT_IDX, vq_enable_notify sets avail_event to last_avail_idx
 * and reports buffers published but not yet taken. */
static void test_enable_notify_event_idx_sets_avail_event(void)
{
	struct ring *r = ring_up(8, false, true);
	uint16_t *avail_event = (uint16_t *)&r->used->ring[8];

	*avail_event = 0xffff;
	vq_disable_notify(&r->vq);
	ASSERT_EQ(r->used->flags, 0);		/* EVENT_IDX: no flag */
	ASSERT_TRUE(!vq_enable_notify(&r->vq));
	ASSERT_EQ(*avail_event, 0);

	chain3(r->desc, 0, 0);
	avail_add(r, 0);
	ASSERT_TRUE(vq_enable_notify(&r->vq));
	ASSERT_EQ(*avail_event, 0);
	ASSERT_EQ(pop(r), 1);
	ASSERT_TRUE(!vq_enable_notify(&r->vq));
	ASSERT_EQ(*avail_event, 1);
	ring_free(r);
}

/* Without EVENT_IDX, vq_disable_notify sets VRING_USED_F_NO_NOTIFY and
 * vq_enable_notify clears it, reporting pending buffers. */
static void test_enable_notify_clears_no_notify(void)
{
	struct ring *r = ring_up(8, false, false);

	vq_disable_notify(&r->vq);
	ASSERT_EQ(r->used->flags, VRING_USED_F_NO_NOTIFY);
	ASSERT_TRUE(!vq_enable_notify(&r->vq));
	ASSERT_EQ(r->used->flags, 0);

	vq_disable_notify(&r->vq);
	ASSERT_EQ(r->used->flags, VRING_USED_F_NO_NOTIFY);
	chain3(r->desc, 0, 0);
	avail_add(r, 0);
	ASSERT_TRUE(vq_enable_notify(&r->vq));
	ASSERT_EQ(r->used->flags, 0);
	ASSERT_TRUE(vq_avail_pending(&r->vq));
	ASSERT_EQ(pop(r), 1);
	ASSERT_TRUE(!vq_avail_pending(&r->vq));
	ring_free(r);
}

/* ---- index bases and 16-bit wrap-around ---- */

/* A nonzero base (SET_VRING_BASE) starts at avail and used slots
 * base & (num - 1). */
static void test_nonzero_base(void)
{
	struct ring *r = ring_new(8, 100);

	ring_start(r);
	ASSERT_EQ(pop(r), 0);
	chain3(r->desc, 1, 0);
	avail_add(r, 1);
	ASSERT_EQ(r->avail->ring[100 % 8], 1);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 1);
	check_chain3(r, 0);
	ASSERT_EQ(r->vq.last_avail_idx, 101);
	vq_push(&r->vq, 1, 7);
	vq_flush(&r->vq);
	ASSERT_EQ(r->used->idx, 101);
	ASSERT_EQ(r->used->ring[100 % 8].id, 1);
	ASSERT_EQ(r->used->ring[100 % 8].len, 7);
	ring_free(r);
}

/* Avail and used indices wrap from 65535 to 0 mid-batch. */
static void test_index_wraparound(void)
{
	struct ring *r = ring_new(8, 65534);

	ring_start(r);
	for (unsigned i = 0; i < 4; i++) {
		desc_set(&r->desc[i], buf_gpa(i), 8, VRING_DESC_F_WRITE, 0);
		avail_add(r, i);
	}
	ASSERT_EQ(r->avail->idx, 2);
	for (unsigned i = 0; i < 4; i++) {
		ASSERT_EQ(pop(r), 1);
		ASSERT_EQ(r->e.head, i);
		ASSERT_PTR_EQ(r->e.iov[0].iov_base, buf_host(r, i));
		vq_push(&r->vq, r->e.head, 8);
	}
	ASSERT_EQ(pop(r), 0);
	ASSERT_EQ(r->vq.last_avail_idx, 2);
	vq_flush(&r->vq);
	ASSERT_EQ(r->used->idx, 2);
	ASSERT_EQ(r->used->ring[6].id, 0);
	ASSERT_EQ(r->used->ring[7].id, 1);
	ASSERT_EQ(r->used->ring[0].id, 2);
	ASSERT_EQ(r->used->ring[1].id, 3);
	ring_free(r);
}

/* A full ring whose avail->idx wrapped past 65535 is legal. */
static void test_avail_idx_full_ring_across_wrap(void)
{
	struct ring *r = ring_new(8, 65534);

	ring_start(r);
	for (unsigned i = 0; i < 8; i++) {
		desc_set(&r->desc[i], buf_gpa(i), 4, 0, 0);
		avail_add(r, i);
	}
	ASSERT_EQ(r->avail->idx, 6);
	for (unsigned i = 0; i < 8; i++) {
		ASSERT_EQ(pop(r), 1);
		ASSERT_EQ(r->e.head, i);
	}
	ASSERT_EQ(pop(r), 0);
	ring_free(r);
}

/* avail->idx more than num ahead across the wrap breaks the queue. */
static void test_avail_idx_jump_across_wrap_breaks_queue(void)
{
	struct ring *r = ring_new(8, 65534);

	ring_start(r);
	for (unsigned i = 0; i < 8; i++)
		desc_set(&r->desc[i], buf_gpa(i), 4, 0, 0);
	r->avail->idx = (uint16_t)(65534 + 9);
	ASSERT_EQ(pop(r), -EIO);
	ASSERT_TRUE(r->vq.broken);
	ring_free(r);
}

/* EVENT_IDX notification and avail_event across the 16-bit wrap. */
static void test_event_idx_across_wrap(void)
{
	struct ring *r = ring_new(8, 65534);
	uint16_t *used_event = &r->avail->ring[8];
	uint16_t *avail_event = (uint16_t *)&r->used->ring[8];

	r->cfg.event_idx = true;
	ring_start(r);
	vq_push(&r->vq, 0, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(vq_should_notify(&r->vq));		/* first, at 65535 */
	*used_event = 65535;
	vq_push(&r->vq, 1, 0);
	vq_push(&r->vq, 2, 0);
	vq_flush(&r->vq);
	ASSERT_EQ(r->used->idx, 1);
	ASSERT_TRUE(vq_should_notify(&r->vq));		/* 65535..1, event 65535 */
	*used_event = 0;
	vq_push(&r->vq, 3, 0);
	vq_flush(&r->vq);
	ASSERT_TRUE(!vq_should_notify(&r->vq));	/* 1..2, event 0 */

	for (unsigned i = 0; i < 3; i++) {
		desc_set(&r->desc[i], buf_gpa(i), 8, 0, 0);
		avail_add(r, i);
	}
	for (unsigned i = 0; i < 3; i++)
		ASSERT_EQ(pop(r), 1);
	ASSERT_TRUE(!vq_enable_notify(&r->vq));
	ASSERT_EQ(*avail_event, 1);
	ring_free(r);
}


/*
 * Regression (found by fuzz_vu): ring addresses aligned in the frontend's
 * address space but not in our mapping (mmap_offset and the frontend's
 * address disagree modulo 16) must be refused, not read misaligned.
 */
static void test_init_rejects_host_misaligned_rings(void)
{
	struct gm_table t = { 0 };
	struct gm_region r;
	struct vq_config cfg = { .num = 8 };
	struct vq vq;
	int fd = memfd_create("test_vq_misaligned", MFD_CLOEXEC);

	ASSERT_TRUE(fd >= 0);
	ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
	/* host = mapping + 8 while qva is 4 KiB aligned */
	ASSERT_EQ(gm_region_map(&r, 0x100000, 65536, 0x7f0000000000ull, 8, fd), 0);
	ASSERT_EQ(gm_table_add(&t, &r), 0);
	cfg.desc_qva = 0x7f0000000000ull;
	cfg.avail_qva = 0x7f0000001000ull;
	cfg.used_qva = 0x7f0000002000ull;
	ASSERT_EQ(vq_init(&vq, &cfg, &t), -EINVAL);
	gm_table_clear(&t);
	close(fd);
}

int main(void)
{
	RUN(test_init_rejects_host_misaligned_rings);
	RUN(test_misaligned_indirect_table_is_bad_chain);
	RUN(test_enable_notify_index_backwards_breaks_queue);
	RUN(test_init_rejects_num_zero);
	RUN(test_init_rejects_num_not_power_of_two);
	RUN(test_init_rejects_num_above_max);
	RUN(test_init_accepts_num_limits);
	RUN(test_init_rejects_misaligned_desc);
	RUN(test_init_rejects_misaligned_avail);
	RUN(test_init_rejects_misaligned_used);
	RUN(test_init_accepts_minimal_alignment);
	RUN(test_init_rejects_rings_outside_memory);
	RUN(test_init_rejects_desc_straddling_end);
	RUN(test_init_rejects_avail_used_event_past_end);
	RUN(test_init_rejects_used_straddling_end);

	RUN(test_empty_ring_returns_zero);
	RUN(test_good_chain_pops);
	RUN(test_chain_of_num_descriptors_pops);
	RUN(test_avail_idx_full_ring_is_not_corrupt);

	RUN(test_head_out_of_range_breaks_queue);
	RUN(test_avail_idx_jump_breaks_queue);
	RUN(test_avail_idx_backwards_breaks_queue);
	RUN(test_avail_idx_full_ring_across_wrap);
	RUN(test_avail_idx_jump_across_wrap_breaks_queue);

	RUN(test_next_out_of_range_fails_only_that_chain);
	RUN(test_descriptor_loop_is_bad_chain);
	RUN(test_self_loop_is_bad_chain);
	RUN(test_buffer_outside_memory_is_bad_chain);
	RUN(test_buffer_ending_outside_memory_is_bad_chain);
	RUN(test_buffer_addr_len_overflow_is_bad_chain);
	RUN(test_readable_after_writable_is_bad_chain);
	RUN(test_bad_chain_last_byte_is_final_writable_byte);
	RUN(test_bad_chain_last_byte_null_when_final_readable);
	RUN(test_bad_chain_last_byte_null_when_final_outside);
	RUN(test_request_over_4gib_is_bad_chain);

	RUN(test_indirect_good_table);
	RUN(test_direct_then_indirect);
	RUN(test_indirect_descriptor_write_flag_ignored);
	RUN(test_indirect_not_negotiated_is_bad_chain);
	RUN(test_indirect_len_not_multiple_of_16_is_bad_chain);
	RUN(test_indirect_len_zero_is_bad_chain);
	RUN(test_nested_indirect_is_bad_chain);
	RUN(test_indirect_with_next_is_bad_chain);
	RUN(test_indirect_table_outside_memory_is_bad_chain);
	RUN(test_indirect_loop_is_bad_chain);
	RUN(test_indirect_next_out_of_range_is_bad_chain);
	RUN(test_max_segs_in_indirect_pops);
	RUN(test_too_many_segs_is_bad_chain);
	RUN(test_too_many_segs_direct_plus_indirect_is_bad_chain);
	RUN(test_large_indirect_table_next_past_seg_limit);

	RUN(test_push_flush_writes_used_ring);
	RUN(test_bad_chain_head_is_pushed_back);
	RUN(test_should_notify_follows_no_interrupt);
	RUN(test_should_notify_first_call_always_notifies);
	RUN(test_should_notify_uses_used_event);
	RUN(test_notify_wanted_is_a_pure_hint);
	RUN(test_enable_notify_event_idx_sets_avail_event);
	RUN(test_enable_notify_clears_no_notify);

	RUN(test_nonzero_base);
	RUN(test_index_wraparound);
	RUN(test_event_idx_across_wrap);
	return T_EXIT_PASS;
}
