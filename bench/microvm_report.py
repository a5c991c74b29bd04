"""microVM sandboxes: the two views (owned pages, fleet) from a live run and the host replay.

    python -m bench.microvm_report [--dir vm-tests/out/microvm]
        [--live vm-tests/out/microvm-live.json] [--limit-json DIR/limit.json] [--md DIR/report.md]

Inputs: DIR/manifest.json and DIR/microvm.aztrace (vm-tests/microvm/record.py), the live figures of
`python -m bench.microvm` (in the test guest). The unlimited-search limit on the same
owned pages comes from the host build of the store core (controlplane/trace/replay.py,
strategies max-effort-lz4 and max-effort-zstd, plus per-page lz4/zstd and the default-effort store
for reference); it is computed once and cached in --limit-json.

Owned pages (private-mapping restore): the pages each VM dirtied vs the template image at the same
offset; raw bytes / bytes each system stores for them (payload = compressed objects; pool = what
the allocator holds). Fleet: the sum of each VM's non-zero guest RAM / what the host spends:
  private  template image in page cache (raw, once) + everything in swap (azswap: its template
           bases too) + azswap metadata;
  anon     everything in swap (azswap: the template's compressed bases, loaded once) + metadata;
  private-reclaim  as private, but the image's page cache (tmpfs) is reclaimed too: what stays
           resident + what the image's pages cost in swap (azswap: duplicates of its bases) +
           everything else in swap + metadata.
Projection to N VMs: fixed cost F (the template: raw image and/or bases, and the bases'
metadata when the run tells it apart; the reclaimed image's residue and swap cost) + N x the
measured mean per-VM cost (everything else, the per-slot tables included, divided by the
recorded N), against N x the mean per-VM non-zero RAM: fleet(N) = N*R / (F + N*C).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from controlplane.trace import PAGE_SIZE, ROLE_TEMPLATE, Trace, read_trace
from controlplane.trace.replay import STRATEGIES, replay

TOP = Path(__file__).resolve().parents[1]
LIMIT_STRATEGIES = ("lz4", "zstd", "xdelta", "all", "max-effort-lz4", "max-effort-zstd")
MiB = float(1 << 20)


def limit_figures(trace: Path) -> dict[str, Any]:
    tr = read_trace(trace)
    out: dict[str, Any] = {"trace": str(trace), "results": {}}
    for name in LIMIT_STRATEGIES:
        r = replay(tr, STRATEGIES[name])
        r.pop("owners", None)
        out["results"][name] = r
        print(f"[microvm-report] replay {name}: sandbox ratio {r['ratio']:.3f}", file=sys.stderr)
    # per-VM owned bytes straight from the trace
    out["owned_pages"] = {o.name: o.nr_pages for o in tr.owners.values()
                          if o.role != ROLE_TEMPLATE}
    out["per_vm_lz4"] = per_vm_lz4(tr)
    del tr
    out["composition"] = composition(trace)
    return out


def per_vm_lz4(tr: Trace) -> dict[str, Any]:
    """What per-page lz4 (the replay's "lz4" strategy: zram's rule) stores of each VM's owned
    pages, one VM at a time: the per-VM baseline a live zram run cannot tell apart."""
    out: dict[str, Any] = {}
    for o in tr.owners.values():
        if o.role == ROLE_TEMPLATE or not o.runs:
            continue
        one = Trace(tr.meta, {o.id: o}, [(o.id, k) for k in range(len(o.runs))], o.nr_pages)
        r = replay(one, STRATEGIES["lz4"])
        out[o.name] = {"task": o.info.get("task", "?"), "owned_bytes": r["sandbox_orig_bytes"],
                       "lz4_bytes": r["sandbox_stored_bytes"]}
    return out


def per_vm_view(live: dict[str, Any], lim: dict[str, Any]) -> list[dict[str, Any]]:
    """Owned pages per VM: per-page lz4 (host) against each azswap system of the private style
    (the owner's stored bytes: its exclusive objects + the ones it shares)."""
    base = lim.get("per_vm_lz4") or {}
    runs: dict[str, dict[str, Any]] = {}
    for r in live["runs"]:
        if r.get("style") == "private" and r["system"].startswith("azswap") and "error" not in r:
            runs.setdefault(r["system"], r)
    rows = []
    for name, b in base.items():
        row: dict[str, Any] = {"vm": name, "task": b["task"], "owned_bytes": b["owned_bytes"],
                               "lz4_ratio": b["owned_bytes"] / b["lz4_bytes"]
                               if b["lz4_bytes"] else None, "systems": {}}
        for sysname, r in runs.items():
            ow = next((o for o in r.get("owners", []) if o.get("name") == name), None)
            if ow:
                stored = ow["exclusive_bytes"] + ow["shared_bytes"]
                row["systems"][sysname] = b["owned_bytes"] / stored if stored else None
        rows.append(row)
    return rows


def composition(trace: Path) -> dict[str, Any]:
    """What the owned pages are, per VM: all-zero, identical to a template page at another
    offset, identical to a page another VM owns (and not the template), or neither."""
    import hashlib

    tr = read_trace(trace)
    zero = bytes(PAGE_SIZE)

    def digests(o: Any) -> list[bytes]:
        d = o.data()
        return [hashlib.blake2b(d[k * PAGE_SIZE : (k + 1) * PAGE_SIZE], digest_size=16).digest()
                for k in range(o.nr_pages)]

    owners = list(tr.owners.values())
    tmpl = {h for o in owners if o.role == ROLE_TEMPLATE for h in digests(o)}
    vms = [(o, digests(o)) for o in owners if o.role != ROLE_TEMPLATE]
    seen: dict[bytes, set[str]] = {}
    for o, hs in vms:
        for h in hs:
            seen.setdefault(h, set()).add(o.name)
    zh = hashlib.blake2b(zero, digest_size=16).digest()
    out: dict[str, Any] = {}
    for o, hs in vms:
        c = {"pages": len(hs), "zero": 0, "template_other_offset": 0, "other_vm": 0, "unique": 0}
        for h in hs:
            if h == zh:
                c["zero"] += 1
            elif h in tmpl:
                c["template_other_offset"] += 1
            elif len(seen[h]) > 1:
                c["other_vm"] += 1
            else:
                c["unique"] += 1
        out[o.name] = dict(c, task=o.info.get("task", "?"))
    return out


def merge_live(paths: list[Path]) -> dict[str, Any]:
    """One live report from several guest runs of the same recording; each run is tagged with
    the file it came from (its guest)."""
    merged: dict[str, Any] | None = None
    for p in paths:
        cur = json.loads(p.read_text())
        for r in cur["runs"]:
            r["guest"] = p.stem
        if merged is None:
            merged = cur
            continue
        if [v["name"] for v in cur["vms"]] != [v["name"] for v in merged["vms"]] or \
                cur.get("manifest", {}).get("time") != merged.get("manifest", {}).get("time"):
            raise SystemExit(f"microvm_report: {p} is from another recording")
        merged["runs"] += cur["runs"]
    if merged is None:
        raise SystemExit("microvm_report: no live JSON given")
    return merged


def _sb_owners(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in run.get("owners", []) if not o.get("is_template")
            and str(o.get("name", "")).startswith("vm")]


def kinds_of(run: dict[str, Any]) -> dict[str, int]:
    agg: dict[str, int] = {}
    for o in _sb_owners(run):
        for k, v in o.get("kinds", {}).items():
            agg[k] = agg.get(k, 0) + int(v)
    return agg


def owned_view(live: dict[str, Any], lim: dict[str, Any]) -> list[dict[str, Any]]:
    owned = sum(v["owned_pages"] for v in live["vms"]) * PAGE_SIZE
    rows: list[dict[str, Any]] = []
    for r in live["runs"]:
        if r.get("style") != "private" or "error" in r:
            continue
        payload = r.get("sandbox_payload_bytes")
        pool = r["sandbox_pool_bytes"]
        row = {"system": r["system"], "owned_bytes": owned,
               "swapped_bytes": r["swapped_out_bytes"], "payload_bytes": payload,
               "pool_bytes": pool, "ratio_pool": owned / pool if pool else 0.0,
               "ratio_payload": owned / payload if payload else None,
               "kinds": kinds_of(r) or {k: v for k, v in r["stats_after"].items()
                                        if k in ("same_pages", "huge_pages")},
               "verified": r.get("ok", False)}
        if r["system"].startswith("azswap"):
            sb = _sb_owners(r)
            row["owner_bytes"] = sum(o["exclusive_bytes"] + o["shared_bytes"] for o in sb)
            # "lz4/zstd:6": the VMs' codec; "zstd:6": the limit's codec (level 3)
            codec = r["system"].split("-")[1].split("/")[0].split(":")[0]
            limv = lim["results"].get(f"max-effort-{codec}")
            if limv and payload:
                row["limit_ratio"] = limv["ratio"]
                row["pct_of_limit"] = 100.0 * (owned / payload) / limv["ratio"]
        rows.append(row)
    for name in LIMIT_STRATEGIES:
        x = lim["results"].get(name)
        if x:
            rows.append({"system": f"host replay: {x['label']}",
                         "owned_bytes": x["sandbox_orig_bytes"],
                         "payload_bytes": x["sandbox_stored_bytes"], "pool_bytes": None,
                         "ratio_payload": x["ratio"], "ratio_pool": None,
                         "kinds": {k: v for k, v in x["sandbox_kinds"].items() if v}})
    base = next((x for x in rows if x["system"] == "zram-lz4"), None)
    for x in rows:
        if base and x.get("ratio_pool") and base["ratio_pool"]:
            x["vs_zram_lz4_pool"] = x["ratio_pool"] / base["ratio_pool"]
            # the other reading of "reduction": bytes saved (owned - pool), vs zram-lz4's
            saved_zram = base["owned_bytes"] - base["pool_bytes"]
            if saved_zram > 0:
                x["saved_vs_zram_lz4"] = (x["owned_bytes"] - x["pool_bytes"]) / saved_zram
        if base and x.get("ratio_payload") and base.get("ratio_payload"):
            x["vs_zram_lz4_payload"] = x["ratio_payload"] / base["ratio_payload"]
    return rows


def template_meta(run: dict[str, Any]) -> int:
    """azswap metadata of the template alone (fixed cost), 0 when the run cannot tell it apart.

    Runs that register the sandboxes before loading the template (meta_order
    "sandboxes-first") take stats_before after the per-slot tables exist, so
    stats_after_template - stats_before is the template's objects and index entries.  In runs
    that loaded the template first that difference also holds the per-slot index tables, so all
    their metadata stays in the per-VM cost (conservative).
    """
    if run.get("meta_order") != "sandboxes-first":
        return 0
    return max(0, run["stats_after_template"].get("meta", 0) - run["stats_before"].get("meta", 0))


def fleet_view(live: dict[str, Any], projections: tuple[int, ...]) -> list[dict[str, Any]]:
    n = len(live["vms"])
    nonzero = sum(v["nonzero_pages"] for v in live["vms"]) * PAGE_SIZE
    tmpl_raw = live["template_nonzero_pages"] * PAGE_SIZE
    rows = []
    for r in live["runs"]:
        if "error" in r:
            continue
        meta = r.get("meta_bytes", 0)
        pool = r["pool_bytes"]
        tmpl_pool = r.get("template_pool_bytes", 0)
        tmpl_meta = template_meta(r)
        # The decoded-base cache holds pages while they serve reads, so it grows with the
        # fleet's reads: it stays in the per-VM cost with the rest of the metadata.
        img = r.get("image") or {}
        # what the template image costs in swap once reclaimed (pool and, azswap, slots)
        img_swap = img.get("pool_bytes", 0) + img.get("meta_bytes", 0)
        if r["style"] == "private":
            page_cache = tmpl_raw
        elif r["style"] == "private-reclaim":
            page_cache = img.get("shmem_after_reclaim", 0)
        else:
            page_cache = 0
        fixed = page_cache + img_swap + tmpl_pool + tmpl_meta
        spent = page_cache + pool + meta
        per_vm = (spent - fixed) / n
        row = {"style": r["style"], "system": r["system"], "vms": n, "nonzero_bytes": nonzero,
               "template_page_cache_bytes": page_cache, "image_swap_bytes": img_swap,
               "template_bases_bytes": tmpl_pool, "sandbox_pool_bytes": r["sandbox_pool_bytes"],
               "meta_bytes": meta, "template_meta_bytes": tmpl_meta,
               "spent_bytes": spent, "fleet": nonzero / spent,
               "fixed_bytes": fixed, "per_vm_bytes": per_vm, "per_vm_nonzero": nonzero / n,
               "projected": {str(k): (k * nonzero / n) / (fixed + k * per_vm)
                             for k in projections}}
        rows.append(row)
    return rows


def restore_view(live: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in live["runs"]:
        if "error" in r:
            rows.append({"style": r["style"], "system": r["system"], "guest": r.get("guest", ""),
                         "error": r["error"]})
            continue
        rows.append({"style": r["style"], "system": r["system"], "guest": r.get("guest", ""),
                     "restore_s": r["restore_s"],
                     "pages": r["restored_pages"], "p50_us": r["load_p50_us"],
                     "p99_us": r["load_p99_us"], "swapout_s": r["swapout_s"],
                     "bad_pages": r["bad_pages"], "verified": r["ok"]})
        img = r.get("image")
        if img and "restore_s" in img:  # private-reclaim: the image read back (tmpfs swap-in)
            rows.append({"style": f"{r['style']} (image)", "system": r["system"],
                         "guest": r.get("guest", ""), "restore_s": img["restore_s"],
                         "pages": img["pages"], "p50_us": None, "p99_us": None,
                         "swapout_s": img["reclaim_s"], "bad_pages": img["bad_pages"],
                         "verified": img["bad_pages"] == 0})
            # the whole fleet back: every VM's own pages and the image they all map
            rows.append({"style": f"{r['style']} (owned + image)", "system": r["system"],
                         "guest": r.get("guest", ""),
                         "restore_s": r["restore_s"] + img["restore_s"],
                         "pages": r["restored_pages"] + img["pages"], "p50_us": None,
                         "p99_us": None, "swapout_s": r["swapout_s"] + img["reclaim_s"],
                         "bad_pages": r["bad_pages"] + img["bad_pages"],
                         "verified": r["ok"] and img["bad_pages"] == 0})
    # Restore times compare only within one guest run (same boot, same load on the host), each
    # with the zram-lz4 run of its style just before it (the first one after it if none is).
    for i, x in enumerate(rows):
        if "error" in x:
            continue
        same = [j for j, b in enumerate(rows) if b["style"] == x["style"]
                and b["system"] == "zram-lz4" and b.get("guest") == x.get("guest")
                and "error" not in b]
        j = max((j for j in same if j <= i), default=min(same, default=None))
        if j is not None and rows[j]["restore_s"]:
            x["vs_zram_lz4"] = x["restore_s"] / rows[j]["restore_s"]
    return rows


def _f(v: Any, fmt: str = ".2f", scale: float = 1.0) -> str:
    if v is None:
        return "-"
    return format(v / scale, fmt)


def markdown(live: dict[str, Any], owned: list[dict[str, Any]], fleet: list[dict[str, Any]],
             restore: list[dict[str, Any]], projections: tuple[int, ...],
             lim: dict[str, Any] | None = None,
             per_vm: list[dict[str, Any]] | None = None) -> str:
    lim = lim or {}
    m = live["manifest"]
    lines = [
        f"# microVM sandboxes: {len(live['vms'])} VMs restored from one snapshot",
        "",
        f"Recorded by vm-tests/microvm/record.py at {m.get('time')}: guest RAM {m.get('mem_mib')}"
        f" MiB, mlsandbox size {m.get('size')}, tasks {', '.join(v['task'] for v in live['vms'])}."
        f" Template: {live['template_nonzero_pages']} non-zero pages of {live['npages']}."
        f" Live run: kernel {live['kernel']}, {live['cpus']} vCPUs, "
        f"{live.get('mem_total_kb', 0) >> 10} MiB.",
        "",
        "## Owned pages (private-mapping restore)",
        "",
        "| system | owned MiB | stored payload MiB | pool MiB | ratio (payload) | ratio (pool) "
        "| vs zram-lz4 (pool) | vs zram-lz4 (payload) | bytes saved / zram-lz4's (pool) "
        "| % of limit | kinds | verified |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for x in owned:
        kinds = " ".join(f"{k}={v}" for k, v in x["kinds"].items() if v)
        lines.append(
            f"| {x['system']} | {_f(x['owned_bytes'], '.1f', MiB)} | "
            f"{_f(x['payload_bytes'], '.1f', MiB)} | {_f(x['pool_bytes'], '.1f', MiB)} | "
            f"{_f(x['ratio_payload'])} | {_f(x['ratio_pool'])} | "
            f"{_f(x.get('vs_zram_lz4_pool'))} | {_f(x.get('vs_zram_lz4_payload'))} | "
            f"{_f(x.get('saved_vs_zram_lz4'))} | "
            f"{_f(x.get('pct_of_limit'), '.0f')} | {kinds} | "
            f"{'-' if 'verified' not in x else ('yes' if x['verified'] else 'NO')} |")
    comp = lim.get("composition") or {}
    if comp:
        lines += [
            "",
            "What the owned pages are (exact page identity, from the trace):",
            "",
            "| VM | task | owned pages | zero | = a template page at another offset "
            "| = another VM's page | other |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for name, c in comp.items():
            lines.append(f"| {name} | {c['task']} | {c['pages']} | {c['zero']} | "
                         f"{c['template_other_offset']} | {c['other_vm']} | {c['unique']} |")
    per_vm = per_vm or []
    systems = sorted({k for x in per_vm for k in x["systems"]})
    if per_vm and systems:
        lines += [
            "",
            "Per VM (owned raw / stored; azswap: the owner's exclusive + shared objects, "
            "so objects shared between VMs count for each; per-page lz4 from the host replay):",
            "",
            "| VM | task | owned MiB | per-page lz4 | " + " | ".join(systems)
            + f" | {systems[0]} / per-page lz4 |",
            "|---|---|---:|---:|" + "---:|" * (len(systems) + 1),
        ]
        for x in per_vm:
            first = x["systems"].get(systems[0])
            lines.append(
                f"| {x['vm']} | {x['task']} | {_f(x['owned_bytes'], '.1f', MiB)} | "
                f"{_f(x['lz4_ratio'])} | "
                + " | ".join(_f(x["systems"].get(k)) for k in systems)
                + f" | {_f(first / x['lz4_ratio'] if first and x['lz4_ratio'] else None)} |")
    lines += [
        "",
        "## Fleet (sum of each VM's non-zero guest RAM / what the host spends)",
        "",
        "| style | system | non-zero MiB | template page cache MiB | template image in swap MiB "
        "| template bases MiB "
        "| sandboxes MiB | metadata MiB (fixed: the template's) | host spends MiB "
        "| fleet | "
        + " | ".join(f"N={k} (proj.)" for k in projections) + " |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(projections),
    ]
    for x in fleet:
        lines.append(
            f"| {x['style']} | {x['system']} | {_f(x['nonzero_bytes'], '.1f', MiB)} | "
            f"{_f(x['template_page_cache_bytes'], '.1f', MiB)} | "
            f"{_f(x.get('image_swap_bytes', 0), '.1f', MiB)} | "
            f"{_f(x['template_bases_bytes'], '.1f', MiB)} | "
            f"{_f(x['sandbox_pool_bytes'], '.1f', MiB)} | {_f(x['meta_bytes'], '.1f', MiB)} "
            f"({_f(x['template_meta_bytes'], '.1f', MiB)}) | "
            f"{_f(x['spent_bytes'], '.1f', MiB)} | {x['fleet']:.2f} | "
            + " | ".join(f"{x['projected'][str(k)]:.2f}" for k in projections) + " |")
    lines += [
        "",
        "## Restore (every page each VM wrote, faulted back and verified)",
        "",
        "| style | system | guest run | pages | restore s | vs zram-lz4 (same guest) | p50 µs "
        "| p99 µs | swap-out s | bad pages |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in restore:
        if "error" in x:
            lines.append(f"| {x['style']} | {x['system']} | ERROR: {x['error'][:80]} |||||||")
            continue
        lines.append(
            f"| {x['style']} | {x['system']} | {x.get('guest', '')} | {x['pages']} | "
            f"{x['restore_s']:.2f} | "
            f"{_f(x.get('vs_zram_lz4'))} | {_f(x['p50_us'], '.1f')} | {_f(x['p99_us'], '.1f')} | "
            f"{x['swapout_s']:.1f} | {x['bad_pages']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.microvm_report",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dir", type=Path, default=TOP / "vm-tests" / "out" / "microvm")
    ap.add_argument("--live", type=Path, action="append", default=[],
                    help="live JSON (repeat to merge guest runs); default "
                         "vm-tests/out/microvm-live.json")
    ap.add_argument("--limit-json", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--project", default="8,32,128", help="fleet projections (VM counts)")
    a = ap.parse_args(argv)
    proj = tuple(int(x) for x in a.project.split(",") if x)
    lpath = a.limit_json or a.dir / "limit.json"
    lim = json.loads(lpath.read_text()) if lpath.exists() else {}
    if lim.get("trace") == str(a.dir / "microvm.aztrace"):
        if "composition" not in lim or "per_vm_lz4" not in lim:
            if "composition" not in lim:
                lim["composition"] = composition(a.dir / "microvm.aztrace")
            if "per_vm_lz4" not in lim:
                lim["per_vm_lz4"] = per_vm_lz4(read_trace(a.dir / "microvm.aztrace"))
            lpath.write_text(json.dumps(lim, indent=1, default=float))
    else:
        lim = limit_figures(a.dir / "microvm.aztrace")
        lpath.write_text(json.dumps(lim, indent=1, default=float))
    live = merge_live(a.live or [TOP / "vm-tests" / "out" / "microvm-live.json"])
    owned = owned_view(live, lim)
    fleet = fleet_view(live, proj)
    restore = restore_view(live)
    per_vm = per_vm_view(live, lim)
    md = markdown(live, owned, fleet, restore, proj, lim, per_vm)
    print(md)
    (a.md or a.dir / "report.md").write_text(md)
    (a.json or a.dir / "report.json").write_text(json.dumps(
        {"owned": owned, "per_vm": per_vm, "fleet": fleet, "restore": restore, "limit": lim},
        indent=1,
        default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
