"""The paper's evaluation (HyperOffload, arXiv 2602.00748) on our model of its setup: ``ho-plan paper``.

Inference: DeepSeek-V3 + NSA on ``ascend-910c`` (D2H/H2D 33.6 GB/s), a reduced layer count so the run takes a
few minutes. Calibration: the HBM budget is the no-offload peak at 71k tokens (72,704), the paper's baseline
maximum, so ``none`` fits 71k tokens by construction, as the paper's baseline did. Then, for none, reactive,
greedy (best of its sweep) and cpsat:

- the lowest HBM peak of a valid plan at 71k tokens that is at most ``max_overhead`` slower than no offload
  (the paper's 61.2 -> 45.0 GB), its reduction against the KV-cache size, and against the peak one would get by
  offloading the whole KV cache for free (the no-offload peak with every KV byte removed);
- the longest sequence that fits the calibrated budget within the same overhead (the paper's 71k -> 123k);
- defragmentation events of the caching allocator model at the calibrated budget (the paper's 57 -> 0);
- prefill latency and decode latency per step (the paper's 129.33 -> 99.41 s and 0.117 -> 0.146 s).

Training: LLaMA-3-8B, configuration No.1 (DP8, micro-batch 2), reduced layers, optimizer states on HBM. The
baseline is no offload with recompute on, whose peak is the HBM budget; each planner runs the recompute-off
graph in that budget, offloading what it must (recompute steps off: the paper's setting). The planners that can
recompute (``recompute`` option) also plan it jointly: per activation, keep, offload or drop and re-run, the
question the paper's two fixed graphs answer one way each. The gain over the baseline at D2H/H2D bandwidths from
20 to 400 GB/s is the paper's bandwidth-robustness curve (on par at 33.6 GB/s, +5.7% to +21.5% at 40 to 70 GB/s).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from planner import api
from planner.backends import BackendSpec
from planner.fileio import write_atomic
from planner.graph import Graph
from planner.hardware import HBM, Hardware, preset
from planner.placement import bytes_by_kind
from planner.plan import StepKind
from planner.planners.none import plan_none
from planner.report import plots
from planner.report.compare import ERROR, VALID, available_planners, lower_bounds, run_planner
from planner.report.sweeps import (
    PLAN_KEY,
    Progress,
    _bisect,
    _split_timing,
    error_point,
    generate,
    min_budget_search,
    seed_looser,
    seqlen_sweep,
    sweep_planner_options,
    with_bandwidth,
    with_hbm,
)
from planner.report.writer import markdown_table
from planner.timeline import Timeline, peak_of_intervals

# The paper's figures (001_*.txt in the seeds: tables of the Chinese summary).
PAPER = {
    "peak_hbm_GB": (61.2, 45.0),
    "max_seq_tokens": (71_000, 123_000),
    "defrag_events": (57, 0),
    "prefill_s": (129.33, 99.41),
    "decode_s_per_step": (0.117, 0.146),
    "bandwidth": "33.6 GB/s: on par with the baseline; 40-70 GB/s: +5.7% to +21.5%",
}
BASE_SEQ = 72_704  # 71k tokens, a multiple of 1024


@dataclass
class PaperConfig:
    """What ``ho-plan paper`` runs. The defaults take a few minutes on 2 cores with ``jobs=2``."""

    layers: int = 2
    decode_steps: int = 8
    block: int = 1024
    prefill_chunk: int = 8192
    base_seq: int = BASE_SEQ
    seq_hi: int = 262_144
    seq_step: int = 1024
    max_overhead: float = 0.05
    time_limit: float = 10.0
    train_layers: int = 2
    train_seq: int = 8192
    bandwidths: tuple[float, ...] = (20.0, 33.6, 40.0, 50.0, 70.0, 100.0, 200.0, 400.0)
    planners: list[str] | None = None
    jobs: int = 1
    hardware: str = "ascend-910c"
    options: dict = field(default_factory=dict)

    def planner_names(self) -> list[str]:
        return available_planners(self.planners)

    def planner_options(self) -> dict[str, dict]:
        out = sweep_planner_options(self.options)  # cpsat single-worker: deterministic, whatever --jobs is
        for name in self.planner_names():
            if "time_limit" in api.option_types(name):
                out.setdefault(name, {}).setdefault("time_limit", self.time_limit)
        return out

    def inference_args(self) -> dict:
        return {"model": "deepseek-v3", "decode_steps": self.decode_steps, "block": self.block, "nsa": True,
                "layers": self.layers, "prefill_chunk": self.prefill_chunk}

    def training_args(self, recompute: bool) -> dict:
        return {"seq_len": self.train_seq, "micro_batch": 2, "dp": 8, "layers": self.train_layers,
                "recompute": recompute, "state_home": HBM}


# -- what a plan says about the paper's metrics ------------------------------------------------------------------

_PREFILL = re.compile(r"^p\d+\.")
_DECODE = re.compile(r"^d\d+\.")


def phase_latencies(plan, tl: Timeline, decode_steps: int) -> dict:
    """Prefill latency (start to the end of the last prefill op) and decode latency per step (the rest, divided
    by the steps), in microseconds, from the executed timeline of a ``long_context_inference`` graph."""
    prefill_end = decode_end = 0
    for s, tm in zip(plan.steps, tl.steps):
        if s.kind is not StepKind.COMPUTE:
            continue
        if _PREFILL.match(s.target):
            prefill_end = max(prefill_end, tm.end_ns)
        elif _DECODE.match(s.target):
            decode_end = max(decode_end, tm.end_ns)
    decode = (max(decode_end, prefill_end) - prefill_end) / max(1, decode_steps)
    return {"prefill_us": prefill_end / 1000, "decode_us_per_step": decode / 1000}


def kv_free_peak(tl: Timeline) -> int:
    """The HBM peak of ``tl`` with every KV-cache byte removed: what offloading the whole KV cache would reach
    if it cost nothing and the blocks were never needed on HBM."""
    return peak_of_intervals((r.start_ns, r.end_ns, r.bytes) for r in tl.residencies
                             if r.tier == HBM and r.kind != "kv_cache")[0]


def kv_offload_longest(gen: str, args: dict, hw: Hardware, budget: int, step: int, hi: int) -> dict:
    """The longest sequence (multiple of ``step`` up to ``hi``) whose no-offload peak without any KV byte fits
    ``budget``: what offloading the whole KV cache, for free, would reach. Bisection, like the planners'."""
    state = {"kv": {"good": None, "bad": None}}
    cache: dict = {}

    def run_round(pairs):
        for n, k in pairs:
            if (n, k) not in cache:
                g = generate(gen, args, "seq_len", k * step)
                cache[(n, k)] = {"fits": kv_free_peak(api.no_offload_reference(g, hw)) <= budget}

    _bisect(["kv"], state, cache, run_round, 1, hi // step)
    st = state["kv"]
    return {"seq_len": None if st["good"] is None else st["good"] * step, "at_least": st["bad"] is None}


def _paper_point(p: dict) -> dict:
    """One planner on one generated graph at one hardware; a row plus the paper's extra measures."""
    graph = generate(p["generator"], p["generator_args"], "seq_len", p["seq_len"])
    hw = Hardware.from_dict(p["hardware"])
    if p.get("bandwidth_GBps"):
        hw = with_bandwidth(hw, ("d2h", "h2d"), p["bandwidth_GBps"] * 1e9)
    if p.get("hbm_bytes"):
        hw = with_hbm(hw, p["hbm_bytes"])
    ref = api.no_offload_reference(graph, hw)
    run = run_planner(graph, hw, p["planner"], ref, lower_bounds(graph, hw), p.get("options"))
    keep = ("planner", "status", "valid", "violations", "hbm_budget_bytes", "peak_hbm_bytes", "makespan_us",
            "overhead", "bytes_moved", "stall_us", "defrag_events", "gap_vs_bound", "solve_time_s", "notes")
    row = {k: run.row.get(k) for k in keep}
    row["no_offload_makespan_us"] = ref.metrics.makespan_ns / 1000
    row["no_offload_peak_hbm_bytes"] = ref.metrics.peak_bytes[HBM]
    row["seq_len"] = p["seq_len"]
    row["bandwidth_GBps"] = p.get("bandwidth_GBps")
    row["tag"] = p.get("tag")
    # Where the tensors no op produces start the step (bytes per kind and tier): the planners choose for weights.
    row["start_placement"] = bytes_by_kind(graph, run.plan.placement) if run.plan is not None else None
    if p.get("keep_plan"):
        row[PLAN_KEY] = run.plan if row["status"] == VALID else None
    if run.timeline is not None and run.timeline.steps and "decode_steps" in p:
        row.update(phase_latencies(run.plan, run.timeline, p["decode_steps"]))
    else:
        row.update({"prefill_us": None, "decode_us_per_step": None})
    return _split_timing(row)


def _paper_error(p: dict, reason: str) -> dict:
    """The row of a paper point that failed: ``error_point``'s, with the paper's measures empty."""
    return {**error_point(p, reason), "start_placement": None, "prefill_us": None, "decode_us_per_step": None,
            "no_offload_makespan_us": None, "no_offload_peak_hbm_bytes": None,
            "bandwidth_GBps": p.get("bandwidth_GBps")}


# -- inference ----------------------------------------------------------------------------------------------------


def run_inference(cfg: PaperConfig, hw: Hardware, progress: Callable[[str], Progress] | None = None,
                  backend: BackendSpec | None = None) -> dict:
    """The inference half: calibrated budget, comparison at it, lowest peak, longest sequence."""
    spec = backend if backend is not None else BackendSpec("local", cfg.jobs)
    names = cfg.planner_names()
    options = cfg.planner_options()
    gen, args = "long_context_inference", cfg.inference_args()
    graph: Graph = generate(gen, args, "seq_len", cfg.base_seq)
    ref = api.no_offload_reference(graph, hw)
    budget = ref.metrics.peak_bytes[HBM]
    kv = sum(t.bytes for t in graph.tensors.values() if t.kind.value == "kv_cache")
    kv_free = kv_free_peak(ref)
    hw_b = with_hbm(hw, budget)

    def pts(tag: str, pairs: list[tuple[str, int]]) -> list[dict]:
        return [{"generator": gen, "generator_args": args, "seq_len": cfg.base_seq, "hardware": hw.to_dict(),
                 "hbm_bytes": b, "planner": n, "options": options.get(n), "decode_steps": cfg.decode_steps,
                 "tag": tag} for n, b in pairs]

    bar = progress or (lambda desc: None)
    with spec.open() as runner:
        at_budget = runner.map(_paper_point, pts("at_budget", [(n, budget) for n in names]),
                               bar("inference: at the budget"), _paper_error)
    lowest = min_budget_search(graph, hw_b, names, options, cfg.max_overhead, resolution=0.005, jobs=cfg.jobs,
                               progress=bar("inference: lowest peak"), backend=spec)
    found = [(n, v["hbm_budget_bytes"]) for n, v in lowest["lowest"].items() if v["hbm_budget_bytes"]]
    with spec.open() as runner:
        at_lowest = runner.map(_paper_point, pts("at_lowest", found), bar("inference: at lowest peak"), _paper_error)
    longest = seqlen_sweep(gen, args, hw_b, cfg.seq_step, cfg.seq_hi, cfg.seq_step, "seq_len", names, options,
                           cfg.max_overhead, cfg.jobs, bar("inference: longest seq"), backend=spec)
    kv_longest = kv_offload_longest(gen, args, hw, budget, cfg.seq_step, cfg.seq_hi)
    rows = {}
    by_lowest = {r["planner"]: r for r in at_lowest}
    for r in at_budget:
        n = r["planner"]
        low = by_lowest.get(n)
        peak = low["peak_hbm_bytes"] if low else None
        red = None if peak is None else budget - peak
        rows[n] = {
            "at_budget": r,
            "at_lowest": low,
            "lowest_budget_bytes": lowest["lowest"][n]["hbm_budget_bytes"],
            "lowest_peak_bytes": peak,
            "reduction_bytes": red,
            "reduction_share": None if red is None else red / budget,
            "reduction_over_kv": None if red is None or not kv else red / kv,
            "beyond_whole_kv_bytes": None if peak is None else kv_free - peak,
            "longest_seq": longest["longest"][n],
        }
    return {"graph": graph.name, "generator": gen, "generator_args": args, "base_seq": cfg.base_seq,
            "budget_bytes": budget, "kv_cache_bytes": kv, "kv_free_peak_bytes": kv_free,
            "kv_offload_longest": kv_longest,
            "no_offload_makespan_us": ref.metrics.makespan_ns / 1000,
            "no_offload_phases": phase_latencies(plan_none(graph, with_hbm(hw, 2**62)), ref, cfg.decode_steps),
            "bytes_by_kind": graph.metadata.get("bytes_by_kind"), "planners": names, "rows": rows,
            "lowest_search": lowest, "longest_search": longest}


# -- training -----------------------------------------------------------------------------------------------------


def run_training(cfg: PaperConfig, hw: Hardware, progress: Callable[[str], Progress] | None = None,
                 backend: BackendSpec | None = None) -> dict:
    """The bandwidth sweep: baseline none (recompute on) against each planner (recompute off) in its budget, and
    the planners that can recompute planning offload and recompute jointly (tag ``joint``)."""
    spec = backend if backend is not None else BackendSpec("local", cfg.jobs)
    gen = "llama3_8b_training"
    names = [n for n in cfg.planner_names() if n != "none"]
    joint = [n for n in names if "recompute" in api.option_types(n)]
    options = cfg.planner_options()
    on, off = cfg.training_args(True), cfg.training_args(False)
    g_on = generate(gen, on, "seq_len", cfg.train_seq)
    budget = api.no_offload_reference(g_on, hw).metrics.peak_bytes[HBM]
    g_off = generate(gen, off, "seq_len", cfg.train_seq)
    off_peak = api.no_offload_reference(g_off, hw).metrics.peak_bytes[HBM]
    points = []
    for bw in cfg.bandwidths:
        points.append({"generator": gen, "generator_args": on, "seq_len": cfg.train_seq, "hardware": hw.to_dict(),
                       "hbm_bytes": budget, "planner": "none", "bandwidth_GBps": bw, "tag": "baseline"})
        for n in names:
            own = options.get(n)
            if n in joint:
                own = {**(own or {}), "recompute": False}
            points.append({"generator": gen, "generator_args": off, "seq_len": cfg.train_seq,
                           "hardware": hw.to_dict(), "hbm_bytes": budget, "planner": n, "options": own,
                           "bandwidth_GBps": bw, "tag": "recompute_off", "keep_plan": True})
        for n in joint:
            points.append({"generator": gen, "generator_args": off, "seq_len": cfg.train_seq,
                           "hardware": hw.to_dict(), "hbm_bytes": budget, "planner": n,
                           "options": {**(options.get(n) or {}), "recompute": True},
                           "bandwidth_GBps": bw, "tag": "joint", "keep_plan": True})
    bar = progress or (lambda desc: None)
    with spec.open() as runner:
        rows = runner.map(_paper_point, points, bar("training: bandwidths"), _paper_error)
    # A plan made for a slower link seeds the faster points (re-simulated there), so each curve is monotone
    # wherever the executor accepts it.
    for tag in ("recompute_off", "joint"):
        seed_looser(g_off, [r for r in rows if r["tag"] == tag], lambda r: r["bandwidth_GBps"],
                    lambda r: with_bandwidth(with_hbm(hw, budget), ("d2h", "h2d"), r["bandwidth_GBps"] * 1e9))
    take_recompute_off(rows)
    base = {r["bandwidth_GBps"]: r for r in rows if r["tag"] == "baseline"}
    for r in rows:
        b = base[r["bandwidth_GBps"]]
        ok = r["status"] == VALID and b["status"] == VALID
        r["gain_over_baseline"] = round(b["makespan_us"] / r["makespan_us"] - 1, 6) if ok else None
    return {"generator": gen, "baseline_args": on, "planner_args": off, "budget_bytes": budget,
            "recompute_off_peak_bytes": off_peak, "bandwidths_GBps": list(cfg.bandwidths), "planners": names,
            "joint_planners": joint, "points": rows}


def take_recompute_off(rows: list[dict]) -> list[dict]:
    """Each ``joint`` row takes its planner's ``recompute_off`` row of the same bandwidth when that is valid and
    faster: a plan without re-runs is a joint plan too (same graph, budget and link), so the joint answer is never
    slower than recompute off. The row then says so (``from_recompute_off``, a note). Returns the rows, updated in
    place; run it after ``seed_looser``, so each side already holds its best plan of this or a slower link."""
    off = {(r["planner"], r["bandwidth_GBps"]): r for r in rows if r["tag"] == "recompute_off"}
    for r in rows:
        if r["tag"] != "joint":
            continue
        r.setdefault("from_recompute_off", False)
        o = off.get((r["planner"], r["bandwidth_GBps"]))
        if o is None or o["status"] != VALID or r["status"] == ERROR:
            continue
        if r["status"] == VALID and r["makespan_us"] <= o["makespan_us"]:
            continue
        keep = {"planner", "tag", "options", "notes"}
        r.update({k: v for k, v in o.items() if k not in keep})
        r["from_recompute_off"] = True
        r["notes"] = [f"{r['planner']}'s recompute-off plan (no re-runs: a joint plan too) is faster here"] + \
            list(o.get("notes") or [])[:2]
    return rows


def run_paper(cfg: PaperConfig, progress: Callable[[str], Progress] | None = None,
              backend: BackendSpec | None = None) -> dict:
    """The whole evaluation, its points on ``backend`` (default: ``cfg.jobs`` local processes)."""
    hw = preset(cfg.hardware)
    return {"config": asdict(cfg), "hardware": hw.to_dict(), "paper": PAPER,
            "inference": run_inference(cfg, hw, progress, backend),
            "training": run_training(cfg, hw, progress, backend)}


# -- presentation --------------------------------------------------------------------------------------------------


def _gb(v) -> str:
    return "–" if v is None else f"{v / 1e9:.2f} GB"


def _k(v) -> str:
    return "–" if v is None else f"{v / 1024:.4g}k"


def _ms(v) -> str:
    return "–" if v is None else f"{v / 1000:.1f} ms"


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:+.1f}%"


