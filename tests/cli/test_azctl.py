"""azctl output and exit codes (CliRunner), including the real no-module host."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from azctl.env import Env

from controlplane import errors
from controlplane.netlink import MAX_LOAD_PAGES, PAGE_SIZE
from tests.fakes import WorldReadableCopy

from .conftest import World

REPO = Path(__file__).resolve().parents[2]
AZCTL = Path(sys.executable).parent / "azctl"
NO_MODULE = not Path("/sys/module/azswap").exists()


def one_error_line(res, code: int) -> str:
    assert res.exit_code == code, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("azctl: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


def test_help_lists_exit_codes_and_examples(world: World) -> None:
    out = world.run("--help").output
    assert "Exit codes:" in out and "Examples:" in out
    for code, what in errors.EXIT_CODES.items():
        assert f"{code:<3} {what}" in out
    assert "azctl phase sb1 llm-wait" in world.run("phase", "--help").output


def test_sandbox_lifecycle_through_the_daemon(world: World) -> None:
    r = world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1")
    assert r.exit_code == 0 and r.output.startswith("sandbox a: cgroup /sb/a id ")
    r = world.run("sandbox", "add", "b", "--cgroup", "/sb/b", "--group", "1", "--json")
    b = json.loads(r.output)
    assert b["name"] == "b" and b["cgroup_id"] in world.module.owners
    rows = json.loads(world.run("sandbox", "ls", "--json").output)
    assert [s["name"] for s in rows] == ["a", "b"]
    human = world.run("sandbox", "ls").output
    assert "a" in human and "/sb/b" in human
    assert world.run("sandbox", "rm", "a").output == "sandbox a removed\n"
    assert [s["name"] for s in json.loads(world.run("sandbox", "ls", "--json").output)] == ["b"]


def test_phase_and_compress(world: World) -> None:
    world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1")
    assert world.run("phase", "a", "tool").output == "a: tool\n"
    r = world.run("compress", "a", "--wait", "5")
    assert r.exit_code == 0 and "compressed, memory.current 8.0M -> 0B" in r.output
    r = world.run("prefetch", "a", "--json")
    assert json.loads(r.output)["result"]["prefetched_pages"] == 0
    world.run("phase", "a", "llm-wait")
    r = world.run("ending", "a")  # the daemon runs with prefetch=False: nothing comes back
    assert r.exit_code == 0 and r.output == "a: nothing to prefetch\n"
    assert world.run("ending", "nope").exit_code != 0


def test_status_json_agrees_with_the_module(world: World) -> None:
    world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1")
    world.run("sandbox", "add", "b", "--cgroup", "/sb/b", "--group", "1")
    ids = {n: world.daemon.registry.sandbox(n).cgroup_id for n in "ab"}
    world.module.store(ids["a"], 30, "tdelta", bytes_each=200)
    world.module.store(ids["b"], 10, "plain", bytes_each=1000)
    world.run("phase", "a", "llm-wait")
    d = json.loads(world.run("status", "--json").output)
    owners = {o.cgroup_id: o for o in world.module.stats()}
    for s in d["sandboxes"]:
        o = owners[s["cgroup_id"]]
        assert (s["pages"], s["stored_bytes"], s["kinds"]) == (o.pages, o.stored_bytes, o.kinds)
    assert d["totals"]["stored_bytes"] == sum(o.stored_bytes for o in owners.values())
    assert d["totals"]["pages"] == 40


def test_status_human(world: World) -> None:
    world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1")
    world.module.store(world.daemon.registry.sandbox("a").cgroup_id, 8, "dup", bytes_each=512)
    out = world.run("status").output
    for s in ("pool", "pages per representation", "sandboxes", "/sb/a", "8.00x", "dup"):
        assert s in out, out


def test_stats_variants(world: World) -> None:
    world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1")
    assert json.loads(world.run("stats", "a", "--json").output)["name"] == "a"
    assert "azswap_owner_pages{" in world.run("stats", "--prometheus").output
    one_error_line(world.run("stats", "nope"), 6)


def test_top_runs_one_frame(world: World) -> None:
    r = world.run("top", "-n", "1")
    assert r.exit_code == 0 and "pool" in r.output


def test_without_daemon_every_command_fails_with_one_line(offline: World) -> None:
    offline.module.sandbox_add(3, cgroup_path="/sb/a")
    for args in (["status"], ["stats", "--json"], ["sandbox", "ls"], ["template", "ls"],
                 ["policy", "get"], ["policy", "set", "dedup=0"]):
        line = one_error_line(offline.run(*args), 5)
        assert "daemon not running" in line and "--direct" in line, args
    assert offline.module.policy.dedup == 1  # nothing went to the module behind our back


def test_direct_reads_the_module(offline: World) -> None:
    offline.module.sandbox_add(3, cgroup_path="/sb/a")
    d = json.loads(offline.run("--direct", "status", "--json").output)
    assert d["daemon"] is False and [s["name"] for s in d["sandboxes"]] == ["a"]
    rows = json.loads(offline.run("--direct", "sandbox", "ls", "--json").output)
    assert [s["name"] for s in rows] == ["a"]
    p = json.loads(offline.run("--direct", "policy", "set", "sim_effort=9", "--json").output)
    assert p["sim_effort"] == 9 and offline.module.policy.sim_effort == 9
    assert json.loads(offline.run("--direct", "policy", "get", "--json").output) == p


def test_direct_refuses_what_only_the_daemon_does(world: World) -> None:
    for args in (["sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1"],
                 ["phase", "a", "tool"], ["compress", "a"], ["prefetch", "a"],
                 ["template", "add", "t", "--group", "1", "--cgroup", "/tpl/base"]):
        line = one_error_line(world.run("--direct", *args), 7)
        assert "needs the daemon" in line, args
    assert world.module.owners == {}


def test_daemon_not_running_exit_code(offline: World) -> None:
    line = one_error_line(
        offline.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1"), 5
    )
    assert "daemon not running" in line
    one_error_line(offline.run("phase", "a", "tool"), 5)


def test_unknown_sandbox_and_bad_values(world: World) -> None:
    assert "unknown sandbox 'zz'" in one_error_line(world.run("phase", "zz", "tool"), 6)
    one_error_line(world.run("sandbox", "rm", "zz"), 6)
    one_error_line(world.run("sandbox", "add", "a", "--cgroup", "/sb/none", "--group", "1"), 6)
    one_error_line(world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "0"), 7)
    one_error_line(world.run("sandbox", "add", "bad name", "--cgroup", "/sb/a", "--group", "1"), 7)
    world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1")
    one_error_line(world.run("sandbox", "add", "a", "--cgroup", "/sb/b", "--group", "1"), 9)
    r = world.run("phase", "a", "sleeping")
    assert r.exit_code == 2  # click's usage error


def test_policy_get_set_and_errors(world: World) -> None:
    p = json.loads(world.run("policy", "set", "sim_effort=12", "xdelta=off", "--json").output)
    assert p["sim_effort"] == 12 and p["xdelta"] == 0
    assert world.daemon.scheduler.config.manage_policy is False  # by hand: the scheduler defers
    assert "sim_effort" in world.run("policy", "get").output
    one_error_line(world.run("policy", "set", "codec=brotli"), 7)
    one_error_line(world.run("policy", "set", "level=99"), 7)
    one_error_line(world.run("policy", "set", "nonsense=1"), 7)
    world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1")
    world.module.store(world.daemon.registry.sandbox("a").cgroup_id, 1)
    # the codec changes live, pages stored or not (each stored object keeps its encoding)
    r = world.run("policy", "set", "codec=zstd", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["codec"] == "zstd"


def test_permission_denied_from_the_module(offline: World) -> None:
    offline.module.admin = False
    line = one_error_line(offline.run("--direct", "policy", "set", "dedup=0"), 4)
    assert "permission denied" in line


def test_debug_shows_the_traceback(offline: World) -> None:
    r = offline.run("--debug", "phase", "a", "tool")
    assert r.exit_code == 5 and "Traceback" in r.stderr


# -- templates from snapshot files ------------------------------------------------------


def _image(path: Path, pages: list[int]) -> Path:
    """pages[i] == 0 -> a zero page, else a page filled with that byte value pattern."""
    with open(path, "wb") as f:
        for v in pages:
            f.write(bytes(PAGE_SIZE) if v == 0 else bytes([v, 1, 2, 3]) * (PAGE_SIZE // 4))
    return path


def test_daemon_options_default_to_the_scheduler_config() -> None:
    from azctl.main import daemon

    from controlplane.scheduler import SchedulerConfig
    from controlplane.sysfs import parse_size

    c = SchedulerConfig()
    d = {p.name: p.default for p in daemon.params}
    assert (d["grace"], d["idle_grace"], d["dense_after"], d["cpu_budget"], d["interval"]) == (
        c.grace, c.idle_grace, c.dense_after, c.cpu_budget, c.interval)
    assert parse_size(d["chunk"]) == c.chunk_bytes


def _daemon_config(offline: World, monkeypatch: pytest.MonkeyPatch, *args: str):
    """Run ``azctl daemon ARGS`` up to the daemon's construction; returns (result, config)."""
    import azctl.main

    import controlplane.daemon

    seen: list[object] = []

    class Built:
        def __init__(self, cfg: object, module_factory: object = None) -> None:
            seen.append(cfg)

        def run(self) -> None:
            pass

    monkeypatch.setattr(controlplane.daemon, "Daemon", Built)
    monkeypatch.setattr(azctl.main, "need_root", lambda what: None)
    r = offline.run("daemon", *args)
    return r, (seen[0] if seen else None)


