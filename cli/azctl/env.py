"""What azctl commands talk to: the module (netlink + sysfs) and the daemon (its socket).

Everything is created lazily and can be injected (tests pass an Env with a fake module factory and
a daemon socket in a tmp dir).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane import errors, metrics
from controlplane.cgroup import CGROUP_ROOT
from controlplane.client import DEFAULT_SOCKET, DaemonClient
from controlplane.registry import RUN_DIR, ModuleBackend, Registry, state_path
from controlplane.sysfs import SYS_BLOCK, Device


@dataclass
class Env:
    socket: Path = DEFAULT_SOCKET
    dev: int = 0
    debug: bool = False
    sys_block: Path = SYS_BLOCK
    cgroup_root: Path = CGROUP_ROOT
    state_dir: Path = RUN_DIR
    module_factory: Callable[[int], ModuleBackend] | None = None
    _module: ModuleBackend | None = field(default=None, repr=False)
    _client: DaemonClient | None = field(default=None, repr=False)

    def module(self) -> ModuleBackend:
        if self._module is None:
            if self.module_factory is None:
                from controlplane.netlink import AzswapNetlink  # pyroute2: only when needed

                self._module = AzswapNetlink(self.dev)
            else:
                self._module = self.module_factory(self.dev)
        return self._module

    def device(self) -> Device:
        return Device(self.dev, self.sys_block)

    def client(self) -> DaemonClient:
        if self._client is None:
            self._client = DaemonClient(self.socket)
        return self._client

    def daemon_running(self) -> bool:
        try:
            self.client().ping()
            return True
        except errors.DaemonNotRunning:
            return False

    def stats(self) -> dict[str, Any]:
        """From the daemon when it runs (names, phases, compression), else from the module."""
        if self.daemon_running():
            return dict(self.client().stats())
        module = self.module()
        reg = Registry(
            module, state_path(self.dev, self.state_dir), self.cgroup_root, readonly=True
        )
        reg.recover()
        d = metrics.build(module, reg, self.device())
        d["daemon"] = False
        return d

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._module is not None:
            self._module.close()


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise errors.NotRoot(f"{what} needs root")
