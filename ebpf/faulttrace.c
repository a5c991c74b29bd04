// SPDX-License-Identifier: GPL-2.0
/*
 * faulttrace.c: swap-in faults of registered sandboxes (cgroups), for azswap's prefetcher.
 *
 * Loaded by ebpf/tracer.py (bcc).  Three sources:
 *
 *  - kprobe/kretprobe swap_cache_get_folio(entry, vma, addr): do_swap_page() calls it first for
 *    every fault on a swap PTE, with the fault address; a NULL return means the page is not in the
 *    swap cache and do_swap_page() reads it from the device (that is exactly when it returns
 *    VM_FAULT_MAJOR and counts pgmajfault).  A non-NULL return is a minor swap fault: readahead
 *    or a prefetch (MADV_WILLNEED) brought the page in first.
 *    Why not a kprobe on do_swap_page(): in Debian's 6.1 build do_swap_page() is inlined into
 *    __handle_mm_fault(); the out-of-line copy only serves khugepaged, so a kprobe on it sees a
 *    handful of the faults (measured: 6 of 256 swap-ins, see ebpf/README.md).
 *    shmem passes vma == NULL (shmem_swapin_folio): not a sandbox's anonymous memory, ignored.
 *    From 6.18 (the swap-table rework) swap_cache_get_folio() takes the entry only: built with
 *    -DLOOKUP_ENTRY_ONLY (the loader reads the kernel's BTF), the fault address comes from a
 *    kprobe/kretprobe on handle_mm_fault() (exported, never inlined), and only the first lookup
 *    made inside a sandbox task's page fault counts (the swap-in after a miss looks again).
 *
 *  - tracepoints azswap:azswap_load / azswap:azswap_store (kmod/azswap_trace.h), compiled in
 *    with -DAZSWAP_TRACEPOINTS when the module is loaded: per-sandbox load/store counters, stored
 *    bytes and a log2 histogram of decode time.  The load tracepoint carries the owning cgroup
 *    (page_memcg), so it is filtered on that, not on the current task.
 *
 * Only cgroups in the `sandboxes` map are traced; user space adds them and stamps phase
 * changes into them (CLOCK_MONOTONIC ns == bpf_ktime_get_ns()).
 *
 * Memory is bounded: fixed-size maps and one ring buffer (RINGBUF_PAGES, set by the loader).
 * A full ring buffer is never silent: every failed reserve adds to counters[CNT_DROPS] and to
 * the sandbox's own drop count.
 */
#include <uapi/linux/ptrace.h>

#define MAX_SANDBOXES	1024
#define MAX_PENDING	4096

#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES	64
#endif

/* swp_entry_t on x86-64: type in the top 5 of 63 bits (SWP_TYPE_SHIFT = 58). */
#define SWP_TYPE_SHIFT	58
#define SWP_OFFSET_MASK	((1ULL << SWP_TYPE_SHIFT) - 1)

enum ev_kind {
	EV_MAJOR = 1,		/* swap-in read from the device */
	EV_MINOR = 2,		/* swap PTE, page found in the swap cache */
};

enum counter {
	CNT_EVENTS = 0,		/* events submitted to the ring buffer */
	CNT_DROPS,		/* ring buffer full: event lost (counted, never silent) */
	CNT_PENDING_FULL,	/* pending map full: fault not traced */
	CNT_LOADS,		/* azswap_load seen for a sandbox */
	CNT_STORES,		/* azswap_store seen for a sandbox */
	CNT_MAX,
};

struct sandbox {
	u64 phase_start_ns;	/* written by user space at each phase change */
	u32 phase_seq;		/* bumped by user space at each phase change */
	u32 phase;		/* user space's phase code */
};

/* Per-sandbox counters, updated with atomic adds. */
struct sbstat {
	u64 major;
	u64 minor;
	u64 drops;
	u64 loads;
	u64 load_ns;
	u64 load_errors;
	u64 stores;
	u64 stored_bytes;
	u64 store_errors;
};

struct pending {
	u64 ts_ns;
	u64 addr;
	u64 entry;
	u64 cgroup_id;
};

/* Layout shared with ebpf/events.py (EVENT_FORMAT): keep the two in step. */
struct fault_event {
	u64 ts_ns;		/* fault entry, bpf_ktime_get_ns() */
	u64 cgroup_id;
	u64 addr;		/* page-aligned fault address */
	u64 slot;		/* swap offset */
	u64 since_phase_ns;	/* ts_ns - sandbox's phase_start_ns */
	u32 tgid;
	u32 tid;
	u32 phase_seq;
	u16 kind;		/* enum ev_kind */
	u16 swap_type;
};

struct hist_key {
	u64 cgroup_id;
	u64 slot;		/* log2 bucket of the decode time in ns */
};

BPF_HASH(sandboxes, u64, struct sandbox, MAX_SANDBOXES);
BPF_HASH(sbstats, u64, struct sbstat, MAX_SANDBOXES);
BPF_HASH(pending, u32, struct pending, MAX_PENDING);
BPF_PERCPU_ARRAY(counters, u64, CNT_MAX);
BPF_HISTOGRAM(decode_ns, struct hist_key, MAX_SANDBOXES * 40);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

