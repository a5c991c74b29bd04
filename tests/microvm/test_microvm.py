"""Host tests of the microVM recorder's pieces and the report (no QEMU, no root needed)."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from bench import microvm, microvm_report, microvm_reporting
from controlplane.trace import ROLE_SANDBOX, ROLE_TEMPLATE, read_trace
from controlplane.trace import replay as rp
from controlplane.trace.corelib import default_lib_path

TOP = Path(__file__).resolve().parents[2]
PAGE = 4096


def _load(name: str) -> ModuleType:
    path = TOP / "vm-tests" / "microvm" / f"{name}.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"microvm_{name}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def record() -> ModuleType:
    return _load("record")


@pytest.fixture(scope="module")
def image() -> ModuleType:
    return _load("image")


def test_mirror_from_deb822_and_one_line(image: ModuleType, tmp_path: Path) -> None:
    a = tmp_path / "debian.sources"
    a.write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert image.debian_mirror([a]) == "http://mirror.example/debian"
    b = tmp_path / "sources.list"
    b.write_text("# x\ndeb [arch=amd64] http://m2.example/debian bookworm main\n")
    assert image.debian_mirror([b]) == "http://m2.example/debian"
    c = tmp_path / "other.list"
    c.write_text("deb https://packages.example/apt cloud main\n")
    assert image.debian_mirror([c]) == "http://deb.debian.org/debian"


def _page(rng: random.Random, kind: str) -> bytes:
    if kind == "zero":
        return bytes(PAGE)
    if kind == "text":
        words = [b"alpha", b"beta", b"gamma", b"delta", b"model", b"token"]
        out = b" ".join(rng.choice(words) for _ in range(900))
        return out[:PAGE].ljust(PAGE, b".")
    return rng.randbytes(PAGE)


def _fake_recording(tmp: Path, record: ModuleType, npages: int = 64) -> list:
    rng = random.Random(7)
    tmpl = bytearray()
    for k in range(npages):
        tmpl += _page(rng, "zero" if k % 5 == 0 else ("text" if k % 2 else "rand"))
    (tmp / "template.ram").write_bytes(tmpl)
    results = []
    for i, task in enumerate(("train", "generate")):
        g = bytearray(tmpl)
        for k in range(i + 1, npages, 7):  # owned pages: edits, fresh pages, a zeroed page
            if k % 3 == 0:
                g[k * PAGE : (k + 1) * PAGE] = bytes(PAGE)
            else:
                g[k * PAGE + 100 : k * PAGE + 108] = rng.randbytes(8)
        (tmp / f"vm{i}.ram").write_bytes(g)
        results.append(record.GuestResult(f"vm{i}", task, 1000 + i))
    return results


def test_trace_holds_template_and_owned_pages(record: ModuleType, tmp_path: Path) -> None:
    results = _fake_recording(tmp_path, record)
    stats = record.write_trace(tmp_path, results, {"style": "microvm-snapshot"})
    tr = read_trace(tmp_path / "microvm.aztrace")
    tmpl = (tmp_path / "template.ram").read_bytes()
    owners = list(tr.owners.values())
    assert [o.role for o in owners] == [ROLE_TEMPLATE, ROLE_SANDBOX, ROLE_SANDBOX]
    t = owners[0]
    assert t.id == record.TEMPLATE_ID
    # the template: every non-zero page, index = page offset = vaddr >> 12
    nz = [k for k in range(64) if tmpl[k * PAGE : (k + 1) * PAGE] != bytes(PAGE)]
    assert t.indexes() == nz and stats["template_nonzero_pages"] == len(nz)
    assert [v >> 12 for v in t.vaddrs()] == nz
    for n, o in enumerate(owners[1:]):
        g = (tmp_path / f"vm{n}.ram").read_bytes()
        diff = [k for k in range(64)
                if g[k * PAGE : (k + 1) * PAGE] != tmpl[k * PAGE : (k + 1) * PAGE]]
        assert o.indexes() == diff
        assert o.data() == b"".join(g[k * PAGE : (k + 1) * PAGE] for k in diff)
        info = results[n].info
        assert info["owned_pages"] == len(diff)
        assert info["nonzero_pages"] == sum(
            g[k * PAGE : (k + 1) * PAGE] != bytes(PAGE) for k in range(64))
        assert o.info["task"] == results[n].task


def _punch(path: Path, page: int, pages: int = 1) -> None:
    """Discard pages of @path the way QEMU does for a reported free block (a punched hole)."""
    subprocess.run(["fallocate", "--punch-hole", "--keep-size", "--offset", str(page * PAGE),
                    "--length", str(pages * PAGE), str(path)], check=True)


def test_hole_pages_finds_punched_and_unwritten_pages(record: ModuleType,
                                                      tmp_path: Path) -> None:
    f = tmp_path / "ram"
    f.write_bytes(b"\xa5" * (8 * PAGE))
    _punch(f, 2, 2)
    with open(f, "r+b") as fh:
        fh.truncate(12 * PAGE)  # pages 8-11: never written
    holes = record.hole_pages(f, 12)
    assert list(holes) == [0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]
    assert f.read_bytes()[2 * PAGE : 4 * PAGE] == bytes(2 * PAGE)
    # a page the guest zeroed itself holds data: not a hole
    with open(f, "r+b") as fh:
        fh.seek(5 * PAGE)
        fh.write(bytes(PAGE))
    assert record.hole_pages(f, 12)[5] == 0


def test_hole_pages_counts_a_partly_written_page_as_data(record: ModuleType,
                                                        tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "ram"
    f.write_bytes(bytes(6 * PAGE))
    extents = [(100, PAGE + 5), (3 * PAGE + 4000, 3 * PAGE + 4001)]  # data, not page-aligned

    def lseek(fd: int, off: int, whence: int) -> int:
        for a, b in extents:
            if whence == os.SEEK_DATA and off < b:
                return max(a, off)
            if whence == os.SEEK_HOLE and a <= off < b:
                return b
        if whence == os.SEEK_HOLE:
            return 6 * PAGE
        raise OSError(errno.ENXIO, "no data")

    monkeypatch.setattr(record.os, "lseek", lseek)
    assert list(record.hole_pages(f, 6)) == [0, 0, 1, 0, 1, 1]

    def broken(fd: int, off: int, whence: int) -> int:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(record.os, "lseek", broken)
    with pytest.raises(OSError):
        record.hole_pages(f, 6)


def test_trace_counts_discarded_pages(record: ModuleType, tmp_path: Path) -> None:
    results = _fake_recording(tmp_path, record)
    record.write_trace(tmp_path, results, {"style": "microvm-snapshot"})
    before = dict(results[0].info)
    # pages the guest zeroed itself hold data: owned zero pages, none of them discarded
    assert before["owned_zero_pages"] > 0 and before["discarded_pages"] == 0
    tmpl = (tmp_path / "template.ram").read_bytes()
    g = tmp_path / "vm0.ram"
    # page 4 (not zero in the template, untouched by vm0) discarded by the balloon
    assert tmpl[4 * PAGE : 5 * PAGE] != bytes(PAGE) and 4 not in range(1, 64, 7)
    _punch(g, 4)
    record.write_trace(tmp_path, results, {"style": "microvm-snapshot"})
    info = results[0].info
    assert info["discarded_pages"] == 1
    assert info["owned_pages"] == before["owned_pages"] + 1
    assert info["owned_zero_pages"] == before["owned_zero_pages"] + 1
    assert info["nonzero_pages"] == before["nonzero_pages"] - 1
    o = list(read_trace(tmp_path / "microvm.aztrace").owners.values())[1]
    assert 4 in o.indexes()
    assert results[1].info["discarded_pages"] == 0


def _settle(record: ModuleType, sizes: list[int], **kw: float) -> tuple[float, int, bool]:
    """settle_discards() over a fixed sequence of file sizes, one per poll, on a fake clock."""
    now = [0.0]
    left = iter(sizes)
    last = [sizes[-1]]

    def size() -> int:
        last[0] = next(left, last[0])
        return last[0]

    def sleep(dt: float) -> None:
        now[0] += dt

    return record.settle_discards(size, clock=lambda: now[0], sleep=sleep, **kw)


def test_settle_discards_waits_for_the_file_to_stop_shrinking(record: ModuleType) -> None:
    mb = 1 << 20
    # shrinks at polls 2 and 5 (a write in between does not count), then stays
    waited, shrank, settled = _settle(
        record, [10 * mb, 10 * mb, 8 * mb, 8 * mb, 9 * mb, 5 * mb] + [5 * mb] * 20,
        quiet_s=3.0, poll_s=1.0, limit_s=100.0)
    assert settled and shrank == 5 * mb
    assert waited == 5.0 + 3.0  # the last shrink, then a quiet spell
    # growth, then a shrink that stays above the smallest size seen: still a shrink
    waited, shrank, settled = _settle(
        record, [4 * mb, 2 * mb, 6 * mb, 3 * mb] + [3 * mb] * 20,
        quiet_s=2.0, poll_s=1.0, limit_s=100.0)
    assert settled and waited == 3.0 + 2.0 and shrank == 1 * mb
    # never settles: stops at the limit and says so
    waited, shrank, settled = _settle(
        record, [100 * mb - k * mb for k in range(50)], quiet_s=3.0, poll_s=1.0, limit_s=10.0)
    assert not settled and waited == 10.0 and shrank == 10 * mb
    # nothing shrinks: one quiet spell
    waited, shrank, settled = _settle(record, [mb] * 10, quiet_s=2.0, poll_s=0.5)
    assert settled and waited == 2.0 and shrank == 0


def test_qemu_command_line_has_the_balloon_only_when_asked(record: ModuleType,
                                                           tmp_path: Path) -> None:
    img = record.image.Image("vmlinuz", "initrd", "disk", "root", "k")
    spec = record.VmSpec("vm0", tmp_path / "vm0.ram", tmp_path, 384, img, "console=ttyS0")
    cmd = record.qemu_cmd(spec, tmp_path / "q", tmp_path / "c")
    assert not any("virtio-balloon" in w for w in cmd) and "-incoming" not in cmd
    spec.balloon = True
    template = record.qemu_cmd(spec, tmp_path / "q", tmp_path / "c")
    dev = template[template.index("-device") + 1]
    assert dev.startswith("virtio-balloon-pci") and "free-page-reporting=on" in dev
    spec.incoming = True
    restore = record.qemu_cmd(spec, tmp_path / "q", tmp_path / "c")
    # a restore has the snapshot's devices: the same line, waiting for the incoming state
    assert restore == [*template, "-incoming", "defer"]


def test_initrd_sets_the_reporting_order_after_the_balloon_loads(image: ModuleType) -> None:
    mods = list(image.INITRD_MODULES)
    assert mods.index("virtio_balloon") > mods.index("virtio_pci")
    init = image.INITRD_INIT
    assert init.index("insmod") < init.index("page_reporting_order")
    assert "azagent.report_order=" in init


def test_load_recording_rebuilds_image(record: ModuleType, tmp_path: Path) -> None:
    results = _fake_recording(tmp_path, record)
    stats = record.write_trace(tmp_path, results, {"style": "microvm-snapshot"})
    (tmp_path / "manifest.json").write_text(json.dumps({**stats, "pages": 64}))
    run = tmp_path / "run"
    rec = microvm.load_recording(tmp_path, run)
    assert rec.image.read_bytes() == (tmp_path / "template.ram").read_bytes()
    assert rec.template_id == record.TEMPLATE_ID
    assert [v.task for v in rec.vms] == ["train", "generate"]
    for n, vm in enumerate(rec.vms):
        g = (tmp_path / f"vm{n}.ram").read_bytes()
        assert list(np.diff(vm.offs) > 0) == [True] * (len(vm.offs) - 1)
        for j, k in enumerate(vm.offs):
            page = g[int(k) * PAGE : (int(k) + 1) * PAGE]
            assert vm.data[j * PAGE : (j + 1) * PAGE] == page
            assert bool(vm.nonzero[j]) == (page != bytes(PAGE))
        assert vm.nonzero_pages == results[n].info["nonzero_pages"]


def _live(n: int = 2) -> dict:
    vms = [{"name": f"vm{i}", "task": "train", "owned_pages": 100, "nonzero_pages": 1000}
           for i in range(n)]
    owners = [{"name": f"vm{i}", "is_template": False, "exclusive_bytes": 30 * PAGE,
               "shared_bytes": 0, "kinds": {"dup": 10, "plain": 90}} for i in range(n)]

    def run(style: str, system: str, pool: int, tpool: int = 0, payload: int | None = None,
            restore: float = 1.0) -> dict:
        r = {"style": style, "system": system, "ok": True, "swapped_out_bytes": 200 * PAGE,
             "pool_bytes": pool + tpool, "template_pool_bytes": tpool,
             "sandbox_pool_bytes": pool, "stats_after": {"same_pages": 3},
             "restore_s": restore, "restored_pages": 200, "load_p50_us": 5.0,
             "load_p99_us": 50.0, "swapout_s": 1.0, "bad_pages": 0}
        if payload is not None:
            r["sandbox_payload_bytes"] = payload
        if system.startswith("azswap"):
            r.update(meta_bytes=4 * PAGE, owners=owners)
        return r

    return {
        "manifest": {"time": "t", "mem_mib": 384, "size": "default"}, "vms": vms,
        "template_nonzero_pages": 900, "npages": 1024, "kernel": "k", "cpus": 2,
        "runs": [
            run("private", "zram-lz4", 100 * PAGE, payload=95 * PAGE, restore=2.0),
            run("private", "azswap-lz4", 40 * PAGE, 300 * PAGE, payload=60 * PAGE, restore=2.5),
            run("anon", "zram-lz4", 900 * PAGE, payload=880 * PAGE),
            run("anon", "azswap-lz4", 50 * PAGE, 300 * PAGE, payload=60 * PAGE),
            {"style": "anon", "system": "zswap-lz4", "error": "boom"},
        ],
    }


def test_views_arithmetic() -> None:
    live = _live()
    lim = {"results": {"max-effort-lz4": {"label": "unlimited search, lz4", "ratio": 4.0,
                                     "sandbox_orig_bytes": 200 * PAGE,
                                     "sandbox_stored_bytes": 50 * PAGE,
                                     "sandbox_kinds": {"dup": 5}}}}
    owned = microvm_report.owned_view(live, lim)
    zr = next(x for x in owned if x["system"] == "zram-lz4")
    az = next(x for x in owned if x["system"] == "azswap-lz4")
    assert zr["ratio_pool"] == pytest.approx(2.0)
    assert az["ratio_pool"] == pytest.approx(5.0)
    assert az["vs_zram_lz4_pool"] == pytest.approx(2.5)
    # bytes saved: (200 - 40) vs zram's (200 - 100)
    assert az["saved_vs_zram_lz4"] == pytest.approx(1.6)
    assert az["ratio_payload"] == pytest.approx(200 / 60)
    assert az["pct_of_limit"] == pytest.approx(100 * (200 / 60) / 4.0)
    assert az["owner_bytes"] == 60 * PAGE
    fleet = {(x["style"], x["system"]): x for x in microvm_report.fleet_view(live, (2, 32))}
    f = fleet[("private", "azswap-lz4")]
    # template raw (900 pages) + pool (340) + meta (4)
    assert f["spent_bytes"] == (900 + 340 + 4) * PAGE
    assert f["fleet"] == pytest.approx(2000 / 1244)
    # the projection at the recorded N reproduces the measurement
    assert f["projected"]["2"] == pytest.approx(f["fleet"])
    assert f["projected"]["32"] > f["fleet"]
    a = fleet[("anon", "zram-lz4")]
    assert a["spent_bytes"] == 900 * PAGE and a["fixed_bytes"] == 0
    assert a["projected"]["32"] == pytest.approx(a["fleet"])
    assert ("anon", "zswap-lz4") not in fleet
    rest = microvm_report.restore_view(live)
    r = next(x for x in rest if x["style"] == "private" and x["system"] == "azswap-lz4")
    assert r["vs_zram_lz4"] == pytest.approx(1.25)
    md = microvm_report.markdown(live, owned, list(fleet.values()), rest, (2, 32))
    assert "## Owned pages" in md and "## Fleet" in md and "ERROR: boom" in md


def test_fleet_template_metadata_is_fixed_only_when_measured_apart() -> None:
    live = _live()
    run = next(r for r in live["runs"] if r["style"] == "anon" and r["system"] == "azswap-lz4")
    run.update(stats_before={"meta": 1 * PAGE}, stats_after_template={"meta": 3 * PAGE})
    old = {(x["style"], x["system"]): x for x in microvm_report.fleet_view(live, (2, 32))}
    a = old[("anon", "azswap-lz4")]
    assert a["template_meta_bytes"] == 0  # an old run: every metadata byte is per VM
    assert a["fixed_bytes"] == 300 * PAGE and a["per_vm_bytes"] == (50 + 4) * PAGE / 2
    run["meta_order"] = "sandboxes-first"
    new = {(x["style"], x["system"]): x for x in microvm_report.fleet_view(live, (2, 32))}
    b = new[("anon", "azswap-lz4")]
    assert b["template_meta_bytes"] == 2 * PAGE
    assert b["fixed_bytes"] == 302 * PAGE and b["per_vm_bytes"] == (50 + 2) * PAGE / 2
    assert b["spent_bytes"] == a["spent_bytes"] and b["fleet"] == a["fleet"]
    assert b["projected"]["2"] == pytest.approx(b["fleet"])
    assert b["projected"]["32"] > a["projected"]["32"]


def test_fleet_private_reclaim_counts_the_image_once() -> None:
    """private-reclaim: the image's resident residue and its swap cost are fixed; the image
    read-back is its own restore row, compared with zram-lz4's in the same guest."""
    live = _live()
    img = {"pages": 900, "shmem_bytes": 900 * PAGE, "shmem_after_reclaim": 10 * PAGE,
           "pool_bytes": 6 * PAGE, "meta_bytes": 2 * PAGE, "reclaim_s": 0.5,
           "restore_s": 3.0, "bad_pages": 0}
    zimg = dict(img, pool_bytes=450 * PAGE, meta_bytes=0, restore_s=2.0)
    az = {"style": "private-reclaim", "system": "azswap-lz4", "ok": True,
          "swapped_out_bytes": 200 * PAGE, "pool_bytes": (40 + 300 + 6) * PAGE,
          "template_pool_bytes": 300 * PAGE, "sandbox_pool_bytes": 40 * PAGE,
          "meta_bytes": 12 * PAGE, "stats_after": {}, "restore_s": 1.0, "restored_pages": 200,
          "load_p50_us": 5.0, "load_p99_us": 50.0, "swapout_s": 1.0, "bad_pages": 0,
          "image": img}
    zr = dict(az, system="zram-lz4", pool_bytes=(100 + 450) * PAGE, template_pool_bytes=0,
              sandbox_pool_bytes=100 * PAGE, image=zimg)
    del zr["meta_bytes"]
    live["runs"] += [az, zr]
    fleet = {(x["style"], x["system"]): x for x in microvm_report.fleet_view(live, (2, 32))}
    a = fleet[("private-reclaim", "azswap-lz4")]
    # resident residue (10) + everything in swap (346) + metadata (12)
    assert a["spent_bytes"] == (10 + 346 + 12) * PAGE
    assert a["template_page_cache_bytes"] == 10 * PAGE
    assert a["image_swap_bytes"] == 8 * PAGE
    # fixed: residue + image in swap + bases; the rest (40 pool + 10 meta) is per VM
    assert a["fixed_bytes"] == (10 + 8 + 300) * PAGE
    assert a["per_vm_bytes"] == (40 + 10) * PAGE / 2
    assert a["projected"]["2"] == pytest.approx(a["fleet"])
    z = fleet[("private-reclaim", "zram-lz4")]
    assert z["spent_bytes"] == (10 + 550) * PAGE and z["fixed_bytes"] == (10 + 450) * PAGE
    rest = microvm_report.restore_view(live)
    ri = next(x for x in rest if x["style"] == "private-reclaim (image)"
              and x["system"] == "azswap-lz4")
    assert ri["pages"] == 900 and ri["vs_zram_lz4"] == pytest.approx(1.5)
    assert ri["p50_us"] is None
    md = microvm_report.markdown(live, microvm_report.owned_view(live, {"results": {}}),
                                 list(fleet.values()), rest, (2, 32))
    assert "private-reclaim (image)" in md and "template image in swap MiB" in md


