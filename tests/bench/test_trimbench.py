"""bench.trimbench on two small fork sandboxes: the trim step shrinks what they own, both
recordings replay and verify, and the table reports what was measured."""

from __future__ import annotations

from pathlib import Path

from bench import trimbench


def test_trim_step_measured_apart_from_compression(tmp_path: Path) -> None:
    row = trimbench.measure("fork", 2, "small", 1, tmp_path, log=lambda *_: None)
    plain, trim = row["plain"], row["trim"]
    assert plain["sandbox_bytes"] > 0 and trim["sandbox_bytes"] > 0
    # the sandboxes free memory after their task: trimming gives some of it back
    assert trim["sandbox_bytes"] < plain["sandbox_bytes"]
    assert row["trim_alone"] == plain["sandbox_bytes"] / trim["sandbox_bytes"]
    for s in trimbench.STRATEGIES:
        assert plain["strategies"][s]["held_bytes"] > 0
        assert row["with_compression"][s] == (
            plain["strategies"][s]["held_bytes"] / trim["strategies"][s]["held_bytes"]
        )
    lines = trimbench.table([row])
    assert lines[2].startswith("| fork | ") and f"{row['trim_alone']:.2f}x" in lines[2]
