/* SPDX-License-Identifier: GPL-2.0 */
/*
 * azswap store core: the public API used by the kernel glue (the .c files
 * in kmod/) and by the host library (build/libazcore.so, used by tests,
 * fuzzing and trace replay).  Everything below is plain C; the only
 * environment calls go through az_shim.h.  Design notes: docs/store.md.
 *
 * A store maps swap slots (0 .. nr_slots-1) to stored pages.  Every page is
 * kept in the cheapest representation the policy allows:
 *
 *   SAME   a page of one repeated 8-byte word: kept in the slot, no object
 *   DUP    a reference to an identical stored page or base (xxh64 + memcmp)
 *   TDELTA a delta against the template page of the same index
 *   XDELTA a delta against a similar page (template or other sandbox) found
 *          by sampled features
 *   PLAIN  lz4/zstd compressed
 *   RAW    stored uncompressed (did not compress below AZ_RAW_THRESHOLD)
 *
 * Sharing (DUP/TDELTA/XDELTA) only happens between pages whose owners are
 * registered in the same trust group.  Pages of unregistered owners are
 * stored SAME/PLAIN/RAW only.
 *
 * Concurrency contract for callers:
 *   - az_store_put_nowait and az_store_template_load_nowait never sleep:
 *     they allocate without direct reclaim only, and when that fails
 *     return -EAGAIN with what they need recorded in a struct az_reserve.
 *     The caller then gives up its az_ctx, calls az_reserve_fill (may
 *     sleep: GFP_NOIO) and calls them again with a context (zram's
 *     two-phase allocation), so no context is held while sleeping.
 *     az_store_put and az_store_template_load do all of that with one
 *     context held throughout (for callers that own their context).
 *     az_store_get never sleeps (it decodes under the slot's bit
 *     spinlock, like zram).  Each call needs exclusive use of the az_ctx
 *     it is given (the glue keeps one per CPU, guarded by a mutex).
 *   - Registry calls (add/del sandbox/template) run in process context;
 *     az_store_del_* may sleep until the puts in flight for that owner
 *     finish.
 *   - az_store_free never sleeps and never allocates: it may run under the
 *     swap lock.  az_store_free_notify does the same but never waits for
 *     the slot lock either (swap_slot_free_notify).
 *   - Different slots may be used concurrently; calls on the same slot are
 *     serialised by the core's per-slot lock.
 *   - az_core_init runs once before any store is created (module load),
 *     az_core_exit after the last one is destroyed.
 */
#ifndef AZCORE_H
#define AZCORE_H

#include "az_shim.h"

#define AZ_PAGE_SIZE 4096u
/* A compressed page at least this large is kept raw. */
#define AZ_RAW_THRESHOLD (AZ_PAGE_SIZE * 3 / 4)
/* Pages one object holds at most (az_store_pack()); the codecs take that. */
#define AZ_PACK_MAX 4u
/*
 * Slots a pack's pages are gathered from at most, its first included
 * (az_store_pack()): a reclaim batch puts one cgroup's pages in
 * consecutive slots, its duplicates and deltas between its plain pages.
 */
#define AZ_PACK_SPAN 64u
/*
 * zstd level of a pack at least (a higher policy level stays): packs are
 * made off the swap path, where a level costs encode time only (decode is
 * the same).  Coding-agent heap and text pages: 0.79 of level 3's bytes.
 */
#define AZ_PACK_ZSTD_LEVEL 6

enum az_codec {
	AZ_CODEC_LZ4 = 0,
	AZ_CODEC_ZSTD = 1,
};

#define AZ_ZSTD_LEVEL_MIN 1
#define AZ_ZSTD_LEVEL_MAX 9

enum az_kind {
	AZ_KIND_SAME = 0,
	AZ_KIND_DUP,
	AZ_KIND_TDELTA,
	AZ_KIND_XDELTA,
	AZ_KIND_PLAIN,
	AZ_KIND_RAW,
	AZ_NR_KINDS,
};

/* Who wrote a page, and where it sits in its mapping. */
struct az_page_info {
	u64 owner;	/* memory cgroup id (cgroup_id()), 0 = unknown */
	u64 index;	/* page->index: linear page index / file page offset */
};

