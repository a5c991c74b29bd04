// SPDX-License-Identifier: GPL-2.0
/*
 * Generic netlink family "azswap": the control ABI of docs/netlink.md,
 * constants in uapi/azswap_nl.h.  Each command maps onto the store core's
 * registry and policy calls (core/azcore.h).
 *
 * resv_start_op = 0: every command is validated strictly against
 * azswap_nl_policy (unknown attributes, wrong types and out-of-range
 * values are -EINVAL with an extended ack naming the attribute, before
 * any handler runs).  Handlers check what the policy cannot (required
 * attributes, CGROUP_ID vs CGROUP_PATH, device and owner existence) before
 * changing anything, so a request either applies fully or not at all
 * (TEMPLATE_LOAD batches excepted, see there).
 *
 * Locking: parallel_ops is off, so genetlink serialises all commands
 * (genl_mutex); genl_unregister_family() waits for them at unload.  A
 * handler holds the device's init_lock (read; write for POLICY_SET) so
 * that the store cannot be reset under it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/cgroup.h>
#include <linux/slab.h>
#include <linux/xarray.h>
#include <net/genetlink.h>

#include "azswap.h"
#include "compat.h"
#include "uapi/azswap_nl.h"

static struct genl_family azswap_genl;

/* ---- validation -------------------------------------------------------- */

/*
 * Types and lengths are checked by genetlink against this policy.  Value
 * ranges are checked by azswap_nl_check_ranges() instead of NLA_POLICY_*
 * ranges, which fail with -ERANGE: docs/netlink.md promises -EINVAL.
 */
static const struct nla_policy azswap_nl_policy[AZSWAP_A_MAX + 1] = {
	[AZSWAP_A_DEV] = { .type = NLA_U32 },
	[AZSWAP_A_CGROUP_ID] = { .type = NLA_U64 },
	[AZSWAP_A_CGROUP_PATH] = { .type = NLA_NUL_STRING, .len = PATH_MAX - 1 },
	[AZSWAP_A_GROUP] = { .type = NLA_U32 },
	[AZSWAP_A_INDEX] = { .type = NLA_U64 },
	/* Length checked by the handler: a policy maximum would be ERANGE. */
	[AZSWAP_A_PAGES] = { .type = NLA_BINARY },
	[AZSWAP_A_PHASE] = { .type = NLA_U8 },
	[AZSWAP_A_POLICY_CODEC] = { .type = NLA_U32 },
	[AZSWAP_A_POLICY_LEVEL] = { .type = NLA_U32 },
	[AZSWAP_A_POLICY_DEDUP] = { .type = NLA_U8 },
	[AZSWAP_A_POLICY_TDELTA] = { .type = NLA_U8 },
	[AZSWAP_A_POLICY_XDELTA] = { .type = NLA_U8 },
	[AZSWAP_A_POLICY_SIM_EFFORT] = { .type = NLA_U32 },
	[AZSWAP_A_POLICY_DELTA_MAX_PCT] = { .type = NLA_U32 },
	[AZSWAP_A_POLICY_SHUFFLE] = { .type = NLA_U8 },
	[AZSWAP_A_MAP_START] = { .type = NLA_U64 },
	[AZSWAP_A_MAP_PAGES] = { .type = NLA_U64 },
	/* Reply-only attributes stay NLA_UNSPEC: rejected in requests. */
};

/* Allowed values of the attributes that have a range (not the policy's). */
static const struct {
	int attr;
	u32 min, max;
} azswap_nl_ranges[] = {
	{ AZSWAP_A_GROUP, 1, S32_MAX },
	{ AZSWAP_A_PHASE, 0, AZSWAP_PHASE_MAX },
};

/* Policy attributes: their ranges are the core's (az_policy_range). */
static const struct {
	int attr;
	enum az_policy_field field;
} azswap_nl_policy_attrs[] = {
	{ AZSWAP_A_POLICY_CODEC, AZ_POL_CODEC },
	{ AZSWAP_A_POLICY_LEVEL, AZ_POL_LEVEL },
	{ AZSWAP_A_POLICY_DEDUP, AZ_POL_DEDUP },
	{ AZSWAP_A_POLICY_TDELTA, AZ_POL_TDELTA },
	{ AZSWAP_A_POLICY_XDELTA, AZ_POL_XDELTA },
	{ AZSWAP_A_POLICY_SIM_EFFORT, AZ_POL_SIM_EFFORT },
	{ AZSWAP_A_POLICY_DELTA_MAX_PCT, AZ_POL_DELTA_MAX_PCT },
	{ AZSWAP_A_POLICY_SHUFFLE, AZ_POL_SHUFFLE },
};

