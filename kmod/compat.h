/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Kernel-version differences, in one place.  Supported series: 6.1
 * (Debian 12), 6.12 (Debian 13, bookworm-backports) and 7.3
 * (trixie-backports).  kmod/Kbuild probes the target's headers and
 * defines AZSWAP_HAVE_* for each API below (header probes rather than
 * version checks, so Debian's backports are honoured).
 *
 * - rw_page (gone in 6.3): 6.1 marks a swap device SWP_SYNCHRONOUS_IO only
 *   when the driver has ->rw_page (mm/swapfile.c), so swap-in skips
 *   readahead and the bio round trip.  Later kernels use bios only and
 *   mark the device synchronous from the queue's BLK_FEAT_SYNCHRONOUS.
 *   A swap_cache=1 device (main.c) is neither: no ->rw_page, no feature.
 * - <linux/unaligned.h> replaced <asm/unaligned.h> (6.12).
 * - block_device_operations.open takes the gendisk (6.5).
 * - blk_alloc_disk() takes the queue limits and returns an ERR_PTR (6.9);
 *   queue flags became limits features (6.11).
 * - genl pre_doit/post_doit take a genl_split_ops (6.2); a dump's parsed
 *   attributes moved into genl_info_dump(cb) (6.6).
 * - zsmalloc: zs_malloc() takes a NUMA node and objects are accessed by
 *   copy (zs_obj_read_begin/end, zs_obj_write) instead of zs_map_object
 *   (6.18): see az_shim_kernel.c.
 * - A copied-on-write page of a private file mapping is indexed by its
 *   virtual page number, no longer by its file offset, once the VMA keeps
 *   an anonymous page offset (vma_start_anon_pgoff(), 7.x): SANDBOX_MAP
 *   (netlink.c) then maps those indexes back to the template's.
 */
#ifndef AZSWAP_COMPAT_H
#define AZSWAP_COMPAT_H

#ifdef AZSWAP_HAVE_LINUX_UNALIGNED_H
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

#include <linux/blkdev.h>
#include <linux/err.h>
#include <linux/zsmalloc.h>
#include <net/genetlink.h>

#ifdef AZSWAP_HAVE_ZS_MALLOC_NID
#define azswap_zs_malloc(pool, size, gfp) \
	zs_malloc(pool, size, gfp, NUMA_NO_NODE)
#else
#define azswap_zs_malloc(pool, size, gfp) zs_malloc(pool, size, gfp)
#endif

#ifdef AZSWAP_HAVE_RW_PAGE
#define azswap_fops_rw_page(fn)	.rw_page = (fn),
#else
#define azswap_fops_rw_page(fn)
#endif

/*
 * The ->open method: "static int name(AZSWAP_OPEN_ARGS)", its disk is
 * AZSWAP_OPEN_DISK.
 */
#ifdef AZSWAP_HAVE_OPEN_GENDISK
#define AZSWAP_OPEN_ARGS	struct gendisk *disk, blk_mode_t mode
#define AZSWAP_OPEN_DISK	(disk)
#else
#define AZSWAP_OPEN_ARGS	struct block_device *bdev, fmode_t mode
#define AZSWAP_OPEN_DISK	(bdev->bd_disk)
#endif

/*
 * A disk with zram's queue set-up: RAM behind it (non-rotational, no
 * entropy), page-sized blocks, stable pages during writeback, discards
 * of whole pages, and synchronous I/O where the kernel has a way to say
 * so and @sync asks for it (6.1: the fops' ->rw_page, chosen in device.c).
 * Returns an ERR_PTR on failure.
 */
#ifdef AZSWAP_HAVE_BLK_FEAT
static inline struct gendisk *azswap_alloc_disk(bool sync)
{
	struct queue_limits lim = {
		.logical_block_size = PAGE_SIZE,
		.physical_block_size = PAGE_SIZE,
		.io_min = PAGE_SIZE,
		.io_opt = PAGE_SIZE,
		.discard_granularity = PAGE_SIZE,
		.max_hw_discard_sectors = UINT_MAX,
		.max_write_zeroes_sectors = UINT_MAX,
		.features = BLK_FEAT_STABLE_WRITES |
			    (sync ? BLK_FEAT_SYNCHRONOUS : 0),
	};

	return blk_alloc_disk(&lim, NUMA_NO_NODE);
}
#elif defined(AZSWAP_HAVE_ALLOC_DISK_LIMITS)
#error "azswap: kernels 6.9 and 6.10 are not supported (use 6.1, 6.12 or 7.3)"
#else
static inline struct gendisk *azswap_alloc_disk(bool sync)
{
	struct gendisk *disk = blk_alloc_disk(NUMA_NO_NODE);
	struct request_queue *q;

	if (!disk)
		return ERR_PTR(-ENOMEM);
	q = disk->queue;
	blk_queue_flag_set(QUEUE_FLAG_NONROT, q);
	blk_queue_flag_clear(QUEUE_FLAG_ADD_RANDOM, q);
	blk_queue_flag_set(QUEUE_FLAG_STABLE_WRITES, q);
#ifdef AZSWAP_HAVE_QUEUE_FLAG_SYNCHRONOUS
	if (sync)
		blk_queue_flag_set(QUEUE_FLAG_SYNCHRONOUS, q);
#endif
	blk_queue_physical_block_size(q, PAGE_SIZE);
	blk_queue_logical_block_size(q, PAGE_SIZE);
	blk_queue_io_min(q, PAGE_SIZE);
	blk_queue_io_opt(q, PAGE_SIZE);
	q->limits.discard_granularity = PAGE_SIZE;
	blk_queue_max_discard_sectors(q, UINT_MAX);
	blk_queue_max_write_zeroes_sectors(q, UINT_MAX);
	return disk;
}
#endif

/* pre_doit/post_doit: "const struct azswap_genl_ops *ops". */
#ifdef AZSWAP_HAVE_GENL_SPLIT_OPS
#define azswap_genl_ops genl_split_ops
#else
#define azswap_genl_ops genl_ops
#endif

/* The parsed attributes of a dump request. */
static inline struct nlattr **azswap_dump_attrs(struct netlink_callback *cb)
{
#ifdef AZSWAP_HAVE_GENL_INFO_DUMP
	return genl_info_dump(cb)->attrs;
#else
	return genl_dumpit_info(cb)->attrs;
#endif
}

/* enum azswap_cow_index of this kernel (uapi/azswap_nl.h). */
#ifdef AZSWAP_HAVE_ANON_PGOFF
#define AZSWAP_COW_INDEX AZSWAP_COW_INDEX_VIRTUAL
#else
#define AZSWAP_COW_INDEX AZSWAP_COW_INDEX_FILE
#endif

#endif /* AZSWAP_COMPAT_H */
