"""The benchmark behind ``ho-plan bench``: a fixed suite of graphs and budgets, greedy against cpsat.

Suite (each at 60%, 70%, 80% and 90% of the graph's no-offload HBM peak, unless it says otherwise):

- ``paper``: the graphs in ``graphs/`` (the paper's workloads and the two hand-written examples);
- ``checkmate`` (issue 13): the Checkmate / Moccasin graphs in ``../shared/graphs/checkmate`` (``CHECKMATE_GRAPHS``:
  the seven ``*_train_nx`` CNNs and the four random layered graphs, those read with ``size_unit_bytes=1e6``) at
  their own budgets, 0.8 and 0.9 of the no-offload peak *in the graph's own order* (``order="graph"``, the
  budgets Moccasin uses, rather than ``none``'s default ``auto``, which may pick a lower-peaking order), on
  ``ascend-910c``. Its planners: ``none`` once per graph with unbounded HBM (the reference whose peak sets the
  budgets and whose makespan the overheads are against), then per budget greedy and cpsat, each joint and
  remat-only (``NAME:offload=false``); rows carry the number of recompute steps and Moccasin's published
  overhead (``MOCCASIN_120S``) where the issue quotes one;
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

The ``backend`` suite is separate too (``planner/bench_backends.py``): Ray's overhead against the local pool on
these cases, and a sweep that loses a Ray worker mid-run. Cases run through ``run_cases`` on a backend
(``planner.backends``): one point per budget and planner, each case's graph shipped once.

The ``scale`` suite is separate (``run_scale``): it generates the two large DeepSeek-V3 + NSA inference graphs
(``SCALE_GRAPHS``, weights on the host) and times the greedy command end to end, the greedy planner alone, and
the executor (steps per second, without an allocator model, with the caching allocator, and with the plan's
static offsets).

Planners are named ``NAME`` or ``NAME:KEY=VALUE[:KEY=VALUE...]`` (``greedy:offload=false``): the options are
parsed as ``-O`` text for that planner; a planner that does not take one makes an invalid row with the reason.

Per case and planner it records: ops, valid, makespan and its overhead against no offload, peak HBM, bytes moved,
the gap against the best makespan lower bound (``planner.bounds``: "vs bound"), the planner's wall time, where
the tensors no op produces start (bytes per kind and tier), prefill and decode latency for inference graphs
(and the no-offload plan's), recompute steps and their compute time, the options the plan was made with, and for
cpsat its solver record (model, status, windows accepted, CP-SAT's own bound when the model was whole).
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
from planner.backends import GRAPH_ID, BackendSpec, worker_graph
from planner.cost import op_durations_ns
from planner.executor import simulate
from planner.formats import save_graph
from planner.graph import AUTO, Graph, Op, Tensor, TensorKind
from planner.hardware import HBM
from planner.placement import bytes_by_kind
from planner.plan import StepKind
from planner.planners import PLANNERS
from planner.planners.greedy import plan_greedy
from planner.planners.none import plan_none, program_none
from planner.quality import solver_outcome
from planner.report.paper import phase_latencies
from planner.timeline import Timeline

ROOT = Path(__file__).resolve().parents[1]
FRACTIONS = (0.6, 0.7, 0.8, 0.9)
PLANNERS_DEFAULT = ("greedy", "cpsat")
GENERATED_OPS = (1000, 5000, 10000, 20000)
# Greedy runs as its settings sweep (``greedy-sweep``) on graphs of up to this many ops: the sweep costs 2.5 to 3
# greedy runs (generated-10k 4.9 -> 14.8 s, generated-20k 11.1 -> 34.2 s; deepseek-v3-paper at 70% 9.8 -> 17.9 s).
# A fixed rule, so that a row's planner is the same on every run and machine: it used to be a wall-clock estimate
# (13 greedy runs), which ran 5x high and flipped deepseek-v3-paper at 70% between greedy and the sweep.
SWEEP_MAX_OPS = 20_000

# The checkmate suite (issue 13): (case name, file in ../shared/graphs/checkmate, import options). The training
# graphs only, as in the issue and Moccasin's experiments (the *_test_nx files are forward passes, which free
# each activation after its one use: little to rematerialize). The random graphs' sizes have no unit; read as
# megabytes (docs/formats.md): as bytes, any link would move them within its latency, and offloading would be
# free.
_RANDOM_MB = {"size_unit_bytes": 1e6}
CHECKMATE_GRAPHS: tuple[tuple[str, str, dict], ...] = (
    ("VGG16", "VGG16_256_224_224_3_train_nx.json", {}),
    ("VGG19", "VGG19_256_224_224_3_train_nx.json", {}),
    ("MobileNet", "MobileNet_512_224_224_3_train_nx.json", {}),
    ("ResNet50", "ResNet50_256_224_224_3_train_nx.json", {}),
    ("fcn_8", "fcn_8_vgg_32_416_608_3_train_nx.json", {}),
    # FCN8's file holds multiply-accumulates, which the case above times by the roofline; Moccasin's cost is the
    # count itself, so its 25 pooling, dropout, cropping and reshape ops cost nothing (13.5% of the roofline's time).
    # Read in Moccasin's cost model, at 7.5 fs per MAC (the same 77 ms of compute, so links keep their weight).
    ("fcn_8-moccasin-cost", "fcn_8_vgg_32_416_608_3_train_nx.json", {"time_unit_s": 7.5e-15}),
    ("segnet", "segnet_32_416_608_3_train_nx.json", {}),
    ("vgg_unet", "vgg_unet_32_416_608_3_train_nx.json", {}),
    ("random_n100", "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json", _RANDOM_MB),
    ("random_n250", "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json", _RANDOM_MB),
    ("random_n500", "random_layered_n500_w0.36_nlv0.75_ed0.2_scd0.14.json", _RANDOM_MB),
    ("random_n1000", "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json", _RANDOM_MB),
)
# Moccasin's budgets: fractions of the peak of the graph's own topological order.
CHECKMATE_FRACTIONS = (0.8, 0.9)
# The reference row (none, once per graph, HBM unbounded), then per budget each planner joint and remat-only.
# ``offload`` is the greedy/greedy-sweep/cpsat option of issue 13 (default true; false: the Checkmate problem).
CHECKMATE_PLANNERS = ("none", "greedy", "greedy:offload=false", "cpsat", "cpsat:offload=false")

# Moccasin (CP-SAT rematerialization) as issue 13 quotes it, measured on the same 2-core machine with a 120 s limit:
# its overhead over the no-rematerialization compute time, by (checkmate case, budget fraction); None: it found
# nothing within 120 s. "VGG16 0.9 +1.97%; FCN8 0.8/0.9 +0.14%/+0.03%; random n100 0.8/0.9 +2.30%/+0.79%;
# MobileNet 0.9/0.8 +0.16%/+0.37% (55 s and 88 s); random n250 0.9 +57%, 0.8 nothing; ResNet-50 nothing within
# 120 s; random n500 nothing." Pairs the issue does not quote have no entry.
MOCCASIN_120S: dict[tuple[str, float], float | None] = {
    ("VGG16", 0.9): 0.0197,
    ("fcn_8-moccasin-cost", 0.8): 0.0014, ("fcn_8-moccasin-cost", 0.9): 0.0003,
    ("random_n100", 0.8): 0.0230, ("random_n100", 0.9): 0.0079,
    ("MobileNet", 0.8): 0.0037, ("MobileNet", 0.9): 0.0016,
    ("random_n250", 0.8): None, ("random_n250", 0.9): 0.57,
    ("ResNet50", 0.8): None, ("ResNet50", 0.9): None,
    ("random_n500", 0.8): None, ("random_n500", 0.9): None,
}
# Moccasin's figures are quoted to 0.01 %: an overhead within half of that matches.
MOCCASIN_TOLERANCE = 0.00005


@dataclass(frozen=True)
class Case:
    name: str  # graph name
    suite: str
    load: Callable[[], Graph]
    preset: str = "ascend-910c"
    overrides: dict = field(default_factory=dict)  # planner.hardware.with_overrides keywords
    # The suite's own budgets and planners (``--budgets`` and ``--planners`` replace them).
    fractions: tuple[float, ...] = FRACTIONS
    planners: tuple[str, ...] = PLANNERS_DEFAULT
    # The order of the no-offload reference whose peak the budgets are fractions of, and of the ``none`` rows.
    reference_order: str = "auto"
    # Planners run once, with unbounded HBM (budget fraction None), rather than at each budget: the reference,
    # whose peak and makespan those of the budgets are measured against.
    once: tuple[str, ...] = ()
    # Published results to compare with, by budget fraction (the checkmate suite: ``MOCCASIN_120S``).
    moccasin: dict[float, float | None] = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # copied into every row (the file and its import options)


def planner_variant(text: str) -> tuple[str, dict[str, str]]:
    """``"greedy:offload=false"`` -> ``("greedy", {"offload": "false"})``: a planner and its options as ``-O``
    text. ValueError when an option is not ``KEY=VALUE``."""
    name, *parts = text.strip().split(":")
    options = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{text!r}: {part!r} is not KEY=VALUE")
        options[key.strip()] = value.strip()
    return name.strip(), options


def checkmate_cases(shared: Path) -> tuple[list[Case], list[str]]:
    """The checkmate suite's cases from ``shared/graphs/checkmate``, and one message per graph that is not there
    (the whole folder in one message when it is absent)."""
    folder = shared / "graphs" / "checkmate"
    if not folder.is_dir():
        return [], [f"checkmate: {folder} is not here (the Checkmate / Moccasin graphs live in ../shared)"]
    cases, missing = [], []
    for name, file, options in CHECKMATE_GRAPHS:
        path = folder / file
        if not path.is_file():
            missing.append(f"checkmate: {path} is not here; {name} skipped")
            continue
        cases.append(Case(
            name, "checkmate", lambda p=path, o=options: api.load_graph(p, **o), fractions=CHECKMATE_FRACTIONS,
            planners=CHECKMATE_PLANNERS, reference_order="graph", once=("none",),
            moccasin={f: v for (g, f), v in MOCCASIN_120S.items() if g == name},
            info={"file": file, "import_options": dict(options)}))
    return cases, missing


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
    cases whose graph name contains one of these strings. Checkmate graphs that are not in ``shared`` are left out
    (``checkmate_cases`` says which)."""
    shared = shared if shared is not None else ROOT.parent / "shared"
    cases: list[Case] = []
    names = set(names)
    if "paper" in names:
        for path in sorted((ROOT / "graphs").glob("*.json")):
            preset = "cloudmatrix384" if "remote_weights" in path.name else "ascend-910c"
            cases.append(Case(path.stem, "paper", lambda p=path: api.load_graph(p), preset))
    if "checkmate" in names:
        cases += checkmate_cases(shared)[0]
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


