// SPDX-License-Identifier: GPL-2.0
/*
 * /dev/azswapN: the block device swap sees.
 *
 * Slot = page index on the device (sector >> 3); slot 0 holds the swap
 * header.  Each 4 KiB page is one store operation:
 *
 *   rw_page(WRITE) / bio WRITE  -> az_store_put(slot, page, owner, index)
 *   rw_page(READ)  / bio READ   -> az_store_get(slot)   (empty -> zeroes)
 *   DISCARD / WRITE_ZEROES      -> az_store_free(slot)  (reads as zeroes)
 *   swap_slot_free_notify       -> az_store_free(slot)  (atomic context)
 *
 * A failed write (pool full: mem_limit or allocation failure) leaves the
 * slot empty.  rw_page then returns the error without page_endio(), the
 * kernel retries with a bio, the bio ends with BLK_STS_IOERR and
 * end_swap_bio_write() re-dirties the page: the kernel keeps it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/blkdev.h>
#include <linux/bio.h>
#include <linux/highmem.h>
#include <linux/pagemap.h>
#include <linux/memcontrol.h>
#include <linux/cgroup.h>
#include <linux/ktime.h>
#include <linux/mm.h>
#include <linux/part_stat.h>

#include "azswap.h"
#include "compat.h"
#include "azswap_trace.h"

static int azswap_major;

/*
 * Who owns @page and where it sits in its mapping.  The owner is the
 * page's memory cgroup (never current: the writer may be kswapd or the
 * task writing memory.reclaim).  page_memcg_check() is the variant that is
 * safe for any page a bio may carry (slab, kmem); RCU keeps the memcg
 * alive while we read its cgroup id.  The index hint is the linear page
 * index for anonymous pages (folio->index of the head plus the subpage)
 * and the file offset for page cache and shmem pages in the swap cache.
 */
static void azswap_page_info(struct page *page, struct az_page_info *pi)
{
	struct folio *folio = page_folio(page);
	struct mem_cgroup *memcg;

	pi->owner = 0;
	rcu_read_lock();
	memcg = page_memcg_check(page);
	if (memcg)
		pi->owner = cgroup_id(memcg->css.cgroup);
	rcu_read_unlock();

	if (folio_test_anon(folio) || folio_test_swapcache(folio) ||
	    folio->mapping)
		pi->index = folio->index + folio_page_idx(folio, page);
	else
		pi->index = 0;
}

static u64 azswap_page_owner(struct page *page)
{
	struct mem_cgroup *memcg;
	u64 id = 0;

	rcu_read_lock();
	memcg = page_memcg_check(page);
	if (memcg)
		id = cgroup_id(memcg->css.cgroup);
	rcu_read_unlock();
	return id;
}

void azswap_dev_update_max(struct azswap_dev *dev)
{
	struct az_stats st;
	s64 cur;

	az_store_get_stats(dev->store, &st);
	cur = atomic64_read(&dev->mem_used_max);
	while ((s64)st.pool_bytes > cur) {
		s64 old = atomic64_cmpxchg(&dev->mem_used_max, cur,
					   st.pool_bytes);
		if (old == cur)
			break;
		cur = old;
	}
}

/* Store the page at @mem (4 KiB, mapped) in @slot.  May sleep. */
static int azswap_store(struct azswap_dev *dev, u64 slot, const void *mem,
			const struct az_page_info *pi)
{
	struct azswap_pcpu *pc;
	int ret, kind;
	u32 bytes = 0;

	pc = azswap_ctx_get();
	ret = az_store_put(dev->store, azswap_ctx(pc), slot, mem, pi);
	azswap_ctx_put(pc);
	if (!ret)
		azswap_dev_update_max(dev);
	if (trace_azswap_store_enabled()) {
		kind = ret ? -1 : az_store_slot_info(dev->store, slot, &bytes);
		trace_azswap_store(dev->id, pi->owner, slot, kind, bytes, ret);
	}
	return ret;
}

