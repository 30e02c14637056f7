"""The report folder: ``report.md`` (tables and plots), ``comparison.json`` / ``comparison.csv`` (the same rows
in machine units), ``tensors.csv`` (every tensor that moves, per planner), sweep data (``sweep-<kind>.json`` /
``.csv``), PNG plots, the Perfetto trace of every plan, and the schedule file of every valid plan.

The Markdown table is built from the very rows written to JSON and CSV, with the formatters below, so the three
always agree.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from planner.fileio import write_atomic
from planner.quality import solver_outcome
from planner.report import plots
from planner.report.compare import INVALID, VALID, Comparison
from planner.report.trace import TraceRun, write_trace
from planner.schedule import write_schedule
from planner.summary import move_totals_rows, peak_rows, tensor_captions, tensor_move_rows
from planner.tensors import TensorView, tensor_view
from planner.units import format_bytes, format_time_us

# -- formatting, shared by the Markdown tables and the tests ----------------------------------------------------


def fmt_bytes(v) -> str:
    return "–" if v is None else format_bytes(v)


def fmt_time(v) -> str:
    return "–" if v is None else format_time_us(v)


def fmt_pct(v) -> str:
    return "–" if v is None else f"{100 * v:+.1f}%"


def fmt_share(v) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def fmt_int(v) -> str:
    return "–" if v is None else str(int(v))


def fmt_seconds(v) -> str:
    return "–" if v is None else f"{v:.2f} s"


def fmt_status(row: dict) -> str:
    if row["status"] == INVALID:
        kinds = ", ".join(row["violation_kinds"])
        return f"**INVALID** ({row['violations']} violations: {kinds})"
    if row["status"] == VALID:
        return "valid"
    return f"**{row['status']}**"


def table_columns(link_names: list[str], recompute: bool = False) -> list[tuple[str, str, object]]:
    """(csv column, Markdown header, formatter) for the comparison table; ``recompute``: with the recompute steps
    and their time (when some compared plan recomputes: tables of other plans stay as they were)."""
    cols: list[tuple[str, str, object]] = [
        ("planner", "planner", str),
        ("status", "status", None),  # fmt_status takes the whole row
        ("peak_hbm_bytes", "peak HBM", fmt_bytes),
        ("makespan_us", "makespan", fmt_time),
        ("overhead", "overhead vs no offload", fmt_pct),
    ]
    for ln in link_names:
        cols.append((f"bytes_moved_{ln}", f"moved {ln}", fmt_bytes))
    cols += [
        ("start_remote_bytes", "starts off HBM", fmt_bytes),
        ("stall_us", "compute stall", fmt_time),
        *([("recomputes", "recomputes", fmt_int), ("recompute_us", "recompute time", fmt_time)] if recompute else []),
        ("hidden_transfer_share", "transfer hidden", fmt_share),
        ("defrag_events", "defrag events", fmt_int),
        ("gap_vs_bound", "gap vs bound", fmt_pct),
        ("solve_time_s", "solve time", fmt_seconds),
    ]
    return cols


CSV_EXTRA = ("valid", "violations", "violation_kinds", "plan_status", "hbm_budget_bytes", "makespan_bound_us",
             "solver_bound_us", "defrag_us", "fragmentation_failures", "allocator", "offset_height_bytes", "notes")


def flat_row(row: dict) -> dict:
    """A comparison row with ``bytes_moved`` spread into ``bytes_moved_<link>`` columns and lists joined."""
    out = {k: v for k, v in row.items()
           if k not in ("bytes_moved", "peak_bytes", "first_violations", "options", "start_placement")}
    for ln, v in row.get("bytes_moved", {}).items():
        out[f"bytes_moved_{ln}"] = v
    out["violation_kinds"] = " ".join(row.get("violation_kinds", []))
    out["notes"] = " | ".join(row.get("notes", []))
    return out


def to_csv(rows: list[dict], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    return buf.getvalue()


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def any_recompute(cmp_rows: list[dict]) -> bool:
    """Whether some row's plan has recompute steps (``compare.metrics_row`` writes ``recomputes`` only then)."""
    return any(r.get("recomputes") for r in cmp_rows)