def greedy_label(graph: Graph) -> str:
    """The planner a bench row named ``greedy`` runs on ``graph``: ``greedy-sweep`` up to ``SWEEP_MAX_OPS`` ops,
    else ``greedy``."""
    return "greedy-sweep" if len(graph.ops) <= SWEEP_MAX_OPS else "greedy"


def no_offload_reference(graph: Graph, preset: str, overrides: dict, order: str = "auto") -> Timeline:
    """The no-offload timeline with unbounded HBM in ``order``: ``api.no_offload_reference`` for ``auto`` (the
    order ``none`` picks), else ``none``'s program in that order (the checkmate suite: the graph's own)."""
    if order == "auto":
        return api.no_offload_reference(graph, api.hardware(preset, **overrides))
    big = api.hardware(preset, **{**overrides, "hbm": "1PB"})
    return simulate(graph, big, program_none(graph, big, order))


def case_points(case: Case, graph: Graph, fractions: Iterable[float] | None = None,
                planners: Iterable[str] | None = None, time_limit: float = 60.0, seed: int = 0, workers: int = 2,
                graph_id: str = "") -> list[dict]:
    """The points of one case (``graph`` is ``case.load()``): one per budget and planner, in row order, each with
    the row's fixed part (``"row"``) and what ``bench_point`` needs to plan it on ``graph`` (named ``graph_id``
    on the backend). The no-offload reference and the bounds are computed here, once per case and budget."""
    fractions = tuple(fractions) if fractions is not None else case.fractions
    planners = tuple(planners) if planners is not None else case.planners
    ref = no_offload_reference(graph, case.preset, case.overrides, case.reference_order)
    peak = ref.metrics.peak_bytes[HBM]
    # Inference graphs: prefill and decode latency, against the no-offload plan's.
    gen = graph.metadata.get("generator", "")
    decode_steps = (graph.metadata.get("options") or {}).get("decode_steps", 1)
    ref_phases = phase_latencies(plan_none(graph, api.hardware(case.preset, **{**case.overrides, "hbm": "1PB"})),
                                 ref, decode_steps) \
        if gen.endswith("long_context_inference") else None
    once = [p for p in planners if planner_variant(p)[0] in case.once]
    budgets: list[tuple[float | None, list[str]]] = [(None, once)] if once else []
    budgets += [(f, [p for p in planners if p not in once]) for f in fractions]
    minimum, _ = bounds.largest_working_set(graph)
    points = []
    for frac, variants in budgets:
        if not variants:
            continue
        hbm = "1PB" if frac is None else str(int(peak * frac))
        hw = api.hardware(case.preset, **{**case.overrides, "hbm": hbm})
        try:
            lb = bounds.makespan_bound(graph, hw)
        except Exception:  # noqa: BLE001
            lb = bounds.compute_bound(graph, hw)
        for variant in variants:
            name, _ = planner_variant(variant)
            row = {"graph": case.name, "suite": case.suite, "hardware": case.preset, "ops": len(graph.ops),
                   "budget_fraction": frac, "budget_bytes": None if frac is None else hw.hbm_bytes,
                   "planner": variant, "no_offload_makespan_us": ref.metrics.makespan_ns / 1000,
                   "no_offload_peak_bytes": peak, "no_offload_order": case.reference_order,
                   "bound_us": lb.value / 1000, "bound_reason": lb.reason, **case.info}
            if frac in case.moccasin:
                row["moccasin_overhead"] = case.moccasin[frac]
            options: dict = {}
            if name == "cpsat":
                options = {"time_limit": time_limit, "seed": seed, "workers": workers}
            if name == "exact":
                options = {"time_limit": time_limit}
            if name == "none":
                options = {"order": case.reference_order}
            points.append({"case": case.name, GRAPH_ID: graph_id, "fraction": frac, "planner": variant,
                           "preset": case.preset, "overrides": case.overrides, "hbm": hbm, "options": options,
                           "below_minimum": hw.hbm_bytes < minimum, "bound_ns": lb.value,
                           "reference_makespan_ns": ref.metrics.makespan_ns, "reference_phases": ref_phases,
                           "decode_steps": decode_steps, "row": row})
    return points


