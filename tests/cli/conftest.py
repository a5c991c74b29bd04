"""azctl under click's CliRunner: a daemon on a tmp socket over a fake module and cgroup tree."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from azctl.env import Env
from azctl.main import cli
from click.testing import CliRunner, Result

from controlplane.daemon import Daemon, DaemonConfig
from controlplane.scheduler import SchedulerConfig
from tests.fakes import FakeCgroup, FakeClock, FakeModule, make_cgroup, make_proc


@dataclass
class World:
    tmp: Path
    module: FakeModule
    daemon: Daemon | None
    socket: Path

    def env(self, **kw: Any) -> Env:
        base: dict[str, Any] = dict(
            socket=self.socket,
            sys_block=self.tmp / "sys",
            cgroup_root=self.tmp / "cg",
            state_dir=self.tmp / "run",
            module_factory=lambda dev: self.module,
        )
        base.update(kw)
        return Env(**base)

    def run(self, *args: str, env: Env | None = None) -> Result:
        runner = CliRunner()
        return runner.invoke(
            cli, list(args), obj=env or self.env(), env={"COLUMNS": "200"}, catch_exceptions=False
        )


def _world(tmp: Path, start_daemon: bool) -> World:
    for p in ("/sb/a", "/sb/b", "/tpl/base"):
        make_cgroup(tmp / "cg", p, memory=8 << 20)
    module = FakeModule(tmp / "cg")
    sock = tmp / "run" / "azswap.sock"
    d = None
    if start_daemon:
        cfg = DaemonConfig(
            socket_path=sock,
            cgroup_root=tmp / "cg",
            proc_root=make_proc(tmp / "proc"),
            sys_block=tmp / "sys",
            state_dir=tmp / "run",
            follow_events=False,
            prefetch=False,
            scheduler=SchedulerConfig(
                interval=0.05, grace=0.0, cpu_budget=1.0, chunk_bytes=1 << 20
            ),
        )
        d = Daemon(cfg, module_factory=lambda: module)
        d.registry.cgroup_factory = functools.partial(
            FakeCgroup, clock=FakeClock(), bytes_per_second=1 << 40
        )
        d.start()
    return World(tmp, module, d, sock)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = _world(tmp_path, True)
    yield w
    assert w.daemon is not None
    w.daemon.stop()


@pytest.fixture
def offline(tmp_path: Path) -> World:
    """A fake module but no daemon."""
    return _world(tmp_path, False)
