"""Which tensors move, and why (planner/tensors.py): hand-checked figures on tiny plans, consistency with the
executor's metrics on transformer_block, the --tensors / --json output and the report's section and CSV."""

import csv
import json

import pytest
from click.testing import CliRunner
from conftest import GRAPHS, chain_graph, simple_hardware

from planner import api
from planner.cli import main
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.hardware import HBM
from planner.placement import start_tiers
from planner.plan import ProgramBuilder
from planner.tensors import (
    hbm_peak,
    layer_of,
    peak_residents,
    recomputed_outputs,
    tensor_moves,
    tensor_view,
    totals_by_kind,
    totals_by_layer,
)

TB = str(GRAPHS / "transformer_block.json")


def skip_graph():
    """op0: x -> a; op1: a -> b; op2: b -> c; op3: (a, c) -> d. ``a`` waits two ops for its second use."""
    tensors = [Tensor("x", 50, TensorKind.INPUT), Tensor("a", 100), Tensor("b", 100), Tensor("c", 100),
               Tensor("d", 100, TensorKind.OUTPUT)]
    ops = [Op("op0", "Add", ("x",), ("a",), duration_s=1e-6), Op("op1", "Add", ("a",), ("b",), duration_s=1e-6),
           Op("op2", "Add", ("b",), ("c",), duration_s=1e-6), Op("op3", "Add", ("a", "c"), ("d",), duration_s=1e-6)]
    return Graph.build("skip", tensors, ops)


def skip_plan(g):
    """Store ``a`` after op0, detach it on the store link after op1; prefetch it after op2, so op3 waits for it."""
    b = ProgramBuilder()
    op0 = b.compute("op0")
    st = b.store("a", "d2h", [op0])
    op1 = b.compute("op1")
    b.detach("a", "d2h", [st, op1])
    op2 = b.compute("op2")
    pf = b.prefetch("a", "h2d", [op2])
    b.compute("op3", [pf])
    return b.build(g.name, "hand")


def test_hand_checked_offload_interval():
    # 1 byte per ns links, ops of 1 us: op0 [0, 1000), store a [1000, 1100), op1 [1000, 2000), detach at 2000,
    # op2 to 3000; prefetch a [3000, 3100); op3 waits for it: [3100, 4100), a stall of 100 ns.
    g, hw = skip_graph(), simple_hardware()
    plan = skip_plan(g)
    tl = simulate(g, hw, plan)
    assert tl.valid, tl.violations
    (m,) = tensor_moves(g, plan, tl)
    assert (m.name, m.kind, m.bytes, m.layer) == ("a", "activation", 100, "-")
    assert (m.prefetches, m.stores, m.detaches) == (1, 1, 1)
    assert m.moved_bytes == {"d2h": 100, "h2d": 100}
    (iv,) = m.intervals
    detach, prefetch, op3 = tl.steps[3], tl.steps[5], tl.steps[6]
    assert (iv.leave_ns, iv.return_ns) == (detach.start_ns, prefetch.start_ns) == (2000, 3000)
    assert iv.duration_ns == 1000 and m.freed_byte_ns == 100 * 1000
    assert (iv.leaves_after, iv.returns_before, iv.tier) == ("op1", "op3", "host")
    assert not iv.wraps and not iv.next_step
    assert iv.stall_ns == m.stall_ns == op3.start_ns - tl.steps[4].end_ns == tl.metrics.stall_ns == 100
    # At the peak (first reached when op3 allocates d at 3100) a, c and d are resident, a third each.
    peak = hbm_peak(tl)
    assert (peak.time_ns, peak.bytes, peak.count) == (3100, 300, 3) and peak.bytes == tl.metrics.peak_bytes[HBM]
    assert sorted(r.name for r in peak.residents) == ["a", "c", "d"]
    assert all(r.share == pytest.approx(1 / 3) for r in peak.residents)
    assert [r.name for r in peak_residents(tl, top=1)] == [peak.residents[0].name]
    (kind,) = totals_by_kind([m])
    assert (kind.key, kind.tensors, kind.bytes, kind.moved_bytes, kind.freed_byte_ns, kind.stall_ns) == (
        "activation", 1, 100, 200, 100000, 100)


