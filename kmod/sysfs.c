// SPDX-License-Identifier: GPL-2.0
/*
 * /sys/block/azswapN/ attributes.  Every attribute, its units and its
 * errors are documented in docs/sysfs-abi.md; keep the two in step.
 *
 * Writes parse strictly (empty, non-numeric, negative, trailing junk or
 * overflowing values: -EINVAL) and change nothing unless they succeed.
 * Each handler runs under dev->init_lock: read to use the store, write to
 * create, reconfigure or destroy it.  A front end: device state and
 * policy belong to device.c, the policy's ranges to the core
 * (az_policy_check).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/device.h>
#include <linux/blkdev.h>
#include <linux/kstrtox.h>
#include <linux/mm.h>
#include <linux/string.h>

#include "azswap.h"

static inline struct azswap_dev *dev_to_az(struct device *d)
{
	return dev_to_disk(d)->private_data;
}

/* Copy @buf without one trailing newline into @tmp; -EINVAL if empty/long. */
static int azswap_strip(const char *buf, char *tmp, size_t size)
{
	size_t len = strlen(buf);

	if (len && buf[len - 1] == '\n')
		len--;
	if (!len || len >= size)
		return -EINVAL;
	memcpy(tmp, buf, len);
	tmp[len] = '\0';
	return 0;
}

/*
 * A byte count: decimal digits with an optional K, M, G or T suffix
 * (powers of 1024), an optional trailing newline.  Anything else,
 * including an overflowing value, is -EINVAL.
 */
static int azswap_parse_size(const char *buf, u64 *out)
{
	unsigned int shift = 0;
	char tmp[32];
	size_t len;
	u64 v;

	if (azswap_strip(buf, tmp, sizeof(tmp)))
		return -EINVAL;
	len = strlen(tmp);
	switch (tmp[len - 1]) {
	case 'k': case 'K':
		shift = 10;
		break;
	case 'm': case 'M':
		shift = 20;
		break;
	case 'g': case 'G':
		shift = 30;
		break;
	case 't': case 'T':
		shift = 40;
		break;
	}
	if (shift) {
		tmp[--len] = '\0';
		if (!len)
			return -EINVAL;
	}
	if (tmp[0] < '0' || tmp[0] > '9')	/* no sign, no space */
		return -EINVAL;
	if (kstrtoull(tmp, 10, &v) || v > (U64_MAX >> shift))
		return -EINVAL;
	*out = v << shift;
	return 0;
}

static int azswap_parse_uint(const char *buf, unsigned int max,
			     unsigned int *out)
{
	char tmp[16];
	unsigned int v;

	if (azswap_strip(buf, tmp, sizeof(tmp)) ||
	    tmp[0] < '0' || tmp[0] > '9' ||
	    kstrtouint(tmp, 10, &v) || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

/* ---- disksize, initstate, reset --------------------------------------- */

/*
 * The slot table and indexes grow with use up to ~35 bytes per 4 KiB
 * slot: refuse a disksize above 16x RAM (metadata could pass ~14% of RAM
 * on a full device) with -EINVAL.
 */
static u64 azswap_max_disksize(void)
{
	return (u64)totalram_pages() << (PAGE_SHIFT + 4);
}

static ssize_t disksize_show(struct device *d, struct device_attribute *attr,
			     char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);
	u64 v;

	down_read(&dev->init_lock);
	v = dev->disksize;
	up_read(&dev->init_lock);
	return sysfs_emit(buf, "%llu\n", v);
}

static ssize_t disksize_store(struct device *d, struct device_attribute *attr,
			      const char *buf, size_t len)
{
	struct azswap_dev *dev = dev_to_az(d);
	u64 size;
	int ret;

	if (azswap_parse_size(buf, &size) || !size ||
	    size > azswap_max_disksize())
		return -EINVAL;
	size = PAGE_ALIGN(size);

	down_write(&dev->init_lock);
	if (dev->store) {
		ret = -EBUSY;
		goto out;
	}
	ret = azswap_dev_init_store(dev, size);
out:
	up_write(&dev->init_lock);
	return ret ? ret : len;
}
static DEVICE_ATTR_RW(disksize);

static ssize_t initstate_show(struct device *d, struct device_attribute *attr,
			      char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);
	bool init;

	down_read(&dev->init_lock);
	init = dev->store;
	up_read(&dev->init_lock);
	return sysfs_emit(buf, "%d\n", init);
}
static DEVICE_ATTR_RO(initstate);

