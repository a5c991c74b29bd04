"""Decoded-base cache (kmod/core/bcache.c): admission on a second miss, hits, eviction, release
of pages that stop serving, invalidation, resizing, errors."""

from __future__ import annotations

import errno
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.trace.corelib import CoreError, Store

from . import pages
from .test_redundancy import T1, A, B, check_accounting, empty_everything, setup_groups

NB = 16  # template bases
ENTRY_BYTES = 8 + 1 + 8 + 4 * 4  # tag, bits, page pointer, four 32-bit ghosts
SWEEP = 1024  # base reads between sweeps, at least (AZ_BC_SWEEP_MIN)
START = 2  # pages the cache may hold before its first sweep, and at least (AZ_BC_START_PAGES)


def fan_out(s: Store, rng: random.Random, sandboxes: int = 2) -> dict[int, bytes]:
    """Template bases 0..NB-1 and, per sandbox, a near-copy of each: deltas against the bases."""
    want: dict[int, bytes] = {}
    base = [pages.make("heap", 500 + i) for i in range(NB)]
    for i, b in enumerate(base):
        s.template_load(T1, i, b)
    for k in range(sandboxes):
        for i, b in enumerate(base):
            p = pages.mutate(b, rng, 3)
            slot = 100 * (k + 1) + i
            s.put(slot, p, owner=(A, B)[k % 2], index=i)
            want[slot] = p
    return want


def serve(s: Store, want: dict[int, bytes], reads: int) -> None:
    """``reads`` loads of ``want``'s slots, round robin, every one checked."""
    slots = sorted(want)
    for k in range(reads):
        slot = slots[k % len(slots)]
        assert s.get(slot) == want[slot], slot


def serve_until(s: Store, want: dict[int, bytes], nbytes: int, windows: int = 12) -> None:
    """Serve ``want`` a sweep window at a time until the cache holds ``nbytes``: it grows by
    doubling, but a base whose set it shares with another one the cache has no page for yet
    may lose its page to it before it served, which costs a window (the set index comes from
    the object's address)."""
    for _ in range(windows):
        if s.stats()["base_cache_bytes"] == nbytes:
            return
        serve(s, want, SWEEP)
    assert s.stats()["base_cache_bytes"] == nbytes


def test_default_size_and_hits_on_shared_bases(make_store) -> None:
    """Bases two sandboxes' deltas share: the cache starts with START pages and doubles at each
    sweep while its pages all serve, until it holds every base (16: the fill limit of a small
    store), and then every load is a hit."""
    s = make_store(1024)
    setup_groups(s)
    assert s.base_cache() == 256 and s.stats()["base_cache_pages"] == 256
    empty = s.stats()["base_cache_bytes"]
    want = fan_out(s, random.Random(1))
    assert {s.kind(i) for i in want} == {"tdelta"}
    # Sandbox 1's encodings leave ghosts, sandbox 2's (each base's second miss) fill the
    # START pages the cache may hold before its first sweep.
    assert s.stats()["base_cache_bytes"] == empty + START * 4096
    serve_until(s, want, empty + NB * 4096)  # START -> 4 -> 8 -> 16 pages, all serving
    st0 = s.stats()
    serve(s, want, len(want))
    st1 = s.stats()
    assert st1["base_cache_hits"] - st0["base_cache_hits"] == len(want)  # every base is cached
    assert st1["base_cache_misses"] == st0["base_cache_misses"]
    check_accounting(s)
    empty_everything(s, want)


def test_off_and_tiny_caches_give_the_same_pages(make_store) -> None:
    rng = random.Random(2)
    for size, expect in ((0, 0), (4, 4), (7, 4), (9, 8)):
        s = make_store(1024)
        setup_groups(s)
        s.set_base_cache(size)
        assert s.base_cache() == expect
        want = fan_out(s, rng)
        for slot, p in want.items():
            assert s.get(slot) == p
        if size == 0:
            assert s.stats()["base_cache_hits"] == 0
        empty_everything(s, want)


def test_freed_bases_never_served_from_the_cache(make_store) -> None:
    """Bases die and their memory is reused: a stale cached copy must never be returned."""
    s = make_store(4096)
    setup_groups(s)
    rng = random.Random(3)
    for rnd in range(6):
        want = fan_out(s, rng)
        for slot, p in want.items():
            assert s.get(slot) == p, (rnd, slot)
        empty_everything(s, want)  # every base freed (objects == 0)
        s.add_template(T1, 1)  # removed by empty_everything: register again


def test_resize_while_in_use(make_store) -> None:
    s = make_store(1024)
    setup_groups(s)
    want = fan_out(s, random.Random(4))
    for size in (1024, 0, 16, 256):
        s.set_base_cache(size)
        for slot, p in want.items():
            assert s.get(slot) == p
    empty_everything(s, want)


def test_bad_size_is_refused_and_keeps_the_cache(store: Store) -> None:
    with pytest.raises(CoreError) as e:
        store.set_base_cache(65537)
    assert e.value.errno == errno.EINVAL
    assert store.base_cache() == 256
    store.set_base_cache(65536)
    assert store.base_cache() == 65536


