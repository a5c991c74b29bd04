"""microVM sandboxes, live: recorded guest memory replayed into VMM-like processes in a guest.

    vm-tests/run --memory 4G -- .venv/bin/python -m bench.microvm \\
        [--dir vm-tests/out/microvm] [--styles private,anon,private-reclaim] \\
        [--systems azswap-lz4,azswap-zstd,zram-lz4,zram-zstd,zswap-lz4,zswap-zstd] [--json OUT]

Input: what vm-tests/microvm/record.py wrote (DIR/microvm.aztrace: the snapshot template's
non-zero pages and, per recorded guest, the pages that differ from the template at the same offset;
DIR/manifest.json: tasks and per-guest non-zero page counts). In this one guest, for every restore
style and every system:

 1. the template image is rebuilt on tmpfs (/run/azvm/template.ram, charged to this driver's
    cgroup, never reclaimed: it is the host page cache a VMM maps); the swap system is set up
    (bench/swapbench.py's per-system setup: zram, zswap over brd, azswap);
    for azswap the template is registered with a synthetic id (TEMPLATE_ADD) and the image loaded
    as bases (TEMPLATE_LOAD, controlplane/snapshot.py's streamed loader, which the daemon's
    template_load op uses), and every VM's cgroup is registered as a sandbox;
 2. each recorded VM becomes a VMM-like process (vm-tests/workloads/player.c) in its own memory
    cgroup /sys/fs/cgroup/azvm/vmN, its guest RAM at the same virtual address in every VM:
      private  the template image mapped MAP_PRIVATE (as Firecracker does) and the VM's differing
               pages written at their offsets (CoW: page->index = file page offset);
      anon     anonymous memory with the whole image copied in (QEMU's restore from a file),
               then the VM's differing pages: only non-zero pages are written;
      private-reclaim  as private, but the image is a copy on tmpfs charged to its own cgroup
               (azvm/image, for azswap registered as a sandbox of the template's group), which
               the host reclaims too once the VMs are in swap: the snapshot file in host memory
               is swapped like the VMs (azswap keeps its pages as duplicates of the bases);
    then memory.reclaim pushes the cgroup to swap (one VM after the other);
 3. stored bytes are read from the system (pool bytes; azswap: payload, metadata, per-owner and
    per-representation stats over netlink);
 4. restore: each VM touches every page it wrote (the swap-in faults), timed, and every page is
    checked against the recording (checksums); private-reclaim then reads the whole image back
    (tmpfs swap-in, timed) and checks every page of it.

Figures go to $AZSWAP_OUT/microvm-live.json; `python -m bench.microvm_report` joins
them with the host replay's unlimited-search limit and prints both views (docs/lab/microvm.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.kit import cgroups
from bench.kit.cgroups import reclaim_all as reclaim
from bench.kit.cgroups import stat as cg_stat
from bench.kit.shell import logger, read, sh
from bench.kit.swapdev import Azswap, apply_product_vm_settings, make_system
from bench.swapbench import Player, build_player, checksums, pct
from controlplane.trace import PAGE_SIZE, ROLE_TEMPLATE, Vma, read_trace

TOP = Path(__file__).resolve().parents[1]
CGROOT = Path("/sys/fs/cgroup/azvm")
RUN = Path("/run/azvm")
VM_BASE = 0x2000_0000_0000  # guest RAM's address in every VMM process (page index VM_BASE >> 12)
GROUP = 1
STYLES = ("private", "anon", "private-reclaim")
PRIVATE = ("private", "private-reclaim")  # styles that map the image MAP_PRIVATE
IMAGE_CG = "image"  # private-reclaim: the cgroup the image's tmpfs pages are charged to
SYSTEMS = ("azswap-lz4", "azswap-zstd", "zram-lz4", "zram-zstd", "zswap-lz4", "zswap-zstd",
           "azswap-lz4-noshuf", "azswap-zstd-noshuf", "azswap-zstd:6", "azswap-lz4/zstd:6")
# On request only: "-noshuf" (policy shuffle=0), "azswap-zstd:6" (zstd level 6, the level for
# sandboxes that idle long enough to pay twice the compression time of level 3),
# "azswap-lz4/zstd:6" (the template's bases in zstd level 6, loaded once and shared; then the
# policy switches to lz4 for the VMs' pages, which are restored often).
ON_REQUEST = ("azswap-lz4-noshuf", "azswap-zstd-noshuf", "azswap-zstd:6", "azswap-lz4/zstd:6")
CHUNK = 1024  # pages per socket write


log = logger("microvm")


@dataclass
class Vm:
    name: str
    task: str
    offs: np.ndarray  # page offsets of the owned pages, ascending
    data: bytes  # the owned pages, in offs order
    sums: np.ndarray  # their checksums
    nonzero: np.ndarray  # bool per owned page: not all zero
    nonzero_pages: int


@dataclass
class Recording:
    npages: int
    template_id: int
    tmpl_nonzero: np.ndarray  # bool per page offset
    tmpl_sums: np.ndarray  # checksum per page offset (0 for zero pages)
    image: Path
    vms: list[Vm]
    manifest: dict[str, Any]


def load_recording(d: Path, run: Path) -> Recording:
    """Read the trace; rebuild the template image on tmpfs; keep only the owned pages in memory."""
    manifest = json.loads((d / "manifest.json").read_text())
    npages = int(manifest["pages"])
    tr = read_trace(d / "microvm.aztrace")
    tmpl = [o for o in tr.owners.values() if o.role == ROLE_TEMPLATE]
    if len(tmpl) != 1:
        raise SystemExit("microvm: the trace needs exactly one template owner")
    t = tmpl[0]
    run.mkdir(parents=True, exist_ok=True)
    image = run / "template.ram"
    nz = np.zeros(npages, dtype=bool)
    tsums = np.zeros(npages, dtype=np.uint64)
    with open(image, "wb") as f:
        f.truncate(npages * PAGE_SIZE)
        for r in t.runs:
            idx = np.asarray(r.indexes, dtype=np.int64)
            sums = checksums(r.data)
            nz[idx] = True
            tsums[idx] = sums
            # consecutive indexes are written with one call
            k = 0
            while k < len(idx):
                j = k + 1
                while j < len(idx) and idx[j] == idx[j - 1] + 1:
                    j += 1
                f.seek(int(idx[k]) * PAGE_SIZE)
                f.write(r.data[k * PAGE_SIZE : j * PAGE_SIZE])
                k = j
    t.runs.clear()  # the image is on tmpfs now
    guests = {g["name"]: g for g in manifest["guests"]}
    vms = []
    for o in tr.owners.values():
        if o.role == ROLE_TEMPLATE:
            continue
        idx = np.asarray(o.indexes(), dtype=np.int64)
        data = o.data()
        order = np.argsort(idx, kind="stable")
        if not np.all(order == np.arange(len(idx))):
            data = b"".join(data[k * PAGE_SIZE : (k + 1) * PAGE_SIZE] for k in order)
            idx = idx[order]
        o.runs.clear()
        g = guests.get(o.name, {})
        pages = np.frombuffer(data, dtype=np.uint8).reshape(-1, PAGE_SIZE)
        vms.append(Vm(o.name, str(o.info.get("task", g.get("task", "?"))), idx, data,
                      checksums(data) if data else np.zeros(0, np.uint64),
                      pages.any(axis=1), int(g.get("info", {}).get("nonzero_pages", 0))))
    return Recording(npages, t.id, nz, tsums, image, vms, manifest)


# ------------------------------------------------------------------ VMM processes
class Vmm:
    """One recorded VM as a live process (player.c) in its own cgroup."""

    def __init__(self, exe: Path, lsock: socket.socket, sock_path: str, name: str,
                 cg: Path) -> None:
        self.proc = subprocess.Popen([str(exe), sock_path, name, str(cg)])
        conn, _ = lsock.accept()
        conn.settimeout(1800)
        self.p = Player(name, conn)
        (n,) = struct.unpack("<I", self.p.recv(4))
        got = self.p.recv(n).decode()
        if got != name:
            raise RuntimeError(f"expected VMM {name}, got {got}")
        self.expect = np.zeros(0, np.uint64)

    def map(self, rec: Recording, image: Path | None) -> None:
        """Guest RAM: @image mapped MAP_PRIVATE, or anonymous memory when None."""
        end = VM_BASE + rec.npages * PAGE_SIZE
        path = str(image) if image else ""
        rc = self.p.map(Vma(VM_BASE, end, 0, 3, path))
        if rc != 0:
            raise RuntimeError(f"{self.p.name}: mapping guest RAM failed ({rc})")
        maps = Path(f"/proc/{self.proc.pid}/maps").read_text()
        line = next((ln for ln in maps.splitlines() if ln.startswith(f"{VM_BASE:x}-")), "")
        fields = line.split(maxsplit=5)
        if not fields or (fields[5] if len(fields) > 5 else "") != path:
            raise RuntimeError(f"{self.p.name}: guest RAM is not mapped as asked: {line!r}")

    def fill(self, rec: Recording, vm: Vm, style: str) -> int:
        """Write the VM's pages; remember the expected checksum of each written page."""
        if style in PRIVATE:
            self._write(vm.offs, vm.data)
            self.expect = vm.sums
            return len(vm.offs)
        # anon: final content = owned page where owned, else the template page; non-zero only
        final_nz = rec.tmpl_nonzero.copy()
        final_sums = rec.tmpl_sums.copy()
        final_nz[vm.offs] = vm.nonzero
        final_sums[vm.offs] = vm.sums
        offs = np.flatnonzero(final_nz)
        img = np.memmap(rec.image, dtype=np.uint8, mode="r", shape=(rec.npages, PAGE_SIZE))
        owned = np.frombuffer(vm.data, dtype=np.uint8).reshape(-1, PAGE_SIZE)
        pos = np.searchsorted(vm.offs, offs)
        hit = (pos < len(vm.offs)) & (vm.offs[np.minimum(pos, len(vm.offs) - 1)] == offs)
        for c in range(0, len(offs), CHUNK):
            part = offs[c : c + CHUNK]
            buf = np.array(img[part])
            h = hit[c : c + CHUNK]
            if h.any():
                buf[h] = owned[pos[c : c + CHUNK][h]]
            self.p.write([VM_BASE + int(o) * PAGE_SIZE for o in part], buf.tobytes())
        self.p.sync()
        del img
        self.expect = final_sums[offs]
        return len(offs)

    def _write(self, offs: np.ndarray, data: bytes) -> None:
        for c in range(0, len(offs), CHUNK):
            part = offs[c : c + CHUNK]
            self.p.write([VM_BASE + int(o) * PAGE_SIZE for o in part],
                         data[c * PAGE_SIZE : (c + len(part)) * PAGE_SIZE])
        self.p.sync()

    def quit(self) -> None:
        self.p.quit()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------------ cgroups
