"""In-guest swap benchmark: the same recorded pages on azswap, zram, zswap and no compression.

    vm-tests/run --memory 3G -- .venv/bin/python -m bench.swapbench \\
        [--trace T.aztrace ...] [--record fork,fresh-aslr,fresh-noaslr --n 8 --size default] \\
        [--systems none,zram-lz4,zram-zstd,zswap-lz4,zswap-zstd,azswap-lz4,azswap-zstd,
                   azswap-lz4-noshuf,azswap-zstd-noshuf,azswap-lz4-packed,azswap-zstd-packed,
                   azdev-lz4,azdev-zstd,
                   zram-zstd-dict,zram-lz4-recomp-zstd,zswap-lz4-shrink,ksm-zram-lz4]

For every trace (recorded beforehand with ``python -m bench.record``, or here with
--record) and every system, in this one guest:

 1. the system is set up as the only swap device (zram: /dev/zram0 with lz4/zstd; zswap: enabled
    with zsmalloc and lz4/zstd in front of a brd ramdisk swap device; azswap: /dev/azswap0 with the
    template and the sandboxes registered in one trust group over netlink, "-noshuf" with the
    shuffle policy off, "-packed" with the device packed once the sandboxes are out (sysfs
    `pack`: multi-page objects; the pass's time is reported apart); azdev: /dev/azswap0
    with nothing registered, i.e. same-filled + per-page lz4/zstd only, the zram-parity setup;
    none: no swap); the strongest Linux settings where the kernel has them: zram-zstd-dict
    (a zstd dictionary trained on the template's pages, `algorithm_params`, 6.12+),
    zram-lz4-recomp-zstd (every slot recompressed with zstd after each reclaim,
    CONFIG_ZRAM_MULTI_COMP), zswap-lz4-shrink (zswap's shrinker, 6.8+), ksm-zram-lz4 (KSM over
    the processes until nothing more merges, then zram-lz4; bench/kit/swapdev.py);
 2. the trace is played into live processes (vm-tests/workloads/player.c), each in its own memory
    cgroup under /sys/fs/cgroup/azbench: fork-style traces as a template process and children
    forked from it (a sandbox's pages are CoW copies and new pages, charged to its cgroup),
    fresh-process traces as independent processes; pages land at their recorded addresses (so
    page->index is the recorded index) and are checked against the trace;
 3. memory.reclaim pushes the template cgroup, then every sandbox cgroup to swap (timed);
 4. the stored bytes are read from the system (zram mm_stat, zswap debugfs, azswap mm_stat,
    kind_stat and per-owner netlink stats), the template's part apart from the sandboxes';
 5. every process touches its pages again (first-access latency per page = the swap-in fault)
    and checks every page against the trace (checksums).

Figures: sandbox-owned bytes (memory.stat anon of the sandbox cgroups before reclaim), bytes the
system holds for them (allocator pool bytes, plus what it holds outside the pool: KSM's metadata,
a zram dictionary on the template's side), the metadata it spends on them (System.meta: zram's
table entries, zswap's entries, azswap's slot entries, object headers, indexes and caches), the
reduction (owned / pool), the net reduction (owned / (pool + metadata)) and its ratio against
zram-lz4 from the same run, the total reduction with the template's pages and costs included,
swap-out and swap-in MB/s, load latency p50/p99.
JSON goes to $AZSWAP_OUT/swapbench.json (--json to change). Nothing here asserts timing.

Without --systems the default set runs, and a baseline the running kernel lacks (e.g. zram
recompression on a kernel without CONFIG_ZRAM_MULTI_COMP) is reported as "unavailable" with the
reason, without failing the run; a system named in --systems that does not come up fails it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.kit import cgroups
from bench.kit.cgroups import reclaim_all as reclaim
from bench.kit.cgroups import stat as cg_stat
from bench.kit.shell import logger, read, sh
from bench.kit.swapdev import FeatureMissing, apply_product_vm_settings, make_system
from controlplane.trace import PAGE_SIZE, ROLE_TEMPLATE, Owner, Trace, Vma, read_trace

TOP = Path(__file__).resolve().parents[1]
PLAYER_SRC = TOP / "vm-tests" / "workloads" / "player.c"
CG = Path("/sys/fs/cgroup")
CGROOT = CG / "azbench"
SYSTEMS = (
    "none",
    "zram-lz4",
    "zram-zstd",
    "zswap-lz4",
    "zswap-zstd",
    "azswap-lz4",
    "azswap-zstd",
    "azswap-lz4-noshuf",
    "azswap-zstd-noshuf",
    "azswap-lz4-packed",
    "azswap-zstd-packed",
    "azdev-lz4",
    "azdev-zstd",
    # the strongest Linux settings, on kernels that have them
    "zram-zstd-dict",
    "zram-lz4-recomp-zstd",
    "zswap-lz4-shrink",
    "ksm-zram-lz4",
    "zram-lz4-dict",
    "zswap-zstd-shrink",
    "ksm-zram-zstd",
)
# On request only: the "-noshuf" and "-packed" variants and the second codec of each baseline.
ON_REQUEST = (
    "azswap-lz4-packed",
    "azswap-zstd-packed",
    "zram-lz4-dict",
    "zswap-zstd-shrink",
    "ksm-zram-zstd",
)
# What runs unless --systems says otherwise.
DEFAULT_SYSTEMS = tuple(s for s in SYSTEMS if not s.endswith("-noshuf") and s not in ON_REQUEST)
MULTS = (np.arange(1, 513, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)


log = logger("swapbench")


def checksums(data: bytes | memoryview) -> np.ndarray:
    w = np.frombuffer(data, dtype="<u8").reshape(-1, 512)
    with np.errstate(over="ignore"):
        return (w * MULTS).sum(axis=1, dtype=np.uint64)


# ------------------------------------------------------------------ players
class Player:
    def __init__(self, name: str, conn: socket.socket) -> None:
        self.name = name
        self.c = conn
        self.pages = 0

    def send(self, b: bytes) -> None:
        self.c.sendall(b)

    def recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.c.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise RuntimeError(f"player {self.name} closed the connection")
            buf += chunk
        return bytes(buf)

    def map(self, v: Vma) -> int:
        path = v.path.encode()
        self.send(b"V" + struct.pack("<QQQII", v.start, v.end, v.pgoff, v.prot, len(path)) + path)
        return struct.unpack("<i", self.recv(4))[0]

    def write(self, vaddrs: list[int], data: bytes) -> None:
        # consecutive addresses go in one command
        k = 0
        n = len(vaddrs)
        while k < n:
            j = k + 1
            while j < n and vaddrs[j] == vaddrs[j - 1] + PAGE_SIZE and j - k < 1024:
                j += 1
            self.send(b"P" + struct.pack("<QI", vaddrs[k], j - k))
            self.send(data[k * PAGE_SIZE : j * PAGE_SIZE])
            k = j
        self.pages += n

    def sync(self) -> int:
        self.send(b"R")
        _, n = struct.unpack("<IQ", self.recv(12))
        return n

    def sums(self) -> np.ndarray:
        self.send(b"S")
        return np.frombuffer(self.recv(8 * self.pages), dtype="<u8")

    def touch(self) -> tuple[int, np.ndarray, np.ndarray]:
        self.send(b"T")
        total = struct.unpack("<Q", self.recv(8))[0]
        lat = np.frombuffer(self.recv(8 * self.pages), dtype="<u8")
        sums = np.frombuffer(self.recv(8 * self.pages), dtype="<u8")
        return total, lat, sums

    def fork(self, name: str, cg: Path) -> int:
        n, c = name.encode(), str(cg).encode()
        self.send(b"F" + struct.pack("<I", len(n)) + n + struct.pack("<I", len(c)) + c)
        return struct.unpack("<i", self.recv(4))[0]

    def mergeable(self) -> int:
        """madvise(MADV_MERGEABLE) the process's mappings: 0 or -errno."""
        self.send(b"K")
        return struct.unpack("<i", self.recv(4))[0]

    def quit(self) -> None:
        with contextlib.suppress(OSError):
            self.send(b"Q")
        self.c.close()


