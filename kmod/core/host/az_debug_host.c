// SPDX-License-Identifier: GPL-2.0
/*
 * Host-only test hooks over the core's internals: corrupt a stored
 * object, run the encoders and the decoder on caller buffers.  Never
 * built into the module.
 */
#include <stdlib.h>

#include "az_debug_host.h"

/*
 * XOR @xor into byte @lo + @off % (@len - @lo) of the object at @h (@len
 * bytes).
 */
static void az_debug_xor(struct az_pool *pool, unsigned long h, u32 len,
			 u32 lo, u32 off, u8 xor)
{
	u8 buf[AZ_PAGE_SIZE];
	const u8 *p = az_pool_read_begin(pool, h, len, buf);

	if (p != buf)
		memcpy(buf, p, len);
	az_pool_read_end(pool, h, len, p);
	buf[lo + off % (len - lo)] ^= xor;
	az_pool_write(pool, h, buf, len);
}

/*
 * XOR @xor into byte @off (modulo @size) of the split object at @h (@size
 * bytes): of its first allocation's data or of its second allocation.
 */
static void az_debug_xor_split(struct az_store *s, unsigned long h,
			       u32 size, u32 off, u8 xor)
{
	off %= size;
	if (off < AZ_SPLIT_DATA)
		az_debug_xor(s->pool, h, AZ_SPLIT_HEAD, AZ_SPLIT_LINK, off,
			     xor);
	else
		az_debug_xor(s->pool, az_split_link(s, h),
			     size - AZ_SPLIT_DATA, 0, off - AZ_SPLIT_DATA, xor);
}

/* XOR @xor into byte @off (modulo the size) of @slot's object. */
int az_store_debug_corrupt(struct az_store *s, u64 slot, u32 off, u8 xor)
{
	struct az_slot *sl;
	struct az_obj *o;
	int err = 0;

	if (slot >= s->nr_slots)
		return -EINVAL;
	sl = az_slot_hold(s, slot);
	if (!sl)
		return -ENOENT;
	az_bit_lock(AZ_SLOT_LOCK_BIT, &sl->flags);
	if (!(sl->flags & AZ_SLOT_USED) ||
	    ((sl->flags & AZ_SLOT_KIND_MASK) >> AZ_SLOT_KIND_SHIFT) ==
	    AZ_KIND_SAME) {
		err = -ENOENT;
		goto out;
	}
	if (sl->flags & AZ_SLOT_DIRECT) {
		unsigned long h = (unsigned long)sl->val;
		u32 size = az_slot_size(sl->flags);

		if (az_obj_split(size))
			az_debug_xor_split(s, h, size, off, xor);
		else
			az_debug_xor(s->pool, h, size, 0, off, xor);
		goto out;
	}
	o = (struct az_obj *)(unsigned long)sl->val;
	/* Data, never the link to a split object's second part. */
	if (az_obj_split(o->size))
		az_debug_xor_split(s, o->handle, o->size, off, xor);
	else
		az_debug_xor(s->pool, o->handle, o->size, 0, off, xor);
out:
	az_bit_unlock(AZ_SLOT_LOCK_BIT, &sl->flags);
	az_leaf_put(s, slot);
	return err;
}

int az_store_debug_corrupt_link(struct az_store *s, u64 slot, u8 xor)
{
	struct az_slot *sl;
	struct az_obj *o;
	int err = -ENOENT;

	if (slot >= s->nr_slots)
		return -EINVAL;
	sl = az_slot_hold(s, slot);
	if (!sl)
		return -ENOENT;
	az_bit_lock(AZ_SLOT_LOCK_BIT, &sl->flags);
	if ((sl->flags & AZ_SLOT_USED) && (sl->flags & AZ_SLOT_DIRECT) &&
	    az_obj_split(az_slot_size(sl->flags))) {
		az_debug_xor(s->pool, (unsigned long)sl->val, AZ_SPLIT_HEAD, 0,
			     0, xor);
		err = 0;
	} else if ((sl->flags & AZ_SLOT_USED) &&
		   !(sl->flags & AZ_SLOT_DIRECT) &&
		   az_slot_kind(sl->flags) != AZ_KIND_SAME) {
		o = (struct az_obj *)(unsigned long)sl->val;
		if (az_obj_split(o->size)) {
			az_debug_xor(s->pool, o->handle, AZ_SPLIT_HEAD, 0, 0,
				     xor);
			err = 0;
		}
	}
	az_bit_unlock(AZ_SLOT_LOCK_BIT, &sl->flags);
	az_leaf_put(s, slot);
	return err;
}

