"""Replay a page trace (docs/trace-format.md) through the host build of the store core.

    python -m controlplane.trace.replay TRACE [--strategies lz4,zstd,dedup,...] [--json OUT]

The pages go through build/libazcore.so (controlplane/trace/corelib.py): the C files that run in
azswap.ko. For each strategy the tool stores every page of the trace (template owners first, then
the rest in file order, in consecutive slots), reads everything back and checks it byte for byte,
and prints stored bytes, ratio and MB/s (C time only: one batch call per PAGES record).

Strategies (cumulative mechanisms, as in the store issue):

    lz4        per-page lz4, no owners registered (what zram/zswap do, plus same-filled pages)
    zstd       per-page zstd level 3
    dedup      lz4 + owners registered, exact duplicates only
    tdelta     + template-relative delta (same page index)
    xdelta     + cross-sandbox / similarity delta (default sim_effort): everything, lz4
    all        everything, zstd level 3
    limit-lz4  everything with unlimited search (sim_effort max, delta_max_pct 100), lz4
    limit-zstd the same with zstd: the practical limit of the store on these pages

"ratio" is sandbox bytes / bytes the sandboxes' pages added to the store (the template's pages
are stored first and reported apart, as its own cost); "total" counts the template too.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from controlplane.trace.corelib import (
    CODEC_LZ4,
    CODEC_ZSTD,
    KINDS,
    PAGE_SIZE,
    CoreError,
    PageInfo,
    Store,
)
from controlplane.trace.format import (
    ROLE_TEMPLATE,
    ROLE_UNREGISTERED,
    Owner,
    PageRun,
    Trace,
    TraceError,
    read_trace,
)


@dataclass(frozen=True)
class Strategy:
    name: str
    label: str
    register: bool
    policy: dict[str, int]


_ALL = {"dedup": 1, "tdelta": 1, "xdelta": 1}
_LIMIT = {**_ALL, "sim_effort": 64, "delta_max_pct": 100}
STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("lz4", "per-page lz4", False, {"codec": CODEC_LZ4}),
        Strategy("zstd", "per-page zstd-3", False, {"codec": CODEC_ZSTD, "level": 3}),
        Strategy(
            "dedup",
            "+dedup (lz4)",
            True,
            {"codec": CODEC_LZ4, "dedup": 1, "tdelta": 0, "xdelta": 0},
        ),
        Strategy(
            "tdelta",
            "+template delta",
            True,
            {"codec": CODEC_LZ4, "dedup": 1, "tdelta": 1, "xdelta": 0},
        ),
        Strategy("xdelta", "+cross-sandbox delta", True, {"codec": CODEC_LZ4, **_ALL}),
        Strategy("all", "all, zstd-3", True, {"codec": CODEC_ZSTD, "level": 3, **_ALL}),
        Strategy("limit-lz4", "unlimited search, lz4", True, {"codec": CODEC_LZ4, **_LIMIT}),
        Strategy(
            "limit-zstd",
            "unlimited search, zstd-3",
            True,
            {"codec": CODEC_ZSTD, "level": 3, **_LIMIT},
        ),
    )
}
DEFAULT = list(STRATEGIES)


def _ordered(tr: Trace) -> list[tuple[Owner, PageRun]]:
    runs = list(tr.runs_in_order())
    tmpl = [r for r in runs if r[0].role == ROLE_TEMPLATE]
    rest = [r for r in runs if r[0].role != ROLE_TEMPLATE]
    return tmpl + rest


def replay(
    tr: Trace, strategy: Strategy, lib: str | None = None, slots: int = 0, sim_slots: int = 1
) -> dict[str, Any]:
    """Store every page of ``tr`` with ``strategy``; verify; return figures.

    The store has one slot per page (at least ``slots``: a device sized as in a live run, whose
    per-slot tables and similarity index are sized by it) and ``sim_slots`` slots per
    similarity index entry.
    """
    runs = _ordered(tr)
    if not runs:
        raise TraceError("the trace holds no pages")
    nr = sum(len(r) for _, r in runs)
    st = Store(max(nr + 1, slots), name=f"replay-{strategy.name}", lib=lib)
    try:
        st.set_sim_slots(sim_slots)
        st.set_policy(**strategy.policy)
        if strategy.register:
            for o in tr.owners.values():
                if o.role == ROLE_TEMPLATE:
                    st.add_template(o.id, o.group)
                elif o.role != ROLE_UNREGISTERED:
                    st.add_sandbox(o.id, o.group)
        lib_ = st.lib
        slot = 0
        t_put = 0.0
        tmpl_pages = 0
        after_tmpl: dict[str, Any] | None = None
        for o, run in runs:
            if o.role != ROLE_TEMPLATE and after_tmpl is None:
                after_tmpl = st.stats()
            n = len(run)
            info = (PageInfo * n)()
            owner = o.id if strategy.register else 0
            for k, idx in enumerate(run.indexes):
                info[k].owner = owner
                info[k].index = idx
            t0 = time.perf_counter()
            # One C call per record (Store.put_many would add Python list handling to the timing).
            rc = lib_.az_host_put_batch(st._s, st._ctx.ptr, slot, run.data, n, info)
            t_put += time.perf_counter() - t0
            if rc != n:
                raise CoreError(12 if rc >= 0 else -rc, f"put at slot {slot + max(rc, 0)}")
            if o.role == ROLE_TEMPLATE:
                tmpl_pages += n
            slot += n
        end = st.stats()
        if after_tmpl is None:
            after_tmpl = end
        # Read everything back (once to warm the buffer, once timed) and compare.
        out = bytearray(nr * PAGE_SIZE)
        cbuf = (ctypes.c_char * len(out)).from_buffer(out)
        lib_.az_host_get_batch(st._s, st._ctx.ptr, 0, cbuf, nr)
        t0 = time.perf_counter()
        rc = lib_.az_host_get_batch(st._s, st._ctx.ptr, 0, cbuf, nr)
        t_get = time.perf_counter() - t0
        del cbuf
        if rc != nr:
            raise CoreError(5, f"get failed at slot {max(rc, 0)}")
        pos = 0
        for o, run in runs:
            seg = len(run) * PAGE_SIZE
            if out[pos : pos + seg] != run.data:
                raise CoreError(5, f"{strategy.name}: owner {o.name}: page read back differs")
            pos += seg
        if strategy.register:
            st.check()
        owners = st.list_owners() if strategy.register else []
    finally:
        st.close()
    total = nr * PAGE_SIZE
    sb_orig = (nr - tmpl_pages) * PAGE_SIZE
    sb_stored = end["stored_bytes"] - after_tmpl["stored_bytes"]
    tm_stored = after_tmpl["stored_bytes"]
    kinds = {k: end["kind_pages"][k] - after_tmpl["kind_pages"][k] for k in KINDS}
    return {
        "strategy": strategy.name,
        "label": strategy.label,
        "policy": strategy.policy,
        "pages": nr,
        "orig_bytes": total,
        "stored_bytes": end["stored_bytes"],
        "pool_bytes": end["pool_bytes"],
        "meta_bytes": end["meta_bytes"],
        "index_bytes": end["index_bytes"],
        "template_orig_bytes": tmpl_pages * PAGE_SIZE,
        "template_stored_bytes": tm_stored,
        "sandbox_orig_bytes": sb_orig,
        "sandbox_stored_bytes": sb_stored,
        "ratio": sb_orig / sb_stored if sb_stored else float("inf"),
        "total_ratio": total / end["stored_bytes"] if end["stored_bytes"] else float("inf"),
        "sandbox_kinds": kinds,
        "kinds": end["kind_pages"],
        "put_mbps": total / t_put / 1e6 if t_put else 0.0,
        "get_mbps": total / t_get / 1e6 if t_get else 0.0,
        "owners": owners,
    }


def run(
    path: str, names: list[str], lib: str | None = None, slots: int = 0, sim_slots: int = 1
) -> dict[str, Any]:
    tr = read_trace(path)
    res = [replay(tr, STRATEGIES[n], lib, slots, sim_slots) for n in names]
    return {"trace": path, "meta": tr.meta, "pages": tr.nr_pages, "results": res}


def print_table(rep: dict[str, Any], file: Any = None) -> None:
    res = rep["results"]
    base = next((r for r in res if r["strategy"] == "lz4"), None)
    head = (
        "strategy",
        "sandbox MiB",
        "stored MiB",
        "ratio",
        "vs lz4",
        "total ratio",
        "tmpl stored MiB",
        "meta MiB",
        "put MB/s",
        "get MB/s",
        "sandbox pages by kind",
    )
    rows = []
    for r in res:
        kinds = " ".join(f"{k}={v}" for k, v in r["sandbox_kinds"].items() if v)
        rows.append(
            (
                r["label"],
                f"{r['sandbox_orig_bytes'] / 2**20:.1f}",
                f"{r['sandbox_stored_bytes'] / 2**20:.2f}",
                f"{r['ratio']:.2f}",
                f"{r['ratio'] / base['ratio']:.2f}x" if base else "-",
                f"{r['total_ratio']:.2f}",
                f"{r['template_stored_bytes'] / 2**20:.2f}",
                f"{r['meta_bytes'] / 2**20:.2f}",
                f"{r['put_mbps']:.0f}",
                f"{r['get_mbps']:.0f}",
                kinds,
            )
        )
    title = (
        f"replay of {rep['trace']}: {rep['pages']} pages "
        f"({rep['pages'] * PAGE_SIZE / 2**20:.1f} MiB), style {rep['meta'].get('style', '?')}"
    )
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in head:
            t.add_column(h, justify="left" if h in ("strategy", head[-1]) else "right")
        for row in rows:
            t.add_row(*row)
        Console(file=file, width=200).print(t)
    except ImportError:  # pragma: no cover
        print(title, file=file)
        for row in (head, *rows):
            print("  ".join(str(c) for c in row), file=file)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m controlplane.trace.replay",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("traces", nargs="+", help="trace files")
    ap.add_argument(
        "--strategies",
        default=",".join(DEFAULT),
        help=f"comma-separated, from {','.join(STRATEGIES)}",
    )
    ap.add_argument("--json", help="write the results as JSON here")
    ap.add_argument("--lib", help="store core library (default build/libazcore.so)")
    ap.add_argument(
        "--slots",
        type=int,
        default=0,
        help="size the store to at least this many slots (default: one per page)",
    )
    ap.add_argument(
        "--sim-slots",
        type=int,
        default=1,
        choices=[1, 2, 4, 8, 16, 32, 64],
        help="slots per similarity index entry (the device's sim_slots, default 1)",
    )
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.strategies.split(",") if n.strip()]
    bad = [n for n in names if n not in STRATEGIES]
    if bad:
        print(
            f"replay: unknown strategy {bad[0]!r} (known: {', '.join(STRATEGIES)})", file=sys.stderr
        )
        return 2
    reports = []
    for p in a.traces:
        try:
            rep = run(p, names, a.lib, a.slots, a.sim_slots)
        except (TraceError, CoreError, FileNotFoundError) as exc:
            print(f"replay: {exc}", file=sys.stderr)
            return 1
        print_table(rep)
        reports.append(rep)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(reports, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
