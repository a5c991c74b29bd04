"""Redundancy store: dedup, template delta, similarity delta, refcounts, accounting."""

from __future__ import annotations

import errno
import random

import pytest

from controlplane.trace.corelib import PAGE_SIZE, CoreError, Store

from . import pages

T1, T2 = 100, 200  # templates of groups 1 and 2
A, B, C = 11, 12, 21  # sandboxes: A, B in group 1; C in group 2
U = 99  # never registered


def setup_groups(s: Store) -> None:
    s.add_template(T1, 1)
    s.add_template(T2, 2)
    s.add_sandbox(A, 1)
    s.add_sandbox(B, 1)
    s.add_sandbox(C, 2)


def check_accounting(s: Store) -> None:
    s.check()
    stt = s.stats()
    owners = s.list_owners()
    assert sum(o["pages"] for o in owners) == stt["pages_stored"]
    assert sum(o["exclusive_bytes"] + o["shared_bytes"] for o in owners) == stt["stored_bytes"]
    for k in stt["kind_pages"]:
        assert sum(o["kind_pages"][k] for o in owners) == stt["kind_pages"][k]
    assert sum(o["template_pages"] for o in owners) == stt["template_pages"]
    tb = sum(o["exclusive_bytes"] + o["shared_bytes"] for o in owners if o["is_template"])
    assert tb == stt["template_bytes"]
    unreg = next(o for o in owners if o["cgroup_id"] == 0)
    groups = s.group_stats()
    assert sum(g["pages"] for g in groups.values()) + unreg["pages"] == stt["pages_stored"]
    grouped = sum(g["exclusive_bytes"] + g["shared_bytes"] for g in groups.values())
    assert grouped + unreg["exclusive_bytes"] + unreg["shared_bytes"] == stt["stored_bytes"]
    assert stt["pool_bytes"] == stt["stored_bytes"]
    assert stt["cross_group"] == 0


def empty_everything(s: Store, slots) -> None:
    for i in slots:
        s.free(i)
    for o in s.list_owners():
        if o["is_template"] and o["registered"]:
            s.del_template(o["cgroup_id"])
    s.drain()
    stt = s.stats()
    assert stt["objects"] == 0, stt
    assert stt["pool_bytes"] == 0
    assert stt["bases"] == 0
    assert stt["template_pages"] == 0
    assert stt["deferred"] == 0
    check_accounting(s)


@pytest.fixture
def rs(make_store) -> Store:
    s = make_store(1024)
    setup_groups(s)
    return s


def test_registry_errors(rs):
    for fn, args, err in [
        (rs.add_sandbox, (A, 1), errno.EEXIST),
        (rs.add_template, (A, 1), errno.EEXIST),
        (rs.add_sandbox, (0, 1), errno.EINVAL),
        (rs.del_sandbox, (U,), errno.ENOENT),
        (rs.del_template, (A,), errno.ENOENT),  # a sandbox, not a template
        (rs.del_sandbox, (T1,), errno.ENOENT),
        (rs.owner_stats, (U,), errno.ENOENT),
        (rs.template_load, (A, 0, pages.make("text", 0)), errno.ENOENT),
        (rs.template_load, (U, 0, pages.make("text", 0)), errno.ENOENT),
    ]:
        with pytest.raises(CoreError) as e:
            fn(*args)
        assert e.value.errno == err, (fn, args)
    rs.del_sandbox(A)
    rs.add_sandbox(A, 1)
    assert rs.owner_stats(A)["registered"] == 1


def test_dedup_within_group(rs):
    p = pages.make("heap", 1)
    rs.put(0, p, owner=A)
    rs.put(1, p, owner=B)
    rs.put(2, p, owner=A)
    assert [rs.kind(i) for i in range(3)] == ["plain", "dup", "dup"]
    assert rs.stats()["objects"] == 1
    check_accounting(rs)
    # The creator frees its slot: the duplicates still read back.
    rs.free(0)
    rs.drain()
    assert rs.get(1) == p and rs.get(2) == p
    check_accounting(rs)
    empty_everything(rs, [1, 2])


