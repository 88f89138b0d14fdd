/* Description: virtio/vq.h on packed rings (virtio 1.2, 2.8) against
 * hand-built hostile rings: lists, indirect tables, ids, wrap counters,
 * both event suppression areas, and the base QEMU saves and restores. */
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

/* Fake guest memory: one 1 MiB memfd region at gpa 0x100000, seen by the
 * frontend at qva 0x7f0000000000 (rings by qva, buffers by gpa). */
#define MEM_GPA    0x100000ull
#define MEM_QVA    0x7f0000000000ull
#define MEM_SIZE   0x100000ull
#define DESC_OFF   0x0000ull
#define DRV_OFF    0x1000ull	/* driver event area */
#define DEV_OFF    0x2000ull	/* device event area */
#define INDIR_OFF  0x8000ull
#define BUF_OFF    0x10000ull

#define F_AVAIL VRING_PACKED_DESC_F_AVAIL
#define F_USED  VRING_PACKED_DESC_F_USED
#define F_NEXT  VRING_DESC_F_NEXT
#define F_WRITE VRING_DESC_F_WRITE
#define F_IND   VRING_DESC_F_INDIRECT

struct ring {
	struct gm_table mem;
	struct vq_config cfg;
	struct vq vq;
	uint8_t *host;
	struct vring_packed_desc *desc;
	struct vring_packed_event *drv, *dev;
	/* The driver's side. */
	uint16_t pos;		/* next position to make available */
	bool wrap;		/* driver ring wrap counter */
	uint16_t used_pos;	/* next used descriptor to read */
	bool used_wrap;
	struct vq_elem e;
	struct iovec iov[VQ_MAX_SEGS];
};

static struct ring *ring_new(unsigned num)
{
	struct ring *r = calloc(1, sizeof(*r));

	ASSERT_TRUE(r != NULL);
	r->host = test_guest_mem(&r->mem, MEM_GPA, MEM_QVA, MEM_SIZE);
	r->desc = (struct vring_packed_desc *)(r->host + DESC_OFF);
	r->drv = (struct vring_packed_event *)(r->host + DRV_OFF);
	r->dev = (struct vring_packed_event *)(r->host + DEV_OFF);
	r->wrap = r->used_wrap = true;
	r->cfg.num = num;
	r->cfg.packed = true;
	r->cfg.desc_qva = MEM_QVA + DESC_OFF;
	r->cfg.avail_qva = MEM_QVA + DRV_OFF;
	r->cfg.used_qva = MEM_QVA + DEV_OFF;
	/* QEMU's first SET_VRING_BASE: position 0, wrap counters 1. */
	r->cfg.last_avail_idx = 0x8000;
	r->cfg.used_idx = 0x8000;
	r->e.iov = r->iov;
	return r;
}

static struct ring *ring_up(unsigned num, bool indirect, bool event_idx)
{
	struct ring *r = ring_new(num);

	r->cfg.indirect = indirect;
	r->cfg.event_idx = event_idx;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	return r;
}

