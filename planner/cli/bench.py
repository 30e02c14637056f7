"""``ho-plan bench``: greedy against cpsat over a fixed suite of graphs and budgets (see planner/bench.py).

Registered on ``main`` by ``planner/cli/__init__.py``. Progress goes to stderr; the table to stdout; the rows
to a JSON file with ``-o``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner import api, bench, bench_backends
from planner.cli.backend import backend_options, backend_spec
from planner.cli.main import command_line, main, run_guarded
from planner.errors import InputError
from planner.fileio import write_atomic
from planner.planners import get_spec
from planner.report.writer import markdown_table
from planner.units import format_bytes

BENCH_EXAMPLES = """
\b
Examples:
  ho-plan bench --quick -o bench.json                 # 3 graphs, about 10 minutes at the default limit
  ho-plan bench --only deepseek --budgets 0.6,0.9 --time-limit 60 -o ds.json
  ho-plan bench --suite generated --only 10k --budgets 0.7
  ho-plan bench --suite scale -o scale.json            # greedy and executor speed on the 29k/39k-op graphs
  ho-plan bench --suite checkmate --markdown checkmate.md   # remat-only and joint against Moccasin (issue 13)
  ho-plan bench --suite checkmate --only VGG16 --planners none,greedy --time-limit 10
  ho-plan bench --quick --time-limit 10 --backend ray --ray-address auto -o quick.json   # on a Ray cluster
  ho-plan bench --suite backend --quick --time-limit 10 --jobs 2 --markdown ray.md   # Ray against local, faults
