"""Errors that name the file, the item and what is wrong, so the CLI can print one line and exit 2."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: a graph file, a schedule file or a command-line value.

    ``str(error)`` is one line: ``source: item: message``.
    """

    def __init__(self, source: str, item: str, message: str) -> None:
        self.source = source
        self.item = item
        self.message = message
        super().__init__(f"{source}: {item}: {message}")


class InfeasibleBudget(Exception):
    """The HBM budget is below what any plan can reach; ``reason`` names the bound (planner.bounds.hbm_floor)."""

    def __init__(self, budget: int, minimum: int, reason: str) -> None:
        self.budget = budget
        self.minimum = minimum
        self.reason = reason
        super().__init__(f"HBM budget {budget} B is below {minimum} B, the {reason}; no plan can fit")
