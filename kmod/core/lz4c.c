// SPDX-License-Identifier: GPL-2.0
/*
 * LZ4 block compressor of the store core (module and host library).
 *
 * The output is the LZ4 block format (lz4's doc/lz4_Block_format.md),
 * decoded by the kernel's and liblz4's LZ4_decompress_safe() and, with a
 * dictionary, LZ4_decompress_safe_usingDict().  It replaces the libraries'
 * one-shot compressors for one reason: they clear their 16 KiB hash table
 * on every call (LZ4_resetStream(), a memset four times the size of the
 * page), and the store compresses a page up to five times (as it is,
 * bit-shuffled, its XOR against a base, that XOR shuffled, with the base
 * as dictionary).  Under QEMU's TCG, where the tests and benchmarks of
 * this project run, the kernel's memset ("rep stosb" on CPUs with ERMS)
 * takes 17.5 us for the table, about a third of zram's whole store of a
 * page; on hardware it is a few hundred nanoseconds, still four times the
 * bytes of the page written per call.
 *
 * Here a table entry holds a position in a numbering that runs on from
 * call to call (az_lz4c.next), so an entry below the current call's first
 * number is from an earlier call and is ignored: nothing is cleared
 * between calls (liblz4 1.9's LZ4_compress_fast_extState_fastReset() does
 * the same).  The table is cleared only when the numbering would pass
 * AZ_LZ4C_WRAP.
 *
 * The parse is lz4's fast one at acceleration 1: hash the next 5 bytes,
 * take the last position with that hash if its 4 bytes are the same and
 * it is at most 64 KiB back, extend the match both ways, and step ahead
 * faster the longer nothing is found.  With a dictionary, the dictionary
 * is numbered before the input and every third position of it is hashed
 * first (LZ4_loadDict() does so for its last 64 KiB); a match that starts
 * in the dictionary may run on into the input, as the decoders allow.  The block rules every decoder relies on hold: no match
 * starts in the last 12 bytes, and the last 5 bytes are literals.
 *
 * One caller at a time per table (it belongs to one struct az_ctx).
 */
#include "az_internal.h"

#define AZ_LZ4_MINMATCH		4
#define AZ_LZ4_LASTLITERALS	5
#define AZ_LZ4_MFLIMIT		12
#define AZ_LZ4_MIN_INPUT	(AZ_LZ4_MFLIMIT + 1)
#define AZ_LZ4_MAX_DISTANCE	65535
#define AZ_LZ4_SKIP_TRIGGER	6
#define AZ_LZ4_RUN_MASK		15
#define AZ_LZ4_ML_MASK		15
#define AZ_LZ4_DICT_STEP	3
/* Positions are numbered below this; past it the table is cleared. */
#define AZ_LZ4C_WRAP		0xc0000000U

static inline u32 az_lz4_read32(const u8 *p)
{
	return (u32)p[0] | (u32)p[1] << 8 | (u32)p[2] << 16 | (u32)p[3] << 24;
}

/*
 * lz4's hash of the 5 bytes at @p (8 readable), as its 64-bit builds have
 * it, into a table twice the size of lz4's (13 bits): fewer false
 * candidates, faster and smaller blocks on the test pages.
 */
static inline u32 az_lz4_hash(const u8 *p)
{
	return (u32)(((az_get_le64(p) << 24) * 889523592379ULL) >>
		     (64 - AZ_LZ4C_HASH_LOG));
}

/* Length of the common prefix of @p and @m, @p not reaching @plimit. */
static inline u32 az_lz4_count(const u8 *p, const u8 *m, const u8 *plimit)
{
	const u8 *start = p;
	u64 d;

	while (p + 8 <= plimit) {
		d = az_get_le64(p) ^ az_get_le64(m);
		if (d)
			return (u32)(p - start) + (__builtin_ctzll(d) >> 3);
		p += 8;
		m += 8;
	}
	while (p < plimit && *p == *m) {
		p++;
		m++;
	}
	return (u32)(p - start);
}

