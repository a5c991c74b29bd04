"""Run a sandbox workload and record it as a page trace: the ML sandboxes
(vm-tests/workloads/mlsandbox.py) or the coding-agent ones (codingsandbox.py).

    python -m bench.record --style [coding-]fork|fresh-aslr|fresh-noaslr [--n 8] [--size S]
        [--seed 1] [--trim] --out TRACE

fork          a template process builds the state and forks N sandboxes (each joins its own memory
              cgroup when cgroups are available); a sandbox owns the pages it maps exclusively.
fresh-aslr    the template and N sandboxes started as independent processes (ASLR on).
fresh-noaslr  the same under personality ADDR_NO_RANDOMIZE (setarch -R): same layout, same indexes.
coding-STYLE  the coding-agent workload (codingsandbox.py) started as STYLE.

Every process runs with PYTHONHASHSEED=0 and a fixed seed, so a rerun builds the same pages.
Works on the host (no cgroups needed) and in the test guest.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.kit import cgroups
from controlplane.trace import PAGE_SIZE, ROLE_SANDBOX, ROLE_TEMPLATE
from controlplane.trace.recorder import Proc, record

TOP = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "ml": TOP / "vm-tests" / "workloads" / "mlsandbox.py",
    "coding": TOP / "vm-tests" / "workloads" / "codingsandbox.py",
}
PROC_STYLES = ("fork", "fresh-aslr", "fresh-noaslr")
# "coding-STYLE": the coding-agent workload started the same way
STYLES = PROC_STYLES + tuple(f"coding-{s}" for s in PROC_STYLES)


def split_style(style: str) -> tuple[str, str]:
    """(workload, how its processes start) of a style name: "coding-fork" -> coding, fork."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r} (from {', '.join(STYLES)})")
    if style.startswith("coding-"):
        return "coding", style.removeprefix("coding-")
    return "ml", style
CGROOT = Path("/sys/fs/cgroup")


def cgroups_usable() -> bool:
    return (
        os.geteuid() == 0
        and (CGROOT / "cgroup.subtree_control").exists()
        and os.access(CGROOT, os.W_OK)
    )


def cg_anon(cg: Path) -> int:
    return cgroups.stat(cg).get("anon", 0)


def wait_ready(
    status: Path, names: list[str], procs: list[subprocess.Popen], timeout: float
) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        have = {
            n: int((status / f"{n}.ready").read_text())
            for n in names
            if (status / f"{n}.ready").exists()
        }
        if len(have) == len(names):
            return have
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"workload process {p.args[-1]!s} exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"workload not ready after {timeout:.0f}s: have {sorted(have)}")
        time.sleep(0.2)


