/*
 * The device's face to the driver outside the rings: the features
 * offered, the config space (virtio 1.2, 5.2.4), the write cache mode the
 * driver chooses, the state an upgrade in place hands over, and resize
 * (docs/architecture.md "Device status and resize").  Main thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>

#include "blk/blk_internal.h"
#include "format/format.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/sys.h"

uint64_t blk__features(void *opaque)
{
	struct blk_dev *d = opaque;
	uint64_t f = 1ull << VIRTIO_F_VERSION_1 |
		     1ull << VIRTIO_RING_F_INDIRECT_DESC |
		     1ull << VIRTIO_RING_F_EVENT_IDX |
		     1ull << VIRTIO_F_RING_PACKED |
		     1ull << VIRTIO_BLK_F_SEG_MAX |
		     1ull << VIRTIO_BLK_F_BLK_SIZE |
		     1ull << VIRTIO_BLK_F_FLUSH |
		     1ull << VIRTIO_BLK_F_TOPOLOGY |
		     1ull << VIRTIO_BLK_F_CONFIG_WCE |
		     1ull << VIRTIO_BLK_F_MQ;

	if (d->b->read_only)
		f |= 1ull << VIRTIO_BLK_F_RO;
	/* A read-only export cannot deallocate or zero anything. */
	if (!d->b->read_only && (d->b->caps & BDEV_CAP_DISCARD) && !d->b->no_discard)
		f |= 1ull << VIRTIO_BLK_F_DISCARD;
	if (!d->b->read_only && (d->b->caps & BDEV_CAP_WRITE_ZEROES))
		f |= 1ull << VIRTIO_BLK_F_WRITE_ZEROES;
	if (d->no_packed)
		f &= ~(1ull << VIRTIO_F_RING_PACKED);
	if (d->no_event_idx)
		f &= ~(1ull << VIRTIO_RING_F_EVENT_IDX);
	return f;
}

static void blk_fill_config(struct blk_dev *d, struct virtio_blk_config *c)
{
	unsigned exp = 0;

	memset(c, 0, sizeof(*c));
	c->capacity = d->b->size >> VIRTIO_BLK_SECTOR_SHIFT;
	c->seg_max = VQ_MAX_SEGS - 2;
	c->blk_size = d->b->block_size;
	while ((d->b->block_size << exp) < d->b->phys_block_size && exp < 15)
		exp++;
	c->topology.physical_block_exp = (uint8_t)exp;
	c->topology.min_io_size = (uint16_t)(1u << exp);
	c->writeback = d->wce;
	c->num_queues = (uint16_t)d->num_queues;
	c->max_discard_sectors = BLK_MAX_DWZ_SECTORS;
	if (d->b->discard_max_bytes &&
	    d->b->discard_max_bytes >> VIRTIO_BLK_SECTOR_SHIFT < c->max_discard_sectors)
		c->max_discard_sectors = (uint32_t)(d->b->discard_max_bytes >>
						    VIRTIO_BLK_SECTOR_SHIFT);
	c->max_discard_seg = BLK_MAX_DWZ_SEGS;
	/* virtio 1.2, 5.2.4: discard_sector_alignment is the unit the
	 * device deallocates in; a guest aligns its discards to it (Linux:
	 * discard_granularity), so they really free space. */
	c->discard_sector_alignment = MAX(d->b->discard_granularity, d->b->block_size) >>
				      VIRTIO_BLK_SECTOR_SHIFT;
	c->max_write_zeroes_sectors = BLK_MAX_DWZ_SECTORS;
	c->max_write_zeroes_seg = BLK_MAX_DWZ_SEGS;
	c->write_zeroes_may_unmap = 1;
}

void blk__get_config(void *opaque, uint32_t off, uint8_t *buf, uint32_t len)
{
	struct virtio_blk_config c;

	blk_fill_config(opaque, &c);
	memset(buf, 0, len);
	if (off < sizeof(c))
		memcpy(buf, (uint8_t *)&c + off, MIN(len, sizeof(c) - off));
}

/* 5.2.5 "Device Initialization": writethrough unless the driver accepted
 * FLUSH and (with CONFIG_WCE) left writeback on. */
static void blk_update_cache_mode(struct blk_dev *d)
{
	bool flush = d->acked & (1ull << VIRTIO_BLK_F_FLUSH);
	bool wce_neg = d->acked & (1ull << VIRTIO_BLK_F_CONFIG_WCE);
	bool wb = flush && (!wce_neg || d->wce);

	atomic_store(&d->writeback, wb);
}

