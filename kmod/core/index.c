// SPDX-License-Identifier: GPL-2.0
/*
 * The redundancy indexes: how a new page finds an identical or similar
 * stored page in its trust group.
 *
 *  dedup     xxh64 of the page -> chain of objects (az_obj.dnext).  Weak:
 *            holds no reference; the put of an object's last reference
 *            unlinks it (az_index_remove()) before the deferred free.
 *  template  (trust group, page index) -> base object.  Strong: each node
 *            holds a reference, so a template page outlives the template's
 *            slot (and the template) while a node or a delta refers to it.
 *  similarity  super-feature -> object, a set-associative table of
 *            AZ_SIM_WAYS ways per set; inserting shifts the set so the
 *            oldest entry drops out (the table follows use, see
 *            "Sizing" below, up to a cap).
 *            Weak, like dedup.  Only non-delta objects go in: a delta is
 *            never a base (depth 1).
 *
 * All three are protected by s->idx_lock (a spinlock, never held across
 * a decode or a sleeping allocation: a template chunk may be allocated
 * under it without waiting).  Lookups take a reference with
 * az_ref_inc_not_zero under the lock, so an object whose last
 * reference is gone (being unlinked by that put) is never returned.
 * Every match is confirmed by group (and for dedup by a full memcmp)
 * before use: trust groups never share.
 */
#include "az_internal.h"

/*
 * Sizing: the tables are allocated small when the first owner registers,
 * double as objects are indexed and halve as they go, so that their
 * memory follows what is stored, not the size of the device or what it
 * held once.  Their load: one dedup bucket
 * per AZ_DEDUP_LOAD indexed objects at most (8 bytes each), one
 * similarity entry per s->sim_slots objects with similarity entries (10
 * bytes each; every one takes AZ_NR_SF entries, the oldest drop out), one
 * template bucket per template chunk.  A table doubles past its load and
 * halves below an eighth of it, never below its starting size (so a size
 * never flips back and forth with a few objects).  Caps: what a device
 * full of indexed objects gets, one object per slot.  Measured with
 * tests/core/bench_core.py: halving the similarity table halves the
 * similar pages found among distinct pages.  A fleet of snapshot-restored
 * VMs, whose slots are mostly duplicates of template bases (no index
 * entry), needs fewer (docs/store.md: sim_slots).
 *
 * Resizing: an insert that takes a table past its load sets @resize and
 * wakes the deferred worker, which calls az_index_resize() (so do the
 * sleeping put wrappers and az_store_drain()); a remove below an eighth
 * of the load sets it too (removes run in the last put, which queues the
 * object for that worker: it resizes after its frees).  It allocates the
 * new table outside idx_lock, then moves the entries over in steps of
 * AZ_MOVE_STEP old buckets under idx_lock, dropping it between steps.
 * While a dedup or similarity table is being
 * moved, an old bucket (set) below @dmoved (@smoved) has its entries in
 * the new table and the others are still in the old one: lookups,
 * inserts and removes pick the table by that rule (az_dhead(),
 * az_sim_head()), which holds for any new size because a bucket (set)
 * is moved whole.  The template table (a chunk per 48 template pages:
 * small) is rehashed in one step.
 *
 * Sparse similarity entries: a trust group whose lookups find few bases
 * (a fleet forked from its template finds its bases by page index, in the
 * template index) does not pay for entries of every object.  Each group
 * (hashed into AZ_SIM_GROUPS buckets) counts its lookups (a put's first
 * attempt) and the similarity deltas stored from them; once AZ_SIM_WINDOW
 * lookups are counted it is judged and the counts halved (so every half
 * window after the first).  A dense group (every object has entries) that
 * found fewer than 1 base per AZ_SIM_SPARSE_BELOW lookups turns sparse:
 * only 1 in s->sim_sample of its objects gets entries; the others keep
 * their keys (AZ_OBJ_SIM_LATER).  A sparse group whose sampled entries
 * found 1 base per AZ_SIM_DENSE_FROM lookups (scaled by the sample, and
 * at least AZ_SIM_DENSE_MIN_HITS) turns dense again.  A switch starts the
 * group's lookups and hits afresh and asks az_index_resize() to walk every
 * indexed object (the dedup chains hold them all) and link or unlink
 * entries to match, the similarity table sized to fit them; until that is
 * done no group is judged or counted, so a judgement never mixes the two
 * states.
 * The entries follow, the keys stay: a group that switches loses nothing
 * it could find again.
 *
 * Private pages without an object: in a sparse group, a sandbox's plain
 * page that no later page finds as a duplicate needs no object either
 * (48 bytes; a forked fleet's own plain pages are 30-80% of its pages).
 * Each group also counts the pages found as duplicates of its sandboxes'
 * plain pages (not a template's, not a delta's), judged apart from its
 * similarity hits, on its own count of lookups (restarted whenever the
 * duplicates start being counted another way), every half window once
 * that count fills one: a group that found fewer than 1 per
 * AZ_SIM_SPARSE_BELOW lookups turns direct, once sandboxes other than its
 * first (while that one is registered) made AZ_SIM_OTHERS of them (the
 * first alone had nobody's pages to find).  A new sim_sample starts the
 * lookup, hit and duplicate counts afresh.  While it is sparse and direct,
 * its plain pages that are not sampled go to DIRECT slots (pool handle,
 * size and check bits in the slot, charged to their owner), found by no
 * later page; the sampled ones stay objects, and the duplicates found of
 * them, scaled by the sample, turn the group back (1 per
 * AZ_SIM_DENSE_FROM, at least AZ_SIM_DENSE_MIN_HITS).  A dense spell
 * (every page an object) keeps the judgement.  Nothing is walked: a page
 * stored direct stays so until freed (az_store_pack() gives one an object
 * to join a pack).
 */
