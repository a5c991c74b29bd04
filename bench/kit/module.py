"""azswap.ko in the test guest: load it with parameters, unload it, and the swap around it."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

from bench.kit.shell import sh

TOP = Path(__file__).resolve().parents[2]
KO = TOP / "kmod" / "azswap.ko"
# The debug build (make kmod-debug): the same module with the core's self-test.
KO_DEBUG = TOP / "build" / "kmod-debug" / "kmod" / "azswap.ko"
DEPS = ("zsmalloc", "lz4_decompress", "zstd_compress", "zstd_decompress")
ZSWAP_ENABLED = Path("/sys/module/zswap/parameters/enabled")


def loaded() -> bool:
    return Path("/sys/module/azswap").exists()


def insmod(ko: Path = KO, **params: object) -> None:
    """insmod ``ko`` (kmod/azswap.ko, or KO_DEBUG) with ``params``; raises OSError with the
    reason when it fails."""
    if not ko.exists():
        raise OSError(f"{ko} missing: build it on the host first (make kmod / make kmod-debug)")
    for m in DEPS:
        sh("modprobe", m, check=False)  # built in on some kernels: insmod says what is missing
    args = [f"{k}={v}" for k, v in params.items()]
    r = sh("insmod", str(ko), *args, check=False)
    if r.returncode:
        raise OSError(f"insmod azswap.ko {' '.join(args)} failed: {r.stderr.strip()}")


def swap_cache() -> bool:
    """Was the loaded module given swap_cache=1 (docs/sysfs-abi.md)?  False when not loaded."""
    p = Path("/sys/module/azswap/parameters/swap_cache")
    return p.exists() and p.read_text().strip() == "Y"


def rmmod(check: bool = True, settle: bool = True) -> subprocess.CompletedProcess[str]:
    """rmmod azswap. A new block device is probed by udev (blkid opens it, which holds a module
    reference for a moment), so with @settle "in use" is retried for up to 5 s after udev
    settles; a reference that stays (a leak) still fails."""
    r = sh("rmmod", "azswap", check=False)
    deadline = time.monotonic() + (5 if settle else 0)
    while r.returncode and "in use" in (r.stderr or "") and time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            sh("udevadm", "settle", "--timeout=2", check=False)
        time.sleep(0.1)
        r = sh("rmmod", "azswap", check=False)
    if check and r.returncode:
        raise OSError(f"rmmod azswap: exit {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r


def disable_zswap() -> None:
    """zswap off: it would take the pages before the swap device under test sees them."""
    if ZSWAP_ENABLED.exists() and ZSWAP_ENABLED.read_text().strip() != "N":
        ZSWAP_ENABLED.write_text("N")


def swaps() -> list[str]:
    """The active swap devices (/proc/swaps)."""
    return [ln.split()[0] for ln in Path("/proc/swaps").read_text().splitlines()[1:]]


def swapoff_all_azswap() -> None:
    for dev in swaps():
        if "azswap" in dev:
            sh("swapoff", dev, check=False)


def cleanup_module() -> None:
    """Every azswap device off swap, the module unloaded (if it was loaded)."""
    swapoff_all_azswap()
    if loaded():
        rmmod(check=False)