int blk__set_config(void *opaque, uint32_t off, const uint8_t *buf, uint32_t len)
{
	struct blk_dev *d = opaque;

	/* Only the writeback byte is writable (5.2.4). */
	if (off != offsetof(struct virtio_blk_config, writeback) || len != 1)
		return -EPERM;
	d->wce = buf[0] ? 1 : 0;
	blk_update_cache_mode(d);
	log_info("guest set the write cache to %s",
		 d->wce ? "writeback" : "writethrough");
	return 0;
}

/* Upgrade in place (vu.h): the write cache mode the guest chose, and
 * whether a flush failed through the page cache (bdev.h, cache_lost: the
 * new process must go on failing flushes).  Byte 0 is this blob's
 * version, byte 1 the writeback byte, byte 2 (since 2026-12) flags: bit 0
 * cache_lost, bit 1 (since 2026-12) paused, whose blob follows from
 * byte 3 (pause.c: the reason).  A loader of version 1 reads bytes 0 and
 * 1 only, so one that predates byte 2 still takes the blob (and a blob
 * without it is taken here); one that knows byte 2 but not a flag in it
 * refuses the state, and the old process serves on: a pause is never
 * dropped by an upgrade to a binary that cannot keep it. */
#define BLK_STATE_CACHE_LOST 0x01
#define BLK_STATE_PAUSED 0x02
/* Bit 2 (since 2026-12): the QoS limits a disk of its own has now (set at
 * runtime, perhaps), after the pause's blob: a length byte and the
 * --limit text.  A group's limits live in the group's file. */
#define BLK_STATE_QOS 0x04

size_t blk__save_state(void *opaque, uint8_t *buf, size_t len)
{
	struct blk_dev *d = opaque;
	char text[256];
	int k = -1;
	size_t n, room;

	if (len < 3)
		return 0;
	/* The limits go when there are some, or when they were changed at
	 * runtime (to none, perhaps: the new process must not take its
	 * --limit back). */
	if (!qos_group_name(d->qos) && (qos_active(d->qos) || qos_changed(d->qos))) {
		struct qos_limits l;

		qos_get(d->qos, &l, NULL, sys_now_ns());
		k = qos_limits_format(&l, text, sizeof(text));
		if (k < 0 || (size_t)k >= sizeof(text) || (size_t)k + 1 > len - 3) {
			log_warn("upgrade: the QoS limits do not fit the handover; the new "
				 "process takes its --limit");
			k = -1;
		}
	}
	buf[0] = 1;
	buf[1] = d->wce;
	buf[2] = atomic_load(&d->b->cache_lost) ? BLK_STATE_CACHE_LOST : 0;
	/* The pause's reason is cut to leave room for the limits. */
	room = len - 3 - (k >= 0 ? (size_t)k + 1 : 0);
	n = room ? disk_pause_save(d->disk, buf + 3, room) : 0;
	if (n)
		buf[2] |= BLK_STATE_PAUSED;
	n += 3;
	if (k >= 0) {
		buf[n] = (uint8_t)k;
		memcpy(buf + n + 1, text, (size_t)k);
		n += 1 + (size_t)k;
		buf[2] |= BLK_STATE_QOS;
	}
	return n;
}

int blk__load_state(void *opaque, const uint8_t *buf, size_t len)
{
	struct blk_dev *d = opaque;

	size_t off = 3;
	struct qos_limits ql = { 0 };
	bool have_qos = false;

	if (len < 2 || buf[0] != 1 || buf[1] > 1 ||
	    (len > 2 && (buf[2] & ~(BLK_STATE_CACHE_LOST | BLK_STATE_PAUSED | BLK_STATE_QOS))) ||
	    (len > 2 && (buf[2] & BLK_STATE_PAUSED) && len < 4))
		return -EINVAL;
	if (len > 2 && (buf[2] & BLK_STATE_PAUSED))
		off += 1 + (size_t)buf[3];
	if (len > 2 && (buf[2] & BLK_STATE_QOS)) {
		char text[256], e[200];

		/* Checked whole before anything is taken: a blob we cannot
		 * read refuses the state (the old process serves on). */
		if (off >= len || (size_t)buf[off] + 1 > len - off)
			return -EINVAL;
		memcpy(text, buf + off + 1, buf[off]);
		text[buf[off]] = '\0';
		if (text[0] && qos_limits_parse(text, &ql, e, sizeof(e)) < 0) {
			log_err("upgrade: the QoS limits handed over ('%s') do not parse: %s",
				text, e);
			return -EINVAL;
		}
		have_qos = true;
	}
	d->wce = buf[1];
	blk_update_cache_mode(d);
	if (len > 2 && (buf[2] & BLK_STATE_CACHE_LOST) && !atomic_exchange(&d->b->cache_lost, true))
		log_err("disk %s: a flush failed before the upgrade: every flush fails, as "
			"it did", d->b->path);
	if (len > 2 && (buf[2] & BLK_STATE_PAUSED))
		disk_pause_load(d->disk, buf + 3, len - 3);
	if (have_qos && !qos_group_name(d->qos)) {
		char text[256];

		qos_set(d->qos, &ql);
		qos_limits_format(&ql, text, sizeof(text));
		log_info("QoS limits as before the upgrade: %s", text);
	}
	return 0;
}