def comparison_table(cmp_rows: list[dict], link_names: list[str]) -> tuple[str, list[str]]:
    """(Markdown table, csv columns) of the comparison rows."""
    cols = table_columns(link_names, any_recompute(cmp_rows))
    flat = [flat_row(r) for r in cmp_rows]
    body = []
    for r, f in zip(cmp_rows, flat):
        body.append([fmt_status(r) if fmt is None else fmt(f.get(key)) for key, _h, fmt in cols])
    return markdown_table([h for _k, h, _f in cols], body), [k for k, _h, _f in cols] + list(CSV_EXTRA)


# -- sweeps -----------------------------------------------------------------------------------------------------

SWEEP_COLUMNS = {
    "budget": ["planner", "fraction", "hbm_budget_bytes", "status", "peak_hbm_bytes", "makespan_us", "overhead",
               "stall_us", "defrag_events", "gap_vs_bound"],
    "bandwidth": ["planner", "bandwidth_GBps", "hbm_budget_bytes", "status", "peak_hbm_bytes", "makespan_us",
                  "overhead", "stall_us", "defrag_events", "gap_vs_bound", "no_offload_makespan_us"],
    "seqlen": ["planner", "seq_len", "fits", "status", "peak_hbm_bytes", "makespan_us", "overhead", "stall_us"],
}
SWEEP_FORMAT = {
    "fraction": lambda v: f"{100 * v:.0f}%", "hbm_budget_bytes": fmt_bytes, "peak_hbm_bytes": fmt_bytes,
    "makespan_us": fmt_time, "no_offload_makespan_us": fmt_time, "overhead": fmt_pct, "stall_us": fmt_time,
    "defrag_events": fmt_int, "gap_vs_bound": fmt_pct, "bandwidth_GBps": lambda v: f"{v:g} GB/s",
    "seq_len": lambda v: f"{v:,}", "fits": lambda v: "yes" if v else "no",
}
SWEEP_HEADERS = {
    "fraction": "budget (share of no-offload peak)", "hbm_budget_bytes": "HBM budget", "peak_hbm_bytes": "peak HBM",
    "makespan_us": "makespan", "overhead": "overhead vs no offload", "stall_us": "compute stall",
    "defrag_events": "defrag events", "gap_vs_bound": "gap vs bound", "bandwidth_GBps": "bandwidth",
    "no_offload_makespan_us": "no-offload makespan", "seq_len": "sequence length",
}


def sweep_table(sweep: dict) -> str:
    cols = SWEEP_COLUMNS[sweep["kind"]]
    rows = [[SWEEP_FORMAT.get(c, str)(p.get(c)) if p.get(c) is not None else "–" for c in cols]
            for p in sweep["points"]]
    return markdown_table([SWEEP_HEADERS.get(c, c) for c in cols], rows)


def sweep_csv(sweep: dict) -> str:
    cols = SWEEP_COLUMNS[sweep["kind"]] + ["valid", "solve_time_s"]
    rows = [{**p, "solve_time_s": (p.get("timing") or {}).get("solve_time_s")} for p in sweep["points"]]
    return to_csv(rows, cols)


def longest_table(sweep: dict) -> str:
    rows = []
    for n in sweep["planners"]:
        info = sweep["longest"][n]
        v = info["seq_len"]
        seq = "nothing fits" if v is None else (f"≥ {v:,}" if info.get("at_least") else f"{v:,}")
        rows.append([n, seq, fmt_bytes(info.get("peak_hbm_bytes")), fmt_time(info.get("makespan_us")),
                     fmt_pct(info.get("overhead")),
                     "–" if info.get("first_failing") is None else f"{info['first_failing']:,}"])
    return markdown_table(["planner", "longest sequence that fits", "peak HBM there", "makespan there",
                           "overhead there", "first length that does not fit"], rows)


def write_sweep(out: Path, sweep: dict, plot: bool = True) -> list[Path]:
    """Write ``sweep-<kind>.json`` / ``.csv`` and its plot into ``out``; return the paths."""
    kind = sweep["kind"]
    files = [out / f"sweep-{kind}.json", out / f"sweep-{kind}.csv"]
    write_atomic(files[0], json.dumps(sweep, indent=1, sort_keys=True) + "\n")
    write_atomic(files[1], sweep_csv(sweep))
    if plot:
        fn = {"budget": plots.tradeoff_plot, "bandwidth": plots.bandwidth_plot, "seqlen": plots.seqlen_plot}[kind]
        name = {"budget": "tradeoff.png", "bandwidth": "bandwidth.png", "seqlen": "seqlen.png"}[kind]
        files.append(fn(sweep, out / name))
    return files


