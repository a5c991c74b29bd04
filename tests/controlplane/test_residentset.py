"""The tracer-free prefetcher: working sets recorded from residency, brought back when swapped."""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from controlplane.pagemap import PAGE_SIZE, PM_FILE, PM_PRESENT, PM_SWAP, private_writable
from controlplane.registry import Sandbox
from controlplane.residentset import ResidentSetConfig, ResidentSetPrefetcher, resident_anon
from tests.fakes import FakeClock, make_process, write_pagemap

HEAP = 0x55D0C0000000
LIB = 0x7F0000000000
MAPS = (
    f"{HEAP:x}-{HEAP + 16 * PAGE_SIZE:x} rw-p 00000000 00:00 0 [heap]\n"
    f"{LIB:x}-{LIB + 4 * PAGE_SIZE:x} r-xp 00000000 08:01 42 /usr/lib/libc.so.6\n"
    f"{LIB + 4 * PAGE_SIZE:x}-{LIB + 6 * PAGE_SIZE:x} rw-p 00004000 08:01 42 /usr/lib/libc.so.6\n"
    f"{LIB + 6 * PAGE_SIZE:x}-{LIB + 8 * PAGE_SIZE:x} rw-s 00000000 00:01 7 /dev/shm/x\n"
    "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]\n"
)


def heap(k: int) -> int:
    return HEAP + k * PAGE_SIZE


class World:
    """A fake cgroup tree and /proc: sandbox /sb with pid 10 (and 11 in /sb/inner), pid 99
    elsewhere; each with MAPS."""

    def __init__(self, tmp: Path) -> None:
        self.root, self.proc = tmp / "cg", tmp / "proc"
        (self.root / "sb" / "inner").mkdir(parents=True)
        (self.root / "other").mkdir()
        (self.root / "sb" / "cgroup.procs").write_text("10\n")
        (self.root / "sb" / "inner" / "cgroup.procs").write_text("11\n")
        (self.root / "other" / "cgroup.procs").write_text("99\n")
        for pid, cg in ((10, "/sb"), (11, "/sb/inner"), (99, "/other")):
            make_process(self.proc, pid, cg)
            (self.proc / str(pid) / "maps").write_text(MAPS)
        self.touched: list[tuple[int, list[int]]] = []
        self.sb = Sandbox("sb", 1, 1, "/sb")

    def touch(self, pid: int, addrs: Sequence[int]) -> int:
        self.touched.append((pid, list(addrs)))
        return len(addrs)

    def prefetcher(self, **kw: object) -> ResidentSetPrefetcher:
        base: dict[str, object] = dict(cgroup_root=self.root, proc_root=self.proc,
                                       touch=self.touch)
        base.update(kw)
        return ResidentSetPrefetcher(**base)  # type: ignore[arg-type]


def test_private_writable_mappings_only() -> None:
    assert list(private_writable(MAPS)) == [
        (HEAP, HEAP + 16 * PAGE_SIZE), (LIB + 4 * PAGE_SIZE, LIB + 6 * PAGE_SIZE)]