#define AZ_DEDUP_LOAD	4
/*
 * Similarity entries wanted per object (with sim_slots 1): room for all of
 * them.  Replayed coding-agent fleets of fresh processes found a third fewer
 * near-duplicates with one entry per object, the oldest dropping out early.
 */
#define AZ_SIM_LOAD	AZ_NR_SF
#ifndef AZ_SIM_WINDOW		/* the debug builds judge more often */
#define AZ_SIM_WINDOW		1024
#endif
#define AZ_SIM_SPARSE_BELOW	100
#define AZ_SIM_DENSE_FROM	50
#define AZ_SIM_DENSE_MIN_HITS	8
/*
 * Lookups of other owners than a group's first (halved with its counts)
 * that let it turn direct: they make a quarter of its recent lookups.  At
 * half, two sandboxes looking up alike settle one below it (511).
 */
#define AZ_SIM_OTHERS		(AZ_SIM_WINDOW / 4)
#ifndef AZ_MOVE_STEP		/* the debug builds move a few at a time */
#define AZ_MOVE_STEP	1024
#endif

static u32 az_pow2_below(u64 n, u32 min, u32 max)
{
	u32 p = min;

	while (p < max && (u64)p * 2 <= n)
		p *= 2;
	return p;
}

static u32 az_log2(u32 pow2)
{
	u32 b = 0;

	while ((1U << b) < pow2)
		b++;
	return b;
}

static void az_index_free(struct az_index *x)
{
	az_vfree(x->sim);
	az_vfree(x->sold);
	az_vfree(x->tbuckets);
	az_vfree(x->dbuckets);
	az_vfree(x->dold);
	x->sim = NULL;
	x->sold = NULL;
	x->tbuckets = NULL;
	x->dbuckets = NULL;
	x->dold = NULL;
}

#define AZ_DEDUP_MIN	256
#define AZ_TMPL_MIN	64
#define AZ_SIM_MIN_BITS	6
#define AZ_SIM_MIN	(1U << AZ_SIM_MIN_BITS)	/* sets */

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
	u32 slots;

again:
	if (s->idx.dbuckets)	/* racy peek; installed once, never freed */
		return 0;
	memset(&x, 0, sizeof(x));
	slots = AZ_READ_ONCE(s->sim_slots);
	x.dmax = az_pow2_below(s->nr_slots / AZ_DEDUP_LOAD, AZ_DEDUP_MIN,
			       1U << 22);
	x.tmax = az_pow2_below(s->nr_slots / 64, AZ_TMPL_MIN, 1U << 18);
	x.smax_bits = az_log2(az_pow2_below(s->nr_slots / slots / AZ_SIM_WAYS,
					    AZ_SIM_MIN, 1U << 22));
	x.sbits = AZ_SIM_MIN_BITS;
	x.dbuckets = az_valloc(AZ_DEDUP_MIN * sizeof(*x.dbuckets));
	x.tbuckets = az_valloc(AZ_TMPL_MIN * sizeof(*x.tbuckets));
	x.sim = az_valloc((size_t)AZ_SIM_MIN * sizeof(*x.sim));
	if (!x.dbuckets || !x.tbuckets || !x.sim) {
		az_index_free(&x);
		return -ENOMEM;
	}
	x.dmask = AZ_DEDUP_MIN - 1;
	x.tmask = AZ_TMPL_MIN - 1;
	x.table_bytes = AZ_DEDUP_MIN * sizeof(*x.dbuckets) +
			AZ_TMPL_MIN * sizeof(*x.tbuckets) +
			AZ_SIM_MIN * sizeof(*x.sim);

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

/* Every group's yield counts start afresh (idx_lock held). */
static void az_sim_yield_restart(struct az_index *x)
{
	u32 g;

	for (g = 0; g < AZ_SIM_GROUPS; g++) {
		x->yield[g].lookups = 0;
		x->yield[g].hits = 0;
		x->yield[g].dups = 0;
		x->yield[g].dlookups = 0;
	}
}

/*
 * Owner @idx is gone: a group whose first owner it was takes the next
 * one's lookups as its first again (the second-sandbox gate).
 */
void az_sim_forget_owner(struct az_store *s, u16 idx)
{
	struct az_index *x = &s->idx;
	u32 g;

	az_spin_lock(&s->idx_lock);
	for (g = 0; g < AZ_SIM_GROUPS; g++) {
		if (x->yield[g].first == idx) {
			x->yield[g].first = 0;
			x->yield[g].others = 0;
		}
	}
	az_spin_unlock(&s->idx_lock);
}

