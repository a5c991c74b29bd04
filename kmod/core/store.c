// SPDX-License-Identifier: GPL-2.0
/*
 * The slot table and the store/load/free paths.
 *
 * A slot holds nothing, a repeated word (SAME) or a reference to an
 * object.  Objects are refcounted: a slot, a delta using the object as
 * base and a template index entry each hold one reference.  An object
 * whose last reference goes away in az_store_free (atomic context) is
 * freed on the spot when nothing else can see it, or handed to the
 * deferred free (az_defer) when it was linked in an index (that put
 * unlinks it first), holds a base or is a pack.
 *
 * A put builds the new representation completely (objects allocated and
 * written, template node ready) before it touches the slot, and then swaps
 * it in: a put that fails leaves the slot as it was.
 */
#include "az_internal.h"

static const char * const az_kind_names[AZ_NR_KINDS] = {
	"same", "dup", "tdelta", "xdelta", "plain", "raw",
};

const char *az_kind_name(enum az_kind k)
{
	return (unsigned int)k < AZ_NR_KINDS ? az_kind_names[k] : "?";
}

/* ---- contexts --------------------------------------------------------- */

struct az_ctx *az_ctx_create(void)
{
	struct az_ctx *ctx = az_valloc(sizeof(*ctx));

	if (!ctx)
		return NULL;
	ctx->ws = az_codec_ws_create();
	ctx->lz4c.table = az_valloc(AZ_LZ4C_TABLE_BYTES);
	ctx->obuf = az_valloc(AZ_OBUF_SIZE);
	ctx->tbuf = az_valloc(AZ_OBUF_SIZE);
	ctx->pbuf = az_valloc(AZ_PAGE_SIZE);
	ctx->xbuf = az_valloc(AZ_PAGE_SIZE);
	ctx->sbuf = az_valloc(AZ_PAGE_SIZE);
	ctx->gbuf = az_valloc(AZ_PAGE_SIZE);
	ctx->kbuf = az_valloc(AZ_PACK_MAX * AZ_PAGE_SIZE);
	if (!ctx->ws || !ctx->lz4c.table || !ctx->obuf || !ctx->tbuf || !ctx->pbuf || !ctx->xbuf ||
	    !ctx->sbuf || !ctx->gbuf || !ctx->kbuf) {
		az_ctx_destroy(ctx);
		return NULL;
	}
	az_lz4c_init(&ctx->lz4c);
	return ctx;
}

void az_ctx_destroy(struct az_ctx *ctx)
{
	if (!ctx)
		return;
	az_vfree(ctx->kbuf);
	az_vfree(ctx->gbuf);
	az_vfree(ctx->sbuf);
	az_vfree(ctx->xbuf);
	az_vfree(ctx->pbuf);
	az_vfree(ctx->tbuf);
	az_vfree(ctx->obuf);
	az_vfree(ctx->lz4c.table);
	az_codec_ws_destroy(ctx->ws);
	az_vfree(ctx);
}

/* ---- same-filled pages ------------------------------------------------ */

bool az_page_same(const void *page, u64 *word)
{
	const u64 *w = page;
	u64 v = w[0];
	unsigned int i;

	/* Check the last word first: most pages differ early or late. */
	if (w[AZ_PAGE_SIZE / sizeof(u64) - 1] != v)
		return false;
	for (i = 1; i < AZ_PAGE_SIZE / sizeof(u64) - 1; i++)
		if (w[i] != v)
			return false;
	*word = v;
	return true;
}

static void az_fill_page(void *page, u64 v)
{
	u64 *w = page;
	unsigned int i;

	if (!v) {
		memset(page, 0, AZ_PAGE_SIZE);
		return;
	}
	for (i = 0; i < AZ_PAGE_SIZE / sizeof(u64); i++)
		w[i] = v;
}

/* ---- objects ---------------------------------------------------------- */

/* The pool allocations an object of @size bytes takes (@tail 0: one). */
static void az_obj_parts(u32 size, u32 *head, u32 *tail)
{
	if (az_obj_split(size)) {
		*head = AZ_SPLIT_HEAD;
		*tail = size - AZ_SPLIT_DATA;
	} else {
		*head = size;
		*tail = 0;
	}
}

/* ---- allocation (two-phase, see azcore.h) ----------------------------- */

/* A no-wait allocation failed: ask for a reserve, unless it was filled. */
static inline int az_short(const struct az_reserve *res)
{
	return res->filled ? -ENOMEM : -EAGAIN;
}

static bool az_over_limit_by(struct az_store *s, u64 slack)
{
	u64 limit = AZ_READ_ONCE(s->mem_limit);

	return limit && az_pool_bytes(s->pool) > limit + slack;
}

static bool az_over_limit(struct az_store *s)
{
	return az_over_limit_by(s, 0);
}

/*
 * How far packs may take the pool past mem_limit: the pages they replace
 * free their pool bytes only when the deferred free and compaction ran.
 */
#define AZ_PACK_SLACK	(64 * AZ_PAGE_SIZE)

/*
 * A pool handle of @size bytes: the reserve's, else a no-wait allocation.
 * 0 with *@err = -EAGAIN / -ENOMEM (no memory) or -ENOMEM (mem_limit,
 * unless @nolimit: a pack replaces more bytes than it takes).
 */
static unsigned long az_pool_get(struct az_store *s, struct az_reserve *res,
				 u32 size, int *err, bool nolimit)
{
	unsigned long h;
	int i;

	for (i = 0; i < 2; i++) {
		if (res->h[i] && res->hsize[i] == size) {
			h = res->h[i];
			res->h[i] = 0;
			return h;
		}
	}
	h = az_pool_alloc(s->pool, size, AZ_GFP_NOWAIT);
	if (!h) {
		*err = az_short(res);
		return 0;
	}
	/* a pack may pass the limit by a little: its pages' holes go later */
	if (nolimit ? az_over_limit_by(s, AZ_PACK_SLACK) : az_over_limit(s)) {
		az_pool_free(s->pool, h);
		*err = -ENOMEM;
		return 0;
	}
	return h;
}

/*
 * An object of @size bytes with its pool memory, not yet written; *@h2 is
 * the second allocation of a split object (0 if none), for az_obj_write()
 * or az_obj_unget().
 */
static struct az_obj *az_obj_get(struct az_store *s, struct az_reserve *res,
				 u32 size, unsigned long *h2, int *err,
				 bool nolimit)
{
	struct az_obj *o = res->o;
	u32 head, tail;

	*h2 = 0;
	res->o = NULL;
	if (!o)
		o = az_obj_zalloc(AZ_GFP_NOWAIT);
	if (!o) {
		*err = az_short(res);
		return NULL;
	}
	az_obj_parts(size, &head, &tail);
	if (tail) {
		*h2 = az_pool_get(s, res, tail, err, nolimit);
		if (!*h2)
			goto fail;
	}
	o->handle = az_pool_get(s, res, head, err, nolimit);
	if (!o->handle)
		goto fail;
	o->size = size;
	az_ref_set(&o->ref, 1);
	return o;
fail:
	if (*h2)
		az_pool_free(s->pool, *h2);
	*h2 = 0;
	az_obj_free(o);
	return NULL;
}

/* Undo az_obj_get() of an object nothing saw yet. */
static void az_obj_unget(struct az_store *s, struct az_obj *o,
			 unsigned long h2)
{
	az_pool_free(s->pool, o->handle);
	if (h2)
		az_pool_free(s->pool, h2);
	az_obj_free(o);
}

/*
 * A template chunk for (@group, @index), in *@t: the reserved one when
 * there is one (az_template_set() frees it if the index has a chunk by
 * then), else a no-wait allocation when the index has no chunk yet (NULL
 * when it has one).  False (with *@err) when one is needed and none could
 * be had.
 */
static bool az_tchunk_get(struct az_store *s, struct az_reserve *res,
			  u32 group, u64 index, struct az_tchunk **t, int *err)
{
	*t = res->t;
	res->t = NULL;
	if (*t || az_template_covered(s, group, index))
		return true;
	*t = az_alloc(AZ_TCHUNK_BYTES, AZ_GFP_NOWAIT);
	if (!*t)
		*err = az_short(res);
	return *t;
}

/*
 * A put's template entry.  Its chunk was had before anything changed;
 * only a template of the group removed meanwhile can have taken it, and
 * then a failed no-wait allocation costs the entry (not the page): counted.
 */
static void az_put_template_entry(struct az_store *s, u32 group, u64 index,
				  u16 owner, struct az_obj *o,
				  struct az_tchunk *t)
{
	if (az_template_set(s, group, index, owner, o, t) == -ENOMEM)
		az_atomic64_inc(&s->template_lost);
}

int az_reserve_fill(struct az_store *s, struct az_reserve *res)
{
	u32 size[2];
	int i;

	res->filled = true;
	if (res->leaf && !res->l) {
		res->l = az_zalloc(AZ_LEAF_BYTES, AZ_GFP_MAYSLEEP);
		if (!res->l)
			goto fail;
	}
	if (res->obj && !res->o) {
		res->o = az_obj_zalloc(AZ_GFP_MAYSLEEP);
		if (!res->o)
			goto fail;
	}
	if (res->tnode && !res->t) {
		res->t = az_alloc(AZ_TCHUNK_BYTES, AZ_GFP_MAYSLEEP);
		if (!res->t)
			goto fail;
	}
	if (!res->size)
		return 0;
	az_obj_parts(res->size, &size[0], &size[1]);
	for (i = 0; i < 2 && size[i]; i++) {
		res->h[i] = az_pool_alloc(s->pool, size[i], AZ_GFP_MAYSLEEP);
		res->hsize[i] = size[i];
		if (!res->h[i])
			goto fail;
	}
	if (az_over_limit(s))
		goto fail;
	return 0;
fail:
	az_atomic64_inc(&s->failed_stores);
	return -ENOMEM;
}

