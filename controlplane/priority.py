"""Thread priorities: the control plane's background work yields to the sandboxes' tools."""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("azswap.priority")


def lower_thread_priority(nice: int) -> None:
    """Raise the calling thread's nice by ``nice`` (Linux: nice is per thread).  Best effort."""
    if nice <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as e:
        log.info("cannot lower this thread's priority: %s", e)
