/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Tracepoints of azswap.ko: /sys/kernel/tracing/events/azswap/.
 * CREATE_TRACE_POINTS is defined in trace.c only.  bcc programs in ebpf/
 * attach with TRACEPOINT_PROBE(azswap, azswap_load) and the field names
 * below (documented in docs/sysfs-abi.md, section "Tracepoints").
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM azswap

#if !defined(AZSWAP_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define AZSWAP_TRACE_H

#include <linux/tracepoint.h>

/*
 * One page stored (swap-out).  @kind is the representation chosen
 * (enum az_kind: 0 same, 1 dup, 2 tdelta, 3 xdelta, 4 plain, 5 raw) or -1
 * when the store failed (@ret < 0).  @bytes is what the page added to the
 * store's stored_bytes (0 for same/dup), see docs/sysfs-abi.md.
 */
TRACE_EVENT(azswap_store,
	TP_PROTO(int dev, u64 cgroup_id, u64 slot, int kind, u32 bytes,
		 int ret),
	TP_ARGS(dev, cgroup_id, slot, kind, bytes, ret),
	TP_STRUCT__entry(
		__field(u64, cgroup_id)
		__field(u64, slot)
		__field(int, dev)
		__field(int, kind)
		__field(u32, bytes)
		__field(int, ret)
	),
	TP_fast_assign(
		__entry->cgroup_id = cgroup_id;
		__entry->slot = slot;
		__entry->dev = dev;
		__entry->kind = kind;
		__entry->bytes = bytes;
		__entry->ret = ret;
	),
	TP_printk("dev=%d cgroup=%llu slot=%llu kind=%d bytes=%u ret=%d",
		  __entry->dev, __entry->cgroup_id, __entry->slot,
		  __entry->kind, __entry->bytes, __entry->ret)
);

/*
 * One page loaded (swap-in, or a read of the device).  @cgroup_id is the
 * memory cgroup the page is charged to (the slot's owner for swap-in;
 * 0 when unknown), @kind as above (-1 for an empty slot), @ns the time
 * to decode it.
 */
TRACE_EVENT(azswap_load,
	TP_PROTO(int dev, u64 cgroup_id, u64 slot, int kind, u64 ns, int ret),
	TP_ARGS(dev, cgroup_id, slot, kind, ns, ret),
	TP_STRUCT__entry(
		__field(u64, cgroup_id)
		__field(u64, slot)
		__field(u64, ns)
		__field(int, dev)
		__field(int, kind)
		__field(int, ret)
	),
	TP_fast_assign(
		__entry->cgroup_id = cgroup_id;
		__entry->slot = slot;
		__entry->ns = ns;
		__entry->dev = dev;
		__entry->kind = kind;
		__entry->ret = ret;
	),
	TP_printk("dev=%d cgroup=%llu slot=%llu kind=%d ns=%llu ret=%d",
		  __entry->dev, __entry->cgroup_id, __entry->slot,
		  __entry->kind, __entry->ns, __entry->ret)
);

#endif /* AZSWAP_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE azswap_trace
#include <trace/define_trace.h>
