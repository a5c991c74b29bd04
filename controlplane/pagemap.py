"""A process's pages as /proc/PID/maps and /proc/PID/pagemap show them (no privilege needed
for the flags read here; Documentation/admin-guide/mm/pagemap.rst).

Each pagemap entry is 64 bits per virtual page: bit 63 present in RAM, 62 a swap entry, 61 a
file page or a shared anonymous one.  Entries are read a span at a time (one pread of up to
``SCAN_ENTRIES`` entries; scattered pages share a read across gaps of up to ``SPAN_GAP``
entries), never one syscall per page.
"""

from __future__ import annotations

import contextlib
import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ebpf.events import PAGE_SIZE

Page = tuple[int, int]  # (pid, page-aligned virtual address)

PM_PRESENT = 1 << 63
PM_SWAP = 1 << 62
PM_FILE = 1 << 61
SCAN_ENTRIES = 1 << 16  # entries read per pread (512 KiB)
SPAN_GAP = 512  # entries_of(): pages at most this many pages apart share a read
PROC_ROOT = Path("/proc")


def private_writable(maps_text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of the private writable mappings in a /proc/PID/maps text (the kernel's
    vvar/vdso/vsyscall pages left out)."""
    for line in maps_text.splitlines():
        f = line.split(maxsplit=5)
        if len(f) < 5 or len(f[1]) < 4 or f[1][1] != "w" or f[1][3] != "p":
            continue
        if len(f) == 6 and f[5].strip() in ("[vvar]", "[vsyscall]", "[vdso]"):
            continue
        lo, _, hi = f[0].partition("-")
        with contextlib.suppress(ValueError):
            yield int(lo, 16), int(hi, 16)


@dataclass(frozen=True)
class Range:
    pid: int
    start: int
    length: int  # bytes

    @property
    def pages(self) -> int:
        return self.length // PAGE_SIZE


def coalesce(pages: Sequence[Page], max_gap: int = 0) -> list[Range]:
    """Adjacent pages of one process merged into ranges (gaps of up to ``max_gap`` pages
    bridged), the ranges ordered by their earliest page in ``pages``."""
    rank: dict[Page, int] = {}
    for i, pg in enumerate(pages):
        rank.setdefault(pg, i)
    out: list[tuple[int, Range]] = []
    cur: list[int] | None = None  # pid, start, end, first rank
    for pid, addr in sorted(rank):
        r = rank[(pid, addr)]
        if cur and cur[0] == pid and addr <= cur[2] + max_gap * PAGE_SIZE:
            cur[2] = addr + PAGE_SIZE
            cur[3] = min(cur[3], r)
            continue
        if cur:
            out.append((cur[3], Range(cur[0], cur[1], cur[2] - cur[1])))
        cur = [pid, addr, addr + PAGE_SIZE, r]
    if cur:
        out.append((cur[3], Range(cur[0], cur[1], cur[2] - cur[1])))
    out.sort(key=lambda t: t[0])
    return [rg for _, rg in out]


def scan(fd: int, start: int, end: int, want: int, reject: int, limit: int) -> list[int]:
    """The page addresses in [start, end) whose entry in the open pagemap ``fd`` has every bit
    of ``want`` and none of ``reject``; at most ``limit``.  OSError if the process is gone."""
    out: list[int] = []
    if want & reject:
        return out  # no entry has a bit and lacks it
    mask = want | reject
    page, last = start // PAGE_SIZE, end // PAGE_SIZE
    while page < last and len(out) < limit:
        n = min(SCAN_ENTRIES, last - page)
        got = _entries(os.pread(fd, 8 * n, 8 * page))
        if not got:
            break
        out += [(page + i) * PAGE_SIZE for i, e in enumerate(got) if e & mask == want]
        page += len(got)
    return out[:limit]


def _entries(raw: bytes) -> array[int]:
    """The whole 64-bit entries of a pagemap read (the host's byte order, as the kernel's)."""
    a = array("Q")
    a.frombytes(raw[:len(raw) - len(raw) % 8])
    return a


def entries_of(fd: int, pages: Sequence[int]) -> list[int]:
    """The entries of the open pagemap ``fd`` for the ascending page addresses ``pages``, in
    their order (0 for a page past the end of what the file returns).  Nearby pages are read
    together: one pread spans up to SCAN_ENTRIES entries and bridges gaps of up to SPAN_GAP
    entries, so a scattered working set costs a few reads, not one a run.  A process that
    exited after ``fd`` was opened reads as nothing: every entry 0.  ValueError if ``pages``
    is not ascending."""
    out: list[int] = []
    i, n = 0, len(pages)
    while i < n:
        first = pages[i] // PAGE_SIZE
        j, prev = i + 1, first
        while j < n:
            pg = pages[j] // PAGE_SIZE
            if pg < prev:
                raise ValueError("entries_of: pages must be ascending")
            if pg - first >= SCAN_ENTRIES or pg - prev > SPAN_GAP:
                break
            prev = pg
            j += 1
        got = _entries(os.pread(fd, 8 * (prev + 1 - first), 8 * first))
        if len(got) <= prev - first:  # the file ended before the last page
            got.extend([0] * (prev + 1 - first - len(got)))
        out += [got[a // PAGE_SIZE - first] for a in pages[i:j]]
        i = j
    return out


def swapped(pid: int, pages: Sequence[int], proc: Path = PROC_ROOT) -> list[int]:
    """Those of ``pages`` whose entry is a swap entry now, ascending; empty when the process is
    gone."""
    try:
        fd = os.open(proc / str(pid) / "pagemap", os.O_RDONLY)
    except OSError:
        return []
    want = sorted(set(pages))
    try:
        got = entries_of(fd, want)
    except OSError:
        return []
    finally:
        os.close(fd)
    return [a for a, e in zip(want, got, strict=True) if e & PM_SWAP]
