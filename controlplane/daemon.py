"""azswap daemon: the registry, the phase model and the scheduler behind a local socket.

One process (``azctl daemon``), these threads:

* the socket server: one thread per client connection reading its JSON-lines requests
  (docs/daemon-protocol.md), and one writer thread per connection sending its replies and events
  from a bounded queue, so that a client that stops reading holds up nobody but itself;
* the scheduler: ``Scheduler.run()``, one tick a second, woken early by hints;
* the module event listener: follows the ``events`` netlink group (changes made by other netlink
  clients) and forwards them to subscribers;
* the wait planner (controlplane/waitplan.py): learns each sandbox's waits and tells the
  scheduler when a waiting sandbox's working set may go; with a prefetcher (``prefetch``: with
  ``prefetch_from`` "resident", the default, one that records what is resident when a wait's
  compression reaches the working set, or the eBPF fault tracer's) it holds the scheduler and
  starts the sandbox's prefetch when a wait's end is announced (paced to its recorded streams)
  and, with ``plan.predict_unannounced``, that long before each wait's predicted end; a wait
  that goes on past a predicted prefetch is released for compression again;
* prefetch workers (with the prefetcher only): one short-lived thread per planned prefetch, and
  with ``hint_prefetch`` per tool hint that found the working set not brought back (that one at
  a lower priority, in parallel with the tool).

The socket is root-only twice over: the file is 0600 in a 0700 directory, and every connection's
peer credentials (SO_PEERCRED) are checked against ``allowed_uids`` (root only by default).

SIGTERM/SIGINT: the scheduler stops between two memory.reclaim chunks (the chunk in flight either
completes or comes up short, both leave the sandbox consistent), the server stops accepting,
connections are closed, the socket file removed.  The state file stays so the next start
recovers the names.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import socketserver
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from controlplane import errors, metrics, restore
from controlplane.abi import MAX_LOAD_PAGES, Phase, validate_group
from controlplane.cgroup import CGROUP_ROOT, PROC_ROOT, normalize
from controlplane.modulephase import PhaseForwarder
from controlplane.optimes import OpTimes
from controlplane.phase import PhaseConfig, PhaseModel
from controlplane.prefetch_defaults import PREFETCH, PREFETCH_FROM, PREFETCH_SOURCES
from controlplane.priority import lower_thread_priority, name_this_thread
from controlplane.registry import RUN_DIR, ModuleBackend, Registry, Sandbox, state_path
from controlplane.residentset import ResidentSetPrefetcher
from controlplane.restore import NoopPrefetcher, Prefetcher, load_prefetcher
from controlplane.scheduler import KEEP_SLACK, Scheduler, SchedulerConfig, Target
from controlplane.sysfs import SYS_BLOCK, Device
from controlplane.waitplan import Action, PlanConfig, WaitPlanner

log = logging.getLogger("azswap.daemon")

PROTOCOL_VERSION = 1
SOCKET_PATH = RUN_DIR / "azswap.sock"
MAX_LINE = 64 * 1024  # bytes per request line, newline included
# logged when a wait's compression stopped at its working set after a write went below it
BELOW_WORKING_SET = "below its working set: the record taken earlier in the wait stands"


@dataclass
class DaemonConfig:
    socket_path: Path = SOCKET_PATH
    dev: int = 0
    cgroup_root: Path = CGROUP_ROOT
    proc_root: Path = PROC_ROOT
    sys_block: Path = SYS_BLOCK
    state_dir: Path = RUN_DIR
    allowed_uids: frozenset[int] = frozenset({0})
    prefetch: bool = PREFETCH  # restore prefetch (azctl --prefetch / --no-prefetch)
    # how the prefetcher learns a working set: "resident" (what is resident when a wait's
    # compression reached it; controlplane/residentset.py) or "faults" (the eBPF fault tracer)
    prefetch_from: str = PREFETCH_FROM
    follow_events: bool = True
    metrics_port: int | None = None
    reconcile_interval: float = 10.0  # seconds between checks that the module still has ours
    max_connections: int = 64  # clients served at once; one more is refused with "busy"
    queue_lines: int = 512  # lines queued for one client; events beyond it are dropped
    send_stall: float = 30.0  # seconds a client may accept nothing while we have data for it
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    phase: PhaseConfig = field(default_factory=PhaseConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    # the planner follows each wait (its working set kept, announced and, with
    # plan.predict_unannounced, predicted prefetches); False: every prefetch on the tool hint
    predict: bool = True
    # on a tool hint that found nothing prefetched in the wait: prefetch beside the tool (at
    # this nice), or let the tool fault its pages in.  Off: measured in the phase benchmark, a
    # prefetch racing the tool made it slower than faulting alone (CPU, pages it never used).
    # With the resident-set prefetcher it also records every sandbox's working set each wait
    # (plan.record_all), and a wait's working set goes only once that was recorded
    hint_prefetch: bool = False
    hint_prefetch_nice: int = 5
    run_end_wait_s: float = 10.0  # a prefetch waits this long at most for a reclaim write


class PerThread:
    """A ModuleBackend proxy giving each thread its own netlink socket (pyroute2 sockets are not
    for sharing).  ``release()`` closes the calling thread's one."""

    def __init__(self, factory: Callable[[], ModuleBackend]) -> None:
        self._factory = factory
        self._tl = threading.local()
        self._all: list[ModuleBackend] = []
        self._lock = threading.Lock()

    def _get(self) -> ModuleBackend:
        m = getattr(self._tl, "m", None)
        if m is None:
            m = self._factory()
            self._tl.m = m
            with self._lock:
                self._all.append(m)
        return m

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def release(self) -> None:
        m = getattr(self._tl, "m", None)
        if m is not None:
            self._tl.m = None
            with self._lock:
                if m in self._all:
                    self._all.remove(m)
            with contextlib.suppress(Exception):
                m.close()

    def close(self) -> None:
        with self._lock:
            ms, self._all = self._all, []
        for m in ms:
            with contextlib.suppress(Exception):
                m.close()


