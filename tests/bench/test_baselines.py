"""The Linux baselines of bench/kit/swapdev.py: names, dictionary training input, KSM's
settling rule and its cost attribution, the reasons given for a missing feature, and the way
swapbench counts their rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kit import swapdev
from bench.kit.swapdev import (
    Azswap,
    KsmZram,
    SwapDevError,
    Zram,
    ZramDict,
    ZramRecomp,
    Zswap,
    ZswapShrink,
    kernel_config,
    ksm_cost,
    ksm_rmap_item_bytes,
    ksm_settled,
    make_system,
    read_kv,
    training_pages,
)
from bench.swapbench import DEFAULT_SYSTEMS, SYSTEMS, acceptable, ratio
from controlplane.sysfs import STAT_FILES
from controlplane.trace import PAGE_SIZE


@pytest.mark.parametrize(
    ("name", "cls", "attrs"),
    [
        ("zram-zstd-dict", ZramDict, {"algo": "zstd"}),
        ("zram-lz4-dict", ZramDict, {"algo": "lz4"}),
        ("zram-lz4-recomp-zstd", ZramRecomp, {"algo": "lz4", "recomp": "zstd"}),
        ("zswap-lz4-shrink", ZswapShrink, {"algo": "lz4", "shrinker": True}),
        ("ksm-zram-lz4", KsmZram, {"algo": "lz4", "mergeable": True}),
        ("zram-lz4", Zram, {"algo": "lz4", "mergeable": False}),
        ("zswap-zstd", Zswap, {"algo": "zstd", "shrinker": False}),
        ("azswap-zstd", Azswap, {"algo": "zstd", "shuffle": 1, "packed": False, "cached": False}),
        ("azswap-lz4-cached", Azswap, {"algo": "lz4", "packed": False, "cached": True}),
        ("azswap-lz4-cached-packed", Azswap, {"algo": "lz4", "packed": True, "cached": True}),
        ("azswap-zstd-packed", Azswap, {"algo": "zstd", "shuffle": 1, "packed": True}),
        ("azswap-lz4-noshuf-packed", Azswap, {"algo": "lz4", "shuffle": 0, "packed": True}),
        ("azswap-lz4-packed-noshuf", Azswap, {"algo": "lz4", "shuffle": 0, "packed": True}),
    ],
)
def test_names(name: str, cls: type, attrs: dict[str, object]) -> None:
    s = make_system(name)
    assert type(s) is cls
    assert s.name == name
    for k, v in attrs.items():
        assert getattr(s, k) == v


@pytest.mark.parametrize("name", ["zram-lz4-bogus", "zswap-lz4-dict", "ksm-zswap-lz4", "zram-",
                                  "ksm-lz4"])
def test_unknown_names(name: str) -> None:
    with pytest.raises(ValueError):
        make_system(name)


def test_every_listed_system_is_known() -> None:
    for name in SYSTEMS:
        assert make_system(name).name == name
    assert {"zram-zstd-dict", "zram-lz4-recomp-zstd", "zswap-lz4-shrink", "ksm-zram-lz4"} <= set(
        DEFAULT_SYSTEMS)


def test_training_pages_skip_same_filled_and_spread() -> None:
    zero = bytes(PAGE_SIZE)
    fill = b"\x01\x02\x03\x04\x05\x06\x07\x08" * (PAGE_SIZE // 8)
    real = [bytes([k]) * 17 + bytes(range(256)) * 15 + bytes(PAGE_SIZE - 17 - 3840)
            for k in range(10)]
    data = b"".join([zero, real[0], fill, *real[1:], zero])
    got = training_pages(data, 100)
    assert got == real  # same-filled pages (zero or not) are no training material
    spread = training_pages(data, 5)
    assert spread == [real[0], real[2], real[4], real[6], real[8]]


def test_train_dictionary_refuses_too_few_pages() -> None:
    with pytest.raises(swapdev.SwapDevError, match="too few"):
        swapdev.train_dictionary([b"x" * PAGE_SIZE] * 3)


def test_train_dictionary_makes_a_zstd_dictionary() -> None:
    import random

    rng = random.Random(1)
    words = [bytes(rng.choices(range(97, 123), k=rng.randint(3, 9))) for _ in range(300)]
    pages = [b" ".join(rng.choices(words, k=900))[:PAGE_SIZE] for _ in range(200)]
    d = swapdev.train_dictionary(pages, 16384)
    assert d[:4] == b"\x37\xa4\x30\xec"  # ZSTD_MAGIC_DICTIONARY, little endian
    assert 0 < len(d) <= 16384


def test_ksm_settled() -> None:
    # (full_scans, pages_sharing) samples after starting at full_scans 10
    assert not ksm_settled([], 10)
    assert not ksm_settled([(11, 5), (12, 50)], 10)  # too few scans
    assert not ksm_settled([(12, 50), (13, 80)], 10)  # still merging in the last scan
    assert ksm_settled([(12, 50), (13, 80), (13, 80), (14, 80)], 10)
    assert not ksm_settled([(14, 80)], 10)  # no sample of the scan before
    assert not ksm_settled([(12, 80), (14, 80)], 10)  # scan 13 was not seen


def test_ksm_rmap_item_bytes_from_general_profit() -> None:
    saved = (1000 + 24) * PAGE_SIZE
    ksm = {"pages_sharing": 1000, "ksm_zero_pages": 24, "general_profit": saved - 64 * 500}
    assert ksm_rmap_item_bytes(ksm, 500) == 64
    assert ksm_rmap_item_bytes({"pages_sharing": 3}, 500) == swapdev.KSM_RMAP_ITEM  # pre-6.4
    assert ksm_rmap_item_bytes(ksm, 0) == swapdev.KSM_RMAP_ITEM


def test_ksm_cost_attribution() -> None:
    rmap = {"template": 1000, "sb0": 300, "sb1": 200}
    sb, tm = ksm_cost(rmap, {"template"}, 64, pages_shared=40, stable_bytes=56)
    assert tm == 1000 * 64
    assert sb == 500 * 64 + 40 * 56


def test_read_kv() -> None:
    text = "ksm_rmap_items 123\nksm_zero_pages 0\nksm_merge_any no\nksm_process_profit -4096\n"
    assert read_kv(text) == {"ksm_rmap_items": 123, "ksm_zero_pages": 0,
                             "ksm_process_profit": -4096}


def test_kernel_config_reasons(tmp_path: Path) -> None:
    (tmp_path / "config-9.9").write_text(
        "CONFIG_KSM=y\n# CONFIG_ZRAM_MULTI_COMP is not set\nCONFIG_ZRAM=m\n")
    places = (str(tmp_path / "config-{}"),)
    assert kernel_config("KSM", "9.9", places) == "y"
    assert kernel_config("ZRAM", "9.9", places) == "m"
    assert kernel_config("ZRAM_MULTI_COMP", "9.9", places) == "not set"
    assert kernel_config("ZRAM_MULTI", "9.9", places) == "not set"  # whole names only
    assert kernel_config("KSM", "1.0", places) == "unknown"


def test_missing_features_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without the attribute: FeatureMissing naming it, never a plainer setup."""
    dev = tmp_path / "zram0"
    dev.mkdir()
    for cls, args, what in ((ZramRecomp, ("lz4", "zstd"), "CONFIG_ZRAM_MULTI_COMP"),
                            (ZramDict, ("zstd",), "algorithm_params")):
        s = cls(*args)
        s.sys = dev
        with pytest.raises(swapdev.FeatureMissing, match=what):
            s._before_disksize()
    d = ZramDict("zstd")
    d.sys = dev
    with pytest.raises(swapdev.FeatureMissing, match="algorithm_params"):
        d.train([])  # before any training, and before looking for a template
    z = ZswapShrink("lz4")
    monkeypatch.setattr(ZswapShrink, "P", tmp_path)
    with pytest.raises(swapdev.FeatureMissing, match="shrinker_enabled"):
        z._shrinker(True)
    Zswap("lz4")._shrinker(False)  # plain zswap on a kernel without it: nothing to turn off


