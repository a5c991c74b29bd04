"""Small deterministic pages for the replay tests (heap-like, text, zero, float32)."""

from __future__ import annotations

import random
import struct

PAGE = 4096
WORDS = [
    "the",
    "model",
    "loss",
    "step",
    "batch",
    "token",
    "tensor",
    "gradient",
    "sandbox",
    "agent",
    "tool",
    "call",
]


def make(kind: str, seed: int) -> bytes:
    rng = random.Random(seed)
    if kind == "zero":
        return bytes(PAGE)
    if kind == "text":
        s = " ".join(rng.choice(WORDS) for _ in range(900)).encode()
        return s[:PAGE].ljust(PAGE, b" ")
    if kind == "floats":
        return struct.pack("<1024f", *(rng.gauss(0, 0.02) for _ in range(1024)))
    base = 0x7F0000000000 + (rng.getrandbits(28) << 12)
    out = bytearray()
    while len(out) < PAGE:
        r = rng.random()
        out += struct.pack(
            "<Q", base + (rng.getrandbits(16) << 4) if r < 0.5 else rng.randrange(256)
        )
    return bytes(out[:PAGE])


def mutate(page: bytes, rng: random.Random, edits: int) -> bytes:
    b = bytearray(page)
    for _ in range(edits):
        o = rng.randrange(0, PAGE - 8, 8)
        b[o : o + 8] = struct.pack("<Q", rng.getrandbits(64))
    return bytes(b)
