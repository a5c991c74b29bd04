"""The phase benchmark's pure parts: trajectories, page contents, figures and the JSON contract."""

from __future__ import annotations

import argparse
import itertools
import statistics

import pytest

from bench.pagesandbox import (
    EDIT,
    HDR,
    MAGIC,
    PAGE,
    PageSandbox,
    edit_offset,
    expected_page,
    sandbox_page,
    template_page,
)
from bench.phasebench import (
    CONTRACT_KEYS,
    DRIFT_MAX,
    DRIFT_MIN,
    WAIT_MAX,
    WAIT_MIN,
    WORK_MAX,
    WORK_MIN,
    Box,
    Cycle,
    _list,
    agent_loop,
    compare,
    merge_baseline,
    print_spread,
    regime_figures,
    regime_order,
    spread,
    trajectory,
)

STYLES = ("ml", "coding")
MiB_INT = 1 << 20


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_waits_clipped_and_heavy_tailed(style: str, scale: float) -> None:
    waits = [c.wait_s for sid in range(8)
             for c in trajectory(style, 1, sid, 100, 2048, wait_scale=scale)]
    assert min(waits) >= WAIT_MIN * scale - 1e-9
    assert max(waits) <= WAIT_MAX * scale + 1e-9
    med, mean = statistics.median(waits), statistics.fmean(waits)
    assert mean > 1.3 * med  # a long right tail pulls the mean past the median
    assert sum(w > 4 * med for w in waits) >= len(waits) // 50
    assert max(waits) > 8 * med


@pytest.mark.parametrize("style", STYLES)
def test_work_within_bounds(style: str) -> None:
    work = [c.work_s for c in trajectory(style, 2, 1, 300, 1024)]
    assert min(work) >= WORK_MIN and max(work) <= WORK_MAX
    assert len(set(work)) > 100


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("npages", [64, 1000, 4096])
def test_hot_set_drift(style: str, npages: int) -> None:
    t = trajectory(style, 3, 2, 30, npages, hot=0.25)
    n = len(t[0].hot)
    assert t[0].new == 0
    for prev, cur in itertools.pairwise(t):
        assert len(cur.hot) == n and len(set(cur.hot)) == n
        assert all(0 <= p < npages for p in cur.hot)
        new = len(set(cur.hot) - set(prev.hot))
        assert new == cur.new
        assert DRIFT_MIN <= new / n <= DRIFT_MAX


def test_ml_hot_sets_sequential_coding_scattered() -> None:
    ml = trajectory("ml", 1, 1, 3, 4096)[1].hot
    steps = [b - a for a, b in itertools.pairwise(ml)]
    assert sum(s == 1 for s in steps) >= len(steps) - 1  # one window (it may wrap once)
    co = trajectory("coding", 1, 1, 3, 4096)[1].hot
    steps = [b - a for a, b in itertools.pairwise(co)]
    assert sum(s == 1 for s in steps) < len(steps) // 10


@pytest.mark.parametrize("style", STYLES)
def test_trajectory_reproducible(style: str) -> None:
    assert trajectory(style, 5, 3, 10, 2048) == trajectory(style, 5, 3, 10, 2048)
    assert trajectory(style, 5, 3, 10, 2048) != trajectory(style, 5, 4, 10, 2048)
    assert trajectory(style, 5, 3, 10, 2048) != trajectory(style, 6, 3, 10, 2048)


@pytest.mark.parametrize("style", STYLES)
def test_sandbox_page_is_template_page_plus_edit(style: str) -> None:
    for sid in (1, 2, 17):
        for i in (0, 1, 100, 4095):
            t = template_page(style, 7, i)
            p = expected_page(style, 7, sid, i, version=3)
            assert len(t) == len(p) == PAGE
            assert p == sandbox_page(t, style, sid, i, 3)
            assert HDR.unpack(p[: HDR.size]) == (MAGIC, sid, i, 3)
            assert HDR.unpack(t[: HDR.size]) == (MAGIC, 0, i, 0)
            off = edit_offset(sid, i)
            assert HDR.size <= off and off + EDIT <= PAGE and off % 4 == 0
            diff = [k for k in range(HDR.size, PAGE) if p[k] != t[k]]
            assert diff and all(off <= k < off + EDIT for k in diff)  # a small edit only
    # sandboxes differ from one another only by their edits; the template is sid 0
    assert expected_page(style, 7, 1, 5) != expected_page(style, 7, 2, 5)
    assert expected_page(style, 7, 0, 5) == template_page(style, 7, 5)


