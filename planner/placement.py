"""Where the tensors that exist before the step start it, and so where they must be when it ends.

Steps repeat (a training iteration, a decode step): the state at the end of one step is the start of the next.
Every tensor no op produces starts the step on one tier. The graph pins it there (``home`` names a tier), or
leaves it to the planner (``home: "auto"``, only for tensors that outlive the step). A *placement* maps every
tensor no op produces to its starting tier; a Plan carries the one its planner chose (``Plan.placement``).

The steady-state rules the executor checks (``planner/executor.py``):

* a tensor placed on HBM is resident at time 0, and must be resident again when the step ends;
* a tensor left to the planner that no op updates and placed on HBM also has a valid copy on the fastest
  remote tier at time 0, its master copy (``master_copies``): it may be dropped and fetched back with no Store;
* a tensor placed on a remote tier has a valid copy there at time 0 (its first use needs a Prefetch), and that
  tier must hold a copy of its latest version when the step ends: a tensor updated in place (a weight after the
  optimizer step, an optimizer state) is stored back after its last update;
* a tensor that does not outlive the step (an input) has no end-of-step rule.

Choosing HBM for a tensor costs HBM bytes from time 0; choosing a remote tier costs a fetch before its first
use and, when it is updated, a store after its last update: the "wrap-around gap" from the last use of one step
to the first use of the next. Planners decide it; ``hbm`` is the placement when nothing is decided.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from planner.errors import InputError
from planner.graph import AUTO, Graph, TensorKind
from planner.hardware import HBM, Hardware

Placement = dict[str, str]
# Graph metadata key recording the homes set by kind on the command line (``apply_homes``).
HOMES_KEY = "homes"


def start_tiers(graph: Graph, placement: Mapping[str, str] | None = None) -> Placement:
    """Return every tensor no op produces -> its starting tier: the pinned home, or ``placement``'s choice
    (``hbm`` for a free tensor the placement does not name)."""
    placement = placement or {}
    out: Placement = {}
    for name, t in graph.tensors.items():
        if name in graph.producer:
            continue
        out[name] = t.home if t.pinned else placement.get(name, HBM)
    return out


def master_copies(graph: Graph, hw: Hardware, placement: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return tensor -> remote tier for every tensor that starts the step on HBM *and* with a valid copy on that
    tier: a tensor left to the planner (home ``auto``) that no op updates, placed on HBM.

    Such a tensor (an inference weight, an embedding table) keeps its master copy on the fastest remote tier
    (``Hardware.fastest_remote_tier``), which nothing ever writes, and the HBM copy a step ends with is still there
    when the next step starts. So a step may drop the HBM copy and fetch it back with no Store, as for a tensor
    placed remote, and still starts with it on HBM. The master copy holds its bytes on that tier. A tensor pinned
    to HBM by the graph has no such copy (its home says it lives on HBM only), nor does one an op updates (its
    copy elsewhere goes stale)."""
    if not graph.free_tensors or not hw.remote_tiers:
        return {}
    updated = graph.home_free.get("updated")
    if updated is None:
        updated = graph.home_free["updated"] = frozenset(t for op in graph.ops for t in op.updates)
    placement = placement or {}
    tier = hw.fastest_remote_tier()
    return {name: tier for name in graph.free_tensors
            if placement.get(name, HBM) == HBM and name not in updated and graph.tensors[name].persistent}


def with_placement(graph: Graph, placement: Mapping[str, str]) -> Graph:
    """Return ``graph`` with every free tensor pinned where ``placement`` puts it (``hbm`` when it does not say).

    Planners plan on this graph; the plan records ``placement`` so that the executor, given the original graph,
    starts the tensors where the planner assumed.
    """
    if not graph.free_tensors:
        return graph
    tensors = dict(graph.tensors)
    for name in graph.free_tensors:
        tensors[name] = replace(tensors[name], home=placement.get(name, HBM))
    return _rehomed(graph, replace(graph, tensors=tensors))


