"""The wait planner: when the daemon prefetches a waiting sandbox (pure arithmetic on a clock)."""

from __future__ import annotations

import pytest

from controlplane import errors
from controlplane.waitplan import Action, PlanConfig, WaitPlanner, fire_time


def quick(**kw: object) -> PlanConfig:
    """Few samples suffice and the default threshold: the tests' small histories.  The hot set
    goes at once (keep_hot off): these tests are about the prefetch's timing; the hot set's
    own tests turn keep_hot on."""
    base: dict[str, object] = dict(min_samples=3, threshold=0.3, default_lead=0.5,
                                   keep_hot=False, predict_unannounced=True)
    base.update(kw)
    return PlanConfig(**base)  # type: ignore[arg-type]


def cycle(p: WaitPlanner, name: str, t: float, wait: float, took: float = 0.3) -> float:
    """One wait of ``wait`` seconds from ``t``, driven as the daemon drives it (a planned
    prefetch that fits in the wait takes ``took`` s); returns when the next one may start."""
    at = p.wait_started(name, t)
    if at is not None and at + took <= t + wait:
        assert p.due(at) == [(name, Action.PREFETCH)]
        token = p.prefetch_started(name)
        p.prefetch_done(name, token, took, at + took)
    p.tool_started(name, t + wait)
    return t + wait + 1.0


def predicted(p: WaitPlanner, waits: tuple[float, ...], took: float = 0.1) -> tuple[float, float]:
    """Waits of these lengths, then a new wait whose planned prefetch fires and takes
    ``took`` s; returns (the new wait's start, its fire time)."""
    t = 0.0
    for w in waits:
        t = cycle(p, "a", t, w)
    at = p.wait_started("a", t)
    assert at is not None and p.due(at) == [("a", Action.PREFETCH)]
    tok = p.prefetch_started("a")
    p.prefetch_done("a", tok, took, at + took)
    return t, at


def test_fire_time_of_a_regular_wait_is_one_lead_before_its_end() -> None:
    assert fire_time([3.0] * 5, 0.0, 0.5, 0.3) == pytest.approx(2.5)


def test_fire_time_says_nothing_past_the_longest_wait_seen() -> None:
    assert fire_time([], 0.0, 0.5, 0.3) is None
    assert fire_time([1.0, 2.0], 2.0, 0.5, 0.3) is None


def test_fire_time_conditions_on_the_age_of_the_wait() -> None:
    waits = [1.0, 1.0, 1.0, 10.0, 10.0]
    # from the start, most waits end around 1 s: fire before that
    assert fire_time(waits, 0.0, 0.5, 0.3) == pytest.approx(0.5)
    # a wait that has already lasted 2 s is one of the long ones: fire before 10 s
    assert fire_time(waits, 2.0, 0.5, 0.3) == pytest.approx(9.5)


def test_no_history_means_prefetch_on_the_tool_hint() -> None:
    p = WaitPlanner(PlanConfig(keep_hot=False, predict_unannounced=True))
    assert p.wait_started("a", 100.0) is None
    assert p.due(101.0) == [] and p.next_due() is None
    start = p.tool_started("a", 102.0)
    assert start.prefetch and start.reason == "no-prediction"
    assert start.wait_s == pytest.approx(2.0)


def test_predicted_wait_prefetches_before_the_end_and_not_again_on_the_hint() -> None:
    p = WaitPlanner(quick())
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    at = p.wait_started("a", t)
    assert at == pytest.approx(t + 2.5, abs=1e-9)
    assert p.due(t + 2.0) == []
    assert p.next_due() == at
    assert p.due(at) == [("a", Action.PREFETCH)]
    tok = p.prefetch_started("a")
    p.prefetch_done("a", tok, 0.2, at + 0.2)
    start = p.tool_started("a", t + 3.0)
    assert not start.prefetch and start.reason == "predicted"
    snap = p.snapshot("a", t + 3.0)
    assert snap["fired"] == 1 and snap["hits"] == 1  # the first three waits: too few samples


def test_a_new_sandbox_is_predicted_from_the_fleet() -> None:
    p = WaitPlanner(quick())
    t = 0.0
    for name in ("a", "b", "c"):
        t = cycle(p, name, t, 4.0)
    assert p.wait_started("new", t) == pytest.approx(t + 3.5, abs=1e-9)