static ssize_t reset_store(struct device *d, struct device_attribute *attr,
			   const char *buf, size_t len)
{
	unsigned int v;
	int ret;

	if (azswap_parse_uint(buf, 1, &v) || !v)
		return -EINVAL;
	ret = azswap_dev_reset(dev_to_az(d));
	return ret ? ret : len;
}
static DEVICE_ATTR_WO(reset);

/* ---- policy ----------------------------------------------------------- */

static bool azswap_store_in_use(struct az_store *store)
{
	struct az_stats st;

	az_store_get_stats(store, &st);
	return st.pages_stored || st.objects;
}

static ssize_t comp_algorithm_show(struct device *d,
				   struct device_attribute *attr, char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);
	struct az_policy p;

	down_read(&dev->init_lock);
	p = dev->pol;
	up_read(&dev->init_lock);
	if (p.codec == AZ_CODEC_ZSTD)
		return sysfs_emit(buf, "zstd:%u\n", p.level);
	return sysfs_emit(buf, "lz4\n");
}

static ssize_t comp_algorithm_store(struct device *d,
				    struct device_attribute *attr,
				    const char *buf, size_t len)
{
	struct azswap_dev *dev = dev_to_az(d);
	struct az_policy p;
	unsigned int codec, level = 3;
	char tmp[16];
	int ret;

	if (azswap_strip(buf, tmp, sizeof(tmp)))
		return -EINVAL;
	if (!strcmp(tmp, "lz4")) {
		codec = AZ_CODEC_LZ4;
	} else if (!strcmp(tmp, "zstd")) {
		codec = AZ_CODEC_ZSTD;
	} else if (!strncmp(tmp, "zstd:", 5)) {
		/* The level's range: az_policy_check, via set_policy. */
		codec = AZ_CODEC_ZSTD;
		if (tmp[5] < '0' || tmp[5] > '9' ||
		    kstrtouint(tmp + 5, 10, &level))
			return -EINVAL;
	} else {
		return -EINVAL;
	}

	down_write(&dev->init_lock);
	p = dev->pol;
	p.codec = codec;
	p.level = level;
	/*
	 * zram's rule for this file: no algorithm change while pages are
	 * stored.  The store could mix codecs (netlink POLICY_SET does, for
	 * the control plane's fast/dense modes); sysfs keeps zram's ABI.
	 */
	if (dev->store && (codec != dev->pol.codec ||
			   (codec == AZ_CODEC_ZSTD && level != dev->pol.level)) &&
	    azswap_store_in_use(dev->store))
		ret = -EBUSY;
	else
		ret = azswap_dev_set_policy(dev, &p);
	up_write(&dev->init_lock);
	return ret ? ret : len;
}
static DEVICE_ATTR_RW(comp_algorithm);

/*
 * One small show/store pair per numeric policy field; the value's range is
 * the core's (az_policy_check, via azswap_dev_set_policy).
 */
#define AZSWAP_POLICY_ATTR(field)					\
static ssize_t field##_show(struct device *d,				\
			    struct device_attribute *attr, char *buf)	\
{									\
	struct azswap_dev *dev = dev_to_az(d);				\
	unsigned int v;							\
									\
	down_read(&dev->init_lock);					\
	v = dev->pol.field;						\
	up_read(&dev->init_lock);					\
	return sysfs_emit(buf, "%u\n", v);				\
}									\
static ssize_t field##_store(struct device *d,				\
			     struct device_attribute *attr,		\
			     const char *buf, size_t len)		\
{									\
	struct azswap_dev *dev = dev_to_az(d);				\
	struct az_policy p;						\
	unsigned int v;							\
	int ret;							\
									\
	if (azswap_parse_uint(buf, UINT_MAX, &v))			\
		return -EINVAL;						\
	down_write(&dev->init_lock);					\
	p = dev->pol;							\
	p.field = v;							\
	ret = azswap_dev_set_policy(dev, &p);				\
	up_write(&dev->init_lock);					\
	return ret ? ret : len;						\
}									\
static DEVICE_ATTR_RW(field)

