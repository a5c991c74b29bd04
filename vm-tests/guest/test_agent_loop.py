"""The daemon's agent loop in the test kernel: a sandbox registered with the real daemon
(`azctl daemon`) alternates LLM waits and tool phases, with a hint around each.

The predicted prefetch (`--prefetch-from faults --predict-unannounced`: the eBPF-learning
prefetcher, predictions for waits nobody announces; the hot set compressed with the rest:
--no-keep-hot): the daemon compresses the sandbox as each wait starts and, from the second wait
on, prefetches the working set its tool touched before the wait's predicted end, once it has
seen enough waits (five) to predict one.

Checked: the first tool phase (nothing learned) faults its whole hot set back (the wait really
compressed it); the first five waits are not predicted and the later ones are, and a tool phase
whose planned prefetch finished in time takes at most a fifth of those major faults; every page
verifies.  (That a predicted wait's tool hint starts no prefetch of its own is checked on the
host, tests/controlplane/test_daemon_protocol.py.)

The hot set (the defaults, no announcements): after a first wait that took everything, short waits
leave the working set the sandbox measured and take only what its tool stopped using, so their tools
fault in little more than the pages their working set drifted to. Checked: the first tool faults its
whole hot set back; the later ones at most 30% of it on average (50% each); the waits kept their hot
sets (the planner's `kept`) while the rest of the sandbox was in swap; every page verifies.

The resident-set prefetch (the defaults: no tracer) with announced ends: each wait compresses the
sandbox down to its working set, records what is resident, then compresses that too; the
announcement (`ending`) brings it back mapped. Checked: the first announcement (nothing recorded)
makes no prefetch due and its tool faults the whole hot set back; in the later waits the sandbox
was in swap before the announcement and the tool takes at most a fifth of those major faults;
every page verifies."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

IN_GUEST = bool(os.environ.get("AZSWAP_IN_GUEST"))
pytestmark = pytest.mark.skipif(not IN_GUEST, reason="runs inside the test kernel (vm-tests/run)")

NPAGES = 2048  # 8 MiB sandbox
HOT = 400  # pages each tool phase touches
WAIT = 4.0  # seconds of every LLM wait
CYCLES = 9
LEARN = 5  # waits the daemon sees before it predicts


def finish(d: Any, sb: Any, cg: Any, cycles: list[dict[str, Any]]) -> int:
    """Stop the sandbox and the daemon and show what the test saw; the daemon's exit status."""
    from controlplane.daemon import BELOW_WORKING_SET

    sb.stop()
    rc = int(d.stop() if d.proc.poll() is None else d.proc.returncode)
    log = d.log_tail(100000)
    print(json.dumps({"cycles": cycles,
                      # with --prefetch-from resident: waits in which a write went below the
                      # working set (the record from before their first write stood)
                      "writes_below_the_working_set": log.count(BELOW_WORKING_SET),
                      "daemon_log": log.splitlines()[-20:]}, indent=1), flush=True)
    cg.remove()
    return rc