def _start(row: dict | None, kind: str) -> str:
    """Bytes of ``kind`` the plan starts on HBM and off it: "1.20 GB / 3.45 GB"."""
    tiers = ((row or {}).get("start_placement") or {}).get(kind)
    if not tiers:
        return "–"
    on = tiers.get(HBM, 0)
    return f"{_gb(on)} / {_gb(sum(tiers.values()) - on)}"


def inference_table(res: dict) -> str:
    inf = res["inference"]
    names = inf["planners"]
    rows_ = inf["rows"]
    paper = res["paper"]
    mo = res["config"]["max_overhead"]

    def cell(n, fn):
        return fn(rows_[n])

    def longest(r):
        info = r["longest_seq"]
        v = info["seq_len"]
        if v is None:
            return "none fits"
        return (f"≥ {_k(v)}" if info.get("at_least") else _k(v))

    def status_at(r, key):
        x = r[key]
        return x is not None and x["status"] == VALID

    spec = [
        ("lowest HBM peak at 71k tokens (GB)", f"{paper['peak_hbm_GB'][0]}", f"{paper['peak_hbm_GB'][1]}",
         lambda r: _gb(r["lowest_peak_bytes"])),
        ("reduction against none", "", "-26%", lambda r: _pct(None if r["reduction_share"] is None
                                                             else -r["reduction_share"])),
        ("reduction / KV-cache size", "", "≈ 1 (critique)", lambda r: "–" if r["reduction_over_kv"] is None
         else f"{r['reduction_over_kv']:.2f}"),
        ("gain beyond whole-KV offload (GB)", "", "", lambda r: _gb(r["beyond_whole_kv_bytes"])),
        (f"longest sequence within the budget (≤ {mo:.0%} slower)", "71k", "123k", longest),
        ("defrag events at the budget", "57", "0", lambda r: str(r["at_budget"]["defrag_events"])
         if r["at_budget"]["defrag_events"] is not None else "–"),
        ("prefill latency at the budget", "129.33 s", "99.41 s", lambda r: _ms(r["at_budget"]["prefill_us"])),
        ("decode latency per step at the budget", "0.117 s", "0.146 s",
         lambda r: _ms(r["at_budget"]["decode_us_per_step"])),
        ("makespan at the budget", "", "", lambda r: _ms(r["at_budget"]["makespan_us"])),
        ("weights starting on HBM / remote at the budget", "", "", lambda r: _start(r["at_budget"], "weight")),
        ("weights starting on HBM / remote at the lowest peak", "", "",
         lambda r: _start(r["at_lowest"], "weight") if status_at(r, "at_lowest") else "–"),
        ("prefill latency at the lowest peak", "", "", lambda r: _ms(r["at_lowest"]["prefill_us"])
         if status_at(r, "at_lowest") else "–"),
        ("decode latency per step at the lowest peak", "", "", lambda r: _ms(r["at_lowest"]["decode_us_per_step"])
         if status_at(r, "at_lowest") else "–"),
    ]
    kv_red = inf["budget_bytes"] - inf["kv_free_peak_bytes"]
    kvl = inf["kv_offload_longest"]
    ideal = {
        "lowest HBM peak at 71k tokens (GB)": _gb(inf["kv_free_peak_bytes"]),
        "reduction against none": _pct(-kv_red / inf["budget_bytes"]),
        "reduction / KV-cache size": f"{kv_red / inf['kv_cache_bytes']:.2f}" if inf["kv_cache_bytes"] else "–",
        "gain beyond whole-KV offload (GB)": _gb(0),
        f"longest sequence within the budget (≤ {mo:.0%} slower)":
            "–" if kvl["seq_len"] is None else
            (f"≥ {_k(kvl['seq_len'])}" if kvl["at_least"] else _k(kvl["seq_len"])) + " (time not counted)",
    }
    body = [[label, base, ho, ideal.get(label, "")] + [cell(n, fn) for n in names] for label, base, ho, fn in spec]
    return markdown_table(["measure", "paper: baseline", "paper: HyperOffload", "whole KV offloaded (ideal)",
                           *names], body)