def run_and_record(
    style: str,
    n: int,
    size: str,
    seed: int,
    out: str,
    *,
    python: str | None = None,
    cgroup_root: Path | None = None,
    timeout: float = 1800,
    group: int = 1,
    trim: bool = False,
    log=print,
) -> dict[str, Any]:
    """Start the workload, wait until every process idles, record, stop everything."""
    workload, proc_style = split_style(style)
    script = WORKLOADS[workload]
    py = python or sys.executable
    names = ["template"] + [f"sb{i}" for i in range(n)]
    status = Path(tempfile.mkdtemp(prefix="azrec-"))
    cgs: dict[str, Path] = {}
    if cgroup_root is not None:
        cgs = cgroups.make_tree(cgroup_root, names)
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    common = ["--seed", str(seed), "--size", size, "--status", str(status)]
    common += ["--trim"] if trim else []
    procs: list[subprocess.Popen] = []
    t0 = time.monotonic()
    try:
        if proc_style == "fork":
            cmd = [
                py,
                str(script),
                "--role",
                "template",
                "--style",
                "fork",
                "--n",
                str(n),
                *common,
            ]
            if cgs:
                cmd += ["--cgroup-root", str(cgroup_root)]
            procs.append(
                subprocess.Popen(cmd, env=env, preexec_fn=cgroups.joiner(cgs.get("template")))
            )
        else:
            pre = ["setarch", "-R"] if proc_style == "fresh-noaslr" else []
            procs.append(
                subprocess.Popen(
                    [*pre, py, str(script), "--role", "template", "--style", "fresh", *common],
                    env=env,
                    preexec_fn=cgroups.joiner(cgs.get("template")),
                )
            )
            for i in range(n):
                procs.append(
                    subprocess.Popen(
                        [*pre, py, str(script), "--role", "sandbox", "--index", str(i), *common],
                        env=env,
                        preexec_fn=cgroups.joiner(cgs.get(f"sb{i}")),
                    )
                )
        pids = wait_ready(status, names, procs, timeout)
        t_run = time.monotonic() - t0
        log(f"[record] {style}: {n} sandboxes ready after {t_run:.0f}s; recording")
        anon = {nm: cg_anon(cg) for nm, cg in cgs.items()}
        plist = [
            Proc(
                pids["template"], 1000, group, ROLE_TEMPLATE, "template", info={"task": "template"}
            )
        ]
        tasks = tuple(_read_tasks(script))
        if not tasks:
            raise RuntimeError(f"{script}: no TASKS = (...) line")
        for i in range(n):
            plist.append(
                Proc(
                    pids[f"sb{i}"],
                    1 + i,
                    group,
                    ROLE_SANDBOX,
                    f"sb{i}",
                    exclusive=proc_style == "fork",
                    info={"task": tasks[i % len(tasks)]},
                )
            )
        meta = {
            "style": style,
            "n": n,
            "size": size,
            "seed": seed,
            "recorded_at": time.time(),
            "kernel": os.uname().release,
            "workload": workload,
            "workload_script": str(script.relative_to(TOP)),
            # the coding workload's pages are this interpreter's standard library sources
            "python": subprocess.run([py, "-c", "import sys; print(sys.version)"],
                                     capture_output=True, text=True).stdout.strip(),
            "run_seconds": round(t_run, 1),
            "cgroup_anon_bytes": anon,
            "trim": trim,
        }
        t1 = time.monotonic()
        stats = record(out, plist, meta)
        log(
            f"[record] {style}: wrote {out} in {time.monotonic() - t1:.0f}s: "
            + ", ".join(f"{k} {v['pages'] * PAGE_SIZE / 2**20:.1f} MiB" for k, v in stats.items())
        )
        return {
            "style": style,
            "trace": out,
            "stats": stats,
            "cgroup_anon_bytes": anon,
            "run_seconds": t_run,
        }
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        # fork-style children are not our children: kill them through their pids
        for f in status.glob("*.ready"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(f.read_text()), signal.SIGKILL)
        for p in procs:
            p.wait()
        shutil.rmtree(status, ignore_errors=True)
        if cgroup_root is not None:
            time.sleep(0.3)
            cgroups.remove_tree(cgroup_root)


def _read_tasks(path: Path) -> list[str]:
    for line in path.read_text().splitlines():
        if line.startswith("TASKS = "):
            return [
                t.strip(" \"'") for t in line.split("(", 1)[1].rstrip(")").split(",") if t.strip()
            ]
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.record", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--style", choices=STYLES, required=True)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--size", default="default")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--cgroups", action="store_true", help="put each process in its own memory cgroup"
    )
    ap.add_argument(
        "--trim",
        action="store_true",
        help="sandboxes trim their heap after their task (controlplane.trim), as the agent "
        "loop's trim step does before a wait",
    )
    a = ap.parse_args(argv)
    cg = CGROOT / "azrecord" if a.cgroups and cgroups_usable() else None
    run_and_record(a.style, a.n, a.size, a.seed, a.out, cgroup_root=cg, trim=a.trim)
    return 0


if __name__ == "__main__":
    sys.exit(main())
