/*
 * Description: libFuzzer target for the device side of a virtqueue, split
 * or packed (FZ_F_PACKED), and the virtio-blk request path (vq_* and blk_*), with the null backend.
 *
 * Guest memory is one 64 KiB memfd region, mapped through gm_region_map()
 * and gm_table_add() like SET_MEM_TABLE does, with a no-access page on
 * each side: any access outside the region faults (ASan does not watch
 * mmap'ed memory, the guard pages do).  Each input gives the ring layout
 * and the memory image; blk_fuzz_process() then starts the queue on the
 * device's iothread, processes the ring and stops it, so the real code
 * parses chains, runs requests on the null backend and writes status
 * bytes, data and used ring entries back into guest memory (vq_push,
 * vq_flush, vq_should_notify).  Nothing is validated here: vq_init() is
 * the only judge of the layout.
 *
 * Built three ways (fuzz/meson.build): fuzz_vq_blk, the device on its own
 * iothread as vblkd runs it, either ring format (FZ_F_PACKED); and the fast
 * ring targets fuzz_split and fuzz_packed (FUZZ_SYNC: the iothread's loop
 * never runs, so its work runs in this thread, no cross-thread hand-off per
 * input; rings of at most 256 entries; FUZZ_FORMAT fixes the ring format).
 *
 * With FZ_LOG the queue runs with dirty logging on (migration), the used
 * ring logged at its own address, and the harness checks the logging
 * promise: every page of guest memory whose content changed is marked in
 * the log.  FZ_LOG_ODD logs the used ring at an address the input picks
 * (hdr.pad), possibly outside the log: nothing may be written past the
 * log (a no-access page follows it).
 *
 * Input: struct fz_hdr, then hdr.mem_len bytes copied to the start of
 * guest memory (the rest of it reads zero), then, with FZ_INFLIGHT, the
 * in-flight region image (zero-padded to vq_inflight_region_size_packed(num)).
 * fuzz/make-seeds.py writes valid examples.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"

#include "backend/bdev.h"
#include "blk/blk.h"
#include "blk/virtio_blk.h"
#include "mem/dirty.h"
#include "mem/gm.h"
#include "util/sys.h"
#include "vhost/vhost_user.h"
#include "vhost/vu.h"
#include "virtio/vq.h"

#define PAGE		4096u
#define MEM_SIZE	(64u << 10)
#define GPA_BASE	0x40000000ull		/* descriptors address this */
#define QVA_BASE	0x7f0000000000ull	/* ring addresses use this */
#define DISK_BYTES	(1u << 20)
#define SERIAL		"fuzz-serial-0123456"	/* 19 bytes + NUL = 20 */

/* fz_hdr.flags */
#define FZ_EVENT_IDX	(1u << 0)
#define FZ_INDIRECT	(1u << 1)
#define FZ_INFLIGHT	(1u << 2)
#define FZ_CALL_FD	(1u << 3)
#define FZ_ERR_FD	(1u << 4)
#define FZ_DISABLED	(1u << 5)	/* start the ring disabled */
#define FZ_LOG		(1u << 6)	/* dirty logging on, checked */
#define FZ_LOG_ODD	(1u << 7)	/* ... used ring logged at GPA_BASE + (s16)pad * 64 */

/* fz_hdr.feat */
#define FZ_F_FLUSH	(1u << 0)	/* driver acked VIRTIO_BLK_F_FLUSH */
#define FZ_F_WCE	(1u << 1)	/* ... and VIRTIO_BLK_F_CONFIG_WCE */
#define FZ_F_WT		(1u << 2)	/* guest wrote writeback = 0 */
#define FZ_F_PACKED	(1u << 3)	/* packed ring: desc/avail/used offsets are
					 * the descriptor ring and the driver and
					 * device event areas; last_avail_idx and
					 * pad the two halves of the base */

