"""Transparent huge pages of a registered sandbox: swap-out of a whole THP sends one bio of
512 subpages; every subpage must be charged to the sandbox's cgroup (the memcg sits on the head
page only) and must dedup and delta as its small pages would. Every page is verified on read-back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import azswap_guest as ag
import pytest
from aznl import Client

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
NPAGES = 2048  # 8 MiB: at least three whole 2 MiB huge pages
SEED = 77


@pytest.fixture
def thp_madvise() -> Iterator[None]:
    """THP for MADV_HUGEPAGE regions at least (Debian's default is "always")."""
    if not THP.exists():
        pytest.fail("the test kernel has no transparent huge pages")
    old = THP.read_text().split("[")[1].split("]")[0]
    if old == "never":
        THP.write_text("madvise")
    yield
    THP.write_text(old)


def _anon_huge_kib(pid: int) -> int:
    for ln in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if ln.startswith("AnonHugePages:"):
            return int(ln.split()[1])
    return 0


def _owner(nl: Client, cg: ag.Cgroup) -> dict[str, int]:
    (o,) = nl.request("STATS_GET", [("CGROUP_ID", cg.id)])
    return o


def test_thp_subpages_are_the_sandboxes(dev0, azpages, workers, thp_madvise) -> None:
    dev0.swapon("256M")
    vm_on = ag.vmstat()
    nl = Client()
    try:
        a, b = ag.Cgroup("thp-a"), ag.Cgroup("thp-b")
        for cg in (a, b):
            nl.request("SANDBOX_ADD", [("CGROUP_ID", cg.id), ("GROUP", 5)])
        # Two sandboxes with the same pages: b's must all be duplicates of a's.
        wa = ag.Worker(azpages, a, NPAGES, seed=SEED, thp=True)
        wb = ag.Worker(azpages, b, NPAGES, seed=SEED, thp=True)
        workers += [wa, wb]
        ag.all_call(workers, "fill")
        for w in workers:
            assert _anon_huge_kib(w.pid) >= 3 * 2048, f"{w.name}: not THP-backed"
        vm0 = ag.vmstat()
        ag.swap_all(wa, a)
        vm1 = ag.vmstat()
        assert vm1["thp_swpout"] - vm0["thp_swpout"] >= 3, "no THP was swapped out whole"

        # The worker's own (Python) memory is in the cgroup too: at least the region's pages,
        # save its zero pages from 6.12 on (a huge page split for swap-out loses them to the
        # swap core's zero map; one swapped out whole keeps them unless it is all zero).
        region_zero = ag.zero_pages(azpages, SEED, NPAGES)
        oa = _owner(nl, a)
        assert oa["ST_PAGES"] >= NPAGES - region_zero, (region_zero, oa)
        # Every swap entry the memcg holds is a's in the store, save zero pages the swap core
        # keeps out of the device on 6.12+: a THP subpage charged elsewhere shows up here.
        zero = vm1.get("swpout_zero", 0) - vm0.get("swpout_zero", 0)
        held = a.swap_current() // ag.PAGE
        assert oa["ST_PAGES"] >= held - zero, (held, zero, oa)
        # Unregistered cgroups' pages: swap's header (slot 0, written by mkswap, not a swap-out)
        # and what reclaim outside the test swapped out since swapon (kswapd may take a page
        # of the guest's own processes).
        (nobody,) = nl.request("STATS_GET", [("CGROUP_ID", 0)])
        ob_early = _owner(nl, b)["ST_PAGES"]
        written = vm1["pswpout"] - vm_on["pswpout"]
        others = written - oa["ST_PAGES"] - ob_early
        assert 1 <= nobody["ST_PAGES"] <= 1 + others, (written, nobody, oa)
        kinds = dev0.kinds()
        stored = oa["ST_PAGES"] + ob_early + nobody["ST_PAGES"]
        assert sum(kinds.values()) == stored, (kinds, stored)
        # Registered pages share: near-duplicates inside a become deltas, as small pages do.
        assert oa["ST_XDELTA"] + oa["ST_TDELTA"] > 0, oa

        ag.swap_all(wb, b)
        ob = _owner(nl, b)
        assert ob["ST_PAGES"] >= NPAGES - region_zero, (region_zero, ob)
        # Every page of b's region that is not same-filled found its twin in a's.
        distinct = sum(azpages.az_kind(SEED, i) >= 2 for i in range(NPAGES))
        assert ob["ST_DUP"] >= distinct, (distinct, ob)

        ag.verify_all(workers)  # swap-in of every page, compared in full
        io = dev0.io()
        assert io["failed_stores"] == 0 and io["failed_loads"] == 0, io
    finally:
        nl.close()
