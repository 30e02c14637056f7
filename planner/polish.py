"""Stores issued earlier in their link's queue, with the executor as judge.

A link runs its steps in program order. Planners place a Store where their own rules say (greedy: after the
tensor's reads before its gap), so a large Store can queue behind smaller ones that the compute stream does not
wait for, or wait for reads it does not need to wait for: on ``deepseek-v3-nsa-64k-L3-1layer`` at 60% the
embedding table's Store (55 ms) waited for the last chunk's embedding and two activations' Stores, and the first
attention waited for the table's Detach 12 ms longer than its Store takes (504.02 ms; 499.13 ms with the Store
first).

``stores_earlier`` moves one Store at a time to the earliest point of the program where the version it copies is
on HBM (after the step that last made, updated or fetched it, or the step's start), waiting only for that step, and
keeps the move when the executor's run of the whole plan is valid and faster. It is a first-improvement hill climb
over the Stores, largest first, with a fixed number of executor runs (``MAX_RUNS``, fewer on long programs), so
the same plan gives the same result, and it never returns a slower plan. A plan with static offsets is first run
without them and without the allocator model: static offsets delay nothing, so that run has the full run's times
and all its checks but the offsets', and a move it rejects the full run would reject too. Most moves are rejected:
20 runs on greedy's plan of the 20k-op generated graph at 60% take 4.0-4.3 s instead of 5.5-6.2 s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from planner.executor import simulate
from planner.graph import Graph
from planner.hardware import Hardware
from planner.plan import Plan, Step, StepKind
from planner.timeline import Timeline

# Executor runs per pass. The first improving move is usually among the largest Stores: 38 runs found the
# table's on NSA-64k at 60%, one on deepseek-v3-paper at 70% (2124.76 -> 2109.01 ms) and one on transformer_block
# at 60% (86.10 -> 82.60 ms, greedy-sweep's plans).
MAX_RUNS = 40
# Stores tried per round, largest first.
CANDIDATES = 24
# Runs are capped so that a pass replays at most this many steps in all (as planner/defrag.py).
MAX_STEPS_REPLAYED = 1_000_000
# Fewer runs than this are not worth a pass.
MIN_RUNS = 8


def stores_earlier(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline, max_runs: int = MAX_RUNS,
                   deadline: float | None = None) -> tuple[Plan, Timeline, int]:
    """Return (a plan at least as fast as ``plan``, its executor timeline, the number of Stores moved). ``timeline``
    is ``simulate(graph, hw, plan)``; an invalid plan is returned as it is. ``deadline`` (``time.monotonic()``)
    stops the search early, as a safety net only: ``max_runs`` bounds the work."""
    left = runs_allowed(plan, max_runs)
    if not timeline.valid or not left:
        return plan, timeline, 0
    moved = 0
    tried: set[tuple[str, int]] = set()
    while left > 0:
        found = None
        for i, to, after in _candidates(graph, plan.steps, tried):
            if left <= 0 or (deadline is not None and time.monotonic() > deadline):
                left = 0
                break
            left -= 1
            tried.add((plan.steps[i].target, to))
            cand = replace(plan, steps=_moved(plan.steps, i, to, after))
            if cand.offsets and not _faster(simulate(graph, hw, replace(cand, offsets={}), allocator=False), timeline):
                continue
            tl = simulate(graph, hw, cand)
            if _faster(tl, timeline):
                found = cand, tl
                break
        if found is None:
            break
        plan, timeline = found
        moved += 1
    return plan, timeline, moved


def _faster(tl: Timeline, than: Timeline) -> bool:
    return tl.valid and tl.metrics.speed_key < than.metrics.speed_key


def runs_allowed(plan: Plan, max_runs: int = MAX_RUNS) -> int:
    """The executor runs a pass on ``plan`` may make: 0 where it is not worth one (a long program)."""
    runs = min(max_runs, MAX_STEPS_REPLAYED // max(1, len(plan.steps)))
    return runs if runs >= min(MIN_RUNS, max_runs) else 0


def with_stores_earlier(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline | None = None,
                        deadline: float | None = None) -> tuple[Plan, Timeline]:
    """(``plan`` with its Stores issued earlier where the executor finds that faster, the moves' count in
    ``stats["stores_earlier"]`` and a note; its timeline): ``stores_earlier`` for a planner's result. ``timeline``:
    ``simulate(graph, hw, plan)`` when the caller has it."""
    timeline = timeline if timeline is not None else simulate(graph, hw, plan)
    polished, tl, moved = stores_earlier(graph, hw, plan, timeline, deadline=deadline)
    if not moved:
        return plan, timeline
    return replace(polished, stats=dict(polished.stats, stores_earlier=moved),
                   notes=(*polished.notes, moved_note(moved))), tl


def moved_note(moved: int) -> str:
    """The note of a plan whose pass moved ``moved`` Stores."""
    return f"{moved} Store(s) issued earlier in their link's queue, each move checked by the executor"


def _candidates(graph: Graph, steps: Sequence[Step], tried: set[tuple[str, int]]) -> list[tuple[int, int, int]]:
    """(Store's index, its earliest position, the step it then waits for, -1: none), largest Stores first, for
    the Stores that can move."""
    last: dict[str, int] = {}  # tensor -> index of the last step that made, updated, fetched or dropped it
    out = []
    for i, s in enumerate(steps):
        if s.kind is StepKind.STORE:
            after = last.get(s.target, -1)
            # A Detach last means the version is not on HBM before a later fetch: the Store stays where it is.
            if after + 1 < i and (after < 0 or steps[after].kind is not StepKind.DETACH) \
                    and (s.target, after + 1) not in tried:
                out.append((i, after + 1, after))
        elif s.kind.runs_op:
            op = graph.op(s.target)
            for t in (*op.outputs, *op.updates):
                last[t] = i
        elif s.kind in (StepKind.PREFETCH, StepKind.DETACH):
            last[s.target] = i
    out.sort(key=lambda c: (-graph.tensors[steps[c[0]].target].bytes, c[0]))
    return out[:CANDIDATES]


def _moved(steps: Sequence[Step], i: int, to: int, after: int) -> tuple[Step, ...]:
    """The program with step ``i`` moved to position ``to`` (< ``i``), waiting only for step ``after`` (-1: none);
    every other step keeps its waits, renumbered."""
    order = list(range(len(steps)))
    order.pop(i)
    order.insert(to, i)
    index = {old: new for new, old in enumerate(order)}
    out = []
    for old in order:
        s = steps[old]
        waits = ((after,) if after >= 0 else ()) if old == i else s.waits
        out.append(Step(s.kind, s.target, s.stream, tuple(sorted(index[w] for w in waits))))
    return tuple(out)


__all__ = ["moved_note", "runs_allowed", "stores_earlier", "with_stores_earlier"]
