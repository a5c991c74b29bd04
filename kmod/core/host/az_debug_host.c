// SPDX-License-Identifier: GPL-2.0
/*
 * Host-only test hooks over the core's internals: corrupt a stored
 * object, run the encoders and the decoder on caller buffers.  Never
 * built into the module.
 */
#include "../az_internal.h"

int az_store_debug_corrupt(struct az_store *s, u64 slot, u32 off, u8 xor);
int az_debug_decode(struct az_ctx *ctx, const u8 *obj, u32 size,
		    const void *base, void *page);
int az_debug_encode(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, const void *base, u8 *out);

/* XOR @xor into byte @off (modulo the size) of @slot's object. */
int az_store_debug_corrupt(struct az_store *s, u64 slot, u32 off, u8 xor)
{
	struct az_slot *sl;
	struct az_obj *o;
	u8 *p;
	int err = 0;

	if (slot >= s->nr_slots)
		return -EINVAL;
	sl = &s->slots[slot];
	az_bit_lock(AZ_SLOT_LOCK_BIT, &sl->flags);
	if (!(sl->flags & AZ_SLOT_USED) ||
	    ((sl->flags & AZ_SLOT_KIND_MASK) >> AZ_SLOT_KIND_SHIFT) ==
	    AZ_KIND_SAME) {
		err = -ENOENT;
		goto out;
	}
	o = (struct az_obj *)(unsigned long)sl->val;
	p = az_pool_map(s->pool, o->handle, true);
	p[off % o->size] ^= xor;
	az_pool_unmap(s->pool, o->handle);
out:
	az_bit_unlock(AZ_SLOT_LOCK_BIT, &sl->flags);
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

/* Encode @page (as a delta when @base is given); returns the size. */
int az_debug_encode(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, const void *base, u8 *out)
{
	u8 enc;
	u32 n;

	if (!base) {
		n = az_encode_plain(ctx, pol, page, out, &enc);
		if (n == AZ_PAGE_SIZE)
			memcpy(out, page, AZ_PAGE_SIZE);
		return n;
	}
	n = az_encode_delta(ctx, pol, page, base, out, AZ_PAGE_SIZE, &enc);
	return n ? (int)n : -ENOSPC;
}
