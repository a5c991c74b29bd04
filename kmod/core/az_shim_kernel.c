// SPDX-License-Identifier: GPL-2.0
/*
 * Kernel implementation of the shim functions declared in
 * az_shim_common.h: zsmalloc pool, lz4 decoders and zstd library calls (not the
 * crypto API), deferral over an llist and the core's own workqueue.
 */
#include <linux/module.h>
#include <linux/zsmalloc.h>
#include <linux/lz4.h>
#include <linux/zstd.h>
#include <linux/kthread.h>
#include <linux/completion.h>
#include <linux/ktime.h>

#include "az_shim.h"
#include "azcore.h"

#ifdef CONFIG_DEBUG_LOCK_ALLOC
struct lockdep_map az_slot_lock_map =
	STATIC_LOCKDEP_MAP_INIT("az_slot_lock", &az_slot_lock_map);
#endif

/*
 * Deferred frees give memory back while swap is writing pages out, so
 * they run on a WQ_MEM_RECLAIM queue: its rescuer thread makes progress
 * when no new kworker can be created (system_wq has no rescuer).
 */
static struct workqueue_struct *az_wq;

/*
 * Object headers are 48 bytes: no kmalloc class is that size (kmalloc-64
 * would waste 16 bytes of each), so they get a cache.  The kernel may
 * merge it with another cache of that size; unmerged (slab_nomerge), it
 * reports any header a store leaked when it is destroyed at module exit.
 */
struct kmem_cache *az_obj_cache;

int az_core_init(void)
{
	az_obj_cache = kmem_cache_create("azswap_obj", az_obj_header_bytes(),
					 0, 0, NULL);
	if (!az_obj_cache)
		return -ENOMEM;
	az_wq = alloc_workqueue("azswap_free", WQ_MEM_RECLAIM | WQ_UNBOUND, 0);
	if (!az_wq) {
		kmem_cache_destroy(az_obj_cache);
		az_obj_cache = NULL;
		return -ENOMEM;
	}
	return 0;
}

void az_core_exit(void)
{
	destroy_workqueue(az_wq);
	az_wq = NULL;
	kmem_cache_destroy(az_obj_cache);
	az_obj_cache = NULL;
}

static void az_defer_work(struct work_struct *work)
{
	struct az_defer *d = container_of(to_delayed_work(work),
					  struct az_defer, work);

	d->fn(d->arg);
}

void az_defer_init(struct az_defer *d, void (*fn)(void *arg), void *arg)
{
	init_llist_head(&d->list);
	INIT_DELAYED_WORK(&d->work, az_defer_work);
	d->fn = fn;
	d->arg = arg;
}

void az_defer_add(struct az_defer *d, struct az_defer_node *n)
{
	if (llist_add(&n->node, &d->list))
		queue_delayed_work(az_wq, &d->work, AZ_DEFER_DELAY);
}

void az_defer_kick(struct az_defer *d)
{
	queue_delayed_work(az_wq, &d->work, AZ_DEFER_DELAY);
}

struct az_defer_node *az_defer_take(struct az_defer *d)
{
	struct llist_node *n = llist_del_all(&d->list);

	return n ? container_of(n, struct az_defer_node, node) : NULL;
}

void az_defer_sync(struct az_defer *d)
{
	flush_delayed_work(&d->work);
}

void az_defer_destroy(struct az_defer *d)
{
	cancel_delayed_work_sync(&d->work);
	WARN_ON_ONCE(!llist_empty(&d->list));
}

/* Pool: zsmalloc.  The struct is the zs_pool itself. */
struct az_pool *az_pool_create(const char *name)
{
	return (struct az_pool *)zs_create_pool(name);
}

void az_pool_destroy(struct az_pool *p)
{
	if (p)
		zs_destroy_pool((struct zs_pool *)p);
}

unsigned long az_pool_alloc(struct az_pool *p, size_t size, int gfp)
{
	unsigned long h;

	h = azswap_zs_malloc((struct zs_pool *)p, size,
			     az_gfp(gfp) | __GFP_HIGHMEM | __GFP_MOVABLE);
	return IS_ERR_VALUE(h) ? 0 : h;
}

void az_pool_free(struct az_pool *p, unsigned long handle)
{
	zs_free((struct zs_pool *)p, handle);
}

#ifdef AZSWAP_HAVE_ZS_OBJ_RW
void az_pool_write(struct az_pool *p, unsigned long handle, const void *src,
		   u32 len)
{
	zs_obj_write((struct zs_pool *)p, handle, (void *)src, len);
}

const void *az_pool_read_begin(struct az_pool *p, unsigned long handle,
			       u32 len, void *local)
{
	return zs_obj_read_begin((struct zs_pool *)p, handle, len, local);
}

