"""`make bench`: the evaluation report (markdown + PNG charts + raw JSON) in one command.

    python -m bench [--out bench-report] [--n 8] [--size default] [--seed 1]
        [--styles fork,fresh-aslr,fresh-noaslr,coding-fork,coding-fresh-aslr] [--systems ...]
        [--kernel 6.1|6.12|7.3]
        [--memory 3G] [--reuse-traces] [--skip-vm] [--scale 1,2,4,8,16]
        [--microvm auto|skip|DIR] [--no-phase] [--no-trim]

Steps (every figure is measured in this run):
 1. record each sandbox style on this machine (bench.record: the ML workloads of
    vm-tests/workloads/mlsandbox.py and the coding-agent ones of codingsandbox.py, N sandboxes,
    fixed seed) into OUT/traces/STYLE.aztrace;
    microVM style: the recording of vm-tests/microvm/record.py in vm-tests/out/microvm
    (--microvm auto: made now if missing, ~11 min the first time, docs/lab/microvm.md);
 2. boot the test kernel of --kernel's series once (vm-tests/run --kernel; the module built
    for it by `make kmod KERNEL=SERIES`) and play every process-style trace on every system
    (bench.swapbench; without --systems its default set, where a Linux baseline the kernel
    lacks is an "unavailable" row): OUT/swapbench.json; then, in the same guest, the tool-phase
    benchmark through the shipped daemon (bench.phasebench: no compression, aggressive
    compression blind to phases, `azctl daemon`; idle and loaded hosts, ml and coding
    styles): OUT/phasebench.json;
 3. replay every trace, the microVM one too, through the host store core per strategy, with the
    maximum-effort store and the stream reference (controlplane.trace.replay): OUT/replay.json
    (ratio, net ratio with metadata, total with the template); net reduction as sandboxes
    scale: replay of the first 1, 2, 4, ... sandboxes of the fork-style trace (recorded with
    max(--scale) sandboxes);
 4. host store/load MB/s vs python-lz4/zstandard (bench.hostbench): OUT/host.json;
 5. the trim step apart from compression: fork, fresh-aslr and coding-fork recorded again
    without and with each sandbox trimming its heap before the wait, both replayed
    (bench.trimbench): OUT/trim.json;
 6. OUT/report.md and OUT/*.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import hostbench, trimbench
from bench.kit.shell import logger
from bench.kit.table import fmt_min_med_max
from bench.record import STYLES, run_and_record
from bench.swapbench import DEFAULT_SYSTEMS, SYSTEMS
from controlplane.trace import PAGE_SIZE, ROLE_TEMPLATE, Trace, read_trace
from controlplane.trace import replay as rp

TOP = Path(__file__).resolve().parents[1]
DEFAULT_STYLES = ("fork", "fresh-aslr", "fresh-noaslr", "coding-fork", "coding-fresh-aslr")
TRIM_STYLES = ("fork", "fresh-aslr", "coding-fork")


log = logger("bench")


def subset(tr: Trace, k: int) -> Trace:
    """The template and the first k sandboxes of a trace."""
    sb = [o.id for o in tr.owners.values() if o.role != ROLE_TEMPLATE][:k]
    keep = {o.id for o in tr.owners.values() if o.role == ROLE_TEMPLATE} | set(sb)
    owners = {i: o for i, o in tr.owners.items() if i in keep}
    order = [(i, r) for i, r in tr.order if i in keep]
    return Trace(tr.meta, owners, order, sum(o.nr_pages for o in owners.values()))


REGIMES = {
    "none": "no compression",
    "aggressive": "aggressive, blind to phases",
    "daemon": "azctl daemon",
    "daemon-stream": "azctl daemon, tool-call streaming announced",
}


def charts(
    out: Path,
    sw: dict[str, Any],
    rep: list[dict[str, Any]],
    scale: list[dict[str, Any]],
    ph: dict[str, Any] | None = None,
):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    made = []
    # 1. reduction per system per style
    if sw.get("runs"):
        styles = [r["style"] for r in sw["runs"]]
        systems = [
            s
            for s in SYSTEMS
            if any(x["system"] == s and "net_ratio" in x for r in sw["runs"] for x in r["results"])
        ]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        w = 0.8 / max(1, len(systems))
        for j, s in enumerate(systems):
            vals = []
            for r in sw["runs"]:
                x = next((x for x in r["results"] if x["system"] == s and "net_ratio" in x), None)
                vals.append(x["net_ratio"] if x else 0)
            ax.bar(np.arange(len(styles)) + j * w, vals, w, label=s)
        for k, r in enumerate(rep):
            lim = next((x for x in r["results"] if x["strategy"] == "max-effort-zstd"), None)
            if lim and r["meta"].get("style") in styles:
                i = styles.index(r["meta"]["style"])
                ax.hlines(
                    lim["net_ratio"],
                    i - 0.1,
                    i + 0.9,
                    colors="k",
                    linestyles="dashed",
                    label="replay, maximum effort (zstd)" if k == 0 else None,
                )
        ax.set_xticks(np.arange(len(styles)) + 0.4 - w / 2, styles)
        ax.set_ylabel("sandbox bytes / (pool + metadata)")
        ax.set_title("Net memory reduction of sandbox pages pushed to swap (one guest per run)")
        ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        fig.savefig(out / "reduction.png", dpi=110)
        plt.close(fig)
        made.append("reduction.png")
    # 2. per-representation breakdown (replay, all strategies, per style)
    if rep:
        fig, axes = plt.subplots(1, len(rep), figsize=(4.5 * len(rep), 4), squeeze=False)
        for ax, r in zip(axes[0], rep, strict=True):
            names = [x["strategy"] for x in r["results"]]
            bottom = np.zeros(len(names))
            for kind in ("same", "dup", "tdelta", "xdelta", "plain", "raw"):
                v = np.array([x["sandbox_kinds"][kind] for x in r["results"]], dtype=float)
                tot = np.array([max(1, sum(x["sandbox_kinds"].values())) for x in r["results"]])
                ax.bar(names, v / tot * 100, bottom=bottom, label=kind)
                bottom += v / tot * 100
            ax.set_title(f"{r['meta'].get('style')}: sandbox pages by representation", fontsize=9)
            ax.set_ylabel("% of sandbox pages")
            ax.tick_params(axis="x", rotation=60, labelsize=7)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "representation.png", dpi=110)
        plt.close(fig)
        made.append("representation.png")
    # 3. load latency distribution
    if sw.get("runs"):
        fig, ax = plt.subplots(figsize=(8, 4))
        edges = np.logspace(0, 5, 41)
        r0 = sw["runs"][0]
        for x in r0["results"]:
            if x.get("load_hist_us"):
                h = np.array(x["load_hist_us"], dtype=float)
                ax.step(edges[:-1], np.cumsum(h) / max(1, h.sum()), where="post", label=x["system"])
        ax.set_xscale("log")
        ax.set_xlabel("first-touch latency per page (µs, guest under TCG)")
        ax.set_ylabel("fraction of sandbox pages")
        ax.set_title(f"Swap-in latency CDF ({r0['style']})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=110)
        plt.close(fig)
        made.append("latency.png")
    # 4. scaling
    if scale:
        fig, ax = plt.subplots(figsize=(7, 4))
        ks = [s["sandboxes"] for s in scale]
        for strat in ("lz4", "zstd", "xdelta", "all", "max-effort-zstd"):
            ys = [
                next(x["net_ratio"] for x in s["results"] if x["strategy"] == strat)
                for s in scale
            ]
            ax.plot(ks, ys, marker="o", label=rp.STRATEGIES[strat].label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("sandboxes forked from the template")
        ax.set_ylabel("sandbox bytes / (pool + metadata)")
        ax.set_title("Reduction as sandboxes scale (fork style, replay)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "scaling.png", dpi=110)
        plt.close(fig)
        made.append("scaling.png")
    # 5. reduction per sandbox style, microVM included (replay: per-page lz4 / zstd are what
    # zram and zswap store per page; "all" is azswap's store core)
    if rep:
        strat = ("lz4", "zstd", "xdelta", "all", "max-effort-zstd")
        fig, ax = plt.subplots(figsize=(9, 4.5))
        w = 0.8 / len(strat)
        names = [str(r["meta"].get("style", "?")) for r in rep]
        for j, s in enumerate(strat):
            vals = [
                next((x["net_ratio"] for x in r["results"] if x["strategy"] == s), 0.0)
                for r in rep
            ]
            ax.bar(np.arange(len(rep)) + j * w, vals, w, label=rp.STRATEGIES[s].label)
        ax.set_xticks(np.arange(len(rep)) + 0.4 - w / 2, names)
        ax.set_ylabel("sandbox bytes / (pool + metadata)")
        ax.set_title("Reduction per sandbox style (host replay of the same pages)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "styles.png", dpi=110)
        plt.close(fig)
        made.append("styles.png")
    runs = (ph or {}).get("runs", [])
    if runs:
        # 6. slowdown and memory saved per regime, per host and style (median over repeats)
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in runs:
            groups.setdefault(f"{r['host']}\n{r['style']}", []).append(r["regimes"])
        keys = [
            k
            for k in ("aggressive", "daemon", "daemon-stream")
            if any(k in g[0] for g in groups.values())
        ]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        w = 0.8 / max(len(keys), 1)
        x = np.arange(len(groups))
        for j, k in enumerate(keys):
            med = [
                [float(np.median([g[k][f] for g in gs if g.get(k) and g[k].get(f) is not None]
                                 or [0.0])) for gs in groups.values()]
                for f in ("slowdown", "saved_mib")
            ]
            ax1.bar(x + j * w, med[0], w, label=REGIMES[k])
            ax2.bar(x + j * w, med[1], w, label=REGIMES[k])
        ax1.axhline(1.0, color="k", linestyle="dashed", linewidth=0.8)
        ax1.set_ylabel("tool-phase latency / no compression's")
        ax1.set_title("Tool-phase slowdown (median over runs)")
        ax2.set_ylabel("MiB (time-averaged footprint saved)")
        ax2.set_title("Memory saved vs no compression")
        for ax in (ax1, ax2):
            ax.set_xticks(x + 0.4 - w / 2, list(groups))
            ax.tick_params(axis="x", labelsize=7)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "slowdown.png", dpi=110)
        plt.close(fig)
        made.append("slowdown.png")
    return made


def fmt_sw(sw: dict[str, Any]) -> list[str]:
    lines = []
    for run in sw.get("runs", []):
        base = next((x for x in run["results"] if x["system"] == "zram-lz4" and "ratio" in x), None)
        lines += [
            f"### {run['style']} ({run['meta'].get('n')} sandboxes, "
            f"size {run['meta'].get('size')})",
            "",
            "| system | owned MiB | stored MiB | metadata MiB | reduction | net reduction | "
            "net vs zram-lz4 | template stored MiB | total reduction | swap-out MB/s | "
            "swap-in MB/s | load p50 µs | load p99 µs | p99 vs zram-lz4 | verified |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        ]
        for x in run["results"]:
            if "error" in x:
                what = "unavailable" if x.get("unavailable") else "error"
                lines.append(f"| {x['system']} | {what}: {x['error'][:160]} |")
                continue
            rel = (
                f"{x['net_ratio'] / base['net_ratio']:.2f}x"
                if base and base.get("net_ratio") and x.get("net_ratio")
                else "-"
            )
            meta = f"{x['meta_bytes'] / 2**20:.2f}" if "meta_bytes" in x else "-"
            net = f"{x['net_ratio']:.2f}" if "net_ratio" in x else "-"
            r99 = (
                f"{x.get('load_p99_us', 0) / base['load_p99_us']:.2f}x"
                if base and base.get("load_p99_us") and x["system"] != "none"
                else "-"
            )
            tot = f"{x['total_ratio']:.2f}" if "total_ratio" in x else "-"
            lines.append(
                f"| {x['system']} | {x['owned_bytes'] / 2**20:.1f} | "
                f"{x['stored_bytes'] / 2**20:.1f} | {meta} | {x['ratio']:.2f} | {net} | {rel} | "
                f"{x.get('template_stored_bytes', 0) / 2**20:.1f} | "
                f"{tot} | {x.get('swapout_mbps', 0):.1f} | {x.get('swapin_mbps', 0):.1f} | "
                f"{x.get('load_p50_us', 0):.0f} | {x.get('load_p99_us', 0):.0f} | {r99} | "
                f"{'yes' if x.get('ok') else 'NO'} |"
            )
        lines.append("")
    return lines


def fmt_replay(rep: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rep:
        base = next(x for x in r["results"] if x["strategy"] == "lz4")
        ref = next((x for x in r["results"] if x["strategy"] == rp.STREAM_REF), None)
        lines += [
            f"### {r['meta'].get('style')}: {r['pages']} pages "
            f"({r['pages'] * PAGE_SIZE / 2**20:.0f} MiB incl. template)",
            "",
            "| strategy | sandbox MiB | stored MiB | metadata MiB | reduction | net reduction | "
            "net vs lz4 | net / stream | template stored MiB | total reduction | store MB/s | "
            "load MB/s | sandbox pages by kind |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        ]
        for x in r["results"]:
            kinds = " ".join(f"{k}={v}" for k, v in x["sandbox_kinds"].items() if v)
            vs_ref = f"{x['net_ratio'] / ref['net_ratio']:.2f}" if ref else "-"
            lines.append(
                f"| {x['label']} | {x['sandbox_orig_bytes'] / 2**20:.1f} | "
                f"{x['sandbox_stored_bytes'] / 2**20:.1f} | {x['meta_bytes'] / 2**20:.2f} | "
                f"{x['ratio']:.2f} | {x['net_ratio']:.2f} | "
                f"{x['net_ratio'] / base['net_ratio']:.2f}x | {vs_ref} | "
                f"{x['template_stored_bytes'] / 2**20:.1f} | {x['total_ratio']:.2f} | "
                f"{x['put_mbps']:.0f} | {x['get_mbps']:.0f} | {kinds} |"
            )
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", default=str(TOP / "bench-report"))
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--size", default="default")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--styles", default=",".join(DEFAULT_STYLES))
    ap.add_argument("--systems", default=None,
                    help="comma list (default: " + ",".join(DEFAULT_SYSTEMS) + ")")
    ap.add_argument("--kernel", default=None, choices=("6.1", "6.12", "7.3"),
                    help="kernel series the guest boots (vm-tests/run --kernel; default 6.1)")
    ap.add_argument("--memory", default="3G")
    ap.add_argument("--scale", default="1,2,4,8,16")
    ap.add_argument("--reuse-traces", action="store_true")
    ap.add_argument("--skip-vm", action="store_true", help="reuse OUT/swapbench.json")
    ap.add_argument(
        "--microvm",
        default="auto",
        help="microVM recording dir (auto: vm-tests/out/microvm, recorded if missing; skip)",
    )
    ap.add_argument("--no-phase", action="store_true", help="skip the tool-phase benchmark")
    ap.add_argument("--no-trim", action="store_true", help="skip the trim-step measurement")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild report.md and the charts from OUT/*.json",
    )
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.report_only:
        return report_only(out, a)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    styles = [s for s in a.styles.split(",") if s]
    bad = [s for s in styles if s not in STYLES]
    if bad:
        ap.error(f"unknown style(s) {','.join(bad)} (from {','.join(STYLES)})")
    traces = []
    for st in styles:
        p = out / "traces" / f"{st}.aztrace"
        if not (a.reuse_traces and p.exists()):
            run_and_record(st, a.n, a.size, a.seed, str(p), log=log)
        traces.append(str(p))
    mv_trace = microvm_trace(a.microvm)
    # 2. guest
    swj = out / "swapbench.json"
    if not a.skip_vm:
        vm_out = TOP / "vm-tests" / "out" / "bench-traces"
        vm_out.mkdir(parents=True, exist_ok=True)
        guest_traces = []
        for p in traces:  # the guest sees the checkout read-only: traces go to vm-tests/out
            dst = vm_out / Path(p).name
            if os.path.abspath(p) != str(dst):
                dst.write_bytes(Path(p).read_bytes())
            guest_traces.append(str(dst))
        py = str(TOP / ".venv" / "bin" / "python")
        vo = TOP / "vm-tests" / "out"
        swap = f"{py} -m bench.swapbench " + (f"--systems {a.systems} " if a.systems else "")
        swap += f"--json {vo / 'swapbench.json'} " + " ".join(f"--trace {p}" for p in guest_traces)
        steps = [swap]
        if not a.no_phase:
            steps.append(
                f"{py} -m bench.phasebench --seed {a.seed} "
                f"--json {vo / 'phasebench.json'}"
            )
        # every step runs; the guest's exit status is the first failure
        script = "r=0; " + " ".join(f"{s} || r=$?;" for s in steps) + " exit $r"
        for name in ("swapbench.json", "phasebench.json"):
            (vo / name).unlink(missing_ok=True)
        cmd = [str(TOP / "vm-tests" / "run"), "--memory", a.memory, "--timeout", "7200"]
        cmd += (["--kernel", a.kernel] if a.kernel else []) + ["--"]
        cmd += ["sh", "-c", script]
        log("booting the test kernel: " + script)
        rc = subprocess.run(cmd, cwd=TOP).returncode
        for name in ("swapbench.json", "phasebench.json"):
            if (vo / name).exists():
                (out / name).write_text((vo / name).read_text())
        if rc:
            log(f"the guest exited {rc} (see above): no report; what it measured is in {out}")
            return rc
    sw = json.loads(swj.read_text()) if swj.exists() else {}
    phj = out / "phasebench.json"
    ph = json.loads(phj.read_text()) if phj.exists() and not a.no_phase else None
    # 3. replay
    log("replay through the host store core")
    rep = [rp.run(p, rp.DEFAULT) for p in [*traces, *([mv_trace] if mv_trace else [])]]
    for r in rep:
        rp.print_table(r)
    (out / "replay.json").write_text(json.dumps(rep, indent=1, default=float))
    scale: list[dict[str, Any]] = []
    ks = [int(k) for k in a.scale.split(",") if k]
    if ks and "fork" in styles:
        p = out / "traces" / f"fork-n{max(ks)}.aztrace"
        if not (a.reuse_traces and p.exists()):
            run_and_record("fork", max(ks), a.size, a.seed, str(p), log=log)
        big = read_trace(p)
        for k in ks:
            sub = subset(big, k)
            res = [
                rp.replay(sub, rp.STRATEGIES[s])
                for s in ("lz4", "zstd", "xdelta", "all", "max-effort-zstd")
            ]
            scale.append({"sandboxes": k, "results": res})
            log(
                f"scaling: {k} sandboxes: "
                + ", ".join(f"{x['strategy']} {x['net_ratio']:.2f}" for x in res)
            )
        (out / "scaling.json").write_text(json.dumps(scale, indent=1, default=float))
    # 4. host
    log("host store/load throughput")
    host = [hostbench.run(p, 3) for p in traces[:1]]
    for h in host:
        hostbench.print_table(h)
    (out / "host.json").write_text(json.dumps(host, indent=1))
    # 5. the trim step, apart from compression (host recordings, replay)
    trim = [
        trimbench.measure(st, a.n, a.size, a.seed, out / "traces", log=log)
        for st in TRIM_STYLES
        if st in styles and not a.no_trim
    ]
    (out / "trim.json").write_text(json.dumps(trim, indent=1))
    # 6. report
    made = charts(out, sw, rep, scale, ph)
    write_report(out, a, sw, rep, scale, host, made, ph, trim)
    log(f"wrote {out / 'report.md'}")
    return 0


def report_only(out: Path, a: argparse.Namespace) -> int:
    def load(name: str, empty: Any) -> Any:
        p = out / name
        return json.loads(p.read_text()) if p.exists() else empty

    rep = load("replay.json", [])
    if not rep:
        log(f"{out}/replay.json missing: run the whole bench first")
        return 1
    sw, scale, host = load("swapbench.json", {}), load("scaling.json", []), load("host.json", [])
    ph = None if a.no_phase else load("phasebench.json", None)
    made = charts(out, sw, rep, scale, ph)
    write_report(out, a, sw, rep, scale, host, made, ph, load("trim.json", []))
    log(f"wrote {out / 'report.md'} from the JSON of the last run")
    return 0


def microvm_trace(arg: str) -> str | None:
    """The microVM recording's trace: an existing one, or recorded now (arg auto), or none."""
    if arg == "skip":
        return None
    d = TOP / "vm-tests" / "out" / "microvm" if arg == "auto" else Path(arg)
    p = d / "microvm.aztrace"
    if p.exists():
        log(f"microVM style: reusing {p}")
        return str(p)
    if arg != "auto":
        raise SystemExit(f"bench: {p}: no microVM recording there")
    log("microVM style: recording 8 guests restored from one snapshot (docs/lab/microvm.md)")
    rc = subprocess.run(
        [
            sys.executable,
            str(TOP / "vm-tests" / "microvm" / "record.py"),
            "--n",
            "8",
            "--out",
            str(d),
        ],
        cwd=TOP,
    ).returncode
    if rc or not p.exists():
        log(f"microVM recording failed (exit {rc}); the report goes on without that style")
        return None
    return str(p)


