"""The trim step: give a sandbox process's free heap memory back before it waits for the LLM.

A long-lived interpreter (a Python REPL, a Jupyter kernel, a tool server) keeps the memory its
last tool call freed: Python's object arenas and glibc's malloc arenas hold it for reuse. Those
pages are still the sandbox's anonymous memory, so compression spends pool bytes on dead data.
Trimming first returns them to the kernel (glibc's ``malloc_trim(0)`` releases every free page
of every arena with MADV_DONTNEED), and what is left is what the sandbox really holds.

A process can only trim itself, so the call belongs inside the sandbox, in the runtime that runs
tool calls, after a tool call and before its result goes back to the model::

    from controlplane.trim import trim
    ...
    result = run_tool(call)
    trim()                      # then reply; the orchestrator sends the llm-wait hint
    return result

This module needs nothing beyond the standard library, so a sandbox image can carry it as one
file. Import it once at start-up (in the template, where sandboxes are forked from one): the
call itself then loads no library and imports nothing. Other runtimes call ``malloc_trim(0)``
(glibc) the same way; docs/daemon-protocol.md, "Trim step", says how a platform wires it. On a
C library without ``malloc_trim`` (musl) the call reports ``malloc_trim`` False and trims
nothing else.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STATUS = Path("/proc/self/status")


@dataclass(frozen=True)
class Trimmed:
    """What one trim() did: the process's anonymous resident memory before and after."""

    anon_before: int
    anon_after: int
    malloc_trim: bool  # the C library had malloc_trim and it was called

    @property
    def released_bytes(self) -> int:
        return max(0, self.anon_before - self.anon_after)


def anon_bytes(status: Path = STATUS) -> int:
    """RssAnon of the process whose status file this is, in bytes."""
    for line in status.read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"{status}: no RssAnon line")


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim from the symbols the process already has (no library search, no
    subprocess), or None on a C library without it."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


# Resolved once, when the module is imported: a runtime that forks sandboxes from a template
# imports it in the template, so that a sandbox's trim() loads nothing (ctypes and libc's
# symbols are already there).
MALLOC_TRIM = _malloc_trim()


def trim() -> Trimmed:
    """Collect Python's garbage, then return every free page of the C heap to the kernel."""
    before = anon_bytes()
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)
    return Trimmed(before, anon_bytes(), MALLOC_TRIM is not None)