def sweep_markdown(sweep: dict) -> str:
    kind = sweep["kind"]
    if kind == "budget":
        shares = ", ".join(f"{f:.0%}" for f in sweep["fractions"])
        head = (f"## HBM budget sweep\n\nEach planner at budgets of {shares} of the no-offload peak "
                f"({fmt_bytes(sweep['no_offload_peak_hbm_bytes'])}).\n\n![trade-off](tradeoff.png)")
    elif kind == "bandwidth":
        head = (f"## Bandwidth sweep\n\nLinks {', '.join(sweep['links'])} at "
                f"{', '.join(f'{b:g}' for b in sweep['bandwidths_GBps'])} GB/s, HBM budget "
                f"{fmt_bytes(sweep['hbm_budget_bytes'])}; overhead is against no offload with unbounded HBM at the "
                "same bandwidth.\n\n![bandwidth](bandwidth.png)")
    else:
        mo = sweep.get("max_overhead")
        limit = "" if mo is None else f" and at most {mo:.0%} slower than no offload"
        args = ", ".join(f"{k}={v}" for k, v in sorted(sweep["generator_args"].items()))
        head = (f"## Longest sequence that fits\n\n`{sweep['generator']}({args})`, {sweep['seq_param']} "
                f"bisected over {sweep['range'][0]:,}..{sweep['range'][1]:,} in steps of {sweep['step']:,}; "
                f"fits = a valid plan "
                f"within {fmt_bytes(sweep['hbm_budget_bytes'])} of HBM{limit}.\n\n"
                f"{longest_table(sweep)}\n\n![longest sequence](seqlen.png)\n\nEvery probe:")
    return head + "\n\n" + sweep_table(sweep) + "\n"


# -- tensors that move -----------------------------------------------------------------------------------------

TENSORS_CSV_COLUMNS = ["planner", "tensor", "kind", "layer", "bytes", "start_tier", "interval", "intervals", "tier",
                       "leaves_after", "returns_before", "returns_next_step", "wraps", "leave_us", "return_us",
                       "off_hbm_us", "freed_byte_s", "stall_us", "tensor_freed_byte_s", "tensor_stall_us",
                       "moved_bytes"]
# Added to TENSORS_CSV_COLUMNS when some plan recomputes: the op whose recomputation ends an interval, the tensor's
# recompute steps and its share of their time.
TENSORS_CSV_RECOMPUTE = ["recomputed_by", "recomputes", "tensor_recompute_us"]
# Moving tensors per planner in report.md; tensors.csv has them all.
REPORT_TENSORS_TOP = 10


def tensors_csv(views: dict[str, TensorView]) -> str:
    """One row per interval off HBM of every moving tensor, per planner (a tensor that never leaves HBM, only
    copied or starting elsewhere, gets one row without an interval); tensor-level totals repeat on each row. The
    recompute columns are there when some plan recomputes."""
    rows = []
    for planner, view in views.items():
        for m in view.moves:
            d = m.to_dict()
            base = {"planner": planner, "tensor": m.name, "kind": m.kind, "layer": m.layer, "bytes": m.bytes,
                    "start_tier": m.start_tier, "intervals": len(m.intervals),
                    "tensor_freed_byte_s": d["freed_byte_s"], "tensor_stall_us": d["stall_us"],
                    "moved_bytes": sum(m.moved_bytes.values()), "recomputes": m.recomputes,
                    "tensor_recompute_us": d["recompute_us"]}
            if not m.intervals:
                rows.append(base)
            for j, iv in enumerate(m.intervals, start=1):
                rows.append({**base, **iv.to_dict(), "interval": j, "freed_byte_s": iv.freed_byte_ns(m.bytes) / 1e9})
    redo = any(v.recomputes for v in views.values())
    return to_csv(rows, TENSORS_CSV_COLUMNS + (TENSORS_CSV_RECOMPUTE if redo else []))


