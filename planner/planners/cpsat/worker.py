"""Run CP-SAT under a wall-clock limit that holds, and keep the best solution found so far.

``max_time_in_seconds`` is not a hard wall (presolve overruns it; see ../shared/notes/cpsat.md), so each solve
runs in a forked child process: the child solves the model it inherited and sends back every improving
solution (throttled) and its final response; the parent waits until the deadline plus a short grace and then
kills the child, keeping the best solution it received. A crash of the solver (the child dies) is reported as
status ``CRASHED``. Where fork is not available, the solve runs in-process with a watchdog thread that calls
``stop_search``.

Ctrl-C: the child ignores SIGINT (a terminal sends it to the whole process group), so only the parent reacts: a
KeyboardInterrupt while it waits kills the child and returns the best solution received so far, with
``interrupted`` set, for the caller to finish its plan with. CP-SAT's search log, when asked for, is streamed line
by line to the caller's ``on_log`` (never to stdout: ``--json`` output stays clean).

The solution callback reads the response proto only (reading variables one by one in a callback is slow).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner.background import forked_child

# How much later than the requested limit the parent kills the child.
GRACE_S = 0.3
# Minimum seconds between two solutions the child sends (the final one is always sent).
SEND_EVERY_S = 0.25


@dataclass
class SolveResult:
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, MODEL_INVALID, UNKNOWN, TIMEOUT (killed), CRASHED
    objective: float | None = None
    bound: float | None = None
    values: list[int] | None = None
    wall_s: float = 0.0
    deterministic_time: float = 0.0
    solutions: int = 0
    log: str = ""
    killed: bool = False
    interrupted: bool = False  # Ctrl-C (KeyboardInterrupt) stopped the solve; the best solution so far is kept
    notes: list[str] = field(default_factory=list)
    history: list[tuple[float, list[int]]] = field(default_factory=list)  # every solution received, in order

    @property
    def has_solution(self) -> bool:
        return self.values is not None


def _params(solver: cp_model.CpSolver, params: dict) -> None:
    for k, v in params.items():
        setattr(solver.parameters, k, v)


class _Callback(cp_model.CpSolverSolutionCallback):
    def __init__(self, send: Callable) -> None:
        super().__init__()
        self.send = send
        self.last = 0.0
        self.pending = None
        self.count = 0

    def on_solution_callback(self) -> None:
        self.count += 1
        r = self.response_proto
        msg = ("sol", self.wall_time, self.objective_value, self.best_objective_bound, list(r.solution))
        now = time.monotonic()
        if now - self.last >= SEND_EVERY_S or self.count == 1:
            self.send(msg)
            self.last = now
            self.pending = None
        else:
            self.pending = msg


def _child(model: cp_model.CpModel, params: dict, conn, stream_log: bool, stop_after_s: float | None = None
           ) -> None:
    with forked_child(conn):
        # The parent handles Ctrl-C (it keeps the best solution and kills this process); CP-SAT's own SIGINT
        # handler would only race it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        solver = cp_model.CpSolver()
        _params(solver, params)
        solver.parameters.catch_sigint_signal = False
        if stream_log:
            solver.log_callback = lambda line: conn.send(("log", line))
        cb = _Callback(conn.send)
        solver.best_bound_callback = lambda b: conn.send(("bound", b))
        # The wall-clock limit, held here by stopping the search (CP-SAT then answers with its best solution and
        # bound) rather than by CP-SAT's own limit, which may be set far above it (``Run.params``: deterministic
        # mode); the parent kills this process only if that stop is not honoured.
        timer = None
        if stop_after_s is not None:
            timer = threading.Timer(max(0.05, stop_after_s - 0.05), solver.stop_search)
            timer.daemon = True
            timer.start()
        status = solver.solve(model, cb)
        if timer is not None:
            timer.cancel()
        if cb.pending is not None:
            conn.send(cb.pending)
        r = solver.response_proto
        values = list(r.solution) if len(r.solution) else None
        conn.send(("done", solver.status_name(status), solver.objective_value if values else None,
                   solver.best_objective_bound, values, solver.wall_time, solver.deterministic_time,
                   solver.solve_log if params.get("log_search_progress") else ""))


def python_sigint() -> None:
    """Give SIGINT back to Python's handler (KeyboardInterrupt). A CP-SAT solve in this process (static offsets,
    the exact search) installs its own handler and leaves SIGINT at the default action, which kills the process
    at once, with no plan written; Python's view (``signal.getsignal``) does not see that. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        signal.signal(signal.SIGINT, handler)


