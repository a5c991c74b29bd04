from __future__ import annotations

import threading

from controlplane import errors
from controlplane.abi import Phase
from controlplane.modulephase import PhaseForwarder


def test_latest_phase_per_sandbox_oldest_first_and_forget() -> None:
    gate, in_flight = threading.Event(), threading.Event()
    sent: list[tuple[int, Phase]] = []

    def apply(cid: int, ph: Phase) -> None:
        in_flight.set()
        gate.wait(5.0)
        sent.append((cid, ph))

    f = PhaseForwarder(apply, lambda *_: None)
    f.start()
    f.submit(1, Phase.LLM_WAIT)  # taken at once, blocks in apply
    assert in_flight.wait(5.0)
    f.submit(2, Phase.TOOL)
    f.submit(3, Phase.TOOL)
    f.submit(2, Phase.IDLE)  # supersedes 2's TOOL, and 2 moves behind 3
    f.submit(3, Phase.LLM_WAIT)
    f.forget(3)  # 3 goes before its phase was sent
    f.submit(4, Phase.TOOL)
    gate.set()
    assert f.flush(5.0)
    assert sent == [(1, Phase.LLM_WAIT), (2, Phase.IDLE), (4, Phase.TOOL)]
    f.stop()


def test_failures_are_reported_and_later_phases_still_go_out() -> None:
    failed: list[tuple[int, Phase, str]] = []
    sent: list[int] = []

    def apply(cid: int, ph: Phase) -> None:
        if cid == 1:
            raise errors.UnknownSandbox("gone")
        if cid == 2:
            raise RuntimeError("a bug")
        sent.append(cid)

    f = PhaseForwarder(apply, lambda cid, ph, e: failed.append((cid, ph, str(e))))
    f.start()
    for cid in (1, 2, 3):
        f.submit(cid, Phase.TOOL)
    assert f.flush(5.0)
    assert failed == [(1, Phase.TOOL, "gone")] and sent == [3]
    f.stop()


def test_stop_sends_what_is_pending() -> None:
    sent: list[int] = []
    f = PhaseForwarder(lambda cid, ph: sent.append(cid), lambda *_: None)
    f.submit(7, Phase.IDLE)  # before the thread runs
    f.start()
    f.stop()
    assert sent == [7]