/*
 * Store-wide policy; az_policy_check validates every field (the ranges are
 * defined once, in store.c: az_policy_range).
 * Defaults: lz4, level 3, dedup/tdelta/xdelta on, sim_effort 4,
 * delta_max_pct 80, verify on, shuffle on.  At most 8 similarity
 * candidates exist per page (2 super-features x 4 ways), so sim_effort
 * > 8 acts as 8.
 * With verify on, a load whose page does not hash to the
 * value recorded at store time fails with -EIO; costs ~10% of load
 * throughput on the host).  With shuffle on, pages of registered owners
 * that lz4/zstd cannot shrink below 1/2 page are also tried bit-shuffled
 * (float arrays) and kept encoded up to 15/16 page, in split objects above
 * 3/4 page:
 * smaller, at ~1.5 us more CPU per such page on store and on load (this
 * host); off, they are stored raw as zram would (docs/store.md).
 */
struct az_policy {
	u32 codec;		/* enum az_codec: codec for PLAIN objects */
	u32 level;		/* zstd level 1..9 (ignored for lz4) */
	u32 dedup;		/* bool: exact duplicates */
	u32 tdelta;		/* bool: template-relative delta */
	u32 xdelta;		/* bool: similarity (cross-sandbox) delta */
	u32 sim_effort;		/* candidates checked per page, 0..64 */
	u32 delta_max_pct;	/* largest delta, % of plain (az_choose) */
	u32 verify;		/* bool: xxh64-check every page read back */
	u32 shuffle;		/* bool: bit-shuffled and split objects */
};

/* Global statistics (one snapshot; counters are monotonic unless noted). */
struct az_stats {
	u64 pages_stored;	/* slots in use now */
	u64 orig_bytes;		/* pages_stored * PAGE_SIZE */
	u64 stored_bytes;	/* pool bytes of live objects (split links too) */
	u64 pool_bytes;		/* bytes the allocator holds */
	u64 meta_bytes;		/* slots + owners + objects + indexes + cache */
	u64 index_bytes;	/* dedup + similarity index part of meta_bytes */
	u64 template_bytes;	/* stored bytes of template bases */
	u64 kind_pages[AZ_NR_KINDS];	/* slots per representation now */
	u64 objects;		/* live objects */
	u64 bases;		/* live objects referenced by a delta */
	u64 failed_stores;	/* monotonic */
	u64 failed_loads;	/* monotonic */
	u64 stores;		/* monotonic */
	u64 loads;		/* monotonic */
	u64 frees;		/* monotonic */
	u64 template_pages;	/* template index entries (bases by index) */
	u64 cross_group;	/* sharing across trust groups: always 0 */
	u64 deferred;		/* objects waiting for the deferred free */
	u64 base_cache_pages;	/* decoded-base cache size (entries) */
	u64 base_cache_hits;	/* monotonic: base reads served by the cache */
	u64 base_cache_misses;	/* monotonic: base reads that decoded */
	u64 compacted_bytes;	/* monotonic: pool bytes freed by compaction */
	/* meta_bytes by component (all but slot_used_bytes sum to it): */
	u64 slot_bytes;		/* slot table: directory and leaves in use */
	u64 slot_used_bytes;	/* its entries of the slots in use */
	u64 owner_bytes;	/* owner table */
	u64 obj_meta_bytes;	/* struct az_obj of live objects */
	u64 index_table_bytes;	/* dedup, template, similarity tables */
	u64 tnode_bytes;	/* template index chunks */
	u64 base_cache_bytes;	/* decoded-base cache */
	/* monotonic: template entries a put could not make (page stored) */
	u64 template_lost;
	u64 packs;		/* live multi-page objects (az_store_pack) */
	u64 packed_pages;	/* slots referring to one */
	/* sparse similarity entries (az_store_set_sim_sample): */
	u64 sim_sparse;		/* group buckets sparse now (of AZ_SIM_GROUPS) */
	u64 sim_waiting;	/* objects whose entries wait (keys kept) */
	u64 sim_switches;	/* monotonic: group buckets switched */
	u64 sim_direct;		/* group buckets storing private pages direct */
	u64 direct_pages;	/* slots holding a page without an object */
};

/*
 * Per owner (sandbox or template) statistics.
 *
 * Accounting rule ("creator pays"): every stored object is charged, for
 * its whole life, to the owner whose page created it.  Its bytes count in
 * that owner's exclusive_bytes until anything else refers to it (a DUP
 * slot, a delta using it as base, a template index entry); from then on
 * they count in the creator's shared_bytes, even after the creator's own
 * slot is freed or the creator is removed.  Slots that merely refer to
 * someone else's object (DUP) cost their owner 0 bytes; a delta object
 * is charged to its own creator.  So for every owner entry, including
 * cgroup id 0 (all unregistered cgroups) and removed owners that still
 * own bytes:  sum(exclusive_bytes + shared_bytes) == stored_bytes,
 * sum(pages) == pages_stored and sum(kind_pages[k]) == kind_pages[k];
 * template owners' bytes sum to template_bytes.
 */
