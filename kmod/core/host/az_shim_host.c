// SPDX-License-Identifier: GPL-2.0
/*
 * Host implementation of the shim: malloc-backed pool with byte
 * accounting, liblz4, libzstd, libxxhash.  Never built into the module.
 */
#include <stdlib.h>
#include <sched.h>
#include <time.h>
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <lz4.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../az_shim.h"
#include "../azcore.h"

int az_host_mb_word;
static u64 az_host_sleeping;

u64 az_host_sleeping_allocs(void)
{
	return __atomic_load_n(&az_host_sleeping, AZ_SC);
}

static void az_host_count_gfp(int gfp)
{
	if (gfp == AZ_GFP_MAYSLEEP)
		__atomic_add_fetch(&az_host_sleeping, 1, AZ_SC);
}

static size_t az_host_fail_size;
static int az_host_fail_sized;

void az_host_fail_allocs_of(size_t size, int n)
{
	__atomic_store_n(&az_host_fail_size, size, AZ_SC);
	__atomic_store_n(&az_host_fail_sized, n, AZ_SC);
}

static bool az_host_fail_this(size_t size)
{
	return size == __atomic_load_n(&az_host_fail_size, AZ_SC) &&
	       __atomic_load_n(&az_host_fail_sized, AZ_SC) > 0 &&
	       __atomic_sub_fetch(&az_host_fail_sized, 1, AZ_SC) >= 0;
}

void *az_alloc(size_t size, int gfp)
{
	az_host_count_gfp(gfp);
	return az_host_fail_this(size) ? NULL : malloc(size);
}

void *az_zalloc(size_t size, int gfp)
{
	az_host_count_gfp(gfp);
	return az_host_fail_this(size) ? NULL : calloc(1, size);
}

void az_free(const void *p)
{
	free((void *)p);
}

/* The kernel's cache is exact: so is malloc of the header's size here. */
void *az_obj_zalloc(int gfp)
{
	return az_zalloc(az_obj_header_bytes(), gfp);
}

void az_obj_free(void *p)
{
	free(p);
}

/* The kernel's kvzalloc refuses (and WARNs) above INT_MAX: so does this. */
void *az_valloc(size_t size)
{
	if (AZ_WARN_ON(size > 0x7fffffff) || az_host_fail_this(size))
		return NULL;
	return calloc(1, size);
}

void *az_valloc_big(size_t size)
{
	return calloc(1, size);
}

void az_vfree(const void *p)
{
	free((void *)p);
}

/*
 * Slot bit locks.  The kernel takes the bit with an atomic RMW while the
 * holder rewrites the rest of the word with plain stores (zram's way: the
 * RMW never loses them).  A thread sanitizer calls that a race, so here a
 * striped lock (acquire on take, release on drop) is held for the whole
 * critical section and orders every access to the word; the bit is set
 * and cleared under it as in the kernel.  A thread may hold its stripe
 * for several words (a test holding one slot while the core takes
 * another on the same stripe), so the stripe is recursive per thread.
 * Words of two threads sharing a stripe only contend: a trylock may then
 * fail for the neighbour's sake, as it may for a reader holding the slot.
 */
#define AZ_BIT_STRIPES	4096

struct az_bit_stripe {
	int lock;
	int depth;		/* words this stripe's owner holds */
	const void *owner;	/* the holding thread (&az_bit_me), or NULL */
};

static struct az_bit_stripe az_bit_stripes[AZ_BIT_STRIPES];
static __thread char az_bit_me;

static struct az_bit_stripe *az_bit_stripe_of(const unsigned long *word)
{
	uintptr_t a = (uintptr_t)word / sizeof(struct { long f, v; });

	return &az_bit_stripes[(a ^ (a >> 12)) % AZ_BIT_STRIPES];
}

bool az_bit_trylock(int bit, unsigned long *word)
{
	struct az_bit_stripe *st = az_bit_stripe_of(word);
	unsigned long m = 1UL << bit;
	int z = 0;

	if (__atomic_load_n(&st->owner, __ATOMIC_RELAXED) != &az_bit_me) {
		if (!__atomic_compare_exchange_n(&st->lock, &z, 1, false,
						 __ATOMIC_ACQUIRE,
						 __ATOMIC_RELAXED))
			return false;
		__atomic_store_n(&st->owner, &az_bit_me, __ATOMIC_RELAXED);
	} else if (*word & m) {
		return false;	/* this thread holds this very word */
	}
	st->depth++;
	*word |= m;
	return true;
}

