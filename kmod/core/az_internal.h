/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Internal structures of the store core, shared by its .c files only.
 *
 * Lock order (outer to inner), see docs/store.md:
 *   slot bit lock  ->  s->idx_lock
 *   slot bit lock  ->  s->bc_lock (innermost; covers one page copy)
 *   s->reg_lock is never held together with another core lock; the put
 *   path does not take it (owners are found through s->owner_hash).
 *   s->leaf_lock (slot table leaves) is never held with another lock of
 *   the core either.
 * The pool mapping (zs_map_object) is innermost: nothing is locked and no
 * other object is mapped while a mapping is held.
 */
#ifndef AZ_INTERNAL_H
#define AZ_INTERNAL_H

#include "azcore.h"

/* ---- objects ---------------------------------------------------------- */

/*
 * Stored object format (in the pool):
 *   size == AZ_PAGE_SIZE: the raw page, no header (zsmalloc's largest
 *   object is one page, so a raw page cannot carry a header).
 *   otherwise: a 4-byte header followed by the payload:
 *     byte 0  encoding (enum az_enc)
 *     byte 1  format version (AZ_OBJ_VERSION)
 *     byte 2-3 payload length, little endian; must equal size - 4
 */
enum az_enc {
	AZ_ENC_LZ4 = 1,		/* lz4 block of the page */
	AZ_ENC_ZSTD = 2,	/* zstd frame of the page */
	AZ_ENC_XOR_LZ4 = 3,	/* lz4 block of page ^ base */
	AZ_ENC_XOR_ZSTD = 4,	/* zstd frame of page ^ base */
	AZ_ENC_DICT_LZ4 = 5,	/* lz4 block with base as dictionary */
	AZ_ENC_XSHUF_LZ4 = 6,	/* lz4 block of bit-shuffled page ^ base */
	AZ_ENC_XSHUF_ZSTD = 7,	/* zstd frame of bit-shuffled page ^ base */
	AZ_ENC_SHUF_LZ4 = 8,	/* lz4 block of the bit-shuffled page */
	AZ_ENC_SHUF_ZSTD = 9,	/* zstd frame of the bit-shuffled page */
	AZ_ENC_SUB_LZ4 = 10,	/* lz4 block of page - base (u64 words) */
	AZ_ENC_SUB_ZSTD = 11,	/* zstd frame of page - base (u64 words) */
	AZ_ENC_PACK_LZ4 = 12,	/* lz4 block of 2..AZ_PACK_MAX pages */
	AZ_ENC_PACK_ZSTD = 13,	/* zstd frame of 2..AZ_PACK_MAX pages */
	AZ_ENC_MAX = AZ_ENC_PACK_ZSTD,
};

#define AZ_OBJ_VERSION	1
#define AZ_HDR_SIZE	4
/* Encoded objects are built in buffers of this size. */
#define AZ_OBUF_SIZE	(2 * AZ_PAGE_SIZE)

/*
 * A pack (PACK encodings) holds the pages of up to AZ_PACK_MAX nearby
 * slots of one owner, compressed together (az_store_pack()): its payload
 * decodes to a whole number of pages, 2..AZ_PACK_MAX, and each slot keeps
 * its page's position in it (AZ_SLOT_MEMBER).  A load decodes the pack and
 * copies one page out.  AZ_PACK_MAX: azcore.h.
 */

static inline bool az_enc_is_pack(unsigned int enc)
{
	return enc == AZ_ENC_PACK_LZ4 || enc == AZ_ENC_PACK_ZSTD;
}

static inline bool az_enc_is_delta(unsigned int enc)
{
	return (enc >= AZ_ENC_XOR_LZ4 && enc <= AZ_ENC_XSHUF_ZSTD) ||
	       enc == AZ_ENC_SUB_LZ4 || enc == AZ_ENC_SUB_ZSTD;
}

/*
 * A base stored bit-shuffled (see below) or raw: numeric arrays, whose
 * updates change every word a little.
 */
static inline bool az_enc_is_numeric(unsigned int enc)
{
	return enc == AZ_ENC_SHUF_LZ4 || enc == AZ_ENC_SHUF_ZSTD || !enc;
}

/*
 * Bit shuffle (SHUF, XSHUF encodings): the page as 1024 4-byte words,
 * stored as 32 bit planes of 128 bytes (bit 0 of every word, then bit 1,
 * ...; the order of the words in a plane: az_shuffle() in codec.c).  Float32 arrays keep sign,
 * exponent and high mantissa bits in a few nearly constant planes, and a
 * small update XORs to words whose high planes are zero: long runs lz4
 * can match, where the bytes are noise.  An XOR delta against a numeric
 * base (az_enc_is_numeric()) is tried shuffled when it did not compress
 * to AZ_SHUF_MIN_DELTA bytes or less, a page without base when it
 * compressed to more than AZ_SHUF_MIN_PLAIN (shared objects only); under
 * zstd a noisy one (below) is tried shuffled only.
 */
