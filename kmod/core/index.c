// SPDX-License-Identifier: GPL-2.0
/*
 * The redundancy indexes: how a new page finds an identical or similar
 * stored page in its trust group.
 *
 *  dedup     xxh64 of the page -> chain of objects (az_obj.dnext).  Weak:
 *            holds no reference; an object is unlinked by the deferred
 *            free before its memory goes away.
 *  template  (trust group, page index) -> base object.  Strong: each node
 *            holds a reference, so a template page outlives the template's
 *            slot (and the template) while a node or a delta refers to it.
 *  similarity  super-feature -> object, a set-associative table of
 *            AZ_SIM_WAYS ways per set; inserting shifts the set so the
 *            oldest entry drops out (memory is fixed at create time).
 *            Weak, like dedup.  Only non-delta objects go in: a delta is
 *            never a base (depth 1).
 *
 * All three are protected by s->idx_lock (a spinlock, never held across
 * a decode or an allocation).  Lookups take a reference with
 * az_ref_inc_not_zero under the lock, so an object whose last
 * reference is gone (waiting for the deferred free) is never returned.
 * Every match is confirmed by group (and for dedup by a full memcmp)
 * before use: trust groups never share.
 */
#include "az_internal.h"

/*
 * Sizing, fixed when the first owner registers, from the number of slots:
 * one dedup bucket per 4 slots (8 bytes each) and one similarity entry
 * per s->sim_slots slots (10 bytes each; every non-delta object takes
 * AZ_NR_SF entries, the oldest drop out).  Measured with
 * tests/core/bench_core.py: halving the similarity table halves the
 * similar pages found on a full device of distinct pages.  A fleet of
 * snapshot-restored VMs, whose slots are mostly duplicates of template
 * bases (no index entry), needs fewer (docs/store.md: sim_slots).
 */
#define AZ_DEDUP_LOAD	4

static u32 az_pow2_below(u64 n, u32 min, u32 max)
{
	u32 p = min;

	while (p < max && (u64)p * 2 <= n)
		p *= 2;
	return p;
}

static void az_index_free(struct az_index *x)
{
	az_vfree(x->sim);
	az_vfree(x->tbuckets);
	az_vfree(x->dbuckets);
	x->sim = NULL;
	x->tbuckets = NULL;
	x->dbuckets = NULL;
}

/*
 * The indexes are allocated when the first owner is registered, so a
 * store that is only used zram-style pays nothing for them.  Process
 * context.  The tables are installed under reg_lock before any owner is
 * marked registered; puts only touch them after pinning a registered
 * owner under the same lock, which orders the accesses.
 */
int az_index_ensure(struct az_store *s)
{
	struct az_index x;
	u32 nd, nt, ns, slots;

again:
	if (s->idx.dbuckets)	/* racy peek; installed once, never freed */
		return 0;
	memset(&x, 0, sizeof(x));
	nd = az_pow2_below(s->nr_slots / AZ_DEDUP_LOAD, 256, 1U << 22);
	nt = az_pow2_below(s->nr_slots / 64, 64, 1U << 18);
	slots = AZ_READ_ONCE(s->sim_slots);
	ns = az_pow2_below(s->nr_slots / slots / AZ_SIM_WAYS, 64, 1U << 22);
	x.dbuckets = az_valloc(nd * sizeof(*x.dbuckets));
	x.tbuckets = az_valloc(nt * sizeof(*x.tbuckets));
	x.sim = az_valloc((size_t)ns * sizeof(*x.sim));
	if (!x.dbuckets || !x.tbuckets || !x.sim) {
		az_index_free(&x);
		return -ENOMEM;
	}
	x.dmask = nd - 1;
	x.tmask = nt - 1;
	x.smask = ns - 1;
	x.table_bytes = nd * sizeof(*x.dbuckets) + nt * sizeof(*x.tbuckets) +
			(u64)ns * sizeof(*x.sim);

	az_spin_lock(&s->reg_lock);
	if (!s->idx.dbuckets && slots != s->sim_slots) {
		/* az_store_set_sim_slots() ran meanwhile: size it again. */
		az_spin_unlock(&s->reg_lock);
		az_index_free(&x);
		goto again;
	}
	if (!s->idx.dbuckets) {
		s->idx = x;
		x.dbuckets = NULL;
		x.tbuckets = NULL;
		x.sim = NULL;
	}
	az_spin_unlock(&s->reg_lock);
	az_index_free(&x);
	return 0;
}

