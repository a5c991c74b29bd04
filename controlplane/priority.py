"""Thread priorities: the control plane's background work yields to the sandboxes' tools.

A Python thread at a low priority must not hold anything the daemon's other threads wait for:
the GIL, or a lock.  On a host short of CPU such a thread, once preempted, gets the CPU back
only after the busy threads' turns (a nice-19 thread among three busy nice-0 threads per CPU
runs about 0.5% of the time), and until then every thread that waits for what it holds waits
too: a phase hint, answered by the socket thread, would wait for learning or compression
bookkeeping.  So background work is lowered only around the calls that release the GIL and
take no lock of ours (a memory.reclaim write, which compresses in the kernel in the calling
thread; a BPF compile in libbcc), with :func:`lowered_priority`; Python work between those
calls runs at the daemon's own priority, bounded by a CPU budget where it is heavy.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Iterator

log = logging.getLogger("azswap.priority")


PR_SET_NAME = 15
TASK_COMM_LEN = 16


def name_this_thread(name: str | None = None) -> None:
    """Give the calling thread its name in the kernel too (its ``comm``, at most 15 bytes;
    default: its Python name), so that top -H, /proc/PID/task/*/stat and the benchmarks can
    tell the daemon's threads and their CPU time apart.  Best effort."""
    raw = (name or threading.current_thread().name).encode(errors="replace")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(raw[:TASK_COMM_LEN - 1]), 0, 0, 0)
    except (OSError, AttributeError) as e:
        log.debug("cannot name this thread: %s", e)


def lower_thread_priority(nice: int) -> int | None:
    """Raise the calling thread's nice by ``nice`` (Linux: nice is per thread).  Best effort:
    returns the nice it had, or None when it was left alone (``nice`` <= 0, or not allowed)."""
    if nice <= 0:
        return None
    tid = threading.get_native_id()
    try:
        before = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, before + nice))
    except OSError as e:
        log.info("cannot lower this thread's priority: %s", e)
        return None
    return before


@contextlib.contextmanager
def lowered_priority(nice: int) -> Iterator[None]:
    """Run the block with the calling thread's nice raised by ``nice``, then put it back.

    For a block that releases the GIL and takes no lock of ours (see the module's doc).  Putting
    the nice back down needs CAP_SYS_NICE (the daemon runs as root); without it the thread stays
    lowered, which is logged once per call and is never worse than lowering it for good."""
    before = lower_thread_priority(nice)
    try:
        yield
    finally:
        if before is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), before)
            except OSError as e:
                log.info("cannot restore this thread's priority (%d): %s", before, e)
