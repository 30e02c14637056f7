"""The CP-SAT planner: execution order and cache-op placement solved together under HBM capacity and link
bandwidth. ``plan_cpsat`` is the entry point (``solve.py``); the modules are layered:

- ``data.py``: the scaled problem (ticks, memory units, candidate gaps and store slots) and assignments;
- ``hint.py``: a plan timed in ticks and mapped onto the model's variables (the hint), and a checker;
- ``frame.py``: which decisions are free, in what time region (the whole model, or an LNS window);
- ``model.py``: the CP-SAT model of a frame, in layers: ``variables.py`` (the decisions and their hints),
  ``constraints.py`` (one function per constraint family) and ``objective.py``;
- ``decode.py``: an assignment turned into a program the executor reproduces;
- ``worker.py``: solves under a wall-clock limit that holds (a child process killed at its deadline);
- ``lns.py``: the large-neighbourhood search over windows of the schedule, for large graphs;
- ``solve.py``: the entry point and fallbacks; ``run.py``: the run's limits and its typed ``SearchRecord``, which
  becomes ``Plan.stats["cpsat"]`` (read as a ``planner.quality.SolverOutcome``).
"""

from planner.planners.cpsat.solve import plan_cpsat, plan_cpsat_timed

__all__ = ["plan_cpsat", "plan_cpsat_timed"]
