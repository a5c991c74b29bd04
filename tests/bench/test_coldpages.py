"""coldpages: which mappings are marked cold, batching, processes that exit, permission errors."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.coldpages import mark_cold, private_ranges
from controlplane.prefetch import IOV_MAX, Range

MAPS = """\
55d0c0000000-55d0c0021000 r--p 00000000 08:01 1234 /usr/bin/python3
55d0c0021000-55d0c0300000 r-xp 00021000 08:01 1234 /usr/bin/python3
55d0c0500000-55d0c0502000 rw-p 00500000 08:01 1234 /usr/bin/python3
55d0c1000000-55d0c1400000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000100000 rw-s 00000000 00:05 99 /dev/shm/x
7f0000200000-7f0000600000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
7ffd000f0000-7ffd000f2000 r-xp 00000000 00:00 0 [vdso]
"""


def test_private_writable_mappings_only(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "maps").write_text(MAPS)
    got = [(r.start, r.length) for r in private_ranges(42, tmp_path)]
    assert got == [
        (0x55D0C0500000, 0x2000),  # CoW data of the binary
        (0x55D0C1000000, 0x400000),  # heap
        (0x7F0000200000, 0x400000),  # anonymous
        (0x7FFD00000000, 0x21000),  # stack
    ]  # not read-only, not executable, not shared
    assert private_ranges(43, tmp_path) == []  # exited


def test_mark_cold_batches_and_skips_exited_processes() -> None:
    calls: list[tuple[int, int]] = []
    fds: dict[int, int] = {}

    def madvise(fd: int, ranges: Sequence[tuple[int, int]]) -> int:
        calls.append((fds[fd], len(ranges)))
        return sum(n for _, n in ranges)

    def pidfd(pid: int) -> int:  # a real fd: mark_cold closes it
        if pid == 2:
            raise OSError(errno.ESRCH, "gone")
        fd = os.open(os.devnull, os.O_RDONLY)
        fds[fd] = pid
        return fd

    many = [Range(1, i * 0x2000, 0x1000) for i in range(IOV_MAX + 5)]
    done = mark_cold(
        Path("/cg"),
        procs=lambda cg: [1, 2, 3],
        ranges=lambda pid: many if pid == 1 else [Range(pid, 0, 0x3000)],
        madvise=madvise,
        open_pidfd=pidfd,
    )
    assert calls == [(1, IOV_MAX), (1, 5), (3, 1)]
    assert done == (IOV_MAX + 5) * 0x1000 + 0x3000


def test_mark_cold_without_permission_says_so() -> None:
    def refuse(fd: int, ranges: Sequence[tuple[int, int]]) -> int:
        raise OSError(errno.EPERM, "Operation not permitted")

    with pytest.raises(PermissionError):
        mark_cold(Path("/cg"), procs=lambda cg: [1], ranges=lambda pid: [Range(1, 0, 4096)],
                  madvise=refuse, open_pidfd=lambda pid: os.open(os.devnull, os.O_RDONLY))
