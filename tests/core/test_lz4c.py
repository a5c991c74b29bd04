"""The store's own lz4 compressor (kmod/core/lz4c.c).

Its blocks are checked with lz4's reference decoder (python-lz4, the code liblz4 and the kernel's
decoder come from), to the byte, with and without a dictionary. It must never write past its
capacity and must fail exactly when the block does not fit. Entries an earlier call left in its
hash table must never be used, its table must be cleared when the numbering of its positions
would wrap, and its blocks must be as small as lz4's own.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import lz4.block
import pytest

from controlplane.trace.corelib import CoreError, Store

from .pages import KINDS, make, mutate, nudge_floats, shift

PAGE = 4096
WRAP = 0xC000_0000  # AZ_LZ4C_WRAP
GUARD = b"\xa5" * 64


def bound(n: int) -> int:
    return n + n // 255 + 16  # LZ4_compressBound()


def check_block(st: Store, src: bytes, dict_: bytes = b"") -> bytes:
    blk, _, guard = st.lz4_compress(src, bound(len(src)), dict_)
    assert blk is not None
    assert guard == GUARD
    assert lz4.block.decompress(blk, uncompressed_size=len(src), dict=dict_) == src
    return blk


def mixed(rng: random.Random, n: int) -> bytes:
    """Runs, repeats at every distance, and noise."""
    out = bytearray()
    while len(out) < n:
        r = rng.random()
        if r < 0.3:
            out += bytes([rng.randrange(256)]) * rng.randrange(1, 600)
        elif r < 0.6 and out:
            start = rng.randrange(len(out))
            out += out[start : start + rng.randrange(4, 400)]
        else:
            out += rng.randbytes(rng.randrange(1, 80))
    return bytes(out[:n])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_pages_of_every_kind_decode(store: Store, kind: str) -> None:
    for seed in range(12):
        check_block(store, make(kind, seed))


@pytest.mark.parametrize(
    "n", [0, 1, 4, 11, 12, 13, 14, 15, 16, 17, 19, 20, 31, 64, 255, 270, 4095, 4096, 16384]
)
def test_every_length_decodes(store: Store, n: int) -> None:
    rng = random.Random(n)
    for src in (bytes(n), rng.randbytes(n), mixed(rng, n), (b"abcd" * n)[:n]):
        check_block(store, src)


def test_mixed_content_decodes(store: Store) -> None:
    rng = random.Random(7)
    for _ in range(300):
        check_block(store, mixed(rng, rng.choice([PAGE, 2 * PAGE, 4 * PAGE, rng.randrange(PAGE)])))


def test_deltas_against_a_dictionary_decode(store: Store) -> None:
    rng = random.Random(3)
    for kind in sorted(KINDS):
        for seed in range(6):
            base = make(kind, seed)
            for page in (
                base,
                mutate(base, rng),
                shift(base, rng),
                nudge_floats(base, rng),
                make(kind, seed + 100),
            ):
                check_block(store, page, base)


def test_a_dictionary_match_is_used_and_ends_at_the_dictionary_end(store: Store) -> None:
    rng = random.Random(5)
    base = rng.randbytes(PAGE)
    # the page is the base shifted by 100 bytes: a match from the dictionary runs into its end
    page = base[100:] + rng.randbytes(100)
    blk = check_block(store, page, base)
    assert len(blk) < 300
    # and the page equal to the base is a few bytes
    assert len(check_block(store, base, base)) < 40


def test_fails_exactly_when_the_block_does_not_fit(store: Store) -> None:
    rng = random.Random(11)
    cases = [
        (make("text", 1), b""),
        (make("heap", 2), b""),
        (mixed(rng, PAGE), b""),
        (rng.randbytes(PAGE), b""),
        (mutate(make("heap", 3), rng), make("heap", 3)),
    ]
    for src, dict_ in cases:
        full = check_block(store, src, dict_)
        for cap in range(1, len(full)):
            blk, _, guard = store.lz4_compress(src, cap, dict_)
            assert blk is None, (cap, len(full))
            assert guard == GUARD, f"wrote past a capacity of {cap}"
        blk, _, guard = store.lz4_compress(src, len(full), dict_)
        assert blk == full and guard == GUARD


def test_earlier_calls_do_not_change_a_block(make_store: Callable[..., Store]) -> None:
    rng = random.Random(13)
    pages = [make(k, s) for k in sorted(KINDS) for s in range(3)] + [mixed(rng, PAGE)]
    alone = []
    for p in pages:
        st = make_store()
        alone.append(check_block(st, p))
    st = make_store()
    for _ in range(3):
        for p, want in zip(pages, alone, strict=True):
            assert check_block(st, p) == want
            # a dictionary call in between numbers the dictionary too
            check_block(st, mutate(p, rng), p)


def test_the_table_is_cleared_when_the_numbering_wraps(make_store: Callable[..., Store]) -> None:
    rng = random.Random(17)
    a = make("heap", 1)
    b = mutate(a, rng)  # shares most 4-byte sequences with a, at the same offsets
    c = make("text", 2)
    fresh = check_block(make_store(), b)
    fresh_d = check_block(make_store(), c, b)
    st = make_store()
    # entries at low numbers (1 .. 2 pages), then at the top of the numbering
    check_block(st, b, a)
    blk, after, _ = st.lz4_compress(a, bound(PAGE), next_pos=WRAP - PAGE - 10)
    assert blk is not None and after == WRAP - 10
    # b does not fit below the wrap: the numbering starts again from 1 and every entry is
    # gone (the low ones would look current again)
    blk, after, guard = st.lz4_compress(b, bound(PAGE))
    assert after == 1 + PAGE and guard == GUARD
    assert blk == fresh
    assert lz4.block.decompress(blk, uncompressed_size=PAGE) == b
    # with a dictionary, the dictionary is numbered too
    st.lz4_compress(a, bound(PAGE), next_pos=WRAP - 2 * PAGE + 1)
    blk, after, _ = st.lz4_compress(c, bound(PAGE), b)
    assert after == 1 + 2 * PAGE
    assert blk == fresh_d
    assert lz4.block.decompress(blk, uncompressed_size=PAGE, dict=b) == c


def test_the_numbering_only_moves_forward(store: Store) -> None:
    store.lz4_compress(make("heap", 1), bound(PAGE), next_pos=1 << 20)
    with pytest.raises(CoreError):
        store.lz4_compress(make("heap", 1), bound(PAGE), next_pos=1 << 10)


def test_matches_stay_within_the_dictionary_and_the_input(store: Store) -> None:
    """A match never extends backwards past the start of the dictionary or of the input (the
    library copies both into buffers of their exact size: ASan sees a read before them)."""
    rng = random.Random(23)
    d = rng.randbytes(PAGE)
    # the input repeats the dictionary from its second byte on: a match at the dictionary's start
    check_block(store, b"\x01" + d[: PAGE - 1], d)
    check_block(store, d[-1:] + d[: PAGE - 1], d)
    # a run from the input's first byte, with a dictionary (base != the input's first number)
    check_block(store, bytes(PAGE), d)
    check_block(store, b"\xee" * PAGE, b"\xee" * 64 + d)


def test_no_offset_beyond_64_kib(store: Store) -> None:
    rng = random.Random(29)
    r = rng.randbytes(65_600)
    # the only repeat is 65,600 bytes back: out of reach, stored as literals
    assert len(check_block(store, r + r[:3000])) > 65_600 + 3000
    # 65,535 back is the farthest an offset reaches
    r = r[:65_535]
    assert len(check_block(store, r + r[:3000])) < 65_535 + 600


def test_blocks_are_as_small_as_lz4s(store: Store) -> None:
    rng = random.Random(19)
    ours = ref = ours_d = ref_d = 0
    for kind in sorted(KINDS):
        for seed in range(8):
            page = make(kind, seed)
            ours += len(check_block(store, page))
            ref += len(lz4.block.compress(page, store_size=False))
            delta = mutate(page, rng)
            ours_d += len(check_block(store, delta, page))
            ref_d += len(lz4.block.compress(delta, store_size=False, dict=page))
    assert ours <= ref * 1.03, (ours, ref)
    assert ours_d <= ref_d * 1.05, (ours_d, ref_d)