int az_store_set_sim_slots(struct az_store *s, u32 slots)
{
	int ret = 0;

	if (!az_sim_slots_valid(slots))
		return -EINVAL;
	az_spin_lock(&s->reg_lock);
	if (s->idx.dbuckets)
		ret = slots == s->sim_slots ? 0 : -EBUSY;
	else
		AZ_WRITE_ONCE(s->sim_slots, slots);
	az_spin_unlock(&s->reg_lock);
	return ret;
}

u32 az_store_get_sim_slots(struct az_store *s)
{
	return AZ_READ_ONCE(s->sim_slots);
}

void az_index_destroy(struct az_store *s)
{
	AZ_WARN_ON(s->idx.tchunks);
	az_index_free(&s->idx);
}

/*
 * Index memory: the tables (@table_bytes) and the template chunks
 * (@tnode_bytes), the memory of the index itself, plus the per-object
 * index fields (hash, chain link, similarity positions) of indexed
 * objects, which live in struct az_obj.
 */
u64 az_index_bytes(struct az_store *s, u64 *table_bytes, u64 *tnode_bytes)
{
	struct az_index *x = &s->idx;

	*table_bytes = AZ_READ_ONCE(x->table_bytes);
	*tnode_bytes = AZ_READ_ONCE(x->tchunks) * AZ_TCHUNK_BYTES;
	return *table_bytes + *tnode_bytes +
	       AZ_READ_ONCE(x->indexed) * (sizeof(u32) + sizeof(void *) +
					    AZ_NR_SF * sizeof(u32));
}

static inline u64 az_mix(u64 v)
{
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdULL;
	v ^= v >> 33;
	v *= 0xc4ceb9fe1a85ec53ULL;
	v ^= v >> 33;
	return v;
}

/* ---- dedup ------------------------------------------------------------ */

static inline u32 az_dbucket(struct az_index *x, u32 tag)
{
	return tag & x->dmask;
}

#define AZ_DEDUP_CANDS	4

struct az_obj *az_dedup_find(struct az_store *s, struct az_ctx *ctx,
			     u32 group, u64 hash, const void *page,
			     bool need_base)
{
	struct az_index *x = &s->idx;
	struct az_obj *cand[AZ_DEDUP_CANDS], *o, *found = NULL;
	u32 tag = az_hash_tag(hash);
	int n = 0, i;

	az_spin_lock(&s->idx_lock);
	for (o = x->dbuckets[az_dbucket(x, tag)]; o && n < AZ_DEDUP_CANDS;
	     o = o->dnext) {
		if (o->hash != tag || o->group != group)
			continue;
		if (need_base && az_obj_base(o))
			continue;
		if (az_ref_inc_not_zero(&o->ref))
			cand[n++] = o;
	}
	az_spin_unlock(&s->idx_lock);

	for (i = 0; i < n; i++) {
		o = cand[i];
		if (!found && !az_obj_read(s, ctx, o, ctx->pbuf) &&
		    !memcmp(ctx->pbuf, page, AZ_PAGE_SIZE)) {
			found = o;
			continue;
		}
		az_obj_put(s, o);
	}
	if (found && AZ_WARN_ON(found->group != group || !found->owner)) {
		az_atomic64_inc(&s->cross_group);
		az_obj_put(s, found);
		found = NULL;
	}
	return found;
}

/* ---- similarity ------------------------------------------------------- */

