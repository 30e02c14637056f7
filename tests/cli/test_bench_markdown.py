"""``ho-plan bench --markdown``: the measured table the docs show is written by the command that measures it."""

from __future__ import annotations

import json

from click.testing import CliRunner

from planner.cli import main


def test_bench_writes_its_table_and_command_as_a_markdown_page(tmp_path):
    md, rows_json = tmp_path / "bench.md", tmp_path / "bench.json"
    args = ["bench", "--suite", "small", "--planners", "reactive,greedy", "--budgets", "0.8,0.95", "--only", "fwd-bwd",
            "--markdown", str(md), "-o", str(rows_json)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    rows = json.loads(rows_json.read_text())["rows"]
    assert text.startswith("# ho-plan bench\n")
    assert "`ho-plan bench --suite small --only fwd-bwd --budgets 0.8,0.95 --planners reactive,greedy " in text
    assert f"--markdown {md}`" in text
    table = [line for line in text.splitlines() if line.startswith("| ")][2:]
    assert len(rows) == 4 and len(table) == len(rows)
    for line, r in zip(table, rows):
        assert r["valid"]  # the bench validated each plan in the executor
        assert r["plan_options"].get("order") or r["planner_run"] == "reactive"  # what the planner chose
        assert f"| {r['makespan_us'] / 1000:.2f} ms |" in line and f"| {r['budget_fraction']:.0%} |" in line
