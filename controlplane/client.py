"""Client of the azswap daemon's socket, for orchestrators (protocol: docs/daemon-protocol.md).

    from controlplane.client import DaemonClient

    with DaemonClient() as az:
        az.register("sb1", cgroup="/sandboxes/sb1", group=1)
        az.phase("sb1", "llm-wait")      # compress while the model thinks
        ...
        az.phase("sb1", "tool")          # stop compressing (the tool faults its pages in)
        print(az.stats("sb1")["ratio"])
        az.hint("sb1", "llm-wait")       # the same, without waiting for the answer

A request sent without waiting (``send()``, ``hint()``) is answered only if it fails; such an
answer is read by the next request on the same client and kept in ``async_errors``.

    for event in DaemonClient().subscribe():   # a dedicated connection
        print(event)

Errors are the exceptions of :mod:`controlplane.errors` (DaemonNotRunning, PermissionDenied,
UnknownSandbox, InvalidValue...), rebuilt from the daemon's error replies.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from controlplane import errors

DEFAULT_SOCKET = Path(os.environ.get("AZSWAP_SOCKET", "/run/azswap/azswap.sock"))


class DaemonClient:
    def __init__(self, socket_path: str | os.PathLike[str] | None = None, timeout: float = 30.0):
        self.path = Path(socket_path) if socket_path is not None else DEFAULT_SOCKET
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._rfile: Any = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        # errors of requests sent without waiting (send()), as the daemon reported them
        self.async_errors: list[dict[str, Any]] = []

    # -- connection -------------------------------------------------------------------------

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            raise errors.DaemonNotRunning(
                f"azswap daemon not running (no listener on {self.path}): start 'azctl daemon'"
            ) from None
        except PermissionError:
            s.close()
            raise errors.PermissionDenied(
                f"{self.path}: permission denied (the daemon serves root only)"
            ) from None
        except OSError as e:
            s.close()
            raise errors.DaemonNotRunning(f"cannot reach the daemon at {self.path}: {e}") from None
        return s

    def _ensure(self) -> None:
        if self._sock is None:
            self._sock = self._connect()
            self._rfile = self._sock.makefile("rb")

    def close(self) -> None:
        if self._rfile is not None:
            self._rfile.close()
            self._rfile = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _raise(error: dict[str, Any]) -> None:
        code = str(error.get("code", "error"))
        message = str(error.get("message", code))
        raise errors.from_code(code, message)

    def request(self, op: str, timeout: float | None = -1.0, **fields: Any) -> Any:
        """Send one request and return its ``result`` (or raise its error).  ``timeout``
        overrides the client's for this request (None: wait as long as it takes)."""
        _check_fields(fields)
        with self._lock:
            self._ensure()
            assert self._sock is not None
            wait = self.timeout if timeout == -1.0 else timeout
            self._sock.settimeout(wait)
            rid = next(self._ids)
            line = json.dumps({"id": rid, "op": op, **fields}, separators=(",", ":")) + "\n"
            try:
                self._sock.sendall(line.encode())
                while True:
                    raw = self._rfile.readline()
                    if not raw:
                        self.close()
                        raise errors.DaemonNotRunning("the daemon closed the connection")
                    reply = json.loads(raw)
                    if "event" in reply and "ok" not in reply:
                        continue  # pushed event on a subscribed connection
                    if reply.get("id") != rid and reply.get("id") is not None:
                        # the failure of a request sent without waiting
                        self._keep_async_error(reply)
                        continue
                    break
            except TimeoutError:
                self.close()
                raise errors.AzswapError(f"no reply from the daemon within {wait}s") from None
            except (BrokenPipeError, ConnectionResetError):
                # the daemon may have refused us (one error line, then close) before we wrote
                reply = self._pending_reply()
                self.close()
                if reply is None:
                    raise errors.DaemonNotRunning("the daemon closed the connection") from None
            except ValueError as e:
                self.close()
                raise errors.ProtocolError(f"bad reply from the daemon: {e}") from None
        if not reply.get("ok"):
            if reply.get("error", {}).get("code") == "permission_denied":
                self.close()
            self._raise(reply.get("error", {}))
        return reply.get("result")

    def _pending_reply(self) -> dict[str, Any] | None:
        try:
            raw = self._rfile.readline() if self._rfile is not None else b""
            return json.loads(raw) if raw else None
        except (OSError, ValueError):
            return None

    # -- operations -----------------------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        return self.request("ping")

    def register(
        self, name: str, cgroup: str, group: int, template: str | None = None
    ) -> dict[str, Any]:
        return self.request("register", name=name, cgroup=cgroup, group=group, template=template)

    def map(self, name: str, pid: int, file: str) -> dict[str, Any]:
        """Sandbox NAME's process ``pid`` (its VMM) maps snapshot ``file`` privately: the
        daemon finds the range in /proc/PID/maps and tells the module (SANDBOX_MAP)."""
        return self.request("map", name=name, pid=pid, file=file)

    def unregister(self, name: str) -> dict[str, Any]:
        return self.request("unregister", name=name)

    def send(self, op: str, **fields: Any) -> None:
        """Send one request without waiting for its answer (``"reply": false``): the daemon
        answers only if it fails, and that answer lands in ``async_errors`` when the next
        request() on this client reads its own."""
        _check_fields(fields)
        with self._lock:
            self._ensure()
            assert self._sock is not None
            line = json.dumps({"id": next(self._ids), "op": op, "reply": False, **fields},
                              separators=(",", ":")) + "\n"
            try:
                self._sock.settimeout(self.timeout)
                self._sock.sendall(line.encode())
                self._collect_async_errors()
            except OSError as e:
                self.close()
                raise errors.DaemonNotRunning(f"cannot send to the daemon: {e}") from None

    def _collect_async_errors(self) -> None:
        """Read the error lines already waiting (the daemon writes whole lines), so that a
        client that only sends never fills its socket with them."""
        assert self._sock is not None
        while select.select([self._sock], [], [], 0)[0]:
            raw = self._rfile.readline()
            if not raw:
                return
            try:
                reply = json.loads(raw)
            except ValueError:
                continue
            if isinstance(reply, dict) and reply.get("ok") is False:
                self._keep_async_error(reply)

    def _keep_async_error(self, reply: dict[str, Any]) -> None:
        """Record the failure of a request that was sent without waiting for its answer."""
        self.async_errors.append({"id": reply.get("id"), **(reply.get("error") or {})})

    def phase(self, name: str, phase: str) -> dict[str, Any]:
        """Tell the daemon the sandbox's phase (tool, llm-wait, idle, unknown); its answer says
        the phase in force and its generation."""
        return dict(self.request("phase", name=name, phase=phase))

    def hint(self, name: str, phase: str) -> None:
        """phase() without waiting for the answer: for an agent loop's hot path (a failure
        lands in ``async_errors``)."""
        self.send("phase", name=name, phase=phase)

    def ending(self, name: str) -> dict[str, Any]:
        """The sandbox's LLM wait ends soon (the model has begun to stream its tool call): a
        wait that kept its working set keeps it and (unless ``azctl daemon --no-prefetch``, or
        nothing of the working set was recorded yet: the sandbox's first announced wait) the
        daemon brings back what went, at once or paced to the sandbox's earlier streams (reply
        ``prefetch``: whether it does). Returns at once."""
        return dict(self.request("ending", name=name))

    def compress(self, name: str, wait: float = 0.0) -> dict[str, Any]:
        return self.request("compress", name=name, wait=wait)

    def prefetch(self, name: str) -> dict[str, Any]:
        return self.request("prefetch", name=name)

    def list(self) -> dict[str, Any]:
        return self.request("list")

    def stats(self, name: str | None = None) -> dict[str, Any]:
        return self.request("stats", name=name) if name else self.request("stats")

    def metrics(self) -> str:
        return str(self.request("metrics")["text"])

    def template_add(self, name: str, group: int, cgroup: str) -> dict[str, Any]:
        """Register a running template: the cgroup its pages are charged to."""
        return self.request("template_add", name=name, group=group, cgroup=cgroup)

    def template_load(
        self, name: str, group: int, file: str, batch: int | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Register template NAME from a memory snapshot file (a path the daemon can read) and
        load it as bases, in one operation; ``timeout`` (default: none) bounds the wait for the
        reply, which comes when the whole file is loaded."""
        fields: dict[str, Any] = {"name": name, "group": group, "file": file}
        if batch is not None:
            fields["batch"] = batch
        return self.request("template_load", timeout=timeout, **fields)

    def template_rm(self, name: str) -> dict[str, Any]:
        return self.request("template_rm", name=name)

    def policy_get(self) -> dict[str, Any]:
        return self.request("policy_get")

    def policy_set(self, **fields: int) -> dict[str, Any]:
        return self.request("policy_set", fields=fields)

    def subscribe(self, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Events from a dedicated connection, until the daemon goes away.  Subscribed when this
        returns (so nothing that happens afterwards is missed); ``timeout`` bounds each wait
        (TimeoutError)."""
        s = self._connect()
        s.settimeout(timeout)
        f = s.makefile("rb")
        try:
            s.sendall(b'{"id":0,"op":"subscribe"}\n')
            first = json.loads(f.readline() or b"{}")
            if not first.get("ok"):
                self._raise(first.get("error", {"code": "daemon_not_running"}))
        except BaseException:
            f.close()
            s.close()
            raise
        return self._events(s, f)

    @staticmethod
    def _events(s: socket.socket, f: Any) -> Iterator[dict[str, Any]]:
        try:
            for raw in f:
                msg = json.loads(raw)
                if "event" in msg:
                    yield msg
        finally:
            f.close()
            s.close()


def _check_fields(fields: dict[str, Any]) -> None:
    """The envelope's keys are the client's to set."""
    bad = sorted(set(fields) & {"id", "op", "reply"})
    if bad:
        raise ValueError(f"request fields {bad} are reserved")
