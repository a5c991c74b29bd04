"""Phase-aware proactive compression (senpai-style: one tick(), every tick logged).

Control law, per tick (every ``interval`` seconds):

1. Read the host: MemAvailable/MemTotal and /proc/pressure/memory.  The host is *under pressure*
   when PSI ``some avg10`` >= ``pressure_psi`` % or less than ``pressure_min_available`` of memory
   is available.
2. Feed every sandbox's activity (cpu.stat usage_usec, memory.pressure) to the phase model, which
   infers a phase for sandboxes without a (fresh) orchestrator hint.
3. Candidates: sandboxes waiting for the LLM for at least ``grace`` seconds, or inferred idle for at
   least ``idle_grace`` seconds, or asked for by hand (``compress``); under host pressure the grace
   periods are skipped.  A sandbox in TOOL (or UNKNOWN) phase is never touched.  A sandbox is
   compressed once per wait: it is *done* when memory.reclaim comes up short (EAGAIN: nothing left
   the kernel can push out) twice in a row, or memory.current reaches ``floor_bytes``; the next
   phase change re-arms it.  One pass leaves the pages the kernel found on the active list (it
   deactivates them instead: the second pass takes them), and a sandbox still waiting
   ``recheck`` seconds after it was done is compressed again, until a pass frees less than
   64 KiB; after that only if it grows by 256 KiB.
   Candidates are served longest-waiting first (oldest phase start), which is what host
   pressure asks for: the sandbox idle the longest is the coldest.
   An orchestrator's ``idle`` hint (the sandbox is parked) counts like a wait: compressed after
   ``grace``; ``idle_grace`` is for idleness only inferred from activity.
   *The hot set stays while the wait is short.*  A sandbox's working set is learned from a
   wait whose compression took everything: what the sandbox holds again when its next wait
   starts (``keep``: what its tool brought back, with what cannot be reclaimed) is what a tool
   needs.  With a ``deep`` judge (the daemon's wait planner, which knows how long this
   sandbox's waits last and whether their ends are announced), a hinted wait is compressed
   down to ``keep`` only, *hot kept*: the kernel takes the pages its LRU finds coldest first,
   and the pages the last tool used are the youngest.  The rest goes once the judge says the
   wait will last long enough to be worth faulting it back (or bringing it back ahead of the
   tool); it is asked every tick, told when the scheduler takes everything on its own (host
   memory pressure, a request by hand, a sandbox with no ``keep`` learned yet), and the
   judge's own plan follows.  An ``idle`` phase takes everything, as does a scheduler without a
   judge.
4. Work: write ``chunk_bytes`` at a time to the candidate's memory.reclaim.  The reclaim (and so the
   compression in azswap's rw_page) runs in *our* thread, so we meter its CPU time: a write that
   took ``dt`` seconds of wall clock and ``dc`` of CPU is followed by a rest of ``dc / b - dt``
   (when positive; a write starved of CPU by busier threads needs none, and with dc = dt it is
   ``dt * (1 - b) / b``), where b is the CPU budget (fraction of one CPU,
   ``cpu_budget``, or ``pressure_cpu_budget`` under pressure, or ``idle_cpu_budget`` while the
   host's CPU PSI ``some avg10`` stays below ``cpu_busy_psi``; for a sandbox the orchestrator
   said waits for the LLM, at least ``wait_cpu_budget``): the writes take at most a fraction
   b of the wall clock.  A hinted wait is the one time the sandbox is certainly not using its
   memory, and a blind proactive reclaimer spends whatever CPU its nice leaves it: so
   compressing a waiting sandbox gets a whole CPU by default (its writes still run at
   ``reclaim_nice``, behind every tool), and the lower ``cpu_budget`` applies to sandboxes only
   inferred idle and to requests by hand.  A tick stops after ``interval * b`` CPU seconds of
   writes, or one ``interval`` of wall clock (writes starved of CPU must not hold up the other
   sandboxes).
   Between two chunks the phase generation is re-checked: a tool hint (or a shutdown) ends the
   loop at once; the chunk in flight either completed or came up short, both of which leave the
   sandbox consistent (memory.reclaim only moves pages to swap; nothing is half-done at our level).
   A *hold* (``hold()``, from the daemon's wait planner when the wait is about to end and the
   sandbox's working set is being brought back) stops the loop the same way and keeps the
   sandbox out of the candidates until ``release()`` or the next phase change.
   Each memory.reclaim write runs at nice ``reclaim_nice`` (default 10): on a busy host the
   tools of other sandboxes get the CPU first, and compression takes what is left.  Only the
   write: the thread's Python bookkeeping runs at the daemon's priority, since a preempted
   low-priority thread holding the GIL would hold up the daemon's answers to phase hints
   (controlplane/priority.py).
5. Mode: the store policy is device-wide.  Before compressing a sandbox whose wait has lasted
   ``dense_after`` seconds the scheduler switches the module to the dense policy (zstd, deeper
   similarity search), otherwise to the fast one (lz4, shallow search).  Objects carry their
   encoding, so the codec switches live.

Everything external is injected (clock, sleep, CPU clock, /proc root, the list of targets with
their Cgroup objects, the policy setter) so the tests drive it with a fake clock and a fake cgroup
tree.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from controlplane import errors
from controlplane.abi import Codec, Phase
from controlplane.cgroup import PROC_ROOT, Cgroup, HostMemory, host_memory
from controlplane.phase import PhaseModel, PhaseView
from controlplane.priority import lowered_priority

log = logging.getLogger("azswap.scheduler")

MiB = 1 << 20


@dataclass
class SchedulerConfig:
    interval: float = 1.0  # seconds between ticks
    grace: float = 0.0  # llm-wait age before compressing (a hinted wait: at once)
    idle_grace: float = 30.0  # inferred-idle age before compressing
    dense_after: float = 10.0  # wait age from which the dense policy is used
    chunk_bytes: int = 4 * MiB  # one memory.reclaim write (a tool hint waits for one at most)
    cpu_budget: float = 0.5  # fraction of one CPU spent in reclaim writes
    pressure_cpu_budget: float = 1.0
    idle_cpu_budget: float = 1.0  # when the host's CPUs are not contended (CPU PSI)
    wait_cpu_budget: float | None = 1.0  # at least this for hinted LLM waits (None: no floor)
    cpu_busy_psi: float = 10.0  # /proc/pressure/cpu some avg10, %: at or above, CPUs are busy
    pressure_psi: float = 10.0  # host memory PSI some avg10, %
    pressure_min_available: float = 0.10  # MemAvailable / MemTotal
    floor_bytes: int = 0  # stop once memory.current <= this
    reclaim_nice: int = 10  # nice of each memory.reclaim write (compression runs in it); 0 = as is
    recheck: float = 1.0  # seconds after "done" to look at a still-waiting sandbox again
    # once a wait's run stops at the kept working set, clear the kept pages' accessed bits:
    # the next wait's reclaim then keeps what the next tool touched, not what older ones did
    age_kept: bool = True
    # after a run that sent pages out, pack the device (multi-page objects, sysfs `pack`) at
    # most once per this many seconds; 0 = never.  A load of a packed page decodes its pack
    pack_every: float = 0.0
    manage_policy: bool = True
    fast_policy: dict[str, int] = field(
        default_factory=lambda: {"codec": int(Codec.LZ4), "sim_effort": 4}
    )
    dense_policy: dict[str, int] = field(
        default_factory=lambda: {"codec": int(Codec.ZSTD), "level": 3, "sim_effort": 8}
    )

    def validate(self) -> None:
        budgets = (self.cpu_budget, self.pressure_cpu_budget, self.idle_cpu_budget,
                   1.0 if self.wait_cpu_budget is None else self.wait_cpu_budget)
        if not all(0 < b <= 1 for b in budgets):
            raise errors.InvalidValue("cpu budget must be in (0, 1]")
        if self.chunk_bytes < 4096:
            raise errors.InvalidValue("chunk must be at least one page")
        if self.interval <= 0 or self.grace < 0 or self.idle_grace < 0:
            raise errors.InvalidValue("interval must be > 0 and grace periods >= 0")
        if self.pack_every < 0:
            raise errors.InvalidValue("pack_every must be >= 0 (0: never)")


@dataclass(frozen=True)
class Target:
    """What the scheduler needs of a sandbox: its name and its cgroup."""

    name: str
    cgroup: Cgroup


@dataclass
class CompressState:
    """Compression of one sandbox during its current phase (reset on every phase change)."""

    generation: int = -1
    phase: str = "unknown"
    phase_since: float = 0.0
    forced: bool = False
    done: bool = False
    active: bool = False
    stop_reason: str = ""
    mem_start: int | None = None
    mem_now: int | None = None
    requested: int = 0
    chunks: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    mode: str = ""
    last_result: str = ""  # how the last run ended (kept across phase changes)
    futile: int = 0  # passes in a row (this phase) that freed less than 64 KiB
    kept_hot: bool = False  # stopped at the learned working set (``HotLevel.keep``)
    aged: int = 0  # 1 once this wait's kept pages' accessed bits were cleared (once a wait)
    approached: bool = False  # the approach listener was told (before the first write to a level)
    below: bool = False  # a write left the sandbox more than KEEP_SLACK below its level
    deep: bool = False  # the working set may go too (decided once per phase)
    # lifetime totals
    total_requested: int = 0
    total_wall: float = 0.0
    total_cpu: float = 0.0
    total_runs: int = 0

    def rearm(self, view: PhaseView) -> None:
        keep = (
            self.total_requested,
            self.total_wall,
            self.total_cpu,
            self.total_runs,
            self.last_result,
        )
        self.__init__()  # type: ignore[misc]
        (
            self.total_requested,
            self.total_wall,
            self.total_cpu,
            self.total_runs,
            self.last_result,
        ) = keep
        self.generation = view.generation
        self.phase = view.phase.label
        self.phase_since = view.since

    @property
    def reclaimed(self) -> int:
        if self.mem_start is None or self.mem_now is None:
            return 0
        return max(0, self.mem_start - self.mem_now)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reclaimed"] = self.reclaimed
        d["latency"] = (
            None if self.finished_at is None else round(self.finished_at - self.phase_since, 6)
        )
        return d


# memory above a wait's kept level (HotLevel.keep) that is left rather than reclaimed
KEEP_SLACK = 256 * 1024


@dataclass
class HotLevel:
    """A sandbox's working set as its waits measured it (kept across phases)."""

    floor: int | None = None  # memory.current after the last wait compressed to the end
    sample: bool = False  # the next wait's start measures the working set...
    tool_seen: bool = False  # ...if a tool phase ran since (it brought the working set back)
    keep: int | None = None  # memory.current to leave in a wait that keeps its hot set
    restored: bool = False  # a prefetch brought the last wait's working set back: no sample