/* Load @slot into @mem (4 KiB, mapped).  May sleep (the context mutex). */
static int azswap_load(struct azswap_dev *dev, u64 slot, void *mem,
		       struct page *owner_page)
{
	struct azswap_pcpu *pc;
	bool tracing = trace_azswap_load_enabled();
	u64 t0 = 0;
	int ret, kind = 0;

	if (tracing) {
		kind = az_store_slot_kind(dev->store, slot);
		t0 = ktime_get_ns();
	}
	pc = azswap_ctx_get();
	ret = az_store_get(dev->store, azswap_ctx(pc), slot, mem);
	azswap_ctx_put(pc);
	if (tracing)
		trace_azswap_load(dev->id,
				  owner_page ? azswap_page_owner(owner_page) : 0,
				  slot, kind < 0 ? -1 : kind,
				  ktime_get_ns() - t0, ret);
	return ret;
}

static bool azswap_valid_slot(struct azswap_dev *dev, sector_t sector,
			      unsigned int bytes)
{
	struct az_store *s = READ_ONCE(dev->store);
	u64 end;

	if (!s || (sector & (AZSWAP_SECTORS_PER_PAGE - 1)) ||
	    (bytes & (PAGE_SIZE - 1)))
		return false;
	end = (sector >> (PAGE_SHIFT - SECTOR_SHIFT)) + (bytes >> PAGE_SHIFT);
	return end <= az_store_nr_slots(s);
}

#ifdef AZSWAP_HAVE_RW_PAGE
/*
 * The synchronous single-page path swap uses on 6.1.  Compound pages are
 * refused so that the kernel sends a THP as one bio instead.  On error we
 * return without page_endio(): the caller retries with a bio whose end_io
 * handles the failure (re-dirty on write, SetPageError on read).
 */
static int azswap_rw_page(struct block_device *bdev, sector_t sector,
			  struct page *page, enum req_op op)
{
	struct azswap_dev *dev = bdev->bd_disk->private_data;
	struct az_page_info pi;
	unsigned long start;
	u64 slot;
	void *mem;
	int ret;

	if (PageCompound(page))
		return -EOPNOTSUPP;
	if (!azswap_valid_slot(dev, sector, PAGE_SIZE)) {
		atomic64_inc(&dev->invalid_io);
		return -EINVAL;
	}
	slot = sector >> (PAGE_SHIFT - SECTOR_SHIFT);

	start = bdev_start_io_acct(bdev->bd_disk->part0,
				   AZSWAP_SECTORS_PER_PAGE, op, jiffies);
	mem = kmap_local_page(page);
	if (op_is_write(op)) {
		azswap_page_info(page, &pi);
		ret = azswap_store(dev, slot, mem, &pi);
	} else {
		ret = azswap_load(dev, slot, mem, page);
		if (ret == 0)
			flush_dcache_page(page);
	}
	kunmap_local(mem);
	bdev_end_io_acct(bdev->bd_disk->part0, op, start);
	if (ret)
		return ret;
	page_endio(page, op_is_write(op), 0);
	return 0;
}
#endif

/*
 * Pool compaction.  Pages that come back from swap free their objects, and
 * the holes they leave in zsmalloc's pages keep the pool large (zram leaves
 * this to a `compact` write).  After a free, when the core says the pool
 * holds much more than the live payload, a delayed work item compacts it:
 * at once, or a second after the last one (the frees of one restore come
 * in a burst: the work queued during it runs once, after).  The work never
 * waits for init_lock: reset and remove hold it for writing, and a work
 * that runs after them finds no store.
 */
static void azswap_compact_fn(struct work_struct *work)
{
	struct azswap_dev *dev = container_of(to_delayed_work(work),
					      struct azswap_dev, compact_work);

	if (!down_read_trylock(&dev->init_lock))
		return;
	if (dev->store && az_store_compact_wanted(dev->store))
		az_store_compact(dev->store);
	up_read(&dev->init_lock);
	WRITE_ONCE(dev->compact_after, jiffies + HZ);
}

