"""Phase benchmark: fan-out sandboxes with LLM-wait/tool cycles under three regimes.

    vm-tests/run --memory 2G -- .venv/bin/python -m bench.phasebench \\
        [--sandboxes 4] [--pages 4096] [--hot 0.25] [--cycles 6] [--wait 2.0] [--tool-cpu 0.1] \\
        [--modes a,b,c,ca,cl] [--prefetch-lead 0] [--wait-jitter 0.25] [--swap azswap|zram] \
        [--json OUT]

Every sandbox is a process in its own memory cgroup (bench/pagesandbox.py) owning
--pages pages of text-like, verifiable data.  It alternates an LLM wait (sleep --wait s, the
sandboxes staggered) and a tool phase: touch its hot set (--hot of its pages, same pages in the
same first-touch order each cycle, every 8th one rewritten, plus 1% fresh random pages), verify
every page touched, then --tool-cpu s of CPU.  Regimes, each with fresh sandboxes, in one guest:

  (a) none        no compression: nothing reclaimed.
  (b) aggressive  a proactive reclaimer blind to phases: every --interval s it pushes every
                  sandbox out with memory.reclaim, whatever the sandbox is doing.
  (c) phase-aware compress a sandbox once per LLM wait, --grace s after the wait starts (the
                  scheduler's rule), never in a tool phase; on the tool hint prefetch its learned
                  restore set (controlplane/prefetch.py, fault tracer in ebpf/) with
                  process_madvise(MADV_WILLNEED), synchronously: the prefetch time is part of the
                  tool latency.  --prefetch-async runs it in a thread while the tool starts (as
                  the daemon does).  Mode cl prefetches before the *predicted* end of the
                  wait instead: waits vary (--wait-jitter), the prediction is the 20th
                  percentile of the sandbox's past waits, the lead is --prefetch-lead s or,
                  by default, 1.5x its recent prefetch time + 50 ms; a prefetch still
                  running when the wait really ends is paid by the tool.  Modes ca and cl
                  are (c) with the async and the predicted-end prefetch.

Figures per regime: tool-phase latency (mean, p50, p95, over cycles after --warmup), end-to-end
time of the whole fan-out, major faults in tool phases, CPU spent compressing (the memory.reclaim
writes) inside LLM waits and outside them, memory footprint (time-averaged sum of
the sandboxes' memory.current plus the swap device's own memory: zram mem_used_total / azswap
pool + metadata bytes) and the saving against (a).  Then slowdown (b)/(a), (c)/(a) and the
fraction of (b)'s saving that (c) keeps.  Nothing here asserts anything; JSON goes to
$AZSWAP_OUT/phasebench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.coldpages import mark_cold
from bench.kit import cgroups
from bench.kit.cgroups import stat as cg_stat
from bench.kit.swapdev import SwapDevError, System, swap_device
from bench.pagesandbox import PageSandbox
from controlplane.scheduler import lower_thread_priority

CGROOT = Path("/sys/fs/cgroup")
BENCH_CG = CGROOT / "azphase"
MiB = 1 << 20


# -- cgroups ------------------------------------------------------------------------------------


def reclaim(cg: Path, amount: int = 1 << 30) -> float:
    """One memory.reclaim write (coming up short is not an error); its seconds."""
    t = time.monotonic()
    cgroups.of(cg).reclaim(amount)
    return time.monotonic() - t


def mem_current(cg: Path) -> int:
    return cgroups.of(cg).memory_current()


def pgmajfault(cg: Path) -> int:
    return cg_stat(cg).get("pgmajfault", 0)


# -- one regime --------------------------------------------------------------------------------


@dataclass
class Box:
    name: str
    cg: Path
    sb: PageSandbox
    hot: list[int]
    rng: random.Random
    phase: str = "start"
    phase_t: float = 0.0
    compressed: bool = True  # (c): no more compression in this wait (its end is near)
    passes: int = 0  # (c): reclaim passes in a row that freed nothing
    left: int = 0  # (c): memory.current after the last pass
    cold: bool = False  # (c): MADV_COLD done in this wait
    next_reclaim: float = 0.0
    tool_s: list[float] = field(default_factory=list)
    majflt: list[int] = field(default_factory=list)
    minflt: list[int] = field(default_factory=list)
    prefetch: list[dict[str, Any]] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)  # LLM waits seen so far (seconds)
    prefetch_s: list[float] = field(default_factory=list)  # how long each prefetch took
    leads: list[float] = field(default_factory=list)  # how early each prefetch was issued
    late: int = 0  # prefetches still running when the wait ended
    bad: int = 0


@dataclass
class Args:
    sandboxes: int
    pages: int
    hot: float
    cycles: int
    warmup: int
    wait: float
    tool_cpu: float
    interval: float
    grace: float
    prefetch_lead: float  # mode cl: seconds before the predicted end; <= 0: adaptive
    prefetch_async: bool
    seed: int
    wait_jitter: float = 0.25  # each wait is uniform in wait * (1 -/+ jitter)
    reclaim_nice: int = 10  # nice of the compressing threads ((b) and (c) alike)
    cold: bool = False  # (c): MADV_COLD what the first pass of a wait kept, then pass again


def predicted_wait(seen: list[float]) -> float | None:
    """The orchestrator's guess of this wait's length: the 20th percentile of the waits seen."""
    if not seen:
        return None
    s = sorted(seen[-8:])
    return s[int(0.2 * (len(s) - 1))]


def lead_for(b: Box, a: Args) -> float:
    """How early to prefetch: fixed, or 1.5x the recent prefetch time + 50 ms."""
    if a.prefetch_lead > 0:
        return a.prefetch_lead
    recent = b.prefetch_s[-3:]
    return 1.5 * statistics.fmean(recent) + 0.05 if recent else 0.5


def run_mode(mode: str, a: Args, dev: System, prefetcher: Any, rnd: int = 0) -> dict[str, Any]:
    boxes: list[Box] = []
    for i in range(a.sandboxes):
        name = f"{mode}{rnd}-{i}"
        cg = cgroups.make_tree(BENCH_CG, [name])[name]
        sb = PageSandbox(cg, a.pages, seed=a.seed + i)
        rng = random.Random(a.seed * 100 + i)
        hot = rng.sample(range(a.pages), int(a.pages * a.hot))
        boxes.append(Box(name, cg, sb, hot, rng))
        if prefetcher is not None:
            prefetcher.add_sandbox(name, cg)
    stop = threading.Event()
    mu = threading.Lock()
    samples: list[int] = []

    parts: dict[str, list[int]] = {"anon": [], "file": [], "other": [], "device": [],
                                   "payload": [], "pool": [], "meta": []}

    def sampler() -> None:
        while not stop.is_set():
            total = sum(mem_current(b.cg) for b in boxes)
            dev_b = dev.used_bytes() if mode != "a" else 0
            samples.append(total + dev_b)
            st = [cg_stat(b.cg) for b in boxes]
            anon, file = sum(s.get("anon", 0) for s in st), sum(s.get("file", 0) for s in st)
            parts["anon"].append(anon)
            parts["file"].append(file)
            parts["other"].append(total - anon - file)
            parts["device"].append(dev_b)
            if mode != "a":
                st = dev.stats()
                for k in ("payload", "pool", "meta"):
                    parts[k].append(st.get(k, 0))
            stop.wait(0.1)

    reclaim_s = [0.0]
    # CPU the reclaim (compression) writes used, by the sandbox's phase when they started:
    # memory.reclaim compresses in the writer's context, so this thread's CPU time is it
    cpu = {"wait": 0.0, "other": 0.0}

    def reclaim_timed(b: Box) -> None:
        where = "wait" if b.phase == "llm-wait" else "other"
        c0 = time.thread_time()
        reclaim_s[0] += reclaim(b.cg)
        cpu[where] += time.thread_time() - c0

    def aggressive() -> None:  # (b): blind to phases
        lower_thread_priority(a.reclaim_nice)  # as the daemon's scheduler does, for both
        while not stop.is_set():
            for b in boxes:
                reclaim_timed(b)
            stop.wait(a.interval)

    def phase_aware() -> None:  # (c): inside waits only, after the grace period, never in tools
        lower_thread_priority(a.reclaim_nice)
        while not stop.is_set():
            now = time.monotonic()
            for b in boxes:
                with mu:
                    due = (b.phase == "llm-wait" and not b.compressed
                           and now - b.phase_t >= a.grace and now >= b.next_reclaim)
                if not due:
                    continue
                # One memory.reclaim pass leaves pages the kernel had on the active list (it
                # deactivates them instead): pass again until a pass frees nothing, then only
                # if the sandbox grows.  The wait is idle time: keep it compressed throughout.
                before = mem_current(b.cg)
                if b.passes < 2 or before > b.left + 256 * 1024:
                    reclaim_timed(b)
                    after = mem_current(b.cg)
                    if after > 512 * 1024 and not b.cold and a.cold:
                        # what the pass kept had its accessed bit set (the tool, the prefetch):
                        # clear the bits so the next pass takes it (bench/coldpages.py)
                        b.cold = True
                        c0 = time.thread_time()
                        mark_cold(b.cg)
                        cpu["wait"] += time.thread_time() - c0
                        reclaim_timed(b)
                        after = mem_current(b.cg)
                    b.passes = b.passes + 1 if before - after < 64 * 1024 else 0
                    b.left = after
                b.next_reclaim = now + a.interval
            stop.wait(0.05)

    def set_phase(b: Box, phase: str) -> None:
        with mu:
            b.phase, b.phase_t = phase, time.monotonic()
            if phase == "llm-wait":
                b.compressed = False
                b.passes = b.left = 0
                b.cold = False
        if prefetcher is not None and phase == "llm-wait":
            prefetcher.record_phase_change(b.name, phase)

    def life(b: Box, offset: float) -> None:
        time.sleep(offset)
        for _ in range(a.cycles):
            res: dict[str, Any] | None = None
            set_phase(b, "llm-wait")
            w_start = time.monotonic()
            w = a.wait * (1.0 + a.wait_jitter * (2.0 * b.rng.random() - 1.0))
            guess = predicted_wait(b.waits) if prefetcher is not None and mode == "cl" else None
            lead = 0.0
            if guess is not None:
                # just before the predicted end of the wait (a guess from past waits: the
                # real one may be longer or shorter)
                lead = lead_for(b, a)
                time.sleep(max(w_start + max(guess - lead, 0.0) - time.monotonic(), 0.0))
                with mu:
                    b.compressed = True  # the wait is ending: do not compress any more
                pf_t = time.monotonic()
                b.leads.append(w_start + w - pf_t)
                res = prefetcher.restore(b.name)
                b.prefetch_s.append(time.monotonic() - pf_t)
                b.late += time.monotonic() > w_start + w
            # the LLM answered at w_start + w: tool latency counts from there, so a prefetch
            # still running then is paid by the tool
            t0 = w_start + w
            time.sleep(max(t0 - time.monotonic(), 0.0))
            b.waits.append(w)  # the tool starts when the wait ends, or after an overrunning
            set_phase(b, "tool")  # prefetch: that overrun counts in the tool latency
            fresh = b.rng.sample(range(a.pages), max(a.pages // 100, 1))
            bg: threading.Thread | None = None
            box: list[dict[str, Any]] = []
            if prefetcher is not None and guess is None and (a.prefetch_async or mode == "ca"):
                # as the daemon does: the tool starts at once, the prefetch races ahead of it
                bg = threading.Thread(target=lambda out=box: out.append(
                    prefetcher.restore(b.name)))
                bg.start()
            elif prefetcher is not None and guess is None:
                pf_t = time.monotonic()
                res = prefetcher.restore(b.name)
                b.prefetch_s.append(time.monotonic() - pf_t)
            r = b.sb.touch(b.hot + fresh, write_every=8, spin_s=a.tool_cpu)
            if bg is not None:
                bg.join()
                res = box[0] if box else None
            if prefetcher is not None:
                b.prefetch.append(res)
            b.tool_s.append(time.monotonic() - t0)
            b.majflt.append(int(r["majflt"]))
            b.minflt.append(int(r.get("minflt", 0)))
            b.bad += int(r["bad"])
        set_phase(b, "done")

    helpers = [threading.Thread(target=sampler, daemon=True)]
    if mode == "b":
        helpers.append(threading.Thread(target=aggressive, daemon=True))
    elif mode.startswith("c"):
        helpers.append(threading.Thread(target=phase_aware, daemon=True))
    lives = [threading.Thread(target=life, args=(b, i * a.wait / a.sandboxes))
             for i, b in enumerate(boxes)]
    t_start = time.monotonic()
    for t in helpers + lives:
        t.start()
    for t in lives:
        t.join()
    e2e = time.monotonic() - t_start
    stop.set()
    for t in helpers:
        t.join()
    bad = sum(b.bad for b in boxes) + sum(b.sb.verify() for b in boxes)
    steady = [s for b in boxes for s in b.tool_s[a.warmup:]]
    maj = [m for b in boxes for m in b.majflt[a.warmup:]]
    mnr = [m for b in boxes for m in b.minflt[a.warmup:]]
    out: dict[str, Any] = {
        "mode": mode,
        "e2e_s": round(e2e, 3),
        "tool_mean_s": round(statistics.fmean(steady), 4),
        "tool_p50_s": round(statistics.median(steady), 4),
        "tool_p95_s": round(sorted(steady)[int(0.95 * (len(steady) - 1))], 4),
        "tool_majflt_mean": round(statistics.fmean(maj), 1),
        "tool_minflt_mean": round(statistics.fmean(mnr), 1),
        "footprint_mib": round(statistics.fmean(samples) / MiB, 2),
        # what the footprint is made of (time averages): the sandboxes' anon and file pages, the
        # rest of their memory.current (kernel memory, swap cache), the swap device's memory
        **{f"footprint_{k}_mib": round(statistics.fmean(v) / MiB, 2) for k, v in parts.items()
           if v},
        "reclaim_s": round(reclaim_s[0], 2),
        "reclaim_cpu_wait_s": round(cpu["wait"], 3),
        "reclaim_cpu_other_s": round(cpu["other"], 3),
        "bad_pages": bad,
        "pgmajfault": sum(pgmajfault(b.cg) for b in boxes),
    }
    if prefetcher is not None:
        acc = [prefetcher.settle(b.name) for b in boxes]
        out["prefetch"] = {k: sum(x[k] for x in acc) for k in acc[0]}
        pf = [r for b in boxes for r in b.prefetch[a.warmup:] if r]
        out["prefetch_s_mean"] = round(statistics.fmean(r["seconds"] for r in pf), 4) if pf else 0
        out["prefetch_pages_mean"] = (round(statistics.fmean(r["prefetched_pages"] for r in pf),
                                            1) if pf else 0)
        out["stopped"] = sorted({r["stopped"] for r in pf if r["stopped"]})
        leads = [x for b in boxes for x in b.leads]
        if leads:
            out["lead_s_mean"] = round(statistics.fmean(leads), 3)
            out["prefetch_late"] = sum(b.late for b in boxes)
    for b in boxes:
        b.sb.stop()
        cgroups.remove_tree(b.cg)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="phasebench", description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sandboxes", type=int, default=4)
    ap.add_argument("--pages", type=int, default=4096, help="pages per sandbox")
    ap.add_argument("--hot", type=float, default=0.25, help="fraction touched per tool phase")
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="cycles left out of tool latency")
    ap.add_argument("--wait", type=float, default=2.0, help="LLM wait, seconds")
    ap.add_argument("--tool-cpu", type=float, default=0.1, help="tool CPU work, seconds")
    ap.add_argument("--interval", type=float, default=0.25, help="(b) reclaim period")
    ap.add_argument("--grace", type=float, default=0.2, help="(c) wait age before compressing")
    ap.add_argument("--prefetch-lead", type=float, default=0.0,
                    help="mode cl: prefetch this long before the predicted end of the wait; "
                         "0 (default): adaptive, 1.5x the recent prefetch time + 50 ms")
    ap.add_argument("--prefetch-method", choices=("populate", "willneed"), default="populate",
                    help="populate: fault pages in and map them (process_vm_readv); willneed: "
                         "process_madvise(MADV_WILLNEED), a minor fault per page remains")
    ap.add_argument("--cold", action="store_true",
                    help="(c): MADV_COLD the sandbox after a wait's first reclaim pass (measured: "
                         "no more memory saved, slower tools: the interpreter's own pages go too)")
    ap.add_argument("--reclaim-nice", type=int, default=10,
                    help="nice of the threads that compress ((b) and (c) alike), as the daemon")
    ap.add_argument("--wait-jitter", type=float, default=0.25,
                    help="each LLM wait is uniform in wait * (1 -/+ this)")
    ap.add_argument("--prefetch-async", action="store_true",
                    help="(c) on the tool hint, prefetch in a thread while the tool runs "
                         "(what the daemon does) instead of before it")
    ap.add_argument("--modes", default="a,b,c")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of all modes, interleaved; figures are medians over rounds")
    ap.add_argument("--swap", choices=("azswap", "zram"), default="azswap")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path,
                    default=Path(os.environ.get("AZSWAP_OUT", "/tmp")) / "phasebench.json")
    ns = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("phasebench: error: must run as root (in the guest: vm-tests/run)", file=sys.stderr)
        return 1
    if not 0 <= ns.wait_jitter < 1:
        ap.error("--wait-jitter must be in [0, 1)")
    a = Args(ns.sandboxes, ns.pages, ns.hot, ns.cycles, ns.warmup, ns.wait, ns.tool_cpu,
             ns.interval, ns.grace, ns.prefetch_lead, ns.prefetch_async, ns.seed, ns.wait_jitter,
             ns.reclaim_nice, ns.cold)
    rounds: dict[str, list[dict[str, Any]]] = {}
    try:
        with swap_device(f"{ns.swap}-lz4", 1 << 30) as dev:
            kind = run_all(ns, a, dev, rounds)
    except SwapDevError as e:
        print(f"phasebench: error: {e}", file=sys.stderr)
        return 1
    results = {m: median_of(rs) for m, rs in rounds.items()}
    report(results, kind, a)
    ns.json.write_text(json.dumps({"swap": kind, "args": a.__dict__,
                                   "prefetch_method": ns.prefetch_method, "results": results,
                                   "rounds": rounds}, indent=1))
    return 0


def run_all(ns: argparse.Namespace, a: Args, dev: System,
            rounds: dict[str, list[dict[str, Any]]]) -> str:
    """Every round of every mode on ``dev``; the swap kind's name."""
    kind = dev.name.split("-")[0]
    print(f"swap device: {dev.name}; prefetch {ns.prefetch_method}; {a}", flush=True)
    prefetcher = None
    try:
        for rnd in range(ns.repeat):
            for mode in ns.modes.split(","):
                if mode.startswith("c") and prefetcher is None:
                    from controlplane.prefetch import PrefetchConfig, Prefetcher
                    from ebpf.tracer import FaultTracer

                    tr = FaultTracer()
                    t = time.monotonic()
                    tr.start()
                    print(f"fault tracer loaded in {time.monotonic() - t:.1f}s", flush=True)
                    # learn the whole tool phase (it ends at the next wait): under TCG a tool
                    # phase that faults takes seconds
                    cfg = PrefetchConfig(history=3, window_s=60.0, method=ns.prefetch_method)
                    prefetcher = Prefetcher(cfg,
                                            tracer=tr)
                    prefetcher.start_polling()
                res = run_mode(mode, a, dev, prefetcher if mode.startswith("c") else None, rnd)
                rounds.setdefault(mode, []).append(res)
                print(json.dumps(res), flush=True)
    finally:
        if prefetcher is not None:
            prefetcher.close()
    return kind