def bench_point(p: dict) -> dict:
    """One planner at one budget of a case (``case_points``), on the backend's graph: the bench row."""
    graph = worker_graph()
    row = dict(p["row"])
    if p["below_minimum"]:
        row.update(valid=False, note="budget below the largest single-op working set")
        return row
    hw = api.hardware(p["preset"], **{**p["overrides"], "hbm": p["hbm"]})
    name, text = planner_variant(p["planner"])
    options = dict(p["options"])
    label = greedy_label(graph) if name == "greedy" else name
    t = time.monotonic()
    try:
        # The variant's options (text, as -O takes them) for the planner that runs: a planner that does not
        # take one (cpsat:offload=false before issue 13's options exist) is an invalid row saying so.
        options.update(api.parse_planner_options(label, text, item=f"--planners {name}"))
        row["planner_options"] = {k: v for k, v in options.items() if isinstance(v, (bool, int, float, str))}
        plan = PLANNERS[label](graph, hw, **options)
    except Exception as exc:  # noqa: BLE001 - a failing planner is a row, not a crash
        row.update(valid=False, note=f"{type(exc).__name__}: {exc}", solve_time_s=time.monotonic() - t)
        return row
    solve_s = time.monotonic() - t
    tl = simulate(graph, hw, plan)
    m = tl.metrics
    ref_ns = p["reference_makespan_ns"]
    row.update(
        planner_run=label, valid=tl.valid, status=str(plan.status), makespan_us=m.makespan_ns / 1000,
        overhead=m.makespan_ns / ref_ns - 1 if ref_ns else 0.0,
        peak_hbm_bytes=m.peak_bytes[HBM], bytes_moved=sum(m.bytes_moved.values()),
        gap_vs_bound=bounds.gap(m.makespan_ns, p["bound_ns"]) if tl.valid else None,
        solve_time_s=round(solve_s, 3), defrag_events=m.defrag_events,
        recompute_steps=sum(1 for st in plan.steps if st.kind is StepKind.RECOMPUTE),
        recompute_us=m.recompute_ns / 1000,
        start_placement=bytes_by_kind(graph, plan.placement),
        # What the plan was made with: the options given (as api.plan records them), and what the planner
        # chose (greedy-sweep: the winning settings and order), to learn which points win.
        plan_options={k: v for k, v in {**options, **plan.options}.items()
                      if isinstance(v, (bool, int, float, str))},
    )
    if not tl.valid:
        # Why there is no valid plan, for the summary: the planner's own word (an infeasible status says
        # it), else the executor's first violation.
        row["note"] = "; ".join(plan.notes) or f"{str(plan.status)}: {tl.violations[0].describe()}"
    if p["reference_phases"] is not None:
        row["no_offload_phases_us"] = p["reference_phases"]
        row["phases_us"] = phase_latencies(plan, tl, p["decode_steps"])
    ex = plan.stats.get("exact") if isinstance(plan.stats, dict) else None
    if ex and ex.get("optimum_ns") is not None:
        row["optimum_us"] = ex["optimum_ns"] / 1000
    outcome = solver_outcome(plan)
    if outcome is not None:
        row["solver"] = {**outcome.to_dict(), "model_optimal": outcome.model_optimal,
                         "start_planner": outcome.start_planner, "start_makespan_us": outcome.start_makespan_us}
        row["notes"] = list(plan.notes)
    return row


