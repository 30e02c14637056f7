"""Execution orders and the sequential memory view planners reason with (sizes only, no times)."""

from __future__ import annotations

import bisect
import heapq
import random
import re
from collections.abc import Sequence

import networkx as nx

from planner.graph import Graph
from planner.hardware import HBM
from planner.order_search import lower_peak_order

# How many ready ops (the lowest-indexed) the memory-aware order weighs at each step; bounds the cost on wide graphs.
READY_WINDOW = 32


ORDERS = ("auto", "lowest-peak", "store-release", "sources-first", "graph", "searched")
# The sampled orders, named by their seed (``sampled_order``): ``sampled-0``, ``sampled-1``, ...
SAMPLED = re.compile(r"sampled-(\d{1,9})")
# The deferred orders, named by the eighths of the first release's work run before the deferral (``deferred_order``).
DEFERRED = re.compile(r"deferred-([0-7])")
# Every order name of a family, as the planners' ``order`` option takes them.
FAMILIES = re.compile(f"{SAMPLED.pattern}|{DEFERRED.pattern}")
# How often a sampled order's walk takes the first ready op of the lowest-peak order rather than any ready op.
SAMPLED_KEEP = 0.7


def named_order(graph: Graph, name: str) -> list[str]:
    """The compute order a planner's ``order`` option names: ``auto`` (``best_no_offload_order``),
    ``lowest-peak`` (``lowest_peak_order``: without moving the store-back releases up), ``store-release``
    (``store_release_order``), ``sources-first`` (``sources_first_order`` of ``auto``), ``graph``, ``searched``
    (``searched_order``), ``sampled-K`` (``sampled_order`` with seed K) or ``deferred-K`` (``deferred_order`` with K
    eighths run first)."""
    if name == "auto":
        return best_no_offload_order(graph)
    if name == "lowest-peak":
        return lowest_peak_order(graph)
    if name == "store-release":
        return store_release_order(graph, lowest_peak_order(graph))
    if name == "sources-first":
        return sources_first_order(graph, best_no_offload_order(graph))
    if name == "graph":
        return graph_order(graph)
    if name == "searched":
        return searched_order(graph)
    sampled = SAMPLED.fullmatch(name)
    if sampled:
        return sampled_order(graph, int(sampled.group(1)))
    deferred = DEFERRED.fullmatch(name)
    if deferred:
        return deferred_order(graph, int(deferred.group(1)))
    raise ValueError(f"order: {name!r} is not one of {', '.join(ORDERS)}, sampled-K or deferred-K")


def sampled_order(graph: Graph, seed: int) -> list[str]:
    """A topological order drawn at random, the same for the same graph and ``seed``: the ``lowest_peak_order``
    walked with, at each step, its first ready op (``SAMPLED_KEEP`` of the time) or any ready op, each as likely;
    then each op that updates a tensor in place and feeds no other op (an optimizer step), in a random turn, put at
    any place after its last input's producer, each as likely.

    Why: a planner that keeps its starting order (cpsat's whole model, greedy) ends near the best plan of that
    order, and the orders derived from rules are not the best ones on small training graphs, mostly for where the
    optimizer steps run: their store-backs hide behind the rest of the backward pass or queue after it. On
    transformer_block at 60% of its peak greedy's best plan in 256 such orders runs 78.3 ms, against 86.1 ms for
    its sweep over the rule-derived ones (``planners/cpsat/solve.py``, ``_sampled``)."""
    rng = random.Random(seed)
    dag = graph.dag
    steps = {op.name for op in graph.ops if op.updates and dag.out_degree(op.name) == 0}
    base = [name for name in lowest_peak_order(graph) if name not in steps]
    pos = {name: i for i, name in enumerate(base)}
    waiting = {name: sum(1 for p in dag.predecessors(name) if p not in steps) for name in base}
    ready = sorted(pos[name] for name in base if waiting[name] == 0)
    order: list[str] = []
    while ready:
        name = base[ready.pop(0 if rng.random() < SAMPLED_KEEP else rng.randrange(len(ready)))]
        order.append(name)
        for succ in dag.successors(name):
            if succ in pos:
                waiting[succ] -= 1
                if waiting[succ] == 0:
                    bisect.insort(ready, pos[succ])
    for name in rng.sample(sorted(steps, key=graph.op_index.__getitem__), len(steps)):
        at = {n: i for i, n in enumerate(order)}
        first = max((at[p] + 1 for p in dag.predecessors(name)), default=0)
        order.insert(rng.randint(first, len(order)), name)
    return order


