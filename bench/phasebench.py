"""Phase benchmark: agent sandboxes alternating LLM waits and tool phases, through the daemon.

    vm-tests/run --memory 2G --timeout 1500 -- .venv/bin/python -m bench.phasebench \\
        [--hosts idle,loaded] [--styles ml,coding] [--regimes none,aggressive,daemon] \\
        [--repeat 1] [--baseline bracket|first] [--order rotate|fixed] [--sandboxes 4] \\
        [--loaded-sandboxes 2*CPUs+2] [--pages 4096] [--loaded-pages 2048] [--cycles 10] \\
        [--wait-scale 1.0] [--thp host|off] [--json OUT]

Every sandbox is a process in its own memory cgroup (bench/pagesandbox.py) whose pages are
near-copies of a template: a template process in its own cgroup holds the template's pages, and
a sandbox's page i is the template's page i with a small per-sandbox edit (its id and the page's
version in a 32-byte header, 16 bytes of its own further in).  Each sandbox follows a seeded
trajectory (:func:`trajectory`): LLM waits drawn from a lognormal clipped to [0.5, 20] s
(times --wait-scale), tool phases of 0.1-5 s of work, a hot set that drifts 10-30% each tool
phase, every 8th touched page rewritten.  Styles: ``ml`` (float32 tensor-like pages, sequential
hot sets) and ``coding`` (source/JSON/heap-like pages, scattered hot sets; the tool phase also
parses Python, runs regular expressions, JSON and an in-memory sqlite3 query inside the sandbox,
so the interpreter's own heap is part of what gets compressed).  Every page a tool reads is
checked against its expected content, and every page once more at the end.

Hosts: ``idle`` (--sandboxes, staggered starts: for the daemon, a sandbox waiting for its start
is parked with an ``idle`` hint, as an orchestrator's warm pool is) and ``loaded``
(--loaded-sandboxes, more busy sandboxes than vCPUs, all starting at once so tool phases
overlap).

Regimes, each with fresh sandboxes and the same trajectories, on one azswap-lz4 device (--swap
azswap-lz4-cached: the module loaded with swap_cache=1, so a page read back keeps its stored copy
while it stays clean; one device per run, so compare the two in separate runs):

  none        no compression: nothing reclaimed.
  aggressive  a proactive reclaimer blind to phases: every --interval s a memory.reclaim of every
              sandbox, each write at nice 10.  The template and the sandboxes are registered
              with the module as for the daemon, so the redundancy store takes part.
  daemon      the shipped daemon (`azctl daemon`, a subprocess with its own socket and state
              directory): the template registered with template_add and reclaimed once (its
              pages become bases), the sandboxes registered with their trust group and the
              template, a `llm-wait` hint at the start of every wait and a `tool` hint at its
              end.  The daemon's scheduler compresses (and, for announced waits, its
              prefetcher restores); the benchmark does neither.
  daemon-alt  the daemon with --alt-daemon-arg options as well: an A/B of two settings on the
              same trajectories in the same boot (daemon-alt-stream: with `ending` as below).
  daemon-stream
              the same, and the orchestrator also says when the model begins to stream its
              tool call (`ending`, the trajectory's stream_s before the wait's end), as an agent
              loop that streams the model's answer can.

Order: each repeat runs ``none`` first and, with --baseline bracket (the default), again after
the others; the baseline is then the mean of its two runs (:func:`merge_baseline`), and its
``bracket`` keeps both and their ``drift`` (after / before). A steady drift of the guest (tools
growing slower as a boot goes on) then leaves the baseline at the middle of the repeat instead of
at its start: the regime run in the middle is compared with about its own moment, the first and
the last are off by about a quarter of the drift each, in opposite directions. With --order
rotate (the default) the other regimes move one place each repeat, so over a multiple of their
number of repeats each takes each place equally often. Each run's ``order`` says what ran, in
order, and each regime's ``started_s`` when (seconds after the repeat's first regime started).
Before every regime the benchmark times the style's work in its own process (the calibration's
work function, best of two 0.2 s timings): ``probe_units_s``, the guest's speed at that moment
beside the rate the tools' work was sized with (``config.rates``).

Figures per regime: tool-phase latency (mean, p95; cycles after --warmup), end-to-end time,
slowdown (tool mean / none's, same run), footprint (sum of the sandboxes' memory.current plus the
device's pool and metadata, sampled every 0.1 s): its time average and peak, saved_mib (none's
average minus this one's), keeps (saved / aggressive's saved, 0..1), major faults per tool phase,
bad_pages (must be 0), where a tool's time went (``tool_split_s``, means as the sandbox measured
them: ``seconds`` in all, ``pages_s`` reading its hot pages, ``cpu_s`` on a CPU and ``runq_s``
runnable but waiting for one; the rest it was blocked), and for the daemon its prefetch events, its
CPU time at start (with --prefetch-from faults, the BPF compile) and during the run (and of that,
its memory.reclaim writes: the compression), its CPU time by thread at the end (``threads_cpu_s``:
the daemon names its threads; "exited" is what ended threads used), and the wait planner's
outcomes. Each regime also keeps its
footprint timeline (every 0.5 s: monotonic time, the device's MiB, then each sandbox's
memory.current in MiB, in the order of its cycles; ``device_timeline``, at the same times, splits
the device's MiB into its payload, its pool (payload and the allocator's overhead) and its
metadata; ``device_end``, the device's stats when the cycles ended, its metadata by component;
``device_io``, the pages it stored and loaded and the slots swap freed during the regime)
beside its cycles (each tool phase's start "t" on the same clock, and "hint_s", how long its
tool hint took to send, or with --sync-hints to answer: part of the tool's latency; by default
hints are sent without waiting for the answer, as an agent loop on its hot path does, and a
failed one fails the run). JSON: ``{"runs": [{"host",
"style", "repeat", "regimes": {"none": R, "aggressive": R, "daemon": R}}]}`` to --json (default
$AZSWAP_OUT/phase.json); a table of min/median/max of slowdown and keeps per host, style and regime
at the end, then where a tool's time went and what each regime holds beyond aggressive by phase
(bench/phaseloss.py). Nothing here asserts a time; the exit status is non-zero when a page was
wrong or the daemon died or never answered. """

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.kit.daemon import DaemonError, DaemonProcess
from bench.kit.swapdev import IO_COUNTERS
from bench.kit.table import fmt_min_med_max, min_med_max, table
from bench.phaseloss import print_shortfall
from controlplane.prefetch_defaults import PREFETCH, PREFETCH_FROM