static void ring_free(struct ring *r)
{
	vq_release(&r->vq);
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

static uint16_t avail_flags(bool wrap)
{
	return wrap ? F_AVAIL : F_USED;
}

/*
 * Make a list of n descriptors available as a driver does (2.8.21.1):
 * the rest of the list, then the first one's flags after a barrier.
 * flags[i] are the NEXT/WRITE/INDIRECT bits; id goes in every descriptor.
 */
static void avail_list(struct ring *r, unsigned n, const uint64_t *addr,
		       const uint32_t *len, const uint16_t *flags, uint16_t id)
{
	uint16_t first = r->pos, first_flags = 0;

	for (unsigned i = 0; i < n; i++) {
		struct vring_packed_desc *d = &r->desc[r->pos];
		uint16_t f = flags[i] | avail_flags(r->wrap);

		d->addr = addr[i];
		d->len = len[i];
		d->id = id;
		if (i == 0)
			first_flags = f;
		else
			d->flags = f;
		if (++r->pos == r->cfg.num) {
			r->pos = 0;
			r->wrap = !r->wrap;
		}
	}
	atomic_thread_fence(memory_order_release);
	r->desc[first].flags = first_flags;
}

/* virtio-blk shaped: header, 512 writable, 1 status, over buffers b.. */
static void avail_blk(struct ring *r, uint16_t id, unsigned b)
{
	const uint64_t a[3] = { buf_gpa(b), buf_gpa(b + 1), buf_gpa(b + 2) };
	const uint32_t l[3] = { 16, 512, 1 };
	const uint16_t f[3] = { F_NEXT, F_WRITE | F_NEXT, F_WRITE };

	avail_list(r, 3, a, l, f, id);
}

static void avail_one(struct ring *r, uint16_t id, unsigned b)
{
	const uint64_t a = buf_gpa(b);
	const uint32_t l = 16;
	const uint16_t f = 0;

	avail_list(r, 1, &a, &l, &f, id);
}

static int pop(struct ring *r)
{
	return vq_pop(&r->vq, &r->e);
}

/* The driver reads the next used descriptor: its id, or -1 if none. */
static int used_read(struct ring *r, uint32_t *len, unsigned slots)
{
	struct vring_packed_desc *d = &r->desc[r->used_pos];
	bool u = d->flags & F_USED, a = d->flags & F_AVAIL;

	if (u != r->used_wrap || a != r->used_wrap)
		return -1;
	if (len)
		*len = d->len;
	r->used_pos += slots;
	if (r->used_pos >= r->cfg.num) {
		r->used_pos -= r->cfg.num;
		r->used_wrap = !r->used_wrap;
	}
	return d->id;
}

static void check_blk(struct ring *r, unsigned b)
{
	ASSERT_EQ(r->e.out_num, 1);
	ASSERT_EQ(r->e.in_num, 2);
	ASSERT_EQ(r->e.out_len, 16);
	ASSERT_EQ(r->e.in_len, 513);
	ASSERT_PTR_EQ(r->e.iov[0].iov_base, buf_host(r, b));
	ASSERT_PTR_EQ(r->e.iov[1].iov_base, buf_host(r, b + 1));
	ASSERT_PTR_EQ(r->e.iov[2].iov_base, buf_host(r, b + 2));
}

static void expect_bad_chain(struct ring *r, uint16_t id)
{
	uint64_t before = r->vq.bad_chains;

	r->vq.logged_bad_chain = false;
	ASSERT_EQ(pop(r), -EINVAL);
	ASSERT_EQ(r->e.head, id);
	ASSERT_TRUE(!r->vq.broken);
	ASSERT_EQ(r->vq.bad_chains, before + 1);
}

static void expect_broken(struct ring *r)
{
	ASSERT_EQ(pop(r), -EIO);
	ASSERT_TRUE(r->vq.broken);
	ASSERT_TRUE(vq_is_broken(&r->vq));
	ASSERT_EQ(pop(r), -EIO);
}

/* ---- init and base ---- */

static void test_init_checks_alignment_and_positions(void)
{
	struct ring *r = ring_new(8);

	r->cfg.avail_qva += 2;		/* event areas: 4-byte aligned */
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.avail_qva -= 2;
	r->cfg.desc_qva += 8;		/* descriptor ring: 16 */
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.desc_qva -= 8;
	r->cfg.last_avail_idx = 0x8000 | 8;	/* position past the ring */
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.last_avail_idx = 0x8000;
	r->cfg.used_idx = 9;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.used_idx = 0x8000;
	r->cfg.used_qva = MEM_QVA + MEM_SIZE - 2;	/* outside memory */
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	r->cfg.used_qva = MEM_QVA + DEV_OFF;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	ASSERT_EQ(vq_base(&r->vq), 0x80008000u);
	ring_free(r);
}

/* The base is QEMU's encoding both ways: a ring restarted from what
 * GET_VRING_BASE said goes on where it stopped, in the right lap. */
static void test_base_round_trip_across_wrap(void)
{
	struct ring *r = ring_up(4, false, false);
	uint32_t base;

	for (unsigned i = 0; i < 5; i++) {	/* one lap and one more */
		avail_one(r, (uint16_t)(i % 4), 0);
		ASSERT_EQ(pop(r), 1);
		vq_push(&r->vq, r->e.head, 0);
		ASSERT_EQ(used_read(r, NULL, 1), (int)(i % 4));
	}
	base = vq_base(&r->vq);
	ASSERT_EQ(base, 1u | 1u << 16);		/* position 1, wrap counters 0 */
	vq_release(&r->vq);
	r->cfg.last_avail_idx = (uint16_t)base;
	r->cfg.used_idx = (uint16_t)(base >> 16);
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	ASSERT_EQ(pop(r), 0);
	avail_one(r, 2, 0);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 2);
	vq_push(&r->vq, 2, 0);
	ASSERT_EQ(used_read(r, NULL, 1), 2);
	ring_free(r);
}

