"""Commands, log lines and kernel files, the same way everywhere in the lab."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, output captured; with ``check`` a non-zero exit raises OSError naming the
    command and its stderr."""
    r = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if check and r.returncode:
        raise OSError(f"{' '.join(cmd)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r


class Logger:
    """``log(msg)`` prints ``[name HH:MM:SS] msg``, flushed (guest output streams to the host);
    with ``file`` set, the line is appended there too (progress readable while a guest runs)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.file: Path | None = None

    def __call__(self, msg: str) -> None:
        line = f"[{self.name} {time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if self.file is not None:
            with open(self.file, "a") as f:
                f.write(line + "\n")


def logger(name: str) -> Logger:
    return Logger(name)


def write(path: str | os.PathLike[str], value: str | int) -> None:
    """Write a sysfs/procfs/cgroupfs file with one write(2) (errors raise OSError)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def read(path: str | os.PathLike[str]) -> str:
    return Path(path).read_text().strip()