class Connection:
    """One client: its replies and pushed events go through a bounded queue drained by the
    connection's own writer thread.

    Replies are never dropped: the reader waits for room before it reads the next request (a
    client that does not read its replies stalls itself).  Events are dropped when the queue is
    full, counted, and the client is told how many with one ``dropped`` event line before the
    next one it gets.  A client that accepts no byte for ``send_stall`` seconds while data waits
    for it is disconnected."""

    def __init__(
        self, sock: socket.socket, uid: int, pid: int, queue_lines: int = 512,
        send_stall: float = 30.0,
    ) -> None:
        self.sock = sock
        self.uid = uid
        self.pid = pid
        self.subscribed = False
        self.dropped = 0  # events dropped for this client, in all
        self._subscribe_next = False
        self._limit = queue_lines
        self._stall = send_stall
        self._q: deque[bytes] = deque()
        self._untold = 0  # events dropped since the last "dropped" line
        self._cv = threading.Condition()
        self._closing = False  # no more lines: the writer sends what is queued and stops
        self._dead = False  # the socket failed or stalled: nothing more is sent
        self._writer: threading.Thread | None = None

    def start(self) -> None:
        self._writer = threading.Thread(
            target=self._write_loop, name=f"writer-{self.pid}", daemon=True
        )
        self._writer.start()

    def subscribe_after_reply(self) -> None:
        """Events start right after the next reply (so they never come before it)."""
        self._subscribe_next = True

    def reply(self, obj: dict[str, Any]) -> bool:
        """Queue a reply, waiting while the queue is full; False once the client is gone."""
        data = _line(obj)
        with self._cv:
            while len(self._q) >= self._limit and not (self._dead or self._closing):
                self._cv.wait()
            if self._dead or self._closing:
                return False
            self._q.append(data)
            if self._subscribe_next:
                self.subscribed, self._subscribe_next = True, False
            self._cv.notify_all()
        return True

    def event(self, data: bytes) -> bool:
        """Queue one event line without waiting; False if it was dropped."""
        with self._cv:
            if not self.subscribed or self._dead or self._closing:
                return True
            if len(self._q) >= self._limit:
                self.dropped += 1
                self._untold += 1
                if self._untold == 1:
                    log.warning("client pid %d is not reading: dropping events", self.pid)
                return False
            if self._untold:
                self._q.append(self._dropped_line())
            self._q.append(data)
            self._cv.notify_all()
        return True

    def _dropped_line(self) -> bytes:
        n, self._untold = self._untold, 0
        return _line({"event": "dropped", "time": time.time(), "dropped": n})

    def finish(self, wait: float) -> None:
        """No more lines: let the writer send what is queued (``wait`` bounds it), then stop."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        w = self._writer
        if w is not None:
            w.join(wait)
            if w.is_alive():  # still stuck on a client that does not read: cut it off
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_RDWR)
            w.join()  # before the socket is closed (its number could be reused)
        with self._cv:
            self._dead = True
            self._cv.notify_all()

    def _write_loop(self) -> None:
        name_this_thread("conn-writer")
        while True:
            with self._cv:
                while not self._q and not self._untold and not (self._closing or self._dead):
                    self._cv.wait()
                if self._dead or (self._closing and not self._q):
                    return
                data = self._q.popleft() if self._q else self._dropped_line()
                self._cv.notify_all()
            try:
                self._send(data)
            except OSError as e:  # gone, or stalled: either way this client is done
                if isinstance(e, TimeoutError):
                    log.warning("client pid %d accepted nothing for %gs: disconnected",
                                self.pid, self._stall)
                with self._cv:
                    self._dead = True
                    self._cv.notify_all()
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_RDWR)  # the reader sees EOF
                return

    def _send(self, data: bytes) -> None:
        """sendall without blocking the socket (its reader shares it), bounded by the stall."""
        view = memoryview(data)
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLOUT)
        while view:
            try:
                view = view[self.sock.send(view, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL) :]
                continue
            except BlockingIOError:
                pass
            if not poller.poll(self._stall * 1000):
                raise TimeoutError(f"no progress for {self._stall}s")


def peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.daemon_.serve_connection(self.connection, self.rfile)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False
    daemon_: Daemon


class Daemon:
    def __init__(
        self,
        config: DaemonConfig | None = None,
        module_factory: Callable[[], ModuleBackend] | None = None,
        prefetcher: Prefetcher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = c = config or DaemonConfig()
        factory = module_factory or (lambda: _netlink().AzswapNetlink(c.dev))
        self.module = PerThread(factory)
        self.device = Device(c.dev, c.sys_block)
        self.clock = clock
        self.registry = Registry(self.module, state_path(c.dev, c.state_dir), c.cgroup_root)
        self.phases = PhaseModel(c.phase)
        self.scheduler = Scheduler(
            self.phases,
            self._targets,
            c.scheduler,
            clock=clock,
            proc_root=c.proc_root,
            policy_setter=lambda pol: self.module.policy_set(**pol),
            notify=self.publish,
            deep=self._deep_ok if c.predict and c.plan.keep_hot else None,
            kept=self._kept,
            approach=self._approach,
            packer=self.device.pack,
        )
        if (c.hint_prefetch or not c.predict) and not c.prefetch and prefetcher is None:
            raise errors.InvalidValue("hint_prefetch and predict=False need the prefetcher")
        if c.prefetch_from not in PREFETCH_SOURCES:
            raise errors.InvalidValue(
                f"prefetch_from must be one of {', '.join(PREFETCH_SOURCES)}")
        resident = c.prefetch_from == "resident" and c.prefetch
        if resident and not (c.predict and c.plan.keep_hot):
            # without the planner's say no wait stops at the working set: nothing is learnt
            raise errors.InvalidValue("prefetch_from resident needs predict and keep_hot")
        # without a prefetcher the planner plans no prefetch (start() also tells it when the
        # prefetcher asked for could not start)
        self.planner = WaitPlanner(
            replace(c.plan, restores=c.plan.restores and (c.prefetch or prefetcher is not None),
                    deep_after_kept=c.plan.deep_after_kept or resident,
                    record_all=c.plan.record_all or c.hint_prefetch)
        )
        self._plan_lock = threading.Lock()
        self.op_times = OpTimes(self.clock)  # service time per request kind (stats: "ops")
        self.module_phases = PhaseForwarder(self._module_phase, self._module_phase_failed)
        self._plan_wake = threading.Event()
        self._wait_gen: dict[str, int] = {}  # sandbox -> phase generation of its last hint
        # loaded in start(), after the module answered: the real prefetcher compiles BPF
        self.prefetcher: Prefetcher = prefetcher if prefetcher is not None else NoopPrefetcher()
        self._load_prefetcher = prefetcher is None
        self._conns: set[Connection] = set()
        self._conns_lock = threading.Lock()
        self.events_dropped = 0  # events dropped for clients that did not read, in all
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: _Server | None = None
        self.started_at = time.time()

    # -- state ------------------------------------------------------------------------------

    def _targets(self) -> list[Target]:
        out = []
        for sb in self.registry.list_sandboxes():
            cg = self.registry.cgroup(sb)
            if cg is not None:
                out.append(Target(sb.name, cg))
        return out

    def recover(self) -> None:
        try:
            n_sb, n_t = self.registry.recover()
            phases = {o.cgroup_id: o.phase for o in self.module.stats()}
        except errors.UnknownDevice as e:
            # e.g. "device not initialised: write its disksize first": serve anyway, the
            # requests will say the same until the device is set up
            log.warning("cannot read the module's owners: %s", e)
            return
        now = self.clock()
        for sb in self.registry.list_sandboxes():
            self.phases.add(sb.name, now)
            ph = phases.get(sb.cgroup_id, Phase.UNKNOWN)
            if ph != Phase.UNKNOWN:
                # the module remembers the last hint: resume from it (its age restarts now)
                self.phases.hint(sb.name, ph, now)
        log.info("recovered %d sandboxes and %d templates from the module", n_sb, n_t)

    def publish(self, event: dict[str, Any]) -> None:
        """Queue an event line for every subscribed connection (never waits for one)."""
        event = {"event": event.get("event", "unknown"), "time": time.time(), **event}
        data = _line(event)
        with self._conns_lock:
            subs = [c for c in self._conns if c.subscribed]
        dropped = sum(not c.event(data) for c in subs)
        if dropped:
            with self._conns_lock:
                self.events_dropped += dropped

    # -- operations (one per protocol op) -------------------------------------------------------

    def op_ping(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._conns_lock:
            conns, dropped = len(self._conns), self.events_dropped
        return {
            "version": PROTOCOL_VERSION,
            "pid": os.getpid(),
            "dev": self.config.dev,
            "connections": conns,
            "events_dropped": dropped,
            "prefetch": restore.status(self.prefetcher),
        }

    def op_register(self, req: dict[str, Any]) -> dict[str, Any]:
        sb = self.registry.add_sandbox(
            _str(req, "name"),
            normalize(_str(req, "cgroup")),
            validate_group(_int(req, "group")),
            _opt_str(req, "template"),
        )
        self.phases.add(sb.name, self.clock())
        self.publish({"event": "register", **sb.to_dict()})
        return sb.to_dict()

    def op_map(self, req: dict[str, Any]) -> dict[str, Any]:
        sb, m = self.registry.map_sandbox(_str(req, "name"), _int(req, "pid"), _str(req, "file"))
        cow = self.module.info().cow_index
        return {**sb.to_dict(), **m.to_dict(), "cow_index": cow.name.lower()}

    def op_unregister(self, req: dict[str, Any]) -> dict[str, Any]:
        self.module_phases.forget(self.registry.sandbox(_str(req, "name")).cgroup_id)
        sb = self.registry.remove_sandbox(_str(req, "name"))
        self.phases.remove(sb.name)
        self.scheduler.forget(sb.name)
        with self._plan_lock:
            plan = self.planner.snapshot(sb.name, self.clock())
            self.planner.forget(sb.name)
            self._wait_gen.pop(sb.name, None)
        restore.forget(self.prefetcher, sb.name)
        log.info("plan of %s: %s", sb.name, " ".join(f"{k}={v}" for k, v in plan.items()))
        self.publish({"event": "unregister", "name": sb.name, "cgroup_id": sb.cgroup_id})
        return sb.to_dict()

    def op_phase(self, req: dict[str, Any]) -> dict[str, Any]:
        sb = self.registry.sandbox(_str(req, "name"))
        phase = Phase.parse(req.get("phase", ""))
        start = None
        # The planner hears of the phase under the same lock as it is recorded: the
        # scheduler's question about a new wait (_deep_ok) waits for both.  A hint that
        # repeats the phase in force (same generation) changes nothing.
        with self._plan_lock:
            now = self.clock()
            view = self.phases.hint(sb.name, phase, now)
            repeat = self._wait_gen.get(sb.name) == view.generation
            self._wait_gen[sb.name] = view.generation
            if not repeat and phase == Phase.TOOL:
                start = self.planner.tool_started(sb.name, now)
            elif not repeat and phase == Phase.LLM_WAIT and self.config.predict:
                self.planner.wait_started(sb.name, now)
            elif not repeat:
                self.planner.other_phase(sb.name)
            stale = not repeat and phase == Phase.LLM_WAIT and not self.planner.learns(sb.name)
        if stale:  # a record nothing would use now; it would be old by the next announcement
            restore.forget(self.prefetcher, sb.name)
        self.scheduler.wake()  # a tool hint stops compression at the next chunk boundary
        self.module_phases.submit(sb.cgroup_id, phase)  # the module's copy, off this path
        self.publish({"event": "phase", "name": sb.name, "phase": phase.label})
        self._plan_wake.set()
        reply = {"name": sb.name, "phase": view.phase.label, "generation": view.generation}
        if repeat:
            return reply
        if phase != Phase.TOOL:
            restore.phase_changed(self.prefetcher, sb, phase.label)
        elif start is not None and start.prefetch and (
            self.config.hint_prefetch or not self.config.predict
        ):
            # nothing brought the working set back in this wait: fetch it beside the tool
            threading.Thread(
                target=self._restore, args=(sb, None), name=f"prefetch-{sb.name}", daemon=True
            ).start()
        elif start is not None and start.reason not in ("in-flight", "predicted"):
            restore.phase_changed(self.prefetcher, sb, phase.label)  # learn this tool phase
        # else: this wait's planned prefetch told the prefetcher that the tool phase began (a
        # second phase change would hide the tool's faults from learning)
        return reply

    def _module_phase(self, cgroup_id: int, phase: Phase) -> None:
        with self.op_times.timed("phase.module"):
            self.module.phase_set(cgroup_id, phase)  # for the module's tracepoints and stats

    def _module_phase_failed(self, cgroup_id: int, phase: Phase, e: errors.AzswapError) -> None:
        name = next((s.name for s in self.registry.list_sandboxes()
                     if s.cgroup_id == cgroup_id), None)
        if name is None:
            log.info("phase %s of cgroup %d: module: %s (unregistered meanwhile)",
                     phase.label, cgroup_id, e)
            return
        log.warning("phase %s of %s: module: %s", phase.label, name, e)
        self.publish({"event": "module_error", "name": name, "phase": phase.label,
                      "error": str(e)})

    def _recorded(self, name: str) -> bool:
        """Does the prefetcher hold a record of the sandbox's working set (one that learns
        from residency; the fault tracer's is taken to)?  Takes the prefetcher's own lock
        only: callable under _plan_lock."""
        pages = getattr(self.prefetcher, "learned_pages", None)
        return pages is None or pages(name) > 0

    def op_ending(self, req: dict[str, Any]) -> dict[str, Any]:
        """The sandbox's wait ends soon (the orchestrator sees the model stream its answer):
        when a prefetch is made due (at once, or paced to its recorded streams), its
        compression stops now. Never waits for either."""
        sb = self.registry.sandbox(_str(req, "name"))
        with self._plan_lock:  # a record finished meanwhile counts (kept_level follows it)
            # with nothing recorded, plan_tick() skips the prefetch: nothing to hold for
            due = (self.planner.wait_ending(sb.name, self.clock())
                   and self._recorded(sb.name))
            gen = self._wait_gen.get(sb.name)
        if due:
            # what went stays out until the prefetch; nothing more goes that it would read back
            self.scheduler.hold(sb.name, gen)
        self._plan_wake.set()
        self.publish({"event": "ending", "name": sb.name, "prefetch": due})
        return {"name": sb.name, "prefetch": due}

    def _restore(self, sb: Sandbox, token: int | None) -> None:
        """One prefetch: planned before the predicted end of a wait (``token`` from the
        planner), or on a tool hint (None; then at a lower priority: the tool runs meanwhile
        and its own faults come first)."""
        planned = token is not None
        name_this_thread("prefetch")
        if not planned:
            lower_thread_priority(self.config.hint_prefetch_nice)
        t0 = self.clock()
        try:
            # the scheduler is held (planned) or the phase changed (hint): its run stops
            # before the next chunk; the write in flight would reclaim what is faulted in now
            if not self.scheduler.wait_run_ended(sb.name, self.config.run_end_wait_s):
                log.info("prefetch %s: a reclaim write still runs; prefetching anyway", sb.name)
            res = self.prefetcher.restore(sb)
            if isinstance(res, dict) and res.get("prefetched_pages"):
                self.scheduler.restored(sb.name)  # its next tool is no measure of a working set
            self.publish(
                {"event": "prefetch", "name": sb.name, "planned": planned, "result": res}
            )
        except Exception as e:  # the prefetcher is best effort: report, never kill the daemon
            log.warning("prefetch %s: %s", sb.name, e)
        finally:
            if token is not None:
                now = self.clock()
                with self._plan_lock:
                    self.planner.prefetch_done(sb.name, token, now - t0, now)
                self._plan_wake.set()
            self.module.release()

    def plan_tick(self) -> list[tuple[str, Action]]:
        """Act on what the wait planner has due now: hold the scheduler and prefetch a
        sandbox whose wait is about to end; release one whose wait went on."""
        # the host as the scheduler's last tick read it (at most one interval old)
        rep = self.scheduler.last_report
        cpu = rep.host.cpu_psi_some_avg10 if rep is not None and rep.host is not None else None
        busy = cpu is not None and cpu >= self.config.plan.busy_psi
        with self._plan_lock:
            self.planner.busy = busy
            due = self.planner.due(self.clock())
            acts = []  # (name, action, token, the wait's phase generation)
            for name, act in due:
                if act is Action.PREFETCH and not self._recorded(name):
                    # nothing would come back (taken before it was recorded): no hold, and
                    # the tool faults its pages in
                    log.info("plan: %s: nothing recorded to prefetch", name)
                    continue
                token = self.planner.prefetch_started(name) if act is Action.PREFETCH else -1
                acts.append((name, act, token, self._wait_gen.get(name)))
        for name, act, token, gen in acts:
            try:
                sb = self.registry.sandbox(name)
            except errors.AzswapError:
                with self._plan_lock:
                    self.planner.forget(name)
                continue
            if act is Action.RECOMPRESS:
                with self._plan_lock:
                    if self.planner.announced(name):
                        continue  # announced since: its hold stands, its prefetch is due
                # the planned restore began the prefetcher's tool phase: the wait goes on
                restore.phase_changed(self.prefetcher, sb, Phase.LLM_WAIT.label)
                self.scheduler.release(name, gen)
                self.scheduler.wake()
                log.info("plan: %s still waiting after its prefetch: compress again", name)
                continue
            self.scheduler.hold(name, gen)
            with self._plan_lock:
                how = "announced" if self.planner.announced(name) else "predicted"
            log.info("plan: %s: wait %s to end, prefetching", name, how)
            threading.Thread(
                target=self._restore, args=(sb, token), name=f"prefetch-{name}", daemon=True
            ).start()
        return due

    def _plan_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.plan_tick()
            except Exception:  # keep the daemon alive; the traceback goes to the log
                log.exception("wait planner failed")
            with self._plan_lock:
                nxt = self.planner.next_due()
            left = 1.0 if nxt is None else min(1.0, max(0.0, nxt - self.clock()))
            if left > 0:
                self._plan_wake.wait(left)
            self._plan_wake.clear()

    def _learns(self, name: str) -> bool:
        """Is a record of this sandbox's working set of use now (WaitPlanner.learns: with
        ``hint_prefetch``, always)?  One that stopped being of use was dropped at the wait's
        start (op_phase)."""
        with self._plan_lock:
            return self.planner.learns(name)

    def _approach(self, name: str) -> None:
        """The scheduler's news (its thread): a wait's first write toward the working set is
        next.  A prefetcher that learns from residency records it now, working set and all: a
        write may take more than it asks (see _kept)."""
        if not self._learns(name):
            return
        with contextlib.suppress(errors.AzswapError):  # unregistered meanwhile
            restore.learn(self.prefetcher, self.registry.sandbox(name))

    def _kept(self, name: str, exact: bool = True) -> None:
        """The scheduler's news (its thread): a wait's compression stopped at the working set.
        A prefetcher that learns from residency records it now, unless a write of this wait
        went below it (``exact`` False: the record taken earlier in the wait stands); an
        announced sandbox's working set may go next (WaitPlanner.kept_level)."""
        try:
            sb = self.registry.sandbox(name)
        except errors.AzswapError:
            return  # unregistered meanwhile
        if self._learns(name):  # else nothing would bring the record back
            if exact:
                restore.learn(self.prefetcher, sb)
            elif hasattr(self.prefetcher, "learn"):
                log.info("%s: a write went more than %d KiB %s", name,
                         KEEP_SLACK // 1024, BELOW_WORKING_SET)
        with self._plan_lock:
            deep = self.planner.kept_level(name, self.clock())
        if deep:
            self.scheduler.wake()
            self._plan_wake.set()

    def _deep_ok(self, name: str, must: bool) -> bool:
        """The scheduler's question: may this waiting sandbox's hot set go now?  (``must``: it
        goes anyway; the planner plans this wait's prefetch from now on.)"""
        with self._plan_lock:
            ok = self.planner.deep_ok(name, self.clock(), must)
        if ok:
            self._plan_wake.set()  # a prefetch may have been planned
        return ok

    def op_compress(self, req: dict[str, Any]) -> dict[str, Any]:
        sb = self.registry.sandbox(_str(req, "name"))
        self.scheduler.request_compress(sb.name)
        timeout = float(req.get("wait", 0) or 0)
        deadline = time.monotonic() + timeout
        state: dict[str, Any] = {}
        while True:
            state = self.scheduler.snapshot().get(sb.name, {})
            if not timeout or time.monotonic() >= deadline:
                break
            if self.scheduler.force_pending(sb.name):
                time.sleep(0.05)  # not picked up yet: the state is the previous run's
                continue
            if state.get("done"):
                break
            if state.get("stop_reason") and not state.get("forced"):
                break
            time.sleep(0.05)
        return {"name": sb.name, "queued": True, "state": state}

    def op_prefetch(self, req: dict[str, Any]) -> dict[str, Any]:
        sb = self.registry.sandbox(_str(req, "name"))
        return {"name": sb.name, "result": self.prefetcher.restore(sb)}

    def op_list(self, req: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        views = {v.name: v for v in self.phases.all(now)}
        sbs = []
        for sb in self.registry.list_sandboxes():
            d = sb.to_dict()
            v = views.get(sb.name)
            d["phase"] = v.phase.label if v else "unknown"
            sbs.append(d)
        return {
            "sandboxes": sbs,
            "templates": [t.to_dict() for t in self.registry.list_templates()],
        }

    def stats(self) -> dict[str, Any]:
        now = self.clock()
        phases = {
            v.name: {"phase": v.phase.label, "age": round(v.age, 3), "source": v.source}
            for v in self.phases.all(now)
        }
        with self._plan_lock:
            for name, d in phases.items():
                d["plan"] = self.planner.snapshot(name, now)
        d = metrics.build(
            self.module, self.registry, self.device, phases, self.scheduler.snapshot()
        )
        d["ops"] = self.op_times.snapshot()
        d["pack"] = self.scheduler.pack_stats()
        return d

    def op_stats(self, req: dict[str, Any]) -> dict[str, Any]:
        d = self.stats()
        name = _opt_str(req, "name")
        if name is None:
            return d
        for sb in d["sandboxes"]:
            if sb["name"] == name:
                return sb
        for t in d["templates"]:
            if t["name"] == name:
                return t
        raise errors.UnknownSandbox(f"unknown sandbox {name!r}")

    def op_metrics(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"text": metrics.to_prometheus(self.stats())}

    def op_template_add(self, req: dict[str, Any]) -> dict[str, Any]:
        t = self.registry.add_template(
            _str(req, "name"), validate_group(_int(req, "group")), cgroup_path=_str(req, "cgroup")
        )
        self.publish({"event": "template_add", **t.to_dict()})
        return t.to_dict()

    def op_template_load(self, req: dict[str, Any]) -> dict[str, Any]:
        batch = _int(req, "batch") if req.get("batch") is not None else MAX_LOAD_PAGES
        if not 1 <= batch <= MAX_LOAD_PAGES:
            raise errors.InvalidValue(f"batch: {batch} pages is not 1..{MAX_LOAD_PAGES}")
        t, res = self.registry.load_template(
            _str(req, "name"), validate_group(_int(req, "group")), _str(req, "file"), batch
        )
        self.publish({"event": "template_add", **t.to_dict()})
        return {**t.to_dict(), "pages_total": res.pages_total, "pages_zero": res.pages_zero}

    def op_template_rm(self, req: dict[str, Any]) -> dict[str, Any]:
        t = self.registry.remove_template(_str(req, "name"))
        self.publish({"event": "template_rm", "name": t.name, "cgroup_id": t.cgroup_id})
        return t.to_dict()

    def op_policy_get(self, req: dict[str, Any]) -> dict[str, Any]:
        return self.module.policy_get().to_dict()

    def op_policy_set(self, req: dict[str, Any]) -> dict[str, Any]:
        fields = req.get("fields")
        if not isinstance(fields, dict) or not fields:
            raise errors.InvalidValue("policy_set: 'fields' must be a non-empty object")
        self.module.policy_set(**{str(k): _as_int(k, v) for k, v in fields.items()})
        # a policy set by hand takes over from the scheduler's fast/dense switching
        self.scheduler.config.manage_policy = bool(req.get("keep_scheduling", False))
        return self.module.policy_get().to_dict()

    OPS: ClassVar[dict[str, Callable[[Daemon, dict[str, Any]], dict[str, Any]]]] = {
        "ping": op_ping,
        "register": op_register,
        "unregister": op_unregister,
        "map": op_map,
        "phase": op_phase,
        "ending": op_ending,
        "compress": op_compress,
        "prefetch": op_prefetch,
        "list": op_list,
        "stats": op_stats,
        "metrics": op_metrics,
        "template_add": op_template_add,
        "template_load": op_template_load,
        "template_rm": op_template_rm,
        "policy_get": op_policy_get,
        "policy_set": op_policy_set,
    }

    # -- the protocol -------------------------------------------------------------------------

    def handle_line(self, conn: Connection, line: bytes) -> dict[str, Any] | None:
        """One request line -> one reply (errors included), or None for a request that asked
        for none (``"reply": false``) and succeeded; never raises."""
        rid: Any = None
        try:
            try:
                req = json.loads(line)
            except (ValueError, UnicodeDecodeError) as e:
                return _error(None, "malformed", f"not JSON: {e}")
            except RecursionError:
                return _error(None, "malformed", "not JSON: nested too deeply")
            if not isinstance(req, dict):
                return _error(None, "malformed", "a request is a JSON object")
            rid = req.get("id")
            op = req.get("op")
            if op == "subscribe":
                conn.subscribe_after_reply()
                return {"id": rid, "ok": True, "result": {"subscribed": True}}
            fn = self.OPS.get(op) if isinstance(op, str) else None
            if fn is None:
                return _error(rid, "unknown_op", f"unknown op {op!r}")
            with self.op_times.timed(op):
                result = fn(self, req)
            if req.get("reply") is False:
                return None  # sent without waiting: only a failure is answered
            return {"id": rid, "ok": True, "result": result}
        except errors.AzswapError as e:
            return {"id": rid, "ok": False, "error": e.to_dict()}
        except Exception as e:  # a bug must cost one request, not the daemon
            log.exception("request failed")
            return _error(rid, "internal", f"{type(e).__name__}: {e}")

    def serve_connection(self, sock: socket.socket, rfile: Any) -> None:
        name_this_thread("conn")
        pid, uid, _ = peer_cred(sock)
        if uid not in self.config.allowed_uids:
            log.warning("refused client pid %d uid %d", pid, uid)
            _refuse(sock, _error(None, "permission_denied", "the azswap daemon serves root only"))
            return
        c = self.config
        conn = Connection(sock, uid, pid, c.queue_lines, c.send_stall)
        with self._conns_lock:
            full = len(self._conns) >= c.max_connections
            if not full:
                self._conns.add(conn)
        if full:
            log.warning("refused client pid %d: %d connections already", pid, c.max_connections)
            _refuse(sock, _error(None, "busy", f"too many connections ({c.max_connections})"))
            return
        conn.start()
        too_large = False
        try:
            while not self._stop.is_set():
                line = rfile.readline(MAX_LINE + 1)
                if not line:
                    break
                if len(line) > MAX_LINE:
                    # documented: oversized requests close the connection
                    too_large = True
                    conn.reply(_error(None, "too_large", f"request longer than {MAX_LINE} bytes"))
                    break
                if not line.strip():
                    continue
                reply = self.handle_line(conn, line)
                if reply is not None and not conn.reply(reply):
                    break
        except OSError:
            pass
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
            conn.finish(c.send_stall)  # what is queued still goes out (a half-closed client)
            if too_large:
                _close_after_reply(sock)
            self.module.release()

    # -- lifecycle ----------------------------------------------------------------------------

    def bind(self) -> None:
        path = Path(self.config.socket_path)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            # a socket left by a dead daemon can go; a live one means we are a second instance
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
                probe.close()
                raise errors.Busy(f"another daemon is listening on {path}")
            except (ConnectionRefusedError, FileNotFoundError):
                path.unlink()
            finally:
                probe.close()
        old = os.umask(0o177)
        try:
            self._server = _Server(str(path), _Handler)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._server.daemon_ = self

    def start(self) -> None:
        """Recover, bind and start every thread (returns; see :meth:`run` for the foreground)."""
        self.recover()
        self.bind()
        c = self.config
        if self._load_prefetcher and c.prefetch and c.prefetch_from == "resident":
            self.prefetcher = ResidentSetPrefetcher(cgroup_root=c.cgroup_root,
                                                    proc_root=c.proc_root)
        elif self._load_prefetcher:
            self.prefetcher = load_prefetcher(c.prefetch)
            if isinstance(self.prefetcher, NoopPrefetcher):
                with self._plan_lock:
                    self.planner.config.restores = False
        assert self._server is not None
        self.module_phases.start()
        self._spawn("server", self._server.serve_forever, 0.2)
        self._spawn("scheduler", self.scheduler.run)
        self._spawn("planner", self._plan_loop)
        if self.config.follow_events:
            self._spawn("events", self._follow_events)
        if self.config.reconcile_interval > 0:
            self._spawn("reconcile", self._reconcile_loop)
        if self.config.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(
                self.config.metrics_port,
                addr="127.0.0.1",
                registry=metrics.registry_for(self.stats),
            )
        log.info("listening on %s (dev %d)", self.config.socket_path, self.config.dev)

    def _spawn(self, name: str, fn: Callable[..., object], *args: object) -> None:
        def named() -> None:
            name_this_thread(name)
            fn(*args)

        t = threading.Thread(target=named, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def reconcile(self) -> dict[str, list[str]]:
        """One check that the module still has our sandboxes (a device reset drops them all)."""
        try:
            out = self.registry.reconcile()
        except errors.AzswapError as e:  # e.g. reset and not initialised yet: try again later
            log.debug("reconcile: %s", e)
            return {"reregistered": [], "dropped": []}
        now = self.clock()
        for name in out["reregistered"]:
            if name in {s.name for s in self.registry.list_sandboxes()}:
                self.phases.add(name, now)
        for what, names in out.items():
            for name in names:
                self.publish({"event": f"sandbox_{what}", "name": name})
        return out

    def _reconcile_loop(self) -> None:
        while not self._stop.wait(self.config.reconcile_interval):
            self.reconcile()

    def _follow_events(self) -> None:
        try:
            listener = _netlink().EventListener()
        except errors.AzswapError as e:
            log.warning("module events unavailable: %s", e)
            return
        with listener:
            while not self._stop.is_set():
                try:
                    evs = listener.poll(0.5)
                except Exception as e:
                    log.warning("module events: %s", e)
                    return
                for ev in evs:
                    if ev.dev != self.config.dev:
                        continue
                    try:
                        name = self.registry.on_event(ev)
                    except errors.AzswapError as e:
                        log.warning("event %s: %s", ev, e)
                        name = None
                    if name is not None and ev.cmd.name.endswith("_ADD"):
                        self.phases.add(name, self.clock())
                    self.publish({**ev.to_dict(), "event": "module_" + ev.cmd.name.lower()})

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._plan_wake.set()
        self.scheduler.stop()
        self.scheduler.wait_pack(10)  # a pack in progress ends before the module goes
        if self._server is not None:
            self._server.shutdown()
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.sock.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(timeout=10)
        self.module_phases.stop()
        if self._server is not None:
            self._server.server_close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.socket_path)
        self.module.close()
        restore.close(self.prefetcher)
        log.info("stopped")

    def run(self) -> None:
        """Foreground: start, wait for SIGTERM/SIGINT, stop cleanly."""
        done = threading.Event()

        def on_signal(signum: int, frame: object) -> None:
            log.info("signal %d: stopping", signum)
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        try:
            while not done.wait(1.0):
                pass
        finally:
            self.stop()


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def _refuse(sock: socket.socket, reply: dict[str, Any]) -> None:
    """One error line on a connection that is not served, then close it."""
    with contextlib.suppress(OSError):
        sock.sendall(_line(reply))
    _close_after_reply(sock)


def _close_after_reply(sock: socket.socket, limit: int = 16 * MAX_LINE) -> None:
    """End our side, then read what the client still sends (bounded, 1 s): closing a Unix socket
    with unread data resets it, and the client would lose the error reply we just sent."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(1.0)
        got = 0
        while got < limit:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += len(chunk)


def _netlink() -> Any:
    from controlplane import netlink  # pyroute2 is imported only when the module is used

    return netlink


def _error(rid: Any, code: str, message: str) -> dict[str, Any]:
    return {"id": rid, "ok": False, "error": {"code": code, "message": message}}


def _str(req: dict[str, Any], key: str) -> str:
    v = req.get(key)
    if not isinstance(v, str) or not v:
        raise errors.InvalidValue(f"'{key}' must be a non-empty string")
    return v


def _opt_str(req: dict[str, Any], key: str) -> str | None:
    v = req.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        raise errors.InvalidValue(f"'{key}' must be a non-empty string")
    return v


def _as_int(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, str) and v.lstrip("-").isdigit():
            return int(v)
        raise errors.InvalidValue(f"'{key}' must be an integer")
    return v


def _int(req: dict[str, Any], key: str) -> int:
    if key not in req:
        raise errors.InvalidValue(f"'{key}' is required")
    return _as_int(key, req[key])
