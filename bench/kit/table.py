"""One table printer for the benchmarks' reports: rich where it is installed, plain text else."""

from __future__ import annotations


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
