"""PageSandbox: a process in a memory cgroup that owns N anonymous pages with verifiable content
and touches chosen pages on command (the tool phase of an agent sandbox, reduced to its memory
behaviour).  Used by bench/phasebench.py and the in-guest prefetch/eBPF tests.

Pages are near-copies of a template, as sandboxes started from one snapshot are: the template's
page i (:func:`template_page`, chosen by the style and the template seed) holds a 32-byte header
(magic, owner 0, i, version 0) and style-dependent content; a sandbox's page i
(:func:`sandbox_page`) is that page with a small per-sandbox edit: its header carries the
sandbox id and the page's version, and 16 bytes further in are the sandbox's own (a few perturbed
floats for ``ml``, a short token for ``coding``).  The template process (``sid=0``) holds the
template pages unedited.

Styles: ``text`` (the default: text-like bytes), ``ml`` (float32 tensor-like numbers) and
``coding`` (source, JSON and heap-like text).  ``touch`` reads and verifies every page it is
given (all 4096 bytes), rewrites every ``write_every``-th one (bumping its version), runs the
tool's own work (``units`` of the style's work function: for ``coding`` real interpreter work,
ast.parse, re, json and an in-memory sqlite3 query) and reports the elapsed time and the
process's fault deltas (/proc/self/stat) around it.

The region is mapped 2 MiB-aligned at the same virtual address in every sandbox and in the
template, so the module's index hint (the linear page index) names the template's page at the
same index and, with ``thp="host"``, transparent huge pages back it as the host configures them
(``thp="off"``: MADV_NOHUGEPAGE on the region).
"""

from __future__ import annotations

import array
import ast
import contextlib
import ctypes
import json
import os
import random
import re
import signal
import sqlite3
import struct
import time
import zlib
from collections.abc import Sequence
from functools import lru_cache
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any

PAGE = 4096
HUGE = 2 << 20
MAGIC = 0x617A7377_61707067  # "azswappg"
HDR = struct.Struct("<QQQQ")
EDIT = 16  # bytes of per-sandbox content besides the header
STYLES = ("text", "ml", "coding")
# Where every sandbox maps its pages (2 MiB-aligned, the same in each process).
REGION_ADDR = 0x5A0000000000

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
_CODE = (
    b"def test_parse(tmp_path):\n    ",
    b"assert result.returncode == 0\n",
    b"import json, re, sqlite3\n",
    b'{"file": "src/app/models.py", "line": 42, "kind": "edit"}\n',
    b"class Handler(BaseHandler):\n    ",
    b"    return self._cache.get(key)\n",
    b"Traceback (most recent call last):\n",
    b'  File "/work/repo/tests/test_api.py", line 118, in test_list\n',
    b"SELECT id, name FROM files WHERE path LIKE ? ORDER BY id;\n",
    b"diff --git a/src/app/views.py b/src/app/views.py\n",
    b"+    if not items:\n+        raise ValueError(msg)\n",
    b"\x00\x00\x00\x00\x10\x7f\x00\x00",  # heap-like: pointers between strings
    b"PASSED tests/test_models.py::test_save\n",
)


@lru_cache(maxsize=8)
def _pool(style: str, seed: int, size: int = 1 << 18) -> bytes:
    """The style's content source: template page i is a slice of it chosen by i."""
    rng = random.Random(f"{style}:{seed}")
    if style == "ml":
        # tensor-like float32: weights ~ N(0, 0.02), rows of optimizer state and activations
        n = size // 4
        vals = array.array("f", (rng.gauss(0.0, 0.02) for _ in range(n)))
        for k in range(0, n, 1024):  # some rows of small positive scales (like Adam's v)
            if rng.random() < 0.25:
                for j in range(k, min(k + 1024, n)):
                    vals[j] = abs(vals[j]) * 1e-3
        return vals.tobytes()
    words = _CODE if style == "coding" else _WORDS
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words)
        if rng.random() < 0.2:
            out += str(rng.randrange(1 << 30)).encode()
    return bytes(out[:size])