def test_pages_have_their_style() -> None:
    import array
    import math

    f = array.array("f", template_page("ml", 1, 3)[HDR.size:])
    assert all(math.isfinite(x) and abs(x) < 1 for x in f)
    text = template_page("coding", 1, 3)[HDR.size:]
    assert sum(32 <= c < 127 or c == 10 for c in text) > 0.8 * len(text)


@pytest.mark.parametrize("style", ("ml", "coding"))
def test_page_sandbox_process_verifies(style: str) -> None:
    """A sandbox process (no cgroup) holds and verifies its pages across touches and writes."""
    sb = PageSandbox(None, 256, 2, style=style, sid=3, thp="host")
    try:
        for c in trajectory(style, 2, 3, 3, 256):
            r = sb.touch(c.hot, write_every=8, units=2)
            assert r["bad"] == 0
            # the time split as the sandbox measured it (schedstat: on a CPU, waiting for one)
            assert 0 < r["pages_s"] <= r["seconds"]
            assert r["cpu_s"] > 0 and r["runq_s"] >= 0
            assert r["cpu_s"] + r["runq_s"] <= r["seconds"] * 1.05 + 0.01
        assert sb.verify() == 0
    finally:
        sb.stop()


def _r(tool: float, fp_mib: float, bad: int = 0) -> dict[str, object]:
    return regime_figures([tool, tool], 10.0, [int(fp_mib * (1 << 20))] * 3, bad, [1, 3])


def test_figures_against_the_same_run() -> None:
    regs = compare({"none": _r(0.2, 100), "aggressive": _r(0.5, 40), "daemon": _r(0.25, 46)})
    assert regs["none"]["slowdown"] == 1.0 and regs["none"]["saved_mib"] == 0
    assert regs["aggressive"]["slowdown"] == 2.5 and regs["aggressive"]["keeps"] == 1.0
    d = regs["daemon"]
    assert d["slowdown"] == 1.25 and d["saved_mib"] == 54.0 and d["keeps"] == 0.9
    assert d["majflt_per_tool"] == 2.0 and d["peak_mib"] == 46.0
    for r in regs.values():
        assert set(CONTRACT_KEYS) <= set(r)
    # keeps is clamped to 0..1: more saved than aggressive, or a footprint above none's
    regs = compare({"none": _r(0.2, 100), "aggressive": _r(0.5, 40), "daemon": _r(0.2, 30)})
    assert regs["daemon"]["keeps"] == 1.0
    regs = compare({"none": _r(0.2, 100), "aggressive": _r(0.5, 40), "daemon": _r(0.2, 101)})
    assert regs["daemon"]["keeps"] == 0.0


def test_spread_and_contract_shape() -> None:
    runs = []
    for rep, (dslow, dkeep_fp) in enumerate([(1.1, 46), (1.3, 52), (1.2, 40)]):
        regs = compare({"none": _r(0.2, 100), "aggressive": _r(0.5, 40),
                        "daemon": _r(0.2 * dslow, dkeep_fp, bad=rep == 2)})
        runs.append({"host": "idle", "style": "ml", "repeat": rep, "regimes": regs})
    for run in runs:
        assert set(run["regimes"]) == {"none", "aggressive", "daemon"}
        assert run["host"] in ("idle", "loaded")
    rows = {r["regime"]: r for r in spread(runs)}
    assert rows["daemon"]["runs"] == 3
    lo, med, hi = rows["daemon"]["slowdown"]
    assert (lo, med, hi) == pytest.approx((1.1, 1.2, 1.3))
    assert rows["daemon"]["keeps"] == pytest.approx((0.8, 0.9, 1.0))
    assert rows["daemon"]["bad_pages"] == 1 and rows["none"]["bad_pages"] == 0