void az_bit_lock(int bit, unsigned long *word)
{
	while (!az_bit_trylock(bit, word))
		sched_yield();
}

void az_bit_unlock(int bit, unsigned long *word)
{
	struct az_bit_stripe *st = az_bit_stripe_of(word);

	*word &= ~(1UL << bit);
	if (--st->depth)
		return;
	__atomic_store_n(&st->owner, NULL, __ATOMIC_RELAXED);
	__atomic_store_n(&st->lock, 0, __ATOMIC_RELEASE);
}

u64 az_xxh64(const void *buf, size_t len, u64 seed)
{
	return XXH64(buf, len, seed);
}

bool az_warn_on(bool c, const char *file, int line)
{
	if (c)
		fprintf(stderr, "azswap: WARNING at %s:%d\n", file, line);
	return c;
}

void az_defer_init(struct az_defer *d, void (*fn)(void *arg), void *arg)
{
	d->head = NULL;
	d->fn = fn;
	d->arg = arg;
}

void az_defer_add(struct az_defer *d, struct az_defer_node *n)
{
	struct az_defer_node *h = __atomic_load_n(&d->head, __ATOMIC_RELAXED);

	do {
		n->next = h;
	} while (!__atomic_compare_exchange_n(&d->head, &h, n, true,
					      __ATOMIC_RELEASE,
					      __ATOMIC_RELAXED));
}

struct az_defer_node *az_defer_take(struct az_defer *d)
{
	return __atomic_exchange_n(&d->head, NULL, __ATOMIC_ACQUIRE);
}

void az_defer_sync(struct az_defer *d)
{
	(void)d;
}

void az_defer_destroy(struct az_defer *d)
{
	if (__atomic_load_n(&d->head, AZ_SC))
		fprintf(stderr, "azswap: deferral destroyed with work queued\n");
}

/*
 * Pool: each object is its own malloc block so that ASan catches any
 * access past its end.  A thread-local flag enforces zsmalloc's one
 * mapping per CPU rule: nested mappings abort().
 */
struct az_pool {
	az_atomic64_t bytes;
	az_atomic64_t objs;
};

static __thread int az_pool_mapped;
int az_host_fail_allocs;

void az_host_fail_pool_allocs(int n)
{
	__atomic_store_n(&az_host_fail_allocs, n, AZ_SC);
}

struct az_pool *az_pool_create(const char *name)
{
	(void)name;
	return calloc(1, sizeof(struct az_pool));
}

void az_pool_destroy(struct az_pool *p)
{
	if (p && az_atomic64_read(&p->objs))
		fprintf(stderr, "azswap: pool destroyed with %llu objects\n",
			(unsigned long long)az_atomic64_read(&p->objs));
	free(p);
}

/* Size is kept in a header word before the object. */
unsigned long az_pool_alloc(struct az_pool *p, size_t size, int gfp)
{
	size_t *b;

	az_host_count_gfp(gfp);
	if (size == 0 || size > AZ_PAGE_SIZE)
		return 0;
	if (az_host_fail_allocs > 0 &&
	    __atomic_sub_fetch(&az_host_fail_allocs, 1, AZ_SC) >= 0)
		return 0;
#ifdef AZ_PLANT_OOB
	/* Deliberate off-by-one for tests/core/test_asan.py. */
	b = malloc(sizeof(size_t) + size - 1);
#else
	b = malloc(sizeof(size_t) + size);
#endif
	if (!b)
		return 0;
	b[0] = size;
	az_atomic64_add(size, &p->bytes);
	az_atomic64_inc(&p->objs);
	return (unsigned long)(b + 1);
}

void az_pool_free(struct az_pool *p, unsigned long handle)
{
	size_t *b = (size_t *)handle - 1;

	az_atomic64_sub(b[0], &p->bytes);
	az_atomic64_dec(&p->objs);
	free(b);
}

/* One access at a time per thread, as zsmalloc allows one per CPU. */
void az_pool_write(struct az_pool *p, unsigned long handle, const void *src,
		   u32 len)
{
	(void)p;
	if (az_pool_mapped)
		abort();
	memcpy((void *)handle, src, len);
}

