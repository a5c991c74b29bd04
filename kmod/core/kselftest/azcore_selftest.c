// SPDX-License-Identifier: GPL-2.0
/*
 * A module that only runs the store core's self-test and concurrent
 * stress at load, and fails to load when either fails: the core alone in
 * the real kernel (zsmalloc, lz4, zstd, bit locks, the deferred-free
 * worker, kthreads racing on one store).  Built and run in a VM by
 * kmod/core/kselftest/run.sh.
 */
#include <linux/module.h>
#include <linux/moduleparam.h>
#include "core/azcore.h"

static unsigned int stress_ms = 3000;
module_param(stress_ms, uint, 0444);
MODULE_PARM_DESC(stress_ms, "duration of the concurrent stress (0: skip)");

static unsigned int stress_threads = 4;
module_param(stress_threads, uint, 0444);
MODULE_PARM_DESC(stress_threads, "stress worker threads (1..64)");

static int __init azcore_selftest_init(void)
{
	int err = az_core_init();

	if (err)
		return err;
	err = az_core_selftest();
	if (!err && stress_ms)
		err = az_core_stress(stress_threads, stress_ms);
	pr_info("azcore-selftest: result %d\n", err);
	if (err)
		az_core_exit();
	return err;
}

static void __exit azcore_selftest_exit(void)
{
	az_core_exit();
}

module_init(azcore_selftest_init);
module_exit(azcore_selftest_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("azswap store core self-test");
