"""Range coalescing and the process_madvise call splitting (IOV_MAX, refused ranges)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from collections.abc import Sequence

import pytest

from controlplane.prefetch import (
    IOV_MAX,
    Range,
    coalesce,
    madvise_ranges,
    pidfd_open,
    process_madvise,
    process_vm_touch,
)

P = 4096
B = 0x7F0000000000


def pg(*idx: int, pid: int = 1) -> list[tuple[int, int]]:
    return [(pid, B + i * P) for i in idx]


def test_adjacent_pages_merge_and_keep_predicted_order() -> None:
    order = pg(10, 11, 12, 50, 3, 4)
    assert coalesce(order) == [
        Range(1, B + 10 * P, 3 * P), Range(1, B + 50 * P, P), Range(1, B + 3 * P, 2 * P)]


def test_out_of_order_adjacent_pages_merge_at_earliest_rank() -> None:
    order = pg(7, 100, 6, 8)
    assert coalesce(order) == [Range(1, B + 6 * P, 3 * P), Range(1, B + 100 * P, P)]


def test_duplicates_and_processes() -> None:
    order = pg(1, 2) + pg(3, pid=2) + pg(2, 3)
    assert coalesce(order) == [Range(1, B + P, 3 * P), Range(2, B + 3 * P, P)]


def test_gap_bridging() -> None:
    assert coalesce(pg(1, 3, 4), max_gap=1) == [Range(1, B + P, 4 * P)]
    assert len(coalesce(pg(1, 3, 4), max_gap=0)) == 2


def test_empty() -> None:
    assert coalesce([]) == []


class FakeKernel:
    """process_madvise: advises ranges in order, stops at the first unmapped one."""

    def __init__(self, bad: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.bad = bad
        self.calls: list[int] = []
        self.advised: list[int] = []

    def __call__(self, fd: int, ranges: Sequence[tuple[int, int]]) -> int:
        assert len(ranges) <= IOV_MAX
        self.calls.append(len(ranges))
        done = 0
        for start, length in ranges:
            if start in self.bad:
                if done == 0:
                    raise OSError(errno.ENOMEM, "unmapped")
                return done
            self.advised.append(start)
            done += length
        return done


def test_iov_max_per_call() -> None:
    ranges = [Range(1, B + 2 * i * P, P) for i in range(2500)]
    k = FakeKernel()
    done, calls, skipped = madvise_ranges(3, ranges, k)
    assert k.calls == [1024, 1024, 452]
    assert done == 2500 * P and calls == 3 and skipped == 0


def test_refused_ranges_are_skipped_not_fatal() -> None:
    ranges = [Range(1, B + 2 * i * P, P) for i in range(10)]
    k = FakeKernel(bad={B + 0 * P, B + 10 * P})  # first and sixth
    done, _calls, skipped = madvise_ranges(3, ranges, k)
    assert skipped == 2
    assert done == 8 * P
    assert sorted(k.advised) == [r.start for r in ranges if r.start not in k.bad]


def test_other_errors_propagate() -> None:
    def eperm(fd: int, r: Sequence[tuple[int, int]]) -> int:
        raise OSError(errno.EPERM, "no")

    with pytest.raises(OSError):
        madvise_ranges(3, [Range(1, B, P)], eperm)


def test_the_real_syscalls_on_this_process() -> None:
    """process_vm_readv and process_madvise on this process's own pages: the iovec arrays
    carry every address and length (a read stops at the first page it cannot read)."""
    m = mmap.mmap(-1, 8 * P, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    try:
        assert process_vm_touch(os.getpid(), [base + k * P for k in (0, 3, 7)]) == 3
        assert process_vm_touch(os.getpid(), [base, P, base + P]) == 1  # page 1: never mapped
        try:
            fd = pidfd_open(os.getpid())
        except OSError as e:
            pytest.skip(f"pidfd_open: {e}")
        try:
            assert process_madvise(fd, [(base, 2 * P), (base + 4 * P, 4 * P)]) == 6 * P
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOSYS):
                raise
            pytest.skip(f"process_madvise not allowed here: {e}")
        finally:
            os.close(fd)
    finally:
        m.close()