void az_reserve_release(struct az_store *s, struct az_reserve *res)
{
	int i;

	for (i = 0; i < 2; i++) {
		if (res->h[i])
			az_pool_free(s->pool, res->h[i]);
		res->h[i] = 0;
	}
	az_free(res->l);
	az_obj_free(res->o);
	az_free(res->t);
	res->l = NULL;
	res->o = NULL;
	res->t = NULL;
}

/* What a no-wait attempt lacked, for az_reserve_fill(). */
static void az_reserve_want(struct az_reserve *res, u32 size, bool obj,
			    bool tnode)
{
	res->size = size;
	res->obj = obj;
	res->tnode = tnode;
}

/*
 * Copy @size bytes of @src into pool allocation @h, or, for a split object
 * (@h2 its second allocation), into both, the first part assembled in
 * ctx->gbuf behind the link.
 */
static void az_bytes_write(struct az_store *s, struct az_ctx *ctx,
			   unsigned long h, unsigned long h2, const void *src,
			   u32 size)
{
	if (!h2) {
		az_pool_write(s->pool, h, src, size);
		return;
	}
	az_put_le64(h2, ctx->gbuf);
	az_copy_words(ctx->gbuf + AZ_SPLIT_LINK, src, AZ_SPLIT_DATA);
	az_pool_write(s->pool, h, ctx->gbuf, AZ_SPLIT_HEAD);
	az_pool_write(s->pool, h2, (const u8 *)src + AZ_SPLIT_DATA,
		      size - AZ_SPLIT_DATA);
}

/* Copy @src (@o->size bytes) into @o's pool memory (@h2: az_obj_get()). */
static void az_obj_write(struct az_store *s, struct az_ctx *ctx,
			 struct az_obj *o, unsigned long h2, const void *src)
{
	if (h2)
		o->link_check = az_link_check(h2);
	az_bytes_write(s, ctx, o->handle, h2, src, o->size);
}

/*
 * The link the split object at @h holds, unchecked.  Reads the pool:
 * atomic context (IRQs off too), never IRQ context.
 */
unsigned long az_split_link(struct az_store *s, unsigned long h)
{
	u8 local[AZ_SPLIT_LINK];
	const u8 *src;
	unsigned long h2;

	src = az_pool_read_begin(s->pool, h, AZ_SPLIT_LINK, local);
	h2 = (unsigned long)az_get_le64(src);
	az_pool_read_end(s->pool, h, AZ_SPLIT_LINK, src);
	return h2;
}

/*
 * The second allocation of the split object at @h, or 0 when the link's
 * az_link_check() is not @check (the allocation is then leaked).
 */
static unsigned long az_split_tail(struct az_store *s, unsigned long h,
				   u16 check)
{
	unsigned long h2 = az_split_link(s, h);

	if (AZ_WARN_ON(az_link_check(h2) != check))
		return 0;
	return h2;
}

/*
 * Gather the split object of @size bytes at @h into ctx->gbuf (the pool
 * allows one mapping at a time).  Returns its second allocation, or 0,
 * nothing gathered, when the link's az_link_check() is not @check.
 */
static unsigned long az_split_gather(struct az_store *s, struct az_ctx *ctx,
				     unsigned long h, u32 size, u16 check)
{
	u32 tail = size - AZ_SPLIT_DATA;
	unsigned long h2;
	const u8 *src;

	src = az_pool_read_begin(s->pool, h, AZ_SPLIT_HEAD, ctx->gbuf);
	h2 = (unsigned long)az_get_le64(src);
	if (az_link_check(h2) != check) {
		az_pool_read_end(s->pool, h, AZ_SPLIT_HEAD, src);
		return 0;
	}
	/* Moves down over itself when @src is ctx->gbuf: word by word is safe. */
	az_copy_words(ctx->gbuf, src + AZ_SPLIT_LINK, AZ_SPLIT_DATA);
	az_pool_read_end(s->pool, h, AZ_SPLIT_HEAD, src);
	src = az_pool_read_begin(s->pool, h2, tail, ctx->gbuf + AZ_SPLIT_DATA);
	if (src != ctx->gbuf + AZ_SPLIT_DATA)
		az_copy_words(ctx->gbuf + AZ_SPLIT_DATA, src, tail);
	az_pool_read_end(s->pool, h2, tail, src);
	return h2;
}

/* Bytes are charged to the creating owner: see azcore.h. */
static void az_obj_account(struct az_store *s, struct az_obj *o, bool tmpl)
{
	az_atomic64_add(az_obj_bytes(o), &s->stored_bytes);
	az_atomic64_inc(&s->objects);
	az_atomic64_add(az_obj_bytes(o), &az_owner_at(s, o->owner)->excl_bytes);
	if (tmpl) {
		az_obj_flag_set(o, AZ_OBJ_TEMPLATE);
		az_atomic64_add(az_obj_bytes(o), &s->template_bytes);
	}
}

/* With the default AZ_NR_SF an object header is 48 bytes (az_obj_zalloc). */
_Static_assert(AZ_NR_SF > 2 || sizeof(struct az_obj) == 48,
	       "struct az_obj outgrew 48 bytes");

size_t az_obj_header_bytes(void)
{
	return sizeof(struct az_obj);
}

/*
 * Last reference gone and unreachable: release everything.  A split
 * object's link is read from the pool here: in the deferred free, or in
 * az_store_pack() for an object made for a DIRECT page (az_slot_release()
 * reads a split DIRECT page's link the same way, in atomic context).
 */
static void az_obj_destroy(struct az_store *s, struct az_obj *o)
{
	struct az_owner *ow = az_owner_at(s, o->owner);

	if (az_obj_flag(o, AZ_OBJ_SHARED))
		az_atomic64_sub(az_obj_bytes(o), &ow->shared_bytes);
	else
		az_atomic64_sub(az_obj_bytes(o), &ow->excl_bytes);
	if (az_obj_flag(o, AZ_OBJ_TEMPLATE))
		az_atomic64_sub(az_obj_bytes(o), &s->template_bytes);
	if (az_obj_flag(o, AZ_OBJ_BASE))
		az_atomic64_dec(&s->bases);
	if (az_enc_is_pack(o->enc))
		az_atomic64_dec(&s->packs);
	az_bcache_forget(s, o);
	az_atomic64_sub(az_obj_bytes(o), &s->stored_bytes);
	az_atomic64_dec(&s->objects);
	if (az_obj_split(o->size)) {
		unsigned long h2 = az_split_tail(s, o->handle, o->link_check);

		if (h2)
			az_pool_free(s->pool, h2);
	}
	az_pool_free(s->pool, o->handle);
	if (az_obj_base(o))
		az_obj_put(s, o->base);
	az_obj_free(o);
}

/*
 * Drop a reference.  Atomic context safe: an indexed object is taken out
 * of the indexes here (under idx_lock, a few chain and set entries), and
 * goes to the deferred free like one that holds a base and like a pack;
 * anything else is freed here.  No caller holds idx_lock: the index code
 * puts the references it took only after dropping it.
 */
void az_obj_put(struct az_store *s, struct az_obj *o)
{
	bool indexed;

	if (!az_ref_dec_and_test(&o->ref))
		return;
	indexed = az_obj_flag(o, AZ_OBJ_INDEXED);
	if (indexed)
		az_index_remove(s, o);	/* frees @dnext for @dnode */
	if (indexed || az_obj_base(o) || az_enc_is_pack(o->enc)) {
		az_atomic64_inc(&s->deferred);
		az_defer_add(&s->defer, &o->dnode);
		return;
	}
	az_obj_destroy(s, o);
}

static void az_store_run_deferred(void *arg)
{
	struct az_store *s = arg;
	struct az_defer_node *n, *next;
	struct az_obj *o;
	unsigned int k = 0;

	while ((n = az_defer_take(&s->defer))) {
		/* a batch (10 ms of frees, a process exit) can be long */
		for (; n; n = next) {
			next = az_defer_next(n);
			o = container_of(n, struct az_obj, dnode);
			az_obj_destroy(s, o);
			/* after: "deferred" 0 means every figure is final */
			az_atomic64_dec(&s->deferred);
			if (!(++k & 255))
				az_cond_resched();
		}
		az_cond_resched();
	}
	az_index_resize(s);
}

void az_store_drain(struct az_store *s)
{
	az_defer_sync(&s->defer);
	az_store_run_deferred(s);
}

void az_obj_mark_shared(struct az_store *s, struct az_obj *o)
{
	struct az_owner *ow = az_owner_at(s, o->owner);

	if (az_obj_flag_test_and_set(o, AZ_OBJ_SHARED))
		return;
	az_atomic64_sub(az_obj_bytes(o), &ow->excl_bytes);
	az_atomic64_add(az_obj_bytes(o), &ow->shared_bytes);
}

void az_obj_mark_base(struct az_store *s, struct az_obj *o)
{
	az_obj_mark_shared(s, o);
	if (!az_obj_flag_test_and_set(o, AZ_OBJ_BASE))
		az_atomic64_inc(&s->bases);
}

/* Decode @size bytes at @src: a pack into @out (its page count), or a page. */
static int az_decode_any(struct az_ctx *ctx, const u8 *src, u32 size,
			 const void *base, void *out, bool pack)
{
	return pack ? az_decode_pack(ctx, src, size, out) :
		      az_decode(ctx, src, size, base, out);
}

