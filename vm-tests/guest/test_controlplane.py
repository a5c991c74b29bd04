"""Control plane end to end with the real module (runs in the test kernel).

    vm-tests/run --memory 1G -- .venv/bin/pytest -q -s -p no:cacheprovider \
        vm-tests/guest/test_controlplane.py

The daemon runs as a real process (`azctl daemon`), sandboxes are real cgroups holding worker
processes with patterned pages, compression is real memory.reclaim into /dev/azswap0.  Measured
figures (hint -> compressed time and CPU for a 256 MiB sandbox) are printed and written to
vm-tests/out/controlplane-figures.json, the `azctl status` screen to vm-tests/out/azctl-status.txt.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import azswap_guest as ag

from bench.kit.daemon import DaemonProcess

TOP = ag.TOP
AZCTL = TOP / ".venv" / "bin" / "azctl"
RUN = Path("/tmp/azswap-cp")
SOCK = RUN / "azswap.sock"
MiB = 1 << 20
FIGURES = TOP / "vm-tests" / "out" / "controlplane-figures.json"

sys.path.insert(0, str(TOP))


def log(msg: str) -> None:
    print(f"[controlplane] {msg}", flush=True)


def start_daemon(*args: str) -> DaemonProcess:
    """The daemon on RUN, answering."""
    d = DaemonProcess(*args, run_dir=RUN)
    d.wait_ready()
    log(f"daemon up after {d.ready_s:.1f}s")
    return d


def wait_for(fn: Any, timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_compressed(events: Any, name: str) -> dict[str, Any]:
    """The scheduler's state when its 'compress' event for ``name`` says it finished."""
    for ev in events:
        if ev["event"] == "compress" and ev["name"] == name:
            assert ev["result"] in ("done", "floor"), ev
            return dict(ev["state"])
    raise AssertionError("event stream ended")


def module_owner(cid: int) -> Any:
    from controlplane.netlink import AzswapNetlink

    with AzswapNetlink() as nl:
        return nl.stats(cid)[0]


def run_as_nobody(*cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *cmd],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={**os.environ, **env},
    )


