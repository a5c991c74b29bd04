#!/usr/bin/env python3
"""Build (and cache) the microVM recorder's guest: a Debian bookworm root on an ext4 disk image.

    vm-tests/microvm/image.py [--cache DIR] [--force]

Steps, each cached under DIR (default vm-tests/out/microvm-cache/, gitignored):
  1. debootstrap --variant=minbase bookworm with python3 + python3-numpy from the Debian mirror this
     machine's apt uses (rootfs-<key>/, keyed by the package list and the mirror);
  2. the agent files (vm-tests/microvm/agent.py and the workloads it builds,
     vm-tests/workloads/mlsandbox.py and codingsandbox.py) copied in, apt caches dropped, then
     `mkfs.ext4 -d` into root-<key>.ext4 (keyed by the rootfs and the agent files' hashes:
     changing the agent rebuilds only the disk image, in seconds);
  3. the kernel is the host's /boot/vmlinuz-<kver>; the initramfs is built here (initrd-<key>.cpio:
     static busybox + the virtio_blk/ext4 modules of that kernel, ~4 MiB uncompressed), not the
     host's 31 MiB Debian initrd, whose bytes would otherwise sit in every guest's free memory;
     its /init loads the modules, mounts /dev/vda read-only and switch_roots to
     /opt/azagent/init.sh (no systemd).

Prints the paths as JSON on stdout. Needs root (debootstrap, mkfs.ext4 -d keeps ownership).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = TOP / "vm-tests" / "out" / "microvm-cache"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-numpy")
AGENT_FILES = {
    HERE / "agent.py": "opt/azagent/agent.py",
    TOP / "vm-tests" / "workloads" / "mlsandbox.py": "opt/azagent/mlsandbox.py",
    TOP / "vm-tests" / "workloads" / "codingsandbox.py": "opt/azagent/codingsandbox.py",
}
INIT_SH = """#!/bin/sh
# PID 1 of the recorder guest: minimal mounts, then the template agent (it never exits).
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs -o size=16m tmp /tmp
export HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 /opt/azagent/agent.py
"""


# Modules the initramfs loads, in dependency order (virtio_blk and ext4 are modules in Debian 6.1;
# virtio_balloon binds only when the recorder gives the guest a balloon device).
INITRD_MODULES = (
    "virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
    "virtio_blk", "virtio_balloon", "crc16", "crc32c_generic", "libcrc32c", "mbcache", "jbd2",
    "ext4",
)
INITRD_INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.list); do insmod /lib/modules/$m.ko || echo "initrd: insmod $m failed"; done
# azagent.report_order=N: the smallest free block the balloon reports (the kernel's default is a
# pageblock, 2 MiB; 6.1 sets it when the balloon registers, so it is written after the insmod).
for w in $(cat /proc/cmdline); do
    case "$w" in
    azagent.report_order=*)
        echo "${w#*=}" > /sys/module/page_reporting/parameters/page_reporting_order ||
            echo "initrd: cannot set page_reporting_order ${w#*=}";;
    esac
done
n=0
while [ ! -b /dev/vda ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
mount -t ext4 -o ro /dev/vda /newroot || { echo "initrd: cannot mount /dev/vda"; exec sh; }
umount /sys /proc
mount --move /dev /newroot/dev
exec switch_root /newroot /opt/azagent/init.sh
"""


@dataclass
class Image:
    kernel: str
    initrd: str
    disk: str
    rootfs: str
    key: str


def log(msg: str) -> None:
    print(f"[microvm-image] {msg}", file=sys.stderr, flush=True)


def debian_mirror(sources: list[Path] | None = None) -> str:
    """The Debian mirror apt uses here (deb822 or one-line sources), default deb.debian.org."""
    if sources is None:
        sources = [Path("/etc/apt/sources.list"),
                   *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for p in sources:
        try:
            text = p.read_text()
        except OSError:
            continue
        blocks = re.split(r"\n\s*\n", text)
        for b in blocks:
            if re.search(rf"^Suites:.*\b{SUITE}\b", b, re.M) and "security" not in b:
                m = re.search(r"^URIs:\s*(\S+)", b, re.M)
                if m and "debian" in m.group(1):
                    return m.group(1)
        for line in text.splitlines():
            m = re.match(rf"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", line)
            if m and "debian" in m.group(1) and "security" not in m.group(1):
                return m.group(1)
    return "http://deb.debian.org/debian"


def kernel_release() -> str:
    out = subprocess.run([str(TOP / "scripts" / "kver")], capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    kernels = sorted(Path("/boot").glob("vmlinuz-6.1*"))
    if not kernels:
        raise SystemExit("microvm image: no /boot/vmlinuz-6.1* (run make setup)")
    return kernels[-1].name.removeprefix("vmlinuz-")


def sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
        h.update(b"\0")
    return h.hexdigest()[:12]


def build_rootfs(cache: Path, mirror: str, force: bool) -> tuple[Path, str]:
    key = sha(SUITE.encode(), mirror.encode(), " ".join(PACKAGES).encode(), b"minbase")
    root = cache / f"rootfs-{key}"
    stamp = cache / f"rootfs-{key}.done"
    if stamp.exists() and not force:
        return root, key
    if root.exists():
        shutil.rmtree(root)
    log(f"debootstrap {SUITE} from {mirror} into {root} (a few minutes, once)")
    subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
         "--exclude=man-db", SUITE, str(root), mirror],
        check=True, stdout=sys.stderr,
    )
    # Keep the image small: no apt lists or caches, no docs.
    for d in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
              "usr/share/locale"):
        p = root / d
        if p.exists():
            shutil.rmtree(p)
            p.mkdir(parents=True)
    stamp.write_text(mirror + "\n")
    return root, key


