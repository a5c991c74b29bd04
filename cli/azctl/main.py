"""azctl: command-line front end of the azswap control plane (thin over controlplane/)."""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import click

from azctl import render
from azctl.env import Env, need_root
from controlplane import errors, metrics, snapshot
from controlplane.abi import MAX_LOAD_PAGES, POLICY_FIELDS, Codec
from controlplane.client import DEFAULT_SOCKET
from controlplane.prefetch_defaults import PREFETCH, PREFETCH_FROM, PREFETCH_SOURCES
from controlplane.scheduler import SchedulerConfig
from controlplane.waitplan import PlanConfig

EXIT_CODES_HELP = "\b\nExit codes:\n" + "\n".join(
    f"  {code:<3} {what}" for code, what in sorted(errors.EXIT_CODES.items())
)

ROOT_HELP_EPILOG = f"""\b
Examples:
  azctl status                         devices, pool, ratios, sandboxes
  azctl daemon &                       start the control plane (root)
  azctl sandbox add sb1 --cgroup /sandboxes/sb1 --group 1
  azctl phase sb1 llm-wait             compress while it waits for the model
  azctl ending sb1                     the model streams its tool call: stop compressing
  azctl phase sb1 tool                 stop compressing (the tool faults back the rest)
  azctl template add base --group 1 --from-file /srv/vm/base.mem
  azctl stats --json | jq .totals.ratio
  azctl --direct status                the module itself, when no daemon runs
  eval "$(_AZCTL_COMPLETE=bash_source azctl)"    shell completion (bash; zsh_source, fish_source)

{EXIT_CODES_HELP}
"""


class AzGroup(click.Group):
    """Turns every AzswapError into one line on stderr and its exit code (traceback: --debug)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except errors.AzswapError as e:
            _fail(ctx, f"azctl: {e}", e.exit_code)
        except KeyboardInterrupt:
            _fail(ctx, "azctl: interrupted", 130)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:
            _fail(ctx, f"azctl: internal error: {type(e).__name__}: {e} (run with --debug)", 1)


def _fail(ctx: click.Context, line: str, code: int) -> None:
    env = ctx.find_object(Env)
    if (env is not None and env.debug) or os.environ.get("AZCTL_DEBUG"):
        traceback.print_exc()
    click.echo(line, err=True)
    ctx.exit(code)


def _env(ctx: click.Context) -> Env:
    return ctx.ensure_object(Env)


json_opt = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
_SCHED = SchedulerConfig()  # the daemon's defaults, shown by `azctl daemon --help`
_PLAN = PlanConfig()


@click.group(cls=AzGroup, epilog=ROOT_HELP_EPILOG, context_settings={"max_content_width": 100})
@click.option(
    "--socket",
    # no readability check: a non-root user must get "permission denied" (exit 4) from the
    # connection, not a usage error
    type=click.Path(dir_okay=False, readable=False, path_type=Path),
    default=None,
    help=f"Daemon socket [default: {DEFAULT_SOCKET}; env AZSWAP_SOCKET].",
)
@click.option("--dev", type=click.IntRange(0), default=None, help="Device N of /dev/azswapN.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the daemon keeps sandbox names [default: /run/azswap].",
)
@click.option(
    "--direct",
    is_flag=True,
    help="Talk to the module (netlink, sysfs) instead of the daemon, for a host where no daemon "
    "runs: status, top, stats, sandbox ls, template ls, policy get/set.",
)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.pass_context
def cli(
    ctx: click.Context,
    socket: Path | None,
    dev: int | None,
    state_dir: Path | None,
    direct: bool,
    debug: bool,
) -> None:
    """Control azswap: devices, sandboxes, templates, phases and policy.

    Every command talks to the daemon (azctl daemon); without one running it fails with one
    line, unless --direct is given for the commands that can read the module itself.
    """
    env = _env(ctx)
    env.direct = env.direct or direct
    if socket is not None:
        env.socket = socket
    if state_dir is not None:
        env.state_dir = state_dir
    if dev is not None:
        env.dev = dev
    env.debug = env.debug or debug
    ctx.call_on_close(env.close)


# -- status, top, stats ----------------------------------------------------------------------


@cli.command(epilog="\b\nExamples:\n  azctl status\n  azctl status --json")
@json_opt
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Devices, pool, ratio per representation and the sandboxes table."""
    d = _env(ctx).stats()
    if as_json:
        render.print_json(d)
    else:
        render.console().print(render.status(d))


