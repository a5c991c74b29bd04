// SPDX-License-Identifier: GPL-2.0
/*
 * Object encoders and the validating decoder.
 *
 * Every object except a raw page starts with a 4-byte header (see
 * az_internal.h).  The decoder trusts nothing in the object: it checks the
 * header, requires the codec to produce exactly one page from exactly the
 * payload, and requires a base for (and only for) delta encodings.
 */
#include "az_internal.h"

static void az_put_hdr(u8 *out, u8 enc, u32 len)
{
	out[0] = enc;
	out[1] = AZ_OBJ_VERSION;
	out[2] = len & 0xff;
	out[3] = (len >> 8) & 0xff;
}

int az_obj_encoding(const u8 *obj, u32 size)
{
	u32 len;

	if (size == AZ_PAGE_SIZE)
		return 0;
	if (size <= AZ_HDR_SIZE || size > AZ_PAGE_SIZE)
		return -EIO;
	len = obj[2] | (u32)obj[3] << 8;
	if (obj[1] != AZ_OBJ_VERSION || len != size - AZ_HDR_SIZE)
		return -EIO;
	if (obj[0] < AZ_ENC_LZ4 || obj[0] > AZ_ENC_MAX)
		return -EIO;
	return obj[0];
}

static void az_xor_page(u8 *dst, const u8 *a, const u8 *b)
{
	const u64 *x = (const u64 *)a, *y = (const u64 *)b;
	u64 *d = (u64 *)dst;
	unsigned int i;

	for (i = 0; i < AZ_PAGE_SIZE / sizeof(u64); i++)
		d[i] = x[i] ^ y[i];
}

/*
 * One stage of a 32x32 bit-matrix transpose (Hacker's Delight 7-3): swap
 * the off-diagonal @j x @j blocks.  Rows are u64 holding two matrices, one
 * per 32-bit half; @m keeps each swap inside its half.  A macro so that @j
 * is a constant in each expansion (the loops unroll; ~2x faster here).
 */
#define AZ_TR_STAGE(a, j, m)						\
	do {								\
		unsigned int k_;					\
		u64 t_;							\
									\
		for (k_ = 0; k_ < 32; k_ = (k_ + (j) + 1) & ~(j)) {	\
			t_ = (((a)[k_] >> (j)) ^ (a)[k_ + (j)]) & (m);	\
			(a)[k_ + (j)] ^= t_;				\
			(a)[k_] ^= t_ << (j);				\
		}							\
	} while (0)

/* Transpose two 32x32 bit matrices at once (row i = a[i], bit j = column). */
static void az_transpose32x2(u64 *a)
{
	AZ_TR_STAGE(a, 16, 0x0000ffff0000ffffULL);
	AZ_TR_STAGE(a, 8, 0x00ff00ff00ff00ffULL);
	AZ_TR_STAGE(a, 4, 0x0f0f0f0f0f0f0f0fULL);
	AZ_TR_STAGE(a, 2, 0x3333333333333333ULL);
	AZ_TR_STAGE(a, 1, 0x5555555555555555ULL);
}

/*
 * Bit shuffle (see az_internal.h): the page is 32 blocks of 32 little
 * endian words; transposing a block as a 32x32 bit matrix gives 32 words,
 * word p of block b holding bit p of the block's words, stored at plane p
 * (128 bytes), offset 4 * b.  Two blocks go through one transpose.
 */
#define AZ_SHUF_PLANE	(AZ_PAGE_SIZE / 32)

static void az_shuffle(u8 *dst, const u8 *src)
{
	unsigned int b, i;
	u64 a[32];

	for (b = 0; b < 32; b += 2) {
		for (i = 0; i < 32; i++)
			a[i] = az_get_le32(src + AZ_SHUF_PLANE * b + 4 * i) |
			       (u64)az_get_le32(src + AZ_SHUF_PLANE * (b + 1) +
						4 * i) << 32;
		az_transpose32x2(a);
		for (i = 0; i < 32; i++) {
			az_put_le32((u32)a[i], dst + AZ_SHUF_PLANE * i + 4 * b);
			az_put_le32(a[i] >> 32,
				    dst + AZ_SHUF_PLANE * i + 4 * (b + 1));
		}
	}
}

static void az_unshuffle(u8 *dst, const u8 *src)
{
	unsigned int b, i;
	u64 a[32];

	for (b = 0; b < 32; b += 2) {
		for (i = 0; i < 32; i++)
			a[i] = az_get_le32(src + AZ_SHUF_PLANE * i + 4 * b) |
			       (u64)az_get_le32(src + AZ_SHUF_PLANE * i +
						4 * (b + 1)) << 32;
		az_transpose32x2(a);
		for (i = 0; i < 32; i++) {
			az_put_le32((u32)a[i], dst + AZ_SHUF_PLANE * b + 4 * i);
			az_put_le32(a[i] >> 32,
				    dst + AZ_SHUF_PLANE * (b + 1) + 4 * i);
		}
	}
}

/* Compress @src into @out + header; returns object size or 0. */
static u32 az_compress(struct az_ctx *ctx, const struct az_policy *pol,
		       const void *src, u8 *out, u32 cap, u8 enc_lz4,
		       u8 enc_zstd, u8 *enc)
{
	u8 *dst = out + AZ_HDR_SIZE;
	int n;

	if (cap <= AZ_HDR_SIZE)
		return 0;
	cap -= AZ_HDR_SIZE;
	if (pol->codec == AZ_CODEC_ZSTD) {
		n = az_zstd_compress(ctx->ws, pol->level, src, AZ_PAGE_SIZE,
				     dst, cap);
		*enc = enc_zstd;
	} else {
		n = az_lz4_compress(ctx->ws, src, AZ_PAGE_SIZE, dst, cap);
		*enc = enc_lz4;
	}
	if (n <= 0 || (u32)n > cap)
		return 0;
	az_put_hdr(out, *enc, n);
	return n + AZ_HDR_SIZE;
}