def _rehomed(graph: Graph, out: Graph) -> Graph:
    """``out`` (``graph`` with other homes) with the derived views that do not depend on homes shared with
    ``graph``: they cost seconds on graphs of 30k ops. Each is computed on ``graph`` if it was not yet, so that
    every graph rehomed from it (the CLI's homes, each planner's placement, the no-offload reference) shares one
    copy instead of computing its own; nearly every run needs them all."""
    for key in ("op_index", "producer", "users", "dag", "home_free"):
        out.__dict__[key] = getattr(graph, key)
    return out


def plan_placement(graph: Graph, choice: Mapping[str, str] | None = None) -> Placement:
    """The placement a planner records: every tensor no op produces and its starting tier (pins included, so the
    schedule file states each one)."""
    return dict(sorted(start_tiers(graph, choice).items()))


def check_placement(graph: Graph, hw: Hardware, placement: Mapping[str, str]) -> list[tuple[str, str]]:
    """Return (tensor, problem) for each entry of ``placement`` that a plan may not state: an unknown tensor, one
    an op produces, a tier the hardware lacks, or a tier other than the tensor's pin."""
    tiers = {t.name for t in hw.tiers}
    out: list[tuple[str, str]] = []
    for name, tier in placement.items():
        t = graph.tensors.get(name)
        if t is None:
            out.append((name, "placement names an unknown tensor"))
        elif name in graph.producer:
            out.append((name, "placement names a tensor an op produces (it starts nowhere)"))
        elif tier not in tiers:
            out.append((name, f"placed on tier {tier!r}, which the hardware does not have"))
        elif t.pinned and tier != t.home:
            out.append((name, f"placed on {tier!r} but the graph pins it to {t.home!r}"))
    return out


def bytes_by_kind(graph: Graph, placement: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Return kind -> tier -> bytes of the tensors that start on that tier (tensors no op produces)."""
    out: dict[str, dict[str, int]] = {}
    for name, tier in start_tiers(graph, placement).items():
        t = graph.tensors[name]
        per = out.setdefault(t.kind.value, {})
        per[tier] = per.get(tier, 0) + t.bytes
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def parse_homes(values: Iterable[str], source: str = "command line", option: str = "--home") -> dict[str, str]:
    """Parse ``KIND=TIER|auto`` settings into kind -> home; raise InputError naming a malformed one."""
    kinds = {k.value for k in TensorKind}
    out: dict[str, str] = {}
    for v in values:
        kind, sep, home = (x.strip() for x in v.partition("="))
        if not sep or not kind or not home:
            raise InputError(source, option, f"{v!r} should be KIND=TIER or KIND=auto")
        if kind not in kinds:
            raise InputError(source, option, f"unknown tensor kind {kind!r} (kinds: {', '.join(sorted(kinds))})")
        out[kind] = home
    return out


def apply_homes(graph: Graph, homes: Mapping[str, str], hw: Hardware | None = None,
                source: str = "command line") -> Graph:
    """Return ``graph`` with the home of every tensor no op produces set by its kind (``homes``: kind -> tier or
    ``auto``). Raise InputError for a tier ``hw`` lacks, or ``auto`` for a kind that does not outlive the step."""
    if not homes:
        return graph
    if hw is not None:
        tiers = {t.name for t in hw.tiers}
        for kind, home in homes.items():
            if home != AUTO and home not in tiers:
                raise InputError(source, "--home", f"{kind}={home}: hardware {hw.name!r} has no tier {home!r} "
                                 f"(tiers: {', '.join(sorted(tiers))}, or auto)")
    tensors = dict(graph.tensors)
    changed = False
    for name, t in graph.tensors.items():
        home = homes.get(t.kind.value)
        if home is None or name in graph.producer or home == t.home:
            continue
        if home == AUTO and not t.persistent:
            raise InputError(source, "--home", f"{t.kind.value}=auto: {t.kind.value} tensors do not outlive the "
                             "step; give them a tier")
        tensors[name] = replace(t, home=home)
        changed = True
    if not changed:
        return graph
    recorded = dict(graph.metadata.get(HOMES_KEY, {}), **homes)
    metadata = dict(graph.metadata, **{HOMES_KEY: dict(sorted(recorded.items()))})
    return _rehomed(graph, replace(graph, tensors=tensors, metadata=metadata))


__all__ = [
    "Placement", "start_tiers", "with_placement", "plan_placement", "check_placement", "bytes_by_kind",
    "parse_homes", "apply_homes",
]