struct az_owner_stats {
	u64 cgroup_id;
	u32 group;		/* trust group */
	u32 is_template;
	u64 pages;		/* slots this owner holds now */
	u64 orig_bytes;		/* pages * AZ_PAGE_SIZE */
	u64 exclusive_bytes;	/* bytes of objects it created, unshared */
	u64 shared_bytes;	/* bytes of objects it created, now shared */
	u64 kind_pages[AZ_NR_KINDS];
	u64 template_pages;	/* its pages in the template index */
	u32 registered;		/* 0 once removed (kept while it owns bytes) */
	u32 entry;		/* its index in the owner table (list order) */
};

struct az_store;
struct az_ctx;
struct az_obj;
struct az_tchunk;

/*
 * Allocations a no-wait put could not make (see the concurrency contract):
 * zero it before the first attempt, az_reserve_fill() between the two,
 * az_reserve_release() after the last.  Opaque to callers.
 */
struct az_reserve {
	u32 size;		/* pool bytes of the object wanted, 0 = none */
	bool obj;		/* its struct az_obj too (not a DIRECT slot) */
	bool tnode;		/* a template index chunk */
	bool filled;		/* filled once: a second shortfall is -ENOMEM */
	bool leaf;		/* a slot table leaf */
	void *l;		/* ... reserved: AZ_LEAF_BYTES */
	struct az_obj *o;
	struct az_tchunk *t;
	unsigned long h[2];	/* pool handles ... */
	u32 hsize[2];		/* ... and their sizes */
};

int az_core_init(void);
void az_core_exit(void);
/* Bytes of one object header (struct az_obj): its slab object size. */
size_t az_obj_header_bytes(void);

/*
 * Policy fields in struct az_policy order.  az_policy_range() gives the
 * allowed values of one (level: 1..9; 0 = the default, lz4 only);
 * az_policy_check() checks a whole policy: 0, or -EINVAL with the first
 * bad field in *@bad (if not NULL).
 */
enum az_policy_field {
	AZ_POL_CODEC,
	AZ_POL_LEVEL,
	AZ_POL_DEDUP,
	AZ_POL_TDELTA,
	AZ_POL_XDELTA,
	AZ_POL_SIM_EFFORT,
	AZ_POL_DELTA_MAX_PCT,
	AZ_POL_VERIFY,
	AZ_POL_SHUFFLE,
	AZ_POL_NR,
};

void az_policy_range(enum az_policy_field f, u32 *min, u32 *max);
int az_policy_check(const struct az_policy *p, int *bad);

/* Per-CPU scratch: codec workspaces and page buffers. May sleep. */
struct az_ctx *az_ctx_create(void);
void az_ctx_destroy(struct az_ctx *ctx);

/* @name labels the allocator pool. Returns NULL on allocation failure. */
struct az_store *az_store_create(u64 nr_slots, const char *name);
/* Frees every object; the caller guarantees no concurrent use. */
void az_store_destroy(struct az_store *s);

/* 0 = unlimited.  Counted against pool_bytes. */
void az_store_set_mem_limit(struct az_store *s, u64 bytes);
/* az_policy_check() first.  Every field, the codec too, may change live. */
int az_store_set_policy(struct az_store *s, const struct az_policy *p);
void az_store_get_policy(struct az_store *s, struct az_policy *p);

/*
 * Store one page in @slot, replacing what was there once the new page is
 * stored.  0 on success; -ENOMEM when the pool is full or allocation
 * failed (the slot then keeps what it held before and the caller keeps
 * the page); -EINVAL for a bad slot.  The _nowait form may also return
 * -EAGAIN (see the concurrency contract); nothing changed then.
 */
int az_store_put(struct az_store *s, struct az_ctx *ctx, u64 slot,
		 const void *page, const struct az_page_info *pi);
int az_store_put_nowait(struct az_store *s, struct az_ctx *ctx, u64 slot,
			const void *page, const struct az_page_info *pi,
			struct az_reserve *res);
/* Allocate what @res records; may sleep.  0 or -ENOMEM (counted failed). */
int az_reserve_fill(struct az_store *s, struct az_reserve *res);
void az_reserve_release(struct az_store *s, struct az_reserve *res);
/*
 * Read @slot into @page.  0 on success; an empty slot reads as zeroes and
 * returns 0; -EINVAL for a bad slot; -EIO when the stored object fails to
 * decode (corruption).
 */