/* Little-endian, 24 bytes; fuzz/make-seeds.py packs the same layout. */
struct fz_hdr {
	uint8_t num_sel;	/* bits 0-3: log2(num); bit 7: num = num_raw */
	uint8_t flags;		/* FZ_* */
	uint8_t dev;		/* device kind, modulo ARRAY_SIZE(kinds) */
	uint8_t feat;		/* FZ_F_* */
	uint16_t num_raw;
	uint16_t last_avail_idx;
	uint16_t mem_len;	/* memory image bytes that follow */
	uint16_t pad;		/* FZ_LOG_ODD: used ring log address */
	int32_t desc_off, avail_off, used_off;	/* from QVA_BASE */
} __attribute__((packed));
STATIC_ASSERT(sizeof(struct fz_hdr) == 24, "fz_hdr");

static const struct {
	bool read_only;
	unsigned block_size;
} kinds[] = {
	{ false, 512 },
	{ true, 512 },
	{ false, 4096 },
};

static struct {
	struct gm_table *mem;
	uint8_t *guest;			/* the region's first byte */
	struct bdev b[ARRAY_SIZE(kinds)];
	struct blk_dev *d[ARRAY_SIZE(kinds)];
	int kick_fd, call_fd, err_fd;
	bool dump;			/* $VBLK_FUZZ_DUMP: print the outcome */
	struct gm_dirty_log *log;	/* covers GPA 0 .. the region's end */
	uint8_t *before;		/* guest memory before processing */
} fz;

static void die(const char *what, int err)
{
	dprintf(fuzz_report_fd, "fuzz_vq_blk: %s: %s\n", what, strerror(err));
	exit(1);
}

/*
 * One region of MEM_SIZE at GPA_BASE / QVA_BASE, at offset PAGE of its
 * memfd.  gm_region_map() maps the fd from offset 0, so the page before
 * the region is ours to revoke; the mapping is then moved into a
 * reservation one page longer, whose last page stays inaccessible.
 */
static void mem_setup(void)
{
	size_t map_len = PAGE + MEM_SIZE;
	struct gm_region r;
	void *res, *p;
	int fd, ret;

	fz.mem = calloc(1, sizeof(*fz.mem));
	if (!fz.mem)
		die("calloc", ENOMEM);
	fd = memfd_create("fuzz-guest", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)map_len) < 0)
		die("memfd", errno);
	ret = gm_region_map(&r, GPA_BASE, MEM_SIZE, QVA_BASE, PAGE, fd);
	if (ret < 0)
		die("gm_region_map", -ret);
	close(fd);
	res = mmap(NULL, map_len + PAGE, PROT_NONE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED)
		die("mmap guard", errno);
	p = mremap(r.mmap_addr, r.mmap_size, r.mmap_size, MREMAP_MAYMOVE | MREMAP_FIXED, res);
	if (p == MAP_FAILED)
		die("mremap", errno);
	if (mprotect(p, PAGE, PROT_NONE) < 0)
		die("mprotect", errno);
	r.mmap_addr = p;
	r.host = (uint8_t *)p + PAGE;
	ret = gm_table_add(fz.mem, &r);
	if (ret < 0)
		die("gm_table_add", -ret);
	fz.guest = r.host;
}

/*
 * A dirty log covering exactly GPA 0 to the end of the region, ending at
 * the end of its mapping, which is moved into a reservation one page
 * longer: a mark past the log faults.
 */
static void log_setup(void)
{
	uint64_t size = ((GPA_BASE + MEM_SIZE) / PAGE + 7) / 8;
	uint64_t file = (size + PAGE - 1) / PAGE * PAGE;
	struct gm_dirty_log *l;
	void *res, *p;
	int fd, ret;

	fd = memfd_create("fuzz-log", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)file) < 0)
		die("memfd", errno);
	ret = gm_dirty_map(fd, size, file - size, &l);
	if (ret < 0)
		die("gm_dirty_map", -ret);
	close(fd);
	res = mmap(NULL, l->map_len + PAGE, PROT_NONE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED)
		die("mmap guard", errno);
	gm_guard_del(l->map);
	p = mremap(l->map, l->map_len, l->map_len, MREMAP_MAYMOVE | MREMAP_FIXED, res);
	if (p == MAP_FAILED)
		die("mremap", errno);
	l->bits = (_Atomic uint8_t *)((uint8_t *)p + ((uint8_t *)l->bits - (uint8_t *)l->map));
	l->map = p;
	fz.log = l;
	fz.before = malloc(MEM_SIZE);
	if (!fz.before)
		die("malloc", ENOMEM);
}

