// SPDX-License-Identifier: GPL-2.0
/*
 * azswap: redundancy-aware compressed swap device.
 *
 * Module parameters, init/exit and the per-CPU store contexts.  A reader
 * following one page goes on to device.c (block glue), then core/store.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/cpuhotplug.h>
#include <linux/percpu.h>
#include <linux/slab.h>

#include "azswap.h"

static unsigned int num_devices = 1;
module_param(num_devices, uint, 0444);
MODULE_PARM_DESC(num_devices, "Number of /dev/azswapN devices (1.."
		 __stringify(AZSWAP_MAX_DEVICES) ", default 1)");

static bool selftest;
module_param(selftest, bool, 0444);
MODULE_PARM_DESC(selftest, "Run the store core self-test at load (default 0)");

struct azswap_dev *azswap_devs;
unsigned int azswap_nr_devs;

/*
 * Per-CPU store contexts (codec workspaces and page buffers, ~0.5 MiB
 * each), zswap-6.1 style: the caller picks the current CPU's context with
 * raw_cpu_ptr() and takes its mutex, so it may sleep (and migrate) while
 * storing; the mutex, not the CPU, gives exclusive use.  A CPU's context
 * is created in the cpuhp prepare step and destroyed when the CPU is dead,
 * under the same mutex, so a task that picked a context just before its
 * CPU went away finds ctx == NULL and picks again.
 *
 * Lock order: pcpu->lock is taken in the swap write path (reclaim) and
 * held across az_store_put, whose allocations are GFP_NOWAIT then
 * GFP_NOIO: reclaim entered from there never writes to swap, so it never
 * comes back here for a second context.
 */
struct azswap_pcpu {
	struct mutex lock;
	struct az_ctx *ctx;
};

static struct azswap_ctxs {
	struct hlist_node node;
	struct azswap_pcpu __percpu *pcpu;
} azswap_ctxs;

static enum cpuhp_state azswap_cpuhp;

static int azswap_cpu_prepare(unsigned int cpu, struct hlist_node *node)
{
	struct azswap_ctxs *c = hlist_entry(node, struct azswap_ctxs, node);
	struct azswap_pcpu *pc = per_cpu_ptr(c->pcpu, cpu);
	struct az_ctx *ctx;

	if (READ_ONCE(pc->ctx))
		return 0;
	ctx = az_ctx_create();
	if (!ctx)
		return -ENOMEM;
	mutex_lock(&pc->lock);
	pc->ctx = ctx;
	mutex_unlock(&pc->lock);
	return 0;
}

static int azswap_cpu_dead(unsigned int cpu, struct hlist_node *node)
{
	struct azswap_ctxs *c = hlist_entry(node, struct azswap_ctxs, node);
	struct azswap_pcpu *pc = per_cpu_ptr(c->pcpu, cpu);
	struct az_ctx *ctx;

	mutex_lock(&pc->lock);
	ctx = pc->ctx;
	pc->ctx = NULL;
	mutex_unlock(&pc->lock);
	az_ctx_destroy(ctx);
	return 0;
}

/* Process context; may sleep.  Returns with the context's mutex held. */
struct azswap_pcpu *azswap_ctx_get(void)
{
	struct azswap_pcpu *pc;

	for (;;) {
		pc = raw_cpu_ptr(azswap_ctxs.pcpu);
		mutex_lock(&pc->lock);
		if (likely(pc->ctx))
			return pc;
		/* That CPU went offline after we picked it. */
		mutex_unlock(&pc->lock);
		cond_resched();
	}
}

void azswap_ctx_put(struct azswap_pcpu *pc)
{
	mutex_unlock(&pc->lock);
}

struct az_ctx *azswap_ctx(struct azswap_pcpu *pc)
{
	return pc->ctx;
}

static int azswap_ctxs_init(void)
{
	unsigned int cpu;
	int ret;

	azswap_ctxs.pcpu = alloc_percpu(struct azswap_pcpu);
	if (!azswap_ctxs.pcpu)
		return -ENOMEM;
	for_each_possible_cpu(cpu)
		mutex_init(&per_cpu_ptr(azswap_ctxs.pcpu, cpu)->lock);

	ret = cpuhp_setup_state_multi(CPUHP_BP_PREPARE_DYN, "block/azswap:prepare",
				      azswap_cpu_prepare, azswap_cpu_dead);
	if (ret < 0)
		goto err_free;
	azswap_cpuhp = ret;
	ret = cpuhp_state_add_instance(azswap_cpuhp, &azswap_ctxs.node);
	if (ret)
		goto err_state;
	return 0;

err_state:
	cpuhp_remove_multi_state(azswap_cpuhp);
err_free:
	free_percpu(azswap_ctxs.pcpu);
	return ret;
}

static void azswap_ctxs_exit(void)
{
	/* Runs the dead callback for every CPU that has a context. */
	cpuhp_state_remove_instance(azswap_cpuhp, &azswap_ctxs.node);
	cpuhp_remove_multi_state(azswap_cpuhp);
	free_percpu(azswap_ctxs.pcpu);
}

static int __init azswap_init(void)
{
	unsigned int i;
	int ret;

	if (!num_devices || num_devices > AZSWAP_MAX_DEVICES) {
		pr_err("num_devices must be 1..%d\n", AZSWAP_MAX_DEVICES);
		return -EINVAL;
	}
	if (selftest) {
		ret = az_core_selftest();
		if (ret) {
			pr_err("store core self-test failed: %d\n", ret);
			return ret;
		}
		pr_info("store core self-test passed\n");
	}

	ret = azswap_ctxs_init();
	if (ret)
		return ret;
	ret = azswap_register_blkdev();
	if (ret)
		goto err_ctxs;
	azswap_devs = kcalloc(num_devices, sizeof(*azswap_devs), GFP_KERNEL);
	if (!azswap_devs) {
		ret = -ENOMEM;
		goto err_blkdev;
	}
	for (i = 0; i < num_devices; i++) {
		ret = azswap_dev_add(&azswap_devs[i], i);
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
}

module_init(azswap_init);
module_exit(azswap_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("azswap: redundancy-aware compressed swap device");
