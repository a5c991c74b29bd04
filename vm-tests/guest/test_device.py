"""azswap block device: load/unload, sysfs ABI (docs/sysfs-abi.md), block I/O, tracepoints.

Run inside the test kernel:
    vm-tests/run -- .venv/bin/pytest -q -p no:cacheprovider vm-tests/guest/test_device.py
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import random
import time
from pathlib import Path

import azswap_guest as ag
import pytest

EINVAL, EBUSY = errno.EINVAL, errno.EBUSY


def test_smoke_load_unload(module) -> None:
    module()
    d = ag.Dev(0)
    assert Path("/dev/azswap0").exists()
    assert d.read("disksize") == "0"
    assert d.read("initstate") == "0"
    assert d.write("disksize", "abc") == EINVAL
    assert d.read("disksize") == "0"
    assert not Path("/dev/azswap1").exists()
    ag.rmmod()
    assert not ag.loaded()
    assert not Path("/dev/azswap0").exists()


@pytest.mark.parametrize("n", ["0", "33", "-1", "x"])
def test_num_devices_out_of_range_refused(module, n: str) -> None:
    with pytest.raises(OSError):
        module(num_devices=n)
    assert not ag.loaded()


def test_num_devices(module) -> None:
    module(num_devices=3)
    for i in range(3):
        assert Path(f"/dev/azswap{i}").exists()
    assert not Path("/dev/azswap3").exists()


def test_selftest_param(module) -> None:
    """The self-test runs in the debug build only (make kmod-debug); the production module has
    no such parameter."""
    param = Path("/sys/module/azswap/parameters/selftest")
    module(ag.KO_DEBUG, selftest=1)
    assert ag.loaded() and param.read_text().strip() == "Y"
    ag.rmmod()
    module()
    assert ag.loaded() and not param.exists()


def test_deferred_frees_have_a_reclaim_workqueue(module) -> None:
    """Deferred frees run on a WQ_MEM_RECLAIM queue: its rescuer thread exists while the
    module is loaded (system_wq has none). The rescuer is named after the queue, from 6.8 as
    "kworker/R-<queue>" (/proc shows a workqueue thread's whole name)."""
    names = {"azswap_free", "kworker/R-azswap_free"}

    def rescuers() -> int:
        n = 0
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                with contextlib.suppress(OSError):
                    n += (p / "comm").read_text().strip() in names
        return n

    assert rescuers() == 0
    module()
    assert rescuers() == 1
    ag.rmmod()
    assert rescuers() == 0


def test_swapon_pins_module_and_device(dev0) -> None:
    d = dev0
    d.swapon("64M")
    assert d.path in ag.swaps()
    assert d.read("initstate") == "1"
    assert d.read("disksize") == str(64 << 20)
    # Swapped on: rmmod refused (the open device holds a module reference),
    # reset and disksize refused.
    r = ag.rmmod(check=False, settle=False)
    assert r.returncode != 0 and ag.loaded(), r.stderr
    assert d.write("reset", "1") == EBUSY
    assert d.write("disksize", "128M") == EBUSY
    assert d.read("disksize") == str(64 << 20)
    d.swapoff()
    assert d.write("reset", "1") == 0
    assert d.read("disksize") == "0" and d.read("initstate") == "0"
    # A device can be set up again after a reset.
    d.swapon("32M")
    d.swapoff()
    ag.rmmod()


def _aligned(n: int) -> mmap.mmap:
    return mmap.mmap(-1, n, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


# The slot table of a 16 MiB device: a leaf holds 64 slots (kmod/core/az_internal.h), the
# directory has a 16-byte entry per leaf's range.
LEAF_SLOTS = 64
DIR_BYTES = 16 * (16 << 20) // 4096 // LEAF_SLOTS


def test_block_io_roundtrip_partial_and_discard(dev0) -> None:
    d = dev0
    d.set("disksize", "16M")
    pages = 64
    data = bytearray()
    for i in range(pages):
        kind = i % 4
        if kind == 0:
            data += bytes(4096)
        elif kind == 1:
            data += (i.to_bytes(8, "little")) * 512
        elif kind == 2:
            data += (f"page {i} of the azswap block i/o test; " * 120).encode()[:4096]
        else:
            data += os.urandom(4096)
    fd = os.open(d.path, os.O_RDWR | os.O_DIRECT)
    try:
        buf = _aligned(len(data) + 4096)
        buf[: len(data)] = bytes(data)
        assert os.pwritev(fd, [memoryview(buf)[: len(data)]], 4096 * 10) == len(data)
        out = _aligned(len(data))
        assert os.preadv(fd, [memoryview(out)], 4096 * 10) == len(data)
        assert bytes(out) == bytes(data)
        # Never-written slots read as zeroes.
        assert os.preadv(fd, [memoryview(out)[:8192]], 4096 * 200) == 8192
        assert bytes(out[:8192]) == bytes(8192)

        # A 512-byte aligned buffer: every 4 KiB block spans two pages.
        before = d.io()["partial_io"]
        buf[512 : 512 + 3 * 4096] = bytes(data[: 3 * 4096])
        mv = memoryview(buf)[512 : 512 + 3 * 4096]
        assert os.pwritev(fd, [mv], 4096 * 100) == 3 * 4096
        assert os.preadv(fd, [memoryview(out)[: 3 * 4096]], 4096 * 100) == 3 * 4096
        assert bytes(out[: 3 * 4096]) == bytes(data[: 3 * 4096])
        buf[512 : 512 + 3 * 4096] = bytes(3 * 4096)
        assert os.preadv(fd, [mv], 4096 * 10) == 3 * 4096
        assert bytes(mv) == bytes(data[: 3 * 4096])
        assert d.io()["partial_io"] > before
    finally:
        os.close(fd)

    st = d.mm()
    assert st["orig_data_size"] >= (pages + 3) * 4096
    assert st["same_pages"] >= pages // 2  # zero and same-filled pages
    # meta_stat splits meta_bytes: the slot table is a 16-byte directory entry per 64 slots
    # and a 1 KiB leaf per 64-slot range in use (docs/sysfs-abi.md); the used entries per
    # page stored.
    meta = d.stat("meta_stat")
    leaves = len({slot // LEAF_SLOTS for slot in [*range(10, 10 + pages), 100, 101, 102]})
    assert meta["slot_bytes"] == DIR_BYTES + 16 * LEAF_SLOTS * leaves
    assert meta["slot_used_bytes"] == 16 * d.obj()["pages_stored"]
    parts = sum(v for k, v in meta.items() if k != "slot_used_bytes")
    assert parts == d.mm()["meta_bytes"]
    # Discard frees the slots: they read back as zeroes.
    ag.sh("blkdiscard", "-o", str(4096 * 10), "-l", str(4096 * pages), d.path)
    fd = os.open(d.path, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [memoryview(out)], 4096 * 10) == len(data)
        assert bytes(out) == bytes(len(data))
    finally:
        os.close(fd)
    assert d.obj()["pages_stored"] == 3
    # Write-zeroes frees too.
    ag.sh("blkdiscard", "-z", "-o", str(4096 * 100), "-l", str(4096 * 3), d.path)
    assert d.obj()["pages_stored"] == 0
    assert d.stat("meta_stat")["slot_bytes"] == DIR_BYTES  # no leaf left
    # I/O beyond the end fails cleanly.
    fd = os.open(d.path, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [memoryview(out)[:4096]], 16 << 20) == 0
    finally:
        os.close(fd)


# Every writable attribute with values that must be refused, and the errno.
BAD: dict[str, list[bytes]] = {
    "disksize": [
        b"",
        b"\n",
        b"abc",
        b"-1",
        b"0",
        b"12x",
        b"1M1",
        b" 1M",
        b"+-1",
        b"99999999999999999999999",
        b"18446744073709551615",
        b"16777216T",
        b"1" * 4000,
        b"0x1000",
    ],
    "mem_limit": [
        b"",
        b"abc",
        b"-1",
        b"1.5M",
        b"99999999999999999999999",
        b"16777216T",
        b"1" * 4000,
        b"M",
    ],
    "mem_used_max": [b"", b"1", b"-1", b"abc", b"99999999999999999999999"],
    "comp_algorithm": [
        b"",
        b"lzo",
        b"zstd:",
        b"zstd:0",
        b"zstd:10",
        b"zstd:-1",
        b"zstd:3x",
        b"lz4:1",
        b"LZ4",
        b"zstd:99999999999999999999",
        b"x" * 4000,
    ],
    "reset": [b"", b"0", b"2", b"-1", b"abc", b"99999999999999999999"],
    "dedup": [b"", b"2", b"-1", b"abc", b"99999999999999999999", b"1.0"],
    "tdelta": [b"", b"2", b"-1", b"yes"],
    "xdelta": [b"", b"2", b"-1", b"on"],
    "verify": [b"", b"2", b"-1", b"true"],
    "shuffle": [b"", b"2", b"-1", b"on"],
    "sim_effort": [b"", b"65", b"-1", b"abc", b"4294967296", b"99999999999999999999"],
    "delta_max_pct": [b"", b"0", b"101", b"-1", b"abc", b"4294967297"],
    "base_cache": [b"", b"65537", b"-1", b"abc", b"1M", b"4294967296", b"99999999999999999999"],
    "sim_slots": [b"", b"0", b"3", b"6", b"128", b"-1", b"abc", b"4294967296"],
    "sim_sample": [b"", b"0", b"3", b"6", b"128", b"-1", b"abc", b"4294967296"],
}
READ_ONLY = ["initstate", "mm_stat", "io_stat", "kind_stat", "obj_stat", "meta_stat"]


def _snapshot(d: ag.Dev) -> dict[str, str]:
    return {a: d.read(a) for a in BAD if a != "reset"}


@pytest.mark.parametrize("initialised", [False, True])
def test_bad_input_every_attribute(dev0, initialised: bool) -> None:
    d = dev0
    if initialised:
        d.set("disksize", "8M")
    before = _snapshot(d)
    for attr, values in BAD.items():
        for v in values:
            err = d.write(attr, v)
            if v == b"":
                # sysfs never calls the driver for a 0-byte write: it "succeeds"
                # and changes nothing (checked below).
                assert err == 0
            elif attr == "disksize" and initialised and err == EBUSY:
                pass  # initialised: EBUSY comes first for any value
            else:
                assert err == EINVAL, f"{attr} <- {v[:40]!r}: errno {err}, expected EINVAL"
            assert _snapshot(d) == before, f"{attr} <- {v[:40]!r} changed state"
    for attr in READ_ONLY:
        with pytest.raises(PermissionError):
            (d.sys / attr).write_text("1")
    # Good values are accepted and read back.
    for attr, good, shown in [
        ("mem_limit", "4M", str(4 << 20)),
        ("mem_limit", "0", "0"),
        ("comp_algorithm", "zstd:5", "zstd:5"),
        ("comp_algorithm", "zstd", "zstd:3"),
        ("comp_algorithm", "lz4\n", "lz4"),
        ("dedup", "0", "0"),
        ("dedup", "1", "1"),
        ("sim_effort", "64", "64"),
        ("delta_max_pct", "100", "100"),
        ("verify", "1", "1"),
        ("shuffle", "0", "0"),
        ("shuffle", "1", "1"),
        ("mem_used_max", "0", d.read("mem_used_max")),
        ("base_cache", "0", "0"),
        ("base_cache", "256", "256"),
        ("sim_slots", "64", "64"),
        ("sim_slots", "1", "1"),
        ("sim_sample", "64", "64"),
        ("sim_sample", "1", "1"),
        ("sim_sample", "8", "8"),
    ]:
        d.set(attr, good)
        assert d.read(attr) == shown, attr
    if not initialised:
        d.set("disksize", "1")  # rounded up to one page
        assert d.read("disksize") == "4096"


def test_codec_change_refused_with_pages_stored(dev0) -> None:
    d = dev0
    d.set("disksize", "8M")
    fd = os.open(d.path, os.O_WRONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, 4096)
        buf[:] = os.urandom(2048) * 2
        os.pwrite(fd, buf, 4096)
    finally:
        os.close(fd)
    assert d.obj()["pages_stored"] == 1
    assert d.write("comp_algorithm", "zstd") == EBUSY
    assert d.read("comp_algorithm") == "lz4"
    assert d.write("dedup", "0") == 0  # other knobs change live


def test_tracepoints(dev0) -> None:
    d = dev0
    ev = Path("/sys/kernel/tracing/events/azswap")
    assert (ev / "azswap_store").is_dir() and (ev / "azswap_load").is_dir()
    fmt = (ev / "azswap_load" / "format").read_text()
    for field in ("cgroup_id", "slot", "kind", "ns"):
        assert f" {field};" in fmt, fmt
    fmt = (ev / "azswap_store" / "format").read_text()
    for field in ("cgroup_id", "slot", "kind", "bytes"):
        assert f" {field};" in fmt, fmt
    tr = Path("/sys/kernel/tracing")
    (tr / "trace").write_text("")
    # Enabling an event through tracefs also hooks sched_switch and sched_wakeup to record
    # task names, which live-patches the scheduler's hottest text while both vCPUs run it.
    # Under multi-threaded TCG a 7.3 guest once died of it: "Oops: int3" in
    # ttwu_do_activate, on the idle CPU, with the site already holding the final jump (a
    # breakpoint executed after the patch had removed it; nothing of this module's on the
    # stack). Only the module's own tracepoints are under test: leave the scheduler's text
    # alone.
    record_cmd = tr / "options" / "record-cmd"
    saved = record_cmd.read_text().strip()
    record_cmd.write_text("0")
    (ev / "enable").write_text("1")
    try:
        d.set("disksize", "8M")
        fd = os.open(d.path, os.O_RDWR | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 4096)
            buf[:] = b"azswap trace " * 315 + b"0" * 1
            os.pwrite(fd, buf, 4096 * 5)
            os.preadv(fd, [memoryview(buf)], 4096 * 5)
        finally:
            os.close(fd)
        time.sleep(0.2)
        text = (tr / "trace").read_text()
    finally:
        (ev / "enable").write_text("0")
        record_cmd.write_text(saved)
    assert "azswap_store: dev=0" in text and "slot=5 kind=4" in text, text[-2000:]
    assert "azswap_load: dev=0" in text, text[-2000:]


def test_pool_compacts_itself_after_frees(dev0) -> None:
    """Freeing every other page leaves holes in zsmalloc's pages: the device compacts them."""
    import fcntl
    import struct

    d = dev0
    d.set("disksize", "64M")
    n = 8192  # 32 MiB of pages compressing to ~half: ~16 MiB of payload
    rng = random.Random(5)
    pages = [rng.randbytes(2048) + bytes(2048) for _ in range(n)]
    buf = _aligned(n * 4096)
    buf[:] = b"".join(pages)
    fd = os.open(d.path, os.O_RDWR | os.O_DIRECT)
    try:
        assert os.pwritev(fd, [memoryview(buf)], 0) == n * 4096
        before = d.mm()
        assert before["compacted_bytes"] == 0 and before["mem_used_total"] >= 15 << 20
        blkdiscard = 0x1277
        for i in range(0, n, 2):  # free every other page: half of each zspage
            fcntl.ioctl(fd, blkdiscard, struct.pack("QQ", i * 4096, 4096))
        deadline = time.monotonic() + 10  # the work runs <= 1 s after the last free
        pool0 = before["mem_used_total"]
        while d.mm()["mem_used_total"] >= pool0 * 0.75 and time.monotonic() < deadline:
            time.sleep(0.1)
        after = d.mm()
        assert after["compacted_bytes"] > 0, (before, after)
        assert after["mem_used_total"] < pool0 * 0.75, (before, after)
        out = _aligned(4096)
        for i in range(1, n, 2):  # the pages that stayed read back intact
            assert os.preadv(fd, [memoryview(out)], i * 4096) == 4096
            assert bytes(out) == pages[i], i
    finally:
        os.close(fd)
    assert d.write("compact", "2") == EINVAL
    assert d.write("compact", "1") == 0


def test_slot_lock_is_known_to_lockdep(dev0) -> None:
    """Under CONFIG_DEBUG_LOCK_ALLOC the slot bit lock is one lockdep class, az_slot_lock."""
    lockdep = Path("/proc/lockdep")
    if not lockdep.exists():
        pytest.skip("needs a lockdep kernel (vm-tests/run --debug-kernel)")
    dev0.set("disksize", "16M")
    fd = os.open(dev0.path, os.O_RDWR | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, 4096)
        buf.write(b"azswap" * 600)
        os.pwritev(fd, [buf], 4096)
        os.preadv(fd, [buf], 4096)
    finally:
        os.close(fd)
    assert "az_slot_lock" in lockdep.read_text()


@pytest.mark.parametrize("cached", [0, 1])
def test_swap_cache_keeps_the_copy_of_a_clean_page(module, cached: int) -> None:
    """swap_cache=1: a page read back goes through the swap cache and keeps its slot, so
    reclaiming it again while it is clean stores nothing; a page written meanwhile is stored
    again.  swap_cache=0 (the default): a swap-in frees the slot, as zram's does.  Every page
    is verified after every step."""
    npages = 2048
    module(swap_cache=cached)
    assert Path("/sys/module/azswap/parameters/swap_cache").read_text().strip() == "NY"[cached]
    d = ag.Dev(0)
    d.swapon("256M")
    lib = ag.build_azpages()
    cg = ag.Cgroup("swapcache")
    w = ag.Worker(lib, cg, npages, seed=7)
    # the region's pages azswap gets (from 6.12 the swap core keeps zero-filled ones itself);
    # the worker's own pages in the cgroup (its stack, what it wrote since the fork) add a few,
    # and swap's per-CPU slot caches hold back up to 63 slot frees each
    held = npages - ag.zero_pages(lib, 7, npages)
    slack = 64 * (os.cpu_count() or 1) + npages // 32
    try:
        w.call("fill")
        ag.swap_all(w, cg)
        before = d.io()
        ag.verify_all([w])  # reads every page: read faults
        read = d.io()
        assert read["loads"] - before["loads"] >= held - slack
        freed = read["notify_free"] - before["notify_free"]
        if cached:
            assert freed < slack, f"{freed} slots freed by reading {held} pages"
        else:
            assert freed >= held - slack, f"{freed} of {held} slots freed"
        cg.reclaim_all()
        again = d.io()
        stored = again["stores"] - read["stores"]
        if cached:
            assert stored < held // 8, f"{stored} stores for {held} clean pages"
        else:
            assert stored >= held - slack, f"{stored} stores for {held} pages"
        ag.verify_all([w])
        # every 4th page written: those are stored again (with swap_cache=1 into the slot they
        # kept, replacing the old copy), the others come back from their copies
        w.call("edit 1 4")
        cg.reclaim_all()
        end = d.io()
        rewritten = end["stores"] - again["stores"]
        assert rewritten >= npages // 4, f"{rewritten} stores for {npages // 4} written pages"
        if cached:
            kept = end["notify_free"] - again["notify_free"]
            assert kept < slack, f"{kept} slots freed by writing and reclaiming resident pages"
        ag.verify_all([w])
    finally:
        w.stop()
    d.swapoff()
    d.assert_empty_after_swapoff()


def test_swap_cache_param_refuses_a_bad_value(module) -> None:
    with pytest.raises(OSError, match="swap_cache"):
        module(swap_cache="maybe")
    assert not ag.loaded()
