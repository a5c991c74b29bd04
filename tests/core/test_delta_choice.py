"""Store core: how a registered page's representation is chosen among its delta candidates and
its plain encoding (the first candidate is tried before the plain compression; a small delta
is kept without it; any other must beat the plain size)."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest

from controlplane.trace.corelib import PAGE_SIZE, CoreError, Store

from . import pages

TEMPLATE, SANDBOX, OTHER, GROUP = 100, 11, 12, 1
CODECS = [{"codec": 0}, {"codec": 1, "level": 3}]
# kmod/core/store.c: a first delta within delta_max_pct (80) of AZ_PLAIN_FLOOR (256) is kept
# without the plain encoding
FIRST_KEPT = 256 * 80 // 100
# encodings (kmod/core/az_internal.h)
DICT_LZ4, XSHUF, SHUF = 5, (6, 7), (8, 9)


def fleet(make_store, **pol: int) -> Store:
    s = make_store(64, **pol)
    s.add_template(TEMPLATE, GROUP)
    s.add_sandbox(SANDBOX, GROUP)
    s.add_sandbox(OTHER, GROUP)
    return s


def all_freed(s: Store, slots: list[int]) -> None:
    """Free ``slots``, drop the owners, and check that no object or pool byte is left (a
    candidate whose reference was not dropped keeps its base alive)."""
    for slot in slots:
        s.free(slot)
    for cg in (SANDBOX, OTHER):
        s.del_sandbox(cg)
    s.del_template(TEMPLATE)
    s.drain()
    st = s.stats()
    assert st["objects"] == 0 and st["stored_bytes"] == 0, st
    s.check()


def put(s: Store, page: bytes, kind: str, index: int, slot: int = 0) -> int:
    """Store ``page`` as the sandbox's page at ``index``; check its kind and that it reads back
    exactly; its stored bytes."""
    s.put(slot, page, owner=SANDBOX, index=index)
    assert s.kind(slot) == kind
    assert s.get(slot) == page
    return s.slot_bytes(slot)


@pytest.mark.parametrize("pol", CODECS)
def test_a_near_duplicate_of_its_template_page_is_a_small_exact_delta(make_store, pol):
    s = fleet(make_store, **pol)
    base = pages.make("text", 1)
    s.template_load(TEMPLATE, 5, base)
    page = pages.mutate(base, random.Random(1), 3)
    assert put(s, page, "tdelta", 5) <= FIRST_KEPT
    all_freed(s, [0])


@pytest.mark.parametrize("pol", CODECS)
def test_delta_max_pct_still_bounds_a_small_first_delta(make_store, pol):
    """At delta_max_pct 8 a delta of 10 edited fields (136-167 bytes) fits the first attempt's
    limit (8% of a page) but is neither within 8% of 256 bytes nor within 8% of the plain size:
    the page is stored plain."""
    s = fleet(make_store, delta_max_pct=8, **pol)
    base = pages.make("records", 1)
    s.template_load(TEMPLATE, 5, base)
    page = pages.mutate(base, random.Random(1), 10)
    plain, delta = len(s.encode(page)), len(s.encode(page, base=base))
    assert plain * 8 // 100 < delta < PAGE_SIZE * 8 // 100 and delta <= 256
    assert put(s, page, "plain", 5) == plain
    all_freed(s, [0])


@pytest.mark.parametrize("pol", CODECS)
def test_a_delta_that_does_not_beat_the_plain_size_is_dropped(make_store, pol):
    """The template page at the same index is noise: the first delta attempt (lz4 with the
    base as dictionary, nothing matching) fits the raw-page limit but not the plain one, so
    the page is stored plain, exactly as large as alone, and the base is released."""
    s = fleet(make_store, **pol)
    noise = pages.make("random", 2)
    s.template_load(TEMPLATE, 5, noise)
    page = pages.make("records", 3)
    plain = len(s.encode(page))
    assert plain * 80 // 100 <= len(s.encode(page, base=noise)) < PAGE_SIZE * 80 // 100
    assert put(s, page, "plain", 5) == plain
    all_freed(s, [0])


@pytest.mark.parametrize("pol", CODECS)
def test_a_shifted_page_is_a_dictionary_delta_without_a_matching_word(make_store, pol):
    """Content moved by a few bytes leaves almost no zero word in the XOR (which is then not
    compressed): the dictionary form makes it a small delta."""
    s = fleet(make_store, **pol)
    base = pages.make("text", 4)
    s.template_load(TEMPLATE, 7, base)
    page = pages.shift(base, random.Random(4))
    xor = bytes(a ^ b for a, b in zip(page, base, strict=True))
    assert sum(1 for i in range(0, PAGE_SIZE, 8) if not any(xor[i : i + 8])) < 8
    assert s.encode(page, base=base)[0] == DICT_LZ4
    assert put(s, page, "tdelta", 7) == len(s.encode(page, base=base))
    all_freed(s, [0])


@pytest.mark.parametrize("pol", CODECS)
def test_later_candidates_are_tried_after_a_failed_first_one(make_store, pol):
    """The template page at the index is noise (the first attempt gives nothing worth
    keeping); a similar page of the other sandbox is found by similarity after the plain
    encoding: the page becomes a delta of it, exact, and every reference is dropped."""
    s = fleet(make_store, **pol)
    s.template_load(TEMPLATE, 9, pages.make("random", 5))
    rng = random.Random(6)
    first = pages.make("heap", 6)
    second = pages.mutate(first, rng, 40)
    s.put(0, first, owner=OTHER)
    s.put(1, second, owner=OTHER)
    page = pages.mutate(second, rng, 2)
    assert put(s, page, "xdelta", 9, slot=2) * 2 < len(s.encode(page))
    assert s.get(0) == first and s.get(1) == second
    all_freed(s, [0, 1, 2])


@pytest.mark.parametrize("pol", CODECS)
def test_a_small_delta_of_the_first_similar_page_leaves_the_other_candidates(make_store, pol):
    """No template page at the index: the first similar page is tried first, its delta is
    small enough to keep, and the other similar pages (template pages at other indexes) are
    released untried."""
    s = fleet(make_store, **pol)
    rng = random.Random(7)
    base = pages.make("heap", 7)
    for index in range(4):
        s.template_load(TEMPLATE, index, pages.mutate(base, rng, 1 + index))
    page = pages.mutate(base, rng, 2)
    assert put(s, page, "xdelta", 50) <= FIRST_KEPT
    all_freed(s, [0])


@pytest.mark.parametrize("pol", CODECS)
def test_float_updates_against_a_shuffled_base_get_the_shuffled_xor(make_store, pol):
    """A template page of float32 weights is stored bit-shuffled; the same weights after an
    optimizer step (every word changed: no zero word in the XOR) are stored as the
    bit-shuffled XOR against it."""
    s = fleet(make_store, **pol)
    base = pages.make("floats", 2)
    assert s.encode(base)[0] in SHUF
    s.template_load(TEMPLATE, 3, base)
    page = pages.nudge_floats(base, random.Random(3))
    delta = s.encode(page, base=base)
    assert delta[0] in XSHUF
    assert put(s, page, "tdelta", 3) == len(delta)
    all_freed(s, [0])


def test_float_updates_against_a_raw_base_without_shuffle_stay_xor_deltas(make_store):
    """shuffle=0: float32 weights are stored raw; their update (no zero word in the XOR) is
    still compressed as an XOR against the raw base (zstd brings it below 3/4 page)."""
    s = fleet(make_store, shuffle=0, codec=1, level=3)
    base = pages.make("floats", 2)
    s.template_load(TEMPLATE, 3, base)
    assert s.kind(0) is None
    page = pages.nudge_floats(base, random.Random(3))
    assert put(s, page, "tdelta", 3) < PAGE_SIZE * 3 // 4
    all_freed(s, [0])


ZSTD = {"codec": 1, "level": 3}
XOR = (3, 4)


def calls(s: Store, fn: Callable[[], object]) -> dict[str, int]:
    """The compressions ``fn`` made (the host library counts them process-wide)."""
    before = s.codec_calls()
    fn()
    return {k: v - before[k] for k, v in s.codec_calls().items()}


def repeating(rng: random.Random, period: int) -> bytes:
    """Random bytes repeating every ``period`` bytes: noisy words, which lz4 compresses to
    about ``period`` bytes and the bit shuffle cannot (``period`` does not divide 256)."""
    return (rng.randbytes(period) * (PAGE_SIZE // period + 1))[:PAGE_SIZE]


def half_noise(rng: random.Random) -> bytes:
    """4-byte words with two random low bytes under a constant 0x3f80: noisy; zstd takes it
    to about half a page bit-shuffled, to 2.8 KiB as it is."""
    return b"".join(struct.pack("<HH", rng.randrange(1 << 16), 0x3F80) for _ in range(1024))


@pytest.mark.parametrize("pol", CODECS)
def test_noisy_float_pages_are_compressed_once_with_zstd(make_store, pol):
    """float32 weights: zstd compresses them only bit-shuffled, after an lz4 probe found the
    bytes do not compress as they are; lz4 tries both forms, as it always did (its attempt as
    it is costs what the probe would)."""
    s = fleet(make_store, **pol)
    page = pages.make("floats", 2)
    made = calls(s, lambda: s.encode(page))
    want = (
        {"lz4": 1, "lz4_dict": 0, "zstd": 1}
        if pol == ZSTD
        else {"lz4": 2, "lz4_dict": 0, "zstd": 0}
    )
    assert made == want
    obj = s.encode(page)
    assert obj[0] in SHUF and len(obj) > PAGE_SIZE * 3 // 4
    # above 3/4 page: split in two pool allocations, the first starting with an 8-byte link
    assert put(s, page, "plain", 1) == len(obj) + 8
    all_freed(s, [0])


@pytest.mark.parametrize("pol", CODECS)
def test_a_noisy_xor_against_a_shuffled_base_is_compressed_once_with_zstd(make_store, pol):
    """The same weights after an optimizer step, against their template page (stored
    shuffled): zstd compresses the XOR only shuffled after the lz4 probe; lz4 compresses it as
    it is and shuffled, as before."""
    s = fleet(make_store, **pol)
    base = pages.make("floats", 2)
    s.template_load(TEMPLATE, 3, base)
    page = pages.nudge_floats(base, random.Random(3))
    made = calls(s, lambda: s.encode(page, base=base))
    assert (made["lz4"], made["zstd"]) == ((1, 1) if pol == ZSTD else (2, 0))
    delta = s.encode(page, base=base)
    assert delta[0] in XSHUF
    assert put(s, page, "tdelta", 3) == len(delta)
    all_freed(s, [0])


@pytest.mark.parametrize("pol", CODECS)
def test_a_noisy_page_that_lz4_can_halve_is_compressed_as_it_is(make_store, pol):
    """Noisy bytes repeating every 1,500 bytes (lz4: between a quarter and half a page): the
    probe finds the repeat, so zstd compresses the page as it is, not as bit planes."""
    s = fleet(make_store, **pol)
    page = repeating(random.Random(8), 1500)
    made = calls(s, lambda: s.encode(page))
    if pol == ZSTD:
        assert made["lz4"] == 1  # judged noisy: the probe ran
    obj = s.encode(page)
    assert obj[0] not in SHUF and len(obj) < PAGE_SIZE // 2
    assert put(s, page, "plain", 1) == len(obj)
    all_freed(s, [0])


@pytest.mark.parametrize("period", [600, 1500])
def test_a_noisy_xor_is_compressed_as_it_is_only_where_lz4_gets_it_below_a_quarter_page(
    make_store, period
):
    """zstd, against a shuffled base: a noisy XOR repeating every 600 bytes (lz4 below a
    quarter page) is compressed as it is and kept; one repeating every 1,500 bytes (lz4 above
    a quarter page) is tried only shuffled (one zstd call either way: the probe decides). Both
    read back exactly."""
    s = fleet(make_store, **ZSTD)
    base = pages.make("floats", 2)
    s.template_load(TEMPLATE, 3, base)
    xor = repeating(random.Random(period), period)
    page = bytes(a ^ b for a, b in zip(base, xor, strict=True))
    if period == 600:
        made = calls(s, lambda: s.encode(page, base=base))
        delta = s.encode(page, base=base)
        assert delta[0] in XOR and len(delta) < PAGE_SIZE // 4
        assert put(s, page, "tdelta", 3) == len(delta)
    else:
        # no delta form comes below a page: the encoder says so
        def refused() -> None:
            with pytest.raises(CoreError):
                s.encode(page, base=base)

        made = calls(s, refused)
        s.put(0, page, owner=SANDBOX, index=3)
        assert s.get(0) == page
    assert made["lz4"] == 1 and made["zstd"] == 1
    all_freed(s, [0])


@pytest.mark.parametrize("pol", CODECS)
def test_a_noisy_page_whose_bit_planes_do_not_compress_is_tried_as_it_is(make_store, pol):
    """Random bytes from 128 of the 256 values (half with the top bit set): noisy, and lz4
    finds no repeat, but its bit planes are noise too. zstd, after the shuffled attempt
    fails, compresses the bytes as they are (7 bits a byte) instead of storing them raw; lz4
    tries the bytes, then the planes, and stores the page raw, as it always did."""
    s = fleet(make_store, **pol)
    rng = random.Random(12)
    alphabet = rng.sample(range(128), 64) + rng.sample(range(128, 256), 64)
    page = bytes(rng.choice(alphabet) for _ in range(PAGE_SIZE))
    made = calls(s, lambda: s.encode(page))
    if pol == ZSTD:
        assert made == {"lz4": 1, "lz4_dict": 0, "zstd": 2}
        obj = s.encode(page)
        assert obj[0] not in SHUF and len(obj) < PAGE_SIZE * 15 // 16
    else:
        assert made == {"lz4": 2, "lz4_dict": 0, "zstd": 0}
        assert len(s.encode(page)) == PAGE_SIZE
    s.put(0, page, owner=SANDBOX, index=1)
    assert s.kind(0) == ("plain" if pol == ZSTD else "raw") and s.get(0) == page
    all_freed(s, [0])


def records_with_a_text_field(rng: random.Random) -> bytes:
    """128-byte records: float32 values at offsets 0, 32, 40, 64, 80, 96 and 120 (every
    field a sample at a fixed offset in each 32 bytes would see, or at one that turns with
    the block's number modulo 4), ASCII text in the other nine 8-byte fields."""
    out = bytearray()
    for _ in range(PAGE_SIZE // 128):
        rec = bytearray(rng.choice(b"abcdefghijklmnopqrstuvwxyz _") for _ in range(128))
        for off in (0, 32, 40, 64, 80, 96, 120):
            rec[off : off + 8] = struct.pack("<2f", rng.gauss(0, 1), rng.gauss(0, 1))
        out += rec
    return bytes(out)


def cjk_text(rng: random.Random) -> bytes:
    """UTF-8 text of 800 CJK characters: every byte has its top bit set."""
    text = "".join(chr(0x4E00 + rng.randrange(800)) for _ in range(PAGE_SIZE // 3 + 1))
    return text.encode()[:PAGE_SIZE]


@pytest.mark.parametrize("make", [records_with_a_text_field, cjk_text])
def test_pages_that_only_look_noisy_in_places_are_compressed_as_they_are(make_store, make):
    """Records whose text fields a sample of fixed offsets would miss, and CJK text (its bytes'
    top bits always set, unlike noise): not noisy, so zstd compresses them as they are with
    no lz4 probe, as before."""
    s = fleet(make_store, **ZSTD)
    page = make(random.Random(11))
    made = calls(s, lambda: s.encode(page))
    assert made["lz4"] == 0
    assert s.encode(page)[0] not in SHUF


def test_a_noisy_page_of_an_unregistered_owner_is_never_shuffled(make_store):
    """The DIRECT path (no owner) keeps zram's rule: the noisy page is stored as zstd
    compresses it as it is (as with shuffle off), while a sandbox's copy is bit-shuffled."""
    s = fleet(make_store, **ZSTD)
    page = half_noise(random.Random(9))
    as_is = make_store(64, shuffle=0, **ZSTD).encode(page)
    assert as_is[0] not in SHUF and len(as_is) < PAGE_SIZE * 3 // 4
    s.put(0, page)
    assert s.kind(0) == "plain" and s.get(0) == page
    assert s.slot_bytes(0) == len(as_is)
    assert put(s, page, "plain", 1, slot=1) == len(s.encode(page)) < len(as_is)
    all_freed(s, [0, 1])
