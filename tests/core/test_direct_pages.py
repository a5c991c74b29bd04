"""Private pages without an object: a sparse trust group whose sandboxes' pages are not found as
duplicates of each other stores a sandbox's plain page that is not sampled in a DIRECT slot,
with no ``az_obj`` (kmod/core/index.c, "Private pages without an object"; docs/store.md).

Each group counts, beside its similarity lookups, the pages found as duplicates of its sandboxes'
own plain pages.  Once a second sandbox has made 512 lookups, a sparse group that found fewer
than 1 such duplicate per 100 lookups turns direct; duplicates of its sampled pages (scaled by
the sample, at least 8) from 1 per 50 lookups turn it back.
"""

from __future__ import annotations

import errno
import random

import pytest

from controlplane.trace.corelib import CoreError, Store
from tests.core import pages


def half_random(n: int, seed: int) -> list[bytes]:
    """Plain pages (half zeroes) that share nothing and gain nothing from packing."""
    rng = random.Random(seed)
    return [rng.randbytes(pages.PAGE // 2) + bytes(pages.PAGE // 2) for _ in range(n)]


def records(n: int, seed: int) -> list[bytes]:
    """Plain pages of JSON-lines records: each compresses alone, better packed together."""
    return [pages.make("records", seed + k) for k in range(n)]


def owner_sums(s: Store) -> int:
    return sum(o["exclusive_bytes"] + o["shared_bytes"] for o in s.list_owners())


SPLIT_DATA = pages.PAGE // 2 - 16  # the data a split object's first allocation holds


def free_all(s: Store, slots: dict[int, bytes]) -> None:
    """Free @slots, the store's only pages: nothing may be left charged, counted or allocated."""
    for k in slots:
        s.free(k)
    s.drain()
    st = s.stats()
    assert st["direct_pages"] == 0 and st["objects"] == 0 and st["stored_bytes"] == 0
    assert st["pool_bytes"] == 0, st["pool_bytes"]
    assert owner_sums(s) == 0
    s.check()


def is_direct(s: Store, slot: int, page: bytes, owner: int) -> bool:
    """Whether @slot holds @page without an object: freeing it takes one off direct_pages.
    The page is stored again as it was (a direct group decides by its hash bits)."""
    before = s.stats()["direct_pages"]
    s.free(slot)
    s.drain()
    was = s.stats()["direct_pages"] == before - 1
    s.put(slot, page, owner=owner, index=slot % 2000)
    assert s.stats()["direct_pages"] == before
    return was


def float_pages(n: int, seed: int) -> list[bytes]:
    """float32 weights that share nothing: bit-shuffled, each encodes to a split size."""
    return [pages.make("floats", seed + k) for k in range(n)]


def forked_fleet(
    make_store, sample: int = 8, make=pages.distinct, **pol: int
) -> tuple[Store, dict[int, bytes]]:
    """Group 1: three sandboxes whose pages (@make) share nothing, 1,200 pages each.  The first
    turns the group sparse; once the second has made 512 lookups the group, having found no
    sandbox's page as a duplicate, turns direct."""
    s = make_store(1 << 14, **pol)
    s.set_sim_sample(sample)
    stored: dict[int, bytes] = {}
    for i, cg in enumerate((11, 12, 13)):
        s.add_sandbox(cg, 1)
        for k, p in enumerate(make(1200, 10000 * (i + 1))):
            s.put(2000 * i + k, p, owner=cg, index=k)
            stored[2000 * i + k] = p
    s.drain()
    return s, stored


def test_a_group_whose_pages_no_sandbox_finds_stores_them_direct(make_store):
    s, stored = forked_fleet(make_store)
    st = s.stats()
    assert st["sim_sparse"] == 1 and st["sim_direct"] == 1
    # judged direct 1,024 lookups after the switch to sparse (176 + 848 of the second sandbox):
    # the rest of the second and all of the third, but for 1 in 8 sampled
    direct = st["direct_pages"]
    assert 0.8 * (352 + 1200) < direct < 0.95 * (352 + 1200), direct
    assert st["objects"] == 3600 and st["kind_pages"]["raw"] == 3600
    # no header for them: the metadata of the same pages all stored as objects is larger
    d, _ = forked_fleet(make_store, sample=1)
    dense = d.stats()
    assert dense["direct_pages"] == 0 and dense["sim_direct"] == 0
    assert st["obj_meta_bytes"] == dense["obj_meta_bytes"] - direct * s.obj_header_bytes()
    assert st["meta_bytes"] < dense["meta_bytes"] - direct * s.obj_header_bytes()
    s.check()
    # every page reads back; each owner is charged its pages' bytes
    assert all(s.get(k) == p for k, p in stored.items())
    assert owner_sums(s) == st["stored_bytes"]
    assert s.owner_stats(13)["exclusive_bytes"] == sum(s.slot_bytes(4000 + k) for k in range(1200))
    # freed, they are gone: nothing left charged, counted or allocated
    free_all(s, stored)


def test_duplicates_of_sandbox_pages_keep_them_objects(make_store):
    """A fleet whose sandboxes' pages are duplicates of each other's never turns direct: the
    second sandbox finds every one of the first's pages, and so does the fourth the third's."""
    s = make_store(1 << 14)
    for cg in (11, 12, 13, 14):
        s.add_sandbox(cg, 1)
    first, third = pages.distinct(1200, 10000), pages.distinct(1200, 30000)
    for k, p in enumerate(first):
        s.put(k, p, owner=11, index=k)
    for k, p in enumerate(first):
        s.put(2000 + k, p, owner=12, index=k)
    for k, p in enumerate(third):
        s.put(4000 + k, p, owner=13, index=k)
    for k, p in enumerate(third):
        s.put(6000 + k, p, owner=14, index=k)
    s.drain()
    st = s.stats()
    assert st["sim_sparse"] == 1 and st["sim_direct"] == 0 and st["direct_pages"] == 0
    assert all(s.kind(6000 + k) == "dup" for k in range(1200))
    assert all(s.get(6000 + k) == p for k, p in enumerate(third))
    s.check()


def test_duplicates_of_sampled_pages_turn_a_direct_group_back(make_store):
    """In a direct group only sampled pages are objects; duplicates found of them, scaled by
    the sample, are what every page would have found: plenty, so the group turns back and its
    new pages are objects again.  The pages stored direct meanwhile stay so and read back."""
    s, stored = forked_fleet(make_store)
    before = s.stats()
    assert before["sim_direct"] == 1
    s.add_sandbox(14, 1)
    # the third sandbox's pages again, 1,024 lookups' worth of new pages between them
    fresh = pages.distinct(1200, 40000)
    third = [stored[4000 + k] for k in range(1200)]
    for k in range(1200):
        s.put(6000 + 2 * k, third[k], owner=14, index=2 * k)
        s.put(6001 + 2 * k, fresh[k], owner=14, index=2 * k + 1)
    s.drain()
    st = s.stats()
    assert st["sim_direct"] == 0 and st["sim_switches"] > before["sim_switches"]
    # the last new pages after the switch back are all objects: no direct page among them
    assert st["direct_pages"] < before["direct_pages"] + 1200 * 7 // 8
    assert all(s.get(6000 + 2 * k) == third[k] for k in range(1200))
    assert all(s.get(6001 + 2 * k) == fresh[k] for k in range(1200))
    s.check()


def test_direct_pages_join_packs_and_go_back_when_packing_does_not_pay(make_store):
    s, _ = forked_fleet(make_store, codec=1, level=3)
    fleet = s.stats()["direct_pages"]
    s.add_sandbox(14, 1)
    text, half = records(256, 50000), half_random(256, 60000)
    for k, p in enumerate(text):
        s.put(8000 + k, p, owner=14, index=k)
    for k, p in enumerate(half):
        s.put(9000 + k, p, owner=14, index=1000 + k)
    s.drain()
    st = s.stats()
    assert st["sim_direct"] == 1
    direct_text = sum(1 for k in range(256) if s.kind(8000 + k) == "plain")
    assert s.kind(9000) == "plain"
    assert st["direct_pages"] > fleet + 0.8 * 512
    # the text pages pack (fewer bytes, a header per pack); the half-random ones do not, and
    # go back to their DIRECT slots
    packed = s.pack(8000, 256)
    assert packed > 0.9 * direct_text, (packed, direct_text)
    assert s.pack(9000, 256) == 0
    after = s.stats()
    assert after["packed_pages"] == packed
    # the packed ones (all but the sampled few were direct) are out of their DIRECT slots, the
    # half-random ones back in theirs
    assert 0 <= after["direct_pages"] - (st["direct_pages"] - packed) <= 256 // 4
    assert after["stored_bytes"] < st["stored_bytes"]
    assert after["meta_bytes"] < st["meta_bytes"] + (packed // 2) * s.obj_header_bytes()
    s.check()
    assert all(s.get(8000 + k) == p for k, p in enumerate(text))
    assert all(s.get(9000 + k) == p for k, p in enumerate(half))
    assert owner_sums(s) == after["stored_bytes"]


def test_sim_sample_1_ends_direct_groups(make_store):
    s, stored = forked_fleet(make_store)
    assert s.stats()["sim_direct"] == 1
    s.set_sim_sample(1)
    s.drain()
    before = s.stats()
    assert before["sim_direct"] == 0 and before["sim_sparse"] == 0
    for k, p in enumerate(pages.distinct(200, 70000)):
        s.put(7000 + k, p, owner=13, index=5000 + k)
    st = s.stats()
    assert st["direct_pages"] == before["direct_pages"]
    assert all(s.get(k) == p for k, p in stored.items())
    s.check()


@pytest.mark.parametrize("pol", [{}, {"codec": 1, "level": 3}], ids=["lz4", "zstd"])
def test_split_size_pages_stored_direct(make_store, pol):
    """A page encoding above 3/4 of a page takes two pool allocations; in a DIRECT slot the
    first one's handle, the second's read from it and checked against the slot's link bits."""
    s, stored = forked_fleet(make_store, make=float_pages, **pol)
    st = s.stats()
    assert st["sim_direct"] == 1
    split = [k for k in stored if s.kind(k) == "plain" and s.slot_bytes(k) > pages.PAGE * 3 // 4]
    assert st["direct_pages"] > 0.8 * (352 + 1200), st["direct_pages"]
    assert len(split) >= st["direct_pages"] - 8, (len(split), st["direct_pages"])
    d, _ = forked_fleet(make_store, sample=1, make=float_pages, **pol)
    obj = s.obj_header_bytes()
    assert st["obj_meta_bytes"] == d.stats()["obj_meta_bytes"] - st["direct_pages"] * obj
    # the same pool bytes, the link included, charged to their owners
    assert st["stored_bytes"] == d.stats()["stored_bytes"]
    assert owner_sums(s) == st["stored_bytes"]
    s.check()
    assert all(s.get(k) == p for k, p in stored.items())
    # two of the third sandbox's split pages that are DIRECT: freed, direct_pages drops;
    # stored again (not sampled: the same hash bits), they are DIRECT again
    proven = (k for k in reversed(split) if k >= 4000 and is_direct(s, k, stored[k], 13))
    direct = [next(proven), next(proven)]
    # a flip in either allocation's data (the first holds SPLIT_DATA bytes) is -EIO; stored
    # again, it reads back
    slot = direct[0]
    for off in (100, SPLIT_DATA + 100):
        s.corrupt(slot, off, 4)
        with pytest.raises(CoreError) as e:
            s.get(slot)
        assert e.value.errno == errno.EIO
        s.put(slot, stored[slot], owner=13, index=slot - 4000)
        assert s.get(slot) == stored[slot]
    # a flipped link is -EIO, never a wild handle; flipped back, all is well
    slot = direct[1]
    for bit in range(8):
        s.corrupt_link(slot, 1 << bit)
        with pytest.raises(CoreError) as e:
            s.get(slot)
        assert e.value.errno == errno.EIO
        s.corrupt_link(slot, 1 << bit)
        assert s.get(slot) == stored[slot]
    s.check()
    # freed, both allocations go: nothing left charged, counted or allocated
    free_all(s, stored)


def test_split_size_direct_pages_in_packs(make_store):
    """A pack pass gives split DIRECT pages objects: pages repeated next to each other (a
    direct group does not find them) pack; float pages, which do not fit a pack, go back to
    their DIRECT slots, links intact."""
    s, stored = forked_fleet(make_store, make=float_pages, codec=1, level=3)
    s.add_sandbox(14, 1)
    rng = random.Random(90000)
    twice = [p for _ in range(128) for p in [rng.randbytes(3300) + bytes(pages.PAGE - 3300)] * 2]
    for k, p in enumerate(twice):
        s.put(8000 + k, p, owner=14, index=k)
    s.drain()
    st = s.stats()
    split = [k for k in range(8000, 8256) if s.kind(k) == "plain" and s.slot_bytes(k) > 3072]
    assert len(split) > 0.8 * 256, len(split)
    packed = s.pack(8000, 256)
    assert packed > 0.6 * len(split), (packed, len(split))
    assert s.pack(4000, 1200) == 0
    s.drain()
    after = s.stats()
    assert after["packed_pages"] == packed
    assert after["stored_bytes"] < st["stored_bytes"]
    assert after["pool_bytes"] == after["stored_bytes"]  # no allocation left behind
    assert 0 <= after["direct_pages"] - (st["direct_pages"] - packed) <= 256 // 4
    s.check()
    assert all(s.get(8000 + k) == p for k, p in enumerate(twice))
    assert all(s.get(k) == p for k, p in stored.items())
    assert owner_sums(s) == after["stored_bytes"]
    free_all(s, stored | {8000 + k: p for k, p in enumerate(twice)})


def test_a_dense_spell_keeps_the_direct_judgement(make_store):
    """Direct is judged apart from sparse and dense: a group that turns dense (its sandboxes'
    pages found as near-copies) and then sparse again stores direct from the switch on, without
    being judged again."""
    s, stored = forked_fleet(make_store)
    assert s.stats()["sim_direct"] == 1
    s.add_sandbox(14, 1)
    rng = random.Random(5)
    for k in range(1200):
        s.put(6000 + k, pages.mutate(stored[4000 + k], rng), owner=14, index=k)
    dense = s.stats()
    assert dense["sim_sparse"] == 0 and dense["sim_direct"] == 0
    assert dense["kind_pages"]["xdelta"] > 100
    # pages that share nothing again: sparse after a window, and direct at once
    turned = first_direct = None
    for k, p in enumerate(pages.distinct(2048, 80000)):
        s.put(8000 + k, p, owner=14, index=2000 + k)
        st = s.stats()
        if turned is None and st["sim_sparse"]:
            turned = k
        if first_direct is None and st["direct_pages"] > dense["direct_pages"]:
            first_direct = k
    assert turned is not None and first_direct is not None
    assert turned <= first_direct <= turned + 32, (turned, first_direct)
    assert s.stats()["sim_direct"] == 1
    assert all(s.get(8000 + k) == p for k, p in enumerate(pages.distinct(2048, 80000)))
    s.check()


def test_a_gone_first_sandbox_does_not_open_the_gate(make_store):
    """The second-sandbox gate counts lookups of other owners than a group's first.  When the
    first is removed, the next owner is the first: alone, it does not turn the group direct."""
    s = make_store(1 << 14)
    s.set_sim_sample(8)
    s.add_sandbox(11, 1)
    for k, p in enumerate(pages.distinct(1200, 10000)):
        s.put(k, p, owner=11, index=k)
    s.del_sandbox(11)
    s.add_sandbox(12, 1)
    for k, p in enumerate(pages.distinct(2400, 20000)):
        s.put(2000 + k, p, owner=12, index=k)
    st = s.stats()
    assert st["sim_sparse"] == 1 and st["sim_direct"] == 0 and st["direct_pages"] == 0
    s.add_sandbox(13, 1)
    for k, p in enumerate(pages.distinct(1200, 30000)):
        s.put(5000 + k, p, owner=13, index=k)
    assert s.stats()["sim_direct"] == 1
    s.check()


def first_direct_put(s: Store, owner: int, ps: list[bytes], base: int, restart_at: int = -1) -> int:
    """Store @ps for @owner from slot @base; the index of the put after which its group is
    direct (-1: never).  At @restart_at, sim_sample goes from 8 to 4."""
    for k, p in enumerate(ps):
        if k == restart_at:
            s.set_sim_sample(4)
            s.drain()  # the sparse group's entries follow the new sample
        s.put(base + k, p, owner=owner, index=k)
        if s.stats()["sim_direct"]:
            return k
    return -1


def test_a_new_sample_restarts_the_judgement(make_store):
    """Duplicates and lookups counted under one sample say nothing of another: a new
    sim_sample starts a group's counts afresh, so its judgement waits for a window of lookups
    counted the new way."""
    turns = []
    for restart_at in (-1, 400):
        s = make_store(1 << 14)
        s.set_sim_sample(8)
        s.add_sandbox(11, 1)
        s.add_sandbox(12, 1)
        assert first_direct_put(s, 11, pages.distinct(1200, 10000), 0) == -1
        turns.append(first_direct_put(s, 12, pages.distinct(2400, 20000), 2000, restart_at))
        s.check()
    assert 0 < turns[0] < 1024, turns
    assert turns[1] >= 400 + 1023, turns  # a window of lookups from the 401st put