def _bench_error(p: dict, reason: str) -> dict:
    """The row of a point whose task failed (its Ray worker died twice): invalid, with the reason."""
    return {**p["row"], "valid": False, "status": "error", "note": reason}


def run_cases(cases: Iterable[Case], fractions: Iterable[float] | None = None, planners: Iterable[str] | None = None,
              time_limit: float = 60.0, seed: int = 0, workers: int = 2,
              progress: Callable[[dict], None] | None = None, backend: BackendSpec | None = None) -> list[dict]:
    """Every planner at every budget of every case, one row each in case, budget and planner order; the points
    run on ``backend`` (default: one by one in this process), each case's graph shipped to it once.
    ``progress(d)`` as each point finishes: ``case``, ``fraction``, ``planner``, ``done``, ``total``."""
    graphs, points = {}, []
    for i, case in enumerate(cases):
        gid = f"{i}:{case.name}"
        graphs[gid] = case.load()
        points += case_points(case, graphs[gid], fractions, planners, time_limit, seed, workers, gid)
    spec = backend if backend is not None else BackendSpec()
    rows: list[dict | None] = [None] * len(points)
    with spec.open(graphs) as b:
        for done, (i, row) in enumerate(b.imap(bench_point, points, on_error=_bench_error), 1):
            rows[i] = row
            if progress:
                p = points[i]
                progress({"case": p["case"], "fraction": p["fraction"], "planner": p["planner"], "done": done,
                          "total": len(points)})
    return rows  # type: ignore[return-value]


