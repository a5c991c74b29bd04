"""The daemon's JSON-lines protocol over a real Unix socket (fake module, fake cgroup tree)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controlplane import errors
from controlplane.client import DaemonClient
from controlplane.daemon import BELOW_WORKING_SET, MAX_LINE, Daemon, DaemonConfig
from controlplane.restore import NoopPrefetcher
from controlplane.scheduler import SchedulerConfig
from controlplane.waitplan import Action, PlanConfig
from tests.fakes import (
    FakeCgroup,
    FakeClock,
    FakeModule,
    WorldReadableCopy,
    make_cgroup,
    make_proc,
)

REPO = Path(__file__).resolve().parents[2]


def config(tmp: Path, **kw: object) -> DaemonConfig:
    base: dict[str, object] = dict(
        socket_path=tmp / "run" / "azswap.sock",
        cgroup_root=tmp / "cg",
        proc_root=make_proc(tmp / "proc"),
        sys_block=tmp / "sys",
        state_dir=tmp / "run",
        follow_events=False,
        # not the shipped defaults (test_the_shipped_defaults...): a test asks for the
        # prefetcher, the resident set and announced-only plans by name
        prefetch=False,
        prefetch_from="faults",
        plan=PlanConfig(predict_unannounced=True),
        scheduler=SchedulerConfig(interval=0.05, grace=0.0, cpu_budget=1.0, chunk_bytes=1 << 20),
    )
    base.update(kw)
    return DaemonConfig(**base)  # type: ignore[arg-type]


class Running:
    def __init__(self, tmp: Path, module: FakeModule | None = None, **kw: object) -> None:
        for p in ("/sb/a", "/sb/b"):
            make_cgroup(tmp / "cg", p, memory=8 << 20)
        self.module = module or FakeModule(tmp / "cg")
        self.cfg = config(tmp, **kw)
        self.d = Daemon(self.cfg, module_factory=lambda: self.module)
        self.d.registry.cgroup_factory = functools.partial(
            FakeCgroup, clock=FakeClock(), bytes_per_second=1 << 40
        )
        self.d.start()

    def raw(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(str(self.cfg.socket_path))
        return s


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Running]:
    r = Running(tmp_path)
    yield r
    r.d.stop()


def ask(s: socket.socket, f, obj: object) -> dict:
    s.sendall((obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n")
    return json.loads(f.readline())


def test_socket_is_root_only(daemon: Running) -> None:
    st = daemon.cfg.socket_path.stat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(daemon.cfg.socket_path.parent.stat().st_mode) == 0o700


def test_register_phase_stats_unregister(daemon: Running) -> None:
    with DaemonClient(daemon.cfg.socket_path) as c:
        assert c.ping()["version"] == 1
        sb = c.register("a", "/sb/a", 1)
        assert sb["cgroup_id"] in daemon.module.owners
        assert c.phase("a", "llm-wait")["phase"] == "llm-wait"
        assert daemon.d.module_phases.flush(5.0)
        assert daemon.module.owners[sb["cgroup_id"]].phase.label == "llm-wait"
        assert [s["phase"] for s in c.list()["sandboxes"]] == ["llm-wait"]
        st = c.stats("a")
        assert st["name"] == "a" and st["phase"]["source"] == "hint"
        assert "azswap_owner_pages" in c.metrics()
        ops = c.stats()["ops"]  # service times: the hint, and its copy to the module inside it
        assert ops["phase"]["n"] == 1 and ops["phase.module"]["n"] == 1
        assert ops["register"]["n"] == 1 and ops["ping"]["n"] == 1
        assert ops["phase"]["max_ms"] >= ops["phase.module"]["max_ms"] >= 0
        c.unregister("a")
        assert c.list()["sandboxes"] == [] and not daemon.module.owners


def test_a_hint_is_answered_while_the_module_is_slow(daemon: Running) -> None:
    """The module's copy of a phase never holds up the hint; the module ends on the last phase
    sent, and a refusal is an event, not a failed hint."""
    import threading

    gate, entered = threading.Event(), threading.Event()
    real = daemon.module.phase_set
    calls: list[str] = []

    def slow_phase_set(cgroup_id: int, phase: object) -> None:
        calls.append(str(phase))
        entered.set()
        assert gate.wait(10.0)
        real(cgroup_id, phase)  # type: ignore[arg-type]

    daemon.module.phase_set = slow_phase_set  # type: ignore[method-assign]
    with DaemonClient(daemon.cfg.socket_path, timeout=5.0) as c:
        sb = c.register("a", "/sb/a", 1)
        events = DaemonClient(daemon.cfg.socket_path, timeout=5.0)
        sub = events.subscribe()
        # answered while the module's first call is blocked
        assert c.phase("a", "llm-wait")["phase"] == "llm-wait"
        assert c.phase("a", "tool")["phase"] == "tool"
        assert c.phase("a", "llm-wait")["phase"] == "llm-wait"
        # the first copy reaches the module (its thread may start after the answers) and blocks
        assert entered.wait(10.0)
        # and hints are answered while it is blocked there
        assert c.phase("a", "tool")["phase"] == "tool"
        assert c.phase("a", "llm-wait")["phase"] == "llm-wait"
        gate.set()
        assert daemon.d.module_phases.flush(5.0)
        assert daemon.module.owners[sb["cgroup_id"]].phase.label == "llm-wait"
        assert len(calls) <= 2  # "tool" was superseded before it was sent, or sent before it
        # a refusal: the hint still succeeds, the refusal comes as an event
        daemon.module.unregistered.add(sb["cgroup_id"])
        assert c.phase("a", "tool")["phase"] == "tool"
        ev = next(e for e in sub if e.get("event") == "module_error")
        assert ev["name"] == "a" and ev["phase"] == "tool" and "unknown sandbox" in ev["error"]
        events.close()


def test_llm_wait_compresses_and_tool_stops(daemon: Running) -> None:
    with DaemonClient(daemon.cfg.socket_path) as c:
        c.register("a", "/sb/a", 1)
        c.phase("a", "llm-wait")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            st = c.stats("a").get("compress", {})
            if st.get("done"):
                break
            time.sleep(0.02)
        assert st["done"] and st["mem_now"] == 0 and st["reclaimed"] == 8 << 20
        c.phase("a", "tool")
        time.sleep(0.2)
        assert not c.stats("a")["compress"]["done"]  # re-armed, not compressing in tool phase
        assert not c.stats("a")["compress"]["active"]


def test_compress_by_hand_waits_for_the_result(daemon: Running) -> None:
    with DaemonClient(daemon.cfg.socket_path) as c:
        c.register("b", "/sb/b", 1)
        r = c.compress("b", wait=5)
        assert r["state"]["done"] and r["state"]["mem_now"] == 0


def test_errors_are_replies_and_the_connection_is_kept(daemon: Running) -> None:
    s = daemon.raw()
    f = s.makefile("rb")
    r = ask(s, f, b"{not json")
    assert r == {"id": None, "ok": False, "error": r["error"]} and r["error"]["code"] == "malformed"
    assert ask(s, f, b"[1, 2]")["error"]["code"] == "malformed"
    assert ask(s, f, b"\xff\xfe")["error"]["code"] == "malformed"
    r = ask(s, f, {"id": 3, "op": "frobnicate"})
    assert r["id"] == 3 and r["error"]["code"] == "unknown_op"
    assert ask(s, f, {"id": 4, "op": "register", "name": "a"})["error"]["code"] == "invalid_value"
    r = ask(s, f, {"id": 5, "op": "register", "name": "a", "cgroup": "/sb/a", "group": "x"})
    assert r["error"]["code"] == "invalid_value"
    r = ask(s, f, {"id": 6, "op": "register", "name": "a", "cgroup": "/sb/a", "group": 0})
    assert r["error"]["code"] == "invalid_value"
    r = ask(s, f, {"id": 7, "op": "register", "name": "a", "cgroup": "/sb/zz", "group": 1})
    assert r["error"]["code"] == "unknown_cgroup"
    assert (
        ask(s, f, {"id": 8, "op": "phase", "name": "nope", "phase": "tool"})["error"]["code"]
        == "unknown_sandbox"
    )
    r = ask(s, f, {"id": 9, "op": "register", "name": "a", "cgroup": "/sb/a", "group": 1})
    assert r["ok"]
    r = ask(s, f, {"id": 10, "op": "phase", "name": "a", "phase": "sleeping"})
    assert r["error"]["code"] == "invalid_value"
    # after all of that, the same connection still works
    assert ask(s, f, {"id": 11, "op": "ping"}) == {"id": 11, "ok": True, "result": r_ping(daemon)}
    s.close()


def r_ping(daemon: Running) -> dict:
    return {"version": 1, "pid": os.getpid(), "dev": 0, "connections": 1, "events_dropped": 0,
            "prefetch": "prefetch disabled"}


def test_oversized_line_gets_an_error_then_the_connection_closes(daemon: Running) -> None:
    s = daemon.raw()
    f = s.makefile("rb")
    big = json.dumps({"op": "ping", "pad": "x" * MAX_LINE}).encode() + b"\n"
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        s.sendall(big)  # the daemon may close before it read everything
    r = json.loads(f.readline())
    assert r["ok"] is False and r["error"]["code"] == "too_large"
    assert f.readline() == b""  # closed
    s.close()
    # the daemon is alive and serves others
    with DaemonClient(daemon.cfg.socket_path) as c:
        assert c.ping()["version"] == 1


def test_line_of_exactly_the_limit_is_accepted(daemon: Running) -> None:
    s = daemon.raw()
    f = s.makefile("rb")
    head = b'{"op":"ping","pad":"'
    tail = b'"}'
    line = head + b"x" * (MAX_LINE - len(head) - len(tail) - 1) + tail
    assert len(line) + 1 == MAX_LINE
    assert ask(s, f, line)["ok"] is True
    s.close()


def test_peer_uid_not_allowed_is_refused_and_closed(tmp_path: Path) -> None:
    r = Running(tmp_path, allowed_uids=frozenset({12345}))
    try:
        with pytest.raises(errors.PermissionDenied):
            DaemonClient(r.cfg.socket_path).ping()
        assert r.d._server is not None  # still serving
    finally:
        r.d.stop()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root + setpriv")
def test_non_root_client_is_refused(daemon: Running, tmp_path: Path) -> None:
    # make the path reachable so that the socket's own 0600 mode is what refuses
    for p in (tmp_path, tmp_path.parent, tmp_path.parent.parent):
        os.chmod(p, os.stat(p).st_mode | 0o011)
    os.chmod(daemon.cfg.socket_path.parent, 0o711)
    code = textwrap.dedent(f"""
        import sys
        from controlplane import errors
        from controlplane.client import DaemonClient
        try:
            DaemonClient({str(daemon.cfg.socket_path)!r}).ping()
        except errors.PermissionDenied as e:
            print("refused:", e); sys.exit(4)
        sys.exit(0)
    """)
    # the code runs from a world-readable copy: the checkout may sit in a 0700 directory
    try:
        with WorldReadableCopy(REPO) as cp:
            p = subprocess.run(
                ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                 cp.python, "-c", code],
                capture_output=True,
                text=True,
                cwd="/",
                timeout=30,
                env={**os.environ, **cp.env},
            )
        assert p.returncode == 4, p.stdout + p.stderr
    finally:
        os.chmod(daemon.cfg.socket_path.parent, 0o700)


def test_subscribe_receives_events(daemon: Running) -> None:
    sub = DaemonClient(daemon.cfg.socket_path).subscribe(timeout=5)
    with DaemonClient(daemon.cfg.socket_path) as c:
        import threading

        got: list[dict] = []

        def reader() -> None:
            for ev in sub:
                got.append(ev)
                if ev["event"] == "phase":
                    return

        t = threading.Thread(target=reader)
        t.start()
        assert any(conn.subscribed for conn in daemon.d._conns)  # subscribe() returned: done
        c.register("a", "/sb/a", 1)
        c.phase("a", "tool")
        t.join(5)
    assert [e["event"] for e in got][:2] == ["register", "phase"]
    assert got[1]["phase"] == "tool" and "time" in got[1]


def test_restart_recovers_the_registry(tmp_path: Path) -> None:
    r = Running(tmp_path)
    with DaemonClient(r.cfg.socket_path) as c:
        c.register("a", "/sb/a", 7)
        c.phase("a", "llm-wait")
    r.d.stop()
    assert not r.cfg.socket_path.exists()
    r2 = Running(tmp_path, module=r.module)
    try:
        with DaemonClient(r2.cfg.socket_path) as c:
            (sb,) = c.list()["sandboxes"]
            assert (sb["name"], sb["group"], sb["cgroup_path"]) == ("a", 7, "/sb/a")
            assert sb["phase"] == "llm-wait"  # the module remembered the last hint
    finally:
        r2.d.stop()


def test_second_daemon_on_the_same_socket_is_refused(daemon: Running, tmp_path: Path) -> None:
    other = Daemon(daemon.cfg, module_factory=lambda: daemon.module)
    with pytest.raises(errors.Busy):
        other.bind()


def test_daemon_not_running() -> None:
    with pytest.raises(errors.DaemonNotRunning):
        DaemonClient("/nonexistent/azswap.sock").ping()


DAEMON_SCRIPT = """
import functools, sys, logging
from pathlib import Path
from typing import Any
logging.basicConfig(level=logging.INFO)
from controlplane.daemon import Daemon, DaemonConfig
from controlplane.scheduler import SchedulerConfig
from controlplane.waitplan import PlanConfig
from tests.fakes import FakeModule, FakeCgroup, FakeClock, make_proc
tmp = Path(sys.argv[1])
cfg = DaemonConfig(socket_path=tmp / "run/s.sock", cgroup_root=tmp / "cg",
                   proc_root=make_proc(tmp / "proc"), sys_block=tmp / "sys", state_dir=tmp / "run",
                   follow_events=False, prefetch=False,
                   scheduler=SchedulerConfig(interval=10.0, grace=0.0, cpu_budget=1.0,
                                             chunk_bytes=1 << 20))