OPS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 23), st.integers(0, 7)), max_size=120)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_random_interleavings_with_a_two_set_cache(make_store, ops) -> None:
    """Stores, frees, loads and template churn through an 8-page cache; every read is checked."""
    s = make_store(256)
    setup_groups(s)
    s.set_base_cache(8)
    rng = random.Random(5)
    base = [pages.make("heap", 700 + i) for i in range(8)]
    for i, b in enumerate(base):
        s.template_load(T1, i, b)
    have: dict[int, bytes] = {}
    for op, slot, idx in ops:
        if op == 0:
            p = pages.mutate(base[idx], rng, 2)
            s.put(slot, p, owner=A if slot % 2 else B, index=idx)
            have[slot] = p
        elif op == 1 and slot in have:
            s.free(slot)
            del have[slot]
        elif op == 2:
            for k, p in have.items():
                assert s.get(k) == p
        else:
            s.del_template(T1)  # bases live on while deltas use them
            s.drain()
            s.add_template(T1, 1)
            base[idx] = pages.make("heap", rng.randrange(1 << 30))
            for i, b in enumerate(base):
                s.template_load(T1, i, b)
    for k, p in have.items():
        assert s.get(k) == p
    check_accounting(s)
    empty_everything(s, list(have))


def test_cache_pages_are_bounded_by_what_is_stored(make_store) -> None:
    """Entries get a page only when filled, and at most max(16, pages stored / 1024) of them.

    64 template bases, each behind one delta. Sixteen of them read over and over fill 16
    pages; then all 64 read over and over never take more than 16 (the store holds far fewer
    than 16 Ki pages), and the cache's bytes say so. Every page still comes back right, from
    the cache or decoded.
    """
    s = make_store(1024)
    setup_groups(s)
    assert s.base_cache() == 256
    empty = s.stats()["base_cache_bytes"]
    assert empty == 256 * ENTRY_BYTES
    want = delta_fleet(s, 64, seed=7)

    def filled() -> int:
        extra = s.stats()["base_cache_bytes"] - empty
        assert extra % 4096 == 0
        return extra // 4096

    serve_until(s, {k: want[k] for k in sorted(want)[:16]}, empty + 16 * 4096)
    assert filled() == 16
    for _ in range(24):
        serve(s, want, 256)
        assert filled() <= 16
    assert s.stats()["base_cache_misses"] >= 64 - 16
    check_accounting(s)
    empty_everything(s, want)


def delta_fleet(s: Store, n: int, seed: int) -> dict[int, bytes]:
    """``n`` template bases, one sandbox delta against each (slots 200..), every base read once."""
    rng = random.Random(seed)
    want: dict[int, bytes] = {}
    for i in range(n):
        b = pages.make("heap", 900 + i)
        s.template_load(T1, i, b)
        p = pages.mutate(b, rng, 3)
        s.put(200 + i, p, owner=A, index=i)
        want[200 + i] = p
    assert {s.kind(i) for i in want} == {"tdelta"}
    return want


def test_a_base_read_once_takes_no_page(make_store) -> None:
    """A first miss only leaves a ghost: bases each read once (one sandbox's stores) cost the
    cache no page; the second read of each admits it (as many as the START pages a cache may
    hold before its first sweep), and the third is a hit."""
    s = make_store(1024)
    setup_groups(s)
    empty = s.stats()["base_cache_bytes"]
    want = delta_fleet(s, 8, seed=8)
    st = s.stats()
    assert st["base_cache_bytes"] == empty and st["base_cache_hits"] == 0
    for slot, p in want.items():
        assert s.get(slot) == p  # the second read: admitted
    st = s.stats()
    assert st["base_cache_bytes"] == empty + START * 4096 and st["base_cache_hits"] == 0
    for slot, p in want.items():
        assert s.get(slot) == p  # the third: served, those that got a page
    assert s.stats()["base_cache_hits"] == START
    check_accounting(s)
    empty_everything(s, want)


def test_pages_that_stop_serving_are_released(make_store) -> None:
    """Eight cached bases, then two sweep windows of reads that hit one of them only: the
    cache holds that base's page and no other, and its page limit falls back (what stops
    serving goes back, what serves stays, and is still right)."""
    s = make_store(1024)
    setup_groups(s)
    empty = s.stats()["base_cache_bytes"]
    want = delta_fleet(s, 8, seed=9)
    serve_until(s, want, empty + 8 * 4096)  # START -> 4 -> 8: all eight cached
    hot = 200
    for _ in range(2 * SWEEP + 1):
        assert s.get(hot) == want[hot]
    st = s.stats()
    assert st["base_cache_bytes"] == empty + 4096
    misses = st["base_cache_misses"]
    assert s.get(hot) == want[hot]
    assert s.stats()["base_cache_misses"] == misses  # the hot base is still served
    for slot, p in want.items():
        assert s.get(slot) == p  # the released ones decode again, right
    assert s.stats()["base_cache_misses"] == misses + 7
    serve(s, want, 3 * len(want))  # their second misses: one page more (limit 2 x 1 served)
    assert s.stats()["base_cache_bytes"] == empty + 2 * 4096
    check_accounting(s)
    empty_everything(s, want)
