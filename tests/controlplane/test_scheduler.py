"""Scheduler decisions on a fake clock and a fake cgroup tree."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from controlplane import errors
from controlplane.netlink import Phase
from controlplane.phase import PhaseConfig, PhaseModel
from controlplane.scheduler import KEEP_SLACK, Action, MiB, Scheduler, SchedulerConfig, Target
from tests.fakes import FakeCgroup, FakeClock, make_cgroup, make_proc, make_process


class Rig:
    """A scheduler over fake sandboxes sb0..sbN-1 (256 MiB each unless told)."""

    def __init__(
        self,
        tmp: Path,
        clock: FakeClock,
        n: int = 1,
        memory: int = 256 * MiB,
        unreclaimable: int = 0,
        cpu_clock: object = None,
        deep: object = None,
        **cfg: object,
    ) -> None:
        self.clock = clock
        self.root = tmp / "cg"
        self.proc = make_proc(tmp / "proc")
        self.cgs: dict[str, FakeCgroup] = {}
        for i in range(n):
            make_cgroup(self.root, f"/sb/sb{i}", memory=memory)
            self.cgs[f"sb{i}"] = FakeCgroup(
                f"/sb/sb{i}", self.root, clock, unreclaimable=unreclaimable
            )
        self.phases = PhaseModel(PhaseConfig(idle_after=5.0))
        for name in self.cgs:
            self.phases.add(name, clock())
        self.policies: list[dict[str, int]] = []
        # wait_cpu_budget off: the budget tests drive cpu_budget with hinted waits
        base = dict(interval=1.0, grace=2.0, chunk_bytes=16 * MiB, cpu_budget=0.25,
                    wait_cpu_budget=None)
        base.update(cfg)
        self.sched = Scheduler(
            self.phases,
            lambda: [Target(n, cg) for n, cg in self.cgs.items()],
            SchedulerConfig(**base),  # type: ignore[arg-type]
            clock=clock,
            sleep=clock.sleep,
            cpu_clock=cpu_clock or clock,  # type: ignore[arg-type]
            proc_root=self.proc,
            policy_setter=self.policies.append,
            deep=deep,  # type: ignore[arg-type]
        )

    def hint(self, name: str, phase: Phase) -> None:
        self.phases.hint(name, phase, self.clock())

    def mem(self, name: str) -> int:
        return self.cgs[name].memory_current()


def test_nothing_happens_during_the_grace_period(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=2.0)
    r.hint("sb0", Phase.LLM_WAIT)
    clock.advance(1.5)
    rep = r.sched.tick()
    assert rep.candidates == [] and r.cgs["sb0"].writes == []
    clock.advance(0.6)
    rep = r.sched.tick()
    assert rep.candidates == ["sb0"] and r.cgs["sb0"].writes


def test_chunks_are_bounded_and_page_multiples(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, memory=40 * MiB + 4096, grace=0.0, chunk_bytes=16 * MiB)
    r.hint("sb0", Phase.LLM_WAIT)
    for _ in range(10):
        r.sched.tick()
        clock.advance(1.0)
    w = r.cgs["sb0"].writes
    assert w and all(0 < x <= 16 * MiB and x % 4096 == 0 for x in w)
    assert (tmp_path / "cg/sb/sb0/memory.reclaim").read_text().strip() == str(w[-1])


def test_cpu_budget_limits_reclaim_time_per_tick_and_throttles(
    tmp_path: Path, clock: FakeClock
) -> None:
    # 16 MiB at 256 MiB/s = 62.5 ms per chunk; budget 0.25 of a 1 s tick = 250 ms -> 4 chunks
    r = Rig(tmp_path, clock, grace=0.0, cpu_budget=0.25)
    r.hint("sb0", Phase.LLM_WAIT)
    rep = r.sched.tick()
    (act,) = rep.actions
    assert act.chunks == 4 and act.result == "budget"
    assert act.wall == pytest.approx(0.25)
    assert rep.spent <= rep.budget + 1e-9
    # after each write of dt a rest of dt * (1 - b) / b: 3x the write time at b = 0.25
    rests = [s for s in clock.sleeps if s > 0]
    assert rests and all(s == pytest.approx(0.0625 * 3) for s in rests)
    # duty cycle: the writes took a quarter of the wall time the tick used
    assert act.wall / (clock() - rep.now) == pytest.approx(0.25, rel=0.01)


def test_compresses_to_completion_then_stays_done(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, memory=100 * MiB, unreclaimable=10 * MiB, grace=1.0, cpu_budget=1.0)
    r.hint("sb0", Phase.LLM_WAIT)
    t_hint = clock()
    results = []
    for _ in range(5):
        clock.advance(1.0)
        results += [a.result for a in r.sched.tick().actions]
    assert "done" in results
    assert r.mem("sb0") == 10 * MiB  # everything reclaimable went
    n = len(r.cgs["sb0"].writes)
    clock.advance(5.0)
    assert r.sched.tick().actions == [] and len(r.cgs["sb0"].writes) == n
    st = r.sched.snapshot()["sb0"]
    assert st["done"] and st["reclaimed"] == 90 * MiB
    assert st["latency"] == pytest.approx(st["finished_at"] - t_hint)
    assert st["wall"] > 0 and st["cpu"] > 0


def test_tool_hint_stops_at_the_next_chunk_boundary(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=0.0, cpu_budget=1.0)
    r.hint("sb0", Phase.LLM_WAIT)
    cg = r.cgs["sb0"]
    cg.on_write.append(lambda: len(cg.writes) == 2 and r.hint("sb0", Phase.TOOL))
    (act,) = r.sched.tick().actions
    assert len(cg.writes) == 2 and act.result == "stopped:phase=tool"
    # and it stays alone while the tool runs
    for _ in range(3):
        clock.advance(1.0)
        assert r.sched.tick().actions == []
    assert len(cg.writes) == 2
    assert r.sched.snapshot()["sb0"]["last_result"] == "stopped:phase=tool"


def test_new_wait_rearms_a_done_sandbox(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, memory=32 * MiB, grace=0.0, cpu_budget=1.0)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    assert r.sched.snapshot()["sb0"]["done"]
    r.hint("sb0", Phase.TOOL)
    r.cgs["sb0"].set_memory(32 * MiB)  # the tool faulted everything back
    clock.advance(1.0)
    assert r.sched.tick().actions == []
    r.hint("sb0", Phase.LLM_WAIT)
    clock.advance(0.1)
    (act,) = r.sched.tick().actions
    assert act.mem_before == 32 * MiB and act.mem_after < act.mem_before


@pytest.mark.parametrize("phase", [Phase.TOOL, Phase.UNKNOWN])
def test_tool_and_unknown_are_never_compressed(
    tmp_path: Path, clock: FakeClock, phase: Phase
) -> None:
    r = Rig(tmp_path, clock, grace=0.0)
    r.hint("sb0", phase)
    for _ in range(3):
        clock.advance(100.0)
        assert r.sched.tick().actions == []
    assert r.cgs["sb0"].writes == []


def test_longest_waiting_first(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, n=3, grace=0.0, cpu_budget=0.25)
    r.hint("sb2", Phase.LLM_WAIT)
    clock.advance(1.0)
    r.hint("sb0", Phase.LLM_WAIT)
    clock.advance(1.0)
    r.hint("sb1", Phase.LLM_WAIT)
    rep = r.sched.tick()
    assert rep.candidates == ["sb2", "sb0", "sb1"]
    # the budget (4 chunks) went to the longest-waiting one
    assert [a.name for a in rep.actions] == ["sb2"]
    assert r.cgs["sb0"].writes == [] and r.cgs["sb1"].writes == []


def test_host_pressure_skips_grace_and_takes_idle_too(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(
        tmp_path, clock, n=2, grace=30.0, idle_grace=300.0, cpu_budget=0.25, pressure_cpu_budget=0.5
    )
    r.hint("sb1", Phase.IDLE)
    clock.advance(1.0)
    r.hint("sb0", Phase.LLM_WAIT)
    assert r.sched.tick().actions == []  # no pressure: both within their grace
    make_proc(r.proc, psi=25.0)  # host memory pressure
    rep = r.sched.tick()
    assert rep.pressure and rep.budget == pytest.approx(0.5)
    assert rep.candidates == ["sb1", "sb0"]  # idle the longest first
    assert rep.actions[0].name == "sb1"


def test_low_memavailable_is_pressure(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=30.0, pressure_min_available=0.10)
    make_proc(r.proc, total_kb=1000, avail_kb=50)
    r.hint("sb0", Phase.LLM_WAIT)
    rep = r.sched.tick()
    assert rep.pressure and rep.candidates == ["sb0"]


def test_inferred_idle_is_compressed_after_idle_grace(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=0.0, idle_grace=10.0, cpu_budget=1.0)
    acted_at = None
    for _ in range(30):  # cpu.stat never moves: quiet
        if r.sched.tick().actions and acted_at is None:
            acted_at = clock()
        clock.advance(1.0)
    v = r.phases.get("sb0", clock())
    assert v.phase == Phase.IDLE and v.source == "inferred"
    assert acted_at is not None and acted_at - v.since >= 10.0


def test_busy_sandbox_without_hints_is_left_alone(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=0.0, idle_grace=1.0)
    usec = 0
    for _ in range(20):
        usec += 500_000  # half a CPU
        r.cgs["sb0"].set_cpu_usec(usec)
        assert r.sched.tick().actions == []
        clock.advance(1.0)
    assert r.phases.get("sb0", clock()).phase == Phase.TOOL


def test_dense_mode_for_long_waits(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=0.0, dense_after=10.0, cpu_budget=0.01)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    assert r.policies[-1]["codec"] == 0 and r.sched.mode == "fast"
    clock.advance(11.0)
    r.sched.tick()
    assert r.policies[-1] == {"codec": 1, "level": 3, "sim_effort": 8}
    assert r.sched.mode == "dense"


def test_a_refused_mode_switch_is_retried(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=0.0, dense_after=10.0, cpu_budget=0.01)
    calls: list[dict[str, int]] = []

    def setter(p: dict[str, int]) -> None:
        calls.append(p)
        if len(calls) == 1:
            raise errors.from_netlink(errno.EINVAL, "refused", "POLICY_SET")

    r.sched.policy_setter = setter
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    assert r.sched.mode is None  # refused: not recorded as switched
    clock.advance(1.0)
    r.sched.tick()
    assert calls[-1]["codec"] == 0 and r.sched.mode == "fast"


def test_forced_compress_ignores_phase(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, memory=8 * MiB, cpu_budget=1.0)
    r.sched.request_compress("sb0")
    (act,) = r.sched.tick().actions
    assert act.result in ("done", "floor") and r.mem("sb0") == 0


def test_shutdown_between_chunks(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=0.0, cpu_budget=1.0)
    r.hint("sb0", Phase.LLM_WAIT)
    r.cgs["sb0"].on_write.append(r.sched.stop)
    (act,) = r.sched.tick().actions
    assert len(r.cgs["sb0"].writes) == 1 and act.result == "stopped:shutdown"


def test_vanished_cgroup_is_an_error_not_a_crash(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=0.0)
    r.hint("sb0", Phase.LLM_WAIT)
    for f in (tmp_path / "cg/sb/sb0").iterdir():
        f.unlink()
    (act,) = r.sched.tick().actions
    assert act.result.startswith("error:")


def test_every_tick_with_candidates_is_logged_with_its_numbers(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    r = Rig(tmp_path, clock, grace=0.0)
    r.hint("sb0", Phase.LLM_WAIT)
    with caplog.at_level(logging.INFO, logger="azswap.scheduler"):
        r.sched.tick()
    line = next(m for m in caplog.messages if m.startswith("tick"))
    for part in ("pressure=no", "avail=", "budget=0.250s", "sb0 llm-wait", "mem 256.0M->", "wall="):
        assert part in line


def test_config_is_validated() -> None:
    with pytest.raises(errors.InvalidValue):
        SchedulerConfig(cpu_budget=0.0).validate()
    with pytest.raises(errors.InvalidValue):
        SchedulerConfig(chunk_bytes=100).validate()


def test_reclaim_writes_run_at_lower_priority_and_only_they(
    tmp_path: Path, clock: FakeClock
) -> None:
    """memory.reclaim compresses in the writing thread: the write runs at ``reclaim_nice``
    more than the thread's own nice, and the thread is back at its own nice afterwards (a
    preempted low-priority thread holding the GIL would hold up the daemon's hint answers)."""
    import os
    import threading

    r = Rig(tmp_path, clock, grace=0.0, chunk_bytes=4 * MiB, cpu_budget=1.0, reclaim_nice=7)
    seen: list[int] = []
    own: list[int] = []

    def body() -> None:
        tid = threading.get_native_id()
        own.append(os.getpriority(os.PRIO_PROCESS, tid))
        r.cgs["sb0"].on_write.append(lambda: seen.append(os.getpriority(os.PRIO_PROCESS, tid)))
        r.hint("sb0", Phase.LLM_WAIT)
        r.sched.tick()
        own.append(os.getpriority(os.PRIO_PROCESS, tid))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen and seen[0] == min(19, own[0] + 7)
    if os.geteuid() == 0:  # root puts the thread back between writes and after them
        assert all(n == seen[0] for n in seen) and own[1] == own[0]