/* ---- taking requests ---- */

static void test_empty_ring_returns_zero(void)
{
	struct ring *r = ring_up(8, false, false);

	ASSERT_EQ(pop(r), 0);
	ASSERT_TRUE(!vq_avail_pending(&r->vq));
	/* A descriptor with both flags equal is used, not available. */
	r->desc[0].flags = F_AVAIL | F_USED;
	ASSERT_EQ(pop(r), 0);
	ring_free(r);
}

static void test_list_pops_and_uses_one_descriptor(void)
{
	struct ring *r = ring_up(8, false, false);
	uint32_t len = 0;

	avail_blk(r, 5, 0);
	ASSERT_TRUE(vq_avail_pending(&r->vq));
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 5);
	check_blk(r, 0);
	ASSERT_EQ(pop(r), 0);
	vq_push(&r->vq, 5, 513);
	vq_flush(&r->vq);
	/* One used descriptor, where the list started, WRITE since the
	 * device wrote; the next one goes 3 further. */
	ASSERT_EQ(used_read(r, &len, 3), 5);
	ASSERT_EQ(len, 513);
	ASSERT_TRUE(r->desc[0].flags & F_WRITE);
	ASSERT_EQ(vq_base(&r->vq), (0x8000u | 3) | (0x8000u | 3) << 16);
	ring_free(r);
}

/* Completion order, not ring order: each used descriptor at the device's
 * position, the driver skipping by the list length of the id it finds. */
static void test_out_of_order_use(void)
{
	struct ring *r = ring_up(8, false, false);

	avail_blk(r, 1, 0);
	avail_one(r, 2, 3);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(pop(r), 1);
	vq_push(&r->vq, 2, 0);
	vq_push(&r->vq, 1, 1);
	ASSERT_EQ(used_read(r, NULL, 1), 2);	/* id 2 took one slot */
	ASSERT_EQ(used_read(r, NULL, 3), 1);
	ASSERT_EQ(used_read(r, NULL, 1), -1);
	ring_free(r);
}

/* Many laps of a ring of 4 with lists of 3: the wrap counters flip on
 * both sides, the device never reads a stale lap's descriptor. */
static void test_lists_across_many_laps(void)
{
	struct ring *r = ring_up(4, false, false);

	for (unsigned i = 0; i < 50; i++) {
		avail_blk(r, (uint16_t)(i & 3), 0);
		ASSERT_EQ(pop(r), 1);
		ASSERT_EQ(r->e.head, (uint16_t)(i & 3));
		check_blk(r, 0);
		ASSERT_EQ(pop(r), 0);
		vq_push(&r->vq, r->e.head, 1);
		ASSERT_EQ(used_read(r, NULL, 3), (int)(i & 3));
	}
	ring_free(r);
}