def graph_order(graph: Graph) -> list[str]:
    """The order the graph gives (already topological)."""
    return [op.name for op in graph.ops]


def memory_aware_order(graph: Graph) -> list[str]:
    """A topological order that greedily runs the ready op with the smallest net allocation.

    Net allocation = bytes it creates (outputs, workspace) minus bytes it frees (transient inputs it reads last).
    Ties go to the op that comes first in the graph.
    """
    dag = graph.dag
    index = graph.op_index
    indeg = {n: dag.in_degree(n) for n in dag.nodes}
    remaining = {t: len(u) for t, u in graph.users.items()}
    ready = sorted(index[n] for n, d in indeg.items() if d == 0)
    order: list[str] = []
    tensors = graph.tensors
    # What each op creates, and what it would free (the transient tensors it is the last to read), kept up to date
    # as ops run instead of summed for each of the window's ops at each step (1.2M sums on a 38.8k-op graph).
    created = [sum(tensors[t].bytes for t in op.outputs) + op.workspace_bytes for op in graph.ops]
    freed = [0] * len(graph.ops)
    done = [False] * len(graph.ops)

    def last_reader_frees(t: str) -> None:
        if not tensors[t].persistent:
            for u in graph.users[t]:
                if not done[index[u]]:
                    freed[index[u]] += tensors[t].bytes
                    return

    for t, r in remaining.items():
        if r == 1:
            last_reader_frees(t)
    while ready:
        # The READY_WINDOW lowest-indexed ready ops, ``ready`` kept sorted (a heap popped and refilled 32 times a
        # step cost more than the choice itself).
        k = min(range(min(READY_WINDOW, len(ready))), key=lambda j: (created[ready[j]] - freed[ready[j]], ready[j]))
        best = ready.pop(k)
        op = graph.ops[best]
        order.append(op.name)
        done[best] = True
        for t in op.reads:
            remaining[t] -= 1
            if remaining[t] == 1:
                last_reader_frees(t)
        for succ in dag.successors(op.name):
            indeg[succ] -= 1
            if indeg[succ] == 0:
                bisect.insort(ready, index[succ])
    return order


def store_backs_first(graph: Graph, order: Sequence[str]) -> list[str]:
    """``order`` with every op that updates a tensor pinned to a remote tier (an optimizer step on host-resident
    Adam states), and every op that only leads to such ops (a gradient all-reduce), moved up to run as soon as
    its inputs are ready; the other ops keep their relative order. ``order`` itself when there is no such op.

    Why: such an update releases the Store that takes the tensor back to its tier (steady state), and those
    Stores share one link. Run at the end of the backward pass, as graphs list the optimizer, they queue behind
    the last compute and the step ends a whole store volume after it (LLaMA-3-8B No.1, fp32 Adam states on the
    host: 2.9 s of stores after 3.3 s of compute, 6.05 s); run as each layer's gradient is complete, they overlap
    the rest of the backward pass (3.80 s, against a lower bound of 3.79 s).
    """
    dag = graph.dag
    early: set[str] = set()
    for name in reversed(list(order)):
        op = graph.op(name)
        succ = list(dag.successors(name))
        if any(_stored_back(graph, t) for t in op.updates) or (succ and all(s in early for s in succ)):
            early.add(name)
    if not early:
        return list(order)
    pos = {name: i for i, name in enumerate(order)}
    waiting = {n: dag.in_degree(n) for n in early}
    out: list[str] = []

    def moved_up(name: str):
        return iter(sorted((s for s in dag.successors(name) if s in waiting), key=pos.__getitem__))

    def emit(name: str) -> None:
        # Depth first, each op's moved-up successors in ``order``'s order; a stack, not recursion, as a chain of
        # such ops can be as long as the graph.
        out.append(name)
        stack = [moved_up(name)]
        while stack:
            s = next(stack[-1], None)
            if s is None:
                stack.pop()
                continue
            waiting[s] -= 1
            if waiting[s] == 0:
                out.append(s)
                stack.append(moved_up(s))

    for name in order:
        if name not in early:
            emit(name)
        elif dag.in_degree(name) == 0:
            emit(name)
    return out