def test_daemon_prefetches_before_the_predicted_end_of_each_wait() -> None:
    import azswap_guest as ag
    from swapdev import Cg, release_tracer, session_swap

    from bench.kit.daemon import DaemonProcess
    from bench.pagesandbox import PageSandbox

    kind = session_swap()
    assert kind == "azswap", f"this test needs azswap, the swap device that came up is {kind}"
    ag.assert_azswap_swap()
    release_tracer()  # the daemon's prefetcher runs the host's one tracer
    cg = Cg("loop")
    sb = PageSandbox(cg.path, NPAGES, 11)
    hot = random.Random(2).sample(range(NPAGES), HOT)
    cycles: list[dict[str, Any]] = []
    d = DaemonProcess("--interval", "0.2", "--no-policy", "--no-keep-hot", "--prefetch",
                      "--prefetch-from", "faults", "--predict-unannounced")
    try:
        d.wait_ready(tracing=True)
        with d.client() as c:
            c.register("loop", cg.rel, 1)
            for i in range(CYCLES):
                before = c.stats("loop")["phase"]["plan"]
                c.phase("loop", "llm-wait")
                time.sleep(WAIT)
                plan = c.stats("loop")["phase"]["plan"]  # just before the LLM answers
                swapped = int(cg.get("memory.swap.current"))
                c.phase("loop", "tool")
                r = sb.touch(hot, write_every=8)
                assert r["bad"] == 0, f"cycle {i}: {r['bad']} pages corrupt"
                cycles.append({
                    "cycle": i, "majflt": int(r["majflt"]), "swapped_before_tool": swapped,
                    "fired": plan["fired"] - before["fired"], "in_time": not plan["prefetching"],
                    "plan": plan,
                })
            final = c.stats("loop")["phase"]["plan"]
            c.unregister("loop")
        assert sb.verify() == 0
    finally:
        rc = finish(d, sb, cg, cycles)
    assert rc == 0, d.log_tail()
    first = cycles[0]
    assert first["fired"] == 0 and first["swapped_before_tool"] > 0, first
    assert first["majflt"] >= 0.8 * HOT, first  # compressed in the wait: all of it faulted back
    assert not [c for c in cycles[:LEARN] if c["fired"]], cycles
    predicted = [c for c in cycles[LEARN:] if c["fired"] >= 1]
    assert len(predicted) >= CYCLES - LEARN - 1, cycles  # the waits after those are predicted
    in_time = [c for c in predicted if c["in_time"]]
    assert in_time, cycles
    for c in in_time:
        assert c["majflt"] <= 0.2 * HOT, c
    assert final["waits"] == CYCLES and final["fired"] >= len(predicted), final


def test_short_waits_keep_the_working_set_and_compress_the_rest() -> None:
    import azswap_guest as ag
    from swapdev import Cg, session_swap

    from bench.kit.daemon import DaemonProcess
    from bench.pagesandbox import PageSandbox

    kind = session_swap()
    assert kind == "azswap", f"this test needs azswap, the swap device that came up is {kind}"
    ag.assert_azswap_swap()
    cg = Cg("keep")
    sb = PageSandbox(cg.path, NPAGES, 12)
    rng = random.Random(3)
    hot = rng.sample(range(NPAGES), HOT)
    drift = HOT // 10  # pages of the hot set replaced every tool phase
    cycles: list[dict[str, Any]] = []
    # the shipped defaults: the waits are not announced, so the resident-set prefetcher records
    # and brings back nothing; the keeping is the scheduler's
    d = DaemonProcess("--interval", "0.2", "--no-policy")
    try:
        assert d.wait_ready()["prefetch"] == "resident set"
        with d.client() as c:
            c.register("keep", cg.rel, 1)
            sb.touch(hot, write_every=8)
            for i in range(8):
                c.phase("keep", "llm-wait")
                # the first wait takes everything (nothing measured yet): long enough for it
                if i == 0:
                    deadline = time.monotonic() + 120
                    # (no "compress" state before the scheduler's first tick of the sandbox)
                    while (c.stats("keep").get("compress", {}).get("last_result")
                           not in ("done", "floor") and time.monotonic() < deadline):
                        time.sleep(0.2)
                else:
                    time.sleep(1.0)
                swapped = int(cg.get("memory.swap.current"))
                c.phase("keep", "tool")
                if i:
                    out = set(rng.sample(hot, drift))
                    have = set(hot)
                    new = [p for p in rng.sample(range(NPAGES), 4 * drift) if p not in have]
                    hot = [p for p in hot if p not in out] + new[:drift]
                r = sb.touch(hot, write_every=8)
                assert r["bad"] == 0, f"cycle {i}: {r['bad']} pages corrupt"
                cycles.append({"cycle": i, "majflt": int(r["majflt"]),
                               "swapped_before_tool": swapped})
            plan = c.stats("keep")["phase"]["plan"]
            c.unregister("keep")
        assert sb.verify() == 0
    finally:
        rc = finish(d, sb, cg, cycles)
    assert rc == 0, d.log_tail()
    assert cycles[0]["majflt"] >= 0.8 * HOT, cycles[0]  # the first wait took everything
    # the working set stayed: the kernel's LRU cannot tell the pages the last tool used from
    # those the one before used (no scan between), so a wait may take some of the former
    # (seen: 40-142 faults per tool on 6.1, the drift being 40; 41-208, 125 on average, on
    # 7.3), where a wait that took it faults it all back (HOT, as the first cycle did)
    later = [cyc["majflt"] for cyc in cycles[1:]]
    assert sum(later) / len(later) <= 0.4 * HOT, cycles
    for cyc in cycles[1:]:
        assert cyc["majflt"] <= 0.6 * HOT, cyc
        # the rest stayed in swap: at least half of the pages no tool touched
        assert cyc["swapped_before_tool"] >= (NPAGES - 2 * HOT) * 4096 // 2, cyc
    assert plan["kept"] >= 6, plan
    assert plan["fired"] == 0, plan  # no announcement: nothing prefetched


