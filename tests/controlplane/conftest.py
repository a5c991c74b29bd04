"""Fixtures: a fake clock, a fake /proc and a fake cgroup2 tree in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes import FakeClock, make_proc


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    return make_proc(tmp_path / "proc")


@pytest.fixture
def cgroot(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    return root