/*
 * Decode @size bytes at @obj (copied to an exact-size heap block so that
 * ASan sees any overread) into @page.
 */
int az_debug_decode(struct az_ctx *ctx, const u8 *obj, u32 size,
		    const void *base, void *page)
{
	u8 *copy = az_alloc(size ? size : 1, AZ_GFP_MAYSLEEP);
	int err;

	if (!copy)
		return -ENOMEM;
	memcpy(copy, obj, size);
	err = az_decode(ctx, copy, size, base, page);
	az_free(copy);
	return err;
}

/*
 * Encode @page as a shared object would be (a delta when @base is given:
 * against a numeric base, so that every delta form is tried).
 */
int az_debug_encode(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, const void *base, u8 *out)
{
	u8 enc;
	u32 n;

	if (!base) {
		n = az_encode_plain(ctx, pol, page, out, az_obj_max(pol), &enc);
		if (n == AZ_PAGE_SIZE)
			memcpy(out, page, AZ_PAGE_SIZE);
		return n;
	}
	n = az_encode_delta(ctx, pol, page, base, true, out, AZ_PAGE_SIZE,
			    &enc);
	return n ? (int)n : -ENOSPC;
}

/*
 * The lz4 compressor on exact-size copies of the caller's buffers (so that
 * ASan sees any overread; a dictionary when @dlen > 0).  A non-zero @next
 * first moves the number its table gives the next byte forward (to reach
 * the point where the table is cleared; -EINVAL backwards, which would
 * make old entries look current); returns the compressed size (0: it did
 * not fit in @cap) and the number after the call in *@after.
 */
int az_debug_lz4(struct az_ctx *ctx, const void *dict, int dlen,
		 const void *src, int len, void *dst, int cap, u32 next,
		 u32 *after)
{
	u8 *d = NULL, *s;
	int n = -ENOMEM;

	if (dlen < 0 || len < 0 || (next && next < ctx->lz4c.next))
		return -EINVAL;
	s = malloc(len ? len : 1);
	if (dlen)
		d = malloc(dlen);
	if (!s || (dlen && !d))
		goto out;
	memcpy(s, src, len);
	if (dlen)
		memcpy(d, dict, dlen);
	if (next)
		ctx->lz4c.next = next;
	n = dlen ? az_lz4_compress_dict(ctx, d, dlen, s, len, dst, cap) :
		   az_lz4_compress(ctx, s, len, dst, cap);
	*after = ctx->lz4c.next;
out:
	free(d);
	free(s);
	return n;
}

/* Encode @n pages as a pack would be: its size, or 0 (not below 15/16 page). */
int az_debug_encode_pack(struct az_ctx *ctx, const struct az_policy *pol,
			 const void *pages, u32 n, u8 *out)
{
	u8 enc;

	return (int)az_encode_pack(ctx, pol, pages, n, out, AZ_OBJ_MAX, &enc);
}

/* Decode a pack from a copy of exactly @size bytes: its page count or -EIO. */
int az_debug_decode_pack(struct az_ctx *ctx, const u8 *obj, u32 size,
			 void *pages)
{
	u8 *copy = az_alloc(size ? size : 1, AZ_GFP_MAYSLEEP);
	int n;

	if (!copy)
		return -ENOMEM;
	memcpy(copy, obj, size);
	n = az_decode_pack(ctx, copy, size, pages);
	az_free(copy);
	return n;
}

