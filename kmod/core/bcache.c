// SPDX-License-Identifier: GPL-2.0
/*
 * Decoded-base cache: decoded copies of hot delta bases.
 *
 * Bases (template pages, pages other deltas refer to) are stored
 * compressed.  Loading a delta, or encoding a new page against a base,
 * needs the base decoded; a base shared by many sandboxes' deltas would be
 * decoded again for each of them.  This cache keeps the most recently
 * used decoded bases, so such a use costs one 4 KiB copy.
 *
 * Shape: set-associative (AZ_BC_WAYS ways per set, the set chosen by the
 * object's address), CLOCK replacement inside a set.  Size in entries is
 * a store setting (az_store_set_base_cache, sysfs `base_cache`), 0 = off;
 * an entry holds at most one page.
 *
 * Admission and release: a cached page should serve reads, not sit.  A
 * base goes in on its second miss within the ghost's lifetime: its first
 * miss only leaves a ghost (its 32-bit content hash in a table of
 * AZ_BC_GHOSTS per entry, two-way buckets), so a base read once
 * (a single sandbox restoring its own deltas) never takes a page.  Every
 * az_bc_window() reads the cache sweeps itself: an entry inserted before
 * the last sweep that served no read since it loses its page, and the
 * pages it may hold until the next sweep are twice those that served in
 * this window (at least AZ_BC_START_PAGES): a cache whose pages all serve
 * doubles each window, and one that serves nothing holds at most two pages
 * after the following sweep (an entry inserted since the last one is kept
 * for a window).  A second miss consumes the ghost even when no entry
 * gets a page for it (the set has none and the limit is reached).
 *
 * Memory: an entry gets its page when it is filled (a no-wait allocation;
 * none, no caching), while the pages held are below that limit and below
 * one per AZ_BC_STORED_PER_PAGE pages stored (at least AZ_BC_MIN_FILL).  A
 * page goes back at a sweep (above), a resize or the cache's destruction.
 *
 * Lifetime: entries hold no reference.  An object is marked AZ_OBJ_CACHED
 * when it is inserted and az_obj_destroy() calls az_bcache_forget() for it
 * before its memory is freed, so a dead object's address never matches.
 * Inserting needs a live object: callers hold a reference (or the lock of
 * a slot whose object holds one).  Only copies whose xxh64 matched the
 * object's recorded hash tag (az_hash_tag) are inserted, so a hit needs no
 * verification.
 *
 * Locking: s->bc_lock covers the tags, the ghosts, the entry bits and the
 * pages.  It is the innermost lock of the core (taken under a slot lock,
 * never while a pool object is mapped) and covers at most one page copy,
 * or one sweep: a pass over the entries' bits that unhooks the pages it
 * releases and frees them after the unlock.  Resizing allocates outside
 * the lock and swaps the arrays under it.
 */
#include "az_internal.h"

struct az_bcache_mem {
	u32 nr_sets;
	u32 filled;		/* entries with a page */
	u32 reads;		/* base reads since the last sweep */
	u32 limit;		/* pages it may fill until the next sweep */
	struct az_obj **tags;	/* nr_sets * AZ_BC_WAYS */
	u8 *used;		/* AZ_BC_REF | AZ_BC_SERVED | AZ_BC_YOUNG */
	u8 **pages;		/* per entry: its page, or NULL */
	u32 *ghosts;		/* nr_sets * AZ_BC_WAYS * AZ_BC_GHOSTS */
};

#define AZ_BC_MIN_FILL		16
#define AZ_BC_STORED_PER_PAGE	1024
#define AZ_BC_GHOSTS		4	/* ghost tags per entry */
#define AZ_BC_SWEEP_MIN		1024	/* reads between sweeps, at least */
#define AZ_BC_START_PAGES	2	/* page limit before a sweep, and least */

/* Entry bits (used[]). */
#define AZ_BC_REF	1	/* CLOCK: used since the hand last passed */
#define AZ_BC_SERVED	2	/* a hit since the last sweep */
#define AZ_BC_YOUNG	4	/* inserted since the last sweep */

