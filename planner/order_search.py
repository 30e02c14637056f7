"""A local search over topological orders for a lower no-offload peak (``live_bytes``), before anything moves.

Which op runs when decides how long every activation lives; on Checkmate's random layered graphs the graph's own
order and the memory-aware one (``orders.memory_aware_order``) peak 10-12% above an order one op move at a time
finds (random n100: 46.3 GB given, 41.1 GB searched), and the recompute chains then re-run 4% of the compute at 80%
of the given peak instead of 60-69%. The search: each round takes every op once (in a seeded shuffle) and moves it
to the best of a few positions between its last predecessor and its first successor, keeping the move when the
order's score drops: the peak, then how many steps reach it, then the sum of the highest tenth of the steps (so a
move that lowers the crowd below the peak counts). Only moves that span a step of that top tenth are tried (a move
changes the live bytes only between its two positions). It stops when a round changes nothing, after ``MAX_ROUNDS``, or
when the work (evaluations times ops) reaches ``MAX_CELLS``; it is deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from planner.graph import Graph

MAX_ROUNDS = 8
# Positions tried per op and round, sampled from its feasible range when that is wider.
POSITIONS = 24
# Work cap: evaluations times ops (each evaluation is a numpy pass over the order), a few seconds at most.
MAX_CELLS = 30_000_000


class _Profile:
    """The live bytes of an order as numpy passes, as ``orders.live_bytes`` counts them: each tensor lives from its
    producer's position (0 when no op produces it) to its last reader's, or to the end when it outlives the step."""

    def __init__(self, graph: Graph) -> None:
        index = graph.op_index
        n = self.n = len(graph.ops)
        self.preds: list[list[int]] = [[] for _ in range(n)]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for u, v in graph.dag.edges:
            self.preds[index[v]].append(index[u])
            self.succs[index[u]].append(index[v])
        readers: dict[str, list[int]] = {}
        for i, op in enumerate(graph.ops):
            for t in op.reads:
                readers.setdefault(t, []).append(i)
        sizes, producers, flat, offsets, persistent = [], [], [], [], []
        self.base = 0
        for name, t in graph.tensors.items():
            p = graph.producer.get(name)
            if p is None and (t.persistent or not readers.get(name)):
                # As ``live_bytes`` with ``remote_resident``: there from the start to the end, whatever the order.
                self.base += t.bytes if t.persistent else 0
                continue
            # What no op produces starts at position 0 (the sentinel op ``n``, always at 0) to its last reader.
            sizes.append(t.bytes)
            producers.append(n if p is None else index[p])
            offsets.append(len(flat))
            flat.extend(([] if p is None else [index[p]]) + readers.get(name, []))
            persistent.append(t.persistent)
        self.size = np.array(sizes, dtype=np.int64)
        self.producer = np.array(producers, dtype=np.int64)
        self.flat = np.array(flat, dtype=np.int64)
        self.offsets = np.array(offsets, dtype=np.int64)
        self.persistent = np.array(persistent, dtype=bool)
        self.workspace = np.array([op.workspace_bytes for op in graph.ops], dtype=np.int64)

    def live(self, pos: np.ndarray) -> np.ndarray:
        """The bytes on HBM at each position of the order whose op ``i`` runs at ``pos[i]``."""
        n = self.n
        out = np.full(n, self.base, dtype=np.int64)
        if len(self.size):
            at = np.append(pos, 0)
            start = at[self.producer]
            end = np.maximum.reduceat(at[self.flat], self.offsets)
            end[self.persistent] = n - 1
            # bincount sums in float64: exact for integers below 2**53 bytes (9 PB).
            delta = (np.bincount(start, weights=self.size, minlength=n + 1)
                     - np.bincount(end + 1, weights=self.size, minlength=n + 1))
            out += np.rint(np.cumsum(delta[:n])).astype(np.int64)
        out[pos] += self.workspace
        return out


def _score(live: np.ndarray) -> tuple[int, int, int]:
    peak = int(live.max())
    k = max(1, len(live) // 10)
    return peak, int((live == peak).sum()), int(np.partition(live, len(live) - k)[len(live) - k:].sum())


def _high_steps(live: np.ndarray) -> list[int]:
    """Prefix counts of the steps in the top tenth of ``live`` (``out[j]``: how many among the first ``j``)."""
    k = max(1, len(live) // 10)
    threshold = np.partition(live, len(live) - k)[len(live) - k]
    return [0] + np.cumsum(live >= threshold).tolist()


def lower_peak_order(graph: Graph, start: Sequence[str], seed: int = 0, max_rounds: int = MAX_ROUNDS,
                     max_cells: int = MAX_CELLS) -> list[str]:
    """A topological order of ``graph`` whose ``live_bytes`` peak is at most that of ``start`` (a topological order
    of the same ops), found by the local search of the module doc; ``start`` itself when no move helps."""
    n = len(graph.ops)
    if n < 3:
        return list(start)
    prof = _Profile(graph)
    index = graph.op_index
    order = [index[name] for name in start]
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    live = prof.live(pos)
    best = _score(live)
    high = _high_steps(live)
    rng = random.Random(seed)
    cells = 0
    for _round in range(max_rounds):
        changed = False
        ops = list(range(n))
        rng.shuffle(ops)
        for v in ops:
            a = int(pos[v])
            lo = max((int(pos[u]) for u in prof.preds[v]), default=-1) + 1
            hi = min((int(pos[u]) for u in prof.succs[v]), default=n) - 1
            if lo >= hi:
                continue
            # A move changes the live bytes only between its two positions: it must span a step of the top tenth.
            targets = [b for b in range(lo, hi + 1) if b != a and high[max(a, b) + 1] > high[min(a, b)]]
            if len(targets) > POSITIONS:
                targets = rng.sample(targets, POSITIONS)
            found = None
            for b in targets:
                trial = order[:a] + order[a + 1:]
                trial.insert(b, v)
                q = np.empty(n, dtype=np.int64)
                q[trial] = np.arange(n)
                s = _score(prof.live(q))
                if s < best and (found is None or s < found[0]):
                    found = (s, trial, q)
            cells += n * len(targets)
            if found is not None:
                best, order, pos = found
                high = _high_steps(prof.live(pos))
                changed = True
            if cells >= max_cells:
                return [graph.ops[i].name for i in order]
        if not changed:
            break
    return [graph.ops[i].name for i in order]


__all__ = ["MAX_CELLS", "lower_peak_order"]
