/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Kernel side of the store core's environment shim (see az_shim.h).
 * Everything here is a thin inline over a kernel facility; the codec and
 * pool wrappers that need more than one call live in az_shim_kernel.c.
 */
#ifndef AZ_SHIM_KERNEL_H
#define AZ_SHIM_KERNEL_H

#include <linux/types.h>
#include <linux/kernel.h>
#include <linux/errno.h>
#include <linux/err.h>
#include <linux/string.h>
#include <linux/slab.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/spinlock.h>
#include <linux/bit_spinlock.h>
#include <linux/atomic.h>
#include <linux/llist.h>
#include <linux/refcount.h>
#include <linux/wait.h>
#include <linux/lockdep.h>
#include <linux/vmalloc.h>
#include <linux/workqueue.h>
#include <linux/xxhash.h>
#include <linux/printk.h>
#include <linux/log2.h>
#include "../compat.h"	/* get/put_unaligned */

/* Slot flags pack a size and a hash check above bit 32 (az_internal.h). */
#if BITS_PER_LONG != 64
#error "azswap's store core needs a 64-bit kernel"
#endif

#define AZ_GFP_NOWAIT	0
#define AZ_GFP_MAYSLEEP	1
/* No wait, and never from the reserves reclaim needs: a cache's memory. */
#define AZ_GFP_OPTIONAL	2

struct az_store;
/* A host test hook (az_shim_host.h); nothing in the module. */
static inline void az_pack_race_point(struct az_store *s)
{
}

static inline gfp_t az_gfp(int gfp)
{
	if (gfp == AZ_GFP_MAYSLEEP)
		return GFP_NOIO | __GFP_NOWARN;
	if (gfp == AZ_GFP_OPTIONAL)
		return GFP_NOWAIT | __GFP_NOWARN | __GFP_NOMEMALLOC;
	return GFP_NOWAIT | __GFP_NOWARN;
}

static inline void *az_alloc(size_t size, int gfp)
{
	return kmalloc(size, az_gfp(gfp));
}

static inline void *az_zalloc(size_t size, int gfp)
{
	return kzalloc(size, az_gfp(gfp));
}

static inline void az_free(const void *p)
{
	kfree(p);
}

/* Object headers (struct az_obj): a slab cache of their own size. */
extern struct kmem_cache *az_obj_cache;

static inline void *az_obj_zalloc(int gfp)
{
	return kmem_cache_zalloc(az_obj_cache, az_gfp(gfp));
}

static inline void az_obj_free(void *p)
{
	if (p)
		kmem_cache_free(az_obj_cache, p);
}

/* Compressions are counted on the host only (az_host_codec_calls()). */
static inline void az_codec_count(unsigned int which)
{
}

/*
 * Big tables and workspaces, process context only.  kvzalloc refuses
 * (with a WARN) anything above INT_MAX; az_valloc_big has no such limit
 * (vmalloc only) and is what a table sized by the disk uses.
 */
static inline void *az_valloc(size_t size)
{
	return kvzalloc(size, GFP_KERNEL);
}

/*
 * A table the store can do without for now (process context): no I/O in
 * reclaim, so the deferred-free worker never waits on swap (the device it
 * serves), and it fails rather than loop or invoke the OOM killer.
 */
static inline void *az_valloc_try(size_t size)
{
	unsigned int noio = memalloc_noio_save();
	void *p = kvzalloc(size, GFP_KERNEL | __GFP_RETRY_MAYFAIL |
			   __GFP_NOWARN);

	memalloc_noio_restore(noio);
	return p;
}

static inline void *az_valloc_big(size_t size)
{
	return vzalloc(size);
}

static inline void az_vfree(const void *p)
{
	kvfree(p);
}

#define az_get_le64(p)		get_unaligned_le64(p)
#define az_put_le64(v, p)	put_unaligned_le64(v, p)
#define az_likely(x)	likely(x)
#define az_unlikely(x)	unlikely(x)
#define az_min(a, b)	min(a, b)
#define az_max(a, b)	max(a, b)

/* Locks */
#define az_spinlock_t spinlock_t
#define az_spin_init(l)		spin_lock_init(l)
#define az_spin_lock(l)		spin_lock(l)
#define az_spin_unlock(l)	spin_unlock(l)
#define az_spin_destroy(l)	do { } while (0)
#define az_cond_resched()	cond_resched()

/*
 * The slot bit lock.  Lockdep does not see bit spinlocks: under
 * CONFIG_DEBUG_LOCK_ALLOC every slot lock is one lockdep class
 * ("az_slot_lock"), acquired before the bit is taken, so lockdep checks
 * its order against the core's spinlocks and the pool.  No path holds
 * two slot locks at once.
 */
#ifdef CONFIG_DEBUG_LOCK_ALLOC
extern struct lockdep_map az_slot_lock_map;
#define az_slot_lockdep_acquire()	lock_map_acquire(&az_slot_lock_map)
#define az_slot_lockdep_try()		lock_map_acquire_try(&az_slot_lock_map)
#define az_slot_lockdep_release()	lock_map_release(&az_slot_lock_map)
#else
#define az_slot_lockdep_acquire()	do { } while (0)
#define az_slot_lockdep_try()		do { } while (0)
#define az_slot_lockdep_release()	do { } while (0)
#endif

static inline void az_bit_lock(int bit, unsigned long *word)
{
	az_slot_lockdep_acquire();
	bit_spin_lock(bit, word);
}

