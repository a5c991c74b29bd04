"""microVM recording: how far a general-purpose compressor gets on the owned pages.

    python -m bench.microvm_bound [--dir vm-tests/out/microvm] [--level 19]
        [--per-task] [--json DIR/bound.json]

A reference point for the owned-pages view, not a page store: every VM's owned pages (the pages
it dirtied, vm0 first, each VM in page-offset order) are compressed as the continuation of ONE
zstd stream that begins with the whole template image, with long-distance matching and a window
over both (controlplane/trace/replay.py's prefixed_stream, the stream reference of every replay;
close to what `zstd --patch-from=IMAGE` finds). So the compressor sees every match a page store
looks for (the template at the same or any other offset, other pages of the same VM, other VMs'
pages) and more (matches across page boundaries, one entropy model for the whole stream),
without paying for random access. The stream is decompressed again and compared with what was
written, so the figure is of a lossless round trip.

The ratios are printed beside per-page lz4 (zram's rule, from the host replay of the same trace:
controlplane/trace/replay.py strategy "lz4"), the baseline of the issue's "x zram-lz4" target.
Takes minutes on the 200 MiB recording (the image is compressed again for every group).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.microvm import Recording, load_recording
from controlplane.trace import ROLE_TEMPLATE, Trace, read_trace
from controlplane.trace.replay import STRATEGIES, prefixed_stream, replay

TOP = Path(__file__).resolve().parents[1]
MiB = float(1 << 20)


def lz4_per_page(tr: Trace, names: set[str]) -> int:
    """Per-page lz4 (zram's rule) bytes of the owned pages of the VMs in @names."""
    owners = {k: o for k, o in tr.owners.items() if o.name in names}
    order = [(oid, k) for oid, k in tr.order if oid in owners]
    one = Trace(tr.meta, owners, order, sum(o.nr_pages for o in owners.values()))
    return int(replay(one, STRATEGIES["lz4"])["sandbox_stored_bytes"])


def stream_bound(rec: Recording, tr: Trace, names: list[str], level: int,
                 image: bytes) -> dict[str, Any]:
    data = b"".join(vm.data for vm in rec.vms if vm.name in names)
    owned = len(data)
    packed = prefixed_stream(image, data, level).data_bytes  # read back and compared
    lz4 = lz4_per_page(tr, set(names))
    return {"vms": names, "owned_bytes": owned, "zstd_stream_bytes": packed,
            "lz4_page_bytes": lz4, "zstd_ratio": owned / packed if packed else None,
            "lz4_ratio": owned / lz4 if lz4 else None,
            "zstd_vs_lz4": lz4 / packed if packed else None}


def bound(d: Path, level: int, per_task: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="azbound-", dir=d) as tmp:
        work = Path(tmp)
        rec = load_recording(d, work / "run")
        tr = read_trace(d / "microvm.aztrace")
        for o in tr.owners.values():
            if o.role == ROLE_TEMPLATE:
                o.runs.clear()  # the image file holds it now
        groups: dict[str, list[str]] = {"all": [vm.name for vm in rec.vms]}
        if per_task:
            for vm in rec.vms:
                groups.setdefault(vm.task, []).append(vm.name)
        out: dict[str, Any] = {"dir": str(d), "level": level, "groups": {}}
        image = rec.image.read_bytes()
        for name, vms in groups.items():
            r = stream_bound(rec, tr, vms, level, image)
            out["groups"][name] = r
            print(f"[microvm-bound] {name}: {r['owned_bytes'] / MiB:.1f} MiB owned, zstd stream "
                  f"{r['zstd_ratio']:.3f}x, per-page lz4 {r['lz4_ratio']:.3f}x", file=sys.stderr)
        return out


def table(res: dict[str, Any]) -> str:
    lines = [f"| VMs | owned MiB | per-page lz4 | zstd -{res['level']} stream, image as prefix "
             "| stream / per-page lz4 |", "|---|---:|---:|---:|---:|"]
    for name, r in res["groups"].items():
        lines.append(f"| {name} | {r['owned_bytes'] / MiB:.1f} | {r['lz4_ratio']:.3f} | "
                     f"{r['zstd_ratio']:.3f} | {r['zstd_vs_lz4']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.microvm_bound",
        description="Owned pages of a microVM recording as one zstd stream with the template "
                    "image as prefix: a general-purpose reference for the owned-pages view.")
    ap.add_argument("--dir", type=Path, default=TOP / "vm-tests" / "out" / "microvm",
                    help="recording directory (manifest.json, microvm.aztrace)")
    ap.add_argument("--level", type=int, default=19, choices=range(1, 23), metavar="1..22",
                    help="zstd level (default 19)")
    ap.add_argument("--per-task", action="store_true", help="also one stream per task kind")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    if not (a.dir / "microvm.aztrace").exists():
        ap.error(f"{a.dir}: no microvm.aztrace (record one: vm-tests/microvm/record.py)")
    res = bound(a.dir, a.level, a.per_task)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