def median_of(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per numeric figure, the median over rounds (the rest from the first round)."""
    out = dict(rs[0])
    for k, v in rs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = statistics.median(r[k] for r in rs)
    out["rounds"] = len(rs)
    return out


def report(r: dict[str, dict[str, Any]], kind: str, a: Args) -> None:
    names = {"a": "(a) no compression", "b": "(b) aggressive, no phase/prefetch",
             "c": f"(c) {kind} phase-aware + prefetch@hint",
             "ca": f"(c) {kind} phase-aware + prefetch async",
             "cl": f"(c) {kind} phase-aware + prefetch before predicted wait end"}
    print(f"\n{'regime':<36} {'tool mean':>10} {'tool p95':>9} {'e2e':>8} {'majflt/tool':>11} "
          f"{'footprint':>10} {'saved':>8}")
    base = r.get("a")
    for m, v in r.items():
        saved = base["footprint_mib"] - v["footprint_mib"] if base else 0.0
        v["saved_mib"] = round(saved, 2)
        print(f"{names.get(m, m):<36} {v['tool_mean_s'] * 1e3:>8.1f}ms"
              f" {v['tool_p95_s'] * 1e3:>7.1f}ms {v['e2e_s']:>7.2f}s"
              f" {v['tool_majflt_mean']:>11.1f} {v['footprint_mib']:>8.1f}Mi"
              f" {saved:>6.1f}Mi")
    if not base or "b" not in r:
        return
    b = r["b"]
    print(f"\nslowdown (b)/(a): tool latency {b['tool_mean_s'] / base['tool_mean_s']:.2f}x, "
          f"end-to-end {b['e2e_s'] / base['e2e_s']:.2f}x")
    for m in (x for x in r if x.startswith("c")):
        c = r[m]
        keep = c["saved_mib"] / b["saved_mib"] * 100 if b["saved_mib"] > 0 else float("nan")
        print(f"slowdown ({m})/(a): tool latency {c['tool_mean_s'] / base['tool_mean_s']:.2f}x, "
              f"end-to-end {c['e2e_s'] / base['e2e_s']:.2f}x; keeps {keep:.0f}% of (b)'s saving")
        if "prefetch" in c:
            print(f"  prefetch accuracy ({m}): {c['prefetch']}")


if __name__ == "__main__":
    sys.exit(main())
