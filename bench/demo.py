"""`make demo`: an agent fan-out in a QEMU guest, azswap against zram and zswap, measured now.

    python -m bench.demo [--sandboxes 8] [--seed 1] [--size small] [--memory 3G]
        [--systems none,zram-lz4,zram-zstd,zswap-lz4,azswap-lz4,azswap-zstd] [--no-phase]

1. On the host: a template Python process with ML memory (model weights, optimizer state, a
   tokenized dataset, a warmed interpreter) forks --sandboxes sandboxes, each running its own
   training/inference trajectory until it waits for the LLM; their private pages are recorded
   (bench.record), so every system sees exactly the same pages.
2. In one boot of the test kernel (vm-tests/run): the pages are played into live processes in
   their own memory cgroups and pushed to swap with memory.reclaim on each system in turn, then
   faulted back and verified (bench.swapbench); then sandboxes started from a template
   alternate tool phases and LLM waits on an idle host, with no compression, aggressive
   compression blind to phases, and the shipped daemon (`azctl daemon` as installed: phase
   hints and its scheduler) (bench.phasebench, small sizes).
3. Two tables of what was measured in this run: sandbox-owned memory, bytes stored, the
   metadata spent on them, the net reduction (owned / (stored + metadata)) and its ratio to
   zram-lz4's; tool-phase slowdown and memory saved per regime.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

TOP = Path(__file__).resolve().parent.parent
OUT = TOP / "vm-tests" / "out" / "demo"
DEFAULT_SYSTEMS = "none,zram-lz4,zram-zstd,zswap-lz4,azswap-lz4"
MiB = float(1 << 20)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="make demo DEMO_ARGS=...",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sandboxes", type=int, default=8, help="sandboxes forked from the template")
    ap.add_argument("--seed", type=int, default=1, help="seed of every trajectory")
    ap.add_argument("--size", default="small", choices=("small", "default"),
                    help="template size (small: ~20 MiB model + data)")
    ap.add_argument("--memory", default="3G", help="guest memory")
    ap.add_argument("--systems", default=DEFAULT_SYSTEMS, help="systems compared (comma list)")
    ap.add_argument("--no-phase", action="store_true", help="skip the tool-phase slowdown part")
    ap.add_argument("--timeout", type=float, default=1800, help="guest time limit, seconds")
    a = ap.parse_args(argv)
    if not 1 <= a.sandboxes <= 64:
        ap.error("--sandboxes must be 1..64")
    return a


def _record(a: argparse.Namespace, console: Console) -> Path:
    from bench.record import run_and_record

    OUT.mkdir(parents=True, exist_ok=True)
    trace = OUT / f"fork-n{a.sandboxes}-s{a.seed}-{a.size}.aztrace"
    if trace.exists():
        console.print(f"[dim]reusing {trace.relative_to(TOP)} (same size and seed)[/dim]")
        return trace
    with console.status(f"recording a template + {a.sandboxes} forked sandboxes on the host"):
        run_and_record("fork", a.sandboxes, a.size, a.seed, str(trace),
                       log=lambda m: console.print(f"[dim]{m}[/dim]"))
    return trace


def _guest(a: argparse.Namespace, trace: Path, console: Console) -> int:
    py = sys.executable
    steps = [
        f"{py} -m bench.swapbench --trace {trace} --systems {a.systems} "
        f"--json {OUT / 'swapbench.json'}",
    ]
    if not a.no_phase:
        steps.append(
            f"{py} -m bench.phasebench --hosts idle --styles ml "
            f"--regimes none,aggressive,daemon "
            f"--sandboxes {min(a.sandboxes, 4)} --pages 2048 --cycles 6 --warmup 2 "
            f"--wait-scale 0.5 "
            f"--seed {a.seed} --json {OUT / 'phasebench.json'}"
        )
    for name in ("swapbench.json", "phasebench.json"):
        (OUT / name).unlink(missing_ok=True)
    cmd = [str(TOP / "vm-tests" / "run"), "--memory", a.memory, "--timeout", str(a.timeout),
           "--", "sh", "-c", " && ".join(steps)]
    log_path = OUT / "guest.log"
    with log_path.open("w") as log, Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
        console=console, transient=True,
    ) as progress:
        task = progress.add_task("booting the test kernel (QEMU)", total=None)
        proc = subprocess.Popen(cmd, cwd=TOP, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            text = line.strip()
            if text.startswith("[") and "]" in text:
                progress.update(task, description=f"guest: {text[:110]}")
            elif text.startswith("vm-tests/run:"):
                console.print(text)
        rc = proc.wait()
    console.print(f"[dim]guest log: {log_path.relative_to(TOP)}[/dim]")
    return rc


def _memory_table(sw: dict[str, Any]) -> Table:
    t = Table(title="Sandbox-owned memory pushed to swap (same pages on every system, one guest)")
    for col in ("system", "owned MiB", "stored MiB", "metadata MiB", "net reduction",
                "vs zram-lz4", "swap-in MB/s", "load p99 µs", "every page verified"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for run in sw.get("runs", []):
        res = run["results"]
        base = next((r for r in res if r["system"] == "zram-lz4" and r.get("net_ratio")), None)
        for r in res:
            if "error" in r:
                t.add_row(r["system"], *[""] * 7, f"[red]error: {r['error'][:50]}")
                continue
            rel = net = meta = "-"
            if "net_ratio" in r:
                net = f"{r['net_ratio']:.2f}x"
                meta = f"{r['meta_bytes'] / MiB:.2f}"
                if base:
                    rel = f"{r['net_ratio'] / base['net_ratio']:.2f}x"
            ok = "[green]yes" if r.get("ok") else "[red]NO"
            t.add_row(
                r["system"], f"{r['owned_bytes'] / MiB:.1f}", f"{r['stored_bytes'] / MiB:.1f}",
                meta, net, rel, f"{r.get('swapin_mbps', 0):.1f}",
                f"{r.get('load_p99_us', 0):.0f}", ok,
            )
    return t


def _phase_table(ph: dict[str, Any]) -> Table:
    run = (ph.get("runs") or [{}])[0]
    t = Table(title=f"Tool phases after LLM waits ({run.get('host', '?')} host, "
                    f"{run.get('style', '?')} style, {run.get('sandboxes', '?')} sandboxes from "
                    f"one template, swap {ph.get('swap', '?')}, THP {ph.get('thp', '?')}; "
                    "against no compression, same run)")
    for col in ("regime", "tool mean ms", "tool p95 ms", "slowdown", "memory MiB (peak)",
                "saved MiB", "keeps", "major faults / tool phase", "pages verified"):
        t.add_column(col, justify="left" if col == "regime" else "right")
    labels = {"none": "no compression", "aggressive": "aggressive, blind to phases",
              "daemon": "azctl daemon (phase hints, scheduler, kept working sets)",
              "daemon-stream": "azctl daemon, tool-call streaming announced (ending)"}
    for key, label in labels.items():
        m = run.get("regimes", {}).get(key)
        if not m:
            continue
        slow, keeps = m.get("slowdown"), m.get("keeps")
        t.add_row(label, f"{m['tool_mean_s'] * 1e3:.0f}", f"{m['tool_p95_s'] * 1e3:.0f}",
                  f"{slow:.2f}x" if slow else "-",
                  f"{m['footprint_mib']:.1f} ({m['peak_mib']:.1f})", f"{m['saved_mib']:.1f}",
                  f"{keeps:.0%}" if keeps is not None and key != "none" else "-",
                  f"{m['majflt_per_tool']:.1f}",
                  "[green]yes" if m.get("bad_pages") == 0 else f"[red]{m.get('bad_pages')} bad")
    return t


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    console = Console(width=max(120, Console().width))
    if os.geteuid() != 0:
        console.print("demo: needs root (QEMU guest set-up and apt)", style="red")
        return 1
    start = time.monotonic()
    trace = _record(a, console)
    rc = _guest(a, trace, console)
    sw_path, ph_path = OUT / "swapbench.json", OUT / "phasebench.json"
    if sw_path.exists():
        console.print(_memory_table(json.loads(sw_path.read_text())))
    if ph_path.exists():
        console.print(_phase_table(json.loads(ph_path.read_text())))
    console.print(f"[dim]measured in this run, {time.monotonic() - start:.0f}s; raw results in "
                  f"{OUT.relative_to(TOP)}/[/dim]")
    if rc != 0 or not sw_path.exists():
        console.print(f"demo: the guest run failed (exit {rc}); see vm-tests/out/demo/guest.log",
                      style="red")
        return rc or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
