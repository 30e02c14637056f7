"""``exact``: a proven-optimal reference for small graphs, to measure how far the other planners are from the best.

For every topological order of the graph (``networkx.all_topological_sorts``), the CP-SAT model of the cpsat
planner (``planner/planners/cpsat``) is built with every gap of every tensor a candidate, at full precision (a
tick is the greatest common divisor of every op and transfer duration, a memory unit that of every size, so
nothing is rounded), and solved to optimality. The order whose optimum is lowest wins; its solution is decoded
into a program and checked by the executor, like every plan. The search starts from an incumbent, the fastest
valid plan of greedy without re-runs, no offload and (from cpsat) the caller's own: each order's model is asked
only for a makespan below the best plan so far, and is hinted by the incumbent when that runs in its order, so
CP-SAT mostly proves instead of descending from a no-offload hint that does not fit the budget
(transformer_block-10 at 60% / 70% of its peak: 8.6 / 22.6 s before, 1.8 / 0.2 s). When no order beats the
incumbent, the incumbent is the optimum.

What "optimal" covers: the plans of the model's space, over every order, every set of offloaded gaps (every
stretch between two uses of a tensor, before its first use, after its last, the starting tier of every tensor the
graph leaves free) and every timing of the transfers on the links: one Store per version of a tensor, one remote
tier per tensor, each Detach as early as its users and Store allow (later only holds HBM longer). A program
outside that space (the same version stored twice, a tensor spread over two remote tiers) is not searched; no
planner of this project makes one that would be faster. When every order's model is solved to optimality the
plan's status is ``optimal``; when the time limit stops one first, ``feasible`` (the best found, not proven).

Only for graphs of up to ``MAX_OPS`` ops: the number of orders and of candidate gaps grows fast.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace

import networkx as nx

from planner.bounds import makespan_bound
from planner.cost import op_durations_ns, transfer_duration_ns
from planner.errors import InputError
from planner.executor import simulate
from planner.graph import Graph
from planner.hardware import Hardware
from planner.plan import Plan, PlanStatus, StepKind
from planner.planners.cpsat import worker
from planner.planners.cpsat.data import Scale, build_problem, canonical
from planner.planners.cpsat.decode import plan_from_assignment
from planner.planners.cpsat.hint import assignment_from_plan, check, tick_times
from planner.planners.cpsat.model import Model, whole_frame
from planner.planners.greedy import plan_greedy
from planner.planners.none import no_offload_program, plan_none

MAX_OPS = 12
MAX_ORDERS = 5000


def plan_exact(graph: Graph, hw: Hardware, time_limit: float = 60.0, max_orders: int = MAX_ORDERS) -> Plan:
    """Return the optimal plan (see the module doc) within ``time_limit`` seconds, or the best found then.

    Raises InputError for a graph of more than ``MAX_OPS`` ops or with more than ``max_orders`` orders.
    """
    return search_exact(graph, hw, time_limit, max_orders)


def search_exact(graph: Graph, hw: Hardware, time_limit: float = 60.0, max_orders: int = MAX_ORDERS,
                 start: Plan | None = None) -> Plan:
    """``plan_exact``, with ``start`` (a plan without re-runs, such as cpsat's) among the incumbents: each order is
    then asked only for a plan faster than the best of them, which is returned as optimal when none is."""
    if len(graph.ops) > MAX_OPS:
        raise InputError("command line", "--planner", f"exact handles graphs of up to {MAX_OPS} ops; this one has "
                         f"{len(graph.ops)}")
    orders = list(itertools.islice(nx.all_topological_sorts(graph.dag), int(max_orders) + 1))
    if len(orders) > max_orders:
        raise InputError("command line", "--planner", f"exact: the graph has more than {max_orders} orders")
    index = graph.op_index
    orders.sort(key=lambda o: [index[n] for n in o])  # the graph's own order first; deterministic
    t0 = time.monotonic()
    # An incumbent from the quick planners (without re-runs, which the model has not): every order is then asked
    # only for a plan that beats it, and its program hints the order it runs in.
    best: tuple[int, Plan] | None = incumbent(graph, hw, start)  # (executed makespan, plan)
    floor = makespan_bound(graph, hw, recompute=False).value  # no plan of the model's space runs faster
    optimum: int | None = None  # the lowest model optimum over the orders
    proven = True
    solved = pruned = 0
    for order in orders:
        left = time_limit - (time.monotonic() - t0)
        if left <= 0.05:
            proven = False
            break
        # Branch and bound over the orders: an order is only asked for a model makespan below the best plan so far
        # and the lowest optimum proven so far (``cut``), and proving that none exists is usually much faster than
        # solving it again. Ties with a model optimum are still searched while no decoded plan runs at it
        # (decoding can add a few ns of waiting, and another order's program may not).
        exact_hit = best is not None and optimum is not None and best[0] <= optimum
        cuts = [] if optimum is None else [optimum if exact_hit else optimum + 1]
        cut = min(cuts + ([best[0]] if best is not None else []), default=None)
        result = _solve_order(graph, hw, order, left, below=cut, hint=None if best is None else best[1], floor=floor)
        if result is NO_BETTER:
            solved += 1
            pruned += 1
            continue
        if result is None:
            proven = False
            continue
        optimal, objective, plan, executed = result
        solved += 1
        proven = proven and optimal
        optimum = objective if optimum is None else min(optimum, objective)
        if plan is not None and (best is None or executed < best[0]):
            best = (executed, plan)
    if optimum is None and best is not None:
        # No order has a plan below the incumbent: it is the optimum.
        optimum = best[0]
    proven = proven and optimum is not None
    stats = {"exact": {"orders": len(orders), "orders_solved": solved, "orders_pruned": pruned, "proven": proven,
                       "optimum_ns": optimum if proven else None, "best_found_ns": None if best is None else best[0]}}
    options = {"time_limit": float(time_limit)}
    if best is None:
        return Plan(graph.name, (), "exact", options, PlanStatus.INFEASIBLE,
                    ("no order gave a plan the executor accepts within the time limit",), stats)
    if not proven:
        status = PlanStatus.FEASIBLE
        note = ("the time limit stopped the search before every order was proven optimal: the best plan found, "
                "not proven")
    elif best[0] <= optimum:
        status = PlanStatus.OPTIMAL
        note = "optimal over every order and every plan of the model's space (planner/planners/exact.py)"
    else:
        # The decoded program runs a little later than the model's times (rounding of waits): the optimum is
        # proven, this plan is within best - optimum of it.
        status = PlanStatus.FEASIBLE
        note = (f"the optimum is {optimum} ns (proven); the decoded plan runs {best[0] - optimum} ns later in the "
                "executor")
    return replace(best[1], planner="exact", options=options, status=status, notes=(note,), stats=stats)


NO_BETTER = "no better"  # _solve_order: CP-SAT proved the order has no plan below the bound it was given


def _solve_order(graph: Graph, hw: Hardware, order: list[str], wall_s: float, below: int | None = None,
                 hint: Plan | None = None, floor: float = 0.0) -> tuple[bool, int, Plan | None, int] | str | None:
    """(proven optimal, model makespan in ns, decoded plan or None when invalid, its executed makespan) for one
    order; ``NO_BETTER`` when ``below`` (ns) is given and the order's model has no makespan under it; None if no
    solution was found in time. ``hint``: a plan whose values hint the model when they are feasible in it (else
    the no-offload program in ``order``, which may not fit the budget). ``floor``: a makespan (ns) no plan beats."""
    base = no_offload_program(graph, hw, order, planner="exact")
    scale = exact_scale(graph, hw)
    every_gap = {(name, nb) for name in graph.tensors for nb in range(len(graph.users[name]) + 1)}
    p = build_problem(graph, hw, order, scale, horizon=1, must=every_gap, gap_fraction=0.0, min_tensor_fraction=0.0)
    ticks = tick_times(p, base)
    # A horizon every plan of the space fits in: every op and every candidate transfer one after another.
    serial = sum(o.dur for o in p.ops) + sum(max(g.fetch.values(), default=0) for g in p.gaps) + sum(
        max(s.store.values(), default=0) for s in p.slots)
    p.horizon = max(max((e for _s, e in ticks), default=1), serial)
    asg, _notes = assignment_from_plan(p, base, ticks)
    canonical(p, asg)
    if hint is not None and hint.compute_order() == list(order):
        hinted, notes = assignment_from_plan(p, hint, tick_times(p, hint))
        canonical(p, hinted)
        if not notes and not check(p, hinted):
            asg = hinted
    model = Model(p, whole_frame(p, asg, floor_ns=floor))
    model.add_hints()
    if below is not None:
        model.cp.add(model.makespan * p.scale.tick_ns < below)
    params = {"num_workers": 1, "random_seed": 0, "max_time_in_seconds": wall_s,
              "keep_all_feasible_solutions_in_presolve": True}
    res = worker.solve(model.cp, params, wall_s)
    if below is not None and res.status == "INFEASIBLE":
        return NO_BETTER
    if not res.has_solution:
        return None
    # The last solution is the optimum; earlier ones may decode to a program that runs as fast (decoding may add a
    # nanosecond of waiting), so the fastest valid decoded program is kept.
    best: tuple[int, Plan] | None = None
    for values in [res.values] + [v for _obj, v in reversed(res.history) if v is not res.values]:
        plan = plan_from_assignment(p, model.read(values), planner="exact")
        timeline = simulate(graph, hw, plan)
        if timeline.valid and (best is None or timeline.metrics.makespan_ns < best[0]):
            best = (timeline.metrics.makespan_ns, plan)
    makespan = int(res.values[model.makespan.index]) * p.scale.tick_ns
    if best is None:
        return res.status == "OPTIMAL", makespan, None, 0
    return res.status == "OPTIMAL", makespan, best[1], best[0]


def incumbent(graph: Graph, hw: Hardware, start: Plan | None = None) -> tuple[int, Plan] | None:
    """(executed makespan, plan): the fastest valid plan of ``start``, greedy (without re-runs) and no offload, or
    None. A plan with re-run steps is left out (the model has none, so it would not be an optimum of its space)."""
    found = []
    plans = [plan_greedy(graph, hw, recompute=False), plan_none(graph, hw)]
    if start is not None and not start.count(StepKind.RECOMPUTE):
        plans.insert(0, start)
    for plan in plans:
        tl = simulate(graph, hw, plan)
        if tl.valid:
            found.append((tl.metrics.makespan_ns, plan))
    return min(found, key=lambda x: x[0], default=None)


def exact_scale(graph: Graph, hw: Hardware) -> Scale:
    """The coarsest scale that rounds nothing: the tick divides every op duration and every transfer of every
    tensor on every link; the unit divides every size."""
    tick = 0
    for ns in op_durations_ns(graph, hw).values():
        tick = math.gcd(tick, int(ns))
    for t in graph.tensors.values():
        for link in hw.links:
            tick = math.gcd(tick, transfer_duration_ns(t.bytes, link))
    unit = 0
    for s in [t.bytes for t in graph.tensors.values()] + [op.workspace_bytes for op in graph.ops]:
        unit = math.gcd(unit, int(s))
    return Scale(max(1, tick), max(1, unit))


__all__ = ["MAX_OPS", "plan_exact", "search_exact"]