def test_spread_gives_the_median_time_split_and_prints_it(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    runs = []
    # blocked per run 0.3, 0.02, 0.01: median 0.020; the difference of the medians would be
    # 0.600 - 0.200 - 0.300 = 0.100
    for rep, (secs, runq) in enumerate(((0.6, 0.1), (0.52, 0.3), (0.71, 0.5))):
        regs = compare({"none": _r(0.2, 100), "aggressive": _r(0.5, 40)})
        regs["aggressive"]["tool_split_s"] = {"seconds": secs, "pages_s": 0.2, "cpu_s": 0.2,
                                              "runq_s": runq}
        runs.append({"host": "idle", "style": "ml", "repeat": rep, "regimes": regs})
    rows = {r["regime"]: r for r in spread(runs)}
    sp = rows["aggressive"]["tool_split_s"]
    assert sp["runq_s"] == pytest.approx(0.3) and sp["blocked_s"] == pytest.approx(0.02)
    assert rows["none"]["tool_split_s"] == {}
    print_spread(list(rows.values()))
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if "aggressive" in ln and "0.600" in ln)
    assert "blocked s" in out and "0.020" in row and "0.100" not in row


def test_the_baseline_brackets_every_repeat_and_the_others_rotate() -> None:
    regs = ["none", "aggressive", "daemon", "daemon-stream"]
    orders = [regime_order(regs, rep, rotate=True, bracket=True) for rep in range(3)]
    assert orders == [["none", "aggressive", "daemon", "daemon-stream", "none"],
                      ["none", "daemon", "daemon-stream", "aggressive", "none"],
                      ["none", "daemon-stream", "aggressive", "daemon", "none"]]
    # each of the others in each place once over as many repeats
    for place in range(1, 4):
        assert sorted(o[place] for o in orders) == sorted(regs[1:])
    assert regime_order(regs, 1, rotate=False, bracket=False) == regs
    assert regime_order(regs, 4, rotate=False, bracket=True) == [*regs, "none"]
    assert regime_order(["aggressive", "daemon"], 1, rotate=True, bracket=True) == [
        "daemon", "aggressive"]  # no baseline asked for: none to bracket with
    assert regime_order(["none"], 2, rotate=True, bracket=True) == ["none", "none"]


def test_a_bracketed_baseline_is_the_mean_of_its_runs_and_keeps_both() -> None:
    before = regime_figures([0.1, 0.3], 10.0, [int(100 * MiB_INT)] * 3, 2, [0, 0])
    after = regime_figures([0.2, 0.4], 12.0, [int(110 * MiB_INT)] * 3, 3, [2, 4])
    before.update(tool_split_s={"seconds": 0.2, "pages_s": 0.02, "cpu_s": 0.18, "runq_s": 0.01},
                  template_mib=20.0, pgmajfault=0, wall_s=30.0, started_s=0.0,
                  cycles={"sb0": ["first"]}, device_io={"io_stores": 0})
    after.update(tool_split_s={"seconds": 0.3, "pages_s": 0.04, "cpu_s": 0.26, "runq_s": 0.03},
                 template_mib=26.0, pgmajfault=12, wall_s=34.0, started_s=200.0,
                 cycles={"sb0": ["second"]}, device_io={"io_stores": 5})
    none = merge_baseline(before, after)
    assert none["tool_mean_s"] == pytest.approx(0.25)  # the mean over all four tools
    assert none["tool_p95_s"] == pytest.approx(0.35)  # the mean of 0.3 and 0.4
    assert none["e2e_s"] == pytest.approx(11.0) and none["template_mib"] == pytest.approx(23)
    assert none["majflt_per_tool"] == pytest.approx(1.5) and none["pgmajfault"] == 6
    assert none["footprint_mib"] == pytest.approx(105) and none["peak_mib"] == 110
    assert none["bad_pages"] == 5  # a wrong page in either run counts
    assert none["wall_s"] == pytest.approx(64)
    assert none["tool_split_s"] == pytest.approx(
        {"seconds": 0.25, "pages_s": 0.03, "cpu_s": 0.22, "runq_s": 0.02})
    assert none["cycles"] == {"sb0": ["first"]} and none["started_s"] == 0.0
    assert none["device_io"] == {"io_stores": 0}
    b = none["bracket"]
    assert b["before"]["tool_mean_s"] == 0.2 and b["after"]["tool_mean_s"] == 0.3
    assert b["after"]["device_io"] == {"io_stores": 5} and b["after"]["started_s"] == 200.0
    assert b["before"]["bad_pages"] == 2 and b["after"]["tool_p95_s"] == 0.4
    assert b["drift"] == pytest.approx(1.5)
    assert "bracket" not in before  # the runs' own dicts are left as they were
    # the others' slowdown and keeps are against the merged baseline
    regs = compare({"none": none, "aggressive": _r(0.5, 45), "daemon": _r(0.3, 50)})
    assert regs["none"]["slowdown"] == 1.0
    assert regs["daemon"]["slowdown"] == pytest.approx(1.2)
    assert regs["aggressive"]["saved_mib"] == pytest.approx(60)
    assert regs["daemon"]["keeps"] == pytest.approx(55 / 60, abs=1e-3)
    for r in regs.values():
        assert set(CONTRACT_KEYS) <= set(r)


