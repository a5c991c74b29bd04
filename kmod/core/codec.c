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

/* @dst = @a ^ @b; returns how many of its 64-bit words are zero. */
static unsigned int az_xor_page(u8 *dst, const u8 *a, const u8 *b)
{
	const u64 *x = (const u64 *)a, *y = (const u64 *)b;
	u64 *d = (u64 *)dst;
	unsigned int i, zero = 0;

	for (i = 0; i < AZ_PAGE_SIZE / sizeof(u64); i++) {
		d[i] = x[i] ^ y[i];
		zero += !d[i];
	}
	return zero;
}

/*
 * Word-wise difference (native 64-bit words, wrapping): a page of a process
 * whose mappings are placed elsewhere (ASLR) holds the base's pointers moved
 * by one distance per mapping.  XOR scatters those into carry patterns;
 * their difference is that distance, repeated, which the codecs match.
 * Returns how many non-zero differences equal one of the last two distinct
 * non-zero ones (pointers into two mappings may alternate).
 */
static unsigned int az_diff_page(u8 *dst, const u8 *a, const u8 *b)
{
	const u64 *x = (const u64 *)a, *y = (const u64 *)b;
	u64 *d = (u64 *)dst, last = 0, prev = 0;
	unsigned int i, rep = 0;

	for (i = 0; i < AZ_PAGE_SIZE / sizeof(u64); i++) {
		d[i] = x[i] - y[i];
		if (!d[i])
			continue;
		if (d[i] == last || d[i] == prev) {
			rep++;
		} else {
			prev = last;
			last = d[i];
		}
	}
	return rep;
}

static void az_undiff_page(u8 *dst, const u8 *b)
{
	const u64 *y = (const u64 *)b;
	u64 *d = (u64 *)dst;
	unsigned int i;

	for (i = 0; i < AZ_PAGE_SIZE / sizeof(u64); i++)
		d[i] += y[i];
}

/*
 * Swap the off-diagonal @j x @j blocks of rows @x and @y (= row x + j) of a
 * 32x32 bit-matrix transpose (Hacker's Delight 7-3).  Rows are u64 holding
 * two matrices, one per 32-bit half; @m keeps each swap inside its half.
 */
#define AZ_TR_SWAP(x, y, j, m)						\
	do {								\
		u64 t_ = (((x) >> (j)) ^ (y)) & (m);			\
		(y) ^= t_;						\
		(x) ^= t_ << (j);					\
	} while (0)

#define AZ_TR_M16	0x0000ffff0000ffffULL
#define AZ_TR_M8	0x00ff00ff00ff00ffULL
#define AZ_TR_M4	0x0f0f0f0f0f0f0f0fULL
#define AZ_TR_M2	0x3333333333333333ULL
#define AZ_TR_M1	0x5555555555555555ULL

/*
 * Transpose two 32x32 bit matrices (row i of each in one half of the
 * 64-bit row i): rows are read at @src + i * @sstep and written at
 * @dst + i * @dstep.  The five stages run in registers: stages 16 and 8
 * touch only the rows k, k + 8, k + 16, k + 24, stages 4, 2 and 1 only the
 * rows 8m .. 8m + 7; @a carries the rows between the two passes.  (One
 * pass per stage over a 32-row array moved every row through memory five
 * times: 2.2x slower natively and under QEMU's TCG.)
 */
static void az_transpose32x2(u8 *dst, u32 dstep, const u8 *src, u32 sstep)
{
	u64 a[32], r0, r1, r2, r3, r4, r5, r6, r7;
	unsigned int k;

	for (k = 0; k < 8; k++) {
		r0 = az_get_le64(src + sstep * k);
		r1 = az_get_le64(src + sstep * (k + 8));
		r2 = az_get_le64(src + sstep * (k + 16));
		r3 = az_get_le64(src + sstep * (k + 24));
		AZ_TR_SWAP(r0, r2, 16, AZ_TR_M16);
		AZ_TR_SWAP(r1, r3, 16, AZ_TR_M16);
		AZ_TR_SWAP(r0, r1, 8, AZ_TR_M8);
		AZ_TR_SWAP(r2, r3, 8, AZ_TR_M8);
		a[k] = r0;
		a[k + 8] = r1;
		a[k + 16] = r2;
		a[k + 24] = r3;
	}
	for (k = 0; k < 32; k += 8) {
		r0 = a[k];
		r1 = a[k + 1];
		r2 = a[k + 2];
		r3 = a[k + 3];
		r4 = a[k + 4];
		r5 = a[k + 5];
		r6 = a[k + 6];
		r7 = a[k + 7];
		AZ_TR_SWAP(r0, r4, 4, AZ_TR_M4);
		AZ_TR_SWAP(r1, r5, 4, AZ_TR_M4);
		AZ_TR_SWAP(r2, r6, 4, AZ_TR_M4);
		AZ_TR_SWAP(r3, r7, 4, AZ_TR_M4);
		AZ_TR_SWAP(r0, r2, 2, AZ_TR_M2);
		AZ_TR_SWAP(r1, r3, 2, AZ_TR_M2);
		AZ_TR_SWAP(r4, r6, 2, AZ_TR_M2);
		AZ_TR_SWAP(r5, r7, 2, AZ_TR_M2);
		AZ_TR_SWAP(r0, r1, 1, AZ_TR_M1);
		AZ_TR_SWAP(r2, r3, 1, AZ_TR_M1);
		AZ_TR_SWAP(r4, r5, 1, AZ_TR_M1);
		AZ_TR_SWAP(r6, r7, 1, AZ_TR_M1);
		az_put_le64(r0, dst + dstep * k);
		az_put_le64(r1, dst + dstep * (k + 1));
		az_put_le64(r2, dst + dstep * (k + 2));
		az_put_le64(r3, dst + dstep * (k + 3));
		az_put_le64(r4, dst + dstep * (k + 4));
		az_put_le64(r5, dst + dstep * (k + 5));
		az_put_le64(r6, dst + dstep * (k + 6));
		az_put_le64(r7, dst + dstep * (k + 7));
	}
}

