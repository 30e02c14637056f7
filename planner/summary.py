"""The plan summary the CLI shows: as plain data (for --json) and as a rich table."""

from __future__ import annotations

from rich.table import Table

from planner.api import Result
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.placement import bytes_by_kind
from planner.quality import Quality
from planner.units import format_bytes, format_time_us


def summary_dict(graph: Graph, hw: Hardware, result: Result, schedule_path: str | None,
                 quality: Quality | None = None) -> dict:
    """Return the summary of a planning run as JSON-ready data (with ``quality``'s bound, gap and proof)."""
    m = result.timeline.metrics
    ref = result.reference.metrics
    return {
        "graph": graph.name,
        "ops": len(graph.ops),
        "tensors": len(graph.tensors),
        "hardware": hw.name,
        "planner": result.plan.planner,
        "status": result.plan.status,
        "valid": result.timeline.valid,
        "violations": [v.describe() for v in result.timeline.violations],
        "hbm_budget_bytes": hw.hbm_bytes,
        "peak_hbm_bytes": m.peak_bytes[HBM],
        "no_offload_peak_hbm_bytes": ref.peak_bytes[HBM],
        "makespan_us": m.makespan_ns / 1000,
        "no_offload_makespan_us": ref.makespan_ns / 1000,
        "overhead": round(result.overhead, 6),
        "bytes_moved": m.bytes_moved,
        # Bytes of each kind that start the step on each tier (tensors no op produces); the planner chose the
        # tiers of those the graph leaves free ("auto").
        "start_placement": bytes_by_kind(graph, result.plan.placement),
        "free_tensors": len(graph.free_tensors),
        "stall_us": m.stall_ns / 1000,
        "hidden_transfer_share": round(m.hidden_share, 6),
        "defrag_events": m.defrag_events,
        "defrag_us": m.defrag_ns / 1000,
        "fragmentation_failures": m.fragmentation_failures,
        "allocator": m.allocator,
        "offset_height_bytes": m.offset_height_bytes,
        **(quality.to_dict() if quality is not None else {}),
        "planner_runtime_s": round(result.runtime_s, 3),
        "notes": list(result.plan.notes),
        "schedule": schedule_path,
    }


def summary_table(d: dict) -> Table:
    """Return the summary as a two-column rich table."""
    title = f"{d['graph']} on {d['hardware']} · planner {d['planner']}"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value")
    budget, peak = d["hbm_budget_bytes"], d["peak_hbm_bytes"]
    color = "green" if peak <= budget else "red"
    table.add_row("valid", "[green]yes[/]" if d["valid"] else f"[red]no: {len(d['violations'])} violation(s)[/]")
    table.add_row(
        "peak HBM", f"[{color}]{format_bytes(peak)}[/] of {format_bytes(budget)} budget ({peak / budget:.1%})"
    )
    table.add_row("no-offload peak", format_bytes(d["no_offload_peak_hbm_bytes"]))
    table.add_row("makespan", format_time_us(d["makespan_us"]))
    table.add_row("no-offload makespan", format_time_us(d["no_offload_makespan_us"]))
    table.add_row("overhead vs no offload", f"{d['overhead']:+.2%}")
    moved = ", ".join(f"{k} {format_bytes(v)}" for k, v in d["bytes_moved"].items() if v) or "nothing"
    table.add_row("bytes moved", moved)
    placement = d.get("start_placement") or {}
    if placement:
        chosen = f" ({d['free_tensors']} tensors placed by the planner)" if d.get("free_tensors") else " (all pinned)"
        table.add_row("start of step" + chosen, "; ".join(
            f"{kind} " + ", ".join(f"{format_bytes(b)} {tier}" for tier, b in tiers.items())
            for kind, tiers in placement.items()))
    if d.get("lower_bound_us") is not None:
        g = d.get("gap_vs_bound")
        table.add_row("lower bound (every plan)", f"{format_time_us(d['lower_bound_us'])}: {d['lower_bound_reason']}")
        table.add_row("gap vs bound", ("n/a" if g is None else f"{g:.2%} at most from optimal")
                      + f" · planner's proof: {d['proof']}")
    table.add_row("compute stall", format_time_us(d["stall_us"]))
    table.add_row("transfer hidden behind compute", f"{d['hidden_transfer_share']:.1%}")
    if d.get("allocator") == "static":
        table.add_row("HBM placement", "static offsets (planned)")
        table.add_row("defragmentation events", "0 (static offsets)")
    else:
        table.add_row("HBM placement", "caching allocator (best fit, splitting, compaction on demand)")
        frag = d.get("fragmentation_failures", 0)
        table.add_row("defragmentation events",
                      f"{d['defrag_events']} ({format_time_us(d.get('defrag_us', 0))}, {frag} fragmentation failures)")
    height = d.get("offset_height_bytes")
    if height is not None:
        what = "highest offset + size" if d.get("allocator") == "static" else "caching allocator's high-water"
        table.add_row("offset height", f"{format_bytes(height)} ({what}; {height / peak:.1%} of peak HBM)"
                      if peak else format_bytes(height))
    table.add_row("planner time", f"{d['planner_runtime_s']:.2f} s")
    if d["schedule"]:
        table.add_row("schedule", d["schedule"])
    return table
