"""The swap device for the eBPF/prefetch guest tests: azswap (AZSWAP_SWAPDEV=zram asks for
zram instead), brought up by the guest toolkit (bench/kit/swapdev.py); when it does not come up
the tests fail with the reason, never on another device.  page-cluster is set to 0 while it is
up, so every swap-in is one page (no readahead) and fault counts are exact."""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.kit.cgroups import LeafCgroup
from bench.kit.swapdev import swap_device as kit_swap_device
from controlplane.sysfs import parse_size

PAGE_CLUSTER = Path("/proc/sys/vm/page-cluster")


@contextmanager
def swap_device(size: str = "512M", prefer: str | None = None) -> Iterator[str]:
    """Yields "azswap" or "zram", whichever was asked for (AZSWAP_SWAPDEV or ``prefer``)."""
    want = prefer or os.environ.get("AZSWAP_SWAPDEV", "azswap")
    if want not in ("azswap", "zram"):
        raise ValueError(f"AZSWAP_SWAPDEV={want!r}: azswap or zram")
    old_cluster = PAGE_CLUSTER.read_text().strip()
    try:
        with kit_swap_device(f"{want}-lz4", parse_size(size)):
            PAGE_CLUSTER.write_text("0")
            yield want
    finally:
        PAGE_CLUSTER.write_text(old_cluster)


class Cg(LeafCgroup):
    """A leaf memory cgroup under /sys/fs/cgroup/azpf."""

    parent = "azpf"


# -- one swap device and one fault tracer for the whole guest session ---------------------------
# (compiling the BPF program costs 15-100 s under TCG; with azswap, the tracer's tracepoint
# attachments pin the module, so the tracer is closed before the device goes away)

_session: dict[str, object] = {}


def _session_end() -> None:
    tr = _session.pop("tracer", None)
    if tr is not None:
        tr.close()  # type: ignore[attr-defined]
    cm = _session.pop("swap", None)
    if cm is not None:
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]


def session_swap() -> str:
    if "kind" not in _session:
        cm = swap_device("512M")
        _session["kind"] = cm.__enter__()
        _session["swap"] = cm
        atexit.register(_session_end)
    return str(_session["kind"])


def session_tracer(ringbuf_pages: int = 32) -> object:
    """The shared FaultTracer, started on first use (and again after a test closed it)."""
    from ebpf.tracer import FaultTracer

    session_swap()
    tr = _session.get("tracer")
    if tr is None or tr.bpf is None:  # type: ignore[attr-defined]
        tr = FaultTracer(ringbuf_pages=ringbuf_pages)
        tr.start()
        _session["tracer"] = tr
    return tr


def release_tracer() -> None:
    """Close the session's tracer, if one runs (one tracer per host: a daemon's prefetcher
    needs the place); the next session_tracer() starts it again."""
    tr = _session.pop("tracer", None)
    if tr is not None:
        tr.close()  # type: ignore[attr-defined]


def replace_tracer(tr: object) -> None:
    _session["tracer"] = tr