#define AZ_SHUF_MIN_DELTA	(AZ_PAGE_SIZE / 4)
#define AZ_SHUF_MIN_PLAIN	(AZ_PAGE_SIZE / 2)
/*
 * Noise in the two low bytes of a page's 4-byte words (float32 mantissas,
 * random bytes; az_page_is_noisy() in codec.c): under zstd such a page is
 * compressed shuffled only (its bytes as they are if that fails), and so
 * is such an XOR delta against a numeric base (with fewer than
 * AZ_XOR_MIN_ZERO zero words), unless an lz4 probe finds the bytes repeat.
 * Their bytes do not compress as they are; the bit planes above them may.
 */
#define AZ_NOISE_SAMPLES	128
#define AZ_NOISE_MAX_SAME	4
/* of the 2 x AZ_NOISE_SAMPLES words sampled: 1/4 to 3/4 */
#define AZ_NOISE_MIN_HIGH	(AZ_NOISE_SAMPLES / 2)
#define AZ_NOISE_MAX_HIGH	(AZ_NOISE_SAMPLES * 3 / 2)
#define AZ_NOISE_MAX_ZERO	2
/*
 * A delta form of at most AZ_DELTA_DONE bytes ends the search for a
 * smaller one: no other form could save more than that.  A delta is tried
 * as a word-wise difference (SUB encodings) when at least
 * AZ_SUB_MIN_REPEATS non-zero differences repeat a recent one (pointers of
 * a mapping moved by one distance); otherwise the compression is not worth
 * its time.
 */
#define AZ_DELTA_DONE		128
#define AZ_SUB_MIN_REPEATS	16
/*
 * An XOR delta against a base that is not numeric is compressed as it is
 * only when at least this many of its 64-bit words are zero (of 512): with
 * fewer, the content moved or every word changed, and the other forms win.
 */
#define AZ_XOR_MIN_ZERO		8

/*
 * A 64-bit word that looks like a user-space pointer (2^40 <= w < 2^48):
 * the similarity features hash it by its offset in its page only, since
 * address-space randomisation moves each mapping by whole pages.
 */
static inline bool az_user_ptr_like(u64 w)
{
	return (w >> 40) && !(w >> 48);
}

/*
 * Objects of registered owners (struct az_obj, and a direct group's DIRECT
 * pages) are kept encoded up to AZ_OBJ_MAX bytes; an unregistered owner's
 * DIRECT ones, like zram, up to AZ_RAW_THRESHOLD.  An
 * object above AZ_RAW_THRESHOLD is near or in zsmalloc's huge class (6.1:
 * from ~3.2 KiB, a whole page each, or a class holding one object per
 * page and a bit), so it is stored split in two pool allocations: what
 * fills half a page in zsmalloc, then the rest (AZ_SPLIT_HEAD).
 */
#define AZ_OBJ_MAX		(AZ_PAGE_SIZE * 15 / 16)
#define AZ_SPLIT_MIN		AZ_RAW_THRESHOLD

/*
 * A split object's first allocation: AZ_SPLIT_HEAD bytes, which zsmalloc
 * packs two to a page with nothing lost (zs_malloc adds its 8-byte handle
 * to every object: 6.1 mm/zsmalloc.c:1412).  It holds the second
 * allocation's handle (AZ_SPLIT_LINK bytes, little endian) and then the
 * first AZ_SPLIT_DATA bytes of the object; the second allocation (1/4..7/16
 * page, an ordinary class) holds the rest.  Equal halves fell in merged
 * classes: the live microVM run's pool was 7% above the payload; a model
 * of 6.1's classes puts this split at 2%.
 */
#define AZ_SPLIT_HEAD	(AZ_PAGE_SIZE / 2 - 8)
#define AZ_SPLIT_LINK	8
#define AZ_SPLIT_DATA	(AZ_SPLIT_HEAD - AZ_SPLIT_LINK)

/* Is an object of @size bytes stored in two pool allocations? */
static inline bool az_obj_split(u32 size)
{
	return size > AZ_SPLIT_MIN && size < AZ_PAGE_SIZE;
}

/* Largest encoded object a registered owner's page may become. */
static inline u32 az_obj_max(const struct az_policy *pol)
{
	return pol->shuffle ? AZ_OBJ_MAX : AZ_RAW_THRESHOLD;
}

/* Similarity features: see az_sim_features() in index.c. */
#ifndef AZ_NR_SF
#define AZ_NR_SF		2	/* super-features (index keys) */
#endif
#ifndef AZ_SIM_PER_SF
#define AZ_SIM_PER_SF		2	/* min-hash features per super-feature */
#endif
#ifndef AZ_SIM_DENSITY
#define AZ_SIM_DENSITY		1	/* default slots per similarity entry */
#endif
#ifndef AZ_SIM_BLOCK_SIZE
#define AZ_SIM_BLOCK_SIZE	32	/* bytes per hashed block */
#endif

/* Bits in az_obj.flags (az_obj_flag_set() and friends). */
enum {
	AZ_OBJ_SHARED,		/* counted in its owner's shared_bytes */
	AZ_OBJ_BASE,		/* referenced by a delta; counted in bases */
	AZ_OBJ_INDEXED,		/* linked in the dedup/similarity indexes */
	AZ_OBJ_TEMPLATE,	/* charged to a template owner */
	AZ_OBJ_CACHED,		/* may have a decoded copy in the base cache */
	AZ_OBJ_SIM_LATER,	/* similarity keys kept, no entries (index.c) */
	AZ_OBJ_FROM_DIRECT,	/* a DIRECT slot's page, to be packed */
};

