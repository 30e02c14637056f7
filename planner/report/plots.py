"""PNG plots with matplotlib's Agg canvas (headless; no pyplot, no global state).

- ``occupancy_plot``: HBM bytes over time stacked by tensor kind, one panel per planner on a shared time axis,
  with the budget and each plan's peak;
- ``tradeoff_plot``: the budget sweep: peak HBM against makespan, one line per planner;
- ``bandwidth_plot``: the bandwidth sweep: overhead over no offload against link bandwidth;
- ``seqlen_plot``: the longest sequence that fits, per planner.

Every function writes one PNG and returns its path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from planner.hardware import HBM
from planner.planners import REGISTRY
from planner.timeline import Residency
from planner.units import format_bytes

# Stable colours per tensor kind and per planner, so every plot reads the same way.
KIND_ORDER = ("weight", "optimizer_state", "gradient", "kv_cache", "activation", "input", "output", "workspace")
KIND_COLORS = {
    "weight": "#4c72b0", "optimizer_state": "#8172b3", "gradient": "#dd8452", "kv_cache": "#c44e52",
    "activation": "#55a868", "input": "#937860", "output": "#da8bc3", "workspace": "#8c8c8c",
}
KIND_LABELS = {"optimizer_state": "optimizer state", "kv_cache": "KV cache"}
DPI = 110


def _planner_style(name: str, i: int) -> dict:
    """The planner's colour and marker in every plot (``PlannerSpec``); a name not registered (a row's label)
    gets one of a few others by position."""
    spec = REGISTRY.get(name)
    if spec is not None:
        return {"color": spec.color, "marker": spec.marker}
    fallback = ("#9467bd", "#8c564b", "#e377c2", "#17becf")
    return {"color": fallback[i % len(fallback)], "marker": "o"}


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """(scale, unit) so that max_bytes / scale reads well: GB, MB or KB (decimal)."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if max_bytes >= scale:
            return scale, unit
    return 1.0, "B"


def time_unit(max_us: float) -> tuple[float, str]:
    """(scale in us, unit) for a time axis whose largest value is ``max_us`` microseconds."""
    if max_us >= 1e6:
        return 1e6, "s"
    if max_us >= 1e3:
        return 1e3, "ms"
    return 1.0, "µs"