/*
 * Copy @n literals that are followed by at least 8 more input bytes, 8
 * at a time; the last 8 run past @n where the output has room (lz4's
 * wild copy), else the tail goes a byte at a time.
 */
static inline u8 *az_lz4_literals(u8 *op, const u8 *src, u32 n,
				  const u8 *oend)
{
	u32 i;

	for (i = 0; i + 8 <= n; i += 8)
		az_put_le64(az_get_le64(src + i), op + i);
	if (i < n && op + i + 8 <= oend) {
		az_put_le64(az_get_le64(src + i), op + i);
	} else {
		for (; i < n; i++)
			op[i] = src[i];
	}
	return op + n;
}

static u8 *az_lz4_put_len(u8 *op, u32 len)
{
	for (; len >= 255; len -= 255)
		*op++ = 255;
	*op++ = (u8)len;
	return op;
}

void az_lz4c_init(struct az_lz4c *t)
{
	memset(t->table, 0, AZ_LZ4C_TABLE_BYTES);
	t->next = 1;
}

/* The bytes numbered @v: in the dictionary below @src0, else the input. */
static inline const u8 *az_lz4c_at(u32 v, u32 base, u32 src0, const u8 *dict,
				   const u8 *src)
{
	return v < src0 ? dict + (v - base) : src + (v - src0);
}

/*
 * Compress @len bytes at @src into @dst (at most @cap bytes), with the
 * @dlen bytes at @dict (@dlen may be 0) as an external dictionary.
 * Returns the compressed size, or 0 when it does not fit.
 */
