"""faulttrace: swap-in faults of azswap sandboxes (cgroups), in order, with decode latency.

Traces every fault on a swap PTE by the processes of the given cgroups (major: read from the
swap device; minor: found in the swap cache after readahead or a prefetch), and with the azswap
module loaded, its per-page load/store tracepoints (decode time histogram, stored bytes).
Root only.  One instance at a time (lock file /run/azswap/faulttrace.lock).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ebpf.events import KIND_NAMES, FaultEvent, FaultRecords, format_log2_hist
from ebpf.tracer import FaultTracer, TracerError, cgroup_id

EXAMPLES = """examples:
    python -m ebpf.faulttrace -c sb1               # trace /sys/fs/cgroup/sb1 until Ctrl-C
    python -m ebpf.faulttrace -c sb1 -c sb2 -d 30  # two sandboxes for 30 s, then the summary
    python -m ebpf.faulttrace -c sb1 -e            # one line per fault (first touches, repeats)
    python -m ebpf.faulttrace -c sb1 -o 20         # the summary shows the first 20 pages back
    python -m ebpf.faulttrace -c sb1 --no-module-events  # faults only, no azswap module needed
    python -m ebpf.faulttrace -c sb1 -d 10 -j      # summary as JSON
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="faulttrace",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("-c", "--cgroup", action="append", required=True, metavar="CGROUP",
                    help="sandbox cgroup (path, or relative to /sys/fs/cgroup); repeatable")
    ap.add_argument("-d", "--duration", type=float, default=0.0,
                    help="seconds to trace (default: until Ctrl-C)")
    ap.add_argument("-e", "--events", action="store_true", help="print one line per fault")
    ap.add_argument("-o", "--order", type=int, default=0, metavar="N",
                    help="print the first N pages faulted back per sandbox")
    mod = ap.add_mutually_exclusive_group()
    mod.add_argument("--module-events", dest="module", action="store_const", const="require",
                     default="auto", help="require azswap's tracepoints (error if absent)")
    mod.add_argument("--no-module-events", dest="module", action="store_const", const="off",
                     help="do not attach azswap's tracepoints")
    ap.add_argument("--ringbuf-pages", type=int, default=64,
                    help="ring buffer size in pages, a power of two (default 64)")
    ap.add_argument("-j", "--json", action="store_true", help="summary as JSON")
    return ap.parse_args(argv)


def event_line(ev: FaultEvent, name: str, t0: int) -> str:
    return (f"{(ev.ts_ns - t0) / 1e9:<10.6f} {name:<16} {ev.tgid:<7} {ev.addr:#018x} "
            f"{ev.slot:<9} {KIND_NAMES[ev.kind]:<5} {ev.phase_seq:<5} "
            f"{ev.since_phase_ns / 1e6:>10.3f}")


EVENT_HEADER = (f"{'TIME(s)':<10} {'SANDBOX':<16} {'PID':<7} {'ADDR':<18} {'SLOT':<9} "
                f"{'KIND':<5} {'PHASE':<5} {'SINCE(ms)':>10}")


def summary(tr: FaultTracer, recs: FaultRecords, order: int) -> dict[str, Any]:
    stats = tr.sandbox_stats()
    hists = tr.decode_hist()
    out: dict[str, Any] = {"counters": tr.counters(), "module_events": tr.with_module,
                           "sandboxes": {}}
    for name, slot in tr.sandboxes.items():
        rec = recs.by_cgroup.get(slot.cgroup_id)
        st = stats.get(name, {})
        pages = sum(len(p.order) for p in rec.phases.values()) if rec else 0
        first = []
        if rec and rec.phases and order:
            for seq in sorted(rec.phases):
                ph = rec.phases[seq]
                first += [{"phase": seq, "pid": pg[0], "addr": pg[1],
                           "since_ms": round(ph.first_ns[pg] / 1e6, 3)}
                          for pg in ph.order[:order]]
        out["sandboxes"][name] = {
            "cgroup_id": slot.cgroup_id, "major": st.get("major", 0),
            "minor": st.get("minor", 0), "pages": pages, "drops": st.get("drops", 0),
            "loads": st.get("loads", 0), "load_ns": st.get("load_ns", 0),
            "stores": st.get("stores", 0), "stored_bytes": st.get("stored_bytes", 0),
            "decode_hist": hists.get(name, {}), "first_pages": first[: order * 4],
        }
    return out