/*
 * Features of a page: hash each AZ_SIM_BLOCK-byte block, keep
 * AZ_NR_SF * AZ_SIM_PER_SF min-hash values (minimum over the blocks of a
 * different odd-multiplier permutation of the block hash) and fold each
 * group of AZ_SIM_PER_SF into one super-feature.  Two pages share a
 * super-feature with probability ~J^AZ_SIM_PER_SF where J is the Jaccard
 * similarity of their block sets; small blocks keep J high when a page
 * differs by scattered 8-byte fields (pointers, counters).
 *
 * A word that looks like a user-space pointer (az_user_ptr_like()) is hashed
 * by its offset in its page only: address-space randomisation moves each
 * mapping by whole pages, so a page of another process that holds the same
 * objects at other addresses keeps its features (the delta encoder's
 * word-wise difference then stores the moves).
 */
#define AZ_SIM_BLOCK	AZ_SIM_BLOCK_SIZE
#define AZ_SIM_FEAT	(AZ_NR_SF * AZ_SIM_PER_SF)

static inline u64 az_sim_word(u64 w)
{
	return az_user_ptr_like(w) ? (w & 0xfff) | (1ULL << 63) : w;
}

void az_sim_features(const void *page, u64 *sf)
{
	const u64 *w = page;
	u64 feat[AZ_SIM_FEAT], mul[AZ_SIM_FEAT];
	unsigned int b, i, j;

	for (i = 0; i < AZ_SIM_FEAT; i++) {
		feat[i] = ~0ULL;
		mul[i] = az_mix(0x9e3779b97f4a7c15ULL * (i + 1)) | 1;
	}
	for (b = 0; b < AZ_PAGE_SIZE / AZ_SIM_BLOCK; b++) {
		const u64 *p = w + b * (AZ_SIM_BLOCK / sizeof(u64));
		u64 h = 0x27d4eb2f165667c5ULL;

		for (j = 0; j < AZ_SIM_BLOCK / sizeof(u64); j++)
			h = (h ^ az_sim_word(p[j])) * 0x100000001b3ULL +
			    (h >> 29);
		h = az_mix(h);
		for (i = 0; i < AZ_SIM_FEAT; i++) {
			u64 v = h * mul[i];

			if (v < feat[i])
				feat[i] = v;
		}
	}
	for (i = 0; i < AZ_NR_SF; i++) {
		u64 x = 0;

		for (j = 0; j < AZ_SIM_PER_SF; j++)
			x = az_mix(x ^ feat[i * AZ_SIM_PER_SF + j]);
		sf[i] = x;
	}
}

static inline u64 az_sim_key(u32 group, unsigned int i, u64 sf)
{
	/* The key binds the feature to its trust group and position. */
	return az_mix(sf ^ az_mix(((u64)group << 8) | i));
}

static inline u32 az_sim_pos(const struct az_index *x, u64 key)
{
	return (u32)key & x->smask;
}

static inline u16 az_sim_tag(u64 key)
{
	return (u16)(key >> 48);
}

int az_sim_find(struct az_store *s, u32 group, const u64 *sf,
		struct az_obj **out, int max)
{
	struct az_index *x = &s->idx;
	struct az_sim_set *e;
	unsigned int i, w;
	int n = 0, k;
	u64 key;

	az_spin_lock(&s->idx_lock);
	for (i = 0; i < AZ_NR_SF && n < max; i++) {
		key = az_sim_key(group, i, sf[i]);
		e = &x->sim[az_sim_pos(x, key)];
		for (w = 0; w < AZ_SIM_WAYS && n < max; w++) {
			struct az_obj *o = e->obj[w];

			if (!o || e->tag[w] != az_sim_tag(key) ||
			    o->group != group || !o->owner || az_obj_base(o))
				continue;
			for (k = 0; k < n; k++)
				if (out[k] == o)
					break;
			if (k < n)
				continue;
			if (az_ref_inc_not_zero(&o->ref))
				out[n++] = o;
		}
	}
	az_spin_unlock(&s->idx_lock);
	return n;
}

/* ---- insert / remove -------------------------------------------------- */

