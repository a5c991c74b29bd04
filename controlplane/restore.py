"""The interface between the scheduler and the prefetcher (controlplane/residentset.py, or
controlplane/prefetch.py with the eBPF fault tracer).

Before the announced (or, with ``predict_unannounced``, predicted) end of a wait, or on a tool hint
with ``hint_prefetch``, the daemon calls ``prefetcher.restore(sandbox)`` (in a background thread,
so no hint's reply is delayed) to bring the sandbox's recorded working set back before the tool
touches it; ``azctl prefetch SANDBOX`` calls it by hand. ``restore`` returns a small dict of
figures (pages requested, bytes, seconds...) or None; it must not raise for "nothing recorded yet".

:func:`load_prefetcher` builds ``controlplane.prefetch.make_prefetcher()`` when the daemon runs
with ``--prefetch-from faults``; the default, ``resident``, is controlplane/residentset.py (no
tracer), built by the daemon itself.  With ``--no-prefetch``, or when the prefetcher cannot
start (no BPF, no tracer), the daemon runs with the no-op one, plans no prefetch and says why in
the log and in every restore result.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from controlplane.prefetch import make_prefetcher
from controlplane.registry import Sandbox

log = logging.getLogger("azswap.restore")


@runtime_checkable
class Prefetcher(Protocol):
    def restore(self, sandbox: Sandbox) -> dict[str, Any] | None: ...


# Optional methods the daemon calls when the prefetcher has them:
#   record_phase_change(sandbox: Sandbox, phase: str) -> object   on every non-tool hint
#       (a tool hint calls restore(), which records the tool phase itself)
#   learn(sandbox: Sandbox) -> object   when a wait's compression stopped at the working set
#       (what is resident then is the working set: controlplane/residentset.py)
#   forget(name: str) -> None           when the sandbox is unregistered, or its record would
#       not be used (WaitPlanner.learns)
#   close() -> None                                              on daemon shutdown


def phase_changed(p: Prefetcher, sandbox: Sandbox, phase: str) -> None:
    fn = getattr(p, "record_phase_change", None)
    if fn is not None:
        try:
            fn(sandbox, phase)
        except Exception as e:  # best effort: never in the way of a hint
            log.warning("prefetch: phase %s of %s: %s", phase, sandbox.name, e)


def learn(p: Prefetcher, sandbox: Sandbox) -> None:
    fn = getattr(p, "learn", None)
    if fn is not None:
        try:
            fn(sandbox)
        except Exception as e:  # best effort: never in the way of compression
            log.warning("prefetch: learning %s: %s", sandbox.name, e)


def forget(p: Prefetcher, name: str) -> None:
    fn = getattr(p, "forget", None)
    if fn is not None:
        try:
            fn(name)
        except Exception as e:
            log.warning("prefetch: forget %s: %s", name, e)


def status(p: Prefetcher) -> str:
    """What the prefetcher is doing: "tracing" once it learns from fault events ("tracer
    starting" until its BPF program is attached), or why it does nothing."""
    return str(getattr(p, "status", None) or getattr(p, "reason", None) or "ready")


def close(p: Prefetcher) -> None:
    fn = getattr(p, "close", None)
    if fn is not None:
        try:
            fn()
        except Exception as e:
            log.warning("prefetch: close: %s", e)


class NoopPrefetcher:
    """Does nothing: faults bring pages back on demand."""

    reason = "no prefetcher"

    def restore(self, sandbox: Sandbox) -> dict[str, Any] | None:
        return {"prefetched_pages": 0, "reason": self.reason}


def load_prefetcher(enabled: bool = True) -> Prefetcher:
    """The fault tracer's prefetcher (controlplane/prefetch.py); a NoopPrefetcher saying why
    when it is disabled or fails to start."""
    noop = NoopPrefetcher()
    if not enabled:
        noop.reason = "prefetch disabled"
        return noop
    try:
        p = make_prefetcher()
    except Exception as e:  # the prefetcher is optional: a broken one must not stop the daemon
        noop.reason = f"prefetcher failed to start: {e}"
        log.warning("prefetch: %s", noop.reason)
        return noop
    return p
