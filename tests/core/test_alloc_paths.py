"""The store core's allocation and locking contract with its callers (azcore.h).

- The no-wait put never makes a sleeping allocation: the kernel glue holds its per-CPU context
  (a mutex) across it, and a sleeping allocation there would block reclaim on that context.
  When a no-wait allocation fails it says what it needs (-EAGAIN); the caller fills a reserve
  with the context dropped and puts again.
- The slot table is sized by the disk: above 512 GiB it is more than kvmalloc's INT_MAX (the host
  shim's az_valloc refuses such sizes as the kernel does); the table must not depend on it.
- Slot-free notify never waits for a slot lock a reader holds.
- The put path takes no registry lock, however many owners are registered.
"""

from __future__ import annotations

import ctypes
import errno

import pytest

from controlplane.trace.corelib import CoreError, PageInfo, Reserve, Store

from . import pages


def _put_nowait(s: Store, slot: int, page: bytes, res: Reserve, owner: int = 0) -> int:
    pi = PageInfo(owner, slot)
    return s.lib.az_store_put_nowait(s._s, s._ctx.ptr, slot, page, ctypes.byref(pi),
                                     ctypes.byref(res))


@pytest.mark.parametrize("owner", [0, 77], ids=["unregistered", "sandbox"])
def test_nowait_put_never_sleeps_and_asks_for_a_reserve(store, owner):
    if owner:
        store.add_sandbox(owner, 1)
    lib = store.lib
    old, new = pages.make("text", 1), pages.make("heap", 2)
    store.put(3, old, owner=owner)
    sleeping = lib.az_host_sleeping_allocs()
    store.fail_pool_allocs(1)  # the no-wait pool allocation fails
    res = Reserve()
    assert _put_nowait(store, 3, new, res, owner) == -errno.EAGAIN
    assert lib.az_host_sleeping_allocs() == sleeping, "slept while holding the context"
    assert store.get(3) == old, "a put that must retry changed the slot"
    # The caller drops its context, fills the reserve (may sleep), takes a context again.
    assert lib.az_reserve_fill(store._s, ctypes.byref(res)) == 0
    assert lib.az_host_sleeping_allocs() > sleeping
    assert _put_nowait(store, 3, new, res, owner) == 0
    lib.az_reserve_release(store._s, ctypes.byref(res))
    assert store.get(3) == new
    st = store.stats()
    assert st["stores"] == 2 and st["failed_stores"] == 0
    assert st["pool_bytes"] == st["stored_bytes"], "a reserved allocation leaked"
    store.check()


@pytest.mark.parametrize("owner", [0, 77], ids=["unregistered", "sandbox"])
def test_a_put_into_a_range_without_a_leaf_retries_with_everything_reserved(make_store, owner):
    """The slot table's leaf is a no-wait allocation like the others: when it fails, the retry
    has it reserved together with everything else the page needs, so no second no-wait
    allocation can fail it."""
    store = make_store(1024)
    if owner:
        store.add_sandbox(owner, 1)
    page = pages.make("heap", 5)
    n = int(store.lib.az_debug_leaf_slots())
    leaf_bytes, dir_bytes = n * 16, 1024 // n * 16
    store.fail_allocs_of(leaf_bytes, 1)  # the leaf of the range holding slot 600
    res = Reserve()
    assert _put_nowait(store, 600, page, res, owner) == -errno.EAGAIN
    assert res.leaf and res.size > 0 and bool(res.obj) == bool(owner)
    assert store.kind(600) is None and store.stats()["slot_bytes"] == dir_bytes
    assert store.lib.az_reserve_fill(store._s, ctypes.byref(res)) == 0
    store.fail_pool_allocs(2)  # no-wait allocations fail now: the reserve serves
    store.fail_allocs_of(leaf_bytes, 1)
    try:
        assert _put_nowait(store, 600, page, res, owner) == 0
    finally:
        store.fail_pool_allocs(0)
        store.fail_allocs_of(leaf_bytes, 0)
    store.lib.az_reserve_release(store._s, ctypes.byref(res))
    assert store.get(600) == page
    st = store.stats()
    assert st["failed_stores"] == 0 and st["slot_bytes"] == dir_bytes + leaf_bytes
    assert st["pool_bytes"] == st["stored_bytes"], "a reserved allocation leaked"
    store.check()