/* The image's format keeps tables in memory (qcow2): written back for
 * the new process, read again by it before it says READY, as at any
 * claim (format.h). */
int blk__handover_quiesce(void *opaque, char *err, size_t errlen)
{
	struct blk_dev *d = opaque;

	/* Persistent bitmaps too, for the new process to load (a failed
	 * upgrade serves on: the next change marks them in use again). */
	if (disk_bitmaps_handover(d->disk, err, errlen) < 0)
		return -EIO;
	return fmt_quiesce(d->b, err, errlen);
}

int blk__handover_reload(void *opaque, char *err, size_t errlen)
{
	struct blk_dev *d = opaque;
	int r = fmt_claim(d->b, err, errlen);

	return r < 0 ? r : disk__bitmaps_claimed(d->disk, err, errlen);
}

void blk__set_features(void *opaque, uint64_t features)
{
	struct blk_dev *d = opaque;

	d->acked = features;
	blk_update_cache_mode(d);
}

/* ---- Resize ---- */

void blk_dev_set_config_notify(struct blk_dev *d, int (*fn)(void *opaque), void *opaque)
{
	d->config_changed = fn;
	d->config_opaque = opaque;
}

int blk_dev_resize(struct blk_dev *d, uint64_t size, char *err, size_t errlen)
{
	uint64_t old = d->b->size;
	/* No ring runs: the disk is ours only while it changes (another
	 * process may serve it, and a format reads its tables again). */
	bool hold = !d->b->locked && !d->b->read_only && size != old;
	int r;

	/* A backup's view is of the size it had (backup/bkp.h). */
	if (size != old && disk_wfilter_on(d->disk)) {
		snprintf(err, errlen, "a backup of this disk runs: finish or abort it before "
			 "resizing (vblkctl backup list)");
		return -EBUSY;
	}
	/* An operator's command: refused at once while another process
	 * serves the disk. */
	if (hold && (r = disk_claim(d->disk, 0, err, errlen)) < 0)
		return r;
	/* The persistent bitmaps could not follow (they would break QEMU's
	 * limits, or the image has one we do not track): nothing changes. */
	if (size > old && (r = disk_bitmaps_can_grow(d->disk, size, err, errlen)) < 0) {
		if (hold)
			disk_release(d->disk);
		return r;
	}
	r = bdev_resize(d->b, size, err, errlen);
	/* The dirty bitmaps cover the new end too, grown while the disk is
	 * still ours: the release stores them (before, it stored without the
	 * not yet grown ones and dropped their entries; a crash before the
	 * next store lost them). */
	if (r == 0 && size != old && disk_bitmaps_grow(d->disk, size) < 0)
		log_err("disk grown to %llu bytes, but its dirty bitmaps could not be: writes "
			"past %llu are not marked in them", (unsigned long long)size,
			(unsigned long long)old);
	if (hold)
		disk_release(d->disk);
	if (r < 0 || size == old)
		return r < 0 ? r : 0;
	/* The capacity in the config space is read from b->size
	 * (blk__get_config): from here on GET_CONFIG answers the new one. */
	r = d->config_changed ? d->config_changed(d->config_opaque) : 0;
	if (r < 0)
		log_warn("disk grown to %llu bytes, but the frontend could not be told "
			 "(%s): the guest sees the new size after its next reset",
			 (unsigned long long)size, strerror(-r));
	else if (r == 0)
		log_info("disk grown to %llu bytes; the frontend has no backend channel "
			 "(BACKEND_REQ): the guest sees the new size after its next reset",
			 (unsigned long long)size);
	return r < 0 ? 0 : r;
}