def make_cgroups(names: list[str]) -> dict[str, Path]:
    return cgroups.make_tree(CGROOT, names)


def remove_cgroups() -> None:
    cgroups.remove_tree(CGROOT)


# ------------------------------------------------------------------ azswap template
def azswap_template(rec: Recording, style: str) -> dict[str, Any]:
    """TEMPLATE_ADD (synthetic id) + TEMPLATE_LOAD of the image, keyed where the VMs' pages are:
    the file page offset for private mappings, VM_BASE >> 12 + offset for anonymous guest RAM."""
    from controlplane import snapshot
    from controlplane.netlink import AzswapNetlink

    base = 0 if style in PRIVATE else VM_BASE // PAGE_SIZE
    t0 = time.perf_counter()
    with AzswapNetlink() as nl:
        nl.template_add(GROUP, cgroup_id=rec.template_id)
        res = snapshot.load(str(rec.image),
                            lambda idx, pages: nl.template_load(rec.template_id, base + idx, pages))
    return {"pages_loaded": res.pages_loaded, "pages_zero": res.pages_zero,
            "batches": res.batches, "load_s": time.perf_counter() - t0, "index_base": base}


def azswap_register(cgs: dict[str, Path]) -> dict[str, int]:
    from controlplane.netlink import AzswapNetlink

    with AzswapNetlink() as nl:
        return {n: nl.sandbox_add(GROUP, cgroup_path="/" + str(p.relative_to(CGROOT.parent)))
                for n, p in cgs.items()}


