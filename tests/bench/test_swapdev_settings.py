"""The vm sysctls every benchmarked swap device runs under: the product's swap service's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kit import swapdev
from bench.kit.swapdev import product_vm_settings, vm_settings


def test_the_settings_are_the_shipped_service_s() -> None:
    # packaging/default/azswap as shipped: no readahead, anonymous and file pages alike
    assert product_vm_settings() == {"page-cluster": "0", "swappiness": "100"}


def test_settings_file_syntax(tmp_path: Path) -> None:
    f = tmp_path / "azswap"
    f.write_text('# comment\nDEVICE=azswap0\nPAGE_CLUSTER="1"  # one page more\n'
                 "SWAPPINESS=\nOTHER=5\n")
    # an empty SWAPPINESS is left alone, as the service leaves it
    assert product_vm_settings(f) == {"page-cluster": "1"}


def test_set_for_the_block_and_put_back_even_on_error(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc takes a value in one write(2); a regular file here is rewritten whole
    monkeypatch.setattr(swapdev, "write", lambda p, v: Path(p).write_text(str(v)))

    def value(k: str) -> str:
        return (tmp_path / k).read_text().strip()

    (tmp_path / "swappiness").write_text("60\n")
    (tmp_path / "page-cluster").write_text("3\n")
    with vm_settings({"swappiness": "100", "page-cluster": "0"}, tmp_path):
        assert (value("swappiness"), value("page-cluster")) == ("100", "0")
    assert (value("swappiness"), value("page-cluster")) == ("60", "3")
    with pytest.raises(RuntimeError), vm_settings({"swappiness": "180"}, tmp_path):
        assert value("swappiness") == "180"
        raise RuntimeError("the device did not come up")
    assert value("swappiness") == "60"