/*
 * A split object is gathered into ctx->gbuf first (az_split_gather()).
 * @pack: decode a pack (@page has AZ_PACK_MAX pages; returns the page
 * count), else a page (0).
 */
static int az_obj_decode(struct az_store *s, struct az_ctx *ctx,
			 struct az_obj *o, const void *base, void *page,
			 bool pack)
{
	const u8 *src;
	int err;

	if (!az_obj_split(o->size)) {
		src = az_pool_read_begin(s->pool, o->handle, o->size, ctx->gbuf);
		err = az_decode_any(ctx, src, o->size, base, page, pack);
		az_pool_read_end(s->pool, o->handle, o->size, src);
		return err;
	}
	if (!az_split_gather(s, ctx, o->handle, o->size, o->link_check))
		return -EIO;
	return az_decode_any(ctx, ctx->gbuf, o->size, base, page, pack);
}

/*
 * Decode the page of DIRECT slot @flags (pool handle @h; locked) into
 * @page; *@enc (if not NULL) its encoding, *@h2 (if not NULL) the second
 * allocation of a split one, else 0.
 */
static int az_direct_decode(struct az_store *s, struct az_ctx *ctx,
			    unsigned long flags, unsigned long h, void *page,
			    int *enc, unsigned long *h2)
{
	u32 size = az_slot_size(flags);
	unsigned long link = 0;
	const u8 *src;
	int err;

	if (az_obj_split(size)) {
		link = az_split_gather(s, ctx, h, size,
				       az_slot_link_check(flags));
		if (!link)
			return -EIO;
		src = ctx->gbuf;
	} else {
		src = az_pool_read_begin(s->pool, h, size, ctx->gbuf);
	}
	if (enc)
		*enc = az_obj_encoding(src, size);
	if (h2)
		*h2 = link;
	err = az_decode(ctx, src, size, NULL, page);
	if (!link)
		az_pool_read_end(s->pool, h, size, src);
	return err;
}

/*
 * Decode @o into @page (never ctx->xbuf, which holds the base).  The
 * caller holds a reference to @o (or the lock of a slot referring to it),
 * which keeps its base alive too.
 */
int az_obj_read(struct az_store *s, struct az_ctx *ctx, struct az_obj *o,
		void *page)
{
	int err;

	if (az_obj_base(o)) {
		/* Depth 1: a base never has a base of its own. */
		err = az_base_read(s, ctx, o->base, ctx->xbuf,
				   AZ_READ_ONCE(s->pol.verify));
		if (err)
			return err;
		return az_obj_decode(s, ctx, o, ctx->xbuf, page, false);
	}
	return az_obj_decode(s, ctx, o, NULL, page, false);
}

/* Pack ids: unique across stores for the module's life (never 0). */
static az_atomic64_t az_pack_ids;

/*
 * Copy page @member of pack @o to @page; the caller holds a reference or
 * the lock of a slot referring to it.  The pack is decoded into ctx->kbuf
 * unless the context decoded and verified it last (swap readahead and
 * restores read a pack's pages one after another); with @verify a decode
 * is checked against the pack's hash.  A pack never changes once
 * published, and its id is never reused, so a matching id is its content.
 */
static int az_pack_read(struct az_store *s, struct az_ctx *ctx,
			struct az_obj *o, u32 member, void *page, bool verify)
{
	int n;

	if (member >= o->pack_pages)
		return -EIO;
	if (ctx->kid != o->pack_id) {
		ctx->kid = 0;
		n = az_obj_decode(s, ctx, o, NULL, ctx->kbuf, true);
		if (n < 0 || (u32)n != o->pack_pages)
			return -EIO;
		if (verify) {
			if (az_hash_tag(az_xxh64(ctx->kbuf, n * AZ_PAGE_SIZE,
						 0)) != o->hash)
				return -EIO;
			ctx->kid = o->pack_id;
		}
	}
	az_copy_words(page, ctx->kbuf + member * AZ_PAGE_SIZE, AZ_PAGE_SIZE);
	return 0;
}

/* ---- slots ------------------------------------------------------------ */

static inline struct az_leaf_dir *az_dir(struct az_store *s, u64 slot)
{
	return &s->dir[slot >> AZ_LEAF_SHIFT];
}

/*
 * A hold on @slot's leaf, NULL if it has none (no slot in its range is
 * used, @slot neither).  The hold keeps the leaf; az_leaf_put() ends it.
 * Atomic context safe.
 */
struct az_slot *az_slot_hold(struct az_store *s, u64 slot)
{
	struct az_leaf_dir *d = az_dir(s, slot);
	struct az_slot *leaf;

	if (!az_atomic_inc_not_zero(&d->ref))
		return NULL;
	/* nonzero: installed before the count left 0 (az_slot_hold_new) */
	leaf = az_load_acquire(&d->leaf);
	return &leaf[slot & (AZ_LEAF_SLOTS - 1)];
}

/*
 * A hold on @slot's leaf, which is allocated if it has none (no-wait, or
 * the reserve's).  NULL with *@err as az_short() if there is no memory.
 * Atomic context safe: s->leaf_lock is never held across the allocation.
 */
struct az_slot *az_slot_hold_new(struct az_store *s, struct az_reserve *res,
				 u64 slot, int *err)
{
	struct az_leaf_dir *d = az_dir(s, slot);
	struct az_slot *leaf, *fresh = NULL;

	leaf = az_slot_hold(s, slot);
	if (leaf)
		return leaf;
	for (;;) {
		az_spin_lock(&s->leaf_lock);
		leaf = d->leaf;		/* a leaf that is going comes back */
		if (!leaf && fresh) {
			leaf = fresh;
			fresh = NULL;
			az_store_release(&d->leaf, leaf);
			az_smp_mb();	/* the leaf before the count */
			az_atomic64_inc(&s->leaves);
		}
		if (leaf) {
			az_atomic_inc(&d->ref);
			az_spin_unlock(&s->leaf_lock);
			break;
		}
		az_spin_unlock(&s->leaf_lock);
		fresh = res->l;
		res->l = NULL;
		if (!fresh)
			fresh = az_zalloc(AZ_LEAF_BYTES, AZ_GFP_NOWAIT);
		if (!fresh) {
			*err = az_short(res);	/* the put reserves one */
			return NULL;
		}
	}
	az_free(fresh);
	return &leaf[slot & (AZ_LEAF_SLOTS - 1)];
}

/*
 * Drop a hold or a used slot's reference on @slot's leaf; the last frees
 * it.  Atomic context safe.
 */
void az_leaf_put(struct az_store *s, u64 slot)
{
	struct az_leaf_dir *d = az_dir(s, slot);
	struct az_slot *leaf = NULL;

	if (!az_atomic_dec_and_test(&d->ref))
		return;
	az_spin_lock(&s->leaf_lock);
	/* az_slot_hold_new() may have taken it back meanwhile */
	if (!az_atomic_read(&d->ref)) {
		leaf = d->leaf;
		AZ_WRITE_ONCE(d->leaf, NULL);
	}
	az_spin_unlock(&s->leaf_lock);
	if (leaf) {
		az_free(leaf);
		az_atomic64_dec(&s->leaves);
	}
}

static inline void az_slot_lock(struct az_slot *sl)
{
	az_bit_lock(AZ_SLOT_LOCK_BIT, &sl->flags);
}

static inline void az_slot_unlock(struct az_slot *sl)
{
	az_bit_unlock(AZ_SLOT_LOCK_BIT, &sl->flags);
}

static void az_account_slot(struct az_store *s, unsigned int kind, u16 own,
			    int sign)
{
	struct az_owner *ow = az_owner_at(s, own);

	if (sign > 0) {
		az_atomic64_inc(&s->pages_stored);
		az_atomic64_inc(&s->kind_pages[kind]);
		az_atomic64_inc(&ow->pages);
		az_atomic64_inc(&ow->kind_pages[kind]);
	} else {
		az_atomic64_dec(&s->pages_stored);
		az_atomic64_dec(&s->kind_pages[kind]);
		az_atomic64_dec(&ow->pages);
		az_atomic64_dec(&ow->kind_pages[kind]);
	}
}

/* Release what a slot referred to (after it was emptied). */
static void az_slot_release(struct az_store *s, unsigned long flags, u64 val)
{
	unsigned int kind = az_slot_kind(flags);
	struct az_obj *o;
	u32 size;

	az_account_slot(s, kind, flags & AZ_SLOT_OWNER_MASK, -1);
	if (kind == AZ_KIND_SAME)
		return;
	if (flags & AZ_SLOT_DIRECT) {
		size = az_slot_size(flags);
		if (az_obj_split(size)) {
			unsigned long h2;

			h2 = az_split_tail(s, (unsigned long)val,
					   az_slot_link_check(flags));
			if (h2)
				az_pool_free(s->pool, h2);
			size = az_size_bytes(size);
		}
		az_pool_free(s->pool, (unsigned long)val);
		az_atomic64_sub(size, &s->stored_bytes);
		az_atomic64_dec(&s->objects);
		az_atomic64_dec(&s->direct);
		az_atomic64_sub(size, &az_owner_at(s, flags &
						AZ_SLOT_OWNER_MASK)->excl_bytes);
		return;
	}
	o = (struct az_obj *)(unsigned long)val;
	if (az_enc_is_pack(o->enc))
		az_atomic64_dec(&s->packed_pages);
	az_obj_put(s, o);
}

/* Take what @sl holds and empty it; the caller holds the slot lock. */
static void az_slot_take(struct az_slot *sl, unsigned long *flags, u64 *val)
{
	*flags = sl->flags;
	*val = sl->val;
	sl->val = 0;
	sl->flags &= 1UL << AZ_SLOT_LOCK_BIT;
}

