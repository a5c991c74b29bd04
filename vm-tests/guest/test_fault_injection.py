"""Allocation failures injected into the module's paths (failslab + fail_page_alloc).

The failures are aimed at what the kernel allocates inside single marked system calls
(faultinject.py): memory.reclaim writes (azswap's stores, plain and delta, run there), and
generic netlink commands (sandbox/template registration, template loads, policy and codec
switches, stats doit and dump). Every page the workers wrote is verified afterwards; failed
stores must be counted; a netlink command either fails with an allocation error and changes
nothing, or succeeds; after swapoff, discard and unload the store is empty and kmemleak finds
nothing.

Needs a kernel with fault injection in debugfs (the debug-kernel tier: vm-tests/run
--debug-kernel). On another kernel the test is skipped, but never under the debug tier
(AZSWAP_DEBUG_KERNEL=1): there a missing knob fails it.
"""

from __future__ import annotations

import errno
import os
import struct

import azswap_guest as ag
import faultinject as fi
import pytest

NPAGES = int(os.environ.get("AZSWAP_FI_PAGES", "1024"))  # 4 MiB per process
# An allocation failure, or (ENOBUFS) the socket's own skb: a netlink command may fail so.
ALLOC_ERRORS = {errno.ENOMEM, errno.ENOBUFS}
SYNTHETIC_TEMPLATE = 1 << 40


@pytest.fixture
def injection_ready() -> None:
    if not ag_in_guest():
        pytest.skip("runs inside the test kernel (vm-tests/run)")
    missing = [k for k in fi.KNOBS if not (fi.DEBUGFS / k / "probability").exists()]
    if not fi.kmemleak_available():
        missing.append("kmemleak")
    if missing:
        msg = f"kernel without fault injection / kmemleak in debugfs: {missing} missing"
        if os.environ.get("AZSWAP_DEBUG_KERNEL") == "1":
            pytest.fail(f"debug kernel: {msg}")
        pytest.skip(msg)


def ag_in_guest() -> bool:
    return bool(os.environ.get("AZSWAP_IN_GUEST"))


def _reclaim_marked(inj: fi.Injector, cg: ag.Cgroup, rounds: int = 3) -> dict[str, int]:
    """memory.reclaim writes with injection; each is complete, partial (EAGAIN) or failed
    by an allocation (ENOMEM from the write itself)."""
    out = {"ok": 0, "again": 0, "nomem": 0}
    fd = os.open(cg.path / "memory.reclaim", os.O_WRONLY)
    try:
        for _ in range(rounds):
            r = inj.write(fd, b"1G")
            if r >= 0:
                out["ok"] += 1
            elif -r == errno.EAGAIN:
                out["again"] += 1
            elif -r in ALLOC_ERRORS:
                out["nomem"] += 1
            else:
                raise AssertionError(f"memory.reclaim of {cg.path}: {os.strerror(-r)}")
    finally:
        os.close(fd)
    return out


def _registered(nl: fi.Genl, cid: int) -> bool:
    code, replies = nl.call("STATS_GET", [("CGROUP_ID", cid)])
    if code == errno.ENOENT:
        return False
    assert code == 0, os.strerror(code)
    return bool(replies[0][fi._ATTR["ST_REGISTERED"][0]][0])


def _must(nl: fi.Genl, cmd: str, attrs: list) -> list[dict[int, bytes]]:
    code, replies = nl.call(cmd, attrs)
    assert code == 0, f"{cmd} {attrs}: {os.strerror(code)}"
    return replies


def _policy(nl: fi.Genl) -> dict[int, bytes]:
    (p,) = _must(nl, "POLICY_GET", [])
    return p


class Tally:
    def __init__(self) -> None:
        self.ok: dict[str, int] = {}
        self.failed: dict[str, int] = {}

    def add(self, cmd: str, code: int) -> bool:
        """True when the command succeeded; an error other than an allocation's fails."""
        if code == 0:
            self.ok[cmd] = self.ok.get(cmd, 0) + 1
            return True
        assert code in ALLOC_ERRORS, f"{cmd}: {os.strerror(code)} under allocation failures"
        self.failed[cmd] = self.failed.get(cmd, 0) + 1
        return False


