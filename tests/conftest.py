"""Shared fixtures: small graphs built in code and the paths of the repository's folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner import api, bench
from planner.formats.checkmate import graph_from_node_link
from planner.graph import AUTO, Graph, Op, Tensor, TensorKind
from planner.hardware import HBM, Hardware, Link, Tier

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = ROOT / "graphs"
SOLUTIONS = ROOT / "solutions"
SHARED = ROOT.parent / "shared"


def simple_hardware(hbm: int = 1000, bw: float = 1e9, latency: float = 0.0, channels: int = 1) -> Hardware:
    """HBM of ``hbm`` bytes, a host tier, 1 GB/s links (1 byte per ns), 1 flop per ns, no launch overhead."""
    return Hardware(
        name="test",
        tiers=(Tier(HBM, hbm), Tier("host", 10**9)),
        links=(Link("d2h", HBM, "host", bw, latency, channels), Link("h2d", "host", HBM, bw, latency, channels)),
        peak_flops=1e9,
        hbm_bandwidth_Bps=1e12,
        launch_overhead_s=0.0,
    )


def chain_graph(sizes=(100, 100, 100), durations_us=(1.0, 1.0, 1.0), weight_home: str = HBM) -> Graph:
    """x -> op0 -> a0 -> op1 -> a1 ... each op also reading its own weight w<i> (10 bytes)."""
    tensors = [Tensor("x", 50, TensorKind.INPUT)]
    ops = []
    prev = "x"
    for i, (size, dur) in enumerate(zip(sizes, durations_us)):
        kind = TensorKind.OUTPUT if i == len(sizes) - 1 else TensorKind.ACTIVATION
        tensors.append(Tensor(f"w{i}", 10, TensorKind.WEIGHT, home=weight_home))
        tensors.append(Tensor(f"a{i}", size, kind))
        ops.append(Op(f"op{i}", "MatMul", (prev, f"w{i}"), (f"a{i}",), duration_s=dur * 1e-6))
        prev = f"a{i}"
    return Graph.build("chain", tensors, ops)


def fwd_bwd(n: int = 6, size: int = 100, fdur_us: float = 1.0, bdur_us: float = 2.0) -> Graph:
    """A training chain: forward f_i: a_{i-1} -> a_i, a loss, then backward b_i: (g_{i+1}, a_{i-1}) -> g_i. Every
    activation a_i waits from its forward use to its backward use, the classic case for offload and recompute."""
    us = 1e-6
    tensors = [Tensor("a0", size, TensorKind.INPUT)]
    ops = []
    for i in range(1, n + 1):
        tensors.append(Tensor(f"a{i}", size))
        ops.append(Op(f"f{i}", "F", (f"a{i - 1}",), (f"a{i}",), duration_s=fdur_us * us))
    tensors.append(Tensor(f"g{n + 1}", size))
    ops.append(Op("loss", "L", (f"a{n}",), (f"g{n + 1}",), duration_s=fdur_us * us))
    for i in range(n, 0, -1):
        tensors.append(Tensor(f"g{i}", size, TensorKind.OUTPUT if i == 1 else TensorKind.ACTIVATION))
        ops.append(Op(f"b{i}", "B", (f"g{i + 1}", f"a{i - 1}"), (f"g{i}",), duration_s=bdur_us * us))
    return Graph.build("fwd_bwd", tensors, ops)


@pytest.fixture
def hw() -> Hardware:
    return simple_hardware()


NS = 1e-9


def two_fetches() -> Graph:
    """Two chains, each starting with an op that reads a weight held on the host (200 B: 200 ns per fetch).

    In the graph's order (p1, p2, q1, q2) the second fetch stalls p2; running q1 while w2 arrives does not:
    fetch w1 [0, 200), p1 [200, 300), q1 [300, 900) while w2 arrives [200, 400), p2, q2: 1600 ns, which is the
    optimum (no op can start before the first fetch ends, and the compute is 1400 ns).
    """
    t = [Tensor("x", 1, TensorKind.INPUT), Tensor("w1", 200, TensorKind.WEIGHT, home="host"),
         Tensor("w2", 200, TensorKind.WEIGHT, home="host")]
    ops = []
    for i in (1, 2):
        t += [Tensor(f"a{i}", 10), Tensor(f"y{i}", 1, TensorKind.OUTPUT)]
        ops.append(Op(f"p{i}", "F", ("x", f"w{i}"), (f"a{i}",), duration_s=100 * NS))
    for i in (1, 2):
        ops.append(Op(f"q{i}", "F", (f"a{i}",), (f"y{i}",), duration_s=600 * NS))
    return Graph.build("two_fetches", t, ops)


def three_bigs() -> Graph:
    """Three producers of 100 B tensors, then their consumers: the graph's order holds all three at once
    (300 B), producing and consuming each in turn holds one (about 100 B). With a 150 B budget and a slow link,
    reordering alone fits, with no transfer: the optimum is the compute time, 3.5 us."""
    t = [Tensor("x", 1, TensorKind.INPUT)]
    ops = []
    for i in range(3):
        t += [Tensor(f"big{i}", 100), Tensor(f"small{i}", 1)]
        ops.append(Op(f"make{i}", "F", ("x",), (f"big{i}",), duration_s=500 * NS))
    for i in range(3):
        ops.append(Op(f"use{i}", "F", (f"big{i}",), (f"small{i}",), duration_s=500 * NS))
    t.append(Tensor("y", 1, TensorKind.OUTPUT))
    ops.append(Op("join", "F", tuple(f"small{i}" for i in range(3)), ("y",), duration_s=500 * NS))
    return Graph.build("three_bigs", t, ops)


def small_case(name: str, fraction: float) -> tuple[Graph, Hardware]:
    """A graph of the bench's small suite on ``ascend-910c`` with its slow links, at ``fraction`` of its peak."""
    g = next(x for x in bench.small_graphs() if x.name == name)
    peak = api.no_offload_reference(g, api.hardware("ascend-910c", **bench.SMALL_LINKS)).metrics.peak_bytes[HBM]
    return g, api.hardware("ascend-910c", **{**bench.SMALL_LINKS, "hbm": str(int(peak * fraction))})


