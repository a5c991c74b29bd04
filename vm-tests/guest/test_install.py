"""The install path of docs/install.md, in the test kernel.

- `make install` (packaging/install.sh) puts kmod/azswap.ko under /lib/modules/REL/updates and runs
  depmod: `modprobe azswap` by name then creates /dev/azswap0, `modprobe -r` removes it;
- azswap-swap-setup, what azswap-swap.service runs at boot: start gives a swap device with the
  settings of /etc/default/azswap, stop takes it all back;
- the installed systemd units pass `systemd-analyze verify`;
- packaging/dkms-install.sh builds the module with DKMS against the guest kernel's headers.

Runs as root inside vm-tests/run, where /lib/modules, /etc, /usr/local, /usr/src and /var/lib are
writable overlays that vanish with the guest.  Everything installed is removed again at the end.

depmod reads every module of the tree: under TCG, through 9p, the 4,000 modules of Debian's kernel
(390 MB) take 4-5 minutes per depmod, and the install path runs it five times.  So, for this file
only, /lib/modules/REL is a bind mount of a cut-down copy holding azswap's dependencies (from the
real modules.dep), modules.builtin* and the build/source links: the scripts, depmod, modprobe and
dkms run unchanged on it.  AZSWAP_INSTALL_FULL_TREE=1 uses the real tree instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]
PKG = TOP / "packaging"
KO = TOP / "kmod" / "azswap.ko"
REL = os.uname().release
MODDIR = Path(f"/lib/modules/{REL}")
UPDATES = MODDIR / "updates"
SLIM = Path("/tmp/azswap-test-modules")
UNITDIR = Path("/etc/systemd/system")
SETUP = Path("/usr/local/sbin/azswap-swap-setup")
IN_GUEST = bool(os.environ.get("AZSWAP_IN_GUEST"))

# These tests install files into /lib/modules, /etc and /usr/local: never on a host.
pytestmark = pytest.mark.skipif(not IN_GUEST, reason="runs inside the test kernel (vm-tests/run)")


def sh(
    *cmd: str | Path, env: dict[str, str] | None = None, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    r = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        check=False,
        env=None if env is None else {**os.environ, **env},
        timeout=timeout,
    )
    print(f"$ {' '.join(map(str, cmd))}  ({time.monotonic() - t0:.1f} s, exit {r.returncode})")
    if check and r.returncode:
        raise AssertionError(
            f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        )
    return r


def loaded() -> bool:
    return Path("/sys/module/azswap").exists()


def swaps() -> dict[str, list[str]]:
    lines = Path("/proc/swaps").read_text().splitlines()[1:]
    return {ln.split()[0]: ln.split() for ln in lines}


def unload() -> None:
    for dev in swaps():
        if "azswap" in dev:
            sh("swapoff", dev, check=False)
    if loaded():
        sh("rmmod", "azswap", check=False)


def modprobe_path() -> str:
    """The file `modprobe azswap` would load ('' if none)."""
    return sh("modinfo", "-F", "filename", "azswap", check=False).stdout.strip()


def _dep_closure(names: list[str]) -> set[str]:
    """Paths (relative to /lib/modules/REL) of the named modules and of all they depend on."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (MODDIR / "modules.dep").read_text().splitlines():
        mod, _, rest = line.partition(":")
        deps[mod] = rest.split()
        by_name[Path(mod).name.split(".ko")[0].replace("-", "_")] = mod
    todo = [by_name[n] for n in names if n in by_name]  # the others are built in
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(deps[m])
    return seen