def test_a_wait_longer_than_predicted_is_compressed_again_and_predicted_anew() -> None:
    p = WaitPlanner(quick(recompress_after=1.0, recompress_min_remaining=3.0))
    t = 0.0
    for w in (1.0, 1.0, 1.0, 10.0, 10.0):
        t = cycle(p, "a", t, w)
    at = p.wait_started("a", t)
    assert at == pytest.approx(t + 0.5, abs=1e-9)
    assert p.due(at) == [("a", Action.PREFETCH)]
    tok = p.prefetch_started("a")
    p.prefetch_done("a", tok, 0.1, at + 0.1)
    assert p.due(at + 0.5) == []
    # one second after the prefetch the wait is still on, and the longer waits went on for
    # 8 s more: compress again, plan near 10 s
    assert p.due(at + 1.2) == [("a", Action.RECOMPRESS)]
    nxt = p.next_due()
    assert nxt is not None and t + 9.0 < nxt < t + 10.0
    assert p.due(nxt) == [("a", Action.PREFETCH)]
    tok = p.prefetch_started("a")
    p.prefetch_done("a", tok, 0.1, nxt + 0.1)
    assert p.due(nxt + 5.0) == []  # max_fires (2): no more recompress in this wait
    assert p.tool_started("a", t + 10.0).reason == "predicted"
    assert p.snapshot("a", t)["early"] == 1  # two prefetches for one wait


def test_a_wait_about_to_end_keeps_its_working_set() -> None:
    p = WaitPlanner(quick(recompress_after=1.0, recompress_min_remaining=3.0))
    t, at = predicted(p, (1.0, 1.0, 1.0, 3.0, 3.0))
    # still waiting after 1.6 s, but the longer waits ended 1.4 s later: no recompress
    assert p.due(at + 1.2) == [] and p.next_due() is None
    assert p.tool_started("a", t + 3.0).reason == "predicted"


def test_early_prefetches_move_the_next_one_later_and_hits_relax_it() -> None:
    p = WaitPlanner(quick(threshold=0.3, early_factor=2.0, relax_factor=0.5,
                          recompress_min_remaining=0.0))
    t = 0.0
    for w in (1.0, 1.0, 1.0, 10.0, 10.0):
        t = cycle(p, "a", t, w)
    at = p.wait_started("a", t)
    assert at is not None and p.due(at) == [("a", Action.PREFETCH)]
    tok = p.prefetch_started("a")
    p.prefetch_done("a", tok, 0.1, at + 0.1)
    assert p.due(at + 2.0) == [("a", Action.RECOMPRESS)]
    p.tool_started("a", t + 10.0)  # not re-fired in time: the wait was a long one
    snap = p.snapshot("a", t)
    assert snap["threshold"] == pytest.approx(0.6)  # early: fire later next time
    t += 11.0
    cycle(p, "a", t, 10.0)  # a hit: the long waits are predicted now
    assert p.snapshot("a", t)["threshold"] == pytest.approx(0.3)


def test_a_sandbox_whose_predictions_miss_is_left_to_the_hint() -> None:
    p = WaitPlanner(quick(judge_waits=4, min_hit_rate=0.5, pause_waits=3))
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    for _ in range(4):  # every tool hint comes before the planned prefetch
        assert p.wait_started("a", t) is not None
        assert p.tool_started("a", t + 0.6).reason == "not-fired"
        t += 2.0
    assert p.snapshot("a", t)["paused"] == 3
    for _ in range(3):
        assert p.wait_started("a", t) is None
        assert p.tool_started("a", t + 3.0).reason == "no-prediction"
        t += 4.0
    assert p.wait_started("a", t) is not None  # tried again


def test_late_prefetch_is_timed_and_counted_once() -> None:
    p = WaitPlanner(quick())
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    first = p.wait_started("a", t)
    assert first is not None and p.due(first) == [("a", Action.PREFETCH)]
    tok = p.prefetch_started("a")
    start = p.tool_started("a", first + 0.1)  # while the prefetch runs: the tool paid for it
    assert not start.prefetch and start.reason == "in-flight"
    p.prefetch_done("a", tok, 1.0, first + 1.0)
    assert p.snapshot("a", first)["late"] == 1
    assert p.lead("a") > 0.5  # the slow prefetch moves the next one earlier


def test_a_hint_before_the_planned_time_prefetches_at_once_and_counts_late() -> None:
    p = WaitPlanner(quick())
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
    tok = p.prefetch_started("a")
    p.prefetch_done("a", tok, 0.4, 0.4)
    assert p.lead("a") == pytest.approx(0.65)
    p.busy = True
    assert p.lead("a") == pytest.approx(1.3)


def test_too_few_waits_predict_nothing() -> None:
    p = WaitPlanner(PlanConfig(min_samples=5, keep_hot=False, predict_unannounced=True))
    t = 0.0
    for name in ("a", "b", "c", "d"):
        t = cycle(p, name, t, 3.0)
    assert p.wait_started("e", t) is None
    p.tool_started("e", t + 3.0)
    assert p.wait_started("f", t + 5.0) is not None  # five in the fleet now


def test_other_phases_end_the_plan() -> None:
    p = WaitPlanner(quick())
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    p.wait_started("a", t)
    p.other_phase("a")
    assert p.due(t + 5.0) == [] and p.next_due() is None