/* Release what @slot held (az_slot_take()) and its leaf reference. */
static void az_slot_drop(struct az_store *s, u64 slot, unsigned long flags,
			 u64 val)
{
	if (!(flags & AZ_SLOT_USED))
		return;
	az_atomic64_inc(&s->frees);
	az_slot_release(s, flags, val);
	az_leaf_put(s, slot);
}

/* Empty @slot.  Atomic context safe. */
static void az_slot_clear(struct az_store *s, u64 slot)
{
	struct az_slot *sl = az_slot_hold(s, slot);
	unsigned long flags;
	u64 val;

	if (!sl)
		return;
	az_slot_lock(sl);
	az_slot_take(sl, &flags, &val);
	az_slot_unlock(sl);
	az_slot_drop(s, slot, flags, val);
	az_leaf_put(s, slot);
}

/*
 * Fill @slot (@sl, held: the hold becomes the slot's reference on its
 * leaf), releasing what it held.  @extra: AZ_SLOT_DIRECT, size and check
 * bits.  A racing put on the same slot (callers must not do that) loses
 * its page.
 */
static void az_slot_set(struct az_store *s, struct az_slot *sl, u64 slot,
			unsigned int kind, u16 own, u64 val,
			unsigned long extra)
{
	unsigned long old;
	u64 oval;

	az_account_slot(s, kind, own, 1);
	az_slot_lock(sl);
	old = sl->flags;
	oval = sl->val;
	sl->val = val;
	sl->flags = (old & (1UL << AZ_SLOT_LOCK_BIT)) | AZ_SLOT_USED |
		    ((unsigned long)kind << AZ_SLOT_KIND_SHIFT) | own | extra;
	az_slot_unlock(sl);
	az_slot_drop(s, slot, old, oval);
}

/* ---- store ------------------------------------------------------------ */

struct az_store *az_store_create(u64 nr_slots, const char *name)
{
	struct az_store *s;

	if (!nr_slots || nr_slots > (1ULL << 40))
		return NULL;
	s = az_valloc(sizeof(*s));
	if (!s)
		return NULL;
	s->nr_slots = nr_slots;
	s->nr_dir = (nr_slots + AZ_LEAF_SLOTS - 1) >> AZ_LEAF_SHIFT;
	/* 16 B per 64 slots: beyond kvmalloc's INT_MAX above 32 TiB. */
	s->dir = az_valloc_big(s->nr_dir * sizeof(*s->dir));
	if (!s->dir)
		goto fail_slots;
	s->owner_chunk[0] = az_valloc(AZ_OWNER_CHUNK * sizeof(struct az_owner));
	if (!s->owner_chunk[0])
		goto fail_owners;
	s->pool = az_pool_create(name);
	if (!s->pool)
		goto fail_pool;
	az_spin_init(&s->leaf_lock);
	az_spin_init(&s->reg_lock);
	az_spin_init(&s->idx_lock);
	az_spin_init(&s->bc_lock);
	az_wait_init(&s->owner_wq);
	az_owners_init(s);
	az_defer_init(&s->defer, az_store_run_deferred, s);
	s->pol.codec = AZ_CODEC_LZ4;
	s->pol.level = 3;
	s->pol.dedup = 1;
	s->pol.tdelta = 1;
	s->pol.xdelta = 1;
	s->pol.sim_effort = 4;
	s->pol.delta_max_pct = 80;
	s->pol.verify = 1;
	s->pol.shuffle = 1;
	s->sim_slots = AZ_SIM_DENSITY;
	s->sim_sample = AZ_SIM_SAMPLE_DEFAULT;
	/* The cache is an optimisation: without memory for it, run without. */
	if (az_store_set_base_cache(s, AZ_BC_DEFAULT_PAGES))
		az_warn("no memory for the base cache, running without\n");
	return s;

fail_pool:
	az_vfree(s->owner_chunk[0]);
fail_owners:
	az_vfree(s->dir);
fail_slots:
	az_vfree(s);
	return NULL;
}

void az_store_destroy(struct az_store *s)
{
	u64 d, i;
	u32 j, o;

	if (!s)
		return;
	/* Tables about to be freed are not worth resizing. */
	AZ_WRITE_ONCE(s->idx.closing, true);
	/* Alone here: a leaf goes with its last used slot. */
	for (d = 0; d < s->nr_dir; d++) {
		for (j = 0; j < AZ_LEAF_SLOTS; j++) {
			struct az_slot *leaf = s->dir[d].leaf;

			i = d * AZ_LEAF_SLOTS + j;
			if (!leaf || i >= s->nr_slots)
				break;
			if (leaf[j].flags & AZ_SLOT_USED)
				az_slot_clear(s, i);
		}
		if (!(d & 15))
			az_cond_resched();
	}
	AZ_WARN_ON(az_atomic64_read(&s->leaves));
	for (o = 1; o < s->nr_owners; o++)
		if (az_owner_at(s, o)->flags & AZ_OWN_TEMPLATE)
			az_template_drop_owner(s, o);
	/* Freeing a delta may queue its base: drain until nothing is left. */
	do {
		az_store_drain(s);
	} while (az_atomic64_read(&s->deferred));
	az_defer_destroy(&s->defer);
	AZ_WARN_ON(az_atomic64_read(&s->objects));
	az_index_destroy(s);
	az_bcache_destroy(s);
	az_pool_destroy(s->pool);
	az_spin_destroy(&s->bc_lock);
	az_spin_destroy(&s->idx_lock);
	az_spin_destroy(&s->reg_lock);
	az_spin_destroy(&s->leaf_lock);
	for (o = 0; o < AZ_OWNER_CHUNKS; o++)
		az_vfree(s->owner_chunk[o]);
	az_vfree(s->dir);
	az_vfree(s);
}

u64 az_store_nr_slots(struct az_store *s)
{
	return s->nr_slots;
}

#define AZ_COMPACT_MIN	(4ULL << 20)

bool az_store_compact_wanted(struct az_store *s)
{
	u64 pool = az_pool_bytes(s->pool);
	u64 used = az_atomic64_read(&s->stored_bytes);

	return pool > used && pool - used > az_max(used / 8, AZ_COMPACT_MIN);
}

u64 az_store_compact(struct az_store *s)
{
	u64 freed = az_pool_compact(s->pool);

	az_atomic64_add(freed, &s->compacted_bytes);
	return freed;
}

void az_store_set_mem_limit(struct az_store *s, u64 bytes)
{
	AZ_WRITE_ONCE(s->mem_limit, bytes);
}

/*
 * The policy is read field by field without a lock (READ_ONCE): a put
 * racing with set_policy may see a mix of old and new fields, each of
 * them valid on its own.  Writers serialise on reg_lock.
 */
static void az_policy_snapshot(struct az_store *s, struct az_policy *p)
{
	p->codec = AZ_READ_ONCE(s->pol.codec);
	p->level = AZ_READ_ONCE(s->pol.level);
	p->dedup = AZ_READ_ONCE(s->pol.dedup);
	p->tdelta = AZ_READ_ONCE(s->pol.tdelta);
	p->xdelta = AZ_READ_ONCE(s->pol.xdelta);
	p->sim_effort = AZ_READ_ONCE(s->pol.sim_effort);
	p->delta_max_pct = AZ_READ_ONCE(s->pol.delta_max_pct);
	p->verify = AZ_READ_ONCE(s->pol.verify);
	p->shuffle = AZ_READ_ONCE(s->pol.shuffle);
}

/* The allowed values of every policy field: the one place they are set. */
static const struct {
	u32 off, min, max;
} az_pol_ranges[AZ_POL_NR] = {
	[AZ_POL_CODEC] = { offsetof(struct az_policy, codec),
			   AZ_CODEC_LZ4, AZ_CODEC_ZSTD },
	[AZ_POL_LEVEL] = { offsetof(struct az_policy, level),
			   AZ_ZSTD_LEVEL_MIN, AZ_ZSTD_LEVEL_MAX },
	[AZ_POL_DEDUP] = { offsetof(struct az_policy, dedup), 0, 1 },
	[AZ_POL_TDELTA] = { offsetof(struct az_policy, tdelta), 0, 1 },
	[AZ_POL_XDELTA] = { offsetof(struct az_policy, xdelta), 0, 1 },
	[AZ_POL_SIM_EFFORT] = { offsetof(struct az_policy, sim_effort), 0, 64 },
	[AZ_POL_DELTA_MAX_PCT] = { offsetof(struct az_policy, delta_max_pct),
				   1, 100 },
	[AZ_POL_VERIFY] = { offsetof(struct az_policy, verify), 0, 1 },
	[AZ_POL_SHUFFLE] = { offsetof(struct az_policy, shuffle), 0, 1 },
};

void az_policy_range(enum az_policy_field f, u32 *min, u32 *max)
{
	*min = az_pol_ranges[f].min;
	*max = az_pol_ranges[f].max;
}

int az_policy_check(const struct az_policy *p, int *bad)
{
	int f;

	for (f = 0; f < AZ_POL_NR; f++) {
		u32 v = *(const u32 *)((const u8 *)p + az_pol_ranges[f].off);

		/* Level 0 means "the default": lz4 only. */
		if (f == AZ_POL_LEVEL && !v && p->codec == AZ_CODEC_LZ4)
			continue;
		if (v < az_pol_ranges[f].min || v > az_pol_ranges[f].max) {
			if (bad)
				*bad = f;
			return -EINVAL;
		}
	}
	return 0;
}

