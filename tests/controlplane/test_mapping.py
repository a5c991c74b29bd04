"""Finding a process's private mapping of a snapshot file (/proc/PID/maps)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from controlplane import errors
from controlplane.mapping import FileMapping, find_mapping, parse_maps

PAGE = 4096


def test_own_private_mapping(tmp_path: Path) -> None:
    f = tmp_path / "snap.mem"
    f.write_bytes(bytes(16 * PAGE))
    with open(f, "r+b") as fh:
        m = mmap.mmap(fh.fileno(), 8 * PAGE, flags=mmap.MAP_PRIVATE, offset=4 * PAGE)
    try:
        got = find_mapping(os.getpid(), f)
        addr = int(next(
            ln.split("-")[0] for ln in Path("/proc/self/maps").read_text().splitlines()
            if ln.endswith(str(f))
        ), 16)
        assert got == FileMapping(addr >> 12, 8, 4)
    finally:
        m.close()
    with pytest.raises(errors.InvalidValue, match="does not map"):
        find_mapping(os.getpid(), f)


def test_shared_mapping_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "snap.mem"
    f.write_bytes(bytes(4 * PAGE))
    with open(f, "r+b") as fh:
        m = mmap.mmap(fh.fileno(), 4 * PAGE, flags=mmap.MAP_SHARED)
    try:
        with pytest.raises(errors.InvalidValue, match="shared"):
            find_mapping(os.getpid(), f)
    finally:
        m.close()


def _fake_proc(tmp_path: Path, f: Path, vmas: list[tuple[str, str, int]]) -> Path:
    """A /proc with process 7 whose maps has ``vmas`` (range, perms, file offset) of ``f``."""
    st = os.stat(f)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True, exist_ok=True)
    lines = [f"{r} {p} {off:08x} {dev} {st.st_ino}  {f}" for r, p, off in vmas]
    lines.append(f"7e0000000000-7e0000001000 rw-p 00000000 {dev} {st.st_ino + 1}  /other")
    (proc / "7" / "maps").write_text("\n".join(lines) + "\n")
    return proc


def test_adjacent_vmas_are_one_range_two_places_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "snap.mem"
    f.write_bytes(bytes(PAGE))
    split = [("7f0000000000-7f0000002000", "rw-p", 0x1000),
             ("7f0000002000-7f0000005000", "r--p", 0x3000)]  # an mprotect split continues it
    got = find_mapping(7, f, proc=_fake_proc(tmp_path, f, split))
    assert got == FileMapping(0x7F0000000, 5, 1)
    apart = [*split, ("7f1000000000-7f1000001000", "rw-p", 0)]
    with pytest.raises(errors.InvalidValue, match="in 2 places"):
        find_mapping(7, f, proc=_fake_proc(tmp_path, f, apart))
    gap = [("7f0000000000-7f0000002000", "rw-p", 0), ("7f0000002000-7f0000003000", "rw-p", 0x5000)]
    with pytest.raises(errors.InvalidValue, match="in 2 places"):
        find_mapping(7, f, proc=_fake_proc(tmp_path, f, gap))
    text = (tmp_path / "proc/7/maps").read_text()
    assert len(parse_maps(text, (0, 0), 0)) == 0
    # by name where device and inode differ (an overlayfs file shows its lower file's)
    assert len(parse_maps(text, (0, 0), 0, str(f))) == 2


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidValue, match="No such file"):
        find_mapping(os.getpid(), tmp_path / "missing")
    f = tmp_path / "snap.mem"
    f.write_bytes(bytes(PAGE))
    with pytest.raises(errors.InvalidValue, match="no process"):
        find_mapping(2**22 + 12345, f)
