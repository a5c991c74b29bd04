"""Record the private anonymous pages of live processes into a page trace.

    python -m controlplane.trace.recorder OUT.aztrace --template PID [--sandbox PID ...] [--group 1]
        [--exclusive] [--meta key=value ...]

For every process: /proc/PID/maps lists its mappings; /proc/PID/pagemap tells, per page, whether
it is present (bit 63), swapped (bit 62), a file page or shared anonymous page (bit 61) and mapped
exclusively (bit 56); /proc/PID/mem gives the bytes. A page is recorded when it is an anonymous
page of a private mapping: present with bit 61 clear (this includes CoW copies in private file
mappings, e.g. a library's .data). With ``exclusive`` (what a forked sandbox owns), only pages
mapped once (bit 56) are recorded: pages still shared with the template are the template's.

Indexes: vaddr >> 12 for anonymous mappings (page->index of an anonymous page unless its mapping
was moved by mremap), file page offset for pages of private file mappings. The processes are
stopped (SIGSTOP) while they are read unless stop=False. Needs ptrace access (root).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from controlplane.trace.format import (
    PAGE_SIZE,
    ROLE_SANDBOX,
    ROLE_TEMPLATE,
    TraceError,
    TraceWriter,
)

PM_PRESENT = 1 << 63
PM_SWAP = 1 << 62
PM_FILE = 1 << 61
PM_EXCLUSIVE = 1 << 56
SKIP = ("[vvar]", "[vdso]", "[vsyscall]", "[vvar_vclock]", "[uprobes]")


@dataclass
class Proc:
    pid: int
    owner: int
    group: int
    role: int
    name: str
    exclusive: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str

    @property
    def prot(self) -> int:
        return (
            (1 if self.perms[0] == "r" else 0)
            | (2 if self.perms[1] == "w" else 0)
            | (4 if self.perms[2] == "x" else 0)
        )

    @property
    def anon(self) -> bool:
        return not self.path or self.path.startswith("[")


def read_maps(pid: int) -> list[Mapping]:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].strip() if len(parts) > 5 else ""
            out.append(Mapping(lo, hi, parts[1], int(parts[2], 16), path))
    return out


def private_pages(
    pid: int, exclusive: bool, stats: dict[str, int]
) -> Iterator[tuple[Mapping, list[tuple[int, int]]]]:
    """Yield (mapping, [(vaddr, index)...]) for the anonymous pages to record."""
    with open(f"/proc/{pid}/pagemap", "rb") as pm:
        for m in read_maps(pid):
            if m.perms[3] != "p" or m.perms[0] != "r" or m.path in SKIP:
                continue
            n = (m.end - m.start) // PAGE_SIZE
            pm.seek(m.start // PAGE_SIZE * 8)
            raw = pm.read(n * 8)
            ents = struct.unpack(f"<{len(raw) // 8}Q", raw)
            sel = []
            for k, e in enumerate(ents):
                if e & PM_SWAP and not e & PM_FILE:
                    stats["swapped"] += 1
                    continue
                if not e & PM_PRESENT or e & PM_FILE:
                    continue
                if exclusive and not e & PM_EXCLUSIVE:
                    stats["shared"] += 1
                    continue
                va = m.start + k * PAGE_SIZE
                idx = va // PAGE_SIZE if m.anon else m.offset // PAGE_SIZE + k
                sel.append((va, idx))
            if sel:
                yield m, sel


def _runs(sel: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
    run: list[tuple[int, int]] = []
    for va, idx in sel:
        if run and (va != run[-1][0] + PAGE_SIZE or len(run) >= 1024):
            yield run
            run = []
        run.append((va, idx))
    if run:
        yield run


def record_proc(w: TraceWriter, p: Proc) -> dict[str, int]:
    stats = {"pages": 0, "swapped": 0, "shared": 0, "unreadable": 0, "vmas": 0}
    w.owner(p.owner, p.group, p.role, p.name, pid=p.pid, exclusive=p.exclusive, **p.info)
    fd = os.open(f"/proc/{p.pid}/mem", os.O_RDONLY)
    try:
        for m, sel in private_pages(p.pid, p.exclusive, stats):
            w.vma(
                p.owner, m.start, m.end, m.offset // PAGE_SIZE if not m.anon else 0, m.prot, m.path
            )
            stats["vmas"] += 1
            for run in _runs(sel):
                try:
                    data = os.pread(fd, len(run) * PAGE_SIZE, run[0][0])
                except OSError:
                    data = b""
                if len(data) != len(run) * PAGE_SIZE:
                    stats["unreadable"] += len(run)
                    continue
                w.pages(p.owner, [i for _, i in run], [v for v, _ in run], data)
                stats["pages"] += len(run)
    finally:
        os.close(fd)
    return stats


def record(
    path: str,
    procs: list[Proc],
    meta: dict[str, Any] | None = None,
    stop: bool = True,
    compress: int = 1,
) -> dict[str, dict[str, int]]:
    """Write a trace of ``procs`` (templates first is the replay order) to ``path``."""
    pids = [p.pid for p in procs]
    for pid in pids:
        if not os.path.exists(f"/proc/{pid}"):
            raise TraceError(f"no process {pid}")
    if stop:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
    out: dict[str, dict[str, int]] = {}
    try:
        with TraceWriter(path, meta=meta or {}, compress=compress) as w:
            for p in sorted(procs, key=lambda p: p.role != ROLE_TEMPLATE):
                out[p.name] = record_proc(w, p)
    finally:
        if stop:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m controlplane.trace.recorder", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("out")
    ap.add_argument("--template", type=int, action="append", default=[], metavar="PID")
    ap.add_argument("--sandbox", type=int, action="append", default=[], metavar="PID")
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument(
        "--exclusive",
        action="store_true",
        help="sandboxes: only pages mapped once (fork-style ownership)",
    )
    ap.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--compress", type=int, default=1, help="zstd level for PAGES records, 0 off")
    a = ap.parse_args(argv)
    procs = [
        Proc(pid, 1000 + k, a.group, ROLE_TEMPLATE, f"template{k}")
        for k, pid in enumerate(a.template)
    ]
    procs += [
        Proc(pid, 1 + k, a.group, ROLE_SANDBOX, f"sb{k}", a.exclusive)
        for k, pid in enumerate(a.sandbox)
    ]
    if not procs:
        ap.error("nothing to record: give --template and/or --sandbox PIDs")
    meta = dict(kv.split("=", 1) for kv in a.meta if "=" in kv)
    try:
        res = record(a.out, procs, meta, compress=a.compress)
    except (OSError, TraceError) as exc:
        print(f"recorder: {exc}", file=sys.stderr)
        return 1
    for name, st in res.items():
        print(
            f"{name}: {st['pages']} pages ({st['pages'] * PAGE_SIZE / 2**20:.1f} MiB), "
            f"{st['vmas']} mappings, {st['shared']} shared skipped, {st['swapped']} swapped, "
            f"{st['unreadable']} unreadable"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
