"""What azctl commands talk to: the daemon (its socket), or with ``--direct`` the module.

Every command goes to the daemon.  ``azctl --direct`` reads (and, for the policy, writes) the
module itself through netlink and sysfs, for a host where no daemon runs; the commands that
register sandboxes or templates, send hints, compress or prefetch need the daemon and refuse
``--direct``.  Without ``--direct`` and without a daemon a command fails with one line.

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
    direct: bool = False
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

    def client(self, what: str = "this command") -> DaemonClient:
        """The daemon, for commands that only it can do."""
        if self.direct:
            raise errors.InvalidValue(
                f"{what} needs the daemon (--direct reads the module: status, top, stats, "
                "sandbox ls, template ls, policy)"
            )
        if self._client is None:
            self._client = DaemonClient(self.socket)
        return self._client

    def _daemon(self) -> DaemonClient:
        """The daemon, for commands that --direct can also do (the error says so)."""
        c = self.client()
        try:
            c.ping()
        except errors.DaemonNotRunning as e:
            raise errors.DaemonNotRunning(
                f"{e}, or use 'azctl --direct' to talk to the module"
            ) from None
        return c

    def _registry(self) -> Registry:
        reg = Registry(
            self.module(), state_path(self.dev, self.state_dir), self.cgroup_root, readonly=True
        )
        reg.recover()
        return reg

    def stats(self) -> dict[str, Any]:
        """The daemon's figures (names, phases, compression); --direct: the module's."""
        if not self.direct:
            return dict(self._daemon().stats())
        d = metrics.build(self.module(), self._registry(), self.device())
        d["daemon"] = False
        return d

    def listing(self) -> dict[str, Any]:
        """Sandboxes and templates: the daemon's; --direct: the module's owners, named from
        the daemon's state file."""
        if not self.direct:
            return dict(self._daemon().list())
        reg = self._registry()
        return {
            "sandboxes": [s.to_dict() for s in reg.list_sandboxes()],
            "templates": [t.to_dict() for t in reg.list_templates()],
        }

    def policy_get(self) -> dict[str, Any]:
        if not self.direct:
            return dict(self._daemon().policy_get())
        return self.module().policy_get().to_dict()

    def policy_set(self, fields: dict[str, int]) -> dict[str, Any]:
        """The daemon stops switching fast/dense modes when a policy is set by hand; --direct
        sets the module's (a daemon, if one runs, switches again at its next mode change)."""
        if not self.direct:
            return dict(self._daemon().policy_set(**fields))
        self.module().policy_set(**fields)
        return self.module().policy_get().to_dict()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._module is not None:
            self._module.close()


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise errors.NotRoot(f"{what} needs root")