@pytest.mark.parametrize("bad", [
    dict(history=0), dict(threshold=0.0), dict(threshold=0.9),
    dict(max_lead=0.0), dict(recompress_after=-1.0), dict(max_fires=0),
    dict(min_hit_rate=1.5),
])
def test_bad_config_is_refused(bad: dict) -> None:
    with pytest.raises(errors.InvalidValue):
        WaitPlanner(PlanConfig(**bad))


def test_no_prediction_while_the_host_is_short_of_cpu() -> None:
    p = WaitPlanner(quick())
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    p.busy = True
    assert p.wait_started("a", t) is None
    assert p.tool_started("a", t + 3.0).reason == "no-prediction"
    assert p.snapshot("a", t)["busy_waits"] == 1
    p.busy = False
    assert p.wait_started("a", t + 5.0) is not None
    q = WaitPlanner(quick(predict_when_busy=True))
    t = 0.0
    for _ in range(3):
        t = cycle(q, "a", t, 3.0)
    q.busy = True
    assert q.wait_started("a", t) is not None


def test_a_prefetch_of_the_last_wait_is_not_credited_to_the_next() -> None:
    p = WaitPlanner(quick())
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    at = p.wait_started("a", t)
    assert at is not None and p.due(at) == [("a", Action.PREFETCH)]
    old = p.prefetch_started("a")
    assert p.tool_started("a", at + 0.1).reason == "in-flight"  # it still runs
    t = at + 1.0
    nxt = p.wait_started("a", t)
    assert nxt is not None
    assert p.due(nxt) == [] and p.next_due() is None  # not while the old one runs
    p.prefetch_done("a", old, 0.5, nxt)  # the old one ends: nothing planned for this wait
    snap = p.snapshot("a", nxt)
    assert not snap["prefetching"] and snap["hits"] == 0 and snap["late"] == 1
    assert p.due(nxt) == [("a", Action.PREFETCH)]
    new = p.prefetch_started("a")
    p.prefetch_done("a", new, 0.2, nxt + 0.2)
    assert p.tool_started("a", t + 3.0).reason == "predicted"


def test_a_forgotten_sandbox_stays_forgotten() -> None:
    p = WaitPlanner(quick())
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    at = p.wait_started("a", t)
    assert at is not None and p.due(at)
    tok = p.prefetch_started("a")
    p.forget("a")
    p.prefetch_done("a", tok, 0.1, at + 0.1)
    p.snapshot("a", at)
    assert "a" not in p._sb


def test_fire_time_is_cheap_on_long_waits() -> None:
    # the candidates are the waits' own ages, not a grid: an hour-long wait costs no more
    waits = [1.0, 2.0, 3600.0, 3600.0]
    assert fire_time(waits, 3.0, 0.5, 0.5) == pytest.approx(3599.5)


def test_an_announced_end_prefetches_at_once_without_history() -> None:
    p = WaitPlanner(quick())
    assert p.wait_started("a", 0.0) is None  # nothing learned yet: no prediction
    assert p.due(1.0) == []
    assert p.wait_ending("a", 1.5)
    assert p.next_due() == 1.5
    assert p.due(1.5) == [("a", Action.PREFETCH)]
    tok = p.prefetch_started("a")
    p.prefetch_done("a", tok, 0.3, 1.8)
    assert not p.wait_ending("a", 1.9)  # said once per wait
    assert p.tool_started("a", 2.2).reason == "predicted"
    snap = p.snapshot("a", 2.2)
    assert snap["endings"] == 1 and snap["hits"] == 1


def test_an_announced_end_is_never_compressed_again() -> None:
    p = WaitPlanner(quick(recompress_after=1.0, recompress_min_remaining=3.0))
    t, at = predicted(p, (1.0, 1.0, 1.0, 10.0, 10.0))
    # without the announcement the wait would be compressed again at at + 1.1
    assert not p.wait_ending("a", at + 0.5)  # its prefetch already ran: nothing more to do
    assert p.due(at + 1.2) == [] and p.next_due() is None
    assert p.tool_started("a", t + 3.0).reason == "predicted"


def test_an_announced_end_during_a_prefetch_waits_for_it() -> None:
    p = WaitPlanner(quick())
    t = 0.0
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)
    at = p.wait_started("a", t)
    assert at is not None and p.due(at) == [("a", Action.PREFETCH)]
    p.prefetch_started("a")
    assert not p.wait_ending("a", at + 0.1)  # in flight: not a second one
    assert p.due(at + 0.2) == []


def test_an_announced_end_outside_a_wait_does_nothing() -> None:
    p = WaitPlanner(quick())
    assert not p.wait_ending("a", 0.0)
    assert p.due(0.0) == [] and p.next_due() is None