@pytest.mark.skipif(not default_lib_path().exists(), reason="make hostlib first")
def test_limit_on_a_small_recording(record: ModuleType, tmp_path: Path) -> None:
    results = _fake_recording(tmp_path, record)
    record.write_trace(tmp_path, results, {"style": "microvm-snapshot"})
    lim = microvm_report.limit_figures(tmp_path / "microvm.aztrace")
    res = lim["results"]
    # edited pages are template deltas, so the store beats per-page lz4 on owned pages
    assert res["max-effort-lz4"]["ratio"] > 2 * res["lz4"]["ratio"]
    assert res["max-effort-lz4"]["sandbox_kinds"]["tdelta"] > 0
    # the per-VM per-page lz4 baseline adds up to the whole replay's
    per_vm = lim["per_vm_lz4"]
    assert set(per_vm) == set(lim["owned_pages"])
    assert sum(v["owned_bytes"] for v in per_vm.values()) == res["lz4"]["sandbox_orig_bytes"]
    assert sum(v["lz4_bytes"] for v in per_vm.values()) == res["lz4"]["sandbox_stored_bytes"]


def test_per_vm_view() -> None:
    live = _live()
    lim = {"per_vm_lz4": {"vm0": {"task": "train", "owned_bytes": 100 * PAGE,
                                  "lz4_bytes": 80 * PAGE},
                          "vm1": {"task": "eval", "owned_bytes": 100 * PAGE,
                                  "lz4_bytes": 50 * PAGE}}}
    rows = {x["vm"]: x for x in microvm_report.per_vm_view(live, lim)}
    assert rows["vm0"]["lz4_ratio"] == pytest.approx(1.25)
    # owners in _live(): 30 pages stored each, private azswap-lz4 only
    assert rows["vm1"]["systems"] == {"azswap-lz4": pytest.approx(100 / 30)}
    md = microvm_report.markdown(live, [], [], [], (2,), lim, list(rows.values()))
    assert "| vm1 | eval | 0.4 | 2.00 | 3.33 | 1.67 |" in md