/* Reads between sweeps: twice the entries, at least AZ_BC_SWEEP_MIN. */
static u32 az_bc_window(const struct az_bcache_mem *m)
{
	return az_max(2 * m->nr_sets * AZ_BC_WAYS, (u32)AZ_BC_SWEEP_MIN);
}

/* How many entries may have a page now: the lower of the two limits. */
static u32 az_bc_fill_limit(struct az_store *s, const struct az_bcache_mem *m)
{
	u64 n = az_atomic64_read(&s->pages_stored) / AZ_BC_STORED_PER_PAGE;

	n = az_min(az_max(n, (u64)AZ_BC_MIN_FILL), (u64)AZ_BC_MAX_PAGES);
	return (u32)az_min(n, (u64)m->limit);
}

static u32 az_bc_set(const struct az_bcache_mem *m, const struct az_obj *o)
{
	u64 h = (u64)(unsigned long)o;

	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ULL;
	h ^= h >> 32;
	return (u32)h & (m->nr_sets - 1);
}

/*
 * A miss of @o: true if it left a ghost since (its second miss: cache it),
 * else it leaves one now.  A ghost is @o's content hash (az_hash_tag) in a
 * bucket of two chosen by that hash, the newer first: two bases that share
 * a bucket do not push each other's ghost out.  It holds no reference: a
 * ghost a dead object left only admits an object of the same content.
 */
static bool az_bc_second_miss(struct az_bcache_mem *m, const struct az_obj *o)
{
	u32 n = m->nr_sets * AZ_BC_WAYS * AZ_BC_GHOSTS;
	u32 tag = o->hash | 1;
	u32 g = (u32)(((u64)o->hash * 0x9e3779b97f4a7c15ULL) >> 32) & (n - 2);

	if (m->ghosts[g] == tag) {
		m->ghosts[g] = m->ghosts[g + 1];	/* the older stays */
		m->ghosts[g + 1] = 0;
		return true;
	}
	if (m->ghosts[g + 1] == tag) {
		m->ghosts[g + 1] = 0;
		return true;
	}
	if (m->ghosts[g])
		m->ghosts[g + 1] = m->ghosts[g];
	m->ghosts[g] = tag;
	return false;
}

static struct az_bcache_mem *az_bc_alloc(u32 nr_sets)
{
	struct az_bcache_mem *m = az_valloc(sizeof(*m));
	u64 n = (u64)nr_sets * AZ_BC_WAYS;

	if (!m)
		return NULL;
	m->nr_sets = nr_sets;
	m->limit = AZ_BC_START_PAGES;
	m->tags = az_valloc(n * sizeof(*m->tags));
	m->used = az_valloc(n);
	m->pages = az_valloc(n * sizeof(*m->pages));
	m->ghosts = az_valloc(n * AZ_BC_GHOSTS * sizeof(*m->ghosts));
	if (!m->tags || !m->used || !m->pages || !m->ghosts) {
		az_vfree(m->ghosts);
		az_vfree(m->pages);
		az_vfree(m->used);
		az_vfree(m->tags);
		az_vfree(m);
		return NULL;
	}
	return m;	/* az_valloc zeroes: every tag NULL, no ghost */
}

static void az_bc_free(struct az_bcache_mem *m)
{
	u64 i;

	if (!m)
		return;
	for (i = 0; i < (u64)m->nr_sets * AZ_BC_WAYS; i++)
		az_free(m->pages[i]);
	az_vfree(m->ghosts);
	az_vfree(m->pages);
	az_vfree(m->used);
	az_vfree(m->tags);
	az_vfree(m);
}

/*
 * Resize to @pages entries (rounded down to a power of two of
 * AZ_BC_WAYS-entry sets; 0 turns the cache off).  May sleep.  Returns
 * -EINVAL above AZ_BC_MAX_PAGES, -ENOMEM when allocation fails (the old
 * cache is kept).
 */
int az_store_set_base_cache(struct az_store *s, u32 pages)
{
	struct az_bcache_mem *m = NULL, *old;
	u32 sets = pages / AZ_BC_WAYS;

	if (pages > AZ_BC_MAX_PAGES)
		return -EINVAL;
	while (sets & (sets - 1))
		sets &= sets - 1;	/* round down to a power of two */
	if (sets) {
		m = az_bc_alloc(sets);
		if (!m)
			return -ENOMEM;
	}
	az_spin_lock(&s->bc_lock);
	old = s->bc;
	s->bc = m;
	az_spin_unlock(&s->bc_lock);
	/* Objects still marked AZ_OBJ_CACHED only cost a miss in forget. */
	az_bc_free(old);
	return 0;
}