def test_weight_on_host_is_off_hbm_across_the_step_boundary():
    # Weights start on host: each is prefetched for its op and dropped after it; until the next step's prefetch
    # it is off HBM, one interval that wraps. op0 waits 10 ns for w0 (10 bytes at 1 byte per ns).
    g, hw = chain_graph(weight_home="host"), simple_hardware()
    b = ProgramBuilder()
    fetched = [b.prefetch(f"w{i}", "h2d") for i in range(3)]
    dropped = [b.detach(f"w{i}", waits=[b.compute(f"op{i}", [fetched[i]])]) for i in range(3)]
    plan = b.build(g.name, "hand")
    tl = simulate(g, hw, plan)
    assert tl.valid, tl.violations
    moves = {m.name: m for m in tensor_moves(g, plan, tl)}
    assert set(moves) == {"w0", "w1", "w2"}
    makespan = tl.metrics.makespan_ns
    for i, step in enumerate(dropped):
        m = moves[f"w{i}"]
        (iv,) = m.intervals
        assert iv.wraps and iv.next_step and iv.tier == "host" and m.start_tier == "host"
        assert iv.leaves_after == iv.returns_before == f"op{i}"
        assert iv.leave_ns == tl.steps[step].start_ns == tl.steps[step - 1].end_ns  # dropped as its op ends
        assert iv.return_ns == tl.steps[fetched[i]].start_ns
        assert iv.duration_ns == makespan - iv.leave_ns + iv.return_ns
        assert m.moved_bytes == {"h2d": 10}
    assert moves["w0"].stall_ns == tl.metrics.stall_ns == 10
    assert moves["w0"].intervals[0].stall_ns == 10
    # The one that frees most comes first: w0 leaves earliest and comes back first.
    assert next(iter(moves)) == "w0"


def test_layer_ids_from_generator_names():
    assert layer_of("p0.L3.q_a_proj") == "L3"
    assert layer_of("L31.wo") == "L31"
    assert layer_of("mb0.d.L31.h2") == "L31"
    assert layer_of("workspace:L2.attn") == "L2"
    assert layer_of("w_qkv") == layer_of("MLP12.w") == layer_of("w_L2norm") == "-"


@pytest.fixture(scope="module")
def tb_greedy():
    g = api.load_graph(TB)
    hw = api.hardware("ascend-910c", hbm="1GB")
    result = api.plan(g, hw, planner="greedy")
    assert result.timeline.valid, result.timeline.violations[:3]
    return g, result.plan, result.timeline