/*
 * A stored object.  Metadata lives in slab memory (48 bytes on 64-bit
 * hosts with the default AZ_NR_SF: a cache of its own, az_obj_zalloc());
 * the encoded bytes live in the pool.
 * @ref counts slots referring to it, deltas using it as base and template
 * index entries.  Everything but @ref, @flags, @nr_sf and @dnext/@dnode
 * is written once before the object is published and read-only
 * afterwards (@nr_sf and @dnext change under idx_lock; @dnode is written
 * once the last put unlinked the object).
 *
 * A delta (az_enc_is_delta(@enc)) has a base and never similarity index
 * entries; any other object may have index entries and never a base, so
 * the two share memory: read the base with az_obj_base().  A pack is
 * neither indexed nor a delta: it keeps its id there and its page count
 * in place of @nr_sf.  Its @hash covers all its pages; each slot referring
 * to it holds one reference.
 *
 * @hash is the top half of the decoded page's xxh64 (az_hash_tag()): the
 * dedup index's key and the check of a decoded copy.  A dedup candidate is
 * always compared byte for byte, so 32 bits only decide how often a
 * candidate is decoded in vain.
 *
 * @dnext links an indexed object into its dedup chain.  The last
 * reference's put takes the object out of the indexes (az_obj_put()), so
 * the deferred free that follows reuses that word as its list link.
 *
 * The second pool allocation of a split object (see AZ_SPLIT_HEAD) is not
 * kept here: its handle is the first 8 bytes of the first, checked against
 * @link_check before it is used, so a corrupted link is -EIO (and a leaked
 * allocation at free), never a wild handle.
 */
struct az_obj {
	az_ref_t ref;
	az_atomic_t flags;	/* AZ_OBJ_* bits */
	u16 owner;		/* owner index charged for the bytes */
	u16 size;		/* bytes in the pool (at most AZ_PAGE_SIZE) */
	u8 enc;			/* enum az_enc, or 0 for a raw page */
	union {
		u8 nr_sf;	/* similarity index entries: @sim_key */
		u8 pack_pages;	/* a pack's pages: 2..AZ_PACK_MAX */
	};
	u16 link_check;		/* split object: az_link_check() of the link */
	u32 group;		/* trust group (valid when owner != 0) */
	u32 hash;		/* az_hash_tag() of the decoded page */
	union {
		struct az_obj *base;	/* a delta's base (referenced) */
		u32 sim_key[AZ_NR_SF];	/* similarity keys (index.c) */
		u64 pack_id;		/* a pack's: unique while the module lives */
	};
	unsigned long handle;	/* pool handle */
	union {
		struct az_obj *dnext;	/* dedup chain, under idx_lock */
		struct az_defer_node dnode;	/* deferred free, once unindexed */
	};
};

static inline u16 az_link_check(u64 handle)
{
	return (u16)((handle * 0x9e3779b97f4a7c15ULL) >> 48);
}

static inline u32 az_hash_tag(u64 hash)
{
	return (u32)(hash >> 32);
}

/* Pool bytes charged for an object of @size bytes: a split one's link too. */
static inline u32 az_size_bytes(u32 size)
{
	return size + (az_obj_split(size) ? AZ_SPLIT_LINK : 0);
}

/* Pool bytes charged for @o. */
static inline u32 az_obj_bytes(const struct az_obj *o)
{
	return az_size_bytes(o->size);
}

/* The base of a delta, NULL for any other object. */
static inline struct az_obj *az_obj_base(const struct az_obj *o)
{
	return az_enc_is_delta(o->enc) ? o->base : NULL;
}

static inline void az_obj_flag_set(struct az_obj *o, unsigned int nr)
{
	az_atomic_or(1U << nr, &o->flags);
}

static inline bool az_obj_flag(const struct az_obj *o, unsigned int nr)
{
	return az_atomic_read(&o->flags) & (1U << nr);
}

static inline void az_obj_flag_clear(struct az_obj *o, unsigned int nr)
{
	az_atomic_andnot(1U << nr, &o->flags);
}

/* Set @nr; returns whether it was set before (fully ordered). */
static inline bool az_obj_flag_test_and_set(struct az_obj *o, unsigned int nr)
{
	return az_atomic_fetch_or(1U << nr, &o->flags) & (1U << nr);
}

/* ---- slots ------------------------------------------------------------ */

/*
 * A slot: @flags holds the lock bit, a used bit, the kind and the owner
 * index; @val is the repeated word (SAME), a struct az_obj pointer, or -
 * for a DIRECT slot - a pool handle.  Both are protected by the slot's bit
 * lock.
 *
 * DIRECT slots are the zram-style fast path for pages that are never
 * shared (unregistered owners, and a direct group's unsampled plain pages:
 * index.c): PLAIN/RAW objects without an az_obj, the object size and the
 * top 26 bits of the page's xxh64 kept in @flags.  A split one (a direct
 * group's, see AZ_SPLIT_HEAD) keeps its first allocation's handle; the
 * second's is read from it and checked against the az_link_check() the
 * slot keeps (LINK, 16 bits as in an object: bits 0-5 and 6-15 of it),
 * so a corrupted link is -EIO on a load and a leaked allocation at the
 * free, not a wild handle; its page check is the top 16 bits of the hash.
 *
 *   bits  0-11  owner index       bit 17     DIRECT
 *   bits 12-15  kind              bits 18-21 page in its pack (MEMBER)
 *   bit  16     used              bits 18-23 link check 0-5 (DIRECT, split)
 *                                 bit 24     lock
 *                                 bits 25-37 object size (DIRECT)
 *                                 bits 38-63 xxh64 >> 38 (DIRECT)
 *                                 bits 38-47 link check 6-15 (DIRECT, split)
 *                                 bits 48-63 xxh64 >> 48 (DIRECT, split)
 */
