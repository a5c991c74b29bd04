"""Host side of the in-guest test suite: one pytest session for host and guest tests.

Tests under vm-tests/guest/ are ordinary pytest files that must run as root inside the test
kernel.  On the host this plugin collects them (their names come from a host-side
``pytest --collect-only`` of those files), and the first guest test that runs boots the test
kernel ONCE through vm-tests/run, runs every selected guest test inside, and hands each host item
the outcome its twin had in the guest (pass, fail with the guest's traceback, skip with reason).
One more item, ``vm-tests/run::guest kernel run``, runs last and fails whenever vm-tests/run exited
non-zero (a kernel splat, a panic, a timeout, the guest's pytest failing), even when every guest
test wrote a passing result; its report gives vm-tests/run's reason and the splat.

Inside the guest (AZSWAP_IN_GUEST=1) and in the collect-only subprocess (AZSWAP_GUEST_COLLECT=1)
this plugin stays out of the way and pytest collects the files normally.

Environment: AZSWAP_KERNEL (the series to boot: 6.1, the default, 6.12 or 7.3; read by
vm-tests/run), AZSWAP_VM_MEMORY (default 2G), AZSWAP_VM_CPUS (2), AZSWAP_VM_TIMEOUT (seconds, 2400),
AZSWAP_VM_ARGS (more vm-tests/run options, split like a shell would: "--debug-kernel" runs the
guest tests on the debug-kernel tier, which is what `make test-debug` does).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parent.parent
GUEST_DIR = Path(__file__).resolve().parent / "guest"
OUT = TOP / "vm-tests" / "out"
ACTIVE = not (os.environ.get("AZSWAP_IN_GUEST") or os.environ.get("AZSWAP_GUEST_COLLECT"))


def _is_guest_file(path: Path) -> bool:
    return path.name.startswith("test_") and path.suffix == ".py" and GUEST_DIR in path.parents


def _rel(path: Path) -> str:
    return str(path.resolve().relative_to(TOP))


@dataclass
class GuestRun:
    """The one VM run shared by all guest items of this session."""

    results: dict[str, dict[str, str]] = field(default_factory=dict)
    done: bool = False
    rc: int | None = None
    console_tail: str = ""
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0


_RUN_KEY = pytest.StashKey[GuestRun]()
_COLLECTED_KEY = pytest.StashKey[dict[str, list[str]]]()


def _host_collect(config: pytest.Config) -> dict[str, list[str]]:
    """Node ids of every guest test, grouped by file, from one host-side collect-only pass."""
    cached = config.stash.get(_COLLECTED_KEY, None)
    if cached is not None:
        return cached
    env = dict(os.environ, AZSWAP_GUEST_COLLECT="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         _rel(GUEST_DIR)],
        cwd=TOP, env=env, capture_output=True, text=True,
    )
    by_file: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        if "::" in line and line.startswith(_rel(GUEST_DIR)):
            by_file.setdefault(line.split("::", 1)[0], []).append(line.strip())
    if proc.returncode not in (0, 5):
        raise pytest.UsageError(
            f"collecting guest tests failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    config.stash[_COLLECTED_KEY] = by_file
    return by_file


def _run_guest(session: pytest.Session) -> GuestRun:
    run = session.config.stash.setdefault(_RUN_KEY, GuestRun())
    if run.done:
        return run
    run.done = True
    nodeids = [it.nodeid for it in session.items if isinstance(it, GuestItem)]
    OUT.mkdir(parents=True, exist_ok=True)
    # Per session: two sessions at once (another series, the debug tier) must not read each
    # other's results or console.
    variant = "debug" if "--debug-kernel" in os.environ.get("AZSWAP_VM_ARGS", "") else (
        os.environ.get("AZSWAP_KERNEL") or "")
    suffix = f"-{variant}" if variant else ""
    results_file = OUT / f"guest-results{suffix}-{os.getpid()}.jsonl"
    results_file.unlink(missing_ok=True)
    log_file = OUT / f"guest-console{suffix}.log"
    memory = os.environ.get("AZSWAP_VM_MEMORY", "2G")
    cpus = os.environ.get("AZSWAP_VM_CPUS", "2")
    timeout = os.environ.get("AZSWAP_VM_TIMEOUT", "2400")
    cmd = [
        str(TOP / "vm-tests" / "run"), "--memory", memory, "--cpus", cpus, "--timeout", timeout,
        *shlex.split(os.environ.get("AZSWAP_VM_ARGS", "")),
        "--", "env", f"PYTHONPATH={TOP / 'vm-tests'}", f"AZSWAP_RESULTS={results_file}",
        sys.executable, "-m", "pytest",
        "-p", "no:cacheprovider", "-p", "guest_report", "-v", "-rs", *nodeids,
    ]
    tw = session.config.get_terminal_writer()
    capman = session.config.pluginmanager.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled():
        tw.line()
        series = os.environ.get("AZSWAP_KERNEL") or "6.1"
        tw.line(f"vm-tests: booting the test kernel ({series}) for {len(nodeids)} guest tests "
                f"(console log: {_rel(log_file)})", bold=True)
    start = time.monotonic()
    with log_file.open("w") as log:
        proc = subprocess.run(cmd, cwd=TOP, stdout=log, stderr=subprocess.STDOUT, text=True)
    run.seconds = time.monotonic() - start
    run.rc = proc.returncode
    text = log_file.read_text(errors="replace")
    run.console_tail = "\n".join(text.splitlines()[-60:])
    run.reasons = [ln for ln in text.splitlines() if ln.startswith("vm-tests/run: ")]
    if results_file.exists():
        for line in results_file.read_text().splitlines():
            rec = json.loads(line)
            run.results[rec["nodeid"]] = rec
        results_file.unlink()
    with capman.global_and_fixture_disabled():
        tw.line(f"vm-tests: guest run finished in {run.seconds:.0f}s, exit {run.rc}, "
                f"{len(run.results)} results", bold=True)
        slow = sorted(run.results.values(), key=lambda r: -float(r.get("seconds", 0)))[:8]
        if slow:
            tw.line("vm-tests: slowest guest tests: " + ", ".join(
                f"{r['nodeid'].split('/')[-1]} {float(r.get('seconds', 0)):.0f}s" for r in slow))
    return run


class GuestFailure(Exception):
    """A guest test failed; carries the guest's own report."""


