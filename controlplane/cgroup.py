"""cgroup v2 files the control plane reads and writes (senpai's Cgroup class, for our needs).

The cgroup2 root and /proc are injectable so tests run against a fake tree in a tmp dir.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from controlplane import errors

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_ROOT = Path("/proc")


@dataclass(frozen=True)
class Pressure:
    """One line of a PSI file: avg10/avg60/avg300 in percent, total stall in microseconds."""

    avg10: float = 0.0
    avg60: float = 0.0
    avg300: float = 0.0
    total: int = 0


def parse_pressure(text: str) -> dict[str, Pressure]:
    """'some avg10=0.00 avg60=0.00 avg300=0.00 total=0\\nfull ...' -> {'some': ..., 'full': ...}"""
    out: dict[str, Pressure] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        kv = dict(item.split("=", 1) for item in rest.split() if "=" in item)
        try:
            out[kind] = Pressure(
                float(kv.get("avg10", 0)),
                float(kv.get("avg60", 0)),
                float(kv.get("avg300", 0)),
                int(kv.get("total", 0)),
            )
        except ValueError:
            continue
    return out


def parse_flat_keyed(text: str) -> dict[str, int]:
    """memory.stat / cpu.stat: 'key value' lines."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


def normalize(path: str) -> str:
    """'/sandboxes/sb1' form: relative to the cgroup2 root, leading slash, no trailing one."""
    p = "/" + path.strip().strip("/")
    if ".." in p.split("/"):
        raise errors.InvalidValue(f"cgroup path {path!r}: '..' not allowed")
    return p


class Cgroup:
    """One cgroup v2 directory, addressed by its path relative to the cgroup2 root."""

    def __init__(self, path: str, root: Path = CGROUP_ROOT) -> None:
        self.path = normalize(path)
        self.root = Path(root)
        self.dir = self.root / self.path.lstrip("/")

    def __repr__(self) -> str:
        return f"Cgroup({self.path!r})"

    def exists(self) -> bool:
        return self.dir.is_dir()

    @property
    def id(self) -> int:
        """The cgroup id the kernel uses (the directory's inode number)."""
        try:
            return os.stat(self.dir).st_ino
        except OSError as e:
            raise errors.from_oserror(e, f"cgroup {self.path}") from None

    def _read(self, name: str) -> str:
        try:
            return (self.dir / name).read_text()
        except OSError as e:
            raise errors.from_oserror(e, f"{self.path}/{name}") from None

    def read_int(self, name: str) -> int:
        v = self._read(name).strip()
        if v == "max":
            return -1
        try:
            return int(v)
        except ValueError:
            raise errors.AzswapError(f"{self.path}/{name}: not a number: {v!r}") from None

    def memory_current(self) -> int:
        return self.read_int("memory.current")

    def swap_current(self) -> int:
        try:
            return self.read_int("memory.swap.current")
        except errors.AzswapError:
            return 0

    def memory_stat(self) -> dict[str, int]:
        return parse_flat_keyed(self._read("memory.stat"))

    def cpu_usage_usec(self) -> int:
        return parse_flat_keyed(self._read("cpu.stat")).get("usage_usec", 0)

    def pressure(self, resource: str) -> dict[str, Pressure]:
        """PSI of this cgroup ('memory', 'cpu', 'io'); empty when PSI is off."""
        try:
            return parse_pressure((self.dir / f"{resource}.pressure").read_text())
        except OSError:
            return {}

    def procs(self) -> list[int]:
        return [int(p) for p in self._read("cgroup.procs").split()]

    def reclaim(self, nbytes: int) -> bool:
        """Write ``nbytes`` to memory.reclaim.  True when the kernel reclaimed it all; False when
        it came up short (EAGAIN: nothing more to take).  Other errors raise."""
        fd = None
        try:
            fd = os.open(self.dir / "memory.reclaim", os.O_WRONLY)
            os.write(fd, f"{int(nbytes)}\n".encode())
            return True
        except OSError as e:
            if e.errno == errno.EAGAIN:
                return False
            if e.errno == errno.EINTR:
                return False
            raise errors.from_oserror(e, f"{self.path}/memory.reclaim") from None
        finally:
            if fd is not None:
                os.close(fd)


def find_by_id(cgroup_id: int, root: Path = CGROUP_ROOT) -> str | None:
    """The path of the cgroup whose directory inode is ``cgroup_id`` (a walk of the tree)."""
    root = Path(root)
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            full = os.path.join(dirpath, d)
            try:
                if os.stat(full).st_ino == cgroup_id:
                    return "/" + os.path.relpath(full, root)
            except OSError:
                continue
    return None


@dataclass(frozen=True)
class HostMemory:
    mem_total: int
    mem_available: int
    psi_some_avg10: float
    psi_full_avg10: float

    @property
    def available_fraction(self) -> float:
        return self.mem_available / self.mem_total if self.mem_total else 1.0


def host_memory(proc: Path = PROC_ROOT) -> HostMemory:
    """MemTotal/MemAvailable and /proc/pressure/memory of the host (PSI 0 when absent)."""
    info: dict[str, int] = {}
    for line in (Path(proc) / "meminfo").read_text().splitlines():
        k, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            info[k] = int(parts[0]) * 1024
    try:
        psi = parse_pressure((Path(proc) / "pressure" / "memory").read_text())
    except OSError:
        psi = {}
    return HostMemory(
        mem_total=info.get("MemTotal", 0),
        mem_available=info.get("MemAvailable", info.get("MemFree", 0)),
        psi_some_avg10=psi.get("some", Pressure()).avg10,
        psi_full_avg10=psi.get("full", Pressure()).avg10,
    )