const void *az_pool_read_begin(struct az_pool *p, unsigned long handle,
			       u32 len, void *local)
{
	(void)p;
	(void)len;
	(void)local;
	if (az_pool_mapped++)
		abort();
	return (const void *)handle;
}

void az_pool_read_end(struct az_pool *p, unsigned long handle, u32 len,
		      const void *mem)
{
	(void)p;
	(void)len;
	if (mem != (const void *)handle || --az_pool_mapped)
		abort();
}

u64 az_pool_bytes(struct az_pool *p)
{
	return az_atomic64_read(&p->bytes);
}

/* One malloc block per object: nothing to move. */
u64 az_pool_compact(struct az_pool *p)
{
	return 0;
}

/* Codecs */
struct az_codec_ws {
	ZSTD_CCtx *cctx;
	ZSTD_DCtx *dctx;
};

struct az_codec_ws *az_codec_ws_create(void)
{
	struct az_codec_ws *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->cctx = ZSTD_createCCtx();
	w->dctx = ZSTD_createDCtx();
	if (!w->cctx || !w->dctx) {
		az_codec_ws_destroy(w);
		return NULL;
	}
	return w;
}

void az_codec_ws_destroy(struct az_codec_ws *w)
{
	if (!w)
		return;
	ZSTD_freeCCtx(w->cctx);
	ZSTD_freeDCtx(w->dctx);
	free(w);
}

size_t az_codec_ws_bytes(struct az_codec_ws *w)
{
	return ZSTD_sizeof_CCtx(w->cctx) + ZSTD_sizeof_DCtx(w->dctx);
}

static u64 az_host_codec[3];

void az_host_codec_calls(u64 out[3])
{
	int i;

	for (i = 0; i < 3; i++)
		out[i] = __atomic_load_n(&az_host_codec[i], AZ_SC);
}

void az_codec_count(unsigned int which)
{
	if (!AZ_WARN_ON(which >= 3))
		__atomic_add_fetch(&az_host_codec[which], 1, __ATOMIC_RELAXED);
}

int az_lz4_decompress(const void *src, int slen, void *dst, int cap)
{
	return LZ4_decompress_safe(src, dst, slen, cap);
}

int az_lz4_decompress_dict(const void *src, int slen, void *dst, int cap,
			   const void *dict, int dlen)
{
	return LZ4_decompress_safe_usingDict(src, dst, slen, cap, dict, dlen);
}

int az_zstd_compress(struct az_codec_ws *w, int level, const void *src,
		     int len, void *dst, int cap)
{
	/* One-shot: parameters are selected for srcSize == @len. */
	size_t r;

	az_codec_count(AZ_CODEC_COUNT_ZSTD);
	r = ZSTD_compressCCtx(w->cctx, dst, cap, src, len, level);

	return ZSTD_isError(r) ? 0 : (int)r;
}

int az_zstd_decompress(struct az_codec_ws *w, const void *src, int slen,
		       void *dst, int cap)
{
	size_t r = ZSTD_decompressDCtx(w->dctx, dst, cap, src, slen);

	return ZSTD_isError(r) ? -1 : (int)r;
}

struct az_thread {
	pthread_t th;
	int (*fn)(void *arg);
	void *arg;
	int ret;
};

static void *az_thread_fn(void *data)
{
	struct az_thread *t = data;

	t->ret = t->fn(t->arg);
	return NULL;
}

struct az_thread *az_thread_start(int (*fn)(void *arg), void *arg,
				  const char *name)
{
	struct az_thread *t = calloc(1, sizeof(*t));

	(void)name;
	if (!t)
		return NULL;
	t->fn = fn;
	t->arg = arg;
	if (pthread_create(&t->th, NULL, az_thread_fn, t)) {
		free(t);
		return NULL;
	}
	return t;
}

int az_thread_join(struct az_thread *t)
{
	int ret;

	pthread_join(t->th, NULL);
	ret = t->ret;
	free(t);
	return ret;
}

u64 az_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (u64)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * The kernel creates the object cache and the deferred-free workqueue
 * here; the host has neither.
 */
int az_core_init(void)
{
	return 0;
}

void az_core_exit(void)
{
}