static int azswap_nl_check_range(struct nlattr *a, u32 min, u32 max,
				 struct netlink_ext_ack *extack)
{
	u32 v;

	if (!a)
		return 0;
	v = nla_len(a) == sizeof(u8) ? nla_get_u8(a) : nla_get_u32(a);
	if (v < min || v > max) {
		NL_SET_ERR_MSG_ATTR(extack, a, "value out of range");
		return -EINVAL;
	}
	return 0;
}

/*
 * Runs before every handler (pre_doit) and at the start of the dump:
 * every present attribute with a range is in it, or -EINVAL naming it.
 */
static int azswap_nl_check_ranges(struct nlattr **attrs,
				  struct netlink_ext_ack *extack)
{
	unsigned int i;
	u32 min, max;
	int ret;

	for (i = 0; i < ARRAY_SIZE(azswap_nl_ranges); i++) {
		ret = azswap_nl_check_range(attrs[azswap_nl_ranges[i].attr],
					    azswap_nl_ranges[i].min,
					    azswap_nl_ranges[i].max, extack);
		if (ret)
			return ret;
	}
	for (i = 0; i < ARRAY_SIZE(azswap_nl_policy_attrs); i++) {
		az_policy_range(azswap_nl_policy_attrs[i].field, &min, &max);
		ret = azswap_nl_check_range(attrs[azswap_nl_policy_attrs[i].attr],
					    min, max, extack);
		if (ret)
			return ret;
	}
	return 0;
}

static int azswap_nl_pre_doit(const struct azswap_genl_ops *ops,
			      struct sk_buff *skb, struct genl_info *info)
{
	return azswap_nl_check_ranges(info->attrs, info->extack);
}

/* ---- helpers ---------------------------------------------------------- */

/* A required attribute is absent: -EINVAL, its type and a message. */
static bool azswap_nl_missing(struct genl_info *info, int attr)
{
	if (info->attrs[attr])
		return false;
	NL_SET_ERR_ATTR_MISS(info->extack, NULL, attr);
	NL_SET_ERR_MSG(info->extack, "Missing required attribute");
	return true;
}

/* AZSWAP_A_DEV (default 0) -> device, or NULL with an extack. */
static struct azswap_dev *azswap_nl_dev(struct nlattr **attrs,
					struct netlink_ext_ack *extack)
{
	u32 id = attrs[AZSWAP_A_DEV] ? nla_get_u32(attrs[AZSWAP_A_DEV]) : 0;

	if (id >= azswap_nr_devs) {
		NL_SET_ERR_MSG_ATTR(extack, attrs[AZSWAP_A_DEV],
				    "no such azswap device");
		return NULL;
	}
	return &azswap_devs[id];
}

/*
 * The device's store, with init_lock held for reading; NULL (and the lock
 * dropped) when the device has no disksize yet.
 */
static struct az_store *azswap_nl_store(struct azswap_dev *dev,
					struct netlink_ext_ack *extack)
{
	down_read(&dev->init_lock);
	if (dev->store)
		return dev->store;
	up_read(&dev->init_lock);
	NL_SET_ERR_MSG(extack, "device not initialised: write its disksize first");
	return NULL;
}

u8 azswap_phase_of(struct azswap_dev *dev, u64 cgroup_id)
{
	void *v = xa_load(&dev->phases, (unsigned long)cgroup_id);

	return v ? xa_to_value(v) : AZSWAP_PHASE_UNKNOWN;
}

/* Events to the "events" group; nobody listening is not an error. */
static void azswap_nl_event(u8 cmd, struct azswap_dev *dev, u64 cgroup_id,
			    int attr, u32 value)
{
	struct sk_buff *skb;
	void *hdr;

	skb = genlmsg_new(NLMSG_GOODSIZE, GFP_KERNEL);
	if (!skb)
		return;
	hdr = genlmsg_put(skb, 0, 0, &azswap_genl, 0, cmd);
	if (!hdr)
		goto err;
	if (nla_put_u32(skb, AZSWAP_A_DEV, dev->id) ||
	    nla_put_u64_64bit(skb, AZSWAP_A_CGROUP_ID, cgroup_id,
			      AZSWAP_A_UNSPEC))
		goto err;
	if (attr == AZSWAP_A_PHASE ? nla_put_u8(skb, attr, value) :
				     nla_put_u32(skb, attr, value))
		goto err;
	genlmsg_end(skb, hdr);
	genlmsg_multicast(&azswap_genl, skb, 0, 0, GFP_KERNEL);
	return;
err:
	nlmsg_free(skb);
}

