"""The lab daemon harness's CPU accounting by thread (bench/kit/daemon.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.kit.daemon import DaemonProcess

# A stand-in daemon: one named thread that burns CPU, the main thread asleep.
PROGRAM = """
import threading, time
from controlplane.priority import name_this_thread
def spin():
    name_this_thread("scheduler")
    end = time.thread_time() + 0.6
    while time.thread_time() < end:
        pass
    print("spun", flush=True)
    time.sleep(60)
threading.Thread(target=spin, daemon=True).start()
time.sleep(60)
"""


def test_thread_cpu_seconds_by_name() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "spun"
        d = DaemonProcess.__new__(DaemonProcess)  # the harness's accounting, not its start
        d.proc = proc  # type: ignore[assignment]
        time.sleep(0.05)
        cpu = d.thread_cpu_seconds()
        assert cpu["scheduler"] >= 0.5
        assert cpu["scheduler"] == max(cpu.values())
        assert "exited" in cpu and cpu["exited"] >= 0
        assert sum(cpu.values()) <= d.cpu_seconds() + 0.05
    finally:
        proc.kill()
        proc.wait()
