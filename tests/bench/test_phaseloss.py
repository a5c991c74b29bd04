"""The phase benchmark's shortfall split: a regime's footprint beyond aggressive's, by phase."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.phaseloss import (
    Split,
    main,
    phase_split,
    pool_overhead,
    print_shortfall,
    shortfall,
    spread,
)

# one sandbox: outside for t < 2, waiting for t in [2, 5), its tool in [5, 7), outside after
CYCLES = {"sb0": [{"t": 5.0, "wait_s": 3.0, "tool_s": 2.0}]}


def regime(device: float, sandbox: list[float], saved: float, keeps: float) -> dict[str, Any]:
    timeline = [[float(t), device, mib] for t, mib in enumerate(sandbox)]
    return {"timeline": timeline, "cycles": CYCLES, "saved_mib": saved, "keeps": keeps}


def test_a_timeline_splits_by_where_each_sandbox_was() -> None:
    # t:   0  1  2  3  4  5  6  7  8  9
    mib = [9, 9, 1, 1, 1, 5, 5, 2, 2, 2]
    s = phase_split(regime(4.0, mib, 10.0, 1.0))
    assert s == Split(device=4.0, tool=1.0, wait=0.3, outside=2.4)


def test_two_sandboxes_are_read_from_their_own_columns() -> None:
    r = regime(0.0, [0.0] * 10, 1.0, 1.0)
    r["cycles"] = {**CYCLES, "sb1": [{"t": 1.0, "wait_s": 1.0, "tool_s": 1.0}]}
    for row in r["timeline"]:
        row.append(10.0)  # sb1: waits in [0, 1), its tool in [1, 2), outside from 2 on
    s = phase_split(r)
    assert (s.wait, s.tool, s.outside) == (1.0, 1.0, 8.0)


def test_shortfall_against_aggressive_and_the_keeps_if_waits_were_free() -> None:
    run = {"host": "idle", "style": "ml", "regimes": {
        "none": regime(0.0, [20.0] * 10, 0.0, 0.0),
        "aggressive": regime(2.0, [9, 9, 1, 1, 1, 5, 5, 2, 2, 2], 10.0, 1.0),
        # holds 4 MiB more in its wait (1.2 time-averaged), 1 more in its tool (0.2), 0.5 more
        # device; outside the same
        "daemon": regime(2.5, [9, 9, 5, 5, 5, 6, 6, 2, 2, 2], 8.1, 0.81),
    }}
    (row,) = shortfall(run)
    assert row["regime"] == "daemon" and row["keeps"] == 0.81
    assert row["extra_mib"] == pytest.approx({"device": 0.5, "tool": 0.2, "wait": 1.2,
                                              "outside": 0.0})
    # without the wait's 1.2: 0.7 of aggressive's 10 MiB saving still missing
    assert row["keeps_if_waits_free"] == pytest.approx(0.93)


def test_waits_that_held_less_than_aggressive_s_give_nothing_back() -> None:
    run = {"host": "loaded", "style": "coding", "regimes": {
        "aggressive": regime(2.0, [9, 9, 3, 3, 3, 5, 5, 2, 2, 2], 10.0, 1.0),
        "daemon": regime(2.0, [9, 9, 1, 1, 1, 8, 8, 2, 2, 2], 9.0, 0.9),
    }}
    (row,) = shortfall(run)
    assert row["extra_mib"]["wait"] == pytest.approx(-0.6)
    assert row["keeps_if_waits_free"] == 0.9  # no more than its keeps


def test_the_pool_overhead_is_told_apart_where_a_device_timeline_was_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    agg = regime(2.0, [1.0] * 10, 10.0, 1.0)
    dae = regime(3.0, [1.0] * 10, 9.0, 0.9)
    run = {"host": "idle", "style": "ml", "regimes": {"aggressive": agg, "daemon": dae}}
    (row,) = shortfall(run)
    assert pool_overhead(agg) is None and row["extra_pool_overhead_mib"] is None  # not kept
    # rows: time, payload, pool, metadata (MiB); overhead = pool - payload
    agg["device_timeline"] = [[0.0, 1.5, 1.8, 0.2], [1.0, 1.5, 1.6, 0.2]]
    dae["device_timeline"] = [[0.0, 1.5, 2.5, 0.3], [1.0, 1.5, 2.7, 0.3]]
    assert pool_overhead(agg) == pytest.approx(0.2) and pool_overhead(dae) == pytest.approx(1.1)
    (row,) = shortfall(run)
    assert row["extra_mib"]["device"] == pytest.approx(1.0)
    assert row["extra_pool_overhead_mib"] == pytest.approx(0.9)
    (sp,) = spread([row, {**row, "extra_pool_overhead_mib": 0.5}])
    assert sp["extra_pool_overhead_mib"] == pytest.approx(0.7)
    # a run without it: no figure rather than one over other runs than the device's part
    (sp,) = spread([row, {**row, "extra_pool_overhead_mib": None}])
    assert sp["extra_pool_overhead_mib"] is None
    run["regimes"]["none"] = regime(0.0, [20.0] * 10, 0.0, 0.0)
    print_shortfall([run])
    assert "+0.9" in capsys.readouterr().out


def test_no_comparison_without_aggressive_or_its_saving() -> None:
    r = regime(0.0, [1.0] * 10, 1.0, 1.0)
    assert shortfall({"host": "idle", "style": "ml", "regimes": {"daemon": r}}) == []
    agg = {**r, "saved_mib": 0.0}
    assert shortfall({"host": "idle", "style": "ml",
                      "regimes": {"aggressive": agg, "daemon": r}}) == []


def test_a_regime_without_a_timeline_is_refused() -> None:
    with pytest.raises(ValueError):
        phase_split({"timeline": [], "cycles": {}})


def test_spread_over_runs() -> None:
    rows = [{"host": "idle", "style": "ml", "regime": "daemon", "keeps": k,
             "keeps_if_waits_free": k + 0.1,
             "extra_mib": {"device": d, "tool": 0.0, "wait": 1.0, "outside": 0.0}}
            for k, d in ((0.7, 1.0), (0.8, 3.0), (0.75, 2.0))]
    (row,) = spread(rows)
    assert row["runs"] == 3 and row["keeps"] == (0.7, 0.75, 0.8)
    assert row["keeps_if_waits_free"] == pytest.approx((0.8, 0.85, 0.9))
    assert row["extra_mib"]["device"] == 2.0


def test_the_command_prints_the_table_and_refuses_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    run = {"host": "idle", "style": "ml", "regimes": {
        "aggressive": regime(2.0, [1.0] * 10, 10.0, 1.0),
        "daemon": regime(2.0, [2.0] * 10, 9.0, 0.9)}}
    good = tmp_path / "phase.json"
    good.write_text(json.dumps({"runs": [run]}))
    assert main([str(good)]) == 0
    out = capsys.readouterr().out
    assert "daemon" in out and "90%" in out and "93%" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main([str(bad)]) == 2
    assert "phaseloss:" in capsys.readouterr().err
