/*
 * Description: dirty logging for live migration (vhost-user.rst
 * "Migration"): the log's bit layout and bounds, and every kind of store
 * the device makes into guest memory marks its page, each checked on a
 * page no other kind touches, so the case for a kind fails when that kind
 * alone is not logged: read data, GET_ID data, status bytes (of good,
 * failed and malformed requests), used-ring elements, used->idx,
 * avail_event and used->flags, the used ring at log_guest_addr rather
 * than its own address.
 *
 * Guest memory is one memfd region (GPA 0, frontend address QVA_BASE);
 * vq cases drive a struct vq directly, blk cases run a real virtio-blk
 * queue (null engine) on its iothread through blk_fuzz_process.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "test.h"

#include "backend/bdev.h"
#include "blk/blk.h"
#include "blk/virtio_blk.h"
#include "mem/dirty.h"
#include "mem/gm.h"
#include "util/log.h"
#include "util/sys.h"
#include "virtio/vq.h"

#define PAGE		4096ull
#define MEM_SIZE	(1ull << 20)
#define QVA_BASE	0x7f0000000000ull
#define NUM		1024u		/* used ring: 3 pages */
/* Guest-physical layout: each thing the device may write on its own page. */
#define DESC_GPA	0x0000ull	/* 4 pages */
#define AVAIL_GPA	0x4000ull
#define USED_GPA	0x5000ull	/* flags/idx on page 5, elements from 512 on
					 * page 6, avail_event on page 7 */
#define HDR_GPA		0x8000ull
#define DATA_GPA	0x9000ull
#define STATUS_GPA	0xa000ull
#define ID_GPA		0xb000ull
#define BAD_GPA		0xc000ull	/* status byte of a malformed chain */
#define USED_LOG_GPA	0x40000ull	/* a log_guest_addr unlike USED_GPA */
/* First used slot: element 600 lies on the used ring's second page. */
#define START		600u
#define LOG_BYTES	4096ull		/* covers 128 MiB */

static struct {
	int memfd, logfd;
	struct gm_table mem;
	uint8_t *g;			/* guest memory, GPA 0 */
	struct gm_dirty_log *log;
	struct bdev b;
	struct blk_dev *dev;
	int kick_fd;
} fx;

static struct vring_desc *desc(void)
{
	return (struct vring_desc *)(fx.g + DESC_GPA);
}

static struct vring_avail *avail(void)
{
	return (struct vring_avail *)(fx.g + AVAIL_GPA);
}

static struct vring_used *used(void)
{
	return (struct vring_used *)(fx.g + USED_GPA);
}

static bool dirty(uint64_t gpa)
{
	uint64_t page = gpa / PAGE;

	return fx.log->bits[page / 8] & (1u << (page % 8));
}

/* The frontend's side of a sync: take the bits, clearing them. */
static void log_clear(void)
{
	memset((void *)fx.log->bits, 0, fx.log->size);
}

static unsigned dirty_pages(void)
{
	unsigned n = 0;

	for (uint64_t i = 0; i < fx.log->size; i++)
		n += (unsigned)__builtin_popcount(fx.log->bits[i]);
	return n;
}

static void expect_dirty(uint64_t gpa, const char *what)
{
	if (!dirty(gpa))
		T_FAIL("%s: page of GPA 0x%llx not marked in the dirty log", what,
		       (unsigned long long)gpa);
}

static void expect_clean(uint64_t gpa, const char *what)
{
	if (dirty(gpa))
		T_FAIL("%s: page of GPA 0x%llx marked, but the device never wrote it",
		       what, (unsigned long long)gpa);
}

static void mem_setup(void)
{
	struct gm_region r;

	fx.memfd = memfd_create("test-dirty-guest", MFD_CLOEXEC);
	ASSERT_TRUE(fx.memfd >= 0);
	ASSERT_EQ(ftruncate(fx.memfd, (off_t)MEM_SIZE), 0);
	ASSERT_EQ(gm_region_map(&r, 0, MEM_SIZE, QVA_BASE, 0, fx.memfd), 0);
	ASSERT_EQ(gm_table_add(&fx.mem, &r), 0);
	fx.g = r.host;
	fx.logfd = memfd_create("test-dirty-log", MFD_CLOEXEC);
	ASSERT_TRUE(fx.logfd >= 0);
	ASSERT_EQ(ftruncate(fx.logfd, (off_t)LOG_BYTES), 0);
	ASSERT_EQ(gm_dirty_map(fx.logfd, LOG_BYTES, 0, &fx.log), 0);
}

