"""Kernel-series plumbing on the host: BTF argument counts, series names, scripts/kernels.sh."""

from __future__ import annotations

import importlib.util
import struct
import subprocess
from pathlib import Path

import pytest

from ebpf.btf import BTFError, func_arg_counts

TOP = Path(__file__).resolve().parent.parent


def _btf(funcs: dict[str, int]) -> bytes:
    """A BTF blob: one INT, then for each function a FUNC_PROTO with N int params and its FUNC."""
    strings = b"\0int\0"
    types = struct.pack("<III", 1, (1 << 24), 4) + struct.pack("<I", 32)  # [1] INT 'int'
    tid = 2
    for name, nargs in funcs.items():
        types += struct.pack("<III", 0, (13 << 24) | nargs, 1)  # FUNC_PROTO returning int
        types += b"".join(struct.pack("<II", 0, 1) for _ in range(nargs))
        off = len(strings)
        strings += name.encode() + b"\0"
        types += struct.pack("<III", off, (12 << 24), tid)  # FUNC -> that proto
        tid += 2
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return hdr + types + strings


def test_btf_arg_counts(tmp_path: Path) -> None:
    blob = tmp_path / "vmlinux"
    blob.write_bytes(_btf({"swap_cache_get_folio": 1, "handle_mm_fault": 4, "other": 2}))
    got = func_arg_counts({"swap_cache_get_folio", "handle_mm_fault", "absent"}, blob)
    assert got == {"swap_cache_get_folio": 1, "handle_mm_fault": 4}


def test_btf_rejects_garbage(tmp_path: Path) -> None:
    blob = tmp_path / "vmlinux"
    blob.write_bytes(b"\0" * 64)
    with pytest.raises(BTFError, match="not BTF"):
        func_arg_counts({"x"}, blob)
    with pytest.raises(BTFError):
        func_arg_counts({"x"}, tmp_path / "missing")


def test_kernel_series_names() -> None:
    spec = importlib.util.spec_from_file_location(
        "azswap_guest", TOP / "vm-tests" / "guest" / "azswap_guest.py")
    assert spec and spec.loader
    ag = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ag)
    assert ag.kernel_series("6.1.0-57-amd64") == "6.1"
    assert ag.kernel_series("6.12.95+deb12-amd64") == "6.12"
    assert ag.kernel_series("7.3.4+deb13-amd64") == "7.3"


def test_kernels_sh_rejects_unknown_series() -> None:
    r = subprocess.run([str(TOP / "scripts" / "kernels.sh"), "release", "5.10"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "unknown series '5.10'" in r.stderr


def test_kernels_sh_default_series_is_the_test_kernel() -> None:
    kver = subprocess.run([str(TOP / "scripts" / "kver")], capture_output=True, text=True)
    rel = subprocess.run([str(TOP / "scripts" / "kernels.sh"), "release", "6.1"],
                         capture_output=True, text=True)
    assert kver.returncode == 0 and rel.returncode == 0
    assert rel.stdout == kver.stdout and rel.stdout.startswith("6.1.")
