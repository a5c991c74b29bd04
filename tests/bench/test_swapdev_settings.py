"""The vm sysctls every benchmarked swap device runs under: the product's swap service's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.kit import swapdev
from bench.kit.swapdev import SwapDevError, product_vm_settings, vm_settings


def test_the_settings_are_the_shipped_service_s() -> None:
    # packaging/default/azswap as shipped: no readahead, anonymous and file pages alike
    assert product_vm_settings() == {"page-cluster": "0", "swappiness": "100"}


def test_settings_read_as_the_shell_that_sources_them(tmp_path: Path) -> None:
    script, settings = tmp_path / "setup", tmp_path / "azswap"
    script.write_text("PAGE_CLUSTER=0   # default\nSWAPPINESS=100\n")
    settings.write_text('# comment\nDEVICE=azswap0\nPAGE_CLUSTER="1"  # one page more\n'
                        "OTHER=5\nSWAPPINESS=\n")
    # the settings file wins; its empty SWAPPINESS leaves swappiness alone, as the service does
    assert product_vm_settings((script, settings)) == {"page-cluster": "1"}
    # a key the settings file does not name keeps the script's default
    settings.write_text("DEVICE=azswap0\n")
    assert product_vm_settings((script, settings)) == {"page-cluster": "0", "swappiness": "100"}


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


def test_a_sysctl_that_cannot_be_set_is_a_swapdev_error_and_the_rest_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(swapdev, "write", lambda p, v: Path(p).write_text(str(v)))
    (tmp_path / "page-cluster").write_text("3\n")  # no swappiness file
    with pytest.raises(SwapDevError, match=r"vm\.swappiness"), \
            vm_settings({"page-cluster": "0", "swappiness": "100"}, tmp_path):
        pass
    assert (tmp_path / "page-cluster").read_text().strip() == "3"


def test_swap_goes_off_before_the_sysctls_are_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []

    class Fake:
        def setup(self, nbytes: int) -> None:
            events.append("setup")

        def teardown(self) -> None:
            events.append("teardown")

    @contextlib.contextmanager
    def settings(values: dict[str, str]) -> Iterator[None]:
        events.append(f"set {sorted(values)}")
        yield
        events.append("put back")

    monkeypatch.setattr(swapdev.module, "disable_zswap", lambda: None)
    monkeypatch.setattr(swapdev, "sh", lambda *a, **k: None)
    monkeypatch.setattr(swapdev, "make_system", lambda name: Fake())
    monkeypatch.setattr(swapdev, "vm_settings", settings)
    with swapdev.swap_device("zram-lz4", 1 << 20):
        events.append("run")
    assert events == ["set ['page-cluster', 'swappiness']", "setup", "run", "teardown",
                      "put back"]
