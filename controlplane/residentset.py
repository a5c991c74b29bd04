"""Restore-time prefetch without a tracer: a sandbox's working set is what stays resident.

The scheduler compresses a waiting sandbox down to its working set first: the memory its
earlier waits measured a tool to use, the kernel's LRU choosing what stays (the accessed bits
are cleared once a kept wait, so what stays is what the last tools touched).  What is resident
at that moment is the working set.  :meth:`ResidentSetPrefetcher.learn` (the daemon calls it
then) records those pages for every process in the sandbox's cgroup and its subgroups: the
pages of its private writable mappings that /proc/PID/pagemap says are present and anonymous
(not a file page).  The working set may then be compressed too.

:meth:`ResidentSetPrefetcher.restore` (before a wait's announced or predicted end) brings back
those of the recorded pages that are swapped out now, mapped in the process
(process_vm_readv(2) of one byte a page: the tool takes no fault for them; MADV_WILLNEED
through a pidfd when ptrace access is refused, each first touch then a minor fault), within
``max_bytes`` and ``max_seconds``.  Then it clears the sandbox's accessed bits, so that a page it
brought back and the tool does not touch is among the first to go at the next wait's level,
and the next record does not hold it.

Against the fault tracer (controlplane/prefetch.py, ebpf/): no BPF program, no cost on any
fault; learning reads 8 bytes of pagemap per page of the sandbox's private writable mappings
once a wait.  What it cannot know is the order in which the tool will touch the pages: they
come back in address order.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane import cgroup
from controlplane.cgroup import CGROUP_ROOT, PROC_ROOT, Cgroup
from controlplane.prefetch import (
    PAGE_SIZE,
    PM_PRESENT,
    PM_SWAP,
    Range,
    coalesce,
    madvise_ranges,
    pidfd_open,
    populate_ranges,
    process_madvise,
    process_vm_touch,
)

log = logging.getLogger("azswap.residentset")

PM_FILE = 1 << 61  # a file page or a shared anonymous one
SCAN_ENTRIES = 1 << 16  # pagemap entries read per pread (512 KiB)


@dataclass
class ResidentSetConfig:
    max_pages: int = 1 << 18  # pages recorded per sandbox (1 GiB)
    max_bytes: int = 1 << 30  # bytes brought back per restore
    max_seconds: float = 5.0  # per restore, checked between calls

    def validate(self) -> None:
        if self.max_pages < 1 or self.max_bytes < PAGE_SIZE or self.max_seconds <= 0:
            raise ValueError("max_pages >= 1, max_bytes >= one page, max_seconds > 0")


def private_writable(maps_text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of the private writable mappings in a /proc/PID/maps text."""
    for line in maps_text.splitlines():
        f = line.split(maxsplit=5)
        if len(f) < 5 or len(f[1]) < 4 or f[1][1] != "w" or f[1][3] != "p":
            continue
        if len(f) == 6 and f[5].strip() in ("[vvar]", "[vsyscall]", "[vdso]"):
            continue
        lo, _, hi = f[0].partition("-")
        with contextlib.suppress(ValueError):
            yield int(lo, 16), int(hi, 16)


def pagemap_pages(fd: int, start: int, end: int, want: int, reject: int,
                  limit: int) -> list[int]:
    """The page addresses in [start, end) whose pagemap entry (open file ``fd``) has every bit
    of ``want`` and none of ``reject``; at most ``limit``."""
    out: list[int] = []
    page = start // PAGE_SIZE
    last = end // PAGE_SIZE
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


def resident_anon(pid: int, proc: Path = PROC_ROOT, limit: int = 1 << 18) -> list[int]:
    """The present anonymous pages of a process's private writable mappings (at most
    ``limit``); empty when it exited."""
    try:
        maps = (proc / str(pid) / "maps").read_text()
        fd = os.open(proc / str(pid) / "pagemap", os.O_RDONLY)
    except OSError:
        return []
    out: list[int] = []
    try:
        for lo, hi in private_writable(maps):
            out += pagemap_pages(fd, lo, hi, PM_PRESENT, PM_FILE, limit - len(out))
            if len(out) >= limit:
                break
    except OSError:
        return []  # exited while read
    finally:
        os.close(fd)
    return out


def swapped_now(pid: int, pages: Sequence[int], proc: Path = PROC_ROOT) -> list[int]:
    """Those of ``pages`` (ascending) whose entry is a swap entry now, read a run at a time."""
    try:
        fd = os.open(proc / str(pid) / "pagemap", os.O_RDONLY)
    except OSError:
        return []
    out: list[int] = []
    try:
        for rg in coalesce([(pid, a) for a in pages]):
            out += pagemap_pages(fd, rg.start, rg.start + rg.length, PM_SWAP, 0, rg.pages)
    except OSError:
        return []
    finally:
        os.close(fd)
    return out


def subtree_procs(directory: Path) -> list[int]:
    """The pids of a cgroup and its subgroups."""
    return [pid for d, _, _ in os.walk(directory) for pid in cgroup.procs(d)]


