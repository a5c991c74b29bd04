"""The wait planner: when the daemon prefetches a waiting sandbox (pure arithmetic on a clock)."""

from __future__ import annotations

import pytest

from controlplane import errors
from controlplane.waitplan import Action, PlanConfig, WaitPlanner, fire_time


def cycle(p: WaitPlanner, name: str, t: float, wait: float, took: float = 0.3) -> float:
    """One wait of ``wait`` seconds from ``t``, driven as the daemon drives it (a planned
    prefetch that fits in the wait takes ``took`` s); returns when the next one may start."""
    at = p.wait_started(name, t)
    if at is not None and at + took <= t + wait:
        assert p.due(at) == [(name, Action.PREFETCH)]
        p.prefetch_started(name)
        p.prefetch_done(name, took, at + took)
    p.tool_started(name, t + wait)
    return t + wait + 1.0


def test_fire_time_of_a_regular_wait_is_one_lead_before_its_end() -> None:
    assert fire_time([3.0] * 5, 0.0, 0.5, 0.3, 0.05) == pytest.approx(2.5, abs=0.051)


def test_fire_time_says_nothing_past_the_longest_wait_seen() -> None:
    assert fire_time([], 0.0, 0.5, 0.3, 0.05) is None
    assert fire_time([1.0, 2.0], 2.0, 0.5, 0.3, 0.05) is None


def test_fire_time_conditions_on_the_age_of_the_wait() -> None:
    waits = [1.0, 1.0, 1.0, 10.0, 10.0]
    # from the start, most waits end around 1 s: fire before that
    assert fire_time(waits, 0.0, 0.5, 0.3, 0.05) == pytest.approx(0.5, abs=0.051)
    # a wait that has already lasted 2 s is one of the long ones: fire before 10 s
    assert fire_time(waits, 2.0, 0.5, 0.3, 0.05) == pytest.approx(9.5, abs=0.051)


def test_no_history_means_prefetch_on_the_tool_hint() -> None:
    p = WaitPlanner()
    assert p.wait_started("a", 100.0) is None
    assert p.due(101.0) == [] and p.next_due() is None
    start = p.tool_started("a", 102.0)
    assert start.prefetch and start.reason == "no-prediction"
    assert start.wait_s == pytest.approx(2.0)


def test_predicted_wait_prefetches_before_the_end_and_not_again_on_the_hint() -> None:
    p = WaitPlanner(PlanConfig(default_lead=0.5, step=0.01))
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    at = p.wait_started("a", t)
    assert at == pytest.approx(t + 2.5, abs=0.011)
    assert p.due(t + 2.0) == []
    assert p.next_due() == at
    assert p.due(at) == [("a", Action.PREFETCH)]
    p.prefetch_started("a")
    p.prefetch_done("a", 0.2, at + 0.2)
    start = p.tool_started("a", t + 3.0)
    assert not start.prefetch and start.reason == "predicted"
    assert p.snapshot("a", t + 3.0)["fired"] == 3  # the 2nd and 3rd waits used the fleet's


def test_a_new_sandbox_is_predicted_from_the_fleet() -> None:
    p = WaitPlanner(PlanConfig(default_lead=0.5, step=0.01))
    t = 0.0
    for name in ("a", "b", "c"):
        t = cycle(p, name, t, 4.0)
    assert p.wait_started("new", t) == pytest.approx(t + 3.5, abs=0.011)


def test_a_wait_longer_than_predicted_is_compressed_again_and_predicted_anew() -> None:
    c = PlanConfig(default_lead=0.5, step=0.01, recompress_after=1.0, threshold=0.3)
    p = WaitPlanner(c)
    t = 0.0
    for w in (1.0, 1.0, 1.0, 10.0, 10.0):
        t = cycle(p, "a", t, w)
    at = p.wait_started("a", t)
    assert at == pytest.approx(t + 0.5, abs=0.011)
    assert p.due(at) == [("a", Action.PREFETCH)]
    p.prefetch_started("a")
    p.prefetch_done("a", 0.1, at + 0.1)
    assert p.due(at + 0.5) == []
    # one second after the prefetch the wait is still on: compress again, plan near 10 s
    assert p.due(at + 1.2) == [("a", Action.RECOMPRESS)]
    assert p.snapshot("a", at + 1.2)["early"] == 1
    nxt = p.next_due()
    assert nxt is not None and t + 9.0 < nxt < t + 10.0
    assert p.due(nxt) == [("a", Action.PREFETCH)]
    p.prefetch_started("a")
    p.prefetch_done("a", 0.1, nxt + 0.1)
    assert p.tool_started("a", t + 10.0).reason == "predicted"


def test_late_prefetches_move_the_next_one_earlier() -> None:
    c = PlanConfig(default_lead=0.5, step=0.01, threshold=0.5, late_factor=0.5)
    p = WaitPlanner(c)
    t = 0.0
    for w in (2.0, 3.0, 4.0):
        t = cycle(p, "a", t, w)
    first = p.wait_started("a", t)
    assert first is not None
    # the tool hint comes while the prefetch is still running: the tool paid for it
    p.due(first)
    p.prefetch_started("a")
    start = p.tool_started("a", first + 0.1)
    assert not start.prefetch and start.reason == "in-flight"
    assert p.snapshot("a", first)["late"] == 1
    p.prefetch_done("a", 0.3, first + 0.3)  # after the hint: timed, not counted again
    assert p.snapshot("a", first)["late"] == 1
    t = first + 5.0
    second = p.wait_started("a", t)
    # a lower threshold: the hazard is reached at an earlier age than with the old one
    assert p.snapshot("a", t)["threshold"] == pytest.approx(0.25)
    old = fire_time(p.samples("a"), 0.0, p.lead("a"), 0.5, 0.01)
    assert second is not None and old is not None and second - t < old


def test_a_hint_before_the_planned_time_prefetches_at_once_and_counts_late() -> None:
    p = WaitPlanner(PlanConfig(default_lead=0.5, step=0.01))
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    p.wait_started("a", t)
    start = p.tool_started("a", t + 1.0)
    assert start.prefetch and start.reason == "not-fired"
    assert p.snapshot("a", t)["late"] == 1


def test_lead_follows_the_measured_prefetch_time_and_the_host_load() -> None:
    p = WaitPlanner(PlanConfig(default_lead=0.5, lead_factor=1.5, lead_pad=0.05))
    assert p.lead("a") == pytest.approx(0.5)
    p.wait_started("a", 0.0)
    p.prefetch_started("a")
    p.prefetch_done("a", 0.4, 0.4)
    assert p.lead("a") == pytest.approx(0.65)
    p.busy = True
    assert p.lead("a") == pytest.approx(1.3)


def test_other_phases_end_the_plan() -> None:
    p = WaitPlanner(PlanConfig(default_lead=0.5, step=0.01))
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    p.wait_started("a", t)
    p.other_phase("a")
    assert p.due(t + 5.0) == [] and p.next_due() is None


@pytest.mark.parametrize("bad", [
    dict(history=0), dict(threshold=0.0, threshold_min=0.0), dict(threshold=0.9),
    dict(step=0.0), dict(max_lead=0.0), dict(recompress_after=-1.0),
])
def test_bad_config_is_refused(bad: dict) -> None:
    with pytest.raises(errors.InvalidValue):
        WaitPlanner(PlanConfig(**bad))
