"""A process's pages as /proc/PID/maps and /proc/PID/pagemap show them (no privilege needed
for the flags read here; Documentation/admin-guide/mm/pagemap.rst).

Each pagemap entry is 64 bits per virtual page: bit 63 present in RAM, 62 a swap entry, 61 a
file page or a shared anonymous one.  Entries are read a run at a time (one pread of up to
``SCAN_ENTRIES`` entries), never one syscall per page.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

PAGE_SIZE = 4096
PM_PRESENT = 1 << 63
PM_SWAP = 1 << 62
PM_FILE = 1 << 61
SCAN_ENTRIES = 1 << 16  # entries read per pread (512 KiB)
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


def runs(pages: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending page addresses as (start, pages) runs of adjacent pages."""
    out: list[tuple[int, int]] = []
    for a in sorted(pages):
        if out and out[-1][0] + out[-1][1] * PAGE_SIZE == a:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        elif not out or a >= out[-1][0] + out[-1][1] * PAGE_SIZE:
            out.append((a, 1))
    return out


def scan(fd: int, start: int, end: int, want: int, reject: int, limit: int) -> list[int]:
    """The page addresses in [start, end) whose entry in the open pagemap ``fd`` has every bit
    of ``want`` and none of ``reject``; at most ``limit``.  OSError if the process is gone."""
    out: list[int] = []
    page, last = start // PAGE_SIZE, end // PAGE_SIZE
    while page < last and len(out) < limit:
        n = min(SCAN_ENTRIES, last - page)
        raw = os.pread(fd, 8 * n, 8 * page)
        got = len(raw) // 8
        if got == 0:
            break
        for i, e in enumerate(struct.unpack(f"<{got}Q", raw[:8 * got])):
            if e & want == want and not e & reject:
                out.append((page + i) * PAGE_SIZE)
                if len(out) >= limit:
                    break
        page += got
    return out


def swapped(pid: int, pages: Sequence[int], proc: Path = PROC_ROOT) -> list[int]:
    """Those of ``pages`` whose entry is a swap entry now, ascending; empty when the process is
    gone."""
    try:
        fd = os.open(proc / str(pid) / "pagemap", os.O_RDONLY)
    except OSError:
        return []
    out: list[int] = []
    try:
        for start, n in runs(pages):
            out += scan(fd, start, start + n * PAGE_SIZE, PM_SWAP, 0, n)
    except OSError:
        return []
    finally:
        os.close(fd)
    return out
