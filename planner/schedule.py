"""Schedule files, ``ho-schedule/1``: the plan, the hardware it was made for, and its executed timeline.

Writing is deterministic (no wall-clock times, sorted keys) so the same input and options give the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import orjson

from planner import api
from planner.errors import InputError, InputErrors
from planner.executor import simulate
from planner.fileio import write_atomic
from planner.formats.hograph import graph_sha256
from planner.graph import Graph
from planner.hardware import Hardware
from planner.placement import HOMES_KEY, apply_homes
from planner.plan import COMPUTE, Plan, PlanStatus, Step, StepKind
from planner.timeline import Timeline

FORMAT = "ho-schedule/1"


def schedule_to_dict(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline) -> dict:
    """Return the ``ho-schedule/1`` document for a simulated plan."""
    program = []
    for i, s in enumerate(plan.steps):
        entry = {"id": i, "kind": s.kind.value}
        entry["node" if s.kind.runs_op else "tensor"] = s.target
        entry["stream"] = s.stream
        entry["waits"] = list(s.waits)
        program.append(entry)
    executed = [
        {"id": i, "start_us": tm.start_ns / 1000, "end_us": tm.end_ns / 1000, "channel": tm.channel}
        for i, tm in enumerate(timeline.steps)
    ]
    graph_doc = {"name": graph.name, "sha256": graph_sha256(graph), "ops": len(graph.ops),
                 "tensors": len(graph.tensors)}
    if graph.metadata.get(HOMES_KEY):
        # Homes set on the command line (--home): validation applies them again to the file's graph.
        graph_doc["homes"] = graph.metadata[HOMES_KEY]
    doc = {
        "format": FORMAT,
        "graph": graph_doc,
        "hardware": hw.to_dict(),
        "planner": {
            "name": plan.planner,
            "options": plan.options,
            "status": str(plan.status),
            "notes": list(plan.notes),
        },
        "valid": timeline.valid,
        "violations": [v.describe() for v in timeline.violations],
        "metrics": timeline.metrics.to_dict(),
        "tensors": tensor_table(graph),
        # Where each tensor no op produces starts the step, and must be again when it ends (steady state).
        "placement": [{"tensor": k, "tier": v} for k, v in sorted(plan.placement.items())],
        "program": program,
        "timeline": executed,
    }
    if plan.offsets:
        # Static HBM offsets, one entry per allocation name (a list when the name is resident several times).
        doc["offsets"] = [{"name": k, "offset": v} for k, v in sorted(plan.offsets.items())]
    return doc


def tensor_table(graph: Graph) -> list[dict]:
    """The schedule's tensor table: name, bytes, kind, and the home tier of each tensor no op produces."""
    return [
        {"name": t.name, "bytes": t.bytes, "kind": t.kind.value, "home": None if t.name in graph.producer else t.home}
        for t in graph.tensors.values()
    ]


def dumps_schedule(doc: dict) -> str:
    """Serialise a schedule document: one line per tensor, program step and timeline entry (diff-friendly)."""
    # orjson for the item lines (a million on a 38.8k-op plan: 3.5 s with the json module's encoder). For these
    # rows (ints, strings, floats of microseconds) it writes what ``json`` does with sorted keys and no spaces.
    def item_json(item: dict) -> str:
        return orjson.dumps(item, option=orjson.OPT_SORT_KEYS).decode()
    lines = ["{"]
    keys = list(doc)
    for k, key in enumerate(keys):
        comma = "," if k < len(keys) - 1 else ""
        value = doc[key]
        if isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f" {json.dumps(key)}: [")
            for j, item in enumerate(value):
                sep = "," if j < len(value) - 1 else ""
                lines.append("  " + item_json(item) + sep)
            lines.append(" ]" + comma)
        else:
            lines.append(f" {json.dumps(key)}: " + json.dumps(value, sort_keys=True) + comma)
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_schedule(path: str | Path, graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline,
                   quality: dict | None = None) -> None:
    """Write the schedule file atomically; ``quality`` (``planner.quality.Quality.to_dict()``: the lower bound,
    the gap and the planner's proof) is recorded as ``quality`` when given."""
    doc = schedule_to_dict(graph, hw, plan, timeline)
    if quality is not None:
        doc["quality"] = quality
    write_atomic(path, dumps_schedule(doc))


