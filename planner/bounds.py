"""Lower bounds that hold for every plan, so every reported gap is against something true."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from planner.cost import op_durations_ns, transfer_duration_ns
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.orders import best_no_offload_order, live_bytes


@dataclass(frozen=True)
class Bound:
    """A lower bound on a metric, with the reason it holds."""

    metric: str
    value: float
    reason: str


def largest_working_set(graph: Graph) -> tuple[int, str]:
    """Return (bytes, op name) of the op whose inputs, outputs, updates and workspace are largest.

    No plan can run with less HBM than this, whatever the order or the offloading. Kept in ``graph.home_free``
    (sizes only, whatever the homes): the floor, the bounds and ``inspect`` all ask, at a third of a second on
    30k-op graphs.
    """
    got = graph.home_free.get("largest_working_set")
    if got is None:
        # ``Graph.working_set`` inline: this runs before every plan, over 1.3M reads on the 38.8k-op graph.
        size = {name: t.bytes for name, t in graph.tensors.items()}.__getitem__
        got = (-1, "")
        for op in graph.ops:
            names = set(op.reads)
            names.update(op.outputs)
            ws = sum(map(size, names)) + op.workspace_bytes
            if ws > got[0]:  # the first op of the largest, as before
                got = (ws, op.name)
        got = graph.home_free["largest_working_set"] = got if graph.ops else (0, "")
    return got


def hbm_bound(graph: Graph) -> Bound:
    b, op = largest_working_set(graph)
    return Bound("peak_hbm_bytes", b, f"largest single-op working set (op {op!r})")


def compute_bound(graph: Graph, hw: Hardware) -> Bound:
    """Makespan >= total compute time: there is one compute stream."""
    return Bound("makespan_ns", sum(op_durations_ns(graph, hw).values()), "total compute time on one stream")


def initial_hbm_bytes(graph: Graph) -> int:
    """Bytes pinned to start on HBM and still needed (used by an op, or outliving the step).

    The executor holds them from time 0, and none can leave at time 0 (a Detach needs a valid remote copy first,
    and a Store takes time), so no plan can run with less HBM than this either. Tensors that start on HBM and
    are never needed can be dropped at once and do not count; tensors whose starting tier the planner chooses
    (home ``auto``) do not count either (they may start remote).
    """
    users = graph.users  # cached per graph: a set of every op's reads costs 0.6 s on the 38.8k-op graph
    return sum(
        t.bytes for name, t in graph.tensors.items()
        if name not in graph.producer and t.home == HBM and (t.persistent or users[name])
    )


def hbm_floor(graph: Graph) -> tuple[int, str]:
    """The larger of the two HBM lower bounds, with the reason: (bytes, reason)."""
    ws, op = largest_working_set(graph)
    init = initial_hbm_bytes(graph)
    if init > ws:
        return init, "bytes pinned to start on HBM and still needed"
    return ws, f"largest single-op working set (op {op!r})"


# --------------------------------------------------------------------------------------------- makespan bounds
# Every makespan bound below holds for every plan on ``hw`` (whatever the order and the offloading), except
# ``order_transfer_bound``, which holds for plans that run the no-offload order and says so in its metric.

# Ops examined by the per-op bound on large graphs (the bound holds for each op; more ops only tighten it).
BOUND_SAMPLE = 2000


def _rates(hw: Hardware) -> tuple[float, float]:
    """Aggregate store (HBM -> remote) and fetch (remote -> HBM) bandwidth, bytes/s, over every channel."""
    store = sum(ln.bandwidth_Bps * ln.channels for ln in hw.links if ln.src == HBM)
    fetch = sum(ln.bandwidth_Bps * ln.channels for ln in hw.links if ln.dst == HBM)
    return store, fetch


def _bitsets(graph: Graph):
    """Ancestor and descendant bitsets of every op (bit i = op index i)."""
    index = graph.op_index
    n = len(graph.ops)
    dag = graph.dag
    anc = [0] * n
    for i, op in enumerate(graph.ops):
        a = 0
        for p in dag.predecessors(op.name):
            j = index[p]
            a |= anc[j] | (1 << j)
        anc[i] = a
    desc = [0] * n
    for i in range(n - 1, -1, -1):
        d = 0
        for s in dag.successors(graph.ops[i].name):
            j = index[s]
            d |= desc[j] | (1 << j)
        desc[i] = d
    nbytes = (n + 7) // 8

    def as_array(x: int):
        return np.unpackbits(np.frombuffer(x.to_bytes(nbytes, "little"), dtype=np.uint8), bitorder="little")[:n]

    return anc, desc, as_array


def makespan_bounds(graph: Graph, hw: Hardware, recompute: bool = True) -> list[Bound]:
    """Makespan lower bounds that hold for every plan on ``hw`` at its HBM budget (``hw.hbm_bytes``), plans with
    recompute steps included (``recompute=False``: for plans without them, which may be larger):

    - total compute time (one compute stream);
    - the first fetch of every tensor pinned to a remote tier and read: the fetch links carry those bytes, and
      the last fetch ends before some op runs. A tensor whose tier the planner chooses may start on HBM, but
      all of them together only within the budget beside the tensors pinned there and still needed (read, or
      outliving the step): the bytes read beyond that room are fetched too (here and in the next bound);
    - per op ``o``, whatever the order: the tensors that must exist while ``o`` runs (made before it by its
      ancestors or present from the start, and still needed: read by ``o`` or a descendant, or outliving the
      step) exceed the budget by some bytes that must be off HBM when ``o`` starts. Those with no valid remote
      copy must have been stored first, over the store links from time 0; the tensors that start remote and are
      read by ``o`` or its ancestors must have been fetched. So ``o`` starts no earlier than the largest of its
      ancestors' compute, the store time and the fetch time, and the step ends no earlier than that plus ``o``'s
      compute and its descendants'. With recomputation, a tensor an op made (a recomputable one) may also be off
      HBM with no Store: dropped, then made again by a re-run after ``o`` ends (it is off HBM while ``o`` starts,
      and the compute stream runs one thing at a time), which adds the re-run to the compute after ``o``. The
      bound takes the cheapest split of the excess between Stores and drops: re-runs in a fractional knapsack
      (each producer's duration covers the bytes of its outputs), which only lowers the true cost.
    """
    durations = op_durations_ns(graph, hw)
    out = [compute_bound(graph, hw)]
    budget = hw.hbm_bytes
    store_rate, fetch_rate = _rates(hw)
    n = len(graph.ops)
    names = list(graph.tensors)
    tidx = {t: k for k, t in enumerate(names)}
    size = np.array([graph.tensors[t].bytes for t in names], dtype=np.float64)
    used = {t for op in graph.ops for t in op.reads}
    # Pinned remote: must be fetched before use. May start remote (pinned remote, or left to the planner): may
    # be off HBM without a Store. Counting the free tensors in the second and not the first only lowers each term.
    remote = np.array([t not in graph.producer and graph.tensors[t].pinned and graph.tensors[t].home != HBM
                       for t in names])
    # Tensors whose tier the planner chooses: all of them may start on HBM only while they fit beside what is
    # pinned there, so the bytes of them an op and its ancestors read beyond that room start remote and are
    # fetched (steady state: every step starts from the same placement, within the budget at time 0).
    free = np.array([t not in graph.producer and not graph.tensors[t].pinned for t in names])
    # Beside what is pinned there and still needed: a tensor pinned to HBM that nothing reads and that does not
    # outlive the step can be dropped at time 0, before anything else is allocated (``initial_hbm_bytes``).
    room = max(0, budget - initial_hbm_bytes(graph))
    may_be_remote = np.array([t not in graph.producer and graph.tensors[t].home != HBM for t in names])
    read = np.array([t in used for t in names])
    fetched_free = max(0.0, float(size[free & read].sum()) - room)
    if fetch_rate > 0 and ((remote & read).any() or fetched_free > 0):
        first = (float(size[remote & read].sum()) + fetched_free) / fetch_rate * 1e9
        shortest = min(durations[u] for t in names if (remote[tidx[t]] or (free[tidx[t]] and fetched_free > 0))
                       and read[tidx[t]] for u in graph.users[t])
        out.append(Bound("makespan_ns", first + shortest,
                         "first fetch of every tensor pinned to a remote tier, and of the bytes of the tensors "
                         "placed by the planner that do not fit on HBM beside those pinned there, then one op"))
    if n == 0:
        return out
    anc, desc, as_array = _bitsets(graph)
    dur = np.array([durations[op.name] for op in graph.ops], dtype=np.float64)
    index = graph.op_index
    producer = np.array([index[graph.producer[t]] if t in graph.producer else -1 for t in names])
    persistent = np.array([graph.tensors[t].persistent for t in names])
    user_t, user_o, upd_t, upd_o = [], [], [], []
    for k, t in enumerate(names):
        for u in graph.users[t]:
            user_t.append(k)
            user_o.append(index[u])
    for op in graph.ops:
        for t in op.updates:
            upd_t.append(tidx[t])
            upd_o.append(index[op.name])
    user_t, user_o = np.array(user_t, dtype=np.int64), np.array(user_o, dtype=np.int64)
    # The producer of each tensor a re-run may make again (-1: none).
    remade_by = np.array([index[graph.producer[t]] if recompute and t in graph.producer
                          and graph.ops[index[graph.producer[t]]].recomputable else -1 for t in names])
    upd_t, upd_o = np.array(upd_t, dtype=np.int64), np.array(upd_o, dtype=np.int64)
    # The loop below costs a few array passes per candidate op over every tensor (2,000 ops x 94k tensors on the
    # 29k-op graph: 5 s). Tensors with the same producer, readers, updaters and flags are alike in every pass, so
    # the passes run over those classes (35k there), each with the bytes of its tensors.
    flags = np.stack([producer, persistent, remote, free, may_be_remote, remade_by]).T
    cls, rep, user_t, user_o, upd_t, upd_o = _tensor_classes(len(names), flags, user_t, user_o, upd_t, upd_o)
    size, producer, persistent, remote, free, may_be_remote, remade_by = (
        np.bincount(cls, weights=size, minlength=len(rep)), producer[rep], persistent[rep], remote[rep], free[rep],
        may_be_remote[rep], remade_by[rep])
    tidx = {t: int(cls[k]) for t, k in tidx.items()}
    names = [names[k] for k in rep]
    cands = range(n)
    if n > BOUND_SAMPLE:
        order = best_no_offload_order(graph)
        live = live_bytes(graph, order)
        top = sorted(range(n), key=lambda k: -live[k])[: BOUND_SAMPLE // 2]
        cands = sorted({index[order[k]] for k in top} | set(range(0, n, max(1, n // (BOUND_SAMPLE // 2)))))
    best, best_op = 0.0, None
    crowded: list[tuple[float, int]] = []  # (excess, op) for the window bound
    # Per examined op, the earliest start every plan allows: after its ancestors' compute and the fetches it and
    # they need (stores may give way to re-runs, so they are left out).
    earliest: dict[int, float] = {}
    for o in cands:
        a = as_array(anc[o]).astype(bool)
        d = as_array(desc[o]).astype(bool)
        d_self = d.copy()
        d_self[o] = True
        exists = (producer < 0) | np.where(producer >= 0, a[np.maximum(producer, 0)] | (producer == o), False)
        later = np.zeros(len(names), dtype=bool)
        if len(user_t):
            later[user_t[d_self[user_o]]] = True
        alive = exists & (persistent | later)
        ws = np.zeros(len(names), dtype=bool)
        op = graph.ops[o]
        for t in set(op.reads) | set(op.outputs):
            ws[tidx[t]] = True
        alive_bytes = float(size[alive].sum()) + op.workspace_bytes
        excess = alive_bytes - budget
        if excess > 0:
            crowded.append((excess, o))
        store_ns = 0.0
        if excess > 0 and store_rate > 0:
            modified = np.zeros(len(names), dtype=bool)
            if len(upd_t):
                modified[upd_t[a[upd_o]]] = True
            # Off HBM for free: tensors that start remote, unmodified before o (never fetched, or dropped). Not
            # ``free`` (the tensors the planner places), which the fetch term below reads.
            off_free = alive & ~ws & may_be_remote & ~modified
            excess_store = max(0.0, excess - float(size[off_free].sum()))
            store_ns = excess_store / store_rate * 1e9
        fetch_ns = 0.0
        if fetch_rate > 0:
            before = a.copy()
            before[o] = True
            need = np.zeros(len(names), dtype=bool)
            if len(user_t):
                need[user_t[before[user_o]]] = True
            fetch_ns = (float(size[need & remote].sum())
                        + max(0.0, float(size[need & free].sum()) - room)) / fetch_rate * 1e9
        anc_ns = float(dur[a].sum())
        start = max(anc_ns, store_ns, fetch_ns)
        earliest[o] = max(anc_ns, fetch_ns)
        redo_ns = 0.0
        if store_ns > max(anc_ns, fetch_ns) and recompute:
            droppable = alive & ~ws & (remade_by >= 0)
            if droppable.any():
                start, redo_ns = _cheapest_split(excess_store, store_rate, max(anc_ns, fetch_ns), remade_by[droppable],
                                                 size[droppable], dur)
        # The re-runs are compute after o: they add to the compute that follows it, not to the fetches back
        # below, which the links run beside them.
        tail_ns = redo_ns + float(dur[o]) + float(dur[d].sum())
        if excess > 0 and fetch_rate > 0 and d.any() and len(user_t):
            # What is off HBM when o starts and read by a descendant comes back after o starts (a fetch in flight
            # holds its HBM already), over the fetch links, before that descendant runs. The tensors o works on
            # are on HBM; the off bytes not read later, and those a re-run may make again, need no fetch.
            read_later = np.zeros(len(names), dtype=bool)
            read_later[user_t[d[user_o]]] = True
            no_fetch = alive & ~ws & ~(read_later & (remade_by < 0))
            back = excess - float(size[no_fetch].sum())
            if back > 0:
                tail_ns = max(tail_ns, back / fetch_rate * 1e9 + float(dur[d].min()))
        value = start + tail_ns
        if value > best:
            best, best_op = value, op.name
    if best_op is not None:
        out.append(Bound("makespan_ns", float(best),
                         f"op {best_op!r}: its ancestors' compute, or the stores and fetches the HBM budget forces "
                         "before it" + (" (or drops, then re-runs after it)" if recompute else "")
                         + ", then its own and its descendants' compute"))
    if n <= WINDOW_MAX_OPS and fetch_rate > 0 and crowded:
        classes = _Classes(size, producer, persistent, remade_by, user_t, user_o, tidx)
        window = window_bound(graph, crowded, classes, anc, desc, as_array, dur, budget, fetch_rate)
        if window is not None:
            out.append(window)
    back = store_back_bound(graph, hw, anc, as_array, dur, earliest)
    if back is not None:
        out.append(back)
    pipe = pipeline_bound(graph, hw)
    if pipe is not None:
        out.append(pipe)
    return out


# The window bound examines the ops whose alive bytes most exceed the budget, a few targets after each, and at
# most this many descendants of each as targets (evenly spaced in the graph's order); graphs above the size cap
# skip it (its per-op passes are those of the per-op bound, on every op examined). The linear program ranks the
# pairs; the integer one runs on the best, single-threaded under a deterministic time limit, so the same
# input gives the same bound (0.5 deterministic seconds: about 1 s of wall time, and within 2% of the proven
# optimum, on NSA-128k at 60%).
WINDOW_MAX_OPS = 5000
WINDOW_OPS = 8
WINDOW_TARGETS = 2
WINDOW_DESCENDANTS = 400
WINDOW_INTEGER = 1
WINDOW_INTEGER_DETERMINISTIC_S = 0.5
WINDOW_INTEGER_MIN_GAIN = 0.002  # of the total compute


@dataclass(frozen=True)
class _Classes:
    """Tensor classes (``_tensor_classes``) as the window bound reads them: bytes, producing op (-1: none),
    outliving the step, the op whose re-run makes them (-1: none), the (class, reading op) pairs, and each tensor
    name's class."""

    size: np.ndarray
    producer: np.ndarray
    persistent: np.ndarray
    remade_by: np.ndarray
    user_t: np.ndarray
    user_o: np.ndarray
    tidx: dict[str, int]


@dataclass(frozen=True)
class _Window:
    """One crowded op and target, as a choice of what runs in the window (``window_bound``): variables
    ``("run", op)``, ``("fetch", class)``, ``("remake", class)``, each 0 or 1; every ``(ways, reader)`` in
    ``needs`` says one of ``ways`` is 1 where ``reader`` is."""

    back_ns: float  # the fetches the target waits for, at the links' rate
    fill_ns: float  # compute below the op and not the target or below it
    run_ns: dict[int, float]  # floater -> its compute
    fetch_ns: dict[int, float]  # class -> its fetch
    remake_ns: dict[int, float]  # class -> its producer's re-run
    needs: list[tuple[list[tuple[str, int]], tuple[str, int]]]


def window_bound(graph: Graph, crowded: list[tuple[float, int]], classes: _Classes, anc, desc, as_array,
                 dur: np.ndarray, budget: int, fetch_rate: float) -> Bound | None:
    """The compute stream's stall while bytes forced off HBM by a crowded op come back, or None.

    At every instant while an op ``o`` runs, HBM holds its working set within the budget, so at least ``excess``
    bytes of the tensors alive then (made before, needed by ``o`` or later, or outliving the step) are off HBM,
    still when ``o`` ends. Take a target ``x`` below ``o``: the off bytes that ``x`` or an op between ``o`` and
    ``x`` reads, and that no re-run may make again, come back over the fetch links after ``o`` ends and before
    ``x`` starts; the plan keeps off the bytes nobody there reads first, so at least ``back`` = ``excess`` less
    those. Meanwhile the compute stream runs the descendants of ``o`` that are not ``x`` or below it, re-runs, and
    *floaters*: ops neither above nor below ``o``, whose compute would otherwise come before ``o`` or after
    ``x``. A floater in that window reads tensors that, made before ``o`` ends, were alive while it ran: each comes
    back too (its bytes add to the fetches), or is made again by a re-run (its compute adds to the stream, and the
    re-run's own inputs follow the same rule). So the makespan is at least the total compute plus the larger of
    the re-runs' compute and (fetches) - (compute of the window's ops), least over the floaters put in the window:
    a linear program (GLOP) relaxes that choice, and CP-SAT's proven bound on the integer one tightens it on the
    best pairs; each is below every real choice, so the bound holds.
    """
    c = classes
    n = len(graph.ops)
    total = float(dur.sum())
    rate = fetch_rate / 1e9  # bytes per ns
    reads: list[list[int]] = [[] for _ in range(n)]
    for t, o in zip(c.user_t.tolist(), c.user_o.tolist()):
        reads[o].append(t)
    remade = c.remade_by >= 0
    found: list[tuple[float, float, str, str, _Window]] = []  # (LP stall, bound so far, op, target, window)
    for excess, o in sorted(crowded, reverse=True)[:WINDOW_OPS]:
        a = as_array(anc[o]).astype(bool)
        d = as_array(desc[o]).astype(bool)
        d_self = d.copy()
        d_self[o] = True
        exists = (c.producer < 0) | np.where(c.producer >= 0, a[np.maximum(c.producer, 0)] | (c.producer == o), False)
        later = np.zeros(len(c.size), dtype=bool)
        later[c.user_t[d_self[c.user_o]]] = True
        alive = exists & (c.persistent | later)
        ws = np.zeros(len(c.size), dtype=bool)
        op = graph.ops[o]
        for t in set(op.reads) | set(op.outputs):
            ws[c.tidx[t]] = True
        off_pool = alive & ~ws
        returning = off_pool & ~remade
        targets = np.nonzero(d)[0]
        if len(targets) > WINDOW_DESCENDANTS:
            targets = targets[:: -(-len(targets) // WINDOW_DESCENDANTS)]
        scored = []
        for x in targets.tolist():
            between = d & as_array(anc[x]).astype(bool)
            between[x] = True
            need = np.zeros(len(c.size), dtype=bool)
            need[c.user_t[between[c.user_o]]] = True
            back = excess - float(c.size[off_pool & ~(need & returning)].sum())
            if back <= 0:
                continue
            below = as_array(desc[x]).astype(bool)
            below[x] = True
            fill = float(dur[d & ~below].sum())
            scored.append((back / rate - fill, x, back, fill))
        floaters = ~a & ~d
        floaters[o] = False
        best = max((f[0] for f in found), default=0.0)
        for stall, x, back, fill in sorted(scored, reverse=True)[:WINDOW_TARGETS]:
            if stall <= best:
                break
            window = _window(reads, floaters, alive, a, c.producer, c.size, remade, dur, rate, back / rate, fill)
            lp = _window_lp(window)
            found.append((lp, lp, op.name, graph.ops[x].name, window))
    found.sort(key=lambda f: -f[0])
    for k, (lp, _, o_name, x_name, window) in enumerate(found[:WINDOW_INTEGER]):
        # The integer optimum lies between the relaxation's and the stall with no floater in the window: not worth
        # a solve where those are close.
        if window.back_ns - window.fill_ns - lp > WINDOW_INTEGER_MIN_GAIN * total:
            found[k] = (lp, max(lp, _window_integer(window)), o_name, x_name, window)
    found = [f for f in found if f[1] > 0]
    if not found:
        return None
    _, stall, o_name, x_name, _ = max(found, key=lambda f: f[1])
    return Bound("makespan_ns", total + stall, f"window after op {o_name!r}: the bytes it leaves off HBM that "
                                               f"{x_name!r} or the ops before it read come back while the compute "
                                               "stream runs out of work")


def _window(reads: list[list[int]], floaters: np.ndarray, alive: np.ndarray, a: np.ndarray, producer: np.ndarray,
            size: np.ndarray, remade: np.ndarray, dur: np.ndarray, rate: float, back_ns: float, fill_ns: float
            ) -> _Window:
    """The choices of one window (``window_bound``): what each floater run in it needs, recursively."""
    run = {f: float(dur[f]) for f in np.nonzero(floaters)[0].tolist()}
    fetch: dict[int, float] = {}
    remake: dict[int, float] = {}
    needs = []
    todo = [(k, ("run", f)) for f in run for k in reads[f] if not alive[k]]
    while todo:
        k, reader = todo.pop()
        p = int(producer[k])
        if p >= 0 and not a[p] and not floaters[p]:
            continue  # made by o or below it: no floater reads it
        fetch[k] = float(size[k] / rate)
        ways = [("fetch", k)]
        if p >= 0 and floaters[p]:
            ways.append(("run", p))  # made in the window by its floater
        if remade[k]:
            if k not in remake:
                remake[k] = float(dur[p])
                todo.extend((u, ("remake", k)) for u in reads[p] if not alive[u])
            ways.append(("remake", k))
        needs.append((ways, reader))
    return _Window(back_ns, fill_ns, run, fetch, remake, needs)


def _window_lp(w: _Window) -> float:
    """The least stall (ns) over fractional choices (GLOP), a little under its optimum for the tolerances."""
    solver = pywraplp.Solver.CreateSolver("GLOP")
    var = {(kind, k): solver.NumVar(0, 1, "") for kind, costs in (("run", w.run_ns), ("fetch", w.fetch_ns),
                                                                  ("remake", w.remake_ns)) for k in costs}
    for ways, reader in w.needs:
        solver.Add(sum(var[v] for v in ways) >= var[reader])
    stall = solver.NumVar(0, solver.infinity(), "")
    solver.Add(stall >= sum(var["remake", k] * ns for k, ns in w.remake_ns.items()))
    solver.Add(stall >= w.back_ns + sum(var["fetch", k] * ns for k, ns in w.fetch_ns.items()) - w.fill_ns
               - sum(var["run", f] * ns for f, ns in w.run_ns.items()))
    solver.Minimize(stall)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return 0.0
    return max(0.0, stall.solution_value() * (1 - 1e-6))


def _window_integer(w: _Window) -> float:
    """CP-SAT's proven lower bound (ns) on the least stall over integral choices, in microseconds rounded the
    safe way (fetches and re-runs down, the window's compute up)."""
    model = cp_model.CpModel()
    var = {(kind, k): model.NewBoolVar("") for kind, costs in (("run", w.run_ns), ("fetch", w.fetch_ns),
                                                               ("remake", w.remake_ns)) for k in costs}
    for ways, reader in w.needs:
        model.Add(sum(var[v] for v in ways) >= var[reader])
    us = 1000.0
    stall = model.NewIntVar(0, int(w.back_ns / us) + 1, "")
    model.Add(stall >= sum(var["remake", k] * int(ns / us) for k, ns in w.remake_ns.items()))
    model.Add(stall >= int(w.back_ns / us) + sum(var["fetch", k] * int(ns / us) for k, ns in w.fetch_ns.items())
              - int(w.fill_ns / us + 1) - sum(var["run", f] * int(ns / us + 1) for f, ns in w.run_ns.items()))
    model.Minimize(stall)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.linearization_level = 2
    solver.parameters.max_deterministic_time = WINDOW_INTEGER_DETERMINISTIC_S
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0.0
    return max(0.0, solver.BestObjectiveBound() * us)


def _tensor_classes(count: int, flags: np.ndarray, user_t: np.ndarray, user_o: np.ndarray, upd_t: np.ndarray,
                    upd_o: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Classes of alike tensors: the same row of ``flags`` and the same ops in (``user_t``, ``user_o``) and in
    (``upd_t``, ``upd_o``) (tensor index, op index pairs). Returns (each tensor's class, one tensor of each class,
    then the two pair lists restated for the classes, one pair per class and op)."""
    users: list[list[int]] = [[] for _ in range(count)]
    for t, o in zip(user_t.tolist(), user_o.tolist()):
        users[t].append(o)
    updaters: list[list[int]] = [[] for _ in range(count)]
    for t, o in zip(upd_t.tolist(), upd_o.tolist()):
        updaters[t].append(o)
    seen: dict[tuple, int] = {}
    cls = np.empty(count, dtype=np.int64)
    rep: list[int] = []
    for k, row in enumerate(flags.tolist()):
        key = (tuple(row), tuple(users[k]), tuple(updaters[k]))
        c = seen.get(key)
        if c is None:
            c = seen[key] = len(rep)
            rep.append(k)
        cls[k] = c
    rep_a = np.array(rep, dtype=np.int64)
    ut = [(c, o) for c, k in enumerate(rep) for o in users[k]]
    pt = [(c, o) for c, k in enumerate(rep) for o in updaters[k]]

    def pairs(xs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        arr = np.array(xs, dtype=np.int64).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    return (cls, rep_a, *pairs(ut), *pairs(pt))


def _cheapest_split(excess: float, store_rate: float, floor_ns: float, producers: np.ndarray, sizes: np.ndarray,
                    dur: np.ndarray) -> tuple[float, float]:
    """(start, re-run ns) minimising ``max(floor, store time of what is not dropped) + re-run time of what is``:
    ``excess`` bytes must be off HBM, each byte either stored (``store_rate`` bytes/s) or dropped and re-made by
    its producer (a re-run of its duration makes all its listed outputs; fractions allowed). The total is convex
    and piecewise linear in the bytes dropped: its minimum is at a breakpoint of the re-run cost or where the
    store time meets the floor."""
    covered: dict[int, float] = {}
    for prod, b in zip(producers.tolist(), sizes.tolist()):
        covered[prod] = covered.get(prod, 0.0) + b
    # Cheapest re-run per byte first.
    items = sorted(((float(dur[k]) / b, b) for k, b in covered.items() if b > 0), key=lambda x: x[0])
    per_ns = 1e9 / store_rate

    def total(drop: float) -> tuple[float, float]:
        redo, left = 0.0, drop
        for cost, b in items:
            take = min(b, left)
            redo += take * cost
            left -= take
            if left <= 0:
                break
        return max(floor_ns, (excess - drop) * per_ns), redo

    top = min(excess, sum(b for _c, b in items))
    points = {0.0, top, min(top, max(0.0, excess - floor_ns / per_ns))}
    acc = 0.0
    for _c, b in items:
        acc += b
        if acc >= top:
            break
        points.add(acc)
    return min((total(x) for x in points), key=lambda sr: sr[0] + sr[1])


def store_back_bound(graph: Graph, hw: Hardware, anc, as_array, dur, earliest: dict[int, float] | None = None
                     ) -> Bound | None:
    """Steady state: a tensor pinned to a remote tier and updated in place is stored back to that tier after its
    last update (planner/placement.py). Its Store is released no earlier than that update's end: after its
    ancestors' compute, or, where ``earliest`` (the per-op bound's) says later, after the fetches it and its
    ancestors need; then its own compute. The Stores to one tier share its store link. The least time to run
    jobs with release times on a machine of that rate (preemption allowed, which only lowers it) is the largest,
    over the release times r, of r plus the work released at or after r. Tensors whose tier the planner chooses
    are left out (they may start on HBM)."""
    last_update: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        for t in op.updates:
            last_update[t] = i
    jobs: dict[str, list[tuple[float, float]]] = {}
    for t, i in last_update.items():
        tensor = graph.tensors[t]
        if t in graph.producer or not tensor.pinned or tensor.home == HBM or not tensor.persistent:
            continue
        link = hw.store_link(tensor.home)
        rate = link.bandwidth_Bps * link.channels
        release = max(float(dur[as_array(anc[i]).astype(bool)].sum()), (earliest or {}).get(i, 0.0)) + float(dur[i])
        jobs.setdefault(tensor.home, []).append((release, tensor.bytes / rate * 1e9))
    best, where = 0.0, None
    for tier, js in jobs.items():
        js.sort()
        tail = 0.0
        for release, work in reversed(js):
            tail += work
            if release + tail > best:
                best, where = release + tail, tier
    if where is None:
        return None
    return Bound("makespan_ns", best, f"tensors pinned to {where} are stored back there after their last update, "
                                      "on its store link, no earlier than that update's ancestors' compute and the "
                                      "fetches it and they need")


def pipeline_bound(graph: Graph, hw: Hardware) -> Bound | None:
    """Tensors pinned to a remote tier and read are fetched before their first use; those updated in place that
    outlive the step are stored back after their last update (planner/placement.py). Group them by tier and by
    last update (each tensor that is only read is a group of its own): a group's update starts once each of its
    tensors has been fetched, and its Stores start after the update ends.

    Take the order in which the groups' fetches complete. When group K's last fetch completes, at F, the tier's
    fetch link has carried a fetch of every tensor of K and of the groups before it; every Store of K and of the
    groups after it is still to come. None starts before F plus the shortest update among them; and the store link
    works from F + (K's update) on at least K's Stores and those of the later groups that cannot be released
    before then (a group J is released at its last fetch's end plus its update, so before F + K's update only if
    its update plus its shortest fetch, on a one-channel link, is shorter than K's update). So the makespan is at
    least the largest, over K, of (fetch work up to K) + e_K + (store work from K on), with e_K the larger of the
    shortest update and K's update less the Stores of the groups that may be released before: the makespan of that
    order in a two-machine flow shop with time lags e_K, whose least over every order Mitten's rule gives (Johnson's
    rule on the parts lengthened by the lag). A link's work is the duration of its transfers over its channels.
    (Optimizer states fetched, updated and stored back over one link pair: the fetch link carries them all, and
    the largest group's Stores still follow its update.)
    """
    durations = op_durations_ns(graph, hw)
    last_update: dict[str, str] = {}
    for op in graph.ops:
        for t in op.updates:
            last_update[t] = op.name
    # (tier) -> group key -> [fetch work, store work, update ns, shortest fetch of a tensor on a one-channel link]
    groups: dict[str, dict[object, list[float]]] = {}
    for name, t in graph.tensors.items():
        if name in graph.producer or not t.pinned or t.home == HBM or not graph.users[name]:
            continue
        fetch, store = hw.fetch_link(t.home), hw.store_link(t.home)
        upd = last_update.get(name)
        key = upd if upd is not None else ("read", name)
        one = transfer_duration_ns(t.bytes, fetch)
        work = groups.setdefault(t.home, {}).setdefault(
            key, [0.0, 0.0, float(durations[upd]) if upd else 0.0, float("inf")])
        work[0] += one / fetch.channels
        # With several channels a fetch may run beside the one that ends at F and end just after it.
        work[3] = min(work[3], one if fetch.channels == 1 else 0.0)
        if upd is not None and t.persistent:
            work[1] += transfer_duration_ns(t.bytes, store) / store.channels
    best, where = 0.0, None
    for tier, by_key in groups.items():
        jobs = list(by_key.values())
        stored = [lag for _a, b, lag, _f in jobs if b > 0]
        if not stored:
            continue
        shortest = min(stored)
        lagged = []
        for a, b, lag, _f in jobs:
            # The Stores that may be released before this group's (never its own: f + lag < lag is false).
            early = sum(b2 for _a2, b2, lag2, f2 in jobs if f2 + lag2 < lag)
            lagged.append((a, b, max(shortest, lag - early) if b > 0 else shortest))
        value = mitten_makespan(lagged)
        if value > best:
            best, where = value, tier
    if where is None:
        return None
    return Bound("makespan_ns", best, f"fetch, update and store-back of the tensors pinned to {where}: its fetch "
                                      "link carries every fetch, and the Stores of the last groups fetched still "
                                      "follow their updates (a two-machine flow shop with time lags, Mitten's rule)")


def mitten_makespan(jobs: list[tuple[float, float, float]]) -> float:
    """The least makespan over every order of two-machine flow-shop jobs ``(first, second, lag)``, each job's second
    part starting at least ``lag`` after its first ends and the machines keeping one order (Mitten's rule: Johnson's
    rule on the parts lengthened by the lag; the jobs whose first part is the shorter first, by it, then the others
    by their second part, longest first)."""
    head = sorted((j for j in jobs if j[0] <= j[1]), key=lambda j: j[0] + j[2])
    tail = sorted((j for j in jobs if j[0] > j[1]), key=lambda j: -(j[1] + j[2]))
    first = second = 0.0
    for a, b, lag in head + tail:
        first += a
        second = max(second, first + lag) + b
    return second


def makespan_bound(graph: Graph, hw: Hardware, recompute: bool = True) -> Bound:
    """The largest of ``makespan_bounds`` (for every plan; ``recompute=False``: for plans without recompute steps)."""
    return max(makespan_bounds(graph, hw, recompute), key=lambda b: b.value)


def order_transfer_bound(graph: Graph, hw: Hardware, order: list[str] | None = None) -> Bound:
    """A makespan bound for plans that run ``order`` (default: the no-offload order), labelled as such.

    At each op of the order, the bytes that started on HBM or were made there and are live beyond the budget
    must have left HBM through a Store before the op starts (tensors that start remote are left out, which only
    lowers the bound). The op then starts no earlier than that store time and the compute before it, and the step
    ends no earlier than that plus the compute from it on.
    """
    order = order or best_no_offload_order(graph)
    durations = op_durations_ns(graph, hw)
    live = live_bytes(graph, order, remote_resident=False)
    store_rate, _ = _rates(hw)
    total = sum(durations[n] for n in order)
    prefix = 0
    best = float(total)
    for k, name in enumerate(order):
        excess = live[k] - hw.hbm_bytes
        store_ns = excess / store_rate * 1e9 if excess > 0 and store_rate > 0 else 0.0
        best = max(best, max(prefix, store_ns) + (total - prefix))
        prefix += durations[name]
    return Bound("makespan_ns (no-offload order)", best,
                 "bytes live beyond the budget under the no-offload order must be stored first (for that order)")


def gap(value: float, bound: float) -> float | None:
    """(value - bound) / bound: how far a result may be from optimal, against a bound that holds."""
    if bound <= 0:
        return None
    return (value - bound) / bound
