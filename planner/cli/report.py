"""``ho-plan report`` and ``ho-plan sweep``: planners side by side, sweeps, plots and traces in a report folder.

Registered on ``main`` by ``planner/cli/__init__.py``. Progress goes to stderr (rich); results to files and a
short summary on stdout.
"""

from __future__ import annotations

import inspect
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner import api
from planner.cli.backend import backend_options, backend_spec
from planner.cli.main import (
    OneLineGroup,
    _option_value,
    _pairs,
    build_hardware,
    command_line,
    hardware_options,
    main,
    run_guarded,
)
from planner.errors import InputError
from planner.fileio import write_atomic
from planner.planners import REPORT_PLANNERS, get_spec
from planner.report import bandwidth_sweep, budget_sweep, compare, seqlen_sweep, write_report
from planner.report import solutions as S
from planner.report.compare import VALID
from planner.report.paper import PaperConfig, inference_table, run_paper, training_table, write_paper
from planner.report.sweeps import resolve_generator
from planner.report.writer import fmt_bytes, fmt_pct, fmt_seconds, fmt_time, sweep_markdown, write_sweep
from planner.units import parse_bandwidth

REPORT_EXAMPLES = """
\b
Examples:
  ho-plan report graphs/transformer_block.json --hbm 1.5GB -o out/tb-report
  ho-plan report graphs/transformer_block.json --hbm 1.5GB --sweep budget --sweep bandwidth --jobs 4
  ho-plan report graphs/transformer_block.json --hbm 1.5GB --planners none,reactive -O reactive.lookahead=2
"""

SWEEP_EXAMPLES = """
\b
Examples:
  ho-plan sweep budget graphs/transformer_block.json --fractions 0.5,0.75,1 -o out/budget
  ho-plan sweep bandwidth graphs/transformer_block.json --hbm 1.5GB --bandwidths 20,33.6,70,400 --jobs 4
  ho-plan sweep seqlen inference --hbm 7.5GB -G layers=2 -G block=1024 \\
      --range 8192:262144 --jobs 4
  ho-plan sweep budget graphs/transformer_block.json --backend ray --ray-address auto --resume
"""


# -- shared helpers ---------------------------------------------------------------------------------------------


def parse_planners(text: str | None, item: str = "--planners") -> list[str]:
    """``none,reactive`` -> names, each checked against the registry; default: every report planner there is."""
    if not text:
        return list(REPORT_PLANNERS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        get_spec(n, item)
    return names


def parse_planner_options(values: tuple[str, ...], time_limit: float | None, planners: list[str]) -> dict:
    """``-O cpsat.time_limit=10`` -> ``{"cpsat": {"time_limit": 10.0}}``, each value parsed to the planner's
    declared type (``api.parse_planner_options``); ``--time-limit`` goes to every planner that takes one."""
    text: dict[str, dict[str, str]] = {}
    for key, val in _pairs(values, "-O").items():
        name, dot, opt = key.partition(".")
        if not dot or not opt:
            raise InputError("command line", "-O", f"{key!r} should be PLANNER.OPTION=VALUE")
        parse_planners(name, f"-O {key}")  # a known planner, or one line naming the known ones
        text.setdefault(name, {})[opt] = val
    out = {name: api.parse_planner_options(name, opts, item=f"-O {name}.")
           for name, opts in text.items()}
    if time_limit is not None:
        for name in planners:
            if "time_limit" in api.option_types(name):
                out.setdefault(name, {}).setdefault("time_limit", time_limit)
    return out


def parse_floats(text: str, item: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError("command line", item, f"{text!r} is not a comma-separated list of numbers") from None
    if not vals or any(v <= 0 for v in vals):
        raise InputError("command line", item, "needs positive numbers")
    return vals


def parse_bandwidths(text: str) -> list[float]:
    """``20,33.6,40GB/s,50GiB/s`` -> GB/s (10^9 B/s); a plain number is GB/s."""
    out = []
    for x in text.split(","):
        x = x.strip()
        if not x:
            continue
        try:
            out.append(float(x))
        except ValueError:
            out.append(parse_bandwidth(x, "--bandwidths") / 1e9)
    if not out or any(v <= 0 for v in out):
        raise InputError("command line", "--bandwidths", "needs positive bandwidths")
    return out


@contextmanager
def progress_display(enabled: bool = True):
    """A rich progress bar on stderr; yields ``update(done, total, label)`` (a no-op when disabled)."""
    if not enabled:
        yield lambda desc: (lambda *a: None)
        return
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[label]}"), console=console, transient=False) as prog:
        tasks: dict[str, int] = {}

        def make(desc: str):
            def update(done: int, total: int, label: str = "") -> None:
                if desc not in tasks:
                    tasks[desc] = prog.add_task(desc, total=total, label="")
                prog.update(tasks[desc], completed=done, total=total, label=escape(label))
            return update

        yield make


def sweep_options(f):
    opts = [
        click.option("--planners", "planners_text", metavar="A,B,...",
                     help=f"Planners to compare (default: {', '.join(REPORT_PLANNERS)})."),
        click.option("-O", "--planner-option", "planner_options", multiple=True, metavar="PLANNER.KEY=VALUE",
                     help="An option for one planner, e.g. -O cpsat.time_limit=10 -O reactive.lookahead=2."),
        click.option("--time-limit", type=float,
                     help="The time limit per plan of every planner that takes one (cpsat, exact), in seconds."),
        click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Worker processes for sweep points (results are the same for any number)."),
        click.option("--quiet", "-q", is_flag=True, help="No progress display."),
    ]
    for o in reversed(opts):
        f = o(f)
    return backend_options()(f)


# -- report -----------------------------------------------------------------------------------------------------


@main.command("report", epilog=REPORT_EXAMPLES)
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@hardware_options
@sweep_options
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False),
              help="Report folder (default: ./<graph>.report).")