@cli.command(epilog="\b\nExamples:\n  azctl top\n  azctl top --interval 0.5")
@click.option("--interval", type=click.FloatRange(0.1), default=1.0, show_default=True)
@click.option(
    "--iterations", "-n", type=click.IntRange(0), default=0, help="Stop after N (0: never)."
)
@click.pass_context
def top(ctx: click.Context, interval: float, iterations: int) -> None:
    """Live status, refreshed every INTERVAL seconds (Ctrl-C to quit)."""
    from rich.live import Live

    env = _env(ctx)
    con = render.console()
    n = 0
    with Live(render.status(env.stats()), console=con, auto_refresh=False) as live:
        while True:
            n += 1
            if iterations and n >= iterations:
                break
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                break
            live.update(render.status(env.stats()), refresh=True)


@cli.command(
    epilog="\b\nExamples:\n  azctl stats --json\n  azctl stats sb1 --json\n"
    "  azctl stats --prometheus > /var/lib/node_exporter/azswap.prom"
)
@click.argument("name", required=False)
@json_opt
@click.option("--prometheus", is_flag=True, help="Prometheus text exposition format.")
@click.pass_context
def stats(ctx: click.Context, name: str | None, as_json: bool, prometheus: bool) -> None:
    """Global and per-sandbox figures (all of them, or NAME's)."""
    d = _env(ctx).stats()
    if prometheus:
        click.echo(metrics.to_prometheus(d), nl=False)
        return
    if name is not None:
        match = [s for s in d["sandboxes"] + d["templates"] if s["name"] == name]
        if not match:
            raise errors.UnknownSandbox(f"unknown sandbox {name!r}")
        d = match[0]
    if as_json:
        render.print_json(d)
    elif name is not None:
        render.console().print(render.policy_table({k: v for k, v in d.items() if k != "kinds"}))
        render.console().print(render.policy_table(d["kinds"]))
    else:
        render.console().print(render.status(d))


# -- sandboxes -----------------------------------------------------------------------------


@cli.group(cls=AzGroup)
def sandbox() -> None:
    """Register, unregister and list sandboxes (through the daemon)."""


@sandbox.command(
    "add",
    epilog="\b\nExamples:\n  azctl sandbox add sb1 --cgroup /sandboxes/sb1 --group 1\n"
    "  azctl sandbox add sb2 --cgroup /sandboxes/sb2 --group 1 --template base",
)
@click.argument("name")
@click.option("--cgroup", required=True, help="cgroup v2 path relative to the root.")
@click.option("--group", type=int, required=True, help="Trust group (1..2^31-1).")
@click.option("--template", default=None, help="Template it was started from.")
@json_opt
@click.pass_context
def sandbox_add(
    ctx: click.Context, name: str, cgroup: str, group: int, template: str | None, as_json: bool
) -> None:
    """Register sandbox NAME (its cgroup and trust group)."""
    sb = _env(ctx).client("sandbox add").register(name, cgroup, group, template)
    _done(as_json, sb, f"sandbox {sb['name']}: cgroup {sb['cgroup_path']} id {sb['cgroup_id']}")


