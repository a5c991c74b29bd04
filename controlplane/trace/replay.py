"""Replay a page trace (docs/trace-format.md) through the host build of the store core.

    python -m controlplane.trace.replay TRACE [--strategies lz4,zstd,dedup,...] [--json OUT]

The pages go through build/libazcore.so (controlplane/trace/corelib.py): the C files that run in
azswap.ko. For each strategy the tool stores every page of the trace (template owners first, then
the rest in file order, in consecutive slots), reads everything back and checks it byte for byte,
and prints the bytes stored, the metadata, the ratios and MB/s (C time only: one batch call per
PAGES record).

Strategies (cumulative mechanisms):

    lz4              per-page lz4, no owners registered (what zram/zswap do, plus same-filled)
    zstd             per-page zstd level 3
    dedup            lz4 + owners registered, exact duplicates only
    tdelta           + template-relative delta (same page index)
    xdelta           + cross-sandbox / similarity delta (default sim_effort): everything, lz4
    all              everything, zstd level 3
    max-effort-lz4   everything with maximum search effort (sim_effort 64, delta_max_pct 100),
                     lz4 (not a ceiling: it can store more than the default)
    max-effort-zstd  the same with zstd level 3
    xdelta-packed    xdelta, then the store's pack pass over every slot (runs of up to 4
                     nearby PLAIN pages of one sandbox become one object: az_store_pack)
    all-packed       all, then the pack pass
    (limit-lz4 and limit-zstd are deprecated names of the two above)

Every replay also reports the stream reference ("stream-ref", not a store strategy): the
sandboxes' pages as one zstd -19 stream with the template's pages as prefix, no random access:
the ceiling of what compression sees in these pages (skip it with --no-stream-ref).

Accounting (the JSON fields; docs/trace-format.md):
    sandbox_bytes          original bytes of the sandboxes' pages (every non-template owner)
    stored_bytes           pool bytes charged to them (their objects' payload)
    meta_bytes             what else the store spends: their slot entries and object headers,
                           the indexes, the owner table and the base cache (core stats)
    template_stored_bytes  the template's own pool bytes (template_meta_bytes beside)
    ratio                  sandbox_bytes / stored_bytes
    net_ratio              sandbox_bytes / (stored_bytes + meta_bytes)
    total_ratio            (sandbox + template bytes) / (all stored + all metadata)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import zstandard

from controlplane.trace.accounting import meta_split
from controlplane.trace.corelib import (
    CODEC_LZ4,
    CODEC_ZSTD,
    KINDS,
    META_PARTS,
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
    alias_of: str = ""  # a deprecated name of that strategy
    pack: bool = False  # the pack pass over every slot after the puts


_ALL = {"dedup": 1, "tdelta": 1, "xdelta": 1}
_MAX = {**_ALL, "sim_effort": 64, "delta_max_pct": 100}
_CANONICAL = (
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
    Strategy("max-effort-lz4", "max effort, lz4", True, {"codec": CODEC_LZ4, **_MAX}),
    Strategy(
        "max-effort-zstd",
        "max effort, zstd-3",
        True,
        {"codec": CODEC_ZSTD, "level": 3, **_MAX},
    ),
    Strategy("xdelta-packed", "xdelta, packed", True, {"codec": CODEC_LZ4, **_ALL}, pack=True),
    Strategy(
        "all-packed", "all, packed", True, {"codec": CODEC_ZSTD, "level": 3, **_ALL}, pack=True
    ),
)
# Deprecated names: accepted on the command line (mapped, with a note on stderr) and here, for
# scripts that look them up in STRATEGIES (their results keep the old name).
ALIASES = {"limit-lz4": "max-effort-lz4", "limit-zstd": "max-effort-zstd"}
STRATEGIES: dict[str, Strategy] = {s.name: s for s in _CANONICAL}
for _old, _new in ALIASES.items():
    _s = STRATEGIES[_new]
    STRATEGIES[_old] = Strategy(
        _old, f"{_s.label} (old name)", _s.register, _s.policy, _new, _s.pack
    )
NAMES = [s.name for s in _CANONICAL]
DEFAULT = list(NAMES)

# The reference beside the store strategies (not a store: no random access).
STREAM_REF = "stream-ref"
STREAM_LEVEL = 19


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
        t_pack = 0.0
        if strategy.pack:
            t0 = time.perf_counter()
            st.pack(0, slot)
            t_pack = time.perf_counter() - t0
            st.drain()
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
        read = st.stats()
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
    res = figures(strategy, after_tmpl, end, nr, tmpl_pages)
    if owners:  # creator pays (azcore.h): the owners' bytes are the same split
        sb = sum(o["exclusive_bytes"] + o["shared_bytes"] for o in owners if not o["is_template"])
        tm = sum(o["exclusive_bytes"] + o["shared_bytes"] for o in owners if o["is_template"])
        if (sb, tm) != (res["stored_bytes"], res["template_stored_bytes"]):
            raise CoreError(5, f"{strategy.name}: owner bytes {sb}+{tm} do not match the stats")
    res.update(
        {
            "sandbox_kinds": {k: end["kind_pages"][k] - after_tmpl["kind_pages"][k] for k in KINDS},
            "kinds": end["kind_pages"],
            "put_mbps": nr * PAGE_SIZE / t_put / 1e6 if t_put else 0.0,
            "pack_s": t_pack,
            "packed_pages": end["packed_pages"],
            # sparse similarity entries and direct groups when the pages were stored
            # (docs/store.md), and the pages stored without an object
            "similarity": {
                **{k: end[f"sim_{k}"] for k in ("sparse", "waiting", "switches", "direct")},
                "direct_pages": end["direct_pages"],
            },
            "get_mbps": nr * PAGE_SIZE / t_get / 1e6 if t_get else 0.0,
            # the decoded-base cache's use: base reads it served and base reads that decoded,
            # while the pages were stored and in the two read-back passes (slot order)
            "base_cache": {
                "pages": end["base_cache_pages"],
                "put_hits": end["base_cache_hits"],
                "put_misses": end["base_cache_misses"],
                "get_hits": read["base_cache_hits"] - end["base_cache_hits"],
                "get_misses": read["base_cache_misses"] - end["base_cache_misses"],
            },
            "verified_pages": nr,
            "owners": owners,
        }
    )
    return res


def ratio(num: int, den: int) -> float:
    """@num / @den, inf when @den is 0 (nothing stored)."""
    return num / den if den else float("inf")


def figures(
    strategy: Strategy, tm: dict[str, Any], end: dict[str, Any], nr: int, tmpl_pages: int
) -> dict[str, Any]:
    """The JSON contract's figures of one strategy from two core stats snapshots (metadata
    split by :func:`controlplane.trace.accounting.meta_split`): the sandboxes' bytes, their
    pool bytes and metadata, and the template's beside them."""
    if sum(end[k] for k in META_PARTS) != end["meta_bytes"]:
        raise CoreError(5, "store stats: meta_bytes is not the sum of its components")
    sb_meta, tm_meta = meta_split(end, tm)
    sandbox = (nr - tmpl_pages) * PAGE_SIZE
    tmpl = tmpl_pages * PAGE_SIZE
    stored = end["stored_bytes"] - tm["stored_bytes"]
    tm_stored = tm["stored_bytes"]
    meta = sum(sb_meta.values())
    tmeta = sum(tm_meta.values())
    return {
        "strategy": strategy.name,
        "label": strategy.label,
        "reference": False,
        "policy": strategy.policy,
        "pages": nr,
        # the contract (docs/trace-format.md)
        "sandbox_bytes": sandbox,
        "stored_bytes": stored,
        "meta_bytes": meta,
        "template_stored_bytes": tm_stored,
        "ratio": ratio(sandbox, stored),
        "net_ratio": ratio(sandbox, stored + meta),
        "total_ratio": ratio(sandbox + tmpl, stored + tm_stored + meta + tmeta),
        "meta_pct": 100.0 * meta / sandbox if sandbox else 0.0,
        "meta": sb_meta,
        "template_bytes": tmpl,
        "template_meta_bytes": tmeta,
        "template_meta": tm_meta,
        # the whole store at the end, as the core reports it
        "store": {
            k: end[k]
            for k in ("stored_bytes", "pool_bytes", "meta_bytes", "index_bytes", "objects", "bases")
        },
        "idle_slot_bytes": end["slot_bytes"] - end["slot_used_bytes"],
        # older names of the figures above
        "orig_bytes": nr * PAGE_SIZE,
        "template_orig_bytes": tmpl,
        "sandbox_orig_bytes": sandbox,
        "sandbox_stored_bytes": stored,
    }