struct az_slot {
	unsigned long flags;
	u64 val;
};

/*
 * The slot table is two levels: a directory entry per AZ_LEAF_SLOTS slots
 * (allocated for the whole device at create, 16 bytes per 64 slots) and
 * leaves of AZ_LEAF_SLOTS slots (one 1 KiB allocation each), allocated by
 * the first put into their range and freed when their last slot is.
 *
 * @ref counts the leaf's used slots plus the holds of callers working on
 * one of its slots (az_slot_hold() and friends in store.c); @leaf is
 * valid while the caller holds a reference.  @ref goes from 0 to 1, and
 * @leaf is installed or cleared, only under s->leaf_lock; any other
 * change is an atomic increment from a nonzero value or a decrement.  So
 * a leaf is freed only when nobody holds it, and a hold taken on an entry
 * whose leaf is going fails (the slot is empty: nothing to read or free).
 */
#define AZ_LEAF_SHIFT		6
#define AZ_LEAF_SLOTS		(1U << AZ_LEAF_SHIFT)
#define AZ_LEAF_BYTES		(AZ_LEAF_SLOTS * sizeof(struct az_slot))

struct az_leaf_dir {
	struct az_slot *leaf;
	az_atomic_t ref;
};

#define AZ_SLOT_OWNER_MASK	0xfffUL
#define AZ_SLOT_KIND_SHIFT	12
#define AZ_SLOT_KIND_MASK	(0xfUL << AZ_SLOT_KIND_SHIFT)
#define AZ_SLOT_USED		(1UL << 16)
#define AZ_SLOT_DIRECT		(1UL << 17)
#define AZ_SLOT_MEMBER_SHIFT	18
#define AZ_SLOT_MEMBER_MASK	(0xfUL << AZ_SLOT_MEMBER_SHIFT)
#define AZ_SLOT_LINK_LO_SHIFT	18
#define AZ_SLOT_LINK_LO_BITS	6
#define AZ_SLOT_LINK_HI_SHIFT	38
#define AZ_SLOT_LINK_LO_MASK	(0x3fUL << AZ_SLOT_LINK_LO_SHIFT)
#define AZ_SLOT_LINK_MASK	(AZ_SLOT_LINK_LO_MASK | \
				 0x3ffUL << AZ_SLOT_LINK_HI_SHIFT)
#define AZ_SLOT_LOCK_BIT	24
#define AZ_SLOT_SIZE_SHIFT	25
#define AZ_SLOT_SIZE_MASK	0x1fffUL
#define AZ_SLOT_CHECK_SHIFT	38
#define AZ_SLOT_CHECK_MASK	(~0UL << AZ_SLOT_CHECK_SHIFT)
#define AZ_SLOT_SPLIT_CHECK_SHIFT	48
/*
 * A direct group's page is not sampled: one of hash bits 54.. (the tag's
 * 22.., az_sim_sampled()) is set, so its check is never 0 ("no check").
 */
_Static_assert(AZ_SLOT_SPLIT_CHECK_SHIFT <= 32 + 22,
	       "a split DIRECT page's check could be 0");

static inline unsigned int az_slot_kind(unsigned long flags)
{
	return (flags & AZ_SLOT_KIND_MASK) >> AZ_SLOT_KIND_SHIFT;
}

static inline u32 az_slot_member(unsigned long flags)
{
	return (flags & AZ_SLOT_MEMBER_MASK) >> AZ_SLOT_MEMBER_SHIFT;
}

static inline u32 az_slot_size(unsigned long flags)
{
	return (flags >> AZ_SLOT_SIZE_SHIFT) & AZ_SLOT_SIZE_MASK;
}

/* A split DIRECT slot's link check (az_link_check()), in place. */
static inline unsigned long az_slot_link(u16 check)
{
	return (((unsigned long)check << AZ_SLOT_LINK_LO_SHIFT) &
		AZ_SLOT_LINK_LO_MASK) |
	       ((unsigned long)(check >> AZ_SLOT_LINK_LO_BITS) <<
		AZ_SLOT_LINK_HI_SHIFT);
}

/* The link check a split DIRECT slot @flags keeps. */
static inline u16 az_slot_link_check(unsigned long flags)
{
	return ((flags & AZ_SLOT_LINK_LO_MASK) >> AZ_SLOT_LINK_LO_SHIFT) |
	       ((flags & AZ_SLOT_LINK_MASK & ~AZ_SLOT_LINK_LO_MASK) >>
		(AZ_SLOT_LINK_HI_SHIFT - AZ_SLOT_LINK_LO_BITS));
}

/*
 * The bits of DIRECT slot @flags (its size set) that hold its page's
 * check: 26, or 16 in a split one, whose link check takes the others.
 */
