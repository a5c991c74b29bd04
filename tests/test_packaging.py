"""Install path checks that run on the host: shell scripts, DKMS build of the module tree, the
Python wheel (what it holds, and that it runs from a fresh venv)."""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import sys
import zipfile
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


@pytest.mark.parametrize("series", ["6.1", "6.12", "7.3"])
def test_dkms_builds_the_module(series: str, tmp_path: Path) -> None:
    """A real DKMS add + build for each supported series (dkms-install.sh --tree; 7.3 in its
    Debian 13 chroot), nothing installed; the module's vermagic names that series' kernel."""
    assert shutil.which("dkms"), "dkms missing: run 'make setup'"
    kernels = str(TOP / "scripts" / "kernels.sh")
    rel = subprocess.run([kernels, "release", series], capture_output=True, text=True,
                         check=True).stdout.strip()
    proc = subprocess.run([kernels, "dkms", series, str(tmp_path)], cwd=TOP,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    built = [p for p in tmp_path.rglob("azswap.ko*") if p.is_file()]
    assert built, "DKMS built no azswap.ko"
    for ko in built:
        data = lzma.decompress(ko.read_bytes()) if ko.suffix == ".xz" else ko.read_bytes()
        assert f"vermagic={rel} ".encode() in data, (ko, rel)


# -- the wheel: what ships, and that it runs from a fresh venv ------------------------------

PRODUCT = ("controlplane/", "azctl/", "ebpf/")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel` of a copy of the checkout's files (a build in the checkout would leave
    build/lib behind, whose stale files later wheels pick up)."""
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=TOP,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (TOP / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(TOP / f, src / f)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = out.glob("azswap-*.whl")
    return whl


def test_wheel_ships_the_product_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if ".dist-info/" not in n]
    assert code and all(n.startswith(PRODUCT) for n in code), [
        n for n in code if not n.startswith(PRODUCT)]
    for must in ("controlplane/daemon.py", "controlplane/trace/replay.py",
                 "controlplane/trace/recorder.py", "azctl/main.py", "ebpf/tracer.py",
                 "ebpf/faulttrace.c"):
        assert must in names, must
    lab = [n for n in code if any(w in n for w in ("bench", "demo", "test", "coldpages"))]
    assert lab == [], lab
    with zipfile.ZipFile(wheel) as z:
        for n in code:
            if n.endswith(".py"):
                text = z.read(n).decode()
                assert "import pytest" not in text and "sys.path" not in text, n


def test_wheel_runs_from_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    py = venv / "bin" / "python"
    # the dependencies (click, rich, pyroute2, ...) from this .venv's site-packages, offline;
    # a plain path entry: this venv's editable finder for the checkout is not loaded
    deps = subprocess.run([sys.executable, "-c", "import click, os; "
                           "print(os.path.dirname(os.path.dirname(click.__file__)))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    Path(site.stdout.strip(), "azswap-test-deps.pth").write_text(deps + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AZCORE_LIB")}
    # --ignore-installed: the dependencies' directory also lists this checkout's editable azswap
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--ignore-installed", str(wheel)], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    def run(*cmd: str) -> str:
        p = subprocess.run(list(cmd), cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, (cmd, p.stdout, p.stderr)
        return p.stdout

    where = run(str(py), "-c", "import controlplane, azctl; print(controlplane.__file__)")
    assert where.startswith(str(venv)), where  # the wheel's copy, not the checkout
    assert "azctl daemon" in run(str(venv / "bin" / "azctl"), "--help")
    assert "--cpu-budget" in run(str(venv / "bin" / "azctl"), "daemon", "--help")
    out = run(str(py), "-m", "controlplane.trace.replay", "--help")
    assert "--strategies" in out and "--json" in out
    assert "--template" in run(str(py), "-m", "controlplane.trace.recorder", "--help")