@dataclass
class Action:
    name: str
    phase: str
    age: float
    mode: str
    mem_before: int
    mem_after: int
    requested: int
    chunks: int
    wall: float
    cpu: float
    result: str  # "budget" | "done" | "hot-kept" | "floor" | "stopped:<why>" | "error:<msg>"


@dataclass
class TickReport:
    now: float
    pressure: bool
    host: HostMemory | None
    budget: float
    spent: float
    candidates: list[str]
    actions: list[Action]

    def line(self) -> str:
        h = self.host
        head = (
            f"tick t={self.now:.2f} pressure={'yes' if self.pressure else 'no'}"
            + (f" avail={h.available_fraction:.0%} psi_some={h.psi_some_avg10:.2f}" if h else "")
            + f" budget={self.budget:.3f}s spent={self.spent:.3f}s"
            + f" candidates={','.join(self.candidates) or '-'}"
        )
        parts = [
            f"{a.name} {a.phase} age={a.age:.1f}s {a.mode} mem {a.mem_before / MiB:.1f}M"
            f"->{a.mem_after / MiB:.1f}M req={a.requested / MiB:.0f}M/{a.chunks} "
            f"wall={a.wall:.3f}s cpu={a.cpu:.3f}s {a.result}"
            for a in self.actions
        ]
        return " | ".join([head, *parts])