AZSWAP_POLICY_ATTR(dedup);
AZSWAP_POLICY_ATTR(tdelta);
AZSWAP_POLICY_ATTR(xdelta);
AZSWAP_POLICY_ATTR(verify);
AZSWAP_POLICY_ATTR(shuffle);
AZSWAP_POLICY_ATTR(sim_effort);
AZSWAP_POLICY_ATTR(delta_max_pct);

/* ---- memory ----------------------------------------------------------- */

static ssize_t mem_limit_show(struct device *d, struct device_attribute *attr,
			      char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);
	u64 v;

	down_read(&dev->init_lock);
	v = dev->mem_limit;
	up_read(&dev->init_lock);
	return sysfs_emit(buf, "%llu\n", v);
}

static ssize_t mem_limit_store(struct device *d, struct device_attribute *attr,
			       const char *buf, size_t len)
{
	struct azswap_dev *dev = dev_to_az(d);
	u64 v;

	if (azswap_parse_size(buf, &v))
		return -EINVAL;
	down_write(&dev->init_lock);
	dev->mem_limit = v;
	if (dev->store)
		az_store_set_mem_limit(dev->store, v);
	up_write(&dev->init_lock);
	return len;
}
static DEVICE_ATTR_RW(mem_limit);

static ssize_t mem_used_max_show(struct device *d,
				 struct device_attribute *attr, char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);

	return sysfs_emit(buf, "%lld\n", atomic64_read(&dev->mem_used_max));
}

/* Only "0": restart the high-water mark from the current pool size. */
static ssize_t mem_used_max_store(struct device *d,
				  struct device_attribute *attr,
				  const char *buf, size_t len)
{
	struct azswap_dev *dev = dev_to_az(d);
	unsigned int v;

	if (azswap_parse_uint(buf, 0, &v))
		return -EINVAL;
	down_read(&dev->init_lock);
	atomic64_set(&dev->mem_used_max, 0);
	if (dev->store)
		azswap_dev_update_max(dev);
	up_read(&dev->init_lock);
	return len;
}
static DEVICE_ATTR_RW(mem_used_max);

static ssize_t base_cache_show(struct device *d, struct device_attribute *attr,
			       char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);
	u32 v;

	down_read(&dev->init_lock);
	v = dev->store ? az_store_get_base_cache(dev->store) : dev->base_cache;
	up_read(&dev->init_lock);
	return sysfs_emit(buf, "%u\n", v);
}

/* Entries of the decoded-base cache (bcache.c); resizes live, may allocate. */
static ssize_t base_cache_store(struct device *d, struct device_attribute *attr,
				const char *buf, size_t len)
{
	struct azswap_dev *dev = dev_to_az(d);
	unsigned int v;
	int ret = 0;

	if (azswap_parse_uint(buf, AZ_BC_MAX_PAGES, &v))
		return -EINVAL;
	down_write(&dev->init_lock);
	if (dev->store)
		ret = az_store_set_base_cache(dev->store, v);
	if (!ret)
		dev->base_cache = v;
	up_write(&dev->init_lock);
	return ret ? ret : len;
}
static DEVICE_ATTR_RW(base_cache);

static ssize_t sim_slots_show(struct device *d, struct device_attribute *attr,
			      char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);
	u32 v;

	down_read(&dev->init_lock);
	v = dev->store ? az_store_get_sim_slots(dev->store) : dev->sim_slots;
	up_read(&dev->init_lock);
	return sysfs_emit(buf, "%u\n", v);
}

/*
 * Swap slots per similarity index entry (a power of two up to
 * AZ_SIM_SLOTS_MAX): fixed once the first owner registered (-EBUSY).
 */
static ssize_t sim_slots_store(struct device *d, struct device_attribute *attr,
			       const char *buf, size_t len)
{
	struct azswap_dev *dev = dev_to_az(d);
	unsigned int v;
	int ret = 0;

	if (azswap_parse_uint(buf, AZ_SIM_SLOTS_MAX, &v) ||
	    !az_sim_slots_valid(v))
		return -EINVAL;
	down_write(&dev->init_lock);
	if (dev->store)
		ret = az_store_set_sim_slots(dev->store, v);
	if (!ret)
		dev->sim_slots = v;
	up_write(&dev->init_lock);
	return ret ? ret : len;
}
static DEVICE_ATTR_RW(sim_slots);

