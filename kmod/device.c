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
 * slot as it was.  rw_page then returns the error without page_endio(), the
 * kernel retries with a bio, the bio ends with BLK_STS_IOERR and
 * end_swap_bio_write() re-dirties the page: the kernel keeps it.
 *
 * This file owns the device state: the store, its policy (set through
 * sysfs.c and netlink.c, which are front ends) and the per-CPU store
 * contexts.
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
#include <linux/cpuhotplug.h>
#include <linux/percpu.h>

#include "azswap.h"
#include "compat.h"
#include "azswap_trace.h"

static int azswap_major;

/* ---- per-CPU store contexts -------------------------------------------- */

/*
 * Per-CPU store contexts (codec workspaces and page buffers, ~0.5 MiB
 * each), zswap-6.1 style: the caller picks the current CPU's context with
 * raw_cpu_ptr() and takes its mutex, so it may be preempted (and migrate)
 * while storing; the mutex, not the CPU, gives exclusive use.  A CPU's
 * context is created in the cpuhp prepare step and destroyed when the CPU
 * is dead, under the same mutex, so a task that picked a context just
 * before its CPU went away finds ctx == NULL and picks again.
 *
 * Nothing sleeps for memory under pc->lock: the core's no-wait calls only
 * allocate without direct reclaim, and the GFP_NOIO retry (az_reserve_fill)
 * runs with the context dropped (zram's two-phase allocation).  A writer
 * waiting there would otherwise hold up kswapd and direct reclaim on that
 * CPU's context.
 */
struct azswap_pcpu {
	struct mutex lock;
	struct az_ctx *ctx;
};

static struct azswap_ctxs {
	struct hlist_node node;
	struct azswap_pcpu __percpu *pcpu;
} azswap_ctxs;

static enum cpuhp_state azswap_cpuhp;

static int azswap_cpu_prepare(unsigned int cpu, struct hlist_node *node)
{
	struct azswap_ctxs *c = hlist_entry(node, struct azswap_ctxs, node);
	struct azswap_pcpu *pc = per_cpu_ptr(c->pcpu, cpu);
	struct az_ctx *ctx;

	if (READ_ONCE(pc->ctx))
		return 0;
	ctx = az_ctx_create();
	if (!ctx)
		return -ENOMEM;
	mutex_lock(&pc->lock);
	pc->ctx = ctx;
	mutex_unlock(&pc->lock);
	return 0;
}

static int azswap_cpu_dead(unsigned int cpu, struct hlist_node *node)
{
	struct azswap_ctxs *c = hlist_entry(node, struct azswap_ctxs, node);
	struct azswap_pcpu *pc = per_cpu_ptr(c->pcpu, cpu);
	struct az_ctx *ctx;

	mutex_lock(&pc->lock);
	ctx = pc->ctx;
	pc->ctx = NULL;
	mutex_unlock(&pc->lock);
	az_ctx_destroy(ctx);
	return 0;
}

/* Process context; may sleep.  Returns with the context's mutex held. */
static struct azswap_pcpu *azswap_ctx_get(void)
{
	struct azswap_pcpu *pc;

	for (;;) {
		pc = raw_cpu_ptr(azswap_ctxs.pcpu);
		mutex_lock(&pc->lock);
		if (likely(pc->ctx))
			return pc;
		/* That CPU went offline after we picked it. */
		mutex_unlock(&pc->lock);
		cond_resched();
	}
}

static void azswap_ctx_put(struct azswap_pcpu *pc)
{
	mutex_unlock(&pc->lock);
}

int azswap_ctxs_init(void)
{
	unsigned int cpu;
	int ret;

	azswap_ctxs.pcpu = alloc_percpu(struct azswap_pcpu);
	if (!azswap_ctxs.pcpu)
		return -ENOMEM;
	for_each_possible_cpu(cpu)
		mutex_init(&per_cpu_ptr(azswap_ctxs.pcpu, cpu)->lock);

	ret = cpuhp_setup_state_multi(CPUHP_BP_PREPARE_DYN, "block/azswap:prepare",
				      azswap_cpu_prepare, azswap_cpu_dead);
	if (ret < 0)
		goto err_free;
	azswap_cpuhp = ret;
	ret = cpuhp_state_add_instance(azswap_cpuhp, &azswap_ctxs.node);
	if (ret)
		goto err_state;
	return 0;

err_state:
	cpuhp_remove_multi_state(azswap_cpuhp);
err_free:
	free_percpu(azswap_ctxs.pcpu);
	return ret;
}

void azswap_ctxs_exit(void)
{
	/* Runs the dead callback for every CPU that has a context. */
	cpuhp_state_remove_instance(azswap_cpuhp, &azswap_ctxs.node);
	cpuhp_remove_multi_state(azswap_cpuhp);
	free_percpu(azswap_ctxs.pcpu);
}