def build_player(tmp: Path) -> Path:
    exe = tmp / "azplayer"
    sh("cc", "-O2", "-o", str(exe), str(PLAYER_SRC))
    return exe


def subtract(vmas: list[Vma], cover: list[Vma]) -> list[Vma]:
    """Parts of ``vmas`` not covered by ``cover`` (what a forked child must map itself)."""
    out = []
    iv = sorted((c.start, c.end) for c in cover)
    for v in vmas:
        pieces = [(v.start, v.end)]
        for cs, ce in iv:
            nxt = []
            for s, e in pieces:
                if ce <= s or cs >= e:
                    nxt.append((s, e))
                    continue
                if s < cs:
                    nxt.append((s, cs))
                if ce < e:
                    nxt.append((ce, e))
            pieces = nxt
        for s, e in pieces:
            off = v.pgoff + (s - v.start) // PAGE_SIZE if v.path.startswith("/") else 0
            out.append(Vma(s, e, off, v.prot, v.path))
    return out


class Playback:
    """The trace as live processes, one memory cgroup per owner."""

    def __init__(
        self, tr: Trace, exe: Path, cgroups: dict[str, Path], tmp: Path, mergeable: bool = False
    ) -> None:
        self.tr = tr
        self.mergeable = mergeable
        self.exe = exe
        self.cg = cgroups
        self.sock_path = str(tmp / "player.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.sock_path)
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(self.sock_path)
        self.lsock.listen(64)
        self.lsock.settimeout(120)
        self.players: dict[str, Player] = {}
        self.procs: list[subprocess.Popen] = []
        self.map_failures = 0

    def _accept(self) -> Player:
        conn, _ = self.lsock.accept()
        conn.settimeout(600)
        p = Player("?", conn)
        (n,) = struct.unpack("<I", p.recv(4))
        p.name = p.recv(n).decode()
        self.players[p.name] = p
        return p

    def _spawn(self, o: Owner) -> Player:
        self.procs.append(
            subprocess.Popen([str(self.exe), self.sock_path, o.name, str(self.cg[o.name])])
        )
        p = self._accept()
        if p.name != o.name:
            raise RuntimeError(f"expected player {o.name}, got {p.name}")
        return p

    def _fill(self, p: Player, o: Owner, vmas: list[Vma]) -> None:
        for v in vmas:
            if p.map(v) != 0:
                self.map_failures += 1
        for run in o.runs:
            p.write(run.vaddrs, run.data)
        p.sync()
        if self.mergeable:
            err = p.mergeable()
            if err:
                raise RuntimeError(f"{o.name}: madvise(MADV_MERGEABLE): {os.strerror(-err)}")

    def start(self, fork_style: bool) -> None:
        owners = list(self.tr.owners.values())
        tmpl = [o for o in owners if o.role == ROLE_TEMPLATE]
        rest = [o for o in owners if o.role != ROLE_TEMPLATE]
        if fork_style:
            if len(tmpl) != 1:
                raise RuntimeError("a fork-style trace needs exactly one template")
            t = tmpl[0]
            tp = self._spawn(t)
            self._fill(tp, t, t.vmas)
            for o in rest:
                tp.fork(o.name, self.cg[o.name])
                child = self._accept()
                self._fill(child, o, subtract(o.vmas, t.vmas))
        else:
            for o in tmpl + rest:
                self._fill(self._spawn(o), o, o.vmas)

    def stop(self) -> None:
        for p in self.players.values():
            p.quit()
        for pr in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                pr.wait(timeout=10)
            if pr.poll() is None:
                pr.kill()
                pr.wait()
        self.lsock.close()
        # forked children are not our children: they exit on 'Q' or EOF
        time.sleep(0.2)


# ------------------------------------------------------------------ cgroups
def make_cgroups(names: list[str]) -> dict[str, Path]:
    return cgroups.make_tree(CGROOT, names)


def remove_cgroups() -> None:
    cgroups.remove_tree(CGROOT)


# ------------------------------------------------------------------ one run
def ratio(out: int, held: int) -> float:
    """Bytes pushed out / bytes the system holds for them."""
    return out / held if held > 0 else float("inf")


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if len(a) else 0.0


def run_system(
    tr: Trace, sysname: str, exe: Path, tmp: Path, expect: dict[str, np.ndarray]
) -> dict[str, Any]:
    owners = list(tr.owners.values())
    fork_style = str(tr.meta.get("style", "")).endswith("fork") or any(
        o.info.get("exclusive") for o in owners
    )
    system = make_system(sysname)
    remove_cgroups()
    cgs = make_cgroups([o.name for o in owners])
    nbytes = (tr.nr_pages * PAGE_SIZE * 5 // 4 + (64 << 20)) // PAGE_SIZE * PAGE_SIZE
    res: dict[str, Any] = {"system": sysname, "trace": tr.meta.get("style"), "ok": False}
    pb = None
    try:
        system.train(owners)
        system.setup(nbytes)
        system.register(cgs, owners)
        t0 = time.perf_counter()
        pb = Playback(tr, exe, cgs, tmp, mergeable=system.mergeable)
        pb.start(fork_style)
        res["playback_s"] = time.perf_counter() - t0
        res["map_failures"] = pb.map_failures
        bad_before = 0
        for o in owners:
            got = pb.players[o.name].sums()
            bad_before += int((got != expect[o.name]).sum())
        res["bad_pages_before"] = bad_before
        sb = [o for o in owners if o.role != ROLE_TEMPLATE]
        tm = [o for o in owners if o.role == ROLE_TEMPLATE]
        anon = {o.name: cg_stat(cgs[o.name]).get("anon", 0) for o in owners}
        res["anon_bytes"] = anon
        res["trace_bytes"] = {o.name: o.nr_pages * PAGE_SIZE for o in owners}
        owned = sum(anon[o.name] for o in sb)
        res["owned_bytes"] = owned
        res["template_bytes"] = sum(anon[o.name] for o in tm)
        res["system_info"] = system.info
        if not system.swap:
            res.update(stored_bytes=owned, ratio=1.0, ok=bad_before == 0)
            return res
        system.before_reclaim(cgs, owners)
        res["anon_before_reclaim"] = {o.name: cg_stat(cgs[o.name]).get("anon", 0) for o in owners}
        s0 = system.stats()
        t_tm = sum(reclaim(cgs[o.name]) for o in tm)
        system.after_reclaim("template")
        s1 = system.stats()
        t_sb = 0.0
        for o in sb:
            t_sb += reclaim(cgs[o.name])
        system.after_reclaim("sandboxes")
        s2 = system.stats()
        left = {o.name: cg_stat(cgs[o.name]).get("anon", 0) for o in owners}
        swapped = {o.name: int(read(cgs[o.name] / "memory.swap.current")) for o in owners}
        res["anon_after_reclaim"] = left
        res["swap_current"] = swapped
        out_sb = sum(anon[o.name] - left[o.name] for o in sb)
        out_tm = sum(anon[o.name] - left[o.name] for o in tm)
        res["swapped_out_bytes"] = out_sb
        res["stats_before"] = s0
        res["stats_after_template"] = s1
        res["stats_after"] = s2
        fixed_sb, fixed_tm = system.fixed_bytes()
        res["fixed_bytes"] = {"sandboxes": fixed_sb, "template": fixed_tm}
        res["stored_bytes"] = s2.get("pool", 0) - s1.get("pool", 0) + fixed_sb
        res["template_stored_bytes"] = s1.get("pool", 0) - s0.get("pool", 0) + fixed_tm
        if "payload" in s2:
            res["payload_bytes"] = s2["payload"] - s1["payload"]
        res["ratio"] = out_sb / res["stored_bytes"] if res["stored_bytes"] > 0 else float("inf")
        res["template_ratio"] = (
            out_tm / res["template_stored_bytes"]
            if res["template_stored_bytes"] > 0
            else float("inf")
        )
        meta = system.meta(s0, s1, s2)
        if meta is not None:
            res["meta_bytes"], res["template_meta_bytes"] = meta
            res["net_ratio"] = ratio(out_sb, res["stored_bytes"] + meta[0])
            res["total_ratio"] = ratio(
                out_sb + out_tm, res["stored_bytes"] + res["template_stored_bytes"] + sum(meta)
            )
        res["swapout_mbps"] = out_sb / t_sb / 1e6 if t_sb else 0.0
        res["swapout_s"] = t_sb
        res["template_swapout_s"] = t_tm
        res["owners_azswap"] = system.owner_stats()
        # fault everything back, template first (fork children share its pages)
        lats = []
        t_in = 0
        bytes_in = 0
        bad = 0
        for o in tm + sb:
            total, lat, sums = pb.players[o.name].touch()
            bad += int((sums != expect[o.name]).sum())
            if o.role != ROLE_TEMPLATE:
                lats.append(lat)
                t_in += total
                bytes_in += len(lat) * PAGE_SIZE
        lat_all = np.concatenate(lats) if lats else np.zeros(0)
        res["bad_pages_after"] = bad
        res["swapin_mbps"] = bytes_in / (t_in / 1e9) / 1e6 if t_in else 0.0
        res["load_p50_us"] = pct(lat_all, 50) / 1e3
        res["load_p99_us"] = pct(lat_all, 99) / 1e3
        res["load_mean_us"] = float(lat_all.mean()) / 1e3 if len(lat_all) else 0.0
        res["load_hist_us"] = np.histogram(lat_all / 1e3, bins=np.logspace(0, 5, 41))[0].tolist()
        res["ok"] = bad == 0 and bad_before == 0
        return res
    finally:
        if pb is not None:
            pb.stop()
        try:
            system.teardown()
        except Exception as exc:  # keep going with the next system
            res["teardown_error"] = str(exc)
        remove_cgroups()


# ------------------------------------------------------------------ report
def table(results: list[dict[str, Any]], style: str) -> None:
    from rich.console import Console
    from rich.table import Table

    base = next((r for r in results if r["system"] == "zram-lz4" and r.get("ratio")), None)
    t = Table(title=f"{style}: sandbox pages pushed to swap with memory.reclaim (one guest)")
    for h in (
        "system",
        "owned MiB",
        "stored MiB",
        "meta MiB",
        "reduction",
        "net red.",
        "net vs zram-lz4",
        "tmpl stored MiB",
        "total red.",
        "out MB/s",
        "in MB/s",
        "p50 µs",
        "p99 µs",
        "p99 vs zram-lz4",
        "verified",
        "azswap kinds (sandboxes)",
    ):
        t.add_column(h, justify="left" if h in ("system", "azswap kinds (sandboxes)") else "right")
    for r in results:
        if "error" in r:
            what = "UNAVAILABLE" if r.get("unavailable") else "ERROR"
            t.add_row(r["system"], *([""] * 13), what, r["error"][:120])
            continue
        kinds = ""
        if r.get("owners_azswap"):
            agg: dict[str, int] = {}
            for o in r["owners_azswap"]:
                if not o.get("is_template"):
                    for k, v in o.get("kinds", {}).items():
                        agg[k] = agg.get(k, 0) + v
            kinds = " ".join(f"{k}={v}" for k, v in agg.items() if v)
        rel = rel99 = "-"
        if base and r.get("net_ratio") and base.get("net_ratio"):
            rel = f"{r['net_ratio'] / base['net_ratio']:.2f}x"
        if base and r.get("ratio") and r["system"] != "none" and base.get("load_p99_us"):
            rel99 = f"{r.get('load_p99_us', 0) / base['load_p99_us']:.2f}x"
        t.add_row(
            r["system"],
            f"{r['owned_bytes'] / 2**20:.1f}",
            f"{r['stored_bytes'] / 2**20:.1f}",
            f"{r['meta_bytes'] / 2**20:.2f}" if "meta_bytes" in r else "-",
            f"{r['ratio']:.2f}",
            f"{r['net_ratio']:.2f}" if "net_ratio" in r else "-",
            rel,
            f"{r.get('template_stored_bytes', 0) / 2**20:.1f}",
            f"{r['total_ratio']:.2f}" if "total_ratio" in r else "-",
            f"{r.get('swapout_mbps', 0):.1f}",
            f"{r.get('swapin_mbps', 0):.1f}",
            f"{r.get('load_p50_us', 0):.1f}",
            f"{r.get('load_p99_us', 0):.1f}",
            rel99,
            "yes"
            if r.get("ok")
            else f"NO ({r.get('bad_pages_before', '?')}/{r.get('bad_pages_after', '?')} bad)",
            kinds,
        )
    Console(width=220).print(t)
    parity(results, style)


def parity(results: list[dict[str, Any]], style: str) -> None:
    """azswap as a plain device against zram with the same codec (the device's parity target)."""
    from rich.console import Console
    from rich.table import Table

    by = {r["system"]: r for r in results if "error" not in r and r.get("ratio")}
    rows = [
        (a, by[f"azdev-{a}"], by[f"zram-{a}"])
        for a in ("lz4", "zstd")
        if f"azdev-{a}" in by and f"zram-{a}" in by
    ]
    if not rows:
        return
    t = Table(title=f"{style}: azswap device (nothing registered) / zram, same codec, same guest")
    for h in (
        "codec",
        "reduction azdev",
        "reduction zram",
        "ratio",
        "swap-out",
        "swap-in",
        "p99 load",
    ):
        t.add_column(h, justify="right")
    for algo, az, zr in rows:

        def rel(k: str, a: dict[str, Any] = az, z: dict[str, Any] = zr) -> str:
            return f"{a[k] / z[k]:.2f}x" if z.get(k) else "-"

        t.add_row(
            algo,
            f"{az['ratio']:.3f}",
            f"{zr['ratio']:.3f}",
            rel("ratio"),
            rel("swapout_mbps"),
            rel("swapin_mbps"),
            rel("load_p99_us"),
        )
    Console(width=160).print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.swapbench",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--trace", action="append", default=[], help="trace files to play")
    ap.add_argument("--record", default="", help="record these styles here first (comma list)")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--size", default="default")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--systems", default=None,
                    help="comma list (default: " + ",".join(DEFAULT_SYSTEMS) + ")")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("swapbench: needs root (run it through vm-tests/run)", file=sys.stderr)
        return 1
    out_dir = Path(os.environ.get("AZSWAP_OUT", TOP / "vm-tests" / "out"))
    requested = a.systems is not None
    systems = [s for s in (a.systems or ",".join(DEFAULT_SYSTEMS)).split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            print(f"swapbench: unknown system {s!r} (known: {', '.join(SYSTEMS)})", file=sys.stderr)
            return 2
    apply_product_vm_settings()  # page-cluster and swappiness as the product's service sets
    sh("swapoff", "-a", check=False)
    tmp = Path(tempfile.mkdtemp(prefix="swapbench-"))
    exe = build_player(tmp)
    traces = list(a.trace)
    if a.record:
        from bench.record import run_and_record

        (out_dir / "traces").mkdir(parents=True, exist_ok=True)
        for style in a.record.split(","):
            path = str(out_dir / "traces" / f"{style}.aztrace")
            run_and_record(style, a.n, a.size, a.seed, path, cgroup_root=CG / "azrecord", log=log)
            traces.append(path)
    if any(s.startswith("az") for s in systems) and not (TOP / "kmod" / "azswap.ko").exists():
        print("swapbench: kmod/azswap.ko not built (make kmod)", file=sys.stderr)
        return 1
    report: dict[str, Any] = {
        "kernel": os.uname().release,
        "time": time.time(),
        "cpus": os.cpu_count(),
        "runs": [],
    }
    with contextlib.suppress(OSError):
        report["mem_total_kb"] = int(Path("/proc/meminfo").read_text().split()[1])
    jpath = Path(a.json) if a.json else out_dir / "swapbench.json"
    for path in traces:
        tr = read_trace(path)
        style = tr.meta.get("style", Path(path).stem)
        log(f"{path}: {style}, {len(tr.owners)} owners, {tr.nr_pages * PAGE_SIZE / 2**20:.1f} MiB")
        expect = {o.name: checksums(o.data()) for o in tr.owners.values()}
        results: list[dict[str, Any]] = []
        report["runs"].append({"trace": path, "style": style, "meta": tr.meta, "results": results})
        for s in systems:
            log(f"{style}: {s}")
            t0 = time.monotonic()
            try:
                r = run_system(tr, s, exe, tmp, expect)
            except FeatureMissing as exc:
                # the kernel lacks it: a row that says why; it fails the run only if asked for
                r = {"system": s, "error": str(exc), "unavailable": True, "requested": requested}
                log(f"{style}: {s} unavailable on {os.uname().release}: {exc}")
            except Exception as exc:
                r = {"system": s, "error": f"{type(exc).__name__}: {exc}"}
                log(f"{style}: {s} failed: {r['error']}")
            r["wall_s"] = time.monotonic() - t0
            results.append(r)
            jpath.write_text(json.dumps(report, indent=1, default=float))  # partial results survive
            if "error" not in r:
                log(
                    f"{style}: {s}: owned {r['owned_bytes'] / 2**20:.1f} MiB stored "
                    f"{r['stored_bytes'] / 2**20:.1f} MiB ratio {r['ratio']:.2f} "
                    f"ok={r['ok']} ({r['wall_s']:.0f}s)"
                )
        table(results, style)
        del tr
    jpath.write_text(json.dumps(report, indent=1, default=float))
    log(f"wrote {jpath}")
    shutil.rmtree(tmp, ignore_errors=True)
    bad = [r for run in report["runs"] for r in run["results"] if not acceptable(r)]
    return 1 if bad else 0


def acceptable(r: dict[str, Any]) -> bool:
    """A result that does not fail the run: every page verified, or a default baseline the
    kernel does not have (reported as unavailable)."""
    return bool(r.get("ok")) or bool(r.get("unavailable") and not r.get("requested"))


if __name__ == "__main__":
    sys.exit(main())
