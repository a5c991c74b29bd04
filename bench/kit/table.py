"""One table printer for the benchmarks' reports: rich where it is installed, plain text else."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

MinMedMax = tuple[float, float, float]


def min_med_max(xs: Sequence[float]) -> MinMedMax | None:
    """The spread of a figure over runs; None with no run."""
    return (min(xs), statistics.median(xs), max(xs)) if xs else None


def fmt_min_med_max(v: MinMedMax | None, pct: bool = False) -> str:
    """"a / b / c" (two decimals, or whole percent); "-" for None."""
    if v is None:
        return "-"
    return " / ".join(f"{x:.0%}" if pct else f"{x:.2f}" for x in v)


def table(title: str, head: tuple[str, ...], body: list[tuple[str, ...]]) -> None:
    """Print ``body`` under ``head``; the first three columns left-aligned, the rest right."""
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in head:
            t.add_column(h, justify="left" if h in head[:3] else "right")
        for b in body:
            t.add_row(*b)
        Console(width=140).print(t)
    except ImportError:
        w = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
        print(title)
        for row in (head, *body):
            print("  ".join(c.ljust(w[i]) for i, c in enumerate(row)))
