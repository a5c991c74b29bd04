"""The running kernel's BTF (/sys/kernel/btf/vmlinux): how many arguments a kernel function takes.

Probe targets change between kernel series (swap_cache_get_folio() takes (entry, vma, addr) up
to 6.17 and (entry) from the swap-table rework on), and the functions are static, so no header
says which: the kernel's own type information does.
"""

from __future__ import annotations

import struct
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
BTF_MAGIC = 0xEB9F
KIND_FUNC, KIND_FUNC_PROTO = 12, 13
# Bytes that follow the 12-byte btf_type, by kind: (fixed, per vlen entry).
_EXTRA = {
    1: (4, 0), 2: (0, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 7: (0, 0),
    8: (0, 0), 9: (0, 0), 10: (0, 0), 11: (0, 0), 12: (0, 0), 13: (0, 8), 14: (4, 0),
    15: (0, 12), 16: (0, 0), 17: (4, 0), 18: (0, 0), 19: (0, 12),
}


class BTFError(Exception):
    """The BTF blob is missing or not in a layout this reader knows."""


def func_arg_counts(names: set[str], path: Path = VMLINUX) -> dict[str, int]:
    """Number of parameters of each function in NAMES that the BTF describes (absent: unknown)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BTFError(f"{path}: {e.strerror}") from None
    if len(data) < 24:
        raise BTFError(f"{path}: too short for a BTF header")
    magic, _ver, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
    if magic != BTF_MAGIC:
        raise BTFError(f"{path}: not BTF (magic {magic:#x})")
    type_off, type_len, str_off, _str_len = struct.unpack_from("<IIII", data, 8)
    types = hdr_len + type_off
    strs = hdr_len + str_off
    wanted = {n.encode() for n in names}
    protos: dict[int, int] = {}  # FUNC_PROTO type id -> vlen
    funcs: dict[str, int] = {}  # name -> FUNC_PROTO type id
    pos, end, tid = types, types + type_len, 1
    while pos < end:
        name_off, info, size_type = struct.unpack_from("<III", data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        if kind not in _EXTRA:
            raise BTFError(f"{path}: unknown BTF kind {kind} at type {tid}")
        if kind == KIND_FUNC_PROTO:
            protos[tid] = vlen
        elif kind == KIND_FUNC:
            stop = data.index(b"\0", strs + name_off)
            name = data[strs + name_off:stop]
            if name in wanted:
                funcs[name.decode()] = size_type
        fixed, per = _EXTRA[kind]
        pos += 12 + fixed + per * vlen
        tid += 1
    return {n: protos[p] for n, p in funcs.items() if p in protos}
