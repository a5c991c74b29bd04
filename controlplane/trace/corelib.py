"""ctypes binding of the host build of the store core (build/libazcore.so).

The same C files that run in azswap.ko are compiled into a shared library
(``make hostlib`` or ``make -f kmod/core/host.mk``).  This module wraps
kmod/core/azcore.h for tests, fuzzing and trace replay::

    from controlplane.trace.corelib import Store
    with Store(1024) as st:
        st.put(1, page)
        assert st.get(1) == page

The library is found through the AZCORE_LIB environment variable, else
build/libazcore.so relative to the repository.  Errors from the core are
raised as :class:`CoreError` (an OSError) carrying the errno.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAGE_SIZE = 4096
RAW_THRESHOLD = PAGE_SIZE * 3 // 4

CODEC_LZ4 = 0
CODEC_ZSTD = 1

KINDS = ("same", "dup", "tdelta", "xdelta", "plain", "raw")
# struct az_stats fields that sum to meta_bytes (azcore.h)
META_PARTS = (
    "slot_bytes",
    "owner_bytes",
    "obj_meta_bytes",
    "index_table_bytes",
    "tnode_bytes",
    "base_cache_bytes",
)
NR_KINDS = len(KINDS)

u32 = ctypes.c_uint32
u64 = ctypes.c_uint64


class PageInfo(ctypes.Structure):
    _fields_ = [("owner", u64), ("index", u64)]


class Reserve(ctypes.Structure):
    """struct az_reserve (azcore.h): opaque, zeroed before a no-wait put."""

    _fields_ = [
        ("size", u32),
        ("obj", ctypes.c_bool),
        ("tnode", ctypes.c_bool),
        ("filled", ctypes.c_bool),
        ("leaf", ctypes.c_bool),
        ("l", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("t", ctypes.c_void_p),
        ("h", ctypes.c_ulong * 2),
        ("hsize", u32 * 2),
    ]


class Policy(ctypes.Structure):
    _fields_ = [
        ("codec", u32),
        ("level", u32),
        ("dedup", u32),
        ("tdelta", u32),
        ("xdelta", u32),
        ("sim_effort", u32),
        ("delta_max_pct", u32),
        ("verify", u32),
        ("shuffle", u32),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        ("pages_stored", u64),
        ("orig_bytes", u64),
        ("stored_bytes", u64),
        ("pool_bytes", u64),
        ("meta_bytes", u64),
        ("index_bytes", u64),
        ("template_bytes", u64),
        ("kind_pages", u64 * NR_KINDS),
        ("objects", u64),
        ("bases", u64),
        ("failed_stores", u64),
        ("failed_loads", u64),
        ("stores", u64),
        ("loads", u64),
        ("frees", u64),
        ("template_pages", u64),
        ("cross_group", u64),
        ("deferred", u64),
        ("base_cache_pages", u64),
        ("base_cache_hits", u64),
        ("base_cache_misses", u64),
        ("compacted_bytes", u64),
        # meta_bytes by component (all but slot_used_bytes sum to it)
        ("slot_bytes", u64),
        ("slot_used_bytes", u64),
        ("owner_bytes", u64),
        ("obj_meta_bytes", u64),
        ("index_table_bytes", u64),
        ("tnode_bytes", u64),
        ("base_cache_bytes", u64),
        ("template_lost", u64),
        ("packs", u64),
        ("packed_pages", u64),
        ("sim_sparse", u64),
        ("sim_waiting", u64),
        ("sim_switches", u64),
        ("sim_direct", u64),
        ("direct_pages", u64),
    ]


class OwnerStats(ctypes.Structure):
    _fields_ = [
        ("cgroup_id", u64),
        ("group", u32),
        ("is_template", u32),
        ("pages", u64),
        ("orig_bytes", u64),
        ("exclusive_bytes", u64),
        ("shared_bytes", u64),
        ("kind_pages", u64 * NR_KINDS),
        ("template_pages", u64),
        ("registered", u32),
        ("entry", u32),
    ]


def _struct_dict(s: ctypes.Structure) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, _ in s._fields_:
        if name == "entry":
            continue
        v = getattr(s, name)
        if name == "kind_pages":
            out[name] = {k: int(v[i]) for i, k in enumerate(KINDS)}
        else:
            out[name] = int(v)
    return out


class CoreError(OSError):
    """An error code returned by the store core (negative errno)."""

    def __init__(self, err: int, what: str) -> None:
        super().__init__(err, f"{what}: {os.strerror(err)}")


def default_lib_path() -> Path:
    env = os.environ.get("AZCORE_LIB")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "build" / "libazcore.so"


_libs: dict[str, ctypes.CDLL] = {}


def load_lib(path: str | os.PathLike[str] | None = None) -> ctypes.CDLL:
    """Load (once per path) and declare the C API."""
    p = str(Path(path) if path is not None else default_lib_path())
    if p in _libs:
        return _libs[p]
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p}: store core library not built (run `make hostlib`)")
    lib = ctypes.CDLL(p)
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    decl: dict[str, tuple[Any, list[Any]]] = {
        "az_ctx_create": (vp, []),
        "az_ctx_destroy": (None, [vp]),
        "az_store_create": (vp, [u64, cp]),
        "az_store_destroy": (None, [vp]),
        "az_store_set_mem_limit": (None, [vp, u64]),
        "az_store_set_base_cache": (ctypes.c_int, [vp, u32]),
        "az_store_get_base_cache": (u32, [vp]),
        "az_store_set_sim_slots": (ctypes.c_int, [vp, u32]),
        "az_store_get_sim_slots": (u32, [vp]),
        "az_store_set_sim_sample": (ctypes.c_int, [vp, u32]),
        "az_store_get_sim_sample": (u32, [vp]),
        "az_store_set_policy": (ctypes.c_int, [vp, ctypes.POINTER(Policy)]),
        "az_store_get_policy": (None, [vp, ctypes.POINTER(Policy)]),
        "az_store_put": (ctypes.c_int, [vp, vp, u64, cp, ctypes.POINTER(PageInfo)]),
        "az_store_get": (ctypes.c_int, [vp, vp, u64, cp]),
        "az_store_free": (None, [vp, u64]),
        "az_store_slot_kind": (ctypes.c_int, [vp, u64]),
        "az_store_slot_info": (ctypes.c_int, [vp, u64, ctypes.POINTER(u32)]),
        "az_store_get_stats": (None, [vp, ctypes.POINTER(Stats)]),
        "az_store_nr_slots": (u64, [vp]),
        "az_store_add_sandbox": (ctypes.c_int, [vp, u64, u32]),
        "az_store_del_sandbox": (ctypes.c_int, [vp, u64]),
        "az_store_add_template": (ctypes.c_int, [vp, u64, u32]),
        "az_store_del_template": (ctypes.c_int, [vp, u64]),
        "az_store_template_load": (ctypes.c_int, [vp, vp, u64, u64, cp]),
        "az_store_set_map": (ctypes.c_int, [vp, u64, u64, u64, u64]),
        "az_store_owner_stats": (ctypes.c_int, [vp, u64, ctypes.POINTER(OwnerStats)]),
        "az_store_list_owners": (
            ctypes.c_int,
            [vp, u32, ctypes.POINTER(OwnerStats), u32, ctypes.POINTER(u32)],
        ),
        "az_store_drain": (None, [vp]),
        "az_store_pack": (ctypes.c_int, [vp, vp, u64, u64, ctypes.POINTER(u64)]),
        "az_kind_name": (cp, [ctypes.c_int]),
        "az_store_debug_corrupt": (ctypes.c_int, [vp, u64, u32, ctypes.c_uint8]),
        "az_store_debug_corrupt_link": (ctypes.c_int, [vp, u64, ctypes.c_uint8]),
        "az_host_fail_pool_allocs": (None, [ctypes.c_int]),
        "az_host_fail_allocs_of": (None, [ctypes.c_size_t, ctypes.c_int]),
        "az_host_sleeping_allocs": (u64, []),
        "az_host_codec_calls": (None, [ctypes.POINTER(u64)]),
        "az_store_put_nowait": (
            ctypes.c_int,
            [vp, vp, u64, cp, ctypes.POINTER(PageInfo), ctypes.POINTER(Reserve)],
        ),
        "az_reserve_fill": (ctypes.c_int, [vp, ctypes.POINTER(Reserve)]),
        "az_reserve_release": (None, [vp, ctypes.POINTER(Reserve)]),
        "az_store_free_notify": (ctypes.c_int, [vp, u64]),
        "az_store_debug_reg_lock_taken": (u64, [vp]),
        "az_store_debug_slot_lock": (ctypes.c_int, [vp, u64, ctypes.c_int]),
        "az_store_debug_pack_race": (ctypes.c_int, [vp, u64, cp, ctypes.POINTER(PageInfo)]),
        "az_debug_decode": (ctypes.c_int, [vp, cp, u32, cp, cp]),
        "az_debug_encode": (ctypes.c_int, [vp, ctypes.POINTER(Policy), cp, cp, cp]),
        "az_store_debug_check": (ctypes.c_int, [vp]),
        "az_obj_header_bytes": (ctypes.c_size_t, []),
        "az_debug_nr_sf": (u32, []),
        "az_debug_leaf_slots": (u32, []),
        "az_debug_encode_pack": (ctypes.c_int, [vp, ctypes.POINTER(Policy), cp, u32, cp]),
        "az_debug_decode_pack": (ctypes.c_int, [vp, cp, u32, cp]),
        "az_debug_lz4": (
            ctypes.c_int,
            [vp, cp, ctypes.c_int, cp, ctypes.c_int, cp, ctypes.c_int, u32, ctypes.POINTER(u32)],
        ),
        "az_host_put_batch": (ctypes.c_int, [vp, vp, u64, cp, u32, ctypes.POINTER(PageInfo)]),
        "az_host_get_batch": (ctypes.c_int, [vp, vp, u64, vp, u32]),
    }
    for name, (res, args) in decl.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    _libs[p] = lib
    return lib


def _check(rc: int, what: str) -> int:
    if rc < 0:
        raise CoreError(-rc, what)
    return rc


def _page(page: bytes) -> bytes:
    if len(page) != PAGE_SIZE:
        raise ValueError(f"page must be {PAGE_SIZE} bytes, got {len(page)}")
    return bytes(page)


@dataclass
class Ctx:
    """One az_ctx (the kernel keeps one per CPU)."""

    lib: ctypes.CDLL
    ptr: int

    @classmethod
    def create(cls, lib: ctypes.CDLL) -> Ctx:
        ptr = lib.az_ctx_create()
        if not ptr:
            raise CoreError(errno.ENOMEM, "az_ctx_create")
        return cls(lib, ptr)

    def close(self) -> None:
        if self.ptr:
            self.lib.az_ctx_destroy(self.ptr)
            self.ptr = 0


class Store:
    """A page store of ``nr_slots`` slots (one az_store and one az_ctx)."""

    def __init__(
        self,
        nr_slots: int,
        name: str = "azcore",
        lib: str | os.PathLike[str] | None = None,
        mem_limit: int = 0,
        **policy: int,
    ) -> None:
        self.lib = load_lib(lib)
        self._s = self.lib.az_store_create(nr_slots, name.encode())
        if not self._s:
            raise CoreError(errno.ENOMEM, "az_store_create")
        self._ctx = Ctx.create(self.lib)
        self.nr_slots = nr_slots
        self._buf = ctypes.create_string_buffer(PAGE_SIZE)
        if mem_limit:
            self.set_mem_limit(mem_limit)
        if policy:
            self.set_policy(**policy)

    # -- lifetime ----------------------------------------------------------
    def close(self) -> None:
        if self._s:
            self.lib.az_store_destroy(self._s)
            self._s = None
        self._ctx.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- pages -------------------------------------------------------------
    def put(self, slot: int, page: bytes, owner: int = 0, index: int = 0) -> None:
        pi = PageInfo(owner, index)
        _check(
            self.lib.az_store_put(self._s, self._ctx.ptr, slot, _page(page), ctypes.byref(pi)),
            f"put slot {slot}",
        )

    def get(self, slot: int) -> bytes:
        _check(self.lib.az_store_get(self._s, self._ctx.ptr, slot, self._buf), f"get slot {slot}")
        return self._buf.raw

    def put_many(
        self,
        first_slot: int,
        data: bytes,
        owners: list[int] | None = None,
        indexes: list[int] | None = None,
    ) -> None:
        """Store len(data) // PAGE_SIZE pages in consecutive slots (one C call)."""
        if len(data) % PAGE_SIZE:
            raise ValueError("data must be whole pages")
        n = len(data) // PAGE_SIZE
        info = None
        if owners is not None or indexes is not None:
            arr = (PageInfo * n)()
            for i in range(n):
                arr[i].owner = owners[i] if owners is not None else 0
                arr[i].index = indexes[i] if indexes is not None else 0
            info = arr
        rc = self.lib.az_host_put_batch(self._s, self._ctx.ptr, first_slot, data, n, info)
        if _check(rc, f"put_many at slot {first_slot}") != n:
            raise CoreError(errno.ENOMEM, f"put_many stopped at slot {first_slot + rc}")

    def get_many(self, first_slot: int, n: int, out: bytearray | None = None) -> bytearray:
        """Read n consecutive slots (one C call), into ``out`` if given."""
        if out is None:
            out = bytearray(n * PAGE_SIZE)
        if len(out) < n * PAGE_SIZE:
            raise ValueError("output buffer too small")
        cbuf = (ctypes.c_char * len(out)).from_buffer(out)
        rc = self.lib.az_host_get_batch(self._s, self._ctx.ptr, first_slot, cbuf, n)
        del cbuf
        if _check(rc, f"get_many at slot {first_slot}") != n:
            raise CoreError(errno.EIO, f"get_many failed at slot {first_slot + rc}")
        return out

    def free(self, slot: int) -> None:
        self.lib.az_store_free(self._s, slot)

    def kind(self, slot: int) -> str | None:
        """Representation of the page in ``slot``, None when empty."""
        rc = self.lib.az_store_slot_kind(self._s, slot)
        if rc == -errno.ENOENT:
            return None
        return KINDS[_check(rc, f"kind slot {slot}")]

    def slot_bytes(self, slot: int) -> int:
        """Pool bytes of ``slot``'s object (a packed page: its share of the pack)."""
        b = u32(0)
        _check(self.lib.az_store_slot_info(self._s, slot, ctypes.byref(b)), f"slot {slot}")
        return int(b.value)

    def drain(self) -> None:
        self.lib.az_store_drain(self._s)

    def pack(self, first: int = 0, nr: int | None = None) -> int:
        """Pack slots [first, first + nr) (all from ``first`` by default): runs of nearby
        PLAIN pages of one sandbox become multi-page objects. Returns the slots packed."""
        if nr is None:
            nr = self.nr_slots - first
        packed = u64(0)
        _check(
            self.lib.az_store_pack(self._s, self._ctx.ptr, first, nr, ctypes.byref(packed)),
            f"pack [{first}, {first + nr})",
        )
        return int(packed.value)

    # -- configuration -----------------------------------------------------
    def set_mem_limit(self, nbytes: int) -> None:
        self.lib.az_store_set_mem_limit(self._s, nbytes)

    def set_base_cache(self, pages: int) -> None:
        """Decoded-base cache size in entries (0 = off; each holds at most a page while it
        serves); CoreError on a bad size."""
        _check(self.lib.az_store_set_base_cache(self._s, pages), "set_base_cache")

    def base_cache(self) -> int:
        return int(self.lib.az_store_get_base_cache(self._s))

    def set_sim_slots(self, slots: int) -> None:
        """Swap slots per similarity index entry (power of two, 1..64).

        CoreError EINVAL for other values, EBUSY once an owner registered (the indexes exist).
        """
        _check(self.lib.az_store_set_sim_slots(self._s, slots), "set_sim_slots")

    def sim_slots(self) -> int:
        return int(self.lib.az_store_get_sim_slots(self._s))

    def set_sim_sample(self, sample: int) -> None:
        """1 in this many objects of a sparse trust group gets similarity entries (power of two,
        1..64; 1: no group is ever sparse).  May change at any time.  CoreError EINVAL otherwise.
        """
        _check(self.lib.az_store_set_sim_sample(self._s, sample), "set_sim_sample")

    def sim_sample(self) -> int:
        return int(self.lib.az_store_get_sim_sample(self._s))

    def policy(self) -> dict[str, int]:
        p = Policy()
        self.lib.az_store_get_policy(self._s, ctypes.byref(p))
        return _struct_dict(p)

    def set_policy(self, **changes: int) -> None:
        cur = self.policy()
        unknown = set(changes) - set(cur)
        if unknown:
            raise TypeError(f"unknown policy fields: {sorted(unknown)}")
        cur.update(changes)
        p = Policy(**cur)
        _check(self.lib.az_store_set_policy(self._s, ctypes.byref(p)), "set_policy")

    # -- statistics --------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        st = Stats()
        self.lib.az_store_get_stats(self._s, ctypes.byref(st))
        return _struct_dict(st)

    def owner_stats(self, cgroup_id: int) -> dict[str, Any]:
        o = OwnerStats()
        _check(
            self.lib.az_store_owner_stats(self._s, cgroup_id, ctypes.byref(o)),
            f"owner {cgroup_id}",
        )
        return _struct_dict(o)

    def list_owners(self) -> list[dict[str, Any]]:
        return list(self._iter_owners())

    def group_stats(self) -> dict[int, dict[str, Any]]:
        """Per trust group sums over its registered and removed owners.

        Owner entry 0 (unregistered cgroups) is left out; per the accounting
        rule in azcore.h, adding it back gives the global totals.
        """
        out: dict[int, dict[str, Any]] = {}
        keys = ("pages", "orig_bytes", "exclusive_bytes", "shared_bytes", "template_pages")
        for o in self.list_owners():
            if o["cgroup_id"] == 0:
                continue
            g = out.setdefault(
                o["group"],
                {k: 0 for k in keys} | {"kind_pages": dict.fromkeys(KINDS, 0), "owners": 0},
            )
            for k in keys:
                g[k] += o[k]
            for k in KINDS:
                g["kind_pages"][k] += o["kind_pages"][k]
            g["owners"] += 1
        return out

    def _iter_owners(self) -> Iterator[dict[str, Any]]:
        batch = 64
        arr = (OwnerStats * batch)()
        start = 0
        while True:
            n = _check(
                self.lib.az_store_list_owners(self._s, start, arr, batch, None), "list_owners"
            )
            for i in range(n):
                yield _struct_dict(arr[i])
            if n < batch:
                return
            start = arr[n - 1].entry + 1

    # -- registry ----------------------------------------------------------
    def add_sandbox(self, cgroup_id: int, group: int) -> None:
        _check(self.lib.az_store_add_sandbox(self._s, cgroup_id, group), "add_sandbox")

    def del_sandbox(self, cgroup_id: int) -> None:
        _check(self.lib.az_store_del_sandbox(self._s, cgroup_id), "del_sandbox")

    def add_template(self, cgroup_id: int, group: int) -> None:
        _check(self.lib.az_store_add_template(self._s, cgroup_id, group), "add_template")

    def del_template(self, cgroup_id: int) -> None:
        _check(self.lib.az_store_del_template(self._s, cgroup_id), "del_template")

    def set_map(self, cgroup_id: int, start: int, pages: int, pgoff: int) -> None:
        """Index map of an owner: hints in [start, start + pages) are template pages pgoff on."""
        _check(self.lib.az_store_set_map(self._s, cgroup_id, start, pages, pgoff), "set_map")

    def template_load(self, tid: int, index: int, page: bytes) -> None:
        _check(
            self.lib.az_store_template_load(self._s, self._ctx.ptr, tid, index, _page(page)),
            "template_load",
        )

    # -- test hooks --------------------------------------------------------
    def corrupt(self, slot: int, offset: int, xor: int) -> None:
        """Flip bits of the stored object behind ``slot`` (test only)."""
        _check(self.lib.az_store_debug_corrupt(self._s, slot, offset, xor), "corrupt")

    def corrupt_link(self, slot: int, xor: int) -> None:
        """Flip bits of the link to the second half of ``slot``'s split object (test only)."""
        _check(self.lib.az_store_debug_corrupt_link(self._s, slot, xor), "corrupt link")

    def obj_header_bytes(self) -> int:
        """Bytes of one object header (``struct az_obj``)."""
        return int(self.lib.az_obj_header_bytes())

    def check(self) -> None:
        """Verify refcounts, depth-1 bases and trust-group scoping (test only)."""
        _check(self.lib.az_store_debug_check(self._s), "consistency check")

    def fail_pool_allocs(self, n: int) -> None:
        """Make the next ``n`` pool allocations fail (test only)."""
        self.lib.az_host_fail_pool_allocs(n)

    def fail_allocs_of(self, size: int, n: int) -> None:
        """Make the next ``n`` slab allocations of ``size`` bytes fail (test only)."""
        self.lib.az_host_fail_allocs_of(size, n)

    def codec_calls(self) -> dict[str, int]:
        """Compressions made so far by every store of this process (test only): lz4, lz4 with a
        dictionary, zstd."""
        out = (u64 * 3)()
        self.lib.az_host_codec_calls(out)
        return {"lz4": out[0], "lz4_dict": out[1], "zstd": out[2]}

    def encode(self, page: bytes, base: bytes | None = None) -> bytes:
        """Encode ``page`` as a standalone object, or a delta against ``base``."""
        out = ctypes.create_string_buffer(2 * PAGE_SIZE)
        p = Policy(**self.policy())
        n = _check(
            self.lib.az_debug_encode(
                self._ctx.ptr,
                ctypes.byref(p),
                _page(page),
                None if base is None else _page(base),
                out,
            ),
            "encode",
        )
        return out.raw[:n]

    def lz4_compress(
        self, src: bytes, cap: int, dict_: bytes = b"", next_pos: int = 0
    ) -> tuple[bytes | None, int, bytes]:
        """Run the store's lz4 compressor (test only): the block (None when it did not fit in
        ``cap``), the number its table gives the next byte, and the 64 bytes of the output buffer
        past ``cap`` (to check nothing was written there)."""
        guard = 64
        out = ctypes.create_string_buffer(b"\xa5" * (cap + guard), cap + guard)
        after = u32()
        n = _check(
            self.lib.az_debug_lz4(
                self._ctx.ptr,
                bytes(dict_),
                len(dict_),
                bytes(src),
                len(src),
                out,
                cap,
                next_pos,
                ctypes.byref(after),
            ),
            "lz4",
        )
        return (out.raw[:n] if n > 0 else None), after.value, out.raw[cap : cap + guard]

    def encode_pack(self, data: bytes) -> bytes:
        """Encode 2..4 pages as one pack (the store's policy codec); b"" when they do not fit
        one object."""
        if len(data) % PAGE_SIZE or not 2 <= len(data) // PAGE_SIZE <= 4:
            raise ValueError("a pack is 2..4 pages")
        out = ctypes.create_string_buffer(2 * PAGE_SIZE)
        p = Policy(**self.policy())
        n = _check(
            self.lib.az_debug_encode_pack(
                self._ctx.ptr, ctypes.byref(p), bytes(data), len(data) // PAGE_SIZE, out
            ),
            "encode pack",
        )
        return out.raw[:n]

    def decode_pack(self, obj: bytes) -> bytes:
        """Run the pack decoder on arbitrary bytes: the pages, or CoreError EIO."""
        out = ctypes.create_string_buffer(4 * PAGE_SIZE)
        n = _check(self.lib.az_debug_decode_pack(self._ctx.ptr, bytes(obj), len(obj), out), "pack")
        return out.raw[: n * PAGE_SIZE]

    def decode(self, obj: bytes, base: bytes | None = None) -> bytes:
        """Run the object decoder on arbitrary bytes."""
        out = ctypes.create_string_buffer(PAGE_SIZE)
        _check(
            self.lib.az_debug_decode(
                self._ctx.ptr,
                bytes(obj),
                len(obj),
                None if base is None else _page(base),
                out,
            ),
            "decode",
        )
        return out.raw
