"""The generic netlink family "azswap" against docs/netlink.md: every command, its errors and
extended acks, strict validation, admin permission, events."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct

import azswap_guest as ag
import pytest
from aznl import Client, NlError, WrongTypes


@pytest.fixture
def nl(dev0):
    dev0.set("disksize", "64M")
    c = Client()
    yield c
    c.close()


def err(fn, *a, **kw) -> NlError:
    with pytest.raises(NlError) as ei:
        fn(*a, **kw)
    return ei.value


def test_get_info_and_uninitialised_device(module) -> None:
    module(num_devices=2)
    c = Client()
    try:
        (info,) = c.request("GET_INFO")
        assert info["VERSION"] == 1 and info["NR_DEVICES"] == 2
        # 7.x indexes a copied-on-write page of a private file mapping by its virtual page
        assert info["COW_INDEX"] == (1 if int(os.uname().release.split(".")[0]) >= 7 else 0)
        cg = ag.Cgroup("nl-uninit")
        e = err(c.request, "SANDBOX_ADD", [("CGROUP_PATH", cg.rel), ("GROUP", 1)])
        assert e.code == errno.ENODEV and "disksize" in (e.msg or ""), e.msg
        e = err(c.request, "SANDBOX_ADD", [("DEV", 2), ("CGROUP_PATH", cg.rel), ("GROUP", 1)])
        assert e.code == errno.ENODEV and "no such azswap device" in (e.msg or "")
        # Policy can be set before disksize and sticks.
        c.request("POLICY_SET", [("DEV", 1), ("POLICY_DEDUP", 0)])
        (p,) = c.request("POLICY_GET", [("DEV", 1)])
        assert p["POLICY_DEDUP"] == 0
        ag.Dev(1).set("disksize", "8M")
        (p,) = c.request("POLICY_GET", [("DEV", 1)])
        assert p["POLICY_DEDUP"] == 0 and ag.Dev(1).read("dedup") == "0"
    finally:
        c.close()


def test_owners_and_errors(nl) -> None:
    sb, tp = ag.Cgroup("nl-sb"), ag.Cgroup("nl-tp")
    (r,) = nl.request("SANDBOX_ADD", [("CGROUP_PATH", sb.rel), ("GROUP", 7)])
    assert r["CGROUP_ID"] == sb.id
    (r,) = nl.request("TEMPLATE_ADD", [("CGROUP_ID", tp.id), ("GROUP", 7)])
    assert r["CGROUP_ID"] == tp.id

    cases = [
        # (command, attrs, errno, words expected in the extack message)
        ("SANDBOX_ADD", [("CGROUP_PATH", sb.rel), ("GROUP", 7)], errno.EEXIST, "already"),
        ("TEMPLATE_ADD", [("CGROUP_ID", sb.id), ("GROUP", 7)], errno.EEXIST, "already"),
        (
            "SANDBOX_ADD",
            [("CGROUP_PATH", "/no/such/cgroup"), ("GROUP", 1)],
            errno.ENOENT,
            "no such cgroup",
        ),
        ("SANDBOX_ADD", [("CGROUP_ID", 987654321), ("GROUP", 1)], errno.ENOENT, "no cgroup"),
        ("SANDBOX_ADD", [("CGROUP_PATH", sb.rel), ("GROUP", 0)], errno.EINVAL, ""),
        ("SANDBOX_ADD", [("CGROUP_PATH", sb.rel), ("GROUP", 1 << 31)], errno.EINVAL, ""),
        ("SANDBOX_ADD", [("CGROUP_PATH", sb.rel)], errno.EINVAL, "Missing"),
        ("SANDBOX_ADD", [("GROUP", 1)], errno.EINVAL, "exactly one"),
        (
            "SANDBOX_ADD",
            [("CGROUP_PATH", sb.rel), ("CGROUP_ID", sb.id), ("GROUP", 1)],
            errno.EINVAL,
            "exactly one",
        ),
        ("SANDBOX_ADD", [("CGROUP_ID", 0), ("GROUP", 1)], errno.EINVAL, "0"),
        (
            "SANDBOX_ADD",
            [("DEV", 9), ("CGROUP_PATH", sb.rel), ("GROUP", 1)],
            errno.ENODEV,
            "no such azswap device",
        ),
        ("SANDBOX_DEL", [("CGROUP_ID", tp.id)], errno.ENOENT, "no sandbox"),
        ("TEMPLATE_DEL", [("CGROUP_ID", sb.id)], errno.ENOENT, "no template"),
        ("SANDBOX_DEL", [], errno.EINVAL, "Missing"),
        ("STATS_GET", [("CGROUP_ID", 424242)], errno.ENOENT, "no owner"),
        ("PHASE_SET", [("CGROUP_ID", sb.id), ("PHASE", 4)], errno.EINVAL, ""),
        ("PHASE_SET", [("CGROUP_ID", 424242), ("PHASE", 1)], errno.ENOENT, "no registered"),
        ("PHASE_SET", [("CGROUP_ID", sb.id)], errno.EINVAL, "Missing"),
        (
            "SANDBOX_MAP",
            [("CGROUP_ID", 424242), ("MAP_START", 1 << 30), ("MAP_PAGES", 8), ("INDEX", 0)],
            errno.ENOENT,
            "no registered",
        ),
        ("SANDBOX_MAP", [("CGROUP_ID", sb.id), ("MAP_START", 1 << 30), ("INDEX", 0)],
         errno.EINVAL, "Missing"),
        (
            "SANDBOX_MAP",
            [("CGROUP_ID", sb.id), ("MAP_START", (1 << 64) - 4), ("MAP_PAGES", 8), ("INDEX", 0)],
            errno.EINVAL,
            "wraps",
        ),
        ("SANDBOX_MAP", [("CGROUP_ID", sb.id), ("MAP_START", 1 << 30), ("MAP_PAGES", 8),
                         ("INDEX", (1 << 64) - 4)], errno.EINVAL, "wraps"),
        ("POLICY_SET", [("POLICY_SIM_EFFORT", 65)], errno.EINVAL, ""),
        ("POLICY_SET", [("POLICY_LEVEL", 10)], errno.EINVAL, ""),
        ("POLICY_SET", [("POLICY_DELTA_MAX_PCT", 0)], errno.EINVAL, ""),
        ("POLICY_SET", [("POLICY_SHUFFLE", 2)], errno.EINVAL, ""),
        ("POLICY_SET", [("POLICY_CODEC", 2)], errno.EINVAL, ""),
        ("POLICY_SET", [("POLICY_DEDUP", 2), ("POLICY_XDELTA", 0)], errno.EINVAL, ""),
        # Reply-only attributes are not accepted in requests.
        ("POLICY_SET", [("VERSION", 1)], errno.EINVAL, ""),
        (
            "TEMPLATE_LOAD",
            [("CGROUP_ID", tp.id), ("INDEX", 0), ("PAGES", b"x" * 100)],
            errno.EINVAL,
            "whole",
        ),
        ("TEMPLATE_LOAD", [("CGROUP_ID", tp.id), ("INDEX", 0), ("PAGES", b"")], errno.EINVAL, ""),
        # 15 pages is the most an attribute can carry (its length is 16 bits).
        (
            "TEMPLATE_LOAD",
            [("CGROUP_ID", tp.id), ("INDEX", 0), ("PAGES", bytes(15 * 4096 + 1))],
            errno.EINVAL,
            "",
        ),
        (
            "TEMPLATE_LOAD",
            [("CGROUP_ID", sb.id), ("INDEX", 0), ("PAGES", bytes(4096))],
            errno.ENOENT,
            "no template",
        ),
        ("TEMPLATE_LOAD", [("CGROUP_ID", tp.id), ("PAGES", bytes(4096))], errno.EINVAL, "Missing"),
    ]
    (pol0,) = nl.request("POLICY_GET")
    owners0 = nl.request("STATS_GET", dump=True)
    for cmd, attrs, code, words in cases:
        e = err(nl.request, cmd, attrs)
        assert e.code == code, (cmd, attrs, e.code, e.msg)
        assert words in (e.msg or ""), (cmd, attrs, e.msg)
    # Nothing was half-applied.
    assert nl.request("POLICY_GET") == [pol0]
    assert nl.request("STATS_GET", dump=True) == owners0

    # Wrong attribute types and unknown attributes: strict validation.
    for attrs in (
        [("GROUP", 1), ("CGROUP_ID", sb.id)],
        [("DEV", 0)],
        [("UNKNOWN", 1)],
        [("PHASE", 1), ("CGROUP_ID", sb.id)],
    ):
        e = err(
            nl.request,
            "PHASE_SET" if ("PHASE", 1) in attrs else "SANDBOX_ADD",
            attrs,
            cls=WrongTypes,
        )
        assert e.code == errno.EINVAL, (attrs, e.code, e.msg)
        assert e.msg, f"no extended ack for {attrs}"

    # Stats: the unregistered bucket (id 0), the sandbox, the template.
    by_id = {o["CGROUP_ID"]: o for o in nl.request("STATS_GET", dump=True)}
    assert {0, sb.id, tp.id} <= set(by_id)
    assert by_id[sb.id]["GROUP"] == 7 and by_id[sb.id]["IS_TEMPLATE"] == 0
    assert by_id[tp.id]["IS_TEMPLATE"] == 1
    (one,) = nl.request("STATS_GET", [("CGROUP_ID", sb.id)])
    assert one == by_id[sb.id]

    # Phase hints show in the stats.
    nl.request("PHASE_SET", [("CGROUP_ID", sb.id), ("PHASE", 2)])
    (one,) = nl.request("STATS_GET", [("CGROUP_ID", sb.id)])
    assert one["ST_PHASE"] == 2 and one["ST_REGISTERED"] == 1

    # A snapshot mapped privately: set, replaced, cleared (its effect: test_microvm.py).
    for start, npages in ((1 << 30, 64), (1 << 31, 16), (0, 0)):
        assert nl.request("SANDBOX_MAP", [("CGROUP_ID", sb.id), ("MAP_START", start),
                                          ("MAP_PAGES", npages), ("INDEX", 3)]) == []

    # Snapshot-file template: a synthetic id, pages loaded as bases.
    nl.request("TEMPLATE_ADD", [("CGROUP_ID", 1 << 40), ("GROUP", 7)])
    pages = b"".join((f"template page {i} ".encode() * 300)[:4096] for i in range(15))
    before = ag.Dev(0).obj()["template_pages"]
    nl.request("TEMPLATE_LOAD", [("CGROUP_ID", 1 << 40), ("INDEX", 100), ("PAGES", pages)])
    assert ag.Dev(0).obj()["template_pages"] == before + 15
    (t,) = nl.request("STATS_GET", [("CGROUP_ID", 1 << 40)])
    assert t["IS_TEMPLATE"] == 1

    # Policy set/get round trip.
    nl.request(
        "POLICY_SET", [("POLICY_SIM_EFFORT", 8), ("POLICY_XDELTA", 0), ("POLICY_DELTA_MAX_PCT", 50)]
    )
    (p,) = nl.request("POLICY_GET")
    assert (p["POLICY_SIM_EFFORT"], p["POLICY_XDELTA"], p["POLICY_DELTA_MAX_PCT"]) == (8, 0, 50)
    assert ag.Dev(0).read("sim_effort") == "8"
    # The codec changes live over netlink (stored objects keep their encoding);
    # sysfs comp_algorithm keeps zram's EBUSY (test_device.py).
    nl.request("POLICY_SET", [("POLICY_SHUFFLE", 0)])
    (p,) = nl.request("POLICY_GET")
    assert p["POLICY_SHUFFLE"] == 0 and ag.Dev(0).read("shuffle") == "0"
    nl.request("POLICY_SET", [("POLICY_SHUFFLE", 1)])
    nl.request("POLICY_SET", [("POLICY_CODEC", 1), ("POLICY_LEVEL", 5)])
    (p,) = nl.request("POLICY_GET")
    assert (p["POLICY_CODEC"], p["POLICY_LEVEL"]) == (1, 5)
    assert ag.Dev(0).read("comp_algorithm") == "zstd:5"
    nl.request("POLICY_SET", [("POLICY_CODEC", 0)])
    assert nl.request("POLICY_GET")[0]["POLICY_CODEC"] == 0

    # Removal.
    nl.request("SANDBOX_DEL", [("CGROUP_ID", sb.id)])
    assert err(nl.request, "SANDBOX_DEL", [("CGROUP_ID", sb.id)]).code == errno.ENOENT
    e = err(nl.request, "SANDBOX_MAP",
            [("CGROUP_ID", sb.id), ("MAP_START", 1), ("MAP_PAGES", 1), ("INDEX", 0)])
    assert e.code == errno.ENOENT
    nl.request("TEMPLATE_DEL", [("CGROUP_ID", tp.id)])
    nl.request("TEMPLATE_DEL", [("CGROUP_ID", 1 << 40)])
    # Re-adding works.
    nl.request("SANDBOX_ADD", [("CGROUP_ID", sb.id), ("GROUP", 3)])


def test_admin_permission(nl) -> None:
    cg = ag.Cgroup("nl-perm")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)  # drops CAP_NET_ADMIN
            c = Client()
            res = []
            (info,) = c.request("GET_INFO")
            res.append(str(info["VERSION"]))
            for cmd, attrs, dump in [
                ("SANDBOX_ADD", [("CGROUP_ID", cg.id), ("GROUP", 1)], False),
                ("POLICY_SET", [("POLICY_DEDUP", 0)], False),
                ("PHASE_SET", [("CGROUP_ID", cg.id), ("PHASE", 1)], False),
                ("TEMPLATE_LOAD", [("CGROUP_ID", 5), ("INDEX", 0), ("PAGES", bytes(4096))],
                 False),
                # Per-sandbox counts would tell whether another sandbox holds a page.
                ("STATS_GET", [("CGROUP_ID", 0)], False),
                ("STATS_GET", [], True),
            ]:
                try:
                    c.request(cmd, attrs, dump=dump)
                    res.append("ok")
                except NlError as e:
                    res.append(str(e.code))
            c.request("POLICY_GET")
            res.append("get-ok")
            os.write(w, " ".join(res).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    out = os.read(r, 1000).decode().split()
    os.waitpid(pid, 0)
    assert out == ["1"] + [str(errno.EPERM)] * 6 + ["get-ok"], out


def test_events(nl) -> None:
    cg = ag.Cgroup("nl-ev")
    listener = Client(groups=("events",))
    try:
        nl.request("SANDBOX_ADD", [("CGROUP_ID", cg.id), ("GROUP", 5)])
        nl.request("PHASE_SET", [("CGROUP_ID", cg.id), ("PHASE", 3)])
        nl.request("SANDBOX_DEL", [("CGROUP_ID", cg.id)])
        ev = listener.events(3)
    finally:
        listener.close()
    got = [(e["cmd"], e.get("CGROUP_ID"), e.get("GROUP"), e.get("PHASE")) for e in ev]
    assert got == [(2, cg.id, 5, None), (10, cg.id, None, 3), (3, cg.id, 5, None)], got
    assert all(e.get("DEV") == 0 for e in ev)


def test_sim_slots_fixed_once_an_owner_registers(dev0) -> None:
    """sim_slots bounds the similarity index: free to change until it exists, EBUSY after."""
    dev0.set("sim_slots", "4")  # before disksize: kept and applied
    dev0.set("disksize", "64M")
    assert dev0.read("sim_slots") == "4"
    meta_small = int(dev0.read("mm_stat").split()[8])  # index_bytes: none yet
    assert meta_small == 0
    dev0.set("sim_slots", "8")
    c = Client()
    try:
        cg = ag.Cgroup("nl-simslots")
        c.request("SANDBOX_ADD", [("CGROUP_PATH", cg.rel), ("GROUP", 3)])
        idx8 = int(dev0.read("mm_stat").split()[8])
        assert idx8 > 0
        assert dev0.write("sim_slots", "1") == errno.EBUSY
        assert dev0.write("sim_slots", "8") == 0  # the value in force is accepted
        assert dev0.read("sim_slots") == "8"
        assert dev0.write("sim_slots", "5") == errno.EINVAL
    finally:
        c.close()
    # A reset frees the indexes: the next store takes another sim_slots.  The tables start
    # at the same small size either way (sim_slots sets how far they grow).
    dev0.set("reset", "1")
    dev0.set("sim_slots", "1")
    dev0.set("disksize", "64M")
    c = Client()
    try:
        c.request("SANDBOX_ADD", [("CGROUP_PATH", ag.Cgroup("nl-simslots2").rel), ("GROUP", 3)])
        assert int(dev0.read("mm_stat").split()[8]) == idx8
        assert dev0.read("sim_slots") == "1"
    finally:
        c.close()


# -- STATS_GET dump consistency ---------------------------------------------------------------

NLM_F_REQUEST, NLM_F_MULTI, NLM_F_DUMP_INTR, NLM_F_DUMP = 0x1, 0x2, 0x10, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3


class RawDump:
    """A STATS_GET dump read one datagram (one kernel batch) at a time, so that a test can
    change the registry between batches."""

    def __init__(self, family: int) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16)  # NETLINK_GENERIC
        self.sock.bind((0, 0))
        self.family = family

    def start(self) -> None:
        genl = struct.pack("=BBH", 7, 1, 0)  # STATS_GET, version 1
        hdr = struct.pack("=IHHII", 16 + len(genl), self.family, NLM_F_REQUEST | NLM_F_DUMP,
                          1, 0)
        self.sock.send(hdr + genl)

    def batch(self) -> tuple[list[int], bool, bool]:
        """(cgroup ids, any message flagged NLM_F_DUMP_INTR, done) of the next datagram."""
        data = self.sock.recv(1 << 20)
        ids: list[int] = []
        intr = done = False
        off = 0
        while off + 16 <= len(data):
            ln, typ, flags, _seq, _pid = struct.unpack_from("=IHHII", data, off)
            intr |= bool(flags & NLM_F_DUMP_INTR)
            if typ == NLMSG_DONE:
                done = True
            elif typ == NLMSG_ERROR:
                raise AssertionError(f"dump error {struct.unpack_from('=i', data, off + 16)}")
            else:
                a = off + 20  # nlmsghdr + genlmsghdr
                while a + 4 <= off + ln:
                    alen, atype = struct.unpack_from("=HH", data, a)
                    if atype == 2:  # CGROUP_ID
                        ids.append(struct.unpack_from("=Q", data, a + 4)[0])
                    a += (alen + 3) & ~3
            off += (ln + 3) & ~3
        return ids, intr, done

    def close(self) -> None:
        self.sock.close()


def test_stats_dump_resumes_by_entry(nl) -> None:
    """The dump resumes at the owner table entry after the last one sent: an owner removed
    from a batch already sent neither hides nor repeats any other, and the next batch says
    NLM_F_DUMP_INTR."""
    cgs = [ag.Cgroup(f"nl-dump-{i}") for i in range(40)]
    for cg in cgs:
        nl.request("SANDBOX_ADD", [("CGROUP_ID", cg.id), ("GROUP", 2)])
    d = RawDump(nl.sock.prid)
    try:
        d.start()
        # Batch 1 (entries 0..15) arrives; the kernel builds batch 2 as it is read.
        first, intr, done = d.batch()
        assert len(first) == 16 and not intr and not done
        gone = cgs[4].id  # sent in batch 1
        assert gone in first
        nl.request("SANDBOX_DEL", [("CGROUP_ID", gone)])
        seen, intr_after = list(first), False
        while not done:
            ids, intr, done = d.batch()
            seen += ids
            intr_after |= intr
    finally:
        d.close()
    want = [0] + [cg.id for cg in cgs]
    assert sorted(seen) == sorted(want), (set(want) - set(seen), len(seen))
    assert intr_after, "a batch after the registry changed must carry NLM_F_DUMP_INTR"
    # A dump that nothing disturbed is not flagged.
    d = RawDump(nl.sock.prid)
    try:
        d.start()
        ids, intr, done = d.batch()
        while not done:
            more, i2, done = d.batch()
            ids += more
            intr |= i2
    finally:
        d.close()
    assert not intr and sorted(ids) == sorted(set(want) - {gone})


def test_stats_dump_under_churn(nl) -> None:
    """~40 owners, owners added and removed by another process during the dumps: every owner
    registered throughout appears exactly once in every dump."""
    stable = [ag.Cgroup(f"nl-st-{i}") for i in range(30)]
    churn = [ag.Cgroup(f"nl-ch-{i}") for i in range(10)]
    for i, cg in enumerate(stable):
        nl.request("SANDBOX_ADD", [("CGROUP_ID", cg.id), ("GROUP", 1 + i % 3)])
        if i % 3 == 0:  # interleave churn entries with the stable ones in the table
            c = churn[i // 3]
            nl.request("SANDBOX_ADD", [("CGROUP_ID", c.id), ("GROUP", 9)])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(w)
            c = Client()
            os.set_blocking(r, False)
            n = 0
            while True:
                try:
                    if os.read(r, 1) == b"":
                        break
                except BlockingIOError:
                    pass
                cg = churn[n % len(churn)]
                with contextlib.suppress(NlError):
                    c.request("SANDBOX_DEL", [("CGROUP_ID", cg.id)])
                c.request("SANDBOX_ADD", [("CGROUP_ID", cg.id), ("GROUP", 9)])
                n += 1
            code = 0
        finally:
            os._exit(code)
    os.close(r)
    want = {cg.id for cg in stable} | {0}
    try:
        for _ in range(25):
            ids = [o["CGROUP_ID"] for o in nl.request("STATS_GET", dump=True)]
            got = [i for i in ids if i in want]
            assert sorted(got) == sorted(want), (len(got), set(want) - set(got))
            assert len(ids) == len(set(ids)), "an owner was listed twice"
    finally:
        os.close(w)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
