"""The ``ho-plan`` command: a thin layer over ``planner.api``.

``main.py`` holds the command group, the options every command shares and the main job (``plan``, ``validate``);
``report.py``, ``generate.py``, ``bench.py`` and ``inspect.py`` register their subcommands on that group when
imported here. ``progress.py`` is the live display of a cpsat run.
"""

from planner.cli import bench, generate, inspect, report  # noqa: F401 - each registers its subcommands on main
from planner.cli.main import main

__all__ = ["main"]
