"""Perfetto / Chrome trace export: named tracks, strictly nested slices, lanes, counters, flows, microseconds.

Checked with our own code (planner.report.trace.check_trace): Perfetto's TraceProcessor downloads a binary.
"""

import json

from click.testing import CliRunner
from conftest import GRAPHS, simple_hardware

from planner.cli import main
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.plan import ProgramBuilder
from planner.planners.reactive import plan_reactive
from planner.report.trace import TraceRun, _assign_lanes, check_trace, chrome_trace


def offload_graph() -> Graph:
    """a and b (300 B each) are made, both stored and dropped while c runs, then fetched back for d."""
    tensors = [Tensor("x", 10, TensorKind.INPUT), Tensor("a", 300), Tensor("b", 300), Tensor("c", 50),
               Tensor("y", 10, TensorKind.OUTPUT)]
    ops = [
        Op("make_a", "A", ("x",), ("a",), duration_s=1e-6),
        Op("make_b", "B", ("x",), ("b",), duration_s=1e-6),
        Op("long", "C", ("x",), ("c",), duration_s=500e-6),
        Op("use", "D", ("a", "b", "c"), ("y",), duration_s=1e-6),
    ]
    return Graph.build("offload", tensors, ops)


def overlapping_plan(graph: Graph):
    """Stores of a and b (3 us each at 0.1 B/ns) overlap on the two channels of d2h; so do the prefetches."""
    pb = ProgramBuilder()
    ma = pb.compute("make_a")
    mb = pb.compute("make_b", [ma])
    sa = pb.store("a", "d2h", [ma])
    sb = pb.store("b", "d2h", [mb])
    pb.detach("a", "compute", [sa])
    pb.detach("b", "compute", [sb])
    lg = pb.compute("long")
    pa = pb.prefetch("a", "h2d", [sa, lg - 1])
    pb_ = pb.prefetch("b", "h2d", [sb, lg - 1])
    pb.compute("use", [lg, pa, pb_])
    return pb.build(graph.name, "hand")


def test_hand_plan_is_valid_and_overlaps():
    g = offload_graph()
    hw = simple_hardware(hbm=1000, bw=1e8, channels=2)
    tl = simulate(g, hw, overlapping_plan(g))
    assert tl.valid, [v.describe() for v in tl.violations]
    # The two stores run at the same time on different channels.
    stores = [tl.steps[i] for i in (2, 3)]
    assert stores[0].start_ns < stores[1].end_ns and stores[1].start_ns < stores[0].end_ns


def _trace(channels=2):
    g = offload_graph()
    hw = simple_hardware(hbm=1000, bw=1e8, channels=channels)
    plan = overlapping_plan(g)
    tl = simulate(g, hw, plan)
    return g, hw, plan, tl, chrome_trace([TraceRun(g, hw, plan, tl)])


def test_trace_is_well_formed_json_with_named_tracks():
    *_, doc = _trace()
    doc = json.loads(json.dumps(doc))  # survives a JSON round trip
    assert check_trace(doc) == []
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[(1, 1)] == "compute"
    assert any(n.startswith("d2h") for n in names.values()) and any(n.startswith("h2d") for n in names.values())
    procs = [e for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(procs) == 1 and "offload" in procs[0]["args"]["name"]


def test_overlapping_transfers_go_to_separate_lanes():
    g, hw, plan, tl, doc = _trace(channels=2)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "store"]
    assert len(xs) == 2
    assert xs[0]["tid"] != xs[1]["tid"]  # they overlap in time, so they cannot share a track
    lanes = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"d2h (hbm→host) lane 0", "d2h (hbm→host) lane 1"} <= lanes


def test_one_channel_needs_one_lane():
    *_, doc = _trace(channels=1)
    lanes = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert not any("lane 1" in n for n in lanes)
    assert check_trace(doc) == []