u32 az_encode_plain(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, u8 *out, u32 max, u8 *enc)
{
	u32 n, m;
	u8 e;

	n = az_compress(ctx, pol, page, out, max, AZ_ENC_LZ4, AZ_ENC_ZSTD,
			enc);
	/*
	 * Numeric arrays: the bit planes compress where the bytes do not.
	 * Only where the object may exceed zram's threshold (az_obj_max()).
	 */
	if (max > AZ_RAW_THRESHOLD && (!n || n > AZ_SHUF_MIN_PLAIN)) {
		az_shuffle(ctx->sbuf, page);
		m = az_compress(ctx, pol, ctx->sbuf, ctx->xbuf,
				n ? n - 1 : max, AZ_ENC_SHUF_LZ4,
				AZ_ENC_SHUF_ZSTD, &e);
		if (m) {
			memcpy(out, ctx->xbuf, m);
			*enc = e;
			n = m;
		}
	}
	if (!n || n >= max) {
		*enc = 0;
		return AZ_PAGE_SIZE;
	}
	return n;
}

/*
 * Delta against @base: XOR then the policy codec (good for in-place
 * edits); when that is still large, the XOR bit-shuffled (good for
 * numeric arrays with small changes); then lz4 with @base as dictionary
 * (good for shifted content; cheap, so tried whatever the policy codec).
 * The smallest wins.  Returns 0 unless the result is < @limit.
 */
u32 az_encode_delta(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, const void *base, u8 *out, u32 limit,
		    u8 *enc)
{
	u32 cap = az_min(limit, az_obj_max(pol)) - 1;
	u32 n, m;
	u8 e;
	int r;

	if (limit <= AZ_HDR_SIZE + 1)
		return 0;
	az_xor_page(ctx->xbuf, page, base);
	n = az_compress(ctx, pol, ctx->xbuf, out, cap, AZ_ENC_XOR_LZ4,
			AZ_ENC_XOR_ZSTD, enc);
	if (n)
		cap = n - 1;
	if (pol->shuffle && (!n || n > AZ_SHUF_MIN_DELTA) &&
	    cap > AZ_HDR_SIZE) {
		/* xbuf is free once shuffled: it takes the candidate */
		az_shuffle(ctx->sbuf, ctx->xbuf);
		m = az_compress(ctx, pol, ctx->sbuf, ctx->xbuf, cap,
				AZ_ENC_XSHUF_LZ4, AZ_ENC_XSHUF_ZSTD, &e);
		if (m) {
			memcpy(out, ctx->xbuf, m);
			*enc = e;
			n = m;
			cap = n - 1;
		}
	}
	if (cap <= AZ_HDR_SIZE)
		return n;
	/* Dictionary mode into the scratch page, then keep the smaller. */
	r = az_lz4_compress_dict(ctx->ws, base, AZ_PAGE_SIZE, page,
				 AZ_PAGE_SIZE, ctx->xbuf + AZ_HDR_SIZE,
				 cap - AZ_HDR_SIZE);
	if (r <= 0)
		return n;
	m = r + AZ_HDR_SIZE;
	e = AZ_ENC_DICT_LZ4;
	az_put_hdr(ctx->xbuf, e, r);
	memcpy(out, ctx->xbuf, m);
	*enc = e;
	return m;
}

int az_decode(struct az_ctx *ctx, const u8 *obj, u32 size, const void *base,
	      void *page)
{
	const u8 *src = obj + AZ_HDR_SIZE;
	int slen = (int)size - AZ_HDR_SIZE;
	int enc, n;

	enc = az_obj_encoding(obj, size);
	if (enc < 0)
		return -EIO;
	if (!!base != az_enc_is_delta(enc))
		return -EIO;
	switch (enc) {
	case 0:
		memcpy(page, obj, AZ_PAGE_SIZE);
		return 0;
	case AZ_ENC_LZ4:
	case AZ_ENC_XOR_LZ4:
		n = az_lz4_decompress(src, slen, page, AZ_PAGE_SIZE);
		break;
	case AZ_ENC_ZSTD:
	case AZ_ENC_XOR_ZSTD:
		n = az_zstd_decompress(ctx->ws, src, slen, page, AZ_PAGE_SIZE);
		break;
	case AZ_ENC_SHUF_LZ4:
	case AZ_ENC_XSHUF_LZ4:
		n = az_lz4_decompress(src, slen, ctx->sbuf, AZ_PAGE_SIZE);
		if (n == AZ_PAGE_SIZE)
			az_unshuffle(page, ctx->sbuf);
		break;
	case AZ_ENC_SHUF_ZSTD:
	case AZ_ENC_XSHUF_ZSTD:
		n = az_zstd_decompress(ctx->ws, src, slen, ctx->sbuf,
				       AZ_PAGE_SIZE);
		if (n == AZ_PAGE_SIZE)
			az_unshuffle(page, ctx->sbuf);
		break;
	case AZ_ENC_DICT_LZ4:
		n = az_lz4_decompress_dict(src, slen, page, AZ_PAGE_SIZE,
					   base, AZ_PAGE_SIZE);
		break;
	default:
		return -EIO;
	}
	if (n != AZ_PAGE_SIZE)
		return -EIO;
	if (enc == AZ_ENC_XOR_LZ4 || enc == AZ_ENC_XOR_ZSTD ||
	    enc == AZ_ENC_XSHUF_LZ4 || enc == AZ_ENC_XSHUF_ZSTD)
		az_xor_page(page, page, base);
	return 0;
}