/* ---- GET_INFO --------------------------------------------------------- */

static int azswap_nl_get_info(struct sk_buff *skb, struct genl_info *info)
{
	struct sk_buff *msg;
	void *hdr;

	msg = genlmsg_new(NLMSG_GOODSIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &azswap_genl, 0,
				AZSWAP_CMD_GET_INFO);
	if (!hdr ||
	    nla_put_u32(msg, AZSWAP_A_VERSION, AZSWAP_GENL_VERSION) ||
	    nla_put_u32(msg, AZSWAP_A_NR_DEVICES, azswap_nr_devs) ||
	    nla_put_u8(msg, AZSWAP_A_COW_INDEX, AZSWAP_COW_INDEX)) {
		nlmsg_free(msg);
		return -EMSGSIZE;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);
}

/* ---- owners ----------------------------------------------------------- */

/*
 * The cgroup id a SANDBOX_ADD/TEMPLATE_ADD names: CGROUP_ID or CGROUP_PATH
 * (exactly one).  A live cgroup is required unless @synthetic_ok (a
 * template fed by TEMPLATE_LOAD may use an id that is not a cgroup).
 */
static int azswap_nl_cgroup(struct genl_info *info, bool synthetic_ok,
			    u64 *id)
{
	struct nlattr *aid = info->attrs[AZSWAP_A_CGROUP_ID];
	struct nlattr *apath = info->attrs[AZSWAP_A_CGROUP_PATH];
	struct cgroup *cgrp;

	if (!aid == !apath) {
		NL_SET_ERR_MSG(info->extack,
			       "give exactly one of CGROUP_ID and CGROUP_PATH");
		return -EINVAL;
	}
	if (apath) {
		cgrp = cgroup_get_from_path(nla_data(apath));
		if (IS_ERR(cgrp)) {
			NL_SET_ERR_MSG_ATTR(info->extack, apath,
					    "no such cgroup (path relative to the cgroup2 root)");
			return PTR_ERR(cgrp) == -ENOTDIR ? -ENOENT :
							   PTR_ERR(cgrp);
		}
		*id = cgroup_id(cgrp);
		cgroup_put(cgrp);
		return 0;
	}
	*id = nla_get_u64(aid);
	if (!*id) {
		NL_SET_ERR_MSG_ATTR(info->extack, aid, "cgroup id 0 is invalid");
		return -EINVAL;
	}
	if (synthetic_ok)
		return 0;
	cgrp = cgroup_get_from_id(*id);
	if (IS_ERR_OR_NULL(cgrp)) {
		NL_SET_ERR_MSG_ATTR(info->extack, aid, "no cgroup with this id");
		return -ENOENT;
	}
	cgroup_put(cgrp);
	return 0;
}

static int azswap_nl_owner_add(struct sk_buff *skb, struct genl_info *info)
{
	bool tmpl = info->genlhdr->cmd == AZSWAP_CMD_TEMPLATE_ADD;
	struct azswap_dev *dev;
	struct az_store *s;
	struct sk_buff *msg;
	void *hdr;
	u32 group;
	u64 id;
	int ret;

	if (azswap_nl_missing(info, AZSWAP_A_GROUP))
		return -EINVAL;
	dev = azswap_nl_dev(info->attrs, info->extack);
	if (!dev)
		return -ENODEV;
	group = nla_get_u32(info->attrs[AZSWAP_A_GROUP]);
	ret = azswap_nl_cgroup(info, tmpl, &id);
	if (ret)
		return ret;

	msg = genlmsg_new(NLMSG_GOODSIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &azswap_genl, 0,
				info->genlhdr->cmd);
	if (!hdr || nla_put_u64_64bit(msg, AZSWAP_A_CGROUP_ID, id,
				      AZSWAP_A_UNSPEC)) {
		nlmsg_free(msg);
		return -EMSGSIZE;
	}
	genlmsg_end(msg, hdr);

	s = azswap_nl_store(dev, info->extack);
	if (!s) {
		nlmsg_free(msg);
		return -ENODEV;
	}
	ret = tmpl ? az_store_add_template(s, id, group) :
		     az_store_add_sandbox(s, id, group);
	up_read(&dev->init_lock);
	switch (ret) {
	case 0:
		break;
	case -EEXIST:
		NL_SET_ERR_MSG(info->extack,
			       "cgroup already registered (as sandbox or template)");
		goto err;
	case -ENOSPC:
		NL_SET_ERR_MSG(info->extack, "owner table full (1023 owners)");
		goto err;
	default:
		goto err;
	}
	azswap_nl_event(info->genlhdr->cmd, dev, id, AZSWAP_A_GROUP, group);
	return genlmsg_reply(msg, info);
err:
	nlmsg_free(msg);
	return ret;
}