def test_merge_live_tags_guests(tmp_path: Path) -> None:
    a, b = _live(), _live()
    b["runs"] = b["runs"][2:4]
    (tmp_path / "ga.json").write_text(json.dumps(a))
    (tmp_path / "gb.json").write_text(json.dumps(b))
    m = microvm_report.merge_live([tmp_path / "ga.json", tmp_path / "gb.json"])
    assert len(m["runs"]) == len(a["runs"]) + 2
    assert {r["guest"] for r in m["runs"]} == {"ga", "gb"}
    rest = microvm_report.restore_view(m)
    anon_az_b = next(x for x in rest if x["guest"] == "gb" and x["system"] == "azswap-lz4")
    assert anon_az_b["vs_zram_lz4"] == pytest.approx(1.0)  # against gb's own zram-lz4
    c = _live(3)
    (tmp_path / "gc.json").write_text(json.dumps(c))
    with pytest.raises(SystemExit):
        microvm_report.merge_live([tmp_path / "ga.json", tmp_path / "gc.json"])


def test_restore_pairs_each_run_with_the_zram_run_before_it() -> None:
    live = _live()
    r = next(x for x in live["runs"] if x["style"] == "private" and x["system"] == "zram-lz4")
    a = next(x for x in live["runs"] if x["style"] == "private" and x["system"] == "azswap-lz4")
    live["runs"] = [dict(a, restore_s=3.0), dict(r, restore_s=1.0), dict(a, restore_s=1.5),
                    dict(r, restore_s=2.0), dict(a, restore_s=2.5)]
    rest = microvm_report.restore_view(live)
    assert [x.get("vs_zram_lz4") for x in rest] == pytest.approx([3.0, 1.0, 1.5, 1.0, 1.25])


