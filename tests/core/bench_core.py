"""Quick host figures for the store core (not a test; prints a table).

    .venv/bin/python -m tests.core.bench_core [--pages N] [--sandboxes K]

Pages: a template of heap/text/zero/float pages and K sandboxes derived
from it (identical, lightly mutated, or fresh pages).  Reports stored
bytes, ratio and put/get MB/s for: the core as zram would use it (no
owners: SAME/PLAIN/RAW), python-lz4 / python-zstandard per page, and the
core with the template and sandboxes registered.
"""

from __future__ import annotations

import argparse
import random
import time

import lz4.block
import zstandard

from controlplane.trace.corelib import PAGE_SIZE, Store

from . import pages


def dataset(n: int, k: int, seed: int = 1) -> tuple[list[bytes], list[list[bytes]]]:
    rng = random.Random(seed)
    mix = ["heap"] * 50 + ["text"] * 20 + ["zero"] * 15 + ["floats"] * 15
    tmpl = [pages.make(rng.choice(mix), rng.getrandbits(32)) for _ in range(n)]
    boxes = []
    for _ in range(k):
        mine = []
        for p in tmpl:
            r = rng.random()
            if r < 0.4:
                mine.append(p)
            elif r < 0.85:
                mine.append(pages.mutate(p, rng, rng.randrange(1, 24)))
            else:
                mine.append(pages.make(rng.choice(mix), rng.getrandbits(32)))
        boxes.append(mine)
    return tmpl, boxes


def mbps(nbytes: int, secs: float) -> float:
    return nbytes / secs / 1e6


def run_core(all_pages: list[bytes], owners, indexes, setup=None, **pol) -> dict:
    s = Store(len(all_pages) + 1, **pol)
    if setup:
        setup(s)
    data = b"".join(all_pages)
    t = time.perf_counter()
    s.put_many(0, data, owners, indexes)
    tput = time.perf_counter() - t
    back = bytearray(len(data))
    s.get_many(0, len(all_pages), back)  # fault the buffer in
    t = time.perf_counter()
    s.get_many(0, len(all_pages), back)
    tget = time.perf_counter() - t
    assert back == data
    st = s.stats()
    s.close()
    return {
        "stored": st["stored_bytes"],
        "ratio": len(data) / max(1, st["stored_bytes"]),
        "put": mbps(len(data), tput),
        "get": mbps(len(data), tget),
        "kinds": st["kind_pages"],
        "index": st["index_bytes"],
        "meta": st["meta_bytes"],
    }


def run_py(all_pages: list[bytes], codec: str) -> dict:
    if codec == "lz4":
        comp = [lz4.block.compress(p, store_size=False) for p in all_pages[:1]]
        t = time.perf_counter()
        comp = [lz4.block.compress(p, store_size=False) for p in all_pages]
        tput = time.perf_counter() - t
        t = time.perf_counter()
        for c in comp:
            lz4.block.decompress(c, uncompressed_size=PAGE_SIZE)
        tget = time.perf_counter() - t
    else:
        cctx = zstandard.ZstdCompressor(level=3)
        dctx = zstandard.ZstdDecompressor()
        t = time.perf_counter()
        comp = [cctx.compress(p) for p in all_pages]
        tput = time.perf_counter() - t
        t = time.perf_counter()
        for c in comp:
            dctx.decompress(c)
        tget = time.perf_counter() - t
    # zram-like: same-filled pages cost nothing, >= 3/4 page kept raw.
    stored = 0
    for p, c in zip(all_pages, comp, strict=True):
        if p == p[:8] * (PAGE_SIZE // 8):
            continue
        stored += PAGE_SIZE if len(c) >= PAGE_SIZE * 3 // 4 else len(c)
    n = len(all_pages) * PAGE_SIZE
    return {"stored": stored, "ratio": n / stored, "put": mbps(n, tput), "get": mbps(n, tget)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--sandboxes", type=int, default=4)
    a = ap.parse_args()
    tmpl, boxes = dataset(a.pages, a.sandboxes)
    allp = tmpl + [p for b in boxes for p in b]
    owners = [1000] * len(tmpl) + [1 + i for i, b in enumerate(boxes) for _ in b]
    indexes = list(range(len(tmpl))) + [j for b in boxes for j in range(len(b))]

    shuffled = [random.Random(i).getrandbits(40) for i in range(len(allp))]

    def reg(s: Store) -> None:
        s.add_template(1000, 7)
        for i in range(len(boxes)):
            s.add_sandbox(1 + i, 7)

    rows = [
        ("python-lz4 per page", run_py(allp, "lz4")),
        ("core lz4, no owners", run_core(allp, None, None, codec=0)),
        ("python-zstd-3 per page", run_py(allp, "zstd")),
        ("core zstd-3, no owners", run_core(allp, None, None, codec=1, level=3)),
        ("core lz4, verify=0", run_core(allp, None, None, codec=0, verify=0)),
        ("core lz4 + registry", run_core(allp, owners, indexes, reg, codec=0)),
        ("core zstd-3 + registry", run_core(allp, owners, indexes, reg, codec=1, level=3)),
        ("core lz4 dedup+tdelta", run_core(allp, owners, indexes, reg, codec=0, xdelta=0)),
        # Fresh-process style: no shared layout, only similarity can help.
        ("core lz4, shuffled index", run_core(allp, owners, shuffled, reg, codec=0)),
        ("  same, sim_effort=1", run_core(allp, owners, shuffled, reg, codec=0, sim_effort=1)),
        ("  same, sim_effort=16", run_core(allp, owners, shuffled, reg, codec=0, sim_effort=16)),
    ]
    print(f"{len(allp)} pages ({len(allp) * PAGE_SIZE / 2**20:.1f} MiB)")
    print("stored = object bytes; meta = slot table, object headers and indexes (core only)")
    hdr = f"{'system':26} {'stored MiB':>10} {'ratio':>6} {'put MB/s':>9} {'get MB/s':>9}"
    print(f"{hdr} {'meta MiB':>9} {'index KiB':>9}  kinds")
    for name, r in rows:
        meta = f"{r['meta'] / 2**20:9.2f} {r['index'] / 1024:9.0f}" if "meta" in r else " " * 19
        kinds = " ".join(f"{k}={v}" for k, v in r.get("kinds", {}).items() if v)
        print(
            f"{name:26} {r['stored'] / 2**20:10.2f} {r['ratio']:6.2f} "
            f"{r['put']:9.0f} {r['get']:9.0f} {meta}  {kinds}"
        )


if __name__ == "__main__":
    main()