static struct vq_config ring_config(bool event_idx, bool log_used, uint64_t used_log_gpa)
{
	struct vq_config c = {
		.index = 0, .num = NUM,
		.desc_qva = QVA_BASE + DESC_GPA,
		.avail_qva = QVA_BASE + AVAIL_GPA,
		.used_qva = QVA_BASE + USED_GPA,
		.last_avail_idx = START,
		.event_idx = event_idx,
		.log = { .log = fx.log, .used = log_used, .used_gpa = used_log_gpa },
	};

	return c;
}

/* An empty ring whose indices stand at START. */
static void ring_reset(void)
{
	memset(fx.g, 0, BAD_GPA + PAGE);
	avail()->idx = START;
	used()->idx = START;
}

/* ---- The log itself ---- */

/* Bit page % 8 of byte page / 8, every page a range touches. */
static void test_mark_sets_page_bits(void)
{
	log_clear();
	smp_mb();
	gm_dirty_mark(fx.log, 0x3fff, 2);	/* pages 3 and 4 */
	ASSERT_EQ(fx.log->bits[0], 0x18);
	gm_dirty_mark(fx.log, 17 * PAGE + 5, 1);
	ASSERT_EQ(fx.log->bits[2], 0x02);
	ASSERT_EQ(dirty_pages(), 3);
	gm_dirty_mark(fx.log, 0x100, 0);	/* nothing stored, nothing marked */
	ASSERT_EQ(dirty_pages(), 3);
}

/* Host pointers go back to guest-physical addresses, not frontend ones. */
static void test_mark_host_uses_gpa(void)
{
	log_clear();
	smp_mb();
	gm_dirty_mark_host(fx.log, &fx.mem, fx.g + 9 * PAGE + 100, 3 * PAGE);
	for (uint64_t p = 9; p <= 12; p++)
		expect_dirty(p * PAGE, "a 12 KiB buffer at page 9 + 100");
	ASSERT_EQ(dirty_pages(), 4);
	ASSERT_EQ(gm_host_to_gpa(&fx.mem, fx.g + 5, 1), 5);
	ASSERT_EQ(gm_host_to_gpa(&fx.mem, fx.g + MEM_SIZE - 1, 2), UINT64_MAX);
	ASSERT_EQ(gm_host_to_gpa(&fx.mem, &fx, 1), UINT64_MAX);
}

/*
 * A log too small for an address: counted, nothing written outside the
 * bitmap.  The log here is the last bytes of a one-page mapping with no
 * page after it, so a write past it would fault.
 */
static void test_mark_outside_log_counted_not_written(void)
{
	struct gm_dirty_log *small;
	uint64_t misses;
	int fd = memfd_create("test-dirty-small", MFD_CLOEXEC);

	ASSERT_TRUE(fd >= 0);
	ASSERT_EQ(ftruncate(fd, (off_t)PAGE), 0);
	ASSERT_EQ(gm_dirty_map(fd, 16, PAGE - 16, &small), 0);
	ASSERT_TRUE(gm_dirty_covers(small, 0, 128 * PAGE));
	ASSERT_TRUE(!gm_dirty_covers(small, 128 * PAGE - 1, 2));
	smp_mb();
	gm_dirty_mark(small, 127 * PAGE, 1);
	ASSERT_EQ(small->bits[15], 0x80);
	gm_dirty_mark(small, 128 * PAGE, 1);
	gm_dirty_mark(small, 127 * PAGE, 2 * PAGE);	/* straddles the end */
	gm_dirty_mark(small, UINT64_MAX - 10, 20);	/* wraps */
	misses = atomic_load(&small->misses);
	ASSERT_EQ(misses, 3);
	gm_dirty_unmap(small);
	close(fd);
}

