"""FaultTracer: loads ebpf/faulttrace.c with bcc and hands out parsed fault events.

    tr = FaultTracer()                  # checks root, single instance, module tracepoints
    tr.start()                          # compile + attach (~10-60 s under TCG)
    tr.add_sandbox("sb1", "/sys/fs/cgroup/sb1")
    tr.phase_change("sb1", PHASE_TOOL)  # time since phase change is measured from here
    for ev in tr.poll(100): ...         # FaultEvent list
    tr.stats()                          # global + per-sandbox counters, decode histograms
    tr.close()

Errors are :class:`TracerError` subclasses with one-line messages (the CLI prints them, no
traceback): not root, BPF unavailable (bcc missing, compile or attach failure), already running
(another tracer holds the lock file), azswap module absent (when its tracepoints are required).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane import cgroup as cgroups
from controlplane import errors
from controlplane.priority import lowered_priority
from ebpf.btf import BTFError, func_arg_counts
from ebpf.events import COUNTERS, SBSTAT_FIELDS, EventFormatError, FaultEvent

HERE = Path(__file__).resolve().parent
BPF_SOURCE = HERE / "faulttrace.c"
LOCK_PATH = Path(os.environ.get("AZSWAP_RUN_DIR", "/run/azswap")) / "faulttrace.lock"
TRACEFS = Path("/sys/kernel/tracing")
PROBE_FUNC = "swap_cache_get_folio"
FAULT_FUNC = "handle_mm_fault"

PHASE_UNKNOWN, PHASE_TOOL, PHASE_LLM_WAIT, PHASE_IDLE = 0, 1, 2, 3
PHASE_CODES = {"unknown": 0, "tool": 1, "llm-wait": 2, "idle": 3}


class TracerError(Exception):
    """A one-line, user-facing reason the tracer cannot run."""


class NotRoot(TracerError):
    pass


class BPFUnavailable(TracerError):
    pass


class AlreadyRunning(TracerError):
    pass


class ModuleAbsent(TracerError):
    pass


def cgroup_id(path: str | os.PathLike[str]) -> int:
    """The cgroup v2 id of a cgroup (controlplane.cgroup: its directory's inode number, what
    bpf_get_current_cgroup_id() returns)."""
    try:
        return cgroups.cgroup_id(path)
    except errors.AzswapError as e:
        raise TracerError(str(e)) from None


def module_tracepoints(tracefs: Path = TRACEFS) -> bool:
    return all((tracefs / "events" / "azswap" / ev).is_dir()
               for ev in ("azswap_load", "azswap_store"))


def lookup_arg_count() -> int:
    """swap_cache_get_folio()'s parameters on the running kernel: 3 (entry, vma, addr) up to
    6.17, 1 (entry) after the swap-table rework.  Read from the kernel's BTF; anything else is
    a kernel this tracer does not know how to probe."""
    try:
        n = func_arg_counts({PROBE_FUNC}).get(PROBE_FUNC)
    except BTFError as e:
        raise BPFUnavailable(f"cannot read the kernel's BTF: {e}") from None
    if n not in (1, 3):
        raise BPFUnavailable(f"{PROBE_FUNC} takes {n} arguments here: no probe for that")
    return n


class InstanceLock:
    """One tracer at a time: an flock on LOCK_PATH (released by the kernel if we die)."""

    def __init__(self, path: Path = LOCK_PATH) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise TracerError(f"lock file {self.path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = f" (pid {int(os.pread(fd, 32, 0).decode().strip())})"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise AlreadyRunning(
                    f"another fault tracer is already loaded{holder}: lock {self.path} is held"
                ) from None
            raise TracerError(f"lock file {self.path}: {e.strerror}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass
class SandboxSlot:
    name: str
    cgroup_id: int
    phase_seq: int = 0


class FaultTracer:
    def __init__(
        self,
        module_events: str = "auto",  # auto | require | off
        ringbuf_pages: int = 64,
        lock_path: Path = LOCK_PATH,
        tracefs: Path = TRACEFS,
    ) -> None:
        if module_events not in ("auto", "require", "off"):
            raise ValueError(f"module_events: {module_events!r}")
        if ringbuf_pages <= 0 or ringbuf_pages & (ringbuf_pages - 1):
            raise TracerError(f"ring buffer pages must be a power of two, got {ringbuf_pages}")
        self.module_events = module_events
        self.ringbuf_pages = ringbuf_pages
        self.tracefs = tracefs
        self.lock = InstanceLock(lock_path)
        self.bpf: Any = None
        self.with_module = False
        self.sandboxes: dict[str, SandboxSlot] = {}
        self._buf: list[FaultEvent] = []
        self.bad_events = 0
        self._mu = threading.Lock()

    # -- loading ---------------------------------------------------------------------------
    probe_args = 3  # swap_cache_get_folio()'s parameters on this kernel (see lookup_arg_count)

    def start(self, compile_nice: int = 0) -> FaultTracer:
        """Compile, load and attach.  ``compile_nice``: how much lower the calling thread runs
        during the compile (libbcc's clang, tens of CPU seconds under TCG; it holds no GIL, so
        a lowered thread there delays nothing else of the caller's)."""
        if os.geteuid() != 0:
            raise NotRoot("must run as root (BPF is root-only: kernel.unprivileged_bpf_disabled)")
        self.with_module = module_tracepoints(self.tracefs)
        if self.module_events == "require" and not self.with_module:
            raise ModuleAbsent(
                "azswap module not loaded: tracepoints azswap:azswap_load/azswap_store missing "
                "(insmod kmod/azswap.ko, or trace faults only with --no-module-events)"
            )
        if self.module_events == "off":
            self.with_module = False
        try:
            from bcc import BPF  # Debian's python3-bpfcc
        except ImportError:
            raise BPFUnavailable(
                "bcc is not importable (install python3-bpfcc; use a venv with "
                "--system-site-packages)"
            ) from None
        self.lock.acquire()
        cflags = [f"-DRINGBUF_PAGES={self.ringbuf_pages}"]
        if self.with_module:
            cflags.append("-DAZSWAP_TRACEPOINTS")
        try:
            for fn in (PROBE_FUNC, FAULT_FUNC):
                if not BPF.get_kprobe_functions(fn.encode()):
                    raise BPFUnavailable(f"kernel function {fn} is not probeable here")
            self.probe_args = lookup_arg_count()
            if self.probe_args == 1:
                cflags.append("-DLOOKUP_ENTRY_ONLY")
            with lowered_priority(compile_nice):
                self.bpf = BPF(src_file=str(BPF_SOURCE).encode(), cflags=cflags)
            if self.probe_args == 1:
                self.bpf.attach_kprobe(event=FAULT_FUNC.encode(), fn_name=b"trace_fault_entry")
                self.bpf.attach_kretprobe(event=FAULT_FUNC.encode(),
                                          fn_name=b"trace_fault_return")
            self.bpf.attach_kprobe(event=PROBE_FUNC.encode(), fn_name=b"trace_lookup_entry")
            self.bpf.attach_kretprobe(event=PROBE_FUNC.encode(), fn_name=b"trace_lookup_return")
            self.bpf[b"events"].open_ring_buffer(self._on_event)
        except TracerError:
            self.close()
            raise
        except Exception as e:  # bcc raises bare Exceptions for compile/attach failures
            self.close()
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BPFUnavailable(f"cannot load {BPF_SOURCE.name}: {msg}") from None
        return self

    def close(self) -> None:
        if self.bpf is not None:
            with contextlib.suppress(Exception):
                self.bpf.cleanup()
            self.bpf = None
        self.lock.release()

    def __enter__(self) -> FaultTracer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _need(self) -> Any:
        if self.bpf is None:
            raise TracerError("tracer not started")
        return self.bpf

    # -- sandboxes and phases -----------------------------------------------------------------
    def add_sandbox(self, name: str, cgroup: str | os.PathLike[str] | int) -> int:
        b = self._need()
        cgid = cgroup if isinstance(cgroup, int) else cgroup_id(cgroup)
        table = b["sandboxes"]
        val = table.Leaf(time.monotonic_ns(), 0, PHASE_UNKNOWN)
        table[table.Key(cgid)] = val
        self.sandboxes[name] = SandboxSlot(name, cgid)
        return cgid

    def remove_sandbox(self, name: str) -> None:
        b = self._need()
        slot = self.sandboxes.pop(name, None)
        if slot is None:
            return
        for tname in ("sandboxes", "sbstats"):
            with contextlib.suppress(KeyError):
                del b[tname][b[tname].Key(slot.cgroup_id)]

    def phase_change(self, name: str, phase: int, seq: int | None = None,
                     at_ns: int | None = None) -> int:
        """Stamp a phase change into the sandbox's map entry; returns the new phase_seq (the
        events of this phase carry it): ``seq`` when given, else the last one + 1."""
        b = self._need()
        slot = self.sandboxes[name]
        slot.phase_seq = slot.phase_seq + 1 if seq is None else seq
        table = b["sandboxes"]
        ts = time.monotonic_ns() if at_ns is None else at_ns
        table[table.Key(slot.cgroup_id)] = table.Leaf(ts, slot.phase_seq, phase)
        return slot.phase_seq

    # -- events --------------------------------------------------------------------------------
    def _on_event(self, _ctx: Any, data: Any, size: int) -> None:
        try:
            raw = ctypes.string_at(data, size)
            self._buf.append(FaultEvent.parse(raw))
        except EventFormatError:
            self.bad_events += 1

    def poll(self, timeout_ms: int = 100) -> list[FaultEvent]:
        b = self._need()
        with self._mu:
            b.ring_buffer_poll(timeout_ms)
            out, self._buf = self._buf, []
        return out

    def drain(self) -> list[FaultEvent]:
        b = self._need()
        with self._mu:
            b.ring_buffer_consume()
            out, self._buf = self._buf, []
        return out

    def run(self, sink: Callable[[list[FaultEvent]], None], stop: threading.Event,
            timeout_ms: int = 100) -> None:
        while not stop.is_set():
            evs = self.poll(timeout_ms)
            if evs:
                sink(evs)
        evs = self.drain()
        if evs:
            sink(evs)

    # -- counters ------------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        b = self._need()
        t = b["counters"]
        out = {name: int(sum(t[t.Key(i)])) for i, name in enumerate(COUNTERS)}
        out["bad_events"] = self.bad_events
        return out

    def sandbox_stats(self) -> dict[str, dict[str, int]]:
        b = self._need()
        t = b["sbstats"]
        by_id = {s.cgroup_id: s.name for s in self.sandboxes.values()}
        out: dict[str, dict[str, int]] = {}
        for k, v in t.items():
            name = by_id.get(k.value)
            if name is not None:
                out[name] = {f: int(getattr(v, f)) for f in SBSTAT_FIELDS}
        return out

    def decode_hist(self) -> dict[str, dict[int, int]]:
        """Per sandbox: log2(decode ns) bucket -> loads (azswap tracepoint; empty without it)."""
        b = self._need()
        by_id = {s.cgroup_id: s.name for s in self.sandboxes.values()}
        out: dict[str, dict[int, int]] = {}
        for k, v in b["decode_ns"].items():
            name = by_id.get(k.cgroup_id)
            if name is not None and v.value:
                out.setdefault(name, {})[int(k.slot)] = int(v.value)
        return out