def _owner_churn(inj: fi.Injector, nl: fi.Genl, t: Tally, cgs: list[ag.Cgroup]) -> None:
    """Register and unregister sandboxes and templates with failures injected: a failed
    command leaves the registration as it was (an ENOBUFS answer may have come after the
    change: then the state is read back)."""
    for rnd in range(12):
        for k, cg in enumerate(cgs):
            tmpl = (rnd + k) % 2 == 0
            add, dele = ("TEMPLATE_ADD", "TEMPLATE_DEL") if tmpl else ("SANDBOX_ADD", "SANDBOX_DEL")
            before = _registered(nl, cg.id)
            cmd = dele if before else add
            attrs = [("CGROUP_ID", cg.id)] + ([] if before else [("GROUP", 5)])
            code, _ = nl.call(cmd, attrs, inj=inj)
            if not before and code == errno.EEXIST:
                raise AssertionError(f"{cg.path}: {cmd} says registered, stats say not")
            if before and code == errno.ENOENT:
                # Registered as the other kind: delete it as that.
                other = "SANDBOX_DEL" if tmpl else "TEMPLATE_DEL"
                code, _ = nl.call(other, [("CGROUP_ID", cg.id)], inj=inj)
                cmd = other
            ok = t.add(cmd, code)
            after = _registered(nl, cg.id)
            if ok:
                assert after != before, f"{cmd} {cg.path} succeeded without effect"
            elif code == errno.ENOMEM:
                assert after == before, f"{cmd} {cg.path} failed (ENOMEM) half applied"


def _policy_churn(inj: fi.Injector, nl: fi.Genl, t: Tally) -> None:
    """Codec, level and policy switches with failures injected: each applies fully or not."""
    settings = [
        [("POLICY_CODEC", 1), ("POLICY_LEVEL", 5)],
        [("POLICY_CODEC", 0)],
        [("POLICY_SIM_EFFORT", 8), ("POLICY_XDELTA", 0)],
        [("POLICY_CODEC", 1), ("POLICY_LEVEL", 1)],
        [("POLICY_SIM_EFFORT", 16), ("POLICY_XDELTA", 1), ("POLICY_DEDUP", 1)],
        [("POLICY_CODEC", 0)],
    ]
    for _ in range(4):
        for attrs in settings:
            before = _policy(nl)
            code, _ = nl.call("POLICY_SET", attrs, inj=inj)
            ok = t.add("POLICY_SET", code)
            after = _policy(nl)
            for name, val in attrs:
                num = fi._ATTR[name][0]
                got = int.from_bytes(after[num], "little")
                if ok:
                    assert got == val, (attrs, name, got)
            if code == errno.ENOMEM:
                assert after == before, f"POLICY_SET {attrs} failed (ENOMEM) half applied"


def _stats_churn(inj: fi.Injector, nl: fi.Genl, t: Tally, ids: list[int]) -> None:
    for _ in range(15):
        code, replies = nl.call("STATS_GET", dump=True, inj=inj)
        if t.add("STATS_GET dump", code):
            assert {fi.u64(r, "CGROUP_ID") for r in replies} >= {0, *ids}
        for cid in ids:
            code, replies = nl.call("STATS_GET", [("CGROUP_ID", cid)], inj=inj)
            if t.add("STATS_GET", code):
                assert fi.u64(replies[0], "CGROUP_ID") == cid


