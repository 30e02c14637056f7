"""Solver-quality reports: planners side by side, sweeps, plots, Perfetto traces, and the report folder.

    from planner.report import compare, write_report
    cmp = compare(graph, hw)              # none, reactive, greedy (best of its sweep), cpsat: whichever exist
    write_report("out/report", cmp)       # report.md, comparison.json/.csv, PNG plots, trace.json, schedules

Modules: ``compare`` (rows), ``sweeps`` (budget, bandwidth, sequence length), ``plots`` (matplotlib, Agg),
``trace`` (Chrome / Perfetto JSON), ``writer`` (the folder), ``paper`` (the paper's evaluation on our model).
"""

from planner.planners import REPORT_PLANNERS
from planner.report.compare import Comparison, available_planners, compare
from planner.report.sweeps import bandwidth_sweep, budget_sweep, seqlen_sweep
from planner.report.trace import TraceRun, check_trace, chrome_trace, write_trace
from planner.report.writer import write_report, write_sweep

__all__ = [
    "REPORT_PLANNERS", "Comparison", "available_planners", "compare", "budget_sweep", "bandwidth_sweep",
    "seqlen_sweep", "TraceRun", "chrome_trace", "write_trace", "check_trace", "write_report", "write_sweep",
]