def test_transformer_block_moves_agree_with_the_executor(tb_greedy):
    g, plan, tl = tb_greedy
    view = tensor_view(g, plan, tl)
    moves = view.moves
    # Every tensor with a Prefetch, Store or Detach, made again by a recompute step, or starting off HBM, appears
    # once (a recompute step targets an op, not a tensor).
    expected = {s.target for s in plan.steps if not s.kind.runs_op}
    expected |= {t for made in recomputed_outputs(g, plan, tl).values() for t in made}
    expected |= {n for n, tier in start_tiers(g, plan.placement).items() if tier != HBM}
    assert [m.name for m in moves] == list(dict.fromkeys(m.name for m in moves))
    assert {m.name for m in moves} == expected
    # Bytes per link add up to the executor's, and so does the stall (greedy's static offsets: no defrag delay).
    per_link: dict[str, int] = {}
    for m in moves:
        for link, n in m.moved_bytes.items():
            per_link[link] = per_link.get(link, 0) + n
    assert per_link == {k: v for k, v in tl.metrics.bytes_moved.items() if v}
    assert sum(m.stall_ns for m in moves) == tl.metrics.stall_ns
    assert sum(m.recompute_ns for m in moves) == tl.metrics.recompute_ns
    # Sorted by HBM bytes x time freed; each interval is a real gap in the tensor's HBM residencies.
    freed = [m.freed_byte_ns for m in moves]
    assert freed == sorted(freed, reverse=True) and freed[0] > 0
    makespan = tl.metrics.makespan_ns
    for m in moves:
        on_hbm = [r for r in tl.residencies if r.tier == HBM and r.name == m.name and r.end_ns > r.start_ns]
        for iv in m.intervals:
            assert 0 < iv.duration_ns <= makespan and iv.tier == "host"
            if iv.leave_ns is not None and iv.return_ns is not None and not iv.wraps:
                assert iv.duration_ns == iv.return_ns - iv.leave_ns
                assert not any(r.start_ns < iv.return_ns and r.end_ns > iv.leave_ns for r in on_hbm)
        assert sum(iv.stall_ns for iv in m.intervals) <= m.stall_ns
    # The peak's residents add up to the executor's peak.
    assert view.peak.bytes == tl.metrics.peak_bytes[HBM] == sum(r.bytes for r in view.peak.residents)
    assert sum(r.share for r in view.peak.residents) == pytest.approx(1.0)
    # Totals add up over kinds and over layers (no layer ids in these names).
    for totals in (totals_by_kind(moves), totals_by_layer(moves)):
        assert sum(t.tensors for t in totals) == len(moves)
        assert sum(t.freed_byte_ns for t in totals) == sum(freed)
        assert sum(t.moved_bytes for t in totals) == sum(per_link.values())
    assert [t.key for t in totals_by_layer(moves)] == ["-"]
    d = json.loads(json.dumps(view.to_dict()))
    assert d["moving_tensors"] == len(d["moves"]) == len(moves)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_tensors_tables(tb_greedy):
    # The count is greedy's (the fixture's plan is the CLI's: same planner, graph and budget), not pinned here.
    moving = len(tensor_moves(*tb_greedy))
    r = run(TB, "--hbm", "1GB", "--planner", "greedy", "--no-output", "--tensors", "5")
    assert r.exit_code == 0, r.output
    assert "peak HBM" in r.output  # the usual summary first
    for part in (f"Tensors that move: {moving}, by HBM bytes × time freed (top 5)", "more moving tensors",
                 "On HBM at its peak: 990.5 MB", "Moving tensors by kind", "optimizer_state", "w_down_v"):
        assert part in r.output, part
    assert r.output.index("peak HBM") < r.output.index("Tensors that move")


