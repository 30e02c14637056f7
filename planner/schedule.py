"""Schedule files, ``ho-schedule/1``: the plan, the hardware it was made for, and its executed timeline.

Writing is deterministic (no wall-clock times, sorted keys) so the same input and options give the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from planner.errors import InputError
from planner.executor import simulate
from planner.fileio import write_atomic
from planner.graph import Graph
from planner.hardware import Hardware
from planner.placement import HOMES_KEY, apply_homes
from planner.plan import Plan, Step, StepKind
from planner.timeline import Timeline

FORMAT = "ho-schedule/1"


def schedule_to_dict(graph: Graph, hw: Hardware, plan: Plan, timeline: Timeline) -> dict:
    """Return the ``ho-schedule/1`` document for a simulated plan."""
    program = []
    for i, s in enumerate(plan.steps):
        entry = {"id": i, "kind": s.kind.value}
        entry["node" if s.kind is StepKind.COMPUTE else "tensor"] = s.target
        entry["stream"] = s.stream
        entry["waits"] = list(s.waits)
        program.append(entry)
    executed = [
        {"id": i, "start_us": tm.start_ns / 1000, "end_us": tm.end_ns / 1000, "channel": tm.channel}
        for i, tm in enumerate(timeline.steps)
    ]
    graph_doc = {"name": graph.name, "sha256": graph.sha256, "ops": len(graph.ops), "tensors": len(graph.tensors)}
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
            "status": plan.status,
            "notes": list(plan.notes),
        },
        "valid": timeline.valid,
        "violations": [v.describe() for v in timeline.violations],
        "metrics": timeline.metrics.to_dict(),
        "tensors": [
            {"name": t.name, "bytes": t.bytes, "kind": t.kind.value,
             "home": None if t.name in graph.producer else t.home}
            for t in graph.tensors.values()
        ],
        # Where each tensor no op produces starts the step, and must be again when it ends (steady state).
        "placement": [{"tensor": k, "tier": v} for k, v in sorted(plan.placement.items())],
        "program": program,
        "timeline": executed,
    }
    if plan.offsets:
        # Static HBM offsets, one entry per allocation name (a list when the name is resident several times).
        doc["offsets"] = [{"name": k, "offset": v} for k, v in sorted(plan.offsets.items())]
    return doc


def dumps_schedule(doc: dict) -> str:
    """Serialise a schedule document: one line per tensor, program step and timeline entry (diff-friendly)."""
    # One encoder for every line: json.dumps with options builds a new one per call (seconds on 600k lines).
    item_json = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
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
            target = e["node"] if kind is StepKind.COMPUTE else e["tensor"]
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
        return Plan(doc["graph"]["name"], tuple(steps), p["name"], dict(p.get("options", {})), p.get("status", ""),
                    tuple(p.get("notes", ())), offsets=offsets, placement=placement)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(source, "program", f"malformed schedule ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class ValidationReport:
    timeline: Timeline
    mismatches: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.timeline.valid and not self.mismatches


def validate_schedule(doc: dict, graph: Graph, source: str) -> ValidationReport:
    """Re-run the executor on the schedule's program and hardware and compare with what the file records.

    Raises InputError when the schedule is not ``ho-schedule/1`` or was made for another graph.
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(source, "format", f"not a {FORMAT} file")
    homes = doc.get("graph", {}).get("homes")
    if homes and not graph.metadata.get(HOMES_KEY):
        if not isinstance(homes, dict):
            raise InputError(source, "graph.homes", "must map tensor kinds to tiers or auto")
        graph = apply_homes(graph, homes, source=source)
    recorded = doc.get("graph", {}).get("sha256")
    if recorded != graph.sha256:
        raise InputError(
            source, "graph.sha256",
            f"schedule was made for graph {doc.get('graph', {}).get('name')!r} ({str(recorded)[:12]}...), "
            f"not {graph.name!r} ({graph.sha256[:12]}...)",
        )
    hw = Hardware.from_dict(doc.get("hardware", {}), source).validate(source)
    plan = plan_from_dict(doc, source)
    timeline = simulate(graph, hw, plan)
    mismatches: list[str] = []
    fresh = schedule_to_dict(graph, hw, plan, timeline)
    if fresh["metrics"] != doc.get("metrics"):
        for key in sorted(set(fresh["metrics"]) | set(doc.get("metrics", {}))):
            a, b = doc.get("metrics", {}).get(key), fresh["metrics"].get(key)
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