def test_similarity_finds_a_relocated_page(rs):
    """A page whose pointers all moved by whole pages (another process's address-space layout)
    keeps its similarity features: it is stored as a delta against its twin, in its group only."""
    p = pages.make("heap", 6)
    moved = pages.relocate(p, 0x3F2A1000)
    rs.put(0, p, owner=A, index=3)
    rs.put(1, moved, owner=B, index=40)  # group 1: A's page is found
    rs.put(2, moved, owner=C, index=40)  # group 2: nothing to be found
    assert rs.kind(0) == "plain" and rs.kind(1) == "xdelta" and rs.kind(2) == "plain"
    assert rs.owner_stats(B)["exclusive_bytes"] * 2 < rs.owner_stats(C)["exclusive_bytes"]
    assert rs.get(0) == p and rs.get(1) == moved and rs.get(2) == moved
    check_accounting(rs)


def test_no_sharing_across_groups_or_unregistered(rs):
    p = pages.make("heap", 2)
    rs.put(0, p, owner=A)
    rs.put(1, p, owner=C)  # group 2
    rs.put(2, p, owner=U)  # unregistered
    rs.put(3, p, owner=U)
    rs.put(4, p, owner=0)
    assert [rs.kind(i) for i in range(5)] == ["plain"] * 5
    near = pages.mutate(p, random.Random(1), 2)
    rs.put(5, near, owner=C, index=7)
    rs.put(6, near, owner=U)
    # Slot 5 is a delta against C's own page (slot 1, group 2): C pays for that base as shared
    # bytes, A (group 1, holding the same page at slot 0) is nobody's base.
    assert rs.kind(5) == "xdelta"
    assert rs.owner_stats(C)["shared_bytes"] > 0
    assert rs.owner_stats(A)["shared_bytes"] == 0
    assert rs.kind(6) == "plain"
    for i, q in enumerate([p, p, p, p, p, near, near]):
        assert rs.get(i) == q
    check_accounting(rs)
    empty_everything(rs, range(7))


def kinds_of(s: Store, owner: int) -> dict[str, int]:
    return {k: v for k, v in s.owner_stats(owner)["kind_pages"].items() if v}


def test_trust_groups_isolate_near_and_exact_duplicates(rs):
    """Black box: a page whose only near or exact duplicate lives in the other trust group is
    stored plain (by the per-owner and per-group kind counts), both ways; the same copies from
    the same group are shared (so the pages used here are ones the store does share)."""
    rng = random.Random(8)
    # pages 0-7 get near copies, 8-15 exact ones (a near and an exact copy of one page would be
    # near each other, and the second may rightly share with the first in its own group)
    g1 = [pages.make("heap", 3000 + i) for i in range(16)]  # only in group 1 (A)
    g2 = [pages.make("heap", 4000 + i) for i in range(16)]  # only in group 2 (C)
    for i in range(16):
        rs.put(i, g1[i], owner=A, index=i)
        rs.put(100 + i, g2[i], owner=C, index=i)
    assert kinds_of(rs, A) == {"plain": 16} and kinds_of(rs, C) == {"plain": 16}
    want = {i: g1[i] for i in range(16)} | {100 + i: g2[i] for i in range(16)}
    # group 2 copies of group 1's pages, group 1 copies of group 2's, then group 1's (B) own
    for slot0, owner, src in ((200, C, g1), (300, A, g2), (400, B, g1)):
        for i in range(16):
            want[slot0 + i] = pages.mutate(src[i], rng, 3) if i < 8 else src[i]
            rs.put(slot0 + i, want[slot0 + i], owner=owner, index=5000 + slot0 + i)
        if owner == C:
            assert kinds_of(rs, C) == {"plain": 32}
        if owner == A:
            assert kinds_of(rs, A) == {"plain": 32}
            groups = rs.group_stats()
            for g in (1, 2):
                assert {k: v for k, v in groups[g]["kind_pages"].items() if v} == {"plain": 32}
                assert groups[g]["shared_bytes"] == 0
            assert rs.owner_stats(A)["shared_bytes"] == rs.owner_stats(C)["shared_bytes"] == 0
    # the control: B's copies of group 1's pages are shared with A's
    b = kinds_of(rs, B)
    assert b.get("dup") == 8 and b.get("xdelta", 0) >= 6, b
    assert rs.owner_stats(A)["shared_bytes"] > 0 and rs.owner_stats(C)["shared_bytes"] == 0
    for slot, page in want.items():
        assert rs.get(slot) == page, slot
    check_accounting(rs)
    empty_everything(rs, want)