"""


@main.command("bench", epilog=BENCH_EXAMPLES)
@click.option("--suite", "suites", default="paper,checkmate,generated", show_default=True,
              help="Comma-separated: paper (graphs/), checkmate (../shared/graphs/checkmate: the 7 CNN training "
                   "graphs and 4 random graphs at 0.8 and 0.9 of the peak in the graph's order, none once, then "
                   "greedy and cpsat joint and offload=false, against Moccasin), generated, onnx "
                   "(tests/fixtures/onnx), small (up to 12 ops, with --planners ...,exact), fullsize "
                   "(DeepSeek-V3 + NSA 64k, 61 layers, on two presets: slow); or "
                   "scale (greedy and executor speed on the DeepSeek-V3 + NSA 64k and 128k graphs, see --scale-*); "
                   "or backend (the --quick cases on the local pool and on Ray, then a 33-point sweep on Ray with "
                   "a worker killed mid-run: needs the ray extra).")
@click.option("--quick", is_flag=True, help="Only transformer_block, DeepSeek-V3+NSA 64k and the 1k generated graph.")
@click.option("--only", "only", multiple=True, help="Keep the graphs whose name contains this (repeatable).")
@click.option("--budgets", default=None,
              help="Budgets as fractions of the no-offload peak [default: 0.6,0.7,0.8,0.9; checkmate: 0.8,0.9].")
@click.option("--planners", default=None,
              help="Planners to run, each NAME or NAME:KEY=VALUE[:KEY=VALUE] (its -O options, e.g. "
                   "greedy:offload=false) [default: greedy,cpsat; checkmate: "
                   f"{','.join(bench.CHECKMATE_PLANNERS)}].")
@click.option("--time-limit", type=float, default=60.0, show_default=True, help="cpsat's limit per case (s).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True,
              help="cpsat's worker threads: the CPUs each cpsat point asks of the backend.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Local worker processes for the points (--backend local); cpsat points take --workers of them.")
@backend_options()
@click.option("--scale-hbm", default=None, help="scale suite: HBM budget (default 53.8GB).")
@click.option("--scale-layers", type=int, default=None, help="scale suite: layers per graph (default: the presets').")
@click.option("--repeats", type=int, default=1, show_default=True, help="scale suite: executor runs (best kept).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write every row as JSON.")
@click.option("--markdown", type=click.Path(dir_okay=False),
              help="Also write the table and its summary as a Markdown page (e.g. docs/measured/bench-quick.md), "
                   "headed by the command that made it: measured figures in the docs come from here, not by hand.")
def bench_cmd(suites, quick, only, budgets, planners, time_limit, seed, workers, jobs, backend_name, ray_address,
              resume, scale_hbm, scale_layers, repeats, output, markdown):
    """Run the benchmark suite and print greedy against cpsat per graph and budget.

    With -o, every row is also kept in OUTPUT.points.jsonl as it finishes; --resume skips the rows found there.
    """

    def go():
        names_given = [s.strip() for s in suites.split(",") if s.strip()]
        for alone in ("scale", "backend"):
            if alone in names_given and len(names_given) > 1:
                raise InputError("command line", "--suite", f"{alone} runs on its own")
        if "scale" in names_given:
            _scale(bench, scale_hbm or bench.SCALE_HBM, scale_layers, repeats, output, markdown)
            return

        fractions = _fractions(budgets) if budgets is not None else None
        names = _planners(planners) if planners is not None else None
        if resume and not output:
            raise InputError("command line", "--resume", "needs -o: the checkpoint is OUTPUT.points.jsonl")
        if "backend" in names_given:
            if backend_name != "local":
                raise InputError("command line", "--backend", "the backend suite runs both backends itself")
            backend_spec("ray", jobs, ray_address)  # ray installed, or one line saying so
            _backends(quick, only, fractions, names, time_limit, seed, workers, jobs, ray_address, output, markdown)
            return
        spec = backend_spec(backend_name, jobs, ray_address, f"{output}.points.jsonl" if output else None, resume)
        err = Console(stderr=True)
        if "checkmate" in names_given and not quick:  # --quick has no checkmate graph
            found, missing = bench.checkmate_cases(bench.ROOT.parent / "shared")
            if not found and names_given == ["checkmate"]:
                raise InputError("command line", "--suite", "; ".join(missing))
            for line in missing:
                err.print(f"[yellow]skipped:[/] {escape(line)}", highlight=False)
        cases = bench.suite(names_given, quick=quick, only=only)
        if not cases:
            raise InputError("command line", "--only", "no benchmark case matches")
        t0 = time.monotonic()

        def progress(d):
            err.print(f"[dim]{time.monotonic() - t0:7.1f} s {d['done']}/{d['total']}[/] {d['case']} at "
                      f"{_budget(d['fraction'])}: {escape(d['planner'])}", highlight=False)

        rows = bench.run_cases(cases, fractions, names, time_limit, seed, workers, progress, spec)
        if output:
            write_atomic(output, json.dumps({"rows": rows, "comparison": bench.compare(rows)}, indent=1))
        summary: list[str] = []
        for r in rows:
            if r.get("valid") and r.get("phases_us"):
                ph, ref = r["phases_us"], r["no_offload_phases_us"]
                summary.append(f"{_graph_cell(r)} at {_budget(r['budget_fraction'])}, {_planner_cell(r)}: "
                           f"prefill {ph['prefill_us'] / 1000:.1f} ms (no offload {ref['prefill_us'] / 1000:.1f}), "
                           f"decode {ph['decode_us_per_step'] / 1000:.2f} ms/step "
                           f"(no offload {ref['decode_us_per_step'] / 1000:.2f}); weights start "
                           + ", ".join(f"{format_bytes(b)} {tier}" for tier, b in
                                       (r.get("start_placement") or {}).get("weight", {}).items()))
        gaps = bench.true_gaps(rows)
        if gaps:
            summary.append("true gap to the exact optimum (planner/planners/exact.py):")
            for name in dict.fromkeys(g["planner"] for g in gaps):
                mine = sorted(g["gap"] for g in gaps if g["planner"] == name)
                summary.append(f"  {name}: median {mine[len(mine) // 2]:+.2%}, max {mine[-1]:+.2%}, optimal on "
                           f"{sum(1 for g in mine if g <= 1e-9)} of {len(mine)} cases")
        cmp = bench.compare(rows)
        if cmp:
            better = sum(1 for c in cmp if c["change"] < -1e-9)
            worse = sum(1 for c in cmp if c["change"] > 1e-9)
            summary.append(f"cpsat vs greedy: faster on {better}, slower on {worse}, "
                           f"equal on {len(cmp) - better - worse} of {len(cmp)} cases")
        for held in bench.limits_held(rows):
            w = held["worst"]
            summary.append(f"{held['planner']} within its time limit (+{bench.LIMIT_SLACK:.0%}) on {held['held']} of "
                           f"{held['rows']} rows; longest for its limit: {w['graph']} at "
                           f"{_budget(w['budget_fraction'])}, {w['solve_time_s']:.1f} s of {w['time_limit']:g} s")
        if any(r["suite"] == "checkmate" for r in rows):
            summary += _checkmate_summary([r for r in rows if r["suite"] == "checkmate"])
        headers, cells = _cells(rows)
        _show("ho-plan bench", headers, cells, summary, markdown)

    run_guarded(go)


def _fractions(text: str) -> tuple[float, ...]:
    try:
        fractions = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError("command line", "--budgets", f"{text!r} is not a list of fractions") from None
    if not fractions or any(not 0 < f <= 2 for f in fractions):
        raise InputError("command line", "--budgets", "fractions must be in (0, 2]")
    return fractions


def _planners(text: str) -> tuple[str, ...]:
    """The planners the user named, checked before anything runs: a known planner, options it takes (a typo is
    bad input here; the suites' own defaults are not checked, so that an option a planner does not take yet
    costs only its rows)."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise InputError("command line", "--planners", "no planner named")
    for n in names:
        try:
            name, options = bench.planner_variant(n)
        except ValueError as exc:
            raise InputError("command line", "--planners", str(exc)) from None
        get_spec(name, "--planners")
        api.parse_planner_options(name, options, item=f"--planners {name}")
    return names