static bool page_dirty(uint64_t gpa)
{
	uint64_t page = gpa / PAGE;

	return fz.log->bits[page / 8] & (1u << (page % 8));
}

/* The logging promise: what changed in guest memory is marked. */
static void log_check(void)
{
	for (uint64_t off = 0; off < MEM_SIZE; off += PAGE) {
		if (!memcmp(fz.before + off, fz.guest + off, PAGE) ||
		    page_dirty(GPA_BASE + off))
			continue;
		for (uint64_t i = off; i < off + PAGE; i++)
			if (fz.before[i] != fz.guest[i]) {
				dprintf(fuzz_report_fd, "fuzz_vq_blk: guest byte at GPA 0x%llx "
					"changed (0x%02x -> 0x%02x) but its page is not in "
					"the dirty log\n", (unsigned long long)(GPA_BASE + i),
					fz.before[i], fz.guest[i]);
				break;
			}
		abort();
	}
}

static void dev_setup(unsigned i)
{
	struct bdev_opts o = {
		.engine = "null",
		.size = DISK_BYTES,
		.read_only = kinds[i].read_only,
		.block_size = kinds[i].block_size,
	};
	struct blk_opts bo = { .num_queues = 1, .serial = SERIAL };

#ifdef FUZZ_SYNC
	bo.no_threads = true;
#endif
	char err[256];
	int ret;

	ret = bdev_open(&o, &fz.b[i], err, sizeof(err));
	if (ret < 0) {
		dprintf(fuzz_report_fd, "fuzz_vq_blk: bdev_open: %s\n", err);
		exit(1);
	}
	ret = blk_dev_new(&fz.b[i], &bo, &fz.d[i]);
	if (ret < 0)
		die("blk_dev_new", -ret);
}

