"""The benchmark behind ``ho-plan bench``: a fixed suite of graphs and budgets, greedy against cpsat.

Suite (each at 60%, 70%, 80% and 90% of the graph's no-offload HBM peak):

- ``paper``: the graphs in ``graphs/`` (the paper's workloads and the two hand-written examples);
- ``checkmate``: the Checkmate / Moccasin graphs in ``../shared/graphs/checkmate`` when that folder exists;
- ``generated``: repeated-transformer-layer graphs of about 1k, 5k, 10k and 20k ops (LLaMA-3-8B training,
  pipeline stage 0, with as many micro-batches as it takes; ``generated_graph``);
- ``onnx``: the ONNX fixtures in ``tests/fixtures/onnx`` (weights free: the planner picks their tier), at
  batch 2 and 16 tokens;
- ``small``: graphs of up to 12 ops where the ``exact`` planner proves the optimum (``small_graphs``): a
  chain, free weights, random DAGs with random pins and free homes, the transformer block cut to its first 10
  ops; run with ``--planners ...,exact`` for every planner's true gap to the optimum (``true_gaps``);
- ``fullsize``: the paper's full DeepSeek-V3 + NSA inference graph at 64k tokens (61 layers, 29k ops, weights
  free), generated on the fly, on ``ascend-910c`` and on ``cloudmatrix384``: slow (minutes per planner), so
  only when named.

The ``scale`` suite is separate (``run_scale``): it generates the two large DeepSeek-V3 + NSA inference graphs
(``SCALE_GRAPHS``, weights on the host) and times the greedy command end to end, the greedy planner alone, and
the executor (steps per second, without an allocator model, with the caching allocator, and with the plan's
static offsets).

Per case and planner it records: ops, valid, makespan and its overhead against no offload, peak HBM, bytes moved,
the gap against the best makespan lower bound (``planner.bounds``: "vs bound"), the planner's wall time, where
the tensors no op produces start (bytes per kind and tier), prefill and decode latency for inference graphs
(and the no-offload plan's), and for cpsat its solver record (model, status, windows accepted, CP-SAT's own
bound when the model was whole).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from planner import api, bounds, workloads
from planner.cost import op_durations_ns
from planner.executor import simulate
from planner.formats import save_graph
from planner.graph import AUTO, Graph, Op, Tensor, TensorKind
from planner.hardware import HBM
from planner.placement import bytes_by_kind
from planner.planners import PLANNERS
from planner.planners.greedy import plan_greedy
from planner.planners.greedy_sweep import grid_points
from planner.planners.none import plan_none
from planner.quality import solver_outcome
from planner.report.paper import phase_latencies

ROOT = Path(__file__).resolve().parents[1]
FRACTIONS = (0.6, 0.7, 0.8, 0.9)
GENERATED_OPS = (1000, 5000, 10000, 20000)
# Greedy's settings sweep runs when one greedy run times the number of points fits this many seconds.
SWEEP_BUDGET_S = 120.0


@dataclass(frozen=True)
class Case:
    name: str  # graph name
    suite: str
    load: Callable[[], Graph]
    preset: str = "ascend-910c"
    overrides: dict = field(default_factory=dict)  # planner.hardware.with_overrides keywords


def generated_graph(ops: int) -> Graph:
    """A LLaMA-3-8B training graph (pipeline stage 0, 16 layers or fewer) of about ``ops`` ops: the layer and
    micro-batch counts are chosen to come close (one micro-batch of one layer is about 31 ops)."""
    if ops <= 1500:
        layers = max(1, round((ops - 42) / 258))
        g = workloads.generate("llama3-8b-no2", layers=layers)
    else:
        micro = max(1, round(ops / (16 * 31.2)))
        g = workloads.generate("llama3-8b-no2", layers=16, grad_accum=micro)
    return Graph(name=f"generated-{ops // 1000}k", tensors=g.tensors, ops=g.ops, metadata=dict(g.metadata))


# The small suite's links: 1 GB/s and no latency, so that with sizes in kilobytes and durations in microseconds
# every duration is a whole number of microseconds and the exact reference can count time in microseconds.
SMALL_LINKS = {"link_bandwidth": {"d2h": "1GB/s", "h2d": "1GB/s"}, "link_latency": {"d2h": "0us", "h2d": "0us"}}


def small_graphs(randoms: int = 6, seed: int = 0) -> list[Graph]:
    """Graphs of at most 12 ops for the exact reference (with ``SMALL_LINKS``): sizes in kilobytes and durations
    in microseconds, so that transfers (1 us per KB) and compute are of one scale."""
    mb, us = 10**3, 1e-6
    out = []
    # A chain whose weights are free: how many start remote is the question.
    tensors = [Tensor("x", 4 * mb, TensorKind.INPUT)]
    ops = []
    prev = "x"
    for i in range(6):
        tensors += [Tensor(f"w{i}", 24 * mb, TensorKind.WEIGHT, home=AUTO), Tensor(f"a{i}", 4 * mb)]
        ops.append(Op(f"op{i}", "MatMul", (prev, f"w{i}"), (f"a{i}",), duration_s=200 * us))
        prev = f"a{i}"
    out.append(Graph.build("free-weights-6", tensors, ops))
    # Forward and backward of three layers: activations wait for their backward use.
    tensors, ops = [Tensor("x", 8 * mb, TensorKind.INPUT)], []
    for i in range(3):
        tensors += [Tensor(f"h{i}", 32 * mb), Tensor(f"g{i}", 8 * mb, TensorKind.GRADIENT)]
        ops.append(Op(f"f{i}", "F", ("x" if i == 0 else f"h{i - 1}",), (f"h{i}",), duration_s=150 * us))
    for i in reversed(range(3)):
        ops.append(Op(f"b{i}", "B", (f"h{i}",) + ((f"g{i + 1}",) if i < 2 else ()), (f"g{i}",),
                      duration_s=300 * us))
    out.append(Graph.build("fwd-bwd-3", tensors, ops))
    rng = np.random.default_rng(seed)
    for k in range(randoms):
        out.append(_random_dag(rng, f"random-{k}", n_ops=int(rng.integers(5, 11))))
    out.append(_cut(api.load_graph(ROOT / "graphs" / "transformer_block.json"), 10, "transformer_block-10"))
    return out


def _random_dag(rng: np.random.Generator, name: str, n_ops: int) -> Graph:
    """A random DAG: a few tensors that exist before the step (pinned to HBM or the host, or free; some updated in
    place), then ops reading the previous op's first output (a backbone, which keeps the number of orders small
    enough to enumerate) and up to two more earlier tensors, and making one or two."""
    mb, us = 10**3, 1e-6
    tensors: list[Tensor] = []
    avail: list[str] = []
    for k in range(int(rng.integers(2, 5))):
        kind = [TensorKind.WEIGHT, TensorKind.OPTIMIZER_STATE, TensorKind.INPUT][int(rng.integers(0, 3))]
        homes = [HBM, "host"] + ([AUTO] if kind is not TensorKind.INPUT else [])
        tensors.append(Tensor(f"p{k}", int(rng.integers(1, 40)) * mb, kind, home=homes[int(rng.integers(len(homes)))]))
        avail.append(f"p{k}")
    updatable = [t.name for t in tensors if t.persistent]
    ops = []
    backbone: str | None = None
    for i in range(n_ops):
        inputs = list(rng.choice(avail, size=min(len(avail), int(rng.integers(1, 3))), replace=False))
        if backbone is not None and backbone not in inputs:
            inputs.append(backbone)
        updates = [str(rng.choice(updatable))] if updatable and rng.random() < 0.2 else []
        updates = [t for t in updates if t not in inputs]
        outputs = [f"t{i}_{j}" for j in range(int(rng.integers(0 if updates else 1, 3)))]
        tensors += [Tensor(t, int(rng.integers(1, 40)) * mb) for t in outputs]
        backbone = outputs[0] if outputs else backbone
        ops.append(Op(f"op{i}", "F", tuple(str(x) for x in inputs), tuple(outputs), tuple(updates),
                      duration_s=int(rng.integers(10, 500)) * us))
        avail += outputs
    return Graph.build(name, tensors, ops)


def _cut(graph: Graph, n_ops: int, name: str, scale: float = 1e-3) -> Graph:
    """The first ``n_ops`` ops of ``graph`` (graph order) and the tensors they use, sizes times ``scale`` (in
    whole kilobytes) and durations (on ascend-910c) in whole microseconds."""
    ops = graph.ops[:n_ops]
    used = {t for op in ops for t in op.inputs + op.outputs + op.updates}
    dur = op_durations_ns(graph, api.hardware("ascend-910c"))
    tensors = [replace(t, bytes=max(1, round(t.bytes * scale / 1000)) * 1000, shape=None, dtype=None)
               for n, t in graph.tensors.items() if n in used]
    ops = [replace(op, duration_s=max(1, round(dur[op.name] / 1000)) * 1e-6) for op in ops]
    return Graph.build(name, tensors, ops)


def true_gaps(rows: list[dict]) -> list[dict]:
    """Per case, budget and planner: makespan over the exact planner's proven optimum, minus one."""
    optimum = {(r["graph"], r["budget_fraction"], r.get("hardware")): r.get("optimum_us")
               for r in rows if r["planner"] == "exact" and r.get("optimum_us")}
    out = []
    for r in rows:
        opt = optimum.get((r["graph"], r["budget_fraction"], r.get("hardware")))
        if opt and r.get("valid") and r["planner"] != "exact":
            out.append({"graph": r["graph"], "budget_fraction": r["budget_fraction"], "planner": r["planner"],
                        "optimum_us": opt, "makespan_us": r["makespan_us"], "gap": r["makespan_us"] / opt - 1})
    return out


