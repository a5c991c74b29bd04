"""Free page reporting's effect on recorded microVMs, apart from compression: the same guests
recorded without and with a virtio-balloon that reports free pages, both replayed through the
host store core.

    python -m bench.microvm_reporting [--n 8] [--task-mode inproc] [--page-reporting-order N]
        [--out DIR] [--reuse] [--json OUT]

Records DIR/off and DIR/on with vm-tests/microvm/record.py (one template snapshot and N guests each;
`off` with --no-free-page-reporting, `on` with the balloon reporting free pages, so the template's
free blocks are reported before its snapshot and each guest's at its LLM wait), unless --reuse finds
both recordings with the settings asked for. Then, per recording: the template's non-zero pages (the
snapshot image), the guests' non-zero RAM, their owned pages (differing from the template) and how
many of those hold data, and per strategy (per-page lz4 and zstd: what zram stores per page; `all`
and `all-packed`: azswap's store) what the host spends on the fleet with the image reclaimed into
swap: the image's pages and the guests' owned pages stored, metadata included. "reporting alone"
compares the owned pages that hold data, "with compression" what the host spends. Host only apart
from the recordings (QEMU TCG guests, not the test kernel's guest).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from controlplane.trace import read_trace
from controlplane.trace import replay as rp
from controlplane.trace.format import PAGE_SIZE as PAGE

TOP = Path(__file__).resolve().parents[1]
RECORDER = TOP / "vm-tests" / "microvm" / "record.py"
STRATEGIES = ("lz4", "zstd", "all", "all-packed")
MiB = 2**20


def recorder_args(out: Path, n: int, task_mode: str, reporting: bool,
                  order: int | None) -> list[str]:
    args = [sys.executable, str(RECORDER), "--n", str(n), "--task-mode", task_mode,
            "--out", str(out)]
    if not reporting:
        return [*args, "--no-free-page-reporting"]
    args.append("--free-page-reporting")
    if order is not None:
        args += ["--page-reporting-order", str(order)]
    return args


def matches(out: Path, n: int, task_mode: str, reporting: bool, order: int | None) -> bool:
    """An earlier recording in @out made with these settings."""
    try:
        m = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return ((out / "microvm.aztrace").exists() and m.get("n") == n
            and m.get("task_mode") == task_mode
            and bool(m.get("free_page_reporting")) == reporting
            and m.get("page_reporting_order") == (order if reporting else None))


def measure(out: Path) -> dict[str, Any]:
    """Page counts of one recording and what each strategy makes of its trace."""
    m = json.loads((out / "manifest.json").read_text())
    guests = [g["info"] for g in m["guests"]]
    owned = sum(g["owned_pages"] for g in guests)
    owned_zero = sum(g["owned_zero_pages"] for g in guests)
    tr = read_trace(out / "microvm.aztrace")
    row: dict[str, Any] = {
        "dir": str(out),
        "n": m["n"],
        "free_page_reporting": bool(m.get("free_page_reporting")),
        "page_reporting_order": m.get("page_reporting_order"),
        "template_nonzero_bytes": m["template_nonzero_pages"] * PAGE,
        "guest_nonzero_bytes": sum(g["nonzero_pages"] for g in guests) * PAGE,
        "owned_bytes": owned * PAGE,
        "owned_data_bytes": (owned - owned_zero) * PAGE,
        "discarded_owned_bytes": sum(g.get("discarded_pages", 0) for g in guests) * PAGE,
        "strategies": {},
    }
    for s in STRATEGIES:
        r = rp.replay(tr, rp.STRATEGIES[s])
        spent = (r["stored_bytes"] + r["meta_bytes"] + r["template_stored_bytes"]
                 + r["template_meta_bytes"])
        row["strategies"][s] = {
            "spent_bytes": spent,
            "owned_held_bytes": r["stored_bytes"] + r["meta_bytes"],
            "template_held_bytes": r["template_stored_bytes"] + r["template_meta_bytes"],
            "fleet": row["guest_nonzero_bytes"] / spent,
        }
    return row


def compare(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """How many times fewer bytes with reporting: owned pages with data, the image's non-zero
    pages, and what the host spends per strategy (inf where reporting left none)."""
    return {
        "reporting_alone": rp.ratio(off["owned_data_bytes"], on["owned_data_bytes"]),
        "image_alone": rp.ratio(off["template_nonzero_bytes"], on["template_nonzero_bytes"]),
        "with_compression": {
            s: rp.ratio(off["strategies"][s]["spent_bytes"], on["strategies"][s]["spent_bytes"])
            for s in STRATEGIES
        },
    }


def table(off: dict[str, Any], on: dict[str, Any], cmp: dict[str, Any]) -> list[str]:
    """Markdown: one row per recording, then the ratios."""
    lines = [
        "| reporting | image non-zero MiB | guests' non-zero MiB | owned MiB (with data) | "
        + " | ".join(f"{s}: host MiB (fleet)" for s in STRATEGIES) + " |",
        "|---|--:|--:|--:|" + "--:|" * len(STRATEGIES),
    ]
    for r in (off, on):
        name = "off"
        if r["free_page_reporting"]:
            order = r["page_reporting_order"]
            name = "on" + ("" if order is None else f", order {order}")
        held = " | ".join(
            f"{r['strategies'][s]['spent_bytes'] / MiB:.1f} ({r['strategies'][s]['fleet']:.2f}x)"
            for s in STRATEGIES
        )
        lines.append(
            f"| {name} | {r['template_nonzero_bytes'] / MiB:.1f} | "
            f"{r['guest_nonzero_bytes'] / MiB:.1f} | {r['owned_bytes'] / MiB:.1f} "
            f"({r['owned_data_bytes'] / MiB:.1f}) | {held} |"
        )
    gains = ", ".join(f"{s} {cmp['with_compression'][s]:.2f}x" for s in STRATEGIES)
    lines += [
        "",
        f"reporting alone: owned pages with data {cmp['reporting_alone']:.2f}x fewer bytes, "
        f"image {cmp['image_alone']:.2f}x; with compression, host memory off / on: {gains}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.microvm_reporting",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--n", type=int, default=8, help="guests per recording")
    ap.add_argument("--task-mode", default="inproc",
                    help="how each guest runs its task: inproc, fork or worker (record.py "
                         "--task-mode, which checks it)")
    ap.add_argument("--page-reporting-order", type=int, default=None, metavar="ORDER",
                    help="smallest reported free block, 2^ORDER pages, 0..10 (default: the "
                         "guest kernel's, a pageblock)")
    ap.add_argument("--out", type=Path, default=TOP / "vm-tests" / "out" / "microvm-reporting",
                    help="the two recordings go to OUT/off and OUT/on")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse OUT/off and OUT/on if they were recorded with these settings")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    a = ap.parse_args(argv)
    rows = {}
    # `on` first: the recorder checks the options (the reporting order) before any recording
    for reporting in (True, False):
        out = a.out / ("on" if reporting else "off")
        if not (a.reuse and matches(out, a.n, a.task_mode, reporting, a.page_reporting_order)):
            cmd = recorder_args(out, a.n, a.task_mode, reporting, a.page_reporting_order)
            print(f"recording: {' '.join(cmd)}", file=sys.stderr, flush=True)
            if subprocess.run(cmd).returncode:
                print(f"microvm_reporting: the recorder failed ({out})", file=sys.stderr)
                return 1
        rows[reporting] = measure(out)
    off, on = rows[False], rows[True]
    cmp = compare(off, on)
    print("\n".join(table(off, on, cmp)))
    if a.json:
        a.json.write_text(json.dumps({"task_mode": a.task_mode, "off": off, "on": on, **cmp},
                                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