def training_table(res: dict) -> str:
    tr = res["training"]
    columns = [(n, "recompute_off") for n in tr["planners"]] + [(n, "joint") for n in tr.get("joint_planners", ())]
    label = {"recompute_off": "recompute off", "joint": "joint: offload + recompute"}
    body = []
    for bw in tr["bandwidths_GBps"]:
        pts = [p for p in tr["points"] if p["bandwidth_GBps"] == bw]
        base = next(p for p in pts if p["tag"] == "baseline")
        cells = []
        for n, tag in columns:
            p = next(q for q in pts if q["planner"] == n and q["tag"] == tag)
            # Marked: the plan shown was made for a slower link, or is the recompute-off plan (``seed_looser``,
            # ``take_recompute_off``).
            mark = "†" if p.get("seeded_from") is not None or p.get("from_recompute_off") else ""
            cells.append(f"{_ms(p['makespan_us'])} ({_pct(p['gain_over_baseline'])}){mark}" if p["status"] == VALID
                         else f"{p['status']}")
        paper = {33.6: "on par", 40.0: "+5.7%", 70.0: "+21.5%"}.get(bw, "")
        body.append([f"{bw:g} GB/s", paper, _ms(base["makespan_us"]), *cells])
    return markdown_table(["D2H/H2D", "paper: gain", "baseline (none, recompute on)",
                           *[f"{n} ({label[tag]}): makespan (gain)" for n, tag in columns]], body)