void az_index_insert(struct az_store *s, struct az_obj *o, const u64 *sf)
{
	struct az_index *x = &s->idx;
	struct az_sim_set *e;
	unsigned int i;
	u32 b = az_dbucket(x, o->hash);
	u64 key;

	az_spin_lock(&s->idx_lock);
	o->dnext = x->dbuckets[b];
	x->dbuckets[b] = o;
	o->nr_sf = 0;
	if (sf && !az_obj_base(o)) {
		for (i = 0; i < AZ_NR_SF; i++) {
			key = az_sim_key(o->group, i, sf[i]);
			o->sim_pos[i] = az_sim_pos(x, key);
			e = &x->sim[o->sim_pos[i]];
			/* Drop the oldest way, newest first. */
			memmove(&e->tag[1], &e->tag[0],
				(AZ_SIM_WAYS - 1) * sizeof(e->tag[0]));
			memmove(&e->obj[1], &e->obj[0],
				(AZ_SIM_WAYS - 1) * sizeof(e->obj[0]));
			e->tag[0] = az_sim_tag(key);
			e->obj[0] = o;
		}
		o->nr_sf = AZ_NR_SF;
	}
	AZ_WRITE_ONCE(x->indexed, x->indexed + 1);
	az_obj_flag_set(o, AZ_OBJ_INDEXED);
	az_spin_unlock(&s->idx_lock);
}

void az_index_remove(struct az_store *s, struct az_obj *o)
{
	struct az_index *x = &s->idx;
	struct az_obj **pp;
	struct az_sim_set *e;
	unsigned int i, w;

	az_spin_lock(&s->idx_lock);
	for (pp = &x->dbuckets[az_dbucket(x, o->hash)]; *pp;
	     pp = &(*pp)->dnext) {
		if (*pp == o) {
			*pp = o->dnext;
			break;
		}
	}
	for (i = 0; i < o->nr_sf; i++) {
		e = &x->sim[o->sim_pos[i]];
		for (w = 0; w < AZ_SIM_WAYS; w++)
			if (e->obj[w] == o)
				e->obj[w] = NULL;
	}
	AZ_WRITE_ONCE(x->indexed, x->indexed - 1);
	az_spin_unlock(&s->idx_lock);
}

/* ---- template index --------------------------------------------------- */

static inline u64 az_tfirst(u64 index)
{
	return index - index % AZ_TCHUNK;
}

static inline u32 az_tbucket(struct az_index *x, u32 group, u64 first)
{
	return (u32)az_mix(first / AZ_TCHUNK ^ ((u64)group << 40)) & x->tmask;
}

/* The chunk holding (@group, @first) in bucket @b, under idx_lock. */
static struct az_tchunk *az_tchunk_find(struct az_index *x, u32 b,
					u32 group, u64 first)
{
	struct az_tchunk *c;

	for (c = x->tbuckets[b]; c; c = c->next)
		if (c->first == first && c->group == group)
			return c;
	return NULL;
}

struct az_obj *az_template_find(struct az_store *s, u32 group, u64 index)
{
	struct az_index *x = &s->idx;
	u64 first = az_tfirst(index);
	struct az_tchunk *c;
	struct az_obj *o = NULL;

	az_spin_lock(&s->idx_lock);
	c = az_tchunk_find(x, az_tbucket(x, group, first), group, first);
	if (c && c->obj[index - first] &&
	    az_ref_inc_not_zero(&c->obj[index - first]->ref))
		o = c->obj[index - first];
	az_spin_unlock(&s->idx_lock);
	if (o && AZ_WARN_ON(o->group != group || az_obj_base(o))) {
		az_atomic64_inc(&s->cross_group);
		az_obj_put(s, o);
		o = NULL;
	}
	return o;
}

bool az_template_covered(struct az_store *s, u32 group, u64 index)
{
	struct az_index *x = &s->idx;
	u64 first = az_tfirst(index);
	bool ret;

	az_spin_lock(&s->idx_lock);
	ret = az_tchunk_find(x, az_tbucket(x, group, first), group, first);
	az_spin_unlock(&s->idx_lock);
	return ret;
}

int az_template_set(struct az_store *s, u32 group, u64 index, u16 owner,
		    struct az_obj *o, struct az_tchunk *nt)
{
	struct az_index *x = &s->idx;
	u64 first = az_tfirst(index);
	u32 b, i = index - first;
	struct az_tchunk *c;
	struct az_obj *old;
	u16 old_owner;

