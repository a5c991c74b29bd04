"""Device attributes of /sys/block/azswapN (zram-like).

All knowledge of attribute names and of the column layout of the stat files lives in the tables at
the top of this file: adapting to docs/sysfs-abi.md means editing ``ATTRS`` / ``STAT_FILES`` only.
Missing attributes read as ``None`` (a module version without them), never as an exception;
extra columns are kept as ``col<N>``.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane import errors

SYS_BLOCK = Path("/sys/block")
DEV_PREFIX = "azswap"

# Plain integer attributes that can be read (and some written).
INT_ATTRS = ("disksize", "initstate", "mem_limit", "mem_used_max")
POLICY_ATTRS = (
    "dedup", "tdelta", "xdelta", "verify", "shuffle", "sim_effort", "delta_max_pct",
)
WRITABLE = {
    "disksize", "mem_limit", "mem_used_max", "comp_algorithm", "reset", "pack", *POLICY_ATTRS,
}

# Multi-column stat files (kmod/sysfs.c): file name -> column names, in order.
STAT_FILES: dict[str, tuple[str, ...]] = {
    "mm_stat": (
        "orig_data_size",
        "compr_data_size",
        "mem_used_total",
        "mem_limit",
        "mem_used_max",
        "same_pages",
        "raw_pages",
        "meta_bytes",
        "index_bytes",
        "template_bytes",
        "compacted_bytes",
    ),
    "io_stat": (
        "failed_stores",
        "failed_loads",
        "invalid_io",
        "notify_free",
        "stores",
        "loads",
        "frees",
        "partial_io",
        "miss_free",
    ),
    # pages stored now per representation
    "kind_stat": ("same", "dup", "tdelta", "xdelta", "plain", "raw"),
    "obj_stat": (
        "pages_stored",
        "objects",
        "bases",
        "template_pages",
        "deferred",
        "cross_group",
        "base_cache_pages",
        "base_cache_hits",
        "base_cache_misses",
        "template_lost",
        "packs",
        "packed_pages",
        "sim_sparse",
        "sim_waiting",
        "sim_switches",
        "sim_direct",
        "direct_pages",
    ),
    # meta_bytes by component (all but slot_used_bytes sum to it)
    "meta_stat": (
        "slot_bytes",
        "slot_used_bytes",
        "owner_bytes",
        "obj_meta_bytes",
        "index_table_bytes",
        "tnode_bytes",
        "base_cache_bytes",
    ),
}

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)[iI]?[bB]?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """'512M' / '1G' / '4096' -> bytes (binary units, like zram's memparse)."""
    if isinstance(text, int):
        if text < 0:
            raise errors.InvalidValue(f"size {text}: must not be negative")
        return text
    m = _SIZE_RE.match(text)
    if not m:
        raise errors.InvalidValue(f"size {text!r}: expected a number with an optional K/M/G/T")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_columns(names: tuple[str, ...], text: str) -> dict[str, int]:
    vals = text.split()
    out: dict[str, int] = {}
    for i, v in enumerate(vals):
        key = names[i] if i < len(names) else f"col{i}"
        try:
            out[key] = int(v)
        except ValueError:
            out[key] = -1
    return out


def parse_choice(text: str) -> tuple[str, list[str]]:
    """zram's 'lzo lz4 [zstd]' -> ('zstd', ['lzo', 'lz4', 'zstd']); azswap's 'zstd:3' -> itself."""
    words = text.split()
    current = next((w[1:-1] for w in words if w.startswith("[") and w.endswith("]")), "")
    choices = [w.strip("[]") for w in words]
    if not current and len(choices) == 1:
        current = choices[0]
    return current, choices


@dataclass
class DeviceStats:
    name: str
    disksize: int | None = None
    comp_algorithm: str | None = None
    algorithms: list[str] = field(default_factory=list)
    mem_limit: int | None = None
    mem_used_max: int | None = None
    initstate: int | None = None
    policy: dict[str, int] = field(default_factory=dict)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "disksize": self.disksize,
            "comp_algorithm": self.comp_algorithm,
            "algorithms": self.algorithms,
            "mem_limit": self.mem_limit,
            "mem_used_max": self.mem_used_max,
            "initstate": self.initstate,
            "policy": self.policy,
            **self.stats,
        }


class Device:
    """One /sys/block/azswapN directory (``root`` is injectable for tests)."""

    def __init__(self, index: int = 0, root: Path = SYS_BLOCK) -> None:
        self.index = index
        self.name = f"{DEV_PREFIX}{index}"
        self.path = Path(root) / self.name

    def exists(self) -> bool:
        return self.path.is_dir()

    def _require(self) -> None:
        if not self.exists():
            if not any(Path(self.path.parent).glob(f"{DEV_PREFIX}*")):
                raise errors.ModuleNotLoaded(
                    f"{self.path} missing: azswap module not loaded (insmod kmod/azswap.ko)"
                )
            raise errors.UnknownDevice(f"{self.path}: no such device")

    def read(self, attr: str) -> str | None:
        self._require()
        try:
            return (self.path / attr).read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise errors.from_oserror(e, str(self.path / attr)) from None

    def write(self, attr: str, value: str | int) -> None:
        if attr not in WRITABLE:
            raise errors.InvalidValue(f"{attr}: not a writable azswap attribute")
        self._require()
        p = self.path / attr
        try:
            with open(p, "w") as f:
                f.write(f"{value}\n")
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise errors.InvalidValue(f"{p}: this module has no such attribute") from None
            raise errors.from_oserror(e, f"{p} <- {value}") from None

    def read_int(self, attr: str) -> int | None:
        v = self.read(attr)
        if v is None or not v.lstrip("-").isdigit():
            return None
        return int(v)

    def stat(self, name: str) -> dict[str, int] | None:
        v = self.read(name)
        return None if v is None else parse_columns(STAT_FILES.get(name, ()), v)

    def snapshot(self) -> DeviceStats:
        st = DeviceStats(name=self.name)
        st.disksize = self.read_int("disksize")
        algo = self.read("comp_algorithm")
        if algo is not None:
            st.comp_algorithm, st.algorithms = parse_choice(algo)
        st.mem_limit = self.read_int("mem_limit")
        st.mem_used_max = self.read_int("mem_used_max")
        st.initstate = self.read_int("initstate")
        for a in POLICY_ATTRS:
            v = self.read_int(a)
            if v is not None:
                st.policy[a] = v
        for fname in STAT_FILES:
            cols = self.stat(fname)
            if cols is not None:
                st.stats[fname] = cols
        return st

    # -- setters ----------------------------------------------------------------------------

    def set_disksize(self, size: str | int) -> None:
        self.write("disksize", parse_size(size))

    def set_comp_algorithm(self, algo: str) -> None:
        self.write("comp_algorithm", algo)

    def set_mem_limit(self, size: str | int) -> None:
        self.write("mem_limit", parse_size(size))

    def reset_mem_used_max(self) -> None:
        self.write("mem_used_max", 0)

    def reset(self) -> None:
        self.write("reset", 1)

    def pack(self) -> None:
        """Pack the device now: runs of nearby PLAIN pages of one sandbox become multi-page
        objects (docs/sysfs-abi.md, `pack`)."""
        self.write("pack", 1)


def devices(root: Path = SYS_BLOCK) -> list[Device]:
    """Every azswap device present, by index."""
    found = []
    for p in Path(root).glob(f"{DEV_PREFIX}*"):
        suffix = p.name[len(DEV_PREFIX) :]
        if suffix.isdigit():
            found.append(Device(int(suffix), root))
    return sorted(found, key=lambda d: d.index)