MiB = float(1 << 20)
REGIMES = ("none", "aggressive", "daemon", "daemon-stream", "daemon-alt", "daemon-alt-stream")
ALT_REGIMES = ("daemon-alt", "daemon-alt-stream")  # not run unless asked for
HOSTS = ("idle", "loaded")
STYLES = ("ml", "coding")
WAIT_MIN, WAIT_MAX = 0.5, 20.0
WORK_MIN, WORK_MAX = 0.1, 5.0
STREAM_MIN, STREAM_MAX = 0.2, 4.0
DRIFT_MIN, DRIFT_MAX = 0.10, 0.30
GROUP = 1  # the trust group every sandbox and the template share
TIMELINE_EVERY = 5  # every 5th footprint sample (0.1 s apart) goes into a regime's timeline
# the wait planner's per-sandbox counts (controlplane/waitplan.py), summed over the sandboxes
PLAN_OUTCOMES = ("fired", "hits", "late", "early", "on_hint", "busy_waits", "endings", "deep",
                 "kept")
# a tool phase's time as the sandbox measured it (seconds: all of it): reading its hot pages
# (where most of its faults are), on a CPU, waiting for one (schedstat); the rest was blocked
TOOL_SPLIT = ("seconds", "pages_s", "cpu_s", "runq_s")
PROBE_S = 0.2  # each of the two timings of the speed probe before every regime
CONTRACT_KEYS = ("tool_mean_s", "tool_p95_s", "e2e_s", "slowdown", "saved_mib", "peak_mib",
                 "keeps", "bad_pages")


class BenchError(RuntimeError):
    """The benchmark cannot go on (the daemon died, never answered, ...)."""


# -- trajectories (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class Cycle:
    """One LLM wait and the tool phase after it."""

    wait_s: float
    work_s: float  # the tool's own work, in seconds of the calibrated work function
    hot: tuple[int, ...]  # pages the tool reads, in order (every 8th one is rewritten)
    new: int  # pages of ``hot`` not in the previous cycle's hot set
    stream_s: float = 0.0  # the last seconds of the wait: the model streams its tool call


def _clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def trajectory(style: str, seed: int, sid: int, cycles: int, npages: int, hot: float = 0.25,
               wait_scale: float = 1.0, wait_median: float = 2.0, wait_sigma: float = 1.0,
               work_median: float = 0.4, work_sigma: float = 0.9,
               stream_median: float = 1.0) -> list[Cycle]:
    """A sandbox's seeded trajectory: waits lognormal clipped to [0.5, 20] s times
    ``wait_scale``, tool work lognormal clipped to [0.1, 5] s, a hot set of ``hot`` of the
    pages that drifts 10-30% each cycle (``ml``: a sequential window that slides; other styles:
    scattered pages, some replaced), and how long before each wait's end the model starts to
    stream its tool call (lognormal around ``stream_median`` s clipped to [0.2, 4] s, at most
    half the wait: a tool call's tens to hundreds of tokens at tens to a few hundred tokens a
    second)."""
    if not 0 < hot <= 0.5:
        raise ValueError("hot must be in (0, 0.5]")
    rng = random.Random(f"trajectory:{style}:{seed}:{sid}")
    # its own stream: the waits, tools and hot sets are the same with or without it
    srng = random.Random(f"stream:{style}:{seed}:{sid}")
    n = max(int(npages * hot), 10)
    lo, hi = math.ceil(DRIFT_MIN * n), math.floor(DRIFT_MAX * n)
    if style == "ml":
        start = rng.randrange(npages)
        cur = [(start + k) % npages for k in range(n)]
    else:
        cur = rng.sample(range(npages), n)
    out: list[Cycle] = []
    for c in range(cycles):
        wait = _clip(rng.lognormvariate(math.log(wait_median), wait_sigma), WAIT_MIN, WAIT_MAX)
        work = _clip(rng.lognormvariate(math.log(work_median), work_sigma), WORK_MIN, WORK_MAX)
        k = 0
        if c > 0:
            k = min(max(round(rng.uniform(DRIFT_MIN, DRIFT_MAX) * n), lo), hi)
            if style == "ml":
                end = cur[-1]
                cur = cur[k:] + [(end + 1 + j) % npages for j in range(k)]
            else:
                drop = set(rng.sample(range(n), k))
                have = set(cur)
                fresh: list[int] = []
                while len(fresh) < k:
                    p = rng.randrange(npages)
                    if p not in have:
                        have.add(p)
                        fresh.append(p)
                kept = [p for j, p in enumerate(cur) if j not in drop]
                # the new pages land among the old ones (a coding agent's scattered reads)
                for p in fresh:
                    kept.insert(rng.randrange(len(kept) + 1), p)
                cur = kept
        w = round(wait * wait_scale, 4)
        stream = min(_clip(srng.lognormvariate(math.log(stream_median), 0.6), STREAM_MIN,
                           STREAM_MAX), w / 2)
        out.append(Cycle(w, round(work, 4), tuple(cur), k, math.floor(stream * 1e4) / 1e4))
    return out