/*
 * Bit shuffle (see az_internal.h): the page is 16 groups of 64 little
 * endian 4-byte words.  A group is read as 32 64-bit rows (row i = words
 * 2i and 2i + 1), i.e. two 32x32 bit matrices, the even words and the odd
 * ones; transposed, row p holds bit p of the 32 even words (low half) and
 * of the 32 odd words (high half) and is stored at plane p (128 bytes),
 * offset 8 * group.  The unshuffle is the same transpose the other way.
 */
#define AZ_SHUF_PLANE	(AZ_PAGE_SIZE / 32)
#define AZ_SHUF_GROUP	(64 * 4)

static void az_shuffle(u8 *dst, const u8 *src)
{
	unsigned int g;

	for (g = 0; g < AZ_PAGE_SIZE / AZ_SHUF_GROUP; g++)
		az_transpose32x2(dst + 8 * g, AZ_SHUF_PLANE,
				 src + AZ_SHUF_GROUP * g, 8);
}

static void az_unshuffle(u8 *dst, const u8 *src)
{
	unsigned int g;

	for (g = 0; g < AZ_PAGE_SIZE / AZ_SHUF_GROUP; g++)
		az_transpose32x2(dst + AZ_SHUF_GROUP * g, 8,
				 src + 8 * g, AZ_SHUF_PLANE);
}

/* Compress @src into @out + header; returns object size or 0. */
static u32 az_compress_len(struct az_ctx *ctx, const struct az_policy *pol,
			   const void *src, u32 len, u8 *out, u32 cap,
			   u8 enc_lz4, u8 enc_zstd, u8 *enc)
{
	u8 *dst = out + AZ_HDR_SIZE;
	int n;

	if (cap <= AZ_HDR_SIZE)
		return 0;
	cap -= AZ_HDR_SIZE;
	if (pol->codec == AZ_CODEC_ZSTD) {
		n = az_zstd_compress(ctx->ws, pol->level, src, len, dst, cap);
		*enc = enc_zstd;
	} else {
		n = az_lz4_compress(ctx, src, len, dst, cap);
		*enc = enc_lz4;
	}
	if (n <= 0 || (u32)n > cap)
		return 0;
	az_put_hdr(out, *enc, n);
	return n + AZ_HDR_SIZE;
}

static u32 az_compress(struct az_ctx *ctx, const struct az_policy *pol,
		       const void *src, u8 *out, u32 cap, u8 enc_lz4,
		       u8 enc_zstd, u8 *enc)
{
	return az_compress_len(ctx, pol, src, AZ_PAGE_SIZE, out, cap, enc_lz4,
			       enc_zstd, enc);
}

u32 az_encode_pack(struct az_ctx *ctx, const struct az_policy *pol,
		   const void *pages, u32 n, u8 *out, u32 max, u8 *enc)
{
	struct az_policy p = *pol;
	u32 m;

	if (n < 2 || n > AZ_PACK_MAX)
		return 0;
	if (p.level < AZ_PACK_ZSTD_LEVEL)
		p.level = AZ_PACK_ZSTD_LEVEL;
	m = az_compress_len(ctx, &p, pages, n * AZ_PAGE_SIZE, out, max,
			    AZ_ENC_PACK_LZ4, AZ_ENC_PACK_ZSTD, enc);
	return m < max ? m : 0;
}