def test_trust_groups_isolate_templates(rs):
    """Black box: a group-2 sandbox's page whose near or exact twin is only in group 1's
    template (same index) is stored plain; group 1's sandbox gets tdelta/dup against it."""
    rng = random.Random(9)
    tp = [pages.make("text", 7000 + i) for i in range(16)]
    for i, p in enumerate(tp):
        rs.template_load(T1, i, p)
    mine = [pages.mutate(p, rng, 3) if i < 8 else p for i, p in enumerate(tp)]
    t1 = rs.owner_stats(T1)
    for i in range(16):
        rs.put(i, mine[i], owner=C, index=i)
    assert kinds_of(rs, C) == {"plain": 16}
    assert rs.owner_stats(T1) == t1
    for i in range(16):
        rs.put(100 + i, mine[i], owner=A, index=i)
    a = kinds_of(rs, A)
    assert a.get("dup") == 8 and a.get("tdelta", 0) >= 6, a
    for i in range(16):
        assert rs.get(i) == rs.get(100 + i) == mine[i]
    check_accounting(rs)
    empty_everything(rs, [*range(16), *range(100, 116)])


def test_cross_group_never_shares_even_with_identical_templates(rs):
    rng = random.Random(4)
    base = [pages.make("heap", 100 + i) for i in range(16)]
    for i, b in enumerate(base):
        rs.template_load(T1, i, b)
    for i, b in enumerate(base):
        rs.put(i, pages.mutate(b, rng, 3), owner=C, index=i)  # group 2: no template
        rs.put(100 + i, b, owner=C, index=i)
    kinds = {rs.kind(i) for i in [*range(16), *range(100, 116)]}
    assert kinds <= {"plain", "dup", "xdelta"}  # dup/xdelta only among C's own pages
    for i in range(16):
        # Any sharing must be against C's own objects (group 2).
        assert rs.kind(i) in ("plain", "xdelta")
    assert rs.stats()["cross_group"] == 0
    check_accounting(rs)
    empty_everything(rs, [*range(16), *range(100, 116)])


@pytest.mark.parametrize("codec", [{"codec": 0}, {"codec": 1, "level": 3}])
def test_template_delta_survives_template_removal(make_store, codec):
    s = make_store(1024, **codec)
    setup_groups(s)
    rng = random.Random(2)
    tpages = [pages.make(["heap", "text"][i % 2], i) for i in range(32)]
    for i, p in enumerate(tpages):
        s.put(500 + i, p, owner=T1, index=i)  # a running template swaps out
    mine = {i: pages.mutate(p, rng, rng.randrange(1, 12)) for i, p in enumerate(tpages)}
    for i, p in mine.items():
        s.put(i, p, owner=A, index=i)
    kinds = [s.kind(i) for i in mine]
    assert kinds.count("tdelta") >= 28, kinds
    plain = sum(len(s.encode(p)) for p in mine.values())
    stt = s.stats()
    assert stt["template_pages"] == 32
    assert stt["bases"] >= 28
    check_accounting(s)
    # Template's slots go, then the template itself: bases live on.
    for i in range(32):
        s.free(500 + i)
    s.del_template(T1)
    s.drain()
    for i, p in mine.items():
        assert s.get(i) == p
    own = s.owner_stats(A)
    assert own["exclusive_bytes"] + own["shared_bytes"] < plain / 3
    check_accounting(s)
    empty_everything(s, list(mine))


def test_index_map(rs):
    """A private mapping of a snapshot at virtual page V: with the owner's index map, hints
    V + i reach the template's page i (tdelta, dup); outside the map, or once it is cleared,
    the hint is used as is; errors are clean."""
    rng = random.Random(5)
    snap = [pages.make("heap", 2000 + i) for i in range(16)]
    for i, p in enumerate(snap):
        rs.template_load(T1, 4 + i, p)
    virt = 0x7F0000000
    for fn, args, err in [
        (rs.set_map, (U, virt, 16, 4), errno.ENOENT),
        (rs.set_map, (0, virt, 16, 4), errno.EINVAL),
        (rs.set_map, (A, 2**64 - 8, 16, 4), errno.EINVAL),
        (rs.set_map, (A, virt, 16, 2**64 - 8), errno.EINVAL),
    ]:
        with pytest.raises(CoreError) as e:
            fn(*args)
        assert e.value.errno == err, (fn, args)
    rs.set_map(A, virt, 16, 4)
    want = {}
    for i, p in enumerate(snap):
        want[i] = pages.mutate(p, rng, 4)
        rs.put(i, want[i], owner=A, index=virt + i)
        want[100 + i] = p
        rs.put(100 + i, p, owner=A, index=virt + i)
    assert all(rs.kind(i) == "tdelta" for i in range(16))
    assert all(rs.kind(100 + i) == "dup" for i in range(16))
    # B has no map: the same hints find nothing; A's hints outside its map neither
    want[200] = pages.mutate(snap[0], rng, 4)
    rs.put(200, want[200], owner=B, index=virt)
    want[201] = pages.mutate(snap[1], rng, 4)
    rs.put(201, want[201], owner=A, index=virt - 3)
    rs.set_map(A, 0, 0, 0)  # cleared
    want[202] = pages.mutate(snap[2], rng, 4)
    rs.put(202, want[202], owner=A, index=virt + 2)
    assert "tdelta" not in [rs.kind(i) for i in (200, 201, 202)]
    # re-registering an owner clears its map
    rs.set_map(A, virt, 16, 4)
    rs.del_sandbox(A)
    rs.add_sandbox(A, 1)
    want[203] = pages.mutate(snap[3], rng, 4)
    rs.put(203, want[203], owner=A, index=virt + 3)
    assert rs.kind(203) != "tdelta"
    check_accounting(rs)
    for slot, p in want.items():
        assert rs.get(slot) == p, slot
    empty_everything(rs, list(want))


