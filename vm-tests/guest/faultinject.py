"""Fault injection and leak checks for the in-guest tests (debug-kernel tier).

failslab and fail_page_alloc (debugfs, CONFIG_FAULT_INJECTION_DEBUG_FS) are set up with their
task filter, so only a thread marked in /proc/thread-self/make-it-fail sees failures; the marked
section is one read(2) or write(2) done in C (azpages.c: az_marked_io), so what fails is what the
kernel allocates inside that system call: the module's stores when it is a memory.reclaim write
(reclaim runs in the writer and azswap stores in the submitter's context), a netlink command's
handler when it is a write to a generic netlink socket (the kernel runs it inside sendmsg), the
rest of a dump when it is a read of one. Both knobs also fail sleeping allocations
(ignore-gfp-wait N) and highmem ones (zsmalloc's pages: ignore-gfp-highmem N).

The injected failures are counted by the knobs' `times` budget. Allocation-failure reports
(warn_alloc's call trace) are bracketed in the kernel log by the markers vm-tests/run knows, so
they do not count as splats; everything else (KASAN, lockdep, BUG, WARNING) still does.

Also: a raw generic netlink client (the commands built here, so a marked write carries exactly
one request) and kmemleak (clear, scan, report).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from aznl import ATTRS, CMD, Client

DEBUGFS = Path("/sys/kernel/debug")
KNOBS = ("failslab", "fail_page_alloc")
KMEMLEAK = DEBUGFS / "kmemleak"
# The same lines as vm-tests/run's EXPECT_ALLOC_FAIL_BEGIN / _END.
BEGIN = "azswap-test: expected allocation failures begin"
END = "azswap-test: expected allocation failures end"
BUDGET = 10_000_000


def available() -> bool:
    """The kernel has both knobs in debugfs."""
    return all((DEBUGFS / k / "probability").exists() for k in KNOBS)


def kmsg(line: str) -> None:
    with open("/dev/kmsg", "w") as f:
        f.write(line + "\n")


def _set(knob: str, attr: str, value: str) -> None:
    (DEBUGFS / knob / attr).write_text(value)


class Injector:
    """Failures with @probability percent in every allocation of a marked system call."""

    def __init__(self, lib: ctypes.CDLL, probability: int = 20) -> None:
        self.lib, self.probability = lib, probability
        self.mark_fd = -1
        self.buf = ctypes.create_string_buffer(1 << 16)

    def __enter__(self) -> Injector:
        for k in KNOBS:
            _set(k, "probability", "0")
            for attr, v in (
                ("task-filter", "Y"),
                ("verbose", "0"),
                ("interval", "1"),
                ("space", "0"),
                ("times", str(BUDGET)),
                ("ignore-gfp-wait", "N"),
            ):
                _set(k, attr, v)
        _set("fail_page_alloc", "ignore-gfp-highmem", "N")
        _set("fail_page_alloc", "min-order", "0")
        self.mark_fd = os.open("/proc/thread-self/make-it-fail", os.O_WRONLY)
        os.write(self.mark_fd, b"0")
        kmsg(BEGIN)
        for k in KNOBS:
            _set(k, "probability", str(self.probability))
        return self

    def __exit__(
        self,
        t: type[BaseException] | None,
        v: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for k in KNOBS:
            _set(k, "probability", "0")
        os.write(self.mark_fd, b"0")
        os.close(self.mark_fd)
        kmsg(END)

    @contextlib.contextmanager
    def rate(self, probability: int) -> Iterator[None]:
        """Another failure probability (percent) for the block."""
        for k in KNOBS:
            _set(k, "probability", str(probability))
        try:
            yield
        finally:
            for k in KNOBS:
                _set(k, "probability", str(self.probability))

    def injected(self) -> dict[str, int]:
        """Failures injected so far, per knob."""
        return {k: BUDGET - int((DEBUGFS / k / "times").read_text()) for k in KNOBS}

    def write(self, fd: int, data: bytes) -> int:
        """One marked write(2): bytes written or -errno."""
        return int(self.lib.az_marked_io(self.mark_fd, fd, data, len(data), 0))

    def read(self, fd: int) -> bytes | int:
        """One marked read(2) of up to 64 KiB: the bytes or -errno."""
        r = int(self.lib.az_marked_io(self.mark_fd, fd, self.buf, len(self.buf), 1))
        return r if r < 0 else self.buf.raw[:r]


# -- generic netlink, by hand ----------------------------------------------------------------

NETLINK_GENERIC = 16
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
_ATTR = {name: (num, kind) for num, name, kind in ATTRS}


def _nla(name: str, value: Any) -> bytes:
    num, kind = _ATTR[name]
    payload = {
        "uint8": lambda v: struct.pack("=B", v),
        "uint32": lambda v: struct.pack("=I", v),
        "uint64": lambda v: struct.pack("=Q", v),
        "asciiz": lambda v: v.encode() + b"\0",
        "cdata": lambda v: bytes(v),
    }[kind](value)
    hdr = struct.pack("=HH", 4 + len(payload), num)
    return hdr + payload + bytes(-len(payload) % 4)


def _parse_attrs(buf: bytes) -> dict[int, bytes]:
    out, off = {}, 0
    while off + 4 <= len(buf):
        ln, num = struct.unpack_from("=HH", buf, off)
        if ln < 4:
            break
        out[num & 0x3FFF] = buf[off + 4 : off + ln]
        off += (ln + 3) & ~3
    return out


class Genl:
    """The azswap family over a plain AF_NETLINK socket."""

    def __init__(self) -> None:
        c = Client()
        self.family = c.sock.prid
        c.close()
        self.seq = 0
        self._open()

    def _open(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        self.sock.bind((0, 0))

    def close(self) -> None:
        self.sock.close()

    def encode(self, cmd: str, attrs: list[tuple[str, Any]], dump: bool) -> bytes:
        self.seq += 1
        body = struct.pack("=BBH", CMD[cmd], 1, 0) + b"".join(_nla(n, v) for n, v in attrs)
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        return struct.pack("=IHHII", 16 + len(body), self.family, flags, self.seq, 0) + body

    def call(
        self,
        cmd: str,
        attrs: list[tuple[str, Any]] | None = None,
        *,
        dump: bool = False,
        inj: Injector | None = None,
    ) -> tuple[int, list[dict[int, bytes]]]:
        """(errno or 0, the replies' attributes by number). With @inj the request's send (and
        the reads that run the rest of a dump) are marked for fault injection.

        The errno is the request's (an NLMSG_ERROR or NLMSG_DONE code) or, when the socket
        itself failed (the request's skb, or the kernel's ack or dump skb not allocated:
        ENOBUFS/ENOMEM), the socket's; then the socket is replaced (a dump may be left half
        done on it) and the request may or may not have been applied."""
        code, replies = self._call(cmd, list(attrs or []), dump, inj)
        if code < 0:
            self.sock.close()
            self._open()
            return -code, replies
        return code, replies

    def _call(
        self, cmd: str, attrs: list[tuple[str, Any]], dump: bool, inj: Injector | None
    ) -> tuple[int, list[dict[int, bytes]]]:
        """Request errno >= 0, or minus a socket errno."""
        msg = self.encode(cmd, attrs, dump)
        if inj is not None:
            r = inj.write(self.sock.fileno(), msg)
            if r < 0:
                return r, []
        else:
            self.sock.send(msg)
        replies: list[dict[int, bytes]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                data: bytes | int = (
                    inj.read(self.sock.fileno()) if inj is not None and dump
                    else self.sock.recv(1 << 16)
                )
            except OSError as e:
                data = -(e.errno or errno.EIO)
            if isinstance(data, int):
                if data == -errno.EINTR:
                    continue
                return data, replies
            off = 0
            while off + 16 <= len(data):
                ln, typ, _flags, seq, _pid = struct.unpack_from("=IHHII", data, off)
                if ln < 16:
                    break
                if seq == self.seq:
                    if typ in (NLMSG_ERROR, NLMSG_DONE):
                        (code,) = struct.unpack_from("=i", data, off + 16)
                        return -code, replies
                    if typ == self.family:
                        replies.append(_parse_attrs(data[off + 20 : off + ln]))
                off += (ln + 3) & ~3
        raise TimeoutError(f"no answer to {cmd} in 120 s")


def u64(attrs: dict[int, bytes], name: str) -> int:
    return int.from_bytes(attrs[_ATTR[name][0]], "little")


# -- kmemleak ---------------------------------------------------------------------------------


def kmemleak_available() -> bool:
    return KMEMLEAK.exists()


def kmemleak_clear() -> None:
    """Forget what is suspected now (boot-time objects): later scans report new leaks only."""
    KMEMLEAK.write_text("scan")
    KMEMLEAK.write_text("clear")


def kmemleak_report() -> str:
    """Two scans (an object is reported once it stayed unreferenced for a whole scan and is
    older than kmemleak's minimum age, 5 s), then the report: empty when nothing leaked."""
    time.sleep(6)
    KMEMLEAK.write_text("scan")
    time.sleep(6)
    KMEMLEAK.write_text("scan")
    return KMEMLEAK.read_text()
