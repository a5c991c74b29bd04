/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Host side of the store core's environment shim (see az_shim.h): libc,
 * GCC __atomic builtins, pthread spinlocks, liblz4/libzstd/libxxhash.
 * Used for build/libazcore.so (tests, fuzzing, trace replay).
 */
#ifndef AZ_SHIM_HOST_H
#define AZ_SHIM_HOST_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include <string.h>
#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <sched.h>

#define u8 uint8_t
#define u16 uint16_t
#define u32 uint32_t
#define u64 uint64_t
#define s64 int64_t

#define AZ_GFP_NOWAIT	0
#define AZ_GFP_MAYSLEEP	1
#define AZ_GFP_OPTIONAL	2	/* the kernel's no-wait, no-reserves */

void *az_alloc(size_t size, int gfp);
void *az_zalloc(size_t size, int gfp);
void az_free(const void *p);
/* Object headers (the kernel: a slab cache of their own). */
void *az_obj_zalloc(int gfp);
void az_obj_free(void *p);
/* kvzalloc semantics: above INT_MAX warns and fails (see the kernel shim). */
void *az_valloc(size_t size);
void *az_valloc_big(size_t size);
/* A table the store can do without for now (kernel: no I/O in reclaim). */
#define az_valloc_try(size)	az_valloc(size)
void az_vfree(const void *p);

#define az_likely(x)	__builtin_expect(!!(x), 1)
#define az_unlikely(x)	__builtin_expect(!!(x), 0)
static inline u64 az_get_le64(const void *p)
{
	u64 v;

	memcpy(&v, p, sizeof(v));
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	v = __builtin_bswap64(v);
#endif
	return v;
}

static inline void az_put_le64(u64 v, void *p)
{
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	v = __builtin_bswap64(v);
#endif
	memcpy(p, &v, sizeof(v));
}
#define az_min(a, b)	((a) < (b) ? (a) : (b))
#define az_max(a, b)	((a) > (b) ? (a) : (b))

#ifndef container_of
#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))
#endif
#ifndef ARRAY_SIZE
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#endif

/* Locks.  @taken counts acquisitions (tests check hot paths avoid a lock). */
struct az_host_spinlock {
	pthread_spinlock_t l;
	uint64_t taken;
};
#define az_spinlock_t struct az_host_spinlock
#define az_spin_init(x)		pthread_spin_init(&(x)->l, PTHREAD_PROCESS_PRIVATE)
#define az_spin_lock(x) \
	do { pthread_spin_lock(&(x)->l); (x)->taken++; } while (0)
#define az_spin_unlock(x)	pthread_spin_unlock(&(x)->l)
#define az_spin_destroy(x)	pthread_spin_destroy(&(x)->l)
void az_bit_lock(int bit, unsigned long *word);
bool az_bit_trylock(int bit, unsigned long *word);
void az_bit_unlock(int bit, unsigned long *word);
#define az_cond_resched()	do { } while (0)

/* No genl_mutex or reclaim on the host: waiting is yielding. */
struct az_host_wait {
	int unused;
};
#define az_wait_t struct az_host_wait
#define az_wait_init(wq)	((void)(wq))
#define az_wait_event(wq, cond) \
	do { while (!(cond)) sched_yield(); } while (0)
#define az_wake_up(wq)		((void)(wq))
/* A locked RMW: a full barrier on x86, and one TSan understands. */
extern int az_host_mb_word;
#define az_smp_mb()		((void)__atomic_fetch_or(&az_host_mb_word, 0, AZ_SC))
#define az_load_acquire(p)	__atomic_load_n(p, AZ_SC)
#define az_store_release(p, v)	__atomic_store_n(p, v, __ATOMIC_RELEASE)

/* Atomics (sequentially consistent, like the kernel's value-returning ops) */
struct az_atomic { int v; };
struct az_atomic64 { int64_t v; };
#define az_atomic_t struct az_atomic
#define az_atomic64_t struct az_atomic64
#define AZ_SC __ATOMIC_SEQ_CST
#define az_atomic_read(a)	__atomic_load_n(&(a)->v, AZ_SC)
#define az_atomic_set(a, x)	__atomic_store_n(&(a)->v, (x), AZ_SC)
#define az_atomic_inc(a)	((void)__atomic_add_fetch(&(a)->v, 1, AZ_SC))
#define az_atomic_dec(a)	((void)__atomic_sub_fetch(&(a)->v, 1, AZ_SC))
#define az_atomic_dec_and_test(a) (__atomic_sub_fetch(&(a)->v, 1, AZ_SC) == 0)
#define az_atomic_or(x, a)	((void)__atomic_fetch_or(&(a)->v, (int)(x), AZ_SC))
#define az_atomic_fetch_or(x, a) \
	((u32)__atomic_fetch_or(&(a)->v, (int)(x), AZ_SC))