void az_pool_read_end(struct az_pool *p, unsigned long handle, u32 len,
		      const void *mem)
{
	zs_obj_read_end((struct zs_pool *)p, handle, len, (void *)mem);
}
#else
/*
 * zs_map_object(): one mapping per CPU, preemption off until the unmap.
 * A write-only mapping of an object that spans two pages does not read
 * it first, so writes are whole objects, like zs_obj_write().  Copied a
 * word at a time: az_copy_words().
 */
void az_pool_write(struct az_pool *p, unsigned long handle, const void *src,
		   u32 len)
{
	u8 *dst = zs_map_object((struct zs_pool *)p, handle, ZS_MM_WO);

	az_copy_words(dst, src, len);
	zs_unmap_object((struct zs_pool *)p, handle);
}

const void *az_pool_read_begin(struct az_pool *p, unsigned long handle,
			       u32 len, void *local)
{
	return zs_map_object((struct zs_pool *)p, handle, ZS_MM_RO);
}

void az_pool_read_end(struct az_pool *p, unsigned long handle, u32 len,
		      const void *mem)
{
	zs_unmap_object((struct zs_pool *)p, handle);
}
#endif

u64 az_pool_bytes(struct az_pool *p)
{
	return (u64)zs_get_total_pages((struct zs_pool *)p) << PAGE_SHIFT;
}

u64 az_pool_compact(struct az_pool *p)
{
	return (u64)zs_compact((struct zs_pool *)p) << PAGE_SHIFT;
}

/* Codecs */
struct az_codec_ws {
	void *cws;		/* zstd compression workspace */
	void *dws;		/* zstd decompression workspace */
	zstd_cctx *cctx;
	zstd_dctx *dctx;
	size_t csize, dsize;
};

struct az_codec_ws *az_codec_ws_create(void)
{
	struct az_codec_ws *w;
	size_t b;
	int l;

	w = kzalloc(sizeof(*w), GFP_KERNEL);
	if (!w)
		return NULL;
	for (l = AZ_ZSTD_LEVEL_MIN; l <= AZ_ZSTD_LEVEL_MAX; l++) {
		zstd_parameters prm = zstd_get_params(l, AZ_PACK_MAX *
							 AZ_PAGE_SIZE);

		b = zstd_cctx_workspace_bound(&prm.cParams);
		w->csize = max(w->csize, b);
	}
	w->cws = kvmalloc(w->csize, GFP_KERNEL);
	if (!w->cws)
		goto fail;
	w->cctx = zstd_init_cctx(w->cws, w->csize);
	if (!w->cctx)
		goto fail;
	w->dsize = zstd_dctx_workspace_bound();
	w->dws = kvmalloc(w->dsize, GFP_KERNEL);
	if (!w->dws)
		goto fail;
	w->dctx = zstd_init_dctx(w->dws, w->dsize);
	if (!w->dctx)
		goto fail;
	return w;
fail:
	az_codec_ws_destroy(w);
	return NULL;
}

void az_codec_ws_destroy(struct az_codec_ws *w)
{
	if (!w)
		return;
	kvfree(w->dws);
	kvfree(w->cws);
	kfree(w);
}

size_t az_codec_ws_bytes(struct az_codec_ws *w)
{
	return w->csize + w->dsize;
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
	zstd_parameters prm = zstd_get_params(level, len);
	size_t r;

	r = zstd_compress_cctx(w->cctx, dst, cap, src, len, &prm);
	return zstd_is_error(r) ? 0 : (int)r;
}

int az_zstd_decompress(struct az_codec_ws *w, const void *src, int slen,
		       void *dst, int cap)
{
	size_t r = zstd_decompress_dctx(w->dctx, dst, cap, src, slen);

	return zstd_is_error(r) ? -1 : (int)r;
}

#ifdef AZSWAP_SELFTEST
/* Threads for the self-test's stress run (debug builds only). */
struct az_thread {
	struct completion done;
	int (*fn)(void *arg);
	void *arg;
	int ret;
};

static int az_thread_fn(void *data)
{
	struct az_thread *t = data;

	t->ret = t->fn(t->arg);
	/* The joiner may free @t once this returns. */
	complete(&t->done);
	return 0;
}

struct az_thread *az_thread_start(int (*fn)(void *arg), void *arg,
				  const char *name)
{
	struct az_thread *t = kzalloc(sizeof(*t), GFP_KERNEL);
	struct task_struct *task;

	if (!t)
		return NULL;
	init_completion(&t->done);
	t->fn = fn;
	t->arg = arg;
	task = kthread_run(az_thread_fn, t, "%s", name);
	if (IS_ERR(task)) {
		kfree(t);
		return NULL;
	}
	return t;
}

int az_thread_join(struct az_thread *t)
{
	int ret;

	wait_for_completion(&t->done);
	ret = t->ret;
	kfree(t);
	return ret;
}

u64 az_now_ms(void)
{
	return ktime_get_ns() / NSEC_PER_MSEC;
}
#endif /* AZSWAP_SELFTEST */