def plan_from_dict(doc: dict, source: str) -> Plan:
    """Rebuild the Plan from a schedule document's program."""
    try:
        steps = []
        for i, e in enumerate(doc["program"]):
            if e.get("id", i) != i:
                raise InputError(source, f"program[{i}]", f"id {e.get('id')!r} out of sequence")
            kind = StepKind(e["kind"])
            target = e["node"] if kind.runs_op else e["tensor"]
            steps.append(Step(kind, target, e["stream"], tuple(int(w) for w in e["waits"])))
        p = doc["planner"]
        offsets: dict = {}
        for j, e in enumerate(doc.get("offsets", ())):
            v = e["offset"]
            ok = (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or (
                isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v))
            if not isinstance(e["name"], str) or not ok:
                raise InputError(source, f"offsets[{j}]", "needs a name and a non-negative integer offset (or a list)")
            offsets[e["name"]] = v
        placement: dict[str, str] = {}
        for j, e in enumerate(doc.get("placement", ())):
            if not isinstance(e.get("tensor"), str) or not isinstance(e.get("tier"), str):
                raise InputError(source, f"placement[{j}]", "needs a tensor name and a tier name")
            placement[e["tensor"]] = e["tier"]
        status = p.get("status", PlanStatus.FEASIBLE.value)
        if status not in {s.value for s in PlanStatus}:
            raise InputError(source, "planner.status", f"{status!r} is not a plan status "
                             f"({', '.join(s.value for s in PlanStatus)})")
        return Plan(doc["graph"]["name"], tuple(steps), p["name"], dict(p.get("options", {})), PlanStatus(status),
                    tuple(p.get("notes", ())), offsets=offsets, placement=placement)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(source, "program", f"malformed schedule ({type(exc).__name__}: {exc})") from None


# Problems listed per schedule file; a table edited throughout would otherwise print thousands of lines.
MAX_ERRORS = 20


def _check_against_graph(doc: dict, graph: Graph, hw: Hardware, source: str) -> list[InputError]:
    """The file's graph counts, tensor table and planner options against the graph and the planners, and the
    graph's pinned homes against the file's hardware: one error per difference."""
    errors: list[InputError] = []
    for key, n in (("ops", len(graph.ops)), ("tensors", len(graph.tensors))):
        recorded = doc["graph"].get(key, n)
        if recorded != n:
            errors.append(InputError(source, f"graph.{key}", f"file says {recorded!r}, the graph has {n}"))
    table = doc.get("tensors")
    if not isinstance(table, list):
        errors.append(InputError(source, "tensors", "missing or not a list of tensors"))
        table = []
    expected = {e["name"]: e for e in tensor_table(graph)}
    seen: set[str] = set()
    for i, e in enumerate(table):
        name = e.get("name") if isinstance(e, dict) else None
        if not isinstance(name, str):
            errors.append(InputError(source, f"tensors[{i}]", "needs a tensor name"))
            continue
        if name not in expected:
            errors.append(InputError(source, f"tensors[{i}]", f"tensor {name!r} is not in the graph"))
            continue
        if name in seen:
            errors.append(InputError(source, f"tensors[{i}]", f"tensor {name!r} is listed twice"))
        seen.add(name)
        for key, want in expected[name].items():
            if key not in e or e[key] != want or isinstance(e[key], bool) is not isinstance(want, bool):
                errors.append(InputError(source, f"tensors[{i}] {name!r}",
                                         f"{key} is {e.get(key)!r} in the file, {want!r} in the graph"))
        for key in sorted(set(e) - set(expected[name])):
            errors.append(InputError(source, f"tensors[{i}] {name!r}", f"unknown field {key!r}"))
    missing = [n for n in expected if n not in seen]
    if missing:
        errors.append(InputError(source, "tensors", f"{len(missing)} tensors of the graph are missing, e.g. "
                                                   f"{', '.join(repr(n) for n in missing[:3])}"))
    tiers = {t.name for t in hw.tiers}
    for t in graph.tensors.values():
        if t.name not in graph.producer and t.pinned and t.home not in tiers:
            errors.append(InputError(source, "hardware", f"has no tier {t.home!r}, the home of tensor {t.name!r} "
                                                         f"(tiers: {', '.join(sorted(tiers))})"))
    planner = doc.get("planner")
    if not isinstance(planner, dict) or not isinstance(planner.get("name"), str):
        errors.append(InputError(source, "planner", "needs a name and options"))
    else:
        options = planner.get("options", {})
        try:
            if not isinstance(options, dict):
                raise InputError(source, "planner.options", "must be an object")
            fn = api.get_planner(planner["name"])
            api.check_options(fn, planner["name"], options, source, "planner.options", recorded=True)
        except InputError as exc:
            # get_planner names the command line; here the file is wrong.
            errors.append(InputError(source, "planner" if exc.item == "--planner" else exc.item, exc.message))
    return errors


