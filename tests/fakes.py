"""Test fakes: an in-memory azswap.ko netlink interface, a fake clock, /proc and cgroup trees.

:class:`FakeModule` implements :class:`controlplane.registry.ModuleBackend` with the error
behaviour docs/netlink.md specifies (EEXIST, ENOENT, EINVAL, EBUSY, EPERM through
:func:`errors.from_netlink`), so code above it cannot tell the difference.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from dataclasses import replace
from pathlib import Path

from controlplane import errors
from controlplane.abi import (
    KINDS,
    MAX_LOAD_PAGES,
    PAGE_SIZE,
    Cmd,
    Info,
    OwnerStats,
    Phase,
    Policy,
    policy_error,
)
from controlplane.cgroup import CGROUP_ROOT, Cgroup


def _err(cmd: Cmd, code: int, msg: str | None = None) -> errors.AzswapError:
    return errors.from_netlink(code, msg, cmd.name)


class FakeModule:
    def __init__(self, cgroup_root: Path = CGROUP_ROOT, *, admin: bool = True) -> None:
        self.cgroup_root = Path(cgroup_root)
        self.admin = admin
        self.owners: dict[int, OwnerStats] = {}
        self.loaded: dict[int, dict[int, bytes]] = {}
        self.maps: dict[int, tuple[int, int, int]] = {}
        self.policy = Policy()
        self.unregistered: set[int] = set()  # removed, still listed while they own pages
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self._lock = threading.Lock()
        self.closed = False

    def _admin(self, cmd: Cmd) -> None:
        self.calls.append((cmd.name, ()))
        if not self.admin:
            raise _err(cmd, errno.EPERM)

    def info(self) -> Info:
        return Info(version=1, nr_devices=1)

    def _add(self, cmd: Cmd, group: int, cgroup_id: int | None, cgroup_path: str | None) -> int:
        self._admin(cmd)
        if group == 0 or group > 2**31 - 1:
            raise _err(cmd, errno.EINVAL, "AZSWAP_A_GROUP: trust group 0 is invalid")
        if cgroup_path is not None:
            cg = Cgroup(cgroup_path, self.cgroup_root)
            if not cg.exists():
                raise _err(cmd, errno.ENOENT, f"no cgroup {cgroup_path}")
            cid = cg.id
        elif cgroup_id is not None:
            cid = cgroup_id
            if cmd == Cmd.SANDBOX_ADD and not (cid >> 63):
                pass  # a live cgroup id in the real module; accepted here
        else:
            raise _err(cmd, errno.EINVAL, "missing AZSWAP_A_CGROUP_ID or AZSWAP_A_CGROUP_PATH")
        with self._lock:
            if cid in self.owners and cid not in self.unregistered:
                raise _err(cmd, errno.EEXIST)
            self.unregistered.discard(cid)
            self.owners[cid] = OwnerStats(cid, group, cmd == Cmd.TEMPLATE_ADD)
        return cid

    def sandbox_add(
        self, group: int, *, cgroup_id: int | None = None, cgroup_path: str | None = None
    ) -> int:
        return self._add(Cmd.SANDBOX_ADD, group, cgroup_id, cgroup_path)

    def template_add(
        self, group: int, *, cgroup_id: int | None = None, cgroup_path: str | None = None
    ) -> int:
        return self._add(Cmd.TEMPLATE_ADD, group, cgroup_id, cgroup_path)

    def _del(self, cmd: Cmd, cgroup_id: int, template: bool) -> None:
        self._admin(cmd)
        with self._lock:
            o = self.owners.get(cgroup_id)
            if o is None or o.is_template != template or cgroup_id in self.unregistered:
                raise _err(cmd, errno.ENOENT)
            if o.pages and not template:
                # like the core: a removed sandbox stays listed (unregistered) until its pages
                # are freed; a removed template's loaded bases go (no deltas in this fake)
                self.unregistered.add(cgroup_id)
                o.phase = Phase.UNKNOWN
            else:
                del self.owners[cgroup_id]
            self.loaded.pop(cgroup_id, None)

    def reset(self) -> None:
        """Like `echo 1 > reset` on the device: every registration and stored page is gone."""
        with self._lock:
            self.owners.clear()
            self.unregistered.clear()
            self.loaded.clear()

    def sandbox_del(self, cgroup_id: int) -> None:
        self._del(Cmd.SANDBOX_DEL, cgroup_id, False)

    def template_del(self, cgroup_id: int) -> None:
        self._del(Cmd.TEMPLATE_DEL, cgroup_id, True)

    def template_load(self, cgroup_id: int, index: int, pages: bytes) -> None:
        self._admin(Cmd.TEMPLATE_LOAD)
        n, rest = divmod(len(pages), PAGE_SIZE)
        if rest or not 1 <= n <= MAX_LOAD_PAGES:
            raise _err(Cmd.TEMPLATE_LOAD, errno.EINVAL, "AZSWAP_A_PAGES: not 1..15 whole pages")
        with self._lock:
            o = self.owners.get(cgroup_id)
            if o is None or not o.is_template:
                raise _err(Cmd.TEMPLATE_LOAD, errno.ENOENT)
            store = self.loaded.setdefault(cgroup_id, {})
            for i in range(n):
                if index + i not in store:
                    o.pages += 1
                    o.orig_bytes += PAGE_SIZE
                    o.exclusive_bytes += PAGE_SIZE // 4
                    o.kinds["plain"] += 1
                store[index + i] = bytes(pages[i * PAGE_SIZE : (i + 1) * PAGE_SIZE])

    def stats(self, cgroup_id: int | None = None) -> list[OwnerStats]:
        with self._lock:
            if cgroup_id is None:
                return [self._snapshot(o) for o in self.owners.values()]
            o = self.owners.get(cgroup_id)
            if o is None:
                raise _err(Cmd.STATS_GET, errno.ENOENT)
            return [self._snapshot(o)]

    def _snapshot(self, o: OwnerStats) -> OwnerStats:
        return replace(o, kinds=dict(o.kinds), registered=o.cgroup_id not in self.unregistered)

    def policy_get(self) -> Policy:
        return replace(self.policy)

    def policy_set(self, **fields: int) -> None:
        self._admin(Cmd.POLICY_SET)
        for k, v in fields.items():
            why = policy_error(k, v)
            if why is not None:
                raise _err(Cmd.POLICY_SET, errno.EINVAL, why)
        with self._lock:  # like the module: every knob, the codec too, changes live
            for k, v in fields.items():
                setattr(self.policy, k, int(v))

    def phase_set(self, cgroup_id: int, phase: Phase) -> None:
        self._admin(Cmd.PHASE_SET)
        with self._lock:
            o = self.owners.get(cgroup_id)
            if o is None or cgroup_id in self.unregistered:
                raise _err(Cmd.PHASE_SET, errno.ENOENT)
            o.phase = Phase(phase)

    def sandbox_map(self, cgroup_id: int, start: int, pages: int, pgoff: int) -> None:
        self._admin(Cmd.SANDBOX_MAP)
        if start + pages >= 1 << 64 or pgoff + pages >= 1 << 64:
            raise _err(Cmd.SANDBOX_MAP, errno.EINVAL, "the mapped range wraps")
        with self._lock:
            if cgroup_id not in self.owners or cgroup_id in self.unregistered:
                raise _err(Cmd.SANDBOX_MAP, errno.ENOENT)
            self.maps[cgroup_id] = (start, pages, pgoff)

    def store(
        self, cgroup_id: int, pages: int, kind: str = "plain", bytes_each: int = 1024
    ) -> None:
        """Pretend ``pages`` pages of ``cgroup_id`` were swapped out (tests)."""
        assert kind in KINDS
        with self._lock:
            o = self.owners[cgroup_id]
            o.pages += pages
            o.orig_bytes += pages * PAGE_SIZE
            o.exclusive_bytes += pages * bytes_each
            o.kinds[kind] += pages

    def close(self) -> None:
        self.closed = True


class FakeClock:
    """A clock that only moves when told to (``sleep`` advances it)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_proc(
    root: Path, *, total_kb: int = 8 << 20, avail_kb: int = 6 << 20, psi: float = 0.0
) -> Path:
    """A fake /proc with meminfo and pressure/memory."""
    (root / "pressure").mkdir(parents=True, exist_ok=True)
    (root / "meminfo").write_text(
        f"MemTotal:       {total_kb} kB\nMemFree:        {avail_kb} kB\n"
        f"MemAvailable:   {avail_kb} kB\n"
    )
    (root / "pressure" / "memory").write_text(
        f"some avg10={psi:.2f} avg60=0.00 avg300=0.00 total=0\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    return root


def write_pagemap(pid_dir: Path, entries: dict[int, int]) -> None:
    """A sparse fake /proc/PID/pagemap in ``pid_dir``: ``entries`` maps a page address to its
    64-bit entry; the file ends after the highest page given."""
    with open(pid_dir / "pagemap", "wb") as f:
        for addr, e in entries.items():
            f.seek(addr // 4096 * 8)
            f.write(struct.pack("<Q", e))


def make_process(proc: Path, pid: int, cgroup_path: str, start_time: int = 100) -> Path:
    """A fake /proc/PID with a cgroup file (v2) naming ``cgroup_path``, a stat line with
    ``start_time`` and an empty clear_refs; returns the clear_refs file."""
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(f"0::{cgroup_path}\n")
    rest = " ".join(["S"] + ["0"] * 18 + [str(start_time)] + ["0"] * 30)
    (d / "stat").write_text(f"{pid} (python3 (tool)) {rest}\n")
    (d / "clear_refs").write_text("")
    return d / "clear_refs"


def make_cgroup(root: Path, path: str, *, memory: int = 256 << 20, cpu_usec: int = 0) -> Path:
    """A fake cgroup v2 directory with the files the control plane reads and writes."""
    d = root / path.strip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.current").write_text(f"{memory}\n")
    (d / "memory.swap.current").write_text("0\n")
    (d / "memory.reclaim").write_text("")
    (d / "memory.stat").write_text(f"anon {memory}\nfile 0\n")
    (d / "cpu.stat").write_text(f"usage_usec {cpu_usec}\nuser_usec 0\nsystem_usec 0\n")
    (d / "memory.pressure").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    (d / "cgroup.procs").write_text("")
    return d


class FakeCgroup(Cgroup):
    """A cgroup whose memory.reclaim behaves like the kernel's, on a fake tree.

    Each write goes to the real file (so tests can read the last request) and then moves
    ``min(request, memory.current - unreclaimable)`` bytes "to swap", taking
    ``request / bytes_per_second`` seconds of the fake clock; a request it cannot satisfy in full
    comes back short (False, as EAGAIN does).
    """

    def __init__(
        self,
        path: str,
        root: Path,
        clock: FakeClock,
        *,
        bytes_per_second: float = 256 << 20,
        unreclaimable: int = 0,
    ) -> None:
        super().__init__(path, root)
        self.clock = clock
        self.bytes_per_second = bytes_per_second
        self.unreclaimable = unreclaimable
        self.writes: list[int] = []
        self.on_write: list[object] = []  # callables run after each write (tests inject hints)

    def _put(self, name: str, text: str) -> None:
        # atomic, like a cgroupfs read: other threads never see a half-written file
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)

    def set_memory(self, nbytes: int) -> None:
        self._put("memory.current", f"{nbytes}\n")

    def set_cpu_usec(self, usec: int) -> None:
        self._put("cpu.stat", f"usage_usec {usec}\n")

    def reclaim(self, nbytes: int) -> bool:
        super().reclaim(nbytes)
        self.writes.append(nbytes)
        cur = self.memory_current()
        take = max(0, min(nbytes, cur - self.unreclaimable))
        self.set_memory(cur - take)
        self.clock.advance(nbytes / self.bytes_per_second)
        for fn in self.on_write:
            fn()  # type: ignore[operator]
        return take == nbytes


class WorldReadableCopy:
    """This checkout's Python code and its installed dependencies, copied (hard-linked where
    the file system allows) into a fresh 0755 directory under /tmp, so that a process that
    dropped to another uid can run it wherever the checkout lives (a ``mktemp -d`` clone sits
    in a 0700 directory that only its owner can enter).  A context manager: the copy is removed
    on exit.

        with WorldReadableCopy(REPO) as cp:
            subprocess.run(["setpriv", "--reuid=nobody", ..., *cp.azctl("sandbox", "ls")],
                           env={**os.environ, **cp.env})
    """

    def __init__(self, top: Path, base: Path = Path("/tmp")) -> None:
        import shutil
        import sys
        import tempfile
        import tomllib

        top = Path(top).resolve()
        self.root = Path(tempfile.mkdtemp(prefix="azswap-unpriv-", dir=base))
        self.root.chmod(0o755)
        self.python = os.path.realpath(sys.executable)  # the venv's python is in the checkout
        for what in (self.root, Path(self.python)):
            _require_reachable(what)
        project = tomllib.loads((top / "pyproject.toml").read_text())
        for pkg, src in project["tool"]["setuptools"]["package-dir"].items():
            shutil.copytree(top / src, self.root / pkg, copy_function=_link_or_copy)
        for dist in _runtime_dists(project["project"]["name"]):
            for f in dist.files or []:
                if ".." in f.parts:  # console scripts and the like, outside site-packages
                    continue
                dst = self.root / f
                dst.parent.mkdir(parents=True, exist_ok=True)
                if not dst.exists():
                    _link_or_copy(str(dist.locate_file(f)), str(dst))
        for d in [self.root, *self.root.rglob("*")]:
            if d.is_dir():
                d.chmod(0o755)
        self.env = {"PYTHONPATH": str(self.root), "PYTHONDONTWRITEBYTECODE": "1"}

    def azctl(self, *args: str) -> list[str]:
        """argv running azctl from the copy."""
        return [self.python, "-c", "import sys; from azctl.main import main; sys.exit(main())",
                *args]

    def script(self, rel: str, *args: str) -> list[str]:
        """argv running one of the copied packages' files as a script, e.g. ebpf/faulttrace.py."""
        return [self.python, str(self.root / rel), *args]

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> WorldReadableCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _require_reachable(path: Path) -> None:
    for d in [*reversed(Path(path).parents), Path(path)]:
        if d.is_dir() and not d.stat().st_mode & 0o001:
            raise RuntimeError(f"{d} is not traversable by other users: cannot give an "
                               f"unprivileged process {path}")


def _link_or_copy(src: str, dst: str) -> str:
    import shutil

    if os.stat(src).st_mode & 0o004:  # a hard link shares the mode: only for world-readable
        try:
            os.link(src, dst)
            return dst
        except OSError:
            pass
    shutil.copy2(src, dst)
    os.chmod(dst, os.stat(dst).st_mode | 0o444)
    return dst


def _runtime_dists(name: str) -> list:
    """The installed distributions ``name`` needs at run time (no extras), recursively."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        for r in md.distribution(todo.pop()).requires or []:
            req = Requirement(r)
            key = req.name.lower().replace("_", "-")
            if key in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
                continue
            seen[key] = md.distribution(req.name)
            todo.append(req.name)
    return list(seen.values())
