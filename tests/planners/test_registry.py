"""The planner registry (planner/planners/__init__.py): every entry is complete and consistent, since the CLI,
reports, sweeps, solutions and bench read it instead of naming planners themselves."""

from __future__ import annotations

import inspect

import pytest
from conftest import simple_hardware

from planner import api
from planner.errors import InputError
from planner.executor import simulate
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.planners import PLANNERS, REGISTRY, REPORT_PLANNERS, TIMED, get_planner, get_spec
from planner.report import sweeps
from planner.report.solutions import DEFAULT_OPTIONS


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_planner_takes_graph_and_hardware_and_declares_typed_options(name):
    spec = REGISTRY[name]
    params = list(inspect.signature(spec.plan).parameters)
    assert params[:2] == ["graph", "hw"]
    types = api.option_types(name)
    assert set(types) == set(params[2:])
    assert all(t.kind is not None or k in api.INTERNAL_OPTIONS for k, t in types.items())
    # The options it is run with elsewhere are options it takes, of the right types.
    for options in (spec.deterministic, spec.solution_options):
        assert api.check_options(spec.plan, name, options) == options
    if spec.timed is not None:
        assert list(inspect.signature(spec.timed).parameters) == params
    assert spec.summary and spec.color.startswith("#") and spec.marker


def test_derived_views_follow_the_registry():
    assert list(PLANNERS) == list(REGISTRY)
    assert set(TIMED) == {n for n, s in REGISTRY.items() if s.timed}
    assert REPORT_PLANNERS == ("none", "reactive", "greedy", "cpsat")
    assert sweeps.DETERMINISTIC == {"cpsat": {"workers": 1}}
    assert DEFAULT_OPTIONS == {"cpsat": {"time_limit": 10.0, "workers": 1}}
    assert REGISTRY["greedy-sweep"].reported_as == "greedy" and REGISTRY["cpsat"].reported_as == "cpsat"
    styles = {(REGISTRY[n].color, REGISTRY[n].marker) for n in REPORT_PLANNERS}
    assert len(styles) == len(REPORT_PLANNERS)  # plots tell the compared planners apart


def test_an_unknown_planner_is_one_line_naming_the_option():
    with pytest.raises(InputError, match="--planner.*unknown planner 'fastest'.*known: none, reactive"):
        get_planner("fastest")
    with pytest.raises(InputError, match="--planners"):
        get_spec("fastest", "--planners")


@pytest.mark.parametrize("name", [n for n in REGISTRY if n != "exact"])
def test_every_registered_planner_makes_a_plan_the_executor_validates(name):
    tensors = [Tensor("x", 40, TensorKind.INPUT), Tensor("w", 60, TensorKind.WEIGHT, home="host"),
               Tensor("a", 50, TensorKind.ACTIVATION), Tensor("b", 50, TensorKind.ACTIVATION),
               Tensor("y", 30, TensorKind.OUTPUT)]
    ops = [Op("f1", "MatMul", ("x", "w"), ("a",), flops=1e9), Op("f2", "Relu", ("a",), ("b",), flops=1e9),
           Op("f3", "Add", ("b", "a"), ("y",), flops=1e9)]
    g = Graph.build("registry", tensors, ops)
    hw = simple_hardware(hbm=400)
    options = dict(REGISTRY[name].deterministic, **({"time_limit": 5.0} if "time_limit" in api.option_types(name)
                                                  else {}))
    plan = REGISTRY[name].plan(g, hw, **options)
    assert plan.planner == name or REGISTRY[name].family == plan.planner or name == "greedy-sweep"
    assert simulate(g, hw, plan).valid