static int azswap_nl_owner_del(struct sk_buff *skb, struct genl_info *info)
{
	bool tmpl = info->genlhdr->cmd == AZSWAP_CMD_TEMPLATE_DEL;
	struct az_owner_stats os;
	struct azswap_dev *dev;
	struct az_store *s;
	u64 id;
	int ret;

	if (azswap_nl_missing(info, AZSWAP_A_CGROUP_ID))
		return -EINVAL;
	dev = azswap_nl_dev(info->attrs, info->extack);
	if (!dev)
		return -ENODEV;
	id = nla_get_u64(info->attrs[AZSWAP_A_CGROUP_ID]);
	if (!id) {
		NL_SET_ERR_MSG_ATTR(info->extack,
				    info->attrs[AZSWAP_A_CGROUP_ID],
				    "cgroup id 0 is invalid");
		return -EINVAL;
	}
	s = azswap_nl_store(dev, info->extack);
	if (!s)
		return -ENODEV;
	ret = az_store_owner_stats(s, id, &os);
	if (!ret && (!os.registered || !os.is_template != !tmpl))
		ret = -ENOENT;
	if (!ret)
		ret = tmpl ? az_store_del_template(s, id) :
			     az_store_del_sandbox(s, id);
	if (!ret)
		xa_erase(&dev->phases, (unsigned long)id);
	up_read(&dev->init_lock);
	if (ret == -ENOENT && tmpl)
		NL_SET_ERR_MSG_ATTR(info->extack,
				    info->attrs[AZSWAP_A_CGROUP_ID],
				    "no template with this id");
	else if (ret == -ENOENT)
		NL_SET_ERR_MSG_ATTR(info->extack,
				    info->attrs[AZSWAP_A_CGROUP_ID],
				    "no sandbox with this id");
	if (ret)
		return ret;
	azswap_nl_event(info->genlhdr->cmd, dev, id, AZSWAP_A_GROUP, os.group);
	return 0;
}

/*
 * Pages INDEX, INDEX+1, ... of a snapshot-file template.  Each page is one
 * az_store_template_load; a batch that fails part way (pool full) keeps
 * the pages before the failing one (each a complete, valid base) and says
 * so in the extack.
 */