def test_a_done_sandbox_still_waiting_is_compressed_again(tmp_path: Path, clock: FakeClock) -> None:
    """A pass that comes up short leaves pages (the kernel's active list): look again later."""
    r = Rig(tmp_path, clock, memory=8 * MiB, unreclaimable=3 * MiB, grace=0.0, recheck=1.0,
            cpu_budget=1.0)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    assert r.sched.state["sb0"].done and r.mem("sb0") == 3 * MiB
    r.cgs["sb0"].unreclaimable = 1 * MiB  # those pages became inactive
    clock.advance(0.5)
    r.sched.tick()
    assert r.mem("sb0") == 3 * MiB  # before the recheck period: left alone
    clock.advance(1.0)
    r.sched.tick()
    assert r.mem("sb0") == 1 * MiB  # compressed again
    for _ in range(4):  # two futile passes, then quiet until it grows
        clock.advance(1.1)
        r.sched.tick()
    n = len(r.cgs["sb0"].writes)
    for _ in range(3):
        clock.advance(1.1)
        r.sched.tick()
    assert len(r.cgs["sb0"].writes) == n
    r.cgs["sb0"].set_memory(2 * MiB)  # it grew (something touched it)
    clock.advance(1.1)
    r.sched.tick()
    assert r.mem("sb0") == 1 * MiB and len(r.cgs["sb0"].writes) > n
    r.hint("sb0", Phase.TOOL)  # and never in a tool phase
    r.cgs["sb0"].set_memory(8 * MiB)
    clock.advance(5)
    r.sched.tick()
    assert r.mem("sb0") == 8 * MiB