static __always_inline void count(int idx)
{
	u64 *v = counters.lookup(&idx);

	if (v)
		(*v)++;
}

static __always_inline struct sbstat *sbstat_of(u64 cgid)
{
	struct sbstat zero = {};

	return sbstats.lookup_or_try_init(&cgid, &zero);
}

static __always_inline int lookup_entry(unsigned long entry, u64 addr)
{
	u64 cgid = bpf_get_current_cgroup_id();
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct pending p = {};

	if (!sandboxes.lookup(&cgid))
		return 0;
	p.ts_ns = bpf_ktime_get_ns();
	p.addr = addr & ~4095ULL;
	p.entry = entry;
	p.cgroup_id = cgid;
	if (pending.update(&tid, &p) != 0)
		count(CNT_PENDING_FULL);
	return 0;
}

#ifdef LOOKUP_ENTRY_ONLY
/* tid -> fault address, while a sandbox task is in handle_mm_fault(). */
BPF_HASH(faulting, u32, u64, MAX_PENDING);

int trace_fault_entry(struct pt_regs *ctx, void *vma, unsigned long address)
{
	u64 cgid = bpf_get_current_cgroup_id();
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 addr = address;

	if (!sandboxes.lookup(&cgid))
		return 0;
	if (faulting.update(&tid, &addr) != 0)
		count(CNT_PENDING_FULL);
	return 0;
}

int trace_fault_return(struct pt_regs *ctx)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();

	faulting.delete(&tid);
	return 0;
}

int trace_lookup_entry(struct pt_regs *ctx, unsigned long entry)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 *addr = faulting.lookup(&tid);
	u64 fault_addr;

	if (!addr)
		return 0;
	/*
	 * Only the fault's first lookup is do_swap_page()'s: in the reworked swap core the
	 * swap-in that follows a miss looks the entry up again (a racing insert), and counting
	 * that one too reports every fault twice.
	 */
	fault_addr = *addr;
	faulting.delete(&tid);
	return lookup_entry(entry, fault_addr);
}
#else
int trace_lookup_entry(struct pt_regs *ctx, unsigned long entry, void *vma,
		       unsigned long addr)
{
	if (!vma)
		return 0;
	return lookup_entry(entry, addr);
}
#endif

int trace_lookup_return(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id;
	struct pending *p = pending.lookup(&tid);
	struct fault_event *e;
	struct sandbox *sb;
	struct sbstat *st;
	u64 cgid, since = 0;
	u32 seq = 0;
	int major;

	if (!p)
		return 0;
	cgid = p->cgroup_id;
	major = PT_REGS_RC(ctx) == 0;
	sb = sandboxes.lookup(&cgid);
	if (sb) {
		seq = sb->phase_seq;
		since = p->ts_ns > sb->phase_start_ns ? p->ts_ns - sb->phase_start_ns : 0;
	}
	st = sbstat_of(cgid);
	if (st) {
		if (major)
			__sync_fetch_and_add(&st->major, 1);
		else
			__sync_fetch_and_add(&st->minor, 1);
	}
	e = events.ringbuf_reserve(sizeof(*e));
	if (!e) {
		count(CNT_DROPS);
		if (st)
			__sync_fetch_and_add(&st->drops, 1);
		pending.delete(&tid);
		return 0;
	}
	e->ts_ns = p->ts_ns;
	e->cgroup_id = cgid;
	e->addr = p->addr;
	e->slot = p->entry & SWP_OFFSET_MASK;
	e->swap_type = p->entry >> SWP_TYPE_SHIFT;
	e->since_phase_ns = since;
	e->tgid = id >> 32;
	e->tid = tid;
	e->phase_seq = seq;
	e->kind = major ? EV_MAJOR : EV_MINOR;
	events.ringbuf_submit(e, 0);
	pending.delete(&tid);
	count(CNT_EVENTS);
	return 0;
}

#ifdef AZSWAP_TRACEPOINTS
TRACEPOINT_PROBE(azswap, azswap_load)
{
	u64 cgid = args->cgroup_id;
	struct hist_key key = {};
	struct sbstat *st;

	if (!sandboxes.lookup(&cgid))
		return 0;
	count(CNT_LOADS);
	st = sbstat_of(cgid);
	if (!st)
		return 0;
	if (args->ret < 0) {
		__sync_fetch_and_add(&st->load_errors, 1);
		return 0;
	}
	__sync_fetch_and_add(&st->loads, 1);
	__sync_fetch_and_add(&st->load_ns, args->ns);
	key.cgroup_id = cgid;
	key.slot = bpf_log2l(args->ns);
	decode_ns.atomic_increment(key);
	return 0;
}

TRACEPOINT_PROBE(azswap, azswap_store)
{
	u64 cgid = args->cgroup_id;
	struct sbstat *st;

	if (!sandboxes.lookup(&cgid))
		return 0;
	count(CNT_STORES);
	st = sbstat_of(cgid);
	if (!st)
		return 0;
	if (args->ret < 0) {
		__sync_fetch_and_add(&st->store_errors, 1);
		return 0;
	}
	__sync_fetch_and_add(&st->stores, 1);
	__sync_fetch_and_add(&st->stored_bytes, args->bytes);
	return 0;
}
#endif