def _checkmate_summary(rows: list[dict]) -> list[str]:
    """Per planner: valid plans, median and largest overhead, and how often it matches or beats Moccasin."""
    out = ["checkmate (overhead against no offload in the graph's order; Moccasin: CP-SAT remat, 120 s, 2 cores):"]
    for s in bench.planner_summary(rows):
        line = f"  {s['planner']}: valid {s['valid']} of {s['rows']}"
        if s["valid"]:
            line += f", overhead median {s['median_overhead']:+.2%}, max {s['max_overhead']:+.2%}"
        if s["moccasin_rows"]:
            line += f"; matches or beats Moccasin on {s['moccasin_match_or_beat']} of {s['moccasin_rows']}"
        out.append(line)
    for r in rows:
        if not r.get("valid") and r.get("note"):
            note = r["note"] if len(r["note"]) <= 200 else r["note"][:197] + "..."  # the whole note is in -o's rows
            out.append(f"  no valid plan: {r['graph']} at {_budget(r['budget_fraction'])}, {r['planner']}: {note}")
    return out


def _show(title: str, headers: list[str], cells: list[list[str]], summary: list[str], markdown: str | None) -> None:
    """The table on stdout (rich), the summary lines after it, and the Markdown page when asked."""
    t = Table(title=title, title_justify="left")
    for i, col in enumerate(headers):
        t.add_column(col, justify="left" if i == 0 or col == "planner" else "right")
    for row in cells:
        t.add_row(*(escape(c) for c in row))
    out = Console()
    if not out.is_terminal:
        out = Console(width=160)  # a file or a pipe: do not squeeze the table to 80 columns
    out.print(t)
    for line in summary:
        click.echo(line)
    if markdown:
        write_atomic(markdown, bench_markdown(title, headers, cells, summary))


def bench_markdown(title: str, headers: list[str], cells: list[list[str]], summary: list[str]) -> str:
    """The page ``--markdown`` writes: the command that made it, when and where, the table and the summary."""
    made = (f"Written by `{command_line()}` on {datetime.date.today().isoformat()}, {os.cpu_count()} cores "
            f"({platform.machine()}). Rerun the command to update this page; do not edit it by hand.")
    body = [f"# {title}", "", made, "", markdown_table(headers, cells)]
    if summary:
        body += ["", "```text", *summary, "```"]
    return "\n".join(body) + "\n"


def _backends(quick, only, fractions, planners, time_limit, seed, workers, jobs, address, output, markdown) -> None:
    """The backend suite: Ray's overhead against the local pool on the bench cases, then the fault run."""
    err = Console(stderr=True)
    t0 = time.monotonic()

    def log(m: str) -> None:
        err.print(f"[dim]{time.monotonic() - t0:7.1f} s[/] {escape(m)}", highlight=False)

    cost = bench_backends.overhead(quick, only, fractions, planners, time_limit, seed, workers, jobs, address, log)
    hurt = bench_backends.fault(address, log)
    if output:
        write_atomic(output, json.dumps({"overhead": cost, "fault": hurt}, indent=1))
    what = "bench --quick" if quick else "bench"
    headers = ["run", "points", "wall time", "result"]
    cells = [
        [f"{what}, local pool (--jobs {jobs})", str(cost["points"]), f"{cost['local_s']:.1f} s", ""],
        [f"{what}, ray", str(cost["points"]), f"{cost['ray_s']:.1f} s",
         f"overhead {cost['overhead']:+.1%}; {cost['rows_equal']} of {cost['points']} rows equal, "
         f"{cost['errors']} errors"],
        [f"sweep budget {hurt['graph']}, ray, clean", str(hurt["points"]), f"{hurt['clean_s']:.1f} s", ""],
        ["the same, one worker SIGKILLed mid-task", str(hurt["present"]), f"{hurt['faulty_s']:.1f} s",
         f"{hurt['identical']} of {hurt['points']} points identical, {hurt['errors']} errors; killed "
         + (", ".join(f"pid {k['pid']} at {k['after_s']} s" for k in hurt["killed"]) or "nothing (no busy worker)")],
    ]
    summary = [f"cases: {', '.join(cost['cases'])}; cpsat --time-limit {time_limit:g} s, --workers {workers} "
               f"(a cpsat point asks for {workers} CPUs on either backend; rows differ where a time-limited "
               "multi-worker cpsat run does)",
               f"fault sweep: {', '.join(hurt['planners'])} at {len(hurt['fractions'])} budgets "
               f"({hurt['fractions'][0]:g} to {hurt['fractions'][-1]:g} of the no-offload peak); points compared "
               "with the clean run's, timing aside"]
    _show("ho-plan bench --suite backend", headers, cells, summary, markdown)


