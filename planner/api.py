"""The Python API behind the CLI: load, plan, simulate, compare with no offload.

    from planner import api
    graph = api.load_graph("graphs/transformer_block.json")
    hw = api.hardware("ascend-910c", hbm="2GB")
    result = api.plan(graph, hw, planner="reactive")
    result.timeline.valid, result.timeline.metrics.makespan_ns
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, replace

from planner.bounds import hbm_floor, largest_working_set
from planner.errors import InfeasibleBudget, InputError
from planner.executor import simulate
from planner.formats import load_graph
from planner.graph import Graph
from planner.hardware import HBM, Hardware, Tier, preset, with_overrides
from planner.plan import Plan
from planner.planners import get_planner, get_timed_planner
from planner.planners.none import program_none
from planner.timeline import Timeline

__all__ = [
    "Result", "InfeasibleBudget", "load_graph", "hardware", "check_compatible", "plan", "no_offload_reference",
    "largest_working_set",
]


@dataclass(frozen=True)
class Result:
    """A plan, its executed timeline, the planner's wall time, and the no-offload reference timeline."""

    plan: Plan
    timeline: Timeline
    runtime_s: float
    reference: Timeline

    @property
    def overhead(self) -> float:
        """Makespan over the no-offload makespan, minus one (0.05 = 5% slower)."""
        ref = self.reference.metrics.makespan_ns
        return self.timeline.metrics.makespan_ns / ref - 1 if ref else 0.0


def hardware(name: str = "ascend-910c", **overrides) -> Hardware:
    """Return a preset with overrides applied (``hbm="64GB"``, ``link_bandwidth={"d2h": "40GB/s"}``, ...)."""
    return with_overrides(preset(name), **overrides)


def check_compatible(graph: Graph, hw: Hardware, source: str = "<graph>") -> None:
    """Raise InputError when a tensor starts on a tier the hardware does not have."""
    tiers = {t.name for t in hw.tiers}
    for t in graph.tensors.values():
        if t.name not in graph.producer and t.pinned and t.home not in tiers:
            raise InputError(
                source, f"tensor {t.name!r}",
                f"home tier {t.home!r} is not on hardware {hw.name!r} (tiers: {', '.join(sorted(tiers))}, or auto)",
            )


def no_offload_reference(graph: Graph, hw: Hardware) -> Timeline:
    """The no-offload plan's timeline on ``hw`` with unbounded HBM: the makespan and peak to compare against
    (and the caching allocator's high-water mark, ``offset_height_bytes``: the HBM it needs with fragmentation).

    The program without ``plan_none``'s check against the budget, which would run the executor once more for
    nothing: the HBM is unbounded.
    """
    big = replace(hw, tiers=tuple(Tier(t.name, 2**62) if t.name == HBM else t for t in hw.tiers))
    return simulate(graph, big, program_none(graph, big))


def check_options(fn, name: str, options: dict) -> None:
    """Raise InputError naming an option that planner ``name`` does not take."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    takes = [p for p in list(params)[2:]]
    for key in options:
        if key not in takes:
            raise InputError("command line", "--planner-option",
                             f"planner {name!r} takes no option {key!r} (it takes: {', '.join(takes) or 'none'})")


def plan(graph: Graph, hw: Hardware, planner: str = "none", source: str = "<graph>",
         reference: Timeline | None = None, **options) -> Result:
    """Plan ``graph`` on ``hw`` with the named planner, run the plan in the executor, and return the Result.

    Planners that ran the executor on their plan already hand over that timeline (``get_timed_planner``), which
    is used as is. ``reference``: ``no_offload_reference(graph, hw)`` when the caller computed it already (the CLI
    does, before planning, so that a time limit can count it).

    Raises InfeasibleBudget when the HBM budget is below ``planner.bounds.hbm_floor`` (the largest single-op
    working set, or the bytes that start on HBM and are still needed), and InputError for an option the planner
    does not take.
    """
    check_compatible(graph, hw, source)
    fn = get_planner(planner)
    check_options(fn, planner, options)
    minimum, reason = hbm_floor(graph)
    if hw.hbm_bytes < minimum:
        raise InfeasibleBudget(hw.hbm_bytes, minimum, reason)
    timed = get_timed_planner(planner)
    t0 = time.perf_counter()
    if timed is not None:
        out = timed(graph, hw, **options)
        p, timeline = out.plan, out.timeline
        runtime = time.perf_counter() - t0
    else:
        p = fn(graph, hw, **options)
        runtime = time.perf_counter() - t0
        timeline = simulate(graph, hw, p)
    return Result(p, timeline, runtime, reference if reference is not None else no_offload_reference(graph, hw))
