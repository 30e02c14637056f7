"""Recompute steps wherever a plan is shown: the Perfetto trace, the summary (table and --json), the planner
comparison (Markdown, CSV, JSON) and the report's tensor section; and nothing new for plans without them."""

import csv
import json
from dataclasses import replace

from conftest import simple_hardware
from rich.console import Console
from test_executor import offload_plan, skip_graph
from test_executor_recompute import remat_plan

from planner import api
from planner.executor import simulate
from planner.planners import REGISTRY
from planner.report import compare, write_report
from planner.report.trace import COMPUTE_TID, TraceRun, check_trace, chrome_trace
from planner.report.writer import flat_row, table_columns
from planner.summary import summary_dict, summary_table


def remat():
    """skip_graph with a0 dropped after op0 and made again by re-running op0 before op3 (1 us ops, valid)."""
    g, hw = skip_graph(), simple_hardware(hbm=1000)
    plan = remat_plan().build(g.name, "hand")
    tl = simulate(g, hw, plan)
    assert tl.valid, [v.describe() for v in tl.violations]
    return g, hw, plan, tl


# -- trace ------------------------------------------------------------------------------------------------------


def test_trace_marks_a_recomputation_on_the_compute_track():
    g, hw, plan, tl = remat()
    doc = json.loads(json.dumps(chrome_trace([TraceRun(g, hw, plan, tl)])))
    assert check_trace(doc) == []
    (redo,) = [e for e in doc["traceEvents"] if e.get("cat") == "recompute"]
    assert (redo["ph"], redo["name"], redo["tid"]) == ("X", "recompute op0", COMPUTE_TID)
    assert (redo["ts"], redo["dur"]) == (3.0, 1.0)
    assert redo["args"] == {"step": 4, "op": "op0", "op_type": "F", "makes_again": ["a0"], "waits": []}
    # The op's first run is an ordinary slice; the trace sets no colours, so neither does the recomputation.
    (first,) = [e for e in doc["traceEvents"] if e.get("name") == "op0"]
    assert first["cat"] == "F" and first["args"]["step"] == 0
    assert not any("cname" in e for e in doc["traceEvents"])


def test_trace_of_a_plan_without_recomputation_has_no_recompute_events():
    g, hw = skip_graph(), simple_hardware(hbm=1000)
    plan = offload_plan()
    doc = chrome_trace([TraceRun(g, hw, plan, simulate(g, hw, plan))])
    assert not any(e.get("cat") == "recompute" for e in doc["traceEvents"])


# -- summary ----------------------------------------------------------------------------------------------------


def _summary(g, hw, plan, tl) -> tuple[dict, str]:
    result = api.Result(plan, tl, 0.0, api.no_offload_reference(g, hw))
    d = summary_dict(g, hw, result, None)
    console = Console(width=200, record=True)
    console.print(summary_table(d))
    return json.loads(json.dumps(d)), console.export_text()


def test_summary_has_a_recompute_row_when_the_plan_recomputes():
    d, text = _summary(*remat())
    # One re-run of 1 us out of 5 us of compute.
    assert (d["recomputes"], d["recompute_us"], d["recompute_share_of_compute"]) == (1, 1.0, 0.2)
    assert "recompute" in text and "1 op, 1 us (20.0% of compute)" in text


def test_summary_of_a_plan_without_recomputation_is_unchanged():
    g, hw = skip_graph(), simple_hardware(hbm=1000)
    plan = offload_plan()
    tl = simulate(g, hw, plan)
    assert tl.valid
    d, text = _summary(g, hw, plan, tl)
    assert not [k for k in d if "recompute" in k]
    assert "recompute" not in text


# -- comparison and report --------------------------------------------------------------------------------------


def _remat_planner(monkeypatch):
    """Make the registry's cpsat entry return the hand-made recompute plan (cpsat itself is not run)."""
    def plan_remat(graph, hw, **kw):
        return remat_plan().build(graph.name, "cpsat")

    monkeypatch.setitem(REGISTRY, "cpsat", replace(REGISTRY["cpsat"], plan=plan_remat, report_plan=None))


def test_comparison_shows_recompute_columns_that_agree_across_files(tmp_path, monkeypatch):
    _remat_planner(monkeypatch)
    g, hw = skip_graph(), simple_hardware(hbm=1000)
    cmp = compare(g, hw, ["none", "cpsat"])
    rows = {r["planner"]: r for r in cmp.rows}
    assert rows["cpsat"]["valid"] and (rows["cpsat"]["recomputes"], rows["cpsat"]["recompute_us"]) == (1, 1.0)
    assert (rows["none"]["recomputes"], rows["none"]["recompute_us"]) == (0, 0.0)  # filled in: same columns
    write_report(tmp_path, cmp, command="test")
    data = json.loads((tmp_path / "comparison.json").read_text())
    with open(tmp_path / "comparison.csv", newline="") as f:
        csv_rows = list(csv.DictReader(f))
    md = (tmp_path / "report.md").read_text()
    lines = [ln for ln in md.split("## Planners side by side", 1)[1].splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    body = [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines[2:4]]
    cols = table_columns([ln.name for ln in hw.links], recompute=True)
    assert header == [h for _k, h, _f in cols] and {"recomputes", "recompute time"} <= set(header)
    for jrow, crow, mrow in zip(data["rows"], csv_rows, body):
        flat = flat_row(jrow)
        for (key, _h, fmt), cell in zip(cols, mrow):
            if fmt is None:
                continue
            assert crow[key] == ("" if flat[key] is None else str(flat[key])), key
            assert cell == fmt(flat[key]), key
    assert dict(zip(header, body[1]))["recompute time"] == "1 us"
    assert "*Recomputes* are recompute steps" in md


def test_report_tensor_section_and_csv_show_the_recomputed_tensor(tmp_path, monkeypatch):
    _remat_planner(monkeypatch)
    g, hw = skip_graph(), simple_hardware(hbm=1000)
    write_report(tmp_path, compare(g, hw, ["none", "cpsat"]), command="test")
    with open(tmp_path / "tensors.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    (a0,) = [r for r in rows if r["planner"] == "cpsat"]
    assert (a0["tensor"], a0["recomputed_by"], a0["recomputes"], a0["tensor_recompute_us"], a0["tier"]) == (
        "a0", "op0", "1", "1.0", "")
    assert (a0["leave_us"], a0["return_us"], a0["moved_bytes"]) == ("1.0", "3.0", "0")
    md = (tmp_path / "report.md").read_text()
    section = md.split("### cpsat", 1)[1]
    assert "| a0 | activation | 100 B | recomputed | 1 |" in section
    assert "after op0 → recompute op0, before op3 (2 us)" in section
    assert "is *recomputed*" in md
    assert check_trace(json.loads((tmp_path / "trace.json").read_text())) == []


def test_report_without_recomputation_has_no_recompute_columns(tmp_path):
    g, hw = skip_graph(), simple_hardware(hbm=1000)
    cmp = compare(g, hw, ["none"])
    assert not [k for r in cmp.rows for k in r if "recompute" in k]
    write_report(tmp_path, cmp, command="test")
    for name in ("report.md", "comparison.csv", "comparison.json", "tensors.csv"):
        assert "recompute" not in (tmp_path / name).read_text().lower(), name
