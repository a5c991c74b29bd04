"""Where a phase-aware regime's memory saving falls short of blind aggressive compression's.

    python -m bench.phaseloss bench-report/phase.json

The phase benchmark (bench/phasebench.py) keeps each regime's footprint timeline (every 0.5 s:
the device's MiB and each sandbox's memory.current) and each sandbox's cycles (a tool phase
starts at ``t`` after a wait of ``wait_s`` and lasts ``tool_s``).  This splits the time-averaged
footprint into what the device holds and what the sandboxes hold in their waits, in their tool
phases and outside their cycles (before the first wait, after the last tool), and subtracts
aggressive's split of the same run: the MiB by which the regime keeps less.  ``keeps`` is the
benchmark's own figure; ``keeps_if_waits_free`` is keeps plus what the regime's waits held
beyond aggressive's (a share of aggressive's saving; nothing when they held less): what it would
reach if its waits held no more than aggressive's, the rest unchanged, i.e. the most any wait
policy can reach while tool phases and the device stay as they are.  Where the regimes kept a
``device_timeline``, "of which pool overhead" is the part of the device's extra that is the
allocator's overhead (pool minus payload: size-class rounding, object handles and free space in
partly used pages that compaction has not given back yet).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.kit.table import fmt_min_med_max, min_med_max, table

PARTS = ("device", "tool", "wait", "outside")


@dataclass(frozen=True)
class Split:
    """Time-averaged MiB of a footprint timeline, by where each sandbox was."""

    device: float
    tool: float
    wait: float
    outside: float

    def minus(self, other: Split) -> Split:
        return Split(*(getattr(self, k) - getattr(other, k) for k in PARTS))


def phase_split(regime: dict[str, Any]) -> Split:
    """The regime's timeline split by phase (its sandboxes' columns in the order of its
    ``cycles``).  ValueError without a timeline."""
    timeline = regime.get("timeline") or []
    if not timeline:
        raise ValueError("no footprint timeline in this regime")
    cycles = list(regime["cycles"].values())
    sums = dict.fromkeys(PARTS, 0.0)
    for row in timeline:
        t = row[0]
        sums["device"] += row[1]
        for i, cy in enumerate(cycles):
            where = "outside"
            for c in cy:
                if c["t"] - c["wait_s"] <= t < c["t"]:
                    where = "wait"
                    break
                if c["t"] <= t < c["t"] + c["tool_s"]:
                    where = "tool"
                    break
            sums[where] += row[2 + i]
    return Split(**{k: v / len(timeline) for k, v in sums.items()})


def pool_overhead(regime: dict[str, Any]) -> float | None:
    """Time-averaged MiB of the device's pool beyond its payload; None without a
    ``device_timeline`` (rows: time, payload, pool, metadata)."""
    rows = regime.get("device_timeline") or []
    return statistics.fmean(r[2] - r[1] for r in rows) if rows else None


def shortfall(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per regime of one run other than none and aggressive: its extra MiB over aggressive's
    by part, its keeps, and its keeps if its waits cost what aggressive's do.  Empty without
    an aggressive regime with a saving to compare with."""
    regimes = run["regimes"]
    agg = regimes.get("aggressive")
    if not agg or not agg.get("saved_mib") or agg["saved_mib"] <= 0:
        return []
    base = phase_split(agg)
    out = []
    for name, r in regimes.items():
        if name in ("none", "aggressive") or not r.get("timeline"):
            continue
        extra = phase_split(r).minus(base)
        keeps = r.get("keeps")
        # what its waits held beyond aggressive's, given back (a wait part below aggressive's
        # gives nothing: it already counts in keeps)
        free = (None if keeps is None
                else min(1.0, keeps + max(extra.wait, 0.0) / agg["saved_mib"]))
        h, h_agg = pool_overhead(r), pool_overhead(agg)
        out.append({"host": run["host"], "style": run["style"], "regime": name,
                    "keeps": keeps, "extra_mib": asdict(extra), "keeps_if_waits_free": free,
                    "extra_pool_overhead_mib": (None if h is None or h_agg is None
                                                else h - h_agg)})
    return out


def spread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per host, style and regime over runs: the median extra MiB by part, and min/median/max
    of keeps and of keeps_if_waits_free."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["host"], r["style"], r["regime"]), []).append(r)
    out = []
    for (host, style, name), rs in groups.items():
        row: dict[str, Any] = {"host": host, "style": style, "regime": name, "runs": len(rs)}
        row["extra_mib"] = {k: statistics.median(r["extra_mib"][k] for r in rs) for k in PARTS}
        # over the same runs as the device's part, or not at all
        hs = [r.get("extra_pool_overhead_mib") for r in rs]
        row["extra_pool_overhead_mib"] = None if None in hs else statistics.median(hs)
        for k in ("keeps", "keeps_if_waits_free"):
            xs = [r[k] for r in rs if r.get(k) is not None]
            row[k] = min_med_max(xs)
        out.append(row)
    return out


def print_shortfall(runs: list[dict[str, Any]]) -> None:
    """The spread table of every run's shortfall (a run without timelines is left out)."""
    found = []
    for run in runs:
        try:
            found += shortfall(run)
        except ValueError as e:
            print(f"shortfall of {run.get('host')} {run.get('style')}: {e}")
    rows = spread(found)
    if not rows:
        return

    head = ("host", "style", "regime", "device MiB", "of which pool overhead", "tool MiB",
            "wait MiB", "outside MiB", "keeps min/med/max", "if waits free")
    body = [(r["host"], r["style"], r["regime"], f"{r['extra_mib']['device']:+.1f}",
             ("-" if r["extra_pool_overhead_mib"] is None
              else f"{r['extra_pool_overhead_mib']:+.1f}"),
             *(f"{r['extra_mib'][k]:+.1f}" for k in PARTS[1:]),
             fmt_min_med_max(r["keeps"], pct=True),
             fmt_min_med_max(r["keeps_if_waits_free"], pct=True)) for r in rows]
    table("What each regime holds beyond aggressive, time-averaged (medians over runs)",
          head, body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.phaseloss", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path, help="a phase benchmark's JSON (--json, phase.json)")
    ns = ap.parse_args(argv)
    try:
        doc = json.loads(ns.json.read_text())
        runs = doc["runs"]
        print_shortfall(runs)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"phaseloss: {ns.json}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