def store_release_order(graph: Graph, order: Sequence[str]) -> list[str]:
    """A topological order that runs first everything the first store-back release needs, then everything the
    next one needs, and so on: the updates of tensors pinned to a remote tier are ranked by their number of
    ancestors, each op is keyed by the best-ranked update it leads to, and the ready op with the smallest key
    runs next (``order`` breaks ties).
    ``order`` itself when there is no such update.

    Why: with gradient accumulation a layer's optimizer step waits for that layer's backward in every
    micro-batch. Run micro-batch by micro-batch, the first step is released only in the last micro-batch and the
    store-backs queue after it; run layer by layer across micro-batches, it is released after the forward passes
    and the top layer's backward (DeepSeek-V3 training, 8 micro-batches, Adam states on the host: 2.30 s to
    1.89 s with unbounded HBM, against a bound of 1.84 s). Every micro-batch's activations then stay alive
    longer (its peak 61 -> 71 GB there), so planners weigh it as one order among others.
    """
    ranked = _releases(graph, order)
    if not ranked:
        return list(order)
    key = _release_keys(graph, order, ranked)
    return phased_order(graph.dag, {name: (key[name], i) for i, name in enumerate(order)})


def _releases(graph: Graph, order: Sequence[str]) -> list[str]:
    """The updates of tensors stored back to a remote tier, the one with the fewest ancestors (the first that can
    be released, whatever the graph lists first) first; ``order`` breaks ties."""
    pos = {name: i for i, name in enumerate(order)}
    updates = [name for name in order if any(_stored_back(graph, t) for t in graph.op(name).updates)]
    counts = ancestor_counts(graph.dag, order, updates)
    return sorted(updates, key=lambda name: (counts[name], pos[name]))


def ancestor_counts(dag: nx.DiGraph, order: Sequence[str], targets: Sequence[str]) -> dict[str, int]:
    """How many ancestors each of ``targets`` has in ``dag`` (``order``: a topological order of it): one pass that
    carries each node's ancestors as a bit set, dropped once its last successor has taken it.

    Why not ``nx.ancestors`` per target: a search of the graph each (4.3 s for 300 targets on a 20,000-op training
    graph, 0.26 s this way)."""
    wanted = set(targets)
    bit = {name: i for i, name in enumerate(order)}
    waiting = {name: dag.out_degree(name) for name in order}
    sets: dict[str, int] = {}
    out: dict[str, int] = {}
    for name in order:
        acc = 0
        for p in dag.predecessors(name):
            acc |= sets[p] | (1 << bit[p])
            waiting[p] -= 1
            if not waiting[p]:
                del sets[p]
        if name in wanted:
            out[name] = acc.bit_count()
        if waiting[name]:
            sets[name] = acc
    return out


def _release_keys(graph: Graph, order: Sequence[str], ranked: list[str]) -> dict[str, int]:
    """Each op's key: the place in ``ranked`` of the first-ranked update it leads to (``len(ranked)``: none)."""
    rank = {name: k for k, name in enumerate(ranked)}
    dag = graph.dag
    key: dict[str, int] = {}
    for name in reversed(list(order)):
        key[name] = min([rank.get(name, len(ranked))] + [key[s] for s in dag.successors(name)])
    return key


def first_release(graph: Graph) -> list[str]:
    """The updates of tensors stored back to a remote tier that can release their Stores first: ranked by their
    number of ancestors (as ``store_release_order``), the first ones whose tensors hold at least half the
    stored-back bytes. Empty when nothing is stored back."""
    ranked = _releases(graph, graph_order(graph))
    held = {name: sum(graph.tensors[t].bytes for t in graph.op(name).updates if _stored_back(graph, t))
            for name in ranked}
    out, acc, total = [], 0, sum(held.values())
    for name in ranked:
        out.append(name)
        acc += held[name]
        if 2 * acc >= total:
            break
    return out


