// SPDX-License-Identifier: GPL-2.0
/*
 * Self-test of the store core, WireGuard style: compiled into the module
 * (the glue may run it at load time) and into the host library (run by
 * tests/core/test_selftest.py), so the same scenario checks the kernel's
 * zsmalloc, lz4, zstd, bit locks and deferred-free worker as well as the
 * host shim.  Returns 0, or -EINVAL after logging the first failed check.
 */
#include "az_internal.h"

#define ST_SLOTS	256
#define ST_FAM		16

struct az_selftest {
	struct az_store *s;
	struct az_ctx *ctx;
	u8 *fam;		/* ST_FAM pages */
	u8 *page;
	u8 *out;
	u64 rnd;
	int line;
};

static bool st_failed(struct az_selftest *t, const char *what, int line)
{
	t->line = line;
	az_err("selftest: %s failed (line %d)\n", what, line);
	return true;
}

/* True (after logging) when @cond does not hold. */
#define ST_FAILED(t, cond)	(!(cond) && st_failed(t, #cond, __LINE__))

static u64 st_rnd(struct az_selftest *t)
{
	t->rnd ^= t->rnd << 13;
	t->rnd ^= t->rnd >> 7;
	t->rnd ^= t->rnd << 17;
	return t->rnd;
}

static u8 *st_fam(struct az_selftest *t, unsigned int i)
{
	return t->fam + (size_t)i * AZ_PAGE_SIZE;
}

/* Heap-like page: pointers, small integers, zeroes. */
static void st_heap(struct az_selftest *t, u8 *p)
{
	u64 *w = (u64 *)p;
	unsigned int i;

	for (i = 0; i < AZ_PAGE_SIZE / 8; i++) {
		switch (st_rnd(t) % 4) {
		case 0:
		case 1:
			w[i] = 0x7f1234560000ULL + (st_rnd(t) & 0xfff0);
			break;
		case 2:
			w[i] = st_rnd(t) & 0xff;
			break;
		default:
			w[i] = 0;
		}
	}
}

static void st_mutate(struct az_selftest *t, u8 *dst, const u8 *src,
		      unsigned int edits)
{
	memcpy(dst, src, AZ_PAGE_SIZE);
	while (edits--)
		((u64 *)dst)[st_rnd(t) % (AZ_PAGE_SIZE / 8)] = st_rnd(t);
}

static int st_put(struct az_selftest *t, u64 slot, const u8 *p, u64 owner,
		  u64 index)
{
	struct az_page_info pi = { .owner = owner, .index = index };

	return az_store_put(t->s, t->ctx, slot, p, &pi);
}

static bool st_reads(struct az_selftest *t, u64 slot, const u8 *p)
{
	return !az_store_get(t->s, t->ctx, slot, t->out) &&
	       !memcmp(t->out, p, AZ_PAGE_SIZE);
}

/* Everything freed: every counter back to zero. */
static bool st_empty(struct az_selftest *t)
{
	struct az_stats st;

	az_store_drain(t->s);
	az_store_get_stats(t->s, &st);
	return !st.pages_stored && !st.stored_bytes && !st.objects &&
	       !st.bases && !st.template_pages && !st.pool_bytes &&
	       !st.deferred && !st.cross_group && !st.packs &&
	       !st.packed_pages && !az_atomic64_read(&t->s->leaves);
}