/* A description the fd cannot hold, or no log at all, is refused. */
static void test_map_refuses_bad_descriptions(void)
{
	struct gm_dirty_log *l = NULL;
	int ev = sys_eventfd();

	ASSERT_EQ(gm_dirty_map(fx.logfd, LOG_BYTES + 1, 0, &l), -EINVAL);
	ASSERT_EQ(gm_dirty_map(fx.logfd, 8, LOG_BYTES - 4, &l), -EINVAL);
	ASSERT_EQ(gm_dirty_map(fx.logfd, 0, 0, &l), -EINVAL);
	ASSERT_EQ(gm_dirty_map(fx.logfd, 8, UINT64_MAX - 4, &l), -EINVAL);
	ASSERT_EQ(gm_dirty_map(ev, 8, 0, &l), -EINVAL);	/* not a file */
	ASSERT_PTR_EQ(l, NULL);
	/* An offset inside a page is fine (we map from the page below). */
	ASSERT_EQ(gm_dirty_map(fx.logfd, 100, 200, &l), 0);
	ASSERT_PTR_EQ((void *)l->bits, (uint8_t *)l->map + 200);
	gm_dirty_unmap(l);
	close(ev);
}

/* ---- The used ring (vq) ---- */

/* Elements and used->idx, at log_guest_addr + their offset. */
static void test_used_elem_and_idx_logged_at_log_addr(void)
{
	struct vq_config c = ring_config(true, true, USED_LOG_GPA);
	struct vq vq;

	ring_reset();
	ASSERT_EQ(vq_init(&vq, &c, &fx.mem), 0);
	log_clear();
	vq_push(&vq, 7, 4096);
	vq_flush(&vq);
	ASSERT_EQ(used()->ring[START % NUM].id, 7);
	/* element 600: offset 4 + 8 * 600 = 4804, the ring's second page */
	expect_dirty(USED_LOG_GPA + 4 + 8 * START, "used element");
	expect_dirty(USED_LOG_GPA + 2, "used->idx");
	ASSERT_EQ(dirty_pages(), 2);
	expect_clean(USED_GPA, "the used ring's own address");
	vq_release(&vq);
}

/* A batch that wraps round the ring's end: element 1023 straddles the
 * ring's second and third pages, element 0 shares the first with idx. */
static void test_used_elems_across_wrap_logged(void)
{
	struct vq_config c = ring_config(true, true, USED_GPA);
	struct vq vq;

	ring_reset();
	used()->idx = (uint16_t)(NUM - 2);	/* slots 1022, 1023, 0 */
	avail()->idx = (uint16_t)(NUM - 2);
	c.last_avail_idx = (uint16_t)(NUM - 2);
	ASSERT_EQ(vq_init(&vq, &c, &fx.mem), 0);
	log_clear();
	vq_push(&vq, 1, 0);
	vq_push(&vq, 2, 0);
	vq_push(&vq, 3, 0);
	vq_flush(&vq);
	/* 1022 at 8180 (page 1), 1023 at 8188 (pages 1 and 2), 0 at 4. */
	expect_dirty(USED_GPA + 8188 + 7, "used element 1023's last byte");
	expect_dirty(USED_GPA + 8180, "used element 1022");
	expect_dirty(USED_GPA + 4, "used element 0");
	ASSERT_EQ(dirty_pages(), 3);
	vq_release(&vq);
}

/* EVENT_IDX: avail_event, written when kicks go off and on again. */
static void test_avail_event_logged(void)
{
	struct vq_config c = ring_config(true, true, USED_GPA);
	struct vq vq;

	ring_reset();
	ASSERT_EQ(vq_init(&vq, &c, &fx.mem), 0);
	log_clear();
	vq_disable_notify(&vq);
	ASSERT_EQ(*vq.avail_event, (uint16_t)(START - 1));
	expect_dirty(USED_GPA + 4 + 8 * NUM, "avail_event (kicks off)");
	ASSERT_EQ(dirty_pages(), 1);
	log_clear();
	ASSERT_TRUE(!vq_enable_notify(&vq));
	ASSERT_EQ(*vq.avail_event, START);
	expect_dirty(USED_GPA + 4 + 8 * NUM, "avail_event (kicks on)");
	ASSERT_EQ(dirty_pages(), 1);
	vq_release(&vq);
}