class GuestItem(pytest.Item):
    def runtest(self) -> None:
        run = _run_guest(self.session)
        rec = run.results.get(self.nodeid)
        if rec is None:
            raise GuestFailure(
                f"no result from the guest for {self.nodeid} (vm-tests/run exit {run.rc} after "
                f"{run.seconds:.0f}s); console tail:\n{run.console_tail}"
            )
        if rec["outcome"] == "skipped":
            pytest.skip(f"[guest] {rec.get('reason', '')}")
        if rec["outcome"] != "passed":
            raise GuestFailure(f"[guest] {rec['outcome']}:\n{rec.get('longrepr', '')}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:
        if isinstance(excinfo.value, GuestFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"[guest] {self.name}"


class GuestRunItem(pytest.Item):
    """The guest kernel run itself: passes only when vm-tests/run exited 0."""

    def runtest(self) -> None:
        run = _run_guest(self.session)
        if run.rc != 0:
            raise GuestFailure(_run_failure(run))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:
        if isinstance(excinfo.value, GuestFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, "guest kernel run"


def _run_failure(run: GuestRun) -> str:
    """Why the run failed: vm-tests/run's own reason lines, the splat from the kernel log it
    saved, then the console tail."""
    failed = [n for n, r in run.results.items() if r["outcome"] != "passed"
              and r["outcome"] != "skipped"]
    why = run.reasons or [
        f"the guest command exited {run.rc}"
        + (f" ({len(failed)} guest tests failed, reported above)" if failed else "")
    ]
    out = [f"vm-tests/run exited {run.rc} after {run.seconds:.0f}s", *why]
    dmesg = OUT / "last-dmesg.txt"
    quoted = [r.split("kernel splat in dmesg: ", 1)[1].rsplit(" (full log:", 1)[0]
              for r in run.reasons if "kernel splat in dmesg: " in r]
    if quoted and dmesg.exists():
        klog = dmesg.read_text(errors="replace").splitlines()
        first = next((i for i, ln in enumerate(klog) if quoted[0] in ln), 0)
        out += [f"--- the splat ({_rel(dmesg)}) ---", *klog[max(0, first - 5) : first + 40]]
    out += ["--- console tail ---", run.console_tail]
    return "\n".join(out)


class GuestModule(pytest.File):
    def collect(self):
        for nodeid in _host_collect(self.config).get(_rel(self.path), []):
            yield GuestItem.from_parent(self, name=nodeid.split("::", 1)[1])


if ACTIVE:

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """After selection (-k, -m): with any guest test left, the run itself is one more item,
        the last one."""
        if any(isinstance(it, GuestItem) for it in items):
            items.append(GuestRunItem.from_parent(
                session, name="guest kernel run", path=TOP / "vm-tests" / "run",
                nodeid="vm-tests/run::guest kernel run",
            ))

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
        if _is_guest_file(Path(module_path)):
            return GuestModule.from_parent(parent, path=Path(module_path))
        return None