/*
 * Consistency check of the whole store (no concurrent use, deferred list
 * drained): every reachable object's refcount equals the references the
 * slots, the deltas and the template index hold; bases are never deltas;
 * sharing stays inside one trust group; unregistered pages never share;
 * the object count matches.  Returns 0, or -EUCLEAN after printing what
 * is wrong.
 */
struct az_chk {
	struct az_obj **v;
	size_t n, cap;
};

static int az_chk_add(struct az_chk *c, struct az_obj *o)
{
	if (c->n == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 1024;
		struct az_obj **v = realloc(c->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		c->v = v;
		c->cap = cap;
	}
	c->v[c->n++] = o;
	return 0;
}

static int az_ptr_cmp(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)*(void * const *)a;
	uintptr_t y = (uintptr_t)*(void * const *)b;

	return x < y ? -1 : x > y;
}

#define AZ_CHK(cond, ...) do {						\
	if (!(cond)) {							\
		fprintf(stderr, "azcore check: " __VA_ARGS__);		\
		fputc('\n', stderr);					\
		err = -EUCLEAN;						\
	}								\
} while (0)

u32 az_debug_nr_sf(void)
{
	return AZ_NR_SF;
}

u32 az_debug_leaf_slots(void)
{
	return AZ_LEAF_SLOTS;
}