def test_an_announced_end_on_a_busy_host_leaves_the_tool_to_fault() -> None:
    p = WaitPlanner(quick())
    p.wait_started("a", 0.0)
    p.busy = True
    assert not p.wait_ending("a", 1.0)
    assert p.due(1.0) == [] and p.next_due() is None
    assert p.tool_started("a", 1.5).prefetch  # the tool hint may still prefetch beside it


def announced(p: WaitPlanner, name: str, t: float, stream: float, wait: float = 3.0,
              took: float = 0.2) -> float:
    """A wait whose end is announced ``stream`` s before its tool hint, its prefetch (due
    whenever the planner says) taking ``took`` s; returns when the next wait may start."""
    p.wait_started(name, t)
    end = t + wait
    assert p.wait_ending(name, end - stream)
    at = p.next_due()
    assert at is not None
    if p.config.stream_quantile == 0:
        assert at == pytest.approx(end - stream)  # at the announcement
    if at + took <= end:
        assert p.due(at) == [(name, Action.PREFETCH)]
        token = p.prefetch_started(name)
        p.prefetch_done(name, token, took, at + took)
    p.tool_started(name, end)
    return end + 1.0


def test_an_announced_prefetch_is_paced_to_the_streams_recorded() -> None:
    p = WaitPlanner(quick(stream_quantile=0.2))
    t = 0.0
    for stream in (1.0, 2.0, 1.5):  # announced at once until min_samples streams are known
        p.wait_started("a", t)
        assert p.wait_ending("a", t + 3.0 - stream)
        assert p.next_due() == t + 3.0 - stream
        token = p.prefetch_started("a")
        p.prefetch_done("a", token, 0.2, t + 3.2 - stream)
        p.tool_started("a", t + 3.0)
        t += 4.0
    lead = p.lead("a")  # 1.5 x 0.2 + 0.05
    assert lead == pytest.approx(0.35)
    # the lower nearest rank: the 0.2 quantile of (1.0, 1.5, 2.0) is 1.0: due 1.0 - lead on
    assert p.stream_delay("a") == pytest.approx(1.0 - lead)
    p.wait_started("a", t)
    assert p.wait_ending("a", t + 1.0)
    assert p.next_due() == pytest.approx(t + 1.0 + 1.0 - lead)
    assert p.due(t + 1.5) == []  # the working set stays compressed meanwhile
    assert p.due(t + 2.0) == [("a", Action.PREFETCH)]
    assert p.snapshot("a", t)["stream_median_s"] == 1.5


def test_a_stream_shorter_than_the_pace_finds_its_prefetch_late() -> None:
    # announced waits whose working set goes once recorded (no prediction: as the daemon
    # with --prefetch-from resident runs them)
    p = WaitPlanner(hot(deep_after_kept=True, stream_quantile=0.5))
    t = 0.0
    for k in range(4):
        p.wait_started("a", t)
        p.kept_level("a", t + 0.3)
        # the first wait is not known to be announced yet: it kept its working set
        assert p.wait_ending("a", t + 1.0) == (k > 0)
        at = p.next_due()
        if k > 0:
            assert at is not None and p.due(at) == [("a", Action.PREFETCH)]
            token = p.prefetch_started("a")
            p.prefetch_done("a", token, 0.2, at + 0.2)
        p.tool_started("a", t + 3.0)  # 2 s streams
        t += 4.0
    p.wait_started("a", t)
    assert p.kept_level("a", t + 0.3)
    assert p.wait_ending("a", t + 2.5)
    due = p.next_due()
    assert due is not None and due > t + 3.0
    start = p.tool_started("a", t + 3.0)  # a 0.5 s stream: the tool came first
    assert start.reason == "not-fired"
    assert p.snapshot("a", t + 3.0)["late"] == 1


def test_a_new_sandbox_is_paced_by_the_fleets_streams() -> None:
    p = WaitPlanner(quick(stream_quantile=0.2))
    t = 0.0
    for _ in range(3):
        t = announced(p, "a", t, stream=2.0)
    assert p.stream_delay("b") == pytest.approx(2.0 - p.lead("b"))


def test_stream_quantile_zero_prefetches_at_the_announcement() -> None:
    p = WaitPlanner(quick(stream_quantile=0.0))
    t = 0.0
    for _ in range(4):
        t = announced(p, "a", t, stream=2.0)
    assert p.stream_delay("a") == 0.0
    with pytest.raises(errors.InvalidValue):
        PlanConfig(stream_quantile=1.0).validate()
    with pytest.raises(errors.InvalidValue):
        PlanConfig(stream_quantile=-0.1).validate()


