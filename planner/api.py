"""The Python API behind the CLI: load, plan, simulate, compare with no offload.

    from planner import api
    graph = api.load_graph("graphs/transformer_block.json")
    hw = api.hardware("ascend-910c", hbm="2GB")
    result = api.plan(graph, hw, planner="reactive")
    result.timeline.valid, result.timeline.metrics.makespan_ns
"""

from __future__ import annotations

import inspect
import json
import math
import re
import time
import types
import typing
from dataclasses import dataclass, replace

from planner.bounds import hbm_floor, largest_working_set
from planner.errors import InfeasibleBudget, InputError
from planner.executor import simulate
from planner.formats import load_graph
from planner.graph import Graph
from planner.hardware import Hardware, preset, with_overrides
from planner.orders import FAMILIES, ORDERS
from planner.plan import Plan
from planner.planners import get_planner, get_spec, get_timed_planner
from planner.planners.cpsat.solve import STARTING_PLANNERS
from planner.planners.greedy import GREEDY_SETTINGS
from planner.planners.greedy_select import EVICT_RULES
from planner.planners.none import program_none
from planner.timeline import Timeline

__all__ = [
    "Result", "InfeasibleBudget", "load_graph", "hardware", "check_compatible", "plan", "no_offload_reference",
    "largest_working_set", "option_types", "check_options", "parse_planner_options", "OptionType",
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


def no_offload_reference(graph: Graph, hw: Hardware, source: str = "<graph>") -> Timeline:
    """The no-offload plan's timeline on ``hw`` with unbounded HBM: the makespan and peak to compare against
    (and the caching allocator's high-water mark, ``offset_height_bytes``: the HBM it needs with fragmentation).

    The program without ``plan_none``'s check against the budget, which would run the executor once more for
    nothing: the HBM is unbounded. Raises InputError when a tensor starts on a tier ``hw`` does not have.
    """
    check_compatible(graph, hw, source)
    big = hw.with_hbm(2**62)
    return simulate(graph, big, program_none(graph, big))


# Options the CLI passes to a planner for its own plumbing: neither a user's to give (-O) nor a plan's to record.
INTERNAL_OPTIONS = frozenset({"progress", "wall_budget"})

# Text options with a fixed set of values, by option name (the same name means the same thing in every planner).
CHOICES: dict[str, tuple[str, ...]] = {
    "order": ORDERS,
    "objective": ("makespan", "peak"),
    "start": ("auto", *STARTING_PLANNERS),
    "evict": EVICT_RULES,
}
# Text options that also take a family of values, as a pattern and the name ``describe`` gives it.
PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "order": (FAMILIES, "sampled-K (K a whole number), deferred-K (K from 0 to 7)")}


# Lower limits of numeric options, (limit, whether the limit itself is allowed): a negative distance or a zero time
# limit parses but means nothing.
MINIMUM: dict[str, tuple[float, bool]] = {
    "select_distance": (0, True), "select_num": (0, True), "prefetch_distance": (0, True),
    "release_distance": (0, True), "lookahead": (0, True), "seed": (0, True), "workers": (1, True),
    "time_limit": (0, False), "makespan_limit_us": (0, False), "whole_max_ops": (1, True), "window_ops": (1, True),
    "finalists": (1, True), "max_orders": (1, True), "sampled_orders": (0, True),
}

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
_KINDS: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str, "dict": dict}
_KIND_NAMES = {int: "a whole number", float: "a number", bool: "true or false (also 1/0, yes/no)", str: "text",
               dict: "a JSON object"}


@dataclass(frozen=True)
class OptionType:
    """The declared type of one planner option: ``kind`` (int, float, bool, str, dict; None: not settable as
    text, like a callback), whether ``None`` is a value, and for text the values it may take."""

    kind: type | None
    optional: bool = False
    choices: tuple[str, ...] = ()
    pattern: tuple[re.Pattern[str], str] | None = None

    def accepts(self, value: str) -> bool:
        """Whether ``value`` is one of the choices, or matches the pattern (any text when there are neither)."""
        if not self.choices:
            return True
        return value in self.choices or (self.pattern is not None and self.pattern[0].fullmatch(value) is not None)

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices + ((self.pattern[1],) if self.pattern else ()))
        return _KIND_NAMES.get(self.kind, "a Python value") + (" or none" if self.optional else "")


def _option_type(param: inspect.Parameter) -> OptionType:
    """The type of a planner parameter, from its annotation (text under ``from __future__ import annotations``,
    or a real type), else from its default."""
    ann = param.annotation
    names: list[object]
    if ann is inspect.Parameter.empty:
        names = [type(param.default)] if param.default not in (inspect.Parameter.empty, None) else []
    elif isinstance(ann, str):
        names = [part.strip().split("[")[0] for part in ann.split("|")]
    else:
        args = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
        names = [typing.get_origin(a) or a for a in args]
    optional = any(n in ("None", type(None)) for n in names) or param.default is None
    kinds = [_KINDS.get(n) if isinstance(n, str) else n for n in names if n not in ("None", type(None))]
    kind = kinds[0] if len(kinds) == 1 and kinds[0] in _KIND_NAMES else None
    if kind is not str:
        return OptionType(kind, optional)
    return OptionType(kind, optional, CHOICES.get(param.name, ()), PATTERNS.get(param.name))


