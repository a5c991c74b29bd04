"""errno + extended ack -> exceptions, and back through protocol codes."""

from __future__ import annotations

import errno

import pytest

from controlplane import errors as E


@pytest.mark.parametrize(
    ("code", "cmd", "cls"),
    [
        (errno.EPERM, "SANDBOX_ADD", E.PermissionDenied),
        (errno.ENOENT, "SANDBOX_ADD", E.UnknownCgroup),
        (errno.ENOENT, "SANDBOX_DEL", E.UnknownSandbox),
        (errno.ENOENT, "TEMPLATE_LOAD", E.UnknownTemplate),
        (errno.ENOENT, "PHASE_SET", E.UnknownSandbox),
        (errno.ENODEV, "STATS_GET", E.UnknownDevice),
        (errno.EINVAL, "POLICY_SET", E.InvalidValue),
        (errno.EBUSY, "POLICY_SET", E.Busy),
        (errno.EEXIST, "SANDBOX_ADD", E.AlreadyExists),
        (errno.ENOMEM, "TEMPLATE_LOAD", E.NoSpace),
        (errno.EIO, "STATS_GET", E.AzswapError),
    ],
)
def test_from_netlink_picks_the_class(code: int, cmd: str, cls: type) -> None:
    e = E.from_netlink(-code, None, cmd)
    assert type(e) is cls and e.errno == code


def test_extack_is_the_reason() -> None:
    e = E.from_netlink(errno.EINVAL, "AZSWAP_A_GROUP: trust group 0 is invalid", "SANDBOX_ADD", "x")
    assert str(e) == "sandbox_add x: AZSWAP_A_GROUP: trust group 0 is invalid"
    assert e.extack and e.exit_code == 7


def test_exit_codes_are_distinct_per_failure_kind() -> None:
    kinds = [
        E.ModuleNotLoaded,
        E.PermissionDenied,
        E.DaemonNotRunning,
        E.UnknownSandbox,
        E.InvalidValue,
        E.Busy,
        E.AlreadyExists,
        E.NoSpace,
    ]
    codes = [k.exit_code for k in kinds]
    assert len(set(codes)) == len(codes) and 0 not in codes and 2 not in codes
    assert all(c in E.EXIT_CODES for c in codes)


@pytest.mark.parametrize("cls", [E.UnknownTemplate, E.Busy, E.ModuleNotLoaded, E.PermissionDenied])
def test_codes_round_trip(cls: type[E.AzswapError]) -> None:
    e = E.from_code(cls.code, "m")
    assert type(e) is cls and str(e) == "m"
    assert type(E.from_code("no_such_code", "m")) is E.AzswapError


def test_from_oserror() -> None:
    assert type(E.from_oserror(PermissionError(errno.EACCES, "x"), "f")) is E.PermissionDenied
    assert type(E.from_oserror(OSError(errno.EBUSY, "x"), "f")) is E.Busy
