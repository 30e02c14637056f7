"""A live display on stderr of a solving planner's progress: phase, incumbent, bound, elapsed time.

Planners never print; they call ``progress(dict)`` (keys: ``phase``, ``elapsed_s``, ``time_limit_s``,
``incumbent_us``, ``bound_us``, ``windows``, ``accepted``). ``live_progress()`` gives the CLI such a callback
that redraws a one-line rich panel while the planner runs, only when stderr is a terminal. ``log_to_stderr`` is
how ``-O log=true`` reaches stderr: cpsat sends each line of CP-SAT's search log as ``{"log": line}``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text

from planner.planners.cpsat.solve import log_target


class _State:
    def __init__(self) -> None:
        self.d: dict = {}
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def update(self, d: dict) -> None:
        with self.lock:
            for k, v in d.items():
                if v is not None:
                    self.d[k] = v

    def render(self) -> Text:
        with self.lock:
            d = dict(self.d)
        elapsed = time.monotonic() - self.t0
        limit = d.get("time_limit_s")
        parts = [f"cpsat {d.get('phase', 'starting')}", f"{elapsed:5.1f} s" + (f" / {limit:g} s" if limit else "")]
        inc, bound = d.get("incumbent_us"), d.get("bound_us")
        if inc is not None:
            parts.append(f"incumbent {inc / 1000:.3f} ms")
        if bound is not None:
            parts.append(f"bound {bound / 1000:.3f} ms")
            if inc:
                parts.append(f"gap {(inc - bound) / bound:.1%}" if bound > 0 else "")
        if "windows" in d:
            parts.append(f"windows {d['windows']} ({d.get('accepted', 0)} accepted)")
        return Text("  ".join(p for p in parts if p), style="cyan")


def log_on_stderr(options: dict) -> bool:
    """Whether planner ``options`` ask for cpsat's search log line by line (``-O log=true``), which the progress
    callback then writes to stderr (``-O log=PATH``: the planner writes the file itself)."""
    if "log" not in options:
        return False

    return log_target(options["log"])[0] == "stream"


def _log_line(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


@contextlib.contextmanager
def live_progress(enabled: bool = True, log: bool = False):
    """Yield a progress callback; draw it on stderr while the block runs (a no-op off a terminal). With ``log``,
    the search-log lines it receives (``{"log": line}``) go to stderr as they come, above the live line; stdout
    is never written (``--json`` stays clean)."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        if not log:
            yield None
            return

        def only_log(d: dict) -> None:
            if "log" in d:
                _log_line(d["log"])

        yield only_log
        return
    state = _State()

    class _Renderable:
        def __rich__(self):
            return state.render()

    with Live(_Renderable(), console=console, refresh_per_second=4, transient=True) as live:
        def update(d: dict) -> None:
            if "log" in d:
                if log:
                    live.console.print(d["log"], markup=False, highlight=False, soft_wrap=True)
                return
            state.update(d)

        yield update