def option_types(name: str) -> dict[str, OptionType]:
    """Planner ``name``'s options and their types, from its function's signature (after graph and hardware).

    Raises InputError for an unknown planner.
    """
    params = list(inspect.signature(get_planner(name)).parameters.values())[2:]
    return {p.name: _option_type(p) for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD}


def parse_option(value: object, spec: OptionType, source: str, item: str) -> object:
    """``value`` as ``spec``'s type: text is parsed (``-O select_num=8``, ``offsets=no``); other values (the Python
    API, a schedule file's JSON) must already be of the type. Raises InputError saying what was expected."""
    def bad() -> InputError:
        return InputError(source, item, f"{value!r} is not {spec.describe()}")

    if spec.kind is None:
        if isinstance(value, str):
            raise InputError(source, item, "cannot be given as text")
        return value
    if value is None or (isinstance(value, str) and spec.kind is not str and value.strip().lower() in ("none", "null")):
        if spec.optional:
            return None
        raise bad()
    if isinstance(value, str) and spec.kind is not str:
        text = value.strip()
        if spec.kind is bool:
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise bad()
        if spec.kind is int:
            # int() alone would take "1_000" and float() would truncate "1.5": whole numbers only.
            if not re.fullmatch(r"[+-]?[0-9]+", text):
                raise bad()
            return int(text)
        if spec.kind is float:
            try:
                number = float(text)
            except ValueError:
                raise bad() from None
            if not math.isfinite(number):
                raise bad()
            return number
        if spec.kind is dict:
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                raise bad() from None
            if not isinstance(parsed, dict):
                raise bad()
            return parsed
    if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) is not (spec.kind is bool) or not isinstance(value, spec.kind):
        raise bad()
    if isinstance(value, float) and not math.isfinite(value):
        raise bad()
    if isinstance(value, str) and not spec.accepts(value):
        raise bad()
    return value


def check_options(fn, name: str, options: dict, source: str = "command line", item: str = "--planner-option",
                  recorded: bool = False) -> dict:
    """Return ``options`` parsed to planner ``name``'s declared types (``option_types``).

    Raises InputError naming an option the planner does not take or a value not of its type. ``fn`` is the
    planner function (kept for callers of the old signature; the types come from ``name``'s). ``recorded``: the
    options a plan recorded (a schedule file's), which may hold what the planner records beyond its parameters
    (``PlannerSpec.recorded``) and never the CLI's plumbing (``INTERNAL_OPTIONS``).
    """
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(options)
    declared = option_types(name)
    if recorded:
        declared = {k: v for k, v in declared.items() if k not in INTERNAL_OPTIONS}
        declared.update({k: OptionType(t) for k, t in get_spec(name).recorded.items()})
    out = {}
    for key, value in options.items():
        where = f"{item}{key}" if item.endswith(".") else f"{item} {key}"  # "-O cpsat." + key, "-O" + " " + key
        if key not in declared:
            takes = [k for k in declared if k not in INTERNAL_OPTIONS]
            raise InputError(source, where,
                             f"planner {name!r} takes no option {key!r} (it takes: {', '.join(takes) or 'none'})")
        if key in INTERNAL_OPTIONS:
            out[key] = value  # the CLI's own values, not text
            continue
        out[key] = _check_value(key, parse_option(value, declared[key], source, where), source, where)
    return out


def _check_value(key: str, value: object, source: str, item: str) -> object:
    """Limits the types do not say: ``MINIMUM``, and greedy-sweep's ``grid`` (setting -> whole numbers)."""
    if key in MINIMUM and isinstance(value, (int, float)) and not isinstance(value, bool):
        limit, inclusive = MINIMUM[key]
        if value < limit or (value == limit and not inclusive):
            raise InputError(source, item, f"{value!r} must be {'at least' if inclusive else 'above'} {limit}")
    if key == "grid" and isinstance(value, dict):
        for k, v in value.items():
            ok = isinstance(v, (list, tuple)) and v and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
            if k not in GREEDY_SETTINGS or not ok:
                raise InputError(source, item, f"{k!r}: a grid maps {', '.join(GREEDY_SETTINGS)} to lists of "
                                               "whole numbers >= 0")
        return {k: tuple(v) for k, v in value.items()}
    return value


def parse_planner_options(name: str, text: dict[str, str], source: str = "command line",
                          item: str = "-O") -> dict:
    """Command-line ``-O KEY=VALUE`` text for planner ``name``, parsed to its declared types; the CLI's plumbing
    options (``INTERNAL_OPTIONS``) cannot be given this way."""
    for key in text:
        if key in INTERNAL_OPTIONS:
            where = f"{item}{key}" if item.endswith(".") else f"{item} {key}"
            raise InputError(source, where, "is set by ho-plan itself, not an option to give")
    return check_options(get_planner(name), name, text, source, item)


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
    options = check_options(fn, planner, options)
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
    # The plan records the options it was given, parsed (offsets=False from "-O offsets=no"), where the planner
    # did not record them itself; what it recorded wins (greedy's order says which order "auto" chose).
    given = {k: v for k, v in options.items() if k not in INTERNAL_OPTIONS and k not in p.options}
    if given:
        p = replace(p, options={**p.options, **given})
    return Result(p, timeline, runtime, reference if reference is not None else no_offload_reference(graph, hw))