def print_summary(s: dict[str, Any]) -> None:
    c = s["counters"]
    print(f"\n{'SANDBOX':<16} {'CGID':>8} {'MAJOR':>8} {'MINOR':>8} {'PAGES':>8} {'DROPS':>6} "
          f"{'LOADS':>8} {'DEC(us)':>8} {'STORES':>8} {'STORED_KB':>10}")
    for name, v in s["sandboxes"].items():
        dec = f"{v['load_ns'] / v['loads'] / 1e3:.1f}" if v["loads"] else "-"
        print(f"{name:<16} {v['cgroup_id']:>8} {v['major']:>8} {v['minor']:>8} {v['pages']:>8} "
              f"{v['drops']:>6} {v['loads']:>8} {dec:>8} {v['stores']:>8} "
              f"{v['stored_bytes'] // 1024:>10}")
    for name, v in s["sandboxes"].items():
        if v["decode_hist"]:
            print(f"\ndecode time, {name}:")
            print("\n".join(format_log2_hist(v["decode_hist"], "ns")))
        if v["first_pages"]:
            print(f"\nfirst pages faulted back, {name}:")
            print(f"{'PHASE':<6} {'PID':<7} {'ADDR':<18} {'SINCE(ms)':>10}")
            for p in v["first_pages"]:
                print(f"{p['phase']:<6} {p['pid']:<7} {p['addr']:#018x} {p['since_ms']:>10.3f}")
    mod = "on" if s["module_events"] else "off (faults only)"
    print(f"\nevents {c['events']}  dropped {c['drops']}  untraced (pending full) "
          f"{c['pending_full']}  bad {c['bad_events']}  azswap tracepoints {mod}")
    if c["drops"] or c["pending_full"]:
        print("WARNING: events were lost; raise --ringbuf-pages", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    recs = FaultRecords()
    try:
        cgids = {c: cgroup_id(c) for c in args.cgroup}
        tr = FaultTracer(module_events=args.module, ringbuf_pages=args.ringbuf_pages)
        tr.start()
    except TracerError as e:
        print(f"faulttrace: error: {e}", file=sys.stderr)
        return 1
    try:
        for path, cgid in cgids.items():
            name = Path(path).name
            tr.add_sandbox(name, cgid)
            recs.add_sandbox(name, cgid)
        names = {s.cgroup_id: s.name for s in tr.sandboxes.values()}
        print(f"Tracing swap-in faults of {len(cgids)} cgroup(s)"
              f"{', azswap tracepoints on' if tr.with_module else ''}... "
              f"{'Hit Ctrl-C to end.' if not args.duration else ''}", file=sys.stderr)
        if args.events:
            print(EVENT_HEADER)
        t0 = time.monotonic_ns()
        deadline = time.monotonic() + args.duration if args.duration else None
        while not stop.is_set():
            for ev in tr.poll(100):
                recs.add(ev)
                if args.events:
                    print(event_line(ev, names.get(ev.cgroup_id, "?"), t0))
            if deadline is not None and time.monotonic() >= deadline:
                break
        for ev in tr.drain():
            recs.add(ev)
            if args.events:
                print(event_line(ev, names.get(ev.cgroup_id, "?"), t0))
        s = summary(tr, recs, args.order)
        if args.json:
            print(json.dumps(s, indent=1))
        else:
            print_summary(s)
    except TracerError as e:
        print(f"faulttrace: error: {e}", file=sys.stderr)
        return 1
    finally:
        tr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