def fmt_phase(ph: dict[str, Any]) -> list[str]:
    from bench.phasebench import spread

    runs = ph.get("runs", [])
    if not runs:
        return []
    cfg = ph.get("config", {})
    lines = [
        "## Tool phases after LLM waits, through the daemon",
        "",
        f"Sandboxes started from one template (each page the template's with a small edit), "
        f"{cfg.get('cycles')} LLM-wait/tool cycles each (waits lognormal in [0.5, 20] s x "
        f"{ph.get('wait_scale')}, tool work 0.1-5 s, hot sets drifting 10-30% a cycle); "
        f"idle host: staggered; loaded: more sandboxes than the guest's {ph.get('cpus')} vCPUs, "
        f"all at once. Swap {ph.get('swap')}, THP {ph.get('thp')} (host: "
        f"{ph.get('thp_host')}). Slowdown = mean tool-phase latency / no compression's, same "
        "run; saved = time-averaged footprint (sandboxes' memory.current + the device's pool "
        "and metadata) below no compression's; keeps = saved / aggressive's saved.",
        "",
        "| host | style | regime | runs | slowdown min / med / max | keeps min / med / max | "
        "saved MiB (median) | bad pages |",
        "|---|---|---|--:|--:|--:|--:|--:|",
    ]
    rows = spread(runs)
    for r in rows:
        saved = f"{r['saved_mib'][1]:.1f}" if r["saved_mib"] else "-"
        lines.append(
            f"| {r['host']} | {r['style']} | {REGIMES.get(r['regime'], r['regime'])} | "
            f"{r['runs']} | {fmt_min_med_max(r['slowdown'])} | "
            f"{fmt_min_med_max(r['keeps'], pct=True)} | {saved} | "
            f"{r['bad_pages']} |"
        )
    lines.append("")
    drift = [r for r in rows if r.get("bracket")]
    if drift:
        lines += [
            "No compression ran before and after each run's other regimes; its figures are the "
            "mean of both. Its tool mean (s) before, after, and after / before, min / med / max:",
            "",
            "| host | style | before | after | after / before |",
            "|---|---|--:|--:|--:|",
        ]
        lines += [f"| {r['host']} | {r['style']} | {fmt_min_med_max(r['bracket']['before'])} | "
                  f"{fmt_min_med_max(r['bracket']['after'])} | "
                  f"{fmt_min_med_max(r['bracket']['drift'])} |" for r in drift]
        lines.append("")
    return lines