def test_times_are_microseconds_of_the_executor():
    g, hw, plan, tl, doc = _trace()
    by_step = {e["args"]["step"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    for i, tm in enumerate(tl.steps):
        if i in by_step:
            assert by_step[i]["ts"] == tm.start_ns / 1000
            assert round((by_step[i]["ts"] + by_step[i]["dur"]) * 1000) == tm.end_ns
    long = next(e for e in doc["traceEvents"] if e.get("name") == "long")
    assert abs(long["dur"] - 500.0) < 1e-9  # a 500 us op lasts 500 in the trace


def test_counters_track_hbm_and_remote_occupancy():
    g, hw, plan, tl, doc = _trace()
    cs = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    hbm = [e for e in cs if e["name"] == "hbm bytes" and "resident" in e["args"]]
    host = [e for e in cs if e["name"] == "host bytes"]
    assert hbm and host
    assert max(e["args"]["resident"] for e in hbm) == tl.metrics.peak_bytes["hbm"]
    assert max(e["args"]["resident"] for e in host) == tl.metrics.peak_bytes["host"] == 600
    assert any(e["args"].get("budget") == 1000 for e in cs)


def test_flow_arrows_join_each_store_to_the_prefetch_of_the_same_tensor():
    g, hw, plan, tl, doc = _trace()
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert len(flows) == 4
    slices = {(e["pid"], e["tid"], e["ts"]): e for e in doc["traceEvents"] if e["ph"] == "X"}
    for fid in {e["id"] for e in flows}:
        s = next(e for e in flows if e["id"] == fid and e["ph"] == "s")
        f = next(e for e in flows if e["id"] == fid and e["ph"] == "f")
        assert f["bp"] == "e"
        src, dst = slices[(s["pid"], s["tid"], s["ts"])], slices[(f["pid"], f["tid"], f["ts"])]
        assert src["cat"] == "store" and dst["cat"] == "prefetch"
        assert src["args"]["tensor"] == dst["args"]["tensor"]


def test_checker_catches_crossing_slices_and_missing_names():
    bad = {"traceEvents": [
        {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "p"}},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "t"}},
        {"ph": "X", "pid": 1, "tid": 1, "name": "a", "ts": 0, "dur": 10},
        {"ph": "X", "pid": 1, "tid": 1, "name": "b", "ts": 5, "dur": 10},
        {"ph": "X", "pid": 1, "tid": 2, "name": "c", "ts": 0, "dur": 1},
        {"ph": "C", "pid": 1, "tid": 0, "name": "n", "ts": 0, "args": 3},
        {"ph": "s", "pid": 1, "tid": 1, "name": "f", "id": 7, "ts": 1},
    ]}
    problems = " ".join(check_trace(bad))
    assert "crosses" in problems and "no thread_name" in problems and "not an object" in problems
    assert "flow 7" in problems
    nested = {"traceEvents": bad["traceEvents"][:3] + [
        {"ph": "X", "pid": 1, "tid": 1, "name": "b", "ts": 2, "dur": 8}]}
    assert check_trace(nested) == []


def test_lane_assignment_never_overlaps_on_a_lane():
    iv = [(0, 10, 0), (5, 15, 1), (10, 20, 2), (12, 13, 3), (15, 30, 4)]
    lanes = _assign_lanes(iv)
    for lane in set(lanes.values()):
        mine = sorted((s, e) for s, e, k in iv if lanes[k] == lane)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))
    assert max(lanes.values()) == 2  # at most three transfers overlap at once


def test_reactive_plan_trace_and_several_planners_in_one_file():
    g = offload_graph()
    hw = simple_hardware(hbm=670, bw=1e8, channels=1)
    runs = []
    for label, plan in (("reactive", plan_reactive(g, hw)), ("hand", overlapping_plan(g))):
        runs.append(TraceRun(g, hw, plan, simulate(g, hw, plan), label))
    doc = chrome_trace(runs)
    assert check_trace(doc) == []
    assert {e["pid"] for e in doc["traceEvents"]} == {1, 2}


def test_plan_command_writes_a_trace(tmp_path):
    out = tmp_path / "tb.trace.json"
    r = CliRunner().invoke(main, [str(GRAPHS / "transformer_block.json"), "--hbm", "1.5GB", "--no-output",
                                  "--planner", "reactive", "--trace", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert check_trace(doc) == []
    assert any(e["ph"] == "X" and e["cat"] in ("store", "prefetch") for e in doc["traceEvents"])
    assert any(e["ph"] == "s" for e in doc["traceEvents"])