# -- figures (pure) ------------------------------------------------------------------------------


def p95(xs: list[float]) -> float:
    """The 95th percentile, nearest rank (of few samples: the largest)."""
    s = sorted(xs)
    return s[max(math.ceil(0.95 * len(s)) - 1, 0)] if s else 0.0


def regime_figures(tool_s: list[float], e2e_s: float, footprint: list[int], bad_pages: int,
                   majflt: list[int]) -> dict[str, Any]:
    """A regime's own figures; :func:`compare` adds those measured against the run's others."""
    return {
        "tool_mean_s": round(statistics.fmean(tool_s), 4) if tool_s else 0.0,
        "tool_p95_s": round(p95(tool_s), 4),
        "e2e_s": round(e2e_s, 3),
        "footprint_mib": round(statistics.fmean(footprint) / MiB, 2) if footprint else 0.0,
        "peak_mib": round(max(footprint) / MiB, 2) if footprint else 0.0,
        "majflt_per_tool": round(statistics.fmean(majflt), 1) if majflt else 0.0,
        "bad_pages": int(bad_pages),
    }


def compare(regimes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """slowdown (tool mean / none's), saved_mib (none's mean footprint minus this one's) and
    keeps (saved / aggressive's saved, clamped to 0..1), against the same run's regimes."""
    none, agg = regimes.get("none"), regimes.get("aggressive")
    for r in regimes.values():
        r["slowdown"] = (round(r["tool_mean_s"] / none["tool_mean_s"], 3)
                         if none and none["tool_mean_s"] > 0 else None)
        r["saved_mib"] = round(none["footprint_mib"] - r["footprint_mib"], 2) if none else None
    agg_saved = agg["saved_mib"] if agg else None
    for r in regimes.values():
        if agg_saved is None or r["saved_mib"] is None:
            r["keeps"] = None
        elif agg_saved <= 0:
            r["keeps"] = 0.0
        else:
            r["keeps"] = round(_clip(r["saved_mib"] / agg_saved, 0.0, 1.0), 3)
    return regimes


def regime_order(regimes: list[str], rep: int, *, rotate: bool, bracket: bool) -> list[str]:
    """The order repeat ``rep`` runs its regimes in: ``none`` first and, with ``bracket``, again
    last (the baseline on both sides of the others); the others as given or, with ``rotate``,
    moved one place on each repeat, so that each takes each place as often over the repeats."""
    others = [r for r in regimes if r != "none"]
    if rotate and others:
        k = rep % len(others)
        others = others[k:] + others[:k]
    if "none" not in regimes:
        return others
    return ["none", *others, *(["none"] if bracket else [])]


# a baseline run's own figures, kept beside the merged ones
BRACKET_KEYS = ("tool_mean_s", "tool_p95_s", "e2e_s", "footprint_mib", "peak_mib",
                "majflt_per_tool", "bad_pages", "tool_split_s", "template_mib", "pgmajfault",
                "device_io", "started_s", "wall_s", "probe_units_s")


def merge_baseline(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``none`` measured before and after a repeat's other regimes, as one baseline.  Both runs
    play the same trajectories, so the same number of tools: ``tool_mean_s`` is the mean of
    the two means (the mean over both runs' tools); ``tool_p95_s``, ``e2e_s``,
    ``footprint_mib``, ``majflt_per_tool``, ``pgmajfault``, ``template_mib`` and each of
    ``tool_split_s`` are means of the two runs' figures too; ``peak_mib`` is the larger peak,
    ``bad_pages`` both runs' wrong pages, ``wall_s`` both runs' time.  Everything else (the
    timeline, cycles, the device's figures, ``started_s``) is the first run's.  ``bracket``
    keeps each run's own figures and ``drift``, the after run's tool mean over the before
    run's: how far the guest moved while the others ran."""
    out = dict(before)

    def mean(k: str) -> float:
        return round((float(before[k]) + float(after[k])) / 2, 4)

    for k in ("tool_mean_s", "tool_p95_s", "e2e_s", "footprint_mib", "majflt_per_tool",
              "template_mib", "pgmajfault"):
        if k in before and k in after:
            out[k] = mean(k)
    out["peak_mib"] = max(before["peak_mib"], after["peak_mib"])
    out["bad_pages"] = int(before["bad_pages"]) + int(after["bad_pages"])
    if "wall_s" in before and "wall_s" in after:
        out["wall_s"] = round(before["wall_s"] + after["wall_s"], 1)
    sb, sa = before.get("tool_split_s") or {}, after.get("tool_split_s") or {}
    if sb and sa:
        out["tool_split_s"] = {k: round((sb[k] + sa[k]) / 2, 4) for k in sb if k in sa}
    out["bracket"] = {
        "before": {k: before[k] for k in BRACKET_KEYS if k in before},
        "after": {k: after[k] for k in BRACKET_KEYS if k in after},
        "drift": (round(after["tool_mean_s"] / before["tool_mean_s"], 3)
                  if before["tool_mean_s"] > 0 else None),
    }
    return out


def spread(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per host, style and regime: min/median/max of slowdown and keeps over the runs; the
    medians of major faults per tool and of where a tool's time went."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        for name, r in run["regimes"].items():
            groups.setdefault((run["host"], run["style"], name), []).append(r)
    out = []
    for (host, style, name), rs in groups.items():
        row: dict[str, Any] = {"host": host, "style": style, "regime": name, "runs": len(rs),
                               "bad_pages": sum(r["bad_pages"] for r in rs)}
        for k in ("slowdown", "keeps", "saved_mib"):
            xs = [r[k] for r in rs if r.get(k) is not None]
            row[k] = min_med_max(xs)
        row["majflt_per_tool"] = statistics.median(r.get("majflt_per_tool", 0.0) for r in rs)
        splits = [r["tool_split_s"] for r in rs if r.get("tool_split_s")]
        row["tool_split_s"] = {k: statistics.median(sp[k] for sp in splits)
                               for k in TOOL_SPLIT} if splits else {}
        if splits:  # the median of each run's own blocked time, not a difference of medians
            row["tool_split_s"]["blocked_s"] = statistics.median(
                sp["seconds"] - sp["cpu_s"] - sp["runq_s"] for sp in splits)
        brackets = [r["bracket"] for r in rs if r.get("bracket")]
        if brackets:
            row["bracket"] = {
                side: min_med_max([b[side]["tool_mean_s"] for b in brackets])
                for side in ("before", "after")}
            row["bracket"]["drift"] = min_med_max(
                [b["drift"] for b in brackets if b["drift"] is not None])
        out.append(row)
    return out


def print_spread(rows: list[dict[str, Any]]) -> None:
    head = ("host", "style", "regime", "runs", "slowdown min/med/max", "keeps min/med/max",
            "saved MiB min/med/max", "bad pages")
    body = [(r["host"], r["style"], r["regime"], str(r["runs"]), fmt_min_med_max(r["slowdown"]),
             fmt_min_med_max(r["keeps"], pct=True), fmt_min_med_max(r["saved_mib"]),
             str(r["bad_pages"])) for r in rows]
    table("Tool phases through the daemon (spread over runs)", head, body)
    body = [(r["host"], r["style"], str(r["runs"]), fmt_min_med_max(r["bracket"]["before"]),
             fmt_min_med_max(r["bracket"]["after"]), fmt_min_med_max(r["bracket"]["drift"]))
            for r in rows if r.get("bracket")]
    if body:
        table("The baseline (none) before and after each repeat's other regimes",
              ("host", "style", "runs", "tool mean s before", "after", "after / before"), body)

    def split(r: dict[str, Any]) -> tuple[str, ...]:
        sp = r.get("tool_split_s") or {}
        if not sp:
            return ("-",) * 5
        return tuple(f"{x:.3f}" for x in (sp["seconds"], sp["pages_s"], sp["cpu_s"],
                                           sp["runq_s"], sp["blocked_s"]))

    head = ("host", "style", "regime", "major faults", "in sandbox s", "hot pages s", "on CPU s",
            "CPU wait s", "blocked s")
    body = [(r["host"], r["style"], r["regime"], f"{r.get('majflt_per_tool', 0.0):.0f}",
             *split(r)) for r in rows]
    table("Where a tool's time went (medians over runs of each run's mean)", head, body)


# -- in the guest --------------------------------------------------------------------------------

CGROOT = Path("/sys/fs/cgroup")
BENCH_CG = CGROOT / "azphase"


@dataclass
class Config:
    cycles: int = 10
    warmup: int = 3
    hot: float = 0.25
    wait_scale: float = 1.0
    interval: float = 0.25
    reclaim_nice: int = 10
    seed: int = 1
    thp: str = "host"
    daemon_args: list[str] = field(default_factory=list)
    alt_daemon_args: list[str] = field(default_factory=list)  # daemon-alt's, beside those
    daemon_timeout: float = 400.0  # to answer and trace: BPF compiles slowly under TCG
    sync_hints: bool = False  # wait for each hint's answer before going on
    rates: dict[str, float] = field(default_factory=dict)  # work units per second per style


@dataclass
class Host:
    name: str
    sandboxes: int
    pages: int
    stagger: bool


@dataclass
class Box:
    name: str
    cg: Path
    sb: Any  # PageSandbox
    traj: list[Cycle]
    tool_s: list[float] = field(default_factory=list)
    majflt: list[int] = field(default_factory=list)
    cycles: list[dict[str, Any]] = field(default_factory=list)  # per cycle, for the JSON
    bad: int = 0
    error: str = ""


def agent_loop(b: Box, offset: float, client: Any, rate: float, announce: bool = False,
               sync_hints: bool = False) -> None:
    """One sandbox's agent loop: its trajectory's waits and tool phases, with the daemon's
    hints when ``client`` is a DaemonClient (None: no daemon).  A sandbox waiting ``offset``
    seconds for its start is parked first (the ``idle`` hint, as a warm pool's sandbox is).
    A failure is kept in ``b.error`` (the caller fails the regime after the join)."""

    def hint(phase: str) -> None:
        # an agent loop does not wait for the daemon's answer (a failure is read later)
        if sync_hints:
            client.phase(b.name, phase)
        else:
            client.hint(b.name, phase)

    try:
        if client is not None and offset > 0:
            hint("idle")  # spawned ahead of its staggered start: parked
        time.sleep(offset)
        for c in b.traj:
            if client is not None:
                hint("llm-wait")
            end = time.monotonic() + c.wait_s
            if announce:  # the model begins to stream its tool call
                time.sleep(c.wait_s - c.stream_s)
                client.ending(b.name)
            time.sleep(max(0.0, end - time.monotonic()))
            t0 = max(time.monotonic(), end)
            if client is not None:
                hint("tool")
            hint_s = time.monotonic() - t0  # the tool waits for its hint to be sent
            r = b.sb.touch(c.hot, write_every=8, units=max(round(c.work_s * rate), 1))
            b.tool_s.append(time.monotonic() - t0)
            b.majflt.append(int(r["majflt"]))
            b.cycles.append({"wait_s": round(c.wait_s, 3), "work_s": round(c.work_s, 3),
                             "hot": len(c.hot), "tool_s": round(b.tool_s[-1], 4),
                             "majflt": int(r["majflt"]), "t": round(t0, 3),
                             "hint_s": round(hint_s, 4),
                             **{k: round(float(r.get(k, 0.0)), 4) for k in TOOL_SPLIT}})
            b.bad += int(r["bad"])
        if client is not None:
            client.phase(b.name, "idle")  # waits: a hint that failed is known now
            if client.async_errors:
                raise BenchError(f"hints failed: {client.async_errors[:3]}")
    except Exception as e:  # reported after the join: a failed life fails the regime
        b.error = f"{type(e).__name__}: {e}"


def _rel(cg: Path) -> str:
    return "/" + str(cg.relative_to(CGROOT))


def _prefetch_on(args: list[str]) -> bool:
    """Does `azctl daemon ARGS` run the prefetcher (the last of --prefetch/--no-prefetch, else
    the daemon's default)?"""
    flags = [a for a in args if a in ("--prefetch", "--no-prefetch")]
    return flags[-1] == "--prefetch" if flags else PREFETCH


def _tracing(args: list[str]) -> bool:
    """Does `azctl daemon ARGS` run the eBPF fault tracer (a prefetcher learning from faults,
    the last --prefetch-from's, else the daemon's default)?"""
    source = PREFETCH_FROM
    for i, a in enumerate(args):
        if a == "--prefetch-from" and i + 1 < len(args):
            source = args[i + 1]
        elif a.startswith("--prefetch-from="):
            source = a.partition("=")[2]
    return _prefetch_on(args) and source == "faults"


def start_daemon(args: list[str], timeout: float) -> DaemonProcess:
    """The shipped daemon, answering (and its fault tracer tracing, when it has one);
    its log where the host can read it after the guest run ($AZSWAP_OUT/phase-daemon-logs/)."""
    logs = Path(os.environ.get("AZSWAP_OUT", tempfile.gettempdir())) / "phase-daemon-logs"
    d = DaemonProcess(*args, log_path=logs / f"daemon-{time.strftime('%H%M%S')}-{os.getpid()}.log")
    try:
        d.wait_ready(timeout=timeout, tracing=_tracing(args))
    except DaemonError as e:
        with contextlib.suppress(DaemonError):
            d.stop()
        raise BenchError(str(e)) from None
    return d


def stop_daemon(d: DaemonProcess) -> None:
    """SIGTERM; a daemon that had died, does not stop or exits non-zero is an error."""
    try:
        rc = d.stop()
    except DaemonError as e:
        raise BenchError(str(e)) from None
    finally:
        shutil.rmtree(d.dir, ignore_errors=True)
    if rc != 0:
        raise BenchError(f"the daemon exited with status {rc} on SIGTERM:\n{d.log_tail()}")


@contextlib.contextmanager
def _module_registrations(template: Path, boxes: list[Box]) -> Iterator[None]:
    """The aggressive regime's registrations, straight to the module (no daemon runs)."""
    from controlplane.netlink import AzswapNetlink

    with AzswapNetlink() as nl:
        tid = nl.template_add(GROUP, cgroup_path=_rel(template))
        from bench.kit import cgroups

        cgroups.reclaim_all(template)
        ids = [nl.sandbox_add(GROUP, cgroup_path=_rel(b.cg)) for b in boxes]
        try:
            yield
        finally:
            for cid in ids:
                with contextlib.suppress(Exception):
                    nl.sandbox_del(cid)
            with contextlib.suppress(Exception):
                nl.template_del(tid)


def run_regime(regime: str, host: Host, style: str, cfg: Config, dev: Any,
               rep: int, label: str = "") -> dict[str, Any]:
    from bench.kit import cgroups
    from bench.pagesandbox import PageSandbox
    from controlplane.priority import lowered_priority

    tag = f"{regime[:3]}-{host.name[:4]}-{style}-{rep}{label}"
    parent = BENCH_CG / tag
    names = ["template"] + [f"sb{i}" for i in range(host.sandboxes)]
    cgs = cgroups.make_tree(parent, names)
    seed = cfg.seed * 1000 + rep
    rate = cfg.rates.get(style, 1.0)
    template = PageSandbox(cgs["template"], host.pages, seed, style=style, sid=0, thp=cfg.thp)
    boxes: list[Box] = []
    daemon: DaemonProcess | None = None
    out: dict[str, Any] = {}
    try:
        for i in range(host.sandboxes):
            sb = PageSandbox(cgs[f"sb{i}"], host.pages, seed, style=style, sid=i + 1,
                             thp=cfg.thp)
            traj = trajectory(style, seed, i + 1, cfg.cycles, host.pages, cfg.hot, cfg.wait_scale)
            boxes.append(Box(f"{tag}-sb{i}", cgs[f"sb{i}"], sb, traj))
        stop = threading.Event()
        footprint: list[int] = []
        timeline: list[list[float]] = []  # [monotonic s, device MiB, each sandbox's MiB...]
        # beside it, what the device's MiB are: [monotonic s, payload, pool, metadata]
        device_timeline: list[list[float]] = []
        device_start = dev.stats()
        template_mem: list[int] = []
        events: list[dict[str, Any]] = []

        sampler_error: list[str] = []

        def sampler() -> None:
            try:
                while not stop.is_set():
                    each = [cgroups.of(b.cg).memory_current() for b in boxes]
                    ds = dev.stats()
                    used = dev.used_bytes(ds)
                    footprint.append(sum(each) + used)
                    if len(footprint) % TIMELINE_EVERY == 1:
                        now = round(time.monotonic(), 2)
                        timeline.append([now, round(used / MiB, 2),
                                         *(round(m / MiB, 2) for m in each)])
                        device_timeline.append([now, *(round(ds.get(k, 0) / MiB, 2)
                                                       for k in ("payload", "pool", "meta"))])
                    template_mem.append(cgroups.of(cgs["template"]).memory_current())
                    stop.wait(0.1)
            except Exception as e:  # a footprint with a hole in it is no figure: fail the run
                sampler_error.append(f"{type(e).__name__}: {e}")

        def aggressive() -> None:
            while not stop.is_set():
                for b in boxes:
                    # lowered for the write only, as the daemon's scheduler does: this process's
                    # sandbox lives must not wait for a preempted thread holding the GIL
                    with lowered_priority(cfg.reclaim_nice):
                        cgroups.of(b.cg).reclaim(1 << 30)
                stop.wait(cfg.interval)

        client_for: Any = None
        regs: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if regime.startswith("daemon"):
            from controlplane.client import DaemonClient

            args = cfg.daemon_args + (cfg.alt_daemon_args if regime in ALT_REGIMES else [])
            daemon = start_daemon(args, cfg.daemon_timeout)
            out["daemon"] = {"ready_s": round(daemon.ready_s, 1),
                             "start_cpu_s": daemon.cpu_seconds()}
            print(f"  daemon ready in {daemon.ready_s:.1f}s", flush=True)
            sock = daemon.socket
            try:
                with DaemonClient(sock, timeout=120) as c:
                    c.template_add(f"{tag}-template", GROUP, _rel(cgs["template"]))
                    cgroups.reclaim_all(cgs["template"])  # its pages become the bases
                    for b in boxes:
                        c.register(b.name, cgroup=_rel(b.cg), group=GROUP,
                                   template=f"{tag}-template")
            except Exception as e:
                raise BenchError(f"registering with the daemon: {e}\n{daemon.log_tail()}") from e

            def client_for() -> Any:
                return DaemonClient(sock, timeout=120)

            def listen() -> None:
                with contextlib.suppress(Exception):
                    for ev in DaemonClient(sock).subscribe():
                        if ev.get("event") in ("prefetch", "compress", "compressed"):
                            events.append(ev)
                        if stop.is_set():
                            return

            threading.Thread(target=listen, daemon=True).start()
        elif regime == "aggressive":
            regs = _module_registrations(cgs["template"], boxes)

        announce = regime.endswith("-stream")

        def life(b: Box, offset: float) -> None:
            client = client_for() if client_for is not None else None
            try:
                agent_loop(b, offset, client, rate, announce=announce,
                           sync_hints=cfg.sync_hints)
            finally:
                if client is not None:
                    client.close()

        with regs:
            helpers = [threading.Thread(target=sampler, daemon=True)]
            if regime == "aggressive":
                helpers.append(threading.Thread(target=aggressive, daemon=True))
            mean_wait = statistics.fmean(c.wait_s for b in boxes for c in b.traj)
            lives = [threading.Thread(target=life, args=(b, i * mean_wait / len(boxes)
                                                         if host.stagger else 0.0))
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
            if sampler_error:
                raise BenchError(f"the footprint sampler failed: {sampler_error[0]}")
            errs = [f"{b.name}: {b.error}" for b in boxes if b.error]
            if errs:
                tail = daemon.log_tail() if daemon is not None else ""
                raise BenchError("a sandbox's life failed: " + "; ".join(errs) + "\n" + tail)
            if daemon is not None:
                try:
                    daemon.check()
                except DaemonError as e:
                    raise BenchError(str(e)) from None
            # the device as the cycles left it (before the read-back below), metadata by
            # component (meta_stat)
            out["device_end"] = dev.stats()
            # what the device did in this regime: pages stored and loaded, slots freed by swap
            out["device_io"] = {f"io_{k}": out["device_end"].get(f"io_{k}", 0)
                                - device_start.get(f"io_{k}", 0) for k in IO_COUNTERS}
            bad = sum(b.bad for b in boxes) + sum(b.sb.verify() for b in boxes)
        tool = [s for b in boxes for s in b.tool_s[cfg.warmup:]]
        maj = [m for b in boxes for m in b.majflt[cfg.warmup:]]
        out = {**regime_figures(tool, e2e, footprint, bad, maj), **out}
        counted = [c for b in boxes for c in b.cycles[cfg.warmup:]]
        out["tool_split_s"] = {k: round(statistics.fmean(float(c.get(k, 0.0)) for c in counted), 4)
                               for k in TOOL_SPLIT} if counted else {}
        out["template_mib"] = (round(statistics.fmean(template_mem) / MiB, 2)
                               if template_mem else 0.0)
        out["pgmajfault"] = sum(cgroups.stat(b.cg).get("pgmajfault", 0) for b in boxes)
        out["cycles"] = {b.name: b.cycles for b in boxes}  # "t": a tool phase's start
        out["timeline"] = timeline
        out["device_timeline"] = device_timeline
        if daemon is not None:
            out["daemon"]["cpu_s"] = daemon.cpu_seconds()
            out["daemon"]["threads_cpu_s"] = daemon.thread_cpu_seconds()
            pf = [e for e in events if e.get("event") == "prefetch"]
            out["daemon"]["planned"] = sum(bool(e.get("planned")) for e in pf)
            out["daemon"]["prefetch_events"] = len(pf)
            pages = [(e.get("result") or {}).get("prefetched_pages", 0) for e in pf]
            out["daemon"]["prefetched_pages"] = sum(p for p in pages if isinstance(p, int))
            from controlplane.client import DaemonClient

            out["daemon"]["run_cpu_s"] = round(out["daemon"]["cpu_s"]
                                               - out["daemon"]["start_cpu_s"], 2)
            try:
                with DaemonClient(daemon.socket, timeout=120) as c:
                    sts = [c.stats(b.name) for b in boxes]
                    out["daemon"]["plan"] = {k: sum(int(st["phase"]["plan"].get(k) or 0)
                                                    for st in sts)
                                             for k in PLAN_OUTCOMES}
                    # CPU of the scheduler's memory.reclaim writes (the compression itself)
                    out["daemon"]["compress_cpu_s"] = round(
                        sum(float(st.get("compress", {}).get("total_cpu") or 0) for st in sts), 2)
                    out["daemon"]["ops"] = c.stats().get("ops", {})  # service times
                    for b in boxes:
                        c.unregister(b.name)
                    c.template_rm(f"{tag}-template")
            except Exception as e:
                raise BenchError(f"unregistering: {e}\n{daemon.log_tail()}") from e
            stop_daemon(daemon)
            daemon = None
        return out
    finally:
        if daemon is not None:
            with contextlib.suppress(BenchError):
                stop_daemon(daemon)
        for b in boxes:
            b.sb.stop()
        template.stop()
        cgroups.remove_tree(parent)


def run_all(ns: argparse.Namespace, cfg: Config, dev: Any) -> list[dict[str, Any]]:
    from bench.pagesandbox import calibrate

    hosts = {
        "idle": Host("idle", ns.sandboxes, ns.pages, True),
        "loaded": Host("loaded", ns.loaded_sandboxes, ns.loaded_pages, False),
    }
    for style in ns.styles:
        if style not in cfg.rates:  # --rates pins it: the same work in every boot
            cfg.rates[style] = round(calibrate(style), 1)
    print(f"swap device {dev.name}; THP {cfg.thp} (host: {thp_setting()}); "
          f"work units/s {cfg.rates}; wait scale {cfg.wait_scale}", flush=True)
    runs: list[dict[str, Any]] = []
    for rep in range(ns.repeat):
        for h in ns.hosts:
            for style in ns.styles:
                host = hosts[h]
                order = regime_order(ns.regimes, rep, rotate=ns.order == "rotate",
                                     bracket=ns.baseline == "bracket")
                run: dict[str, Any] = {"host": h, "style": style, "repeat": rep,
                                       "sandboxes": host.sandboxes, "pages": host.pages,
                                       "order": order, "regimes": {}}
                done: dict[str, dict[str, Any]] = {}
                t_run = time.monotonic()
                for regime in order:
                    again = regime in done  # the baseline's second run
                    print(f"[{h} {style} #{rep}] {regime}{' (after)' if again else ''}: "
                          f"{host.sandboxes} sandboxes x {host.pages * 4 // 1024} MiB",
                          flush=True)
                    # the guest's speed just before: the style's work, as calibrated at start
                    probe = calibrate(style, seconds=PROBE_S, samples=2)
                    t = time.monotonic()
                    r = run_regime(regime, host, style, cfg, dev, rep, "-after" if again else "")
                    r["probe_units_s"] = round(probe, 1)
                    r["wall_s"] = round(time.monotonic() - t, 1)
                    r["started_s"] = round(t - t_run, 1)  # since the repeat's first regime
                    print("  " + json.dumps(r), flush=True)
                    done[regime] = merge_baseline(done[regime], r) if again else r
                run["regimes"] = {name: done[name] for name in ns.regimes}
                compare(run["regimes"])
                runs.append(run)
    return runs


def thp_setting() -> str:
    p = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    with contextlib.suppress(OSError):
        s = p.read_text()
        return s[s.index("[") + 1 : s.index("]")]
    return "unavailable"


def _list(choices: tuple[str, ...]) -> Any:
    def parse(s: str) -> list[str]:
        xs = [x for x in s.split(",") if x]
        bad = [x for x in xs if x not in choices]
        if bad or not xs:
            raise argparse.ArgumentTypeError(f"{s!r}: a comma list of {', '.join(choices)}")
        if len(set(xs)) != len(xs):
            raise argparse.ArgumentTypeError(f"{s!r}: each at most once")
        return xs

    return parse


def _rates(s: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in (x for x in s.split(",") if x):
        style, _, value = item.partition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = 0.0
        if style not in STYLES or not rate > 0:
            raise argparse.ArgumentTypeError(
                f"{item!r}: STYLE=UNITS with STYLE one of {', '.join(STYLES)} and UNITS > 0")
        out[style] = rate
    return out


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None
    ap = argparse.ArgumentParser(prog="phasebench", description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    cpus = os.cpu_count() or 1
    ap.add_argument("--hosts", type=_list(HOSTS), default=list(HOSTS))
    ap.add_argument("--styles", type=_list(STYLES), default=list(STYLES))
    ap.add_argument("--regimes", type=_list(REGIMES),
                    default=[r for r in REGIMES if r not in ALT_REGIMES],
                    help="default: all but daemon-alt and daemon-alt-stream")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every host and style")
    ap.add_argument("--baseline", choices=("bracket", "first"), default="bracket",
                    help="bracket: none runs before and again after a repeat's other regimes "
                         "and counts as the mean of both (a steady drift of the guest during a "
                         "repeat then no longer weighs on the regimes run last alone; the JSON "
                         "keeps both runs and their drift); first: none once, before the others")
    ap.add_argument("--order", choices=("rotate", "fixed"), default="rotate",
                    help="rotate: the regimes other than none move one place each repeat (over "
                         "a multiple of their number of repeats, each runs in each place "
                         "equally often); fixed: as --regimes gives them (none always first)")
    ap.add_argument("--sandboxes", type=int, default=4, help="sandboxes on the idle host")
    ap.add_argument("--loaded-sandboxes", type=int, default=2 * cpus + 2,
                    help="sandboxes on the loaded host (default: 2 x CPUs + 2)")
    ap.add_argument("--pages", type=int, default=4096, help="pages per sandbox, idle host")
    ap.add_argument("--loaded-pages", type=int, default=2048, help="pages per sandbox, loaded")
    ap.add_argument("--hot", type=float, default=0.25, help="fraction touched per tool phase")
    ap.add_argument("--cycles", type=int, default=10,
                    help="LLM waits and tool phases per sandbox")
    ap.add_argument("--warmup", type=int, default=3,
                    help="first cycles left out of tool latency (every regime alike: the "
                         "daemon learns the waits and working sets in them)")
    ap.add_argument("--wait-scale", type=float, default=1.0,
                    help="factor on every LLM wait (below 1: a quicker, easier run)")
    ap.add_argument("--interval", type=float, default=0.25, help="aggressive: reclaim period")
    ap.add_argument("--thp", choices=("host", "off"), default="host",
                    help="host: transparent huge pages as the host has them; off: not for the "
                         "sandboxes' pages (an easier setting, report it as such)")
    ap.add_argument("--daemon-arg", action="append", default=[], metavar="ARG",
                    help="an option for `azctl daemon` (repeat; e.g. --daemon-arg=--grace=0.1)")
    ap.add_argument("--alt-daemon-arg", action="append", default=[], metavar="ARG",
                    help="an option for the daemon-alt regimes' daemon only (repeat)")
    ap.add_argument("--rates", type=_rates, default={}, metavar="STYLE=UNITS,...",
                    help="work units per second per style instead of calibrating them at the "
                         "start (the same work in every boot; the JSON's config.rates)")
    ap.add_argument("--daemon-timeout", type=float, default=400.0,
                    help="seconds to wait for the daemon to answer (and, with --prefetch-from "
                         "faults, for its fault tracer: its BPF program compiles in tens of "
                         "seconds under TCG)")
    ap.add_argument("--sync-hints", action="store_true",
                    help="wait for the daemon's answer to each phase hint before going on "
                         "(default: send it and go on, as an agent loop on its hot path)")
    ap.add_argument("--swap", choices=("azswap-lz4", "azswap-lz4-cached"), default="azswap-lz4",
                    help="the swap device: azswap-lz4-cached loads the module with swap_cache=1")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path,
                    default=Path(os.environ.get("AZSWAP_OUT", "/tmp")) / "phase.json")
    ns = ap.parse_args(argv)
    others = len([r for r in ns.regimes if r != "none"])
    if ns.order == "rotate" and others > 1 and ns.repeat % others:
        print(f"phasebench: note: --repeat {ns.repeat} is not a multiple of the {others} "
              "regimes besides none: they do not take each place in the order equally often",
              file=sys.stderr)
    if not 0 < ns.wait_scale <= 1:
        ap.error("--wait-scale must be in (0, 1]")
    if ns.cycles <= ns.warmup:
        ap.error("--cycles must exceed --warmup")
    if os.geteuid() != 0:
        print("phasebench: error: must run as root (in the guest: vm-tests/run)", file=sys.stderr)
        return 1
    from bench.kit.swapdev import SwapDevError, swap_device

    cfg = Config(cycles=ns.cycles, warmup=ns.warmup, hot=ns.hot, wait_scale=ns.wait_scale,
                 interval=ns.interval, seed=ns.seed, thp=ns.thp, daemon_args=ns.daemon_arg,
                 alt_daemon_args=ns.alt_daemon_arg, rates=dict(ns.rates),
                 sync_hints=ns.sync_hints,
                 daemon_timeout=ns.daemon_timeout)
    t0 = time.monotonic()
    try:
        with swap_device(ns.swap, 1 << 30) as dev:
            runs = run_all(ns, cfg, dev)
    except (SwapDevError, BenchError) as e:
        print(f"phasebench: error: {e}", file=sys.stderr)
        return 1
    doc = {"runs": runs, "swap": ns.swap,
           "baseline": ns.baseline if "none" in ns.regimes else None, "order": ns.order,
           "thp": ns.thp, "thp_host": thp_setting(),
           "cpus": cpus, "wait_scale": ns.wait_scale,
           "config": {k: v for k, v in asdict(cfg).items() if k != "daemon_timeout"},
           "wall_s": round(time.monotonic() - t0, 1)}
    ns.json.parent.mkdir(parents=True, exist_ok=True)
    ns.json.write_text(json.dumps(doc, indent=1))
    rows = spread(runs)
    print()
    print_spread(rows)
    print_shortfall(runs)
    print(f"JSON: {ns.json}")
    bad = sum(r["bad_pages"] for r in rows)
    if bad:
        print(f"phasebench: error: {bad} pages read back wrong", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