static inline unsigned long az_slot_check_mask(unsigned long flags)
{
	return az_obj_split(az_slot_size(flags)) ?
	       ~0UL << AZ_SLOT_SPLIT_CHECK_SHIFT : AZ_SLOT_CHECK_MASK;
}

/* The check of a page of hash @hash in DIRECT slot @flags, in place. */
static inline unsigned long az_slot_check(unsigned long flags, u64 hash)
{
	return (unsigned long)hash & az_slot_check_mask(flags);
}

struct az_store;
struct az_reserve;
unsigned long az_split_link(struct az_store *s, unsigned long h);
struct az_slot *az_slot_hold(struct az_store *s, u64 slot);
struct az_slot *az_slot_hold_new(struct az_store *s, struct az_reserve *res,
				 u64 slot, int *err);
void az_leaf_put(struct az_store *s, u64 slot);

/* ---- owners ----------------------------------------------------------- */

/* Owner 0 collects unregistered cgroups (never shares). */
#define AZ_MAX_OWNERS	1024
#define AZ_OWNER_BUCKETS	1024	/* s->owner_hash: cgroup id -> entry */
/* Entries are allocated AZ_OWNER_CHUNK at a time, as owners are added. */
#define AZ_OWNER_CHUNK		64
#define AZ_OWNER_CHUNKS		(AZ_MAX_OWNERS / AZ_OWNER_CHUNK)

enum {
	AZ_OWN_USED = 1,	/* entry holds (or held) an owner */
	AZ_OWN_REG = 2,		/* registered: may share in its group */
	AZ_OWN_TEMPLATE = 4,	/* its pages become bases */
};

/*
 * An owner entry.  @cgroup_id, @group and @flags change under reg_lock
 * only; puts read them without it (az_owner_pin: @flags last written with
 * release, read with acquire).  @hnext chains the entries of one bucket of
 * s->owner_hash (0 ends a chain).
 */
struct az_owner {
	u64 cgroup_id;
	u32 group;
	u32 flags;		/* AZ_OWN_* */
	u16 hnext;
	az_atomic_t busy;	/* puts in flight using this entry */
	az_atomic64_t pages;
	az_atomic64_t excl_bytes;
	az_atomic64_t shared_bytes;
	az_atomic64_t loaded_pages;
	az_atomic64_t kind_pages[AZ_NR_KINDS];
	/* Index map (az_store_set_map): set under reg_lock, read lock-free. */
	u64 map_start;
	u64 map_pages;		/* 0 = none; written last, with release */
	u64 map_pgoff;
};

/* ---- indexes (index.c) ----------------------------------------------- */

/*
 * Template index chunk: AZ_TCHUNK consecutive indexes of one trust group
 * -> their bases.  A template's pages come in dense runs (a process's
 * VMAs, a snapshot's memory file), so a chunk costs about 11 bytes per
 * template page (a node per page cost 32).  Entry i is set when @obj[i]
 * is: it holds a reference, and @owner[i] is the template owner that set
 * it.  Chunks are found, changed, linked and unlinked under idx_lock; a
 * chunk goes when its last entry does (az_template_drop_owner()).
 */
#define AZ_TCHUNK	48
#define AZ_TCHUNK_BYTES	512	/* allocated as: the kmalloc-512 class */

struct az_tchunk {
	struct az_tchunk *next;
	u64 first;		/* index of entry 0, a multiple of AZ_TCHUNK */
	u32 group;
	u16 used;		/* entries set */
	u16 owner[AZ_TCHUNK];
	struct az_obj *obj[AZ_TCHUNK];
};
_Static_assert(sizeof(struct az_tchunk) <= AZ_TCHUNK_BYTES,
	       "a template chunk fits its allocation class");

#define AZ_SIM_WAYS	4

/*
 * One set of the similarity table: 10 bytes per way.  The object keeps
 * the top half of each 64-bit key (az_obj.sim_key); a way's tag is 16
 * bits mixed from that half and the set index is its top bits, so a
 * lookup filters by tag and confirms by the object's key, a table being
 * resized knows where each entry goes, and an entry can be made again
 * from the object alone.
 */
struct az_sim_set {
	u16 tag[AZ_SIM_WAYS];
	struct az_obj *obj[AZ_SIM_WAYS];
};
_Static_assert(sizeof(struct az_sim_set) ==
	       AZ_SIM_WAYS * (sizeof(u16) + sizeof(void *)),
	       "a similarity-table way is a tag and a pointer, unpadded");

/*
 * A way's tag: 16 bits mixed from the kept half of the key (all of its
 * bits, not only those above the set index), so that the entries of an
 * object whose keys were kept for later can be made from the object alone.
 * An entry made for key k sits in set az_sim_setno(k) with az_sim_tag(k);
 * moves keep it so (index.c), the host checker checks it.
 */
static inline u16 az_sim_tag(u32 key32)
{
	return (u16)((key32 * 0x9e3779b1U) >> 16);
}

/* The set of @key32 in a table of 2^@bits sets. */
static inline u32 az_sim_setno(u32 key32, u32 bits)
{
	return key32 >> (32 - bits);
}