int az_store_debug_check(struct az_store *s)
{
	struct az_chk refs = { 0 }, objs = { 0 };
	struct az_tchunk *t;
	struct az_defer_node *dn;
	size_t i, j, n0, uniq = 0, direct = 0, chunks = 0, packed = 0;
	size_t packs = 0, simmed = 0, waiting = 0;
	u64 slot;
	int err = 0;

	/* The slot table: a leaf exactly where a slot is used, counted. */
	for (i = 0, j = 0; i < s->nr_dir; i++) {
		struct az_leaf_dir *d = &s->dir[i];
		u32 used = 0, k;

		if (!d->leaf) {
			AZ_CHK(!az_atomic_read(&d->ref),
			       "leaf %zu: none but %d references", i,
			       az_atomic_read(&d->ref));
			continue;
		}
		j++;
		for (k = 0; k < AZ_LEAF_SLOTS; k++)
			used += !!(d->leaf[k].flags & AZ_SLOT_USED);
		AZ_CHK(used && (u32)az_atomic_read(&d->ref) == used,
		       "leaf %zu: %u slots used, %d references", i, used,
		       az_atomic_read(&d->ref));
	}
	AZ_CHK(j == az_atomic64_read(&s->leaves), "%zu leaves, %llu counted",
	       j, (unsigned long long)az_atomic64_read(&s->leaves));
	for (slot = 0; slot < s->nr_slots; slot++) {
		struct az_slot *leaf = s->dir[slot >> AZ_LEAF_SHIFT].leaf;
		struct az_slot *sl;
		unsigned int kind;
		u16 own;
		struct az_obj *o;

		if (!leaf) {
			slot |= AZ_LEAF_SLOTS - 1;
			continue;
		}
		sl = &leaf[slot & (AZ_LEAF_SLOTS - 1)];
		kind = (sl->flags & AZ_SLOT_KIND_MASK) >> AZ_SLOT_KIND_SHIFT;
		own = sl->flags & AZ_SLOT_OWNER_MASK;
		if (!(sl->flags & AZ_SLOT_USED) || kind == AZ_KIND_SAME)
			continue;
		if (sl->flags & AZ_SLOT_DIRECT) {
			AZ_CHK(kind == AZ_KIND_PLAIN || kind == AZ_KIND_RAW,
			       "direct slot %llu owner %u kind %u",
			       (unsigned long long)slot, own, kind);
			/* a link check only when split */
			AZ_CHK(az_obj_split(az_slot_size(sl->flags)) ||
			       !(sl->flags & AZ_SLOT_LINK_LO_MASK),
			       "direct slot %llu has a link check",
			       (unsigned long long)slot);
			/*
			 * split only if a registered owner's; RAW exactly
			 * when a whole page
			 */
			AZ_CHK((az_slot_size(sl->flags) == AZ_PAGE_SIZE) ==
			       (kind == AZ_KIND_RAW) &&
			       (own || !az_obj_split(az_slot_size(sl->flags))) &&
			       az_slot_size(sl->flags),
			       "direct slot %llu: %u bytes, kind %u",
			       (unsigned long long)slot,
			       az_slot_size(sl->flags), kind);
			AZ_CHK(!(az_owner_at(s, own)->flags & AZ_OWN_TEMPLATE),
			       "direct slot %llu of template owner %u",
			       (unsigned long long)slot, own);
			/* a direct group's page always has its check */
			AZ_CHK(!own ||
			       (sl->flags & az_slot_check_mask(sl->flags)),
			       "direct slot %llu of owner %u: no check",
			       (unsigned long long)slot, own);
			AZ_CHK(!az_obj_split(az_slot_size(sl->flags)) ||
			       az_link_check(az_split_link(s, sl->val)) ==
			       az_slot_link_check(sl->flags),
			       "direct slot %llu: link check",
			       (unsigned long long)slot);
			direct++;
			continue;
		}
		o = (struct az_obj *)(unsigned long)sl->val;
		if (az_chk_add(&refs, o) || az_chk_add(&objs, o))
			goto nomem;
		if (az_enc_is_pack(o->enc)) {
			packed++;
			AZ_CHK(kind == AZ_KIND_PLAIN && own && own == o->owner &&
			       az_slot_member(sl->flags) < o->pack_pages &&
			       o->pack_pages >= 2 &&
			       o->pack_pages <= AZ_PACK_MAX,
			       "slot %llu: page %u of a %u-page pack, kind %u owner %u/%u",
			       (unsigned long long)slot,
			       az_slot_member(sl->flags), o->pack_pages, kind,
			       own, o->owner);
		} else {
			AZ_CHK(!az_slot_member(sl->flags),
			       "slot %llu: a pack position without a pack",
			       (unsigned long long)slot);
		}
		AZ_CHK(!!az_obj_base(o) == (kind == AZ_KIND_TDELTA ||
					    kind == AZ_KIND_XDELTA) ||
		       kind == AZ_KIND_DUP, "slot %llu kind %u base %p",
		       (unsigned long long)slot, kind, (void *)az_obj_base(o));
		if (!own) {
			AZ_CHK(kind == AZ_KIND_PLAIN || kind == AZ_KIND_RAW,
			       "unregistered slot %llu shares (kind %u)",
			       (unsigned long long)slot, kind);
			AZ_CHK(!o->owner, "unregistered slot %llu -> owned obj",
			       (unsigned long long)slot);
		} else if (o->owner) {
			AZ_CHK(az_owner_at(s, own)->group == o->group,
			       "slot %llu group %u obj group %u",
			       (unsigned long long)slot,
			       az_owner_at(s, own)->group, o->group);
		} else {
			AZ_CHK(kind == AZ_KIND_PLAIN || kind == AZ_KIND_RAW,
			       "slot %llu registered but shares an unowned obj",
			       (unsigned long long)slot);
		}
	}
	for (i = 0; s->idx.tbuckets && i <= s->idx.tmask; i++) {
		for (t = s->idx.tbuckets[i]; t; t = t->next) {
			u32 used = 0;

			chunks++;
			AZ_CHK(t->first % AZ_TCHUNK == 0,
			       "template chunk at %llu",
			       (unsigned long long)t->first);
			for (j = 0; j < AZ_TCHUNK; j++) {
				struct az_obj *o = t->obj[j];

				if (!o)
					continue;
				used++;
				if (az_chk_add(&refs, o) ||
				    az_chk_add(&objs, o))
					goto nomem;
				AZ_CHK(!az_obj_base(o),
				       "template entry is a delta");
				AZ_CHK(o->group == t->group,
				       "template entry group %u obj group %u",
				       t->group, o->group);
			}
			AZ_CHK(used && used == t->used,
			       "template chunk holds %u entries, counts %u",
			       used, t->used);
		}
	}
	AZ_CHK(chunks == s->idx.tchunks, "%zu template chunks, %llu counted",
	       chunks, (unsigned long long)s->idx.tchunks);
	/*
	 * The indexes (no growth under way): each indexed object in the chain
	 * of its hash, each similarity entry in a set one of its keys maps to.
	 */
	AZ_CHK(!s->idx.dold && !s->idx.sold, "index tables half moved");
	for (i = 0, j = 0; s->idx.dbuckets && i <= s->idx.dmask; i++) {
		struct az_obj *o;

		for (o = s->idx.dbuckets[i]; o; o = o->dnext, j++) {
			bool later = az_obj_flag(o, AZ_OBJ_SIM_LATER);

			AZ_CHK((o->hash & s->idx.dmask) == i &&
			       az_obj_flag(o, AZ_OBJ_INDEXED),
			       "obj %p (hash %08x) in dedup bucket %zu",
			       (void *)o, o->hash, i);
			AZ_CHK(!later || (!o->nr_sf && !az_obj_base(o)),
			       "obj %p keeps keys for later and has entries",
			       (void *)o);
			simmed += !!o->nr_sf;
			waiting += later;
			/* Settled: entries where the group wants them. */
			AZ_CHK(s->idx.regroup || s->idx.regrouping ||
			       !(later || o->nr_sf) ||
			       az_sim_wanted(&s->idx, o, s->sim_sample) ==
			       !!o->nr_sf,
			       "obj %p: similarity entries not as its group",
			       (void *)o);
		}
	}
	AZ_CHK(j == s->idx.indexed, "%zu objects in dedup chains, %llu counted",
	       j, (unsigned long long)s->idx.indexed);
	AZ_CHK(simmed == s->idx.simmed && waiting == s->idx.later,
	       "%zu objects with similarity entries, %llu counted; %zu waiting, %llu counted",
	       simmed, (unsigned long long)s->idx.simmed, waiting,
	       (unsigned long long)s->idx.later);
	for (i = 0; s->idx.sim && i < (1UL << s->idx.sbits); i++) {
		u32 w, k;

		for (w = 0; w < AZ_SIM_WAYS; w++) {
			struct az_obj *o = s->idx.sim[i].obj[w];

			if (!o)
				continue;
			/* the way of one of its keys: its set and its tag */
			for (k = 0; k < o->nr_sf; k++)
				if (az_sim_setno(o->sim_key[k],
						 s->idx.sbits) == i &&
				    az_sim_tag(o->sim_key[k]) ==
				    s->idx.sim[i].tag[w])
					break;
			AZ_CHK(k < o->nr_sf && az_obj_flag(o, AZ_OBJ_INDEXED),
			       "obj %p in similarity set %zu way %u, not with the tag of a key of that set",
			       (void *)o, i, w);
		}
	}
	/* Objects waiting for the deferred free still hold their base. */
	for (dn = s->defer.head; dn; dn = dn->next) {
		struct az_obj *o = container_of(dn, struct az_obj, dnode);

		AZ_CHK(!az_ref_read(&o->ref), "deferred obj has refs");
		/* the last put unlinked it: its dedup link is this list's */
		AZ_CHK(!az_obj_flag(o, AZ_OBJ_INDEXED), "deferred obj indexed");
		if (az_obj_base(o) && (az_chk_add(&refs, o->base) ||
				       az_chk_add(&objs, o->base)))
			goto nomem;
	}
	/* Unique objects; each delta holds one reference to its base. */
	if (objs.n)
		qsort(objs.v, objs.n, sizeof(*objs.v), az_ptr_cmp);
	n0 = objs.n;
	for (i = 0; i < n0; i++) {
		struct az_obj *o = objs.v[i];

		if ((i && o == objs.v[i - 1]) || !az_obj_base(o))
			continue;
		if (az_chk_add(&refs, o->base) || az_chk_add(&objs, o->base))
			goto nomem;
		AZ_CHK(!az_obj_base(o->base), "delta chain deeper than 1");
		AZ_CHK(o->base->group == o->group && o->owner &&
		       o->base->owner, "delta across groups %u -> %u",
		       o->group, o->base->group);
		AZ_CHK(az_obj_flag(o->base, AZ_OBJ_BASE),
		       "base not flagged");
	}
	if (objs.n)
		qsort(objs.v, objs.n, sizeof(*objs.v), az_ptr_cmp);
	for (i = 0; i < objs.n; i++) {
		if (!i || objs.v[i] != objs.v[i - 1]) {
			uniq++;
			packs += az_enc_is_pack(objs.v[i]->enc);
		}
	}
	AZ_CHK(packed == (size_t)az_atomic64_read(&s->packed_pages),
	       "%zu packed slots, %llu counted", packed,
	       (unsigned long long)az_atomic64_read(&s->packed_pages));
	/* a pack no slot took is destroyed by the deferred free */
	AZ_CHK(packs + az_atomic64_read(&s->deferred) >=
	       (u64)az_atomic64_read(&s->packs) &&
	       packs <= (u64)az_atomic64_read(&s->packs),
	       "%zu packs reachable, %llu counted", packs,
	       (unsigned long long)az_atomic64_read(&s->packs));
	if (refs.n)
		qsort(refs.v, refs.n, sizeof(*refs.v), az_ptr_cmp);
	for (i = 0; i < refs.n; i = j) {
		for (j = i; j < refs.n && refs.v[j] == refs.v[i]; j++)
			;
		AZ_CHK((size_t)az_ref_read(&refs.v[i]->ref) == j - i,
		       "obj %p ref %d, expected %zu", (void *)refs.v[i],
		       az_ref_read(&refs.v[i]->ref), j - i);
	}
	AZ_CHK(direct == (size_t)az_atomic64_read(&s->direct),
	       "%zu direct slots, %llu counted", direct,
	       (unsigned long long)az_atomic64_read(&s->direct));
	AZ_CHK(uniq + direct + az_atomic64_read(&s->deferred) ==
	       az_atomic64_read(&s->objects), "objects %llu reachable %zu",
	       (unsigned long long)az_atomic64_read(&s->objects), uniq);
	AZ_CHK(!az_atomic64_read(&s->cross_group), "cross_group != 0");
	free(refs.v);
	free(objs.v);
	return err;
nomem:
	free(refs.v);
	free(objs.v);
	return -ENOMEM;
}