/* After a free; atomic context safe (two counter reads, a timer). */
static void azswap_maybe_compact(struct azswap_dev *dev)
{
	long wait = (long)(READ_ONCE(dev->compact_after) - jiffies);

	if (az_store_compact_wanted(dev->store))
		queue_delayed_work(system_unbound_wq, &dev->compact_work,
				   wait > 0 ? wait : 0);
}

/* Discard / write-zeroes: whole pages only (logical block = PAGE_SIZE). */
static void azswap_bio_free(struct azswap_dev *dev, struct bio *bio)
{
	u64 slot = bio->bi_iter.bi_sector >> (PAGE_SHIFT - SECTOR_SHIFT);
	u64 n = bio->bi_iter.bi_size >> PAGE_SHIFT;

	while (n--) {
		az_store_free(dev->store, slot++);
		cond_resched();
	}
	azswap_maybe_compact(dev);
}

/*
 * Read or write every 4 KiB block of @bio.  Swap sends whole pages
 * (one for a base page, 512 for a THP); other users may send blocks split
 * across segments (a 512-byte aligned O_DIRECT buffer): those go through
 * a bounce page.
 */
static blk_status_t azswap_bio_rw(struct azswap_dev *dev, struct bio *bio)
{
	bool write = op_is_write(bio_op(bio));
	u64 slot = bio->bi_iter.bi_sector >> (PAGE_SHIFT - SECTOR_SHIFT);
	struct page *bounce = NULL;
	struct bvec_iter iter;
	struct bio_vec bvec, bv;
	unsigned int pos = 0;	/* bytes of the current block done */
	struct az_page_info pi;
	void *mem;
	int ret = 0;

	bio_for_each_segment(bvec, bio, iter) {
		/*
		 * The iterator advances by bvec.bv_len: consume a copy.
		 */
		bv = bvec;
		while (bv.bv_len) {
			unsigned int n = min_t(unsigned int, bv.bv_len,
					       PAGE_SIZE - pos);
			struct bio_vec part = bv;

			if (!pos && n == PAGE_SIZE) {
				/* A whole page in one segment (bv_offset 0). */
				mem = kmap_local_page(bv.bv_page);
				if (write) {
					azswap_page_info(bv.bv_page, &pi);
					ret = azswap_store(dev, slot, mem, &pi);
				} else {
					ret = azswap_load(dev, slot, mem,
							  bv.bv_page);
					if (!ret)
						flush_dcache_page(bv.bv_page);
				}
				kunmap_local(mem);
				if (ret)
					goto out;
				goto next;
			}

			/* Part of a block: assemble it in the bounce page. */
			if (!bounce) {
				bounce = alloc_page(GFP_NOIO);
				if (!bounce) {
					ret = -ENOMEM;
					goto out;
				}
				atomic64_inc(&dev->partial_io);
			}
			mem = page_address(bounce);
			if (!write && !pos) {
				ret = azswap_load(dev, slot, mem, NULL);
				if (ret)
					goto out;
			}
			part.bv_len = n;
			if (write)
				memcpy_from_bvec(mem + pos, &part);
			else
				memcpy_to_bvec(&part, mem + pos);
			pos += n;
			if (pos < PAGE_SIZE) {
				bv.bv_offset += n;
				bv.bv_len -= n;
				continue;
			}
			pos = 0;
			if (write) {
				/* No single page: owner and index unknown. */
				memset(&pi, 0, sizeof(pi));
				ret = azswap_store(dev, slot, mem, &pi);
				if (ret)
					goto out;
			}
next:
			slot++;
			bv.bv_offset += n;
			bv.bv_len -= n;
		}
	}
out:
	if (bounce)
		__free_page(bounce);
	return ret ? BLK_STS_IOERR : BLK_STS_OK;
}

