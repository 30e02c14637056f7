"""Sweeps: budget, bandwidth and sequence length; the same data with any number of worker processes."""

import json

from click.testing import CliRunner
from conftest import ROOT, chain_graph, simple_hardware

from planner.cli import main
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.report.compare import compare
from planner.report.sweeps import bandwidth_sweep, budget_sweep, seqlen_sweep, strip_timing

PLANNERS = ["none", "reactive"]


def small():
    return chain_graph(sizes=(100, 100, 100), durations_us=(5.0, 5.0, 5.0)), simple_hardware(hbm=215)


def toy_sequence(seq_len: int, extra: int = 10) -> Graph:
    """x -> op0 -> a (seq_len bytes) -> op1 -> y: every plan needs seq_len + extra bytes of HBM."""
    tensors = [Tensor("x", extra, TensorKind.INPUT), Tensor("a", seq_len), Tensor("y", extra, TensorKind.OUTPUT)]
    ops = [Op("op0", "A", ("x",), ("a",), duration_s=1e-6), Op("op1", "B", ("a",), ("y",), duration_s=1e-6)]
    return Graph.build(f"toy{seq_len}", tensors, ops)


GEN = "test_sweeps:toy_sequence"


def test_budget_sweep_points_and_monotone_none():
    g, hw = small()
    sw = budget_sweep(g, hw, (0.5, 0.92, 0.96, 1.0), PLANNERS)  # 115 B is below the 210 B working set
    assert len(sw["points"]) == 8
    peak = sw["no_offload_peak_hbm_bytes"]
    for p in sw["points"]:
        assert p["hbm_budget_bytes"] == int(peak * p["fraction"])
        if p["valid"]:
            assert p["peak_hbm_bytes"] <= p["hbm_budget_bytes"]
    none = {p["fraction"]: p["valid"] for p in sw["points"] if p["planner"] == "none"}
    assert none == {0.5: False, 0.92: False, 0.96: False, 1.0: True}
    reactive = {p["fraction"]: p["status"] for p in sw["points"] if p["planner"] == "reactive"}
    assert reactive == {0.5: "infeasible", 0.92: "valid", 0.96: "valid", 1.0: "valid"}


def test_parallel_sweep_gives_the_same_data():
    g, hw = small()
    one = budget_sweep(g, hw, (0.9, 0.95, 1.0), PLANNERS, jobs=1)
    two = budget_sweep(g, hw, (0.9, 0.95, 1.0), PLANNERS, jobs=2)
    assert json.dumps(strip_timing(one), sort_keys=True) == json.dumps(strip_timing(two), sort_keys=True)


def test_bandwidth_sweep_faster_links_never_slow_reactive_down():
    g, hw = small()
    seen = []
    sw = bandwidth_sweep(g, hw, (0.05, 0.1, 1.0, 10.0), planners=["reactive"], progress=lambda d, t, s: seen.append(d))
    spans = [p["makespan_us"] for p in sw["points"]]
    assert all(p["valid"] for p in sw["points"])
    assert spans == sorted(spans, reverse=True) and spans[0] > spans[-1]
    assert seen[-1] == 4


def test_seqlen_bisection_finds_the_exact_longest_length():
    hw = simple_hardware(hbm=5000)
    sw = seqlen_sweep(GEN, {}, hw, lo=100, hi=20000, step=100, planners=PLANNERS)
    # seq_len + 10 bytes must fit in 5000: the longest multiple of 100 is 4900.
    for n in PLANNERS:
        assert sw["longest"][n]["seq_len"] == 4900 and sw["longest"][n]["first_failing"] == 5000
    # Bisection probes few points: about log2(200) per planner, plus the two ends.
    assert len(sw["points"]) <= 2 * 11


def test_seqlen_bisection_matches_brute_force_and_parallel():
    hw = simple_hardware(hbm=1234)
    a = seqlen_sweep(GEN, {"extra": 50}, hw, lo=64, hi=4096, step=64, planners=PLANNERS, jobs=1)
    b = seqlen_sweep(GEN, {"extra": 50}, hw, lo=64, hi=4096, step=64, planners=PLANNERS, jobs=2)
    assert json.dumps(strip_timing(a), sort_keys=True) == json.dumps(strip_timing(b), sort_keys=True)
    for n in PLANNERS:  # brute force: plan and simulate every length on the grid
        brute = [k for k in range(64, 4097, 64)
                 if compare(toy_sequence(k, 50), hw, [n]).rows[0]["status"] == "valid"]
        assert brute == list(range(64, brute[-1] + 1, 64))  # fits below, not above: bisection applies
        assert a["longest"][n]["seq_len"] == brute[-1] == 1152  # 1152 + 50 <= 1234 < 1216 + 50