def test_controlplane_end_to_end(dev0: ag.Dev, azpages: Any, workers: list) -> None:
    from controlplane.client import DaemonClient

    shutil.rmtree(RUN, ignore_errors=True)
    dev0.swapon("900M")
    cg1, cg2 = ag.Cgroup("sb1"), ag.Cgroup("sb2")
    figures: dict[str, Any] = {}

    d = start_daemon(
        "--grace", "0", "--interval", "0.2", "--cpu-budget", "1.0", "--chunk", "8M"
    )
    try:
        c = DaemonClient(SOCK)
        # -- sandboxes registered through the socket ---------------------------------------
        s1 = c.register("sb1", cg1.rel, 1)
        s2 = c.register("sb2", cg2.rel, 1)
        assert s1["cgroup_id"] == cg1.id and s2["cgroup_id"] == cg2.id
        assert module_owner(cg1.id).group == 1

        # -- non-root clients are refused ----------------------------------------------------
        # (azctl runs from a world-readable copy: the checkout may sit in a 0700 directory)
        from tests.fakes import WorldReadableCopy

        os.chmod(RUN, 0o711)  # let nobody reach the socket: its own 0600 mode must refuse
        try:
            with WorldReadableCopy(TOP) as cp:
                r = run_as_nobody(*cp.azctl("--socket", str(SOCK), "sandbox", "ls"), env=cp.env)
                assert r.returncode == 4 and "permission denied" in r.stderr, r
                r = run_as_nobody(
                    *cp.azctl("--direct", "policy", "set", "dedup=1"),
                    env=cp.env,
                )
                assert r.returncode == 4 and "permission denied" in r.stderr, r  # EPERM, genl
        finally:
            os.chmod(RUN, 0o700)
        log("non-root refused: socket (exit 4) and netlink admin command (exit 4)")

        # -- fill: 256 MiB in sb1, 128 MiB in sb2 ------------------------------------------
        w1 = ag.Worker(azpages, cg1, 256 * MiB // ag.PAGE, seed=11)
        w2 = ag.Worker(azpages, cg2, 128 * MiB // ag.PAGE, seed=22)
        workers += [w1, w2]
        ag.all_call([w1, w2], "fill")
        mem0 = cg1.current()
        st0 = module_owner(cg1.id)
        # Nothing compressed before the hint: the daemon reclaims 8 MiB chunks.  The kernel's own
        # reclaim may have swapped a few pages meanwhile (the debug kernel, its KASAN shadow
        # taking guest memory, swapped 141-210 of 65,536 while the workers filled).
        assert mem0 >= 256 * MiB and st0.pages * ag.PAGE < 8 * MiB, (mem0, st0)

        # -- llm-wait compresses sb1: memory.current drops, stored bytes rise ---------------
        events = DaemonClient(SOCK).subscribe(timeout=600)
        t0 = time.monotonic()
        c.phase("sb1", "llm-wait")
        comp = wait_compressed(events, "sb1")
        t_done = time.monotonic() - t0
        mem1 = cg1.current()
        st1 = module_owner(cg1.id)
        log(
            f"sb1 256 MiB: llm-wait -> compressed in {t_done:.2f}s (scheduler latency "
            f"{comp['latency']:.2f}s), reclaim wall {comp['wall']:.2f}s cpu {comp['cpu']:.2f}s, "
            f"memory.current {mem0 / MiB:.0f} -> {mem1 / MiB:.0f} MiB, azswap holds "
            f"{st1.pages} pages ({st1.orig_bytes / MiB:.0f} MiB) in "
            f"{st1.stored_bytes / MiB:.1f} MiB"
        )
        assert mem1 < mem0 // 4, (mem0, mem1)
        assert st1.pages * ag.PAGE >= 200 * MiB and st1.stored_bytes > 0
        figures["budget_1.0"] = {
            "sandbox_mib": 256,
            "hint_to_compressed_s": round(t_done, 3),
            "scheduler_latency_s": comp["latency"],
            "reclaim_wall_s": round(comp["wall"], 3),
            "reclaim_cpu_s": round(comp["cpu"], 3),
            "chunks": comp["chunks"],
            "memory_current_before": mem0,
            "memory_current_after": mem1,
            "azswap_pages": st1.pages,
            "azswap_stored_bytes": st1.stored_bytes,
        }

        # -- a tool hint stops compression (sb2) --------------------------------------------
        # The hint is sent once the wait's run has reclaimed two chunks.  On a slow kernel (the
        # debug tier) the run may finish all of sb2 before the hint gets through; that attempt
        # proves nothing about the hint, so sb2 is faulted back in (every page verified) and
        # the wait is repeated, up to three times.  Whatever the attempt, nothing may be
        # reclaimed after the hint.
        stopped = None
        for attempt in range(1, 4):
            if attempt > 1:
                ag.verify_all([w2])
            mem2 = cg2.current()
            c.phase("sb2", "llm-wait")
            wait_for(
                lambda: (c.stats("sb2").get("compress") or {}).get("chunks", 0) >= 2,
                60,
                "sb2 compression started",
                interval=0.005,
            )
            pre = c.stats("sb2")["compress"]  # the run may have ended on its own already
            c.phase("sb2", "tool")
            # a chunk already in flight may still finish: measure from the end of the run
            wait_for(lambda: not c.stats("sb2")["compress"]["active"], 120, "sb2 run ended")
            after_stop = cg2.current()
            time.sleep(1.5)
            later = cg2.current()
            st2 = c.stats("sb2")["compress"]
            log(
                f"sb2 attempt {attempt}: tool hint after {st2['chunks']} chunks: memory.current "
                f"{mem2 / MiB:.0f} -> {after_stop / MiB:.0f} MiB, {later / MiB:.0f} MiB 1.5 s "
                f"later, last run: {st2['last_result']!r}"
            )
            assert not st2["active"] and not st2["done"]
            assert later >= after_stop - 2 * MiB, "compression went on after the tool hint"
            # The hint lands either inside a run ("stopped:phase=tool") or between two runs of
            # one wait (the last one ended at its per-tick budget, "budget", and none started
            # since); or the wait's compression had ended on its own before the hint: two
            # reclaim passes in a row came up short ("done"), as the snapshot shows.
            if pre["done"] or (not pre["active"] and pre["last_result"] in ("done", "floor")):
                log(f"sb2: compression ended on its own before the hint: {pre['last_result']!r}")
                # (a recheck may have started one more run, which the hint then stopped)
                assert st2["last_result"] in ("done", "floor", "stopped:phase=tool", "budget"), (
                    pre,
                    st2,
                )
                continue
            assert st2["last_result"] in ("stopped:phase=tool", "budget"), (pre, st2)
            stopped = (mem2, later)
            break
        assert stopped is not None, "every attempt's compression ended before the tool hint"
        assert stopped[1] > 32 * MiB, "sb2 was compressed completely despite the tool hint"
        assert module_owner(cg2.id).phase.label == "tool"

        # -- azctl status --json agrees with the module's own stats ---------------------------
        # (sb1 compressed and quiet, sb2 stopped and quiet: nothing moves while we compare, once
        # the deferred frees, batched 10 ms after the first, have run)
        from controlplane.netlink import AzswapNetlink

        dev0.wait_drained()
        with AzswapNetlink() as nl:
            owners = {o.cgroup_id: o for o in nl.stats()}
        r = subprocess.run(
            [str(AZCTL), "--socket", str(SOCK), "status", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        with AzswapNetlink() as nl:
            owners2 = {o.cgroup_id: o for o in nl.stats()}
        exact = 0
        for sb in st["sandboxes"]:
            o, o2 = owners[sb["cgroup_id"]], owners2[sb["cgroup_id"]]
            assert o.pages <= sb["pages"] <= o2.pages or o2.pages <= sb["pages"] <= o.pages
            if o == o2:  # quiet: exact
                assert (sb["pages"], sb["stored_bytes"], sb["kinds"]) == (
                    o.pages,
                    o.stored_bytes,
                    o.kinds,
                )
                exact += 1
        assert exact == 2, "the module's figures moved while nothing ran"
        if owners == owners2:
            assert st["totals"]["pages"] == sum(o.pages for o in owners.values())
            assert st["totals"]["stored_bytes"] == sum(o.stored_bytes for o in owners.values())
            mm = dev0.mm()  # the module's global figures: the per-owner sums must match
            assert st["totals"]["pages"] * ag.PAGE == mm["orig_data_size"]
            assert st["totals"]["stored_bytes"] == mm["compr_data_size"]
        mm = dev0.mm()
        log(
            f"status totals: pages {st['totals']['pages']} stored {st['totals']['stored_bytes']}"
            f" ratio {st['totals']['ratio']}; mm_stat {mm}"
        )
        assert st["device"]["name"] == "azswap0"
        r = subprocess.run(
            [str(AZCTL), "--socket", str(SOCK), "status"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "160"},
        )
        assert r.returncode == 0 and "sb1" in r.stdout
        print(r.stdout, flush=True)
        with contextlib.suppress(OSError):  # kept for the closing notes: a real status screen
            FIGURES.parent.mkdir(parents=True, exist_ok=True)
            (FIGURES.parent / "azctl-status.txt").write_text(r.stdout)
        # -- every page still verifies (faults them back) -------------------------------------
        ag.verify_all([w1, w2])

    finally:
        t_stop = time.monotonic()
        rc = d.stop()
        took = time.monotonic() - t_stop
        tail = d.log_tail()
    # an orderly stop: exit 0, the signal and then the end of the stop logged, the socket gone
    assert rc == 0, (rc, tail)
    lines = tail.splitlines()
    got = [i for i, ln in enumerate(lines) if ln.endswith("INFO signal 15: stopping")]
    done = [i for i, ln in enumerate(lines) if ln.endswith("azswap.daemon INFO stopped")]
    assert got and done and got[0] < done[-1], tail
    assert not SOCK.exists()
    log(f"SIGTERM: daemon exited {rc} in {took:.2f}s")

    # -- restart: the registry comes back from the module (+ names from the state file) -------
    d = start_daemon("--grace", "0", "--interval", "0.2", "--chunk", "8M")
    try:
        c = DaemonClient(SOCK)
        sbs = {s["name"]: s for s in c.list()["sandboxes"]}
        assert set(sbs) == {"sb1", "sb2"} and sbs["sb1"]["cgroup_id"] == cg1.id
        # the phases come back from the module's last hints
        assert sbs["sb1"]["phase"] == "llm-wait" and sbs["sb2"]["phase"] == "tool", sbs
        log("restart: registry recovered (names from the state file, ids/groups from the module)")

        # -- the same 256 MiB with the default CPU budget (0.25 of a CPU, all of one while the
        # CPUs are not contended) -------------------------------------------------------------
        c.phase("sb1", "tool")  # a tool phase: everything faults back
        ag.all_call([w1], "touch")
        mem0 = cg1.current()
        events = DaemonClient(SOCK).subscribe(timeout=900)
        t0 = time.monotonic()
        c.phase("sb1", "llm-wait")
        comp = wait_compressed(events, "sb1")
        t_done = time.monotonic() - t0
        mem1 = cg1.current()
        duty = comp["wall"] / max(1e-9, comp["finished_at"] - comp["started_at"])
        log(
            f"sb1 256 MiB at the default cpu budget: compressed in {t_done:.2f}s, reclaim wall "
            f"{comp['wall']:.2f}s cpu {comp['cpu']:.2f}s, duty cycle {duty:.2f}, "
            f"memory.current {mem0 / MiB:.0f} -> {mem1 / MiB:.0f} MiB"
        )
        figures["default_budget"] = {
            "sandbox_mib": 256,
            "hint_to_compressed_s": round(t_done, 3),
            "reclaim_wall_s": round(comp["wall"], 3),
            "reclaim_cpu_s": round(comp["cpu"], 3),
            "duty_cycle": round(duty, 3),
            "memory_current_before": mem0,
            "memory_current_after": mem1,
        }
        # the duty cycle is a figure, not a check: the budget law is tested on the host with a
        # fake clock (tests/controlplane/test_scheduler.py); here, the throttled run compresses
        assert mem1 < mem0 // 4
        ag.verify_all([w1, w2])
    finally:
        d.stop()

    # -- without the state file the module alone rebuilds the registry -------------------------
    (RUN / "state-dev0.json").unlink()
    d = start_daemon()
    try:
        names = {s["name"]: s["cgroup_id"] for s in DaemonClient(SOCK).list()["sandboxes"]}
        assert names == {"sb1": cg1.id, "sb2": cg2.id}  # named after their cgroup directories
        log("restart without state file: names rebuilt from the cgroup tree")
    finally:
        d.stop()

    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # vm-tests/out is the guest's writable place
        FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2), flush=True)


def test_daemon_without_module_fails_cleanly() -> None:
    if not os.environ.get("AZSWAP_IN_GUEST"):
        pytest.skip("runs inside the test kernel (vm-tests/run)")
    ag.cleanup_module()
    r = subprocess.run(
        [str(AZCTL), "--socket", "/tmp/azt-none.sock", "--state-dir", "/tmp/azt-x", "daemon"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 3 and "module not loaded" in r.stderr and "Traceback" not in r.stderr