static void azswap_submit_bio(struct bio *bio)
{
	struct azswap_dev *dev = bio->bi_bdev->bd_disk->private_data;
	unsigned long start;

	if (!azswap_valid_slot(dev, bio->bi_iter.bi_sector,
			       bio->bi_iter.bi_size)) {
		atomic64_inc(&dev->invalid_io);
		bio_io_error(bio);
		return;
	}

	switch (bio_op(bio)) {
	case REQ_OP_DISCARD:
	case REQ_OP_WRITE_ZEROES:
		azswap_bio_free(dev, bio);
		bio_endio(bio);
		return;
	case REQ_OP_READ:
	case REQ_OP_WRITE:
		break;
	default:
		bio->bi_status = BLK_STS_NOTSUPP;
		bio_endio(bio);
		return;
	}

	start = bio_start_io_acct(bio);
	bio->bi_status = azswap_bio_rw(dev, bio);
	bio_end_io_acct(bio, start);
	bio_endio(bio);
}

/*
 * Called with the swap device's lock held (and sometimes a page table
 * lock): az_store_free takes only the slot's bit spinlock, allocates
 * nothing and never sleeps.  Freeing shared objects is deferred by the
 * core to a work item.
 */
static void azswap_slot_free_notify(struct block_device *bdev,
				    unsigned long slot)
{
	struct azswap_dev *dev = bdev->bd_disk->private_data;

	atomic64_inc(&dev->notify_free);
	az_store_free(dev->store, slot);
	azswap_maybe_compact(dev);
}

/* Called with disk->open_mutex held. */
static int azswap_open(struct block_device *bdev, fmode_t mode)
{
	struct azswap_dev *dev = bdev->bd_disk->private_data;

	return dev->claim ? -EBUSY : 0;
}

static const struct block_device_operations azswap_fops = {
	.owner = THIS_MODULE,
	.open = azswap_open,
	.submit_bio = azswap_submit_bio,
	.swap_slot_free_notify = azswap_slot_free_notify,
	azswap_fops_rw_page(azswap_rw_page)
};

/* Called with init_lock held for writing, device not initialised. */
int azswap_dev_init_store(struct azswap_dev *dev, u64 disksize)
{
	struct az_store *s;
	int ret;

	s = az_store_create(disksize >> PAGE_SHIFT, dev->disk->disk_name);
	if (!s)
		return -ENOMEM;
	ret = az_store_set_policy(s, &dev->pol);
	/* The store starts with the default cache: resize only if told to. */
	if (!ret && az_store_get_base_cache(s) != dev->base_cache)
		ret = az_store_set_base_cache(s, dev->base_cache);
	if (!ret)
		ret = az_store_set_sim_slots(s, dev->sim_slots);
	if (ret) {
		az_store_destroy(s);
		return ret;
	}
	az_store_set_mem_limit(s, dev->mem_limit);
	atomic64_set(&dev->mem_used_max, 0);
	WRITE_ONCE(dev->store, s);
	dev->disksize = disksize;
	set_capacity_and_notify(dev->disk, disksize >> SECTOR_SHIFT);
	return 0;
}

/* Tear down the store; the caller made sure nobody has the disk open. */
static void azswap_dev_teardown(struct azswap_dev *dev)
{
	struct az_store *s;

	down_write(&dev->init_lock);
	s = dev->store;
	set_capacity_and_notify(dev->disk, 0);
	part_stat_set_all(dev->disk->part0, 0);
	WRITE_ONCE(dev->store, NULL);
	dev->disksize = 0;
	atomic64_set(&dev->mem_used_max, 0);
	atomic64_set(&dev->invalid_io, 0);
	atomic64_set(&dev->notify_free, 0);
	atomic64_set(&dev->partial_io, 0);
	xa_destroy(&dev->phases);
	up_write(&dev->init_lock);
	/* Frees every object, drains the deferred frees, destroys the pool. */
	az_store_destroy(s);
}

/*
 * sysfs "reset": refuse while anyone has the device open (swapon holds it
 * open, so does a mounted or dd'ing user), otherwise claim it so no new
 * opener appears, flush the page cache and drop the store.  Policy and
 * mem_limit are kept; disksize must be set again.
 */
