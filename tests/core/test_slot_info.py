"""az_store_slot_info: kind and pool bytes of a slot (the azswap_store tracepoint reports them)."""

from __future__ import annotations

import ctypes
import os

from controlplane.trace.corelib import Store


def _info(st: Store, slot: int) -> tuple[int, int]:
    fn = st.lib.az_store_slot_info
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint32)]
    fn.restype = ctypes.c_int
    out = ctypes.c_uint32(0xFFFFFFFF)
    kind = fn(st._s, slot, ctypes.byref(out))
    return kind, out.value


def test_slot_info_reports_kind_and_bytes(store: Store) -> None:
    text = (b"the quick brown fox jumps over the lazy dog " * 100)[:4096]
    store.put(1, bytes(4096))
    store.put(2, text)
    store.put(3, os.urandom(4096))
    k_same, b_same = _info(store, 1)
    k_plain, b_plain = _info(store, 2)
    k_raw, b_raw = _info(store, 3)
    assert b_same == 0
    assert 0 < b_plain < 1024
    assert b_raw >= 3072
    assert len({k_same, k_plain, k_raw}) == 3
    kind, _ = _info(store, 4)
    assert kind == -2  # -ENOENT: empty slot
    kind, _ = _info(store, 1 << 40)
    assert kind == -22  # -EINVAL: out of range