def tensors_markdown(views: dict[str, TensorView], top: int = REPORT_TENSORS_TOP) -> str:
    """The report.md section on which tensors move and why, one subsection per planner that made a plan."""
    redo = any(v.recomputes for v in views.values())
    lines = ["## Which tensors move, and why", "",
             f"Per planner, the {top} moving tensors (a Prefetch, Store or Detach of it in the plan, or it starts the "
             "step off HBM) that free the most HBM bytes × time, each with its longest interval off HBM: the op "
             "after which it leaves, the op before which it returns, and the compute stall its transfers cause; "
             "then what is on HBM at its peak, and totals per tensor kind (and layer). Every moving tensor and "
             "every interval: `tensors.csv`."
             + (" A tensor dropped with no copy and made again by re-running its op is *recomputed*; *recompute* is "
                "the compute time of those re-runs (a re-run that makes several tensors is split among them)."
                if redo else ""), ""]
    for planner, view in views.items():
        caps = tensor_captions(view, top)
        lines += [f"### {planner}", ""]
        if view.moves:
            lines += [f"**{caps['moves']}**", "", markdown_table(*tensor_move_rows(view, top)), ""]
            if caps["moves_more"]:
                lines += [caps["moves_more"], ""]
        else:
            lines += ["No tensor moves: every tensor stays on HBM.", ""]
        lines += [f"**{caps['peak']}**", "", markdown_table(*peak_rows(view, top)), ""]
        if caps["peak_more"]:
            lines += [caps["peak_more"], ""]
        if view.moves:
            lines += [f"**{caps['by_kind']}**", "", markdown_table(*move_totals_rows(view.by_kind, "kind")), ""]
            if any(t.key != "-" for t in view.by_layer):
                lines += [f"**{caps['by_layer']}**", "", markdown_table(*move_totals_rows(view.by_layer, "layer")),
                          ""]
    return "\n".join(lines)


# -- the report -------------------------------------------------------------------------------------------------


