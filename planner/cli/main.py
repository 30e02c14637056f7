"""The ``ho-plan`` command: a thin layer over ``planner.api``.

Exit status: 0 a valid plan; 1 no valid plan (budget below the minimum, or violations); 2 bad input; 130 Ctrl-C
(cpsat's best valid plan so far is still written).
"""

from __future__ import annotations

import difflib
import inspect
import json
import shlex
import sys
import time
from pathlib import Path
from typing import NoReturn

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape

from planner import api
from planner.cli.progress import live_progress, log_on_stderr
from planner.errors import InfeasibleBudget, InputError, InputErrors
from planner.fileio import read_json
from planner.hardware import HBM
from planner.placement import apply_homes, parse_homes
from planner.planners import REGISTRY, get_planner
from planner.quality import plan_quality
from planner.report.trace import TraceRun, write_trace
from planner.schedule import validate_schedule, write_schedule
from planner.summary import summary_dict, summary_table, tensor_tables
from planner.tensors import tensor_view
from planner.units import format_bytes, format_bytes_exact, format_time_us, parse_size, parse_time

EXAMPLES = """
\b
Examples:
  ho-plan graphs/transformer_block.json --hbm 2GB --time-limit 10
  ho-plan graphs/transformer_block.json --hbm 2GB --planner cpsat --seed 3 -O log=cpsat.log   # reproducible
  ho-plan graphs/transformer_block.json --hbm 2GB --planner reactive --json
  ho-plan graphs/remote_weights_chain.json --hardware cloudmatrix384 --hbm 500MB --p2d 100GB/s
  ho-plan validate transformer_block.schedule.json graphs/transformer_block.json
  ho-plan validate tb.schedule.json graphs/transformer_block.json --hardware ascend-910c --hbm 2GB
"""


# Seconds per op of writing the schedule file and printing the summary, kept out of a time limit (measured: about
# 0.1 ms per op on the 2-core development machine, 0.25 ms when the other core is busy too).
WRITE_S_PER_OP = 2.5e-4


def usage_exit(exc: click.exceptions.UsageError) -> NoReturn:
    """Click's usage error (unknown option or command, bad value) as one line on stderr, exit status 2: the
    project's rule for bad input, where click would print usage, a hint and the error on four lines."""
    click.echo(f"error: command line: {exc.format_message()}", err=True)
    sys.exit(2)


class OneLineGroup(click.Group):
    """A group whose usage errors, its own and its subcommands', are one line (``usage_exit``), and whose unknown
    subcommand gets a suggestion: ``No such command 'valdate'. Did you mean 'validate'?``."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.UsageError as exc:
            if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                raise  # the group called bare: click prints its help
            usage_exit(exc)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.exceptions.UsageError as exc:
            if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                raise
            usage_exit(exc)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1)
            ctx.fail(f"No such command {name!r}." + (f" Did you mean {close[0]!r}?" if close else ""))
        return super().resolve_command(ctx, args)


def _is_graph_argument(arg: str) -> bool:
    """Whether the first word of ``ho-plan ARG ...`` is the main job's GRAPH rather than a subcommand: an option,
    an existing path, or a word that looks like a file name (``x.json``, ``dir/x``). Anything else is a command,
    so that ``ho-plan valdate a b`` says there is no such command instead of failing as a graph."""
    return arg.startswith("-") or "." in arg or "/" in arg or Path(arg).exists()


class DefaultGroup(OneLineGroup):
    """A group whose default subcommand is ``plan``: ``ho-plan graph.json --hbm 64GB``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if (args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")
                and _is_graph_argument(args[0])):
            args = ["plan", *args]
        return super().parse_args(ctx, args)


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for v in values:
        if "=" not in v:
            raise InputError("command line", option, f"{v!r} should be NAME=VALUE")
        k, _, val = v.partition("=")
        out[k.strip()] = val.strip()
    return out


def _option_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def command_line() -> str:
    """The command as given, rebuilt from the parsed parameters (not sys.argv, which differs under test)."""
    ctx = click.get_current_context()
    # The root's name as invoked ("ho-plan", or "python -m planner") becomes "ho-plan".
    root = ctx.find_root().info_name or ""
    words = ["ho-plan"] + ctx.command_path[len(root):].split()
    args: list[str] = []
    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name) in (ParameterSource.DEFAULT, None):
            continue
        value = ctx.params.get(param.name)
        if isinstance(param, click.Argument):
            args.append(str(value))
            continue
        flag = max(param.opts, key=len)
        if getattr(param, "is_flag", False):
            if value:
                words.append(flag)
        elif getattr(param, "multiple", False):
            for v in value:
                words += [flag, str(v)]
        elif value is not None:
            words += [flag, str(value)]
    return " ".join(shlex.quote(w) for w in words[:len(ctx.command_path.split())] + args + words[
        len(ctx.command_path.split()):])


