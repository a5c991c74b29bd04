"""Multi-page objects in the kernel: after a sandbox's pages went to swap, writing `pack` makes
runs of its nearby PLAIN pages single objects; every page still reads back exactly (swap-in of
the whole region, compared in full), the store shrinks, and nothing is left after swapoff."""

from __future__ import annotations

from errno import EINVAL

import azswap_guest as ag
from aznl import Client

NPAGES = 4096
SEED = 91


def test_pack_after_swap_out_keeps_every_page(dev0, azpages, workers) -> None:
    assert dev0.write("pack", "1") == EINVAL  # no store before disksize
    dev0.swapon("256M", algo="zstd")
    nl = Client()
    try:
        cg = ag.Cgroup("pack-a")
        nl.request("SANDBOX_ADD", [("CGROUP_ID", cg.id), ("GROUP", 3)])
        w = ag.Worker(azpages, cg, NPAGES, seed=SEED)
        workers.append(w)
        ag.all_call(workers, "fill")
        ag.swap_all(w, cg)
        before, mm0 = dev0.wait_drained(), dev0.mm()
        assert before["packs"] == before["packed_pages"] == 0, before
        assert dev0.write("pack", "2") == EINVAL
        assert dev0.write("pack", "1") == 0
        after, mm1 = dev0.wait_drained(), dev0.mm()  # the packed pages' old objects gone
        assert after["packs"] > 0, (before, after)
        assert 2 * after["packs"] <= after["packed_pages"] <= 4 * after["packs"], after
        # one object per pack instead of one per page; fewer pool bytes
        assert after["objects"] <= before["objects"] - after["packed_pages"] + after["packs"]
        assert mm1["compr_data_size"] < mm0["compr_data_size"], (mm0, mm1)
        assert after["pages_stored"] == before["pages_stored"]
        # the region's pages are the sandbox's (and the worker's own memory too), save the
        # zero pages the swap core keeps out of the device from 6.12 on (its zero map)
        zero = ag.zero_pages(azpages, SEED, NPAGES)
        (own,) = nl.request("STATS_GET", [("CGROUP_ID", cg.id)])
        assert own["ST_PAGES"] >= NPAGES - zero, (zero, own)
        # a second pass finds nothing new
        assert dev0.write("pack", "1") == 0
        assert dev0.obj()["packs"] == after["packs"]

        ag.verify_all(workers)  # swap-in of every page, compared in full
        io = dev0.io()
        assert io["failed_loads"] == 0 and io["failed_stores"] == 0, io
    finally:
        nl.close()
    for w in workers:
        w.stop()
    workers.clear()
    dev0.swapoff()
    dev0.assert_empty_after_swapoff()
    end = dev0.obj()
    assert end["packs"] == end["packed_pages"] == 0, end
