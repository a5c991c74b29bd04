"""Style gates: ruff over the Python tree, checkpatch (linux-source-6.1) over the module, the
layout (what ships holds no lab or test code), no history in code."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parent.parent
PY_DIRS = ["controlplane", "cli", "ebpf", "bench", "examples", "tests", "vm-tests"]
PRODUCT_DIRS = ["controlplane", "cli", "ebpf"]
CHECKPATCH_FILES = [
    "scripts/checkpatch.pl", "scripts/spelling.txt", "scripts/const_structs.checkpatch",
]


def _checkpatch() -> Path:
    """checkpatch.pl from Debian's linux-source-6.1, unpacked once into build/."""
    dest = TOP / "build" / "checkpatch"
    script = dest / "linux-source-6.1" / "scripts" / "checkpatch.pl"
    if script.exists():
        return script
    tarball = Path("/usr/src/linux-source-6.1.tar.xz")
    if not tarball.exists():
        pytest.fail("linux-source-6.1 is not installed: run 'make setup'")
    dest.mkdir(parents=True, exist_ok=True)
    members = [f"linux-source-6.1/{name}" for name in CHECKPATCH_FILES]
    subprocess.run(["tar", "-C", str(dest), "-xJf", str(tarball), *members], check=True)
    return script


def test_ruff_clean() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    assert exe, "ruff not installed: run 'make setup'"
    dirs = [d for d in PY_DIRS if (TOP / d).exists()]
    proc = subprocess.run([exe, "check", *dirs, "vm-tests/run"], cwd=TOP,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_module_checkpatch_clean() -> None:
    files = sorted(
        str(p.relative_to(TOP))
        for pat in ("kmod/*.c", "kmod/*.h", "kmod/core/*.c", "kmod/core/*.h", "kmod/uapi/*.h")
        for p in TOP.glob(pat)
        if not p.name.endswith(".mod.c")
    )
    assert files
    proc = subprocess.run(
        ["perl", str(_checkpatch()), "--no-tree", "--terse", "--show-types", "-f", *files],
        cwd=TOP, capture_output=True, text=True,
    )
    problems = [ln for ln in proc.stdout.splitlines() if "ERROR" in ln or "WARNING" in ln]
    assert not problems, "\n".join(problems)


def test_product_holds_no_lab_or_test_code() -> None:
    for d in PRODUCT_DIRS:
        for p in sorted((TOP / d).rglob("*.py")):
            text = p.read_text()
            rel = p.relative_to(TOP)
            assert "sys.path" not in text, f"{rel}: sys.path"
            assert not re.search(r"^\s*(import|from) (pytest|bench|tests)\b", text, re.M), rel


def _source_files(dirs: list[str], exts: tuple[str, ...]) -> list[Path]:
    """The checkout's files under @dirs ending in @exts: tracked or new, not ignored (build
    output, recordings and guest images under vm-tests/out/ are not source)."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                           "--", *dirs], cwd=TOP, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    names = sorted({n for n in proc.stdout.split("\0") if n.endswith(exts)})
    return [TOP / n for n in names if (TOP / n).is_file()]


def test_no_numbered_history_in_code() -> None:
    pat = re.compile(r"\b(issue|session|work item)s? ?[0-9]+", re.I)
    files = _source_files([*PY_DIRS, "kmod"], (".py", ".c", ".h"))
    assert any(p.name == "store.c" for p in files) and any(p.suffix == ".py" for p in files)
    hits = [f"{p.relative_to(TOP)}: {m.group(0)}" for p in files
            for m in [pat.search(p.read_text(errors="replace"))] if m]
    assert not hits, hits