static void test_indirect_table_pops(void)
{
	struct ring *r = ring_up(8, true, false);
	struct vring_packed_desc *t = (struct vring_packed_desc *)(r->host + INDIR_OFF);
	const uint64_t a = MEM_GPA + INDIR_OFF;
	const uint32_t l = 3 * sizeof(*t);
	const uint16_t f = F_IND;

	t[0] = (struct vring_packed_desc){ buf_gpa(0), 16, 0, 0 };
	/* NEXT inside a packed indirect table is reserved: ignored. */
	t[1] = (struct vring_packed_desc){ buf_gpa(1), 512, 0, F_WRITE | F_NEXT };
	t[2] = (struct vring_packed_desc){ buf_gpa(2), 1, 0, F_WRITE };
	avail_list(r, 1, &a, &l, &f, 7);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 7);
	check_blk(r, 0);
	vq_push(&r->vq, 7, 1);
	ASSERT_EQ(used_read(r, NULL, 1), 7);
	ring_free(r);
}

static void test_indirect_errors_fail_only_the_request(void)
{
	struct ring *r = ring_up(8, true, false);
	uint64_t a[2] = { MEM_GPA + INDIR_OFF, buf_gpa(5) };
	uint32_t l[2] = { 32, 16 };
	uint16_t f[2] = { F_IND | F_NEXT, 0 };

	/* INDIRECT in a list (2.8.8.1): the list is still consumed whole. */
	avail_list(r, 2, a, l, f, 1);
	expect_bad_chain(r, 1);
	vq_push(&r->vq, 1, 0);
	ASSERT_EQ(used_read(r, NULL, 2), 1);
	/* A table that is not whole descriptors. */
	l[0] = 24;
	f[0] = F_IND;
	avail_list(r, 1, a, l, f, 2);
	expect_bad_chain(r, 2);
	/* A table outside guest memory. */
	a[0] = MEM_GPA + MEM_SIZE - 16;
	l[0] = 32;
	avail_list(r, 1, a, l, f, 3);
	expect_bad_chain(r, 3);
	ring_free(r);
	/* INDIRECT not negotiated. */
	r = ring_up(8, false, false);
	a[0] = MEM_GPA + INDIR_OFF;
	avail_list(r, 1, a, l, f, 4);
	expect_bad_chain(r, 4);
	ring_free(r);
}

static void test_buffer_errors_fail_only_the_request(void)
{
	struct ring *r = ring_up(8, false, false);
	uint64_t a[2] = { MEM_GPA + MEM_SIZE - 8, buf_gpa(1) };
	uint32_t l[2] = { 16, 1 };
	uint16_t f[2] = { F_NEXT, F_WRITE };

	avail_list(r, 2, a, l, f, 0);		/* outside guest memory */
	expect_bad_chain(r, 0);
	/* The status byte is still reachable: last_byte. */
	ASSERT_PTR_EQ(r->e.last_byte, buf_host(r, 1));
	a[0] = buf_gpa(0);
	f[0] = F_WRITE | F_NEXT;
	f[1] = 0;				/* readable after writable */
	avail_list(r, 2, a, l, f, 1);
	expect_bad_chain(r, 1);
	ASSERT_PTR_EQ(r->e.last_byte, NULL);
	/* The queue goes on. */
	avail_blk(r, 2, 0);
	ASSERT_EQ(pop(r), 1);
	ring_free(r);
}

static void test_list_longer_than_ring_breaks_queue(void)
{
	struct ring *r = ring_up(4, false, false);
	const uint64_t a[4] = { buf_gpa(0), buf_gpa(1), buf_gpa(2), buf_gpa(3) };
	const uint32_t l[4] = { 16, 16, 16, 16 };
	const uint16_t f[4] = { F_NEXT, F_NEXT, F_NEXT, F_NEXT };

	/* Four NEXTs in a ring of four: the list never ends (it would
	 * run into its own first descriptor). */
	avail_list(r, 4, a, l, f, 0);
	expect_broken(r);
	ring_free(r);
}

static void test_list_into_unavailable_descriptor_breaks_queue(void)
{
	struct ring *r = ring_up(8, false, false);
	const uint64_t a = buf_gpa(0);
	const uint32_t l = 16;
	const uint16_t f = F_NEXT;

	/* The list says NEXT but the driver never made the next one
	 * available. */
	avail_list(r, 1, &a, &l, &f, 0);
	expect_broken(r);
	ring_free(r);
}

