"""Events from ebpf/faulttrace.c and the per-sandbox records built from them (no bcc here).

A :class:`FaultEvent` is one swap-in fault of a registered sandbox: the page, whether it was read
from the device (major) or found in the swap cache (minor: readahead or a prefetch got there
first), and when, relative to the sandbox's last phase change.  :class:`FaultRecords` turns a
stream of them into what the prefetcher and the faulttrace tool report: per sandbox and per phase,
the pages that faulted back in first-touch order, counts, and time since the phase change.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

PAGE_SIZE = 4096

# struct fault_event in faulttrace.c: 5 x u64, 3 x u32, 2 x u16 (56 bytes, no padding).
EVENT_FORMAT = "<QQQQQIIIHH"
EVENT_SIZE = struct.calcsize(EVENT_FORMAT)

EV_MAJOR = 1
EV_MINOR = 2
KIND_NAMES = {EV_MAJOR: "major", EV_MINOR: "minor"}

# enum counter in faulttrace.c
COUNTERS = ("events", "drops", "pending_full", "loads", "stores")

# struct sbstat in faulttrace.c
SBSTAT_FIELDS = (
    "major", "minor", "drops", "loads", "load_ns", "load_errors",
    "stores", "stored_bytes", "store_errors",
)


class EventFormatError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class FaultEvent:
    ts_ns: int
    cgroup_id: int
    addr: int
    slot: int
    since_phase_ns: int
    tgid: int
    tid: int
    phase_seq: int
    kind: int
    swap_type: int

    @property
    def major(self) -> bool:
        return self.kind == EV_MAJOR

    @property
    def page(self) -> tuple[int, int]:
        """The page's identity for the prefetcher: (process, page-aligned address)."""
        return (self.tgid, self.addr & ~(PAGE_SIZE - 1))

    @classmethod
    def parse(cls, raw: bytes | bytearray | memoryview) -> FaultEvent:
        if len(raw) < EVENT_SIZE:
            raise EventFormatError(f"event of {len(raw)} bytes, expected {EVENT_SIZE}")
        ev = cls(*struct.unpack_from(EVENT_FORMAT, raw))
        if ev.kind not in KIND_NAMES:
            raise EventFormatError(f"unknown event kind {ev.kind}")
        return ev

    def pack(self) -> bytes:
        """The bytes faulttrace.c would submit (tests, replays)."""
        return struct.pack(
            EVENT_FORMAT, self.ts_ns, self.cgroup_id, self.addr, self.slot,
            self.since_phase_ns, self.tgid, self.tid, self.phase_seq, self.kind, self.swap_type,
        )


def log2_hist(values: Iterable[int]) -> dict[int, int]:
    """Bucket like bpf_log2l(): bucket b holds values in [2^(b-1), 2^b) (0 holds 0)."""
    out: dict[int, int] = {}
    for v in values:
        b = int(v).bit_length()
        out[b] = out.get(b, 0) + 1
    return out


def format_log2_hist(hist: dict[int, int], unit: str = "ns", width: int = 30) -> list[str]:
    """Lines in the style of bcc's print_log2_hist()."""
    if not hist:
        return []
    top = max(hist)
    peak = max(hist.values())
    lines = [f"{unit:>20} : count     distribution"]
    for b in range(1, top + 1):
        lo, hi = (1 << (b - 1)), (1 << b) - 1
        n = hist.get(b, 0)
        bar = "*" * (n * width // peak if peak else 0)
        lines.append(f"{lo:>10} -> {hi:<10}: {n:<9} |{bar:<{width}}|")
    return lines


@dataclass
class PhaseRecord:
    """The swap-in faults of one sandbox during one phase (one phase_seq)."""

    phase_seq: int
    order: list[tuple[int, int]] = field(default_factory=list)  # pages, first touch first
    first_ns: dict[tuple[int, int], int] = field(default_factory=dict)  # page -> since phase
    major: int = 0
    minor: int = 0
    major_pages: set[tuple[int, int]] = field(default_factory=set)
    minor_pages: set[tuple[int, int]] = field(default_factory=set)

    def add(self, ev: FaultEvent) -> bool:
        """Count the event; True when it is the page's first fault in this phase."""
        pg = ev.page
        if ev.major:
            self.major += 1
            self.major_pages.add(pg)
        else:
            self.minor += 1
            self.minor_pages.add(pg)
        if pg in self.first_ns:
            return False
        self.first_ns[pg] = ev.since_phase_ns
        self.order.append(pg)
        return True


@dataclass
class SandboxRecord:
    name: str
    cgroup_id: int
    phases: dict[int, PhaseRecord] = field(default_factory=dict)
    major: int = 0
    minor: int = 0
    last_ev_ns: int = 0

    def phase(self, seq: int) -> PhaseRecord:
        rec = self.phases.get(seq)
        if rec is None:
            rec = self.phases[seq] = PhaseRecord(seq)
        return rec


class FaultRecords:
    """Per-sandbox fault records built from events, bounded: the last ``keep_phases`` phases of
    each sandbox are kept."""

    def __init__(self, keep_phases: int = 8) -> None:
        self.keep_phases = keep_phases
        self.by_cgroup: dict[int, SandboxRecord] = {}
        self.unknown = 0  # events for cgroups not registered here (raced an unregister)

    def add_sandbox(self, name: str, cgroup_id: int) -> SandboxRecord:
        rec = self.by_cgroup.get(cgroup_id)
        if rec is None:
            rec = self.by_cgroup[cgroup_id] = SandboxRecord(name, cgroup_id)
        return rec

    def remove_sandbox(self, cgroup_id: int) -> None:
        self.by_cgroup.pop(cgroup_id, None)

    def add(self, ev: FaultEvent) -> SandboxRecord | None:
        sb = self.by_cgroup.get(ev.cgroup_id)
        if sb is None:
            self.unknown += 1
            return None
        if ev.major:
            sb.major += 1
        else:
            sb.minor += 1
        sb.last_ev_ns = ev.ts_ns
        sb.phase(ev.phase_seq).add(ev)
        while len(sb.phases) > self.keep_phases:
            del sb.phases[min(sb.phases)]
        return sb