class Scheduler:
    def __init__(
        self,
        phases: PhaseModel,
        targets: Callable[[], list[Target]],
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        cpu_clock: Callable[[], float] = time.thread_time,
        proc_root: Path = PROC_ROOT,
        policy_setter: Callable[[dict[str, int]], None] | None = None,
        notify: Callable[[dict[str, Any]], None] | None = None,
        deep: Callable[[str, bool], bool] | None = None,
        kept: Callable[[str, bool], None] | None = None,
        approach: Callable[[str], None] | None = None,
        packer: Callable[[], None] | None = None,
    ) -> None:
        self.phases = phases
        self.targets = targets
        self._targets_by_name: dict[str, Target] = {}
        self.config = config or SchedulerConfig()
        self.config.validate()
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.proc_root = Path(proc_root)
        self.policy_setter = policy_setter
        self.notify = notify
        # may a hinted wait's hot set go now? deep(name, must): must=True says it goes anyway
        # (None: always; see "The hot set stays while the wait is short")
        self.deep = deep
        # told (without the scheduler's lock) when a wait's compression stopped at the
        # working set: what is resident then is the working set (a prefetcher learns it).
        # kept(name, exact): exact is False once a write of this wait left the sandbox more
        # than KEEP_SLACK below its level (the kernel reclaims in batches: 6.12 took 1.3 MiB
        # for a 0.3 MiB request), so part of the working set went with it.  approach(name) is
        # called before a wait's first write toward its level: what is resident then holds
        # the whole working set, the record that stands when kept reports exact=False
        self.kept = kept
        self.approach = approach
        # packs the device (sysfs `pack`); called per config.pack_every, from the scheduler
        self.packer = packer
        self.pack_async = True  # in a thread of its own (tests run it inline)
        self._pack_thread: threading.Thread | None = None
        self._last_pack: float | None = None
        self._packs = {"runs": 0, "seconds": 0.0, "errors": 0, "skipped": 0}
        self.levels: dict[str, HotLevel] = {}
        self._pressure = False  # host memory pressure as this tick read it
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sleep = sleep if sleep is not None else self._wake.wait
        self._lock = threading.Lock()
        self._run_ended = threading.Condition(self._lock)  # a run's st.active went False
        self.state: dict[str, CompressState] = {}
        self._force_pending: set[str] = set()
        self._holds: dict[str, int] = {}  # sandbox -> phase generation the hold applies to
        self.mode: str | None = None
        self.last_report: TickReport | None = None

    # -- inputs from other threads ------------------------------------------------------------

    def wake(self) -> None:
        """A hint arrived: cut short any rest so the change is acted on now."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_compress(self, name: str) -> None:
        """Compress ``name`` now, whatever its phase (``azctl compress``), until done."""
        with self._lock:
            # applied by the next tick, after it re-arms on any phase change that came first
            self._force_pending.add(name)
        self.wake()

    def hold(self, name: str, generation: int | None = None) -> None:
        """Compress ``name`` no more in the phase of ``generation`` (default: its current one;
        a hold for a phase that has already ended does nothing): its wait is about to end."""
        if generation is None:
            v = self.phases.get(name, self.clock())
            if v is None:
                return
            generation = v.generation
        with self._lock:
            self._holds[name] = generation

    def release(self, name: str, generation: int | None = None) -> None:
        """Undo :meth:`hold`: the sandbox may be compressed again in this phase (only in the
        phase of ``generation``, when given: a release for a wait that has ended does
        nothing)."""
        with self._lock:
            st = self.state.get(name)
            if generation is not None and (st is None or st.generation != generation):
                return
            self._holds.pop(name, None)
            if st is not None and not st.forced:
                # the wait went on past its prefetch: the hot set goes again
                st.done, st.kept_hot, st.deep = False, False, True

    def wait_run_ended(self, name: str, timeout: float) -> bool:
        """Block until no compression run of ``name`` is in flight, at most ``timeout``
        seconds (real time); False if one still is.  A held sandbox's run stops before its next
        chunk, but a reclaim write already in flight goes on and would take back what a
        prefetch faults in meanwhile."""

        def ended() -> bool:
            st = self.state.get(name)
            return st is None or not st.active

        with self._run_ended:
            return self._run_ended.wait_for(ended, timeout)

    def held(self, name: str, generation: int) -> bool:
        with self._lock:
            return self._holds.get(name) == generation

    def force_pending(self, name: str) -> bool:
        """A compress request for ``name`` that no tick has picked up yet."""
        with self._lock:
            return name in self._force_pending

    def restored(self, name: str) -> None:
        """A prefetch brought the sandbox's working set back in its wait: what its next tool
        leaves resident is no measure of what a tool uses (the prefetch brought pages it may
        not touch), so the next wait keeps the level learned before."""
        with self._lock:
            level = self.levels.get(name)
            if level is not None:
                level.restored = True

    def forget(self, name: str) -> None:
        with self._lock:
            self.state.pop(name, None)
            self._holds.pop(name, None)
            self.levels.pop(name, None)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {n: s.to_dict() for n, s in self.state.items()}

    # -- the control law ------------------------------------------------------------------------

    def host_pressure(self) -> tuple[bool, HostMemory | None]:
        try:
            h = host_memory(self.proc_root)
        except OSError:
            return False, None
        c = self.config
        return (
            h.psi_some_avg10 >= c.pressure_psi or h.available_fraction < c.pressure_min_available,
            h,
        )

    def cpu_idle(self, host: HostMemory | None) -> bool:
        """The host's CPUs are not contended (CPU PSI known and below ``cpu_busy_psi``)."""
        cpu = host.cpu_psi_some_avg10 if host is not None else None
        return cpu is not None and cpu < self.config.cpu_busy_psi

    def tick(self) -> TickReport:
        c = self.config
        now = self.clock()
        pressure, host = self.host_pressure()
        self._pressure = pressure
        targets = {t.name: t for t in self.targets()}
        self._targets_by_name = targets

        # 2. activity samples for the phase inference
        for t in targets.values():
            try:
                mem_psi = t.cgroup.pressure("memory").get("some")
                self.phases.observe(
                    t.name, now, t.cgroup.cpu_usage_usec(), mem_psi.avg10 if mem_psi else 0.0
                )
            except errors.AzswapError:
                continue

        # 3. candidates, longest-waiting first
        views = {v.name: v for v in self.phases.all(now) if v.name in targets}
        # the judge, for every hinted wait whose hot set has not gone yet; asked before the
        # lock is taken (it takes the daemon's planner lock)
        with self._lock:
            forced = set(self._force_pending)
        deep_now: dict[str, bool] = {}
        for name, v in views.items():
            st0 = self.state.get(name)
            with self._lock:
                level = self.levels.setdefault(name, HotLevel())
            if v.phase == Phase.TOOL:
                level.tool_seen = True
            if (self.deep is None or v.phase != Phase.LLM_WAIT
                    or (st0 is not None and st0.generation == v.generation and st0.deep)):
                continue
            new_wait = st0 is None or st0.generation != v.generation
            if new_wait and level.sample and level.tool_seen and level.restored:
                level.sample = False  # what its tool left resident includes restored pages
            elif new_wait and level.sample and level.tool_seen:
                # a new wait after one that took everything and a tool since: what the tool
                # brought back is what a tool uses (nothing learned if it is no more)
                with contextlib.suppress(errors.AzswapError):
                    mem = targets[name].cgroup.memory_current()
                    level.keep = mem if mem > max(level.floor or 0, c.floor_bytes) else None
                    level.sample = False
            if new_wait:
                level.restored = False
            must = pressure or name in forced or level.keep is None
            deep_now[name] = self._ask_deep(v, must)
        candidates: list[PhaseView] = []
        with self._lock:
            for name, v in views.items():
                st = self.state.setdefault(name, CompressState())
                if st.generation != v.generation:
                    st.rearm(v)  # a phase change ends a forced run too
                if deep_now.get(name) and not st.deep:
                    st.deep = True
                    if st.kept_hot:
                        st.kept_hot, st.done = False, False
                if self._holds.get(name, v.generation) != v.generation:
                    del self._holds[name]  # a hold lasts one phase
                if name in self._force_pending:
                    self._force_pending.discard(name)
                    st.forced, st.done = True, False
                if self._eligible(v, st, pressure):
                    candidates.append(v)
        candidates.sort(key=lambda v: (v.since, v.name))

        # 4. work within the budget: more of a CPU under memory pressure, all of one when the
        # host's CPUs are not contended or the sandbox waits for the LLM (the writes' nice
        # still yields to any tool)
        base = c.pressure_cpu_budget if pressure else c.cpu_budget
        if self.cpu_idle(host):
            base = max(base, c.idle_cpu_budget)

        def budget_of(v: PhaseView) -> float:
            if v.phase == Phase.LLM_WAIT and c.wait_cpu_budget is not None:
                return max(base, c.wait_cpu_budget)
            return base

        budget = c.interval * max((budget_of(v) for v in candidates), default=base)
        spent = 0.0
        actions: list[Action] = []
        for v in candidates:
            if spent >= budget or self.stopping or self.clock() - now >= c.interval:
                break
            act = self._compress(v, targets[v.name].cgroup, budget_of(v), budget - spent)
            spent += act.cpu
            actions.append(act)

        report = TickReport(
            now, pressure, host, budget, spent, [v.name for v in candidates], actions
        )
        # Ticks that acted or had candidates are logged at INFO, quiet ones at DEBUG (a 1 Hz
        # loop over idle sandboxes would otherwise flood the journal with identical lines).
        log.log(logging.INFO if candidates else logging.DEBUG, "%s", report.line())
        self.last_report = report
        return report

    def _eligible(self, v: PhaseView, st: CompressState, pressure: bool) -> bool:
        c = self.config
        if st.kept_hot and not st.forced:
            # until the judge lets the working set go (tick, above), or the sandbox grew
            if not self._grew_since_done(v.name, st):
                return False
            st.done = False
        if st.done and v.phase in (Phase.LLM_WAIT, Phase.IDLE) and not st.forced:
            self._maybe_recheck(v, st)
        if st.done or (v.phase == Phase.TOOL and not st.forced):
            return False
        if self._holds.get(v.name) == v.generation and not st.forced:
            return False
        if st.forced:
            return True
        if v.phase == Phase.LLM_WAIT:
            return pressure or v.age >= c.grace
        if v.phase == Phase.IDLE:
            return pressure or v.age >= (c.grace if v.source == "hint" else c.idle_grace)
        return False

    def _grew_since_done(self, name: str, st: CompressState) -> bool:
        """A run that stopped ``recheck`` seconds ago, and the sandbox grew 256 KiB since."""
        if st.finished_at is None or self.clock() - st.finished_at < self.config.recheck:
            return False
        target = self._targets_by_name.get(name)
        try:
            mem = target.cgroup.memory_current() if target is not None else 0
        except errors.AzswapError:
            return False
        st.finished_at = self.clock()  # look again after another recheck period
        return mem > (st.mem_now or 0) + 256 * 1024

    def _ask_deep(self, v: PhaseView, must: bool) -> bool:
        """May this run take the sandbox's hot set (its learned working set) too?  ``must``:
        it will, whatever the judge thinks (the judge is told, so that its plan follows)."""
        if self.deep is None or v.phase != Phase.LLM_WAIT:
            return True
        try:
            return bool(self.deep(v.name, must)) or must
        except Exception:  # a judge that fails must not stop compression: take everything
            log.exception("deep judge for %s failed", v.name)
            return True

    def _maybe_recheck(self, v: PhaseView, st: CompressState) -> None:
        """A done sandbox, still waiting: compress it again if a pass may free something."""
        if st.finished_at is None or self.clock() - st.finished_at < self.config.recheck:
            return
        if v.name not in self._targets_by_name:
            return
        if st.futile < 2 or self._grew_since_done(v.name, st):
            st.done = False

    def _still_wanted(self, name: str, generation: int) -> str:
        """'' while the sandbox should keep being compressed, else why not."""
        if self.stopping:
            return "shutdown"
        v = self.phases.get(name, self.clock())
        if v is None:
            return "unregistered"
        if v.generation != generation:
            return f"phase={v.phase.label}"
        if self.held(name, generation):
            return "held"
        return ""

    def _compress(self, v: PhaseView, cg: Cgroup, b: float, budget: float) -> Action:
        c = self.config
        st = self.state[v.name]
        mode = "dense" if v.age >= c.dense_after else "fast"
        self._ensure_mode(mode)
        try:
            mem_before = cg.memory_current()
        except errors.AzswapError as e:
            return Action(v.name, v.phase.label, v.age, mode, 0, 0, 0, 0, 0, 0, f"error:{e}")
        with self._lock:
            level = self.levels.setdefault(v.name, HotLevel())
            st.active, st.mode = True, mode
            if st.mem_start is None:
                st.mem_start, st.started_at = mem_before, self.clock()
                st.total_runs += 1
        # the working set stays until the judge lets it go (st.deep)
        keep = (level.keep if self.deep is not None and v.phase == Phase.LLM_WAIT
                and not st.deep and not st.forced else None)
        mem, wall, cpu, requested, chunks = mem_before, 0.0, 0.0, 0, 0
        short = 0  # passes in a row that came up short
        result = "budget"
        try:
            t_begin = self.clock()
            # CPU seconds within the budget, and no longer than one interval of wall clock (a
            # write starved of CPU must not keep the other sandboxes waiting)
            while cpu < budget and self.clock() - t_begin < c.interval:
                why = self._still_wanted(v.name, v.generation)
                if why:
                    result = f"stopped:{why}"
                    break
                # within KEEP_SLACK of the level counts as there: a smaller write would make the
                # kernel reclaim a whole batch or more (6.12 took 1.3 MiB for a 0.1 MiB
                # request), out of the working set the level is there to keep
                if keep is not None and mem <= keep + KEEP_SLACK:
                    if self._ask_deep(v, self._pressure):
                        with self._lock:
                            st.deep = True
                        keep = None
                    else:
                        result = "hot-kept"
                        break
                if mem <= c.floor_bytes:
                    result = "floor"
                    break
                chunk = min(c.chunk_bytes, mem - c.floor_bytes,
                            mem - keep if keep is not None else c.chunk_bytes)
                chunk = max(4096, chunk - chunk % 4096)
                if keep is not None and not st.approached and self.approach is not None:
                    with self._lock:
                        st.approached = True
                    try:
                        self.approach(v.name)
                    except Exception:  # a listener that fails must not stop compression
                        log.exception("approach listener for %s failed", v.name)
                    why = self._still_wanted(v.name, v.generation)  # the record took a while
                    if why:
                        result = f"stopped:{why}"
                        break
                t0, c0 = self.clock(), self.cpu_clock()
                with lowered_priority(c.reclaim_nice):
                    full = cg.reclaim(chunk)
                dt, dc = self.clock() - t0, self.cpu_clock() - c0
                wall, cpu = wall + dt, cpu + dc
                requested, chunks = requested + chunk, chunks + 1
                mem = cg.memory_current()
                with self._lock:
                    st.mem_now, st.requested, st.chunks = mem, st.requested + chunk, st.chunks + 1
                    if keep is not None and mem + KEEP_SLACK < keep:
                        st.below = True
                    st.wall, st.cpu = st.wall + dt, st.cpu + dc
                    st.total_requested += chunk
                    st.total_wall, st.total_cpu = st.total_wall + dt, st.total_cpu + dc
                # a pass that comes up short deactivated what it found on the active list (the
                # pages the tool just used) instead of taking it: the next pass takes those
                short = 0 if full else short + 1
                if short >= 2:
                    result = "done"
                    break
                self._rest(dc / b - dt, v.name, v.generation)
        except errors.AzswapError as e:
            result = f"error:{e}"
        with self._lock:
            st.active = False
            self._run_ended.notify_all()
            st.mem_now = mem
            st.last_result = result
            if result in ("done", "floor"):
                st.done, st.forced, st.finished_at = True, False, self.clock()
                freed = (mem_before - mem) if chunks else 0
                st.futile = st.futile + 1 if freed < 64 * 1024 else 0
                if v.phase == Phase.LLM_WAIT and keep is None:
                    # everything went: the next wait measures what the tool brings back
                    level.floor, level.sample, level.tool_seen = mem, True, False
            elif result == "hot-kept":
                st.done, st.kept_hot, st.finished_at = True, True, self.clock()
            elif result.startswith("stopped") or result.startswith("error"):
                st.stop_reason = result
            summary = st.to_dict()
        # stopped at the working set, and no tool began meanwhile
        if result == "hot-kept" and not self._still_wanted(v.name, v.generation):
            if self.kept is not None:
                try:
                    self.kept(v.name, not st.below)
                except Exception:  # a listener that fails must not stop compression
                    log.exception("kept-level listener for %s failed", v.name)
            if c.age_kept and not st.aged:  # once per wait (a kept sandbox that grows runs again)
                self._age(v.name, cg, st)
        if self.notify is not None and result != "budget":
            self.notify({"event": "compress", "name": v.name, "result": result, "state": summary})
        if chunks and result in ("done", "floor", "hot-kept"):
            self._maybe_pack()
        return Action(
            v.name,
            v.phase.label,
            v.age,
            mode,
            mem_before,
            mem,
            requested,
            chunks,
            wall,
            cpu,
            result,
        )

    def _maybe_pack(self) -> None:
        """Pack the device after a run that sent pages out, at most once per pack_every, in a
        thread of its own at the compression's nice: the write walks the whole device, and the
        scheduler must not wait for it.  One at a time: a pack still running skips this one."""
        every = self.config.pack_every
        now = self.clock()
        if self.packer is None or every <= 0:
            return
        if self._last_pack is not None and now - self._last_pack < every:
            return
        with self._lock:
            if self._pack_thread is not None and self._pack_thread.is_alive():
                self._packs["skipped"] += 1
                return
            self._last_pack = now
            if not self.pack_async:
                self._pack_thread = None
            else:
                self._pack_thread = threading.Thread(
                    target=self._pack, name="azswap-pack", daemon=True
                )
                self._pack_thread.start()
                return
        self._pack()

    def _pack(self) -> None:
        t0 = self.clock()
        try:
            with lowered_priority(self.config.reclaim_nice):
                self.packer()  # type: ignore[misc]
        except Exception as e:  # logged and counted, never the scheduler's end
            if isinstance(e, (OSError, errors.AzswapError)):  # no `pack`, a reset device
                log.warning("pack: %s", e)
            else:
                log.exception("pack failed")
            with self._lock:
                self._packs["errors"] += 1
            return
        with self._lock:
            self._packs["runs"] += 1
            self._packs["seconds"] += self.clock() - t0

    def wait_pack(self, timeout: float | None = None) -> None:
        """Wait for a pack in progress (tests, shutdown)."""
        t = self._pack_thread
        if t is not None:
            t.join(timeout)

    def pack_stats(self) -> dict[str, float]:
        """Packs done (runs), their wall seconds, failures, and packs skipped because the
        previous one was still running."""
        with self._lock:
            return dict(self._packs)

    def _age(self, name: str, cg: Cgroup, st: CompressState) -> None:
        """Clear the accessed bits of the pages a wait kept (see SchedulerConfig.age_kept)."""
        try:
            n = cg.clear_referenced(self.proc_root)
        except OSError as e:  # the cgroup went away: nothing kept to age
            log.debug("aging %s: %s", name, e)
            return
        except errors.AzswapError as e:  # the root cgroup
            log.warning("aging %s: %s", name, e)
            return
        if n:  # else no process was left to age (a later run of this wait tries again)
            with self._lock:
                st.aged += 1
        log.debug("aging %s: accessed bits of %d processes cleared", name, n)

    def _rest(self, seconds: float, name: str, generation: int) -> None:
        """Sleep ``seconds`` (the throttle), waking early only if this sandbox's phase changes."""
        deadline = self.clock() + seconds
        while True:
            left = deadline - self.clock()
            if left <= 0 or self._still_wanted(name, generation):
                return
            self._sleep(left)
            self._wake.clear()

    def _ensure_mode(self, mode: str) -> None:
        c = self.config
        if not c.manage_policy or self.policy_setter is None or mode == self.mode:
            return
        pol = dict(c.dense_policy if mode == "dense" else c.fast_policy)
        try:
            self.policy_setter(dict(pol))
        except errors.AzswapError as e:
            log.warning("policy %s: %s", mode, e)
            return
        log.info("policy: %s mode %s", mode, pol)
        self.mode = mode

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Tick every ``interval`` until stop(); a hint (wake()) starts the next tick early."""
        while not self.stopping:
            t0 = self.clock()
            try:
                self.tick()
            except Exception:  # keep the daemon alive; the traceback goes to the log
                log.exception("scheduler tick failed")
            left = self.config.interval - (self.clock() - t0)
            if left > 0 and not self.stopping:
                self._wake.wait(left)
            self._wake.clear()