def _pages(tr: Trace) -> tuple[bytes, bytes]:
    """(template pages, sandbox pages) in replay order."""
    runs = _ordered(tr)
    tmpl = b"".join(r.data for o, r in runs if o.role == ROLE_TEMPLATE)
    rest = b"".join(r.data for o, r in runs if o.role != ROLE_TEMPLATE)
    return tmpl, rest


def _zstd_params(size: int, level: int = STREAM_LEVEL) -> zstandard.ZstdCompressionParameters:
    # zstd at @level with a window over everything (prefix included), as `zstd --patch-from`
    # sets it, and long-distance matching.
    wlog = min(max(23, math.ceil(math.log2(max(size, 2)))), 31)
    return zstandard.ZstdCompressionParameters.from_level(level, window_log=wlog, enable_ldm=True)


@dataclass
class PrefixedStream:
    prefix_bytes: int  # the prefix's part of the stream (flushed at its end)
    data_bytes: int  # the rest: what the data costs with the prefix before it
    put_s: float  # compressing the data (after the prefix)
    get_s: float  # decompressing the whole stream
    window_log: int


def prefixed_stream(prefix: bytes, data: bytes, level: int = STREAM_LEVEL) -> PrefixedStream:
    """@data as the continuation of one zstd stream that begins with @prefix: long-distance
    matching and a window over both (up to 2 GiB), so every match into the prefix is in reach,
    as for `zstd --patch-from`.  The prefix is compressed in the same stream and flushed at a
    block boundary, so its bytes and the data's are told apart.  (The prefix loaded as a
    raw-content dictionary instead, python-zstandard's dictionary path, found a fraction of the
    matches in a large one: docs/replay-net/README.md, "The stream reference as one stream".)
    The whole stream is decompressed and compared; a difference raises CoreError."""
    params = _zstd_params(len(prefix) + len(data), level)
    c = zstandard.ZstdCompressor(compression_params=params).compressobj()
    head = c.compress(prefix) + c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK) if prefix else b""
    t0 = time.perf_counter()
    tail = c.compress(data) + c.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
    put_s = time.perf_counter() - t0
    del c  # its window buffer, before the decoder takes one as large
    t0 = time.perf_counter()
    back = zstandard.ZstdDecompressor(max_window_size=1 << params.window_log).decompress(
        head + tail, max_output_size=len(prefix) + len(data))
    get_s = time.perf_counter() - t0
    view = memoryview(back)  # compared in place, not copied
    if view[:len(prefix)] != prefix or view[len(prefix):] != data:
        raise CoreError(5, f"{STREAM_REF}: stream read back differs")
    return PrefixedStream(len(head), len(tail), put_s, get_s, params.window_log)


