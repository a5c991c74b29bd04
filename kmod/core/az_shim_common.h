/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Shim functions implemented twice: az_shim_kernel.c (zsmalloc, kernel
 * lz4/zstd) and host/az_shim_host.c (malloc, liblz4/libzstd).  Included by
 * az_shim_kernel.h and az_shim_host.h after their basic types.
 */
#ifndef AZ_SHIM_COMMON_H
#define AZ_SHIM_COMMON_H

/*
 * Copy @n bytes 8 at a time.  A memcpy() of a size unknown at compile time
 * is "rep movsb" on x86 CPUs with ERMS, which QEMU's TCG (where this
 * project's tests and benchmarks run) executes a byte per iteration:
 * measured there, the two copies of a split object cost 19.6 k cycles, a
 * third of a whole load.  The core's other copies of page data use it too,
 * so that it has one copy routine (in swapbench they made no measurable
 * difference).  On hardware both ways are fast.
 */
static inline void az_copy_words(u8 *dst, const u8 *src, u32 n)
{
	u32 i;

	for (i = 0; i + 8 <= n; i += 8)
		az_put_le64(az_get_le64(src + i), dst + i);
	for (; i < n; i++)
		dst[i] = src[i];
}

/*
 * Object pool.  Handles are opaque and never 0.  A mapping is valid until
 * the matching unmap; only one object may be mapped at a time per CPU and
 * the caller must not sleep while it is mapped (zsmalloc rules).
 */
struct az_pool;
struct az_pool *az_pool_create(const char *name);
void az_pool_destroy(struct az_pool *p);
/* Returns 0 on failure.  @size is at most AZ_PAGE_SIZE. */
unsigned long az_pool_alloc(struct az_pool *p, size_t size, int gfp);
/* Atomic context safe. */
void az_pool_free(struct az_pool *p, unsigned long handle);
/*
 * Object access by copy, as zsmalloc has it since 6.18 (one access at a
 * time per CPU, no sleeping in between):
 *  - az_pool_write() copies @len bytes from @src into the object;
 *  - az_pool_read_begin() returns @len readable bytes of the object,
 *    either mapped in place or copied into @local (AZ_PAGE_SIZE bytes);
 *    az_pool_read_end() ends the access with what read_begin returned.
 */
void az_pool_write(struct az_pool *p, unsigned long handle, const void *src,
		   u32 len);
const void *az_pool_read_begin(struct az_pool *p, unsigned long handle,
			       u32 len, void *local);
void az_pool_read_end(struct az_pool *p, unsigned long handle, u32 len,
		      const void *mem);
/* Bytes the pool holds from the system (pages for zsmalloc). */
u64 az_pool_bytes(struct az_pool *p);
/* Move objects out of partly used pages and free those; bytes freed.  May sleep. */
u64 az_pool_compact(struct az_pool *p);

/*
 * Codec workspaces (one per az_ctx, process context to create).  All
 * compressors return the compressed size, or 0 when the output did not
 * fit in @cap; decompressors return the decompressed size or a negative
 * value on malformed input and never write past @cap.  The lz4
 * compressor is the core's own (lz4c.c); the shim has its decoders.
 */
struct az_codec_ws;
/* What az_codec_count() counts (a no-op in the module). */
enum {
	AZ_CODEC_COUNT_LZ4,
	AZ_CODEC_COUNT_LZ4_DICT,
	AZ_CODEC_COUNT_ZSTD,
};
struct az_codec_ws *az_codec_ws_create(void);
void az_codec_ws_destroy(struct az_codec_ws *w);
size_t az_codec_ws_bytes(struct az_codec_ws *w);

int az_lz4_decompress(const void *src, int slen, void *dst, int cap);
/* LZ4 with @dict as an external dictionary (delta encoding). */
int az_lz4_decompress_dict(const void *src, int slen, void *dst, int cap,
			   const void *dict, int dlen);
/* zstd with a @len-byte size hint (compression parameters for 4 KiB). */
int az_zstd_compress(struct az_codec_ws *w, int level, const void *src,
		     int len, void *dst, int cap);
int az_zstd_decompress(struct az_codec_ws *w, const void *src, int slen,
		       void *dst, int cap);

/*
 * Threads and time, for the self-test's stress run only (az_core_stress).
 * az_thread_join waits for @fn to return and gives its return value.
 */
struct az_thread;
struct az_thread *az_thread_start(int (*fn)(void *arg), void *arg,
				  const char *name);
int az_thread_join(struct az_thread *t);
u64 az_now_ms(void);

#endif /* AZ_SHIM_COMMON_H */