def run_case(case: Case, fractions: Iterable[float] | None = None, planners: Iterable[str] | None = None,
             time_limit: float = 60.0, seed: int = 0, workers: int = 2,
             progress: Callable[[dict], None] | None = None, backend: BackendSpec | None = None) -> list[dict]:
    """Every planner at every budget of one case: one row each. ``fractions``, ``planners``: the case's own when
    None; planners as ``planner_variant`` reads them. Planners in ``case.once`` run once, with unbounded HBM (their
    rows' ``budget_fraction`` and ``budget_bytes`` are None): at the peak itself the caching allocator's
    fragmentation could slow ``none`` down, and the reference is the no-offload plan as such."""
    return run_cases([case], fractions, planners, time_limit, seed, workers, progress, backend)


def _median(values: list[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def moccasin_match(row: dict) -> bool | None:
    """Whether a row with a Moccasin figure matches or beats it (a valid plan no slower, within the figure's
    rounding; any valid plan where Moccasin found none); None when the row has no figure."""
    if "moccasin_overhead" not in row:
        return None
    if not row.get("valid"):
        return False
    ref = row["moccasin_overhead"]
    return ref is None or row["overhead"] <= ref + MOCCASIN_TOLERANCE


def planner_summary(rows: list[dict]) -> list[dict]:
    """Per planner (as named in ``--planners``, variant included), in order of appearance: rows, valid plans, the
    median and largest overhead of the valid ones, and of the rows with a Moccasin figure how many match or beat
    it."""
    out = []
    for name in dict.fromkeys(r["planner"] for r in rows):
        mine = [r for r in rows if r["planner"] == name]
        over = [r["overhead"] for r in mine if r.get("valid")]
        matches = [m for m in (moccasin_match(r) for r in mine) if m is not None]
        out.append({"planner": name, "rows": len(mine), "valid": len(over),
                    "median_overhead": _median(over) if over else None, "max_overhead": max(over, default=None),
                    "moccasin_rows": len(matches), "moccasin_match_or_beat": sum(matches)})
    return out


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


# How far past its time limit a planner may run and still hold it (issue 10: "time limit held within 10%").
LIMIT_SLACK = 0.10


def limits_held(rows: list[dict], slack: float = LIMIT_SLACK) -> list[dict]:
    """Per planner that takes a time limit: how many of its rows ended within ``(1 + slack)`` times it, and the row
    that ran longest for its limit (``graph``, ``budget_fraction``, ``solve_time_s``, ``time_limit``). A row's time
    is the planner's own call, as ``solve_time_s`` records it (loading and validating the plan are not in it)."""
    out: dict[str, dict] = {}
    for r in rows:
        limit = (r.get("planner_options") or {}).get("time_limit")
        if not limit or r.get("solve_time_s") is None:
            continue
        d = out.setdefault(r["planner"], {"planner": r["planner"], "rows": 0, "held": 0, "worst": None})
        d["rows"] += 1
        d["held"] += r["solve_time_s"] <= limit * (1 + slack)
        ratio = r["solve_time_s"] / limit
        if d["worst"] is None or ratio > d["worst"]["solve_time_s"] / d["worst"]["time_limit"]:
            d["worst"] = {"graph": r["graph"], "budget_fraction": r["budget_fraction"],
                          "solve_time_s": r["solve_time_s"], "time_limit": limit}
    return list(out.values())


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
    allocator model the executor's time and steps per second: ``none`` (no HBM addresses: the plan without its
    offsets, as planners time their candidates), ``caching`` (the caching allocator) and ``static`` (greedy's
    offsets checked).
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
        # "none": no allocator model at all, as planners time the plans of their windows and sweep points (a plan
        # with offsets would have them checked, which is the "static" column's cost).
        models = {"none": (replace(plan, offsets={}), False), "caching": (replace(plan, offsets={}), True)}
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


__all__ = ["Case", "CHECKMATE_FRACTIONS", "CHECKMATE_GRAPHS", "CHECKMATE_PLANNERS", "FRACTIONS", "MOCCASIN_120S",
           "SCALE_GRAPHS", "SCALE_HBM", "checkmate_cases", "compare", "generated_graph", "moccasin_match",
           "no_offload_reference", "planner_summary", "planner_variant", "run_case", "run_cases", "case_points",
           "bench_point", "run_scale", "small_graphs", "suite", "true_gaps"]
