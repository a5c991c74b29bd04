"""Every system under test as the only swap device, and its stats by name.

    none                   no swap
    zram-ALGO              /dev/zram0 with ALGO (lz4, zstd)
    zram-ALGO-dict         zram with ALGO and a dictionary trained on the template's pages,
                           given through `algorithm_params` (6.12+): train() before setup()
    zram-ALGO-recomp-ALGO2 zram with ALGO, ALGO2 as its recompression algorithm
                           (`recomp_algorithm`, CONFIG_ZRAM_MULTI_COMP): after each reclaim
                           every slot is marked idle and recompressed (`recompress type=idle`)
    zswap-ALGO             zswap (zsmalloc, ALGO) in front of a brd ramdisk swap device (set
                           through `zpool` where the kernel has it; 7.3 has no zpool layer)
    zswap-ALGO-shrink      the same with zswap's shrinker on (`shrinker_enabled`, 6.8+)
    ksm-zram-ALGO          KSM over the sandboxes' processes (they madvise(MADV_MERGEABLE) their
                           mappings; ksmd runs until nothing more merges), then zram-ALGO
    azswap-ALGO            /dev/azswap0, owners registered over netlink by the benchmark;
                           "-noshuf": policy shuffle=0; "lz4/zstd:6": template bases in the
                           codec after the slash, then the sandboxes' codec (after_template());
                           "-packed": the device packed (sysfs `pack`, as `azctl daemon
                           --pack-every` does) once the sandboxes are swapped out; "-cached":
                           the module loaded with swap_cache=1 (a page read back keeps its
                           stored copy while it stays clean)
    azdev-ALGO             /dev/azswap0 with nothing registered: same-filled + per-page lz4/zstd
                           only (the zram-parity setup)

Every system runs under the vm sysctls the product's swap service sets while its device is up
(page-cluster, swappiness as packaging/azswap-swap-setup and packaging/default/azswap ship them):
swap_device() sets them for its block, apply_product_vm_settings() for a whole throwaway guest.

No fallback: a system that does not come up raises :class:`SwapDevError` with the reason
(:class:`FeatureMissing` when the running kernel lacks what it needs), and setup checks that the
device it asked for is the one swapping.  Stats are parsed by column name: azswap's from
controlplane.sysfs.STAT_FILES, zram's from its documented mm_stat columns.

Memory a system holds apart from its pool is counted too (fixed_bytes()): a zram dictionary is
the template's cost (it is made from the template's pages), KSM's rmap items the cost of the
processes they describe and its stable nodes the sandboxes'.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from bench.kit import module
from bench.kit.shell import logger, read, sh, write
from controlplane.abi import Codec
from controlplane.sysfs import STAT_FILES, parse_columns
from controlplane.trace import PAGE_SIZE, ROLE_TEMPLATE, Owner
from controlplane.trace.accounting import meta_split

# Documentation/admin-guide/blockdev/zram.rst, mm_stat (6.1)
ZRAM_MM_STAT = (
    "orig_data_size",
    "compr_data_size",
    "mem_used_total",
    "mem_limit",
    "mem_used_max",
    "same_pages",
    "pages_compacted",
    "huge_pages",
    "huge_pages_since",
)
GROUP = 1


log = logger("swapdev")


class SwapDevError(RuntimeError):
    """The system asked for did not come up as the swap device."""


class FeatureMissing(SwapDevError):
    """The running kernel lacks what the system needs (the message says what and why)."""


def kernel_config(option: str, release: str | None = None,
                  places: Sequence[str] = ("/boot/config-{}", "/lib/modules/{}/config")) -> str:
    """How the running kernel (or ``release``) was built with CONFIG_``option``: "y", "m",
    "not set", or "unknown" when no config file is found."""
    rel = release or os.uname().release
    for fmt in places:
        try:
            text = Path(fmt.format(rel)).read_text()
        except OSError:
            continue
        m = re.search(rf"^CONFIG_{option}=(\S+)$", text, re.M)
        return m.group(1) if m else "not set"
    return "unknown"


class System:
    """No swap at all (the "none" row).

    The benchmark drives every system through the same steps:
    train(owners) -> setup(nbytes) -> register() -> [playback; processes madvise their mappings
    MADV_MERGEABLE when ``mergeable``] -> before_reclaim() -> reclaim template ->
    after_reclaim("template") -> reclaim sandboxes -> after_reclaim("sandboxes") -> teardown().
    ``info`` collects what a system did on the way (dictionary size, KSM counters, ...);
    fixed_bytes() is memory it holds outside the pool the stats count."""

    name = "none"
    swap = False
    device = ""
    mergeable = False

    def __init__(self) -> None:
        self.info: dict[str, Any] = {}

    def train(self, owners: list[Owner]) -> None: ...

    def setup(self, nbytes: int) -> None: ...

    def before_reclaim(self, cgroups: dict[str, Path], owners: list[Owner]) -> None: ...

    def after_reclaim(self, phase: str) -> None: ...

    def fixed_bytes(self) -> tuple[int, int]:
        """(sandboxes' part, template's part) of the memory the system holds beside its pool."""
        return 0, 0

    def meta(
        self, s0: dict[str, int], s1: dict[str, int], s2: dict[str, int]
    ) -> tuple[int, int] | None:
        """(sandboxes', template's) per-page metadata: what the system spends outside its pool
        on the pages stored between ``s0`` (before the template's), ``s1`` (after it) and
        ``s2`` (after the sandboxes'), stats() snapshots; None when the kernel does not say."""
        return None

    def teardown(self) -> None: ...

    def register(self, cgroups: dict[str, Path], owners: list[Owner]) -> None: ...

    def stats(self) -> dict[str, int]:
        return {}

    def owner_stats(self) -> list[dict[str, Any]]:
        return []

    def used_bytes(self, stats: dict[str, int] | None = None) -> int:
        """Memory the device itself holds for the stored pages (allocator pool + metadata), from
        ``stats`` (a stats() snapshot) or read now."""
        s = self.stats() if stats is None else stats
        return s.get("pool", 0) + s.get("meta", 0)

    def _swapon(self) -> None:
        r = sh("swapon", "-p", "100", self.device, check=False)
        if r.returncode or self.device not in module.swaps():
            raise SwapDevError(f"{self.name}: swapon {self.device} failed: {r.stderr.strip()}")


class Zram(System):
    def __init__(self, algo: str) -> None:
        super().__init__()
        self.name = f"zram-{algo}"
        self.algo = algo
        self.swap = True
        self.device = "/dev/zram0"
        self.sys = Path("/sys/block/zram0")
        self.entry_bytes = 0.0

    def setup(self, nbytes: int) -> None:
        if not self.sys.exists():
            sh("modprobe", "zram", "num_devices=1")
        write(self.sys / "reset", "1")
        try:
            write(self.sys / "comp_algorithm", self.algo)
        except OSError as e:
            raise FeatureMissing(f"{self.name}: zram has no {self.algo}: {e}") from None
        self._before_disksize()
        try:
            write(self.sys / "disksize", str(nbytes))
        except OSError as e:
            raise SwapDevError(f"{self.name}: disksize {nbytes}: {e}") from None
        self.entry_bytes = zram_table_entry(nbytes)
        self.info["table_entry_bytes"] = self.entry_bytes
        if not self.entry_bytes:
            self.info["meta_unknown"] = "zram's table not found in /proc/vmallocinfo"
        sh("mkswap", self.device)
        self._swapon()

    def meta(
        self, s0: dict[str, int], s1: dict[str, int], s2: dict[str, int]
    ) -> tuple[int, int] | None:
        """zram's table entries of the slots in use (its table covers every slot of disksize;
        the unused entries are left out, as for azswap)."""
        if not self.entry_bytes:
            return None
        e = self.entry_bytes
        return round(e * (s2["pages"] - s1["pages"])), round(e * (s1["pages"] - s0["pages"]))

    def _before_disksize(self) -> None:
        """Attributes that must be set before the device is initialised (disksize)."""

    def teardown(self) -> None:
        sh("swapoff", self.device, check=False)
        write(self.sys / "reset", "1")

    def stats(self) -> dict[str, int]:
        m = parse_columns(ZRAM_MM_STAT, read(self.sys / "mm_stat"))
        return {
            "orig": m["orig_data_size"],
            "pages": m["orig_data_size"] // PAGE_SIZE,
            "payload": m["compr_data_size"],
            "pool": m["mem_used_total"],
            "same_pages": m["same_pages"],
            "huge_pages": m.get("huge_pages", 0),
        }


class Zswap(System):
    P = Path("/sys/module/zswap/parameters")
    D = Path("/sys/kernel/debug/zswap")
    shrinker = False

    def __init__(self, algo: str) -> None:
        super().__init__()
        self.name = f"zswap-{algo}"
        self.algo = algo
        self.swap = True
        self.device = "/dev/ram0"

    def setup(self, nbytes: int) -> None:
        if not self.D.exists():
            sh("mount", "-t", "debugfs", "none", "/sys/kernel/debug", check=False)
        sh("modprobe", "zsmalloc")
        sh("modprobe", self.algo, check=False)  # built in on some kernels
        if not Path(self.device).exists():
            sh("modprobe", "brd", "rd_nr=1", f"rd_size={nbytes // 1024}")
        sh("mkswap", self.device)
        self._swapon()
        # 7.3 has no zpool layer (no zpool.h, no CONFIG_ZPOOL): zswap stores in zsmalloc directly
        if (self.P / "zpool").exists():
            write(self.P / "zpool", "zsmalloc")
        self.info["zpool"] = read(self.P / "zpool") if (self.P / "zpool").exists() else "zsmalloc"
        try:
            write(self.P / "compressor", self.algo)
        except OSError as e:
            raise SwapDevError(f"{self.name}: zswap has no {self.algo}: {e}") from None
        write(self.P / "max_pool_percent", "60")
        self._shrinker(self.shrinker)
        write(self.P / "enabled", "Y")
        if read(self.P / "compressor") != self.algo or read(self.P / "enabled") != "Y":
            raise SwapDevError(f"{self.name}: zswap did not take {self.algo}")

    def meta(
        self, s0: dict[str, int], s1: dict[str, int], s2: dict[str, int]
    ) -> tuple[int, int] | None:
        """One `struct zswap_entry` (its slab object) per page in zswap; its tree's nodes are
        not counted (a lower bound). Read once pages were stored: from 6.12 zswap creates the
        cache when it is first enabled."""
        e = self.info.get("entry_bytes") or slab_size("zswap_entry")
        self.info["entry_bytes"] = e
        if not e:
            self.info["meta_unknown"] = "no /sys/kernel/slab/zswap_entry"
            return None
        return e * (s2["pages"] - s1["pages"]), e * (s1["pages"] - s0["pages"])

    def _shrinker(self, on: bool) -> None:
        """zswap's shrinker (6.8+) as asked: on for "-shrink", explicitly off otherwise."""
        p = self.P / "shrinker_enabled"
        if not p.exists():
            if on:
                raise FeatureMissing(
                    f"{self.name}: kernel {os.uname().release} has no {p} (zswap's shrinker "
                    "is 6.8+)")
            return
        write(p, "Y" if on else "N")
        if read(p) != ("Y" if on else "N"):
            raise SwapDevError(f"{self.name}: {p} did not take {'Y' if on else 'N'}")
        self.info["shrinker_enabled"] = read(p)

    def teardown(self) -> None:
        write(self.P / "enabled", "N")
        if self.shrinker:
            with contextlib.suppress(OSError):
                write(self.P / "shrinker_enabled", "N")
        sh("swapoff", self.device, check=False)
        sh("rmmod", "brd", check=False)

    def stats(self) -> dict[str, int]:
        d = {p.name: int(read(p)) for p in self.D.iterdir() if p.is_file()}
        used = 0
        for line in Path("/proc/swaps").read_text().splitlines()[1:]:
            if line.startswith(self.device):
                used = int(line.split()[3]) * 1024
        on_disk = max(0, used - d.get("stored_pages", 0) * PAGE_SIZE)
        return {
            "orig": d.get("stored_pages", 0) * PAGE_SIZE,
            "pages": d.get("stored_pages", 0),
            "pool": d.get("pool_total_size", 0) + on_disk,
            "zswap_pool": d.get("pool_total_size", 0),
            "backing_bytes": on_disk,
            "same_pages": d.get("same_filled_pages", 0),
            "rejects": sum(v for k, v in d.items() if k.startswith("reject_")),
            "written_back": d.get("written_back_pages", 0),
            "pool_limit_hit": d.get("pool_limit_hit", 0),
            **{f"debugfs_{k}": v for k, v in d.items()},
        }


# io_stat counters Azswap.stats() reports (as io_NAME)
IO_COUNTERS = ("stores", "loads", "notify_free")


class Azswap(System):
    B = Path("/sys/block/azswap0")

    def __init__(self, algo: str) -> None:
        super().__init__()
        self.name = f"azswap-{algo}"
        codec, *suffixes = algo.split("-")
        if len(set(suffixes)) != len(suffixes) or not set(suffixes) <= {
            "noshuf", "packed", "cached"
        }:
            raise ValueError(
                f"unknown system {self.name!r}: suffixes are -noshuf, -packed and -cached"
            )
        # "-cached": the module loaded with swap_cache=1 (swap-ins through the swap cache: a
        # page read back that stays clean keeps its stored copy, docs/sysfs-abi.md).
        self.cached = "cached" in suffixes
        # "-packed": multi-page objects made after the sandboxes' reclaim (after_reclaim()).
        self.packed = "packed" in suffixes
        # "-noshuf": policy shuffle=0 (float pages raw, as zram; faster loads).
        self.shuffle = 0 if "noshuf" in suffixes else 1
        # "lz4/zstd:6": template bases in the codec after the slash (the device starts with it),
        # sandboxes in the first one (after_template() switches the policy, live).
        self.algo, _, base = codec.partition("/")
        self.base_algo = base or self.algo
        # Swap slots per similarity index entry (sysfs sim_slots, docs/store.md).
        self.sim_slots = 1
        self.swap = True
        self.device = "/dev/azswap0"
        self.ids: dict[str, int] = {}

    def setup(self, nbytes: int) -> None:
        if module.loaded() and module.swap_cache() != self.cached:
            module.cleanup_module()  # loaded by another system, in the other swap-in mode
        if not module.loaded():
            try:
                module.insmod(**({"swap_cache": 1} if self.cached else {}))
            except OSError as e:
                raise SwapDevError(f"{self.name}: {e}") from None
        with contextlib.suppress(OSError):
            write(self.B / "reset", "1")
        try:
            write(self.B / "comp_algorithm", self.base_algo)
            write(self.B / "shuffle", str(self.shuffle))
            write(self.B / "sim_slots", str(self.sim_slots))
            write(self.B / "disksize", str(nbytes))
        except OSError as e:
            raise SwapDevError(f"{self.name}: setting up {self.B}: {e}") from None
        sh("mkswap", self.device)
        self._swapon()

    def after_template(self) -> None:
        """Once the template's bases are stored: the sandboxes' codec, when it differs."""
        if self.base_algo == self.algo:
            return
        from controlplane.netlink import AzswapNetlink

        codec, _, level = self.algo.partition(":")
        fields = {"codec": int(Codec[codec.upper()])}
        if codec == "zstd":
            fields["level"] = int(level or 3)
        with AzswapNetlink() as nl:
            nl.policy_set(**fields)

    def after_reclaim(self, phase: str) -> None:
        """With "-packed", once the sandboxes are out: the pass the daemon's pack step makes; its
        time and the pages it packed go to ``info`` (not into the swap-out time)."""
        if not self.packed or phase != "sandboxes":
            return
        t0 = time.perf_counter()
        try:
            write(self.B / "pack", "1")  # returns with the replaced objects freed, compacted
        except OSError as e:
            raise SwapDevError(f"{self.name}: writing {self.B / 'pack'}: {e}") from None
        self.info["pack_s"] = time.perf_counter() - t0
        o = parse_columns(STAT_FILES["obj_stat"], read(self.B / "obj_stat"))
        self.info["packs"] = o["packs"]
        self.info["packed_pages"] = o["packed_pages"]
        if not o["packed_pages"]:
            log(f"{self.name}: the pack pass packed nothing (no private PLAIN runs)")

    def register(self, cgroups: dict[str, Path], owners: list[Owner]) -> None:
        from controlplane.netlink import AzswapNetlink

        with AzswapNetlink() as nl:
            for o in owners:
                rel = "/" + str(cgroups[o.name].relative_to("/sys/fs/cgroup"))
                if o.role == ROLE_TEMPLATE:
                    self.ids[o.name] = nl.template_add(GROUP, cgroup_path=rel)
                else:
                    self.ids[o.name] = nl.sandbox_add(GROUP, cgroup_path=rel)

    def unregister(self) -> None:
        from controlplane.netlink import AzswapNetlink

        with AzswapNetlink() as nl:
            for name, cid in self.ids.items():
                with contextlib.suppress(Exception):
                    if name == "template":
                        nl.template_del(cid)
                    else:
                        nl.sandbox_del(cid)
        self.ids = {}

    def teardown(self) -> None:
        sh("swapoff", self.device, check=False)
        self.unregister()
        with contextlib.suppress(OSError):
            write(self.B / "reset", "1")

    def stats(self) -> dict[str, int]:
        m = parse_columns(STAT_FILES["mm_stat"], read(self.B / "mm_stat"))
        k = parse_columns(STAT_FILES["kind_stat"], read(self.B / "kind_stat"))
        o = parse_columns(STAT_FILES["obj_stat"], read(self.B / "obj_stat"))
        # read apart from mm_stat: on a busy device the two differ by what changed between
        # the reads (the guest test compares them on an idle one)
        meta = parse_columns(STAT_FILES["meta_stat"], read(self.B / "meta_stat"))
        io = parse_columns(STAT_FILES["io_stat"], read(self.B / "io_stat"))
        out = {
            **meta,
            # monotonic while the module is loaded: pages stored, loaded, slots swap freed
            **{f"io_{k}": io[k] for k in IO_COUNTERS},
            "orig": m["orig_data_size"],
            "payload": m["compr_data_size"],
            "pool": m["mem_used_total"],
            "meta": m["meta_bytes"],
            "index": m["index_bytes"],
            "template_bytes": m["template_bytes"],
            "compacted": m.get("compacted_bytes", 0),
            "base_cache_pages": o["base_cache_pages"],
            # base reads the decoded-base cache served / that decoded the base (monotonic)
            "base_cache_hits": o["base_cache_hits"],
            "base_cache_misses": o["base_cache_misses"],
            # pages stored without an object (direct groups, unregistered cgroups)
            "direct_pages": o.get("direct_pages", 0),
        }
        for name in STAT_FILES["kind_stat"]:
            out[f"kind_{name}"] = k[name]
        return out

    def meta(
        self, s0: dict[str, int], s1: dict[str, int], s2: dict[str, int]
    ) -> tuple[int, int] | None:
        """Used slot entries and object headers by who stored them; indexes, owner table and
        base cache to the sandboxes (controlplane.trace.accounting, as the replay does)."""
        sb, tm = meta_split(s2, s1, s0)
        return sum(sb.values()), sum(tm.values())

    def owner_stats(self) -> list[dict[str, Any]]:
        from controlplane.netlink import AzswapNetlink

        names = {v: k for k, v in self.ids.items()}
        with AzswapNetlink() as nl:
            return [
                dict(o.to_dict(), name=names.get(o.cgroup_id, str(o.cgroup_id))) for o in nl.stats()
            ]


class AzswapDevice(Azswap):
    """azswap as a plain compressed swap device: nothing registered, so no page is shared.

    Same-filled pages and per-page lz4/zstd only: the zram-parity configuration."""

    def __init__(self, algo: str) -> None:
        super().__init__(algo)
        self.name = f"azdev-{algo}"

    def register(self, cgroups: dict[str, Path], owners: list[Owner]) -> None:
        pass

    def owner_stats(self) -> list[dict[str, Any]]:
        return []


# ------------------------------------------------------------------ the 6.12+ baselines
# zstd's own default dictionary size (zstd --train, ZDICT), and at most this many template pages
# as training samples (evenly spread over them: training time grows with the samples).
DICT_BYTES = 112640
DICT_MAX_SAMPLES = 4096


def training_pages(data: bytes | memoryview, max_pages: int = DICT_MAX_SAMPLES) -> list[bytes]:
    """Up to ``max_pages`` pages of ``data`` to train a dictionary on, evenly spread, without
    the same-filled ones (zram stores those as a fill value and the 6.12 swap core keeps zero
    pages out of every device: a dictionary never sees them)."""
    n = len(data) // PAGE_SIZE
    keep = []
    for k in range(n):
        pg = bytes(data[k * PAGE_SIZE : (k + 1) * PAGE_SIZE])
        if pg != pg[:8] * (PAGE_SIZE // 8):
            keep.append(pg)
    if len(keep) <= max_pages:
        return keep
    step = len(keep) / max_pages
    return [keep[int(i * step)] for i in range(max_pages)]


def train_dictionary(pages: list[bytes], size: int = DICT_BYTES) -> bytes:
    """A zstd dictionary (zstd's trainer, through python-zstandard) from ``pages``."""
    import zstandard

    if len(pages) < 8:
        raise SwapDevError(f"{len(pages)} non-same-filled template pages: too few to train on")
    try:
        return zstandard.train_dictionary(size, pages).as_bytes()
    except zstandard.ZstdError as e:
        raise SwapDevError(f"zstd dictionary training on {len(pages)} pages failed: {e}") from None


class ZramDict(Zram):
    """zram with a dictionary trained on the template's pages (`algorithm_params`, 6.12+)."""

    def __init__(self, algo: str) -> None:
        super().__init__(algo)
        self.name = f"zram-{algo}-dict"
        self.dict_path: Path | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def train(self, owners: list[Owner]) -> None:
        # a kernel without dictionaries says so before minutes of training
        if not self.sys.exists():
            sh("modprobe", "zram", "num_devices=1", check=False)
        self._params_attr()
        tmpl = [o for o in owners if o.role == ROLE_TEMPLATE]
        if not tmpl:
            raise SwapDevError(f"{self.name}: the trace has no template to train a dictionary on")
        t0 = time.perf_counter()
        pages: list[bytes] = []
        for o in tmpl:
            pages += training_pages(o.data(), DICT_MAX_SAMPLES)
        if len(pages) > DICT_MAX_SAMPLES:
            step = len(pages) / DICT_MAX_SAMPLES
            pages = [pages[int(i * step)] for i in range(DICT_MAX_SAMPLES)]
        d = train_dictionary(pages)
        # zram reads the dictionary from a file (kernel_read_file_from_path)
        self._tmp = tempfile.TemporaryDirectory(prefix="zram-dict-")
        self.dict_path = Path(self._tmp.name) / "template.dict"
        self.dict_path.write_bytes(d)
        self.info.update(dict_bytes=len(d), dict_samples=len(pages),
                         dict_train_s=time.perf_counter() - t0)

    def _params_attr(self) -> Path:
        p = self.sys / "algorithm_params"
        if not p.exists():
            raise FeatureMissing(
                f"{self.name}: kernel {os.uname().release} has no {p} (zram's algorithm "
                "parameters and dictionaries are 6.12+)")
        return p

    def _before_disksize(self) -> None:
        p = self._params_attr()
        if self.dict_path is None:
            raise SwapDevError(f"{self.name}: no dictionary: train() on the template's pages "
                               "before setup()")
        try:
            write(p, f"algo={self.algo} dict={self.dict_path}")
        except OSError as e:
            raise SwapDevError(f"{self.name}: algorithm_params algo={self.algo} "
                               f"dict={self.dict_path}: {e}") from None

    def fixed_bytes(self) -> tuple[int, int]:
        # zram keeps the dictionary it read in kernel memory for the device's life: the
        # template's cost.  (zstd's digested CDict/DDict tables, like every system's per-CPU
        # compression workspaces, are not counted.)
        return 0, int(self.info.get("dict_bytes", 0))

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None


class ZramRecomp(Zram):
    """zram with a second algorithm: after each reclaim every stored slot is marked idle and
    recompressed with it (`recomp_algorithm` / `recompress type=idle`, CONFIG_ZRAM_MULTI_COMP);
    zram keeps the smaller of the two."""

    def __init__(self, algo: str, recomp: str) -> None:
        super().__init__(algo)
        self.recomp = recomp
        self.name = f"zram-{algo}-recomp-{recomp}"

    def _before_disksize(self) -> None:
        p = self.sys / "recomp_algorithm"
        if not p.exists():
            rel = os.uname().release
            raise FeatureMissing(
                f"{self.name}: kernel {rel} has no {p}: it is built without "
                f"CONFIG_ZRAM_MULTI_COMP (its config: {kernel_config('ZRAM_MULTI_COMP', rel)})")
        try:
            write(p, f"algo={self.recomp} priority=1")
        except OSError as e:
            raise FeatureMissing(f"{self.name}: zram cannot recompress with {self.recomp}: "
                                 f"{e}") from None

    def after_reclaim(self, phase: str) -> None:
        t0 = time.perf_counter()
        try:
            write(self.sys / "idle", "all")
            write(self.sys / "recompress", "type=idle")
        except OSError as e:
            raise SwapDevError(f"{self.name}: recompress after the {phase}: {e}") from None
        self.info.setdefault("recompress_s", {})[phase] = time.perf_counter() - t0


class ZswapShrink(Zswap):
    """zswap with its shrinker: cold compressed pages written back to the backing device."""

    shrinker = True

    def __init__(self, algo: str) -> None:
        super().__init__(algo)
        self.name = f"zswap-{algo}-shrink"


# sizeof(struct ksm_rmap_item) and of struct ksm_stable_node on x86_64 (6.1-6.12), used only
# when the kernel shows neither its slab caches nor general_profit.
KSM_RMAP_ITEM = 64
KSM_STABLE_NODE = 64


def ksm_settled(scans: list[tuple[int, int]], start_scans: int, min_scans: int = 4) -> bool:
    """ksmd has merged what it will: ``scans`` holds (full_scans, pages_sharing) samples; true
    once ``min_scans`` full scans ran since ``start_scans`` and pages_sharing stood still over
    the last one (a page merges only in the scan after the one that saw it unchanged)."""
    if not scans or scans[-1][0] < start_scans + min_scans:
        return False
    last = scans[-1]
    prev = [s for s in scans if s[0] == last[0] - 1]
    return bool(prev) and prev[-1][1] == last[1]


def ksm_rmap_item_bytes(ksm: dict[str, int], rmap_items: int) -> int:
    """Bytes one rmap item costs: from general_profit (6.4+), which is
    (pages_sharing + ksm_zero_pages) * PAGE_SIZE - rmap_items * sizeof(rmap_item)."""
    if "general_profit" not in ksm or rmap_items <= 0:
        return KSM_RMAP_ITEM
    saved = (ksm.get("pages_sharing", 0) + ksm.get("ksm_zero_pages", 0)) * PAGE_SIZE
    size = (saved - ksm["general_profit"]) / rmap_items
    return round(size) if size > 0 else KSM_RMAP_ITEM


def ksm_cost(
    per_owner_rmap: dict[str, int], templates: set[str], rmap_bytes: int, pages_shared: int,
    stable_bytes: int,
) -> tuple[int, int]:
    """(sandboxes', template's) KSM metadata bytes: each process's rmap items are its owner's
    cost; the stable nodes (one per KSM page) are the sandboxes'."""
    tm = sum(n for o, n in per_owner_rmap.items() if o in templates) * rmap_bytes
    sb = sum(n for o, n in per_owner_rmap.items() if o not in templates) * rmap_bytes
    return sb + pages_shared * stable_bytes, tm


def read_kv(text: str) -> dict[str, int]:
    """"name value" lines (/proc/PID/ksm_stat) as a dict of ints; other lines are skipped."""
    out = {}
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


class KsmZram(Zram):
    """KSM over the sandboxes' processes, then zram: the processes mark their mappings
    MADV_MERGEABLE, ksmd runs (fast) until nothing more merges, then keeps running at its
    default pace while the cgroups are reclaimed into zram.

    Accounting: owned bytes are read before merging, as for every system, so a merged page
    leaves its sandbox's memory and counts as pushed out; the KSM page that holds it is
    charged to one cgroup and reclaimed with it into zram (counted once in the pool).  KSM's
    own metadata is counted: rmap items (one per scanned page) as their process's owner's
    cost, stable nodes (one per KSM page) as the sandboxes'."""

    K = Path("/sys/kernel/mm/ksm")
    mergeable = True
    # While merging: fast scanning; then the defaults back.
    MERGE_PARAMS: ClassVar[dict[str, str]] = {"pages_to_scan": "4000", "sleep_millisecs": "5"}
    MERGE_TIMEOUT_S = 900.0

    def __init__(self, algo: str) -> None:
        super().__init__(algo)
        self.name = f"ksm-zram-{algo}"
        self.saved: dict[str, str] = {}
        self.cost = (0, 0)

    def setup(self, nbytes: int) -> None:
        if not (self.K / "run").exists():
            raise FeatureMissing(f"{self.name}: kernel {os.uname().release} has no {self.K} "
                                 f"(CONFIG_KSM: {kernel_config('KSM')})")
        write(self.K / "run", "2")  # nothing merged from before
        self.saved = {k: read(self.K / k) for k in ("pages_to_scan", "sleep_millisecs")}
        super().setup(nbytes)

    def ksm_stats(self) -> dict[str, int]:
        out = {}
        for p in self.K.iterdir():
            with contextlib.suppress(OSError, ValueError):
                out[p.name] = int(read(p))
        return out

    def before_reclaim(self, cgroups: dict[str, Path], owners: list[Owner],
                       clock: Callable[[], float] = time.monotonic) -> None:
        for k, v in self.MERGE_PARAMS.items():
            write(self.K / k, v)
        start = self.ksm_stats()
        write(self.K / "run", "1")
        t0 = clock()
        scans: list[tuple[int, int]] = []
        settled = False
        while clock() - t0 < self.MERGE_TIMEOUT_S:
            time.sleep(0.5)
            st = self.ksm_stats()
            scans.append((st["full_scans"], st["pages_sharing"]))
            if ksm_settled(scans, start["full_scans"]):
                settled = True
                break
        merged = self.ksm_stats()
        for k, v in self.saved.items():
            write(self.K / k, v)
        rmap: dict[str, int] = {}
        merging: dict[str, int] = {}
        for o in owners:
            for pid in read(cgroups[o.name] / "cgroup.procs").split():
                with contextlib.suppress(OSError):
                    kv = read_kv(read(f"/proc/{pid}/ksm_stat"))
                    rmap[o.name] = rmap.get(o.name, 0) + kv.get("ksm_rmap_items", 0)
                    merging[o.name] = merging.get(o.name, 0) + kv.get("ksm_merging_pages", 0)
        rmap_bytes = slab_size("ksm_rmap_item") or ksm_rmap_item_bytes(merged, sum(rmap.values()))
        stable_bytes = slab_size("ksm_stable_node") or KSM_STABLE_NODE
        tm = {o.name for o in owners if o.role == ROLE_TEMPLATE}
        self.cost = ksm_cost(rmap, tm, rmap_bytes, merged.get("pages_shared", 0), stable_bytes)
        self.info.update(
            ksm_merge_s=clock() - t0, ksm_settled=settled, ksm_before=start, ksm_merged=merged,
            ksm_rmap_items=rmap, ksm_merging_pages=merging, ksm_rmap_item_bytes=rmap_bytes,
            ksm_stable_node_bytes=stable_bytes,
            ksm_meta_bytes={"sandboxes": self.cost[0], "template": self.cost[1]},
        )

    def fixed_bytes(self) -> tuple[int, int]:
        return self.cost

    def stats(self) -> dict[str, int]:
        out = super().stats()
        k = self.ksm_stats()
        for name in ("pages_shared", "pages_sharing", "pages_unshared", "full_scans"):
            if name in k:
                out[f"ksm_{name}"] = k[name]
        return out

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            with contextlib.suppress(OSError):
                write(self.K / "run", "2")
                for k, v in self.saved.items():
                    write(self.K / k, v)


def zram_table_entry(disksize: int, info: Path = Path("/proc/vmallocinfo")) -> float:
    """Bytes of zram's table per slot: its vmalloc'ed table (a ``[zram]`` line of ``info``:
    allocated in zram_meta_alloc, which the kernels we run inline into disksize_store) over
    the slots of ``disksize``; 0.0 unless exactly one of zram's allocations has the size of a
    table (8-64 bytes a slot: zram's other buffers are a few pages)."""
    try:
        lines = info.read_text().splitlines()
    except OSError:
        return 0.0
    slots = disksize // PAGE_SIZE
    sizes = [
        int(m[1]) * PAGE_SIZE / slots
        for line in lines
        if "[zram]" in line and (m := re.search(r"\bpages=(\d+)", line))
    ]
    tables = [e for e in sizes if 8 <= e <= 64]
    return tables[0] if len(tables) == 1 else 0.0


def slab_size(cache: str) -> int:
    """Bytes a slab object of ``cache`` takes (SLUB's /sys/kernel/slab), 0 if not shown."""
    try:
        return int(read(Path("/sys/kernel/slab") / cache / "slab_size"))
    except (OSError, ValueError):
        return 0


KINDS: dict[str, type[System]] = {
    "zram": Zram, "zswap": Zswap, "azswap": Azswap, "azdev": AzswapDevice,
}
SUFFIXED = re.compile(r"^(?:(?P<ksm>ksm)-zram-(?P<kalgo>\w+)"
                      r"|zram-(?P<dalgo>\w+)-dict"
                      r"|zram-(?P<ralgo>\w+)-recomp-(?P<recomp>\w+)"
                      r"|zswap-(?P<salgo>\w+)-shrink)$")


def make_system(name: str) -> System:
    """The system named ``name`` (see the module docstring); ValueError for an unknown one."""
    if name == "none":
        return System()
    m = SUFFIXED.match(name)
    if m:
        if m["ksm"]:
            return KsmZram(m["kalgo"])
        if m["dalgo"]:
            return ZramDict(m["dalgo"])
        if m["ralgo"]:
            return ZramRecomp(m["ralgo"], m["recomp"])
        return ZswapShrink(m["salgo"])
    kind, _, algo = name.partition("-")
    if kind not in KINDS or not algo or (kind in ("zram", "zswap") and "-" in algo):
        raise ValueError(f"unknown system {name!r} (none, zram-ALGO, zram-ALGO-dict, "
                         "zram-ALGO-recomp-ALGO2, zswap-ALGO, zswap-ALGO-shrink, ksm-zram-ALGO, "
                         "azswap-ALGO, azdev-ALGO)")
    return KINDS[kind](algo)  # type: ignore[call-arg]


# the vm sysctls azswap-swap.service sets while its device is up, by their name in its script
# (packaging/azswap-swap-setup: its defaults, then the settings file it sources)
PRODUCT_SETTINGS = (module.TOP / "packaging" / "azswap-swap-setup",
                    module.TOP / "packaging" / "default" / "azswap")
PRODUCT_SYSCTLS = {"PAGE_CLUSTER": "page-cluster", "SWAPPINESS": "swappiness"}
PROC_VM = Path("/proc/sys/vm")


def product_vm_settings(files: Sequence[Path] = PRODUCT_SETTINGS) -> dict[str, str]:
    """The vm sysctls the product's swap service sets, as shipped: the ``KEY=VALUE``
    assignments of its script's defaults and then of its settings file, the last one of a key
    winning, as the shell that sources them sees them (an empty value: left alone)."""
    out: dict[str, str] = {}
    for path in files:
        for line in path.read_text().splitlines():
            key, eq, value = line.split("#", 1)[0].strip().partition("=")
            if not eq or key not in PRODUCT_SYSCTLS:
                continue
            value = value.strip().strip("\"'")
            if value:
                out[PRODUCT_SYSCTLS[key]] = value
            else:
                out.pop(PRODUCT_SYSCTLS[key], None)
    return out


def apply_product_vm_settings(proc_vm: Path = PROC_VM) -> dict[str, str]:
    """Set the product's vm sysctls for the rest of this (throwaway) guest's life: for a
    benchmark that brings its systems up itself (make_system()).  Returns what it set."""
    settings = product_vm_settings()
    for k, v in settings.items():
        write(proc_vm / k, v)
    return settings


@contextlib.contextmanager
def vm_settings(settings: dict[str, str], proc_vm: Path = PROC_VM) -> Iterator[None]:
    """/proc/sys/vm files set for the block, and put back as they were.  SwapDevError when one
    cannot be read or set."""
    old: dict[str, str] = {}  # what was set, to put back
    try:
        try:
            for k, v in settings.items():
                was = (proc_vm / k).read_text().strip()
                write(proc_vm / k, v)
                old[k] = was
        except OSError as e:
            raise SwapDevError(f"vm.{k} = {v}: {e}") from e
        yield
    finally:
        for k, v in old.items():
            write(proc_vm / k, v)


@contextlib.contextmanager
def swap_device(name: str, nbytes: int) -> Iterator[System]:
    """``name`` as the only swap device for the block, with the vm sysctls the product's swap
    service sets (product_vm_settings(): every system is measured under them); azswap's module
    is loaded fresh for it and unloaded afterwards.  Raises SwapDevError when it does not come
    up."""
    module.disable_zswap()
    sh("swapoff", "-a", check=False)
    system = make_system(name)
    az = isinstance(system, Azswap)
    if az:
        module.cleanup_module()
    try:
        settings = product_vm_settings()
    except OSError as e:
        raise SwapDevError(f"the product's swap settings: {e}") from e
    # as the service does: swap goes off before the sysctls are put back
    with vm_settings(settings):
        try:
            system.setup(nbytes)
            yield system
        finally:
            try:
                system.teardown()
            finally:
                if az:
                    module.cleanup_module()
