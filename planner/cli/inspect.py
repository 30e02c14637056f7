"""``ho-plan inspect GRAPH``: what a graph needs before planning (sizes, no-offload peak, HBM floor, budgets).

Registered on ``main`` by ``planner/cli/__init__.py``; a thin layer over ``planner.inspect.inspect_graph``. Bad
input is one line on stderr and exit status 2, as for the other commands.
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from planner import api
from planner.cli.generate import OneLineCommand
from planner.cli.main import build_hardware, graph_options, hardware_options, load_options, main, run_guarded
from planner.hardware import HBM
from planner.inspect import SIMULATE_MAX_OPS, GraphInspection, inspect_graph
from planner.placement import apply_homes, parse_homes
from planner.units import format_bytes, format_time_us

INSPECT_EXAMPLES = """
\b
Examples:
  ho-plan inspect graphs/transformer_block.json
  ho-plan inspect graphs/transformer_block.json --hbm 1GB --simulate --json
  ho-plan inspect graphs/remote_weights_chain.json --hardware cloudmatrix384 --home weight=auto
"""


@main.command("inspect", cls=OneLineCommand, epilog=INSPECT_EXAMPLES)
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@hardware_options
@graph_options
@click.option("--home", "homes", multiple=True, metavar="KIND=TIER|auto",
              help="Where tensors of a kind start the step, overriding the graph, as for the main command.")
@click.option("--simulate/--no-simulate", default=None,
              help=f"Run the no-offload plan in the executor for the no-offload peak and makespan, or take the peak "
                   f"from tensor sizes (an upper bound; no makespan). Default: simulate graphs of at most "
                   f"{SIMULATE_MAX_OPS} ops (the run takes seconds on 30k-op graphs).")
@click.option("--json", "as_json", is_flag=True, help="Print the inspection as one JSON object.")
def inspect_cmd(graph_path, homes, simulate, as_json, **hw_kw):
    """Print what GRAPH needs before planning: sizes by tensor kind and starting tier, the no-offload peak, the
    HBM floor, the compute bound and budgets to try; with --hbm also the makespan lower bound at that budget."""

    def go():
        graph = api.load_graph(graph_path, **load_options(hw_kw))
        at_budget = hw_kw["hbm"] is not None
        hw = build_hardware(hw_kw)
        graph = apply_homes(graph, parse_homes(homes), hw)
        info = inspect_graph(graph, hw, simulate=simulate, at_budget=at_budget, source=graph_path)
        if as_json:
            click.echo(json.dumps(info.to_dict(), indent=1))
            return
        console = Console()
        for table in inspection_tables(info, at_budget):
            console.print(table)

    run_guarded(go)


def inspection_tables(info: GraphInspection, at_budget: bool) -> list[Table]:
    """Return the inspection as rich tables: the figures, the bytes by kind and starting tier, the budgets."""
    figures = Table(title=f"{info.graph} on {info.hardware}", show_header=False, title_justify="left")
    figures.add_column("metric", style="bold")
    figures.add_column("value")
    figures.add_row("ops, tensors", f"{info.ops} ops, {info.tensors} tensors, {format_bytes(info.total_bytes)}")
    if info.no_offload_source == "executor":
        figures.add_row("no-offload peak", f"{format_bytes(info.no_offload_peak_bytes)} (executor run)")
        figures.add_row("no-offload makespan", format_time_us(info.no_offload_makespan_us))
    else:
        figures.add_row("no-offload peak", f"at most {format_bytes(info.no_offload_peak_bytes)} (from tensor sizes in "
                                           "the graph's order; --simulate for the executor's figure)")
        figures.add_row("no-offload makespan", "not simulated (--simulate); at least the compute bound")
    figures.add_row("HBM floor", f"{format_bytes(info.hbm_floor_bytes)}: {info.hbm_floor_reason}")
    figures.add_row("largest working set",
                    f"{format_bytes(info.largest_working_set_bytes)} (op {info.largest_working_set_op!r})")
    figures.add_row("compute bound", f"{format_time_us(info.compute_bound_us)}: {info.compute_bound_reason}")
    if at_budget:
        figures.add_row("HBM budget", format_bytes(info.hbm_bytes))
        figures.add_row("makespan bound at the budget",
                        f"{format_time_us(info.makespan_bound_us)}: {info.makespan_bound_reason}")
    else:
        figures.add_row("device HBM", f"{format_bytes(info.hbm_bytes)} (--hbm BUDGET adds the makespan bound there)")

    tiers = sorted({tier for per in info.start_bytes.values() for tier in per}, key=lambda t: (t != HBM, t))
    kinds = Table(title="tensor bytes by kind and where they start the step", title_justify="left")
    kinds.add_column("kind", style="bold")
    kinds.add_column("total", justify="right")
    for tier in tiers:
        kinds.add_column(f"start {tier}", justify="right")
    kinds.add_column("made by ops", justify="right")
    for kind, total in info.bytes_by_kind.items():
        start = info.start_bytes.get(kind, {})
        kinds.add_row(kind, format_bytes(total), *(format_bytes(start[t]) if t in start else "" for t in tiers),
                      format_bytes(info.made_bytes[kind]) if kind in info.made_bytes else "")

    budgets = Table(title="budgets to try (shares of the no-offload peak)", title_justify="left")
    budgets.add_column("share", justify="right")
    budgets.add_column("HBM budget", justify="right")
    budgets.add_column("against the floor")
    for b in info.budgets:
        budgets.add_row(f"{b.share:.0%}", format_bytes(b.hbm_bytes),
                        "[green]at or above[/]" if b.feasible else "[red]below: no plan fits[/]")
    return [figures, kinds, budgets]
