"""Where a process maps a snapshot file privately, read from ``/proc/PID/maps``.

A microVM's VMM (Firecracker) maps the snapshot's memory file ``MAP_PRIVATE`` as guest RAM. On
kernels that index a copied-on-write page by its virtual page number (GET_INFO ``COW_INDEX`` 1)
the module needs that range to find the template base of an edited page: SANDBOX_MAP takes it
as (first virtual page, pages, first file page).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from controlplane import errors

PAGE_SHIFT = 12


@dataclass(frozen=True)
class FileMapping:
    start: int  # first virtual page number (address >> 12)
    pages: int
    pgoff: int  # file page offset of the first page

    def to_dict(self) -> dict[str, int]:
        return {"start": self.start, "pages": self.pages, "pgoff": self.pgoff}


def parse_maps(
    text: str, dev: tuple[int, int], ino: int, path: str = ""
) -> list[tuple[int, int, int, str]]:
    """(start, end, file offset, perms) of every VMA of the file ``dev``/``ino`` in ``text``, or
    named ``path`` (an overlayfs file shows its lower file's device and inode there)."""
    out = []
    for line in text.splitlines():
        f = line.split(maxsplit=5)
        if len(f) < 5:
            continue
        major, minor = (int(x, 16) for x in f[3].split(":"))
        same = (major, minor) == dev and int(f[4]) == ino
        if not same and not (path and len(f) == 6 and f[5] == path):
            continue
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        out.append((lo, hi, int(f[2], 16), f[1]))
    return out


def find_mapping(pid: int, path: str | os.PathLike[str], proc: Path = Path("/proc")) -> FileMapping:
    """The one private range in which process ``pid`` maps ``path`` (adjacent VMAs that continue
    the file are one range). Errors name the process and the file."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise errors.InvalidValue(f"{path}: {e.strerror}") from None
    try:
        text = (proc / str(pid) / "maps").read_text()
    except FileNotFoundError:
        raise errors.InvalidValue(f"no process {pid}") from None
    except PermissionError:
        raise errors.PermissionDenied(f"cannot read /proc/{pid}/maps (needs root)") from None
    vmas = parse_maps(
        text, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino, os.path.realpath(path)
    )
    if not vmas:
        raise errors.InvalidValue(f"process {pid} does not map {path}")
    shared = [v for v in vmas if v[3][3] != "p"]
    if shared:
        raise errors.InvalidValue(
            f"process {pid} maps {path} shared at {shared[0][0]:#x}: only a private mapping "
            "(MAP_PRIVATE) has copied-on-write pages"
        )
    vmas.sort()
    ranges: list[list[int]] = []  # [start, end, offset]
    for lo, hi, off, _ in vmas:
        last = ranges[-1] if ranges else None
        if last and last[1] == lo and last[2] + (lo - last[0]) == off:
            last[1] = hi
        else:
            ranges.append([lo, hi, off])
    if len(ranges) > 1:
        where = ", ".join(f"{r[0]:#x}" for r in ranges)
        raise errors.InvalidValue(
            f"process {pid} maps {path} in {len(ranges)} places ({where}): a sandbox has one range"
        )
    lo, hi, off = ranges[0]
    return FileMapping(lo >> PAGE_SHIFT, (hi - lo) >> PAGE_SHIFT, off >> PAGE_SHIFT)
