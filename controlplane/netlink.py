"""Generic netlink client of azswap.ko (family "azswap", version 1), see docs/netlink.md.

One class, :class:`AzswapNetlink`, with one method per command of the ABI and an event listener for
the ``events`` multicast group.  Message layout comes from pyroute2 (``genlmsg`` with an explicit
attribute table copied from docs/netlink.md); every failure becomes an exception from
:mod:`controlplane.errors` (the errno plus the extended-ack message the module sets)::

    with AzswapNetlink() as nl:
        print(nl.info())
        cid = nl.sandbox_add(group=1, cgroup_path="/sandboxes/sb1")
        nl.phase_set(cid, Phase.LLM_WAIT)
        for owner in nl.stats():
            print(owner.cgroup_id, owner.pages, owner.kinds)

A pyroute2 socket is not meant to be shared between threads: the daemon gives each thread its own
client (they are cheap: one socket and one family lookup).
"""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any

from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, genlmsg, nla
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic import GenericNetlinkSocket

from controlplane import errors

FAMILY = "azswap"
VERSION = 1
MCGRP_EVENTS = "events"
PAGE_SIZE = 4096
# AZSWAP_A_PAGES carries 1..15 whole pages (kmod/uapi/azswap_nl.h AZSWAP_LOAD_MAX_PAGES: an
# attribute length is 16 bits, so 16 pages do not fit; docs/netlink.md still says 16).
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
_ATTRS: tuple[tuple[int, str, str], ...] = (
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
)
ATTR_IDS: dict[str, int] = {name: i for i, name, _ in _ATTRS}

KINDS = ("same", "dup", "tdelta", "xdelta", "plain", "raw")
_KIND_ATTRS = tuple(f"AZSWAP_A_ST_{k.upper()}" for k in KINDS)

POLICY_FIELDS: dict[str, str] = {
    "codec": "AZSWAP_A_POLICY_CODEC",
    "level": "AZSWAP_A_POLICY_LEVEL",
    "dedup": "AZSWAP_A_POLICY_DEDUP",
    "tdelta": "AZSWAP_A_POLICY_TDELTA",
    "xdelta": "AZSWAP_A_POLICY_XDELTA",
    "sim_effort": "AZSWAP_A_POLICY_SIM_EFFORT",
    "delta_max_pct": "AZSWAP_A_POLICY_DELTA_MAX_PCT",
}


class AzswapMsg(genlmsg):
    """genlmsg with the azswap attribute table."""

    nla_map = _ATTRS

    class owner(nla):
        nla_map = _ATTRS


# pyroute2 resolves the nested type through the class attribute of the *outer* message only.
AzswapMsg.owner.owner = AzswapMsg.owner  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Info:
    version: int
    nr_devices: int


@dataclass
class Policy:
    codec: int = Codec.LZ4
    level: int = 3
    dedup: int = 1
    tdelta: int = 1
    xdelta: int = 1
    sim_effort: int = 4
    delta_max_pct: int = 80

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


def _attrs_of(m: nla | genlmsg) -> dict[str, Any]:
    return {name: value for name, value in m["attrs"]}


def parse_owner(msg: nla | genlmsg) -> OwnerStats:
    """An OwnerStats from a STATS_GET reply (flat attributes, or nested in AZSWAP_A_OWNER)."""
    a = _attrs_of(msg)
    if "AZSWAP_A_OWNER" in a:
        inner = _attrs_of(a["AZSWAP_A_OWNER"])
        a = {**{k: v for k, v in a.items() if k != "AZSWAP_A_OWNER"}, **inner}
    if "AZSWAP_A_CGROUP_ID" not in a:
        raise errors.ProtocolError("stats reply without AZSWAP_A_CGROUP_ID")
    phase = a.get("AZSWAP_A_ST_PHASE", a.get("AZSWAP_A_PHASE", 0))
    return OwnerStats(
        cgroup_id=a["AZSWAP_A_CGROUP_ID"],
        group=a.get("AZSWAP_A_GROUP", 0),
        is_template=bool(a.get("AZSWAP_A_IS_TEMPLATE", 0)),
        phase=Phase(phase) if phase in (0, 1, 2, 3) else Phase.UNKNOWN,
        pages=a.get("AZSWAP_A_ST_PAGES", 0),
        orig_bytes=a.get("AZSWAP_A_ST_ORIG_BYTES", 0),
        exclusive_bytes=a.get("AZSWAP_A_ST_EXCLUSIVE_BYTES", 0),
        shared_bytes=a.get("AZSWAP_A_ST_SHARED_BYTES", 0),
        kinds={k: a.get(attr, 0) for k, attr in zip(KINDS, _KIND_ATTRS, strict=True)},
    )


