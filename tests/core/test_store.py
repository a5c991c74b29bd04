"""Store core, device-issue paths: SAME/PLAIN/RAW, codecs, limits, stats, corruption."""

from __future__ import annotations

import ctypes
import errno
import random
import threading

import lz4.block
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.trace.corelib import META_PARTS, PAGE_SIZE, CoreError, Ctx, Store

from . import pages

CODECS = [
    {"codec": 0},
    {"codec": 1, "level": 1},
    {"codec": 1, "level": 3},
    {"codec": 1, "level": 9},
]


def page_strategy() -> st.SearchStrategy[bytes]:
    generated = st.builds(pages.make, st.sampled_from(sorted(pages.KINDS)), st.integers(0, 2**32))
    near = st.builds(
        lambda k, s, e: pages.mutate(pages.make(k, s), random.Random(s), e),
        st.sampled_from(["text", "heap", "zero"]),
        st.integers(0, 2**32),
        st.integers(1, 64),
    )
    arbitrary = st.binary(min_size=PAGE_SIZE, max_size=PAGE_SIZE)
    return st.one_of(generated, near, arbitrary)


def check_stats(s: Store, live: dict[int, bytes]) -> None:
    stt = s.stats()
    assert stt["pages_stored"] == len(live)
    assert sum(stt["kind_pages"].values()) == len(live)
    assert stt["orig_bytes"] == len(live) * PAGE_SIZE
    # The host pool holds exactly the object bytes.
    assert stt["pool_bytes"] == stt["stored_bytes"]
    assert stt["cross_group"] == 0


@pytest.mark.parametrize("pol", CODECS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
@pytest.mark.parametrize("kind", sorted(pages.KINDS))
def test_roundtrip_kinds(make_store, pol, kind):
    s = make_store(64, **pol)
    expect = {"zero": "same", "same": "same", "random": "raw", "text": "plain", "heap": "plain"}
    for i in range(8):
        p = pages.make(kind, i)
        s.put(i, p)
        assert s.get(i) == p
        if kind in expect:
            assert s.kind(i) == expect[kind]
    check_stats(s, {i: b"" for i in range(8)})


FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURE_OK)
@given(data=st.lists(page_strategy(), min_size=1, max_size=12), codec=st.sampled_from(CODECS))
def test_roundtrip_property(make_store, data, codec):
    s = make_store(16, **codec)
    live: dict[int, bytes] = {}
    for i, p in enumerate(data):
        slot = i % 16
        s.put(slot, p)
        live[slot] = p
    for slot, p in live.items():
        assert s.get(slot) == p
    check_stats(s, live)
    for slot in live:
        s.free(slot)
    s.drain()
    stt = s.stats()
    assert stt["objects"] == 0 and stt["pool_bytes"] == 0 and stt["pages_stored"] == 0


def test_empty_and_bad_slots(store):
    assert store.get(5) == bytes(PAGE_SIZE)
    assert store.kind(5) is None
    store.free(5)  # freeing an empty slot is a no-op
    with pytest.raises(CoreError) as e:
        store.put(store.nr_slots, bytes(PAGE_SIZE))
    assert e.value.errno == errno.EINVAL
    with pytest.raises(CoreError) as e:
        store.get(store.nr_slots)
    assert e.value.errno == errno.EINVAL
    store.free(store.nr_slots + 10)


def test_overwrite_slot(store):
    a, b = pages.make("text", 1), pages.make("heap", 2)
    store.put(3, a)
    store.put(3, b)
    assert store.get(3) == b
    check_stats(store, {3: b})


def test_same_filled_any_word(store):
    rng = random.Random(7)
    for i in range(50):
        p = pages.same(rng)
        store.put(i, p)
        assert store.kind(i) == "same"
        assert store.get(i) == p
    assert store.stats()["objects"] == 0
    # One differing byte anywhere, including the first and last, is not same.
    for pos in (0, 7, 8, 2048, PAGE_SIZE - 1):
        p = bytearray(PAGE_SIZE)
        p[pos] = 1
        store.put(100, bytes(p))
        assert store.kind(100) != "same"
        assert store.get(100) == bytes(p)