def azswap_map(cgroup_id: int, pid: int, image: Path) -> dict[str, int]:
    """SANDBOX_MAP: where the VMM maps the image privately (its /proc/PID/maps), which kernels
    that index a copied-on-write page by its virtual page (7.x) need for template deltas."""
    from controlplane.mapping import find_mapping
    from controlplane.netlink import AzswapNetlink

    m = find_mapping(pid, image)
    with AzswapNetlink() as nl:
        nl.sandbox_map(cgroup_id, m.start, m.pages, m.pgoff)
    return m.to_dict()


def azswap_owner_stats(ids: dict[str, int], tid: int) -> list[dict[str, Any]]:
    from controlplane.netlink import AzswapNetlink

    names = {v: k for k, v in ids.items()}
    names[tid] = "template"
    with AzswapNetlink() as nl:
        return [dict(o.to_dict(), name=names.get(o.cgroup_id, str(o.cgroup_id)))
                for o in nl.stats()]


def azswap_unregister(ids: dict[str, int], tid: int) -> None:
    from controlplane.netlink import AzswapNetlink

    with AzswapNetlink() as nl:
        for cid in ids.values():
            with contextlib.suppress(Exception):
                nl.sandbox_del(cid)
        with contextlib.suppress(Exception):
            nl.template_del(tid)


