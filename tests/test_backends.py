"""Backends (planner/backends/): the local backend in process and in a pool, error rows, InputError, the checkpoint
and ``--resume``. The Ray backend's own tests are in test_backend_ray.py."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner
from conftest import chain_graph, simple_hardware

from planner.backends import BackendSpec, Checkpoint, backend, point_cpus, worker_graph
from planner.cli import main
from planner.errors import InputError
from planner.formats import save_graph
from planner.report import sweeps
from planner.report.sweeps import budget_sweep, strip_timing
from planner.report.writer import write_sweep

PLANNERS = ["none", "reactive"]
FRACTIONS = (0.9, 0.95, 1.0)


def small():
    return chain_graph(sizes=(100, 100, 100), durations_us=(5.0, 5.0, 5.0)), simple_hardware(hbm=215)


def ops_times(p: dict) -> dict:
    """A point function: the point's number times the graph's op count (a graph the backend shipped)."""
    return {"n": p["n"], "value": p["n"] * len(worker_graph().ops)}


def fails_on_odd(p: dict) -> dict:
    if p["n"] % 2:
        raise RuntimeError(f"odd {p['n']}")
    return {"n": p["n"]}


def bad_input(p: dict) -> dict:
    raise InputError("command line", "--thing", "is wrong for every point")


def counted(p: dict) -> dict:
    """A point function that records, in this process, which points it ran (jobs 1 only)."""
    counted.calls.append(p["n"])
    return {"n": p["n"], "square": p["n"] ** 2}


counted.calls = []


def valid_points_fit(sw: dict) -> None:
    """Every valid point of a sweep stayed within its budget (the executor validated each plan)."""
    for p in sw["points"]:
        if p["status"] == "valid":
            assert p["valid"] and p["peak_hbm_bytes"] <= p["hbm_budget_bytes"], p


@pytest.mark.parametrize("jobs", [1, 2])
def test_local_backend_returns_rows_in_order_with_the_graph(jobs):
    g, _ = small()
    points = [{"n": n} for n in range(5)]
    with backend("local", jobs, g) as b:
        assert b.map(ops_times, points) == [{"n": n, "value": 3 * n} for n in range(5)]
        seen = []
        got = dict(b.imap(ops_times, points, progress=lambda d, t, label: seen.append((d, t))))
    assert sorted(got) == list(range(5)) and seen[-1] == (5, 5)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_point_is_an_error_row_and_the_rest_completes(jobs):
    with backend("local", jobs) as b:
        rows = b.map(fails_on_odd, [{"n": n, "planner": "x"} for n in range(4)])
    assert [r["status"] if "status" in r else "ok" for r in rows] == ["ok", "error", "ok", "error"]
    assert rows[1]["error"] == "RuntimeError: odd 1" and rows[1]["planner"] == "x" and rows[1]["valid"] is False


@pytest.mark.parametrize("jobs", [1, 2])
def test_bad_input_in_a_point_is_raised_in_the_driver(jobs):
    with backend("local", jobs) as b, pytest.raises(InputError, match="is wrong for every point"):
        b.map(bad_input, [{"n": 0}, {"n": 1}])


def test_points_asking_for_more_cpus_run_and_keep_their_order():
    """A 2-CPU point (cpsat's workers) waits for both jobs; smaller points pass it meanwhile."""
    points = [{"n": n, "options": {"workers": 2 if n % 3 == 0 else 1}} for n in range(7)]
    with backend("local", 2) as b:
        assert [r["n"] for r in b.map(fails_on_odd, [{**p, "n": 2 * p["n"]} for p in points])] == \
            [2 * n for n in range(7)]


def test_unknown_backend_and_cpu_requests():
    with pytest.raises(InputError, match="unknown backend"):
        backend("slurm")
    assert point_cpus({"options": {"workers": 4}}) == 4
    assert point_cpus({"options": {"workers": 1}}) == point_cpus({"planner": "none"}) == 1


def test_checkpoint_resume_runs_only_the_missing_points(tmp_path):
    path = tmp_path / "c.points.jsonl"
    points = [{"n": n} for n in range(6)]
    counted.calls.clear()
    with backend("local", 1, checkpoint=Checkpoint(path)) as b:
        first = b.map(counted, points)
    assert counted.calls == list(range(6)) and len(path.read_text().splitlines()) == 6
    # An interrupted run: three points written, the fourth line cut short by the kill.
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])
    counted.calls.clear()
    with backend("local", 1, checkpoint=Checkpoint(path, resume=True)) as b:
        again = b.map(counted, points)
    assert counted.calls == [3, 4, 5] and again == first
    assert len(path.read_text().splitlines()) == 6  # the cut line is gone, the three new ones appended
    # Without --resume the checkpoint starts over.
    counted.calls.clear()
    with backend("local", 1, checkpoint=Checkpoint(path)) as b:
        b.map(counted, points[:2])
    assert counted.calls == [0, 1] and len(path.read_text().splitlines()) == 2


