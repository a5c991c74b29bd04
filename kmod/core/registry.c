// SPDX-License-Identifier: GPL-2.0
/*
 * Owners: registered sandboxes and templates (by cgroup id), grouped into
 * trust groups.  Entry 0 collects every unregistered cgroup.
 *
 * An entry stays allocated after its owner is removed for as long as it
 * is charged for anything (slots, object bytes, template pages) or a put
 * is using it (busy), so per-owner sums always match the global stats.
 * reg_lock serialises changes to the entries' identity (cgroup_id, group,
 * flags); the counters are atomics.
 *
 * The put path never takes reg_lock: az_owner_pin finds the entry through
 * s->owner_hash without a lock, marks it busy, and only then checks that
 * the entry is still registered to that cgroup (a full barrier between
 * the two, against the one between az_owner_del clearing AZ_OWN_REG and
 * reading busy: either the put sees the owner gone, or del waits for it).
 * A lookup racing with the entry being re-hashed may miss it: that page is
 * stored unshared, as for an unregistered cgroup.
 */
#include "az_internal.h"

void az_owners_init(struct az_store *s)
{
	az_owner_at(s, 0)->flags = AZ_OWN_USED;
	s->nr_owners = 1;
}

static bool az_owner_idle(struct az_owner *ow)
{
	return !az_atomic_read(&ow->busy) && !az_atomic64_read(&ow->pages) &&
	       !az_atomic64_read(&ow->excl_bytes) &&
	       !az_atomic64_read(&ow->shared_bytes) &&
	       !az_atomic64_read(&ow->loaded_pages);
}

static inline u32 az_owner_bucket(u64 cgroup_id)
{
	return (u32)((cgroup_id * 0x9e3779b97f4a7c15ULL) >> 54) &
	       (AZ_OWNER_BUCKETS - 1);
}

/*
 * The entry holding @cgroup_id, or 0.  Exact under reg_lock; without it a
 * hint that the caller confirms (chains are walked at most AZ_MAX_OWNERS
 * steps: an entry moved meanwhile may lead into another chain).
 */
static u32 az_owner_find(struct az_store *s, u64 cgroup_id)
{
	/* Acquire: pairs with az_owner_rehash (the entry, its chunk). */
	u32 i = az_load_acquire(&s->owner_hash[az_owner_bucket(cgroup_id)]);
	unsigned int steps = 0;

	while (i && steps++ < AZ_MAX_OWNERS) {
		if (AZ_READ_ONCE(az_owner_at(s, i)->cgroup_id) == cgroup_id)
			return i;
		i = az_load_acquire(&az_owner_at(s, i)->hnext);
	}
	return 0;
}

/* Under reg_lock: give entry @i the cgroup id @cgroup_id. */
static void az_owner_rehash(struct az_store *s, u32 i, u64 cgroup_id)
{
	struct az_owner *ow = az_owner_at(s, i);
	u16 *pp, *head = &s->owner_hash[az_owner_bucket(cgroup_id)];

	if (ow->flags & AZ_OWN_USED) {
		pp = &s->owner_hash[az_owner_bucket(ow->cgroup_id)];
		while (*pp && *pp != i)
			pp = &az_owner_at(s, *pp)->hnext;
		if (*pp)
			AZ_WRITE_ONCE(*pp, ow->hnext);
	}
	AZ_WRITE_ONCE(ow->cgroup_id, cgroup_id);
	AZ_WRITE_ONCE(ow->hnext, *head);
	az_store_release(head, (u16)i);
}

void az_owner_pin(struct az_store *s, u64 cgroup_id, struct az_pin *pin)
{
	struct az_owner *ow;
	u32 i, flags;

	pin->idx = 0;
	pin->reg = false;
	pin->tmpl = false;
	pin->group = 0;
	/* Racy peek: no registered owner means nothing to look up. */
	if (!AZ_READ_ONCE(s->nr_reg) || !cgroup_id)
		return;
	i = az_owner_find(s, cgroup_id);
	if (!i)
		return;
	ow = az_owner_at(s, i);
	az_atomic_inc(&ow->busy);
	az_smp_mb();	/* busy before flags; pairs with az_owner_del */
	flags = az_load_acquire(&ow->flags);
	if (!(flags & AZ_OWN_REG) || AZ_READ_ONCE(ow->cgroup_id) != cgroup_id) {
		if (az_atomic_dec_and_test(&ow->busy))
			az_wake_up(&s->owner_wq);
		return;
	}
	pin->idx = i;
	pin->reg = true;
	pin->tmpl = !!(flags & AZ_OWN_TEMPLATE);
	pin->group = AZ_READ_ONCE(ow->group);
}

void az_owner_unpin(struct az_store *s, struct az_pin *pin)
{
	if (pin->idx && az_atomic_dec_and_test(&az_owner_at(s, pin->idx)->busy))
		az_wake_up(&s->owner_wq);
}

u64 az_owner_index(struct az_store *s, const struct az_pin *pin, u64 index)
{
	struct az_owner *ow = az_owner_at(s, pin->idx);
	u64 pages, start;

	if (!pin->idx)
		return index;
	pages = az_load_acquire(&ow->map_pages);
	if (!pages)
		return index;
	start = AZ_READ_ONCE(ow->map_start);
	/* Unsigned: an index below @start wraps above @pages. */
	if (index - start >= pages)
		return index;
	return index - start + AZ_READ_ONCE(ow->map_pgoff);
}

/* Owner entry memory: the chunks installed. */
u64 az_owner_bytes(struct az_store *s)
{
	u64 n = 0;
	u32 c;

	for (c = 0; c < AZ_OWNER_CHUNKS; c++)
		if (AZ_READ_ONCE(s->owner_chunk[c]))
			n += AZ_OWNER_CHUNK * sizeof(struct az_owner);
	return n;
}