@click.option("--sweep", "sweep_kinds", multiple=True, type=click.Choice(["budget", "bandwidth"]),
              help="Add a sweep to the report (repeatable).")
@click.option("--fractions", default="0.5,0.6,0.7,0.8,0.9,1.0", show_default=True,
              help="Budget sweep: budgets as shares of the no-offload peak.")
@click.option("--bandwidths", default="20,33.6,40,50,70,100,200,400", show_default=True,
              help="Bandwidth sweep: link bandwidths in GB/s.")
@click.option("--links", "links_text", default="d2h,h2d", show_default=True,
              help="Bandwidth sweep: the links whose bandwidth changes.")
@click.option("--no-trace", is_flag=True, help="Do not write trace.json.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison rows as JSON.")
def report_cmd(graph_path, planners_text, planner_options, time_limit, jobs, quiet, backend_name, ray_address, resume,
               out_dir, sweep_kinds, fractions, bandwidths, links_text, no_trace, as_json, **hw_kw):
    """Run none, reactive, greedy (best of its sweep) and cpsat on GRAPH and write a report folder.

    The folder holds report.md (the comparison table and plots), comparison.json and .csv, PNG plots, a
    Perfetto trace of every plan (trace.json) and the schedule of every valid plan. Exit status 0 when some
    planner found a valid plan, 1 when none did, 2 on bad input.
    """

    def go():
        graph = api.load_graph(graph_path)
        hw = build_hardware(hw_kw)
        names = parse_planners(planners_text)
        options = parse_planner_options(planner_options, time_limit, names)
        fr = parse_floats(fractions, "--fractions")
        bw = parse_bandwidths(bandwidths)
        links = [x.strip() for x in links_text.split(",") if x.strip()]
        out = Path(out_dir or f"{Path(graph_path).name.removesuffix('.json').removesuffix('.onnx')}.report")
        spec = backend_spec(backend_name, jobs, ray_address, out / "sweeps.points.jsonl" if sweep_kinds else None,
                            resume)
        sweeps = []
        with progress_display(not quiet and not as_json) as bar:
            upd = bar("planners")
            done = [0]

            def step(name: str) -> None:
                upd(done[0], len(names), name)
                done[0] += 1

            cmp = compare(graph, hw, names, options, source=graph_path, on_planner=step)
            upd(len(names), len(names), "")
            if "budget" in sweep_kinds:
                sweeps.append(budget_sweep(graph, hw, fr, names, options, jobs, bar("budget sweep"), spec))
            if "bandwidth" in sweep_kinds:
                sweeps.append(bandwidth_sweep(graph, hw, bw, links, names, options, jobs, bar("bandwidth sweep"),
                                              spec))
        files = write_report(out, cmp, sweeps, command=command_line(), trace=not no_trace)
        if as_json:
            click.echo(json.dumps({"report": str(files[0]), "rows": cmp.rows}, indent=1))
        else:
            _print_rows(cmp.rows)
            click.echo(f"report: {files[0]} ({len(files)} files in {out})")
        if not any(r["status"] == VALID for r in cmp.rows):
            sys.exit(1)

    run_guarded(go)