@sandbox.command(
    "map",
    epilog="\b\nExample (a Firecracker VMM of sandbox vm1 maps the snapshot privately):\n"
    "  azctl sandbox map vm1 --pid 4242 --file /srv/snapshots/base.mem",
)
@click.argument("name")
@click.option("--pid", type=int, required=True, help="The process that maps the snapshot.")
@click.option("--file", "file", required=True, help="The snapshot memory file it maps.")
@json_opt
@click.pass_context
def sandbox_map(ctx: click.Context, name: str, pid: int, file: str, as_json: bool) -> None:
    """Tell the module where sandbox NAME maps a snapshot template MAP_PRIVATE.

    The daemon reads the range from /proc/PID/maps. Kernels that index a copied-on-write page by
    its virtual address (7.x) need it to store the sandbox's edits of the snapshot as template
    deltas; on 6.1 and 6.12 the module needs no map and only checks the request.
    """
    r = _env(ctx).client("sandbox map").map(name, pid, file)
    _done(as_json, r, f"sandbox {r['name']}: {file} at page {r['start']:#x}, {r['pages']} pages "
          f"from file page {r['pgoff']} (kernel indexes copies by {r['cow_index']} offset)")


@sandbox.command("rm", epilog="\b\nExample:\n  azctl sandbox rm sb1")
@click.argument("name")
@json_opt
@click.pass_context
def sandbox_rm(ctx: click.Context, name: str, as_json: bool) -> None:
    """Unregister sandbox NAME (its stored pages stay readable)."""
    sb = _env(ctx).client("sandbox rm").unregister(name)
    _done(as_json, sb, f"sandbox {sb['name']} removed")


@sandbox.command("ls", epilog="\b\nExamples:\n  azctl sandbox ls\n  azctl sandbox ls --json")
@json_opt
@click.pass_context
def sandbox_ls(ctx: click.Context, as_json: bool) -> None:
    """List sandboxes (with --direct: the module's, named from the daemon's state file)."""
    rows = _env(ctx).listing()["sandboxes"]
    if as_json:
        render.print_json(rows)
    else:
        cols = ["name", "cgroup_path", "cgroup_id", "group", "template", "phase"]
        render.console().print(render.list_table("sandboxes", rows, cols))


# -- templates -------------------------------------------------------------------------------


@cli.group(cls=AzGroup)
def template() -> None:
    """Templates: a running template cgroup, or a memory snapshot file."""


@template.command(
    "add",
    epilog="\b\nExamples:\n  azctl template add base --group 1 --cgroup /templates/base\n"
    "  azctl template add vm --group 2 --from-file /srv/vm/base.mem",
)
@click.argument("name")
@click.option("--group", type=int, required=True, help="Trust group (1..2^31-1).")
@click.option("--cgroup", default=None, help="A running template's cgroup path.")
@click.option(
    "--from-file",
    "image",
    type=click.Path(dir_okay=False, exists=False),
    default=None,
    help="A memory snapshot file (page-aligned), loaded as bases.",
)
@click.option(
    "--batch", type=click.IntRange(1, MAX_LOAD_PAGES), default=MAX_LOAD_PAGES, show_default=True
)
@json_opt
@click.pass_context
def template_add(
    ctx: click.Context,
    name: str,
    group: int,
    cgroup: str | None,
    image: str | None,
    batch: int,
    as_json: bool,
) -> None:
    """Register template NAME from a cgroup or load it from a snapshot file.

    A snapshot file kept in host memory (tmpfs) that VMs map privately can be swapped too:
    register the cgroup its pages are charged to (the one that wrote it) as a sandbox of the
    same group (azctl sandbox add), and each of its pages swaps out as a duplicate of its base
    (docs/lab/microvm.md, private-reclaim).
    """
    if (cgroup is None) == (image is None):
        raise click.UsageError("give exactly one of --cgroup and --from-file")
    client = _env(ctx).client("template add")
    if image is None:
        t = client.template_add(name, group, cgroup)
        _done(as_json, t, f"template {name}: cgroup {t['cgroup_path']} id {t['cgroup_id']}")
        return
    snapshot.check_file(image)  # a clear error before the daemon is asked
    path = os.path.realpath(image)  # the daemon's working directory is not ours
    if as_json:
        t = client.template_load(name, group, path, batch)
    else:
        with render.console(stderr=True).status(f"loading {image}"):
            t = client.template_load(name, group, path, batch)
    _done(
        as_json,
        t,
        f"template {name}: {t['pages_loaded']} pages loaded from {image} "
        f"({t['pages_zero']} zero pages skipped), id {t['cgroup_id']}",
    )


