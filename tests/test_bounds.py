"""Lower bounds hold: no plan beats them, on hand-checked cases and on the repository's graphs."""

from __future__ import annotations

import pytest
from conftest import GRAPHS, NS, simple_hardware, three_bigs, two_fetches

from planner import api, bounds
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.hardware import HBM
from planner.planners import PLANNERS


def test_bounds_of_the_two_fetch_graph_by_hand():
    g, hw = two_fetches(), simple_hardware(hbm=10_000)
    values = {b.reason.split(" ")[0]: b.value for b in bounds.makespan_bounds(g, hw)}
    assert bounds.compute_bound(g, hw).value == 1400
    # Both weights (400 B at 1 B/ns) must arrive, then at least one 100 ns op runs.
    assert values["first"] == 500
    # Per op: q1 runs after p1, which waits for w1: 200 + 100 + 600.
    assert bounds.makespan_bound(g, hw).value >= 1400


def test_weights_the_planner_places_are_fetched_beyond_what_fits_beside_the_pinned_bytes():
    # The two weights of two_fetches left to the planner (auto), a 250 B budget and x (1 B) pinned to HBM: at
    # most 249 B of the 400 B start on HBM, so 151 B are fetched (151 ns) before some op reads them, then 100 ns.
    from dataclasses import replace

    from planner.graph import AUTO, Graph

    g = two_fetches()
    g = Graph.build(g.name, [replace(t, home=AUTO) if t.name.startswith("w") else t for t in g.tensors.values()],
                    g.ops)
    first = [b for b in bounds.makespan_bounds(g, simple_hardware(hbm=250)) if b.reason.startswith("first")]
    assert [b.value for b in first] == [151 + 100]
    # With room for both, nothing has to be fetched.
    assert not [b for b in bounds.makespan_bounds(g, simple_hardware(hbm=1000)) if b.reason.startswith("first")]
    # And no plan beats the bound at 250 B.
    for name in ("greedy", "cpsat"):
        plan = PLANNERS[name](g, simple_hardware(hbm=250))
        tl = simulate(g, simple_hardware(hbm=250), plan)
        assert tl.valid and tl.metrics.makespan_ns >= bounds.makespan_bound(g, simple_hardware(hbm=250)).value


def test_the_per_op_bound_counts_the_stores_the_budget_forces():
    # Budget 150: making big1 while big0 is alive needs 100 B stored first (100 ns at 1 B/ns) unless the order
    # avoids it; the bound must stay below what cpsat proves optimal (3500 ns, no transfer).
    g, hw = three_bigs(), simple_hardware(hbm=150)
    b = bounds.makespan_bound(g, hw)
    assert b.value <= 3500
    assert bounds.compute_bound(g, hw).value == 3500


def test_weights_fetched_in_turn_count_once_in_the_per_op_bound():
    # Three host weights of 200 B read one after another, a 450 B budget: all three are never on HBM at once, so
    # each is fetched (600 ns at 1 B/ns), read and dropped, and the optimum is 602 ns (exact search). A bound that
    # counted them again as placed-by-the-planner bytes beyond the room on HBM claimed 752 ns.
    from planner.planners.exact import plan_exact

    tensors = [Tensor("x", 1, TensorKind.INPUT), Tensor("y", 1, TensorKind.OUTPUT)]
    tensors += [Tensor(f"w{i}", 200, TensorKind.WEIGHT, home="host") for i in range(3)]
    tensors += [Tensor(f"a{i}", 10) for i in range(3)]
    ops = [Op(f"op{i}", "F", ("x" if i == 0 else f"a{i - 1}", f"w{i}"), (f"a{i}",), duration_s=NS) for i in range(3)]
    g = Graph.build("weights_in_turn", tensors, ops + [Op("op3", "F", ("a2",), ("y",), duration_s=NS)])
    hw = simple_hardware(hbm=450)
    optimum = plan_exact(g, hw)
    tl = simulate(g, hw, optimum)
    assert tl.valid and optimum.stats["exact"]["proven"] and tl.metrics.makespan_ns == 602
    assert bounds.makespan_bound(g, hw).value <= 602