/* Never spins: false when the lock is held. */
static inline bool az_bit_trylock(int bit, unsigned long *word)
{
	if (!bit_spin_trylock(bit, word))
		return false;
	az_slot_lockdep_try();
	return true;
}

static inline void az_bit_unlock(int bit, unsigned long *word)
{
	az_slot_lockdep_release();
	bit_spin_unlock(bit, word);
}

/* Wait for a condition another context makes true (process context). */
#define az_wait_t			wait_queue_head_t
#define az_wait_init(wq)		init_waitqueue_head(wq)
#define az_wait_event(wq, cond)		wait_event(*(wq), cond)
/* After the condition became true; cheap when nobody waits. */
static inline void az_wake_up(az_wait_t *wq)
{
	if (wq_has_sleeper(wq))
		wake_up_all(wq);
}

/* Barriers for the core's lockless owner lookup (registry.c explains) */
#define az_smp_mb()			smp_mb() /* see registry.c */
#define az_load_acquire(p)		smp_load_acquire(p) /* registry.c */
#define az_store_release(p, v)		smp_store_release(p, v) /* idem */

/* Atomics */
#define az_atomic_t atomic_t
#define az_atomic64_t atomic64_t
#define az_atomic_read(a)		atomic_read(a)
#define az_atomic_set(a, v)		atomic_set(a, v)
#define az_atomic_inc(a)		atomic_inc(a)
#define az_atomic_dec(a)		atomic_dec(a)
#define az_atomic_dec_and_test(a)	atomic_dec_and_test(a)
#define az_atomic_inc_not_zero(a)	atomic_inc_not_zero(a)
#define az_atomic_or(v, a)		atomic_or(v, a)
#define az_atomic_fetch_or(v, a)	((u32)atomic_fetch_or(v, a))
#define az_atomic_andnot(v, a)		atomic_andnot(v, a)
#define az_hweight64(v)			hweight64(v)
/* Object references: refcount_t (saturates and warns on misuse). */
#define az_ref_t			refcount_t
#define az_ref_set(r, v)		refcount_set(r, v)
#define az_ref_read(r)			refcount_read(r)
#define az_ref_inc(r)			refcount_inc(r)
#define az_ref_inc_not_zero(r)		refcount_inc_not_zero(r)
#define az_ref_dec_and_test(r)		refcount_dec_and_test(r)
#define az_atomic64_read(a)		((u64)atomic64_read(a))
#define az_atomic64_set(a, v)		atomic64_set(a, v)
#define az_atomic64_inc(a)		atomic64_inc(a)
#define az_atomic64_inc_return(a)	((u64)atomic64_inc_return(a))
#define az_atomic64_dec(a)		atomic64_dec(a)
#define az_atomic64_add(v, a)		atomic64_add(v, a)
#define az_atomic64_sub(v, a)		atomic64_sub(v, a)
#define az_set_bit(nr, w)		set_bit(nr, w)
#define az_test_bit(nr, w)		test_bit(nr, w)
#define AZ_READ_ONCE(x)			READ_ONCE(x)
#define AZ_WRITE_ONCE(x, v)		WRITE_ONCE(x, v)
#define az_test_and_set_bit(nr, w)	test_and_set_bit(nr, w)
#define az_clear_bit_unlock(nr, w)	clear_bit_unlock(nr, w)

/* Hashing */
static inline u64 az_xxh64(const void *buf, size_t len, u64 seed)
{
	return xxh64(buf, len, seed);
}

/*
 * Deferral: an llist drained by a work item that runs AZ_DEFER_DELAY
 * after the first node of a batch.  A restore frees an object on every
 * swap-in; queued at once, the work ran every few dozen pages (the live
 * microVM restore of 49,000 pages: 2,300 context switches, 900-1,000
 * with the delay).
 */
#define AZ_DEFER_DELAY	msecs_to_jiffies(10)

struct az_defer_node {
	struct llist_node node;
};

struct az_defer {
	struct llist_head list;
	struct delayed_work work;
	void (*fn)(void *arg);
	void *arg;
};

void az_defer_init(struct az_defer *d, void (*fn)(void *arg), void *arg);
/* Atomic context safe. */
void az_defer_add(struct az_defer *d, struct az_defer_node *n);
/* Returns the whole list (newest first), NULL when empty. */
struct az_defer_node *az_defer_take(struct az_defer *d);

static inline struct az_defer_node *az_defer_next(struct az_defer_node *n)
{
	struct llist_node *next = n->node.next;

	return next ? container_of(next, struct az_defer_node, node) : NULL;
}

/* Have the worker run soon, with or without nodes.  Atomic context safe. */
void az_defer_kick(struct az_defer *d);
/* Run a pending worker now and wait for it; process context. */
void az_defer_sync(struct az_defer *d);
/* Cancel and wait for the worker before the deferral goes away. */
void az_defer_destroy(struct az_defer *d);

#define az_err(fmt, ...)	pr_err("azswap: " fmt, ##__VA_ARGS__)
#define az_warn(fmt, ...)	pr_warn("azswap: " fmt, ##__VA_ARGS__)
#define az_info(fmt, ...)	pr_info("azswap: " fmt, ##__VA_ARGS__)
#define AZ_WARN_ON(c)		WARN_ON_ONCE(c)

/* Declarations shared with the host shim. */
#include "az_shim_common.h"

#endif /* AZ_SHIM_KERNEL_H */