static int az_owner_add(struct az_store *s, u64 cgroup_id, u32 group,
			bool tmpl)
{
	struct az_owner *ow, *chunk = NULL;
	u32 i;
	int err = 0;

	if (!cgroup_id)
		return -EINVAL;
	err = az_index_ensure(s);
	if (err)
		return err;
again:
	az_spin_lock(&s->reg_lock);
	i = az_owner_find(s, cgroup_id);
	if (i) {
		ow = az_owner_at(s, i);
		if (ow->flags & AZ_OWN_REG) {
			err = -EEXIST;
			goto out;
		}
		/* A removed owner coming back: reuse its entry. */
	} else {
		for (i = 1; i < s->nr_owners; i++) {
			ow = az_owner_at(s, i);
			if (!(ow->flags & AZ_OWN_USED) ||
			    (!(ow->flags & AZ_OWN_REG) && az_owner_idle(ow)))
				break;
		}
		if (i == s->nr_owners) {
			if (i == AZ_MAX_OWNERS) {
				err = -ENOSPC;
				goto out;
			}
			if (!s->owner_chunk[i / AZ_OWNER_CHUNK]) {
				if (!chunk) {
					/* Allocate outside the spinlock. */
					az_spin_unlock(&s->reg_lock);
					chunk = az_valloc(AZ_OWNER_CHUNK *
							  sizeof(*chunk));
					if (!chunk)
						return -ENOMEM;
					goto again;
				}
				az_store_release(&s->owner_chunk[i /
						 AZ_OWNER_CHUNK], chunk);
				chunk = NULL;
			}
			s->nr_owners++;
		}
		ow = az_owner_at(s, i);
		az_owner_rehash(s, i, cgroup_id);
	}
	AZ_WRITE_ONCE(ow->group, group);
	AZ_WRITE_ONCE(ow->map_pages, 0);
	/* Last, with release: a put that sees REG sees the group above. */
	az_store_release(&ow->flags,
			 AZ_OWN_USED | AZ_OWN_REG | (tmpl ? AZ_OWN_TEMPLATE : 0));
	AZ_WRITE_ONCE(s->nr_reg, s->nr_reg + 1);
	s->owners_gen++;
out:
	az_spin_unlock(&s->reg_lock);
	az_vfree(chunk);	/* another add installed that chunk first */
	return err;
}

static int az_owner_del(struct az_store *s, u64 cgroup_id, bool tmpl)
{
	struct az_owner *ow;
	u32 i;
	int err = 0;

	az_spin_lock(&s->reg_lock);
	i = az_owner_find(s, cgroup_id);
	ow = az_owner_at(s, i);
	if (!i || !(ow->flags & AZ_OWN_REG) ||
	    !!(ow->flags & AZ_OWN_TEMPLATE) != tmpl) {
		err = -ENOENT;
		goto out;
	}
	/* Keep USED and TEMPLATE: the entry still reports what it owns. */
	AZ_WRITE_ONCE(ow->flags, ow->flags & ~AZ_OWN_REG);
	AZ_WRITE_ONCE(s->nr_reg, s->nr_reg - 1);
	s->owners_gen++;
out:
	az_spin_unlock(&s->reg_lock);
	if (err)
		return err;
	/*
	 * Puts that pinned the owner before it was removed may still add
	 * template entries: sleep until they are done (the last unpin wakes
	 * us), then drop its entries for good.
	 */
	az_smp_mb();	/* flags before busy; pairs with az_owner_pin */
	az_wait_event(&s->owner_wq, !az_atomic_read(&ow->busy));
	if (tmpl)
		az_template_drop_owner(s, i);
	az_sim_forget_owner(s, i);
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

int az_store_set_map(struct az_store *s, u64 cgroup_id, u64 start, u64 pages,
		     u64 pgoff)
{
	struct az_owner *ow;
	int err = 0;
	u32 i;

	if (!cgroup_id || start + pages < start || pgoff + pages < pgoff)
		return -EINVAL;
	az_spin_lock(&s->reg_lock);
	i = az_owner_find(s, cgroup_id);
	ow = az_owner_at(s, i);
	if (!i || !(ow->flags & AZ_OWN_REG)) {
		err = -ENOENT;
		goto out;
	}
	/* Off while the range changes; on again, with release, once set. */
	AZ_WRITE_ONCE(ow->map_pages, 0);
	az_smp_mb();
	AZ_WRITE_ONCE(ow->map_start, start);
	AZ_WRITE_ONCE(ow->map_pgoff, pgoff);
	az_store_release(&ow->map_pages, pages);
out:
	az_spin_unlock(&s->reg_lock);
	return err;
}

static void az_owner_fill(struct az_store *s, u32 i,
			  struct az_owner_stats *out)
{
	struct az_owner *ow = az_owner_at(s, i);
	unsigned int k;

	memset(out, 0, sizeof(*out));
	out->entry = i;
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
 * Entries in table order from index @start, the unregistered bucket
 * (cgroup id 0, entry 0) first; removed owners are listed while they
 * still own something.
 */
int az_store_list_owners(struct az_store *s, u32 start,
			 struct az_owner_stats *out, u32 max, u32 *gen)
{
	u32 i, n = 0;

	az_spin_lock(&s->reg_lock);
	if (gen)
		*gen = s->owners_gen;
	for (i = start; i < s->nr_owners && n < max; i++) {
		struct az_owner *ow = az_owner_at(s, i);

		if (!(ow->flags & AZ_OWN_USED))
			continue;
		if (i && !(ow->flags & AZ_OWN_REG) && az_owner_idle(ow))
			continue;
		az_owner_fill(s, i, &out[n++]);
	}
	az_spin_unlock(&s->reg_lock);
	return n;
}