@template.command("rm", epilog="\b\nExample:\n  azctl template rm base")
@click.argument("name")
@json_opt
@click.pass_context
def template_rm(ctx: click.Context, name: str, as_json: bool) -> None:
    """Unregister template NAME (bases in use by deltas stay until freed)."""
    t = _env(ctx).client().template_rm(name)
    _done(as_json, t, f"template {name} removed")


@template.command("ls", epilog="\b\nExample:\n  azctl template ls --json")
@json_opt
@click.pass_context
def template_ls(ctx: click.Context, as_json: bool) -> None:
    """List templates."""
    rows = _env(ctx).listing()["templates"]
    if as_json:
        render.print_json(rows)
    else:
        cols = ["name", "cgroup_path", "source_file", "cgroup_id", "group", "pages_loaded"]
        render.console().print(render.list_table("templates", rows, cols))


# -- phase, compress, prefetch ---------------------------------------------------------------


@cli.command(epilog="\b\nExamples:\n  azctl phase sb1 llm-wait\n  azctl phase sb1 tool")
@click.argument("name")
@click.argument("phase", type=click.Choice(["tool", "llm-wait", "idle", "unknown"]))
@json_opt
@click.pass_context
def phase(ctx: click.Context, name: str, phase: str, as_json: bool) -> None:
    """Hint that sandbox NAME entered PHASE (llm-wait compresses, tool stops compressing)."""
    r = _env(ctx).client("phase").phase(name, phase)
    _done(as_json, r, f"{name}: {r['phase']}")


@cli.command(epilog="\b\nExample:\n  azctl ending sb1")
@click.argument("name")
@json_opt
@click.pass_context
def ending(ctx: click.Context, name: str, as_json: bool) -> None:
    """Hint that sandbox NAME's LLM wait ends soon (the model is streaming its tool call):
    the wait is not compressed again, and (unless `azctl daemon --no-prefetch`, or nothing of
    its working set was recorded yet: its first announced wait) its working set is
    prefetched (at once, or paced to the sandbox's earlier streams: see azctl daemon
    --stream-quantile)."""
    r = _env(ctx).client("ending").ending(name)
    _done(as_json, r, f"{name}: {'prefetch due' if r['prefetch'] else 'nothing to prefetch'}")


@cli.command(epilog="\b\nExamples:\n  azctl compress sb1\n  azctl compress sb1 --wait 60")
@click.argument("name")
@click.option("--wait", type=click.FloatRange(0), default=0.0, help="Wait up to S seconds.")
@json_opt
@click.pass_context
def compress(ctx: click.Context, name: str, wait: float, as_json: bool) -> None:
    """Compress sandbox NAME now, whatever its phase (in the daemon's CPU budget)."""
    r = _env(ctx).client("compress").compress(name, wait)
    st = r.get("state") or {}
    msg = f"{name}: compression queued"
    if st.get("done"):
        msg = (
            f"{name}: compressed, memory.current {render.size(st.get('mem_start'))} -> "
            f"{render.size(st.get('mem_now'))} in {st.get('wall', 0):.2f}s "
            f"(cpu {st.get('cpu', 0):.2f}s)"
        )
    _done(as_json, r, msg)


@cli.command(epilog="\b\nExample:\n  azctl prefetch sb1")
@click.argument("name")
@json_opt
@click.pass_context
def prefetch(ctx: click.Context, name: str, as_json: bool) -> None:
    """Prefetch sandbox NAME's recorded working set now."""
    r = _env(ctx).client("prefetch").prefetch(name)
    _done(as_json, r, f"{name}: {r.get('result')}")


# -- policy ----------------------------------------------------------------------------------


@cli.group(cls=AzGroup)
def policy() -> None:
    """Store policy of the device (codec, dedup, deltas, similarity effort)."""


@policy.command("get", epilog="\b\nExample:\n  azctl policy get --json")
@json_opt
@click.pass_context
def policy_get(ctx: click.Context, as_json: bool) -> None:
    """Show the store policy."""
    p = _env(ctx).policy_get()
    if as_json:
        render.print_json(p)
    else:
        render.console().print(render.policy_table(p))