def stream_reference(tr: Trace) -> dict[str, Any]:
    """The sandboxes' pages as one zstd -19 stream with the template's pages as its prefix
    (prefixed_stream).

    No random access and no metadata: a ceiling beside the store strategies, not one of them.
    The template's own cost is its pages' part of the stream. The stream is decompressed
    and compared with the pages.
    """
    tmpl, sb = _pages(tr)
    if not sb:
        raise TraceError("the trace holds no sandbox pages")
    ps = prefixed_stream(tmpl, sb)
    t_put, t_get = ps.put_s, ps.get_s
    tm_stored = ps.prefix_bytes
    stored = ps.data_bytes
    sandbox = len(sb)
    return {
        "strategy": STREAM_REF,
        "label": f"stream ref (zstd-{STREAM_LEVEL}, template prefix)",
        "reference": True,
        "policy": {"level": STREAM_LEVEL, "window_log": ps.window_log, "ldm": 1},
        "pages": (len(tmpl) + len(sb)) // PAGE_SIZE,
        "sandbox_bytes": sandbox,
        "stored_bytes": stored,
        "meta_bytes": 0,
        "template_stored_bytes": tm_stored,
        "ratio": ratio(sandbox, stored),
        "net_ratio": ratio(sandbox, stored),
        "total_ratio": ratio(sandbox + len(tmpl), stored + tm_stored),
        "meta_pct": 0.0,
        "meta": {},
        "template_bytes": len(tmpl),
        "template_meta_bytes": 0,
        "template_meta": {},
        "orig_bytes": len(tmpl) + sandbox,
        "template_orig_bytes": len(tmpl),
        "sandbox_orig_bytes": sandbox,
        "sandbox_stored_bytes": stored,
        "sandbox_kinds": dict.fromkeys(KINDS, 0),
        "put_mbps": sandbox / t_put / 1e6 if t_put else 0.0,
        # the stream decodes from its start: the template's part is read back too
        "get_mbps": (len(tmpl) + sandbox) / t_get / 1e6 if t_get else 0.0,
        "verified_pages": sandbox // PAGE_SIZE,
    }


