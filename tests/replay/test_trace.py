"""Page-trace format (docs/trace-format.md), replay through the host store core, recorder."""

from __future__ import annotations

import contextlib
import mmap
import os
import random
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import tpages as pages

from controlplane.trace import replay as rp
from controlplane.trace.format import (
    END_FIX,
    HEADER,
    OWNER_FIX,
    PAGE_SIZE,
    REC,
    ROLE_SANDBOX,
    ROLE_TEMPLATE,
    T_META,
    T_OWNER,
    TraceError,
    TraceWriter,
    parse_trace,
    read_trace,
)
from controlplane.trace.recorder import Proc, record

REPO = Path(__file__).resolve().parents[2]


def make_pages(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [
        pages.make(rng.choice(["heap", "text", "zero", "floats"]), rng.getrandbits(32))
        for _ in range(n)
    ]


def write_trace(path: Path, nsb: int = 3, n: int = 64, compress: int = 3) -> dict[int, bytes]:
    rng = random.Random(7)
    tmpl = make_pages(n, 1)
    data = {}
    with TraceWriter(path, meta={"style": "test"}, compress=compress) as w:
        w.owner(100, 1, ROLE_TEMPLATE, "template")
        w.vma(100, 0x10000000, 0x10000000 + n * PAGE_SIZE, 0, 3, "")
        w.pages(
            100,
            [0x10000 + i for i in range(n)],
            [0x10000000 + i * PAGE_SIZE for i in range(n)],
            b"".join(tmpl),
        )
        data[100] = b"".join(tmpl)
        for s in range(nsb):
            mine = [pages.mutate(p, rng, 4) if rng.random() < 0.5 else p for p in tmpl]
            w.owner(1 + s, 1, ROLE_SANDBOX, f"sb{s}", task="t")
            w.pages(
                1 + s,
                [0x10000 + i for i in range(n)],
                [0x10000000 + i * PAGE_SIZE for i in range(n)],
                b"".join(mine),
            )
            data[1 + s] = b"".join(mine)
    return data


@pytest.mark.parametrize("compress", [0, 3])
def test_round_trip(tmp_path: Path, compress: int) -> None:
    p = tmp_path / "t.aztrace"
    data = write_trace(p, compress=compress)
    tr = read_trace(p)
    assert tr.meta == {"style": "test"}
    assert list(tr.owners) == [100, 1, 2, 3]
    assert tr.nr_pages == 4 * 64
    for oid, d in data.items():
        assert tr.owners[oid].data() == d
    assert tr.owners[1].info["task"] == "t"
    assert tr.owners[100].vmas[0].start == 0x10000000
    assert tr.owners[100].indexes()[:2] == [0x10000, 0x10001]


def test_large_owner_splits_records(tmp_path: Path) -> None:
    p = tmp_path / "big.aztrace"
    n = 5000
    with TraceWriter(p, compress=1) as w:
        w.owner(1, 1, ROLE_SANDBOX, "sb")
        w.pages(1, list(range(n)), [i * PAGE_SIZE for i in range(n)], bytes(n * PAGE_SIZE))
    tr = read_trace(p)
    assert tr.nr_pages == n and len(tr.owners[1].runs) == 2


# ---------------------------------------------------------------- malformed traces
def good(tmp_path: Path) -> bytes:
    p = tmp_path / "g.aztrace"
    write_trace(p, nsb=1, n=4, compress=0)
    return p.read_bytes()


def refresh_crc(buf: bytearray) -> bytearray:
    """Recompute END's CRC so the test reaches the check it means to hit."""
    end = len(buf) - REC.size - END_FIX.size
    nrec, npg, _, z = END_FIX.unpack_from(buf, end + REC.size)
    END_FIX.pack_into(buf, end + REC.size, nrec, npg, zlib.crc32(bytes(buf[:end])), z)
    return buf


def first_record(buf: bytes, typ: int) -> int:
    off = HEADER.size
    while off < len(buf):
        t, _, _, plen = REC.unpack_from(buf, off)
        if t == typ:
            return off
        off += REC.size + plen
    raise AssertionError("no such record")


def test_malformed_headers(tmp_path: Path) -> None:
    b = good(tmp_path)
    with pytest.raises(TraceError, match="too short"):
        parse_trace(b[:10])
    with pytest.raises(TraceError, match="bad magic"):
        parse_trace(b"NOTATRACE" + b[9:])
    bad = bytearray(b)
    struct.pack_into("<H", bad, 8, 9)
    with pytest.raises(TraceError, match="unsupported trace version 9"):
        parse_trace(bytes(bad))
    bad = bytearray(b)
    struct.pack_into("<I", bad, 12, 8192)
    with pytest.raises(TraceError, match="page size 8192"):
        parse_trace(bytes(bad))


def test_truncated_everywhere(tmp_path: Path) -> None:
    b = good(tmp_path)
    for cut in (HEADER.size, HEADER.size + 3, len(b) // 2, len(b) - 1, len(b) - END_FIX.size):
        with pytest.raises(TraceError, match=r"truncated|END"):
            parse_trace(b[:cut])


def test_corruption_caught_by_crc(tmp_path: Path) -> None:
    b = bytearray(good(tmp_path))
    b[len(b) // 2] ^= 0x40  # inside page data
    with pytest.raises(TraceError, match="CRC mismatch"):
        parse_trace(bytes(b))


def test_trailing_garbage(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="after the END"):
        parse_trace(good(tmp_path) + b"x")


def test_unknown_record_type(tmp_path: Path) -> None:
    b = bytearray(good(tmp_path))
    off = first_record(b, 4)  # META
    b[off] = 9
    with pytest.raises(TraceError, match="unknown record type 9"):
        parse_trace(bytes(refresh_crc(b)))


def test_pages_for_undeclared_owner(tmp_path: Path) -> None:
    b = bytearray(good(tmp_path))
    off = first_record(b, 2)
    struct.pack_into("<Q", b, off + REC.size, 555)
    with pytest.raises(TraceError, match="owner 555 not declared"):
        parse_trace(bytes(refresh_crc(b)))


def test_bad_page_count(tmp_path: Path) -> None:
    b = bytearray(good(tmp_path))
    off = first_record(b, 2)
    struct.pack_into("<I", b, off + REC.size + 8, 3)  # says 3 pages, holds 4
    with pytest.raises(TraceError, match="3 pages need"):
        parse_trace(bytes(refresh_crc(b)))
    struct.pack_into("<I", b, off + REC.size + 8, 0)
    with pytest.raises(TraceError, match="bad page count 0"):
        parse_trace(bytes(refresh_crc(b)))


def test_payload_length_overflows(tmp_path: Path) -> None:
    b = bytearray(good(tmp_path))
    off = first_record(b, 2)
    struct.pack_into("<I", b, off + 4, 0xFFFFFFF0)
    with pytest.raises(TraceError, match="exceeds"):
        parse_trace(bytes(b))


def test_owner_rules(tmp_path: Path) -> None:
    p = tmp_path / "o.aztrace"
    with pytest.raises(TraceError, match="declared twice"), TraceWriter(p) as w:
        w.owner(1, 1, ROLE_SANDBOX, "a")
        w.owner(1, 1, ROLE_SANDBOX, "b")
    b = bytearray(good(tmp_path))
    off = first_record(b, 1)
    struct.pack_into("<I", b, off + REC.size + 8, 0)  # trust group 0
    with pytest.raises(TraceError, match="trust group 0"):
        parse_trace(bytes(refresh_crc(b)))
    b = bytearray(good(tmp_path))
    struct.pack_into("<Q", b, off + REC.size, 0)  # id 0 with role template
    with pytest.raises(TraceError, match="reserved for unregistered"):
        parse_trace(bytes(refresh_crc(b)))
    b = bytearray(good(tmp_path))
    b[off + REC.size + 16] = ord("[")  # JSON broken
    with pytest.raises(TraceError, match="bad JSON"):
        parse_trace(bytes(refresh_crc(b)))


DEEP = b'{"a":' * 100_000 + b"1" + b"}" * 100_000  # far deeper than Python's recursion limit


def test_deeply_nested_json_is_a_trace_error(tmp_path: Path) -> None:
    p = tmp_path / "deep-meta.aztrace"
    with TraceWriter(p) as w:
        w._record(T_META, DEEP)
    with pytest.raises(TraceError, match="META: JSON nested too deeply"):
        read_trace(p)
    q = tmp_path / "deep-owner.aztrace"
    with TraceWriter(q) as w:
        w._record(T_OWNER, OWNER_FIX.pack(1, 1, ROLE_SANDBOX, b"\0\0\0") + DEEP)
    with pytest.raises(TraceError, match="OWNER info: JSON nested too deeply"):
        parse_trace(q.read_bytes())


def test_deeply_nested_json_replay_cli_error(
    tmp_path: Path, store_lib: None, capsys: pytest.CaptureFixture
) -> None:
    p = tmp_path / "deep.aztrace"
    with TraceWriter(p) as w:
        w._record(T_META, DEEP)
    assert rp.main([str(p)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("replay: ") and "JSON nested too deeply" in err, err
    assert err.count("\n") == 1, err


def test_duplicate_and_unaligned_vaddr(tmp_path: Path) -> None:
    p = tmp_path / "d.aztrace"
    with pytest.raises(TraceError, match="written twice"), TraceWriter(p) as w:
        w.owner(1, 1, ROLE_SANDBOX, "a")
        w.pages(1, [0, 1], [0x1000, 0x1000], bytes(2 * PAGE_SIZE))
    b = bytearray(good(tmp_path))
    off = first_record(b, 2)
    struct.pack_into("<Q", b, off + REC.size + 16 + 8, 0x10000010)  # first entry's vaddr
    with pytest.raises(TraceError, match="not page aligned"):
        parse_trace(bytes(refresh_crc(b)))


def test_bad_zstd_frame(tmp_path: Path) -> None:
    p = tmp_path / "z.aztrace"
    write_trace(p, nsb=1, n=4, compress=3)
    b = bytearray(p.read_bytes())
    off = first_record(b, 2)
    b[off + REC.size + 16 + 8] ^= 0xFF  # inside the zstd frame
    with pytest.raises(TraceError, match=r"zstd|need"):
        parse_trace(bytes(refresh_crc(b)))


def test_random_garbage_never_crashes(tmp_path: Path) -> None:
    b = good(tmp_path)
    rng = random.Random(3)
    for _ in range(300):
        m = bytearray(b)
        for _ in range(rng.randrange(1, 8)):
            m[rng.randrange(len(m))] = rng.randrange(256)
        cut = rng.choice([len(m), rng.randrange(len(m))])
        with contextlib.suppress(TraceError):
            parse_trace(bytes(m[:cut]))


# ---------------------------------------------------------------- replay
def test_replay_every_strategy(tmp_path: Path, store_lib: None) -> None:
    p = tmp_path / "r.aztrace"
    write_trace(p, nsb=3, n=96)
    rep = rp.run(str(p), rp.DEFAULT)
    by = {r["strategy"]: r for r in rep["results"]}
    assert set(by) == {*rp.DEFAULT, rp.STREAM_REF}
    for r in rep["results"]:
        if r["reference"]:
            continue
        assert r["pages"] == 4 * 96
        assert r["sandbox_orig_bytes"] == 3 * 96 * PAGE_SIZE
        assert sum(r["kinds"].values()) == r["pages"]
    # per-page strategies never share; registered ones find the unchanged template pages
    assert by["lz4"]["kinds"]["dup"] == 0 and by["lz4"]["kinds"]["tdelta"] == 0
    assert by["dedup"]["sandbox_kinds"]["dup"] > 0
    assert by["tdelta"]["sandbox_kinds"]["tdelta"] > 0
    assert by["tdelta"]["sandbox_stored_bytes"] < by["lz4"]["sandbox_stored_bytes"]


def test_replay_cli_errors(tmp_path: Path, store_lib: None, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.aztrace"
    bad.write_bytes(b"garbage")
    assert rp.main([str(bad)]) == 1
    assert "too short" in capsys.readouterr().err
    assert rp.main([str(tmp_path / "missing")]) == 1
    assert "No such file" in capsys.readouterr().err
    good_p = tmp_path / "g.aztrace"
    write_trace(good_p, nsb=1, n=8)
    assert rp.main([str(good_p), "--strategies", "nope"]) == 2
    assert "unknown strategy" in capsys.readouterr().err
    out = tmp_path / "o.json"
    assert rp.main([str(good_p), "--strategies", "lz4,xdelta", "--json", str(out)]) == 0
    assert out.exists()


def test_replay_empty_trace(tmp_path: Path, store_lib: None) -> None:
    p = tmp_path / "e.aztrace"
    with TraceWriter(p) as w:
        w.owner(1, 1, ROLE_SANDBOX, "a")
    with pytest.raises(TraceError, match="no pages"):
        rp.run(str(p), ["lz4"])


# ---------------------------------------------------------------- recorder
CHILD = r"""
import mmap, os, sys
m = mmap.mmap(-1, 64 * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(64):
    tag = b"azswap-recorder-test" * 20
    m[i * 4096:(i + 1) * 4096] = bytes([i]) * 8 + os.urandom(8) + tag + bytes(3680)
import ctypes
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
print(hex(addr), flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not os.access("/proc/self/pagemap", os.R_OK), reason="no pagemap")
def test_recorder_reads_live_process(tmp_path: Path) -> None:
    pr = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        addr = int(pr.stdout.readline(), 16)
        out = tmp_path / "rec.aztrace"
        stats = record(str(out), [Proc(pr.pid, 7, 1, ROLE_SANDBOX, "child")], {"style": "t"})
        assert stats["child"]["pages"] >= 64
        tr = read_trace(out)
        o = tr.owners[7]
        got = dict(
            zip(
                o.vaddrs(),
                [o.data()[k * PAGE_SIZE : (k + 1) * PAGE_SIZE] for k in range(o.nr_pages)],
                strict=True,
            )
        )
        idx = dict(zip(o.vaddrs(), o.indexes(), strict=True))
        for i in range(64):
            page = got[addr + i * PAGE_SIZE]
            assert page[:8] == bytes([i]) * 8 and b"azswap-recorder-test" in page
            assert idx[addr + i * PAGE_SIZE] == (addr >> 12) + i
        assert any(v.start <= addr < v.end for v in o.vmas)
    finally:
        pr.kill()
        pr.wait()
    assert pr.returncode == -signal.SIGKILL
    assert mmap.PAGESIZE == PAGE_SIZE


def test_bench_report_from_replay_and_guest_results(tmp_path: Path, store_lib: None) -> None:
    """`make bench`'s report step: every chart and section is produced from measured inputs."""
    import argparse

    from bench import __main__ as bench

    p = tmp_path / "r.aztrace"
    write_trace(p, nsb=2, n=32)
    rep = [rp.run(str(p), rp.DEFAULT)]
    hist = [0] * 40
    hist[10] = 5
    row = {
        "ratio": 2.0,
        "owned_bytes": 1 << 20,
        "stored_bytes": 1 << 19,
        "load_p99_us": 10.0,
        "load_hist_us": hist,
        "ok": True,
    }
    sw = {
        "runs": [
            {
                "style": "test",
                "meta": {"n": 2, "size": "tiny"},
                "results": [{**row, "system": "zram-lz4"}, {**row, "system": "azswap-lz4"}],
            }
        ]
    }
    def reg(tool: float, saved: float, keeps: float | None) -> dict:
        return {"tool_mean_s": tool, "tool_p95_s": tool * 2, "e2e_s": 10.0,
                "slowdown": tool / 0.2, "saved_mib": saved, "peak_mib": 9.0, "keeps": keeps,
                "footprint_mib": 10.0 - saved, "bad_pages": 0}

    ph = {
        "swap": "azswap-lz4", "thp": "host", "thp_host": "always", "cpus": 2, "wait_scale": 1.0,
        "config": {"cycles": 3},
        "runs": [{"host": "idle", "style": "coding", "repeat": 0, "sandboxes": 2, "pages": 64,
                  "regimes": {"none": reg(0.2, 0.0, 0.0), "aggressive": reg(0.4, 6.0, 1.0),
                              "daemon": reg(0.24, 5.0, 0.833)}}],
    }
    made = bench.charts(tmp_path, sw, rep, [], ph)
    assert made == [
        "reduction.png",
        "representation.png",
        "latency.png",
        "styles.png",
        "slowdown.png",
    ]
    for m in made:
        assert (tmp_path / m).stat().st_size > 1000
    a = argparse.Namespace(n=2, size="tiny", seed=1)
    bench.write_report(tmp_path, a, sw, rep, [], [], made, ph)
    md = (tmp_path / "report.md").read_text()
    assert "![slowdown.png](slowdown.png)" in md
    assert "83%" in md  # the daemon keeps 5 of aggressive's 6 MiB saved


def test_bench_fails_when_the_guest_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make bench` exits non-zero when vm-tests/run did (e.g. a splat: 125), and writes no
    report from a failed guest run."""
    from bench import __main__ as bench

    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 125)

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    out = tmp_path / "out"
    rc = bench.main(["--out", str(out), "--styles", "", "--microvm", "skip", "--no-phase"])
    assert rc == 125
    assert len(calls) == 1 and calls[0][0].endswith("vm-tests/run")
    assert not (out / "report.md").exists()