/*
 * Batch calls for replay and benchmarks (one ctypes call per batch):
 * page i of @pages goes to slot @first + i with @pi[i] (or no info).
 * Return the number done before the first error, or the error if none.
 */
int az_host_put_batch(struct az_store *s, struct az_ctx *ctx, u64 first,
		      const u8 *pages, u32 n, const struct az_page_info *pi)
{
	u32 i;
	int err;

	for (i = 0; i < n; i++) {
		err = az_store_put(s, ctx, first + i,
				   pages + (size_t)i * AZ_PAGE_SIZE,
				   pi ? &pi[i] : NULL);
		if (err)
			return i ? (int)i : err;
	}
	return n;
}

int az_host_get_batch(struct az_store *s, struct az_ctx *ctx, u64 first,
		      u8 *pages, u32 n)
{
	u32 i;
	int err;

	for (i = 0; i < n; i++) {
		err = az_store_get(s, ctx, first + i,
				   pages + (size_t)i * AZ_PAGE_SIZE);
		if (err)
			return i ? (int)i : err;
	}
	return n;
}

/* Times reg_lock was taken (tests: the put path must not take it). */
u64 az_store_debug_reg_lock_taken(struct az_store *s)
{
	return __atomic_load_n(&s->reg_lock.taken, __ATOMIC_SEQ_CST);
}

