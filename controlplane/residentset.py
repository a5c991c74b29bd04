"""Restore-time prefetch without a tracer: a sandbox's working set is what stays resident.

The scheduler compresses a waiting sandbox down to its working set first: the memory its
earlier waits measured a tool to use, the kernel's LRU choosing what stays (the accessed bits
are cleared once a kept wait, so what stays is what the last tools touched). What is resident
at that moment is the working set. :meth:`ResidentSetPrefetcher.learn` (the daemon calls it
then, for a sandbox whose record can be of use: WaitPlanner.learns) records those pages for
every process in the sandbox's cgroup and its subgroups: the pages of its private writable
mappings that /proc/PID/pagemap says are present and anonymous (not a file page). The working
set may then be compressed too. The daemon also records before the wait's first write toward
the working set, and keeps that record when a write went more than 256 KiB below the working
set (the kernel reclaims in batches, and may take more than a small request asks for); it then
holds what the last tool used beyond the working set too.

:meth:`ResidentSetPrefetcher.restore` (before a wait's announced or predicted end) brings back
those of the recorded pages that are swapped out now, mapped in the process
(process_vm_readv(2) of one byte a page: the tool takes no fault for them; MADV_WILLNEED
through a pidfd when ptrace access is refused, each first touch then a minor fault), within
``max_bytes`` and ``max_seconds``.  Then it clears the sandbox's accessed bits, so that a page it
brought back and the tool does not touch is among the first to go at the next wait's level,
and the next record does not hold it.

Against the fault tracer (controlplane/prefetch.py, ebpf/): no BPF program, no cost on any
fault; learning reads 8 bytes of pagemap per page of the sandbox's private writable mappings
once or twice a wait of a sandbox whose record can be of use (it announces its waits' ends,
or the daemon predicts waits or prefetches on tool hints). What it cannot know is the
order in which the tool will touch the pages: they come back in address order.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane import errors
from controlplane.cgroup import CGROUP_ROOT, PROC_ROOT, Cgroup
from controlplane.pagemap import (
    PAGE_SIZE,
    PM_FILE,
    PM_PRESENT,
    private_writable,
    scan,
    swapped,
)
from controlplane.prefetch import (
    IOV_MAX,
    coalesce,
    madvise_ranges,
    pidfd_open,
    populate_pages,
    process_madvise,
    process_vm_touch,
)

log = logging.getLogger("azswap.residentset")


@dataclass
class ResidentSetConfig:
    max_pages: int = 1 << 18  # pages recorded per sandbox (1 GiB; 8 bytes each here)
    max_scan_pages: int = 1 << 22  # pagemap entries read per learn (16 GiB of mappings)
    max_bytes: int = 1 << 30  # bytes brought back per restore
    max_seconds: float = 5.0  # per restore, checked between calls (IOV_MAX pages each)

    def validate(self) -> None:
        if (self.max_pages < 1 or self.max_scan_pages < 1 or self.max_bytes < PAGE_SIZE
                or self.max_seconds <= 0):
            raise ValueError("max_pages, max_scan_pages >= 1, max_bytes >= one page, "
                             "max_seconds > 0")


def start_time(stat_text: str) -> int:
    """A process's start time (clock ticks after boot) from its /proc/PID/stat line: with its
    pid, it names one process for as long as the machine runs."""
    return int(stat_text.rsplit(")", 1)[1].split()[19])


@dataclass
class Recorded:
    """A process's part of a working set: its identity and its pages."""

    start: int  # start_time(): the pid names the same process at restore
    pages: array  # type: ignore[type-arg]  # ascending page addresses ('Q')
    scanned: int = 0  # pagemap entries read to find them


