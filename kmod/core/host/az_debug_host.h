/* SPDX-License-Identifier: GPL-2.0 */
/* Host-only test hooks (host/az_debug_host.c); see controlplane/corelib.py. */
#ifndef AZ_DEBUG_HOST_H
#define AZ_DEBUG_HOST_H

#include "../az_internal.h"

int az_store_debug_corrupt(struct az_store *s, u64 slot, u32 off, u8 xor);
/* XOR @xor into byte 0 of the link of @slot's split object (-ENOENT: none). */
int az_store_debug_corrupt_link(struct az_store *s, u64 slot, u8 xor);
int az_debug_decode(struct az_ctx *ctx, const u8 *obj, u32 size,
		    const void *base, void *page);
int az_debug_encode(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, const void *base, u8 *out);
int az_store_debug_check(struct az_store *s);
/* Encode 2..AZ_PACK_MAX pages as a pack; decode one (page count or -EIO). */
int az_debug_encode_pack(struct az_ctx *ctx, const struct az_policy *pol,
			 const void *pages, u32 n, u8 *out);
int az_debug_decode_pack(struct az_ctx *ctx, const u8 *obj, u32 size,
			 void *pages);
/* Similarity keys per indexed object (AZ_NR_SF). */
u32 az_debug_nr_sf(void);
/* Slots per slot table leaf (a leaf is 16 bytes a slot). */
u32 az_debug_leaf_slots(void);
int az_debug_lz4(struct az_ctx *ctx, const void *dict, int dlen,
		 const void *src, int len, void *dst, int cap, u32 next,
		 u32 *after);
int az_host_put_batch(struct az_store *s, struct az_ctx *ctx, u64 first,
		      const u8 *pages, u32 n, const struct az_page_info *pi);
u64 az_store_debug_reg_lock_taken(struct az_store *s);
int az_store_debug_slot_lock(struct az_store *s, u64 slot, int lock);
int az_host_get_batch(struct az_store *s, struct az_ctx *ctx, u64 first,
		      u8 *pages, u32 n);
/* A put made at the next pack's race point (az_pack_race_point()). */
int az_store_debug_pack_race(struct az_store *s, u64 slot, const void *page,
			     const struct az_page_info *pi);

#endif /* AZ_DEBUG_HOST_H */
