"""Mark a sandbox's private memory cold, so the next memory.reclaim pass takes all of it.

memory.reclaim walks the cgroup's LRU lists.  An anonymous page whose accessed bit is set (the
tool just touched it, or a prefetch mapped it) is *kept* on a first pass: the kernel clears the
bit and rotates the page, and only a later pass reclaims it.  Under a per-pass budget that costs
the first second or so of every LLM wait.  ``process_madvise(MADV_COLD)`` over the processes'
private writable mappings clears the accessed bits and deactivates the pages at once (no I/O, no
compression: that stays in memory.reclaim, metered by the scheduler), so the following pass
reclaims everything.

Measured in the test guest (phasebench --cold, 4 sandboxes, 2 s waits): it did not raise the
memory saved (67% of aggressive's vs 64-65% without) and made tool phases slower (1.58x vs
1.30-1.40x): the processes' own interpreter pages went to swap too.  So it is off by default;
the phase benchmark keeps it as an option (``--cold``) for other workloads.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from controlplane import cgroup as cgroups
from controlplane.prefetch import (
    IOV_MAX,
    Range,
    madvise_ranges,
    pidfd_open,
    process_madvise,
)

log = logging.getLogger("azswap.coldpages")

MADV_COLD = 20


def private_ranges(pid: int, proc: Path = Path("/proc")) -> list[Range]:
    """The writable private mappings of ``pid`` (anonymous memory and CoW file pages)."""
    out = []
    try:
        text = (proc / str(pid) / "maps").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        f = line.split(None, 5)
        if len(f) < 5 or len(f[1]) < 4 or f[1][1] != "w" or f[1][3] != "p":
            continue
        name = f[5].strip() if len(f) > 5 else ""
        if name in ("[vsyscall]", "[vvar]", "[vdso]"):
            continue
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        out.append(Range(pid, lo, hi - lo))
    return out


def mark_cold(
    cgroup: Path,
    procs: Callable[[Path], list[int]] = cgroups.procs,
    ranges: Callable[[int], list[Range]] = private_ranges,
    madvise: Callable[[int, Sequence[tuple[int, int]]], int] | None = None,
    open_pidfd: Callable[[int], int] = pidfd_open,
) -> int:
    """MADV_COLD every private writable mapping of every process in ``cgroup``; bytes advised.
    Processes that exit meanwhile are skipped; EPERM (no CAP_SYS_NICE) is raised."""
    call = madvise or functools.partial(process_madvise, advice=MADV_COLD)
    done = 0
    for pid in procs(cgroup):
        rs = ranges(pid)
        if not rs:
            continue
        try:
            fd = open_pidfd(pid)
        except OSError as e:
            if e.errno == errno.ESRCH:
                continue
            raise
        try:
            for k in range(0, len(rs), IOV_MAX):
                done += madvise_ranges(fd, rs[k : k + IOV_MAX], call)[0]
        except OSError as e:
            if e.errno not in (errno.ESRCH, errno.EINVAL):
                raise
            log.info("mark_cold %s: pid %d: %s", cgroup, pid, e)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
    return done