def test_dictionary_is_the_templates_cost() -> None:
    s = ZramDict("zstd")
    s.info["dict_bytes"] = 112640
    assert s.fixed_bytes() == (0, 112640)
    assert Zram("zstd").fixed_bytes() == (0, 0)


def test_ratio_and_acceptable_rows() -> None:
    assert ratio(400, 200) == 2.0
    assert ratio(1, 0) == float("inf")
    assert acceptable({"ok": True})
    assert not acceptable({"ok": False})
    assert acceptable({"error": "no recomp", "unavailable": True, "requested": False})
    assert not acceptable({"error": "no recomp", "unavailable": True, "requested": True})
    assert not acceptable({"error": "boom"})


# ------------------------------------------------------------------ metadata (net ratio)
VMALLOCINFO = (
    "0xffffc90000000000-0xffffc90000005000   20480 irq_init_percpu_irqstack+0x10/0x30 "
    "pages=4 vmalloc\n"
    "0xffffc90000a4d000-0xffffc90000b4e000 1052672 disksize_store+0x6c/0x180 [zram] "
    "pages=256 vmalloc N0=256\n"
    "0xffffc90000c00000-0xffffc90000c03000   12288 zcomp_strm_init+0x20/0x60 [zram] "
    "pages=2 vmalloc N0=2\n"
)


