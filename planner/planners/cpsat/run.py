"""One cpsat run's state: its limits and clock, progress sink, search log, notes and stats, shared by the
phases of ``solve.py`` and ``lns.py``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from planner import bounds
from planner.bounds import Bound
from planner.executor import simulate
from planner.graph import Graph
from planner.hardware import HBM, Hardware
from planner.offsets_cpsat import offsets_within
from planner.plan import Plan
from planner.timeline import Timeline

# Seconds of deterministic time CP-SAT gets per second of wall-clock limit in deterministic mode (the default).
# Measured on the 2-core development machine, transformer block at 1 GB: one deterministic second took 3.3 to 4.2
# wall seconds idle on 2026-12-01, and 3.2 to 9.7 on 2026-12-02 (the rate differs between models and solves), so
# 0.2 let the wall clock stop both solves of the default 60 s run, which may then not repeat (the notes say so).
# With 0.1 they end on their deterministic budget (16 and 7 s, the same 105.75 ms plan); ``--workers 2`` searches
# for the whole limit instead, not reproducibly.
DET_PER_WALL = 0.1
# In deterministic mode CP-SAT's own wall-clock limit is this many times the nominal wall time of its deterministic
# budget (``Run.params``): far enough that it never shapes the search.
WALL_SAFETY = 10.0
# Share of the limit kept for decoding, checking and writing the plan.
RESERVE = 0.08
# What follows the search (offsets, their check or the caching allocator's run), in executor runs.
FINAL_RUNS = 4.0
# Seconds of one executor run (without the allocator model) per op, before one was measured: 29k ops took 6.6 to
# 8 s on the 2-core development machine with the other core busy.
SIM_S_PER_OP = 2.5e-4
Progress = Callable[[dict], None]
LogSink = Callable[[str], None]  # receives the search log, one line per call
# The note of a plan returned because Ctrl-C stopped the search.
INTERRUPTED_NOTE = "interrupted: best plan found so far"
# The note of a deterministic run whose course the wall clock changed (a phase cut short or skipped on a busy
# machine): two runs may then differ, and tests that compare their bytes look for "may not be reproducible".
CLOCK_NOTE = "the wall clock, not the deterministic budget, cut a phase short: this run may not be reproducible"



@dataclass
class SearchRecord:
    """What one cpsat run did and found, field by field; ``to_dict`` is the plan's ``stats["cpsat"]``, which
    ``planner.quality.solver_outcome`` reads into the typed ``SolverOutcome``. Unset fields are left out."""

    # The starting plan.
    start_planner: str | None = None
    start_makespan_us: float | None = None
    start_candidates: dict[str, float] | None = None  # the fastest valid starting plan's makespan, by planner
    search_start: str | None = None  # the order of greedy's plan the search started from, when not the best start's
    sampled_orders: list[str] | None = None  # the sampled orders kept as starting orders (best first)
    compute_us: float | None = None  # the compute bound: a plan at it is optimal
    # The scaled problem and the hint.
    ops: int | None = None
    gaps: int | None = None
    slots: int | None = None
    tick_ns: int | None = None
    unit_bytes: int | None = None
    horizon_ticks: int | None = None
    hint_feasible: bool | None = None
    incumbent_feasible: bool | None = None  # LNS: the starting assignment, in the scaled model
    # The search.
    model: str | None = None  # whole, lns or none
    status: str | None = None  # CP-SAT's (OPTIMAL, FEASIBLE, ...), LNS for the window search, NOT_RUN
    stop: str | None = None  # why it stopped: a key of planner.quality.STOP_REASONS
    build_s: float | None = None
    variables: int | None = None
    constraints: int | None = None
    solver_wall_s: float | None = None
    deterministic_time: float | None = None
    solutions: int | None = None
    log: str | None = None  # CP-SAT's search log, when asked for and not streamed
    objective_ticks: int | None = None
    objective_us: float | None = None
    model_bound_ticks: int | None = None
    model_bound_us: float | None = None
    optimal: bool | None = None  # CP-SAT proved its model's optimum
    lns: dict | None = None  # the window search's counters (windows, accepted, ...)
    windows_accepted: int | None = None
    # HBM placement of the result.
    offset_height_bytes: int | None = None
    # A slower solution was kept because its static offsets fit, or because it compacts less under the caching
    # allocator.
    slower_solution_placed: bool | None = None
    # Evictions added to the placed plan to spare the caching allocator compactions (planner/defrag.py): the plan
    # is then no solution of the model.
    compaction_evictions: int | None = None
    # CP-SAT's status in the repair solve (the best solution's static offsets did not fit: a solve at a capacity
    # lowered by what they needed beyond its peak), when one ran.
    offsets_repair: str | None = None
    # Stores issued earlier in their links' queues after the search (planner/polish.py).
    stores_earlier: int | None = None
    # The result.
    returned: str | None = None  # cpsat, start or exact
    exact_optimum_us: float | None = None
    runtime_s: float | None = None
    makespan_us: float | None = None
    peak_hbm_bytes: int | None = None
    bound_us: float | None = None
    bound_reason: str | None = None
    gap_vs_bound: float | None = None
    gap_vs_model_bound: float | None = None
    bound_bytes: int | None = None  # the peak objective's bound

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


@dataclass
class Run:
    """What one cpsat run knows: limits, clock, progress sink, notes and stats."""

    graph: Graph
    hw: Hardware
    time_limit: float
    seed: int
    workers: int
    deterministic: bool
    progress: Progress | None
    t0: float = field(default_factory=time.monotonic)
    wall_limit: float | None = None  # seconds for the deadline when less than time_limit is left
    notes: list[str] = field(default_factory=list)
    record: SearchRecord = field(default_factory=SearchRecord)
    det_used: float = 0.0
    # Seconds the starting plans are estimated to take from the graph's size alone (so the same on every run): in
    # deterministic mode the search's deterministic budgets and the optional phases count from what is left of the
    # limit after them, so that the wall clock does not stop the search first (transformer_block at 1 GB with 5 s:
    # the starting plans took 3.3 s of it, and every solve was stopped by the clock).
    start_s: float = 0.0
    sim_s: float = 0.0  # the longest executor run (without the allocator model) so far: estimates the next ones
    point_s: float = 0.0  # the longest point of greedy's sweep timed (``solve._start_sweep``, several workers only)
    log_sink: LogSink | None = None  # receives CP-SAT's search log, line by line
    interrupted: bool = False  # Ctrl-C stopped the search: finish with the best plan so far, search no more
    recompute: bool = True  # recompute gaps in the model, and in the starting plans
    offload: bool = True  # offloading by choice (False: remat only, the Checkmate problem)
    sampled_orders: int | None = None  # how many sampled orders greedy plans first (None: ``solve.sampled_count``)
    _bound: Bound | None = None  # makespan_bound's, once computed
    # Static offsets found within the budget, by the HBM allocations they place (``fitted_offsets``).
    _fitted: dict[tuple, tuple[dict[str, int | list[int]], int]] = field(default_factory=dict)

    @classmethod
    def start(cls, graph: Graph, hw: Hardware, time_limit: float, seed: int = 0, workers: int = 1,
              progress: Progress | None = None) -> Run:
        """A run starting now; one worker makes it deterministic (CP-SAT's deterministic time limit)."""
        return cls(graph, hw, time_limit, int(seed), max(1, int(workers)), int(workers) <= 1, progress)

    def makespan_bound(self) -> Bound:
        """The largest makespan bound that holds for every plan of this run (planner/bounds.py), computed once."""
        if self._bound is None:
            self._bound = bounds.makespan_bound(self.graph, self.hw, recompute=self.recompute)
        return self._bound

    def interrupt(self) -> None:
        """Record that Ctrl-C stopped the search (the caller then returns its best valid plan so far)."""
        if not self.interrupted:
            self.interrupted = True
            self.notes.append(INTERRUPTED_NOTE)
            self.record.stop = "interrupted"
            self.report(phase="interrupted")

    def search_s(self) -> float:
        """Seconds of the limit left for the search after the starting plans, by their estimate (``start_s``)."""
        return max(0.0, self.time_limit - self.start_s)

    def clock_cut(self, note: str | None = None) -> None:
        """Record ``note`` (a phase the time left skipped or stopped); in deterministic mode, add once that this
        run may not be reproducible, since the time left is the wall clock's, which no seed fixes."""
        if note is not None:
            self.notes.append(note)
        if self.deterministic and not any("may not be reproducible" in n for n in self.notes):
            self.notes.append(CLOCK_NOTE)

    def log(self, line: str) -> None:
        """A line of our own in the search log (which solve the next CP-SAT lines belong to)."""
        if self.log_sink is not None:
            self.log_sink(line)

    def timed(self, plan: Plan) -> Timeline:
        """The executor's run of ``plan`` without the allocator model, timed for the estimates."""
        t = time.monotonic()
        tl = simulate(self.graph, self.hw, plan, allocator=False)
        self.sim_s = max(self.sim_s, time.monotonic() - t)
        return tl

    def fitted_offsets(self, tl: Timeline, time_limit_s: float) -> tuple[dict[str, int | list[int]], int]:
        """``offsets_within`` for ``tl``'s HBM allocations at the budget: (offsets, their height). Offsets found to fit
        are kept for the run, so a later placement of the same plan reuses them: the search's success depends on its
        time limit, and the final placement (``place_hbm``) has less time left than the check after the solve
        (``leave_room_for_offsets``). On transformer_block at 1 GB the check found offsets in 0.54 s of its 1 s, the
        placement's 0.5 s search did not, and the plan paid 5 compactions, 3.4 ms, with the caching allocator."""
        key = tuple((r.name, r.kind, r.bytes, r.start_ns, r.end_ns, r.until_end, r.seq)
                    for r in tl.residencies if r.tier == HBM)
        if key in self._fitted:
            return self._fitted[key]
        offs, height = offsets_within(tl.residencies, self.hw.hbm_bytes, time_limit_s=time_limit_s)
        if height <= self.hw.hbm_bytes:
            self._fitted[key] = (offs, height)
        return offs, height

    @property
    def limit_s(self) -> float:
        return self.time_limit if self.wall_limit is None else self.wall_limit

    def estimated_sim_s(self) -> float:
        """Seconds of one executor run without the allocator model: measured, or estimated from the op count."""
        return self.sim_s or len(self.graph.ops) * SIM_S_PER_OP

    def final_reserve(self) -> float:
        """Seconds to keep for what follows the search: static offsets for the best plan and its checks, or the
        caching allocator's run (each about FINAL_RUNS executor runs on large graphs; nothing on small ones)."""
        return FINAL_RUNS * self.sim_s

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    @property
    def deadline(self) -> float:
        return self.t0 + self.limit_s * (1 - RESERVE)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def report(self, **kw) -> None:
        if self.progress is not None:
            kw.setdefault("elapsed_s", round(self.elapsed, 3))
            kw.setdefault("time_limit_s", self.time_limit)
            try:
                self.progress(kw)
            except Exception:  # noqa: BLE001 - a display must never break planning
                pass

    def params(self, wall_s: float, det_s: float | None = None, log: bool = False) -> dict:
        """SatParameters for one solve of at most ``wall_s`` seconds."""
        p = {"random_seed": int(self.seed), "num_workers": int(self.workers), "max_time_in_seconds": wall_s}
        if self.deterministic:
            # One worker that interleaves the portfolio's subsolvers (LNS included) is deterministic and far
            # stronger than plain tree search on these models.
            p["num_workers"] = 1
            p["interleave_search"] = True
            det = det_s if det_s is not None else wall_s * DET_PER_WALL
            p["max_deterministic_time"] = det
            # CP-SAT's own wall-clock limit, set from the limit alone and far above the deterministic one: CP-SAT
            # searches differently when its wall-clock limit is near (the transformer block's model with the same
            # deterministic budget: 3733.3e9 with 2.66 s in 6 runs of 6, 4055.5e9 with 26.6 s), and the time left,
            # which set it before, varies from run to run. The wall-clock limit is held by the worker, which kills
            # the solve at ``wall_s`` (the plan's notes then say the run may not be reproducible).
            p["max_time_in_seconds"] = WALL_SAFETY * det / DET_PER_WALL
        if log:
            # Kept in the stats (``log=True`` from Python); a sink gets it streamed instead (``worker.solve``).
            p["log_search_progress"] = True
            p["log_to_stdout"] = False
            p["log_to_response"] = self.log_sink is None
        return p
