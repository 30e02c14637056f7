"""Property tests: on random DAGs with random sizes, durations and budgets, every plan of greedy, reactive and
none validates, or its planner says it is infeasible and the lower bound (or the planner's documented limit)
explains why."""

from __future__ import annotations

import os
from dataclasses import replace

from conftest import simple_hardware
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.bounds import initial_hbm_bytes, largest_working_set, makespan_bounds
from planner.executor import simulate
from planner.graph import AUTO, Graph, Op, Tensor, TensorKind
from planner.hardware import HBM, Hardware, Link, Tier
from planner.plan import StepKind
from planner.planners.greedy import plan_greedy
from planner.planners.none import plan_none
from planner.planners.reactive import plan_reactive

PRE_KINDS = [TensorKind.INPUT, TensorKind.WEIGHT, TensorKind.OPTIMIZER_STATE, TensorKind.KV_CACHE]
NEW_KINDS = [TensorKind.ACTIVATION, TensorKind.ACTIVATION, TensorKind.GRADIENT, TensorKind.OUTPUT]


@st.composite
def graphs(draw, remote_tiers=("host",), max_ops: int = 10) -> Graph:
    """A random DAG: a few tensors that exist before the step (some on a remote tier, some updated in place),
    then ops that read earlier tensors and produce new ones."""
    tensors: list[Tensor] = []
    avail: list[str] = []
    for k in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(PRE_KINDS))
        # Persistent tensors may be left to the planner (home auto); inputs are always pinned.
        homes = (HBM,) + tuple(remote_tiers) + ((AUTO,) if kind is not TensorKind.INPUT else ())
        home = draw(st.sampled_from(homes))
        tensors.append(Tensor(f"p{k}", draw(st.integers(1, 1000)), kind, home=home))
        avail.append(f"p{k}")
    updatable = [t.name for t in tensors if t.persistent]
    ops: list[Op] = []
    for i in range(draw(st.integers(1, max_ops))):
        inputs = draw(st.lists(st.sampled_from(avail), min_size=1, max_size=3, unique=True))
        updates = [t for t in draw(st.lists(st.sampled_from(updatable), max_size=1)) if updatable] if updatable else []
        updates = [t for t in updates if t not in inputs]
        outputs = []
        for j in range(draw(st.integers(0 if updates else 1, 2))):
            name = f"t{i}_{j}"
            tensors.append(Tensor(name, draw(st.integers(1, 1000)), draw(st.sampled_from(NEW_KINDS))))
            outputs.append(name)
        ops.append(Op(
            f"op{i}", "F", tuple(inputs), tuple(outputs), tuple(updates),
            duration_s=draw(st.integers(1, 50)) * 1e-6,
            workspace_bytes=draw(st.sampled_from([0, 0, 0, 64, 500])),
        ))
        avail += outputs
    return Graph.build("random", tensors, ops)


def with_pool(hw: Hardware) -> Hardware:
    """Add a faster 'pool' tier (2 channels) next to the host."""
    return replace(
        hw,
        tiers=hw.tiers + (Tier("pool", 10**9),),
        links=hw.links + (Link("d2p", HBM, "pool", 4e9, 0.0, 2), Link("p2d", "pool", HBM, 4e9, 0.0, 2)),
    )


@st.composite
def graphs_and_hardware(draw, max_ops: int = 10) -> tuple[Graph, Hardware]:
    """A random graph (``graphs``) and a hardware of unbounded HBM for it: a host, or a host and a pool, with
    links of drawn bandwidth, latency and channels (tiers that tie on bandwidth included)."""
    two = draw(st.booleans())
    g = draw(graphs(remote_tiers=("host", "pool") if two else ("host",), max_ops=max_ops))
    hw = simple_hardware(hbm=10**12, bw=draw(st.sampled_from([1e9, 2.5e8, 4e9])),
                         latency=draw(st.sampled_from([0.0, 1e-8, 5e-8])), channels=draw(st.sampled_from([1, 2])))
    return g, with_pool(hw) if two else hw


def budgeted(hw: Hardware, budget: int) -> Hardware:
    return replace(hw, tiers=tuple(Tier(t.name, budget) if t.name == HBM else t for t in hw.tiers))


# A longer campaign than CI's: HO_PLAN_FUZZ=N runs every property test on N fresh random examples instead of its
# fixed few (docs/testing.md). Bugs that the fixed examples missed were found that way.
FUZZ_EXAMPLES = int(os.environ.get("HO_PLAN_FUZZ") or 0)