def test_restore_of_owned_pages_and_image_together() -> None:
    """private-reclaim: the image's read-back and the VMs' own pages also as one restore, paired
    with zram-lz4's sum in the same guest."""
    def run(system: str, owned_s: float, image_s: float) -> dict:
        return {"style": "private-reclaim", "system": system, "restore_s": owned_s,
                "restored_pages": 100, "load_p50_us": 1.0, "load_p99_us": 2.0, "swapout_s": 0.5,
                "bad_pages": 0, "ok": True,
                "image": {"restore_s": image_s, "pages": 50, "reclaim_s": 0.25, "bad_pages": 0}}

    live = {"runs": [run("zram-lz4", 1.0, 2.0), run("azswap-lz4", 1.5, 2.1)]}
    rows = {(x["style"], x["system"]): x for x in microvm_report.restore_view(live)}
    whole = rows[("private-reclaim (owned + image)", "azswap-lz4")]
    assert whole["restore_s"] == pytest.approx(3.6) and whole["pages"] == 150
    assert whole["vs_zram_lz4"] == pytest.approx(3.6 / 3.0)
    assert rows[("private-reclaim", "azswap-lz4")]["vs_zram_lz4"] == pytest.approx(1.5)
    assert rows[("private-reclaim (image)", "azswap-lz4")]["vs_zram_lz4"] == pytest.approx(1.05)