def fullsize_graph(workload: str = "deepseek-v3-nsa-64k") -> Graph:
    """The paper's full-size inference graph (all 61 layers), generated with the workload's defaults."""
    return workloads.generate(workload)


def suite(names: Iterable[str] = ("paper", "checkmate", "generated"), quick: bool = False,
          only: Iterable[str] = (), shared: Path | None = None) -> list[Case]:
    """The benchmark's cases. ``quick``: two small paper graphs and the 1k generated graph. ``only``: keep the
    cases whose graph name contains one of these strings."""
    shared = shared if shared is not None else ROOT.parent / "shared"
    cases: list[Case] = []
    names = set(names)
    if "paper" in names:
        for path in sorted((ROOT / "graphs").glob("*.json")):
            preset = "cloudmatrix384" if "remote_weights" in path.name else "ascend-910c"
            cases.append(Case(path.stem, "paper", lambda p=path: api.load_graph(p), preset))
    ck = shared / "graphs" / "checkmate"
    if "checkmate" in names and ck.is_dir():
        for path in sorted(ck.glob("*.json")):
            cases.append(Case(path.stem, "checkmate", lambda p=path: api.load_graph(p)))
    if "generated" in names:
        for n in GENERATED_OPS:
            cases.append(Case(f"generated-{n // 1000}k", "generated", lambda n=n: generated_graph(n)))
    if "small" in names:
        for g in small_graphs():
            cases.append(Case(g.name, "small", lambda g=g: g, overrides=SMALL_LINKS))
    if "onnx" in names:
        for path in sorted((ROOT / "tests" / "fixtures" / "onnx").glob("*.onnx")):
            cases.append(Case(path.stem, "onnx", lambda p=path: api.load_graph(p, dims={"batch": 2, "sequence": 16})))
    if "fullsize" in names:
        for preset in ("ascend-910c", "cloudmatrix384"):
            cases.append(Case("deepseek-v3-nsa-64k", "fullsize", fullsize_graph, preset))
    if quick:
        keep = {"transformer_block", "deepseek-v3-nsa-64k-L3-1layer", "generated-1k"}
        cases = [c for c in cases if c.name in keep]
    only = [o for o in only if o]
    if only:
        cases = [c for c in cases if any(o in c.name for o in only)]
    return cases


