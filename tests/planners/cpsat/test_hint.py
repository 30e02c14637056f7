"""Plans turned into the model's values (planner/planners/cpsat/hint.py): what does not map is noted, never
raised, so the search still runs."""

from __future__ import annotations

from conftest import fwd_bwd, simple_hardware
from test_properties import with_pool

from planner import api
from planner.executor import simulate
from planner.hardware import HBM
from planner.planners.cpsat.run import Run
from planner.planners.cpsat.solve import prepare
from planner.planners.greedy import plan_greedy
from planner.planners.none import plan_none


def test_a_plan_on_a_tier_the_model_does_not_offer_is_noted_and_the_search_still_runs():
    # The pool beats the host in bandwidth, latency and channels and holds everything, so the model offers the pool
    # only. Greedy's plan for the same budget without the pool stores to the host: outside the model. Mapping it
    # raised a KeyError, and cpsat fell back to its starting plan (found by fuzzing against the exact search).
    g = fwd_bwd()
    big = simple_hardware(hbm=10**9)
    peak = simulate(g, big, plan_none(g, big)).metrics.peak_bytes[HBM]
    host_only = simple_hardware(hbm=int(peak * 0.7), bw=4e9, latency=5e-8, channels=2)
    both = with_pool(host_only)
    plan = plan_greedy(g, host_only)
    assert {s.stream for s in plan.steps if s.kind.name == "STORE"} == {"d2h"}
    tl = simulate(g, both, plan)
    assert tl.valid
    run = Run.start(g, both, 10.0)
    prepare(run, plan, tl)
    assert any("does not offer" in note for note in run.notes), run.notes
    result = api.plan(g, both, planner="cpsat", time_limit=5)
    assert result.timeline.valid
    assert not any("cpsat failed" in note for note in result.plan.notes), result.plan.notes
