"""The trim step's effect, apart from compression: the same sandboxes recorded without and with
the trim step (controlplane.trim before the wait), both replayed through the host store core.

    python -m bench.trimbench [--styles fork,fresh-aslr] [--n 8] [--size default] [--seed 1]
        [--out DIR] [--json OUT]

For each style: the sandboxes' bytes (what they own while they wait), then per strategy (per-page
lz4 and zstd: what zram stores per page; `all`: azswap's store) the bytes stored plus metadata and
the net ratio, without and with the trim step. "trim alone" = owned bytes without / with trim;
"with compression" = stored + metadata without trim / with trim. Host only: no guest.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.record import STYLES, run_and_record
from controlplane.trace import read_trace
from controlplane.trace import replay as rp

STRATEGIES = ("lz4", "zstd", "all")
MiB = 2**20


def measure(style: str, n: int, size: str, seed: int, out: Path, log=print) -> dict[str, Any]:
    """Record ``style`` without and with the trim step and replay both traces."""
    row: dict[str, Any] = {"style": style, "n": n, "size": size, "seed": seed}
    for trim in (False, True):
        path = out / f"{style}-{'trim' if trim else 'plain'}.aztrace"  # not make bench's
        run_and_record(style, n, size, seed, str(path), trim=trim, log=log)
        tr = read_trace(path)
        res = {s: rp.replay(tr, rp.STRATEGIES[s]) for s in STRATEGIES}
        key = "trim" if trim else "plain"
        row[key] = {
            "sandbox_bytes": res["lz4"]["sandbox_bytes"],
            "strategies": {
                s: {
                    "held_bytes": r["stored_bytes"] + r["meta_bytes"],
                    "net_ratio": r["net_ratio"],
                }
                for s, r in res.items()
            },
        }
    p, t = row["plain"], row["trim"]
    row["trim_alone"] = p["sandbox_bytes"] / t["sandbox_bytes"]
    row["with_compression"] = {
        s: p["strategies"][s]["held_bytes"] / t["strategies"][s]["held_bytes"]
        for s in STRATEGIES
    }
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown table of :func:`measure` rows."""
    lines = [
        "| style | sandbox MiB (no trim / trim) | trim alone | "
        + " | ".join(f"{s} held MiB (no trim / trim)" for s in STRATEGIES)
        + " | "
        + " | ".join(f"{s} with trim" for s in STRATEGIES)
        + " |",
        "|---|--:|--:|" + "--:|" * (2 * len(STRATEGIES)),
    ]
    for r in rows:
        p, t = r["plain"], r["trim"]
        held = " | ".join(
            f"{p['strategies'][s]['held_bytes'] / MiB:.1f} / "
            f"{t['strategies'][s]['held_bytes'] / MiB:.1f}"
            for s in STRATEGIES
        )
        gain = " | ".join(f"{r['with_compression'][s]:.2f}x" for s in STRATEGIES)
        lines.append(
            f"| {r['style']} | {p['sandbox_bytes'] / MiB:.1f} / {t['sandbox_bytes'] / MiB:.1f} | "
            f"{r['trim_alone']:.2f}x | {held} | {gain} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.trimbench",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--styles", default="fork,fresh-aslr")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--size", default="default")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="directory for the traces (default: a temp dir)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    styles = [s for s in a.styles.split(",") if s]
    bad = [s for s in styles if s not in STYLES]
    if bad:
        ap.error(f"unknown style(s) {','.join(bad)} (from {','.join(STYLES)})")
    with tempfile.TemporaryDirectory(prefix="aztrim-") as tmp:
        out = Path(a.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        rows = [measure(s, a.n, a.size, a.seed, out) for s in styles]
    print("\n".join(table(rows)))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