def resident_anon(pid: int, proc: Path = PROC_ROOT, limit: int = 1 << 18,
                  scan_budget: int = 1 << 22) -> Recorded | None:
    """The present anonymous pages of a process's private writable mappings (at most
    ``limit``, reading at most ``scan_budget`` pagemap entries), all read through one handle
    on its /proc directory (one process, even if its pid is reused meanwhile); None when it
    exited."""
    try:
        dfd = os.open(proc / str(pid), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        with open(os.open("stat", os.O_RDONLY, dir_fd=dfd)) as f:
            started = start_time(f.read())
        with open(os.open("maps", os.O_RDONLY, dir_fd=dfd)) as f:
            maps = f.read()
        fd = os.open("pagemap", os.O_RDONLY, dir_fd=dfd)
        out = array("Q")
        scanned = 0
        try:
            for lo, hi in private_writable(maps):
                hi = min(hi, lo + (scan_budget - scanned) * PAGE_SIZE)
                scanned += (hi - lo) // PAGE_SIZE
                out.extend(scan(fd, lo, hi, PM_PRESENT, PM_FILE, limit - len(out)))
                if len(out) >= limit or scanned >= scan_budget:
                    break
        finally:
            os.close(fd)
        return Recorded(started, out, scanned)
    except (OSError, ValueError, IndexError):
        return None  # exited while read
    finally:
        os.close(dfd)


def started_at(pid: int, proc: Path = PROC_ROOT) -> int | None:
    try:
        return start_time((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


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
        self._sets: dict[str, dict[int, Recorded]] = {}
        self._forgets: dict[str, int] = {}  # forget() calls per name: a learn racing one loses
        self._mu = threading.Lock()
        self.status = "resident set"

    def _cgroup(self, sandbox: Any) -> Cgroup | None:
        """The sandbox's cgroup; None without a path, or for the root cgroup (every process on
        the host is no sandbox's working set)."""
        path = getattr(sandbox, "cgroup_path", None)
        if not path:
            return None
        cg = Cgroup(path, self.cgroup_root)
        return None if cg.path == "/" else cg

    def learn(self, sandbox: Any) -> int:
        """Record what is resident of the sandbox now, as its working set; returns the pages."""
        cg = self._cgroup(sandbox)
        if cg is None:
            return 0
        with self._mu:
            forgets = self._forgets.get(sandbox.name, 0)
        left, scan_left = self.cfg.max_pages, self.cfg.max_scan_pages
        found: dict[int, Recorded] = {}
        for pid in cg.subtree_procs():
            if left <= 0 or scan_left <= 0:
                break
            rec = resident_anon(pid, self.proc, left, scan_left)
            if rec is None:
                continue
            scan_left -= rec.scanned
            if len(rec.pages):
                found[pid] = rec
                left -= len(rec.pages)
        n = sum(len(r.pages) for r in found.values())
        if left <= 0 or scan_left <= 0:
            log.info("learning %s: %d pages recorded, the limit (max_pages, max_scan_pages)",
                     sandbox.name, n)
        with self._mu:
            if self._forgets.get(sandbox.name, 0) == forgets:  # not unregistered meanwhile
                self._sets[sandbox.name] = found
        return n

    def restore(self, sandbox: Any) -> dict[str, Any]:
        """Bring back the recorded pages that are swapped out now; never raises for "nothing
        recorded yet"."""
        with self._mu:
            learned = self._sets.get(sandbox.name)
        if not learned:
            return {"prefetched_pages": 0, "reason": "nothing learned yet"}
        cg = self._cgroup(sandbox)
        live = set(cg.subtree_procs()) if cg is not None else set()
        t0 = self.clock()
        res: dict[str, Any] = {
            "restore_set_pages": sum(len(r.pages) for r in learned.values()),
            "prefetched_pages": 0, "prefetched_bytes": 0, "calls": 0, "stopped": ""}
        for pid, rec in learned.items():
            # exited, moved out, or the pid now names another process
            if pid not in live or started_at(pid, self.proc) != rec.start:
                continue
            todo = swapped(pid, rec.pages, self.proc)
            while todo and not res["stopped"]:
                room = (self.cfg.max_bytes - res["prefetched_bytes"]) // PAGE_SIZE
                if room <= 0:
                    res["stopped"] = "budget-bytes"
                elif self.clock() - t0 >= self.cfg.max_seconds:
                    res["stopped"] = "budget-time"
                else:
                    batch, todo = todo[:min(room, IOV_MAX)], todo[min(room, IOV_MAX):]
                    done, calls = self._bring(pid, batch)
                    res["prefetched_bytes"] += done
                    res["calls"] += calls
        res["prefetched_pages"] = res["prefetched_bytes"] // PAGE_SIZE
        res["method"] = "populate" if self._can_populate else "willneed"
        if cg is not None and res["prefetched_pages"]:
            # what came back and is not touched goes first at the next wait's level
            with contextlib.suppress(OSError, errors.AzswapError):
                cg.clear_referenced(self.proc)
        res["seconds"] = round(self.clock() - t0, 4)
        return res

    def _bring(self, pid: int, pages: Sequence[int]) -> tuple[int, int]:
        """Fault the ascending ``pages`` back into ``pid``; returns (bytes, calls)."""
        if not pages:
            return 0, 0
        if self._can_populate:
            try:
                done, calls, _ = populate_pages(pid, pages, self._touch)
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
            done, calls, _ = madvise_ranges(fd, coalesce([(pid, a) for a in pages]),
                                            self._madvise)
            return done, calls
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def forget(self, name: str) -> None:
        with self._mu:
            self._sets.pop(name, None)
            self._forgets[name] = self._forgets.get(name, 0) + 1

    def learned_pages(self, name: str) -> int:
        with self._mu:
            return sum(len(r.pages) for r in self._sets.get(name, {}).values())
