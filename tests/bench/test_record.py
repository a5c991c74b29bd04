"""bench.record: style names, and a coding-agent fleet recorded on the host (two tiny forked
sandboxes): every process is in the trace, the sandboxes own pages of their own, the meta says
which workload made it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.record import STYLES, run_and_record, split_style
from controlplane.trace import ROLE_SANDBOX, ROLE_TEMPLATE, read_trace


def test_style_names() -> None:
    assert split_style("fork") == ("ml", "fork")
    assert split_style("coding-fresh-aslr") == ("coding", "fresh-aslr")
    assert {split_style(s)[0] for s in STYLES} == {"ml", "coding"}
    for bad in ("coding-", "coding-fork-x", "forks", ""):
        with pytest.raises(ValueError, match="unknown style"):
            split_style(bad)


def test_coding_fleet_recorded(tmp_path: Path) -> None:
    out = tmp_path / "c.aztrace"
    run_and_record("coding-fork", 2, "tiny", 1, str(out), log=lambda *_: None)
    tr = read_trace(out)
    assert tr.meta["style"] == "coding-fork" and tr.meta["workload"] == "coding"
    roles = sorted(o.role for o in tr.owners.values())
    assert roles == sorted([ROLE_TEMPLATE, ROLE_SANDBOX, ROLE_SANDBOX])
    tasks = {o.info["task"] for o in tr.owners.values() if o.role == ROLE_SANDBOX}
    assert tasks == {"parse", "search"}  # round robin over codingsandbox.TASKS
    for o in tr.owners.values():
        assert o.nr_pages > 0, o.name