def _parse_assignments(items: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in POLICY_FIELDS:
            raise errors.InvalidValue(
                f"{item!r}: expected KEY=VALUE with KEY one of {', '.join(POLICY_FIELDS)}"
            )
        value = value.strip().lower()
        if key == "codec" and value in ("lz4", "zstd"):
            out[key] = int(Codec[value.upper()])
        elif value in ("on", "off", "yes", "no", "true", "false"):
            out[key] = int(value in ("on", "yes", "true"))
        elif value.isdigit():
            out[key] = int(value)
        else:
            raise errors.InvalidValue(f"{item!r}: {value!r} is not a number")
    return out


@policy.command(
    "set",
    epilog="\b\nExamples:\n  azctl policy set codec=zstd level=3\n"
    "  azctl policy set sim_effort=8 delta_max_pct=60\n  azctl policy set xdelta=off\n"
    "  azctl policy set shuffle=off   (raw, not bit-shuffled, for float pages: faster loads)",
)
@click.argument("assignments", nargs=-1, required=True)
@json_opt
@click.pass_context
def policy_set(ctx: click.Context, assignments: tuple[str, ...], as_json: bool) -> None:
    """Set policy knobs (KEY=VALUE ...); the module validates all, then applies all.

    Through the daemon, which then stops switching the fast/dense modes itself."""
    p = _env(ctx).policy_set(_parse_assignments(assignments))
    if as_json:
        render.print_json(p)
    else:
        render.console().print(render.policy_table(p))


# -- daemon ----------------------------------------------------------------------------------


@cli.command(
    epilog="\b\nExamples:\n  azctl daemon\n  azctl daemon --grace 0.5 --cpu-budget 0.5 "
    "--metrics-port 9377\n  systemctl start azswap-daemon   (controlplane/systemd/)"
)
@click.option(
    "--grace",
    type=click.FloatRange(0),
    default=_SCHED.grace,
    show_default=True,
    help="Seconds of llm-wait (or hinted idle) before compressing.",
)
@click.option(
    "--idle-grace",
    type=click.FloatRange(0),
    default=_SCHED.idle_grace,
    show_default=True,
    help="Seconds of inferred idleness before compressing.",
)
@click.option(
    "--dense-after",
    type=click.FloatRange(0),
    default=_SCHED.dense_after,
    show_default=True,
    help="Wait age from which the dense policy (zstd, deeper search) is used.",
)
@click.option(
    "--cpu-budget",
    type=click.FloatRange(0.01, 1.0),
    default=_SCHED.cpu_budget,
    show_default=True,
    help="Fraction of one CPU for reclaim (sandboxes inferred idle, compress requests).",
)
@click.option(
    "--wait-cpu-budget",
    type=click.FloatRange(0.01, 1.0),
    default=_SCHED.wait_cpu_budget,
    show_default=True,
    help="Fraction of one CPU for reclaim while a sandbox waits for the LLM (hinted).",
)
@click.option(
    "--chunk",
    default=f"{_SCHED.chunk_bytes >> 20}M",
    show_default=True,
    help="Bytes per memory.reclaim write.",
)
@click.option(
    "--interval", type=click.FloatRange(0.05), default=_SCHED.interval, show_default=True
)
@click.option("--no-policy", is_flag=True, help="Never switch the store policy fast/dense.")
@click.option(
    "--prefetch/--no-prefetch",
    default=PREFETCH,
    show_default=True,
    help="Learn the working set of each sandbox that announces the ends of its waits (azctl "
    "ending; see --prefetch-from) and bring it back before its tool runs (with "
    "--predict-unannounced: before a wait's predicted end too).  --no-prefetch: an "
    "announcement only keeps a working set that has not gone yet.",
)
@click.option(
    "--prefetch-from",
    type=click.Choice(PREFETCH_SOURCES),
    default=PREFETCH_FROM,
    show_default=True,
    help="How a sandbox's working set is learned.  resident: what is resident when a wait's "
    "compression has reached the working set (/proc/PID/pagemap; no tracer, no cost on any "
    "fault); a sandbox whose ends are announced then loses its working set too, and gets it "
    "back on the announcement.  faults: the eBPF fault tracer records what each tool faults "
    "in (bcc; its cost on every fault is paid by the tools).",
)
@click.option(
    "--predict-unannounced",
    is_flag=True,
    help="Also prefetch before the predicted end of a wait whose end is not "
    "announced (from the sandbox's earlier waits).  Off by default: on heavy-tailed waits "
    "such a prefetch came as often too early as in time, and competed with running tools.",
)
@click.option(
    "--hint-prefetch",
    is_flag=True,
    help="On a tool hint that found nothing prefetched in its wait, prefetch beside the tool "
    "(default: the tool faults its pages in; a racing prefetch measured slower).  With "
    "--prefetch-from resident every sandbox's working set is then recorded at each wait.",
)
@click.option(
    "--no-predict",
    is_flag=True,
    help="With --prefetch-from faults: prefetch on the tool hint only, never before a wait's "
    "end, announced or predicted (the working set is then compressed at once with the rest).",
)
@click.option(
    "--no-keep-hot",
    is_flag=True,
    help="Compress a waiting sandbox's working set at once with the rest, instead of when "
    "the wait is expected to last --deep-min-remaining more.",
)
@click.option(
    "--no-age-kept",
    is_flag=True,
    help="Leave the accessed bits of the pages a wait keeps (by default they are cleared once "
    "its compression stops at the working set, so that the next wait keeps what the next tool "
    "used rather than what older tools did).",
)
@click.option(
    "--pack-every",
    type=click.FloatRange(0),
    default=_SCHED.pack_every,
    show_default=True,
    help="After a compression run, pack the device (nearby compressible pages of one sandbox "
    "stored as one object: fewer bytes, a load decodes up to 4 pages) at most once per this "
    "many seconds; 0 never.",
)
@click.option(
    "--deep-min-remaining",
    type=click.FloatRange(0),
    default=_PLAN.deep_min_remaining,
    show_default=True,
    help="Mean remaining wait (seconds, from the sandbox's or the fleet's earlier waits) from "
    "which a waiting sandbox's working set is compressed too (0: at once; no effect with "
    "--no-keep-hot or --no-predict).",
)
@click.option(
    "--deep-after",
    type=click.FloatRange(0),
    default=None,
    help="Wait age (seconds) from which the working set is compressed when the wait is longer "
    "than every recorded one (or too few are recorded).  Default: once the age reaches "
    "--deep-min-remaining (a wait that has outlived the history is expected to last about as "
    "long again).  No effect with --no-keep-hot or --no-predict.",
)
@click.option(
    "--stream-quantile",
    type=click.FloatRange(0, 1, max_open=True),
    default=_PLAN.stream_quantile,
    show_default=True,
    help="An announced wait's (azctl ending) prefetch starts its lead before "
    "this quantile of the sandbox's earlier streams (announcement to tool hint; with the "
    "fleet's while it has fewer than 5), so the working set stays compressed for most of the "
    "stream; 0: at the announcement.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on 127.0.0.1:PORT.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info")
@click.pass_context
def daemon(
    ctx: click.Context,
    grace: float,
    idle_grace: float,
    dense_after: float,
    cpu_budget: float,
    wait_cpu_budget: float,
    chunk: str,
    interval: float,
    no_policy: bool,
    prefetch: bool,
    prefetch_from: str,
    predict_unannounced: bool,
    hint_prefetch: bool,
    no_predict: bool,
    no_keep_hot: bool,
    no_age_kept: bool,
    pack_every: float,
    deep_min_remaining: float,
    deep_after: float | None,
    stream_quantile: float,
    metrics_port: int | None,
    log_level: str,
) -> None:
    """Run the control plane in the foreground (registry, phase scheduler, socket API).

    \b
    The agent loop it runs for every registered sandbox:
      llm-wait hint  compress the sandbox at once (--wait-cpu-budget, at nice 10)
                     down to the working set its earlier waits measured
                     (then clears the kept pages' accessed bits: the next
                     wait keeps what the next tool touched);
      once the wait is expected to last --deep-min-remaining more (from its own
      or the fleet's earlier waits; a wait longer than all of them is expected
      to last as long again; --deep-after S: at a fixed age instead)
                     compress the working set too;
      a sandbox that announces its waits' ends (azctl ending, as the model
      starts streaming its tool call):
                     its working set goes too once it was recorded (what is
                     resident at that level), and the announcement (paced to
                     the sandbox's earlier streams, --stream-quantile) stops
                     compressing and brings it back (--no-prefetch: the
                     announcement only keeps a working set not gone yet;
                     --predict-unannounced: a wait without one is prefetched
                     for before its predicted end too);
      with --pack-every S, after a run (at most every S seconds)
                     pack the device: nearby compressible pages of one
                     sandbox become one object (a load decodes up to 4);
      tool hint      compression stops; pages not resident fault back on use;
      idle hint      compress the whole sandbox after --grace (it is parked);
      no hints       inferred idle (cgroup CPU/PSI) after --idle-grace, compressed too.
    """
    from controlplane.daemon import Daemon, DaemonConfig
    from controlplane.sysfs import parse_size

    def given(param: str) -> bool:
        return ctx.get_parameter_source(param) != click.core.ParameterSource.DEFAULT

    prefetch_options = [flag for flag, was_given in (
        ("--prefetch", given("prefetch") and prefetch),
        ("--hint-prefetch", hint_prefetch), ("--no-predict", no_predict),
        ("--prefetch-from", given("prefetch_from")),
        ("--predict-unannounced", predict_unannounced),
        ("--stream-quantile", given("stream_quantile"))) if was_given]
    if prefetch_options and not prefetch:
        raise click.UsageError(f"{prefetch_options[0]} needs the prefetcher, which --no-prefetch "
                               "turns off")
    if no_predict and predict_unannounced:
        raise click.UsageError("--predict-unannounced with --no-predict: nothing is predicted "
                               "(every prefetch comes with a tool hint)")
    if prefetch and prefetch_from == "resident" and no_predict:
        raise click.UsageError("--no-predict: no wait would stop at its working set, which the "
                               "resident-set prefetcher (--prefetch-from resident, the default) "
                               "learns there; use --prefetch-from faults")
    if prefetch and prefetch_from == "resident" and no_keep_hot:
        advice = ("--prefetch-from faults" if prefetch_options
                  else "--no-prefetch or --prefetch-from faults")
        raise click.UsageError("--no-keep-hot: no wait would stop at its working set, which the "
                               "resident-set prefetcher (--prefetch-from resident, the default) "
                               f"learns there; use {advice}")
    env = _env(ctx)
    need_root("azctl daemon")
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    cfg = DaemonConfig(
        socket_path=env.socket,
        dev=env.dev,
        cgroup_root=env.cgroup_root,
        sys_block=env.sys_block,
        state_dir=env.state_dir,
        prefetch=prefetch,
        prefetch_from=prefetch_from,
        predict=not no_predict,
        hint_prefetch=hint_prefetch,
        metrics_port=metrics_port,
        plan=PlanConfig(keep_hot=not no_keep_hot, deep_min_remaining=deep_min_remaining,
                        deep_after=deep_after, stream_quantile=stream_quantile,
                        predict_unannounced=predict_unannounced),
        scheduler=SchedulerConfig(
            interval=interval,
            grace=grace,
            idle_grace=idle_grace,
            dense_after=dense_after,
            cpu_budget=cpu_budget,
            wait_cpu_budget=wait_cpu_budget,
            chunk_bytes=parse_size(chunk),
            manage_policy=not no_policy,
            age_kept=not no_age_kept,
            pack_every=pack_every,
        ),
    )
    mf = env.module_factory
    factory = (lambda: mf(env.dev)) if mf is not None else None
    Daemon(cfg, module_factory=factory).run()


def _done(as_json: bool, obj: Any, line: str) -> None:
    if as_json:
        render.print_json(obj)
    else:
        click.echo(line)


def main() -> None:
    cli(prog_name="azctl")
