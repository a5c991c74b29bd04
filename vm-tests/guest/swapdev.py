"""A swap device for the eBPF/prefetch guest tests: azswap when its module loads and swaps on,
zram otherwise (say which in the test output).  page-cluster is set to 0 while it is up, so
every swap-in is one page (no readahead) and fault counts are exact."""

from __future__ import annotations

import atexit
import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import azswap_guest as ag

CGROOT = Path("/sys/fs/cgroup")
PAGE_CLUSTER = Path("/proc/sys/vm/page-cluster")


def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False)


def _zram_on(size: str) -> str:
    sh("modprobe", "zram", "num_devices=1")
    Path("/sys/block/zram0/reset").write_text("1")
    Path("/sys/block/zram0/disksize").write_text(size)
    sh("mkswap", "/dev/zram0")
    r = sh("swapon", "-p", "100", "/dev/zram0")
    if r.returncode:
        raise OSError(f"swapon zram0: {r.stderr.strip()}")
    return "zram"


def _azswap_on(size: str) -> str:
    ag.cleanup_module()
    ag.disable_zswap()
    ag.insmod()
    ag.Dev(0).swapon(size)
    return "azswap"


@contextmanager
def swap_device(size: str = "512M", prefer: str | None = None) -> Iterator[str]:
    """Yields "azswap" or "zram".  AZSWAP_SWAPDEV=zram|azswap forces one."""
    want = prefer or os.environ.get("AZSWAP_SWAPDEV", "azswap")
    ag.disable_zswap()
    old_cluster = PAGE_CLUSTER.read_text().strip()
    kind = ""
    try:
        if want == "azswap":
            try:
                kind = _azswap_on(size)
            except (OSError, subprocess.CalledProcessError) as e:
                print(f"swapdev: azswap unavailable ({e}); using zram", file=sys.stderr)
                ag.cleanup_module()
        if not kind:
            kind = _zram_on(size)
        PAGE_CLUSTER.write_text("0")
        yield kind
    finally:
        PAGE_CLUSTER.write_text(old_cluster)
        if kind == "zram":
            sh("swapoff", "/dev/zram0")
            Path("/sys/block/zram0/reset").write_text("1")
        elif kind == "azswap":
            ag.cleanup_module()


class Cg:
    """A leaf memory cgroup under /sys/fs/cgroup/azpf."""

    def __init__(self, name: str) -> None:
        parent = CGROOT / "azpf"
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text("+memory")
        self.path = parent / name
        self.path.mkdir(exist_ok=True)

    def reclaim_all(self, tries: int = 8) -> None:
        """Push everything out (memory.reclaim until it comes up short)."""
        for _ in range(tries):
            try:
                (self.path / "memory.reclaim").write_text("1G")
            except OSError as e:
                if e.errno != errno.EAGAIN:
                    raise
                return

    def stat(self) -> dict[str, int]:
        out = {}
        for ln in (self.path / "memory.stat").read_text().splitlines():
            k, v = ln.split()
            out[k] = int(v)
        return out

    def current(self) -> int:
        return int((self.path / "memory.current").read_text())

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


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


def replace_tracer(tr: object) -> None:
    _session["tracer"] = tr