def test_composition_of_owned_pages(record: ModuleType, tmp_path: Path) -> None:
    results = _fake_recording(tmp_path, record)
    record.write_trace(tmp_path, results, {"style": "microvm-snapshot"})
    comp = microvm_report.composition(tmp_path / "microvm.aztrace")
    for n, r in enumerate(results):
        c = comp[f"vm{n}"]
        assert c["task"] == r.task and c["pages"] == r.info["owned_pages"]
        assert c["zero"] == r.info["owned_zero_pages"]
        assert c["zero"] + c["template_other_offset"] + c["other_vm"] + c["unique"] == c["pages"]


@pytest.mark.skipif(not default_lib_path().exists(), reason="make hostlib first")
def test_stream_bound_on_a_small_recording(record: ModuleType, tmp_path: Path) -> None:
    from bench import microvm_bound

    results = _fake_recording(tmp_path, record)
    stats = record.write_trace(tmp_path, results, {"style": "microvm-snapshot"})
    (tmp_path / "manifest.json").write_text(json.dumps({**stats, "pages": 64}))
    res = microvm_bound.bound(tmp_path, 3, per_task=True)
    groups = res["groups"]
    assert set(groups) == {"all", "train", "generate"}
    assert groups["train"]["vms"] == ["vm0"] and groups["all"]["vms"] == ["vm0", "vm1"]
    tmpl = (tmp_path / "template.ram").read_bytes()
    owned = 0
    for n in range(2):
        g = (tmp_path / f"vm{n}.ram").read_bytes()
        owned += PAGE * sum(g[k * PAGE : (k + 1) * PAGE] != tmpl[k * PAGE : (k + 1) * PAGE]
                            for k in range(64))
    assert groups["all"]["owned_bytes"] == owned
    assert groups["all"]["owned_bytes"] == sum(groups[t]["owned_bytes"]
                                               for t in ("train", "generate"))
    # most owned pages are template pages with 8 bytes changed: per-page lz4 cannot shrink the
    # random ones, the stream finds every one of them in the image
    a = groups["all"]
    assert a["zstd_vs_lz4"] > 5 and a["zstd_ratio"] > 5 * a["lz4_ratio"]
    assert "| all |" in microvm_bound.table(res)
    assert not list(tmp_path.glob("azbound-*"))  # the work directory is gone


