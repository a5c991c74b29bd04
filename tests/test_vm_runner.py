"""vm-tests/run's pieces that need no guest: the guest script and the output follower."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

TOP = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runner() -> ModuleType:
    path = TOP / "vm-tests" / "run"
    loader = importlib.machinery.SourceFileLoader("vm_tests_run", str(path))
    spec = importlib.util.spec_from_loader("vm_tests_run", loader)
    assert spec
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_follower_streams_complete_lines(runner: ModuleType, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "output"
    f = runner.OutputFollower(out)
    assert f.poll() == []  # the guest has not written yet
    out.write_text("one\ntw")
    assert f.poll() == ["one\n"]
    with out.open("a") as fh:
        fh.write("o\nthree")
    assert f.poll() == ["two\n"]
    assert f.finish() == ["three\n"]
    assert capsys.readouterr().out == "one\ntwo\nthree\n"


def test_guest_script_sends_output_to_the_file(runner: ModuleType, tmp_path: Path) -> None:
    """The script, run by a shell here: CMD's stdout and stderr land in OUTPUT, its status in
    STATUS, and the script exits with it."""
    status, dmesg, output = tmp_path / "status", tmp_path / "dmesg", tmp_path / "output"
    script = runner.guest_script(["sh", "-c", "echo out; echo err >&2; exit 3"], status, dmesg,
                                 output)
    # Only the part from `cd` on: the head mounts cgroup2 and sets sysctls (root, guest only).
    cmd_part = script[script.index("sh -c"):]
    cmd_part = cmd_part.replace("dmesg >", "true >").replace("(dmesg -w", "(true")
    r = subprocess.run(["sh", "-c", cmd_part], capture_output=True, text=True)
    assert r.returncode == 3
    assert output.read_text() == "out\nerr\n"
    assert status.read_text().strip() == "3"
    assert r.stdout == ""
