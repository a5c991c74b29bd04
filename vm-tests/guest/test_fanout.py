"""Fan-out integrity: a template process and sandboxes forked from it, each in its own
cgroup, registered over netlink; everything swapped out with memory.reclaim and back, every page
verified; no sharing across trust groups; per-owner stats add up to the device's global stats."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import azswap_guest as ag
import pytest
from aznl import KINDS, Client

NPAGES = int(os.environ.get("AZSWAP_FANOUT_PAGES", "2048"))  # 8 MiB per process
N_SANDBOXES = 3


def _owner_sums(owners: list[dict]) -> dict[str, int]:
    s = {"pages": 0, "bytes": 0, **{k: 0 for k in KINDS}}
    for o in owners:
        s["pages"] += o["ST_PAGES"]
        s["bytes"] += o["ST_EXCLUSIVE_BYTES"] + o["ST_SHARED_BYTES"]
        for k in KINDS:
            s[k] += o[f"ST_{k.upper()}"]
    return s


def _check_sums(d: ag.Dev, nl: Client) -> list[dict]:
    # The per-owner and the global figures are read apart: they agree once nothing moves, i.e.
    # when the deferred frees (batched, 10 ms after the first) have run.
    d.wait_drained()
    owners = nl.request("STATS_GET", dump=True)
    sums = _owner_sums(owners)
    obj, mm, kinds = d.obj(), d.mm(), d.kinds()
    assert sums["pages"] == obj["pages_stored"], (sums, obj)
    assert sums["bytes"] == mm["compr_data_size"], (sums, mm)
    for k in KINDS:
        assert sums[k] == kinds[k], (k, sums, kinds)
    assert obj["cross_group"] == 0, obj
    return owners


# The index tables right after the first registration (8-byte pointers): 256 dedup buckets,
# 64 template buckets, 64 similarity sets of 4 ways (a 2-byte tag and a pointer each).
INDEX_TABLES_START = 256 * 8 + 64 * 8 + 64 * 4 * 10


def _index_tables(d: ag.Dev, grown: bool, timeout: float = 10) -> int:
    """The index tables' bytes once the deferred worker has grown them past their start
    (@grown) or brought them back to it."""
    end = time.monotonic() + timeout
    while True:
        n = d.stat("meta_stat")["index_table_bytes"]
        if (n > INDEX_TABLES_START) if grown else (n == INDEX_TABLES_START):
            return n
        assert time.monotonic() < end, f"index tables at {n} bytes, grown={grown} expected"
        time.sleep(0.05)


def test_fanout_integrity(dev0, azpages, workers) -> None:
    d = dev0
    d.set("base_cache", "4096")  # entries: bases several sandboxes' deltas read get pages
    d.swapon("256M", prio=100)
    nl = Client()
    try:
        tcg = ag.Cgroup("fan-template")
        scgs = [ag.Cgroup(f"fan-sb{i}") for i in range(N_SANDBOXES)]
        ocg = ag.Cgroup("fan-other")
        nl.request("TEMPLATE_ADD", [("CGROUP_PATH", tcg.rel), ("GROUP", 1)])
        for cg in scgs:
            nl.request("SANDBOX_ADD", [("CGROUP_PATH", cg.rel), ("GROUP", 1)])
        nl.request("SANDBOX_ADD", [("CGROUP_PATH", ocg.rel), ("GROUP", 2)])

        template = ag.Worker(azpages, tcg, NPAGES, seed=77)
        workers.append(template)
        template.call("fill")
        sandboxes = [template.fork(cg) for cg in [*scgs, ocg]]
        workers.extend(sandboxes)
        # Each sandbox rewrites a few words of every other page: those pages become its own
        # (copy-on-write, charged to its cgroup), near-duplicates of the template's.
        for v, sb in enumerate(sandboxes, start=1):
            sb.call(f"edit {v} 2")
        ag.verify_all(workers)

        # Template first: its pages become the bases; then the sandboxes.
        tcg.reclaim("1G")
        for cg in [*scgs, ocg]:
            cg.reclaim("1G")
        for cg in [tcg, *scgs, ocg]:
            assert cg.swap_current() > 0, f"{cg.path}: nothing swapped out"
        # The index tables grew with what was stored (the deferred worker doubles them and
        # moves the entries; the verifications below read through the moved indexes), and
        # stay below what a device of 256 MiB full of indexed pages gets.
        grown = _index_tables(d, grown=True)
        assert grown < 16384 * 8 + 1024 * 8 + 16384 * 4 * 10, grown
        owners = _check_sums(d, nl)
        by_id = {o["CGROUP_ID"]: o for o in owners}
        tkinds = {k: by_id[tcg.id][f"ST_{k.upper()}"] for k in KINDS}
        shared = sum(
            by_id[cg.id][f"ST_{k.upper()}"] for cg in scgs for k in ("dup", "tdelta", "xdelta")
        )
        other = {k: by_id[ocg.id][f"ST_{k.upper()}"] for k in KINDS}
        print(
            f"\ntemplate kinds {tkinds}\nsandboxes shared pages {shared}\n"
            f"other-group kinds {other}\nkind_stat {d.kinds()} mm {d.mm()} obj {d.obj()}"
        )
        assert by_id[tcg.id]["IS_TEMPLATE"] == 1
        # The group-1 sandboxes' pages are near-duplicates of template pages.
        assert shared > 0, "no dedup/delta found between sandboxes and their template"
        # The other trust group may only share with itself: its edited pages are near-
        # duplicates of group-1 pages, but it has no template, so no template delta.
        assert other["tdelta"] == 0
        assert d.obj()["base_cache_pages"] == 4096

        # Everything back in, every page checked, and again after a second round.
        ag.verify_all(workers)
        for cg in [tcg, *scgs, ocg]:
            cg.reclaim("1G")
        ag.verify_all(workers)
        _check_sums(d, nl)
        # Sandboxes 1 and 3 edited the same pages: their deltas read the same bases, in every
        # store and load. A base's second miss caches it, and later reads of it were served.
        assert d.obj()["base_cache_hits"] > 0 and d.obj()["base_cache_misses"] > 0

        # Removing the template keeps the sandboxes' deltas readable (bases live on).
        nl.request("TEMPLATE_DEL", [("CGROUP_ID", tcg.id)])
        for cg in [tcg, *scgs, ocg]:
            cg.reclaim("1G")
        ag.verify_all(workers)

        d.swapoff()
        ag.verify_all(workers)
        d.assert_empty_after_swapoff()
        assert d.obj()["sim_waiting"] == 0
        # With the pages gone the deferred worker has halved the tables back to their start.
        _index_tables(d, grown=False)
    finally:
        nl.close()


# A process in a cgroup whose pages share nothing (random bytes from a seed): it fills them,
# says "ready", and on any line read back checks every page and exits 0 if all match.
_RANDOM_PAGES = """
import mmap, random, sys
cg, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kind = sys.argv[4] if len(sys.argv) > 4 else "random"
# "floats": float32-like words, sign and low 24 bits random, the rest fixed: bit-shuffled,
# a page encodes to about 4/5 of a page (a split object: two pool allocations)
MASK = int.from_bytes(bytes([255, 255, 255, 128]) * 1024, "little")
EXP = int.from_bytes(bytes([0, 0, 0, 60]) * 1024, "little")
def page(i):
    b = random.Random(seed * 100003 + i).randbytes(4096)
    if kind == "floats":
        b = ((int.from_bytes(b, "little") & MASK) | EXP).to_bytes(4096, "little")
    return b
