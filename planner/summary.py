"""The plan summary the CLI shows: as plain data (for --json) and as a rich table."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from planner.api import Result
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.placement import bytes_by_kind
from planner.plan import StepKind
from planner.quality import Quality, SolverOutcome
from planner.tensors import NO_LAYER, MoveTotals, OffloadInterval, TensorView
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
        "status": str(result.plan.status),
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
        # The no-offload plan waits too (on what is pinned remote): the stall the offloading adds is the difference.
        "no_offload_stall_us": ref.stall_ns / 1000,
        "hidden_transfer_share": round(m.hidden_share, 6),
        **_recompute_entries(result),
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


def _recompute_entries(result: Result) -> dict:
    """The plan's recompute steps, their compute time and its share of the compute stream's busy time; empty for a
    plan without any, so the summary of such a plan is what it was before recompute steps existed."""
    count = result.plan.count(StepKind.RECOMPUTE)
    if not count:
        return {}
    m = result.timeline.metrics
    return {"recomputes": count, "recompute_us": m.recompute_ns / 1000,
            "recompute_share_of_compute": round(m.recompute_ns / m.compute_ns, 6) if m.compute_ns else 0.0}


def recompute_text(count: int, us: float, share: float | None = None) -> str:
    """``12 ops, 3.4 ms (2.1% of compute)``: recompute steps and their time (``share``: of all compute)."""
    return f"{count} op{'s' if count != 1 else ''}, {format_time_us(us)}" + (
        "" if share is None else f" ({share:.1%} of compute)")


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
    solver = d.get("solver")
    if solver:
        # cpsat: whether the plan is proven, CP-SAT's own or the starting plan, and why the search stopped.
        table.add_row("solver outcome", escape(SolverOutcome.from_dict(solver).describe()))
    table.add_row("compute stall", format_time_us(d["stall_us"]) + (
        f" (no offload: {format_time_us(d['no_offload_stall_us'])})" if d.get("no_offload_stall_us") else ""))
    table.add_row("transfer hidden behind compute", f"{d['hidden_transfer_share']:.1%}")
    if d.get("recomputes"):
        # Ops re-run to make dropped tensors again: compute time traded for HBM, as transfers trade link time.
        table.add_row("recompute", recompute_text(d["recomputes"], d["recompute_us"], d["recompute_share_of_compute"]))
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


# -- the tensor view (--tensors): rows shared by the rich tables here and report.md -----------------------------


def _byte_time(byte_ns: int) -> str:
    # Bytes x time read as bytes held for one second: 1 GB off HBM for 10 ms is "10 MB·s".
    return f"{format_bytes(byte_ns / 1e9)}·s"


def _interval_text(iv: OffloadInterval) -> str:
    leaves = "starts off HBM" if iv.leave_ns is None else f"after {iv.leaves_after or '?'}"
    if iv.return_ns is None:
        returns = "step end"
    else:
        returns = f"before {iv.returns_before or '?'}" + (", next step" if iv.next_step else "")
        if iv.recomputed_by:
            returns = f"recompute {iv.recomputed_by}, {returns}"
    return f"{leaves} → {returns} ({format_time_us(iv.duration_ns / 1000)})"


def tensor_move_rows(view: TensorView, top: int | None = None) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the moving tensors, most HBM bytes x time freed first (the ``top`` first when given).

    One row per tensor: how often it leaves HBM and its longest interval off HBM; every interval is in
    ``TensorView.to_dict()``. The layer column is there when some name has a layer id; when the plan recomputes,
    "to" says ``recomputed`` for tensors made again and a recompute column has their share of recompute time.
    """
    layered = any(m.layer != NO_LAYER for m in view.moves)
    redo = view.recomputes
    headers = ["tensor", "kind", *(["layer"] if layered else []), "size", "to", "times off",
               "longest time off HBM", "HBM freed (bytes×time)", "stall", *(["recompute"] if redo else [])]
    rows = []
    for m in view.moves[:top]:
        longest = m.largest
        to = list(m.tiers) + ([f"recomputed ×{m.recomputes}" if m.recomputes > 1 else "recomputed"]
                              if m.recomputes else [])
        rows.append([m.name, m.kind, *([m.layer] if layered else []), format_bytes(m.bytes),
                     ", ".join(to) or "-", str(len(m.intervals)),
                     "-" if longest is None else _interval_text(longest), _byte_time(m.freed_byte_ns),
                     format_time_us(m.stall_ns / 1000),
                     *([format_time_us(m.recompute_ns / 1000)] if redo else [])])
    return headers, rows