/* ---- pages -------------------------------------------------------------- */

/*
 * The memory cgroup of @page: the folio's (a THP's tail pages carry no
 * memcg of their own, only its head does).  page_memcg_check() is the
 * variant that is safe for any page a bio may carry (slab, kmem); RCU
 * keeps the memcg alive while we read its cgroup id.
 */
static u64 azswap_page_owner(struct page *page)
{
	struct mem_cgroup *memcg;
	u64 id = 0;

	rcu_read_lock();
	memcg = page_memcg_check(&page_folio(page)->page);
	if (memcg)
		id = cgroup_id(memcg->css.cgroup);
	rcu_read_unlock();
	return id;
}

/*
 * Who owns @page and where it sits in its mapping.  The owner is the
 * page's memory cgroup (never current: the writer may be kswapd or the
 * task writing memory.reclaim).  The index hint is the linear page index
 * for anonymous pages (folio->index of the head plus the subpage: every
 * subpage of a THP gets its own) and the file offset for page cache and
 * shmem pages in the swap cache.
 */
static void azswap_page_info(struct page *page, struct az_page_info *pi)
{
	struct folio *folio = page_folio(page);

	pi->owner = azswap_page_owner(page);
	if (folio_test_anon(folio) || folio_test_swapcache(folio) ||
	    folio->mapping)
		pi->index = folio->index + folio_page_idx(folio, page);
	else
		pi->index = 0;
}

/* mem_used_max from the pool's page count: one counter read a page. */
void azswap_dev_update_max(struct azswap_dev *dev)
{
	s64 bytes = az_store_pool_bytes(dev->store);
	s64 cur = atomic64_read(&dev->mem_used_max);

	while (bytes > cur) {
		s64 old = atomic64_cmpxchg(&dev->mem_used_max, cur, bytes);

		if (old == cur)
			break;
		cur = old;
	}
}

/*
 * Store the page at @mem (4 KiB, mapped) in @slot.  May sleep, but never
 * for memory while it holds a context: the first attempt allocates
 * without direct reclaim; if that falls short the context is dropped, the
 * reserve is filled with GFP_NOIO and the page is stored again.
 */
static int azswap_store(struct azswap_dev *dev, u64 slot, const void *mem,
			const struct az_page_info *pi)
{
	struct az_reserve res = { 0 };
	struct azswap_pcpu *pc;
	int ret, kind;
	u32 bytes = 0;

	pc = azswap_ctx_get();
	ret = az_store_put_nowait(dev->store, pc->ctx, slot, mem, pi, &res);
	azswap_ctx_put(pc);
	if (ret == -EAGAIN) {
		ret = az_reserve_fill(dev->store, &res);
		if (!ret) {
			pc = azswap_ctx_get();
			ret = az_store_put_nowait(dev->store, pc->ctx, slot, mem,
						  pi, &res);
			azswap_ctx_put(pc);
		}
	}
	az_reserve_release(dev->store, &res);
	if (!ret)
		azswap_dev_update_max(dev);
	if (trace_azswap_store_enabled()) {
		kind = ret ? -1 : az_store_slot_info(dev->store, slot, &bytes);
		trace_azswap_store(dev->id, pi->owner, slot, kind, bytes, ret);
	}
	return ret;
}

/*
 * One snapshot-file template page, like azswap_store.  Caller holds
 * init_lock for reading (the store exists).
 */
int azswap_dev_template_load(struct azswap_dev *dev, u64 tid, u64 index,
			     const void *page)
{
	struct az_reserve res = { 0 };
	struct azswap_pcpu *pc;
	int ret;

	pc = azswap_ctx_get();
	ret = az_store_template_load_nowait(dev->store, pc->ctx, tid, index,
					    page, &res);
	azswap_ctx_put(pc);
	if (ret == -EAGAIN) {
		ret = az_reserve_fill(dev->store, &res);
		if (!ret) {
			pc = azswap_ctx_get();
			ret = az_store_template_load_nowait(dev->store, pc->ctx,
							    tid, index, page,
							    &res);
			azswap_ctx_put(pc);
		}
	}
	az_reserve_release(dev->store, &res);
	if (!ret)
		azswap_dev_update_max(dev);
	return ret;
}

/* Slots packed between checks for a fatal signal and a reschedule. */
#define AZSWAP_PACK_CHUNK	4096

/*
 * Pack the whole device (sysfs `pack`) with a context of its own: the
 * pass holds no CPU's context, so swap-ins and swap-outs never wait for
 * it, however low its priority.  Then the objects the packs replaced are
 * freed (deferred free run now) and the pool compacted, so the memory
 * comes back when the write returns.  Caller holds init_lock for reading
 * (the store exists).  0, -ENOMEM (no context) or -EINTR (a fatal signal;
 * what was packed stays packed).
 */