def _save(fig: Figure, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(p, dpi=DPI)
    return p


def stacked_occupancy(residencies: Sequence[Residency], tier: str = HBM) -> tuple[list[int], dict[str, list[int]]]:
    """Change times (ns) and, per kind, the bytes of that kind on ``tier`` from each time on."""
    deltas: dict[int, dict[str, int]] = {}
    kinds: set[str] = set()
    for r in residencies:
        if r.tier != tier or r.end_ns <= r.start_ns:
            continue
        kinds.add(r.kind)
        deltas.setdefault(r.start_ns, {}).setdefault(r.kind, 0)
        deltas[r.start_ns][r.kind] += r.bytes
        deltas.setdefault(r.end_ns, {}).setdefault(r.kind, 0)
        deltas[r.end_ns][r.kind] -= r.bytes
    order = [k for k in KIND_ORDER if k in kinds] + sorted(kinds - set(KIND_ORDER))
    times = sorted(deltas)
    cur = dict.fromkeys(order, 0)
    series: dict[str, list[int]] = {k: [] for k in order}
    for t in times:
        for k, d in deltas[t].items():
            cur[k] += d
        for k in order:
            series[k].append(cur[k])
    return times, series


def occupancy_plot(panels: Sequence[tuple[str, Sequence[Residency], int | None]], budget_bytes: int | None,
                   path: str | Path, title: str = "") -> Path:
    """One panel per (label, residencies, peak_bytes) on a shared time axis: HBM bytes stacked by tensor kind.

    A panel with no residencies (no plan) says so. The budget is a dashed line on every panel.
    """
    n = max(1, len(panels))
    fig = Figure(figsize=(11, 1.2 + 2.1 * n), layout="constrained")
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    all_series = [stacked_occupancy(res) for _, res, _ in panels]
    max_t = max((t[-1] for t, _ in all_series if t), default=1)
    max_b = max([budget_bytes or 0] + [p or 0 for *_, p in panels] +
                [max((sum(v) for v in zip(*s.values())), default=0) for _, s in all_series if s])
    tscale, tunit = time_unit(max_t / 1000)
    bscale, bunit = byte_unit(max_b or 1)
    kinds_seen: list[str] = []
    for ax, (label, _res, peak), (times, series) in zip(axes, panels, all_series):
        if not times:
            ax.text(0.5, 0.5, "no plan to show", transform=ax.transAxes, ha="center", va="center", color="#555")
        else:
            x = [t / 1000 / tscale for t in times]
            ys = [[v / bscale for v in series[k]] for k in series]
            colors = [KIND_COLORS.get(k, "#bcbd22") for k in series]
            ax.stackplot(x, *ys, colors=colors, step="post", linewidth=0)
            for k in series:
                if k not in kinds_seen:
                    kinds_seen.append(k)
        if budget_bytes:
            ax.axhline(budget_bytes / bscale, color="black", linestyle="--", linewidth=1)
        ax.set_ylim(0, max_b / bscale * 1.12)
        ax.set_ylabel(f"HBM ({bunit})")
        text = label if peak is None else f"{label}: peak {peak / bscale:.3g} {bunit}"
        ax.set_title(text, loc="left", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xlabel(f"time ({tunit})")
    axes[-1].set_xlim(0, max_t / 1000 / tscale)

    handles = [Patch(color=KIND_COLORS.get(k, "#bcbd22"), label=KIND_LABELS.get(k, k)) for k in kinds_seen]
    if budget_bytes:
        handles.append(Line2D([], [], color="black", linestyle="--", label="HBM budget"))
    if title:
        fig.suptitle(title, fontsize=11)
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), fontsize=9, frameon=False)
    return _save(fig, path)


def _failures(ax, sweep: dict, x_of, what: str) -> None:
    """Mark the points with no valid plan with an x in the planner's colour, stacked along the lower edge."""
    for i, name in enumerate(sweep["planners"]):
        bad = [p for p in sweep["points"] if p["planner"] == name and not p["valid"]]
        if bad:
            st = _planner_style(name, i)
            ax.plot([x_of(p) for p in bad], [0.025 + 0.035 * i] * len(bad), linestyle="none", marker="x",
                    color=st["color"], transform=ax.get_xaxis_transform(), label=f"{name}: {what}", clip_on=False)