int az_store_set_sim_sample(struct az_store *s, u32 sample)
{
	struct az_index *x = &s->idx;
	bool kick;

	if (!az_sim_sample_valid(sample))
		return -EINVAL;
	az_spin_lock(&s->idx_lock);
	/* A sparse group's sampled objects change: its entries follow. */
	kick = sample != s->sim_sample && x->sparse;
	if (sample != s->sim_sample)	/* counted another way: afresh */
		az_sim_yield_restart(x);
	AZ_WRITE_ONCE(s->sim_sample, sample);
	if (sample == 1 && (x->sparse || x->direct)) {
		/* never sparse: every group dense again, none direct */
		x->switches += az_hweight64(x->sparse) + az_hweight64(x->direct);
		AZ_WRITE_ONCE(x->sparse, 0);
		AZ_WRITE_ONCE(x->direct, 0);
	}
	if (kick)
		AZ_WRITE_ONCE(x->regroup, true);
	az_spin_unlock(&s->idx_lock);
	if (kick)
		az_defer_kick(&s->defer);
	return 0;
}

u32 az_store_get_sim_sample(struct az_store *s)
{
	return AZ_READ_ONCE(s->sim_sample);
}

/* Sparse similarity entries, for the stats. */
void az_sim_stats(struct az_store *s, struct az_stats *st)
{
	struct az_index *x = &s->idx;

	az_spin_lock(&s->idx_lock);
	st->sim_sparse = az_hweight64(x->sparse);
	st->sim_waiting = x->later;
	st->sim_switches = x->switches;
	st->sim_direct = az_hweight64(x->direct & x->sparse);
	az_spin_unlock(&s->idx_lock);
}

void az_index_destroy(struct az_store *s)
{
	AZ_WARN_ON(s->idx.tchunks);
	az_index_free(&s->idx);
}

/*
 * Index memory: the tables (@table_bytes) and the template chunks
 * (@tnode_bytes), the memory of the index itself, plus the per-object
 * index fields (hash, chain link, similarity keys) of indexed
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

/* The chain of @tag, in the old table while that is being moved. */
static inline struct az_obj **az_dhead(struct az_index *x, u32 tag)
{
	if (x->dold && (tag & x->dold_mask) >= x->dmoved)
		return &x->dold[tag & x->dold_mask];
	return &x->dbuckets[tag & x->dmask];
}

#define AZ_DEDUP_CANDS	4

/*
 * A put of @group found a duplicate of a sandbox's plain page (hash tag
 * @tag): counted in its group's yield when every page like it would have
 * been an object to find (not stored direct: az_group_direct()).
 */
static void az_sim_count_dup(struct az_store *s, u32 group, u32 tag)
{
	struct az_index *x = &s->idx;
	struct az_sim_yield *y = &x->yield[az_sim_gno(group)];
	u32 sample = AZ_READ_ONCE(s->sim_sample);

	az_spin_lock(&s->idx_lock);
	if (!x->regroup && !x->regrouping && y->dups < AZ_SIM_WINDOW &&
	    !az_group_direct(x, group, tag, sample))
		y->dups++;
	az_spin_unlock(&s->idx_lock);
}

/*
 * An object of @group holding @page (hash @hash), referenced, or NULL;
 * @need_base: not a delta.  @count: the put's first attempt, whose find of
 * a sandbox's plain page counts in its group's yield.
 */
