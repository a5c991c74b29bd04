"""WorldReadableCopy: an unprivileged process runs a checkout that sits in a 0700 directory."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fakes import WorldReadableCopy

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root + setpriv"
)

PYPROJECT = """\
[project]
name = "azswap"
[tool.setuptools]
package-dir = { "probe" = "src/probe" }
"""


def as_nobody(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv],
        capture_output=True, text=True, timeout=60, cwd="/", env={**os.environ, **env},
    )


def test_copy_runs_a_checkout_others_cannot_enter(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    top = private / "checkout"
    (top / "src" / "probe").mkdir(parents=True)
    (top / "pyproject.toml").write_text(PYPROJECT)
    (top / "src" / "probe" / "__init__.py").write_text("VALUE = 42\n")
    (top / "src" / "probe" / "tool.py").write_text("import click\nprint('tool', click.__name__)\n")
    code = "import probe, click, pyroute2; print(probe.VALUE)"
    with WorldReadableCopy(top) as cp:
        # the control: from the checkout itself nobody cannot import it
        r = as_nobody([cp.python, "-c", code], {"PYTHONPATH": str(top / "src")})
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, r
        # from the copy: the package and the installed dependencies it needs
        r = as_nobody([cp.python, "-c", code], cp.env)
        assert r.returncode == 0 and r.stdout == "42\n", r
        r = as_nobody(cp.script("probe/tool.py"), cp.env)
        assert r.returncode == 0 and r.stdout == "tool click\n", r
        assert (os.stat(cp.root).st_mode & 0o777) == 0o755
        root = cp.root
    assert not root.exists()