def deferred_order(graph: Graph, eighths: int) -> list[str]:
    """The order ``deferred-K`` (K = ``eighths``): ``deferred_phases``, ``best_no_offload_order`` within each phase;
    ``best_no_offload_order`` itself when nothing is stored back."""
    got = deferred_phases(graph, eighths)
    if got is None:
        return best_no_offload_order(graph)
    phases, ties = got
    return phased_order(graph.dag, {name: (phases[name], i) for i, name in enumerate(ties)})


def deferred_phases(graph: Graph, eighths: int) -> tuple[dict[str, int], list[str]] | None:
    """Each op's phase in the order ``deferred-K`` (K = ``eighths``), and the order that breaks ties within a phase
    (not a topological order across phases); None when nothing is stored back. The phases:

    0. the shortest prefix of ``best_no_offload_order`` that holds K eighths of the ops the ``first_release``
       updates need (with gradient accumulation: the first K eighths of the micro-batches, run in full);
    1. the rest of what those updates need, and the updates (the other micro-batches' forward passes and the top
       layers' backward);
       With them, the ops that lead to no stored-back update (a pipeline stage's send of its forward output);
    2. the other updates of stored-back tensors and the ops that lead only to them, as soon as they are ready;
    3. everything else (the lower layers' backward of the deferred micro-batches), by the first-ranked update
       each leads to (layer by layer, as ``store_release_order``).

    Why: with gradient accumulation a layer's optimizer step waits for that layer's backward in every micro-batch,
    and its Store back to the remote tier for the step. Run micro-batch by micro-batch, the top layers' steps,
    which hold most of the stored-back bytes, are released only in the last micro-batch, and the Stores, which
    take longer than the compute, queue after it (DeepSeek-V3 training at 60% of its peak: the first release at
    764 ms, then 1.54 s of Stores). Deferring the lower layers' backward of the last micro-batches releases them
    earlier; ``store_release_order`` defers it for every micro-batch, and holds every activation that long."""
    first = first_release(graph)
    if not first:
        return None
    base = best_no_offload_order(graph)
    dag = graph.dag
    needed = set(first).union(*(nx.ancestors(dag, name) for name in first))
    goal = len(needed) * eighths / 8
    phases: dict[str, int] = {}
    count = 0
    for name in base:
        if count >= goal:
            break
        phases[name] = 0
        count += name in needed
    ranked = _releases(graph, base)
    stored = set(ranked)
    soon: set[str] = set()
    for name in reversed(base):
        succ = list(dag.successors(name))
        if name in stored or (len(succ) == 1 and succ[0] in soon):
            soon.add(name)
    # The ops that lead to no stored-back update (a pipeline stage's send of its forward output) run with the first
    # release's: deferred, they would hold what they read.
    leads: set[str] = set()
    stack = list(stored)
    while stack:
        for p in dag.predecessors(stack.pop()):
            if p not in leads:
                leads.add(p)
                stack.append(p)
    for name in base:
        if name not in phases:
            phases[name] = 1 if name in needed or (name not in leads and name not in stored) else \
                2 if name in soon else 3
    # The deferred ops run by the next release they lead to (the top layers' remaining steps, then the next layer's),
    # as ``store_release_order`` runs them; ``best_no_offload_order`` breaks ties, and orders the other phases.
    release = _release_keys(graph, base, ranked)
    pos = {name: i for i, name in enumerate(base)}
    ties = sorted(base, key=lambda name: (release[name] if phases[name] == 3 else -1, pos[name]))
    return phases, ties


def phased_order(dag: nx.DiGraph, key: dict[str, tuple]) -> list[str]:
    """The topological order of ``dag`` that runs, among the ready ops, the one of the smallest ``key`` first."""
    waiting = {name: dag.in_degree(name) for name in key}
    ready = [(key[name], name) for name in key if waiting[name] == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        _, name = heapq.heappop(ready)
        out.append(name)
        for s in dag.successors(name):
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (key[s], s))
    return out