static ssize_t sim_sample_show(struct device *d, struct device_attribute *attr,
			       char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);
	u32 v;

	down_read(&dev->init_lock);
	v = dev->store ? az_store_get_sim_sample(dev->store) : dev->sim_sample;
	up_read(&dev->init_lock);
	return sysfs_emit(buf, "%u\n", v);
}

/*
 * 1 in this many objects of a sparse trust group gets similarity entries
 * (a power of two up to AZ_SIM_SAMPLE_MAX; 1: never sparse).  Any time:
 * the entries follow in the background.
 */
static ssize_t sim_sample_store(struct device *d,
				struct device_attribute *attr,
				const char *buf, size_t len)
{
	struct azswap_dev *dev = dev_to_az(d);
	unsigned int v;
	int ret = 0;

	if (azswap_parse_uint(buf, AZ_SIM_SAMPLE_MAX, &v) ||
	    !az_sim_sample_valid(v))
		return -EINVAL;
	down_write(&dev->init_lock);
	if (dev->store)
		ret = az_store_set_sim_sample(dev->store, v);
	if (!ret)
		dev->sim_sample = v;
	up_write(&dev->init_lock);
	return ret ? ret : len;
}
static DEVICE_ATTR_RW(sim_sample);

/* "1": compact the pool now (it also compacts itself after frees). */
static ssize_t compact_store(struct device *d, struct device_attribute *attr,
			     const char *buf, size_t len)
{
	struct azswap_dev *dev = dev_to_az(d);
	unsigned int v;
	int ret = 0;

	if (azswap_parse_uint(buf, 1, &v) || !v)
		return -EINVAL;
	down_read(&dev->init_lock);
	if (dev->store)
		az_store_compact(dev->store);
	else
		ret = -EINVAL;
	up_read(&dev->init_lock);
	return ret ? ret : len;
}
static DEVICE_ATTR_WO(compact);

/*
 * "1": pack the device now (az_store_pack: nearby PLAIN pages of one
 * sandbox into multi-page objects).  Takes a while on a large device
 * (init_lock is held for reading throughout, as for compact: a reset
 * waits); a fatal signal stops it (EINTR).
 */
static ssize_t pack_store(struct device *d, struct device_attribute *attr,
			  const char *buf, size_t len)
{
	struct azswap_dev *dev = dev_to_az(d);
	unsigned int v;
	u64 packed;
	int ret;

	if (azswap_parse_uint(buf, 1, &v) || !v)
		return -EINVAL;
	down_read(&dev->init_lock);
	ret = dev->store ? azswap_dev_pack(dev, &packed) : -EINVAL;
	up_read(&dev->init_lock);
	return ret ? ret : len;
}
static DEVICE_ATTR_WO(pack);

/* ---- statistics (columns: docs/sysfs-abi.md) -------------------------- */

static void azswap_stats(struct azswap_dev *dev, struct az_stats *st)
{
	if (dev->store)
		az_store_get_stats(dev->store, st);
	else
		memset(st, 0, sizeof(*st));
}

/* The store's figures for a stat file that needs nothing else of @dev. */
static void azswap_read_stats(struct device *d, struct az_stats *st)
{
	struct azswap_dev *dev = dev_to_az(d);

	down_read(&dev->init_lock);
	azswap_stats(dev, st);
	up_read(&dev->init_lock);
}

static ssize_t mm_stat_show(struct device *d, struct device_attribute *attr,
			    char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);
	struct az_stats st;
	ssize_t ret;

	down_read(&dev->init_lock);
	azswap_stats(dev, &st);
	ret = sysfs_emit(buf,
			 "%8llu %8llu %8llu %8llu %8lld %8llu %8llu %8llu %8llu %8llu %8llu\n",
			 st.orig_bytes, st.stored_bytes, st.pool_bytes,
			 dev->mem_limit,
			 (s64)atomic64_read(&dev->mem_used_max),
			 st.kind_pages[AZ_KIND_SAME], st.kind_pages[AZ_KIND_RAW],
			 st.meta_bytes, st.index_bytes, st.template_bytes,
			 st.compacted_bytes);
	up_read(&dev->init_lock);
	return ret;
}
static DEVICE_ATTR_RO(mm_stat);