def test_zram_table_entry_from_vmallocinfo(tmp_path: Path) -> None:
    info = tmp_path / "vmallocinfo"
    info.write_text(VMALLOCINFO)
    # 256 pages of table for a 256 MiB disk: 16 bytes per slot (the stream buffer is not one)
    assert swapdev.zram_table_entry(256 << 20, info) == 16.0
    info.write_text(VMALLOCINFO.splitlines()[0])
    assert swapdev.zram_table_entry(256 << 20, info) == 0.0  # not shown: no figure
    two = VMALLOCINFO.splitlines()[1]
    info.write_text(two + "\n" + two + "\n")
    assert swapdev.zram_table_entry(256 << 20, info) == 0.0  # two devices: which one?
    assert swapdev.zram_table_entry(256 << 20, tmp_path / "missing") == 0.0


def test_zram_meta_is_its_entries_in_use() -> None:
    z = Zram("lz4")
    snaps = ({"pages": 1}, {"pages": 101}, {"pages": 1101})
    assert z.meta(*snaps) is None  # table size unknown: no net ratio, never a guess
    z.entry_bytes = 16.0
    assert z.meta(*snaps) == (16 * 1000, 16 * 100)


def test_zswap_meta_is_one_entry_per_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(swapdev, "slab_size", lambda cache: 0)
    z = Zswap("lz4")
    snaps = ({"pages": 0}, {"pages": 10}, {"pages": 30})
    assert z.meta(*snaps) is None
    z.info["entry_bytes"] = 64
    assert z.meta(*snaps) == (64 * 20, 64 * 10)


def test_azswap_meta_splits_per_page_and_shared_parts() -> None:
    def snap(slots: int, objs: int, shared: int) -> dict[str, int]:
        return {
            "slot_used_bytes": slots,
            "obj_meta_bytes": objs,
            "index_table_bytes": shared,
            "tnode_bytes": shared,
            "owner_bytes": shared,
            "base_cache_bytes": shared,
        }

    s0, s1, s2 = snap(16, 0, 100), snap(16 + 160, 880, 100), snap(16 + 480, 2640, 200)
    sb, tm = make_system("azswap-lz4").meta(s0, s1, s2)
    assert tm == 160 + 880  # the template's slot entries and headers, swap's header page apart
    assert sb == 320 + 1760 + 4 * 200  # the sandboxes' per-page parts and every shared part