u32 az_store_get_base_cache(struct az_store *s)
{
	u32 n;

	az_spin_lock(&s->bc_lock);
	n = s->bc ? s->bc->nr_sets * AZ_BC_WAYS : 0;
	az_spin_unlock(&s->bc_lock);
	return n;
}

/*
 * Memory the cache holds: every entry's tag, bits, pointer and ghosts, and
 * the pages it holds now.
 */
u64 az_bcache_bytes(struct az_store *s)
{
	u64 n = 0;

	az_spin_lock(&s->bc_lock);
	if (s->bc)
		n = (u64)s->bc->nr_sets * AZ_BC_WAYS *
		    (sizeof(*s->bc->tags) + sizeof(*s->bc->pages) + 1 +
		     AZ_BC_GHOSTS * sizeof(*s->bc->ghosts)) +
		    (u64)s->bc->filled * AZ_PAGE_SIZE;
	az_spin_unlock(&s->bc_lock);
	return n;
}

void az_bcache_destroy(struct az_store *s)
{
	az_bc_free(s->bc);
	s->bc = NULL;
}

/*
 * Under bc_lock, one base read: every az_bc_window() reads, unhook the
 * pages of the entries that served no read since the last sweep (one
 * inserted since then gets another window) and of the entries without a
 * tag, and set the page limit from the pages that served.  Returns the
 * pages chained through their first word, for az_bc_free_chain() after
 * the unlock.
 */
static void *az_bc_sweep(struct az_bcache_mem *m)
{
	void *chain = NULL;
	u32 i, served = 0;

	if (++m->reads < az_bc_window(m))
		return NULL;
	m->reads = 0;
	for (i = 0; i < m->nr_sets * AZ_BC_WAYS; i++) {
		u8 *page = m->pages[i];

		if (!page)
			continue;
		if (m->tags[i] && (m->used[i] & (AZ_BC_SERVED | AZ_BC_YOUNG))) {
			served += !!(m->used[i] & AZ_BC_SERVED);
			m->used[i] &= AZ_BC_REF;
			continue;
		}
		m->tags[i] = NULL;
		m->used[i] = 0;
		m->pages[i] = NULL;
		m->filled--;
		*(void **)page = chain;
		chain = page;
	}
	m->limit = az_max(2 * served, (u32)AZ_BC_START_PAGES);
	return chain;
}

static void az_bc_free_chain(void *chain)
{
	while (chain) {
		void *next = *(void **)chain;

		az_free(chain);
		chain = next;
	}
}

/* Copy @o's decoded page into @dst if cached; true on a hit. */
static bool az_bcache_lookup(struct az_store *s, struct az_obj *o, void *dst)
{
	struct az_bcache_mem *m;
	void *chain = NULL;
	bool hit = false;
	u32 i, e;

	if (!az_obj_flag(o, AZ_OBJ_CACHED))
		return false;
	az_spin_lock(&s->bc_lock);
	m = s->bc;
	if (m) {
		e = az_bc_set(m, o) * AZ_BC_WAYS;
		for (i = e; i < e + AZ_BC_WAYS; i++) {
			if (m->tags[i] != o)
				continue;
			az_copy_words(dst, m->pages[i], AZ_PAGE_SIZE);
			m->used[i] |= AZ_BC_REF | AZ_BC_SERVED;
			hit = true;
			break;
		}
		if (hit)
			chain = az_bc_sweep(m);
	}
	az_spin_unlock(&s->bc_lock);
	az_bc_free_chain(chain);
	return hit;
}

/*
 * An entry of set @e for a new copy: a free one with a page, else a free
 * one given a page (a no-wait allocation, while the limits allow),
 * else by CLOCK among those with a page.  AZ_BC_WAYS: none.  Every entry
 * with a tag has a page.
 */
