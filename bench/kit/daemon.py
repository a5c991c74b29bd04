"""The shipped daemon as the lab runs it: `azctl --socket S --state-dir D daemon ARGS...` as a
subprocess, its log in a file, ready once it answers `ping` (and, when asked, once its
prefetcher's fault tracer is attached: BPF compiles in tens of seconds under TCG)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def ready_timeout_s() -> float:
    """How long a daemon may take to come up: 400 s, three times that on the debug-kernel tier
    (AZSWAP_DEBUG_KERNEL=1), where KASAN and lockdep slow the BPF compile and load several-fold
    and a second guest may share the host."""
    return 1200.0 if os.environ.get("AZSWAP_DEBUG_KERNEL") == "1" else 400.0


class DaemonError(RuntimeError):
    """The daemon did not start, died, or did not stop: the message has its log's tail."""


def azctl() -> list[str]:
    """The azctl of the running Python's environment."""
    exe = Path(sys.executable).parent / "azctl"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "from azctl.main import main; main()"]


class DaemonProcess:
    """One daemon; ``run_dir`` holds its socket and state (a new temporary one by default),
    ``log_path`` its stderr (default: ``run_dir/daemon.log``)."""

    def __init__(self, *args: str, run_dir: Path | None = None,
                 log_path: Path | None = None) -> None:
        self.dir = run_dir or Path(tempfile.mkdtemp(prefix="azswap-daemon-"))
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.socket = self.dir / "azswap.sock"
        self.log_path = log_path or self.dir / "daemon.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("a")
        cmd = [*azctl(), "--socket", str(self.socket), "--state-dir", str(self.dir),
               "daemon", "--log-level", "info", *args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=self._log)
        self.ready_s = 0.0

    def log_tail(self, n: int = 40) -> str:
        if not self._log.closed:
            self._log.flush()
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def check(self) -> None:
        rc = self.proc.poll()
        if rc is not None:
            raise DaemonError(f"the daemon exited with status {rc}:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """User + system CPU time the daemon (all its threads) has used so far."""
        _, ticks = _stat_cpu(Path(f"/proc/{self.proc.pid}/stat").read_text())
        return round(ticks / os.sysconf("SC_CLK_TCK"), 2)

    def thread_cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) by thread name (the daemon names its threads in the kernel),
        summed over the threads alive now; "exited" is what threads that ended used."""
        tck = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                comm, ticks = _stat_cpu((task / "stat").read_text())
            except OSError:
                continue  # ended meanwhile
            out[comm] = out.get(comm, 0.0) + ticks / tck
        out["exited"] = max(0.0, self.cpu_seconds() - sum(out.values()))
        return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}

    def client(self, timeout: float = 30.0) -> Any:
        from controlplane.client import DaemonClient

        return DaemonClient(self.socket, timeout=timeout)

    def wait_ready(self, timeout: float | None = None, tracing: bool = False) -> dict[str, Any]:
        """Ping until the daemon answers (a cold Python start over 9p under TCG takes tens of
        seconds); with ``tracing``, also until its prefetcher learns from fault events (a
        prefetcher that cannot is an error, with the reason it gives). ``timeout`` defaults to
        ``ready_timeout_s()``."""
        timeout = ready_timeout_s() if timeout is None else timeout
        t0 = time.monotonic()
        last = ""
        while time.monotonic() - t0 < timeout:
            self.check()
            try:
                with self.client(timeout=10) as c:
                    reply: dict[str, Any] = c.ping()
            except Exception as e:  # not listening yet
                last = str(e)
                time.sleep(0.2)
                continue
            state = str(reply.get("prefetch", ""))
            if not tracing or state == "tracing":
                self.ready_s = time.monotonic() - t0
                return reply
            if state not in ("tracer starting", "ready"):
                raise DaemonError(f"the daemon's prefetcher does not trace: {state}\n"
                                  f"{self.log_tail()}")
            last = f"prefetcher: {state}"
            time.sleep(0.5)
        raise DaemonError(f"the daemon was not ready within {timeout:.0f}s ({last}):\n"
                          f"{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; the exit status (a daemon that had died raises)."""
        try:
            self.check()
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise DaemonError(f"the daemon did not stop within {timeout:.0f}s of SIGTERM:\n"
                                  f"{self.log_tail()}") from None
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(DaemonError):
                self.stop()
        if not self._log.closed:
            self._log.close()


def _stat_cpu(stat: str) -> tuple[str, int]:
    """(comm, utime + stime in clock ticks) of a /proc/PID[/task/TID]/stat line (the name may
    hold spaces and parentheses: the fields start after its last ")")."""
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat.rsplit(")", 1)[1].split()
    return comm, int(fields[11]) + int(fields[12])