def test_streams_are_recorded_for_announced_waits_that_reach_their_tool_only() -> None:
    p = WaitPlanner(quick(stream_quantile=0.2))
    p.wait_started("a", 0.0)
    p.tool_started("a", 2.0)  # not announced: no stream
    p.wait_started("a", 3.0)
    p.wait_ending("a", 4.0)
    p.other_phase("a")  # parked before its tool: no stream either
    p.wait_started("a", 6.0)
    p.wait_ending("a", 7.0)
    p.wait_started("a", 9.0)  # a new wait without a tool hint between: none
    p.tool_started("a", 10.0)
    assert p.snapshot("a", 10.0)["stream_median_s"] is None


def test_a_sandbox_with_few_streams_of_its_own_counts_the_fleets_too() -> None:
    p = WaitPlanner(quick(stream_quantile=0.5, min_samples=3))
    t = 0.0
    for _ in range(4):
        t = announced(p, "a", t, stream=2.0)
    for _ in range(2):
        t = announced(p, "b", t, stream=0.5)
    # b's own (0.5, 0.5) with the fleet's last (2, 2, 2, 2, 0.5, 0.5): index int(0.5 x 7) = 3
    # of (0.5 x 4, 2 x 4) -> 0.5; the fleet's alone, (0.5, 0.5, 2, 2, 2, 2): index 2 -> 2.0
    assert p.stream_delay("b") == pytest.approx(max(0.0, 0.5 - p.lead("b")))


def test_announced_says_whether_the_wait_in_progress_was_announced() -> None:
    p = WaitPlanner(quick())
    assert not p.announced("a")
    p.wait_started("a", 0.0)
    assert not p.announced("a")
    p.wait_ending("a", 1.0)
    assert p.announced("a")
    p.tool_started("a", 2.0)
    assert not p.announced("a")


def test_a_working_set_taken_anyway_comes_back_when_its_announcement_made_it_due() -> None:
    p = WaitPlanner(hot(stream_quantile=0.5))
    t = 0.0
    for _ in range(6):  # enough unannounced waits that the sandbox does not count as announced
        t = kept_wait(p, "a", t, 3.0)
    for _ in range(3):  # announced waits that kept their working set: streams of 2 s
        p.wait_started("a", t)
        assert not p.wait_ending("a", t + 1.0)
        p.tool_started("a", t + 3.0)
        t += 4.0
    p.wait_started("a", t)
    assert not p.wait_ending("a", t + 1.0)  # kept: nothing to bring back yet
    assert p.deep_ok("a", t + 1.2, must=True)  # memory pressure takes it anyway
    due = t + 1.0 + p.stream_delay("a")
    assert due > t + 1.2
    assert p.next_due() == pytest.approx(due)  # paced from the announcement, not from now
    assert p.due(t + 1.2) == []
    assert p.due(due) == [("a", Action.PREFETCH)]


def test_an_announcement_does_not_postpone_a_planned_prefetch() -> None:
    p = WaitPlanner(quick(stream_quantile=0.9))
    t = 0.0
    for _ in range(3):
        t = announced(p, "a", t, stream=2.5)
    for _ in range(3):
        t = cycle(p, "a", t, 3.0)  # unannounced waits of 3 s: predicted
    at = p.wait_started("a", t)
    assert at is not None
    assert p.wait_ending("a", at - 0.5)
    assert p.next_due() == pytest.approx(at)


# -- the hot set (keep_hot) -------------------------------------------------------------------


def hot(**kw: object) -> PlanConfig:
    base: dict[str, object] = dict(min_samples=3, threshold=0.3, default_lead=0.5,
                                   keep_hot=True, deep_min_remaining=4.0, deep_after=10.0,
                                   predict_unannounced=True)
    base.update(kw)
    return PlanConfig(**base)  # type: ignore[arg-type]


def kept_wait(p: WaitPlanner, name: str, t: float, wait: float) -> float:
    assert p.wait_started(name, t) is None
    start = p.tool_started(name, t + wait)
    assert not start.prefetch and start.reason == "kept"
    return t + wait + 1.0


def test_without_history_the_hot_set_goes_only_after_deep_after() -> None:
    p = WaitPlanner(hot())
    assert p.wait_started("a", 0.0) is None  # nothing planned before the hot set goes
    assert not p.deep_ok("a", 0.0)
    assert not p.deep_ok("a", 9.9)
    assert p.deep_ok("a", 10.0)
    assert p.deep_ok("a", 10.5)  # decided for the rest of the wait
    assert p.snapshot("a", 10.5)["deep"] == 1


def test_without_history_the_hot_set_goes_once_the_age_reaches_deep_min_remaining() -> None:
    # the default: a wait longer than every recorded one (here there are none) is expected to
    # last as long again
    p = WaitPlanner(hot(deep_after=None))
    assert p.wait_started("a", 0.0) is None
    assert not p.deep_ok("a", 3.9)
    assert p.deep_ok("a", 4.0)
    assert p.snapshot("a", 4.0)["deep"] == 1


