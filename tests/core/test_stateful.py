"""Random interleavings of store/free/registry operations (hypothesis stateful).

The model is a dict slot -> page.  After every step each live slot must
read back exactly, the core's own consistency check (refcounts, depth-1
bases, trust-group scoping) must pass and per-owner sums must equal the
global stats.  At the end everything is freed and every counter returns
to zero.
"""

from __future__ import annotations

import random

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from controlplane.trace.corelib import CODEC_LZ4, CODEC_ZSTD, Store

from . import pages
from .conftest import REPO, build_hostlib
from .test_redundancy import check_accounting

NSLOTS = 48
TEMPLATES = {100: 1, 200: 2}
SANDBOXES = {11: 1, 12: 1, 21: 2}
UNREG = 99
FAMILIES = [pages.make(["heap", "text", "heap", "floats"][i % 4], 7000 + i) for i in range(8)]

_built = False


def page_for(family: int, variant: int, seed: int) -> bytes:
    base = FAMILIES[family]
    rng = random.Random(seed)
    if variant == 0:
        return base
    if variant == 1:
        return pages.mutate(base, rng, rng.randrange(1, 16))
    if variant == 2:
        return pages.shift(base, rng)
    if variant == 3:
        return bytes(4096)
    return pages.rand(rng)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        global _built
        if not _built:
            build_hostlib()
            _built = True
        self.s = Store(NSLOTS, codec=random.choice([CODEC_LZ4, CODEC_ZSTD]), level=3)
        self.model: dict[int, bytes] = {}
        self.reg_t = set(TEMPLATES)
        self.reg_s = set(SANDBOXES)
        for t, g in TEMPLATES.items():
            self.s.add_template(t, g)
        for b, g in SANDBOXES.items():
            self.s.add_sandbox(b, g)

    owners = st.sampled_from([*TEMPLATES, *SANDBOXES, UNREG, 0])
    page = st.tuples(st.integers(0, 7), st.integers(0, 4), st.integers(0, 2**20))

    @rule(slot=st.integers(0, NSLOTS - 1), owner=owners, page=page, index=st.integers(0, 7))
    def put(self, slot, owner, page, index):
        p = page_for(*page)
        self.s.put(slot, p, owner=owner, index=index)
        self.model[slot] = p
        event(f"kind {self.s.kind(slot)}")

    @rule(slot=st.integers(0, NSLOTS - 1), owner=owners, page=page)
    def put_at_family_index(self, slot, owner, page):
        # Page index == family: template pages line up with sandbox pages.
        self.put(slot, owner, page, page[0])

    @rule(slot=st.integers(0, NSLOTS - 1))
    def free(self, slot):
        self.s.free(slot)
        self.model.pop(slot, None)

    @rule(tid=st.sampled_from(sorted(TEMPLATES)), page=page, index=st.integers(0, 7))
    def template_load(self, tid, page, index):
        if tid in self.reg_t:
            self.s.template_load(tid, index, page_for(*page))

    @rule(tid=st.sampled_from(sorted(TEMPLATES)), family=st.integers(0, 7))
    def template_load_family(self, tid, family):
        if tid in self.reg_t:
            self.s.template_load(tid, family, FAMILIES[family])

    @rule(tid=st.sampled_from(sorted(TEMPLATES)))
    def toggle_template(self, tid):
        if tid in self.reg_t:
            self.s.del_template(tid)
            self.reg_t.discard(tid)
        else:
            self.s.add_template(tid, TEMPLATES[tid])
            self.reg_t.add(tid)

    @rule(sid=st.sampled_from(sorted(SANDBOXES)))
    def toggle_sandbox(self, sid):
        if sid in self.reg_s:
            self.s.del_sandbox(sid)
            self.reg_s.discard(sid)
        else:
            self.s.add_sandbox(sid, SANDBOXES[sid])
            self.reg_s.add(sid)

    @rule(
        dedup=st.booleans(),
        tdelta=st.booleans(),
        xdelta=st.booleans(),
        effort=st.integers(0, 8),
        pct=st.integers(10, 100),
        shuffle=st.booleans(),
    )
    def policy(self, dedup, tdelta, xdelta, effort, pct, shuffle):
        self.s.set_policy(
            dedup=int(dedup),
            tdelta=int(tdelta),
            xdelta=int(xdelta),
            sim_effort=effort,
            delta_max_pct=pct,
            shuffle=int(shuffle),
        )

    @rule()
    def drain(self):
        self.s.drain()

    @precondition(lambda self: bool(self.model))
    @invariant()
    def reads_back(self):
        for slot, p in self.model.items():
            assert self.s.get(slot) == p, (slot, self.s.kind(slot))

    @invariant()
    def consistent(self):
        check_accounting(self.s)

    def teardown(self) -> None:
        s = self.s
        for slot in range(NSLOTS):
            s.free(slot)
        for t in self.reg_t:
            s.del_template(t)
        s.drain()
        stt = s.stats()
        try:
            assert stt["objects"] == 0, stt
            assert stt["pool_bytes"] == 0 and stt["stored_bytes"] == 0
            assert stt["bases"] == 0 and stt["template_pages"] == 0
            assert stt["pages_stored"] == 0 and stt["deferred"] == 0
            for o in s.list_owners():
                assert o["pages"] == 0 and o["exclusive_bytes"] == 0 and o["shared_bytes"] == 0
        finally:
            s.close()


StoreMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)
TestStoreMachine = StoreMachine.TestCase

__all__ = ["REPO", "TestStoreMachine"]
