#!/usr/bin/env python3
"""Record real microVM guest memory: one template snapshot, N guests restored from it.

    vm-tests/microvm/record.py [--workload ml|coding] [--n 8] [--parallel 2] [--mem 384]
                               [--size default] [--out DIR]
                               [--no-free-page-reporting | --page-reporting-order N]

1. Builds (or reuses) the guest image: vm-tests/microvm/image.py (debootstrap bookworm, python3 +
   numpy, the template agent; cached under vm-tests/out/microvm-cache/).
2. Boots the template guest under QEMU TCG with its RAM in a file (memory-backend-file,
   share=on): the agent (vm-tests/microvm/agent.py) builds the state of the workload and blocks
   on its control port: ``ml`` (default), vm-tests/workloads/mlsandbox.py's ML sandbox; ``coding``,
   vm-tests/workloads/codingsandbox.py's coding agent (the guest's Python standard library
   sources as its checkout).
3. Snapshots it at that quiescent point, Firecracker style: QMP `stop`, then the device state
   migrated to template.vmstate with the x-ignore-shared capability (the RAM stays in the memory
   file, not in the stream): template.ram + template.vmstate are the snapshot.
4. Restores N guests from it (PARALLEL at a time), each over its own copy of template.ram
   (`-incoming defer`, x-ignore-shared, migrate-incoming from template.vmstate): guest i gets task
   TASKS[workload][i % len] (ml: train, generate, data, eval; coding: parse, search, edit, query,
   test) with its own seed; when it reports LLM_WAIT it is stopped and its RAM file is its memory
   at the LLM wait.
5. Writes DIR/microvm.aztrace (docs/trace-format.md): the template (synthetic owner, role
   template, its non-zero pages, index = page offset in the memory file) and one sandbox owner
   per guest holding the pages that differ from the template at the same offset (index = offset,
   vaddr = guest-physical address), plus DIR/manifest.json (tasks, timings, per-guest page counts).

Every guest (the template too) has a virtio-balloon device with free page reporting on, as a
platform would give its microVMs (--no-free-page-reporting: none): the guest reports free blocks of
at least 2^ORDER pages (the kernel's default: a pageblock, 2 MiB) and QEMU punches them out of the
memory file. The recorder waits at each quiescent point until the file stops shrinking. A discarded
page reads as zero: where the template's page was not zero it is an owned zero page in the trace, as
the VMM's memory holds it (a private mapping would fall back to the image's page, which costs the
host even less), counted per guest as `discarded_pages`.

Nothing here needs KVM (TCG, one vCPU per guest). Docs: docs/lab/microvm.md.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import mmap
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOP = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(TOP))

import image  # noqa: E402

from controlplane.trace import ROLE_SANDBOX, ROLE_TEMPLATE, TraceWriter  # noqa: E402

PAGE = 4096
# each workload's tasks, given to the guests in turn (names of its TASK_FNS)
TASKS = {
    "ml": ("train", "generate", "data", "eval"),
    "coding": ("parse", "search", "edit", "query", "test"),
}
SIZES = ("tiny", "small", "default", "large")  # every workload's SIZES keys
TEMPLATE_ID = 0x7A5_0000_0001  # synthetic owner id of the snapshot template (not a cgroup id)
GROUP = 1
SANDBOX_ID0 = 1001


def log(msg: str) -> None:
    print(f"[microvm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def connect_unix(path: Path, timeout: float) -> socket.socket:
    """A stream socket connected to the unix socket at ``path``, retried every 0.2 s until QEMU
    has created it (OSError after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class QMP:
    """Minimal QMP client over a unix socket."""

    def __init__(self, path: Path, timeout: float = 60.0) -> None:
        self.sock = connect_unix(path, timeout)
        self.f = self.sock.makefile("rwb")
        self._read()  # greeting
        self.cmd("qmp_capabilities")

    def _read(self) -> dict[str, Any]:
        while True:
            line = self.f.readline()
            if not line:
                raise RuntimeError("QMP connection closed")
            msg = json.loads(line)
            if "event" not in msg:
                return msg

    def cmd(self, name: str, **args: Any) -> Any:
        req: dict[str, Any] = {"execute": name}
        if args:
            req["arguments"] = args
        self.f.write(json.dumps(req).encode() + b"\n")
        self.f.flush()
        rep = self._read()
        if "error" in rep:
            raise RuntimeError(f"QMP {name}: {rep['error'].get('desc', rep['error'])}")
        return rep.get("return")

    def wait_migration(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.cmd("query-migrate")
            s = st.get("status")
            if s == "completed":
                return st
            if s in ("failed", "cancelled"):
                raise RuntimeError(f"migration {s}: {st.get('error-desc', '')}")
            time.sleep(0.2)
        raise TimeoutError("migration did not complete")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Port:
    """The host end of the agent's control port (a QEMU chardev socket, server side in QEMU)."""

    def __init__(self, path: Path, timeout: float = 60.0) -> None:
        self.sock = connect_unix(path, timeout)
        self.buf = b""

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\n")

    def expect(self, word: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buf:
                raw, self.buf = self.buf.split(b"\n", 1)
                line = raw.decode(errors="replace").strip()
                if line.startswith(word):
                    return line
                if line.startswith("ERROR"):
                    raise RuntimeError(f"agent: {line}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {word} from the agent")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                continue
            if not chunk:
                raise RuntimeError("control port closed (guest died?)")
            self.buf += chunk

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


@dataclass
class VmSpec:
    name: str
    ram: Path
    workdir: Path
    mem_mib: int
    img: image.Image
    append: str
    incoming: bool = False
    balloon: bool = False  # virtio-balloon with free page reporting


def qemu_cmd(spec: VmSpec, qmp_path: Path, ctl_path: Path) -> list[str]:
    """The QEMU command line of one recorder guest (TCG, one vCPU, RAM in spec.ram)."""
    cmd = [
        "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-machine", "pc,memory-backend=mem",
        "-cpu", "qemu64", "-smp", "1", "-m", f"{spec.mem_mib}M",
        "-object", (f"memory-backend-file,id=mem,size={spec.mem_mib}M,"
                    f"mem-path={spec.ram},share=on"),
        "-kernel", spec.img.kernel, "-initrd", spec.img.initrd, "-append", spec.append,
        "-drive", f"file={spec.img.disk},if=virtio,format=raw,readonly=on",
        "-nodefaults", "-vga", "none", "-display", "none", "-no-reboot", "-nic", "none",
        "-serial", f"file:{spec.workdir / (spec.name + '.console.log')}",
        "-chardev", f"socket,id=ctl,path={ctl_path},server=on,wait=off",
        "-serial", "chardev:ctl",
        "-qmp", f"unix:{qmp_path},server=on,wait=off",
    ]
    if spec.balloon:
        # Same device in the template and every restore: the snapshot's device state has it.
        cmd += ["-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on"]
    if spec.incoming:
        cmd += ["-incoming", "defer"]
    return cmd


@contextlib.contextmanager
def qemu(spec: VmSpec) -> Iterator[tuple[subprocess.Popen[bytes], QMP, Path]]:
    wd = spec.workdir
    wd.mkdir(parents=True, exist_ok=True)
    qmp_path, ctl_path = wd / f"{spec.name}.qmp", wd / f"{spec.name}.ctl"
    for p in (qmp_path, ctl_path):
        p.unlink(missing_ok=True)
    cmd = qemu_cmd(spec, qmp_path, ctl_path)
    errf = open(wd / f"{spec.name}.qemu.err", "wb")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf)
    q: QMP | None = None
    try:
        q = QMP(qmp_path)
        yield proc, q, ctl_path
    finally:
        if q is not None:
            with contextlib.suppress(Exception):
                q.cmd("quit")
            q.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        errf.close()


def sparse_copy(src: Path, dst: Path) -> None:
    subprocess.run(["cp", "--sparse=always", str(src), str(dst)], check=True)


def allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def settle_discards(size: Callable[[], int], quiet_s: float = 6.0, poll_s: float = 0.5,
                    limit_s: float = 180.0, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> tuple[float, int, bool]:
    """Wait until a memory file (@size: its allocated bytes now) has not shrunk for @quiet_s,
    at most @limit_s.

    The guest reports free blocks at most every 2 s, a budget of each free list at a time, so
    the file shrinks in steps; @quiet_s spans a few of them.  Each sample is compared with the
    one before it (the guest may write pages back meanwhile).  Returns (seconds waited, bytes
    the file went down by overall, whether it settled before @limit_s)."""
    t0 = clock()
    first = prev = size()
    t_last = t0
    while True:
        sleep(poll_s)
        now = clock()
        cur = size()
        if cur < prev:
            t_last = now
        prev = cur
        if now - t_last >= quiet_s:
            return now - t0, first - cur, True
        if now - t0 >= limit_s:
            return now - t0, first - cur, False


def settle(ram: Path, who: str) -> tuple[float, int]:
    """settle_discards() on the memory file @ram, logged."""
    waited, shrank, settled = settle_discards(lambda: allocated_bytes(ram))
    if not settled:
        log(f"{who}: the memory file still shrank after {waited:.0f}s; recorded as it is")
    return waited, shrank


def hole_pages(path: Path, npages: int) -> bytearray:
    """One byte per page of @path: 1 where the whole page is a hole (never written, or
    discarded: punched out by the balloon), 0 where it holds data."""
    holes = bytearray(b"\1") * npages
    size = npages * PAGE
    with open(path, "rb") as f:
        fd = f.fileno()
        off = 0
        while off < size:
            try:
                start = os.lseek(fd, off, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # no data after off
                    break
                raise
            if start >= size:
                break
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            holes[start // PAGE:(end + PAGE - 1) // PAGE] = bytes((end + PAGE - 1) // PAGE
                                                                  - start // PAGE)
            off = end
    return holes


@dataclass
class GuestResult:
    name: str
    task: str
    seed: int
    restore_s: float = 0.0
    task_s: float = 0.0
    wall_s: float = 0.0
    agent_task_s: float = 0.0
    settle_s: float = 0.0  # waited at the LLM wait for the balloon's reports to end
    settle_shrank_bytes: int = 0  # what the memory file went down by in that wait
    info: dict[str, Any] = field(default_factory=dict)


def record_template(out: Path, img: image.Image, mem: int, size: str, seed: int,
                    timeout: float, balloon: bool = False,
                    report_order: int | None = None, workload: str = "ml") -> dict[str, Any]:
    ram = out / "template.ram"
    ram.unlink(missing_ok=True)
    append = (f"console=ttyS0 root=/dev/vda ro rootfstype=ext4 init=/opt/azagent/init.sh "
              f"panic=-1 quiet azagent.workload={workload} azagent.size={size} "
              f"azagent.seed={seed}")
    if report_order is not None:
        append += f" azagent.report_order={report_order}"
    spec = VmSpec("template", ram, out / "run", mem, img, append, balloon=balloon)
    settled = (0.0, 0)
    t0 = time.monotonic()
    with qemu(spec) as (_proc, q, ctl):
        port = Port(ctl)
        booted = port.expect("BOOTED", timeout)
        t_boot = time.monotonic() - t0
        log(f"template booted ({t_boot:.0f}s wall, agent says {booted})")
        ready = port.expect("TEMPLATE_READY", timeout)
        t_ready = time.monotonic() - t0
        log(f"template ready ({t_ready:.0f}s wall; {ready})")
        time.sleep(3)  # let the guest settle into its idle loop before the snapshot
        if balloon:
            settled = settle(ram, "template")
            log(f"template: settled in {settled[0]:.0f}s (the memory file went down by "
                f"{settled[1] >> 20} MiB meanwhile)")
        q.cmd("stop")
        q.cmd("migrate-set-capabilities",
              capabilities=[{"capability": "x-ignore-shared", "state": True}])
        vmstate = out / "template.vmstate"
        q.cmd("migrate", uri=f"exec:cat > {vmstate}")
        mig = q.wait_migration(120)
        port.close()
    return {"boot_s": t_boot, "ready_s": t_ready, "agent_build_s": float(ready.split()[1]),
            "vmstate_bytes": (out / "template.vmstate").stat().st_size,
            "migration_total_ms": mig.get("total-time"), "append": append,
            "free_page_reporting": balloon, "page_reporting_order": report_order,
            "workload": workload, "settle_s": settled[0], "settle_shrank_bytes": settled[1]}


def restore_guest(out: Path, img: image.Image, mem: int, append: str, i: int,
                  timeout: float, task_mode: str = "inproc",
                  balloon: bool = False, workload: str = "ml") -> GuestResult:
    tasks = TASKS[workload]
    task, seed = tasks[i % len(tasks)], 1000 + i
    res = GuestResult(f"vm{i}", task, seed)
    ram = out / f"{res.name}.ram"
    t0 = time.monotonic()
    sparse_copy(out / "template.ram", ram)
    spec = VmSpec(res.name, ram, out / "run", mem, img, append, incoming=True,
                  balloon=balloon)
    with qemu(spec) as (_proc, q, ctl):
        q.cmd("migrate-set-capabilities",
              capabilities=[{"capability": "x-ignore-shared", "state": True}])
        q.cmd("migrate-incoming", uri=f"exec:cat {out / 'template.vmstate'}")
        q.wait_migration(120)
        # The snapshot was taken from a stopped VM, so the destination stays paused: resume it.
        deadline = time.monotonic() + 60
        while (status := q.cmd("query-status").get("status")) != "running":
            if status in ("paused", "postmigrate", "prelaunch"):
                q.cmd("cont")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{res.name}: not running after the incoming migration")
            time.sleep(0.1)
        res.restore_s = time.monotonic() - t0
        port = Port(ctl)
        port.send("PING")
        port.expect("PONG", 60)
        t1 = time.monotonic()
        port.send(f"TASK {task} {seed} {task_mode}")
        done = port.expect("LLM_WAIT", timeout)
        res.task_s = time.monotonic() - t1
        res.agent_task_s = float(done.split()[2])
        time.sleep(2)  # the guest idles at its LLM wait
        if balloon:
            res.settle_s, res.settle_shrank_bytes = settle(ram, res.name)
        q.cmd("stop")
        port.close()
    res.wall_s = time.monotonic() - t0
    log(f"{res.name}: {task} seed {seed}: restored in {res.restore_s:.1f}s, task "
        f"{res.task_s:.0f}s wall ({res.agent_task_s:.0f}s guest)"
        + (f", settled in {res.settle_s:.0f}s (-{res.settle_shrank_bytes >> 20} MiB)"
           if balloon else ""))
    return res


ZERO = bytes(PAGE)


def write_trace(out: Path, results: list[GuestResult], meta: dict[str, Any]) -> dict[str, Any]:
    """template + per-guest differing pages -> microvm.aztrace; per-guest page counts."""
    tpath = out / "template.ram"
    size = tpath.stat().st_size
    npages = size // PAGE
    path = out / "microvm.aztrace"
    tmp = path.with_suffix(".tmp")
    stats: dict[str, Any] = {"pages": npages}
    with open(tpath, "rb") as tf, TraceWriter(tmp) as w:
        tm = mmap.mmap(tf.fileno(), 0, prot=mmap.PROT_READ)
        w.meta(meta)
        w.owner(TEMPLATE_ID, GROUP, ROLE_TEMPLATE, "template", kind="snapshot-file",
                file="template.ram")
        nz = 0
        batch_i: list[int] = []
        batch_d: list[bytes] = []

        def flush(oid: int) -> None:
            if batch_i:
                w.pages(oid, batch_i, [k * PAGE for k in batch_i], b"".join(batch_d))
                batch_i.clear()
                batch_d.clear()

        for k in range(npages):
            pg = tm[k * PAGE:(k + 1) * PAGE]
            if pg != ZERO:
                nz += 1
                batch_i.append(k)
                batch_d.append(pg)
                if len(batch_i) == 1024:
                    flush(TEMPLATE_ID)
        flush(TEMPLATE_ID)
        stats["template_nonzero_pages"] = nz
        guests = []
        for n, r in enumerate(results):
            oid = SANDBOX_ID0 + n
            w.owner(oid, GROUP, ROLE_SANDBOX, r.name, task=r.task, seed=r.seed,
                    file=f"{r.name}.ram")
            holes = hole_pages(out / f"{r.name}.ram", npages)
            with open(out / f"{r.name}.ram", "rb") as gf:
                gm = mmap.mmap(gf.fileno(), 0, prot=mmap.PROT_READ)
                owned = owned_zero = g_nz = discarded = 0
                for k in range(npages):
                    a = gm[k * PAGE:(k + 1) * PAGE]
                    z = a == ZERO
                    g_nz += not z
                    if a != tm[k * PAGE:(k + 1) * PAGE]:
                        owned += 1
                        owned_zero += z
                        discarded += holes[k]  # a hole reads as zero
                        batch_i.append(k)
                        batch_d.append(a)
                        if len(batch_i) == 1024:
                            flush(oid)
                flush(oid)
                gm.close()
            r.info = {"owned_pages": owned, "owned_zero_pages": owned_zero,
                      "nonzero_pages": g_nz, "discarded_pages": discarded}
            guests.append({"name": r.name, "id": oid, **asdict(r)})
            log(f"{r.name}: {owned} owned pages ({owned * PAGE >> 20} MiB, {owned_zero} zero, "
                f"{discarded} of them discarded), {g_nz} non-zero pages")
        tm.close()
    os.replace(tmp, path)
    stats["guests"] = guests
    return stats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=tuple(TASKS), default="ml",
                    help="what the template and its guests run: ml (mlsandbox.py's training, "
                         "generation, data and eval tool calls) or coding (codingsandbox.py's "
                         "parse, search, edit, query and test tool calls over the guest's "
                         "Python standard library)")
    ap.add_argument("--n", type=int, default=8, help="guests restored from the snapshot")
    ap.add_argument("--parallel", type=int, default=2, help="guests running at once")
    ap.add_argument("--mem", type=int, default=384, help="guest RAM, MiB")
    ap.add_argument("--size", default="default", choices=SIZES,
                    help="the workload's state size (its SIZES)")
    ap.add_argument("--seed", type=int, default=1, help="template state seed")
    ap.add_argument("--timeout", type=float, default=900, help="per boot / per task, seconds")
    ap.add_argument("--out", type=Path, default=TOP / "vm-tests" / "out" / "microvm")
    ap.add_argument("--keep-ram", action="store_true", help="keep the guests' RAM files")
    ap.add_argument("--task-mode", choices=("inproc", "fork", "worker"), default="inproc",
                    help="run each task in the agent process, in a forked child that exits "
                         "before the LLM wait (a tool call), or in a forked child that stays "
                         "alive (a persistent tool process)")
    ap.add_argument("--reuse-template", action="store_true",
                    help="reuse DIR/template.ram + template.vmstate from an earlier run")
    ap.add_argument("--free-page-reporting", action=argparse.BooleanOptionalAction,
                    default=True,
                    help="give every guest (the template too) a virtio-balloon device with free "
                         "page reporting on, as a platform runs its microVMs: free "
                         "blocks it reports are punched out of its memory file; the recorder "
                         "waits at each quiescent point until the file stops shrinking. "
                         "--no-free-page-reporting: no balloon, free memory keeps its bytes")
    ap.add_argument("--page-reporting-order", type=int, metavar="ORDER",
                    help="report free blocks of at least 2^ORDER pages (0-10; default: the "
                         "guest kernel's, a pageblock = 9)")
    a = ap.parse_args(argv)
    if a.page_reporting_order is not None:
        if not a.free_page_reporting:
            ap.error("--page-reporting-order cannot go with --no-free-page-reporting")
        if not 0 <= a.page_reporting_order <= 10:
            ap.error("--page-reporting-order: 0..10")
    if a.n < 1 or a.parallel < 1:
        ap.error("--n and --parallel must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if shutil.which("qemu-system-x86_64") is None:
        print("record: qemu-system-x86_64 not found (apt-get install qemu-system-x86)",
              file=sys.stderr)
        return 2
    t0 = time.monotonic()
    img = image.build()
    t_img = time.monotonic() - t0
    log(f"image ready in {t_img:.0f}s: {img.disk}")
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    tinfo_path = out / "template.json"
    if a.reuse_template and tinfo_path.exists() and (out / "template.vmstate").exists():
        tinfo = json.loads(tinfo_path.read_text())
        if tinfo.get("disk_key") != img.key:
            print("record: template was recorded with another disk image; drop --reuse-template",
                  file=sys.stderr)
            return 2
        if (bool(tinfo.get("free_page_reporting")) != a.free_page_reporting
                or tinfo.get("page_reporting_order") != a.page_reporting_order):
            print("record: template was recorded with other free page reporting settings; "
                  "drop --reuse-template", file=sys.stderr)
            return 2
        recorded = tinfo.get("workload", "ml")  # templates from before workloads are ML
        if recorded != a.workload:
            print(f"record: template was recorded with the {recorded} workload, not "
                  f"{a.workload}; drop --reuse-template or use another --out", file=sys.stderr)
            return 2
    else:
        tinfo = record_template(out, img, a.mem, a.size, a.seed, a.timeout,
                                a.free_page_reporting, a.page_reporting_order, a.workload)
        tinfo.update(disk_key=img.key, mem_mib=a.mem, size=a.size, seed=a.seed)
        tinfo_path.write_text(json.dumps(tinfo, indent=1))
    t_tmpl = time.monotonic() - t0 - t_img
    lock = threading.Lock()
    results: list[GuestResult] = []
    with ThreadPoolExecutor(max_workers=a.parallel) as ex:
        futs = [ex.submit(restore_guest, out, img, a.mem, tinfo["append"], i, a.timeout,
                          a.task_mode, a.free_page_reporting, a.workload)
                for i in range(a.n)]
        for f in futs:
            r = f.result()
            with lock:
                results.append(r)
    t_guests = time.monotonic() - t0 - t_img - t_tmpl
    meta = {"style": "microvm-snapshot", "recorder": "vm-tests/microvm/record.py",
            "workload": a.workload, "n": a.n, "mem_mib": a.mem, "size": a.size, "seed": a.seed,
            "task_mode": a.task_mode, "free_page_reporting": a.free_page_reporting,
            "page_reporting_order": a.page_reporting_order,
            "tasks": [r.task for r in results], "kernel": img.kernel,
            "template_id": TEMPLATE_ID, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                time.gmtime())}
    stats = write_trace(out, results, meta)
    t_trace = time.monotonic() - t0 - t_img - t_tmpl - t_guests
    if not a.keep_ram:
        for r in results:
            (out / f"{r.name}.ram").unlink(missing_ok=True)
    manifest = {**meta, "template": tinfo, **stats,
                "timing_s": {"image": t_img, "template": t_tmpl, "guests": t_guests,
                             "trace": t_trace, "total": time.monotonic() - t0}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    log(f"done in {manifest['timing_s']['total']:.0f}s: {out / 'microvm.aztrace'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