def template_page(style: str, seed: int, i: int, version: int = 0) -> bytes:
    """The template's page i (owner 0 in its header)."""
    pool = _pool(style, seed)
    off = ((i * 7919 + seed * 131) % ((len(pool) - PAGE) // 4)) * 4
    return HDR.pack(MAGIC, 0, i, version) + pool[off + HDR.size : off + PAGE]


def edit_offset(sid: int, i: int) -> int:
    """Where the sandbox's own 16 bytes sit in its page i (4-byte aligned, after the header)."""
    return HDR.size + ((sid * 2654435761 + i * 40503) % ((PAGE - HDR.size - EDIT) // 4)) * 4


@lru_cache(maxsize=1 << 16)
def edit_bytes(style: str, sid: int, i: int) -> bytes:
    """The sandbox's own 16 bytes in its page i."""
    if style == "ml":  # four perturbed floats
        r = random.Random(sid * 1_000_003 + i)
        return struct.pack("<4f", *(r.gauss(0.0, 0.02) for _ in range(4)))
    return f"sb{sid:04d}p{i:07d}.".encode()[:EDIT].ljust(EDIT, b".")


def sandbox_page(template: bytes, style: str, sid: int, i: int, version: int = 0) -> bytes:
    """Sandbox ``sid``'s page i: the template's page i with the sandbox's edit (sid 0: the
    template itself)."""
    if sid == 0:
        return HDR.pack(MAGIC, 0, i, version) + template[HDR.size :]
    off = edit_offset(sid, i)
    return (HDR.pack(MAGIC, sid, i, version) + template[HDR.size : off]
            + edit_bytes(style, sid, i) + template[off + EDIT :])


def expected_page(style: str, seed: int, sid: int, i: int, version: int = 0) -> bytes:
    return sandbox_page(template_page(style, seed, i), style, sid, i, version)


# -- the tool's own work -----------------------------------------------------------------------

_SOURCE = (
    "import json\n\nclass Cache:\n    def __init__(self, n):\n        self.n = n\n"
    "        self.d = {}\n\n    def get(self, k, default=None):\n"
    "        return self.d.get(k, default)\n\n"
    "def handler(req):\n    items = [x * 2 for x in req.get('items', []) if x % 3]\n"
    "    if not items:\n        raise ValueError('empty')\n"
    "    return json.dumps({'n': len(items), 'sum': sum(items)})\n"
) * 4
_PATTERN = re.compile(rb"(def|class) (\w+)|SELECT \w+|line (\d+)")


class Worker:
    """One unit of a style's tool work; for ``coding`` it keeps interpreter state (parsed
    trees, an sqlite3 database, decoded JSON) alive, as a coding agent's interpreter does."""

    def __init__(self, style: str, seed: int) -> None:
        self.style = style
        self.pool = _pool(style, seed)
        self.rng = random.Random(seed)
        self.keep: list[Any] = []
        self.db: sqlite3.Connection | None = None
        if style == "coding":
            self.db = sqlite3.connect(":memory:")
            self.db.execute("CREATE TABLE files (id INTEGER PRIMARY KEY, path TEXT, size INT)")
            self.db.executemany("INSERT INTO files (path, size) VALUES (?, ?)",
                                [(f"src/m{k}/f{k % 37}.py", k * 13 % 4099) for k in range(2000)])
            self.db.commit()

    def unit(self, k: int) -> int:
        off = (k * 4093) % (len(self.pool) - PAGE) // 4 * 4
        chunk = self.pool[off : off + PAGE]
        if self.style == "ml":
            v = array.array("f", chunk)
            return int(sum(x * x for x in v) * 1e6) ^ zlib.crc32(chunk)  # finite: N(0, 0.02)
        if self.style != "coding":
            return zlib.crc32(chunk)
        tree = ast.parse(_SOURCE)
        hits = len(_PATTERN.findall(chunk))
        doc = json.loads(json.dumps({"k": k, "hits": hits, "names": [
            n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]}))
        assert self.db is not None
        (n,) = self.db.execute("SELECT COUNT(*) FROM files WHERE size > ? AND path LIKE ?",
                               (k % 4000, f"%f{k % 37}.py")).fetchone()
        if len(self.keep) < 64:  # the interpreter's heap grows a little, as a session's does
            self.keep.append((tree, doc))
        return int(n) + hits

    def run(self, units: int, start: int = 0) -> int:
        acc = 0
        for k in range(start, start + units):
            acc ^= self.unit(k)
        return acc


def calibrate(style: str, seed: int = 1, seconds: float = 0.3, samples: int = 5) -> float:
    """Units of the style's work per second in this process (at least 1): the best of
    ``samples`` timings of ``seconds`` each, after an untimed one that warms the caches.  The
    best, because a moment of contention in one timing would otherwise shrink every tool
    phase's work for the whole run (and with it the part of a tool that is its own work)."""
    w = Worker(style, seed)
    n = 0
    best = 0.0
    for i in range(samples + 1):
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            w.unit(n)
            n += 1
            done += 1
        if i:
            best = max(best, done / (time.perf_counter() - t0))
    return max(best, 1.0)


# -- the sandbox process -----------------------------------------------------------------------


def faults() -> tuple[int, int]:
    """(minor, major) page faults of this process so far (/proc/self/stat)."""
    f = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[7]), int(f[9])


def runq_wait_ns() -> int:
    """ns this thread was runnable but waiting for a CPU, so far (/proc/self/schedstat; 0
    where the kernel keeps no schedstats)."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def pswpin() -> int:
    """Pages read from swap, system-wide (/proc/vmstat)."""
    with open("/proc/vmstat") as f:
        for ln in f:
            if ln.startswith("pswpin "):
                return int(ln.split()[1])
    return 0


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
PROT_RW = 0x1 | 0x2
MAP_PRIVATE_ANON = 0x02 | 0x20
MAP_FIXED_NOREPLACE = 0x100000
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15


def map_region(nbytes: int, thp: str) -> tuple[int, memoryview]:
    """An anonymous private mapping of ``nbytes`` at REGION_ADDR when free (2 MiB-aligned
    elsewhere otherwise); its address and a writable view."""
    size = -(-nbytes // HUGE) * HUGE
    addr = _libc.mmap(REGION_ADDR, size, PROT_RW, MAP_PRIVATE_ANON | MAP_FIXED_NOREPLACE, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value) or addr != REGION_ADDR:
        # taken (or an old kernel ignoring the flag): over-map and align by hand
        raw = _libc.mmap(None, size + HUGE, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
        if raw in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        addr = (raw + HUGE - 1) // HUGE * HUGE
    if thp == "off":
        _libc.madvise(addr, size, MADV_NOHUGEPAGE)
    buf = (ctypes.c_char * nbytes).from_address(addr)
    return addr, memoryview(buf).cast("B")


class _Pages:
    def __init__(self, npages: int, style: str, seed: int, sid: int, thp: str) -> None:
        self.n, self.style, self.seed, self.sid = npages, style, seed, sid
        self.version = [0] * npages
        self.addr, self.m = map_region(npages * PAGE, thp)

    def expected(self, i: int) -> bytes:
        return expected_page(self.style, self.seed, self.sid, i, self.version[i])

    def fill(self) -> None:
        for i in range(self.n):
            self.m[i * PAGE : (i + 1) * PAGE] = self.expected(i)

    def touch(self, pages: Sequence[int], write_every: int = 0) -> tuple[int, int]:
        """Verify the pages in order; rewrite every write_every-th one.  (bad, checksum)"""
        bad = 0
        crc = 0
        m = self.m
        for k, i in enumerate(pages):
            got = bytes(m[i * PAGE : (i + 1) * PAGE])
            if got != self.expected(i):
                bad += 1
            crc = zlib.crc32(got, crc)
            if write_every and k % write_every == 0:
                self.version[i] += 1
                m[i * PAGE : i * PAGE + HDR.size] = HDR.pack(MAGIC, self.sid, i, self.version[i])
        return bad, crc


def _serve(conn: Connection, cgroup: Path | None, npages: int, seed: int, style: str, sid: int,
           thp: str) -> None:
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    pages = _Pages(npages, style, seed, sid, thp)
    pages.fill()
    worker = Worker(style, seed)
    conn.send({"pid": os.getpid(), "addr": pages.addr})
    done = 0
    while True:
        try:
            cmd, args = conn.recv()
        except EOFError:
            return
        if cmd == "touch":
            idx, write_every, spin_s, units = args
            s0, (n0, m0), t0 = pswpin(), faults(), time.monotonic_ns()
            r0, q0 = time.process_time_ns(), runq_wait_ns()
            bad, _ = pages.touch(idx, write_every)
            tp = time.monotonic_ns()
            worker.run(units, done)
            done += units
            end = time.monotonic() + spin_s
            while time.monotonic() < end:  # CPU work for a fixed time (the older callers)
                zlib.crc32(worker.pool[:4096])
            r1, q1 = time.process_time_ns(), runq_wait_ns()
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
                    # where the time went: reading the hot pages (their faults), on a CPU,
                    # waiting for one (the rest was blocked: I/O, locks, a fault's wait)
                    "pages_s": (tp - t0) / 1e9,
                    "cpu_s": (r1 - r0) / 1e9,
                    "runq_s": (q1 - q0) / 1e9,
                }
            )
        elif cmd == "verify":
            bad, _ = pages.touch(range(npages))
            conn.send({"bad": bad})
        elif cmd == "exit":
            conn.send({"ok": True})
            return


class PageSandbox:
    """The parent's handle on one sandbox process (fork + a pipe).

    ``sid`` is the sandbox's id in its pages' edit (0: the template itself; by default the
    seed, so that sandboxes built with different seeds differ as before); ``thp`` "host" leaves
    transparent huge pages as the host configures them, "off" (the default, for the guest tests
    that count small-page faults) disables them on the region."""

    def __init__(self, cgroup: Path | None, npages: int, seed: int = 1, *, style: str = "text",
                 sid: int | None = None, thp: str = "off") -> None:
        if style not in STYLES:
            raise ValueError(f"style {style!r}: one of {', '.join(STYLES)}")
        if thp not in ("host", "off"):
            raise ValueError(f"thp {thp!r}: host or off")
        self.cgroup, self.npages, self.seed, self.style = cgroup, npages, seed, style
        self.sid = seed if sid is None else sid
        parent, child = Pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                parent.close()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                _serve(child, cgroup, npages, seed, style, self.sid, thp)
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

    def send_touch(self, pages: Sequence[int], write_every: int = 0, spin_s: float = 0.0,
                   units: int = 0) -> None:
        self.conn.send(("touch", (list(pages), write_every, spin_s, units)))

    def recv(self) -> dict[str, Any]:
        r: dict[str, Any] = self.conn.recv()
        return r

    def touch(
        self, pages: Sequence[int], write_every: int = 0, spin_s: float = 0.0, units: int = 0
    ) -> dict[str, Any]:
        self.send_touch(pages, write_every, spin_s, units)
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

