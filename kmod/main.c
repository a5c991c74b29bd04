// SPDX-License-Identifier: GPL-2.0
/* Placeholder until the block device glue lands. */
#include <linux/module.h>

static int __init azswap_init(void)
{
	return 0;
}

static void __exit azswap_exit(void)
{
}

module_init(azswap_init);
module_exit(azswap_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("azswap: redundancy-aware compressed swap device");