def property_settings(examples: int) -> settings:
    """``examples`` derandomized examples (the suite stays deterministic), or a fuzz campaign's."""
    return settings(max_examples=FUZZ_EXAMPLES or examples, deadline=None, derandomize=not FUZZ_EXAMPLES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


SMALL_PROPERTY = property_settings(12)


def at_fraction(g: Graph, fraction: float, base: Hardware | None = None) -> Hardware | None:
    """``base`` (default ``simple_hardware``) with an HBM budget of ``fraction`` of the no-offload peak; None below
    the HBM floor (api.plan refuses such a budget before any planner runs)."""
    hw = base or simple_hardware()
    hw = budgeted(hw, max(1, int(no_offload_peak(g, hw) * fraction)))
    return None if hw.hbm_bytes < max(largest_working_set(g)[0], initial_hbm_bytes(g)) else hw


def no_offload_peak(g: Graph, hw: Hardware) -> int:
    big = budgeted(hw, 10**12)
    return simulate(g, big, plan_none(g, big)).metrics.peak_bytes[HBM]


def assert_restored(g: Graph, plan, tl) -> None:
    """Independently of the executor's own check: the plan states where every free tensor starts, keeps every
    pin, and each tensor that outlives the step still holds a copy on its starting tier when the step ends."""
    assert set(g.free_tensors) <= set(plan.placement)
    held = {(r.tier, r.name) for r in tl.residencies if r.until_end}
    for name, t in g.tensors.items():
        if name in g.producer:
            continue
        tier = plan.placement.get(name, t.home)
        if t.pinned:
            assert tier == t.home
        if t.persistent:
            assert (tier, name) in held, (name, tier)


def check(g: Graph, hw: Hardware) -> None:
    budget = hw.hbm_bytes
    lws, _op = largest_working_set(g)
    for name, fn in (("none", plan_none), ("reactive", plan_reactive), ("greedy", plan_greedy)):
        plan = fn(g, hw)
        tl = simulate(g, hw, plan)
        if tl.valid:
            assert_restored(g, plan, tl)
            for b in makespan_bounds(g, hw):  # every bound holds for every valid plan
                assert b.value <= tl.metrics.makespan_ns + 1e-6, (name, b.reason, b.value, tl.metrics.makespan_ns)
            if name == "greedy":
                assert plan.status == "feasible", plan.notes
            continue
        why = [v.describe() for v in tl.violations[:5]]
        assert plan.status == "infeasible", (name, budget, lws, why, plan.notes)
        assert plan.notes, name
        if name == "none":
            # Its documented limit: it never offloads, so its own peak must be over the budget.
            assert tl.metrics.peak_bytes[HBM] > budget and "never offloads" in plan.notes[0]
        else:
            # The lower bound explains it: some op's working set does not fit.
            assert budget < max(lws, initial_hbm_bytes(g)), (name, budget, lws, why, plan.notes)
    if budget >= max(lws, initial_hbm_bytes(g)):
        # Greedy always finds a valid plan when the budget is at least the lower bound and remote room is ample.
        plan = plan_greedy(g, hw)
        assert simulate(g, hw, plan).valid and plan.status == "feasible", plan.notes


PROPERTY = property_settings(60)


@PROPERTY
@given(graphs(), st.floats(0.3, 1.3), st.sampled_from([0.0, 200e-9]), st.sampled_from([1, 2]),
       st.sampled_from([1e9, 1e7]))
def test_plans_validate_or_are_explained(g, fraction, latency, channels, bandwidth):
    # At 1e7 B/s a 1000-byte transfer takes 100 us, longer than any op: transfers then stall the plan.
    hw = simple_hardware(latency=latency, channels=channels, bw=bandwidth)
    hw = budgeted(hw, max(1, int(no_offload_peak(g, hw) * fraction)))
    check(g, hw)


@PROPERTY
@given(graphs(remote_tiers=("host", "pool")), st.floats(0.3, 1.1))
def test_plans_validate_or_are_explained_with_two_remote_tiers(g, fraction):
    hw = with_pool(simple_hardware())
    hw = budgeted(hw, max(1, int(no_offload_peak(g, hw) * fraction)))
    check(g, hw)


@PROPERTY
@given(graphs(), st.integers(0, 3), st.integers(0, 6), st.integers(0, 4), st.integers(1, 4))
def test_greedy_settings_never_break_validity(g, select_distance, select_num, prefetch_distance, release_distance):
    hw = simple_hardware()
    lws, _ = largest_working_set(g)
    hw = budgeted(hw, max(lws, initial_hbm_bytes(g), int(no_offload_peak(g, hw) * 0.6)))
    plan = plan_greedy(g, hw, select_distance=select_distance, select_num=select_num,
                       prefetch_distance=prefetch_distance, release_distance=release_distance)
    tl = simulate(g, hw, plan)
    assert tl.valid and plan.status == "feasible", ([v.describe() for v in tl.violations[:5]], plan.notes)


@PROPERTY
@given(graphs(remote_tiers=("host", "pool")), st.sampled_from(["stall", "belady"]),
       st.sampled_from(["auto", "lowest-peak", "store-release", "sources-first", "graph", "sampled-3", "deferred-4"]),
       st.booleans(), st.booleans(), st.floats(0.3, 1.0))
def test_greedy_options_never_break_validity(g, evict, order, recompute, offsets, fraction):
    # Every order, eviction rule and answer a user can pass, at any budget down to the floor.
    hw = with_pool(simple_hardware())
    lws, _ = largest_working_set(g)
    hw = budgeted(hw, max(lws, initial_hbm_bytes(g), int(no_offload_peak(g, hw) * fraction)))
    plan = plan_greedy(g, hw, evict=evict, order=order, recompute=recompute, offsets=offsets)
    tl = simulate(g, hw, plan)
    assert tl.valid and plan.status == "feasible", ([v.describe() for v in tl.violations[:5]], plan.notes)


@SMALL_PROPERTY
@given(graphs(max_ops=6), st.floats(0.4, 1.1))
def test_cpsat_plans_with_random_pins_and_free_homes_restore_the_placement(g, fraction):
    # The model decides the tiers of the free tensors; whatever it returns must validate and restore them.
    from planner.planners.cpsat import plan_cpsat

    hw = at_fraction(g, fraction)
    if hw is None:
        return
    plan = plan_cpsat(g, hw, time_limit=3, workers=1)
    assert not [note for note in plan.notes if "cpsat failed" in note], plan.notes
    tl = simulate(g, hw, plan)
    if tl.valid:
        assert_restored(g, plan, tl)
    else:
        # cpsat falls back to its best starting plan; it may only fail where greedy and reactive fail too.
        assert not simulate(g, hw, plan_greedy(g, hw)).valid and not simulate(g, hw, plan_reactive(g, hw)).valid


@SMALL_PROPERTY
@given(graphs(max_ops=8), st.floats(0.4, 1.0), st.sampled_from([1e6, 1e9]))
def test_bounds_hold_for_plans_that_recompute(g, fraction, bandwidth):
    # Remat-only and joint plans may trade link time for compute: the bounds allowing re-runs hold for them, and
    # never exceed the bounds for plans without re-runs.
    from planner.planners.cpsat import plan_cpsat

    hw = at_fraction(g, fraction)
    if hw is None:
        return
    hw = replace(hw, links=tuple(replace(ln, bandwidth_Bps=bandwidth) for ln in hw.links))
    with_rc = makespan_bounds(g, hw, recompute=True)
    without = {b.reason.split(":")[0]: b.value for b in makespan_bounds(g, hw, recompute=False)}
    for b in with_rc:
        assert b.value <= without.get(b.reason.split(":")[0], float("inf")) + 1e-6, b.reason
    plans = [plan_greedy(g, hw, offload=False), plan_greedy(g, hw),
             plan_cpsat(g, hw, time_limit=2, workers=1, offload=False)]
    for plan in plans:
        tl = simulate(g, hw, plan)
        if not tl.valid:
            continue
        for b in with_rc:
            assert b.value <= tl.metrics.makespan_ns + 1e-6, (plan.planner, plan.options, b.reason)
        # A re-run's cost is on the compute stream: the ops' compute plus the re-runs'.
        ops_ns = simulate(g, hw, plan_none(g, hw)).metrics.compute_ns
        assert tl.metrics.compute_ns == ops_ns + tl.metrics.recompute_ns
        assert (tl.metrics.recompute_ns > 0) == (plan.count(StepKind.RECOMPUTE) > 0)
