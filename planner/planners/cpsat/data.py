"""The problem CP-SAT sees, as plain data: integer ticks, memory units, candidate offload gaps, store slots.

Everything is indexed by integers: ops by their index in ``graph.ops``, tensors by their position in
``graph.tensors``. Times are ticks (``Scale.tick_ns`` nanoseconds each); sizes are units (``Scale.unit_bytes``
bytes each). Durations and sizes are rounded up and the HBM capacity down, so a schedule that fits the scaled
problem fits the real one; the executor checks every plan at full precision anyway.

A tensor's users (the ops that read or update it) are listed in a *reference order* (the hint's compute
order). A *gap* is a place in that list where the tensor may leave HBM: after its first ``n_before`` users and
before the rest. ``n_before == 0`` is a head gap (a tensor that exists before the step: for one that starts on
a remote tier it is the mandatory initial fetch); ``n_before == len(users)`` is an end gap (Store and Detach,
no Prefetch: for tensors that outlive the step, or that no op uses). The partition of the users into those
before and those after a gap is fixed; the compute order is not, and a gap only constrains the order when it
is offloaded. A *store slot* is one version of a tensor (between two in-place writes) that offloaded gaps need
a remote copy of: one Store serves every gap of its version.

Steps repeat (planner/placement.py). A tensor pinned remote and updated in place has a *required* end gap (its
Store puts the latest version back on its tier); one pinned to HBM that outlives the step has a *back* gap
instead of an end gap: off HBM after its last use, fetched back before the step ends. A
*free* tensor (home ``auto``) has an init gap that is a decision: offloaded, the tensor starts on that gap's tier
(its first use needs the Prefetch) and its end gap is offloaded too (stored back when updated, dropped after its
last use: the wrap-around gap); not offloaded, it starts on HBM (Y = 0, no Prefetch) and stays there at the end.
Its version-0 gaps then need a Store only when it starts on HBM and an op updates it
(``store_unless_placed``); one that nothing writes keeps its master copy on its only tier, the fastest
(planner/placement.py), so its gaps never need one.

Recomputation is a third answer for a gap, beside keeping the tensor and offloading it: the pseudo-tier
``RECOMPUTE`` among a gap's tiers drops the tensor after the users before the gap (a Detach, no Store) and re-runs
its producer on the compute stream before the users after it (``Gap.remat``). Its "Prefetch" is that re-run: Y is
its start (where the tensor is allocated again) and ``fetch[RECOMPUTE]`` its duration. Candidates (``_remat``):
mid gaps of a tensor that is the single output of a recomputable op, never updated in place, whose inputs are not
written in place between the op and the gap's first user after it (``Remat.anchor``); the model then requires
each input to be on HBM (kept, or fetched or re-made before) for the whole re-run. An input whose own gap across
the anchor is offloaded or recomputed must then be back before the re-run starts (and stays until its next use):
re-runs chain to any depth, each input made again before the re-run that reads it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from planner.cost import op_durations_ns, transfer_duration_ns
from planner.graph import Graph
from planner.hardware import HBM, Hardware

# A gap's pseudo-tier: dropped with no Store, made again by re-running its producer (see the module doc).
RECOMPUTE = "recompute"


@dataclass(frozen=True)
class Scale:
    """Ticks and memory units. Durations and sizes round up; the capacity rounds down."""

    tick_ns: int
    unit_bytes: int

    def ticks(self, ns: int) -> int:
        return max(1, -(-int(ns) // self.tick_ns))

    def units(self, nbytes: int) -> int:
        return -(-int(nbytes) // self.unit_bytes)

    def ns(self, ticks: int) -> int:
        return int(ticks) * self.tick_ns


def choose_scale(horizon_ns: int, budget_bytes: int, sizes: Sequence[int] = (), target_ticks: int = 4_000_000,
                 target_units: int = 1 << 30) -> Scale:
    """A scale whose horizon is about ``target_ticks`` ticks. The memory unit is the largest common divisor of
    the sizes when that keeps the budget under ``target_units`` units (sizes are then exact), else
    budget / target_units bytes (each size then rounds up by less than a unit)."""
    tick = max(1, math.ceil(horizon_ns / target_ticks))
    g = 0
    for s in sizes:
        g = math.gcd(g, int(s))
    floor = max(1, budget_bytes // target_units)
    unit = g if g >= floor else floor
    return Scale(tick, unit)


@dataclass(frozen=True)
class OpInfo:
    index: int
    name: str
    dur: int  # ticks
    dur_ns: int
    ws: int  # workspace units
    preds: tuple[int, ...]
    succs: tuple[int, ...]
    reads: tuple[int, ...]  # tensor indices
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class TierInfo:
    name: str
    store_link: str
    fetch_link: str
    capacity_bytes: int
    home_bytes: int  # bytes of tensors that start there (they stay there)


@dataclass(frozen=True)
class LinkInfo:
    name: str
    channels: int
    tier: str
    direction: str  # "store" (HBM -> tier) or "fetch" (tier -> HBM)


@dataclass(frozen=True)
class Remat:
    """How a recompute gap's tensor is made again: its producer re-run on the compute stream, before ``anchor``
    (the gap's first user after it, in reference order)."""

    op: int
    dur: int  # ticks
    dur_ns: int
    ws: int  # workspace units
    inputs: tuple[int, ...]  # tensors the re-run reads
    anchor: int
    # Updaters of an input that come after the anchor in reference order: the re-run must precede them (it reads
    # the version the op first read).
    before_updates: tuple[int, ...] = ()


@dataclass
class Gap:
    index: int
    tensor: int
    n_before: int  # users (in reference order) before the gap
    kind: str  # "head", "mid", "end", "back"; a head gap of a tensor that starts remote is "init"
    before: tuple[int, ...]  # ops that must end before the Detach (the maximal users before the gap)
    after: tuple[int, ...]  # ops that must start after the Prefetch ends (the minimal users after it)
    version: int  # in-place writes among the users before the gap
    slot: int | None  # the store slot whose Store the gap needs (None: a valid remote copy exists)
    tiers: tuple[str, ...]
    fetch: dict[str, int] = field(default_factory=dict)  # tier -> prefetch ticks (empty for an end gap)
    fetch_ns: dict[str, int] = field(default_factory=dict)
    placement: bool = False  # the init gap of a free tensor: offloaded = it starts remote
    required: bool = False  # an end gap that must be offloaded (the Store back to a pinned remote home)
    store_unless_placed: bool = False  # needs its slot's Store only when the free tensor starts on HBM
    remat: Remat | None = None  # a recompute candidate: how the tensor is made again (tiers has RECOMPUTE)

    @property
    def has_fetch(self) -> bool:
        return self.kind != "end"

    @property
    def mandatory(self) -> bool:
        return (self.kind == "init" and not self.placement) or self.required


@dataclass
class Slot:
    index: int
    tensor: int
    version: int
    writer: int | None  # op whose end creates the version (None: it exists at time 0)
    gaps: tuple[int, ...]
    tiers: tuple[str, ...]
    store: dict[str, int] = field(default_factory=dict)  # tier -> store ticks
    store_ns: dict[str, int] = field(default_factory=dict)


@dataclass
class TensorInfo:
    index: int
    name: str
    nbytes: int
    units: int
    persistent: bool
    home: str  # tier it starts on ("hbm" for tensors that start on HBM or that an op produces)
    producer: int | None
    users: tuple[int, ...]  # reference order
    updaters: tuple[int, ...]  # reference order
    gaps: tuple[int, ...] = ()  # chain order (by n_before)
    tiers: tuple[str, ...] = ()
    modelled: bool = True  # has an HBM residency in the model
    free: bool = False  # its starting tier is a decision (home auto): see the module doc

    @property
    def starts_remote(self) -> bool:
        return self.producer is None and self.home != HBM

    @property
    def mastered(self) -> bool:
        """Free and never written: its master copy holds room on its (only) tier wherever it starts
        (planner/placement.py)."""
        return self.free and not self.updaters and self.persistent

    @property
    def placement_gap(self) -> int | None:
        """The init gap whose offload decision is the free tensor's starting tier."""
        return self.gaps[0] if self.free and self.gaps else None

    @property
    def until_end(self) -> bool:
        """Held until the end of the step unless an end gap is offloaded."""
        return self.persistent or (self.producer is None and not self.users)


@dataclass
class Problem:
    graph: Graph
    hw: Hardware
    scale: Scale
    budget_bytes: int
    capacity: int  # HBM units available to the model (budget rounded down, minus what never moves)
    fixed_bytes: int  # bytes on HBM for the whole step that the model does not see
    ops: list[OpInfo]
    tensors: list[TensorInfo]
    gaps: list[Gap]
    slots: list[Slot]
    tiers: dict[str, TierInfo]
    links: dict[str, LinkInfo]
    order: list[int]  # reference compute order
    horizon: int  # ticks: an upper bound on the makespan
    anc: list[int] = field(default_factory=list, repr=False)  # ancestor bitsets by op index

    @property
    def pos(self) -> list[int]:
        out = [0] * len(self.ops)
        for p, i in enumerate(self.order):
            out[i] = p
        return out

    def gap_of(self, tensor: int, n_before: int) -> Gap | None:
        for g in self.tensors[tensor].gaps:
            if self.gaps[g].n_before == n_before:
                return self.gaps[g]
        return None


def ancestor_bitsets(graph: Graph) -> list[int]:
    """Bitset of every op's ancestors in the dependency DAG (bit i = op index i)."""
    index = graph.op_index
    anc = [0] * len(graph.ops)
    dag = graph.dag
    for i, op in enumerate(graph.ops):  # graph.ops is topological
        a = 0
        for p in dag.predecessors(op.name):
            j = index[p]
            a |= anc[j] | (1 << j)
        anc[i] = a
    return anc


def usable_tiers(graph: Graph, hw: Hardware) -> tuple[str, ...]:
    """Remote tiers worth offering, fastest first: a tier is dropped when a faster one (in bandwidth, latency
    and channels, both ways) has room for every tensor that could go there."""
    remote = [t for t in hw.remote_tiers]
    if not remote:
        return ()

    remote.sort(key=lambda t: hw.round_trip_key(t.name))
    movable = sum(t.bytes for t in graph.tensors.values()
                  if not (t.name not in graph.producer and t.pinned and t.home != HBM))
    keep = []
    for t in remote:
        dominated = False
        for k in keep:
            ks, kf, ts, tf = hw.store_link(k.name), hw.fetch_link(k.name), hw.store_link(t.name), hw.fetch_link(t.name)
            faster = all(a.bandwidth_Bps >= b.bandwidth_Bps and a.latency_s <= b.latency_s and a.channels >= b.channels
                         for a, b in ((ks, ts), (kf, tf)))
            home = sum(x.bytes for x in graph.tensors.values() if x.name not in graph.producer and x.home == k.name)
            if faster and k.capacity_bytes - home >= movable:
                dominated = True
        if not dominated:
            keep.append(t)
    return tuple(t.name for t in keep)


def build_problem(
    graph: Graph,
    hw: Hardware,
    order: Sequence[str],
    scale: Scale,
    horizon: int,
    must: set[tuple[str, int]] | None = None,
    gap_fraction: float = 0.5,
    min_tensor_fraction: float = 1e-4,
    recompute: bool = False,
    offload: bool = True,
) -> Problem:
    """Return the scaled problem for the compute order ``order`` (the hint's).

    ``must``: (tensor, n_before) gaps to include whatever the filters say (the hint offloads them). A mid or end
    gap is a candidate when the tensor is at least ``min_tensor_fraction`` of the budget and the compute time in
    the gap (in the reference order) is at least ``gap_fraction`` of its Prefetch time (or of its recomputation
    time, for a recompute candidate). ``recompute``: mid gaps may be recompute candidates (module doc).
    ``offload=False``: no gap is offloaded by choice (remat only): only the fetches and Stores a pinned placement
    forces remain, and every tensor whose tier the planner chooses starts on HBM.
    """
    must = must or set()
    budget = hw.hbm_bytes
    index = graph.op_index
    tindex = {name: k for k, name in enumerate(graph.tensors)}
    durations = op_durations_ns(graph, hw)
    dag = graph.dag
    ops: list[OpInfo] = []
    for i, op in enumerate(graph.ops):
        d = durations[op.name]
        ops.append(OpInfo(
            index=i, name=op.name, dur=scale.ticks(d), dur_ns=d, ws=scale.units(op.workspace_bytes),
            preds=tuple(sorted(index[p] for p in dag.predecessors(op.name))),
            succs=tuple(sorted(index[s] for s in dag.successors(op.name))),
            reads=tuple(tindex[t] for t in op.reads), outputs=tuple(tindex[t] for t in op.outputs),
        ))
    ref = [index[name] for name in order]
    pos = [0] * len(ref)
    for p, i in enumerate(ref):
        pos[i] = p
    prefix_ns = [0]
    for i in ref:
        prefix_ns.append(prefix_ns[-1] + ops[i].dur_ns)
    anc = ancestor_bitsets(graph)

    tier_names = usable_tiers(graph, hw)
    tiers: dict[str, TierInfo] = {}
    links: dict[str, LinkInfo] = {}
    for t in hw.remote_tiers:
        s, f = hw.store_link(t.name), hw.fetch_link(t.name)
        home = sum(x.bytes for x in graph.tensors.values() if x.name not in graph.producer and x.home == t.name)
        tiers[t.name] = TierInfo(t.name, s.name, f.name, t.capacity_bytes, home)
        links[s.name] = LinkInfo(s.name, s.channels, t.name, "store")
        links[f.name] = LinkInfo(f.name, f.channels, t.name, "fetch")

    min_bytes = max(1, int(budget * min_tensor_fraction))
    tensors: list[TensorInfo] = []
    gaps: list[Gap] = []
    slots: list[Slot] = []
    fixed_bytes = 0
    for k, (name, t) in enumerate(graph.tensors.items()):
        producer = index[graph.producer[name]] if name in graph.producer else None
        users = tuple(sorted((index[u] for u in graph.users[name]), key=lambda i: pos[i]))
        updaters = tuple(u for u in users if name in graph.ops[u].updates)
        free = producer is None and not t.pinned and bool(users) and bool(tier_names) and offload
        home = HBM if producer is not None or free else t.home
        if producer is None and not t.pinned and not free:
            # Free and never used: nothing to gain on HBM. Free with no remote tier: HBM is the only choice.
            home = tier_names[0] if tier_names and not users else HBM
        ti = TensorInfo(k, name, t.bytes, scale.units(t.bytes), t.persistent, home, producer, users, updaters,
                        free=free)
        tensors.append(ti)
        if ti.starts_remote:
            ti.tiers = (home,)
            if not users:
                ti.modelled = False
                continue
        elif ti.mastered:
            # Nothing writes it: placed on HBM, it keeps its master copy on the fastest tier (planner/placement.py),
            # which every gap of it fetches from, with no Store; placed remote, it starts there.
            ti.tiers = tier_names[:1]
        else:
            ti.tiers = tier_names
        # Unused tensors that start on HBM stay there (the executor never frees them) unless an end gap moves them.
        droppable = producer is None and not users and not t.persistent
        if producer is None and home == HBM and not users and (t.bytes < min_bytes or not ti.tiers):
            ti.modelled = False
            fixed_bytes += t.bytes
            continue
        remat = _remat_of(graph, ti, ops, pos, tindex) if recompute else None
        if not ti.tiers and remat is None:
            continue
        _add_gaps(graph, hw, scale, ti, gaps, slots, ref, pos, prefix_ns, anc, tiers, must, droppable,
                  min_bytes, gap_fraction, remat, offload)

    for name, tier in tiers.items():
        home = sum(t.nbytes for t in tensors
                   if (t.starts_remote and t.home == name) or (t.mastered and t.tiers[0] == name))
        tiers[name] = replace(tier, home_bytes=home)
    capacity = (budget - fixed_bytes) // scale.unit_bytes
    return Problem(graph, hw, scale, budget, capacity, fixed_bytes, ops, tensors, gaps, slots, tiers, links, ref,
                   horizon, anc)


def _remat_of(graph: Graph, ti: TensorInfo, ops: list[OpInfo], pos: list[int], tindex: dict[str, int]):
    """For a tensor whose gaps may be recompute candidates, a function from a gap's first user after it (the
    anchor) to its ``Remat`` (None where that gap cannot be one); None when no gap of the tensor can be."""
    if ti.producer is None or ti.updaters:
        return None
    op = graph.ops[ti.producer]
    # One output: a re-run makes again every output not on HBM, which the model would not count otherwise.
    if not op.recomputable or len(op.outputs) != 1:
        return None
    info = ops[ti.producer]
    p_pos = pos[ti.producer]
    inputs = tuple(dict.fromkeys(tindex[x] for x in op.reads))
    per_input = []
    for x in op.reads:
        writers = [graph.op_index[u] for u in graph.users[x] if x in graph.ops[graph.op_index[u]].updates]
        per_input.append(([pos[w] for w in writers], writers))

    def remat(anchor: int):
        a_pos = pos[anchor]
        after: list[int] = []
        for upd_pos, updaters in per_input:
            # (An input the order frees before the anchor is held to the re-run: the model's F, ``ends``.)
            # Not written between the op's first run and the re-run: the re-run reads what the op read.
            if any(p_pos < q < a_pos for q in upd_pos):
                return None
            after.extend(w for w, q in zip(updaters, upd_pos) if q >= a_pos)
        return Remat(ti.producer, info.dur, info.dur_ns, info.ws, inputs, anchor, tuple(sorted(set(after))))

    return remat


def _add_gaps(graph, hw, scale, ti: TensorInfo, gaps, slots, ref, pos, prefix_ns, anc, tiers, must, droppable,
              min_bytes, gap_fraction, remat=None, offload: bool = True) -> None:
    users = ti.users
    n = len(users)
    persistent_like = ti.persistent or droppable
    # Maximal users of every prefix and minimal users of every suffix (reference order is topological).
    max_before: list[tuple[int, ...]] = [()]
    cur: list[int] = []
    for u in users:
        cur = [w for w in cur if not (anc[u] >> w) & 1] + [u]
        max_before.append(tuple(cur))
    min_after: list[tuple[int, ...]] = [()] * (n + 1)
    cur = []
    for j in range(n - 1, -1, -1):
        u = users[j]
        cur = [w for w in cur if not (anc[w] >> u) & 1] + [u]
        min_after[j] = tuple(cur)
    fast = ti.tiers[0] if ti.tiers else None

    def fetch_ns(tier: str | None) -> int:
        return transfer_duration_ns(ti.nbytes, hw.fetch_link(tier)) if tier is not None else 0

    def store_ns(tier: str) -> int:
        return transfer_duration_ns(ti.nbytes, hw.store_link(tier))

    # Steady state: a tensor pinned remote and updated goes back there; one pinned to HBM stays there.
    restore = ti.starts_remote and ti.persistent and bool(ti.updaters)
    stays = ti.producer is None and not ti.starts_remote and not ti.free and ti.persistent
    chosen: list[tuple[int, str]] = []
    for nb in range(n + 1):
        forced = (ti.name, nb) in must
        if nb == 0 and (ti.starts_remote or ti.free):
            chosen.append((nb, "init"))
            continue
        if nb == n:
            if ti.free or restore:
                chosen.append((nb, "end"))
            elif persistent_like and (forced or ti.nbytes >= min_bytes):
                last = pos[users[-1]] if users else (pos[ti.producer] if ti.producer is not None else -1)
                if forced or last < len(ref) - 1:
                    chosen.append((nb, "back" if stays else "end"))
            continue
        if ti.nbytes < min_bytes and not forced:
            continue
        if nb == 0:
            a = pos[ti.producer] if ti.producer is not None else -1
        else:
            a = pos[users[nb - 1]]
        b = pos[users[nb]]
        if b - a < 2 and not forced:
            continue  # no op in between
        between = prefix_ns[b] - prefix_ns[a + 1]
        kind = "head" if nb == 0 and ti.producer is None else "mid"
        worth = forced or between >= gap_fraction * fetch_ns(fast) if ti.tiers and offload else forced
        # A re-run costs its duration however long the gap: every mid gap with an op in it is a candidate.
        if worth or (kind == "mid" and remat is not None):
            chosen.append((nb, kind))
    if not chosen:
        ti.gaps = ()
        return
    versions_slot: dict[int, int] = {}
    ids = []
    for nb, kind in chosen:
        version = sum(1 for u in users[:nb] if u in ti.updaters)
        rm = remat(users[nb]) if remat is not None and kind == "mid" else None
        # Offloading by choice is off (remat only): only the gaps a pinned placement forces keep their tiers.
        forced_gap = kind == "init" or (kind == "end" and (restore or droppable))
        real = ti.tiers if (offload or forced_gap) else ()
        gap_tiers = real + ((RECOMPUTE,) if rm is not None else ())
        if not gap_tiers:
            continue
        # A free tensor's end gap is offloaded only with its init gap, so its home copy is valid at version 0; one
        # that nothing writes has a valid copy on its tier wherever it starts (its master copy, or its home).
        valid_home = (ti.starts_remote or (ti.free and (kind in ("init", "end") or not ti.updaters))) and version == 0
        needs_store = not valid_home and not (droppable and kind == "end") and kind != "init" and bool(real)
        before = max_before[nb]
        if not before and ti.producer is not None:
            before = (ti.producer,)
        g = Gap(len(gaps), ti.index, nb, kind, before, min_after[nb] if nb < n else (), version, None, gap_tiers,
                placement=ti.free and kind == "init", required=restore and kind == "end",
                store_unless_placed=ti.free and version == 0 and kind == "mid" and bool(ti.updaters), remat=rm)
        if g.has_fetch:
            g.fetch_ns = {r: fetch_ns(r) for r in real}
            g.fetch = {r: scale.ticks(v) for r, v in g.fetch_ns.items()}
            if rm is not None:
                g.fetch_ns[RECOMPUTE] = rm.dur_ns
                g.fetch[RECOMPUTE] = rm.dur
        if needs_store:
            if version not in versions_slot:
                writer = ti.producer if version == 0 else ti.updaters[version - 1]
                s = Slot(len(slots), ti.index, version, writer, (), ti.tiers)
                s.store_ns = {r: store_ns(r) for r in ti.tiers}
                s.store = {r: scale.ticks(v) for r, v in s.store_ns.items()}
                slots.append(s)
                versions_slot[version] = s.index
            g.slot = versions_slot[version]
            slots[g.slot].gaps = slots[g.slot].gaps + (g.index,)
        gaps.append(g)
        ids.append(g.index)
    ti.gaps = tuple(ids)


@dataclass
class Assignment:
    """Values for every decision of the model, in ticks: the currency between hint, model, decode and LNS.

    ``off`` maps each offloaded gap to its tier (init gaps are always offloaded); ``detach``/``prefetch`` are
    every gap's Detach time and Prefetch start (the paper's X and Y; equal when the gap is not offloaded; the
    Prefetch of an offloaded end gap is at the horizon); ``store`` maps each slot with a Store to its tier,
    ``store_start`` every slot's Store start (S); ``freed`` is the end of the last residency of each tensor freed
    after its last use (F).
    """

    start: list[int]
    off: dict[int, str] = field(default_factory=dict)
    detach: dict[int, int] = field(default_factory=dict)
    prefetch: dict[int, int] = field(default_factory=dict)
    store: dict[int, str] = field(default_factory=dict)
    store_start: dict[int, int] = field(default_factory=dict)
    freed: dict[int, int] = field(default_factory=dict)
    makespan: int = 0

    def copy(self) -> Assignment:
        return Assignment(list(self.start), dict(self.off), dict(self.detach), dict(self.prefetch), dict(self.store),
                          dict(self.store_start), dict(self.freed), self.makespan)


def needs_store(p: Problem, a: Assignment, gap) -> bool:
    """Whether offloading ``gap`` needs its slot's Store (a free tensor that starts remote has a valid copy of its
    first version there)."""
    if gap.slot is None or a.off.get(gap.index) == RECOMPUTE:
        return False
    return not (gap.store_unless_placed and p.tensors[gap.tensor].placement_gap in a.off)


def needed_slots(p: Problem, a: Assignment) -> set[int]:
    """The slots whose Store some offloaded gap of ``a`` needs. The model lets a Store be present while its gaps
    are re-run rather than offloaded (it only costs link time there); in a program such a Store could follow the
    Detach and find its tensor gone."""
    return {p.gaps[gi].slot for gi in a.off if needs_store(p, a, p.gaps[gi])}


def op_end(p: Problem, a: Assignment, o: int) -> int:
    return a.start[o] + p.ops[o].dur


def alloc_time(p: Problem, a: Assignment, t: TensorInfo) -> int:
    """When the tensor's first HBM residency starts."""
    if t.producer is not None:
        return a.start[t.producer]
    if t.starts_remote or t.free:
        return a.prefetch[t.gaps[0]]
    return 0


def chain(p: Problem, a: Assignment, t: TensorInfo) -> list[tuple[int, int]]:
    """The tensor's HBM residencies in the model: [alloc, X1), [Y1, X2), ..., [Ym, end)."""
    gaps = [g for g in t.gaps if p.gaps[g].kind != "init"]
    cur = alloc_time(p, a, t)
    out = []
    for g in gaps:
        out.append((cur, a.detach[g]))
        cur = a.prefetch[g]
    end = p.horizon if t.until_end else a.freed[t.index]
    out.append((cur, end))
    return out


def canonical(p: Problem, a: Assignment) -> Assignment:
    """Give every gap and slot its canonical values, in place, and return ``a``: the Detach of an offloaded gap
    as early as its users before and its Store allow; X = Y = the end of the last user before a gap that is not
    offloaded (0 when none); S = the writer's end for a slot with no Store; the horizon as the Y of an offloaded
    end gap."""
    for g in p.gaps:
        if g.kind == "init":
            if g.index not in a.off:
                a.prefetch[g.index] = 0  # a free tensor that starts on HBM: resident from time 0
            continue
        last = max((op_end(p, a, u) for u in g.before), default=0)
        if g.index in a.off:
            if g.kind == "end":
                a.prefetch[g.index] = p.horizon
            if g.slot in a.store and needs_store(p, a, g):
                last = max(last, a.store_start[g.slot] + p.slots[g.slot].store[a.store[g.slot]])
            a.detach[g.index] = last
        else:
            a.detach[g.index] = a.prefetch[g.index] = last
    for s in p.slots:
        if s.index not in a.store:
            a.store_start[s.index] = 0 if s.writer is None else op_end(p, a, s.writer)
    return a
