"""A tiny pyroute2 client of the azswap generic netlink family, written from docs/netlink.md.

Independent of controlplane/netlink.py on purpose: the guest tests check the kernel side of the
ABI against the document, not against the other client.
"""

from __future__ import annotations

from typing import Any

from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, genlmsg
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic import GenericNetlinkSocket

CMD = {
    "GET_INFO": 1,
    "SANDBOX_ADD": 2,
    "SANDBOX_DEL": 3,
    "TEMPLATE_ADD": 4,
    "TEMPLATE_DEL": 5,
    "TEMPLATE_LOAD": 6,
    "STATS_GET": 7,
    "POLICY_GET": 8,
    "POLICY_SET": 9,
    "PHASE_SET": 10,
    "SANDBOX_MAP": 11,
}
ATTRS = (
    (0, "UNSPEC", "none"),
    (1, "DEV", "uint32"),
    (2, "CGROUP_ID", "uint64"),
    (3, "CGROUP_PATH", "asciiz"),
    (4, "GROUP", "uint32"),
    (5, "IS_TEMPLATE", "uint8"),
    (6, "INDEX", "uint64"),
    (7, "PAGES", "cdata"),
    (8, "PHASE", "uint8"),
    (9, "VERSION", "uint32"),
    (10, "NR_DEVICES", "uint32"),
    (11, "OWNER", "hex"),
    (12, "POLICY_CODEC", "uint32"),
    (13, "POLICY_LEVEL", "uint32"),
    (14, "POLICY_DEDUP", "uint8"),
    (15, "POLICY_TDELTA", "uint8"),
    (16, "POLICY_XDELTA", "uint8"),
    (17, "POLICY_SIM_EFFORT", "uint32"),
    (18, "POLICY_DELTA_MAX_PCT", "uint32"),
    (19, "POLICY_SHUFFLE", "uint8"),
    (20, "ST_PAGES", "uint64"),
    (21, "ST_ORIG_BYTES", "uint64"),
    (22, "ST_EXCLUSIVE_BYTES", "uint64"),
    (23, "ST_SHARED_BYTES", "uint64"),
    (24, "ST_SAME", "uint64"),
    (25, "ST_DUP", "uint64"),
    (26, "ST_TDELTA", "uint64"),
    (27, "ST_XDELTA", "uint64"),
    (28, "ST_PLAIN", "uint64"),
    (29, "ST_RAW", "uint64"),
    (30, "ST_PHASE", "uint8"),
    (31, "ST_REGISTERED", "uint8"),
    (32, "MAP_START", "uint64"),
    (33, "MAP_PAGES", "uint64"),
    (34, "COW_INDEX", "uint8"),
)
KINDS = ("same", "dup", "tdelta", "xdelta", "plain", "raw")


class AzMsg(genlmsg):
    nla_map = ATTRS


class WrongTypes(genlmsg):
    """Same ids, wrong sizes, plus an attribute id the family does not know."""

    nla_map = (
        (0, "UNSPEC", "none"),
        (1, "DEV", "uint64"),
        (2, "CGROUP_ID", "uint32"),
        (4, "GROUP", "uint64"),
        (8, "PHASE", "uint32"),
        (9, "VERSION", "uint32"),
        (40, "UNKNOWN", "uint32"),
    )


class NlError(Exception):
    def __init__(self, code: int, msg: str | None) -> None:
        super().__init__(code, msg)
        self.code, self.msg = code, msg


class Client:
    def __init__(self, groups: tuple[str, ...] = ()) -> None:
        self.sock = GenericNetlinkSocket(ext_ack=True)
        self.sock.bind("azswap", AzMsg)
        for g in groups:
            self.sock.add_membership(g)

    def close(self) -> None:
        self.sock.close()

    def request(
        self,
        cmd: str,
        attrs: list[tuple[str, Any]] | None = None,
        *,
        dump: bool = False,
        cls: type[genlmsg] = AzMsg,
    ) -> list[dict[str, Any]]:
        msg = cls()
        msg["cmd"] = CMD[cmd]
        msg["version"] = 1
        msg["attrs"] = list(attrs or [])
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        try:
            replies = self.sock.nlm_request(msg, msg_type=self.sock.prid, msg_flags=flags)
        except NetlinkError as e:
            extack = e.args[1] if len(e.args) > 1 else None
            raise NlError(e.code, extack) from None
        out = []
        for r in replies:
            if r["header"]["type"] != self.sock.prid:
                continue
            out.append({name: val for name, val in r["attrs"]})
        return out

    def events(self, count: int, timeout: int = 10) -> list[dict[str, Any]]:
        """Block until @count events arrived (pyroute2 buffers messages internally, so
        select() on the socket is no guide); SIGALRM ends a wait that would hang."""
        import signal

        def expire(*_: object) -> None:
            raise TimeoutError(f"fewer than {count} events in {timeout}s")

        out: list[dict[str, Any]] = []
        old = signal.signal(signal.SIGALRM, expire)
        signal.alarm(timeout)
        try:
            while len(out) < count:
                for m in self.sock.get():
                    if m["header"]["type"] == self.sock.prid:
                        d = {name: val for name, val in m["attrs"]}
                        d["cmd"] = m["cmd"]
                        out.append(d)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        return out
