"""Per-sandbox and global figures: one dict (``azctl stats --json``) and its Prometheus text form.

:func:`build` joins what the module reports per owner (netlink STATS dump), the device's sysfs
stat files, the registry's names and the daemon's phase/compression state.  :func:`to_prometheus`
renders that same dict with prometheus-client, so the two views can never disagree.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane import errors
from controlplane.abi import KINDS, OwnerStats
from controlplane.registry import ModuleBackend, Registry
from controlplane.sysfs import Device


def ratio(orig: int, stored: int) -> float | None:
    return round(orig / stored, 3) if stored else None


def _owner_figures(o: OwnerStats) -> dict[str, Any]:
    return {
        "cgroup_id": o.cgroup_id,
        "group": o.group,
        "module_phase": o.phase.label,
        "pages": o.pages,
        "orig_bytes": o.orig_bytes,
        "stored_bytes": o.stored_bytes,
        "exclusive_bytes": o.exclusive_bytes,
        "shared_bytes": o.shared_bytes,
        "ratio": ratio(o.orig_bytes, o.stored_bytes),
        "kinds": dict(o.kinds),
    }


def build(
    module: ModuleBackend,
    registry: Registry | None = None,
    device: Device | None = None,
    phases: dict[str, dict[str, Any]] | None = None,
    compress: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The stats dict.  ``phases``/``compress`` are the daemon's views by sandbox name."""
    owners = module.stats()
    names = registry.by_id() if registry else {}
    totals: dict[str, Any] = {
        "pages": 0,
        "orig_bytes": 0,
        "stored_bytes": 0,
        "sandbox_stored_bytes": 0,
        "template_stored_bytes": 0,
        "kinds": dict.fromkeys(KINDS, 0),
    }
    sandboxes, templates, other = [], [], []
    for o in owners:
        totals["pages"] += o.pages
        totals["orig_bytes"] += o.orig_bytes
        totals["stored_bytes"] += o.stored_bytes
        for k in KINDS:
            totals["kinds"][k] += o.kinds.get(k, 0)
        key = "template_stored_bytes" if o.is_template else "sandbox_stored_bytes"
        totals[key] += o.stored_bytes
        fig = _owner_figures(o)
        name = names.get(o.cgroup_id)
        if o.cgroup_id == 0:
            other.append({"name": "(unregistered)", **fig})
        elif o.is_template:
            t = registry.templates.get(name) if registry and name else None
            templates.append(
                {
                    "name": name or f"cg{o.cgroup_id}",
                    "cgroup_path": t.cgroup_path if t else None,
                    "source_file": t.source_file if t else None,
                    **fig,
                }
            )
        else:
            sb = registry.sandboxes.get(name) if registry and name else None
            entry: dict[str, Any] = {
                "name": name or f"cg{o.cgroup_id}",
                "cgroup_path": sb.cgroup_path if sb else None,
                "template": sb.template if sb else None,
                **fig,
            }
            if sb is not None and registry is not None:
                cg = registry.cgroup(sb)
                try:
                    entry["memory_current"] = cg.memory_current() if cg else None
                except errors.AzswapError:
                    entry["memory_current"] = None
            if phases and entry["name"] in phases:
                entry["phase"] = phases[entry["name"]]
            if compress and entry["name"] in compress:
                entry["compress"] = compress[entry["name"]]
            sandboxes.append(entry)
    totals["ratio"] = ratio(totals["orig_bytes"], totals["stored_bytes"])
    pages = totals["pages"]
    totals["kind_share"] = {
        k: round(v / pages, 4) if pages else 0.0 for k, v in totals["kinds"].items()
    }
    out: dict[str, Any] = {
        "time": time.time(),
        "totals": totals,
        "sandboxes": sorted(sandboxes, key=lambda s: s["name"]),
        "templates": sorted(templates, key=lambda s: s["name"]),
        "unregistered": other,
    }
    try:
        out["policy"] = module.policy_get().to_dict()
    except errors.AzswapError as e:
        out["policy"] = {"error": str(e)}
    if device is not None:
        try:
            out["device"] = device.snapshot().to_dict() if device.exists() else None
        except errors.AzswapError as e:
            out["device"] = {"error": str(e)}
    return out


class _StatsCollector(Collector):
    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        d = self.source() if callable(self.source) else self.source
        yield from families(d)


def families(d: dict[str, Any]) -> Iterable[GaugeMetricFamily]:
    t = d["totals"]
    for key, help_ in (
        ("pages", "pages held in azswap now"),
        ("orig_bytes", "original bytes of the pages held"),
        ("stored_bytes", "bytes their objects take in the pool"),
        ("sandbox_stored_bytes", "stored bytes charged to sandboxes"),
        ("template_stored_bytes", "stored bytes charged to templates"),
    ):
        g = GaugeMetricFamily(f"azswap_{key}", help_)
        g.add_metric([], t[key])
        yield g
    kinds = GaugeMetricFamily("azswap_kind_pages", "pages per representation", labels=["kind"])
    for k, v in t["kinds"].items():
        kinds.add_metric([k], v)
    yield kinds
    owner_labels = ["name", "kind"]
    fams = {
        key: GaugeMetricFamily(
            f"azswap_owner_{key}", f"per sandbox/template: {key}", labels=owner_labels
        )
        for key in ("pages", "orig_bytes", "stored_bytes", "exclusive_bytes", "shared_bytes")
    }
    okinds = GaugeMetricFamily(
        "azswap_owner_kind_pages", "per owner pages per representation", labels=["name", "repr"]
    )
    mem = GaugeMetricFamily(
        "azswap_sandbox_memory_current_bytes", "cgroup memory.current", labels=["name"]
    )
    comp_wall = GaugeMetricFamily(
        "azswap_sandbox_reclaim_seconds", "time spent in memory.reclaim for it", labels=["name"]
    )
    comp_cpu = GaugeMetricFamily(
        "azswap_sandbox_reclaim_cpu_seconds", "CPU spent in memory.reclaim for it", labels=["name"]
    )
    for kind, rows in (("sandbox", d["sandboxes"]), ("template", d["templates"])):
        for r in rows:
            for key, fam in fams.items():
                fam.add_metric([r["name"], kind], r[key])
            for k, v in r["kinds"].items():
                okinds.add_metric([r["name"], k], v)
            if r.get("memory_current") is not None:
                mem.add_metric([r["name"]], r["memory_current"])
            c = r.get("compress")
            if c:
                comp_wall.add_metric([r["name"]], c.get("total_wall", 0.0))
                comp_cpu.add_metric([r["name"]], c.get("total_cpu", 0.0))
    yield from fams.values()
    yield from (okinds, mem, comp_wall, comp_cpu)


def to_prometheus(d: dict[str, Any]) -> str:
    reg = CollectorRegistry()
    reg.register(_StatsCollector(d))
    return generate_latest(reg).decode()


def registry_for(source: Any) -> CollectorRegistry:
    """A prometheus CollectorRegistry that calls ``source()`` (a stats dict) on every scrape."""
    reg = CollectorRegistry()
    reg.register(_StatsCollector(source))
    return reg