/* Without EVENT_IDX: used->flags (NO_NOTIFY), off and on. */
static void test_used_flags_logged(void)
{
	struct vq_config c = ring_config(false, true, USED_LOG_GPA);
	struct vq vq;

	ring_reset();
	ASSERT_EQ(vq_init(&vq, &c, &fx.mem), 0);
	log_clear();
	vq_disable_notify(&vq);
	ASSERT_EQ(used()->flags, VRING_USED_F_NO_NOTIFY);
	expect_dirty(USED_LOG_GPA, "used->flags (kicks off)");
	ASSERT_EQ(dirty_pages(), 1);
	log_clear();
	(void)vq_enable_notify(&vq);
	ASSERT_EQ(used()->flags, 0);
	expect_dirty(USED_LOG_GPA, "used->flags (kicks on)");
	vq_release(&vq);
}

/* The used ring is logged only with VHOST_VRING_F_LOG, and nothing at all
 * once logging is switched off; switched on again, it logs again. */
static void test_used_logging_follows_flag_and_switch(void)
{
	struct vq_config c = ring_config(true, false, USED_GPA);
	struct vq_log on = { .log = fx.log, .used = true, .used_gpa = USED_GPA };
	struct vq_log off = { 0 };
	struct vq vq;

	ring_reset();
	ASSERT_EQ(vq_init(&vq, &c, &fx.mem), 0);
	log_clear();
	vq_push(&vq, 1, 0);
	vq_flush(&vq);
	vq_disable_notify(&vq);
	(void)vq_enable_notify(&vq);
	ASSERT_EQ(dirty_pages(), 0);
	vq_set_log(&vq, &on);
	vq_push(&vq, 2, 0);
	vq_flush(&vq);
	expect_dirty(USED_GPA + 4 + 8 * (START + 1), "used element after switching on");
	vq_set_log(&vq, &off);
	log_clear();
	vq_push(&vq, 3, 0);
	vq_flush(&vq);
	vq_disable_notify(&vq);
	ASSERT_EQ(dirty_pages(), 0);
	vq_release(&vq);
}

/* SET_LOG_FD: one kick at the end of a batch that marked something. */
static void test_log_fd_kicked_per_batch(void)
{
	struct vq_config c = ring_config(true, true, USED_GPA);
	struct vq vq;
	int ev = sys_eventfd();

	ASSERT_TRUE(ev >= 0);
	atomic_store(&fx.log->call_fd, ev);
	ring_reset();
	ASSERT_EQ(vq_init(&vq, &c, &fx.mem), 0);
	vq_log_kick(&vq);
	ASSERT_EQ(sys_eventfd_drain(ev), 0);
	vq_push(&vq, 1, 0);
	vq_push(&vq, 2, 0);
	vq_flush(&vq);
	vq_log_kick(&vq);
	vq_log_kick(&vq);
	ASSERT_EQ(sys_eventfd_drain(ev), 1);
	atomic_store(&fx.log->call_fd, -1);
	vq_release(&vq);
	close(ev);
}

/* ---- Request buffers (blk, on its iothread) ---- */

/* Queue one request: a chain of n descriptors at head 0. */
static void put_chain(const struct vring_desc *d, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		desc()[i] = d[i];
		if (i + 1 < n) {
			desc()[i].flags |= VRING_DESC_F_NEXT;
			desc()[i].next = (uint16_t)(i + 1);
		}
	}
	avail()->ring[START % NUM] = 0;
	avail()->idx = START + 1;
}

static void put_header(uint32_t type, uint64_t sector)
{
	struct virtio_blk_outhdr h = { .type = type, .sector = sector };

	memcpy(fx.g + HDR_GPA, &h, sizeof(h));
}

/* Run the queue once over what is on the ring, logging as c says. */
static void run_queue(bool log_used)
{
	struct vu_queue_setup su = {
		.cfg = ring_config(true, log_used, USED_GPA),
		.mem = &fx.mem,
		.kick_fd = fx.kick_fd, .call_fd = -1, .err_fd = -1,
		.enabled = true,
		.features = 1ull << VIRTIO_F_VERSION_1 | 1ull << VIRTIO_RING_F_EVENT_IDX,
	};

	log_clear();
	ASSERT_EQ(blk_fuzz_process(fx.dev, 0, &su), 0);
	ASSERT_EQ(used()->idx, START + 1);
}

