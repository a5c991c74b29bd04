"""Soak: swap stress with every page verified while the control plane churns (`make soak`).

    vm-tests/run --debug-kernel -- .venv/bin/python vm-tests/guest/soak.py --minutes 30

Runs as root in the test kernel for --minutes:
- stress (main thread): a template process and sandboxes forked from it (near-duplicate pages:
  template deltas) plus plain workers beyond their memory.max, each in its own cgroup; every
  round rewrites some pages, pushes each cgroup out with memory.reclaim and verifies every page;
- netlink churn (thread): sandboxes and templates registered and unregistered, snapshot
  templates added, loaded and removed, codec / level / policy switches, phase hints, stats
  doit and dumps; every answer must be the one the state predicts;
- busy device (thread): compaction, and reset, disksize and rmmod attempted while swap is on:
  they must fail with EBUSY (rmmod: the module stays loaded), never crash.
At the end: every page verified once more, swapoff, the store empty, unload, kmemleak scanned,
the kernel log checked for splats (the same check as vm-tests/run). Prints the figures (pages
verified, operations, splats, leaks) and a JSON line; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import errno
import importlib.machinery
import importlib.util
import json
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import azswap_guest as ag
import faultinject as fi

TOP = Path(__file__).resolve().parents[2]
SYNTHETIC = 1 << 41


def _runner() -> object:
    """vm-tests/run as a module, for its splat check."""
    path = str(TOP / "vm-tests" / "run")
    loader = importlib.machinery.SourceFileLoader("vm_tests_run", path)
    spec = importlib.util.spec_from_loader("vm_tests_run", loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class Soak:
    def __init__(self, minutes: float, npages: int) -> None:
        self.minutes = minutes
        # The clock starts with the stress (set-up under TCG can take minutes).
        self.start = time.monotonic()
        self.deadline = self.start + minutes * 60
        self.npages = npages
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.ops: dict[str, int] = {}
        self.lock = threading.Lock()
        self.pages_verified = 0
        self.rounds = 0
        self.deltas_seen = 0

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.ops[what] = self.ops.get(what, 0) + n

    def failed(self, where: str) -> None:
        with self.lock:
            self.errors.append(f"{where}: {traceback.format_exc()}")
        self.stop.set()

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    # -- netlink churn ------------------------------------------------------------------------

    def churn(self, churn_cgs: list[ag.Cgroup], sandboxes: list[ag.Cgroup]) -> None:
        try:
            nl = fi.Genl()
            rng = random.Random(7)
            registered: dict[int, str] = {}
            loaded = False
            step = 0

            def must(cmd: str, attrs: list, want: int = 0, dump: bool = False) -> list:
                code, replies = nl.call(cmd, attrs, dump=dump)
                if code != want:
                    shown = [(n, v if n != "PAGES" else f"<{len(v)} bytes>") for n, v in attrs]
                    raise AssertionError(
                        f"{cmd} {shown}: {os.strerror(code) if code else 'ok'}, "
                        f"expected {os.strerror(want) if want else 'ok'}"
                    )
                self.count(cmd)
                return replies

            codecs = [[("POLICY_CODEC", 0)], [("POLICY_CODEC", 1), ("POLICY_LEVEL", 3)],
                      [("POLICY_CODEC", 1), ("POLICY_LEVEL", 1)]]
            while step == 0 or self.running():
                step += 1
                cg = rng.choice(churn_cgs)
                kind = registered.get(cg.id)
                if kind is None:
                    kind = rng.choice(("SANDBOX", "TEMPLATE"))
                    must(f"{kind}_ADD", [("CGROUP_ID", cg.id), ("GROUP", rng.randint(1, 3))])
                    must(f"{kind}_ADD", [("CGROUP_ID", cg.id), ("GROUP", 1)], errno.EEXIST)
                    registered[cg.id] = kind
                else:
                    must(f"{kind}_DEL", [("CGROUP_ID", cg.id)])
                    must(f"{kind}_DEL", [("CGROUP_ID", cg.id)], errno.ENOENT)
                    del registered[cg.id]
                if not loaded:
                    must("TEMPLATE_ADD", [("CGROUP_ID", SYNTHETIC), ("GROUP", 1)])
                    for b in range(rng.randint(1, 4)):
                        pages = b"".join(
                            (f"soak {step} {b} {i} ".encode() * 400)[:4096] for i in range(15)
                        )
                        must("TEMPLATE_LOAD",
                             [("CGROUP_ID", SYNTHETIC), ("INDEX", b * 15), ("PAGES", pages)])
                    loaded = True
                elif step % 3 == 0:
                    must("TEMPLATE_DEL", [("CGROUP_ID", SYNTHETIC)])
                    loaded = False
                must("POLICY_SET", codecs[step % len(codecs)])
                if step % 4 == 0:
                    must("POLICY_SET", [("POLICY_DEDUP", step % 8 // 4),
                                        ("POLICY_SIM_EFFORT", rng.choice((4, 8, 16)))])
                    must("POLICY_SET", [("POLICY_DEDUP", 1)])
                sb = rng.choice(sandboxes)
                must("PHASE_SET", [("CGROUP_ID", sb.id), ("PHASE", rng.randint(0, 3))])
                owners = must("STATS_GET", [], dump=True)
                ids = {fi.u64(o, "CGROUP_ID") for o in owners}
                missing = (set(registered) | {s.id for s in sandboxes}) - ids
                assert not missing, f"registered owners missing from the dump: {missing}"
                must("STATS_GET", [("CGROUP_ID", sb.id)])
                must("POLICY_GET", [])
            for cid, kind in registered.items():
                must(f"{kind}_DEL", [("CGROUP_ID", cid)])
            if loaded:
                must("TEMPLATE_DEL", [("CGROUP_ID", SYNTHETIC)])
            nl.close()
        except Exception:
            self.failed("netlink churn")

    # -- busy device --------------------------------------------------------------------------

    def busy(self, d: ag.Dev) -> None:
        try:
            first = True
            while first or self.running():
                first = False
                assert d.write("compact", "1") == 0, "compact failed"
                self.count("compact")
                err = d.write("reset", "1")
                assert err == errno.EBUSY, f"reset while swapped on: {os.strerror(err)}"
                self.count("reset refused")
                err = d.write("disksize", "64M")
                assert err == errno.EBUSY, f"disksize while swapped on: {os.strerror(err)}"
                self.count("disksize refused")
                r = subprocess.run(["rmmod", "azswap"], capture_output=True, text=True)
                assert r.returncode != 0 and ag.loaded(), "rmmod succeeded while swapped on"
                assert "in use" in r.stderr or "busy" in r.stderr.lower(), r.stderr
                self.count("rmmod refused")
                self.stop.wait(2.0)
        except Exception:
            self.failed("busy device")

    # -- stress -------------------------------------------------------------------------------

    def verify(self, workers: list[ag.Worker]) -> None:
        ag.verify_all(workers)
        self.pages_verified += sum(w.npages for w in workers)

    def run(self) -> int:
        lib = ag.build_azpages()
        ag.cleanup_module()
        ag.disable_zswap()
        leak_check = fi.kmemleak_available()
        if leak_check:
            fi.kmemleak_clear()
        ag.insmod()
        d = ag.Dev(0)
        d.set("base_cache", "1024")
        d.swapon("512M", prio=100)
        tcg = ag.Cgroup("soak-template")
        scgs = [ag.Cgroup(f"soak-sb{i}") for i in range(3)]
        plain = [ag.Cgroup(f"soak-plain{i}", "6M") for i in range(2)]
        churn_cgs = [ag.Cgroup(f"soak-churn{i}") for i in range(4)]
        nl = fi.Genl()
        for cg, cmd in [(tcg, "TEMPLATE_ADD"), *((c, "SANDBOX_ADD") for c in scgs)]:
            code, _ = nl.call(cmd, [("CGROUP_ID", cg.id), ("GROUP", 1)])
            assert code == 0, f"{cmd} {cg.path}: {os.strerror(code)}"
        workers: list[ag.Worker] = []
        threads: list[threading.Thread] = []
        try:
            template = ag.Worker(lib, tcg, self.npages, seed=901)
            workers.append(template)
            template.call("fill")
            sandboxes = [template.fork(cg) for cg in scgs]
            workers.extend(sandboxes)
            for i, cg in enumerate(plain):
                workers.append(ag.Worker(lib, cg, 2 * self.npages, seed=911 + i, thp=bool(i)))
            ag.all_call(workers[-len(plain):], "fill")
            threads = [
                threading.Thread(target=self.churn, args=(churn_cgs, scgs), daemon=True),
                threading.Thread(target=self.busy, args=(d,), daemon=True),
            ]
            self.start = time.monotonic()
            self.deadline = self.start + self.minutes * 60
            for t in threads:
                t.start()
            cgroups = [tcg, *scgs, *plain]
            while self.rounds == 0 or self.running():
                self.rounds += 1
                v = self.rounds
                # The verifier models one edit over the pristine pages: rewrite them first
                # (a sandbox's pages then equal the template's: duplicates), then edit (near-
                # duplicates: deltas).
                for k, sb in enumerate(sandboxes):
                    sb.call("fill")
                    sb.call(f"edit {v * 10 + k} {2 + (v + k) % 4}")
                for k, w in enumerate(workers[-len(plain):]):
                    w.call("fill")
                    w.call(f"edit {v * 10 + 5 + k} 3")
                for cg in cgroups:
                    cg.reclaim("1G")
                    self.count("reclaim")
                # kind_stat counts what is stored now: sample it while everything is out.
                k = d.kinds()
                self.deltas_seen = max(self.deltas_seen, k["tdelta"] + k["xdelta"])
                self.verify(workers)
                if self.rounds % 5 == 0:
                    print(
                        f"soak: round {self.rounds}, {self.pages_verified} pages verified, "
                        f"io {d.io()}, kinds {d.kinds()}", flush=True,
                    )
        except Exception:
            self.failed("stress")
        self.stop.set()
        for t in threads:
            t.join(timeout=600)
            if t.is_alive():
                self.errors.append(f"{t.name} did not stop")
        io, kinds, obj = d.io(), d.kinds(), d.obj()
        try:
            self.verify(workers)
            for cg in [tcg, *scgs]:
                for cmd in ("SANDBOX_DEL", "TEMPLATE_DEL"):
                    nl.call(cmd, [("CGROUP_ID", cg.id)])
            nl.close()
            for cg in plain:
                cg.set("memory.max", "max")
            d.swapoff()
            self.verify(workers)
            d.assert_empty_after_swapoff()
            for w in workers:
                w.stop()
            workers.clear()
            assert d.write("reset", "1") == 0
            ag.rmmod()
            assert io["failed_loads"] == 0, io
            assert io["stores"] > 0, io
            assert self.deltas_seen > 0, "no delta page stored in any round"
        except Exception:
            self.failed("final check")
        finally:
            for w in workers:
                w.stop()
        leaks = fi.kmemleak_report() if leak_check else ""
        nleaks = leaks.count("unreferenced object")
        klog = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
        splats = _runner().splat_lines(klog)  # type: ignore[attr-defined]
        summary = {
            "minutes": round((time.monotonic() - self.start) / 60, 1),
            "rounds": self.rounds,
            "pages_verified": self.pages_verified,
            "operations": dict(sorted(self.ops.items())),
            "operations_total": sum(self.ops.values()),
            "io": io,
            "kinds": kinds,
            "delta_pages_max": self.deltas_seen,
            "obj_before_swapoff": obj,
            "splats": len(splats),
            "leaks": nleaks if leak_check else None,
            "errors": len(self.errors),
        }
        for e in self.errors:
            print(f"soak: FAILED in {e}", file=sys.stderr)
        for s in splats[:20]:
            print(f"soak: splat: {s}", file=sys.stderr)
        if nleaks:
            print(f"soak: kmemleak:\n{leaks[:4000]}", file=sys.stderr)
        print(
            f"soak: {summary['rounds']} rounds, {self.pages_verified} pages verified, "
            f"{summary['operations_total']} operations, {len(splats)} splats, "
            f"{'n/a (no kmemleak)' if not leak_check else nleaks} leaks, "
            f"{len(self.errors)} errors"
        )
        print("soak-summary " + json.dumps(summary))
        out = os.environ.get("AZSWAP_OUT")
        if out:
            Path(out, "soak-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        ok = not self.errors and not splats and not nleaks and self.pages_verified > 0
        return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--pages", type=int, default=1024, help="pages per template process")
    args = ap.parse_args()
    if not os.environ.get("AZSWAP_IN_GUEST"):
        print("soak: runs inside the test kernel (vm-tests/run)", file=sys.stderr)
        return 2
    return Soak(args.minutes, args.pages).run()


if __name__ == "__main__":
    sys.exit(main())