def test_the_spread_reports_the_baseline_s_drift(capsys: pytest.CaptureFixture[str]) -> None:
    runs = []
    for rep, after in enumerate((0.22, 0.3, 0.2)):
        none = merge_baseline(_r(0.2, 100), _r(after, 100))
        runs.append({"host": "idle", "style": "coding", "repeat": rep,
                     "regimes": compare({"none": none, "aggressive": _r(0.5, 40)})})
    rows = {r["regime"]: r for r in spread(runs)}
    assert rows["none"]["bracket"]["drift"] == pytest.approx((1.0, 1.1, 1.5))
    assert rows["none"]["bracket"]["after"] == pytest.approx((0.2, 0.22, 0.3))
    assert "bracket" not in rows["aggressive"]
    print_spread(list(rows.values()))
    out = capsys.readouterr().out
    assert "before and after" in out and "1.00 / 1.10 / 1.50" in out


def test_each_repeat_runs_the_baseline_around_the_others_and_merges_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """run_all's wiring: what runs in which order, under which label, and what the run keeps."""
    from bench import pagesandbox, phasebench

    ran: list[tuple[str, int, str]] = []
    tools = {"none": [0.2, 0.3, 0.25, 0.35], "aggressive": [0.6] * 4, "daemon": [0.33] * 4}

    def fake_run_regime(regime: str, host: object, style: str, cfg: object, dev: object,
                        rep: int, label: str = "") -> dict[str, object]:
        n = sum(r == regime and k == rep for r, k, _ in ran)
        ran.append((regime, rep, label))
        return _r(tools[regime][2 * rep + n] if regime == "none" else tools[regime][rep], 100)

    monkeypatch.setattr(phasebench, "run_regime", fake_run_regime)
    probes = iter(range(100, 200))
    monkeypatch.setattr(pagesandbox, "calibrate", lambda style, **kw: float(next(probes)))
    ns = argparse.Namespace(hosts=["idle"], styles=["ml"], regimes=["none", "aggressive",
                            "daemon"], repeat=2, sandboxes=2, pages=64, loaded_sandboxes=3,
                            loaded_pages=32, order="rotate", baseline="bracket")
    cfg = phasebench.Config(rates={"ml": 100.0})
    runs = phasebench.run_all(ns, cfg, argparse.Namespace(name="azswap-test"))
    assert ran == [("none", 0, ""), ("aggressive", 0, ""), ("daemon", 0, ""),
                   ("none", 0, "-after"),
                   ("none", 1, ""), ("daemon", 1, ""), ("aggressive", 1, ""),
                   ("none", 1, "-after")]
    assert [r["order"] for r in runs] == [["none", "aggressive", "daemon", "none"],
                                          ["none", "daemon", "aggressive", "none"]]
    for run in runs:
        assert list(run["regimes"]) == ["none", "aggressive", "daemon"]
    none0 = runs[0]["regimes"]["none"]
    assert none0["tool_mean_s"] == pytest.approx(0.25)
    assert none0["bracket"]["drift"] == pytest.approx(1.5)
    assert runs[0]["regimes"]["daemon"]["slowdown"] == pytest.approx(1.32)
    assert runs[1]["regimes"]["none"]["tool_mean_s"] == pytest.approx(0.3)
    assert runs[1]["regimes"]["aggressive"]["slowdown"] == pytest.approx(2.0)
    for run in runs:
        for r in run["regimes"].values():
            assert r["started_s"] >= 0 and "wall_s" in r
    # the speed probe before every regime, the baseline's both
    assert runs[0]["regimes"]["aggressive"]["probe_units_s"] == 101.0
    assert [runs[0]["regimes"]["none"]["bracket"][k]["probe_units_s"]
            for k in ("before", "after")] == [100.0, 103.0]
    # once, first: as before the bracket existed
    ran.clear()
    ns.baseline, ns.order, ns.repeat = "first", "fixed", 1
    runs = phasebench.run_all(ns, cfg, argparse.Namespace(name="azswap-test"))
    assert [r for r, _, _ in ran] == ["none", "aggressive", "daemon"]
    assert "bracket" not in runs[0]["regimes"]["none"]
    capsys.readouterr()


