"""Run the store-core property tests against the ASan/UBSan build.

The sanitized library (build/libazcore-asan.so) is loaded into a fresh
Python with libasan preloaded (Python itself is not instrumented).  A
second run against a library with a deliberate off-by-one proves the
set-up catches real bugs rather than passing vacuously.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from .conftest import REPO

TESTS = [
    "tests/core/test_store.py",
    "tests/core/test_redundancy.py",
    "tests/core/test_stateful.py",
    "tests/core/test_lz4c.py",
]

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("AZCORE_UNDER_ASAN")), reason="already running under ASan"
)


def libasan() -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.skip("no gcc to locate libasan")
    out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True)
    path = out.stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        pytest.skip("libasan.so not found")
    return path


def run_sanitized(lib: str, tests: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    subprocess.run(
        ["make", "-s", "-f", "kmod/core/host.mk", "all", "planted"],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=libasan(),
        AZCORE_LIB=str(REPO / "build" / lib),
        AZCORE_UNDER_ASAN="1",
        # Python's own allocations are not ours to judge: no leak check here
        # (tests/core/test_leaks.py covers leaks through the store counters).
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
    )
    # -s: sanitizer reports go to the real stderr, not pytest's capture.
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-s", "-p", "no:cacheprovider"]
    cmd += [*tests, *extra]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_property_tests_pass_under_asan():
    r = run_sanitized("libazcore-asan.so", TESTS)
    tail = f"rc={r.returncode}\n" + (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    assert "passed" in r.stdout
    assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, tail


def test_asan_run_catches_a_planted_bug():
    r = run_sanitized("libazcore-asan-planted.so", ["tests/core/test_store.py"], "-k", "overwrite")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "AddressSanitizer: heap-buffer-overflow" in out, out[-4000:]