def run(
    path: str,
    names: list[str],
    lib: str | None = None,
    slots: int = 0,
    sim_slots: int = 1,
    stream_ref: bool = True,
) -> dict[str, Any]:
    tr = read_trace(path)
    res = [replay(tr, STRATEGIES[n], lib, slots, sim_slots) for n in names]
    if stream_ref:
        res.append(stream_reference(tr))
    return {"trace": path, "meta": tr.meta, "pages": tr.nr_pages, "results": res}


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def print_table(rep: dict[str, Any], file: Any = None) -> None:
    res = rep["results"]
    base = next((r for r in res if r["strategy"] == "lz4"), None)
    ref = next((r for r in res if r["strategy"] == STREAM_REF), None)
    head = (
        "strategy",
        "sandbox MiB",
        "stored MiB",
        "meta MiB",
        "ratio",
        "net ratio",
        "net vs lz4",
        "net / stream",
        "total ratio",
        "tmpl stored MiB",
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
                f"{r['sandbox_bytes'] / 2**20:.1f}",
                _mib(r["stored_bytes"]),
                _mib(r["meta_bytes"]),
                f"{r['ratio']:.2f}",
                f"{r['net_ratio']:.2f}",
                f"{r['net_ratio'] / base['net_ratio']:.2f}x" if base else "-",
                f"{r['net_ratio'] / ref['net_ratio']:.2f}" if ref else "-",
                f"{r['total_ratio']:.2f}",
                _mib(r["template_stored_bytes"]),
                f"{r['put_mbps']:.1f}" if r["put_mbps"] < 10 else f"{r['put_mbps']:.0f}",
                f"{r['get_mbps']:.0f}",
                kinds,
            )
        )
    title = (
        f"replay of {rep['trace']}: {rep['pages']} pages "
        f"({rep['pages'] * PAGE_SIZE / 2**20:.1f} MiB), style {rep['meta'].get('style', '?')}"
    )
    store = [r for r in res if not r["reference"]]
    lines = [
        "metadata as % of sandbox bytes: "
        + ", ".join(f"{r['strategy']} {r['meta_pct']:.2f}%" for r in store)
    ]
    top = next((r for r in store if r["strategy"] == "all"), store[-1] if store else None)
    if top:
        parts = ", ".join(f"{k} {_mib(v)}" for k, v in top["meta"].items() if v)
        lines.append(f"metadata of {top['strategy']} (MiB): {parts}")
    if ref:
        lines.append(f"{STREAM_REF} is a reference (no random access), not a store strategy")
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in head:
            t.add_column(h, justify="left" if h in ("strategy", head[-1]) else "right")
        for row in rows:
            t.add_row(*row)
        con = Console(file=file, width=220)
        con.print(t)
        for ln in lines:
            con.print(ln, highlight=False)
    except ImportError:  # pragma: no cover
        print(title, file=file)
        for row in (head, *rows):
            print("  ".join(str(c) for c in row), file=file)
        for ln in lines:
            print(ln, file=file)


def resolve(names: list[str], err: Any = None) -> list[str]:
    """Map deprecated strategy names to the current ones (a note on ``err``); KeyError for an
    unknown name."""
    out = []
    for n in names:
        if n in ALIASES:
            print(
                f"replay: strategy {n!r} is deprecated, use {ALIASES[n]!r}",
                file=err if err is not None else sys.stderr,
            )
            n = ALIASES[n]
        if n not in NAMES:
            raise KeyError(n)
        out.append(n)
    return out


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
        help=f"comma-separated, from {','.join(NAMES)}",
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
    ap.add_argument(
        "--no-stream-ref",
        action="store_true",
        help=f"skip the zstd-{STREAM_LEVEL} stream reference (slow on large traces)",
    )
    a = ap.parse_args(argv)
    want = [n.strip() for n in a.strategies.split(",") if n.strip()]
    stream_ref = not a.no_stream_ref
    if STREAM_REF in want:  # always reported; naming it is allowed
        want = [n for n in want if n != STREAM_REF]
        stream_ref = True
    try:
        names = resolve(want)
    except KeyError as exc:
        print(
            f"replay: unknown strategy {exc.args[0]!r} (known: {', '.join(NAMES)})",
            file=sys.stderr,
        )
        return 2
    reports = []
    for p in a.traces:
        try:
            rep = run(p, names, a.lib, a.slots, a.sim_slots, stream_ref)
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