def _scale(bench, hbm: str, layers: int | None, repeats: int, output: str | None, markdown: str | None) -> None:
    err = Console(stderr=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ho-plan-scale-") as tmp:
        rows = bench.run_scale(Path(tmp), hbm=hbm, layers=layers, repeats=repeats,
                               progress=lambda m: err.print(f"[dim]{time.monotonic() - t0:7.1f} s[/] {m}",
                                                            highlight=False))
    if output:
        write_atomic(output, json.dumps({"scale": rows}, indent=1))
    headers = ["graph", "ops", "steps", "greedy command", "greedy", "executor", "+ caching allocator",
               "+ static offsets"]

    def rate(r: dict, model: str) -> str:
        s = r.get(f"executor_{model}_s")
        if s is None:
            return ""
        return f"{s:.2f} s ({r[f'executor_{model}_steps_per_s'] / 1000:.0f}k steps/s)"

    cells = []
    for r in rows:
        cmd = f"{r['command_s']:.1f} s" + ("" if r["command_exit"] == 0 else f" (exit {r['command_exit']})")
        cells.append([r["graph"], str(r["ops"]), str(r["steps"]), cmd, f"{r['greedy_s']:.1f} s", rate(r, "none"),
                      rate(r, "caching"), rate(r, "static")])
    _show(f"ho-plan bench --suite scale (HBM {hbm})", headers, cells, [], markdown)


def _cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(headers, one row of text per bench row). Checkmate rows add the lower bound, the recompute steps and
    Moccasin's overhead."""
    checkmate = any(r["suite"] == "checkmate" for r in rows)
    headers = ["graph", "ops", "budget", "planner", "makespan", "overhead", "peak HBM", "moved", "gap vs bound",
               "time"]
    if checkmate:
        headers[8:8] = ["recomputes", "bound"]
        headers.append("Moccasin 120 s")
    cells = []
    for r in rows:
        head = [_graph_cell(r), str(r["ops"]), _budget(r["budget_fraction"]), _planner_cell(r)]
        if not r.get("valid"):
            body = ["invalid", "", "", "", "", f"{r.get('solve_time_s') or 0:.1f} s"]
            extra = ["", f"{r['bound_us'] / 1000:.2f} ms"]
        else:
            gap = r.get("gap_vs_bound")
            body = [f"{r['makespan_us'] / 1000:.2f} ms", f"{r['overhead']:+.1%}", format_bytes(r["peak_hbm_bytes"]),
                    format_bytes(r["bytes_moved"]), "" if gap is None else f"{gap:.1%}", f"{r['solve_time_s']:.1f} s"]
            extra = [str(r.get("recompute_steps", 0)), f"{r['bound_us'] / 1000:.2f} ms"]
        if checkmate:
            body[4:4] = extra
            body.append(_moccasin_cell(r))
        cells.append(head + body)
    return headers, cells


def _budget(fraction: float | None) -> str:
    return "no limit" if fraction is None else f"{fraction:.0%}"


def _planner_cell(r: dict) -> str:
    """The planner that ran (greedy-sweep for greedy on graphs of up to ``bench.SWEEP_MAX_OPS`` ops) and the options
    named with it (``greedy:offload=false`` shows as ``greedy-sweep offload=false``)."""
    _, options = bench.planner_variant(r["planner"])
    return " ".join([r.get("planner_run", r["planner"].split(":")[0]), *(f"{k}={v}" for k, v in options.items())])


def _moccasin_cell(r: dict) -> str:
    if "moccasin_overhead" not in r:
        return ""
    ref = r["moccasin_overhead"]
    return "nothing" if ref is None else f"{ref:+.2%}"


def _graph_cell(r: dict) -> str:
    """The graph's name, and the hardware when it is not the default preset."""
    hw = r.get("hardware", "ascend-910c")
    return r["graph"] if hw == "ascend-910c" else f"{r['graph']} ({hw})"