/*
 * Similarity yield of a trust group (index.c, "Sparse similarity
 * entries"): its lookups, the similarity deltas they gave and the pages
 * found as duplicates of its sandboxes' own plain pages, halved each time
 * they are judged.  Groups share AZ_SIM_GROUPS of these by hash.
 */
#define AZ_SIM_GROUP_BITS	6
#define AZ_SIM_GROUPS		(1U << AZ_SIM_GROUP_BITS)
struct az_sim_yield {
	u32 lookups;
	u32 hits;
	u32 dups;
	u32 dlookups;	/* lookups @dups counts over */
	u16 first;	/* the owner of its first lookup (still registered) */
	u32 others;	/* lookups of other owners, halved with @lookups */
};

static inline u32 az_sim_gno(u32 group)
{
	return (group * 0x9e3779b1U) >> (32 - AZ_SIM_GROUP_BITS);
}

/*
 * The index tables (index.c: how they are sized and resized).  Everything
 * is under s->idx_lock but @resize and @regroup (read without it) and
 * @resizing (the one process-context caller resizing the tables,
 * az_index_resize()).
 */
struct az_index {
	struct az_obj **dbuckets;	/* dedup: hash -> chain */
	u32 dmask;
	struct az_tchunk **tbuckets;	/* template: (group, index) -> base */
	u32 tmask;
	struct az_sim_set *sim;		/* similarity: set-associative */
	u32 sbits;			/* log2 of the number of sets */
	/*
	 * A dedup or similarity table being resized: the entries of its old
	 * buckets (sets) from @dmoved (@smoved) on are still in @dold (@sold).
	 */
	struct az_obj **dold;
	u32 dold_mask;
	u32 dmoved;
	struct az_sim_set *sold;
	u32 sold_bits;
	u32 smoved;
	/* Caps: the sizes a device full of indexed objects gets. */
	u32 dmax;
	u32 tmax;
	u32 smax_bits;
	u32 tgen;			/* changes when tbuckets is rehashed */
	bool resize;			/* a table is off its load */
	/* After a failed resize: no request while @indexed is in between. */
	u64 retry_below;
	u64 retry_at;
	unsigned long resizing;		/* bit 0: az_index_resize() runs */
	bool closing;			/* the store goes: no more resizes */
	u64 tchunks;			/* template chunks allocated */
	u64 indexed;			/* objects linked in the indexes */
	u64 simmed;			/* of which with similarity entries */
	u64 table_bytes;
	/*
	 * Sparse similarity entries: the objects of a group whose bit (by
	 * az_sim_gno()) is set in @sparse get entries only when sampled
	 * (s->sim_sample); the others keep their keys for later
	 * (AZ_OBJ_SIM_LATER, counted in @later).  @regroup: entries are to
	 * be linked or unlinked to match (az_index_resize() does it);
	 * @regrouping: that is under way.  No group is judged meanwhile.
	 * A sparse group whose bit is set in @direct stores a private plain
	 * page that is not sampled without an object (az_group_direct();
	 * read without the lock); a dense one keeps the bit, unused.
	 */
	struct az_sim_yield yield[AZ_SIM_GROUPS];
	u64 sparse;
	u64 direct;
	bool regroup;
	bool regrouping;
	bool sfit;			/* size the similarity table to fit */
	u64 scoming;			/* and room for this many more */
	u64 later;
	u64 switches;			/* monotonic: groups switched */
};

/*
 * Whether a page of @group with hash tag @tag is sampled: always in a
 * dense group, 1 in @sample (bits 22.. of the tag, above any dedup
 * bucket's) in a sparse one.  Unlocked callers get a hint.
 */
static inline bool az_sim_sampled(const struct az_index *x, u32 group,
				  u32 tag, u32 sample)
{
	return !(AZ_READ_ONCE(x->sparse) & (1ULL << az_sim_gno(group))) ||
	       !((tag >> 22) & (sample - 1));
}

/*
 * Whether @o (a possible base with similarity keys) gets entries: when
 * sampled.  idx_lock held.
 */
static inline bool az_sim_wanted(const struct az_index *x,
				 const struct az_obj *o, u32 sample)
{
	return az_sim_sampled(x, o->group, o->hash, sample);
}

/*
 * Whether a private plain page of @group (hash tag @tag) goes to a DIRECT
 * slot, without an object: its group is direct and the page not sampled
 * (index.c, "Private pages without an object").  Read without idx_lock.
 */
static inline bool az_group_direct(const struct az_index *x, u32 group,
				   u32 tag, u32 sample)
{
	return (AZ_READ_ONCE(x->direct) & (1ULL << az_sim_gno(group))) &&
	       !az_sim_sampled(x, group, tag, sample);
}

/* ---- the store -------------------------------------------------------- */

struct az_store {
	u64 nr_slots;
	struct az_leaf_dir *dir;	/* slot table directory (see az_slot) */
	u64 nr_dir;			/* directory entries */
	az_spinlock_t leaf_lock;	/* installs and removes leaves */
	az_atomic64_t leaves;		/* leaves allocated */
	struct az_pool *pool;
	u64 mem_limit;
	struct az_policy pol;