def solve(model: cp_model.CpModel, params: dict, wall_limit_s: float,
          on_progress: Callable[[str, float, float | None, float | None], None] | None = None,
          on_log: Callable[[str], None] | None = None) -> SolveResult:
    """Solve ``model`` with ``params`` (SatParameters fields); return within ``wall_limit_s`` plus a grace.

    ``on_progress(kind, elapsed_s, objective, bound)`` is called in this process for each solution and bound the
    solver reports; ``on_log(line)`` for each line of CP-SAT's search log (``log_search_progress`` is then set).
    A KeyboardInterrupt stops the solve: the result keeps the best solution so far and has ``interrupted`` set.
    """
    params = dict(params)
    params.setdefault("max_time_in_seconds", max(0.05, wall_limit_s))
    if on_log is not None:
        params["log_search_progress"] = True
        params["log_to_stdout"] = False
    python_sigint()
    if "fork" in mp.get_all_start_methods():
        return _solve_forked(model, params, wall_limit_s, on_progress, on_log)
    return _solve_threaded(model, params, wall_limit_s, on_progress, on_log)


def _solve_forked(model, params, wall_limit_s, on_progress, on_log=None) -> SolveResult:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    t0 = time.monotonic()
    proc = ctx.Process(target=_child, args=(model, params, child, on_log is not None, wall_limit_s), daemon=True)
    proc.start()
    child.close()
    res = SolveResult(status="UNKNOWN")
    deadline = t0 + wall_limit_s + GRACE_S
    done = False
    try:
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                res.killed = True
                res.status = "TIMEOUT"
                res.notes.append(f"the solver did not stop at its {wall_limit_s:.1f} s limit and was stopped")
                break
            try:
                ready = parent.poll(min(left, 0.05))
            except (EOFError, OSError):
                ready = False
            if not ready:
                if not proc.is_alive() and not parent.poll():
                    res.status = "CRASHED"
                    res.notes.append(f"the solver process ended without an answer (exit code {proc.exitcode})")
                    break
                continue
            try:
                msg = parent.recv()
            except (EOFError, OSError):
                res.status = "CRASHED"
                res.notes.append("the solver process ended without an answer")
                break
            kind = msg[0]
            if kind == "log":
                if on_log is not None:
                    on_log(msg[1])
            elif kind == "sol":
                _, wall, obj, bound, values = msg
                res.objective, res.bound, res.values = obj, bound, values
                res.history.append((obj, values))
                res.solutions += 1
                if on_progress:
                    on_progress("solution", time.monotonic() - t0, obj, bound)
            elif kind == "bound":
                res.bound = msg[1] if res.bound is None else max(res.bound, msg[1])
                if on_progress:
                    on_progress("bound", time.monotonic() - t0, res.objective, msg[1])
            elif kind == "done":
                _, status, obj, bound, values, wall, det, log = msg
                res.status = status
                if values is not None:
                    res.objective, res.values = obj, values
                res.bound = bound
                res.deterministic_time = det
                res.log = log
                done = True
            elif kind == "error":
                res.status = "CRASHED"
                res.notes.append(f"the solver failed: {msg[1]}")
                done = True
    except KeyboardInterrupt:
        # Ctrl-C: the best solution received so far stands (the child is killed below).
        res.interrupted = True
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=1.0)
        parent.close()
    res.wall_s = time.monotonic() - t0
    return res


def _solve_threaded(model, params, wall_limit_s, on_progress, on_log=None) -> SolveResult:
    solver = cp_model.CpSolver()
    _params(solver, params)
    if on_log is not None:
        solver.log_callback = on_log
    t0 = time.monotonic()
    res = SolveResult(status="UNKNOWN")

    def send(msg):
        if msg[0] == "sol":
            res.objective, res.bound, res.values = msg[2], msg[3], msg[4]
            res.history.append((msg[2], msg[4]))
            res.solutions += 1
            if on_progress:
                on_progress("solution", time.monotonic() - t0, msg[2], msg[3])

    cb = _Callback(send)
    stop = threading.Event()

    def watchdog():
        while not stop.wait(0.05):
            if time.monotonic() - t0 > wall_limit_s:
                solver.stop_search()

    th = threading.Thread(target=watchdog, daemon=True)
    th.start()
    try:
        status = solver.solve(model, cb)
        if cb.pending is not None:
            send(cb.pending)
        r = solver.response_proto
        if len(r.solution):
            res.values = list(r.solution)
            res.objective = solver.objective_value
        res.status = solver.status_name(status)
        res.bound = solver.best_objective_bound
        res.deterministic_time = solver.deterministic_time
        res.log = solver.solve_log if params.get("log_search_progress") else ""
    except KeyboardInterrupt:
        solver.stop_search()
        res.interrupted = True
    except Exception as exc:  # noqa: BLE001
        res.status = "CRASHED"
        res.notes.append(f"the solver failed: {exc!r}")
    finally:
        stop.set()
    res.wall_s = time.monotonic() - t0
    return res
