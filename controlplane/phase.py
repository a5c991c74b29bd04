"""Phase model: is a sandbox running a tool, waiting for the LLM, or idle?

Orchestrators know, and tell us with hints (``tool`` / ``llm-wait`` / ``idle``).  Without a hint
(or after ``hint_ttl`` seconds without a new one) we infer the phase from the cgroup's activity:

* busy    -> TOOL:  CPU usage >= ``active_cpu`` CPUs over the last observation, or its memory PSI
                    ``some avg10`` >= ``active_mem_psi`` % (it is stalled faulting pages back in,
                    i.e. working, so never compress it);
* quiet   -> IDLE:  CPU usage < ``idle_cpu`` CPUs continuously for ``idle_after`` seconds;
* between -> keep the previous inference (hysteresis); UNKNOWN until the first two observations.

Inference never reports LLM_WAIT: only an orchestrator knows the sandbox is waiting for a model
(the scheduler treats IDLE with a longer grace period).  Every change of the effective phase bumps a
per-sandbox ``generation`` so a compression loop can notice "the phase changed under me" between
two chunks.  All methods are thread-safe (hints arrive on socket threads, the scheduler observes
from its own).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from controlplane.abi import Phase


@dataclass
class PhaseConfig:
    hint_ttl: float | None = None  # seconds a hint stays authoritative; None = until the next hint
    active_cpu: float = 0.10  # CPUs
    idle_cpu: float = 0.02  # CPUs
    active_mem_psi: float = 5.0  # % (memory.pressure some avg10)
    idle_after: float = 5.0  # seconds


@dataclass
class PhaseState:
    phase: Phase = Phase.UNKNOWN  # effective phase
    since: float = 0.0  # when the effective phase began
    generation: int = 0
    source: str = "none"  # "hint" | "inferred" | "none"
    hint: Phase | None = None
    hint_at: float | None = None
    inferred: Phase = Phase.UNKNOWN
    last_cpu_usec: int | None = None
    last_obs_at: float | None = None
    quiet_since: float | None = None
    cpu_rate: float = 0.0


@dataclass(frozen=True)
class PhaseView:
    name: str
    phase: Phase
    since: float
    age: float
    generation: int
    source: str
    cpu_rate: float


class PhaseModel:
    def __init__(self, config: PhaseConfig | None = None) -> None:
        self.config = config or PhaseConfig()
        self._lock = threading.Lock()
        self._st: dict[str, PhaseState] = {}

    def add(self, name: str, now: float) -> None:
        with self._lock:
            self._st.setdefault(name, PhaseState(since=now))

    def remove(self, name: str) -> None:
        with self._lock:
            self._st.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._st)

    def hint(self, name: str, phase: Phase, now: float) -> PhaseView:
        """Record an orchestrator's hint; returns the resulting view."""
        with self._lock:
            st = self._st.setdefault(name, PhaseState(since=now))
            st.hint, st.hint_at = phase, now
            self._settle(st, now)
            return self._view(name, st, now)

    def observe(self, name: str, now: float, cpu_usage_usec: int, mem_some_avg10: float) -> None:
        """Feed one activity sample (cpu.stat usage_usec, memory.pressure some avg10)."""
        c = self.config
        with self._lock:
            st = self._st.get(name)
            if st is None:
                return
            if st.last_cpu_usec is not None and st.last_obs_at is not None and now > st.last_obs_at:
                dt = now - st.last_obs_at
                st.cpu_rate = max(0, cpu_usage_usec - st.last_cpu_usec) / 1e6 / dt
                if st.cpu_rate >= c.active_cpu or mem_some_avg10 >= c.active_mem_psi:
                    st.inferred = Phase.TOOL
                    st.quiet_since = None
                elif st.cpu_rate < c.idle_cpu:
                    if st.quiet_since is None:
                        st.quiet_since = st.last_obs_at
                    if now - st.quiet_since >= c.idle_after:
                        st.inferred = Phase.IDLE
                else:
                    st.quiet_since = None
            st.last_cpu_usec, st.last_obs_at = cpu_usage_usec, now
            self._settle(st, now)

    def get(self, name: str, now: float) -> PhaseView | None:
        with self._lock:
            st = self._st.get(name)
            if st is None:
                return None
            self._settle(st, now)
            return self._view(name, st, now)

    def all(self, now: float) -> list[PhaseView]:
        with self._lock:
            out = []
            for name, st in self._st.items():
                self._settle(st, now)
                out.append(self._view(name, st, now))
            return out

    # -- internals (lock held) ---------------------------------------------------------------

    def _settle(self, st: PhaseState, now: float) -> None:
        ttl = self.config.hint_ttl
        if (
            st.hint is not None
            and st.hint_at is not None
            and (ttl is None or now - st.hint_at <= ttl)
        ):
            phase, source = st.hint, "hint"
        elif st.inferred != Phase.UNKNOWN:
            phase, source = st.inferred, "inferred"
        else:
            phase, source = Phase.UNKNOWN, "none"
        if phase != st.phase:
            st.phase = phase
            # a hint dates the phase from when it was given, an inference from now
            st.since = st.hint_at if source == "hint" and st.hint_at is not None else now
            st.generation += 1
        st.source = source

    @staticmethod
    def _view(name: str, st: PhaseState, now: float) -> PhaseView:
        return PhaseView(
            name=name,
            phase=st.phase,
            since=st.since,
            age=max(0.0, now - st.since),
            generation=st.generation,
            source=st.source,
            cpu_rate=st.cpu_rate,
        )