static void test_bad_ids_break_queue(void)
{
	struct ring *r = ring_up(8, false, false);

	avail_one(r, 8, 0);			/* id >= num */
	expect_broken(r);
	ring_free(r);
	r = ring_up(8, false, false);
	avail_one(r, 3, 0);
	avail_one(r, 3, 1);			/* id 3 still in flight */
	ASSERT_EQ(pop(r), 1);
	expect_broken(r);
	ring_free(r);
}

/* A push for an id vq_pop never handed out writes nothing. */
static void test_push_of_unknown_id_writes_nothing(void)
{
	struct ring *r = ring_up(8, false, false);

	vq_push(&r->vq, 3, 0);
	vq_push(&r->vq, 200, 0);
	ASSERT_EQ(used_read(r, NULL, 1), -1);
	ASSERT_EQ(vq_base(&r->vq), 0x80008000u);
	ring_free(r);
}

/* ---- event suppression ---- */

static void test_driver_area_enable_disable(void)
{
	struct ring *r = ring_up(8, false, false);

	avail_one(r, 0, 0);
	ASSERT_EQ(pop(r), 1);
	vq_push(&r->vq, 0, 0);
	r->drv->flags = VRING_PACKED_EVENT_F_DISABLE;
	ASSERT_TRUE(!vq_should_notify(&r->vq));
	r->drv->flags = VRING_PACKED_EVENT_F_ENABLE;
	ASSERT_TRUE(vq_should_notify(&r->vq));
	/* DESC without EVENT_IDX negotiated: not a valid "off". */
	r->drv->flags = VRING_PACKED_EVENT_F_DESC;
	ASSERT_TRUE(vq_should_notify(&r->vq));
	ring_free(r);
}

/* EVENT_IDX: notify when the descriptor at off_wrap was used in the batch,
 * in the right lap. */
static void test_driver_area_desc_event(void)
{
	struct ring *r = ring_up(4, false, true);

	r->drv->flags = VRING_PACKED_EVENT_F_DESC;
	r->drv->off_wrap = 0 | VRING_PACKED_EVENT_WRAP;
	avail_one(r, 0, 0);
	ASSERT_EQ(pop(r), 1);
	vq_push(&r->vq, 0, 0);
	ASSERT_TRUE(vq_should_notify(&r->vq));	/* first: always */
	/* Event at position 2 of this lap; use 1 (nothing), then 2. */
	r->drv->off_wrap = 2 | VRING_PACKED_EVENT_WRAP;
	avail_one(r, 1, 0);
	ASSERT_EQ(pop(r), 1);
	vq_push(&r->vq, 1, 0);
	ASSERT_TRUE(!vq_notify_wanted(&r->vq));
	ASSERT_TRUE(!vq_should_notify(&r->vq));
	avail_one(r, 2, 0);
	ASSERT_EQ(pop(r), 1);
	vq_push(&r->vq, 2, 0);
	ASSERT_TRUE(vq_notify_wanted(&r->vq));
	ASSERT_TRUE(vq_should_notify(&r->vq));
	ASSERT_TRUE(!vq_should_notify(&r->vq));	/* nothing new since */
	/* Position 0 of the next lap (wrap 0): use 3 (end of this lap),
	 * then 0 of the next. */
	r->drv->off_wrap = 0;
	avail_one(r, 3, 0);
	ASSERT_EQ(pop(r), 1);
	vq_push(&r->vq, 3, 0);
	ASSERT_TRUE(!vq_should_notify(&r->vq));
	avail_one(r, 0, 0);
	ASSERT_EQ(pop(r), 1);
	vq_push(&r->vq, 0, 0);
	ASSERT_TRUE(vq_should_notify(&r->vq));
	ring_free(r);
}

/* Our area: DISABLE while we work; re-enabled, DESC at the next position
 * we take with EVENT_IDX (ENABLE without), and a descriptor that came in
 * meanwhile is reported. */
