"""``planner.bench``: which planner a bench row named ``greedy`` runs."""

from __future__ import annotations

from conftest import GRAPHS

from planner import api, bench


def test_a_greedy_row_runs_the_sweep_up_to_a_fixed_size_whatever_the_clock(monkeypatch):
    """By op count, not by timing a greedy run: the wall-clock estimate flipped deepseek-v3-paper at 70% between
    greedy and its sweep from one run to the next, and with it the row cpsat is compared with."""
    g = api.load_graph(GRAPHS / "transformer_block.json")
    assert bench.greedy_label(g) == "greedy-sweep"
    monkeypatch.setattr(bench, "SWEEP_MAX_OPS", len(g.ops))
    assert bench.greedy_label(g) == "greedy-sweep"
    monkeypatch.setattr(bench, "SWEEP_MAX_OPS", len(g.ops) - 1)
    assert bench.greedy_label(g) == "greedy"