def test_announced_waits_bring_back_the_resident_working_set() -> None:
    import azswap_guest as ag
    from swapdev import Cg, session_swap

    from bench.kit.daemon import DaemonProcess
    from bench.pagesandbox import PageSandbox

    kind = session_swap()
    assert kind == "azswap", f"this test needs azswap, the swap device that came up is {kind}"
    ag.assert_azswap_swap()
    cg = Cg("resident")
    sb = PageSandbox(cg.path, NPAGES, 13)
    hot = random.Random(4).sample(range(NPAGES), HOT)
    cycles: list[dict[str, Any]] = []
    d = DaemonProcess("--interval", "0.2", "--no-policy")  # the shipped defaults

    def compressed(c: Any, generation: int) -> bool:
        st = c.stats("resident").get("compress", {})
        return bool(st.get("generation") == generation and st.get("deep")
                    and st.get("last_result") in ("done", "floor"))

    def prefetched(c: Any, fired_before: int) -> bool:
        plan = c.stats("resident")["phase"]["plan"]
        return bool(plan["fired"] > fired_before and not plan["prefetching"])

    def until(what: str, cond: Any, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    try:
        assert d.wait_ready()["prefetch"] == "resident set"  # no tracer to wait for
        with d.client() as c:
            c.register("resident", cg.rel, 1)
            sb.touch(hot, write_every=8)
            for i in range(6):
                fired = c.stats("resident")["phase"]["plan"]["fired"]
                gen = c.phase("resident", "llm-wait")["generation"]
                # the whole sandbox goes: at once in the first wait (nothing measured), after
                # the working set was recorded in the others (their ends are announced)
                until("the wait's compression", lambda gen=gen: compressed(c, gen))
                swapped = int(cg.get("memory.swap.current"))
                ending = c.ending("resident")
                if ending["prefetch"]:
                    until("the announced prefetch", lambda fired=fired: prefetched(c, fired),
                          60.0)
                c.phase("resident", "tool")
                r = sb.touch(hot, write_every=8)
                assert r["bad"] == 0, f"cycle {i}: {r['bad']} pages corrupt"
                cycles.append({"cycle": i, "majflt": int(r["majflt"]),
                               "swapped_before_ending": swapped, "ending": ending})
            plan = c.stats("resident")["phase"]["plan"]
            c.unregister("resident")
        assert sb.verify() == 0
    finally:
        rc = finish(d, sb, cg, cycles)
    assert rc == 0, d.log_tail()
    # the first wait had nothing recorded: no prefetch, its tool faulted the hot set back
    assert not cycles[0]["ending"]["prefetch"], cycles[0]
    assert cycles[0]["majflt"] >= 0.8 * HOT, cycles[0]
    for cyc in cycles[1:]:
        # the working set went with the rest, and the announcement brought it back mapped
        assert cyc["swapped_before_ending"] >= (NPAGES - HOT // 4) * 4096 * 3 // 4, cyc
        assert cyc["ending"]["prefetch"], cyc
        # one announcement may come while the compression's last write is in flight (seen: 94)
        assert cyc["majflt"] <= 0.5 * HOT, cyc
    later = [cyc["majflt"] for cyc in cycles[1:]]
    assert sum(later) / len(later) <= 0.2 * HOT, cycles
    assert plan["hits"] == 5 and plan["deep"] == 6, plan  # the first wait had nothing to fetch
