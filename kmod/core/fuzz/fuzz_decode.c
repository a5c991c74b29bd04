// SPDX-License-Identifier: GPL-2.0
/*
 * libFuzzer target for the store core's decoders and encoders.
 *
 * Byte 0 picks the mode (modulo 6):
 *   0  decode the rest as a standalone object (must be -EIO or a page)
 *   1  decode the rest as a delta against a fixed base page
 *   2  the rest (zero padded) is a page: encode plain with lz4 or zstd
 *      (byte 1), decode, compare
 *   3  the rest is a list of (offset, value) edits of the base page:
 *      encode as a delta, decode, compare
 *   4  decode the rest as a pack (must be -EIO or 2..AZ_PACK_MAX pages)
 *   5  the rest (zero padded) is 2..AZ_PACK_MAX pages (byte 1): encode as
 *      a pack with lz4 or zstd, decode, compare
 * Build: make -f kmod/core/host.mk fuzz; run: build/azcore-fuzz corpus/
 */
#include <stdlib.h>

#include "../host/az_debug_host.h"

static struct az_ctx *ctx;
static u8 base[AZ_PAGE_SIZE], page[AZ_PAGE_SIZE], out[AZ_PAGE_SIZE];
static u8 obj[AZ_OBUF_SIZE];
static u8 pk[AZ_PACK_MAX * AZ_PAGE_SIZE], pkout[AZ_PACK_MAX * AZ_PAGE_SIZE];

static void init(void)
{
	u64 x = 0x9e3779b97f4a7c15ULL;
	unsigned int i;

	ctx = az_ctx_create();
	if (!ctx)
		abort();
	/* A heap-like base: pointers, small ints, zeroes. */
	for (i = 0; i < AZ_PAGE_SIZE / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		((u64 *)base)[i] = (i % 3 == 0) ? 0x7f0000001000ULL + (x & 0xfff0) :
				   (i % 3 == 1) ? (x & 0xff) : 0;
	}
}

int LLVMFuzzerTestOneInput(const u8 *data, size_t size);

int LLVMFuzzerTestOneInput(const u8 *data, size_t size)
{
	struct az_policy pol = { .codec = AZ_CODEC_LZ4, .level = 3,
				 .delta_max_pct = 100, .shuffle = 1 };
	u8 *copy;
	size_t i;
	int n, r;

	if (!ctx)
		init();
	if (size < 1)
		return 0;
	switch (data[0] % 6) {
	case 0:
	case 1:
		if (size - 1 > AZ_PAGE_SIZE)
			return 0;
		/* Exact-size heap copy so ASan sees any overread. */
		copy = malloc(size - 1 ? size - 1 : 1);
		if (!copy)
			return 0;
		memcpy(copy, data + 1, size - 1);
		r = az_decode(ctx, copy, size - 1, (data[0] % 6) ? base : NULL,
			      out);
		free(copy);
		if (r != 0 && r != -EIO)
			abort();
		break;
	case 2:
		if (size < 2)
			return 0;
		memset(page, 0, sizeof(page));
		memcpy(page, data + 2, az_min(size - 2, (size_t)AZ_PAGE_SIZE));
		if (data[1] & 1) {
			pol.codec = AZ_CODEC_ZSTD;
			pol.level = 1 + (data[1] >> 1) % AZ_ZSTD_LEVEL_MAX;
		}
		pol.shuffle = !(data[1] & 0x80);
		n = az_debug_encode(ctx, &pol, page, NULL, obj);
		if (n <= 0 || az_decode(ctx, obj, n, NULL, out) ||
		    memcmp(out, page, AZ_PAGE_SIZE))
			abort();
		break;
	case 3:
		memcpy(page, base, AZ_PAGE_SIZE);
		for (i = 1; i + 2 < size; i += 3)
			page[(data[i] | data[i + 1] << 8) % AZ_PAGE_SIZE] =
				data[i + 2];
		n = az_debug_encode(ctx, &pol, page, base, obj);
		if (n == -ENOSPC)
			break;
		if (n <= 0 || az_decode(ctx, obj, n, base, out) ||
		    memcmp(out, page, AZ_PAGE_SIZE))
			abort();
		break;
	case 4:
		if (size - 1 > AZ_PAGE_SIZE)
			return 0;
		r = az_debug_decode_pack(ctx, data + 1, size - 1, pkout);
		if (r != -EIO && (r < 2 || r > (int)AZ_PACK_MAX))
			abort();
		break;
	case 5:
		if (size < 2)
			return 0;
		n = 2 + data[1] % (AZ_PACK_MAX - 1);
		memset(pk, 0, sizeof(pk));
		memcpy(pk, data + 2, az_min(size - 2, sizeof(pk)));
		if (data[1] & 0x80)
			pol.codec = AZ_CODEC_ZSTD;
		r = az_debug_encode_pack(ctx, &pol, pk, n, obj);
		if (!r)
			break;	/* did not fit one object */
		if (az_debug_decode_pack(ctx, obj, r, pkout) != n ||
		    memcmp(pkout, pk, n * AZ_PAGE_SIZE))
			abort();
		break;
	}
	return 0;
}
