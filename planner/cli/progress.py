"""A live display on stderr of a solving planner's progress: phase, incumbent, bound, elapsed time.

Planners never print; they call ``progress(dict)`` (keys: ``phase``, ``elapsed_s``, ``time_limit_s``,
``incumbent_us``, ``bound_us``, ``windows``, ``accepted``). ``live_progress()`` gives the CLI such a callback
that redraws a one-line rich panel while the planner runs, only when stderr is a terminal.
"""

from __future__ import annotations

import contextlib
import threading
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text


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


@contextlib.contextmanager
def live_progress(enabled: bool = True):
    """Yield a progress callback; draw it on stderr while the block runs (a no-op off a terminal)."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield None
        return
    state = _State()

    class _Renderable:
        def __rich__(self):
            return state.render()

    with Live(_Renderable(), console=console, refresh_per_second=4, transient=True):
        yield state.update