	az_spinlock_t reg_lock;		/* owners' flags/cgroup_id/group */
	/*
	 * Owner entries (az_owner_at()): chunk i holds entries i *
	 * AZ_OWNER_CHUNK on.  A chunk is installed (under reg_lock, with
	 * release) before any of its entries is in use, and stays until the
	 * store is destroyed.
	 */
	struct az_owner *owner_chunk[AZ_OWNER_CHUNKS];
	u32 nr_owners;			/* entries in use (high water) */
	u32 nr_reg;			/* registered owners */
	u32 owners_gen;			/* changes on every add and del */
	az_wait_t owner_wq;		/* del waits here for busy == 0 */
	/* Hash chains by cgroup id (written under reg_lock, read lockless). */
	u16 owner_hash[AZ_OWNER_BUCKETS];

	az_spinlock_t idx_lock;		/* everything in @idx */
	struct az_index idx;
	u32 sim_slots;			/* slots per similarity entry (reg_lock) */
	u32 sim_sample;			/* sparse groups: 1 in this many */

	struct az_defer defer;		/* objects waiting to be freed */

	az_atomic64_t pages_stored;
	az_atomic64_t stored_bytes;
	az_atomic64_t template_bytes;
	az_atomic64_t template_pages;
	az_atomic64_t objects;		/* including DIRECT ones */
	az_atomic64_t direct;		/* DIRECT objects (no az_obj) */
	az_atomic64_t bases;
	az_atomic64_t kind_pages[AZ_NR_KINDS];
	az_atomic64_t failed_stores;
	az_atomic64_t failed_loads;
	az_atomic64_t stores;
	az_atomic64_t loads;
	az_atomic64_t frees;
	az_atomic64_t cross_group;
	az_atomic64_t template_lost;	/* see az_put_template_entry() */
	az_atomic64_t deferred;	/* must stay 0: sharing across groups */

	az_spinlock_t bc_lock;		/* @bc and its contents (bcache.c) */
	struct az_bcache_mem *bc;	/* decoded-base cache, NULL = off */
	az_atomic64_t bc_hits;
	az_atomic64_t bc_misses;
	az_atomic64_t compacted_bytes;
	az_atomic64_t packs;		/* live packs */
	az_atomic64_t packed_pages;	/* slots referring to a pack */
};

/*
 * Entry @i, for an @i below s->nr_owners (an entry in use: its chunk is
 * installed).
 */
static inline struct az_owner *az_owner_at(struct az_store *s, u32 i)
{
	struct az_owner *chunk;

	chunk = az_load_acquire(&s->owner_chunk[i / AZ_OWNER_CHUNK]);
	return &chunk[i % AZ_OWNER_CHUNK];
}

/* ---- lz4c.c ----------------------------------------------------------- */

#define AZ_LZ4C_HASH_LOG	13
#define AZ_LZ4C_MAX_INPUT	(1U << 20)

#define AZ_LZ4C_TABLE_BYTES	(sizeof(u32) << AZ_LZ4C_HASH_LOG)

/* The lz4 compressor's state (see lz4c.c): az_lz4c_init() before use. */
struct az_lz4c {
	u32 *table;		/* AZ_LZ4C_TABLE_BYTES */
	u32 next;		/* number of the next call's first byte */
};

void az_lz4c_init(struct az_lz4c *t);

struct az_ctx {
	struct az_codec_ws *ws;
	struct az_lz4c lz4c;	/* the lz4 compressor's table */
	u8 *obuf;		/* AZ_OBUF_SIZE: best encoding so far */
	u8 *tbuf;		/* AZ_OBUF_SIZE: candidate encoding */
	u8 *pbuf;		/* page: decoded base or candidate */
	u8 *xbuf;		/* page: xor scratch */
	u8 *sbuf;		/* page: shuffle and difference scratch */
	u8 *gbuf;		/* page: a split object gathered for decoding */
	u8 *kbuf;		/* AZ_PACK_MAX pages: a pack's pages */
	u64 kid;		/* id of the pack @kbuf holds verified, 0 none */
};

/*
 * LZ4 block of @len bytes at @src into @dst, at most @cap bytes (0 when it
 * does not fit); with @dict (@dlen bytes) as an external dictionary for
 * az_lz4_compress_dict(), decoded by az_lz4_decompress_dict().
 */
int az_lz4_compress(struct az_ctx *ctx, const void *src, int len, void *dst,
		    int cap);
int az_lz4_compress_dict(struct az_ctx *ctx, const void *dict, int dlen,
			 const void *src, int len, void *dst, int cap);

/* ---- codec.c ---------------------------------------------------------- */

/*
 * Encode @page without a base; returns the object size, AZ_PAGE_SIZE
 * (raw) unless it is below @max.  @max above AZ_RAW_THRESHOLD also tries
 * the bit-shuffled page (under zstd first and only that one for a noisy
 * page that lz4 cannot get to 3/4 page, unless its bit planes do not
 * compress).
 */
u32 az_encode_plain(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, u8 *out, u32 max, u8 *enc);
/*
 * Encode @page as a delta against @base; 0 when not smaller than @limit.
 * @numeric: the base is a numeric array (az_enc_is_numeric() of its
 * encoding): the XOR is compressed (unless it is noisy and zstd takes it
 * only shuffled), and also tried bit-shuffled (XSHUF encodings) when the
 * policy allows.
 */
u32 az_encode_delta(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, const void *base, bool numeric, u8 *out,
		    u32 limit, u8 *enc);
