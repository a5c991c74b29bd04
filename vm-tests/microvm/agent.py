"""Template agent: PID 1 of the microVM recorder guest (runs under the guest's python3).

Builds the sandbox state of its workload (``azagent.workload``): ``ml``, the state of
vm-tests/workloads/mlsandbox.py (a transformer's weights and Adam state, a tokenized dataset, a
tokenizer, documents and example records, a warmed interpreter), or ``coding``, the state of
vm-tests/workloads/codingsandbox.py (the guest's Python standard library sources as a checkout,
their symbol index and ASTs, an sqlite database, a tool-call history, a warmed interpreter);
freezes it (gc.freeze, as a zygote), reports TEMPLATE_READY on the control port (/dev/ttyS1) and
blocks there: the quiescent point the recorder snapshots. Each guest restored from the snapshot
receives one line ``TASK <name> <seed> [inproc|fork|worker]``, runs that trajectory, reports
``LLM_WAIT`` and blocks again (waiting for the LLM's answer, which never comes): the recorder saves
its RAM then. ``inproc`` (default) runs the task in the agent process; ``fork`` runs it as a tool
call does in most agent sandboxes: in a child process (forked from the warmed agent, so the child
starts with the template's heap), which returns a short result over a pipe and exits before the
LLM wait; ``worker`` runs it in such a child that stays alive at the LLM wait, as a persistent
tool process does (a code interpreter's kernel): its copy-on-write pages stay in use.

Kernel command line: azagent.workload=ml|coding (default ml) azagent.size=<the workload's size>
azagent.seed=<n>. Messages on the control port are single lines; logs go to the console.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import time
import tty
from types import ModuleType

CTRL = "/dev/ttyS1"
WORKLOADS = {"ml": "mlsandbox", "coding": "codingsandbox"}  # azagent.workload -> its module


def log(msg: str) -> None:
    print(f"[azagent] {msg}", file=sys.stderr, flush=True)


def cmdline() -> dict[str, str]:
    with open("/proc/cmdline") as f:
        words = f.read().split()
    out: dict[str, str] = {}
    for w in words:
        if w.startswith("azagent.") and "=" in w:
            k, v = w.split("=", 1)
            out[k.removeprefix("azagent.")] = v
    return out


class Port:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        tty.setraw(self.fd)
        self.buf = b""

    def send(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\n")

    def recv(self) -> str:
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 256)
            if chunk:
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace").strip()


def workload(name: str) -> ModuleType:
    """The module of workload @name (WORKLOADS): build_state(seed, size) and TASK_FNS."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r} (one of {', '.join(WORKLOADS)})")
    return importlib.import_module(WORKLOADS[name])


def run_task(wl: ModuleType, st: object, task: str, seed: int) -> None:
    """One task of workload @wl (mlsandbox.run_task runs every workload's tasks)."""
    import mlsandbox

    mlsandbox.run_task(st, task, seed, fns=wl.TASK_FNS)


def tool_call(wl: ModuleType, st: object, task: str, seed: int, stay: bool = False) -> None:
    """Run the task in a forked child (a tool call); it reports a one-line result and exits, or
    with @stay blocks (a persistent tool process, idle while the agent waits for the LLM)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            run_task(wl, st, task, seed)
            os.write(w, f"ok {task}\n".encode())
            os.close(w)
            code = 0
            while stay:  # the next tool call never comes
                time.sleep(3600)
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        result = f.read().strip()
    if not stay:
        _, status = os.waitpid(pid, 0)
    else:
        status = 0 if os.waitpid(pid, os.WNOHANG) == (0, 0) else -1
    if status != 0 or not result.startswith("ok"):
        raise RuntimeError(f"tool call {task} failed (status {status})")


def main() -> None:
    args = cmdline()
    size = args.get("size", "default")
    seed = int(args.get("seed", "1"))
    name = args.get("workload", "ml")
    port = Port(CTRL)
    port.send(f"BOOTED {time.monotonic():.2f}")
    sys.path.insert(0, "/opt/azagent")
    t0 = time.monotonic()
    wl = workload(name)
    st = wl.build_state(seed, size)
    gc.collect()
    gc.freeze()
    built = time.monotonic() - t0
    log(f"template state built in {built:.1f}s (workload {name}, size {size}, seed {seed})")
    port.send(f"TEMPLATE_READY {built:.2f}")
    while True:
        line = port.recv()
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "TASK" and len(parts) in (3, 4) and parts[1] in wl.TASK_FNS:
            mode = parts[3] if len(parts) == 4 else "inproc"
            t1 = time.monotonic()
            try:
                if mode in ("fork", "worker"):
                    tool_call(wl, st, parts[1], int(parts[2]), stay=mode == "worker")
                else:
                    run_task(wl, st, parts[1], int(parts[2]))
            except Exception as exc:  # report, keep the guest alive for the recorder
                port.send(f"ERROR {type(exc).__name__}: {exc}")
                continue
            port.send(f"LLM_WAIT {parts[1]} {time.monotonic() - t1:.2f}")
        elif parts[0] == "PING":
            port.send("PONG")
        else:
            port.send(f"ERROR unknown command {line!r}")


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # PID 1 must not exit: report and hang
        log(f"agent failed: {exc!r}")
        while True:
            time.sleep(3600)
