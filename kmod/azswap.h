/* SPDX-License-Identifier: GPL-2.0 */
/*
 * azswap kernel glue: what the glue files share.
 *
 *   main.c     module parameters, init/exit: wires the files below
 *   device.c   device state: store, policy, per-CPU store contexts (cpuhp);
 *              /dev/azswapN: gendisk, rw_page, submit_bio, slot free
 *   sysfs.c    /sys/block/azswapN/ attributes (docs/sysfs-abi.md)
 *   netlink.c  generic netlink family "azswap" (docs/netlink.md)
 *
 * sysfs.c and netlink.c are front ends: they call device.c (and the core
 * through the device's store), never each other; device.c calls neither.
 *   trace.c    tracepoints azswap:azswap_store / azswap:azswap_load
 *
 * The page store itself is kmod/core/ (API: core/azcore.h).
 */
#ifndef AZSWAP_H
#define AZSWAP_H

#include <linux/types.h>
#include <linux/atomic.h>
#include <linux/mutex.h>
#include <linux/rwsem.h>
#include <linux/xarray.h>
#include <linux/workqueue.h>
#include <linux/blkdev.h>

#include "azcore.h"

#define AZSWAP_MAX_DEVICES	32
#define AZSWAP_SECTORS_PER_PAGE	(PAGE_SIZE >> SECTOR_SHIFT)

/*
 * One block device.
 *
 * Locking: @init_lock (rwsem) covers @store, @disksize, @mem_limit,
 * @base_cache, @sim_slots, @sim_sample and @pol against initialisation
 * (disksize), reset and module unload.
 * sysfs and netlink take it (read to use the store, write to create,
 * destroy or reconfigure it).  The I/O paths do not take it: I/O only
 * reaches the driver while the capacity is non-zero, which is set after
 * @store is created and cleared (with no opener left, see @claim) before
 * it is destroyed, exactly as zram does.
 */
struct azswap_dev {
	struct gendisk *disk;
	int id;
	struct rw_semaphore init_lock;
	struct az_store *store;		/* NULL until disksize is set */
	u64 disksize;			/* bytes, 0 = not initialised */
	u64 mem_limit;			/* bytes, 0 = unlimited */
	u32 base_cache;			/* decoded-base cache, entries */
	u32 sim_slots;			/* slots per similarity index entry */
	u32 sim_sample;			/* sparse groups: 1 object in this many */
	struct az_policy pol;		/* applied at init; mirrors the store */
	bool claim;			/* reset/remove in progress: open fails */
	/* Glue-level counters (the store keeps its own, see sysfs.c). */
	atomic64_t mem_used_max;	/* bytes */
	atomic64_t invalid_io;
	atomic64_t notify_free;
	atomic64_t miss_free;		/* slot-free notifies that found it locked */
	atomic64_t partial_io;
	/* Pool compaction after frees (device.c); @compact_after in jiffies. */
	struct delayed_work compact_work;
	unsigned long compact_after;
	/* Phase hints per owner (netlink PHASE_SET): cgroup id -> value. */
	struct xarray phases;
};

extern struct azswap_dev *azswap_devs;
extern unsigned int azswap_nr_devs;
extern bool azswap_swap_cache;

/* device.c */
int azswap_ctxs_init(void);
void azswap_ctxs_exit(void);
int azswap_dev_add(struct azswap_dev *dev, int id,
		   const struct attribute_group **groups);
void azswap_dev_remove(struct azswap_dev *dev);
int azswap_dev_init_store(struct azswap_dev *dev, u64 disksize);
int azswap_dev_reset(struct azswap_dev *dev);
int azswap_dev_set_policy(struct azswap_dev *dev, const struct az_policy *p);
int azswap_dev_template_load(struct azswap_dev *dev, u64 tid, u64 index,
			     const void *page);
void azswap_dev_update_max(struct azswap_dev *dev);
int azswap_dev_pack(struct azswap_dev *dev, u64 *packed);
int azswap_register_blkdev(void);
void azswap_unregister_blkdev(void);

/* sysfs.c */
extern const struct attribute_group *azswap_disk_groups[];

/* netlink.c */
int azswap_netlink_init(void);
void azswap_netlink_exit(void);
u8 azswap_phase_of(struct azswap_dev *dev, u64 cgroup_id);

#endif /* AZSWAP_H */
