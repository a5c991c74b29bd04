"""Human output of azctl: rich tables in aligned columns (``--json`` skips all of this)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group
from rich.table import Table

from controlplane.abi import KINDS


def console(stderr: bool = False) -> Console:
    return Console(highlight=False, soft_wrap=False, stderr=stderr)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def size(n: int | float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"


def ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def pool_table(d: dict[str, Any]) -> Table:
    t = d["totals"]
    tab = Table(title="pool", title_justify="left", show_edge=False)
    for col in ("pages", "original", "stored", "ratio", "sandboxes", "templates"):
        tab.add_column(col, justify="right")
    tab.add_row(
        str(t["pages"]),
        size(t["orig_bytes"]),
        size(t["stored_bytes"]),
        ratio(t["ratio"]),
        size(t["sandbox_stored_bytes"]),
        size(t["template_stored_bytes"]),
    )
    return tab


def kinds_table(d: dict[str, Any]) -> Table:
    t = d["totals"]
    tab = Table(title="pages per representation", title_justify="left", show_edge=False)
    for k in KINDS:
        tab.add_column(k, justify="right")
    tab.add_row(*[f"{t['kinds'][k]} ({t['kind_share'][k]:.0%})" for k in KINDS])
    return tab


def device_table(d: dict[str, Any]) -> Table | None:
    dev = d.get("device")
    if not dev or "error" in dev:
        return None
    tab = Table(title=f"device {dev['name']}", title_justify="left", show_edge=False)
    for col in ("disksize", "algorithm", "mem_limit", "mem_used_max", "mem_used"):
        tab.add_column(col, justify="right")
    mm = dev.get("mm_stat") or {}
    tab.add_row(
        size(dev.get("disksize")),
        dev.get("comp_algorithm") or "-",
        size(dev.get("mem_limit")),
        size(dev.get("mem_used_max")),
        size(mm.get("mem_used_total")),
    )
    return tab


def sandboxes_table(d: dict[str, Any]) -> Table:
    tab = Table(title="sandboxes", title_justify="left", show_edge=False)
    for col, j in (
        ("name", "left"),
        ("cgroup", "left"),
        ("group", "right"),
        ("phase", "left"),
        ("mem.current", "right"),
        ("swapped", "right"),
        ("stored", "right"),
        ("ratio", "right"),
        ("tdelta", "right"),
        ("xdelta", "right"),
        ("dup", "right"),
        ("compress", "left"),
    ):
        tab.add_column(col, justify=j)  # type: ignore[arg-type]
    for s in d["sandboxes"]:
        ph = s.get("phase")
        phase = f"{ph['phase']} {ph['age']:.0f}s" if isinstance(ph, dict) else s["module_phase"]
        c = s.get("compress") or {}
        comp = "-"
        if c.get("active"):
            comp = "running"
        elif c.get("done"):
            comp = f"done {c.get('latency') or 0:.1f}s"
        elif c.get("stop_reason"):
            comp = c["stop_reason"]
        tab.add_row(
            s["name"],
            s.get("cgroup_path") or "-",
            str(s["group"]),
            phase,
            size(s.get("memory_current")),
            size(s["orig_bytes"]),
            size(s["stored_bytes"]),
            ratio(s["ratio"]),
            str(s["kinds"]["tdelta"]),
            str(s["kinds"]["xdelta"]),
            str(s["kinds"]["dup"]),
            comp,
        )
    return tab


def templates_table(d: dict[str, Any]) -> Table:
    tab = Table(title="templates", title_justify="left", show_edge=False)
    for col in ("name", "source", "group", "pages", "stored", "shared"):
        tab.add_column(col)
    for t in d["templates"]:
        tab.add_row(
            t["name"],
            t.get("cgroup_path") or t.get("source_file") or "-",
            str(t["group"]),
            str(t["pages"]),
            size(t["stored_bytes"]),
            size(t["shared_bytes"]),
        )
    return tab


def status(d: dict[str, Any]) -> Group:
    parts: list[Any] = []
    dev = device_table(d)
    if dev is not None:
        parts.append(dev)
    parts += [pool_table(d), kinds_table(d), sandboxes_table(d)]
    if d["templates"]:
        parts.append(templates_table(d))
    if d.get("daemon") is False:
        parts.append("[dim]daemon not running: no phases or compression state[/dim]")
    return Group(*parts)


def policy_table(p: dict[str, Any]) -> Table:
    tab = Table(show_header=True, show_edge=False)
    tab.add_column("knob")
    tab.add_column("value", justify="right")
    for k, v in p.items():
        tab.add_row(k, str(v))
    return tab


def list_table(title: str, rows: list[dict[str, Any]], cols: list[str]) -> Table:
    tab = Table(title=title, title_justify="left", show_edge=False)
    for c in cols:
        tab.add_column(c)
    for r in rows:
        tab.add_row(*["-" if r.get(c) is None else str(r.get(c)) for c in cols])
    return tab
