"""PageSandbox: a process in a memory cgroup that owns N anonymous pages with verifiable content
and touches chosen pages on command (the tool phase of an agent sandbox, reduced to its memory
behaviour).  Used by bench/phasebench.py and the in-guest prefetch/eBPF tests.

Page i holds a 32-byte header (magic, seed, i, version) and text-like compressible bytes chosen by
(seed, i); ``touch`` reads and verifies every page it is given (all 4096 bytes), optionally
rewrites some (bumping the version), and reports the elapsed time and the process's major-fault
delta (/proc/self/stat majflt) around the touches.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import random
import signal
import struct
import time
import zlib
from collections.abc import Sequence
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any

PAGE = 4096
MAGIC = 0x617A7377_61707067  # "azswappg"
HDR = struct.Struct("<QQQQ")

_WORDS = (
    b"sandbox ",
    b"tool_call ",
    b"llm_wait ",
    b"tensor ",
    b"gradient ",
    b"def step(x): ",
    b"return x ",
    b"import numpy as np\n",
    b"loss=0.4231 ",
    b'{"role": "tool"} ',
    b"assistant ",
    b"/usr/lib/python3 ",
    b"0x7ffd3a10 ",
    b"while True: ",
    b"result ",
)


def _pool(seed: int, size: int = 1 << 18) -> bytes:
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < size:
        out += rng.choice(_WORDS)
        if rng.random() < 0.2:
            out += str(rng.randrange(1 << 30)).encode()
    return bytes(out[:size])


def faults() -> tuple[int, int]:
    """(minor, major) page faults of this process so far (/proc/self/stat)."""
    f = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[7]), int(f[9])



def pswpin() -> int:
    """Pages read from swap, system-wide (/proc/vmstat)."""
    with open("/proc/vmstat") as f:
        for ln in f:
            if ln.startswith("pswpin "):
                return int(ln.split()[1])
    return 0


class _Pages:
    def __init__(self, npages: int, seed: int) -> None:
        self.n, self.seed = npages, seed
        self.pool = _pool(seed)
        self.version = [0] * npages
        self.m = mmap.mmap(-1, npages * PAGE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.m.madvise(mmap.MADV_NOHUGEPAGE)
        self.base = 0

    def expected(self, i: int) -> bytes:
        off = (i * 7919 + self.seed * 131) % (len(self.pool) - PAGE)
        hdr = HDR.pack(MAGIC, self.seed, i, self.version[i])
        return hdr + self.pool[off + HDR.size : off + PAGE]

    def fill(self) -> None:
        for i in range(self.n):
            self.m[i * PAGE : (i + 1) * PAGE] = self.expected(i)

    def touch(self, pages: Sequence[int], write_every: int = 0) -> tuple[int, int]:
        """Verify the pages in order; rewrite every write_every-th one.  (bad, checksum)"""
        bad = 0
        crc = 0
        m = self.m
        for k, i in enumerate(pages):
            got = m[i * PAGE : (i + 1) * PAGE]
            if got != self.expected(i):
                bad += 1
            crc = zlib.crc32(got, crc)
            if write_every and k % write_every == 0:
                self.version[i] += 1
                m[i * PAGE : i * PAGE + HDR.size] = HDR.pack(MAGIC, self.seed, i, self.version[i])
        return bad, crc


def _serve(conn: Connection, cgroup: Path | None, npages: int, seed: int) -> None:
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    pages = _Pages(npages, seed)
    pages.fill()
    addr = ctypes.addressof(ctypes.c_char.from_buffer(pages.m))
    conn.send({"pid": os.getpid(), "addr": addr})
    while True:
        try:
            cmd, args = conn.recv()
        except EOFError:
            return
        if cmd == "touch":
            idx, write_every, spin_s = args
            s0, (n0, m0), t0 = pswpin(), faults(), time.monotonic_ns()
            bad, _ = pages.touch(idx, write_every)
            end = time.monotonic() + spin_s
            while time.monotonic() < end:  # the tool's own CPU work
                zlib.crc32(pages.pool[:4096])
            t1, (n1, m1), s1 = time.monotonic_ns(), faults(), pswpin()
            conn.send(
                {
                    "bad": bad,
                    "majflt": m1 - m0,
                    "minflt": n1 - n0,
                    "pswpin": s1 - s0,
                    "t0_ns": t0,
                    "t1_ns": t1,
                    "seconds": (t1 - t0) / 1e9,
                }
            )
        elif cmd == "verify":
            bad, _ = pages.touch(range(npages))
            conn.send({"bad": bad})
        elif cmd == "exit":
            conn.send({"ok": True})
            return


class PageSandbox:
    """The parent's handle on one sandbox process (fork + a pipe)."""

    def __init__(self, cgroup: Path | None, npages: int, seed: int = 1) -> None:
        self.cgroup, self.npages, self.seed = cgroup, npages, seed
        parent, child = Pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                parent.close()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                _serve(child, cgroup, npages, seed)
                code = 0
            finally:
                os._exit(code)
        child.close()
        self.conn = parent
        self.pid = pid
        hello = self.conn.recv()
        self.addr: int = hello["addr"]

    def page_addr(self, i: int) -> int:
        return self.addr + i * PAGE

    def send_touch(self, pages: Sequence[int], write_every: int = 0, spin_s: float = 0.0) -> None:
        self.conn.send(("touch", (list(pages), write_every, spin_s)))

    def recv(self) -> dict[str, Any]:
        r: dict[str, Any] = self.conn.recv()
        return r

    def touch(
        self, pages: Sequence[int], write_every: int = 0, spin_s: float = 0.0
    ) -> dict[str, Any]:
        self.send_touch(pages, write_every, spin_s)
        return self.recv()

    def verify(self) -> int:
        self.conn.send(("verify", None))
        return int(self.recv()["bad"])

    def stop(self) -> None:
        try:
            self.conn.send(("exit", None))
            self.conn.recv()
        except (OSError, EOFError):
            pass
        self.conn.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
