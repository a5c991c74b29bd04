"""Page traces: reader and writer of the format in docs/trace-format.md.

    from controlplane.trace import TraceWriter, read_trace
    with TraceWriter(path, meta={"style": "fork"}) as w:
        w.owner(1001, group=1, role=ROLE_TEMPLATE, name="template")
        w.vma(1001, 0x7f0000000000, 0x7f0000100000, pgoff=0, prot=3, path="")
        w.pages(1001, indexes, vaddrs, data)          # data: len(indexes) * 4096 bytes
    tr = read_trace(path)                              # validates everything, TraceError otherwise
    for o in tr.owners.values(): ...

The reader never trusts the file: every malformed input raises TraceError with the byte offset
and the reason (never a struct.error, IndexError or a zstd exception).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

PAGE_SIZE = 4096
MAGIC = b"AZTRACE\0"
VERSION = 1
HEADER = struct.Struct("<8sHHIQQ")  # 32 bytes
REC = struct.Struct("<BBHI")  # 8 bytes
OWNER_FIX = struct.Struct("<QIB3s")  # 16 bytes
PAGES_FIX = struct.Struct("<QII")  # 16 bytes
ENTRY = struct.Struct("<QQ")
VMA_FIX = struct.Struct("<QQQQII")  # 40 bytes
END_FIX = struct.Struct("<QQII")  # 24 bytes

T_OWNER, T_PAGES, T_VMA, T_META, T_END = 1, 2, 3, 4, 127
TYPE_NAMES = {T_OWNER: "OWNER", T_PAGES: "PAGES", T_VMA: "VMA", T_META: "META", T_END: "END"}
F_ZSTD = 1

ROLE_UNREGISTERED, ROLE_SANDBOX, ROLE_TEMPLATE = 0, 1, 2
ROLE_NAMES = {0: "unregistered", 1: "sandbox", 2: "template"}

MAX_PAYLOAD = 64 << 20
MAX_PAGES_PER_RECORD = 4096
GROUP_MAX = 2**31 - 1


class TraceError(ValueError):
    """A malformed or unsupported trace."""


@dataclass
class Vma:
    start: int
    end: int
    pgoff: int
    prot: int
    path: str


@dataclass
class PageRun:
    """Pages of one PAGES record (data: count * 4096 bytes)."""

    indexes: list[int]
    vaddrs: list[int]
    data: bytes

    def __len__(self) -> int:
        return len(self.indexes)


@dataclass
class Owner:
    id: int
    group: int
    role: int
    info: dict[str, Any]
    vmas: list[Vma] = field(default_factory=list)
    runs: list[PageRun] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.info.get("name", self.id))

    @property
    def nr_pages(self) -> int:
        return sum(len(r) for r in self.runs)

    def data(self) -> bytes:
        return b"".join(r.data for r in self.runs)

    def indexes(self) -> list[int]:
        return [i for r in self.runs for i in r.indexes]

    def vaddrs(self) -> list[int]:
        return [v for r in self.runs for v in r.vaddrs]


@dataclass
class Trace:
    meta: dict[str, Any]
    owners: dict[int, Owner]  # insertion order = declaration order
    order: list[tuple[int, int]]  # (owner id, run number) in file order
    nr_pages: int

    def runs_in_order(self) -> Iterator[tuple[Owner, PageRun]]:
        for oid, k in self.order:
            o = self.owners[oid]
            yield o, o.runs[k]


def _zstd():
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise TraceError("python-zstandard is needed for compressed traces") from exc
    return zstandard


class TraceWriter:
    """Write a trace; close() (or the context manager) appends END with the CRC."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        meta: dict[str, Any] | None = None,
        compress: int = 3,
    ) -> None:
        self._f: BinaryIO = open(path, "wb")  # noqa: SIM115
        self._crc = 0
        self._records = 0
        self._pages = 0
        self._owners: dict[int, set[int]] = {}
        self._cctx = _zstd().ZstdCompressor(level=compress) if compress else None
        self._write(HEADER.pack(MAGIC, VERSION, HEADER.size, PAGE_SIZE, 0, 0))
        if meta is not None:
            self.meta(meta)

    def _write(self, b: bytes) -> None:
        self._f.write(b)
        self._crc = zlib.crc32(b, self._crc)

    def _record(self, typ: int, payload: bytes, flags: int = 0) -> None:
        if len(payload) > MAX_PAYLOAD:
            raise TraceError(f"{TYPE_NAMES[typ]} record of {len(payload)} bytes is too large")
        self._write(REC.pack(typ, flags, 0, len(payload)) + payload)
        self._records += 1

    def meta(self, meta: dict[str, Any]) -> None:
        self._record(T_META, json.dumps(meta, sort_keys=True).encode())

    def owner(self, oid: int, group: int, role: int, name: str, **info: Any) -> None:
        if oid in self._owners:
            raise TraceError(f"owner {oid} declared twice")
        if role not in ROLE_NAMES:
            raise TraceError(f"bad role {role}")
        info = {"name": name, **info}
        self._record(
            T_OWNER, OWNER_FIX.pack(oid, group, role, b"\0\0\0") + json.dumps(info).encode()
        )
        self._owners[oid] = set()

    def vma(self, oid: int, start: int, end: int, pgoff: int, prot: int, path: str = "") -> None:
        self._record(T_VMA, VMA_FIX.pack(oid, start, end, pgoff, prot, 0) + path.encode())

    def pages(self, oid: int, indexes: list[int], vaddrs: list[int], data: bytes) -> None:
        n = len(indexes)
        if n != len(vaddrs) or len(data) != n * PAGE_SIZE:
            raise TraceError("pages(): indexes, vaddrs and data disagree")
        seen = self._owners.get(oid)
        if seen is None:
            raise TraceError(f"pages for undeclared owner {oid}")
        for k in range(0, n, MAX_PAGES_PER_RECORD):
            idx = indexes[k : k + MAX_PAGES_PER_RECORD]
            va = vaddrs[k : k + MAX_PAGES_PER_RECORD]
            for v in va:
                if v in seen:
                    raise TraceError(f"owner {oid}: vaddr {v:#x} written twice")
                seen.add(v)
            body = b"".join(ENTRY.pack(i, v) for i, v in zip(idx, va, strict=True))
            body += data[k * PAGE_SIZE : (k + len(idx)) * PAGE_SIZE]
            flags = 0
            if self._cctx is not None:
                body = self._cctx.compress(body)
                flags = F_ZSTD
            self._record(T_PAGES, PAGES_FIX.pack(oid, len(idx), 0) + body, flags)
            self._pages += len(idx)

    def close(self) -> None:
        if self._f.closed:
            return
        crc = self._crc
        self._f.write(REC.pack(T_END, 0, 0, END_FIX.size))
        self._f.write(END_FIX.pack(self._records, self._pages, crc, 0))
        self._f.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_obj(raw: bytes, what: str, off: int) -> dict[str, Any]:
    try:
        obj = json.loads(raw.decode("utf-8")) if raw else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"offset {off}: {what}: bad JSON ({exc})") from None
    except RecursionError:
        raise TraceError(f"offset {off}: {what}: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise TraceError(f"offset {off}: {what}: JSON is not an object")
    return obj


def read_trace(path: str | os.PathLike[str], *, owners: set[int] | None = None) -> Trace:
    """Read and validate a whole trace; with ``owners``, keep page data only for those."""
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror}") from None
    return parse_trace(buf, owners=owners, name=str(path))