int az_store_set_policy(struct az_store *s, const struct az_policy *p)
{
	if (az_policy_check(p, NULL))
		return -EINVAL;
	/*
	 * The codec may change while pages are stored: every object names
	 * its own encoding (az_internal.h), and each put snapshots the
	 * policy once, so old and new objects decode side by side.
	 */
	az_spin_lock(&s->reg_lock);
	AZ_WRITE_ONCE(s->pol.codec, p->codec);
	AZ_WRITE_ONCE(s->pol.level, p->codec == AZ_CODEC_LZ4 && !p->level ?
		      3 : p->level);
	AZ_WRITE_ONCE(s->pol.dedup, p->dedup);
	AZ_WRITE_ONCE(s->pol.tdelta, p->tdelta);
	AZ_WRITE_ONCE(s->pol.xdelta, p->xdelta);
	AZ_WRITE_ONCE(s->pol.sim_effort, p->sim_effort);
	AZ_WRITE_ONCE(s->pol.delta_max_pct, p->delta_max_pct);
	AZ_WRITE_ONCE(s->pol.verify, p->verify);
	AZ_WRITE_ONCE(s->pol.shuffle, p->shuffle);
	az_spin_unlock(&s->reg_lock);
	return 0;
}

void az_store_get_policy(struct az_store *s, struct az_policy *p)
{
	az_policy_snapshot(s, p);
}

/* What put decided, before the object is allocated. */
struct az_choice {
	unsigned int kind;
	u32 size;
	u8 enc;
	u8 *buf;		/* encoded object (ctx->obuf or ctx->tbuf) */
	struct az_obj *base;	/* referenced base of a delta */
};

/* A delta this small is not worth searching further candidates for. */
#define AZ_DELTA_GOOD	64

/*
 * The plain size a page's first delta is judged against without compressing
 * it plain: a delta within delta_max_pct of it is kept as it is.  Pages
 * whose plain encoding is smaller (a twentieth of a page) are rare, and the
 * plain compression costs as much as the delta (two for a page that
 * compresses badly).
 */
#define AZ_PLAIN_FLOOR	256

/*
 * Make the encoding in the spare buffer (@size bytes, @enc; a delta of
 * @base, which holds a reference, or NULL) the choice; the choice's buffer
 * becomes the spare one and its base, if any, is released.
 */
static void az_choice_take(struct az_store *s, struct az_choice *c,
			   u8 **spare, u32 size, u8 enc, unsigned int kind,
			   struct az_obj *base)
{
	u8 *t = c->buf;

	if (c->base)
		az_obj_put(s, c->base);
	c->buf = *spare;
	*spare = t;
	c->size = size;
	c->enc = enc;
	c->kind = kind;
	c->base = base;
}

/* Try a delta of @page against @b; keeps the better of it and @c. */
static void az_try_delta(struct az_store *s, struct az_ctx *ctx,
			 const struct az_policy *pol, const void *page,
			 struct az_obj *b, unsigned int kind, u32 limit,
			 struct az_choice *c, u8 **spare)
{
	u32 n;
	u8 enc;

	if (c->size < limit)
		limit = c->size;
	if (az_base_read(s, ctx, b, ctx->pbuf, pol->verify))
		goto drop;
	n = az_encode_delta(ctx, pol, page, ctx->pbuf, az_enc_is_numeric(b->enc),
			    *spare, limit, &enc);
	if (!n)
		goto drop;
	az_choice_take(s, c, spare, n, enc, kind, b);
	return;
drop:
	az_obj_put(s, b);
}

/* The largest delta a page of @plain encoded bytes may become. */
static inline u32 az_delta_limit(const struct az_policy *pol, u32 plain)
{
	return (u32)((u64)plain * pol->delta_max_pct / 100);
}

/*
 * Encode @page plain into the spare buffer and keep it unless @c holds a
 * delta below the limit the plain size sets; returns that limit.
 */
static u32 az_choose_plain(struct az_store *s, struct az_ctx *ctx,
			   const struct az_policy *pol, const void *page,
			   struct az_choice *c, u8 **spare)
{
	u32 size, limit;
	u8 enc;

	size = az_encode_plain(ctx, pol, page, *spare, az_obj_max(pol), &enc);
	limit = az_delta_limit(pol, size);
	if (!c->base || c->size >= limit)
		az_choice_take(s, c, spare, size, enc, size == AZ_PAGE_SIZE ?
			       AZ_KIND_RAW : AZ_KIND_PLAIN, NULL);
	return limit;
}

/*
 * Pick the cheapest representation of a non-same page: DUP, else the
 * smallest of TDELTA, XDELTA and PLAIN/RAW.  On return either *dup holds a
 * referenced identical object, or @c describes a new object to create.
 *
 * A delta must come below delta_max_pct of the plain size.  The first
 * candidate (the template base, else the first similar object) is tried
 * before the page is compressed plain: a delta within delta_max_pct of
 * AZ_PLAIN_FLOOR is kept at once.  Otherwise the plain encoding sets the
 * limit the other candidates are tried against.  @first_try: the put's
 * first attempt, whose similarity lookup counts in its group's yield.
 */
static void az_choose(struct az_store *s, struct az_ctx *ctx,
		      const struct az_policy *pol, const void *page,
		      const struct az_page_info *pi, const struct az_pin *pin,
		      u64 hash, const u64 *sf, struct az_choice *c,
		      struct az_obj **dup, bool first_try)
{
	/* At most one candidate per way of each super-feature's set. */
	struct az_obj *cand[AZ_NR_SF * AZ_SIM_WAYS];
	struct az_obj *first = NULL;
	unsigned int kind = AZ_KIND_TDELTA;
	u8 *spare = ctx->tbuf;
	u32 limit;
	int i = 0, n = 0;

	*dup = NULL;
	if (pin->reg && pol->dedup) {
		*dup = az_dedup_find(s, ctx, pin->group, hash, page, pin->tmpl,
				     first_try);
		if (*dup)
			return;
	}
	c->buf = ctx->obuf;
	c->base = NULL;
	c->size = AZ_PAGE_SIZE;
	c->kind = AZ_KIND_RAW;
	c->enc = 0;
	/* Template pages must stay bases: never deltas. */
	if (pin->reg && !pin->tmpl) {
		if (pol->tdelta && pi)
			first = az_template_find(s, pin->group, pi->index);
		if (pol->xdelta && pol->sim_effort)
			n = az_sim_find(s, pin->group, pin->idx, sf, cand,
					az_min(pol->sim_effort,
					       (u32)ARRAY_SIZE(cand)),
					first_try);
	}
	if (!first && n) {
		first = cand[i++];
		kind = AZ_KIND_XDELTA;
	}
	/* Against the limit of the worst plain encoding (a raw page). */
	if (first)
		az_try_delta(s, ctx, pol, page, first, kind,
			     az_delta_limit(pol, AZ_PAGE_SIZE), c, &spare);
	if (c->base && c->size <= az_delta_limit(pol, AZ_PLAIN_FLOOR))
		goto out;
	limit = az_choose_plain(s, ctx, pol, page, c, &spare);
	for (; i < n; i++) {
		/* Good enough already: skip the rest. */
		if (c->base && c->size <= AZ_DELTA_GOOD)
			break;
		/* Tried first (a template page is a similar one too). */
		if (cand[i] == first) {
			az_obj_put(s, cand[i]);
			continue;
		}
		az_try_delta(s, ctx, pol, page, cand[i], AZ_KIND_XDELTA,
			     limit, c, &spare);
	}
out:
	for (; i < n; i++)
		az_obj_put(s, cand[i]);
}

/*
 * The flags of a DIRECT slot holding @size bytes: a split one's link check
 * @link, and the check of a page of hash @hash (0: none, verify off).
 */
static unsigned long az_direct_flags(u32 size, u16 link, u64 hash)
{
	unsigned long f = AZ_SLOT_DIRECT |
			  (unsigned long)size << AZ_SLOT_SIZE_SHIFT;

	if (az_obj_split(size))
		f |= az_slot_link(link);
	return f | az_slot_check(f, hash);
}

/*
 * A page without an object: PLAIN/RAW (@size bytes of @buf, the page itself
 * when raw; split in two allocations as an object would be) in a DIRECT
 * slot, charged to owner @own: an unregistered cgroup's page, or a private
 * page of a direct group (index.c).
 */
static int az_put_direct(struct az_store *s, struct az_ctx *ctx,
			 struct az_reserve *res, u64 slot, u16 own,
			 const void *buf, u32 size, u64 hash, bool verify)
{
	struct az_slot *sl = NULL;
	unsigned long h = 0, h2 = 0;
	u32 head, tail;
	int err;

	az_obj_parts(size, &head, &tail);
	if (tail)
		h2 = az_pool_get(s, res, tail, &err, false);
	if (h2 || !tail)
		h = az_pool_get(s, res, head, &err, false);
	if (h)
		sl = az_slot_hold_new(s, res, slot, &err);
	if (!sl) {
		if (h)
			az_pool_free(s->pool, h);
		if (h2)
			az_pool_free(s->pool, h2);
		/* a header too: the retry may find the group no longer direct */
		if (err == -EAGAIN)
			az_reserve_want(res, size, own != 0, false);
		return err;
	}
	az_bytes_write(s, ctx, h, h2, buf, size);
	az_atomic64_add(az_size_bytes(size), &s->stored_bytes);
	az_atomic64_inc(&s->objects);
	az_atomic64_inc(&s->direct);
	az_atomic64_add(az_size_bytes(size), &az_owner_at(s, own)->excl_bytes);
	az_slot_set(s, sl, slot,
		    size == AZ_PAGE_SIZE ? AZ_KIND_RAW : AZ_KIND_PLAIN, own, h,
		    az_direct_flags(size, h2 ? az_link_check(h2) : 0,
				    verify ? hash : 0));
	return 0;
}

