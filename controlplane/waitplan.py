"""When to bring a waiting sandbox back: the daemon's plan for each LLM wait.

A sandbox waiting for the LLM is compressed as soon as the wait starts (the scheduler).  Its
working set should be back in memory when the wait ends, so that the tool that runs next does
not fault it in page by page.  Only the orchestrator knows when the wait really ends (the tool
hint), and by then it is too late to prefetch without making the tool wait.  So the planner
starts the prefetch when the orchestrator announces the end (the model starts streaming its
tool call), and with ``predict_unannounced`` predicts the end of a wait nobody announces from
what the sandbox's earlier waits measured, and starts the prefetch that long before it.
Everything here is arithmetic over a clock the caller passes in: the daemon
runs it (controlplane/daemon.py), the tests drive it with made-up clocks.

The control law, per sandbox:

* History: the lengths of its last ``history`` waits (llm-wait hint -> tool hint), and how long
  its last prefetches took.  A sandbox with fewer than ``min_samples`` waits borrows the fleet's
  (every sandbox's, most recent first), so a new sandbox of a known workload is predicted from
  its first wait on; with fewer than that in the whole fleet nothing is predicted.
* Lead: a prefetch must start ``lead`` seconds before the wait ends to be done in time:
  ``lead_factor`` x the median of its recent prefetch times + ``lead_pad`` (``default_lead``
  before it has one), at most ``max_lead``; on a busy host (CPU pressure) prefetches run slower,
  so the lead is multiplied by ``busy_lead_factor``.
* Fire time: waits are heavy-tailed, so one fixed quantile is either too early for long waits
  (the working set sits in memory for most of the wait) or too late for short ones.  Instead,
  the planner fires at the first elapsed time e at which the wait is likely to end within the
  lead, given that it has lasted e so far (the empirical hazard over the history):

      hazard(e) = #(waits in (e, e + lead]) / #(waits > e)  >=  threshold

  If no such e exists (the history says nothing about waits this long), the planner does not
  fire: the tool faults its pages in (``hint_prefetch``: a prefetch beside it).
* Recompress: a wait that is still going ``recompress_after`` seconds after a prefetch finished
  was longer than predicted.  If the history says it will probably go on for a while yet (the
  median remaining wait of the longer ones, at least ``recompress_min_remaining`` seconds), the
  scheduler may compress the sandbox again and the planner looks for the next fire time from
  the current age (at most ``max_fires`` prefetches a wait); otherwise the working set stays.
* Outcomes, per sandbox: a *hit* (the prefetch finished before the tool hint and was not
  followed by a recompress), *late* (the tool hint came first: the tool paid for the rest),
  *early* (followed by a recompress: memory was held for nothing).  An early prefetch raises
  the sandbox's threshold (the next one fires later), a hit relaxes it back; a late one is
  answered by the lead, which follows the measured prefetch times.  A sandbox whose
  last ``judge_waits`` planned waits hit less than ``min_hit_rate`` of the time is not
  predicted for the next ``pause_waits`` waits: its prefetch comes with the tool hint.
* A host short of CPU (the daemon sets ``busy`` from /proc/pressure/cpu): a prefetch then
  competes with the running tools for the CPU they lack, so waits that start then are not
  predicted (``predict_when_busy`` off) and their tools fault their pages in on use.
* Announced ends: an orchestrator that streams the model's answer knows the wait is ending
  when the first tokens of a tool call arrive, seconds before the tool hint.  ``wait_ending``
  makes the prefetch due (unless this wait's prefetch already ran or runs, or the host is
  short of CPU; the daemon skips one with nothing recorded, in the sandbox's first announced
  wait) and keeps the wait from being compressed again; a wait without the announcement is
  predicted as above (with ``predict_unannounced``).  How long the model streams
  (announcement -> tool hint) is recorded like the waits; once ``min_samples`` are known
  (the sandbox's, with the fleet's while it has fewer) the prefetch is due ``lead`` before the
  ``stream_quantile`` quantile of those streams rather than at once:
  the working set stays compressed for most of the stream, and only the streams shorter than
  that quantile find the prefetch still running or not yet started when their tool begins
  (counted ``late``, like a prediction that came too late; by design about ``stream_quantile``
  of them).  When the announcement makes a prefetch due, the daemon holds the scheduler from
  then on: nothing more goes that the prefetch would read back.
* Only announced ends (``predict_unannounced`` off, the daemon's default): the hazard rule
  plans nothing, so only a wait whose end is announced has its working set brought back
  before its tool.  A sandbox that does not announce keeps its working set through its waits
  (below) and its tools fault back what went in a long one; a prefetch the hazard rule fired
  in the phase benchmark's heavy-tailed waits was as often early as on time, and competed
  with the running tools.
* The working set stays until the wait has earned it (``keep_hot``).  The scheduler
  compresses a waiting sandbox down to the working set its earlier waits measured (what is
  left is what its tool uses, and what goes is the coldest of the rest), and asks
  :meth:`WaitPlanner.deep_ok` before it takes that too.  Waits are heavy-tailed and their ends
  nearly memoryless, so no age makes an end predictable; what grows with the age is how long
  the wait is still expected to last.  The working set goes once that mean remaining wait
  (over the recorded waits longer than the current age) reaches ``deep_min_remaining`` seconds,
  or at once for a sandbox whose recent waits were announced while its waits are predicted
  (``wait_ending``: the announcement brings it back ahead of the tool; with
  ``deep_after_kept``, once the compression reached it, :meth:`WaitPlanner.kept_level`).  A
  wait longer than every recorded one, or of a sandbox (and fleet) with fewer than
  ``min_samples`` waits recorded, has no history to go by: it is expected to last about as
  long again as it has lasted (the rule for a heavy tail: the longer a wait has run, the
  longer it is likely to run on), so its working set goes once its age reaches
  ``deep_min_remaining`` (or a fixed ``deep_after`` seconds, if set).  A wait that outlives
  the history is the long one, where keeping the working set costs most.  The working set
  also goes whenever the scheduler takes it
  anyway (``must``: host memory pressure, a request by hand, nothing measured yet).  Only then
  is this wait's prefetch planned: the pages a prefetch brings back are the working set's.  A
  tool after a wait that kept it faults in little more than the pages its working set drifted
  to.
* Without a prefetcher (``restores`` off: the daemon with ``--no-prefetch``) nothing is
  planned: no prefetch is due, the scheduler is never held for one, an announced end only
  keeps a working set that has not gone yet, and a tool after a wait whose working set went
  faults it back in.
* Never worse than compressing blind: without a prediction the tool faults in what it touches,
  and the scheduler never compresses during a tool phase.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from controlplane import errors


@dataclass
class PlanConfig:
    history: int = 32  # waits kept per sandbox
    fleet_history: int = 128  # waits kept for the whole fleet
    min_samples: int = 5  # waits needed to predict (own, else the fleet's)
    threshold: float = 0.5  # hazard at which the prefetch starts
    threshold_max: float = 0.8
    early_factor: float = 1.15  # threshold x this after a recompress
    relax_factor: float = 0.95  # threshold x this (down to `threshold`) after a hit
    max_fires: int = 2  # planned prefetches per wait
    recompress_min_remaining: float = 3.0  # median remaining wait needed to compress again
    judge_waits: int = 8  # planned waits an outcome score looks back on
    min_hit_rate: float = 0.25  # below it (over judge_waits), the sandbox is not predicted...
    pause_waits: int = 8  # ...for this many waits
    default_lead: float = 0.5  # seconds, before any prefetch was timed
    lead_factor: float = 1.5
    lead_pad: float = 0.05
    max_lead: float = 5.0
    busy_lead_factor: float = 2.0
    predict_when_busy: bool = False  # under CPU pressure, let tools fault their pages in
    busy_psi: float = 40.0  # /proc/pressure/cpu some avg10 (%) from which the host is busy
    recompress_after: float = 1.0  # seconds after a finished prefetch with the wait still on
    keep_hot: bool = True  # a wait's hot set goes only when deep_ok() says so
    deep_min_remaining: float = 4.0  # mean remaining wait (s) from which the hot set goes
    # wait age (s) from which it goes when the history has no say (None: once the age reaches
    # deep_min_remaining, the wait being expected to last as long again)
    deep_after: float | None = None
    announced_share: float = 0.5  # of the last judge_waits waits announced: hot set goes at once
    # a prefetcher brings an announced wait's working set back (without one, the announcement
    # cannot, and an announced wait keeps its working set like any other)
    restores: bool = True
    # an announced wait's working set goes once the wait's compression reached it
    # (kept_level()), not at once: a prefetcher that learns the working set from what is
    # resident then (controlplane/residentset.py) sees it
    deep_after_kept: bool = False
    # an announced wait's prefetch is due ``lead`` before this quantile of the sandbox's
    # recorded streams (announcement -> tool hint); 0: at the announcement
    stream_quantile: float = 0.2
    # plan a prefetch before the predicted end of a wait whose end is not announced (the hazard
    # rule); off: only a wait whose end is announced (wait_ending) has its working set brought
    # back, and a sandbox that never announces is never prefetched for
    predict_unannounced: bool = False
    # every sandbox's working set is recorded (learns()): a tool hint may prefetch any of them
    # (the daemon's hint_prefetch)
    record_all: bool = False

    def validate(self) -> None:
        if self.history < 1 or self.fleet_history < 1 or self.min_samples < 1:
            raise errors.InvalidValue("history sizes must be >= 1")
        if not 0 < self.threshold <= self.threshold_max <= 1:
            raise errors.InvalidValue("need 0 < threshold <= threshold_max <= 1")
        if self.max_fires < 1 or self.judge_waits < 1 or self.pause_waits < 0:
            raise errors.InvalidValue("max_fires and judge_waits must be >= 1, pause_waits >= 0")
        if not 0 <= self.min_hit_rate <= 1 or self.recompress_min_remaining < 0:
            raise errors.InvalidValue("min_hit_rate in [0, 1], recompress_min_remaining >= 0")
        if self.default_lead < 0 or self.max_lead <= 0:
            raise errors.InvalidValue("max_lead must be > 0, default_lead >= 0")
        if self.recompress_after < 0:
            raise errors.InvalidValue("recompress_after must be >= 0")
        if self.deep_min_remaining < 0 or (self.deep_after is not None and self.deep_after < 0):
            raise errors.InvalidValue("deep_min_remaining and deep_after must be >= 0")
        if not 0 < self.announced_share <= 1:
            raise errors.InvalidValue("announced_share must be in (0, 1]")
        if not 0 <= self.stream_quantile < 1:
            raise errors.InvalidValue("stream_quantile must be in [0, 1)")


class Action(Enum):
    PREFETCH = "prefetch"  # bring the working set back now (the wait is about to end)
    RECOMPRESS = "recompress"  # the wait went on: the scheduler may compress again


def fire_time(waits: list[float], since: float, lead: float,
              threshold: float) -> float | None:
    """The first wait age >= ``since`` at which the empirical hazard of the wait ending within
    ``lead`` reaches ``threshold``; None when the waits say nothing about waits that long."""
    ws = sorted(waits)
    if not ws or ws[-1] <= since:
        return None
    # The hazard only changes where a recorded wait enters the window (age w - lead) or ends
    # (age w), and holds from each such age to the next: those ages are the only candidates.
    ages = sorted({since, *(w - lead for w in ws if w - lead > since),
                   *(w for w in ws if w > since)})
    for e in ages:
        alive = [w for w in ws if w > e]
        if not alive:
            break
        ending = sum(1 for w in alive if w <= e + lead)
        if ending / len(alive) >= threshold:
            return e
    return None


@dataclass
class SandboxPlan:
    waits: deque[float]
    prefetch_s: deque[float] = field(default_factory=lambda: deque(maxlen=8))
    outcomes: deque[str] = field(default_factory=lambda: deque(maxlen=8))
    threshold: float = 0.5
    paused: int = 0  # waits left without prediction
    epoch: int = 0  # bumped by every wait: a prefetch of an earlier wait is told apart
    inflight: int = 0  # planned prefetches running (of any wait)
    # the wait in progress (wait_start None when not waiting)
    wait_start: float | None = None
    fire_at: float | None = None  # absolute time of the planned prefetch
    fires: int = 0  # planned prefetches in this wait
    prefetching: bool = False
    prefetched_at: float | None = None  # end of this wait's last prefetch
    recompress_at: float | None = None
    recompressed: bool = False  # compressed again, no prefetch planned since
    went_on: bool = False  # this wait was compressed again after a prefetch
    ending: bool = False  # the orchestrator said this wait ends soon (the model streams)
    ending_at: float | None = None  # when it said so
    streams: deque[float] = field(default_factory=deque)  # announcement -> tool hint, seconds
    deep: bool = True  # this wait's hot set may go (keep_hot: once deep_ok() said so)
    predict: bool = False  # this wait may have a planned prefetch (not paused, not busy)
    after_kept: bool = False  # announced: the working set goes once compression reached it
    kept_reached: bool = False  # this wait's compression reached the working set
    announced: deque[bool] = field(default_factory=lambda: deque(maxlen=8))  # per wait
    # counts, for the stats
    waits_seen: int = 0
    fired: int = 0
    hits: int = 0
    late: int = 0
    early: int = 0
    on_hint: int = 0
    busy_waits: int = 0  # waits not predicted because the host was short of CPU
    endings: int = 0  # waits whose end was announced (wait_ending)
    deep_waits: int = 0  # waits whose hot set went (keep_hot)
    kept: int = 0  # waits that ended with the hot set kept


@dataclass(frozen=True)
class ToolStart:
    """What the daemon does on a tool hint."""

    prefetch: bool  # start a prefetch now (nothing brought the working set back in this wait)
    # "predicted" | "in-flight" | "no-prediction" | "not-fired" | "recompressed" | "kept" (the
    # hot set never went: nothing to bring back) | "compressed" (it went and, without a
    # prefetcher, nothing brought it back)
    reason: str
    wait_s: float | None


class WaitPlanner:
    """Per-sandbox wait histories and the prefetch each current wait is planned for.

    Not thread-safe on its own: the daemon calls it under one lock.
    """

    def __init__(self, config: PlanConfig | None = None) -> None:
        self.config = config or PlanConfig()
        self.config.validate()
        self._sb: dict[str, SandboxPlan] = {}
        self._fleet: deque[float] = deque(maxlen=self.config.fleet_history)
        self._fleet_streams: deque[float] = deque(maxlen=self.config.fleet_history)
        self.busy = False  # host short of CPU: longer leads

    def _get(self, name: str) -> SandboxPlan:
        sp = self._sb.get(name)
        if sp is None:
            c = self.config
            sp = SandboxPlan(deque(maxlen=c.history), threshold=c.threshold,
                             outcomes=deque(maxlen=c.judge_waits),
                             announced=deque(maxlen=c.judge_waits),
                             streams=deque(maxlen=c.history))
            self._sb[name] = sp
        return sp

    def forget(self, name: str) -> None:
        self._sb.pop(name, None)

    # -- inputs -----------------------------------------------------------------------------

    def lead(self, name: str) -> float:
        c, sp = self.config, self._sb.get(name)
        if sp is not None and sp.prefetch_s:
            lead = c.lead_factor * statistics.median(sp.prefetch_s) + c.lead_pad
        else:
            lead = c.default_lead
        if self.busy:
            lead *= c.busy_lead_factor
        return min(lead, c.max_lead)

    def samples(self, name: str) -> list[float]:
        """The waits a prediction for ``name`` rests on (empty: too few to predict)."""
        c, sp = self.config, self._get(name)
        if len(sp.waits) >= c.min_samples:
            return list(sp.waits)
        if len(self._fleet) >= c.min_samples:
            return list(sp.waits) + list(self._fleet)[-c.history:]
        return []

    def stream_delay(self, name: str) -> float:
        """Seconds from an announcement to its prefetch: ``lead`` before the
        ``stream_quantile`` quantile (the lower one of nearest ranks) of the recorded streams:
        the sandbox's once it has ``min_samples``, else those and the fleet's last ``history``
        (as samples() does for waits) once the fleet has ``min_samples``; never negative, and
        0 without enough of them."""
        c, sp = self.config, self._sb.get(name)
        if c.stream_quantile <= 0:
            return 0.0
        xs = list(sp.streams) if sp is not None else []
        if len(xs) < c.min_samples:
            if len(self._fleet_streams) < c.min_samples:
                return 0.0
            xs += list(self._fleet_streams)[-c.history:]
        xs.sort()
        return max(0.0, xs[int(c.stream_quantile * (len(xs) - 1))] - self.lead(name))

    def wait_started(self, name: str, now: float) -> float | None:
        """An llm-wait hint: plan this wait's prefetch; returns its absolute time or None."""
        sp = self._get(name)
        sp.epoch += 1
        sp.wait_start, sp.prefetching, sp.fires = now, False, 0
        sp.prefetched_at = sp.recompress_at = None
        sp.recompressed = sp.went_on = sp.ending = False
        sp.fire_at, sp.predict, sp.after_kept, sp.kept_reached = None, False, False, False
        sp.ending_at = None
        if sp.paused > 0:
            sp.paused -= 1
        elif self.busy and not self.config.predict_when_busy:
            sp.busy_waits += 1
        else:
            sp.predict = True
        sp.deep = not self.config.keep_hot
        if sp.deep:
            if sp.predict:
                sp.fire_at = self._plan(name, 0.0)
        elif sp.predict and self.config.restores and self._announced(sp):
            if self.config.deep_after_kept:
                sp.after_kept = True  # see kept_level()
            else:
                self._go_deep(name, sp, 0.0)
        return sp.fire_at

    def _announced(self, sp: SandboxPlan) -> bool:
        """Were enough of this sandbox's recent waits announced to count on the next one?"""
        return (bool(sp.announced)
                and sum(sp.announced) / len(sp.announced) >= self.config.announced_share)

    def _go_deep(self, name: str, sp: SandboxPlan, age: float) -> None:
        sp.deep = True
        sp.deep_waits += 1
        if sp.predict:
            sp.fire_at = self._plan(name, age)

    def deep_ok(self, name: str, now: float, must: bool = False) -> bool:
        """May the scheduler take this waiting sandbox's hot set (the pages its last tool used)
        now?  Yes once the wait is expected to last long enough (see the module's docstring);
        the answer stays yes for the rest of the wait, and this wait's prefetch is planned from
        then on.  ``must``: the scheduler takes it anyway (memory pressure, a request by hand,
        no working set learned yet): plan as if the answer had been yes."""
        c = self.config
        sp = self._sb.get(name)
        if sp is None or sp.wait_start is None or sp.deep:
            return True  # not a wait the planner follows, or already decided
        age = max(0.0, now - sp.wait_start)
        if must:
            self._go_deep(name, sp, age)
            if sp.ending and sp.predict and c.restores and sp.ending_at is not None:
                # its end was announced: the working set comes back when the announcement
                # made it due, or when the prediction planned it if that is earlier
                at = max(now, sp.ending_at + self.stream_delay(name))
                sp.fire_at = at if sp.fire_at is None else min(sp.fire_at, at)
            return True
        if sp.ending:
            return False  # it ends soon: the hot set is what the tool will use
        if c.deep_after_kept and not sp.kept_reached and self.learns(name):
            return False  # not before the prefetcher has recorded it (kept_level())
        longer = [w for w in self.samples(name) if w > age]
        if longer:
            ok = statistics.fmean(longer) - age >= c.deep_min_remaining
        else:  # longer than every recorded wait (or none): expected to last as long again
            ok = age >= (c.deep_min_remaining if c.deep_after is None else c.deep_after)
        if ok:
            self._go_deep(name, sp, age)
        return ok

    def kept_level(self, name: str, now: float) -> bool:
        """The scheduler compressed this waiting sandbox down to its working set (and the
        prefetcher learnt it).  Returns whether the working set goes now: in a wait of an
        announced sandbox (``deep_after_kept``) whose end was not announced yet.  With
        ``deep_after_kept`` no wait's working set goes before this (unless it must): what is
        resident then is what a prefetcher that learns from residency records.  Only for a
        sandbox whose working set is recorded (learns()); another goes by the age rule
        alone."""
        sp = self._sb.get(name)
        if sp is None or sp.wait_start is None:
            return False
        sp.kept_reached = True
        if sp.deep or not sp.after_kept or sp.ending:
            return False
        # no prediction: the announcement brings the working set back (a predicted prefetch
        # would fire before it as often as not, and hold memory for nothing)
        sp.deep = True
        sp.deep_waits += 1
        return True

    def _plan(self, name: str, since: float) -> float | None:
        sp = self._get(name)
        assert sp.wait_start is not None
        if not self.config.restores:
            return None  # nothing would bring the working set back
        if not self.config.predict_unannounced:
            return None  # only an announcement brings it back
        at = fire_time(self.samples(name), since, self.lead(name), sp.threshold)
        return None if at is None else sp.wait_start + at

    def _outcome(self, sp: SandboxPlan, what: str) -> None:
        c = self.config
        sp.outcomes.append(what)
        if what == "hit":
            sp.hits += 1
            sp.threshold = max(c.threshold, sp.threshold * c.relax_factor)
        elif what == "late":
            sp.late += 1
        else:
            sp.early += 1
            sp.threshold = min(c.threshold_max, sp.threshold * c.early_factor)
        if len(sp.outcomes) >= c.judge_waits:
            rate = sum(o == "hit" for o in sp.outcomes) / len(sp.outcomes)
            if rate < c.min_hit_rate:
                sp.paused = c.pause_waits
                sp.outcomes.clear()

    def tool_started(self, name: str, now: float) -> ToolStart:
        """A tool hint: learn the wait's length and the plan's outcome; say whether to
        prefetch now."""
        sp = self._get(name)
        if sp.wait_start is None:  # a tool hint without a wait before it: nothing to learn
            return ToolStart(True, "no-prediction", None)
        wait = max(0.0, now - sp.wait_start)
        sp.waits.append(wait)
        self._fleet.append(wait)
        sp.waits_seen += 1
        sp.announced.append(sp.ending)
        if sp.ending_at is not None:
            stream = max(0.0, now - sp.ending_at)
            sp.streams.append(stream)
            self._fleet_streams.append(stream)
            sp.ending_at = None
        if not sp.deep:
            # the hot set never went: the tool faults in only what its working set drifted to
            sp.kept += 1
            sp.wait_start = sp.fire_at = sp.recompress_at = sp.prefetched_at = None
            return ToolStart(False, "kept", wait)
        if not self.config.restores:
            # the working set went and nothing brings it back: the tool faults it in
            sp.wait_start = sp.fire_at = sp.recompress_at = sp.prefetched_at = None
            return ToolStart(False, "compressed", wait)
        if sp.prefetching:
            out = ToolStart(False, "in-flight", wait)
        elif sp.prefetched_at is not None and not sp.recompressed:
            out = ToolStart(False, "predicted", wait)
        else:
            reason = ("recompressed" if sp.recompressed else
                      "not-fired" if sp.fire_at is not None else "no-prediction")
            out = ToolStart(True, reason, wait)
            sp.on_hint += 1
        if sp.went_on:
            self._outcome(sp, "early")
        elif out.reason in ("in-flight", "not-fired"):
            self._outcome(sp, "late")
        elif out.reason == "predicted":
            self._outcome(sp, "hit")
        sp.wait_start = sp.fire_at = sp.recompress_at = sp.prefetched_at = None
        sp.prefetching = False
        return out

    def wait_ending(self, name: str, now: float) -> bool:
        """The orchestrator says the wait ends soon (the model has begun to stream its answer or
        tool call): the prefetch is made due (at once, or stream_delay() from now; an earlier
        planned one stays) unless one ran or runs in this wait, and the wait is not compressed
        again. Returns whether a prefetch was made due."""
        sp = self._get(name)
        if sp.wait_start is None or sp.ending:
            return False
        sp.ending = True
        sp.ending_at = now
        sp.endings += 1
        sp.recompress_at = None
        if not sp.deep or not self.config.restores:
            return False  # the hot set stayed, or nothing would bring it back
        if sp.prefetching or (sp.prefetched_at is not None and not sp.recompressed):
            return False
        if self.busy and not self.config.predict_when_busy:
            # as for predictions: on a host short of CPU a prefetch competes with the tools
            # (the phase benchmark's loaded host measured it slower than faulting on use)
            sp.fire_at = None
            return False
        at = now + self.stream_delay(name)
        sp.fire_at = at if sp.fire_at is None else min(sp.fire_at, at)
        return True

    def learns(self, name: str) -> bool:
        """Is a record of this sandbox's working set of use (the daemon skips the learning
        otherwise, and drops an old record)?  With a prefetcher: when waits are predicted,
        with ``record_all`` (a tool hint may prefetch any sandbox), or when this wait or one
        of the sandbox's recent ones was announced (the announcement brings the record back)."""
        if not self.config.restores:
            return False
        if self.config.predict_unannounced or self.config.record_all:
            return True
        sp = self._sb.get(name)
        return sp is not None and (sp.ending or any(sp.announced))

    def announced(self, name: str) -> bool:
        """Was the end of the wait in progress announced (wait_ending)?"""
        sp = self._sb.get(name)
        return sp is not None and sp.wait_start is not None and sp.ending

    def other_phase(self, name: str) -> None:
        """Any other hint (idle, unknown): no wait in progress any more."""
        sp = self._get(name)
        sp.wait_start = sp.fire_at = sp.recompress_at = sp.prefetched_at = None
        sp.ending_at = None
        sp.prefetching = False

    def prefetch_started(self, name: str) -> int:
        """A planned prefetch starts; returns the token its prefetch_done() passes back."""
        sp = self._get(name)
        sp.fire_at = None
        sp.prefetching = True
        sp.fired += 1
        sp.fires += 1
        sp.inflight += 1
        return sp.epoch

    def prefetch_done(self, name: str, token: int, seconds: float, now: float) -> None:
        """The planned prefetch that prefetch_started() gave ``token`` finished after
        ``seconds``."""
        sp = self._sb.get(name)
        if sp is None:
            return  # forgotten meanwhile (unregistered)
        sp.prefetch_s.append(seconds)
        sp.inflight = max(0, sp.inflight - 1)
        if token != sp.epoch or not sp.prefetching:
            return  # its wait ended meanwhile (tool_started counted it late)
        sp.prefetching = False
        sp.prefetched_at = now
        if sp.fires < self.config.max_fires and not sp.ending:
            sp.recompress_at = now + self.config.recompress_after

    def remaining(self, name: str, age: float) -> float | None:
        """The median remaining wait of the recorded waits longer than ``age``."""
        longer = [w - age for w in self.samples(name) if w > age]
        return statistics.median(longer) if longer else None

    # -- the clock --------------------------------------------------------------------------

    def due(self, now: float) -> list[tuple[str, Action]]:
        """What is due at ``now``, in sandbox order; each returned action is consumed."""
        c = self.config
        out: list[tuple[str, Action]] = []
        for name in sorted(self._sb):
            sp = self._sb[name]
            if sp.wait_start is None:
                continue
            if sp.fire_at is not None and now >= sp.fire_at and not sp.prefetching:
                if sp.inflight:
                    continue  # an earlier wait's prefetch still runs: after it
                out.append((name, Action.PREFETCH))
                continue
            if sp.recompress_at is not None and now >= sp.recompress_at and not sp.ending:
                sp.recompress_at = None
                age = now - sp.wait_start
                left = self.remaining(name, age)
                if left is None or left < c.recompress_min_remaining:
                    continue  # probably ending soon: keep the working set
                sp.prefetched_at = None
                sp.recompressed = sp.went_on = True
                sp.fire_at = self._plan(name, age)
                if sp.fire_at is not None:
                    sp.recompressed = False  # another prefetch is planned for this wait
                out.append((name, Action.RECOMPRESS))
        return out

    def next_due(self) -> float | None:
        # a fire time waiting for an earlier prefetch is not due: its end wakes the caller
        times = [t for sp in self._sb.values() if sp.wait_start is not None
                 for t in (sp.fire_at if not (sp.prefetching or sp.inflight) else None,
                           sp.recompress_at)
                 if t is not None]
        return min(times) if times else None

    def snapshot(self, name: str, now: float) -> dict[str, object]:
        sp = self._sb.get(name) or SandboxPlan(deque(), threshold=self.config.threshold)
        ws = list(sp.waits)
        return {
            "waits": sp.waits_seen,
            "wait_median_s": round(statistics.median(ws), 3) if ws else None,
            "stream_median_s": (round(statistics.median(sp.streams), 3) if sp.streams
                                else None),
            "threshold": round(sp.threshold, 3),
            "lead_s": round(self.lead(name), 3),
            "fire_in_s": None if sp.fire_at is None else round(sp.fire_at - now, 3),
            "prefetching": sp.prefetching,
            "paused": sp.paused,
            "fired": sp.fired,
            "hits": sp.hits,
            "late": sp.late,
            "early": sp.early,
            "on_hint": sp.on_hint,
            "busy_waits": sp.busy_waits,
            "endings": sp.endings,
            "deep": sp.deep_waits,
            "kept": sp.kept,
        }