def _print_rows(rows: list[dict]) -> None:
    t = Table(show_header=True, header_style="bold")
    for h in ("planner", "status", "peak HBM", "makespan", "overhead", "stall", "gap vs bound", "solve"):
        t.add_column(h)
    for r in rows:
        status = r["status"] if r["status"] != "invalid" else f"INVALID ({r['violations']})"
        t.add_row(r["planner"], status, fmt_bytes(r["peak_hbm_bytes"]),
                  fmt_time(r["makespan_us"]), fmt_pct(r["overhead"]), fmt_time(r["stall_us"]),
                  fmt_pct(r["gap_vs_bound"]), fmt_seconds(r["solve_time_s"]))
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    console.print(t)


# -- sweep ------------------------------------------------------------------------------------------------------


@main.group("sweep", cls=OneLineGroup, epilog=SWEEP_EXAMPLES)
def sweep_group():
    """Sweeps over HBM budget, link bandwidth or sequence length; each writes JSON, CSV, a PNG and sweep.md."""


def _write_sweep(out: str, sw: dict, as_json: bool) -> None:
    files = write_sweep(Path(out), sw)
    md = f"# ho-plan sweep: {sw['kind']}\n\nMade by `{command_line()}`.\n\n" + sweep_markdown(sw)
    write_atomic(Path(out) / f"sweep-{sw['kind']}.md", md)
    if as_json:
        click.echo(json.dumps(sw, indent=1, sort_keys=True))
    else:
        click.echo(f"sweep written to {out}: " + ", ".join(p.name for p in files) + f", sweep-{sw['kind']}.md")


@sweep_group.command("budget", epilog=SWEEP_EXAMPLES)
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@hardware_options
@sweep_options
@click.option("--fractions", default="0.5,0.6,0.7,0.8,0.9,1.0", show_default=True,
              help="Budgets as shares of the no-offload peak.")
