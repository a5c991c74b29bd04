"""Multi-page objects (az_store_pack): nearby PLAIN pages of one sandbox stored as one object,
each page still read on its own."""

from __future__ import annotations

import ctypes
import errno
import random

import pytest

from controlplane.trace.corelib import PAGE_SIZE, CoreError, PageInfo, Store

from . import pages

CODECS = [{"codec": 0}, {"codec": 1, "level": 3}]
IDS = ["lz4", "zstd"]
SANDBOX, OTHER, TEMPLATE = 11, 12, 50


def text_pages(n: int, seed: int = 0) -> list[bytes]:
    """Distinct record pages (none a dedup target or delta base of another)."""
    return [pages.make("records", seed * 1000 + i) for i in range(n)]


def fill(s: Store, first: int, data: list[bytes], owner: int = SANDBOX) -> None:
    for i, p in enumerate(data):
        s.put(first + i, p, owner=owner, index=first + i)


def read_all(s: Store, first: int, data: list[bytes]) -> None:
    for i, p in enumerate(data):
        assert s.get(first + i) == p, f"slot {first + i}"


@pytest.mark.parametrize("pol", CODECS, ids=IDS)
def test_adjacent_plain_pages_become_packs_and_read_back(make_store, pol):
    s = make_store(64, **pol)
    s.add_sandbox(SANDBOX, 1)
    data = text_pages(16)
    fill(s, 0, data)
    assert all(s.kind(i) == "plain" for i in range(16))
    before = s.stats()
    assert s.pack() == 16
    s.drain()
    after = s.stats()
    # zstd fits four of these pages in one object, lz4 two
    assert after["packs"] == (4 if pol["codec"] else 8) and after["packed_pages"] == 16
    assert after["objects"] == before["objects"] - 16 + after["packs"]
    assert after["stored_bytes"] < before["stored_bytes"]
    assert after["obj_meta_bytes"] < before["obj_meta_bytes"]
    # pages and kinds are what they were; the owner pays for the packs alone
    assert after["pages_stored"] == 16 and after["kind_pages"]["plain"] == 16
    own = s.owner_stats(SANDBOX)
    assert own["exclusive_bytes"] + own["shared_bytes"] == after["stored_bytes"]
    read_all(s, 0, data)
    s.check()
    # a second pass finds nothing more to do
    assert s.pack() == 0


@pytest.mark.parametrize("pol", CODECS, ids=IDS)
def test_frees_and_overwrites_of_packed_slots(make_store, pol):
    s = make_store(32, **pol)
    s.add_sandbox(SANDBOX, 1)
    data = text_pages(8, seed=1)
    fill(s, 0, data)
    assert s.pack() == 8
    s.free(1)
    new = pages.make("heap", 77)
    s.put(2, new, owner=SANDBOX, index=2)
    data[1], data[2] = bytes(PAGE_SIZE), new
    read_all(s, 0, data)
    s.drain()
    st = s.stats()
    assert st["packs"] == (2 if pol["codec"] else 4) and st["packed_pages"] == 6
    s.check()
    # the pack stays until its last page goes, then nothing is left
    for i in range(8):
        s.free(i)
    s.drain()
    st = s.stats()
    assert st["packs"] == st["packed_pages"] == 0
    assert st["objects"] == st["stored_bytes"] == st["pool_bytes"] == 0
    s.check()


def test_only_private_plain_pages_of_one_sandbox_are_packed(make_store):
    s = make_store(128, codec=1, level=3)
    s.add_sandbox(SANDBOX, 1)
    s.add_sandbox(OTHER, 1)
    s.add_template(TEMPLATE, 1)
    data = text_pages(40, seed=2)
    # 0..3: template pages; 4..7: unregistered; 8..11 alternate two sandboxes;
    # 12..15: duplicates of 16..19 (shared objects); 20..23: same-filled; 24..27: random (raw)
    fill(s, 0, data[:4], owner=TEMPLATE)
    fill(s, 4, data[4:8], owner=0)
    for i in range(8, 12):
        s.put(i, data[i], owner=SANDBOX if i % 2 else OTHER, index=i)
    fill(s, 16, data[16:20])
    fill(s, 12, data[16:20])
    assert [s.kind(i) for i in range(12, 16)] == ["dup"] * 4
    for i in range(20, 24):
        s.put(i, bytes([i]) * PAGE_SIZE, owner=SANDBOX, index=i)
    for i in range(24, 28):
        s.put(i, pages.make("random", i), owner=SANDBOX, index=i)
    assert s.pack() == 0
    st = s.stats()
    assert st["packs"] == 0
    # the shared pages pack once their duplicates are gone
    for i in range(12, 16):
        s.free(i)
    assert s.pack() == 4
    s.check()


