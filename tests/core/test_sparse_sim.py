"""Sparse similarity entries: a trust group whose similarity lookups find few bases gives entries
to 1 in ``sim_sample`` of its objects only, and all of them again once its sampled entries find
bases (kmod/core/index.c, "Sparse similarity entries"; docs/store.md, "Index bounds").

The host library judges a group once it counted 1,024 lookups (a sandbox put that is not a
duplicate is one), halving its counts after each judgement and starting afresh after a switch:
sparse below 1 similarity delta per 100 lookups, dense again from 1 per 50 (its sampled hits
scaled by the sample, at least 8 of them).
"""

from __future__ import annotations

import random

import pytest

from controlplane.trace.corelib import CoreError, Store
from tests.core import pages

WINDOW = 1024


def sparse_store(make_store, *, template: bool = False) -> tuple[Store, list[bytes]]:
    """Group 1 after 1,200 lookups that found nothing (sparse).  With ``template`` its first
    1,200 pages are a template's (stored before any lookup: all with entries until the switch).
    """
    s = make_store(1 << 14)
    s.add_sandbox(11, 1)
    first = pages.distinct(1200, 1000)
    if template:
        s.add_template(7, 1)
        for k, p in enumerate(first):
            s.put(k, p, owner=7, index=k)
        assert s.stats()["sim_waiting"] == 0
    for k, p in enumerate(pages.distinct(1200, 5000)):
        s.put(2000 + k, p, owner=11, index=k)
    s.drain()
    return s, first


def test_group_that_finds_nothing_turns_sparse(make_store):
    s, _ = sparse_store(make_store)
    st = s.stats()
    assert st["sim_sparse"] == 1 and st["sim_switches"] == 1
    # every object has its keys; about 7 in 8 wait for entries (the 1,024 stored before the
    # switch lost theirs to the regroup, the later ones were placed by their put)
    assert 0.8 * 1200 < st["sim_waiting"] < 0.95 * 1200, st["sim_waiting"]
    s.check()
    # the same pages with entries for every object: a similarity table 4-8 times larger
    d = make_store(1 << 14)
    d.set_sim_sample(1)
    d.add_sandbox(11, 1)
    for k, p in enumerate(pages.distinct(1200, 5000)):
        d.put(2000 + k, p, owner=11, index=k)
    d.drain()
    dense = d.stats()
    assert dense["sim_sparse"] == 0 and dense["sim_waiting"] == 0
    assert st["index_table_bytes"] < dense["index_table_bytes"]
    assert all(s.get(2000 + k) == p for k, p in enumerate(pages.distinct(1200, 5000)))


def near_duplicates(s: Store, tpages: list[bytes]) -> list[str | None]:
    """A sandbox's near-duplicates of the template's pages, at other page indexes (no template
    delta: only the similarity index finds their bases); the kind each was stored as."""
    rng = random.Random(5)
    kinds = []
    for k, p in enumerate(tpages):
        s.put(4000 + k, pages.mutate(p, rng, 4), owner=11, index=100000 + k)
        kinds.append(s.kind(4000 + k))
    return kinds


def test_sparse_group_turns_dense_when_its_samples_find_bases(make_store):
    """The sampled entries find 1 in 8 of the near-duplicates, which is plenty: the group turns
    dense, every waiting object gets its entries back (the template's too), and the
    near-duplicates of the unsampled pages are found as often as in a store never sparse."""
    s, tpages = sparse_store(make_store, template=True)
    st = s.stats()
    assert st["sim_sparse"] == 1
    assert st["sim_waiting"] > 0.8 * 2400
    kinds = near_duplicates(s, tpages)
    s.drain()
    st = s.stats()
    assert st["sim_sparse"] == 0 and st["sim_switches"] == 2 and st["sim_waiting"] == 0
    s.check()
    # before the switch (a judgement once the sparse state counted 1,024 lookups of its own,
    # 848 near-duplicates on) about 1 in 8 was found ...
    assert kinds[:800].count("xdelta") < 160, kinds[:800].count("xdelta")
    # ... after it, as many as with entries for every object all along
    d = make_store(1 << 14)
    d.set_sim_sample(1)
    d.add_sandbox(11, 1)
    d.add_template(7, 1)
    for k, p in enumerate(tpages):
        d.put(k, p, owner=7, index=k)
    for k, p in enumerate(pages.distinct(1200, 5000)):
        d.put(2000 + k, p, owner=11, index=k)
    always = near_duplicates(d, tpages)
    assert always[-300:].count("xdelta") > 250
    assert kinds[-300:].count("xdelta") >= always[-300:].count("xdelta") - 6
    assert all(s.get(k) == p for k, p in enumerate(tpages))


def test_groups_are_judged_apart(make_store):
    """Group 1 finds nothing and turns sparse; group 2, whose pages are near-duplicates of each
    other, stays dense and keeps finding them."""
    s = make_store(1 << 14)
    s.add_sandbox(11, 1)
    s.add_sandbox(21, 2)
    rng = random.Random(9)
    seeds = pages.distinct(80, 9000)
    for k, p in enumerate(pages.distinct(1200, 5000)):
        s.put(k, p, owner=11, index=k)
        s.put(2000 + k, pages.mutate(seeds[k % 80], rng, 4), owner=21, index=k)
    s.drain()
    st = s.stats()
    assert st["sim_sparse"] == 1 and st["sim_switches"] == 1
    s.check()
    s.put(5000, pages.mutate(seeds[3], rng, 4), owner=21, index=5000)
    assert s.kind(5000) in ("xdelta", "dup")


def test_sim_sample_setting(make_store):
    s, _ = sparse_store(make_store)
    assert s.sim_sample() == 8
    for bad in (0, 3, 65, 128):
        with pytest.raises(CoreError):
            s.set_sim_sample(bad)
    assert s.sim_sample() == 8
    # a sample of 4: the sparse group's entries follow the new sample
    s.set_sim_sample(4)
    s.drain()
    st = s.stats()
    assert st["sim_sparse"] == 1 and 0.65 * 1200 < st["sim_waiting"] < 0.85 * 1200
    s.check()
    # 1: never sparse, every group dense again, every object with entries
    s.set_sim_sample(1)
    s.drain()
    st = s.stats()
    assert st["sim_sparse"] == 0 and st["sim_waiting"] == 0 and st["sim_switches"] == 2
    s.check()
    # and it stays dense however little it finds
    for k, p in enumerate(pages.distinct(1200, 7000)):
        s.put(4000 + k, p, owner=11, index=4000 + k)
    s.drain()
    assert s.stats()["sim_sparse"] == 0


def test_waiting_objects_go_with_their_pages(make_store):
    s, _ = sparse_store(make_store, template=True)
    start = make_store(1 << 14)
    start.add_sandbox(11, 1)
    for k in range(1200):
        s.free(k)
        s.free(2000 + k)
    s.del_template(7)
    s.drain()
    st = s.stats()
    assert st["objects"] == 0 and st["sim_waiting"] == 0
    assert st["index_table_bytes"] == start.stats()["index_table_bytes"]
    s.check()
