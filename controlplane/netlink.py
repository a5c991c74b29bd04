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

import importlib
import importlib.util
import os
import select
import sys
import threading
from collections.abc import Iterator
from typing import Any


def _lean_pyroute2() -> None:
    """Import pyroute2's netlink core without its package __init__ (which imports IPRoute, NDB,
    IPDB...: ~160 modules, 0.5 s here and over a minute in a TCG guest on 9p).  The first access
    to a top-level name (``pyroute2.IPRoute``) still runs the real __init__ (PEP 562), so other
    users of pyroute2 in the same process see the whole package."""
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def __getattr__(name: str) -> Any:
        if not name.startswith("__") and importlib.util.find_spec(f"pyroute2.{name}"):
            return importlib.import_module(f"pyroute2.{name}")  # a submodule: just that
        del mod.__dict__["__getattr__"]
        loader.exec_module(mod)
        return getattr(mod, name)

    mod.__dict__["__getattr__"] = __getattr__
    sys.modules["pyroute2"] = mod


_lean_pyroute2()

from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, genlmsg, nla  # noqa: E402
from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402
from pyroute2.netlink.generic import GenericNetlinkSocket  # noqa: E402

from controlplane import errors  # noqa: E402
from controlplane.abi import (  # noqa: E402
    ATTR_IDS,
    ATTRS,
    FAMILY,
    KIND_ATTRS,
    KINDS,
    MAX_LOAD_PAGES,
    MCGRP_EVENTS,
    PAGE_SIZE,
    POLICY_FIELDS,
    VERSION,
    Cmd,
    Codec,
    CowIndex,
    Event,
    Info,
    OwnerStats,
    Phase,
    Policy,
    validate_group,
)

__all__ = [
    "ATTRS",
    "ATTR_IDS",
    "FAMILY",
    "KINDS",
    "MAX_LOAD_PAGES",
    "MCGRP_EVENTS",
    "PAGE_SIZE",
    "POLICY_FIELDS",
    "VERSION",
    "AzswapMsg",
    "AzswapNetlink",
    "Cmd",
    "Codec",
    "Event",
    "EventListener",
    "Info",
    "OwnerStats",
    "Phase",
    "Policy",
    "build",
    "parse_event",
    "parse_owner",
    "validate_group",
]


class AzswapMsg(genlmsg):
    """genlmsg with the azswap attribute table."""

    nla_map = ATTRS

    class owner(nla):
        nla_map = ATTRS


# pyroute2 resolves the nested type through the class attribute of the *outer* message only.
AzswapMsg.owner.owner = AzswapMsg.owner  # type: ignore[attr-defined]


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
        kinds={k: a.get(attr, 0) for k, attr in zip(KINDS, KIND_ATTRS, strict=True)},
        registered=bool(a.get("AZSWAP_A_ST_REGISTERED", 1)),
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
            version=a.get("AZSWAP_A_VERSION", 0),
            nr_devices=a.get("AZSWAP_A_NR_DEVICES", 0),
            cow_index=CowIndex(a.get("AZSWAP_A_COW_INDEX", 0)),
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

    def sandbox_map(self, cgroup_id: int, start: int, pages: int, pgoff: int) -> None:
        """Owner ``cgroup_id`` maps a snapshot template privately: virtual pages
        [start, start + pages) hold its pages from ``pgoff`` on (pages 0 clears the map)."""
        self._request(
            Cmd.SANDBOX_MAP,
            [
                ("AZSWAP_A_CGROUP_ID", cgroup_id),
                ("AZSWAP_A_MAP_START", start),
                ("AZSWAP_A_MAP_PAGES", pages),
                ("AZSWAP_A_INDEX", pgoff),
            ],
            what=str(cgroup_id),
        )

    def phase_set(self, cgroup_id: int, phase: Phase) -> None:
        self._request(
            Cmd.PHASE_SET,
            [("AZSWAP_A_CGROUP_ID", cgroup_id), ("AZSWAP_A_PHASE", int(phase))],
            what=str(cgroup_id),
        )


def _strerror(code: int) -> str:
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