@pytest.mark.parametrize("pol", CODECS, ids=IDS)
def test_a_pack_never_costs_more_than_its_pages(make_store, pol):
    """Over random mixes of pages that pack well, a little or not at all: what the store holds
    (pool bytes and object headers: a pack frees its pages' headers) never grows, and every
    page reads back."""
    rng = random.Random(3)
    packed = 0
    for trial in range(12):
        s = make_store(64, **pol)
        s.add_sandbox(SANDBOX, 1)
        data = []
        for i in range(16):
            k = rng.random()
            if k < 0.4:
                data.append(pages.make("records", trial * 100 + i))
            elif k < 0.8:  # half noise, half text: each alone about as good as together
                cut = rng.randrange(PAGE_SIZE // 4, 3 * PAGE_SIZE // 4)
                data.append(rng.randbytes(cut) + pages.make("text", i)[cut:])
            else:
                data.append(pages.make("heap", trial * 100 + i))
        fill(s, 0, data)
        s.drain()
        st = s.stats()
        before = st["stored_bytes"] + st["obj_meta_bytes"]
        packed += s.pack()
        s.drain()
        st = s.stats()
        assert st["stored_bytes"] + st["obj_meta_bytes"] <= before, trial
        read_all(s, 0, data)
        s.check()
        s.close()
    assert packed > 0


def test_runs_start_again_at_another_sandbox(make_store):
    """A A B B B B: two packs, no page of B left out because the run of A ended at it."""
    s = make_store(16, codec=1, level=3)
    s.add_sandbox(SANDBOX, 1)
    s.add_sandbox(OTHER, 1)
    data = text_pages(6, seed=9)
    fill(s, 0, data[:2])
    for i in range(2, 6):
        s.put(i, data[i], owner=OTHER, index=i)
    assert s.pack() == 6
    assert s.stats()["packs"] == 2
    read_all(s, 0, data)
    s.check()


def test_a_run_gathers_plain_pages_around_duplicates_and_deltas(make_store):
    """A sandbox's plain pages with its duplicates and deltas between them (as a reclaim batch
    leaves them in consecutive slots) make one pack; the pages between stay what they are.
    Pages further apart than AZ_PACK_SPAN (64) slots are not gathered."""
    s = make_store(256, codec=1, level=3)
    s.add_sandbox(SANDBOX, 1)
    s.add_template(TEMPLATE, 1)
    tmpl = text_pages(2, seed=20)
    fill(s, 100, tmpl, owner=TEMPLATE)
    data = text_pages(4, seed=21)
    rng = random.Random(4)
    edited = pages.mutate(tmpl[1], rng, 3)
    s.put(0, data[0], owner=SANDBOX, index=0)
    s.put(1, tmpl[0], owner=SANDBOX, index=100)  # the template's page: a duplicate
    s.put(2, data[1], owner=SANDBOX, index=2)
    s.put(3, edited, owner=SANDBOX, index=101)  # an edit of the template's page: a delta
    s.put(4, data[2], owner=SANDBOX, index=4)
    s.put(5, data[3], owner=SANDBOX, index=5)
    between = [s.kind(1), s.kind(3)]
    assert between == ["dup", "tdelta"], between
    assert s.pack() == 4
    st = s.stats()
    assert st["packs"] == 1 and st["packed_pages"] == 4
    assert [s.kind(1), s.kind(3)] == between
    read_all(s, 0, [data[0], tmpl[0], data[1], edited, data[2], data[3]])
    s.check()


def test_a_run_spans_64_slots_from_its_first_page(make_store):
    """AZ_PACK_SPAN counts from a run's first page, not from where the walk looked first: two
    neighbours after 63 empty slots pack; pages 64 slots apart never do."""
    s = make_store(256, codec=1, level=3)
    s.add_sandbox(SANDBOX, 1)
    data = text_pages(4, seed=23)
    for k, slot in enumerate((63, 64, 128, 192)):
        s.put(slot, data[k], owner=SANDBOX, index=slot)
    assert s.pack() == 2
    st = s.stats()
    assert st["packs"] == 1 and st["packed_pages"] == 2
    assert [s.get(k) for k in (63, 64, 128, 192)] == data
    s.check()


def test_a_run_too_large_for_one_object_is_tried_one_page_shorter(make_store):
    """Four pages that compress to ~1.2 KiB each do not fit one object (15/16 page); three do."""
    s = make_store(16, codec=1, level=3)
    s.add_sandbox(SANDBOX, 1)
    rng = random.Random(5)
    data = [rng.randbytes(1150) + bytes(PAGE_SIZE - 1150) for _ in range(4)]
    fill(s, 0, data)
    st = s.stats()
    before = st["stored_bytes"] + st["obj_meta_bytes"]
    assert s.pack() == 3
    s.drain()
    st = s.stats()
    assert st["packs"] == 1 and st["packed_pages"] == 3
    assert st["stored_bytes"] + st["obj_meta_bytes"] < before
    read_all(s, 0, data)
    s.check()


def test_packing_works_at_the_memory_limit(make_store):
    """At mem_limit every new page fails; packing frees bytes, so it must still run."""
    s = make_store(32, codec=1, level=3)
    s.add_sandbox(SANDBOX, 1)
    data = text_pages(16, seed=10)
    fill(s, 0, data)
    s.set_mem_limit(s.stats()["pool_bytes"])
    with pytest.raises(CoreError):
        s.put(20, pages.make("random", 1), owner=SANDBOX, index=20)
    before = s.stats()["pool_bytes"]
    assert s.pack() == 16
    s.drain()
    assert s.stats()["pool_bytes"] < before
    read_all(s, 0, data)


@pytest.mark.parametrize("pol", CODECS, ids=IDS)
def test_packs_read_back_with_verify_off(make_store, pol):
    s = make_store(16, verify=0, **pol)
    s.add_sandbox(SANDBOX, 1)
    data = text_pages(8, seed=11)
    fill(s, 0, data)
    assert s.pack() == 8
    for _ in range(2):
        read_all(s, 0, data)
        read_all(s, 0, list(reversed(data))[::-1])


def test_a_split_pack_with_a_corrupted_link_is_eio(make_store):
    """A pack above 3/4 page is stored split in two allocations; a bad link is EIO."""
    s = make_store(16, codec=1, level=3)
    s.add_sandbox(SANDBOX, 1)
    data = [pages.make("text", 40 + i) for i in range(3)]  # zstd: ~3.8 KiB together
    fill(s, 0, data)
    assert s.pack() == 3
    assert s.slot_bytes(0) * 3 > 3072  # each page's share of a split pack
    s.corrupt_link(0, 1)  # (before any read: a context keeps its last pack decoded)
    for i in range(3):
        with pytest.raises(CoreError) as e:
            s.get(i)
        assert e.value.errno == errno.EIO


def test_slot_info_gives_a_packed_page_its_share(make_store):
    s = make_store(16, codec=1, level=3)
    s.add_sandbox(SANDBOX, 1)
    fill(s, 0, text_pages(4, seed=12))
    assert s.pack() == 4
    s.drain()
    shares = [s.slot_bytes(i) for i in range(4)]
    assert len(set(shares)) == 1
    assert sum(shares) <= s.stats()["stored_bytes"] < sum(shares) + 4


@pytest.mark.parametrize("pol", CODECS, ids=IDS)
def test_a_candidate_deduplicated_against_meanwhile_stays_out_of_the_pack(make_store, pol):
    """A put between a pack's encoding and its install makes candidate 1 a dedup target: that
    slot keeps its own object (packing it would free nothing); the others are packed only where
    a pack still pays without it."""
    s = make_store(32, **pol)
    s.add_sandbox(SANDBOX, 1)
    data = text_pages(4, seed=3)  # pages whose zstd pack pays with three of the four
    fill(s, 0, data)
    lib = s.lib
    pi = PageInfo(SANDBOX, 20)
    assert lib.az_store_debug_pack_race(s._s, 20, data[1], ctypes.byref(pi)) == 0
    try:
        packed = s.pack(0, 4)
    finally:
        made = lib.az_store_debug_pack_race(s._s, 0, None, None)
    assert made == 0  # the put was made, and worked
    assert s.kind(20) == "dup"
    s.drain()
    st = s.stats()
    # lz4 packs two of these pages at most: [0, 1] is left with slot 0 alone and undone, [2, 3]
    # is packed; zstd's pack of all four pays for the three it replaces (their pool bytes and
    # headers): kept with slots 0, 2 and 3
    assert packed == st["packed_pages"] == (3 if pol["codec"] else 2)
    assert st["packs"] == 1
    assert s.slot_bytes(20) == s.slot_bytes(1)
    read_all(s, 0, data)
    assert s.get(20) == data[1]
    s.check()


def test_a_held_slot_lock_never_blocks_its_own_thread_elsewhere(make_store):
    """Host lock stripes are shared: the thread holding one slot may still use every other."""
    s = make_store(8192)
    lib = s.lib
    p = pages.make("text", 1)
    assert lib.az_store_debug_slot_lock(s._s, 9, 1) == 0
    try:
        for slot in range(0, 8192, 7):
            if slot != 9:
                s.put(slot, p)
                assert s.get(slot) == p
    finally:
        lib.az_store_debug_slot_lock(s._s, 9, 0)


@pytest.mark.parametrize("pol", CODECS, ids=IDS)
def test_a_corrupted_pack_reads_as_eio(make_store, pol):
    s = make_store(16, **pol)
    s.add_sandbox(SANDBOX, 1)
    data = text_pages(2, seed=4)
    rng = random.Random(5)
    rejected = 0
    for _ in range(30):
        fill(s, 0, data)
        assert s.pack() == 2
        s.corrupt(0, rng.randrange(PAGE_SIZE), 1 << rng.randrange(8))
        for i, p in enumerate(data):
            try:
                assert s.get(i) == p
            except CoreError as e:
                assert e.errno == errno.EIO
                rejected += 1
    # a flip may be harmless (a match offset moved onto equal bytes); else both pages are EIO
    assert rejected >= 40
    s.check()


def test_pack_range_is_checked(make_store):
    s = make_store(16)
    for first, nr in ((17, 0), (0, 17), (16, 1), (2**63, 1)):
        with pytest.raises(CoreError) as e:
            s.pack(first, nr)
        assert e.value.errno == errno.EINVAL
    assert s.pack(16, 0) == 0


def test_pack_a_range_only(make_store):  # zstd: four pages to a pack
    s = make_store(32, codec=1, level=3)
    s.add_sandbox(SANDBOX, 1)
    data = text_pages(16, seed=6)
    fill(s, 0, data)
    assert s.pack(4, 8) == 8
    assert s.stats()["packs"] == 2
    assert all(s.kind(i) == "plain" for i in range(16))
    assert s.pack() == 8
    read_all(s, 0, data)
    s.check()


@pytest.mark.parametrize("pol", CODECS, ids=IDS)
def test_pack_decoder_rejects_truncated_garbage_and_single_pages(make_store, pol):
    s = make_store(4, **pol)
    data = b"".join(text_pages(2, seed=8))
    obj = s.encode_pack(data)
    assert obj and s.decode_pack(obj) == data
    for n in range(len(obj)):
        with pytest.raises(CoreError) as e:
            s.decode_pack(obj[:n])
        assert e.value.errno == errno.EIO
    # a one-page object is no pack, and a pack is no page
    with pytest.raises(CoreError):
        s.decode_pack(s.encode(data[:PAGE_SIZE]))
    with pytest.raises(CoreError):
        s.decode(obj)
    rng = random.Random(2)
    for _ in range(300):
        blob = bytes([rng.choice([12, 13]), 1]) + rng.randbytes(rng.randrange(2, PAGE_SIZE))
        blob = blob[:2] + bytes([(len(blob) - 4) & 0xFF, (len(blob) - 4) >> 8]) + blob[4:]
        try:
            out = s.decode_pack(blob)
            assert len(out) in (2 * PAGE_SIZE, 3 * PAGE_SIZE, 4 * PAGE_SIZE)
        except CoreError as e:
            assert e.errno == errno.EIO
