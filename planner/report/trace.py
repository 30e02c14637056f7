"""Chrome / Perfetto trace JSON of executed plans: open the file in https://ui.perfetto.dev or chrome://tracing.

Layout, per plan (one process each, so several planners can sit in one file):

- a ``compute`` thread with one complete slice (``ph: X``) per op; a recompute step is a slice ``recompute OP``
  of category ``recompute`` (the tensors it makes again in its args); Detach steps are instant events;
- one thread per lane of each link (``d2h lane 0``, ...): a transfer goes to the first lane that is free when it
  starts, so slices on one thread never overlap (Perfetto silently cuts crossing slices on one track);
- counter tracks (``ph: C``) of the bytes resident on HBM and on each remote tier, plus the HBM budget;
- a flow arrow (``ph: s`` / ``ph: f``, ``bp: e``) from each Store to each Prefetch that reads the copy it made.

Times (``ts``, ``dur``) are microseconds: the executor's integer nanoseconds divided by 1000, so they convert
back exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from planner.executor import occupancy
from planner.fileio import write_atomic
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.plan import COMPUTE, Plan, StepKind
from planner.tensors import recomputed_outputs
from planner.timeline import Timeline

COMPUTE_TID = 1


@dataclass(frozen=True)
class TraceRun:
    """One executed plan to put in a trace; ``label`` names its process (default: the planner)."""

    graph: Graph
    hw: Hardware
    plan: Plan
    timeline: Timeline
    label: str = ""


def _us(ns: int) -> float:
    return ns / 1000


def _assign_lanes(intervals: list[tuple[int, int, int]]) -> dict[int, int]:
    """Map each (start, end, key) to the lowest lane free at its start (interval partitioning, stable)."""
    lanes: list[int] = []  # end time of the last slice on each lane
    out: dict[int, int] = {}
    for start, end, key in sorted(intervals):
        for lane, free in enumerate(lanes):
            if free <= start:
                lanes[lane] = end
                out[key] = lane
                break
        else:
            lanes.append(end)
            out[key] = len(lanes) - 1
    return out


def run_events(run: TraceRun, pid: int) -> list[dict]:
    """The trace events of one executed plan, as process ``pid``."""
    graph, hw, plan, tl = run.graph, run.hw, run.plan, run.timeline
    label = run.label or plan.planner
    ev: list[dict] = [
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
         "args": {"name": f"{label} · {graph.name} on {hw.name}"}},
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": pid}},
        {"ph": "M", "pid": pid, "tid": COMPUTE_TID, "name": "thread_name", "args": {"name": "compute"}},
        {"ph": "M", "pid": pid, "tid": COMPUTE_TID, "name": "thread_sort_index", "args": {"sort_index": 0}},
    ]
    if not tl.steps:  # a malformed program is not run: nothing to draw but its name
        return ev
    links = hw.links_by_name
    # Lanes per link, for transfers (detaches on a link are instants on lane 0).
    tid_of: dict[int, int] = {}
    next_tid = COMPUTE_TID + 1
    for ln in hw.links:
        idx = [i for i, s in enumerate(plan.steps)
               if s.stream == ln.name and s.kind in (StepKind.PREFETCH, StepKind.STORE)]
        lanes = _assign_lanes([(tl.steps[i].start_ns, tl.steps[i].end_ns, i) for i in idx])
        n_lanes = max(lanes.values(), default=0) + 1
        for lane in range(n_lanes):
            tid = next_tid + lane
            ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                       "args": {"name": f"{ln.name} ({ln.src}→{ln.dst}) lane {lane}"}})
            ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                       "args": {"sort_index": tid}})
        for i, lane in lanes.items():
            tid_of[i] = next_tid + lane
        for i, s in enumerate(plan.steps):
            if s.stream == ln.name and s.kind is StepKind.DETACH:
                tid_of[i] = next_tid
        next_tid += n_lanes
    remade = recomputed_outputs(graph, plan, tl)
    for i, s in enumerate(plan.steps):
        tm = tl.steps[i]
        tid = COMPUTE_TID if s.stream == COMPUTE else tid_of[i]
        if s.kind is StepKind.COMPUTE:
            op = graph.op(s.target)
            ev.append({"ph": "X", "pid": pid, "tid": tid, "name": s.target, "cat": op.op_type,
                       "ts": _us(tm.start_ns), "dur": _us(tm.end_ns - tm.start_ns),
                       "args": {"step": i, "op_type": op.op_type, "waits": list(s.waits)}})
        elif s.kind is StepKind.RECOMPUTE:
            # Its own category, not the op type, so Perfetto can select or filter every recomputation at once;
            # the trace sets no colours (cname), so none here either.
            op = graph.op(s.target)
            ev.append({"ph": "X", "pid": pid, "tid": tid, "name": f"recompute {s.target}", "cat": "recompute",
                       "ts": _us(tm.start_ns), "dur": _us(tm.end_ns - tm.start_ns),
                       "args": {"step": i, "op": s.target, "op_type": op.op_type,
                                "makes_again": list(remade.get(i, ())), "waits": list(s.waits)}})
        elif s.kind is StepKind.DETACH:
            ev.append({"ph": "i", "s": "t", "pid": pid, "tid": tid, "name": f"detach {s.target}", "cat": "detach",
                       "ts": _us(tm.start_ns), "args": {"step": i, "tensor": s.target}})
        else:
            t = graph.tensors[s.target]
            ln = links[s.stream]
            ev.append({"ph": "X", "pid": pid, "tid": tid, "name": f"{s.kind.value} {s.target}",
                       "cat": s.kind.value, "ts": _us(tm.start_ns), "dur": _us(tm.end_ns - tm.start_ns),
                       "args": {"step": i, "tensor": s.target, "bytes": t.bytes, "kind": t.kind.value,
                                "link": ln.name, "from": ln.src, "to": ln.dst, "channel": tm.channel,
                                "waits": list(s.waits)}})
    ev.extend(_flows(plan, tl, links, tid_of, pid))
    ev.extend(_counters(hw, tl, pid))
    return ev


def _flows(plan: Plan, tl: Timeline, links: dict, tid_of: dict[int, int], pid: int) -> list[dict]:
    """An arrow from each Store to every Prefetch that reads its copy (same tensor, same tier, latest store)."""
    out: list[dict] = []
    stores: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(plan.steps):
        if s.kind is StepKind.STORE:
            stores.setdefault((s.target, links[s.stream].dst), []).append(i)
    flow_id = 0
    for j, s in enumerate(plan.steps):
        if s.kind is not StepKind.PREFETCH:
            continue
        start = tl.steps[j].start_ns
        done = [i for i in stores.get((s.target, links[s.stream].src), []) if tl.steps[i].end_ns <= start]
        if not done:
            continue  # the copy was there before the step (the tensor's home tier)
        i = max(done, key=lambda k: (tl.steps[k].end_ns, k))
        flow_id += 1
        fid = pid * 1_000_000 + flow_id
        common = {"name": f"{s.target}", "cat": "offload", "id": fid, "pid": pid}
        out.append({"ph": "s", **common, "tid": tid_of[i], "ts": _us(tl.steps[i].start_ns)})
        out.append({"ph": "f", "bp": "e", **common, "tid": tid_of[j], "ts": _us(start)})
    return out


def _counters(hw: Hardware, tl: Timeline, pid: int) -> list[dict]:
    out: list[dict] = []
    end = max((s.end_ns for s in tl.steps), default=0)
    for tier in hw.tiers:
        name = f"{tier.name} bytes"
        points = occupancy(tl.residencies, tier.name)
        if not points or points[0][0] > 0:
            points = [(0, 0), *points]
        for t, b in points:
            out.append({"ph": "C", "pid": pid, "tid": 0, "name": name, "ts": _us(t), "args": {"resident": b}})
    budget = hw.hbm_bytes
    for t in (0, end):
        out.append({"ph": "C", "pid": pid, "tid": 0, "name": f"{HBM} bytes", "ts": _us(t), "args": {"budget": budget}})
    return out


def chrome_trace(runs: Iterable[TraceRun]) -> dict:
    """The trace document for one or more executed plans (one process each, in order)."""
    events: list[dict] = []
    for pid, run in enumerate(runs, start=1):
        events.extend(run_events(run, pid))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "ho-plan", "time_unit": "microseconds"}}


def write_trace(path, runs: Iterable[TraceRun]) -> None:
    """Write the trace JSON atomically."""
    write_atomic(path, json.dumps(chrome_trace(runs), separators=(",", ":")) + "\n")


def check_trace(doc: dict) -> list[str]:
    """Structural problems Perfetto would hide or reject; empty when the trace is well formed.

    Checks: ``traceEvents`` is a list; every X slice has numeric ts and dur >= 0; slices on one (pid, tid) nest
    strictly (never cross); every (pid, tid) with slices or instants has a thread name and every pid a
    process name; counters carry an object of numbers; every flow id has one start and one finish (with
    ``bp: e``), each inside a slice on its own thread, the start not after the finish.
    """
    problems: list[str] = []
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        return ["traceEvents is not a list"]
    names_t: set[tuple] = set()
    names_p: set = set()
    slices: dict[tuple, list[tuple[int, int, str]]] = {}
    flows: dict = {}
    used: set[tuple] = set()
    for k, e in enumerate(events):
        ph = e.get("ph")
        key = (e.get("pid"), e.get("tid"))
        if ph == "M":
            if e.get("name") == "thread_name":
                names_t.add(key)
            if e.get("name") == "process_name":
                names_p.add(e.get("pid"))
            continue
        if not isinstance(e.get("ts"), (int, float)):
            problems.append(f"event {k} ({ph}) has no numeric ts")
            continue
        ts = round(e["ts"] * 1000)
        if ph == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                problems.append(f"event {k} slice {e.get('name')!r} has no dur >= 0")
                continue
            slices.setdefault(key, []).append((ts, ts + round(e["dur"] * 1000), str(e.get("name"))))
            used.add(key)
        elif ph == "i":
            used.add(key)
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not all(isinstance(v, (int, float)) for v in args.values()):
                problems.append(f"event {k} counter {e.get('name')!r} args is not an object of numbers")
            names_p.discard(None)
        elif ph in ("s", "f"):
            flows.setdefault(e.get("id"), []).append((ph, key, ts, e.get("bp")))
        else:
            problems.append(f"event {k} has unexpected ph {ph!r}")
    for key in sorted(used, key=str):
        if key not in names_t:
            problems.append(f"thread {key} has events but no thread_name")
        if key[0] not in names_p:
            problems.append(f"process {key[0]} has events but no process_name")
    for key, items in slices.items():
        items.sort(key=lambda x: (x[0], -x[1]))
        stack: list[tuple[int, int, str]] = []
        for s, e, name in items:
            while stack and stack[-1][1] <= s:
                stack.pop()
            if stack and e > stack[-1][1]:
                problems.append(f"thread {key}: slice {name!r} [{s}, {e}) ns crosses {stack[-1][2]!r} "
                                f"[{stack[-1][0]}, {stack[-1][1]}) ns")
            stack.append((s, e, name))

    def inside(key, ts) -> bool:
        return any(s <= ts <= e for s, e, _ in slices.get(key, ()))

    for fid, items in flows.items():
        phs = sorted(p for p, *_ in items)
        if phs != ["f", "s"]:
            problems.append(f"flow {fid} has events {phs}, expected one s and one f")
            continue
        s_ev = next(x for x in items if x[0] == "s")
        f_ev = next(x for x in items if x[0] == "f")
        if f_ev[3] != "e":
            problems.append(f"flow {fid} finish lacks bp 'e'")
        if s_ev[2] > f_ev[2]:
            problems.append(f"flow {fid} starts after it finishes")
        for ev_ in (s_ev, f_ev):
            if not inside(ev_[1], ev_[2]):
                problems.append(f"flow {fid} {ev_[0]} at {ev_[2]} ns is not inside a slice on thread {ev_[1]}")
    return problems


__all__ = ["TraceRun", "run_events", "chrome_trace", "write_trace", "check_trace"]