def _template_loads(inj: fi.Injector, nl: fi.Genl, t: Tally, d: ag.Dev) -> None:
    """TEMPLATE_LOAD batches with failures injected; template_pages only ever grows by whole
    pages, by at most the batch.  Full 15-page batches (a page takes several allocations, so
    at the usual rate these almost always fail part way), then single pages at a quarter of
    that rate, of which some go through."""
    pages = [(f"snapshot page {i} ".encode() * 300)[:4096] for i in range(15)]
    for rnd in range(24):
        n = 15 if rnd < 8 else 1
        before = d.obj()["template_pages"]
        batch = b"".join(struct.pack("=Q", rnd) + p[8:] for p in pages[:n])
        attrs = [("CGROUP_ID", SYNTHETIC_TEMPLATE), ("INDEX", rnd * 15), ("PAGES", batch)]
        with inj.rate(inj.probability if n > 1 else inj.probability // 4):
            code, _ = nl.call("TEMPLATE_LOAD", attrs, inj=inj)
        t.add("TEMPLATE_LOAD", code)
        grown = d.obj()["template_pages"] - before
        assert 0 <= grown <= n, (grown, n)
        if code == 0:
            assert grown == n, (grown, n)


def test_allocation_failures_store_delta_template_netlink(
    injection_ready, module, azpages, workers
) -> None:
    fi.kmemleak_clear()
    module()
    d = ag.Dev(0)
    d.set("base_cache", "1024")
    d.swapon("256M", prio=100)
    nl = fi.Genl()
    t = Tally()
    try:
        tcg = ag.Cgroup("fi-template")
        scgs = [ag.Cgroup(f"fi-sb{i}") for i in range(2)]
        plain = ag.Cgroup("fi-plain", "4M")
        churn = [ag.Cgroup(f"fi-churn{i}") for i in range(3)]
        with fi.Injector(azpages) as inj:
            # Registration itself under injection: retried until it went through.
            for cg, cmd in [(tcg, "TEMPLATE_ADD"), *((c, "SANDBOX_ADD") for c in scgs)]:
                for _ in range(50):
                    code, _ = nl.call(cmd, [("CGROUP_ID", cg.id), ("GROUP", 1)], inj=inj)
                    if t.add(cmd, code) or _registered(nl, cg.id):
                        break
                assert _registered(nl, cg.id), f"{cg.path}: {cmd} never went through"
        _must(nl, "TEMPLATE_ADD", [("CGROUP_ID", SYNTHETIC_TEMPLATE), ("GROUP", 1)])

        # A template process, two sandboxes forked from it (near-duplicate pages: deltas),
        # and two plain workers beyond their memory.max (swapped while they write).
        template = ag.Worker(azpages, tcg, NPAGES, seed=501)
        workers.append(template)
        template.call("fill")
        sandboxes = [template.fork(cg) for cg in scgs]
        workers.extend(sandboxes)
        for v, sb in enumerate(sandboxes, start=1):
            sb.call(f"edit {v} 2")
        for i in range(2):
            workers.append(ag.Worker(azpages, plain, NPAGES, seed=601 + i, thp=bool(i)))
        ag.all_call(workers[-2:], "fill")
        ag.verify_all(workers)

        reclaims = {}
        with fi.Injector(azpages) as inj:
            for cg in [tcg, *scgs, plain]:
                reclaims[cg.path.name] = _reclaim_marked(inj, cg)
            _template_loads(inj, nl, t, d)
            _owner_churn(inj, nl, t, churn)
            _policy_churn(inj, nl, t)
            _stats_churn(inj, nl, t, [tcg.id, *(c.id for c in scgs)])
            # Pages faulted back in and stored again, delta pages among them.
            ag.verify_all(workers)
            # (az_verify models one edit over pristine pages: rewrite them, then edit.)
            for k, w in enumerate(sandboxes):
                w.call("fill")
                w.call(f"edit {k + 3} 5")
            for cg in [tcg, *scgs, plain]:
                r = _reclaim_marked(inj, cg, rounds=2)
                for key, v in r.items():
                    reclaims[cg.path.name][key] += v
            injected = inj.injected()
        io, kinds, obj = d.io(), d.kinds(), d.obj()
        print(
            f"\ninjected {injected}\nreclaim {reclaims}\nnetlink ok {t.ok}\n"
            f"netlink failed {t.failed}\nio {io}\nkinds {kinds}\nobj {obj}"
        )
        assert injected["failslab"] > 0 and injected["fail_page_alloc"] > 0, injected
        assert io["failed_stores"] > 0, f"no store failed under injection: {io}"
        assert io["stores"] > 0 and io["failed_loads"] == 0, io
        assert kinds["tdelta"] + kinds["xdelta"] > 0, f"no delta stored: {kinds}"
        assert obj["template_pages"] > 0, obj
        assert sum(t.failed.values()) > 0, f"no netlink command failed: {t.ok}"
        for cmd in ("TEMPLATE_LOAD", "POLICY_SET", "STATS_GET"):
            assert t.ok.get(cmd, 0) > 0, f"{cmd} never succeeded under injection: {t.failed}"

        # Without injection: every page back and verified, then everything freed.
        ag.verify_all(workers)
        for cg in [tcg, *scgs, plain]:
            cg.reclaim("1G")
        ag.verify_all(workers)
        for cg in [tcg, *scgs, plain, *churn]:
            for cmd in ("SANDBOX_DEL", "TEMPLATE_DEL"):
                nl.call(cmd, [("CGROUP_ID", cg.id)])
        _must(nl, "TEMPLATE_DEL", [("CGROUP_ID", SYNTHETIC_TEMPLATE)])
        plain.set("memory.max", "max")
        d.swapoff()
        ag.verify_all(workers)
        d.assert_empty_after_swapoff()
    finally:
        nl.close()
    for w in workers:
        w.stop()
    workers.clear()
    assert d.write("reset", "1") == 0
    ag.rmmod()
    report = fi.kmemleak_report()
    assert not report.strip(), f"kmemleak after the module's unload:\n{report[:4000]}"
