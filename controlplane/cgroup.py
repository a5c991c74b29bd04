"""cgroup v2 files the control plane reads and writes (senpai's Cgroup class, for our needs).

The one place that knows cgroupfs: paths and ids (:func:`cgroup_dir`, :func:`cgroup_id`,
:func:`find_by_id`), the files (:class:`Cgroup`), creating and removing a directory
(:func:`create`, :func:`remove`).  The registry, the scheduler, the prefetcher, the fault tracer
and the lab all go through it.  The cgroup2 root and /proc are injectable so tests run against a
fake tree in a tmp dir.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
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


def cgroup_dir(path: str | os.PathLike[str], root: Path = CGROUP_ROOT) -> Path:
    """A cgroup directory from a path under the cgroup2 root ("/sandboxes/sb1", the registry's
    form, or "sandboxes/sb1") or an absolute one under it ("/sys/fs/cgroup/sandboxes/sb1")."""
    s, r = str(path), str(root)
    if s == r or s.startswith(r + "/"):
        return Path(s)
    return Path(root) / s.strip("/")


def cgroup_id(path: str | os.PathLike[str], root: Path = CGROUP_ROOT) -> int:
    """The cgroup v2 id of a cgroup (its directory's inode number, what the module and
    bpf_get_current_cgroup_id() use)."""
    d = cgroup_dir(path, root)
    try:
        return os.stat(d).st_ino
    except OSError as e:
        raise errors.from_oserror(e, f"cgroup {d}") from None


def procs(directory: str | os.PathLike[str]) -> list[int]:
    """The pids in the cgroup.procs of a cgroup directory; empty when it cannot be read (the
    cgroup went away meanwhile)."""
    try:
        return [int(x) for x in (Path(directory) / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def create(path: str | os.PathLike[str], root: Path = CGROUP_ROOT,
           controllers: str = "+memory") -> Path:
    """mkdir -p a cgroup, enabling ``controllers`` in the subtree of each parent it creates
    (and of its direct parent), so the new leaf has them; returns its directory."""
    d = cgroup_dir(path, root)
    r = Path(root)
    parts = d.relative_to(r).parts
    cur = r
    for name in parts:
        if controllers:
            with contextlib.suppress(OSError):  # already on, or not available: the leaf says
                (cur / "cgroup.subtree_control").write_text(controllers)
        cur = cur / name
        try:
            cur.mkdir(exist_ok=True)
        except OSError as e:
            raise errors.from_oserror(e, f"mkdir {cur}") from None
    return d


def remove(path: str | os.PathLike[str], root: Path = CGROUP_ROOT, timeout: float = 10.0,
           recursive: bool = False) -> None:
    """rmdir a cgroup (and, with ``recursive``, its child cgroups first).  A cgroup stays busy
    for a moment after its last task exits, so EBUSY is retried until ``timeout``; a cgroup
    that is already gone is not an error."""
    d = cgroup_dir(path, root)
    if recursive and d.is_dir():
        for child in sorted(p for p in d.iterdir() if p.is_dir()):
            remove(child, root, timeout, recursive=True)
    deadline = time.monotonic() + timeout
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                raise errors.from_oserror(e, f"rmdir {d}") from None
            time.sleep(0.05)


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

    def clear_referenced(self, proc: Path = PROC_ROOT) -> int:
        """Forget which of the cgroup's pages were used: for every process in it and in its
        subgroups, write 1 to /proc/PID/clear_refs, which clears the page-table accessed bits
        and the pages' referenced flags.  Reclaim afterwards sees as recently used only what
        is touched from now on.  Returns the processes done; one that exits meanwhile, or whose
        file cannot be written, is skipped.

        A pid read from cgroup.procs may be reused by another process before it is written:
        each process's /proc directory is opened once, and its clear_refs written through that
        handle only if its /proc/PID/cgroup (read through the same handle, so of the same
        process) still names this cgroup or a subgroup.  The root cgroup is refused: it would
        age every process on the host."""
        if self.path == "/":
            raise errors.InvalidValue("the root cgroup's pages are not aged (every process)")
        return sum(self._clear_refs(proc / str(pid)) for pid in self.subtree_procs())

    def subtree_procs(self) -> list[int]:
        """The pids in this cgroup and its subgroups (as their cgroup.procs list them now)."""
        return [pid for d, _, _ in os.walk(self.dir) for pid in procs(d)]

    def _holds(self, proc_cgroup: str) -> bool:
        """Does a /proc/PID/cgroup text put the process in this cgroup or below it?"""
        for line in proc_cgroup.splitlines():
            if line.startswith("0::"):
                p = line[3:].strip()
                return p == self.path or p.startswith(self.path + "/")
        return False

    def _clear_refs(self, pid_dir: Path) -> int:
        try:
            dfd = os.open(pid_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return 0  # exited
        try:
            fd = os.open("cgroup", os.O_RDONLY, dir_fd=dfd)
            with open(fd, closefd=True) as f:
                if not self._holds(f.read()):
                    return 0  # moved away, or the pid was reused by another process
            fd = os.open("clear_refs", os.O_WRONLY, dir_fd=dfd)
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
            return 1
        except OSError:
            return 0
        finally:
            os.close(dfd)

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


def find_dir_by_id(cgid: int, root: Path = CGROUP_ROOT, limit: int = 100000) -> Path | None:
    """The directory of the cgroup whose id (inode) is ``cgid``, by a walk of the tree (at most
    ``limit`` directories)."""
    for seen, (dirpath, _dirs, _files) in enumerate(os.walk(root)):
        if seen >= limit:
            break
        with contextlib.suppress(OSError):
            if os.stat(dirpath).st_ino == cgid:
                return Path(dirpath)
    return None


def find_by_id(cgid: int, root: Path = CGROUP_ROOT) -> str | None:
    """The path (relative to the root, registry form) of the cgroup whose id is ``cgid``."""
    d = find_dir_by_id(cgid, root)
    if d is None or d == Path(root):
        return None
    return "/" + os.path.relpath(d, root)


@dataclass(frozen=True)
class HostMemory:
    mem_total: int
    mem_available: int
    psi_some_avg10: float
    psi_full_avg10: float
    cpu_psi_some_avg10: float | None = None  # /proc/pressure/cpu; None when the kernel has none

    @property
    def available_fraction(self) -> float:
        return self.mem_available / self.mem_total if self.mem_total else 1.0


def host_memory(proc: Path = PROC_ROOT) -> HostMemory:
    """MemTotal/MemAvailable and /proc/pressure/memory of the host (PSI 0 when absent), and
    /proc/pressure/cpu's some avg10 (None when absent)."""
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
    try:
        cpu = parse_pressure((Path(proc) / "pressure" / "cpu").read_text()).get("some")
    except OSError:
        cpu = None
    return HostMemory(
        mem_total=info.get("MemTotal", 0),
        mem_available=info.get("MemAvailable", info.get("MemFree", 0)),
        psi_some_avg10=psi.get("some", Pressure()).avg10,
        psi_full_avg10=psi.get("full", Pressure()).avg10,
        cpu_psi_some_avg10=None if cpu is None else cpu.avg10,
    )