/*
 * A page of 4-byte words whose two low bytes are noise (float32 mantissas;
 * random bytes too), judged from AZ_NOISE_SAMPLES pairs of adjacent words
 * (the two halves of one 64-bit word in every 32 bytes, the word within
 * the block chosen by a hash of the block's number, so that every field of
 * a record up to 512 bytes long is seen): fewer than AZ_NOISE_MAX_SAME
 * pairs share their low byte, as many the next one, fewer than
 * AZ_NOISE_MAX_ZERO of the words are zero, and the low byte of about half
 * of them (AZ_NOISE_MIN_HIGH to AZ_NOISE_MAX_HIGH) has its top bit set, as
 * in uniform bytes.  Text and JSON (7-bit bytes), non-Latin UTF-8 text
 * (every byte's top bit set), sparse heap pages and records with a text
 * field fail it.  A sample: the whole page takes longer than lz4 takes to
 * give up on noise.  Native words: the low byte is a native float's
 * lowest mantissa bits.
 */
static bool az_page_is_noisy(const void *page)
{
	const u64 *x = page;
	unsigned int i, k, same0 = 0, same1 = 0, zero = 0, high = 0;
	u32 lo, hi, d;

	for (i = 0; i < AZ_NOISE_SAMPLES; i++) {
		k = 4 * i + ((i ^ i >> 2 ^ i >> 4) & 3);
		lo = (u32)x[k];
		hi = x[k] >> 32;
		d = lo ^ hi;
		same0 += !(d & 0xff);
		same1 += !(d & 0xff00);
		zero += !lo + !hi;
		high += ((lo >> 7) & 1) + ((hi >> 7) & 1);
	}
	return same0 < AZ_NOISE_MAX_SAME && same1 < AZ_NOISE_MAX_SAME &&
	       zero < AZ_NOISE_MAX_ZERO && high >= AZ_NOISE_MIN_HIGH &&
	       high <= AZ_NOISE_MAX_HIGH;
}

/*
 * Whether zstd should compress @src (a page) bit-shuffled only: it is
 * noisy and lz4, which gives up on noise in a fraction of the time zstd
 * takes, cannot get it to @limit bytes or less (content that repeats at a
 * distance the shuffle's groups break up compresses as bytes).  @scratch:
 * @limit bytes.  Under lz4 the attempt as it is costs what this probe
 * would: nothing changes.
 */
static bool az_noise_only(struct az_ctx *ctx, const struct az_policy *pol,
			  const void *src, u8 *scratch, u32 limit)
{
	return pol->codec == AZ_CODEC_ZSTD && az_page_is_noisy(src) &&
	       az_lz4_compress(ctx, src, AZ_PAGE_SIZE, scratch, limit) <= 0;
}

u32 az_encode_plain(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, u8 *out, u32 max, u8 *enc)
{
	/* the shuffled form only where the object may exceed zram's threshold */
	bool shuf = max > AZ_RAW_THRESHOLD;
	u32 n = 0, m;
	u8 e;

	if (shuf && az_noise_only(ctx, pol, page, out, AZ_RAW_THRESHOLD)) {
		az_shuffle(ctx->sbuf, page);
		n = az_compress(ctx, pol, ctx->sbuf, out, max, AZ_ENC_SHUF_LZ4,
				AZ_ENC_SHUF_ZSTD, enc);
		/* if they did not compress, the bytes as they are (only) */
		shuf = false;
	}
	if (!n) {
		n = az_compress(ctx, pol, page, out, max, AZ_ENC_LZ4,
				AZ_ENC_ZSTD, enc);
		if (shuf && (!n || n > AZ_SHUF_MIN_PLAIN)) {
			az_shuffle(ctx->sbuf, page);
			m = az_compress(ctx, pol, ctx->sbuf, ctx->xbuf,
					n ? n - 1 : max, AZ_ENC_SHUF_LZ4,
					AZ_ENC_SHUF_ZSTD, &e);
			if (m) {
				az_copy_words(out, ctx->xbuf, m);
				*enc = e;
				n = m;
			}
		}
	}
	if (!n || n >= max) {
		*enc = 0;
		return AZ_PAGE_SIZE;
	}
	return n;
}

/* Copy the candidate in ctx->xbuf (@m bytes, encoding @e) to @out. */
static u32 az_take(struct az_ctx *ctx, u8 *out, u32 m, u8 e, u8 *enc)
{
	az_copy_words(out, ctx->xbuf, m);
	*enc = e;
	return m;
}