/*
 * Decode an object of @size bytes into @page.  @base is the decoded base
 * page for delta encodings, NULL otherwise.  0 or -EIO; never accesses
 * @obj beyond @size or @page beyond AZ_PAGE_SIZE.
 */
int az_decode(struct az_ctx *ctx, const u8 *obj, u32 size, const void *base,
	      void *page);
/*
 * Encode @n pages at @pages (2..AZ_PACK_MAX) as one pack; returns the
 * object size, 0 unless it is below @max.
 */
u32 az_encode_pack(struct az_ctx *ctx, const struct az_policy *pol,
		   const void *pages, u32 n, u8 *out, u32 max, u8 *enc);
/*
 * Decode a pack of @size bytes into @pages (room for AZ_PACK_MAX pages):
 * its page count (2..AZ_PACK_MAX), or -EIO for anything that is not a
 * whole pack.
 */
int az_decode_pack(struct az_ctx *ctx, const u8 *obj, u32 size, void *pages);
/* Encoding of an object from its header, or -EIO. */
int az_obj_encoding(const u8 *obj, u32 size);

/* ---- store.c ---------------------------------------------------------- */

/*
 * Decode @o (and its base) into @page; caller holds a reference.  -EIO
 * for a pack (az_obj_read_pack()).
 */
int az_obj_read(struct az_store *s, struct az_ctx *ctx, struct az_obj *o,
		void *page);
void az_obj_put(struct az_store *s, struct az_obj *o);
void az_obj_mark_shared(struct az_store *s, struct az_obj *o);
void az_obj_mark_base(struct az_store *s, struct az_obj *o);
bool az_page_same(const void *page, u64 *word);

/* ---- bcache.c --------------------------------------------------------- */

#define AZ_BC_WAYS		4
#define AZ_BC_DEFAULT_PAGES	256

/* Decode base @b into @dst (cached copy if any); caller holds a reference. */
int az_base_read(struct az_store *s, struct az_ctx *ctx, struct az_obj *b,
		 void *dst, bool verify);
/* @o is being destroyed: drop its cached copy.  Atomic context safe. */
void az_bcache_forget(struct az_store *s, struct az_obj *o);
void az_bcache_destroy(struct az_store *s);
/* Bytes of kernel memory the cache holds now. */
u64 az_bcache_bytes(struct az_store *s);

/* ---- registry.c ------------------------------------------------------- */

/* An owner looked up for one put: the entry stays valid until unpinned. */
struct az_pin {
	u16 idx;		/* owner entry, 0 = unregistered */
	bool reg;		/* may share within @group */
	bool tmpl;		/* a template: its pages become bases */
	u32 group;
};

void az_owner_pin(struct az_store *s, u64 cgroup_id, struct az_pin *pin);
void az_owner_unpin(struct az_store *s, struct az_pin *pin);
/* @index through the pinned owner's index map (az_store_set_map). */
u64 az_owner_index(struct az_store *s, const struct az_pin *pin, u64 index);
void az_owners_init(struct az_store *s);
u64 az_owner_bytes(struct az_store *s);

/* ---- index.c ---------------------------------------------------------- */

int az_index_ensure(struct az_store *s);
void az_sim_forget_owner(struct az_store *s, u16 idx);
void az_index_resize(struct az_store *s);
void az_index_destroy(struct az_store *s);
u64 az_index_bytes(struct az_store *s, u64 *table_bytes, u64 *tnode_bytes);
/* Identical page in @group: returns a referenced object or NULL. */
struct az_obj *az_dedup_find(struct az_store *s, struct az_ctx *ctx,
			     u32 group, u64 hash, const void *page,
			     bool need_base, bool count);
/* Template base for (@group, @index): referenced object or NULL. */
struct az_obj *az_template_find(struct az_store *s, u32 group, u64 index);
/* Whether (@group, @index) has a template chunk (an entry may be set). */
bool az_template_covered(struct az_store *s, u32 group, u64 index);
/*
 * Set (@group, @index) -> @o (takes its own reference).  @nt is a chunk
 * the caller allocated for an index az_template_covered() found without
 * one (NULL otherwise): linked in, or freed.  Atomic context safe: should
 * the index have lost its chunk since, one is allocated without waiting,
 * and -ENOMEM is what a failure there returns.
 */
int az_template_set(struct az_store *s, u32 group, u64 index, u16 owner,
		    struct az_obj *o, struct az_tchunk *nt);
/* Drop every template entry of @owner. */
void az_template_drop_owner(struct az_store *s, u16 owner);
/*
 * Up to @max similar base candidates (referenced) in @group; @count: a
 * put's first attempt (counted in its group's yield, by @owner).
 */
int az_sim_find(struct az_store *s, u32 group, u16 owner, const u64 *sf,
		struct az_obj **out, int max, bool count);
void az_sim_features(const void *page, u64 *sf);
void az_sim_stats(struct az_store *s, struct az_stats *st);
/*
 * Link @o into the dedup and (if a possible base) similarity indexes.
 * @found: @o is a similarity delta (its group's lookups found a base).
 */
void az_index_insert(struct az_store *s, struct az_obj *o, const u64 *sf,
		     bool found);
/* Unlink @o from every index (object is dying). */
void az_index_remove(struct az_store *s, struct az_obj *o);

#endif /* AZ_INTERNAL_H */