def test_cli_tensors_json_has_every_moving_tensor(tmp_path, tb_greedy):
    r = run(TB, "--hbm", "1GB", "--planner", "greedy", "--no-output", "--tensors", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["tensors"] == len(api.load_graph(TB).tensors)  # the graph's tensor count, as without --tensors
    view = d["tensor_view"]
    moving = len(tensor_moves(*tb_greedy))
    assert view["moving_tensors"] == len(view["moves"]) == moving > 20  # all of them, not the top 20
    assert sum(m["moved_bytes"].get("d2h", 0) for m in view["moves"]) == d["bytes_moved"]["d2h"]
    assert view["peak"]["bytes"] == d["peak_hbm_bytes"]
    assert {"by_kind", "by_layer"} <= set(view)
    plain = run(TB, "--hbm", "1GB", "--planner", "greedy", "--no-output", "--json")
    assert "tensor_view" not in json.loads(plain.output)


def test_report_has_a_tensor_section_and_csv(tmp_path):
    from planner.report import compare, write_report

    g, hw = chain_graph(sizes=(100, 100, 100), durations_us=(5.0, 5.0, 5.0)), simple_hardware(hbm=215)
    cmp = compare(g, hw, ["none", "reactive"])
    assert cmp.runs["reactive"].timeline.valid
    files = write_report(tmp_path, cmp, command="test")
    assert tmp_path / "tensors.csv" in files
    md = (tmp_path / "report.md").read_text()
    assert "## Which tensors move, and why" in md and "### reactive" in md and "`tensors.csv`" in md
    with open(tmp_path / "tensors.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    mine = [r for r in rows if r["planner"] == "reactive"]
    run_ = cmp.runs["reactive"]
    moves = tensor_moves(g, run_.plan, run_.timeline)
    assert moves and {r["tensor"] for r in mine} == {m.name for m in moves}
    assert len(mine) == sum(max(1, len(m.intervals)) for m in moves)
    for m in moves:
        assert f"| {m.name} |" in md or len(moves) > 10


# -- recompute steps: a dropped tensor made again by re-running its op --------------------------------------------


def test_dropped_and_recomputed_tensor_is_off_hbm_until_the_recomputation():
    # op0 [0, 1000); op1 [1000, 2000); a dropped at 2000 (no copy); op2 [2000, 3000); op0 again [3000, 4000) makes
    # a again; op3 [4000, 5000) reads it. Off HBM 2000 to 3000, held by no tier; its cost is the 1 us re-run.
    g, hw = skip_graph(), simple_hardware()
    b = ProgramBuilder()
    for op in ("op0", "op1"):
        b.compute(op)
    b.detach("a")
    b.compute("op2")
    redo = b.recompute("op0")
    b.compute("op3")
    plan = b.build(g.name, "hand")
    tl = simulate(g, hw, plan)
    assert tl.valid, [v.describe() for v in tl.violations]
    assert recomputed_outputs(g, plan, tl) == {redo: ("a",)}
    (m,) = tensor_moves(g, plan, tl)  # x, kept on HBM for the re-run, does not move
    assert (m.name, m.recomputes, m.recompute_ns, m.detaches, m.prefetches, m.stores) == ("a", 1, 1000, 1, 0, 0)
    assert m.recompute_ns == tl.metrics.recompute_ns and m.moved_bytes == {} and m.tiers == ()
    (iv,) = m.intervals
    assert (iv.leave_ns, iv.return_ns, iv.duration_ns) == (2000, 3000, 1000)
    assert (iv.leaves_after, iv.returns_before, iv.tier, iv.recomputed_by) == ("op1", "op3", None, "op0")
    assert iv.stall_ns == m.stall_ns == 0 and not iv.next_step
    d = json.loads(json.dumps(m.to_dict()))
    assert (d["recomputes"], d["recompute_us"], d["tiers"]) == (1, 1.0, [])
    assert d["intervals"][0]["recomputed_by"] == "op0" and d["intervals"][0]["tier"] is None
    (kind,) = totals_by_kind([m])
    assert kind.recompute_ns == 1000 and kind.to_dict()["recompute_us"] == 1.0
    assert tensor_view(g, plan, tl).recomputes


def test_stall_of_a_recomputation_goes_to_the_prefetch_of_its_input():
    # x is stored and dropped after op0, fetched back for the re-run of op0: the re-run waits 50 ns for it.
    g, hw = skip_graph(), simple_hardware()
    b = ProgramBuilder()
    op0 = b.compute("op0")
    st = b.store("x", "d2h", [op0])             # [1000, 1050)
    b.detach("x", "d2h", [st])                  # 1050, on the link: no compute stall
    b.compute("op1")
    b.detach("a")                               # 2000
    op2 = b.compute("op2")
    pf = b.prefetch("x", "h2d", [op2])          # [3000, 3050)
    b.recompute("op0", [pf])                    # [3050, 4050)
    b.compute("op3")
    plan = b.build(g.name, "hand")
    tl = simulate(g, hw, plan)
    assert tl.valid, [v.describe() for v in tl.violations]
    assert tl.metrics.stall_ns == 50
    moves = {m.name: m for m in tensor_moves(g, plan, tl)}
    assert set(moves) == {"x", "a"}
    x, a = moves["x"], moves["a"]
    (ix,) = x.intervals
    assert (ix.leave_ns, ix.return_ns, ix.tier, ix.returns_before, ix.recomputed_by) == (
        1050, 3000, "host", "recompute op0", None)
    assert ix.stall_ns == x.stall_ns == 50 and x.recomputes == 0 and x.moved_bytes == {"d2h": 50, "h2d": 50}
    (ia,) = a.intervals
    assert (ia.leave_ns, ia.return_ns, ia.recomputed_by, ia.tier) == (2000, 3050, "op0", None)
    assert a.stall_ns == 0 and a.recompute_ns == tl.metrics.recompute_ns == 1000
    assert sum(m.stall_ns for m in moves.values()) == tl.metrics.stall_ns


def two_outputs_graph() -> Graph:
    """split: x -> (a, b); long: x -> c; join: (a, b, c) -> y. a and b idle while long runs."""
    tensors = [Tensor("x", 10, TensorKind.INPUT), Tensor("a", 100), Tensor("b", 100), Tensor("c", 10),
               Tensor("y", 10, TensorKind.OUTPUT)]
    ops = [Op("split", "Split", ("x",), ("a", "b"), duration_s=1e-6),
           Op("long", "F", ("x",), ("c",), duration_s=5e-6),
           Op("join", "F", ("a", "b", "c"), ("y",), duration_s=1e-6)]
    return Graph.build("two", tensors, ops)


@pytest.mark.parametrize("dropped", [("a", "b"), ("a",)])
def test_a_recomputation_counts_for_the_outputs_it_makes_again(dropped):
    # Both dropped: the 1 us re-run is split between them. Only a dropped: b is still on HBM, the re-run makes a
    # only, and b does not move.
    g, hw = two_outputs_graph(), simple_hardware()
    b = ProgramBuilder()
    b.compute("split")
    for t in dropped:
        b.detach(t)
    b.compute("long")
    redo = b.recompute("split")
    b.compute("join")
    plan = b.build(g.name, "hand")
    tl = simulate(g, hw, plan)
    assert tl.valid, [v.describe() for v in tl.violations]
    assert recomputed_outputs(g, plan, tl) == {redo: dropped}
    moves = {m.name: m for m in tensor_moves(g, plan, tl)}
    assert set(moves) == set(dropped)
    assert {n: m.recompute_ns for n, m in moves.items()} == {t: 1000 // len(dropped) for t in dropped}
    assert sum(m.recompute_ns for m in moves.values()) == tl.metrics.recompute_ns == 1000
    for m in moves.values():
        (iv,) = m.intervals
        assert (iv.leave_ns, iv.return_ns, iv.recomputed_by, iv.returns_before) == (1000, 6000, "split", "join")


def test_tensor_tables_show_recomputation_only_when_the_plan_recomputes():
    from planner.summary import move_totals_rows, tensor_move_rows

    g, hw = skip_graph(), simple_hardware()
    plain = skip_plan(g)
    view = tensor_view(g, plain, simulate(g, hw, plain))
    headers, rows = tensor_move_rows(view)
    assert "recompute" not in headers and not view.recomputes
    assert "recompute" not in move_totals_rows(view.by_kind, "kind")[0]

    b = ProgramBuilder()
    for op in ("op0", "op1"):
        b.compute(op)
    b.detach("a")
    b.compute("op2")
    b.recompute("op0")
    b.compute("op3")
    plan = b.build(g.name, "hand")
    tl = simulate(g, hw, plan)
    assert tl.valid
    view = tensor_view(g, plan, tl)
    headers, rows = tensor_move_rows(view)
    row = dict(zip(headers, rows[0]))
    assert row["to"] == "recomputed" and row["recompute"] == "1 us"
    assert row["longest time off HBM"] == "after op1 → recompute op0, before op3 (1 us)"
    headers, rows = move_totals_rows(view.by_kind, "kind")
    assert dict(zip(headers, rows[0]))["recompute"] == "1 us"