def _manifest(tmp: Path, record: ModuleType, reporting: bool,
              order: int | None = None) -> list:
    """A fake recording in @tmp with the manifest record.py writes; its guests' results."""
    results = _fake_recording(tmp, record)
    _write_manifest(tmp, record, results, reporting, order)
    return results


def _write_manifest(tmp: Path, record: ModuleType, results: list, reporting: bool,
                    order: int | None = None) -> None:
    stats = record.write_trace(tmp, results, {"style": "microvm-snapshot"})
    (tmp / "manifest.json").write_text(json.dumps(
        {"n": 2, "task_mode": "inproc", "free_page_reporting": reporting,
         "page_reporting_order": order, **stats}))


def test_reporting_bench_reuses_only_matching_recordings(record: ModuleType,
                                                         tmp_path: Path) -> None:
    _manifest(tmp_path, record, True)
    assert microvm_reporting.matches(tmp_path, 2, "inproc", True, None)
    assert not microvm_reporting.matches(tmp_path, 2, "inproc", False, None)
    assert not microvm_reporting.matches(tmp_path, 2, "inproc", True, 0)
    assert not microvm_reporting.matches(tmp_path, 3, "inproc", True, None)
    assert not microvm_reporting.matches(tmp_path, 2, "fork", True, None)
    assert not microvm_reporting.matches(tmp_path / "none", 2, "inproc", True, None)
    args = microvm_reporting.recorder_args(tmp_path, 2, "fork", True, 0)
    assert args[-3:] == ["--free-page-reporting", "--page-reporting-order", "0"]
    args = microvm_reporting.recorder_args(tmp_path, 2, "fork", False, None)
    assert args[-1] == "--no-free-page-reporting" and "--free-page-reporting" not in args