def test_template_paths_never_sleep(store):
    """A template's page also needs a template index node: no-wait too (TEMPLATE_LOAD and a
    template cgroup's swap-out hold the context)."""
    lib = store.lib
    store.add_template(900, 4)
    page = pages.make("heap", 9)
    sleeping = lib.az_host_sleeping_allocs()
    for _ in range(40):  # every page needs an object and a node: none may sleep
        res = Reserve()
        rc = lib.az_store_template_load_nowait(store._s, store._ctx.ptr, 900, 5, page,
                                               ctypes.byref(res))
        assert rc == 0
        lib.az_reserve_release(store._s, ctypes.byref(res))
    assert lib.az_host_sleeping_allocs() == sleeping
    assert store.stats()["template_pages"] == 1


TCHUNK_BYTES = 512  # a template index chunk (48 page indexes of a group)


def _load_nowait(s: Store, tid: int, index: int, page: bytes, res: Reserve) -> int:
    return s.lib.az_store_template_load_nowait(s._s, s._ctx.ptr, tid, index, page,
                                               ctypes.byref(res))


def test_template_chunk_that_cannot_be_had_without_waiting_is_reserved(store):
    """A template page whose index has no chunk yet: the no-wait allocation of the chunk fails,
    the load asks for a reserve (-EAGAIN) and changes nothing; with the chunk reserved it
    succeeds. A filled reserve that still falls short is -ENOMEM, counted."""
    lib = store.lib
    store.add_template(900, 4)
    page = pages.make("heap", 9)
    sleeping = lib.az_host_sleeping_allocs()
    store.fail_allocs_of(TCHUNK_BYTES, 1)
    res = Reserve()
    assert _load_nowait(store, 900, 5, page, res) == -errno.EAGAIN
    assert lib.az_host_sleeping_allocs() == sleeping, "slept while holding the context"
    st = store.stats()
    assert st["template_pages"] == 0 and st["tnode_bytes"] == 0
    assert lib.az_reserve_fill(store._s, ctypes.byref(res)) == 0
    assert _load_nowait(store, 900, 5, page, res) == 0
    lib.az_reserve_release(store._s, ctypes.byref(res))
    st = store.stats()
    assert st["template_pages"] == 1 and st["tnode_bytes"] == TCHUNK_BYTES
    assert st["failed_stores"] == 0
    # the next index of the same chunk needs no allocation at all
    store.fail_allocs_of(TCHUNK_BYTES, 1)
    res = Reserve()
    assert _load_nowait(store, 900, 6, pages.make("heap", 10), res) == 0
    lib.az_reserve_release(store._s, ctypes.byref(res))
    store.fail_allocs_of(TCHUNK_BYTES, 0)
    assert store.stats()["tnode_bytes"] == TCHUNK_BYTES
    # another chunk, and the sleeping allocation fails too
    store.fail_allocs_of(TCHUNK_BYTES, 2)
    res = Reserve()
    assert _load_nowait(store, 900, 500, page, res) == -errno.EAGAIN
    assert lib.az_reserve_fill(store._s, ctypes.byref(res)) == -errno.ENOMEM
    lib.az_reserve_release(store._s, ctypes.byref(res))
    st = store.stats()
    assert st["template_pages"] == 2 and st["failed_stores"] == 1
    store.check()


def test_template_owner_put_whose_chunk_must_be_reserved(store):
    """A template cgroup's swap write: the chunk for its page's index is reserved like the
    object; the slot keeps its old page until the put succeeds, and the entry is then made."""
    lib = store.lib
    store.add_template(900, 4)
    store.add_sandbox(901, 4)
    old, page = pages.make("text", 1), pages.make("heap", 9)
    store.put(7, old, owner=900, index=200)
    store.fail_allocs_of(TCHUNK_BYTES, 1)
    res = Reserve()
    sleeping = lib.az_host_sleeping_allocs()
    assert _put_nowait(store, 7, page, res, 900) == -errno.EAGAIN  # index 7: a new chunk
    assert lib.az_host_sleeping_allocs() == sleeping, "slept while holding the context"
    assert store.get(7) == old
    assert lib.az_reserve_fill(store._s, ctypes.byref(res)) == 0
    assert _put_nowait(store, 7, page, res, 900) == 0
    lib.az_reserve_release(store._s, ctypes.byref(res))
    assert store.get(7) == page
    st = store.stats()
    assert st["template_pages"] == 2 and st["template_lost"] == 0
    assert st["tnode_bytes"] == 2 * TCHUNK_BYTES  # indexes 200 and 7
    store.put(8, page, owner=901, index=7)  # the template's page at its index: a duplicate
    assert store.kind(8) == "dup"
    store.check()


