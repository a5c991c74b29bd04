"""sysfs parsing, the registry (recovery from the module, state file), the metrics dict."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from controlplane import errors, metrics, sysfs
from controlplane.netlink import Phase
from controlplane.registry import SYNTHETIC_BIT, Registry, synthetic_id
from tests.fakes import FakeModule, make_cgroup


def make_dev(root: Path, n: int = 0) -> Path:
    d = root / f"azswap{n}"
    d.mkdir(parents=True)
    files = {
        "disksize": "1073741824",
        "initstate": "1",
        "comp_algorithm": "zstd:3",
        "mem_limit": "0",
        "mem_used_max": "8192",
        "dedup": "1",
        "sim_effort": "4",
        "mm_stat": "409600 40960 65536 0 8192 10 1 4096 512 0",
        "io_stat": "       0        0        0        3      100       50        2        0",
        "kind_stat": "      10       20       30       40       50        1",
        "obj_stat": "     151       90        5        0        0        0",
    }
    for k, v in files.items():
        (d / k).write_text(v + "\n")
    return d


def test_snapshot_parses_every_stat_file(tmp_path: Path) -> None:
    make_dev(tmp_path)
    st = sysfs.Device(0, tmp_path).snapshot().to_dict()
    assert st["disksize"] == 1 << 30 and st["comp_algorithm"] == "zstd:3"
    assert st["mm_stat"]["orig_data_size"] == 409600 and st["mm_stat"]["template_bytes"] == 0
    assert st["io_stat"]["loads"] == 50
    assert st["kind_stat"] == {
        "same": 10,
        "dup": 20,
        "tdelta": 30,
        "xdelta": 40,
        "plain": 50,
        "raw": 1,
    }
    assert st["obj_stat"]["cross_group"] == 0
    assert st["policy"] == {"dedup": 1, "sim_effort": 4}


def test_extra_columns_and_missing_files_are_tolerated(tmp_path: Path) -> None:
    d = make_dev(tmp_path)
    (d / "io_stat").write_text("1 2 3 4 5 6 7 8 9 10\n")
    (d / "kind_stat").unlink()
    st = sysfs.Device(0, tmp_path).snapshot().to_dict()
    assert st["io_stat"]["miss_free"] == 9 and st["io_stat"]["col9"] == 10
    assert "kind_stat" not in st


def test_writes_and_sizes(tmp_path: Path) -> None:
    d = make_dev(tmp_path)
    dev = sysfs.Device(0, tmp_path)
    dev.set_mem_limit("512M")
    assert (d / "mem_limit").read_text() == f"{512 << 20}\n"
    dev.set_comp_algorithm("lz4")
    assert (d / "comp_algorithm").read_text() == "lz4\n"
    with pytest.raises(errors.InvalidValue):
        dev.write("mm_stat", 1)
    with pytest.raises(errors.InvalidValue):
        sysfs.parse_size("12Q")


def test_absent_device_is_module_not_loaded_or_unknown_device(tmp_path: Path) -> None:
    with pytest.raises(errors.ModuleNotLoaded):
        sysfs.Device(0, tmp_path).snapshot()
    make_dev(tmp_path, 0)
    with pytest.raises(errors.UnknownDevice):
        sysfs.Device(3, tmp_path).snapshot()
    assert [d.index for d in sysfs.devices(tmp_path)] == [0]


def test_parse_choice() -> None:
    assert sysfs.parse_choice("lzo lz4 [zstd]") == ("zstd", ["lzo", "lz4", "zstd"])
    assert sysfs.parse_choice("zstd:3") == ("zstd:3", ["zstd:3"])


# -- registry --------------------------------------------------------------------------


@pytest.fixture
def world(tmp_path: Path) -> tuple[FakeModule, Path, Path]:
    cg = tmp_path / "cg"
    for p in ("/sb/a", "/sb/b", "/tpl/base"):
        make_cgroup(cg, p)
    return FakeModule(cg), cg, tmp_path / "run" / "state-dev0.json"


def test_register_persists_names_in_a_private_state_file(world) -> None:
    fm, cg, state = world
    reg = Registry(fm, state, cg)
    reg.add_template("base", 1, cgroup_path="/tpl/base")
    sb = reg.add_sandbox("a", "/sb/a", 1, template="base")
    assert sb.cgroup_id == (cg / "sb/a").stat().st_ino
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert {s["name"] for s in json.loads(state.read_text())["sandboxes"]} == {"a"}


def test_registry_errors(world) -> None:
    fm, cg, state = world
    reg = Registry(fm, state, cg)
    reg.add_template("base", 1, cgroup_path="/tpl/base")
    with pytest.raises(errors.InvalidValue, match="trust group"):
        reg.add_sandbox("a", "/sb/a", 2, template="base")  # template of another group
    reg.add_sandbox("a", "/sb/a", 1)
    with pytest.raises(errors.AlreadyExists):
        reg.add_sandbox("a", "/sb/b", 1)
    with pytest.raises(errors.AlreadyExists):  # same cgroup, other name: the module says EEXIST
        reg.add_sandbox("a2", "/sb/a", 1)
    with pytest.raises(errors.UnknownCgroup):
        reg.add_sandbox("c", "/sb/nope", 1)
    with pytest.raises(errors.InvalidValue):
        reg.add_sandbox("bad name!", "/sb/b", 1)
    with pytest.raises(errors.UnknownSandbox):
        reg.remove_sandbox("zz")
    with pytest.raises(errors.UnknownTemplate):
        reg.remove_template("zz")
    assert [s.name for s in reg.list_sandboxes()] == ["a"]  # nothing half-applied


def test_restart_recovers_names_from_module_and_state_file(world) -> None:
    fm, cg, state = world
    reg = Registry(fm, state, cg)
    reg.add_template("base", 1, cgroup_path="/tpl/base")
    reg.add_sandbox("a", "/sb/a", 1, template="base")
    reg.add_sandbox("b", "/sb/b", 1)
    fm.store(reg.sandbox("b").cgroup_id, 5)
    reg.remove_sandbox("b")  # still owns pages: the module keeps listing it
    assert len(fm.stats()) == 3
    assert [o.registered for o in fm.stats()] == [True, True, False]
    new = Registry(fm, state, cg)
    assert new.recover() == (1, 1)
    state.unlink()  # the module's REGISTERED flag alone keeps "b" out
    assert Registry(fm, state, cg).recover() == (1, 1)
    assert new.sandbox("a").template == "base" and new.sandbox("a").cgroup_path == "/sb/a"


def test_recovery_without_state_file_names_owners_by_cgroup(world) -> None:
    fm, cg, state = world
    cid = fm.sandbox_add(4, cgroup_path="/sb/b")  # registered by someone else
    tid = fm.template_add(4, cgroup_id=synthetic_id("/srv/img"))
    reg = Registry(fm, state, cg)
    assert reg.recover() == (1, 1)
    sb = reg.sandbox("b")
    assert sb.cgroup_id == cid and sb.cgroup_path == "/sb/b" and sb.group == 4
    assert reg.template(f"cg{tid}").cgroup_id & SYNTHETIC_BIT


def test_file_names_that_the_module_lost_are_dropped(world) -> None:
    fm, cg, state = world
    reg = Registry(fm, state, cg)
    reg.add_sandbox("a", "/sb/a", 1)
    fm.sandbox_del(reg.sandbox("a").cgroup_id)  # e.g. module reloaded
    assert Registry(fm, state, cg).recover() == (0, 0)


def test_corrupt_state_file_is_not_fatal(world) -> None:
    fm, cg, state = world
    fm.sandbox_add(1, cgroup_path="/sb/a")
    state.parent.mkdir(parents=True)
    state.write_text("{nope")
    reg = Registry(fm, state, cg)
    assert reg.recover() == (1, 0) and reg.sandbox("a")


def test_readonly_registry_never_writes(world) -> None:
    fm, cg, state = world
    fm.sandbox_add(1, cgroup_path="/sb/a")
    Registry(fm, state, cg, readonly=True).recover()
    assert not state.exists()


def test_synthetic_ids_are_stable_and_never_cgroup_inodes(tmp_path: Path) -> None:
    f = tmp_path / "img"
    f.write_bytes(b"")
    assert synthetic_id(f) == synthetic_id(str(f)) and synthetic_id(f) & SYNTHETIC_BIT
    assert synthetic_id(f) != synthetic_id(tmp_path / "other")


# -- metrics ---------------------------------------------------------------------------


def test_metrics_dict_sums_and_prometheus_agree(world, tmp_path: Path) -> None:
    fm, cg, state = world
    reg = Registry(fm, state, cg)
    reg.add_template("base", 1, cgroup_path="/tpl/base")
    reg.add_sandbox("a", "/sb/a", 1)
    reg.add_sandbox("b", "/sb/b", 1)
    fm.store(reg.sandbox("a").cgroup_id, 100, "tdelta", bytes_each=100)
    fm.store(reg.sandbox("b").cgroup_id, 50, "plain", bytes_each=2048)
    fm.phase_set(reg.sandbox("a").cgroup_id, Phase.LLM_WAIT)
    make_dev(tmp_path / "sys")
    d = metrics.build(
        fm,
        reg,
        sysfs.Device(0, tmp_path / "sys"),
        {"a": {"phase": "llm-wait", "age": 3.0, "source": "hint"}},
        {"a": {"total_wall": 1.5, "total_cpu": 1.25}},
    )
    t = d["totals"]
    assert t["pages"] == 150 and t["orig_bytes"] == 150 * 4096
    assert t["stored_bytes"] == 100 * 100 + 50 * 2048
    assert t["kinds"]["tdelta"] == 100 and t["kind_share"]["plain"] == pytest.approx(1 / 3, 1e-3)
    a = next(s for s in d["sandboxes"] if s["name"] == "a")
    assert a["ratio"] == pytest.approx(4096 / 100) and a["module_phase"] == "llm-wait"
    assert a["memory_current"] == 256 << 20 and a["phase"]["phase"] == "llm-wait"
    assert d["device"]["kind_stat"]["plain"] == 50 and d["policy"]["codec"] == "lz4"
    text = metrics.to_prometheus(d)
    assert f"azswap_stored_bytes {float(t['stored_bytes'])}" in text
    assert 'azswap_owner_kind_pages{name="a",repr="tdelta"} 100.0' in text
    assert 'azswap_sandbox_reclaim_cpu_seconds{name="a"} 1.25' in text
