"""Bounded fuzz runs of the decoders (kmod/core/fuzz/fuzz_decode.c).

libFuzzer (clang) when available, with lz4 compiled in and instrumented
when build/lz4src/lz4.c exists (kmod/core/fuzz/get-lz4-src.sh); otherwise
the gcc + ASan random-mutation driver.  The seed corpus is real objects
and deltas made by the store core.  AZCORE_FUZZ_SECONDS sets the budget.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from controlplane.trace.corelib import Store

from . import pages
from .conftest import REPO

SECONDS = int(os.environ.get("AZCORE_FUZZ_SECONDS", "20"))


def write_seeds(d: Path, lib_path: Path) -> list[Path]:
    out = []
    with Store(4, lib=lib_path) as s:
        rng = random.Random(1)
        for i, kind in enumerate(["text", "heap", "floats"]):
            p = pages.make(kind, i)
            near = pages.mutate(p, rng, 6)
            obj = s.encode(p)
            delta = s.encode(near, base=p)
            for name, blob in [(f"plain{i}", b"\0" + obj), (f"delta{i}", b"\1" + delta)]:
                f = d / name
                f.write_bytes(blob)
                out.append(f)
        w = pages.make("floats", 5)
        shuf = s.encode(pages.nudge_floats(w, rng), base=w)  # a byte-shuffled XOR delta
        (d / "xshuf").write_bytes(b"\1" + shuf)
        out.append(d / "xshuf")
        h = pages.make("heap", 7)
        sub = s.encode(pages.relocate(h, 0x5A5A5000), base=h)  # a word-wise difference
        (d / "sub").write_bytes(b"\1" + sub)
        out.append(d / "sub")
        s.set_policy(codec=1, level=3)
        z = s.encode(pages.make("heap", 9))
        (d / "zstd").write_bytes(b"\0" + z)
        out.append(d / "zstd")
        zsub = s.encode(pages.relocate(h, 0x5A5A5000), base=h)  # a zstd word-wise difference
        (d / "zsub").write_bytes(b"\1" + zsub)
        out.append(d / "zsub")
        texts = b"".join(pages.make("records", 20 + k) for k in range(3))
        for name, pol in (("zpack", {}), ("pack", {"codec": 0})):
            s.set_policy(**pol)
            pk = s.encode_pack(texts[: 2 * 4096] if pol else texts)
            assert pk, name
            (d / name).write_bytes(b"\4" + pk)
            out.append(d / name)
        # encode-decode round trips: 2..4 pages (byte 1: pages - 2, 0x80 zstd)
        for name, b1 in (("rt2", 0x00), ("rt4z", 0x82)):
            (d / name).write_bytes(b"\5" + bytes([b1]) + texts)
            out.append(d / name)
    return out


def test_fuzz_decoders(tmp_path, lib_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seeds = write_seeds(corpus, lib_path)
    if shutil.which("clang"):
        lz4 = REPO / "build" / "lz4src"
        args = [f"LZ4_SRC={lz4}"] if (lz4 / "lz4.c").exists() else []
        target = REPO / "build" / "azcore-fuzz"
        target.unlink(missing_ok=True)  # LZ4_SRC may differ from the last build
        b = subprocess.run(
            ["make", "-s", "-f", "kmod/core/host.mk", "fuzz", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if b.returncode == 0:
            cmd = [str(target), f"-max_total_time={SECONDS}", "-rss_limit_mb=1024", str(corpus)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=SECONDS + 120)
            assert r.returncode == 0, r.stderr[-4000:]
            assert "Done" in r.stderr
            return
        if "libclang_rt.fuzzer" not in b.stderr:
            pytest.fail(b.stderr[-2000:])
    subprocess.run(["make", "-s", "-f", "kmod/core/host.mk", "fuzz-gcc"], cwd=REPO, check=True)
    cmd = [str(REPO / "build" / "azcore-fuzz-gcc"), str(SECONDS), *map(str, seeds)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=SECONDS + 120)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "no crash" in r.stdout
