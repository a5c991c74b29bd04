"""The replay's JSON contract (docs/trace-format.md): net accounting per strategy.

Other checks read these fields: a field that goes missing, a ratio computed from the wrong
terms, metadata counted twice or not at all, or a page not verified on read-back fails here.
"""

from __future__ import annotations

import ctypes
import json
import random
from pathlib import Path
from typing import Any

import pytest
import zstandard
from test_trace import write_trace

from controlplane.trace import corelib
from controlplane.trace import replay as rp
from controlplane.trace.corelib import PAGE_SIZE, CoreError, Store
from controlplane.trace.format import read_trace

CONTRACT = (
    "stored_bytes",
    "meta_bytes",
    "sandbox_bytes",
    "template_stored_bytes",
    "ratio",
    "net_ratio",
    "total_ratio",
)
NSB, N = 3, 96  # sandboxes, pages per owner (the template has N too)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    p = tmp_path / "c.aztrace"
    write_trace(p, nsb=NSB, n=N)
    return p


@pytest.fixture
def report(trace: Path, tmp_path: Path, store_lib: Path) -> list[dict[str, Any]]:
    out = tmp_path / "out.json"
    assert rp.main([str(trace), "--json", str(out)]) == 0
    rep: list[dict[str, Any]] = json.loads(out.read_text())
    return rep


