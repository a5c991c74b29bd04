"""bench.faultcost's arithmetic, table and populate step on the host (its passes need a guest)."""

from __future__ import annotations

import pytest

from bench import faultcost
from bench.pagesandbox import PageSandbox


def test_a_fault_is_what_the_swapped_pass_took_beyond_the_resident_one() -> None:
    pp = faultcost.per_page(0.2, 0.6, 4000, 0.3, 3000)
    assert pp["fault_us"] == pytest.approx(100.0)
    assert pp["populate_us"] == pytest.approx(100.0)


def test_the_table_gives_min_median_max_over_the_runs() -> None:
    runs = [{"fault_us": f, "populate_us": p} for f, p in ((60, 40), (80, 50), (70, 45))]
    lines = faultcost.summary([{"system": "azswap-lz4", "runs": runs, "bad_pages": 0}])
    assert lines[2] == "| azswap-lz4 | 60 / 70 / 80 | 40 / 45 / 50 | 0 |"


def test_populate_reads_every_page_of_the_sandbox() -> None:
    sb = PageSandbox(None, 40, 3, style="coding")
    try:
        seconds, done = faultcost.populate(sb, 40)
        assert done == 40 and seconds >= 0
        assert sb.verify() == 0
    finally:
        sb.stop()


@pytest.mark.parametrize("argv", [["--pages", "0"], ["--repeat", "0"], ["--style", "nosuch"]])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        faultcost.main(argv)
    assert e.value.code == 2