static int st_plain(struct az_selftest *t)
{
	unsigned int i;

	/* zero, same-filled, random, heap */
	memset(t->page, 0, AZ_PAGE_SIZE);
	if (ST_FAILED(t, !st_put(t, 0, t->page, 0, 0)))
		goto fail;
	if (ST_FAILED(t, az_store_slot_kind(t->s, 0) == AZ_KIND_SAME))
		goto fail;
	for (i = 0; i < AZ_PAGE_SIZE / 8; i++)
		((u64 *)t->page)[i] = 0x0123456789abcdefULL;
	if (ST_FAILED(t, !st_put(t, 1, t->page, 0, 0)))
		goto fail;
	if (ST_FAILED(t, az_store_slot_kind(t->s, 1) == AZ_KIND_SAME))
		goto fail;
	if (ST_FAILED(t, st_reads(t, 1, t->page)))
		goto fail;
	for (i = 0; i < AZ_PAGE_SIZE / 8; i++)
		((u64 *)t->page)[i] = st_rnd(t);
	if (ST_FAILED(t, !st_put(t, 2, t->page, 0, 0)))
		goto fail;
	if (ST_FAILED(t, az_store_slot_kind(t->s, 2) == AZ_KIND_RAW))
		goto fail;
	if (ST_FAILED(t, st_reads(t, 2, t->page)))
		goto fail;
	for (i = 0; i < ST_FAM; i++) {
		if (ST_FAILED(t, !st_put(t, 10 + i, st_fam(t, i), 0, i)))
			goto fail;
		if (ST_FAILED(t, az_store_slot_kind(t->s, 10 + i) == AZ_KIND_PLAIN))
			goto fail;
	}
	for (i = 0; i < ST_FAM; i++)
		if (ST_FAILED(t, st_reads(t, 10 + i, st_fam(t, i))))
			goto fail;
	memset(t->page, 0, AZ_PAGE_SIZE);
	if (ST_FAILED(t, st_reads(t, 0, t->page)))
		goto fail;
	/* An empty slot reads as zeroes; a bad slot is refused. */
	if (ST_FAILED(t, st_reads(t, 200, t->page)))
		goto fail;
	if (ST_FAILED(t, az_store_put(t->s, t->ctx, ST_SLOTS, t->page,
				      NULL) == -EINVAL))
		goto fail;

	/* A flipped bit in a stored object never reads back silently. */
	if (ST_FAILED(t, az_store_slot_kind(t->s, 10) == AZ_KIND_PLAIN))
		goto fail;
	{
		struct az_slot *sl = az_slot_hold(t->s, 10);
		unsigned long h = (unsigned long)sl->val;
		u32 size = az_slot_size(sl->flags);
		const u8 *obj = az_pool_read_begin(t->s->pool, h, size,
						   t->out);

		if (obj != t->out)
			memcpy(t->out, obj, size);
		az_pool_read_end(t->s->pool, h, size, obj);
		t->out[AZ_HDR_SIZE + 7] ^= 0x10;
		az_pool_write(t->s->pool, h, t->out, size);
		az_leaf_put(t->s, 10);
	}
	if (ST_FAILED(t, az_store_get(t->s, t->ctx, 10, t->out) == -EIO ||
		     !memcmp(t->out, st_fam(t, 0), AZ_PAGE_SIZE)))
		goto fail;

	for (i = 0; i < ST_SLOTS; i++)
		az_store_free(t->s, i);
	if (ST_FAILED(t, st_empty(t)))
		goto fail;
	return 0;
fail:
	return -EINVAL;
}

/* @src as another process holds it: every pointer moved by whole pages. */
static void st_relocate(u8 *dst, const u8 *src, u64 slide)
{
	const u64 *s = (const u64 *)src;
	u64 *d = (u64 *)dst;
	unsigned int i;

	for (i = 0; i < AZ_PAGE_SIZE / 8; i++)
		d[i] = az_user_ptr_like(s[i]) ? s[i] + slide : s[i];
}