static int azswap_nl_template_load(struct sk_buff *skb, struct genl_info *info)
{
	struct nlattr *ap = info->attrs[AZSWAP_A_PAGES];
	struct azswap_dev *dev;
	struct az_store *s;
	unsigned int i, n;
	u64 id, index;
	void *buf;
	int ret = 0;

	if (azswap_nl_missing(info, AZSWAP_A_CGROUP_ID) ||
	    azswap_nl_missing(info, AZSWAP_A_INDEX) ||
	    azswap_nl_missing(info, AZSWAP_A_PAGES))
		return -EINVAL;
	dev = azswap_nl_dev(info->attrs, info->extack);
	if (!dev)
		return -ENODEV;
	if (!nla_len(ap) || nla_len(ap) % AZSWAP_PAGE_SIZE ||
	    nla_len(ap) > AZSWAP_LOAD_MAX_PAGES * AZSWAP_PAGE_SIZE) {
		NL_SET_ERR_MSG_ATTR(info->extack, ap,
				    "PAGES must be 1..15 whole 4096-byte pages");
		return -EINVAL;
	}
	n = nla_len(ap) / AZSWAP_PAGE_SIZE;
	id = nla_get_u64(info->attrs[AZSWAP_A_CGROUP_ID]);
	index = nla_get_u64(info->attrs[AZSWAP_A_INDEX]);
	if (index + n < index) {
		NL_SET_ERR_MSG_ATTR(info->extack, info->attrs[AZSWAP_A_INDEX],
				    "page index overflows");
		return -EINVAL;
	}
	/* nla_data is only 4-byte aligned: the core reads 8-byte words. */
	buf = kmalloc(AZSWAP_PAGE_SIZE, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	s = azswap_nl_store(dev, info->extack);
	if (!s) {
		kfree(buf);
		return -ENODEV;
	}
	for (i = 0; i < n && !ret; i++) {
		memcpy(buf, nla_data(ap) + i * AZSWAP_PAGE_SIZE,
		       AZSWAP_PAGE_SIZE);
		ret = azswap_dev_template_load(dev, id, index + i, buf);
	}
	up_read(&dev->init_lock);
	kfree(buf);
	if (ret == -ENOENT)
		NL_SET_ERR_MSG_ATTR(info->extack,
				    info->attrs[AZSWAP_A_CGROUP_ID],
				    "no template with this id");
	else if (ret == -ENOMEM && i > 1)
		NL_SET_ERR_MSG(info->extack,
			       "pool full: the pages before the failing one were loaded");
	else if (ret == -ENOMEM)
		NL_SET_ERR_MSG(info->extack, "pool full (mem_limit or no memory)");
	return ret;
}

/* ---- STATS_GET -------------------------------------------------------- */

static int azswap_nl_put_owner(struct sk_buff *msg, struct azswap_dev *dev,
			       const struct az_owner_stats *os)
{
	static const int kind_attr[AZ_NR_KINDS] = {
		[AZ_KIND_SAME] = AZSWAP_A_ST_SAME,
		[AZ_KIND_DUP] = AZSWAP_A_ST_DUP,
		[AZ_KIND_TDELTA] = AZSWAP_A_ST_TDELTA,
		[AZ_KIND_XDELTA] = AZSWAP_A_ST_XDELTA,
		[AZ_KIND_PLAIN] = AZSWAP_A_ST_PLAIN,
		[AZ_KIND_RAW] = AZSWAP_A_ST_RAW,
	};
	unsigned int k;

	if (nla_put_u32(msg, AZSWAP_A_DEV, dev->id) ||
	    nla_put_u64_64bit(msg, AZSWAP_A_CGROUP_ID, os->cgroup_id,
			      AZSWAP_A_UNSPEC) ||
	    nla_put_u32(msg, AZSWAP_A_GROUP, os->group) ||
	    nla_put_u8(msg, AZSWAP_A_IS_TEMPLATE, !!os->is_template) ||
	    nla_put_u64_64bit(msg, AZSWAP_A_ST_PAGES, os->pages,
			      AZSWAP_A_UNSPEC) ||
	    nla_put_u64_64bit(msg, AZSWAP_A_ST_ORIG_BYTES, os->orig_bytes,
			      AZSWAP_A_UNSPEC) ||
	    nla_put_u64_64bit(msg, AZSWAP_A_ST_EXCLUSIVE_BYTES,
			      os->exclusive_bytes, AZSWAP_A_UNSPEC) ||
	    nla_put_u64_64bit(msg, AZSWAP_A_ST_SHARED_BYTES,
			      os->shared_bytes, AZSWAP_A_UNSPEC) ||
	    nla_put_u8(msg, AZSWAP_A_ST_PHASE,
		       azswap_phase_of(dev, os->cgroup_id)) ||
	    nla_put_u8(msg, AZSWAP_A_ST_REGISTERED, !!os->registered))
		return -EMSGSIZE;
	for (k = 0; k < AZ_NR_KINDS; k++)
		if (nla_put_u64_64bit(msg, kind_attr[k], os->kind_pages[k],
				      AZSWAP_A_UNSPEC))
			return -EMSGSIZE;
	return 0;
}

static int azswap_nl_stats_doit(struct sk_buff *skb, struct genl_info *info)
{
	struct az_owner_stats os;
	struct azswap_dev *dev;
	struct az_store *s;
	struct sk_buff *msg;
	void *hdr;
	int ret;

	if (azswap_nl_missing(info, AZSWAP_A_CGROUP_ID))
		return -EINVAL;
	dev = azswap_nl_dev(info->attrs, info->extack);
	if (!dev)
		return -ENODEV;
	s = azswap_nl_store(dev, info->extack);
	if (!s)
		return -ENODEV;
	ret = az_store_owner_stats(s, nla_get_u64(info->attrs[AZSWAP_A_CGROUP_ID]),
				   &os);
	up_read(&dev->init_lock);
	if (ret) {
		NL_SET_ERR_MSG_ATTR(info->extack,
				    info->attrs[AZSWAP_A_CGROUP_ID],
				    "no owner with this id");
		return ret;
	}
	msg = genlmsg_new(NLMSG_GOODSIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &azswap_genl, 0,
				AZSWAP_CMD_STATS_GET);
	if (!hdr || azswap_nl_put_owner(msg, dev, &os)) {
		nlmsg_free(msg);
		return -EMSGSIZE;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);
}

#define AZSWAP_DUMP_BATCH 16

/*
 * cb->args[0]: the owner table index to resume at (entries, not positions:
 * owners added or removed between batches never make others be skipped or
 * repeated).  cb->seq is the registry generation (made odd, so never 0):
 * a batch after an add or del carries NLM_F_DUMP_INTR, and so does the
 * final NLMSG_DONE.
 */
static int azswap_nl_stats_dumpit(struct sk_buff *skb,
				  struct netlink_callback *cb)
{
	struct nlattr **attrs = azswap_dump_attrs(cb);
	struct az_owner_stats *os;
	struct azswap_dev *dev;
	struct az_store *s;
	int i, n, ret = 0;
	void *hdr;
	u32 gen;

	ret = azswap_nl_check_ranges(attrs, cb->extack);
	if (ret)
		return ret;
	dev = azswap_nl_dev(attrs, cb->extack);
	if (!dev)
		return -ENODEV;
	os = kmalloc_array(AZSWAP_DUMP_BATCH, sizeof(*os), GFP_KERNEL);
	if (!os)
		return -ENOMEM;
	s = azswap_nl_store(dev, cb->extack);
	if (!s) {
		kfree(os);
		return -ENODEV;
	}
	n = az_store_list_owners(s, cb->args[0], os, AZSWAP_DUMP_BATCH, &gen);
	cb->seq = gen * 2 + 1;
	for (i = 0; i < n; i++) {
		hdr = genlmsg_put(skb, NETLINK_CB(cb->skb).portid,
				  cb->nlh->nlmsg_seq, &azswap_genl,
				  NLM_F_MULTI, AZSWAP_CMD_STATS_GET);
		if (!hdr)
			break;
		genl_dump_check_consistent(cb, hdr);
		if (azswap_nl_put_owner(skb, dev, &os[i])) {
			genlmsg_cancel(skb, hdr);
			break;
		}
		genlmsg_end(skb, hdr);
		cb->args[0] = os[i].entry + 1;
	}
	up_read(&dev->init_lock);
	kfree(os);
	/* Nothing fitted into an empty skb: cannot make progress. */
	if (n && !i && !skb->len)
		ret = -EMSGSIZE;
	return ret ? ret : skb->len;
}

/* ---- policy ----------------------------------------------------------- */

static int azswap_nl_policy_get(struct sk_buff *skb, struct genl_info *info)
{
	struct azswap_dev *dev;
	struct az_policy p;
	struct sk_buff *msg;
	void *hdr;

	dev = azswap_nl_dev(info->attrs, info->extack);
	if (!dev)
		return -ENODEV;
	down_read(&dev->init_lock);
	p = dev->pol;
	up_read(&dev->init_lock);

	msg = genlmsg_new(NLMSG_GOODSIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &azswap_genl, 0,
				AZSWAP_CMD_POLICY_GET);
	if (!hdr ||
	    nla_put_u32(msg, AZSWAP_A_DEV, dev->id) ||
	    nla_put_u32(msg, AZSWAP_A_POLICY_CODEC, p.codec) ||
	    nla_put_u32(msg, AZSWAP_A_POLICY_LEVEL, p.level) ||
	    nla_put_u8(msg, AZSWAP_A_POLICY_DEDUP, p.dedup) ||
	    nla_put_u8(msg, AZSWAP_A_POLICY_TDELTA, p.tdelta) ||
	    nla_put_u8(msg, AZSWAP_A_POLICY_XDELTA, p.xdelta) ||
	    nla_put_u32(msg, AZSWAP_A_POLICY_SIM_EFFORT, p.sim_effort) ||
	    nla_put_u32(msg, AZSWAP_A_POLICY_DELTA_MAX_PCT, p.delta_max_pct) ||
	    nla_put_u8(msg, AZSWAP_A_POLICY_SHUFFLE, p.shuffle)) {
		nlmsg_free(msg);
		return -EMSGSIZE;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);
}

/* All given fields are range-checked by the policy; apply them at once. */
static int azswap_nl_policy_set(struct sk_buff *skb, struct genl_info *info)
{
	struct nlattr **a = info->attrs;
	struct azswap_dev *dev;
	struct az_policy p;
	int ret;

	dev = azswap_nl_dev(a, info->extack);
	if (!dev)
		return -ENODEV;
	down_write(&dev->init_lock);
	p = dev->pol;
	if (a[AZSWAP_A_POLICY_CODEC])
		p.codec = nla_get_u32(a[AZSWAP_A_POLICY_CODEC]);
	if (a[AZSWAP_A_POLICY_LEVEL])
		p.level = nla_get_u32(a[AZSWAP_A_POLICY_LEVEL]);
	else if (a[AZSWAP_A_POLICY_CODEC] && p.codec == AZ_CODEC_ZSTD &&
		 !p.level)
		p.level = 3;
	if (a[AZSWAP_A_POLICY_DEDUP])
		p.dedup = nla_get_u8(a[AZSWAP_A_POLICY_DEDUP]);
	if (a[AZSWAP_A_POLICY_TDELTA])
		p.tdelta = nla_get_u8(a[AZSWAP_A_POLICY_TDELTA]);
	if (a[AZSWAP_A_POLICY_XDELTA])
		p.xdelta = nla_get_u8(a[AZSWAP_A_POLICY_XDELTA]);
	if (a[AZSWAP_A_POLICY_SIM_EFFORT])
		p.sim_effort = nla_get_u32(a[AZSWAP_A_POLICY_SIM_EFFORT]);
	if (a[AZSWAP_A_POLICY_DELTA_MAX_PCT])
		p.delta_max_pct = nla_get_u32(a[AZSWAP_A_POLICY_DELTA_MAX_PCT]);
	if (a[AZSWAP_A_POLICY_SHUFFLE])
		p.shuffle = nla_get_u8(a[AZSWAP_A_POLICY_SHUFFLE]);
	ret = azswap_dev_set_policy(dev, &p);
	up_write(&dev->init_lock);
	if (ret)
		NL_SET_ERR_MSG(info->extack, "invalid policy");
	return ret;
}

/* 0 when @id is a registered owner of @s, else -ENOENT. */
static int azswap_nl_registered(struct az_store *s, u64 id)
{
	struct az_owner_stats os;

	if (!id || az_store_owner_stats(s, id, &os) || !os.registered)
		return -ENOENT;
	return 0;
}

/* ---- PHASE_SET -------------------------------------------------------- */

static int azswap_nl_phase_set(struct sk_buff *skb, struct genl_info *info)
{
	struct azswap_dev *dev;
	struct az_store *s;
	u64 id;
	u8 phase;
	int ret;

	if (azswap_nl_missing(info, AZSWAP_A_CGROUP_ID) ||
	    azswap_nl_missing(info, AZSWAP_A_PHASE))
		return -EINVAL;
	dev = azswap_nl_dev(info->attrs, info->extack);
	if (!dev)
		return -ENODEV;
	id = nla_get_u64(info->attrs[AZSWAP_A_CGROUP_ID]);
	phase = nla_get_u8(info->attrs[AZSWAP_A_PHASE]);
	s = azswap_nl_store(dev, info->extack);
	if (!s)
		return -ENODEV;
	ret = azswap_nl_registered(s, id);
	if (!ret) {
		if (phase == AZSWAP_PHASE_UNKNOWN)
			xa_erase(&dev->phases, (unsigned long)id);
		else
			ret = xa_err(xa_store(&dev->phases, (unsigned long)id,
					      xa_mk_value(phase), GFP_KERNEL));
	}
	up_read(&dev->init_lock);
	if (ret == -ENOENT)
		NL_SET_ERR_MSG_ATTR(info->extack,
				    info->attrs[AZSWAP_A_CGROUP_ID],
				    "no registered owner with this id");
	if (ret)
		return ret;
	azswap_nl_event(AZSWAP_CMD_PHASE_SET, dev, id, AZSWAP_A_PHASE, phase);
	return 0;
}

/* ---- SANDBOX_MAP ------------------------------------------------------ */

/*
 * A registered owner maps a snapshot template privately: virtual pages
 * [MAP_START, MAP_START + MAP_PAGES) hold the file's pages from INDEX on.
 * Where this kernel indexes copied-on-write pages by their file offset
 * (AZSWAP_COW_INDEX_FILE) the hint needs no map: the request is checked
 * and nothing is recorded.
 */
static int azswap_nl_sandbox_map(struct sk_buff *skb, struct genl_info *info)
{
	struct azswap_dev *dev;
	struct az_store *s;
	u64 id, start, pages, pgoff;
	int ret;

	if (azswap_nl_missing(info, AZSWAP_A_CGROUP_ID) ||
	    azswap_nl_missing(info, AZSWAP_A_MAP_START) ||
	    azswap_nl_missing(info, AZSWAP_A_MAP_PAGES) ||
	    azswap_nl_missing(info, AZSWAP_A_INDEX))
		return -EINVAL;
	dev = azswap_nl_dev(info->attrs, info->extack);
	if (!dev)
		return -ENODEV;
	id = nla_get_u64(info->attrs[AZSWAP_A_CGROUP_ID]);
	start = nla_get_u64(info->attrs[AZSWAP_A_MAP_START]);
	pages = nla_get_u64(info->attrs[AZSWAP_A_MAP_PAGES]);
	pgoff = nla_get_u64(info->attrs[AZSWAP_A_INDEX]);
	if (start + pages < start || pgoff + pages < pgoff) {
		NL_SET_ERR_MSG(info->extack, "the mapped range wraps");
		return -EINVAL;
	}
	s = azswap_nl_store(dev, info->extack);
	if (!s)
		return -ENODEV;
	if (AZSWAP_COW_INDEX == AZSWAP_COW_INDEX_VIRTUAL)
		ret = id ? az_store_set_map(s, id, start, pages, pgoff) :
			   -ENOENT;
	else
		ret = azswap_nl_registered(s, id);
	up_read(&dev->init_lock);
	if (ret == -ENOENT)
		NL_SET_ERR_MSG_ATTR(info->extack,
				    info->attrs[AZSWAP_A_CGROUP_ID],
				    "no registered owner with this id");
	return ret;
}

/* ---- family ----------------------------------------------------------- */

static const struct genl_ops azswap_nl_ops[] = {
	{
		.cmd = AZSWAP_CMD_GET_INFO,
		.doit = azswap_nl_get_info,
	},
	{
		.cmd = AZSWAP_CMD_SANDBOX_ADD,
		.doit = azswap_nl_owner_add,
		.flags = GENL_ADMIN_PERM,
	},
	{
		.cmd = AZSWAP_CMD_SANDBOX_DEL,
		.doit = azswap_nl_owner_del,
		.flags = GENL_ADMIN_PERM,
	},
	{
		.cmd = AZSWAP_CMD_TEMPLATE_ADD,
		.doit = azswap_nl_owner_add,
		.flags = GENL_ADMIN_PERM,
	},
	{
		.cmd = AZSWAP_CMD_TEMPLATE_DEL,
		.doit = azswap_nl_owner_del,
		.flags = GENL_ADMIN_PERM,
	},
	{
		.cmd = AZSWAP_CMD_TEMPLATE_LOAD,
		.doit = azswap_nl_template_load,
		.flags = GENL_ADMIN_PERM,
	},
	{
		/*
		 * Per-sandbox counts tell whether another sandbox holds a
		 * page (a DUP appears): admin only, doit and dump alike.
		 */
		.cmd = AZSWAP_CMD_STATS_GET,
		.doit = azswap_nl_stats_doit,
		.dumpit = azswap_nl_stats_dumpit,
		.flags = GENL_ADMIN_PERM,
	},
	{
		.cmd = AZSWAP_CMD_POLICY_GET,
		.doit = azswap_nl_policy_get,
	},
	{
		.cmd = AZSWAP_CMD_POLICY_SET,
		.doit = azswap_nl_policy_set,
		.flags = GENL_ADMIN_PERM,
	},
	{
		.cmd = AZSWAP_CMD_PHASE_SET,
		.doit = azswap_nl_phase_set,
		.flags = GENL_ADMIN_PERM,
	},
	{
		.cmd = AZSWAP_CMD_SANDBOX_MAP,
		.doit = azswap_nl_sandbox_map,
		.flags = GENL_ADMIN_PERM,
	},
};

static const struct genl_multicast_group azswap_nl_mcgrps[] = {
	{
		.name = AZSWAP_MCGRP_EVENTS,
#ifdef GENL_MCAST_CAP_NET_ADMIN
		/* Events name sandboxes' cgroups: admin only, like the commands. */
		.flags = GENL_MCAST_CAP_NET_ADMIN,
#endif
	},
};

static struct genl_family azswap_genl __ro_after_init = {
	.name = AZSWAP_GENL_NAME,
	.version = AZSWAP_GENL_VERSION,
	.maxattr = AZSWAP_A_MAX,
	.policy = azswap_nl_policy,
	.resv_start_op = 0,
	.pre_doit = azswap_nl_pre_doit,
	.module = THIS_MODULE,
	.ops = azswap_nl_ops,
	.n_ops = ARRAY_SIZE(azswap_nl_ops),
	.mcgrps = azswap_nl_mcgrps,
	.n_mcgrps = ARRAY_SIZE(azswap_nl_mcgrps),
};

int azswap_netlink_init(void)
{
	return genl_register_family(&azswap_genl);
}

void azswap_netlink_exit(void)
{
	genl_unregister_family(&azswap_genl);
}
