"""Host figures: store/load MB/s of the store core vs python-lz4 / python-zstandard per page.

    python -m bench.hostbench TRACE [TRACE...] [--json OUT] [--repeat 3]

The same pages (every page of each trace, template first) go through:
  - python-lz4 (lz4.block, per page) and python-zstandard (level 3, per page), with zram-like
    accounting (same-filled pages cost nothing, pages compressing to >= 3/4 page kept raw);
  - the store core (build/libazcore.so, the code in azswap.ko) as zram would use it (no owners:
    same-filled/plain/raw), lz4 and zstd-3;
  - the store core with the template and sandboxes registered (dedup + deltas), lz4 and zstd-3.
MB/s are over the original bytes, best of --repeat runs, one CPU of this machine; the core's
figures are the C batch calls only (controlplane/trace/replay.py), Python's include one call per
page.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import lz4.block
import zstandard

from controlplane.trace import PAGE_SIZE, read_trace
from controlplane.trace import replay as rp

RAW = PAGE_SIZE * 3 // 4


def py_codec(pages: list[bytes], codec: str, repeat: int) -> dict[str, Any]:
    if codec == "lz4":

        def comp(p: bytes) -> bytes:
            return lz4.block.compress(p, store_size=False)

        def dec(c: bytes) -> bytes:
            return lz4.block.decompress(c, uncompressed_size=PAGE_SIZE)
    else:
        cctx = zstandard.ZstdCompressor(level=3)
        dctx = zstandard.ZstdDecompressor()
        comp = cctx.compress

        def dec(c: bytes) -> bytes:
            return dctx.decompress(c, max_output_size=PAGE_SIZE)

    best_put = best_get = float("inf")
    out: list[bytes] = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = [comp(p) for p in pages]
        best_put = min(best_put, time.perf_counter() - t)
        t = time.perf_counter()
        for c in out:
            dec(c)
        best_get = min(best_get, time.perf_counter() - t)
    stored = 0
    for p, c in zip(pages, out, strict=True):
        if p == p[:8] * (PAGE_SIZE // 8):
            continue
        stored += PAGE_SIZE if len(c) >= RAW else len(c)
    n = len(pages) * PAGE_SIZE
    return {
        "stored_bytes": stored,
        "ratio": n / stored,
        "put_mbps": n / best_put / 1e6,
        "get_mbps": n / best_get / 1e6,
    }


def core(tr: Any, name: str, repeat: int) -> dict[str, Any]:
    best: dict[str, Any] | None = None
    for _ in range(repeat):
        r = rp.replay(tr, rp.STRATEGIES[name])
        if best is None:
            best = r
        else:
            best["put_mbps"] = max(best["put_mbps"], r["put_mbps"])
            best["get_mbps"] = max(best["get_mbps"], r["get_mbps"])
    assert best is not None
    return {
        "stored_bytes": best["stored_bytes"],
        "ratio": best["total_ratio"],
        "put_mbps": best["put_mbps"],
        "get_mbps": best["get_mbps"],
    }


def run(path: str, repeat: int) -> dict[str, Any]:
    tr = read_trace(path)
    pages: list[bytes] = []
    for _, run_ in rp._ordered(tr):
        d = run_.data
        pages += [d[k * PAGE_SIZE : (k + 1) * PAGE_SIZE] for k in range(len(run_))]
    rows = {
        "python-lz4 per page": py_codec(pages, "lz4", repeat),
        "core lz4, unregistered": core(tr, "lz4", repeat),
        "python-zstd-3 per page": py_codec(pages, "zstd", repeat),
        "core zstd-3, unregistered": core(tr, "zstd", repeat),
        "core lz4, registered (all)": core(tr, "xdelta", repeat),
        "core zstd-3, registered (all)": core(tr, "all", repeat),
    }
    return {
        "trace": path,
        "style": tr.meta.get("style"),
        "pages": len(pages),
        "rows": rows,
    }


def print_table(rep: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"host: {rep['style']} pages ({rep['pages'] * PAGE_SIZE / 2**20:.0f} MiB), one CPU"
    )
    for h in ("system", "stored MiB", "ratio", "store MB/s", "load MB/s"):
        t.add_column(h, justify="left" if h == "system" else "right")
    for name, r in rep["rows"].items():
        t.add_row(
            name,
            f"{r['stored_bytes'] / 2**20:.1f}",
            f"{r['ratio']:.2f}",
            f"{r['put_mbps']:.0f}",
            f"{r['get_mbps']:.0f}",
        )
    Console(width=160).print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.hostbench", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    reps = []
    for p in a.traces:
        rep = run(p, a.repeat)
        print_table(rep)
        reps.append(rep)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(reps, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
