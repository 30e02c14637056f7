"""ho-plan: an offline planner for where every tensor lives (HBM, a remote pool, host DRAM) and when it moves.

Data flows one way: graph -> planner -> plan -> executor -> timeline -> reports and exports.
The Python API is in ``planner.api``; the CLI (``ho-plan``) is a thin layer over it.
"""

__version__ = "0.1.0"
