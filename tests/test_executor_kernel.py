"""The compiled replay (planner/executor_kernel.py) against the executor's Python replay: on every plan the same
timeline (times, residencies, metrics, violations), and on every plan whose replay finds no violation the
compiled loop is the one that answered."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import pytest
from conftest import GRAPHS, SOLUTIONS, fwd_bwd, simple_hardware
from hypothesis import given
from hypothesis import strategies as st
from test_properties import at_fraction, graphs_and_hardware, property_settings

from planner import executor
from planner.executor import simulate
from planner.fileio import read_json
from planner.formats import load_graph
from planner.hardware import Hardware
from planner.plan import Plan, Step, StepKind
from planner.planners.greedy import plan_greedy
from planner.planners.none import plan_none
from planner.planners.reactive import plan_reactive
from planner.schedule import plan_from_dict

# What the replay's loop reports (the compiled loop gives way to the Python one on these); a program that is not
# well formed is not replayed at all. The steady-state check, the capacity sweep and the offsets follow either loop.
LOOP_KINDS = {"already_resident", "data_loss", "detach_not_resident", "no_remote_copy", "not_resident",
              "stale_recompute", "store_not_resident", "program"}


def _both(graph, hw, plan) -> tuple:
    """(the Python replay's timeline, the compiled replay's, whether the compiled loop answered)."""
    with mock.patch.object(executor, "COMPILED_MIN_STEPS", 10**9):
        python = simulate(graph, hw, plan)
    answered = []
    real = executor._replay_compiled

    def spy(*args):
        got = real(*args)
        answered.append(got is not None)
        return got

    with mock.patch.object(executor, "COMPILED_MIN_STEPS", 0), mock.patch.object(executor, "_replay_compiled", spy):
        compiled = simulate(graph, hw, plan)
    return python, compiled, any(answered)


def _assert_same(python, compiled) -> None:
    assert compiled.steps == python.steps
    assert compiled.residencies == python.residencies
    assert compiled.metrics == python.metrics
    assert compiled.violations == python.violations
    assert compiled.compactions == python.compactions


def _broken(plan: Plan, hw: Hardware, k: int, how: int) -> Plan:
    """``plan`` with its step ``k`` changed so that the program is still well formed but may break a rule of
    residency: its waits dropped (``how`` 0), a transfer made a Detach (1), a Detach made a Prefetch (2)."""
    steps = list(plan.steps)
    s = steps[k]
    if how == 1 and s.kind in (StepKind.STORE, StepKind.PREFETCH):
        steps[k] = Step(StepKind.DETACH, s.target, "compute", s.waits)
    elif how == 2 and s.kind is StepKind.DETACH:
        fetch = next(ln.name for ln in hw.links if ln.dst == "hbm")
        steps[k] = Step(StepKind.PREFETCH, s.target, fetch, s.waits)
    else:
        steps[k] = replace(s, waits=())
    return replace(plan, steps=tuple(steps))


@property_settings(40)
@given(graphs_and_hardware(max_ops=10), st.floats(0.3, 1.1),
       st.sampled_from(["none", "reactive", "greedy", "remat", "remat"]),
       st.integers(0, 10**6), st.integers(0, 3))
def test_the_compiled_replay_gives_the_python_replays_timeline(gh, fraction, planner, pick, how):
    g, base = gh
    hw = at_fraction(g, fraction, base)
    if hw is None:
        return
    if planner == "remat":  # re-runs only, so that programs with recompute steps are drawn often
        plan = plan_greedy(g, hw, offload=False)
    else:
        plan = {"none": plan_none, "reactive": plan_reactive, "greedy": plan_greedy}[planner](g, hw)
    python, compiled, answered = _both(g, hw, plan)
    _assert_same(python, compiled)
    in_loop = {v.kind for v in python.violations} & LOOP_KINDS
    assert answered == (not in_loop)
    if how < 3 and plan.steps:
        broken = _broken(plan, hw, pick % len(plan.steps), how)
        python, compiled, _answered = _both(g, hw, broken)
        _assert_same(python, compiled)


@pytest.mark.parametrize("path", sorted(SOLUTIONS.glob("*.schedule.json")), ids=lambda p: p.name.split(".")[0])
def test_on_the_committed_schedules_the_compiled_replay_agrees(path):
    doc = read_json(path)
    g = load_graph(GRAPHS / f"{path.name.split('.')[0]}.json")
    hw = Hardware.from_dict(doc["hardware"])
    plan = plan_from_dict(doc, str(path))
    python, compiled, answered = _both(g, hw, plan)
    assert python.valid and answered
    _assert_same(python, compiled)
    # A transfer in the middle made a Detach: the compiled loop gives way and the violations are the Python replay's.
    moves = [i for i, s in enumerate(plan.steps) if s.kind in (StepKind.STORE, StepKind.PREFETCH)]
    k = moves[len(moves) // 2]
    python, compiled, answered = _both(g, hw, _broken(plan, hw, k, 1))
    assert not python.valid and not answered
    _assert_same(python, compiled)


def _stored_and_dropped(plan: Plan, hw: Hardware, k: int, tensor: str) -> Plan:
    """``plan`` with a Store of ``tensor`` and a Detach after it inserted before its step ``k`` (the waits
    renumbered): the tensor leaves HBM, its copy kept remote."""
    store = next(ln.name for ln in hw.links if ln.src == "hbm")
    steps = [replace(s, waits=tuple(w + 2 * (w >= k) for w in s.waits)) for s in plan.steps]
    steps[k:k] = [Step(StepKind.STORE, tensor, store), Step(StepKind.DETACH, tensor, "compute", (k,))]
    return replace(plan, steps=tuple(steps))


def test_on_a_plan_that_recomputes_every_break_gives_the_python_replays_timeline():
    g = fwd_bwd(n=6)
    hw = at_fraction(g, 0.5, simple_hardware(bw=1e6))
    plan = plan_greedy(g, hw, offload=False)
    assert plan.count(StepKind.RECOMPUTE) and simulate(g, hw, plan).valid
    broken = [_broken(plan, hw, k, how) for k in range(len(plan.steps)) for how in range(3)]
    # An input of each re-run stored and dropped just before it: the re-run reads what is not on HBM.
    broken += [_stored_and_dropped(plan, hw, k, t) for k, s in enumerate(plan.steps)
               if s.kind is StepKind.RECOMPUTE for t in g.op(s.target).reads]
    kinds = set()
    for b in broken:
        python, compiled, answered = _both(g, hw, b)
        _assert_same(python, compiled)
        found = {v.kind for v in python.violations} & LOOP_KINDS
        assert answered == (not found)
        kinds |= found
    assert "not_resident" in kinds


def test_a_re_run_after_an_in_place_update_of_its_input_is_stale_in_both_replays():
    # The re-run's own check (the versions its op first read); no broken greedy plan above reaches it.
    from test_executor_recompute import ProgramBuilder, inplace_graph, stale_program

    g = inplace_graph()
    python, compiled, answered = _both(g, simple_hardware(hbm=1000), stale_program())
    _assert_same(python, compiled)
    assert [v.kind for v in python.violations] == ["stale_recompute"] and not answered
    # The same program with the update after the re-run is valid, and the compiled loop answers it.
    pb = ProgramBuilder()
    for kind, op in (("compute", "p"), ("detach", "y"), ("recompute", "p"), ("compute", "u"), ("compute", "c")):
        getattr(pb, kind)(op)
    python, compiled, answered = _both(g, simple_hardware(hbm=1000), pb.build("inplace", "hand"))
    _assert_same(python, compiled)
    assert python.valid and answered