def _sweep_affordable(graph: Graph, hw) -> bool:
    t = time.monotonic()
    PLANNERS["greedy"](graph, hw)
    single = time.monotonic() - t
    points = len(grid_points())
    return single * points * 0.7 <= SWEEP_BUDGET_S


def run_case(case: Case, fractions=FRACTIONS, planners=("greedy", "cpsat"), time_limit: float = 60.0,
             seed: int = 0, workers: int = 2, progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Every planner at every budget of one case: one row each."""
    graph = case.load()
    base_hw = api.hardware(case.preset, **case.overrides)
    ref = api.no_offload_reference(graph, base_hw)
    peak = ref.metrics.peak_bytes[HBM]
    # Inference graphs: prefill and decode latency, against the no-offload plan's.
    gen = graph.metadata.get("generator", "")
    decode_steps = (graph.metadata.get("options") or {}).get("decode_steps", 1)
    ref_phases = phase_latencies(plan_none(graph, api.hardware(case.preset, **{**case.overrides, "hbm": "1PB"})),
                                 ref, decode_steps) \
        if gen.endswith("long_context_inference") else None
    rows = []
    for frac in fractions:
        hw = api.hardware(case.preset, **{**case.overrides, "hbm": str(int(peak * frac))})
        try:
            lb = bounds.makespan_bound(graph, hw)
        except Exception:  # noqa: BLE001
            lb = bounds.compute_bound(graph, hw)
        minimum, _ = bounds.largest_working_set(graph)
        for name in planners:
            row = {"graph": case.name, "suite": case.suite, "hardware": case.preset, "ops": len(graph.ops),
                   "budget_fraction": frac,
                   "budget_bytes": hw.hbm_bytes, "planner": name, "no_offload_makespan_us": ref.metrics.makespan_ns
                   / 1000, "no_offload_peak_bytes": peak, "bound_us": lb.value / 1000, "bound_reason": lb.reason}
            if progress:
                progress({"case": case.name, "fraction": frac, "planner": name})
            if hw.hbm_bytes < minimum:
                row.update(valid=False, note="budget below the largest single-op working set")
                rows.append(row)
                continue
            options = {}
            label = name
            if name == "greedy" and _sweep_affordable(graph, hw):
                label = "greedy-sweep"
            if name == "cpsat":
                options = {"time_limit": time_limit, "seed": seed, "workers": workers}
            if name == "exact":
                options = {"time_limit": time_limit}
            t = time.monotonic()
            try:
                plan = PLANNERS[label](graph, hw, **options)
            except Exception as exc:  # noqa: BLE001 - a failing planner is a row, not a crash
                row.update(valid=False, note=f"{type(exc).__name__}: {exc}", solve_time_s=time.monotonic() - t)
                rows.append(row)
                continue
            solve_s = time.monotonic() - t
            tl = simulate(graph, hw, plan)
            m = tl.metrics
            row.update(
                planner_run=label, valid=tl.valid, status=str(plan.status), makespan_us=m.makespan_ns / 1000,
                overhead=m.makespan_ns / ref.metrics.makespan_ns - 1 if ref.metrics.makespan_ns else 0.0,
                peak_hbm_bytes=m.peak_bytes[HBM], bytes_moved=sum(m.bytes_moved.values()),
                gap_vs_bound=bounds.gap(m.makespan_ns, lb.value) if tl.valid else None,
                solve_time_s=round(solve_s, 3), defrag_events=m.defrag_events,
                start_placement=bytes_by_kind(graph, plan.placement),
                # What the planner chose (greedy-sweep: the winning settings and order), to learn which points win.
                plan_options={k: v for k, v in plan.options.items() if isinstance(v, (bool, int, float, str))},
            )
            if ref_phases is not None:
                row["no_offload_phases_us"] = ref_phases
                row["phases_us"] = phase_latencies(plan, tl, decode_steps)
            ex = plan.stats.get("exact") if isinstance(plan.stats, dict) else None
            if ex and ex.get("optimum_ns") is not None:
                row["optimum_us"] = ex["optimum_ns"] / 1000
            outcome = solver_outcome(plan)
            if outcome is not None:
                row["solver"] = {**outcome.to_dict(), "model_optimal": outcome.model_optimal,
                                 "start_planner": outcome.start_planner, "start_makespan_us": outcome.start_makespan_us}
                row["notes"] = list(plan.notes)
            rows.append(row)
    return rows


def compare(rows: list[dict]) -> list[dict]:
    """Per case and budget: cpsat's makespan against greedy's (negative: cpsat faster)."""
    out = []
    key = lambda r: (r["graph"], r["budget_fraction"], r.get("hardware", "ascend-910c"))  # noqa: E731
    by: dict = {}
    for r in rows:
        by.setdefault(key(r), {})[r["planner"]] = r
    for k, d in by.items():
        g, c = d.get("greedy"), d.get("cpsat")
        if g and c and g.get("valid") and c.get("valid"):
            out.append({"graph": k[0], "budget_fraction": k[1], "hardware": k[2], "greedy_us": g["makespan_us"],
                        "cpsat_us": c["makespan_us"], "change": c["makespan_us"] / g["makespan_us"] - 1})
    return out


# The scale suite: (preset, generator options) at one HBM budget, the figures the planner must stay fast on.
SCALE_GRAPHS: tuple[tuple[str, dict], ...] = (
    ("deepseek-v3-nsa-64k", {"weight_home": "host"}),
    ("deepseek-v3-nsa-128k", {"weight_home": "host"}),
)
SCALE_HBM = "53.8GB"


def run_scale(workdir: Path, hbm: str = SCALE_HBM, layers: int | None = None, repeats: int = 1,
              graphs: tuple[tuple[str, dict], ...] = SCALE_GRAPHS,
              progress: Callable[[str], None] | None = None) -> list[dict]:
    """Time greedy and the executor on each of ``graphs``, generated into ``workdir``; one row per graph.

    ``layers`` overrides the presets' layer count (a quick run); executor times are the best of ``repeats``.
    Row: ops, steps, the ``ho-plan GRAPH --planner greedy`` command's wall time in a fresh process (loading,
    planning, validating, the no-offload reference, the summary and the schedule file), greedy's own time, and per
    allocator model the executor's time and steps per second.
    """
    rows = []
    for preset, options in graphs:
        kwargs = dict(options, **({"layers": layers} if layers else {}))
        graph = workloads.generate(preset, **kwargs)
        path = Path(workdir) / f"{preset}.json"
        save_graph(graph, path)
        if progress:
            progress(f"{preset}: {len(graph.ops)} ops; greedy command")
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "planner", str(path), "--hbm", hbm, "--planner", "greedy", "--json",
             "-o", str(Path(workdir) / f"{preset}.greedy.schedule.json")],
            capture_output=True, text=True, check=False,
        )
        command_s = time.perf_counter() - t
        graph = api.load_graph(path)
        hw = api.hardware("ascend-910c", hbm=hbm)
        if progress:
            progress(f"{preset}: greedy in process")
        t = time.perf_counter()
        plan = plan_greedy(graph, hw)
        greedy_s = time.perf_counter() - t
        row = {"graph": preset, "ops": len(graph.ops), "steps": len(plan.steps), "hbm": hbm,
               "command_s": round(command_s, 3), "command_exit": proc.returncode, "greedy_s": round(greedy_s, 3),
               "status": plan.status}
        models = {"none": (plan, False), "caching": (replace(plan, offsets={}), True)}
        if plan.offsets:
            models["static"] = (plan, True)
        for model, (p, alloc) in models.items():
            if progress:
                progress(f"{preset}: executor ({model})")
            best = None
            for _ in range(max(1, repeats)):
                t = time.perf_counter()
                simulate(graph, hw, p, allocator=alloc)
                dt = time.perf_counter() - t
                best = dt if best is None else min(best, dt)
            row[f"executor_{model}_s"] = round(best, 3)
            row[f"executor_{model}_steps_per_s"] = round(len(p.steps) / best) if best > 0 else None
        rows.append(row)
    return rows


__all__ = ["Case", "FRACTIONS", "SCALE_GRAPHS", "SCALE_HBM", "suite", "run_case", "run_scale", "generated_graph",
           "compare", "small_graphs", "true_gaps"]