static void test_read_data_and_status_logged(void)
{
	struct vring_desc d[] = {
		{ HDR_GPA, 16, 0, 0 },
		{ DATA_GPA, 4096, VRING_DESC_F_WRITE, 0 },
		{ STATUS_GPA, 1, VRING_DESC_F_WRITE, 0 },
	};

	ring_reset();
	memset(fx.g + DATA_GPA, 0xa5, 4096);
	put_header(VIRTIO_BLK_T_IN, 8);
	put_chain(d, 3);
	run_queue(false);
	ASSERT_EQ(fx.g[STATUS_GPA], VIRTIO_BLK_S_OK);
	ASSERT_EQ(fx.g[DATA_GPA + 4095], 0);	/* the null engine reads zeroes */
	expect_dirty(DATA_GPA, "read data");
	expect_dirty(STATUS_GPA, "status byte of a read");
	expect_clean(HDR_GPA, "request header");
	/* Without F_LOG on the ring, only the buffers. */
	ASSERT_EQ(dirty_pages(), 2);
}

/* A read whose data spans two descriptors and three pages. */
static void test_read_scattered_data_logged(void)
{
	struct vring_desc d[] = {
		{ HDR_GPA, 16, 0, 0 },
		{ DATA_GPA + 3584, 512, VRING_DESC_F_WRITE, 0 },	/* end of page 9 */
		{ ID_GPA, 4096, VRING_DESC_F_WRITE, 0 },		/* page 11 */
		{ STATUS_GPA, 1, VRING_DESC_F_WRITE, 0 },
	};

	ring_reset();
	put_header(VIRTIO_BLK_T_IN, 8);
	put_chain(d, 4);
	run_queue(false);
	ASSERT_EQ(fx.g[STATUS_GPA], VIRTIO_BLK_S_OK);
	expect_dirty(DATA_GPA, "first data segment");
	expect_dirty(ID_GPA, "second data segment");
	expect_dirty(STATUS_GPA, "status");
	ASSERT_EQ(dirty_pages(), 3);
}

static void test_get_id_data_logged(void)
{
	struct vring_desc d[] = {
		{ HDR_GPA, 16, 0, 0 },
		{ ID_GPA, VIRTIO_BLK_ID_BYTES, VRING_DESC_F_WRITE, 0 },
		{ STATUS_GPA, 1, VRING_DESC_F_WRITE, 0 },
	};

	ring_reset();
	put_header(VIRTIO_BLK_T_GET_ID, 0);
	put_chain(d, 3);
	run_queue(false);
	ASSERT_EQ(fx.g[STATUS_GPA], VIRTIO_BLK_S_OK);
	ASSERT_MEM_EQ(fx.g + ID_GPA, "dirty-test", 10);
	expect_dirty(ID_GPA, "GET_ID data");
	expect_dirty(STATUS_GPA, "status byte of GET_ID");
	ASSERT_EQ(dirty_pages(), 2);
}

/* A write stores only its status (the data is the device's to read). */
static void test_write_logs_status_only(void)
{
	struct vring_desc d[] = {
		{ HDR_GPA, 16, 0, 0 },
		{ DATA_GPA, 4096, 0, 0 },
		{ STATUS_GPA, 1, VRING_DESC_F_WRITE, 0 },
	};

	ring_reset();
	put_header(VIRTIO_BLK_T_OUT, 8);
	put_chain(d, 3);
	run_queue(false);
	ASSERT_EQ(fx.g[STATUS_GPA], VIRTIO_BLK_S_OK);
	expect_dirty(STATUS_GPA, "status byte of a write");
	expect_clean(DATA_GPA, "write data");
	ASSERT_EQ(dirty_pages(), 1);
}

/* A request the device refuses (past the end of the disk) still stores
 * its status. */
static void test_failed_request_status_logged(void)
{
	struct vring_desc d[] = {
		{ HDR_GPA, 16, 0, 0 },
		{ DATA_GPA, 4096, VRING_DESC_F_WRITE, 0 },
		{ STATUS_GPA, 1, VRING_DESC_F_WRITE, 0 },
	};

	ring_reset();
	put_header(VIRTIO_BLK_T_IN, 1ull << 40);
	put_chain(d, 3);
	run_queue(false);
	ASSERT_EQ(fx.g[STATUS_GPA], VIRTIO_BLK_S_IOERR);
	expect_dirty(STATUS_GPA, "status byte of a failed read");
}