def peak_rows(view: TensorView, top: int | None = None) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the allocations on HBM at the peak, largest first (the ``top`` first when given)."""
    moving = {m.name for m in view.moves}
    layered = any(r.layer != NO_LAYER for r in view.peak.residents)
    headers = ["allocation", "kind", *(["layer"] if layered else []), "size", "share of peak", "on HBM since",
               "moves"]
    rows = [[r.name, r.kind, *([r.layer] if layered else []), format_bytes(r.bytes), f"{r.share:.1%}",
             format_time_us(r.since_ns / 1000), "yes" if r.name in moving else "no"]
            for r in view.peak.residents[:top]]
    return headers, rows


def move_totals_rows(totals: tuple[MoveTotals, ...] | list[MoveTotals], what: str) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of moving-tensor totals per ``what`` (kind or layer); with a recompute column when some
    tensor is made again by recomputation."""
    redo = any(t.recompute_ns for t in totals)
    headers = [what, "tensors", "size", "times off", "bytes moved", "HBM freed (bytes×time)", "stall",
               *(["recompute"] if redo else [])]
    rows = [[t.key, str(t.tensors), format_bytes(t.bytes), str(t.intervals), format_bytes(t.moved_bytes),
             _byte_time(t.freed_byte_ns), format_time_us(t.stall_ns / 1000),
             *([format_time_us(t.recompute_ns / 1000)] if redo else [])] for t in totals]
    return headers, rows


def tensor_captions(view: TensorView, top: int | None) -> dict[str, str]:
    """The one-line titles and the "and N more" lines of the tensor tables, keyed by table."""
    n, peak = len(view.moves), view.peak
    shown = n if top is None else min(top, n)
    rest = view.moves[shown:]
    shown_peak = len(peak.residents) if top is None else min(top, len(peak.residents))
    return {
        "moves": f"Tensors that move: {n}, by HBM bytes × time freed"
                 + (f" (top {shown})" if shown < n else ""),
        "moves_more": f"... and {len(rest)} more moving tensors ({_byte_time(sum(m.freed_byte_ns for m in rest))} "
                      "freed)" if rest else "",
        "peak": f"On HBM at its peak: {format_bytes(peak.bytes)} at {format_time_us(peak.time_ns / 1000)}, "
                f"{peak.count} allocations" + (f" (largest {shown_peak})" if shown_peak < peak.count else ""),
        "peak_more": f"... and {peak.count - shown_peak} more allocations "
                     f"({format_bytes(peak.bytes - sum(r.bytes for r in peak.residents[:shown_peak]))})"
                     if shown_peak < peak.count else "",
        "by_kind": "Moving tensors by kind",
        "by_layer": "Moving tensors by layer",
    }


def tensor_tables(view: TensorView, top: int | None = 20) -> list:
    """Return the tensor view as rich renderables: moves, the HBM peak, totals per kind (and per layer when
    names have layer ids), each followed by an "and N more" line where rows were left out."""
    caps = tensor_captions(view, top)
    out: list = []

    def add(title: str, headers: list[str], rows: list[list[str]], more: str = "") -> None:
        table = Table(title=title, title_justify="left")
        for h in headers:
            table.add_column(h, overflow="fold")
        for r in rows:
            table.add_row(*(escape(c) for c in r))
        out.append(table)
        if more:
            out.append(more)

    if view.moves:
        add(caps["moves"], *tensor_move_rows(view, top), caps["moves_more"])
    else:
        out.append("No tensor moves: every tensor stays on HBM.")
    add(caps["peak"], *peak_rows(view, top), caps["peak_more"])
    if view.moves:
        add(caps["by_kind"], *move_totals_rows(view.by_kind, "kind"))
        if any(t.key != NO_LAYER for t in view.by_layer):
            add(caps["by_layer"], *move_totals_rows(view.by_layer, "layer"))
    return out
