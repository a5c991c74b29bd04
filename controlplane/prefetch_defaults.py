"""The prefetch settings `azctl daemon` runs with unless told otherwise.

DaemonConfig's defaults (controlplane/daemon.py), in a module of their own so that `azctl`
shows them in its help without importing the daemon (`azctl phase` and `azctl ending` sit on an
agent loop's hot path).
"""

from __future__ import annotations

# bring an announced wait's working set back before its tool (azctl --prefetch/--no-prefetch)
PREFETCH = True
# how a working set is learned: what is resident when a wait's compression reached it
# (controlplane/residentset.py), or the eBPF fault tracer's events (controlplane/prefetch.py)
PREFETCH_SOURCES = ("resident", "faults")
PREFETCH_FROM = "resident"