@click.option("-o", "--output", "out_dir", default="sweep-budget", show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the sweep data as JSON.")
def sweep_budget_cmd(graph_path, planners_text, planner_options, time_limit, jobs, quiet, backend_name, ray_address,
                     resume, fractions, out_dir, as_json, **hw_kw):
    """Each planner at HBM budgets given as shares of the no-offload peak: the peak/makespan trade-off."""

    def go():
        graph, hw, names, options = _sweep_inputs(graph_path, hw_kw, planners_text, planner_options, time_limit)
        fr = parse_floats(fractions, "--fractions")
        spec = backend_spec(backend_name, jobs, ray_address, _checkpoint(out_dir, "budget"), resume)
        with progress_display(not quiet) as bar:
            sw = budget_sweep(graph, hw, fr, names, options, jobs, bar("budget sweep"), spec)
        _write_sweep(out_dir, sw, as_json)

    run_guarded(go)


def _checkpoint(out_dir: str, kind: str) -> Path:
    """Where a sweep keeps its points as they finish (``--resume`` reads it back)."""
    return Path(out_dir) / f"sweep-{kind}.points.jsonl"


def _sweep_inputs(graph_path, hw_kw, planners_text, planner_options, time_limit):
    """The graph, hardware, planner names and planner options a sweep command was given."""
    graph = api.load_graph(graph_path)
    hw = build_hardware(hw_kw)
    api.check_compatible(graph, hw, graph_path)
    names = parse_planners(planners_text)
    return graph, hw, names, parse_planner_options(planner_options, time_limit, names)


@sweep_group.command("bandwidth", epilog=SWEEP_EXAMPLES)
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@hardware_options
@sweep_options
@click.option("--bandwidths", default="20,33.6,40,50,70,100,200,400", show_default=True,
              help="Link bandwidths in GB/s (or with units: 40GB/s, 37GiB/s).")
@click.option("--links", "links_text", default="d2h,h2d", show_default=True, help="The links whose bandwidth changes.")
@click.option("-o", "--output", "out_dir", default="sweep-bandwidth", show_default=True,
              type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the sweep data as JSON.")
def sweep_bandwidth_cmd(graph_path, planners_text, planner_options, time_limit, jobs, quiet, backend_name,
                        ray_address, resume, bandwidths, links_text, out_dir, as_json, **hw_kw):
    """Each planner at one HBM budget while the links' bandwidth goes from 20 to 400 GB/s."""

    def go():
        graph, hw, names, options = _sweep_inputs(graph_path, hw_kw, planners_text, planner_options, time_limit)
        links = [x.strip() for x in links_text.split(",") if x.strip()]
        bw = parse_bandwidths(bandwidths)
        spec = backend_spec(backend_name, jobs, ray_address, _checkpoint(out_dir, "bandwidth"), resume)
        with progress_display(not quiet) as bar:
            sw = bandwidth_sweep(graph, hw, bw, links, names, options, jobs, bar("bandwidth sweep"), spec)
        _write_sweep(out_dir, sw, as_json)

    run_guarded(go)


def parse_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(float(lo)), int(float(hi))
    except ValueError:
        raise InputError("command line", "--range", f"{text!r} should be LO:HI, e.g. 8192:262144") from None
    if not sep or a <= 0 or b < a:
        raise InputError("command line", "--range", f"{text!r} should be LO:HI with 0 < LO <= HI")
    return a, b


@sweep_group.command("seqlen", epilog=SWEEP_EXAMPLES)
@click.argument("generator", metavar="GENERATOR")
@hardware_options
@sweep_options
@click.option("-G", "--generator-option", "gen_options", multiple=True, metavar="KEY=VALUE",
              help="An argument of the generator, e.g. -G model=deepseek-v3 -G layers=4.")
@click.option("--range", "range_text", default="4096:262144", show_default=True, help="Sequence lengths LO:HI.")
@click.option("--step", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Bisect over multiples of this many tokens.")
@click.option("--seq-param", default="seq_len", show_default=True, help="The generator's sequence-length argument.")
@click.option("--max-overhead", type=float,
              help="Count a plan as fitting only when at most this much slower than no offload (0.1 = 10%).")
@click.option("-o", "--output", "out_dir", default="sweep-seqlen", show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the sweep data as JSON.")
def sweep_seqlen_cmd(generator, planners_text, planner_options, time_limit, jobs, quiet, backend_name, ray_address,
                     resume, gen_options, range_text, step, seq_param, max_overhead, out_dir, as_json, **hw_kw):
    """Per planner, the longest sequence GENERATOR's graph can run with in the HBM budget (bisection).

    GENERATOR is a workload of `ho-plan generate` (llama3-8b-train, deepseek-v3-train, inference, or a preset such
    as deepseek-v3-nsa-64k, whose values -G overrides) or module:function.
    """

    def go():
        fn = resolve_generator(generator)
        hw = build_hardware(hw_kw)
        names = parse_planners(planners_text)
        options = parse_planner_options(planner_options, time_limit, names)
        args = {k: _option_value(v) for k, v in _pairs(gen_options, "-G").items()}
        _check_generator_args(fn, generator, list(args), seq_param)
        lo, hi = parse_range(range_text)
        spec = backend_spec(backend_name, jobs, ray_address, _checkpoint(out_dir, "seqlen"), resume)
        with progress_display(not quiet) as bar:
            sw = seqlen_sweep(generator, args, hw, lo, hi, step, seq_param, names, options, max_overhead, jobs,
                              bar("sequence-length probes"), spec)
        _write_sweep(out_dir, sw, as_json)
        if not as_json:
            for n in names:
                info = sw["longest"][n]
                v = info["seq_len"]
                click.echo(f"{n}: " + ("nothing fits" if v is None else
                                       (f">= {v}" if info.get("at_least") else f"{v}") + " tokens"))

    run_guarded(go)


def _check_generator_args(fn, generator: str, keys: list[str], seq_param: str) -> None:
    """Each -G key and --seq-param is an argument of the generator: every point would fail otherwise."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for item, k in [*(("-G", k) for k in keys), ("--seq-param", seq_param)]:
        if k not in params:
            raise InputError("command line", item,
                             f"workload {generator!r} takes no argument {k!r} (it takes: {', '.join(params)})")


# -- solutions --------------------------------------------------------------------------------------------------


@main.command("solutions")
@click.option("--root", type=click.Path(file_okay=False, exists=True), default=".", show_default=True,
              help="The repository: graphs/ and solutions/ are under it.")
@click.option("--only", multiple=True, metavar="ENTRY", help="Regenerate just this entry of budgets.json.")
@click.option("--add-missing", is_flag=True,
              help="First add a budgets.json entry (80% of the no-offload peak) for each graph without one.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes for the entries (the local backend).")
@backend_options(resume=False)
def solutions_cmd(root, only, add_missing, jobs, backend_name, ray_address):
    """Regenerate solutions/<entry>.schedule.json for every entry of solutions/budgets.json.

    Each entry is planned with every report planner that exists; the valid plan with the lowest makespan is
    kept. Graphs in graphs/ that have no entry are listed (exit 1) unless --add-missing adds them. Each schedule is
    written as soon as its entry is done; --only reruns the entries an interrupted run did not reach.
    """

    def go():
        spec = backend_spec(backend_name, jobs, ray_address)
        base = Path(root)
        if add_missing:
            S.add_missing(base, log=click.echo)
        missing = S.missing_entries(base)
        S.regenerate(base, list(only) or None, log=click.echo, backend=spec)
        if missing:
            click.echo("no budgets.json entry for: " + ", ".join(str(p) for p in missing)
                       + " (add one, or run with --add-missing)", err=True)
            sys.exit(1)

    run_guarded(go)


# -- paper ------------------------------------------------------------------------------------------------------


@main.command("paper")
@click.option("-o", "--output", "out_dir", default="paper-eval", show_default=True, type=click.Path(file_okay=False),
              help="Folder for paper.md, paper.json and the plots.")
@click.option("--layers", type=click.IntRange(1, 61), default=2, show_default=True,
              help="DeepSeek-V3 layers in the inference graph (of 61).")
@click.option("--decode-steps", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--block", type=click.IntRange(min=1), default=1024, show_default=True,
              help="NSA selection block (tokens): one KV tensor per block and layer.")
@click.option("--seq-max", type=click.IntRange(min=1024), default=262_144, show_default=True,
              help="Longest sequence the bisection tries.")
@click.option("--max-overhead", type=float, default=0.05, show_default=True,
              help="A plan counts (lowest peak, longest sequence) when at most this much slower than no offload.")
@click.option("--train-layers", type=click.IntRange(1, 32), default=2, show_default=True,
              help="LLaMA-3-8B layers in the training graph (of 32).")
@click.option("--bandwidths", default="20,33.6,40,50,70,100,200,400", show_default=True,
              help="Training sweep: D2H/H2D bandwidths in GB/s.")
@sweep_options
def paper_cmd(out_dir, layers, decode_steps, block, seq_max, max_overhead, train_layers, bandwidths, planners_text,
              planner_options, time_limit, jobs, quiet, backend_name, ray_address, resume):
    """The paper's evaluation on our model of its setup (DeepSeek-V3 + NSA inference on ascend-910c at
    33.6 GB/s; the LLaMA-3-8B training bandwidth sweep), written to a folder as paper.md, paper.json and plots.

    Reduced layer counts and cpsat time limits (default 10 s per plan) keep it to a few minutes.
    """

    def go():
        names = parse_planners(planners_text)
        cfg = PaperConfig(layers=layers, decode_steps=decode_steps, block=block, seq_hi=seq_max,
                          max_overhead=max_overhead, time_limit=10.0 if time_limit is None else time_limit,
                          train_layers=train_layers, bandwidths=tuple(parse_bandwidths(bandwidths)), planners=names,
                          jobs=jobs, options=parse_planner_options(planner_options, None, names))
        spec = backend_spec(backend_name, jobs, ray_address, Path(out_dir) / "paper.points.jsonl", resume)
        with progress_display(not quiet) as bar:
            res = run_paper(cfg, bar, spec)
        files = write_paper(out_dir, res, command_line())

        click.echo(inference_table(res))
        click.echo()
        click.echo(training_table(res))
        click.echo(f"\nwritten: {', '.join(str(f) for f in files)}")

    run_guarded(go)
