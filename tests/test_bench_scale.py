"""The scale benchmark's code path on a one-layer graph (its timings are printed, never asserted)."""

from __future__ import annotations

from planner import bench


def test_run_scale_times_greedy_and_the_executor_on_a_small_graph(tmp_path):
    rows = bench.run_scale(tmp_path, hbm="20GB", layers=1, graphs=bench.SCALE_GRAPHS[:1])
    (row,) = rows
    assert row["graph"] == "deepseek-v3-nsa-64k"
    assert row["command_exit"] == 0 and row["status"] == "feasible"
    assert row["steps"] >= row["ops"] > 0
    for model in ("none", "caching"):
        assert row[f"executor_{model}_steps_per_s"] > 0
