"""Restore-time prefetch: bring a sandbox's next working set back before its tool touches it.

Learning.  The fault tracer (ebpf/) reports every swap-in fault of a traced sandbox with the
phase it happened in.  For each tool phase that follows an LLM wait, the *cycle* is the list of
pages (pid, address) that faulted back in the first ``window_s`` seconds of the phase, in
first-touch order.  The restore set of a sandbox is learned from its last ``history`` cycles:

    weight(page) = (cycles the page appears in) / (cycles kept)       recurrence
    rank(page)   = mean over those cycles of (position / cycle length) first-touch order

Pages with weight >= ``min_weight`` are kept; when the byte budget cannot hold all of them the
least recurrent go first; the survivors are issued in rank order (predicted first touch first).

Prefetch.  ``restore(sandbox)`` (on a tool hint, or just before the predicted end of an LLM
wait) takes the pages of the restore set that are still swapped out (/proc/PID/pagemap bit 62),
coalesces adjacent ones into ranges and brings them back for each process in the sandbox's
cgroup.procs, batch by batch in predicted order (at most 1024 iovecs a call), within
``max_bytes`` and ``max_seconds``.  Method ``populate`` (default) reads one byte of every page
with process_vm_readv: the kernel faults each page in *and maps it* in the sandbox, so its tool
takes no fault at all (in the test guest this took the tool-phase slowdown from 1.77x to
1.33x against MADV_WILLNEED).  Method ``willneed`` calls process_madvise(MADV_WILLNEED) through a
pidfd: pages land in the swap cache and each first touch is still a minor fault.  Populated
pages leave no fault event to learn from, so they count as used in learning, and every
``probe_every``-th restore is a willneed probe whose minor faults show what the tool really
touched.  Without ptrace access (EPERM) the prefetcher falls back to willneed.  Between
batches it stops when the sandbox has already taken ``stop_after_faults`` major faults on pages
outside the restore set since the hint (``stop_after_faults``, or ``stop_after_fraction`` of the
set's size if more: a working set drifts from cycle to cycle): it is faulting past the
prediction, and further reads would only compete with it.

Accuracy per willneed restore, settled when the next phase starts (``populated`` counts the
pages of populate restores):
    (settled at the next restore, or by settle(): events arrive asynchronously)
    used         prefetched pages the tool touched (minor fault: a major fault avoided)
    unused       prefetched pages the tool never touched in that phase
    read_twice   prefetched pages that still took a major fault (evicted again before use, or
                 the advice did not read them): their bytes were read twice
    missed       major faults on pages the prefetch did not cover
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from controlplane import cgroup, pagemap
from controlplane.pagemap import Page, Range, coalesce
from controlplane.priority import name_this_thread
from ebpf.events import PAGE_SIZE, FaultEvent, FaultRecords

log = logging.getLogger("azswap.prefetch")


SYS_PIDFD_OPEN = 434
SYS_PROCESS_MADVISE = 440
SYS_PROCESS_VM_READV = 310
MADV_WILLNEED = 3
IOV_MAX = 1024



# -- learning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scored:
    page: Page
    weight: float  # fraction of the kept cycles the page faulted in
    rank: float  # mean relative first-touch position, 0 = first


def learn_restore_set(cycles: Sequence[Sequence[Page]], min_weight: float = 0.34,
                      max_pages: int | None = None) -> list[Scored]:
    """The restore set from the last cycles (each a first-touch-ordered page list)."""
    n = len(cycles)
    if n == 0:
        return []
    seen: dict[Page, int] = {}
    pos: dict[Page, float] = {}
    for cyc in cycles:
        length = max(len(cyc), 1)
        first: set[Page] = set()
        for i, pg in enumerate(cyc):
            if pg in first:
                continue
            first.add(pg)
            seen[pg] = seen.get(pg, 0) + 1
            pos[pg] = pos.get(pg, 0.0) + i / length
    scored = [Scored(pg, c / n, pos[pg] / c) for pg, c in seen.items() if c / n >= min_weight]
    if max_pages is not None and len(scored) > max_pages:
        scored.sort(key=lambda s: (-s.weight, s.rank))
        scored = scored[:max_pages]
    scored.sort(key=lambda s: (s.rank, -s.weight, s.page))
    return scored


def batches(pages: Sequence[Page], batch_pages: int) -> Iterable[list[Page]]:
    for i in range(0, len(pages), batch_pages):
        yield list(pages[i:i + batch_pages])


# -- system calls ----------------------------------------------------------------------------------


class _Iovec(ctypes.Structure):
    _fields_ = (("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t))


assert ctypes.sizeof(_Iovec) == 2 * array("Q").itemsize  # the flat buffer's layout below


def _iovecs(bases: Sequence[int], lengths: Sequence[int]) -> ctypes.Array[_Iovec]:
    """An iovec array, filled from one flat buffer of (base, length) words."""
    flat = [0] * (2 * len(bases))
    flat[0::2], flat[1::2] = bases, lengths
    return (_Iovec * len(bases)).from_buffer_copy(array("Q", flat))


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def pidfd_open(pid: int) -> int:
    fd = _syscall(ctypes.c_long(SYS_PIDFD_OPEN), ctypes.c_long(pid), ctypes.c_long(0))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"pidfd_open({pid}): {os.strerror(e)}")
    return int(fd)


def process_madvise(pidfd: int, ranges: Sequence[tuple[int, int]],
                    advice: int = MADV_WILLNEED) -> int:
    """One process_madvise(2) call over at most IOV_MAX (start, length) ranges; bytes advised.
    The kernel stops at the first range it cannot advise: the count says where."""
    if len(ranges) > IOV_MAX:
        raise ValueError(f"{len(ranges)} ranges > IOV_MAX")
    iov = _iovecs([s for s, _ in ranges], [n for _, n in ranges])
    r = _syscall(ctypes.c_long(SYS_PROCESS_MADVISE), ctypes.c_long(pidfd), iov,
                 ctypes.c_long(len(ranges)), ctypes.c_long(advice), ctypes.c_long(0))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"process_madvise: {os.strerror(e)}")
    return int(r)


def process_vm_touch(pid: int, addrs: Sequence[int]) -> int:
    """Read one byte of each page of another process (process_vm_readv(2), IOV_MAX pages a
    call): the kernel faults every page in *and maps it* in that process, as MADV_POPULATE_READ
    would (which process_madvise does not offer).  Returns the pages read; the kernel stops at
    the first page it cannot read."""
    if len(addrs) > IOV_MAX:
        raise ValueError(f"{len(addrs)} pages > IOV_MAX")
    buf = ctypes.create_string_buffer(max(1, len(addrs)))
    local = _Iovec(ctypes.cast(buf, ctypes.c_void_p), len(addrs))
    remote = _iovecs(addrs, [1] * len(addrs))
    r = _syscall(ctypes.c_long(SYS_PROCESS_VM_READV), ctypes.c_long(pid), ctypes.byref(local),
                 ctypes.c_long(1), remote, ctypes.c_long(len(addrs)), ctypes.c_long(0))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"process_vm_readv({pid}): {os.strerror(e)}")
    return int(r)


def populate_ranges(pid: int, ranges: Sequence[Range],
                    call: Callable[[int, Sequence[int]], int] = process_vm_touch,
                    ) -> tuple[int, int, int]:
    """Fault every page of the ranges into process ``pid``, mapped; a page the kernel cannot
    read (unmapped since) is skipped.  Returns (bytes populated, calls, pages skipped), the
    shape of madvise_ranges()."""
    return populate_pages(pid, [r.start + k * PAGE_SIZE for r in ranges for k in range(r.pages)],
                          call)


def populate_pages(pid: int, addrs: Sequence[int],
                   call: Callable[[int, Sequence[int]], int] = process_vm_touch,
                   ) -> tuple[int, int, int]:
    """populate_ranges() of the pages at ``addrs``, IOV_MAX a call, in their order."""
    todo = list(addrs)
    done = calls = skipped = 0
    while todo:
        chunk = todo[:IOV_MAX]
        calls += 1
        try:
            n = call(pid, chunk)
        except OSError as e:
            if e.errno not in (errno.ENOMEM, errno.EFAULT):
                raise
            n = 0
        done += n
        if n < len(chunk):  # page n failed
            skipped += 1
            n += 1
        todo = todo[n:]
    return done * PAGE_SIZE, calls, skipped


def madvise_ranges(pidfd: int, ranges: Sequence[Range],
                   call: Callable[[int, Sequence[tuple[int, int]]], int] = process_madvise,
                   ) -> tuple[int, int, int]:
    """Advise every range, IOV_MAX per call; a range the kernel refuses (unmapped since: ENOMEM,
    EINVAL) is skipped.  Returns (bytes advised, calls, ranges skipped)."""
    todo = [(r.start, r.length) for r in ranges]
    done = calls = skipped = 0
    while todo:
        chunk = todo[:IOV_MAX]
        calls += 1
        try:
            n = call(pidfd, chunk)
        except OSError as e:
            if e.errno not in (errno.ENOMEM, errno.EINVAL, errno.EFAULT):
                raise
            todo = todo[1:]  # the first range failed
            skipped += 1
            continue
        done += n
        # skip what the call covered; a short count means the next range failed
        k = 0
        while k < len(chunk) and n >= chunk[k][1]:
            n -= chunk[k][1]
            k += 1
        if k < len(chunk):  # stopped inside/at range k: it failed
            todo = todo[k + 1:]
            skipped += 1
        else:
            todo = todo[k:]
    return done, calls, skipped


def swapped_out(pid: int, pages: Sequence[int], proc: Path = Path("/proc")) -> set[int]:
    """The addresses among ``pages`` whose PTE is a swap entry now (pagemap bit 62)."""
    return set(pagemap.swapped(pid, pages, proc))


# -- the prefetcher --------------------------------------------------------------------------------


@dataclass
class PrefetchConfig:
    history: int = 4  # cycles remembered per sandbox
    window_s: float = 10.0  # "first part" of a tool phase that is learned
    min_weight: float = 0.34  # recurrence needed to be prefetched
    max_bytes: int = 256 << 20  # budget per restore
    max_seconds: float = 2.0  # budget per restore
    batch_pages: int = 512  # pages per batch (stop checks happen between batches)
    # a restore racing a running tool stops once the tool took this many major faults outside
    # the restore set (at least; or stop_after_fraction of the set's size, if more): the
    # prediction is off and further reads only compete with the tool's own
    stop_after_faults: int = 16
    stop_after_fraction: float = 0.5
    only_swapped: bool = True  # skip pages that are resident (pagemap)
    # "populate": fault the pages in and map them (process_vm_readv), so the tool takes no fault
    # at all; "willneed": process_madvise(MADV_WILLNEED) reads them into the swap cache, the
    # tool still takes a minor fault per page.  Populated pages leave no fault event, so every
    # probe_every-th restore uses willneed and shows which of them the tool really touches.
    method: str = "populate"
    probe_every: int = 4
    poll_s: float = 0.25  # events are taken from the ring buffer this often
    # CPU the thread that turns them into records may use (fraction of one CPU): it runs at the
    # daemon's priority (controlplane/priority.py) and rests to stay within this
    poll_cpu_budget: float = 0.1
    feed_chunk: int = 256  # events recorded per hold of the prefetcher's lock
    compile_nice: int = 19  # how much lower the BPF compile runs


@dataclass
class PrefetchResult:
    sandbox: str
    restore_set_pages: int = 0
    prefetched_pages: int = 0  # advised pages that were swapped out
    prefetched_bytes: int = 0
    skipped_resident: int = 0
    ranges: int = 0
    calls: int = 0
    seconds: float = 0.0
    stopped: str = ""  # "" (done), "budget-bytes", "budget-time", "faulting-past", "no-process"
    phase_seq: int = 0
    method: str = ""  # "populate" or "willneed" (a probe)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Accuracy:
    restores: int = 0
    populated: int = 0  # pages faulted in and mapped (no fault follows: not settled)
    prefetched: int = 0  # pages advised (willneed restores: settled against the faults)
    used: int = 0  # = faults avoided
    unused: int = 0
    read_twice: int = 0
    missed: int = 0

    @property
    def bytes_read_twice(self) -> int:
        return self.read_twice * PAGE_SIZE

    def as_dict(self) -> dict[str, int]:
        d = asdict(self)
        d["faults_avoided"] = self.used
        d["bytes_read_twice"] = self.bytes_read_twice
        return d


@dataclass
class _Pending:
    seq: int
    pages: set[Page]


@dataclass
class SandboxState:
    name: str
    cgroup: Path
    cgroup_id: int
    phase: str = "unknown"
    seq: int = 0
    phase_of: dict[int, str] = field(default_factory=dict)  # phase_seq -> phase
    restore_seqs: list[int] = field(default_factory=list)  # tool phases after an llm wait
    populated: dict[int, list[Page]] = field(default_factory=dict)  # phase seq -> pages mapped
    pending: _Pending | None = None
    accuracy: Accuracy = field(default_factory=Accuracy)
    last: PrefetchResult | None = None


class Prefetcher:
    """Learns restore sets from fault events and prefetches them.

    Without a tracer (``tracer=None``) events are fed by hand with :meth:`feed` and phase
    sequence numbers are kept here; with one, :meth:`record_phase_change` stamps the phase into
    the BPF map and a background thread (:meth:`start_polling`) feeds the events.
    """

    def __init__(
        self,
        config: PrefetchConfig | None = None,
        tracer: Any = None,
        clock: Callable[[], float] = time.monotonic,
        madvise: Callable[[int, Sequence[tuple[int, int]]], int] = process_madvise,
        open_pidfd: Callable[[int], int] = pidfd_open,
        procs: Callable[[Path], list[int]] = cgroup.procs,
        swapped: Callable[[int, Sequence[int]], set[int]] = swapped_out,
        touch: Callable[[int, Sequence[int]], int] = process_vm_touch,
    ) -> None:
        self.cfg = config or PrefetchConfig()
        if self.cfg.method not in ("populate", "willneed") or self.cfg.probe_every < 1:
            raise ValueError("prefetch method must be populate or willneed, probe_every >= 1")
        self._touch = touch
        self._can_populate = True  # False after EPERM: no ptrace access, willneed from then on
        self.tracer = tracer
        self.clock = clock
        self._madvise, self._pidfd, self._procs, self._swapped = (
            madvise, open_pidfd, procs, swapped)
        self.records = FaultRecords(keep_phases=2 * self.cfg.history + 4)
        self.sandboxes: dict[str, SandboxState] = {}
        self._mu = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.status = "ready" if tracer is not None else "no tracer"

    # -- registration and phases -------------------------------------------------------------
    def add_sandbox(self, name: str, cg_path: str | os.PathLike[str],
                    cgroup_id: int | None = None) -> SandboxState:
        with self._mu:
            st = self.sandboxes.get(name)
            if st is not None:
                return st
            path = cgroup.cgroup_dir(cg_path)
            cgid = cgroup_id if cgroup_id is not None else cgroup.cgroup_id(path)
            if self.tracer is not None:
                self.tracer.add_sandbox(name, cgid)
            st = SandboxState(name, path, cgid)
            self.sandboxes[name] = st
            self.records.add_sandbox(name, cgid)
            return st

    def _state(self, sandbox: Any) -> SandboxState:
        """A SandboxState from a name or a registry Sandbox (name, cgroup_id, cgroup_path)."""
        if isinstance(sandbox, str):
            return self.sandboxes[sandbox]
        st = self.sandboxes.get(sandbox.name)
        if st is None:
            cgid = getattr(sandbox, "cgroup_id", None)
            cg: str | Path | None = sandbox.cgroup_path
            if not cg and cgid is not None:
                cg = cgroup.find_dir_by_id(cgid)
            if not cg:
                raise LookupError(f"sandbox {sandbox.name}: no cgroup path known")
            st = self.add_sandbox(sandbox.name, cg, cgid)
        return st

    def record_phase_change(self, sandbox: Any, phase: str) -> int:
        """Tell the prefetcher a sandbox changed phase ("tool", "llm-wait", "idle", ...);
        returns the new phase sequence number."""
        with self._mu:
            st = self._state(sandbox)
            st.seq += 1
            if self.tracer is not None:
                from ebpf.tracer import PHASE_CODES

                self.tracer.phase_change(st.name, PHASE_CODES.get(phase, 0), seq=st.seq)
            prev = st.phase
            st.phase = phase
            st.phase_of[st.seq] = phase
            if phase == "tool" and prev != "tool":
                st.restore_seqs.append(st.seq)
                del st.restore_seqs[: -(self.cfg.history + 1)]
            for s in [s for s in st.phase_of if s < st.seq - 4 * self.cfg.history - 4]:
                del st.phase_of[s]
            return st.seq

    def feed(self, events: Iterable[FaultEvent]) -> None:
        """Record events, ``feed_chunk`` at a time: a phase hint waits for the lock at most one
        chunk's worth."""
        evs: Sequence[FaultEvent] = events if isinstance(events, Sequence) else list(events)
        n = max(1, self.cfg.feed_chunk)
        for i in range(0, len(evs), n):
            with self._mu:
                for ev in evs[i:i + n]:
                    self.records.add(ev)

    # -- learning ----------------------------------------------------------------------------
    def cycles(self, sandbox: Any) -> list[list[Page]]:
        """The learned cycles: first-window pages of the last completed tool phases."""
        with self._mu:
            st = self._state(sandbox)
            rec = self.records.by_cgroup.get(st.cgroup_id)
            if rec is None:
                return []
            window = int(self.cfg.window_s * 1e9)
            out = []
            for seq in st.restore_seqs:
                if seq == st.seq and st.phase == "tool":
                    continue  # still running
                ph = rec.phases.get(seq)
                pages = [pg for pg in ph.order if ph.first_ns[pg] <= window] if ph else []
                # pages populated before this phase cannot fault: taken as used, in the order
                # they were predicted (the next willneed probe shows what really was)
                pop = st.populated.get(seq, [])
                if pop:
                    seen = set(pop)
                    pages = pop + [pg for pg in pages if pg not in seen]
                out.append(pages)
            return out[-self.cfg.history:]

    def restore_set(self, sandbox: Any) -> list[Scored]:
        cyc = self.cycles(sandbox)
        return learn_restore_set(cyc, self.cfg.min_weight, self.cfg.max_bytes // PAGE_SIZE)

    # -- prefetch ----------------------------------------------------------------------------
    def _faults_past(self, st: SandboxState, seq: int, predicted: set[Page]) -> int:
        """Pages outside the prediction that took a major fault in phase ``seq``."""
        with self._mu:
            rec = self.records.by_cgroup.get(st.cgroup_id)
            ph = rec.phases.get(seq) if rec else None
            if ph is None:
                return 0
            return len(ph.major_pages - predicted)

    def restore(self, sandbox: Any) -> dict[str, Any]:
        """Prefetch the sandbox's restore set (a tool phase starts now, unless one was already
        recorded).  Never raises for "nothing learned yet"."""
        with self._mu:
            st = self._state(sandbox)
            # the last restore's tool phase is over and its events have had a whole wait to
            # arrive through the ring buffer: account it now
            self._settle(st)
            if st.phase != "tool":
                self.record_phase_change(st.name, "tool")
            seq = st.seq
            rs = self.restore_set(st.name)
        res = PrefetchResult(st.name, restore_set_pages=len(rs), phase_seq=seq)
        t0 = self.clock()
        predicted = {s.page for s in rs}
        order = [s.page for s in rs]
        pids = set(self._procs(st.cgroup))
        order = [pg for pg in order if pg[0] in pids]
        if not order:
            res.stopped = "no-process" if rs and not pids else ""
            st.last = res
            return res.as_dict()
        fds: dict[int, int] = {}
        advised: set[Page] = set()
        populate = (self.cfg.method == "populate" and self._can_populate
                    and st.accuracy.restores % self.cfg.probe_every != self.cfg.probe_every - 1)
        res.method = "populate" if populate else "willneed"
        try:
            for batch in batches(order, self.cfg.batch_pages):
                if res.prefetched_bytes >= self.cfg.max_bytes:
                    res.stopped = "budget-bytes"
                    break
                if self.clock() - t0 >= self.cfg.max_seconds:
                    res.stopped = "budget-time"
                    break
                limit = max(self.cfg.stop_after_faults,
                            int(self.cfg.stop_after_fraction * len(predicted)))
                if self._faults_past(st, seq, predicted) >= limit:
                    res.stopped = "faulting-past"
                    break
                room = (self.cfg.max_bytes - res.prefetched_bytes) // PAGE_SIZE
                batch = batch[:room]
                if self.cfg.only_swapped:
                    keep: list[Page] = []
                    by_pid: dict[int, list[int]] = {}
                    for pid, addr in batch:
                        by_pid.setdefault(pid, []).append(addr)
                    out = {pid: self._swapped(pid, addrs) for pid, addrs in by_pid.items()}
                    keep = [pg for pg in batch if pg[1] in out[pg[0]]]
                    res.skipped_resident += len(batch) - len(keep)
                    batch = keep
                for pid in dict.fromkeys(pg[0] for pg in batch):
                    mine = [pg for pg in batch if pg[0] == pid]
                    if populate:
                        ranges = coalesce(mine)
                        try:
                            done, calls, _skipped = populate_ranges(pid, ranges, self._touch)
                        except OSError as e:
                            if e.errno not in (errno.EPERM, errno.EACCES):
                                log.info("prefetch %s: pid %d: %s", st.name, pid, e)
                                continue  # e.g. ESRCH: the process exited
                            log.warning("prefetch: process_vm_readv refused (%s): no ptrace "
                                        "access, using MADV_WILLNEED from now on", e)
                            self._can_populate = populate = False
                            res.method = "willneed"
                    if populate:
                        res.ranges += len(ranges)
                        res.calls += calls
                        res.prefetched_bytes += done
                        left = done
                        for rg in ranges:
                            n = min(rg.pages, max(left, 0) // PAGE_SIZE)
                            advised.update((pid, rg.start + k * PAGE_SIZE) for k in range(n))
                            left -= rg.length
                        continue
                    if pid not in fds:
                        try:
                            fds[pid] = self._pidfd(pid)
                        except OSError as e:
                            log.info("prefetch %s: pid %d: %s", st.name, pid, e)
                            fds[pid] = -1
                    if fds[pid] < 0:
                        continue
                    ranges = coalesce(mine)
                    done, calls, _skipped = madvise_ranges(fds[pid], ranges, self._madvise)
                    res.ranges += len(ranges)
                    res.calls += calls
                    res.prefetched_bytes += done
                    # pages covered: ranges in order until `done` bytes
                    left = done
                    for rg in ranges:
                        if left <= 0:
                            break
                        n = min(rg.pages, left // PAGE_SIZE)
                        advised.update((pid, rg.start + k * PAGE_SIZE) for k in range(n))
                        left -= rg.length
        finally:
            for fd in fds.values():
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        res.prefetched_pages = len(advised)
        res.seconds = self.clock() - t0
        with self._mu:
            if populate:
                # mapped pages leave no fault to settle against: accuracy comes from the probes
                st.populated[seq] = [pg for pg in order if pg in advised]
                for s in [s for s in st.populated if s < seq - 4 * self.cfg.history - 4]:
                    del st.populated[s]
                st.accuracy.populated += len(advised)
            else:
                st.pending = _Pending(seq, advised)
                st.accuracy.prefetched += len(advised)
            st.accuracy.restores += 1
            st.last = res
        return res.as_dict()

    def _settle(self, st: SandboxState) -> None:
        """Account the last restore against the faults of its tool phase."""
        p, st.pending = st.pending, None
        if p is None:
            return
        rec = self.records.by_cgroup.get(st.cgroup_id)
        ph = rec.phases.get(p.seq) if rec else None
        touched_minor: set[Page] = set()
        touched_major: set[Page] = set()
        missed = 0
        if ph is not None:
            touched_major = set(ph.major_pages)
            touched_minor = set(ph.minor_pages) - touched_major
            missed = len(touched_major - p.pages)
        a = st.accuracy
        a.used += len(p.pages & touched_minor)
        a.read_twice += len(p.pages & touched_major)
        a.unused += len(p.pages - touched_minor - touched_major)
        a.missed += missed

    def accuracy(self, sandbox: Any) -> dict[str, int]:
        with self._mu:
            st = self._state(sandbox)
            return st.accuracy.as_dict()

    def settle(self, sandbox: Any) -> dict[str, int]:
        """Settle the pending restore now (end of a tool phase without a phase change)."""
        with self._mu:
            st = self._state(sandbox)
            self._settle(st)
            return st.accuracy.as_dict()

    # -- background polling (with a tracer) --------------------------------------------------
    def start_polling(self) -> None:
        if self.tracer is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._poll_loop, name="prefetch-events",
                                        daemon=True)
        self._thread.start()

    def _poll_loop(self) -> None:
        """Learning is bookkeeping, never urgent: the events are taken in batches every
        ``poll_s`` seconds (no wake-up per fault), and the thread rests so that its CPU time
        stays within ``poll_cpu_budget`` of the wall clock (under TCG, turning each event into a
        record costs about as much as the fault it describes).  It runs at the daemon's
        priority: lowered, it would hold the GIL and the prefetcher's lock while preempted
        behind busy tools, and hold up the answers to their phase hints."""
        name_this_thread("prefetch-events")
        rest = self.cfg.poll_s
        while not self._stop.wait(rest):
            c0 = time.thread_time()
            try:
                evs = self.tracer.drain()
            except Exception as e:  # keep the daemon alive; say why prefetch stopped learning
                self.status = f"event polling stopped: {e}"
                log.warning("prefetch: %s", self.status)
                return
            if evs:
                self.feed(evs)
            rest = self.poll_rest(time.thread_time() - c0)

    def poll_rest(self, cpu_s: float) -> float:
        """How long the polling thread rests after a batch that took ``cpu_s`` of its CPU:
        ``poll_s``, or longer so that its CPU stays within ``poll_cpu_budget``."""
        budget = max(0.01, min(1.0, self.cfg.poll_cpu_budget))
        return max(self.cfg.poll_s, cpu_s / budget)

    def sync(self) -> None:
        """Feed every event already in the ring buffer (tests, end of a phase)."""
        if self.tracer is not None:
            self.feed(self.tracer.drain())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self.tracer is not None:
            self.tracer.close()


def make_prefetcher() -> Prefetcher:
    """The daemon's factory (controlplane/restore.py): a Prefetcher whose fault tracer compiles
    (at a lower priority) and attaches in the background (tens of seconds under TCG); until
    then restore() runs on an empty history and says so in its result."""
    from ebpf.tracer import PHASE_CODES, FaultTracer

    # a ring buffer that holds a few tool phases' faults (~16k events per MiB): the consumer
    # runs at a low priority and may fall behind while tools run.  Only the faults: the
    # module's load/store tracepoints (per-sandbox counters for `python -m ebpf.faulttrace`)
    # would run a BPF program for every page the daemon itself compresses.
    tracer = FaultTracer(module_events="off", ringbuf_pages=512)
    p = Prefetcher(tracer=None)
    p.status = "tracer starting"

    def boot() -> None:
        name_this_thread("prefetch-bpf")
        # The BPF compile (clang, in this thread) costs tens of CPU seconds under TCG and minutes
        # on a busy host: it runs at a lower priority, behind the sandboxes' tools.
        try:
            tracer.start(compile_nice=p.cfg.compile_nice)
        except Exception as e:
            p.status = f"tracer unavailable: {e}"
            log.warning("prefetch: %s", p.status)
            return
        with p._mu:
            p.tracer = tracer
            for st in p.sandboxes.values():
                tracer.add_sandbox(st.name, st.cgroup_id)
                tracer.phase_change(st.name, PHASE_CODES.get(st.phase, 0), seq=st.seq)
            p.status = "tracing"
        p.start_polling()

    threading.Thread(target=boot, name="prefetch-tracer", daemon=True).start()
    return p
