"""Page traces: the format, the recorder and the replay tool (docs/trace-format.md).

- :mod:`controlplane.trace.format`: reader and writer (re-exported here);
- :mod:`controlplane.trace.recorder`: records the private pages of live processes
  (``python -m controlplane.trace.recorder``);
- :mod:`controlplane.trace.replay`: runs a trace through the host build of the store core and
  reports the bytes stored per strategy (``python -m controlplane.trace.replay``);
- :mod:`controlplane.trace.corelib`: the ctypes binding of that host build
  (build/libazcore.so, the C files that run in azswap.ko).
"""

from controlplane.trace.format import (
    PAGE_SIZE,
    ROLE_NAMES,
    ROLE_SANDBOX,
    ROLE_TEMPLATE,
    ROLE_UNREGISTERED,
    Owner,
    PageRun,
    Trace,
    TraceError,
    TraceWriter,
    Vma,
    parse_trace,
    read_trace,
    summary,
)

__all__ = [
    "PAGE_SIZE",
    "ROLE_NAMES",
    "ROLE_SANDBOX",
    "ROLE_TEMPLATE",
    "ROLE_UNREGISTERED",
    "Owner",
    "PageRun",
    "Trace",
    "TraceError",
    "TraceWriter",
    "Vma",
    "parse_trace",
    "read_trace",
    "summary",
]