static ssize_t io_stat_show(struct device *d, struct device_attribute *attr,
			    char *buf)
{
	struct azswap_dev *dev = dev_to_az(d);
	struct az_stats st;
	ssize_t ret;

	down_read(&dev->init_lock);
	azswap_stats(dev, &st);
	ret = sysfs_emit(buf,
			 "%8llu %8llu %8lld %8lld %8llu %8llu %8llu %8lld %8lld\n",
			 st.failed_stores, st.failed_loads,
			 (s64)atomic64_read(&dev->invalid_io),
			 (s64)atomic64_read(&dev->notify_free),
			 st.stores, st.loads, st.frees,
			 (s64)atomic64_read(&dev->partial_io),
			 (s64)atomic64_read(&dev->miss_free));
	up_read(&dev->init_lock);
	return ret;
}
static DEVICE_ATTR_RO(io_stat);

static ssize_t kind_stat_show(struct device *d, struct device_attribute *attr,
			      char *buf)
{
	struct az_stats st;

	azswap_read_stats(d, &st);
	return sysfs_emit(buf, "%8llu %8llu %8llu %8llu %8llu %8llu\n",
			  st.kind_pages[AZ_KIND_SAME], st.kind_pages[AZ_KIND_DUP],
			  st.kind_pages[AZ_KIND_TDELTA],
			  st.kind_pages[AZ_KIND_XDELTA],
			  st.kind_pages[AZ_KIND_PLAIN],
			  st.kind_pages[AZ_KIND_RAW]);
}
static DEVICE_ATTR_RO(kind_stat);

static ssize_t obj_stat_show(struct device *d, struct device_attribute *attr,
			     char *buf)
{
	struct az_stats st;

	azswap_read_stats(d, &st);
	return sysfs_emit(buf,
			  "%8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu %8llu\n",
			  st.pages_stored, st.objects, st.bases,
			  st.template_pages, st.deferred, st.cross_group,
			  st.base_cache_pages, st.base_cache_hits,
			  st.base_cache_misses, st.template_lost, st.packs,
			  st.packed_pages, st.sim_sparse, st.sim_waiting,
			  st.sim_switches, st.sim_direct, st.direct_pages);
}
static DEVICE_ATTR_RO(obj_stat);

static ssize_t meta_stat_show(struct device *d, struct device_attribute *attr,
			      char *buf)
{
	struct az_stats st;

	azswap_read_stats(d, &st);
	return sysfs_emit(buf, "%8llu %8llu %8llu %8llu %8llu %8llu %8llu\n",
			  st.slot_bytes, st.slot_used_bytes, st.owner_bytes,
			  st.obj_meta_bytes, st.index_table_bytes,
			  st.tnode_bytes, st.base_cache_bytes);
}
static DEVICE_ATTR_RO(meta_stat);

static struct attribute *azswap_disk_attrs[] = {
	&dev_attr_disksize.attr,
	&dev_attr_initstate.attr,
	&dev_attr_reset.attr,
	&dev_attr_comp_algorithm.attr,
	&dev_attr_mem_limit.attr,
	&dev_attr_mem_used_max.attr,
	&dev_attr_base_cache.attr,
	&dev_attr_sim_slots.attr,
	&dev_attr_sim_sample.attr,
	&dev_attr_compact.attr,
	&dev_attr_pack.attr,
	&dev_attr_dedup.attr,
	&dev_attr_tdelta.attr,
	&dev_attr_xdelta.attr,
	&dev_attr_verify.attr,
	&dev_attr_sim_effort.attr,
	&dev_attr_delta_max_pct.attr,
	&dev_attr_shuffle.attr,
	&dev_attr_mm_stat.attr,
	&dev_attr_io_stat.attr,
	&dev_attr_kind_stat.attr,
	&dev_attr_obj_stat.attr,
	&dev_attr_meta_stat.attr,
	NULL,
};

static const struct attribute_group azswap_disk_group = {
	.attrs = azswap_disk_attrs,
};

const struct attribute_group *azswap_disk_groups[] = {
	&azswap_disk_group,
	NULL,
};