def _fake_azswap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packed_pages: int) -> Path:
    d = tmp_path / "azswap0"
    d.mkdir()
    (d / "pack").write_text("")
    cols = dict.fromkeys(STAT_FILES["obj_stat"], 0)
    cols.update(packs=packed_pages // 3, packed_pages=packed_pages)
    (d / "obj_stat").write_text(" ".join(str(v) for v in cols.values()) + "\n")
    monkeypatch.setattr(Azswap, "B", d)
    return d


def test_packed_azswap_packs_once_the_sandboxes_are_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _fake_azswap(tmp_path, monkeypatch, packed_pages=9)
    s = make_system("azswap-zstd-packed")
    s.after_reclaim("template")
    assert (d / "pack").read_text() == ""
    s.after_reclaim("sandboxes")
    assert (d / "pack").read_text() == "1"
    assert s.info["packs"] == 3 and s.info["packed_pages"] == 9 and s.info["pack_s"] >= 0
    # without the suffix nothing is written
    (d / "pack").write_text("")
    make_system("azswap-zstd").after_reclaim("sandboxes")
    assert (d / "pack").read_text() == ""


def test_a_pack_pass_that_packed_nothing_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_azswap(tmp_path, monkeypatch, packed_pages=0)
    s = make_system("azswap-lz4-packed")
    s.after_reclaim("sandboxes")
    assert s.info["packed_pages"] == 0
    assert "packed nothing" in capsys.readouterr().out


def test_a_pack_write_that_fails_fails_the_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _fake_azswap(tmp_path, monkeypatch, packed_pages=3)
    (d / "pack").unlink()
    (d / "pack").mkdir()  # the write fails (EISDIR)
    with pytest.raises(SwapDevError, match="writing"):
        make_system("azswap-lz4-packed").after_reclaim("sandboxes")


@pytest.mark.parametrize(
    "name",
    ["azswap-lz4-packed-packed", "azswap-zstd-bogus", "azdev-lz4-x", "azswap-lz4-cached-cached"],
)
def test_unknown_azswap_suffixes(name: str) -> None:
    with pytest.raises(ValueError, match="suffixes"):
        make_system(name)


def test_azswap_stats_read_every_column_they_report(tmp_path: Path) -> None:
    # a device directory as sysfs shows it: each stat file's columns numbered 1, 2, ...
    for f in ("mm_stat", "kind_stat", "obj_stat", "meta_stat", "io_stat"):
        (tmp_path / f).write_text(" ".join(str(i + 1) for i in range(len(STAT_FILES[f]))))
    dev = Azswap("lz4")
    dev.B = tmp_path
    st = dev.stats()
    obj = STAT_FILES["obj_stat"]
    for name in ("base_cache_pages", "base_cache_hits", "base_cache_misses", "direct_pages"):
        assert st[name] == obj.index(name) + 1, name
    assert st["payload"] == STAT_FILES["mm_stat"].index("compr_data_size") + 1
    assert st["kind_plain"] == STAT_FILES["kind_stat"].index("plain") + 1
    for name in ("stores", "loads", "notify_free"):
        assert st[f"io_{name}"] == STAT_FILES["io_stat"].index(name) + 1, name


@pytest.mark.parametrize(("loaded_cached", "name", "reloads"), [
    (False, "azswap-lz4-cached", True),
    (True, "azswap-lz4", True),
    (True, "azswap-lz4-cached", False),
    (False, "azswap-lz4", False),
])
def test_azswap_reloads_the_module_for_another_swap_in_mode(
    monkeypatch: pytest.MonkeyPatch, loaded_cached: bool, name: str, reloads: bool
) -> None:
    """A system set up after another left the module loaded in the other swap_cache mode
    reloads it (a run of azswap-lz4 then azswap-lz4-cached measures both modes); the same mode
    keeps it.  Setup stops at the first sysfs write (no device here)."""
    calls: list[str] = []
    state = {"loaded": True, "cached": loaded_cached}

    def cleanup() -> None:
        calls.append("cleanup")
        state["loaded"] = False

    def insmod(**params: object) -> None:
        calls.append(f"insmod {params}")
        state.update(loaded=True, cached=bool(params.get("swap_cache")))

    monkeypatch.setattr(swapdev.module, "loaded", lambda: state["loaded"])
    monkeypatch.setattr(swapdev.module, "swap_cache", lambda: state["cached"])
    monkeypatch.setattr(swapdev.module, "cleanup_module", cleanup)
    monkeypatch.setattr(swapdev.module, "insmod", insmod)
    s = make_system(name)
    monkeypatch.setattr(s, "B", Path("/nonexistent/azswap0"))
    with pytest.raises(swapdev.SwapDevError):
        s.setup(1 << 20)
    want = ["cleanup", f"insmod {({'swap_cache': 1} if s.cached else {})}"] if reloads else []
    assert calls == want
    assert state["cached"] == s.cached