/* For checking seeds by hand: the used ring and the status bytes. */
static void dump(const struct vu_queue_setup *su, int r)
{
	const struct vring_used *u = gm_qva_to_host(fz.mem, su->cfg.used_qva,
						    vring_used_bytes(su->cfg.num));

	fprintf(stderr, "blk_fuzz_process: %d\n", r);
	if (r < 0 || !u || su->cfg.packed)
		return;
	fprintf(stderr, "used->idx %u flags %u\n", u->idx, u->flags);
	for (unsigned i = 0; i < su->cfg.num && i < 16; i++)
		fprintf(stderr, "  used[%u] id %u len %u\n", i, u->ring[i].id, u->ring[i].len);
	fprintf(stderr, "status bytes at 0x8000:");
	for (unsigned i = 0; i < 8; i++)
		fprintf(stderr, " %u", fz.guest[0x8000 + i]);
	fprintf(stderr, "\n");
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_log_init();
	fz.dump = getenv("VBLK_FUZZ_DUMP") != NULL;
	mem_setup();
	log_setup();
	for (unsigned i = 0; i < ARRAY_SIZE(kinds); i++)
		dev_setup(i);
	fz.kick_fd = sys_eventfd();
	fz.call_fd = sys_eventfd();
	fz.err_fd = sys_eventfd();
	if (fz.kick_fd < 0 || fz.call_fd < 0 || fz.err_fd < 0)
		die("eventfd", -MIN(fz.kick_fd, MIN(fz.call_fd, fz.err_fd)));
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	struct vq_inflight_region *inflight = NULL;
	struct vu_queue_setup su;
	struct blk_dev *d;
	struct fz_hdr h;
	uint64_t features;
	unsigned num;
	size_t n;
	int r;

	fuzz_take(&in, &h, sizeof(h));
#if defined(FUZZ_FORMAT) && FUZZ_FORMAT == 1
	h.feat &= ~FZ_F_PACKED;
#elif defined(FUZZ_FORMAT) && FUZZ_FORMAT == 2
	h.feat |= FZ_F_PACKED;
#endif
	d = fz.d[h.dev % ARRAY_SIZE(kinds)];
	num = (h.num_sel & 0x80) ? h.num_raw : 1u << (h.num_sel & 15);
#ifdef FUZZ_SYNC
	/* The fast targets stay on rings of at most 256 (the request pools
	 * of a larger ring, allocated at every start, are most of an input's
	 * time); fuzz_vq_blk keeps every size. */
	if (num > 256)
		num = (h.num_sel & 0x80) ? num & 0xff : 256;
#endif

	memset(fz.guest, 0, MEM_SIZE);
	n = MIN((size_t)h.mem_len, in.left);
	fuzz_take(&in, fz.guest, n);
	if ((h.flags & FZ_INFLIGHT) && num <= VRING_MAX_NUM) {
		/* Exactly the region's size, so ASan sees any overrun. */
		size_t len = vq_inflight_region_size_packed(num);

		inflight = malloc(len);
		if (!inflight)
			return 0;
		fuzz_take(&in, inflight, len);
	}

	/* Cache mode as a driver would negotiate it (main-thread ops). */
	features = 1ull << VIRTIO_F_VERSION_1;
	if (h.feat & FZ_F_FLUSH)
		features |= 1ull << VIRTIO_BLK_F_FLUSH;
	if (h.feat & FZ_F_WCE)
		features |= 1ull << VIRTIO_BLK_F_CONFIG_WCE;
	if (h.flags & FZ_EVENT_IDX)
		features |= 1ull << VIRTIO_RING_F_EVENT_IDX;
	if (h.flags & FZ_INDIRECT)
		features |= 1ull << VIRTIO_RING_F_INDIRECT_DESC;
	if (h.feat & FZ_F_PACKED)
		features |= 1ull << VIRTIO_F_RING_PACKED;
	blk_vu_ops.set_config(d, offsetof(struct virtio_blk_config, writeback),
			      &(uint8_t){ (h.feat & FZ_F_WT) ? 0 : 1 }, 1);
	blk_vu_ops.set_features(d, features);

	memset(&su, 0, sizeof(su));
	su.cfg.index = 0;
	su.cfg.num = num;
	su.cfg.desc_qva = QVA_BASE + (int64_t)h.desc_off;
	su.cfg.avail_qva = QVA_BASE + (int64_t)h.avail_off;
	su.cfg.used_qva = QVA_BASE + (int64_t)h.used_off;
	su.cfg.last_avail_idx = h.last_avail_idx;
	su.cfg.packed = h.feat & FZ_F_PACKED;
	su.cfg.used_idx = h.pad;
	su.cfg.event_idx = h.flags & FZ_EVENT_IDX;
	su.cfg.indirect = h.flags & FZ_INDIRECT;
	su.cfg.inflight = inflight;
	su.cfg.inflight_packed_room = true;
	su.mem = fz.mem;
	su.kick_fd = fz.kick_fd;
	su.call_fd = (h.flags & FZ_CALL_FD) ? fz.call_fd : -1;
	su.err_fd = (h.flags & FZ_ERR_FD) ? fz.err_fd : -1;
	su.enabled = !(h.flags & FZ_DISABLED);
	su.features = features;
	if (h.flags & (FZ_LOG | FZ_LOG_ODD)) {
		su.cfg.log.log = fz.log;
		su.cfg.log.used = true;
		su.cfg.log.used_gpa = (h.flags & FZ_LOG_ODD) ?
			GPA_BASE + (int64_t)(int16_t)h.pad * 64 :
			su.cfg.used_qva - QVA_BASE + GPA_BASE;
		memset((void *)fz.log->bits, 0, fz.log->size);
		memcpy(fz.before, fz.guest, MEM_SIZE);
	}

	r = blk_fuzz_process(d, 0, &su);
	if (fz.dump)
		dump(&su, r);
	if ((h.flags & FZ_LOG) && !(h.flags & FZ_LOG_ODD))
		log_check();

	(void)sys_eventfd_drain(fz.call_fd);
	(void)sys_eventfd_drain(fz.err_fd);
	free(inflight);
	return 0;
}