def test_learn_records_the_present_anonymous_pages_of_the_sandboxs_processes(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    resident = PM_PRESENT | 0x1234  # a PFN
    write_pagemap(w.proc / "10", {
        heap(0): resident, heap(1): resident, heap(5): resident,
        heap(2): PM_SWAP | 0x5,  # compressed already: not resident
        LIB + 4 * PAGE_SIZE: PM_PRESENT | PM_FILE,  # a library's data page never written
        LIB + 5 * PAGE_SIZE: resident,  # written: anonymous
        LIB + 6 * PAGE_SIZE: PM_PRESENT,  # a shared mapping: not private
    })
    write_pagemap(w.proc / "11", {heap(3): resident})
    write_pagemap(w.proc / "99", {heap(0): resident})  # not the sandbox's
    p = w.prefetcher()
    assert p.learn(w.sb) == 5
    assert p.learned_pages("sb") == 5
    assert p.restore(w.sb)["prefetched_pages"] == 0  # all still resident
    assert w.touched == []


def test_restore_brings_back_what_was_learned_and_is_swapped_now(tmp_path: Path) -> None:
    w = World(tmp_path)
    p = w.prefetcher()
    assert p.restore(w.sb) == {"prefetched_pages": 0, "reason": "nothing learned yet"}
    write_pagemap(w.proc / "10", {heap(k): PM_PRESENT for k in (0, 1, 2, 7)})
    write_pagemap(w.proc / "11", {heap(4): PM_PRESENT})
    assert p.learn(w.sb) == 5
    # the wait compressed everything; page 8 was never learned (not the working set)
    write_pagemap(w.proc / "10", {heap(k): PM_SWAP for k in (0, 1, 2, 7, 8)})
    write_pagemap(w.proc / "11", {heap(4): PM_SWAP})
    res = p.restore(w.sb)
    assert res["prefetched_pages"] == 5 and res["method"] == "populate"
    assert sorted(w.touched) == [(10, [heap(0), heap(1), heap(2), heap(7)]), (11, [heap(4)])]
    # the accessed bits are cleared: what came back and is not used goes first next time
    assert (w.proc / "10" / "clear_refs").read_text() == "1"
    assert (w.proc / "99" / "clear_refs").read_text() == ""


def test_restore_skips_a_process_that_left_the_sandbox(tmp_path: Path) -> None:
    w = World(tmp_path)
    p = w.prefetcher()
    write_pagemap(w.proc / "10", {heap(0): PM_PRESENT})
    write_pagemap(w.proc / "11", {heap(1): PM_PRESENT})
    p.learn(w.sb)
    write_pagemap(w.proc / "10", {heap(0): PM_SWAP})
    write_pagemap(w.proc / "11", {heap(1): PM_SWAP})
    (w.root / "sb" / "inner" / "cgroup.procs").write_text("")  # 11 exited (or its pid reused)
    assert p.restore(w.sb)["prefetched_pages"] == 1 and w.touched == [(10, [heap(0)])]


def test_restore_within_its_byte_budget(tmp_path: Path) -> None:
    w = World(tmp_path)
    p = w.prefetcher(config=ResidentSetConfig(max_bytes=2 * PAGE_SIZE))
    write_pagemap(w.proc / "10", {heap(k): PM_PRESENT for k in range(4)})
    p.learn(w.sb)
    write_pagemap(w.proc / "10", {heap(k): PM_SWAP for k in range(4)})
    res = p.restore(w.sb)
    assert res["prefetched_pages"] == 2 and w.touched == [(10, [heap(0), heap(1)])]


def test_without_ptrace_access_it_advises_instead(tmp_path: Path) -> None:
    w = World(tmp_path)
    advised: list[list[tuple[int, int]]] = []

    def refused(pid: int, addrs: Sequence[int]) -> int:
        raise OSError(errno.EPERM, "no ptrace")

    def madvise(fd: int, ranges: Sequence[tuple[int, int]]) -> int:
        advised.append(list(ranges))
        return sum(n for _, n in ranges)

    p = w.prefetcher(touch=refused, madvise=madvise, open_pidfd=lambda pid: -1)
    write_pagemap(w.proc / "10", {heap(k): PM_PRESENT for k in (0, 1, 3)})
    p.learn(w.sb)
    write_pagemap(w.proc / "10", {heap(k): PM_SWAP for k in (0, 1, 3)})
    res = p.restore(w.sb)
    assert res["method"] == "willneed" and res["prefetched_pages"] == 3
    assert advised == [[(heap(0), 2 * PAGE_SIZE), (heap(3), PAGE_SIZE)]]


def test_forget(tmp_path: Path) -> None:
    w = World(tmp_path)
    p = w.prefetcher()
    write_pagemap(w.proc / "10", {heap(0): PM_PRESENT})
    p.learn(w.sb)
    p.forget("sb")
    assert p.learned_pages("sb") == 0


def test_resident_anon_reads_this_process_s_own_pagemap() -> None:
    """The real kernel's pagemap: of a fresh anonymous mapping, the touched pages only."""
    m = mmap.mmap(-1, 16 * PAGE_SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        for k in (0, 3, 4, 9):
            m[k * PAGE_SIZE] = 1
        import ctypes

        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        rec = resident_anon(os.getpid())
        if rec is None:
            pytest.skip("/proc/self/pagemap cannot be read here")
        pages = set(rec.pages)
        mine = sorted((a - base) // PAGE_SIZE for a in pages if base <= a < base + len(m))
        assert mine == [0, 3, 4, 9]
    finally:
        import gc

        gc.collect()
        m.close()


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        ResidentSetConfig(max_pages=0).validate()


def test_a_reused_pid_is_not_restored(tmp_path: Path) -> None:
    w = World(tmp_path)
    p = w.prefetcher()
    write_pagemap(w.proc / "10", {heap(0): PM_PRESENT})
    p.learn(w.sb)
    write_pagemap(w.proc / "10", {heap(0): PM_SWAP})
    make_process(w.proc, 10, "/sb", start_time=555)  # 10 exited; a new process got its pid
    assert p.restore(w.sb)["prefetched_pages"] == 0 and w.touched == []


def test_the_root_cgroup_is_no_working_set(tmp_path: Path) -> None:
    w = World(tmp_path)
    (w.root / "cgroup.procs").write_text("10\n")
    write_pagemap(w.proc / "10", {heap(0): PM_PRESENT})
    p = w.prefetcher()
    root = Sandbox("host", 1, 1, "/")
    assert p.learn(root) == 0
    assert p.restore(root)["prefetched_pages"] == 0


def test_learning_stops_at_max_pages(tmp_path: Path) -> None:
    w = World(tmp_path)
    write_pagemap(w.proc / "10", {heap(k): PM_PRESENT for k in range(6)})
    write_pagemap(w.proc / "11", {heap(k): PM_PRESENT for k in range(6)})
    p = w.prefetcher(config=ResidentSetConfig(max_pages=4))
    assert p.learn(w.sb) == 4


def test_restore_stops_at_its_time_budget(tmp_path: Path) -> None:
    w = World(tmp_path)
    clock = FakeClock()

    def slow_touch(pid: int, addrs: Sequence[int]) -> int:
        clock.advance(3.0)
        return w.touch(pid, addrs)

    p = w.prefetcher(clock=clock, touch=slow_touch,
                     config=ResidentSetConfig(max_seconds=5.0))
    # 3 x 1024 pages: three calls of IOV_MAX pages, the budget spent after two
    (w.proc / "10" / "maps").write_text(f"{HEAP:x}-{heap(3 * 1024):x} rw-p 00000000 00:00 0\n")
    write_pagemap(w.proc / "10", {heap(k): PM_PRESENT for k in range(3 * 1024)})
    p.learn(w.sb)
    write_pagemap(w.proc / "10", {heap(k): PM_SWAP for k in range(3 * 1024)})
    res = p.restore(w.sb)
    assert res["stopped"] == "budget-time" and res["prefetched_pages"] == 2 * 1024


def test_a_learn_racing_an_unregister_keeps_nothing(tmp_path: Path, monkeypatch:
                                                    pytest.MonkeyPatch) -> None:
    from controlplane.cgroup import Cgroup

    w = World(tmp_path)
    write_pagemap(w.proc / "10", {heap(0): PM_PRESENT})
    p = w.prefetcher()
    real = Cgroup.subtree_procs

    def unregistered_meanwhile(self: Cgroup) -> list[int]:
        p.forget("sb")
        return real(self)

    monkeypatch.setattr(Cgroup, "subtree_procs", unregistered_meanwhile)
    assert p.learn(w.sb) == 1
    assert p.learned_pages("sb") == 0