def test_filled_reserve_that_still_falls_short_is_enomem(store):
    res = Reserve()
    store.put(1, pages.make("text", 1))
    store.fail_pool_allocs(2)  # no-wait fails, and the fill's sleeping allocation too
    assert _put_nowait(store, 1, pages.make("text", 2), res) == -errno.EAGAIN
    assert store.lib.az_reserve_fill(store._s, ctypes.byref(res)) == -errno.ENOMEM
    store.lib.az_reserve_release(store._s, ctypes.byref(res))
    store.fail_pool_allocs(0)
    assert store.get(1) == pages.make("text", 1)
    st = store.stats()
    assert st["failed_stores"] == 1 and st["pool_bytes"] == st["stored_bytes"]


def test_slot_table_directory_above_int_max(lib_path):
    """40 TiB of slots: a slot table directory above INT_MAX bytes (virtual memory only on
    the host), and a leaf for the last slot."""
    nr_slots = (40 << 40) // 4096
    s = Store(nr_slots, lib=lib_path)
    assert s.stats()["slot_bytes"] > (1 << 31)
    try:
        last = nr_slots - 1
        p = pages.make("heap", 5)
        s.put(last, p)
        assert s.get(last) == p
        s.free(last)
    finally:
        s.close()


def test_free_notify_does_not_wait_for_a_reader(store):
    p = pages.make("text", 3)
    store.put(9, p)
    lib = store.lib
    assert lib.az_store_debug_slot_lock(store._s, 9, 1) == 0  # a reader decoding slot 9
    try:
        assert lib.az_store_free_notify(store._s, 9) == -errno.EBUSY
    finally:
        lib.az_store_debug_slot_lock(store._s, 9, 0)
    assert store.get(9) == p, "a missed free must leave the slot alone"
    assert lib.az_store_free_notify(store._s, 9) == 0
    assert store.kind(9) is None
    assert store.stats()["frees"] == 1


def test_put_path_takes_no_registry_lock(make_store):
    s = make_store(2048)
    for i in range(1, 1001):
        s.add_sandbox(i, 1 + i % 7)
    taken = s.lib.az_store_debug_reg_lock_taken(s._s)
    for slot in range(1000):
        owner = 1000 - slot  # the last registered ones too
        s.put(slot, pages.make("heap", slot), owner=owner, index=slot)
    for slot in range(1000, 1100):
        s.put(slot, pages.make("heap", slot), owner=5000 + slot)  # unregistered cgroups
    assert s.lib.az_store_debug_reg_lock_taken(s._s) == taken
    # ... and every page was still charged to its own owner.
    for slot in range(0, 1000, 97):
        assert s.owner_stats(1000 - slot)["pages"] == 1
    assert s.owner_stats(0)["pages"] == 100
    for slot in range(0, 1100, 37):
        assert s.get(slot) == pages.make("heap", slot)
    s.check()


def test_put_after_reregistration_uses_the_new_entry(make_store):
    """Entries are reused for other cgroups once idle: the lockless lookup must follow."""
    s = make_store(64)
    s.add_sandbox(10, 1)
    s.del_sandbox(10)  # idle: no pages; its entry may be reused
    s.add_sandbox(11, 2)
    s.put(0, pages.make("heap", 1), owner=11)
    s.put(1, pages.make("heap", 1), owner=10)  # unregistered now: no sharing with 11
    assert s.owner_stats(11)["pages"] == 1
    assert s.owner_stats(0)["pages"] == 1
    with pytest.raises(CoreError):
        s.owner_stats(10)
    s.add_sandbox(10, 2)
    s.put(2, pages.make("heap", 1), owner=10)
    assert s.owner_stats(10)["kind_pages"]["dup"] == 1
    s.check()