int az_store_put_nowait(struct az_store *s, struct az_ctx *ctx, u64 slot,
			const void *page, const struct az_page_info *pi,
			struct az_reserve *res)
{
	struct az_tchunk *t = NULL;
	struct az_page_info info;
	struct az_policy pol;
	struct az_choice c;
	struct az_pin pin;
	struct az_slot *sl;
	struct az_obj *o;
	unsigned long h2;
	u64 word, hash = 0, sf[AZ_NR_SF];
	bool tnode;
	int err = 0;

	if (slot >= s->nr_slots)
		return -EINVAL;
	az_policy_snapshot(s, &pol);
	if (!res->filled)	/* the first attempt */
		az_atomic64_inc(&s->stores);

	az_owner_pin(s, pi ? pi->owner : 0, &pin);
	if (pi && pin.idx) {
		/* The index hint as the template knows it. */
		info = *pi;
		info.index = az_owner_index(s, &pin, pi->index);
		pi = &info;
	}
	if (az_page_same(page, &word)) {
		sl = az_slot_hold_new(s, res, slot, &err);
		if (sl)
			az_slot_set(s, sl, slot, AZ_KIND_SAME, pin.idx, word, 0);
		goto out;
	}
	if (pin.reg || pol.verify)
		hash = az_xxh64(page, AZ_PAGE_SIZE, 0);
	if (!pin.reg) {
		u32 size = az_encode_plain(ctx, &pol, page, ctx->obuf,
					   AZ_RAW_THRESHOLD, &c.enc);

		err = az_put_direct(s, ctx, res, slot, 0, size == AZ_PAGE_SIZE ?
				    page : ctx->obuf, size, hash, pol.verify);
		goto out;
	}
	if (pol.xdelta)
		az_sim_features(page, sf);
	tnode = pin.tmpl && pi;
	az_choose(s, ctx, &pol, page, pi, &pin, hash, sf, &c, &o,
		  !res->filled);
	if (o) {
		if (tnode && !az_tchunk_get(s, res, pin.group, pi->index, &t,
					    &err)) {
			az_obj_put(s, o);
			if (err == -EAGAIN)
				az_reserve_want(res, 0, false, true);
			goto out;
		}
		sl = az_slot_hold_new(s, res, slot, &err);
		if (!sl) {
			az_obj_put(s, o);
			if (t)		/* back to the reserve it came from */
				res->t = t;
			if (err == -EAGAIN)
				az_reserve_want(res, 0, false, tnode);
			goto out;
		}
		az_obj_mark_shared(s, o);
		if (tnode)
			az_put_template_entry(s, pin.group, pi->index, pin.idx,
					      o, t);
		az_slot_set(s, sl, slot, AZ_KIND_DUP, pin.idx,
			    (u64)(unsigned long)o, 0);
		goto out;
	}
	/* A private plain page its group would not find again: no object. */
	if (!c.base && !pin.tmpl && pol.xdelta && pol.sim_effort &&
	    az_group_direct(&s->idx, pin.group, az_hash_tag(hash),
			    AZ_READ_ONCE(s->sim_sample))) {
		/* with check bits: az_direct_to_obj() checks them */
		err = az_put_direct(s, ctx, res, slot, pin.idx,
				    c.size == AZ_PAGE_SIZE ? page : c.buf,
				    c.size, hash, true);
		goto out;
	}
	/* Everything the new object needs, before anything changes. */
	o = az_obj_get(s, res, c.size, &h2, &err, false);
	tnode = tnode && !c.base;	/* a delta is never a template entry */
	if (o && tnode &&
	    !az_tchunk_get(s, res, pin.group, pi->index, &t, &err)) {
		az_obj_unget(s, o, h2);
		o = NULL;
	}
	sl = o ? az_slot_hold_new(s, res, slot, &err) : NULL;
	if (o && !sl) {
		az_obj_unget(s, o, h2);
		o = NULL;
		if (t)
			res->t = t;
	}
	if (!o) {
		if (c.base)
			az_obj_put(s, c.base);
		if (err == -EAGAIN)
			az_reserve_want(res, c.size, true, tnode);
		goto out;
	}
	o->enc = c.enc;
	o->owner = pin.idx;
	o->group = pin.group;
	o->hash = az_hash_tag(hash);
	if (c.base)
		o->base = c.base;
	az_obj_write(s, ctx, o, h2, c.size == AZ_PAGE_SIZE ? page : c.buf);
	az_obj_account(s, o, pin.tmpl);
	if (c.base)
		az_obj_mark_base(s, c.base);
	az_index_insert(s, o, pol.xdelta && !c.base ? sf : NULL,
			c.kind == AZ_KIND_XDELTA);
	if (tnode)
		az_put_template_entry(s, pin.group, pi->index, pin.idx, o, t);
	az_slot_set(s, sl, slot, c.kind, pin.idx, (u64)(unsigned long)o, 0);
out:
	/*
	 * The slot's leaf is held last, before anything changes (the hold
	 * fills the slot).  The next attempt has one reserved.
	 */
	if (err == -EAGAIN)
		res->leaf = true;
	if (err == -ENOMEM)
		az_atomic64_inc(&s->failed_stores);
	az_owner_unpin(s, &pin);
	return err;
}

int az_store_put(struct az_store *s, struct az_ctx *ctx, u64 slot,
		 const void *page, const struct az_page_info *pi)
{
	struct az_reserve res = { 0 };
	int err;

	err = az_store_put_nowait(s, ctx, slot, page, pi, &res);
	if (err == -EAGAIN) {
		err = az_reserve_fill(s, &res);
		if (!err)
			err = az_store_put_nowait(s, ctx, slot, page, pi, &res);
	}
	az_reserve_release(s, &res);
	az_index_resize(s);
	return err;
}

/*
 * Whether decoded @page matches the check bits DIRECT slot @flags keeps
 * (none: stored with verify off); its hash, when computed, in *@hash.
 */
static bool az_slot_checks(unsigned long flags, const void *page, u64 *hash)
{
	unsigned long check = flags & az_slot_check_mask(flags);
	u64 h;

	if (!check && !hash)
		return true;
	h = az_xxh64(page, AZ_PAGE_SIZE, 0);
	if (hash)
		*hash = h;
	return !check || az_slot_check(flags, h) == check;
}

/* Read held slot @sl into @page; an empty slot reads as zeroes. */
static int az_slot_read(struct az_store *s, struct az_ctx *ctx,
			struct az_slot *sl, void *page)
{
	struct az_obj *o;
	unsigned long flags;
	int err = 0;

	az_slot_lock(sl);
	flags = sl->flags;
	if (!(flags & AZ_SLOT_USED)) {
		az_slot_unlock(sl);
		memset(page, 0, AZ_PAGE_SIZE);
		return 0;
	}
	if (az_slot_kind(flags) == AZ_KIND_SAME) {
		az_fill_page(page, sl->val);
		az_slot_unlock(sl);
		return 0;
	}
	if (flags & AZ_SLOT_DIRECT) {
		err = az_direct_decode(s, ctx, flags, (unsigned long)sl->val,
				       page, NULL, NULL);
		/* The check bits are 0 when stored with verify off. */
		if (!err && AZ_READ_ONCE(s->pol.verify) &&
		    !az_slot_checks(flags, page, NULL))
			err = -EIO;
		az_slot_unlock(sl);
		return err;
	}
	/* The slot lock keeps the object (and so its base) alive. */
	o = (struct az_obj *)(unsigned long)sl->val;
	if (az_enc_is_pack(o->enc)) {
		err = az_pack_read(s, ctx, o, az_slot_member(flags), page,
				   AZ_READ_ONCE(s->pol.verify));
		az_slot_unlock(sl);
		return err;
	}
	err = az_obj_read(s, ctx, o, page);
	if (!err && AZ_READ_ONCE(s->pol.verify) &&
	    az_hash_tag(az_xxh64(page, AZ_PAGE_SIZE, 0)) != o->hash)
		err = -EIO;
	az_slot_unlock(sl);
	return err;
}

int az_store_get(struct az_store *s, struct az_ctx *ctx, u64 slot, void *page)
{
	struct az_slot *sl;
	int err;

	if (slot >= s->nr_slots)
		return -EINVAL;
	az_atomic64_inc(&s->loads);
	sl = az_slot_hold(s, slot);
	if (!sl) {		/* no leaf: empty */
		memset(page, 0, AZ_PAGE_SIZE);
		return 0;
	}
	err = az_slot_read(s, ctx, sl, page);
	az_leaf_put(s, slot);
	if (err)
		az_atomic64_inc(&s->failed_loads);
	return err;
}

void az_store_free(struct az_store *s, u64 slot)
{
	if (slot < s->nr_slots)
		az_slot_clear(s, slot);
}

int az_store_free_notify(struct az_store *s, u64 slot)
{
	struct az_slot *sl;
	unsigned long flags;
	u64 val;

	if (slot >= s->nr_slots)
		return -EINVAL;
	sl = az_slot_hold(s, slot);
	if (!sl)
		return 0;
	if (!az_bit_trylock(AZ_SLOT_LOCK_BIT, &sl->flags)) {
		az_leaf_put(s, slot);
		return -EBUSY;
	}
	az_slot_take(sl, &flags, &val);
	az_slot_unlock(sl);
	az_slot_drop(s, slot, flags, val);
	az_leaf_put(s, slot);
	return 0;
}

/* ---- packs ------------------------------------------------------------ */

/* Does a slot of @flags hold a registered owner's PLAIN page, DIRECT? */
static inline bool az_slot_private_direct(unsigned long flags)
{
	return (flags & AZ_SLOT_USED) && (flags & AZ_SLOT_DIRECT) &&
	       (flags & AZ_SLOT_OWNER_MASK) &&
	       az_slot_kind(flags) == AZ_KIND_PLAIN;
}

