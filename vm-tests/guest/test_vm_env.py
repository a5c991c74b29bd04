"""The guest environment that vm-tests/run promises (ARCHITECTURE.md contract)."""

import os
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]


def _mounts() -> dict[str, str]:
    out = {}
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, mnt, fstype, *_ = line.split()
        out[mnt] = fstype
    return out


def test_runs_as_root_in_the_checkout() -> None:
    assert os.geteuid() == 0
    assert Path.cwd() == TOP
    assert (TOP / "kmod" / "core" / "azcore.h").exists()


def test_filesystems_mounted() -> None:
    m = _mounts()
    assert m.get("/sys/fs/cgroup") == "cgroup2"
    assert m.get("/sys/kernel/debug") == "debugfs"
    assert m.get("/sys/kernel/tracing") == "tracefs"


def test_memory_controller_delegated() -> None:
    ctl = Path("/sys/fs/cgroup/cgroup.subtree_control").read_text().split()
    assert "memory" in ctl


def test_results_dir_writable() -> None:
    out = Path(os.environ["AZSWAP_OUT"])
    probe = out / f"probe-{os.getpid()}"
    probe.write_text("ok")
    assert probe.read_text() == "ok"
    probe.unlink()


def test_test_kernel_is_the_module_target() -> None:
    release = os.uname().release
    assert Path(f"/lib/modules/{release}/build/Makefile").exists()
