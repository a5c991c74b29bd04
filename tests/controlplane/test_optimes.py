from __future__ import annotations

import pytest

from controlplane.optimes import OpTimes
from tests.fakes import FakeClock


def test_counts_mean_and_max_per_kind() -> None:
    clock = FakeClock()
    t = OpTimes(clock)
    for d in (0.002, 0.004):
        with t.timed("phase"):
            clock.advance(d)
    with pytest.raises(RuntimeError), t.timed("stats"):  # a failed request is timed too
        clock.advance(0.01)
        raise RuntimeError
    s = t.snapshot()
    assert s["phase"] == {"n": 2, "mean_ms": pytest.approx(3.0), "max_ms": pytest.approx(4.0)}
    assert s["stats"]["n"] == 1 and s["stats"]["max_ms"] == pytest.approx(10.0)