/*
 * Hold or release @slot's lock, as a reader decoding it would (its leaf
 * is allocated if need be and held while the lock is).
 */
int az_store_debug_slot_lock(struct az_store *s, u64 slot, int lock)
{
	struct az_reserve res = { 0 };
	struct az_slot *sl;
	int err = 0;

	if (slot >= s->nr_slots)
		return -EINVAL;
	if (lock) {
		sl = az_slot_hold_new(s, &res, slot, &err);
		if (!sl)
			return err;
		az_bit_lock(AZ_SLOT_LOCK_BIT, &sl->flags);
		return 0;
	}
	sl = az_slot_hold(s, slot);	/* the lock's hold is still there */
	if (!sl)
		return -ENOENT;
	az_bit_unlock(AZ_SLOT_LOCK_BIT, &sl->flags);
	az_leaf_put(s, slot);
	az_leaf_put(s, slot);
	return 0;
}

/*
 * The put armed by az_store_debug_pack_race(): made once, with a context
 * of its own, at the next race point of a pack of the store it was armed
 * for.  @state: AZ_RACE_IDLE -> ARMED -> RUNNING -> DONE (@err valid).
 */
enum { AZ_RACE_IDLE, AZ_RACE_ARMED, AZ_RACE_RUNNING, AZ_RACE_DONE };

