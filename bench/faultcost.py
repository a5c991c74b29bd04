"""What one page costs to bring back from a swap device: a fault against a prefetch.

    vm-tests/run [--kernel 6.12] -- .venv/bin/python -m bench.faultcost
        [--systems azswap-lz4,zram-lz4] [--pages 4096] [--style coding] [--repeat 3]
        [--probes] [--json OUT]

Guest only (root, a swap device of its own).  For each system: one PageSandbox of ``--pages``
pages (bench/pagesandbox.py, a style's content, no template) in a cgroup of its own, then per
repeat three passes of its tool's page reads (every page read and verified once):

- resident: nothing swapped (the reads' own cost);
- faults: everything reclaimed first (memory.reclaim), so every page is a major fault;
- populate: everything reclaimed, then brought back from outside the process as the daemon's
  resident-set prefetcher does (process_vm_readv of one byte a page, IOV_MAX pages a call), and
  then read.

Per page: a fault = (faults - resident) / the pass's major faults; a populate = its seconds /
pages.  The process's own pages (its interpreter's heap) are reclaimed too, so the faults pass
counts a few hundred more faults than pages, and the read after a populate still faults those.

``--probes`` adds one pass with kprobes (bcc) on the swap-in path: do_swap_page, the swap
read (swap_readpage on 6.1, swap_read_folio later), the device's entry (azswap_rw_page,
zram_rw_page), the store's get (az_store_get) and LZ4_decompress_safe; calls and mean
microseconds each.  Probes cost time of their own under TCG: those means are for proportions
only, the per-page figures come from the passes without probes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.kit.cgroups import LeafCgroup, reclaim_all
from bench.pagesandbox import STYLES, PageSandbox
from controlplane.pagemap import PAGE_SIZE, Range
from controlplane.prefetch import populate_ranges

MiB = 2**20
PROBED = ("do_swap_page", "swap_readpage", "swap_read_folio", "azswap_rw_page", "zram_rw_page",
          "az_store_get", "LZ4_decompress_safe")
MAX_PROBES = 6

PROG = r"""
#include <uapi/linux/ptrace.h>
struct acc { u64 n; u64 ns; };
BPF_HASH(start, u64, u64, 4096);
BPF_ARRAY(tot, struct acc, 8);
static int enter(int k) {
    u64 id = bpf_get_current_pid_tgid() ^ ((u64)k << 56);
    u64 t = bpf_ktime_get_ns();
    start.update(&id, &t);
    return 0;
}
static int leave(int k) {
    u64 id = bpf_get_current_pid_tgid() ^ ((u64)k << 56);
    u64 *t = start.lookup(&id);
    struct acc *a = tot.lookup(&k);
    if (!t)
        return 0;
    if (a) {
        __sync_fetch_and_add(&a->n, 1);
        __sync_fetch_and_add(&a->ns, bpf_ktime_get_ns() - *t);
    }
    start.delete(&id);
    return 0;
}
"""


class Cg(LeafCgroup):
    parent = "azfaultcost"


def per_page(resident_s: float, faults_s: float, majflt: int, populate_s: float,
             pages: int) -> dict[str, float]:
    """Microseconds a page: a fault (beyond the resident read) and a populate."""
    return {
        "fault_us": (faults_s - resident_s) / max(1, majflt) * 1e6,
        "populate_us": populate_s / max(1, pages) * 1e6,
    }


def populate(sb: PageSandbox, pages: int) -> tuple[float, int]:
    """Bring the sandbox's pages back from outside it as the resident-set prefetcher does
    (controlplane.prefetch.populate_ranges); (seconds, pages read)."""
    t0 = time.monotonic()
    done, _calls, _skipped = populate_ranges(
        sb.pid, [Range(sb.pid, sb.page_addr(0), pages * PAGE_SIZE)])
    return time.monotonic() - t0, done // PAGE_SIZE


def probe_program() -> tuple[Any, dict[int, str]]:
    """The kprobe pairs on the swap-in path that this kernel has (index -> function)."""
    from bcc import BPF  # guest only: the host's tests import this module without bcc

    with open("/proc/kallsyms") as f:
        have = {ln.split()[2] for ln in f}
    names = [p for p in PROBED if p in have][:MAX_PROBES]
    text = PROG + "".join(
        f"int e{k}(struct pt_regs *c) {{ return enter({k}); }}\n"
        f"int r{k}(struct pt_regs *c) {{ return leave({k}); }}\n" for k in range(len(names)))
    b = BPF(text=text)
    for k, p in enumerate(names):
        b.attach_kprobe(event=p, fn_name=f"e{k}")
        b.attach_kretprobe(event=p, fn_name=f"r{k}", maxactive=64)
    return b, dict(enumerate(names))


def measure(system: str, pages: int, style: str, repeat: int, probes: bool,
            log: Any = print) -> dict[str, Any]:
    """One system's passes (see the module docstring)."""
    from bench.kit.swapdev import swap_device

    row: dict[str, Any] = {"system": system, "pages": pages, "style": style, "runs": []}
    with swap_device(system, 512 * MiB):
        cg = Cg(system)
        sb = PageSandbox(cg.path, pages, 7, style=style)
        try:
            for i in range(repeat):
                res = sb.touch(range(pages))
                reclaim_all(cg.path)
                flt = sb.touch(range(pages))
                reclaim_all(cg.path)
                pop_s, done = populate(sb, pages)
                after = sb.touch(range(pages))
                bad = res["bad"] + flt["bad"] + after["bad"]
                run = {
                    "resident_s": res["seconds"], "faults_s": flt["seconds"],
                    "majflt": flt["majflt"], "populate_s": pop_s, "populated": done,
                    "after_populate_s": after["seconds"], "after_majflt": after["majflt"],
                    "bad_pages": bad,
                    **per_page(res["seconds"], flt["seconds"], flt["majflt"], pop_s, done),
                }
                row["runs"].append(run)
                log(f"{system} run {i + 1}: a fault {run['fault_us']:.0f} us, a populate "
                    f"{run['populate_us']:.0f} us a page ({flt['majflt']} faults)")
            if probes:
                b, names = probe_program()
                reclaim_all(cg.path)
                r = sb.touch(range(pages))
                tot = b["tot"]
                row["probed"] = {"seconds": r["seconds"], "majflt": r["majflt"], **{
                    p: {"calls": tot[tot.Key(k)].n,
                        "us_each": tot[tot.Key(k)].ns / max(1, tot[tot.Key(k)].n) / 1e3}
                    for k, p in names.items()}}
                b.cleanup()
            row["bad_pages"] = sum(r["bad_pages"] for r in row["runs"]) + sb.verify()
        finally:
            sb.stop()
            cg.remove()
    return row


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """A markdown table: min / median / max over the runs."""
    def mmm(xs: list[float]) -> str:
        return f"{min(xs):.0f} / {statistics.median(xs):.0f} / {max(xs):.0f}"

    out = ["| system | a fault, us | a populate, us a page | bad pages |", "|---|--:|--:|--:|"]
    for r in rows:
        f = [x["fault_us"] for x in r["runs"]]
        p = [x["populate_us"] for x in r["runs"]]
        out.append(f"| {r['system']} | {mmm(f)} | {mmm(p)} | {r['bad_pages']} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.faultcost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="azswap-lz4,zram-lz4",
                    help="comma-separated swap systems (bench/kit/swapdev.py names)")
    ap.add_argument("--pages", type=int, default=4096, help="pages in the sandbox")
    ap.add_argument("--style", default="coding", choices=STYLES)
    ap.add_argument("--repeat", type=int, default=3, help="runs per system")
    ap.add_argument("--probes", action="store_true", help="one more pass under kprobes (bcc)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    a = ap.parse_args(argv)
    if a.pages < 1 or a.repeat < 1:
        ap.error("--pages and --repeat must be at least 1")
    if os.geteuid() != 0:
        ap.error("runs as root in a test guest (vm-tests/run -- .venv/bin/python -m "
                 "bench.faultcost)")
    rows = [measure(s, a.pages, a.style, a.repeat, a.probes)
            for s in a.systems.split(",") if s]
    print("\n".join(summary(rows)))
    if a.json:
        a.json.write_text(json.dumps({"kernel": os.uname().release, "rows": rows}, indent=1))
    return 1 if any(r["bad_pages"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