def test_the_markdown_report_gives_the_baseline_s_drift() -> None:
    from bench.__main__ import fmt_phase

    runs = [{"host": "idle", "style": "coding", "repeat": 0,
             "regimes": compare({"none": merge_baseline(_r(0.2, 100), _r(0.24, 100)),
                                 "aggressive": _r(0.5, 40)})}]
    text = "\n".join(fmt_phase({"runs": runs, "config": {"cycles": 10}}))
    row = "| idle | coding | 0.20 / 0.20 / 0.20 | 0.24 / 0.24 / 0.24 | 1.20 / 1.20 / 1.20 |"
    assert row in text
    runs[0]["regimes"]["none"] = _r(0.2, 100)
    assert "after / before" not in "\n".join(fmt_phase({"runs": runs, "config": {}}))


def test_a_regime_list_names_each_once() -> None:
    parse = _list(("none", "aggressive", "daemon"))
    assert parse("none,daemon") == ["none", "daemon"]
    for bad in ("none,none", "daemon,none,daemon", "", "zram"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)


def test_tool_call_streaming_starts_within_the_last_half_of_each_wait() -> None:
    from bench.phasebench import STREAM_MAX, STREAM_MIN, trajectory

    cycles = trajectory("coding", 7, 2, 200, 1000)
    for c in cycles:
        assert min(STREAM_MIN, c.wait_s / 2) - 1e-3 <= c.stream_s <= min(STREAM_MAX, c.wait_s / 2)
    assert len({c.stream_s for c in cycles}) > 100  # drawn per wait, not a constant
    # the stream has a random source of its own: waits, tools and hot sets do not depend on it
    again = trajectory("coding", 7, 2, 200, 1000, stream_median=3.0)
    assert [(c.wait_s, c.work_s, c.hot) for c in cycles] == [
        (c.wait_s, c.work_s, c.hot) for c in again
    ]


def test_rates_pinned_per_style_or_refused() -> None:
    from bench.phasebench import _rates

    assert _rates("ml=900,coding=40.5") == {"ml": 900.0, "coding": 40.5}
    for bad in ("ml", "ml=0", "ml=-3", "gpu=10", "coding=x"):
        with pytest.raises(argparse.ArgumentTypeError):
            _rates(bad)


