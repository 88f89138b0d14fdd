/*
 * A raw disk's bitmap file (disk.h; issue 46): persistent bitmaps need a
 * place the disk does not have, so they live in a qcow2 image beside it
 * whose backing file is the disk and which holds no data
 * (format.h, fmt_bitmap_file_open): the same code keeps them as in a
 * qcow2 disk (QEMU's bitmaps extension, written ahead against crashes),
 * and QEMU's tools read them (qemu-img info; qemu-nbd -r -B NAME exports
 * the disk's data, through the backing file, with the bitmap).
 *
 * It follows the disk: opened with it (if it is there; made at the first
 * persistent bitmap), claimed and let go with it, handed over at an
 * upgrade (stored, then the new process reads it at its claim).  Its
 * qcow2 has no iothread of its own: every call runs on the caller's
 * thread under bm_lock, the marks' write-ahead (disk_dirty, any
 * iothread) as main's claims and stores.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "disk/disk.h"
#include "format/format.h"
#include "util/log.h"

struct bdev *disk__bm_target(struct disk *d)
{
	struct bdev *bm = atomic_load(&d->bm);

	return bm ? bm : d->b;
}

int disk__bmfile_open(struct disk *d, bool create, bool handover, char *err, size_t errlen)
{
	struct bdev *bm, *file;
	int r;

	if (atomic_load(&d->bm) || !d->bm_path)
		return 0;
	r = fmt_bitmap_file_open(d->bm_path, d->b->path, d->b->size, create, handover, &bm, &file,
				 err, errlen);
	if (r < 0)
		return r;
	pthread_mutex_lock(&d->bm_lock);
	/* Ours now if the disk is (its tables read, writable). */
	r = d->claims ? fmt_claim(bm, err, errlen) : 0;
	if (r == 0) {
		d->bm_file = file;
		atomic_store(&d->bm, bm);
	}
	pthread_mutex_unlock(&d->bm_lock);
	if (r < 0) {
		fmt_bitmap_file_close(bm, file);
		return r;
	}
	log_info("bitmap file %s: %s", d->bm_path, create ? "open (made if it was not there)" :
		 handover ? "open, read at the claim" : "open");
	return 0;
}

void disk__bmfile_close(struct disk *d)
{
	struct bdev *bm = atomic_load(&d->bm);

	if (!bm)
		return;
	atomic_store(&d->bm, NULL);
	fmt_bitmap_file_close(bm, d->bm_file);
	d->bm_file = NULL;
}

int disk__bmfile_claim(struct disk *d, char *err, size_t errlen)
{
	struct bdev *bm = atomic_load(&d->bm);
	int r;

	/* Made since we started, by the process that had the disk before
	 * (the VM's previous host in a migration, with a persistent bitmap
	 * added there): its bitmaps are the disk's from now on. */
	bool fresh = false;

	if (!bm && d->bm_path && access(d->bm_path, F_OK) == 0) {
		if ((r = disk__bmfile_open(d, false, false, err, errlen)) < 0)
			return r;
		bm = atomic_load(&d->bm);
		fresh = true;
	}
	if (!bm)
		return 0;
	pthread_mutex_lock(&d->bm_lock);
	r = fmt_claim(bm, err, errlen);
	pthread_mutex_unlock(&d->bm_lock);
	return r < 0 ? r : fresh;
}

void disk__bmfile_release(struct disk *d)
{
	struct bdev *bm = atomic_load(&d->bm);

	if (!bm)
		return;
	pthread_mutex_lock(&d->bm_lock);
	fmt_release(bm);
	pthread_mutex_unlock(&d->bm_lock);
}

int disk__bmfile_quiesce(struct disk *d, char *err, size_t errlen)
{
	struct bdev *bm = atomic_load(&d->bm);
	int r;

	if (!bm)
		return 0;
	pthread_mutex_lock(&d->bm_lock);
	r = fmt_quiesce(bm, err, errlen);
	pthread_mutex_unlock(&d->bm_lock);
	return r;
}

int disk__bmfile_grow(struct disk *d, uint64_t size)
{
	struct bdev *bm = atomic_load(&d->bm);
	char err[256];
	int r;

	if (!bm || bm->size >= size)
		return 0;
	pthread_mutex_lock(&d->bm_lock);
	r = bdev_resize(bm, size, err, sizeof(err));
	pthread_mutex_unlock(&d->bm_lock);
	if (r < 0)
		log_err("bitmap file %s: not grown with the disk: %s", d->bm_path, err);
	return r;
}

/* The write-ahead of a raw disk's write (disk_dirty). */
int disk__bmfile_write(struct disk *d, uint64_t off, uint64_t len)
{
	struct bdev *bm = atomic_load_explicit(&d->bm, memory_order_acquire);
	int r;

	if (!bm)
		return 0;
	pthread_mutex_lock(&d->bm_lock);
	r = fmt_bitmaps_write(bm, off, len);
	pthread_mutex_unlock(&d->bm_lock);
	if (r < 0)
		log_err("bitmap file %s: the region of a write could not be marked ahead (%s): "
			"the write fails", d->bm_path, strerror(-r));
	return r;
}