static int st_shared(struct az_selftest *t)
{
	struct az_owner_stats os;
	struct az_stats st;
	unsigned int i, tdelta = 0, xdelta = 0, moved = 0;
	u8 *mut;

	mut = az_valloc((size_t)ST_FAM * AZ_PAGE_SIZE);
	if (!mut)
		return -ENOMEM;
	if (ST_FAILED(t, !az_store_add_template(t->s, 100, 1)))
		goto fail;
	if (ST_FAILED(t, !az_store_add_sandbox(t->s, 11, 1)))
		goto fail;
	if (ST_FAILED(t, !az_store_add_sandbox(t->s, 12, 1)))
		goto fail;
	if (ST_FAILED(t, !az_store_add_sandbox(t->s, 21, 2)))
		goto fail;
	if (ST_FAILED(t, az_store_add_sandbox(t->s, 11, 1) == -EEXIST))
		goto fail;
	for (i = 0; i < ST_FAM; i++) {
		u8 *m = mut + (size_t)i * AZ_PAGE_SIZE;

		if (ST_FAILED(t, !az_store_template_load(t->s, t->ctx, 100,
							 i, st_fam(t, i))))
			goto fail;
		st_mutate(t, m, st_fam(t, i), 1 + i % 8);
		/* TDELTA; DUP; other trust group; DUP at another index */
		if (ST_FAILED(t, !st_put(t, i, m, 11, i)) ||
		    ST_FAILED(t, !st_put(t, 32 + i, st_fam(t, i), 12, i)) ||
		    ST_FAILED(t, !st_put(t, 64 + i, m, 21, i)) ||
		    ST_FAILED(t, !st_put(t, 96 + i, m, 12, 5000 + i)))
			goto fail;
		st_mutate(t, t->page, st_fam(t, i), 3);
		if (ST_FAILED(t, !st_put(t, 128 + i, t->page, 12, 9000 + i)))
			goto fail;
		if (ST_FAILED(t, st_reads(t, 128 + i, t->page)))
			goto fail;
		/* XDELTA of a relocated page, found by its pointer offsets */
		st_relocate(t->page, st_fam(t, i), 0x3f2a1000ULL * (i + 1));
		if (ST_FAILED(t, !st_put(t, 160 + i, t->page, 12, 12000 + i)))
			goto fail;
		if (ST_FAILED(t, st_reads(t, 160 + i, t->page)))
			goto fail;
		tdelta += az_store_slot_kind(t->s, i) == AZ_KIND_TDELTA;
		xdelta += az_store_slot_kind(t->s, 128 + i) == AZ_KIND_XDELTA;
		moved += az_store_slot_kind(t->s, 160 + i) == AZ_KIND_XDELTA;
		if (ST_FAILED(t, az_store_slot_kind(t->s, 32 + i) == AZ_KIND_DUP))
			goto fail;
		if (ST_FAILED(t, az_store_slot_kind(t->s, 96 + i) == AZ_KIND_DUP))
			goto fail;
		if (ST_FAILED(t, az_store_slot_kind(t->s, 64 + i) == AZ_KIND_PLAIN))
			goto fail;
	}
	if (ST_FAILED(t, tdelta >= ST_FAM - 2 && xdelta >= ST_FAM / 2))
		goto fail;
	if (ST_FAILED(t, moved >= ST_FAM / 2))
		goto fail;
	az_store_get_stats(t->s, &st);
	if (ST_FAILED(t, st.template_pages == ST_FAM && st.bases >= ST_FAM - 2))
		goto fail;
	if (ST_FAILED(t, !az_store_owner_stats(t->s, 100, &os)))
		goto fail;
	if (ST_FAILED(t, os.template_pages == ST_FAM && os.shared_bytes))
		goto fail;

	/* Remove the template: every page still reads back. */
	if (ST_FAILED(t, !az_store_del_template(t->s, 100)))
		goto fail;
	if (ST_FAILED(t, az_store_del_template(t->s, 100) == -ENOENT))
		goto fail;
	az_store_drain(t->s);
	for (i = 0; i < ST_FAM; i++) {
		u8 *m = mut + (size_t)i * AZ_PAGE_SIZE;

		if (ST_FAILED(t, st_reads(t, i, m)))
			goto fail;
		if (ST_FAILED(t, st_reads(t, 32 + i, st_fam(t, i))))
			goto fail;
		if (ST_FAILED(t, st_reads(t, 64 + i, m)))
			goto fail;
		if (ST_FAILED(t, st_reads(t, 96 + i, m)))
			goto fail;
		st_relocate(t->page, st_fam(t, i), 0x3f2a1000ULL * (i + 1));
		if (ST_FAILED(t, st_reads(t, 160 + i, t->page)))
			goto fail;
	}
	az_store_get_stats(t->s, &st);
	if (ST_FAILED(t, !st.cross_group && st.template_pages == 0))
		goto fail;
	for (i = 0; i < ST_SLOTS; i++)
		az_store_free(t->s, i);
	if (ST_FAILED(t, st_empty(t)))
		goto fail;
	if (ST_FAILED(t, !az_store_del_sandbox(t->s, 11)))
		goto fail;
	if (ST_FAILED(t, !az_store_del_sandbox(t->s, 12)))
		goto fail;
	if (ST_FAILED(t, !az_store_del_sandbox(t->s, 21)))
		goto fail;
	az_vfree(mut);
	return 0;
fail:
	az_vfree(mut);
	return -EINVAL;
}