def test_a_resumed_sweep_equals_a_fresh_one_plans_included(tmp_path):
    """Budget sweeps carry each point's plan to seed the looser points: the checkpoint keeps it."""
    g, hw = small()
    fresh = budget_sweep(g, hw, FRACTIONS, PLANNERS)
    valid_points_fit(fresh)
    path = tmp_path / "s.points.jsonl"
    budget_sweep(g, hw, FRACTIONS, PLANNERS, backend=BackendSpec(checkpoint=Checkpoint(path)))
    lines = path.read_text().splitlines()
    assert len(lines) == len(fresh["points"])
    path.write_text("\n".join(lines[:4]) + "\n")
    resumed = budget_sweep(g, hw, FRACTIONS, PLANNERS, jobs=2,
                           backend=BackendSpec("local", 2, checkpoint=Checkpoint(path, resume=True)))
    assert json.dumps(strip_timing(resumed), sort_keys=True) == json.dumps(strip_timing(fresh), sort_keys=True)


def test_the_checkpoint_key_names_the_graph_too(tmp_path):
    """A resumed run on another graph must not reuse the old graph's points."""
    g, hw = small()
    path = tmp_path / "s.points.jsonl"
    budget_sweep(g, hw, (1.0,), ["none"], backend=BackendSpec(checkpoint=Checkpoint(path)))
    other = chain_graph(sizes=(100, 120, 100), durations_us=(5.0, 5.0, 5.0))
    spec = BackendSpec(checkpoint=Checkpoint(path, resume=True))
    sw = budget_sweep(other, simple_hardware(hbm=1000), (1.0,), ["none"], backend=spec)
    assert sw["points"][0]["peak_hbm_bytes"] == budget_sweep(other, simple_hardware(hbm=1000), (1.0,),
                                                             ["none"])["points"][0]["peak_hbm_bytes"]
    assert len(spec.checkpoint) == 2


def test_an_error_point_in_a_sweep_stays_an_error_and_is_written(tmp_path, monkeypatch):
    g, hw = small()
    real = sweeps._point_row

    def broken(graph, hw_, planner, options, keep_plan=False):
        if planner == "reactive" and hw_.hbm_bytes < 210:
            raise MemoryError("the worker ran out of memory")
        return real(graph, hw_, planner, options, keep_plan)

    monkeypatch.setattr(sweeps, "_point_row", broken)
    sw = budget_sweep(g, hw, FRACTIONS, PLANNERS)
    valid_points_fit(sw)
    bad = [p for p in sw["points"] if p["status"] == "error"]
    assert [(p["planner"], p["fraction"]) for p in bad] == [("reactive", 0.9)]
    assert bad[0]["error"] == "MemoryError: the worker ran out of memory" and bad[0]["seeded_from"] is None
    assert sum(p["status"] == "valid" for p in sw["points"]) >= 3
    files = write_sweep(tmp_path, sw)
    assert "error" in (tmp_path / "sweep-budget.csv").read_text() and files


def test_sweep_command_resume_and_backend_options(tmp_path, monkeypatch):
    g, _ = small()
    path = tmp_path / "chain.json"
    save_graph(g, path)
    out = tmp_path / "b"
    args = ["sweep", "budget", str(path), "--hardware", "h100-pcie", "--hbm", "230", "--planners", "none,reactive",
            "--fractions", "0.9,1", "-o", str(out), "-q", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    first = json.loads(r.output)
    assert len((out / "sweep-budget.points.jsonl").read_text().splitlines()) == 4
    r = CliRunner().invoke(main, [*args, "--resume", "--jobs", "2"])
    assert r.exit_code == 0, r.output
    assert strip_timing(json.loads(r.output)) == strip_timing(first)
    # Points from the checkpoint keep their first run's timing: nothing ran again.
    assert [p["timing"] for p in json.loads(r.output)["points"]] == [p["timing"] for p in first["points"]]

    r = CliRunner().invoke(main, [*args, "--ray-address", "auto"])
    assert r.exit_code == 2 and r.stderr.strip() == "error: command line: --ray-address: is for --backend ray"
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the ray extra were not installed
    r = CliRunner().invoke(main, [*args, "--backend", "ray"])
    assert r.exit_code == 2 and "pip install 'ho-plan[ray]'" in r.stderr and "Traceback" not in r.output
