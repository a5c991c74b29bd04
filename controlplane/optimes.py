"""How long the daemon takes to serve each kind of request: count, mean and maximum.

A phase hint is on the orchestrator's critical path (a tool waits for its answer), so the
daemon keeps, per request kind (and for named steps inside one, such as the module's copy of a
phase hint), how many it served and how long that took on its own clock: `azctl stats --json`
shows them under ``ops``.  The time a request spent before it was read (socket, thread
scheduling) is not in it; the client's own round-trip time minus this is that part.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class _Times:
    n: int = 0
    total: float = 0.0
    max: float = 0.0


class OpTimes:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._t: dict[str, _Times] = {}

    def add(self, what: str, seconds: float) -> None:
        with self._lock:
            t = self._t.setdefault(what, _Times())
            t.n += 1
            t.total += seconds
            t.max = max(t.max, seconds)

    @contextmanager
    def timed(self, what: str) -> Iterator[None]:
        t0 = self.clock()
        try:
            yield
        finally:
            self.add(what, self.clock() - t0)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """{what: {"n", "mean_ms", "max_ms"}}."""
        with self._lock:
            return {
                k: {"n": t.n, "mean_ms": round(1000 * t.total / t.n, 3),
                    "max_ms": round(1000 * t.max, 3)}
                for k, t in sorted(self._t.items())
            }
