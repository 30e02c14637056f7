"""The executor's Timeline: its steps and residencies, kept as columns, read as the objects they stand for."""

import pickle

from conftest import chain_graph, simple_hardware
from test_executor import offload_plan, skip_graph

from planner.allocator import tier_columns
from planner.executor import simulate
from planner.hardware import HBM
from planner.planners.none import plan_none
from planner.timeline import Residencies, Residency, StepTimes, StepTiming


def _timeline():
    g = skip_graph()
    hw = simple_hardware(hbm=1000)
    return simulate(g, hw, offload_plan())


def test_steps_read_as_step_timings():
    tl = _timeline()
    steps = tl.steps
    assert isinstance(steps, StepTimes)
    objects = tuple(steps)
    assert len(objects) == len(steps) and all(isinstance(s, StepTiming) for s in objects)
    assert steps[0] == objects[0] and steps[-1] == objects[-1]
    assert steps[1:3] == objects[1:3]
    # Equal to the tuple of objects (as Timeline.steps was), and to another run's.
    assert steps == objects and steps == simulate(skip_graph(), simple_hardware(hbm=1000), offload_plan()).steps
    assert [s.end_ns for s in steps] == steps.ends


def test_residencies_read_as_residency_objects():
    tl = _timeline()
    res = tl.residencies
    assert isinstance(res, Residencies)
    objects = list(res)
    assert len(objects) == len(res) and all(isinstance(r, Residency) for r in objects)
    assert res[0] == objects[0] and res[-1] == objects[-1] and res[1:3] == tuple(objects[1:3])
    # The detached a0 has two HBM residencies: before its Store's Detach and after its Prefetch.
    a0 = [r for r in res if r.name == "a0" and r.tier == HBM]
    assert len(a0) == 2 and a0[0].end_ns <= a0[1].start_ns
    names, sizes, starts, ends, held = tier_columns(res, HBM)
    hbm = [r for r in objects if r.tier == HBM]
    assert names == [r.name for r in hbm] and sizes == [r.bytes for r in hbm]
    assert (starts, ends, held) == ([r.start_ns for r in hbm], [r.end_ns for r in hbm], [r.until_end for r in hbm])
    # The same columns from plain objects (a Timeline built by hand).
    assert tier_columns(objects, HBM) == (names, sizes, starts, ends, held)


def test_live_at_is_the_residencies_held_on_a_tier_at_an_instant():
    tl = _timeline()
    res = tl.residencies
    instants = sorted({r.start_ns for r in res} | {r.end_ns for r in res} | {r.start_ns + 1 for r in res})
    seen = 0
    for tier in (HBM, "host", "nowhere"):
        for t in instants:
            want = [r for r in res if r.tier == tier and r.start_ns <= t < r.end_ns]
            assert res.live_at(tier, t) == want
            seen += len(want)
    assert seen  # some instants hold residencies


def test_a_timeline_pickles_and_compares_equal():
    g = chain_graph()
    hw = simple_hardware(hbm=10_000)
    tl = simulate(g, hw, plan_none(g, hw))
    back = pickle.loads(pickle.dumps(tl))
    assert back == tl and list(back.residencies) == list(tl.residencies) and back.steps == tl.steps