def test_daemon_flags_reach_its_config(offline: World, monkeypatch: pytest.MonkeyPatch) -> None:
    r, cfg = _daemon_config(offline, monkeypatch)
    assert r.exit_code == 0, r.output
    # the shipped product: announced waits prefetched from the recorded resident set
    assert cfg.prefetch and cfg.predict and not cfg.hint_prefetch
    assert cfg.scheduler.age_kept and cfg.plan.keep_hot
    assert cfg.prefetch_from == "resident" and not cfg.plan.predict_unannounced
    assert cfg.plan.deep_after is None
    r, cfg = _daemon_config(offline, monkeypatch, "--predict-unannounced")
    assert r.exit_code == 0, r.output
    assert cfg.plan.predict_unannounced
    r, cfg = _daemon_config(offline, monkeypatch, "--no-prefetch")
    assert r.exit_code == 0, r.output
    assert not cfg.prefetch
    r, cfg = _daemon_config(offline, monkeypatch, "--prefetch-from", "faults", "--hint-prefetch",
                            "--no-predict", "--no-age-kept", "--no-keep-hot",
                            "--deep-min-remaining", "2.5", "--deep-after", "10")
    assert r.exit_code == 0, r.output
    assert cfg.prefetch and not cfg.predict and cfg.hint_prefetch
    assert cfg.prefetch_from == "faults"
    assert not cfg.scheduler.age_kept and not cfg.plan.keep_hot
    assert cfg.plan.deep_min_remaining == 2.5 and cfg.plan.deep_after == 10.0
    r, cfg = _daemon_config(offline, monkeypatch, "--prefetch", "--prefetch-from", "resident")
    assert r.exit_code == 0, r.output
    assert cfg.prefetch_from == "resident"
    assert cfg.plan.stream_quantile == 0.2
    r, cfg = _daemon_config(offline, monkeypatch, "--stream-quantile", "0")
    assert r.exit_code == 0, r.output
    assert cfg.plan.stream_quantile == 0.0