def test_calibration_takes_the_best_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A contended warm-up and a contended sample do not lower the rate."""
    from bench import pagesandbox

    now = [0.0]
    # seconds per unit in each second of the fake clock: warm-up slow, then fast, a
    # contended second, fast again
    cost = [0.5, 0.01, 0.1, 0.01, 0.01]

    class Unit:
        def __init__(self, *a: object) -> None:
            pass

        def unit(self, n: int) -> None:
            now[0] += cost[int(now[0])]

    monkeypatch.setattr(pagesandbox, "Worker", Unit)
    monkeypatch.setattr(pagesandbox.time, "perf_counter", lambda: now[0])
    rate = pagesandbox.calibrate("ml", seconds=1.0, samples=3)
    assert 90 < rate < 110


def test_the_last_prefetch_flag_wins() -> None:
    from bench.phasebench import _prefetch_on

    assert _prefetch_on(["--grace", "0"])  # the daemon's default
    assert not _prefetch_on(["--no-prefetch"])
    assert _prefetch_on(["--prefetch"])
    assert not _prefetch_on(["--prefetch", "--no-prefetch"])
    assert _prefetch_on(["--no-prefetch", "--prefetch"])


def test_the_daemon_traces_faults_only_when_its_prefetcher_learns_from_them() -> None:
    from bench.phasebench import _tracing

    assert not _tracing(["--prefetch"]) and not _tracing([])  # resident by default
    assert _tracing(["--prefetch-from", "faults"])
    assert not _tracing(["--no-prefetch", "--prefetch-from", "faults"])
    assert not _tracing(["--prefetch", "--prefetch-from", "resident"])
    assert not _tracing(["--prefetch-from=resident", "--prefetch"])
    assert _tracing(["--prefetch-from=resident", "--prefetch", "--prefetch-from", "faults"])


class HintLog:
    """A DaemonClient's hint side, recorded."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, str]] = []
        self.async_errors: list[str] = ["refused"] if fail else []

    def hint(self, name: str, phase: str) -> None:
        self.sent.append(("hint", phase))

    def phase(self, name: str, phase: str) -> dict[str, str]:
        self.sent.append(("phase", phase))
        return {"name": name, "phase": phase}

    def ending(self, name: str) -> None:
        self.sent.append(("ending", ""))


class TouchLog:
    def __init__(self) -> None:
        self.touched: list[tuple[int, ...]] = []

    def touch(self, hot: tuple[int, ...], write_every: int, units: int) -> dict[str, float]:
        self.touched.append(hot)
        return {"majflt": 2, "bad": 0, "seconds": 0.0}


def _box(cycles: int = 2) -> Box:
    traj = [Cycle(0.0, 0.01, (k, k + 1), 0, 0.0) for k in range(cycles)]
    return Box("sb", None, TouchLog(), traj)  # type: ignore[arg-type]


def test_a_sandbox_waiting_for_its_start_is_parked_then_hinted_around_every_wait() -> None:
    b, client = _box(), HintLog()
    agent_loop(b, 0.01, client, rate=100.0)
    assert not b.error
    assert client.sent == [("hint", "idle"), ("hint", "llm-wait"), ("hint", "tool"),
                           ("hint", "llm-wait"), ("hint", "tool"), ("phase", "idle")]
    assert b.sb.touched == [(0, 1), (1, 2)] and b.majflt == [2, 2] and len(b.cycles) == 2


def test_a_sandbox_that_starts_at_once_is_not_parked_and_hints_can_wait_for_answers() -> None:
    b, client = _box(1), HintLog()
    agent_loop(b, 0.0, client, rate=100.0, sync_hints=True)
    assert client.sent == [("phase", "llm-wait"), ("phase", "tool"), ("phase", "idle")]


def test_a_streaming_agent_loop_announces_each_wait_s_end() -> None:
    b, client = _box(1), HintLog()
    agent_loop(b, 0.0, client, rate=100.0, announce=True)
    assert client.sent == [("hint", "llm-wait"), ("ending", ""), ("hint", "tool"),
                           ("phase", "idle")]


def test_without_a_daemon_no_hints_and_a_failed_hint_fails_the_sandbox() -> None:
    b = _box(1)
    agent_loop(b, 0.01, None, rate=100.0)
    assert not b.error and len(b.tool_s) == 1
    b = _box(1)
    agent_loop(b, 0.0, HintLog(fail=True), rate=100.0)
    assert b.error.startswith("BenchError: hints failed")
