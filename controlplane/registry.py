"""Sandboxes and templates known to the control plane.

The module is the source of truth for *who is registered* (cgroup id, trust group, sandbox or
template); the control plane adds what the module does not keep: names, cgroup paths, which template
a sandbox came from, which snapshot file a template was loaded from.  Those live in a small JSON
state file (``/run/azswap/state-devN.json``, 0600) so that a restarted daemon gets its names back:
:meth:`Registry.recover` lists the module's owners (a STATS dump) and joins them with the file by
cgroup id.  Owners the module has but the file does not get a name from their cgroup path (or
``cg<ID>``); names in the file the module no longer has are dropped.

The STATS dump also lists owners that were *removed* but still own stored bytes (the core keeps
them until their last page is freed); the reply marks them with ``AZSWAP_A_ST_REGISTERED = 0``
and recovery skips them.  The registry also remembers the ids it removed itself (``removed`` in
the state file), for modules that predate that attribute.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from controlplane import errors, snapshot
from controlplane.abi import MAX_LOAD_PAGES, Cmd, Event, Info, OwnerStats, Phase, Policy
from controlplane.cgroup import CGROUP_ROOT, Cgroup, find_by_id, normalize
from controlplane.mapping import FileMapping, find_mapping

log = logging.getLogger("azswap.registry")

RUN_DIR = Path("/run/azswap")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$")
SYNTHETIC_BIT = 1 << 63


class ModuleBackend(Protocol):
    """What the control plane needs of the module (AzswapNetlink, or a fake in tests)."""

    def info(self) -> Info: ...
    def sandbox_add(
        self, group: int, *, cgroup_id: int | None = None, cgroup_path: str | None = None
    ) -> int: ...
    def sandbox_del(self, cgroup_id: int) -> None: ...
    def template_add(
        self, group: int, *, cgroup_id: int | None = None, cgroup_path: str | None = None
    ) -> int: ...
    def template_del(self, cgroup_id: int) -> None: ...
    def template_load(self, cgroup_id: int, index: int, pages: bytes) -> None: ...
    def stats(self, cgroup_id: int | None = None) -> list[OwnerStats]: ...
    def policy_get(self) -> Policy: ...
    def policy_set(self, **fields: int) -> None: ...
    def phase_set(self, cgroup_id: int, phase: Phase) -> None: ...
    def sandbox_map(self, cgroup_id: int, start: int, pages: int, pgoff: int) -> None: ...
    def close(self) -> None: ...


@dataclass
class Sandbox:
    name: str
    cgroup_id: int
    group: int
    cgroup_path: str | None = None
    template: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Template:
    name: str
    cgroup_id: int
    group: int
    cgroup_path: str | None = None
    source_file: str | None = None
    pages_loaded: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise errors.InvalidValue(
            f"name {name!r}: 1-64 characters of letters, digits and _ . : @ - "
            "(starting with a letter or digit)"
        )
    return name


def synthetic_id(path: str | os.PathLike[str]) -> int:
    """A template id for a snapshot file: top bit set, so it never equals a cgroup inode."""
    digest = hashlib.blake2b(os.fsencode(os.path.realpath(path)), digest_size=8).digest()
    return SYNTHETIC_BIT | (int.from_bytes(digest, "little") & (SYNTHETIC_BIT - 1))


def state_path(dev: int, run_dir: Path = RUN_DIR) -> Path:
    return Path(run_dir) / f"state-dev{dev}.json"


class Registry:
    def __init__(
        self,
        module: ModuleBackend,
        state_file: Path | None,
        cgroup_root: Path = CGROUP_ROOT,
        *,
        readonly: bool = False,
    ) -> None:
        self.module = module
        self.state_file = state_file
        self.readonly = readonly  # azctl without a daemon: read names, never write the file
        self.cgroup_factory: Callable[[str, Path], Cgroup] = Cgroup  # tests inject fakes
        self.cgroup_root = Path(cgroup_root)
        self._lock = threading.RLock()
        self.sandboxes: dict[str, Sandbox] = {}
        self.templates: dict[str, Template] = {}
        self.removed: set[int] = set()

    # -- lookups ----------------------------------------------------------------------------

    def sandbox(self, name: str) -> Sandbox:
        with self._lock:
            sb = self.sandboxes.get(name)
        if sb is None:
            raise errors.UnknownSandbox(f"unknown sandbox {name!r}")
        return sb

    def template(self, name: str) -> Template:
        with self._lock:
            t = self.templates.get(name)
        if t is None:
            raise errors.UnknownTemplate(f"unknown template {name!r}")
        return t

    def by_id(self) -> dict[int, str]:
        with self._lock:
            out = {s.cgroup_id: s.name for s in self.sandboxes.values()}
            out.update({t.cgroup_id: t.name for t in self.templates.values()})
            return out

    def cgroup(self, sb: Sandbox) -> Cgroup | None:
        return self.cgroup_factory(sb.cgroup_path, self.cgroup_root) if sb.cgroup_path else None

    def list_sandboxes(self) -> list[Sandbox]:
        with self._lock:
            return sorted(self.sandboxes.values(), key=lambda s: s.name)

    def list_templates(self) -> list[Template]:
        with self._lock:
            return sorted(self.templates.values(), key=lambda t: t.name)

    # -- changes ----------------------------------------------------------------------------

    def _free_name(self, name: str) -> None:
        check_name(name)
        if name in self.sandboxes or name in self.templates:
            raise errors.AlreadyExists(f"{name!r} is already registered")

    def add_sandbox(
        self, name: str, cgroup_path: str, group: int, template: str | None = None
    ) -> Sandbox:
        path = normalize(cgroup_path)
        with self._lock:
            self._free_name(name)
            if template is not None:
                t = self.template(template)
                if t.group != group:
                    raise errors.InvalidValue(
                        f"sandbox {name!r} in trust group {group} cannot use template "
                        f"{template!r} of trust group {t.group}"
                    )
            cid = self.module.sandbox_add(group, cgroup_path=path)
            self.removed.discard(cid)
            sb = Sandbox(name, cid, group, path, template)
            self.sandboxes[name] = sb
            self.save()
        log.info("sandbox %s: cgroup %s id %d group %d", name, path, cid, group)
        return sb

    def map_sandbox(self, name: str, pid: int, file: str) -> tuple[Sandbox, FileMapping]:
        """Tell the module where sandbox NAME's process ``pid`` maps snapshot ``file``
        privately (SANDBOX_MAP), so that its edited pages find their template bases."""
        sb = self.sandbox(name)
        m = find_mapping(pid, file)
        self.module.sandbox_map(sb.cgroup_id, m.start, m.pages, m.pgoff)
        log.info("sandbox %s: %s mapped at page %#x (%d pages from page %d)", name, file,
                 m.start, m.pages, m.pgoff)
        return sb, m

    def remove_sandbox(self, name: str) -> Sandbox:
        with self._lock:
            sb = self.sandbox(name)
            try:
                self.module.sandbox_del(sb.cgroup_id)
            except errors.UnknownSandbox:
                log.info("sandbox %s: already gone from the module", name)
            self.removed.add(sb.cgroup_id)
            del self.sandboxes[name]
            self.save()
        return sb

    def add_template(
        self,
        name: str,
        group: int,
        cgroup_path: str | None = None,
        source_file: str | None = None,
    ) -> Template:
        if (cgroup_path is None) == (source_file is None):
            raise errors.InvalidValue("a template comes from a cgroup or from a snapshot file")
        with self._lock:
            self._free_name(name)
            if cgroup_path is not None:
                path = normalize(cgroup_path)
                cid = self.module.template_add(group, cgroup_path=path)
                t = Template(name, cid, group, cgroup_path=path)
            else:
                assert source_file is not None
                src = os.path.realpath(source_file)
                cid = self.module.template_add(group, cgroup_id=synthetic_id(src))
                t = Template(name, cid, group, source_file=src)
            self.removed.discard(cid)
            self.templates[name] = t
            self.save()
        return t

    def remove_template(self, name: str) -> Template:
        with self._lock:
            t = self.template(name)
            users = [s.name for s in self.sandboxes.values() if s.template == name]
            try:
                self.module.template_del(t.cgroup_id)
            except errors.UnknownSandbox:
                log.info("template %s: already gone from the module", name)
            self.removed.add(t.cgroup_id)
            del self.templates[name]
            for u in users:
                self.sandboxes[u].template = None
            self.save()
        return t

    def note_loaded(self, name: str, pages: int) -> None:
        with self._lock:
            self.template(name).pages_loaded = pages
            self.save()

    def load_template(
        self, name: str, group: int, source_file: str, batch_pages: int = MAX_LOAD_PAGES
    ) -> tuple[Template, snapshot.LoadResult]:
        """Register template NAME from a memory snapshot file and load its non-zero pages as
        bases (TEMPLATE_LOAD, streamed in batches).  On any failure the template is removed
        again: a half-loaded template is never left registered."""
        snapshot.check_file(source_file)  # refuse before registering anything
        t = self.add_template(name, group, source_file=source_file)
        assert t.source_file is not None

        def load_batch(index: int, pages: bytes) -> None:
            self.module.template_load(t.cgroup_id, index, pages)

        try:
            res = snapshot.load(t.source_file, load_batch, batch_pages=batch_pages)
        except BaseException:
            with contextlib.suppress(errors.AzswapError):
                self.remove_template(name)
            raise
        self.note_loaded(name, res.pages_loaded)
        return self.template(name), res

    # -- persistence and recovery -------------------------------------------------------------

    def save(self) -> None:
        if self.state_file is None or self.readonly:
            return
        data = {
            "version": 1,
            "sandboxes": [s.to_dict() for s in self.sandboxes.values()],
            "templates": [t.to_dict() for t in self.templates.values()],
            "removed": sorted(self.removed),
        }
        self.state_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, self.state_file)

    def _load_file(self) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
        sbs, tps, _ = self._load_file_all()
        return sbs, tps

    def _load_file_all(
        self,
    ) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]], set[int]]:
        if self.state_file is None or not self.state_file.exists():
            return {}, {}, set()
        try:
            data = json.loads(self.state_file.read_text())
            sbs = {int(d["cgroup_id"]): d for d in data.get("sandboxes", [])}
            tps = {int(d["cgroup_id"]): d for d in data.get("templates", [])}
            removed = {int(i) for i in data.get("removed", [])}
            return sbs, tps, removed
        except (ValueError, KeyError, TypeError, OSError) as e:
            log.warning("state file %s unreadable (%s): names will be rebuilt", self.state_file, e)
            return {}, {}, set()

    def recover(self) -> tuple[int, int]:
        """Rebuild from the module's owners and the state file; returns (sandboxes, templates)."""
        owners = [o for o in self.module.stats() if o.cgroup_id != 0]
        saved_sb, saved_t, removed = self._load_file_all()
        with self._lock:
            self.sandboxes.clear()
            self.templates.clear()
            listed = {o.cgroup_id for o in owners}
            # removed but still holding pages: listed, not registered (see module doc)
            self.removed = (removed & listed) | {o.cgroup_id for o in owners if not o.registered}
            for o in owners:
                if o.cgroup_id in self.removed:
                    continue
                self._adopt(o.cgroup_id, o.group, o.is_template, saved_sb, saved_t)
            # template links only where the template still exists
            for sb in self.sandboxes.values():
                if sb.template is not None and sb.template not in self.templates:
                    sb.template = None
            self.save()
            return len(self.sandboxes), len(self.templates)

    def _unique(self, name: str) -> str:
        base, n = name, 1
        while name in self.sandboxes or name in self.templates or not NAME_RE.match(name):
            n += 1
            name = f"{base}-{n}" if NAME_RE.match(f"{base}-{n}") else f"owner-{n}"
        return name

    def _adopt(
        self,
        cid: int,
        group: int,
        is_template: bool,
        saved_sb: dict[int, dict[str, Any]],
        saved_t: dict[int, dict[str, Any]],
    ) -> None:
        saved = (saved_t if is_template else saved_sb).get(cid, {})
        path = saved.get("cgroup_path")
        if path is None and not cid & SYNTHETIC_BIT:
            path = find_by_id(cid, self.cgroup_root)
        name = saved.get("name") or (path.rstrip("/").rsplit("/", 1)[-1] if path else f"cg{cid}")
        name = self._unique(name)
        if is_template:
            self.templates[name] = Template(
                name,
                cid,
                group,
                cgroup_path=path,
                source_file=saved.get("source_file"),
                pages_loaded=int(saved.get("pages_loaded", 0)),
            )
        else:
            self.sandboxes[name] = Sandbox(name, cid, group, path, saved.get("template"))

    def reconcile(self) -> dict[str, list[str]]:
        """Re-apply what the module lost behind our back (device reset, module reload).

        Sandboxes and cgroup templates the module no longer lists as registered are registered
        again from their cgroup path (their cgroup id is looked up anew); those whose cgroup is
        gone are dropped.  Snapshot-file templates lost their bases with the store: dropped, to
        be loaded again (``azctl template add --from-file``).  Returns the names per outcome.
        Raises the module's error (e.g. device not initialised) and changes nothing then.
        """
        out: dict[str, list[str]] = {"reregistered": [], "dropped": []}
        with self._lock:
            live = {o.cgroup_id for o in self.module.stats() if o.registered}
            lost = 0
            # templates first: sandboxes keep their template link only if it came back
            kinds = ((self.templates, self.module.template_add, "template"),
                     (self.sandboxes, self.module.sandbox_add, "sandbox"))
            for table, add, what in kinds:
                for o in [o for o in table.values() if o.cgroup_id not in live]:
                    lost += 1
                    if isinstance(o, Sandbox) and o.template not in self.templates:
                        o.template = None
                    try:
                        if o.cgroup_path is None:  # a snapshot file's bases went with the store
                            raise errors.InvalidValue("no cgroup to register again")
                        o.cgroup_id = add(o.group, cgroup_path=o.cgroup_path)
                        out["reregistered"].append(o.name)
                    except errors.AzswapError as e:
                        log.warning("%s %s lost by the module, dropped: %s", what, o.name, e)
                        del table[o.name]
                        out["dropped"].append(o.name)
            if lost:
                self.save()
        for name in out["reregistered"]:
            log.info("%s: registered again (the module had lost it)", name)
        return out

    def on_event(self, ev: Event) -> str | None:
        """Follow changes made behind our back (another netlink client); returns a name touched."""
        with self._lock:
            known = self.by_id()
            if ev.cmd in (Cmd.SANDBOX_ADD, Cmd.TEMPLATE_ADD) and ev.cgroup_id not in known:
                self.removed.discard(ev.cgroup_id)
                self._adopt(
                    ev.cgroup_id, ev.group or 0, ev.cmd == Cmd.TEMPLATE_ADD, *self._load_file()
                )
                self.save()
                return self.by_id().get(ev.cgroup_id)
            if ev.cmd in (Cmd.SANDBOX_DEL, Cmd.TEMPLATE_DEL) and ev.cgroup_id in known:
                name = known[ev.cgroup_id]
                self.removed.add(ev.cgroup_id)
                self.sandboxes.pop(name, None)
                self.templates.pop(name, None)
                self.save()
                return name
        return None


def remove_state(state_file: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_file.unlink()
