"""The netlink client's message layout against docs/netlink.md and kmod/uapi/azswap_nl.h."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from controlplane import errors, netlink
from controlplane.netlink import ATTR_IDS, AzswapMsg, Cmd, build, parse_event, parse_owner

REPO = Path(__file__).resolve().parents[2]
UAPI = REPO / "kmod/uapi/azswap_nl.h"
DOC = REPO / "docs/netlink.md"

_NLA_TYPES = {
    "uint8": "u8",
    "uint32": "u32",
    "uint64": "u64",
    "asciiz": "string",
    "cdata": "binary",
    "owner": "nested",
}


def _doc_table() -> dict[str, tuple[int, str]]:
    rows = {}
    for m in re.finditer(
        r"^\|\s*(\d+)\s*\|\s*`(AZSWAP_A_\w+)`\s*\|\s*(\w+)\s*\|", DOC.read_text(), re.M
    ):
        rows[m.group(2)] = (int(m.group(1)), m.group(3))
    return rows


def test_attribute_ids_and_types_follow_the_doc() -> None:
    doc = _doc_table()
    assert len(doc) >= 29
    ours = {name: (i, _NLA_TYPES[t]) for i, name, t in netlink.ATTRS if i}
    assert ours == doc


def test_constants_match_the_uapi_header() -> None:
    if not UAPI.exists():
        pytest.skip("kmod/uapi/azswap_nl.h not present")
    text = UAPI.read_text()
    for name, i in ATTR_IDS.items():
        if name == "AZSWAP_A_UNSPEC":
            continue
        m = re.search(rf"\b{name}\s*=\s*(\d+)", text)
        assert m and int(m.group(1)) == i, name
    cmds = re.search(r"enum azswap_cmd \{(.*?)\};", text, re.S).group(1)
    names = [
        n for n in re.findall(r"AZSWAP_CMD_(\w+)", cmds) if not n.startswith(("UNSPEC", "MAX", "_"))
    ]
    assert [c.name for c in Cmd] == names[: len(Cmd)]
    assert f'"{netlink.FAMILY}"' in text and f"AZSWAP_GENL_VERSION\t{netlink.VERSION}" in text
    m = re.search(r"AZSWAP_LOAD_MAX_PAGES\s+(\d+)", text)
    assert m and int(m.group(1)) == netlink.MAX_LOAD_PAGES


def _nlas(data: bytes) -> list[tuple[int, bytes]]:
    out, off = [], 16 + 4  # nlmsghdr + genlmsghdr
    while off < len(data):
        ln, t = struct.unpack_from("HH", data, off)
        out.append((t, bytes(data[off + 4 : off + ln])))
        off += (ln + 3) & ~3
    return out


def test_sandbox_add_on_the_wire() -> None:
    m = build(
        Cmd.SANDBOX_ADD,
        [("AZSWAP_A_DEV", 0), ("AZSWAP_A_CGROUP_PATH", "/sb/1"), ("AZSWAP_A_GROUP", 5)],
    )
    m["header"]["type"] = 0x20
    m.encode()
    cmd, version = struct.unpack_from("BB", m.data, 16)
    assert (cmd, version) == (2, 1)
    assert _nlas(m.data) == [(1, b"\0\0\0\0"), (3, b"/sb/1\0"), (4, struct.pack("I", 5))]


def test_template_load_carries_u64_index_and_raw_pages() -> None:
    pages = bytes(range(256)) * 16 * 2  # two pages
    m = build(
        Cmd.TEMPLATE_LOAD,
        [("AZSWAP_A_CGROUP_ID", 1 << 63 | 7), ("AZSWAP_A_INDEX", 9), ("AZSWAP_A_PAGES", pages)],
    )
    m["header"]["type"] = 0x20
    m.encode()
    got = dict(_nlas(m.data))
    assert struct.unpack("Q", got[2])[0] == 1 << 63 | 7
    assert struct.unpack("Q", got[6])[0] == 9
    assert got[7] == pages


def _roundtrip(cmd: Cmd, attrs: list) -> AzswapMsg:
    m = build(cmd, attrs)
    m["header"]["type"] = 0x20
    m.encode()
    r = AzswapMsg(m.data)
    r.decode()
    return r


def test_stats_reply_flat_and_nested_parse_the_same() -> None:
    owner = [
        ("AZSWAP_A_CGROUP_ID", 77),
        ("AZSWAP_A_GROUP", 3),
        ("AZSWAP_A_IS_TEMPLATE", 0),
        ("AZSWAP_A_ST_PAGES", 10),
        ("AZSWAP_A_ST_ORIG_BYTES", 40960),
        ("AZSWAP_A_ST_EXCLUSIVE_BYTES", 1000),
        ("AZSWAP_A_ST_SHARED_BYTES", 24),
        ("AZSWAP_A_ST_TDELTA", 6),
        ("AZSWAP_A_ST_PLAIN", 4),
        ("AZSWAP_A_ST_PHASE", 2),
    ]
    flat = parse_owner(_roundtrip(Cmd.STATS_GET, [("AZSWAP_A_DEV", 0), *owner]))
    nested = parse_owner(_roundtrip(Cmd.STATS_GET, [("AZSWAP_A_OWNER", {"attrs": owner})]))
    assert flat == nested
    assert flat.cgroup_id == 77 and flat.stored_bytes == 1024 and flat.kinds["tdelta"] == 6
    assert flat.phase == netlink.Phase.LLM_WAIT


def test_stats_reply_without_id_is_a_protocol_error() -> None:
    with pytest.raises(errors.ProtocolError):
        parse_owner(_roundtrip(Cmd.STATS_GET, [("AZSWAP_A_ST_PAGES", 1)]))


def test_events_parse() -> None:
    ev = parse_event(
        _roundtrip(
            Cmd.PHASE_SET, [("AZSWAP_A_DEV", 0), ("AZSWAP_A_CGROUP_ID", 5), ("AZSWAP_A_PHASE", 1)]
        )
    )
    assert (
        ev is not None and ev.phase == netlink.Phase.TOOL and ev.to_dict()["event"] == "phase_set"
    )
    ev = parse_event(
        _roundtrip(
            Cmd.SANDBOX_ADD, [("AZSWAP_A_DEV", 0), ("AZSWAP_A_CGROUP_ID", 5), ("AZSWAP_A_GROUP", 9)]
        )
    )
    assert ev is not None and ev.group == 9 and ev.phase is None


def test_client_side_validation_before_sending() -> None:
    with pytest.raises(errors.InvalidValue):
        netlink.validate_group(0)
    with pytest.raises(errors.InvalidValue):
        netlink.validate_group(2**31)


def test_no_module_on_this_host_is_module_not_loaded() -> None:
    if Path("/sys/module/azswap").exists():
        pytest.skip("azswap is loaded here")
    with pytest.raises(errors.ModuleNotLoaded, match="not loaded"):
        netlink.AzswapNetlink()
    with pytest.raises(errors.ModuleNotLoaded):
        netlink.EventListener()
