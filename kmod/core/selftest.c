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
	       !st.deferred && !st.cross_group;
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
		struct az_slot *sl = &t->s->slots[10];
		u8 *obj = az_pool_map(t->s->pool, (unsigned long)sl->val,
				      true);

		obj[AZ_HDR_SIZE + 7] ^= 0x10;
		az_pool_unmap(t->s->pool, (unsigned long)sl->val);
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

static int st_shared(struct az_selftest *t)
{
	struct az_owner_stats os;
	struct az_stats st;
	unsigned int i, tdelta = 0, xdelta = 0;
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
		tdelta += az_store_slot_kind(t->s, i) == AZ_KIND_TDELTA;
		xdelta += az_store_slot_kind(t->s, 128 + i) == AZ_KIND_XDELTA;
		if (ST_FAILED(t, az_store_slot_kind(t->s, 32 + i) == AZ_KIND_DUP))
			goto fail;
		if (ST_FAILED(t, az_store_slot_kind(t->s, 96 + i) == AZ_KIND_DUP))
			goto fail;
		if (ST_FAILED(t, az_store_slot_kind(t->s, 64 + i) == AZ_KIND_PLAIN))
			goto fail;
	}
	if (ST_FAILED(t, tdelta >= ST_FAM - 2 && xdelta >= ST_FAM / 2))
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