def test_snapshot_template_load(rs):
    rng = random.Random(3)
    snap = [pages.make("heap", 1000 + i) for i in range(64)]
    for i, p in enumerate(snap):
        rs.template_load(T1, i, p)
    rs.template_load(T1, 64, bytes(PAGE_SIZE))  # same-filled: nothing to keep
    assert rs.stats()["template_pages"] == 64
    assert rs.owner_stats(T1)["template_pages"] == 64
    for i, p in enumerate(snap):
        rs.put(i, pages.mutate(p, rng, 4), owner=A, index=i)
        rs.put(100 + i, p, owner=B, index=i)  # untouched page: a duplicate
    assert all(rs.kind(i) == "tdelta" for i in range(64))
    assert all(rs.kind(100 + i) == "dup" for i in range(64))
    check_accounting(rs)
    rs.del_template(T1)
    rs.drain()
    rng = random.Random(3)
    for i, p in enumerate(snap):
        assert rs.get(i) == pages.mutate(p, rng, 4)
        assert rs.get(100 + i) == p
    assert rs.stats()["template_pages"] == 0
    check_accounting(rs)
    empty_everything(rs, [*range(64), *range(100, 164)])


def test_template_chunks_shared_by_two_templates_of_a_group(rs):
    """The template index keeps 48 consecutive indexes of a group per 512-byte chunk: two
    templates of one group interleave in a chunk, dropping one leaves the other's entries (and
    their chunks), and a chunk goes with its last entry."""
    T3 = 101
    rs.add_template(T3, 1)
    rng = random.Random(7)
    idx = [*range(96), 10_000, 1 << 40]  # chunks: [0, 48), [48, 96), 2 lone ones
    snap = {i: pages.make("heap", 3000 + n) for n, i in enumerate(idx)}
    for i in idx:
        rs.template_load(T1 if i % 2 else T3, i, snap[i])
    st = rs.stats()
    assert st["template_pages"] == len(idx)
    assert st["tnode_bytes"] == 4 * 512
    assert rs.owner_stats(T3)["template_pages"] == 50  # even indexes, 10_000 and 1 << 40
    rs.del_template(T3)
    rs.drain()
    st = rs.stats()
    assert st["template_pages"] == 48  # T1's odd indexes
    assert st["tnode_bytes"] == 2 * 512  # the lone chunks held only T3's entries
    check_accounting(rs)
    for n, i in enumerate(idx):
        rs.put(n, pages.mutate(snap[i], rng, 4), owner=A, index=i)
        want = "tdelta" if i % 2 else "plain"
        assert rs.kind(n) == want, (i, rs.kind(n))
    rs.del_template(T1)
    rs.drain()
    assert rs.stats()["tnode_bytes"] == 0
    rng = random.Random(7)
    for n, i in enumerate(idx):
        assert rs.get(n) == pages.mutate(snap[i], rng, 4)
    empty_everything(rs, range(len(idx)))


def test_template_reload_replaces_entry(rs):
    a, b = pages.make("heap", 1), pages.make("heap", 2)
    rs.template_load(T1, 5, a)
    rs.template_load(T1, 5, b)
    assert rs.stats()["template_pages"] == 1
    rs.drain()
    assert rs.stats()["objects"] == 1
    rs.put(0, pages.mutate(b, random.Random(0), 2), owner=A, index=5)
    assert rs.kind(0) == "tdelta"
    empty_everything(rs, [0])