def paper_markdown(res: dict, command: str) -> str:
    cfg = res["config"]
    inf = res["inference"]
    tr = res["training"]
    kinds = ", ".join(f"{k} {_gb(v)}" for k, v in sorted((inf["bytes_by_kind"] or {}).items()))
    return "\n".join([
        "# The paper's evaluation on our model of its setup",
        "",
        f"Made by `{command}`.",
        "",
        f"## Inference: DeepSeek-V3 + NSA on {res['hardware']['name']} (D2H/H2D 33.6 GB/s)",
        "",
        f"`long_context_inference({', '.join(f'{k}={v!r}' for k, v in inf['generator_args'].items())})`: "
        f"{cfg['layers']} of 61 layers, {cfg['decode_steps']} decode steps, NSA selection blocks of "
        f"{cfg['block']} tokens. The HBM budget is calibrated to the no-offload peak at "
        f"{inf['base_seq']:,} tokens ({_gb(inf['budget_bytes'])}), so that none fits 71k tokens as the "
        f"paper's baseline did. Tensor bytes of the graph at 71k tokens (all tensors, not live at once): {kinds}; "
        f"KV cache {_gb(inf['kv_cache_bytes'])}; "
        f"the no-offload peak without any KV byte (whole-KV offload for free) is {_gb(inf['kv_free_peak_bytes'])}.",
        "",
        f"Lowest peak and longest sequence count plans at most {cfg['max_overhead']:.0%} slower than no offload "
        f"with unbounded HBM; the longest-sequence search stops at {cfg['seq_hi']:,} tokens. *Whole KV offloaded "
        "(ideal)* is the no-offload plan with every KV-cache byte removed from HBM: what offloading the entire KV "
        "cache would give if its transfers were free, the mechanism behind the paper's headline. *Gain beyond "
        "whole-KV offload* is that ideal peak minus the planner's. Latencies are our model's (a few layers), not "
        "the paper's seconds.",
        "",
        inference_table(res),
        "",
        f"## Training: LLaMA-3-8B, configuration No.1 (DP8, micro-batch 2), {cfg['train_layers']} of 32 layers",
        "",
        f"Baseline: no offload with recompute on; its peak, {_gb(tr['budget_bytes'])}, is the HBM budget. The "
        f"planners run the recompute-off graph (no-offload peak {_gb(tr['recompute_off_peak_bytes'])}) in that "
        "budget, with recompute steps off (*recompute off*) and, for those that can, deciding per activation "
        "whether to keep, offload or drop and re-run it (*joint*); gain = baseline makespan / planner makespan - 1.",
        "",
        training_table(res),
        "",
        "† the plan shown was made for a slower link (valid on a faster one, re-run there) or, in a joint column, "
        "is the planner's recompute-off plan (a plan without re-runs is a joint plan too): each is faster here than "
        "the point's own plan.",
        "",
    ])


def write_paper(out_dir, res: dict, command: str) -> list:
    """Write paper.md, paper.json and the plots into ``out_dir``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "paper.json", json.dumps(res, indent=1, sort_keys=True, default=str) + "\n")
    files = [out / "paper.md", out / "paper.json"]
    files.append(plots.seqlen_plot(res["inference"]["longest_search"], out / "paper-seqlen.png",
                                   title="DeepSeek-V3 + NSA: longest sequence within the calibrated HBM budget",
                                   refs=[(71 * 1024, "paper: baseline, 71k"),
                                         (123 * 1024, "paper: HyperOffload, 123k")]))
    files.append(plots.gain_plot(res["training"], out / "paper-bandwidth.png"))
    md = paper_markdown(res, command)
    md += "\n![longest sequence](paper-seqlen.png)\n\n![bandwidth](paper-bandwidth.png)\n"
    write_atomic(out / "paper.md", md)
    return files


__all__ = ["PAPER", "PaperConfig", "run_paper", "run_inference", "run_training", "take_recompute_off",
           "phase_latencies", "kv_free_peak", "paper_markdown", "write_paper", "inference_table", "training_table"]