def after_short_waits(after: float | None, remaining: float) -> tuple[WaitPlanner, float]:
    """A planner that recorded three kept 1 s waits, and the start of the next wait."""
    p = WaitPlanner(hot(deep_after=after, deep_min_remaining=remaining))
    t = 0.0
    for _ in range(3):
        t = kept_wait(p, "a", t, 1.0)
    p.wait_started("a", t)
    return p, t


def test_a_wait_longer_than_the_history_gives_up_its_hot_set_at_deep_min_remaining() -> None:
    p, t = after_short_waits(None, 2.0)
    # 1 s waits recorded: none expected to last long from the start
    assert not p.deep_ok("a", t + 0.5)
    # past every recorded wait, but not yet 2 s old: expected to last about 1.5 s more
    assert not p.deep_ok("a", t + 1.5)
    assert p.deep_ok("a", t + 2.0)  # as long again: 2 s more
    # a fixed deep_after overrides the rule (the age from which it goes)
    q, t = after_short_waits(10.0, 2.0)
    assert not q.deep_ok("a", t + 9.9) and q.deep_ok("a", t + 10.0)


def test_deep_after_is_the_age_itself_whether_below_or_above_deep_min_remaining() -> None:
    # just past the 1 s waits recorded: the history has no say from here on
    for after, goes in ((0.0, True), (1.0, True), (3.0, False), (None, False)):
        p, t = after_short_waits(after, 2.0)
        assert not p.deep_ok("a", t + 0.9)  # the 1 s waits say: 0.1 s left
        assert p.deep_ok("a", t + 1.05) is goes, after
    p, t = after_short_waits(3.0, 2.0)
    assert not p.deep_ok("a", t + 2.9) and p.deep_ok("a", t + 3.0)
    p, t = after_short_waits(None, 2.0)
    assert not p.deep_ok("a", t + 1.9) and p.deep_ok("a", t + 2.0)


def test_deep_min_remaining_zero_lets_the_hot_set_go_at_once() -> None:
    p, t = after_short_waits(None, 0.0)
    assert p.deep_ok("a", t)


def test_deep_after_must_not_be_negative() -> None:
    with pytest.raises(errors.InvalidValue):
        hot(deep_after=-1.0).validate()


def test_short_waits_keep_the_hot_set_and_their_tools_fetch_nothing() -> None:
    p = WaitPlanner(hot())
    t = 0.0
    for _ in range(5):
        p.wait_started("a", t)
        assert not p.deep_ok("a", t + 0.5)  # waits of 1 s: 1 s more expected, not 4
        start = p.tool_started("a", t + 1.0)
        assert not start.prefetch and start.reason == "kept"
        t += 2.0
    snap = p.snapshot("a", t)
    assert snap["kept"] == 5 and snap["deep"] == 0
    assert snap["hits"] == snap["late"] == snap["early"] == snap["on_hint"] == 0


def test_the_hot_set_goes_when_the_mean_remaining_wait_is_long_and_then_a_prefetch_is_planned(
) -> None:
    p = WaitPlanner(hot())
    t = 0.0
    for _ in range(3):
        t = kept_wait(p, "a", t, 1.0)
    # longer than any recorded wait: the history has no say until deep_after
    p.wait_started("a", t)
    assert not p.deep_ok("a", t + 1.5) and p.deep_ok("a", t + 10.0)
    p.tool_started("a", t + 12.0)
    t += 13.0
    # past the 1 s waits, a 12 s one is expected: 10.5 s more from 1.5 s on
    p.wait_started("a", t)
    assert not p.deep_ok("a", t)  # (3 x 1 + 12) / 4 = 3.75 s < 4 s expected from the start
    assert p.deep_ok("a", t + 1.5)
    fire = p.next_due()
    assert fire is not None and fire > t + 1.5  # this wait's prefetch is planned now
    assert p.due(fire) == [("a", Action.PREFETCH)]


def test_a_kept_wait_is_not_an_outcome_of_the_prediction() -> None:
    p = WaitPlanner(hot(judge_waits=4, pause_waits=4))
    t = 0.0
    for _ in range(8):  # twice judge_waits: kept waits never pause the sandbox
        t = kept_wait(p, "a", t, 1.0)
    snap = p.snapshot("a", t)
    assert snap["paused"] == 0 and snap["kept"] == 8
    assert snap["hits"] == snap["late"] == snap["early"] == 0


def test_announced_waits_let_the_hot_set_go_at_once() -> None:
    p = WaitPlanner(hot())
    t = 0.0
    # the first wait: its end is announced, but the hot set stayed: nothing to fetch
    p.wait_started("a", t)
    assert not p.wait_ending("a", t + 1.0)
    assert not p.deep_ok("a", t + 1.0)  # it ends soon: the tool will use the hot set
    p.tool_started("a", t + 1.5)
    t += 3.0
    # the sandbox's ends are announced: the next wait's hot set goes at once, and its
    # announcement brings it back
    p.wait_started("a", t)
    assert p.deep_ok("a", t)
    assert p.wait_ending("a", t + 1.0)
    assert p.due(t + 1.0) == [("a", Action.PREFETCH)]


