"""Realistic 4 KiB pages for store-core tests (deterministic from a seed)."""

from __future__ import annotations

import random
import struct

PAGE = 4096

_VOCAB = (
    "the model loss step batch token tensor gradient optimizer learning rate epoch "
    "import def return self class for in if else None True False print len range "
    "sandbox agent tool call result json value key error stdout stderr status ok"
)
WORDS = _VOCAB.split()


def zero(rng: random.Random) -> bytes:
    return bytes(PAGE)


def same(rng: random.Random) -> bytes:
    return struct.pack("<Q", rng.getrandbits(64)) * (PAGE // 8)


def text(rng: random.Random) -> bytes:
    out = []
    n = 0
    while n < PAGE:
        w = rng.choice(WORDS)
        if rng.random() < 0.1:
            w += str(rng.randrange(100000))
        out.append(w)
        n += len(w) + 1
    return " ".join(out).encode()[:PAGE].ljust(PAGE, b" ")


def rand(rng: random.Random) -> bytes:
    return rng.randbytes(PAGE)


def heap(rng: random.Random) -> bytes:
    """Pointer-rich heap page: object headers, pointers, small ints, strings."""
    base = 0x7F0000000000 + (rng.getrandbits(28) << 12)
    out = bytearray()
    while len(out) < PAGE:
        r = rng.random()
        if r < 0.45:
            out += struct.pack("<Q", base + (rng.getrandbits(16) << 4))
        elif r < 0.65:
            out += struct.pack("<Q", rng.randrange(256))
        elif r < 0.8:
            out += bytes(8)
        elif r < 0.9:
            out += rng.choice(WORDS).encode()[:8].ljust(8, b"\0")
        else:
            out += struct.pack("<d", rng.random())
    return bytes(out[:PAGE])


def floats(rng: random.Random) -> bytes:
    """float32 weights: barely compressible."""
    return struct.pack(f"<{PAGE // 4}f", *(rng.gauss(0, 0.02) for _ in range(PAGE // 4)))


def nudge_floats(page: bytes, rng: random.Random, scale: float = 1e-3) -> bytes:
    """The same float32 weights after an optimizer step: every value moved a little."""
    vals = struct.unpack(f"<{PAGE // 4}f", page)
    return struct.pack(f"<{PAGE // 4}f", *(v * (1 + rng.gauss(0, scale)) for v in vals))


def mutate(page: bytes, rng: random.Random, edits: int = 8) -> bytes:
    """A near-duplicate: a few 8-byte fields changed (pointers, counters)."""
    b = bytearray(page)
    for _ in range(edits):
        off = rng.randrange(PAGE // 8) * 8
        b[off : off + 8] = struct.pack("<Q", rng.getrandbits(64))
    return bytes(b)


def shift(page: bytes, rng: random.Random) -> bytes:
    """The same content moved by a few bytes (an insertion)."""
    n = rng.randrange(1, 64)
    return (rng.randbytes(n) + page)[:PAGE]


def relocate(page: bytes, slide: int) -> bytes:
    """The same objects in a process whose mappings lie ``slide`` bytes (whole pages) away:
    every word that looks like a user-space pointer (2^40 <= w < 2^48) moves by ``slide``."""
    words = struct.unpack(f"<{PAGE // 8}Q", page)
    moved = (w + slide if 1 << 40 <= w < 1 << 48 else w for w in words)
    return struct.pack(f"<{PAGE // 8}Q", *moved)


def records(rng: random.Random) -> bytes:
    """JSON-lines records: ~5x alone, better beside its kind (the same keys); no two alike
    enough to be deltas of one another."""
    out = b""
    while len(out) < PAGE:
        out += b'{"id": %d, "path": "src/mod%d/file%d.py", "line": %d, "ok": %s}\n' % (
            rng.randrange(10**6),
            rng.randrange(50),
            rng.randrange(200),
            rng.randrange(5000),
            rng.choice([b"true", b"false"]),
        )
    return out[:PAGE]


KINDS = {
    "zero": zero,
    "same": same,
    "text": text,
    "records": records,
    "random": rand,
    "heap": heap,
    "floats": floats,
}


def make(kind: str, seed: int) -> bytes:
    return KINDS[kind](random.Random(seed))


def distinct(n: int, seed: int) -> list[bytes]:
    """Random pages that share nothing: no lookup finds a base or a duplicate for them."""
    return [make("random", seed + k) for k in range(n)]