@pytest.mark.skipif(not default_lib_path().exists(), reason="make hostlib first")
def test_reporting_bench_measures_and_compares(record: ModuleType, tmp_path: Path) -> None:
    off, on = tmp_path / "off", tmp_path / "on"
    off.mkdir()
    on.mkdir()
    _manifest(off, record, False)
    results = _manifest(on, record, True)
    _punch(on / "vm0.ram", 4)  # one page discarded, template unchanged
    _write_manifest(on, record, results, True)
    a, b = microvm_reporting.measure(off), microvm_reporting.measure(on)
    assert b["owned_bytes"] == a["owned_bytes"] + PAGE  # an owned zero page more ...
    assert b["owned_data_bytes"] == a["owned_data_bytes"]  # ... holding no data
    assert b["discarded_owned_bytes"] == PAGE and a["discarded_owned_bytes"] == 0
    assert b["guest_nonzero_bytes"] == a["guest_nonzero_bytes"] - PAGE
    tr = read_trace(off / "microvm.aztrace")
    for s in microvm_reporting.STRATEGIES:
        # what the host spends = everything the replay stored, by its own total ratio
        rep = rp.replay(tr, rp.STRATEGIES[s])
        everything = rep["sandbox_bytes"] + rep["template_bytes"]
        r = a["strategies"][s]
        assert r["spent_bytes"] == pytest.approx(everything / rep["total_ratio"])
        assert r["fleet"] == pytest.approx(a["guest_nonzero_bytes"] / r["spent_bytes"])
    assert a["strategies"]["all"]["spent_bytes"] < a["strategies"]["lz4"]["spent_bytes"]
    cmp = microvm_reporting.compare(a, b)
    assert cmp["reporting_alone"] == pytest.approx(1.0) and cmp["image_alone"] == 1.0
    lines = microvm_reporting.table(a, b, cmp)
    assert lines[2].startswith("| off |") and lines[3].startswith("| on |")