/*
 * Give the page of DIRECT slot @sl (locked: a registered owner's PLAIN
 * page, else nothing is done) object @o (zeroed, unseen), so that it can
 * join a pack: the slot's pool handle moves to it and the slot refers to
 * it.  The page is decoded (into ctx->pbuf) for its hash and checked.
 * False, nothing changed, when it is no such page or does not decode or
 * check.
 */
static bool az_direct_to_obj(struct az_store *s, struct az_ctx *ctx,
			     struct az_slot *sl, struct az_obj *o)
{
	unsigned long flags = sl->flags, h = (unsigned long)sl->val, h2;
	u16 own = flags & AZ_SLOT_OWNER_MASK;
	u64 hash;
	int enc, err;

	if (!az_slot_private_direct(flags))
		return false;
	err = az_direct_decode(s, ctx, flags, h, ctx->pbuf, &enc, &h2);
	if (err || enc <= 0 || !az_slot_checks(flags, ctx->pbuf, &hash))
		return false;
	o->handle = h;
	o->size = az_slot_size(flags);
	if (h2)
		o->link_check = az_link_check(h2);
	o->enc = enc;
	o->owner = own;
	o->group = AZ_READ_ONCE(az_owner_at(s, own)->group);
	o->hash = az_hash_tag(hash);
	az_obj_flag_set(o, AZ_OBJ_FROM_DIRECT);
	az_ref_set(&o->ref, 1);
	sl->val = (u64)(unsigned long)o;
	sl->flags = flags & ~(AZ_SLOT_DIRECT | AZ_SLOT_CHECK_MASK |
			      AZ_SLOT_LINK_MASK |
			      (AZ_SLOT_SIZE_MASK << AZ_SLOT_SIZE_SHIFT));
	az_atomic64_dec(&s->direct);
	return true;
}

/*
 * Drop the caller's reference on candidate @o of @slot.  One that
 * az_direct_to_obj() made and that the slot still refers to (it did not
 * join a pack) goes back to a DIRECT slot: nothing else can reach it.
 */
static void az_pack_candidate_put(struct az_store *s, u64 slot,
				  struct az_obj *o)
{
	struct az_slot *sl = NULL;
	bool back = false;

	if (az_obj_flag(o, AZ_OBJ_FROM_DIRECT))
		sl = az_slot_hold(s, slot);
	if (sl) {
		az_slot_lock(sl);
		if (sl->val == (u64)(unsigned long)o &&
		    !az_slot_member(sl->flags)) {
			sl->val = o->handle;
			sl->flags |= az_direct_flags(o->size, o->link_check,
						     (u64)o->hash << 32);
			az_atomic64_inc(&s->direct);
			back = true;
		}
		az_slot_unlock(sl);
		az_leaf_put(s, slot);
	}
	if (back)
		az_obj_free(o);	/* the slot's reference and ours */
	else
		az_obj_put(s, o);
}

/*
 * The object of @slot if it can join a pack of owner *@own's pages (any
 * owner's when 0: then set), referred to by this slot alone; one made for
 * a DIRECT slot's page (az_direct_to_obj()).  NULL otherwise; *@other is
 * then set if it would have been one for another owner.  Release with
 * az_pack_candidate_put().
 */
static struct az_obj *az_pack_candidate(struct az_store *s,
					struct az_ctx *ctx, u64 slot,
					u16 *own, bool *other)
{
	struct az_slot *sl = az_slot_hold(s, slot);
	struct az_obj *o = NULL, *spare = NULL;
	unsigned long flags;
	u16 so;

	*other = false;
	if (!sl)
		return NULL;
	az_slot_lock(sl);
	flags = sl->flags;
	so = flags & AZ_SLOT_OWNER_MASK;
	if (az_slot_private_direct(flags)) {
		if (*own && so != *own) {
			*other = true;
		} else {
			/* allocated without the lock: the slot is looked at again */
			az_slot_unlock(sl);
			spare = az_obj_zalloc(AZ_GFP_NOWAIT);
			az_slot_lock(sl);
			so = sl->flags & AZ_SLOT_OWNER_MASK;
			if (spare && (!*own || so == *own) &&
			    az_direct_to_obj(s, ctx, sl, spare))
				spare = NULL;
		}
		flags = sl->flags;
		so = flags & AZ_SLOT_OWNER_MASK;
	}
	if ((flags & AZ_SLOT_USED) && !(flags & AZ_SLOT_DIRECT) &&
	    az_slot_kind(flags) == AZ_KIND_PLAIN && so) {
		o = (struct az_obj *)(unsigned long)sl->val;
		if (o->owner != so || az_enc_is_pack(o->enc) ||
		    az_obj_flag(o, AZ_OBJ_TEMPLATE) ||
		    az_ref_read(&o->ref) != 1) {
			o = NULL;
		} else if (*own && so != *own) {
			*other = true;
			o = NULL;
		} else {
			az_ref_inc(&o->ref);
			*own = so;
		}
	}
	az_slot_unlock(sl);
	az_leaf_put(s, slot);
	az_obj_free(spare);
	return o;
}

/*
 * Point @slot at page @tm of @to if it still holds page @fm of @from (a
 * put or free may have changed it since): packing moves a slot from its
 * candidate to a pack (@fm 0), undoing moves it back (@tm 0).  A candidate
 * moves only while it is still private: the slot's reference and the
 * caller's, no dedup hit meanwhile.  The slot's reference moves with it;
 * the caller holds one on both objects.
 */
static bool az_pack_move(struct az_store *s, u64 slot, struct az_obj *from,
			 u32 fm, struct az_obj *to, u32 tm)
{
	struct az_slot *sl = az_slot_hold(s, slot);
	bool from_pack = az_enc_is_pack(from->enc);
	unsigned long flags;
	bool done = false;

	if (!sl)		/* freed meanwhile */
		return false;
	az_ref_inc(&to->ref);
	az_slot_lock(sl);
	flags = sl->flags;
	if ((flags & AZ_SLOT_USED) && !(flags & AZ_SLOT_DIRECT) &&
	    az_slot_kind(flags) == AZ_KIND_PLAIN &&
	    sl->val == (u64)(unsigned long)from &&
	    az_slot_member(flags) == fm &&
	    (from_pack || az_ref_read(&from->ref) == 2)) {
		sl->val = (u64)(unsigned long)to;
		sl->flags = (flags & ~AZ_SLOT_MEMBER_MASK) |
			    ((unsigned long)tm << AZ_SLOT_MEMBER_SHIFT);
		/* before a free of the slot can take it off again */
		if (from_pack)
			az_atomic64_dec(&s->packed_pages);
		else
			az_atomic64_inc(&s->packed_pages);
		done = true;
	}
	az_slot_unlock(sl);
	az_leaf_put(s, slot);
	az_obj_put(s, done ? from : to);
	return done;
}

/*
 * What candidate @o costs: its pool bytes and its header, unless it was
 * made for a DIRECT slot's page (which goes back to one if not packed).
 */
static u32 az_pack_cost(const struct az_obj *o)
{
	return az_obj_bytes(o) +
	       (az_obj_flag(o, AZ_OBJ_FROM_DIRECT) ? 0 : sizeof(*o));
}

/*
 * Pack the candidates @m[0..*@n) of slots @at[0..*@n): decoded (each checked
 * against its hash), encoded together, and, if that takes fewer bytes (pool and
 * headers) than they do, installed.  When *@n pages do not encode into one
 * object (at most the bytes they take now), one fewer is tried, down to two;
 * *@n is then the number tried last.  Returns the
 * slots now referring to the pack.  The candidates' own references stay with
 * the caller.
 */
static u32 az_pack_one(struct az_store *s, struct az_ctx *ctx,
		       const struct az_policy *pol, const u64 *at,
		       struct az_obj **m, u32 *n)
{
	struct az_reserve res = { 0 };
	struct az_obj *p;
	unsigned long h2;
	u32 i, have = 0, size = 0, got = 0, took = 0, in = 0;
	u8 *page, enc = 0;
	int err;

	ctx->kid = 0;	/* ctx->kbuf gets the candidates */
	for (i = 0; i < *n; i++) {
		page = ctx->kbuf + i * AZ_PAGE_SIZE;
		if (az_obj_read(s, ctx, m[i], page) ||
		    az_hash_tag(az_xxh64(page, AZ_PAGE_SIZE, 0)) != m[i]->hash)
			return 0;
	}
	for (;;) {
		for (i = 0, have = 0; i < *n; i++)
			have += az_pack_cost(m[i]);
		size = az_encode_pack(ctx, pol, ctx->kbuf, *n, ctx->obuf,
				      az_min(az_obj_max(pol), have), &enc);
		if (size || *n == 2)
			break;
		(*n)--;
	}
	if (!size || size + (az_obj_split(size) ? AZ_SPLIT_LINK : 0) +
		     sizeof(*p) >= have)
		return 0;
	/*
	 * No-wait: a pack is an optimisation, never worth waiting for.  Past
	 * mem_limit too: it takes fewer bytes than it frees (or is undone).
	 */
	p = az_obj_get(s, &res, size, &h2, &err, true);
	if (!p)
		return 0;
	p->enc = enc;
	p->owner = m[0]->owner;
	p->group = m[0]->group;
	p->pack_pages = *n;
	p->pack_id = az_atomic64_inc_return(&az_pack_ids);
	p->hash = az_hash_tag(az_xxh64(ctx->kbuf, *n * AZ_PAGE_SIZE, 0));
	az_obj_write(s, ctx, p, h2, ctx->obuf);
	az_obj_account(s, p, false);
	az_atomic64_inc(&s->packs);
	az_pack_race_point(s);
	for (i = 0; i < *n; i++) {
		if (az_pack_move(s, at[i], m[i], 0, p, i)) {
			got++;
			took += az_pack_cost(m[i]);
			in |= 1U << i;
		}
	}
	/* slots freed or rewritten meanwhile: keep the pack only if it pays */
	if (got < 2 || az_obj_bytes(p) + sizeof(*p) >= took) {
		for (i = 0; i < *n; i++)
			if (in & (1U << i))
				az_pack_move(s, at[i], p, i, m[i], 0);
		got = 0;
	}
	az_obj_put(s, p);	/* ours: the pack goes if no slot took it */
	return got;
}

