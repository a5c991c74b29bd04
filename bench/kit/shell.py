"""Commands, log lines and kernel files, the same way everywhere in the lab."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, output captured; with ``check`` a non-zero exit raises OSError naming the
    command and its stderr."""
    r = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if check and r.returncode:
        raise OSError(f"{' '.join(cmd)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r


def logger(name: str) -> Callable[[str], None]:
    """A ``log(msg)`` printing ``[name HH:MM:SS] msg``, flushed (guest output streams)."""

    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    return log


def write(path: str | os.PathLike[str], value: str | int) -> None:
    """Write a sysfs/procfs/cgroupfs file with one write(2) (errors raise OSError)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def read(path: str | os.PathLike[str]) -> str:
    return Path(path).read_text().strip()