@pytest.mark.parametrize("argv", [
    ["--no-free-page-reporting", "--page-reporting-order", "3"],
    ["--page-reporting-order", "11"],
    ["--page-reporting-order", "-1"],
    ["--n", "0"],
    ["--workload", "web"],
    ["--size", "huge"],
])
def test_recorder_refuses_bad_options(record: ModuleType, argv: list[str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        record.parse_args(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_recorder_reports_free_pages_by_default(record: ModuleType) -> None:
    a = record.parse_args([])
    assert a.free_page_reporting and a.page_reporting_order is None
    assert not record.parse_args(["--no-free-page-reporting"]).free_page_reporting
    assert record.parse_args(["--page-reporting-order", "0"]).page_reporting_order == 0


def test_recorder_workloads_are_the_agents(record: ModuleType,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every workload the recorder offers is one the guest's agent builds, and every task it
    sends is one that workload runs."""
    agent = _load("agent")
    assert set(record.TASKS) == set(agent.WORKLOADS)
    assert record.parse_args([]).workload == "ml"
    assert record.parse_args(["--workload", "coding"]).workload == "coding"
    monkeypatch.syspath_prepend(str(TOP / "vm-tests" / "workloads"))
    for name, tasks in record.TASKS.items():
        assert set(tasks) <= set(agent.workload(name).TASK_FNS), name
        assert set(record.SIZES) == set(agent.workload(name).SIZES), name
    with pytest.raises(ValueError, match="unknown workload"):
        agent.workload("web")


def test_agent_runs_coding_tasks_in_process_and_as_tool_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's coding workload: a tiny state built, a task run in process (it adds to the
    history) and in a forked child (as --task-mode fork does); a task that fails in the child
    is reported as a failed tool call."""
    agent = _load("agent")
    monkeypatch.syspath_prepend(str(TOP / "vm-tests" / "workloads"))
    wl = agent.workload("coding")
    st = wl.build_state(1, "tiny")
    n = len(st.history)
    agent.run_task(wl, st, "search", 7)
    assert len(st.history) > n
    agent.tool_call(wl, st, "search", 7)  # raises if the child failed

    def broken(st: object, rng: object) -> None:
        raise RuntimeError("tool crashed")

    monkeypatch.setitem(wl.TASK_FNS, "search", broken)
    with pytest.raises(RuntimeError, match="tool call search failed"):
        agent.tool_call(wl, st, "search", 7)


class _Restored(Exception):
    """record.main went on to restore guests (a test's stand-in for QEMU)."""


@pytest.mark.parametrize(("recorded", "asked", "reused"), [
    ("ml", "coding", False),
    ("coding", "ml", False),
    ("coding", "coding", True),
    (None, "ml", True),  # a template.json from before workloads: ML
    (None, "coding", False),
])
def test_template_is_reused_only_for_its_workload(
        record: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], recorded: str | None, asked: str,
        reused: bool) -> None:
    img = record.image.Image(**{f: "x" for f in record.image.Image.__dataclass_fields__})
    monkeypatch.setattr(record.image, "build", lambda: img)
    monkeypatch.setattr(record.shutil, "which", lambda _: "/usr/bin/qemu-system-x86_64")

    def no_qemu(*_a: object, **_k: object) -> None:
        raise _Restored

    monkeypatch.setattr(record, "record_template", no_qemu)
    monkeypatch.setattr(record, "restore_guest", no_qemu)
    (tmp_path / "template.vmstate").write_bytes(b"")
    info = {"disk_key": img.key, "free_page_reporting": True, "page_reporting_order": None,
            "append": "x"}
    if recorded is not None:
        info["workload"] = recorded
    (tmp_path / "template.json").write_text(json.dumps(info))
    argv = ["--workload", asked, "--reuse-template", "--out", str(tmp_path), "--n", "1"]
    if reused:
        with pytest.raises(_Restored):
            record.main(argv)
    else:
        assert record.main(argv) == 2
        assert f"recorded with the {recorded or 'ml'} workload, not {asked}" in (
            capsys.readouterr().err)


def test_connect_unix_waits_for_the_socket(record: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "qmp.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def listen_late() -> None:  # QEMU creates its socket some time after it starts
        threading.Event().wait(0.5)
        srv.bind(str(path))
        srv.listen(1)

    t = threading.Thread(target=listen_late)
    t.start()
    try:
        sock = record.connect_unix(path, timeout=30.0)
        conn, _ = srv.accept()
        sock.sendall(b"x")
        assert conn.recv(1) == b"x"
        conn.close()
        sock.close()
    finally:
        t.join()
        srv.close()
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):  # no socket, no time left: the error, not a hang
        record.connect_unix(tmp_path / "never.sock", timeout=0.3)
    assert len(os.listdir("/proc/self/fd")) == fds  # every try's socket closed
