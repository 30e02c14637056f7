"""What every backend shares: the point protocol, the graphs a point runs on, and ``Backend.imap``/``map``.

A *point* is a plain dict of parameters; a *point function* is a module-level function ``fn(point) -> dict`` (it
is pickled by reference, so it must be importable where it runs). A point may run on a graph the backend was
given when opened: ``worker_graph()`` returns it inside ``fn`` (the graph named by the point's ``graph_id``, or
the only one), so a graph travels once to each worker process or once into Ray's object store, never once per
point.

A point whose function raises becomes an *error row* (``on_error(point, reason)``) and the rest of the grid goes
on; an ``InputError`` (bad user input, the same for every point) is raised in the driver instead. A backend
computes the same rows whatever runs them: only keys under ``"timing"`` may differ.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence

from planner.backends.checkpoint import Checkpoint
from planner.errors import InputError
from planner.formats.hograph import graph_sha256
from planner.graph import Graph

Progress = Callable[[int, int, str], None]  # (done, total, label of the point just finished)
PointFn = Callable[[dict], dict]
OnError = Callable[[dict, str], dict]
# An outcome, as it travels back from a worker: ("ok", row), ("error", reason) or ("input", (source, item, message)).
Outcome = tuple[str, object]

# The point key naming the graph (of the backend's ``graphs``) a point runs on; absent: the only graph.
GRAPH_ID = "graph_id"
# Point keys shown in progress labels, in this order.
LABEL_KEYS = ("case", "entry", "planner", "fraction", "bandwidth_GBps", "seq_len", "tag")

_GRAPHS: Mapping[str, Graph] = {}
_CURRENT: Graph | None = None


def set_worker_graphs(graphs: Mapping[str, Graph] | None) -> None:
    """The graphs of this worker process (a pool initializer, or the driver when points run in process)."""
    global _GRAPHS
    _GRAPHS = dict(graphs or {})


def worker_graph() -> Graph:
    """The graph of the point being run."""
    assert _CURRENT is not None, "the backend was not given this point's graph"
    return _CURRENT


def graphs_of(graph: Graph | Mapping[str, Graph] | None) -> dict[str, Graph]:
    """``graph`` as the backends keep it: one graph is ``{"": graph}``."""
    if graph is None:
        return {}
    if isinstance(graph, Graph):
        return {"": graph}
    return dict(graph)


def graph_id(point: dict) -> str:
    return str(point.get(GRAPH_ID, ""))


def call_point(fn: PointFn, point: dict, graph: Graph | None = None) -> Outcome:
    """Run ``fn(point)`` on ``graph`` (default: the point's graph among the worker's) and return its outcome; an
    exception is an outcome too, so that a worker never fails a grid for one point."""
    global _CURRENT
    _CURRENT = graph if graph is not None else _GRAPHS.get(graph_id(point))
    try:
        return ("ok", fn(point))
    except InputError as exc:
        return ("input", (exc.source, exc.item, exc.message))
    except Exception as exc:  # noqa: BLE001 - a failing point is a row saying why, not a failed grid
        return ("error", f"{type(exc).__name__}: {exc}")
    finally:
        _CURRENT = None


def label(point: dict) -> str:
    return " ".join(f"{k}={point[k]}" for k in LABEL_KEYS if point.get(k) is not None)


def default_error_row(point: dict, reason: str) -> dict:
    """The identifying keys of the point, ``status`` ``error`` and the reason."""
    out = {k: point[k] for k in LABEL_KEYS if k in point}
    out.update(status="error", valid=False, error=reason)
    return out


def point_cpus(point: dict) -> int:
    """CPUs a point asks for: the worker threads of its solver (cpsat's ``workers`` option), else 1."""
    for opts in (point.get("options"), point):
        if isinstance(opts, dict) and isinstance(opts.get("workers"), int) and opts["workers"] > 1:
            return opts["workers"]
    return 1


def point_key(fn: PointFn, graph_sha: str, point: dict) -> str:
    """A stable name of a point's result: its function, its graph's digest and its parameters."""
    text = json.dumps([f"{fn.__module__}.{fn.__qualname__}", graph_sha, point], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class Backend:
    """Runs point functions over points. Subclasses supply ``_start``, ``_stop`` and ``_outcomes``; use as a
    context manager. ``checkpoint``: results are appended there as they arrive, and points found there (from an
    earlier, interrupted run) are not run again."""

    name = "backend"

    def __init__(self, graphs: Mapping[str, Graph] | None = None, checkpoint: Checkpoint | None = None) -> None:
        self.graphs = dict(graphs or {})
        self.checkpoint = checkpoint
        self._shas: dict[str, str] = {}

    def __enter__(self) -> Backend:
        self._start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _start(self) -> None:
        pass

    def _stop(self) -> None:
        pass

    def _outcomes(self, fn: PointFn, todo: list[tuple[int, dict]]) -> Iterator[tuple[int, Outcome]]:
        """(index, outcome) of every point of ``todo``, in the order they finish."""
        raise NotImplementedError

    def _key(self, fn: PointFn, point: dict) -> str:
        gid = graph_id(point)
        if gid not in self._shas:
            g = self.graphs.get(gid)
            self._shas[gid] = graph_sha256(g) if g is not None else ""
        return point_key(fn, self._shas[gid], point)

    def imap(self, fn: PointFn, points: Sequence[dict], progress: Progress | None = None,
             on_error: OnError | None = None) -> Iterator[tuple[int, dict]]:
        """(index, row) of every point, as each finishes; ``progress(done, total, label)`` after each."""
        total = len(points)
        keys = [self._key(fn, p) for p in points] if self.checkpoint is not None else []
        todo: list[tuple[int, dict]] = []
        done = 0
        for i, p in enumerate(points):
            row = self.checkpoint.get(keys[i]) if self.checkpoint is not None else None
            if row is None:
                todo.append((i, p))
                continue
            done += 1
            yield i, row
        if done and progress:
            progress(done, total, f"{done} from {self.checkpoint.path.name}")
        for i, (kind, value) in self._outcomes(fn, todo):
            if kind == "input":
                raise InputError(*value)  # type: ignore[misc]
            if kind == "ok":
                row = value
                if self.checkpoint is not None:
                    self.checkpoint.add(keys[i], row)  # type: ignore[arg-type]
            else:  # an error row is not kept: --resume tries the point again
                row = (on_error or default_error_row)(points[i], str(value))
            done += 1
            if progress:
                progress(done, total, label(points[i]))
            yield i, row  # type: ignore[misc]

    def map(self, fn: PointFn, points: Sequence[dict], progress: Progress | None = None,
            on_error: OnError | None = None) -> list[dict]:
        """``[fn(p) for p in points]``, in that order (error rows where a point failed)."""
        out: list[dict | None] = [None] * len(points)
        for i, row in self.imap(fn, points, progress, on_error):
            out[i] = row
        return out  # type: ignore[return-value]