int azswap_dev_reset(struct azswap_dev *dev)
{
	struct gendisk *disk = dev->disk;

	mutex_lock(&disk->open_mutex);
	if (disk_openers(disk) || dev->claim) {
		mutex_unlock(&disk->open_mutex);
		return -EBUSY;
	}
	dev->claim = true;
	mutex_unlock(&disk->open_mutex);

	sync_blockdev(disk->part0);
	azswap_dev_teardown(dev);

	mutex_lock(&disk->open_mutex);
	dev->claim = false;
	mutex_unlock(&disk->open_mutex);
	return 0;
}

int azswap_dev_add(struct azswap_dev *dev, int id)
{
	struct gendisk *disk;
	int ret;

	dev->id = id;
	init_rwsem(&dev->init_lock);
	xa_init(&dev->phases);
	INIT_DELAYED_WORK(&dev->compact_work, azswap_compact_fn);
	/* Not 0: jiffies starts 5 minutes before wrapping to 0 (INITIAL_JIFFIES). */
	dev->compact_after = jiffies;
	dev->pol = (struct az_policy){
		.codec = AZ_CODEC_LZ4, .level = 3, .dedup = 1, .tdelta = 1,
		.xdelta = 1, .sim_effort = 4, .delta_max_pct = 80, .verify = 1,
		.shuffle = 1,
	};
	dev->base_cache = 256;
	dev->sim_slots = 1;

	disk = blk_alloc_disk(NUMA_NO_NODE);
	if (!disk)
		return -ENOMEM;
	disk->major = azswap_major;
	disk->first_minor = id;
	disk->minors = 1;
	disk->flags |= GENHD_FL_NO_PART;
	disk->fops = &azswap_fops;
	disk->private_data = dev;
	snprintf(disk->disk_name, DISK_NAME_LEN, "azswap%d", id);
	set_capacity(disk, 0);

	/* Like zram: RAM behind it, page-sized blocks, stable pages. */
	blk_queue_flag_set(QUEUE_FLAG_NONROT, disk->queue);
	blk_queue_flag_clear(QUEUE_FLAG_ADD_RANDOM, disk->queue);
	blk_queue_flag_set(QUEUE_FLAG_STABLE_WRITES, disk->queue);
	blk_queue_physical_block_size(disk->queue, PAGE_SIZE);
	blk_queue_logical_block_size(disk->queue, PAGE_SIZE);
	blk_queue_io_min(disk->queue, PAGE_SIZE);
	blk_queue_io_opt(disk->queue, PAGE_SIZE);
	disk->queue->limits.discard_granularity = PAGE_SIZE;
	blk_queue_max_discard_sectors(disk->queue, UINT_MAX);
	blk_queue_max_write_zeroes_sectors(disk->queue, UINT_MAX);

	dev->disk = disk;
	ret = device_add_disk(NULL, disk, azswap_disk_groups);
	if (ret)
		goto err_put;
	return 0;

err_put:
	put_disk(disk);
	dev->disk = NULL;
	return ret;
}

/*
 * Module unload.  The disk's fops->owner pins the module while the device
 * is open (swapon), so nobody has it open here; del_gendisk() waits for
 * sysfs writers (reset) to finish.
 */
void azswap_dev_remove(struct azswap_dev *dev)
{
	if (!dev->disk)
		return;
	mutex_lock(&dev->disk->open_mutex);
	dev->claim = true;
	mutex_unlock(&dev->disk->open_mutex);
	sync_blockdev(dev->disk->part0);
	del_gendisk(dev->disk);
	/* A disksize write may have raced with the claim: tear down after. */
	azswap_dev_teardown(dev);
	cancel_delayed_work_sync(&dev->compact_work);
	put_disk(dev->disk);
	dev->disk = NULL;
}

int azswap_register_blkdev(void)
{
	int ret = register_blkdev(0, "azswap");

	if (ret < 0)
		return ret;
	azswap_major = ret;
	return 0;
}

void azswap_unregister_blkdev(void)
{
	unregister_blkdev(azswap_major, "azswap");
}
