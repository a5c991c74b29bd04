"""pytest plugin loaded inside the guest (``-p guest_report``): one JSON line per test outcome
and its wall time (``seconds``: setup, call and teardown).

The host side (vm-tests/conftest.py) names the file in $AZSWAP_RESULTS (one per host session, so
sessions running at once keep apart; default $AZSWAP_OUT/guest-results.jsonl), reads it and
reports each guest test under its own node id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

_OUT = Path(os.environ.get("AZSWAP_RESULTS")
             or Path(os.environ.get("AZSWAP_OUT", "vm-tests/out")) / "guest-results.jsonl")
_seen: dict[str, dict[str, str | float]] = {}


def _write(rec: dict[str, str | float]) -> None:
    with _OUT.open("a") as f:
        f.write(json.dumps(rec) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    rec = _seen.setdefault(
        report.nodeid, {"nodeid": report.nodeid, "outcome": "passed", "seconds": 0.0}
    )
    rec["seconds"] = round(float(rec["seconds"]) + report.duration, 2)  # setup + call + teardown
    if report.skipped and rec["outcome"] == "passed":
        rec["outcome"] = "skipped"
        longrepr = report.longrepr
        rec["reason"] = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    elif report.failed:
        rec["outcome"] = "failed" if report.when == "call" else f"error in {report.when}"
        rec["longrepr"] = str(report.longrepr)
    if report.when == "teardown":
        _write(_seen.pop(report.nodeid))
