"""The Ray backend: each point a Ray task, on a local cluster or a real one.

``address`` is ``ray.init``'s: None starts a local cluster, or joins the one ``RAY_ADDRESS`` or ``ray start`` on
this machine names; ``"auto"`` joins an existing cluster only; ``"ray://HOST:10001"`` is a remote cluster through
Ray Client (docs/ray.md). Ray is connected once per process and left for Ray's own exit handler to shut down, so
that a command running several grids (``ho-plan paper``) starts the cluster once.

Each graph is put into the object store once; a task gets its reference and each worker process keeps the last
few graphs it fetched, so a graph is deserialized once per worker, not once per point. A task asks for
``point_cpus(point)`` CPUs (cpsat's ``workers``). A task whose worker process dies is run again once (Ray's
``max_retries``); exceptions of the point itself are rows already (``base.call_point``) and are not retried, since
they would fail the same way. A task that fails twice becomes an error row and the rest of the grid completes.
Rows stream back with ``ray.wait`` as they finish.

``ray`` is imported here only, inside functions: the package works without the ``ray`` extra.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from planner.backends.base import Backend, Outcome, PointFn, call_point, graph_id, point_cpus
from planner.backends.checkpoint import Checkpoint
from planner.errors import InputError
from planner.graph import Graph

# Ray's retries of a task whose worker died: tried 1 + MAX_RETRIES times in all.
MAX_RETRIES = 1
# Graphs a worker process keeps deserialized (a bench run ships one per case).
_KEEP = 4
_worker_graphs: dict[str, Graph] = {}
_remote = None


def require_ray():
    try:
        import ray
    except ImportError:
        raise InputError("command line", "--backend", "ray is not installed: pip install 'ho-plan[ray]'") from None
    return ray


def _run(fn: PointFn, box: list, point: dict) -> Outcome:
    """The task: the point on its graph (``box``: [] or [the graph's object reference], in a list so that Ray does
    not fetch it for every task)."""
    graph = None
    if box:
        ref = box[0]
        key = ref.hex()
        if key not in _worker_graphs:
            if len(_worker_graphs) >= _KEEP:
                _worker_graphs.pop(next(iter(_worker_graphs)))
            _worker_graphs[key] = require_ray().get(ref)
        graph = _worker_graphs[key]
    return call_point(fn, point, graph)


def connect(address: str | None = None) -> None:
    """Connect this process to Ray (a no-op when it is already)."""
    ray = require_ray()
    if ray.is_initialized():
        return
    try:
        # log_to_driver off: workers' output would tear through the progress display.
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    except ConnectionError as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise InputError("command line", "--ray-address", f"no Ray cluster at {address!r}: {first}") from None


class RayBackend(Backend):
    name = "ray"

    def __init__(self, address: str | None = None, graphs: Mapping[str, Graph] | None = None,
                 checkpoint: Checkpoint | None = None) -> None:
        super().__init__(graphs, checkpoint)
        self.address = address
        self._refs: dict[str, object] = {}

    def _start(self) -> None:
        global _remote
        connect(self.address)
        ray = require_ray()
        if _remote is None:
            _remote = ray.remote(_run)
        self._refs = {gid: ray.put(g) for gid, g in self.graphs.items()}

    def _stop(self) -> None:
        self._refs = {}  # the graphs leave the object store with their last reference

    def _outcomes(self, fn: PointFn, todo: list[tuple[int, dict]]) -> Iterator[tuple[int, Outcome]]:
        ray = require_ray()
        index = {}
        for i, p in todo:
            ref = self._refs.get(graph_id(p))
            task = _remote.options(num_cpus=point_cpus(p), max_retries=MAX_RETRIES,  # type: ignore[union-attr]
                                   retry_exceptions=False)
            index[task.remote(fn, [] if ref is None else [ref], p)] = i
        pending = list(index)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                        out = ("error", f"{type(exc).__name__} after {1 + MAX_RETRIES} tries: {first}")
                    yield index[ref], out
        finally:
            for ref in pending:  # interrupted: do not leave the cluster busy with a grid nobody waits for
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - best effort: the task may have finished, the cluster be gone
                    pass
