"""Reading /proc/PID/pagemap: a scan of a range and the entries of scattered pages."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane import pagemap
from controlplane.pagemap import (
    PAGE_SIZE,
    PM_FILE,
    PM_PRESENT,
    PM_SWAP,
    SCAN_ENTRIES,
    SPAN_GAP,
    entries_of,
    scan,
    swapped,
)
from tests.fakes import write_pagemap

BASE = 0x7F0000000000


def page(k: int) -> int:
    return BASE + k * PAGE_SIZE


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """Every pread the module makes: (bytes, offset)."""
    seen: list[tuple[int, int]] = []
    real = os.pread

    def counted(fd: int, n: int, off: int) -> bytes:
        seen.append((n, off))
        return real(fd, n, off)

    monkeypatch.setattr(pagemap.os, "pread", counted)
    yield seen


def test_scan_keeps_the_entries_with_every_wanted_bit_and_no_rejected_one(tmp_path: Path) -> None:
    f = tmp_path / "pagemap"
    write_pagemap(tmp_path, {page(0): PM_PRESENT, page(1): PM_PRESENT | PM_FILE, page(2): PM_SWAP,
                      page(5): PM_PRESENT, page(6): 0})
    fd = os.open(f, os.O_RDONLY)
    try:
        assert scan(fd, page(0), page(8), PM_PRESENT, PM_FILE, 10) == [page(0), page(5)]
        assert scan(fd, page(0), page(8), PM_PRESENT, PM_FILE, 1) == [page(0)]
        assert scan(fd, page(0), page(8), PM_SWAP, 0, 10) == [page(2)]
        assert scan(fd, page(0), page(8), PM_PRESENT, PM_PRESENT, 10) == []
    finally:
        os.close(fd)


def test_scattered_pages_nearby_are_read_together(tmp_path: Path,
                                                   reads: list[tuple[int, int]]) -> None:
    f = tmp_path / "pagemap"
    near = [0, 3, 3 + SPAN_GAP, 2 + 2 * SPAN_GAP]  # each within SPAN_GAP of the one before
    far = near[-1] + SPAN_GAP + 1  # one entry too far: a read of its own
    want = {page(k): PM_SWAP | k for k in [*near, far]}
    write_pagemap(tmp_path, {**want, page(1): PM_PRESENT})
    fd = os.open(f, os.O_RDONLY)
    try:
        got = entries_of(fd, sorted(want))
    finally:
        os.close(fd)
    assert got == [want[a] for a in sorted(want)]
    assert len(reads) == 2
    assert reads[0] == (8 * (near[-1] + 1), 8 * (BASE // PAGE_SIZE))
    assert reads[1] == (8, 8 * (BASE // PAGE_SIZE + far))


def test_one_read_spans_at_most_scan_entries(tmp_path: Path,
                                              reads: list[tuple[int, int]]) -> None:
    f = tmp_path / "pagemap"
    ks = list(range(0, SCAN_ENTRIES + SPAN_GAP, SPAN_GAP))  # a page every SPAN_GAP entries
    write_pagemap(tmp_path, {page(k): PM_SWAP for k in ks})
    fd = os.open(f, os.O_RDONLY)
    try:
        got = entries_of(fd, [page(k) for k in ks])
    finally:
        os.close(fd)
    assert got == [PM_SWAP] * len(ks)
    assert len(reads) == 2 and all(n <= 8 * SCAN_ENTRIES for n, _ in reads)


def test_a_page_past_the_end_of_the_file_reads_as_zero(tmp_path: Path) -> None:
    f = tmp_path / "pagemap"
    write_pagemap(tmp_path, {page(0): PM_SWAP})
    fd = os.open(f, os.O_RDONLY)
    try:
        assert entries_of(fd, [page(0), page(1), page(SPAN_GAP * 4)]) == [PM_SWAP, 0, 0]
        assert entries_of(fd, []) == []
    finally:
        os.close(fd)


def test_swapped_gives_the_swapped_pages_ascending_once(tmp_path: Path) -> None:
    pid_dir = tmp_path / "10"
    pid_dir.mkdir()
    write_pagemap(pid_dir, {page(k): PM_SWAP for k in (2, 9, 4000)}
                  | {page(k): PM_PRESENT for k in (3, 8)})
    asked = [page(k) for k in (4000, 9, 3, 2, 9, 8, 7)]
    assert swapped(10, asked, tmp_path) == [page(2), page(9), page(4000)]
    assert swapped(11, asked, tmp_path) == []  # no such process


def test_entries_of_refuses_pages_out_of_order(tmp_path: Path) -> None:
    f = tmp_path / "pagemap"
    write_pagemap(tmp_path, {page(0): PM_SWAP})
    fd = os.open(f, os.O_RDONLY)
    try:
        with pytest.raises(ValueError):
            entries_of(fd, [page(2), page(1), page(10)])
    finally:
        os.close(fd)


def test_scan_goes_on_past_one_read_and_stops_at_its_limit(tmp_path: Path,
                                                            reads: list[tuple[int, int]]) -> None:
    f = tmp_path / "pagemap"
    ks = [1, SCAN_ENTRIES + 5, SCAN_ENTRIES + 9, SCAN_ENTRIES + 20]
    write_pagemap(tmp_path, {page(k): PM_PRESENT for k in ks})
    fd = os.open(f, os.O_RDONLY)
    try:
        assert scan(fd, page(0), page(2 * SCAN_ENTRIES), PM_PRESENT, 0, 3) == [
            page(k) for k in ks[:3]]
    finally:
        os.close(fd)
    assert len(reads) == 2