static int st_limit(struct az_selftest *t)
{
	unsigned int i, stored = 0, failed = 0;
	int err;

	az_store_set_mem_limit(t->s, 16 * 1024);
	for (i = 0; i < 64; i++) {
		err = st_put(t, i, st_fam(t, i % ST_FAM), 0, 0);
		if (ST_FAILED(t, !err || err == -ENOMEM))
			goto fail;
		if (err) {
			failed++;
			if (ST_FAILED(t, az_store_slot_kind(t->s, i) == -ENOENT))
				goto fail;
		} else {
			stored++;
		}
	}
	if (ST_FAILED(t, stored && failed))
		goto fail;
	for (i = 0; i < 64; i++)
		if (az_store_slot_kind(t->s, i) >= 0)
			if (ST_FAILED(t, st_reads(t, i, st_fam(t, i % ST_FAM))))
				goto fail;
	az_store_set_mem_limit(t->s, 0);
	for (i = 0; i < ST_SLOTS; i++)
		az_store_free(t->s, i);
	if (ST_FAILED(t, st_empty(t)))
		goto fail;
	return 0;
fail:
	return -EINVAL;
}

static u64 ss_rnd(u64 *x);

/* Words of a text page: a small vocabulary, so neighbours share strings. */
static void az_text_page(u8 *p, u64 *rnd)
{
	static const char * const w[] = {
		"sandbox ", "tool_call ", "\"role\": ", "return ", "import ",
		"def run(self): ", "{\"id\": ", "status=ok ",
	};
	unsigned int pos = 0, n;
	const char *x;

	while (pos < AZ_PAGE_SIZE) {
		u64 r = ss_rnd(rnd);

		x = w[r % ARRAY_SIZE(w)];
		n = az_min((u32)strlen(x), AZ_PAGE_SIZE - pos);
		memcpy(p + pos, x, n);
		pos += n;
		if (pos + 2 <= AZ_PAGE_SIZE && !(r & 0x30)) {
			p[pos++] = '0' + (r >> 8) % 10;
			p[pos++] = '0' + (r >> 16) % 10;
		}
	}
}

static void st_text(struct az_selftest *t, u8 *p)
{
	az_text_page(p, &t->rnd);
}

/*
 * Multi-page objects: eight adjacent text pages of a sandbox are packed
 * (the codec's page count to a pack), each reads back alone, a free and an
 * overwrite of packed slots leave the others intact.
 */
static int st_pack(struct az_selftest *t)
{
	struct az_stats st;
	u64 packed;
	unsigned int i;

	if (ST_FAILED(t, !az_store_add_sandbox(t->s, 31, 3)))
		return -EINVAL;
	for (i = 0; i < 8; i++) {
		st_text(t, st_fam(t, i));
		if (ST_FAILED(t, !st_put(t, 120 + i, st_fam(t, i), 31, i)))
			return -EINVAL;
	}
	if (ST_FAILED(t, !az_store_pack(t->s, t->ctx, 120, 8, &packed) &&
		      packed >= 4))
		return -EINVAL;
	az_store_drain(t->s);
	az_store_get_stats(t->s, &st);
	if (ST_FAILED(t, st.packs >= 1 && st.packed_pages == packed))
		return -EINVAL;
	az_store_free(t->s, 121);
	st_heap(t, t->page);
	if (ST_FAILED(t, !st_put(t, 122, t->page, 31, 2) &&
		      st_reads(t, 122, t->page)))
		return -EINVAL;
	for (i = 0; i < 8; i++)
		if (i != 1 && i != 2 &&
		    ST_FAILED(t, st_reads(t, 120 + i, st_fam(t, i))))
			return -EINVAL;
	for (i = 0; i < 8; i++)
		az_store_free(t->s, 120 + i);
	if (ST_FAILED(t, !az_store_del_sandbox(t->s, 31) && st_empty(t)))
		return -EINVAL;
	/* st_fam(0..7) are heap pages again for the next scenario */
	for (i = 0; i < 8; i++)
		st_heap(t, st_fam(t, i));
	return 0;
}

