"""Plans (planner/plan.py): what crosses a process boundary comes back the same."""

from __future__ import annotations

import copy
import pickle

from conftest import fwd_bwd, simple_hardware

from planner import api
from planner.plan import Plan, PlanStatus, StepKind


def test_a_plan_pickles_and_copies_to_an_equal_plan_with_every_field_and_step_kind():
    graph = fwd_bwd(6)
    planned = api.plan(graph, simple_hardware(hbm=450), planner="greedy")
    assert planned.timeline.valid
    plan = planned.plan
    kinds = {s.kind for s in plan.steps}
    assert {StepKind.COMPUTE, StepKind.DETACH} <= kinds and len(kinds) >= 3  # offloads or recomputes something
    assert any(s.waits for s in plan.steps)
    for back in (pickle.loads(pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)), copy.deepcopy(plan)):
        assert isinstance(back, Plan) and back == plan
        assert all(a.kind is b.kind and type(b.waits) is tuple for a, b in zip(plan.steps, back.steps))
        assert back.status is plan.status and back.offsets == plan.offsets and back.stats == plan.stats
    empty = Plan("g", (), "none", status=PlanStatus.INFEASIBLE, notes=("why",))
    assert pickle.loads(pickle.dumps(empty)) == empty
