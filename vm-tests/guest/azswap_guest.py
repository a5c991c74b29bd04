"""Helpers for the in-guest azswap tests: devices, cgroups, page workers.

The module, the shell and the cgroups come from the guest toolkit the benchmarks use
(bench/kit/); the stat files are parsed by column name (controlplane/sysfs.py).  Everything here
runs as root inside the test kernel (vm-tests/run). The checkout is read-only in the guest:
scratch files go to /tmp.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import mmap
import os
import time
from pathlib import Path

from bench.kit.cgroups import LeafCgroup
from bench.kit.module import (  # noqa: F401  (the tests use them through this module)
    KO,
    KO_DEBUG,
    TOP,
    cleanup_module,
    disable_zswap,
    insmod,
    loaded,
    rmmod,
    swaps,
)
from bench.kit.shell import sh
from controlplane.sysfs import STAT_FILES, parse_columns

HERE = Path(__file__).resolve().parent
SYS_BLOCK = Path("/sys/block")
PAGE = 4096


def kernel_series(release: str | None = None) -> str:
    """The supported series (6.1, 6.12, 7.3) a kernel release belongs to: "6.12.95+deb12-amd64"
    is 6.12.  vm-tests/run boots one and mounts the module built for it as kmod/azswap.ko."""
    rel = release or os.uname().release
    return ".".join(rel.split("-")[0].split("+")[0].split(".")[:2])


SERIES = kernel_series()
# 6.12+: the swap core keeps zero-filled pages in its own map; they never reach a swap device.
SWAP_ZEROMAP = SERIES != "6.1"


def assert_azswap_swap(dev: int = 0) -> None:
    """Fail unless azswap<dev> is up (its block device in sysfs) and an active swap device: for
    tests whose point is azswap, whatever the helper that brought a swap device up says."""
    name = f"azswap{dev}"
    assert Path(f"/sys/block/{name}").is_dir(), f"/sys/block/{name} missing: azswap is not up"
    active = swaps()
    assert f"/dev/{name}" in active, f"/dev/{name} is not an active swap device: {active}"


# -- devices ----------------------------------------------------------------------------------


class Dev:
    """/dev/azswapN and its sysfs attributes."""

    def __init__(self, n: int = 0) -> None:
        self.n = n
        self.name = f"azswap{n}"
        self.path = f"/dev/{self.name}"
        self.sys = SYS_BLOCK / self.name

    def read(self, attr: str) -> str:
        return (self.sys / attr).read_text().strip()

    def write(self, attr: str, value: str | bytes) -> int:
        """Write with one write(2); returns 0 or the errno."""
        data = value if isinstance(value, bytes) else value.encode()
        fd = os.open(self.sys / attr, os.O_WRONLY)
        try:
            os.write(fd, data)
            return 0
        except OSError as e:
            return e.errno
        finally:
            os.close(fd)

    def set(self, attr: str, value: str) -> None:
        err = self.write(attr, value)
        if err:
            raise OSError(err, f"{self.name}/{attr} <- {value!r}: {os.strerror(err)}")

    def stat(self, attr: str) -> dict[str, int]:
        """A stat file by column name (controlplane/sysfs.py STAT_FILES, docs/sysfs-abi.md)."""
        return parse_columns(STAT_FILES[attr], self.read(attr))

    def mm(self) -> dict[str, int]:
        return self.stat("mm_stat")

    def io(self) -> dict[str, int]:
        return self.stat("io_stat")

    def kinds(self) -> dict[str, int]:
        return self.stat("kind_stat")

    def obj(self) -> dict[str, int]:
        return self.stat("obj_stat")

    def swapon(self, disksize: str = "256M", prio: int = 100, algo: str | None = None) -> None:
        if algo:
            self.set("comp_algorithm", algo)
        self.set("disksize", disksize)
        sh("mkswap", self.path)
        sh("swapon", "-p", str(prio), self.path)

    def swapoff(self) -> None:
        sh("swapoff", self.path)

    def assert_empty_after_swapoff(self) -> None:
        """After swapoff only swap's header page (slot 0) is left; discarding the whole
        device must then return the store to nothing: no pages, objects or pool memory."""
        o = self.wait_drained()
        assert o["pages_stored"] == 1, f"{self.name}: {o} (only the swap header should be left)"
        sh("blkdiscard", self.path)
        o = self.wait_drained()
        mm = self.mm()
        assert o["pages_stored"] == 0 and o["objects"] == 0 and o["bases"] == 0, (self.name, o)
        assert o["deferred"] == 0 and o["template_pages"] == 0, (self.name, o)
        assert mm["compr_data_size"] == 0 and mm["mem_used_total"] == 0, (self.name, mm)
        assert mm["orig_data_size"] == 0, (self.name, mm)

    def wait_drained(self, timeout: float = 20) -> dict[str, int]:
        """Wait for the deferred frees to finish; returns obj_stat."""
        end = time.monotonic() + timeout
        while True:
            o = self.obj()
            if o["deferred"] == 0:
                return o
            assert time.monotonic() < end, f"{self.name}: deferred frees not done in {timeout}s {o}"
            time.sleep(0.05)


# -- cgroups ----------------------------------------------------------------------------------


class Cgroup(LeafCgroup):
    """A leaf memory cgroup under /sys/fs/cgroup/azt."""

    parent = "azt"

    def __init__(self, name: str, memory_max: str = "max") -> None:
        super().__init__(name, memory_max)


def remove_cgroups() -> None:
    Cgroup.remove_all()


# -- patterned pages --------------------------------------------------------------------------


def build_azpages() -> ctypes.CDLL:
    src = HERE / "azpages.c"
    tag = hashlib.sha1(src.read_bytes()).hexdigest()[:12]
    so = Path(f"/tmp/azpages-{tag}.so")
    if not so.exists():
        tmp = so.with_suffix(".tmp")
        sh("gcc", "-O2", "-shared", "-fPIC", "-o", str(tmp), str(src))
        tmp.rename(so)
    lib = ctypes.CDLL(str(so))
    u64, vp = ctypes.c_uint64, ctypes.c_void_p
    lib.az_fill.argtypes = [vp, u64, u64]
    lib.az_edit.argtypes = [vp, u64, u64, u64, u64]
    lib.az_verify.argtypes = [vp, u64, u64, u64, u64, ctypes.POINTER(u64)]
    lib.az_verify.restype = u64
    lib.az_touch.argtypes = [vp, u64]
    lib.az_touch.restype = u64
    lib.az_kind.argtypes = [u64, u64]
    lib.az_kind.restype = ctypes.c_int
    lib.az_marked_io.argtypes = [ctypes.c_int, ctypes.c_int, vp, u64, ctypes.c_int]
    lib.az_marked_io.restype = ctypes.c_long
    return lib


class Worker:
    """A process that owns (or shares, after a fork) a region of patterned pages.

    Commands go over FIFOs in /tmp so a worker can fork further workers (sandboxes from a
    template) that the test drives the same way. Each worker joins its cgroup before it touches
    any page, so the pages are charged there.
    """

    _n = 0

    def __init__(
        self,
        lib: ctypes.CDLL,
        cgroup: Cgroup | None,
        npages: int,
        seed: int,
        thp: bool = False,
        _spawn: bool = True,
    ) -> None:
        Worker._n += 1
        self.lib, self.cgroup, self.npages, self.seed = lib, cgroup, npages, seed
        self.variant, self.every = 0, 0
        self.name = f"w{os.getpid()}-{Worker._n}"
        self.cmd_fifo = Path(f"/tmp/{self.name}.cmd")
        self.resp_fifo = Path(f"/tmp/{self.name}.resp")
        for f in (self.cmd_fifo, self.resp_fifo):
            if f.exists():
                f.unlink()
            os.mkfifo(f)
        self.pid = 0
        if _spawn:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    self._join()
                    region = mmap.mmap(-1, npages * PAGE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                    region.madvise(mmap.MADV_HUGEPAGE if thp else mmap.MADV_NOHUGEPAGE)
                    self._serve(region)
                    code = 0
                finally:
                    os._exit(code)
            self.pid = pid
            self._connect()

    def _connect(self) -> None:
        self.cin = open(self.cmd_fifo, "w", buffering=1)  # noqa: SIM115
        self.cout = open(self.resp_fifo)  # noqa: SIM115

    def _join(self) -> None:
        if self.cgroup is not None:
            (self.cgroup.path / "cgroup.procs").write_text(str(os.getpid()))

    def _serve(self, region: mmap.mmap) -> None:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
        lib, n = self.lib, self.npages
        cin = open(self.cmd_fifo)  # noqa: SIM115
        cout = open(self.resp_fifo, "w", buffering=1)  # noqa: SIM115
        for line in cin:
            op, *args = line.split()
            if op == "fill":
                lib.az_fill(addr, n, self.seed)
                cout.write("ok\n")
            elif op == "edit":
                self.variant, self.every = int(args[0]), int(args[1])
                lib.az_edit(addr, n, self.seed, self.variant, self.every)
                cout.write("ok\n")
            elif op == "verify":
                first = ctypes.c_uint64()
                bad = lib.az_verify(
                    addr, n, self.seed, self.variant, self.every, ctypes.byref(first)
                )
                cout.write(f"ok {bad} {first.value}\n")
            elif op == "touch":
                lib.az_touch(addr, n)
                cout.write("ok\n")
            elif op == "fork":
                cg_path = Path(args[0])
                child = Worker.__new__(Worker)
                child.__dict__.update(self.__dict__)
                child.name = args[1]
                child.cmd_fifo = Path(f"/tmp/{child.name}.cmd")
                child.resp_fifo = Path(f"/tmp/{child.name}.resp")
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        cin.close()
                        (cg_path / "cgroup.procs").write_text(str(os.getpid()))
                        child._serve(region)
                        code = 0
                    finally:
                        os._exit(code)
                cout.write(f"ok {pid}\n")
            elif op == "exit":
                cout.write("ok\n")
                break
            else:
                cout.write(f"err unknown {op}\n")

    # -- test side ----------------------------------------------------------------------------

    def send(self, line: str) -> None:
        self.cin.write(line + "\n")

    def recv(self) -> list[str]:
        resp = self.cout.readline().split()
        if not resp or resp[0] != "ok":
            raise RuntimeError(f"worker {self.name}: {resp or 'died'}")
        return resp[1:]

    def call(self, line: str) -> list[str]:
        self.send(line)
        return self.recv()

    def fork(self, cgroup: Cgroup) -> Worker:
        """A sandbox forked from this worker (copy-on-write), in @cgroup."""
        Worker._n += 1
        child = Worker(self.lib, cgroup, self.npages, self.seed, _spawn=False)
        child.variant, child.every = self.variant, self.every
        # The fork command passes the child's FIFO names.
        name = child.name
        self.send(f"fork {cgroup.path} {name}")
        child.pid = int(self.recv()[0])
        child._connect()
        return child

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            self.call("exit")
        for f in (self.cin, self.cout):
            with contextlib.suppress(OSError):
                f.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        for f in (self.cmd_fifo, self.resp_fifo):
            if f.exists():
                f.unlink()


def all_call(workers: list[Worker], line: str) -> list[list[str]]:
    """Send one command to every worker first, then collect: they run in parallel."""
    for w in workers:
        w.send(line)
    return [w.recv() for w in workers]


def verify_all(workers: list[Worker]) -> None:
    for w, r in zip(workers, all_call(workers, "verify"), strict=False):
        bad, first = int(r[0]), int(r[1])
        assert bad == 0, f"{w.name}: {bad} of {w.npages} pages corrupt, first at page {first}"


def swap_all(w: Worker, cg: Cgroup) -> None:
    """Reclaim ``cg`` until swap holds at least the worker's region (a few tries), else fail."""
    for _ in range(5):
        cg.reclaim("1G")
        if cg.swap_current() >= w.npages * PAGE:
            return
    raise AssertionError(f"{cg.path}: {cg.swap_current()} bytes swapped of {w.npages} pages")


def zero_pages(lib: ctypes.CDLL, seed: int, npages: int) -> int:
    """At most how many of a worker's pages (azpages.c, ``seed``) the swap core keeps out of
    the device: its all-zero pages from 6.12 on (the zero map; a huge page swapped out whole
    keeps its zero subpages unless all are zero), none on 6.1."""
    if not SWAP_ZEROMAP:
        return 0
    return sum(lib.az_kind(seed, i) == 0 for i in range(npages))


def vmstat() -> dict[str, int]:
    out = {}
    for ln in Path("/proc/vmstat").read_text().splitlines():
        k, v = ln.split()
        out[k] = int(v)
    return out
