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


class InputErrors(InputError):
    """Several things wrong with one input (a schedule file's tensor table, say), reported together: the CLI prints
    one line per error (``lines()``) and exits 2, so that a user fixes them in one pass.

    Behaves as the first error for code that only knows InputError.
    """

    def __init__(self, errors: list[InputError]) -> None:
        if not errors:
            raise ValueError("InputErrors needs at least one error")
        self.errors = list(errors)
        first = self.errors[0]
        super().__init__(first.source, first.item, first.message)

    def lines(self) -> list[str]:
        return [str(e) for e in self.errors]


class InfeasibleBudget(Exception):
    """The HBM budget is below what any plan can reach; ``reason`` names the bound (planner.bounds.hbm_floor)."""

    def __init__(self, budget: int, minimum: int, reason: str) -> None:
        self.budget = budget
        self.minimum = minimum
        self.reason = reason
        super().__init__(f"HBM budget {budget} B is below {minimum} B, the {reason}; no plan can fit")