@pytest.fixture(scope="module", autouse=True)
def module_tree() -> Iterator[None]:
    """/lib/modules/REL cut down to what azswap needs, for this file's tests (see the docstring)."""
    if not IN_GUEST or os.environ.get("AZSWAP_INSTALL_FULL_TREE"):
        yield
        return
    want = sh("modinfo", "-F", "depends", KO).stdout.strip().split(",")
    shutil.rmtree(SLIM, ignore_errors=True)
    SLIM.mkdir()
    for rel in _dep_closure([w for w in want if w]):
        (SLIM / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(MODDIR / rel, SLIM / rel)
    for f in ("modules.builtin", "modules.builtin.modinfo", "modules.order"):
        shutil.copy2(MODDIR / f, SLIM / f)
    for link in ("build", "source"):
        if (MODDIR / link).is_symlink():
            (SLIM / link).symlink_to(os.readlink(MODDIR / link))
    sh("mount", "--bind", SLIM, MODDIR)
    try:
        sh("depmod", "-a", REL)
        yield
    finally:
        unload()
        # lazy: udevd may still map the modules.*.bin indexes of the cut-down tree
        sh("umount", "-l", MODDIR)
        shutil.rmtree(SLIM, ignore_errors=True)


@pytest.fixture
def clean() -> Iterator[None]:
    """No azswap loaded or installed before and after the test."""
    unload()
    yield
    unload()
    sh(PKG / "install.sh", "uninstall", check=False)


@pytest.fixture
def installed(clean: None) -> None:
    """`make install`: the module and the files (units, setup script, config examples)."""
    assert KO.exists(), "kmod/azswap.ko is not built (make kmod)"
    sh(PKG / "install.sh", "all")


def test_make_install_then_modprobe_by_name(installed: None) -> None:
    ko = UPDATES / "azswap.ko"
    assert ko.is_file()
    assert ko.read_bytes() == KO.read_bytes()
    assert modprobe_path() == str(ko)
    # the shipped modprobe.d example is what modprobe reads
    conf = sh("modprobe", "--showconfig").stdout
    assert "options azswap num_devices=1" in conf

    sh("modprobe", "azswap")
    assert loaded()
    assert Path("/sys/module/azswap/parameters/num_devices").read_text().strip() == "1"
    dev = Path("/dev/azswap0")
    for _ in range(50):
        if dev.exists():
            break
        time.sleep(0.1)
    assert dev.is_block_device(), "modprobe azswap created no /dev/azswap0"
    assert Path("/sys/block/azswap0/disksize").read_text().strip() == "0"
    assert not Path("/dev/azswap1").exists()

    # udev probes a new disk (blkid opens it): until that is done the module is in use
    if shutil.which("udevadm"):
        sh("udevadm", "settle", "--timeout=120", check=False)
    sh("modprobe", "-r", "azswap")
    assert not loaded()
    assert not dev.exists()

    sh(PKG / "install.sh", "uninstall")
    assert not ko.exists()
    assert modprobe_path() == ""
    assert not SETUP.exists()
    assert not (UNITDIR / "azswap-swap.service").exists()
    assert not Path("/etc/default/azswap").exists()
    assert not Path("/etc/modprobe.d/azswap.conf").exists()


def test_install_keeps_edited_config(installed: None) -> None:
    cfg = Path("/etc/default/azswap")
    cfg.write_text(cfg.read_text() + "PRIORITY=5\n")
    sh(PKG / "install.sh", "files")
    assert cfg.read_text().endswith("PRIORITY=5\n")
    sh(PKG / "install.sh", "uninstall")
    assert cfg.exists(), "uninstall removed a config file the admin had changed"
    cfg.unlink()


def test_swap_setup_start_stop(installed: None, tmp_path: Path) -> None:
    vm = Path("/proc/sys/vm")
    before = {k: (vm / k).read_text() for k in ("page-cluster", "swappiness")}
    zswap = Path("/sys/module/zswap/parameters/enabled")
    zswap_before = zswap.read_text().strip() if zswap.exists() else None
    # values that start must change and stop must put back
    (vm / "page-cluster").write_text("3")
    (vm / "swappiness").write_text("60")
    zswap_on = False
    if zswap_before is not None:
        try:
            zswap.write_text("Y")
            zswap_on = True
        except OSError:  # zswap without a pool (zswap.enabled=0 at boot) cannot be turned on
            pass
    cfg = tmp_path / "azswap"
    cfg.write_text("DISKSIZE=64M\nCOMP_ALGORITHM=zstd\nMEM_LIMIT=32M\nPRIORITY=77\n")
    env = {"AZSWAP_CONFIG": str(cfg)}
    try:
        sh(SETUP, "start", env=env)
        sys_ = Path("/sys/block/azswap0")
        assert swaps()["/dev/azswap0"][4] == "77"  # Filename Type Size Used Priority
        assert int((sys_ / "disksize").read_text()) == 64 << 20
        assert (sys_ / "comp_algorithm").read_text().strip().startswith("zstd")
        assert int((sys_ / "mem_limit").read_text()) == 32 << 20
        assert (vm / "page-cluster").read_text().strip() == "0"
        assert (vm / "swappiness").read_text().strip() == "100"
        if zswap_before is not None:
            assert zswap.read_text().strip() == "N"
        # a second start (systemctl restart after a crash, say) is a no-op
        sh(SETUP, "start", env=env)
        lines = Path("/proc/swaps").read_text().splitlines()
        assert [ln.split()[0] for ln in lines].count("/dev/azswap0") == 1
        st = sh(SETUP, "status", env=env).stdout
        assert "/dev/azswap0" in st and "mm_stat:" in st

        sh(SETUP, "stop", env=env)
        assert "/dev/azswap0" not in swaps()
        assert not loaded()
        assert (vm / "page-cluster").read_text().strip() == "3"
        assert (vm / "swappiness").read_text().strip() == "60"
        if zswap_on:
            assert zswap.read_text().strip() == "Y"
        # stop again: nothing left to do, still success
        sh(SETUP, "stop", env=env)
    finally:
        unload()
        for k, v in before.items():
            (vm / k).write_text(v)
        if zswap_before is not None and zswap.read_text().strip() != zswap_before:
            zswap.write_text(zswap_before)


def test_systemd_units_verify(installed: None) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed (Debian: systemd)")
    units = [UNITDIR / "azswap-swap.service"]
    daemon = UNITDIR / "azswap-daemon.service"
    if (TOP / "controlplane" / "systemd" / "azswap-daemon.service").exists():
        assert daemon.exists()
        units.append(daemon)
    r = sh("systemd-analyze", "verify", *units, check=False)
    assert r.returncode == 0, f"systemd-analyze verify:\n{r.stdout}{r.stderr}"
    # the installed unit runs the installed script
    text = (UNITDIR / "azswap-swap.service").read_text()
    assert f"ExecStart={SETUP} start" in text
    assert f"ExecStop={SETUP} stop" in text


def test_dkms_build_install(clean: None) -> None:
    if not os.environ.get("AZSWAP_TEST_DKMS"):
        pytest.skip(
            "DKMS compiles the module inside the guest: 10+ minutes under TCG on a loaded "
            "machine; `vm-tests/run -- env AZSWAP_TEST_DKMS=1 .venv/bin/pytest ...` runs it "
            "(packaging/dkms-install.sh --tree checks the DKMS build on the host in ~1 minute)"
        )
    if not shutil.which("dkms"):
        pytest.skip("dkms not installed on the host (Debian: dkms)")
    if not Path(f"/lib/modules/{REL}/build/Makefile").exists():
        pytest.skip(f"no kernel headers for {REL}")
    try:
        sh(PKG / "dkms-install.sh", "-k", REL, timeout=1500)
        status = sh("dkms", "status", "-m", "azswap").stdout
        assert f"{REL}" in status and "installed" in status, status
        ko = modprobe_path()
        assert ko.startswith(f"/lib/modules/{REL}/updates/dkms/azswap.ko"), ko
        sh("modprobe", "azswap")
        assert loaded()
        for _ in range(50):
            if Path("/dev/azswap0").exists():
                break
            time.sleep(0.1)
        assert Path("/dev/azswap0").is_block_device()
        sh("modprobe", "-r", "azswap")
        assert not loaded()
    finally:
        unload()
        sh(PKG / "dkms-install.sh", "--uninstall", check=False)
    assert modprobe_path() == ""
    assert not list(Path("/usr/src").glob("azswap-*"))