class ResidentSetPrefetcher:
    """The daemon's prefetcher with ``--prefetch-from resident`` (see the module docstring).

    Thread-safe: the scheduler's thread learns, prefetch threads restore, the socket threads
    forget."""

    def __init__(
        self,
        config: ResidentSetConfig | None = None,
        cgroup_root: Path = CGROUP_ROOT,
        proc_root: Path = PROC_ROOT,
        clock: Callable[[], float] = time.monotonic,
        touch: Callable[[int, Sequence[int]], int] = process_vm_touch,
        madvise: Callable[[int, Sequence[tuple[int, int]]], int] = process_madvise,
        open_pidfd: Callable[[int], int] = pidfd_open,
    ) -> None:
        self.cfg = config or ResidentSetConfig()
        self.cfg.validate()
        self.cgroup_root, self.proc = Path(cgroup_root), Path(proc_root)
        self.clock = clock
        self._touch, self._madvise, self._pidfd = touch, madvise, open_pidfd
        self._can_populate = True  # False after EPERM: no ptrace access, willneed from then on
        self._sets: dict[str, dict[int, list[int]]] = {}
        self._last: dict[str, dict[str, Any]] = {}
        self._mu = threading.Lock()
        self.status = "resident set"

    def _cgroup(self, sandbox: Any) -> Cgroup | None:
        path = getattr(sandbox, "cgroup_path", None)
        return Cgroup(path, self.cgroup_root) if path else None

    def learn(self, sandbox: Any) -> int:
        """Record what is resident of the sandbox now, as its working set; returns the pages."""
        cg = self._cgroup(sandbox)
        if cg is None:
            return 0
        left = self.cfg.max_pages
        found: dict[int, list[int]] = {}
        for pid in subtree_procs(cg.dir):
            if left <= 0:
                break
            pages = resident_anon(pid, self.proc, left)
            if pages:
                found[pid] = pages
                left -= len(pages)
        with self._mu:
            self._sets[sandbox.name] = found
        return sum(len(p) for p in found.values())

    def restore(self, sandbox: Any) -> dict[str, Any]:
        """Bring back the recorded pages that are swapped out now; never raises for "nothing
        recorded yet"."""
        with self._mu:
            learned = self._sets.get(sandbox.name)
        if not learned:
            return {"prefetched_pages": 0, "reason": "nothing learned yet"}
        cg = self._cgroup(sandbox)
        live = set(subtree_procs(cg.dir)) if cg is not None else set()
        t0 = self.clock()
        res: dict[str, Any] = {"restore_set_pages": sum(len(p) for p in learned.values()),
                               "prefetched_pages": 0, "prefetched_bytes": 0, "calls": 0,
                               "method": "populate" if self._can_populate else "willneed",
                               "stopped": ""}
        for pid, pages in learned.items():
            if pid not in live:
                continue  # exited, or moved out (a reused pid is not in the cgroup either)
            room = (self.cfg.max_bytes - res["prefetched_bytes"]) // PAGE_SIZE
            if room <= 0:
                res["stopped"] = "budget-bytes"
                break
            if self.clock() - t0 >= self.cfg.max_seconds:
                res["stopped"] = "budget-time"
                break
            ranges = coalesce([(pid, a) for a in swapped_now(pid, pages, self.proc)[:room]])
            done, calls = self._bring(pid, ranges)
            res["prefetched_bytes"] += done
            res["calls"] += calls
        res["prefetched_pages"] = res["prefetched_bytes"] // PAGE_SIZE
        res["method"] = "populate" if self._can_populate else "willneed"
        if cg is not None:
            # what came back and is not touched goes first at the next wait's level
            with contextlib.suppress(OSError, ValueError):
                cg.clear_referenced(self.proc)
        res["seconds"] = round(self.clock() - t0, 4)
        with self._mu:
            self._last[sandbox.name] = res
        return res

    def _bring(self, pid: int, ranges: list[Range]) -> tuple[int, int]:
        """Fault ``ranges`` back into ``pid``; returns (bytes, calls)."""
        if not ranges:
            return 0, 0
        if self._can_populate:
            try:
                done, calls, _ = populate_ranges(pid, ranges, self._touch)
                return done, calls
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EACCES):
                    log.info("prefetch: pid %d: %s", pid, e)  # e.g. ESRCH: it exited
                    return 0, 0
                log.warning("prefetch: process_vm_readv refused (%s): no ptrace access, "
                            "using MADV_WILLNEED from now on", e)
                self._can_populate = False
        try:
            fd = self._pidfd(pid)
        except OSError as e:
            log.info("prefetch: pid %d: %s", pid, e)
            return 0, 0
        try:
            done, calls, _ = madvise_ranges(fd, ranges, self._madvise)
            return done, calls
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def forget(self, name: str) -> None:
        with self._mu:
            self._sets.pop(name, None)
            self._last.pop(name, None)

    def learned_pages(self, name: str) -> int:
        with self._mu:
            return sum(len(p) for p in self._sets.get(name, {}).values())