static void test_device_area(void)
{
	struct ring *r = ring_up(4, false, true);

	vq_disable_notify(&r->vq);
	ASSERT_EQ(r->dev->flags, VRING_PACKED_EVENT_F_DISABLE);
	ASSERT_TRUE(!vq_enable_notify(&r->vq));
	ASSERT_EQ(r->dev->flags, VRING_PACKED_EVENT_F_DESC);
	ASSERT_EQ(r->dev->off_wrap, 0 | VRING_PACKED_EVENT_WRAP);
	for (unsigned i = 0; i < 5; i++) {
		avail_one(r, (uint16_t)(i & 3), 0);
		ASSERT_EQ(pop(r), 1);
		vq_push(&r->vq, r->e.head, 0);
	}
	ASSERT_TRUE(!vq_enable_notify(&r->vq));
	ASSERT_EQ(r->dev->off_wrap, 1);		/* position 1, lap with wrap 0 */
	avail_one(r, 1, 0);
	ASSERT_TRUE(vq_enable_notify(&r->vq));
	ring_free(r);
	r = ring_up(4, false, false);
	vq_disable_notify(&r->vq);
	ASSERT_TRUE(!vq_enable_notify(&r->vq));
	ASSERT_EQ(r->dev->flags, VRING_PACKED_EVENT_F_ENABLE);
	ring_free(r);
}

/* ---- in-flight tracking (restart after a crash) ---- */

static struct vq_inflight_region *region_new(unsigned num)
{
	struct vq_inflight_region *g = calloc(1, vq_inflight_region_size_packed(num));

	ASSERT_TRUE(g != NULL);
	return g;
}

static struct vq_inflight_packed_desc *state(struct vq_inflight_region *g, uint16_t id)
{
	return (struct vq_inflight_packed_desc *)&g->desc[id];
}

/* The backend dies (no stop, nothing drained) and a new one starts on the
 * same ring and region, with the stale base the frontend still has. */
static void crash_and_restart(struct ring *r)
{
	vq_release(&r->vq);
	r->cfg.last_avail_idx = 0x8000;
	r->cfg.used_idx = 0x8000;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
}

/* A ring of 8 with an in-flight region (fresh, or left by a previous
 * backend), started. */
static struct ring *ring_tracked(struct vq_inflight_region **gp)
{
	struct ring *r = ring_new(8);

	*gp = region_new(8);
	r->cfg.inflight = *gp;
	r->cfg.inflight_packed_room = true;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), 0);
	return r;
}

static void test_inflight_fresh_region_initialized(void)
{
	struct vq_inflight_region *g;
	struct ring *r = ring_tracked(&g);

	ASSERT_EQ(g->version, 2);
	ASSERT_EQ(g->desc_num, 8);
	ASSERT_EQ(g->used_idx, 0x8000);
	/* A split ring's region (version 1) is refused on a packed ring. */
	vq_release(&r->vq);
	g->version = 1;
	ASSERT_EQ(vq_init(&r->vq, &r->cfg, &r->mem), -EINVAL);
	ring_free(r);
	free(g);
}

/* Three requests taken (one a list of three), one used out of order, then
 * a crash: the other two come back oldest first, walked where they were,
 * and the next descriptor to take and the next used position are where
 * they really are, not where the stale base says. */
static void test_inflight_resubmits_after_crash(void)
{
	struct vq_inflight_region *g;
	struct ring *r = ring_tracked(&g);

	avail_one(r, 0, 0);
	avail_one(r, 1, 1);
	avail_blk(r, 2, 2);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(pop(r), 1);
	vq_push(&r->vq, 1, 0);
	ASSERT_EQ(used_read(r, NULL, 1), 1);
	crash_and_restart(r);
	ASSERT_EQ(vq_base(&r->vq), (0x8000u | 5) | (0x8000u | 1) << 16);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 0);
	ASSERT_PTR_EQ(r->e.iov[0].iov_base, buf_host(r, 0));
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 2);
	check_blk(r, 2);
	ASSERT_EQ(pop(r), 0);
	/* Both go back to the driver where it expects them. */
	vq_push(&r->vq, 2, 1);
	vq_push(&r->vq, 0, 0);
	ASSERT_EQ(used_read(r, NULL, 3), 2);
	ASSERT_EQ(used_read(r, NULL, 1), 0);
	/* And the ring goes on. */
	avail_one(r, 4, 0);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 4);
	ring_free(r);
	free(g);
}