int azswap_dev_pack(struct azswap_dev *dev, u64 *packed)
{
	u64 nr = az_store_nr_slots(dev->store), first, got;
	struct az_ctx *ctx;
	int ret = 0;

	*packed = 0;
	ctx = az_ctx_create();
	if (!ctx)
		return -ENOMEM;
	for (first = 0; first < nr && !ret; first += AZSWAP_PACK_CHUNK) {
		ret = az_store_pack(dev->store, ctx, first,
				    min_t(u64, nr - first, AZSWAP_PACK_CHUNK),
				    &got);
		*packed += got;
		if (!ret && fatal_signal_pending(current))
			ret = -EINTR;
		cond_resched();
	}
	az_ctx_destroy(ctx);
	if (*packed) {
		az_store_drain(dev->store);
		az_store_compact(dev->store);
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
	ret = az_store_get(dev->store, pc->ctx, slot, mem);
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
 * lock): az_store_free_notify only tries the slot's bit spinlock (a
 * reader may hold it across a base and a delta decode), allocates nothing
 * and never sleeps (it may take the slot table's leaf lock for a moment
 * to free an emptied leaf, and the index lock to unlink an indexed
 * object whose last reference goes: never held across a decode or a
 * sleeping allocation).  A missed free is counted (miss_free, as zram does);
 * the slot is freed when it is next written or discarded.  Freeing shared
 * objects is deferred by the core to a work item.
 */
static void azswap_slot_free_notify(struct block_device *bdev,
				    unsigned long slot)
{
	struct azswap_dev *dev = bdev->bd_disk->private_data;

	atomic64_inc(&dev->notify_free);
	if (az_store_free_notify(dev->store, slot) == -EBUSY) {
		atomic64_inc(&dev->miss_free);
		return;
	}
	azswap_maybe_compact(dev);
}

/* Called with disk->open_mutex held. */
static int azswap_open(AZSWAP_OPEN_ARGS)
{
	struct azswap_dev *dev = AZSWAP_OPEN_DISK->private_data;

	return dev->claim ? -EBUSY : 0;
}

static const struct block_device_operations azswap_fops = {
	.owner = THIS_MODULE,
	.open = azswap_open,
	.submit_bio = azswap_submit_bio,
	.swap_slot_free_notify = azswap_slot_free_notify,
	azswap_fops_rw_page(azswap_rw_page)
};

/*
 * A swap-cache device (the swap_cache module parameter): bios only, so
 * that 6.1 does not mark it synchronous either (compat.h).
 */
static const struct block_device_operations azswap_fops_cached = {
	.owner = THIS_MODULE,
	.open = azswap_open,
	.submit_bio = azswap_submit_bio,
	.swap_slot_free_notify = azswap_slot_free_notify,
};

/*
 * Apply @p to @dev: to the store if initialised (the codec may change
 * live), else kept for disksize.  Caller holds init_lock for writing.
 * -EINVAL (az_policy_check) leaves everything as it was.
 */
int azswap_dev_set_policy(struct azswap_dev *dev, const struct az_policy *p)
{
	int ret = az_policy_check(p, NULL);

	if (ret)
		return ret;
	if (dev->store) {
		ret = az_store_set_policy(dev->store, p);
		if (ret)
			return ret;
		az_store_get_policy(dev->store, &dev->pol);
	} else {
		dev->pol = *p;
		if (p->codec == AZ_CODEC_LZ4 && !p->level)
			dev->pol.level = 3;
	}
	return 0;
}

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
	if (!ret)
		ret = az_store_set_sim_sample(s, dev->sim_sample);
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
	atomic64_set(&dev->miss_free, 0);
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

int azswap_dev_add(struct azswap_dev *dev, int id,
		   const struct attribute_group **groups)
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
	dev->sim_sample = AZ_SIM_SAMPLE_DEFAULT;

	/* Queue limits and features like zram's: see compat.h. */
	disk = azswap_alloc_disk(!azswap_swap_cache);
	if (IS_ERR(disk))
		return PTR_ERR(disk);
	disk->major = azswap_major;
	disk->first_minor = id;
	disk->minors = 1;
	disk->flags |= GENHD_FL_NO_PART;
	disk->fops = azswap_swap_cache ? &azswap_fops_cached : &azswap_fops;
	disk->private_data = dev;
	snprintf(disk->disk_name, DISK_NAME_LEN, "azswap%d", id);
	set_capacity(disk, 0);

	dev->disk = disk;
	ret = device_add_disk(NULL, disk, groups);
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
