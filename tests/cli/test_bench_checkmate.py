"""``ho-plan bench --suite checkmate`` (issue 13): its cases, its budgets (fractions of the no-offload peak in the
graph's own order, as Moccasin's) and a one-graph run. The full suite is a benchmark, never run here; tests use
planners and options that exist today, so they hold before and after ``offload``/``recompute`` land."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import SHARED

from planner import api, bench
from planner.cli import main
from planner.executor import simulate
from planner.hardware import HBM
from planner.planners.none import plan_none

CHECKMATE = SHARED / "graphs" / "checkmate"
needs_shared = pytest.mark.skipif(not CHECKMATE.is_dir(), reason="../shared/graphs/checkmate is not here")


def fake_shared(tmp_path, files=None):
    """A ``shared`` folder holding (empty) files of the checkmate suite: cases load lazily, so none is read."""
    folder = tmp_path / "graphs" / "checkmate"
    folder.mkdir(parents=True)
    for _, file, _ in bench.CHECKMATE_GRAPHS if files is None else files:
        (folder / file).write_text("{}")
    return tmp_path


def test_checkmate_cases_are_the_issues_graphs_budgets_and_planners(tmp_path):
    cases = bench.suite(["checkmate"], shared=fake_shared(tmp_path))
    assert [c.name for c in cases] == ["VGG16", "VGG19", "MobileNet", "ResNet50", "fcn_8", "fcn_8-moccasin-cost",
                                       "segnet", "vgg_unet", "random_n100", "random_n250", "random_n500",
                                       "random_n1000"]
    for c in cases:
        assert c.suite == "checkmate" and c.preset == "ascend-910c"
        assert c.fractions == (0.8, 0.9)
        assert c.reference_order == "graph" and c.once == ("none",)
        assert c.info["file"].endswith("_train_nx.json") or c.info["file"].startswith("random_layered_n")
        # The random graphs' unitless sizes are read as megabytes; the CNNs' are bytes already.
        assert c.info["import_options"] == ({"size_unit_bytes": 1e6} if c.name.startswith("random") else
                                            {"time_unit_s": 7.5e-15} if c.name == "fcn_8-moccasin-cost" else {})
    variants = [bench.planner_variant(p) for p in cases[0].planners]
    assert variants == [("none", {}), ("greedy", {}), ("greedy", {"offload": "false"}), ("cpsat", {}),
                        ("cpsat", {"offload": "false"})]
    by_name = {c.name: c for c in cases}
    assert by_name["VGG16"].moccasin == {0.9: 0.0197}
    assert by_name["MobileNet"].moccasin == {0.8: 0.0037, 0.9: 0.0016}
    assert by_name["ResNet50"].moccasin == {0.8: None, 0.9: None}  # nothing within 120 s
    assert by_name["random_n1000"].moccasin == {}  # the issue quotes no figure
    # Moccasin's FCN8 figures are in its cost model (MACs): only the case read that way is compared with them.
    assert by_name["fcn_8"].moccasin == {} and by_name["fcn_8-moccasin-cost"].moccasin == {0.8: 0.0014, 0.9: 0.0003}
    assert [c.name for c in bench.suite(["checkmate"], only=["VGG1"], shared=tmp_path)] == ["VGG16", "VGG19"]


def test_missing_checkmate_graphs_are_named(tmp_path):
    assert bench.suite(["checkmate"], shared=tmp_path) == []
    cases, missing = bench.checkmate_cases(tmp_path)
    assert cases == [] and len(missing) == 1 and "is not here" in missing[0]
    cases, missing = bench.checkmate_cases(fake_shared(tmp_path, bench.CHECKMATE_GRAPHS[:1]))
    assert [c.name for c in cases] == ["VGG16"] and len(missing) == len(bench.CHECKMATE_GRAPHS) - 1


def test_cli_says_when_the_checkmate_graphs_are_absent(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "ROOT", tmp_path / "main")
    res = CliRunner().invoke(main, ["bench", "--suite", "checkmate", "--planners", "none"])
    assert res.exit_code == 2 and "checkmate" in res.output and "is not here" in res.output


def test_planner_variants_parse_and_bad_ones_are_bad_input():
    assert bench.planner_variant("cpsat:offload=false:workers=1") == ("cpsat", {"offload": "false", "workers": "1"})
    with pytest.raises(ValueError):
        bench.planner_variant("greedy:offload")
    for bad in ("greedy:no_such_option=1", "greedy:offload", "nosuchplanner"):
        res = CliRunner().invoke(main, ["bench", "--suite", "small", "--planners", bad])
        assert res.exit_code == 2, (bad, res.output)


@needs_shared
def test_checkmate_budgets_are_fractions_of_the_peak_in_the_graphs_own_order():
    case = next(c for c in bench.suite(["checkmate"], only=["random_n100"]) if c.name == "random_n100")
    graph = case.load()
    unbounded = api.hardware("ascend-910c", hbm="1PB")
    peak = simulate(graph, unbounded, plan_none(graph, unbounded, order="graph")).metrics.peak_bytes[HBM]
    assert bench.no_offload_reference(graph, "ascend-910c", {}, "graph").metrics.peak_bytes[HBM] == peak
    rows = bench.run_case(case, planners=("none", "reactive"))
    ref, *budgeted = rows
    assert ref["planner"] == "none" and ref["budget_fraction"] is None and ref["valid"]
    assert ref["peak_hbm_bytes"] == peak and ref["overhead"] == 0 and ref["plan_options"]["order"] == "graph"
    assert [(r["budget_fraction"], r["budget_bytes"]) for r in budgeted] == [(0.8, int(peak * 0.8)),
                                                                            (0.9, int(peak * 0.9))]
    for r in budgeted:
        assert r["no_offload_peak_bytes"] == peak and r["no_offload_makespan_us"] == ref["makespan_us"]
        assert r["moccasin_overhead"] == bench.MOCCASIN_120S[("random_n100", r["budget_fraction"])]
        assert r["valid"] and r["peak_hbm_bytes"] <= r["budget_bytes"]
        assert r["recompute_steps"] == 0 and r["bound_us"] > 0


@needs_shared
def test_an_option_a_planner_does_not_take_is_a_row_saying_so():
    case = next(c for c in bench.suite(["checkmate"], only=["VGG16"]))
    (row,) = bench.run_case(case, fractions=(0.9,), planners=("reactive:no_such_option=1",))
    assert row["valid"] is False and "no_such_option" in row["note"]


@needs_shared
def test_bench_checkmate_on_the_smallest_graph(tmp_path):
    md, out = tmp_path / "ck.md", tmp_path / "ck.json"
    res = CliRunner().invoke(main, ["bench", "--suite", "checkmate", "--only", "VGG16", "--planners", "none,greedy",
                                    "--markdown", str(md), "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["planner"], r["budget_fraction"]) for r in rows] == [("none", None), ("greedy", 0.8), ("greedy", 0.9)]
    planned = [r for r in rows if "planner_run" in r]
    assert planned and all(r["valid"] for r in planned)  # every plan the bench made ran valid in the executor
    for r in rows:
        assert r["valid"] or r["note"]  # a row without a plan says why (VGG16 at 0.8: below one op's working set)
    text = md.read_text()
    assert "| recomputes | bound | gap vs bound |" in text and "Moccasin 120 s" in text and "+1.97%" in text
    assert "  greedy: valid " in text and "matches or beats Moccasin on " in text