int az_core_selftest(void)
{
	struct az_selftest t = { .rnd = 0x2545f4914f6cdd1dULL };
	struct az_policy pol;
	unsigned int i;
	int err = -ENOMEM;

	t.s = az_store_create(ST_SLOTS, "azswap-selftest");
	t.ctx = az_ctx_create();
	t.fam = az_valloc((size_t)ST_FAM * AZ_PAGE_SIZE);
	t.page = az_valloc(AZ_PAGE_SIZE);
	t.out = az_valloc(AZ_PAGE_SIZE);
	if (!t.s || !t.ctx || !t.fam || !t.page || !t.out)
		goto out;
	for (i = 0; i < ST_FAM; i++)
		st_heap(&t, st_fam(&t, i));

	err = st_plain(&t);
	if (!err)
		err = st_shared(&t);
	if (!err)
		err = st_pack(&t);
	if (!err)
		err = st_limit(&t);
	if (err)
		goto out;
	/* Again with zstd (the codec may change only when empty). */
	az_store_get_policy(t.s, &pol);
	pol.codec = AZ_CODEC_ZSTD;
	pol.level = 3;
	err = az_store_set_policy(t.s, &pol);
	if (!err)
		err = st_plain(&t);
	if (!err)
		err = st_shared(&t);
	if (!err)
		err = st_pack(&t);
	if (!err)
		az_info("selftest: ok\n");
out:
	if (err)
		az_err("selftest failed: %d\n", err);
	az_vfree(t.out);
	az_vfree(t.page);
	az_vfree(t.fam);
	az_ctx_destroy(t.ctx);
	az_store_destroy(t.s);
	return err;
}

/*
 * Concurrent stress (az_core_stress): workers own disjoint sets of slots
 * (one writer per slot, as the swap layer guarantees): a range of SS_PER
 * and SS_SPARSE slots spread over leaves that every worker shares, which
 * empty and refill often (the slot table's leaves come and go); they store,
 * load and
 * free related pages of sandboxes in two trust groups, an unregistered
 * cgroup and a template; a control thread concurrently loads template
 * pages, removes and re-adds the template and a sandbox, flips policy
 * knobs, packs slot ranges, drains deferred frees and reads stats.  Every load is compared
 * with the last page written; at the end every page is checked again and
 * all memory must return to zero.
 */
#define SS_PER		256
#define SS_SPARSE	4	/* one per shared leaf ... */
#define SS_GAP		(AZ_LEAF_SLOTS / 4)	/* ... this far apart: 4 share a leaf */
#define SS_T1		1000
#define SS_SA		11
#define SS_SB		12
#define SS_SC		21
#define SS_SD		22
#define SS_UNREG	99

struct az_stress {
	struct az_store *s;
	u8 *fam;		/* ST_FAM pages */
	az_atomic_t stop;
	az_atomic_t failures;
	az_atomic64_t packed;	/* slots the control thread packed */
	u64 resizes;		/* index table sizes the control thread saw */
	u64 direct_seen;	/* of its looks, those with a direct group */
	u64 tables0;		/* index table bytes before the first page */
	u64 end_ms;
	u32 nthreads;
};

struct az_stress_worker {
	struct az_stress *ss;
	struct az_thread *th;
	u64 first;
	u64 rnd;
	u32 t;
};

/* Worker @w's slot number @k (0 .. SS_PER + SS_SPARSE - 1). */
static u64 ss_slot(struct az_stress_worker *w, u64 k)
{
	u32 n = w->ss->nthreads;

	if (k < SS_PER)
		return w->first + k;
	return (u64)n * SS_PER + ((k - SS_PER) * n + w->t) * SS_GAP;
}