def test_similarity_delta_cross_sandbox(rs):
    rng = random.Random(5)
    src = [pages.make("heap", 2000 + i) for i in range(32)]
    for i, p in enumerate(src):
        rs.put(i, p, owner=A, index=i)
    # B's pages are near-duplicates at unrelated indexes (no template).
    near = {100 + i: pages.mutate(p, rng, 4) for i, p in enumerate(src)}
    for slot, p in near.items():
        rs.put(slot, p, owner=B, index=5000 + slot)
    kinds = [rs.kind(s) for s in near]
    assert kinds.count("xdelta") >= 24, kinds
    # The bases (A's pages) outlive A's slots.
    for i in range(32):
        rs.free(i)
    rs.drain()
    for slot, p in near.items():
        assert rs.get(slot) == p
    a = rs.owner_stats(A)
    assert a["pages"] == 0 and a["shared_bytes"] > 0  # creator keeps paying
    check_accounting(rs)
    empty_everything(rs, near)


def test_shifted_content_uses_dictionary_delta(rs):
    rng = random.Random(6)
    p = pages.make("text", 7)
    rs.template_load(T1, 0, p)
    q = pages.shift(p, rng)
    rs.put(0, q, owner=A, index=0)
    assert rs.kind(0) == "tdelta"
    assert rs.get(0) == q
    empty_everything(rs, [0])


def test_policy_switches_mechanisms_off(rs):
    p = pages.make("heap", 9)
    rs.template_load(T1, 0, p)
    rs.set_policy(dedup=0, tdelta=0, xdelta=0)
    rs.put(0, p, owner=A, index=0)
    rs.put(1, pages.mutate(p, random.Random(1), 2), owner=A, index=0)
    assert rs.kind(0) == "plain" and rs.kind(1) == "plain"
    rs.set_policy(dedup=1, tdelta=1, xdelta=0)
    rs.put(2, pages.mutate(p, random.Random(2), 2), owner=A, index=1)  # other index
    assert rs.kind(2) == "plain"
    rs.set_policy(xdelta=1)
    rs.put(3, pages.mutate(p, random.Random(3), 2), owner=A, index=1)
    assert rs.kind(3) == "xdelta"
    empty_everything(rs, range(4))


def test_delta_never_chains(rs):
    """Depth 1: a delta is never used as a base, even when it is the closest page."""
    rng = random.Random(8)
    p = pages.make("heap", 10)
    rs.template_load(T1, 0, p)
    q = pages.mutate(p, rng, 2)
    rs.put(0, q, owner=A, index=0)
    assert rs.kind(0) == "tdelta"
    r = pages.mutate(q, rng, 1)
    rs.put(1, r, owner=B, index=9)  # closest to q (a delta), similar to p
    assert rs.kind(1) in ("xdelta", "plain")
    rs.del_template(T1)
    rs.free(0)
    rs.drain()
    assert rs.get(1) == r
    empty_everything(rs, [1])


def test_removed_owner_keeps_reporting_until_empty(rs):
    p = pages.make("text", 3)
    rs.put(0, p, owner=A)
    rs.del_sandbox(A)
    ids = {o["cgroup_id"]: o for o in rs.list_owners()}
    assert ids[A]["registered"] == 0 and ids[A]["pages"] == 1
    rs.put(1, p, owner=A)  # unregistered now: no sharing, charged to bucket 0
    assert rs.kind(1) == "plain"
    check_accounting(rs)
    rs.free(0)
    rs.drain()
    assert A not in {o["cgroup_id"] for o in rs.list_owners()}
    empty_everything(rs, [1])


def test_many_owners_and_reuse(make_store):
    """1023 owners fit; entries come in chunks of 64 as owners are added (owner_bytes says so)."""
    s = make_store(64)
    chunk = s.stats()["owner_bytes"]  # entry 0's chunk only
    for i in range(1, 1024):
        s.add_sandbox(i, i % 7)
        assert s.stats()["owner_bytes"] == chunk * ((i + 1 + 63) // 64)
    for i in range(1, 1024, 97):  # every chunk's entries are usable
        s.put(7, pages.make("heap", i), owner=i)
        assert s.owner_stats(i)["pages"] == 1
        s.free(7)
    with pytest.raises(CoreError) as e:
        s.add_sandbox(5000, 1)
    assert e.value.errno == errno.ENOSPC
    s.del_sandbox(3)
    s.add_sandbox(5000, 1)  # reuses the idle entry
    assert s.owner_stats(5000)["group"] == 1