d = Daemon(cfg, module_factory=functools.partial(FakeModule, tmp / "cg"))
# slow reclaim: 1 MiB per 50 ms and a 10 s budget per tick: SIGTERM lands mid-compression
d.registry.cgroup_factory = functools.partial(FakeCgroup, clock=FakeClock(),
                                              bytes_per_second=1 << 40)
import time
_orig = FakeCgroup.reclaim
def slow(self, n):
    time.sleep(0.05)
    return _orig(self, n)
FakeCgroup.reclaim = slow
d.run()
"""


def test_sigterm_stops_cleanly_mid_compression(tmp_path: Path) -> None:
    make_cgroup(tmp_path / "cg", "/sb/a", memory=1 << 30)
    p = subprocess.Popen(
        [sys.executable, "-c", DAEMON_SCRIPT, str(tmp_path)],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    sock = tmp_path / "run/s.sock"
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with DaemonClient(sock) as c:
            c.register("a", "/sb/a", 1)
            c.phase("a", "llm-wait")
            while not c.stats("a").get("compress", {}).get("active"):
                time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)  # a hang guard, not a time limit
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    # in this order: the compression run ends on the shutdown, then the daemon stops
    lines = err.splitlines()
    ended = [i for i, ln in enumerate(lines) if "stopped:shutdown" in ln]
    stopped = [i for i, ln in enumerate(lines) if ln.endswith("azswap.daemon:stopped")]
    assert ended and stopped and ended[0] < stopped[0], err
    assert not sock.exists()
    mem = int((tmp_path / "cg/sb/a/memory.current").read_text())
    assert 0 < mem < 1 << 30  # part compressed, by whole chunks
    assert ((1 << 30) - mem) % (1 << 20) == 0


class RecordingPrefetcher:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def record_phase_change(self, sandbox, phase: str) -> None:
        self.calls.append(("phase", f"{sandbox.name}:{phase}"))

    def restore(self, sandbox) -> dict:
        self.calls.append(("restore", sandbox.name))
        return {"prefetched_pages": 3}

    def close(self) -> None:
        self.calls.append(("close", ""))


def test_prefetcher_is_told_phases_and_restores_on_tool(tmp_path: Path) -> None:
    for p in ("/sb/a",):
        make_cgroup(tmp_path / "cg", p)
    fm = FakeModule(tmp_path / "cg")
    pf = RecordingPrefetcher()
    # the hot set compressed with the rest at once: a tool hint then has something to fetch
    d = Daemon(config(tmp_path, hint_prefetch=True, plan=PlanConfig(keep_hot=False)),
               module_factory=lambda: fm, prefetcher=pf)
    d.start()
    try:
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            c.phase("a", "llm-wait")
            c.phase("a", "tool")
            deadline = time.monotonic() + 5
            while ("restore", "a") not in pf.calls and time.monotonic() < deadline:
                time.sleep(0.01)
            assert c.prefetch("a")["result"] == {"prefetched_pages": 3}
    finally:
        d.stop()
    assert pf.calls[:2] == [("phase", "a:llm-wait"), ("restore", "a")]
    assert pf.calls[-1] == ("close", "")


def test_by_default_an_unpredicted_tool_phase_faults_its_pages_in(tmp_path: Path) -> None:
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    pf = RecordingPrefetcher()
    d = Daemon(config(tmp_path), module_factory=lambda: fm, prefetcher=pf)
    d.start()
    try:
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            c.phase("a", "llm-wait")
            c.phase("a", "tool")
    finally:
        d.stop()
    # no prefetch racing the tool; the prefetcher is told the tool phase began, to learn it
    assert pf.calls == [("phase", "a:llm-wait"), ("phase", "a:tool"), ("close", "")]


def _until(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_prefetch_before_the_predicted_end_of_a_wait_and_not_again_on_the_hint(
    tmp_path: Path,
) -> None:
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    pf = RecordingPrefetcher()
    clock = FakeClock()
    # hint prefetches on: the predicted wait's tool hint must not start one of its own
    cfg = config(tmp_path, hint_prefetch=True, plan=PlanConfig(min_samples=3, default_lead=0.5,
                                                              keep_hot=False,
                                                              predict_unannounced=True))
    d = Daemon(cfg, module_factory=lambda: fm, prefetcher=pf, clock=clock)
    d._plan_loop = lambda: None  # type: ignore[method-assign]  # the test calls plan_tick()
    d.start()

    def restores() -> int:
        return pf.calls.count(("restore", "a"))

    try:
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            # three waits of 3 s: too few to predict, each tool hint prefetches
            for n in range(1, 4):
                c.phase("a", "llm-wait")
                clock.advance(3.0)
                c.phase("a", "tool")
                _until(lambda n=n: restores() == n, "the hint's prefetch")
                clock.advance(1.0)
            c.phase("a", "llm-wait")
            clock.advance(2.0)
            d.plan_tick()
            assert restores() == 3  # not yet: the wait is predicted to end at 3 s
            clock.advance(0.6)
            d.plan_tick()
            _until(lambda: restores() == 4, "the planned prefetch")
            gen = d.phases.get("a", clock()).generation
            assert d.scheduler.held("a", gen)  # no compression while the set comes back

            def plan() -> dict:
                return c.stats("a")["phase"]["plan"]

            _until(lambda: not plan()["prefetching"], "the planned prefetch to finish")
            assert plan()["fired"] == 1
            clock.advance(0.4)
            c.phase("a", "tool")
            time.sleep(0.2)
            assert restores() == 4  # the working set is already back: no prefetch on the hint
            assert ("phase", "a:tool") not in pf.calls  # each restore began its tool phase
            assert plan()["hits"] == 1 and plan()["waits"] == 4
    finally:
        d.stop()


def test_an_announced_end_prefetches_at_once_and_holds_compression(tmp_path: Path) -> None:
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    pf = RecordingPrefetcher()
    clock = FakeClock()
    d = Daemon(config(tmp_path, plan=PlanConfig(keep_hot=False)), module_factory=lambda: fm,
               prefetcher=pf, clock=clock)
    d._plan_loop = lambda: None  # type: ignore[method-assign]  # the test calls plan_tick()
    d.start()
    try:
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            c.phase("a", "llm-wait")  # a first wait: nothing to predict from
            clock.advance(2.0)
            d.plan_tick()
            assert ("restore", "a") not in pf.calls
            assert c.ending("a") == {"name": "a", "prefetch": True}
            d.plan_tick()
            _until(lambda: ("restore", "a") in pf.calls, "the announced prefetch")
            assert d.scheduler.held("a", d.phases.get("a", clock()).generation)
            plan = c.stats("a")["phase"]["plan"]
            assert plan["endings"] == 1 and plan["fired"] == 1
            assert c.ending("a")["prefetch"] is False  # once per wait
            clock.advance(0.5)
            c.phase("a", "tool")
            time.sleep(0.2)
            assert pf.calls.count(("restore", "a")) == 1
            with pytest.raises(errors.AzswapError):
                c.ending("nope")
    finally:
        d.stop()


def test_a_paced_announcement_holds_compression_until_its_prefetch(tmp_path: Path) -> None:
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    pf = RecordingPrefetcher()
    clock = FakeClock()
    plan = PlanConfig(keep_hot=False, min_samples=2, stream_quantile=0.5,
                      predict_unannounced=True)
    d = Daemon(config(tmp_path, plan=plan), module_factory=lambda: fm, prefetcher=pf,
               clock=clock)
    d._plan_loop = lambda: None  # type: ignore[method-assign]  # the test calls plan_tick()

    def restores() -> int:
        return pf.calls.count(("restore", "a"))

    def idle(c: DaemonClient) -> bool:
        return not c.stats("a")["phase"]["plan"]["prefetching"]

    d.start()
    try:
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            for k in range(2):  # two announced waits of 3 s: streams of 2 s recorded
                c.phase("a", "llm-wait")
                clock.advance(1.0)
                assert c.ending("a")["prefetch"] is True
                d.plan_tick()
                _until(lambda k=k: restores() == k + 1 and idle(c), "the announced prefetch")
                clock.advance(2.0)  # the prefetches took no time on this clock: lead 0.05 s
                c.phase("a", "tool")
                clock.advance(1.0)
            assert c.stats("a")["phase"]["plan"]["stream_median_s"] == 2.0
            c.phase("a", "llm-wait")  # predicted from the 3 s waits: at 3 - 0.05 s
            clock.advance(0.5)
            assert c.ending("a")["prefetch"] is True  # paced: at 0.5 + 2 - 0.05 s, earlier
            gen = d.phases.get("a", clock()).generation
            assert d.scheduler.held("a", gen)  # compression stops at the announcement...
            clock.advance(1.9)  # 2.4 s into the wait
            d.plan_tick()
            time.sleep(0.2)
            assert restores() == 2  # ...and the prefetch comes later
            clock.advance(0.1)  # 2.5 s: past the paced time, before the predicted one
            d.plan_tick()
            _until(lambda: restores() == 3, "the paced prefetch")
    finally:
        d.stop()


def test_a_recompress_handed_out_before_an_announcement_does_not_release_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    clock = FakeClock()
    d = Daemon(config(tmp_path, plan=PlanConfig(keep_hot=False)), module_factory=lambda: fm,
               prefetcher=RecordingPrefetcher(), clock=clock)
    d._plan_loop = lambda: None  # type: ignore[method-assign]  # the test calls plan_tick()
    d.start()
    try:
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            c.phase("a", "llm-wait")
            clock.advance(1.0)
            assert c.ending("a")["prefetch"] is True
            gen = d.phases.get("a", clock()).generation
            assert d.scheduler.held("a", gen)
            st = d.scheduler.state  # the wait as the scheduler follows it (what release checks)
            _until(lambda: "a" in st and st["a"].generation == gen, "the scheduler's state")
            # the planner handed out a recompress just before the announcement came in
            monkeypatch.setattr(d.planner, "due", lambda now: [("a", Action.RECOMPRESS)])
            d.plan_tick()
            assert d.scheduler.held("a", gen)
    finally:
        d.stop()


def test_device_reset_is_noticed_and_registrations_restored(tmp_path: Path) -> None:
    r = Running(tmp_path, reconcile_interval=0)  # no thread: reconcile() called by hand
    try:
        img = tmp_path / "snap.img"
        img.write_bytes(b"\1" * 4096)
        with DaemonClient(r.cfg.socket_path) as c:
            c.register("a", "/sb/a", 1)
            c.register("b", "/sb/b", 1)
            r.d.registry.add_template("snap", 1, source_file=str(img))
            assert r.d.reconcile() == {"reregistered": [], "dropped": []}  # nothing lost
            r.module.reset()
            shutil.rmtree(tmp_path / "cg" / "sb" / "b")  # b's cgroup went with it
            out = r.d.reconcile()
            assert out == {"reregistered": ["a"], "dropped": ["snap", "b"]}
            assert [s["name"] for s in c.list()["sandboxes"]] == ["a"]
            (a,) = [o for o in r.module.stats() if not o.is_template]
            assert a.cgroup_id == r.d.registry.sandbox("a").cgroup_id
            assert c.phase("a", "llm-wait")["phase"] == "llm-wait"  # hints work again
    finally:
        r.d.stop()


def test_example_agent_loop_sends_hints_around_every_llm_call(daemon: Running) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("agent_loop", REPO / "examples" / "agent_loop.py")
    assert spec and spec.loader
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    seen: list[tuple[str, str]] = []

    def llm(sandbox: str, step: int) -> str:
        assert daemon.d.module_phases.flush(5.0)  # the module's copy follows the hint
        (o,) = [o for o in daemon.module.stats() if o.cgroup_id == daemon.d.registry.sandbox(
            sandbox).cgroup_id]
        seen.append((sandbox, o.phase.label))  # the module has the hint while the LLM runs
        return f"tool-{step}"

    def tool(cgroup: str, action: str) -> str:
        assert daemon.d.module_phases.flush(5.0)
        sb = Path(cgroup).name
        (o,) = [o for o in daemon.module.stats() if o.cgroup_id == daemon.d.registry.sandbox(
            sb).cgroup_id]
        return f"{sb}:{action}:{o.phase.label}"

    with DaemonClient(daemon.cfg.socket_path) as az:
        out = ex.agent_loop(az, ["/sb/a", "/sb/b"], 2, llm, tool)
        assert az.list()["sandboxes"] == []  # unregistered at the end
    assert seen == [("a", "llm-wait"), ("b", "llm-wait")] * 2
    assert out == ["a:tool-0:tool", "b:tool-0:tool", "a:tool-1:tool", "b:tool-1:tool"]


# ---------------------------------------------------------------- slow clients and limits
def subscribed_raw(r: Running) -> tuple[socket.socket, object]:
    """A subscriber on a raw socket (it reads only when the test says so)."""
    s = r.raw()
    s.settimeout(60)  # a hang guard for the reads below, not a time limit
    f = s.makefile("rb")
    assert ask(s, f, {"id": 0, "op": "subscribe"})["result"] == {"subscribed": True}
    return s, f


def ping(r: Running) -> dict:
    with DaemonClient(r.cfg.socket_path, timeout=60) as c:
        return c.ping()


def test_a_subscriber_that_never_reads_holds_up_nobody(tmp_path: Path) -> None:
    """2000 phase ops while one subscriber reads nothing: every op is answered; the subscriber
    then reads each event it got at its place in the sequence of ops, the ones it lost counted
    by "dropped" lines in their place."""
    make_cgroup(tmp_path / "cg", "/sb/c", memory=8 << 20)
    r = Running(tmp_path, send_stall=600.0)  # the stall cut-off is tested below
    try:
        with DaemonClient(r.cfg.socket_path, timeout=60) as c:
            for name in "abc":
                c.register(name, f"/sb/{name}", 1)
            sub, f = subscribed_raw(r)
            n = 2001
            names = ["a", "b", "c"] * (n // 3)
            for name in names:  # "unknown": nothing to compress, only the phase events
                assert c.phase(name, "unknown")["name"] == name
            dropped = c.ping()["events_dropped"]
            assert dropped > 0  # the queue was full (else this tests nothing)
            at, got, told = 0, 0, 0
            while at < n:
                ev = json.loads(f.readline())
                if ev["event"] == "dropped":
                    at, told = at + ev["dropped"], told + ev["dropped"]
                    continue
                assert (ev["event"], ev["name"], ev["phase"]) == ("phase", names[at], "unknown")
                at, got = at + 1, got + 1
            assert at == n and told == dropped and got == n - dropped
            c.phase("c", "unknown")  # events flow again
            ev = json.loads(f.readline())
            assert (ev["event"], ev["name"]) == ("phase", "c")
            sub.close()
    finally:
        r.d.stop()


def test_a_stalled_subscriber_is_disconnected(tmp_path: Path) -> None:
    r = Running(tmp_path, send_stall=0.2, queue_lines=8)
    try:
        with DaemonClient(r.cfg.socket_path, timeout=60) as c:
            c.register("a", "/sb/a", 1)
            sub, f = subscribed_raw(r)
            assert c.ping()["connections"] == 2
            ops = 0
            while c.ping()["connections"] == 2:  # until the daemon cut the subscriber off
                c.phase("a", "unknown")
                ops += 1
                assert ops < 200_000, "the stalled subscriber was never disconnected"
            assert c.ping()["events_dropped"] > 0
            lines = f.readlines()  # what was in flight, then EOF (readlines returns at EOF)
            assert {json.loads(ln)["event"] for ln in lines} <= {"phase", "dropped"}, lines
            sub.close()
    finally:
        r.d.stop()


def test_a_client_that_does_not_read_its_replies_holds_up_nobody(tmp_path: Path) -> None:
    """Pipelined requests, replies not read: that client's reader waits, others are served;
    when it reads, every reply is there, in order."""
    import threading

    r = Running(tmp_path, queue_lines=4)
    try:
        s = r.raw()
        s.settimeout(60)
        f = s.makefile("rb")
        # one round trip first: the daemon has taken this connection before the others ping
        assert ask(s, f, {"id": -1, "op": "ping"})["result"]["connections"] == 1
        n = 3000
        req = b"".join(json.dumps({"id": i, "op": "ping"}).encode() + b"\n" for i in range(n))
        t = threading.Thread(target=s.sendall, args=(req,))  # blocks until replies are read
        t.start()
        # another client, served meanwhile: one connection, so the count is exact (a closed
        # connection leaves the daemon's set when its reader sees EOF, asynchronously)
        with DaemonClient(r.cfg.socket_path, timeout=60) as c:
            for _ in range(3):
                assert c.ping()["connections"] == 2
        ids = [json.loads(f.readline())["id"] for _ in range(n)]
        t.join(60)
        assert ids == list(range(n))
        s.close()
    finally:
        r.d.stop()


def test_connection_cap(tmp_path: Path) -> None:
    r = Running(tmp_path, max_connections=3)
    try:
        held = []
        for i in range(3):
            s = r.raw()
            f = s.makefile("rb")
            assert ask(s, f, {"id": i, "op": "ping"})["result"]["connections"] == i + 1
            held.append((s, f))
        extra = r.raw()
        ef = extra.makefile("rb")
        refused = json.loads(ef.readline())
        assert refused["ok"] is False and refused["error"]["code"] == "busy"
        assert "too many connections (3)" in refused["error"]["message"]
        assert ef.readline() == b""  # closed
        extra.close()
        for i, (s, f) in enumerate(held):  # the ones served are still served
            assert ask(s, f, {"id": 10 + i, "op": "ping"})["ok"] is True
        s, f = held.pop()
        f.close()  # the file holds the socket open too
        s.close()
        for _ in range(10_000):  # the freed place is taken again
            try:
                if ping(r)["connections"] == 3:
                    break
            except errors.Busy:
                time.sleep(0.01)  # the daemon has not noticed the close yet
        else:
            raise AssertionError("the closed connection's place never came free")
        for s, _ in held:
            s.close()
    finally:
        r.d.stop()


def test_deeply_nested_request_is_malformed_and_the_connection_kept(daemon: Running) -> None:
    s = daemon.raw()
    f = s.makefile("rb")
    depth = 20_000  # far deeper than Python's recursion limit, well under MAX_LINE
    r = ask(s, f, b"[" * depth + b"]" * depth)
    assert r["ok"] is False and r["error"]["code"] == "malformed", r
    assert "nested too deeply" in r["error"]["message"]
    assert ask(s, f, {"id": 1, "op": "ping"})["ok"] is True
    s.close()


def test_half_closed_client_gets_every_reply(daemon: Running) -> None:
    """`printf '...' | socat - UNIX-CONNECT:...`: the requests, then EOF, then the replies."""
    s = daemon.raw()
    s.sendall(b'{"id":1,"op":"ping"}\n{"id":2,"op":"list"}\n')
    s.shutdown(socket.SHUT_WR)
    f = s.makefile("rb")
    replies = [json.loads(ln) for ln in f.readlines()]
    assert [(x["id"], x["ok"]) for x in replies] == [(1, True), (2, True)]
    s.close()


def test_template_load_is_one_operation(daemon: Running, tmp_path: Path) -> None:
    img = tmp_path / "snap.img"
    page = bytes(range(256)) * 16
    img.write_bytes(page * 3 + bytes(4096) + page * 20)
    with DaemonClient(daemon.cfg.socket_path) as c:
        events = DaemonClient(daemon.cfg.socket_path).subscribe(timeout=5)
        t = c.template_load("vm", 2, str(img), batch=4)
        assert (t["pages_total"], t["pages_zero"], t["pages_loaded"]) == (24, 1, 23)
        assert t["source_file"] == str(img) and t["group"] == 2
        loaded = daemon.module.loaded[t["cgroup_id"]]
        assert sorted(loaded) == [i for i in range(24) if i != 3]
        assert next(events)["event"] == "template_add"
        assert c.list()["templates"][0]["pages_loaded"] == 23
        with pytest.raises(errors.InvalidValue, match="batch"):
            c.template_load("vm2", 2, str(img), batch=16)
        with pytest.raises(errors.AlreadyExists):
            c.template_load("vm", 2, str(img))


def test_a_failed_template_load_leaves_nothing_registered(daemon: Running, tmp_path: Path) -> None:
    img = tmp_path / "snap.img"
    img.write_bytes(b"\1" * 4096 * 40)
    orig = daemon.module.template_load

    def fail(cid: int, index: int, pages: bytes) -> None:
        if index > 0:
            raise errors.from_netlink(12, "pool full", "TEMPLATE_LOAD")
        orig(cid, index, pages)

    daemon.module.template_load = fail  # type: ignore[method-assign]
    with DaemonClient(daemon.cfg.socket_path) as c:
        with pytest.raises(errors.AzswapError):
            c.template_load("vm", 2, str(img))
        assert c.list()["templates"] == []
        with pytest.raises(errors.UnknownCgroup):
            c.template_load("vm", 2, str(tmp_path / "missing"))
    assert daemon.module.owners == {}


def test_the_scheduler_asks_the_planner_before_a_waits_hot_set_goes(tmp_path: Path) -> None:
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    clock = FakeClock()
    d = Daemon(config(tmp_path), module_factory=lambda: fm, clock=clock)
    assert d.scheduler.deep is not None
    d._plan_loop = lambda: None  # type: ignore[method-assign]
    d.scheduler.run = lambda: None  # type: ignore[method-assign]  # the test asks by hand
    d.start()
    try:
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            c.phase("a", "llm-wait")
            assert d.scheduler.deep("a", False) is False  # no history: the hot set stays
            start = d.planner._sb["a"].wait_start
            clock.advance(1.0)
            # a repeated hint is the same wait: its clock does not start again
            c.phase("a", "llm-wait")
            assert d.planner._sb["a"].wait_start == start
            assert d.scheduler.deep("a", False) is False
            # as old as deep_min_remaining: expected to last as long again, the hot set goes
            clock.advance(d.config.plan.deep_min_remaining - 1.0)
            assert d.scheduler.deep("a", False) is True
            c.phase("a", "tool")
            assert c.stats("a")["phase"]["plan"]["deep"] == 1
            c.phase("a", "llm-wait")
            assert d.scheduler.deep("a", True) is True  # taken anyway: planned for
            c.phase("a", "tool")
            assert c.stats("a")["phase"]["plan"]["deep"] == 2
    finally:
        d.stop()
    for kw in ({"plan": PlanConfig(keep_hot=False)}, {"predict": False, "prefetch": True}):
        assert Daemon(config(tmp_path, **kw), module_factory=lambda: fm).scheduler.deep is None
    for kw in ({"predict": False}, {"hint_prefetch": True}):  # they change the prefetcher's runs
        with pytest.raises(errors.InvalidValue):
            Daemon(config(tmp_path, **kw), module_factory=lambda: fm)


def test_a_request_sent_without_waiting_is_answered_only_if_it_fails(daemon: Running) -> None:
    with DaemonClient(daemon.cfg.socket_path) as c:
        c.register("a", "/sb/a", 1)
        c.hint("a", "llm-wait")
        c.hint("nosuch", "tool")  # fails: its answer is set aside by the next request
        assert c.stats("a")["phase"]["phase"] == "llm-wait"
        assert [e["code"] for e in c.async_errors] == ["unknown_sandbox"]
    s = daemon.raw()
    f = s.makefile("rb")
    s.sendall(b'{"id": 1, "op": "ping", "reply": false}\n{"id": 2, "op": "ping"}\n')
    assert json.loads(f.readline())["id"] == 2  # nothing for the first
    s.close()


def test_a_prefetcher_that_could_not_start_plans_no_prefetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import controlplane.daemon

    fm = FakeModule(tmp_path / "cg")
    monkeypatch.setattr(controlplane.daemon, "load_prefetcher",
                        lambda enabled: NoopPrefetcher())
    d = Daemon(config(tmp_path, prefetch=True), module_factory=lambda: fm)
    assert d.planner.config.restores  # asked for
    d.start()
    try:
        assert not d.planner.config.restores  # none came up: nothing would bring pages back
    finally:
        d.stop()
    assert not Daemon(config(tmp_path), module_factory=lambda: fm).planner.config.restores


def test_the_resident_set_prefetcher_learns_when_a_wait_keeps_its_working_set(
    tmp_path: Path,
) -> None:
    from controlplane.residentset import ResidentSetPrefetcher

    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    d = Daemon(config(tmp_path, prefetch=True, prefetch_from="resident"),
               module_factory=lambda: fm)
    assert d.planner.config.deep_after_kept and d.planner.config.restores
    assert d.scheduler.kept is not None
    d.scheduler.run = lambda: None  # type: ignore[method-assign]  # the test drives it
    d.start()
    try:
        assert isinstance(d.prefetcher, ResidentSetPrefetcher)
        learned: list[str] = []
        d.prefetcher.learn = lambda sb: learned.append(sb.name)  # type: ignore[method-assign]
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            assert c.ping()["prefetch"] == "resident set"
            d._kept("a")  # as the scheduler reports a wait kept at its working set
            assert learned == ["a"]
            d._kept("gone")  # unregistered meanwhile: nothing
            assert learned == ["a"]
            # a wait's first write toward its level: recorded before it; a write that went
            # below the level leaves that record as it is
            d._approach("a")
            assert learned == ["a", "a"]
            d._kept("a", False)
            assert learned == ["a", "a"]
            d._approach("gone")
            assert learned == ["a", "a"]
    finally:
        d.stop()
    with pytest.raises(errors.InvalidValue):
        Daemon(config(tmp_path, prefetch_from="nosuch"), module_factory=lambda: fm)


def test_the_shipped_defaults_record_only_sandboxes_that_announce(tmp_path: Path) -> None:
    """What `azctl daemon` runs without options: the resident-set prefetcher, for announced
    waits only: a sandbox's working set is recorded once it announces, never before (no scan
    of a sandbox whose record nothing would bring back), and an announcement with no record
    makes no prefetch due."""
    from controlplane.residentset import ResidentSetPrefetcher

    shipped = DaemonConfig()
    assert shipped.prefetch and shipped.prefetch_from == "resident"
    assert not shipped.plan.predict_unannounced
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    base = config(tmp_path)
    d = Daemon(replace(base, prefetch=True, prefetch_from="resident", plan=shipped.plan),
               module_factory=lambda: fm)
    d.scheduler.run = lambda: None  # type: ignore[method-assign]  # the test drives it
    d.start()
    try:
        assert isinstance(d.prefetcher, ResidentSetPrefetcher)
        learned: list[str] = []
        forgot: list[str] = []
        d.prefetcher.learn = lambda sb: learned.append(sb.name)  # type: ignore[method-assign]
        d.prefetcher.forget = forgot.append  # type: ignore[method-assign]
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            c.phase("a", "llm-wait")
            d._approach("a")
            d._kept("a")
            assert learned == []  # it never announced: nothing would use the record
            assert not d._recorded("a")  # an announcement would find nothing to bring back
            assert c.ending("a")["prefetch"] is False  # kept its working set so far
            d._kept("a")
            assert learned == ["a"]
            c.phase("a", "tool")
            c.phase("a", "llm-wait")
            forgot.clear()
            d._approach("a")  # the next wait: the sandbox announced its last end
            assert learned == ["a", "a"] and forgot == []
            for _ in range(8):  # it stops announcing: 8 waits later its record goes
                c.phase("a", "tool")
                c.phase("a", "llm-wait")
                d._approach("a")
            # dropped at the start of the 8th unannounced wait
            assert learned == ["a"] * 9 and forgot == ["a"]
            d._kept("a")
            assert learned == ["a"] * 9
    finally:
        d.stop()


def test_with_nothing_recorded_no_prefetch_is_made_due_nor_the_scheduler_held(
    tmp_path: Path,
) -> None:
    """The resident-set prefetcher holds no record (the sandbox's first announced wait): an
    announcement, and a prefetch the planner made due otherwise, bring nothing back, so
    nothing is held and no restore runs; with a record, the announcement holds and is due."""
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    clock = FakeClock()
    d = Daemon(config(tmp_path, prefetch=True, prefetch_from="resident", plan=PlanConfig()),
               module_factory=lambda: fm, clock=clock)
    d._plan_loop = lambda: None  # type: ignore[method-assign]  # the test calls plan_tick()
    d.scheduler.run = lambda: None  # type: ignore[method-assign]  # the test drives it
    d.start()
    try:
        pages = {"a": 0}
        restores: list[str] = []
        d.prefetcher.learned_pages = pages.__getitem__  # type: ignore[method-assign]
        d.prefetcher.restore = (  # type: ignore[method-assign]
            lambda sb: restores.append(sb.name) or {"prefetched_pages": 0})
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            gen = c.phase("a", "llm-wait")["generation"]
            assert d._deep_ok("a", True)  # taken anyway
            assert c.ending("a")["prefetch"] is False
            assert not d.scheduler.held("a", gen)
            c.phase("a", "tool")
            clock.advance(1.0)
            gen = c.phase("a", "llm-wait")["generation"]
            assert c.ending("a")["prefetch"] is False  # kept its working set so far
            assert d._deep_ok("a", True)  # taken anyway: the planner makes its prefetch due
            d.plan_tick()
            assert restores == [] and not d.scheduler.held("a", gen)
            c.phase("a", "tool")
            clock.advance(1.0)
            pages["a"] = 5  # recorded now
            gen = c.phase("a", "llm-wait")["generation"]
            assert d._deep_ok("a", True)
            assert c.ending("a")["prefetch"] is True
            assert d.scheduler.held("a", gen)
    finally:
        d.stop()


def test_a_tool_hint_prefetch_keeps_every_sandbox_recorded(tmp_path: Path) -> None:
    """With hint_prefetch, a tool hint may prefetch any sandbox's record: it is kept for a
    sandbox that never announces."""
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")
    d = Daemon(config(tmp_path, prefetch=True, prefetch_from="resident", hint_prefetch=True,
                      plan=PlanConfig()), module_factory=lambda: fm)
    d.scheduler.run = lambda: None  # type: ignore[method-assign]  # the test drives it
    d.start()
    try:
        learned: list[str] = []
        d.prefetcher.learn = lambda sb: learned.append(sb.name)  # type: ignore[method-assign]
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            c.phase("a", "llm-wait")
            d._approach("a")
            d._kept("a")
            assert learned == ["a", "a"]
    finally:
        d.stop()


def test_a_restore_that_brought_pages_back_is_told_to_the_scheduler(tmp_path: Path) -> None:
    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")

    class Brings:
        pages = 0

        def restore(self, sb: object) -> dict[str, int]:
            return {"prefetched_pages": self.pages}

    pf = Brings()
    d = Daemon(config(tmp_path), module_factory=lambda: fm, prefetcher=pf)
    told: list[str] = []
    d.scheduler.restored = told.append  # type: ignore[method-assign]
    d.scheduler.run = lambda: None  # type: ignore[method-assign]
    d.start()
    try:
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            sb = d.registry.sandbox("a")
            for pf.pages in (0, 5):
                with d._plan_lock:
                    token = d.planner.prefetch_started("a")
                d._restore(sb, token)
    finally:
        d.stop()
    assert told == ["a"]  # only the restore that brought pages back


def test_an_announced_sandbox_s_working_set_goes_once_it_is_learnt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:

    make_cgroup(tmp_path / "cg", "/sb/a")
    fm = FakeModule(tmp_path / "cg")

    class Learns:
        def __init__(self) -> None:
            self.learnt: list[str] = []

        def learn(self, sb: Any) -> None:
            self.learnt.append(sb.name)

        def restore(self, sb: object) -> dict[str, int]:
            return {"prefetched_pages": 0}

    pf = Learns()
    d = Daemon(config(tmp_path, plan=PlanConfig(deep_after_kept=True)),
               module_factory=lambda: fm, prefetcher=pf)
    woken: list[bool] = []
    d.scheduler.run = lambda: None  # type: ignore[method-assign]
    d.scheduler.wake = lambda: woken.append(True)  # type: ignore[method-assign]
    d.start()
    try:
        with DaemonClient(d.config.socket_path) as c:
            c.register("a", "/sb/a", 1)
            for _ in range(2):
                c.phase("a", "llm-wait")
                c.ending("a")
                c.phase("a", "tool")
            c.phase("a", "llm-wait")  # its ends are announced
            assert not d.planner.deep_ok("a", d.clock())  # not before it was learnt
            woken.clear()
            # the scheduler reports the wait kept at its working set, after a write that went
            # below it: the record taken before the first write stands, and it goes all the same
            with caplog.at_level(logging.INFO, logger="azswap.daemon"):
                d._kept("a", False)
            assert pf.learnt == [] and woken
            assert BELOW_WORKING_SET in caplog.text
            assert d.planner.deep_ok("a", d.clock())  # now it goes
    finally:
        d.stop()