def write_report(out_dir: str | Path, cmp: Comparison, sweeps: list[dict] | None = None, command: str | None = None,
                 trace: bool = True, schedules: bool = True) -> list[Path]:
    """Write the report folder for ``cmp`` (and any sweeps); return the files written, report.md first."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    links = [ln.name for ln in cmp.hw.links]
    table, csv_cols = comparison_table(cmp.rows, links)
    data = cmp.to_dict()
    data["command"] = command
    write_atomic(out / "comparison.json", json.dumps(data, indent=1, sort_keys=True) + "\n")
    write_atomic(out / "comparison.csv", to_csv([flat_row(r) for r in cmp.rows], csv_cols))
    files += [out / "comparison.json", out / "comparison.csv"]
    panels = [(name, run.timeline.residencies if run.timeline else (),
               run.row.get("peak_hbm_bytes")) for name, run in cmp.runs.items()]
    labelled = [(f"{n} ({cmp.runs[n].row['status']}, makespan {fmt_time(cmp.runs[n].row['makespan_us'])})", res, pk)
                for n, res, pk in panels]
    files.append(plots.occupancy_plot(labelled, cmp.hw.hbm_bytes, out / "hbm_occupancy.png",
                                      title=f"{cmp.graph.name}: HBM occupancy by tensor kind"))
    traced = [TraceRun(cmp.graph, cmp.hw, r.plan, r.timeline, n) for n, r in cmp.runs.items()
              if r.plan is not None and r.timeline is not None and r.timeline.steps]
    if trace and traced:
        write_trace(out / "trace.json", traced)
        files.append(out / "trace.json")
    if schedules:
        for n, r in cmp.runs.items():
            if r.plan is not None and r.timeline is not None and r.timeline.valid:
                p = out / "schedules" / f"{cmp.graph.name}.{n}.schedule.json"
                write_schedule(p, cmp.graph, cmp.hw, r.plan, r.timeline)
                files.append(p)
    views = {n: tensor_view(cmp.graph, r.plan, r.timeline) for n, r in cmp.runs.items()
             if r.plan is not None and r.timeline is not None and r.timeline.steps}
    if views:
        write_atomic(out / "tensors.csv", tensors_csv(views))
        files.append(out / "tensors.csv")
    sweep_parts = []
    for sw in sweeps or []:
        files += write_sweep(out, sw)
        sweep_parts.append(sweep_markdown(sw))
    md = report_markdown(cmp, table, sweep_parts, command, [f.relative_to(out) for f in files],
                         tensors_markdown(views) if views else None)
    write_atomic(out / "report.md", md)
    return [out / "report.md", *files]


def report_markdown(cmp: Comparison, table: str, sweep_parts: list[str], command: str | None,
                    files: list[Path], tensors_part: str | None = None) -> str:
    g, hw = cmp.graph, cmp.hw
    info = cmp.to_dict()
    ref = info["no_offload"]
    b = cmp.bounds
    links = ", ".join(f"{ln.name} {ln.bandwidth_Bps / 1e9:g} GB/s ×{ln.channels}" for ln in hw.links)
    lines = [
        f"# ho-plan report: {g.name} on {hw.name}, HBM budget {fmt_bytes(hw.hbm_bytes)}",
        "",
        *([f"Made by `{command}`.", ""] if command else []),
        f"- graph: {len(g.ops)} ops, {len(g.tensors)} tensors, {fmt_bytes(info['graph']['total_bytes'])} in all"
        + (f", KV cache {fmt_bytes(info['graph']['kv_cache_bytes'])}" if info["graph"]["kv_cache_bytes"] else ""),
        f"- hardware: {hw.name}; tiers {', '.join(f'{t.name} {fmt_bytes(t.capacity_bytes)}' for t in hw.tiers)}; "
        f"links {links}",
        f"- no offload with unbounded HBM: peak {fmt_bytes(ref['peak_hbm_bytes'])}, makespan "
        f"{fmt_time(ref['makespan_us'])}",
        f"- lower bounds: makespan ≥ {fmt_time(b['makespan_us']['value'])} ({b['makespan_us']['reason']}); "
        f"peak HBM ≥ {fmt_bytes(b['peak_hbm_bytes']['value'])} ({b['peak_hbm_bytes']['reason']})",
        "",
        "## Planners side by side",
        "",
        "Every plan was run in the timeline executor. *Overhead* is the makespan over no offload with unbounded "
        "HBM; *gap vs bound* is the makespan over the makespan lower bound; *solve time* is the planner's wall "
        "time on this machine. Greedy is at the best setting of its sweep."
        + (" *Recomputes* are recompute steps (an op re-run to make its dropped outputs again), *recompute time* "
           "their compute time, part of the makespan." if any_recompute(cmp.rows) else ""),
        "",
        table,
        "",
    ]
    for name, run in cmp.runs.items():
        r = run.row
        extra = []
        if r["status"] == INVALID:
            extra += [f"  - violation: `{v}`" for v in r["first_violations"]]
            if r["violations"] > len(r["first_violations"]):
                extra.append(f"  - ... and {r['violations'] - len(r['first_violations'])} more")
        extra += [f"  - note: {n}" for n in r["notes"]]
        outcome = solver_outcome(run.plan) if run.plan is not None else None
        if outcome is not None:
            # cpsat: proven optimal, its own solution or the starting plan; why the search stopped; CP-SAT's bound.
            extra.append(f"  - solver: {outcome.describe()}")
        if extra:
            lines.append(f"- **{name}** ({r['status']}):")
            lines += extra
    lines += ["", "## HBM occupancy", "",
              "Bytes on HBM over time, stacked by tensor kind; the dashed line is the budget.", "",
              "![HBM occupancy](hbm_occupancy.png)", ""]
    if tensors_part:
        lines += [tensors_part, ""]
    for part in sweep_parts:
        lines += [part, ""]
    lines += ["## Files", ""]
    desc = {"comparison.json": "the comparison rows, bounds, graph and hardware (machine units)",
            "comparison.csv": "the comparison rows, one per planner",
            "trace.json": "Perfetto / Chrome trace of every plan (open in https://ui.perfetto.dev)",
            "hbm_occupancy.png": "HBM occupancy plot",
            "tensors.csv": "every tensor that moves, one row per interval off HBM, per planner"}
    for f in files:
        lines.append(f"- `{f}`" + (f": {desc[str(f)]}" if str(f) in desc else ""))
    return "\n".join(lines) + "\n"


__all__ = ["write_report", "write_sweep", "comparison_table", "tensors_csv", "tensors_markdown",
           "sweep_table", "flat_row", "to_csv", "fmt_bytes",
           "fmt_time", "fmt_pct", "fmt_share", "fmt_int", "fmt_seconds", "fmt_status", "table_columns",
           "sweep_markdown", "longest_table", "any_recompute"]
