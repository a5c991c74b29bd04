"""The Prefetcher with fake system calls: phases, learning from events, batching in predicted
order, byte and time budgets, the faulting-past stop, resident pages skipped, accuracy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controlplane.prefetch import PrefetchConfig, Prefetcher
from ebpf.events import EV_MAJOR, EV_MINOR, FaultEvent

P = 4096
B = 0x7F0000000000
PID = 321
CG = 77


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Kernel:
    """Fake process_madvise + pidfd + cgroup.procs + pagemap."""

    def __init__(self, clock: Clock, cost: float = 0.0) -> None:
        self.clock, self.cost = clock, cost
        self.advised: list[int] = []  # page addresses, in call order
        self.calls = 0
        self.resident: set[int] = set()
        self.procs = [PID]
        self.populated: list[int] = []

    def madvise(self, fd: int, ranges: Sequence[tuple[int, int]]) -> int:
        assert fd == 1000 + PID
        self.calls += 1
        self.clock.t += self.cost
        n = 0
        for start, length in ranges:
            self.advised += list(range(start, start + length, P))
            n += length
        return n

    def swapped(self, pid: int, addrs: Sequence[int]) -> set[int]:
        return {a for a in addrs if a not in self.resident}

    def touch(self, pid: int, addrs: Sequence[int]) -> int:
        """Fake process_vm_readv of one byte per page: the pages become resident (mapped)."""
        assert pid == PID
        self.calls += 1
        self.populated += list(addrs)
        self.resident.update(addrs)
        return len(addrs)


def make(
    cfg: PrefetchConfig | None = None, cost: float = 0.0, method: str = "willneed"
) -> tuple[Prefetcher, Kernel]:
    clock = Clock()
    k = Kernel(clock, cost)
    cfg = cfg or PrefetchConfig(history=3)
    cfg.method = method
    p = Prefetcher(cfg, clock=clock, madvise=k.madvise,
                   open_pidfd=lambda pid: 1000 + pid, procs=lambda cg: list(k.procs),
                   swapped=k.swapped, touch=k.touch)
    p.add_sandbox("sb", "/sys/fs/cgroup/sb", cgroup_id=CG)
    return p, k


def faults(p: Prefetcher, idx: Sequence[int], kind: int = EV_MAJOR, since: int = 1000) -> None:
    seq = p.sandboxes["sb"].seq
    p.feed(FaultEvent(i, CG, B + i * P, i, since, PID, PID, seq, kind, 0) for i in idx)


def cycle(p: Prefetcher, idx: Sequence[int], prefetch: bool = False) -> dict[str, Any] | None:
    p.record_phase_change("sb", "llm-wait")
    res = p.restore("sb") if prefetch else None
    if not prefetch:
        p.record_phase_change("sb", "tool")
    faults(p, idx)
    return res


def test_nothing_learned_yet_is_not_an_error() -> None:
    p, k = make()
    res = p.restore("sb")
    assert res["restore_set_pages"] == 0 and res["prefetched_pages"] == 0
    assert k.calls == 0


def test_learns_then_prefetches_in_first_touch_order() -> None:
    p, k = make()
    hot = [50, 51, 52, 7, 300, 8, 9]
    cycle(p, hot)
    cycle(p, [*hot, 999])
    res = cycle(p, [], prefetch=True)
    assert res is not None
    assert res["restore_set_pages"] == len(hot) + 1  # 999 has weight 1/2 >= 0.34
    # ranges in predicted order: 50-52, 7-9 (7 ranks before 300), 300, 999
    assert k.advised == [B + i * P for i in (50, 51, 52, 7, 8, 9, 300, 999)]
    assert res["ranges"] == 4 and res["calls"] == 1
    assert res["prefetched_pages"] == 8 and res["stopped"] == ""


def test_window_limits_learning_to_the_first_part_of_the_phase() -> None:
    p, k = make(PrefetchConfig(history=3, window_s=1.0))
    for _ in range(2):
        p.record_phase_change("sb", "llm-wait")
        p.record_phase_change("sb", "tool")
        faults(p, [1, 2], since=int(0.5e9))
        faults(p, [3, 4], since=int(2e9))  # late in the phase: not part of the restore set
    p.record_phase_change("sb", "llm-wait")
    p.restore("sb")
    assert k.advised == [B + P, B + 2 * P]


def test_byte_budget() -> None:
    p, k = make(PrefetchConfig(history=3, max_bytes=5 * P, batch_pages=3))
    cycle(p, range(20))
    cycle(p, range(20))
    res = cycle(p, [], prefetch=True)
    assert res is not None
    assert len(k.advised) == 5 and res["prefetched_bytes"] == 5 * P
    assert res["restore_set_pages"] == 5  # learned set capped by the budget


def test_time_budget() -> None:
    p, k = make(PrefetchConfig(history=3, max_seconds=1.0, batch_pages=4), cost=0.4)
    cycle(p, range(40))
    cycle(p, range(40))
    res = cycle(p, [], prefetch=True)
    assert res is not None
    assert res["stopped"] == "budget-time"
    assert k.calls == 3 and len(k.advised) == 12  # 0.0, 0.4, 0.8 < 1.0; stop at 1.2


def test_stops_when_sandbox_faults_past_the_prediction() -> None:
    p, k = make(PrefetchConfig(history=3, batch_pages=2, stop_after_faults=3,
                               stop_after_fraction=0.0))
    cycle(p, range(10))
    cycle(p, range(10))
    p.record_phase_change("sb", "llm-wait")
    p.record_phase_change("sb", "tool")
    faults(p, [500, 501, 502])  # the tool is already running, outside the restore set
    res = p.restore("sb")
    assert res["stopped"] == "faulting-past" and k.calls == 0


def test_a_drifting_working_set_does_not_stop_the_restore_early() -> None:
    # 3 faults past a 10-page prediction: under half of it, the usual drift of a working set
    p, k = make(PrefetchConfig(history=3, batch_pages=2, stop_after_faults=3,
                               stop_after_fraction=0.5))
    cycle(p, range(10))
    cycle(p, range(10))
    p.record_phase_change("sb", "llm-wait")
    p.record_phase_change("sb", "tool")
    faults(p, [500, 501, 502])
    res = p.restore("sb")
    assert res["stopped"] == "" and len(k.advised) == 10


def test_resident_pages_are_skipped() -> None:
    p, k = make()
    cycle(p, range(6))
    cycle(p, range(6))
    k.resident = {B + 2 * P, B + 3 * P}
    res = cycle(p, [], prefetch=True)
    assert res is not None
    assert res["skipped_resident"] == 2
    assert k.advised == [B + i * P for i in (0, 1, 4, 5)]


def test_dead_processes_pages_are_dropped() -> None:
    p, k = make()
    cycle(p, range(6))
    cycle(p, range(6))
    k.procs = [999]
    res = cycle(p, [], prefetch=True)
    assert res is not None
    assert res["prefetched_pages"] == 0 and k.calls == 0


def test_accuracy_used_unused_read_twice_missed() -> None:
    p, _k = make()
    cycle(p, range(10))
    cycle(p, range(10))
    p.record_phase_change("sb", "llm-wait")
    p.restore("sb")  # prefetches pages 0..9
    faults(p, range(0, 6), kind=EV_MINOR)  # used: faults avoided
    faults(p, [6], kind=EV_MAJOR)  # evicted again before use: read twice
    faults(p, [40, 41], kind=EV_MAJOR)  # not predicted: missed
    p.record_phase_change("sb", "llm-wait")
    faults(p, [7], kind=EV_MINOR)  # a late event of the next phase does not count
    a = p.settle("sb")
    assert a["prefetched"] == 10
    assert a["used"] == a["faults_avoided"] == 6
    assert a["read_twice"] == 1 and a["bytes_read_twice"] == P
    assert a["unused"] == 3
    assert a["missed"] == 2


def test_restore_accepts_a_registry_sandbox() -> None:
    from controlplane.registry import Sandbox

    p, _k = make()
    sb = Sandbox(name="other", cgroup_id=88, group=0, cgroup_path="/sys/fs/cgroup/other")
    res = p.restore(sb)
    assert res["sandbox"] == "other" and p.sandboxes["other"].cgroup_id == 88


def test_events_arriving_after_the_phase_change_still_count() -> None:
    p, _k = make()
    cycle(p, range(4))
    cycle(p, range(4))
    p.record_phase_change("sb", "llm-wait")
    p.restore("sb")
    tool_seq = p.sandboxes["sb"].seq
    p.record_phase_change("sb", "llm-wait")
    # the ring buffer delivers the tool phase's faults late
    p.feed(FaultEvent(0, CG, B + i * P, i, 10, PID, PID, tool_seq, EV_MINOR, 0) for i in range(4))
    a = p.settle("sb")
    assert a["used"] == 4 and a["unused"] == 0


def test_populate_maps_pages_and_keeps_the_restore_set_with_willneed_probes() -> None:
    """populate leaves no fault to learn from: populated pages count as used, and every 4th
    restore is a willneed probe whose minor faults show what the tool really touched."""
    p, k = make(PrefetchConfig(history=3, probe_every=4), method="populate")
    hot = [10, 11, 12, 40]
    cycle(p, hot)
    cycle(p, hot)
    methods = []
    for _ in range(3):
        k.resident.clear()  # compressed again during the wait
        res = cycle(p, [])  # populated pages: the tool takes no fault on them
        assert res is None
        res = p.restore("sb")
        methods.append(res["method"])
        assert res["restore_set_pages"] == 4, res  # no decay although no fault was seen
    assert methods == ["populate", "populate", "populate"]
    assert k.populated[:4] == [B + i * P for i in (10, 11, 12, 40)]
    assert p.accuracy("sb")["populated"] >= 8
    # the 4th restore probes with willneed: the tool's minor faults settle used/unused
    k.resident.clear()
    p.record_phase_change("sb", "llm-wait")
    res = p.restore("sb")
    assert res["method"] == "willneed" and k.advised[-4:] == [B + i * P for i in (10, 11, 12, 40)]
    faults(p, [10, 11, 12], kind=EV_MINOR)
    acc = p.settle("sb")
    assert acc["used"] == 3 and acc["unused"] == 1


def test_populate_skips_a_page_the_kernel_cannot_read() -> None:
    from controlplane.prefetch import Range, populate_ranges

    def touch(pid: int, addrs: Sequence[int]) -> int:
        return addrs.index(B + 2 * P) if B + 2 * P in addrs else len(addrs)

    done, calls, skipped = populate_ranges(PID, [Range(PID, B, 5 * P)], touch)
    assert (done, calls, skipped) == (4 * P, 2, 1)


def test_populate_without_ptrace_access_falls_back_to_willneed() -> None:
    import errno

    p, k = make(method="populate")

    def refuse(pid: int, addrs: Sequence[int]) -> int:
        raise OSError(errno.EPERM, "Operation not permitted")

    p._touch = refuse
    cycle(p, [1, 2, 3])
    cycle(p, [1, 2, 3])
    res = cycle(p, [], prefetch=True)
    assert res is not None and res["method"] == "willneed"
    assert k.advised == [B + i * P for i in (1, 2, 3)] and res["prefetched_pages"] == 3
    res = p.restore("sb")
    assert res["method"] == "willneed"  # remembered


def test_tracer_compiles_lowered_and_the_boot_thread_is_not(monkeypatch: Any) -> None:
    """The BPF compile runs ``compile_nice`` lower (its clang costs tens of CPU seconds under
    TCG); the boot thread's own Python work, and every other thread, keep their priority."""
    import os
    import threading

    from controlplane import prefetch
    from ebpf import tracer as tracer_mod

    seen: dict[str, int] = {}
    started = threading.Event()
    main_tid = threading.get_native_id()
    own = os.getpriority(os.PRIO_PROCESS, main_tid)

    def fake_start(self: Any, compile_nice: int = 0) -> Any:
        seen["compile_nice"] = compile_nice
        seen["boot_nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        started.set()
        raise tracer_mod.TracerError("no BPF in this test")

    monkeypatch.setattr(tracer_mod.FaultTracer, "start", fake_start)
    p = prefetch.make_prefetcher()
    assert started.wait(10)
    for _ in range(200):
        if p.status != "tracer starting":
            break
        threading.Event().wait(0.01)
    assert p.status == "tracer unavailable: no BPF in this test"
    assert seen["compile_nice"] == p.cfg.compile_nice > 0
    assert seen["boot_nice"] == own  # a new thread starts at its creator's nice
    assert os.getpriority(os.PRIO_PROCESS, main_tid) == own


def test_events_are_recorded_a_chunk_per_lock_hold() -> None:
    """A phase hint (record_phase_change) waits for the prefetcher's lock at most one chunk of
    events, however large the batch being fed."""
    held: list[int] = []

    class CountingLock:
        def __enter__(self) -> None:
            held.append(0)

        def __exit__(self, *exc: object) -> None:
            pass

    p = Prefetcher(tracer=None, config=PrefetchConfig(feed_chunk=100))
    p._mu = CountingLock()  # type: ignore[assignment]
    p.feed(FaultEvent(i, CG, B + i * P, i, 10, PID, PID, 1, EV_MAJOR, 0) for i in range(1050))
    assert len(held) == 11
    r = p.records
    assert r.unknown + sum(sb.major + sb.minor for sb in r.by_cgroup.values()) == 1050


def test_polling_rests_to_stay_within_its_cpu_budget() -> None:
    p = Prefetcher(tracer=None, config=PrefetchConfig(poll_s=0.25, poll_cpu_budget=0.1))
    assert p.poll_rest(0.0) == 0.25
    assert p.poll_rest(0.01) == 0.25
    assert abs(p.poll_rest(0.05) - 0.5) < 1e-9  # 50 ms of CPU: 500 ms of rest
