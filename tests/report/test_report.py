"""ho-plan report: planners side by side, every plan validated, files consistent with each other, plots written."""

import csv
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from conftest import GRAPHS, chain_graph, simple_hardware

from planner.cli import main
from planner.formats import save_graph
from planner.planners import REGISTRY
from planner.report import compare, write_report
from planner.report.compare import ERROR, INFEASIBLE, INVALID, VALID, available_planners
from planner.report.trace import check_trace
from planner.report.writer import flat_row, table_columns

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def small():
    """A chain whose no-offload peak is 230 B (largest working set 210 B); at 215 B something must move."""
    return chain_graph(sizes=(100, 100, 100), durations_us=(5.0, 5.0, 5.0)), simple_hardware(hbm=215)


def test_every_registered_report_planner_runs_and_is_validated():
    g, hw = small()
    cmp = compare(g, hw)
    assert [r["planner"] for r in cmp.rows] == available_planners()
    assert {"none", "reactive"} <= set(cmp.runs)
    for name, run in cmp.runs.items():
        r = run.row
        assert r["status"] in (VALID, INVALID), (name, r["notes"])
        assert r["valid"] == run.timeline.valid == (r["status"] == VALID)
        if r["valid"]:
            assert r["peak_hbm_bytes"] <= hw.hbm_bytes
            assert r["makespan_us"] >= r["makespan_bound_us"]
            assert r["gap_vs_bound"] >= 0


def test_invalid_plan_is_shown_as_invalid_not_dropped():
    g, hw = small()
    cmp = compare(g, hw, ["none", "reactive"])
    none = cmp.runs["none"].row
    assert none["status"] == INVALID and none["violations"] > 0 and "capacity" in none["violation_kinds"]
    assert cmp.runs["reactive"].row["status"] == VALID


def test_budget_below_working_set_is_infeasible_for_every_planner():
    g, _ = small()
    cmp = compare(g, simple_hardware(hbm=100), ["none", "reactive"])
    assert all(r["status"] == INFEASIBLE and r["makespan_us"] is None for r in cmp.rows)
    assert "working set" in cmp.rows[0]["notes"][0]


def test_a_planner_that_crashes_is_an_error_row(monkeypatch):
    def boom(graph, hw, **kw):
        raise RuntimeError("solver fell over")

    monkeypatch.setitem(REGISTRY, "cpsat", replace(REGISTRY["cpsat"], plan=boom))
    g, hw = small()
    cmp = compare(g, hw, ["reactive", "cpsat"])
    row = cmp.runs["cpsat"].row
    assert row["status"] == ERROR and "solver fell over" in row["notes"][0]


def _markdown_table(md: str) -> list[list[str]]:
    lines = md.split("## Planners side by side", 1)[1].splitlines()
    rows = [ln for ln in lines if ln.startswith("| ")]
    out = []
    for ln in rows:
        if set(ln.replace("|", "").strip()) <= {"-", " "}:
            continue
        out.append([c.strip() for c in ln.strip("|").split(" | ")])
        if len(out) > 1 and not lines[lines.index(ln) + 1].startswith("| "):
            break
    return out