static int az_lz4c_compress(struct az_lz4c *t, const u8 *dict, u32 dlen,
			    const u8 *src, u32 len, u8 *dst, u32 cap)
{
	const u8 *ip = src, *anchor = src, *iend = src + len;
	const u8 *mflimit, *matchlimit, *fwd, *m, *mlimit;
	u8 *op = dst, *oend = dst + cap, *token;
	u32 base, src0, h, fwd_h, e, mv, step, tries, lit, ml;
	u32 *tab = t->table;

	if (len > AZ_LZ4C_MAX_INPUT || dlen > AZ_LZ4C_MAX_INPUT)
		return 0;
	if (t->next > AZ_LZ4C_WRAP - dlen - len)
		az_lz4c_init(t);
	/* Numbers from @base: the dictionary, then the input from @src0. */
	base = t->next;
	src0 = base + dlen;
	t->next = src0 + len;
	if (len < AZ_LZ4_MIN_INPUT)
		goto last_literals;
	mflimit = iend - AZ_LZ4_MFLIMIT;
	matchlimit = iend - AZ_LZ4_LASTLITERALS;
	for (e = 0; e + 8 <= dlen; e += AZ_LZ4_DICT_STEP)
		tab[az_lz4_hash(dict + e)] = base + e;

	tab[az_lz4_hash(ip)] = src0;
	fwd_h = az_lz4_hash(++ip);
	for (;;) {
		/* Find a match: the bytes numbered mv start as ip does. */
		fwd = ip;
		step = 1;
		tries = 1U << AZ_LZ4_SKIP_TRIGGER;
		for (;;) {
			h = fwd_h;
			ip = fwd;
			fwd += step;
			step = tries++ >> AZ_LZ4_SKIP_TRIGGER;
			if (fwd > mflimit)
				goto last_literals;
			mv = tab[h];
			fwd_h = az_lz4_hash(fwd);
			e = src0 + (u32)(ip - src);
			tab[h] = e;
			if (mv < base || e - mv > AZ_LZ4_MAX_DISTANCE)
				continue;
			m = az_lz4c_at(mv, base, src0, dict, src);
			if (az_lz4_read32(m) == az_lz4_read32(ip))
				break;
		}
		/* Extend it backwards, within the dictionary or the input. */
		while (ip > anchor && mv != base && mv != src0 &&
		       ip[-1] == m[-1]) {
			ip--;
			m--;
			mv--;
		}
		lit = (u32)(ip - anchor);
		if (op + 1 + (lit + 240) / 255 + lit + 2 > oend)
			return 0;
		token = op++;
		if (lit >= AZ_LZ4_RUN_MASK) {
			*token = AZ_LZ4_RUN_MASK << 4;
			op = az_lz4_put_len(op, lit - AZ_LZ4_RUN_MASK);
		} else {
			*token = (u8)(lit << 4);
		}
		op = az_lz4_literals(op, anchor, lit, oend);
next_match:
		/* The offset, then the length past AZ_LZ4_MINMATCH. */
		e = src0 + (u32)(ip - src) - mv;
		*op++ = (u8)e;
		*op++ = (u8)(e >> 8);
		mlimit = matchlimit;
		if (mv < src0)		/* in the dictionary up to its end */
			mlimit = az_min(matchlimit, ip + (src0 - mv));
		ml = az_lz4_count(ip + AZ_LZ4_MINMATCH, m + AZ_LZ4_MINMATCH,
				  mlimit);
		ip += AZ_LZ4_MINMATCH + ml;
		if (mv < src0 && ip == mlimit) {
			/* then on into the input, which follows it */
			e = az_lz4_count(ip, src, matchlimit);
			ml += e;
			ip += e;
		}
		if (op + (ml + 240) / 255 > oend)
			return 0;
		if (ml >= AZ_LZ4_ML_MASK) {
			*token += AZ_LZ4_ML_MASK;
			op = az_lz4_put_len(op, ml - AZ_LZ4_ML_MASK);
		} else {
			*token += (u8)ml;
		}
		anchor = ip;
		if (ip > mflimit)
			break;
		tab[az_lz4_hash(ip - 2)] = src0 + (u32)(ip - 2 - src);
		/* A match right here: a sequence without literals. */
		h = az_lz4_hash(ip);
		mv = tab[h];
		e = src0 + (u32)(ip - src);
		tab[h] = e;
		if (mv >= base && e - mv <= AZ_LZ4_MAX_DISTANCE) {
			m = az_lz4c_at(mv, base, src0, dict, src);
			if (az_lz4_read32(m) == az_lz4_read32(ip)) {
				if (op + 1 + 2 > oend)
					return 0;
				token = op++;
				*token = 0;
				goto next_match;
			}
		}
		fwd_h = az_lz4_hash(++ip);
	}
last_literals:
	lit = (u32)(iend - anchor);
	if (op + 1 + (lit + 240) / 255 + lit > oend)
		return 0;
	if (lit >= AZ_LZ4_RUN_MASK) {
		*op++ = AZ_LZ4_RUN_MASK << 4;
		op = az_lz4_put_len(op, lit - AZ_LZ4_RUN_MASK);
	} else {
		*op++ = (u8)(lit << 4);
	}
	az_copy_words(op, anchor, lit);
	op += lit;
	return (int)(op - dst);
}

int az_lz4_compress(struct az_ctx *ctx, const void *src, int len, void *dst,
		    int cap)
{
	az_codec_count(AZ_CODEC_COUNT_LZ4);
	if (len < 0 || cap <= 0)
		return 0;
	return az_lz4c_compress(&ctx->lz4c, NULL, 0, src, len, dst, cap);
}

int az_lz4_compress_dict(struct az_ctx *ctx, const void *dict, int dlen,
			 const void *src, int len, void *dst, int cap)
{
	az_codec_count(AZ_CODEC_COUNT_LZ4_DICT);
	if (dlen < 0 || len < 0 || cap <= 0)
		return 0;
	return az_lz4c_compress(&ctx->lz4c, dict, dlen, src, len, dst, cap);
}