def run_guarded(fn):
    """Run ``fn``; turn InputError into one line on stderr and exit 2, never a traceback."""
    try:
        return fn()
    except InputError as exc:
        # InputErrors (several things wrong with one file) print one line each.
        for line in exc.lines() if isinstance(exc, InputErrors) else [str(exc)]:
            click.echo(f"error: {line}", err=True)
        sys.exit(2)


@click.group(cls=DefaultGroup, epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ho-plan")
def main() -> None:
    """ho-plan: plan where every tensor lives (HBM, remote pool, host) and when it moves.

    The main job is `ho-plan GRAPH --hbm 64GB`: plan, validate in the timeline executor, print a summary and
    write a ho-schedule/1 file.
    """


def hardware_options(f):
    opts = [
        click.option("--hardware", "preset_name", default="ascend-910c", show_default=True,
                     help="Hardware preset: ascend-910c, cloudmatrix384, h100-pcie, gh200; or a hardware spec "
                          "file (FILE.json: the 'hardware' object of a schedule file, or a whole schedule file)."),
        click.option("--hbm", help="HBM budget, e.g. 64GB, 64GiB, 6.4e10 (default: the preset's HBM)."),
        click.option("--d2h", help="Bandwidth of link d2h, e.g. 40GB/s."),
        click.option("--h2d", help="Bandwidth of link h2d."),
        click.option("--d2p", help="Bandwidth of link d2p (HBM to pool)."),
        click.option("--p2d", help="Bandwidth of link p2d (pool to HBM)."),
        click.option("--link", "links", multiple=True, metavar="NAME=BW", help="Any link's bandwidth."),
        click.option("--latency", "latencies", multiple=True, metavar="NAME=TIME",
                     help="A link's latency, e.g. d2h=5us."),
        click.option("--channels", "channels", multiple=True, metavar="NAME=N", help="A link's concurrent channels."),
        click.option("--tier", "tiers", multiple=True, metavar="NAME=SIZE", help="A tier's capacity, e.g. host=512GB."),
        click.option("--peak-flops", help="Compute throughput in FLOP/s, e.g. 3.76e14."),
        click.option("--hbm-bandwidth", help="HBM bandwidth for the roofline, e.g. 1.6TB/s."),
        click.option("--launch-overhead", help="Per-op launch overhead, e.g. 5us."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_hardware(kw: dict):
    links = _pairs(kw.pop("links"), "--link")
    for name in ("d2h", "h2d", "d2p", "p2d"):
        v = kw.pop(name)
        if v is not None:
            links[name] = v
    channels = {k: _int(v, f"--channels {k}") for k, v in _pairs(kw.pop("channels"), "--channels").items()}
    return api.hardware(
        kw.pop("preset_name"),
        hbm=kw.pop("hbm"),
        tier_capacity=_pairs(kw.pop("tiers"), "--tier"),
        link_bandwidth=links,
        link_latency=_pairs(kw.pop("latencies"), "--latency"),
        link_channels=channels,
        peak_flops=kw.pop("peak_flops"),
        hbm_bandwidth=kw.pop("hbm_bandwidth"),
        launch_overhead=kw.pop("launch_overhead"),
    )


def _int(text: str, item: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError("command line", item, f"{text!r} is not a whole number") from None


def graph_options(f):
    """Options for the graph importers; each applies to its format and is ignored by the others."""
    opts = [
        click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                     help="ONNX: fix a symbolic dim, e.g. --dim batch=1 --dim sequence=4096 (repeatable)."),
        click.option("--time-unit", metavar="TIME|macs",
                     help="Checkmate/Moccasin graphs: time per cost unit (default 10us), or 'macs' when the "
                          "costs count multiply-accumulates."),
        click.option("--size-unit", metavar="SIZE",
                     help="Checkmate/Moccasin graphs: bytes per size unit (default 1 byte), e.g. 1MB."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def load_options(kw: dict) -> dict:
    """Pop the importer options from the command's keywords and return them as ``load_graph`` options."""
    options: dict = {"dims": {k: _int(v, f"--dim {k}") for k, v in _pairs(kw.pop("dims"), "--dim").items()}}
    time_unit = kw.pop("time_unit")
    if time_unit is not None:
        if time_unit.strip().lower() == "macs":
            options["macs"] = True
        else:
            options["time_unit_s"] = parse_time(time_unit, "--time-unit")
            if options["time_unit_s"] <= 0:
                raise InputError("command line", "--time-unit", f"{time_unit!r} must be positive")
    size_unit = kw.pop("size_unit")
    if size_unit is not None:
        options["size_unit_bytes"] = parse_size(size_unit, "--size-unit")
    return options


@main.command("plan", epilog=EXAMPLES)
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@hardware_options
@graph_options
@click.option("--planner", "planner_name", default="cpsat", show_default=True,
              help="Planner. " + "; ".join(f"{name}: {spec.summary}" for name, spec in REGISTRY.items()) + ".")
@click.option("--greedy-sweep", "greedy_sweep", is_flag=True,
              help="Plan with greedy over a grid of its four settings and keep the best valid plan "
                   "(same as --planner greedy-sweep).")
@click.option("-O", "--planner-option", "planner_options", multiple=True, metavar="KEY=VALUE",
              help="A planner option, e.g. -O lookahead=2, parsed to the option's type (booleans: "
                   "true/false/1/0/yes/no).")
@click.option("--home", "homes", multiple=True, metavar="KIND=TIER|auto",
              help="Where tensors of a kind start the step (and end it), overriding the graph: a tier pins them, "
                   "auto lets the planner choose, e.g. --home weight=auto --home optimizer_state=host "
                   "(kinds: weight, optimizer_state, kv_cache, input, ...). Repeatable.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Schedule file to write (default: ./<graph>.<planner>.schedule.json).")
@click.option("--no-output", is_flag=True, help="Do not write a schedule file.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--tensors", "tensors_top", type=click.IntRange(min=1), is_flag=False, flag_value=20, default=None,
              metavar="[N]", help="Also show which tensors move and why: the N (default 20) that free the most HBM "
                                  "bytes x time, what is on HBM at its peak, totals per kind and layer. With --json: "
                                  "a 'tensor_view' section with every moving tensor.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help="Also write the executed plan as Perfetto / Chrome trace JSON (open in ui.perfetto.dev).")
@click.option("--time-limit", "time_limit", type=float, default=None,
              help="Seconds the cpsat planner may take, wall clock (default 60).")
@click.option("--seed", type=int, default=None, help="cpsat: random seed (default 0).")
@click.option("--workers", type=int, default=None,
              help="cpsat: solver threads (default 1: reproducible for a given --seed); 2 or more run CP-SAT's "
                   "parallel search, which is not reproducible.")
def plan_cmd(graph_path, planner_name, planner_options, homes, output, no_output, as_json, tensors_top, trace_path,
             greedy_sweep, time_limit, seed, workers, **hw_kw):
    """Plan GRAPH for an HBM budget, validate the plan, print a summary, write a schedule."""
    if greedy_sweep:
        planner_name = "greedy-sweep"

    def go():
        t0 = time.monotonic()
        graph = api.load_graph(graph_path, **load_options(hw_kw))
        hw = build_hardware(hw_kw)
        graph = apply_homes(graph, parse_homes(homes), hw)
        # Typed by the planner's declared options (api.option_types): "-O select_num=1.5" is an error, not 1.
        options = api.parse_planner_options(planner_name, _pairs(planner_options, "-O"))
        options.update(_solver_options(planner_name, time_limit, seed, workers))
        # The no-offload reference before planning, so that a time limit counts what it took (on a graph the
        # hardware can run: api.plan says what is wrong otherwise).
        api.check_compatible(graph, hw, graph_path)
        reference = api.no_offload_reference(graph, hw)
        if "time_limit" in options:
            # The limit covers the whole command: loading and the reference took some of it, and the schedule
            # file and the summary after planning take up to WRITE_S_PER_OP. (The plan records the limit as given.)
            spent = time.monotonic() - t0 + WRITE_S_PER_OP * len(graph.ops)
            options["wall_budget"] = max(0.5, options["time_limit"] - spent)

        try:
            # -O log=true: CP-SAT's search log comes through the progress callback, which writes it to stderr.
            with live_progress(enabled=not as_json and "time_limit" in options,
                               log=log_on_stderr(options)) as progress:
                if progress is not None:
                    options["progress"] = progress
                result = api.plan(graph, hw, planner=planner_name, source=graph_path, reference=reference,
                                  **options)
        except InfeasibleBudget as exc:
            if as_json:
                click.echo(json.dumps({"graph": graph.name, "valid": False, "infeasible": True,
                                       "hbm_budget_bytes": exc.budget, "minimum_hbm_bytes": exc.minimum,
                                       "reason": exc.reason}))
            else:
                click.echo(
                    f"infeasible: HBM budget {format_bytes(exc.budget)} is below {format_bytes(exc.minimum)} "
                    f"({exc.minimum} B), the {exc.reason}; no plan can fit",
                    err=True,
                )
            sys.exit(1)

        quality = plan_quality(graph, hw, result.plan, result.timeline)
        path = None
        if not no_output and result.timeline.valid:
            stem = Path(graph_path).name.removesuffix(".json").removesuffix(".onnx")
            path = output or f"{stem}.{planner_name}.schedule.json"

            write_schedule(path, graph, hw, result.plan, result.timeline, quality.to_dict())
        if trace_path and result.timeline.steps:
            write_trace(trace_path, [TraceRun(graph, hw, result.plan, result.timeline)])
        d = summary_dict(graph, hw, result, path, quality)
        view = None
        if tensors_top is not None:
            view = tensor_view(graph, result.plan, result.timeline)
            # "tensors" is already the graph's tensor count.
            d["tensor_view"] = view.to_dict()
        if as_json:
            click.echo(json.dumps(d, indent=1))
        else:
            console = Console()
            console.print(summary_table(d))
            for v in result.timeline.violations[:20]:
                console.print(f"[red]violation[/] {escape(v.describe())}", highlight=False)
            if len(result.timeline.violations) > 20:
                console.print(f"... and {len(result.timeline.violations) - 20} more", highlight=False)
            for note in result.plan.notes:
                console.print(f"note: {escape(note)}", highlight=False)
            if view is not None:
                # Rows of op and tensor names need more than a pipe's default 80 columns to stay readable.
                wide = console if console.is_terminal else Console(width=max(console.width, 140))
                for part in tensor_tables(view, tensors_top):
                    wide.print(part, highlight=False)
            if not result.timeline.valid:
                console.print("no schedule written: the plan is not valid", highlight=False)
        if quality.solver is not None and quality.solver.interrupted:
            sys.exit(130)  # Ctrl-C: the best plan so far was written (when valid); the shell's code for SIGINT
        if not result.timeline.valid:
            sys.exit(1)

    try:
        run_guarded(go)
    except KeyboardInterrupt:
        # Ctrl-C before any plan existed (loading, the starting plan) or in a planner that cannot stop early.
        click.echo("interrupted: no schedule written", err=True)
        sys.exit(130)


def _solver_options(planner_name: str, time_limit, seed, workers) -> dict:
    """--time-limit, --seed and --workers, for the planners that take them (cpsat)."""
    given = {"time_limit": time_limit, "seed": seed, "workers": workers}
    params = inspect.signature(get_planner(planner_name)).parameters
    if "time_limit" not in params:
        named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
        if named:
            raise InputError("command line", named[0], f"planner {planner_name!r} does not take it (cpsat does)")
        return {}
    if time_limit is not None and time_limit <= 0:
        raise InputError("command line", "--time-limit", "must be positive")
    if workers is not None and workers < 1:
        raise InputError("command line", "--workers", "must be at least 1")
    return {k: v for k, v in given.items() if v is not None} | {"time_limit": time_limit or 60.0}


@main.command("validate")
@click.argument("schedule_path", metavar="SCHEDULE", type=click.Path(dir_okay=False))
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@graph_options
@hardware_options
def validate_cmd(schedule_path, graph_path, **kw):
    """Re-run the executor on SCHEDULE for GRAPH; fail on any violation or mismatch with the file.

    The file's tensor table, hardware, planner options, placement, offsets and program must fit GRAPH (exit 2,
    one line per problem, otherwise). With hardware options (--hardware NAME|FILE.json, --hbm, ...) the file's
    hardware must also be that hardware.
    """

    def go():
        ctx = click.get_current_context()
        graph_kw = {k: kw.pop(k) for k in ("dims", "time_unit", "size_unit")}
        given = [k for k in kw if ctx.get_parameter_source(k) is not ParameterSource.DEFAULT]
        graph = api.load_graph(graph_path, **load_options(graph_kw))
        doc = read_json(schedule_path)
        hardware = build_hardware(kw) if given else None
        report = validate_schedule(doc, graph, schedule_path, hardware)
        for v in report.timeline.violations:
            click.echo(f"violation {v.describe()}")
        for m in report.mismatches:
            click.echo(f"mismatch {m}")
        if not report.ok:
            click.echo(f"{schedule_path}: INVALID", err=True)
            sys.exit(1)
        m = report.timeline.metrics
        click.echo(f"{schedule_path}: valid; makespan {format_time_us(m.makespan_ns / 1000)}, "
                   f"peak HBM {format_bytes_exact(m.peak_bytes[HBM])}, matches the recorded timeline")

    run_guarded(go)