def test_report_folder_markdown_csv_json_agree(tmp_path):
    g, hw = small()
    cmp = compare(g, hw, ["none", "reactive"])
    files = write_report(tmp_path, cmp, command="test")
    names = {f.name for f in files}
    assert {"report.md", "comparison.json", "comparison.csv", "hbm_occupancy.png", "trace.json"} <= names
    data = json.loads((tmp_path / "comparison.json").read_text())
    with open(tmp_path / "comparison.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    md = (tmp_path / "report.md").read_text()
    table = _markdown_table(md)
    header, body = table[0], table[1:]
    assert [r["planner"] for r in data["rows"]] == [r["planner"] for r in rows] == [b[0] for b in body]
    cols = table_columns([ln.name for ln in hw.links])
    assert header == [h for _k, h, _f in cols]
    for jrow, crow, mrow in zip(data["rows"], rows, body):
        flat = flat_row(jrow)
        for (key, _h, fmt), cell in zip(cols, mrow):
            if fmt is None:
                continue
            # CSV holds the same number as JSON, and the table shows that number formatted.
            assert crow[key] == ("" if flat[key] is None else str(flat[key])), key
            assert cell == fmt(flat[key]), key
    assert "**INVALID**" in md  # the none plan exceeds 230 B
    assert "violation:" in md


def test_pngs_are_written_and_non_empty(tmp_path):
    g, hw = small()
    from planner.report import bandwidth_sweep, budget_sweep

    sweeps = [budget_sweep(g, hw, (0.8, 1.0), ["none", "reactive"]),
              bandwidth_sweep(g, hw, (0.5, 1, 2), planners=["none", "reactive"])]
    files = write_report(tmp_path, compare(g, hw, ["none", "reactive"]), sweeps)
    pngs = [f for f in files if f.suffix == ".png"]
    assert {p.name for p in pngs} == {"hbm_occupancy.png", "tradeoff.png", "bandwidth.png"}
    for p in pngs:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    md = (tmp_path / "report.md").read_text()
    assert "![trade-off](tradeoff.png)" in md and "## Bandwidth sweep" in md


def test_valid_plans_are_saved_as_schedules_that_validate(tmp_path):
    from planner.fileio import read_json
    from planner.schedule import validate_schedule

    g, hw = small()
    files = write_report(tmp_path, compare(g, hw, ["none", "reactive"]))
    scheds = [f for f in files if f.name.endswith(".schedule.json")]
    assert [f.name for f in scheds] == ["chain.reactive.schedule.json"]  # the invalid none plan is not saved
    assert validate_schedule(read_json(scheds[0]), g, str(scheds[0])).ok


def test_report_command(tmp_path):
    out = tmp_path / "rep"
    r = CliRunner().invoke(main, ["report", str(GRAPHS / "transformer_block.json"), "--hbm", "1.5GB",
                                  "--planners", "none,reactive", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "report:" in r.output
    assert (out / "report.md").exists() and (out / "hbm_occupancy.png").stat().st_size > 10_000
    assert check_trace(json.loads((out / "trace.json").read_text())) == []
    md = (out / "report.md").read_text()
    assert "Made by `ho-plan report" in md


def test_report_command_json_and_sweep(tmp_path):
    g, _ = small()
    path = tmp_path / "chain.json"
    save_graph(g, path)
    r = CliRunner().invoke(main, ["report", str(path), "--hardware", "h100-pcie", "--hbm", "1000",
                                  "--planners", "reactive", "--sweep", "budget", "--fractions", "0.9,1",
                                  "-o", str(tmp_path / "rep"), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [row["planner"] for row in d["rows"]] == ["reactive"]
    sw = json.loads((tmp_path / "rep" / "sweep-budget.json").read_text())
    assert len(sw["points"]) == 2


@pytest.mark.parametrize("args, message", [
    (["--planners", "nosuch"], "unknown planner"),
    (["-O", "lookahead=2"], "PLANNER.OPTION=VALUE"),
    (["--fractions", "a,b", "--sweep", "budget"], "comma-separated"),
])
def test_report_bad_input_exits_2(tmp_path, args, message):
    r = CliRunner().invoke(main, ["report", str(GRAPHS / "transformer_block.json"), "--hbm", "1.5GB",
                                  "-o", str(tmp_path / "r"), "-q", *args])
    assert r.exit_code == 2 and message in r.output


def test_no_valid_plan_exits_1(tmp_path):
    r = CliRunner().invoke(main, ["report", str(GRAPHS / "transformer_block.json"), "--hbm", "100MB",
                                  "--planners", "none,reactive", "-o", str(tmp_path / "r"), "-q"])
    assert r.exit_code == 1
    assert "infeasible" in (tmp_path / "r" / "report.md").read_text()


def test_paper_measures_on_a_tiny_inference_graph():
    """Prefill and decode latencies come from the op names; the KV-free peak drops exactly the KV bytes held."""
    from planner import api
    from planner.executor import simulate
    from planner.planners.none import plan_none
    from planner.report.paper import kv_free_peak, phase_latencies
    from planner.workloads.inference import long_context_inference

    g = long_context_inference(seq_len=2048, decode_steps=3, block=256, layers=1, prefill_chunk=1024)
    hw = api.hardware("ascend-910c")
    plan = plan_none(g, hw)
    tl = simulate(g, hw, plan)
    ph = phase_latencies(plan, tl, 3)
    assert 0 < ph["prefill_us"] < tl.metrics.makespan_ns / 1000
    assert ph["prefill_us"] + 3 * ph["decode_us_per_step"] == pytest.approx(tl.metrics.makespan_ns / 1000)
    kv = sum(t.bytes for t in g.tensors.values() if t.kind.value == "kv_cache")
    free = kv_free_peak(tl)
    assert tl.metrics.peak_bytes["hbm"] - kv <= free < tl.metrics.peak_bytes["hbm"]


def test_paper_command_smoke(tmp_path):
    """ho-plan paper end to end on the smallest setting with the two fast planners."""
    out = tmp_path / "paper"
    r = CliRunner().invoke(main, ["paper", "-o", str(out), "--layers", "1", "--decode-steps", "2",
                                  "--seq-max", "131072", "--train-layers", "1", "--bandwidths", "33.6,70",
                                  "--planners", "none,reactive", "-q"])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "paper.json").read_text())
    inf = res["inference"]
    # Calibration: none fits exactly the 71k-token graph's peak, so its longest sequence is 71k.
    assert inf["rows"]["none"]["longest_seq"]["seq_len"] == 72_704
    assert inf["rows"]["none"]["lowest_peak_bytes"] == inf["budget_bytes"]
    assert 0 < inf["kv_cache_bytes"] and inf["kv_free_peak_bytes"] < inf["budget_bytes"]
    tr = res["training"]
    assert {p["bandwidth_GBps"] for p in tr["points"]} == {33.6, 70.0}
    md = (out / "paper.md").read_text()
    assert "| lowest HBM peak at 71k tokens (GB) | 61.2 | 45.0 |" in md and "Made by `ho-plan paper" in md
    for png in ("paper-seqlen.png", "paper-bandwidth.png"):
        assert (out / png).read_bytes().startswith(PNG_MAGIC)


def test_a_joint_point_takes_the_faster_recompute_off_plan_and_says_so():
    """A plan without re-runs is a joint plan too: the joint row takes it where it is faster, never where slower."""
    from planner.report.paper import take_recompute_off

    def row(tag, planner, bw, ms, status="valid"):
        return {"tag": tag, "planner": planner, "bandwidth_GBps": bw, "makespan_us": ms * 1000, "status": status,
                "notes": [], "seeded_from": None, "peak_hbm_bytes": int(ms)}

    rows = [row("recompute_off", "cpsat", 40, 321.0), row("joint", "cpsat", 40, 330.7),
            row("recompute_off", "cpsat", 20, 466.0), row("joint", "cpsat", 20, 333.6),
            row("recompute_off", "greedy", 20, 500.0, "invalid"), row("joint", "greedy", 20, 600.0, "invalid")]
    take_recompute_off(rows)
    j40, j20, g20 = rows[1], rows[3], rows[5]
    assert j40["makespan_us"] == 321_000 and j40["from_recompute_off"] and j40["peak_hbm_bytes"] == 321
    assert j40["tag"] == "joint" and "recompute-off plan" in j40["notes"][0]
    assert j20["makespan_us"] == 333_600 and not j20["from_recompute_off"]
    assert g20["status"] == "invalid" and not g20["from_recompute_off"]  # an invalid plan is never taken
    assert rows[0]["makespan_us"] == 321_000 and "from_recompute_off" not in rows[0]
