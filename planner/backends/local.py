"""The local backend: points in this process (``jobs`` 1) or in a pool of ``jobs`` worker processes.

Workers start with ``spawn`` (no fork of a threaded solver) and receive the graphs once, through the pool's
initializer. A point asking for several CPUs (``base.point_cpus``: cpsat's ``workers``) runs only beside points
whose requests fit ``jobs`` with it, as Ray schedules it, so that time-limited solvers get the cores they ask for
on either backend. A local worker process that dies breaks the pool (``concurrent.futures``): the grid stops, and
``--resume`` picks it up.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from planner.backends.base import Backend, Outcome, PointFn, call_point, point_cpus, set_worker_graphs
from planner.backends.checkpoint import Checkpoint
from planner.graph import Graph


class LocalBackend(Backend):
    name = "local"

    def __init__(self, jobs: int = 1, graphs: Mapping[str, Graph] | None = None,
                 checkpoint: Checkpoint | None = None) -> None:
        super().__init__(graphs, checkpoint)
        self.jobs = max(1, int(jobs))
        self._pool: ProcessPoolExecutor | None = None

    def _start(self) -> None:
        if self.jobs > 1:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=set_worker_graphs, initargs=(self.graphs,))

    def _stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _outcomes(self, fn: PointFn, todo: list[tuple[int, dict]]) -> Iterator[tuple[int, Outcome]]:
        if self._pool is None or len(todo) <= 1:
            set_worker_graphs(self.graphs)
            for i, p in todo:
                yield i, call_point(fn, p)
            return
        queue = list(todo)
        running: dict[Future, tuple[int, int]] = {}  # future -> (index, cpus)
        try:
            while queue or running:
                busy = sum(c for _, c in running.values())
                # Submit, in order, every waiting point whose CPUs fit beside those running (a point that does not
                # fit yet lets later, smaller ones pass, as Ray's scheduler does); one at least always runs.
                k = 0
                while k < len(queue):
                    cpus = min(point_cpus(queue[k][1]), self.jobs)
                    if running and busy + cpus > self.jobs:
                        k += 1
                        continue
                    i, p = queue.pop(k)
                    running[self._pool.submit(call_point, fn, p)] = (i, cpus)
                    busy += cpus
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    i, _ = running.pop(fut)
                    yield i, fut.result()
        finally:
            for fut in running:
                fut.cancel()