def hardware_mismatches(recorded: Hardware, expected: Hardware, source: str) -> list[InputError]:
    """One error per field in which the file's hardware differs from ``expected`` (``sources`` aside: text)."""
    a, b = recorded.to_dict(), expected.to_dict()
    errors = []
    for key in ("name", "peak_flops", "hbm_bandwidth_Bps", "launch_overhead_s"):
        if a[key] != b[key]:
            errors.append(InputError(source, f"hardware.{key}", f"file says {a[key]!r}, expected {b[key]!r}"))
    for group in ("tiers", "links"):
        mine, theirs = {e["name"]: e for e in a[group]}, {e["name"]: e for e in b[group]}
        for name in sorted(set(mine) | set(theirs)):
            if name not in theirs or name not in mine:
                where = "file" if name in mine else "expected hardware"
                errors.append(InputError(source, f"hardware.{group}", f"{name!r} is only in the {where}"))
                continue
            for key, want in theirs[name].items():
                if mine[name][key] != want:
                    errors.append(InputError(source, f"hardware.{group} {name!r}",
                                             f"{key}: file says {mine[name][key]!r}, expected {want!r}"))
    return errors


def _check_plan(plan: Plan, graph: Graph, hw: Hardware, source: str) -> list[InputError]:
    """Every name the program, placement and offsets use is the graph's or the hardware's, and every wait is on
    an earlier step. (What the names do, the executor judges: its violations.)"""
    errors: list[InputError] = []
    ops, streams = graph.op_index, {COMPUTE} | {ln.name for ln in hw.links}
    for i, st in enumerate(plan.steps):
        where = f"program[{i}]"
        if st.kind.runs_op and st.target not in ops:
            errors.append(InputError(source, where, f"node {st.target!r} is not an op of the graph"))
        elif not st.kind.runs_op and st.target not in graph.tensors:
            errors.append(InputError(source, where, f"tensor {st.target!r} is not in the graph"))
        if st.stream not in streams:
            errors.append(InputError(source, where, f"stream {st.stream!r} is not compute or a link of the hardware "
                                                    f"({', '.join(sorted(streams - {COMPUTE}))})"))
        late = [w for w in st.waits if not 0 <= w < i]
        if late:
            errors.append(InputError(source, where, f"waits for step {late[0]}, not an earlier step"))
    tiers = {t.name for t in hw.tiers}
    for name, tier in plan.placement.items():
        t = graph.tensors.get(name)
        if t is None or name in graph.producer:
            errors.append(InputError(source, "placement", f"{name!r} is not a tensor of the graph that no op "
                                                          "produces"))
        elif tier not in tiers:
            errors.append(InputError(source, "placement", f"{name!r}: the hardware has no tier {tier!r}"))
        elif t.pinned and tier != t.home:
            errors.append(InputError(source, "placement", f"{name!r} is pinned to {t.home!r} by the graph, not "
                                                          f"{tier!r}"))
    if plan.placement:
        left_out = [n for n in graph.free_tensors if n not in plan.placement]
        if left_out:
            errors.append(InputError(source, "placement", f"leaves out {len(left_out)} tensors whose tier the "
                                                          f"planner chooses, e.g. {left_out[0]!r}"))
    for name in plan.offsets:
        ws = name.removeprefix("workspace:")
        if name not in graph.tensors and not (name.startswith("workspace:") and ws in ops):
            errors.append(InputError(source, "offsets", f"{name!r} is not a tensor of the graph or an op's "
                                                        "workspace"))
    return errors