def test_raw_threshold(store):
    rng = random.Random(3)
    # Half random, half zero: compresses to ~2 KiB -> plain.
    half = rng.randbytes(PAGE_SIZE // 2) + bytes(PAGE_SIZE // 2)
    store.put(0, half)
    assert store.kind(0) == "plain"
    # 80% random: above 3/4 of a page -> raw.
    most = rng.randbytes(PAGE_SIZE * 8 // 10) + bytes(PAGE_SIZE - PAGE_SIZE * 8 // 10)
    store.put(1, most)
    assert store.kind(1) == "raw"
    assert store.get(0) == half
    assert store.get(1) == most


@pytest.mark.parametrize("pol", CODECS[:2])
def test_mem_limit_enomem_nothing_lost(make_store, pol):
    s = make_store(512, **pol)
    s.set_mem_limit(64 * 1024)
    live: dict[int, bytes] = {}
    failed = 0
    for i in range(512):
        p = pages.make(["text", "heap", "random", "zero"][i % 4], i)
        try:
            s.put(i, p)
            live[i] = p
        except CoreError as e:
            assert e.errno == errno.ENOMEM
            assert s.kind(i) is None
            assert s.get(i) == bytes(PAGE_SIZE)
            failed += 1
    assert failed > 0
    stt = s.stats()
    assert stt["failed_stores"] == failed
    assert stt["pool_bytes"] <= 64 * 1024
    for i, p in live.items():
        assert s.get(i) == p
    # Same-filled pages need no allocation: they still go in when full.
    s.put(511, bytes(PAGE_SIZE))
    assert s.kind(511) == "same"
    check_stats(s, {**live, 511: b""})


def test_alloc_failure_keeps_the_old_block(store):
    """A write that cannot allocate leaves the slot as it was (block-device semantics): the
    new object is built before it replaces the old one."""
    p = pages.make("text", 1)
    store.put(1, p)
    store.fail_pool_allocs(2)  # both allocation phases fail
    with pytest.raises(CoreError) as e:
        store.put(1, pages.make("heap", 2))
    assert e.value.errno == errno.ENOMEM
    store.fail_pool_allocs(0)
    assert store.get(1) == p
    assert store.stats()["failed_stores"] == 1
    store.put(2, p)
    assert store.get(2) == p
    check_stats(store, {1: p, 2: p})


def test_alloc_failure_keeps_the_old_block_of_a_sandbox(store):
    """The same for a registered owner's object (the az_obj path, a delta base kept)."""
    store.add_sandbox(500, 1)
    p, q = pages.make("heap", 3), pages.make("heap", 4)
    store.put(7, p, owner=500)
    store.fail_pool_allocs(2)
    with pytest.raises(CoreError) as e:
        store.put(7, q, owner=500)
    assert e.value.errno == errno.ENOMEM
    store.fail_pool_allocs(0)
    assert store.get(7) == p
    store.put(7, q, owner=500)
    assert store.get(7) == q
    store.check()


def test_second_phase_allocation_retries(store):
    p = pages.make("text", 4)
    store.fail_pool_allocs(1)  # only the no-wait attempt fails
    store.put(1, p)
    assert store.get(1) == p
    store.fail_pool_allocs(0)


def test_policy_validation(store):
    bad = [
        {"codec": 2},
        {"codec": 1, "level": 0},
        {"codec": 1, "level": 10},
        {"dedup": 2},
        {"sim_effort": 65},
        {"delta_max_pct": 0},
        {"delta_max_pct": 101},
        {"verify": 3},
        {"shuffle": 2},
    ]
    before = store.policy()
    for b in bad:
        with pytest.raises(CoreError) as e:
            store.set_policy(**b)
        assert e.value.errno == errno.EINVAL
        assert store.policy() == before
    # Every knob changes live, the codec too: objects keep their own encoding.
    lz4_page, zstd_page = pages.make("text", 0), pages.make("text", 1)
    store.set_policy(codec=0)
    store.put(0, lz4_page)
    store.set_policy(codec=1, level=5, sim_effort=8, dedup=0)
    assert store.policy()["level"] == 5
    store.put(1, zstd_page)
    store.set_policy(codec=0)
    assert store.get(0) == lz4_page and store.get(1) == zstd_page
    store.free(0)
    store.free(1)
    store.drain()


@pytest.mark.parametrize("pol", CODECS[:2])
@pytest.mark.parametrize("kind", ["text", "heap", "random"])
def test_corrupted_object_rejected(make_store, pol, kind):
    s = make_store(8, **pol)
    p = pages.make(kind, 11)
    rng = random.Random(5)
    rejected = 0
    for _ in range(40):
        s.put(0, p)
        s.corrupt(0, rng.randrange(PAGE_SIZE), 1 << rng.randrange(8))
        # A flip may be harmless (a match offset moved onto equal bytes):
        # then the page is still right.  Otherwise the load must fail.
        try:
            assert s.get(0) == p
        except CoreError as e:
            assert e.errno == errno.EIO
            rejected += 1
    assert rejected >= 30
    assert s.stats()["failed_loads"] == rejected


def test_corruption_without_verify_never_crashes(make_store):
    s = make_store(8, verify=0)
    rng = random.Random(9)
    for trial in range(200):
        p = pages.make(["text", "heap"][trial % 2], trial)
        s.put(0, p)
        for _ in range(rng.randrange(1, 4)):
            s.corrupt(0, rng.randrange(PAGE_SIZE), rng.randrange(1, 256))
        try:
            s.get(0)
        except CoreError as e:
            assert e.errno == errno.EIO


@pytest.mark.parametrize("pol", CODECS[:2])
def test_decoder_rejects_truncated_and_garbage(make_store, pol):
    s = make_store(4, **pol)
    for kind in ("text", "heap"):
        p = pages.make(kind, 1)
        obj = s.encode(p)
        assert len(obj) < PAGE_SIZE
        assert s.decode(obj) == p
        for n in range(len(obj)):
            with pytest.raises(CoreError) as e:
                s.decode(obj[:n])
            assert e.value.errno == errno.EIO
        # Extra trailing bytes: the length field no longer matches.
        with pytest.raises(CoreError):
            s.decode(obj + b"\0")
        # A plain object must not be decoded as a delta and vice versa.
        with pytest.raises(CoreError):
            s.decode(obj, base=p)
    rng = random.Random(1)
    for _ in range(300):
        blob = rng.randbytes(rng.randrange(1, PAGE_SIZE + 1))
        try:
            s.decode(blob)
        except CoreError as e:
            assert e.errno == errno.EIO


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURE_OK)
@given(
    blob=st.binary(min_size=0, max_size=PAGE_SIZE),
    enc=st.integers(0, 13),
    with_base=st.booleans(),
)
def test_decoder_property_random_objects(store, blob, enc, with_base):
    # A well-formed header over arbitrary payload: must be EIO or a page.
    obj = bytes([enc, 1, len(blob) & 0xFF, len(blob) >> 8]) + blob
    try:
        out = store.decode(obj, base=bytes(PAGE_SIZE) if with_base else None)
        assert len(out) == PAGE_SIZE
    except CoreError as e:
        assert e.errno == errno.EIO


def check_delta_object(s, obj: bytes, base: bytes, page: bytes) -> None:
    """A delta object decodes to ``page`` with its base, and is EIO without it or truncated."""
    assert s.decode(obj, base=base) == page
    with pytest.raises(CoreError):
        s.decode(obj)
    for n in range(0, len(obj), 5):
        with pytest.raises(CoreError) as e:
            s.decode(obj[:n], base=base)
        assert e.value.errno == errno.EIO


@pytest.mark.parametrize("pol,enc", [({"codec": 0}, 6), ({"codec": 1, "level": 3}, 7)])
def test_shuffled_xor_delta_for_numeric_updates(make_store, pol, enc):
    """Float weights after a small update: the bit-shuffled XOR delta is chosen and exact."""
    s = make_store(4, **pol)
    rng = random.Random(3)
    base = pages.make("floats", 2)
    new = pages.nudge_floats(base, rng)
    obj = s.encode(new, base=base)
    assert obj[0] == enc, obj[0]
    plain_xor = len(s.encode(new))  # standalone, for scale
    assert len(obj) < plain_xor * 0.9
    check_delta_object(s, obj, base, new)
    # Through the store: template base, sandbox page, read back.
    s.add_template(100, 1)
    s.add_sandbox(11, 1)
    s.template_load(100, 5, base)
    s.put(0, new, owner=11, index=5)
    assert s.kind(0) == "tdelta" and s.get(0) == new
    # Sparse edits stay plain XOR (or dictionary) deltas: no shuffle needed.
    near = pages.mutate(base, rng, 3)
    assert s.encode(near, base=base)[0] in (3, 4, 5)


@pytest.mark.parametrize("pol,enc", [({"codec": 0}, 8), ({"codec": 1, "level": 3}, 9)])
def test_bit_shuffled_plain_for_float_pages(make_store, pol, enc):
    """float32 weights: neither codec gains on the bytes; the bit planes do (no base needed)."""
    s = make_store(4, **pol)
    p = pages.make("floats", 4)
    obj = s.encode(p)
    assert obj[0] == enc, obj[0]
    assert len(obj) < PAGE_SIZE * 15 // 16
    assert s.decode(obj) == p
    with pytest.raises(CoreError):
        s.decode(obj, base=p)  # not a delta: a base is refused
    for n in range(0, len(obj), 11):
        with pytest.raises(CoreError) as e:
            s.decode(obj[:n])
        assert e.value.errno == errno.EIO


def _bit_shuffle_reference(page: bytes) -> bytes:
    """The SHUF layout (docs/store.md) computed independently with numpy."""
    w = np.frombuffer(page, dtype="<u4").reshape(16, 32, 2)  # group, row, even/odd
    bits = (w[..., None] >> np.arange(32, dtype=np.uint32)) & 1  # group, row, half, bit
    planes = bits.transpose(3, 0, 2, 1).astype(np.uint8)  # bit, group, half, row
    return np.packbits(planes.reshape(32, -1), axis=1, bitorder="little").tobytes()


@pytest.mark.parametrize("seed", [4, 8])
def test_bit_shuffle_layout(store, seed):
    """An lz4 SHUF object holds exactly the documented bit planes of the page."""
    p = pages.make("floats", seed)
    obj = store.encode(p)
    assert obj[0] == 8, obj[0]
    planes = lz4.block.decompress(obj[4:], uncompressed_size=PAGE_SIZE)
    assert planes == _bit_shuffle_reference(p)
    assert store.decode(obj) == p


@pytest.mark.parametrize("pol", CODECS[:2])
def test_split_objects_for_registered_owners(make_store, pol):
    """Pages encoding above 3/4 of a page: split objects for sandboxes, raw for unregistered."""
    s = make_store(64, **pol)
    s.add_sandbox(11, 1)
    rng = random.Random(6)
    ps = [pages.floats(rng) for _ in range(16)]
    for i, p in enumerate(ps):
        s.put(i, p, owner=11, index=i)  # registered: encoded, in two pool allocations
        s.put(32 + i, p)  # unregistered (zram-like): raw above the threshold
    st = s.stats()
    assert st["kind_pages"]["plain"] >= 16, st["kind_pages"]
    own = s.owner_stats(11)
    assert PAGE_SIZE * 3 // 4 * 16 < own["exclusive_bytes"] + own["shared_bytes"] < 15 * PAGE_SIZE
    assert all(s.kind(32 + i) == "raw" for i in range(16))
    assert [s.get(i) for i in range(16)] == ps
    s.check()
    # A flip in a split object is caught (verify on), nothing else goes wrong.
    for trial in range(40):
        s.corrupt(trial % 16, rng.randrange(PAGE_SIZE), 1 << rng.randrange(8))
        with pytest.raises(CoreError) as e:
            s.get(trial % 16)
        assert e.value.errno == errno.EIO
        s.put(trial % 16, ps[trial % 16], owner=11, index=trial % 16)
    assert [s.get(i) for i in range(16)] == ps
    # A flipped link to the second half is -EIO, never a wild handle; flipped back, all is well.
    for bit in range(8):
        s.corrupt_link(3, 1 << bit)
        with pytest.raises(CoreError) as e:
            s.get(3)
        assert e.value.errno == errno.EIO
        s.corrupt_link(3, 1 << bit)
        assert s.get(3) == ps[3]
    with pytest.raises(CoreError) as e:
        s.corrupt_link(32, 1)  # unregistered: raw, not split
    assert e.value.errno == errno.ENOENT
    # Allocation failure of either half leaves the slot empty, never half-stored.
    for n in (1, 2, 3, 4):
        s.fail_pool_allocs(n)
        try:
            s.put(50, ps[0], owner=11, index=50)
        except CoreError as e:
            assert e.errno == errno.ENOMEM
            assert s.kind(50) is None
        else:
            assert s.get(50) == ps[0]
        s.fail_pool_allocs(0)
        s.check()
    for i in range(64):
        s.free(i)
    s.drain()
    st = s.stats()
    assert st["stored_bytes"] == 0 and st["pool_bytes"] == 0 and st["objects"] == 0


@pytest.mark.parametrize("pol", CODECS[:2])
def test_shuffle_off_stores_float_pages_raw(make_store, pol):
    """shuffle=0: no bit-shuffled encoding and no split object, as before (raw above 3/4 page)."""
    s = make_store(64, shuffle=0, **pol)
    assert s.policy()["shuffle"] == 0
    s.add_template(100, 1)
    s.add_sandbox(11, 1)
    rng = random.Random(8)
    base = pages.floats(rng)
    s.template_load(100, 3, base)
    ps = [pages.floats(rng) for _ in range(8)] + [pages.nudge_floats(base, rng, 0.2)]
    for i, p in enumerate(ps):
        s.put(i, p, owner=11, index=3 if i == 8 else 100 + i)
    assert [s.kind(i) for i in range(8)] == ["raw"] * 8
    assert s.kind(8) in ("raw", "tdelta")
    assert [s.get(i) for i in range(9)] == ps
    assert all(len(s.encode(p)) == PAGE_SIZE for p in ps[:8])  # raw
    try:
        assert s.encode(ps[8], base=base)[0] not in (6, 7)
    except CoreError as e:
        assert e.errno == errno.ENOSPC  # no delta below 3/4 page without the shuffle
    # Switched on live: new stores shrink, the raw ones still read back.
    s.set_policy(shuffle=1)
    qs = [pages.floats(rng) for _ in range(8)]
    for i, p in enumerate(qs):
        s.put(20 + i, p, owner=11, index=200 + i)
    assert [s.kind(20 + i) for i in range(8)] == ["plain"] * 8
    assert [s.get(20 + i) for i in range(8)] == qs
    assert [s.get(i) for i in range(9)] == ps


def test_sim_slots_is_fixed_once_an_owner_registered(make_store):
    """sim_slots: power of two 1..64, fixed once an owner registered; the index finds pages."""
    for n in (1, 4):
        s = make_store(4096)
        assert s.sim_slots() == 1
        for bad in (0, 3, 6, 128, 1 << 31):
            with pytest.raises(CoreError) as e:
                s.set_sim_slots(bad)
            assert e.value.errno == errno.EINVAL
        s.set_sim_slots(n)
        assert s.stats()["index_bytes"] == 0  # nothing allocated before an owner
        s.add_sandbox(11, 1)
        with pytest.raises(CoreError) as e:
            s.set_sim_slots(2 * n)
        assert e.value.errno == errno.EBUSY
        s.set_sim_slots(n)  # the size in force is accepted
        rng = random.Random(n)
        base = pages.make("text", 1)
        want = {k: pages.mutate(base, rng, 4) for k in range(64)}
        for k, p in want.items():
            s.put(k, p, owner=11, index=k)
        assert s.kind(1) == "xdelta"  # the index still finds near-duplicates
        assert all(s.get(k) == p for k, p in want.items())


PTR = ctypes.sizeof(ctypes.c_void_p)
SIM_SET = 4 * (2 + PTR)  # four ways, a 16-bit tag and an object pointer each
NR_SF = 2  # similarity entries per indexed object (AZ_NR_SF; test_similarity_keys_per_object)


def index_tables(dedup: int, sim_sets: int, tmpl: int = 64) -> int:
    return dedup * PTR + tmpl * PTR + sim_sets * SIM_SET


@pytest.mark.parametrize("sim_slots", [1, 4])
def test_index_tables_grow_with_indexed_objects(make_store, sim_slots):
    """The index tables start small and double as objects are indexed; entries moved by a
    doubling are all found again; with every object gone they are back to their start."""
    s = make_store(1 << 16)
    s.set_sim_sample(1)  # entries for every object (sparse groups: test_sparse_sim.py)
    s.set_sim_slots(sim_slots)
    s.add_sandbox(11, 1)
    assert s.stats()["index_table_bytes"] == index_tables(256, 64)
    distinct = [pages.make("random", 1000 + k) for k in range(3000)]
    for k, p in enumerate(distinct):
        s.put(k, p, owner=11, index=k)
    # dedup: a bucket per 4 objects at most (3000 -> 1024 buckets); similarity: room for
    # each object's 2 entries, per sim_slots (6000 -> 8192 entries, 2048 sets)
    assert s.stats()["index_table_bytes"] == index_tables(1024, 2048 // sim_slots)
    # every page is still found: exact duplicates through the moved dedup chains ...
    for k in range(0, 3000, 97):
        s.put(4000 + k // 97, distinct[k], owner=11, index=5000 + k)
        assert s.kind(4000 + k // 97) == "dup"
    # ... and near-duplicates through the moved similarity sets: the newest pages, and with
    # room for every entry (sim_slots 1) older ones too (a set that overflowed while the
    # table was at its load dropped its oldest ways: an object whose two keys both fell in
    # such sets is not found)
    rng = random.Random(7)
    for k in range(10):
        s.put(4500 + k, pages.mutate(distinct[k * 300 + 1], rng, 4), owner=11, index=9000 + k)
    found = [s.kind(4500 + k) == "xdelta" for k in range(10)]
    assert all(found[-6:] if sim_slots == 1 else found[-5:])
    s.check()
    assert all(s.get(k) == p for k, p in enumerate(distinct))
    for k in range(5000):
        s.free(k)
    s.drain()
    s.check()
    assert s.stats()["index_table_bytes"] == index_tables(256, 64)


@pytest.mark.parametrize("sim_slots", [1, 4])
def test_index_tables_halve_as_objects_go(make_store, sim_slots):
    """A table halves once its objects fall below an eighth of its load (never below its
    starting size); what stays indexed is found through the merged buckets and sets, and a
    new fleet grows the tables again."""
    s = make_store(1 << 16)
    s.set_sim_sample(1)  # entries for every object (sparse groups: test_sparse_sim.py)
    s.set_sim_slots(sim_slots)
    s.add_sandbox(11, 1)
    distinct = [pages.make("random", 1000 + k) for k in range(3000)]
    for k, p in enumerate(distinct):
        s.put(k, p, owner=11, index=k)
    assert s.stats()["index_table_bytes"] == index_tables(1024, 2048 // sim_slots)
    keep = range(0, 3000, 20)  # 150 objects stay
    for k in range(3000):
        if k % 20:
            s.free(k)
    s.drain()
    s.check()
    # dedup: 150 objects x 8 below 4 a bucket down to 256 buckets (the start); similarity:
    # 300 entries x 8 below the room of 4 ways x sim_slots a set down to 512 // sim_slots
    assert s.stats()["index_table_bytes"] == index_tables(256, 512 // sim_slots)
    assert all(s.get(k) == distinct[k] for k in keep)
    for j, k in enumerate(keep):  # exact duplicates through the merged chains
        s.put(5000 + j, distinct[k], owner=11, index=5000 + j)
        assert s.kind(5000 + j) == "dup"
    rng = random.Random(11)
    newest = list(keep)[-8:]  # the newest keep their similarity entries in merged sets
    for j, k in enumerate(newest):
        s.put(6000 + j, pages.mutate(distinct[k], rng, 4), owner=11, index=6000 + j)
    assert sum(s.kind(6000 + j) == "xdelta" for j in range(len(newest))) >= 6
    s.check()
    for k in range(len(distinct)):  # the slots of the freed pages take a new fleet
        if k % 20:
            s.put(k, pages.make("random", 90000 + k), owner=11, index=k)
    assert s.stats()["index_table_bytes"] == index_tables(1024, 2048 // sim_slots)
    s.check()
    assert all(s.get(k) == distinct[k] for k in keep)


@pytest.mark.parametrize("sim_slots", [1, 4])
def test_index_tables_stop_at_a_full_devices_size(make_store, sim_slots):
    """Caps: a bucket per 4 slots, an entry per sim_slots slots (what a device full of
    indexed objects needs); the oldest similarity entries then drop out."""
    s = make_store(4096)
    s.set_sim_sample(1)  # entries for every object (sparse groups: test_sparse_sim.py)
    s.set_sim_slots(sim_slots)
    s.add_sandbox(11, 1)
    for k in range(4096):
        s.put(k, pages.make("random", 1000 + k), owner=11, index=k)
    assert s.stats()["index_table_bytes"] == index_tables(1024, 1024 // sim_slots)
    s.check()


def test_template_table_grows_with_its_chunks(make_store):
    """The template table doubles when it holds more chunks (48 page indexes each) than
    buckets; the entries are found after the rehash and dropped with their template."""
    s = make_store(1 << 16)
    s.add_template(7, 1)
    s.add_sandbox(11, 1)
    tpages = [pages.make("random", 300 + k) for k in range(100)]
    for k, p in enumerate(tpages):  # one chunk per page: 100 chunks
        s.put(k, p, owner=7, index=k * 48)
    st = s.stats()
    assert st["tnode_bytes"] == 100 * 512
    # 100 objects: dedup 256 buckets, similarity 200 entries -> 64 sets; template 128
    assert st["index_table_bytes"] == index_tables(256, 64, tmpl=128)
    rng = random.Random(3)
    for k in range(0, 100, 9):  # a sandbox's page at the template's index: a template delta
        s.put(1000 + k, pages.mutate(tpages[k], rng, 4), owner=11, index=k * 48)
        assert s.kind(1000 + k) == "tdelta"
    s.check()
    s.del_template(7)
    s.drain()
    assert s.stats()["tnode_bytes"] == 0
    s.check()
    assert all(s.get(1000 + k) != bytes(4096) for k in range(0, 100, 9))
    # the template's objects stay while its slots and the deltas hold them; with them
    # gone the template table is back to its start too
    for k in range(100):
        s.free(k)
    for k in range(0, 100, 9):
        s.free(1000 + k)
    s.drain()
    s.check()
    assert s.stats()["index_table_bytes"] == index_tables(256, 64)


def test_index_growth_without_memory_waits(make_store):
    """A doubling that cannot allocate leaves the tables as they are; it is asked for again
    once an eighth more objects (at least 256) are indexed."""
    s = make_store(4096)
    s.add_sandbox(11, 1)
    distinct = [pages.make("random", 50 + k) for k in range(400)]
    s.fail_allocs_of(128 * SIM_SET, 1000)  # the doubled similarity table
    try:
        for k in range(300):  # past 64 sets x 4 ways at 129 objects of 2 entries
            s.put(k, distinct[k], owner=11, index=k)
        assert s.stats()["index_table_bytes"] == index_tables(256, 64)
        assert all(s.get(k) == distinct[k] for k in range(300))
        s.check()
    finally:
        s.fail_allocs_of(128 * SIM_SET, 0)
    for k in range(300, 341):
        s.put(k, distinct[k], owner=11, index=k)
    assert s.stats()["index_table_bytes"] == index_tables(256, 64)  # 129 + 256 not reached
    for k in range(341, 400):
        s.put(k, distinct[k], owner=11, index=k)
    # room for 2 entries of 400 objects: 800 > 512 entries, so 256 sets
    assert s.stats()["index_table_bytes"] == index_tables(256, 256)
    assert all(s.get(k) == distinct[k] for k in range(400))
    s.check()


def test_index_halving_without_memory_waits(make_store):
    """A halving that cannot allocate leaves the table as it is; it is asked for again once
    an eighth fewer objects are indexed."""
    s = make_store(1 << 14)
    s.set_sim_sample(1)  # entries for every object (sparse groups: test_sparse_sim.py)
    s.add_sandbox(11, 1)
    distinct = [pages.make("random", 70 + k) for k in range(4000)]
    for k, p in enumerate(distinct):  # 8000 entries: 2048 sets
        s.put(k, p, owner=11, index=k)
    assert s.stats()["index_table_bytes"] == index_tables(1024, 2048)
    s.fail_allocs_of(1024 * SIM_SET, 1000)  # the halved similarity table
    try:
        for k in range(3600):  # 400 left: 800 entries x 8 < 8192
            s.free(k)
        s.drain()
        s.check()
        # dedup halved (400 x 8 < 4096); similarity waits
        assert s.stats()["index_table_bytes"] == index_tables(512, 2048)
    finally:
        s.fail_allocs_of(1024 * SIM_SET, 0)
    for k in range(3600, 3630):  # 370 left: fewer, but not an eighth fewer
        s.free(k)
    s.drain()
    assert s.stats()["index_table_bytes"] == index_tables(512, 2048)
    for k in range(3630, 3900):  # 100 left: asked again, halved to what 200 entries need
        s.free(k)
    s.drain()
    assert s.stats()["index_table_bytes"] == index_tables(256, 256)
    assert all(s.get(k) == distinct[k] for k in range(3900, 4000))
    s.check()


def test_index_tables_do_not_flip_with_a_few_objects(make_store):
    """Objects coming and going around a resize point change a table's size once."""
    s = make_store(1 << 14)
    s.set_sim_sample(1)  # entries for every object (sparse groups: test_sparse_sim.py)
    s.add_sandbox(11, 1)
    distinct = [pages.make("random", 9000 + k) for k in range(1100)]
    for k in range(1024):  # dedup at its load: 256 buckets x 4
        s.put(k, distinct[k], owner=11, index=k)
    sizes = set()
    for r in range(6):  # one over the load, then back, six times
        s.put(2000 + r, distinct[1024 + r], owner=11, index=2000 + r)
        s.drain()
        sizes.add(s.stats()["index_table_bytes"])
        s.free(2000 + r)
        s.drain()
        sizes.add(s.stats()["index_table_bytes"])
    dedup_sizes = {(b - 64 * 8 - 4096 // 4 * SIM_SET) // 8 for b in sizes}
    assert dedup_sizes == {512}, sizes
    s.check()


def _leaf_slots(s: Store) -> int:
    return int(s.lib.az_debug_leaf_slots())


def test_slot_table_leaves_come_and_go_with_their_slots(make_store):
    """The slot table costs a directory entry per leaf's range plus a leaf per range in use.

    A leaf is allocated by the first put into its range and freed with its last used slot;
    reads, frees and free notifications of slots without a leaf see empty slots.
    """
    s = make_store(1 << 20)
    n = _leaf_slots(s)
    leaf_bytes = n * 16
    assert 16 <= n <= 256 and n & (n - 1) == 0
    base = s.stats()["slot_bytes"]
    assert base == (1 << 20) // n * 16
    p = pages.make("text", 1)
    assert s.get(5000) == bytes(4096) and s.kind(5000) is None
    s.free(5000)
    assert s.lib.az_store_free_notify(s._s, 5000) == 0
    assert s.stats()["slot_bytes"] == base
    for slot in (0, n - 1, n, 1 << 19, (1 << 20) - 1):
        s.put(slot, p)
    assert s.stats()["slot_bytes"] == base + 4 * leaf_bytes  # 0 and n - 1 share one
    s.check()
    s.free(n - 1)
    assert s.stats()["slot_bytes"] == base + 4 * leaf_bytes
    s.free(0)
    assert s.stats()["slot_bytes"] == base + 3 * leaf_bytes
    s.put(n, pages.make("text", 2))  # a rewrite keeps its leaf
    assert s.stats()["slot_bytes"] == base + 3 * leaf_bytes
    assert s.lib.az_store_free_notify(s._s, n) == 0
    assert s.stats()["slot_bytes"] == base + 2 * leaf_bytes
    assert s.get((1 << 20) - 1) == p
    s.check()
    for slot in (1 << 19, (1 << 20) - 1):
        s.free(slot)
    assert s.stats()["slot_bytes"] == base and s.stats()["pages_stored"] == 0
    s.check()


def test_slot_table_leaves_under_racing_puts_and_frees(make_store):
    """Threads (a context each) filling and emptying one slot each of the same leaves, so
    the leaves are allocated and freed under races: every page reads back, no leaf is lost
    or leaked, and each leaf's count matches its used slots (check)."""
    s = make_store(4 * 256)
    lib = s.lib
    n = _leaf_slots(s)
    errors: list[str] = []

    def worker(t: int) -> None:
        ctx = Ctx.create(lib)
        buf = ctypes.create_string_buffer(4096)
        page = pages.make("text", 10 + t)
        try:
            for r in range(2000):
                slot = (r % 4) * n + t * (n // 4) + r % (n // 4)
                if lib.az_store_put(s._s, ctx.ptr, slot, page, None):
                    errors.append(f"put {slot}")
                if lib.az_store_get(s._s, ctx.ptr, slot, buf) or buf.raw != page:
                    errors.append(f"get {slot} round {r}")
                lib.az_store_free(s._s, slot)
        finally:
            ctx.close()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    st = s.stats()
    assert st["pages_stored"] == 0 and st["slot_bytes"] == 1024 // n * 16 and st["frees"] == 8000
    s.check()


def test_meta_bytes_count_index_fields_once(make_store):
    """meta_bytes holds the index tables once and each object's header once.

    The objects' index fields (hash, chain link, similarity positions) live in the header:
    index_bytes reports them, meta_bytes must not add them again.
    """
    s = make_store(1024)
    obj_size = s.obj_header_bytes()
    m0, i0 = s.stats()["meta_bytes"], s.stats()["index_bytes"]
    s.add_sandbox(11, 1)
    st = s.stats()
    assert st["meta_bytes"] - m0 == st["index_bytes"] - i0 > 0  # the tables, once
    m1, i1, n1 = st["meta_bytes"], st["index_bytes"], st["objects"]
    for k in range(32):
        s.put(k, pages.make("text", 100 + k), owner=11, index=k)
    st = s.stats()
    assert st["objects"] - n1 == 32
    assert st["index_bytes"] - i1 == 32 * (4 + ctypes.sizeof(ctypes.c_void_p) + NR_SF * 4)
    leaves = -(-32 // _leaf_slots(s))
    assert st["meta_bytes"] - m1 == 32 * obj_size + leaves * _leaf_slots(s) * 16  # and leaves


def test_meta_bytes_by_component(make_store):
    """The stats' metadata components sum to meta_bytes at every step, each counting its part.

    The trace replay charges them to sandboxes and the template (docs/trace-format.md), so a
    cost the store pays must land in exactly one component.
    """
    s = make_store(512)
    obj_size = s.obj_header_bytes()
    n = _leaf_slots(s)
    used: set[int] = set()

    def check() -> dict[str, int]:
        st = s.stats()
        assert sum(st[k] for k in META_PARTS) == st["meta_bytes"]
        # a directory entry per leaf's range, a leaf per range with a slot in use
        leaves = len({slot // n for slot in used})
        assert st["slot_bytes"] == 512 // n * 16 + leaves * n * 16
        assert st["slot_used_bytes"] == st["pages_stored"] * 16 == len(used) * 16
        return st

    st = check()
    assert st["index_table_bytes"] == st["tnode_bytes"] == st["obj_meta_bytes"] == 0
    # The base cache's 256 entries (tag, bits, page pointer, four ghosts each), no page yet.
    assert st["owner_bytes"] > 0 and st["base_cache_bytes"] == 256 * (8 + 1 + 8 + 16)
    for k in range(8):  # unregistered: DIRECT slots, no object header
        s.put(k, pages.make("text", k))
        used.add(k)
    st = check()
    assert st["obj_meta_bytes"] == 0 and st["slot_used_bytes"] == 8 * 16
    s.add_template(7, 1)
    s.add_sandbox(11, 1)
    assert check()["index_table_bytes"] > 0
    for k in range(8):
        s.put(100 + k, pages.make("text", 50 + k), owner=7, index=k)
        used.add(100 + k)
    st = check()
    assert st["tnode_bytes"] > 0 and st["obj_meta_bytes"] == 8 * obj_size
    for k in range(8):
        s.put(200 + k, pages.make("text", 50 + k), owner=11, index=k)  # duplicates
        used.add(200 + k)
    st = check()
    assert st["obj_meta_bytes"] == 8 * obj_size and st["slot_used_bytes"] == 24 * 16
    for slot in sorted(used):
        s.free(slot)
    used.clear()
    s.drain()
    st = check()
    assert st["slot_used_bytes"] == 0


def test_sim_slots_racing_the_first_registration(make_store):
    """A sim_slots change racing the index allocation: the index grows by what get reports
    (200 objects grow the similarity table with sim_slots 1, not with 64)."""
    distinct = [pages.make("random", 7000 + k) for k in range(200)]

    def fill(s: Store) -> int:
        for k, p in enumerate(distinct):
            s.put(k, p, owner=11, index=k)
        return s.stats()["index_table_bytes"]

    want: dict[int, int] = {}
    for n in (1, 64):  # reference sizes, sequential
        ref = make_store(1 << 16)
        ref.set_sim_slots(n)
        ref.add_sandbox(11, 1)
        want[n] = fill(ref)
        ref.close()
    assert want[1] > want[64]
    for _ in range(200):
        s = make_store(1 << 16)
        res: list[int] = []

        def change(s: Store = s, res: list[int] = res) -> None:
            try:
                s.set_sim_slots(64)
                res.append(0)
            except CoreError as e:
                res.append(e.errno)

        t = threading.Thread(target=change)
        t.start()
        s.add_sandbox(11, 1)
        t.join()
        assert res[0] in (0, errno.EBUSY)
        assert fill(s) == want[s.sim_slots()]
        assert res[0] == 0 or s.sim_slots() == 1
        s.close()


def test_object_header_is_48_bytes(make_store):
    """struct az_obj is the per-object metadata of every shared page: 48 bytes.

    (A slab cache of that size in the kernel; the split object's second handle lives in the
    pool, the delta base shares memory with the similarity keys and a pack's id, the dedup
    chain link with the deferred free's, the hash is kept as 32 bits.)
    """
    s = make_store(16)
    assert s.obj_header_bytes() == 48


def test_similarity_keys_per_object(make_store):
    """The tests' sizes of the similarity table count NR_SF entries per indexed object."""
    s = make_store(16)
    assert s.lib.az_debug_nr_sf() == NR_SF


@pytest.mark.parametrize("pol,enc", [({"codec": 0}, 10), ({"codec": 1, "level": 3}, 11)])
def test_word_difference_delta_for_relocated_pointers(make_store, pol, enc):
    """A heap page of a process placed elsewhere (ASLR): stored as the word-wise difference
    against the same page of another (chosen over XOR and dictionary: the smallest wins), in
    less than half the bytes of the page alone, and exact."""
    s = make_store(4, **pol)
    base = pages.make("heap", 4)
    moved = pages.relocate(base, 0x1234567000)
    assert moved != base
    obj = s.encode(moved, base=base)
    assert obj[0] == enc, obj[0]
    assert len(obj) * 2 < len(s.encode(moved))
    check_delta_object(s, obj, base, moved)