#define az_hweight64(v)		((unsigned int)__builtin_popcountll(v))
#define az_atomic_andnot(x, a) \
	((void)__atomic_fetch_and(&(a)->v, ~(int)(x), AZ_SC))
static inline bool az_atomic_inc_not_zero(az_atomic_t *a)
{
	int c = __atomic_load_n(&a->v, AZ_SC);

	while (c) {
		if (__atomic_compare_exchange_n(&a->v, &c, c + 1, false,
						AZ_SC, AZ_SC))
			return true;
	}
	return false;
}
#define az_ref_t		az_atomic_t
#define az_ref_set(r, x)	az_atomic_set(r, x)
#define az_ref_read(r)		az_atomic_read(r)
#define az_ref_inc(r)		az_atomic_inc(r)
#define az_ref_inc_not_zero(r)	az_atomic_inc_not_zero(r)
#define az_ref_dec_and_test(r)	az_atomic_dec_and_test(r)
#define az_atomic64_read(a)	((u64)__atomic_load_n(&(a)->v, AZ_SC))
#define az_atomic64_set(a, x)	__atomic_store_n(&(a)->v, (x), AZ_SC)
#define az_atomic64_inc(a)	((void)__atomic_add_fetch(&(a)->v, 1, AZ_SC))
#define az_atomic64_inc_return(a) ((u64)__atomic_add_fetch(&(a)->v, 1, AZ_SC))
#define az_atomic64_dec(a)	((void)__atomic_sub_fetch(&(a)->v, 1, AZ_SC))
#define az_atomic64_add(x, a)	((void)__atomic_add_fetch(&(a)->v, (x), AZ_SC))
#define az_atomic64_sub(x, a)	((void)__atomic_sub_fetch(&(a)->v, (x), AZ_SC))
#define az_set_bit(nr, w) ((void)__atomic_fetch_or((w), 1UL << (nr), AZ_SC))
#define az_test_bit(nr, w) \
	(!!(__atomic_load_n((w), __ATOMIC_RELAXED) & (1UL << (nr))))
#define AZ_READ_ONCE(x)		__atomic_load_n(&(x), __ATOMIC_RELAXED)
#define AZ_WRITE_ONCE(x, v)	__atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define az_clear_bit_unlock(nr, w) \
	((void)__atomic_fetch_and((w), ~(1UL << (nr)), __ATOMIC_RELEASE))
#define az_test_and_set_bit(nr, w) \
	(!!(__atomic_fetch_or((w), 1UL << (nr), AZ_SC) & (1UL << (nr))))

u64 az_xxh64(const void *buf, size_t len, u64 seed);

/*
 * Deferral: a lock-free LIFO list.  There is no worker thread on the
 * host: az_store_drain() runs the deferred work.
 */
struct az_defer_node {
	struct az_defer_node *next;
};

struct az_defer {
	struct az_defer_node *head;
	void (*fn)(void *arg);
	void *arg;
};

void az_defer_init(struct az_defer *d, void (*fn)(void *arg), void *arg);
void az_defer_add(struct az_defer *d, struct az_defer_node *n);
struct az_defer_node *az_defer_take(struct az_defer *d);
static inline struct az_defer_node *az_defer_next(struct az_defer_node *n)
{
	return n->next;
}

/* No worker to wake: the host's callers run the work (az_store_drain()). */
static inline void az_defer_kick(struct az_defer *d)
{
	(void)d;
}

void az_defer_sync(struct az_defer *d);
void az_defer_destroy(struct az_defer *d);

#define az_err(fmt, ...)	fprintf(stderr, "azswap: " fmt, ##__VA_ARGS__)
#define az_warn(fmt, ...)	fprintf(stderr, "azswap: " fmt, ##__VA_ARGS__)
#define az_info(fmt, ...)	do { } while (0)
#define AZ_WARN_ON(c)		az_warn_on(!!(c), __FILE__, __LINE__)
bool az_warn_on(bool c, const char *file, int line);

/* Test hook: make the next @n pool allocations fail. */
void az_host_fail_pool_allocs(int n);
/* Test hook: make the next @n az_alloc/az_zalloc calls of @size bytes fail. */
void az_host_fail_allocs_of(size_t size, int n);
/* Test hook: allocations made with AZ_GFP_MAYSLEEP so far (pool and slab). */
u64 az_host_sleeping_allocs(void);
/*
 * Test hook: compressions so far, process-wide: @out[0] lz4, @out[1] lz4
 * with a dictionary, @out[2] zstd.
 */
void az_host_codec_calls(u64 out[3]);
/* Count one compression (@which: the index in az_host_codec_calls()). */
void az_codec_count(unsigned int which);
struct az_store;
/*
 * Test hook: a pack is written and none of its slots switched yet (what a
 * concurrent put may do there: az_store_debug_pack_race()).
 */
void az_pack_race_point(struct az_store *s);

#include "az_shim_common.h"

#endif /* AZ_SHIM_HOST_H */
