"""az_core_stress() (kmod/core/selftest.c) on the host under ASan+LSan and TSan.

Workers own disjoint slot ranges and store/load/free related pages of
sandboxes in two trust groups, an unregistered cgroup and a template,
while a control thread loads template pages, removes and re-adds owners,
changes policy and drains deferred frees.  Every load is compared with the
last page written; the consistency checker runs at the end and all memory
must return to zero.  The kernel runs the same function (test_kselftest.py).
AZCORE_STRESS_SECONDS sets the duration.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from .conftest import REPO

SECONDS = os.environ.get("AZCORE_STRESS_SECONDS", "5")


@pytest.mark.parametrize("variant", ["azcore-stress", "azcore-stress-tsan"])
def test_stress(variant):
    subprocess.run(["make", "-s", "-f", "kmod/core/host.mk", "stress"], cwd=REPO, check=True)
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1", ASAN_OPTIONS="detect_leaks=1")
    r = subprocess.run(
        [str(REPO / "build" / variant), "4", SECONDS],
        capture_output=True,
        text=True,
        env=env,
        timeout=int(SECONDS) + 120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "stress: ok" in r.stdout
    assert "ThreadSanitizer" not in out and "AddressSanitizer" not in out
    assert "LeakSanitizer" not in out