def test_announced_waits_keep_the_hot_set_when_nothing_can_bring_it_back() -> None:
    p = WaitPlanner(hot(restores=False))  # the daemon without its prefetcher
    p.wait_started("a", 0.0)
    p.wait_ending("a", 1.0)
    p.tool_started("a", 1.5)
    p.wait_started("a", 3.0)
    assert not p.deep_ok("a", 3.0)  # announced like the first, kept like any short wait


def test_announced_waits_on_a_busy_host_keep_the_hot_set() -> None:
    p = WaitPlanner(hot())
    p.wait_started("a", 0.0)
    p.wait_ending("a", 1.0)
    p.tool_started("a", 1.5)
    p.busy = True
    p.wait_started("a", 3.0)
    assert not p.deep_ok("a", 3.0)  # no prefetch would bring it back in time


def test_keep_hot_config_is_validated() -> None:
    with pytest.raises(errors.InvalidValue):
        PlanConfig(deep_min_remaining=-1).validate()
    with pytest.raises(errors.InvalidValue):
        PlanConfig(announced_share=0).validate()


def test_a_hot_set_taken_anyway_is_planned_for() -> None:
    p = WaitPlanner(hot())
    t = 0.0
    for _ in range(3):
        t = kept_wait(p, "a", t, 3.0)
    p.wait_started("a", t)
    assert p.next_due() is None
    # memory pressure (or a request by hand): the scheduler takes the hot set anyway
    assert p.deep_ok("a", t + 0.5, must=True)
    assert p.next_due() is not None  # this wait's prefetch is planned
    start = p.tool_started("a", t + 3.0)
    assert start.reason != "kept"
    assert p.snapshot("a", t + 3.0)["deep"] == 1


def test_a_working_set_taken_anyway_in_an_announced_wait_comes_back_at_once() -> None:
    p = WaitPlanner(hot())
    t = 0.0
    for _ in range(3):
        t = kept_wait(p, "a", t, 3.0)
    p.wait_started("a", t)
    assert not p.wait_ending("a", t + 1.0)  # kept: nothing to bring back
    assert p.deep_ok("a", t + 1.2, must=True)  # memory pressure takes it anyway
    assert p.due(t + 1.2) == [("a", Action.PREFETCH)]


@pytest.mark.parametrize("keep_hot", [False, True])
def test_without_a_prefetcher_nothing_is_planned(keep_hot: bool) -> None:
    p = WaitPlanner(hot(restores=False, keep_hot=keep_hot))
    t = 0.0
    for _ in range(6):  # a history that predicts the next wait's end
        at = p.wait_started("a", t)
        assert at is None and p.next_due() is None
        assert p.deep_ok("a", t + 1.0, must=True)  # the working set goes
        assert not p.wait_ending("a", t + 2.0)  # announced: still nothing to bring it back
        assert p.due(t + 2.5) == [] and p.next_due() is None
        start = p.tool_started("a", t + 3.0)
        assert not start.prefetch and start.reason == "compressed"
        t += 4.0
    snap = p.snapshot("a", t)
    assert snap["fired"] == snap["hits"] == snap["late"] == snap["on_hint"] == 0
    assert snap["waits"] == 6 and snap["endings"] == 6


def test_an_announced_working_set_goes_once_compression_reached_it_with_deep_after_kept() -> None:
    p = WaitPlanner(hot(deep_after_kept=True, stream_quantile=0.0))  # prefetch at announcement
    p.wait_started("a", 0.0)
    p.wait_ending("a", 1.0)
    p.tool_started("a", 1.5)
    assert not p.kept_level("a", 2.0)  # no wait in progress
    t = 3.0
    for _ in range(4):  # announced like the first: enough waits to predict from
        p.wait_started("a", t)
        assert not p.deep_ok("a", t)  # not at once: compression first reaches the working set
        assert p.kept_level("a", t + 0.4)  # then it goes (the prefetcher has learnt it)
        assert p.deep_ok("a", t + 0.5)
        # no predicted prefetch before the announcement: it brings the working set back
        assert p.next_due() is None
        assert not p.kept_level("a", t + 0.6)  # once
        assert p.wait_ending("a", t + 1.0)
        assert p.due(t + 1.0) == [("a", Action.PREFETCH)]
        token = p.prefetch_started("a")
        p.prefetch_done("a", token, 0.2, t + 1.2)
        assert p.tool_started("a", t + 1.5).reason == "predicted"
        t += 3.0
    assert p.snapshot("a", t)["hits"] == 4


