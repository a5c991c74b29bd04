"""Store-core test fixtures.

The library under test is AZCORE_LIB if set, else build/libazcore.so (built
on demand from kmod/core).  tests/core/test_asan.py re-runs the property
tests in a subprocess against build/libazcore-asan.so with libasan
preloaded.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controlplane.trace.corelib import Store, default_lib_path

REPO = Path(__file__).resolve().parents[2]


def build_hostlib() -> None:
    subprocess.run(
        ["make", "-s", "-f", str(REPO / "kmod/core/host.mk")],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )


@pytest.fixture(scope="session")
def lib_path() -> Path:
    if not os.environ.get("AZCORE_LIB"):
        build_hostlib()
    p = default_lib_path()
    if not p.exists():
        pytest.skip(f"{p} missing")
    return p


@pytest.fixture
def make_store(lib_path: Path) -> Iterator[Callable[..., Store]]:
    made: list[Store] = []

    def make(nr_slots: int = 256, **kw: int) -> Store:
        st = Store(nr_slots, lib=lib_path, **kw)
        made.append(st)
        return st

    yield make
    for st in made:
        st.close()


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()
