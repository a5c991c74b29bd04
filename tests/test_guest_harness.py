"""vm-tests/conftest.py against a fake vm-tests/run: the runner's exit status decides the run.

The harness is copied into a scratch tree (its TOP is that tree, so vm-tests/run there is the
fake, and its results folder is the tree's own) next to three trivial guest tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SPLAT = "BUG: KASAN: slab-use-after-free in az_store_put+0x1f/0x2a0 [azswap]"

FAKE_RUNNER = """\
#!{python}
import json, os, sys
from pathlib import Path

out = Path(__file__).resolve().parent / "out"
out.mkdir(exist_ok=True)
mode = os.environ["FAKE_RUNNER_MODE"]
nodeids = [a for a in sys.argv[1:] if "::" in a]
results = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("AZSWAP_RESULTS="))
with open(results, "a") as f:
    for n in nodeids:
        if mode == "lost" and n.endswith("test_c"):
            continue
        f.write(json.dumps({{"nodeid": n, "outcome": "passed"}}) + "\\n")
filler = [f"[   13.{{i:06d}}] unrelated line {{i}}" for i in range(100)]
if mode == "splat":
    klog = ["[   12.000000] azswap: loaded", "[   12.300000] {splat}",
            "[   12.300001] Read of size 8 at addr ffff888003a1c000 by task kswapd0/42",
            *filler]
    (out / "last-dmesg.txt").write_text("\\n".join(klog) + "\\n")
    print("--- console tail ---", file=sys.stderr)
    print("\\n".join(filler[-40:]), file=sys.stderr)
    print("--- end ---", file=sys.stderr)
    print("vm-tests/run: kernel splat in dmesg: [   12.300000] {splat} "
          "(full log: vm-tests/out/last-dmesg.txt)", file=sys.stderr)
    sys.exit(125)
sys.exit(3 if mode == "exit3" else 0)
"""

GUEST_TESTS = """\
def test_a():
    pass


def test_b():
    pass


def test_c():
    pass
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    vt = tmp_path / "vm-tests"
    (vt / "guest").mkdir(parents=True)
    shutil.copy(REPO / "vm-tests" / "conftest.py", vt / "conftest.py")
    (vt / "guest" / "test_fake.py").write_text(GUEST_TESTS)
    runner = vt / "run"
    runner.write_text(FAKE_RUNNER.format(python=sys.executable, splat=SPLAT))
    runner.chmod(0o755)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return tmp_path


def run_harness(tree: Path, mode: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZSWAP_")}
    env.update(FAKE_RUNNER_MODE=mode, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "vm-tests/guest", *args],
        cwd=tree, env=env, capture_output=True, text=True, timeout=300,
    )


def test_splat_fails_the_run_although_every_guest_test_passed(tree: Path) -> None:
    p = run_harness(tree, "splat")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "1 failed, 3 passed" in out, out
    assert "FAILED vm-tests/run::guest kernel run" in out, out
    assert "vm-tests/run exited 125" in out, out
    assert f"vm-tests/run: kernel splat in dmesg: [   12.300000] {SPLAT}" in out, out
    # the splat's own lines come from the saved kernel log, not only the console tail
    assert "Read of size 8 at addr ffff888003a1c000 by task kswapd0/42" in out, out


def test_nonzero_exit_without_a_reason_line_fails_the_run(tree: Path) -> None:
    p = run_harness(tree, "exit3")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "1 failed, 3 passed" in out, out
    assert "vm-tests/run exited 3" in out and "the guest command exited 3" in out, out


def test_clean_run_passes_and_the_run_item_comes_last(tree: Path) -> None:
    p = run_harness(tree, "clean", "-v")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "4 passed" in out, out
    ran = [
        ln.split(" PASSED")[0].strip()
        for ln in p.stdout.splitlines()
        if ln.startswith("vm-tests/") and "::" in ln
    ]
    assert ran == [
        "vm-tests/guest/test_fake.py::test_a",
        "vm-tests/guest/test_fake.py::test_b",
        "vm-tests/guest/test_fake.py::test_c",
        "vm-tests/run::guest kernel run",
    ], out


def test_selection_keeps_the_run_item(tree: Path) -> None:
    p = run_harness(tree, "splat", "-k", "test_b")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "1 failed, 1 passed, 2 deselected" in out, out


def test_missing_result_fails_its_test(tree: Path) -> None:
    p = run_harness(tree, "lost")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "FAILED vm-tests/guest/test_fake.py::test_c" in out, out
    assert "no result from the guest for vm-tests/guest/test_fake.py::test_c" in out, out