static u32 az_bc_victim(struct az_store *s, struct az_bcache_mem *m, u32 e)
{
	u32 i, none = e + AZ_BC_WAYS, spin;

	for (i = e; i < e + AZ_BC_WAYS; i++)
		if (!m->tags[i] && m->pages[i])
			return i;
	if (m->filled < az_bc_fill_limit(s, m)) {
		for (i = e; i < e + AZ_BC_WAYS; i++) {
			if (m->pages[i])
				continue;
			/* Stores run in reclaim: never from its reserves. */
			m->pages[i] = az_alloc(AZ_PAGE_SIZE, AZ_GFP_OPTIONAL);
			if (!m->pages[i])
				break;
			m->filled++;
			return i;
		}
	}
	/* CLOCK: the first entry not used since the hand last passed it. */
	for (spin = 0; spin < 2 * AZ_BC_WAYS; spin++) {
		i = e + spin % AZ_BC_WAYS;
		if (!m->pages[i])
			continue;
		if (!(m->used[i] & AZ_BC_REF))
			return i;
		m->used[i] &= ~AZ_BC_REF;
	}
	/* Two turns found no page without a use bit: the set has no page. */
	return none;
}

/* A base read that missed: cache @o's decoded @page if it missed before. */
static void az_bcache_insert(struct az_store *s, struct az_obj *o,
			     const void *page)
{
	struct az_bcache_mem *m;
	void *chain = NULL;
	u32 i, e, victim;

	az_spin_lock(&s->bc_lock);
	m = s->bc;
	if (!m)
		goto out;
	chain = az_bc_sweep(m);
	e = az_bc_set(m, o) * AZ_BC_WAYS;
	for (i = e; i < e + AZ_BC_WAYS; i++)
		if (m->tags[i] == o)
			goto out;	/* a racing reader inserted it */
	if (!az_bc_second_miss(m, o))
		goto out;
	victim = az_bc_victim(s, m, e);
	if (victim == e + AZ_BC_WAYS)
		goto out;	/* no page for this set */
	m->tags[victim] = o;
	m->used[victim] = AZ_BC_REF | AZ_BC_YOUNG;
	az_copy_words(m->pages[victim], page, AZ_PAGE_SIZE);
	az_obj_flag_set(o, AZ_OBJ_CACHED);
out:
	az_spin_unlock(&s->bc_lock);
	az_bc_free_chain(chain);
}

/* @o is being destroyed: drop its entry.  Atomic context safe. */
void az_bcache_forget(struct az_store *s, struct az_obj *o)
{
	struct az_bcache_mem *m;
	u32 i, e;

	if (!az_obj_flag(o, AZ_OBJ_CACHED))
		return;
	az_spin_lock(&s->bc_lock);
	m = s->bc;
	if (m) {
		e = az_bc_set(m, o) * AZ_BC_WAYS;
		for (i = e; i < e + AZ_BC_WAYS; i++) {
			if (m->tags[i] == o) {
				m->tags[i] = NULL;
				m->used[i] = 0;
			}
		}
	}
	az_spin_unlock(&s->bc_lock);
}

/*
 * Decode base @b (never itself a delta) into @dst, from the cache when it
 * is there.  A decoded copy whose hash does not match @b's is -EIO (with
 * verify on) and is never cached.  Caller holds a reference to @b.
 */
int az_base_read(struct az_store *s, struct az_ctx *ctx, struct az_obj *b,
		 void *dst, bool verify)
{
	struct az_bcache_mem *cache;
	bool ok;
	int err;

	if (AZ_WARN_ON(az_obj_base(b)))
		return -EIO;
	if (az_bcache_lookup(s, b, dst)) {
		az_atomic64_inc(&s->bc_hits);
		return 0;
	}
	az_atomic64_inc(&s->bc_misses);
	err = az_obj_read(s, ctx, b, dst);
	if (err)
		return err;
	cache = AZ_READ_ONCE(s->bc);
	if (!verify && !cache)
		return 0;	/* nothing needs the hash */
	ok = az_hash_tag(az_xxh64(dst, AZ_PAGE_SIZE, 0)) == b->hash;
	if (!ok)
		return verify ? -EIO : 0;
	if (cache)
		az_bcache_insert(s, b, dst);
	return 0;
}