def test_deep_after_kept_leaves_unannounced_and_ending_waits_alone() -> None:
    p = WaitPlanner(hot(deep_after_kept=True))
    t = 0.0
    for _ in range(3):
        t = kept_wait(p, "a", t, 3.0)
    p.wait_started("a", t)
    assert not p.kept_level("a", t + 0.5)  # not announced: deep_min_remaining decides
    p.tool_started("a", t + 1.0)
    p2 = WaitPlanner(hot(deep_after_kept=True))
    p2.wait_started("b", 0.0)
    p2.wait_ending("b", 1.0)
    p2.tool_started("b", 1.5)
    p2.wait_started("b", 3.0)
    p2.wait_ending("b", 3.2)  # it ends before compression reached the working set
    assert not p2.kept_level("b", 3.4)


def test_with_deep_after_kept_no_working_set_goes_before_it_was_reached() -> None:
    for announced in (False, True):
        p = WaitPlanner(hot(deep_after_kept=True))
        t = 0.0
        for _ in range(4):  # long waits: the normal rule would let the working set go at once
            p.wait_started("a", t)
            p.deep_ok("a", t, must=True)
            if announced:
                p.wait_ending("a", t + 20.0)
            t += 21.0
            p.tool_started("a", t)
        p.wait_started("a", t)
        assert not p.deep_ok("a", t + 0.1)  # the prefetcher has not recorded it yet
        assert p.next_due() is None
        # then: announced, it goes now with no predicted prefetch (the announcement brings it
        # back); not announced, by the normal rule (these waits are long), planned as usual
        assert p.kept_level("a", t + 0.2) == announced
        assert p.deep_ok("a", t + 0.3)
        assert (p.next_due() is None) == announced
        # a new sandbox of a fleet with long waits: the same
        p.wait_started("b", t)
        assert not p.deep_ok("b", t + 0.1)
        assert not p.kept_level("b", t + 0.2)  # its own waits were never announced
        assert p.deep_ok("b", t + 0.3)


def test_without_predict_unannounced_a_wait_is_prefetched_only_when_announced() -> None:
    """The daemon's default: the hazard rule plans nothing; an announcement still makes the
    prefetch due, and a working set the scheduler must take in an announced wait comes back."""
    p = WaitPlanner(quick(predict_unannounced=False))
    t = 0.0
    for _ in range(5):  # enough regular waits for the hazard rule to fire on
        t = cycle(p, "a", t, 3.0)
    assert p.wait_started("a", t) is None and p.next_due() is None
    assert p.tool_started("a", t + 3.0).reason == "no-prediction"
    t += 4.0
    p.wait_started("a", t)
    assert p.wait_ending("a", t + 2.0)
    assert p.due(t + 2.0) == [("a", Action.PREFETCH)]
    h = WaitPlanner(hot(predict_unannounced=False))
    for _ in range(5):  # long waits: the working set goes at 4 s of age, nothing planned
        t = cycle(h, "b", t, 10.0)
    h.wait_started("b", t)
    assert h.deep_ok("b", t + 4.0) and h.next_due() is None
    h.wait_started("b", t + 20.0)
    assert h.wait_ending("b", t + 21.0) is False  # kept so far: nothing to bring back
    assert h.deep_ok("b", t + 21.5, must=True)
    assert h.next_due() == pytest.approx(t + 21.5)  # taken anyway: back at once


def test_learns_says_when_a_working_set_record_is_of_use() -> None:
    assert not WaitPlanner(quick(restores=False)).learns("a")
    assert WaitPlanner(quick()).learns("a")  # predicted waits use it
    p = WaitPlanner(hot(predict_unannounced=False))
    assert not p.learns("a")  # nothing known of it
    p.wait_started("a", 0.0)
    assert not p.learns("a")  # never announced
    p.wait_ending("a", 1.0)
    assert p.learns("a")  # this wait was
    p.tool_started("a", 1.5)
    p.wait_started("a", 3.0)
    assert p.learns("a")  # a recent one was
    for k in range(8):  # judge_waits unannounced ones later, no more
        p.tool_started("a", 4.0 + 2 * k)
        p.wait_started("a", 5.0 + 2 * k)
    assert not p.learns("a")


def test_with_deep_after_kept_a_sandbox_never_recorded_goes_by_the_age_rule() -> None:
    """A sandbox whose working set is not recorded (it does not announce, waits are not
    predicted, tool hints do not prefetch: record_all) does not wait for the kept level: the
    age rule alone decides."""
    for predict, record_all, ok in ((False, False, True), (True, False, False),
                                    (False, True, False)):
        p = WaitPlanner(hot(deep_after_kept=True, predict_unannounced=predict,
                            record_all=record_all))
        p.wait_started("a", 0.0)
        assert not p.deep_ok("a", 9.0)  # before deep_after
        assert p.deep_ok("a", 10.5) == ok  # past it; the kept level was never reached

