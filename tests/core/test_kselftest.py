"""The store core's self-test inside the real 6.1 kernel (opt-in: AZCORE_VM_SELFTEST=1).

kmod/core/kselftest/run.sh builds kmod/core alone as a module whose init
runs az_core_selftest() (zsmalloc, kernel lz4/zstd, bit locks, deferred
free) and az_core_stress() (4 kthreads racing on one store for 3 s) and
loads it in the test VM through vm-tests/run, which also fails on any
kernel splat.  Takes about a minute.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from .conftest import REPO


@pytest.mark.skipif(os.environ.get("AZCORE_VM_SELFTEST") != "1", reason="set AZCORE_VM_SELFTEST=1")
def test_selftest_in_kernel():
    r = subprocess.run(
        [str(REPO / "kmod/core/kselftest/run.sh")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "azswap: selftest: ok" in out
    assert "azswap: stress: ok" in out


def test_selftest_on_host(lib_path):
    import ctypes

    lib = ctypes.CDLL(str(lib_path))
    assert lib.az_core_selftest() == 0
