"""Every system under test as the only swap device, and its stats by name.

    none                no swap
    zram-ALGO           /dev/zram0 with ALGO (lz4, zstd)
    zswap-ALGO          zswap (zsmalloc, ALGO) in front of a brd ramdisk swap device
    azswap-ALGO         /dev/azswap0, owners registered over netlink by the benchmark;
                        "-noshuf": policy shuffle=0; "lz4/zstd:6": template bases in the codec
                        after the slash, then the sandboxes' codec (after_template())
    azdev-ALGO          /dev/azswap0 with nothing registered: same-filled + per-page lz4/zstd
                        only (the zram-parity setup)

No fallback: a system that does not come up raises :class:`SwapDevError` with the reason, and
setup checks that the device it asked for is the one swapping.  Stats are parsed by column name:
azswap's from controlplane.sysfs.STAT_FILES, zram's from its documented mm_stat columns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.kit import module
from bench.kit.shell import read, sh, write
from controlplane.abi import Codec
from controlplane.sysfs import STAT_FILES, parse_columns
from controlplane.trace import PAGE_SIZE, ROLE_TEMPLATE, Owner

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


class SwapDevError(RuntimeError):
    """The system asked for did not come up as the swap device."""


class System:
    """No swap at all (the "none" row)."""

    name = "none"
    swap = False
    device = ""

    def setup(self, nbytes: int) -> None: ...

    def teardown(self) -> None: ...

    def register(self, cgroups: dict[str, Path], owners: list[Owner]) -> None: ...

    def stats(self) -> dict[str, int]:
        return {}

    def owner_stats(self) -> list[dict[str, Any]]:
        return []

    def used_bytes(self) -> int:
        """Memory the device itself holds for the stored pages (allocator pool + metadata)."""
        s = self.stats()
        return s.get("pool", 0) + s.get("meta", 0)

    def _swapon(self) -> None:
        r = sh("swapon", "-p", "100", self.device, check=False)
        if r.returncode or self.device not in module.swaps():
            raise SwapDevError(f"{self.name}: swapon {self.device} failed: {r.stderr.strip()}")


class Zram(System):
    def __init__(self, algo: str) -> None:
        self.name = f"zram-{algo}"
        self.algo = algo
        self.swap = True
        self.device = "/dev/zram0"
        self.sys = Path("/sys/block/zram0")

    def setup(self, nbytes: int) -> None:
        if not self.sys.exists():
            sh("modprobe", "zram", "num_devices=1")
        write(self.sys / "reset", "1")
        try:
            write(self.sys / "comp_algorithm", self.algo)
        except OSError as e:
            raise SwapDevError(f"{self.name}: zram has no {self.algo}: {e}") from None
        write(self.sys / "disksize", str(nbytes))
        sh("mkswap", self.device)
        self._swapon()

    def teardown(self) -> None:
        sh("swapoff", self.device, check=False)
        write(self.sys / "reset", "1")

    def stats(self) -> dict[str, int]:
        m = parse_columns(ZRAM_MM_STAT, read(self.sys / "mm_stat"))
        return {
            "orig": m["orig_data_size"],
            "payload": m["compr_data_size"],
            "pool": m["mem_used_total"],
            "same_pages": m["same_pages"],
            "huge_pages": m.get("huge_pages", 0),
        }


class Zswap(System):
    P = Path("/sys/module/zswap/parameters")
    D = Path("/sys/kernel/debug/zswap")

    def __init__(self, algo: str) -> None:
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
        write(self.P / "zpool", "zsmalloc")
        try:
            write(self.P / "compressor", self.algo)
        except OSError as e:
            raise SwapDevError(f"{self.name}: zswap has no {self.algo}: {e}") from None
        write(self.P / "max_pool_percent", "60")
        write(self.P / "enabled", "Y")
        if read(self.P / "compressor") != self.algo or read(self.P / "enabled") != "Y":
            raise SwapDevError(f"{self.name}: zswap did not take {self.algo}")

    def teardown(self) -> None:
        write(self.P / "enabled", "N")
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
            "pool": d.get("pool_total_size", 0) + on_disk,
            "zswap_pool": d.get("pool_total_size", 0),
            "backing_bytes": on_disk,
            "same_pages": d.get("same_filled_pages", 0),
            "rejects": sum(v for k, v in d.items() if k.startswith("reject_")),
            "written_back": d.get("written_back_pages", 0),
            "pool_limit_hit": d.get("pool_limit_hit", 0),
            **{f"debugfs_{k}": v for k, v in d.items()},
        }


class Azswap(System):
    B = Path("/sys/block/azswap0")

    def __init__(self, algo: str) -> None:
        self.name = f"azswap-{algo}"
        # "-noshuf": policy shuffle=0 (float pages raw, as zram; faster loads).
        self.shuffle = 0 if algo.endswith("-noshuf") else 1
        # "lz4/zstd:6": template bases in the codec after the slash (the device starts with it),
        # sandboxes in the first one (after_template() switches the policy, live).
        self.algo, _, base = algo.removesuffix("-noshuf").partition("/")
        self.base_algo = base or self.algo
        # Swap slots per similarity index entry (sysfs sim_slots, docs/store.md).
        self.sim_slots = 1
        self.swap = True
        self.device = "/dev/azswap0"
        self.ids: dict[str, int] = {}

    def setup(self, nbytes: int) -> None:
        if not module.loaded():
            try:
                module.insmod()
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
        out = {
            "orig": m["orig_data_size"],
            "payload": m["compr_data_size"],
            "pool": m["mem_used_total"],
            "meta": m["meta_bytes"],
            "index": m["index_bytes"],
            "template_bytes": m["template_bytes"],
            "compacted": m.get("compacted_bytes", 0),
            "base_cache_pages": o["base_cache_pages"],
        }
        for name in STAT_FILES["kind_stat"]:
            out[f"kind_{name}"] = k[name]
        return out

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


KINDS: dict[str, type[System]] = {
    "zram": Zram, "zswap": Zswap, "azswap": Azswap, "azdev": AzswapDevice,
}


def make_system(name: str) -> System:
    """The system named ``name`` (see the module docstring); ValueError for an unknown one."""
    if name == "none":
        return System()
    kind, _, algo = name.partition("-")
    if kind not in KINDS or not algo:
        raise ValueError(f"unknown system {name!r} (none, zram-ALGO, zswap-ALGO, azswap-ALGO, "
                         "azdev-ALGO)")
    return KINDS[kind](algo)  # type: ignore[call-arg]


@contextlib.contextmanager
def swap_device(name: str, nbytes: int) -> Iterator[System]:
    """``name`` as the only swap device for the block; azswap's module is loaded fresh for it
    and unloaded afterwards.  Raises SwapDevError when it does not come up."""
    module.disable_zswap()
    sh("swapoff", "-a", check=False)
    system = make_system(name)
    az = isinstance(system, Azswap)
    if az:
        module.cleanup_module()
    try:
        system.setup(nbytes)
        yield system
    finally:
        try:
            system.teardown()
        finally:
            if az:
                module.cleanup_module()
