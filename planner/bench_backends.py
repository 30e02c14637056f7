"""``ho-plan bench --suite backend``: what the Ray backend costs against the local pool, and what it survives.

- *overhead*: the ``bench`` cases (``--quick``: transformer_block, DeepSeek-V3+NSA 64k one layer, generated 1k)
  run once on the local backend (``jobs`` processes) and once on Ray (this machine's cluster unless ``address``
  says otherwise), wall time of each from the first point submitted to the last row, cluster start included;
- *fault*: a budget sweep of ``FAULT_FRACTIONS`` x ``FAULT_PLANNERS`` (33 points on transformer_block, every
  one repeatable; a greedy point takes 2 to 3 s, so a worker is busy when the kill comes) on Ray, clean, then
  again while a watcher SIGKILLs one Ray worker process in the middle of a task, once
  ``FAULT_AFTER`` of the points are done. Every point of the second run must be present and equal the clean
  run's (timing aside): the task of the killed worker was run again (``planner.backends.ray.MAX_RETRIES``).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from planner import api
from planner.backends import BackendSpec
from planner.bench import run_cases, suite
from planner.report.sweeps import budget_sweep, strip_timing

ROOT = Path(__file__).resolve().parents[1]
FAULT_GRAPH = ROOT / "graphs" / "transformer_block.json"
FAULT_FRACTIONS = tuple(round(0.5 + 0.05 * k, 2) for k in range(11))
# Planners whose plans do not depend on time: cpsat with a short wall-clock limit is not repeatable (its model
# building eats into the limit by a load-dependent amount), so a difference would not be the fault's.
FAULT_PLANNERS = ("none", "reactive", "greedy")
FAULT_AFTER = 1 / 3
# The process title Ray gives a worker while it runs one of our tasks (planner/backends/ray.py ``_run``).
TASK_TITLE = "ray::_run"
# Keys that measure the machine rather than the plan (bench rows): left out when rows are compared.
TIMING = ("solve_time_s", "planner_run", "plan_options")


def busy_ray_workers() -> list[int]:
    """PIDs of this machine's Ray worker processes that are running a task of ours."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith(TASK_TITLE):
            out.append(int(pid))
    return sorted(out)


def _same(a: list[dict], b: list[dict]) -> int:
    """How many rows of ``a`` equal ``b``'s, timing aside."""
    def clean(r: dict) -> str:
        return json.dumps({k: v for k, v in r.items() if k not in TIMING}, sort_keys=True, default=str)
    return sum(1 for x, y in zip(a, b) if clean(x) == clean(y))


def overhead(quick: bool = True, only: Iterable[str] = (), fractions=None, planners=None, time_limit: float = 60.0,
             seed: int = 0, workers: int = 2, jobs: int = 2, address: str | None = None,
             progress: Callable[[str], None] | None = None) -> dict:
    """The bench cases on the local pool and on Ray: wall times, Ray's overhead, rows equal between the two."""
    cases = suite(("paper", "generated"), quick=quick, only=only)
    out: dict = {"cases": [c.name for c in cases], "jobs": jobs, "time_limit": time_limit, "workers": workers}
    rows = {}
    for name in ("local", "ray"):
        spec = BackendSpec(name, jobs, address if name == "ray" else None)
        t = time.monotonic()
        rows[name] = run_cases(cases, fractions, planners, time_limit, seed, workers, backend=spec,
                               progress=lambda d, name=name: progress and progress(
                                   f"{name}: {d['done']}/{d['total']} {d['case']} {d['planner']}"))
        out[f"{name}_s"] = round(time.monotonic() - t, 2)
        if progress:
            progress(f"{name}: {out[f'{name}_s']:.1f} s")
    out["points"] = len(rows["local"])
    out["overhead"] = out["ray_s"] / out["local_s"] - 1
    out["rows_equal"] = _same(rows["local"], rows["ray"])
    out["errors"] = sum(1 for r in rows["ray"] if r.get("status") == "error")
    return out


def fault(address: str | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """A budget sweep on Ray, clean and with one worker killed mid-task; whether every point came back equal."""
    graph = api.load_graph(FAULT_GRAPH)
    hw = api.hardware("ascend-910c")
    spec = BackendSpec("ray", 1, address)

    def sweep(on_point=None) -> tuple[dict, float]:
        t = time.monotonic()
        sw = budget_sweep(graph, hw, FAULT_FRACTIONS, FAULT_PLANNERS, backend=spec, progress=on_point)
        return sw, time.monotonic() - t

    clean, clean_s = sweep()
    if progress:
        progress(f"clean: {len(clean['points'])} points in {clean_s:.1f} s")
    total = len(clean["points"])
    killed: list[dict] = []
    armed = threading.Event()

    def on_point(done: int, total_: int, label: str) -> None:
        if done >= total * FAULT_AFTER:
            armed.set()

    def killer() -> None:
        armed.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            busy = busy_ray_workers()
            if busy:
                os.kill(busy[0], signal.SIGKILL)
                killed.append({"pid": busy[0], "after_s": round(time.monotonic() - t0, 2)})
                return
            time.sleep(0.02)

    t0 = time.monotonic()
    watcher = threading.Thread(target=killer, daemon=True)
    watcher.start()
    faulty, faulty_s = sweep(on_point)
    armed.set()
    watcher.join(timeout=61)
    a, b = strip_timing(clean)["points"], strip_timing(faulty)["points"]
    same = sum(1 for x, y in zip(a, b) if json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True))
    out = {"graph": graph.name, "points": total, "present": len(b), "identical": same,
           "errors": sum(1 for p in b if p["status"] == "error"), "killed": killed, "clean_s": round(clean_s, 2),
           "faulty_s": round(faulty_s, 2), "planners": list(FAULT_PLANNERS), "fractions": list(FAULT_FRACTIONS)}
    if progress:
        progress(f"with a worker killed: {same} of {total} points identical, killed {killed}")
    return out


__all__ = ["FAULT_FRACTIONS", "FAULT_PLANNERS", "busy_ray_workers", "fault", "overhead"]
