"""Replay tests use the host store core (build/libazcore.so, built on demand like tests/core)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from controlplane.trace.corelib import default_lib_path

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def store_lib() -> Path:
    if not os.environ.get("AZCORE_LIB"):
        subprocess.run(
            ["make", "-s", "-f", str(REPO / "kmod/core/host.mk")],
            check=True,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
        )
    p = default_lib_path()
    if not p.exists():
        pytest.skip(f"{p} missing")
    return p