def test_a_hold_stops_compression_for_the_phase_and_release_resumes_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    r = Rig(tmp_path, clock, grace=0.0, cpu_budget=0.25)
    r.hint("sb0", Phase.LLM_WAIT)
    assert r.sched.tick().actions  # compressing, within the budget
    r.sched.hold("sb0")  # the wait is about to end: the working set is coming back
    clock.advance(1.0)
    assert r.sched.tick().actions == []
    n = len(r.cgs["sb0"].writes)
    r.sched.release("sb0")  # the wait went on
    clock.advance(1.0)
    assert r.sched.tick().actions and len(r.cgs["sb0"].writes) > n
    # a hold lasts one phase: the next wait compresses again
    r.sched.hold("sb0")
    r.hint("sb0", Phase.TOOL)
    r.hint("sb0", Phase.LLM_WAIT)
    clock.advance(1.0)
    assert r.sched.tick().actions


def test_idle_cpus_lift_the_budget(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, grace=0.0, cpu_budget=0.25, idle_cpu_budget=1.0, cpu_busy_psi=10.0)
    (r.proc / "pressure" / "cpu").write_text(
        "some avg10=50.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    r.hint("sb0", Phase.LLM_WAIT)
    assert r.sched.tick().budget == pytest.approx(0.25)  # CPUs contended: the set budget
    (r.proc / "pressure" / "cpu").write_text("some avg10=1.00 avg60=0.00 avg300=0.00 total=0\n")
    clock.advance(1.0)
    assert r.sched.tick().budget == pytest.approx(1.0)


def test_a_hinted_wait_is_compressed_with_the_wait_budget(
    tmp_path: Path, clock: FakeClock
) -> None:
    # CPUs contended (cpu_budget 0.25 applies), but sb0 waits for the LLM: a whole CPU, no
    # rest between its writes; sb1, only inferred idle, keeps the lower budget
    r = Rig(tmp_path, clock, n=2, grace=0.0, idle_grace=0.0, cpu_budget=0.25,
            wait_cpu_budget=1.0, cpu_busy_psi=10.0)
    (r.proc / "pressure" / "cpu").write_text(
        "some avg10=50.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    r.hint("sb0", Phase.LLM_WAIT)
    rep = r.sched.tick()
    assert rep.budget == pytest.approx(1.0)
    (act,) = [a for a in rep.actions if a.name == "sb0"]
    assert act.wall == pytest.approx(1.0) and act.chunks == 16  # 62.5 ms each, back to back
    assert not [s for s in clock.sleeps if s > 1e-9]
    # the same sandbox inferred idle instead: the set budget and its rests
    r2 = Rig(tmp_path / "b", clock, grace=0.0, idle_grace=0.0, cpu_budget=0.25,
             wait_cpu_budget=1.0, cpu_busy_psi=10.0)
    (r2.proc / "pressure" / "cpu").write_text(
        "some avg10=50.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    r2.hint("sb0", Phase.IDLE)
    clock.sleeps.clear()
    rep2 = r2.sched.tick()
    assert rep2.budget == pytest.approx(0.25)
    (act2,) = rep2.actions
    assert act2.chunks == 4 and [s for s in clock.sleeps if s > 1e-9]


def test_a_write_starved_of_cpu_needs_no_rest(tmp_path: Path, clock: FakeClock) -> None:
    # the reclaim got a quarter of the CPU while it ran (busier threads first): at a budget of
    # 0.25 it already kept to it, so no rest follows
    r = Rig(tmp_path, clock, grace=0.0, cpu_budget=0.25, cpu_clock=lambda: clock() / 4)
    r.hint("sb0", Phase.LLM_WAIT)
    rep = r.sched.tick()
    (act,) = rep.actions
    assert act.chunks > 1 and act.cpu == pytest.approx(act.wall / 4)
    assert not [s for s in clock.sleeps if s > 1e-9]
    assert rep.spent == pytest.approx(act.cpu) and rep.spent <= rep.budget + 1e-9


def test_a_short_pass_is_followed_by_one_more(tmp_path: Path, clock: FakeClock) -> None:
    # the kernel deactivates recently used pages on a pass instead of taking them: one more
    # pass takes them, and two short passes in a row end the run
    r = Rig(tmp_path, clock, memory=8 * MiB, unreclaimable=2 * MiB, grace=0.0, cpu_budget=1.0,
            chunk_bytes=16 * MiB)
    r.hint("sb0", Phase.LLM_WAIT)
    (act,) = r.sched.tick().actions
    assert act.result == "done" and act.chunks == 2


def test_a_tick_lasts_one_interval_when_writes_are_starved(
    tmp_path: Path, clock: FakeClock
) -> None:
    # a tenth of a CPU while writing: the CPU budget alone would keep this sandbox's run going
    # for five intervals, and every other sandbox waiting
    r = Rig(tmp_path, clock, n=2, grace=0.0, cpu_budget=0.5, interval=1.0, chunk_bytes=4 * MiB,
            cpu_clock=lambda: clock() / 10)
    r.hint("sb0", Phase.LLM_WAIT)
    r.hint("sb1", Phase.LLM_WAIT)
    t0 = clock()
    rep = r.sched.tick()
    assert rep.actions and rep.actions[0].cpu < 0.5
    assert clock() - t0 <= 1.0 + 4 / 256 + 1e-9  # one interval, plus the write in flight


def test_wait_run_ended_blocks_while_a_reclaim_write_is_in_flight(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A prefetch waits for the write in flight: it would take back what is faulted in."""
    import threading

    r = Rig(tmp_path, clock, grace=0.0)
    in_write, go_on = threading.Event(), threading.Event()

    def block() -> None:
        in_write.set()
        assert go_on.wait(10)

    r.cgs["sb0"].on_write.append(block)
    assert r.sched.wait_run_ended("sb0", 0)  # never compressed: nothing in flight
    r.hint("sb0", Phase.LLM_WAIT)
    t = threading.Thread(target=r.sched.tick)
    t.start()
    try:
        assert in_write.wait(10)
        assert not r.sched.wait_run_ended("sb0", 0.05)
        r.sched.hold("sb0")  # the run stops before its next chunk
    finally:
        go_on.set()
    assert r.sched.wait_run_ended("sb0", 10)
    t.join(10)
    assert not t.is_alive()
    assert len(r.cgs["sb0"].writes) == 1
    assert r.sched.snapshot()["sb0"]["last_result"] == "stopped:held"



class Judge:
    """The wait planner's answer to "may the hot set go now?", set by the test; records each
    question (name, must) and checks that the scheduler's lock is not held while asking."""

    def __init__(self) -> None:
        self.ok = False
        self.asked: list[tuple[str, bool]] = []
        self.sched: Scheduler | None = None
        self.locked = 0  # questions asked with the scheduler's lock held (must stay 0)

    def __call__(self, name: str, must: bool) -> bool:
        if self.sched is not None and self.sched._lock.locked():
            self.locked += 1
        self.asked.append((name, must))
        return self.ok


def judged(tmp: Path, clock: FakeClock, n: int = 1) -> tuple[Rig, Judge]:
    judge = Judge()
    r = Rig(tmp, clock, n=n, memory=64 * MiB, grace=0.0, cpu_budget=1.0, chunk_bytes=4 * MiB,
            deep=judge)
    judge.sched = r.sched
    return r, judge


def tool_then_wait(r: Rig, name: str, clock: FakeClock, mem_after_tool: int) -> None:
    r.hint(name, Phase.TOOL)
    clock.advance(1.0)
    r.sched.tick()
    r.cgs[name].set_memory(mem_after_tool)  # what the tool faulted back and allocated
    r.hint(name, Phase.LLM_WAIT)
    clock.advance(1.0)


def learn_level(r: Rig, clock: FakeClock) -> None:
    """sb0's first wait takes everything, its tool brings 16 MiB back, and the next wait
    measures that as its level (and keeps it)."""
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    r.sched.tick()


def test_a_wait_keeps_the_working_set_its_sandbox_measured_until_the_judge_lets_it_go(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, judge = judged(tmp_path, clock)
    r.hint("sb0", Phase.LLM_WAIT)
    # nothing learned yet: everything goes, and the judge is told so
    (act,) = r.sched.tick().actions
    assert act.result == "floor" and r.mem("sb0") == 0 and judge.asked == [("sb0", True)]
    # the tool brings 16 MiB back: the next wait measures it and leaves it
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    (act,) = r.sched.tick().actions
    assert act.result == "hot-kept" and act.chunks == 0 and r.mem("sb0") == 16 * MiB
    assert r.sched.levels["sb0"].keep == 16 * MiB
    # the next tool drifts to 6 MiB more: the wait takes that much, in chunks, and stops
    tool_then_wait(r, "sb0", clock, 22 * MiB)
    (act,) = r.sched.tick().actions
    assert act.result == "hot-kept" and r.mem("sb0") == 16 * MiB
    assert r.cgs["sb0"].writes[-2:] == [4 * MiB, 2 * MiB]
    st = r.sched.snapshot()["sb0"]
    assert st["kept_hot"] and st["done"] and not st["deep"]
    assert ("sb0", False) in judge.asked
    clock.advance(1.0)
    assert r.sched.tick().actions == []  # asked again each tick, still no
    judge.ok = True
    clock.advance(1.0)
    (act,) = r.sched.tick().actions
    assert act.result == "floor" and r.mem("sb0") == 0
    st = r.sched.snapshot()["sb0"]
    assert st["deep"] and not st["kept_hot"]
    assert judge.locked == 0


def test_a_wait_a_little_above_its_level_is_left_as_it_is(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, _judge = judged(tmp_path, clock)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    r.sched.tick()  # the level is measured: 16 MiB
    # a write of a few pages would reclaim a batch or more out of the working set
    tool_then_wait(r, "sb0", clock, 16 * MiB + KEEP_SLACK)
    writes = len(r.cgs["sb0"].writes)
    (act,) = r.sched.tick().actions
    assert act.result == "hot-kept" and act.chunks == 0
    assert len(r.cgs["sb0"].writes) == writes and r.mem("sb0") == 16 * MiB + KEEP_SLACK
    # one page more than that is reclaimed down to the level
    tool_then_wait(r, "sb0", clock, 16 * MiB + KEEP_SLACK + 4096)
    (act,) = r.sched.tick().actions
    assert act.result == "hot-kept" and r.mem("sb0") == 16 * MiB


def test_a_long_wait_measures_the_working_set_again(tmp_path: Path, clock: FakeClock) -> None:
    r, judge = judged(tmp_path, clock)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    judge.ok = True  # a long wait: everything goes
    r.sched.tick()
    assert r.mem("sb0") == 0 and r.sched.levels["sb0"].keep == 16 * MiB
    judge.ok = False
    tool_then_wait(r, "sb0", clock, 24 * MiB)  # the working set grew
    (act,) = r.sched.tick().actions
    assert act.result == "hot-kept" and r.mem("sb0") == 24 * MiB
    assert r.sched.levels["sb0"].keep == 24 * MiB


def test_memory_pressure_an_idle_hint_and_a_request_take_the_hot_set(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, judge = judged(tmp_path, clock, n=3)
    for name in ("sb0", "sb1", "sb2"):
        r.hint(name, Phase.LLM_WAIT)
    r.sched.tick()
    for name in ("sb0", "sb1", "sb2"):
        tool_then_wait(r, name, clock, 16 * MiB)
    r.sched.tick()
    assert all(r.mem(n) == 16 * MiB for n in ("sb0", "sb1", "sb2"))
    judge.asked.clear()
    r.hint("sb1", Phase.IDLE)  # parked: no tool will want its hot set soon
    r.sched.request_compress("sb2")  # by hand
    clock.advance(1.0)
    r.sched.tick()
    assert r.mem("sb1") == 0 and r.mem("sb2") == 0 and r.mem("sb0") == 16 * MiB
    assert ("sb2", True) in judge.asked  # the planner is told its hot set went
    # host memory pressure: the hot set goes whatever the judge says, and the judge is told
    (tmp_path / "proc" / "pressure" / "memory").write_text(
        "some avg10=50.00 avg60=0.00 avg300=0.00 total=0\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    clock.advance(1.0)
    r.sched.tick()
    assert r.mem("sb0") == 0 and ("sb0", True) in judge.asked


def test_an_idle_hint_is_compressed_after_grace_not_idle_grace(
    tmp_path: Path, clock: FakeClock
) -> None:
    r = Rig(tmp_path, clock, grace=1.0, idle_grace=30.0, cpu_budget=1.0)
    r.hint("sb0", Phase.IDLE)
    assert r.sched.tick().actions == []
    clock.advance(1.5)
    (act,) = r.sched.tick().actions
    assert act.phase == "idle" and r.mem("sb0") < 256 * MiB


def test_a_release_after_a_kept_hot_set_takes_it(tmp_path: Path, clock: FakeClock) -> None:
    r, _ = judged(tmp_path, clock)
    learn_level(r, clock)
    assert r.mem("sb0") == 16 * MiB
    r.sched.release("sb0")  # the planner: the wait went on, compress again
    clock.advance(1.0)
    r.sched.tick()
    assert r.mem("sb0") == 0


def test_a_failing_judge_lets_the_hot_set_go(tmp_path: Path, clock: FakeClock) -> None:
    def broken(name: str, must: bool) -> bool:
        raise RuntimeError("planner bug")

    r = Rig(tmp_path, clock, memory=64 * MiB, grace=0.0, cpu_budget=1.0, deep=broken)
    learn_level(r, clock)
    assert r.mem("sb0") == 0


def test_without_a_judge_every_wait_takes_everything(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, memory=64 * MiB, grace=0.0, cpu_budget=1.0)
    learn_level(r, clock)
    assert r.mem("sb0") == 0


def test_a_wait_after_an_idle_phase_learns_nothing_from_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, judge = judged(tmp_path, clock)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()  # everything goes
    r.hint("sb0", Phase.IDLE)  # parked: compressed whole, no tool brought anything back
    clock.advance(1.0)
    r.sched.tick()
    r.cgs["sb0"].set_memory(2 * MiB)
    r.hint("sb0", Phase.LLM_WAIT)
    clock.advance(1.0)
    r.sched.tick()
    assert r.sched.levels["sb0"].keep is None  # not the idle phase's compressed size
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    (act,) = r.sched.tick().actions
    assert act.result == "hot-kept" and r.sched.levels["sb0"].keep == 16 * MiB
    assert judge.locked == 0


def test_a_request_by_hand_takes_the_working_set(tmp_path: Path, clock: FakeClock) -> None:
    r, judge = judged(tmp_path, clock)
    learn_level(r, clock)
    assert r.mem("sb0") == 16 * MiB
    r.sched.request_compress("sb0")
    clock.advance(1.0)
    r.sched.tick()
    assert r.mem("sb0") == 0 and ("sb0", True) in judge.asked


def test_a_kept_sandbox_that_grows_is_compressed_back_to_its_working_set(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, _ = judged(tmp_path, clock)
    learn_level(r, clock)
    r.cgs["sb0"].set_memory(20 * MiB)  # something in it allocated while it waits
    clock.advance(2.0)
    r.sched.tick()
    assert r.mem("sb0") == 16 * MiB


def test_a_release_for_an_ended_wait_does_nothing(tmp_path: Path, clock: FakeClock) -> None:
    r, _ = judged(tmp_path, clock)
    learn_level(r, clock)
    gen = r.sched.snapshot()["sb0"]["generation"]
    r.sched.release("sb0", gen - 2)  # meant for the wait before the last tool
    clock.advance(1.0)
    r.sched.tick()
    assert r.mem("sb0") == 16 * MiB
    r.sched.release("sb0", gen)
    clock.advance(1.0)
    r.sched.tick()
    assert r.mem("sb0") == 0


def wait_kept_after_a_tool(r: Rig, clock: FakeClock, cgroup_of_pid: str = "/sb/sb0"
                           ) -> tuple[Action, Path]:
    """sb0 (one process, pid 4242, in ``cgroup_of_pid`` by its /proc entry) waits, everything
    goes, a tool brings 16 MiB back, and the next wait stops at that level; returns that run's
    action and the process's clear_refs file."""
    (r.root / "sb" / "sb0" / "cgroup.procs").write_text("4242\n")
    refs = make_process(r.proc, 4242, cgroup_of_pid)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    (act,) = r.sched.tick().actions
    return act, refs


def test_a_wait_kept_at_its_working_set_forgets_which_pages_were_used(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, _ = judged(tmp_path, clock)
    (r.root / "sb" / "sb0" / "cgroup.procs").write_text("4242\n")
    refs = make_process(r.proc, 4242, "/sb/sb0")
    r.hint("sb0", Phase.LLM_WAIT)
    (act,) = r.sched.tick().actions
    assert act.result == "floor" and refs.read_text() == ""  # nothing kept: nothing to age
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    (act,) = r.sched.tick().actions
    # the next wait's reclaim sees as used only what the next tool touches
    assert act.result == "hot-kept" and refs.read_text() == "1"
    assert r.sched.snapshot()["sb0"]["aged"] == 1


def test_aging_the_kept_pages_can_be_turned_off(tmp_path: Path, clock: FakeClock) -> None:
    judge = Judge()
    r = Rig(tmp_path, clock, memory=64 * MiB, grace=0.0, cpu_budget=1.0, chunk_bytes=4 * MiB,
            deep=judge, age_kept=False)
    judge.sched = r.sched
    act, refs = wait_kept_after_a_tool(r, clock)
    assert act.result == "hot-kept" and refs.read_text() == ""
    assert r.sched.snapshot()["sb0"]["aged"] == 0


def test_a_kept_wait_is_aged_once_though_it_is_compressed_again(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, _ = judged(tmp_path, clock)
    act, refs = wait_kept_after_a_tool(r, clock)
    assert act.result == "hot-kept" and refs.read_text() == "1"
    refs.write_text("")
    # it grows while it waits: compressed back to its level, the bits left as they are now
    r.cgs["sb0"].set_memory(20 * MiB)
    clock.advance(2.0)
    (act,) = r.sched.tick().actions
    assert act.result == "hot-kept" and r.mem("sb0") == 16 * MiB and refs.read_text() == ""
    assert r.sched.snapshot()["sb0"]["aged"] == 1


def test_a_kept_wait_with_no_process_to_age_is_not_counted_aged(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, _ = judged(tmp_path, clock)
    # the pid now belongs to another cgroup
    act, refs = wait_kept_after_a_tool(r, clock, cgroup_of_pid="/elsewhere")
    assert act.result == "hot-kept" and refs.read_text() == ""
    assert r.sched.snapshot()["sb0"]["aged"] == 0


def test_a_wait_stopped_at_its_working_set_is_reported_to_the_listener(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, _ = judged(tmp_path, clock)
    told: list[tuple[str, int, bool]] = []
    r.sched.kept = lambda name, exact: told.append((name, r.mem(name), exact))
    r.hint("sb0", Phase.LLM_WAIT)
    (act,) = r.sched.tick().actions
    assert act.result == "floor" and told == []  # everything went: no working set kept
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    (act,) = r.sched.tick().actions
    # told while the working set is still resident (a prefetcher records it then)
    assert act.result == "hot-kept" and told == [("sb0", 16 * MiB, True)]


def test_a_write_that_goes_below_the_working_set_is_reported_as_such(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, _ = judged(tmp_path, clock)
    told: list[tuple[str, int, bool]] = []
    approached: list[tuple[str, int]] = []
    r.sched.kept = lambda name, exact: told.append((name, r.mem(name), exact))
    r.sched.approach = lambda name: approached.append((name, r.mem(name)))
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    assert approached == []  # everything goes: no level to approach
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    r.sched.tick()  # the level is measured (16 MiB), no write
    assert approached == [] and told == [("sb0", 16 * MiB, True)]
    # the next tool drifts 6 MiB: told before the wait's first write, once, and the writes
    # that end at the level report it exactly
    tool_then_wait(r, "sb0", clock, 22 * MiB)
    r.sched.tick()
    assert approached == [("sb0", 22 * MiB)] and told[-1] == ("sb0", 16 * MiB, True)
    # a write the kernel overdoes (a batch more than asked) takes part of the working set:
    # the listener hears that what is resident now is not all of it
    tool_then_wait(r, "sb0", clock, 16 * MiB + KEEP_SLACK + 4096)
    cg = r.cgs["sb0"]
    cg.on_write.append(lambda: cg.set_memory(cg.memory_current() - MiB))
    r.sched.tick()
    assert approached[-1] == ("sb0", 16 * MiB + KEEP_SLACK + 4096)
    assert told[-1] == ("sb0", 15 * MiB, False)
    # the same wait grows and is compressed back to its level, exactly this time: the wait
    # went below once, so its earlier record still stands (and no second approach)
    cg.on_write.clear()
    cg.set_memory(20 * MiB)
    clock.advance(1.0)
    r.sched.tick()
    assert r.mem("sb0") == 16 * MiB and told[-1] == ("sb0", 16 * MiB, False)
    assert len(approached) == 2
    # within KEEP_SLACK below still counts as exact
    tool_then_wait(r, "sb0", clock, 16 * MiB + KEEP_SLACK + 4096)
    cg.on_write.append(lambda: cg.set_memory(cg.memory_current() - KEEP_SLACK))
    r.sched.tick()
    assert told[-1] == ("sb0", 16 * MiB - KEEP_SLACK, True)
    # a wait that starts below its level writes nothing and approaches nothing: exact
    cg.on_write.clear()
    tool_then_wait(r, "sb0", clock, 12 * MiB)
    r.sched.tick()
    assert told[-1] == ("sb0", 12 * MiB, True) and len(approached) == 3


def test_a_tool_that_begins_while_the_approach_is_recorded_gets_no_write(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, _ = judged(tmp_path, clock)
    learn_level(r, clock)
    tool_then_wait(r, "sb0", clock, 22 * MiB)
    writes = len(r.cgs["sb0"].writes)
    r.sched.approach = lambda name: r.hint(name, Phase.TOOL)  # the record takes a while
    (act,) = r.sched.tick().actions
    assert act.result == "stopped:phase=tool" and len(r.cgs["sb0"].writes) == writes


def test_a_wait_whose_working_set_a_prefetch_brought_back_does_not_measure_the_next_level(
    tmp_path: Path, clock: FakeClock
) -> None:
    r, judge = judged(tmp_path, clock)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()  # everything goes (nothing learned yet)
    tool_then_wait(r, "sb0", clock, 16 * MiB)
    r.sched.tick()
    assert r.sched.levels["sb0"].keep == 16 * MiB
    judge.ok = True  # this wait's working set goes too...
    clock.advance(1.0)
    r.sched.tick()
    assert r.mem("sb0") == 0
    r.sched.restored("sb0")  # ...and a prefetch brings back 24 MiB, 8 of them never used
    tool_then_wait(r, "sb0", clock, 24 * MiB)
    judge.ok = False
    r.sched.tick()
    assert r.sched.levels["sb0"].keep == 16 * MiB  # the level learnt before stays


def test_the_device_is_packed_after_runs_that_sent_pages_out_at_most_once_per_period(
    tmp_path: Path, clock: FakeClock
) -> None:
    r = Rig(tmp_path, clock, n=2, memory=32 * MiB, grace=0.0, cpu_budget=1.0, pack_every=10.0)
    packs: list[float] = []
    r.sched.packer = lambda: packs.append(clock())
    r.sched.pack_async = False
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    assert r.sched.snapshot()["sb0"]["done"] and len(packs) == 1
    # a second sandbox done within the period: no second pack yet
    r.hint("sb1", Phase.LLM_WAIT)
    clock.advance(1.0)
    r.sched.tick()
    assert r.sched.snapshot()["sb1"]["done"] and len(packs) == 1
    # a run that sent nothing out packs nothing, even after the period
    clock.advance(20.0)
    r.hint("sb0", Phase.TOOL)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    assert len(packs) == 1
    # pages out again after the period: packed
    r.cgs["sb1"].set_memory(32 * MiB)
    r.hint("sb1", Phase.TOOL)
    r.hint("sb1", Phase.LLM_WAIT)
    clock.advance(0.1)
    r.sched.tick()
    assert len(packs) == 2
    assert r.sched.pack_stats() == {"runs": 2, "seconds": 0.0, "errors": 0, "skipped": 0}


def test_packing_off_by_default_and_its_failures_counted(tmp_path: Path, clock: FakeClock) -> None:
    r = Rig(tmp_path, clock, memory=32 * MiB, grace=0.0, cpu_budget=1.0)
    called: list[int] = []
    r.sched.packer = lambda: called.append(1)
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()
    assert r.sched.snapshot()["sb0"]["done"] and called == []

    r2 = Rig(tmp_path / "b", clock, memory=32 * MiB, grace=0.0, cpu_budget=1.0, pack_every=1.0)

    def fail() -> None:
        raise OSError(22, "Invalid argument")

    r2.sched.packer = fail
    r2.hint("sb0", Phase.LLM_WAIT)
    (act,) = r2.sched.tick().actions
    r2.sched.wait_pack(5.0)  # in its own thread
    assert act.result == "floor"  # compression is not disturbed (everything went)
    assert r2.sched.pack_stats()["errors"] == 1


def test_pack_every_must_not_be_negative() -> None:
    with pytest.raises(errors.InvalidValue):
        SchedulerConfig(pack_every=-1.0).validate()


def test_a_pack_runs_beside_the_scheduler_and_one_at_a_time(
    tmp_path: Path, clock: FakeClock
) -> None:
    import threading

    r = Rig(tmp_path, clock, n=2, memory=32 * MiB, grace=0.0, cpu_budget=1.0, pack_every=1.0)
    entered, release = threading.Event(), threading.Event()

    def slow() -> None:
        entered.set()
        release.wait(5.0)

    r.sched.packer = slow
    r.hint("sb0", Phase.LLM_WAIT)
    r.sched.tick()  # returns while the pack is still running
    assert entered.wait(5.0)
    r.hint("sb1", Phase.LLM_WAIT)
    clock.advance(2.0)
    r.sched.tick()
    assert r.sched.snapshot()["sb1"]["done"]
    release.set()
    r.sched.wait_pack(5.0)
    assert r.sched.pack_stats()["runs"] == 1 and r.sched.pack_stats()["skipped"] == 1