@pytest.mark.parametrize("value", ["1", "-0.1", "x"])
def test_daemon_refuses_a_stream_quantile_outside_zero_to_one(
    offline: World, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    r, cfg = _daemon_config(offline, monkeypatch, "--stream-quantile", value)
    assert r.exit_code == 2 and cfg is None and "--stream-quantile" in r.output


@pytest.mark.parametrize("flags", [["--hint-prefetch"], ["--no-predict"],
                                   ["--prefetch-from", "resident"],
                                   ["--prefetch-from", "faults"],
                                   ["--predict-unannounced"], ["--stream-quantile", "0.5"]])
def test_daemon_refuses_prefetch_options_without_the_prefetcher(
    offline: World, monkeypatch: pytest.MonkeyPatch, flags: list[str]
) -> None:
    r, cfg = _daemon_config(offline, monkeypatch, "--no-prefetch", *flags)
    assert r.exit_code == 2 and cfg is None
    assert f"{flags[0]} needs the prefetcher" in r.output


@pytest.mark.parametrize("flag", ["--no-predict", "--no-keep-hot"])
def test_daemon_refuses_a_resident_set_it_could_not_learn(
    offline: World, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    for args in ([flag], ["--prefetch-from", "resident", flag], ["--hint-prefetch", flag],
                 ["--stream-quantile", "0.3", flag], ["--prefetch", flag]):
        r, cfg = _daemon_config(offline, monkeypatch, *args)
        assert r.exit_code == 2 and cfg is None and flag in r.output
        advice = r.output.split("use ")[-1].replace("\n", " ").split()
        alternatives = " ".join(advice).split(" or ")
        assert "--prefetch-from faults" in alternatives
        # --no-prefetch only where no option asked for the prefetcher
        assert ("--no-prefetch" in alternatives) == (flag == "--no-keep-hot" and args == [flag])
        # every suggestion is accepted: each one, with the resident source dropped from the
        # command line (--prefetch-from faults replaces it)
        for alt in alternatives:
            fixed = [a for a in args if a not in ("--prefetch-from", "resident")]
            r, cfg = _daemon_config(offline, monkeypatch, *alt.split(), *fixed)
            assert r.exit_code == 0, (args, alt, r.output)


def test_daemon_refuses_predict_unannounced_with_no_predict(
    offline: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    for source in (["--prefetch-from", "faults"], []):
        r, cfg = _daemon_config(offline, monkeypatch, *source, "--no-predict",
                                "--predict-unannounced")
        assert r.exit_code == 2 and cfg is None
        assert "--predict-unannounced with --no-predict" in r.output


def test_template_from_file_streams_in_bounded_batches(world: World, tmp_path: Path) -> None:
    layout = [1] * 20 + [0] * 5 + [2] * 3 + [0] * 2 + [3]
    img = _image(tmp_path / "img", layout)
    calls: list[tuple[int, int]] = []
    orig = world.module.template_load

    def spy(cid: int, index: int, pages: bytes) -> None:
        calls.append((index, len(pages) // PAGE_SIZE))
        orig(cid, index, pages)

    world.module.template_load = spy  # type: ignore[method-assign]
    r = world.run("template", "add", "vm", "--group", "2", "--from-file", str(img), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["pages_total"] == 31 and out["pages_zero"] == 7 and out["pages_loaded"] == 24
    assert all(1 <= n <= MAX_LOAD_PAGES for _, n in calls)
    loaded = world.module.loaded[out["cgroup_id"]]
    assert sorted(loaded) == [i for i, v in enumerate(layout) if v]
    assert loaded[20 + 5] == img.read_bytes()[25 * PAGE_SIZE : 26 * PAGE_SIZE]
    rows = json.loads(world.run("template", "ls", "--json").output)
    assert rows[0]["source_file"] == str(img) and rows[0]["pages_loaded"] == 24


def test_template_file_not_page_aligned_is_refused(world: World, tmp_path: Path) -> None:
    img = tmp_path / "img"
    img.write_bytes(b"x" * (PAGE_SIZE + 1))
    line = one_error_line(
        world.run("template", "add", "vm", "--group", "2", "--from-file", str(img)), 7
    )
    assert "multiple of the page size" in line
    assert world.module.owners == {}  # nothing registered
    one_error_line(
        world.run("template", "add", "vm", "--group", "2", "--from-file", "/nonexistent"), 6
    )


def test_template_file_changing_while_loading_is_refused(world: World, tmp_path: Path) -> None:
    img = _image(tmp_path / "img", [1] * 40)
    orig = world.module.template_load

    def grow(cid: int, index: int, pages: bytes) -> None:
        orig(cid, index, pages)
        if index == 0:
            with open(img, "ab") as f:
                f.write(bytes(PAGE_SIZE))

    world.module.template_load = grow  # type: ignore[method-assign]
    line = one_error_line(
        world.run("template", "add", "vm", "--group", "2", "--from-file", str(img)), 7
    )
    assert "changed while loading" in line
    assert world.module.owners == {}  # the half-loaded template was removed
    assert json.loads(world.run("template", "ls", "--json").output) == []


def test_template_from_cgroup_and_rm(world: World) -> None:
    r = world.run("template", "add", "base", "--group", "1", "--cgroup", "/tpl/base")
    assert r.exit_code == 0 and "template base: cgroup /tpl/base" in r.output
    r = world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1", "--template", "base")
    assert r.exit_code == 0
    assert world.run("template", "rm", "base").exit_code == 0
    r = world.run("template", "add", "x", "--group", "1")
    assert r.exit_code == 2


# -- the real host: no module loaded -------------------------------------------------------


@pytest.mark.skipif(not NO_MODULE, reason="azswap is loaded on this machine")
@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["policy", "get"],
        ["stats", "--json"],
        ["sandbox", "ls"],
        ["policy", "set", "dedup=1"],
    ],
)
def test_module_not_loaded(tmp_path: Path, args: list[str]) -> None:
    from azctl.main import cli
    from click.testing import CliRunner

    env = Env(socket=tmp_path / "none.sock", sys_block=tmp_path, state_dir=tmp_path)
    res = CliRunner().invoke(cli, ["--direct", *args], obj=env)
    line = one_error_line(res, 3)
    assert "module not loaded" in line


@pytest.mark.skipif(not NO_MODULE, reason="azswap is loaded on this machine")
def test_module_not_loaded_real_binary(tmp_path: Path) -> None:
    p = subprocess.run(
        [str(AZCTL), "--direct", "--socket", str(tmp_path / "none.sock"), "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 3 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "module not loaded" in p.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root + setpriv")
def test_daemon_needs_root(tmp_path: Path) -> None:
    with WorldReadableCopy(REPO) as cp:  # the checkout may sit in a 0700 directory
        p = subprocess.run(
            [
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                *cp.azctl("--socket", "/tmp/azswap-test-never.sock", "daemon"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={**os.environ, **cp.env},
        )
    assert p.returncode == 4 and "needs root" in p.stderr and "Traceback" not in p.stderr


def test_shell_completion_script() -> None:
    p = subprocess.run(
        [str(AZCTL)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "_AZCTL_COMPLETE": "bash_source"},
    )
    assert p.returncode == 0 and "_azctl_completion" in p.stdout
    p = subprocess.run(
        [str(AZCTL)],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "_AZCTL_COMPLETE": "bash_complete",
            "COMP_WORDS": "azctl sand",
            "COMP_CWORD": "1",
        },
    )
    assert "sandbox" in p.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root + setpriv")
def test_non_root_against_a_root_only_socket_is_exit_4(world: World, tmp_path: Path) -> None:
    for p in (tmp_path, tmp_path.parent, tmp_path.parent.parent):
        os.chmod(p, os.stat(p).st_mode | 0o011)
    os.chmod(world.socket.parent, 0o711)  # reachable: the socket's 0600 is what refuses
    try:
        with WorldReadableCopy(REPO) as cp:  # the checkout may sit in a 0700 directory
            p = subprocess.run(
                [
                    "setpriv",
                    "--reuid=nobody",
                    "--regid=nogroup",
                    "--clear-groups",
                    *cp.azctl("--socket", str(world.socket), "sandbox", "ls"),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                cwd="/",
                env={**os.environ, **cp.env},
            )
    finally:
        os.chmod(world.socket.parent, 0o700)
    assert p.returncode == 4 and "permission denied" in p.stderr, p
    assert p.stderr.count("\n") == 1


def test_sandbox_map_through_the_daemon(world: World, tmp_path: Path) -> None:
    """`azctl sandbox map` reads the range from /proc/PID/maps and hands it to the module."""
    snap = tmp_path / "snap.mem"
    snap.write_bytes(bytes(8 * 4096))
    world.run("sandbox", "add", "a", "--cgroup", "/sb/a", "--group", "1")
    with open(snap, "r+b") as fh:
        m = mmap.mmap(fh.fileno(), 8 * 4096, flags=mmap.MAP_PRIVATE)
    try:
        r = world.run("sandbox", "map", "a", "--pid", str(os.getpid()), "--file", str(snap),
                      "--json")
        assert r.exit_code == 0, r.output
        got = json.loads(r.output)
        assert got["pages"] == 8 and got["pgoff"] == 0 and got["cow_index"] == "file"
        assert world.module.maps[got["cgroup_id"]] == (got["start"], 8, 0)
    finally:
        m.close()
    assert "does not map" in one_error_line(
        world.run("sandbox", "map", "a", "--pid", str(os.getpid()), "--file", str(snap)), 7)
    one_error_line(world.run("sandbox", "map", "zz", "--pid", "1", "--file", str(snap)), 6)