static u64 ss_rnd(u64 *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void ss_page(struct az_stress *ss, u8 *p, u64 *r, unsigned int f)
{
	unsigned int k, n;

	switch (ss_rnd(r) % 8) {
	case 0:
		memset(p, 0, AZ_PAGE_SIZE);
		return;
	case 1:
		for (k = 0; k < AZ_PAGE_SIZE / 8; k++)
			((u64 *)p)[k] = ss_rnd(r);
		return;
	case 2:
		az_text_page(p, r);	/* packs with text neighbours */
		return;
	default:
		memcpy(p, ss->fam + (size_t)f * AZ_PAGE_SIZE, AZ_PAGE_SIZE);
		n = ss_rnd(r) % 12;
		for (k = 0; k < n; k++)
			((u64 *)p)[ss_rnd(r) % (AZ_PAGE_SIZE / 8)] = ss_rnd(r);
	}
}

static void ss_fail(struct az_stress *ss, const char *what, u64 slot)
{
	az_err("stress: %s at slot %llu\n", what, (unsigned long long)slot);
	az_atomic_inc(&ss->failures);
}

static bool ss_running(struct az_stress *ss)
{
	if (az_atomic_read(&ss->stop))
		return false;
	if (az_now_ms() < ss->end_ms)
		return true;
	az_atomic_set(&ss->stop, 1);
	return false;
}

static int ss_worker(void *arg)
{
	static const u64 owners[] = {
		SS_SA, SS_SB, SS_SC, SS_SD, SS_UNREG, 0, SS_T1,
	};
	struct az_stress_worker *w = arg;
	struct az_stress *ss = w->ss;
	struct az_ctx *ctx = az_ctx_create();
	u8 *model = az_valloc((size_t)(SS_PER + SS_SPARSE) * AZ_PAGE_SIZE);
	u8 *buf = az_valloc(AZ_PAGE_SIZE);
	u64 i;

	if (!ctx || !model || !buf) {
		ss_fail(ss, "worker allocation", 0);
		goto out;
	}
	while (ss_running(ss)) {
		u64 k = ss_rnd(&w->rnd) % 4 ?
			ss_rnd(&w->rnd) % SS_PER :
			SS_PER + ss_rnd(&w->rnd) % SS_SPARSE;
		u64 slot = ss_slot(w, k);
		u8 *m = model + k * AZ_PAGE_SIZE;
		unsigned int f = ss_rnd(&w->rnd) % ST_FAM;
		/* half the puts: the sandbox of the slot's block of four */
		u64 o = ss_rnd(&w->rnd) & 1 ? owners[(k / 4) % 4] :
			owners[ss_rnd(&w->rnd) % ARRAY_SIZE(owners)];
		struct az_page_info pi = { .owner = o, .index = f };
		int op = ss_rnd(&w->rnd) % 10, err;

		if (op < 5) {
			/*
			 * Group 2's two sandboxes get text of their own,
			 * rarely similar, never alike: it turns sparse, its
			 * entries come and go, and it turns direct.
			 */
			if (o == SS_SC || o == SS_SD)
				az_text_page(buf, &w->rnd);
			else
				ss_page(ss, buf, &w->rnd, f);
			err = az_store_put(ss->s, ctx, slot, buf, &pi);
			/* A failed put (pool full) keeps the old block. */
			if (err && err != -ENOMEM)
				ss_fail(ss, "put", slot);
			else if (!err)
				memcpy(m, buf, AZ_PAGE_SIZE);
		} else if (op < 8) {
			if (az_store_get(ss->s, ctx, slot, buf) ||
			    memcmp(buf, m, AZ_PAGE_SIZE))
				ss_fail(ss, "load mismatch", slot);
		} else {
			az_store_free(ss->s, slot);
			memset(m, 0, AZ_PAGE_SIZE);
		}
		az_cond_resched();
	}
	for (i = 0; i < SS_PER + SS_SPARSE; i++)
		if (az_store_get(ss->s, ctx, ss_slot(w, i), buf) ||
		    memcmp(buf, model + i * AZ_PAGE_SIZE, AZ_PAGE_SIZE))
			ss_fail(ss, "final load mismatch", ss_slot(w, i));
out:
	az_vfree(buf);
	az_vfree(model);
	az_ctx_destroy(ctx);
	return 0;
}

static int ss_control(void *arg)
{
	struct az_stress *ss = arg;
	struct az_ctx *ctx = az_ctx_create();
	u8 *buf = az_valloc(AZ_PAGE_SIZE);
	struct az_policy pol;
	struct az_stats st;
	bool treg = true, breg = true;
	u64 r = 12345, n, nslots = az_store_nr_slots(ss->s), tables = 0;
	int err;

	if (!ctx || !buf) {
		ss_fail(ss, "control allocation", 0);
		goto out;
	}
	while (ss_running(ss)) {
		switch (ss_rnd(&r) % 8) {
		case 0:
			ss_page(ss, buf, &r, ss_rnd(&r) % ST_FAM);
			err = treg ? az_store_template_load(ss->s, ctx, SS_T1,
							    ss_rnd(&r) % ST_FAM,
							    buf) : 0;
			if (err && err != -ENOMEM)
				ss_fail(ss, "template_load", 0);
			break;
		case 1:
			if (treg ? az_store_del_template(ss->s, SS_T1) :
				   az_store_add_template(ss->s, SS_T1, 1))
				ss_fail(ss, "toggle template", 0);
			treg = !treg;
			break;
		case 2:
			if (breg ? az_store_del_sandbox(ss->s, SS_SB) :
				   az_store_add_sandbox(ss->s, SS_SB, 1))
				ss_fail(ss, "toggle sandbox", 0);
			breg = !breg;
			break;
		case 3:
			az_store_get_policy(ss->s, &pol);
			pol.dedup = ss_rnd(&r) & 1;
			pol.xdelta = ss_rnd(&r) & 1;
			pol.sim_effort = ss_rnd(&r) % 8;
			if (az_store_set_policy(ss->s, &pol))
				ss_fail(ss, "set_policy", 0);
			break;
		case 4:
			az_store_drain(ss->s);
			break;
		case 5:
			n = ss_rnd(&r) % nslots;
			if (az_store_pack(ss->s, ctx, n,
					  az_min(nslots - n, (u64)SS_PER), &n))
				ss_fail(ss, "pack", 0);
			az_atomic64_add(n, &ss->packed);
			break;
		case 6:
			/*
			 * Sparse groups' entries follow in the background.
			 * Rarely: a new sample restarts every group's counts.
			 */
			if (ss_rnd(&r) % 32)
				break;
			if (az_store_set_sim_sample(ss->s,
						    1U << (ss_rnd(&r) % 4)))
				ss_fail(ss, "set_sim_sample", 0);
			break;
		default:
			az_store_get_stats(ss->s, &st);
			if (st.cross_group)
				ss_fail(ss, "cross_group", 0);
			if (st.index_table_bytes != tables)
				ss->resizes++;
			if (st.sim_direct)
				ss->direct_seen++;
			tables = st.index_table_bytes;
			break;
		}
		az_cond_resched();
	}
	if (!treg && az_store_add_template(ss->s, SS_T1, 1))
		ss_fail(ss, "re-add template", 0);
	if (!breg && az_store_add_sandbox(ss->s, SS_SB, 1))
		ss_fail(ss, "re-add sandbox", 0);
out:
	az_vfree(buf);
	az_ctx_destroy(ctx);
	return 0;
}

int az_core_stress(unsigned int nthreads, unsigned int ms)
{
	struct az_stress ss = { 0 };
	struct az_stress_worker *w;
	struct az_thread *ctl;
	struct az_stats st;
	u64 r = 777, i, nslots;
	unsigned int t, k;
	int err = -ENOMEM;

	if (!nthreads || nthreads > 64)
		return -EINVAL;
	/* Room past the slots used: the index tables' caps let them grow. */
	nslots = (u64)nthreads * (SS_PER + SS_SPARSE * SS_GAP) * 4;
	ss.nthreads = nthreads;
	w = az_valloc(nthreads * sizeof(*w));
	ss.fam = az_valloc((size_t)ST_FAM * AZ_PAGE_SIZE);
	ss.s = az_store_create(nslots, "azswap-stress");
	if (!w || !ss.fam || !ss.s)
		goto out;
	for (k = 0; k < ST_FAM; k++)
		for (i = 0; i < AZ_PAGE_SIZE / 8; i++)
			((u64 *)(ss.fam + (size_t)k * AZ_PAGE_SIZE))[i] =
				(i % 3) ? ss_rnd(&r) & 0xffff :
				0x7f0000000000ULL + (ss_rnd(&r) & 0xfff0);
	err = az_store_add_template(ss.s, SS_T1, 1) ?:
	      az_store_add_sandbox(ss.s, SS_SA, 1) ?:
	      az_store_add_sandbox(ss.s, SS_SB, 1) ?:
	      az_store_add_sandbox(ss.s, SS_SC, 2) ?:
	      az_store_add_sandbox(ss.s, SS_SD, 2);
	if (err)
		goto out;
	az_store_get_stats(ss.s, &st);
	ss.tables0 = st.index_table_bytes;
	/* Tight enough that some stores fail with -ENOMEM. */
	az_store_set_mem_limit(ss.s, (u64)nthreads * SS_PER * 1280);
	ss.end_ms = az_now_ms() + ms;
	for (t = 0; t < nthreads; t++) {
		w[t].ss = &ss;
		w[t].first = (u64)t * SS_PER;
		w[t].t = t;
		w[t].rnd = 0x9e3779b97f4a7c15ULL * (t + 1);
		w[t].th = az_thread_start(ss_worker, &w[t], "azswap-stress");
		if (!w[t].th)
			ss_fail(&ss, "thread start", 0);
	}
	ctl = az_thread_start(ss_control, &ss, "azswap-stressctl");
	if (!ctl)
		ss_fail(&ss, "thread start", 0);
	for (t = 0; t < nthreads; t++)
		if (w[t].th)
			az_thread_join(w[t].th);
	az_atomic_set(&ss.stop, 1);
	if (ctl)
		az_thread_join(ctl);

	az_store_drain(ss.s);
	az_store_get_stats(ss.s, &st);
	az_info("stress: %llu stores (%llu failed), %llu loads, %llu pages packed, index tables seen at %llu sizes, trust groups switched %llu times, direct at %llu looks\n",
		(unsigned long long)st.stores,
		(unsigned long long)st.failed_stores,
		(unsigned long long)st.loads,
		(unsigned long long)az_atomic64_read(&ss.packed),
		(unsigned long long)ss.resizes,
		(unsigned long long)st.sim_switches,
		(unsigned long long)ss.direct_seen);
	for (i = 0; i < nslots; i++)
		az_store_free(ss.s, i);
	az_store_del_template(ss.s, SS_T1);
	az_store_drain(ss.s);
	az_store_get_stats(ss.s, &st);
	if (st.objects || st.pool_bytes || st.stored_bytes || st.bases ||
	    st.template_pages || st.pages_stored || st.cross_group ||
	    st.packs || st.packed_pages || st.sim_waiting ||
	    az_atomic64_read(&ss.s->leaves))
		ss_fail(&ss, "not empty after freeing everything", 0);
	/* and the index tables are back to their starting sizes */
	if (st.index_table_bytes != ss.tables0)
		ss_fail(&ss, "index tables not back to their start", 0);
	/* text pages in blocks of one sandbox: packs must have been made */
	if (!az_atomic64_read(&ss.packed))
		ss_fail(&ss, "nothing packed", 0);
	err = az_atomic_read(&ss.failures) ? -EINVAL : 0;
	if (!err)
		az_info("stress: ok\n");
out:
	if (err)
		az_err("stress failed: %d\n", err);
	az_store_destroy(ss.s);
	az_vfree(ss.fam);
	az_vfree(w);
	return err;
}