def test_a_tensor_pinned_to_hbm_that_nothing_needs_leaves_room_for_the_placed_ones():
    # A 700 B input that no op reads, pinned to HBM, and a 200 B weight whose tier the planner chooses, in a 400 B
    # budget: the input is dropped at time 0, so the weight starts on HBM and nothing is fetched (the exact search:
    # 100 ns, the op alone). A bound that kept the input's bytes beside the weight claimed 200 ns of fetch first
    # (found by fuzzing the bounds against the exact search).
    from planner.graph import AUTO
    from planner.planners.exact import plan_exact

    tensors = [Tensor("junk", 700, TensorKind.INPUT, home=HBM), Tensor("w", 200, TensorKind.WEIGHT, home=AUTO),
               Tensor("y", 50, TensorKind.OUTPUT)]
    g = Graph.build("unread_input", tensors, [Op("f", "F", ("w",), ("y",), duration_s=100 * NS)])
    hw = simple_hardware(hbm=400)
    optimum = plan_exact(g, hw)
    tl = simulate(g, hw, optimum)
    assert tl.valid and optimum.stats["exact"]["proven"] and tl.metrics.makespan_ns == 100
    assert [b.value for b in bounds.makespan_bounds(g, hw) if b.value > 100] == []


def test_gap_is_relative_to_the_bound():
    assert bounds.gap(110, 100) == pytest.approx(0.1)
    assert bounds.gap(5, 0) is None


@pytest.mark.parametrize("graph_file,preset", [
    ("transformer_block.json", "ascend-910c"),
    ("remote_weights_chain.json", "cloudmatrix384"),
    ("deepseek-v3-nsa-64k-L3-1layer.json", "ascend-910c"),
    ("llama3-8b-no2-4layers.json", "ascend-910c"),
])
@pytest.mark.parametrize("fraction", [0.6, 0.9])
def test_no_plan_beats_the_bounds(graph_file, preset, fraction):
    path = GRAPHS / graph_file
    if not path.exists():
        pytest.skip(f"{graph_file} not in graphs/")
    g = api.load_graph(path)
    peak = api.no_offload_reference(g, api.hardware(preset)).metrics.peak_bytes[HBM]
    hw = api.hardware(preset, hbm=str(int(peak * fraction)))
    lbs = bounds.makespan_bounds(g, hw)
    hb = bounds.hbm_bound(g)
    for name in ("reactive", "greedy", "none"):
        tl = simulate(g, hw, PLANNERS[name](g, hw))
        if not tl.valid:
            continue
        for b in lbs:
            assert b.value <= tl.metrics.makespan_ns, (name, b)
        assert hb.value <= tl.metrics.peak_bytes[HBM]


def test_the_order_bound_is_labelled_and_holds_for_the_no_offload_order():
    g = api.load_graph(GRAPHS / "transformer_block.json")
    hw = api.hardware("ascend-910c", hbm="1GB")
    b = bounds.order_transfer_bound(g, hw)
    assert "no-offload order" in b.metric
    # The reactive runtime keeps the no-offload order.
    tl = simulate(g, hw, PLANNERS["reactive"](g, hw))
    assert tl.valid and b.value <= tl.metrics.makespan_ns


def test_the_store_back_waits_for_the_fetches_its_update_needs():
    # An optimizer state of 100 B on the host, read and updated in place by one 1 ns op: it is fetched (100 ns at
    # 1 B/ns), updated, then stored back (100 ns), so no plan ends before 201 ns (the exact search proves it).
    # Released after the update's ancestors' compute alone, the store-back bound said 101 ns.
    from planner.planners.exact import plan_exact

    tensors = [Tensor("m", 100, TensorKind.OPTIMIZER_STATE, home="host"), Tensor("g", 1, TensorKind.INPUT)]
    g = Graph.build("update_on_host", tensors, [Op("step", "AdamW", ("g",), (), ("m",), duration_s=NS)])
    hw = simple_hardware(hbm=1000)
    back = [b for b in bounds.makespan_bounds(g, hw) if b.reason.startswith("tensors pinned to host")]
    assert [b.value for b in back] == [201]
    optimum = plan_exact(g, hw)
    tl = simulate(g, hw, optimum)
    assert tl.valid and optimum.stats["exact"]["proven"] and tl.metrics.makespan_ns == 201