def parse_event(msg: genlmsg) -> Event | None:
    a = _attrs_of(msg)
    try:
        cmd = Cmd(msg["cmd"])
    except ValueError:
        return None
    if "AZSWAP_A_CGROUP_ID" not in a:
        return None
    phase = a.get("AZSWAP_A_PHASE")
    return Event(
        cmd=cmd,
        dev=a.get("AZSWAP_A_DEV", 0),
        cgroup_id=a["AZSWAP_A_CGROUP_ID"],
        group=a.get("AZSWAP_A_GROUP"),
        phase=Phase(phase) if phase in (0, 1, 2, 3) else None,
    )


def build(cmd: Cmd, attrs: list[tuple[str, Any]]) -> AzswapMsg:
    """A request message (exposed for tests that check the wire format)."""
    msg = AzswapMsg()
    msg["cmd"] = int(cmd)
    msg["version"] = VERSION
    msg["attrs"] = attrs
    return msg


def validate_group(group: int) -> int:
    if not 1 <= int(group) <= 2**31 - 1:
        raise errors.InvalidValue(f"trust group {group}: must be 1..2147483647")
    return int(group)


class AzswapNetlink:
    """Client of one azswap device's netlink commands (``dev`` is N of /dev/azswapN)."""

    def __init__(self, dev: int = 0) -> None:
        self.dev = dev
        self._lock = threading.Lock()
        self._sock = self._open()

    @staticmethod
    def _open(groups: tuple[str, ...] = ()) -> GenericNetlinkSocket:
        sock = GenericNetlinkSocket(ext_ack=True)
        sock.asyncore.module_err_level = "debug"  # we raise ModuleNotLoaded ourselves
        try:
            sock.bind(FAMILY, AzswapMsg)
            for g in groups:
                if g not in sock.mcast_groups:
                    raise errors.ModuleNotLoaded(
                        f"azswap netlink family has no '{g}' multicast group"
                    )
                sock.add_membership(g)
        except NetlinkError as e:
            sock.close()
            if e.code == 2:
                raise errors.ModuleNotLoaded(
                    "azswap module not loaded (no 'azswap' generic netlink family): "
                    "insmod kmod/azswap.ko"
                ) from None
            raise errors.from_netlink(e.code, None, "GET_FAMILY") from None
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> AzswapNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------

    def _request(
        self, cmd: Cmd, attrs: list[tuple[str, Any]], *, dump: bool = False, what: str = ""
    ) -> list[genlmsg]:
        attrs = [("AZSWAP_A_DEV", self.dev), *attrs]
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        with self._lock:
            try:
                replies = self._sock.nlm_request(
                    build(cmd, attrs), msg_type=self._sock.prid, msg_flags=flags
                )
            except NetlinkError as e:
                extack = e.args[1] if len(e.args) > 1 else None
                if extack == _strerror(e.code):
                    extack = None  # pyroute2 fills in strerror when there is no ext ack
                raise errors.from_netlink(e.code, extack, cmd.name, what) from None
        return [r for r in replies if r["header"]["type"] == self._sock.prid]

    # -- commands ---------------------------------------------------------------------------

    def info(self) -> Info:
        (reply,) = self._request(Cmd.GET_INFO, [])
        a = _attrs_of(reply)
        return Info(
            version=a.get("AZSWAP_A_VERSION", 0), nr_devices=a.get("AZSWAP_A_NR_DEVICES", 0)
        )

    def _owner_add(
        self, cmd: Cmd, group: int, cgroup_id: int | None, cgroup_path: str | None
    ) -> int:
        if (cgroup_id is None) == (cgroup_path is None):
            raise errors.InvalidValue("give exactly one of a cgroup id and a cgroup path")
        attrs: list[tuple[str, Any]] = [("AZSWAP_A_GROUP", validate_group(group))]
        if cgroup_id is not None:
            attrs.append(("AZSWAP_A_CGROUP_ID", int(cgroup_id)))
            what = f"cgroup id {cgroup_id}"
        else:
            attrs.append(("AZSWAP_A_CGROUP_PATH", cgroup_path))
            what = f"cgroup {cgroup_path}"
        replies = self._request(cmd, attrs, what=what)
        for r in replies:
            cid = r.get_attr("AZSWAP_A_CGROUP_ID")
            if cid is not None:
                return int(cid)
        if cgroup_id is not None:
            return int(cgroup_id)
        raise errors.ProtocolError(f"{cmd.name.lower()}: reply carries no cgroup id")

    def sandbox_add(
        self, group: int, *, cgroup_id: int | None = None, cgroup_path: str | None = None
    ) -> int:
        """Register a sandbox owner; returns its cgroup id."""
        return self._owner_add(Cmd.SANDBOX_ADD, group, cgroup_id, cgroup_path)

    def sandbox_del(self, cgroup_id: int) -> None:
        self._request(Cmd.SANDBOX_DEL, [("AZSWAP_A_CGROUP_ID", cgroup_id)], what=str(cgroup_id))

    def template_add(
        self, group: int, *, cgroup_id: int | None = None, cgroup_path: str | None = None
    ) -> int:
        """Register a template owner (a live cgroup, or a synthetic id for a snapshot file)."""
        return self._owner_add(Cmd.TEMPLATE_ADD, group, cgroup_id, cgroup_path)

    def template_del(self, cgroup_id: int) -> None:
        self._request(Cmd.TEMPLATE_DEL, [("AZSWAP_A_CGROUP_ID", cgroup_id)], what=str(cgroup_id))

    def template_load(self, cgroup_id: int, index: int, pages: bytes) -> None:
        """Load 1..15 whole pages as bases of template ``cgroup_id`` at page ``index``."""
        n, rest = divmod(len(pages), PAGE_SIZE)
        if rest or not 1 <= n <= MAX_LOAD_PAGES:
            raise errors.InvalidValue(
                f"template_load: {len(pages)} bytes is not 1..{MAX_LOAD_PAGES} whole pages"
            )
        self._request(
            Cmd.TEMPLATE_LOAD,
            [
                ("AZSWAP_A_CGROUP_ID", cgroup_id),
                ("AZSWAP_A_INDEX", index),
                ("AZSWAP_A_PAGES", pages),
            ],
            what=f"{cgroup_id} at page {index}",
        )

    def stats(self, cgroup_id: int | None = None) -> list[OwnerStats]:
        """Every owner's stats (a dump), or one owner's."""
        if cgroup_id is None:
            return [parse_owner(r) for r in self._request(Cmd.STATS_GET, [], dump=True)]
        replies = self._request(
            Cmd.STATS_GET, [("AZSWAP_A_CGROUP_ID", cgroup_id)], what=str(cgroup_id)
        )
        return [parse_owner(r) for r in replies]

    def policy_get(self) -> Policy:
        (reply,) = self._request(Cmd.POLICY_GET, [])
        a = _attrs_of(reply)
        p = Policy()
        for fname, attr in POLICY_FIELDS.items():
            if attr in a:
                setattr(p, fname, int(a[attr]))
        return p

    def policy_set(self, **fields: int) -> None:
        """Set any subset of the policy fields (the module validates all, then applies all)."""
        unknown = set(fields) - set(POLICY_FIELDS)
        if unknown:
            raise errors.InvalidValue(f"policy: unknown field(s) {', '.join(sorted(unknown))}")
        attrs = [(POLICY_FIELDS[k], int(v)) for k, v in fields.items()]
        if not attrs:
            raise errors.InvalidValue("policy: nothing to set")
        self._request(Cmd.POLICY_SET, attrs)

    def phase_set(self, cgroup_id: int, phase: Phase) -> None:
        self._request(
            Cmd.PHASE_SET,
            [("AZSWAP_A_CGROUP_ID", cgroup_id), ("AZSWAP_A_PHASE", int(phase))],
            what=str(cgroup_id),
        )


def _strerror(code: int) -> str:
    import os

    return os.strerror(code)


class EventListener:
    """Subscriber of the ``events`` multicast group (its own socket)::

    with EventListener() as ev:
        for event in ev.events(timeout=0.5):   # yields None on timeout
            ...
    """

    def __init__(self) -> None:
        self._sock = AzswapNetlink._open((MCGRP_EVENTS,))
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()

    def __enter__(self) -> EventListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def poll(self, timeout: float) -> list[Event]:
        """Events received within ``timeout`` seconds (possibly none)."""
        ready, _, _ = select.select([self._sock.fileno()], [], [], timeout)
        if not ready:
            return []
        out = []
        for msg in self._sock.get():
            if msg["header"]["type"] != self._sock.prid:
                continue
            ev = parse_event(msg)
            if ev is not None:
                out.append(ev)
        return out

    def events(self, timeout: float = 0.5) -> Iterator[Event | None]:
        while not self._closed:
            got = self.poll(timeout)
            if not got:
                yield None
            yield from got
