"""Shared fixtures: small graphs built in code and the paths of the repository's folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.graph import Graph, Op, Tensor, TensorKind
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


@pytest.fixture
def hw() -> Hardware:
    return simple_hardware()
