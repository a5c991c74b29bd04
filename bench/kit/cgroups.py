"""Leaf memory cgroups for lab workloads and guest tests, and pushing them to swap.

Built on controlplane.cgroup (the product's one cgroup module): paths, create, remove with the
EBUSY retry, memory.stat parsing, memory.reclaim.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from controlplane import cgroup as cgroups
from controlplane.cgroup import CGROUP_ROOT, Cgroup
from controlplane.sysfs import parse_size


def of(directory: str | os.PathLike[str]) -> Cgroup:
    """The controlplane Cgroup of a directory under /sys/fs/cgroup."""
    d = cgroups.cgroup_dir(directory)
    return Cgroup("/" + str(d.relative_to(CGROUP_ROOT)))


def stat(directory: str | os.PathLike[str]) -> dict[str, int]:
    """memory.stat by name."""
    return of(directory).memory_stat()


def reclaim_all(directory: Path, kind: str = "anon", passes: int = 12) -> float:
    """Push a cgroup's anonymous memory (kind="anon") or tmpfs pages (kind="shmem") to swap:
    memory.reclaim of what memory.stat still shows, until less than 64 KiB is left or a pass
    comes up short; returns the seconds spent in memory.reclaim."""
    cg = of(directory)
    spent = 0.0
    for _ in range(passes):
        left = cg.memory_stat().get(kind, 0)
        if left < 64 * 1024:
            break
        t0 = time.perf_counter()
        cg.reclaim(left + (1 << 20))
        spent += time.perf_counter() - t0
    return spent


def joiner(directory: Path | None) -> Callable[[], None]:
    """A subprocess preexec_fn that moves the child into ``directory`` (None: stays put)."""

    def join() -> None:
        if directory is not None:
            (Path(directory) / "cgroup.procs").write_text(str(os.getpid()))

    return join


def make_tree(parent: Path, names: list[str]) -> dict[str, Path]:
    """Leaf cgroups ``parent/NAME`` with the memory controller; name -> directory."""
    return {n: cgroups.create(parent / n) for n in names}


def remove_tree(parent: Path) -> None:
    """Remove ``parent`` and every cgroup below it (each retried while it is still busy)."""
    cgroups.remove(parent, recursive=True)


class LeafCgroup:
    """One leaf memory cgroup ``/sys/fs/cgroup/PARENT/NAME`` (created if missing)."""

    parent = "azt"

    def __init__(self, name: str, memory_max: str | None = None) -> None:
        self.path = cgroups.create(CGROUP_ROOT / self.parent / name)
        self.cg = of(self.path)
        if memory_max is not None:
            self.set("memory.max", memory_max)

    @property
    def id(self) -> int:
        """cgroup v2 id: the inode number of its directory."""
        return self.cg.id

    @property
    def rel(self) -> str:
        """Its path relative to the cgroup2 root (the registry's and the module's form)."""
        return self.cg.path

    def set(self, f: str, v: str) -> None:
        (self.path / f).write_text(v)

    def get(self, f: str) -> str:
        return (self.path / f).read_text()

    def reclaim(self, amount: str = "1G") -> None:
        """One memory.reclaim write (coming up short is not an error)."""
        self.cg.reclaim(parse_size(amount))

    def reclaim_all(self, tries: int = 8) -> None:
        """memory.reclaim until a pass comes up short."""
        for _ in range(tries):
            if not self.cg.reclaim(1 << 30):
                return

    def stat(self) -> dict[str, int]:
        return self.cg.memory_stat()

    def current(self) -> int:
        return self.cg.memory_current()

    def swap_current(self) -> int:
        return self.cg.read_int("memory.swap.current")

    def remove(self) -> None:
        cgroups.remove(self.path)

    @classmethod
    def remove_all(cls) -> None:
        """Every cgroup under this class's parent, and the parent."""
        remove_tree(CGROUP_ROOT / cls.parent)