def checkmate_source_graph() -> Graph:
    """A Checkmate document whose source ``src`` (1 us, 1000 B, reading the input batch the format leaves out) is
    read again by the backward pass: at 1150 B (peak 1210 B) the cheapest answer re-runs ``src`` (+1 us); without
    that, re-running ``f1`` costs 50 us."""
    costs = [("src", 1, 1000, False), ("f1", 50, 100, False), ("f2", 50, 100, False), ("b2", 50, 10, True),
             ("b1", 50, 10, True), ("b0", 50, 10, True)]
    nodes = [{"id": k, "name": n, "cost_cpu": c, "cost_ram": r, "backward": b} for k, (n, c, r, b) in enumerate(costs)]
    links = [(0, 1), (1, 2), (2, 3), (1, 3), (3, 4), (1, 4), (0, 4), (4, 5), (0, 5)]
    doc = {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes,
           "links": [{"source": a, "target": b} for a, b in links]}
    return graph_from_node_link(doc, "source.json", time_unit_s=1e-6)


def weight_read_twice(home: str = AUTO, updated: bool = False, op1_workspace: int = 0) -> Graph:
    """A 100 B weight read by op0 and op2 (and updated in place by op2 if ``updated``), op1 between them (1 us
    each, op1 with ``op1_workspace`` bytes of workspace)."""
    us = 1e-6
    tensors = [Tensor("x", 10, TensorKind.INPUT), Tensor("w", 100, TensorKind.WEIGHT, home=home),
               Tensor("a", 10), Tensor("b", 10), Tensor("y", 10, TensorKind.OUTPUT)]
    ops = [Op("op0", "F", ("x", "w"), ("a",), duration_s=us),
           Op("op1", "F", ("a",), ("b",), duration_s=us, workspace_bytes=op1_workspace),
           Op("op2", "F", ("b", "w"), ("y",), ("w",) if updated else (), duration_s=us)]
    return Graph.build("weight_read_twice", tensors, ops)