# ------------------------------------------------------------------ private-reclaim: the image
def image_copy(src: Path, dst: Path, cg: Path) -> None:
    """Copy the image to @dst (tmpfs) from a process in @cg, so that its pages are charged there
    (zero pages stay holes, as in the image)."""
    subprocess.run(["cp", "--sparse=always", str(src), str(dst)], check=True,
                   preexec_fn=cgroups.joiner(cg))


def image_readback(rec: Recording, path: Path) -> tuple[float, int]:
    """Read the image's non-zero pages back (tmpfs swap-in of what was reclaimed; the holes were
    never swapped and are not read); returns the seconds spent reading and the number of pages
    whose checksum differs from the recording's."""
    chunk = 256  # pages per read at most
    buf = bytearray(chunk * PAGE_SIZE)
    view = memoryview(buf)
    spent = 0.0
    bad = 0
    nz = np.flatnonzero(rec.tmpl_nonzero)
    if not len(nz):
        return spent, bad
    # runs of consecutive non-zero pages, cut at @chunk pages
    cuts = np.flatnonzero(np.diff(nz) != 1) + 1
    fd = os.open(path, os.O_RDONLY)
    try:
        for run in np.split(nz, cuts):
            for first in range(int(run[0]), int(run[-1]) + 1, chunk):
                n = min(chunk, int(run[-1]) + 1 - first)
                t0 = time.perf_counter()
                got = os.preadv(fd, [view[: n * PAGE_SIZE]], first * PAGE_SIZE)
                spent += time.perf_counter() - t0
                if got != n * PAGE_SIZE:
                    raise RuntimeError(f"{path}: short read at page {first}")
                sums = checksums(view[: n * PAGE_SIZE])
                bad += int((sums != rec.tmpl_sums[first : first + n]).sum())
    finally:
        os.close(fd)
    return spent, bad