def results(report: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    assert len(report) == 1
    return {r["strategy"]: r for r in report[0]["results"]}


def test_every_strategy_and_the_stream_reference_carry_the_contract(
    report: list[dict[str, Any]],
) -> None:
    by = results(report)
    assert set(by) == {*rp.NAMES, rp.STREAM_REF}
    assert "limit-lz4" not in by and "limit-zstd" not in by
    for name, r in by.items():
        missing = [k for k in CONTRACT if k not in r]
        assert not missing, (name, missing)
        for k in CONTRACT:
            assert isinstance(r[k], int | float) and r[k] >= 0, (name, k, r[k])
        assert r["sandbox_bytes"] == NSB * N * PAGE_SIZE
        assert r["reference"] is (name == rp.STREAM_REF)


def test_ratios_are_the_net_accounting(report: list[dict[str, Any]]) -> None:
    for name, r in results(report).items():
        sb, st, meta = r["sandbox_bytes"], r["stored_bytes"], r["meta_bytes"]
        assert r["ratio"] == pytest.approx(sb / st), name
        assert r["net_ratio"] == pytest.approx(sb / (st + meta)), name
        allb = st + meta + r["template_stored_bytes"] + r["template_meta_bytes"]
        assert r["total_ratio"] == pytest.approx((sb + N * PAGE_SIZE) / allb), name
        assert r["meta_pct"] == pytest.approx(100 * meta / sb), name
        if r["reference"]:
            assert meta == 0 and r["net_ratio"] == r["ratio"]
        else:
            assert meta > 0 and r["net_ratio"] < r["ratio"], name


def test_every_byte_the_store_spends_is_charged_once(report: list[dict[str, Any]]) -> None:
    """Sandboxes + template (+ unused slot entries) add up to the core's own totals."""
    slot = ctypes.sizeof(ctypes.c_ulong) + 8  # struct az_slot
    for name, r in results(report).items():
        if r["reference"]:
            continue
        store = r["store"]
        assert r["stored_bytes"] + r["template_stored_bytes"] == store["stored_bytes"], name
        assert (
            r["meta_bytes"] + r["template_meta_bytes"] + r["idle_slot_bytes"]
            == store["meta_bytes"]
        ), name
        assert sum(r["meta"].values()) == r["meta_bytes"], name
        assert sum(r["template_meta"].values()) == r["template_meta_bytes"], name
        # the slot entry of every sandbox page; the index only when owners are registered
        assert r["meta"]["slots"] == NSB * N * slot, name
        assert r["template_meta"]["slots"] == N * slot, name
        registered = rp.STRATEGIES[name].register
        assert (r["meta"]["index_tables"] > 0) == registered, name
        assert (r["meta"]["object_headers"] > 0) == registered, name


def test_per_page_meta_against_an_empty_store(
    report: list[dict[str, Any]], store_lib: Path
) -> None:
    """lz4 (nothing registered, zram-like slots): the slot entries of the sandbox pages plus
    what an empty store already holds (owner table, base cache) and nothing else."""
    with Store(NSB * N + N + 1) as st:
        empty = st.stats()
    lz4 = results(report)["lz4"]
    want = NSB * N * 16 + empty["owner_bytes"] + empty["base_cache_bytes"]
    assert lz4["meta_bytes"] == want
    assert lz4["net_ratio"] == pytest.approx(
        lz4["sandbox_bytes"] / (lz4["stored_bytes"] + want)
    )


def test_stream_reference_uses_the_template_as_prefix(
    report: list[dict[str, Any]], trace: Path
) -> None:
    by = results(report)
    ref = by[rp.STREAM_REF]
    tr = read_trace(trace)
    sb = b"".join(o.data() for o in tr.owners.values() if o.name != "template")
    alone = zstandard.ZstdCompressor(level=19).compress(sb)
    assert ref["stored_bytes"] < len(alone)  # the prefix helps: these sandboxes fork it
    assert ref["policy"]["level"] == 19
    assert ref["verified_pages"] == NSB * N
    assert ref["ratio"] > by["lz4"]["ratio"]


def test_prefixed_stream_reaches_the_start_of_its_prefix() -> None:
    """Data equal to the first MiB of a 12 MiB incompressible prefix costs next to nothing: the
    window reaches past zstd's 8 MiB default back to the prefix's start. The prefix's part is
    told apart from the data's; with no prefix the data stands alone."""
    rng = random.Random(7)
    prefix = rng.randbytes(12 << 20)
    ps = rp.prefixed_stream(prefix, prefix[: 1 << 20])
    assert ps.window_log >= 24
    assert ps.data_bytes < 1024
    assert ps.prefix_bytes > len(prefix) * 0.99  # random bytes do not compress
    alone = rp.prefixed_stream(b"", prefix[: 1 << 20])
    assert alone.prefix_bytes == 0 and alone.data_bytes > (1 << 20) * 0.99


def test_table_shows_ratio_net_ratio_and_meta_share(
    report: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    rp.print_table(report[0])
    out = capsys.readouterr().out
    assert "ratio" in out and "net ratio" in out
    assert "metadata as % of sandbox bytes" in out
    assert "stream-ref is a reference" in out


def test_deprecated_names_still_work(
    trace: Path, tmp_path: Path, store_lib: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a.json"
    argv = [str(trace), "--strategies", "limit-lz4", "--no-stream-ref", "--json", str(out)]
    assert rp.main(argv) == 0
    assert "'limit-lz4' is deprecated, use 'max-effort-lz4'" in capsys.readouterr().err
    (rep,) = json.loads(out.read_text())
    assert [r["strategy"] for r in rep["results"]] == ["max-effort-lz4"]
    old, new = rp.STRATEGIES["limit-zstd"], rp.STRATEGIES["max-effort-zstd"]
    assert old.policy == new.policy and old.alias_of == new.name
    assert "limit-zstd" not in rp.DEFAULT


class _FlipOnRead:
    """The library with one byte flipped in what the batch read returns."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def az_host_get_batch(self, s: Any, ctx: Any, first: int, buf: Any, n: int) -> int:
        rc: int = self._lib.az_host_get_batch(s, ctx, first, buf, n)
        k = (n - 1) * PAGE_SIZE + 123  # the last page: a sandbox's
        buf[k] = bytes([buf[k][0] ^ 1])
        return rc


@pytest.mark.parametrize("name", ["lz4", "all"])
def test_every_page_is_verified_on_read_back(
    trace: Path, store_lib: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    tr = read_trace(trace)
    r = rp.replay(tr, rp.STRATEGIES[name])
    assert r["verified_pages"] == r["pages"] == (NSB + 1) * N
    real = corelib.load_lib()
    monkeypatch.setattr(corelib, "load_lib", lambda path=None: _FlipOnRead(real))
    with pytest.raises(CoreError, match="read back differs"):
        rp.replay(tr, rp.STRATEGIES[name])


def test_stream_reference_is_verified(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = zstandard.ZstdDecompressor

    class Flip:
        def __init__(self, **kw: Any) -> None:
            self._d = real(**kw)

        def decompress(self, data: bytes, **kw: Any) -> bytes:
            out = bytearray(self._d.decompress(data, **kw))
            out[-1] ^= 1
            return bytes(out)

    monkeypatch.setattr(rp.zstandard, "ZstdDecompressor", Flip)
    with pytest.raises(CoreError, match="read back differs"):
        rp.stream_reference(read_trace(trace))


def test_packed_strategies_pack_and_never_store_more(report: list[dict[str, Any]]) -> None:
    """The pack pass leaves every page readable (verified) and saves bytes on pages that have
    PLAIN neighbours of their own sandbox (the test trace's sandboxes have some)."""
    by = results(report)
    for plain, packed in (("xdelta", "xdelta-packed"), ("all", "all-packed")):
        a, b = by[plain], by[packed]
        assert b["verified_pages"] == a["verified_pages"] == a["pages"]
        assert b["stored_bytes"] < a["stored_bytes"], packed
        assert b["meta_bytes"] <= a["meta_bytes"], packed
        assert b["template_stored_bytes"] == a["template_stored_bytes"], packed
        assert b["sandbox_kinds"] == a["sandbox_kinds"], packed
        assert a["packed_pages"] == 0 and b["packed_pages"] > 0


def test_base_cache_use_is_reported(report: list[dict[str, Any]]) -> None:
    by = results(report)
    # no owners, no deltas: nothing reads a base
    reads = ("put_hits", "put_misses", "get_hits", "get_misses")
    assert [by["lz4"]["base_cache"][k] for k in reads] == [0, 0, 0, 0]
    for name in ("tdelta", "all"):
        bc = by[name]["base_cache"]
        kinds = by[name]["sandbox_kinds"]
        assert kinds["tdelta"] + kinds["xdelta"] > 0, kinds
        # each delta read back (twice) reads its base: from the cache or decoded
        assert bc["get_hits"] + bc["get_misses"] >= 2 * (kinds["tdelta"] + kinds["xdelta"]), bc
        assert bc["put_hits"] + bc["put_misses"] > 0, bc  # encoding against a base reads it
        assert bc["pages"] == 256  # the default size, in entries; they hold pages that serve:
        assert by[name]["meta"]["base_cache"] >= 256 * 33  # at least the entries' bookkeeping