/* A malformed chain (a buffer outside guest memory) fails with IOERR in
 * its last writable byte: that store is logged too. */
static void test_bad_chain_status_logged(void)
{
	struct vring_desc d[] = {
		{ HDR_GPA, 16, 0, 0 },
		{ MEM_SIZE + PAGE, 4096, VRING_DESC_F_WRITE, 0 },
		{ BAD_GPA, 1, VRING_DESC_F_WRITE, 0 },
	};

	ring_reset();
	fx.g[BAD_GPA] = 0xff;
	put_header(VIRTIO_BLK_T_IN, 8);
	put_chain(d, 3);
	run_queue(false);
	ASSERT_EQ(fx.g[BAD_GPA], VIRTIO_BLK_S_IOERR);
	expect_dirty(BAD_GPA, "status byte of a malformed chain");
	ASSERT_EQ(dirty_pages(), 1);
}

/* The whole queue with the ring's F_LOG: element 600 and the index as
 * well as the buffers, nothing the device did not write. */
static void test_queue_logs_used_ring_with_flag(void)
{
	struct vring_desc d[] = {
		{ HDR_GPA, 16, 0, 0 },
		{ DATA_GPA, 4096, VRING_DESC_F_WRITE, 0 },
		{ STATUS_GPA, 1, VRING_DESC_F_WRITE, 0 },
	};

	ring_reset();
	put_header(VIRTIO_BLK_T_IN, 8);
	put_chain(d, 3);
	run_queue(true);
	expect_dirty(USED_GPA + 4 + 8 * START, "used element");
	expect_dirty(USED_GPA, "used->idx");
	expect_dirty(USED_GPA + 4 + 8 * NUM, "avail_event");
	expect_dirty(DATA_GPA, "read data");
	expect_dirty(STATUS_GPA, "status");
	expect_clean(DESC_GPA, "descriptor table");
	expect_clean(AVAIL_GPA, "avail ring");
	expect_clean(HDR_GPA, "header");
	ASSERT_EQ(dirty_pages(), 5);
}

static void dev_setup(void)
{
	struct bdev_opts o = { .engine = "null", .size = 64ull << 20 };
	struct blk_opts bo = { .num_queues = 1, .serial = "dirty-test" };
	char err[256];

	ASSERT_EQ(bdev_open(&o, &fx.b, err, sizeof(err)), 0);
	ASSERT_EQ(blk_dev_new(&fx.b, &bo, &fx.dev), 0);
	blk_vu_ops.set_features(fx.dev, 1ull << VIRTIO_F_VERSION_1 |
				1ull << VIRTIO_RING_F_EVENT_IDX);
	fx.kick_fd = sys_eventfd();
	ASSERT_TRUE(fx.kick_fd >= 0);
}

int main(void)
{
	log_set_level(LOG_WARN);
	mem_setup();
	RUN(test_mark_sets_page_bits);
	RUN(test_mark_host_uses_gpa);
	RUN(test_mark_outside_log_counted_not_written);
	RUN(test_map_refuses_bad_descriptions);
	RUN(test_used_elem_and_idx_logged_at_log_addr);
	RUN(test_used_elems_across_wrap_logged);
	RUN(test_avail_event_logged);
	RUN(test_used_flags_logged);
	RUN(test_used_logging_follows_flag_and_switch);
	RUN(test_log_fd_kicked_per_batch);
	dev_setup();
	RUN(test_read_data_and_status_logged);
	RUN(test_read_scattered_data_logged);
	RUN(test_get_id_data_logged);
	RUN(test_write_logs_status_only);
	RUN(test_failed_request_status_logged);
	RUN(test_bad_chain_status_logged);
	RUN(test_queue_logs_used_ring_with_flag);
	blk_dev_free(fx.dev);
	bdev_close(&fx.b);
	gm_dirty_unmap(fx.log);
	gm_table_clear(&fx.mem);
	close(fx.logfd);
	close(fx.memfd);
	close(fx.kick_fd);
	return T_EXIT_PASS;
}