int az_store_pack(struct az_store *s, struct az_ctx *ctx, u64 first, u64 nr,
		  u64 *packed)
{
	struct az_obj *m[AZ_PACK_MAX];
	u64 at[AZ_PACK_MAX];
	struct az_policy pol;
	u64 slot, end;
	u32 i, n;
	bool other = false;
	u16 own;

	*packed = 0;
	if (first > s->nr_slots || nr > s->nr_slots - first)
		return -EINVAL;
	az_policy_snapshot(s, &pol);
	end = first + nr;
	for (slot = first; slot < end;) {
		/*
		 * A run: the candidates of one sandbox within AZ_PACK_SPAN
		 * slots of its first, skipping what is no candidate (its
		 * duplicates and deltas, other sandboxes' too); it ends at a
		 * candidate of another sandbox, where the next run starts.
		 */
		own = 0;
		n = 0;
		for (; slot < end && n < AZ_PACK_MAX &&
		     (!n || slot - at[0] < AZ_PACK_SPAN); slot++) {
			m[n] = az_pack_candidate(s, ctx, slot, &own, &other);
			if (m[n])
				at[n++] = slot;
			else if (other)
				break;
		}
		if (n >= 2) {
			i = n;
			*packed += az_pack_one(s, ctx, &pol, at, m, &i);
			/* fewer tried: the rest may pack with what follows */
			if (i < n)
				slot = at[i];
		}
		for (i = 0; i < n; i++)
			az_pack_candidate_put(s, at[i], m[i]);
		az_cond_resched();	/* a run may have encoded a pack */
	}
	return 0;
}

int az_store_slot_kind(struct az_store *s, u64 slot)
{
	return az_store_slot_info(s, slot, NULL);
}

int az_store_slot_info(struct az_store *s, u64 slot, u32 *bytes)
{
	struct az_slot *sl;
	unsigned long flags;
	u32 size = 0;

	if (slot >= s->nr_slots)
		return -EINVAL;
	sl = az_slot_hold(s, slot);
	if (!sl)
		return -ENOENT;
	az_slot_lock(sl);
	flags = sl->flags;
	/* The slot holds a reference on its object: its size is stable here. */
	if ((flags & AZ_SLOT_USED) && az_slot_kind(flags) != AZ_KIND_SAME) {
		struct az_obj *o = (struct az_obj *)(unsigned long)sl->val;

		if (flags & AZ_SLOT_DIRECT)
			size = az_size_bytes(az_slot_size(flags));
		else if (az_enc_is_pack(o->enc))	/* its share */
			size = az_obj_bytes(o) / o->pack_pages;
		else
			size = az_obj_bytes(o);
	}
	az_slot_unlock(sl);
	az_leaf_put(s, slot);
	if (!(flags & AZ_SLOT_USED))
		return -ENOENT;
	if (bytes)
		*bytes = size;
	return az_slot_kind(flags);
}

/*
 * Snapshot-file template page: a base keyed by @index in @tid's group,
 * held by the template index (no slot).
 */
int az_store_template_load_nowait(struct az_store *s, struct az_ctx *ctx,
				  u64 tid, u64 index, const void *page,
				  struct az_reserve *res)
{
	struct az_policy pol;
	struct az_page_info pi = { .owner = tid, .index = index };
	struct az_tchunk *t;
	struct az_choice c;
	struct az_pin pin;
	struct az_obj *o;
	unsigned long h2;
	u64 word, hash, sf[AZ_NR_SF];
	int err = 0;

	az_policy_snapshot(s, &pol);
	az_owner_pin(s, tid, &pin);
	if (!pin.tmpl) {
		err = -ENOENT;
		goto out;
	}
	if (az_page_same(page, &word))
		goto out;	/* a delta against a same page gains nothing */
	hash = az_xxh64(page, AZ_PAGE_SIZE, 0);
	az_sim_features(page, sf);
	az_choose(s, ctx, &pol, page, &pi, &pin, hash, sf, &c, &o, false);
	if (o) {
		if (az_tchunk_get(s, res, pin.group, index, &t, &err))
			err = az_template_set(s, pin.group, index, pin.idx, o, t);
		if (err == -ENOMEM && !res->filled)
			err = -EAGAIN;	/* again, with a chunk reserved */
		if (err == -EAGAIN)
			az_reserve_want(res, 0, false, true);
		az_obj_put(s, o);
		goto out;
	}
	o = az_obj_get(s, res, c.size, &h2, &err, false);
	if (o && !az_tchunk_get(s, res, pin.group, index, &t, &err)) {
		az_obj_unget(s, o, h2);
		o = NULL;
	}
	if (!o) {
		if (err == -EAGAIN)
			az_reserve_want(res, c.size, true, true);
		goto out;
	}
	o->enc = c.enc;
	o->owner = pin.idx;
	o->group = pin.group;
	o->hash = az_hash_tag(hash);
	az_obj_write(s, ctx, o, h2, c.size == AZ_PAGE_SIZE ? page : c.buf);
	az_obj_account(s, o, true);
	az_index_insert(s, o, pol.xdelta ? sf : NULL, false);
	err = az_template_set(s, pin.group, index, pin.idx, o, t);
	az_obj_put(s, o);	/* the entry's reference, or none: freed */
	if (err == -ENOMEM && !res->filled) {
		err = -EAGAIN;	/* again, with a chunk reserved */
		az_reserve_want(res, c.size, true, true);
	}
out:
	if (err == -ENOMEM)
		az_atomic64_inc(&s->failed_stores);
	az_owner_unpin(s, &pin);
	return err;
}

int az_store_template_load(struct az_store *s, struct az_ctx *ctx, u64 tid,
			   u64 index, const void *page)
{
	struct az_reserve res = { 0 };
	int err;

	err = az_store_template_load_nowait(s, ctx, tid, index, page, &res);
	if (err == -EAGAIN) {
		err = az_reserve_fill(s, &res);
		if (!err)
			err = az_store_template_load_nowait(s, ctx, tid, index,
							    page, &res);
	}
	az_reserve_release(s, &res);
	az_index_resize(s);
	return err;
}

u64 az_store_pool_bytes(struct az_store *s)
{
	return az_pool_bytes(s->pool);
}

void az_store_get_stats(struct az_store *s, struct az_stats *st)
{
	unsigned int k;

	memset(st, 0, sizeof(*st));
	st->pages_stored = az_atomic64_read(&s->pages_stored);
	st->orig_bytes = st->pages_stored * AZ_PAGE_SIZE;
	st->stored_bytes = az_atomic64_read(&s->stored_bytes);
	st->pool_bytes = az_pool_bytes(s->pool);
	st->index_bytes = az_index_bytes(s, &st->index_table_bytes,
					 &st->tnode_bytes);
	st->objects = az_atomic64_read(&s->objects);
	st->base_cache_pages = az_store_get_base_cache(s);
	st->base_cache_hits = az_atomic64_read(&s->bc_hits);
	st->base_cache_misses = az_atomic64_read(&s->bc_misses);
	st->compacted_bytes = az_atomic64_read(&s->compacted_bytes);
	st->slot_bytes = s->nr_dir * sizeof(*s->dir) +
			 az_atomic64_read(&s->leaves) * AZ_LEAF_BYTES;
	st->slot_used_bytes = st->pages_stored * sizeof(struct az_slot);
	st->owner_bytes = az_owner_bytes(s);
	/* The objects' index fields are in sizeof(struct az_obj): once. */
	st->direct_pages = az_atomic64_read(&s->direct);
	st->obj_meta_bytes = (st->objects - st->direct_pages) *
			     sizeof(struct az_obj);
	st->base_cache_bytes = az_bcache_bytes(s);
	st->meta_bytes = st->slot_bytes + st->owner_bytes +
			 st->obj_meta_bytes + st->index_table_bytes +
			 st->tnode_bytes + st->base_cache_bytes;
	st->template_bytes = az_atomic64_read(&s->template_bytes);
	for (k = 0; k < AZ_NR_KINDS; k++)
		st->kind_pages[k] = az_atomic64_read(&s->kind_pages[k]);
	st->bases = az_atomic64_read(&s->bases);
	st->failed_stores = az_atomic64_read(&s->failed_stores);
	st->failed_loads = az_atomic64_read(&s->failed_loads);
	st->stores = az_atomic64_read(&s->stores);
	st->loads = az_atomic64_read(&s->loads);
	st->frees = az_atomic64_read(&s->frees);
	st->template_pages = az_atomic64_read(&s->template_pages);
	st->cross_group = az_atomic64_read(&s->cross_group);
	st->template_lost = az_atomic64_read(&s->template_lost);
	st->deferred = az_atomic64_read(&s->deferred);
	st->packs = az_atomic64_read(&s->packs);
	st->packed_pages = az_atomic64_read(&s->packed_pages);
	az_sim_stats(s, st);
}