def parse_trace(buf: bytes, *, owners: set[int] | None = None, name: str = "trace") -> Trace:
    mv = memoryview(buf)
    if len(buf) < HEADER.size:
        raise TraceError(f"{name}: {len(buf)} bytes: too short for a trace header")
    magic, ver, hlen, psize, flags, resv = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise TraceError(f"{name}: not an azswap page trace (bad magic {magic!r})")
    if ver != VERSION:
        raise TraceError(f"{name}: unsupported trace version {ver} (this reader knows {VERSION})")
    if hlen != HEADER.size or psize != PAGE_SIZE or flags or resv:
        raise TraceError(
            f"{name}: bad header (header length {hlen}, page size {psize}, flags {flags})"
        )
    meta: dict[str, Any] = {}
    own: dict[int, Owner] = {}
    seen_va: dict[int, set[int]] = {}
    order: list[tuple[int, int]] = []
    nr_pages = 0
    nrec = 0
    off = HEADER.size
    dctx = None
    while True:
        if off + REC.size > len(buf):
            raise TraceError(f"{name}: offset {off}: truncated (no END record)")
        typ, rflags, rres, plen = REC.unpack_from(buf, off)
        tname = TYPE_NAMES.get(typ)
        where = f"{name}: offset {off}: {tname or 'record'}"
        if tname is None:
            raise TraceError(f"{where}: unknown record type {typ}")
        if rres or rflags & ~F_ZSTD or (rflags and typ != T_PAGES):
            raise TraceError(f"{where}: bad flags/reserved field ({rflags:#x}/{rres:#x})")
        if plen > MAX_PAYLOAD:
            raise TraceError(f"{where}: payload length {plen} exceeds {MAX_PAYLOAD}")
        p0 = off + REC.size
        if p0 + plen > len(buf):
            raise TraceError(f"{where}: truncated ({plen} byte payload, {len(buf) - p0} left)")
        pl = mv[p0 : p0 + plen]
        if typ == T_END:
            if plen != END_FIX.size:
                raise TraceError(f"{where}: payload length {plen}, expected {END_FIX.size}")
            n_rec, n_pages, crc, z = END_FIX.unpack_from(pl, 0)
            if n_rec != nrec or n_pages != nr_pages or z:
                raise TraceError(
                    f"{where}: counts disagree (END says {n_rec} records/{n_pages} pages, "
                    f"read {nrec}/{nr_pages})"
                )
            if zlib.crc32(mv[:off]) != crc:
                raise TraceError(f"{where}: CRC mismatch: the trace is corrupted")
            if p0 + plen != len(buf):
                raise TraceError(f"{where}: {len(buf) - p0 - plen} bytes after the END record")
            break
        if typ == T_META:
            meta.update(_json_obj(bytes(pl), "META", off))
        elif typ == T_OWNER:
            if plen < OWNER_FIX.size:
                raise TraceError(f"{where}: payload of {plen} bytes is too short")
            oid, group, role, pad = OWNER_FIX.unpack_from(pl, 0)
            if pad != b"\0\0\0":
                raise TraceError(f"{where}: reserved bytes not zero")
            if role not in ROLE_NAMES:
                raise TraceError(f"{where}: unknown role {role}")
            if oid in own:
                raise TraceError(f"{where}: owner {oid} declared twice")
            if oid == 0 and role != ROLE_UNREGISTERED:
                raise TraceError(f"{where}: owner id 0 is reserved for unregistered pages")
            if role != ROLE_UNREGISTERED and not 1 <= group <= GROUP_MAX:
                raise TraceError(f"{where}: owner {oid}: trust group {group} out of 1..{GROUP_MAX}")
            info = _json_obj(bytes(pl[OWNER_FIX.size :]), "OWNER info", off)
            own[oid] = Owner(oid, group, role, info)
            seen_va[oid] = set()
        elif typ == T_VMA:
            if plen < VMA_FIX.size:
                raise TraceError(f"{where}: payload of {plen} bytes is too short")
            oid, start, end, pgoff, prot, z = VMA_FIX.unpack_from(pl, 0)
            if oid not in own:
                raise TraceError(f"{where}: owner {oid} not declared")
            if start % PAGE_SIZE or end % PAGE_SIZE or end <= start or z or prot & ~7:
                raise TraceError(f"{where}: bad range {start:#x}-{end:#x} (prot {prot})")
            try:
                vpath = bytes(pl[VMA_FIX.size :]).decode("utf-8")
            except UnicodeDecodeError:
                raise TraceError(f"{where}: path is not UTF-8") from None
            own[oid].vmas.append(Vma(start, end, pgoff, prot, vpath))
        elif typ == T_PAGES:
            if plen < PAGES_FIX.size:
                raise TraceError(f"{where}: payload of {plen} bytes is too short")
            oid, count, z = PAGES_FIX.unpack_from(pl, 0)
            if oid not in own:
                raise TraceError(f"{where}: owner {oid} not declared")
            if z or not 1 <= count <= MAX_PAGES_PER_RECORD:
                raise TraceError(f"{where}: bad page count {count}")
            want = count * (ENTRY.size + PAGE_SIZE)
            body = pl[PAGES_FIX.size :]
            if rflags & F_ZSTD:
                if dctx is None:
                    dctx = _zstd().ZstdDecompressor()
                try:
                    body = dctx.decompress(bytes(body), max_output_size=want)
                except Exception as exc:  # zstandard.ZstdError and friends
                    raise TraceError(f"{where}: bad zstd frame ({exc})") from None
            if len(body) != want:
                raise TraceError(
                    f"{where}: {count} pages need {want} bytes of entries and data, got {len(body)}"
                )
            body = memoryview(body)
            idx: list[int] = []
            va: list[int] = []
            sv = seen_va[oid]
            for k in range(count):
                i, v = ENTRY.unpack_from(body, k * ENTRY.size)
                if v % PAGE_SIZE:
                    raise TraceError(f"{where}: vaddr {v:#x} not page aligned")
                if v in sv:
                    raise TraceError(f"{where}: owner {oid}: vaddr {v:#x} appears twice")
                sv.add(v)
                idx.append(i)
                va.append(v)
            data = bytes(body[count * ENTRY.size :]) if owners is None or oid in owners else b""
            own[oid].runs.append(PageRun(idx, va, data))
            order.append((oid, len(own[oid].runs) - 1))
            nr_pages += count
        nrec += 1
        off = p0 + plen
    return Trace(meta, own, order, nr_pages)


def summary(tr: Trace) -> list[dict[str, Any]]:
    """One row per owner: id, name, role, group, pages, bytes."""
    return [
        {
            "id": o.id,
            "name": o.name,
            "role": ROLE_NAMES[o.role],
            "group": o.group,
            "pages": o.nr_pages,
            "bytes": o.nr_pages * PAGE_SIZE,
            "vmas": len(o.vmas),
        }
        for o in tr.owners.values()
    ]
