"""Where the points of a grid run: ``local`` (this process or a pool of processes) or ``ray`` (a Ray cluster).

    from planner.backends import BackendSpec
    with BackendSpec("ray", address="auto").open(graph) as b:
        rows = b.map(point_fn, points, progress)

Sweeps, bench, the paper's evaluation and stored solutions hand their points to a backend and never ask which one
it is (``base.Backend``: ``imap`` yields rows as they finish, ``map`` returns them in order). A
``BackendSpec`` is the plain description a command line gives (name, jobs, address, checkpoint); ``open`` makes
the backend for one set of graphs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from planner.backends.base import (
    GRAPH_ID,
    Backend,
    Progress,
    call_point,
    default_error_row,
    graphs_of,
    point_cpus,
    point_key,
    worker_graph,
)
from planner.backends.checkpoint import Checkpoint
from planner.backends.local import LocalBackend
from planner.backends.ray import RayBackend
from planner.errors import InputError
from planner.graph import Graph

BACKENDS = ("local", "ray")


def backend(name: str = "local", jobs: int = 1, graph: Graph | Mapping[str, Graph] | None = None,
            address: str | None = None, checkpoint: Checkpoint | None = None) -> Backend:
    """A backend (use as a context manager). ``jobs``: local worker processes (Ray uses the cluster's CPUs);
    ``address``: the Ray cluster (``planner.backends.ray``); ``graph``: one graph, or graphs by ``graph_id``."""
    graphs = graphs_of(graph)
    if name == "local":
        return LocalBackend(jobs, graphs, checkpoint)
    if name == "ray":
        return RayBackend(address, graphs, checkpoint)
    raise InputError("command line", "--backend", f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")


@dataclass
class BackendSpec:
    """What to run points on, as a command line says it; ``checkpoint`` is shared by every grid of a command."""

    name: str = "local"
    jobs: int = 1
    address: str | None = None
    checkpoint: Checkpoint | None = None

    def open(self, graph: Graph | Mapping[str, Graph] | None = None, jobs: int | None = None) -> Backend:
        return backend(self.name, self.jobs if jobs is None else jobs, graph, self.address, self.checkpoint)


__all__ = ["BACKENDS", "GRAPH_ID", "Backend", "BackendSpec", "Checkpoint", "LocalBackend", "Progress", "RayBackend",
           "backend", "call_point", "default_error_row", "point_cpus", "point_key", "worker_graph"]
