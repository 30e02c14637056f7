"""The Ray backend on a local two-CPU cluster started here: the same data as the local backend, a task whose worker
dies is run again, a point that fails twice is an error row and the rest of the grid completes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import GRAPHS, simple_hardware

from planner import api
from planner.backends import BackendSpec, Checkpoint, backend
from planner.cli import main
from planner.graph import Graph, Op, Tensor, TensorKind
from planner.report import sweeps
from planner.report.sweeps import budget_sweep, run_points, seqlen_sweep, strip_timing

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'ho-plan[ray]')")

HERE = Path(__file__).resolve().parent
TB = GRAPHS / "transformer_block.json"
PLANNERS = ["none", "reactive"]  # fast: the grid machinery is under test here


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One local cluster for the module; its workers import this module's point functions from tests/."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, log_to_driver=False, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


def graph_and_hw():
    g = api.load_graph(TB)
    return g, api.hardware("ascend-910c", hbm="1.5GB")


def points(hw, budgets, **extra) -> list[dict]:
    return [{"planner": n, "hbm_bytes": b, "hardware": hw.to_dict(), "options": None, "max_overhead": None, **extra}
            for b in budgets for n in PLANNERS]


def toy_sequence(seq_len: int, extra: int = 10) -> Graph:
    """x -> op0 -> a (seq_len bytes) -> op1 -> y: every plan needs seq_len + extra bytes of HBM."""
    tensors = [Tensor("x", extra, TensorKind.INPUT), Tensor("a", seq_len), Tensor("y", extra, TensorKind.OUTPUT)]
    ops = [Op("op0", "A", ("x",), ("a",), duration_s=1e-6), Op("op1", "B", ("a",), ("y",), duration_s=1e-6)]
    return Graph.build(f"toy{seq_len}", tensors, ops)


def crash_once(p: dict) -> dict:
    """Kill this worker process the first time the point marked ``crash`` runs (a marker file remembers it)."""
    marker = Path(p["crash"]) if p.get("crash") else None
    if marker is not None and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return sweeps._minbudget_point(p)


def crash_always(p: dict) -> dict:
    if p.get("die"):
        os.kill(os.getpid(), signal.SIGKILL)
    return sweeps._minbudget_point(p)


def clean(rows: list[dict]) -> str:
    return json.dumps([{k: v for k, v in r.items() if k != "timing"} for r in rows], sort_keys=True)


def checked(rows: list[dict]) -> list[dict]:
    """Every valid plan stayed within its budget (each was validated by the executor in its task)."""
    for r in rows:
        if r["status"] == "valid":
            assert r["valid"] and r["peak_hbm_bytes"] <= r["hbm_budget_bytes"], r
    return rows


def test_ray_and_local_give_the_same_sweeps():
    g, hw = graph_and_hw()
    local = budget_sweep(g, hw, (0.7, 1.0), [*PLANNERS, "greedy"])
    on_ray = budget_sweep(g, hw, (0.7, 1.0), [*PLANNERS, "greedy"], backend=BackendSpec("ray"))
    checked(on_ray["points"])
    assert sum(p["status"] == "valid" for p in on_ray["points"]) >= 4
    assert json.dumps(strip_timing(on_ray), sort_keys=True) == json.dumps(strip_timing(local), sort_keys=True)
    # No graph shipped: each point generates its own (this module's generator, importable on the workers).
    args = ("test_backend_ray:toy_sequence", {"extra": 50}, simple_hardware(hbm=1234), 64, 4096, 64)
    a = seqlen_sweep(*args, planners=["none"])
    b = seqlen_sweep(*args, planners=["none"], backend=BackendSpec("ray"))
    assert json.dumps(strip_timing(a), sort_keys=True) == json.dumps(strip_timing(b), sort_keys=True)
    assert b["longest"]["none"]["seq_len"] == 1152


def test_a_task_whose_worker_dies_is_run_again(tmp_path):
    g, hw = graph_and_hw()
    budgets = (int(1.2e9), int(1.5e9), int(2e9))
    want = checked(run_points(sweeps._minbudget_point, points(hw, budgets), graph=g))
    pts = points(hw, budgets)
    pts[3]["crash"] = str(tmp_path / "crashed-once")
    got = checked(run_points(crash_once, pts, graph=g, backend=BackendSpec("ray")))
    assert (tmp_path / "crashed-once").exists()  # the first try did die
    assert clean(got) == clean(want)


def test_a_point_that_fails_twice_is_an_error_row_and_the_grid_completes(tmp_path):
    g, hw = graph_and_hw()
    pts = points(hw, (int(1.5e9), int(2e9)))
    pts[1]["die"] = True
    seen = []
    spec = BackendSpec("ray", checkpoint=Checkpoint(tmp_path / "c.points.jsonl"))
    rows = checked(run_points(crash_always, pts, graph=g, backend=spec, on_error=sweeps.error_point,
                              progress=lambda d, t, label: seen.append(d)))
    assert [r["status"] for r in rows].count("error") == 1 and seen[-1] == 4
    bad = rows[1]
    assert bad["status"] == "error" and bad["planner"] == "reactive" and bad["fits"] is False
    assert "2 tries" in bad["error"] and bad["error"] in bad["notes"]
    want = run_points(sweeps._minbudget_point, [pts[i] for i in (0, 2, 3)], graph=g)
    assert clean([rows[i] for i in (0, 2, 3)]) == clean(want)
    # The error is not kept: a resumed run tries that point again, and only that one.
    assert len(spec.checkpoint) == 3
    pts[1].pop("die")
    again = BackendSpec("ray", checkpoint=Checkpoint(tmp_path / "c.points.jsonl", resume=True))
    with backend("ray", graph=g, checkpoint=again.checkpoint) as b:
        rows2 = checked(b.map(crash_always, pts))
    assert rows2[1]["status"] == "valid" and clean([rows2[i] for i in (0, 2, 3)]) == clean(want)


def test_sweep_command_on_ray(tmp_path):
    out = tmp_path / "b"
    args = ["sweep", "budget", str(TB), "--hbm", "1.5GB", "--planners", "none,reactive", "--fractions", "0.7,1",
            "-o", str(out), "-q", "--json"]
    r = CliRunner().invoke(main, [*args, "--backend", "ray"])
    assert r.exit_code == 0, r.output
    local = CliRunner().invoke(main, args)
    assert strip_timing(json.loads(r.output)) == strip_timing(json.loads(local.output))
    checked(json.loads(r.output)["points"])
