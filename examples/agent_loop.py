"""An agent loop that tells azswap when each sandbox waits for the LLM.

    sudo .venv/bin/python examples/agent_loop.py --cgroup /sandboxes/sb1 --cgroup /sandboxes/sb2 \\
        --steps 3 --llm-seconds 5 --tool 'python3 -c "print(sum(range(10**6)))"'

Each sandbox is a memory cgroup (made by your runtime: runc, Firecracker's jailer, systemd-run
--scope ...).  The loop registers the sandboxes with the azswap daemon (`azctl daemon`, socket
/run/azswap/azswap.sock), then for every step of every sandbox:

    llm-wait hint  -> the daemon compresses the sandbox while the model thinks, at once, down
                      to the working set its tools use (that too if the wait lasts; an
                      orchestrator that streams the model's answer sends `ending` as the
                      tool call starts, and the daemon brings it back before the tool)
    the LLM call   -> here a sleep of --llm-seconds; yours is a request to a model server
    tool hint      -> compression stops at once; the tool faults back what it touches that
                      went
    the tool call  -> here --tool run inside the sandbox's cgroup

and unregisters them at the end, also on errors and Ctrl-C.  Orchestrators copy the
`waiting_for_llm` context manager: it is the whole integration on the host.  Inside the
sandbox, a long-lived tool runtime (a REPL, a Jupyter kernel, a tool server) adds the trim step:
it calls `controlplane.trim.trim()` after each tool call, before the result goes back and the
llm-wait hint is sent, so the heap memory the call freed is returned instead of compressed
(docs/daemon-protocol.md, "Trim step").  The tools here are short-lived commands: nothing to
trim.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controlplane.client import DaemonClient
from controlplane.errors import AzswapError

CGROUP_ROOT = Path("/sys/fs/cgroup")


@contextlib.contextmanager
def waiting_for_llm(az: DaemonClient, sandbox: str) -> Iterator[None]:
    """Around every LLM call: compress while waiting, restore before the tool runs."""
    az.phase(sandbox, "llm-wait")
    try:
        yield
    finally:
        az.phase(sandbox, "tool")


def run_in_cgroup(cgroup: str, command: str) -> str:
    """Run a shell command as a member of the sandbox's cgroup (root needed)."""
    procs = CGROUP_ROOT / cgroup.lstrip("/") / "cgroup.procs"

    def join() -> None:
        procs.write_text("0")  # "0": the writing process itself, before exec

    out = subprocess.run(["sh", "-c", command], preexec_fn=join, capture_output=True, text=True)
    return out.stdout.strip()


def agent_loop(
    az: DaemonClient,
    cgroups: list[str],
    steps: int,
    call_llm: Callable[[str, int], str],
    run_tool: Callable[[str, str], str],
    group: int = 1,
) -> list[str]:
    names = [Path(c).name for c in cgroups]
    for name, cg in zip(names, cgroups, strict=True):
        az.register(name, cgroup=cg, group=group)
    results = []
    try:
        for step in range(steps):
            for name, cg in zip(names, cgroups, strict=True):
                with waiting_for_llm(az, name):
                    action = call_llm(name, step)
                results.append(run_tool(cg, action))
    finally:
        for name in names:
            with contextlib.suppress(AzswapError):
                az.unregister(name)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--cgroup", action="append", required=True,
                    help="a sandbox's cgroup, relative to /sys/fs/cgroup (repeat)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--group", type=int, default=1, help="trust group of these sandboxes")
    ap.add_argument("--llm-seconds", type=float, default=5.0, help="how long the fake LLM takes")
    ap.add_argument("--tool", default="true", help="shell command each tool call runs")
    ap.add_argument("--socket", default=None, help="daemon socket (default: the daemon's)")
    a = ap.parse_args(argv)

    def call_llm(sandbox: str, step: int) -> str:
        time.sleep(a.llm_seconds)  # replace with your model call
        return a.tool

    try:
        with DaemonClient(a.socket) as az:
            for line in agent_loop(az, a.cgroup, a.steps, call_llm, run_in_cgroup, a.group):
                print(line)
    except AzswapError as e:
        print(f"agent_loop: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
