"""controlplane/cgroup.py: paths, ids, create and remove on a tmp tree."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from controlplane import cgroup, errors
from tests.fakes import make_process


def test_cgroup_paths_in_registry_form() -> None:
    root = Path("/sys/fs/cgroup")
    assert cgroup.cgroup_dir("/sandboxes/sb1") == root / "sandboxes/sb1"
    assert cgroup.cgroup_dir("sandboxes/sb1/") == root / "sandboxes/sb1"
    assert cgroup.cgroup_dir("/sys/fs/cgroup/sandboxes/sb1") == root / "sandboxes/sb1"


def test_found_by_id(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    d.mkdir(parents=True)
    assert cgroup.find_dir_by_id(os.stat(d).st_ino, root=tmp_path) == d
    assert cgroup.find_by_id(os.stat(d).st_ino, root=tmp_path) == "/a/b"
    assert cgroup.find_dir_by_id(1, root=tmp_path) is None
    assert cgroup.cgroup_id("/a/b", tmp_path) == os.stat(d).st_ino
    with pytest.raises(errors.AzswapError, match="cgroup"):
        cgroup.cgroup_id("/nope", tmp_path)


def test_create_enables_controllers_on_the_way_and_remove_is_recursive(tmp_path: Path) -> None:
    d = cgroup.create("/bench/sb0", tmp_path)
    assert d == tmp_path / "bench" / "sb0" and d.is_dir()
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory"
    assert (tmp_path / "bench" / "cgroup.subtree_control").read_text() == "+memory"
    (tmp_path / "bench" / "cgroup.subtree_control").unlink()  # rmdir needs an empty dir here
    cgroup.remove("/bench", tmp_path, recursive=True)
    assert not (tmp_path / "bench").exists()
    cgroup.remove("/bench", tmp_path)  # already gone: not an error


def test_remove_retries_busy_then_fails_loudly(tmp_path: Path, monkeypatch) -> None:
    d = tmp_path / "busy"
    d.mkdir()
    calls = []

    def rmdir(self: Path) -> None:
        calls.append(self)
        raise OSError(errno.EBUSY, "busy")

    monkeypatch.setattr(Path, "rmdir", rmdir)
    with pytest.raises(errors.AzswapError, match="busy"):
        cgroup.remove("/busy", tmp_path, timeout=0.2)
    assert len(calls) > 1


def test_procs_of_a_vanished_cgroup_is_empty(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").write_text("1\n42\n")
    assert cgroup.procs(tmp_path) == [1, 42]
    assert cgroup.procs(tmp_path / "gone") == []


def test_clear_referenced_writes_1_for_every_process_of_the_cgroup_and_its_subgroups(
    tmp_path: Path,
) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc"
    (root / "sb" / "inner").mkdir(parents=True)
    (root / "sb" / "cgroup.procs").write_text("10\n11\n13\n")
    (root / "sb" / "inner" / "cgroup.procs").write_text("12\n")
    refs = {pid: make_process(proc, pid, path) for pid, path in (
        (10, "/sb"), (12, "/sb/inner"),  # 11 exited after cgroup.procs was read
        (13, "/other"),  # 13 exited and its pid went to a process elsewhere
        (99, "/sb"))}  # not listed in cgroup.procs: untouched
    assert cgroup.Cgroup("/sb", root).clear_referenced(proc) == 2
    assert [refs[p].read_text() for p in (10, 12, 13, 99)] == ["1", "1", "", ""]
    make_process(proc, 10, "/sbx")  # a sibling whose name starts the same is not below it
    refs[10].write_text("")
    assert cgroup.Cgroup("/sb", root).clear_referenced(proc) == 1 and refs[10].read_text() == ""


def test_clear_referenced_refuses_the_root_cgroup(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").write_text("1\n")
    refs = make_process(tmp_path / "proc", 1, "/")
    with pytest.raises(errors.InvalidValue):
        cgroup.Cgroup("/", tmp_path).clear_referenced(tmp_path / "proc")
    assert refs.read_text() == ""