def sources_first_order(graph: Graph, order: Sequence[str]) -> list[str]:
    """``order`` with the source ops that share a read moved to the front (in ``order``'s order): the ops that no
    other op precedes and that read a tensor that exists before the step, read by another such op too. ``order``
    itself when there are none.

    Why: a large weight read by such an op in each chunk of a chunked prefill (DeepSeek-V3's 1.85 GB embedding
    table, read by the embedding of each of 8 chunks of 8,192 tokens) then has its reads together at the start and
    can leave HBM for the rest of the pass, while the chunks' embeddings (117 MB each) wait, stored on a remote
    tier if need be. On deepseek-v3-nsa-64k-L3-1layer at 60% of its peak the prefill's attention leaves no room for
    the table beside the experts' weights: in ``auto``'s order they come back for every chunk and greedy-sweep's
    plan runs 646.5 ms (caching allocator), in this order 547.0 ms (static offsets). The chunks' outputs live
    longer, so the order is one planners weigh among others."""
    dag = graph.dag
    sources = [name for name in order if dag.in_degree(name) == 0]
    readers: dict[str, int] = {}
    for name in sources:
        for t in set(graph.op(name).reads):
            if t not in graph.producer:
                readers[t] = readers.get(t, 0) + 1
    shared = {t for t, k in readers.items() if k > 1}
    first = [name for name in sources if shared.intersection(graph.op(name).reads)]
    if not first:
        return list(order)
    moved = set(first)
    return first + [name for name in order if name not in moved]


def _stored_back(graph: Graph, name: str) -> bool:
    t = graph.tensors[name]
    return name not in graph.producer and t.persistent and t.pinned and t.home != HBM


def live_bytes(graph: Graph, order: Sequence[str], remote_resident: bool = True) -> list[int]:
    """Return, for each op of ``order``, the bytes on HBM while it runs when nothing is offloaded.

    Everything that exists before the step counts as resident from the start (``remote_resident``: also what
    starts on a remote tier, as the no-offload plan prefetches it first); transient tensors are freed after
    their last use, as the executor does.
    """
    ops = [graph.op(name) for name in order]
    tensors = graph.tensors
    last: dict[str, int] = {}
    for i, op in enumerate(ops):  # in order, so the last assignment is the last use
        for t in op.reads:
            last[t] = i
        for t in op.outputs:
            last[t] = i
    cur = 0
    for name, t in tensors.items():
        if name not in graph.producer and (t.home == HBM or remote_resident) and (t.persistent or name in last):
            cur += t.bytes
    frees_at = [0] * (len(ops) + 1)
    for name, i in last.items():
        t = tensors[name]
        if not t.persistent:
            frees_at[i] += t.bytes
    out = []
    for i, op in enumerate(ops):
        for t in op.outputs:
            cur += tensors[t].bytes
        out.append(cur + op.workspace_bytes)
        cur -= frees_at[i]
    return out


def best_no_offload_order(graph: Graph) -> list[str]:
    """The graph's order or the memory-aware one, whichever peaks lower (the graph's order on a tie), with the
    updates that release store-backs moved up (``store_backs_first``) unless that raises the peak."""
    base = lowest_peak_order(graph)
    early = store_backs_first(graph, base)
    if early != base and max(live_bytes(graph, early), default=0) <= max(live_bytes(graph, base), default=0):
        return early
    return base


def lowest_peak_order(graph: Graph) -> list[str]:
    """The graph's order or the memory-aware one, whichever peaks lower (the graph's order on a tie).

    Computed once per graph (seconds on 30k-op graphs, and every planner asks): it does not depend on homes, as
    neither order nor ``live_bytes`` with ``remote_resident`` does, so it is kept in ``graph.home_free``.
    """
    got = graph.home_free.get("best_no_offload_order")
    if got is None:
        given = graph_order(graph)
        aware = memory_aware_order(graph)
        got = tuple(aware if max(live_bytes(graph, aware)) < max(live_bytes(graph, given)) else given)
        graph.home_free["best_no_offload_order"] = got
    return list(got)


def searched_order(graph: Graph) -> list[str]:
    """``lowest_peak_order`` improved by the local search of ``planner/order_search.py`` (a peak at most its own).

    Computed once per graph and kept in ``graph.home_free``, as ``lowest_peak_order`` is (seconds on 1,000 ops).
    """
    got = graph.home_free.get("searched_order")
    if got is None:
        got = tuple(lower_peak_order(graph, lowest_peak_order(graph)))
        graph.home_free["searched_order"] = got
    return list(got)