def write_report(
    out: Path,
    a: argparse.Namespace,
    sw: dict[str, Any],
    rep: list[dict[str, Any]],
    scale: list[dict[str, Any]],
    host: list[dict[str, Any]],
    made: list[str],
    ph: dict[str, Any] | None = None,
    trim: list[dict[str, Any]] | None = None,
) -> None:
    L = [
        "# azswap evaluation report",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python -m "
        f"bench` ({a.n} sandboxes, size `{a.size}`, seed {a.seed}). Every figure "
        "below was measured in this run.",
        "",
        "## Machine",
        "",
        f"- host: {platform.node()}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
        f"Python {platform.python_version()}",
        f"- guest: kernel {sw.get('kernel', '?')}, {sw.get('cpus', '?')} vCPUs under QEMU TCG, "
        f"{(sw.get('mem_total_kb') or 0) // 1024} MiB RAM; time figures inside the guest are "
        "emulated: compare them only as ratios between systems of the same run.",
        "",
        "## Workloads",
        "",
        "A template Python process holds a transformer's float32 weights, Adam state, a "
        "tokenized dataset and Python heaps (tokenizer, corpus, records, warmed interpreter); "
        "sandboxes run training, generation, data processing, evaluation and SFT trajectories "
        "(vm-tests/workloads/mlsandbox.py). Coding-agent sandboxes (`coding-*`, "
        "vm-tests/workloads/codingsandbox.py): a template interpreter holds a source tree (the "
        "Python standard library's sources), its symbol index, ASTs, an sqlite database and a "
        "conversation history; sandboxes parse, search, edit (with diffs), query and test it. "
        "Styles: `fork` (sandboxes forked from the template; "
        "they own their CoW copies and new pages), `fresh-aslr` / `fresh-noaslr` (independent "
        "processes with ASLR on / off). Each style is recorded once "
        "(docs/trace-format.md) and played back into live processes for every system, so every "
        "system sees byte-identical pages (owned bytes match across rows). `microvm-snapshot` "
        "(replay only; live figures in docs/lab/microvm.md): 8 QEMU guests restored from one "
        "snapshot, each with its own task, their pages that differ from the snapshot's.",
        "",
    ]
    if made:
        L += ["## Charts", ""]
        expl = {
            "reduction.png": "Net reduction: sandbox-owned bytes divided by the pool bytes and "
            "metadata each system holds for them after memory.reclaim (higher is better); "
            "dashed: the replay's maximum-effort store on the same pages.",
            "representation.png": "How the store core represents the sandboxes' pages per "
            "strategy (replay); same/dup/delta pages are what per-page "
            "compression cannot see.",
            "latency.png": "Cumulative distribution of per-page first-touch latency (the swap-in "
            "fault) in the guest; TCG inflates absolute values.",
            "scaling.png": "Reduction of the fork-style workload for the first k sandboxes "
            "(replay). Their tasks go round robin (train, generate, data, eval, sft): k=1 is "
            "one training sandbox whose rewritten weights nothing compresses, so the curve "
            "shows the task mix as much as the sharing.",
            "styles.png": "Reduction per sandbox style, microVM included, through the host "
            "store core: per-page lz4/zstd is what zram and zswap keep per page; "
            "'all' is azswap's store.",
            "slowdown.png": "Tool-phase latency relative to no compression (left) and the "
            "memory each regime saves (right), per host and style, medians over runs.",
        }
        for m in made:
            L += [f"![{m}]({m})", "", expl.get(m, ""), ""]
    L += [
        "## In the guest: the same pages on every system",
        "",
        "owned = memory.stat anon of the sandbox cgroups before reclaim; stored = bytes the "
        "system's allocator holds for the sandboxes' pages (zram mem_used_total, zswap "
        "pool_total_size + pages it passed to the backing ramdisk, azswap pool bytes), the "
        "template's pages reclaimed first and reported apart; metadata = what the system spends "
        "outside its pool on them (zram's table entries, zswap's entries, azswap's slot entries, "
        "object headers, indexes and caches; docs/bench.md, \"Net ratio\"); reduction = owned / "
        "stored, net reduction = owned / (stored + metadata); total reduction counts the "
        "template's pages, pool and metadata too.",
        "",
    ]
    L += fmt_sw(sw) if sw else ["(no guest run)", ""]
    L += [
        "## Replay through the host store core (same C as azswap.ko)",
        "",
        "reduction = sandbox bytes / bytes the sandboxes' pages added to the store (template "
        "stored first, apart); net reduction counts the store's metadata too (docs/trace-"
        "format.md, \"Replay output\"). `max-effort` is sim_effort max with every delta "
        "accepted; `stream-ref` is one zstd -19 stream of the sandboxes' pages with the template "
        "as prefix: a ceiling with no random access, not a store.",
        "",
    ]
    L += fmt_replay(rep)
    if ph:
        L += fmt_phase(ph)
    if scale:
        L += [
            "## Scaling (fork style, replay)",
            "",
            "| sandboxes | " + " | ".join(x["label"] for x in scale[0]["results"]) + " |",
            "|--:|" + "--:|" * len(scale[0]["results"]),
        ]
        for s in scale:
            L.append(
                f"| {s['sandboxes']} | "
                + " | ".join(f"{x['net_ratio']:.2f}" for x in s["results"])
                + " |"
            )
        L.append("")
    if trim:
        L += [
            "## Trim step, apart from compression (host recordings, replay)",
            "",
            "The same sandboxes recorded without and with the trim step (controlplane.trim: "
            "gc.collect and malloc_trim(0) in each sandbox before its wait; docs/daemon-protocol."
            "md, \"Trim step\"). trim alone = sandbox bytes without / with; held = stored + "
            "metadata in the store core; \"with trim\" = held without / held with.",
            "",
            *trimbench.table(trim),
            "",
        ]
    if host:
        L += [
            "## Host: store core vs python-lz4 / python-zstandard (same pages, one CPU)",
            "",
            "| system | stored MiB | ratio | store MB/s | load MB/s |",
            "|---|--:|--:|--:|--:|",
        ]
        for h in host:
            for name, r in h["rows"].items():
                L.append(
                    f"| {name} | {r['stored_bytes'] / 2**20:.1f} | {r['ratio']:.2f} | "
                    f"{r['put_mbps']:.0f} | {r['get_mbps']:.0f} |"
                )
        L.append("")
    (out / "report.md").write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    sys.exit(main())