static struct {
	int state;
	struct az_store *s;
	u64 slot;
	struct az_page_info pi;
	u8 page[AZ_PAGE_SIZE];
	int err;
} az_race;

void az_pack_race_point(struct az_store *s)
{
	int armed = AZ_RACE_ARMED;
	struct az_ctx *ctx;
	int err = -ENOMEM;

	if (__atomic_load_n(&az_race.s, __ATOMIC_ACQUIRE) != s ||
	    !__atomic_compare_exchange_n(&az_race.state, &armed,
					 AZ_RACE_RUNNING, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	ctx = az_ctx_create();
	if (ctx) {
		err = az_store_put(s, ctx, az_race.slot, az_race.page,
				   &az_race.pi);
		az_ctx_destroy(ctx);
	}
	az_race.err = err;
	__atomic_store_n(&az_race.state, AZ_RACE_DONE, __ATOMIC_RELEASE);
}

/*
 * Arm (@page not NULL) a put of @page into @slot of @s as @pi's owner,
 * made between the next pack's encoding and its install; with @page NULL,
 * disarm and return that put's result: -EAGAIN if it was not made,
 * -EBUSY while it runs.
 */
int az_store_debug_pack_race(struct az_store *s, u64 slot, const void *page,
			     const struct az_page_info *pi)
{
	int state = __atomic_load_n(&az_race.state, __ATOMIC_ACQUIRE);

	if (!page) {
		if (state == AZ_RACE_RUNNING)
			return -EBUSY;
		__atomic_store_n(&az_race.state, AZ_RACE_IDLE,
				 __ATOMIC_RELEASE);
		return state == AZ_RACE_DONE ? az_race.err : -EAGAIN;
	}
	if (state == AZ_RACE_ARMED || state == AZ_RACE_RUNNING)
		return -EBUSY;
	az_race.s = s;
	az_race.slot = slot;
	az_race.pi = *pi;
	memcpy(az_race.page, page, AZ_PAGE_SIZE);
	az_race.err = 0;
	__atomic_store_n(&az_race.state, AZ_RACE_ARMED, __ATOMIC_RELEASE);
	return 0;
}