def build_disk(cache: Path, root: Path, rkey: str, force: bool) -> tuple[Path, str]:
    files = {dst: src.read_bytes() for src, dst in AGENT_FILES.items()}
    key = sha(rkey.encode(), INIT_SH.encode(), *(d.encode() + b for d, b in sorted(files.items())))
    disk = cache / f"root-{key}.ext4"
    if disk.exists() and not force:
        return disk, key
    for dst, data in files.items():
        p = root / dst
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    init = root / "opt/azagent/init.sh"
    init.write_text(INIT_SH)
    init.chmod(0o755)
    # Byte-compile ahead so the read-only guest root need not (and pages match across guests).
    subprocess.run(["chroot", str(root), "python3", "-m", "compileall", "-q", "/opt/azagent"],
                   check=False, stdout=sys.stderr)
    used = int(subprocess.run(["du", "-sm", str(root)], capture_output=True, text=True,
                              check=True).stdout.split()[0])
    size_mb = int(used * 1.25) + 64
    tmp = disk.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    log(f"mkfs.ext4 -d ({used} MiB of files, {size_mb} MiB image)")
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "azroot", "-E", "root_owner=0:0",
                    "-d", str(root), str(tmp), f"{size_mb}M"], check=True, stdout=sys.stderr)
    os.replace(tmp, disk)
    for old in cache.glob("root-*.ext4"):
        if old != disk:
            old.unlink()
    return disk, key


def build_initrd(cache: Path, kver: str, force: bool) -> Path:
    busybox = shutil.which("busybox") or "/bin/busybox"
    paths = []
    for m in INITRD_MODULES:
        out = subprocess.run(["modinfo", "-k", kver, "-n", m], capture_output=True, text=True)
        if out.returncode or not out.stdout.strip():
            raise SystemExit(f"microvm image: module {m} not found for {kver}")
        paths.append(Path(out.stdout.strip()))
    key = sha(kver.encode(), INITRD_INIT.encode(), Path(busybox).read_bytes(),
              *(p.read_bytes() for p in paths))
    initrd = cache / f"initrd-{key}.cpio"
    if initrd.exists() and not force:
        return initrd
    stage = cache / "initrd-stage"
    if stage.exists():
        shutil.rmtree(stage)
    (stage / "bin").mkdir(parents=True)
    (stage / "lib/modules").mkdir(parents=True)
    shutil.copy2(busybox, stage / "bin/busybox")
    for m, p in zip(INITRD_MODULES, paths, strict=True):
        if p.suffix != ".ko":
            raise SystemExit(f"microvm image: {p}: compressed modules are not supported")
        shutil.copy2(p, stage / "lib/modules" / f"{m}.ko")
    (stage / "modules.list").write_text("\n".join(INITRD_MODULES) + "\n")
    init = stage / "init"
    init.write_text(INITRD_INIT)
    init.chmod(0o755)
    files = sorted(str(p.relative_to(stage)) for p in stage.rglob("*"))
    tmp = initrd.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        subprocess.run(["cpio", "-o", "-H", "newc", "--quiet", "-R", "0:0"], cwd=stage,
                       input="\n".join(files).encode(), stdout=f, check=True)
    os.replace(tmp, initrd)
    shutil.rmtree(stage)
    for old in cache.glob("initrd-*.cpio"):
        if old != initrd:
            old.unlink()
    return initrd


def build(cache: Path = CACHE, force: bool = False) -> Image:
    cache.mkdir(parents=True, exist_ok=True)
    kver = kernel_release()
    kernel = Path(f"/boot/vmlinuz-{kver}")
    if not kernel.exists():
        raise SystemExit(f"microvm image: {kernel} missing (install linux-image-amd64 through apt)")
    initrd = build_initrd(cache, kver, force)
    root, rkey = build_rootfs(cache, debian_mirror(), force)
    disk, dkey = build_disk(cache, root, rkey, force)
    key = sha(dkey.encode(), initrd.name.encode())
    return Image(str(kernel), str(initrd), str(disk), str(root), key)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--force", action="store_true", help="rebuild everything")
    a = ap.parse_args()
    print(json.dumps(asdict(build(a.cache, a.force)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
