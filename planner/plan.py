"""A Plan: the program a runtime would run, with no times in it.

The program is an ordered list of steps. Each step runs on one stream (the compute stream, or a link) after the
steps before it on that stream and after every step it waits for (an event wait). A step may only wait for
steps that come earlier in the program, so a program can always be run front to back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum

COMPUTE = "compute"


class StepKind(str, Enum):
    COMPUTE = "compute"
    PREFETCH = "prefetch"  # remote tier -> HBM over a fetch link; the HBM copy is allocated at its start
    STORE = "store"  # HBM -> remote tier over a store link; the remote copy is valid at its end
    DETACH = "detach"  # drop the HBM copy (instant)
    # Re-run an op that ran before, on the compute stream, to make its outputs again on HBM (those not resident):
    # its inputs must be resident as for any op, and each output comes back as the version the op first made.
    RECOMPUTE = "recompute"

    @property
    def runs_op(self) -> bool:
        """Whether the step's target is an op (compute, recompute) rather than a tensor."""
        return self is StepKind.COMPUTE or self is StepKind.RECOMPUTE


class PlanStatus(str, Enum):
    """What a planner says of its plan. ``infeasible``: no plan fits (the notes say why; the steps are the closest
    attempt); ``optimal``: proven optimal over every plan (``exact``); ``feasible``: neither. The executor has the
    last word on validity either way."""

    def __str__(self) -> str:
        return self.value

    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    OPTIMAL = "optimal"


@dataclass(frozen=True)
class Step:
    """One program step. ``target`` is an op name (compute, recompute) or a tensor name (cache ops).

    ``stream`` is ``compute`` or a link name; ``waits`` are indices of earlier steps.
    """

    kind: StepKind
    target: str
    stream: str
    waits: tuple[int, ...] = ()

    def __init__(self, kind: StepKind, target: str, stream: str, waits: tuple[int, ...] = ()) -> None:
        # As ``timeline.StepTiming``: the fields go straight into the instance dict, not through the frozen
        # dataclass's object.__setattr__ per field (half the cost). Greedy's programs on the 38.8k-op graph have
        # 350k steps, built once per plan and again when a plan crosses processes. Keep in step with the fields.
        d = self.__dict__
        d["kind"] = kind
        d["target"] = target
        d["stream"] = stream
        d["waits"] = waits


@dataclass(frozen=True)
class Plan:
    """What a planner returns: the program, plus who made it and how."""

    graph_name: str
    steps: tuple[Step, ...]
    planner: str
    options: dict = field(default_factory=dict)
    status: PlanStatus = PlanStatus.FEASIBLE
    notes: tuple[str, ...] = ()
    stats: dict = field(default_factory=dict)
    # Static HBM offsets, keyed by allocation name (``timeline.Residency.name``: a tensor, or ``workspace:OP``):
    # an int for every residency of that name, or a list with one entry per residency in start order. Empty:
    # the executor places allocations with its caching allocator instead (see planner/allocator.py).
    offsets: dict = field(default_factory=dict)
    # Starting tier of the tensors no op produces (planner/placement.py): required for those the graph leaves to
    # the planner (home "auto"); a pinned tensor may be listed, on its pin. Steps repeat, so each must be on its
    # starting tier again, latest version, when the step ends.
    placement: dict = field(default_factory=dict)

    def __reduce__(self):
        # Plans cross processes (greedy's replan in a forked child, sweeps on Ray): the 38.8k-op graph's 640k steps
        # pickled one object each took 0.9 s to dump and 1.8 s to load; as columns, 0.3 s and 0.9 s (the same steps).
        steps = self.steps
        columns = ([s.kind.value for s in steps], [s.target for s in steps], [s.stream for s in steps],
                   [s.waits for s in steps])
        others = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "steps"}
        return _plan_from_columns, (others, columns)

    def compute_order(self) -> list[str]:
        """The ops in the order they first run (recomputations left out)."""
        return [s.target for s in self.steps if s.kind is StepKind.COMPUTE]

    def count(self, kind: StepKind) -> int:
        return sum(1 for s in self.steps if s.kind is kind)


def _plan_from_columns(others: dict, columns: tuple[list, list, list, list]) -> Plan:
    """The Plan ``Plan.__reduce__`` took apart."""
    kinds, targets, streams, waits = columns
    by_value = {k.value: k for k in StepKind}
    return Plan(steps=tuple(map(Step, [by_value[k] for k in kinds], targets, streams, waits)), **others)


class ProgramBuilder:
    """Appends steps and hands back their indices, so planners can name what a step waits for."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def add(self, kind: StepKind, target: str, stream: str, waits: set[int] | list[int] | tuple = ()) -> int:
        self.steps.append(Step(kind, target, stream, tuple(sorted(set(waits)))))
        return len(self.steps) - 1

    def compute(self, op: str, waits=()) -> int:
        return self.add(StepKind.COMPUTE, op, COMPUTE, waits)

    def prefetch(self, tensor: str, link: str, waits=()) -> int:
        return self.add(StepKind.PREFETCH, tensor, link, waits)

    def store(self, tensor: str, link: str, waits=()) -> int:
        return self.add(StepKind.STORE, tensor, link, waits)

    def recompute(self, op: str, waits=()) -> int:
        return self.add(StepKind.RECOMPUTE, op, COMPUTE, waits)

    def detach(self, tensor: str, stream: str = COMPUTE, waits=()) -> int:
        return self.add(StepKind.DETACH, tensor, stream, waits)

    def build(self, graph_name: str, planner: str, **kwargs) -> Plan:
        return Plan(graph_name=graph_name, steps=tuple(self.steps), planner=planner, **kwargs)
