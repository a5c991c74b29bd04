"""Helpers for the in-guest azswap tests: the module, devices, swap, cgroups, page workers.

Everything here runs as root inside the test kernel (vm-tests/run). The checkout is read-only in
the guest: scratch files go to /tmp.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import mmap
import os
import subprocess
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
KO = TOP / "kmod" / "azswap.ko"
# The debug build (make kmod-debug): the same module with the core's self-test.
KO_DEBUG = TOP / "build" / "kmod-debug" / "kmod" / "azswap.ko"
HERE = Path(__file__).resolve().parent
SYS_BLOCK = Path("/sys/block")
CGROOT = Path("/sys/fs/cgroup")
PAGE = 4096
DEPS = ("zsmalloc", "lz4_compress", "lz4_decompress", "zstd_compress", "zstd_decompress")


def kernel_series(release: str | None = None) -> str:
    """The supported series (6.1, 6.12, 7.3) a kernel release belongs to: "6.12.95+deb12-amd64"
    is 6.12.  vm-tests/run boots one and mounts the module built for it as kmod/azswap.ko."""
    rel = release or os.uname().release
    return ".".join(rel.split("-")[0].split("+")[0].split(".")[:2])


SERIES = kernel_series()
# 6.12+: the swap core keeps zero-filled pages in its own map; they never reach a swap device.
SWAP_ZEROMAP = SERIES != "6.1"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if check and r.returncode:
        raise OSError(f"{' '.join(cmd)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r


# -- module -----------------------------------------------------------------------------------


def loaded() -> bool:
    return Path("/sys/module/azswap").exists()


def insmod(ko: Path = KO, **params: object) -> None:
    for m in DEPS:
        sh("modprobe", m, check=False)
    if not ko.exists():
        raise OSError(f"{ko} missing: build it on the host first (make kmod / make kmod-debug)")
    args = [f"{k}={v}" for k, v in params.items()]
    r = sh("insmod", str(ko), *args, check=False)
    if r.returncode:
        raise OSError(f"insmod {' '.join(args)} failed: {r.stderr.strip()}")


def rmmod(check: bool = True, settle: bool = True) -> subprocess.CompletedProcess[str]:
    """rmmod azswap. A new block device is probed by udev (blkid opens it, which holds a module
    reference for a moment), so with @settle "in use" is retried for up to 5 s after udev
    settles; a reference that stays (a leak) still fails."""
    r = sh("rmmod", "azswap", check=False)
    deadline = time.monotonic() + (5 if settle else 0)
    while r.returncode and "in use" in (r.stderr or "") and time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            sh("udevadm", "settle", "--timeout=2", check=False)
        time.sleep(0.1)
        r = sh("rmmod", "azswap", check=False)
    if check and r.returncode:
        raise OSError(f"rmmod azswap: exit {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r


def disable_zswap() -> None:
    p = Path("/sys/module/zswap/parameters/enabled")
    if p.exists() and p.read_text().strip() != "N":
        p.write_text("N")


def swaps() -> list[str]:
    return [ln.split()[0] for ln in Path("/proc/swaps").read_text().splitlines()[1:]]


def assert_azswap_swap(dev: int = 0) -> None:
    """Fail unless azswap<dev> is up (its block device in sysfs) and an active swap device: for
    tests whose point is azswap, whatever the helper that brought a swap device up says."""
    name = f"azswap{dev}"
    assert Path(f"/sys/block/{name}").is_dir(), f"/sys/block/{name} missing: azswap is not up"
    active = swaps()
    assert f"/dev/{name}" in active, f"/dev/{name} is not an active swap device: {active}"


def swapoff_all_azswap() -> None:
    for dev in swaps():
        if "azswap" in dev:
            sh("swapoff", dev, check=False)


def cleanup_module() -> None:
    swapoff_all_azswap()
    if loaded():
        rmmod(check=False)


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

    def cols(self, attr: str) -> list[int]:
        return [int(x) for x in self.read(attr).split()]

    def mm(self) -> dict[str, int]:
        names = (
            "orig",
            "stored",
            "pool",
            "mem_limit",
            "mem_used_max",
            "same",
            "raw",
            "meta",
            "index",
            "template",
            "compacted",
        )
        return dict(zip(names, self.cols("mm_stat"), strict=False))

    def io(self) -> dict[str, int]:
        names = (
            "failed_stores",
            "failed_loads",
            "invalid_io",
            "notify_free",
            "stores",
            "loads",
            "frees",
            "partial_io",
            "miss_free",
        )
        return dict(zip(names, self.cols("io_stat"), strict=False))

    def kinds(self) -> dict[str, int]:
        names = ("same", "dup", "tdelta", "xdelta", "plain", "raw")
        return dict(zip(names, self.cols("kind_stat"), strict=False))

    def obj(self) -> dict[str, int]:
        names = (
            "pages",
            "objects",
            "bases",
            "template_pages",
            "deferred",
            "cross_group",
            "base_cache_pages",
            "base_cache_hits",
            "base_cache_misses",
        )
        return dict(zip(names, self.cols("obj_stat"), strict=False))

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
        assert o["pages"] == 1, f"{self.name}: {o} (only the swap header should be left)"
        sh("blkdiscard", self.path)
        o = self.wait_drained()
        mm = self.mm()
        assert o["pages"] == 0 and o["objects"] == 0 and o["bases"] == 0, (self.name, o)
        assert o["deferred"] == 0 and o["template_pages"] == 0, (self.name, o)
        assert mm["stored"] == 0 and mm["pool"] == 0 and mm["orig"] == 0, (self.name, mm)

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


class Cgroup:
    def __init__(self, name: str, memory_max: str = "max") -> None:
        parent = CGROOT / "azt"
        if not parent.exists():
            parent.mkdir()
        (parent / "cgroup.subtree_control").write_text("+memory")
        self.path = parent / name
        if not self.path.exists():
            self.path.mkdir()
        self.set("memory.max", memory_max)

    @property
    def id(self) -> int:
        """cgroup v2 id: the inode number of its directory."""
        return os.stat(self.path).st_ino

    @property
    def rel(self) -> str:
        return "/" + str(self.path.relative_to(CGROOT))

    def set(self, f: str, v: str) -> None:
        (self.path / f).write_text(v)

    def get(self, f: str) -> str:
        return (self.path / f).read_text()

    def reclaim(self, amount: str = "1G") -> None:
        try:
            (self.path / "memory.reclaim").write_text(amount)
        except OSError as e:
            if e.errno != errno.EAGAIN:
                raise

    def current(self) -> int:
        return int(self.get("memory.current"))

    def swap_current(self) -> int:
        return int(self.get("memory.swap.current"))

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def remove_cgroups() -> None:
    parent = CGROOT / "azt"
    if parent.exists():
        for c in parent.iterdir():
            if c.is_dir():
                with contextlib.suppress(OSError):
                    c.rmdir()


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


def vmstat() -> dict[str, int]:
    out = {}
    for ln in Path("/proc/vmstat").read_text().splitlines():
        k, v = ln.split()
        out[k] = int(v)
    return out
