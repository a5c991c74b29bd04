"""Thread priorities around background work (controlplane/priority.py)."""

from __future__ import annotations

import os
import threading

from controlplane.priority import lowered_priority


def _in_thread(fn: object) -> None:
    t = threading.Thread(target=fn)  # type: ignore[arg-type]
    t.start()
    t.join()


def test_lowered_priority_covers_the_block_only() -> None:
    """Inside the block the thread runs ``nice`` lower; afterwards at its own nice again (root
    may put it back), or, without that right, it stays lowered, never anything else."""
    seen: list[int] = []

    def body() -> None:
        tid = threading.get_native_id()
        seen.append(os.getpriority(os.PRIO_PROCESS, tid))
        with lowered_priority(5):
            seen.append(os.getpriority(os.PRIO_PROCESS, tid))
        seen.append(os.getpriority(os.PRIO_PROCESS, tid))

    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    _in_thread(body)
    own, inside, after = seen
    assert inside == min(19, own + 5)
    assert after == (own if os.geteuid() == 0 else inside)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main  # only that thread


def test_lowered_priority_restores_after_an_exception() -> None:
    seen: list[int] = []

    def body() -> None:
        tid = threading.get_native_id()
        own = os.getpriority(os.PRIO_PROCESS, tid)
        try:
            with lowered_priority(3):
                raise RuntimeError("inside")
        except RuntimeError:
            pass
        seen.append(os.getpriority(os.PRIO_PROCESS, tid) - own)
        seen.append(min(19, own + 3) - own)

    _in_thread(body)
    moved, lowered = seen
    assert moved == (0 if os.geteuid() == 0 else lowered)


def test_zero_leaves_the_thread_alone() -> None:
    tid = threading.get_native_id()
    own = os.getpriority(os.PRIO_PROCESS, tid)
    with lowered_priority(0):
        assert os.getpriority(os.PRIO_PROCESS, tid) == own
    assert os.getpriority(os.PRIO_PROCESS, tid) == own


def test_a_thread_named_in_the_kernel() -> None:
    from pathlib import Path

    from controlplane.priority import name_this_thread

    seen: list[str] = []

    def body() -> None:
        name_this_thread()
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())
        name_this_thread("a-name-longer-than-fifteen")
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())

    t = threading.Thread(target=body, name="scheduler")
    t.start()
    t.join()
    assert seen == ["scheduler\n", "a-name-longer-t\n"]