	if (az_obj_base(o)) {
		az_free(nt);
		return -EINVAL;
	}

	az_spin_lock(&s->idx_lock);
	b = az_tbucket(x, group, first);
	c = az_tchunk_find(x, b, group, first);
	if (!c) {
		/* Never waits: idx_lock is a spinlock. */
		c = nt ? nt : az_alloc(AZ_TCHUNK_BYTES, AZ_GFP_NOWAIT);
		if (!c) {
			az_spin_unlock(&s->idx_lock);
			return -ENOMEM;
		}
		nt = NULL;
		memset(c, 0, sizeof(*c));
		c->first = first;
		c->group = group;
		c->next = x->tbuckets[b];
		x->tbuckets[b] = c;
		AZ_WRITE_ONCE(x->tchunks, x->tchunks + 1);
	}
	old = c->obj[i];
	old_owner = c->owner[i];
	az_ref_inc(&o->ref);
	c->obj[i] = o;
	c->owner[i] = owner;
	if (!old)
		c->used++;
	az_spin_unlock(&s->idx_lock);

	az_free(nt);
	az_obj_mark_shared(s, o);
	az_atomic64_inc(&az_owner_at(s, owner)->loaded_pages);
	if (old) {
		az_atomic64_dec(&az_owner_at(s, old_owner)->loaded_pages);
		az_obj_put(s, old);
	} else {
		az_atomic64_inc(&s->template_pages);
	}
	return 0;
}

/*
 * Takes @owner's entries out of @c (under idx_lock) into @dead; unlinks
 * @c from *@pp when nothing is left in it.  Returns the entries taken.
 */
static u32 az_tchunk_take(struct az_index *x, struct az_tchunk **pp,
			  struct az_tchunk *c, u16 owner, struct az_obj **dead)
{
	u32 i, n = 0;

	for (i = 0; i < AZ_TCHUNK; i++) {
		if (!c->obj[i] || c->owner[i] != owner)
			continue;
		dead[n++] = c->obj[i];
		c->obj[i] = NULL;
		c->owner[i] = 0;
	}
	c->used -= n;
	if (n && !c->used) {
		*pp = c->next;
		AZ_WRITE_ONCE(x->tchunks, x->tchunks - 1);
	}
	return n;
}

/*
 * Walks the whole table, dropping idx_lock every 1024 buckets and after
 * each chunk that held entries of @owner: their references are put (which
 * may free an object, and that takes idx_lock) outside it.  The owner's
 * loaded_pages falls only once the walk is over (until then the owner is
 * not idle, so its index cannot be given to a new owner meanwhile).
 */
void az_template_drop_owner(struct az_store *s, u16 owner)
{
	struct az_index *x = &s->idx;
	struct az_obj *dead[AZ_TCHUNK];
	struct az_tchunk **pp, *c, *gone;
	u32 b, i, n;
	u64 dropped = 0;

	if (!x->tbuckets)
		return;
	az_spin_lock(&s->idx_lock);
	for (b = 0; b <= x->tmask; b++) {
		if (b && !(b & 1023)) {
			az_spin_unlock(&s->idx_lock);
			az_cond_resched();
			az_spin_lock(&s->idx_lock);
		}
again:
		for (pp = &x->tbuckets[b]; (c = *pp); pp = &c->next) {
			n = az_tchunk_take(x, pp, c, owner, dead);
			if (!n)
				continue;
			gone = c->used ? NULL : c;
			az_spin_unlock(&s->idx_lock);
			az_free(gone);
			for (i = 0; i < n; i++)
				az_obj_put(s, dead[i]);
			dropped += n;
			az_spin_lock(&s->idx_lock);
			goto again;	/* the chain may have changed */
		}
	}
	az_spin_unlock(&s->idx_lock);
	az_atomic64_sub(dropped, &s->template_pages);
	az_atomic64_sub(dropped, &az_owner_at(s, owner)->loaded_pages);
}