/*
 * Delta against @base: XOR then the policy codec (good for in-place
 * edits; only with AZ_XOR_MIN_ZERO zero words, or against a @numeric base
 * unless shuffle is on and zstd should take the XOR only shuffled:
 * az_noise_only()); when that is still large or not tried, the XOR
 * bit-shuffled (good for numeric arrays with small changes; only against a
 * @numeric base); when enough of its words moved by the same distance, the
 * word-wise difference (good for pointers moved by ASLR); then lz4 with
 * @base as dictionary (good for shifted content; cheap, so tried whatever
 * the policy codec).  A form of at most AZ_DELTA_DONE bytes ends the
 * search.  The smallest wins.  Returns 0 unless the result is < @limit.
 */
u32 az_encode_delta(struct az_ctx *ctx, const struct az_policy *pol,
		    const void *page, const void *base, bool numeric, u8 *out,
		    u32 limit, u8 *enc)
{
	u32 cap = az_min(limit, az_obj_max(pol)) - 1;
	u32 n, m;
	u8 e;
	int r;

	if (limit <= AZ_HDR_SIZE + 1)
		return 0;
	n = 0;
	if (az_xor_page(ctx->xbuf, page, base) >= AZ_XOR_MIN_ZERO ||
	    (numeric && !(pol->shuffle &&
			  az_noise_only(ctx, pol, ctx->xbuf, out,
					AZ_SHUF_MIN_DELTA)))) {
		n = az_compress(ctx, pol, ctx->xbuf, out, cap, AZ_ENC_XOR_LZ4,
				AZ_ENC_XOR_ZSTD, enc);
		if (n)
			cap = n - 1;
	}
	if (numeric && pol->shuffle && (!n || n > AZ_SHUF_MIN_DELTA) &&
	    cap > AZ_HDR_SIZE) {
		/* xbuf is free once shuffled: it takes the candidate */
		az_shuffle(ctx->sbuf, ctx->xbuf);
		m = az_compress(ctx, pol, ctx->sbuf, ctx->xbuf, cap,
				AZ_ENC_XSHUF_LZ4, AZ_ENC_XSHUF_ZSTD, &e);
		if (m) {
			n = az_take(ctx, out, m, e, enc);
			cap = n - 1;
		}
	}
	if (n && n <= AZ_DELTA_DONE)
		return n;
	/* sbuf is free again: it takes the difference */
	if (cap > AZ_HDR_SIZE &&
	    az_diff_page(ctx->sbuf, page, base) >= AZ_SUB_MIN_REPEATS) {
		m = az_compress(ctx, pol, ctx->sbuf, ctx->xbuf, cap,
				AZ_ENC_SUB_LZ4, AZ_ENC_SUB_ZSTD, &e);
		if (m) {
			n = az_take(ctx, out, m, e, enc);
			cap = n - 1;
		}
	}
	if ((n && n <= AZ_DELTA_DONE) || cap <= AZ_HDR_SIZE)
		return n;
	/* Dictionary mode into the scratch page, then keep the smaller. */
	r = az_lz4_compress_dict(ctx, base, AZ_PAGE_SIZE, page,
				 AZ_PAGE_SIZE, ctx->xbuf + AZ_HDR_SIZE,
				 cap - AZ_HDR_SIZE);
	if (r <= 0)
		return n;
	az_put_hdr(ctx->xbuf, AZ_ENC_DICT_LZ4, r);
	return az_take(ctx, out, r + AZ_HDR_SIZE, AZ_ENC_DICT_LZ4, enc);
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
		az_copy_words(page, obj, AZ_PAGE_SIZE);
		return 0;
	case AZ_ENC_LZ4:
	case AZ_ENC_XOR_LZ4:
	case AZ_ENC_SUB_LZ4:
		n = az_lz4_decompress(src, slen, page, AZ_PAGE_SIZE);
		break;
	case AZ_ENC_ZSTD:
	case AZ_ENC_XOR_ZSTD:
	case AZ_ENC_SUB_ZSTD:
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
	else if (enc == AZ_ENC_SUB_LZ4 || enc == AZ_ENC_SUB_ZSTD)
		az_undiff_page(page, base);
	return 0;
}

int az_decode_pack(struct az_ctx *ctx, const u8 *obj, u32 size, void *pages)
{
	const u8 *src = obj + AZ_HDR_SIZE;
	int slen = (int)size - AZ_HDR_SIZE;
	int enc, n;

	enc = az_obj_encoding(obj, size);
	if (enc == AZ_ENC_PACK_LZ4)
		n = az_lz4_decompress(src, slen, pages,
				      AZ_PACK_MAX * AZ_PAGE_SIZE);
	else if (enc == AZ_ENC_PACK_ZSTD)
		n = az_zstd_decompress(ctx->ws, src, slen, pages,
				       AZ_PACK_MAX * AZ_PAGE_SIZE);
	else
		return -EIO;
	if (n < 2 * (int)AZ_PAGE_SIZE || n % AZ_PAGE_SIZE)
		return -EIO;
	return n / AZ_PAGE_SIZE;
}
