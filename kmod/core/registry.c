// SPDX-License-Identifier: GPL-2.0
/*
 * Owners: registered sandboxes and templates (by cgroup id), grouped into
 * trust groups.  Entry 0 collects every unregistered cgroup.
 *
 * An entry stays allocated after its owner is removed for as long as it
 * is charged for anything (slots, object bytes, template pages) or a put
 * is using it (busy), so per-owner sums always match the global stats.
 * reg_lock protects the entries' identity (cgroup_id, group, flags);
 * the counters are atomics.
 */
#include "az_internal.h"

void az_owners_init(struct az_store *s)
{
	s->owners[0].flags = AZ_OWN_USED;
	s->nr_owners = 1;
}

static bool az_owner_idle(struct az_owner *ow)
{
	return !az_atomic_read(&ow->busy) && !az_atomic64_read(&ow->pages) &&
	       !az_atomic64_read(&ow->excl_bytes) &&
	       !az_atomic64_read(&ow->shared_bytes) &&
	       !az_atomic64_read(&ow->loaded_pages);
}

/* Under reg_lock.  Returns the entry for @cgroup_id, or 0. */
static u32 az_owner_find(struct az_store *s, u64 cgroup_id)
{
	u32 i;

	for (i = 1; i < s->nr_owners; i++)
		if ((s->owners[i].flags & AZ_OWN_USED) &&
		    s->owners[i].cgroup_id == cgroup_id)
			return i;
	return 0;
}

void az_owner_pin(struct az_store *s, u64 cgroup_id, struct az_pin *pin)
{
	struct az_owner *ow;
	u32 i;

	pin->idx = 0;
	pin->reg = false;
	pin->tmpl = false;
	pin->group = 0;
	/* Racy peek: no registered owner means nothing to look up. */
	if (!AZ_READ_ONCE(s->nr_reg) || !cgroup_id)
		return;
	az_spin_lock(&s->reg_lock);
	i = az_owner_find(s, cgroup_id);
	if (i && (s->owners[i].flags & AZ_OWN_REG)) {
		ow = &s->owners[i];
		az_atomic_inc(&ow->busy);
		pin->idx = i;
		pin->reg = true;
		pin->tmpl = !!(ow->flags & AZ_OWN_TEMPLATE);
		pin->group = ow->group;
	}
	az_spin_unlock(&s->reg_lock);
}

void az_owner_unpin(struct az_store *s, struct az_pin *pin)
{
	if (pin->idx)
		az_atomic_dec(&s->owners[pin->idx].busy);
}

static int az_owner_add(struct az_store *s, u64 cgroup_id, u32 group,
			bool tmpl)
{
	struct az_owner *ow;
	u32 i;
	int err = 0;

	if (!cgroup_id)
		return -EINVAL;
	err = az_index_ensure(s);
	if (err)
		return err;
	az_spin_lock(&s->reg_lock);
	i = az_owner_find(s, cgroup_id);
	if (i) {
		ow = &s->owners[i];
		if (ow->flags & AZ_OWN_REG) {
			err = -EEXIST;
			goto out;
		}
		/* A removed owner coming back: reuse its entry. */
	} else {
		for (i = 1; i < s->nr_owners; i++) {
			ow = &s->owners[i];
			if (!(ow->flags & AZ_OWN_USED) ||
			    (!(ow->flags & AZ_OWN_REG) && az_owner_idle(ow)))
				break;
		}
		if (i == s->nr_owners) {
			if (i == AZ_MAX_OWNERS) {
				err = -ENOSPC;
				goto out;
			}
			s->nr_owners++;
		}
		ow = &s->owners[i];
		ow->cgroup_id = cgroup_id;
	}
	ow->group = group;
	ow->flags = AZ_OWN_USED | AZ_OWN_REG | (tmpl ? AZ_OWN_TEMPLATE : 0);
	AZ_WRITE_ONCE(s->nr_reg, s->nr_reg + 1);
out:
	az_spin_unlock(&s->reg_lock);
	return err;
}

