"""Restore-time prefetch in the test kernel: a sandbox whose tool phase touches a known set of
pages after each LLM wait (memory.reclaim pushes everything out during the wait).

After two cycles the learned restore set covers >= 90% of the set; with prefetch on, the major
faults of the next tool phase drop by >= 80% against prefetch off; every page verifies."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

IN_GUEST = bool(os.environ.get("AZSWAP_IN_GUEST"))
pytestmark = pytest.mark.skipif(not IN_GUEST, reason="runs inside the test kernel (vm-tests/run)")

NPAGES = 4096  # 16 MiB sandbox
HOT = 600  # pages its tool phase touches after every wait
NOISE = 40  # random extra pages per cycle (must not be learned)


@pytest.fixture(params=["willneed", "populate"])
def setup(request: pytest.FixtureRequest) -> tuple[object, str]:
    import azswap_guest as ag
    from swapdev import session_swap, session_tracer

    from controlplane.prefetch import PrefetchConfig, Prefetcher

    kind = session_swap()
    assert kind == "azswap", f"this test needs azswap, the swap device that came up is {kind}"
    ag.assert_azswap_swap()
    tr = session_tracer()
    # events are fed by p.sync() after each phase: no polling thread, the tracer stays shared;
    # no time budget that a slow kernel (the debug tier) would run out of: this test judges what
    # is prefetched, not how fast
    cfg = PrefetchConfig(history=3, window_s=60.0, method=request.param, max_seconds=600.0)
    return Prefetcher(cfg, tracer=tr), kind


def test_restore_set_and_fault_reduction(setup) -> None:
    from swapdev import Cg

    from bench.pagesandbox import PageSandbox

    p, kind = setup
    cg = Cg("pf")
    sb = PageSandbox(cg.path, NPAGES, 5)
    rng = random.Random(1)
    hot = rng.sample(range(NPAGES), HOT)  # fixed order: the tool's first touches
    rest = sorted(set(range(NPAGES)) - set(hot))
    log: list[dict[str, object]] = []
    try:
        p.add_sandbox("pf", cg.path)

        def cycle(prefetch: bool) -> dict[str, object]:
            p.record_phase_change("pf", "llm-wait")
            cg.reclaim_all()
            swapped0 = cg.stat()
            res = p.restore("pf") if prefetch else None
            if not prefetch:
                p.record_phase_change("pf", "tool")
            noise = rng.sample(rest, NOISE)
            pg0 = cg.stat()["pgmajfault"]
            r = sb.touch(hot + noise)
            pg1 = cg.stat()["pgmajfault"]
            p.sync()
            assert r["bad"] == 0, f"{r['bad']} pages corrupt"
            rec = {"prefetch": prefetch, "majflt": r["majflt"], "minflt": r.get("minflt"),
                   "cg_pgmajfault": pg1 - pg0,
                   "seconds": round(r["seconds"], 3), "swapped_anon": swapped0["anon"],
                   "result": res}
            log.append(rec)
            return rec

        cycle(False)
        cycle(False)
        p.record_phase_change("pf", "llm-wait")
        learned = {s.page for s in p.restore_set("pf")}
        want = {(sb.pid, sb.page_addr(i)) for i in hot}
        coverage = len(want & learned) / len(want)
        noise_learned = len(learned - want)
        off = cycle(False)
        on = cycle(True)
        on2 = cycle(True)
        acc = p.settle("pf")
        print(json.dumps({"swap": kind, "coverage": coverage, "learned": len(learned),
                          "outside_hot": noise_learned, "cycles": log, "accuracy": acc},
                         indent=1))
        assert coverage >= 0.9, coverage
        assert int(on["majflt"]) <= 0.2 * int(off["majflt"]), (on, off)
        assert int(on2["majflt"]) <= 0.2 * int(off["majflt"]), (on2, off)
        assert int(off["majflt"]) >= HOT, off  # the baseline really faulted
        if p.cfg.method == "willneed":  # the tool's minor faults show each page was used
            assert acc["used"] >= 0.9 * HOT * 2, acc
        else:  # mapped ahead: no fault at all, so no per-page settlement
            assert acc["populated"] >= 0.9 * HOT * 2, acc
            assert [c["result"]["method"] for c in log if c["result"]] == ["populate"] * 2
        assert sb.verify() == 0
    finally:
        sb.stop()
        cg.remove()
