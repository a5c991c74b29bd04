// SPDX-License-Identifier: GPL-2.0
/*
 * A module that only runs az_core_selftest() at load and fails to load
 * when it fails: the store core alone in the real kernel (zsmalloc, lz4,
 * zstd, bit locks, the deferred-free worker).  Built and run in a VM by
 * kmod/core/kselftest/run.sh.
 */
#include <linux/module.h>
#include "core/azcore.h"

static int __init azcore_selftest_init(void)
{
	int err = az_core_selftest();

	pr_info("azcore-selftest: result %d\n", err);
	return err;
}

static void __exit azcore_selftest_exit(void)
{
}

module_init(azcore_selftest_init);
module_exit(azcore_selftest_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("azswap store core self-test");
