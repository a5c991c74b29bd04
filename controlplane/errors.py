"""One place that turns failures into clear exceptions.

Every layer of the control plane (netlink, sysfs, cgroupfs, the daemon socket) raises a subclass of
:class:`AzswapError`.  Each class carries

* ``code``: a short stable string used on the daemon's JSON-lines protocol, and
* ``exit_code``: the distinct exit status ``azctl`` returns for it (listed in ``azctl --help``).

:func:`from_netlink` maps an errno plus the kernel's extended-ack message to one of them, using the
command that failed to pick the right noun (ENOENT on SANDBOX_DEL is an unknown sandbox, ENOENT on
TEMPLATE_LOAD an unknown template).  :func:`from_code` rebuilds the exception on the client side of
the daemon socket.
"""

from __future__ import annotations

import errno as E


class AzswapError(Exception):
    """Base class: a one-line, human-readable reason in ``str(exc)``."""

    code = "error"
    exit_code = 1

    def __init__(self, message: str, *, errno: int | None = None, extack: str | None = None):
        super().__init__(message)
        self.errno = errno
        self.extack = extack

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"code": self.code, "message": str(self)}
        if self.errno is not None:
            d["errno"] = self.errno
        return d


class ModuleNotLoaded(AzswapError):
    code = "module_not_loaded"
    exit_code = 3


class PermissionDenied(AzswapError):
    code = "permission_denied"
    exit_code = 4


NotRoot = PermissionDenied


class DaemonNotRunning(AzswapError):
    code = "daemon_not_running"
    exit_code = 5


class UnknownSandbox(AzswapError):
    code = "unknown_sandbox"
    exit_code = 6


class UnknownTemplate(UnknownSandbox):
    code = "unknown_template"


class UnknownCgroup(UnknownSandbox):
    code = "unknown_cgroup"


class UnknownDevice(UnknownSandbox):
    code = "unknown_device"


class InvalidValue(AzswapError):
    code = "invalid_value"
    exit_code = 7


class Busy(AzswapError):
    code = "busy"
    exit_code = 8


class AlreadyExists(AzswapError):
    code = "already_exists"
    exit_code = 9


class NoSpace(AzswapError):
    code = "no_space"
    exit_code = 10


class ProtocolError(AzswapError):
    """The daemon's reply or the module's message was not what the protocol says."""

    code = "protocol_error"
    exit_code = 1


EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "other error",
    2: "usage error (bad option or argument)",
    ModuleNotLoaded.exit_code: "azswap module not loaded",
    PermissionDenied.exit_code: "permission denied (not root / no CAP_NET_ADMIN)",
    DaemonNotRunning.exit_code: "daemon not running",
    UnknownSandbox.exit_code: "unknown sandbox, template, cgroup or device",
    InvalidValue.exit_code: "invalid value",
    Busy.exit_code: "busy (e.g. codec change while pages are stored)",
    AlreadyExists.exit_code: "already registered",
    NoSpace.exit_code: "out of memory/space in the module",
}

_BY_CODE: dict[str, type[AzswapError]] = {
    cls.code: cls
    for cls in (
        AzswapError,
        ModuleNotLoaded,
        PermissionDenied,
        DaemonNotRunning,
        UnknownSandbox,
        UnknownTemplate,
        UnknownCgroup,
        UnknownDevice,
        InvalidValue,
        Busy,
        AlreadyExists,
        NoSpace,
        ProtocolError,
    )
}


def from_code(code: str, message: str) -> AzswapError:
    """Rebuild an exception from its protocol code (unknown codes give AzswapError)."""
    return _BY_CODE.get(code, AzswapError)(message)


# What ENOENT means for each netlink command (by command name).
_ENOENT_NOUN: dict[str, type[AzswapError]] = {
    "SANDBOX_ADD": UnknownCgroup,
    "TEMPLATE_ADD": UnknownCgroup,
    "SANDBOX_DEL": UnknownSandbox,
    "TEMPLATE_DEL": UnknownTemplate,
    "TEMPLATE_LOAD": UnknownTemplate,
    "STATS_GET": UnknownSandbox,
    "PHASE_SET": UnknownSandbox,
    "SANDBOX_MAP": UnknownSandbox,
}


def from_netlink(err: int, extack: str | None, command: str, what: str = "") -> AzswapError:
    """Map a negative-or-positive errno and the extended ack of ``command`` to an exception."""
    err = abs(err)
    reason = extack or E.errorcode.get(err, str(err))
    subject = f"{command.lower()}{' ' + what if what else ''}"
    msg = f"{subject}: {reason}"
    cls: type[AzswapError]
    if err in (E.EPERM, E.EACCES):
        cls = PermissionDenied
        msg = f"{subject}: permission denied (needs root / CAP_NET_ADMIN)"
    elif err == E.ENOENT:
        cls = _ENOENT_NOUN.get(command, UnknownSandbox)
        if not extack:
            noun: dict[type[AzswapError], str] = {
                UnknownCgroup: "no such cgroup",
                UnknownTemplate: "unknown template",
            }
            msg = f"{subject}: {noun.get(cls, 'unknown sandbox')}"
    elif err == E.ENODEV:
        cls = UnknownDevice
    elif err in (E.EINVAL, E.ERANGE, E.EOPNOTSUPP, E.E2BIG):
        cls = InvalidValue
    elif err == E.EBUSY:
        cls = Busy
    elif err == E.EEXIST:
        cls = AlreadyExists
        if not extack:
            msg = f"{subject}: already registered"
    elif err in (E.ENOMEM, E.ENOSPC):
        cls = NoSpace
    else:
        cls = AzswapError
    return cls(msg, errno=err, extack=extack)


def from_oserror(exc: OSError, what: str) -> AzswapError:
    """Map an OSError from a file access (sysfs, cgroupfs, the daemon socket path)."""
    err = exc.errno or 0
    if err in (E.EPERM, E.EACCES):
        return PermissionDenied(f"{what}: permission denied (run as root)", errno=err)
    if err == E.ENOENT:
        return UnknownCgroup(f"{what}: no such file", errno=err)
    if err in (E.EINVAL, E.ERANGE):
        return InvalidValue(f"{what}: invalid value", errno=err)
    if err == E.EBUSY:
        return Busy(f"{what}: busy", errno=err)
    return AzswapError(f"{what}: {exc.strerror or exc}", errno=err)
