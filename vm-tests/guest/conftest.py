"""Fixtures shared by the in-guest azswap tests (device, netlink, fan-out).

These files are also collected on the host (by vm-tests/conftest.py, which runs them in the guest):
nothing here touches the system at import time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import azswap_guest as ag

IN_GUEST = bool(os.environ.get("AZSWAP_IN_GUEST"))


@pytest.fixture(scope="module", autouse=True)
def _module_isolation() -> Iterator[None]:
    """Every test file leaves the guest as it found it: the swap device and the fault tracer
    that test_ebpf.py / test_prefetch.py share (swapdev.session_swap) end with the file, so the
    next file can load, reset and unload the module itself."""
    yield
    if IN_GUEST and "swapdev" in sys.modules:
        sys.modules["swapdev"]._session_end()
        sys.modules["swapdev"]._session.clear()


@pytest.fixture(scope="session")
def azpages():
    """The patterned-page library (azpages.c built into /tmp)."""
    return ag.build_azpages()


@pytest.fixture
def module() -> Iterator[Callable[..., None]]:
    """insmod azswap.ko with the given parameters; swapoff + rmmod afterwards."""
    if not IN_GUEST:
        pytest.skip("runs inside the test kernel (vm-tests/run)")
    ag.cleanup_module()
    ag.disable_zswap()
    yield ag.insmod
    ag.cleanup_module()
    ag.remove_cgroups()


@pytest.fixture
def dev0(module) -> ag.Dev:
    """Module loaded with one device, not initialised."""
    module()
    return ag.Dev(0)


@pytest.fixture
def workers() -> Iterator[list[ag.Worker]]:
    """A list the test appends its workers to; all are stopped at the end."""
    ws: list[ag.Worker] = []
    yield ws
    for w in reversed(ws):
        w.stop()