struct az_obj *az_dedup_find(struct az_store *s, struct az_ctx *ctx,
			     u32 group, u64 hash, const void *page,
			     bool need_base, bool count)
{
	struct az_index *x = &s->idx;
	struct az_obj *cand[AZ_DEDUP_CANDS], *o, *found = NULL;
	u32 tag = az_hash_tag(hash);
	int n = 0, i;

	az_spin_lock(&s->idx_lock);
	for (o = *az_dhead(x, tag); o && n < AZ_DEDUP_CANDS; o = o->dnext) {
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
	if (found && count && !az_obj_flag(found, AZ_OBJ_TEMPLATE) &&
	    !az_obj_base(found))
		az_sim_count_dup(s, group, tag);
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

/* What an object keeps of a key: its top half. */
static inline u32 az_sim_key32(u64 key)
{
	return (u32)(key >> 32);
}

/* The set of @key32, in the old table while that is being moved. */
static inline struct az_sim_set *az_sim_head(struct az_index *x, u32 key32)
{
	u32 so;

	if (x->sold) {
		so = az_sim_setno(key32, x->sold_bits);
		if (so >= x->smoved)
			return &x->sold[so];
	}
	return &x->sim[az_sim_setno(key32, x->sbits)];
}

static inline bool az_sim_has_key(const struct az_obj *o, u32 key32)
{
	unsigned int j;

	for (j = 0; j < o->nr_sf; j++)
		if (o->sim_key[j] == key32)
			return true;
	return false;
}

/*
 * Whether a yield of @hits (@scale times that for what every object
 * would have given) keeps a state that few hits earn (@few: below 1 per
 * AZ_SIM_SPARSE_BELOW lookups to turn to it; from 1 per AZ_SIM_DENSE_FROM,
 * at least AZ_SIM_DENSE_MIN_HITS, to leave it).
 */
static bool az_yield_few(u32 hits, u32 scale, bool few, u32 lookups)
{
	u64 found = (u64)hits * scale;

	if (few)
		return hits < AZ_SIM_DENSE_MIN_HITS ||
		       found * AZ_SIM_DENSE_FROM < lookups;
	return found * AZ_SIM_SPARSE_BELOW < lookups;
}

/*
 * Count a lookup of @group by @owner and judge its yield once a window is
 * full (idx_lock held).  Returns whether the group turned sparse or dense.
 */
static bool az_sim_judge(struct az_store *s, u32 group, u16 owner)
{
	struct az_index *x = &s->idx;
	struct az_sim_yield *y = &x->yield[az_sim_gno(group)];
	u64 bit = 1ULL << az_sim_gno(group);
	u32 sample = AZ_READ_ONCE(s->sim_sample), hits;
	bool sparse = x->sparse & bit, direct = x->direct & bit, to, dto;
	bool scaled = sparse && direct;

	if (x->regroup || x->regrouping)
		return false;	/* entries not yet as the groups want */
	if (!y->first)
		y->first = owner;
	else if (owner != y->first)
		y->others++;
	y->dlookups++;
	if (++y->lookups < AZ_SIM_WINDOW)
		return false;
	/* What entries (objects) of every page would have found. */
	hits = y->hits;
	y->lookups /= 2;
	y->hits /= 2;
	to = sample > 1 &&
	     az_yield_few(hits, sparse ? sample : 1, sparse, AZ_SIM_WINDOW);
	/*
	 * Judged apart, on the lookups since its duplicates were last counted
	 * another way (only sampled ones while it is sparse and direct), once
	 * they fill a window.  Until other sandboxes than the first made
	 * AZ_SIM_OTHERS of its recent lookups, the first one's had nobody's
	 * to be duplicates of: no turning direct on them.
	 */
	dto = direct;
	if (y->dlookups >= AZ_SIM_WINDOW) {
		dto = sample > 1 &&
		      az_yield_few(y->dups, scaled ? sample : 1, direct,
				   y->dlookups) &&
		      (direct || y->others >= AZ_SIM_OTHERS);
		y->dups /= 2;
		y->dlookups /= 2;
	}
	y->others /= 2;
	if (to == sparse && dto == direct)
		return false;
	if (to != sparse) {
		AZ_WRITE_ONCE(x->sparse, x->sparse ^ bit);
		AZ_WRITE_ONCE(x->regroup, true);
		x->switches++;
		/* The new state's yield from its own lookups only. */
		y->lookups = 0;
		y->hits = 0;
	}
	if (dto != direct) {
		AZ_WRITE_ONCE(x->direct, x->direct ^ bit);
		x->switches++;
	}
	if ((to && dto) != scaled) {
		y->dups = 0;
		y->dlookups = 0;
	}
	return to != sparse;
}

int az_sim_find(struct az_store *s, u32 group, u16 owner, const u64 *sf,
		struct az_obj **out, int max, bool count)
{
	struct az_index *x = &s->idx;
	struct az_sim_set *e;
	unsigned int i, w;
	int n = 0, k;
	bool kick;
	u32 key32;

	az_spin_lock(&s->idx_lock);
	for (i = 0; i < AZ_NR_SF && n < max; i++) {
		key32 = az_sim_key32(az_sim_key(group, i, sf[i]));
		e = az_sim_head(x, key32);
		for (w = 0; w < AZ_SIM_WAYS && n < max; w++) {
			struct az_obj *o = e->obj[w];

			if (!o || e->tag[w] != az_sim_tag(key32) ||
			    !az_sim_has_key(o, key32) ||
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
	kick = count && az_sim_judge(s, group, owner);
	az_spin_unlock(&s->idx_lock);
	if (kick)
		az_defer_kick(&s->defer);
	return n;
}

/* ---- insert / remove -------------------------------------------------- */

/*
 * The size a table of @n buckets (a power of two) goes to for @used
 * entries at most @per_bucket a bucket: doubled past that load up to
 * @max, halved (as often as it takes) while below an eighth of it, down
 * to @min; 0 when it stays.  @fit: halved as long as half of it holds its
 * load (after a regroup took out many entries at once).
 */
static u32 az_index_size_for(u32 n, u64 used, u64 per_bucket, u32 min,
			     u32 max, bool fit)
{
	u32 to = n;

	if (n < max && used > (u64)n * per_bucket)
		return n * 2;
	while (to > min && (fit ? used * 2 <= (u64)to * per_bucket :
				  used * 8 < (u64)to * per_bucket))
		to /= 2;
	return to == n ? 0 : to;
}

/*
 * The new sizes of the tables off their load, 0 for the others (idx_lock
 * held): dedup buckets, similarity set bits, template buckets.  A dedup
 * or similarity table still being moved waits.
 */
static bool az_index_off_load(struct az_store *s, u32 *dn, u32 *sb, u32 *tn)
{
	struct az_index *x = &s->idx;
	u64 per_set = AZ_SIM_WAYS * (u64)AZ_READ_ONCE(s->sim_slots);
	u32 sets;

	*dn = x->dold ? 0 : az_index_size_for(x->dmask + 1, x->indexed,
					      AZ_DEDUP_LOAD, AZ_DEDUP_MIN,
					      x->dmax, false);
	sets = x->sold ? 0 : az_index_size_for(1U << x->sbits,
					       (x->simmed + x->scoming) *
					       AZ_SIM_LOAD,
					       per_set, AZ_SIM_MIN,
					       1U << x->smax_bits, x->sfit);
	*sb = sets ? az_log2(sets) : 0;
	*tn = az_index_size_for(x->tmask + 1, x->tchunks, 1, AZ_TMPL_MIN,
				x->tmax, false);
	return *dn || *sb || *tn;
}

/*
 * After a change under idx_lock: ask for a resize once (lock held).
 * Returns whether the deferred worker should be woken for it.
 */
static bool az_index_want_resize(struct az_store *s)
{
	struct az_index *x = &s->idx;
	u32 dn, sb, tn;

	if (x->resize)
		return false;
	if (x->indexed > x->retry_below && x->indexed < x->retry_at)
		return false;
	x->retry_below = 0;	/* out of a failure's window: closed */
	x->retry_at = 0;
	if (!az_index_off_load(s, &dn, &sb, &tn))
		return false;
	AZ_WRITE_ONCE(x->resize, true);
	return true;
}

/*
 * Make the similarity entries of @o from its keys (idx_lock held): a way
 * in the set of each key, the set's oldest dropping out.
 */
static void az_sim_link(struct az_index *x, struct az_obj *o)
{
	struct az_sim_set *e;
	unsigned int i;

	for (i = 0; i < AZ_NR_SF; i++) {
		e = az_sim_head(x, o->sim_key[i]);
		/* Drop the oldest way, newest first. */
		memmove(&e->tag[1], &e->tag[0],
			(AZ_SIM_WAYS - 1) * sizeof(e->tag[0]));
		memmove(&e->obj[1], &e->obj[0],
			(AZ_SIM_WAYS - 1) * sizeof(e->obj[0]));
		e->tag[0] = az_sim_tag(o->sim_key[i]);
		e->obj[0] = o;
	}
	o->nr_sf = AZ_NR_SF;
	x->simmed++;
	if (az_obj_flag(o, AZ_OBJ_SIM_LATER)) {
		az_obj_flag_clear(o, AZ_OBJ_SIM_LATER);
		x->later--;
	}
}

/*
 * Take out what is left of @o's similarity entries (idx_lock held), and
 * keep its keys for later (@keep) or forget them (the object goes).
 */
static void az_sim_unlink(struct az_index *x, struct az_obj *o, bool keep)
{
	struct az_sim_set *e;
	unsigned int i, w;

	for (i = 0; i < o->nr_sf; i++) {
		e = az_sim_head(x, o->sim_key[i]);
		for (w = 0; w < AZ_SIM_WAYS; w++)
			if (e->obj[w] == o)
				e->obj[w] = NULL;
	}
	if (o->nr_sf)
		x->simmed--;
	o->nr_sf = 0;
	if (keep == az_obj_flag(o, AZ_OBJ_SIM_LATER))
		return;
	if (keep) {
		az_obj_flag_set(o, AZ_OBJ_SIM_LATER);
		x->later++;
	} else {
		az_obj_flag_clear(o, AZ_OBJ_SIM_LATER);
		x->later--;
	}
}

void az_index_insert(struct az_store *s, struct az_obj *o, const u64 *sf,
		     bool found)
{
	struct az_index *x = &s->idx;
	struct az_sim_yield *y = &x->yield[az_sim_gno(o->group)];
	struct az_obj **head;
	unsigned int i;
	bool kick;

	az_spin_lock(&s->idx_lock);
	/* Its lookup was counted (unless a regroup was pending then). */
	if (found && y->hits < y->lookups)
		y->hits++;
	head = az_dhead(x, o->hash);
	o->dnext = *head;
	*head = o;
	o->nr_sf = 0;
	if (sf && !az_obj_base(o)) {
		for (i = 0; i < AZ_NR_SF; i++)
			o->sim_key[i] = az_sim_key32(az_sim_key(o->group, i,
								sf[i]));
		if (az_sim_wanted(x, o, AZ_READ_ONCE(s->sim_sample)))
			az_sim_link(x, o);
		else
			az_sim_unlink(x, o, true);
	}
	AZ_WRITE_ONCE(x->indexed, x->indexed + 1);
	az_obj_flag_set(o, AZ_OBJ_INDEXED);
	kick = az_index_want_resize(s);
	az_spin_unlock(&s->idx_lock);
	if (kick)
		az_defer_kick(&s->defer);
}

/*
 * Called by az_obj_put() for the last reference, in any context the put
 * may run in (no allocation, no decode).  The object then goes to the
 * deferred free, whose worker resizes after it: a table left below its
 * load needs no wake-up here.
 */
void az_index_remove(struct az_store *s, struct az_obj *o)
{
	struct az_index *x = &s->idx;
	struct az_obj **pp;
	bool found = false;

	az_spin_lock(&s->idx_lock);
	for (pp = az_dhead(x, o->hash); *pp; pp = &(*pp)->dnext) {
		if (*pp == o) {
			*pp = o->dnext;
			found = true;
			break;
		}
	}
	/*
	 * Every indexed object is in its chain: not finding it means a move
	 * or a hash went wrong, and whatever still links it would point at
	 * freed memory once it goes.
	 */
	AZ_WARN_ON(!found);
	az_sim_unlink(x, o, false);
	az_obj_flag_clear(o, AZ_OBJ_INDEXED);
	AZ_WRITE_ONCE(x->indexed, x->indexed - 1);
	az_index_want_resize(s);
	az_spin_unlock(&s->idx_lock);
}

/* ---- resizing --------------------------------------------------------- */

/*
 * Move old dedup bucket @b's chain to the new table (idx_lock held),
 * appended in its order (newest first) to the bucket each object falls
 * in: two buckets, empty until now, when the table doubled; one, holding
 * the chain of @b's sibling (other hashes), when it halved.
 */
static void az_dedup_move(struct az_index *x, u32 b)
{
	struct az_obj *o, *next, **tail[2] = { NULL, NULL };
	u32 nb[2] = { 0, 0 }, t;
	unsigned int i;

	for (o = x->dold[b]; o; o = next) {
		next = o->dnext;
		t = o->hash & x->dmask;
		for (i = 0; i < 2 && tail[i] && nb[i] != t; i++)
			;
		if (AZ_WARN_ON(i == 2))	/* a bucket maps to at most two */
			i = 1;
		if (!tail[i] || nb[i] != t) {
			nb[i] = t;
			tail[i] = &x->dbuckets[t];
			while (*tail[i])
				tail[i] = &(*tail[i])->dnext;
		}
		o->dnext = NULL;
		*tail[i] = o;
		tail[i] = &o->dnext;
	}
	x->dold[b] = NULL;
}

/*
 * Move old similarity set @so to the new table (idx_lock held): its
 * entries go, oldest first, to the set their key falls in: one of the two
 * sets it splits into when the table doubled (the order stays newest
 * first), the set it shares with its sibling when it halved (moved after
 * the sibling, its entries push the sibling's oldest out of a full set).
 * The key is found in the object: the one that falls in @so and gives the
 * way's tag (the entry was made for it, the moves keep it so).  Two keys
 * of an object may fall in one set: each way then follows its own key, so
 * that a lookup by either key still finds it after the move.
 */
static void az_sim_move(struct az_index *x, u32 so)
{
	struct az_sim_set *e = &x->sold[so], *n;
	struct az_obj *o;
	unsigned int w, j;

	for (w = AZ_SIM_WAYS; w-- > 0;) {
		o = e->obj[w];
		if (!o)
			continue;
		for (j = 0; j < o->nr_sf; j++)
			if (az_sim_setno(o->sim_key[j], x->sold_bits) == so &&
			    az_sim_tag(o->sim_key[j]) == e->tag[w])
				break;
		if (AZ_WARN_ON(j == o->nr_sf))
			continue;
		n = &x->sim[az_sim_setno(o->sim_key[j], x->sbits)];
		memmove(&n->tag[1], &n->tag[0],
			(AZ_SIM_WAYS - 1) * sizeof(n->tag[0]));
		memmove(&n->obj[1], &n->obj[0],
			(AZ_SIM_WAYS - 1) * sizeof(n->obj[0]));
		n->tag[0] = e->tag[w];
		n->obj[0] = o;
		e->obj[w] = NULL;
	}
}

static inline u32 az_tbucket_in(u32 mask, u32 group, u64 first)
{
	return (u32)az_mix(first / AZ_TCHUNK ^ ((u64)group << 40)) & mask;
}

/* Rehash the template chains into @nt of @n buckets (idx_lock held). */
static struct az_tchunk **az_tmpl_rehash(struct az_index *x,
					 struct az_tchunk **nt, u32 n)
{
	struct az_tchunk **old = x->tbuckets, *c, *next;
	u32 b, nb;

	for (b = 0; b <= x->tmask; b++) {
		for (c = old[b]; c; c = next) {
			next = c->next;
			nb = az_tbucket_in(n - 1, c->group, c->first);
			c->next = nt[nb];
			nt[nb] = c;
		}
	}
	AZ_WRITE_ONCE(x->table_bytes, x->table_bytes + (u64)n * sizeof(*nt) -
		      (u64)(x->tmask + 1) * sizeof(*nt));
	AZ_WRITE_ONCE(x->tbuckets, nt);
	x->tmask = n - 1;
	x->tgen++;
	return old;
}

/*
 * One round of resizing: the new tables of what is off its load are
 * allocated (process context, may sleep) and installed, then moved over.
 * Returns whether anything was resized; *@short_of_memory when an
 * allocation failed (asked for again once an eighth more or fewer
 * objects are indexed).
 */
static bool az_index_resize_once(struct az_store *s, bool *short_of_memory)
{
	struct az_index *x = &s->idx;
	struct az_obj **nd = NULL, **dgone = NULL;
	struct az_sim_set *ns = NULL, *sgone = NULL;
	struct az_tchunk **nt = NULL, **tgone = NULL;
	u32 dn, sb, tn, b, end, d0, sb0, t0;
	bool resized = false, off;
	u64 step;

	az_spin_lock(&s->idx_lock);
	AZ_WRITE_ONCE(x->resize, false);
	off = az_index_off_load(s, &dn, &sb, &tn);
	x->sfit = false;	/* once: later sizes follow the usual load */
	/* Only this caller changes the sizes: still these when installing. */
	d0 = x->dmask + 1;
	sb0 = x->sbits;
	t0 = x->tmask + 1;
	az_spin_unlock(&s->idx_lock);
	if (!off)
		return false;

	/* Without memory the tables stay as they are: only slower to hit. */
	if (dn)
		nd = az_valloc_try((size_t)dn * sizeof(*nd));
	if (sb)
		ns = az_valloc_try(sizeof(*ns) << sb);
	if (tn)
		nt = az_valloc_try((size_t)tn * sizeof(*nt));
	az_spin_lock(&s->idx_lock);
	/*
	 * Short of memory: asked again once an eighth more (at least 256)
	 * or an eighth fewer (at least one) objects are indexed.
	 */
	if ((dn && !nd) || (sb && !ns) || (tn && !nt)) {
		*short_of_memory = true;
		x->retry_at = x->indexed + az_max(x->indexed / 8, 256);
		step = az_max(x->indexed / 8, 1);
		x->retry_below = x->indexed > step ? x->indexed - step : 0;
	}
	if (nd && x->dmask + 1 == d0 && !x->dold) {
		AZ_WRITE_ONCE(x->dold, x->dbuckets);
		x->dold_mask = x->dmask;
		x->dmoved = 0;
		AZ_WRITE_ONCE(x->dbuckets, nd);
		x->dmask = dn - 1;
		AZ_WRITE_ONCE(x->table_bytes,
			      x->table_bytes + (u64)dn * sizeof(*nd));
		nd = NULL;
		resized = true;
	}
	if (ns && x->sbits == sb0 && !x->sold) {
		AZ_WRITE_ONCE(x->sold, x->sim);
		x->sold_bits = x->sbits;
		x->smoved = 0;
		x->sim = ns;
		x->sbits = sb;
		AZ_WRITE_ONCE(x->table_bytes,
			      x->table_bytes + (sizeof(*ns) << sb));
		ns = NULL;
		resized = true;
	}
	if (nt && x->tmask + 1 == t0) {
		tgone = az_tmpl_rehash(x, nt, tn);
		nt = NULL;
		resized = true;
	}
	az_spin_unlock(&s->idx_lock);
	az_vfree(nd);
	az_vfree(ns);
	az_vfree(nt);
	az_vfree(tgone);
	if (*short_of_memory)
		resized = false;

	/* Move the entries over, a step at a time. */
	while (AZ_READ_ONCE(x->dold) || AZ_READ_ONCE(x->sold)) {
		az_spin_lock(&s->idx_lock);
		if (x->dold) {
			end = az_min(x->dmoved + AZ_MOVE_STEP, x->dold_mask + 1);
			for (b = x->dmoved; b < end; b++)
				az_dedup_move(x, b);
			x->dmoved = end;
			if (end == x->dold_mask + 1) {
				dgone = x->dold;
				AZ_WRITE_ONCE(x->dold, NULL);
				AZ_WRITE_ONCE(x->table_bytes, x->table_bytes -
					      (u64)end * sizeof(*dgone));
			}
		}
		if (x->sold) {
			end = az_min(x->smoved + AZ_MOVE_STEP,
				     1U << x->sold_bits);
			for (b = x->smoved; b < end; b++)
				az_sim_move(x, b);
			x->smoved = end;
			if (end == 1U << x->sold_bits) {
				sgone = x->sold;
				AZ_WRITE_ONCE(x->sold, NULL);
				AZ_WRITE_ONCE(x->table_bytes, x->table_bytes -
					      (u64)end * sizeof(*sgone));
			}
		}
		az_spin_unlock(&s->idx_lock);
		az_vfree(dgone);
		az_vfree(sgone);
		dgone = NULL;
		sgone = NULL;
		az_cond_resched();
	}
	return resized;
}

/*
 * Walk every indexed object (the dedup chains hold them all), AZ_MOVE_STEP
 * dedup buckets per idx_lock hold: unlink the similarity entries its group
 * no longer wants (az_sim_wanted()), and link those it wants now if @link.
 * Returns the objects that wanted entries and were not given them.  The
 * resizer's bit is held and no table is half moved, so the dedup table
 * keeps its size; objects indexed meanwhile are placed by their insert.
 */
static u64 az_sim_walk(struct az_store *s, bool link)
{
	struct az_index *x = &s->idx;
	u32 sample, b = 0, end;
	struct az_obj *o;
	u64 wanting = 0;
	bool want;

	az_spin_lock(&s->idx_lock);
	for (;;) {
		sample = AZ_READ_ONCE(s->sim_sample);
		end = az_min(b + AZ_MOVE_STEP, x->dmask + 1);
		for (; b < end; b++) {
			for (o = x->dbuckets[b]; o; o = o->dnext) {
				if (!o->nr_sf &&
				    !az_obj_flag(o, AZ_OBJ_SIM_LATER))
					continue;	/* no keys */
				want = az_sim_wanted(x, o, sample);
				if (o->nr_sf && !want)
					az_sim_unlink(x, o, true);
				else if (!o->nr_sf && want && link)
					az_sim_link(x, o);
				else if (!o->nr_sf && want)
					wanting++;
			}
		}
		if (b > x->dmask)
			break;
		az_spin_unlock(&s->idx_lock);
		az_cond_resched();
		az_spin_lock(&s->idx_lock);
	}
	az_spin_unlock(&s->idx_lock);
	return wanting;
}

/*
 * Give every indexed object the similarity entries its group wants, and
 * only those (a group switched, or the sample changed): unlink what goes,
 * size the similarity table to fit what stays and what comes (a dense
 * table an eighth full would not halve; entries linked into a table too
 * small would push each other out), then link.  Resizer's bit held.
 */
static void az_sim_regroup(struct az_store *s, bool *short_of_memory)
{
	struct az_index *x = &s->idx;
	u64 coming;

	az_spin_lock(&s->idx_lock);
	AZ_WRITE_ONCE(x->regroup, false);
	x->regrouping = true;
	az_spin_unlock(&s->idx_lock);
	coming = az_sim_walk(s, false);
	if (!*short_of_memory) {
		az_spin_lock(&s->idx_lock);
		x->scoming = coming;
		x->sfit = true;
		AZ_WRITE_ONCE(x->resize, true);
		az_spin_unlock(&s->idx_lock);
		while (!*short_of_memory &&
		       az_index_resize_once(s, short_of_memory))
			;
	}
	az_sim_walk(s, true);
	az_spin_lock(&s->idx_lock);
	x->scoming = 0;
	x->sfit = false;
	x->regrouping = false;
	az_spin_unlock(&s->idx_lock);
}

/*
 * Resize what is off its load, and regroup the similarity entries when a
 * group switched, if anything (process context; may sleep).  One caller
 * at a time: another returns at once, and a request made while this one
 * runs is taken up before it returns.  Short of memory, it leaves a
 * resize for a later call.
 */
void az_index_resize(struct az_store *s)
{
	struct az_index *x = &s->idx;
	bool short_of_memory = false, regrouped = false;

	while (((!regrouped && AZ_READ_ONCE(x->regroup)) ||
		(!short_of_memory && AZ_READ_ONCE(x->resize))) &&
	       AZ_READ_ONCE(x->dbuckets) && !AZ_READ_ONCE(x->closing)) {
		if (az_test_and_set_bit(0, &x->resizing))
			return;
		while (!short_of_memory &&
		       az_index_resize_once(s, &short_of_memory))
			;
		/* After the moves: a regroup walks whole tables. */
		if (!regrouped && AZ_READ_ONCE(x->regroup)) {
			az_sim_regroup(s, &short_of_memory);
			regrouped = true;
		}
		while (!short_of_memory &&
		       az_index_resize_once(s, &short_of_memory))
			;
		az_clear_bit_unlock(0, &x->resizing);
		/* A request made meanwhile saw the bit set: read it after. */
		az_smp_mb();
	}
	/*
	 * One walk per call (the deferred frees wait behind it): another
	 * regroup asked for meanwhile is the worker's next run.
	 */
	if (regrouped && AZ_READ_ONCE(x->regroup) &&
	    !AZ_READ_ONCE(x->closing))
		az_defer_kick(&s->defer);
}

/* ---- template index --------------------------------------------------- */

static inline u64 az_tfirst(u64 index)
{
	return index - index % AZ_TCHUNK;
}

static inline u32 az_tbucket(struct az_index *x, u32 group, u64 first)
{
	return az_tbucket_in(x->tmask, group, first);
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
	bool kick = false;

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
		kick = az_index_want_resize(s);
	}
	old = c->obj[i];
	old_owner = c->owner[i];
	az_ref_inc(&o->ref);
	c->obj[i] = o;
	c->owner[i] = owner;
	if (!old)
		c->used++;
	az_spin_unlock(&s->idx_lock);
	if (kick)
		az_defer_kick(&s->defer);

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
	u32 b, i, n, gen;
	u64 dropped = 0;
	bool kick;

	if (!AZ_READ_ONCE(x->tbuckets))
		return;
	az_spin_lock(&s->idx_lock);
restart:
	/* Taking entries twice takes nothing: a rehash restarts the walk. */
	gen = x->tgen;
	for (b = 0; b <= x->tmask; b++) {
		if (b && !(b & 1023)) {
			az_spin_unlock(&s->idx_lock);
			az_cond_resched();
			az_spin_lock(&s->idx_lock);
			if (x->tgen != gen)
				goto restart;
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
			if (x->tgen != gen)
				goto restart;
			goto again;	/* the chain may have changed */
		}
	}
	kick = az_index_want_resize(s);	/* the template table may halve */
	az_spin_unlock(&s->idx_lock);
	if (kick)
		az_defer_kick(&s->defer);
	az_atomic64_sub(dropped, &s->template_pages);
	az_atomic64_sub(dropped, &az_owner_at(s, owner)->loaded_pages);
}