# ------------------------------------------------------------------ one run
RESTORE_VMSTAT = ("pgfault", "pgmajfault", "pswpin", "swap_ra", "pgalloc_normal")


def restore_counters() -> dict[str, int]:
    """Context switches (/proc/stat ctxt) and the /proc/vmstat counters of a swap-in."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("ctxt "):
            out["context_switches"] = int(line.split()[1])
    for line in Path("/proc/vmstat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if k in RESTORE_VMSTAT:
            out[k] = int(v)
    return out


@contextlib.contextmanager
def perf_recording(out: Path | None) -> Iterator[None]:
    """Profile the block: `perf record -a -e cpu-clock` (all CPUs; a timer event, QEMU's TCG has
    no PMU), started disabled and enabled through its control FIFO just before the block (perf
    takes seconds to start under TCG), into @out; a flat report of it goes next to it (.txt).
    Nothing when @out is None."""
    if out is None:
        yield
        return
    work = Path(tempfile.mkdtemp(prefix="azperf-"))  # not the 9p share: perf drops samples there
    ctl, ack, data, log_path = work / "ctl", work / "ack", work / "perf.data", work / "perf.log"
    os.mkfifo(ctl)
    os.mkfifo(ack)
    # O_RDWR: neither open waits for perf, so a perf that never starts cannot hang the bench
    cfd = os.open(ctl, os.O_RDWR)
    afd = os.open(ack, os.O_RDWR | os.O_NONBLOCK)
    try:
        with open(log_path, "wb") as log_f:
            p = subprocess.Popen(["perf", "record", "-q", "-a", "-e", "cpu-clock", "-F", "1000",
                                  "-D", "-1", "--control", f"fifo:{ctl},{ack}", "-o", str(data)],
                                 stdout=subprocess.DEVNULL, stderr=log_f)

        def command(cmd: bytes) -> None:
            os.write(cfd, cmd + b"\n")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and p.poll() is None:
                if select.select([afd], [], [], 0.5)[0] and os.read(afd, 64).startswith(b"ack"):
                    return
            raise RuntimeError(f"perf did not take {cmd.decode()!r} (exit {p.poll()}): "
                               f"{log_path.read_text(errors='replace')[-300:]}")

        try:
            command(b"enable")
            yield
            command(b"disable")  # not after a failed block: its error is the one to see
        finally:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=600)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        rep = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--sort", "dso,sym",
                              "--percent-limit", "0.2"], capture_output=True, text=True)
        out.with_suffix(".txt").write_text(rep.stdout + rep.stderr[-2000:])
        shutil.move(data, out)
    finally:
        os.close(cfd)
        os.close(afd)
        shutil.rmtree(work, ignore_errors=True)


def run_one(rec: Recording, style: str, sysname: str, exe: Path, tmp: Path,
            sim_slots: int = 1, perf_out: Path | None = None) -> dict[str, Any]:
    system = make_system(sysname)
    remove_cgroups()
    reclaim_image = style == "private-reclaim"
    cgs = make_cgroups([v.name for v in rec.vms] + ([IMAGE_CG] if reclaim_image else []))
    if style in PRIVATE:
        pages = sum(len(v.offs) for v in rec.vms)
    else:
        pages = sum(max(v.nonzero_pages, len(v.offs)) for v in rec.vms)
    if reclaim_image:
        pages += int(rec.tmpl_nonzero.sum())
    # Sized as an operator would for this fleet (what it swaps + 10%): azswap's slot table and
    # indexes are provisioned per slot and counted in its metadata.
    nbytes = (pages * PAGE_SIZE * 11 // 10 + (16 << 20)) // PAGE_SIZE * PAGE_SIZE
    res: dict[str, Any] = {"system": sysname, "style": style, "ok": False, "vms": {},
                           "disksize": nbytes, "meta_order": "sandboxes-first"}
    if isinstance(system, Azswap):
        system.sim_slots = res["sim_slots"] = sim_slots
    az = sysname.startswith("azswap")
    ids: dict[str, int] = {}
    vmms: dict[str, Vmm] = {}
    sock_path = str(tmp / "vmm.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(sock_path)
    lsock.listen(64)
    lsock.settimeout(120)
    image = rec.image if style == "private" else None
    img_mnt = tmp / "image"
    try:
        system.setup(nbytes)
        if az:
            # Sandboxes first: registering the first owner allocates the indexes, which are
            # provisioned per slot like the slot table.  s0 then holds all per-slot metadata,
            # s1 - s0 the template's own (its bases, their objects and index entries).
            ids = azswap_register(cgs)
        s0 = system.stats()
        if isinstance(system, Azswap):
            res["template_load"] = azswap_template(rec, style)
            system.after_template()
        s1 = system.stats()
        if reclaim_image:
            img_mnt.mkdir(exist_ok=True)
            sh("mount", "-t", "tmpfs", "-o", f"size={rec.npages * PAGE_SIZE + (1 << 20)}",
               "azvm-image", str(img_mnt))
            image = img_mnt / "template.ram"
            image_copy(rec.image, image, cgs[IMAGE_CG])
        t_fill = t_out = 0.0
        for vm in rec.vms:
            t0 = time.perf_counter()
            v = Vmm(exe, lsock, sock_path, vm.name, cgs[vm.name])
            vmms[vm.name] = v
            v.map(rec, image)
            if az and image is not None:
                res.setdefault("maps", {})[vm.name] = azswap_map(ids[vm.name], v.proc.pid, image)
            written = v.fill(rec, vm, style)
            t_fill += time.perf_counter() - t0
            anon = cg_stat(cgs[vm.name]).get("anon", 0)
            t_out += (spent := reclaim(cgs[vm.name]))
            left = cg_stat(cgs[vm.name]).get("anon", 0)
            res["vms"][vm.name] = {"task": vm.task, "owned_pages": len(vm.offs),
                                   "written_pages": written, "anon_bytes": anon,
                                   "anon_after_reclaim": left, "reclaim_s": spent}
            log(f"{style}/{sysname}: {vm.name} ({vm.task}): {written} pages written, "
                f"{(anon - left) >> 20} MiB swapped out in {spent:.1f}s")
        s2 = system.stats()
        res["fill_s"], res["swapout_s"] = t_fill, t_out
        res["stats_before"], res["stats_after_template"], res["stats_after"] = s0, s1, s2
        sf = s2
        if reclaim_image:
            # the host reclaims the snapshot file's pages too, once the VMs are in swap
            cg = cgs[IMAGE_CG]
            shmem = cg_stat(cg).get("shmem", 0)
            spent = reclaim(cg, "shmem")
            sf = system.stats()
            res["stats_after_image"] = sf
            res["image"] = {
                "pages": int(rec.tmpl_nonzero.sum()), "shmem_bytes": shmem,
                "shmem_after_reclaim": cg_stat(cg).get("shmem", 0), "reclaim_s": spent,
                "swap_current": int(read(cg / "memory.swap.current")),
                "pool_bytes": sf.get("pool", 0) - s2.get("pool", 0),
                "meta_bytes": sf.get("meta", 0) - s2.get("meta", 0)}
            log(f"{style}/{sysname}: image: {(shmem - res['image']['shmem_after_reclaim']) >> 20}"
                f" MiB swapped out in {spent:.1f}s, "
                f"{res['image']['pool_bytes'] / 2**20:.1f} MiB in the pool")
        for vm in rec.vms:
            res["vms"][vm.name]["swap_current"] = int(read(cgs[vm.name] / "memory.swap.current"))
        swapped = sum(r["anon_bytes"] - r["anon_after_reclaim"] for r in res["vms"].values())
        res["swapped_out_bytes"] = swapped
        res["pool_bytes"] = sf.get("pool", 0)
        res["template_pool_bytes"] = s1.get("pool", 0) - s0.get("pool", 0)
        res["sandbox_pool_bytes"] = s2.get("pool", 0) - s1.get("pool", 0)
        if "payload" in s2:
            res["payload_bytes"] = sf["payload"]
            res["sandbox_payload_bytes"] = s2["payload"] - s1.get("payload", 0)
        if az:
            res["meta_bytes"] = sf.get("meta", 0)
            res["template_bytes"] = sf.get("template_bytes", 0)
            res["owners"] = azswap_owner_stats(ids, rec.template_id)
        # restore: every VM faults all its pages back, one VM after the other
        lats = []
        t_in = 0
        bad = 0
        with perf_recording(perf_out):
            counters0 = restore_counters()  # after perf's start-up, which switches a lot
            for vm in rec.vms:
                v = vmms[vm.name]
                total, lat, sums = v.p.touch()
                nbad = int((sums != v.expect).sum())
                bad += nbad
                lats.append(lat)
                t_in += total
                res["vms"][vm.name].update(restore_ms=total / 1e6, bad_pages=nbad)
            res["restore_counters"] = {k: v - counters0.get(k, 0)
                                       for k, v in restore_counters().items()}
        lat_all = np.concatenate(lats) if lats else np.zeros(0)
        res["restore_s"] = t_in / 1e9
        res["restored_pages"] = len(lat_all)
        res["load_p50_us"] = pct(lat_all, 50) / 1e3
        res["load_p99_us"] = pct(lat_all, 99) / 1e3
        res["bad_pages"] = bad
        res["ok"] = bad == 0
        res["stats_after_restore"] = system.stats()
        if reclaim_image and image is not None:
            spent, nbad = image_readback(rec, image)
            res["image"].update(restore_s=spent, bad_pages=nbad)
            res["stats_after_readback"] = system.stats()
            res["ok"] = res["ok"] and nbad == 0
        return res
    finally:
        for v in vmms.values():
            with contextlib.suppress(Exception):
                v.quit()
        lsock.close()
        if reclaim_image and img_mnt.is_mount():
            # the next run mounts here again: a tmpfs left behind would be stacked under it
            sh("umount", str(img_mnt))
        if az:
            azswap_unregister(ids, rec.template_id)
        try:
            system.teardown()
        except Exception as exc:  # keep going with the next system
            res["teardown_error"] = str(exc)
        remove_cgroups()


def summary_line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['style']}/{r['system']}: ERROR {r['error']}"
    return (f"{r['style']}/{r['system']}: swapped {r['swapped_out_bytes'] >> 20} MiB, pool "
            f"{r['pool_bytes'] / 2**20:.1f} MiB (sandboxes {r['sandbox_pool_bytes'] / 2**20:.1f}),"
            f" restore {r['restore_s']:.2f}s, verified={r['ok']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.microvm",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dir", type=Path, default=TOP / "vm-tests" / "out" / "microvm")
    ap.add_argument("--styles", default=",".join(STYLES))
    ap.add_argument("--systems", default=",".join(s for s in SYSTEMS if s not in ON_REQUEST))
    ap.add_argument("--vms", type=int, default=0, help="use only the first N recorded VMs")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--perf-restore", type=Path, default=None, metavar="DIR",
                    help="profile each run's restore (the VMs faulting their pages back) with "
                         "`perf record -a -e cpu-clock` into DIR/<style>-<system>-<n>.data and "
                         "a flat report of it (.txt); the restore is slower while it records")
    ap.add_argument(
        "--anon-sim-slots", type=int, default=4, choices=[1, 2, 4, 8, 16, 32, 64],
        help="azswap sysfs sim_slots (swap slots per similarity index entry) in the anonymous "
             "style, where most slots are duplicates of template bases and need no entry "
             "(default 4; docs/store.md). The private style swaps only the VMs' own pages, "
             "each its own object, and keeps the default 1.")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("microvm: needs root (run it through vm-tests/run)", file=sys.stderr)
        return 1
    styles = [s for s in a.styles.split(",") if s]
    systems = [s for s in a.systems.split(",") if s]
    for s in styles:
        if s not in STYLES:
            print(f"microvm: unknown style {s!r} (known: {', '.join(STYLES)})", file=sys.stderr)
            return 2
    for s in systems:
        if s not in SYSTEMS:
            print(f"microvm: unknown system {s!r} (known: {', '.join(SYSTEMS)})", file=sys.stderr)
            return 2
    if any(s.startswith("azswap") for s in systems) and not (TOP / "kmod/azswap.ko").exists():
        print("microvm: kmod/azswap.ko not built (make kmod)", file=sys.stderr)
        return 1
    out_dir = Path(os.environ.get("AZSWAP_OUT", TOP / "vm-tests" / "out"))
    jpath = a.json or out_dir / "microvm-live.json"
    log.file = jpath.with_suffix(".log")
    apply_product_vm_settings()  # page-cluster and swappiness as the product's service sets
    sh("swapoff", "-a", check=False)
    if not RUN.is_mount():
        RUN.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", "size=2g,mode=0755", "azvm", str(RUN))
    t0 = time.monotonic()
    rec = load_recording(a.dir, RUN)
    if a.vms:
        rec.vms = rec.vms[: a.vms]
    log(f"{a.dir}: {len(rec.vms)} VMs ({', '.join(v.task for v in rec.vms)}), template "
        f"{int(rec.tmpl_nonzero.sum())} non-zero pages of {rec.npages}, owned "
        f"{sum(len(v.offs) for v in rec.vms)} pages; loaded in {time.monotonic() - t0:.0f}s")
    tmp = Path(tempfile.mkdtemp(prefix="microvm-"))
    exe = build_player(tmp)
    report: dict[str, Any] = {
        "kernel": os.uname().release, "time": time.time(), "cpus": os.cpu_count(),
        "dir": str(a.dir), "manifest": rec.manifest, "vm_base": VM_BASE,
        "vms": [{"name": v.name, "task": v.task, "owned_pages": len(v.offs),
                 "nonzero_pages": v.nonzero_pages} for v in rec.vms],
        "template_nonzero_pages": int(rec.tmpl_nonzero.sum()), "npages": rec.npages,
        "runs": [],
    }
    with contextlib.suppress(OSError):
        report["mem_total_kb"] = int(Path("/proc/meminfo").read_text().split()[1])
    if a.perf_restore:
        if shutil.which("perf") is None:
            print("microvm: --perf-restore needs perf (apt install linux-perf)", file=sys.stderr)
            return 1
        a.perf_restore.mkdir(parents=True, exist_ok=True)
    for style in styles:
        for s in systems:
            t1 = time.monotonic()
            perf_out = None
            if a.perf_restore:
                perf_out = a.perf_restore / (f"{style}-{s.replace('/', '_')}-"
                                             f"{len(report['runs'])}.data")
            try:
                r = run_one(rec, style, s, exe, tmp,
                            a.anon_sim_slots if style == "anon" else 1, perf_out)
            except Exception as exc:
                r = {"system": s, "style": style, "error": f"{type(exc).__name__}: {exc}"}
            r["wall_s"] = time.monotonic() - t1
            log(summary_line(r) + f" ({r['wall_s']:.0f}s)")
            report["runs"].append(r)
            jpath.write_text(json.dumps(report, indent=1, default=float))
    log(f"wrote {jpath}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(r.get("ok") for r in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