@dataclass(frozen=True)
class ValidationReport:
    timeline: Timeline
    mismatches: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.timeline.valid and not self.mismatches


def validate_schedule(doc: dict, graph: Graph, source: str, hardware: Hardware | None = None) -> ValidationReport:
    """Re-run the executor on the schedule's program and hardware and compare with what the file records.

    Raises InputError when the schedule is not ``ho-schedule/1`` or was made for another graph, and InputErrors
    (one per problem) when what the file says does not fit the graph or its own hardware: its tensor table, its
    hardware spec, its planner options, its placement, offsets or program naming what is not there. Those are a
    malformed or edited file (bad input); violations and timeline differences are in the report (no valid plan).
    ``hardware``: the hardware the plan must be for (``ho-plan validate --hardware ...``); every field of the
    file's that differs is an error.
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(source, "format", f"not a {FORMAT} file")
    if not isinstance(doc.get("graph"), dict):
        raise InputError(source, "graph", "missing or not an object (name, sha256, ops, tensors)")
    homes = doc.get("graph", {}).get("homes")
    if homes and not graph.metadata.get(HOMES_KEY):
        if not isinstance(homes, dict):
            raise InputError(source, "graph.homes", "must map tensor kinds to tiers or auto")
        graph = apply_homes(graph, homes, source=source)
    recorded, digest = doc.get("graph", {}).get("sha256"), graph_sha256(graph)
    if recorded != digest:
        raise InputError(
            source, "graph.sha256",
            f"schedule was made for graph {doc.get('graph', {}).get('name')!r} ({str(recorded)[:12]}...), "
            f"not {graph.name!r} ({digest[:12]}...)",
        )
    hw = Hardware.from_dict(doc.get("hardware"), source).validate(source)
    errors = _check_against_graph(doc, graph, hw, source)
    if hardware is not None:
        errors += hardware_mismatches(hw, hardware, source)
    plan = plan_from_dict(doc, source)
    errors += _check_plan(plan, graph, hw, source)
    if errors:
        shown = errors[:MAX_ERRORS]
        if len(errors) > MAX_ERRORS:
            shown.append(InputError(source, "...", f"and {len(errors) - MAX_ERRORS} more problems"))
        raise InputErrors(shown)
    timeline = simulate(graph, hw, plan)
    mismatches: list[str] = []
    fresh = schedule_to_dict(graph, hw, plan, timeline)
    metrics = doc.get("metrics")
    if isinstance(metrics, dict) and "recompute_us" not in metrics:
        # Files written before recompute steps existed: they had none.
        metrics = {**metrics, "recompute_us": 0.0}
    if fresh["metrics"] != metrics:
        for key in sorted(set(fresh["metrics"]) | set(metrics or {})):
            a, b = (metrics or {}).get(key), fresh["metrics"].get(key)
            if a != b:
                mismatches.append(f"metrics.{key}: file says {a!r}, executor gives {b!r}")
    recorded_tl = doc.get("timeline", [])
    if len(recorded_tl) != len(fresh["timeline"]):
        mismatches.append(f"timeline has {len(recorded_tl)} entries, program has {len(fresh['timeline'])} steps")
    else:
        for a, b in zip(recorded_tl, fresh["timeline"]):
            if a != b:
                mismatches.append(f"timeline[{b['id']}]: file says {a}, executor gives {b}")
                break
    if bool(doc.get("valid")) != timeline.valid:
        mismatches.append(f"file says valid={doc.get('valid')!r}, executor says {timeline.valid}")
    return ValidationReport(timeline, tuple(mismatches))