def test_the_pipeline_bound_orders_fetch_update_store_groups_by_johnsons_rule():
    # Two optimizer states on the host, 200 B and 10 B, each updated by its own 1 ns op: fetched (1 B/ns), updated,
    # stored back. Small first: the big state arrives at 210 ns, its Store ends at 411. Big first: its Store runs
    # 201-401, and the small one's, released at 211, can only follow: 411. The exact search proves 411; the
    # store-back bound, which does not see that the big fetch delays the other, says 401.
    from planner.planners.exact import plan_exact

    tensors = [Tensor("big", 200, TensorKind.OPTIMIZER_STATE, home="host"),
               Tensor("small", 10, TensorKind.OPTIMIZER_STATE, home="host"),
               Tensor("g_big", 1, TensorKind.INPUT), Tensor("g_small", 1, TensorKind.INPUT)]
    ops = [Op("step_big", "AdamW", ("g_big",), (), ("big",), duration_s=NS),
           Op("step_small", "AdamW", ("g_small",), (), ("small",), duration_s=NS)]
    g = Graph.build("two_states", tensors, ops)
    hw = simple_hardware(hbm=1000)
    values = {b.reason.split(" ")[0]: b.value for b in bounds.makespan_bounds(g, hw)}
    assert values["fetch,"] == 411
    assert values["tensors"] == 401
    optimum = plan_exact(g, hw)
    tl = simulate(g, hw, optimum)
    assert tl.valid and optimum.stats["exact"]["proven"] and tl.metrics.makespan_ns == 411
    assert bounds.mitten_makespan([(200, 200, 0), (10, 10, 0)]) == 410
    # Johnson's order puts the jobs whose second part is longer first: (1, 5) then (4, 2), the second machine ending
    # them at 6 and 8; a lag of 3 on the first delays its second part to 4-9, the other's to 9-11.
    assert bounds.mitten_makespan([(4, 2, 0), (1, 5, 0)]) == 8
    assert bounds.mitten_makespan([(4, 2, 0), (1, 5, 3)]) == 11


def test_the_pipeline_bound_waits_for_the_last_groups_update_before_its_stores():
    # A 200 B state updated by a 50 ns op and two 100 B states by 1 ns ops, all on the host (1 B/ns). Whichever is
    # fetched last, its Stores follow its update: the big one last gives 400 + 50 + 200 = 650 ns; a small one last
    # leaves the big one's 200 ns of Stores and the other small one's between 250 and the end: 650 too (the exact
    # search proves it). With only the shortest update as the lag the flow shop says 601 ns, the store-back 501.
    from planner.planners.exact import plan_exact

    tensors = [Tensor("big", 200, TensorKind.OPTIMIZER_STATE, home="host")]
    tensors += [Tensor(f"small{i}", 100, TensorKind.OPTIMIZER_STATE, home="host") for i in (1, 2)]
    tensors += [Tensor(f"g_{n}", 1, TensorKind.INPUT) for n in ("big", "small1", "small2")]
    ops = [Op("step_big", "AdamW", ("g_big",), (), ("big",), duration_s=50 * NS)]
    ops += [Op(f"step_small{i}", "AdamW", (f"g_small{i}",), (), (f"small{i}",), duration_s=NS) for i in (1, 2)]
    g = Graph.build("three_states", tensors, ops)
    hw = simple_hardware(hbm=1000)
    values = {b.reason.split(" ")[0]: b.value for b in bounds.makespan_bounds(g, hw)}
    assert values["fetch,"] == 650 and values["tensors"] == 501
    assert bounds.mitten_makespan([(100, 100, 1), (100, 100, 1), (200, 200, 1)]) == 601
    optimum = plan_exact(g, hw)
    tl = simulate(g, hw, optimum)
    assert tl.valid and optimum.status == "optimal" and tl.metrics.makespan_ns == 650