static int az_owner_del(struct az_store *s, u64 cgroup_id, bool tmpl)
{
	struct az_owner *ow;
	u32 i;
	int err = 0;

	az_spin_lock(&s->reg_lock);
	i = az_owner_find(s, cgroup_id);
	ow = &s->owners[i];
	if (!i || !(ow->flags & AZ_OWN_REG) ||
	    !!(ow->flags & AZ_OWN_TEMPLATE) != tmpl) {
		err = -ENOENT;
		goto out;
	}
	/* Keep USED and TEMPLATE: the entry still reports what it owns. */
	ow->flags &= ~AZ_OWN_REG;
	AZ_WRITE_ONCE(s->nr_reg, s->nr_reg - 1);
out:
	az_spin_unlock(&s->reg_lock);
	if (err)
		return err;
	/*
	 * Puts that pinned the owner before it was removed may still add
	 * template entries: wait for them (they take microseconds), then
	 * drop its entries for good.
	 */
	while (az_atomic_read(&ow->busy))
		az_cond_resched();
	if (tmpl)
		az_template_drop_owner(s, i);
	return 0;
}

int az_store_add_sandbox(struct az_store *s, u64 cgroup_id, u32 group)
{
	return az_owner_add(s, cgroup_id, group, false);
}

int az_store_del_sandbox(struct az_store *s, u64 cgroup_id)
{
	return az_owner_del(s, cgroup_id, false);
}

int az_store_add_template(struct az_store *s, u64 cgroup_id, u32 group)
{
	return az_owner_add(s, cgroup_id, group, true);
}

int az_store_del_template(struct az_store *s, u64 cgroup_id)
{
	return az_owner_del(s, cgroup_id, true);
}

static void az_owner_fill(struct az_store *s, u32 i,
			  struct az_owner_stats *out)
{
	struct az_owner *ow = &s->owners[i];
	unsigned int k;

	memset(out, 0, sizeof(*out));
	out->cgroup_id = ow->cgroup_id;
	out->group = ow->group;
	out->is_template = !!(ow->flags & AZ_OWN_TEMPLATE);
	out->registered = !!(ow->flags & AZ_OWN_REG);
	out->pages = az_atomic64_read(&ow->pages);
	out->orig_bytes = out->pages * AZ_PAGE_SIZE;
	out->exclusive_bytes = az_atomic64_read(&ow->excl_bytes);
	out->shared_bytes = az_atomic64_read(&ow->shared_bytes);
	out->template_pages = az_atomic64_read(&ow->loaded_pages);
	for (k = 0; k < AZ_NR_KINDS; k++)
		out->kind_pages[k] = az_atomic64_read(&ow->kind_pages[k]);
}

int az_store_owner_stats(struct az_store *s, u64 cgroup_id,
			 struct az_owner_stats *out)
{
	u32 i;
	int err = -ENOENT;

	az_spin_lock(&s->reg_lock);
	i = cgroup_id ? az_owner_find(s, cgroup_id) : 0;
	if (i || !cgroup_id) {
		az_owner_fill(s, i, out);
		err = 0;
	}
	az_spin_unlock(&s->reg_lock);
	return err;
}

/*
 * Entries in table order, the unregistered bucket (cgroup id 0) first;
 * removed owners are listed while they still own something.
 */
int az_store_list_owners(struct az_store *s, u32 start,
			 struct az_owner_stats *out, u32 max)
{
	u32 i, n = 0, pos = 0;

	az_spin_lock(&s->reg_lock);
	for (i = 0; i < s->nr_owners && n < max; i++) {
		struct az_owner *ow = &s->owners[i];

		if (!(ow->flags & AZ_OWN_USED))
			continue;
		if (i && !(ow->flags & AZ_OWN_REG) && az_owner_idle(ow))
			continue;
		if (pos++ < start)
			continue;
		az_owner_fill(s, i, &out[n++]);
	}
	az_spin_unlock(&s->reg_lock);
	return n;
}
