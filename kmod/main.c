// SPDX-License-Identifier: GPL-2.0
/*
 * azswap: redundancy-aware compressed swap device.
 *
 * Module parameters and init/exit: wires the device state (device.c) to
 * its front ends (sysfs.c, netlink.c).  A reader following one page goes
 * on to device.c (block glue), then core/store.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>

#include "azswap.h"

static unsigned int num_devices = 1;
module_param(num_devices, uint, 0444);
MODULE_PARM_DESC(num_devices, "Number of /dev/azswapN devices (1.."
		 __stringify(AZSWAP_MAX_DEVICES) ", default 1)");

#ifdef AZSWAP_SELFTEST
/* Debug builds only (make kmod-debug, or AZSWAP_DEBUG=1). */
static bool selftest;
module_param(selftest, bool, 0444);
MODULE_PARM_DESC(selftest, "Run the store core self-test at load (default 0)");
#endif

/*
 * Swap-ins through the swap cache.  By default the devices are synchronous,
 * as zram's are: a swap-in reads the page straight into a new page and
 * frees the slot, and so its stored copy.  With swap_cache=1 they are not:
 * the kernel reads a page into the swap cache (vm.page-cluster readahead
 * applies) and, while there is swap to spare, keeps its slot unless the
 * fault writes.  Reclaiming that page again, still clean, frees it without
 * a write: the copy kept is used, nothing is compressed twice; written
 * meanwhile, it is stored into the slot it kept, replacing the copy.  A
 * sandbox whose working set is compressed at every LLM wait and brought
 * back before every tool pays for its read-only pages once.  The price:
 * the copy's bytes while the page is resident, and a bio per swap-in.
 */
bool azswap_swap_cache;
module_param_named(swap_cache, azswap_swap_cache, bool, 0444);
MODULE_PARM_DESC(swap_cache, "Swap-ins via swap cache: clean pages keep their copy (default 0)");

struct azswap_dev *azswap_devs;
unsigned int azswap_nr_devs;

static int __init azswap_init(void)
{
	unsigned int i;
	int ret;

	if (!num_devices || num_devices > AZSWAP_MAX_DEVICES) {
		pr_err("num_devices must be 1..%d\n", AZSWAP_MAX_DEVICES);
		return -EINVAL;
	}
	ret = az_core_init();
	if (ret)
		return ret;
#ifdef AZSWAP_SELFTEST
	if (selftest) {
		ret = az_core_selftest();
		if (ret) {
			pr_err("store core self-test failed: %d\n", ret);
			goto err_core;
		}
		pr_info("store core self-test passed\n");
	}
#endif

	ret = azswap_ctxs_init();
	if (ret)
		goto err_core;
	ret = azswap_register_blkdev();
	if (ret)
		goto err_ctxs;
	azswap_devs = kcalloc(num_devices, sizeof(*azswap_devs), GFP_KERNEL);
	if (!azswap_devs) {
		ret = -ENOMEM;
		goto err_blkdev;
	}
	for (i = 0; i < num_devices; i++) {
		ret = azswap_dev_add(&azswap_devs[i], i, azswap_disk_groups);
		if (ret)
			goto err_devs;
		azswap_nr_devs = i + 1;
	}
	ret = azswap_netlink_init();
	if (ret)
		goto err_devs;
	pr_info("%u device(s) ready\n", azswap_nr_devs);
	return 0;

err_devs:
	while (azswap_nr_devs)
		azswap_dev_remove(&azswap_devs[--azswap_nr_devs]);
	kfree(azswap_devs);
err_blkdev:
	azswap_unregister_blkdev();
err_ctxs:
	azswap_ctxs_exit();
err_core:
	az_core_exit();
	return ret;
}

static void __exit azswap_exit(void)
{
	/* No netlink request can find a device once this returns. */
	azswap_netlink_exit();
	while (azswap_nr_devs)
		azswap_dev_remove(&azswap_devs[--azswap_nr_devs]);
	kfree(azswap_devs);
	azswap_unregister_blkdev();
	azswap_ctxs_exit();
	/* After the stores: destroying one drains its deferred frees. */
	az_core_exit();
}

module_init(azswap_init);
module_exit(azswap_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("azswap: redundancy-aware compressed swap device");