def test_the_per_op_bound_fetches_back_after_the_op_what_its_descendants_read():
    # At m, a (200 B, read by f) and c (300 B) and m's 150 B workspace exceed the 510 B budget by 141 B: a is off
    # HBM while m starts, stored before (>= 141 ns at 1 B/ns) and fetched back after m starts, before f reads it
    # (>= 141 ns), then f runs: 141 + 141 + 1 = 283 ns, where counting only m's and f's compute after the stores
    # said 143. p may not be re-run, so a cannot be dropped and made again; the proven optimum is 403 ns.
    from planner.planners.exact import plan_exact

    tensors = [Tensor("x", 1, TensorKind.INPUT), Tensor("a", 200), Tensor("s", 1), Tensor("c", 300),
               Tensor("y", 1, TensorKind.OUTPUT)]
    ops = [Op("p", "F", ("x",), ("a", "s"), duration_s=NS, recompute=False),
           Op("m", "F", ("s",), ("c",), duration_s=NS, workspace_bytes=150),
           Op("f", "F", ("a", "c"), ("y",), duration_s=NS)]
    g, hw = Graph.build("fetch_after", tensors, ops), simple_hardware(hbm=510)
    per_op = [b.value for b in bounds.makespan_bounds(g, hw) if b.reason.startswith("op 'm'")]
    assert per_op == [283]
    optimum = plan_exact(g, hw)
    tl = simulate(g, hw, optimum)
    assert tl.valid and optimum.stats["exact"]["proven"] and tl.metrics.makespan_ns == 403
    # With p free to re-run, a may be dropped and made again after m instead: the fetch no longer counts.
    free = Graph.build("fetch_after_remat", tensors, [Op("p", "F", ("x",), ("a", "s"), duration_s=NS), *ops[1:]])
    assert bounds.makespan_bound(free, hw).value < 10


def _crowded_window(floater_ns: int) -> Graph:
    """a makes h and h2 and reads w (100 B, pinned to HBM); m's 150 B workspace leaves no room for w, which b reads
    after m; f, unordered with m, reads h2 (100 B)."""
    tensors = [Tensor("x", 1, TensorKind.INPUT), Tensor("w", 100, TensorKind.WEIGHT), Tensor("h", 1),
               Tensor("h2", 100), Tensor("o", 1), Tensor("z", 1, TensorKind.OUTPUT), Tensor("y", 1, TensorKind.OUTPUT)]
    ops = [Op("a", "F", ("x", "w"), ("h", "h2"), duration_s=10 * NS, recompute=False),
           Op("m", "F", ("h",), ("o",), duration_s=10 * NS, workspace_bytes=150),
           Op("b", "F", ("o", "w"), ("y",), duration_s=10 * NS),
           Op("f", "F", ("h2",), ("z",), duration_s=floater_ns * NS)]
    return Graph.build("crowded_window", tensors, ops)


def test_the_window_bound_waits_for_what_a_crowded_op_forced_off():
    # At m, w (100 B), h, o and the workspace exceed the 210 B budget by 42 B: they are off HBM when m ends and come
    # back before b (42 ns at 1 B/ns), which only f could hide; f would need h2 (100 B) back too, 100 ns for its
    # 40 ns. So 70 ns of compute + 42 ns, where the other bounds say 94 ns at most (42 ns of Stores first). The
    # proven optimum is 220 ns.
    from planner.planners.exact import plan_exact

    g, hw = _crowded_window(40), simple_hardware(hbm=210)
    found = bounds.makespan_bounds(g, hw)
    window = [b.value for b in found if b.reason.startswith("window after op 'm'")]
    assert window == [pytest.approx(112, abs=0.01)]
    assert max(b.value for b in found if not b.reason.startswith("window")) == 94
    optimum = plan_exact(g, hw)
    tl = simulate(g, hw, optimum)
    assert tl.valid and optimum.stats["exact"]["proven"] and optimum.stats["exact"]["optimum_ns"] == 220
    # A floater that reads nothing made before m hides the fetch: no window bound above the compute.
    free = Graph.build("crowded_window_free", list(g.tensors.values()),
                       [*g.ops[:3], Op("f", "F", ("x",), ("z",), duration_s=60 * NS)])
    assert not [b for b in bounds.makespan_bounds(free, hw) if b.reason.startswith("window")]