def tradeoff_plot(sweep: dict, path: str | Path, title: str = "") -> Path:
    """Budget sweep: makespan (y) against peak HBM (x) for every valid point, one line per planner.

    Points that did not fit (invalid or infeasible) are marked with an x at their budget on the lower edge.
    """
    fig = Figure(figsize=(8, 5.2), layout="constrained")
    ax = fig.subplots()
    pts = sweep["points"]
    peaks = [p["peak_hbm_bytes"] for p in pts if p.get("peak_hbm_bytes")] + [sweep["no_offload_peak_hbm_bytes"]]
    bscale, bunit = byte_unit(max(peaks))
    spans = [p["makespan_us"] for p in pts if p.get("makespan_us")]
    tscale, tunit = time_unit(max(spans, default=1))
    for i, name in enumerate(sweep["planners"]):
        st = _planner_style(name, i)
        good = sorted((p["peak_hbm_bytes"], p["makespan_us"]) for p in pts if p["planner"] == name and p["valid"])
        if good:
            ax.plot([g[0] / bscale for g in good], [g[1] / tscale for g in good], label=name, color=st["color"],
                    marker=st["marker"], linewidth=1.5)
    ref = pts[0]["no_offload_makespan_us"] if pts else None
    if ref:
        ax.axhline(ref / tscale, color="#7f7f7f", linestyle=":", linewidth=1, label="no offload, unbounded HBM")
    _failures(ax, sweep, lambda p: p["hbm_budget_bytes"] / bscale, "no valid plan at this budget")
    ax.set_xlabel(f"peak HBM ({bunit}); × marks a budget with no valid plan")
    ax.set_ylabel(f"makespan ({tunit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    ax.set_title(title or f"{sweep['graph']}: peak HBM against makespan (budgets "
                 f"{min(sweep['fractions']):.0%}–{max(sweep['fractions']):.0%} of the no-offload peak)", fontsize=10)
    return _save(fig, path)


def bandwidth_plot(sweep: dict, path: str | Path, title: str = "", paper_GBps: float | None = 33.6) -> Path:
    """Bandwidth sweep, two panels on a shared log-scale bandwidth axis (GB/s): the makespan of each planner with
    no offload (unbounded HBM) as reference, and the overhead over that reference (%)."""
    fig = Figure(figsize=(8, 7.5), layout="constrained")
    ax_t, ax_o = fig.subplots(2, 1, sharex=True)
    pts = sweep["points"]
    spans = [p["makespan_us"] for p in pts if p.get("makespan_us")] + [p["no_offload_makespan_us"] for p in pts]
    tscale, tunit = time_unit(max(spans, default=1))
    ref = sorted({(p["bandwidth_GBps"], p["no_offload_makespan_us"]) for p in pts})
    ax_t.plot([r[0] for r in ref], [r[1] / tscale for r in ref], color="#7f7f7f", linestyle=":", linewidth=1.5,
              label="no offload, unbounded HBM")
    for i, name in enumerate(sweep["planners"]):
        st = _planner_style(name, i)
        good = sorted((p["bandwidth_GBps"], p["makespan_us"], p["overhead"]) for p in pts
                      if p["planner"] == name and p["valid"])
        if good:
            xs = [g[0] for g in good]
            ax_t.plot(xs, [g[1] / tscale for g in good], label=name, color=st["color"], marker=st["marker"])
            ax_o.plot(xs, [100 * g[2] for g in good], label=name, color=st["color"], marker=st["marker"])
    _failures(ax_o, sweep, lambda p: p["bandwidth_GBps"], "no valid plan")
    for ax in (ax_t, ax_o):
        if paper_GBps:
            ax.axvline(paper_GBps, color="#444", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.3)
    if paper_GBps:
        ax_t.annotate(f"paper's measured D2H: {paper_GBps:g} GB/s", xy=(paper_GBps, 0.97),
                      xycoords=("data", "axes fraction"), xytext=(4, 0), textcoords="offset points", ha="left",
                      va="top", fontsize=8, color="#444")
    ax_o.set_xscale("log")
    bws = sweep["bandwidths_GBps"]
    ax_o.set_xticks(bws)
    ax_o.set_xticklabels([f"{b:g}" for b in bws], fontsize=8)
    ax_o.minorticks_off()
    ax_o.set_xlabel(f"{' and '.join(sweep['links'])} bandwidth (GB/s, log scale)")
    ax_t.set_ylabel(f"makespan ({tunit})")
    ax_o.set_ylabel("overhead over no offload (%)")
    ax_o.axhline(0, color="black", linewidth=0.8)
    ax_t.legend(fontsize=9, loc="upper right")
    ax_o.legend(fontsize=9, loc="upper right")

    fig.suptitle(title or f"{sweep['graph']} at an HBM budget of {format_bytes(sweep['hbm_budget_bytes'])}: "
                 "makespan against link bandwidth", fontsize=10)
    return _save(fig, path)


def _ktok(v: float) -> str:
    """Tokens in k of 1,024 (128k = 131,072), as context lengths are usually given."""
    return f"{v / 1024:.4g}k"


def seqlen_plot(sweep: dict, path: str | Path, title: str = "",
                refs: Sequence[tuple[float, str]] = ()) -> Path:
    """Longest sequence that fits the budget, one bar per planner (a hatched bar: at least that long).

    ``refs``: horizontal reference lines (tokens, label), e.g. the paper's figures.
    """
    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.subplots()
    names = sweep["planners"]
    vals = [(sweep["longest"][n]["seq_len"] or 0) for n in names]
    for i, (n, v) in enumerate(zip(names, vals)):
        info = sweep["longest"][n]
        ax.bar(i, v / 1024, color=_planner_style(n, i)["color"], hatch="//" if info.get("at_least") else None,
               edgecolor="white", width=0.6)
        txt = "nothing fits" if not v else (f"≥ {_ktok(v)}" if info.get("at_least") else _ktok(v))
        ax.annotate(txt, (i, v / 1024), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=9)
    for k, (tokens, label) in enumerate(refs):
        ax.axhline(tokens / 1024, color="black", linestyle=(0, (4, 3)) if k % 2 else ":", linewidth=1, label=label)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_xlabel("planner (a hatched bar: the longest length tried fits, so at least that)")
    ax.set_ylabel("longest sequence that fits (k tokens, 1k = 1,024)")
    ax.set_ylim(0, max(vals + [t for t, _ in refs] + [1]) / 1024 * 1.18)
    ax.grid(axis="y", alpha=0.3)
    if refs:
        ax.legend(fontsize=8, loc="upper left")

    mo = sweep.get("max_overhead")
    limit = "" if mo is None else f", at most {mo:.0%} slower than no offload"
    ax.set_title(title or f"{sweep['generator']}: longest sequence within "
                 f"{format_bytes(sweep['hbm_budget_bytes'])} HBM{limit}", fontsize=10)
    return _save(fig, path)


def gain_plot(training: dict, path: str | Path, title: str = "") -> Path:
    """The paper's bandwidth-robustness curve: each planner's gain over the no-offload baseline (%) against
    D2H/H2D bandwidth (GB/s, log scale), with the paper's reported points."""
    fig = Figure(figsize=(8, 5.2), layout="constrained")
    ax = fig.subplots()
    pts = training["points"]
    curves = [(n, "recompute_off", "recompute off", "-") for n in training["planners"]]
    curves += [(n, "joint", "joint: offload + recompute", "--") for n in training.get("joint_planners", ())]
    for name, tag, label, line in curves:
        st = _planner_style(name, training["planners"].index(name))
        good = sorted((p["bandwidth_GBps"], p["gain_over_baseline"]) for p in pts
                      if p["planner"] == name and p["tag"] == tag and p.get("gain_over_baseline") is not None)
        if good:
            ax.plot([g[0] for g in good], [100 * g[1] for g in good], label=f"{name} ({label})",
                    color=st["color"], marker=st["marker"], linestyle=line)
    ax.plot([33.6, 40, 70], [0, 5.7, 21.5], linestyle="none", marker="*", markersize=12, color="black",
            label="paper: HyperOffload (on par, +5.7%, +21.5%)")
    ax.axhline(0, color="#7f7f7f", linestyle=":", linewidth=1.2, label="baseline: no offload, recompute on")
    ax.set_xscale("log")
    bws = training["bandwidths_GBps"]
    ax.set_xticks(bws)
    ax.set_xticklabels([f"{b:g}" for b in bws], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("D2H and H2D bandwidth (GB/s, log scale)")
    ax.set_ylabel("speed-up over the baseline (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="best")

    ax.set_title(title or f"LLaMA-3-8B training in the baseline's HBM ({format_bytes(training['budget_bytes'])}): "
                 "gain against link bandwidth", fontsize=10)
    return _save(fig, path)


__all__ = ["gain_plot", "occupancy_plot", "tradeoff_plot", "bandwidth_plot", "seqlen_plot", "stacked_occupancy",
           "byte_unit", "time_unit"]
