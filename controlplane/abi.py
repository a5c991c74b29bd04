"""The azswap generic netlink ABI as Python values (docs/netlink.md, kmod/uapi/azswap_nl.h).

Commands, attributes, phases, codecs and the records the client returns, with no pyroute2 import:
code that only needs the names (azctl talking to the daemon, the scheduler, the tests) stays
cheap to import.  controlplane/netlink.py is the client that puts these on the wire.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any

from controlplane import errors

FAMILY = "azswap"
VERSION = 1
MCGRP_EVENTS = "events"
PAGE_SIZE = 4096
# AZSWAP_A_PAGES carries 1..15 whole pages (kmod/uapi/azswap_nl.h AZSWAP_LOAD_MAX_PAGES: an
# attribute length is 16 bits, so 16 pages do not fit).
MAX_LOAD_PAGES = 15


class Cmd(IntEnum):
    GET_INFO = 1
    SANDBOX_ADD = 2
    SANDBOX_DEL = 3
    TEMPLATE_ADD = 4
    TEMPLATE_DEL = 5
    TEMPLATE_LOAD = 6
    STATS_GET = 7
    POLICY_GET = 8
    POLICY_SET = 9
    PHASE_SET = 10
    SANDBOX_MAP = 11


class Phase(IntEnum):
    """AZSWAP_A_PHASE values; the names are the ones orchestrators and azctl use."""

    UNKNOWN = 0
    TOOL = 1
    LLM_WAIT = 2
    IDLE = 3

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, text: str | int) -> Phase:
        if isinstance(text, int):
            try:
                return cls(text)
            except ValueError:
                raise errors.InvalidValue(f"phase: {text} is not 0..3") from None
        key = text.strip().lower().replace("-", "_").upper()
        if key not in cls.__members__:
            raise errors.InvalidValue(
                f"phase: {text!r} is not one of tool, llm-wait, idle, unknown"
            )
        return cls[key]


class Codec(IntEnum):
    LZ4 = 0
    ZSTD = 1


# Attribute table of docs/netlink.md: (id, name, pyroute2 type).  The same table parses the flat
# owner attributes of a STATS reply and the nested AZSWAP_A_OWNER form.
ATTRS: tuple[tuple[int, str, str], ...] = (
    (0, "AZSWAP_A_UNSPEC", "none"),
    (1, "AZSWAP_A_DEV", "uint32"),
    (2, "AZSWAP_A_CGROUP_ID", "uint64"),
    (3, "AZSWAP_A_CGROUP_PATH", "asciiz"),
    (4, "AZSWAP_A_GROUP", "uint32"),
    (5, "AZSWAP_A_IS_TEMPLATE", "uint8"),
    (6, "AZSWAP_A_INDEX", "uint64"),
    (7, "AZSWAP_A_PAGES", "cdata"),
    (8, "AZSWAP_A_PHASE", "uint8"),
    (9, "AZSWAP_A_VERSION", "uint32"),
    (10, "AZSWAP_A_NR_DEVICES", "uint32"),
    (11, "AZSWAP_A_OWNER", "owner"),
    (12, "AZSWAP_A_POLICY_CODEC", "uint32"),
    (13, "AZSWAP_A_POLICY_LEVEL", "uint32"),
    (14, "AZSWAP_A_POLICY_DEDUP", "uint8"),
    (15, "AZSWAP_A_POLICY_TDELTA", "uint8"),
    (16, "AZSWAP_A_POLICY_XDELTA", "uint8"),
    (17, "AZSWAP_A_POLICY_SIM_EFFORT", "uint32"),
    (18, "AZSWAP_A_POLICY_DELTA_MAX_PCT", "uint32"),
    (19, "AZSWAP_A_POLICY_SHUFFLE", "uint8"),
    (20, "AZSWAP_A_ST_PAGES", "uint64"),
    (21, "AZSWAP_A_ST_ORIG_BYTES", "uint64"),
    (22, "AZSWAP_A_ST_EXCLUSIVE_BYTES", "uint64"),
    (23, "AZSWAP_A_ST_SHARED_BYTES", "uint64"),
    (24, "AZSWAP_A_ST_SAME", "uint64"),
    (25, "AZSWAP_A_ST_DUP", "uint64"),
    (26, "AZSWAP_A_ST_TDELTA", "uint64"),
    (27, "AZSWAP_A_ST_XDELTA", "uint64"),
    (28, "AZSWAP_A_ST_PLAIN", "uint64"),
    (29, "AZSWAP_A_ST_RAW", "uint64"),
    (30, "AZSWAP_A_ST_PHASE", "uint8"),
    (31, "AZSWAP_A_ST_REGISTERED", "uint8"),
    (32, "AZSWAP_A_MAP_START", "uint64"),
    (33, "AZSWAP_A_MAP_PAGES", "uint64"),
    (34, "AZSWAP_A_COW_INDEX", "uint8"),
)
ATTR_IDS: dict[str, int] = {name: i for i, name, _ in ATTRS}

KINDS = ("same", "dup", "tdelta", "xdelta", "plain", "raw")
KIND_ATTRS = tuple(f"AZSWAP_A_ST_{k.upper()}" for k in KINDS)

POLICY_FIELDS: dict[str, str] = {
    "codec": "AZSWAP_A_POLICY_CODEC",
    "level": "AZSWAP_A_POLICY_LEVEL",
    "dedup": "AZSWAP_A_POLICY_DEDUP",
    "tdelta": "AZSWAP_A_POLICY_TDELTA",
    "xdelta": "AZSWAP_A_POLICY_XDELTA",
    "sim_effort": "AZSWAP_A_POLICY_SIM_EFFORT",
    "delta_max_pct": "AZSWAP_A_POLICY_DELTA_MAX_PCT",
    "shuffle": "AZSWAP_A_POLICY_SHUFFLE",
}

# The values each policy knob accepts (kmod/uapi/azswap_nl.h, docs/netlink.md): the module
# refuses anything else with EINVAL.  Python code that checks a knob takes its range from here.
POLICY_RANGES: dict[str, tuple[int, int]] = {
    "codec": (int(Codec.LZ4), int(Codec.ZSTD)),
    "level": (1, 9),
    "dedup": (0, 1),
    "tdelta": (0, 1),
    "xdelta": (0, 1),
    "sim_effort": (0, 64),
    "delta_max_pct": (1, 100),
    "shuffle": (0, 1),
}


def policy_error(key: str, value: int) -> str | None:
    """Why ``key=value`` is not a valid policy knob, or None when it is."""
    if key not in POLICY_RANGES:
        return f"unknown policy field {key}"
    lo, hi = POLICY_RANGES[key]
    if not lo <= int(value) <= hi:
        return f"{POLICY_FIELDS[key]}: {value} not in {lo}..{hi}"
    return None


class CowIndex(IntEnum):
    """AZSWAP_A_COW_INDEX: how the kernel indexes a copied-on-write page of a private file
    mapping when it reaches swap (VIRTUAL: SANDBOX_MAP is needed for template deltas)."""

    FILE = 0
    VIRTUAL = 1


@dataclass(frozen=True)
class Info:
    version: int
    nr_devices: int
    cow_index: CowIndex = CowIndex.FILE


@dataclass
class Policy:
    codec: int = Codec.LZ4
    level: int = 3
    dedup: int = 1
    tdelta: int = 1
    xdelta: int = 1
    sim_effort: int = 4
    delta_max_pct: int = 80
    shuffle: int = 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["codec"] = Codec(self.codec).name.lower() if self.codec in (0, 1) else self.codec
        return d


@dataclass
class OwnerStats:
    """One owner (sandbox or template) as the module reports it."""

    cgroup_id: int
    group: int = 0
    is_template: bool = False
    phase: Phase = Phase.UNKNOWN
    pages: int = 0
    orig_bytes: int = 0
    exclusive_bytes: int = 0
    shared_bytes: int = 0
    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    registered: bool = True  # False: removed, listed while it still owns stored bytes

    @property
    def stored_bytes(self) -> int:
        return self.exclusive_bytes + self.shared_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["phase"] = self.phase.label
        d["stored_bytes"] = self.stored_bytes
        return d


@dataclass(frozen=True)
class Event:
    """A notification from the ``events`` multicast group."""

    cmd: Cmd
    dev: int
    cgroup_id: int
    group: int | None = None
    phase: Phase | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "event": self.cmd.name.lower(),
            "dev": self.dev,
            "cgroup_id": self.cgroup_id,
        }
        if self.group is not None:
            d["group"] = self.group
        if self.phase is not None:
            d["phase"] = self.phase.label
        return d


def validate_group(group: int) -> int:
    if not 1 <= int(group) <= 2**31 - 1:
        raise errors.InvalidValue(f"trust group {group}: must be 1..2147483647")
    return int(group)