/* The frontend shares the in-flight region and can rewrite it after the
 * queue started: a head far outside the ring, another list length, the
 * order reversed.  What is resubmitted is what was read and checked when
 * the queue started (the head outside the ring used to be walked: a read
 * up to 512 KiB past the region's copy of the ring). */
static void test_inflight_rewritten_after_start(void)
{
	struct vq_inflight_region *g;
	struct ring *r = ring_tracked(&g);

	avail_one(r, 0, 0);
	avail_blk(r, 2, 2);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(pop(r), 1);
	crash_and_restart(r);
	state(g, 2)->head = 0x7fff;
	state(g, 2)->len = 1;
	state(g, 0)->counter = 1000;	/* now "younger" than id 2 */
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 0);
	ASSERT_EQ(pop(r), 1);
	ASSERT_EQ(r->e.head, 2);
	check_blk(r, 2);
	ASSERT_EQ(pop(r), 0);
	ASSERT_EQ(vq_is_broken(&r->vq), false);
	ring_free(r);
	free(g);
}

/* Dying while returning a request: before its used descriptor (it is
 * resubmitted), after it (it is not, and the used position moves past
 * it), and after the header moved but before the entry was cleared. */
static void test_inflight_crash_while_returning(void)
{
	for (int when = 0; when < 3; when++) {
		struct vq_inflight_region *g;
		struct ring *r = ring_tracked(&g);

		avail_blk(r, 3, 0);
		avail_one(r, 4, 5);
		ASSERT_EQ(pop(r), 1);
		ASSERT_EQ(pop(r), 1);
		if (when == 0) {
			/* Marked "being returned", descriptor not written. */
			state(g, 3)->used_at = 0x8000;
			state(g, 3)->inflight = 2;
		} else {
			vq_push(&r->vq, 3, 1);
			state(g, 3)->inflight = 2;
			if (when == 1)
				g->used_idx = 0x8000;	/* header not moved yet */
		}
		crash_and_restart(r);
		ASSERT_EQ(pop(r), 1);
		if (when == 0) {
			ASSERT_EQ(r->e.head, 3);	/* back in flight */
			ASSERT_EQ(pop(r), 1);
			ASSERT_EQ(r->e.head, 4);
			ASSERT_EQ(vq_base(&r->vq), (0x8000u | 4) | 0x8000u << 16);
		} else {
			ASSERT_EQ(r->e.head, 4);	/* 3 was returned */
			ASSERT_EQ(vq_base(&r->vq), (0x8000u | 4) | (0x8000u | 3) << 16);
			ASSERT_EQ(used_read(r, NULL, 3), 3);
		}
		ASSERT_EQ(pop(r), 0);
		ring_free(r);
		free(g);
	}
}

int main(void)
{
	RUN(test_init_checks_alignment_and_positions);
	RUN(test_base_round_trip_across_wrap);
	RUN(test_empty_ring_returns_zero);
	RUN(test_list_pops_and_uses_one_descriptor);
	RUN(test_out_of_order_use);
	RUN(test_lists_across_many_laps);
	RUN(test_indirect_table_pops);
	RUN(test_indirect_errors_fail_only_the_request);
	RUN(test_buffer_errors_fail_only_the_request);
	RUN(test_list_longer_than_ring_breaks_queue);
	RUN(test_list_into_unavailable_descriptor_breaks_queue);
	RUN(test_bad_ids_break_queue);
	RUN(test_push_of_unknown_id_writes_nothing);
	RUN(test_driver_area_enable_disable);
	RUN(test_driver_area_desc_event);
	RUN(test_device_area);
	RUN(test_inflight_fresh_region_initialized);
	RUN(test_inflight_resubmits_after_crash);
	RUN(test_inflight_rewritten_after_start);
	RUN(test_inflight_crash_while_returning);
	return 0;
}
