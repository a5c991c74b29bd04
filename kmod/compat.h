/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Kernel-version differences the glue cares about.
 *
 * rw_page: 6.1 marks a swap device SWP_SYNCHRONOUS_IO only when the driver
 * has ->rw_page (mm/swapfile.c), so swap-in skips readahead and the bio
 * round trip.  ->rw_page and bdev_{read,write}_page() were removed in 6.3;
 * there the bio path alone is used.  kmod/Kbuild defines
 * AZSWAP_HAVE_RW_PAGE when the target's blkdev.h still declares it (a
 * header probe rather than a version check, so backports are honoured).
 */
#ifndef AZSWAP_COMPAT_H
#define AZSWAP_COMPAT_H

#ifdef AZSWAP_HAVE_RW_PAGE
#define azswap_fops_rw_page(fn)	.rw_page = (fn),
#else
#define azswap_fops_rw_page(fn)
#endif

#endif /* AZSWAP_COMPAT_H */