int az_store_get(struct az_store *s, struct az_ctx *ctx, u64 slot, void *page);
/* Drop @slot.  Atomic context safe: no sleep, no allocation. */
void az_store_free(struct az_store *s, u64 slot);
/*
 * Drop @slot unless its lock is held (a reader decoding it): then nothing
 * changes and -EBUSY is returned (the slot is freed when it is next
 * written or discarded).  Never waits for a reader; the slot table's
 * leaf lock may be taken for a moment when the slot was its leaf's last.
 */
int az_store_free_notify(struct az_store *s, u64 slot);
/*
 * Pack slots [@first, @first + @nr): runs of up to AZ_PACK_MAX slots whose
 * pages are PLAIN, of one sandbox (an owner that is no template, registered
 * or since removed) and referred to by that slot alone, gathered from at
 * most AZ_PACK_SPAN slots (the slots between them hold something else; a
 * run ends at another sandbox's such page), become one object (each slot
 * keeps random access: a load decodes the pack, or copies from the
 * context's last decoded one).  A run whose pages do not encode into one
 * object smaller than they are is tried one page shorter, down to two.
 * A run is
 * packed only when the pack takes fewer pool bytes and object headers
 * than the pages it replaces (checked again once installed: slots freed
 * meanwhile undo it); a DIRECT page gets an object to join one, and its
 * DIRECT slot back if it does not.
 * It may exceed mem_limit by up to 64 pages for that moment.  A packed
 * page is no dedup target or delta base for later pages.  *@packed: the
 * slots that now refer to a pack.  0, or -EINVAL for a bad range.  May
 * run beside puts, loads and frees of the same slots (a slot changed
 * meanwhile stays as it is); never sleeps for memory, takes one slot lock
 * at a time, and reschedules between runs: call it where it may sleep.
 */
int az_store_pack(struct az_store *s, struct az_ctx *ctx, u64 first, u64 nr,
		  u64 *packed);
/* Kind of @slot's page, or -ENOENT when empty. */
int az_store_slot_kind(struct az_store *s, u64 slot);
/*
 * Kind of @slot's page as above; *@bytes (if not NULL) gets the pool bytes
 * of the object the slot refers to (0 for SAME; a shared object counts
 * whole).  Takes only the slot's bit lock.
 */
int az_store_slot_info(struct az_store *s, u64 slot, u32 *bytes);

/*
 * Decoded-base cache size in entries (bcache.c): rounded down to a power
 * of two of 4-entry sets, 0 = off, default 256 (pages held while they
 * serve, at most one per entry).  May sleep.  -EINVAL
 * above AZ_BC_MAX_PAGES, -ENOMEM (old cache kept) when allocation fails.
 */
#define AZ_BC_MAX_PAGES		65536
int az_store_set_base_cache(struct az_store *s, u32 pages);
u32 az_store_get_base_cache(struct az_store *s);

/*
 * Similarity index size (index.c): swap slots per similarity entry, a
 * power of two from 1 (the default) to AZ_SIM_SLOTS_MAX.  The indexes are
 * allocated when the first owner registers; until then this may change,
 * afterwards it is -EBUSY.  -EINVAL for other values.
 */
#define AZ_SIM_SLOTS_MAX	64
static inline bool az_sim_slots_valid(u32 slots)
{
	return slots && slots <= AZ_SIM_SLOTS_MAX && !(slots & (slots - 1));
}
int az_store_set_sim_slots(struct az_store *s, u32 slots);
u32 az_store_get_sim_slots(struct az_store *s);

/*
 * Sparse similarity entries (index.c): a trust group whose similarity
 * lookups find few bases gives entries to 1 in @sample of its objects
 * only, until its lookups find enough again.  A power of two from 1 (never
 * sparse) to AZ_SIM_SAMPLE_MAX, default AZ_SIM_SAMPLE_DEFAULT; may change
 * at any time (the entries follow in the background).  -EINVAL otherwise.
 */
#define AZ_SIM_SAMPLE_MAX	64
#define AZ_SIM_SAMPLE_DEFAULT	8
static inline bool az_sim_sample_valid(u32 sample)
{
	return sample && sample <= AZ_SIM_SAMPLE_MAX &&
	       !(sample & (sample - 1));
}
int az_store_set_sim_sample(struct az_store *s, u32 sample);
u32 az_store_get_sim_sample(struct az_store *s);

