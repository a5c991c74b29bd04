"""The phase model: hints, inference from activity, generations."""

from __future__ import annotations

import pytest

from controlplane import errors
from controlplane.netlink import Phase
from controlplane.phase import PhaseConfig, PhaseModel


def test_hint_sets_phase_and_dates_it_from_the_hint() -> None:
    m = PhaseModel()
    m.add("a", 10.0)
    v = m.hint("a", Phase.LLM_WAIT, 12.0)
    assert (v.phase, v.since, v.source) == (Phase.LLM_WAIT, 12.0, "hint")
    assert m.get("a", 15.0).age == pytest.approx(3.0)


def test_generation_changes_only_when_the_phase_does() -> None:
    m = PhaseModel()
    g1 = m.hint("a", Phase.LLM_WAIT, 1.0).generation
    v = m.hint("a", Phase.LLM_WAIT, 2.0)  # repeated hint: same wait, same start
    assert v.generation == g1 and v.since == 1.0
    g2 = m.hint("a", Phase.TOOL, 3.0).generation
    g3 = m.hint("a", Phase.LLM_WAIT, 4.0).generation
    assert g1 < g2 < g3


def _feed(m: PhaseModel, name: str, t0: float, seconds: int, cpu_per_s: float, psi: float = 0.0):
    usec = 0
    for i in range(seconds + 1):
        m.observe(name, t0 + i, usec, psi)
        usec += int(cpu_per_s * 1e6)


def test_inference_busy_is_tool_quiet_is_idle_after_idle_after() -> None:
    m = PhaseModel(PhaseConfig(idle_after=5.0))
    m.add("a", 0.0)
    assert m.get("a", 0.0).phase == Phase.UNKNOWN
    _feed(m, "a", 0.0, 3, cpu_per_s=0.5)
    v = m.get("a", 3.0)
    assert (v.phase, v.source) == (Phase.TOOL, "inferred")
    # quiet for 4 s: not yet idle
    m2 = PhaseModel(PhaseConfig(idle_after=5.0))
    m2.add("b", 0.0)
    _feed(m2, "b", 0.0, 4, cpu_per_s=0.0)
    assert m2.get("b", 4.0).phase == Phase.UNKNOWN
    m2.observe("b", 5.0, 0, 0.0)
    assert m2.get("b", 5.0).phase == Phase.IDLE


def test_memory_stall_counts_as_busy() -> None:
    m = PhaseModel(PhaseConfig(idle_after=1.0, active_mem_psi=5.0))
    m.add("a", 0.0)
    _feed(m, "a", 0.0, 3, cpu_per_s=0.0, psi=20.0)  # faulting pages back: working, not idle
    assert m.get("a", 3.0).phase == Phase.TOOL


def test_between_thresholds_keeps_the_previous_inference() -> None:
    m = PhaseModel(PhaseConfig(active_cpu=0.10, idle_cpu=0.02, idle_after=1.0))
    m.add("a", 0.0)
    _feed(m, "a", 0.0, 2, cpu_per_s=0.5)
    m.observe("a", 3.0, int(1.0e6) + int(0.05e6), 0.0)  # 0.05 CPU: in between
    assert m.get("a", 3.0).phase == Phase.TOOL


def test_hint_overrides_inference_until_its_ttl() -> None:
    m = PhaseModel(PhaseConfig(hint_ttl=10.0, idle_after=1.0))
    m.add("a", 0.0)
    m.hint("a", Phase.LLM_WAIT, 0.0)
    _feed(m, "a", 0.0, 5, cpu_per_s=1.0)  # busy, but the orchestrator said llm-wait
    assert m.get("a", 5.0).phase == Phase.LLM_WAIT
    _feed(m, "a", 6.0, 6, cpu_per_s=1.0)
    v = m.get("a", 12.0)
    assert (v.phase, v.source) == (Phase.TOOL, "inferred")


def test_without_ttl_hints_never_expire() -> None:
    m = PhaseModel(PhaseConfig(hint_ttl=None))
    m.hint("a", Phase.LLM_WAIT, 0.0)
    _feed(m, "a", 0.0, 100, cpu_per_s=1.0)
    assert m.get("a", 100.0).phase == Phase.LLM_WAIT


def test_observe_unknown_sandbox_is_ignored_and_remove_forgets() -> None:
    m = PhaseModel()
    m.observe("ghost", 1.0, 5, 0.0)
    assert m.get("ghost", 1.0) is None
    m.hint("a", Phase.TOOL, 0.0)
    m.remove("a")
    assert m.get("a", 1.0) is None and m.names() == []


@pytest.mark.parametrize("text", ["llm-wait", "LLM_WAIT", "llm_wait", 2])
def test_phase_parse(text: str | int) -> None:
    assert Phase.parse(text) == Phase.LLM_WAIT


@pytest.mark.parametrize("text", ["thinking", "", 7])
def test_phase_parse_rejects(text: str | int) -> None:
    with pytest.raises(errors.InvalidValue):
        Phase.parse(text)