open(cg + "/cgroup.procs", "w").write("0")
m = mmap.mmap(-1, n * 4096)
for i in range(n):
    m[i * 4096:(i + 1) * 4096] = page(i)
print("ready", flush=True)
sys.stdin.readline()
bad = sum(m[i * 4096:(i + 1) * 4096] != page(i) for i in range(n))
print("bad", bad, flush=True)
sys.exit(1 if bad else 0)
"""


def _wait_obj(d: ag.Dev, ok, what: str, timeout: float = 20) -> dict[str, int]:
    end = time.monotonic() + timeout
    while True:
        o = d.obj()
        if ok(o):
            return o
        assert time.monotonic() < end, f"{what}: {o}"
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["random", "floats"])
def test_private_pages_without_objects(dev0, kind: str) -> None:
    """Two sandboxes of one trust group whose pages share nothing: the first turns the group
    sparse, and once the second has made 512 lookups without finding any of the first's pages
    the group turns direct: most of its later pages are stored in DIRECT slots, with no object
    header (obj_stat direct_pages); every page reads back and nothing is left after swapoff.
    Float pages are split-size (two pool allocations, the second's handle read from the first
    at the free, under the swap lock)."""
    d = dev0
    d.swapon("64M", prio=100)
    n = 1600
    nl = Client()
    procs: list[subprocess.Popen[str]] = []
    before = d.obj()["direct_pages"]  # any unregistered page swapped meanwhile is DIRECT too
    try:
        for i in range(2):
            cg = ag.Cgroup(f"direct-sb{i}")
            nl.request("SANDBOX_ADD", [("CGROUP_PATH", cg.rel), ("GROUP", 10)])
            proc = subprocess.Popen(
                [sys.executable, "-c", _RANDOM_PAGES, str(cg.path), str(n), str(7 + i), kind],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            cg.reclaim("1G")
            assert cg.swap_current() > (n // 2) * 4096, cg.swap_current()
        o = _wait_obj(d, lambda o: o["sim_direct"] >= 1, "group not direct")
        assert o["direct_pages"] - before > n // 8, o
        if kind == "floats":  # split-size: 3/4 to 15/16 of a page each
            mm = d.mm()
            assert 0.7 < mm["compr_data_size"] / mm["orig_data_size"] < 0.95, mm
        for proc in procs:
            out, _ = proc.communicate("check\n", timeout=300)
            assert proc.returncode == 0, out
        procs = []
        d.swapoff()
        d.assert_empty_after_swapoff()
        assert d.obj()["direct_pages"] == 0
    finally:
        for proc in procs:
            proc.kill()
        nl.close()


def test_sparse_similarity_entries(dev0) -> None:
    """A sandbox whose pages share nothing: its trust group's similarity lookups find no base,
    the group turns sparse and 7 in 8 of its objects give their similarity entries up (the
    deferred worker walks them); sim_sample 1 gives them back; every page reads back."""
    d = dev0
    d.swapon("64M", prio=100)
    n = 1600
    nl = Client()
    proc = None
    try:
        cg = ag.Cgroup("sparse-sb")
        nl.request("SANDBOX_ADD", [("CGROUP_PATH", cg.rel), ("GROUP", 9)])
        proc = subprocess.Popen(
            [sys.executable, "-c", _RANDOM_PAGES, str(cg.path), str(n), "5"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        cg.reclaim("1G")
        assert cg.swap_current() > (n // 2) * 4096, cg.swap_current()
        o = _wait_obj(
            d, lambda o: o["sim_sparse"] >= 1 and o["sim_waiting"] > n // 2, "group not sparse"
        )
        assert o["sim_switches"] >= 1
        # Every group dense again: the entries come back in the background.
        d.set("sim_sample", "1")
        _wait_obj(
            d,
            lambda o: o["sim_sparse"] == 0 and o["sim_waiting"] == 0,
            "entries not back with sim_sample 1",
        )
        d.set("sim_sample", "8")
        out, _ = proc.communicate("check\n", timeout=300)
        assert proc.returncode == 0, out
        proc = None
        d.swapoff()
        d.assert_empty_after_swapoff()
        assert d.obj()["sim_waiting"] == 0
    finally:
        if proc:
            proc.kill()
        nl.close()