void az_store_get_stats(struct az_store *s, struct az_stats *st);
u64 az_store_nr_slots(struct az_store *s);
/* Pool bytes now (the stats' pool_bytes): one counter read, no lock. */
u64 az_store_pool_bytes(struct az_store *s);

/*
 * Pool compaction.  Freed objects leave holes in zsmalloc's pages, so the
 * pool can stay large after many pages came back.  az_store_compact_wanted
 * says the pool holds more than 1/8 (and 4 MiB) beyond the live payload;
 * atomic context safe (two counter reads).  az_store_compact moves objects
 * and frees emptied pages; process context, may sleep; returns bytes freed.
 */
bool az_store_compact_wanted(struct az_store *s);
u64 az_store_compact(struct az_store *s);

/*
 * Registry (netlink commands map onto these).  Errors: -EEXIST duplicate
 * (the id is registered, as a sandbox or a template), -ENOENT unknown (or
 * of the other kind), -EINVAL cgroup id 0, -ENOSPC owner table full
 * (1023 owners per store).  Removal always succeeds for a registered
 * owner: its stored pages stay readable and stay charged to it (listed
 * with registered = 0) until they are freed; new pages of that cgroup are
 * stored unshared.  Removing a template also drops its template index
 * entries; bases in use by deltas live on.  Re-adding a removed owner
 * reuses its entry.
 */
int az_store_add_sandbox(struct az_store *s, u64 cgroup_id, u32 group);
int az_store_del_sandbox(struct az_store *s, u64 cgroup_id);
/* A template is an owner whose stored pages become bases for its group. */
int az_store_add_template(struct az_store *s, u64 cgroup_id, u32 group);
int az_store_del_template(struct az_store *s, u64 cgroup_id);
/*
 * Index map of a registered owner: its pages whose index hint falls in
 * [@start, @start + @pages) are the template's pages from @pgoff on (a
 * private mapping of a snapshot file, on kernels that index a copied-on-
 * write page by its virtual page number rather than its file offset).
 * The map applies to the hint before the template lookup and before a
 * template owner's page is keyed; @pages 0 clears it.  Re-registering an
 * owner clears it too.  -ENOENT not a registered owner, -EINVAL cgroup id
 * 0 or a range that wraps.  A page stored while the map changes may be
 * looked up with either: the index is a hint, a wrong one costs a delta,
 * never data.
 */
int az_store_set_map(struct az_store *s, u64 cgroup_id, u64 start, u64 pages,
		     u64 pgoff);
/*
 * Snapshot-file templates: @tid is a synthetic owner id registered with
 * az_store_add_template(); each page becomes a base keyed by @index (a
 * page already loaded at that index in the group is replaced).  A
 * same-filled page stores nothing and returns 0.  -ENOENT when @tid is not
 * a registered template, -ENOMEM when the pool is full.
 */
int az_store_template_load(struct az_store *s, struct az_ctx *ctx, u64 tid,
			   u64 index, const void *page);
int az_store_template_load_nowait(struct az_store *s, struct az_ctx *ctx,
				  u64 tid, u64 index, const void *page,
				  struct az_reserve *res);
/* Fill @out for owner @cgroup_id; -ENOENT when unknown. */
int az_store_owner_stats(struct az_store *s, u64 cgroup_id,
			 struct az_owner_stats *out);
/*
 * Iterate owners in table order: fills up to @max entries from table index
 * @start on and returns the count; the next call starts at the last
 * entry's @entry + 1, so owners added or removed meanwhile never make the
 * others be skipped or repeated.  *@gen (if not NULL) gets the registry
 * generation, which every add and del changes, read under the same lock.
 */
int az_store_list_owners(struct az_store *s, u32 start,
			 struct az_owner_stats *out, u32 max, u32 *gen);

/*
 * Run deferred frees now (the kernel also runs them from a workqueue).
 * Tests call this before checking that memory returned to zero.
 */
void az_store_drain(struct az_store *s);

const char *az_kind_name(enum az_kind k);

/*
 * Self-test (selftest.c, in debug builds of the module: AZSWAP_SELFTEST;
 * always in the host library): creates its own store, exercises every
 * representation with lz4 and zstd, a removed template, corruption and
 * mem_limit; 0 or -EINVAL (logged).  Process context; takes ~10 ms.
 */
int az_core_selftest(void);
/*
 * Concurrent stress (selftest.c): @nthreads workers and a control thread
 * on a private store for @ms milliseconds; 0 or -EINVAL (logged).
 */
int az_core_stress(unsigned int nthreads, unsigned int ms);

#endif /* AZCORE_H */
