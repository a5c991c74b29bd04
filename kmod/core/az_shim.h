/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The one environment boundary of the store core.  The core's .c files
 * include only this header (and azcore.h); it pulls in the kernel or the
 * host implementation of the same small interface:
 *
 *   types      u8/u16/u32/u64/s64, bool, size_t
 *   memory     az_alloc(size, gfp), az_zalloc(size, gfp), az_free(p),
 *              az_obj_zalloc(gfp)/az_obj_free(p) for object headers,
 *              az_valloc/az_vfree for big tables; gfp is AZ_GFP_NOWAIT or
 *              AZ_GFP_MAYSLEEP
 *   locks      az_spinlock_t + az_spin_init/lock/unlock,
 *              per-slot bit lock az_bit_lock/az_bit_unlock(bit, word*)
 *   atomics    az_atomic_t (int) and az_atomic64_t with
 *              read/set/inc/dec/add/sub/dec_and_test/inc_not_zero
 *   hashing    az_xxh64(buf, len, seed)
 *   codecs     lz4 and zstd (one-shot, workspaces owned by struct az_ctx)
 *   pool       az_pool_* over zsmalloc (kernel) or malloc (host)
 *   deferral   az_defer_* to run frees outside the slot-free path
 *   logging    az_err/az_warn/az_info
 */
#ifndef AZ_SHIM_H
#define AZ_SHIM_H

#ifdef __KERNEL__
#include "az_shim_kernel.h"
#else
#include "az_shim_host.h"
#endif

#endif /* AZ_SHIM_H */