def test_seqlen_ends_nothing_fits_and_at_least():
    hw = simple_hardware(hbm=1000)
    none_fits = seqlen_sweep(GEN, {}, hw, lo=2000, hi=4000, step=100, planners=["none"])
    assert none_fits["longest"]["none"]["seq_len"] is None
    all_fit = seqlen_sweep(GEN, {}, hw, lo=100, hi=500, step=100, planners=["none"])
    assert all_fit["longest"]["none"] | {} and all_fit["longest"]["none"]["seq_len"] == 500
    assert all_fit["longest"]["none"]["at_least"] is True


def test_sweep_commands_write_files(tmp_path, monkeypatch):
    from planner.formats import save_graph

    g, _ = small()
    path = tmp_path / "chain.json"
    save_graph(g, path)
    r = CliRunner().invoke(main, ["sweep", "budget", str(path), "--hardware", "h100-pcie", "--planners",
                                  "none,reactive", "--fractions", "0.8,1", "-o", str(tmp_path / "b"), "-q"])
    assert r.exit_code == 0, r.output
    assert {p.name for p in (tmp_path / "b").iterdir()} >= {"sweep-budget.json", "sweep-budget.csv", "tradeoff.png",
                                                            "sweep-budget.md"}
    r = CliRunner().invoke(main, ["sweep", "bandwidth", str(path), "--hardware", "h100-pcie", "--hbm", "230",
                                  "--planners", "reactive", "--bandwidths", "1,10GB/s", "-o", str(tmp_path / "w"),
                                  "-q", "--json"])
    assert r.exit_code == 0, r.output
    assert [p["bandwidth_GBps"] for p in json.loads(r.output)["points"]] == [1.0, 10.0]
    r = CliRunner().invoke(main, ["sweep", "seqlen", GEN, "--hardware", "h100-pcie", "--hbm", "5000",
                                  "--planners", "none", "--range", "100:20000", "--step", "100",
                                  "-o", str(tmp_path / "s"), "-q"])
    assert r.exit_code == 0, r.output
    assert "none: 4900 tokens" in r.output
    assert (tmp_path / "s" / "seqlen.png").stat().st_size > 10_000


def test_sweep_bad_input_exits_2(tmp_path):
    r = CliRunner().invoke(main, ["sweep", "seqlen", "no_such_generator", "-q", "-o", str(tmp_path)])
    assert r.exit_code == 2 and "no workload generator" in r.output
    r = CliRunner().invoke(main, ["sweep", "seqlen", GEN, "--range", "10:5", "-q", "-o", str(tmp_path)])
    assert r.exit_code == 2 and "LO:HI" in r.output


def test_min_budget_search_finds_each_planners_lowest_budget():
    from planner.report.sweeps import min_budget_search

    g, hw = small()  # no-offload peak 230 B, largest working set 210 B
    sw = min_budget_search(g, hw, PLANNERS, resolution=1 / 230)
    assert sw["lowest"]["none"]["hbm_budget_bytes"] == 230
    low = sw["lowest"]["reactive"]["hbm_budget_bytes"]
    assert 210 <= low < 230 and sw["lowest"]["reactive"]["peak_hbm_bytes"] <= low
    # one byte less and reactive has no valid plan (or it is the working set itself)
    assert low == 210 or any(p["hbm_budget_bytes"] == low - 1 and not p["fits"] for p in sw["points"])


def test_budget_and_bandwidth_sweeps_are_monotone_by_construction():
    # A plan valid at a tighter point seeds the looser ones: the makespan never goes up as the budget or the
    # bandwidth grows, and a seeded point says where its plan came from (and is valid there: the executor ran it).
    from planner import api
    from planner.placement import apply_homes

    g = apply_homes(api.load_graph(ROOT / "graphs" / "transformer_block.json"), {"weight": "auto"})
    hw = api.hardware("ascend-910c", hbm="1.2GB")
    for sweep, key in ((budget_sweep(g, hw, (0.45, 0.5, 0.55, 0.6, 0.7), ["reactive", "greedy"]), "fraction"),
                       (bandwidth_sweep(g, hw, (20.0, 33.6, 40.0, 50.0), planners=["reactive", "greedy"]),
                        "bandwidth_GBps")):
        for name in ("reactive", "greedy"):
            pts = sorted((p for p in sweep["points"] if p["planner"] == name and p["valid"]), key=lambda p: p[key])
            assert len(pts) >= 2
            for a, b in zip(pts, pts[1:]):
                assert b["makespan_us"] <= a["makespan_us"], (name, key, a[key], b[key])
            for p in pts:
                assert p["seeded_from"] is None or p["seeded_from"] < p[key]
        assert all("plan" not in p for p in sweep["points"])
        json.dumps(sweep)
