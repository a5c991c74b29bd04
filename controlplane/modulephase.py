"""The module's copy of each sandbox's phase, set off the phase hint's path.

The module keeps a sandbox's phase for its tracepoints and per-owner stats only; nothing in the
store depends on it.  Setting it is a generic-netlink round trip, and on a host short of CPU
that round trip (a wake-up of the daemon's thread for the reply, serialised with every other
azswap command by genetlink) made up most of the time a phase hint took to answer, while the
orchestrator's tool waited for that answer.  So a hint only records the phase here and returns;
one thread ("module-phase") sets it in the module.  Per sandbox only the latest phase is kept:
a phase superseded before it was sent is never sent, so the module always ends on the last one.
A failure is reported to ``on_error`` (the daemon logs it and publishes a ``module_error``
event); it never reaches the hint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from controlplane import errors
from controlplane.abi import Phase
from controlplane.priority import name_this_thread

log = logging.getLogger("azswap.modulephase")


class PhaseForwarder:
    def __init__(
        self,
        apply: Callable[[int, Phase], None],
        on_error: Callable[[int, Phase, errors.AzswapError], None],
    ) -> None:
        self._apply = apply
        self._on_error = on_error
        self._cv = threading.Condition()
        self._pending: dict[int, Phase] = {}  # cgroup id -> latest phase not yet sent
        self._sending = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="module-phase", daemon=True)
        self._thread.start()

    def submit(self, cgroup_id: int, phase: Phase) -> None:
        """Set ``phase`` in the module soon (never blocks on the module)."""
        with self._cv:
            self._pending.pop(cgroup_id, None)  # re-queued at the end: oldest first
            self._pending[cgroup_id] = phase
            self._cv.notify_all()

    def forget(self, cgroup_id: int) -> None:
        """The sandbox goes: drop its phase if not sent yet."""
        with self._cv:
            self._pending.pop(cgroup_id, None)

    def flush(self, timeout: float) -> bool:
        """Wait until everything submitted so far was sent (True) or ``timeout`` passed."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._pending and not self._sending, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Send what is pending, then end the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        name_this_thread()
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending or self._stopping)
                if not self._pending:
                    return  # stopping, nothing left
                cgroup_id = next(iter(self._pending))
                phase = self._pending.pop(cgroup_id)
                self._sending = True
            try:
                self._apply(cgroup_id, phase)
            except errors.AzswapError as e:
                self._on_error(cgroup_id, phase, e)
            except Exception:  # a bug must not end the thread: later phases still go out
                log.exception("module phase %s of cgroup %d", phase.label, cgroup_id)
            finally:
                with self._cv:
                    self._sending = False
                    self._cv.notify_all()
