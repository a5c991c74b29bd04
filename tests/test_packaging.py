"""Install path checks that run on the host: shell scripts, DKMS build of the module tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parent.parent
SCRIPTS = ["packaging/azswap-swap-setup", "packaging/dkms-install.sh", "packaging/install.sh",
           "scripts/kver"]
BASH_SCRIPTS = ["scripts/setup.sh"]


@pytest.mark.parametrize("script", SCRIPTS + BASH_SCRIPTS)
def test_shell_scripts_clean(script: str) -> None:
    shell = "bash" if script in BASH_SCRIPTS else "sh"
    assert subprocess.run([shell, "-n", script], cwd=TOP).returncode == 0
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: run 'make setup'"
    proc = subprocess.run([shellcheck, "-s", shell, script], cwd=TOP, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout


def test_dkms_builds_the_module(tmp_path: Path) -> None:
    """dkms-install.sh --tree: a real DKMS add + build for the test kernel, nothing installed."""
    assert shutil.which("dkms"), "dkms missing: run 'make setup'"
    kver = subprocess.run([str(TOP / "scripts" / "kver")], capture_output=True, text=True,
                          check=True).stdout.strip()
    proc = subprocess.run([str(TOP / "packaging" / "dkms-install.sh"), "--tree", str(tmp_path),
                           "-k", kver], cwd=TOP, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(tmp_path.rglob("azswap.ko*")), "DKMS built no azswap.ko"
