"""Event parsing (the layout shared with faulttrace.c), records, histograms, the CLI's -h."""

from __future__ import annotations

import struct

import pytest

from ebpf.events import (
    EV_MAJOR,
    EV_MINOR,
    EVENT_SIZE,
    EventFormatError,
    FaultEvent,
    FaultRecords,
    format_log2_hist,
    log2_hist,
)

SRC = __import__("pathlib").Path(__file__).resolve().parents[2] / "ebpf" / "faulttrace.c"


def ev(addr: int, seq: int = 1, kind: int = EV_MAJOR, cg: int = 42, pid: int = 7,
       since: int = 1000, ts: int = 5) -> FaultEvent:
    return FaultEvent(ts, cg, addr, addr >> 12, since, pid, pid, seq, kind, 0)


def test_layout_matches_the_c_struct() -> None:
    # struct fault_event: 5 x u64 then 3 x u32 then 2 x u16, in this order
    text = SRC.read_text()
    body = text[text.index("struct fault_event {"):]
    body = body[: body.index("};")]
    types = [ln.split()[0] for ln in body.splitlines()[1:] if ln.strip() and ln.strip()[0] == "u"]
    assert types == ["u64"] * 5 + ["u32"] * 3 + ["u16"] * 2
    assert EVENT_SIZE == 5 * 8 + 3 * 4 + 2 * 2 == 56


def test_roundtrip_and_raw_bytes() -> None:
    e = FaultEvent(1, 2, 0x7F00_0000_1000, 77, 9, 100, 101, 3, EV_MINOR, 1)
    raw = e.pack()
    assert len(raw) == EVENT_SIZE
    assert FaultEvent.parse(raw) == e
    assert FaultEvent.parse(raw + b"\0" * 8) == e  # ring buffer records may be padded
    assert struct.unpack_from("<Q", raw, 16)[0] == 0x7F00_0000_1000
    assert e.page == (100, 0x7F00_0000_1000)
    assert not e.major


def test_bad_events_raise() -> None:
    with pytest.raises(EventFormatError):
        FaultEvent.parse(b"\0" * (EVENT_SIZE - 1))
    bad = FaultEvent(1, 2, 3, 4, 5, 6, 7, 8, 9, 0).pack()
    with pytest.raises(EventFormatError, match="kind"):
        FaultEvent.parse(bad)


def test_records_first_touch_order_per_phase() -> None:
    r = FaultRecords()
    r.add_sandbox("sb", 42)
    for a in (0x3000, 0x1000, 0x3000, 0x2000):
        r.add(ev(a, seq=1))
    r.add(ev(0x1000, seq=2, kind=EV_MINOR))
    sb = r.by_cgroup[42]
    assert sb.phases[1].order == [(7, 0x3000), (7, 0x1000), (7, 0x2000)]
    assert sb.phases[1].major == 4 and sb.phases[2].minor == 1
    assert sb.phases[2].minor_pages == {(7, 0x1000)}
    assert sb.major == 4 and sb.minor == 1
    assert r.add(ev(0x1000, cg=99)) is None and r.unknown == 1


def test_records_are_bounded() -> None:
    r = FaultRecords(keep_phases=3)
    r.add_sandbox("sb", 42)
    for seq in range(10):
        r.add(ev(0x1000, seq=seq))
    assert sorted(r.by_cgroup[42].phases) == [7, 8, 9]


def test_log2_hist_like_bpf_log2l() -> None:
    # bpf_log2l(v) = floor(log2(v)) + 1 for v > 0, 0 for 0
    assert log2_hist([0, 1, 2, 3, 4, 1023, 1024]) == {0: 1, 1: 1, 2: 2, 3: 1, 10: 1, 11: 1}
    lines = format_log2_hist({1: 1, 3: 4})
    assert lines[0].strip().startswith("ns")
    assert "4 -> 7" in lines[3] and "|" + "*" * 30 + "|" in lines[3]


def test_cli_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    from ebpf.faulttrace import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["-h"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "--no-module-events" in out


def test_cli_not_root_is_one_line(capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import ebpf.tracer
    from ebpf.faulttrace import main

    monkeypatch.setattr(ebpf.tracer.os, "geteuid", lambda: 1000)
    assert main(["-c", "/sys/fs/cgroup", "-d", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["faulttrace: error: must run as root (BPF is root-only: "
                   "kernel.unprivileged_bpf_disabled)"]


def test_cli_missing_cgroup_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from ebpf.faulttrace import main

    assert main(["-c", "/nonexistent/cg", "-d", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("faulttrace: error: cgroup /sys/fs/cgroup/nonexistent/cg")
